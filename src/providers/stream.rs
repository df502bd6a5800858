//! Streamed calls: the provider answers in server-sent events, and each piece
//! of the answer is handed on (as a [`Delta`]) the moment it arrives.
//!
//! How a stream ends is classified like any call (invariant 3): an error
//! status before the stream began is the same definitive or ambiguous answer
//! as an unstreamed call; a stream that began and then broke before the
//! provider said why it stopped — cut, a malformed event, a close — is
//! `unknown`, because the provider has executed (part of) the work. Once
//! it said why it stopped, the answer is whole whatever follows: a close
//! or a cut without the end marker, or [`AFTER_FINISH`] of silence.

use super::classify::{classify_body_error, classify_response, classify_send_error, unknown};
use super::config::Timeouts;
use super::{AttemptOutcome, Failure, Success, Usage};
use crate::domain::{ErrorKind, FinishReason};
use reqwest::RequestBuilder;
use serde_json::Value;
use std::time::Instant;
use tokio::sync::mpsc;

/// One piece of a streamed answer.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Delta {
    /// Assistant text, possibly empty.
    pub content: String,
    /// OpenAI-shaped `delta.tool_calls` entries (`index`, and `id`,
    /// `type`, `function.name` on a call's first piece, then
    /// `function.arguments` fragments).
    pub tool_calls: Vec<Value>,
}

impl Delta {
    pub fn text(content: impl Into<String>) -> Self {
        Delta {
            content: content.into(),
            tool_calls: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.tool_calls.is_empty()
    }
}

/// What a streamed call hears from the provider, passed on as it comes.
#[derive(Debug, Clone, PartialEq)]
pub enum Chunk {
    /// A piece of the answer.
    Piece(Delta),
    /// An event that is no piece (a finish, usage, a keep-alive): the
    /// stream is alive. `finished` once the provider said why it stopped:
    /// the answer is whole, whatever follows (usage, the end marker, the
    /// close).
    Alive { finished: bool },
}

impl Chunk {
    /// The piece, if this is one.
    pub fn piece(self) -> Option<Delta> {
        match self {
            Chunk::Piece(delta) => Some(delta),
            Chunk::Alive { .. } => None,
        }
    }
}

/// Where a streamed call sends what it hears. A closed receiver means
/// nobody wants the rest: the call stops reading.
pub type ChunkSender = mpsc::UnboundedSender<Chunk>;

/// How long a stream whose provider said why it stopped may take to send
/// the rest (its usage, the end marker) and close: after it the answer
/// ends as it stands. A server that holds the connection open after the
/// finish would otherwise keep a whole answer waiting until its stall or
/// stream timeout, and be taken for broken.
pub const AFTER_FINISH: std::time::Duration = std::time::Duration::from_secs(2);

/// How a streamed answer finished, beyond its text.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamFinish {
    /// Why the provider stopped (the answer's [`Success::finish`] too).
    pub finish_reason: FinishReason,
}

/// One server-sent event: its `event:` name (if any) and its `data:` lines.
#[derive(Debug, Clone, PartialEq)]
pub struct SseEvent {
    pub event: Option<String>,
    pub data: String,
}

/// Splits a byte stream into server-sent events, across chunk boundaries.
#[derive(Debug, Default)]
pub struct SseParser {
    buffer: Vec<u8>,
    event: Option<String>,
    data: Vec<String>,
}

impl SseParser {
    /// Feed bytes; returns the events they complete.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<SseEvent>, String> {
        self.buffer.extend_from_slice(bytes);
        let mut events = Vec::new();
        while let Some(end) = self.buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = self.buffer.drain(..=end).collect();
            let line = std::str::from_utf8(&line[..line.len() - 1])
                .map_err(|e| format!("event stream is not UTF-8: {e}"))?;
            let line = line.strip_suffix('\r').unwrap_or(line);
            if line.is_empty() {
                if !self.data.is_empty() {
                    events.push(SseEvent {
                        event: self.event.take(),
                        data: std::mem::take(&mut self.data).join("\n"),
                    });
                }
                self.event = None;
                continue;
            }
            if line.starts_with(':') {
                continue;
            }
            let (field, value) = line.split_once(':').unwrap_or((line, ""));
            let value = value.strip_prefix(' ').unwrap_or(value);
            match field {
                "data" => self.data.push(value.to_string()),
                "event" => self.event = Some(value.to_string()),
                _ => {}
            }
        }
        Ok(events)
    }
}

/// What a wire format's event reader makes of one event.
pub(crate) enum Step {
    /// Nothing to hand on (a ping, a start marker).
    Nothing,
    Piece(Delta),
    /// The answer is complete (`[DONE]`, `message_stop`).
    End,
    /// The provider refused mid-stream (a content filter): definitive.
    Refused(Failure),
    /// The event cannot be read, or reports an error: the outcome is unknown.
    Broken(ErrorKind, String),
}

/// The state a wire format's reader keeps while a stream runs.
pub(crate) trait WireReader: Send {
    fn read(&mut self, event: &SseEvent) -> Step;
    /// Set once the provider said why it stopped.
    fn finish_reason(&self) -> Option<FinishReason>;
    fn usage(&self) -> Option<Usage>;
    fn provider_request_id(&self) -> Option<String>;
    /// The connection closed cleanly: whether that ends the answer (a
    /// close after the finish reason always does; `run_framed` asks this
    /// only before one).
    fn closed(&mut self) -> bool {
        false
    }
}

/// Send a streaming request and read its events with `reader`, handing each
/// piece to `deltas`. Ends as a [`Success`] only when the provider both said
/// why it stopped and closed the stream properly.
pub(crate) async fn run(
    request: RequestBuilder,
    timeouts: &Timeouts,
    reader: impl WireReader,
    deltas: &ChunkSender,
) -> (AttemptOutcome, Option<StreamFinish>) {
    let classify = |status, headers: &reqwest::header::HeaderMap, body: &[u8]| {
        classify_response(status, headers, body, |_| Err("not a success".to_string()))
    };
    run_classified(request, timeouts, reader, deltas, classify).await
}

/// What a framing makes of the bytes it is fed: the events they complete
/// and, when the bytes that follow cannot be framed, how the stream broke
/// (a kind and a message), after those events.
#[derive(Debug, Default)]
pub(crate) struct Framed {
    pub events: Vec<SseEvent>,
    pub broken: Option<(ErrorKind, String)>,
}

/// How a wire format cuts its byte stream into events: server-sent events
/// for most, AWS's binary event stream for Bedrock
/// ([`super::eventstream`]). Each event is handed to the [`WireReader`] as
/// an [`SseEvent`]: its type as `event`, its payload as `data`.
pub(crate) trait Framing: Send {
    fn frame(&mut self, bytes: &[u8]) -> Framed;
}

impl Framing for SseParser {
    fn frame(&mut self, bytes: &[u8]) -> Framed {
        match self.push(bytes) {
            Ok(events) => Framed {
                events,
                broken: None,
            },
            Err(message) => Framed {
                events: Vec::new(),
                broken: Some((ErrorKind::MalformedChunk, message)),
            },
        }
    }
}

/// [`run`], with an error status before the stream began classified by
/// `classify` (a provider's own table) rather than the shared rules.
pub(crate) async fn run_classified(
    request: RequestBuilder,
    timeouts: &Timeouts,
    reader: impl WireReader,
    deltas: &ChunkSender,
    classify: impl FnOnce(reqwest::StatusCode, &reqwest::header::HeaderMap, &[u8]) -> AttemptOutcome,
) -> (AttemptOutcome, Option<StreamFinish>) {
    let framing = SseParser::default();
    run_framed(request, timeouts, framing, reader, deltas, classify).await
}

/// [`run_classified`] over a wire's own `framing` of the byte stream.
pub(crate) async fn run_framed(
    request: RequestBuilder,
    timeouts: &Timeouts,
    mut framing: impl Framing,
    mut reader: impl WireReader,
    deltas: &ChunkSender,
    classify: impl FnOnce(reqwest::StatusCode, &reqwest::header::HeaderMap, &[u8]) -> AttemptOutcome,
) -> (AttemptOutcome, Option<StreamFinish>) {
    let started = Instant::now();
    let first_byte = timeouts.first_byte();
    let mut response = match tokio::time::timeout(first_byte, request.send()).await {
        Err(_) => {
            let message = format!("no response headers within {} ms", first_byte.as_millis());
            return (unknown(ErrorKind::Timeout, message), None);
        }
        Ok(Err(e)) => return (classify_send_error(&e), None),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    if !status.is_success() {
        let headers = response.headers().clone();
        let outcome = match response.bytes().await {
            Ok(body) => classify(status, &headers, &body),
            Err(e) => classify_body_error(status, &e),
        };
        return (outcome, None);
    }
    let mut output = String::new();
    let mut tool_calls: Vec<Value> = Vec::new();
    let mut ended = false;
    let mut told_finished = false;
    while !ended {
        let next = if told_finished {
            // The answer is whole: what is left (usage, the end marker,
            // the close) gets a short while, then the answer is it.
            match tokio::time::timeout(AFTER_FINISH, response.chunk()).await {
                Ok(next) => next,
                Err(_) => {
                    ended = true;
                    break;
                }
            }
        } else {
            response.chunk().await
        };
        let chunk = match next {
            Ok(Some(chunk)) => chunk,
            Ok(None) => {
                ended = told_finished || reader.closed();
                break;
            }
            // Said why it stopped, then cut: the answer is whole.
            Err(_) if told_finished => {
                ended = true;
                break;
            }
            Err(e) => {
                let message = format!(
                    "stream cut after {} characters: {}",
                    output.chars().count(),
                    super::classify::error_chain(&e)
                );
                return (unknown(ErrorKind::StreamCut, message), None);
            }
        };
        let framed = framing.frame(&chunk);
        for event in framed.events {
            let heard = match reader.read(&event) {
                Step::Nothing => Chunk::Alive { finished: false },
                Step::Piece(delta) if delta.is_empty() => Chunk::Alive { finished: false },
                Step::Piece(delta) => {
                    output.push_str(&delta.content);
                    for piece in &delta.tool_calls {
                        merge_tool_call(&mut tool_calls, piece);
                    }
                    Chunk::Piece(delta)
                }
                Step::End => {
                    ended = true;
                    break;
                }
                Step::Refused(failure) => return (AttemptOutcome::Failed(failure), None),
                Step::Broken(kind, message) => return (unknown(kind, message), None),
            };
            let finished = !told_finished && reader.finish_reason().is_some();
            let sent = match heard {
                Chunk::Alive { .. } => deltas.send(Chunk::Alive { finished }),
                piece => deltas.send(piece).and_then(|()| match finished {
                    true => deltas.send(Chunk::Alive { finished }),
                    false => Ok(()),
                }),
            };
            told_finished |= finished;
            if sent.is_err() {
                let message = "the stream's reader went away".to_string();
                return (unknown(ErrorKind::StreamAbandoned, message), None);
            }
        }
        if let Some((kind, message)) = framed.broken.filter(|_| !ended && !told_finished) {
            return (unknown(kind, message), None);
        }
    }
    let Some(finish_reason) = reader.finish_reason().filter(|_| ended) else {
        let message = format!(
            "stream closed after {} characters without {}",
            output.chars().count(),
            if ended {
                "a finish reason"
            } else {
                "its end marker"
            }
        );
        return (unknown(ErrorKind::StreamIncomplete, message), None);
    };
    let success = Success {
        output,
        tool_calls,
        usage: reader.usage(),
        provider_request_id: reader.provider_request_id(),
        latency: started.elapsed(),
        finish: Some(finish_reason.clone()),
    };
    (
        AttemptOutcome::Succeeded(success),
        Some(StreamFinish { finish_reason }),
    )
}

/// Fold one tool-call delta (OpenAI's shape: `index`, then `id`, `type`,
/// `function.name` once and `function.arguments` in fragments) into the
/// whole calls.
pub fn merge_tool_call(calls: &mut Vec<Value>, piece: &Value) {
    let index = piece["index"]
        .as_u64()
        .and_then(|i| usize::try_from(i).ok())
        .unwrap_or(calls.len().saturating_sub(1));
    while calls.len() <= index {
        calls.push(serde_json::json!({"id": "", "type": "function",
            "function": {"name": "", "arguments": ""}}));
    }
    let call = &mut calls[index];
    if let Some(id) = piece["id"].as_str() {
        call["id"] = Value::String(id.to_string());
    }
    let function = &piece["function"];
    for field in ["name", "arguments"] {
        if let Some(part) = function[field].as_str() {
            let whole = format!(
                "{}{part}",
                call["function"][field].as_str().unwrap_or_default()
            );
            call["function"][field] = Value::String(whole);
        }
    }
}

fn parse_json(event: &SseEvent) -> Result<Value, Step> {
    serde_json::from_str(&event.data).map_err(|e| {
        let mut shown: String = event.data.chars().take(80).collect();
        if shown.len() < event.data.len() {
            shown.push('…');
        }
        Step::Broken(
            ErrorKind::MalformedChunk,
            format!("unreadable stream event {shown:?}: {e}"),
        )
    })
}

fn refused(message: &str) -> Step {
    Step::Refused(Failure {
        retryable: false,
        retry_after: None,
        kind: ErrorKind::ContentPolicy,
        message: message.to_string(),
        status: None,
    })
}

/// OpenAI's `chat.completion.chunk` events, ended by `data: [DONE]`.
#[derive(Debug, Default)]
pub(crate) struct OpenAiReader {
    finish_reason: Option<FinishReason>,
    usage: Option<Usage>,
    id: Option<String>,
}

impl WireReader for OpenAiReader {
    fn read(&mut self, event: &SseEvent) -> Step {
        if event.data.trim() == "[DONE]" {
            return Step::End;
        }
        let chunk = match parse_json(event) {
            Ok(v) => v,
            Err(step) => return step,
        };
        if let Some(error) = chunk.get("error") {
            let message = error["message"]
                .as_str()
                .unwrap_or("error event")
                .to_string();
            return Step::Broken(ErrorKind::StreamError, message);
        }
        if self.id.is_none() {
            self.id = chunk["id"].as_str().map(str::to_string);
        }
        if let Some(usage) = Usage::from_wire(&chunk["usage"], "prompt_tokens", "completion_tokens")
        {
            self.usage = Some(usage);
        }
        let Some(choice) = chunk["choices"].get(0) else {
            return Step::Nothing;
        };
        if let Some(reason) = choice["finish_reason"].as_str() {
            if reason == "content_filter" {
                return refused("finish_reason content_filter");
            }
            self.finish_reason = Some(FinishReason::of_openai(reason));
        }
        let delta = &choice["delta"];
        if let Some(refusal) = delta["refusal"].as_str().filter(|r| !r.is_empty()) {
            return refused(refusal);
        }
        Step::Piece(Delta {
            content: delta["content"].as_str().unwrap_or_default().to_string(),
            tool_calls: delta["tool_calls"].as_array().cloned().unwrap_or_default(),
        })
    }

    fn finish_reason(&self) -> Option<FinishReason> {
        self.finish_reason.clone()
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn provider_request_id(&self) -> Option<String> {
        self.id.clone()
    }

    /// Some OpenAI-compatible servers never send `[DONE]`: a clean close
    /// after the finish reason is the end of the answer (and any usage
    /// chunk has come by then). A close before it stays incomplete.
    fn closed(&mut self) -> bool {
        self.finish_reason.is_some()
    }
}

/// Anthropic's Messages events: `message_start`, content blocks and their
/// deltas, `message_delta` (stop reason, output tokens), `message_stop`.
/// Tool-use blocks become OpenAI-shaped tool-call deltas.
#[derive(Debug, Default)]
pub(crate) struct AnthropicReader {
    stop_reason: Option<FinishReason>,
    /// `message_start`'s usage: the prompt's tokens, the cache's among them.
    input: Option<Usage>,
    output_tokens: Option<u64>,
    id: Option<String>,
    /// Content block index → tool call index, for tool-use blocks.
    tools: Vec<(u64, usize)>,
}

fn tokens(v: &Value) -> Option<u64> {
    v.as_u64()
}

impl WireReader for AnthropicReader {
    fn read(&mut self, event: &SseEvent) -> Step {
        let value = match parse_json(event) {
            Ok(v) => v,
            Err(step) => return step,
        };
        let kind = value["type"]
            .as_str()
            .or(event.event.as_deref())
            .unwrap_or_default();
        match kind {
            "message_start" => {
                let message = &value["message"];
                self.id = message["id"].as_str().map(str::to_string);
                self.input = Usage::from_anthropic(&message["usage"]).or_else(|| {
                    let input = tokens(&message["usage"]["input_tokens"])?;
                    Some(Usage::new(input, 0))
                });
                Step::Nothing
            }
            "content_block_start" => {
                let block = &value["content_block"];
                let index = value["index"].as_u64().unwrap_or(0);
                match block["type"].as_str() {
                    Some("tool_use") => {
                        let call = self.tools.len();
                        self.tools.push((index, call));
                        Step::Piece(Delta {
                            content: String::new(),
                            tool_calls: vec![serde_json::json!({
                                "index": call, "id": block["id"], "type": "function",
                                "function": {"name": block["name"], "arguments": ""}
                            })],
                        })
                    }
                    _ => Step::Piece(Delta::text(block["text"].as_str().unwrap_or_default())),
                }
            }
            "content_block_delta" => {
                let delta = &value["delta"];
                let index = value["index"].as_u64().unwrap_or(0);
                match delta["type"].as_str() {
                    Some("text_delta") => {
                        Step::Piece(Delta::text(delta["text"].as_str().unwrap_or_default()))
                    }
                    Some("input_json_delta") => {
                        let call = self
                            .tools
                            .iter()
                            .find(|(block, _)| *block == index)
                            .map_or(0, |(_, call)| *call);
                        Step::Piece(Delta {
                            content: String::new(),
                            tool_calls: vec![serde_json::json!({
                                "index": call,
                                "function": {"arguments": delta["partial_json"]}
                            })],
                        })
                    }
                    _ => Step::Nothing,
                }
            }
            "message_delta" => {
                if let Some(reason) = value["delta"]["stop_reason"].as_str() {
                    if reason == "refusal" {
                        return refused("stop_reason refusal");
                    }
                    let sequence = value["delta"]["stop_sequence"].as_str();
                    self.stop_reason = Some(FinishReason::of_anthropic(reason, sequence));
                }
                if let Some(n) = tokens(&value["usage"]["output_tokens"]) {
                    self.output_tokens = Some(n);
                }
                Step::Nothing
            }
            "message_stop" => Step::End,
            "error" => {
                let message = value["error"]["message"]
                    .as_str()
                    .unwrap_or("error event")
                    .to_string();
                Step::Broken(ErrorKind::StreamError, message)
            }
            _ => Step::Nothing,
        }
    }

    fn finish_reason(&self) -> Option<FinishReason> {
        self.stop_reason.clone()
    }

    fn usage(&self) -> Option<Usage> {
        Some(Usage {
            completion_tokens: self.output_tokens?,
            ..self.input?
        })
    }

    fn provider_request_id(&self) -> Option<String> {
        self.id.clone()
    }
}

/// A stream's pieces gathered into one answer, for a provider that cannot
/// stream (the default [`super::Provider::stream`]): one piece, then done.
pub(crate) fn whole(
    outcome: AttemptOutcome,
    deltas: &ChunkSender,
) -> (AttemptOutcome, Option<StreamFinish>) {
    match &outcome {
        AttemptOutcome::Succeeded(success) => {
            let _ = deltas.send(Chunk::Piece(Delta::text(success.output.clone())));
            let finish = StreamFinish {
                finish_reason: FinishReason::told(
                    success.finish.as_ref(),
                    !success.tool_calls.is_empty(),
                ),
            };
            (outcome, Some(finish))
        }
        _ => (outcome, None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_across_chunks_and_lines() {
        let mut p = SseParser::default();
        assert!(p
            .push(b"event: message_start\ndata: {\"a\"")
            .unwrap()
            .is_empty());
        let events = p.push(b":1}\n\n: ping\r\ndata: [DONE]\r\n\r\n").unwrap();
        assert_eq!(
            events,
            vec![
                SseEvent {
                    event: Some("message_start".into()),
                    data: "{\"a\":1}".into()
                },
                SseEvent {
                    event: None,
                    data: "[DONE]".into()
                }
            ]
        );
    }

    #[test]
    fn openai_content_filter_is_a_refusal() {
        let mut r = OpenAiReader::default();
        let e = SseEvent {
            event: None,
            data: r#"{"choices":[{"delta":{},"finish_reason":"content_filter"}]}"#.into(),
        };
        assert!(matches!(r.read(&e), Step::Refused(f) if f.kind == "content_policy"));
    }
}
