//! What `GET /metrics` reports, encoded by `prometheus-client` in the
//! Prometheus text format (0.0.4).
//!
//! The plain counters stay public `AtomicU64` fields (the hot path bumps them
//! with one relaxed add, and every caller keeps using `Metrics::inc`); the
//! library encodes them at scrape time from a snapshot. Labelled series and
//! histograms are the library's own types, updated in place.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::sync::atomic::{AtomicU64, Ordering};

/// The `Content-Type` of what [`Metrics::render`] returns.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

type Labels = Vec<(&'static str, String)>;
type HistogramFamily = Family<Labels, Histogram, fn() -> Histogram>;

/// Seconds, 5 ms to ~41 s: from a cached replay to a slow model's answer.
fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

pub struct Metrics {
    pub jobs_created: AtomicU64,
    pub jobs_replayed: AtomicU64,
    /// Replays answered without reading the database (`crate::replays`).
    pub replays_from_memory: AtomicU64,
    pub idempotency_conflicts: AtomicU64,
    pub jobs_succeeded: AtomicU64,
    pub jobs_failed: AtomicU64,
    pub jobs_to_review: AtomicU64,
    pub hedges_started: AtomicU64,
    /// Hedges the route's hedge budget refused.
    pub hedges_denied: AtomicU64,
    pub cas_lost: AtomicU64,
    pub attempts_abandoned: AtomicU64,
    /// Prompt + completion tokens of attempts whose result was discarded: the
    /// price of hedging.
    pub discarded_tokens: AtomicU64,
    pub reconciled_found: AtomicU64,
    pub reconciled_not_found: AtomicU64,
    pub reconciled_cannot_tell: AtomicU64,
    /// Unknown attempts of finished jobs let go past unknown_deadline_ms.
    pub reconciled_abandoned: AtomicU64,
    /// Hedge attempts whose result won the compare-and-swap.
    pub hedges_won: AtomicU64,
    /// Cut streams restarted without a prefill on a provider that cannot
    /// continue one.
    pub stream_restarts: AtomicU64,
    /// Restarts whose answer did not repeat what the client had.
    pub stream_restarts_diverged: AtomicU64,
    /// (provider, outcome) → finished attempts.
    attempts: Family<Labels, Counter>,
    discarded_tokens_by_provider: Family<Labels, Counter>,
    job_latency: Histogram,
    provider_latency: HistogramFamily,
    time_to_first_token: HistogramFamily,
    breaker_state: Family<Labels, Gauge<f64, AtomicU64>>,
    /// provider → times its breaker opened, as the engine last reported.
    breaker_trips: std::sync::Mutex<Vec<(String, u64)>>,
    review_queue_depth: Gauge,
    jobs_driving: Gauge,
    /// outcome (`delivered`, `retried`, `failed`) → webhook tries of this process.
    webhook_tries: Family<Labels, Counter>,
    webhook_latency: Histogram,
    /// state → deliveries in the outbox, read from the database at scrape.
    webhook_deliveries: Family<Labels, Gauge>,
    /// The store's group commits and the writes they carried, read from
    /// the store at scrape (`Store::commit_counts`).
    store_commits: AtomicU64,
    store_commit_writes: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            jobs_created: AtomicU64::new(0),
            jobs_replayed: AtomicU64::new(0),
            replays_from_memory: AtomicU64::new(0),
            idempotency_conflicts: AtomicU64::new(0),
            jobs_succeeded: AtomicU64::new(0),
            jobs_failed: AtomicU64::new(0),
            jobs_to_review: AtomicU64::new(0),
            hedges_started: AtomicU64::new(0),
            hedges_denied: AtomicU64::new(0),
            cas_lost: AtomicU64::new(0),
            attempts_abandoned: AtomicU64::new(0),
            discarded_tokens: AtomicU64::new(0),
            reconciled_found: AtomicU64::new(0),
            reconciled_not_found: AtomicU64::new(0),
            reconciled_cannot_tell: AtomicU64::new(0),
            reconciled_abandoned: AtomicU64::new(0),
            hedges_won: AtomicU64::new(0),
            stream_restarts: AtomicU64::new(0),
            stream_restarts_diverged: AtomicU64::new(0),
            attempts: Family::default(),
            discarded_tokens_by_provider: Family::default(),
            job_latency: latency_histogram(),
            provider_latency: Family::new_with_constructor(latency_histogram),
            time_to_first_token: Family::new_with_constructor(latency_histogram),
            breaker_state: Family::default(),
            breaker_trips: std::sync::Mutex::default(),
            review_queue_depth: Gauge::default(),
            jobs_driving: Gauge::default(),
            webhook_tries: Family::default(),
            webhook_latency: latency_histogram(),
            webhook_deliveries: Family::default(),
            store_commits: AtomicU64::new(0),
            store_commit_writes: AtomicU64::new(0),
        }
    }
}

/// A provider's breaker, as a gauge: 0 closed, 0.5 half-open, 1 open.
pub struct BreakerReading {
    pub provider: String,
    pub open: f64,
    pub trips: u64,
}

fn provider_label(provider: &str) -> Labels {
    vec![("provider", provider.to_string())]
}

fn seconds(ms: i64) -> f64 {
    ms.max(0) as f64 / 1000.0
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn attempt_finished(&self, provider: &str, outcome: &'static str) {
        self.attempts
            .get_or_create(&vec![
                ("provider", provider.to_string()),
                ("outcome", outcome.to_string()),
            ])
            .inc();
    }

    /// An attempt's answer (or its end) came `elapsed_ms` after it started.
    pub fn observe_provider_latency(&self, provider: &str, elapsed_ms: i64) {
        self.provider_latency
            .get_or_create(&provider_label(provider))
            .observe(seconds(elapsed_ms));
    }

    /// The first token arrived `elapsed_ms` after the attempt started (for an
    /// answer that is not streamed, the whole answer is its first token).
    pub fn observe_time_to_first_token(&self, provider: &str, elapsed_ms: i64) {
        self.time_to_first_token
            .get_or_create(&provider_label(provider))
            .observe(seconds(elapsed_ms));
    }

    /// A job reached its result `elapsed_ms` after it was accepted.
    pub fn observe_job_latency(&self, elapsed_ms: i64) {
        self.job_latency.observe(seconds(elapsed_ms));
    }

    /// A discarded attempt of `provider` had cost `tokens`.
    pub fn discarded(&self, provider: &str, tokens: u64) {
        self.discarded_tokens.fetch_add(tokens, Ordering::Relaxed);
        self.discarded_tokens_by_provider
            .get_or_create(&provider_label(provider))
            .inc_by(tokens);
    }

    fn webhook_try(&self, outcome: &'static str, latency_ms: i64) {
        self.webhook_tries
            .get_or_create(&vec![("outcome", outcome.to_string())])
            .inc();
        self.webhook_latency.observe(seconds(latency_ms));
    }

    /// A webhook try was answered 2xx after `latency_ms`.
    pub fn webhook_delivered(&self, latency_ms: i64) {
        self.webhook_try("delivered", latency_ms);
    }

    /// A webhook try failed; the delivery is retried later.
    pub fn webhook_retried(&self, latency_ms: i64) {
        self.webhook_try("retried", latency_ms);
    }

    /// A webhook try failed and the delivery with it (budget spent, or 410).
    pub fn webhook_failed(&self, latency_ms: i64) {
        self.webhook_try("failed", latency_ms);
    }

    /// The outbox by state, as the database holds it (every replica agrees).
    pub fn set_webhook_deliveries(&self, pending: i64, delivered: i64, failed: i64) {
        for (state, n) in [
            ("pending", pending),
            ("delivered", delivered),
            ("failed", failed),
        ] {
            self.webhook_deliveries
                .get_or_create(&vec![("state", state.to_string())])
                .set(n);
        }
    }

    /// The store's group commits so far and the writes they carried.
    pub fn set_store_commits(&self, commits: u64, writes: u64) {
        self.store_commits.store(commits, Ordering::Relaxed);
        self.store_commit_writes.store(writes, Ordering::Relaxed);
    }

    pub fn set_review_queue_depth(&self, depth: i64) {
        self.review_queue_depth.set(depth);
    }

    /// The engine's own gauges, read at scrape time.
    pub fn set_engine_gauges(&self, breakers: &[BreakerReading], jobs_driving: usize) {
        for b in breakers {
            self.breaker_state
                .get_or_create(&provider_label(&b.provider))
                .set(b.open);
        }
        if let Ok(mut trips) = self.breaker_trips.lock() {
            *trips = breakers
                .iter()
                .map(|b| (b.provider.clone(), b.trips))
                .collect();
        }
        self.jobs_driving
            .set(i64::try_from(jobs_driving).unwrap_or(i64::MAX));
    }

    fn counters(&self) -> CounterSnapshot {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        CounterSnapshot(vec![
            (
                "onejob_jobs_created",
                "Jobs created",
                read(&self.jobs_created),
            ),
            (
                "onejob_jobs_replayed",
                "Idempotent replays answered",
                read(&self.jobs_replayed),
            ),
            (
                "onejob_replays_from_memory",
                "Replays of finished jobs answered without reading the database",
                read(&self.replays_from_memory),
            ),
            (
                "onejob_idempotency_conflicts",
                "Same key, other payload (409)",
                read(&self.idempotency_conflicts),
            ),
            (
                "onejob_jobs_succeeded",
                "Jobs finished with a result",
                read(&self.jobs_succeeded),
            ),
            (
                "onejob_jobs_failed",
                "Jobs failed on a non-retryable error",
                read(&self.jobs_failed),
            ),
            (
                "onejob_jobs_review",
                "Jobs sent to the review queue",
                read(&self.jobs_to_review),
            ),
            (
                "onejob_hedges_started",
                "Hedge attempts started",
                read(&self.hedges_started),
            ),
            (
                "onejob_hedges_denied",
                "Hedges the route's hedge budget refused",
                read(&self.hedges_denied),
            ),
            (
                "onejob_hedges_won",
                "Hedge attempts that won the job",
                read(&self.hedges_won),
            ),
            (
                "onejob_stream_restarts",
                "Cut streams restarted without a prefill on another provider",
                read(&self.stream_restarts),
            ),
            (
                "onejob_stream_restarts_diverged",
                "Stream restarts that did not repeat what the client had",
                read(&self.stream_restarts_diverged),
            ),
            (
                "onejob_cas_lost",
                "Late results discarded by compare-and-swap",
                read(&self.cas_lost),
            ),
            (
                "onejob_attempts_abandoned",
                "Losing attempts dropped in flight",
                read(&self.attempts_abandoned),
            ),
            (
                "onejob_discarded_tokens",
                "Tokens paid for by discarded attempts",
                read(&self.discarded_tokens),
            ),
            (
                "onejob_reconciled_found",
                "Unknown attempts found executed",
                read(&self.reconciled_found),
            ),
            (
                "onejob_reconciled_not_found",
                "Unknown attempts found not executed",
                read(&self.reconciled_not_found),
            ),
            (
                "onejob_reconciled_cannot_tell",
                "Reconciliations the provider could not answer",
                read(&self.reconciled_cannot_tell),
            ),
            (
                "onejob_reconciled_abandoned",
                "Unknown attempts of finished jobs let go once no one could say, past unknown_deadline_ms",
                read(&self.reconciled_abandoned),
            ),
            (
                "onejob_store_commits",
                "Group commits of the store: SQLite's write transactions (one WAL fdatasync each), PostgreSQL's shared create and win statements",
                read(&self.store_commits),
            ),
            (
                "onejob_store_commit_writes",
                "Callers' writes those commits carried (writes per commit: the group commit's size)",
                read(&self.store_commit_writes),
            ),
        ])
    }

    /// The Prometheus text; `extra` is appended as is (text owned elsewhere).
    pub fn render(&self, extra: &str) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self.counters()));
        registry.register(
            "onejob_attempts",
            "Finished attempts by provider and outcome",
            self.attempts.clone(),
        );
        registry.register(
            "onejob_discarded_tokens_by_provider",
            "Tokens paid for by discarded attempts, by provider",
            self.discarded_tokens_by_provider.clone(),
        );
        registry.register(
            "onejob_job_duration_seconds",
            "From accepting a job to its result",
            self.job_latency.clone(),
        );
        registry.register(
            "onejob_provider_latency_seconds",
            "From an attempt's start to its end, by provider",
            self.provider_latency.clone(),
        );
        registry.register(
            "onejob_time_to_first_token_seconds",
            "From an attempt's start to its first token, by provider",
            self.time_to_first_token.clone(),
        );
        registry.register(
            "onejob_breaker_open",
            "Whether a provider's circuit breaker is open (1) or half-open (0.5)",
            self.breaker_state.clone(),
        );
        registry.register_collector(Box::new(BreakerTrips(
            self.breaker_trips
                .lock()
                .map(|t| t.clone())
                .unwrap_or_default(),
        )));
        registry.register(
            "onejob_review_queue_depth",
            "Jobs waiting in the review queue",
            self.review_queue_depth.clone(),
        );
        registry.register(
            "onejob_jobs_driving",
            "Jobs this process drives now",
            self.jobs_driving.clone(),
        );
        registry.register(
            "onejob_webhook_tries",
            "Webhook tries sent by this process, by outcome",
            self.webhook_tries.clone(),
        );
        registry.register(
            "onejob_webhook_latency_seconds",
            "From sending a webhook try to its answer (or its failure)",
            self.webhook_latency.clone(),
        );
        registry.register(
            "onejob_webhook_deliveries",
            "Webhook deliveries in the outbox, by state (pending, delivered, failed)",
            self.webhook_deliveries.clone(),
        );
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
        out.push_str(extra);
        out
    }
}

/// The plain counters' values at scrape time.
#[derive(Debug)]
struct CounterSnapshot(Vec<(&'static str, &'static str, u64)>);

impl Collector for CounterSnapshot {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, value) in &self.0 {
            let counter = ConstCounter::new(*value);
            let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
            counter.encode(metric)?;
        }
        Ok(())
    }
}

/// Times each provider's breaker opened, at scrape time.
#[derive(Debug)]
struct BreakerTrips(Vec<(String, u64)>);

impl Collector for BreakerTrips {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        if self.0.is_empty() {
            return Ok(());
        }
        let mut metric = encoder.encode_descriptor(
            "onejob_breaker_trips",
            "Times a provider's breaker opened",
            None,
            prometheus_client::metrics::MetricType::Counter,
        )?;
        for (provider, trips) in &self.0 {
            let labels = provider_label(provider);
            ConstCounter::new(*trips).encode(metric.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn existing_counter_names_survive_the_library() {
        let m = Metrics::default();
        Metrics::inc(&m.jobs_created);
        m.attempt_finished("sim", "succeeded");
        m.observe_provider_latency("sim", 20);
        let text = m.render("");
        assert!(text.contains("onejob_jobs_created_total 1\n"), "{text}");
        assert!(
            text.contains("onejob_attempts_total{provider=\"sim\",outcome=\"succeeded\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("onejob_provider_latency_seconds_count{provider=\"sim\"} 1\n"),
            "{text}"
        );
    }
}
