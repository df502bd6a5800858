//! Counters for `GET /metrics` (Prometheus text format). Plain atomics:
//! cheap enough for the hot path, no registry to configure.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

#[derive(Default)]
pub struct Metrics {
    pub jobs_created: AtomicU64,
    pub jobs_replayed: AtomicU64,
    pub idempotency_conflicts: AtomicU64,
    pub jobs_succeeded: AtomicU64,
    pub jobs_failed: AtomicU64,
    pub jobs_to_review: AtomicU64,
    pub hedges_started: AtomicU64,
    pub cas_lost: AtomicU64,
    pub attempts_abandoned: AtomicU64,
    /// Prompt + completion tokens of attempts whose result was discarded: the
    /// price of hedging.
    pub discarded_tokens: AtomicU64,
    pub reconciled_found: AtomicU64,
    pub reconciled_not_found: AtomicU64,
    pub reconciled_cannot_tell: AtomicU64,
    /// (provider, outcome) → count of finished attempts.
    attempts: Mutex<BTreeMap<(String, &'static str), u64>>,
}

impl Metrics {
    pub fn inc(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    pub fn attempt_finished(&self, provider: &str, outcome: &'static str) {
        if let Ok(mut map) = self.attempts.lock() {
            *map.entry((provider.to_string(), outcome)).or_default() += 1;
        }
    }

    /// The Prometheus text; `extra` appends gauges owned elsewhere (breakers).
    pub fn render(&self, extra: &str) -> String {
        let mut out = String::new();
        let counters: [(&str, &str, &AtomicU64); 13] = [
            (
                "onejob_jobs_created_total",
                "Jobs created",
                &self.jobs_created,
            ),
            (
                "onejob_jobs_replayed_total",
                "Idempotent replays answered",
                &self.jobs_replayed,
            ),
            (
                "onejob_idempotency_conflicts_total",
                "Same key, other payload (409)",
                &self.idempotency_conflicts,
            ),
            (
                "onejob_jobs_succeeded_total",
                "Jobs finished with a result",
                &self.jobs_succeeded,
            ),
            (
                "onejob_jobs_failed_total",
                "Jobs failed on a non-retryable error",
                &self.jobs_failed,
            ),
            (
                "onejob_jobs_review_total",
                "Jobs sent to the review queue",
                &self.jobs_to_review,
            ),
            (
                "onejob_hedges_started_total",
                "Hedge attempts started",
                &self.hedges_started,
            ),
            (
                "onejob_cas_lost_total",
                "Late results discarded by compare-and-swap",
                &self.cas_lost,
            ),
            (
                "onejob_attempts_abandoned_total",
                "Losing attempts dropped in flight",
                &self.attempts_abandoned,
            ),
            (
                "onejob_discarded_tokens_total",
                "Tokens paid for by discarded attempts",
                &self.discarded_tokens,
            ),
            (
                "onejob_reconciled_found_total",
                "Unknown attempts found executed",
                &self.reconciled_found,
            ),
            (
                "onejob_reconciled_not_found_total",
                "Unknown attempts found not executed",
                &self.reconciled_not_found,
            ),
            (
                "onejob_reconciled_cannot_tell_total",
                "Reconciliations the provider could not answer",
                &self.reconciled_cannot_tell,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                value.load(Ordering::Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP onejob_attempts_total Finished attempts by provider and outcome\n# TYPE onejob_attempts_total counter"
        );
        if let Ok(map) = self.attempts.lock() {
            for ((provider, outcome), n) in map.iter() {
                let _ = writeln!(
                    out,
                    "onejob_attempts_total{{provider=\"{provider}\",outcome=\"{outcome}\"}} {n}"
                );
            }
        }
        out.push_str(extra);
        out
    }
}
