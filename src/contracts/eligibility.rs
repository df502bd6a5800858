//! Provider eligibility: may this provider take a job of this contract?
//!
//! Only while it is enabled and its latest contract run, for the current
//! contract digest and the current provider-config digest, passed. Anything
//! else is ineligible with a reason ops can act on. [`eligibility`] is the
//! one rule; [`EligibilityCache`] applies it to every (provider, contract)
//! pair from the store, at most every [`DEFAULT_MAX_AGE`], for the engine.

use super::definition::Contract;
use crate::providers::catalog::Catalog;
use crate::store::{ContractRunSummary, ProviderSwitch, Store, StoreError};
use serde::Serialize;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::time::Instant;

/// How stale a cached snapshot may be before the next read refreshes it.
pub const DEFAULT_MAX_AGE: Duration = Duration::from_millis(250);

/// Why a provider is or is not eligible, as a stable code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EligibilityStatus {
    Eligible,
    Disabled,
    NeverRun,
    ContractChanged,
    ProviderChanged,
    LatestRunFailed,
    /// The provider or contract is not loaded in this process.
    Unknown,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Eligibility {
    pub eligible: bool,
    pub status: EligibilityStatus,
    /// For people: what the status means here, e.g. which check failed.
    pub reason: String,
}

impl Eligibility {
    fn not(status: EligibilityStatus, reason: impl Into<String>) -> Self {
        Eligibility {
            eligible: false,
            status,
            reason: reason.into(),
        }
    }
}

/// The run that decides whether `provider` may take jobs of `contract`,
/// among `runs` (the store's `latest_contract_runs`): the latest made with
/// the contract and the provider config as they are now, or, when none
/// was, the pair's latest (whose digests say what changed). A run made
/// with another config (a staging run before a rollout) does not undo a
/// pass of the config these servers run.
pub fn deciding_run<'a>(
    runs: &'a [ContractRunSummary],
    provider: &str,
    provider_digest: &str,
    contract: &Contract,
) -> Option<&'a ContractRunSummary> {
    let mut latest: Option<&ContractRunSummary> = None;
    for run in runs
        .iter()
        .filter(|r| r.provider == provider && r.contract == contract.name)
    {
        if run.contract_digest == contract.digest() && run.provider_digest == provider_digest {
            return Some(run);
        }
        if latest.is_none_or(|l| (run.finished_at, &run.id) > (l.finished_at, &l.id)) {
            latest = Some(run);
        }
    }
    latest
}

/// The eligibility rule. `provider_digest` is the digest of the provider's
/// config as loaded now; `latest_run` is the pair's [`deciding_run`].
pub fn eligibility(
    provider_enabled: bool,
    provider_digest: &str,
    contract: &Contract,
    latest_run: Option<&ContractRunSummary>,
) -> Eligibility {
    if !provider_enabled {
        return Eligibility::not(EligibilityStatus::Disabled, "disabled");
    }
    let Some(run) = latest_run else {
        return Eligibility::not(EligibilityStatus::NeverRun, "no contract run yet");
    };
    if run.contract_digest != contract.digest() {
        return Eligibility::not(
            EligibilityStatus::ContractChanged,
            format!(
                "contract changed since the last run (digest {} then, {} now)",
                short(&run.contract_digest),
                short(contract.digest())
            ),
        );
    }
    if run.provider_digest != provider_digest {
        return Eligibility::not(
            EligibilityStatus::ProviderChanged,
            format!(
                "provider config changed since the last run (digest {} then, {} now)",
                short(&run.provider_digest),
                short(provider_digest)
            ),
        );
    }
    if !run.passed {
        let what = run
            .first_failure
            .as_deref()
            .unwrap_or("no failure recorded");
        return Eligibility::not(
            EligibilityStatus::LatestRunFailed,
            format!("latest run failed: {what}"),
        );
    }
    Eligibility {
        eligible: true,
        status: EligibilityStatus::Eligible,
        reason: format!("latest run {} passed", run.id),
    }
}

fn short(digest: &str) -> &str {
    digest.get(..12).unwrap_or(digest)
}

/// Whether a provider is enabled, from the store's switches: a provider
/// nobody has switched is enabled.
pub fn is_enabled(switches: &[ProviderSwitch], provider: &str) -> bool {
    switches
        .iter()
        .find(|s| s.name == provider)
        .is_none_or(|s| s.enabled)
}

/// Eligibility of every (provider, contract) pair at one moment.
#[derive(Debug, Clone)]
pub struct EligibilitySnapshot {
    taken_at: Instant,
    pairs: HashMap<(String, String), Eligibility>,
}

impl EligibilitySnapshot {
    /// Apply [`eligibility`] to every provider of `catalog` and contract of
    /// `contracts`, given the store's switches and latest runs.
    pub fn build(
        catalog: &Catalog,
        contracts: &BTreeMap<String, Contract>,
        switches: &[ProviderSwitch],
        latest_runs: &[ContractRunSummary],
    ) -> Self {
        let mut pairs = HashMap::new();
        for provider in catalog.entries() {
            let enabled = is_enabled(switches, &provider.name);
            for contract in contracts.values() {
                let run = deciding_run(latest_runs, &provider.name, &provider.digest, contract);
                pairs.insert(
                    (provider.name.clone(), contract.name.clone()),
                    eligibility(enabled, &provider.digest, contract, run),
                );
            }
        }
        EligibilitySnapshot {
            taken_at: Instant::now(),
            pairs,
        }
    }

    /// The pair's eligibility; a provider or contract this process does not
    /// know is never eligible.
    pub fn get(&self, provider: &str, contract: &str) -> Eligibility {
        self.pairs
            .get(&(provider.to_string(), contract.to_string()))
            .cloned()
            .unwrap_or_else(|| {
                Eligibility::not(
                    EligibilityStatus::Unknown,
                    format!("provider {provider:?} or contract {contract:?} is not loaded"),
                )
            })
    }

    pub fn is_eligible(&self, provider: &str, contract: &str) -> bool {
        self.pairs
            .get(&(provider.to_string(), contract.to_string()))
            .is_some_and(|e| e.eligible)
    }

    /// When the snapshot was read from the store.
    pub fn taken_at(&self) -> Instant {
        self.taken_at
    }
}

/// A shared, periodically refreshed [`EligibilitySnapshot`]: reads within
/// `max_age` of the last refresh cost a lock and a clone of an `Arc`;
/// concurrent readers of a stale snapshot share one refresh.
pub struct EligibilityCache {
    store: Arc<dyn Store>,
    catalog: Arc<Catalog>,
    contracts: Arc<BTreeMap<String, Contract>>,
    max_age: Duration,
    current: RwLock<Option<Arc<EligibilitySnapshot>>>,
    refreshing: tokio::sync::Mutex<()>,
}

impl EligibilityCache {
    pub fn new(
        store: Arc<dyn Store>,
        catalog: Arc<Catalog>,
        contracts: Arc<BTreeMap<String, Contract>>,
    ) -> Self {
        Self::with_max_age(store, catalog, contracts, DEFAULT_MAX_AGE)
    }

    pub fn with_max_age(
        store: Arc<dyn Store>,
        catalog: Arc<Catalog>,
        contracts: Arc<BTreeMap<String, Contract>>,
        max_age: Duration,
    ) -> Self {
        EligibilityCache {
            store,
            catalog,
            contracts,
            max_age,
            current: RwLock::new(None),
            refreshing: tokio::sync::Mutex::new(()),
        }
    }

    /// A snapshot at most `max_age` old, read from the store if needed.
    pub async fn snapshot(&self) -> Result<Arc<EligibilitySnapshot>, StoreError> {
        if let Some(fresh) = self.fresh() {
            return Ok(fresh);
        }
        let _refreshing = self.refreshing.lock().await;
        // Another reader may have refreshed while this one waited.
        if let Some(fresh) = self.fresh() {
            return Ok(fresh);
        }
        let switches = self.store.provider_switches().await?;
        let runs = self.store.latest_contract_runs().await?;
        let snapshot = Arc::new(EligibilitySnapshot::build(
            &self.catalog,
            &self.contracts,
            &switches,
            &runs,
        ));
        if let Ok(mut current) = self.current.write() {
            *current = Some(snapshot.clone());
        }
        Ok(snapshot)
    }

    /// The pair's eligibility from a snapshot at most `max_age` old.
    pub async fn eligibility(
        &self,
        provider: &str,
        contract: &str,
    ) -> Result<Eligibility, StoreError> {
        Ok(self.snapshot().await?.get(provider, contract))
    }

    /// The last snapshot taken, however old (for synchronous callers that
    /// rely on a refresher to keep it fresh); `None` before the first.
    pub fn latest(&self) -> Option<Arc<EligibilitySnapshot>> {
        self.current.read().ok()?.clone()
    }

    /// Forget the snapshot, so the next read sees the store (after a run or
    /// a switch made by this process).
    pub fn invalidate(&self) {
        if let Ok(mut current) = self.current.write() {
            *current = None;
        }
    }

    fn fresh(&self) -> Option<Arc<EligibilitySnapshot>> {
        let current = self.current.read().ok()?;
        current
            .as_ref()
            .filter(|s| s.taken_at.elapsed() < self.max_age)
            .cloned()
    }
}
