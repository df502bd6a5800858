//! What a job asks of a provider: its prompt rendered for that provider's
//! wire format, whether it fits the provider's context window, and how a
//! provider's answer becomes the job's result.

use crate::contracts::{
    count_prompt_tokens, Contract, RenderedPrompt, WireFormat, CONTRACT_VIOLATION_KIND,
};
use crate::domain::request::{Message, Role};
use crate::domain::JobRequest;
use crate::providers::catalog::ProviderEntry;
use crate::providers::config::ProviderKind;
use crate::providers::{stable_key, ChatRequest};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Tokens a request may ask for when neither the job nor its contract says.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;

#[derive(Clone)]
pub struct JobPlan {
    job_id: String,
    request: JobRequest,
    /// The loaded contracts; `request.contract` is checked to be among them.
    contracts: Arc<BTreeMap<String, Contract>>,
}

/// A prompt that cannot be sent anywhere: the job fails, it is not retried.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct PlanError(pub String);

impl JobPlan {
    pub fn new(
        job_id: &str,
        request_json: &str,
        contracts: &Arc<BTreeMap<String, Contract>>,
    ) -> Result<Self, PlanError> {
        let request = JobRequest::parse(request_json.as_bytes())
            .map_err(|e| PlanError(format!("stored request: {e}")))?;
        if let Some(name) = &request.contract {
            if !contracts.contains_key(name) {
                return Err(PlanError(format!(
                    "contract {name:?} is not loaded on this server"
                )));
            }
        }
        Ok(JobPlan {
            job_id: job_id.to_string(),
            request,
            contracts: contracts.clone(),
        })
    }

    fn contract(&self) -> Option<&Contract> {
        self.request
            .contract
            .as_ref()
            .and_then(|name| self.contracts.get(name))
    }

    pub fn contract_name(&self) -> Option<&str> {
        self.request.contract.as_deref()
    }

    fn wire(provider: &ProviderEntry) -> WireFormat {
        match provider.config.kind {
            ProviderKind::Anthropic => WireFormat::Anthropic,
            ProviderKind::Openai | ProviderKind::Sim => WireFormat::OpenAi,
        }
    }

    fn max_tokens(&self) -> u32 {
        self.request
            .params
            .max_tokens
            .or(self.contract().map(|c| c.max_tokens))
            .unwrap_or(DEFAULT_MAX_TOKENS)
    }

    fn prompt(&self, wire: WireFormat) -> Result<RenderedPrompt, PlanError> {
        match (self.contract(), &self.request.input, &self.request.messages) {
            (Some(contract), Some(input), _) => contract
                .render(input, wire)
                .map_err(|e| PlanError(format!("contract {}: {e}", contract.name))),
            (_, _, Some(messages)) => {
                let system: Vec<&str> = messages
                    .iter()
                    .filter(|m| m.role == Role::System)
                    .map(|m| m.content.as_str())
                    .collect();
                let turns: Vec<Message> = messages
                    .iter()
                    .filter(|m| m.role != Role::System)
                    .cloned()
                    .collect();
                Ok(RenderedPrompt {
                    system: (!system.is_empty()).then(|| system.join("\n\n")),
                    messages: turns,
                })
            }
            _ => Err(PlanError(
                "request has neither contract input nor messages".to_string(),
            )),
        }
    }

    /// The request for `provider`, or why it cannot take this job: the prompt
    /// does not render, or prompt + max_tokens exceed its context window
    /// (never send what must fail with `context_length_exceeded`).
    pub fn request_for(&self, provider: &ProviderEntry) -> Result<ChatRequest, PlanError> {
        let prompt = self.prompt(Self::wire(provider))?;
        let tokenizer = provider.config.tokenizer.name();
        let prompt_tokens =
            count_prompt_tokens(tokenizer, &prompt).map_err(|e| PlanError(e.to_string()))?;
        let max_tokens = self.max_tokens();
        let needed = u64::from(prompt_tokens) + u64::from(max_tokens);
        if needed > u64::from(provider.config.context_window) {
            return Err(PlanError(format!(
                "context_window: {} needs {prompt_tokens} prompt tokens ({tokenizer}) + {max_tokens} max_tokens; \
                 its window is {}",
                provider.name, provider.config.context_window
            )));
        }
        let key = stable_key(&self.job_id, &provider.name);
        let mut request = match self.contract() {
            Some(contract) => contract.request_for(prompt, key),
            None => ChatRequest {
                system: prompt.system,
                messages: prompt.messages,
                temperature: None,
                max_tokens: None,
                top_p: None,
                response_schema: None,
                idempotency_key: key,
            },
        };
        let params = &self.request.params;
        request.temperature = params.temperature.or(request.temperature);
        request.top_p = params.top_p.or(request.top_p);
        request.max_tokens = Some(max_tokens);
        Ok(request)
    }

    /// The job result a provider's output makes: for a contract job the output
    /// validated against its schema (canonical JSON), else the text as a JSON
    /// string. A violation is a failed attempt of kind `contract_violation`.
    pub fn result_from(&self, output: &str) -> Result<String, (String, String)> {
        match self.contract() {
            Some(contract) => match contract.validate_output(output) {
                Ok(value) => Ok(crate::domain::fingerprint::canonical_json(&value)),
                Err(violation) => Err((CONTRACT_VIOLATION_KIND.to_string(), violation.to_string())),
            },
            None => Ok(serde_json::Value::String(output.to_string()).to_string()),
        }
    }
}
