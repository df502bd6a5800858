-- Every finish of an owner's attempt added to the same usage_daily row (the
-- owner's day), and every end of a provider's attempt to the same
-- attempt_hours row (its hour). On PostgreSQL each such upsert holds the
-- row's lock until its transaction commits, so every other finish waited for
-- that commit: finishes ran one commit at a time, whatever the pool's size.
-- Each of those rows is now spread over 16 shards, chosen by the attempt's
-- id (hashtext(id) & 15: 0..15 for negative hashes too). Every reader already
-- sums over the key's other columns, so it sums over shards too.
ALTER TABLE usage_daily ADD COLUMN shard SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE usage_daily DROP CONSTRAINT usage_daily_pkey;
ALTER TABLE usage_daily ADD PRIMARY KEY (owner_id, day, key_id, route, provider, kind, shard);

ALTER TABLE attempt_hours ADD COLUMN shard SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE attempt_hours DROP CONSTRAINT attempt_hours_pkey;
ALTER TABLE attempt_hours ADD PRIMARY KEY (hour, provider, kind, state, latency_le, shard);

CREATE OR REPLACE FUNCTION attempt_hours_count() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.state IN ('succeeded', 'failed', 'discarded', 'cancelled')
       AND (TG_OP = 'INSERT' OR OLD.state NOT IN ('succeeded', 'failed', 'discarded', 'cancelled')) THEN
        INSERT INTO attempt_hours (hour, provider, kind, state, latency_le, shard, attempts, discarded_tokens)
        VALUES (
            NEW.started_at / 3600000, NEW.provider, NEW.kind, NEW.state,
            CASE WHEN NEW.state = 'succeeded' THEN COALESCE(
                (SELECT MIN(le) FROM latency_buckets WHERE le >= NEW.finished_at - NEW.started_at), 0) ELSE 0 END,
            hashtext(NEW.id) & 15,
            1,
            CASE WHEN NEW.state = 'discarded' THEN usage_tokens(NEW.usage) ELSE 0 END
        )
        ON CONFLICT (hour, provider, kind, state, latency_le, shard) DO UPDATE SET
            attempts = attempt_hours.attempts + 1,
            discarded_tokens = attempt_hours.discarded_tokens + excluded.discarded_tokens;
    END IF;
    RETURN NULL;
END;
$$;
