//! Provider switches: ops turning a provider off and on, with the audit
//! trail: the [`SwitchStore`] trait and its rows. The SQL is in
//! `sql/switches.rs`.

use crate::domain::Millis;
use crate::store::StoreError;
use async_trait::async_trait;

#[derive(Debug, Clone, PartialEq)]
pub struct ProviderSwitch {
    pub name: String,
    pub enabled: bool,
    pub changed_by: String,
    pub reason: String,
    pub changed_at: Millis,
}

/// One operator change of a provider switch, as the audit trail keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct ProviderAuditEntry {
    pub id: i64,
    pub name: String,
    pub enabled: bool,
    pub actor: String,
    pub reason: String,
    pub at: Millis,
}

#[async_trait]
pub trait SwitchStore: Send + Sync {
    async fn set_provider_enabled(
        &self,
        name: &str,
        enabled: bool,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<(), StoreError>;

    async fn provider_switches(&self) -> Result<Vec<ProviderSwitch>, StoreError>;

    /// The audit trail of provider switches (of `name`, or of all), newest first.
    async fn provider_audit(
        &self,
        name: Option<&str>,
        limit: i64,
    ) -> Result<Vec<ProviderAuditEntry>, StoreError>;
}
