-- SQLite tests `x IN (a, b, c)` with a list of more than two constants by
-- building a temporary b-tree of the list, each time the test runs: for a
-- CHECK constraint, on every insert of the row and every update of its
-- column; for a trigger's WHEN, on every firing. A job's create built four
-- (the CHECKs of `jobs.state`, `attempts.kind` and `attempts.state`, the
-- WHEN of `attempt_hours_on_insert`) and its finish five (the two state
-- CHECKs, the WHEN of `webhook_on_job_end` and the two lists of
-- `attempt_hours_on_end`'s), about 2 µs each. Written with lists of at
-- most two, SQLite compares instead. Nothing else changes: the same rows
-- pass and fail.

-- The CHECKs. Changing a constraint into an equivalent one changes nothing
-- on disk, so the table's text is edited in place, as SQLite's documentation
-- of ALTER TABLE describes for such changes; the DDL below changes the
-- schema version, and every connection reads the schema again.
PRAGMA writable_schema = ON;
UPDATE sqlite_schema
SET sql = replace(sql,
    '(''pending'', ''running'', ''succeeded'', ''failed'', ''needs_review'', ''cancelled'')',
    '(''pending'', ''running'') OR state IN (''succeeded'', ''failed'') OR state IN (''needs_review'', ''cancelled'')')
WHERE type = 'table' AND name = 'jobs';
UPDATE sqlite_schema
SET sql = replace(replace(sql,
    '(''started'', ''succeeded'', ''failed'', ''unknown'', ''discarded'', ''cancelled'')',
    '(''started'', ''succeeded'') OR state IN (''failed'', ''unknown'') OR state IN (''discarded'', ''cancelled'')'),
    '(''primary'', ''hedge'', ''retry'')',
    '(''primary'', ''hedge'') OR kind = ''retry''')
WHERE type = 'table' AND name = 'attempts';
UPDATE sqlite_schema
SET sql = replace(sql,
    '(''pending'', ''delivered'', ''failed'')',
    '(''pending'', ''delivered'') OR state = ''failed''')
WHERE type = 'table' AND name = 'webhook_deliveries';
PRAGMA writable_schema = OFF;

-- The triggers: an attempt's state is one of six and a job's one of six
-- (the CHECKs above), so "one of the four final states" is "not one of the
-- two live ones".
DROP TRIGGER attempt_hours_on_end;
CREATE TRIGGER attempt_hours_on_end AFTER UPDATE OF state ON attempts
WHEN NEW.state NOT IN ('started', 'unknown') AND OLD.state IN ('started', 'unknown')
BEGIN
    INSERT INTO attempt_hours (hour, provider, kind, state, latency_le, shard, attempts, discarded_tokens)
    VALUES (
        NEW.started_at / 3600000, NEW.provider, NEW.kind, NEW.state,
        CASE WHEN NEW.state = 'succeeded' THEN COALESCE(
            (SELECT MIN(le) FROM latency_buckets WHERE le >= NEW.finished_at - NEW.started_at), 0) ELSE 0 END,
        0,
        1,
        CASE WHEN NEW.state = 'discarded' AND json_valid(NEW.usage) THEN
            COALESCE(json_extract(NEW.usage, '$.prompt_tokens'), 0)
            + COALESCE(json_extract(NEW.usage, '$.completion_tokens'), 0) ELSE 0 END
    )
    ON CONFLICT (hour, provider, kind, state, latency_le, shard) DO UPDATE SET
        attempts = attempts + 1,
        discarded_tokens = discarded_tokens + excluded.discarded_tokens;
END;

DROP TRIGGER attempt_hours_on_insert;
CREATE TRIGGER attempt_hours_on_insert AFTER INSERT ON attempts
WHEN NEW.state NOT IN ('started', 'unknown')
BEGIN
    INSERT INTO attempt_hours (hour, provider, kind, state, latency_le, shard, attempts, discarded_tokens)
    VALUES (
        NEW.started_at / 3600000, NEW.provider, NEW.kind, NEW.state,
        CASE WHEN NEW.state = 'succeeded' THEN COALESCE(
            (SELECT MIN(le) FROM latency_buckets WHERE le >= NEW.finished_at - NEW.started_at), 0) ELSE 0 END,
        0,
        1,
        CASE WHEN NEW.state = 'discarded' AND json_valid(NEW.usage) THEN
            COALESCE(json_extract(NEW.usage, '$.prompt_tokens'), 0)
            + COALESCE(json_extract(NEW.usage, '$.completion_tokens'), 0) ELSE 0 END
    )
    ON CONFLICT (hour, provider, kind, state, latency_le, shard) DO UPDATE SET
        attempts = attempts + 1,
        discarded_tokens = discarded_tokens + excluded.discarded_tokens;
END;

DROP TRIGGER webhook_on_job_end;
CREATE TRIGGER webhook_on_job_end AFTER UPDATE OF state ON jobs
WHEN NEW.state NOT IN ('pending', 'running') AND OLD.state <> NEW.state
BEGIN
    INSERT INTO webhook_deliveries (id, endpoint_id, owner_id, event_type, job_id, attempt_id, event_at,
        job_state, job_version, job_route, job_key, job_result, job_completed_by, job_last_error,
        job_attempt_count, job_next_run_at, job_created_at, job_updated_at,
        state, next_attempt_at, created_at)
    SELECT 'msg_' || lower(hex(randomblob(16))), e.id, NEW.owner_id, 'job.' || NEW.state, NEW.id, NULL,
        NEW.updated_at, NEW.state, NEW.version, NEW.route, NEW.idempotency_key, NEW.result,
        NEW.completed_by, NEW.last_error, NEW.attempt_count, NEW.next_run_at, NEW.created_at,
        NEW.updated_at, 'pending', NEW.updated_at, NEW.updated_at
    FROM webhook_endpoints e
    WHERE e.owner_id = NEW.owner_id AND e.enabled = 1 AND e.events LIKE '% job.' || NEW.state || ' %';
END;
