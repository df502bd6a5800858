//! API keys: random, shown once, stored only as a SHA-256 hash. Keys carry
//! 256 bits of randomness, so a fast hash is enough: there is nothing to
//! brute-force that a slow hash would protect.
//!
//! The lifecycle: create (optionally expiring), list (never the secret),
//! revoke (refused at once), rotate (a new secret; the old one keeps
//! working for a grace period, then is refused). HTTP and CLI call the same
//! functions here.

use crate::clock::Clock;
use crate::domain::limits::Limits;
use crate::domain::reason::check_reason;
use crate::domain::{new_id, Millis, OwnerId};
use crate::store::tenants::{KeyRecord, Rotation};
use crate::store::{ApiKey, Store, StoreError};
use rand::RngCore;
use sha2::{Digest, Sha256};
use std::time::Duration;

/// Prefix that makes a leaked key recognisable to secret scanners.
pub const KEY_PREFIX: &str = "oj_";
/// How much of a key `keys list` shows: the prefix and 8 hex digits.
const SHOWN_CHARS: usize = 11;
/// The longest expiry or grace period accepted (ten years).
const MAX_LIFETIME: Duration = Duration::from_secs(10 * 366 * 86_400);

/// Who is calling: the owner (tenant) of the key, never a header the client chooses.
#[derive(Debug, Clone, PartialEq)]
pub struct Caller {
    pub owner_id: OwnerId,
    pub is_admin: bool,
    /// The key used, for `last used` and the audit trail.
    pub key_id: String,
    /// The key whose limits and counts this one shares (the first of its
    /// rotations; usually `key_id`): what a job records as its key.
    pub key_family: String,
    /// The key's own limits, in addition to its owner's.
    pub key_limits: Limits,
}

impl Caller {
    /// The caller a live key row stands for; unreadable stored limits are
    /// logged and read as none.
    pub fn of(key: &ApiKey) -> Caller {
        let key_limits = match key.limits.as_deref().map(serde_json::from_str::<Limits>) {
            None => Limits::default(),
            Some(Ok(l)) => l,
            Some(Err(e)) => {
                tracing::error!(key = %key.id, error = %e, "unreadable stored key limits; ignored");
                Limits::default()
            }
        };
        Caller {
            owner_id: key.owner_id.clone(),
            is_admin: key.is_admin,
            key_id: key.id.clone(),
            key_family: key.family().to_string(),
            key_limits,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("owner name must be 1-128 characters of letters, digits, '-', '_', '.' or '@'")]
    InvalidOwner,
    #[error("{0}")]
    InvalidDuration(String),
    #[error("{}", not_found(.0))]
    NotFound(String),
    #[error("key {0} is revoked, expired or already rotated")]
    NotLive(String),
    #[error("{0}")]
    InvalidLimits(String),
    #[error("reason: {0}")]
    InvalidReason(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// "Not found" for an id, which never echoes a key's secret given in its
/// place (`oj_` and 64 hex digits), and quotes anything else.
fn not_found(id: &str) -> String {
    let secret = id
        .strip_prefix(KEY_PREFIX)
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if secret {
        return "that is a key's secret, not its id: the ids are in `keys list` \
                (GET /v1/admin/keys); the secret was not printed"
            .to_string();
    }
    format!("key {id:?} not found")
}

pub fn hash_key(key: &str) -> String {
    hex::encode(Sha256::digest(key.as_bytes()))
}

fn valid_owner(owner: &str) -> bool {
    OwnerId::is_valid_name(owner)
}

/// A duration as people write it (`90s`, `12h`, `30d`), for `--expires-in` and `--grace`.
pub fn parse_duration(field: &str, text: &str) -> Result<Duration, KeyError> {
    let d = humantime::parse_duration(text.trim()).map_err(|e| {
        KeyError::InvalidDuration(format!(
            "{field}: {e}; write a duration such as 90s, 12h or 30d"
        ))
    })?;
    if d > MAX_LIFETIME {
        return Err(KeyError::InvalidDuration(format!(
            "{field}: at most ten years"
        )));
    }
    Ok(d)
}

fn new_secret() -> String {
    let mut secret = [0u8; 32];
    rand::rngs::OsRng.fill_bytes(&mut secret);
    format!("{KEY_PREFIX}{}", hex::encode(secret))
}

fn new_row(
    owner: &OwnerId,
    admin: bool,
    key: &str,
    now: Millis,
    expires_in: Option<Duration>,
) -> ApiKey {
    ApiKey {
        id: new_id(),
        owner_id: owner.clone(),
        key_hash: hash_key(key),
        prefix: key.chars().take(SHOWN_CHARS).collect(),
        is_admin: admin,
        created_at: now,
        expires_at: expires_in.map(|d| now + d.as_millis() as Millis),
        revoked_at: None,
        limits: None,
        family_id: None,
    }
}

/// Limits as stored on a key: `None` when no field is set.
fn stored_limits(limits: &Limits) -> Result<Option<String>, KeyError> {
    // A key's limits are its own, not over its owner's: its burst needs
    // its own rate.
    limits
        .check()
        .and_then(|()| limits.check_burst_has_rate("on the key (its limits are its own)"))
        .map_err(|e| KeyError::InvalidLimits(format!("limits.{e}")))?;
    if *limits == Limits::default() {
        return Ok(None);
    }
    serde_json::to_string(limits)
        .map(Some)
        .map_err(|e| KeyError::InvalidLimits(e.to_string()))
}

/// A new key and its record; the key is in no log and nowhere else.
pub struct CreatedKey {
    pub secret: String,
    pub record: KeyRecord,
}

/// Who a key made by the program itself (the demo, tests) is audited as.
pub const SELF_ACTOR: &str = "onejob";

/// Create a key for `owner` and return it; only its hash is stored. For
/// the demo and tests: audited as [`SELF_ACTOR`].
pub async fn create_key(
    store: &dyn Store,
    clock: &dyn Clock,
    owner: &str,
    admin: bool,
) -> Result<String, KeyError> {
    Ok(create(
        store,
        clock,
        owner,
        admin,
        None,
        Limits::default(),
        SELF_ACTOR,
    )
    .await?
    .secret)
}

/// An optional reason for a revocation or a rotation, by the one rule
/// ([`check_reason`]), trimmed.
pub fn optional_reason(reason: Option<&str>) -> Result<Option<&str>, KeyError> {
    reason
        .map(|r| check_reason(r).map_err(|e| KeyError::InvalidReason(e.to_string())))
        .transpose()
}

/// Create a key, expiring `expires_in` from now when given, with limits of
/// its own (in addition to its owner's) when any field is set; audited as
/// made by `actor`. `owner` is the name as an admin typed it: checked
/// here, where it becomes an [`OwnerId`].
pub async fn create(
    store: &dyn Store,
    clock: &dyn Clock,
    owner: &str,
    admin: bool,
    expires_in: Option<Duration>,
    limits: Limits,
    actor: &str,
) -> Result<CreatedKey, KeyError> {
    if !valid_owner(owner) {
        return Err(KeyError::InvalidOwner);
    }
    if expires_in.is_some_and(|d| d.is_zero()) {
        // Expired as it is made: a key nobody could use.
        return Err(KeyError::InvalidDuration(
            "expires_in: must be more than 0".to_string(),
        ));
    }
    let limits = stored_limits(&limits)?;
    let secret = new_secret();
    let mut row = new_row(&owner.into(), admin, &secret, clock.now_ms(), expires_in);
    row.limits = limits;
    let record = KeyRecord::from(&row);
    store.insert_api_key(row, actor).await?;
    Ok(CreatedKey { secret, record })
}

pub async fn list(store: &dyn Store, owner: Option<&OwnerId>) -> Result<Vec<KeyRecord>, KeyError> {
    Ok(store.list_api_keys(owner).await?)
}

/// Revoke a key now, audited with the `reason` when given; every server
/// refuses it within about a second.
pub async fn revoke(
    store: &dyn Store,
    clock: &dyn Clock,
    id: &str,
    actor: &str,
    reason: Option<&str>,
) -> Result<KeyRecord, KeyError> {
    let reason = optional_reason(reason)?;
    let Some(_) = store.get_api_key(id).await? else {
        return Err(KeyError::NotFound(id.to_string()));
    };
    if !store
        .revoke_api_key(id, actor, reason, clock.now_ms())
        .await?
    {
        return Err(KeyError::NotLive(id.to_string()));
    }
    store
        .get_api_key(id)
        .await?
        .ok_or_else(|| KeyError::NotFound(id.to_string()))
}

/// Replace the own limits of key `id` (and of the keys it rotated from or
/// to, which share them), audited; every server applies them within a
/// second. No field set: the key has none of its own.
pub async fn set_limits(
    store: &dyn Store,
    clock: &dyn Clock,
    id: &str,
    limits: Limits,
    actor: &str,
    reason: &str,
) -> Result<KeyRecord, KeyError> {
    let stored = stored_limits(&limits)?;
    let reason =
        check_reason(reason).map_err(|e| KeyError::InvalidLimits(format!("reason: {e}")))?;
    let Some(_) = store.get_api_key(id).await? else {
        return Err(KeyError::NotFound(id.to_string()));
    };
    if !store
        .set_key_limits(id, stored, actor, reason, clock.now_ms())
        .await?
    {
        return Err(KeyError::NotLive(id.to_string()));
    }
    store
        .get_api_key(id)
        .await?
        .ok_or_else(|| KeyError::NotFound(id.to_string()))
}

/// A rotation's result: the new key (shown once) and the old key's record.
pub struct RotatedKey {
    pub created: CreatedKey,
    pub old: KeyRecord,
}

/// Give key `id` a successor with the same owner, rights and expiry; the
/// old secret keeps working for `grace`, then is refused. Audited with
/// the `reason` when given.
pub async fn rotate(
    store: &dyn Store,
    clock: &dyn Clock,
    id: &str,
    grace: Duration,
    actor: &str,
    reason: Option<&str>,
) -> Result<RotatedKey, KeyError> {
    let reason = optional_reason(reason)?;
    let Some(old) = store.get_api_key(id).await? else {
        return Err(KeyError::NotFound(id.to_string()));
    };
    let now = clock.now_ms();
    let secret = new_secret();
    let mut row = new_row(&old.owner_id, old.is_admin, &secret, now, None);
    row.expires_at = old.expires_at;
    // The successor is the same key to its limits and counts.
    row.limits = old.limits.clone();
    row.family_id = Some(old.family.clone());
    let record = KeyRecord::from(&row);
    let rotation = Rotation {
        old_id: id.to_string(),
        new: row,
        old_expires_at: now + grace.as_millis() as Millis,
        reason: reason.map(str::to_string),
    };
    if !store.rotate_api_key(rotation, actor).await? {
        return Err(KeyError::NotLive(id.to_string()));
    }
    let old = store
        .get_api_key(id)
        .await?
        .ok_or_else(|| KeyError::NotFound(id.to_string()))?;
    Ok(RotatedKey {
        created: CreatedKey { secret, record },
        old,
    })
}

/// The caller a presented key belongs to, if it is live. Uncached: the
/// server goes through [`crate::tenants::Tenants::authenticate`].
pub async fn authenticate(
    store: &dyn Store,
    presented: &str,
) -> Result<Option<Caller>, StoreError> {
    if !presented.starts_with(KEY_PREFIX) || presented.len() > 256 {
        return Ok(None);
    }
    let now = crate::clock::SystemClock.now_ms();
    Ok(store
        .find_api_key(&hash_key(presented))
        .await?
        .filter(|k| k.is_live_at(now))
        .map(|k| Caller::of(&k)))
}

/// What a listed key is now.
pub fn key_state(key: &KeyRecord, now: Millis) -> &'static str {
    match (key.revoked_at, key.expires_at, &key.replaced_by) {
        (Some(_), _, _) => "revoked",
        (None, Some(e), _) if e <= now => "expired",
        (None, _, Some(_)) => "rotating",
        _ => "active",
    }
}

impl From<&ApiKey> for KeyRecord {
    fn from(k: &ApiKey) -> Self {
        KeyRecord {
            id: k.id.clone(),
            owner_id: k.owner_id.clone(),
            prefix: k.prefix.clone(),
            is_admin: k.is_admin,
            created_at: k.created_at,
            expires_at: k.expires_at,
            revoked_at: k.revoked_at,
            last_used_at: None,
            replaced_by: None,
            limits: k.limits.clone(),
            family: k.family().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_names_are_checked() {
        assert!(valid_owner("acme-prod"));
        assert!(!valid_owner(""));
        assert!(!valid_owner("a b"));
        assert!(!valid_owner(&"x".repeat(129)));
    }

    #[test]
    fn durations_read_as_people_write_them() {
        assert_eq!(parse_duration("g", "90s").unwrap(), Duration::from_secs(90));
        assert_eq!(
            parse_duration("g", "30d").unwrap(),
            Duration::from_secs(30 * 86_400)
        );
        let err = parse_duration("--grace", "soon").unwrap_err().to_string();
        assert!(err.starts_with("--grace:"), "{err}");
        assert!(parse_duration("g", "20years").is_err());
    }
}
