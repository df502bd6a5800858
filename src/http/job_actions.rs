//! What an owner may do to a job after creating it: ask for a retry, cancel.

use super::body;
use super::error::ApiError;
use super::jobs::LimitedBody;
use super::views::JobView;
use super::AppState;
use crate::domain::JobId;
use crate::jobs;
use crate::keys::Caller;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;

/// `POST /v1/jobs/{id}/retry`: another attempt now. Refused with 409
/// `attempt_outcome_unknown` while an attempt is started or unknown (the
/// provider may still be working), and 409 `job_finished` once it succeeded.
pub async fn retry(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<JobId>,
) -> Result<Json<JobView>, ApiError> {
    jobs::find_for(state.store.as_ref(), &caller, &id)
        .await?
        .ok_or(ApiError::NotFound("job"))?;
    // The engine is told after the commit even if the client goes away.
    let job = jobs::run_to_completion({
        let state = state.clone();
        async move {
            let job = state
                .store
                .request_retry(&id, &caller.owner_id, state.clock.now_ms())
                .await?;
            if let (Ok(_), Some(engine)) = (&job, &state.engine) {
                engine.wake();
            }
            Ok(job)
        }
    })
    .await??;
    Ok(Json(JobView::new(job)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    #[serde(default)]
    reason: Option<String>,
}

/// `POST /v1/jobs/{id}/cancel`: no more attempts; the version bump makes any
/// in-flight attempt's late result lose its compare-and-swap.
pub async fn cancel(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<JobId>,
    LimitedBody(raw): LimitedBody,
) -> Result<Json<JobView>, ApiError> {
    let request: CancelBody = body::parse_or_default(&raw)?;
    jobs::find_for(state.store.as_ref(), &caller, &id)
        .await?
        .ok_or(ApiError::NotFound("job"))?;
    // Optional, but when given it is a reason like any other (1–500
    // characters): it goes into the job's event log and the console.
    let reason = match &request.reason {
        Some(given) => body::reason(given)?.to_string(),
        None => "cancelled by owner".to_string(),
    };
    let job = state
        .store
        .cancel_job(&id, &caller.owner_id, &reason, state.clock.now_ms())
        .await??;
    Ok(Json(JobView::new(job)))
}
