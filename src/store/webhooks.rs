//! The rows of signed webhooks (migration 0010): an owner's endpoints, the
//! outbox of deliveries the database's triggers write in the commit that
//! ends a job, and each try of a delivery. The queries are in
//! `sql/webhooks.rs`; what they mean is in [`crate::webhooks`].

use crate::domain::{AttemptId, Job, JobId, JobState, Millis, OwnerId};
use crate::store::sql::db::{Columns, Row};
use crate::store::StoreError;
use async_trait::async_trait;
use serde::Serialize;

/// One endpoint an owner registered. `secret` and `previous_secret` are
/// sealed (encrypted at rest, see `webhooks::secrets`), never plain text.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookEndpoint {
    pub id: String,
    pub owner_id: OwnerId,
    pub url: String,
    pub description: String,
    /// The subscribed types as stored: `" job.succeeded job.failed "`.
    pub events: String,
    pub secret: String,
    pub previous_secret: Option<String>,
    pub previous_secret_until: Option<Millis>,
    pub enabled: bool,
    pub disabled_reason: Option<String>,
    pub created_at: Millis,
    pub updated_at: Millis,
}

impl Row for WebhookEndpoint {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(WebhookEndpoint {
            id: row.get("id")?,
            owner_id: row.get::<String>("owner_id")?.into(),
            url: row.get("url")?,
            description: row.get("description")?,
            events: row.get("events")?,
            secret: row.get("secret")?,
            previous_secret: row.get("previous_secret")?,
            previous_secret_until: row.get("previous_secret_until")?,
            enabled: row.get("enabled")?,
            disabled_reason: row.get("disabled_reason")?,
            created_at: row.get("created_at")?,
            updated_at: row.get("updated_at")?,
        })
    }
}

impl WebhookEndpoint {
    /// The subscribed event types, in stored order.
    pub fn event_types(&self) -> Vec<String> {
        self.events.split_whitespace().map(str::to_string).collect()
    }

    /// The stored form of a list of event types (see the migration).
    pub fn events_column(types: &[String]) -> String {
        let mut column = String::from(" ");
        for t in types {
            column.push_str(t);
            column.push(' ');
        }
        column
    }
}

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    Pending,
    Delivered,
    Failed,
}

impl DeliveryState {
    pub fn as_str(self) -> &'static str {
        match self {
            DeliveryState::Pending => "pending",
            DeliveryState::Delivered => "delivered",
            DeliveryState::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        match s {
            "pending" => Ok(DeliveryState::Pending),
            "delivered" => Ok(DeliveryState::Delivered),
            "failed" => Ok(DeliveryState::Failed),
            other => Err(StoreError::Corrupt(format!("delivery state {other:?}"))),
        }
    }
}

/// One event for one endpoint, as the outbox holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookDelivery {
    /// The `webhook-id`: the same on every try.
    pub id: String,
    pub endpoint_id: String,
    pub owner_id: OwnerId,
    pub event_type: String,
    pub job_id: JobId,
    /// For `attempt.unknown`: the attempt.
    pub attempt_id: Option<AttemptId>,
    pub event_at: Millis,
    /// The job as the event's commit left it.
    pub job: Job,
    /// The body of the first try, once there was one.
    pub body: Option<String>,
    pub state: DeliveryState,
    pub tries: i64,
    /// `tries` when the current retry budget began.
    pub budget_start: i64,
    pub next_attempt_at: Millis,
    pub lease_owner: Option<String>,
    pub lease_until: Option<Millis>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    pub finished_at: Option<Millis>,
    pub created_at: Millis,
}

/// The column list of [`DeliveryRow`], as a literal for `concat!`.
macro_rules! delivery_columns {
    () => {
        "id, endpoint_id, owner_id, event_type, job_id, attempt_id, event_at, job_state, \
         job_version, job_route, job_key, job_result, job_completed_by, job_last_error, \
         job_attempt_count, job_next_run_at, job_created_at, job_updated_at, body, state, tries, \
         budget_start, next_attempt_at, lease_owner, lease_until, last_status, last_error, \
         finished_at, created_at"
    };
}
pub(crate) use delivery_columns;

#[derive(Debug)]
pub(crate) struct DeliveryRow {
    id: String,
    endpoint_id: String,
    owner_id: String,
    event_type: String,
    job_id: String,
    attempt_id: Option<String>,
    event_at: i64,
    job_state: String,
    job_version: i64,
    job_route: String,
    job_key: String,
    job_result: Option<String>,
    job_completed_by: Option<String>,
    job_last_error: Option<String>,
    job_attempt_count: i64,
    job_next_run_at: Option<i64>,
    job_created_at: i64,
    job_updated_at: i64,
    body: Option<String>,
    state: String,
    tries: i64,
    budget_start: i64,
    next_attempt_at: i64,
    lease_owner: Option<String>,
    lease_until: Option<i64>,
    last_status: Option<i64>,
    last_error: Option<String>,
    finished_at: Option<i64>,
    created_at: i64,
}

impl Row for DeliveryRow {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(DeliveryRow {
            id: row.get("id")?,
            endpoint_id: row.get("endpoint_id")?,
            owner_id: row.get("owner_id")?,
            event_type: row.get("event_type")?,
            job_id: row.get("job_id")?,
            attempt_id: row.get("attempt_id")?,
            event_at: row.get("event_at")?,
            job_state: row.get("job_state")?,
            job_version: row.get("job_version")?,
            job_route: row.get("job_route")?,
            job_key: row.get("job_key")?,
            job_result: row.get("job_result")?,
            job_completed_by: row.get("job_completed_by")?,
            job_last_error: row.get("job_last_error")?,
            job_attempt_count: row.get("job_attempt_count")?,
            job_next_run_at: row.get("job_next_run_at")?,
            job_created_at: row.get("job_created_at")?,
            job_updated_at: row.get("job_updated_at")?,
            body: row.get("body")?,
            state: row.get("state")?,
            tries: row.get("tries")?,
            budget_start: row.get("budget_start")?,
            next_attempt_at: row.get("next_attempt_at")?,
            lease_owner: row.get("lease_owner")?,
            lease_until: row.get("lease_until")?,
            last_status: row.get("last_status")?,
            last_error: row.get("last_error")?,
            finished_at: row.get("finished_at")?,
            created_at: row.get("created_at")?,
        })
    }
}

impl TryFrom<DeliveryRow> for WebhookDelivery {
    type Error = StoreError;
    fn try_from(r: DeliveryRow) -> Result<Self, StoreError> {
        let state: JobState = crate::store::parse_job_state(&r.job_state)?;
        Ok(WebhookDelivery {
            job: Job {
                id: r.job_id.as_str().into(),
                owner_id: r.owner_id.as_str().into(),
                idempotency_key: r.job_key,
                // Not part of what the API shows of a job.
                fingerprint: String::new(),
                request: String::new(),
                route: r.job_route,
                state,
                version: r.job_version,
                result: r.job_result,
                completed_by: r.job_completed_by,
                last_error: r.job_last_error,
                attempt_count: r.job_attempt_count,
                created_at: r.job_created_at,
                updated_at: r.job_updated_at,
                next_run_at: r.job_next_run_at,
                lease_owner: None,
                lease_until: None,
                budget_start: 0,
            },
            id: r.id,
            endpoint_id: r.endpoint_id,
            owner_id: r.owner_id.into(),
            event_type: r.event_type,
            job_id: r.job_id.into(),
            attempt_id: r.attempt_id.map(AttemptId::from),
            event_at: r.event_at,
            body: r.body,
            state: DeliveryState::parse(&r.state)?,
            tries: r.tries,
            budget_start: r.budget_start,
            next_attempt_at: r.next_attempt_at,
            lease_owner: r.lease_owner,
            lease_until: r.lease_until,
            last_status: r.last_status,
            last_error: r.last_error,
            finished_at: r.finished_at,
            created_at: r.created_at,
        })
    }
}

/// A delivery claimed for sending, with what its endpoint signs with.
#[derive(Debug, Clone, PartialEq)]
pub struct ClaimedDelivery {
    pub delivery: WebhookDelivery,
    pub endpoint: WebhookEndpoint,
}

/// One try of a delivery.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WebhookTry {
    pub delivery_id: String,
    pub n: i64,
    pub at: Millis,
    /// The instance that sent it.
    pub sender: String,
    /// The HTTP status the receiver answered; `None` when none arrived.
    pub status: Option<i64>,
    pub latency_ms: i64,
    pub error: Option<String>,
}

impl Row for WebhookTry {
    fn decode(row: &impl Columns) -> Result<Self, StoreError> {
        Ok(WebhookTry {
            delivery_id: row.get("delivery_id")?,
            n: row.get("n")?,
            at: row.get("at")?,
            sender: row.get("sender")?,
            status: row.get("status")?,
            latency_ms: row.get("latency_ms")?,
            error: row.get("error")?,
        })
    }
}

/// What a try leads to.
#[derive(Debug, Clone, PartialEq)]
pub enum DeliveryNext {
    /// A 2xx: done.
    Delivered,
    /// Try again at this time.
    RetryAt(Millis),
    /// The retry budget is spent: `failed`, shown.
    Failed,
    /// 410 Gone: `failed`, and the endpoint is disabled.
    Gone,
}

/// The record of one try, written while the sender still holds the lease.
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookTryRecord {
    pub delivery_id: String,
    pub endpoint_id: String,
    /// The lease holder (the instance) that sent it.
    pub sender: String,
    pub at: Millis,
    pub status: Option<i64>,
    pub latency_ms: i64,
    pub error: Option<String>,
    /// The bytes sent: kept on the first try, so every retry sends them again.
    pub body: String,
    pub next: DeliveryNext,
}

/// The outbox by state, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WebhookCounts {
    pub pending: i64,
    pub delivered: i64,
    pub failed: i64,
}

#[async_trait]
pub trait WebhookStore: Send + Sync {
    async fn insert_webhook_endpoint(&self, endpoint: WebhookEndpoint) -> Result<(), StoreError>;

    /// Endpoints of `owner`, or of everyone, oldest first.
    async fn list_webhook_endpoints(
        &self,
        owner: Option<&OwnerId>,
    ) -> Result<Vec<WebhookEndpoint>, StoreError>;

    async fn get_webhook_endpoint(&self, id: &str) -> Result<Option<WebhookEndpoint>, StoreError>;

    /// The endpoint with its deliveries and their tries; false when not found.
    async fn delete_webhook_endpoint(&self, id: &str) -> Result<bool, StoreError>;

    /// The current secret signs on until `previous_until`, beside the new one.
    async fn rotate_webhook_secret(
        &self,
        id: &str,
        secret: &str,
        previous_until: Millis,
        at: Millis,
    ) -> Result<bool, StoreError>;

    /// Lease due deliveries to `instance` (`FOR UPDATE SKIP LOCKED` on
    /// PostgreSQL), at most `per_endpoint` in flight per endpoint.
    async fn claim_webhook_deliveries(
        &self,
        instance: &str,
        now: Millis,
        lease_until: Millis,
        limit: i64,
        per_endpoint: i64,
    ) -> Result<Vec<ClaimedDelivery>, StoreError>;

    /// Record a try while its sender holds the lease; false when it does not.
    async fn record_webhook_try(&self, record: WebhookTryRecord) -> Result<bool, StoreError>;

    /// An endpoint's deliveries, newest first.
    async fn list_webhook_deliveries(
        &self,
        endpoint_id: &str,
        limit: i64,
    ) -> Result<Vec<WebhookDelivery>, StoreError>;

    async fn get_webhook_delivery(&self, id: &str) -> Result<Option<WebhookDelivery>, StoreError>;

    /// A delivery's tries, in order.
    async fn list_webhook_tries(&self, delivery_id: &str) -> Result<Vec<WebhookTry>, StoreError>;

    /// Send a finished delivery again (same id and body, fresh budget).
    async fn redeliver_webhook(&self, id: &str, at: Millis) -> Result<bool, StoreError>;

    /// The outbox by state, for `/metrics`.
    async fn webhook_counts(&self) -> Result<WebhookCounts, StoreError>;
}
