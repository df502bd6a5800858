//! Provider switches: ops control of providers, and their audit trail.

use crate::domain::Millis;
use crate::store::sql::db::{args, Db};
use crate::store::{ProviderSwitch, StoreError};

pub(crate) async fn set_provider_enabled(
    conn: &mut impl Db,
    name: &str,
    enabled: bool,
    actor: &str,
    reason: &str,
    at: Millis,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO provider_states (name, enabled, changed_by, reason, changed_at) \
         VALUES ($1, $2, $3, $4, $5) \
         ON CONFLICT (name) DO UPDATE SET enabled = excluded.enabled, \
         changed_by = excluded.changed_by, reason = excluded.reason, changed_at = excluded.changed_at",
        args![name, enabled, actor, reason, at],
    )
    .await?;
    conn.execute(
        "INSERT INTO provider_audit (name, enabled, actor, reason, at) VALUES ($1, $2, $3, $4, $5)",
        args![name, enabled, actor, reason, at],
    )
    .await?;
    Ok(())
}

pub(crate) async fn provider_switches(
    conn: &mut impl Db,
) -> Result<Vec<ProviderSwitch>, StoreError> {
    let rows: Vec<(String, bool, String, String, i64)> = conn.fetch_all(
        "SELECT name, enabled, changed_by, reason, changed_at FROM provider_states ORDER BY name",
        args![],
    )
    .await?;
    Ok(rows
        .into_iter()
        .map(
            |(name, enabled, changed_by, reason, changed_at)| ProviderSwitch {
                name,
                enabled,
                changed_by,
                reason,
                changed_at,
            },
        )
        .collect())
}

pub(crate) async fn provider_audit(
    conn: &mut impl Db,
    name: Option<&str>,
    limit: i64,
) -> Result<Vec<crate::store::ProviderAuditEntry>, StoreError> {
    // `id` breaks ties between changes made in the same millisecond.
    let rows: Vec<(i64, String, bool, String, String, i64)> = conn
        .fetch_all(
            "SELECT id, name, enabled, actor, reason, at FROM provider_audit \
         WHERE ($1 IS NULL OR name = $1) ORDER BY at DESC, id DESC LIMIT $2",
            args![name, limit],
        )
        .await?;
    Ok(rows
        .into_iter()
        .map(
            |(id, name, enabled, actor, reason, at)| crate::store::ProviderAuditEntry {
                id,
                name,
                enabled,
                actor,
                reason,
                at,
            },
        )
        .collect())
}
