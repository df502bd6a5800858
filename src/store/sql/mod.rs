//! The SQL of every [`Store`](super::Store) query, one file per resource,
//! compiled once per dialect: [`sqlite`] and [`postgres`] each name their
//! connection type (`Conn`) and define the dialect's fragments as macros,
//! then declare the same resource files (`jobs.rs`, `attempts.rs`,
//! `events.rs`, `keys.rs`, `switches.rs`, `contract_runs.rs`,
//! `console.rs`, `hedging.rs`, `webhooks.rs`) with `#[path]`, written out
//! in each, so rustfmt reaches them. Those two files are the only place the
//! dialects differ; see the table in the [store's docs](super).
//!
//! A backend calls `ops::NAME(connection, arguments…)`, where `ops` is its
//! dialect's module here: every query is re-exported from it under its
//! name (the name of the store trait method that calls it).

pub(crate) mod db;

/// The usage of one attempt added to its owner's day (`keys.rs`
/// `add_usage`, and inside a finish in `attempts.rs`): the insert's head
/// (columns, then the `SELECT` of the owner's row from the attempt and its
/// job, whose `WHERE` the caller writes), as a literal for `concat!`.
/// Arguments: `$2` day, `$3` won (0/1), `$4` prompt, `$5` completion and
/// `$6` discarded tokens. The row's shard is the dialect's `rollup_shard!`
/// of the attempt's id (migration 0009).
macro_rules! usage_insert {
    () => {
        concat!(
            "INSERT INTO usage_daily (owner_id, day, key_id, route, provider, kind, shard, \
             attempts, won, prompt_tokens, completion_tokens, discarded_tokens) \
             SELECT j.owner_id, $2, COALESCE(j.key_id, ''), j.route, a.provider, a.kind, ",
            rollup_shard!("a.id"),
            ", 1, $3, $4, $5, $6 FROM attempts a JOIN jobs j ON j.id = a.job_id "
        )
    };
}

/// …and its tail: an existing day's row adds this attempt to its counts.
macro_rules! usage_on_conflict {
    () => {
        " ON CONFLICT (owner_id, day, key_id, route, provider, kind, shard) DO UPDATE SET \
         attempts = usage_daily.attempts + 1, won = usage_daily.won + excluded.won, \
         prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens, \
         completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens, \
         discarded_tokens = usage_daily.discarded_tokens + excluded.discarded_tokens"
    };
}

/// The job's insert unless its (owner, key) exists, as a literal for
/// `concat!`; `$1`..`$12` are `jobs::job_args`.
macro_rules! insert_job {
    () => {
        "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
         version, attempt_count, created_at, updated_at, next_run_at, lease_owner, lease_until, key_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $11, 0, $12, $7, $7, $7, $8, $9, $10) \
         ON CONFLICT (owner_id, idempotency_key) DO NOTHING"
    };
}

/// The compare-and-swap of a succeeded attempt (invariant 5), with what
/// `$job`, `$version`, `$output`, `$attempt` and `$at` are in the statement
/// it is part of.
macro_rules! cas_won {
    ($job:literal, $version:literal, $output:literal, $attempt:literal, $at:literal) => {
        concat!(
            "UPDATE jobs SET state = 'succeeded', result = ",
            $output,
            ", completed_by = ",
            $attempt,
            ", version = version + 1, last_error = NULL, updated_at = ",
            $at,
            ", next_run_at = NULL, lease_owner = NULL, lease_until = NULL WHERE id = ",
            $job,
            " AND version = ",
            $version,
            " AND completed_by IS NULL RETURNING ",
            crate::store::rows::job_columns!()
        )
    };
}

/// The winner's attempt row, likewise.
macro_rules! attempt_won {
    ($attempt:literal, $output:literal, $usage:literal, $request:literal, $at:literal) => {
        concat!(
            "UPDATE attempts SET state = 'succeeded', output = ",
            $output,
            ", usage = ",
            $usage,
            ", provider_request_id = ",
            $request,
            ", finished_at = ",
            $at,
            " WHERE id = ",
            $attempt
        )
    };
}

// Both include the same resource files: each is compiled once per dialect,
// on purpose.
#[allow(clippy::duplicate_mod)]
pub(crate) mod postgres;
#[allow(clippy::duplicate_mod)]
pub(crate) mod sqlite;
