//! Hedging shares (migration 0011); the type is in `store::hedging`.

use crate::domain::Millis;
use crate::store::hedging::HedgingShare;
use crate::store::sql::db::{args, Db};
use crate::store::StoreError;

/// Write this instance's shares (one per route), and delete every share
/// written before `forget_before`.
pub(crate) async fn put_hedging_shares(
    conn: &mut impl Db,
    shares: Vec<HedgingShare>,
    forget_before: Millis,
) -> Result<(), StoreError> {
    for share in &shares {
        conn.execute(
            "INSERT INTO hedging_shares (instance, route, written_at, body) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (instance, route) DO UPDATE SET written_at = excluded.written_at, \
             body = excluded.body",
            args![&share.instance, &share.route, share.written_at, &share.body],
        )
        .await?;
    }
    conn.execute(
        "DELETE FROM hedging_shares WHERE written_at < $1",
        args![forget_before],
    )
    .await?;
    Ok(())
}

/// Every share written at or after `since`, by route then instance.
pub(crate) async fn hedging_shares(
    conn: &mut impl Db,
    since: Millis,
) -> Result<Vec<HedgingShare>, StoreError> {
    let rows: Vec<HedgingShare> = conn
        .fetch_all(
            "SELECT instance, route, written_at, body FROM hedging_shares WHERE written_at >= $1 \
         ORDER BY route, instance",
            args![since],
        )
        .await?;
    Ok(rows)
}
