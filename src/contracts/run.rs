//! One contract run: every case of a contract against one live provider.
//!
//! Per case, in order: `prompt_rendering` (the template renders in the
//! provider's wire format), `tokenizer` (prompt checks with the provider's
//! declared tokenizer, then agreement with the provider's reported usage),
//! `schema` (the answer validates) and `round_trip` (the expected fields came
//! back). A case whose prompt does not render, or whose call fails or ends
//! unknown, fails its later checks with that reason, so every report has the
//! full case × check matrix.

use super::definition::{Case, Contract};
use super::output::Violation;
use super::render::WireFormat;
use super::report::{CheckKind, CheckResult, ContractReport};
use super::tokenizer::{check_prompt, check_usage_agreement, PromptTokens, TokenizerViolation};
use crate::providers::{AttemptOutcome, Provider, Success};
use serde::{Deserialize, Serialize};

/// What a contract run needs to know about a provider, built from its config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderProfile {
    pub name: String,
    pub wire: WireFormat,
    /// `o200k_base` or `cl100k_base`.
    pub tokenizer: String,
    pub context_window: u32,
    /// The digest of the provider's config ([`crate::providers::config::ProviderConfig::digest`]).
    pub digest: String,
}

/// The idempotency key of a case's call: stable for one contract version,
/// provider config and case, so re-running a contract replays rather than
/// re-bills where the provider honours keys. A changed contract, or a
/// changed provider config (another model, another timeout), gets new
/// keys: the run must exercise the config it qualifies, and a provider
/// that honours keys refuses one key reused with another body.
pub fn contract_run_key(contract: &Contract, profile: &ProviderProfile, case: &str) -> String {
    format!(
        "contract-{}-{}-{}-{case}",
        contract.digest_prefix(),
        profile.name,
        profile.digest.get(..12).unwrap_or(&profile.digest)
    )
}

/// Run every case of `contract` against `provider` and report each check.
#[tracing::instrument(skip_all, fields(contract = %contract.name, provider = %profile.name))]
pub async fn run_contract(
    provider: &dyn Provider,
    profile: &ProviderProfile,
    contract: &Contract,
) -> ContractReport {
    let mut checks = Vec::with_capacity(contract.cases.len() * CheckKind::ALL.len());
    for case in &contract.cases {
        run_case(provider, profile, contract, case, &mut checks).await;
    }
    let passed = checks.iter().all(|c| c.passed);
    tracing::info!(
        passed,
        failures = checks.iter().filter(|c| !c.passed).count(),
        "contract run finished"
    );
    ContractReport {
        contract: contract.name.clone(),
        contract_digest: contract.digest().to_string(),
        provider: profile.name.clone(),
        passed,
        checks,
    }
}

async fn run_case(
    provider: &dyn Provider,
    profile: &ProviderProfile,
    contract: &Contract,
    case: &Case,
    checks: &mut Vec<CheckResult>,
) {
    let mut record = |check: CheckKind, result: Result<String, String>| {
        let (passed, message) = match result {
            Ok(note) => (true, note),
            Err(reason) => (false, reason),
        };
        checks.push(CheckResult {
            case: case.name.clone(),
            check,
            passed,
            message,
        });
    };

    let prompt = match contract.render(&case.input, profile.wire) {
        Ok(prompt) => prompt,
        Err(e) => {
            record(CheckKind::PromptRendering, Err(e.to_string()));
            let skipped = "not run: the prompt did not render".to_string();
            for check in [
                CheckKind::Tokenizer,
                CheckKind::Schema,
                CheckKind::RoundTrip,
            ] {
                record(check, Err(skipped.clone()));
            }
            return;
        }
    };
    record(
        CheckKind::PromptRendering,
        Ok(format!(
            "{:?} layout, {} messages",
            profile.wire,
            prompt.messages.len()
        )),
    );

    let prompt_tokens = check_prompt(
        &profile.tokenizer,
        profile.context_window,
        contract.max_tokens,
        &prompt,
    );
    let request = contract.request_for(prompt, contract_run_key(contract, profile, &case.name));
    let outcome = provider.call(&request).await;
    let provider_count = provider.count_tokens(&request).await;

    let answer = match outcome {
        AttemptOutcome::Succeeded(success) => success,
        AttemptOutcome::Failed(failure) => {
            let status = failure
                .status
                .map(|s| format!(" (HTTP {s})"))
                .unwrap_or_default();
            let reason = format!(
                "provider call failed: {}{status}: {}",
                failure.kind, failure.message
            );
            record_without_answer(&mut record, prompt_tokens, &reason);
            return;
        }
        AttemptOutcome::Unknown(ambiguous) => {
            let reason = format!(
                "provider call outcome unknown: {}: {}",
                ambiguous.kind, ambiguous.message
            );
            record_without_answer(&mut record, prompt_tokens, &reason);
            return;
        }
        AttemptOutcome::Abandoned { reason } => {
            let reason = format!("provider call abandoned: {reason}");
            record_without_answer(&mut record, prompt_tokens, &reason);
            return;
        }
    };

    record(CheckKind::Tokenizer, {
        let ours = prompt_tokens.as_ref().map(|t| t.prompt_tokens).ok();
        tokenizer_verdict(profile, contract, prompt_tokens, &answer).and_then(|note| {
            match (ours, provider_count) {
                (Some(ours), Some(counted)) => {
                    count_tokens_verdict(ours, counted, contract.prompt_token_tolerance)
                        .map(|more| format!("{note}; {more}"))
                }
                _ => Ok(note),
            }
        })
    });
    match contract.validate_output(&answer.output) {
        Ok(value) => {
            record(
                CheckKind::Schema,
                Ok("output validates against schema.json".into()),
            );
            record(
                CheckKind::RoundTrip,
                contract
                    .check_round_trip(case, &value)
                    .map(|()| {
                        format!(
                            "expected fields came back: {}",
                            case.expect.fields.join(", ")
                        )
                    })
                    .map_err(|e| e.to_string()),
            );
        }
        Err(violation) => {
            record(CheckKind::Schema, Err(violation.to_string()));
            // Expected fields can still be looked for in JSON that broke the schema.
            let round_trip = match &violation {
                Violation::NotJson { .. } => Err("not checked: output is not JSON".to_string()),
                Violation::Schema { .. } => serde_json::from_str(&answer.output)
                    .map_err(|e| e.to_string())
                    .and_then(|value| {
                        contract
                            .check_round_trip(case, &value)
                            .map(|()| "expected fields came back (but see schema)".to_string())
                            .map_err(|e| e.to_string())
                    }),
            };
            record(CheckKind::RoundTrip, round_trip);
        }
    }
}

/// Without an answer every later check fails with the call's reason: the
/// tokenizer's too, as the provider's count (its usage) was never compared
/// with ours; its message says what our own prompt checks found.
fn record_without_answer(
    record: &mut impl FnMut(CheckKind, Result<String, String>),
    prompt_tokens: Result<PromptTokens, TokenizerViolation>,
    reason: &str,
) {
    record(
        CheckKind::Tokenizer,
        Err(match prompt_tokens {
            Ok(t) => format!(
                "the provider's usage was not checked ({} prompt tokens by our count): {reason}",
                t.prompt_tokens
            ),
            Err(e) => e.to_string(),
        }),
    );
    record(CheckKind::Schema, Err(reason.to_string()));
    record(CheckKind::RoundTrip, Err(reason.to_string()));
}

/// The provider's count-tokens API (Gemini's `countTokens`) against our
/// count, within the contract's tolerance.
fn count_tokens_verdict(
    ours: u32,
    counted: Result<u32, String>,
    tolerance: f64,
) -> Result<String, String> {
    let theirs = counted.map_err(|e| format!("the provider's count-tokens API failed: {e}"))?;
    check_usage_agreement(ours, u64::from(theirs), tolerance)
        .map(|()| format!("its count-tokens API says {theirs}"))
        .map_err(|e| format!("count-tokens API: {e}"))
}

fn tokenizer_verdict(
    profile: &ProviderProfile,
    contract: &Contract,
    prompt_tokens: Result<PromptTokens, TokenizerViolation>,
    answer: &Success,
) -> Result<String, String> {
    let counted = prompt_tokens.map_err(|e| e.to_string())?;
    let usage = answer.usage.ok_or_else(|| {
        "provider reported no usage, so its prompt token count cannot be checked".to_string()
    })?;
    check_usage_agreement(
        counted.prompt_tokens,
        usage.prompt_tokens,
        contract.prompt_token_tolerance,
    )
    .map_err(|e| e.to_string())?;
    let mut note = format!(
        "{} prompt tokens by {}, provider reported {}",
        counted.prompt_tokens, profile.tokenizer, usage.prompt_tokens
    );
    if !counted.special_strings_as_text.is_empty() {
        note.push_str(&format!(
            "; {} encoded as plain text",
            counted.special_strings_as_text.join(" ")
        ));
    }
    Ok(note)
}

#[cfg(test)]
mod tests;
