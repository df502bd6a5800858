//! AWS Bedrock's Converse API: `POST {base}/model/{modelId}/converse`,
//! streamed by `/converse-stream`, counted by `/count-tokens`; every request
//! signed with SigV4 ([`super::aws_auth`], service `bedrock`).
//!
//! The wire differs from OpenAI's in ways this adapter owns: the system
//! prompt is a list of `system` blocks; turns are `messages` of `content`
//! blocks (`text`, `image`, `toolUse`, `toolResult`) that must alternate
//! user/assistant from a user turn (same-role neighbours are merged); tools
//! are `toolConfig.tools[].toolSpec`; sampling is `inferenceConfig`. The
//! Converse API has no JSON mode, so a JSON schema (or a JSON object) is
//! asked for as AWS suggests, by a tool the model must call: its input is
//! the answer. A stop by a guardrail or a content filter is a definitive
//! `content_policy` failure. The stream comes in AWS's binary event-stream
//! framing ([`super::eventstream`]).
//!
//! Bedrock cannot look a request up by key: an unknown attempt here is
//! settled by a late answer or by a human.

use super::aws_auth;
use super::classify::{bedrock_stream_exception, classify_bedrock, error_chain};
use super::config::{ProviderConfig, Timeouts};
use super::eventstream::EventStreamFraming;
use super::sigv4::{self, Credentials, Scope};
use super::stream::{self, ChunkSender, SseEvent, Step, WireReader};
use super::transport::exchange;
use super::{AttemptOutcome, ChatRequest, Failure, Lookup, Provider, Streamed, Success, Usage};
use crate::domain::request::{Message, Role};
use crate::domain::{ErrorKind, FinishReason};
use async_trait::async_trait;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// The SigV4 service name of the Bedrock runtime.
pub const SIGNING_SERVICE: &str = "bedrock";

/// Stop reasons by which Bedrock says a guardrail or filter stopped it.
pub const POLICY_STOP_REASONS: &[&str] = &["guardrail_intervened", "content_filtered"];

/// The tool a JSON answer is asked for by, when the schema has no name.
pub const DEFAULT_SCHEMA_TOOL: &str = "output";

#[derive(Debug)]
pub struct BedrockProvider {
    name: String,
    client: reqwest::Client,
    base: String,
    region: String,
    /// The model id as it goes in the path: percent-encoded, `:` as `%3A`.
    model_path: String,
    credentials: Credentials,
    timeouts: Timeouts,
}

/// A request body and, when JSON is asked for by a forced tool, that tool's
/// name: its input is the answer's text.
#[derive(Debug, Clone, PartialEq)]
pub struct Converse {
    pub body: Value,
    pub structured: Option<String>,
}

impl BedrockProvider {
    pub fn new(
        name: &str,
        config: &ProviderConfig,
        client: reqwest::Client,
        credentials: Credentials,
    ) -> Self {
        BedrockProvider {
            name: name.to_string(),
            client,
            base: config.base().to_string(),
            region: config.region.clone().unwrap_or_default(),
            model_path: sigv4::uri_encode(&config.model),
            credentials,
            timeouts: config.timeouts,
        }
    }

    /// A signed POST of `body` to `/model/{modelId}/{operation}`.
    fn post(
        &self,
        operation: &str,
        body: &Value,
        key: &str,
    ) -> Result<reqwest::RequestBuilder, Failure> {
        let url = format!("{}/model/{}/{operation}", self.base, self.model_path);
        let bytes = serde_json::to_vec(body).map_err(|e| invalid_prompt(error_chain(&e)))?;
        let scope = Scope {
            region: &self.region,
            service: SIGNING_SERVICE,
        };
        let builder = aws_auth::signed_post(&self.client, &url, bytes, &self.credentials, scope)
            .map_err(invalid_prompt)?;
        // Bedrock ignores it; sent (unsigned) so a gateway in front can dedupe.
        Ok(builder.header("Idempotency-Key", key))
    }

    /// `CountTokens` for the prompt of `request`: Bedrock's own count, which
    /// the contract run compares with ours.
    async fn count(&self, request: &ChatRequest) -> Result<u32, String> {
        let converse = request_body(request).map_err(|e| format!("not sent: {e}"))?;
        let mut counted = Map::new();
        for field in ["messages", "system", "toolConfig"] {
            if let Some(v) = converse.body.get(field) {
                counted.insert(field.into(), v.clone());
            }
        }
        let body = json!({"input": {"converse": counted}});
        let builder = self
            .post("count-tokens", &body, &request.idempotency_key)
            .map_err(|f| format!("{}: {}", f.kind, f.message))?;
        let response = exchange(builder, &self.timeouts)
            .await
            .map_err(|o| format!("CountTokens did not answer: {o:?}"))?;
        let value: Value = serde_json::from_slice(&response.body)
            .map_err(|e| format!("CountTokens answered HTTP {}: {e}", response.status))?;
        if !response.status.is_success() {
            return Err(format!(
                "CountTokens answered HTTP {}: {}",
                response.status.as_u16(),
                value["message"].as_str().unwrap_or_default()
            ));
        }
        value["inputTokens"]
            .as_u64()
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
            .ok_or_else(|| "CountTokens answer has no inputTokens".to_string())
    }
}

fn invalid_prompt(message: String) -> Failure {
    Failure {
        retryable: false,
        retry_after: None,
        kind: ErrorKind::InvalidPrompt,
        message,
        status: None,
    }
}

/// An OpenAI content part as a Converse content block: text, or an image
/// from a base64 `data:` URL (Converse takes image bytes, not URLs).
fn block_of(part: &Value) -> Result<Value, String> {
    match part["type"].as_str() {
        Some("text") => Ok(json!({"text": part["text"]})),
        Some("image_url") => {
            let url = part
                .pointer("/image_url/url")
                .and_then(Value::as_str)
                .ok_or("image_url part without a url")?;
            let (mime_type, data) = url
                .strip_prefix("data:")
                .and_then(|rest| rest.split_once(";base64,"))
                .ok_or("the Converse API takes images only as base64 data: URLs")?;
            let format = match mime_type {
                "image/png" => "png",
                "image/jpeg" | "image/jpg" => "jpeg",
                "image/gif" => "gif",
                "image/webp" => "webp",
                other => return Err(format!("image type {other:?} is not supported")),
            };
            Ok(json!({"image": {"format": format, "source": {"bytes": data}}}))
        }
        other => Err(format!("content part of type {other:?} is not supported")),
    }
}

/// One turn as Converse's role and content blocks.
fn turn_of(m: &Message) -> Result<(&'static str, Vec<Value>), String> {
    match m.role {
        Role::System => Err("system turns go to system".into()),
        Role::Tool => {
            // A tool's JSON object goes as a `json` block, anything else as text.
            let content = match serde_json::from_str::<Value>(&m.content) {
                Ok(Value::Object(o)) => json!([{"json": o}]),
                _ => json!([{"text": m.content}]),
            };
            Ok((
                "user",
                vec![json!({"toolResult": {
                    "toolUseId": m.tool_call_id.as_deref().unwrap_or_default(),
                    "content": content,
                }})],
            ))
        }
        Role::User | Role::Assistant => {
            let role = if m.role == Role::User {
                "user"
            } else {
                "assistant"
            };
            let mut blocks = match &m.parts {
                Some(parts) => parts.iter().map(block_of).collect::<Result<Vec<_>, _>>()?,
                // Converse refuses a blank text block.
                None if m.content.is_empty() => Vec::new(),
                None => vec![json!({"text": m.content})],
            };
            for call in m.tool_calls.iter().flatten() {
                let arguments = call.pointer("/function/arguments").and_then(Value::as_str);
                let input: Value = match arguments {
                    Some(text) if !text.trim().is_empty() => serde_json::from_str(text)
                        .map_err(|e| format!("tool call arguments are not JSON: {e}"))?,
                    _ => json!({}),
                };
                blocks.push(json!({"toolUse": {
                    "toolUseId": call["id"],
                    "name": call.pointer("/function/name").cloned().unwrap_or(Value::Null),
                    "input": input,
                }}));
            }
            if blocks.is_empty() {
                return Err(format!("a {role} turn has no content"));
            }
            Ok((role, blocks))
        }
    }
}

/// OpenAI's `tool_choice` as Converse's `toolChoice`; `None` for `none`,
/// which Converse cannot say (the tools are then left out).
fn tool_choice(choice: &Value) -> Option<Value> {
    match choice {
        Value::String(s) if s == "none" => None,
        Value::String(s) if s == "required" => Some(json!({"any": {}})),
        Value::Object(_) => Some(json!({"tool": {"name": choice.pointer("/function/name")}})),
        _ => Some(json!({"auto": {}})),
    }
}

/// The request body in Converse's wire format (the model is in the path),
/// or why the conversation cannot be expressed in it (it is then never sent).
pub fn request_body(request: &ChatRequest) -> Result<Converse, String> {
    // `user` has no place on this wire; it only labels the caller.
    let options = &request.options;
    for (name, given) in [
        ("seed", options.seed.is_some()),
        ("presence_penalty", options.presence_penalty.is_some()),
        ("frequency_penalty", options.frequency_penalty.is_some()),
    ] {
        if given {
            return Err(format!("{name} is not supported by the Converse API"));
        }
    }
    let mut system: Vec<Value> = request.system.iter().map(|s| json!({"text": s})).collect();
    let mut turns: Vec<(&'static str, Vec<Value>)> = Vec::new();
    let mut uses_tools = false;
    for m in &request.messages {
        if m.role == Role::System {
            system.push(json!({"text": m.content}));
            continue;
        }
        uses_tools |= m.role == Role::Tool || m.tool_calls.is_some();
        let (role, blocks) = turn_of(m)?;
        match turns.last_mut() {
            Some((last, previous)) if *last == role => previous.extend(blocks),
            _ => turns.push((role, blocks)),
        }
    }
    match turns.first() {
        Some(("user", _)) => {}
        Some(_) => return Err("the first turn must be a user turn".into()),
        None => return Err("at least one user turn is required".into()),
    }
    let mut body = Map::new();
    body.insert(
        "messages".into(),
        turns
            .into_iter()
            .map(|(role, content)| json!({"role": role, "content": content}))
            .collect(),
    );
    if !system.is_empty() {
        body.insert("system".into(), Value::Array(system));
    }
    let mut inference = Map::new();
    if let Some(m) = request.max_tokens {
        inference.insert("maxTokens".into(), json!(m));
    }
    if let Some(t) = request.temperature {
        inference.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        inference.insert("topP".into(), json!(p));
    }
    if let Some(stop) = &options.stop {
        inference.insert("stopSequences".into(), json!(stop));
    }
    if !inference.is_empty() {
        body.insert("inferenceConfig".into(), Value::Object(inference));
    }
    let choice = options.tool_choice.as_ref().map(tool_choice);
    let mut tools: Vec<Value> = match (&options.tools, &choice) {
        // `none`: the tools are not offered, unless the conversation already
        // holds tool blocks, which Converse accepts only with a toolConfig.
        (Some(_), Some(None)) if !uses_tools => Vec::new(),
        (Some(tools), _) => tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                let schema = f
                    .get("parameters")
                    .cloned()
                    .unwrap_or(json!({"type": "object"}));
                let mut spec = json!({"name": f["name"], "inputSchema": {"json": schema}});
                if let Some(d) = f.get("description") {
                    spec["description"] = d.clone();
                }
                json!({ "toolSpec": spec })
            })
            .collect(),
        (None, _) => Vec::new(),
    };
    let offered = !tools.is_empty();
    let schema = match (&request.response_schema, options.json_object) {
        (Some(schema), _) => Some(schema.clone()),
        (None, true) => Some(json!({"type": "object"})),
        (None, false) => None,
    };
    let mut structured = None;
    let mut tool_choice = choice.flatten();
    if let Some(schema) = schema {
        let name = options
            .schema_name
            .clone()
            .unwrap_or_else(|| DEFAULT_SCHEMA_TOOL.to_string());
        tools.push(json!({"toolSpec": {
            "name": name,
            "description": "Give your answer as this tool's input: JSON matching its schema.",
            "inputSchema": {"json": schema},
        }}));
        // Forced only when the caller offered no tools of their own.
        if !offered {
            tool_choice = Some(json!({"tool": {"name": name}}));
        }
        structured = Some(name);
    }
    if !tools.is_empty() {
        let mut config = json!({ "tools": tools });
        if let Some(choice) = tool_choice {
            config["toolChoice"] = choice;
        }
        body.insert("toolConfig".into(), config);
    }
    Ok(Converse {
        body: Value::Object(body),
        structured,
    })
}

fn refusal(message: String) -> Failure {
    Failure {
        retryable: false,
        retry_after: None,
        kind: ErrorKind::ContentPolicy,
        message,
        status: None,
    }
}

/// `usage` as usage.
fn usage_of(usage: &Value) -> Option<Usage> {
    Usage::from_wire(usage, "inputTokens", "outputTokens")
}

/// Read a `ConverseResponse`: the text blocks (or the forced tool's input)
/// and the tool calls. A guardrail or content-filter stop is a refusal.
pub fn response_to_success(
    response: &Value,
    structured: Option<&str>,
    request_id: Option<String>,
    latency: Duration,
) -> Result<Result<Success, Failure>, String> {
    let stop = response["stopReason"].as_str().unwrap_or_default();
    if POLICY_STOP_REASONS.contains(&stop) {
        return Ok(Err(refusal(format!("stopReason {stop}"))));
    }
    let blocks = response
        .pointer("/output/message/content")
        .and_then(Value::as_array)
        .ok_or("output.message.content is missing")?;
    let mut output = String::new();
    let mut answer = None;
    let mut tool_calls = Vec::new();
    for block in blocks {
        if let Some(text) = block["text"].as_str() {
            output.push_str(text);
        } else if let Some(tool) = block.get("toolUse") {
            let input = tool.get("input").cloned().unwrap_or(json!({}));
            if structured.is_some() && tool["name"].as_str() == structured {
                answer = Some(input.to_string());
            } else {
                tool_calls.push(json!({"id": tool["toolUseId"], "type": "function",
                    "function": {"name": tool["name"], "arguments": input.to_string()}}));
            }
        }
    }
    // The forced JSON tool's call is the answer, not a tool-call turn.
    let finish = (!stop.is_empty()).then(|| {
        FinishReason::told(
            Some(&FinishReason::of_anthropic(stop, None)),
            !tool_calls.is_empty(),
        )
    });
    Ok(Ok(Success {
        output: answer.unwrap_or(output),
        tool_calls,
        usage: usage_of(&response["usage"]),
        provider_request_id: request_id,
        latency,
        finish,
    }))
}

/// ConverseStream's events: `messageStart`, content blocks (a tool use's
/// start names it, its input comes in JSON fragments), `messageStop` with
/// the stop reason, then `metadata` with the usage. An exception message
/// mid-stream is a cut; one before any event of the answer is the error
/// it names (a throttling before the model started is a retryable no).
/// The forced JSON tool's input is the answer's text.
#[derive(Debug, Default)]
pub(crate) struct BedrockReader {
    structured: Option<String>,
    /// The content block that is the forced JSON tool's call.
    structured_block: Option<u64>,
    stop_reason: Option<String>,
    usage: Option<Usage>,
    /// Whether an event of the answer has arrived.
    started: bool,
    /// Content block index → tool call index.
    tools: Vec<(u64, usize)>,
}

impl BedrockReader {
    pub(crate) fn new(structured: Option<String>) -> Self {
        BedrockReader {
            structured,
            ..BedrockReader::default()
        }
    }
}

impl WireReader for BedrockReader {
    fn read(&mut self, event: &SseEvent) -> Step {
        let kind = event.event.as_deref().unwrap_or_default();
        let value: Value = match serde_json::from_str(&event.data) {
            Ok(v) => v,
            Err(e) => {
                let shown: String = event.data.chars().take(80).collect();
                return Step::Broken(
                    ErrorKind::MalformedChunk,
                    format!("unreadable {kind} event {shown:?}: {e}"),
                );
            }
        };
        if let Some(exception) = kind.strip_prefix("exception:") {
            let message = value["message"].as_str().unwrap_or("exception event");
            if let Some(failure) =
                bedrock_stream_exception(exception, message).filter(|_| !self.started)
            {
                return Step::Refused(failure);
            }
            return Step::Broken(ErrorKind::StreamCut, format!("{exception}: {message}"));
        }
        self.started = true;
        let index = value["contentBlockIndex"].as_u64().unwrap_or(0);
        match kind {
            "contentBlockStart" => {
                let Some(tool) = value.pointer("/start/toolUse") else {
                    return Step::Nothing;
                };
                if self.structured.is_some() && tool["name"].as_str() == self.structured.as_deref()
                {
                    self.structured_block = Some(index);
                    return Step::Nothing;
                }
                let call = self.tools.len();
                self.tools.push((index, call));
                Step::Piece(stream::Delta {
                    content: String::new(),
                    tool_calls: vec![json!({
                        "index": call, "id": tool["toolUseId"], "type": "function",
                        "function": {"name": tool["name"], "arguments": ""}
                    })],
                })
            }
            "contentBlockDelta" => {
                let delta = &value["delta"];
                if let Some(text) = delta["text"].as_str() {
                    return Step::Piece(stream::Delta::text(text));
                }
                let Some(input) = delta.pointer("/toolUse/input").and_then(Value::as_str) else {
                    return Step::Nothing;
                };
                if self.structured_block == Some(index) {
                    return Step::Piece(stream::Delta::text(input));
                }
                let call = self
                    .tools
                    .iter()
                    .find(|(block, _)| *block == index)
                    .map_or(0, |(_, call)| *call);
                Step::Piece(stream::Delta {
                    content: String::new(),
                    tool_calls: vec![json!({"index": call, "function": {"arguments": input}})],
                })
            }
            "messageStop" => {
                let reason = value["stopReason"].as_str().unwrap_or("end_turn");
                if POLICY_STOP_REASONS.contains(&reason) {
                    return Step::Refused(refusal(format!("stopReason {reason}")));
                }
                self.stop_reason = Some(reason.to_string());
                Step::Nothing
            }
            "metadata" => {
                self.usage = usage_of(&value["usage"]).or(self.usage);
                if self.stop_reason.is_some() {
                    Step::End
                } else {
                    Step::Nothing
                }
            }
            _ => Step::Nothing,
        }
    }

    /// `metadata` may not come: a clean close after `messageStop` ends it.
    fn closed(&mut self) -> bool {
        self.stop_reason.is_some()
    }

    fn finish_reason(&self) -> Option<FinishReason> {
        let reason = FinishReason::of_anthropic(self.stop_reason.as_deref()?, None);
        // The forced JSON tool's call is the answer, not a tool-call turn.
        Some(FinishReason::told(Some(&reason), !self.tools.is_empty()))
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn provider_request_id(&self) -> Option<String> {
        None
    }
}

#[async_trait]
impl Provider for BedrockProvider {
    fn name(&self) -> &str {
        &self.name
    }

    async fn call(&self, request: &ChatRequest) -> AttemptOutcome {
        let converse = match request_body(request) {
            Ok(c) => c,
            Err(message) => return AttemptOutcome::Failed(invalid_prompt(message)),
        };
        let builder = match self.post("converse", &converse.body, &request.idempotency_key) {
            Ok(b) => b,
            Err(failure) => return AttemptOutcome::Failed(failure),
        };
        let outcome = match exchange(builder, &self.timeouts).await {
            Ok(response) => {
                let latency = response.latency;
                let request_id = response
                    .headers
                    .get("x-amzn-requestid")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string);
                classify_bedrock(response.status, &response.headers, &response.body, |b| {
                    let value: Value = serde_json::from_slice(b).map_err(|e| error_chain(&e))?;
                    response_to_success(&value, converse.structured.as_deref(), request_id, latency)
                })
            }
            Err(outcome) => outcome,
        };
        super::trace_outcome(&outcome, &request.idempotency_key);
        outcome
    }

    async fn stream(&self, request: &ChatRequest, deltas: &ChunkSender) -> Streamed {
        let converse = match request_body(request) {
            Ok(c) => c,
            Err(message) => return (AttemptOutcome::Failed(invalid_prompt(message)), None),
        };
        let builder = match self.post("converse-stream", &converse.body, &request.idempotency_key) {
            Ok(b) => b,
            Err(failure) => return (AttemptOutcome::Failed(failure), None),
        };
        let streamed = stream::run_framed(
            builder,
            &self.timeouts,
            EventStreamFraming::default(),
            BedrockReader::new(converse.structured),
            deltas,
            |status, headers, body| {
                classify_bedrock(status, headers, body, |_| Err("not a success".into()))
            },
        )
        .await;
        super::trace_outcome(&streamed.0, &request.idempotency_key);
        streamed
    }

    async fn lookup(&self, _idempotency_key: &str) -> Lookup {
        Lookup::CannotTell("bedrock offers no lookup by key".into())
    }

    async fn count_tokens(&self, request: &ChatRequest) -> Option<Result<u32, String>> {
        Some(self.count(request).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat(messages: Vec<Message>) -> ChatRequest {
        ChatRequest {
            system: Some("be terse".into()),
            messages,
            temperature: Some(0.5),
            max_tokens: Some(100),
            top_p: None,
            response_schema: None,
            idempotency_key: "k".into(),
            options: crate::providers::ChatOptions::default(),
        }
    }

    #[test]
    fn system_blocks_and_alternating_turns() {
        let mut call = Message::new(Role::Assistant, "");
        call.tool_calls = Some(vec![json!({"id": "t1", "type": "function",
            "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}})]);
        let mut result = Message::new(Role::Tool, "{\"temp\":18}");
        result.tool_call_id = Some("t1".into());
        let request = chat(vec![
            Message::new(Role::System, "json only"),
            Message::new(Role::User, "a"),
            Message::new(Role::User, "b"),
            call,
            result,
        ]);
        let converse = request_body(&request).unwrap();
        let body = converse.body;
        assert_eq!(
            body["system"],
            json!([{"text": "be terse"}, {"text": "json only"}])
        );
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": [{"text": "a"}, {"text": "b"}]},
                {"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1",
                    "name": "weather", "input": {"city": "Oslo"}}}]},
                {"role": "user", "content": [{"toolResult": {"toolUseId": "t1",
                    "content": [{"json": {"temp": 18}}]}}]},
            ])
        );
        assert_eq!(
            body["inferenceConfig"],
            json!({"maxTokens": 100, "temperature": 0.5})
        );
        assert!(converse.structured.is_none());
    }

    #[test]
    fn a_json_schema_is_asked_for_by_a_forced_tool_whose_input_is_the_answer() {
        let mut request = chat(vec![Message::new(Role::User, "a")]);
        request.response_schema = Some(json!({"type": "object"}));
        request.options.schema_name = Some("triage".into());
        let converse = request_body(&request).unwrap();
        assert_eq!(converse.structured.as_deref(), Some("triage"));
        assert_eq!(
            converse.body["toolConfig"]["toolChoice"],
            json!({"tool": {"name": "triage"}})
        );
        let answer = json!({"output": {"message": {"role": "assistant", "content": [
            {"toolUse": {"toolUseId": "x", "name": "triage", "input": {"a": 1}}}]}},
            "stopReason": "tool_use", "usage": {"inputTokens": 3, "outputTokens": 2, "totalTokens": 5}});
        let success = response_to_success(&answer, Some("triage"), None, Duration::ZERO)
            .unwrap()
            .unwrap();
        assert_eq!(success.output, "{\"a\":1}");
        assert!(success.tool_calls.is_empty());
    }
}
