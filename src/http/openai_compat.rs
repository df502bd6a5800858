//! `POST /v1/chat/completions` and `GET /v1/models`: the OpenAI shapes in
//! front of onejob, so the official SDKs work unchanged.
//!
//! `model` names a route; `GET /v1/models` lists the routes. The
//! `Idempotency-Key` header is required as on `POST /v1/jobs` (the SDKs pass
//! it with `extra_headers`), unless `[server] idempotency = "optional"`: a
//! keyless call then gets a fresh key, echoed in the `Idempotency-Key`
//! response header. The call runs a job, holds until it is final, and
//! answers as OpenAI would: `model` names the model that answered, and
//! `x-onejob-job-id`, `x-onejob-provider`, `x-onejob-attempt` say which job
//! and attempt. Errors are in OpenAI's shape (`message`, `type`, `param`,
//! `code`), with the provider's code kept and `x-should-retry` always set.
//!
//! What onejob cannot honour is refused with 422 naming the field, never
//! dropped. `stream` and `stream_options` never enter the job request, so
//! they are not part of its fingerprint: one intent may be replayed
//! streamed or not.

use super::error::ApiError;
use super::jobs::{LimitedBody, MAX_WAIT_SECS};
use super::AppState;
use crate::config::IdempotencyMode;
use crate::domain::request::IdempotencyKey;
use crate::domain::{Attempt, AttemptState, Job, JobState};
use crate::jobs;
use crate::keys::Caller;
use crate::metrics::Metrics;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// How long a completion is held for when the client sends no `Prefer: wait`.
const DEFAULT_WAIT_SECS: u64 = 120;

/// Fields of a chat completion request onejob carries to the job (or, for
/// `stream`/`stream_options`, handles itself). Any other field is refused.
const ACCEPTED: &[&str] = &[
    "model",
    "messages",
    "temperature",
    "top_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "stream",
    "stream_options",
    "stop",
    "seed",
    "user",
    "presence_penalty",
    "frequency_penalty",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "response_format",
    "store",
    "logprobs",
];

/// An error in OpenAI's shape. `retry`: whether the SDK may send the same
/// request again (`x-should-retry`).
#[derive(Debug)]
pub struct CompatError {
    status: StatusCode,
    kind: &'static str,
    code: String,
    param: Option<String>,
    message: String,
    retry: bool,
    /// `Retry-After` of a limit's 429, in milliseconds.
    retry_after_ms: Option<u64>,
}

impl CompatError {
    fn invalid(param: &str, message: impl Into<String>) -> Self {
        CompatError {
            status: StatusCode::UNPROCESSABLE_ENTITY,
            kind: "invalid_request_error",
            code: "invalid_request".into(),
            param: Some(param.to_string()),
            message: format!("{param}: {}", message.into()),
            retry: false,
            retry_after_ms: None,
        }
    }

    fn unsupported(param: &str, why: &str) -> Self {
        CompatError {
            code: "unsupported_parameter".into(),
            ..Self::invalid(param, why)
        }
    }
}

/// The OpenAI error `type` a status maps to.
fn error_type(status: StatusCode) -> &'static str {
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

impl From<ApiError> for CompatError {
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
        CompatError {
            status,
            kind: error_type(status),
            code: e.code().to_string(),
            param,
            message,
            retry: store_down || limit.is_some_and(|l| l.should_retry()),
            retry_after_ms: match limit {
                Some(l) => Some(l.retry_after_ms()),
                None => {
                    store_down.then_some(u64::from(super::error::STORE_RETRY_AFTER_SECS) * 1000)
                }
            },
        }
    }
}

impl IntoResponse for CompatError {
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

/// A message's content: the text, and the parts as given when one is not
/// text (images are passed to providers that accept them).
fn content_of(
    i: usize,
    content: Option<&Value>,
) -> Result<(String, Option<Vec<Value>>), CompatError> {
    let field = format!("messages[{i}].content");
    match content {
        Some(Value::String(s)) => Ok((s.clone(), None)),
        None | Some(Value::Null) => Ok((String::new(), None)),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            let mut other = false;
            for (j, part) in parts.iter().enumerate() {
                match part["type"].as_str() {
                    Some("text") => match part["text"].as_str() {
                        Some(t) => text.push_str(t),
                        None => {
                            return Err(CompatError::invalid(
                                &format!("{field}[{j}].text"),
                                "a string is required",
                            ))
                        }
                    },
                    Some("image_url")
                        if part.pointer("/image_url/url").is_some_and(Value::is_string) =>
                    {
                        other = true
                    }
                    Some("image_url") => {
                        return Err(CompatError::invalid(
                            &format!("{field}[{j}].image_url.url"),
                            "a string is required",
                        ))
                    }
                    _ => {
                        return Err(CompatError::unsupported(
                            &format!("{field}[{j}].type"),
                            "only text and image_url parts are supported",
                        ))
                    }
                }
            }
            Ok((text, other.then(|| parts.clone())))
        }
        Some(_) => Err(CompatError::invalid(
            &field,
            "a string or a list of content parts is required",
        )),
    }
}

/// One chat message as a job message.
fn message_of(i: usize, m: &Value) -> Result<Value, CompatError> {
    let Some(fields) = m.as_object() else {
        return Err(CompatError::invalid(
            &format!("messages[{i}]"),
            "an object is required",
        ));
    };
    for key in fields.keys() {
        if !matches!(
            key.as_str(),
            "role" | "content" | "tool_calls" | "tool_call_id" | "refusal"
        ) {
            return Err(CompatError::unsupported(
                &format!("messages[{i}].{key}"),
                "not supported by onejob",
            ));
        }
    }
    let role = match m["role"].as_str() {
        Some("developer" | "system") => "system",
        Some(role @ ("user" | "assistant" | "tool")) => role,
        _ => {
            return Err(CompatError::invalid(
                &format!("messages[{i}].role"),
                "one of system, developer, user, assistant, tool",
            ))
        }
    };
    let (content, parts) = content_of(i, m.get("content"))?;
    let mut message = Map::new();
    message.insert("role".into(), json!(role));
    message.insert("content".into(), json!(content));
    if let Some(parts) = parts {
        message.insert("parts".into(), Value::Array(parts));
    }
    match (role, m.get("tool_calls")) {
        (_, None | Some(Value::Null)) => {}
        ("assistant", Some(Value::Array(calls))) => {
            message.insert("tool_calls".into(), Value::Array(calls.clone()));
        }
        _ => {
            return Err(CompatError::invalid(
                &format!("messages[{i}].tool_calls"),
                "only an assistant turn carries tool calls",
            ))
        }
    }
    if role == "tool" {
        match m["tool_call_id"].as_str() {
            Some(id) => {
                message.insert("tool_call_id".into(), json!(id));
            }
            None => {
                return Err(CompatError::invalid(
                    &format!("messages[{i}].tool_call_id"),
                    "required on a tool turn",
                ))
            }
        }
    }
    Ok(Value::Object(message))
}

/// The job request a completion request makes.
fn job_body(raw: &[u8]) -> Result<Vec<u8>, CompatError> {
    let request: Map<String, Value> = serde_json::from_slice(raw).map_err(|e| CompatError {
        status: StatusCode::BAD_REQUEST,
        kind: "invalid_request_error",
        code: "malformed_json".into(),
        param: None,
        message: format!("body is not a JSON object: {e}"),
        retry: false,
        retry_after_ms: None,
    })?;
    if let Some(field) = request.keys().find(|k| !ACCEPTED.contains(&k.as_str())) {
        return Err(CompatError::unsupported(field, "not supported by onejob"));
    }
    let model = match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(CompatError::invalid(
                "model",
                "the name of a route is required (GET /v1/models lists them)",
            ))
        }
    };
    if request.get("stream") == Some(&Value::Bool(true)) {
        return Err(CompatError::unsupported(
            "stream",
            "streaming is not supported by this server yet",
        ));
    }
    if request
        .get("n")
        .is_some_and(|n| !n.is_null() && n != &json!(1))
    {
        return Err(CompatError::unsupported(
            "n",
            "only one choice per job (n = 1)",
        ));
    }
    if request.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
        return Err(CompatError::unsupported(
            "parallel_tool_calls",
            "cannot be turned off through onejob",
        ));
    }
    for flag in ["store", "logprobs"] {
        if request.get(flag) == Some(&Value::Bool(true)) {
            return Err(CompatError::unsupported(flag, "not supported by onejob"));
        }
    }
    let messages = match request.get("messages") {
        Some(Value::Array(m)) => m
            .iter()
            .enumerate()
            .map(|(i, m)| message_of(i, m))
            .collect::<Result<Vec<_>, _>>()?,
        _ => {
            return Err(CompatError::invalid(
                "messages",
                "a list of messages is required",
            ))
        }
    };
    let mut params = Map::new();
    let max_tokens = request
        .get("max_completion_tokens")
        .filter(|v| !v.is_null())
        .or(request.get("max_tokens"));
    for (name, value) in [
        ("temperature", request.get("temperature")),
        ("top_p", request.get("top_p")),
        ("max_tokens", max_tokens),
        ("seed", request.get("seed")),
        ("user", request.get("user")),
        ("presence_penalty", request.get("presence_penalty")),
        ("frequency_penalty", request.get("frequency_penalty")),
        ("tools", request.get("tools")),
        ("tool_choice", request.get("tool_choice")),
    ] {
        if let Some(v) = value.filter(|v| !v.is_null()) {
            params.insert(name.into(), v.clone());
        }
    }
    match request.get("stop") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            params.insert("stop".into(), json!([s]));
        }
        Some(list) => {
            params.insert("stop".into(), list.clone());
        }
    }
    match request.get("response_format") {
        None | Some(Value::Null) => {}
        Some(format) if format["type"] == "text" => {}
        Some(format) => {
            params.insert("response_format".into(), format.clone());
        }
    }
    let body = json!({ "messages": messages, "params": params, "route": model });
    Ok(body.to_string().into_bytes())
}

/// The key a create runs under: the client's, or with `idempotency =
/// "optional"` a fresh one made here (then `true`).
pub(crate) fn key_for(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<(IdempotencyKey, bool), ApiError> {
    match headers.get("idempotency-key") {
        Some(_) => super::jobs::idempotency_key(headers).map(|k| (k, false)),
        None if state.config.idempotency == IdempotencyMode::Optional => {
            let made = format!("onejob-made-{}", crate::domain::new_id());
            IdempotencyKey::parse(made.as_bytes())
                .map(|k| (k, true))
                .map_err(ApiError::InvalidIdempotencyKey)
        }
        None => Err(ApiError::MissingIdempotencyKey),
    }
}

/// A refused submission in OpenAI's error shape: an unknown route is an
/// unknown `model`.
pub(crate) fn submit_error(state: &AppState, e: jobs::SubmitError) -> CompatError {
    if matches!(e, jobs::SubmitError::KeyReused { .. }) {
        Metrics::inc(&state.metrics.idempotency_conflicts);
    }
    let mut error = CompatError::from(ApiError::from(e));
    if error.code == "invalid_request" && error.message.starts_with("route:") {
        error.param = Some("model".into());
        error.code = "model_not_found".into();
        error.status = StatusCode::NOT_FOUND;
        error.kind = "not_found_error";
    }
    error
}

pub async fn create(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    headers: HeaderMap,
    body: Result<LimitedBody, ApiError>,
) -> Result<Response, CompatError> {
    let caller = caller?;
    let LimitedBody(raw) = body?;
    let (key, made_here) = key_for(&state, &headers)?;
    if let Some((ask, unstreamed)) = super::openai_stream::requested(&raw) {
        let body = job_body(&unstreamed)?;
        let key = super::openai_stream::StreamKey { key, made_here };
        return super::openai_stream::create(state, caller, headers, key, ask, body).await;
    }
    let admission = state.tenants.admit(&caller).map_err(ApiError::from)?;
    let body = job_body(&raw)?;
    let submitted = jobs::submit(
        &state.store,
        state.clock.as_ref(),
        &state.config.routes,
        &caller,
        &key,
        &body,
        state.engine.as_ref(),
        &admission,
        &state.replays,
    )
    .await;
    let submission = submitted.map_err(|e| submit_error(&state, e))?;
    Metrics::inc(if submission.replayed {
        &state.metrics.jobs_replayed
    } else {
        &state.metrics.jobs_created
    });
    if submission.from_memory {
        Metrics::inc(&state.metrics.replays_from_memory);
    }
    let wait = super::jobs::preferred_wait(&headers)
        .unwrap_or(DEFAULT_WAIT_SECS)
        .min(MAX_WAIT_SECS);
    let mut job = submission.job;
    if let (Some(engine), false) = (&state.engine, job.state.is_final()) {
        if let Some(settled) = engine.wait_for(&job.id, Duration::from_secs(wait)).await {
            job = settled;
            state
                .replays
                .finished
                .remember(&job, Some(submission.body_digest));
        }
    }
    let attempts = state
        .store
        .list_attempts(&job.id)
        .await
        .map_err(ApiError::from)?;
    let winner = attempts
        .iter()
        .find(|a| Some(&a.id) == job.completed_by.as_ref());
    let mut response = match job.state {
        JobState::Succeeded => completion(&state, &job, winner).into_response(),
        _ => job_error(&job, &attempts, made_here).into_response(),
    };
    let headers = response.headers_mut();
    let header = |v: &str| HeaderValue::from_str(v).map_err(|e| ApiError::Internal(e.into()));
    headers.insert("x-onejob-job-id", header(&job.id)?);
    if let Some(winner) = winner {
        headers.insert("x-onejob-provider", header(&winner.provider)?);
        headers.insert("x-onejob-attempt", header(&winner.id)?);
    }
    if made_here {
        headers.insert("idempotency-key", header(key.as_str())?);
    }
    if submission.replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// The model that answered: the model the winning attempt's provider asks
/// for (the route's name when no attempt won, e.g. a result set by an admin).
fn answering_model(state: &AppState, job: &Job, winner: Option<&Attempt>) -> String {
    winner
        .and_then(|w| state.providers.get(&w.provider))
        .map(|p| p.config.model.clone())
        .unwrap_or_else(|| job.route.clone())
}

/// A succeeded job as a `chat.completion`.
fn completion(state: &AppState, job: &Job, winner: Option<&Attempt>) -> Json<Value> {
    let usage: Value = winner
        .and_then(|w| w.usage.as_deref())
        .and_then(|u| serde_json::from_str(u).ok())
        .unwrap_or(Value::Null);
    let result: Value = job
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str(r).ok())
        .unwrap_or(Value::Null);
    let (message, finish_reason) = match result {
        Value::String(text) => (
            json!({"role": "assistant", "content": text, "refusal": null}),
            "stop",
        ),
        Value::Object(turn) if turn.contains_key("tool_calls") => (
            json!({"role": "assistant", "content": turn.get("content").cloned().unwrap_or(Value::Null),
                   "tool_calls": turn.get("tool_calls").cloned().unwrap_or(json!([])), "refusal": null}),
            "tool_calls",
        ),
        // A contract job's result is its validated JSON.
        other => (
            json!({"role": "assistant", "content": other.to_string(), "refusal": null}),
            "stop",
        ),
    };
    let (prompt, completion) = (
        usage["prompt_tokens"].as_u64().unwrap_or(0),
        usage["completion_tokens"].as_u64().unwrap_or(0),
    );
    Json(json!({
        "id": format!("chatcmpl-{}", job.id),
        "object": "chat.completion",
        "created": job.created_at / 1000,
        "model": answering_model(state, job, winner),
        "choices": [{ "index": 0, "message": message, "finish_reason": finish_reason, "logprobs": null }],
        "usage": { "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion }
    }))
}

/// A job that did not succeed, as an OpenAI error a client acts on: the
/// provider's code kept, a status the SDKs raise the right exception for.
fn job_error(job: &Job, attempts: &[Attempt], key_made_here: bool) -> CompatError {
    let last_failed = attempts
        .iter()
        .rev()
        .find(|a| a.state == AttemptState::Failed && a.error_kind.is_some());
    let provider_kind = last_failed
        .and_then(|a| a.error_kind.as_deref())
        .unwrap_or("");
    let detail = job.last_error.as_deref().unwrap_or("no result");
    let message = format!("job {} is {}: {detail}", job.id, job.state.as_str());
    let error = |status: u16, code: &str| CompatError {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY),
        kind: error_type(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY)),
        code: code.to_string(),
        param: None,
        message: message.clone(),
        retry: false,
        retry_after_ms: None,
    };
    match job.state {
        // Still running: the same request with the same key picks the job
        // up again, so the SDK may retry — unless the key was made here and
        // the SDK cannot send it back.
        JobState::Pending | JobState::Running => CompatError {
            message: format!(
                "job {} is still {}; replay this request with the same Idempotency-Key, or GET /v1/jobs/{}",
                job.id,
                job.state.as_str(),
                job.id
            ),
            retry: !key_made_here,
            ..error(504, "job_pending")
        },
        JobState::Cancelled => error(409, "job_cancelled"),
        // A finished job answers the same to every replay: nothing for the
        // SDK to retry.
        JobState::Failed | JobState::NeedsReview | JobState::Succeeded => match provider_kind {
            "context_length_exceeded" => CompatError {
                param: Some("messages".into()),
                ..error(400, "context_length_exceeded")
            },
            "content_policy" => error(400, "content_policy_violation"),
            "rate_limited" | "quota_exceeded" => error(429, "rate_limit_exceeded"),
            "contract_violation" => CompatError {
                param: Some("response_format".into()),
                ..error(502, "contract_violation")
            },
            "bad_request" | "unprocessable" | "invalid_prompt" => error(400, provider_kind),
            _ if job.state == JobState::NeedsReview => error(502, "job_needs_review"),
            "" => error(502, "job_failed"),
            other => error(502, other),
        },
    }
}

/// `GET /v1/models`: the routes, as OpenAI models.
pub async fn list_models(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
) -> Result<Json<Value>, CompatError> {
    caller?;
    let data: Vec<Value> = state.config.routes.keys().map(|name| model(name)).collect();
    Ok(Json(json!({ "object": "list", "data": data })))
}

/// `GET /v1/models/{model}`: one route, as an OpenAI model.
pub async fn show_model(
    State(state): State<AppState>,
    caller: Result<Caller, ApiError>,
    Path(name): Path<String>,
) -> Result<Json<Value>, CompatError> {
    caller?;
    if !state.config.routes.contains_key(&name) {
        return Err(CompatError {
            status: StatusCode::NOT_FOUND,
            kind: "not_found_error",
            code: "model_not_found".into(),
            param: Some("model".into()),
            message: format!("no route named {name:?} on this server"),
            retry: false,
            retry_after_ms: None,
        });
    }
    Ok(Json(model(&name)))
}

fn model(route: &str) -> Value {
    json!({ "id": route, "object": "model", "created": 0, "owned_by": "onejob" })
}
