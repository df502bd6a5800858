//! Anthropic Messages API (`POST /v1/messages`).
//!
//! The wire format differs from OpenAI's in ways the adapter owns: the system
//! prompt is a top-level field, turns must alternate user/assistant starting
//! with user (consecutive same-role turns are merged), and `max_tokens` is
//! required. Anthropic offers neither idempotency keys nor lookup, so an
//! unknown attempt here can only be settled by a late answer or by a human.

use super::classify::{classify_response, error_chain};
use super::config::{ProviderConfig, Secret, Timeouts, DEFAULT_ANTHROPIC_MAX_TOKENS};
use super::stream::{self, AnthropicReader, ChunkSender};
use super::transport::exchange;
use super::{AttemptOutcome, ChatRequest, Failure, Lookup, Provider, Streamed, Success, Usage};
use crate::domain::request::{Message, Role};
use crate::domain::{ErrorKind, FinishReason};
use async_trait::async_trait;
use serde_json::{json, Map, Value};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    name: String,
    client: reqwest::Client,
    base: String,
    model: String,
    api_key: Option<Secret>,
    version: String,
    /// Sent as `max_tokens` when the job sets no limit (the API requires one).
    default_max_tokens: u32,
    timeouts: Timeouts,
}

impl AnthropicProvider {
    pub fn new(
        name: &str,
        config: &ProviderConfig,
        client: reqwest::Client,
        api_key: Option<Secret>,
    ) -> Self {
        AnthropicProvider {
            name: name.to_string(),
            client,
            base: config.base().to_string(),
            model: config.model.clone(),
            api_key,
            version: config.anthropic_version().to_string(),
            default_max_tokens: config
                .required_max_tokens()
                .unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS),
            timeouts: config.timeouts,
        }
    }
}

/// A turn's content: plain text (merged with a neighbour of the same role
/// by a blank line), or content blocks (tool use, tool results, images).
enum Content {
    Text(String),
    Blocks(Vec<Value>),
}

impl Content {
    fn into_blocks(self) -> Vec<Value> {
        match self {
            Content::Text(t) => vec![json!({"type": "text", "text": t})],
            Content::Blocks(b) => b,
        }
    }

    fn into_value(self) -> Value {
        match self {
            Content::Text(t) => json!(t),
            Content::Blocks(b) => Value::Array(b),
        }
    }
}

/// An OpenAI content part as an Anthropic block (`image_url` becomes an
/// `image` block from a URL or a base64 `data:` URL). A part's
/// `cache_control` (from the Messages door) goes through untouched.
fn part_block(part: &Value) -> Result<Value, String> {
    let mut block = part_kind_block(part)?;
    if let Some(cache) = part.get("cache_control") {
        block["cache_control"] = cache.clone();
    }
    Ok(block)
}

fn part_kind_block(part: &Value) -> Result<Value, String> {
    match part["type"].as_str() {
        Some("text") => Ok(json!({"type": "text", "text": part["text"]})),
        Some("image_url") => {
            let url = part
                .pointer("/image_url/url")
                .and_then(Value::as_str)
                .ok_or("image_url part without a url")?;
            let source = match url
                .strip_prefix("data:")
                .and_then(|rest| rest.split_once(";base64,"))
            {
                Some((media_type, data)) => {
                    json!({"type": "base64", "media_type": media_type, "data": data})
                }
                None => json!({"type": "url", "url": url}),
            };
            Ok(json!({"type": "image", "source": source}))
        }
        other => Err(format!("content part of type {other:?} is not supported")),
    }
}

/// A turn in Anthropic's terms: its role and content.
fn turn_of(m: &Message) -> Result<(&'static str, Content), String> {
    match m.role {
        Role::System => Err("system turns are placed top-level".into()),
        Role::Tool => {
            let mut result = json!({
                "type": "tool_result",
                "tool_use_id": m.tool_call_id.as_deref().unwrap_or_default(),
                "content": m.content,
            });
            // A tool's failure, as the Messages door was told it.
            if m.is_error == Some(true) {
                result["is_error"] = json!(true);
            }
            Ok(("user", Content::Blocks(vec![result])))
        }
        Role::User | Role::Assistant => {
            let role = if m.role == Role::User {
                "user"
            } else {
                "assistant"
            };
            let mut blocks = match &m.parts {
                Some(parts) => parts
                    .iter()
                    .map(part_block)
                    .collect::<Result<Vec<_>, _>>()?,
                None if m.tool_calls.is_none() => {
                    return Ok((role, Content::Text(m.content.clone())))
                }
                None if m.content.is_empty() => Vec::new(),
                None => vec![json!({"type": "text", "text": m.content})],
            };
            for call in m.tool_calls.iter().flatten() {
                let arguments = call.pointer("/function/arguments").and_then(Value::as_str);
                let input: Value = match arguments {
                    Some(text) if !text.trim().is_empty() => serde_json::from_str(text)
                        .map_err(|e| format!("tool call arguments are not JSON: {e}"))?,
                    _ => json!({}),
                };
                blocks.push(json!({
                    "type": "tool_use",
                    "id": call["id"],
                    "name": call.pointer("/function/name").cloned().unwrap_or(Value::Null),
                    "input": input,
                }));
            }
            Ok((role, Content::Blocks(blocks)))
        }
    }
}

/// OpenAI's `tool_choice` in Anthropic's terms.
fn tool_choice(choice: &Value) -> Value {
    match choice {
        Value::String(s) if s == "required" => json!({"type": "any"}),
        Value::String(s) if s == "none" => json!({"type": "none"}),
        Value::Object(_) => json!({"type": "tool", "name": choice.pointer("/function/name")}),
        _ => json!({"type": "auto"}),
    }
}

/// The request body in Anthropic's wire format, or why the conversation
/// cannot be expressed in it (the request is then never sent). The API
/// requires `max_tokens`: a request without a limit is sent with
/// `default_max_tokens` (the provider file's).
pub fn request_body(
    model: &str,
    request: &ChatRequest,
    default_max_tokens: u32,
) -> Result<Value, String> {
    let options = &request.options;
    for (name, given) in [
        ("seed", options.seed.is_some()),
        ("presence_penalty", options.presence_penalty.is_some()),
        ("frequency_penalty", options.frequency_penalty.is_some()),
    ] {
        if given {
            return Err(format!(
                "{name} is not supported by the Anthropic wire format"
            ));
        }
    }
    let mut system: Vec<&str> = request.system.iter().map(String::as_str).collect();
    let mut turns: Vec<(&'static str, Content)> = Vec::new();
    for m in &request.messages {
        if m.role == Role::System {
            system.push(&m.content);
            continue;
        }
        let (role, content) = turn_of(m)?;
        match (turns.last_mut(), content) {
            (Some((last, Content::Text(text))), Content::Text(more)) if *last == role => {
                text.push_str("\n\n");
                text.push_str(&more);
            }
            (Some((last, previous)), content) if *last == role => {
                let mut blocks =
                    std::mem::replace(previous, Content::Blocks(Vec::new())).into_blocks();
                blocks.extend(content.into_blocks());
                *previous = Content::Blocks(blocks);
            }
            (_, content) => turns.push((role, content)),
        }
    }
    match turns.first() {
        Some(("user", _)) => {}
        Some(_) => return Err("the first turn must be a user turn".into()),
        None => return Err("at least one user turn is required".into()),
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content.into_value()}))
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert(
        "max_tokens".into(),
        json!(request.max_tokens.unwrap_or(default_max_tokens)),
    );
    if !system.is_empty() {
        body.insert("system".into(), json!(system.join("\n\n")));
    }
    body.insert("messages".into(), Value::Array(messages));
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(stop) = &options.stop {
        body.insert("stop_sequences".into(), json!(stop));
    }
    if let Some(user) = &options.user {
        body.insert("metadata".into(), json!({"user_id": user}));
    }
    if let Some(tools) = &options.tools {
        let tools: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                let mut tool = json!({
                    "name": f["name"],
                    "input_schema": f.get("parameters").cloned().unwrap_or(json!({"type": "object"})),
                });
                if let Some(d) = f.get("description") {
                    tool["description"] = d.clone();
                }
                tool
            })
            .collect();
        body.insert("tools".into(), Value::Array(tools));
    }
    if let Some(choice) = &options.tool_choice {
        body.insert("tool_choice".into(), tool_choice(choice));
    }
    if let Some(schema) = &request.response_schema {
        // Structured outputs, GA form (`output_config.format`): the answer
        // is JSON that follows the schema, as OpenAI's json_schema asks.
        body.insert(
            "output_config".into(),
            json!({"format": {"type": "json_schema", "schema": schema}}),
        );
    }
    if options.parallel_tool_calls == Some(false) && options.tools.is_some() {
        // Anthropic's spelling: a flag on the tool choice (auto by default).
        let choice = body
            .entry("tool_choice")
            .or_insert_with(|| json!({"type": "auto"}));
        if let Some(choice) = choice.as_object_mut() {
            if choice.get("type").and_then(Value::as_str) != Some("none") {
                choice.insert("disable_parallel_tool_use".into(), json!(true));
            }
        }
    }
    Ok(Value::Object(body))
}

/// Read a Messages API answer: the text blocks concatenated. A `refusal`
/// stop is a definitive failure.
pub fn message_to_success(
    message: &Value,
    latency: Duration,
) -> Result<Result<Success, Failure>, String> {
    if message["stop_reason"] == "refusal" {
        return Ok(Err(Failure {
            retryable: false,
            retry_after: None,
            kind: ErrorKind::ContentPolicy,
            message: "stop_reason refusal".into(),
            status: None,
        }));
    }
    let blocks = message["content"]
        .as_array()
        .ok_or("content is not a list of blocks")?;
    let output: String = blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect();
    let tool_calls: Vec<Value> = blocks
        .iter()
        .filter(|b| b["type"] == "tool_use")
        .map(|b| {
            json!({"id": b["id"], "type": "function",
                   "function": {"name": b["name"], "arguments": b["input"].to_string()}})
        })
        .collect();
    let usage = Usage::from_anthropic(&message["usage"]);
    let finish = message["stop_reason"]
        .as_str()
        .map(|reason| FinishReason::of_anthropic(reason, message["stop_sequence"].as_str()));
    Ok(Ok(Success {
        output,
        tool_calls,
        usage,
        provider_request_id: message["id"].as_str().map(str::to_string),
        latency,
        finish,
    }))
}

#[async_trait]
impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        &self.name
    }

    async fn call(&self, request: &ChatRequest) -> AttemptOutcome {
        let body = match request_body(&self.model, request, self.default_max_tokens) {
            Ok(body) => body,
            Err(message) => {
                return AttemptOutcome::Failed(Failure {
                    retryable: false,
                    retry_after: None,
                    kind: ErrorKind::InvalidPrompt,
                    message,
                    status: None,
                })
            }
        };
        let mut builder = self
            .client
            .post(format!("{}/v1/messages", self.base))
            .header("anthropic-version", &self.version)
            // Anthropic ignores it today; sent so a gateway in front can dedupe.
            .header("Idempotency-Key", &request.idempotency_key)
            .json(&body);
        if let Some(key) = &self.api_key {
            builder = builder.header("x-api-key", key.expose());
        }
        let outcome = match exchange(builder, &self.timeouts).await {
            Ok(response) => {
                let latency = response.latency;
                classify_response(response.status, &response.headers, &response.body, |b| {
                    let value: Value = serde_json::from_slice(b).map_err(|e| error_chain(&e))?;
                    message_to_success(&value, latency)
                })
            }
            Err(outcome) => outcome,
        };
        super::trace_outcome(&outcome, &request.idempotency_key);
        outcome
    }

    /// Streamed, with `stream: true`. A trailing assistant turn is sent as
    /// it is: the Messages API continues it (prefill).
    async fn stream(&self, request: &ChatRequest, deltas: &ChunkSender) -> Streamed {
        let mut body = match request_body(&self.model, request, self.default_max_tokens) {
            Ok(body) => body,
            Err(message) => {
                let failure = Failure {
                    retryable: false,
                    retry_after: None,
                    kind: ErrorKind::InvalidPrompt,
                    message,
                    status: None,
                };
                return (AttemptOutcome::Failed(failure), None);
            }
        };
        body["stream"] = json!(true);
        let mut builder = self
            .client
            .post(format!("{}/v1/messages", self.base))
            .header("anthropic-version", &self.version)
            .header("Idempotency-Key", &request.idempotency_key)
            .json(&body);
        if let Some(key) = &self.api_key {
            builder = builder.header("x-api-key", key.expose());
        }
        let streamed =
            stream::run(builder, &self.timeouts, AnthropicReader::default(), deltas).await;
        super::trace_outcome(&streamed.0, &request.idempotency_key);
        streamed
    }

    async fn lookup(&self, _idempotency_key: &str) -> Lookup {
        Lookup::CannotTell("anthropic offers no lookup by key".into())
    }

    /// `POST /v1/messages/count_tokens`: Anthropic's own count of the
    /// prompt, which the contract run compares with ours. It takes the
    /// prompt's fields only (a `max_tokens` is refused).
    async fn count_tokens(&self, request: &ChatRequest) -> Option<Result<u32, String>> {
        Some(self.count(request).await)
    }
}

impl AnthropicProvider {
    async fn count(&self, request: &ChatRequest) -> Result<u32, String> {
        let body = request_body(&self.model, request, self.default_max_tokens)
            .map_err(|e| format!("not sent: {e}"))?;
        let mut counted = Map::new();
        for field in ["model", "messages", "system", "tools", "tool_choice"] {
            if let Some(v) = body.get(field) {
                counted.insert(field.into(), v.clone());
            }
        }
        let mut builder = self
            .client
            .post(format!("{}/v1/messages/count_tokens", self.base))
            .header("anthropic-version", &self.version)
            .json(&Value::Object(counted));
        if let Some(key) = &self.api_key {
            builder = builder.header("x-api-key", key.expose());
        }
        let response = exchange(builder, &self.timeouts)
            .await
            .map_err(|outcome| format!("{outcome:?}"))?;
        if !response.status.is_success() {
            return Err(format!(
                "HTTP {}: {}",
                response.status,
                String::from_utf8_lossy(&response.body)
            ));
        }
        let value: Value = serde_json::from_slice(&response.body).map_err(|e| error_chain(&e))?;
        value["input_tokens"]
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| format!("no input_tokens in {value}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(role: Role, content: &str) -> Message {
        Message::new(role, content)
    }

    #[test]
    fn system_goes_top_level_and_same_role_turns_merge() {
        let request = ChatRequest {
            system: Some("be terse".into()),
            messages: vec![
                msg(Role::System, "json only"),
                msg(Role::User, "a"),
                msg(Role::User, "b"),
                msg(Role::Assistant, "c"),
            ],
            temperature: None,
            max_tokens: None,
            top_p: None,
            response_schema: None,
            idempotency_key: "k".into(),
            options: crate::providers::ChatOptions::default(),
        };
        let body = request_body("m", &request, DEFAULT_ANTHROPIC_MAX_TOKENS).unwrap();
        assert_eq!(body["system"], "be terse\n\njson only");
        assert_eq!(
            body["messages"],
            json!([{"role":"user","content":"a\n\nb"},{"role":"assistant","content":"c"}])
        );
        assert_eq!(body["max_tokens"], DEFAULT_ANTHROPIC_MAX_TOKENS);
    }
}
