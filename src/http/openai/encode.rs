//! The engine's answer as a `chat.completion`, and a job without one as
//! the OpenAI error a client acts on.

use super::error::CompatError;
use crate::domain::Job;
use crate::http::door::{Answer, Refused};
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
/// raise the right exception for (`param` the request's `messages` or
/// `response_format`).
pub(super) fn refusal(refused: Refused) -> CompatError {
    crate::http::openai_error::refusal(refused, "messages", "response_format")
}
