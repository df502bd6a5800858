//! The jobs API: create (idempotently), read, list attempts.

use super::error::ApiError;
use super::views::{AttemptView, JobView};
use super::AppState;
use crate::domain::request::IdempotencyKey;
use crate::jobs;
use crate::keys::Caller;
use crate::metrics::Metrics;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::time::Duration;

/// The raw request body, with the size limit answered as a JSON 413.
pub struct LimitedBody(pub Bytes);

impl FromRequest<AppState> for LimitedBody {
    type Rejection = ApiError;

    async fn from_request(req: Request<Body>, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config.max_body_bytes;
        let timeout = state.config.body_read_timeout;
        // A client that trickles its body is cut off (slowloris).
        let read = tokio::time::timeout(timeout, Bytes::from_request(req, state))
            .await
            .map_err(|_| ApiError::RequestTimeout(timeout.as_millis() as u64))?;
        match read {
            Ok(bytes) => Ok(LimitedBody(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge(limit))
            }
            Err(rejection) => Err(ApiError::MalformedJson(rejection.body_text())),
        }
    }
}

pub(crate) fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let raw = headers
        .get("idempotency-key")
        .ok_or(ApiError::MissingIdempotencyKey)?;
    IdempotencyKey::parse(raw.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)
}

/// `Prefer: wait=N` (RFC 7240): hold the answer up to N seconds (at most
/// `MAX_WAIT_SECS`) for the job to reach a final state.
pub(crate) fn preferred_wait(headers: &HeaderMap) -> Option<u64> {
    headers
        .get_all("prefer")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split([',', ';']))
        .find_map(|pref| {
            pref.trim()
                .strip_prefix("wait=")?
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map(|n| n.min(MAX_WAIT_SECS))
}

pub const MAX_WAIT_SECS: u64 = 300;

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    LimitedBody(body): LimitedBody,
) -> Result<Response, ApiError> {
    let (key, made_here) = super::openai_compat::key_for(&state, &headers)?;
    let admission = state.tenants.admit(&caller)?;
    let submitted = jobs::submit(
        &state.store,
        state.clock.as_ref(),
        &state.config.routes,
        &caller,
        &key,
        &body,
        state.engine.as_ref(),
        &admission,
        &state.replays,
    )
    .await;
    let submission = match submitted {
        Ok(s) => s,
        Err(e) => {
            if matches!(e, jobs::SubmitError::KeyReused { .. }) {
                Metrics::inc(&state.metrics.idempotency_conflicts);
            }
            return Err(e.into());
        }
    };
    Metrics::inc(if submission.replayed {
        &state.metrics.jobs_replayed
    } else {
        &state.metrics.jobs_created
    });
    if submission.from_memory {
        Metrics::inc(&state.metrics.replays_from_memory);
    }
    let status = if submission.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut job = submission.job;
    let wait = preferred_wait(&headers);
    // A finished job (most replays) is answered as read: nothing to wait for.
    if let (Some(secs), Some(engine), false) = (wait, &state.engine, job.state.is_final()) {
        if let Some(settled) = engine.wait_for(&job.id, Duration::from_secs(secs)).await {
            job = settled;
            // Its next replay is answered from memory.
            state
                .replays
                .finished
                .remember(&job, Some(submission.body_digest));
        }
    }
    let mut response = (status, Json(JobView::new(job))).into_response();
    if submission.replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    if made_here {
        // `[server] idempotency = "optional"`: the key made for this call, so
        // the client can replay it.
        let key = HeaderValue::from_str(key.as_str()).map_err(|e| ApiError::Internal(e.into()))?;
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
    Path(id): Path<String>,
) -> Result<Json<JobView>, ApiError> {
    let job = jobs::find_for(state.store.as_ref(), &caller, &id)
        .await?
        .ok_or(ApiError::NotFound("job"))?;
    Ok(Json(JobView::new(job)))
}

pub async fn attempts(
    State(state): State<AppState>,
    caller: Caller,
    Path(id): Path<String>,
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
