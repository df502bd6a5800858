//! Errors in OpenAI's shape, `{"error": {"message", "type", "param",
//! "code"}}`, with `x-should-retry` always set: what the `openai` SDKs
//! raise their typed exceptions from.

use crate::http::error::{ApiError, STORE_RETRY_AFTER_SECS};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

/// An error in OpenAI's shape. `retry`: whether the SDK may send the same
/// request again (`x-should-retry`).
#[derive(Debug)]
pub struct ResponsesError {
    pub(super) status: StatusCode,
    pub(super) kind: &'static str,
    pub(super) code: String,
    pub(super) param: Option<String>,
    pub(super) message: String,
    pub(super) retry: bool,
    /// `Retry-After` of a limit's 429, in milliseconds.
    pub(super) retry_after_ms: Option<u64>,
}

impl ResponsesError {
    pub(super) fn new(status: StatusCode, code: &str, message: impl Into<String>) -> Self {
        ResponsesError {
            status,
            kind: error_type(status),
            code: code.to_string(),
            param: None,
            message: message.into(),
            retry: false,
            retry_after_ms: None,
        }
    }

    /// A field onejob refuses or cannot read: 422 naming it.
    pub(super) fn invalid(param: &str, message: impl Into<String>) -> Self {
        ResponsesError {
            param: Some(param.to_string()),
            ..Self::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "invalid_request",
                format!("{param}: {}", message.into()),
            )
        }
    }

    pub(super) fn unsupported(param: &str, why: &str) -> Self {
        ResponsesError {
            code: "unsupported_parameter".into(),
            ..Self::invalid(param, why)
        }
    }

    /// No such response for this caller: another owner's id is answered
    /// the same, so existence does not leak.
    pub(super) fn response_not_found(id: &str, param: Option<&str>) -> Self {
        ResponsesError {
            param: param.map(str::to_string),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "response_not_found",
                format!("No response with id '{id}' found."),
            )
        }
    }

    fn model_not_found(message: String) -> Self {
        ResponsesError {
            param: Some("model".into()),
            ..Self::new(StatusCode::NOT_FOUND, "model_not_found", message)
        }
    }

    /// A refused submission: an unknown route is an unknown `model`, and a
    /// field of the job request is named as the Responses field it came from.
    pub(super) fn submit(e: ApiError) -> Self {
        let mut error = ResponsesError::from(e);
        if error.code == "invalid_request" && error.message.starts_with("route:") {
            return ResponsesError::model_not_found(error.message);
        }
        let ours = match error.param.as_deref() {
            Some(p) if p == "messages" || p.starts_with("messages[") => Some("input"),
            Some("max_tokens") => Some("max_output_tokens"),
            Some(p) if p.starts_with("response_format") => Some("text.format"),
            _ => None,
        };
        if let Some(param) = ours {
            error.param = Some(param.to_string());
        }
        error
    }
}

/// The OpenAI error `type` a status maps to.
pub(super) fn error_type(status: StatusCode) -> &'static str {
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

impl From<ApiError> for ResponsesError {
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
        ResponsesError {
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

impl IntoResponse for ResponsesError {
    fn into_response(self) -> Response {
        let body = json!({"error": {
            "message": self.message, "type": self.kind, "param": self.param, "code": self.code,
        }});
        let mut response = (self.status, Json(body)).into_response();
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
