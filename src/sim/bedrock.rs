//! The simulator's Bedrock wire: `POST /model/{modelId}/converse`,
//! `/converse-stream` and `/count-tokens`, in the shapes of AWS's Converse
//! API reference. Signatures are not checked (the adapter suites' fake
//! Bedrock does that).
//!
//! A request is translated into the simulator's own terms (the OpenAI shape
//! its executor reads) and executed by the same code as every wire, under
//! the same ledger; the OpenAI-shaped answer is then put back into
//! Converse's shape, errors as AWS's (`x-amzn-ErrorType`, `{"message"}`).
//! A tool the request forces when it is the only one offered is how a JSON
//! answer is asked for on this wire: it is executed as a JSON schema, and
//! the JSON comes back as that tool's input (prose, from a model that
//! ignores its instructions, comes back as text). ConverseStream answers in
//! event-stream frames, paced by `gap=MS`; `stream_cut` and `stream_stall`
//! break it after their pieces of text as on the other wires (other
//! stream faults are not simulated here). `count-tokens` executes nothing.

use super::behaviour::{Behaviour, Fault};
use super::wire::{self, Wire};
use super::SimState;
use crate::providers::eventstream;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::stream::{self, BoxStream, StreamExt};
use serde_json::{json, Value};
use std::sync::Arc;

/// An AWS error: its type in `x-amzn-ErrorType`, its message in the body.
fn aws_error(status: u16, error_type: &str, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = (status, Json(json!({ "message": message }))).into_response();
    if let Ok(value) = HeaderValue::from_str(error_type) {
        response.headers_mut().insert("x-amzn-errortype", value);
    }
    response
}

fn text_of(blocks: &Value) -> String {
    blocks
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|b| b["text"].as_str())
        .collect()
}

/// The forced tool that asks for a JSON answer: `toolChoice.tool` naming
/// the only tool offered, with its schema.
fn structured_tool(body: &Value) -> Option<(String, Value)> {
    let config = &body["toolConfig"];
    let name = config.pointer("/toolChoice/tool/name")?.as_str()?;
    let tools = config["tools"].as_array()?;
    match tools.as_slice() {
        [only] if only.pointer("/toolSpec/name").and_then(Value::as_str) == Some(name) => Some((
            name.to_string(),
            only.pointer("/toolSpec/inputSchema/json")
                .cloned()
                .unwrap_or(json!({"type": "object"})),
        )),
        _ => None,
    }
}

/// A Converse request in the OpenAI shape the executor reads.
fn translate(model: &str, body: &Value) -> Result<Value, String> {
    let mut messages = Vec::new();
    for block in body["system"].as_array().into_iter().flatten() {
        messages.push(json!({"role": "system", "content": block["text"]}));
    }
    let turns = body["messages"]
        .as_array()
        .ok_or("1 validation error detected: Value null at 'messages' failed to satisfy constraint: Member must not be null")?;
    for (i, turn) in turns.iter().enumerate() {
        let role = match turn["role"].as_str() {
            Some("user") => "user",
            Some("assistant") => "assistant",
            other => return Err(format!("messages.{i}.role: unexpected role {other:?}")),
        };
        let blocks = turn["content"]
            .as_array()
            .ok_or(format!("messages.{i}.content: required list"))?;
        let mut calls = Vec::new();
        for block in blocks {
            if let Some(tool) = block.get("toolUse") {
                calls.push(json!({"id": tool["toolUseId"], "type": "function",
                    "function": {"name": tool["name"], "arguments": tool["input"].to_string()}}));
            }
            if let Some(result) = block.get("toolResult") {
                let content: String = result["content"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|c| match c.get("json") {
                        Some(j) => j.to_string(),
                        None => c["text"].as_str().unwrap_or_default().to_string(),
                    })
                    .collect();
                messages.push(json!({"role": "tool", "tool_call_id": result["toolUseId"],
                                     "content": content}));
            }
        }
        let text = text_of(&turn["content"]);
        if !text.is_empty() || !calls.is_empty() {
            let mut message = json!({"role": role, "content": text});
            if !calls.is_empty() {
                message["tool_calls"] = json!(calls);
            }
            messages.push(message);
        }
    }
    let mut out = json!({"model": model, "messages": messages, "stream": false});
    let inference = &body["inferenceConfig"];
    for (from, to) in [
        ("maxTokens", "max_tokens"),
        ("temperature", "temperature"),
        ("topP", "top_p"),
        ("stopSequences", "stop"),
    ] {
        if let Some(v) = inference.get(from) {
            out[to] = v.clone();
        }
    }
    if let Some((name, schema)) = structured_tool(body) {
        out["response_format"] =
            json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema}});
        return Ok(out);
    }
    let tools: Vec<Value> = body["toolConfig"]["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            let spec = &t["toolSpec"];
            json!({"type": "function", "function": {"name": spec["name"],
                   "parameters": spec["inputSchema"]["json"]}})
        })
        .collect();
    if !tools.is_empty() {
        out["tools"] = json!(tools);
    }
    let choice = &body["toolConfig"]["toolChoice"];
    if choice.get("any").is_some() {
        out["tool_choice"] = json!("required");
    } else if let Some(name) = choice.pointer("/tool/name") {
        out["tool_choice"] = json!({"type": "function", "function": {"name": name}});
    }
    Ok(out)
}

/// An OpenAI completion as a `ConverseResponse`.
fn converse_response(completion: &Value, structured: Option<&str>) -> Value {
    let message = &completion["choices"][0]["message"];
    let text = message["content"].as_str().unwrap_or_default();
    let mut content = Vec::new();
    let mut stop = match completion["choices"][0]["finish_reason"].as_str() {
        Some("length") => "max_tokens",
        _ => "end_turn",
    };
    match (structured, serde_json::from_str::<Value>(text)) {
        (Some(name), Ok(input)) => {
            stop = "tool_use";
            content.push(json!({"toolUse": {"toolUseId": format!("tooluse_{}", completion["id"].as_str().unwrap_or("sim")),
                "name": name, "input": input}}));
        }
        _ if !text.is_empty() || message["tool_calls"].is_null() => {
            content.push(json!({"text": text}))
        }
        _ => {}
    }
    for call in message["tool_calls"].as_array().into_iter().flatten() {
        stop = "tool_use";
        let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
        content.push(json!({"toolUse": {"toolUseId": call["id"],
            "name": call["function"]["name"],
            "input": serde_json::from_str::<Value>(arguments).unwrap_or(json!({}))}}));
    }
    let usage = &completion["usage"];
    json!({
        "output": {"message": {"role": "assistant", "content": content}},
        "stopReason": stop,
        "usage": {"inputTokens": usage["prompt_tokens"], "outputTokens": usage["completion_tokens"],
                  "totalTokens": usage["total_tokens"]},
        "metrics": {"latencyMs": 1},
    })
}

/// The answer as ConverseStream's events, each one event-stream message,
/// and whether it is a piece of text (where a stream fault may break it).
fn stream_frames(response: &Value) -> Vec<(Vec<u8>, bool)> {
    let event = |kind: &str, payload: Value| {
        let text = payload.pointer("/delta/text").is_some();
        let frame = eventstream::encode(
            &[
                (":event-type", kind),
                (":content-type", "application/json"),
                (":message-type", "event"),
            ],
            payload.to_string().as_bytes(),
        );
        (frame, text)
    };
    let mut out = vec![event("messageStart", json!({"role": "assistant"}))];
    let blocks = response
        .pointer("/output/message/content")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    for (i, block) in blocks.iter().enumerate() {
        if let Some(tool) = block.get("toolUse") {
            out.push(event(
                "contentBlockStart",
                json!({"contentBlockIndex": i, "start": {"toolUse":
                    {"toolUseId": tool["toolUseId"], "name": tool["name"]}}}),
            ));
            out.push(event(
                "contentBlockDelta",
                json!({"contentBlockIndex": i, "delta": {"toolUse": {"input": tool["input"].to_string()}}}),
            ));
        } else {
            let text: Vec<char> = block["text"].as_str().unwrap_or_default().chars().collect();
            for piece in text.chunks(16) {
                let piece: String = piece.iter().collect();
                out.push(event(
                    "contentBlockDelta",
                    json!({"contentBlockIndex": i, "delta": {"text": piece}}),
                ));
            }
        }
        out.push(event("contentBlockStop", json!({"contentBlockIndex": i})));
    }
    out.push(event(
        "messageStop",
        json!({"stopReason": response["stopReason"]}),
    ));
    out.push(event(
        "metadata",
        json!({"usage": response["usage"], "metrics": response["metrics"]}),
    ));
    out
}

fn aborted() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "simulated connection drop",
    )
}

/// ConverseStream's events as the body's stream, under the behaviour the
/// answer was made with: `gap=MS` paces them; `stream_cut` sends the
/// first pieces of text (`tokens=N`, else half) and then cuts the
/// connection, `stream_stall` sends them and then falls silent until the
/// simulator shuts down.
fn event_stream(
    state: &Arc<SimState>,
    frames: Vec<(Vec<u8>, bool)>,
    behaviour: Behaviour,
) -> BoxStream<'static, Result<Bytes, std::io::Error>> {
    let text_at: Vec<usize> = (0..frames.len()).filter(|&i| frames[i].1).collect();
    let mut frames: Vec<Vec<u8>> = frames.into_iter().map(|(frame, _)| frame).collect();
    let cut_after = |after: Option<u32>| {
        let n = after.map_or(text_at.len() / 2, |n| (n as usize).min(text_at.len()));
        // Up to and including the n-th piece of text (or just messageStart).
        if n == 0 {
            1
        } else {
            text_at[n - 1] + 1
        }
    };
    let tail: BoxStream<'static, Result<Bytes, std::io::Error>> = match behaviour.fault {
        Fault::StreamCut => {
            frames.truncate(cut_after(behaviour.after_pieces));
            stream::once(async {
                // One pending poll lets hyper flush the frames sent so far.
                tokio::task::yield_now().await;
                Err(aborted())
            })
            .boxed()
        }
        Fault::StreamStall => {
            frames.truncate(cut_after(behaviour.after_pieces));
            let state = state.clone();
            stream::once(async move {
                state.closing().await;
                Err(aborted())
            })
            .boxed()
        }
        _ => stream::empty().boxed(),
    };
    let gap = behaviour.gap;
    let paced = frames
        .into_iter()
        .enumerate()
        .map(move |(i, f)| async move {
            if let Some(gap) = gap.filter(|_| i > 0) {
                tokio::time::sleep(gap).await;
            }
            Ok(Bytes::from(f))
        });
    stream::iter(paced).then(|f| f).chain(tail).boxed()
}

/// The simulator's OpenAI-shaped error as AWS's.
fn bedrock_error(status: StatusCode, body: &Value) -> Response {
    let error = &body["error"];
    let message = error["message"].as_str().unwrap_or("simulated error");
    let code = error["code"].as_str().unwrap_or_default();
    match status.as_u16() {
        400 if code == "context_length_exceeded" => aws_error(
            400,
            "ValidationException",
            "Input is too long for requested model. (simulated)",
        ),
        400 | 422 => aws_error(400, "ValidationException", message),
        401 | 403 => aws_error(403, "AccessDeniedException", message),
        404 => aws_error(404, "ResourceNotFoundException", message),
        429 => aws_error(
            429,
            "ThrottlingException",
            "Too many requests, please wait before trying again. (simulated)",
        ),
        503 | 529 => aws_error(503, "ServiceUnavailableException", message),
        _ => aws_error(500, "InternalServerException", message),
    }
}

/// `POST /model/{modelId}/{operation}`.
pub(crate) async fn model(
    state: State<Arc<SimState>>,
    Path((model, operation)): Path<(String, String)>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => {
            return aws_error(
                400,
                "ValidationException",
                &format!("Malformed input request: {e}"),
            )
        }
    };
    let stream = match operation.as_str() {
        "converse" => false,
        "converse-stream" => true,
        "count-tokens" => return count_tokens(&state, &model, &value),
        other => {
            return aws_error(
                404,
                "UnknownOperationException",
                &format!("operation {other:?} is not found"),
            )
        }
    };
    let translated = match translate(&model, &value) {
        Ok(t) => t,
        Err(m) => return aws_error(400, "ValidationException", &m),
    };
    let structured = structured_tool(&value).map(|(name, _)| name);
    let sim = state.0.clone();
    let answered = wire::chat_on(state, Wire::OpenAi, headers, translated).await;
    let status = answered.status();
    let behaviour = answered.extensions().get::<Behaviour>().copied();
    let bytes = match axum::body::to_bytes(answered.into_body(), usize::MAX).await {
        Ok(b) => b,
        // The executor dropped the connection after executing: so do we.
        Err(_) => {
            return Response::new(Body::from_stream(futures::stream::once(async {
                Err::<Bytes, _>(std::io::Error::new(
                    std::io::ErrorKind::ConnectionAborted,
                    "simulated connection drop",
                ))
            })))
        }
    };
    let completion: Value = match serde_json::from_slice(&bytes) {
        Ok(v) => v,
        // `malformed_body`: pass the broken body on as it is.
        Err(_) => return (status, bytes).into_response(),
    };
    if !status.is_success() {
        return bedrock_error(status, &completion);
    }
    let response = converse_response(&completion, structured.as_deref());
    if !stream {
        return Json(response).into_response();
    }
    let frames = stream_frames(&response);
    let mut answer = Response::new(Body::from_stream(event_stream(
        &sim,
        frames,
        behaviour.unwrap_or_else(Behaviour::healthy),
    )));
    answer.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/vnd.amazon.eventstream"),
    );
    answer
}

/// `CountTokens`: the prompt's tokens, counted as the executor counts its
/// usage (`wrong_usage` miscounts here too).
fn count_tokens(state: &Arc<SimState>, model: &str, body: &Value) -> Response {
    let Some(converse) = body.pointer("/input/converse") else {
        return aws_error(400, "ValidationException", "input.converse is required");
    };
    let translated = match translate(model, converse) {
        Ok(t) => t,
        Err(m) => return aws_error(400, "ValidationException", &m),
    };
    let behaviour = state
        .models
        .get(model)
        .map_or_else(|| Behaviour::parse(model), Ok)
        .or_else(|m| state.config.default_behaviour.ok_or(m));
    let fault = match behaviour {
        Ok(b) => b.fault,
        Err(m) => return aws_error(404, "ResourceNotFoundException", &m),
    };
    let mut tokens = match wire::prompt_tokens_of(&translated) {
        Ok(n) => n,
        Err(m) => return aws_error(400, "ValidationException", &m),
    };
    if fault == Fault::WrongUsage {
        tokens = tokens.saturating_mul(3) / 2 + 1;
    }
    Json(json!({ "inputTokens": tokens })).into_response()
}
