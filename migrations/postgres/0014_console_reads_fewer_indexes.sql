-- Two b-trees fewer on every job's create and its finish (issue 23, step
-- 6): the console reads its pages off indexes a job writes anyway. On
-- PostgreSQL the finish counts too: it changes `state`, an indexed column,
-- so the updated row gets a new entry in every index of `jobs`.
--
-- A job's row went into seven indexes; three served only the console's job
-- list: `jobs_by_created (created_at, id)` for newest first,
-- `jobs_by_state_created (state, created_at)` for a state's jobs and the
-- overview's counts, and `jobs_by_key (idempotency_key COLLATE "C")` for a
-- key prefix.
--
-- 1. Newest first is now one ordered read per state, merged
--    (`sql/console.rs`, `newest_first`): `jobs_by_state_created` gains `id`,
--    so each state's read is in the list's order, cursor and all. The
--    overview's counts read the same index's `(state, created_at)` prefix.
-- 2. A key prefix is read per owner off the `(owner_id, idempotency_key)`
--    unique index, which every create writes: the owners are found by
--    skipping along that index (`MIN(owner_id) … WHERE owner_id > $1`).
--    The key column becomes `COLLATE "C"`, so that index is in byte order,
--    the order of the prefix's bounds, whatever the database's collation.
--    Equality is unchanged (a deterministic collation's equality is the
--    bytes'), and so is what the unique constraint refuses. Changing only
--    the collation rebuilds the column's indexes, not the table.
DROP INDEX jobs_by_key;
DROP INDEX jobs_by_created;
DROP INDEX jobs_by_state_created;
ALTER TABLE jobs ALTER COLUMN idempotency_key TYPE TEXT COLLATE "C";
CREATE INDEX jobs_by_state_created ON jobs (state, created_at, id);
