//! Sending the outbox: any instance claims due deliveries with a lease
//! (`SKIP LOCKED` on PostgreSQL, the one writer on SQLite), sends each
//! signed, and records the try while it still holds the lease.
//!
//! - At least once: a try is recorded after it is sent; a crash between
//!   the two leaves the lease to expire and the delivery is sent again,
//!   with the same `webhook-id` and the same body bytes.
//! - One try of a delivery in flight at a time: the lease outlasts a try's
//!   bounded time (`timeout_ms`), so no other instance claims it meanwhile,
//!   and a sender whose lease was lost anyway records nothing.
//! - A slow endpoint holds at most `concurrency_per_endpoint` tries (the
//!   claim counts every instance's leases), and each try ends within
//!   `timeout_ms`: the other endpoints' deliveries never wait behind it.

use super::secrets::SecretKey;
use super::ssrf::{check_url, GuardedResolver};
use super::{render_body, signing, WebhooksConfig};
use crate::clock::Clock;
use crate::domain::Millis;
use crate::metrics::Metrics;
use crate::store::webhooks::{ClaimedDelivery, DeliveryNext, WebhookTryRecord};
use crate::store::{Store, StoreError};
use rand::Rng;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{watch, Notify, Semaphore};
use tokio::task::JoinHandle;

/// A lease outlasts a try by this much: time to record it.
const LEASE_MARGIN_MS: u64 = 10_000;

/// Tries of recording a try when the store blips, before the lease is left
/// to expire (and the delivery sent again).
const RECORD_TRIES: u32 = 3;

/// The delay before try `n + 1` after `n` failed tries of the current
/// budget (`n` ≥ 1): exponential from `base`, capped, with "equal jitter":
/// at least half the exponential step, so the gaps grow try after try,
/// and at most all of it.
pub fn backoff_ms(config: &WebhooksConfig, n: i64, rng: &mut impl Rng) -> u64 {
    let exp = n.saturating_sub(1).clamp(0, 40) as u32;
    let step = config
        .retry_base_ms
        .saturating_mul(1u64 << exp.min(40))
        .min(config.retry_cap_ms);
    let half = step / 2;
    half + rng.gen_range(0..=step - half)
}

/// The sender of one process.
pub struct Deliverer {
    config: WebhooksConfig,
    key: Option<SecretKey>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    metrics: Arc<Metrics>,
    client: reqwest::Client,
    /// Who holds the leases this process takes.
    instance: String,
    in_flight: Arc<Semaphore>,
    /// Woken when a try ends (room for another) or on [`Deliverer::wake`].
    kick: Arc<Notify>,
}

#[derive(Debug, thiserror::Error)]
#[error("cannot build the webhook HTTP client: {0}")]
pub struct ClientError(#[from] reqwest::Error);

impl Deliverer {
    pub fn new(
        config: WebhooksConfig,
        key: Option<SecretKey>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, ClientError> {
        let client = reqwest::Client::builder()
            // A receiver's redirect is not followed: it could point anywhere.
            .redirect(reqwest::redirect::Policy::none())
            .timeout(Duration::from_millis(config.timeout_ms))
            .connect_timeout(Duration::from_millis(config.timeout_ms))
            // A proxy from the environment would connect on our behalf, past
            // the resolver's check.
            .no_proxy()
            .dns_resolver(Arc::new(GuardedResolver {
                allow_private: config.allow_private_networks,
            }))
            .user_agent(concat!("onejob-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Arc::new(Deliverer {
            in_flight: Arc::new(Semaphore::new(config.max_in_flight)),
            instance: format!("webhooks-{}", crate::domain::new_id()),
            config,
            key,
            store,
            clock,
            metrics,
            client,
            kick: Arc::new(Notify::new()),
        }))
    }

    /// The lease holder name of this process's claims.
    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Look for due deliveries now.
    pub fn wake(&self) {
        self.kick.notify_one();
    }

    /// Claim and send until `stopped`; tries in flight then finish (each is
    /// bounded by `timeout_ms`) or are left to their lease.
    ///
    /// Without a key a server claims nothing: it could not sign, and every
    /// try it claimed would be spent and failed for good, where a server
    /// sharing the database with the key would have sent it. It says so
    /// once and returns.
    pub async fn run(self: Arc<Self>, mut stopped: watch::Receiver<bool>) {
        if self.key.is_none() {
            tracing::warn!(
                variable = %self.config.secret_key_env,
                "webhooks are enabled but no webhook key is set: this server sends no deliveries (they wait for a server with the key)"
            );
            return;
        }
        let poll = Duration::from_millis(self.config.poll_interval_ms);
        loop {
            if *stopped.borrow() {
                return;
            }
            if let Err(e) = self.clone().claim_and_send().await {
                tracing::warn!(error = %e, "cannot claim webhook deliveries; trying again");
            }
            tokio::select! {
                _ = stopped.changed() => {}
                _ = self.kick.notified() => {}
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }

    /// Claim what is due now (as much as there is room for) and send each
    /// claimed delivery on its own task; the tasks, to await when wanted.
    pub async fn claim_and_send(self: Arc<Self>) -> Result<Vec<JoinHandle<()>>, StoreError> {
        let room = self.in_flight.available_permits();
        if room == 0 {
            return Ok(Vec::new());
        }
        let now = self.clock.now_ms();
        let lease_until = now + (self.config.timeout_ms + LEASE_MARGIN_MS) as Millis;
        let claimed = self
            .store
            .claim_webhook_deliveries(
                &self.instance,
                now,
                lease_until,
                room as i64,
                i64::from(self.config.concurrency_per_endpoint),
            )
            .await?;
        let mut tasks = Vec::with_capacity(claimed.len());
        for claim in claimed {
            let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
                // Not sent: its lease expires and it is claimed again.
                break;
            };
            let this = self.clone();
            tasks.push(tokio::spawn(async move {
                this.send(claim).await;
                drop(permit);
                this.kick.notify_one();
            }));
        }
        Ok(tasks)
    }

    /// Claim everything due now and wait until each claimed try is recorded
    /// (tests and tools drive delivery step by step with this); how many
    /// were sent.
    pub async fn deliver_due(self: &Arc<Self>) -> Result<usize, StoreError> {
        let tasks = self.clone().claim_and_send().await?;
        let n = tasks.len();
        for task in tasks {
            let _ = task.await;
        }
        Ok(n)
    }

    #[tracing::instrument(skip_all, fields(webhook_id = %claim.delivery.id, endpoint_id = %claim.endpoint.id, job_id = %claim.delivery.job_id))]
    async fn send(&self, claim: ClaimedDelivery) {
        let ClaimedDelivery { delivery, endpoint } = claim;
        let body = delivery
            .body
            .clone()
            .unwrap_or_else(|| render_body(&delivery));
        let started = Instant::now();
        let at = self.clock.now_ms();
        let answer = self.post(&delivery.id, &endpoint, &body, at).await;
        let latency_ms = started.elapsed().as_millis() as i64;
        let tries_in_budget = delivery.tries - delivery.budget_start + 1;
        let (status, error) = match &answer {
            Ok(status) => (Some(i64::from(*status)), None),
            Err(e) => (None, Some(e.clone())),
        };
        let next = match answer {
            Ok(status) if (200..300).contains(&status) => DeliveryNext::Delivered,
            Ok(410) => DeliveryNext::Gone,
            _ if tries_in_budget >= i64::from(self.config.max_attempts) => DeliveryNext::Failed,
            _ => {
                let delay = backoff_ms(&self.config, tries_in_budget, &mut rand::thread_rng());
                DeliveryNext::RetryAt(at + delay as Millis)
            }
        };
        match &next {
            DeliveryNext::Delivered => {
                self.metrics.webhook_delivered(latency_ms);
            }
            DeliveryNext::Failed | DeliveryNext::Gone => {
                self.metrics.webhook_failed(latency_ms);
                tracing::warn!(
                    status,
                    error = error.as_deref().unwrap_or(""),
                    tries = tries_in_budget,
                    "webhook delivery failed for good"
                );
            }
            DeliveryNext::RetryAt(_) => {
                self.metrics.webhook_retried(latency_ms);
                tracing::info!(
                    status,
                    error = error.as_deref().unwrap_or(""),
                    tries = tries_in_budget,
                    "webhook try failed; retrying later"
                );
            }
        }
        let record = WebhookTryRecord {
            delivery_id: delivery.id.clone(),
            endpoint_id: endpoint.id.clone(),
            sender: self.instance.clone(),
            at,
            status,
            latency_ms,
            error,
            body,
            next,
        };
        for round in 1..=RECORD_TRIES {
            match self.store.record_webhook_try(record.clone()).await {
                Ok(true) => return,
                Ok(false) => {
                    tracing::warn!("the delivery's lease was lost before its try was recorded; it may be sent again");
                    return;
                }
                Err(e) if e.is_transient() && round < RECORD_TRIES => {
                    tokio::time::sleep(Duration::from_millis(50 * u64::from(round))).await;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot record a webhook try; it is sent again when its lease expires");
                    return;
                }
            }
        }
    }

    /// One POST; the status, or why none came. The error text names what
    /// failed, never a secret.
    async fn post(
        &self,
        id: &str,
        endpoint: &crate::store::webhooks::WebhookEndpoint,
        body: &str,
        at: Millis,
    ) -> Result<u16, String> {
        let url = check_url(&endpoint.url, self.config.allow_private_networks)
            .map_err(|e| e.to_string())?;
        let key = self
            .key
            .as_ref()
            .ok_or_else(|| super::secrets::SecretError::NoKey.to_string())?;
        let mut secrets = vec![key
            .open(&endpoint.id, &endpoint.secret)
            .map_err(|e| e.to_string())?];
        if let (Some(previous), Some(until)) =
            (&endpoint.previous_secret, endpoint.previous_secret_until)
        {
            if until > at {
                // Sealed under another key (the key was changed, then the
                // endpoint rotated, as webhooks.md advises), the previous
                // secret cannot sign: the current one signs alone.
                match key.open(&endpoint.id, previous) {
                    Ok(secret) => secrets.push(secret),
                    Err(e) => tracing::debug!(
                        endpoint = %endpoint.id, error = %e,
                        "the previous secret does not open with this key; the current one signs alone"
                    ),
                }
            }
        }
        let timestamp = at.div_euclid(1000);
        let signature = signing::signature_header(&secrets, id, timestamp, body)
            .ok_or_else(|| "the endpoint's secret is not whsec_ and base64".to_string())?;
        let response = self
            .client
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signature)
            .body(body.to_string())
            .send()
            .await
            .map_err(describe)?;
        Ok(response.status().as_u16())
    }
}

/// A send error with its causes (the resolver's refusal among them), one line.
fn describe(e: reqwest::Error) -> String {
    let mut text = if e.is_timeout() {
        "timed out".to_string()
    } else if e.is_connect() {
        "cannot connect".to_string()
    } else {
        "request failed".to_string()
    };
    let mut source: Option<&dyn std::error::Error> = std::error::Error::source(&e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn backoff_grows_within_its_steps_and_stops_at_the_cap() {
        let config = WebhooksConfig {
            retry_base_ms: 1_000,
            retry_cap_ms: 60_000,
            ..WebhooksConfig::default()
        };
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut last = 0;
        for n in 1..=6 {
            let step = 1_000u64 << (n - 1);
            let d = backoff_ms(&config, n, &mut rng);
            assert!(d >= step / 2 && d <= step, "try {n}: {d}");
            assert!(d >= last, "try {n}: {d} after {last}");
            last = d;
        }
        for _ in 0..100 {
            let d = backoff_ms(&config, 30, &mut rng);
            assert!((30_000..=60_000).contains(&d), "{d}");
        }
    }
}
