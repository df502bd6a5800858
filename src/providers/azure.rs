//! Azure OpenAI: OpenAI's Chat Completions wire at a deployment's URL,
//! `POST {base}/openai/deployments/{deployment}/chat/completions?api-version=V`,
//! with the resource key as `api-key` (or an Entra ID token as `Bearer`).
//!
//! Bodies, answers and stream chunks are OpenAI's and are read by
//! [`super::openai`]; this module owns the URL, the auth header, and
//! Azure's content filter, whose verdict per category (hate, sexual,
//! violence, self_harm, jailbreak, …) is kept in the refusal's message,
//! whether it arrives as a 400 or as `finish_reason: "content_filter"`.
//!
//! Azure's stored completions are not used, so an attempt cannot be looked
//! up by key: an unknown attempt here is settled late or by a human.

use super::classify::{azure_filtered_categories, classify_azure, error_chain};
use super::config::{AzureAuth, MaxTokensField, ProviderConfig, Secret, Timeouts};
use super::openai::{completion_to_success, request_body};
use super::stream::{self, ChunkSender, OpenAiReader, SseEvent, Step, WireReader};
use super::transport::exchange;
use super::{AttemptOutcome, ChatRequest, Failure, Lookup, Provider, Streamed, Success, Usage};
use crate::domain::ErrorKind;
use async_trait::async_trait;
use serde_json::{json, Value};
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct AzureOpenAiProvider {
    name: String,
    client: reqwest::Client,
    url: String,
    api_version: String,
    model: String,
    api_key: Option<Secret>,
    auth: AzureAuth,
    stream_usage: bool,
    refuses: Vec<String>,
    /// The field a job's token limit goes in.
    max_tokens_field: MaxTokensField,
    timeouts: Timeouts,
}

impl AzureOpenAiProvider {
    pub fn new(
        name: &str,
        config: &ProviderConfig,
        client: reqwest::Client,
        api_key: Option<Secret>,
    ) -> Self {
        let deployment = config.deployment.as_deref().unwrap_or_default();
        AzureOpenAiProvider {
            name: name.to_string(),
            client,
            url: format!(
                "{}/openai/deployments/{deployment}/chat/completions",
                config.base()
            ),
            api_version: config.api_version.clone().unwrap_or_default(),
            model: config.model.clone(),
            api_key,
            auth: config.azure_auth.unwrap_or_default(),
            stream_usage: config.stream_usage.unwrap_or(true),
            refuses: config.refuses.clone(),
            max_tokens_field: config.max_tokens_field(),
            timeouts: config.timeouts,
        }
    }

    fn post(&self, request: &ChatRequest, body: &Value) -> reqwest::RequestBuilder {
        let builder = self
            .client
            .post(&self.url)
            .query(&[("api-version", self.api_version.as_str())])
            .header("Idempotency-Key", &request.idempotency_key)
            .json(body);
        match (&self.api_key, self.auth) {
            (Some(key), AzureAuth::ApiKey) => builder.header("api-key", key.expose()),
            (Some(key), AzureAuth::Bearer) => builder.bearer_auth(key.expose()),
            (None, _) => builder,
        }
    }
}

/// A content-filter stop of `choice`, with the categories that tripped it.
fn filtered(choice: &Value) -> Option<Failure> {
    if choice["finish_reason"] != "content_filter" {
        return None;
    }
    let categories = azure_filtered_categories(&choice["content_filter_results"]);
    let mut message = "finish_reason content_filter".to_string();
    if !categories.is_empty() {
        message.push_str(&format!(" [filtered: {}]", categories.join(", ")));
    }
    Some(Failure {
        retryable: false,
        retry_after: None,
        kind: ErrorKind::ContentPolicy,
        message,
        status: None,
    })
}

/// Read an answer as OpenAI's, a content-filter stop keeping its categories.
pub fn completion_of(
    completion: &Value,
    latency: Duration,
) -> Result<Result<Success, Failure>, String> {
    match completion.pointer("/choices/0").and_then(filtered) {
        Some(failure) => Ok(Err(failure)),
        None => completion_to_success(completion, latency),
    }
}

/// OpenAI's chunks; a content-filter stop keeps its categories.
#[derive(Debug, Default)]
pub(crate) struct AzureReader {
    openai: OpenAiReader,
}

impl WireReader for AzureReader {
    fn read(&mut self, event: &SseEvent) -> Step {
        if let Ok(chunk) = serde_json::from_str::<Value>(&event.data) {
            if let Some(failure) = chunk.pointer("/choices/0").and_then(filtered) {
                return Step::Refused(failure);
            }
        }
        self.openai.read(event)
    }

    fn finish_reason(&self) -> Option<crate::domain::FinishReason> {
        self.openai.finish_reason()
    }

    fn usage(&self) -> Option<Usage> {
        self.openai.usage()
    }

    fn provider_request_id(&self) -> Option<String> {
        self.openai.provider_request_id()
    }
}

#[async_trait]
impl Provider for AzureOpenAiProvider {
    fn name(&self) -> &str {
        &self.name
    }

    async fn call(&self, request: &ChatRequest) -> AttemptOutcome {
        let mut body = request_body(&self.model, request, false, self.max_tokens_field);
        super::openai::leave_out(&mut body, &self.refuses);
        let outcome = match exchange(self.post(request, &body), &self.timeouts).await {
            Ok(response) => {
                let latency = response.latency;
                classify_azure(response.status, &response.headers, &response.body, |b| {
                    let value: Value = serde_json::from_slice(b).map_err(|e| error_chain(&e))?;
                    completion_of(&value, latency)
                })
            }
            Err(outcome) => outcome,
        };
        super::trace_outcome(&outcome, &request.idempotency_key);
        outcome
    }

    async fn stream(&self, request: &ChatRequest, deltas: &ChunkSender) -> Streamed {
        let mut body = request_body(&self.model, request, false, self.max_tokens_field);
        super::openai::leave_out(&mut body, &self.refuses);
        body["stream"] = json!(true);
        if self.stream_usage {
            body["stream_options"] = json!({"include_usage": true});
        }
        let streamed = stream::run_classified(
            self.post(request, &body),
            &self.timeouts,
            AzureReader::default(),
            deltas,
            |status, headers, body| {
                classify_azure(status, headers, body, |_| Err("not a success".into()))
            },
        )
        .await;
        super::trace_outcome(&streamed.0, &request.idempotency_key);
        streamed
    }

    async fn lookup(&self, _idempotency_key: &str) -> Lookup {
        Lookup::CannotTell("azure_openai offers no lookup by key".into())
    }
}
