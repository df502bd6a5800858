-- The ops console lists jobs newest first (keyset paging on created_at, id),
-- filters by state, and charts attempts by their start time.
CREATE INDEX jobs_by_created ON jobs (created_at, id);
CREATE INDEX jobs_by_state_created ON jobs (state, created_at);
CREATE INDEX attempts_by_started ON attempts (started_at);
