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
ALTER TABLE usage_daily ADD COLUMN key_id TEXT NOT NULL DEFAULT '';
ALTER TABLE usage_daily DROP CONSTRAINT usage_daily_pkey;
ALTER TABLE usage_daily ADD PRIMARY KEY (owner_id, day, key_id, route, provider, kind);
