//! The SQL of every [`Store`](super::Store) query, one file per resource,
//! compiled once per dialect: [`sqlite`] and [`postgres`] each name their
//! connection type (`Conn`) and define the dialect's fragments as macros,
//! then include the same resource files (`jobs.rs`, `attempts.rs`,
//! `events.rs`, `keys.rs`, `switches.rs`, `contract_runs.rs`,
//! `console.rs`). Those two files are the only place the dialects differ;
//! see the table in the [store's docs](super).
//!
//! A backend calls `ops::NAME(connection, arguments…)`, where `ops` is its
//! dialect's module here: every query is re-exported from it under its
//! [`store_methods!`](crate::store_methods) name.

// Both include the same resource files: each is compiled once per dialect,
// on purpose.
#[allow(clippy::duplicate_mod)]
pub(crate) mod postgres;
#[allow(clippy::duplicate_mod)]
pub(crate) mod sqlite;
