-- The epoch is no longer rotated at every apiserver start (docs/storage.md, "Epoch"): it is
-- kept while the database is still the one it was minted on, and rotated when the change
-- history may have been reset (a restore). These columns record what the current epoch was
-- minted on; every replica compares them with the live database at start and whenever its
-- change feed reconnects. NULL means unknown (written by an older version, or unreadable):
-- a start then rotates, as before.
ALTER TABLE sync_state
    -- pg_control_system().system_identifier: another cluster (initdb) has another one.
    ADD COLUMN epoch_system_id  text,
    -- The WAL timeline: point-in-time recovery and standby promotion start a new one.
    ADD COLUMN epoch_timeline   integer,
    -- The database's OID: a dump restored into a fresh database has another one.
    ADD COLUMN epoch_database   oid,
    -- sync_state's own OID (tableoid): pg_restore recreates the table, even in place.
    ADD COLUMN epoch_table      oid,
    -- The sequence number at which the epoch was minted.
    ADD COLUMN epoch_seq        bigint  NOT NULL DEFAULT 0 CHECK (epoch_seq >= 0),
    -- Set by an operator after restoring a copy that nothing above can tell apart (a
    -- file-level copy put back while no replica was running): the next replica to see it
    -- rotates the epoch and clears it.
    ADD COLUMN rotate_requested boolean NOT NULL DEFAULT false;
