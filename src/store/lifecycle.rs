//! Job lifecycle operations (claims, leases, engine transitions, user and
//! admin decisions, provider switches), written once for both backends like
//! `ops.rs`. `$for_update` locks the decided-about row on PostgreSQL;
//! `$skip_locked` lets concurrent dispatchers pass over each other's claims.

macro_rules! lifecycle_ops {
    ($conn:ty, $for_update:literal, $skip_locked:literal) => {
        use crate::domain::Millis;
        use crate::store::{
            AttemptResolution, JobResolution, JobTransition, ProviderSwitch, Refusal, ReviewItem,
        };

        pub(crate) async fn claim_jobs(
            conn: &mut $conn,
            owner: &str,
            now: Millis,
            lease_until: Millis,
            limit: i64,
            reclaim_own: bool,
        ) -> Result<Vec<Job>, StoreError> {
            let rows: Vec<JobRow> = sqlx::query_as(concat!(
                "UPDATE jobs SET lease_owner = $1, lease_until = CASE ",
                "WHEN lease_owner = $1 AND lease_until > $3 THEN lease_until ELSE $3 END ",
                "WHERE id IN (",
                "SELECT id FROM jobs WHERE next_run_at IS NOT NULL AND next_run_at <= $2 ",
                "AND (lease_until IS NULL OR lease_until < $2 OR ($5 AND lease_owner = $1)) ",
                "AND state IN (",
                job_states_taking_attempts!(),
                ") ",
                "ORDER BY next_run_at LIMIT $4",
                $skip_locked,
                ") RETURNING ",
                job_columns!()
            ))
            .bind(owner)
            .bind(now)
            .bind(lease_until)
            .bind(limit)
            .bind(reclaim_own)
            .fetch_all(&mut *conn)
            .await?;
            rows.into_iter().map(Job::try_from).collect()
        }

        pub(crate) async fn renew_lease(
            conn: &mut $conn,
            job_id: &str,
            owner: &str,
            lease_until: Millis,
        ) -> Result<bool, StoreError> {
            let n = sqlx::query("UPDATE jobs SET lease_until = $3 WHERE id = $1 AND lease_owner = $2")
                .bind(job_id)
                .bind(owner)
                .bind(lease_until)
                .execute(&mut *conn)
                .await?
                .rows_affected();
            Ok(n == 1)
        }

        pub(crate) async fn transition_job(
            conn: &mut $conn,
            job_id: &str,
            lease_owner: Option<&str>,
            transition: JobTransition,
            at: Millis,
        ) -> Result<bool, StoreError> {
            // One statement per transition; all share the guard "the job takes
            // attempts and, when fenced, is still ours" (a job in review waits
            // for a human: no engine step moves it).
            let (query, kind, detail) = match &transition {
                JobTransition::Backoff { next_run_at, lease_until, reason } => (
                    sqlx::query(concat!(
                        "UPDATE jobs SET state = 'pending', next_run_at = $3, lease_until = $4, updated_at = $5 \
                         WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                         AND state IN (", job_states_taking_attempts!(), ")",
                    ))
                    .bind(job_id)
                    .bind(lease_owner)
                    .bind(*next_run_at)
                    .bind(*lease_until)
                    .bind(at),
                    event::RETRY_SCHEDULED,
                    serde_json::json!({ "next_run_at": next_run_at, "reason": reason }),
                ),
                JobTransition::BlockOnUnknown => (
                    // The reconciler may have settled the attempt between the
                    // driver recording it unknown and this step; its wake-up
                    // found the job still held and did nothing. Only a live
                    // attempt may park the job; without one it is runnable now.
                    sqlx::query(concat!(
                        "UPDATE jobs SET next_run_at = CASE WHEN EXISTS (SELECT 1 FROM attempts \
                         WHERE job_id = $1 AND state IN (", attempt_states_live!(), ")) THEN NULL ELSE $3 END, \
                         lease_owner = NULL, lease_until = NULL, updated_at = $3 \
                         WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                         AND state IN (", job_states_taking_attempts!(), ")",
                    ))
                    .bind(job_id)
                    .bind(lease_owner)
                    .bind(at),
                    event::BLOCKED_ON_UNKNOWN,
                    serde_json::json!({}),
                ),
                JobTransition::Fail { reason } => (
                    sqlx::query(concat!(
                        "UPDATE jobs SET state = 'failed', version = version + 1, last_error = $3, \
                         next_run_at = NULL, lease_owner = NULL, lease_until = NULL, updated_at = $4 \
                         WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                         AND state IN (", job_states_taking_attempts!(), ")",
                    ))
                    .bind(job_id)
                    .bind(lease_owner)
                    .bind(reason)
                    .bind(at),
                    event::JOB_FAILED,
                    serde_json::json!({ "reason": reason }),
                ),
                JobTransition::Review { reason } => (
                    sqlx::query(concat!(
                        "UPDATE jobs SET state = 'needs_review', last_error = $3, \
                         next_run_at = NULL, lease_owner = NULL, lease_until = NULL, updated_at = $4 \
                         WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                         AND state IN (", job_states_taking_attempts!(), ")",
                    ))
                    .bind(job_id)
                    .bind(lease_owner)
                    .bind(reason)
                    .bind(at),
                    event::NEEDS_REVIEW,
                    serde_json::json!({ "reason": reason }),
                ),
                JobTransition::Release { next_run_at } => (
                    sqlx::query(concat!(
                        "UPDATE jobs SET next_run_at = $3, lease_owner = NULL, lease_until = NULL \
                         WHERE id = $1 AND ($2 IS NULL OR lease_owner = $2) \
                         AND state IN (", job_states_taking_attempts!(), ")",
                    ))
                    .bind(job_id)
                    .bind(lease_owner)
                    .bind(*next_run_at),
                    "",
                    serde_json::json!({}),
                ),
            };
            if transition == JobTransition::BlockOnUnknown {
                // PostgreSQL: wait for a settlement in flight (it updates the
                // job row too), so the statement below, on a fresh snapshot,
                // sees it. SQLite writes are already serialised.
                locked_job(conn, job_id).await?;
            }
            let applied = query.execute(&mut *conn).await?.rows_affected() == 1;
            if applied && !kind.is_empty() {
                insert_event(
                    conn,
                    &NewEvent {
                        job_id: job_id.to_string(),
                        attempt_id: None,
                        kind,
                        actor: lease_owner.map(|o| format!("engine:{o}")).unwrap_or_else(|| "engine".into()),
                        detail: Some(detail.to_string()),
                        at,
                    },
                )
                .await?;
            }
            Ok(applied)
        }

        pub(crate) async fn wake_job(conn: &mut $conn, job_id: &str, at: Millis) -> Result<(), StoreError> {
            sqlx::query(concat!(
                "UPDATE jobs SET next_run_at = $2, updated_at = $2 \
                 WHERE id = $1 AND next_run_at IS NULL AND state IN (",
                job_states_taking_attempts!(),
                ")"
            ))
            .bind(job_id)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        pub(crate) async fn list_unknown_attempts(
            conn: &mut $conn,
            after: Option<(Millis, &str)>,
            limit: i64,
        ) -> Result<Vec<Attempt>, StoreError> {
            let (after_at, after_id) = after.unwrap_or((Millis::MIN, ""));
            let rows: Vec<AttemptRow> = sqlx::query_as(concat!(
                "SELECT ",
                attempt_columns!(),
                " FROM attempts WHERE state = ",
                attempt_state_awaiting_settlement!(),
                " AND (started_at > $1 OR (started_at = $1 AND id > $2))",
                " ORDER BY started_at, id LIMIT $3"
            ))
            .bind(after_at)
            .bind(after_id)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
            rows.into_iter().map(Attempt::try_from).collect()
        }

        pub(crate) async fn list_stale_started(
            conn: &mut $conn,
            started_before: Millis,
            limit: i64,
        ) -> Result<Vec<Attempt>, StoreError> {
            let rows: Vec<AttemptRow> = sqlx::query_as(concat!(
                "SELECT ",
                attempt_columns!(),
                " FROM attempts WHERE state = 'started' AND started_at < $1 ORDER BY started_at LIMIT $2"
            ))
            .bind(started_before)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
            rows.into_iter().map(Attempt::try_from).collect()
        }

        async fn locked_job(conn: &mut $conn, job_id: &str) -> Result<Option<Job>, StoreError> {
            let row: Option<JobRow> =
                sqlx::query_as(concat!("SELECT ", job_columns!(), " FROM jobs WHERE id = $1", $for_update))
                    .bind(job_id)
                    .fetch_optional(&mut *conn)
                    .await?;
            row.map(Job::try_from).transpose()
        }

        async fn live_attempts(conn: &mut $conn, job_id: &str) -> Result<i64, StoreError> {
            let (n,): (i64,) =
                sqlx::query_as(concat!(
                    "SELECT COUNT(*) FROM attempts WHERE job_id = $1 AND state IN (",
                    attempt_states_live!(),
                    ")"
                ))
                    .bind(job_id)
                    .fetch_one(&mut *conn)
                    .await?;
            Ok(n)
        }

        async fn decision_event(
            conn: &mut $conn,
            job_id: &str,
            attempt_id: Option<&str>,
            kind: &'static str,
            actor: &str,
            detail: serde_json::Value,
            at: Millis,
        ) -> Result<(), StoreError> {
            insert_event(
                conn,
                &NewEvent {
                    job_id: job_id.to_string(),
                    attempt_id: attempt_id.map(str::to_string),
                    kind,
                    actor: actor.to_string(),
                    detail: Some(detail.to_string()),
                    at,
                },
            )
            .await
        }

        /// Start a fresh retry budget now: the job is `pending` and runnable.
        async fn restart(conn: &mut $conn, job_id: &str, at: Millis) -> Result<(), StoreError> {
            sqlx::query(
                "UPDATE jobs SET state = 'pending', next_run_at = $2, budget_start = attempt_count, \
                 lease_owner = NULL, lease_until = NULL, updated_at = $2 WHERE id = $1",
            )
            .bind(job_id)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            Ok(())
        }

        async fn reload(conn: &mut $conn, job_id: &str) -> Result<Job, StoreError> {
            get_job(conn, job_id).await?.ok_or(StoreError::NotFound("job"))
        }

        pub(crate) async fn cancel_job(
            conn: &mut $conn,
            job_id: &str,
            actor: &str,
            reason: &str,
            at: Millis,
        ) -> Result<Result<Job, Refusal>, StoreError> {
            let Some(job) = locked_job(conn, job_id).await? else { return Ok(Err(Refusal::NotFound)) };
            if !job.state.accepts_cancel() {
                return Ok(Err(Refusal::Finished(job.state.as_str())));
            }
            // The version bump makes every in-flight attempt's CAS fail.
            sqlx::query(
                "UPDATE jobs SET state = 'cancelled', version = version + 1, next_run_at = NULL, \
                 lease_owner = NULL, lease_until = NULL, updated_at = $2 WHERE id = $1",
            )
            .bind(job_id)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            decision_event(conn, job_id, None, event::CANCELLED, actor, serde_json::json!({ "reason": reason }), at)
                .await?;
            Ok(Ok(reload(conn, job_id).await?))
        }

        pub(crate) async fn request_retry(
            conn: &mut $conn,
            job_id: &str,
            actor: &str,
            at: Millis,
        ) -> Result<Result<Job, Refusal>, StoreError> {
            let Some(job) = locked_job(conn, job_id).await? else { return Ok(Err(Refusal::NotFound)) };
            if !job.state.accepts_retry() {
                return Ok(Err(Refusal::Finished(job.state.as_str())));
            }
            if live_attempts(conn, job_id).await? > 0 {
                return Ok(Err(Refusal::OutcomeUnknown));
            }
            restart(conn, job_id, at).await?;
            decision_event(conn, job_id, None, event::RETRY_REQUESTED, actor, serde_json::json!({}), at).await?;
            Ok(Ok(reload(conn, job_id).await?))
        }

        pub(crate) async fn resolve_job(
            conn: &mut $conn,
            job_id: &str,
            resolution: JobResolution,
            actor: &str,
            reason: &str,
            at: Millis,
        ) -> Result<Result<Job, Refusal>, StoreError> {
            let Some(job) = locked_job(conn, job_id).await? else { return Ok(Err(Refusal::NotFound)) };
            if !job.state.accepts_retry() {
                return Ok(Err(Refusal::Finished(job.state.as_str())));
            }
            let action = match &resolution {
                JobResolution::Complete { result } => {
                    sqlx::query(
                        "UPDATE jobs SET state = 'succeeded', result = $2, completed_by = $3, version = version + 1, \
                         next_run_at = NULL, lease_owner = NULL, lease_until = NULL, updated_at = $4 \
                         WHERE id = $1 AND completed_by IS NULL",
                    )
                    .bind(job_id)
                    .bind(result)
                    .bind(format!("resolution:{actor}"))
                    .bind(at)
                    .execute(&mut *conn)
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
                    sqlx::query(
                        "UPDATE jobs SET state = 'cancelled', version = version + 1, next_run_at = NULL, \
                         lease_owner = NULL, lease_until = NULL, updated_at = $2 WHERE id = $1",
                    )
                    .bind(job_id)
                    .bind(at)
                    .execute(&mut *conn)
                    .await?;
                    "close"
                }
            };
            let detail = serde_json::json!({ "action": action, "reason": reason, "from_state": job.state.as_str() });
            decision_event(conn, job_id, None, event::RESOLVED, actor, detail, at).await?;
            Ok(Ok(reload(conn, job_id).await?))
        }

        pub(crate) async fn resolve_attempt(
            conn: &mut $conn,
            attempt_id: &str,
            resolution: AttemptResolution,
            actor: &str,
            reason: &str,
            at: Millis,
        ) -> Result<Result<Job, Refusal>, StoreError> {
            let row: Option<(String, String)> =
                sqlx::query_as(concat!("SELECT job_id, state FROM attempts WHERE id = $1", $for_update))
                    .bind(attempt_id)
                    .fetch_optional(&mut *conn)
                    .await?;
            let Some((job_id, state)) = row else { return Ok(Err(Refusal::NotFound)) };
            let state = crate::store::parse_attempt_state(&state)?;
            if state != AttemptState::Unknown {
                return Ok(Err(Refusal::NotUnknown(state.as_str())));
            }
            let action = match resolution {
                AttemptResolution::Executed { result } => {
                    let finish = FinishAttempt {
                        attempt_id: attempt_id.to_string(),
                        outcome: AttemptOutcome::succeeded(result),
                        at,
                        actor: actor.to_string(),
                    };
                    finish_attempt(conn, finish).await?;
                    "executed"
                }
                AttemptResolution::NotExecuted => {
                    sqlx::query("UPDATE attempts SET state = 'cancelled', finished_at = $2 WHERE id = $1")
                        .bind(attempt_id)
                        .bind(at)
                        .execute(&mut *conn)
                        .await?;
                    "not_executed"
                }
            };
            let detail = serde_json::json!({ "action": action, "reason": reason });
            decision_event(conn, &job_id, Some(attempt_id), event::ATTEMPT_RESOLVED, actor, detail, at).await?;
            // A human said it never ran: once nothing else is live, the job may go again.
            if action == "not_executed" {
                let job = reload(conn, &job_id).await?;
                if !job.state.is_final() && live_attempts(conn, &job_id).await? == 0
                {
                    restart(conn, &job_id, at).await?;
                }
            }
            Ok(Ok(reload(conn, &job_id).await?))
        }

        pub(crate) async fn list_review(conn: &mut $conn, limit: i64) -> Result<Vec<ReviewItem>, StoreError> {
            // One statement: each item's last attempt time comes from a
            // subquery over the attempts' (job_id, seq) index, not a round
            // trip per item (200 round trips took 550 ms on PostgreSQL).
            let rows: Vec<crate::store::rows::ReviewRow> = sqlx::query_as(concat!(
                "SELECT ",
                job_columns!(),
                ", (SELECT MAX(a.started_at) FROM attempts a WHERE a.job_id = jobs.id) AS last_attempt_at",
                " FROM jobs WHERE state = ",
                job_state_awaiting_decision!(),
                " ORDER BY updated_at LIMIT $1"
            ))
            .bind(limit)
            .fetch_all(&mut *conn)
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

        pub(crate) async fn set_provider_enabled(
            conn: &mut $conn,
            name: &str,
            enabled: bool,
            actor: &str,
            reason: &str,
            at: Millis,
        ) -> Result<(), StoreError> {
            sqlx::query(
                "INSERT INTO provider_states (name, enabled, changed_by, reason, changed_at) \
                 VALUES ($1, $2, $3, $4, $5) \
                 ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, changed_by = excluded.changed_by, \
                 reason = excluded.reason, changed_at = excluded.changed_at",
            )
            .bind(name)
            .bind(enabled)
            .bind(actor)
            .bind(reason)
            .bind(at)
            .execute(&mut *conn)
            .await?;
            sqlx::query("INSERT INTO provider_audit (name, enabled, actor, reason, at) VALUES ($1, $2, $3, $4, $5)")
                .bind(name)
                .bind(enabled)
                .bind(actor)
                .bind(reason)
                .bind(at)
                .execute(&mut *conn)
                .await?;
            Ok(())
        }

        pub(crate) async fn provider_switches(conn: &mut $conn) -> Result<Vec<ProviderSwitch>, StoreError> {
            let rows: Vec<(String, bool, String, String, i64)> = sqlx::query_as(
                "SELECT name, enabled, changed_by, reason, changed_at FROM provider_states ORDER BY name",
            )
            .fetch_all(&mut *conn)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(name, enabled, changed_by, reason, changed_at)| ProviderSwitch {
                    name,
                    enabled,
                    changed_by,
                    reason,
                    changed_at,
                })
                .collect())
        }

        pub(crate) async fn provider_audit(
            conn: &mut $conn,
            name: Option<&str>,
            limit: i64,
        ) -> Result<Vec<crate::store::ProviderAuditEntry>, StoreError> {
            // `id` breaks ties between changes made in the same millisecond.
            let rows: Vec<(i64, String, bool, String, String, i64)> = sqlx::query_as(
                "SELECT id, name, enabled, actor, reason, at FROM provider_audit \
                 WHERE ($1 IS NULL OR name = $1) ORDER BY at DESC, id DESC LIMIT $2",
            )
            .bind(name)
            .bind(limit)
            .fetch_all(&mut *conn)
            .await?;
            Ok(rows
                .into_iter()
                .map(|(id, name, enabled, actor, reason, at)| crate::store::ProviderAuditEntry { id, name, enabled, actor, reason, at })
                .collect())
        }
    };
}

pub(crate) use lifecycle_ops;
