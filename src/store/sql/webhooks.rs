//! Signed webhooks: endpoints, the outbox of deliveries (written by the
//! triggers of migration 0010, in the commit that ends a job), claims of
//! due deliveries and the record of each try.

use super::Conn;
use crate::domain::Millis;
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

pub(crate) async fn insert_webhook_endpoint(
    conn: &mut Conn,
    endpoint: WebhookEndpoint,
) -> Result<(), StoreError> {
    sqlx::query(concat!(
        "INSERT INTO webhook_endpoints (",
        endpoint_columns!(),
        ") VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)"
    ))
    .bind(&endpoint.id)
    .bind(&endpoint.owner_id)
    .bind(&endpoint.url)
    .bind(&endpoint.description)
    .bind(&endpoint.events)
    .bind(&endpoint.secret)
    .bind(&endpoint.previous_secret)
    .bind(endpoint.previous_secret_until)
    .bind(endpoint.enabled)
    .bind(&endpoint.disabled_reason)
    .bind(endpoint.created_at)
    .bind(endpoint.updated_at)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

pub(crate) async fn list_webhook_endpoints(
    conn: &mut Conn,
    owner: Option<&str>,
) -> Result<Vec<WebhookEndpoint>, StoreError> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        endpoint_columns!(),
        " FROM webhook_endpoints WHERE ($1 IS NULL OR owner_id = $1) ORDER BY created_at, id"
    ))
    .bind(owner)
    .fetch_all(&mut *conn)
    .await?)
}

pub(crate) async fn get_webhook_endpoint(
    conn: &mut Conn,
    id: &str,
) -> Result<Option<WebhookEndpoint>, StoreError> {
    Ok(sqlx::query_as(concat!(
        "SELECT ",
        endpoint_columns!(),
        " FROM webhook_endpoints WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?)
}

/// The endpoint, its deliveries and their tries go together.
pub(crate) async fn delete_webhook_endpoint(conn: &mut Conn, id: &str) -> Result<bool, StoreError> {
    sqlx::query(
        "DELETE FROM webhook_attempts WHERE delivery_id IN \
         (SELECT id FROM webhook_deliveries WHERE endpoint_id = $1)",
    )
    .bind(id)
    .execute(&mut *conn)
    .await?;
    sqlx::query("DELETE FROM webhook_deliveries WHERE endpoint_id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    let done = sqlx::query("DELETE FROM webhook_endpoints WHERE id = $1")
        .bind(id)
        .execute(&mut *conn)
        .await?;
    Ok(done.rows_affected() == 1)
}

/// The current secret becomes the previous one, signing until
/// `previous_until`; `secret` (sealed) signs from now on.
pub(crate) async fn rotate_webhook_secret(
    conn: &mut Conn,
    id: &str,
    secret: &str,
    previous_until: Millis,
    at: Millis,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE webhook_endpoints SET previous_secret = secret, previous_secret_until = $3, \
         secret = $2, updated_at = $4 WHERE id = $1",
    )
    .bind(id)
    .bind(secret)
    .bind(previous_until)
    .bind(at)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

/// Lease up to `limit` due deliveries to `instance`, never more in flight
/// per endpoint than `per_endpoint` (counting every instance's live
/// leases): a slow endpoint holds at most that many, whatever its backlog,
/// and the rest go to other endpoints. PostgreSQL's claimers pass over each
/// other's rows (`SKIP LOCKED`); SQLite's writes are serialised.
pub(crate) async fn claim_webhook_deliveries(
    conn: &mut Conn,
    instance: &str,
    now: Millis,
    lease_until: Millis,
    limit: i64,
    per_endpoint: i64,
) -> Result<Vec<ClaimedDelivery>, StoreError> {
    // Each CTE is computed once: the tries in flight per endpoint, the due
    // deliveries ranked within their endpoint, the first `limit` whose rank
    // fits under the endpoint's cap; only those rows are then locked.
    let rows: Vec<DeliveryRow> = sqlx::query_as(concat!(
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
        skip_locked!(),
        ") RETURNING ",
        delivery_columns!()
    ))
    .bind(instance)
    .bind(now)
    .bind(lease_until)
    .bind(limit)
    .bind(per_endpoint)
    .fetch_all(&mut *conn)
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
    conn: &mut Conn,
    record: WebhookTryRecord,
) -> Result<bool, StoreError> {
    let (state, next_attempt_at, finished_at) = match record.next {
        DeliveryNext::Delivered => ("delivered", record.at, Some(record.at)),
        DeliveryNext::RetryAt(at) => ("pending", at, None),
        DeliveryNext::Failed | DeliveryNext::Gone => ("failed", record.at, Some(record.at)),
    };
    let tries: Option<(i64,)> = sqlx::query_as(
        "UPDATE webhook_deliveries SET tries = tries + 1, state = $3, next_attempt_at = $4, \
         finished_at = $5, last_status = $6, last_error = $7, body = COALESCE(body, $8), \
         lease_owner = NULL, lease_until = NULL \
         WHERE id = $1 AND lease_owner = $2 AND state = 'pending' RETURNING tries",
    )
    .bind(&record.delivery_id)
    .bind(&record.sender)
    .bind(state)
    .bind(next_attempt_at)
    .bind(finished_at)
    .bind(record.status)
    .bind(&record.error)
    .bind(&record.body)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((n,)) = tries else {
        return Ok(false);
    };
    sqlx::query(
        "INSERT INTO webhook_attempts (delivery_id, n, at, sender, status, latency_ms, error) \
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(&record.delivery_id)
    .bind(n)
    .bind(record.at)
    .bind(&record.sender)
    .bind(record.status)
    .bind(record.latency_ms)
    .bind(&record.error)
    .execute(&mut *conn)
    .await?;
    if record.next == DeliveryNext::Gone {
        sqlx::query(
            "UPDATE webhook_endpoints SET enabled = FALSE, \
             disabled_reason = 'the receiver answered 410 Gone', updated_at = $2 WHERE id = $1",
        )
        .bind(&record.endpoint_id)
        .bind(record.at)
        .execute(&mut *conn)
        .await?;
    }
    Ok(true)
}

/// An endpoint's deliveries, newest first.
pub(crate) async fn list_webhook_deliveries(
    conn: &mut Conn,
    endpoint_id: &str,
    limit: i64,
) -> Result<Vec<WebhookDelivery>, StoreError> {
    let rows: Vec<DeliveryRow> = sqlx::query_as(concat!(
        "SELECT ",
        delivery_columns!(),
        " FROM webhook_deliveries WHERE endpoint_id = $1 ORDER BY created_at DESC, id DESC LIMIT $2"
    ))
    .bind(endpoint_id)
    .bind(limit)
    .fetch_all(&mut *conn)
    .await?;
    rows.into_iter().map(WebhookDelivery::try_from).collect()
}

pub(crate) async fn get_webhook_delivery(
    conn: &mut Conn,
    id: &str,
) -> Result<Option<WebhookDelivery>, StoreError> {
    let row: Option<DeliveryRow> = sqlx::query_as(concat!(
        "SELECT ",
        delivery_columns!(),
        " FROM webhook_deliveries WHERE id = $1"
    ))
    .bind(id)
    .fetch_optional(&mut *conn)
    .await?;
    row.map(WebhookDelivery::try_from).transpose()
}

/// A delivery's tries, first first.
pub(crate) async fn list_webhook_tries(
    conn: &mut Conn,
    delivery_id: &str,
) -> Result<Vec<WebhookTry>, StoreError> {
    Ok(sqlx::query_as(
        "SELECT delivery_id, n, at, sender, status, latency_ms, error FROM webhook_attempts \
         WHERE delivery_id = $1 ORDER BY n",
    )
    .bind(delivery_id)
    .fetch_all(&mut *conn)
    .await?)
}

/// Send a delivery again from `at`, with a fresh retry budget and the same
/// `webhook-id` and body; false when it is not found or still pending.
pub(crate) async fn redeliver_webhook(
    conn: &mut Conn,
    id: &str,
    at: Millis,
) -> Result<bool, StoreError> {
    let done = sqlx::query(
        "UPDATE webhook_deliveries SET state = 'pending', next_attempt_at = $2, \
         budget_start = tries, finished_at = NULL, lease_owner = NULL, lease_until = NULL \
         WHERE id = $1 AND state <> 'pending'",
    )
    .bind(id)
    .bind(at)
    .execute(&mut *conn)
    .await?;
    Ok(done.rows_affected() == 1)
}

pub(crate) async fn webhook_counts(conn: &mut Conn) -> Result<WebhookCounts, StoreError> {
    let (pending, delivered, failed): (i64, i64, i64) = sqlx::query_as(
        "SELECT COUNT(*) FILTER (WHERE state = 'pending'), \
         COUNT(*) FILTER (WHERE state = 'delivered'), \
         COUNT(*) FILTER (WHERE state = 'failed') FROM webhook_deliveries",
    )
    .fetch_one(&mut *conn)
    .await?;
    Ok(WebhookCounts {
        pending,
        delivered,
        failed,
    })
}
