//! `POST /v1/chat/completions`: the OpenAI Chat Completions shape in front
//! of onejob. `model` names a route; the `Idempotency-Key` header is required
//! as on `POST /v1/jobs` (the SDKs pass it with `extra_headers`). The call
//! runs a job, holds until it is final, and answers as OpenAI would, with the
//! job's id in `x-onejob-job-id`. A replay answers the same completion.

use super::error::ApiError;
use super::jobs::{idempotency_key, LimitedBody, MAX_WAIT_SECS};
use super::AppState;
use crate::domain::JobState;
use crate::jobs;
use crate::keys::Caller;
use crate::metrics::Metrics;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// How long a completion is held for when the client sends no `Prefer: wait`.
const DEFAULT_WAIT_SECS: u64 = 120;

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    model: String,
    messages: Vec<Map<String, Value>>,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    max_tokens: Option<u32>,
    #[serde(default)]
    max_completion_tokens: Option<u32>,
    #[serde(default)]
    top_p: Option<f64>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    n: Option<u32>,
    #[serde(default)]
    tools: Option<Value>,
    #[serde(default)]
    response_format: Option<Value>,
}

/// The job request a completion request makes; what onejob cannot honour is
/// refused, never silently dropped.
fn job_body(raw: &[u8]) -> Result<Vec<u8>, ApiError> {
    let request: CompletionRequest = super::body::parse(raw)?;
    let unsupported =
        |field: &str, why: &str| Err(ApiError::InvalidRequest(format!("{field}: {why}")));
    if request.stream == Some(true) {
        return unsupported(
            "stream",
            "streaming is not supported; a job answers once it is final",
        );
    }
    if request.n.is_some_and(|n| n != 1) {
        return unsupported("n", "only one choice per job");
    }
    if request.tools.is_some() {
        return unsupported("tools", "tool calls are not supported");
    }
    if request
        .response_format
        .as_ref()
        .is_some_and(|f| f["type"] != "text")
    {
        return unsupported(
            "response_format",
            "use POST /v1/jobs with a contract for structured output",
        );
    }
    let mut messages = Vec::with_capacity(request.messages.len());
    for (i, m) in request.messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or_default();
        let role = if role == "developer" { "system" } else { role };
        let content = match m.get("content") {
            Some(Value::String(s)) => s.clone(),
            // Content parts: text parts are joined; anything else is refused.
            Some(Value::Array(parts)) => {
                let mut text = String::new();
                for part in parts {
                    match (part["type"].as_str(), part["text"].as_str()) {
                        (Some("text"), Some(t)) => text.push_str(t),
                        _ => {
                            return unsupported(
                                &format!("messages[{i}].content"),
                                "only text parts are supported",
                            )
                        }
                    }
                }
                text
            }
            _ => {
                return unsupported(
                    &format!("messages[{i}].content"),
                    "a string or text parts is required",
                )
            }
        };
        messages.push(json!({ "role": role, "content": content }));
    }
    let mut params = Map::new();
    if let Some(t) = request.temperature {
        params.insert("temperature".into(), json!(t));
    }
    if let Some(m) = request.max_completion_tokens.or(request.max_tokens) {
        params.insert("max_tokens".into(), json!(m));
    }
    if let Some(p) = request.top_p {
        params.insert("top_p".into(), json!(p));
    }
    let body = json!({ "messages": messages, "params": params, "route": request.model });
    Ok(body.to_string().into_bytes())
}

pub async fn create(
    State(state): State<AppState>,
    caller: Caller,
    headers: HeaderMap,
    LimitedBody(raw): LimitedBody,
) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    let body = job_body(&raw)?;
    let submission = jobs::submit(
        state.store.as_ref(),
        state.clock.as_ref(),
        &state.config.routes,
        &caller,
        &key,
        &body,
        state.engine.as_ref(),
    )
    .await?;
    Metrics::inc(if submission.replayed {
        &state.metrics.jobs_replayed
    } else {
        &state.metrics.jobs_created
    });
    let wait = super::jobs::preferred_wait(&headers)
        .unwrap_or(DEFAULT_WAIT_SECS)
        .min(MAX_WAIT_SECS);
    let mut job = submission.job;
    if let Some(engine) = &state.engine {
        if let Some(settled) = engine.wait_for(&job.id, Duration::from_secs(wait)).await {
            job = settled;
        }
    }
    let job_id = HeaderValue::from_str(&job.id).map_err(|e| ApiError::Internal(e.into()))?;
    let mut response = match job.state {
        JobState::Succeeded => {
            let attempts = state.store.list_attempts(&job.id).await?;
            let winner = attempts
                .iter()
                .find(|a| Some(&a.id) == job.completed_by.as_ref());
            let usage: Value = winner
                .and_then(|a| a.usage.as_deref())
                .and_then(|u| serde_json::from_str(u).ok())
                .unwrap_or(Value::Null);
            let content = job
                .result
                .as_deref()
                .and_then(|r| serde_json::from_str::<Value>(r).ok())
                .map(|v| match v {
                    Value::String(s) => s,
                    other => other.to_string(),
                })
                .unwrap_or_default();
            let (prompt, completion) = (
                usage["prompt_tokens"].as_u64().unwrap_or(0),
                usage["completion_tokens"].as_u64().unwrap_or(0),
            );
            let body = json!({
                "id": format!("chatcmpl-{}", job.id),
                "object": "chat.completion",
                "created": job.created_at / 1000,
                "model": job.route,
                "choices": [{
                    "index": 0,
                    "message": { "role": "assistant", "content": content },
                    "finish_reason": "stop"
                }],
                "usage": { "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion }
            });
            (StatusCode::OK, Json(body)).into_response()
        }
        JobState::Failed | JobState::NeedsReview | JobState::Cancelled => {
            let message = format!(
                "job {} is {}: {}",
                job.id,
                job.state.as_str(),
                job.last_error.as_deref().unwrap_or("no result")
            );
            let body = json!({ "error": { "code": "job_not_completed", "message": message } });
            let mut r = (StatusCode::BAD_GATEWAY, Json(body)).into_response();
            r.headers_mut()
                .insert("x-should-retry", HeaderValue::from_static("false"));
            r
        }
        JobState::Pending | JobState::Running => {
            let message = format!(
                "job {} is still {}; replay this request with the same Idempotency-Key, or GET /v1/jobs/{}",
                job.id,
                job.state.as_str(),
                job.id
            );
            let body = json!({ "error": { "code": "job_pending", "message": message } });
            (StatusCode::GATEWAY_TIMEOUT, Json(body)).into_response()
        }
    };
    response.headers_mut().insert("x-onejob-job-id", job_id);
    if submission.replayed {
        response
            .headers_mut()
            .insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}
