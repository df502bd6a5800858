//! One error type for every endpoint, with a stable code and status.
//! Bodies are `{"error": {"code": "...", "message": "..."}}`; a 5xx body
//! says nothing about internals (the cause is logged once, server-side).

use crate::jobs::SubmitError;
use crate::store::StoreError;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The header a request's key came in, which a refusal names: the
/// caller's SDK sends its key the one way it knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader {
    /// No key at all.
    Missing,
    /// `Authorization: Bearer <key>` (OpenAI's SDKs, onejob's own clients).
    Bearer,
    /// `x-api-key: <key>` (Anthropic's SDKs).
    XApiKey,
}

impl KeyHeader {
    /// Why a key was refused, naming the header it came in (onejob's
    /// words, on every door in onejob's or OpenAI's shape).
    pub fn refusal(self) -> &'static str {
        match self {
            KeyHeader::Missing => "missing API key; send Authorization: Bearer <key>",
            KeyHeader::Bearer => {
                "invalid API key in the Authorization header (unknown, revoked or expired)"
            }
            KeyHeader::XApiKey => {
                "invalid API key in the x-api-key header (unknown, revoked or expired)"
            }
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No key, or one that is unknown, revoked or expired: the message
    /// names the header the key came in.
    #[error("{}", .0.refusal())]
    Unauthorized(KeyHeader),
    #[error("this endpoint needs an admin key")]
    Forbidden,
    /// A non-admin key asked for another owner's data (`?owner=`).
    #[error("{0}")]
    OtherOwner(String),
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
    /// A redelivery of a webhook delivery that is still being retried.
    #[error("{0}")]
    DeliveryPending(String),
    /// A webhook endpoint for a URL its owner has registered already.
    #[error("{0}")]
    EndpointExists(String),
    /// Webhooks need a key to store their secrets encrypted; none is set.
    #[error("{0}")]
    WebhooksNotConfigured(String),
    #[error("the request body did not arrive within {0} ms")]
    RequestTimeout(u64),
    /// A request rate, concurrent-jobs or token-budget limit: 429 with
    /// `Retry-After` (and `retry-after-ms`) and `x-should-retry`.
    #[error(transparent)]
    Limited(#[from] crate::tenants::LimitError),
    /// The database could not be reached or gave up the transaction; the
    /// same request may succeed shortly: 503 with `Retry-After` and
    /// `x-should-retry: true`. Nothing was committed for the caller to
    /// lose: a retry with the same Idempotency-Key finds what was.
    #[error("the job store is unavailable for a moment; retry shortly")]
    StoreUnavailable(#[source] StoreError),
    #[error("internal error")]
    Internal(#[source] anyhow::Error),
}

/// What a client is told to wait before retrying a `503 store_unavailable`.
pub const STORE_RETRY_AFTER_SECS: u32 = 1;

impl ApiError {
    pub fn status_code(&self) -> StatusCode {
        match self {
            ApiError::Unauthorized(_) => StatusCode::UNAUTHORIZED,
            ApiError::Forbidden | ApiError::OtherOwner(_) => StatusCode::FORBIDDEN,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ApiError::MissingIdempotencyKey
            | ApiError::InvalidIdempotencyKey(_)
            | ApiError::MalformedJson(_) => StatusCode::BAD_REQUEST,
            ApiError::IdempotencyKeyReused(_)
            | ApiError::AttemptOutcomeUnknown(_)
            | ApiError::JobFinished(_)
            | ApiError::AttemptNotUnknown(_)
            | ApiError::KeyNotLive(_)
            | ApiError::DeliveryPending(_)
            | ApiError::EndpointExists(_) => StatusCode::CONFLICT,
            ApiError::WebhooksNotConfigured(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Limited(_) => StatusCode::TOO_MANY_REQUESTS,
            ApiError::RequestTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            ApiError::InvalidRequest(_) => StatusCode::UNPROCESSABLE_ENTITY,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn code(&self) -> &'static str {
        match self {
            ApiError::Unauthorized(_) => "unauthorized",
            ApiError::Forbidden | ApiError::OtherOwner(_) => "forbidden",
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
            ApiError::DeliveryPending(_) => "delivery_pending",
            ApiError::EndpointExists(_) => "endpoint_exists",
            ApiError::WebhooksNotConfigured(_) => "webhooks_not_configured",
            ApiError::RequestTimeout(_) => "request_timeout",
            ApiError::Limited(e) => e.code(),
            ApiError::StoreUnavailable(_) => "store_unavailable",
            ApiError::Internal(_) => "internal",
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.status_code();
        match &self {
            ApiError::Internal(cause) => {
                tracing::error!(error = format!("{cause:#}"), "request failed")
            }
            ApiError::StoreUnavailable(cause) => {
                tracing::warn!(error = %cause, "store unavailable; the client is told to retry")
            }
            _ => {}
        }
        let body =
            serde_json::json!({ "error": { "code": self.code(), "message": self.to_string() } });
        let mut response = (status, Json(body)).into_response();
        response
            .extensions_mut()
            .insert(super::refusals::ErrorCode(self.code().to_string()));
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
        if let ApiError::StoreUnavailable(_) = &self {
            let headers = response.headers_mut();
            headers.insert("retry-after", HeaderValue::from(STORE_RETRY_AFTER_SECS));
            headers.insert(
                "retry-after-ms",
                HeaderValue::from(u64::from(STORE_RETRY_AFTER_SECS) * 1000),
            );
            headers.insert("x-should-retry", HeaderValue::from_static("true"));
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

/// A store error is transient until proven otherwise: only one that says
/// the data or the code is wrong (a corrupt row, a refused transition) is an
/// internal error.
impl From<crate::jobs::ResolutionError> for ApiError {
    fn from(e: crate::jobs::ResolutionError) -> Self {
        match e {
            crate::jobs::ResolutionError::Store(e) => e.into(),
            e @ crate::jobs::ResolutionError::Result(_) => ApiError::InvalidRequest(e.to_string()),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if e.is_transient() {
            ApiError::StoreUnavailable(e)
        } else {
            ApiError::Internal(e.into())
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_transient_store_error_is_503_and_a_corrupt_row_is_500() {
        let blip = ApiError::from(crate::store::faulty::injected_error());
        assert_eq!(blip.status_code(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(blip.code(), "store_unavailable");
        let response = blip.into_response();
        assert_eq!(response.headers()["x-should-retry"], "true");
        assert_eq!(response.headers()["retry-after"], "1");

        let bug = ApiError::from(StoreError::Corrupt("job state \"?\"".to_string()));
        assert_eq!(bug.status_code(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(bug.code(), "internal");
        let closing = ApiError::from(StoreError::Closed);
        assert_eq!(closing.status_code(), StatusCode::INTERNAL_SERVER_ERROR);
    }
}
