//! Ops control of providers: whether each provider is switched on, as an
//! in-memory snapshot of `provider_states`, and the one way an operator
//! changes it (HTTP and CLI alike).
//!
//! The engine asks [`ProviderSwitches::is_enabled`] before every new attempt,
//! so that is a read of memory, never a database round trip. A refresher
//! reloads the snapshot every [`REFRESH_EVERY`]; a switch made by another
//! process (the CLI, another server on the same database) is seen within
//! that period. A provider without a row is enabled.

use crate::domain::reason::{check_reason, ReasonError};
use crate::domain::Millis;
use crate::store::{ProviderSwitch, Store, StoreError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::task::JoinHandle;

/// How stale the snapshot may get.
pub const REFRESH_EVERY: Duration = Duration::from_millis(250);

/// The enabled flags of every provider with a row, refreshed from the store.
#[derive(Default)]
pub struct ProviderSwitches {
    snapshot: RwLock<Arc<HashMap<String, ProviderSwitch>>>,
    /// Bumped by [`Self::record`]: a refresh whose read began before a local
    /// change must not put the older state back.
    local_changes: AtomicU64,
}

impl ProviderSwitches {
    /// Whether `name` may take new attempts; true when nobody switched it.
    pub fn is_enabled(&self, name: &str) -> bool {
        self.read().get(name).is_none_or(|s| s.enabled)
    }

    /// Why `name` was last switched, if it ever was.
    pub fn reason(&self, name: &str) -> Option<String> {
        self.read().get(name).map(|s| s.reason.clone())
    }

    /// The last switch of `name` (who, why, when), if any.
    pub fn get(&self, name: &str) -> Option<ProviderSwitch> {
        self.read().get(name).cloned()
    }

    /// Replace the snapshot with what the store holds now. On error the old
    /// snapshot stays.
    pub async fn refresh(&self, store: &dyn Store) -> Result<(), StoreError> {
        let before = self.local_changes.load(Ordering::Acquire);
        let rows = store.provider_switches().await?;
        let fresh: HashMap<String, ProviderSwitch> =
            rows.into_iter().map(|s| (s.name.clone(), s)).collect();
        let mut snapshot = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        // A change recorded here while we read is newer than what we read;
        // the next refresh will include it.
        if self.local_changes.load(Ordering::Acquire) == before {
            *snapshot = Arc::new(fresh);
        }
        Ok(())
    }

    /// Apply a switch this process just committed, without waiting for the
    /// next refresh.
    pub fn record(&self, switch: ProviderSwitch) {
        let mut snapshot = self.snapshot.write().unwrap_or_else(|e| e.into_inner());
        self.local_changes.fetch_add(1, Ordering::AcqRel);
        let mut next = HashMap::clone(&snapshot);
        next.insert(switch.name.clone(), switch);
        *snapshot = Arc::new(next);
    }

    /// Refresh every `period` until the task is aborted. A failed refresh is
    /// logged once per streak of failures and the old snapshot kept.
    pub fn spawn_refresher(
        self: Arc<Self>,
        store: Arc<dyn Store>,
        period: Duration,
    ) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut failing = false;
            loop {
                ticks.tick().await;
                match self.refresh(store.as_ref()).await {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("provider switches refresh recovered");
                    }
                    Ok(()) => {}
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "cannot refresh provider switches; keeping the last snapshot");
                    }
                    Err(_) => {}
                }
            }
        })
    }

    fn read(&self) -> Arc<HashMap<String, ProviderSwitch>> {
        self.snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Why an operator's switch was refused.
#[derive(Debug, thiserror::Error)]
pub enum SwitchError {
    #[error("no provider named {0:?} is configured")]
    UnknownProvider(String),
    #[error("reason: {0}")]
    InvalidReason(#[from] ReasonError),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Switch `name` on or off for `actor`, audited in the same commit. `known`
/// is whether `name` is a configured provider; nothing is written unless it
/// is and the reason passes [`check_reason`] (trimmed).
pub async fn switch_provider(
    store: &dyn Store,
    known: bool,
    name: &str,
    enabled: bool,
    actor: &str,
    reason: Option<&str>,
    at: Millis,
) -> Result<ProviderSwitch, SwitchError> {
    if !known {
        return Err(SwitchError::UnknownProvider(name.to_string()));
    }
    let reason = check_reason(reason.unwrap_or_default())?.to_string();
    store
        .set_provider_enabled(name, enabled, actor, &reason, at)
        .await?;
    Ok(ProviderSwitch {
        name: name.to_string(),
        enabled,
        changed_by: actor.to_string(),
        reason,
        changed_at: at,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn switch(name: &str, enabled: bool) -> ProviderSwitch {
        ProviderSwitch {
            name: name.into(),
            enabled,
            changed_by: "ops".into(),
            reason: "maintenance".into(),
            changed_at: 1,
        }
    }

    #[test]
    fn a_provider_nobody_switched_is_enabled() {
        let switches = ProviderSwitches::default();
        assert!(switches.is_enabled("sim"));
        assert_eq!(switches.reason("sim"), None);
    }

    #[test]
    fn a_recorded_switch_is_seen_at_once() {
        let switches = ProviderSwitches::default();
        switches.record(switch("sim", false));
        assert!(!switches.is_enabled("sim"));
        assert!(switches.is_enabled("sim-backup"));
        assert_eq!(switches.reason("sim").as_deref(), Some("maintenance"));
        switches.record(switch("sim", true));
        assert!(switches.is_enabled("sim"));
    }
}
