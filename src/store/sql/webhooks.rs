//! Signed webhooks: endpoints, the outbox of deliveries (written by the
//! triggers of migration 0010, in the commit that ends a job), claims of
//! due deliveries and the record of each try.
//!
//! On SQLite those triggers exist only while an endpoint does
//! ([`webhook_triggers_follow_endpoints`]).

use crate::domain::Millis;
use crate::store::sql::db::{args, Db};
use crate::store::sql::Dialect;
use crate::store::webhooks::{
    delivery_columns, ClaimedDelivery, DeliveryNext, DeliveryRow, WebhookCounts, WebhookDelivery,
    WebhookEndpoint, WebhookTry, WebhookTryRecord,
};
use crate::store::StoreError;

macro_rules! endpoint_columns {
    () => {
        "id, owner_id, url, description, events, secret, previous_secret, previous_secret_until, \
         enabled, disabled_reason, created_at, updated_at"
    };
}

pub(crate) async fn insert_webhook_endpoint<C: Db>(
    conn: &mut C,
    endpoint: WebhookEndpoint,
) -> Result<(), StoreError> {
    conn.execute(
        concat!(
            "INSERT INTO webhook_endpoints (",
            endpoint_columns!(),
            ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
        ),
        args![
            &endpoint.id,
            &endpoint.owner_id,
            &endpoint.url,
            &endpoint.description,
            &endpoint.events,
            &endpoint.secret,
            &endpoint.previous_secret,
            endpoint.previous_secret_until,
            endpoint.enabled,
            &endpoint.disabled_reason,
            endpoint.created_at,
            endpoint.updated_at
        ],
    )
    .await?;
    for create in C::Sql::WEBHOOK_TRIGGERS_CREATE {
        conn.execute_once(create, &[]).await?;
    }
    Ok(())
}

/// Where the dialect says so (SQLite), the webhook triggers exist exactly
/// while an endpoint does, made so in the caller's transaction: the one
/// that inserts an endpoint creates them, the one that deletes the last
/// drops them, and migration 0016's (and every later one's) makes them
/// follow the endpoints the file has. A trigger that finds no endpoint
/// writes nothing, but SQLite still enters its program, with a frame of
/// registers allocated and zeroed, for every ended job and every attempt's
/// change of state. Whether an endpoint is enabled is the triggers' own
/// test, as before.
pub(crate) async fn webhook_triggers_follow_endpoints<C: Db>(
    conn: &mut C,
) -> Result<(), StoreError> {
    if C::Sql::WEBHOOK_TRIGGERS_CREATE.is_empty() {
        return Ok(());
    }
    let (any,): (bool,) = conn
        .fetch_one(
            "SELECT EXISTS (SELECT 1 FROM webhook_endpoints) AS any",
            &[],
        )
        .await?;
    let statements = if any {
        C::Sql::WEBHOOK_TRIGGERS_CREATE
    } else {
        C::Sql::WEBHOOK_TRIGGERS_DROP
    };
    for statement in statements {
        conn.execute_once(statement, &[]).await?;
    }
    Ok(())
}

pub(crate) async fn list_webhook_endpoints(
    conn: &mut impl Db,
    owner: Option<&str>,
) -> Result<Vec<WebhookEndpoint>, StoreError> {
    conn.fetch_all(
        concat!(
            "SELECT ",
            endpoint_columns!(),
            " FROM webhook_endpoints WHERE ($1 IS NULL OR owner_id = $1) ORDER BY created_at, id"
        ),
        args![owner],
    )
    .await
}

pub(crate) async fn get_webhook_endpoint(
    conn: &mut impl Db,
    id: &str,
) -> Result<Option<WebhookEndpoint>, StoreError> {
    conn.fetch_optional(
        concat!(
            "SELECT ",
            endpoint_columns!(),
            " FROM webhook_endpoints WHERE id = $1"
        ),
        args![id],
    )
    .await
}

/// The endpoint, its deliveries and their tries go together.
pub(crate) async fn delete_webhook_endpoint<C: Db>(
    conn: &mut C,
    id: &str,
) -> Result<bool, StoreError> {
    conn.execute(
        "DELETE FROM webhook_attempts WHERE delivery_id IN \
         (SELECT id FROM webhook_deliveries WHERE endpoint_id = $1)",
        args![id],
    )
    .await?;
    conn.execute(
        "DELETE FROM webhook_deliveries WHERE endpoint_id = $1",
        args![id],
    )
    .await?;
    let done = conn
        .execute("DELETE FROM webhook_endpoints WHERE id = $1", args![id])
        .await?;
    webhook_triggers_follow_endpoints(conn).await?;
    Ok(done == 1)
}

/// The current secret becomes the previous one, signing until
/// `previous_until`; `secret` (sealed) signs from now on.
pub(crate) async fn rotate_webhook_secret(
    conn: &mut impl Db,
    id: &str,
    secret: &str,
    previous_until: Millis,
    at: Millis,
) -> Result<bool, StoreError> {
    let done = conn
        .execute(
            "UPDATE webhook_endpoints SET previous_secret = secret, previous_secret_until = $3, \
         secret = $2, updated_at = $4 WHERE id = $1",
            args![id, secret, previous_until, at],
        )
        .await?;
    Ok(done == 1)
}

/// The claim of due deliveries (`claim_webhook_deliveries`), with the
/// dialect's lock (`$lock`) on the rows it takes; `$1` instance, `$2` now,
/// `$3` lease until, `$4` limit, `$5` the cap per endpoint. Each CTE is
/// computed once: the tries in flight per endpoint, the due deliveries
/// ranked within their endpoint, the first `limit` whose rank fits under
/// the endpoint's cap; only those rows are then locked.
macro_rules! claim_deliveries_sql {
    ($lock:literal) => {
        concat!(
            "WITH busy AS (\
           SELECT endpoint_id, COUNT(*) AS n FROM webhook_deliveries \
           WHERE state = 'pending' AND lease_until > $2 GROUP BY endpoint_id\
         ), ranked AS (\
           SELECT d.id, d.endpoint_id, d.next_attempt_at, ROW_NUMBER() OVER \
             (PARTITION BY d.endpoint_id ORDER BY d.next_attempt_at, d.id) AS rn \
           FROM webhook_deliveries d WHERE d.state = 'pending' AND d.next_attempt_at <= $2 \
             AND (d.lease_until IS NULL OR d.lease_until <= $2)\
         ), chosen AS (\
           SELECT r.id FROM ranked r LEFT JOIN busy b ON b.endpoint_id = r.endpoint_id \
           WHERE r.rn + COALESCE(b.n, 0) <= $5 ORDER BY r.next_attempt_at, r.id LIMIT $4\
         ) \
         UPDATE webhook_deliveries SET lease_owner = $1, lease_until = $3 WHERE id IN (\
           SELECT id FROM webhook_deliveries WHERE id IN (SELECT id FROM chosen) \
             AND state = 'pending' AND (lease_until IS NULL OR lease_until <= $2)",
            $lock,
            ") RETURNING ",
            $crate::store::webhooks::delivery_columns!()
        )
    };
}
pub(crate) use claim_deliveries_sql;

/// Lease up to `limit` due deliveries to `instance`, never more in flight
/// per endpoint than `per_endpoint` (counting every instance's live
/// leases): a slow endpoint holds at most that many, whatever its backlog,
/// and the rest go to other endpoints. PostgreSQL's claimers pass over each
/// other's rows (`SKIP LOCKED`); SQLite's writes are serialised.
pub(crate) async fn claim_webhook_deliveries<C: Db>(
    conn: &mut C,
    instance: &str,
    now: Millis,
    lease_until: Millis,
    limit: i64,
    per_endpoint: i64,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    let rows: Vec<DeliveryRow> = conn
        .fetch_all(
            C::Sql::CLAIM_DELIVERIES,
            args![instance, now, lease_until, limit, per_endpoint],
        )
        .await?;
    let mut claimed = Vec::with_capacity(rows.len());
    let mut endpoints: Vec<WebhookEndpoint> = Vec::new();
    for row in rows {
        let delivery = WebhookDelivery::try_from(row)?;
        let endpoint = match endpoints.iter().find(|e| e.id == delivery.endpoint_id) {
            Some(e) => e.clone(),
            None => match get_webhook_endpoint(conn, &delivery.endpoint_id).await? {
                Some(e) => {
                    endpoints.push(e.clone());
                    e
                }
                // Deleted in the same moment: its deliveries go with it.
                None => continue,
            },
        };
        claimed.push(ClaimedDelivery { delivery, endpoint });
    }
    Ok(claimed)
}

/// Record a try and what follows, while `sender` still holds the lease:
/// false (nothing written) when it does not. A 410 disables the endpoint
/// in the same commit.
pub(crate) async fn record_webhook_try(
    conn: &mut impl Db,
    record: WebhookTryRecord,
) -> Result<bool, StoreError> {
    let (state, next_attempt_at, finished_at) = match record.next {
        DeliveryNext::Delivered => ("delivered", record.at, Some(record.at)),
        DeliveryNext::RetryAt(at) => ("pending", at, None),
        DeliveryNext::Failed | DeliveryNext::Gone => ("failed", record.at, Some(record.at)),
    };
    let tries: Option<(i64,)> = conn
        .fetch_optional(
            "UPDATE webhook_deliveries SET tries = tries + 1, state = $3, next_attempt_at = $4, \
         finished_at = $5, last_status = $6, last_error = $7, body = COALESCE(body, $8), \
         lease_owner = NULL, lease_until = NULL \
         WHERE id = $1 AND lease_owner = $2 AND state = 'pending' RETURNING tries",
            args![
                &record.delivery_id,
                &record.sender,
                state,
                next_attempt_at,
                finished_at,
                record.status,
                &record.error,
                &record.body
            ],
        )
        .await?;
    let Some((n,)) = tries else {
        return Ok(false);
    };
    conn.execute(
        "INSERT INTO webhook_attempts (delivery_id, n, at, sender, status, latency_ms, error) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        args![
            &record.delivery_id,
            n,
            record.at,
            &record.sender,
            record.status,
            record.latency_ms,
            &record.error
        ],
    )
    .await?;
    if record.next == DeliveryNext::Gone {
        conn.execute(
            "UPDATE webhook_endpoints SET enabled = FALSE, \
             disabled_reason = 'the receiver answered 410 Gone', updated_at = $2 WHERE id = $1",
            args![&record.endpoint_id, record.at],
        )
        .await?;
    }
    Ok(true)
}

/// An endpoint's deliveries, newest first.
pub(crate) async fn list_webhook_deliveries(
    conn: &mut impl Db,
    endpoint_id: &str,
    limit: i64,
) -> Result<Vec<WebhookDelivery>, StoreError> {
    let rows: Vec<DeliveryRow> = conn
        .fetch_all(
            concat!(
        "SELECT ",
        delivery_columns!(),
        " FROM webhook_deliveries WHERE endpoint_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
    ),
            args![endpoint_id, limit],
        )
        .await?;
    rows.into_iter().map(WebhookDelivery::try_from).collect()
}

pub(crate) async fn get_webhook_delivery(
    conn: &mut impl Db,
    id: &str,
) -> Result<Option<WebhookDelivery>, StoreError> {
    let row: Option<DeliveryRow> = conn
        .fetch_optional(
            concat!(
                "SELECT ",
                delivery_columns!(),
                " FROM webhook_deliveries WHERE id = $1"
            ),
            args![id],
        )
        .await?;
    row.map(WebhookDelivery::try_from).transpose()
}

/// A delivery's tries, first first.
pub(crate) async fn list_webhook_tries(
    conn: &mut impl Db,
    delivery_id: &str,
) -> Result<Vec<WebhookTry>, StoreError> {
    conn.fetch_all(
        "SELECT delivery_id, n, at, sender, status, latency_ms, error FROM webhook_attempts \
         WHERE delivery_id = $1 ORDER BY n",
        args![delivery_id],
    )
    .await
}

/// Send a delivery again from `at`, with a fresh retry budget and the same
/// `webhook-id` and body; false when it is not found or still pending.
pub(crate) async fn redeliver_webhook(
    conn: &mut impl Db,
    id: &str,
    at: Millis,
) -> Result<bool, StoreError> {
    let done = conn
        .execute(
            "UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = $2, \
         budget_start = tries, finished_at = NULL, lease_owner = NULL, lease_until = NULL \
         WHERE id = $1 AND state <> 'pending'",
            args![id, at],
        )
        .await?;
    Ok(done == 1)
}

pub(crate) async fn webhook_counts(conn: &mut impl Db) -> Result<WebhookCounts, StoreError> {
    let (pending, delivered, failed): (i64, i64, i64) = conn
        .fetch_one(
            "SELECT COUNT(*) FILTER (WHERE state = 'pending'), \
         COUNT(*) FILTER (WHERE state = 'delivered'), \
         COUNT(*) FILTER (WHERE state = 'failed') FROM webhook_deliveries",
            args![],
        )
        .await?;
    Ok(WebhookCounts {
        pending,
        delivered,
        failed,
    })
}
