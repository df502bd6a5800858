-- Why the provider stopped (`length`, `tool_calls`, `stop_sequence:SEQ`, …),
-- written by the winning finish (`attempt_won!` in src/store/sql/mod.rs), so
-- an answer read back (a replay, a stream replayed, `GET /v1/jobs/{id}`,
-- the Responses door's retrieve) tells a truncated answer as truncated.
-- NULL for every other attempt, and for winners recorded before: those are
-- told as before (`tool_calls` when the answer calls tools, else `stop`).
ALTER TABLE attempts ADD COLUMN finish_reason TEXT;
