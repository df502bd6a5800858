//! The Responses door answers its errors in OpenAI's shape
//! ([`crate::http::openai_error`], shared with Chat Completions), naming
//! the Responses field at fault.

use crate::http::error::ApiError;
pub use crate::http::openai_error::OpenAiError as ResponsesError;
use axum::http::StatusCode;

impl ResponsesError {
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

    /// An `item_reference` to no item this caller may see.
    pub(super) fn item_not_found(id: &str, param: &str) -> Self {
        ResponsesError {
            param: Some(param.to_string()),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "item_not_found",
                format!("Item with id '{id}' not found."),
            )
        }
    }
}

/// A refused submission: an unknown route is an unknown `model`, and a
/// field of the job request is named as the Responses field it came from.
pub(super) fn submit(e: ApiError) -> ResponsesError {
    let mut error = ResponsesError::submitted(e);
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
