//! The engine's answer as an Anthropic Message, its stream as Anthropic's
//! events, and a job without an answer as Anthropic's error.

use super::error::{refusal_type, stream_refusal, AnthropicError};
use crate::domain::job::last_failure;
use crate::domain::{Attempt, ErrorKind, Job};
use crate::engine::stream::StreamEvent;
use crate::http::door::{Answer, Refusal, Refused, StreamEncoder};
use crate::providers::Usage;
use serde_json::{json, Value};

/// The Message id of a job: the same for every replay of it.
pub(super) fn message_id(job: &Job) -> String {
    format!("msg_{}", job.id.replace('-', ""))
}

/// A `tool_use` block from a canonical (OpenAI-shaped) tool call.
fn tool_use_block(call: &Value) -> Value {
    let arguments = call.pointer("/function/arguments").and_then(Value::as_str);
    let input = arguments
        .and_then(|a| serde_json::from_str::<Value>(a).ok())
        .filter(Value::is_object)
        .unwrap_or_else(|| json!({}));
    json!({
        "type": "tool_use",
        "id": call["id"],
        "name": call.pointer("/function/name").cloned().unwrap_or(Value::Null),
        "input": input,
    })
}

/// Anthropic's usage: `input_tokens` the prompt tokens no cache served or
/// took, the cache's own counts beside them ([`Usage::to_anthropic`]).
fn usage_of(usage: Usage) -> Value {
    usage.to_anthropic()
}

/// A succeeded job as a Message.
pub(super) fn message(job: &Job, answer: Answer) -> Value {
    let mut content = Vec::new();
    match answer.text {
        Some(text) if !text.is_empty() || answer.tool_calls.is_empty() => {
            content.push(json!({"type": "text", "text": text}));
        }
        None if answer.tool_calls.is_empty() => content.push(json!({"type": "text", "text": ""})),
        _ => {}
    }
    content.extend(answer.tool_calls.iter().map(tool_use_block));
    let (stop_reason, stop_sequence) = answer.finish.anthropic();
    json!({
        "id": message_id(job),
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": usage_of(answer.usage),
    })
}

/// A job without an answer, as the error Anthropic's clients act on: a
/// refusal by the provider is the request's fault (`invalid_request_error`),
/// a finished job answers every replay the same (no retry), a pending one
/// or one in review may be asked again with the same key. `attempts` are
/// the job's (none for a stream's error), read for what the refusal does
/// not keep ([`refusal_type`]).
pub(super) fn refusal(refused: Refused, attempts: &[Attempt]) -> AnthropicError {
    let Refused {
        why,
        message,
        client_may_retry,
    } = refused;
    let (status, kind) = refusal_type(&why, last_failure(attempts));
    let message = match why {
        Refusal::ContextLengthExceeded => format!("prompt is too long: {message}"),
        _ => message,
    };
    AnthropicError {
        retry: client_may_retry,
        ..AnthropicError::new(status, kind, message)
    }
}

/// The error a stream ends with, typed as the answer's by the same
/// [`refusal_type`] (`last_failure`: the job's last failed attempt's kind,
/// which the event carries on the live stream and the stored answer's
/// alike, so a job its provider's overload sent to review is
/// `overloaded_error` on both). One the
/// answer would give as a 4xx (the request's own: its prompt too long,
/// refused, a cancelled job), and a job still pending (`timeout_error`),
/// has the message that answer has, which clients classify by (`prompt is
/// too long: …`); any other has its code first (`stream_cut: …`).
fn stream_error(code: &str, message: &str, last_failure: Option<&ErrorKind>) -> AnthropicError {
    let why = stream_refusal(code);
    let (status, kind) = refusal_type(&why, last_failure);
    if status.is_client_error() || why == Refusal::Pending {
        let message = message.to_string();
        let refused = Refused {
            why,
            message,
            client_may_retry: false,
        };
        return refusal(refused, &[]);
    }
    AnthropicError::new(status, kind, format!("{code}: {message}"))
}

/// The content block being streamed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Block {
    Text,
    ToolUse,
}

/// Writes a job's stream events as Anthropic's: `message_start` (a whole
/// Message, with usage) and a `ping`, then per content block
/// `content_block_start`, its deltas (`text_delta`, `input_json_delta`)
/// and `content_block_stop`, then `message_delta` with the stop reason and
/// the final usage, and `message_stop` — each with its `event:` line (the
/// SDK drops events without one). A stream that cannot finish ends with
/// `event: error`, never with a stop on a truncated answer.
pub(super) struct Encoder {
    id: String,
    started: bool,
    open: Option<Block>,
    /// Index of the open block (the next block's when none is open).
    index: usize,
    /// Blocks started so far.
    blocks: usize,
    /// The prompt's tokens as onejob counts them, for `message_start`.
    input_tokens: u32,
}

impl Encoder {
    /// The encoder of `job`'s stream; `input_tokens` the prompt's tokens,
    /// which `message_start` tells before any provider reported its count.
    pub(super) fn new(job: &Job, input_tokens: u32) -> Self {
        Encoder {
            id: message_id(job),
            started: false,
            open: None,
            index: 0,
            blocks: 0,
            input_tokens,
        }
    }

    fn event(out: &mut String, name: &str, data: &Value) {
        out.push_str("event: ");
        out.push_str(name);
        out.push_str("\ndata: ");
        out.push_str(&data.to_string());
        out.push_str("\n\n");
    }

    fn close(&mut self, out: &mut String) {
        if self.open.take().is_some() {
            Self::event(
                out,
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": self.index}),
            );
        }
    }

    fn open(&mut self, block: Block, start: Value, out: &mut String) {
        self.close(out);
        self.index = self.blocks;
        self.blocks += 1;
        self.open = Some(block);
        Self::event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.index, "content_block": start}),
        );
    }

    fn delta(&self, delta: Value, out: &mut String) {
        Self::event(
            out,
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": self.index, "delta": delta}),
        );
    }

    fn start(&mut self, model: &str, out: &mut String) {
        if self.started {
            return;
        }
        self.started = true;
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0},
        });
        Self::event(
            out,
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
        Self::event(out, "ping", &json!({"type": "ping"}));
    }
}

impl StreamEncoder for Encoder {
    fn encode(&mut self, event: &StreamEvent) -> String {
        let mut out = String::new();
        match event {
            StreamEvent::Start { model, .. } => self.start(model, &mut out),
            StreamEvent::Piece { model, delta } => {
                self.start(model, &mut out);
                if !delta.content.is_empty() {
                    if self.open != Some(Block::Text) {
                        self.open(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                    }
                    self.delta(
                        json!({"type": "text_delta", "text": delta.content}),
                        &mut out,
                    );
                }
                for piece in &delta.tool_calls {
                    // A call's first piece names it; later ones carry
                    // fragments of its arguments.
                    let name = piece.pointer("/function/name").and_then(Value::as_str);
                    if let (Some(id), Some(name)) = (piece["id"].as_str(), name) {
                        let start =
                            json!({"type": "tool_use", "id": id, "name": name, "input": {}});
                        self.open(Block::ToolUse, start, &mut out);
                    }
                    let fragment = piece
                        .pointer("/function/arguments")
                        .and_then(Value::as_str)
                        .unwrap_or_default();
                    if !fragment.is_empty() && self.open == Some(Block::ToolUse) {
                        self.delta(
                            json!({"type": "input_json_delta", "partial_json": fragment}),
                            &mut out,
                        );
                    }
                }
            }
            StreamEvent::Finish {
                model,
                finish_reason,
                usage,
            } => {
                self.start(model, &mut out);
                if self.blocks == 0 {
                    // A Message always has content: an empty answer is one
                    // empty text block.
                    self.open(Block::Text, json!({"type": "text", "text": ""}), &mut out);
                }
                self.close(&mut out);
                let usage = usage.unwrap_or_default();
                let (stop_reason, stop_sequence) = finish_reason.anthropic();
                Self::event(
                    &mut out,
                    "message_delta",
                    &json!({
                        "type": "message_delta",
                        "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                        "usage": usage_of(usage),
                    }),
                );
                Self::event(&mut out, "message_stop", &json!({"type": "message_stop"}));
            }
            StreamEvent::Error {
                code,
                message,
                last_failure,
            } => {
                let error = stream_error(code, message, last_failure.as_ref());
                Self::event(
                    &mut out,
                    "error",
                    &json!({"type": "error", "error": {"type": error.kind, "message": error.message}}),
                );
            }
        }
        out
    }
}
