//! The simulator's HTTP handlers, speaking OpenAI's and Anthropic's
//! published wire formats, and the one place a request is executed.
//!
//! Prompt usage is counted with the simulator's declared tokenizer,
//! `o200k_base`, by the same chat recipe the contract run uses
//! ([`count_prompt_tokens`]), so an honest simulated provider passes the
//! usage-agreement check. (`wrong_usage` reports 1.5 times that count, as a
//! tokenizer with another vocabulary might, and so fails it.) Completion
//! tokens stay approximate: `ceil(chars / 4)`.

use super::behaviour::{Behaviour, Fault};
use super::ledger::{Answer, Recorded};
use super::schema_gen::{generate, prose};
use super::SimState;
use crate::contracts::{count_prompt_tokens, RenderedPrompt};
use crate::domain::fingerprint::{canonical_json, fingerprint};
use crate::domain::request::{Message, Role};
use crate::providers::Usage;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, BoxStream, StreamExt};
use rand::rngs::StdRng;
use rand::SeedableRng;
use serde_json::{json, Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Wire {
    OpenAi,
    Anthropic,
    /// Gemini's requests arrive translated to OpenAI's shape (`super::gemini`).
    Gemini,
}

/// A chat request, whichever wire it came in on.
#[derive(Debug)]
struct SimRequest {
    model: String,
    /// Role and text of every turn, system turns included, in order.
    turns: Vec<(String, String)>,
    schema: Option<Value>,
    stream: bool,
    store: bool,
    metadata: Map<String, Value>,
    /// A trailing assistant turn: the answer continues it.
    prefill: Option<String>,
    /// OpenAI's `stream_options.include_usage`: a usage chunk before `[DONE]`.
    include_usage: bool,
    /// Fingerprint of the body minus `stream`: a key may not be reused with another.
    digest: String,
    seed: u64,
    /// Tools offered: name and parameters schema.
    tools: Vec<(String, Value)>,
    /// `tool_choice` in OpenAI's terms (Anthropic's is translated).
    tool_choice: Option<Value>,
    /// The last turn answers a tool call: the model now answers in text.
    answers_tool: bool,
    /// OpenAI's `response_format: {"type": "json_object"}`.
    json_object: bool,
    /// The token limit asked for (`max_tokens`, or OpenAI's
    /// `max_completion_tokens`).
    max_tokens: Option<u64>,
}

/// Text of a `content` that is a string or a list of `{type:"text",text}`
/// blocks (other blocks, e.g. images or tool use, add no text); `null` is
/// the empty content of an assistant turn that only calls tools.
fn text_of(content: &Value) -> Option<String> {
    match content {
        Value::String(s) => Some(s.clone()),
        Value::Array(blocks) => Some(blocks.iter().filter_map(|b| b["text"].as_str()).collect()),
        Value::Null => Some(String::new()),
        _ => None,
    }
}

/// The tools a request offers, whichever wire it came in on.
fn tools_of(wire: Wire, body: &Value) -> Vec<(String, Value)> {
    body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| {
            let (name, schema) = match wire {
                Wire::OpenAi | Wire::Gemini => {
                    (&t["function"]["name"], &t["function"]["parameters"])
                }
                Wire::Anthropic => (&t["name"], &t["input_schema"]),
            };
            Some((name.as_str()?.to_string(), schema.clone()))
        })
        .collect()
}

/// Anthropic's `tool_choice` in OpenAI's terms.
fn openai_tool_choice(wire: Wire, choice: &Value) -> Option<Value> {
    if choice.is_null() {
        return None;
    }
    Some(match wire {
        Wire::OpenAi | Wire::Gemini => choice.clone(),
        Wire::Anthropic => match choice["type"].as_str() {
            Some("any") => json!("required"),
            Some("none") => json!("none"),
            Some("tool") => json!({"type": "function", "function": {"name": choice["name"]}}),
            _ => json!("auto"),
        },
    })
}

fn parse_request(wire: Wire, body: &Value) -> Result<SimRequest, String> {
    let model = body["model"]
        .as_str()
        .ok_or("model: required string")?
        .to_string();
    let mut turns = Vec::new();
    if wire == Wire::Anthropic {
        if let Some(system) = body.get("system").and_then(text_of) {
            turns.push(("system".to_string(), system));
        }
        if body["max_tokens"].as_u64().is_none() {
            return Err("max_tokens: Field required".into());
        }
    }
    for (i, m) in body["messages"]
        .as_array()
        .ok_or("messages: required list")?
        .iter()
        .enumerate()
    {
        let role = m["role"]
            .as_str()
            .ok_or(format!("messages.{i}.role: required"))?;
        if wire == Wire::Anthropic && !matches!(role, "user" | "assistant") {
            return Err(format!("messages.{i}.role: unexpected role {role:?}"));
        }
        let content = text_of(&m["content"]).ok_or(format!("messages.{i}.content: required"))?;
        turns.push((role.to_string(), content));
    }
    let schema = match wire {
        Wire::OpenAi | Wire::Gemini => body.pointer("/response_format/json_schema/schema"),
        // Structured outputs: the GA `output_config.format`, or the beta's
        // `output_format`.
        Wire::Anthropic => body
            .pointer("/output_config/format/schema")
            .or_else(|| body.pointer("/output_format/schema")),
    }
    .cloned();
    let mut unstreamed = body.clone();
    if let Some(o) = unstreamed.as_object_mut() {
        o.remove("stream");
        o.remove("stream_options");
    }
    // The answer to a prefilled request is the rest of the answer to the
    // request without it: seeded by the turns before the prefill.
    let prefill = match turns.last() {
        Some((role, text)) if role == "assistant" => Some(text.clone()),
        _ => None,
    };
    if prefill.is_some() {
        turns.pop();
    }
    let last = body["messages"].as_array().and_then(|m| m.last());
    let answers_tool = last.is_some_and(|m| {
        m["role"] == "tool"
            || m["content"]
                .as_array()
                .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_result"))
    });
    let seed_text = canonical_json(&json!({"turns": turns, "schema": schema}));
    let seed_hex = fingerprint(&Value::String(seed_text));
    Ok(SimRequest {
        model,
        turns,
        schema,
        stream: body["stream"] == true,
        store: body["store"] == true,
        metadata: body["metadata"].as_object().cloned().unwrap_or_default(),
        prefill,
        include_usage: body["stream_options"]["include_usage"] == true,
        digest: fingerprint(&unstreamed),
        seed: u64::from_str_radix(&seed_hex[..16], 16).unwrap_or(0),
        tools: tools_of(wire, body),
        tool_choice: openai_tool_choice(wire, &body["tool_choice"]),
        answers_tool,
        json_object: body.pointer("/response_format/type") == Some(&json!("json_object")),
        max_tokens: body["max_completion_tokens"]
            .as_u64()
            .or(body["max_tokens"].as_u64()),
    })
}

/// The tokenizer the simulator's provider configs declare.
pub(crate) const SIM_TOKENIZER: &str = "o200k_base";

fn approx_tokens(text: &str) -> u32 {
    u32::try_from(text.chars().count().div_ceil(4)).unwrap_or(u32::MAX)
}

/// Prompt tokens as an honest provider with `o200k_base` reports them. The
/// tokenizer is built once per process (the server warms it at start), so
/// this costs one BPE pass over the prompt. Should the count fail (it cannot
/// for valid UTF-8), the rough `chars / 4` estimate stands in.
fn honest_prompt_tokens(turns: &[(String, String)]) -> u32 {
    let prompt = RenderedPrompt {
        system: None,
        messages: turns
            .iter()
            .map(|(role, text)| {
                let role = match role.as_str() {
                    "system" | "developer" => Role::System,
                    "assistant" => Role::Assistant,
                    "tool" => Role::Tool,
                    _ => Role::User,
                };
                Message::new(role, text.clone())
            })
            .collect(),
    };
    count_prompt_tokens(SIM_TOKENIZER, &prompt)
        .unwrap_or_else(|_| turns.iter().map(|(_, t)| approx_tokens(t) + 3).sum())
}

/// Execute the request: the answer is a pure function of the prompt and schema.
/// The tool a request makes the model call, if it does: the one
/// `tool_choice` names, else the first offered — unless the choice is
/// `none`, or the last turn already answers a tool call and the choice does
/// not force one (`required` or a named function must be called every turn,
/// as instructor's validation re-ask expects).
fn tool_to_call(request: &SimRequest) -> Option<&(String, Value)> {
    let forced = match &request.tool_choice {
        Some(Value::String(choice)) => choice == "required",
        Some(choice) => choice.pointer("/function/name").is_some(),
        None => false,
    };
    if request.tool_choice.as_ref() == Some(&json!("none")) || (request.answers_tool && !forced) {
        return None;
    }
    let named = request
        .tool_choice
        .as_ref()
        .and_then(|c| c.pointer("/function/name"))
        .and_then(Value::as_str);
    match named {
        Some(name) => request.tools.iter().find(|(n, _)| n == name),
        None => request.tools.first(),
    }
}

fn execute(request: &SimRequest, fault: Fault) -> Answer {
    let mut rng = StdRng::seed_from_u64(request.seed);
    let mut tool_calls = Vec::new();
    if let Some((name, parameters)) = tool_to_call(request) {
        let arguments = generate(parameters, &mut rng);
        tool_calls.push(json!({
            "id": format!("call_{}", &uuid::Uuid::new_v4().simple().to_string()[..24]),
            "type": "function",
            "function": {"name": name, "arguments": arguments.to_string()},
        }));
    }
    let output = match &request.schema {
        _ if !tool_calls.is_empty() => String::new(),
        Some(schema) if fault != Fault::IgnoreSystem => {
            let mut value = generate(schema, &mut rng);
            if let (Fault::HallucinateKey, Value::Object(fields)) = (fault, &mut value) {
                fields.insert("confidence_note".into(), json!("invented by the model"));
            }
            value.to_string()
        }
        _ if request.json_object && fault != Fault::IgnoreSystem => {
            json!({ "answer": prose(&mut rng, 12) }).to_string()
        }
        _ => prose(&mut rng, 12),
    };
    let output = match &request.prefill {
        Some(prefill) => output
            .strip_prefix(prefill.as_str())
            .map_or(output.clone(), str::to_string),
        None => output,
    };
    // `max_tokens`: an answer longer than the limit (at `approx_tokens`'
    // four characters a token) is cut there.
    let limit = request
        .max_tokens
        .filter(|_| fault == Fault::MaxTokens && tool_calls.is_empty())
        .and_then(|m| usize::try_from(m.saturating_mul(4)).ok());
    let (output, truncated) = match limit {
        Some(chars) if output.chars().count() > chars => {
            (output.chars().take(chars).collect(), true)
        }
        _ => (output, false),
    };
    let mut prompt_tokens = honest_prompt_tokens(&request.turns);
    if fault == Fault::WrongUsage {
        prompt_tokens = prompt_tokens.saturating_mul(3) / 2 + 1;
    }
    Answer {
        id: format!("sim-{}", uuid::Uuid::new_v4().simple()),
        model: request.model.clone(),
        usage: Usage::new(
            u64::from(prompt_tokens),
            u64::from(approx_tokens(&output).max(u32::from(!tool_calls.is_empty()))),
        ),
        output,
        tool_calls,
        truncated,
    }
}

pub(crate) fn openai_completion(a: &Answer) -> Value {
    let mut message = json!({"role": "assistant", "content": a.output, "refusal": null});
    let mut finish = if a.truncated { "length" } else { "stop" };
    if !a.tool_calls.is_empty() {
        message["tool_calls"] = json!(a.tool_calls);
        if a.output.is_empty() {
            message["content"] = Value::Null;
        }
        finish = "tool_calls";
    }
    json!({
        "id": a.id, "object": "chat.completion", "created": 0, "model": a.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": a.usage.prompt_tokens, "completion_tokens": a.usage.completion_tokens,
                  "total_tokens": a.usage.total()},
    })
}

fn anthropic_message(a: &Answer) -> Value {
    let mut content = Vec::new();
    if !a.output.is_empty() || a.tool_calls.is_empty() {
        content.push(json!({"type": "text", "text": a.output}));
    }
    for call in &a.tool_calls {
        let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
        let input: Value = serde_json::from_str(arguments).unwrap_or(json!({}));
        content.push(json!({"type": "tool_use", "id": call["id"],
                            "name": call["function"]["name"], "input": input}));
    }
    let stop = match (a.truncated, a.tool_calls.is_empty()) {
        (true, _) => "max_tokens",
        (false, true) => "end_turn",
        (false, false) => "tool_use",
    };
    json!({
        "id": a.id, "type": "message", "role": "assistant", "model": a.model,
        "content": content,
        "stop_reason": stop, "stop_sequence": null,
        "usage": {"input_tokens": a.usage.prompt_tokens, "output_tokens": a.usage.completion_tokens},
    })
}

fn error(wire: Wire, status: u16, kind: &str, code: &str, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match wire {
        Wire::OpenAi => {
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
        Wire::Anthropic => json!({"type": "error", "error": {"type": kind, "message": message}}),
        Wire::Gemini => return super::gemini::encode::error_body(status.as_u16(), message, None),
    };
    (status, Json(body)).into_response()
}

type Frames = BoxStream<'static, Result<Bytes, std::io::Error>>;

fn aborted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "simulated connection drop",
    )
}

/// A tool call's JSON arguments in the pieces a stream sends them in.
fn arguments_pieces(call: &Value) -> Vec<String> {
    let arguments: Vec<char> = call["function"]["arguments"]
        .as_str()
        .unwrap_or("{}")
        .chars()
        .collect();
    arguments.chunks(8).map(|c| c.iter().collect()).collect()
}

/// SSE frames of `answer` in the wire's streaming format.
fn sse_frames(wire: Wire, a: &Answer, include_usage: bool) -> Vec<String> {
    let chars: Vec<char> = a.output.chars().collect();
    let pieces: Vec<String> = chars.chunks(16).map(|c| c.iter().collect()).collect();
    let frame = |event: Option<&str>, data: Value| match event {
        Some(e) => format!("event: {e}\ndata: {data}\n\n"),
        None => format!("data: {data}\n\n"),
    };
    let mut frames = Vec::new();
    match wire {
        Wire::OpenAi => {
            let chunk = |delta: Value, finish: Value| {
                json!({"id": a.id, "object": "chat.completion.chunk", "created": 0, "model": a.model,
                       "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
            };
            frames.push(frame(
                None,
                chunk(json!({"role": "assistant", "content": ""}), Value::Null),
            ));
            for p in pieces {
                frames.push(frame(None, chunk(json!({"content": p}), Value::Null)));
            }
            // Tool calls as OpenAI streams them: the id and name first, then
            // the arguments in pieces, each delta naming its call's index.
            for (index, call) in a.tool_calls.iter().enumerate() {
                let head = json!({"index": index, "id": call["id"], "type": "function",
                                  "function": {"name": call["function"]["name"], "arguments": ""}});
                frames.push(frame(
                    None,
                    chunk(json!({"tool_calls": [head]}), Value::Null),
                ));
                for piece in arguments_pieces(call) {
                    let delta = json!({"index": index, "function": {"arguments": piece}});
                    frames.push(frame(
                        None,
                        chunk(json!({"tool_calls": [delta]}), Value::Null),
                    ));
                }
            }
            let finish = match (a.truncated, a.tool_calls.is_empty()) {
                (true, _) => "length",
                (false, true) => "stop",
                (false, false) => "tool_calls",
            };
            frames.push(frame(None, chunk(json!({}), json!(finish))));
            if include_usage {
                frames.push(frame(None, json!({"id": a.id, "object": "chat.completion.chunk", "created": 0,
                    "model": a.model, "choices": [],
                    "usage": {"prompt_tokens": a.usage.prompt_tokens, "completion_tokens": a.usage.completion_tokens,
                              "total_tokens": a.usage.total()}})));
            }
            frames.push("data: [DONE]\n\n".to_string());
        }
        Wire::Anthropic => {
            let mut start = anthropic_message(a);
            start["content"] = json!([]);
            frames.push(frame(
                Some("message_start"),
                json!({"type": "message_start", "message": start}),
            ));
            let mut index = 0;
            if !a.output.is_empty() || a.tool_calls.is_empty() {
                frames.push(frame(
                    Some("content_block_start"),
                    json!({"type": "content_block_start",
                    "index": 0, "content_block": {"type": "text", "text": ""}}),
                ));
                for p in pieces {
                    frames.push(frame(
                        Some("content_block_delta"),
                        json!({"type": "content_block_delta",
                        "index": 0, "delta": {"type": "text_delta", "text": p}}),
                    ));
                }
                frames.push(frame(
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": 0}),
                ));
                index += 1;
            }
            // Each tool call a tool_use block: its input as JSON in pieces.
            for call in &a.tool_calls {
                frames.push(frame(
                    Some("content_block_start"),
                    json!({"type": "content_block_start", "index": index,
                           "content_block": {"type": "tool_use", "id": call["id"],
                                             "name": call["function"]["name"], "input": {}}}),
                ));
                for piece in arguments_pieces(call) {
                    frames.push(frame(
                        Some("content_block_delta"),
                        json!({"type": "content_block_delta", "index": index,
                               "delta": {"type": "input_json_delta", "partial_json": piece}}),
                    ));
                }
                frames.push(frame(
                    Some("content_block_stop"),
                    json!({"type": "content_block_stop", "index": index}),
                ));
                index += 1;
            }
            let stop = match (a.truncated, a.tool_calls.is_empty()) {
                (true, _) => "max_tokens",
                (false, true) => "end_turn",
                (false, false) => "tool_use",
            };
            frames.push(frame(Some("message_delta"), json!({"type": "message_delta",
                "delta": {"stop_reason": stop}, "usage": {"output_tokens": a.usage.completion_tokens}})));
            frames.push(frame(Some("message_stop"), json!({"type": "message_stop"})));
        }
        Wire::Gemini => frames = super::gemini::encode::frames(a),
    }
    frames
}

fn answer_response(
    state: &Arc<SimState>,
    wire: Wire,
    a: &Answer,
    stream: bool,
    behaviour: Behaviour,
    include_usage: bool,
) -> Response {
    let Behaviour {
        fault,
        after_pieces,
        gap,
        ..
    } = behaviour;
    if !stream {
        let body = match wire {
            Wire::OpenAi => openai_completion(a),
            Wire::Anthropic => anthropic_message(a),
            Wire::Gemini => super::gemini::encode::response(a),
        };
        let mut response = Json(body).into_response();
        // The behaviour the answer was made under (a replay's is healthy),
        // for a wire that frames the answer itself (Bedrock's streams).
        response.extensions_mut().insert(behaviour);
        return response;
    }
    let mut frames = sse_frames(wire, a, include_usage);
    // Frames before the first piece of text: OpenAI's role chunk;
    // Anthropic's message_start and content_block_start. After the last:
    // the finish and the end marker (OpenAI), or block stop, message_delta
    // and message_stop (Anthropic).
    let (head, tail_len) = match wire {
        Wire::OpenAi => (1, 2 + usize::from(include_usage)),
        Wire::Anthropic => (2, 3),
        Wire::Gemini => (0, 1),
    };
    let pieces = frames.len() - head - tail_len;
    let keep = |after: Option<u32>| match after {
        Some(n) => head + (n as usize).min(pieces),
        None => frames.len() / 2,
    };
    let tail: Frames = match fault {
        Fault::StreamCut => {
            frames.truncate(keep(after_pieces));
            stream::once(async {
                // One pending poll lets hyper flush the frames sent so far;
                // erroring at once would drop them with the connection.
                tokio::task::yield_now().await;
                Err(aborted())
            })
            .boxed()
        }
        Fault::StreamStall => {
            frames.truncate(keep(after_pieces));
            let state = state.clone();
            stream::once(async move {
                state.closing().await;
                Err(aborted())
            })
            .boxed()
        }
        Fault::StreamMalformed => {
            frames.truncate(keep(after_pieces));
            frames.push("data: {\"choices\": [{\"delta\": {\"content\": \n\n".to_string());
            stream::empty().boxed()
        }
        Fault::StreamNoDone => {
            // What some OpenAI-compatible servers send: everything but the
            // end marker (`[DONE]`, `message_stop`).
            frames.pop();
            stream::empty().boxed()
        }
        Fault::StreamNoClose => {
            frames.pop();
            let state = state.clone();
            stream::once(async move {
                state.closing().await;
                Err(aborted())
            })
            .boxed()
        }
        Fault::StreamNoFinish => {
            frames.truncate(head + pieces);
            stream::empty().boxed()
        }
        _ => stream::empty().boxed(),
    };
    let paced = frames
        .into_iter()
        .enumerate()
        .map(move |(i, f)| async move {
            if let Some(gap) = gap.filter(|_| i > 0) {
                tokio::time::sleep(gap).await;
            }
            Ok(Bytes::from(f))
        });
    let body: Frames = stream::iter(paced).then(|f| f).chain(tail).boxed();
    let mut response = Response::new(Body::from_stream(body));
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    response
}

pub(crate) async fn openai_chat(
    state: State<Arc<SimState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat(state, Wire::OpenAi, headers, body).await
}

pub(crate) async fn anthropic_messages(
    state: State<Arc<SimState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    chat(state, Wire::Anthropic, headers, body).await
}

/// A request already decoded to the OpenAI shape (Gemini's, translated),
/// answered on `wire`.
pub(crate) async fn chat_on(
    state: State<Arc<SimState>>,
    wire: Wire,
    headers: HeaderMap,
    body: Value,
) -> Response {
    chat(state, wire, headers, Bytes::from(body.to_string())).await
}

/// The prompt tokens the executor would report for an OpenAI-shaped body.
/// Anthropic's `POST /v1/messages/count_tokens`: the prompt's tokens,
/// counted as the executor counts its usage (`wrong_usage` miscounts here
/// too); nothing is executed or recorded.
pub(crate) async fn anthropic_count_tokens(
    State(state): State<Arc<SimState>>,
    body: Bytes,
) -> Response {
    let invalid = |m: &str| {
        error(
            Wire::Anthropic,
            400,
            "invalid_request_error",
            "invalid_request",
            m,
        )
    };
    let mut value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return invalid(&format!("body is not JSON: {e}")),
    };
    if value.get("max_tokens").is_some() {
        return invalid("max_tokens: Extra inputs are not permitted");
    }
    // The Messages parser asks for one; a count has none.
    value["max_tokens"] = json!(1);
    let request = match parse_request(Wire::Anthropic, &value) {
        Ok(r) => r,
        Err(m) => return invalid(&m),
    };
    let behaviour = state
        .models
        .get(&request.model)
        .map_or_else(|| Behaviour::parse(&request.model), Ok)
        .or_else(|m| state.config.default_behaviour.ok_or(m));
    let mut tokens = honest_prompt_tokens(&request.turns);
    if behaviour.is_ok_and(|b| b.fault == Fault::WrongUsage) {
        tokens = tokens.saturating_mul(3) / 2 + 1;
    }
    Json(json!({ "input_tokens": tokens })).into_response()
}

pub(crate) fn prompt_tokens_of(body: &Value) -> Result<u32, String> {
    parse_request(Wire::OpenAi, body).map(|r| honest_prompt_tokens(&r.turns))
}

async fn chat(
    State(state): State<Arc<SimState>>,
    wire: Wire,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let invalid = |m: &str| error(wire, 400, "invalid_request_error", "invalid_request", m);
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return invalid(&format!("body is not JSON: {e}")),
    };
    let mut request = match parse_request(wire, &value) {
        Ok(r) => r,
        Err(m) => return invalid(&m),
    };
    let bound = state.models.get(&request.model);
    let mut behaviour = match bound.map_or_else(|| Behaviour::parse(&request.model), Ok) {
        Ok(b) => b,
        Err(m) => match state.config.default_behaviour {
            Some(b) => b,
            None => return error(wire, 404, "not_found_error", "model_not_found", &m),
        },
    };
    // Another answer to the same prompt: another seed.
    request.seed = request
        .seed
        .wrapping_add(behaviour.variant.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let key = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    if let Some(k) = key.as_deref() {
        state.ledger.note_delivery(k);
        if let Some(traceparent) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
            state.ledger.note_traceparent(k, traceparent);
        }
    }
    let reused = || invalid("Idempotency-Key was already used with another request body");
    // A recorded key is answered from the ledger whatever the behaviour now.
    if let Some(recorded) = key
        .as_deref()
        .and_then(|k| state.ledger.recorded(k, &request.digest))
    {
        return match recorded {
            Recorded::Replayed(answer) | Recorded::Executed(answer) => {
                let mut response = answer_response(
                    &state,
                    wire,
                    &answer,
                    request.stream,
                    Behaviour::healthy(),
                    request.include_usage,
                );
                response
                    .headers_mut()
                    .insert("idempotent-replayed", HeaderValue::from_static("true"));
                response
            }
            Recorded::KeyReused => reused(),
        };
    }
    if behaviour.fault != Fault::Healthy && !state.meets_fault(&request.model, behaviour.times) {
        behaviour.fault = Fault::Healthy;
    }
    match behaviour.fault {
        Fault::Hang => {
            state.closing().await;
            return error(
                wire,
                503,
                "api_error",
                "shutting_down",
                "simulator shutting down",
            );
        }
        Fault::Reject => return invalid("simulated rejection"),
        Fault::NoPrefill if request.prefill.is_some() => {
            return invalid("this model does not continue a trailing assistant message")
        }
        Fault::Fail(status) => {
            return error(
                wire,
                status,
                "api_error",
                "server_error",
                "simulated failure",
            )
        }
        Fault::Overloaded => {
            return error(wire, 529, "overloaded_error", "overloaded", "Overloaded")
        }
        Fault::ContextLength if wire == Wire::Gemini => {
            let tokens = honest_prompt_tokens(&request.turns);
            let message = format!(
                "The input token count ({tokens}) exceeds the maximum number of tokens \
                 allowed (simulated)."
            );
            return super::gemini::encode::error_body(400, &message, None);
        }
        Fault::ContentFilter if wire == Wire::Gemini => {
            let tokens = honest_prompt_tokens(&request.turns);
            let blocked = json!({"promptFeedback": {"blockReason": "SAFETY"},
                "usageMetadata": {"promptTokenCount": tokens, "totalTokenCount": tokens}});
            if !request.stream {
                return Json(blocked).into_response();
            }
            // Streamed (`?alt=sse`), Gemini says it as the stream's one event.
            let mut response = Response::new(Body::from(format!("data: {blocked}\r\n\r\n")));
            response.headers_mut().insert(
                axum::http::header::CONTENT_TYPE,
                HeaderValue::from_static("text/event-stream"),
            );
            return response;
        }
        Fault::RateLimit { retry_after_s } if wire == Wire::Gemini => {
            let message = "Resource has been exhausted (e.g. check quota) (simulated).";
            return super::gemini::encode::error_body(429, message, Some(retry_after_s));
        }
        Fault::ContextLength => {
            let tokens = honest_prompt_tokens(&request.turns);
            return error(
                wire,
                400,
                "invalid_request_error",
                "context_length_exceeded",
                &format!(
                    "This model's maximum context length is smaller than the {tokens} tokens \
                     of your messages (simulated). Please reduce the length of the messages."
                ),
            );
        }
        Fault::ContentFilter => {
            return error(
                wire,
                400,
                "invalid_request_error",
                "content_policy_violation",
                "Your request was rejected as a result of our safety system (simulated content filter).",
            )
        }
        Fault::RateLimit { retry_after_s } => {
            let mut response = error(
                wire,
                429,
                "rate_limit_error",
                "rate_limit_exceeded",
                "simulated rate limit",
            );
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from(retry_after_s));
            return response;
        }
        _ => {}
    }
    let answer = match &key {
        Some(k) => match state
            .ledger
            .execute_once(k, &request.digest, || execute(&request, behaviour.fault))
        {
            Recorded::Executed(a) | Recorded::Replayed(a) => a,
            Recorded::KeyReused => return reused(),
        },
        None => execute(&request, behaviour.fault),
    };
    if request.store && wire == Wire::OpenAi {
        state.store(request.metadata.clone(), openai_completion(&answer));
    }
    if let Some(latency) = behaviour.latency.or(state.config.default_latency) {
        tokio::time::sleep(latency.sample()).await;
    }
    if let Some(tail) = behaviour.tail {
        let n = state
            .tailed
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        tokio::time::sleep(tail.wait_of(n)).await;
    }
    match behaviour.fault {
        Fault::DropResponse => Response::new(Body::from_stream(stream::once(async {
            Err::<Bytes, _>(aborted())
        }))),
        Fault::MalformedBody => {
            let mut response = Response::new(Body::from(
                "{\"id\": \"sim-malformed\", \"choices\": [{\"mess",
            ));
            response
                .headers_mut()
                .insert("content-type", HeaderValue::from_static("application/json"));
            response
        }
        Fault::SlowFirstByte(wait) => {
            tokio::time::sleep(wait).await;
            answer_response(
                &state,
                wire,
                &answer,
                request.stream,
                behaviour,
                request.include_usage,
            )
        }
        fault => answer_response(
            &state,
            wire,
            &answer,
            request.stream,
            Behaviour { fault, ..behaviour },
            request.include_usage,
        ),
    }
}

/// `GET /v1/chat/completions?metadata[K]=V`: stored completions matching every filter.
pub(crate) async fn list_stored(
    State(state): State<Arc<SimState>>,
    Query(query): Query<HashMap<String, String>>,
) -> Json<Value> {
    let filters: Vec<(&str, &str)> = query
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix("metadata[")?.strip_suffix(']')?, v.as_str())))
        .collect();
    let data = state.stored_matching(&filters);
    let id = |c: Option<&Value>| c.map_or(Value::Null, |c| c["id"].clone());
    Json(
        json!({"object": "list", "first_id": id(data.first()), "last_id": id(data.last()),
                "has_more": false, "data": data}),
    )
}

/// `PUT /sim/models/NAME` with a behaviour spec as the body: from now on
/// requests for model NAME behave that way.
pub(crate) async fn set_model(
    State(state): State<Arc<SimState>>,
    axum::extract::Path(model): axum::extract::Path<String>,
    body: String,
) -> Response {
    match state.models.set(&model, body.trim()) {
        Ok(()) => (StatusCode::NO_CONTENT, "").into_response(),
        Err(m) => (StatusCode::UNPROCESSABLE_ENTITY, m).into_response(),
    }
}

/// `GET /sim/ledger?key=K`.
pub(crate) async fn ledger(
    State(state): State<Arc<SimState>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let Some(key) = query.get("key") else {
        return error(
            Wire::OpenAi,
            400,
            "invalid_request_error",
            "missing_key",
            "key is required",
        );
    };
    Json(
        json!({"key": key, "executions": state.ledger.executions(key),
                "answer": state.ledger.answer(key),
                "traceparents": state.ledger.traceparents(key)}),
    )
    .into_response()
}
