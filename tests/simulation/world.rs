//! One simulated run: several engine instances over one SQLite file, the
//! scripted providers, the clients' clicks, the kills and restarts, and a
//! watcher that samples what clients would see — all on tokio's paused
//! clock, on one thread.

use super::provider::{CallLog, Ledger, Scripted};
use super::scenario::{ClickKind, FaultKind, KillAt, Scenario};
use super::store::{run_on, SyncStore};
use onejob::clock::Clock;
use onejob::config::{Config, Overrides};
use onejob::domain::request::IdempotencyKey;
use onejob::domain::{Attempt, Job, JobId, JobState, Millis};
use onejob::engine::{Engine, Gate};
use onejob::jobs::{submit, Intake, JobBody, SubmitError};
use onejob::keys::Caller;
use onejob::metrics::Metrics;
use onejob::providers::catalog::Catalog;
use onejob::providers::config::ProviderConfig;
use onejob::replays::Replays;
use onejob::store::console::JobFilter;
use onejob::store::faulty::FaultyStore;
use onejob::store::prelude::*;
use onejob::store::JobEvent;
use onejob::tenants::Admission;
use rand::SeedableRng;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::time::Instant;

/// 2027-01-15T08:00:00Z: the simulated wall clock's start.
pub const EPOCH_MS: Millis = 1_800_000_000_000;
/// How long a run may go on after its last scripted event.
const SETTLE_MS: u64 = 120_000;
pub const OWNER: &str = "sim-owner";

/// Timestamps from tokio's (paused) clock.
pub struct SimClock {
    start: Instant,
}

impl Clock for SimClock {
    fn now_ms(&self) -> Millis {
        EPOCH_MS + self.start.elapsed().as_millis() as Millis
    }
}

struct AdmitAll;

impl Gate for AdmitAll {
    fn admits(&self, _: &str, _: Option<&str>, _: bool) -> Result<(), String> {
        Ok(())
    }
}

/// One process: an engine and its own connection to the database.
struct Instance {
    engine: Engine,
    /// Its memory of finished jobs, for replays.
    replays: Arc<Replays>,
    store: Arc<SyncStore>,
    /// The same connection, where database errors are injected.
    faults: Arc<FaultyStore>,
    stop: watch::Sender<bool>,
    run: tokio::task::JoinHandle<()>,
}

impl Instance {
    fn alive(&self) -> bool {
        !self.store.is_dead()
    }

    fn kill(&self) {
        self.store.die();
        self.engine.kill();
        self.run.abort();
    }
}

/// What a client saw: every answer to a click, in order.
#[derive(Debug, Clone)]
#[allow(
    dead_code,
    reason = "some fields are read only through Debug, in the trace"
)]
pub enum Seen {
    /// A retry or cancel, and how it was answered.
    Asked {
        at: Millis,
        key: String,
        what: String,
    },
    /// A submit answered with this job (created or replayed).
    Accepted {
        at: Millis,
        key: String,
        /// The message the body carried.
        text: String,
        job_id: JobId,
        replayed: bool,
    },
    Conflict {
        at: Millis,
        key: String,
    },
    /// The other body was accepted (fine only when it created the job).
    ConflictAccepted {
        at: Millis,
        key: String,
        text: String,
        job_id: JobId,
    },
    Error {
        at: Millis,
        key: String,
        what: String,
    },
}

/// The state of the world a run leaves, for the checks and the trace.
pub struct Outcome {
    pub scenario: Scenario,
    pub seen: Vec<Seen>,
    /// (time, job) as the watcher sampled them.
    pub samples: Vec<(Millis, Job)>,
    /// Problems the watcher saw while the run went on.
    pub live_violations: Vec<String>,
    pub jobs: Vec<Job>,
    pub attempts: BTreeMap<JobId, Vec<Attempt>>,
    pub events: BTreeMap<JobId, Vec<JobEvent>>,
    /// Provider name → (honours keys, ledger).
    pub ledgers: BTreeMap<String, (bool, Ledger)>,
    pub provider_logs: Vec<(String, CallLog)>,
    pub end_ms: u64,
    pub store_calls: u64,
}

fn provider_config(name: &str, p: &super::scenario::ProviderPlan) -> ProviderConfig {
    let text = format!(
        "kind = \"sim\"\nbase_url = \"http://scripted.invalid\"\nmodel = \"{name}-model\"\n\
         tokenizer = \"o200k_base\"\ncontext_window = 16384\nhonours_idempotency_key = {}\n\
         lookup = \"{}\"\n",
        p.honours_keys,
        if p.can_look_up { "sim_ledger" } else { "none" }
    );
    toml::from_str(&text).expect("a scripted provider's config")
}

fn config(s: &Scenario) -> Config {
    // The shipped onejob.toml (its defaults), with the seed's settings.
    let mut config = Config::load(None, &Overrides::default()).expect("the default config");
    config.routes = BTreeMap::from([("default".to_string(), s.route.clone())]);
    let e = &mut config.engine;
    e.poll_interval_ms = s.engine.poll_interval_ms;
    e.reconcile_interval_ms = s.engine.reconcile_interval_ms;
    e.reconcile_min_age_ms = s.engine.reconcile_min_age_ms;
    e.lease_margin_ms = s.engine.lease_margin_ms;
    e.loser_grace_ms = s.engine.loser_grace_ms;
    e.breaker_threshold = s.engine.breaker_threshold;
    e.breaker_open_ms = s.engine.breaker_open_ms;
    e.breaker_probe_every = s.engine.breaker_probe_every;
    e.max_concurrent_jobs = 64;
    config
}

struct Shared {
    scenario: Scenario,
    config: Arc<Config>,
    clock: Arc<SimClock>,
    catalog: Arc<Catalog>,
    db: PathBuf,
    store_rt: Handle,
    instances: RefCell<Vec<Option<Instance>>>,
    seen: RefCell<Vec<Seen>>,
    starts: std::cell::Cell<u64>,
    /// Store calls of the instances replaced so far.
    store_calls: std::cell::Cell<u64>,
    /// When each process's database was down (a `Down` fault): by lease
    /// holder name, from and until (`Millis::MAX` while still down).
    outages: RefCell<Vec<(String, Millis, Millis)>>,
}

impl Shared {
    fn open_store(&self, kill_at: Option<(u64, bool)>) -> (Arc<SyncStore>, Arc<FaultyStore>) {
        let path = self.db.clone();
        let real: Arc<dyn Store> = run_on(&self.store_rt, async move {
            Arc::new(
                onejob::store::sqlite::SqliteStore::open(&path)
                    .await
                    .expect("open the simulation's database"),
            ) as Arc<dyn Store>
        });
        let faulty = Arc::new(FaultyStore::new(real));
        let store = SyncStore::new(faulty.clone(), self.store_rt.clone(), kill_at);
        (Arc::new(store), faulty)
    }

    /// Start process `slot` (again): a new engine, a new connection.
    fn start_instance(self: &Rc<Self>, slot: usize) {
        let n = self.starts.get();
        self.starts.set(n + 1);
        let kill_at = self.scenario.kills.iter().find_map(|k| match k.at {
            KillAt::StoreCall {
                n: at,
                after_commit,
            } if k.instance == slot && n == slot as u64 => Some((at, after_commit)),
            _ => None,
        });
        let (store, faults) = self.open_store(kill_at);
        let mut config = (*self.config).clone();
        config.engine.rng_seed = Some(self.scenario.seed.wrapping_mul(31).wrapping_add(n));
        let engine = Engine::new(
            Arc::new(config),
            store.clone() as Arc<dyn Store>,
            self.clock.clone(),
            self.catalog.clone(),
            Arc::new(BTreeMap::new()),
            Arc::new(AdmitAll),
            Arc::new(Metrics::default()),
        );
        {
            let engine = engine.clone();
            store.on_kill(move || engine.kill());
        }
        let (stop, stop_rx) = watch::channel(false);
        let run = {
            let engine = engine.clone();
            tokio::spawn(async move { engine.run(stop_rx).await })
        };
        let old = self.instances.borrow_mut()[slot].take();
        if let Some(old) = old {
            // A process started in its place means the old one is gone.
            old.kill();
            old.store.shut();
            self.store_calls
                .set(self.store_calls.get() + old.store.calls());
        }
        self.instances.borrow_mut()[slot] = Some(Instance {
            engine,
            replays: Arc::new(Replays::default()),
            store,
            faults,
            stop,
            run,
        });
    }

    /// The live instance a client reaching `slot` gets (a load balancer
    /// passes over dead ones); `None` when all are down.
    fn reach(&self, slot: usize) -> Option<(Engine, Arc<SyncStore>, Arc<Replays>)> {
        let instances = self.instances.borrow();
        let n = instances.len();
        (0..n).find_map(|i| {
            instances[(slot + i) % n]
                .as_ref()
                .filter(|inst| inst.alive())
                .map(|inst| {
                    (
                        inst.engine.clone(),
                        inst.store.clone(),
                        inst.replays.clone(),
                    )
                })
        })
    }

    fn live_engines(&self) -> Vec<Engine> {
        self.instances
            .borrow()
            .iter()
            .flatten()
            .filter(|i| i.alive())
            .map(|i| i.engine.clone())
            .collect()
    }
}

fn body(text: &str) -> Vec<u8> {
    serde_json::json!({"messages": [{"role": "user", "content": text}], "params": {"temperature": 0}})
        .to_string()
        .into_bytes()
}

async fn click(shared: Rc<Shared>, job: usize, c: usize) {
    let plan = shared.scenario.jobs[job].clone();
    let click = plan.clicks[c].clone();
    tokio::time::sleep(Duration::from_millis(click.at_ms)).await;
    let now = shared.clock.now_ms();
    let Some((engine, store, replays)) = shared.reach(click.instance) else {
        shared.seen.borrow_mut().push(Seen::Error {
            at: now,
            key: plan.key.clone(),
            what: "no instance is up".into(),
        });
        return;
    };
    let caller = Caller {
        owner_id: OWNER.into(),
        is_admin: false,
        key_id: "sim-key".to_string(),
        key_family: "sim-key".to_string(),
        key_limits: Default::default(),
    };
    let key = IdempotencyKey::parse(plan.key.as_bytes()).expect("a valid key");
    let seen = match click.what {
        ClickKind::Submit | ClickKind::Conflict => {
            let text = if click.what == ClickKind::Conflict {
                format!("{} — but different", plan.text)
            } else {
                plan.text.clone()
            };
            let store: Arc<dyn Store> = store.clone();
            let intake = Intake {
                store: &store,
                clock: shared.clock.as_ref(),
                routes: &shared.config.routes,
                engine: Some(&engine),
                replays: &replays,
                contracts: &Default::default(),
            };
            let answer = submit(
                intake,
                &caller,
                &key,
                &JobBody::Bytes(&body(&text)),
                &Admission::unlimited(&OWNER.into()),
            )
            .await;
            match (click.what, answer) {
                (ClickKind::Submit, Ok(s)) => Seen::Accepted {
                    at: now,
                    key: plan.key.clone(),
                    text,
                    job_id: s.job.id,
                    replayed: s.replayed,
                },
                (_, Ok(s)) => Seen::ConflictAccepted {
                    at: now,
                    key: plan.key.clone(),
                    text,
                    job_id: s.job.id,
                },
                (_, Err(SubmitError::KeyReused { .. })) => Seen::Conflict {
                    at: now,
                    key: plan.key.clone(),
                },
                (_, Err(e)) => Seen::Error {
                    at: now,
                    key: plan.key.clone(),
                    what: e.to_string(),
                },
            }
        }
        ClickKind::Retry | ClickKind::Cancel => {
            let job = store.find_job_by_key(&OWNER.into(), &plan.key).await;
            let Ok(Some(job)) = job else {
                return;
            };
            let result = if click.what == ClickKind::Retry {
                store.request_retry(&job.id, OWNER, now).await
            } else {
                store.cancel_job(&job.id, OWNER, "the user left", now).await
            };
            if click.what == ClickKind::Retry {
                engine.wake();
            }
            Seen::Asked {
                at: now,
                key: plan.key.clone(),
                what: format!("{:?}: {:?}", click.what, result.map(|r| r.map(|j| j.state))),
            }
        }
    };
    shared.seen.borrow_mut().push(seen);
}

/// Whether a job needs nothing more from the engine: final, in review, or
/// blocked on an unknown attempt (waiting for the reconciler).
pub fn settled(job: &Job) -> bool {
    job.state.is_final() || job.state == JobState::NeedsReview || job.next_run_at.is_none()
}

pub async fn run(scenario: Scenario, db: PathBuf, store_rt: Handle) -> Outcome {
    let start = Instant::now();
    let clock = Arc::new(SimClock { start });
    let config = Arc::new(config(&scenario));
    let mut catalog = Catalog::default();
    let mut ledgers = BTreeMap::new();
    let mut logs = Vec::new();
    for (i, p) in scenario.providers.iter().enumerate() {
        let rng = rand::rngs::StdRng::seed_from_u64(scenario.seed ^ (0x9e37_79b9 * (i as u64 + 1)));
        let provider = Scripted::new(
            &p.name,
            p.honours_keys,
            p.can_look_up,
            p.temper.clone(),
            rng,
            start,
        );
        ledgers.insert(p.name.clone(), (p.honours_keys, provider.ledger.clone()));
        logs.push((p.name.clone(), provider.log.clone()));
        catalog.insert(&p.name, provider_config(&p.name, p), Arc::new(provider));
    }
    let shared = Rc::new(Shared {
        scenario: scenario.clone(),
        config: config.clone(),
        clock: clock.clone(),
        catalog: Arc::new(catalog),
        db,
        store_rt,
        instances: RefCell::new((0..scenario.instances).map(|_| None).collect()),
        seen: RefCell::new(Vec::new()),
        starts: std::cell::Cell::new(0),
        store_calls: std::cell::Cell::new(0),
        outages: RefCell::new(Vec::new()),
    });
    for slot in 0..scenario.instances {
        shared.start_instance(slot);
    }
    let (observer, _) = shared.open_store(None);
    let local = tokio::task::LocalSet::new();
    let mut last_event = 0;
    for (j, plan) in scenario.jobs.iter().enumerate() {
        for (c, click_plan) in plan.clicks.iter().enumerate() {
            last_event = last_event.max(click_plan.at_ms);
            local.spawn_local(click(shared.clone(), j, c));
        }
    }
    for kill in &scenario.kills {
        let shared = shared.clone();
        let kill = kill.clone();
        if let KillAt::Time(at) = kill.at {
            last_event = last_event.max(at + kill.restart_after_ms.unwrap_or(0));
        }
        local.spawn_local(async move {
            match kill.at {
                KillAt::Time(at) => {
                    tokio::time::sleep(Duration::from_millis(at)).await;
                    if let Some(inst) = shared
                        .instances
                        .borrow()
                        .get(kill.instance)
                        .and_then(|i| i.as_ref())
                    {
                        inst.kill();
                    }
                }
                KillAt::StoreCall { .. } => {
                    // Died inside a store call; wait until it happens.
                    loop {
                        let dead = shared
                            .instances
                            .borrow()
                            .get(kill.instance)
                            .and_then(|i| i.as_ref())
                            .is_some_and(|i| !i.alive());
                        if dead {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        if start.elapsed() > Duration::from_millis(SETTLE_MS) {
                            return;
                        }
                    }
                    if let Some(inst) = shared
                        .instances
                        .borrow()
                        .get(kill.instance)
                        .and_then(|i| i.as_ref())
                    {
                        inst.kill();
                    }
                }
            }
            if let Some(after) = kill.restart_after_ms {
                tokio::time::sleep(Duration::from_millis(after)).await;
                shared.start_instance(kill.instance);
            }
        });
    }
    for fault in &scenario.faults {
        let shared = shared.clone();
        let fault = fault.clone();
        last_event = last_event.max(fault.at_ms);
        local.spawn_local(async move {
            tokio::time::sleep(Duration::from_millis(fault.at_ms)).await;
            let target = shared
                .instances
                .borrow()
                .get(fault.instance)
                .and_then(|i| i.as_ref())
                .map(|i| (i.faults.clone(), i.engine.instance().to_string()));
            let Some((faults, holder)) = target else {
                return;
            };
            match fault.what {
                FaultKind::FailNext {
                    method,
                    n,
                    after_commit: false,
                } => faults.fail_next(method, n),
                FaultKind::FailNext {
                    method,
                    n,
                    after_commit: true,
                } => faults.fail_next_after_commit(method, n),
                FaultKind::Down { for_ms } => {
                    let from = shared.clock.now_ms();
                    let index = {
                        let mut outages = shared.outages.borrow_mut();
                        outages.push((holder, from, Millis::MAX));
                        outages.len() - 1
                    };
                    faults.set_down(true);
                    tokio::time::sleep(Duration::from_millis(for_ms)).await;
                    faults.set_down(false);
                    shared.outages.borrow_mut()[index].2 = shared.clock.now_ms();
                }
            }
        });
    }
    let watcher = local.run_until(watch_until_settled(
        shared.clone(),
        observer.clone(),
        last_event,
    ));
    let (samples, live_violations, end_ms) = watcher.await;
    // Stop every process; what they leave is what the checks read.
    for inst in shared.instances.borrow().iter().flatten() {
        let _ = inst.stop.send(true);
        inst.kill();
        shared
            .store_calls
            .set(shared.store_calls.get() + inst.store.calls());
    }
    let jobs = observer
        .list_jobs(&JobFilter::default(), 10_000)
        .await
        .unwrap_or_default();
    let mut jobs = jobs;
    jobs.sort_by(|a, b| a.id.cmp(&b.id));
    let mut attempts = BTreeMap::new();
    let mut events = BTreeMap::new();
    for job in &jobs {
        attempts.insert(
            job.id.clone(),
            observer.list_attempts(&job.id).await.unwrap_or_default(),
        );
        events.insert(
            job.id.clone(),
            observer.list_events(&job.id).await.unwrap_or_default(),
        );
    }
    let provider_logs = logs;
    for inst in shared.instances.borrow().iter().flatten() {
        inst.store.shut();
    }
    observer.shut();
    let seen = shared.seen.borrow().clone();
    let store_calls = shared.store_calls.get() + observer.calls();
    drop(local);
    Outcome {
        scenario,
        seen,
        samples,
        live_violations,
        jobs,
        attempts,
        events,
        ledgers,
        provider_logs,
        end_ms,
        store_calls,
    }
}

/// Samples the jobs as clients would see them, and checks that no job is
/// left undriven: a job that wants a driver now, whose holder is alive (or
/// whose lease has run out), must be taken up within the poll interval
/// (plus slack). Ends when every job is settled after the last scripted
/// event, or at the time limit.
async fn watch_until_settled(
    shared: Rc<Shared>,
    observer: Arc<SyncStore>,
    last_event: u64,
) -> (Vec<(Millis, Job)>, Vec<String>, u64) {
    let poll = shared.config.engine.poll_interval_ms as Millis;
    let allowance = 2 * poll + 100;
    let tick = Duration::from_millis((allowance as u64 / 3).max(20));
    let mut samples = Vec::new();
    let mut violations = Vec::new();
    let mut last: BTreeMap<JobId, Job> = BTreeMap::new();
    let mut undriven_since: BTreeMap<JobId, Millis> = BTreeMap::new();
    let start = Instant::now();
    loop {
        tokio::time::sleep(tick).await;
        let now = shared.clock.now_ms();
        let elapsed = start.elapsed().as_millis() as u64;
        let jobs = match observer.list_jobs(&JobFilter::default(), 10_000).await {
            Ok(jobs) => jobs,
            Err(e) => {
                violations.push(format!("the watcher cannot read jobs: {e}"));
                break;
            }
        };
        let engines = shared.live_engines();
        let live_ids: Vec<String> = engines.iter().map(|e| e.instance().to_string()).collect();
        for job in &jobs {
            if last.get(&job.id) != Some(job) {
                samples.push((now, job.clone()));
                last.insert(job.id.clone(), job.clone());
            }
            let wants_driver = !settled(job) && job.next_run_at.is_some_and(|t| t <= now);
            let driven = engines.iter().any(|e| e.is_driving(&job.id));
            let holder_alive = job
                .lease_owner
                .as_ref()
                .is_some_and(|o| live_ids.contains(o));
            let lease_live = job.lease_until.is_some_and(|u| u >= now);
            // A process whose database is down can drive nothing; it gets
            // the allowance again from when its database is back. A live
            // lease waits for its holder; a free job for any process.
            let cut_off = |instance: &str| {
                shared.outages.borrow().iter().any(|(h, from, to)| {
                    h == instance && *from <= now && now <= to.saturating_add(allowance)
                })
            };
            let nobody_can = if lease_live && holder_alive {
                job.lease_owner.as_deref().is_some_and(cut_off)
            } else {
                engines.iter().all(|e| cut_off(e.instance()))
            };
            // A dead holder's lease must run out first; then anyone may take it.
            let excused = (lease_live && !holder_alive) || engines.is_empty() || nobody_can;
            if wants_driver && !driven && !excused {
                let since = *undriven_since.entry(job.id.clone()).or_insert(now);
                if now - since > allowance {
                    violations.push(format!(
                        "job {} ({}) wanted a driver from t={} to t={} (> {allowance} ms) with nobody driving it; lease {:?} until {:?}, holder alive: {holder_alive}",
                        job.id,
                        job.idempotency_key,
                        since - EPOCH_MS,
                        now - EPOCH_MS,
                        job.lease_owner,
                        job.lease_until.map(|u| u - EPOCH_MS),
                    ));
                    undriven_since.remove(&job.id);
                }
            } else {
                undriven_since.remove(&job.id);
            }
        }
        let all_settled = jobs.iter().all(settled);
        if elapsed > last_event + 50 && all_settled {
            // Settled; let in-flight losers finish their grace before the end.
            let mut started = false;
            for job in &jobs {
                let attempts = observer.list_attempts(&job.id).await.unwrap_or_default();
                started |= attempts
                    .iter()
                    .any(|a| a.state == onejob::domain::AttemptState::Started);
            }
            let blocked = jobs
                .iter()
                .any(|j| !j.state.is_final() && j.state != JobState::NeedsReview);
            if !started && !blocked {
                return (samples, violations, elapsed);
            }
        }
        if elapsed > last_event && engines.is_empty() {
            // Every process is down after the last scripted event: the
            // operator starts one (else nothing could finish).
            shared.start_instance(0);
        }
        if elapsed > last_event + SETTLE_MS {
            return (samples, violations, elapsed);
        }
    }
    (samples, violations, start.elapsed().as_millis() as u64)
}
