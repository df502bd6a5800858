//! Hedging shares: what one instance has learned about a route's providers
//! and its hedge window, written for the other instances (`engine::hedging`
//! reads and writes them). The type; its SQL is in `sql/hedging.rs`.

use crate::domain::Millis;

/// One instance's share of one route, as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct HedgingShare {
    pub instance: String,
    pub route: String,
    pub written_at: Millis,
    /// JSON of `engine::hedging::ShareBody`.
    pub body: String,
}
