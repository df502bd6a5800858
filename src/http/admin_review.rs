//! The review queue and the decisions an admin makes on it. Every decision
//! is written to the job's event log with who and why.

use super::body;
use super::error::ApiError;
use super::jobs::LimitedBody;
use super::views::JobView;
use super::AppState;
use crate::clock::rfc3339;
use crate::domain::{AttemptId, Job, JobId, OwnerId};
use crate::http::auth::Admin;
use crate::jobs::{self, DecisionError};
use crate::keys::Caller;
use crate::store::{AttemptResolution, JobResolution, ReviewItem};
use axum::extract::{Path, State};
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;

#[derive(Debug, Serialize)]
pub struct ReviewView {
    pub job_id: JobId,
    /// The business key: who asked, and their idempotency key.
    pub owner: OwnerId,
    pub idempotency_key: String,
    pub route: String,
    pub last_error: Option<String>,
    pub attempt_count: i64,
    pub last_attempt_at: Option<String>,
    pub in_review_since: String,
}

impl From<ReviewItem> for ReviewView {
    fn from(item: ReviewItem) -> Self {
        ReviewView {
            job_id: item.job.id,
            owner: item.job.owner_id,
            idempotency_key: item.job.idempotency_key,
            route: item.job.route,
            last_error: item.job.last_error,
            attempt_count: item.job.attempt_count,
            last_attempt_at: item.last_attempt_at.map(rfc3339),
            in_review_since: rfc3339(item.job.updated_at),
        }
    }
}

pub async fn list(State(state): State<AppState>, _admin: Admin) -> Result<Json<Value>, ApiError> {
    let items: Vec<ReviewView> = state
        .store
        .list_review(500)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(Json(serde_json::json!({ "jobs": items })))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveJob {
    /// `complete`, `retry` or `close` ([`jobs::job_resolution`]).
    action: String,
    #[serde(default)]
    result: Option<Value>,
    reason: String,
}

/// `POST /v1/admin/jobs/{id}/resolve`: `complete` (with `result`), `retry`
/// (a fresh retry budget, refused while an attempt is live) or `close`.
pub async fn resolve_job(
    State(state): State<AppState>,
    Admin(admin): Admin,
    Path(id): Path<JobId>,
    LimitedBody(raw): LimitedBody,
) -> Result<Json<JobView>, ApiError> {
    let request: ResolveJob = body::parse(&raw)?;
    let reason = body::reason(&request.reason)?;
    let result = request.result.map(|r| r.to_string());
    let resolution = jobs::job_resolution(&request.action, result)?;
    let job = decide_job(&state, &admin, &id, resolution, reason).await?;
    Ok(Json(JobView::new(job)))
}

/// An admin's decision on a job, audited in its event log as `admin:OWNER`
/// with `reason` (already checked): the API and the console both call this.
pub async fn decide_job(
    state: &AppState,
    admin: &Caller,
    job_id: &JobId,
    resolution: JobResolution,
    reason: &str,
) -> Result<Job, ApiError> {
    let resolution =
        crate::jobs::checked_resolution(state.store.as_ref(), &state.contracts, job_id, resolution)
            .await?;
    let actor = format!("admin:{}", admin.owner_id);
    let (state, job_id, reason) = (state.clone(), job_id.clone(), reason.to_string());
    // The engine is told after the commit even if the client goes away.
    let job = crate::jobs::run_to_completion(async move {
        let now = state.clock.now_ms();
        let job = state
            .store
            .resolve_job(&job_id, resolution, &actor, &reason, now)
            .await?;
        if let (Ok(_), Some(engine)) = (&job, &state.engine) {
            engine.wake();
        }
        Ok(job)
    })
    .await??;
    Ok(job)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResolveAttempt {
    /// `executed` or `not_executed` ([`jobs::attempt_resolution`]).
    outcome: String,
    #[serde(default)]
    result: Option<Value>,
    reason: String,
}

/// `POST /v1/admin/attempts/{id}/resolve`: settle an `unknown` attempt out of
/// band. `executed` (with the provider's `result`) goes through the same
/// compare-and-swap as a live answer; `not_executed` lets the job retry.
pub async fn resolve_attempt(
    State(state): State<AppState>,
    Admin(admin): Admin,
    Path(id): Path<AttemptId>,
    LimitedBody(raw): LimitedBody,
) -> Result<Json<JobView>, ApiError> {
    let request: ResolveAttempt = body::parse(&raw)?;
    let reason = body::reason(&request.reason)?;
    let result = request.result.map(|r| r.to_string());
    let resolution = jobs::attempt_resolution(&request.outcome, result)?;
    let job = settle_attempt(&state, &admin, &id, resolution, reason).await?;
    Ok(Json(JobView::new(job)))
}

/// An admin settles an `unknown` attempt, audited like [`decide_job`]; the
/// API and the console both call this.
pub async fn settle_attempt(
    state: &AppState,
    admin: &Caller,
    attempt_id: &AttemptId,
    resolution: AttemptResolution,
    reason: &str,
) -> Result<Job, ApiError> {
    let resolution = crate::jobs::checked_attempt_resolution(
        state.store.as_ref(),
        &state.contracts,
        attempt_id,
        resolution,
    )
    .await?;
    let actor = format!("admin:{}", admin.owner_id);
    let (state, attempt_id, reason) = (state.clone(), attempt_id.clone(), reason.to_string());
    // The engine is told after the commit even if the client goes away.
    let job = crate::jobs::run_to_completion(async move {
        let now = state.clock.now_ms();
        let job = state
            .store
            .resolve_attempt(&attempt_id, resolution, &actor, &reason, now)
            .await?;
        if let (Ok(_), Some(engine)) = (&job, &state.engine) {
            engine.wake();
        }
        Ok(job)
    })
    .await?
    .map_err(|r| match r {
        crate::store::Refusal::NotFound => ApiError::NotFound("attempt"),
        other => other.into(),
    })?;
    Ok(job)
}

/// A decision in words the API does not take: a 422 `invalid_request`
/// naming the field.
impl From<DecisionError> for ApiError {
    fn from(e: DecisionError) -> Self {
        ApiError::InvalidRequest(e.to_string())
    }
}
