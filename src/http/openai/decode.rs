//! A Chat Completions request decoded into the domain's job request.
//! What onejob cannot honour is refused with 422 naming the field, never
//! dropped.

use super::error::CompatError;
use super::stream::StreamAsk;
use axum::http::StatusCode;
use serde_json::{json, Map, Value};

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
    "logprobs",
    "top_logprobs",
    // Passed on as given to OpenAI-wire providers (`params.openai`).
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "reasoning_effort",
    "verbosity",
];

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
            "role" | "content" | "tool_calls" | "tool_call_id" | "refusal" | "name"
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
    match m.get("name") {
        None | Some(Value::Null) => {}
        Some(Value::String(name)) if !name.is_empty() => {
            message.insert("name".into(), json!(name));
        }
        Some(_) => {
            return Err(CompatError::invalid(
                &format!("messages[{i}].name"),
                "a non-empty string is required",
            ))
        }
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

/// A completion request, decoded: the job request it makes, and what the
/// client asked of the stream when it asked for one.
pub(super) struct Decoded {
    pub job_body: Vec<u8>,
    pub stream: Option<StreamAsk>,
}

/// The job request a completion request makes. `stream` and
/// `stream_options` never enter it, so they are not part of its
/// fingerprint: one intent may be replayed streamed or not.
pub(super) fn decode(raw: &[u8]) -> Result<Decoded, CompatError> {
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
    let stream = (request.get("stream") == Some(&Value::Bool(true))).then(|| StreamAsk {
        include_usage: request
            .get("stream_options")
            .is_some_and(|o| o["include_usage"] == true),
    });
    if request
        .get("n")
        .is_some_and(|n| !n.is_null() && n != &json!(1))
    {
        return Err(CompatError::unsupported(
            "n",
            "only one choice per job (n = 1)",
        ));
    }
    // A job keeps its answer's text and tool calls, not token
    // probabilities: asked for, they could never be given back.
    if request.get("logprobs") == Some(&Value::Bool(true)) {
        return Err(CompatError::unsupported(
            "logprobs",
            "a job's answer keeps no token log probabilities",
        ));
    }
    if request.get("top_logprobs").is_some_and(|v| !v.is_null()) {
        return Err(CompatError::unsupported(
            "top_logprobs",
            "a job's answer keeps no token log probabilities",
        ));
    }
    let parallel_tool_calls = match request.get("parallel_tool_calls") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(CompatError::invalid(
                "parallel_tool_calls",
                "true or false is required",
            ))
        }
    };
    let mut openai = Map::new();
    for name in crate::domain::request::OPENAI_PASS_THROUGH {
        if let Some(v) = request.get(*name).filter(|v| !v.is_null()) {
            openai.insert((*name).to_string(), v.clone());
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
    if let Some(parallel) = parallel_tool_calls {
        params.insert("parallel_tool_calls".into(), json!(parallel));
    }
    if !openai.is_empty() {
        params.insert("openai".into(), Value::Object(openai));
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
    Ok(Decoded {
        job_body: crate::domain::json_text(&body).into_bytes(),
        stream,
    })
}
