//! The SQL compiled for PostgreSQL. A guarded step locks the row it decides
//! about with `FOR UPDATE` inside its READ COMMITTED transaction, so every
//! later statement of that transaction sees what the previous holder
//! committed; dispatchers claim with `SKIP LOCKED`.
//!
//! Its own ways of a job's create (`create_job`: one statement of writable
//! CTEs) and of a succeeded attempt's win (`finish_won_alone`) are here,
//! after the resource files they build on.

pub(crate) type Conn = sqlx::PgConnection;

// The dialect's fragments, literals for `concat!`. They are defined before
// the resource modules below, so that those see them.

/// The row lock of a guarded step.
macro_rules! for_update {
    () => {
        " FOR UPDATE"
    };
}

/// Concurrent claims pass over each other's locked rows.
macro_rules! skip_locked {
    () => {
        " FOR UPDATE SKIP LOCKED"
    };
}

/// The idempotency key as its index (`jobs_by_key`) compares it, in byte
/// order (the index is built with `COLLATE "C"`).
macro_rules! key_indexed {
    () => {
        "idempotency_key COLLATE \"C\""
    };
}

/// The same comparison where SQLite keeps it off the index: the same text
/// here (unary `+` is not defined on text); the planner picks the plan.
macro_rules! key_unindexed {
    () => {
        "idempotency_key COLLATE \"C\""
    };
}

/// The shard of a rollup row (`usage_daily`, `attempt_hours`; migration
/// 0009) that the attempt with id `$id` adds to: one of 16, by the id's hash: concurrent finishes of one owner (or provider) upsert different rows, not one row each waits on.
macro_rules! rollup_shard {
    ($id:literal) => {
        concat!("(hashtext(", $id, ") & 15)")
    };
}

// The resource files, compiled here for this dialect (and in the other
// dialect's file for that one), their queries re-exported.
#[path = "attempts.rs"]
pub(crate) mod attempts;
#[path = "console.rs"]
pub(crate) mod console;
#[path = "contract_runs.rs"]
pub(crate) mod contract_runs;
#[path = "events.rs"]
pub(crate) mod events;
#[path = "hedging.rs"]
pub(crate) mod hedging;
#[path = "jobs.rs"]
pub(crate) mod jobs;
#[path = "keys.rs"]
pub(crate) mod keys;
#[path = "switches.rs"]
pub(crate) mod switches;
#[path = "webhooks.rs"]
pub(crate) mod webhooks;

pub(crate) use self::{
    attempts::*, console::*, contract_runs::*, events::*, hedging::*, jobs::*, keys::*,
    switches::*, webhooks::*,
};

use self::attempts::started_event;
use self::jobs::{create_outcome, created_event, job_args};
use self::keys::usage_counts;
use super::db::{args, Db};
use crate::domain::attempt::AttemptOutcome;
use crate::domain::job::NewJob;
use crate::domain::Job;
use crate::store::rows::JobRow;
use crate::store::{event, CreateOutcome, FinishAttempt, FinishOutcome, StoreError};

/// Insert the job unless (owner, key) exists (the UNIQUE constraint
/// decides), with its `created` event and its primary attempt, in one
/// statement that commits on its own.
pub(crate) async fn create_job(
    conn: &mut impl Db,
    job: NewJob,
) -> Result<CreateOutcome, StoreError> {
    let inserted = insert_job_in_one_statement(conn, &job).await?;
    create_outcome(conn, job, inserted).await
}

/// The rows SQLite writes statement by statement (`sql/sqlite.rs`), in the
/// same order, as one statement (writable CTEs, PostgreSQL): it commits on its
/// own, one round trip where a transaction took six (BEGIN, four inserts,
/// COMMIT). The two events are one insert, ordered, so their ids keep the
/// order of the other dialect's.
async fn insert_job_in_one_statement(conn: &mut impl Db, job: &NewJob) -> Result<bool, StoreError> {
    let created = created_event(job);
    let primary = job.primary.as_ref();
    let started = primary.map(|primary| started_event(primary, 1, 0));
    let mut arguments = job_args(job).to_vec();
    arguments.extend_from_slice(args![
        primary.map(|p| p.id.as_str()),
        primary.map(|p| p.provider.as_str()),
        primary.map(|p| p.kind.as_str()),
        primary.map(|p| p.started_at),
        created.kind.as_str(),
        &created.actor,
        started.as_ref().map(|e| e.kind.as_str()),
        started.as_ref().map(|e| e.actor.as_str()),
        started.as_ref().and_then(|e| e.detail.as_deref()),
    ]);
    let inserted: Option<(i64,)> = conn
        .fetch_optional(
            concat!(
                "WITH job AS (",
                insert_job!(),
                " RETURNING id), attempt AS ( \
                 INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, started_at) \
                 SELECT $13, job.id, 1, $14, $15, 'started', 0, $16 FROM job WHERE $13 IS NOT NULL \
                 RETURNING id \
                 ), events AS ( \
                 INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) \
                 SELECT e.job_id, e.attempt_id, e.kind, e.actor, e.detail, e.at FROM ( \
                 SELECT 1 AS n, job.id AS job_id, NULL AS attempt_id, $17 AS kind, $18 AS actor, \
                 NULL AS detail, $7 AS at FROM job \
                 UNION ALL \
                 SELECT 2, job.id, attempt.id, $19, $20, $21, $16 FROM job, attempt \
                 ) e ORDER BY e.n \
                 ) SELECT COUNT(*) FROM job"
            ),
            &arguments,
        )
        .await?;
    Ok(inserted.is_some_and(|(n,)| n == 1))
}

/// A succeeded attempt's finish in one statement, outside any transaction
/// (PostgreSQL): the attempt locked `FOR UPDATE` and still able to succeed,
/// the CAS, and when it won the attempt's row, usage and event, as
/// `Won::bid` (`attempts.rs`) writes them. `Some` when it won: one round trip where
/// BEGIN, the lock, the four writes and COMMIT take seven. `None` when it
/// did not (the attempt is gone or ended, or the CAS lost); then it wrote
/// nothing, and `finish_attempt` in a transaction says what happened.
pub(crate) async fn finish_won_alone(
    conn: &mut impl Db,
    finish: &FinishAttempt,
) -> Result<Option<FinishOutcome>, StoreError> {
    let AttemptOutcome::Succeeded(success) = &finish.outcome else {
        return Ok(None);
    };
    let usage = success.usage.map(|u| u.stored());
    let (prompt, completion, _) = usage
        .as_deref()
        .map_or((0, 0, 0), |u| usage_counts(u, true));
    let won: Option<JobRow> = conn
        .fetch_optional(
            concat!(
                "WITH bid AS (SELECT job_id, read_version FROM attempts WHERE id = $1 AND state IN (",
                crate::attempt_states_that_may_succeed!(),
                ")",
                for_update!(),
                "), won AS (",
                cas_won!("(SELECT job_id FROM bid)", "(SELECT read_version FROM bid)", "$7", "$1", "$8"),
                "), attempt AS (",
                attempt_won!("$1", "$7", "$9", "$10", "$8"),
                " AND EXISTS (SELECT 1 FROM won)",
                "), usage AS (",
                usage_insert!(),
                "WHERE a.id = $1 AND $9 IS NOT NULL AND EXISTS (SELECT 1 FROM won)",
                usage_on_conflict!(),
                "), event AS (",
                "INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) ",
                "SELECT won.id, $1, $11, $12, '{\"version\":' || won.version || '}', $8 FROM won",
                ") SELECT ",
                crate::store::rows::job_columns!(),
                " FROM won"
            ),
            args![
                &finish.attempt_id,
                crate::store::tenants::day_of(finish.at),
                1i64,
                prompt,
                completion,
                0i64,
                &success.output,
                finish.at,
                &usage,
                &success.provider_request_id,
                event::ATTEMPT_SUCCEEDED.as_str(),
                &finish.actor,
            ],
        )
        .await?;
    won.map(|won| {
        let job = Job::try_from(won)?;
        Ok(FinishOutcome::Won {
            version: job.version,
            job: Some(Box::new(job)),
        })
    })
    .transpose()
}
