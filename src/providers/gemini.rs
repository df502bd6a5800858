//! Google's Gemini API: AI Studio (`POST {base}/v1beta/models/{model}:generateContent`,
//! `x-goog-api-key`) and Vertex AI (`POST {base}/v1/projects/{project}/locations/{location}/publishers/google/models/{model}:generateContent`,
//! an OAuth bearer token from [`super::vertex_auth`]); streamed with
//! `:streamGenerateContent?alt=sse`.
//!
//! The wire differs from OpenAI's in ways this adapter owns: the system
//! prompt is `systemInstruction`; turns are `contents` of `parts` with roles
//! `user` and `model` (same-role neighbours are merged); tools are
//! `functionDeclarations`, a call is a `functionCall` part and its result a
//! `functionResponse` part, which names the function, not the call; JSON
//! output is `responseMimeType` + `responseSchema`, an OpenAPI subset of
//! JSON Schema. A safety, recitation or blocklist stop is a definitive
//! `content_policy` failure. A stream has no end marker: it ends when the
//! connection closes after a chunk that says why the model stopped.
//!
//! Neither AI Studio nor Vertex can look a request up by key: an unknown
//! attempt here is settled by a late answer or by a human.

use super::classify::{classify_gemini, error_chain};
use super::config::{ProviderConfig, Secret, Timeouts};
use super::stream::{self, ChunkSender, SseEvent, Step, WireReader};
use super::transport::exchange;
use super::vertex_auth::VertexAuth;
use super::{AttemptOutcome, ChatRequest, Failure, Lookup, Provider, Streamed, Success, Usage};
use crate::domain::request::{Message, Role};
use crate::domain::{ErrorKind, FinishReason};
use async_trait::async_trait;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// Finish reasons by which Gemini says it refused on policy grounds.
pub const POLICY_FINISH_REASONS: &[&str] = &[
    "SAFETY",
    "RECITATION",
    "BLOCKLIST",
    "PROHIBITED_CONTENT",
    "SPII",
    "IMAGE_SAFETY",
];

/// How requests are authorised, and where they go.
#[derive(Debug)]
enum Endpoint {
    AiStudio {
        api_key: Option<Secret>,
    },
    Vertex {
        project: String,
        location: String,
        auth: Box<VertexAuth>,
    },
}

#[derive(Debug)]
pub struct GeminiProvider {
    name: String,
    client: reqwest::Client,
    base: String,
    model: String,
    endpoint: Endpoint,
    timeouts: Timeouts,
}

impl GeminiProvider {
    /// An AI Studio provider (the key from `api_key_env`), or a Vertex one
    /// when `auth` is given (its config names `vertex_project`).
    pub fn new(
        name: &str,
        config: &ProviderConfig,
        client: reqwest::Client,
        api_key: Option<Secret>,
        auth: Option<VertexAuth>,
    ) -> Self {
        let endpoint = match (auth, &config.vertex_project, &config.vertex_location) {
            (Some(auth), Some(project), Some(location)) => Endpoint::Vertex {
                project: project.clone(),
                location: location.clone(),
                auth: Box::new(auth),
            },
            _ => Endpoint::AiStudio { api_key },
        };
        GeminiProvider {
            name: name.to_string(),
            client,
            base: config.base().to_string(),
            model: config
                .model
                .strip_prefix("models/")
                .unwrap_or(&config.model)
                .to_string(),
            endpoint,
            timeouts: config.timeouts,
        }
    }

    /// `{base}/…/models/{model}:{method}` for this endpoint.
    fn url(&self, method: &str) -> String {
        match &self.endpoint {
            Endpoint::AiStudio { .. } => {
                format!("{}/v1beta/models/{}:{method}", self.base, self.model)
            }
            Endpoint::Vertex {
                project, location, ..
            } => format!(
                "{}/v1/projects/{project}/locations/{location}/publishers/google/models/{}:{method}",
                self.base, self.model
            ),
        }
    }

    /// A POST to `method` with this endpoint's credentials; a Vertex token
    /// that cannot be had fails the call before anything is sent.
    async fn post(&self, method: &str, key: &str) -> Result<reqwest::RequestBuilder, Failure> {
        let builder = self
            .client
            .post(self.url(method))
            // Google ignores it; sent so a gateway in front can dedupe.
            .header("Idempotency-Key", key);
        Ok(match &self.endpoint {
            Endpoint::AiStudio { api_key: Some(k) } => builder.header("x-goog-api-key", k.expose()),
            Endpoint::AiStudio { api_key: None } => builder,
            Endpoint::Vertex { auth, .. } => builder.bearer_auth(auth.token().await?.expose()),
        })
    }

    /// `countTokens` for the prompt of `request`: Gemini's own count, which
    /// the contract run compares with ours.
    async fn count(&self, request: &ChatRequest) -> Result<u32, String> {
        let body = request_body(request).map_err(|e| format!("not sent: {e}"))?;
        let mut counted = Map::new();
        for field in ["contents", "systemInstruction", "tools"] {
            if let Some(v) = body.get(field) {
                counted.insert(field.into(), v.clone());
            }
        }
        // AI Studio counts a whole request under `generateContentRequest`;
        // Vertex takes its fields at the top level.
        let counted = match self.endpoint {
            Endpoint::AiStudio { .. } => {
                counted.insert("model".into(), json!(format!("models/{}", self.model)));
                json!({ "generateContentRequest": counted })
            }
            Endpoint::Vertex { .. } => Value::Object(counted),
        };
        let builder = self
            .post("countTokens", &request.idempotency_key)
            .await
            .map_err(|f| format!("{}: {}", f.kind, f.message))?
            .json(&counted);
        let response = exchange(builder, &self.timeouts)
            .await
            .map_err(|o| format!("countTokens did not answer: {o:?}"))?;
        let value: Value = serde_json::from_slice(&response.body)
            .map_err(|e| format!("countTokens answered HTTP {}: {e}", response.status))?;
        if !response.status.is_success() {
            return Err(format!(
                "countTokens answered HTTP {}: {}",
                response.status.as_u16(),
                value["error"]["message"].as_str().unwrap_or_default()
            ));
        }
        value["totalTokens"]
            .as_u64()
            .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
            .ok_or_else(|| "countTokens answer has no totalTokens".to_string())
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

/// An OpenAI content part as a Gemini part: text, or an image from a
/// base64 `data:` URL as `inlineData` (Gemini fetches no other URLs).
fn part_of(part: &Value) -> Result<Value, String> {
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
                .ok_or("the Gemini wire takes images only as base64 data: URLs")?;
            Ok(json!({"inlineData": {"mimeType": mime_type, "data": data}}))
        }
        other => Err(format!("content part of type {other:?} is not supported")),
    }
}

/// The function a tool result answers, found by its call id among the
/// assistant turns before it, the latest first: Gemini's `functionResponse`
/// names the function.
fn function_answered(messages: &[Message], call_id: &str) -> Option<Value> {
    messages
        .iter()
        .rev()
        .flat_map(|m| m.tool_calls.iter().flatten().rev())
        .find(|call| call["id"].as_str() == Some(call_id))
        .and_then(|call| call.pointer("/function/name").cloned())
}

/// One turn as Gemini's role and parts.
fn content_of(messages: &[Message], i: usize) -> Result<(&'static str, Vec<Value>), String> {
    let m = &messages[i];
    match m.role {
        Role::System => Err("system turns go to systemInstruction".into()),
        Role::Tool => {
            let id = m.tool_call_id.as_deref().unwrap_or_default();
            let name = function_answered(&messages[..i], id)
                .ok_or(format!("tool result {id:?} answers no earlier tool call"))?;
            // `response` is a JSON object: the tool's object as it is, any
            // other answer under `output`, as Google's guide suggests.
            let response = match serde_json::from_str::<Value>(&m.content) {
                Ok(Value::Object(o)) => Value::Object(o),
                Ok(other) => json!({ "output": other }),
                Err(_) => json!({ "output": m.content }),
            };
            Ok((
                "user",
                vec![json!({"functionResponse": {"name": name, "response": response}})],
            ))
        }
        Role::User | Role::Assistant => {
            let role = if m.role == Role::User {
                "user"
            } else {
                "model"
            };
            let mut parts = match &m.parts {
                Some(parts) => parts.iter().map(part_of).collect::<Result<Vec<_>, _>>()?,
                None if m.content.is_empty() && m.tool_calls.is_some() => Vec::new(),
                None => vec![json!({"text": m.content})],
            };
            for call in m.tool_calls.iter().flatten() {
                let arguments = call.pointer("/function/arguments").and_then(Value::as_str);
                let args: Value = match arguments {
                    Some(text) if !text.trim().is_empty() => serde_json::from_str(text)
                        .map_err(|e| format!("tool call arguments are not JSON: {e}"))?,
                    _ => json!({}),
                };
                parts.push(json!({"functionCall": {
                    "name": call.pointer("/function/name").cloned().unwrap_or(Value::Null),
                    "args": args,
                }}));
            }
            Ok((role, parts))
        }
    }
}

/// Schema keywords Gemini's `Schema` (an OpenAPI 3 subset) accepts; others,
/// such as `additionalProperties` or `$schema`, it refuses, so they are
/// left out. The answer is still validated against the whole schema here.
const SCHEMA_KEYWORDS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "maxItems",
    "minItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "example",
    "anyOf",
    "propertyOrdering",
    "default",
    "items",
    "minimum",
    "maximum",
];

/// A JSON Schema in Gemini's `Schema` terms: types upper-cased, a
/// `["T", "null"]` type as `T` with `nullable`, unknown keywords dropped.
pub fn gemini_schema(schema: &Value) -> Value {
    let Value::Object(fields) = schema else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (key, value) in fields {
        if !SCHEMA_KEYWORDS.contains(&key.as_str()) {
            continue;
        }
        let value = match key.as_str() {
            "type" => match value {
                Value::String(t) => json!(t.to_ascii_uppercase()),
                Value::Array(types) => {
                    let named: Vec<&str> = types.iter().filter_map(Value::as_str).collect();
                    if named.contains(&"null") {
                        out.insert("nullable".into(), json!(true));
                    }
                    match named.iter().find(|t| **t != "null") {
                        Some(t) => json!(t.to_ascii_uppercase()),
                        None => continue,
                    }
                }
                _ => continue,
            },
            "properties" => Value::Object(
                value
                    .as_object()
                    .into_iter()
                    .flatten()
                    .map(|(name, s)| (name.clone(), gemini_schema(s)))
                    .collect(),
            ),
            "items" => gemini_schema(value),
            "anyOf" => Value::Array(
                value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(gemini_schema)
                    .collect(),
            ),
            _ => value.clone(),
        };
        out.insert(key.clone(), value);
    }
    Value::Object(out)
}

/// OpenAI's `tool_choice` as Gemini's `toolConfig`.
fn tool_config(choice: &Value) -> Value {
    let config = match choice {
        Value::String(s) if s == "required" => json!({"mode": "ANY"}),
        Value::String(s) if s == "none" => json!({"mode": "NONE"}),
        Value::Object(_) => json!({"mode": "ANY",
            "allowedFunctionNames": [choice.pointer("/function/name")]}),
        _ => json!({"mode": "AUTO"}),
    };
    json!({ "functionCallingConfig": config })
}

/// The request body in Gemini's wire format (the model is in the URL), or
/// why the conversation cannot be expressed in it (it is then never sent).
pub fn request_body(request: &ChatRequest) -> Result<Value, String> {
    // `user` has no place on this wire; it only labels the caller for
    // abuse monitoring, so leaving it out changes no answer.
    let options = &request.options;
    let mut system: Vec<&str> = request.system.iter().map(String::as_str).collect();
    let mut contents: Vec<(&'static str, Vec<Value>)> = Vec::new();
    for (i, m) in request.messages.iter().enumerate() {
        if m.role == Role::System {
            system.push(&m.content);
            continue;
        }
        let (role, parts) = content_of(&request.messages, i)?;
        match contents.last_mut() {
            Some((last, previous)) if *last == role => previous.extend(parts),
            _ => contents.push((role, parts)),
        }
    }
    if contents.is_empty() {
        return Err("at least one user turn is required".into());
    }
    let mut body = Map::new();
    if !system.is_empty() {
        body.insert(
            "systemInstruction".into(),
            json!({"parts": [{"text": system.join("\n\n")}]}),
        );
    }
    body.insert(
        "contents".into(),
        contents
            .into_iter()
            .map(|(role, parts)| json!({"role": role, "parts": parts}))
            .collect(),
    );
    if let Some(tools) = &options.tools {
        let declarations: Vec<Value> = tools
            .iter()
            .map(|t| {
                let f = &t["function"];
                let mut declaration = json!({"name": f["name"]});
                if let Some(d) = f.get("description") {
                    declaration["description"] = d.clone();
                }
                if let Some(p) = f.get("parameters") {
                    declaration["parameters"] = gemini_schema(p);
                }
                declaration
            })
            .collect();
        body.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
    }
    if let Some(choice) = &options.tool_choice {
        body.insert("toolConfig".into(), tool_config(choice));
    }
    let mut generation = Map::new();
    let mut set = |name: &str, value: Option<Value>| {
        if let Some(v) = value {
            generation.insert(name.into(), v);
        }
    };
    set("temperature", request.temperature.map(|t| json!(t)));
    set("topP", request.top_p.map(|p| json!(p)));
    set("maxOutputTokens", request.max_tokens.map(|m| json!(m)));
    set("stopSequences", options.stop.as_ref().map(|s| json!(s)));
    set("seed", options.seed.map(|s| json!(s)));
    set(
        "presencePenalty",
        options.presence_penalty.map(|p| json!(p)),
    );
    set(
        "frequencyPenalty",
        options.frequency_penalty.map(|p| json!(p)),
    );
    if let Some(schema) = &request.response_schema {
        set("responseMimeType", Some(json!("application/json")));
        set("responseSchema", Some(gemini_schema(schema)));
    } else if options.json_object {
        set("responseMimeType", Some(json!("application/json")));
    }
    if !generation.is_empty() {
        body.insert("generationConfig".into(), Value::Object(generation));
    }
    Ok(Value::Object(body))
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

/// A blocked prompt (`promptFeedback.blockReason`) or a policy stop of the
/// first candidate, as a definitive refusal.
fn refused(response: &Value) -> Option<Failure> {
    if let Some(reason) = response
        .pointer("/promptFeedback/blockReason")
        .and_then(Value::as_str)
    {
        return Some(refusal(format!("prompt blocked: blockReason {reason}")));
    }
    let reason = response
        .pointer("/candidates/0/finishReason")
        .and_then(Value::as_str)?;
    POLICY_FINISH_REASONS
        .contains(&reason)
        .then(|| refusal(format!("finishReason {reason}")))
}

/// `usageMetadata` as usage; thinking tokens are output the caller pays for.
fn usage_of(metadata: &Value) -> Option<Usage> {
    let count = |field: &str| metadata[field].as_u64();
    Some(Usage {
        prompt_tokens: count("promptTokenCount")?,
        completion_tokens: count("candidatesTokenCount")
            .unwrap_or(0)
            .saturating_add(count("thoughtsTokenCount").unwrap_or(0)),
        ..Usage::default()
    })
}

/// The id of a function call Gemini gave none: `call_{tag}_{n}`, where
/// `tag` comes from the request's idempotency key (one per job and
/// provider, so each step of a tool loop has its own) and `n` numbers the
/// answer's calls. A made id must never repeat in a conversation: a tool
/// result is sent back under the function of the call its id names.
fn made_call_id(idempotency_key: &str, n: usize) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(idempotency_key.as_bytes());
    let tag: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("call_{tag}_{n}")
}

/// The answer's text (thought summaries left out) and its function calls
/// as OpenAI-shaped tool calls, numbered from `first_call`; Gemini gives a
/// call an `id` only sometimes, so one is made ([`made_call_id`]) when it
/// does not.
fn parts_of(candidate: &Value, key: &str, first_call: usize) -> (String, Vec<Value>) {
    let mut text = String::new();
    let mut calls = Vec::new();
    for part in candidate
        .pointer("/content/parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(call) = part.get("functionCall") {
            let id = call["id"].as_str().map_or_else(
                || made_call_id(key, first_call + calls.len()),
                str::to_string,
            );
            calls.push(json!({"id": id, "type": "function", "function": {
                "name": call["name"],
                "arguments": call.get("args").cloned().unwrap_or(json!({})).to_string(),
            }}));
        } else if part["thought"] != true {
            text.push_str(part["text"].as_str().unwrap_or_default());
        }
    }
    (text, calls)
}

/// Read a `GenerateContentResponse`: the first candidate's text and calls
/// (ids made from `key`, the request's idempotency key, where Gemini gave
/// none).
pub fn response_to_success(
    response: &Value,
    key: &str,
    latency: Duration,
) -> Result<Result<Success, Failure>, String> {
    if let Some(failure) = refused(response) {
        return Ok(Err(failure));
    }
    let candidate = response
        .pointer("/candidates/0")
        .ok_or("candidates is missing or empty")?;
    if candidate.get("content").is_none() && candidate.get("finishReason").is_none() {
        return Err("candidates[0] has neither content nor finishReason".into());
    }
    let (output, tool_calls) = parts_of(candidate, key, 0);
    // A function call stops with `STOP`: a tool-call turn, as streamed.
    let finish = candidate["finishReason"].as_str().map(|reason| {
        FinishReason::told(
            Some(&FinishReason::of_gemini(reason)),
            !tool_calls.is_empty(),
        )
    });
    Ok(Ok(Success {
        output,
        tool_calls,
        usage: usage_of(&response["usageMetadata"]),
        provider_request_id: response["responseId"].as_str().map(str::to_string),
        latency,
        finish,
    }))
}

/// Gemini's stream: each event a whole `GenerateContentResponse` holding
/// the next piece; the last names the finish reason and carries the usage.
/// There is no end marker: a clean close after the finish reason ends it.
#[derive(Debug, Default)]
pub(crate) struct GeminiReader {
    /// The request's idempotency key, which made call ids derive from.
    key: String,
    finish_reason: Option<String>,
    usage: Option<Usage>,
    id: Option<String>,
    calls: usize,
}

impl WireReader for GeminiReader {
    fn read(&mut self, event: &SseEvent) -> Step {
        let chunk: Value = match serde_json::from_str(&event.data) {
            Ok(v) => v,
            Err(e) => {
                let shown: String = event.data.chars().take(80).collect();
                return Step::Broken(
                    ErrorKind::MalformedChunk,
                    format!("unreadable stream event {shown:?}: {e}"),
                );
            }
        };
        if let Some(error) = chunk.get("error") {
            let message = format!(
                "{}: {}",
                error["status"].as_str().unwrap_or("error"),
                error["message"].as_str().unwrap_or("error event")
            );
            return Step::Broken(ErrorKind::StreamError, message);
        }
        if let Some(failure) = refused(&chunk) {
            return Step::Refused(failure);
        }
        if self.id.is_none() {
            self.id = chunk["responseId"].as_str().map(str::to_string);
        }
        if let Some(usage) = usage_of(&chunk["usageMetadata"]) {
            self.usage = Some(usage);
        }
        let Some(candidate) = chunk.pointer("/candidates/0") else {
            return Step::Nothing;
        };
        let (content, calls) = parts_of(candidate, &self.key, self.calls);
        let tool_calls = calls
            .into_iter()
            .map(|mut call| {
                call["index"] = json!(self.calls);
                self.calls += 1;
                call
            })
            .collect();
        if let Some(reason) = candidate["finishReason"].as_str() {
            self.finish_reason = Some(reason.to_string());
        }
        Step::Piece(stream::Delta {
            content,
            tool_calls,
        })
    }

    fn closed(&mut self) -> bool {
        true
    }

    fn finish_reason(&self) -> Option<FinishReason> {
        let reason = FinishReason::of_gemini(self.finish_reason.as_deref()?);
        Some(FinishReason::told(Some(&reason), self.calls > 0))
    }

    fn usage(&self) -> Option<Usage> {
        self.usage
    }

    fn provider_request_id(&self) -> Option<String> {
        self.id.clone()
    }
}

#[async_trait]
impl Provider for GeminiProvider {
    fn name(&self) -> &str {
        &self.name
    }

    async fn call(&self, request: &ChatRequest) -> AttemptOutcome {
        let body = match request_body(request) {
            Ok(body) => body,
            Err(message) => return AttemptOutcome::Failed(invalid_prompt(message)),
        };
        let builder = match self.post("generateContent", &request.idempotency_key).await {
            Ok(b) => b.json(&body),
            Err(failure) => return AttemptOutcome::Failed(failure),
        };
        let outcome = match exchange(builder, &self.timeouts).await {
            Ok(response) => {
                let latency = response.latency;
                classify_gemini(response.status, &response.headers, &response.body, |b| {
                    let value: Value = serde_json::from_slice(b).map_err(|e| error_chain(&e))?;
                    response_to_success(&value, &request.idempotency_key, latency)
                })
            }
            Err(outcome) => outcome,
        };
        super::trace_outcome(&outcome, &request.idempotency_key);
        outcome
    }

    async fn stream(&self, request: &ChatRequest, deltas: &ChunkSender) -> Streamed {
        let body = match request_body(request) {
            Ok(body) => body,
            Err(message) => return (AttemptOutcome::Failed(invalid_prompt(message)), None),
        };
        let builder = match self
            .post("streamGenerateContent", &request.idempotency_key)
            .await
        {
            Ok(b) => b.query(&[("alt", "sse")]).json(&body),
            Err(failure) => return (AttemptOutcome::Failed(failure), None),
        };
        let streamed = stream::run_classified(
            builder,
            &self.timeouts,
            GeminiReader {
                key: request.idempotency_key.clone(),
                ..GeminiReader::default()
            },
            deltas,
            |status, headers, body| {
                classify_gemini(status, headers, body, |_| Err("not a success".into()))
            },
        )
        .await;
        super::trace_outcome(&streamed.0, &request.idempotency_key);
        streamed
    }

    async fn lookup(&self, _idempotency_key: &str) -> Lookup {
        Lookup::CannotTell("gemini offers no lookup by key".into())
    }

    async fn count_tokens(&self, request: &ChatRequest) -> Option<Result<u32, String>> {
        Some(self.count(request).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_schema_becomes_gemini_schema() {
        let schema = json!({"$schema": "x", "type": "object", "additionalProperties": false,
            "properties": {"a": {"type": ["string", "null"], "enum": ["x", null]},
                           "b": {"type": "array", "items": {"type": "integer"}}},
            "required": ["a"]});
        assert_eq!(
            gemini_schema(&schema),
            json!({"type": "OBJECT",
                "properties": {"a": {"type": "STRING", "nullable": true, "enum": ["x", null]},
                               "b": {"type": "ARRAY", "items": {"type": "INTEGER"}}},
                "required": ["a"]})
        );
    }

    #[test]
    fn a_tool_result_names_the_function_it_answers() {
        let mut call = Message::new(Role::Assistant, "");
        call.tool_calls = Some(vec![json!({"id": "c1", "type": "function",
            "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}})]);
        let mut result = Message::new(Role::Tool, "18");
        result.tool_call_id = Some("c1".into());
        let messages = vec![Message::new(Role::User, "hi"), call, result];
        let (role, parts) = content_of(&messages, 2).unwrap();
        assert_eq!(role, "user");
        assert_eq!(
            parts,
            vec![json!({"functionResponse": {"name": "weather", "response": {"output": 18}}})]
        );
        let mut orphan = Message::new(Role::Tool, "18");
        orphan.tool_call_id = Some("c9".into());
        assert!(content_of(&[orphan], 0).is_err());
    }

    /// A conversation whose ids repeat (made by an earlier build, or by a
    /// client): a result answers the latest call with its id.
    #[test]
    fn a_repeated_call_id_names_the_latest_call() {
        let call = |name: &str| {
            let mut m = Message::new(Role::Assistant, "");
            m.tool_calls = Some(vec![json!({"id": "call_0", "type": "function",
                "function": {"name": name, "arguments": "{}"}})]);
            m
        };
        let mut result = Message::new(Role::Tool, "ok");
        result.tool_call_id = Some("call_0".into());
        let messages = vec![
            Message::new(Role::User, "hi"),
            call("get_weather"),
            result.clone(),
            call("get_time"),
            result,
        ];
        let (_, parts) = content_of(&messages, 4).unwrap();
        assert_eq!(parts[0]["functionResponse"]["name"], "get_time");
        let (_, parts) = content_of(&messages, 2).unwrap();
        assert_eq!(parts[0]["functionResponse"]["name"], "get_weather");
    }
}
