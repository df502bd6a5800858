//! onejob: one user click is one job, however many times the network makes
//! the client retry and however many providers the job has to try.
//!
//! - [`config`]: typed configuration (`onejob.toml`, flags, `ONEJOB_*`).
//! - [`contracts`]: contract loading, prompt rendering, output schema and
//!   tokenizer checks, and the contract run that makes a provider eligible.
//! - [`domain`]: pure types and transitions (jobs, attempts, fingerprints, the guard).
//! - [`providers`]: provider adapters, error classification, lookup by key.

pub mod config;
pub mod contracts;
pub mod domain;
pub mod providers;
