-- Tenants: key lifecycle, limits changed at run time, usage for budgets.

ALTER TABLE api_keys ADD COLUMN prefix TEXT NOT NULL DEFAULT '';
ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;
ALTER TABLE api_keys ADD COLUMN revoked_at INTEGER;
ALTER TABLE api_keys ADD COLUMN last_used_at INTEGER;
-- The key a rotation made to replace this one.
ALTER TABLE api_keys ADD COLUMN replaced_by TEXT;

CREATE INDEX api_keys_by_owner ON api_keys (owner_id, created_at);

-- One row, bumped in the same commit as every change that running servers
-- cache (a key revoked, rotated or expired early; an owner's limits): they
-- poll it and drop their caches when it moves.
CREATE TABLE tenant_changes (
    id       INTEGER PRIMARY KEY CHECK (id = 1),
    version  INTEGER NOT NULL
);
INSERT INTO tenant_changes (id, version) VALUES (1, 0);

-- Limits an admin set at run time, over the config file's; JSON of the fields set.
CREATE TABLE owner_limits (
    owner_id    TEXT PRIMARY KEY,
    limits      TEXT NOT NULL,
    changed_by  TEXT NOT NULL,
    reason      TEXT NOT NULL,
    changed_at  INTEGER NOT NULL
);

-- Who changed a key or a limit, and why.
CREATE TABLE tenant_audit (
    id       INTEGER PRIMARY KEY AUTOINCREMENT,
    subject  TEXT NOT NULL,
    action   TEXT NOT NULL,
    actor    TEXT NOT NULL,
    detail   TEXT,
    at       INTEGER NOT NULL
);

-- Servers alive on this database (heartbeat): a rate limit is split among them.
CREATE TABLE instances (
    id       TEXT PRIMARY KEY,
    seen_at  INTEGER NOT NULL
);

-- Tokens by owner, UTC day, route, provider and attempt kind, written in the
-- commit that records an attempt's usage: the budget and /v1/usage read it.
CREATE TABLE usage_daily (
    owner_id           TEXT NOT NULL,
    day                INTEGER NOT NULL,
    route              TEXT NOT NULL,
    provider           TEXT NOT NULL,
    kind               TEXT NOT NULL,
    attempts           INTEGER NOT NULL,
    won                INTEGER NOT NULL,
    prompt_tokens      INTEGER NOT NULL,
    completion_tokens  INTEGER NOT NULL,
    discarded_tokens   INTEGER NOT NULL,
    PRIMARY KEY (owner_id, day, route, provider, kind)
);

-- The concurrent-jobs limit counts an owner's live jobs.
CREATE INDEX jobs_active_by_owner ON jobs (owner_id) WHERE state IN ('pending', 'running');
