-- Fences reach no further than the authority of whoever installed them (DESIGN, "Authority
-- boundaries"): a fence applies in its revocation's namespace, or in every namespace when
-- its creator may create revocations cluster-wide. Fences installed before this migration
-- were global and stay so.
ALTER TABLE server_fences ADD COLUMN cluster_wide boolean NOT NULL DEFAULT false;
UPDATE server_fences SET cluster_wide = true;
ALTER TABLE server_fences DROP CONSTRAINT server_fences_pkey;
ALTER TABLE server_fences ADD PRIMARY KEY (server_uid, namespace);
