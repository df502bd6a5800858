//! The engine's answer as a `chat.completion`, and a job without one as
//! the OpenAI error a client acts on.

use super::error::CompatError;
use crate::domain::Job;
use crate::http::door::{Answer, Refused};
use axum::Json;
use serde::Serialize;
use serde_json::Value;

/// A succeeded job as a `chat.completion`, written straight from the
/// answer (no JSON tree built first).
pub(super) fn completion(job: &Job, answer: Answer) -> Json<Completion> {
    let usage = answer.usage;
    let finish_reason = answer.finish.openai();
    Json(Completion {
        id: format!("chatcmpl-{}", job.id),
        object: "chat.completion",
        created: job.created_at / 1000,
        model: answer.model,
        choices: [Choice {
            index: 0,
            message: Turn {
                role: "assistant",
                content: answer.text,
                tool_calls: answer.tool_calls,
                refusal: (),
            },
            finish_reason,
            logprobs: (),
        }],
        usage: Tokens {
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            total_tokens: usage.total(),
            prompt_tokens_details: cached(&usage),
        },
    })
}

/// A `chat.completion` object, as OpenAI's API reference draws it.
#[derive(Serialize)]
pub(super) struct Completion {
    id: String,
    object: &'static str,
    created: i64,
    model: String,
    choices: [Choice; 1],
    usage: Tokens,
}

#[derive(Serialize)]
struct Choice {
    index: u32,
    message: Turn,
    finish_reason: &'static str,
    /// Always `null`: a job keeps no token log probabilities.
    logprobs: (),
}

#[derive(Serialize)]
struct Turn {
    role: &'static str,
    /// `null` for a tool-call turn without text.
    content: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Value>,
    /// Always `null`: a refusal is answered as an error.
    refusal: (),
}

#[derive(Serialize)]
struct Tokens {
    prompt_tokens: u64,
    completion_tokens: u64,
    total_tokens: u64,
    /// Present when a provider's prompt cache served some of the prompt
    /// (counted in `prompt_tokens`, as OpenAI counts them).
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_tokens_details: Option<CachedTokens>,
}

#[derive(Serialize)]
pub(super) struct CachedTokens {
    cached_tokens: u64,
}

/// `prompt_tokens_details` of `usage`: the prompt tokens read from a
/// provider's cache, when there are any.
pub(super) fn cached(usage: &crate::providers::Usage) -> Option<CachedTokens> {
    (usage.cached_tokens > 0).then_some(CachedTokens {
        cached_tokens: usage.cached_tokens,
    })
}

/// A job that did not succeed: the provider's code kept, a status the SDKs
/// raise the right exception for (`param` the request's `messages` or
/// `response_format`).
pub(super) fn refusal(refused: Refused) -> CompatError {
    crate::http::openai_error::refusal(refused, "messages", "response_format")
}
