//! The engine's answer as a `chat.completion`, and a job without one as
//! the OpenAI error a client acts on.

use super::error::{error_type, CompatError};
use crate::domain::Job;
use crate::http::door::{Answer, Refusal, Refused};
use axum::http::StatusCode;
use axum::Json;
use serde_json::{json, Value};

/// A succeeded job as a `chat.completion`.
pub(super) fn completion(job: &Job, answer: Answer) -> Json<Value> {
    let content = answer.text.map_or(Value::Null, Value::String);
    let (message, finish_reason) = if answer.tool_calls.is_empty() {
        (
            json!({"role": "assistant", "content": content, "refusal": null}),
            "stop",
        )
    } else {
        (
            json!({"role": "assistant", "content": content,
                   "tool_calls": answer.tool_calls, "refusal": null}),
            "tool_calls",
        )
    };
    let (prompt, completion) = (answer.usage.prompt_tokens, answer.usage.completion_tokens);
    Json(json!({
        "id": format!("chatcmpl-{}", job.id),
        "object": "chat.completion",
        "created": job.created_at / 1000,
        "model": answer.model,
        "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason, "logprobs": null }],
        "usage": { "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion }
    }))
}

/// A job that did not succeed: the provider's code kept, a status the SDKs
/// raise the right exception for. A finished job answers the same to every
/// replay, so only a pending one says the SDK may retry.
pub(super) fn refusal(refused: Refused) -> CompatError {
    let Refused { why, message } = refused;
    let error = |status: u16, code: &str| {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        CompatError {
            status,
            kind: error_type(status),
            code: code.to_string(),
            param: None,
            message: message.clone(),
            retry: false,
            retry_after_ms: None,
        }
    };
    match why {
        Refusal::Pending { client_may_retry } => CompatError {
            retry: client_may_retry,
            ..error(504, "job_pending")
        },
        Refusal::Cancelled => error(409, "job_cancelled"),
        Refusal::ContextLengthExceeded => CompatError {
            param: Some("messages".into()),
            ..error(400, "context_length_exceeded")
        },
        Refusal::ContentPolicy => error(400, "content_policy_violation"),
        Refusal::RateLimited => error(429, "rate_limit_exceeded"),
        Refusal::ContractViolation => CompatError {
            param: Some("response_format".into()),
            ..error(502, "contract_violation")
        },
        Refusal::BadRequest(kind) => error(400, &kind),
        Refusal::NeedsReview => error(502, "job_needs_review"),
        Refusal::Failed(None) => error(502, "job_failed"),
        Refusal::Failed(Some(kind)) => error(502, &kind),
    }
}
