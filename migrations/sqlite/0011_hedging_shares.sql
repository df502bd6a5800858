-- Hedging that tunes itself (docs/hedging.md): every instance writes its own
-- learned latency estimates and its hedge window, per route, every few
-- seconds, and reads the others'. One row per (instance, route); rows of
-- instances long gone are deleted by the writers.
CREATE TABLE hedging_shares (
    instance    TEXT NOT NULL,
    route       TEXT NOT NULL,
    written_at  BIGINT NOT NULL,
    -- JSON: the estimates' snapshots and the window's slots.
    body        TEXT NOT NULL,
    PRIMARY KEY (instance, route)
);
