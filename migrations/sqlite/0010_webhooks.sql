-- Signed webhooks (issue 22): an owner's endpoints, one delivery row per
-- event and endpoint (the outbox), and each try of a delivery.
--
-- The outbox rows are written by triggers, in the statement that ends the
-- job (or makes an attempt unknown), whichever code path ends it: the CAS
-- finish, a cancel, an admin resolution, the review queue, a failure, the
-- reconciler. An event is therefore committed exactly when the job's final
-- state is, and a crash can never lose one. The row keeps a snapshot of
-- the job's shown fields at that commit, so the body delivered is the job
-- as it was when the event happened, whatever the job does later.

CREATE TABLE webhook_endpoints (
    id                     TEXT PRIMARY KEY,
    owner_id               TEXT NOT NULL,
    url                    TEXT NOT NULL,
    description            TEXT NOT NULL,
    -- The subscribed event types, each followed by a space, after a space:
    -- ' job.succeeded job.failed ' (matched with LIKE '% type %').
    events                 TEXT NOT NULL,
    -- The signing secret, encrypted (AES-256-GCM; see src/webhooks/secrets.rs).
    secret                 TEXT NOT NULL,
    -- After a rotation, the replaced secret still signs until this time.
    previous_secret        TEXT,
    previous_secret_until  INTEGER,
    enabled                INTEGER NOT NULL,
    disabled_reason        TEXT,
    created_at             INTEGER NOT NULL,
    updated_at             INTEGER NOT NULL
);

CREATE INDEX webhook_endpoints_by_owner ON webhook_endpoints (owner_id);

CREATE TABLE webhook_deliveries (
    -- The `webhook-id` header: the same on every try of this delivery.
    id                 TEXT PRIMARY KEY,
    endpoint_id        TEXT NOT NULL,
    owner_id           TEXT NOT NULL,
    event_type         TEXT NOT NULL,
    job_id             TEXT NOT NULL,
    attempt_id         TEXT,
    event_at           INTEGER NOT NULL,
    -- The job as the event's commit left it (what GET /v1/jobs/{id} shows).
    job_state          TEXT NOT NULL,
    job_version        INTEGER NOT NULL,
    job_route          TEXT NOT NULL,
    job_key            TEXT NOT NULL,
    job_result         TEXT,
    job_completed_by   TEXT,
    job_last_error     TEXT,
    job_attempt_count  INTEGER NOT NULL,
    job_next_run_at    INTEGER,
    job_created_at     INTEGER NOT NULL,
    job_updated_at     INTEGER NOT NULL,
    -- The body bytes of the first try, kept so every retry sends the same.
    body               TEXT,
    state              TEXT NOT NULL CHECK (state IN ('pending', 'delivered', 'failed')),
    tries              INTEGER NOT NULL DEFAULT 0,
    -- `tries` when the current retry budget began (a redelivery resets it).
    budget_start       INTEGER NOT NULL DEFAULT 0,
    next_attempt_at    INTEGER NOT NULL,
    lease_owner        TEXT,
    lease_until        INTEGER,
    last_status        INTEGER,
    last_error         TEXT,
    finished_at        INTEGER,
    created_at         INTEGER NOT NULL
);

CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_deliveries_by_endpoint ON webhook_deliveries (endpoint_id, created_at);
CREATE INDEX webhook_deliveries_by_job ON webhook_deliveries (job_id);
-- The tries in flight per endpoint, counted by every claim (its concurrency).
CREATE INDEX webhook_deliveries_leased ON webhook_deliveries (endpoint_id, lease_until) WHERE state = 'pending';

CREATE TABLE webhook_attempts (
    delivery_id  TEXT NOT NULL,
    n            INTEGER NOT NULL,
    at           INTEGER NOT NULL,
    -- Who sent it (the instance), for the audit of "one try in flight".
    sender       TEXT NOT NULL,
    status       INTEGER,
    latency_ms   INTEGER NOT NULL,
    error        TEXT,
    PRIMARY KEY (delivery_id, n)
);

CREATE TRIGGER webhook_on_job_end AFTER UPDATE OF state ON jobs
WHEN NEW.state IN ('succeeded', 'failed', 'needs_review', 'cancelled') AND OLD.state <> NEW.state
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

CREATE TRIGGER webhook_on_attempt_unknown AFTER UPDATE OF state ON attempts
WHEN NEW.state = 'unknown' AND OLD.state <> 'unknown'
BEGIN
    INSERT INTO webhook_deliveries (id, endpoint_id, owner_id, event_type, job_id, attempt_id, event_at,
        job_state, job_version, job_route, job_key, job_result, job_completed_by, job_last_error,
        job_attempt_count, job_next_run_at, job_created_at, job_updated_at,
        state, next_attempt_at, created_at)
    SELECT 'msg_' || lower(hex(randomblob(16))), e.id, j.owner_id, 'attempt.unknown', j.id, NEW.id,
        COALESCE(NEW.finished_at, NEW.started_at), j.state, j.version, j.route, j.idempotency_key,
        j.result, j.completed_by, j.last_error, j.attempt_count, j.next_run_at, j.created_at,
        j.updated_at, 'pending', COALESCE(NEW.finished_at, NEW.started_at),
        COALESCE(NEW.finished_at, NEW.started_at)
    FROM jobs j JOIN webhook_endpoints e ON e.owner_id = j.owner_id
    WHERE j.id = NEW.job_id AND e.enabled = 1 AND e.events LIKE '% attempt.unknown %';
END;
