//! Tenants in the store: the key lifecycle (list, revoke, rotate, expiry,
//! last use), limits set at run time with their audit trail, the change
//! counter running servers poll, the instance heartbeat, and usage by
//! owner and day: the types; their SQL is in `sql/keys.rs`.

use crate::domain::Millis;
use serde::Serialize;

/// One API key as listed: never its hash, never its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct KeyRecord {
    pub id: String,
    pub owner_id: String,
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

/// A rotation: the new key's row, and when the old one stops working.
#[derive(Debug, Clone, PartialEq)]
pub struct Rotation {
    pub old_id: String,
    pub new: crate::store::ApiKey,
    pub old_expires_at: Millis,
}

/// An entry of the audit trail of keys and limits.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct TenantAuditEntry {
    pub id: i64,
    /// `key:ID` or `owner:NAME`.
    pub subject: String,
    pub action: String,
    pub actor: String,
    pub detail: Option<String>,
    pub at: Millis,
}

/// Limits an admin set for an owner at run time (JSON of the fields set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct OwnerLimitsRow {
    pub owner_id: String,
    pub limits: String,
    pub changed_by: String,
    pub reason: String,
    pub changed_at: Millis,
}

/// Tokens of one (owner, UTC day, route, provider, attempt kind).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct UsageRow {
    pub owner_id: String,
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
