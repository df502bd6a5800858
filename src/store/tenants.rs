//! Tenants in the store: the key lifecycle (list, revoke, rotate, expiry,
//! last use), limits set at run time with their audit trail, the change
//! counter running servers poll, the instance heartbeat, and usage by
//! owner and day: the types; their SQL is in `sql/keys.rs`.

use crate::domain::{Millis, OwnerId};
use crate::store::sql::db::{Columns, Row};
use crate::store::StoreError;
use async_trait::async_trait;
use serde::Serialize;

/// One API key as listed: never its hash, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KeyRecord {
    pub id: String,
    pub owner_id: OwnerId,
    /// The first characters of the key, to recognise it (`oj_1a2b3c4d`).
    pub prefix: String,
    pub is_admin: bool,
    pub created_at: Millis,
    pub expires_at: Option<Millis>,
    pub revoked_at: Option<Millis>,
    pub last_used_at: Option<Millis>,
    /// The key a rotation made to replace this one.
    pub replaced_by: Option<String>,
    /// The key's own limits (JSON of the fields set), over its owner's.
    pub limits: Option<String>,
    /// The key its rotations began with (itself when never rotated).
    pub family: String,
}

impl Row for KeyRecord {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(KeyRecord {
            id: row.get("id")?,
            owner_id: row.get::<String>("owner_id")?.into(),
            prefix: row.get("prefix")?,
            is_admin: row.get("is_admin")?,
            created_at: row.get("created_at")?,
            expires_at: row.get("expires_at")?,
            revoked_at: row.get("revoked_at")?,
            last_used_at: row.get("last_used_at")?,
            replaced_by: row.get("replaced_by")?,
            limits: row.get("limits")?,
            family: row.get("family")?,
        })
    }
}

/// A rotation: the new key's row, and when the old one stops working.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    pub old_id: String,
    pub new: crate::store::ApiKey,
    pub old_expires_at: Millis,
    /// Why, when the admin said (kept in the audit trail).
    pub reason: Option<String>,
}

/// An entry of the audit trail of keys and limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TenantAuditEntry {
    pub id: i64,
    /// `key:ID` or `owner:NAME`.
    pub subject: String,
    pub action: String,
    pub actor: String,
    pub detail: Option<String>,
    pub at: Millis,
}

impl Row for TenantAuditEntry {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(TenantAuditEntry {
            id: row.get("id")?,
            subject: row.get("subject")?,
            action: row.get("action")?,
            actor: row.get("actor")?,
            detail: row.get("detail")?,
            at: row.get("at")?,
        })
    }
}

/// Limits an admin set for an owner at run time (JSON of the fields set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OwnerLimitsRow {
    pub owner_id: OwnerId,
    pub limits: String,
    pub changed_by: String,
    pub reason: String,
    pub changed_at: Millis,
}

impl Row for OwnerLimitsRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(OwnerLimitsRow {
            owner_id: row.get::<String>("owner_id")?.into(),
            limits: row.get("limits")?,
            changed_by: row.get("changed_by")?,
            reason: row.get("reason")?,
            changed_at: row.get("changed_at")?,
        })
    }
}

/// Tokens of one (owner, UTC day, route, provider, attempt kind).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct UsageRow {
    pub owner_id: OwnerId,
    /// Days since the Unix epoch (UTC).
    pub day: i64,
    pub route: String,
    pub provider: String,
    /// `primary`, `hedge` or `retry`.
    pub kind: String,
    /// Attempts that reported usage.
    pub attempts: i64,
    /// Of those, the ones whose answer won the job.
    pub won: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    /// Tokens of attempts whose answer lost the race (paid, thrown away).
    pub discarded_tokens: i64,
}

impl Row for UsageRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(UsageRow {
            owner_id: row.get::<String>("owner_id")?.into(),
            day: row.get("day")?,
            route: row.get("route")?,
            provider: row.get("provider")?,
            kind: row.get("kind")?,
            attempts: row.get("attempts")?,
            won: row.get("won")?,
            prompt_tokens: row.get("prompt_tokens")?,
            completion_tokens: row.get("completion_tokens")?,
            discarded_tokens: row.get("discarded_tokens")?,
        })
    }
}

/// What the concurrency limit and the budget read at admission.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OwnerLoad {
    pub active_jobs: i64,
    pub tokens_today: i64,
    /// The key's (family's), when one was asked for.
    pub key_active_jobs: i64,
    pub key_tokens_today: i64,
}

pub const MS_PER_DAY: Millis = 86_400_000;

/// The UTC day of a time, as stored in `usage_daily.day`.
pub fn day_of(at: Millis) -> i64 {
    at.div_euclid(MS_PER_DAY)
}

#[derive(Debug, Clone, PartialEq)]
pub struct ApiKey {
    pub id: String,
    pub owner_id: OwnerId,
    pub key_hash: String,
    /// The first characters of the key, shown by `keys list`.
    pub prefix: String,
    pub is_admin: bool,
    pub created_at: Millis,
    pub expires_at: Option<Millis>,
    pub revoked_at: Option<Millis>,
    /// The key's own limits (JSON of the fields set), over the owner's.
    pub limits: Option<String>,
    /// The key its chain of rotations began with; `None`: this key.
    pub family_id: Option<String>,
}

impl ApiKey {
    /// The key whose limits, live jobs and tokens this key shares: the
    /// first of its rotations.
    pub fn family(&self) -> &str {
        self.family_id.as_deref().unwrap_or(&self.id)
    }

    /// Neither revoked nor expired at `now`.
    pub fn is_live_at(&self, now: Millis) -> bool {
        self.revoked_at.is_none() && self.expires_at.is_none_or(|e| e > now)
    }
}

#[async_trait]
pub trait KeyStore: Send + Sync {
    /// Insert a new key, audited as made by `actor`, in one commit.
    async fn insert_api_key(&self, key: ApiKey, actor: &str) -> Result<(), StoreError>;

    async fn find_api_key(&self, key_hash: &str) -> Result<Option<ApiKey>, StoreError>;

    async fn list_api_keys(&self, owner: Option<&OwnerId>) -> Result<Vec<KeyRecord>, StoreError>;

    async fn get_api_key(&self, id: &str) -> Result<Option<KeyRecord>, StoreError>;

    /// Revoke now (audited with the `reason` given, change counter
    /// bumped); false when not found or revoked already.
    async fn revoke_api_key(
        &self,
        id: &str,
        actor: &str,
        reason: Option<&str>,
        at: Millis,
    ) -> Result<bool, StoreError>;

    /// Insert the successor and cut the old key's life, in one commit;
    /// false when the old key is not live or was rotated already.
    async fn rotate_api_key(&self, rotation: Rotation, actor: &str) -> Result<bool, StoreError>;

    /// Write `last used` for a batch of keys.
    async fn touch_api_keys(&self, used: Vec<(String, Millis)>) -> Result<(), StoreError>;

    /// The counter bumped by every change running servers cache.
    async fn tenant_changes(&self) -> Result<i64, StoreError>;

    async fn owner_limits(&self) -> Result<Vec<OwnerLimitsRow>, StoreError>;

    /// Set an owner's run-time limits (audited, change counter bumped).
    async fn set_owner_limits(&self, row: OwnerLimitsRow) -> Result<(), StoreError>;

    async fn tenant_audit(&self, limit: i64) -> Result<Vec<TenantAuditEntry>, StoreError>;

    /// Heartbeat `instance` at `at`; the number of instances seen since `since`.
    async fn heartbeat(&self, instance: &str, at: Millis, since: Millis)
        -> Result<i64, StoreError>;

    async fn leave_instances(&self, instance: &str) -> Result<(), StoreError>;

    /// An owner's (and, given its family id, a key's) live jobs and tokens on `day`,
    /// in one read.
    async fn owner_load(
        &self,
        owner: &OwnerId,
        key: Option<&str>,
        day: i64,
    ) -> Result<OwnerLoad, StoreError>;

    /// Set (or with `None` clear) the limits of key `id` and of every key
    /// of its family, audited; false when no live key has that id.
    async fn set_key_limits(
        &self,
        id: &str,
        limits: Option<String>,
        actor: &str,
        reason: &str,
        at: Millis,
    ) -> Result<bool, StoreError>;

    /// Usage rows from `from_day` on, of `owner` or of everyone.
    async fn usage(
        &self,
        owner: Option<&OwnerId>,
        from_day: i64,
    ) -> Result<Vec<UsageRow>, StoreError>;
}
