//! The engine: runs every accepted job. It claims a job with a lease, starts
//! the primary attempt, hedges to an eligible fallback after the route's
//! silence threshold, lets the first success win the compare-and-swap, turns
//! a timeout into `unknown` (never `failed`), retries retryable failures with
//! backoff along the route, and hands what it cannot decide to the review
//! queue. A reconciler asks providers about unknown attempts by key.
//!
//! Time (`Clock` for timestamps, tokio time for timers), randomness (a seeded
//! RNG) and providers (the `Provider` trait) are injected.
//!
//! Its files, each using only those listed after it (and this one):
//! - `driver.rs`: one job from its claim to its end, in named steps (plan,
//!   round, settle, back off);
//! - `round.rs`: one round of attempts, the same for every job, streamed or
//!   not; `relay.rs`: what a streamed round tells its client;
//! - `reconciler.rs`: unknown attempts, asked about by key;
//! - `stream.rs`: a streamed job's hub, which clients read;
//! - `attempt.rs`: one attempt's guarded start, its task, its settled end
//!   (the CAS);
//! - `routing.rs` (which provider), `plan.rs` (a job's request per
//!   provider), `hedging.rs` (learned silence, hedge budget), `durable.rs`
//!   (store steps through database blips), `gate.rs` (contract
//!   eligibility).

mod attempt;
mod driver;
mod durable;
pub mod gate;
pub mod hedging;
pub mod plan;
mod reconciler;
mod relay;
mod round;
mod routing;
pub mod stream;

use crate::clock::Clock;
use crate::config::{Config, RouteConfig};
use crate::contracts::Contract;
use crate::domain::attempt::NewAttempt;
use crate::domain::breaker::{Breaker, BreakerPolicy, BreakerState};
use crate::domain::{Attempt, AttemptId, AttemptKind, Job, JobId, JobRequest, Millis, OwnerId};
use crate::metrics::Metrics;
use crate::providers::catalog::Catalog;
use crate::store::Store;
use rand::rngs::StdRng;
use rand::SeedableRng;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{oneshot, watch, Notify, Semaphore};

/// The one place that decides whether a provider may take a new attempt.
pub trait Gate: Send + Sync {
    /// `Ok` when `provider` may take a new attempt now; as a fallback (hedge or
    /// failover away from the primary) it must also be eligible for the job's
    /// contract. `Err` says why not.
    fn admits(
        &self,
        provider: &str,
        contract: Option<&str>,
        as_fallback: bool,
    ) -> Result<(), String>;
}

/// One `Prefer: wait` client: told with the settled job when a commit
/// handed it over, with `None` when it must read the job itself.
type Waiter = oneshot::Sender<Option<Arc<Handed>>>;

/// A job as the commit that settled it left it, handed to whoever waits.
#[derive(Debug, Clone)]
pub struct Handed {
    pub job: Job,
    /// The attempt that won it, as its finish left its row (without its
    /// output, which is the job's result): a door answers with it instead
    /// of reading the job's attempts.
    pub winner: Option<Arc<Attempt>>,
}

/// A waiter registered before its job is handed to the engine, so that no
/// hand-over can pass it by: [`Engine::watch`], then [`Engine::wait_settled`].
/// Dropped unused, it takes its registration back.
pub struct Watch {
    inner: Arc<Inner>,
    job_id: JobId,
    rx: Option<oneshot::Receiver<Option<Arc<Handed>>>>,
}

impl Watch {
    fn take(mut self) -> Option<oneshot::Receiver<Option<Arc<Handed>>>> {
        self.rx.take()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Some(rx) = self.rx.take() {
            drop(rx);
            self.inner.forget_waiter(&self.job_id);
        }
    }
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch")
            .field("job_id", &self.job_id)
            .finish()
    }
}

/// Everything the engine's tasks share.
pub(crate) struct Inner {
    pub instance: String,
    pub store: Arc<dyn Store>,
    pub clock: Arc<dyn Clock>,
    pub config: Arc<Config>,
    pub catalog: Arc<Catalog>,
    pub contracts: Arc<BTreeMap<String, Contract>>,
    pub gate: Arc<dyn Gate>,
    pub metrics: Arc<Metrics>,
    pub rng: Mutex<StdRng>,
    /// Learned silence thresholds, the hedge budget and hedging's cost.
    pub(crate) hedging: hedging::Hedging,
    breakers: Mutex<HashMap<String, Breaker>>,
    /// Jobs this process is driving now; a job is never driven twice here.
    active: Mutex<HashSet<JobId>>,
    slots: Semaphore,
    wake: Notify,
    /// Who waits for a job to settle; told with the settled job when its
    /// driver has it (the winner's commit), else only woken to read it.
    waiters: Mutex<HashMap<JobId, Vec<Waiter>>>,
    /// Streamed jobs' events, by (owner, idempotency key).
    hubs: Mutex<HashMap<(OwnerId, String), Arc<stream::StreamHub>>>,
    /// Turned true by [`Engine::kill`]: every task of this engine stops.
    killed: watch::Sender<bool>,
}

/// A primary attempt chosen before its job is created, started by the
/// create's commit; the driver sends it without another write.
#[derive(Clone)]
pub struct Prestart {
    attempt: NewAttempt,
    plan: plan::JobPlan,
}

impl Prestart {
    /// The attempt to write with the job.
    pub fn attempt(&self) -> &NewAttempt {
        &self.attempt
    }
}

#[derive(Clone)]
pub struct Engine {
    inner: Arc<Inner>,
}

impl Engine {
    pub fn new(
        config: Arc<Config>,
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        catalog: Arc<Catalog>,
        contracts: Arc<BTreeMap<String, Contract>>,
        gate: Arc<dyn Gate>,
        metrics: Arc<Metrics>,
    ) -> Self {
        let rng = match config.engine.rng_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_entropy(),
        };
        let slots = Semaphore::new(config.engine.max_concurrent_jobs.max(1));
        let hedging = hedging::Hedging::new(&config);
        Engine {
            inner: Arc::new(Inner {
                instance: crate::domain::new_id(),
                store,
                clock,
                config,
                catalog,
                contracts,
                gate,
                metrics,
                rng: Mutex::new(rng),
                hedging,
                breakers: Mutex::new(HashMap::new()),
                active: Mutex::new(HashSet::new()),
                slots,
                wake: Notify::new(),
                waiters: Mutex::new(HashMap::new()),
                hubs: Mutex::new(HashMap::new()),
                killed: watch::Sender::new(false),
            }),
        }
    }

    /// This process's lease holder name.
    pub fn instance(&self) -> &str {
        &self.inner.instance
    }

    /// The lease a job created here is taken with, so that create and claim
    /// are one commit and the job needs no dispatcher round trip.
    pub fn lease_for_new_job(&self, route: &RouteConfig, now: Millis) -> (String, Millis) {
        (
            self.inner.instance.clone(),
            now + self.inner.lease_ms(route),
        )
    }

    /// The primary attempt of a job about to be created here, to be
    /// started in the create's own commit ([`NewJob::primary`]); `None`
    /// when the job must start as before: a streaming client waits for it
    /// (its first round starts its own attempt), its request cannot be
    /// planned, or no provider may take it now. `request` is the request the
    /// door decoded, `stored` its text as the job stores it.
    ///
    /// [`NewJob::primary`]: crate::domain::job::NewJob::primary
    pub fn prestart(
        &self,
        job_id: &JobId,
        owner: &OwnerId,
        key: &str,
        (request, stored): (&JobRequest, &str),
        route: &RouteConfig,
        now: Millis,
    ) -> Option<Prestart> {
        if self.inner.has_hub(owner, key) {
            return None;
        }
        let plan = plan::JobPlan::decoded(job_id, request, stored, &self.inner.contracts).ok()?;
        let routing::Choice::Provider(entry) = routing::choose_provider(
            &self.inner,
            route,
            &plan,
            AttemptKind::Primary,
            &routing::Steer::default(),
        ) else {
            return None;
        };
        let attempt = NewAttempt {
            id: AttemptId::new(),
            job_id: job_id.clone(),
            provider: entry.name.clone(),
            kind: AttemptKind::Primary,
            max_hedges: i64::from(route.max_hedges),
            reuses_key: entry.config.honours_idempotency_key,
            started_at: now,
        };
        Some(Prestart { attempt, plan })
    }

    /// Drive a job this process has just created (and holds the lease of);
    /// `prestart`: the primary attempt its create started.
    pub fn adopt(&self, job: Job, prestart: Option<Prestart>) {
        driver::spawn(self.inner.clone(), job, prestart);
    }

    /// Dispatcher and reconciler, until `stop` turns true.
    pub async fn run(&self, mut stop: watch::Receiver<bool>) {
        let dispatcher = {
            let inner = self.inner.clone();
            let stop = stop.clone();
            self.inner
                .spawn(async move { dispatch_loop(inner, stop).await })
        };
        let reconciler = {
            let inner = self.inner.clone();
            let stop = stop.clone();
            self.inner
                .spawn(async move { reconciler::run(inner, stop).await })
        };
        let sharing = {
            let inner = self.inner.clone();
            let stop = stop.clone();
            self.inner
                .spawn(async move { hedging::share_loop(inner, stop).await })
        };
        let _ = stop.wait_for(|s| *s).await;
        let _ = dispatcher.await;
        let _ = reconciler.await;
        let _ = sharing.await;
    }

    /// Wait until the job reaches a state `until` names, at most `limit`. Works for
    /// jobs driven by other processes too (it re-reads the job periodically).
    pub async fn wait_for(&self, job_id: &JobId, limit: Duration, until: Until) -> Option<Job> {
        self.wait_settled(job_id, limit, None, until)
            .await
            .map(|handed| handed.job)
    }

    /// Register a waiter for `job_id` now, before the job is handed to the
    /// engine: a job that settles at once is still handed over to it.
    pub fn watch(&self, job_id: &JobId) -> Watch {
        Watch {
            inner: self.inner.clone(),
            job_id: job_id.clone(),
            rx: Some(self.inner.register_waiter(job_id)),
        }
    }

    /// [`Self::wait_for`], with the winning attempt when the commit that
    /// settled the job handed it over; `watch`: a waiter registered earlier
    /// by [`Self::watch`].
    pub async fn wait_settled(
        &self,
        job_id: &JobId,
        limit: Duration,
        watch: Option<Watch>,
        until: Until,
    ) -> Option<Handed> {
        let settled = |job: &Job| until.reached(job);
        let deadline = tokio::time::Instant::now() + limit;
        let mut watched = watch.and_then(Watch::take);
        loop {
            let mut rx = match watched.take() {
                Some(rx) => rx,
                None => self.inner.register_waiter(job_id),
            };
            // A watch made before the job reached the engine may hold the
            // hand-over already (the job settled before the caller came to
            // wait): take it rather than read the job back without its winner.
            match rx.try_recv() {
                Ok(Some(handed)) if settled(&handed.job) => return Some(Handed::clone(&handed)),
                // Told to read the job itself: a fresh registration for the
                // wait below.
                Ok(_) => rx = self.inner.register_waiter(job_id),
                Err(_) => {}
            }
            // Driven here and not done: the driver notifies when it stops
            // (after this registration), so reading the job now is wasted.
            let driving = tokio::time::Instant::now() < deadline
                && self
                    .inner
                    .active
                    .lock()
                    .is_ok_and(|active| active.contains(job_id));
            let job = if driving {
                None
            } else {
                self.inner.store.get_job(job_id).await.ok().flatten()
            };
            if let Some(job) = &job {
                if settled(job) {
                    drop(rx);
                    self.inner.forget_waiter(job_id);
                    return Some(Handed {
                        job: job.clone(),
                        winner: None,
                    });
                }
            }
            let now = tokio::time::Instant::now();
            if now >= deadline && !driving {
                drop(rx);
                self.inner.forget_waiter(job_id);
                return job.map(|job| Handed { job, winner: None });
            }
            let recheck = deadline
                .saturating_duration_since(now)
                .min(Duration::from_millis(250));
            if let Ok(Ok(Some(handed))) = tokio::time::timeout(recheck, rx).await {
                // Handed over by the commit that settled it: no read.
                if settled(&handed.job) {
                    return Some(Handed::clone(&handed));
                }
            }
        }
    }

    /// Wait (at most `limit`) until no job is being driven here; false when
    /// some still are.
    pub async fn drain(&self, limit: Duration) -> bool {
        let all = self.inner.config.engine.max_concurrent_jobs.max(1) as u32;
        matches!(
            tokio::time::timeout(limit, self.inner.slots.acquire_many(all)).await,
            Ok(Ok(_))
        )
    }

    /// The stream of the job `(owner, key)` names, made if there is none,
    /// before the job is submitted: a driver that takes the job here runs
    /// it streamed.
    pub fn stream_hub(&self, owner: &OwnerId, key: &str) -> Arc<stream::StreamHub> {
        self.inner.stream_hub(owner, key)
    }

    /// Forget a stream no driver took.
    pub fn release_hub(&self, owner: &OwnerId, key: &str, hub: &Arc<stream::StreamHub>) {
        self.inner.release_hub(owner, key, hub)
    }

    /// Stop every task of this engine (drivers, hedges, losers, dispatcher,
    /// reconciler) at its next await, as if the process had died: nothing
    /// more is written or sent, leases are left to expire. The deterministic
    /// simulation kills instances with it; a server stops gracefully through
    /// `run`'s stop signal instead.
    pub fn kill(&self) {
        self.inner.killed.send_replace(true);
    }

    /// Whether this engine is driving `job_id` now.
    pub fn is_driving(&self, job_id: &JobId) -> bool {
        self.inner
            .active
            .lock()
            .is_ok_and(|active| active.contains(job_id))
    }

    /// Make the dispatcher look for runnable jobs now (after a retry or resolution).
    pub fn wake(&self) {
        self.inner.wake.notify_one();
    }

    /// Breaker states, for the admin API.
    pub fn breakers(&self) -> BTreeMap<String, BreakerState> {
        self.inner
            .breakers
            .lock()
            .map(|b| b.iter().map(|(k, v)| (k.clone(), v.state())).collect())
            .unwrap_or_default()
    }

    /// The hedging of route `name` as this instance (and those sharing
    /// with it) sees it now: `None` for a route not configured.
    pub fn hedging(&self, name: &str) -> Option<hedging::RouteHedging> {
        let route = self.inner.config.routes.get(name)?;
        self.inner
            .hedging
            .view(name, route, self.inner.clock.now_ms())
    }

    /// The hedging gauges of `/metrics`, as Prometheus text.
    pub fn hedging_metrics(&self) -> String {
        self.inner
            .hedging
            .metrics_text(&self.inner.config, self.inner.clock.now_ms())
    }

    /// Sets the gauges the engine owns (breakers, jobs driven) on `metrics`.
    pub fn report_gauges(&self, metrics: &Metrics) {
        let mut readings = Vec::new();
        if let Ok(breakers) = self.inner.breakers.lock() {
            for (name, b) in breakers.iter() {
                let open = match b.state() {
                    BreakerState::Closed { .. } => 0.0,
                    BreakerState::Open { .. } => 1.0,
                    BreakerState::HalfOpen { .. } => 0.5,
                };
                readings.push(crate::metrics::BreakerReading {
                    provider: name.clone(),
                    open,
                    trips: b.trips,
                });
            }
        }
        let active = self.inner.active.lock().map(|a| a.len()).unwrap_or(0);
        metrics.set_engine_gauges(&readings, active);
    }
}

/// What a waiting client holds out for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Until {
    /// Final, waiting for a human, or blocked on an unknown attempt: the
    /// jobs API's caller reads `blocked_on` and decides.
    Actionable,
    /// Final or waiting for a human: a client of a compatible door can
    /// only take an answer or an error, so an unknown attempt, which the
    /// reconciler may settle in a moment, is waited out with the rest.
    Answer,
}

impl Until {
    pub fn reached(self, job: &Job) -> bool {
        job.state.is_final()
            || job.state.awaits_decision()
            || (self == Until::Actionable && job.is_blocked_on_unknown())
    }
}

impl Inner {
    /// Every task the engine starts goes through here, so that
    /// [`Engine::kill`] stops them all.
    pub(crate) fn spawn(
        &self,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        let mut killed = self.killed.subscribe();
        let task = Box::pin(task);
        tokio::spawn(async move {
            tokio::select! {
                biased;
                _ = killed.wait_for(|k| *k) => {}
                () = task => {}
            }
        })
    }

    /// How long a lease must last for one round of attempts on `route`: the
    /// hedge's longest silence, an attempt's timeout, and `lease_margin_ms`.
    pub(crate) fn lease_ms(&self, route: &RouteConfig) -> Millis {
        let silence = route.hedge_policy().longest_silence_ms();
        (silence + route.attempt_timeout_ms + self.config.engine.lease_margin_ms) as Millis
    }

    /// The longest lease of any route.
    pub(crate) fn longest_lease_ms(&self) -> Millis {
        self.config
            .routes
            .values()
            .map(|r| self.lease_ms(r))
            .max()
            .unwrap_or(60_000)
    }

    /// Drop the registrations of waiters that stopped waiting for `job_id`:
    /// a job that settled before its driver noticed a waiter is never
    /// notified, and its entry would stay for the life of the process.
    pub(crate) fn forget_waiter(&self, job_id: &JobId) {
        if let Ok(mut waiters) = self.waiters.lock() {
            if let Some(list) = waiters.get_mut(job_id) {
                list.retain(|tx| !tx.is_closed());
                if list.is_empty() {
                    waiters.remove(job_id);
                }
            }
        }
    }

    pub(crate) fn notify(&self, job_id: &JobId) {
        let waiting = self.waiters.lock().ok().and_then(|mut w| w.remove(job_id));
        for tx in waiting.into_iter().flatten() {
            let _ = tx.send(None);
        }
    }

    fn register_waiter(&self, job_id: &JobId) -> oneshot::Receiver<Option<Arc<Handed>>> {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut waiters) = self.waiters.lock() {
            waiters.entry(job_id.clone()).or_default().push(tx);
        }
        rx
    }

    /// Hand a job as a commit left it to whoever waits for it, with the
    /// attempt that won it (`winner` is asked only when someone waits).
    pub(crate) fn hand_over(&self, job: Job, winner: impl FnOnce() -> Option<Attempt>) {
        let waiting = self.waiters.lock().ok().and_then(|mut w| w.remove(&job.id));
        let Some(waiting) = waiting else {
            return;
        };
        let handed = Arc::new(Handed {
            job,
            winner: winner().map(Arc::new),
        });
        for tx in waiting {
            let _ = tx.send(Some(handed.clone()));
        }
    }

    pub(crate) fn with_breaker<T>(&self, provider: &str, f: impl FnOnce(&mut Breaker) -> T) -> T {
        let policy = BreakerPolicy {
            threshold: self.config.engine.breaker_threshold.max(1),
            open_for_ms: self.config.engine.breaker_open_ms as Millis,
            probe_every: self.config.engine.breaker_probe_every.max(1),
        };
        let mut breakers = match self.breakers.lock() {
            Ok(b) => b,
            Err(poisoned) => poisoned.into_inner(),
        };
        f(breakers
            .entry(provider.to_string())
            .or_insert_with(|| Breaker::new(policy)))
    }

    /// Mark a job as driven here; false when it already is.
    pub(crate) fn begin_driving(&self, job_id: &JobId) -> bool {
        self.active
            .lock()
            .map(|mut a| a.insert(job_id.clone()))
            .unwrap_or(false)
    }

    pub(crate) fn end_driving(&self, job_id: &JobId) {
        if let Ok(mut a) = self.active.lock() {
            a.remove(job_id);
        }
    }
}

/// Claims runnable jobs that nobody holds: retries that came due, jobs of a
/// process that died, jobs created while the engine was busy.
async fn dispatch_loop(inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let interval = Duration::from_millis(inner.config.engine.poll_interval_ms.max(1));
    let lease = inner.longest_lease_ms();
    // After a failed claim, the next one also takes runnable jobs already
    // leased here: the failed claim may have committed with its answer lost
    // (simulation seed 291), and the jobs it leased here would otherwise
    // wait out that lease undriven. Jobs driven here now are skipped by
    // `driver::spawn`.
    let mut reclaim_own = false;
    loop {
        if *stop.borrow() {
            return;
        }
        let now = inner.clock.now_ms();
        let free = inner.slots.available_permits().min(256) as i64;
        if free > 0 {
            match inner
                .store
                .claim_jobs(&inner.instance, now, now + lease, free, reclaim_own)
                .await
            {
                Ok(jobs) => {
                    reclaim_own = false;
                    for job in jobs {
                        driver::spawn(inner.clone(), job, None);
                    }
                }
                Err(e) => {
                    reclaim_own = true;
                    tracing::warn!(error = %e, "claiming runnable jobs failed");
                }
            }
        }
        // `biased`: branches in a fixed order keep a simulated run
        // reproducible from its seed.
        tokio::select! {
            biased;
            _ = tokio::time::sleep(interval) => {}
            _ = inner.wake.notified() => {}
            // A dropped stop sender means stop too (and must not spin).
            changed = stop.changed() => if changed.is_err() { return; },
        }
    }
}
