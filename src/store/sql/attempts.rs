//! Attempts: the guarded start (invariant 4), the finish and its CAS
//! (invariant 5) and the reconciler's lists. An admin's settlement of an
//! unknown attempt is in `jobs.rs`, beside the other decisions: it may
//! restart the job.

use super::events::insert_event;
use super::keys::{add_usage, UsageOf};
use super::{attempt_won, cas_won};
use crate::domain::attempt::{may_start, Ambiguous, AttemptOutcome, Failure, NewAttempt};
use crate::domain::{
    Attempt, AttemptState, EventKind, FinishReason, GuardRefusal, Job, LiveAttempts, Millis,
};
use crate::store::rows::{attempt_columns, job_columns, AttemptRow, JobRow, LiveRow};
use crate::store::sql::db::{args, Columns, Db, Row};
use crate::store::sql::Dialect;
use crate::store::{event, FinishAttempt, FinishOutcome, NewEvent, StoreError};
use crate::{
    attempt_state_awaiting_settlement, attempt_states_live, job_states_settled_for_good,
    job_states_taking_attempts,
};

pub(crate) async fn list_attempts(
    conn: &mut impl Db,
    job_id: &str,
) -> Result<Vec<Attempt>, StoreError> {
    let rows: Vec<AttemptRow> = conn
        .fetch_all(
            concat!(
                "SELECT ",
                attempt_columns!(),
                " FROM attempts WHERE job_id = $1 ORDER BY seq"
            ),
            args![job_id],
        )
        .await?;
    rows.into_iter().map(Attempt::try_from).collect()
}

pub(crate) async fn get_attempt(
    conn: &mut impl Db,
    attempt_id: &str,
) -> Result<Option<Attempt>, StoreError> {
    let row: Option<AttemptRow> = conn
        .fetch_optional(
            concat!(
                "SELECT ",
                attempt_columns!(),
                " FROM attempts WHERE id = $1"
            ),
            args![attempt_id],
        )
        .await?;
    row.map(Attempt::try_from).transpose()
}

pub(crate) async fn start_attempt<C: Db>(
    conn: &mut C,
    new: NewAttempt,
) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
    let job: Option<(String, i64, i64)> = conn
        .fetch_optional(C::Sql::GUARDED_JOB, args![&new.job_id])
        .await?;
    let Some((state, version, attempt_count)) = job else {
        return Ok(Err(GuardRefusal::NoSuchJob));
    };
    let state = crate::store::parse_job_state(&state)?;
    let live: LiveRow = conn
        .fetch_one(
            "SELECT COUNT(*) FILTER (WHERE state = 'started') AS started, \
         COUNT(*) FILTER (WHERE state = 'unknown') AS unknown, \
         COUNT(*) FILTER (WHERE kind = 'hedge') AS hedges, \
         COUNT(*) FILTER (WHERE state = 'started' AND provider = $2) AS started_here, \
         COUNT(*) FILTER (WHERE state = 'unknown' AND provider = $2) AS unknown_here \
         FROM attempts WHERE job_id = $1",
            args![&new.job_id, &new.provider],
        )
        .await?;
    if let Err(refusal) = may_start(
        new.kind,
        !state.takes_attempts(),
        LiveAttempts::from(live),
        new.max_hedges,
        new.reuses_key,
    ) {
        return Ok(Err(refusal));
    }
    let seq = attempt_count + 1;
    // Starting an attempt does not bump the version (invariant 5).
    conn.execute(
        "UPDATE jobs SET attempt_count = $2, updated_at = $3, \
         state = CASE WHEN state = 'pending' THEN 'running' ELSE state END WHERE id = $1",
        args![&new.job_id, seq, new.started_at],
    )
    .await?;
    insert_started_attempt(conn, &new, seq, version).await?;
    Ok(Ok(new.started(seq, version)))
}

/// The attempt row of a start the guard admitted, and its event.
pub(super) async fn insert_started_attempt(
    conn: &mut impl Db,
    new: &NewAttempt,
    seq: i64,
    version: i64,
) -> Result<(), StoreError> {
    insert_started_attempt_row(conn, new, seq, version).await?;
    insert_event(conn, &started_event(new, seq, version)).await
}

/// The attempt row of a start the guard admitted, without its event.
pub(super) async fn insert_started_attempt_row(
    conn: &mut impl Db,
    new: &NewAttempt,
    seq: i64,
    version: i64,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, started_at) \
         VALUES ($1, $2, $3, $4, $5, 'started', $6, $7)",
        args![
            &new.id,
            &new.job_id,
            seq,
            &new.provider,
            new.kind.as_str(),
            version,
            new.started_at
        ],
    )
    .await?;
    Ok(())
}

/// The event of an attempt's start.
pub(crate) fn started_event(new: &NewAttempt, seq: i64, version: i64) -> NewEvent {
    let detail = serde_json::json!({
        "provider": new.provider, "kind": new.kind.as_str(), "seq": seq, "read_version": version,
    });
    NewEvent {
        job_id: new.job_id.clone(),
        attempt_id: Some(new.id.clone()),
        kind: event::ATTEMPT_STARTED,
        actor: "engine".to_string(),
        detail: Some(crate::domain::json_text(&detail)),
        at: new.started_at,
    }
}

pub(crate) async fn finish_attempt<C: Db>(
    conn: &mut C,
    finish: FinishAttempt,
) -> Result<FinishOutcome, StoreError> {
    let row: Option<(String, String, i64, String, String)> = conn
        .fetch_optional(C::Sql::FINISHING_ATTEMPT, args![&finish.attempt_id])
        .await?;
    let Some((job_id, state, read_version, provider, kind)) = row else {
        return Err(StoreError::NotFound("attempt"));
    };
    let state = crate::store::parse_attempt_state(&state)?;
    let wanted = finish.outcome.wanted_state();
    if !state.may_become(wanted) {
        return Err(StoreError::InvalidTransition {
            attempt_id: finish.attempt_id,
            state: state.as_str().to_string(),
            wanted: wanted.as_str(),
        });
    }
    let at = finish.at;
    let event_for = |kind: EventKind, detail: Option<String>| NewEvent {
        job_id: job_id.clone().into(),
        attempt_id: Some(finish.attempt_id.clone()),
        kind,
        actor: finish.actor.clone(),
        detail,
        at,
    };
    match &finish.outcome {
        AttemptOutcome::Succeeded(success) => {
            let (output, provider_request_id) = (&success.output, &success.provider_request_id);
            let usage = success.usage.map(|u| u.stored());
            let finish_reason = success.finish.as_ref().map(FinishReason::stored);
            let version = read_version + 1;
            let won_event = event_for(
                event::ATTEMPT_SUCCEEDED,
                Some(crate::domain::json_text(
                    &serde_json::json!({ "version": version }),
                )),
            );
            let won = Won {
                job_id: &job_id,
                read_version,
                attempt_id: &finish.attempt_id,
                output,
                usage: usage.as_deref(),
                provider_request_id: provider_request_id.as_deref(),
                finish_reason: finish_reason.as_deref(),
                provider: &provider,
                kind: &kind,
                at,
                event: &won_event,
            };
            // Invariant 5: exactly one winner. The won job comes back as
            // committed, for whoever waits for it (no read after the commit).
            // (PostgreSQL tries the win first: `finish_won_batched` in
            // `sql/postgres.rs`.)
            let won = won.bid(conn).await?;
            if let Some(won) = won {
                return Ok(FinishOutcome::Won {
                    version,
                    job: Some(Box::new(Job::try_from(won)?)),
                });
            }
            // The late result is discarded, not merged; its usage is
            // kept so the cost of the race stays visible.
            conn.execute(
                "UPDATE attempts SET state = 'discarded', usage = $2, provider_request_id = $3, \
                 finished_at = $4 WHERE id = $1",
                args![&finish.attempt_id, &usage, provider_request_id, at],
            )
            .await?;
            let current: Option<(i64, Option<String>, String, String, String, String)> = conn
                .fetch_optional(
                    "SELECT version, completed_by, state, owner_id, COALESCE(key_id, ''), route \
                     FROM jobs WHERE id = $1",
                    args![&job_id],
                )
                .await?;
            let (current_version, completed_by, job_state) = match &current {
                Some((version, completed_by, state, owner_id, key_id, route)) => {
                    // A lost race is paid for all the same.
                    let of = UsageOf {
                        attempt_id: &finish.attempt_id,
                        owner_id,
                        key_id,
                        route,
                        provider: &provider,
                        kind: &kind,
                    };
                    add_usage(conn, &of, usage.as_deref(), false, at).await?;
                    (*version, completed_by.clone(), state.clone())
                }
                None => (-1, None, String::new()),
            };
            let detail = serde_json::json!({
                "read_version": read_version,
                "current_version": current_version,
                "completed_by": completed_by,
                "job_state": job_state,
            })
            .to_string();
            insert_event(conn, &event_for(event::CAS_LOST, Some(detail))).await?;
            Ok(FinishOutcome::Lost)
        }
        AttemptOutcome::Abandoned { reason } => {
            conn.execute(
                "UPDATE attempts SET state = 'discarded', error_kind = 'abandoned', error_message = $2, \
                 finished_at = $3 WHERE id = $1",
                args![&finish.attempt_id, reason, at],
            )
            .await?;
            let detail = crate::domain::json_text(&serde_json::json!({ "reason": reason }));
            insert_event(conn, &event_for(event::ATTEMPT_ABANDONED, Some(detail))).await?;
            Ok(FinishOutcome::Lost)
        }
        AttemptOutcome::Failed(Failure {
            kind: error_kind,
            message,
            ..
        })
        | AttemptOutcome::Unknown(Ambiguous {
            kind: error_kind,
            message,
        }) => {
            let (kind, finished_at) = match wanted {
                AttemptState::Failed => (event::ATTEMPT_FAILED, Some(at)),
                // An unknown attempt has not finished; it awaits settlement.
                _ => (event::ATTEMPT_UNKNOWN, None),
            };
            conn.execute(
                "UPDATE attempts SET state = $2, error_kind = $3, error_message = $4, \
                 finished_at = $5 WHERE id = $1",
                args![
                    &finish.attempt_id,
                    wanted.as_str(),
                    error_kind.as_str(),
                    message,
                    finished_at
                ],
            )
            .await?;
            let last_error = format!("{error_kind}: {message}");
            // A succeeded or cancelled job never changes again (a late
            // loser's error stays on the attempt): replays of it are
            // answered from memory (`crate::replays`).
            conn.execute(
                concat!(
                    "UPDATE jobs SET last_error = $2, updated_at = $3 \
                     WHERE id = $1 AND state NOT IN (",
                    job_states_settled_for_good!(),
                    ")",
                ),
                args![&job_id, &last_error, at],
            )
            .await?;
            if wanted == AttemptState::Failed {
                // A job parked on its unknown attempts (no
                // `next_run_at`) whose last live one just failed may
                // run again: in the same commit, so no store error
                // between settling and waking can strand it.
                conn.execute(
                    concat!(
                        "UPDATE jobs SET next_run_at = $2 WHERE id = $1 AND next_run_at IS NULL AND state IN (",
                        job_states_taking_attempts!(),
                        ") AND NOT EXISTS (SELECT 1 FROM attempts WHERE job_id = $1 AND state IN (",
                        attempt_states_live!(),
                        "))"
                    ),
                    args![&job_id, at],
                )
                .await?;
            }
            let detail = crate::domain::json_text(
                &serde_json::json!({ "error_kind": error_kind, "message": message }),
            );
            insert_event(conn, &event_for(kind, Some(detail))).await?;
            Ok(FinishOutcome::Recorded)
        }
    }
}

/// A succeeded attempt's bid to win its job: the CAS and, when it wins, the
/// attempt's row, its usage and its event, in the caller's transaction.
struct Won<'a> {
    job_id: &'a str,
    read_version: i64,
    attempt_id: &'a str,
    output: &'a str,
    usage: Option<&'a str>,
    provider_request_id: Option<&'a str>,
    /// Why the provider stopped (`FinishReason::stored`).
    finish_reason: Option<&'a str>,
    /// The attempt's provider and kind, for its usage's row.
    provider: &'a str,
    kind: &'a str,
    at: Millis,
    event: &'a NewEvent,
}

/// The won job, with its key family for its usage's row.
struct WonRow {
    job: JobRow,
    key_id: String,
}

impl Row for WonRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(WonRow {
            job: JobRow::decode(row)?,
            key_id: row.get("key_id")?,
        })
    }
}

impl Won<'_> {
    /// The job as the win left it, or `None`: another attempt won (or the
    /// job ended) and nothing was written.
    async fn bid(&self, conn: &mut impl Db) -> Result<Option<JobRow>, StoreError> {
        let changed = conn
            .execute(
                cas_won!("$1", "$2", "$3", "$4", "$5"),
                args![
                    self.job_id,
                    self.read_version,
                    self.output,
                    self.attempt_id,
                    self.at
                ],
            )
            .await?;
        // The won job is read back in the same transaction, not returned
        // by the update: SQLite runs `RETURNING` as a trigger that fills a
        // temporary table, dearer than a read by the primary key.
        let won: Option<WonRow> = if changed == 1 {
            conn.fetch_optional(
                concat!(
                    "SELECT ",
                    job_columns!(),
                    ", COALESCE(key_id, '') AS key_id FROM jobs WHERE id = $1"
                ),
                args![self.job_id],
            )
            .await?
        } else {
            None
        };
        if let Some(won) = &won {
            conn.execute(
                attempt_won!("$1", "$2", "$3", "$4", "$6", "$5"),
                args![
                    self.attempt_id,
                    self.output,
                    self.usage,
                    self.provider_request_id,
                    self.at,
                    self.finish_reason
                ],
            )
            .await?;
            let of = UsageOf {
                attempt_id: self.attempt_id,
                owner_id: won.job.owner_id(),
                key_id: &won.key_id,
                route: won.job.route(),
                provider: self.provider,
                kind: self.kind,
            };
            add_usage(conn, &of, self.usage, true, self.at).await?;
            insert_event(conn, self.event).await?;
        }
        Ok(won.map(|won| won.job))
    }
}

pub(crate) async fn list_unknown_attempts(
    conn: &mut impl Db,
    after: Option<(Millis, &str)>,
    limit: i64,
) -> Result<Vec<Attempt>, StoreError> {
    let (after_at, after_id) = after.unwrap_or((Millis::MIN, ""));
    let rows: Vec<AttemptRow> = conn
        .fetch_all(
            concat!(
                "SELECT ",
                attempt_columns!(),
                " FROM attempts WHERE state = ",
                attempt_state_awaiting_settlement!(),
                " AND (started_at > $1 OR (started_at = $1 AND id > $2))",
                " ORDER BY started_at, id LIMIT $3"
            ),
            args![after_at, after_id, limit],
        )
        .await?;
    rows.into_iter().map(Attempt::try_from).collect()
}

pub(crate) async fn list_stale_started(
    conn: &mut impl Db,
    started_before: Millis,
    limit: i64,
) -> Result<Vec<Attempt>, StoreError> {
    let rows: Vec<AttemptRow> = conn
        .fetch_all(
            concat!(
        "SELECT ",
        attempt_columns!(),
        " FROM attempts WHERE state = 'started' AND started_at < $1 ORDER BY started_at LIMIT $2"
    ),
            args![started_before, limit],
        )
        .await?;
    rows.into_iter().map(Attempt::try_from).collect()
}

pub(super) async fn live_attempts(conn: &mut impl Db, job_id: &str) -> Result<i64, StoreError> {
    let (n,): (i64,) = conn
        .fetch_one(
            concat!(
                "SELECT COUNT(*) FROM attempts WHERE job_id = $1 AND state IN (",
                attempt_states_live!(),
                ")"
            ),
            args![job_id],
        )
        .await?;
    Ok(n)
}
