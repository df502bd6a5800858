//! Signed webhooks: when a job ends, its owner's endpoints get a POST
//! signed as Standard Webhooks asks (`webhook-id`, `webhook-timestamp`,
//! `webhook-signature`).
//!
//! - The outbox row is written by the database itself (the triggers of
//!   migration 0010), in the commit that ends the job: no code path that
//!   ends a job can forget it, and a crash cannot lose it.
//! - [`delivery`]: any instance claims due deliveries (a lease; `SKIP
//!   LOCKED` on PostgreSQL) and sends them, at least once, with the same
//!   `webhook-id` and body bytes on every try, backing off with jitter up to
//!   `max_attempts`; at most `concurrency_per_endpoint` tries of one
//!   endpoint are in flight, so a slow endpoint never holds up another's.
//! - [`endpoints`]: what an owner (or the admin) may do: create, list,
//!   delete, rotate the secret, see deliveries, redeliver.
//! - [`signing`]: the secret (`whsec_…`) and the signature.
//! - [`secrets`]: secrets are encrypted at rest with a key from the
//!   environment; they are never logged.
//! - [`ssrf`]: which URLs may be called, checked again at connect time.

pub mod delivery;
pub mod endpoints;
pub mod secrets;
pub mod signing;
pub mod ssrf;
pub mod views;

use crate::clock::rfc3339;
use crate::store::webhooks::WebhookDelivery;
use crate::views::JobView;
use serde::Deserialize;

/// Every event type an endpoint may subscribe to.
pub const EVENT_TYPES: &[&str] = &[
    "job.succeeded",
    "job.failed",
    "job.needs_review",
    "job.cancelled",
    "attempt.unknown",
];

/// The endpoint subscribes to these when it names none: every job end.
pub const DEFAULT_EVENT_TYPES: &[&str] = &[
    "job.succeeded",
    "job.failed",
    "job.needs_review",
    "job.cancelled",
];

/// `[webhooks]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WebhooksConfig {
    /// Deliver from this process (false: others on the same database do).
    pub enabled: bool,
    /// Permit private, loopback and link-local receivers, and plain http.
    pub allow_private_networks: bool,
    /// One try's limit, connect to last byte of the answer.
    pub timeout_ms: u64,
    /// Backoff between tries: exponential from this, with jitter...
    pub retry_base_ms: u64,
    /// ...never above this.
    pub retry_cap_ms: u64,
    /// Tries of one delivery before it is marked failed.
    pub max_attempts: u32,
    /// Tries in flight to one endpoint at once, over every instance.
    pub concurrency_per_endpoint: u32,
    /// Tries in flight from this process at once.
    pub max_in_flight: usize,
    /// How often this process looks for due deliveries.
    pub poll_interval_ms: u64,
    /// After a rotation, the old secret signs too for this long.
    pub rotation_grace_ms: u64,
    /// The environment variable that holds the key secrets are encrypted
    /// with (base64 of 32 bytes; `onejob webhooks keygen` makes one).
    pub secret_key_env: String,
}

impl Default for WebhooksConfig {
    fn default() -> Self {
        WebhooksConfig {
            enabled: true,
            allow_private_networks: false,
            timeout_ms: 10_000,
            retry_base_ms: 5_000,
            retry_cap_ms: 3_600_000,
            max_attempts: 12,
            concurrency_per_endpoint: 4,
            max_in_flight: 256,
            poll_interval_ms: 500,
            rotation_grace_ms: 86_400_000,
            secret_key_env: "ONEJOB_WEBHOOK_KEY".to_string(),
        }
    }
}

impl WebhooksConfig {
    pub fn check(&self) -> Result<(), String> {
        if self.timeout_ms == 0 || self.retry_base_ms == 0 || self.poll_interval_ms == 0 {
            return Err(
                "webhooks: timeout_ms, retry_base_ms and poll_interval_ms must be at least 1"
                    .to_string(),
            );
        }
        if self.retry_cap_ms < self.retry_base_ms {
            return Err("webhooks: retry_cap_ms must be at least retry_base_ms".to_string());
        }
        if self.max_attempts == 0 || self.concurrency_per_endpoint == 0 || self.max_in_flight == 0 {
            return Err(
                "webhooks: max_attempts, concurrency_per_endpoint and max_in_flight must be at least 1"
                    .to_string(),
            );
        }
        if self.secret_key_env.is_empty() {
            return Err("webhooks: secret_key_env must name a variable".to_string());
        }
        Ok(())
    }
}

/// The body of a delivery: `{"type", "timestamp", "data"}`, `data` the job
/// as `GET /v1/jobs/{id}` shows it at the event's commit (with
/// `attempt_id` for `attempt.unknown`). A pure function of the stored row;
/// the first try's bytes are stored besides, and every retry sends those.
pub fn render_body(delivery: &WebhookDelivery) -> String {
    let mut data = match serde_json::to_value(JobView::new(delivery.job.clone())) {
        Ok(v) => v,
        // A view of strings, numbers and stored JSON always serialises.
        Err(_) => serde_json::Value::Null,
    };
    if let (Some(attempt), Some(map)) = (&delivery.attempt_id, data.as_object_mut()) {
        map.insert(
            "attempt_id".to_string(),
            serde_json::Value::String(attempt.to_string()),
        );
    }
    serde_json::json!({
        "type": delivery.event_type,
        "timestamp": rfc3339(delivery.event_at),
        "data": data,
    })
    .to_string()
}
