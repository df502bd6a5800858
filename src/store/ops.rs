//! The store operations, written once and expanded per backend.
//!
//! Both dialects accept the same `$N` placeholders, `ON CONFLICT … DO
//! NOTHING` and `COUNT(*) FILTER (WHERE …)`, so the SQL text is shared. What
//! differs is how a step is made atomic: PostgreSQL locks the job (or
//! attempt) row with `FOR UPDATE` inside a READ COMMITTED transaction, so
//! every later statement of that transaction sees what the previous holder
//! committed; SQLite runs every write inside `BEGIN IMMEDIATE`, which already
//! excludes every other writer, in this process or another. The macro takes
//! the connection type and that row-lock suffix.

macro_rules! store_ops {
    ($conn:ty, $for_update:literal) => {
        use crate::domain::attempt::{may_start, Ambiguous, AttemptOutcome, Failure, NewAttempt};
        use crate::domain::job::NewJob;
        use crate::domain::{Attempt, AttemptState, GuardRefusal, Job, LiveAttempts};
        use crate::{
            attempt_state_awaiting_settlement, attempt_states_live, job_state_awaiting_decision,
            job_states_settled_for_good, job_states_taking_attempts,
        };
        use crate::store::rows::{attempt_columns, job_columns, ApiKeyRow, AttemptRow, EventRow, JobRow, LiveRow};
        use crate::store::{
            event, ApiKey, CreateOutcome, FinishAttempt, FinishOutcome, JobEvent, NewEvent, StoreError,
        };

        pub(crate) async fn create_job(conn: &mut $conn, job: NewJob) -> Result<CreateOutcome, StoreError> {
            let (state, attempt_count) = match &job.primary {
                Some(_) => ("running", 1i64),
                None => ("pending", 0i64),
            };
            let inserted = sqlx::query(
                "INSERT INTO jobs (id, owner_id, idempotency_key, fingerprint, request, route, state, \
                 version, attempt_count, created_at, updated_at, next_run_at, lease_owner, lease_until, key_id) \
                 VALUES ($1, $2, $3, $4, $5, $6, $11, 0, $12, $7, $7, $7, $8, $9, $10) \
                 ON CONFLICT (owner_id, idempotency_key) DO NOTHING",
            )
            .bind(&job.id)
            .bind(&job.owner_id)
            .bind(&job.idempotency_key)
            .bind(&job.fingerprint)
            .bind(&job.request)
            .bind(&job.route)
            .bind(job.created_at)
            .bind(job.lease.as_ref().map(|(owner, _)| owner.as_str()))
            .bind(job.lease.as_ref().map(|(_, until)| *until))
            .bind(job.key_id.as_deref())
            .bind(state)
            .bind(attempt_count)
            .execute(&mut *conn)
            .await?
            .rows_affected();
            if inserted == 1 {
                insert_event(
                    conn,
                    &NewEvent {
                        job_id: job.id.clone(),
                        attempt_id: None,
                        kind: event::CREATED,
                        actor: job.owner_id.clone(),
                        detail: None,
                        at: job.created_at,
                    },
                )
                .await?;
                if let Some(primary) = &job.primary {
                    // The job was created by this very statement: it takes
                    // attempts and has none, so the guard of `start_attempt`
                    // (invariant 4) admits a primary without reading anything.
                    insert_started_attempt(conn, primary, 1, 0).await?;
                }
                return Ok(CreateOutcome::Created(job.into_job()));
            }
            // The UNIQUE constraint said no: the job exists and is committed
            // (PostgreSQL's ON CONFLICT waited for its inserter to finish).
            match find_job_by_key(conn, &job.owner_id, &job.idempotency_key).await? {
                Some(existing) => Ok(CreateOutcome::Existing(existing)),
                None => Err(StoreError::NotFound("job that blocked the insert")),
            }
        }

        pub(crate) async fn find_job_by_key(
            conn: &mut $conn,
            owner_id: &str,
            key: &str,
        ) -> Result<Option<Job>, StoreError> {
            let row: Option<JobRow> = sqlx::query_as(concat!(
                "SELECT ",
                job_columns!(),
                " FROM jobs WHERE owner_id = $1 AND idempotency_key = $2"
            ))
            .bind(owner_id)
            .bind(key)
            .fetch_optional(&mut *conn)
            .await?;
            row.map(Job::try_from).transpose()
        }

        pub(crate) async fn get_job(conn: &mut $conn, id: &str) -> Result<Option<Job>, StoreError> {
            let row: Option<JobRow> = sqlx::query_as(concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = $1"))
                .bind(id)
                .fetch_optional(&mut *conn)
                .await?;
            row.map(Job::try_from).transpose()
        }

        pub(crate) async fn list_attempts(conn: &mut $conn, job_id: &str) -> Result<Vec<Attempt>, StoreError> {
            let rows: Vec<AttemptRow> = sqlx::query_as(concat!(
                "SELECT ",
                attempt_columns!(),
                " FROM attempts WHERE job_id = $1 ORDER BY seq"
            ))
            .bind(job_id)
            .fetch_all(&mut *conn)
            .await?;
            rows.into_iter().map(Attempt::try_from).collect()
        }

        pub(crate) async fn start_attempt(
            conn: &mut $conn,
            new: NewAttempt,
        ) -> Result<Result<Attempt, GuardRefusal>, StoreError> {
            let job: Option<(String, i64, i64)> = sqlx::query_as(concat!(
                "SELECT state, version, attempt_count FROM jobs WHERE id = $1",
                $for_update
            ))
            .bind(&new.job_id)
            .fetch_optional(&mut *conn)
            .await?;
            let Some((state, version, attempt_count)) = job else {
                return Ok(Err(GuardRefusal::NoSuchJob));
            };
            let state = crate::store::parse_job_state(&state)?;
            let live: LiveRow = sqlx::query_as(
                "SELECT COUNT(*) FILTER (WHERE state = 'started') AS started, \
                 COUNT(*) FILTER (WHERE state = 'unknown') AS unknown, \
                 COUNT(*) FILTER (WHERE kind = 'hedge') AS hedges, \
                 COUNT(*) FILTER (WHERE state = 'started' AND provider = $2) AS started_here, \
                 COUNT(*) FILTER (WHERE state = 'unknown' AND provider = $2) AS unknown_here \
                 FROM attempts WHERE job_id = $1",
            )
            .bind(&new.job_id)
            .bind(&new.provider)
            .fetch_one(&mut *conn)
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
            sqlx::query(
                "UPDATE jobs SET attempt_count = $2, updated_at = $3, \
                 state = CASE WHEN state = 'pending' THEN 'running' ELSE state END WHERE id = $1",
            )
            .bind(&new.job_id)
            .bind(seq)
            .bind(new.started_at)
            .execute(&mut *conn)
            .await?;
            insert_started_attempt(conn, &new, seq, version).await?;
            Ok(Ok(Attempt {
                id: new.id,
                job_id: new.job_id,
                seq,
                provider: new.provider,
                kind: new.kind,
                state: AttemptState::Started,
                read_version: version,
                started_at: new.started_at,
                finished_at: None,
                error_kind: None,
                error_message: None,
                output: None,
                usage: None,
                provider_request_id: None,
            }))
        }

        /// The attempt row of a start the guard admitted, and its event.
        async fn insert_started_attempt(
            conn: &mut $conn,
            new: &NewAttempt,
            seq: i64,
            version: i64,
        ) -> Result<(), StoreError> {
            sqlx::query(
                "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, started_at) \
                 VALUES ($1, $2, $3, $4, $5, 'started', $6, $7)",
            )
            .bind(&new.id)
            .bind(&new.job_id)
            .bind(seq)
            .bind(&new.provider)
            .bind(new.kind.as_str())
            .bind(version)
            .bind(new.started_at)
            .execute(&mut *conn)
            .await?;
            let detail = serde_json::json!({
                "provider": new.provider, "kind": new.kind.as_str(), "seq": seq, "read_version": version,
            });
            insert_event(
                conn,
                &NewEvent {
                    job_id: new.job_id.clone(),
                    attempt_id: Some(new.id.clone()),
                    kind: event::ATTEMPT_STARTED,
                    actor: "engine".to_string(),
                    detail: Some(detail.to_string()),
                    at: new.started_at,
                },
            )
            .await
        }

        pub(crate) async fn finish_attempt(conn: &mut $conn, finish: FinishAttempt) -> Result<FinishOutcome, StoreError> {
            let row: Option<(String, String, i64)> = sqlx::query_as(concat!(
                "SELECT job_id, state, read_version FROM attempts WHERE id = $1",
                $for_update
            ))
            .bind(&finish.attempt_id)
            .fetch_optional(&mut *conn)
            .await?;
            let Some((job_id, state, read_version)) = row else {
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
            let event_for = |kind: &'static str, detail: Option<String>| NewEvent {
                job_id: job_id.clone(),
                attempt_id: Some(finish.attempt_id.clone()),
                kind,
                actor: finish.actor.clone(),
                detail,
                at,
            };
            match &finish.outcome {
                AttemptOutcome::Succeeded(success) => {
                    let (output, provider_request_id) = (&success.output, &success.provider_request_id);
                    let usage = success.usage.and_then(|u| serde_json::to_string(&u).ok());
                    // Invariant 5: exactly one winner.
                    // The won job comes back as committed, for whoever
                    // waits for it (no read after the commit).
                    let won: Option<JobRow> = sqlx::query_as(concat!(
                        "UPDATE jobs SET state = 'succeeded', result = $3, completed_by = $4, \
                         version = version + 1, last_error = NULL, updated_at = $5, \
                         next_run_at = NULL, lease_owner = NULL, lease_until = NULL \
                         WHERE id = $1 AND version = $2 AND completed_by IS NULL RETURNING ",
                        job_columns!()
                    ))
                    .bind(&job_id)
                    .bind(read_version)
                    .bind(output)
                    .bind(&finish.attempt_id)
                    .bind(at)
                    .fetch_optional(&mut *conn)
                    .await?;
                    if let Some(won) = won {
                        sqlx::query(
                            "UPDATE attempts SET state = 'succeeded', output = $2, usage = $3, \
                             provider_request_id = $4, finished_at = $5 WHERE id = $1",
                        )
                        .bind(&finish.attempt_id)
                        .bind(output)
                        .bind(&usage)
                        .bind(provider_request_id)
                        .bind(at)
                        .execute(&mut *conn)
                        .await?;
                        add_usage(conn, &finish.attempt_id, usage.as_deref(), true, at).await?;
                        let version = read_version + 1;
                        let detail = serde_json::json!({ "version": version }).to_string();
                        insert_event(conn, &event_for(event::ATTEMPT_SUCCEEDED, Some(detail))).await?;
                        return Ok(FinishOutcome::Won { version, job: Some(Box::new(Job::try_from(won)?)) });
                    }
                    // The late result is discarded, not merged; its usage is
                    // kept so the cost of the race stays visible.
                    sqlx::query(
                        "UPDATE attempts SET state = 'discarded', usage = $2, provider_request_id = $3, \
                         finished_at = $4 WHERE id = $1",
                    )
                    .bind(&finish.attempt_id)
                    .bind(&usage)
                    .bind(provider_request_id)
                    .bind(at)
                    .execute(&mut *conn)
                    .await?;
                    // A lost race is paid for all the same.
                    add_usage(conn, &finish.attempt_id, usage.as_deref(), false, at).await?;
                    let current: Option<(i64, Option<String>, String)> =
                        sqlx::query_as("SELECT version, completed_by, state FROM jobs WHERE id = $1")
                            .bind(&job_id)
                            .fetch_optional(&mut *conn)
                            .await?;
                    let (current_version, completed_by, job_state) = current.unwrap_or((-1, None, String::new()));
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
                    sqlx::query(
                        "UPDATE attempts SET state = 'discarded', error_kind = 'abandoned', error_message = $2, \
                         finished_at = $3 WHERE id = $1",
                    )
                    .bind(&finish.attempt_id)
                    .bind(reason)
                    .bind(at)
                    .execute(&mut *conn)
                    .await?;
                    let detail = serde_json::json!({ "reason": reason }).to_string();
                    insert_event(conn, &event_for(event::ATTEMPT_ABANDONED, Some(detail))).await?;
                    Ok(FinishOutcome::Lost)
                }
                AttemptOutcome::Failed(Failure { kind: error_kind, message, .. })
                | AttemptOutcome::Unknown(Ambiguous { kind: error_kind, message }) => {
                    let (kind, finished_at) = match wanted {
                        AttemptState::Failed => (event::ATTEMPT_FAILED, Some(at)),
                        // An unknown attempt has not finished; it awaits settlement.
                        _ => (event::ATTEMPT_UNKNOWN, None),
                    };
                    sqlx::query(
                        "UPDATE attempts SET state = $2, error_kind = $3, error_message = $4, \
                         finished_at = $5 WHERE id = $1",
                    )
                    .bind(&finish.attempt_id)
                    .bind(wanted.as_str())
                    .bind(error_kind)
                    .bind(message)
                    .bind(finished_at)
                    .execute(&mut *conn)
                    .await?;
                    let last_error = format!("{error_kind}: {message}");
                    // A succeeded or cancelled job never changes again (a late
                    // loser's error stays on the attempt): replays of it are
                    // answered from memory (`crate::replays`).
                    sqlx::query(concat!(
                        "UPDATE jobs SET last_error = $2, updated_at = $3 \
                         WHERE id = $1 AND state NOT IN (", job_states_settled_for_good!(), ")",
                    ))
                        .bind(&job_id)
                        .bind(&last_error)
                        .bind(at)
                        .execute(&mut *conn)
                        .await?;
                    if wanted == AttemptState::Failed {
                        // A job parked on its unknown attempts (no
                        // `next_run_at`) whose last live one just failed may
                        // run again: in the same commit, so no store error
                        // between settling and waking can strand it.
                        sqlx::query(concat!(
                            "UPDATE jobs SET next_run_at = $2 WHERE id = $1 AND next_run_at IS NULL AND state IN (",
                            job_states_taking_attempts!(),
                            ") AND NOT EXISTS (SELECT 1 FROM attempts WHERE job_id = $1 AND state IN (",
                            attempt_states_live!(),
                            "))"
                        ))
                        .bind(&job_id)
                        .bind(at)
                        .execute(&mut *conn)
                        .await?;
                    }
                    let detail = serde_json::json!({ "error_kind": error_kind, "message": message }).to_string();
                    insert_event(conn, &event_for(kind, Some(detail))).await?;
                    Ok(FinishOutcome::Recorded)
                }
            }
        }

        pub(crate) async fn insert_event(conn: &mut $conn, ev: &NewEvent) -> Result<(), StoreError> {
            sqlx::query(
                "INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) \
                 VALUES ($1, $2, $3, $4, $5, $6)",
            )
            .bind(&ev.job_id)
            .bind(&ev.attempt_id)
            .bind(ev.kind)
            .bind(&ev.actor)
            .bind(&ev.detail)
            .bind(ev.at)
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        /// Many events in one statement per chunk (the replay audit's flush).
        pub(crate) async fn insert_events(conn: &mut $conn, events: &[NewEvent]) -> Result<(), StoreError> {
            // 6 parameters a row: far below either backend's bind limit.
            for chunk in events.chunks(256) {
                let mut insert = sqlx::QueryBuilder::<<$conn as sqlx::Connection>::Database>::new(
                    "INSERT INTO job_events (job_id, attempt_id, kind, actor, detail, at) ",
                );
                insert.push_values(chunk, |mut row, ev| {
                    row.push_bind(&ev.job_id)
                        .push_bind(&ev.attempt_id)
                        .push_bind(ev.kind)
                        .push_bind(&ev.actor)
                        .push_bind(&ev.detail)
                        .push_bind(ev.at);
                });
                // Its text varies with the chunk's size: not kept among the
                // connection's prepared statements, where it would push out
                // the job path's own.
                insert.build().persistent(false).execute(&mut *conn).await?;
            }
            Ok(())
        }

        pub(crate) async fn record_event(conn: &mut $conn, event: NewEvent) -> Result<(), StoreError> {
            insert_event(conn, &event).await
        }

        pub(crate) async fn record_events(conn: &mut $conn, events: Vec<NewEvent>) -> Result<(), StoreError> {
            insert_events(conn, &events).await
        }

        pub(crate) async fn list_events(conn: &mut $conn, job_id: &str) -> Result<Vec<JobEvent>, StoreError> {
            let rows: Vec<EventRow> = sqlx::query_as(
                "SELECT id, job_id, attempt_id, kind, actor, detail, at FROM job_events \
                 WHERE job_id = $1 ORDER BY id",
            )
            .bind(job_id)
            .fetch_all(&mut *conn)
            .await?;
            Ok(rows.into_iter().map(JobEvent::from).collect())
        }

        pub(crate) async fn count_jobs(conn: &mut $conn) -> Result<i64, StoreError> {
            let (n,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM jobs").fetch_one(&mut *conn).await?;
            Ok(n)
        }

        pub(crate) async fn insert_api_key(conn: &mut $conn, key: ApiKey) -> Result<(), StoreError> {
            sqlx::query(
                "INSERT INTO api_keys (id, owner_id, key_hash, prefix, is_admin, created_at, expires_at, revoked_at, \
                 limits, family_id) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            )
            .bind(&key.id)
            .bind(&key.owner_id)
            .bind(&key.key_hash)
            .bind(&key.prefix)
            .bind(key.is_admin)
            .bind(key.created_at)
            .bind(key.expires_at)
            .bind(key.revoked_at)
            .bind(&key.limits)
            .bind(&key.family_id)
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        pub(crate) async fn find_api_key(conn: &mut $conn, key_hash: &str) -> Result<Option<ApiKey>, StoreError> {
            let row: Option<ApiKeyRow> = sqlx::query_as(
                "SELECT id, owner_id, key_hash, prefix, is_admin, created_at, expires_at, revoked_at, \
                 limits, family_id FROM api_keys WHERE key_hash = $1",
            )
            .bind(key_hash)
            .fetch_optional(&mut *conn)
            .await?;
            Ok(row.map(ApiKey::from))
        }
    };
}

pub(crate) use store_ops;
