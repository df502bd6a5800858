//! An Anthropic Messages request decoded into the domain's job request.
//!
//! System text becomes system turns; content blocks become the canonical
//! turn's text and parts (`image` as an `image_url` part, a text block's
//! `cache_control` kept on its part, so the Anthropic adapter sends it
//! untouched), `tool_use` blocks the assistant's tool calls, each
//! `tool_result` a tool turn (its `is_error` kept). Tools become function
//! tools with their `input_schema` as parameters. What onejob cannot honour
//! is refused with 400 `invalid_request_error` naming the field, never
//! dropped.

use super::error::AnthropicError;
use crate::domain::JobRequest;
use crate::jobs::SubmitError;
use serde_json::{json, Map, Value};

/// Fields of a Messages request onejob carries to the job (or handles
/// itself, as `stream`); any other field is refused.
const ACCEPTED: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "stop_sequences",
    "metadata",
    "output_config",
    "stream",
];

/// Which endpoint the request came to: `count_tokens` takes no
/// `max_tokens` and no sampling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Messages,
    CountTokens,
}

/// A Messages request, decoded.
pub(super) struct Decoded {
    /// The job request. `stream` never enters it, so it is not part of
    /// the fingerprint.
    pub request: JobRequest,
    pub stream: bool,
}

type Invalid = AnthropicError;

fn invalid(field: &str, why: &str) -> Invalid {
    AnthropicError::invalid(field, why)
}

pub(super) fn decode(raw: &[u8], endpoint: Endpoint) -> Result<Decoded, Invalid> {
    let request: Map<String, Value> = serde_json::from_slice(raw)
        .map_err(|e| invalid("body", &format!("not a JSON object: {e}")))?;
    let accepted: &[&str] = match endpoint {
        Endpoint::Messages => ACCEPTED,
        Endpoint::CountTokens => &["model", "messages", "system", "tools", "tool_choice"],
    };
    if let Some(field) = request.keys().find(|k| !accepted.contains(&k.as_str())) {
        return Err(invalid(field, "not supported by onejob"));
    }
    let model = match request.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => return Err(invalid("model", "the name of a route is required")),
    };
    let mut messages = Vec::new();
    match request.get("system") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => messages.push(json!({"role": "system", "content": s})),
        Some(Value::Array(blocks)) => {
            for (i, block) in blocks.iter().enumerate() {
                let field = format!("system[{i}]");
                if block["type"] != "text" {
                    return Err(invalid(&field, "only text blocks"));
                }
                let text = text_of(block, &field)?;
                messages.push(json!({"role": "system", "content": text}));
            }
        }
        Some(_) => return Err(invalid("system", "a string or a list of text blocks")),
    }
    let Some(Value::Array(turns)) = request.get("messages") else {
        return Err(invalid("messages", "a list of messages is required"));
    };
    for (i, turn) in turns.iter().enumerate() {
        decode_turn(i, turn, i + 1 == turns.len(), &mut messages)?;
    }
    let mut params = Map::new();
    match (endpoint, request.get("max_tokens")) {
        (Endpoint::CountTokens, _) => {}
        (Endpoint::Messages, Some(n)) if n.as_u64().is_some_and(|n| n > 0) => {
            params.insert("max_tokens".into(), n.clone());
        }
        (Endpoint::Messages, Some(_)) => {
            return Err(invalid("max_tokens", "a positive integer is required"))
        }
        (Endpoint::Messages, None) => return Err(invalid("max_tokens", "Field required")),
    }
    for name in ["temperature", "top_p"] {
        if let Some(v) = request.get(name).filter(|v| !v.is_null()) {
            // Anthropic's temperature is 0 to 1 (OpenAI's, which a job
            // keeps, goes to 2): this door refuses what its API refuses.
            if v.as_f64().is_some_and(|t| !(0.0..=1.0).contains(&t)) {
                return Err(invalid(name, "must be between 0 and 1"));
            }
            params.insert(name.into(), v.clone());
        }
    }
    match request.get("stop_sequences") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) if list.is_empty() => {}
        Some(list) => {
            params.insert("stop".into(), list.clone());
        }
    }
    match request.get("metadata") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            if let Some(field) = m.keys().find(|k| k.as_str() != "user_id") {
                return Err(invalid(
                    &format!("metadata.{field}"),
                    "not supported by onejob",
                ));
            }
            if let Some(user) = m.get("user_id").filter(|v| !v.is_null()) {
                params.insert("user".into(), user.clone());
            }
        }
        Some(_) => return Err(invalid("metadata", "an object is required")),
    }
    if let Some(tools) = request.get("tools").filter(|v| !v.is_null()) {
        params.insert("tools".into(), Value::Array(decode_tools(tools)?));
    }
    if let Some(choice) = request.get("tool_choice").filter(|v| !v.is_null()) {
        params.insert("tool_choice".into(), decode_tool_choice(choice)?);
        // At most one tool call per turn (the AI SDK's generateObject sends
        // it): Chat Completions' `parallel_tool_calls: false`, which every
        // provider is given in its own spelling.
        match &choice["disable_parallel_tool_use"] {
            Value::Null | Value::Bool(false) => {}
            Value::Bool(true) => {
                params.insert("parallel_tool_calls".into(), json!(false));
            }
            _ => {
                return Err(invalid(
                    "tool_choice.disable_parallel_tool_use",
                    "a boolean is required",
                ))
            }
        }
    }
    if let Some(config) = request.get("output_config").filter(|v| !v.is_null()) {
        if let Some(format) = decode_output_config(config)? {
            params.insert("response_format".into(), format);
        }
    }
    let stream = match request.get("stream") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Bool(true)) => true,
        Some(_) => return Err(invalid("stream", "a boolean is required")),
    };
    let body = json!({ "messages": messages, "params": params, "route": model });
    // The tree just built, read as the job request: nothing is written out
    // to be parsed again.
    let request = JobRequest::from_value(body)
        .map_err(|e| AnthropicError::submit(SubmitError::from(e).into()))?;
    Ok(Decoded { request, stream })
}

/// Anthropic's structured outputs (`output_config.format`, what
/// LangChain's `with_structured_output(method="json_schema")` sends) as
/// the job's `response_format`: the answer is JSON following the schema,
/// whichever provider gives it. Its other settings (`effort`) change the
/// answer and no other wire takes them: refused by name.
fn decode_output_config(config: &Value) -> Result<Option<Value>, Invalid> {
    let Value::Object(config) = config else {
        return Err(invalid("output_config", "an object is required"));
    };
    if let Some(field) = config.keys().find(|k| k.as_str() != "format") {
        return Err(invalid(
            &format!("output_config.{field}"),
            "not supported by onejob",
        ));
    }
    let format = match config.get("format") {
        None | Some(Value::Null) => return Ok(None),
        Some(format) => format,
    };
    if format["type"] != "json_schema" {
        return Err(invalid("output_config.format.type", "\"json_schema\""));
    }
    let Some(schema) = format.get("schema").filter(|s| s.is_object()) else {
        return Err(invalid(
            "output_config.format.schema",
            "a JSON Schema object is required",
        ));
    };
    Ok(Some(json!({
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": true},
    })))
}

fn text_of<'a>(block: &'a Value, field: &str) -> Result<&'a str, Invalid> {
    match block["text"].as_str() {
        // As Anthropic's API says it: an empty block is refused there.
        Some("") => Err(invalid(
            &format!("{field}.text"),
            "text content blocks must be non-empty",
        )),
        Some(text) => Ok(text),
        None => Err(invalid(&format!("{field}.text"), "a string is required")),
    }
}

/// A text or image block as an OpenAI content part (the canonical form),
/// its `cache_control` kept.
fn part_of(block: &Value, field: &str) -> Result<Value, Invalid> {
    let mut part = match block["type"].as_str() {
        Some("text") => json!({"type": "text", "text": text_of(block, field)?}),
        Some("image") => {
            let source = &block["source"];
            let url = match source["type"].as_str() {
                Some("base64") => {
                    let (Some(media_type), Some(data)) =
                        (source["media_type"].as_str(), source["data"].as_str())
                    else {
                        return Err(invalid(
                            &format!("{field}.source"),
                            "media_type and data are required",
                        ));
                    };
                    format!("data:{media_type};base64,{data}")
                }
                Some("url") => match source["url"].as_str() {
                    Some(url) => url.to_string(),
                    None => return Err(invalid(&format!("{field}.source.url"), "a string")),
                },
                _ => {
                    return Err(invalid(
                        &format!("{field}.source.type"),
                        "\"base64\" or \"url\"",
                    ))
                }
            };
            json!({"type": "image_url", "image_url": {"url": url}})
        }
        _ => return Err(invalid(&format!("{field}.type"), "a text or image block")),
    };
    if let Some(cache) = block.get("cache_control").filter(|v| !v.is_null()) {
        part["cache_control"] = cache.clone();
    }
    Ok(part)
}

/// The turns one Anthropic message makes: its text and images as one
/// user or assistant turn, an assistant's `tool_use` blocks as its tool
/// calls, each `tool_result` a tool turn (in block order).
///
/// As Anthropic's API has it, every turn needs content but the last one if
/// it is the assistant's: that one, empty, asks for nothing and is dropped.
fn decode_turn(i: usize, turn: &Value, last: bool, out: &mut Vec<Value>) -> Result<(), Invalid> {
    let field = format!("messages[{i}]");
    let Some(fields) = turn.as_object() else {
        return Err(invalid(&field, "an object is required"));
    };
    if let Some(key) = fields
        .keys()
        .find(|k| !matches!(k.as_str(), "role" | "content"))
    {
        return Err(invalid(
            &format!("{field}.{key}"),
            "not supported by onejob",
        ));
    }
    let role = match turn["role"].as_str() {
        Some(role @ ("user" | "assistant")) => role,
        _ => {
            return Err(invalid(
                &format!("{field}.role"),
                "\"user\" or \"assistant\"",
            ))
        }
    };
    let empty = match &turn["content"] {
        Value::String(text) => text.is_empty(),
        Value::Array(blocks) => blocks.is_empty(),
        _ => false,
    };
    if empty {
        if last && role == "assistant" {
            return Ok(());
        }
        return Err(invalid(
            &format!("{field}.content"),
            "all messages must have non-empty content except for the optional final assistant message",
        ));
    }
    let blocks = match &turn["content"] {
        Value::String(text) => {
            out.push(json!({"role": role, "content": text}));
            return Ok(());
        }
        Value::Array(blocks) => blocks,
        _ => {
            return Err(invalid(
                &format!("{field}.content"),
                "a string or a list of content blocks",
            ))
        }
    };
    // The text and parts of the turn being gathered.
    let mut text = String::new();
    let mut parts: Vec<Value> = Vec::new();
    let mut plain = true;
    let mut calls: Vec<Value> = Vec::new();
    let flush = |text: &mut String,
                 parts: &mut Vec<Value>,
                 plain: &mut bool,
                 calls: &mut Vec<Value>,
                 out: &mut Vec<Value>| {
        if parts.is_empty() && calls.is_empty() {
            return;
        }
        let mut message = json!({"role": role, "content": std::mem::take(text)});
        if !*plain {
            message["parts"] = Value::Array(std::mem::take(parts));
        }
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(std::mem::take(calls));
        }
        parts.clear();
        *plain = true;
        out.push(message);
    };
    for (j, block) in blocks.iter().enumerate() {
        let field = format!("{field}.content[{j}]");
        match (role, block["type"].as_str()) {
            (_, Some("text")) => {
                let part = part_of(block, &field)?;
                text.push_str(text_of(block, &field)?);
                plain &= part.get("cache_control").is_none();
                parts.push(part);
            }
            ("user", Some("image")) => {
                parts.push(part_of(block, &field)?);
                plain = false;
            }
            ("assistant", Some("tool_use")) => {
                let (Some(id), Some(name)) = (block["id"].as_str(), block["name"].as_str()) else {
                    return Err(invalid(&field, "a tool_use block needs an id and a name"));
                };
                let input = block.get("input").cloned().unwrap_or(json!({}));
                if !input.is_object() {
                    return Err(invalid(&format!("{field}.input"), "an object is required"));
                }
                calls.push(json!({
                    "id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()},
                }));
            }
            ("user", Some("tool_result")) => {
                flush(&mut text, &mut parts, &mut plain, &mut calls, out);
                out.push(tool_result(block, &field)?);
            }
            _ => {
                return Err(invalid(
                    &format!("{field}.type"),
                    "onejob takes text, image (user), tool_use (assistant) and tool_result (user) blocks",
                ))
            }
        }
    }
    flush(&mut text, &mut parts, &mut plain, &mut calls, out);
    Ok(())
}

/// A `tool_result` block as a tool turn: its text, answering its call,
/// and `is_error` when the tool failed.
fn tool_result(block: &Value, field: &str) -> Result<Value, Invalid> {
    let Some(id) = block["tool_use_id"].as_str() else {
        return Err(invalid(
            &format!("{field}.tool_use_id"),
            "a string is required",
        ));
    };
    // A tool that failed (pydantic-ai's ModelRetry, the AI SDK's throwing
    // `execute`): kept on the tool turn, so an Anthropic-wire provider is
    // told it as the client said it (and the fingerprint holds it).
    let is_error = match &block["is_error"] {
        Value::Null | Value::Bool(false) => false,
        Value::Bool(true) => true,
        _ => {
            return Err(invalid(
                &format!("{field}.is_error"),
                "a boolean is required",
            ))
        }
    };
    let content = match &block["content"] {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(parts) => {
            let mut text = String::new();
            for (k, part) in parts.iter().enumerate() {
                let field = format!("{field}.content[{k}]");
                if part["type"] != "text" {
                    return Err(invalid(&format!("{field}.type"), "only text blocks"));
                }
                text.push_str(text_of(part, &field)?);
            }
            text
        }
        _ => {
            return Err(invalid(
                &format!("{field}.content"),
                "a string or text blocks",
            ))
        }
    };
    let mut turn = json!({"role": "tool", "tool_call_id": id, "content": content});
    if is_error {
        turn["is_error"] = json!(true);
    }
    Ok(turn)
}

/// Anthropic tools as function tools, `input_schema` as their parameters.
fn decode_tools(tools: &Value) -> Result<Vec<Value>, Invalid> {
    let Some(tools) = tools.as_array() else {
        return Err(invalid("tools", "a list of tools is required"));
    };
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let field = format!("tools[{i}]");
            match tool["type"].as_str() {
                None | Some("custom") => {}
                Some(other) => {
                    return Err(invalid(
                        &format!("{field}.type"),
                        &format!("server tool {other:?} is not supported by onejob; only client tools with an input_schema"),
                    ))
                }
            }
            let Some(name) = tool["name"].as_str().filter(|n| !n.is_empty()) else {
                return Err(invalid(&format!("{field}.name"), "a name is required"));
            };
            let Some(schema) = tool.get("input_schema").filter(|s| s.is_object()) else {
                return Err(invalid(&format!("{field}.input_schema"), "a JSON Schema object is required"));
            };
            let mut function = json!({"name": name, "parameters": schema});
            if let Some(d) = tool.get("description").filter(|d| !d.is_null()) {
                function["description"] = d.clone();
            }
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// Anthropic's `tool_choice` in the canonical (OpenAI) terms.
fn decode_tool_choice(choice: &Value) -> Result<Value, Invalid> {
    match choice["type"].as_str() {
        Some("auto") => Ok(json!("auto")),
        Some("any") => Ok(json!("required")),
        Some("none") => Ok(json!("none")),
        Some("tool") => match choice["name"].as_str() {
            Some(name) => Ok(json!({"type": "function", "function": {"name": name}})),
            None => Err(invalid("tool_choice.name", "a string is required")),
        },
        _ => Err(invalid(
            "tool_choice.type",
            "\"auto\", \"any\", \"tool\" or \"none\"",
        )),
    }
}
