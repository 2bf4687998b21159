-- MCP Access storage (DESIGN §3).
--
-- Every mutation locks the single sync_state row FOR UPDATE, allocates consecutive change
-- sequence numbers, writes objects and change_log rows, and holds the lock until commit. So
-- commit order is sequence order and the change log has no gaps.

CREATE TABLE sync_state (
    id    smallint PRIMARY KEY CHECK (id = 1),
    -- Rotated at every apiserver start; encoded into every resourceVersion.
    epoch integer  NOT NULL CHECK (epoch > 0 AND epoch < 1048576),
    -- The last allocated (and, once the holder commits, committed) sequence number.
    seq   bigint   NOT NULL CHECK (seq >= 0)
);
INSERT INTO sync_state (id, epoch, seq) VALUES (1, 1, 0);

-- Current state of every object, all kinds in one table. `body` never carries
-- metadata.resourceVersion: it is rendered from `seq` and the current epoch.
CREATE TABLE objects (
    resource  text   NOT NULL,
    namespace text   NOT NULL, -- '' for cluster-scoped kinds
    name      text   NOT NULL,
    uid       uuid   NOT NULL,
    seq       bigint NOT NULL,
    body      jsonb  NOT NULL,
    PRIMARY KEY (resource, namespace, name)
);
CREATE INDEX objects_sessions_by_server_uid ON objects ((body #>> '{spec,server,uid}'))
    WHERE resource = 'accesssessions';
CREATE INDEX objects_sessions_by_agent_uid ON objects ((body #>> '{spec,agent,uid}'))
    WHERE resource = 'accesssessions';

-- One row per change. `object` is the state after the change (for DELETED, the last state);
-- `before` is the state before it, with `prev_seq` its resourceVersion, so a list at an older
-- resourceVersion can be answered while the entry is retained.
CREATE TABLE change_log (
    seq       bigint PRIMARY KEY,
    resource  text   NOT NULL,
    namespace text   NOT NULL,
    name      text   NOT NULL,
    event     text   NOT NULL CHECK (event IN ('ADDED', 'MODIFIED', 'DELETED')),
    object    jsonb  NOT NULL,
    before    jsonb,
    prev_seq  bigint
);
CREATE INDEX change_log_by_key ON change_log (resource, namespace, name, seq);

-- Names once used are never reused within their namespace. Outlives the change log.
CREATE TABLE name_reservations (
    resource   text        NOT NULL,
    namespace  text        NOT NULL,
    name       text        NOT NULL,
    uid        uuid        NOT NULL,
    deleted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource, namespace, name)
);

-- Retired MCPServer generations: no session may be issued or restored for them.
CREATE TABLE server_fences (
    server_uid      text        PRIMARY KEY,
    server_name     text        NOT NULL,
    namespace       text        NOT NULL,
    revocation_name text,
    fenced_at       timestamptz NOT NULL DEFAULT now()
);
