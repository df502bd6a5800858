//! Errors in OpenAI's shape, `{"error": {"message", "type", "param",
//! "code"}}`, with `x-should-retry` always set: what the `openai` SDKs raise
//! their typed exceptions from. Shared by the two doors that answer in it
//! (Chat Completions and Responses), each adding its own constructors.

use crate::http::door::{Refusal, Refused};
use crate::http::error::{ApiError, STORE_RETRY_AFTER_SECS};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error in OpenAI's shape. `retry`: whether the SDK may send the same
/// request again (`x-should-retry`).
#[derive(Debug)]
pub struct OpenAiError {
    pub(crate) status: StatusCode,
    pub(crate) kind: &'static str,
    pub(crate) code: String,
    pub(crate) param: Option<String>,
    pub(crate) message: String,
    pub(crate) retry: bool,
    /// `Retry-After` of a limit's 429, in milliseconds.
    pub(crate) retry_after_ms: Option<u64>,
}

impl OpenAiError {
    pub(crate) fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        OpenAiError {
            status,
            kind: error_type(status),
            code: code.to_string(),
            param: None,
            message: message.into(),
            retry: false,
            retry_after_ms: None,
        }
    }

    pub(crate) fn invalid(param: &str, message: impl Into<String>) -> Self {
        OpenAiError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            kind: "invalid_request_error",
            code: "invalid_request".into(),
            param: Some(param.to_string()),
            message: format!("{param}: {}", message.into()),
            retry: false,
            retry_after_ms: None,
        }
    }

    pub(crate) fn unsupported(param: &str, why: &str) -> Self {
        OpenAiError {
            code: "unsupported_parameter".into(),
            ..Self::invalid(param, why)
        }
    }

    pub(crate) fn model_not_found(message: String) -> Self {
        OpenAiError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            code: "model_not_found".into(),
            param: Some("model".into()),
            message,
            retry: false,
            retry_after_ms: None,
        }
    }

    /// A refused submission: an unknown route is an unknown `model`.
    pub(crate) fn submitted(e: ApiError) -> Self {
        let error = OpenAiError::from(e);
        if error.code == "invalid_request" && error.message.starts_with("route:") {
            return OpenAiError::model_not_found(error.message);
        }
        error
    }
}

/// The status and OpenAI `code` a job without an answer is told with, by
/// both doors in OpenAI's shape and in their streams: the provider's
/// refusals as OpenAI names them, any other provider kind kept.
pub(crate) fn refusal_code(why: &Refusal) -> (StatusCode, &str) {
    let (status, code) = match why {
        Refusal::Pending => (504, "job_pending"),
        Refusal::Cancelled => (409, "job_cancelled"),
        Refusal::ContextLengthExceeded => (400, "context_length_exceeded"),
        Refusal::ContentPolicy => (400, "content_policy_violation"),
        Refusal::RateLimited => (429, "rate_limit_exceeded"),
        Refusal::ContractViolation => (502, "contract_violation"),
        Refusal::BadRequest(kind) => (400, kind.as_str()),
        Refusal::NeedsReview => (502, "job_needs_review"),
        Refusal::Failed(None) => (502, "job_failed"),
        Refusal::Failed(Some(kind)) => (502, kind.as_str()),
    };
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        code,
    )
}

/// A job that did not succeed, as the error a door in OpenAI's shape
/// answers: [`refusal_code`]'s status and code, `param` naming the
/// request's prompt field (`prompt_param`) for a context length and its
/// format field (`format_param`) for a broken contract. A finished job
/// answers the same to every replay, so only a pending one or one in
/// review says the SDK may retry ([`Refused::client_may_retry`]).
pub(crate) fn refusal(refused: Refused, prompt_param: &str, format_param: &str) -> OpenAiError {
    let Refused {
        why,
        message,
        client_may_retry,
    } = refused;
    let (status, code) = refusal_code(&why);
    let param = match why {
        Refusal::ContextLengthExceeded => Some(prompt_param.to_string()),
        Refusal::ContractViolation => Some(format_param.to_string()),
        _ => None,
    };
    OpenAiError {
        status,
        kind: error_type(status),
        code: code.to_string(),
        param,
        message,
        retry: client_may_retry,
        retry_after_ms: None,
    }
}

/// The OpenAI error `type` a status maps to.
pub(crate) fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        409 => "conflict_error",
        429 => "rate_limit_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

impl From<ApiError> for OpenAiError {
    fn from(e: ApiError) -> Self {
        let status = e.status_code();
        let message = e.to_string();
        if let ApiError::Internal(cause) = &e {
            tracing::error!(error = format!("{cause:#}"), "request failed");
        }
        // Our 422 messages start with the field at fault: `field: why`.
        let param = match &e {
            ApiError::InvalidRequest(m) => m
                .split_once(": ")
                .map(|(field, _)| field.trim_start_matches("params.").to_string())
                .filter(|f| !f.contains(' ')),
            ApiError::MissingIdempotencyKey | ApiError::InvalidIdempotencyKey(_) => {
                Some("Idempotency-Key".to_string())
            }
            _ => None,
        };
        let limit = match &e {
            ApiError::Limited(l) => Some(l),
            _ => None,
        };
        // The SDKs retry a 503 with backoff, honouring Retry-After.
        let store_down = matches!(e, ApiError::StoreUnavailable(_));
        if let ApiError::StoreUnavailable(cause) = &e {
            tracing::warn!(error = %cause, "store unavailable; the client is told to retry");
        }
        OpenAiError {
            status,
            kind: error_type(status),
            code: e.code().to_string(),
            param,
            message,
            retry: store_down || limit.is_some_and(|l| l.should_retry()),
            retry_after_ms: match limit {
                Some(l) => Some(l.retry_after_ms()),
                None => store_down.then_some(u64::from(STORE_RETRY_AFTER_SECS) * 1000),
            },
        }
    }
}

impl IntoResponse for OpenAiError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message, "type": self.kind, "param": self.param, "code": self.code,
        }});
        let mut response = (self.status, Json(body)).into_response();
        response
            .extensions_mut()
            .insert(crate::http::refusals::ErrorCode(self.code));
        let retry = if self.retry { "true" } else { "false" };
        response
            .headers_mut()
            .insert("x-should-retry", HeaderValue::from_static(retry));
        if let Some(ms) = self.retry_after_ms {
            let headers = response.headers_mut();
            headers.insert("retry-after", HeaderValue::from(ms.div_ceil(1000).max(1)));
            headers.insert("retry-after-ms", HeaderValue::from(ms));
        }
        response
    }
}
