//! Jobs: the idempotent create, claims and leases, the engine's job steps,
//! user and admin decisions, and the review queue.

use super::attempts::{finish_attempt, live_attempts};
use super::events::{decision_event, insert_event};
use crate::domain::attempt::AttemptOutcome;
use crate::domain::job::NewJob;
use crate::domain::{AttemptState, Job, Millis};
use crate::store::rows::{job_columns, JobRow};
use crate::store::sql::db::{args, Arg, Db, IntoArg};
use crate::store::sql::Dialect;
use crate::store::{
    event, AttemptResolution, CreateOutcome, FinishAttempt, FinishOutcome, JobResolution,
    JobTransition, NewEvent, Refusal, ReviewItem, StoreError,
};
use crate::{attempt_states_live, job_state_awaiting_decision, job_states_taking_attempts};

/// What a create answers once its insert is known: the job as inserted, or
/// the job whose (owner, key) blocked it. Each dialect's `create_job`
/// (`sql/sqlite.rs`, `sql/postgres.rs`) inserts, then calls this.
pub(crate) async fn create_outcome(
    conn: &mut impl Db,
    job: NewJob,
    inserted: bool,
) -> Result<CreateOutcome, StoreError> {
    if inserted {
        return Ok(CreateOutcome::Created(job.into_job()));
    }
    // The UNIQUE constraint said no: the job exists and is committed
    // (PostgreSQL's ON CONFLICT waited for its inserter to finish), or was
    // inserted by an earlier row of the same batched statement.
    match find_job_by_key(conn, &job.owner_id, &job.idempotency_key).await? {
        Some(existing) => Ok(CreateOutcome::Existing(existing)),
        None => Err(StoreError::NotFound("job that blocked the insert")),
    }
}

/// A new job's state and attempt count: `running` with its primary
/// attempt, else `pending`.
pub(crate) fn initial_state(job: &NewJob) -> (&'static str, i64) {
    match &job.primary {
        Some(_) => ("running", 1),
        None => ("pending", 0),
    }
}

/// The arguments of [`insert_job!`] (SQLite's create, one job at a time).
pub(crate) fn job_args(job: &NewJob) -> [Arg<'_>; 12] {
    let (state, attempt_count) = initial_state(job);
    [
        (&job.id).arg(),
        (&job.owner_id).arg(),
        (&job.idempotency_key).arg(),
        (&job.fingerprint).arg(),
        (&job.request).arg(),
        (&job.route).arg(),
        job.created_at.arg(),
        job.lease.as_ref().map(|(owner, _)| owner.as_str()).arg(),
        job.lease.as_ref().map(|(_, until)| *until).arg(),
        job.key_id.as_deref().arg(),
        state.arg(),
        attempt_count.arg(),
    ]
}

/// The event of a job's creation.
pub(crate) fn created_event(job: &NewJob) -> NewEvent {
    NewEvent {
        job_id: job.id.clone(),
        attempt_id: None,
        kind: event::CREATED,
        actor: job.owner_id.to_string(),
        detail: None,
        at: job.created_at,
    }
}

pub(crate) async fn find_job_by_key(
    conn: &mut impl Db,
    owner_id: &str,
    key: &str,
) -> Result<Option<Job>, StoreError> {
    let row: Option<JobRow> = conn
        .fetch_optional(
            concat!(
                "SELECT ",
                job_columns!(),
                " FROM jobs WHERE owner_id = $1 AND idempotency_key = $2"
            ),
            args![owner_id, key],
        )
        .await?;
    row.map(Job::try_from).transpose()
}

/// The newest of the owner's jobs held by any of `keys`: one statement,
/// each key an indexed probe.
pub(crate) async fn latest_job_by_keys(
    conn: &mut impl Db,
    owner_id: &str,
    keys: &[String],
) -> Result<Option<Job>, StoreError> {
    if keys.is_empty() {
        return Ok(None);
    }
    let placeholders: Vec<String> = (0..keys.len()).map(|i| format!("${}", i + 2)).collect();
    let sql = format!(
        concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE owner_id = $1 AND idempotency_key IN ({}) \
             ORDER BY created_at DESC LIMIT 1"
        ),
        placeholders.join(", ")
    );
    let mut args = vec![crate::store::sql::db::IntoArg::arg(owner_id)];
    args.extend(
        keys.iter()
            .map(|k| crate::store::sql::db::IntoArg::arg(k.as_str())),
    );
    let row: Option<JobRow> = conn.fetch_optional(&sql, &args).await?;
    row.map(Job::try_from).transpose()
}

pub(crate) async fn get_job(conn: &mut impl Db, id: &str) -> Result<Option<Job>, StoreError> {
    let row: Option<JobRow> = conn
        .fetch_optional(
            concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = $1"),
            args![id],
        )
        .await?;
    row.map(Job::try_from).transpose()
}

pub(crate) async fn count_jobs(conn: &mut impl Db) -> Result<i64, StoreError> {
    let (n,): (i64,) = conn.fetch_one("SELECT COUNT(*) FROM jobs", args![]).await?;
    Ok(n)
}

/// The claim of runnable jobs (`claim_jobs`), with the dialect's lock
/// (`$lock`) on the rows it takes; `$1` the claimer, `$2` now, `$3` lease
/// until, `$4` limit, `$5` whether the claimer's own leases are taken again.
macro_rules! claim_jobs_sql {
    ($lock:literal) => {
        concat!(
            "UPDATE jobs SET lease_owner = $1, lease_until = CASE ",
            "WHEN lease_owner = $1 AND lease_until > $3 THEN lease_until ELSE $3 END ",
            "WHERE id IN (",
            "SELECT id FROM jobs WHERE next_run_at IS NOT NULL AND next_run_at <= $2 ",
            "AND (lease_until IS NULL OR lease_until < $2 OR ($5 AND lease_owner = $1)) ",
            "AND state IN (",
            $crate::job_states_taking_attempts!(),
            ") ",
            "ORDER BY next_run_at LIMIT $4",
            $lock,
            ") RETURNING ",
            $crate::store::rows::job_columns!()
        )
    };
}
pub(crate) use claim_jobs_sql;

pub(crate) async fn claim_jobs<C: Db>(
    conn: &mut C,
    owner: &str,
    now: Millis,
    lease_until: Millis,
    limit: i64,
    reclaim_own: bool,
) -> Result<Vec<Job>, StoreError> {
    let rows: Vec<JobRow> = conn
        .fetch_all(
            C::Sql::CLAIM_JOBS,
            args![owner, now, lease_until, limit, reclaim_own],
        )
        .await?;
    rows.into_iter().map(Job::try_from).collect()
}

pub(crate) async fn renew_lease(
    conn: &mut impl Db,
    job_id: &str,
    owner: &str,
    lease_until: Millis,
) -> Result<bool, StoreError> {
    let n = conn
        .execute(
            "UPDATE jobs SET lease_until = $3 WHERE id = $1 AND lease_owner = $2",
            args![job_id, owner, lease_until],
        )
        .await?;
    Ok(n == 1)
}

pub(crate) async fn transition_job(
    conn: &mut impl Db,
    job_id: &str,
    lease_owner: Option<&str>,
    transition: JobTransition,
    at: Millis,
) -> Result<bool, StoreError> {
    // One statement per transition; all share the guard "the job takes
    // attempts and, when fenced, is still ours" (a job in review waits
    // for a human: no engine step moves it).
    let (sql, args, kind, detail): (&str, Vec<Arg<'_>>, _, _) = match &transition {
        JobTransition::Backoff { next_run_at, lease_until, reason } => (
            concat!(
                "UPDATE jobs SET state = 'pending', next_run_at = $3, lease_until = $4, updated_at = $5 \
                 WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                 AND state IN (", job_states_taking_attempts!(), ")",
            ),
            vec![job_id.arg(), lease_owner.arg(), (*next_run_at).arg(), (*lease_until).arg(), at.arg()],
            Some(event::RETRY_SCHEDULED),
            serde_json::json!({ "next_run_at": next_run_at, "reason": reason }),
        ),
        JobTransition::BlockOnUnknown => (
            // The reconciler may have settled the attempt between the
            // driver recording it unknown and this step; its wake-up
            // found the job still held and did nothing. Only a live
            // attempt may park the job; without one it is runnable now.
            concat!(
                "UPDATE jobs SET next_run_at = CASE WHEN EXISTS (SELECT 1 FROM attempts \
                 WHERE job_id = $1 AND state IN (", attempt_states_live!(), ")) THEN NULL ELSE $3 END, \
                 lease_owner = NULL, lease_until = NULL, updated_at = $3 \
                 WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                 AND state IN (", job_states_taking_attempts!(), ")",
            ),
            vec![job_id.arg(), lease_owner.arg(), at.arg()],
            Some(event::BLOCKED_ON_UNKNOWN),
            serde_json::json!({}),
        ),
        JobTransition::Fail { reason } => (
            concat!(
                "UPDATE jobs SET state = 'failed', version = version + 1, last_error = $3, \
                 next_run_at = NULL, lease_owner = NULL, lease_until = NULL, updated_at = $4 \
                 WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                 AND state IN (", job_states_taking_attempts!(), ")",
            ),
            vec![job_id.arg(), lease_owner.arg(), reason.arg(), at.arg()],
            Some(event::JOB_FAILED),
            serde_json::json!({ "reason": reason }),
        ),
        JobTransition::Review { reason } => (
            concat!(
                "UPDATE jobs SET state = 'needs_review', last_error = $3, \
                 next_run_at = NULL, lease_owner = NULL, lease_until = NULL, updated_at = $4 \
                 WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                 AND state IN (", job_states_taking_attempts!(), ")",
            ),
            vec![job_id.arg(), lease_owner.arg(), reason.arg(), at.arg()],
            Some(event::NEEDS_REVIEW),
            serde_json::json!({ "reason": reason }),
        ),
        JobTransition::Release { next_run_at } => (
            concat!(
                "UPDATE jobs SET next_run_at = $3, lease_owner = NULL, lease_until = NULL \
                 WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                 AND state IN (", job_states_taking_attempts!(), ")",
            ),
            vec![job_id.arg(), lease_owner.arg(), (*next_run_at).arg()],
            None,
            serde_json::json!({}),
        ),
    };
    if transition == JobTransition::BlockOnUnknown {
        // PostgreSQL: wait for a settlement in flight (it updates the
        // job row too), so the statement below, on a fresh snapshot,
        // sees it. SQLite writes are already serialised.
        locked_job(conn, job_id).await?;
    }
    let applied = conn.execute(sql, &args).await? == 1;
    if let (true, Some(kind)) = (applied, kind) {
        insert_event(
            conn,
            &NewEvent {
                job_id: job_id.into(),
                attempt_id: None,
                kind,
                actor: lease_owner
                    .map(|o| format!("engine:{o}"))
                    .unwrap_or_else(|| "engine".into()),
                detail: Some(crate::domain::json_text(&detail)),
                at,
            },
        )
        .await?;
    }
    Ok(applied)
}

pub(crate) async fn wake_job(
    conn: &mut impl Db,
    job_id: &str,
    at: Millis,
) -> Result<(), StoreError> {
    conn.execute(
        concat!(
            "UPDATE jobs SET next_run_at = $2, updated_at = $2 \
         WHERE id = $1 AND next_run_at IS NULL AND state IN (",
            job_states_taking_attempts!(),
            ")"
        ),
        args![job_id, at],
    )
    .await?;
    Ok(())
}

async fn locked_job<C: Db>(conn: &mut C, job_id: &str) -> Result<Option<Job>, StoreError> {
    let row: Option<JobRow> = conn
        .fetch_optional(C::Sql::LOCKED_JOB, args![job_id])
        .await?;
    row.map(Job::try_from).transpose()
}

/// Start a fresh retry budget now: the job is `pending` and runnable.
pub(super) async fn restart(
    conn: &mut impl Db,
    job_id: &str,
    at: Millis,
) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE jobs SET state = 'pending', next_run_at = $2, budget_start = attempt_count, \
         lease_owner = NULL, lease_until = NULL, updated_at = $2 WHERE id = $1",
        args![job_id, at],
    )
    .await?;
    Ok(())
}

pub(super) async fn reload(conn: &mut impl Db, job_id: &str) -> Result<Job, StoreError> {
    get_job(conn, job_id)
        .await?
        .ok_or(StoreError::NotFound("job"))
}

pub(crate) async fn cancel_job(
    conn: &mut impl Db,
    job_id: &str,
    actor: &str,
    reason: &str,
    at: Millis,
) -> Result<Result<Job, Refusal>, StoreError> {
    let Some(job) = locked_job(conn, job_id).await? else {
        return Ok(Err(Refusal::NotFound));
    };
    if !job.state.accepts_cancel() {
        return Ok(Err(Refusal::Finished(job.state.as_str())));
    }
    // The version bump makes every in-flight attempt's CAS fail.
    conn.execute(
        "UPDATE jobs SET state = 'cancelled', version = version + 1, next_run_at = NULL, \
         lease_owner = NULL, lease_until = NULL, updated_at = $2 WHERE id = $1",
        args![job_id, at],
    )
    .await?;
    decision_event(
        conn,
        job_id,
        None,
        event::CANCELLED,
        actor,
        serde_json::json!({ "reason": reason }),
        at,
    )
    .await?;
    Ok(Ok(reload(conn, job_id).await?))
}

pub(crate) async fn request_retry(
    conn: &mut impl Db,
    job_id: &str,
    actor: &str,
    at: Millis,
) -> Result<Result<Job, Refusal>, StoreError> {
    let Some(job) = locked_job(conn, job_id).await? else {
        return Ok(Err(Refusal::NotFound));
    };
    if !job.state.accepts_retry() {
        return Ok(Err(Refusal::Finished(job.state.as_str())));
    }
    if live_attempts(conn, job_id).await? > 0 {
        return Ok(Err(Refusal::OutcomeUnknown));
    }
    restart(conn, job_id, at).await?;
    decision_event(
        conn,
        job_id,
        None,
        event::RETRY_REQUESTED,
        actor,
        serde_json::json!({}),
        at,
    )
    .await?;
    Ok(Ok(reload(conn, job_id).await?))
}

pub(crate) async fn resolve_job(
    conn: &mut impl Db,
    job_id: &str,
    resolution: JobResolution,
    actor: &str,
    reason: &str,
    at: Millis,
) -> Result<Result<Job, Refusal>, StoreError> {
    let Some(job) = locked_job(conn, job_id).await? else {
        return Ok(Err(Refusal::NotFound));
    };
    if !job.state.accepts_retry() {
        return Ok(Err(Refusal::Finished(job.state.as_str())));
    }
    let action = match &resolution {
        JobResolution::Complete { result } => {
            conn.execute(
                "UPDATE jobs SET state = 'succeeded', result = $2, completed_by = $3, last_error = NULL, \
                 version = version + 1, next_run_at = NULL, lease_owner = NULL, lease_until = NULL, updated_at = $4 \
                 WHERE id = $1 AND completed_by IS NULL",
                args![job_id, result, &format!("resolution:{actor}"), at],
            )
            .await?;
            "complete"
        }
        JobResolution::Retry => {
            if live_attempts(conn, job_id).await? > 0 {
                return Ok(Err(Refusal::OutcomeUnknown));
            }
            restart(conn, job_id, at).await?;
            "retry"
        }
        JobResolution::Close => {
            conn.execute(
                "UPDATE jobs SET state = 'cancelled', version = version + 1, next_run_at = NULL, \
                 lease_owner = NULL, lease_until = NULL, updated_at = $2 WHERE id = $1",
                args![job_id, at],
            )
            .await?;
            "close"
        }
    };
    let detail =
        serde_json::json!({ "action": action, "reason": reason, "from_state": job.state.as_str() });
    decision_event(conn, job_id, None, event::RESOLVED, actor, detail, at).await?;
    Ok(Ok(reload(conn, job_id).await?))
}

pub(crate) async fn list_review(
    conn: &mut impl Db,
    limit: i64,
) -> Result<Vec<ReviewItem>, StoreError> {
    // One statement: each item's last attempt time comes from a
    // subquery over the attempts' (job_id, seq) index, not a round
    // trip per item (200 round trips took 550 ms on PostgreSQL).
    let rows: Vec<crate::store::rows::ReviewRow> = conn
        .fetch_all(
            concat!(
        "SELECT ",
        job_columns!(),
        ", (SELECT MAX(a.started_at) FROM attempts a WHERE a.job_id = jobs.id) AS last_attempt_at",
        " FROM jobs WHERE state = ",
        job_state_awaiting_decision!(),
        " ORDER BY updated_at LIMIT $1"
    ),
            args![limit],
        )
        .await?;
    rows.into_iter()
        .map(|row| {
            Ok(ReviewItem {
                job: Job::try_from(row.job)?,
                last_attempt_at: row.last_attempt_at,
            })
        })
        .collect()
}

pub(crate) async fn resolve_attempt<C: Db>(
    conn: &mut C,
    attempt_id: &str,
    resolution: AttemptResolution,
    actor: &str,
    reason: &str,
    at: Millis,
) -> Result<Result<Job, Refusal>, StoreError> {
    let row: Option<(String, String)> = conn
        .fetch_optional(C::Sql::LOCKED_ATTEMPT, args![attempt_id])
        .await?;
    let Some((job_id, state)) = row else {
        return Ok(Err(Refusal::NotFound));
    };
    let state = crate::store::parse_attempt_state(&state)?;
    if state != AttemptState::Unknown {
        return Ok(Err(Refusal::NotUnknown(state.as_str())));
    }
    // An executed attempt that loses the CAS (the job was finished by
    // then) keeps no output: the result the admin gave is kept in the
    // decision's event instead, with the fact that it lost.
    let mut lost_result = None;
    let action = match resolution {
        AttemptResolution::Executed { result } => {
            let finish = FinishAttempt {
                attempt_id: attempt_id.into(),
                outcome: AttemptOutcome::succeeded(result.clone()),
                at,
                actor: actor.to_string(),
            };
            if let FinishOutcome::Lost = finish_attempt(conn, finish).await? {
                lost_result = Some(result);
            }
            "executed"
        }
        AttemptResolution::NotExecuted => {
            conn.execute(
                "UPDATE attempts SET state = 'cancelled', finished_at = $2 WHERE id = $1",
                args![attempt_id, at],
            )
            .await?;
            "not_executed"
        }
    };
    let mut detail = serde_json::json!({ "action": action, "reason": reason });
    if let Some(result) = lost_result {
        detail["won"] = false.into();
        detail["result"] =
            serde_json::from_str(&result).unwrap_or(serde_json::Value::String(result));
    }
    decision_event(
        conn,
        &job_id,
        Some(attempt_id),
        event::ATTEMPT_RESOLVED,
        actor,
        detail,
        at,
    )
    .await?;
    // A human said it never ran: once nothing else is live, the job may go again.
    if action == "not_executed" {
        let job = reload(conn, &job_id).await?;
        if !job.state.is_final() && live_attempts(conn, &job_id).await? == 0 {
            restart(conn, &job_id, at).await?;
        }
    }
    Ok(Ok(reload(conn, &job_id).await?))
}
