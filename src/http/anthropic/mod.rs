//! Anthropic's Messages door: `POST /v1/messages` and
//! `POST /v1/messages/count_tokens`, so the official `anthropic` SDKs work
//! unchanged.
//!
//! `model` names a route. The key is `x-api-key` (or `Authorization:
//! Bearer`); any `anthropic-version` is accepted. `Idempotency-Key` is
//! required as on every door that makes a job (the SDK passes it with
//! `extra_headers`); the same key with another body is a 409 with
//! `x-should-retry: false`. The answer is a Message whose `model` is the
//! model that answered; `stream: true` streams Anthropic's events. Errors
//! are in Anthropic's shape with its types and statuses. The request runs
//! on any provider of the route: translated for OpenAI-wire providers and
//! the simulator, passed natively to `kind = "anthropic"`.
//!
//! `GET /v1/models` and `GET /v1/models/{model}` asked with
//! `anthropic-version` answer Anthropic's Models API (`models`).
//!
//! The dialect decodes (`decode`), the shared pipeline (`http::door`)
//! submits and settles, and the dialect encodes the answer and the stream
//! (`encode`) and the errors (`error`).

mod decode;
mod encode;
mod error;
pub mod models;

pub use error::AnthropicError;

use super::door::{self, LimitedBody};
use super::error::ApiError;
use super::AppState;
use crate::contracts::render::RenderedPrompt;
use crate::contracts::tokenizer::{count_prompt_tokens, counted_with_tools};
use crate::domain::request::{Message, Role};
use crate::domain::JobRequest;
use crate::keys::Caller;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use decode::Endpoint;
use serde_json::json;

/// `POST /v1/messages`.
pub async fn create(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    body: Result<LimitedBody, ApiError>,
) -> Result<Response, AnthropicError> {
    let caller = caller?;
    let LimitedBody(raw) = body?;
    let mut arrival = door::arrive(&state, caller, &headers)?;
    let decoded = decode::decode(&raw, Endpoint::Messages)?;
    let job_body = door::JobBody::decoded("anthropic.messages", &raw, decoded.request);
    if decoded.stream {
        let opened = door::open_stream(&state, &mut arrival, &job_body, &headers)
            .await
            .map_err(AnthropicError::submit)?;
        // `message_start` is written before any provider reported usage:
        // it says the prompt's tokens as `count_tokens` counts them (the
        // provider's count comes in `message_delta`).
        let input_tokens = match &job_body {
            door::JobBody::Decoded { request, .. } => {
                prompt_tokens(&state, request).map_or(0, |(tokens, _)| tokens)
            }
            _ => 0,
        };
        let encoder = encode::Encoder::new(&opened.job, input_tokens);
        return Ok(door::stream_response(opened, &arrival.key, encoder)?);
    }
    let settled = door::run(&state, &mut arrival, &job_body, &headers)
        .await
        .map_err(AnthropicError::submit)?;
    let response = door::respond(
        &state,
        &settled,
        &arrival.key,
        |job, answer| Json(encode::message(job, answer)).into_response(),
        |refused| encode::refusal(refused, &settled.attempts).into_response(),
    )?;
    Ok(response)
}

/// `POST /v1/messages/count_tokens`: the prompt's tokens as the route's
/// primary provider's declared tokenizer counts them, tools included (as
/// their JSON). Makes no job and no upstream call, so it needs no
/// `Idempotency-Key`; the answer names the tokenizer (`tokenizer`, and the
/// `x-onejob-tokenizer` header).
pub async fn count_tokens(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    body: Result<LimitedBody, ApiError>,
) -> Result<Response, AnthropicError> {
    caller?;
    let LimitedBody(raw) = body?;
    let request = decode::decode(&raw, Endpoint::CountTokens)?.request;
    let (tokens, tokenizer) = prompt_tokens(&state, &request)?;
    let mut response =
        Json(json!({"input_tokens": tokens, "tokenizer": tokenizer})).into_response();
    let name = HeaderValue::from_str(tokenizer).map_err(|e| ApiError::Internal(e.into()))?;
    response.headers_mut().insert("x-onejob-tokenizer", name);
    Ok(response)
}

/// The prompt's tokens of `request` (tools included), as its route's
/// primary provider's declared tokenizer counts them, and that tokenizer.
fn prompt_tokens<'a>(
    state: &'a AppState,
    request: &JobRequest,
) -> Result<(u32, &'a str), AnthropicError> {
    let Some(route) = state.config.routes.get(&request.route) else {
        return Err(AnthropicError::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("model: no route named {:?} on this server", request.route),
        ));
    };
    let provider = state.providers.get(&route.primary).ok_or_else(|| {
        AnthropicError::from(ApiError::Internal(anyhow::anyhow!(
            "route {:?} names provider {:?}, which is not loaded",
            request.route,
            route.primary
        )))
    })?;
    let tokenizer = provider.config.tokenizer.name();
    let messages = request.messages.as_deref().unwrap_or_default();
    let system: Vec<&str> = messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(|m| m.content.as_str())
        .collect();
    let prompt = RenderedPrompt {
        system: (!system.is_empty()).then(|| system.join("\n\n")),
        messages: messages
            .iter()
            .filter(|m| m.role != Role::System)
            .cloned()
            .collect::<Vec<Message>>(),
    };
    let prompt = counted_with_tools(&prompt, request.params.tools.as_deref());
    let tokens = count_prompt_tokens(tokenizer, &prompt).map_err(|e| {
        AnthropicError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            format!("messages: {e}"),
        )
    })?;
    Ok((tokens, tokenizer))
}
