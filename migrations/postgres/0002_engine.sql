-- What the engine needs: when a job wants a driver, who holds it (a lease),
-- where its retry budget starts, and the ops-controlled provider switches.

-- NULL: nothing to do (finished, in review, or blocked on an unknown attempt).
ALTER TABLE jobs ADD COLUMN next_run_at BIGINT;
ALTER TABLE jobs ADD COLUMN lease_owner TEXT;
ALTER TABLE jobs ADD COLUMN lease_until BIGINT;
-- attempt_count when the current retry budget began (an admin retry resets it).
ALTER TABLE jobs ADD COLUMN budget_start BIGINT NOT NULL DEFAULT 0;

CREATE INDEX jobs_runnable ON jobs (next_run_at) WHERE next_run_at IS NOT NULL;
CREATE INDEX jobs_review ON jobs (updated_at) WHERE state = 'needs_review';
CREATE INDEX attempts_unknown ON attempts (started_at) WHERE state = 'unknown';

-- A provider's enabled switch, shared by every instance on this database.
CREATE TABLE provider_states (
    name        TEXT PRIMARY KEY,
    enabled     BOOLEAN NOT NULL,
    changed_by  TEXT NOT NULL,
    reason      TEXT NOT NULL,
    changed_at  BIGINT NOT NULL
);

CREATE TABLE provider_audit (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT NOT NULL,
    enabled     BOOLEAN NOT NULL,
    actor       TEXT NOT NULL,
    reason      TEXT NOT NULL,
    at          BIGINT NOT NULL
);
