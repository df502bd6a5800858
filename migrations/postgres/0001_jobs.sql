-- Jobs, attempts, API keys and the append-only job event log.
-- Timestamps are milliseconds since the Unix epoch, written by the caller.

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    key_hash    TEXT NOT NULL UNIQUE,
    is_admin    BOOLEAN NOT NULL DEFAULT FALSE,
    created_at  BIGINT NOT NULL
);

CREATE TABLE jobs (
    id               TEXT PRIMARY KEY,
    owner_id         TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    fingerprint      TEXT NOT NULL,
    request          TEXT NOT NULL,
    route            TEXT NOT NULL,
    state            TEXT NOT NULL CHECK (state IN
                       ('pending', 'running', 'succeeded', 'failed', 'needs_review', 'cancelled')),
    version          BIGINT NOT NULL DEFAULT 0,
    result           TEXT,
    completed_by     TEXT,
    last_error       TEXT,
    attempt_count    BIGINT NOT NULL DEFAULT 0,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL,
    -- Invariant 1: the database, not application code, decides.
    UNIQUE (owner_id, idempotency_key)
);

CREATE TABLE attempts (
    id                   TEXT PRIMARY KEY,
    job_id               TEXT NOT NULL REFERENCES jobs (id),
    seq                  BIGINT NOT NULL,
    provider             TEXT NOT NULL,
    kind                 TEXT NOT NULL CHECK (kind IN ('primary', 'hedge', 'retry')),
    state                TEXT NOT NULL CHECK (state IN
                           ('started', 'succeeded', 'failed', 'unknown', 'discarded', 'cancelled')),
    read_version         BIGINT NOT NULL,
    started_at           BIGINT NOT NULL,
    finished_at          BIGINT,
    error_kind           TEXT,
    error_message        TEXT,
    output               TEXT,
    usage                TEXT,
    provider_request_id  TEXT,
    -- Also the index every guard lookup by job_id uses.
    UNIQUE (job_id, seq)
);

CREATE TABLE job_events (
    id          BIGSERIAL PRIMARY KEY,
    job_id      TEXT NOT NULL,
    attempt_id  TEXT,
    kind        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    detail      TEXT,
    at          BIGINT NOT NULL
);

CREATE INDEX job_events_by_job ON job_events (job_id, id);

CREATE FUNCTION job_events_append_only() RETURNS trigger AS $$
BEGIN
    RAISE EXCEPTION 'job_events is append-only';
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER job_events_no_change BEFORE UPDATE OR DELETE ON job_events
FOR EACH ROW EXECUTE FUNCTION job_events_append_only();
