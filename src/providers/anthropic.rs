//! Anthropic Messages API (`POST /v1/messages`).
//!
//! The wire format differs from OpenAI's in ways the adapter owns: the system
//! prompt is a top-level field, turns must alternate user/assistant starting
//! with user (consecutive same-role turns are merged), and `max_tokens` is
//! required. Anthropic offers neither idempotency keys nor lookup, so an
//! unknown attempt here can only be settled by a late answer or by a human.

use super::classify::{classify_response, error_chain};
use super::config::{ProviderConfig, Secret, Timeouts};
use super::transport::exchange;
use super::{CallOutcome, ChatRequest, Failure, Lookup, Provider, Success, Usage};
use crate::domain::request::Role;
use async_trait::async_trait;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// Sent when the request gives no `max_tokens` (the API requires one).
pub const DEFAULT_MAX_TOKENS: u32 = 1024;

#[derive(Debug, Clone)]
pub struct AnthropicProvider {
    name: String,
    client: reqwest::Client,
    base: String,
    model: String,
    api_key: Option<Secret>,
    version: String,
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
            timeouts: config.timeouts,
        }
    }
}

/// The request body in Anthropic's wire format, or why the conversation
/// cannot be expressed in it (the request is then never sent).
pub fn request_body(model: &str, request: &ChatRequest) -> Result<Value, String> {
    let mut system: Vec<&str> = request.system.iter().map(String::as_str).collect();
    let mut turns: Vec<(&'static str, String)> = Vec::new();
    for m in &request.messages {
        let role = match m.role {
            Role::System => {
                system.push(&m.content);
                continue;
            }
            Role::User => "user",
            Role::Assistant => "assistant",
        };
        match turns.last_mut() {
            Some((last, text)) if *last == role => {
                text.push_str("\n\n");
                text.push_str(&m.content);
            }
            _ => turns.push((role, m.content.clone())),
        }
    }
    match turns.first() {
        Some(("user", _)) => {}
        Some(_) => return Err("the first turn must be a user turn".into()),
        None => return Err("at least one user turn is required".into()),
    }
    let messages: Vec<Value> = turns
        .into_iter()
        .map(|(role, content)| json!({"role": role, "content": content}))
        .collect();
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert(
        "max_tokens".into(),
        json!(request.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS)),
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
            kind: "content_policy".into(),
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
    let usage = Usage::from_wire(&message["usage"], "input_tokens", "output_tokens");
    Ok(Ok(Success {
        output,
        usage,
        provider_request_id: message["id"].as_str().map(str::to_string),
        latency,
    }))
}

#[async_trait]
impl Provider for AnthropicProvider {
    fn name(&self) -> &str {
        &self.name
    }

    #[tracing::instrument(skip_all, fields(provider = %self.name, key = %request.idempotency_key))]
    async fn call(&self, request: &ChatRequest) -> CallOutcome {
        let body = match request_body(&self.model, request) {
            Ok(body) => body,
            Err(message) => {
                return CallOutcome::Failed(Failure {
                    retryable: false,
                    retry_after: None,
                    kind: "invalid_prompt".into(),
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
        super::trace_outcome(&outcome);
        outcome
    }

    async fn lookup(&self, _idempotency_key: &str) -> Lookup {
        Lookup::CannotTell("anthropic offers no lookup by key".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::request::Message;

    fn msg(role: Role, content: &str) -> Message {
        Message {
            role,
            content: content.into(),
        }
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
        };
        let body = request_body("m", &request).unwrap();
        assert_eq!(body["system"], "be terse\n\njson only");
        assert_eq!(
            body["messages"],
            json!([{"role":"user","content":"a\n\nb"},{"role":"assistant","content":"c"}])
        );
        assert_eq!(body["max_tokens"], DEFAULT_MAX_TOKENS);
    }
}
