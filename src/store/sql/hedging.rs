//! Hedging shares (migration 0011); the type is in `store::hedging`.

use super::Conn;
use crate::domain::Millis;
use crate::store::hedging::HedgingShare;
use crate::store::StoreError;

/// Write this instance's shares (one per route), and delete every share
/// written before `forget_before`.
pub(crate) async fn put_hedging_shares(
    conn: &mut Conn,
    shares: Vec<HedgingShare>,
    forget_before: Millis,
) -> Result<(), StoreError> {
    for share in &shares {
        sqlx::query(
            "INSERT INTO hedging_shares (instance, route, written_at, body) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (instance, route) DO UPDATE SET written_at = excluded.written_at, \
             body = excluded.body",
        )
        .bind(&share.instance)
        .bind(&share.route)
        .bind(share.written_at)
        .bind(&share.body)
        .execute(&mut *conn)
        .await?;
    }
    sqlx::query("DELETE FROM hedging_shares WHERE written_at < $1")
        .bind(forget_before)
        .execute(&mut *conn)
        .await?;
    Ok(())
}

/// Every share written at or after `since`, by route then instance.
pub(crate) async fn hedging_shares(
    conn: &mut Conn,
    since: Millis,
) -> Result<Vec<HedgingShare>, StoreError> {
    let rows: Vec<HedgingShare> = sqlx::query_as(
        "SELECT instance, route, written_at, body FROM hedging_shares WHERE written_at >= $1 \
         ORDER BY route, instance",
    )
    .bind(since)
    .fetch_all(&mut *conn)
    .await?;
    Ok(rows)
}
