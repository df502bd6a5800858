//! Running the contract suite: the selected contracts against the selected
//! providers of the catalog, each run stored with both digests and its full
//! report. The CLI (`onejob contracts run`) and the admin endpoint
//! (`POST /v1/admin/contracts/run`) both call [`run_contracts`].

use super::definition::Contract;
use super::render::WireFormat;
use super::report::ContractReport;
use super::run::{run_contract, ProviderProfile};
use crate::clock::Clock;
use crate::providers::catalog::{Catalog, ProviderEntry};
use crate::providers::config::{ProviderKind, Tokenizer};
use crate::store::{NewContractRun, Store, StoreError};
use futures::stream::{self, StreamExt};
use std::collections::BTreeMap;

/// Pairs run at once; each pair runs its cases one after another.
const CONCURRENT_PAIRS: usize = 4;

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("unknown provider {name:?} (known: {known})")]
    UnknownProvider { name: String, known: String },
    #[error("unknown contract {name:?} (known: {known})")]
    UnknownContract { name: String, known: String },
    #[error("cannot store the contract run: {0}")]
    Store(#[from] StoreError),
}

/// What a contract run needs to know about a catalog entry.
pub fn profile_of(entry: &ProviderEntry) -> ProviderProfile {
    ProviderProfile {
        name: entry.name.clone(),
        wire: match entry.config.kind {
            ProviderKind::Anthropic => WireFormat::Anthropic,
            ProviderKind::Openai | ProviderKind::Sim => WireFormat::OpenAi,
            // systemInstruction is top level, as Anthropic's `system`.
            ProviderKind::Gemini => WireFormat::Anthropic,
            ProviderKind::AzureOpenai => WireFormat::OpenAi,
            // Converse's `system` blocks are top level too.
            ProviderKind::Bedrock => WireFormat::Anthropic,
        },
        tokenizer: match entry.config.tokenizer {
            Tokenizer::O200kBase => "o200k_base",
            Tokenizer::Cl100kBase => "cl100k_base",
        }
        .to_string(),
        context_window: entry.config.context_window,
        digest: entry.digest.clone(),
    }
}

/// The first failed check of a report, as ops read it:
/// `schema on case X: …` (and how many more failed).
pub fn first_failure(report: &ContractReport) -> Option<String> {
    let first = report.failures().next()?;
    let more = report.failures().count() - 1;
    let mut text = format!(
        "{} on case {}: {}",
        first.check.as_str(),
        first.case,
        first.message
    );
    if more > 0 {
        text.push_str(&format!(" (and {more} more failed checks)"));
    }
    Some(text)
}

/// Run every selected contract against every selected provider (all when a
/// filter is `None`), store each run, and return the reports ordered by
/// contract, then provider. An unknown name is an error before anything runs.
#[tracing::instrument(skip_all, fields(provider = ?filter_provider, contract = ?filter_contract))]
pub async fn run_contracts(
    catalog: &Catalog,
    contracts: &BTreeMap<String, Contract>,
    store: &dyn Store,
    clock: &dyn Clock,
    filter_provider: Option<&str>,
    filter_contract: Option<&str>,
    actor: &str,
) -> Result<Vec<ContractReport>, RunError> {
    check_selection(
        catalog.names(),
        contracts.keys().map(String::as_str),
        filter_provider,
        filter_contract,
    )?;
    let providers: Vec<&ProviderEntry> = match filter_provider {
        Some(name) => catalog.get(name).into_iter().collect(),
        None => catalog.entries().collect(),
    };
    let selected: Vec<&Contract> = match filter_contract {
        Some(name) => contracts.get(name).into_iter().collect(),
        None => contracts.values().collect(),
    };
    // The futures are made up front (not polled until buffered): a closure
    // mapping pairs to futures would trip axum's `Send` check on lifetimes.
    let mut runs = Vec::with_capacity(selected.len() * providers.len());
    for &contract in &selected {
        for &provider in &providers {
            runs.push(run_pair(contract, provider, store, clock, actor));
        }
    }
    let results: Vec<Result<ContractReport, RunError>> = stream::iter(runs)
        .buffered(CONCURRENT_PAIRS)
        .collect()
        .await;
    results.into_iter().collect()
}

async fn run_pair(
    contract: &Contract,
    provider: &ProviderEntry,
    store: &dyn Store,
    clock: &dyn Clock,
    actor: &str,
) -> Result<ContractReport, RunError> {
    let started_at = clock.now_ms();
    let report = run_contract(provider.client.as_ref(), &profile_of(provider), contract).await;
    let finished_at = clock.now_ms();
    let run = NewContractRun {
        id: crate::domain::new_id(),
        contract: contract.name.clone(),
        contract_digest: report.contract_digest.clone(),
        provider: provider.name.clone(),
        provider_digest: provider.digest.clone(),
        passed: report.passed,
        first_failure: first_failure(&report),
        report: serde_json::to_string(&report)
            .map_err(|e| StoreError::Corrupt(format!("contract report does not serialize: {e}")))?,
        started_at,
        finished_at,
        actor: actor.to_string(),
    };
    store.insert_contract_run(run).await?;
    Ok(report)
}

/// Whether the filters name a provider and a contract that exist: an
/// unknown name is an error that lists the known ones. The CLI asks this
/// before it builds a provider (a provider it will not call needs no
/// credentials) or opens the database.
pub fn check_selection<'a>(
    providers: impl Iterator<Item = &'a str>,
    contracts: impl Iterator<Item = &'a str>,
    filter_provider: Option<&str>,
    filter_contract: Option<&str>,
) -> Result<(), RunError> {
    if let Some(name) = filter_provider {
        let providers: Vec<&str> = providers.collect();
        if !providers.contains(&name) {
            return Err(RunError::UnknownProvider {
                name: name.to_string(),
                known: known(providers.into_iter()),
            });
        }
    }
    if let Some(name) = filter_contract {
        let contracts: Vec<&str> = contracts.collect();
        if !contracts.contains(&name) {
            return Err(RunError::UnknownContract {
                name: name.to_string(),
                known: known(contracts.into_iter()),
            });
        }
    }
    Ok(())
}

fn known<'a>(names: impl Iterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.collect();
    if names.is_empty() {
        "none".to_string()
    } else {
        names.join(", ")
    }
}
