-- Contract runs: one row per (contract, provider) run with its full report.
-- A provider is eligible for a contract only while its latest run, for the
-- current contract digest and provider-config digest, passed.

CREATE TABLE contract_runs (
    id               TEXT PRIMARY KEY,
    contract         TEXT NOT NULL,
    contract_digest  TEXT NOT NULL,
    provider         TEXT NOT NULL,
    provider_digest  TEXT NOT NULL,
    passed           INTEGER NOT NULL,
    -- "schema on case X: ..." for the first failed check; NULL when passed.
    first_failure    TEXT,
    -- The ContractReport as JSON.
    report           TEXT NOT NULL,
    started_at       INTEGER NOT NULL,
    finished_at      INTEGER NOT NULL,
    actor            TEXT NOT NULL
);

CREATE INDEX contract_runs_latest ON contract_runs (contract, provider, finished_at);
