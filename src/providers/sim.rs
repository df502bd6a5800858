//! Client for the built-in simulator: calls speak OpenAI's wire format (the
//! same code as [`super::openai`]); lookup asks the simulator's ledger.

use super::config::LookupMode;
use super::openai::{call_openai_wire, stream_openai_wire, OpenAiProvider};
use super::stream::ChunkSender;
use super::{AttemptOutcome, ChatRequest, Lookup, Provider, Streamed, Success, Usage};
use crate::domain::FinishReason;
use async_trait::async_trait;
use serde::Deserialize;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct SimProvider {
    inner: OpenAiProvider,
}

impl SimProvider {
    pub fn new(inner: OpenAiProvider) -> Self {
        SimProvider { inner }
    }
}

/// `GET /sim/ledger?key=K`, as the simulator answers it.
#[derive(Debug, Deserialize)]
struct LedgerAnswer {
    executions: u64,
    answer: Option<RecordedAnswer>,
}

#[derive(Debug, Deserialize)]
struct RecordedAnswer {
    id: String,
    output: String,
    usage: Usage,
    #[serde(default)]
    tool_calls: Vec<serde_json::Value>,
    /// The simulator cut the answer at the request's token limit.
    #[serde(default)]
    truncated: bool,
}

#[async_trait]
impl Provider for SimProvider {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn call(&self, request: &ChatRequest) -> AttemptOutcome {
        let outcome = call_openai_wire(&self.inner, request).await;
        super::trace_outcome(&outcome, &request.idempotency_key);
        outcome
    }

    async fn stream(&self, request: &ChatRequest, deltas: &ChunkSender) -> Streamed {
        stream_openai_wire(&self.inner, request, deltas).await
    }

    #[tracing::instrument(skip_all, fields(provider = %self.inner.name(), key = %idempotency_key))]
    async fn lookup(&self, idempotency_key: &str) -> Lookup {
        // `lookup` means the same for every kind: "none" cannot tell.
        if self.inner.lookup_mode() != LookupMode::SimLedger {
            return Lookup::CannotTell(format!(
                "provider {} has no lookup configured",
                self.inner.name()
            ));
        }
        let response = match self
            .inner
            .get("/sim/ledger", &[("key", idempotency_key)])
            .await
        {
            Ok(r) if r.status.is_success() => r,
            Ok(r) => {
                return Lookup::CannotTell(format!("ledger answered HTTP {}", r.status.as_u16()))
            }
            Err(outcome) => {
                return Lookup::CannotTell(format!("ledger lookup failed: {outcome:?}"))
            }
        };
        let ledger: LedgerAnswer = match serde_json::from_slice(&response.body) {
            Ok(l) => l,
            Err(e) => return Lookup::CannotTell(format!("unreadable ledger answer: {e}")),
        };
        match (ledger.executions, ledger.answer) {
            (0, _) => Lookup::NotFound,
            (_, Some(answer)) => Lookup::Found(Success {
                finish: Some(match (answer.truncated, answer.tool_calls.is_empty()) {
                    (true, _) => FinishReason::Length,
                    (false, true) => FinishReason::Stop,
                    (false, false) => FinishReason::ToolCalls,
                }),
                output: answer.output,
                tool_calls: answer.tool_calls,
                usage: Some(answer.usage),
                provider_request_id: Some(answer.id),
                latency: Duration::ZERO,
            }),
            (n, None) => {
                Lookup::CannotTell(format!("ledger counts {n} executions but holds no answer"))
            }
        }
    }
}
