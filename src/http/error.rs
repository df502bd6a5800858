//! One error type for every endpoint, with a stable code and status.
//! Bodies are `{"error": {"code": "...", "message": "..."}}`; a 5xx body
//! says nothing about internals (the cause is logged once, server-side).

use crate::jobs::SubmitError;
use crate::store::StoreError;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("missing or invalid API key; send Authorization: Bearer <key>")]
    Unauthorized,
    #[error("this endpoint needs an admin key")]
    Forbidden,
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("method not allowed")]
    MethodNotAllowed,
    #[error("the Idempotency-Key header is required")]
    MissingIdempotencyKey,
    #[error("{0}")]
    InvalidIdempotencyKey(String),
    #[error("{0}")]
    IdempotencyKeyReused(String),
    #[error("{0}")]
    MalformedJson(String),
    #[error("{0}")]
    InvalidRequest(String),
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    #[error("{0}")]
    AttemptOutcomeUnknown(String),
    #[error("{0}")]
    JobFinished(String),
    #[error("{0}")]
    AttemptNotUnknown(String),
    #[error("{0}")]
    KeyNotLive(String),
    #[error("the request body did not arrive within {0} ms")]
    RequestTimeout(u64),
    /// A request rate, concurrent-jobs or token-budget limit: 429 with
    /// `Retry-After` (and `retry-after-ms`) and `x-should-retry`.
    #[error(transparent)]
    Limited(#[from] crate::tenants::LimitError),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

impl ApiError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::MissingIdempotencyKey
            | ApiError::InvalidIdempotencyKey(_)
            | ApiError::MalformedJson(_) => StatusCode::BAD_REQUEST,
            ApiError::IdempotencyKeyReused(_)
            | ApiError::AttemptOutcomeUnknown(_)
            | ApiError::JobFinished(_)
            | ApiError::AttemptNotUnknown(_)
            | ApiError::KeyNotLive(_) => StatusCode::CONFLICT,
            ApiError::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::InvalidRequest(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized => "unauthorized",
            ApiError::Forbidden => "forbidden",
            ApiError::NotFound(_) => "not_found",
            ApiError::MethodNotAllowed => "method_not_allowed",
            ApiError::MissingIdempotencyKey => "missing_idempotency_key",
            ApiError::InvalidIdempotencyKey(_) => "invalid_idempotency_key",
            ApiError::IdempotencyKeyReused(_) => "idempotency_key_reused",
            ApiError::MalformedJson(_) => "malformed_json",
            ApiError::InvalidRequest(_) => "invalid_request",
            ApiError::PayloadTooLarge(_) => "payload_too_large",
            ApiError::AttemptOutcomeUnknown(_) => "attempt_outcome_unknown",
            ApiError::JobFinished(_) => "job_finished",
            ApiError::AttemptNotUnknown(_) => "attempt_not_unknown",
            ApiError::KeyNotLive(_) => "key_not_live",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::Limited(e) => e.code(),
            ApiError::Internal(_) => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status_code();
        if let ApiError::Internal(cause) = &self {
            tracing::error!(error = format!("{cause:#}"), "request failed");
        }
        let body =
            serde_json::json!({ "error": { "code": self.code(), "message": self.to_string() } });
        let mut response = (status, Json(body)).into_response();
        if let ApiError::Limited(limit) = &self {
            let ms = limit.retry_after_ms();
            let headers = response.headers_mut();
            headers.insert("retry-after", HeaderValue::from(ms.div_ceil(1000).max(1)));
            headers.insert("retry-after-ms", HeaderValue::from(ms));
            headers.insert(
                "x-should-retry",
                HeaderValue::from_static(if limit.should_retry() {
                    "true"
                } else {
                    "false"
                }),
            );
        }
        if status.is_client_error() && status != StatusCode::TOO_MANY_REQUESTS {
            // OpenAI/Anthropic SDKs retry 409 (and others) unless told not to;
            // a client error will not change by itself.
            response
                .headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
        }
        response
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::Internal(e.into())
    }
}

impl From<crate::store::Refusal> for ApiError {
    fn from(r: crate::store::Refusal) -> Self {
        use crate::store::Refusal;
        match r {
            Refusal::NotFound => ApiError::NotFound("job"),
            Refusal::Finished(_) => ApiError::JobFinished(r.to_string()),
            Refusal::OutcomeUnknown => ApiError::AttemptOutcomeUnknown(
                "an attempt of this job is started or its outcome is unknown; no retry may start until it is settled"
                    .to_string(),
            ),
            Refusal::NotUnknown(_) => ApiError::AttemptNotUnknown(r.to_string()),
        }
    }
}

impl From<SubmitError> for ApiError {
    fn from(e: SubmitError) -> Self {
        use crate::domain::RequestError;
        match e {
            SubmitError::Request(RequestError::Malformed(m)) => {
                ApiError::MalformedJson(format!("body is not valid JSON: {m}"))
            }
            SubmitError::Request(RequestError::Invalid(m)) => ApiError::InvalidRequest(m),
            e @ SubmitError::KeyReused { .. } => ApiError::IdempotencyKeyReused(e.to_string()),
            SubmitError::Store(e) => e.into(),
            SubmitError::Limited(e) => ApiError::Limited(e),
        }
    }
}
