//! Errors in Anthropic's shape: `{"type": "error", "error": {"type",
//! "message"}}` with Anthropic's types and statuses, and
//! `x-should-retry` always set (the SDK retries 409, 429 and 5xx unless
//! told not to).

use crate::domain::ErrorKind;
use crate::http::door::Refusal;
use crate::http::error::KeyHeader;
use crate::http::error::{ApiError, STORE_RETRY_AFTER_SECS};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error in Anthropic's shape.
#[derive(Debug)]
pub struct AnthropicError {
    pub(super) status: StatusCode,
    /// Anthropic's error `type`.
    pub(super) kind: &'static str,
    pub(super) message: String,
    pub(super) retry: bool,
    pub(super) retry_after_ms: Option<u64>,
}

impl AnthropicError {
    /// A request onejob refuses: 400 `invalid_request_error`, the message
    /// naming the field.
    pub(super) fn invalid(field: &str, why: impl std::fmt::Display) -> Self {
        AnthropicError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("{field}: {why}"),
        )
    }

    pub(super) fn new(status: StatusCode, kind: &'static str, message: String) -> Self {
        AnthropicError {
            status,
            kind,
            message,
            retry: false,
            retry_after_ms: None,
        }
    }

    /// A refused submission: an unknown route is an unknown `model`.
    pub(super) fn submit(e: ApiError) -> Self {
        match e {
            ApiError::InvalidRequest(m) if m.starts_with("route:") => AnthropicError::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                m.replacen("route:", "model:", 1),
            ),
            e => e.into(),
        }
    }
}

/// The status and Anthropic error `type` a job without an answer is told
/// with, answered or in a stream: a refusal by the provider is the
/// request's fault (`invalid_request_error`), an overloaded provider is
/// Anthropic's 529. `last_failure` is the kind of the job's last failed
/// attempt, when known: a job in review keeps no kind in its refusal but
/// the request's faults, and one whose retries ran out on an overloaded
/// provider is that provider's overload too (told `x-should-retry: true`
/// as every job in review: it may still be settled).
pub(super) fn refusal_type(
    why: &Refusal,
    last_failure: Option<&ErrorKind>,
) -> (StatusCode, &'static str) {
    let overloaded = last_failure == Some(&ErrorKind::Overloaded);
    let (status, kind) = match why {
        Refusal::NeedsReview if overloaded => (529, "overloaded_error"),
        Refusal::Pending => (504, "timeout_error"),
        Refusal::Cancelled => (409, "invalid_request_error"),
        Refusal::ContextLengthExceeded | Refusal::ContentPolicy | Refusal::BadRequest(_) => {
            (400, "invalid_request_error")
        }
        Refusal::RateLimited => (429, "rate_limit_error"),
        Refusal::Failed(Some(ErrorKind::Overloaded)) => (529, "overloaded_error"),
        Refusal::ContractViolation | Refusal::NeedsReview | Refusal::Failed(_) => {
            (500, "api_error")
        }
    };
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
        kind,
    )
}

/// The refusal an in-band stream error `code` tells: a job's own codes as
/// the answer tells them (a cancelled job is Anthropic's 409, one still
/// pending its 504, one in review by its last failure), a provider's kind
/// by [`Refusal::of_stream_code`].
pub(super) fn stream_refusal(code: &str) -> Refusal {
    match code {
        "job_cancelled" => Refusal::Cancelled,
        "job_pending" => Refusal::Pending,
        "job_needs_review" => Refusal::NeedsReview,
        _ => Refusal::of_stream_code(code),
    }
}

/// A missing or unknown key in Anthropic's words for the header it came
/// in (its SDKs send `x-api-key`; `Authorization: Bearer` is read first
/// when both are sent, [`crate::http::auth::presented_key`]).
fn unauthorized(header: KeyHeader) -> &'static str {
    match header {
        KeyHeader::Missing => "x-api-key header is required",
        KeyHeader::XApiKey => "invalid x-api-key",
        KeyHeader::Bearer => "invalid bearer token in the Authorization header",
    }
}

/// Our field names in a validation message, as Anthropic's request names them.
fn anthropic_fields(message: String) -> String {
    let Some((field, why)) = message.split_once(": ") else {
        return message;
    };
    let field = match field {
        "params.stop" => "stop_sequences",
        "params.user" => "metadata.user_id",
        other => other.strip_prefix("params.").unwrap_or(other),
    };
    format!("{field}: {why}")
}

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        use ApiError as E;
        let (status, kind) = match &e {
            E::Unauthorized(_) => (StatusCode::UNAUTHORIZED, "authentication_error"),
            E::Forbidden | E::OtherOwner(_) => (StatusCode::FORBIDDEN, "permission_error"),
            E::NotFound(_) => (StatusCode::NOT_FOUND, "not_found_error"),
            E::PayloadTooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "request_too_large"),
            E::Limited(_) => (StatusCode::TOO_MANY_REQUESTS, "rate_limit_error"),
            // Anthropic's "try again shortly": the SDK retries a 529.
            E::StoreUnavailable(_) => (
                StatusCode::from_u16(529).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                "overloaded_error",
            ),
            E::Internal(_) => (StatusCode::INTERNAL_SERVER_ERROR, "api_error"),
            E::WebhooksNotConfigured(_) => (e.status_code(), "api_error"),
            // A key reused with another body keeps its 409 (the SDK's
            // ConflictError); Anthropic uses this type for other 4xx.
            E::IdempotencyKeyReused(_)
            | E::AttemptOutcomeUnknown(_)
            | E::JobFinished(_)
            | E::AttemptNotUnknown(_)
            | E::KeyNotLive(_)
            | E::DeliveryPending(_)
            | E::EndpointExists(_)
            | E::MethodNotAllowed
            | E::RequestTimeout(_) => (e.status_code(), "invalid_request_error"),
            // Anthropic answers every malformed or invalid request 400.
            E::MissingIdempotencyKey
            | E::InvalidIdempotencyKey(_)
            | E::MalformedJson(_)
            | E::InvalidRequest(_) => (StatusCode::BAD_REQUEST, "invalid_request_error"),
        };
        match &e {
            E::Internal(cause) => tracing::error!(error = format!("{cause:#}"), "request failed"),
            E::StoreUnavailable(cause) => {
                tracing::warn!(error = %cause, "store unavailable; the client is told to retry")
            }
            _ => {}
        }
        let limit = match &e {
            E::Limited(l) => Some(l),
            _ => None,
        };
        let store_down = matches!(e, E::StoreUnavailable(_));
        let retry = store_down || limit.is_some_and(|l| l.should_retry());
        let retry_after_ms = match limit {
            Some(l) => Some(l.retry_after_ms()),
            None => store_down.then_some(u64::from(STORE_RETRY_AFTER_SECS) * 1000),
        };
        let message = match e {
            E::Unauthorized(header) => unauthorized(header).to_string(),
            E::InvalidRequest(m) => anthropic_fields(m),
            E::MissingIdempotencyKey => {
                "the Idempotency-Key header is required; pass one with extra_headers".to_string()
            }
            e => e.to_string(),
        };
        AnthropicError {
            status,
            kind,
            message,
            retry,
            retry_after_ms,
        }
    }
}

impl IntoResponse for AnthropicError {
    fn into_response(self) -> Response {
        let body = json!({
            "type": "error",
            "error": {"type": self.kind, "message": self.message},
        });
        let mut response = (self.status, Json(body)).into_response();
        response
            .extensions_mut()
            .insert(crate::http::refusals::ErrorCode(self.kind.to_string()));
        let retry = if self.retry { "true" } else { "false" };
        let headers = response.headers_mut();
        headers.insert("x-should-retry", HeaderValue::from_static(retry));
        if let Some(ms) = self.retry_after_ms {
            headers.insert("retry-after", HeaderValue::from(ms.div_ceil(1000).max(1)));
            headers.insert("retry-after-ms", HeaderValue::from(ms));
        }
        response
    }
}
