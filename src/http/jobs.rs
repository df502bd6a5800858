//! The jobs API: create (idempotently), read, list attempts.

use super::error::ApiError;
use super::views::{AttemptView, JobView};
use super::AppState;
use crate::domain::request::IdempotencyKey;
use crate::jobs;
use crate::keys::Caller;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The raw request body, with the size limit answered as a JSON 413.
pub struct LimitedBody(pub Bytes);

impl FromRequest<AppState> for LimitedBody {
    type Rejection = ApiError;

    async fn from_request(req: Request<Body>, state: &AppState) -> Result<Self, Self::Rejection> {
        let limit = state.config.max_body_bytes;
        match Bytes::from_request(req, state).await {
            Ok(bytes) => Ok(LimitedBody(bytes)),
            Err(rejection) if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE => {
                Err(ApiError::PayloadTooLarge(limit))
            }
            Err(rejection) => Err(ApiError::MalformedJson(rejection.body_text())),
        }
    }
}

fn idempotency_key(headers: &HeaderMap) -> Result<IdempotencyKey, ApiError> {
    let raw = headers
        .get("idempotency-key")
        .ok_or(ApiError::MissingIdempotencyKey)?;
    IdempotencyKey::parse(raw.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)
}

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    LimitedBody(body): LimitedBody,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let submission = jobs::submit(
        state.store.as_ref(),
        state.clock.as_ref(),
        &state.config.routes,
        &caller,
        &key,
        &body,
    )
    .await?;
    let status = if submission.replayed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let mut response = (status, Json(JobView::new(submission.job, None))).into_response();
    if submission.replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
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
    let attempts = state.store.list_attempts(&job.id).await?;
    Ok(Json(JobView::new(job, Some(&attempts))))
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
