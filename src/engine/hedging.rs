//! Hedging that tunes itself, as the engine runs it: per route and
//! provider, the learned estimate of time to first token (streamed rounds)
//! or to answer (rounds not streamed); per route, the hedge budget and the
//! cost of hedging over a sliding window. The round asks [`silence`] for
//! the threshold in force and [`admit`] whether a hedge may start.
//!
//! Instances share what they learned through the database: every
//! [`SHARE_INTERVAL`] each writes its own estimates and window (one row per
//! route, `hedging_shares`) and reads everybody else's, so a new instance
//! starts from what the others (and its predecessors) learned, and the
//! budget counts every instance's jobs and hedges. Only an instance's own
//! observations go into its row: nothing is counted twice. The arithmetic
//! is in [`crate::domain::hedging`].

use super::Inner;
use crate::config::{Config, RouteConfig};
use crate::domain::hedging::{
    HedgeCounts, HedgePolicy, HedgeWindow, LatencyEstimate, Reading, Snapshot, MIN_SAMPLES,
};
use crate::domain::{Job, Millis};
use crate::store::hedging::HedgingShare;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::watch;

/// How often an instance writes its share and reads the others'.
pub const SHARE_INTERVAL: Duration = Duration::from_secs(5);

/// What a threshold is learned from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Measure {
    /// A streamed attempt: from its start to its first piece.
    TimeToFirstToken,
    /// An attempt not streamed: from its start to its whole answer.
    TimeToAnswer,
}

impl Measure {
    pub fn as_str(self) -> &'static str {
        match self {
            Measure::TimeToFirstToken => "time_to_first_token",
            Measure::TimeToAnswer => "time_to_answer",
        }
    }
}

/// One route as this instance sees it.
struct RouteState {
    policy: HedgePolicy,
    /// This instance's own observations.
    estimates: BTreeMap<(String, Measure), LatencyEstimate>,
    window: HedgeWindow,
}

/// What one instance writes for one route.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ShareBody {
    pub estimates: Vec<(String, Measure, Snapshot)>,
    pub window: HedgeWindow,
}

#[derive(Default)]
struct State {
    routes: BTreeMap<String, RouteState>,
    /// The other instances' latest shares: route → instance → share.
    others: BTreeMap<String, BTreeMap<String, ShareBody>>,
}

/// The engine's hedging state (see the module docs).
pub(crate) struct Hedging {
    state: Mutex<State>,
}

impl Hedging {
    pub fn new(config: &Config) -> Self {
        let routes = config
            .routes
            .iter()
            .map(|(name, route)| {
                let policy = route.hedge_policy();
                let state = RouteState {
                    policy,
                    estimates: BTreeMap::new(),
                    window: HedgeWindow::new(policy.window_ms),
                };
                (name.clone(), state)
            })
            .collect();
        Hedging {
            state: Mutex::new(State {
                routes,
                others: BTreeMap::new(),
            }),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every update is a few additions: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// With the counts of `route` in the window (this instance's and the
    /// others'), and its state.
    fn with_route<T>(
        &self,
        route: &str,
        f: impl FnOnce(&mut RouteState, &BTreeMap<String, ShareBody>) -> T,
    ) -> Option<T> {
        let mut state = self.state();
        let State { routes, others } = &mut *state;
        let empty = BTreeMap::new();
        let others = others.get(route).unwrap_or(&empty);
        routes.get_mut(route).map(|r| f(r, others))
    }

    fn counts(r: &RouteState, others: &BTreeMap<String, ShareBody>, now: Millis) -> HedgeCounts {
        let windows: Vec<&HedgeWindow> = others.values().map(|s| &s.window).collect();
        r.window.total_with(&windows, now)
    }

    fn reading(
        r: &RouteState,
        others: &BTreeMap<String, ShareBody>,
        provider: &str,
        measure: Measure,
        now: Millis,
    ) -> Reading {
        let mut reading = Reading::default();
        if let Some(own) = r.estimates.get(&(provider.to_string(), measure)) {
            reading.add_estimate(own, now);
        }
        for share in others.values() {
            for (p, m, snapshot) in &share.estimates {
                if p == provider && *m == measure {
                    reading.add(snapshot, now);
                }
            }
        }
        reading
    }

    /// The threshold in force (ms) on `route` for `provider`, and whether
    /// it was learned; `None` for a route this engine was not configured with.
    pub fn threshold(
        &self,
        route: &str,
        provider: &str,
        measure: Measure,
        now: Millis,
    ) -> Option<(u64, bool)> {
        self.with_route(route, |r, others| {
            // A fixed silence reads nothing: no reading is made for it.
            if !r.policy.auto {
                return r.policy.threshold_ms(None);
            }
            let reading = Self::reading(r, others, provider, measure, now);
            r.policy.threshold_ms(Some(&reading))
        })
    }

    /// A successful attempt's latency.
    pub fn observe(&self, route: &str, provider: &str, measure: Measure, ms: i64, now: Millis) {
        self.with_route(route, |r, _| {
            let half_life = (r.policy.window_ms / 4).max(1);
            r.estimates
                .entry((provider.to_string(), measure))
                .or_insert_with(|| LatencyEstimate::new(half_life, now))
                .observe(ms, now);
        });
    }

    /// An attempt cut off after `ms` without its answer (a hedge won): it
    /// would have taken at least `ms`. Counted as a sample of `ms` when that
    /// lies above the current estimate of the quantile, so that hedging does
    /// not hide from the estimate the very tail it cuts; below it, a lower
    /// bound says nothing about the quantile and is left out.
    pub fn censored(&self, route: &str, provider: &str, measure: Measure, ms: i64, now: Millis) {
        let above = self
            .with_route(route, |r, others| {
                let reading = Self::reading(r, others, provider, measure, now);
                reading
                    .quantile(r.policy.quantile)
                    .is_none_or(|q| ms as f64 >= q)
            })
            .unwrap_or(false);
        if above {
            self.observe(route, provider, measure, ms, now);
        }
    }

    fn count(&self, route: &str, now: Millis, f: impl FnOnce(&mut HedgeCounts)) {
        self.with_route(route, |r, _| f(r.window.at(now)));
    }

    pub fn job_started(&self, route: &str, now: Millis) {
        self.count(route, now, |c| c.jobs += 1);
    }

    /// Whether a hedge may start on `route` now; a hedge admitted is
    /// counted (give it back with [`Hedging::not_started`]). `budgeted`:
    /// the budget applies (a hedge after a silence; not the rescue of an
    /// attempt that ended unknown). False also counts a denial.
    pub fn admit(&self, route: &str, now: Millis, budgeted: bool) -> bool {
        self.with_route(route, |r, others| {
            let admitted = match (budgeted, r.policy.budget_percent) {
                (true, Some(percent)) => Self::counts(r, others, now).admits_hedge(percent),
                _ => true,
            };
            let slot = r.window.at(now);
            if admitted {
                slot.hedges += 1;
            } else {
                slot.denied += 1;
            }
            admitted
        })
        .unwrap_or(true)
    }

    /// An admitted hedge did not start after all (the guard refused it).
    pub fn not_started(&self, route: &str, now: Millis) {
        self.count(route, now, |c| c.hedges = c.hedges.saturating_sub(1));
    }

    pub fn hedge_won(&self, route: &str, now: Millis) {
        self.count(route, now, |c| c.hedges_won += 1);
    }

    /// A winning hedge's answer came `ms` before its primary's.
    pub fn latency_saved(&self, route: &str, ms: i64, now: Millis) {
        self.count(route, now, |c| {
            c.saved_samples += 1;
            c.saved_ms += ms.max(0) as u64;
        });
    }

    pub fn discarded(&self, route: &str, tokens: u64, now: Millis) {
        self.count(route, now, |c| c.discarded_tokens += tokens);
    }

    /// This instance's shares, one per route it has seen work on.
    pub fn shares(&self, instance: &str, now: Millis) -> Vec<HedgingShare> {
        let state = self.state();
        state
            .routes
            .iter()
            .filter(|(_, r)| !r.estimates.is_empty() || !r.window.slots.is_empty())
            .filter_map(|(route, r)| {
                let body = ShareBody {
                    estimates: r
                        .estimates
                        .iter()
                        .map(|((p, m), e)| (p.clone(), *m, e.snapshot(now)))
                        .collect(),
                    window: r.window.clone(),
                };
                let body = serde_json::to_string(&body).ok()?;
                Some(HedgingShare {
                    instance: instance.to_string(),
                    route: route.clone(),
                    written_at: now,
                    body,
                })
            })
            .collect()
    }

    /// Take the other instances' shares as read from the database.
    pub fn absorb(&self, instance: &str, rows: Vec<HedgingShare>) {
        let mut others: BTreeMap<String, BTreeMap<String, ShareBody>> = BTreeMap::new();
        for row in rows.into_iter().filter(|r| r.instance != instance) {
            match serde_json::from_str::<ShareBody>(&row.body) {
                Ok(body) => {
                    others
                        .entry(row.route)
                        .or_default()
                        .insert(row.instance, body);
                }
                Err(e) => {
                    tracing::warn!(error = %e, instance = %row.instance, route = %row.route, "unreadable hedging share; ignored")
                }
            }
        }
        self.state().others = others;
    }

    /// The longest window of any route.
    fn longest_window_ms(&self) -> i64 {
        self.state()
            .routes
            .values()
            .map(|r| r.policy.window_ms)
            .max()
            .unwrap_or(300_000)
    }

    /// What `route` looks like now, its providers in route order.
    pub fn view(&self, name: &str, route: &RouteConfig, now: Millis) -> Option<RouteHedging> {
        self.with_route(name, |r, others| {
            let providers = std::iter::once(&route.primary)
                .chain(route.fallbacks.iter())
                .map(|p| {
                    let measures: BTreeMap<&'static str, ThresholdView> =
                        [Measure::TimeToFirstToken, Measure::TimeToAnswer]
                            .into_iter()
                            .map(|m| {
                                let reading = Self::reading(r, others, p, m, now);
                                let (ms, learned) = r.policy.threshold_ms(Some(&reading));
                                let view = ThresholdView {
                                    measure: m,
                                    silence_ms_in_force: ms,
                                    learned,
                                    samples: (reading.samples * 10.0).round() / 10.0,
                                    observed: reading.observed,
                                    quantile_ms: reading
                                        .quantile(r.policy.quantile)
                                        .map(|q| q.round() as u64),
                                    p50_ms: reading.quantile(0.5).map(|q| q.round() as u64),
                                };
                                (m.as_str(), view)
                            })
                            .collect();
                    // The measure with more samples is the one shown first.
                    let main = measures
                        .values()
                        .max_by(|a, b| a.samples.total_cmp(&b.samples))
                        .cloned()
                        .unwrap_or_default();
                    ProviderHedging {
                        provider: p.clone(),
                        main,
                        measures,
                    }
                })
                .collect();
            let counts = Self::counts(r, others, now);
            RouteHedging {
                route: name.to_string(),
                silence: route.silence,
                hedge_quantile: r.policy.quantile,
                silence_ms: r.policy.fixed_ms,
                silence_min_ms: r.policy.min_ms,
                silence_max_ms: r.policy.max_ms,
                min_samples: MIN_SAMPLES as u64,
                hedge_budget_percent: r.policy.budget_percent,
                window_ms: r.policy.window_ms,
                instances: others.len() + 1,
                providers,
                cost: Cost::of(&counts),
            }
        })
    }

    /// The gauges of `/metrics` (route, provider, measure), as Prometheus text.
    pub fn metrics_text(&self, config: &Config, now: Millis) -> String {
        type G = Family<Vec<(&'static str, String)>, Gauge<f64, AtomicU64>>;
        let (silence, learned, samples) = (G::default(), G::default(), G::default());
        let route_gauges: Vec<(&str, &str, G)> = vec![
            ("onejob_hedge_window_jobs", "Jobs of the route in the hedge window (all instances)", G::default()),
            ("onejob_hedge_rate", "Hedges per job in the hedge window", G::default()),
            ("onejob_hedge_win_rate", "Hedges that won, per hedge, in the hedge window", G::default()),
            ("onejob_hedges_denied_window", "Hedges the budget refused in the hedge window", G::default()),
            ("onejob_hedge_latency_saved_ms", "Latency saved by winning hedges whose primary answered, summed over the hedge window (ms)", G::default()),
            ("onejob_hedge_discarded_tokens_window", "Tokens of discarded attempts in the hedge window", G::default()),
        ];
        for (name, route) in &config.routes {
            let Some(view) = self.view(name, route, now) else {
                continue;
            };
            for p in &view.providers {
                for (m, t) in &p.measures {
                    let labels = vec![
                        ("route", name.clone()),
                        ("provider", p.provider.clone()),
                        ("measure", m.to_string()),
                    ];
                    silence
                        .get_or_create(&labels)
                        .set(t.silence_ms_in_force as f64);
                    learned
                        .get_or_create(&labels)
                        .set(if t.learned { 1.0 } else { 0.0 });
                    samples.get_or_create(&labels).set(t.samples);
                }
            }
            let c = &view.cost;
            let values = [
                c.jobs as f64,
                c.hedge_rate,
                c.hedge_win_rate,
                c.hedges_denied as f64,
                c.latency_saved_ms as f64,
                c.discarded_tokens as f64,
            ];
            for ((_, _, g), v) in route_gauges.iter().zip(values) {
                g.get_or_create(&vec![("route", name.clone())]).set(v);
            }
        }
        let mut registry = Registry::default();
        registry.register(
            "onejob_hedge_silence_ms",
            "The hedge's silence threshold in force (ms), by route, provider and measure",
            silence,
        );
        registry.register(
            "onejob_hedge_learned",
            "Whether the threshold in force was learned (1) or is the fixed silence_ms (0)",
            learned,
        );
        registry.register(
            "onejob_hedge_samples",
            "Decayed samples the learned threshold rests on",
            samples,
        );
        for (name, help, g) in route_gauges {
            registry.register(name, help, g);
        }
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::prometheus_text::encode(&mut out, &registry) {
            tracing::error!(error = %e, "cannot encode hedging metrics");
        }
        out
    }
}

/// `GET /v1/admin/routes/{name}/hedging`.
#[derive(Debug, Clone, Serialize)]
pub struct RouteHedging {
    pub route: String,
    pub silence: crate::config::SilenceMode,
    pub hedge_quantile: f64,
    pub silence_ms: u64,
    pub silence_min_ms: u64,
    pub silence_max_ms: u64,
    /// Samples a learned threshold needs.
    pub min_samples: u64,
    /// `null`: no budget (a fixed silence without one).
    pub hedge_budget_percent: Option<f64>,
    pub window_ms: i64,
    /// Instances whose shares the numbers include (this one too).
    pub instances: usize,
    pub providers: Vec<ProviderHedging>,
    pub cost: Cost,
}

#[derive(Debug, Clone, Serialize)]
pub struct ProviderHedging {
    pub provider: String,
    /// The measure with more samples (a route mostly streamed shows time
    /// to first token).
    #[serde(flatten)]
    pub main: ThresholdView,
    pub measures: BTreeMap<&'static str, ThresholdView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ThresholdView {
    pub measure: Measure,
    pub silence_ms_in_force: u64,
    /// From samples (true) or the fixed `silence_ms` (false).
    pub learned: bool,
    /// Decayed: recent samples weigh more.
    pub samples: f64,
    /// Samples ever observed (by every instance sharing).
    pub observed: u64,
    /// The estimate of the route's `hedge_quantile`, before clamping.
    pub quantile_ms: Option<u64>,
    pub p50_ms: Option<u64>,
}

impl Default for ThresholdView {
    fn default() -> Self {
        ThresholdView {
            measure: Measure::TimeToAnswer,
            silence_ms_in_force: 0,
            learned: false,
            samples: 0.0,
            observed: 0,
            quantile_ms: None,
            p50_ms: None,
        }
    }
}

/// The cost of hedging on a route over its window (every instance's).
#[derive(Debug, Clone, Serialize)]
pub struct Cost {
    pub jobs: u64,
    pub hedges: u64,
    pub hedge_rate: f64,
    pub hedges_won: u64,
    pub hedge_win_rate: f64,
    pub hedges_denied: u64,
    /// Winning hedges whose primary answered too (within the loser grace).
    pub latency_saved_samples: u64,
    /// Their primary's latency minus theirs, summed (ms).
    pub latency_saved_ms: u64,
    pub discarded_tokens: u64,
}

impl Cost {
    fn of(c: &HedgeCounts) -> Self {
        Cost {
            jobs: c.jobs,
            hedges: c.hedges,
            hedge_rate: c.hedge_rate(),
            hedges_won: c.hedges_won,
            hedge_win_rate: c.win_rate(),
            hedges_denied: c.denied,
            latency_saved_samples: c.saved_samples,
            latency_saved_ms: c.saved_ms,
            discarded_tokens: c.discarded_tokens,
        }
    }
}

/// The silence a round waits on `provider` before it hedges: the
/// threshold in force for the job's route. The one place the round (and
/// its second hedge) takes it from.
pub(super) fn silence(
    inner: &Inner,
    job: &Job,
    route: &RouteConfig,
    provider: &str,
    measure: Measure,
) -> Duration {
    let ms = inner
        .hedging
        .threshold(&job.route, provider, measure, inner.clock.now_ms())
        .map_or(route.silence_ms, |(ms, _)| ms);
    Duration::from_millis(ms)
}

/// Whether a hedge after a silence may start now; a refusal is logged and
/// counted, and the job waits for its attempt or its time limits.
pub(super) fn admit(inner: &Inner, job: &Job) -> bool {
    let admitted = inner.hedging.admit(&job.route, inner.clock.now_ms(), true);
    if !admitted {
        crate::metrics::Metrics::inc(&inner.metrics.hedges_denied);
        tracing::info!(route = %job.route, "hedge denied by the route's hedge budget; waiting for the attempt in flight");
    }
    admitted
}

/// Writes this instance's shares and reads the others', every
/// [`SHARE_INTERVAL`] (at once on start: a new instance starts from what
/// was learned before it), until `stop` turns true.
pub(super) async fn share_loop(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let window = inner.hedging.longest_window_ms();
    loop {
        if *stop.borrow() {
            return;
        }
        let now = inner.clock.now_ms();
        match inner.store.hedging_shares(now - 2 * window).await {
            Ok(rows) => inner.hedging.absorb(&inner.instance, rows),
            Err(e) => tracing::warn!(error = %e, "cannot read the hedging shares"),
        }
        let shares = inner.hedging.shares(&inner.instance, now);
        if !shares.is_empty() {
            if let Err(e) = inner
                .store
                .put_hedging_shares(shares, now - 10 * window)
                .await
            {
                tracing::warn!(error = %e, "cannot write this instance's hedging share");
            }
        }
        tokio::select! {
            biased;
            _ = tokio::time::sleep(SHARE_INTERVAL) => {}
            changed = stop.changed() => if changed.is_err() { return; },
        }
    }
}
