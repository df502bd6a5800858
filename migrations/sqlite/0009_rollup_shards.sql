-- The rollups' shard column, as on PostgreSQL (where each owner's day and
-- each provider's hour is spread over 16 rows so that concurrent finishes
-- do not wait for each other's row lock). SQLite's writes are serialised by
-- its write lock anyway, so here every row is shard 0; the column keeps the
-- two schemas, and the upserts' conflict targets, the same.
CREATE TABLE usage_daily_sharded (
    owner_id           TEXT NOT NULL,
    day                INTEGER NOT NULL,
    key_id             TEXT NOT NULL DEFAULT '',
    route              TEXT NOT NULL,
    provider           TEXT NOT NULL,
    kind               TEXT NOT NULL,
    shard              INTEGER NOT NULL DEFAULT 0,
    attempts           INTEGER NOT NULL,
    won                INTEGER NOT NULL,
    prompt_tokens      INTEGER NOT NULL,
    completion_tokens  INTEGER NOT NULL,
    discarded_tokens   INTEGER NOT NULL,
    PRIMARY KEY (owner_id, day, key_id, route, provider, kind, shard)
);
INSERT INTO usage_daily_sharded (owner_id, day, key_id, route, provider, kind, shard, attempts,
    won, prompt_tokens, completion_tokens, discarded_tokens)
SELECT owner_id, day, key_id, route, provider, kind, 0, attempts,
    won, prompt_tokens, completion_tokens, discarded_tokens FROM usage_daily;
DROP TABLE usage_daily;
ALTER TABLE usage_daily_sharded RENAME TO usage_daily;

DROP TRIGGER attempt_hours_on_end;
DROP TRIGGER attempt_hours_on_insert;
CREATE TABLE attempt_hours_sharded (
    hour              INTEGER NOT NULL,  -- started_at / 3600000
    provider          TEXT NOT NULL,
    kind              TEXT NOT NULL,
    state             TEXT NOT NULL,
    latency_le        INTEGER NOT NULL,  -- a latency_buckets.le if succeeded, else 0
    shard             INTEGER NOT NULL DEFAULT 0,
    attempts          INTEGER NOT NULL,
    discarded_tokens  INTEGER NOT NULL,  -- prompt + completion of discarded attempts
    PRIMARY KEY (hour, provider, kind, state, latency_le, shard)
);
INSERT INTO attempt_hours_sharded (hour, provider, kind, state, latency_le, shard, attempts,
    discarded_tokens)
SELECT hour, provider, kind, state, latency_le, 0, attempts, discarded_tokens FROM attempt_hours;
DROP TABLE attempt_hours;
ALTER TABLE attempt_hours_sharded RENAME TO attempt_hours;

CREATE TRIGGER attempt_hours_on_end AFTER UPDATE OF state ON attempts
WHEN NEW.state IN ('succeeded', 'failed', 'discarded', 'cancelled')
 AND OLD.state NOT IN ('succeeded', 'failed', 'discarded', 'cancelled')
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

-- Rows written already ended (imports, the console benchmark's loader).
CREATE TRIGGER attempt_hours_on_insert AFTER INSERT ON attempts
WHEN NEW.state IN ('succeeded', 'failed', 'discarded', 'cancelled')
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
