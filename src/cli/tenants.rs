//! `onejob keys list|create|revoke|rotate`, `onejob limits show|set` and
//! `onejob usage`: the same logic as `/v1/admin/keys`, `/v1/admin/limits`
//! and `/v1/admin/usage`, straight on the database.

use super::providers::table;
use super::{open_existing_store, open_store, DbArgs};
use crate::clock::{rfc3339, Clock, SystemClock};
use crate::domain::reason::check_reason;
use crate::domain::OwnerId;
use crate::keys::{self, key_state};
use crate::store::tenants::OwnerLimitsRow;
use crate::tenants::limits::Limits;
use crate::tenants::usage;

/// Who a CLI change is audited as: `cli:$USER`, or `cli`.
fn actor() -> String {
    match std::env::var("USER") {
        Ok(user) if !user.trim().is_empty() => format!("cli:{}", user.trim()),
        _ => "cli".to_string(),
    }
}

/// A key's secret (`oj_` and 64 hex digits) given where its id belongs is
/// refused before the database is opened: no key has such an id, and the
/// refusal never prints the secret ([`keys::KeyError::NotFound`] says why).
fn refuse_secret_for_id(id: &str) -> anyhow::Result<()> {
    let secret = id
        .strip_prefix(keys::KEY_PREFIX)
        .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()));
    if secret {
        return Err(keys::KeyError::NotFound(id.to_string()).into());
    }
    Ok(())
}

/// A key's limits as `keys list` and the messages show them.
fn limits_text(limits: Option<&str>) -> String {
    limits.map_or_else(|| "-".to_string(), str::to_string)
}

/// `onejob keys create --owner NAME [--admin] [--expires-in 30d]
/// [--requests-per-second N] …`; the key alone on the last line.
pub async fn create(
    db: &DbArgs,
    owner: &str,
    admin: bool,
    expires_in: Option<&str>,
    limits: Limits,
) -> anyhow::Result<()> {
    let expires_in = expires_in
        .map(|t| keys::parse_duration("--expires-in", t))
        .transpose()?;
    limits
        .check()
        .map_err(|e| anyhow::anyhow!("--{}", e.replace('_', "-")))?;
    // Refused as `keys::create` refuses them, before the database is
    // opened (or, new, created).
    if !OwnerId::is_valid_name(owner) {
        return Err(keys::KeyError::InvalidOwner.into());
    }
    if expires_in.is_some_and(|d| d.is_zero()) {
        return Err(
            keys::KeyError::InvalidDuration("expires_in: must be more than 0".into()).into(),
        );
    }
    let config = db.load(None)?;
    let store = open_store(&config).await?;
    let created = keys::create(
        store.as_ref(),
        &SystemClock,
        owner,
        admin,
        expires_in,
        limits,
        &actor(),
    )
    .await;
    store.close().await;
    let created = created?;
    println!(
        "created {} key {} for owner {owner}{}{}; it is shown once, store it now:",
        if admin { "an admin" } else { "a" },
        created.record.id,
        created
            .record
            .expires_at
            .map(|e| format!(", expiring {}", rfc3339(e)))
            .unwrap_or_default(),
        created
            .record
            .limits
            .as_deref()
            .map(|l| format!(", with its own limits {l} (its owner's apply too)"))
            .unwrap_or_default()
    );
    println!("{}", created.secret);
    Ok(())
}

/// `onejob keys list [--owner NAME]`.
pub async fn list(db: &DbArgs, owner: Option<&OwnerId>) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let store = open_existing_store(&config).await?;
    let listed = keys::list(store.as_ref(), owner).await;
    store.close().await;
    let now = SystemClock.now_ms();
    let mut rows = vec![[
        "OWNER",
        "ID",
        "PREFIX",
        "STATE",
        "ADMIN",
        "CREATED",
        "LAST USED",
        "EXPIRES",
        "REVOKED",
        "LIMITS",
    ]
    .map(String::from)];
    let time = |t: Option<i64>| t.map(rfc3339).unwrap_or_else(|| "-".into());
    for k in listed? {
        rows.push([
            k.owner_id.to_string(),
            k.id.clone(),
            format!("{}…", k.prefix),
            key_state(&k, now).to_string(),
            if k.is_admin { "yes" } else { "no" }.to_string(),
            rfc3339(k.created_at),
            time(k.last_used_at),
            time(k.expires_at),
            time(k.revoked_at),
            limits_text(k.limits.as_deref()),
        ]);
    }
    print!("{}", table(&rows));
    Ok(())
}

/// An optional `--reason`, refused before the database is opened.
fn optional_reason(reason: Option<&str>) -> anyhow::Result<Option<&str>> {
    keys::optional_reason(reason).map_err(|e| anyhow::anyhow!("--{e}"))
}

/// `onejob keys revoke ID [--reason TEXT]`.
pub async fn revoke(db: &DbArgs, id: &str, reason: Option<&str>) -> anyhow::Result<()> {
    let reason = optional_reason(reason)?;
    refuse_secret_for_id(id)?;
    let config = db.load(None)?;
    let store = open_existing_store(&config).await?;
    let result = keys::revoke(store.as_ref(), &SystemClock, id, &actor(), reason).await;
    store.close().await;
    let record = result?;
    println!(
        "key {} of owner {} revoked; running servers refuse it within a second",
        record.id, record.owner_id
    );
    Ok(())
}

/// `onejob keys rotate ID [--grace 24h] [--reason TEXT]`; the new key
/// alone on the last line.
pub async fn rotate(
    db: &DbArgs,
    id: &str,
    grace: &str,
    reason: Option<&str>,
) -> anyhow::Result<()> {
    let grace = keys::parse_duration("--grace", grace)?;
    let reason = optional_reason(reason)?;
    refuse_secret_for_id(id)?;
    let config = db.load(None)?;
    let store = open_existing_store(&config).await?;
    let result = keys::rotate(store.as_ref(), &SystemClock, id, grace, &actor(), reason).await;
    store.close().await;
    let rotated = result?;
    println!(
        "key {} of owner {} rotated: the old secret works until {}, then is refused",
        rotated.old.id,
        rotated.old.owner_id,
        rotated.old.expires_at.map(rfc3339).unwrap_or_default()
    );
    println!(
        "new key {}; it is shown once, store it now:",
        rotated.created.record.id
    );
    println!("{}", rotated.created.secret);
    Ok(())
}

/// `onejob keys limits ID --reason TEXT [--requests-per-second N] …`.
pub async fn set_key_limits(
    db: &DbArgs,
    id: &str,
    limits: Limits,
    reason: &str,
) -> anyhow::Result<()> {
    limits
        .check()
        .map_err(|e| anyhow::anyhow!("--{}", e.replace('_', "-")))?;
    check_reason(reason).map_err(|e| anyhow::anyhow!("--reason: {e}"))?;
    refuse_secret_for_id(id)?;
    let config = db.load(None)?;
    let store = open_existing_store(&config).await?;
    let result = keys::set_limits(store.as_ref(), &SystemClock, id, limits, &actor(), reason).await;
    store.close().await;
    let record = result?;
    match record.limits.as_deref() {
        Some(l) => println!(
            "limits of key {} (owner {}) set to {l}; its owner's apply too; running servers apply them within a second",
            record.id, record.owner_id
        ),
        None => println!(
            "key {} (owner {}) has no limits of its own now; its owner's apply; running servers apply this within a second",
            record.id, record.owner_id
        ),
    }
    Ok(())
}

/// `onejob limits show`: the config's limits and the run-time changes.
pub async fn show_limits(db: &DbArgs) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let store = open_existing_store(&config).await?;
    let rows = store.owner_limits().await;
    store.close().await;
    let text = |l: &Limits| serde_json::to_string(l).unwrap_or_default();
    println!("default (config): {}", text(&config.limits.default));
    for (owner, limits) in &config.limits.owners {
        println!("owner {owner} (config): {}", text(limits));
    }
    for r in rows? {
        println!(
            "owner {} (set by {} at {}: {}): {}",
            r.owner_id,
            r.changed_by,
            rfc3339(r.changed_at),
            r.reason,
            r.limits
        );
    }
    Ok(())
}

/// `onejob limits set OWNER --reason TEXT [--requests-per-second N] …`.
pub async fn set_limits(
    db: &DbArgs,
    owner: &OwnerId,
    limits: Limits,
    reason: &str,
) -> anyhow::Result<()> {
    if !OwnerId::is_valid_name(owner) {
        anyhow::bail!("OWNER {owner:?}: must be {}", OwnerId::NAME_RULE);
    }
    limits
        .check()
        .map_err(|e| anyhow::anyhow!("--{}", e.replace('_', "-")))?;
    let reason = check_reason(reason).map_err(|e| anyhow::anyhow!("--reason: {e}"))?;
    let config = db.load(None)?;
    config
        .limits
        .check_override(owner, &limits)
        .map_err(|e| anyhow::anyhow!("--{}", e.replace('_', "-")))?;
    let store = open_store(&config).await?;
    let row = OwnerLimitsRow {
        owner_id: owner.clone(),
        limits: serde_json::to_string(&limits)?,
        changed_by: actor(),
        reason: reason.to_string(),
        changed_at: SystemClock.now_ms(),
    };
    let result = store.set_owner_limits(row).await;
    store.close().await;
    result?;
    println!(
        "limits of {owner} set to {} (over the config file's); running servers apply them within a second",
        serde_json::to_string(&limits)?
    );
    Ok(())
}

/// `onejob usage [--owner NAME] [--days N]`.
pub async fn usage(db: &DbArgs, owner: Option<&OwnerId>, days: u32) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let store = open_existing_store(&config).await?;
    let report = usage::report(store.as_ref(), &SystemClock, owner, days).await;
    store.close().await;
    let report = report?;
    let mut rows = vec![[
        "OWNER",
        "DAY",
        "ROUTE",
        "PROVIDER",
        "KIND",
        "ATTEMPTS",
        "JOBS",
        "PROMPT",
        "COMPLETION",
        "DISCARDED",
    ]
    .map(String::from)];
    for l in &report.lines {
        rows.push([
            l.owner.to_string(),
            l.day.clone(),
            l.route.clone(),
            l.provider.clone(),
            l.kind.clone(),
            l.attempts.to_string(),
            l.jobs.to_string(),
            l.prompt_tokens.to_string(),
            l.completion_tokens.to_string(),
            l.discarded_tokens.to_string(),
        ]);
    }
    print!("{}", table(&rows));
    let t = &report.totals;
    println!(
        "since {}: {} jobs, {} tokens, of which hedges {} and discarded answers {}",
        report.from, t.jobs, t.tokens, t.hedge_tokens, t.discarded_tokens
    );
    Ok(())
}
