//! `POST /v1/chat/completions` with `stream: true`: the job runs with
//! streamed attempts and the client reads its pieces as server-sent events
//! in OpenAI's `chat.completion.chunk` shape — the role first, content and
//! tool-call deltas, the finish reason, the usage chunk when
//! `stream_options.include_usage` asks, then `data: [DONE]`, sent only once
//! the answer is committed.
//!
//! Every event has an `id:`: the bytes of answer delivered through it, and
//! a `.N` suffix for the events after the last piece (`12.1` finish,
//! `12.2` usage, `12.3` done). A client that lost its connection sends the
//! same request with the same `Idempotency-Key` (and, if it has one,
//! `Last-Event-ID`): it gets the stream from there — buffered events, then
//! live ones — or, once the job is finished, the stored completion,
//! streamed. Nothing runs twice: the replay is the same job.

use super::error::ApiError;
use super::jobs::MAX_WAIT_SECS;
use super::openai_compat::{submit_error, CompatError};
use super::AppState;
use crate::domain::{Job, JobState};
use crate::engine::stream::{StreamEvent, StreamHub};
use crate::jobs;
use crate::keys::Caller;
use crate::metrics::Metrics;
use crate::providers::stream::Delta;
use crate::providers::Usage;
use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::Response;
use futures::stream;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

/// How long a streamed replay of an unfinished job (driven elsewhere) waits
/// for its final answer when the client sends no `Prefer: wait`.
const DEFAULT_WAIT_SECS: u64 = 120;

/// The key the request runs under, and whether onejob made it
/// (`idempotency = "optional"`; then it is echoed for replays).
pub struct StreamKey {
    pub key: crate::domain::request::IdempotencyKey,
    pub made_here: bool,
}

/// What the client asked of the stream.
#[derive(Debug, Clone, Copy)]
pub struct StreamAsk {
    pub include_usage: bool,
}

/// `Some` when the request asks for a stream. Returns the body without
/// `stream` and `stream_options`: they are not part of the intent, so one
/// request may be replayed streamed or not.
pub fn requested(raw: &[u8]) -> Option<(StreamAsk, Vec<u8>)> {
    let mut value: Value = serde_json::from_slice(raw).ok()?;
    let object = value.as_object_mut()?;
    if object.get("stream") != Some(&Value::Bool(true)) {
        return None;
    }
    object.remove("stream");
    let options = object.remove("stream_options");
    let include_usage = options.as_ref().is_some_and(|o| o["include_usage"] == true);
    Some((StreamAsk { include_usage }, value.to_string().into_bytes()))
}

/// A position in the stream: answer bytes delivered, then events after them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
struct Position {
    offset: usize,
    after: u32,
}

impl Position {
    fn parse(id: &str) -> Option<Self> {
        let (offset, after) = id.trim().split_once('.').unwrap_or((id.trim(), "0"));
        Some(Position {
            offset: offset.parse().ok()?,
            after: after.parse().ok()?,
        })
    }

    fn id(self) -> String {
        match self.after {
            0 => self.offset.to_string(),
            n => format!("{}.{n}", self.offset),
        }
    }
}

fn delta_len(delta: &Delta) -> usize {
    let tools: usize = delta
        .tool_calls
        .iter()
        .map(|c| {
            c["function"]["name"].as_str().map_or(0, str::len)
                + c["function"]["arguments"].as_str().map_or(0, str::len)
                + c["id"].as_str().map_or(0, str::len)
        })
        .sum();
    delta.content.len() + tools
}

/// Turns stream events into SSE frames for one client, skipping what it
/// already has (everything up to `resume_after`).
struct Renderer {
    completion_id: String,
    created: i64,
    ask: StreamAsk,
    at: Position,
    resume_after: Option<Position>,
}

impl Renderer {
    fn chunk(&self, model: &str, delta: Value, finish: Value) -> Value {
        json!({
            "id": self.completion_id, "object": "chat.completion.chunk",
            "created": self.created, "model": model, "system_fingerprint": null,
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}]
        })
    }

    /// Advance to the next position; the frame is sent unless the client has it.
    fn frame(&mut self, grown: usize, data: &str, out: &mut String) {
        self.at = if grown > 0 {
            Position {
                offset: self.at.offset + grown,
                after: 0,
            }
        } else {
            Position {
                offset: self.at.offset,
                after: self.at.after + 1,
            }
        };
        if self.resume_after.is_some_and(|r| self.at <= r) {
            return;
        }
        out.push_str("id: ");
        out.push_str(&self.at.id());
        out.push_str("\ndata: ");
        out.push_str(data);
        out.push_str("\n\n");
    }

    fn render(&mut self, event: &StreamEvent) -> String {
        let mut out = String::new();
        match event {
            StreamEvent::Start { model, .. } => {
                let chunk = self.chunk(
                    model,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                );
                // The role comes first, at position 0.
                self.at = Position::default();
                if self.resume_after.is_none() {
                    out.push_str(&format!("id: 0\ndata: {chunk}\n\n"));
                }
            }
            StreamEvent::Piece { model, delta } => {
                let grown = delta_len(delta);
                let start = self.at.offset;
                let mut delta = delta.clone();
                // A piece the client has the beginning of (a stored answer
                // sent whole after a live stream broke off): send the rest.
                if let Some(r) = self.resume_after {
                    if r.offset > start && r.offset < start + grown && delta.tool_calls.is_empty() {
                        delta.content = delta
                            .content
                            .get(r.offset - start..)
                            .unwrap_or_default()
                            .to_string();
                        self.at.offset = r.offset;
                        self.at.after = 0;
                        let chunk =
                            self.chunk(model, json!({"content": delta.content}), Value::Null);
                        self.resume_after = None;
                        self.frame(start + grown - r.offset, &chunk.to_string(), &mut out);
                        return out;
                    }
                }
                let mut body = serde_json::Map::new();
                if !delta.content.is_empty() || delta.tool_calls.is_empty() {
                    body.insert("content".into(), json!(delta.content));
                }
                if !delta.tool_calls.is_empty() {
                    body.insert("tool_calls".into(), Value::Array(delta.tool_calls));
                }
                let chunk = self.chunk(model, Value::Object(body), Value::Null);
                self.frame(grown.max(1), &chunk.to_string(), &mut out);
            }
            StreamEvent::Finish {
                model,
                finish_reason,
                usage,
            } => {
                let chunk = self.chunk(model, json!({}), json!(finish_reason));
                self.frame(0, &chunk.to_string(), &mut out);
                if self.ask.include_usage {
                    let u = usage.unwrap_or(Usage::default());
                    let chunk = json!({
                        "id": self.completion_id, "object": "chat.completion.chunk",
                        "created": self.created, "model": model, "system_fingerprint": null,
                        "choices": [],
                        "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                                  "total_tokens": u.prompt_tokens + u.completion_tokens}
                    });
                    self.frame(0, &chunk.to_string(), &mut out);
                } else {
                    self.at.after += 1;
                }
                self.frame(0, "[DONE]", &mut out);
            }
            StreamEvent::Error { code, message } => {
                let body = json!({"error": {"message": message, "type": "server_error", "param": null, "code": code}});
                self.frame(0, &body.to_string(), &mut out);
            }
        }
        out
    }
}

/// The events of a finished (or failed) job, as a stream would have had them.
fn stored_events(
    state: &AppState,
    job: &Job,
    winner: Option<&crate::domain::Attempt>,
) -> Vec<StreamEvent> {
    if job.state != JobState::Succeeded {
        let code = match job.state {
            JobState::Failed => "job_failed",
            JobState::NeedsReview => "job_needs_review",
            JobState::Cancelled => "job_cancelled",
            _ => "job_pending",
        };
        let message = format!(
            "job {} is {}: {}",
            job.id,
            job.state.as_str(),
            job.last_error.as_deref().unwrap_or("no result yet")
        );
        return vec![StreamEvent::Error {
            code: code.to_string(),
            message,
        }];
    }
    // The result as the unstreamed answer reads it: text, a turn with tool
    // calls, or a contract job's JSON.
    let (content, tool_calls) = match job
        .result
        .as_deref()
        .and_then(|r| serde_json::from_str::<Value>(r).ok())
    {
        Some(Value::String(s)) => (s, Vec::new()),
        Some(Value::Object(turn)) if turn.contains_key("tool_calls") => (
            turn.get("content")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            turn.get("tool_calls")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default(),
        ),
        Some(other) => (other.to_string(), Vec::new()),
        None => (String::new(), Vec::new()),
    };
    let finish_reason = if tool_calls.is_empty() {
        "stop"
    } else {
        "tool_calls"
    };
    let provider = winner.map(|a| a.provider.clone()).unwrap_or_default();
    let model = state
        .providers
        .get(&provider)
        .map_or_else(|| job.route.clone(), |p| p.config.model.clone());
    let usage = winner
        .and_then(|a| a.usage.as_deref())
        .and_then(|u| serde_json::from_str::<Usage>(u).ok());
    let mut events = vec![StreamEvent::Start {
        model: model.clone(),
        provider,
        attempt_id: winner.map(|a| a.id.clone()).unwrap_or_default(),
    }];
    if !content.is_empty() {
        events.push(StreamEvent::Piece {
            model: model.clone(),
            delta: Delta::text(content),
        });
    }
    for (index, call) in tool_calls.into_iter().enumerate() {
        let mut piece = call;
        piece["index"] = json!(index);
        events.push(StreamEvent::Piece {
            model: model.clone(),
            delta: Delta {
                content: String::new(),
                tool_calls: vec![piece],
            },
        });
    }
    events.push(StreamEvent::Finish {
        model,
        finish_reason: finish_reason.into(),
        usage,
    });
    events
}

fn last_event_id(headers: &HeaderMap) -> Option<Position> {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(Position::parse)
}

fn sse_response(
    job: &Job,
    replayed: bool,
    key_made_here: Option<&str>,
    first: Option<&StreamEvent>,
    body: Body,
) -> Result<Response, ApiError> {
    let mut response = Response::new(body);
    *response.status_mut() = StatusCode::OK;
    let headers = response.headers_mut();
    let value = |s: &str| HeaderValue::from_str(s).map_err(|e| ApiError::Internal(e.into()));
    headers.insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert("cache-control", HeaderValue::from_static("no-cache"));
    headers.insert("x-onejob-job-id", value(&job.id)?);
    if let Some(StreamEvent::Start {
        provider,
        attempt_id,
        ..
    }) = first
    {
        headers.insert("x-onejob-provider", value(provider)?);
        headers.insert("x-onejob-attempt", value(attempt_id)?);
    }
    if let Some(key) = key_made_here {
        headers.insert("idempotency-key", value(key)?);
    }
    if replayed {
        headers.insert("idempotent-replayed", HeaderValue::from_static("true"));
    }
    Ok(response)
}

/// Answer a streamed completion request. `body` is the request without its
/// stream fields, already made into a job request by the caller.
pub async fn create(
    state: AppState,
    caller: Caller,
    headers: HeaderMap,
    key: StreamKey,
    ask: StreamAsk,
    job_body: Vec<u8>,
) -> Result<Response, CompatError> {
    let StreamKey { key, made_here } = key;
    let admission = state
        .tenants
        .admit(&caller)
        .map_err(super::error::ApiError::from)?;
    let hub = state
        .engine
        .as_ref()
        .map(|e| e.stream_hub(&caller.owner_id, key.as_str()));
    let submitted = jobs::submit(
        &state.store,
        state.clock.as_ref(),
        &state.config.routes,
        &caller,
        &key,
        &job_body,
        state.engine.as_ref(),
        &admission,
        &state.replays,
    )
    .await;
    // A hub no driver here took (the job is finished, or driven unstreamed
    // or elsewhere) is of no use: the stored completion is streamed instead.
    // Nor is one whose stream ended in an error: the job went on, and the
    // replay waits for its final answer.
    let hub = match (hub, &state.engine) {
        (Some(hub), Some(engine)) if !hub.is_driven() => {
            engine.release_hub(&caller.owner_id, key.as_str(), &hub);
            None
        }
        (Some(hub), _) if hub.ended_in_error() => None,
        (hub, _) => hub,
    };
    let submission = submitted.map_err(|e| submit_error(&state, e))?;
    Metrics::inc(if submission.replayed {
        &state.metrics.jobs_replayed
    } else {
        &state.metrics.jobs_created
    });
    if submission.from_memory {
        Metrics::inc(&state.metrics.replays_from_memory);
    }
    let job = submission.job;
    let mut renderer = Renderer {
        completion_id: format!("chatcmpl-{}", job.id),
        created: job.created_at / 1000,
        ask,
        at: Position::default(),
        resume_after: last_event_id(&headers),
    };
    match hub {
        Some(hub) => {
            // Headers wait for the first event, so they can name the
            // provider that owns the stream.
            hub.changed_past(0).await;
            let (first, _) = hub.events_from(0);
            let response_first = first.first().cloned();
            let body = live_body(hub, renderer);
            let made = made_here.then_some(key.as_str());
            Ok(sse_response(
                &job,
                submission.replayed,
                made,
                response_first.as_ref(),
                body,
            )?)
        }
        None => {
            let wait = super::jobs::preferred_wait(&headers)
                .unwrap_or(DEFAULT_WAIT_SECS)
                .min(MAX_WAIT_SECS);
            let mut job = job;
            if let Some(engine) = &state.engine {
                if let Some(settled) = engine.wait_for(&job.id, Duration::from_secs(wait)).await {
                    job = settled;
                }
            }
            let attempts = if job.state == JobState::Succeeded {
                state
                    .store
                    .list_attempts(&job.id)
                    .await
                    .map_err(ApiError::from)?
            } else {
                Vec::new()
            };
            let winner = attempts
                .iter()
                .find(|a| Some(&a.id) == job.completed_by.as_ref());
            let events = stored_events(&state, &job, winner);
            let text: String = events.iter().map(|e| renderer.render(e)).collect();
            let made = made_here.then_some(key.as_str());
            Ok(sse_response(
                &job,
                submission.replayed,
                made,
                events.first(),
                Body::from(text),
            )?)
        }
    }
}

/// The hub's events from the start (the renderer skips what the client
/// has), buffered then live, until the stream ends.
fn live_body(hub: Arc<StreamHub>, renderer: Renderer) -> Body {
    let frames = stream::unfold(
        (hub, renderer, 0usize, false),
        |(hub, mut renderer, next, done)| async move {
            if done {
                return None;
            }
            loop {
                let (events, ended) = hub.events_from(next);
                if !events.is_empty() {
                    let text: String = events.iter().map(|e| renderer.render(e)).collect();
                    let next = next + events.len();
                    let done = ended && hub.events_from(next).0.is_empty();
                    return Some((
                        Ok::<_, std::io::Error>(Bytes::from(text)),
                        (hub, renderer, next, done),
                    ));
                }
                if ended {
                    return None;
                }
                hub.changed_past(next).await;
            }
        },
    );
    Body::from_stream(frames)
}
