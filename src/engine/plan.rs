//! What a job asks of a provider: its prompt rendered for that provider's
//! wire format, whether it fits the provider's context window, and how a
//! provider's answer becomes the job's result.

use crate::contracts::{
    count_prompt_tokens, counted_with_tools, prompt_tokens_at_most, Contract, RenderedPrompt,
    WireFormat,
};
use crate::domain::request::{Message, Role, OPENAI_ANSWER_CHANGING};
use crate::domain::{ErrorKind, JobId, JobRequest};
use crate::providers::catalog::ProviderEntry;
use crate::providers::config::ProviderKind;
use crate::providers::{stable_key, ChatOptions, ChatRequest, Success};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

#[derive(Clone)]
pub struct JobPlan {
    job_id: JobId,
    request: JobRequest,
    /// The loaded contracts; `request.contract` is checked to be among them.
    contracts: Arc<BTreeMap<String, Contract>>,
    /// [`JobPlan::request_for`] per provider name: the prompt is rendered and
    /// counted once per (job, provider), however often routing and the
    /// driver ask, and shared, not copied, by whoever sends it. Shared by
    /// the plan's clones.
    requests: Arc<Mutex<HashMap<String, Planned>>>,
}

/// A provider's request for a job, or why it cannot take the job.
type Planned = Result<Arc<ChatRequest>, PlanError>;

/// A prompt that cannot be sent anywhere: the job fails, it is not retried.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct PlanError {
    /// `ContextLengthExceeded` when the prompt and `max_tokens` do not fit
    /// the provider's window, else `InvalidRequest`: the client's request
    /// as it stands can be taken nowhere.
    pub kind: ErrorKind,
    pub message: String,
}

impl PlanError {
    fn new(message: impl Into<String>) -> Self {
        PlanError {
            kind: ErrorKind::InvalidRequest,
            message: message.into(),
        }
    }

    fn window(message: impl Into<String>) -> Self {
        PlanError {
            kind: ErrorKind::ContextLengthExceeded,
            message: message.into(),
        }
    }
}

impl JobPlan {
    pub fn new(
        job_id: &JobId,
        request_json: &str,
        contracts: &Arc<BTreeMap<String, Contract>>,
    ) -> Result<Self, PlanError> {
        let request = JobRequest::parse(request_json.as_bytes())
            .map_err(|e| PlanError::new(format!("stored request: {e}")))?;
        Self::of_request(job_id, request, contracts)
    }

    /// The plan of a job whose request its door has just decoded and whose
    /// text it is about to store as `stored`: the same plan as
    /// [`JobPlan::new`] over that text, without parsing it again. (The
    /// stored text is the request's canonical JSON, and it parses back to
    /// the same request: debug builds, every test's, check it here.)
    pub fn decoded(
        job_id: &JobId,
        request: &JobRequest,
        stored: &str,
        contracts: &Arc<BTreeMap<String, Contract>>,
    ) -> Result<Self, PlanError> {
        debug_assert_eq!(
            JobRequest::parse(stored.as_bytes()).ok().as_ref(),
            Some(request),
            "a stored request parses back to the request it was made from"
        );
        Self::of_request(job_id, request.clone(), contracts)
    }

    fn of_request(
        job_id: &JobId,
        request: JobRequest,
        contracts: &Arc<BTreeMap<String, Contract>>,
    ) -> Result<Self, PlanError> {
        if let Some(name) = &request.contract {
            if !contracts.contains_key(name) {
                return Err(PlanError::new(format!(
                    "contract {name:?} is not loaded on this server"
                )));
            }
        }
        Ok(JobPlan {
            job_id: job_id.clone(),
            request,
            contracts: contracts.clone(),
            requests: Arc::default(),
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
            // systemInstruction is top level, as Anthropic's `system`.
            ProviderKind::Gemini => WireFormat::Anthropic,
            ProviderKind::AzureOpenai => WireFormat::OpenAi,
            // Converse's `system` blocks are top level too.
            ProviderKind::Bedrock => WireFormat::Anthropic,
        }
    }

    /// The token limit the job asks for (its own, or its contract's);
    /// `None`: the provider's own limit applies, and none is sent where the
    /// wire lets it be left out.
    fn max_tokens(&self) -> Option<u32> {
        self.request
            .params
            .max_tokens
            .or(self.contract().map(|c| c.max_tokens))
    }

    fn prompt(&self, wire: WireFormat) -> Result<RenderedPrompt, PlanError> {
        match (self.contract(), &self.request.input, &self.request.messages) {
            (Some(contract), Some(input), _) => contract
                .render(input, wire)
                .map_err(|e| PlanError::new(format!("contract {}: {e}", contract.name))),
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
            _ => Err(PlanError::new(
                "request has neither contract input nor messages".to_string(),
            )),
        }
    }

    /// The request for `provider`, or why it cannot take this job: the prompt
    /// does not render, or prompt + max_tokens exceed its context window
    /// (never send what must fail with `context_length_exceeded`).
    pub fn request_for(&self, provider: &ProviderEntry) -> Result<Arc<ChatRequest>, PlanError> {
        let known = self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&provider.name)
            .cloned();
        if let Some(known) = known {
            return known;
        }
        let made = self.make_request_for(provider).map(Arc::new);
        self.requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(provider.name.clone(), made.clone());
        made
    }

    /// What an attempt on `provider` used, as the provider's tokenizer
    /// counts it (marked `estimated`): the prompt, and the text it
    /// delivered. For an attempt cut mid-answer, or an answer whose
    /// provider reported no usage. `None` when it cannot be counted.
    pub fn estimated_usage(
        &self,
        provider: &ProviderEntry,
        delivered: &str,
    ) -> Option<crate::providers::Usage> {
        let prompt = self.prompt(Self::wire(provider)).ok()?;
        let prompt = counted_with_tools(&prompt, self.request.params.tools.as_deref());
        let name = provider.config.tokenizer.name();
        let prompt_tokens = count_prompt_tokens(name, &prompt).ok()?;
        let completion = crate::contracts::tokenizer::tokenizer(name)
            .ok()?
            .encode_user_text("answer", delivered)
            .ok()?
            .len();
        Some(crate::providers::Usage {
            estimated: true,
            ..crate::providers::Usage::new(
                u64::from(prompt_tokens),
                u64::try_from(completion).unwrap_or(u64::MAX),
            )
        })
    }

    fn make_request_for(&self, provider: &ProviderEntry) -> Result<ChatRequest, PlanError> {
        let prompt = self.prompt(Self::wire(provider))?;
        let max_tokens = self.max_tokens();
        // The answer's room in the window: the limit the provider is sent
        // (the job's, or the one its wire requires); without one, the
        // prompt alone must fit.
        let room = max_tokens
            .or(provider.config.required_max_tokens())
            .unwrap_or(0);
        let window = u64::from(provider.config.context_window);
        // The exact count only when the byte bound does not already fit:
        // encoding every text of every job is the plan's largest cost.
        // Tool definitions count: the provider reads them with the prompt.
        let counted = counted_with_tools(&prompt, self.request.params.tools.as_deref());
        if prompt_tokens_at_most(&counted) + u64::from(room) > window {
            let tokenizer = provider.config.tokenizer.name();
            let prompt_tokens = count_prompt_tokens(tokenizer, &counted)
                .map_err(|e| PlanError::new(e.to_string()))?;
            if u64::from(prompt_tokens) + u64::from(room) > window {
                return Err(PlanError::window(format!(
                    "context_window: {} needs {prompt_tokens} prompt tokens ({tokenizer}) + {room} max_tokens; \
                     its window is {}",
                    provider.name, provider.config.context_window
                )));
            }
        }
        let params = &self.request.params;
        self.check_capabilities(provider, &prompt)?;
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
                options: ChatOptions::default(),
            },
        };
        request.temperature = params.temperature.or(request.temperature);
        request.top_p = params.top_p.or(request.top_p);
        request.max_tokens = max_tokens;
        let format = params.response_format.as_ref();
        let format_type = format.and_then(|f| f["type"].as_str());
        if format_type == Some("json_schema") {
            request.response_schema = format
                .and_then(|f| f.pointer("/json_schema/schema"))
                .cloned();
        }
        request.options = ChatOptions {
            stop: params.stop.clone(),
            seed: params.seed,
            user: params.user.clone(),
            presence_penalty: params.presence_penalty,
            frequency_penalty: params.frequency_penalty,
            tools: params.tools.clone(),
            tool_choice: params.tool_choice.clone(),
            json_object: format_type == Some("json_object"),
            schema_name: format
                .and_then(|f| f.pointer("/json_schema/name"))
                .and_then(Value::as_str)
                .map(str::to_string),
            parallel_tool_calls: params.parallel_tool_calls,
            openai: params.openai.clone(),
        };
        Ok(request)
    }

    /// What a provider cannot honour makes it skip the job, never drop the
    /// ask: image parts need `accepts_images`; the Anthropic wire format has
    /// no `seed` or penalties, and takes a `temperature` of 0 to 1 (so does
    /// Converse), where OpenAI's goes to 2.
    fn check_capabilities(
        &self,
        provider: &ProviderEntry,
        prompt: &RenderedPrompt,
    ) -> Result<(), PlanError> {
        if prompt.messages.iter().any(Message::has_images) && !provider.config.takes_images() {
            return Err(PlanError::new(format!(
                "{}: does not accept image parts (accepts_images = false)",
                provider.name
            )));
        }
        let params = &self.request.params;
        let kind = provider.config.kind;
        let openai_wire = matches!(
            kind,
            ProviderKind::Openai | ProviderKind::AzureOpenai | ProviderKind::Sim
        );
        if !openai_wire {
            let fields = params.openai.iter().flat_map(|f| f.keys());
            if let Some(name) = fields
                .into_iter()
                .find(|k| OPENAI_ANSWER_CHANGING.contains(&k.as_str()))
            {
                return Err(PlanError::new(format!(
                    "{}: {name} is only taken by OpenAI's wire format",
                    provider.name
                )));
            }
        }
        for field in &provider.config.refuses {
            let set = match field.as_str() {
                "seed" => params.seed.is_some(),
                "presence_penalty" => params.presence_penalty.is_some(),
                "frequency_penalty" => params.frequency_penalty.is_some(),
                "stop" => params.stop.is_some(),
                "parallel_tool_calls" => params.parallel_tool_calls == Some(false),
                other => params.openai.as_ref().is_some_and(|f| {
                    OPENAI_ANSWER_CHANGING.contains(&other) && f.contains_key(other)
                }),
            };
            if set {
                return Err(PlanError::new(format!(
                    "{}: its server refuses {field} (refuses in its file)",
                    provider.name
                )));
            }
        }
        // Anthropic's wire has no "any JSON object" mode (a schema it has:
        // `json_schema` goes as `output_config.format`): the answer would
        // be prose, fail the job's check and be paid for.
        if kind == ProviderKind::Anthropic
            && params
                .response_format
                .as_ref()
                .is_some_and(|f| f["type"] == "json_object")
        {
            return Err(PlanError::new(format!(
                "{}: response_format json_object cannot be asked of Anthropic's wire format (json_schema can)",
                provider.name
            )));
        }
        if matches!(kind, ProviderKind::Gemini | ProviderKind::Bedrock)
            && params.parallel_tool_calls == Some(false)
        {
            return Err(PlanError::new(format!(
                "{}: parallel_tool_calls = false cannot be asked of its wire format",
                provider.name
            )));
        }
        if matches!(kind, ProviderKind::Anthropic | ProviderKind::Bedrock) {
            let temperature = params
                .temperature
                .or(self.contract().map(|c| c.temperature));
            if let Some(t) = temperature.filter(|t| *t > 1.0) {
                return Err(PlanError::new(format!(
                    "{}: temperature {t} is above 1, the most the {} wire format takes",
                    provider.name,
                    if kind == ProviderKind::Bedrock {
                        "Converse"
                    } else {
                        "Anthropic"
                    }
                )));
            }
            for (name, given) in [
                ("seed", params.seed.is_some()),
                ("presence_penalty", params.presence_penalty.is_some()),
                ("frequency_penalty", params.frequency_penalty.is_some()),
            ] {
                if given {
                    return Err(PlanError::new(format!(
                        "{}: {name} is not supported by the {} wire format",
                        provider.name,
                        if provider.config.kind == ProviderKind::Bedrock {
                            "Converse"
                        } else {
                            "Anthropic"
                        }
                    )));
                }
            }
        }
        Ok(())
    }

    /// The job result an admin's `complete` makes of `result`, held to what
    /// an answer is held to: a contract job's result validates against the
    /// contract's schema; any other job's is its text as a JSON string
    /// (checked against `response_format` when it asks for JSON) or a
    /// turn's `{"content", "tool_calls"}`. Never `null`.
    pub fn admins_result(&self, result: &Value) -> Result<String, String> {
        let answer = |output: String, tool_calls: Vec<Value>| Success {
            output,
            tool_calls,
            usage: None,
            provider_request_id: None,
            latency: std::time::Duration::ZERO,
            finish: None,
        };
        let made = match result {
            Value::Null => return Err("must not be null".to_string()),
            _ if self.contract().is_some() => {
                self.result_from(&answer(crate::domain::json_text(result), Vec::new()))
            }
            Value::String(text) => self.result_from(&answer(text.clone(), Vec::new())),
            Value::Object(turn) if turn.get("tool_calls").is_some_and(Value::is_array) => {
                let content = match turn.get("content") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(text)) => text.clone(),
                    Some(_) => return Err("content: must be a string or null".to_string()),
                };
                let calls = turn["tool_calls"].as_array().cloned().unwrap_or_default();
                if calls.is_empty() {
                    return Err("tool_calls: must name at least one call".to_string());
                }
                self.result_from(&answer(content, calls))
            }
            _ => return Err(
                "this job's answer is its text as a JSON string, or {\"content\", \"tool_calls\"}"
                    .to_string(),
            ),
        };
        made.map_err(|(_, message)| message)
    }

    /// The job result a provider's answer makes: for a contract job the
    /// output validated against its schema (canonical JSON); for a turn that
    /// calls tools `{"content", "tool_calls"}`; else the text as a JSON
    /// string, checked against the request's `response_format` when it asks
    /// for JSON. A violation is a failed attempt of kind `contract_violation`.
    pub fn result_from(&self, success: &Success) -> Result<String, (ErrorKind, String)> {
        let output = success.output.as_str();
        let violation = |message: String| (ErrorKind::ContractViolation, message);
        if let Some(contract) = self.contract() {
            return match contract.validate_output(output) {
                Ok(value) => Ok(crate::domain::fingerprint::canonical_json(&value)),
                Err(v) => Err(violation(v.to_string())),
            };
        }
        if !success.tool_calls.is_empty() {
            let content = (!output.is_empty()).then_some(output);
            return Ok(crate::domain::json_text(
                &json!({"content": content, "tool_calls": success.tool_calls}),
            ));
        }
        let format = self.request.params.response_format.as_ref();
        match format.and_then(|f| f["type"].as_str()) {
            Some("json_object") => match serde_json::from_str::<Value>(output) {
                Ok(Value::Object(_)) => {}
                _ => {
                    return Err(violation(
                        "response_format json_object: the answer is not a JSON object".into(),
                    ))
                }
            },
            Some("json_schema") => {
                let schema = format
                    .and_then(|f| f.pointer("/json_schema/schema"))
                    .cloned()
                    .unwrap_or(Value::Null);
                let value: Value = serde_json::from_str(output).map_err(|e| {
                    violation(format!(
                        "response_format json_schema: the answer is not JSON: {e}"
                    ))
                })?;
                let validator = jsonschema::validator_for(&schema)
                    .map_err(|e| violation(format!("response_format json_schema: {e}")))?;
                let first_error = validator.iter_errors(&value).next().map(|error| {
                    format!(
                        "response_format json_schema: the answer breaks the schema at {:?}: {error}",
                        error.instance_path().to_string()
                    )
                });
                if let Some(message) = first_error {
                    return Err(violation(message));
                }
            }
            _ => {}
        }
        // A JSON string, as `Value::String` writes one, without copying it first.
        Ok(serde_json::to_string(output).unwrap_or_default())
    }
}
