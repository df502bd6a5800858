//! Tenants: API keys and their lifecycle (list, revoke, rotate, last use),
//! limits set at run time with their audit trail, the change counter,
//! the instance heartbeat, and usage by owner and day.

use crate::domain::Millis;
use crate::store::rows::ApiKeyRow;
use crate::store::sql::db::{args, Db};
use crate::store::sql::Dialect;
use crate::store::tenants::{
    KeyRecord, OwnerLimitsRow, OwnerLoad, Rotation, TenantAuditEntry, UsageRow,
};
use crate::store::{ApiKey, StoreError};

pub(crate) async fn insert_api_key(conn: &mut impl Db, key: ApiKey) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO api_keys (id, owner_id, key_hash, prefix, is_admin, created_at, \
         expires_at, revoked_at, limits, family_id) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        args![
            &key.id,
            &key.owner_id,
            &key.key_hash,
            &key.prefix,
            key.is_admin,
            key.created_at,
            key.expires_at,
            key.revoked_at,
            &key.limits,
            &key.family_id
        ],
    )
    .await?;
    Ok(())
}

/// A new key and its `create` entry in the audit trail (owner, rights,
/// expiry and limits; never the hash).
pub(crate) async fn create_api_key(
    conn: &mut impl Db,
    key: ApiKey,
    actor: &str,
) -> Result<(), StoreError> {
    let subject = format!("key:{}", key.id);
    let at = key.created_at;
    let detail = serde_json::json!({
        "owner": key.owner_id,
        "admin": key.is_admin,
        "expires_at": key.expires_at,
        "limits": key.limits,
    })
    .to_string();
    insert_api_key(conn, key).await?;
    insert_tenant_audit(conn, &subject, "create", actor, Some(&detail), at).await
}

pub(crate) async fn find_api_key(
    conn: &mut impl Db,
    key_hash: &str,
) -> Result<Option<ApiKey>, StoreError> {
    let row: Option<ApiKeyRow> = conn
        .fetch_optional(
            "SELECT id, owner_id, key_hash, prefix, is_admin, created_at, expires_at, revoked_at, \
         limits, family_id FROM api_keys WHERE key_hash = $1",
            args![key_hash],
        )
        .await?;
    Ok(row.map(ApiKey::from))
}

pub(crate) async fn bump_tenant_changes(conn: &mut impl Db) -> Result<(), StoreError> {
    conn.execute(
        "UPDATE tenant_changes SET version = version + 1 WHERE id = 1",
        args![],
    )
    .await?;
    Ok(())
}

pub(crate) async fn tenant_changes(conn: &mut impl Db) -> Result<i64, StoreError> {
    let (v,): (i64,) = conn
        .fetch_one("SELECT version FROM tenant_changes WHERE id = 1", args![])
        .await?;
    Ok(v)
}

pub(crate) async fn insert_tenant_audit(
    conn: &mut impl Db,
    subject: &str,
    action: &str,
    actor: &str,
    detail: Option<&str>,
    at: Millis,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO tenant_audit (subject, action, actor, detail, at) VALUES ($1, $2, $3, $4, $5)",
        args![subject, action, actor, detail, at],
    )
    .await?;
    Ok(())
}

pub(crate) async fn tenant_audit(
    conn: &mut impl Db,
    limit: i64,
) -> Result<Vec<TenantAuditEntry>, StoreError> {
    conn.fetch_all(
        "SELECT id, subject, action, actor, detail, at FROM tenant_audit ORDER BY id DESC LIMIT $1",
        args![limit],
    )
    .await
}

pub(crate) async fn list_api_keys(
    conn: &mut impl Db,
    owner: Option<&str>,
) -> Result<Vec<KeyRecord>, StoreError> {
    conn.fetch_all(
        "SELECT id, owner_id, prefix, is_admin, created_at, expires_at, revoked_at, \
         last_used_at, replaced_by, limits, COALESCE(family_id, id) AS family FROM api_keys \
         WHERE ($1 IS NULL OR owner_id = $1) ORDER BY owner_id, created_at, id",
        args![owner],
    )
    .await
}

pub(crate) async fn get_api_key(
    conn: &mut impl Db,
    id: &str,
) -> Result<Option<KeyRecord>, StoreError> {
    conn.fetch_optional(
        "SELECT id, owner_id, prefix, is_admin, created_at, expires_at, revoked_at, \
         last_used_at, replaced_by, limits, COALESCE(family_id, id) AS family FROM api_keys WHERE id = $1",
        args![id],
    ).await
}

/// Revoke a key now; false when it does not exist or was revoked already.
pub(crate) async fn revoke_api_key(
    conn: &mut impl Db,
    id: &str,
    actor: &str,
    reason: Option<&str>,
    at: Millis,
) -> Result<bool, StoreError> {
    let n = conn
        .execute(
            // A key rotated away but inside its grace still opens the
            // door, so it may be revoked (ending the grace); an expired
            // one no longer does, and its revocation would be a false
            // record of a key cut off.
            "UPDATE api_keys SET revoked_at = $2 WHERE id = $1 AND revoked_at IS NULL \
             AND (expires_at IS NULL OR expires_at > $2)",
            args![id, at],
        )
        .await?;
    if n == 0 {
        return Ok(false);
    }
    bump_tenant_changes(conn).await?;
    let detail = reason.map(|r| serde_json::json!({ "reason": r }).to_string());
    insert_tenant_audit(
        conn,
        &format!("key:{id}"),
        "revoke",
        actor,
        detail.as_deref(),
        at,
    )
    .await?;
    Ok(true)
}

/// Insert the new key and cut the old one's life to the grace
/// period, in one commit; false when the old key is not live.
pub(crate) async fn rotate_api_key(
    conn: &mut impl Db,
    rotation: Rotation,
    actor: &str,
) -> Result<bool, StoreError> {
    let at = rotation.new.created_at;
    let n = conn
        .execute(
            "UPDATE api_keys SET replaced_by = $2, \
         expires_at = CASE WHEN expires_at IS NULL OR expires_at > $3 THEN $3 ELSE expires_at END \
         WHERE id = $1 AND revoked_at IS NULL AND replaced_by IS NULL \
         AND (expires_at IS NULL OR expires_at > $4)",
            args![
                &rotation.old_id,
                &rotation.new.id,
                rotation.old_expires_at,
                at
            ],
        )
        .await?;
    if n == 0 {
        return Ok(false);
    }
    insert_api_key(conn, rotation.new.clone()).await?;
    bump_tenant_changes(conn).await?;
    let mut detail = serde_json::json!({
        "new_key": rotation.new.id,
        "old_expires_at": rotation.old_expires_at,
    });
    if let Some(reason) = &rotation.reason {
        detail["reason"] = serde_json::json!(reason);
    }
    let detail = detail.to_string();
    insert_tenant_audit(
        conn,
        &format!("key:{}", rotation.old_id),
        "rotate",
        actor,
        Some(&detail),
        at,
    )
    .await?;
    Ok(true)
}

/// Record when keys were last used: one statement per key, never
/// moving the time back.
pub(crate) async fn touch_api_keys(
    conn: &mut impl Db,
    used: Vec<(String, Millis)>,
) -> Result<(), StoreError> {
    for (id, at) in &used {
        conn.execute(
            "UPDATE api_keys SET last_used_at = $2 WHERE id = $1 \
             AND (last_used_at IS NULL OR last_used_at < $2)",
            args![id, *at],
        )
        .await?;
    }
    Ok(())
}

pub(crate) async fn set_owner_limits(
    conn: &mut impl Db,
    row: OwnerLimitsRow,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO owner_limits (owner_id, limits, changed_by, reason, changed_at) \
         VALUES ($1, $2, $3, $4, $5) ON CONFLICT (owner_id) DO UPDATE SET \
         limits = excluded.limits, changed_by = excluded.changed_by, \
         reason = excluded.reason, changed_at = excluded.changed_at",
        args![
            &row.owner_id,
            &row.limits,
            &row.changed_by,
            &row.reason,
            row.changed_at
        ],
    )
    .await?;
    bump_tenant_changes(conn).await?;
    let detail = serde_json::json!({ "limits": row.limits, "reason": row.reason }).to_string();
    insert_tenant_audit(
        conn,
        &format!("owner:{}", row.owner_id),
        "set_limits",
        &row.changed_by,
        Some(&detail),
        row.changed_at,
    )
    .await?;
    Ok(())
}

pub(crate) async fn owner_limits(conn: &mut impl Db) -> Result<Vec<OwnerLimitsRow>, StoreError> {
    conn.fetch_all(
        "SELECT owner_id, limits, changed_by, reason, changed_at FROM owner_limits ORDER BY owner_id",
        args![],
    ).await
}

/// Heartbeat this instance and count those seen since `since`.
pub(crate) async fn heartbeat(
    conn: &mut impl Db,
    instance: &str,
    at: Millis,
    since: Millis,
) -> Result<i64, StoreError> {
    conn.execute(
        "INSERT INTO instances (id, seen_at) VALUES ($1, $2) \
         ON CONFLICT (id) DO UPDATE SET seen_at = excluded.seen_at",
        args![instance, at],
    )
    .await?;
    // Long-gone instances are forgotten.
    conn.execute(
        "DELETE FROM instances WHERE seen_at < $1",
        args![at - 3_600_000],
    )
    .await?;
    let (n,): (i64,) = conn
        .fetch_one(
            "SELECT COUNT(*) FROM instances WHERE seen_at >= $1",
            args![since],
        )
        .await?;
    Ok(n)
}

pub(crate) async fn leave_instances(conn: &mut impl Db, instance: &str) -> Result<(), StoreError> {
    conn.execute("DELETE FROM instances WHERE id = $1", args![instance])
        .await?;
    Ok(())
}

/// One query; each count is served by an index (`jobs_active`, whose
/// `(owner_id, key_id)` serves the owner's count by its prefix and the
/// key's by both, and `usage_daily`'s primary key).
pub(crate) async fn owner_load(
    conn: &mut impl Db,
    owner: &str,
    key: Option<&str>,
    day: i64,
) -> Result<OwnerLoad, StoreError> {
    let (active_jobs, tokens_today, key_active_jobs, key_tokens_today): (
        i64,
        Option<i64>,
        i64,
        Option<i64>,
    ) = conn
        .fetch_one(
            concat!(
        "SELECT (SELECT COUNT(*) FROM jobs WHERE owner_id = $1 AND state IN (",
        crate::job_states_taking_attempts!(),
        ")), (SELECT CAST(SUM(prompt_tokens + completion_tokens) AS BIGINT) FROM usage_daily \
              WHERE owner_id = $1 AND day = $2), \
             (SELECT COUNT(*) FROM jobs WHERE owner_id = $1 AND key_id = $3 AND state IN (",
        crate::job_states_taking_attempts!(),
        ")), (SELECT CAST(SUM(prompt_tokens + completion_tokens) AS BIGINT) FROM usage_daily \
              WHERE owner_id = $1 AND day = $2 AND key_id = $3)"
    ),
            args![owner, day, key],
        )
        .await?;
    Ok(OwnerLoad {
        active_jobs,
        tokens_today: tokens_today.unwrap_or(0),
        key_active_jobs,
        key_tokens_today: key_tokens_today.unwrap_or(0),
    })
}

pub(crate) async fn set_key_limits(
    conn: &mut impl Db,
    id: &str,
    limits: Option<String>,
    actor: &str,
    reason: &str,
    at: Millis,
) -> Result<bool, StoreError> {
    let limits = limits.as_deref();
    let n = conn
        .execute(
            "UPDATE api_keys SET limits = $2 WHERE COALESCE(family_id, id) = \
         (SELECT COALESCE(family_id, id) FROM api_keys WHERE id = $1 AND revoked_at IS NULL \
          AND (expires_at IS NULL OR expires_at > $3))",
            args![id, limits, at],
        )
        .await?;
    if n == 0 {
        return Ok(false);
    }
    bump_tenant_changes(conn).await?;
    let detail = serde_json::json!({ "limits": limits, "reason": reason }).to_string();
    insert_tenant_audit(
        conn,
        &format!("key:{id}"),
        "set_limits",
        actor,
        Some(&detail),
        at,
    )
    .await?;
    Ok(true)
}

pub(crate) async fn usage(
    conn: &mut impl Db,
    owner: Option<&str>,
    from_day: i64,
) -> Result<Vec<UsageRow>, StoreError> {
    conn.fetch_all(
        "SELECT owner_id, day, route, provider, kind, CAST(SUM(attempts) AS BIGINT) AS attempts, \
         CAST(SUM(won) AS BIGINT) AS won, CAST(SUM(prompt_tokens) AS BIGINT) AS prompt_tokens, \
         CAST(SUM(completion_tokens) AS BIGINT) AS completion_tokens, \
         CAST(SUM(discarded_tokens) AS BIGINT) AS discarded_tokens FROM usage_daily \
         WHERE ($1 IS NULL OR owner_id = $1) AND day >= $2 \
         GROUP BY owner_id, day, route, provider, kind \
         ORDER BY owner_id, day, route, provider, kind",
        args![owner, from_day],
    )
    .await
}

/// What an attempt's usage JSON adds to its owner's day: prompt,
/// completion, and discarded tokens (all of them when it lost).
pub(crate) fn usage_counts(usage: &str, won: bool) -> (i64, i64, i64) {
    let parsed: serde_json::Value = serde_json::from_str(usage).unwrap_or_default();
    let prompt = parsed["prompt_tokens"].as_i64().unwrap_or(0);
    let completion = parsed["completion_tokens"].as_i64().unwrap_or(0);
    let discarded = if won { 0 } else { prompt + completion };
    (prompt, completion, discarded)
}

/// The row of `usage_daily` an attempt's usage adds to: whose it is, as
/// the finish that records it has read them.
pub(crate) struct UsageOf<'a> {
    pub attempt_id: &'a str,
    pub owner_id: &'a str,
    /// The job's key family, `""` for none.
    pub key_id: &'a str,
    pub route: &'a str,
    pub provider: &'a str,
    pub kind: &'a str,
}

/// Add an attempt's reported usage to its owner's day, in the commit
/// that records it. `usage` is the attempt's usage JSON.
pub(crate) async fn add_usage<C: Db>(
    conn: &mut C,
    of: &UsageOf<'_>,
    usage: Option<&str>,
    won: bool,
    at: Millis,
) -> Result<(), StoreError> {
    let Some(usage) = usage else { return Ok(()) };
    let (prompt, completion, discarded) = usage_counts(usage, won);
    conn.execute(
        C::Sql::ADD_USAGE,
        args![
            of.owner_id,
            crate::store::tenants::day_of(at),
            of.key_id,
            of.route,
            of.provider,
            of.kind,
            i64::from(won),
            prompt,
            completion,
            discarded,
            of.attempt_id
        ],
    )
    .await?;
    Ok(())
}
