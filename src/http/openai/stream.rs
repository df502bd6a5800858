//! Chat Completions streamed: the job's stream events as server-sent
//! events in OpenAI's `chat.completion.chunk` shape — the role first,
//! content and tool-call deltas, the finish reason, the usage chunk when
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

use crate::domain::Job;
use crate::engine::stream::StreamEvent;
use crate::http::door::{Refusal, StreamEncoder};
use crate::http::openai_error::{error_type, refusal_code};
use crate::providers::stream::Delta;
use crate::providers::Usage;
use axum::http::HeaderMap;
use serde_json::{json, Value};

/// What the client asked of the stream.
#[derive(Debug, Clone, Copy)]
pub(super) struct StreamAsk {
    pub include_usage: bool,
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
pub(super) struct Renderer {
    completion_id: String,
    created: i64,
    ask: StreamAsk,
    at: Position,
    resume_after: Option<Position>,
}

impl Renderer {
    /// For the client of `job`, which has everything up to `Last-Event-ID`.
    pub(super) fn new(job: &Job, ask: StreamAsk, headers: &HeaderMap) -> Self {
        Renderer {
            completion_id: format!("chatcmpl-{}", job.id),
            created: job.created_at / 1000,
            ask,
            at: Position::default(),
            resume_after: last_event_id(headers),
        }
    }
}

impl StreamEncoder for Renderer {
    fn encode(&mut self, event: &StreamEvent) -> String {
        self.render(event)
    }
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

    /// The stream's last frame (`[DONE]`, or an error): sent even to a
    /// client whose `Last-Event-ID` is at or past it, so a resume never
    /// gets an empty stream an SDK takes for a silent end.
    /// Its id is past the client's `Last-Event-ID` too: an error sent before
    /// the answer reached where the client was (the job not final yet on a
    /// server that took it over) must not move the client's id back, or its
    /// next resume would get from the start what it has shown already.
    fn last_frame(&mut self, data: &str, out: &mut String) {
        if let Some(r) = self.resume_after.take() {
            self.at = self.at.max(r);
        }
        self.frame(0, data, out);
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
                let chunk = self.chunk(model, json!({}), json!(finish_reason.openai()));
                self.frame(0, &chunk.to_string(), &mut out);
                if self.ask.include_usage {
                    let u = usage.unwrap_or(Usage::default());
                    let mut chunk = json!({
                        "id": self.completion_id, "object": "chat.completion.chunk",
                        "created": self.created, "model": model, "system_fingerprint": null,
                        "choices": [],
                        "usage": {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
                                  "total_tokens": u.total()}
                    });
                    if let Some(details) = super::encode::cached(&u) {
                        chunk["usage"]["prompt_tokens_details"] = json!(details);
                    }
                    self.frame(0, &chunk.to_string(), &mut out);
                } else {
                    self.at.after += 1;
                }
                self.last_frame("[DONE]", &mut out);
            }
            StreamEvent::Error { code, message, .. } => {
                let (code, kind) = in_band_error(code);
                let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
                self.last_frame(&body.to_string(), &mut out);
            }
        }
        out
    }
}

/// An in-band error's OpenAI `code` and `type`: a provider's refusal keeps
/// OpenAI's own, as an answered error has them (`content_policy_violation`,
/// `invalid_request_error`); anything else is the server's.
fn in_band_error(code: &str) -> (String, &'static str) {
    let why = Refusal::of_stream_code(code);
    match why {
        Refusal::ContentPolicy
        | Refusal::ContextLengthExceeded
        | Refusal::BadRequest(_)
        | Refusal::RateLimited => {
            let (status, code) = refusal_code(&why);
            (code.to_string(), error_type(status))
        }
        _ => (code.to_string(), "server_error"),
    }
}

fn last_event_id(headers: &HeaderMap) -> Option<Position> {
    headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(Position::parse)
}
