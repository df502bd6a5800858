//! Unit tests of the run's check logic against a canned, in-process provider.
//! The end-to-end run against the simulator server lives in `tests/`.

use super::*;
use crate::contracts::definition::load_all;
use crate::contracts::render::RenderedPrompt;
use crate::contracts::tokenizer::count_prompt_tokens;
use crate::domain::ErrorKind;
use crate::providers::{Ambiguous, ChatRequest, Failure, Lookup, Usage};
use async_trait::async_trait;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

type Respond = Box<dyn Fn(&ChatRequest) -> AttemptOutcome + Send + Sync>;

/// Answers each call with `respond` and remembers the requests it saw.
struct CannedProvider {
    respond: Respond,
    seen: Mutex<Vec<ChatRequest>>,
}

impl CannedProvider {
    fn new(respond: impl Fn(&ChatRequest) -> AttemptOutcome + Send + Sync + 'static) -> Self {
        CannedProvider {
            respond: Box::new(respond),
            seen: Mutex::new(Vec::new()),
        }
    }
}

#[async_trait]
impl Provider for CannedProvider {
    fn name(&self) -> &str {
        "canned"
    }
    async fn call(&self, request: &ChatRequest) -> AttemptOutcome {
        self.seen.lock().unwrap().push(request.clone());
        (self.respond)(request)
    }
    async fn lookup(&self, _idempotency_key: &str) -> Lookup {
        Lookup::NotFound
    }
}

fn triage() -> Contract {
    load_all(&Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts"))
        .unwrap()
        .remove("ticket-triage")
        .unwrap()
}

fn profile(wire: WireFormat) -> ProviderProfile {
    ProviderProfile {
        name: "canned".into(),
        wire,
        tokenizer: "o200k_base".into(),
        context_window: 16_384,
        digest: "0123456789abcdef".into(),
    }
}

fn triage_answer() -> Value {
    json!({
        "category": "technical",
        "priority": "normal",
        "summary": "Customer reports a problem.",
        "language": "en",
        "needs_human": false,
        "product": null
    })
}

/// Our own prompt count for `request`, as an honest provider would report.
fn honest_prompt_tokens(request: &ChatRequest) -> u32 {
    let prompt = RenderedPrompt {
        system: request.system.clone(),
        messages: request.messages.clone(),
    };
    count_prompt_tokens("o200k_base", &prompt).unwrap()
}

fn success(output: String, prompt_tokens: Option<u32>) -> AttemptOutcome {
    AttemptOutcome::Succeeded(Success {
        output,
        tool_calls: Vec::new(),
        usage: prompt_tokens.map(|prompt_tokens| Usage::new(u64::from(prompt_tokens), 20)),
        provider_request_id: Some("req-1".into()),
        latency: Duration::from_millis(5),
        finish: None,
    })
}

fn healthy() -> CannedProvider {
    CannedProvider::new(|request| {
        success(
            triage_answer().to_string(),
            Some(honest_prompt_tokens(request)),
        )
    })
}

fn failures_of(report: &ContractReport) -> Vec<(String, CheckKind, String)> {
    report
        .failures()
        .map(|c| (c.case.clone(), c.check, c.message.clone()))
        .collect()
}

#[tokio::test]
async fn healthy_provider_passes_every_check_of_every_case() {
    let contract = triage();
    let provider = healthy();
    let report = run_contract(&provider, &profile(WireFormat::OpenAi), &contract).await;
    assert!(report.passed, "{}", report.to_table());
    assert_eq!(report.checks.len(), contract.cases.len() * 4);
    assert_eq!(report.contract_digest, contract.digest());

    let seen = provider.seen.lock().unwrap();
    assert_eq!(seen.len(), contract.cases.len());
    let first = &seen[0];
    assert_eq!(
        first.idempotency_key,
        format!(
            "contract-{}-canned-0123456789ab-{}",
            &contract.digest()[..12],
            contract.cases[0].name
        )
    );
    assert_eq!(first.temperature, Some(0.0));
    assert_eq!(first.max_tokens, Some(contract.max_tokens));
    assert_eq!(first.response_schema.as_ref(), Some(&contract.schema));
    assert_eq!(
        first.system, None,
        "OpenAI puts the system prompt in messages"
    );
}

#[tokio::test]
async fn anthropic_profile_sends_top_level_system() {
    let contract = triage();
    let provider = healthy();
    let report = run_contract(&provider, &profile(WireFormat::Anthropic), &contract).await;
    assert!(report.passed, "{}", report.to_table());
    let seen = provider.seen.lock().unwrap();
    assert_eq!(seen[0].system.as_deref(), Some(contract.system.as_str()));
}

#[tokio::test]
async fn invented_key_fails_schema_for_that_case_only() {
    let contract = triage();
    let bad_case = contract.cases[1].name.clone();
    let key_suffix = format!("-{bad_case}");
    let provider = CannedProvider::new(move |request| {
        let mut answer = triage_answer();
        if request.idempotency_key.ends_with(&key_suffix) {
            answer["sentiment"] = json!("angry");
        }
        success(answer.to_string(), Some(honest_prompt_tokens(request)))
    });
    let report = run_contract(&provider, &profile(WireFormat::OpenAi), &contract).await;
    assert!(!report.passed);
    let failures = failures_of(&report);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, bad_case);
    assert_eq!(failures[0].1, CheckKind::Schema);
    assert!(failures[0].2.contains("`sentiment`"), "{}", failures[0].2);
    assert!(report
        .to_table()
        .contains("invented top-level key `sentiment`"));
}

#[tokio::test]
async fn prose_answer_fails_schema_and_round_trip() {
    let contract = triage();
    let provider = CannedProvider::new(|request| {
        success(
            "The category is billing.".into(),
            Some(honest_prompt_tokens(request)),
        )
    });
    let report = run_contract(&provider, &profile(WireFormat::OpenAi), &contract).await;
    let kinds: Vec<CheckKind> = failures_of(&report).into_iter().map(|f| f.1).collect();
    assert_eq!(kinds.len(), contract.cases.len() * 2);
    assert!(kinds
        .iter()
        .all(|k| matches!(k, CheckKind::Schema | CheckKind::RoundTrip)));
}

#[tokio::test]
async fn missing_expected_field_fails_round_trip_with_its_name() {
    let contract = triage();
    let provider = CannedProvider::new(|request| {
        let mut answer = triage_answer();
        answer.as_object_mut().unwrap().remove("summary");
        success(answer.to_string(), Some(honest_prompt_tokens(request)))
    });
    let report = run_contract(&provider, &profile(WireFormat::OpenAi), &contract).await;
    let round_trip: Vec<_> = failures_of(&report)
        .into_iter()
        .filter(|f| f.1 == CheckKind::RoundTrip)
        .collect();
    assert_eq!(round_trip.len(), contract.cases.len());
    assert!(
        round_trip[0].2.contains("`summary` is missing"),
        "{}",
        round_trip[0].2
    );
}

#[tokio::test]
async fn usage_far_from_our_count_fails_tokenizer() {
    let contract = triage();
    let provider = CannedProvider::new(|request| {
        success(
            triage_answer().to_string(),
            Some(honest_prompt_tokens(request) * 2),
        )
    });
    let report = run_contract(&provider, &profile(WireFormat::OpenAi), &contract).await;
    let failures = failures_of(&report);
    assert_eq!(failures.len(), contract.cases.len());
    assert!(failures.iter().all(|f| f.1 == CheckKind::Tokenizer));
    assert!(
        failures[0].2.contains("off by more than 10.0 %"),
        "{}",
        failures[0].2
    );
}

#[tokio::test]
async fn missing_usage_fails_tokenizer() {
    let contract = triage();
    let provider = CannedProvider::new(|_| success(triage_answer().to_string(), None));
    let report = run_contract(&provider, &profile(WireFormat::OpenAi), &contract).await;
    let failures = failures_of(&report);
    assert!(failures.iter().all(|f| f.1 == CheckKind::Tokenizer));
    assert!(failures[0].2.contains("no usage"), "{}", failures[0].2);
}

#[tokio::test]
async fn failed_call_fails_schema_and_round_trip_with_its_reason() {
    let contract = triage();
    let provider = CannedProvider::new(|_| {
        AttemptOutcome::Failed(Failure {
            retryable: true,
            retry_after: None,
            kind: ErrorKind::RateLimited,
            message: "slow down".into(),
            status: Some(429),
        })
    });
    let report = run_contract(&provider, &profile(WireFormat::OpenAi), &contract).await;
    let schema = report
        .checks
        .iter()
        .find(|c| c.check == CheckKind::Schema)
        .unwrap();
    assert!(!schema.passed);
    assert_eq!(
        schema.message,
        "provider call failed: rate_limited (HTTP 429): slow down"
    );
    let tokenizer = report
        .checks
        .iter()
        .find(|c| c.check == CheckKind::Tokenizer)
        .unwrap();
    // Its prompt checks ran, but the provider's count never came back: the
    // tokenizer check fails with the call's reason, as every later one.
    assert!(!tokenizer.passed, "{}", tokenizer.message);
    assert!(
        tokenizer
            .message
            .starts_with("the provider's usage was not checked ("),
        "{}",
        tokenizer.message
    );
    assert!(tokenizer
        .message
        .ends_with("rate_limited (HTTP 429): slow down"));
}

#[tokio::test]
async fn unknown_outcome_fails_the_case() {
    let contract = triage();
    let provider = CannedProvider::new(|_| {
        AttemptOutcome::Unknown(Ambiguous {
            kind: ErrorKind::Timeout,
            message: "no answer in 60s".into(),
        })
    });
    let report = run_contract(&provider, &profile(WireFormat::Anthropic), &contract).await;
    assert!(!report.passed);
    assert!(failures_of(&report)
        .iter()
        .any(|f| f.2 == "provider call outcome unknown: timeout: no answer in 60s"));
}

#[tokio::test]
async fn small_context_window_fails_tokenizer_for_long_case() {
    let contract = triage();
    let mut small = profile(WireFormat::OpenAi);
    small.context_window = 4096;
    let report = run_contract(&healthy(), &small, &contract).await;
    let failures = failures_of(&report);
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(failures[0].0, "long-incident-log");
    assert!(
        failures[0].2.contains("context window of 4096"),
        "{}",
        failures[0].2
    );
}

#[tokio::test]
async fn unknown_tokenizer_fails_tokenizer_checks_by_name() {
    let contract = triage();
    let mut odd = profile(WireFormat::OpenAi);
    odd.tokenizer = "llama3".into();
    let report = run_contract(&healthy(), &odd, &contract).await;
    let failures = failures_of(&report);
    assert_eq!(failures.len(), contract.cases.len());
    assert!(failures[0].2.contains("\"llama3\""), "{}", failures[0].2);
}

#[tokio::test]
async fn report_round_trips_through_json() {
    let contract = triage();
    let report = run_contract(&healthy(), &profile(WireFormat::OpenAi), &contract).await;
    let json = serde_json::to_string(&report).unwrap();
    let back: ContractReport = serde_json::from_str(&json).unwrap();
    assert_eq!(back, report);
}
