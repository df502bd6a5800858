-- Fewer pages written per commit on a job's path (issue 23, step 6).
--
-- A job's create and its winning finish each wrote 17 and 13 pages to the
-- WAL when run alone (read off the WAL's frames: one page of each table and
-- index the commit changes). Two of them are not needed:
--
-- 1. `job_events` was `AUTOINCREMENT`: every event insert also updated
--    `sqlite_sequence`, a page of its own in every commit. The log is
--    append-only (its triggers refuse UPDATE and DELETE), so the largest id
--    is never deleted and a plain `INTEGER PRIMARY KEY` hands out the same
--    increasing ids. The table is rebuilt with its rows, index and triggers.
-- 2. `jobs_active_by_owner (owner_id)` and `jobs_active_by_key (key_id)`,
--    both partial on the live states, become one `jobs_active (owner_id,
--    key_id)`: a key's jobs are all its owner's, so the owner's count reads
--    a prefix and the key's count `owner_id = ? AND key_id = ?`.

ALTER TABLE job_events RENAME TO job_events_before_0012;

CREATE TABLE job_events (
    id          INTEGER PRIMARY KEY,
    job_id      TEXT NOT NULL,
    attempt_id  TEXT,
    kind        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    detail      TEXT,
    at          INTEGER NOT NULL
);

INSERT INTO job_events (id, job_id, attempt_id, kind, actor, detail, at)
SELECT id, job_id, attempt_id, kind, actor, detail, at FROM job_events_before_0012;

-- Drops its index and its two triggers with it (DROP TABLE fires no trigger).
DROP TABLE job_events_before_0012;

CREATE INDEX job_events_by_job ON job_events (job_id, id);

CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events
BEGIN
    SELECT RAISE(ABORT, 'job_events is append-only');
END;

CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events
BEGIN
    SELECT RAISE(ABORT, 'job_events is append-only');
END;

DROP INDEX jobs_active_by_owner;
DROP INDEX jobs_active_by_key;
CREATE INDEX jobs_active ON jobs (owner_id, key_id) WHERE state IN ('pending', 'running');
