//! The one place that decides whether a provider may take a new attempt:
//! enabled (ops switches, refreshed from the database every 250 ms) and,
//! when it would take over a contract job as a fallback, eligible (its
//! latest contract run for the current contract and provider-config digests
//! passed). Both are read from memory; a background task keeps them fresh.

use super::Gate;
use crate::contracts::{EligibilityCache, EligibilitySnapshot};
use crate::providers::switches::ProviderSwitches;
use crate::store::StoreError;
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;

pub struct EligibilityGate {
    switches: Arc<ProviderSwitches>,
    cache: EligibilityCache,
}

impl EligibilityGate {
    /// Takes the first snapshot now, so nothing is admitted on a guess.
    pub async fn load(
        switches: Arc<ProviderSwitches>,
        cache: EligibilityCache,
    ) -> Result<Self, StoreError> {
        cache.snapshot().await?;
        Ok(EligibilityGate { switches, cache })
    }

    pub fn switches(&self) -> &Arc<ProviderSwitches> {
        &self.switches
    }

    /// The eligibility snapshot the gate decides with.
    pub fn snapshot(&self) -> Option<Arc<EligibilitySnapshot>> {
        self.cache.latest()
    }

    /// Re-read runs and switches now (after a contract run made here).
    pub async fn refresh(&self) -> Result<(), StoreError> {
        self.cache.invalidate();
        self.cache.snapshot().await.map(|_| ())
    }

    pub fn spawn_refresher(self: Arc<Self>, period: Duration) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                // A failed read keeps the last snapshot; the next tick retries.
                if let Err(e) = self.cache.snapshot().await {
                    tracing::warn!(error = %e, "cannot refresh provider eligibility");
                }
            }
        })
    }
}

impl Gate for EligibilityGate {
    fn admits(
        &self,
        provider: &str,
        contract: Option<&str>,
        as_fallback: bool,
    ) -> Result<(), String> {
        if !self.switches.is_enabled(provider) {
            let why = self
                .switches
                .reason(provider)
                .unwrap_or_else(|| "no reason given".into());
            return Err(format!("disabled ({why})"));
        }
        match (contract, as_fallback) {
            (Some(contract), true) => {
                let snapshot = self.snapshot().ok_or("eligibility not loaded yet")?;
                let eligibility = snapshot.get(provider, contract);
                if eligibility.eligible {
                    Ok(())
                } else {
                    Err(format!(
                        "not eligible as fallback for {contract}: {}",
                        eligibility.reason
                    ))
                }
            }
            // A primary is the route's choice; a job without a contract has
            // nothing a contract run could prove, so only the switch applies.
            _ => Ok(()),
        }
    }
}
