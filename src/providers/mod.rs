//! Provider adapters behind one interface.
//!
//! A call returns one of three outcomes, classified where the error is born:
//! succeeded, failed (definitive: retryable or not), or unknown (the request
//! may have been executed). A lookup asks the provider, by the job's stable
//! key, whether it executed the work.

pub mod anthropic;
pub mod aws_auth;
pub mod azure;
pub mod bedrock;
pub mod catalog;
pub mod classify;
pub mod config;
pub mod eventstream;
pub mod gemini;
pub mod openai;
pub mod sigv4;
pub mod sim;
pub mod stream;
pub mod switches;
pub mod transport;
pub mod vertex_auth;

use crate::domain::request::Message;
use crate::domain::text::OneLine;
use crate::domain::JobId;
use async_trait::async_trait;
use config::{ProviderConfig, ProviderConfigError, ProviderKind};
use std::sync::Arc;

/// One chat completion request, already rendered for the provider's wire format
/// by the caller except for placement details the adapter owns (e.g. Anthropic's
/// top-level `system`).
#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    /// System prompt; OpenAI-style adapters send it as the first message,
    /// Anthropic as the top-level `system` field.
    pub system: Option<String>,
    /// User/assistant turns (system messages in here are folded into `system`
    /// by adapters that need it).
    pub messages: Vec<Message>,
    pub temperature: Option<f64>,
    pub max_tokens: Option<u32>,
    pub top_p: Option<f64>,
    /// JSON Schema the output must satisfy, sent as `response_format` where the
    /// wire format has one.
    pub response_schema: Option<serde_json::Value>,
    /// Invariant 6: derived from the job and the provider, never the attempt.
    pub idempotency_key: String,
    /// What else the OpenAI chat format lets a client ask for.
    pub options: ChatOptions,
}

/// Sampling and tool options beyond the basics, carried to each wire format
/// as it can express them.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOptions {
    pub stop: Option<Vec<String>>,
    pub seed: Option<i64>,
    pub user: Option<String>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    /// OpenAI-shaped tool definitions.
    pub tools: Option<Vec<serde_json::Value>>,
    pub tool_choice: Option<serde_json::Value>,
    /// Ask for a JSON object (OpenAI's `json_object` mode).
    pub json_object: bool,
    /// The name a `json_schema` response format goes by (default `output`).
    pub schema_name: Option<String>,
    /// `Some(false)`: at most one tool call per turn.
    pub parallel_tool_calls: Option<bool>,
    /// Chat Completions fields only OpenAI's wire has (the request's
    /// `params.openai`), sent as given by the OpenAI-wire kinds.
    pub openai: Option<serde_json::Map<String, serde_json::Value>>,
}

/// How a call ends, and its parts: the domain's one outcome type, which
/// the store's finish step takes as it is.
pub use crate::domain::attempt::{Ambiguous, AttemptOutcome, Failure, Success, Usage};

/// The answer to "did you execute the work with this key?".
#[derive(Debug, Clone, PartialEq)]
pub enum Lookup {
    Found(Success),
    NotFound,
    /// The provider offers no lookup (Anthropic), or the lookup itself failed:
    /// the outcome stays unknown.
    CannotTell(String),
}

/// How a streamed call ended, and (when it succeeded) why the provider stopped.
pub type Streamed = (AttemptOutcome, Option<stream::StreamFinish>);

#[async_trait]
pub trait Provider: Send + Sync {
    /// The provider's configured name (the file stem of providers/NAME.toml).
    fn name(&self) -> &str;
    async fn call(&self, request: &ChatRequest) -> AttemptOutcome;
    /// The same call, streamed: each piece of the answer goes to `deltas`
    /// as it arrives; the outcome carries the whole text. A provider that
    /// cannot stream answers in one piece.
    async fn stream(&self, request: &ChatRequest, deltas: &stream::ChunkSender) -> Streamed {
        stream::whole(self.call(request).await, deltas)
    }
    async fn lookup(&self, idempotency_key: &str) -> Lookup;
    /// The provider's own count of `request`'s prompt tokens, where its
    /// API has one (Gemini's `countTokens`, Bedrock's `CountTokens`): the contract run compares it
    /// with ours. `None` where there is none.
    async fn count_tokens(&self, _request: &ChatRequest) -> Option<Result<u32, String>> {
        None
    }
}

/// Invariant 6: the key every call of `job_id` on `provider` carries, the same
/// on every retry there and different per provider.
pub fn stable_key(job_id: &JobId, provider: &str) -> String {
    use sha2::{Digest, Sha256};
    const HEX: &[u8; 16] = b"0123456789abcdef";
    // The SHA-256 of "{job_id}\n{provider}", its first 20 bytes in hex,
    // written straight into the key (no `format!`, no `char` iterator: this
    // runs once per job and provider on the job's path).
    let digest = Sha256::new()
        .chain_update(job_id.as_str())
        .chain_update(b"\n")
        .chain_update(provider)
        .finalize();
    let mut key = String::with_capacity(47);
    key.push_str("onejob-");
    for byte in &digest[..20] {
        key.push(char::from(HEX[usize::from(byte >> 4)]));
        key.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    key
}

/// Construct the adapter `config.kind` names, with an HTTP client honouring
/// its timeouts and the API key resolved from its environment variable.
pub fn build_provider(
    name: &str,
    config: &ProviderConfig,
) -> Result<Arc<dyn Provider>, ProviderConfigError> {
    let api_key = config.resolve_api_key()?;
    let client =
        transport::http_client(&config.timeouts).map_err(|e| ProviderConfigError::Client {
            path: config.source.clone(),
            message: classify::error_chain(&e),
        })?;
    Ok(match config.kind {
        ProviderKind::Openai => {
            Arc::new(openai::OpenAiProvider::new(name, config, client, api_key))
        }
        ProviderKind::Anthropic => Arc::new(anthropic::AnthropicProvider::new(
            name, config, client, api_key,
        )),
        ProviderKind::Sim => Arc::new(sim::SimProvider::new(openai::OpenAiProvider::new(
            name, config, client, api_key,
        ))),
        ProviderKind::Gemini => {
            let auth = vertex_auth_of(config, &client)?;
            Arc::new(gemini::GeminiProvider::new(
                name, config, client, api_key, auth,
            ))
        }
        ProviderKind::AzureOpenai => Arc::new(azure::AzureOpenAiProvider::new(
            name, config, client, api_key,
        )),
        ProviderKind::Bedrock => {
            let credentials = aws_auth::credentials_of(config)?;
            Arc::new(bedrock::BedrockProvider::new(
                name,
                config,
                client,
                credentials,
            ))
        }
    })
}

/// Vertex AI's token source, for a gemini provider that names
/// `vertex_project`: the service account read from the file that
/// `credentials_env` names.
fn vertex_auth_of(
    config: &ProviderConfig,
    client: &reqwest::Client,
) -> Result<Option<vertex_auth::VertexAuth>, ProviderConfigError> {
    let (Some(_), Some(var)) = (&config.vertex_project, &config.credentials_env) else {
        return Ok(None);
    };
    let account =
        vertex_auth::account_from_env(var).map_err(|message| ProviderConfigError::Credentials {
            path: config.source.clone(),
            var: var.clone(),
            message,
        })?;
    Ok(Some(vertex_auth::VertexAuth::new(
        account,
        client.clone(),
        config.timeouts,
    )))
}

/// Log how a call ended, once, where it ended: in the span of the attempt
/// that made it (`job_id`, `attempt_id`, `provider`, `kind`; a contract
/// run's `contract`, `provider`), with the key the provider saw, so its own
/// logs can be searched for it. A call has no span of its own: the
/// attempt's is the call's, in the logs and in an exported trace.
fn trace_outcome(outcome: &AttemptOutcome, key: &str) {
    match outcome {
        AttemptOutcome::Succeeded(s) => {
            tracing::debug!(
                key,
                latency_ms = s.latency.as_millis() as u64,
                "provider call succeeded"
            )
        }
        AttemptOutcome::Failed(f) => tracing::warn!(
            key, kind = %f.kind, retryable = f.retryable, status = f.status,
            message = %OneLine(&f.message), "provider call failed"
        ),
        AttemptOutcome::Unknown(a) => tracing::warn!(
            key, kind = %a.kind, message = %OneLine(&a.message), "provider call outcome unknown"
        ),
        AttemptOutcome::Abandoned { reason } => {
            tracing::info!(key, reason = %OneLine(reason), "provider call abandoned")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_key_depends_on_job_and_provider_only() {
        let (j1, j2) = (JobId::from("j1"), JobId::from("j2"));
        assert_eq!(stable_key(&j1, "a"), stable_key(&j1, "a"));
        assert_ne!(stable_key(&j1, "a"), stable_key(&j1, "b"));
        assert_ne!(stable_key(&j1, "a"), stable_key(&j2, "a"));
    }

    /// The key a provider dedupes on must not change between builds: a job
    /// resumed after an upgrade resends its attempt under the same key.
    /// (`printf '%s\nprimary' JOB | sha256sum`, its first 40 hex digits.)
    #[test]
    fn stable_key_is_the_same_as_every_earlier_build() {
        let job = JobId::from("0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b");
        assert_eq!(
            stable_key(&job, "primary"),
            "onejob-1876a2bde1e59d490dbd4f81d661153d41718142"
        );
    }
}
