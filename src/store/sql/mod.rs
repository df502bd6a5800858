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

/// The resource files, declared (and their queries re-exported) by each
/// dialect's module after it has defined its `Conn` and fragments.
macro_rules! resource_modules {
    () => {
        #[path = "attempts.rs"]
        pub(crate) mod attempts;
        #[path = "console.rs"]
        pub(crate) mod console;
        #[path = "contract_runs.rs"]
        pub(crate) mod contract_runs;
        #[path = "events.rs"]
        pub(crate) mod events;
        #[path = "jobs.rs"]
        pub(crate) mod jobs;
        #[path = "keys.rs"]
        pub(crate) mod keys;
        #[path = "switches.rs"]
        pub(crate) mod switches;

        pub(crate) use self::{
            attempts::*, console::*, contract_runs::*, events::*, jobs::*, keys::*, switches::*,
        };
    };
}

pub(crate) mod db;

// Both include the same resource files: each is compiled once per dialect,
// on purpose.
#[allow(clippy::duplicate_mod)]
pub(crate) mod postgres;
#[allow(clippy::duplicate_mod)]
pub(crate) mod sqlite;
