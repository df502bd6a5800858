//! The jobs API: create (idempotently), read, list attempts.

use super::door;
use super::error::ApiError;
use super::views::{AttemptView, JobView};
use super::AppState;
use crate::domain::JobId;
use crate::engine::Until;
use crate::jobs;
use crate::keys::Caller;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::time::Duration;

/// Moved to the pipeline every door shares; named here for the endpoints
/// that read a body.
pub use super::door::LimitedBody;

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    LimitedBody(body): LimitedBody,
) -> Result<Response, ApiError> {
    let mut arrival = door::arrive(&state, caller, &headers)?;
    let body = door::JobBody::Bytes(&body);
    arrival.key_body(&state, &body).await?;
    let mut submission = door::submit(&state, &arrival, &body).await?;
    let status = if submission.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let wait = door::preferred_wait(&headers);
    // A finished job (most replays) is answered as read: nothing to wait for.
    let job = match wait {
        Some(secs) => {
            let wait = Duration::from_secs(secs);
            door::wait_final(&state, &mut submission, wait, Until::Actionable).await
        }
        None => submission.job,
    };
    let mut response = (status, Json(JobView::new(job))).into_response();
    if submission.replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if arrival.key.echoed {
        // `[server] idempotency = "optional"` or `"fingerprint"`: the key
        // this call ran under, so the client can replay it.
        let key = HeaderValue::from_str(arrival.key.key.as_str())
            .map_err(|e| ApiError::Internal(e.into()))?;
        response.headers_mut().insert("idempotency-key", key);
    }
    if let Some(secs) = wait {
        if let Ok(value) = HeaderValue::from_str(&format!("wait={secs}")) {
            response.headers_mut().insert("preference-applied", value);
        }
    }
    Ok(response)
}

pub async fn show(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<JobId>,
) -> Result<Json<JobView>, ApiError> {
    let job = jobs::find_for(state.store.as_ref(), &caller, &id)
        .await?
        .ok_or(ApiError::NotFound("job"))?;
    Ok(Json(JobView::new(job)))
}

pub async fn attempts(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<JobId>,
) -> Result<Json<serde_json::Value>, ApiError> {
    let job = jobs::find_for(state.store.as_ref(), &caller, &id)
        .await?
        .ok_or(ApiError::NotFound("job"))?;
    let attempts: Vec<AttemptView> = state
        .store
        .list_attempts(&job.id)
        .await?
        .into_iter()
        .map(Into::into)
        .collect();
    Ok(Json(
        serde_json::json!({ "job_id": job.id, "attempts": attempts }),
    ))
}
