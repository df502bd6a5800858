//! onejob: one user click is one job, however many times the network makes
//! the client retry and however many providers the job has to try.
//!
//! - [`app`]: start-up as an object (`Application::build`, `run_until_stopped`).
//! - [`config`]: typed configuration (`onejob.toml`, flags, `ONEJOB_*`).
//! - [`contracts`]: contract loading, prompt rendering, output schema and
//!   tokenizer checks, and the contract run that makes a provider eligible.
//! - [`domain`]: pure types and transitions (jobs, attempts, fingerprints, the guard).
//! - [`engine`]: runs jobs: hedging, timeouts as unknown, retries, reconciliation, review.
//! - [`metrics`]: counters for `/metrics`.
//! - [`jobs`]: accepting and reading jobs (idempotent create, replay, conflict).
//! - [`replays`]: replays of finished jobs answered from memory; their audit, batched.
//! - [`keys`]: API keys, stored hashed; who the caller is.
//! - [`http`]: the axum API: handlers, auth extractor, the error shape.
//! - [`providers`]: provider adapters, error classification, lookup by key.
//! - [`tenants`]: keys cached on the hot path, limits per owner, usage.
//! - [`store`]: durable jobs, attempts, keys and events on SQLite or PostgreSQL.
//! - [`clock`]: injected time.
//! - [`telemetry`]: log format, OpenTelemetry trace export, `traceparent`.
//! - [`cli`]: what the `onejob` commands do.
//! - [`demo`]: `onejob demo`, the scenarios played against a throwaway server.
//! - [`sim`]: the simulated provider server (fault injection, execution ledger).
//! - [`webhooks`]: signed webhooks when a job ends: endpoints, the outbox's
//!   delivery, signing, secrets at rest, SSRF guards.

pub mod app;
pub mod cli;
pub mod clock;
pub mod config;
pub mod contracts;
pub mod demo;
pub mod domain;
pub mod engine;
pub mod http;
pub mod jobs;
pub mod keys;
pub mod metrics;
pub mod providers;
pub mod replays;
pub mod sim;
pub mod store;
pub mod telemetry;
pub mod tenants;
pub mod views;
pub mod webhooks;
