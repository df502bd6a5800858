//! OpenAI Chat Completions (`POST /v1/chat/completions`), also spoken by the
//! simulator and by OpenAI-compatible servers.
//!
//! Lookup by key works only for completions stored with `store: true` and
//! `metadata.onejob_key`, listed with `GET /v1/chat/completions?metadata[onejob_key]=K`.

use super::classify::{classify_response, error_chain, ErrorBody};
use super::config::{LookupMode, MaxTokensField, ProviderConfig, Secret, Timeouts};
use super::stream::{self, ChunkSender, OpenAiReader};
use super::transport::{exchange, RawResponse};
use super::{AttemptOutcome, ChatRequest, Failure, Lookup, Provider, Streamed, Success, Usage};
use crate::domain::request::Role;
use crate::domain::{ErrorKind, FinishReason};
use async_trait::async_trait;
use serde_json::{json, Map, Value};
use std::time::Duration;

/// Metadata key under which the stable key is stored with a completion.
pub const METADATA_KEY: &str = "onejob_key";

#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    name: String,
    client: reqwest::Client,
    base: String,
    /// `{base}/v1/chat/completions`, parsed once (`None` if it does not
    /// parse: each call then fails as it would have). Parsing it again for
    /// each call was 2% of a durable job's instructions.
    chat_url: Option<reqwest::Url>,
    model: String,
    api_key: Option<Secret>,
    store: bool,
    /// Send `stream_options.include_usage` (see `ProviderConfig::stream_usage`).
    stream_usage: bool,
    /// Fields the server refuses, left out of every request.
    refuses: Vec<String>,
    /// The field a job's token limit goes in.
    max_tokens_field: MaxTokensField,
    lookup: LookupMode,
    timeouts: Timeouts,
}

impl OpenAiProvider {
    pub fn new(
        name: &str,
        config: &ProviderConfig,
        client: reqwest::Client,
        api_key: Option<Secret>,
    ) -> Self {
        OpenAiProvider {
            name: name.to_string(),
            client,
            base: config.base().to_string(),
            chat_url: reqwest::Url::parse(&chat_url(config.base())).ok(),
            model: config.model.clone(),
            api_key,
            store: config.store,
            stream_usage: config.stream_usage.unwrap_or(true),
            refuses: config.refuses.clone(),
            max_tokens_field: config.max_tokens_field(),
            lookup: config.lookup,
            timeouts: config.timeouts,
        }
    }

    /// A POST to this provider's chat completions.
    fn post_chat(&self) -> reqwest::RequestBuilder {
        match &self.chat_url {
            Some(url) => self.client.post(url.clone()),
            None => self.client.post(chat_url(&self.base)),
        }
    }

    /// How an unknown attempt on this provider may be looked up.
    pub(crate) fn lookup_mode(&self) -> LookupMode {
        self.lookup
    }

    /// A GET to `{base}{path}` with this provider's auth, under its timeouts.
    pub(crate) async fn get(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> Result<RawResponse, AttemptOutcome> {
        let mut request = self.client.get(format!("{}{path}", self.base)).query(query);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key.expose());
        }
        exchange(request, &self.timeouts).await
    }

    async fn lookup_stored(&self, key: &str) -> Lookup {
        let filter = format!("metadata[{METADATA_KEY}]");
        let response = match self
            .get("/v1/chat/completions", &[(filter.as_str(), key)])
            .await
        {
            Ok(r) => r,
            Err(outcome) => return Lookup::CannotTell(format!("lookup failed: {outcome:?}")),
        };
        if !response.status.is_success() {
            let error = ErrorBody::parse(&response.body);
            return Lookup::CannotTell(format!(
                "lookup answered HTTP {}: {}",
                response.status.as_u16(),
                error.message.unwrap_or_default()
            ));
        }
        let list: Value = match serde_json::from_slice(&response.body) {
            Ok(v) => v,
            Err(e) => return Lookup::CannotTell(format!("unreadable lookup answer: {e}")),
        };
        match list["data"].as_array().map(|d| d.first()) {
            None => Lookup::CannotTell("lookup answer has no data list".into()),
            Some(None) => Lookup::NotFound,
            Some(Some(completion)) => match completion_to_success(completion, Duration::ZERO) {
                Ok(Ok(success)) => Lookup::Found(success),
                Ok(Err(failure)) => Lookup::CannotTell(format!(
                    "stored completion is a {}: {}",
                    failure.kind, failure.message
                )),
                Err(e) => Lookup::CannotTell(format!("unreadable stored completion: {e}")),
            },
        }
    }
}

/// The request body in OpenAI's wire format: system first, then the turns;
/// a token limit (only when the job sets one) in `limit_field`.
pub fn request_body(
    model: &str,
    request: &ChatRequest,
    store: bool,
    limit_field: MaxTokensField,
) -> Value {
    let mut messages = Vec::with_capacity(request.messages.len() + 1);
    if let Some(system) = &request.system {
        messages.push(json!({"role": "system", "content": system}));
    }
    for m in &request.messages {
        let role = match m.role {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
        };
        let mut message = Map::new();
        message.insert("role".into(), json!(role));
        let content = match &m.parts {
            // `cache_control` (an Anthropic caching hint a part may carry
            // from the Messages door) is not part of OpenAI's wire format.
            Some(parts) => Value::Array(
                parts
                    .iter()
                    .map(|p| {
                        let mut p = p.clone();
                        if let Some(part) = p.as_object_mut() {
                            part.remove("cache_control");
                        }
                        p
                    })
                    .collect(),
            ),
            // An assistant turn that only calls tools has no content.
            None if m.content.is_empty() && m.tool_calls.is_some() => Value::Null,
            None => json!(m.content),
        };
        message.insert("content".into(), content);
        if let Some(calls) = &m.tool_calls {
            message.insert("tool_calls".into(), json!(calls));
        }
        if let Some(id) = &m.tool_call_id {
            message.insert("tool_call_id".into(), json!(id));
        }
        if let Some(name) = &m.name {
            message.insert("name".into(), json!(name));
        }
        messages.push(Value::Object(message));
    }
    let mut body = Map::new();
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), Value::Array(messages));
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(m) = request.max_tokens {
        body.insert(limit_field.name().into(), json!(m));
    }
    if let Some(p) = request.top_p {
        body.insert("top_p".into(), json!(p));
    }
    let options = &request.options;
    if let Some(schema) = &request.response_schema {
        let name = options.schema_name.as_deref().unwrap_or("output");
        body.insert(
            "response_format".into(),
            json!({"type": "json_schema",
                   "json_schema": {"name": name, "schema": schema, "strict": true}}),
        );
    } else if options.json_object {
        body.insert("response_format".into(), json!({"type": "json_object"}));
    }
    if let Some(stop) = &options.stop {
        body.insert("stop".into(), json!(stop));
    }
    if let Some(seed) = options.seed {
        body.insert("seed".into(), json!(seed));
    }
    if let Some(user) = &options.user {
        body.insert("user".into(), json!(user));
    }
    if let Some(p) = options.presence_penalty {
        body.insert("presence_penalty".into(), json!(p));
    }
    if let Some(f) = options.frequency_penalty {
        body.insert("frequency_penalty".into(), json!(f));
    }
    if let Some(tools) = &options.tools {
        body.insert("tools".into(), json!(tools));
    }
    if let Some(choice) = &options.tool_choice {
        body.insert("tool_choice".into(), choice.clone());
    }
    if let Some(parallel) = options.parallel_tool_calls {
        body.insert("parallel_tool_calls".into(), json!(parallel));
    }
    for (name, value) in options.openai.iter().flatten() {
        body.insert(name.clone(), value.clone());
    }
    if store {
        // The lookup key joins the client's own metadata (and wins).
        body.insert("store".into(), json!(true));
        let mut metadata = match body.remove("metadata") {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        metadata.insert(METADATA_KEY.into(), json!(request.idempotency_key));
        body.insert("metadata".into(), Value::Object(metadata));
    }
    Value::Object(body)
}

/// Leave out of `body` the fields its server refuses (`refuses` in the
/// provider file): top-level fields, and `name` from every message. Those
/// that change the answer never reach here set: the plan skipped the
/// provider for such a job.
pub(crate) fn leave_out(body: &mut Value, refuses: &[String]) {
    for field in refuses {
        if field == "name" {
            for message in body["messages"].as_array_mut().into_iter().flatten() {
                if let Some(m) = message.as_object_mut() {
                    m.remove("name");
                }
            }
        } else if let Some(b) = body.as_object_mut() {
            b.remove(field);
        }
    }
}

/// Read a chat completion object (the answer to a create, or an item of the
/// stored list). A refusal or a content-filter stop is a definitive failure.
pub fn completion_to_success(
    completion: &Value,
    latency: Duration,
) -> Result<Result<Success, Failure>, String> {
    let choice = &completion["choices"][0];
    let message = &choice["message"];
    let refused = message["refusal"].as_str().filter(|r| !r.is_empty());
    if refused.is_some() || choice["finish_reason"] == "content_filter" {
        return Ok(Err(Failure {
            retryable: false,
            retry_after: None,
            kind: ErrorKind::ContentPolicy,
            message: refused
                .unwrap_or("finish_reason content_filter")
                .to_string(),
            status: None,
        }));
    }
    let tool_calls = message["tool_calls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    // A turn that only calls tools may carry no content.
    let output = match message["content"].as_str() {
        Some(text) => text.to_string(),
        None if !tool_calls.is_empty() => String::new(),
        None => return Err("choices[0].message.content is missing".into()),
    };
    let usage = Usage::from_wire(&completion["usage"], "prompt_tokens", "completion_tokens");
    Ok(Ok(Success {
        output,
        tool_calls,
        usage,
        provider_request_id: completion["id"].as_str().map(str::to_string),
        latency,
        finish: choice["finish_reason"]
            .as_str()
            .map(FinishReason::of_openai),
    }))
}

fn chat_url(base: &str) -> String {
    format!("{base}/v1/chat/completions")
}

/// Send `request` in OpenAI's wire format and classify the answer. Shared
/// with the simulator client.
pub(crate) async fn call_openai_wire(p: &OpenAiProvider, request: &ChatRequest) -> AttemptOutcome {
    let mut body = request_body(&p.model, request, p.store, p.max_tokens_field);
    leave_out(&mut body, &p.refuses);
    let mut builder = p
        .post_chat()
        .header("Idempotency-Key", &request.idempotency_key)
        .json(&body);
    if let Some(key) = &p.api_key {
        builder = builder.bearer_auth(key.expose());
    }
    let response = match exchange(builder, &p.timeouts).await {
        Ok(r) => r,
        Err(outcome) => return outcome,
    };
    let latency = response.latency;
    classify_response(response.status, &response.headers, &response.body, |body| {
        read_completion(body, latency)
    })
}

/// A chat completion's body read: [`completion_to_success`] of its JSON.
/// The common answer (one choice with its text, a string id, whole token
/// counts) is read straight into [`Plain`], without a `Value` of the whole
/// body; anything else (tool calls, a refusal, a filtered or malformed
/// answer, a repeated key) is read the general way, so both give the same.
fn read_completion(body: &[u8], latency: Duration) -> Result<Result<Success, Failure>, String> {
    if let Some(success) = Plain::read(body, latency) {
        return Ok(Ok(success));
    }
    let value: Value = serde_json::from_slice(body).map_err(|e| error_chain(&e))?;
    completion_to_success(&value, latency)
}

/// The common chat completion, as [`read_completion`] reads it in one pass.
/// A field of another type, a repeated key or any other shape makes
/// [`Plain::read`] give up.
#[derive(serde::Deserialize)]
struct Plain {
    id: Option<String>,
    choices: Vec<PlainChoice>,
    usage: Option<PlainUsage>,
}

#[derive(serde::Deserialize)]
struct PlainChoice {
    message: PlainMessage,
    finish_reason: Option<String>,
}

#[derive(serde::Deserialize)]
struct PlainMessage {
    content: String,
    refusal: Option<String>,
    tool_calls: Option<serde::de::IgnoredAny>,
}

#[derive(serde::Deserialize)]
struct PlainUsage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    prompt_tokens_details: Option<PlainDetails>,
}

#[derive(serde::Deserialize)]
struct PlainDetails {
    cached_tokens: Option<u64>,
}

impl Plain {
    fn read(body: &[u8], latency: Duration) -> Option<Success> {
        let plain: Plain = serde_json::from_slice(body).ok()?;
        let choice = plain.choices.into_iter().next()?;
        let message = choice.message;
        // What `completion_to_success` reads otherwise than as text.
        if message.tool_calls.is_some()
            || message.refusal.is_some_and(|r| !r.is_empty())
            || choice.finish_reason.as_deref() == Some("content_filter")
        {
            return None;
        }
        let usage = plain.usage.and_then(|u| {
            Some(Usage {
                prompt_tokens: u.prompt_tokens?,
                completion_tokens: u.completion_tokens?,
                cached_tokens: u
                    .prompt_tokens_details
                    .and_then(|d| d.cached_tokens)
                    .unwrap_or(0),
                ..Usage::default()
            })
        });
        Some(Success {
            output: message.content,
            tool_calls: Vec::new(),
            usage,
            provider_request_id: plain.id,
            latency,
            finish: choice.finish_reason.as_deref().map(FinishReason::of_openai),
        })
    }
}

/// The same request, streamed (`stream: true`, usage in the last chunk).
pub(crate) async fn stream_openai_wire(
    p: &OpenAiProvider,
    request: &ChatRequest,
    deltas: &ChunkSender,
) -> Streamed {
    let mut body = request_body(&p.model, request, p.store, p.max_tokens_field);
    leave_out(&mut body, &p.refuses);
    body["stream"] = json!(true);
    if p.stream_usage {
        body["stream_options"] = json!({"include_usage": true});
    }
    let mut builder = p
        .post_chat()
        .header("Idempotency-Key", &request.idempotency_key)
        .json(&body);
    if let Some(key) = &p.api_key {
        builder = builder.bearer_auth(key.expose());
    }
    let streamed = stream::run(builder, &p.timeouts, OpenAiReader::default(), deltas).await;
    super::trace_outcome(&streamed.0, &request.idempotency_key);
    streamed
}

#[async_trait]
impl Provider for OpenAiProvider {
    fn name(&self) -> &str {
        &self.name
    }

    async fn call(&self, request: &ChatRequest) -> AttemptOutcome {
        let outcome = call_openai_wire(self, request).await;
        super::trace_outcome(&outcome, &request.idempotency_key);
        outcome
    }

    async fn stream(&self, request: &ChatRequest, deltas: &ChunkSender) -> Streamed {
        stream_openai_wire(self, request, deltas).await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.name, key = %idempotency_key))]
    async fn lookup(&self, idempotency_key: &str) -> Lookup {
        match self.lookup {
            LookupMode::OpenaiStored => self.lookup_stored(idempotency_key).await,
            LookupMode::None | LookupMode::SimLedger => {
                Lookup::CannotTell(format!("provider {} has no lookup configured", self.name))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The general way: the whole body as a `Value`, then read.
    fn by_value(body: &[u8]) -> Result<Result<Success, Failure>, String> {
        let value: Value = serde_json::from_slice(body).map_err(|e| error_chain(&e))?;
        completion_to_success(&value, Duration::from_millis(7))
    }

    #[test]
    fn a_completion_read_in_one_pass_reads_as_its_value() {
        let plain = [
            r#"{"id":"c1","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#,
            r#"{"choices":[{"message":{"content":"h\u00e9 \"q\"\n","refusal":null,"tool_calls":null},"finish_reason":null}]}"#,
            r#"{"id":null,"choices":[{"message":{"content":"","refusal":""}}],"usage":null}"#,
            r#"{"id":"c2","choices":[{"message":{"content":"a"}},{"message":{"content":"b"}}],"usage":{"prompt_tokens":5}}"#,
            r#"{"id":"c3","choices":[{"message":{"content":"big"}}],"usage":{"prompt_tokens":5000000000,"completion_tokens":null}}"#,
            r#"{"id":"c4","choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":5000000000,"completion_tokens":2}}"#,
            "  {\"choices\":[{\"message\":{\"content\":\"ws\"}}]}\n",
        ];
        let general = [
            r#"{"id":"t","choices":[{"message":{"content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[{"message":{"content":"x","tool_calls":[]}}]}"#,
            r#"{"choices":[{"message":{"content":null,"refusal":"no"}}]}"#,
            r#"{"choices":[{"message":{"content":"x"},"finish_reason":"content_filter"}]}"#,
            r#"{"choices":[{"message":{"content":null}}]}"#,
            r#"{"choices":[{"message":{}}]}"#,
            r#"{"choices":[]}"#,
            r#"{"choices":[{"message":{"content":"first","content":"last"}}]}"#,
            r#"{"id":7,"choices":[{"message":{"content":"x"}}]}"#,
            r#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":1.5,"completion_tokens":2}}"#,
            r#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":-1,"completion_tokens":2}}"#,
            r#"{"choices":[{"message":{"content":[{"type":"text","text":"parts"}]}}]}"#,
            r#"{"choices":[{"message":{"content":"x"}}]} trailing"#,
            r#"[1, 2]"#,
            "not json",
        ];
        for body in plain {
            assert!(
                Plain::read(body.as_bytes(), Duration::from_millis(7)).is_some(),
                "{body}"
            );
            let read = read_completion(body.as_bytes(), Duration::from_millis(7));
            assert_eq!(read, by_value(body.as_bytes()), "{body}");
            assert!(matches!(read, Ok(Ok(_))), "{body}");
        }
        for body in general {
            assert!(
                Plain::read(body.as_bytes(), Duration::from_millis(7)).is_none(),
                "{body}"
            );
            assert_eq!(
                read_completion(body.as_bytes(), Duration::from_millis(7)),
                by_value(body.as_bytes()),
                "{body}"
            );
        }
        // The one pass keeps what the general way reads.
        let Ok(Ok(success)) = read_completion(plain[0].as_bytes(), Duration::from_millis(7)) else {
            panic!("the plain answer is a success");
        };
        assert_eq!(success.output, "hi");
        assert_eq!(success.provider_request_id.as_deref(), Some("c1"));
        assert_eq!(success.usage, Some(Usage::new(3, 1)));
    }
}
