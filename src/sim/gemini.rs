//! The simulator's Gemini wire: `POST /v1beta/models/{model}:generateContent`,
//! `:streamGenerateContent?alt=sse` and `:countTokens`, as AI Studio
//! publishes them.
//!
//! A request is translated into the simulator's own terms (the OpenAI
//! shape its executor reads) and executed by the same code as every wire,
//! under the same ledger; only the answer, the stream and the errors are
//! Gemini's. `countTokens` executes nothing: it counts as the executor's
//! usage does (`wrong_usage` miscounts here too).
//!
//! What a Gemini answer looks like on the wire is in [`encode`], which the
//! shared wire calls: this file translates and dispatches, `encode` only
//! writes bodies, so the two never import each other.

pub(crate) mod encode;

use encode::error_body;

use super::behaviour::{Behaviour, Fault};
use super::wire::{self, Wire};
use super::SimState;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Map, Value};
use std::sync::Arc;

/// Gemini's `Schema` back in JSON Schema's terms: lower-case types,
/// `nullable` as a `null` type.
fn json_schema(schema: &Value) -> Value {
    let Value::Object(fields) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in fields {
        let value = match key.as_str() {
            "type" => {
                let t = json!(value.as_str().unwrap_or_default().to_ascii_lowercase());
                if schema["nullable"] == true {
                    json!([t, "null"])
                } else {
                    t
                }
            }
            "nullable" => continue,
            "properties" => Value::Object(
                value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(k, v)| (k.clone(), json_schema(v)))
                    .collect(),
            ),
            "items" => json_schema(value),
            "anyOf" => Value::Array(
                value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(json_schema)
                    .collect(),
            ),
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    Value::Object(out)
}

fn text_of(parts: &Value) -> String {
    parts
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["text"].as_str())
        .collect()
}

/// A `GenerateContentRequest` in the OpenAI shape the executor reads.
fn translate(model: &str, stream: bool, body: &Value) -> Result<Value, String> {
    let mut messages = Vec::new();
    let system = body
        .get("systemInstruction")
        .or_else(|| body.get("system_instruction"));
    if let Some(system) = system {
        messages.push(json!({"role": "system", "content": text_of(&system["parts"])}));
    }
    let contents = body["contents"]
        .as_array()
        .ok_or("contents: required list")?;
    for (i, content) in contents.iter().enumerate() {
        let role = match content["role"].as_str().unwrap_or("user") {
            "user" => "user",
            "model" => "assistant",
            other => return Err(format!("contents[{i}].role: unexpected role {other:?}")),
        };
        let parts = content["parts"]
            .as_array()
            .ok_or(format!("contents[{i}].parts: required list"))?;
        let mut calls = Vec::new();
        for part in parts {
            if let Some(call) = part.get("functionCall") {
                calls.push(
                    json!({"id": format!("call_{}", calls.len()), "type": "function",
                    "function": {"name": call["name"], "arguments": call["args"].to_string()}}),
                );
            }
            if let Some(response) = part.get("functionResponse") {
                messages.push(json!({"role": "tool", "tool_call_id": response["name"],
                                     "content": response["response"].to_string()}));
            }
        }
        let text = text_of(&content["parts"]);
        if !text.is_empty() || !calls.is_empty() {
            let mut message = json!({"role": role, "content": text});
            if !calls.is_empty() {
                message["tool_calls"] = json!(calls);
            }
            messages.push(message);
        }
    }
    let mut out = json!({"model": model, "messages": messages, "stream": stream,
                         "stream_options": {"include_usage": true}});
    let generation = &body["generationConfig"];
    if let Some(limit) = generation.get("maxOutputTokens") {
        out["max_tokens"] = limit.clone();
    }
    if let Some(schema) = generation.get("responseSchema") {
        out["response_format"] = json!({"type": "json_schema",
            "json_schema": {"name": "output", "schema": json_schema(schema)}});
    } else if generation["responseMimeType"] == "application/json" {
        out["response_format"] = json!({"type": "json_object"});
    }
    let tools: Vec<Value> = body["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|t| {
            t["functionDeclarations"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|f| {
            json!({"type": "function", "function": {"name": f["name"],
                   "parameters": json_schema(&f["parameters"])}})
        })
        .collect();
    if !tools.is_empty() {
        out["tools"] = json!(tools);
    }
    let calling = &body["toolConfig"]["functionCallingConfig"];
    match (
        calling["mode"].as_str(),
        calling.pointer("/allowedFunctionNames/0"),
    ) {
        (Some("ANY"), Some(name)) => {
            out["tool_choice"] = json!({"type": "function", "function": {"name": name}})
        }
        (Some("ANY"), None) => out["tool_choice"] = json!("required"),
        (Some("NONE"), _) => out["tool_choice"] = json!("none"),
        _ => {}
    }
    Ok(out)
}

/// `POST /v1beta/models/{model}:{method}`.
pub(crate) async fn models(
    state: State<Arc<SimState>>,
    Path(model_method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((model, method)) = model_method.rsplit_once(':') else {
        return error_body(404, "expected models/{model}:{method}", None);
    };
    let value: Value = match serde_json::from_slice(&body) {
        Ok(v) => v,
        Err(e) => return error_body(400, &format!("Invalid JSON payload received. {e}"), None),
    };
    match method {
        "generateContent" | "streamGenerateContent" => {
            let stream = method == "streamGenerateContent";
            match translate(model, stream, &value) {
                Ok(translated) => wire::chat_on(state, Wire::Gemini, headers, translated).await,
                Err(m) => error_body(400, &m, None),
            }
        }
        "countTokens" => count_tokens(&state, model, &value),
        other => error_body(404, &format!("method {other:?} is not found"), None),
    }
}

/// `countTokens`: the prompt's tokens, counted as the executor counts its
/// usage. AI Studio's body names a whole request under
/// `generateContentRequest`; its bare `contents` are counted alike.
fn count_tokens(state: &Arc<SimState>, model: &str, body: &Value) -> Response {
    let request = body.get("generateContentRequest").unwrap_or(body);
    let translated = match translate(model, false, request) {
        Ok(t) => t,
        Err(m) => return error_body(400, &m, None),
    };
    let behaviour = state
        .models
        .get(model)
        .map_or_else(|| Behaviour::parse(model), Ok)
        .or_else(|m| state.config.default_behaviour.ok_or(m));
    let fault = match behaviour {
        Ok(b) => b.fault,
        Err(m) => return error_body(404, &m, None),
    };
    let mut tokens = match wire::prompt_tokens_of(&translated) {
        Ok(n) => n,
        Err(m) => return error_body(400, &m, None),
    };
    if fault == Fault::WrongUsage {
        tokens = tokens.saturating_mul(3) / 2 + 1;
    }
    Json(json!({ "totalTokens": tokens })).into_response()
}
