-- A row trigger is queued for every row its statement writes, and its
-- plpgsql function is called for each when the statement ends, with an
-- SPI statement of its own for each row it writes. A batched statement
-- (`sql/postgres.rs`: the creates, and the wins, of concurrent callers)
-- paid that per row, and paid it even where the function decides at its
-- first IF that it has nothing to do: a job's create called
-- `attempt_hours_count` for its started attempt, and its finish called
-- `webhook_on_attempt_unknown` for its succeeded attempt.
--
-- * A trigger that rarely writes keeps firing per row, with its function's
--   own test as its WHEN: PostgreSQL tests it as the row is written and
--   queues nothing when it is false (as SQLite's triggers have always done).
-- * A trigger that writes for most jobs (an ended attempt's rollup row, an
--   ended job's webhook deliveries) fires once per statement, over the
--   statement's transition tables: one call and one set-based INSERT for a
--   batch of any size. Its test is the row trigger's, per row, and the rows
--   it writes are the ones the row trigger wrote. The rollup rows are
--   summed per key first (ON CONFLICT may update a row once per statement)
--   and upserted in key order, so two statements lock them in one order.
--   A column list (`UPDATE OF state`) cannot go with transition tables, so
--   these fire for every UPDATE of their table, and find nothing to do
--   unless a row's state changed.
--
-- The same rows are written as before; only how often PostgreSQL calls
-- plpgsql changes.

DROP TRIGGER attempt_hours_on_insert ON attempts;
CREATE TRIGGER attempt_hours_on_insert AFTER INSERT ON attempts
FOR EACH ROW
WHEN (NEW.state IN ('succeeded', 'failed', 'discarded', 'cancelled'))
EXECUTE FUNCTION attempt_hours_count();

DROP TRIGGER webhook_on_attempt_unknown ON attempts;
CREATE TRIGGER webhook_on_attempt_unknown AFTER UPDATE OF state ON attempts
FOR EACH ROW
WHEN (NEW.state = 'unknown' AND OLD.state <> 'unknown')
EXECUTE FUNCTION webhook_on_attempt_unknown();

CREATE FUNCTION attempt_hours_count_ended() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO attempt_hours (hour, provider, kind, state, latency_le, shard, attempts, discarded_tokens)
    SELECT hour, provider, kind, state, latency_le, shard, COUNT(*), SUM(tokens)::bigint
    FROM (
        SELECT n.started_at / 3600000 AS hour, n.provider, n.kind, n.state,
            CASE WHEN n.state = 'succeeded' THEN COALESCE(
                (SELECT MIN(le) FROM latency_buckets WHERE le >= n.finished_at - n.started_at), 0)
                ELSE 0 END AS latency_le,
            hashtext(n.id) & 15 AS shard,
            CASE WHEN n.state = 'discarded' THEN usage_tokens(n.usage) ELSE 0 END AS tokens
        FROM ended_new n JOIN ended_old o ON o.id = n.id
        WHERE n.state IN ('succeeded', 'failed', 'discarded', 'cancelled')
          AND o.state NOT IN ('succeeded', 'failed', 'discarded', 'cancelled')
    ) ended
    GROUP BY hour, provider, kind, state, latency_le, shard
    ORDER BY hour, provider, kind, state, latency_le, shard
    ON CONFLICT (hour, provider, kind, state, latency_le, shard) DO UPDATE SET
        attempts = attempt_hours.attempts + excluded.attempts,
        discarded_tokens = attempt_hours.discarded_tokens + excluded.discarded_tokens;
    RETURN NULL;
END;
$$;

DROP TRIGGER attempt_hours_on_end ON attempts;
CREATE TRIGGER attempt_hours_on_end AFTER UPDATE ON attempts
REFERENCING OLD TABLE AS ended_old NEW TABLE AS ended_new
FOR EACH STATEMENT EXECUTE FUNCTION attempt_hours_count_ended();

CREATE FUNCTION webhook_on_jobs_end() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Without an enabled endpoint (most installations) there is nothing to join.
    IF NOT EXISTS (SELECT 1 FROM webhook_endpoints WHERE enabled) THEN
        RETURN NULL;
    END IF;
    INSERT INTO webhook_deliveries (id, endpoint_id, owner_id, event_type, job_id, attempt_id, event_at,
        job_state, job_version, job_route, job_key, job_result, job_completed_by, job_last_error,
        job_attempt_count, job_next_run_at, job_created_at, job_updated_at,
        state, next_attempt_at, created_at)
    SELECT 'msg_' || replace(gen_random_uuid()::text, '-', ''), e.id, n.owner_id, 'job.' || n.state,
        n.id, NULL, n.updated_at, n.state, n.version, n.route, n.idempotency_key,
        n.result, n.completed_by, n.last_error, n.attempt_count, n.next_run_at,
        n.created_at, n.updated_at, 'pending', n.updated_at, n.updated_at
    FROM ended_new n JOIN ended_old o ON o.id = n.id
    JOIN webhook_endpoints e ON e.owner_id = n.owner_id
    WHERE n.state IN ('succeeded', 'failed', 'needs_review', 'cancelled') AND o.state <> n.state
      AND e.enabled AND e.events LIKE '% job.' || n.state || ' %';
    RETURN NULL;
END;
$$;

DROP TRIGGER webhook_on_job_end ON jobs;
CREATE TRIGGER webhook_on_job_end AFTER UPDATE ON jobs
REFERENCING OLD TABLE AS ended_old NEW TABLE AS ended_new
FOR EACH STATEMENT EXECUTE FUNCTION webhook_on_jobs_end();

-- The row triggers' functions this migration no longer calls.
DROP FUNCTION webhook_on_job_end();
