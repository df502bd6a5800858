//! A Chat Completions request decoded into the domain's job request.
//! What onejob cannot honour is refused with 422 naming the field, never
//! dropped.

use super::error::CompatError;
use super::stream::StreamAsk;
use crate::domain::request::{Message, Params, Role};
use crate::domain::JobRequest;
use crate::http::error::ApiError;
use axum::http::StatusCode;
use serde::Deserialize;
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
    content: Option<Value>,
) -> Result<(String, Option<Vec<Value>>), CompatError> {
    let field = || format!("messages[{i}].content");
    match content {
        Some(Value::String(s)) => Ok((s, None)),
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
                                &format!("{}[{j}].text", field()),
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
                            &format!("{}[{j}].image_url.url", field()),
                            "a string is required",
                        ))
                    }
                    _ => {
                        return Err(CompatError::unsupported(
                            &format!("{}[{j}].type", field()),
                            "only text and image_url parts are supported",
                        ))
                    }
                }
            }
            Ok((text, other.then_some(parts)))
        }
        Some(_) => Err(CompatError::invalid(
            &field(),
            "a string or a list of content parts is required",
        )),
    }
}

/// One chat message as a job message.
fn message_of(i: usize, m: Value) -> Result<Message, CompatError> {
    let Value::Object(mut fields) = m else {
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
    let role = match fields.get("role").and_then(Value::as_str) {
        Some("developer" | "system") => Role::System,
        Some("user") => Role::User,
        Some("assistant") => Role::Assistant,
        Some("tool") => Role::Tool,
        _ => {
            return Err(CompatError::invalid(
                &format!("messages[{i}].role"),
                "one of system, developer, user, assistant, tool",
            ))
        }
    };
    let (content, parts) = content_of(i, fields.remove("content"))?;
    let mut message = Message::new(role, content);
    message.parts = parts;
    match fields.remove("name") {
        None | Some(Value::Null) => {}
        Some(Value::String(name)) if !name.is_empty() => message.name = Some(name),
        Some(_) => {
            return Err(CompatError::invalid(
                &format!("messages[{i}].name"),
                "a non-empty string is required",
            ))
        }
    }
    match (role, fields.remove("tool_calls")) {
        (_, None | Some(Value::Null)) => {}
        (Role::Assistant, Some(Value::Array(calls))) => message.tool_calls = Some(calls),
        _ => {
            return Err(CompatError::invalid(
                &format!("messages[{i}].tool_calls"),
                "only an assistant turn carries tool calls",
            ))
        }
    }
    if role == Role::Tool {
        match fields.remove("tool_call_id") {
            Some(Value::String(id)) => message.tool_call_id = Some(id),
            _ => {
                return Err(CompatError::invalid(
                    &format!("messages[{i}].tool_call_id"),
                    "required on a tool turn",
                ))
            }
        }
    }
    Ok(message)
}

/// A completion request, decoded: the job request it makes, and what the
/// client asked of the stream when it asked for one.
pub(super) struct Decoded {
    pub request: JobRequest,
    pub stream: Option<StreamAsk>,
}

/// The job request a completion request makes, built from the request's
/// fields as they were parsed (nothing is written out to be parsed again).
/// `stream` and `stream_options` never enter it, so they are not part of
/// its fingerprint: one intent may be replayed streamed or not.
pub(super) fn decode(raw: &[u8]) -> Result<Decoded, CompatError> {
    let mut request: Map<String, Value> = serde_json::from_slice(raw).map_err(|e| CompatError {
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
    let route = match request.remove("model") {
        Some(Value::String(m)) if !m.is_empty() => m,
        _ => {
            return Err(CompatError::invalid(
                "model",
                "the name of a route is required (GET /v1/models lists them)",
            ))
        }
    };
    // Neither is part of the job, so their types are checked here, where
    // they are read: `"stream": "yes"` once ran a job answered unstreamed.
    match request.get("stream") {
        None | Some(Value::Null | Value::Bool(_)) => {}
        Some(_) => return Err(CompatError::invalid("stream", "must be a boolean")),
    }
    match request.get("stream_options") {
        None | Some(Value::Null) => {}
        Some(Value::Object(o)) => {
            // OpenAI's two options; `include_obfuscation` asks for padding
            // against length side channels, which a stream from here does
            // not carry. Anything else is refused, like any unknown field.
            for (name, value) in o {
                if !matches!(name.as_str(), "include_usage" | "include_obfuscation") {
                    return Err(CompatError::invalid(
                        &format!("stream_options.{name}"),
                        "is not a stream option (include_usage, include_obfuscation)",
                    ));
                }
                if !matches!(value, Value::Null | Value::Bool(_)) {
                    return Err(CompatError::invalid(
                        &format!("stream_options.{name}"),
                        "must be a boolean",
                    ));
                }
            }
        }
        Some(_) => return Err(CompatError::invalid("stream_options", "must be an object")),
    }
    // OpenAI refuses stream options on a request that does not stream (a
    // client that sets them expects a stream, and would not get one).
    let streamed = request.get("stream") == Some(&Value::Bool(true));
    if !streamed && request.get("stream_options").is_some_and(|o| !o.is_null()) {
        return Err(CompatError {
            status: StatusCode::BAD_REQUEST,
            param: Some("stream_options".into()),
            message: "The 'stream_options' parameter is only allowed when 'stream' is enabled."
                .into(),
            ..CompatError::invalid("stream_options", "")
        });
    }
    let stream = streamed.then(|| StreamAsk {
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
        if let Some(v) = request.remove(*name).filter(|v| !v.is_null()) {
            openai.insert((*name).to_string(), v);
        }
    }
    let messages = match request.remove("messages") {
        Some(Value::Array(m)) => m
            .into_iter()
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
    let max_completion_tokens = request
        .remove("max_completion_tokens")
        .filter(|v| !v.is_null());
    let max_tokens = max_completion_tokens.or(request.remove("max_tokens"));
    let mut take = |name: &str| request.remove(name);
    for (name, value) in [
        ("temperature", take("temperature")),
        ("top_p", take("top_p")),
        ("max_tokens", max_tokens),
        ("seed", take("seed")),
        ("user", take("user")),
        ("presence_penalty", take("presence_penalty")),
        ("frequency_penalty", take("frequency_penalty")),
        ("tools", take("tools")),
        ("tool_choice", take("tool_choice")),
    ] {
        if let Some(v) = value.filter(|v| !v.is_null()) {
            params.insert(name.into(), v);
        }
    }
    if let Some(parallel) = parallel_tool_calls {
        params.insert("parallel_tool_calls".into(), json!(parallel));
    }
    if !openai.is_empty() {
        params.insert("openai".into(), Value::Object(openai));
    }
    match request.remove("stop") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            params.insert("stop".into(), json!([s]));
        }
        Some(list) => {
            params.insert("stop".into(), list);
        }
    }
    match request.remove("response_format") {
        None | Some(Value::Null) => {}
        Some(format) if format["type"] == "text" => {}
        Some(format) => {
            params.insert("response_format".into(), format);
        }
    }
    Ok(Decoded {
        request: JobRequest {
            contract: None,
            input: None,
            messages: Some(messages),
            params: params_of(Value::Object(params))?,
            route,
            door: None,
        },
        stream,
    })
}

/// The job's params from the fields the request gave them, refused with
/// the job API's wording (`params.<field>: <why>`) when one has the wrong
/// type.
fn params_of(params: Value) -> Result<Params, CompatError> {
    if let Ok(params) = Params::deserialize(&params) {
        return Ok(params);
    }
    let refused = match serde_path_to_error::deserialize::<_, Params>(params) {
        Ok(params) => return Ok(params),
        Err(e) => {
            let path = e.path().to_string();
            let why = crate::domain::json_error::json_words(&e.into_inner().to_string());
            format!("params.{path}: {why}")
        }
    };
    Err(CompatError::submitted(ApiError::InvalidRequest(refused)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(body: Value) -> Result<Decoded, CompatError> {
        decode(serde_json::to_vec(&body).unwrap().as_slice())
    }

    #[test]
    fn a_completion_request_is_the_job_request_the_jobs_api_would_take() {
        let chat = json!({
            "model": "default",
            "messages": [
                {"role": "developer", "content": "be brief"},
                {"role": "user", "name": "ana", "content": [
                    {"type": "text", "text": "what is "},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    {"type": "text", "text": "this?"}
                ]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}
            ],
            "temperature": 0.5, "top_p": 0.9, "max_tokens": 10, "max_completion_tokens": 64,
            "seed": 7, "user": "u-1", "stop": "END", "presence_penalty": 0.1,
            "frequency_penalty": null, "parallel_tool_calls": false,
            "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
            "response_format": {"type": "json_object"}, "metadata": {"a": "b"},
            "store": false, "stream": true, "stream_options": {"include_usage": true}
        });
        let job = json!({
            "route": "default",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "name": "ana", "content": "what is this?", "parts": [
                    {"type": "text", "text": "what is "},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}},
                    {"type": "text", "text": "this?"}
                ]},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "42"}
            ],
            "params": {
                "temperature": 0.5, "top_p": 0.9, "max_tokens": 64, "seed": 7, "user": "u-1",
                "stop": ["END"], "presence_penalty": 0.1, "parallel_tool_calls": false,
                "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "auto",
                "response_format": {"type": "json_object"},
                "openai": {"metadata": {"a": "b"}, "store": false}
            }
        });
        let got = decoded(chat).unwrap();
        let want = JobRequest::parse(job.to_string().as_bytes()).unwrap();
        assert_eq!(got.request, want);
        assert!(got.stream.is_some_and(|s| s.include_usage));
    }

    #[test]
    fn a_param_of_the_wrong_type_is_refused_by_its_name() {
        for (field, value, path) in [
            (
                "temperature",
                json!("hot"),
                "params.temperature: invalid type",
            ),
            ("stop", json!(["a", 1]), "params.stop[1]: invalid type"),
            ("max_tokens", json!(-1), "params.max_tokens: invalid value"),
        ] {
            let mut body =
                json!({"model": "default", "messages": [{"role": "user", "content": "hi"}]});
            body[field] = value;
            let Err(e) = decoded(body) else {
                panic!("{field} of the wrong type was taken")
            };
            assert_eq!(e.status, StatusCode::UNPROCESSABLE_ENTITY, "{field}");
            assert_eq!(e.code, "invalid_request", "{field}");
            let param = path
                .split(':')
                .next()
                .unwrap()
                .trim_start_matches("params.");
            assert_eq!(e.param.as_deref(), Some(param), "{field}");
            assert!(e.message.starts_with(path), "{field}: {}", e.message);
        }
    }
}
