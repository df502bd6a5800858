//! What the API, the CLI and the console show of endpoints and
//! deliveries: never a sealed secret; the plain secret only in the answer
//! to a create or a rotation.

use crate::clock::rfc3339;
use crate::domain::{AttemptId, JobId, Millis, OwnerId};
use crate::store::webhooks::{DeliveryState, WebhookDelivery, WebhookEndpoint, WebhookTry};
use serde::Serialize;

#[derive(Debug, Serialize)]
pub struct EndpointView {
    pub id: String,
    pub owner: OwnerId,
    pub url: String,
    pub description: String,
    pub events: Vec<String>,
    pub enabled: bool,
    /// Why it was disabled (a 410 from the receiver).
    pub disabled_reason: Option<String>,
    /// While a rotation's grace period runs: until when the old secret signs too.
    pub previous_secret_until: Option<String>,
    pub created_at: String,
    pub updated_at: String,
}

impl EndpointView {
    pub fn new(e: &WebhookEndpoint, now: Millis) -> Self {
        EndpointView {
            id: e.id.clone(),
            owner: e.owner_id.clone(),
            url: e.url.clone(),
            description: e.description.clone(),
            events: e.event_types(),
            enabled: e.enabled,
            disabled_reason: e.disabled_reason.clone(),
            previous_secret_until: e
                .previous_secret_until
                .filter(|&until| until > now)
                .map(rfc3339),
            created_at: rfc3339(e.created_at),
            updated_at: rfc3339(e.updated_at),
        }
    }
}

/// The answer to a create or a rotation: the endpoint and its new secret,
/// shown this once.
#[derive(Debug, Serialize)]
pub struct EndpointWithSecret {
    #[serde(flatten)]
    pub endpoint: EndpointView,
    pub secret: String,
}

#[derive(Debug, Serialize)]
pub struct TryView {
    pub n: i64,
    pub at: String,
    /// The receiver's HTTP status; absent when none came.
    pub status: Option<i64>,
    pub latency_ms: i64,
    pub error: Option<String>,
}

impl From<&WebhookTry> for TryView {
    fn from(t: &WebhookTry) -> Self {
        TryView {
            n: t.n,
            at: rfc3339(t.at),
            status: t.status,
            latency_ms: t.latency_ms,
            error: t.error.clone(),
        }
    }
}

#[derive(Debug, Serialize)]
pub struct DeliveryView {
    /// The `webhook-id` of every try.
    pub id: String,
    pub endpoint_id: String,
    #[serde(rename = "type")]
    pub event_type: String,
    pub job_id: JobId,
    pub attempt_id: Option<AttemptId>,
    pub state: DeliveryState,
    pub tries: i64,
    /// When the next try is due, while pending.
    pub next_attempt_at: Option<String>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub created_at: String,
    pub finished_at: Option<String>,
    pub attempts: Vec<TryView>,
}

impl DeliveryView {
    pub fn new(d: &WebhookDelivery, tries: &[WebhookTry]) -> Self {
        DeliveryView {
            id: d.id.clone(),
            endpoint_id: d.endpoint_id.clone(),
            event_type: d.event_type.clone(),
            job_id: d.job_id.clone(),
            attempt_id: d.attempt_id.clone(),
            state: d.state,
            tries: d.tries,
            next_attempt_at: (d.state == DeliveryState::Pending)
                .then(|| rfc3339(d.next_attempt_at)),
            last_status: d.last_status,
            last_error: d.last_error.clone(),
            created_at: rfc3339(d.created_at),
            finished_at: d.finished_at.map(rfc3339),
            attempts: tries.iter().map(TryView::from).collect(),
        }
    }
}
