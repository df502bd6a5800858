//! onejob: one user click is one job, however many times the network makes
//! the client retry and however many providers the job has to try.
//!
//! - [`config`]: typed configuration (`onejob.toml`, flags, `ONEJOB_*`).
//! - [`domain`]: pure types and transitions (jobs, attempts, fingerprints, the guard).
//! - [`providers`]: provider adapters, error classification, lookup by key.
//! - [`sim`]: the simulated provider server (fault injection, execution ledger).

pub mod config;
pub mod domain;
pub mod providers;
pub mod sim;
