-- The two webhook triggers (`webhook_on_job_end`, `webhook_on_attempt_unknown`)
-- exist only while an endpoint does: without one (most installations) they
-- have nothing to write, yet SQLite entered each trigger's program for
-- every ended job and every attempt's change of state, allocating and
-- zeroing the program's frame of registers each time (4.2% of the
-- instructions of a job, `docs/benchmarks.md`).
--
-- The store creates them in the transaction that inserts an endpoint, and
-- drops them in the one that deletes the last (`webhook_triggers_follow_endpoints`
-- in `src/store/sql/webhooks.rs`, their text in `src/store/sql/sqlite.rs`);
-- in this migration's own transaction it creates them again when the file
-- already has an endpoint. A delivery is written in the commit that ends a
-- job, as before.
DROP TRIGGER webhook_on_job_end;
DROP TRIGGER webhook_on_attempt_unknown;
