-- Jobs, attempts, API keys and the append-only job event log.
-- Timestamps are milliseconds since the Unix epoch, written by the caller.

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    owner_id    TEXT NOT NULL,
    key_hash    TEXT NOT NULL UNIQUE,
    is_admin    INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL
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
    version          INTEGER NOT NULL DEFAULT 0,
    result           TEXT,
    completed_by     TEXT,
    last_error       TEXT,
    attempt_count    INTEGER NOT NULL DEFAULT 0,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL,
    -- Invariant 1: the database, not application code, decides.
    UNIQUE (owner_id, idempotency_key)
);

CREATE TABLE attempts (
    id                   TEXT PRIMARY KEY,
    job_id               TEXT NOT NULL REFERENCES jobs (id),
    seq                  INTEGER NOT NULL,
    provider             TEXT NOT NULL,
    kind                 TEXT NOT NULL CHECK (kind IN ('primary', 'hedge', 'retry')),
    state                TEXT NOT NULL CHECK (state IN
                           ('started', 'succeeded', 'failed', 'unknown', 'discarded', 'cancelled')),
    read_version         INTEGER NOT NULL,
    started_at           INTEGER NOT NULL,
    finished_at          INTEGER,
    error_kind           TEXT,
    error_message        TEXT,
    output               TEXT,
    usage                TEXT,
    provider_request_id  TEXT,
    -- Also the index every guard lookup by job_id uses.
    UNIQUE (job_id, seq)
);

CREATE TABLE job_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id      TEXT NOT NULL,
    attempt_id  TEXT,
    kind        TEXT NOT NULL,
    actor       TEXT NOT NULL,
    detail      TEXT,
    at          INTEGER NOT NULL
);

CREATE INDEX job_events_by_job ON job_events (job_id, id);

CREATE TRIGGER job_events_no_update BEFORE UPDATE ON job_events
BEGIN
    SELECT RAISE(ABORT, 'job_events is append-only');
END;

CREATE TRIGGER job_events_no_delete BEFORE DELETE ON job_events
BEGIN
    SELECT RAISE(ABORT, 'job_events is append-only');
END;
