//! PostgreSQL's statements ([`Postgres`]). A guarded step locks the row it decides
//! about with `FOR UPDATE` inside its READ COMMITTED transaction, so every
//! later statement of that transaction sees what the previous holder
//! committed; dispatchers claim with `SKIP LOCKED`.
//!
//! Its own ways of a job's create (`insert_jobs_batched`: the creates of
//! concurrent callers in one statement of writable CTEs) and of a succeeded
//! attempt's win (`finish_won_batched`: the wins of concurrent callers in
//! one statement) are here, beside them.

use super::attempts::started_event;
use super::console::{key_prefix_few_sql, list_jobs_by_key_sql};
use super::db::Db;
use super::db::{Arg, Row};
use super::jobs::claim_jobs_sql;
use super::jobs::{created_event, initial_state};
use super::keys::usage_counts;
use super::webhooks::claim_deliveries_sql;
use super::{attempt_won, cas_won, usage_insert, usage_on_conflict, Dialect};
use crate::domain::attempt::AttemptOutcome;
use crate::domain::job::NewJob;
use crate::domain::{FinishReason, Job};
use crate::store::rows::JobRow;
use crate::store::{event, FinishAttempt, FinishOutcome, StoreError};

pub(crate) use super::{
    attempts::*, console::*, contract_runs::*, events::*, hedging::*, jobs::*, keys::*,
    switches::*, webhooks::*,
};

/// PostgreSQL's statements.
pub(crate) struct Postgres;

/// The shard of a rollup row (`usage_daily`, `attempt_hours`; migration
/// 0009) that an attempt adds to, `$attempt` its id in the statement: one
/// of 16, by the id's hash, so concurrent finishes of one owner (or
/// provider) upsert different rows, not one row each waits on.
macro_rules! rollup_shard {
    ($attempt:literal) => {
        concat!("(hashtext(", $attempt, ") & 15)")
    };
}

impl Dialect for Postgres {
    const GUARDED_JOB: &'static str =
        "SELECT state, version, attempt_count FROM jobs WHERE id = $1 FOR UPDATE";
    const FINISHING_ATTEMPT: &'static str =
        "SELECT job_id, state, read_version, provider, kind FROM attempts WHERE id = $1 FOR UPDATE";
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
    const ADD_USAGE: &'static str =
        concat!(usage_insert!(rollup_shard!("$11")), usage_on_conflict!());
    // The planner takes the recursive CTE for a hundred rows and `IN (SELECT
    // …)` to a hash join over the whole table (34 ms at 100,000 jobs);
    // `= ANY (ARRAY(…))` is one index scan with every owner in its
    // condition (2 ms).
    const KEY_PREFIX_FEW: &'static str =
        key_prefix_few_sql!("owner_id = ANY (ARRAY(SELECT id FROM owners))");
    const LIST_JOBS_BY_KEY: &'static str =
        list_jobs_by_key_sql!("owner_id = ANY (ARRAY(SELECT id FROM owners))");
    // The triggers stay: the one on `jobs` runs once per statement and
    // returns at once without an enabled endpoint (migration 0013); with
    // both dropped PostgreSQL's CPU per job was the same (docs/benchmarks.md).
    const WEBHOOK_TRIGGERS_CREATE: &'static [&'static str] = &[];
    const WEBHOOK_TRIGGERS_DROP: &'static [&'static str] = &[];
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

/// The succeeded attempts' finishes of concurrent callers in one statement
/// of writable CTEs, outside any transaction, which commits on its own:
/// each attempt locked `FOR UPDATE` and still able to succeed, its job's
/// CAS (invariant 5), and for each winner its attempt's row, usage and
/// event, as `Won::bid` (`attempts.rs`) writes them. One round trip where
/// BEGIN, the locks, the four writes and COMMIT take seven for each.
///
/// Returns, in `finishes`' order, `Some` for each that won, and `None` for
/// each that did not (the attempt is gone or ended, its job's CAS lost, or
/// another attempt of the same job in this batch won); of those it wrote
/// nothing, and `finish_attempt` in a transaction says what happened. An
/// attempt named twice is tried once, by its first finish.
///
/// Every row is found by its key, one index lookup per attempt, whatever
/// the tables' statistics. A connection keeps the generic plan it made on
/// its sixth execution; on a new database, before its first analyze, the
/// tables look empty, and a plan that read `attempts` for `id = ANY($1)`
/// (or `jobs`, joined to ten estimated rows) whole was the cheapest, and
/// stayed so while they grew: a lone win took about 1 ms of PostgreSQL's
/// time after 3,000 jobs. So each attempt is looked up on its own
/// (`LATERAL … LIMIT 1`), in the order of their ids, and `LIMIT $11` (the
/// number of rows) makes the planner count one input row, not unnest's
/// ten, which keeps every join a loop over the primary keys.
///
/// Two attempts of one job in a batch both meet the job's row in the
/// `UPDATE … FROM`, which updates it once, with one of them: that one is
/// the winner, and its output the result. The usage rows are summed per
/// rollup row first, since `ON CONFLICT DO UPDATE` may touch a row only
/// once per statement, and upserted in key order: batches of several
/// instances share rollup rows, and a hash aggregate's order is not the
/// same for two different sets of keys, so two batches could each hold a
/// row the other waits for.
pub(crate) async fn finish_won_batched(
    conn: &mut sqlx::PgConnection,
    finishes: &[FinishAttempt],
) -> Result<Vec<Option<FinishOutcome>>, StoreError> {
    let n = finishes.len();
    let mut attempt = Vec::with_capacity(n);
    let mut output = Vec::with_capacity(n);
    let mut at = Vec::with_capacity(n);
    let mut usage = Vec::with_capacity(n);
    let mut request_id = Vec::with_capacity(n);
    let mut finish_reason = Vec::with_capacity(n);
    let mut actor = Vec::with_capacity(n);
    let mut day = Vec::with_capacity(n);
    let mut prompt = Vec::with_capacity(n);
    let mut completion = Vec::with_capacity(n);
    let mut seen = std::collections::HashSet::with_capacity(n);
    let mut by_attempt: Vec<&FinishAttempt> = finishes.iter().collect();
    by_attempt.sort_by(|a, b| a.attempt_id.as_str().cmp(b.attempt_id.as_str()));
    for finish in by_attempt {
        let AttemptOutcome::Succeeded(success) = &finish.outcome else {
            continue;
        };
        if !seen.insert(finish.attempt_id.as_str()) {
            continue;
        }
        let stored = success.usage.map(|u| u.stored());
        let (p, c, _) = stored
            .as_deref()
            .map_or((0, 0, 0), |u| usage_counts(u, true));
        attempt.push(finish.attempt_id.as_str());
        output.push(success.output.as_str());
        at.push(finish.at);
        usage.push(stored);
        request_id.push(success.provider_request_id.as_deref());
        finish_reason.push(success.finish.as_ref().map(FinishReason::stored));
        actor.push(finish.actor.as_str());
        day.push(crate::store::tenants::day_of(finish.at));
        prompt.push(p);
        completion.push(c);
    }
    if attempt.is_empty() {
        return Ok(finishes.iter().map(|_| None).collect());
    }
    let won = sqlx::query(concat!(
        "WITH input AS (SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::text[], ",
        "$5::text[], $6::text[], $7::int8[], $8::int8[], $9::int8[], $12::text[]) WITH ORDINALITY ",
        "AS i(in_attempt, in_output, in_at, in_usage, in_request, in_actor, in_day, in_prompt, ",
        "in_completion, in_finish, in_n) LIMIT $11",
        "), bid AS (SELECT a.id AS b_attempt, a.job_id AS b_job, a.read_version AS b_version ",
        "FROM input CROSS JOIN LATERAL (SELECT id, job_id, read_version FROM attempts ",
        "WHERE id = in_attempt AND state IN (",
        crate::attempt_states_that_may_succeed!(),
        ") LIMIT 1 FOR UPDATE) a",
        "), won AS (",
        cas_won!(
            from "FROM bid JOIN input ON in_attempt = b_attempt";
            "b_job", "b_version", "in_output", "b_attempt", "in_at"
        ),
        " RETURNING ",
        crate::store::rows::job_columns!(),
        "), winner AS (SELECT input.*, won.id AS w_job, won.version AS w_version ",
        "FROM input JOIN won ON won.completed_by = in_attempt",
        "), attempt AS (",
        attempt_won!(
            from "FROM winner";
            "in_attempt", "in_output", "in_usage", "in_request", "in_finish", "in_at"
        ),
        "), usage AS (",
        "INSERT INTO usage_daily (owner_id, day, key_id, route, provider, kind, shard, ",
        "attempts, won, prompt_tokens, completion_tokens, discarded_tokens) ",
        "SELECT j.owner_id, w.in_day, COALESCE(j.key_id, ''), j.route, a.provider, a.kind, ",
        rollup_shard!("a.id"),
        ", COUNT(*), COUNT(*), SUM(w.in_prompt), SUM(w.in_completion), 0 ",
        "FROM winner w JOIN attempts a ON a.id = w.in_attempt JOIN jobs j ON j.id = a.job_id ",
        "WHERE w.in_usage IS NOT NULL GROUP BY 1, 2, 3, 4, 5, 6, 7 ",
        "ORDER BY 1, 2, 3, 4, 5, 6, 7",
        usage_on_conflict!(),
        "), event AS (",
        "INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) ",
        "SELECT w_job, in_attempt, $10, in_actor, '{\"version\":' || w_version || '}', in_at ",
        "FROM winner ORDER BY in_n",
        ") SELECT ",
        crate::store::rows::job_columns!(),
        " FROM won"
    ))
    .bind(&attempt)
    .bind(&output)
    .bind(&at)
    .bind(&usage)
    .bind(&request_id)
    .bind(&actor)
    .bind(&day)
    .bind(&prompt)
    .bind(&completion)
    .bind(event::ATTEMPT_SUCCEEDED.as_str())
    .bind(attempt.len() as i64)
    .bind(&finish_reason)
    .fetch_all(&mut *conn)
    .await?;
    let mut won: std::collections::HashMap<String, Job> = won
        .iter()
        .map(|row| {
            let job = Job::try_from(JobRow::decode(row)?)?;
            let winner = job.completed_by.clone().unwrap_or_default();
            Ok((winner.to_string(), job))
        })
        .collect::<Result<_, StoreError>>()?;
    Ok(finishes
        .iter()
        .map(|finish| {
            let job = won.remove(finish.attempt_id.as_str())?;
            Some(FinishOutcome::Won {
                version: job.version,
                job: Some(Box::new(job)),
            })
        })
        .collect())
}

/// The creates of concurrent callers in one statement of writable CTEs,
/// which commits on its own: each job inserted unless its (owner, key)
/// exists (the UNIQUE constraint decides, invariant 1; a key twice in one
/// batch is inserted once), with its `created` event, and its primary
/// attempt with that attempt's event: the rows SQLite writes statement by
/// statement (`sql/sqlite.rs`), the columns of [`insert_job!`](super::insert_job),
/// and each job's events in the same order. The jobs are inserted in
/// (owner, key) order, so batches that share keys take their index entries
/// in one order and cannot deadlock. Returns, in `jobs`' order, whether
/// this statement inserted each.
pub(crate) async fn insert_jobs_batched(
    conn: &mut sqlx::PgConnection,
    jobs: &[NewJob],
) -> Result<Vec<bool>, StoreError> {
    let n = jobs.len();
    let mut id = Vec::with_capacity(n);
    let mut owner = Vec::with_capacity(n);
    let mut key = Vec::with_capacity(n);
    let mut fingerprint = Vec::with_capacity(n);
    let mut request = Vec::with_capacity(n);
    let mut route = Vec::with_capacity(n);
    let mut created_at = Vec::with_capacity(n);
    let mut lease_owner = Vec::with_capacity(n);
    let mut lease_until = Vec::with_capacity(n);
    let mut key_id = Vec::with_capacity(n);
    let mut state = Vec::with_capacity(n);
    let mut attempt_count = Vec::with_capacity(n);
    let mut attempt_id = Vec::with_capacity(n);
    let mut provider = Vec::with_capacity(n);
    let mut kind = Vec::with_capacity(n);
    let mut started_at = Vec::with_capacity(n);
    let mut created_actor = Vec::with_capacity(n);
    let mut started_actor = Vec::with_capacity(n);
    let mut started_detail = Vec::with_capacity(n);
    for job in jobs {
        id.push(job.id.as_str());
        owner.push(job.owner_id.as_str());
        key.push(job.idempotency_key.as_str());
        fingerprint.push(job.fingerprint.as_str());
        request.push(job.request.as_str());
        route.push(job.route.as_str());
        created_at.push(job.created_at);
        lease_owner.push(job.lease.as_ref().map(|(o, _)| o.as_str()));
        lease_until.push(job.lease.as_ref().map(|(_, u)| *u));
        key_id.push(job.key_id.as_deref());
        let (initial, attempts) = initial_state(job);
        state.push(initial);
        attempt_count.push(attempts);
        let primary = job.primary.as_ref();
        attempt_id.push(primary.map(|p| p.id.as_str()));
        provider.push(primary.map(|p| p.provider.as_str()));
        kind.push(primary.map(|p| p.kind.as_str()));
        started_at.push(primary.map(|p| p.started_at));
        created_actor.push(created_event(job).actor);
        let started = primary.map(|p| started_event(p, 1, 0));
        started_actor.push(started.as_ref().map(|e| e.actor.clone()));
        started_detail.push(started.and_then(|e| e.detail));
    }
    let inserted: Vec<(String,)> = sqlx::query_as(
        "WITH input AS ( \
         SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], \
         $7::int8[], $8::text[], $9::int8[], $10::text[], $11::text[], $12::int8[], $13::text[], \
         $14::text[], $15::text[], $16::int8[], $17::text[], $18::text[], $19::text[]) WITH ORDINALITY \
         AS i(id, owner_id, idempotency_key, fingerprint, request, route, created_at, lease_owner, \
         lease_until, key_id, state, attempt_count, attempt_id, provider, kind, started_at, \
         created_actor, started_actor, started_detail, n) \
         ), job AS ( \
         INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
         version, attempt_count, created_at, updated_at, next_run_at, lease_owner, lease_until, key_id) \
         SELECT id, owner_id, idempotency_key, fingerprint, request, route, state, 0, attempt_count, \
         created_at, created_at, created_at, lease_owner, lease_until, key_id \
         FROM input ORDER BY owner_id COLLATE \"C\", idempotency_key COLLATE \"C\" \
         ON CONFLICT (owner_id, idempotency_key) DO NOTHING RETURNING id \
         ), attempt AS ( \
         INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, started_at) \
         SELECT i.attempt_id, i.id, 1, i.provider, i.kind, 'started', 0, i.started_at \
         FROM input i JOIN job ON job.id = i.id WHERE i.attempt_id IS NOT NULL ORDER BY i.n \
         RETURNING id, job_id \
         ), events AS ( \
         INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) \
         SELECT e.job_id, e.attempt_id, e.kind, e.actor, e.detail, e.at FROM ( \
         SELECT i.n, 1 AS m, i.id AS job_id, NULL::text AS attempt_id, $20::text AS kind, \
         i.created_actor AS actor, NULL::text AS detail, i.created_at AS at \
         FROM input i JOIN job ON job.id = i.id \
         UNION ALL \
         SELECT i.n, 2, i.id, a.id, $21::text, i.started_actor, i.started_detail, i.started_at \
         FROM input i JOIN attempt a ON a.job_id = i.id \
         ) e ORDER BY e.n, e.m \
         ) SELECT id FROM job",
    )
    .bind(&id)
    .bind(&owner)
    .bind(&key)
    .bind(&fingerprint)
    .bind(&request)
    .bind(&route)
    .bind(&created_at)
    .bind(&lease_owner)
    .bind(&lease_until)
    .bind(&key_id)
    .bind(&state)
    .bind(&attempt_count)
    .bind(&attempt_id)
    .bind(&provider)
    .bind(&kind)
    .bind(&started_at)
    .bind(&created_actor)
    .bind(&started_actor)
    .bind(&started_detail)
    .bind(event::CREATED.as_str())
    .bind(event::ATTEMPT_STARTED.as_str())
    .fetch_all(&mut *conn)
    .await?;
    let inserted: std::collections::HashSet<&str> =
        inserted.iter().map(|(id,)| id.as_str()).collect();
    Ok(jobs
        .iter()
        .map(|job| inserted.contains(job.id.as_str()))
        .collect())
}
