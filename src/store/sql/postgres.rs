//! PostgreSQL's statements ([`Postgres`]). A guarded step locks the row it decides
//! about with `FOR UPDATE` inside its READ COMMITTED transaction, so every
//! later statement of that transaction sees what the previous holder
//! committed; dispatchers claim with `SKIP LOCKED`.
//!
//! Its own ways of a job's create (`create_job`: one statement of writable
//! CTEs) and of a succeeded attempt's win (`finish_won_alone`) are here,
//! beside them.

use super::attempts::started_event;
use super::console::list_jobs_sql;
use super::db::{args, Db};
use super::db::{Arg, Row};
use super::jobs::claim_jobs_sql;
use super::jobs::{create_outcome, created_event, job_args};
use super::keys::usage_counts;
use super::webhooks::claim_deliveries_sql;
use super::{attempt_won, cas_won, insert_job, usage_insert, usage_on_conflict, Dialect};
use crate::domain::attempt::AttemptOutcome;
use crate::domain::job::NewJob;
use crate::domain::Job;
use crate::store::rows::JobRow;
use crate::store::{event, CreateOutcome, FinishAttempt, FinishOutcome, StoreError};

pub(crate) use super::{
    attempts::*, console::*, contract_runs::*, events::*, hedging::*, jobs::*, keys::*,
    switches::*, webhooks::*,
};

/// PostgreSQL's statements.
pub(crate) struct Postgres;

/// The shard of a rollup row (`usage_daily`, `attempt_hours`; migration
/// 0009) that attempt `a.id` adds to: one of 16, by the id's hash, so
/// concurrent finishes of one owner (or provider) upsert different rows,
/// not one row each waits on.
macro_rules! rollup_shard {
    () => {
        "(hashtext(a.id) & 15)"
    };
}

impl Dialect for Postgres {
    const GUARDED_JOB: &'static str =
        "SELECT state, version, attempt_count FROM jobs WHERE id = $1 FOR UPDATE";
    const FINISHING_ATTEMPT: &'static str =
        "SELECT job_id, state, read_version FROM attempts WHERE id = $1 FOR UPDATE";
    const LOCKED_JOB: &'static str = concat!(
        "SELECT ",
        crate::store::rows::job_columns!(),
        " FROM jobs WHERE id = $1 FOR UPDATE"
    );
    const LOCKED_ATTEMPT: &'static str =
        "SELECT job_id, state FROM attempts WHERE id = $1 FOR UPDATE";
    // Concurrent claimers pass over each other's locked rows.
    const CLAIM_JOBS: &'static str = claim_jobs_sql!(" FOR UPDATE SKIP LOCKED");
    const CLAIM_DELIVERIES: &'static str = claim_deliveries_sql!(" FOR UPDATE SKIP LOCKED");
    const ADD_USAGE: &'static str = concat!(
        usage_insert!(rollup_shard!()),
        "WHERE a.id = $1",
        usage_on_conflict!()
    );
    // `jobs_by_key` is built `COLLATE "C"` (byte order); unary `+` is not
    // defined on text, so both lists compare the same way and the planner
    // picks the plan.
    const KEY_PREFIX_FEW: &'static str = "SELECT COUNT(*) FROM (SELECT 1 FROM jobs \
         WHERE idempotency_key COLLATE \"C\" >= $1 AND idempotency_key COLLATE \"C\" < $2 \
         LIMIT 2000) matching";
    const LIST_JOBS_BY_KEY: &'static str = list_jobs_sql!(
        "AND idempotency_key COLLATE \"C\" >= $10 AND idempotency_key COLLATE \"C\" < $11"
    );
    const LIST_JOBS_SCANNING_KEYS: &'static str = Self::LIST_JOBS_BY_KEY;
}

/// Bind `args` to a sqlx query, with their types.
fn bind_sqlx<'q>(
    mut query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    args: &[Arg<'q>],
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    for arg in args {
        query = match *arg {
            Arg::Int(value) => query.bind(value),
            Arg::Bool(value) => query.bind(value),
            Arg::Text(value) => query.bind(value),
        };
    }
    query
}

/// sqlx's PostgreSQL connection: the statement is prepared (and kept) by
/// sqlx, the arguments bound with their types.
impl Db for sqlx::PgConnection {
    type Sql = Postgres;

    async fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let query = bind_sqlx(sqlx::query(sql), args);
        Ok(query.execute(&mut *self).await?.rows_affected())
    }

    async fn execute_once(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64, StoreError> {
        let query = bind_sqlx(sqlx::query(sql), args).persistent(false);
        Ok(query.execute(&mut *self).await?.rows_affected())
    }

    async fn fetch_optional<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Option<R>, StoreError> {
        let query = bind_sqlx(sqlx::query(sql), args);
        match query.fetch_optional(&mut *self).await? {
            Some(row) => Ok(Some(R::decode(&row)?)),
            None => Ok(None),
        }
    }

    async fn fetch_all<R: Row>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
    ) -> Result<Vec<R>, StoreError> {
        let query = bind_sqlx(sqlx::query(sql), args);
        let rows = query.fetch_all(&mut *self).await?;
        rows.iter().map(|row| R::decode(row)).collect()
    }
}

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
                ") FOR UPDATE), won AS (",
                cas_won!("(SELECT job_id FROM bid)", "(SELECT read_version FROM bid)", "$7", "$1", "$8"),
                "), attempt AS (",
                attempt_won!("$1", "$7", "$9", "$10", "$8"),
                " AND EXISTS (SELECT 1 FROM won)",
                "), usage AS (",
                usage_insert!(rollup_shard!()),
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
