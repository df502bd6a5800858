-- Limits per key, in addition to the owner's (both must pass).

-- JSON of the limit fields set for the key; NULL: none of its own.
ALTER TABLE api_keys ADD COLUMN limits TEXT;
-- The key a chain of rotations began with (NULL: this key itself). Limits,
-- live jobs and tokens are a key family's, so rotating a secret neither
-- drops its limits nor resets what it used.
ALTER TABLE api_keys ADD COLUMN family_id TEXT;

-- The key (family) that created the job; NULL for jobs made without a key.
ALTER TABLE jobs ADD COLUMN key_id TEXT;
-- The per-key concurrent-jobs limit counts a key's live jobs.
CREATE INDEX jobs_active_by_key ON jobs (key_id) WHERE state IN ('pending', 'running');

-- usage_daily by key too ('' for jobs without one): the per-key budget
-- reads its day in one primary-key range. Same write per attempt as before.
CREATE TABLE usage_daily_by_key (
    owner_id           TEXT NOT NULL,
    day                INTEGER NOT NULL,
    key_id             TEXT NOT NULL DEFAULT '',
    route              TEXT NOT NULL,
    provider           TEXT NOT NULL,
    kind               TEXT NOT NULL,
    attempts           INTEGER NOT NULL,
    won                INTEGER NOT NULL,
    prompt_tokens      INTEGER NOT NULL,
    completion_tokens  INTEGER NOT NULL,
    discarded_tokens   INTEGER NOT NULL,
    PRIMARY KEY (owner_id, day, key_id, route, provider, kind)
);
INSERT INTO usage_daily_by_key (owner_id, day, key_id, route, provider, kind, attempts, won,
    prompt_tokens, completion_tokens, discarded_tokens)
SELECT owner_id, day, '', route, provider, kind, attempts, won,
    prompt_tokens, completion_tokens, discarded_tokens FROM usage_daily;
DROP TABLE usage_daily;
ALTER TABLE usage_daily_by_key RENAME TO usage_daily;
