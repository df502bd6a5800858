//! The SQL of every [`Store`](super::Store) query, one file per resource
//! (`jobs.rs`, `attempts.rs`, `events.rs`, `keys.rs`, `switches.rs`,
//! `contract_runs.rs`, `console.rs`, `hedging.rs`, `webhooks.rs`), each
//! compiled once and written against [`db::Db`], so it runs on either
//! database.
//!
//! Where the two databases need different SQL (a row lock, a claim that
//! passes over locked rows, a collation, a rollup's shard), the query takes
//! its connection's [`Dialect`] statement, and each dialect's file
//! ([`sqlite`], [`postgres`]) writes that statement out once. Those files
//! also hold each backend's own create and winning finish.
//!
//! A backend calls `ops::NAME(connection, arguments…)`, where `ops` is its
//! dialect's module here: every query is re-exported from it under its
//! name (the name of the store trait method that calls it).

pub(crate) mod attempts;
pub(crate) mod console;
pub(crate) mod contract_runs;
pub(crate) mod db;
pub(crate) mod events;
pub(crate) mod hedging;
pub(crate) mod jobs;
pub(crate) mod keys;
pub(crate) mod postgres;
pub(crate) mod sqlite;
pub(crate) mod switches;
pub(crate) mod webhooks;

/// The statements that differ between the databases, each written out by
/// both dialects (`sql/sqlite.rs`, `sql/postgres.rs`). A query reaches its
/// connection's as `C::Sql::NAME` (`Db::Sql`).
pub(crate) trait Dialect: Send + Sync + 'static {
    /// The job a start's guard decides about (invariant 4): its state,
    /// version and attempt count, `$1` the job; locked until the commit.
    const GUARDED_JOB: &'static str;
    /// The attempt a finish records: its job, state, read version,
    /// provider and kind, `$1` the attempt; locked until the commit.
    const FINISHING_ATTEMPT: &'static str;
    /// The job an engine step or a decision acts on (`JobRow`), `$1` the
    /// job; locked until the commit.
    const LOCKED_JOB: &'static str;
    /// The attempt an admin settles: its job and state, `$1` the attempt;
    /// locked until the commit.
    const LOCKED_ATTEMPT: &'static str;
    /// The claim of runnable jobs (`jobs::claim_jobs_sql!`).
    const CLAIM_JOBS: &'static str;
    /// The claim of due webhook deliveries (`webhooks::claim_deliveries_sql!`).
    const CLAIM_DELIVERIES: &'static str;
    /// An attempt's usage added to its owner's day (`usage_insert!`).
    const ADD_USAGE: &'static str;
    /// How many jobs (up to 2,000) have a key in `[$1, $2)`
    /// (`console::key_prefix_few_sql!`), read owner by owner.
    const KEY_PREFIX_FEW: &'static str;
    /// The console's list with a key prefix few keys have
    /// (`console::list_jobs_by_key_sql!`), read owner by owner.
    const LIST_JOBS_BY_KEY: &'static str;
    /// The webhook triggers, created (`IF NOT EXISTS`) while an endpoint
    /// exists: empty where they always exist (PostgreSQL, whose trigger on
    /// `jobs` tests for an enabled endpoint first). See
    /// [`webhooks::webhook_triggers_follow_endpoints`].
    const WEBHOOK_TRIGGERS_CREATE: &'static [&'static str];
    /// …and dropped (`IF EXISTS`) once none does.
    const WEBHOOK_TRIGGERS_DROP: &'static [&'static str];
}

/// The usage of one attempt added to its owner's day (`keys.rs`
/// `add_usage`): the insert's head, as a literal for `concat!`, with the
/// row's values as the finish has them (no read of the attempt and its job
/// inside the statement: SQLite runs an `INSERT … SELECT` under a
/// statement journal, which cost a win about 14,000 instructions). Arguments:
/// `$1` owner, `$2` day, `$3` key (`''` for none), `$4` route, `$5`
/// provider, `$6` attempt kind, `$7` won (0/1), `$8` prompt, `$9`
/// completion and `$10` discarded tokens, `$11` the attempt. `$shard` is
/// the dialect's shard of the row (migration 0009).
macro_rules! usage_insert {
    ($shard:expr) => {
        concat!(
            "INSERT INTO usage_daily (owner_id, day, key_id, route, provider, kind, shard, \
             attempts, won, prompt_tokens, completion_tokens, discarded_tokens) \
             VALUES ($1, $2, $3, $4, $5, $6, ",
            $shard,
            ", 1, $7, $8, $9, $10)"
        )
    };
}

/// …and its tail: an existing day's row adds the new row's counts to its own.
macro_rules! usage_on_conflict {
    () => {
        " ON CONFLICT (owner_id, day, key_id, route, provider, kind, shard) DO UPDATE SET \
         attempts = usage_daily.attempts + excluded.attempts, won = usage_daily.won + excluded.won, \
         prompt_tokens = usage_daily.prompt_tokens + excluded.prompt_tokens, \
         completion_tokens = usage_daily.completion_tokens + excluded.completion_tokens, \
         discarded_tokens = usage_daily.discarded_tokens + excluded.discarded_tokens"
    };
}

/// The job's insert unless its (owner, key) exists, as a literal for
/// `concat!`; `$1`..`$12` are `jobs::job_args`, each first named in order
/// (so SQLite binds them by index, not by name).
macro_rules! insert_job {
    () => {
        "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, \
         created_at, updated_at, next_run_at, lease_owner, lease_until, key_id, state, version, \
         attempt_count) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $7, $7, $8, $9, $10, $11, 0, $12) \
         ON CONFLICT (owner_id, idempotency_key) DO NOTHING"
    };
}

/// The compare-and-swap of a succeeded attempt (invariant 5), with what
/// `$job`, `$version`, `$output`, `$attempt` and `$at` are in the statement
/// it is part of. With a leading `from "FROM …";` they may name the
/// columns of that `FROM` (PostgreSQL's batched win: one row per attempt).
/// It answers no row: a caller that wants the won job appends `RETURNING`
/// (PostgreSQL's batched win) or reads it by its id in the same
/// transaction (`Won::bid`).
macro_rules! cas_won {
    ($job:literal, $version:literal, $output:literal, $attempt:literal, $at:literal) => {
        $crate::store::sql::cas_won!(from ""; $job, $version, $output, $attempt, $at)
    };
    (from $from:literal; $job:literal, $version:literal, $output:literal, $attempt:literal, $at:literal) => {
        concat!(
            "UPDATE jobs SET state = 'succeeded', result = ",
            $output,
            ", completed_by = ",
            $attempt,
            ", version = version + 1, last_error = NULL, updated_at = ",
            $at,
            ", next_run_at = NULL, lease_owner = NULL, lease_until = NULL ",
            $from,
            " WHERE id = ",
            $job,
            " AND version = ",
            $version,
            " AND completed_by IS NULL"
        )
    };
}

/// The winner's attempt row, likewise, with why its provider stopped
/// (`$finish`, `FinishReason::stored`). An attempt that was unknown before
/// it won (its answer found by the reconciler) keeps the error that made it
/// unknown: its row tells why it was asked about.
macro_rules! attempt_won {
    ($attempt:literal, $output:literal, $usage:literal, $request:literal, $finish:literal, $at:literal) => {
        $crate::store::sql::attempt_won!(from ""; $attempt, $output, $usage, $request, $finish, $at)
    };
    (from $from:literal; $attempt:literal, $output:literal, $usage:literal, $request:literal, $finish:literal, $at:literal) => {
        concat!(
            "UPDATE attempts SET state = 'succeeded', output = ",
            $output,
            ", usage = ",
            $usage,
            ", provider_request_id = ",
            $request,
            ", finish_reason = ",
            $finish,
            ", finished_at = ",
            $at,
            " ",
            $from,
            " WHERE id = ",
            $attempt
        )
    };
}

pub(crate) use {attempt_won, cas_won, insert_job, usage_insert, usage_on_conflict};
