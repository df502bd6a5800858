-- One index for an owner's and a key's live jobs instead of two (see the
-- SQLite migration of the same number): a key's jobs are all its owner's,
-- so the owner's count reads a prefix of `(owner_id, key_id)` and the key's
-- count `owner_id = $1 AND key_id = $3`. `job_events`' BIGSERIAL needs no
-- change: a sequence is not a row written in the job's commit.

DROP INDEX jobs_active_by_owner;
DROP INDEX jobs_active_by_key;
CREATE INDEX jobs_active ON jobs (owner_id, key_id) WHERE state IN ('pending', 'running');
