//! Hedging shares: what one instance has learned about a route's providers
//! and its hedge window, written for the other instances (`engine::hedging`
//! reads and writes them). The type; its SQL is in `sql/hedging.rs`.

use crate::domain::Millis;
use crate::store::sql::db::{Columns, Row};
use crate::store::StoreError;
use async_trait::async_trait;

/// One instance's share of one route, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct HedgingShare {
    pub instance: String,
    pub route: String,
    pub written_at: Millis,
    /// JSON of `engine::hedging::ShareBody`.
    pub body: String,
}

impl Row for HedgingShare {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(HedgingShare {
            instance: row.get("instance")?,
            route: row.get("route")?,
            written_at: row.get("written_at")?,
            body: row.get("body")?,
        })
    }
}

#[async_trait]
pub trait HedgingStore: Send + Sync {
    /// Upsert this instance's shares; delete those written before `forget_before`.
    async fn put_hedging_shares(
        &self,
        shares: Vec<HedgingShare>,
        forget_before: Millis,
    ) -> Result<(), StoreError>;

    /// Every share written at or after `since`.
    async fn hedging_shares(&self, since: Millis) -> Result<Vec<HedgingShare>, StoreError>;
}
