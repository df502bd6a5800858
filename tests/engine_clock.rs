//! Engine scenarios that are about time passing — silence thresholds,
//! attempt timeouts, reconciliation age, lease expiry — run on tokio's
//! paused clock against scripted providers, with the real store (each
//! backend) underneath. They take the route's real-looking times (seconds)
//! and finish in milliseconds; `tests/engine.rs` keeps the scenarios that
//! prove the wiring over real sockets (HTTP API, simulator, admin).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;
#[path = "simulation/provider.rs"]
#[allow(dead_code, reason = "shared with the simulation, which uses all of it")]
mod provider;
#[path = "simulation/store.rs"]
#[allow(dead_code, reason = "shared with the simulation, which uses all of it")]
mod store;

use common::world::route;
use common::{Backend, TestDb};
use onejob::clock::Clock;
use onejob::config::{Config, Overrides, RouteConfig};
use onejob::domain::request::IdempotencyKey;
use onejob::domain::{Attempt, AttemptId, AttemptKind, AttemptState, Job, JobId, JobState, Millis};
use onejob::engine::{Engine, Gate};
use onejob::keys::Caller;
use onejob::metrics::Metrics;
use onejob::providers::catalog::Catalog;
use onejob::providers::stable_key;
use onejob::replays::Replays;
use onejob::store::prelude::*;
use onejob::store::Refusal;
use onejob::tenants::Admission;
use provider::{Behaviour, Kind, Scripted, Temper};
use rand::SeedableRng;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use store::{run_on, SyncStore};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::time::Instant;

const OWNER: &str = "alice";

/// Where the real stores' own tasks run (SQLite's writer, PostgreSQL's pool).
fn store_rt() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    })
}

struct SimClock(Instant);

impl Clock for SimClock {
    fn now_ms(&self) -> Millis {
        1_800_000_000_000 + self.0.elapsed().as_millis() as Millis
    }
}

struct AdmitAll;

impl Gate for AdmitAll {
    fn admits(&self, _: &str, _: Option<&str>, _: bool) -> Result<(), String> {
        Ok(())
    }
}

/// A provider of the bench: its name, whether it honours keys, and what
/// its calls do, in order (then it answers after 10 ms).
struct Spec {
    name: &'static str,
    honours_keys: bool,
    script: Vec<Behaviour>,
}

struct Bench {
    engine: Engine,
    store: Arc<SyncStore>,
    clock: Arc<SimClock>,
    config: Arc<Config>,
    providers: BTreeMap<String, Arc<Scripted>>,
    metrics: Arc<Metrics>,
    stop: watch::Sender<bool>,
    _db: TestDb,
}

fn provider_config(name: &str, honours: bool) -> onejob::providers::config::ProviderConfig {
    toml::from_str(&format!(
        "kind = \"sim\"\nbase_url = \"http://scripted.invalid\"\nmodel = \"{name}\"\n\
         tokenizer = \"o200k_base\"\ncontext_window = 16384\nhonours_idempotency_key = {honours}\n\
         lookup = \"sim_ledger\"\n"
    ))
    .unwrap()
}

/// An engine over a fresh database of `backend`, on the paused clock.
async fn bench(
    backend: Backend,
    specs: Vec<Spec>,
    route: RouteConfig,
    tune: impl FnOnce(&mut Config),
) -> Option<Bench> {
    if backend == Backend::Postgres && common::postgres_admin_url().is_none() {
        return None;
    }
    let db = run_on(store_rt().handle(), TestDb::new(backend));
    let url = db.url.clone();
    let real: Arc<dyn Store> = run_on(store_rt().handle(), async move {
        let store = onejob::store::connect(&url).await.unwrap();
        store.migrate().await.unwrap();
        store
    });
    let store = Arc::new(SyncStore::new(real, store_rt().handle().clone(), None));
    let clock = Arc::new(SimClock(Instant::now()));
    let mut config = Config::load(None, &Overrides::default()).unwrap();
    config.routes = BTreeMap::from([("default".to_string(), route)]);
    // Every poll is a real query; a second of simulated time costs a few.
    config.engine.poll_interval_ms = 500;
    config.engine.reconcile_interval_ms = 500;
    config.engine.reconcile_min_age_ms = 0;
    config.engine.rng_seed = Some(42);
    tune(&mut config);
    let config = Arc::new(config);
    let metrics = Arc::new(Metrics::default());
    let mut catalog = Catalog::default();
    let mut providers = BTreeMap::new();
    for spec in specs {
        let temper = Temper {
            weights: vec![(Kind::Answer, 1)],
            latency: (10, 10),
        };
        let scripted = Arc::new(Scripted::new(
            spec.name,
            spec.honours_keys,
            true,
            temper,
            rand::rngs::StdRng::seed_from_u64(7),
            clock.0,
        ));
        scripted.script(spec.script);
        catalog.insert(
            spec.name,
            provider_config(spec.name, spec.honours_keys),
            scripted.clone(),
        );
        providers.insert(spec.name.to_string(), scripted);
    }
    let engine = Engine::new(
        config.clone(),
        store.clone() as Arc<dyn Store>,
        clock.clone(),
        Arc::new(catalog),
        Arc::new(BTreeMap::new()),
        Arc::new(AdmitAll),
        metrics.clone(),
    );
    let (stop, stop_rx) = watch::channel(false);
    {
        let engine = engine.clone();
        tokio::spawn(async move { engine.run(stop_rx).await });
    }
    Some(Bench {
        engine,
        store,
        clock,
        config,
        providers,
        metrics,
        stop,
        _db: db,
    })
}

impl Bench {
    /// `onejob_attempts_total` for `provider` and `outcome`, as `/metrics` shows it.
    fn attempts_total(&self, provider: &str, outcome: &str) -> u64 {
        let series =
            format!("onejob_attempts_total{{provider=\"{provider}\",outcome=\"{outcome}\"}} ");
        let text = self.metrics.render("");
        text.lines()
            .find_map(|l| l.strip_prefix(&series))
            .map_or(0, |v| v.trim().parse().unwrap())
    }

    async fn submit(&self, key: &str) -> Job {
        let caller = Caller {
            owner_id: OWNER.into(),
            is_admin: false,
            key_id: "k".to_string(),
            key_family: "k".to_string(),
            key_limits: Default::default(),
        };
        let body = serde_json::json!({"messages": [{"role": "user", "content": key}]});
        let store: Arc<dyn Store> = self.store.clone();
        let replays = Replays::default();
        let intake = onejob::jobs::Intake {
            store: &store,
            clock: self.clock.as_ref(),
            routes: &self.config.routes,
            engine: Some(&self.engine),
            replays: &replays,
            contracts: &Default::default(),
        };
        onejob::jobs::submit(
            intake,
            &caller,
            &IdempotencyKey::parse(key.as_bytes()).unwrap(),
            &onejob::jobs::JobBody::Bytes(body.to_string().as_bytes()),
            &Admission::unlimited(&OWNER.into()),
        )
        .await
        .unwrap()
        .job
    }

    /// Let simulated time pass until `check` holds (at most `limit` of it).
    async fn until(
        &self,
        id: &JobId,
        limit: Duration,
        check: impl Fn(&Job, &[Attempt]) -> bool,
    ) -> (Job, Vec<Attempt>) {
        let deadline = Instant::now() + limit;
        loop {
            let job = self.store.get_job(id).await.unwrap().unwrap();
            let attempts = self.store.list_attempts(id).await.unwrap();
            if check(&job, &attempts) {
                return (job, attempts);
            }
            assert!(
                Instant::now() < deadline,
                "not reached within {limit:?} (simulated); job {job:?}, attempts {attempts:?}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    fn executions(&self, job_id: &JobId, provider: &str) -> u32 {
        self.providers[provider].executions(&stable_key(job_id, provider))
    }

    fn stop(self) {
        let _ = self.stop.send(true);
        self.engine.kill();
        self.store.shut();
    }
}

/// One `#[tokio::test]` per backend, on a paused current-thread runtime.
macro_rules! on_both_backends_paused {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(start_paused = true)]
                async fn sqlite() {
                    super::$name($crate::common::Backend::Sqlite).await;
                }
                #[tokio::test(start_paused = true)]
                async fn postgres() {
                    super::$name($crate::common::Backend::Postgres).await;
                }
            }
        )*
    };
}

on_both_backends_paused!(
    a_timeout_is_unknown_and_blocks_retries_until_reconciled,
    reverse_order_finish_discards_the_late_primary,
    the_lost_response_is_found_by_reconciliation,
    attempts_no_process_drives_are_recovered,
    unknowns_nobody_can_settle_do_not_starve_the_rest,
);

const WAIT: Duration = Duration::from_secs(120);

async fn a_timeout_is_unknown_and_blocks_retries_until_reconciled(backend: Backend) {
    let mut r = route("primary", &[]);
    r.silence_ms = 10_000;
    r.attempt_timeout_ms = 30_000;
    let specs = vec![Spec {
        name: "primary",
        honours_keys: false,
        // A black hole, then a healthy answer.
        script: vec![Behaviour::Silence, Behaviour::Answer { ms: 800 }],
    }];
    let Some(bench) = bench(backend, specs, r, |c| {
        // Ask the provider only after the test has looked at the unknown state.
        c.engine.reconcile_min_age_ms = 45_000;
    })
    .await
    else {
        return;
    };
    let job = bench.submit("slow-1").await;
    let started = Instant::now();
    let (job, attempts) = bench
        .until(&job.id, WAIT, |j, _| {
            j.state == JobState::Running && j.next_run_at.is_none()
        })
        .await;
    assert_eq!(
        started.elapsed().as_secs(),
        30,
        "unknown at attempt_timeout_ms, not before"
    );
    assert_eq!(attempts.len(), 1);
    assert_eq!(
        (
            attempts[0].state,
            attempts[0].error_kind.as_ref().map(|k| k.as_str())
        ),
        (AttemptState::Unknown, Some("attempt_timeout")),
        "a timeout does not fail the job"
    );
    // POST /retry is refused while the outcome is unknown.
    let refused = bench
        .store
        .request_retry(&job.id, OWNER, bench.clock.now_ms())
        .await
        .unwrap();
    assert_eq!(refused.unwrap_err(), Refusal::OutcomeUnknown);

    // The reconciler finds the attempt never executed, so a retry may run.
    let (job, attempts) = bench
        .until(&job.id, WAIT, |j, _| j.state == JobState::Succeeded)
        .await;
    assert_eq!(attempts.len(), 2, "{attempts:?}");
    assert_eq!(
        (
            attempts[0].state,
            attempts[0].error_kind.as_ref().map(|k| k.as_str())
        ),
        (AttemptState::Failed, Some("not_executed"))
    );
    assert!(
        attempts[1].started_at - attempts[0].started_at >= 45_000,
        "no retry before the reconciler asked"
    );
    assert_eq!(
        (attempts[1].kind, attempts[1].state),
        (AttemptKind::Retry, AttemptState::Succeeded)
    );
    assert_eq!(job.completed_by.as_deref(), Some(attempts[1].id.as_str()));
    assert_eq!(bench.executions(&job.id, "primary"), 1);
    // Each ending is counted where it is recorded: unknown by the driver,
    // failed when the reconciler settled it, succeeded by the retry.
    for outcome in ["unknown", "failed", "succeeded"] {
        assert_eq!(bench.attempts_total("primary", outcome), 1, "{outcome}");
    }
    bench.stop();
}

async fn reverse_order_finish_discards_the_late_primary(backend: Backend) {
    let mut r = route("primary", &["fallback"]);
    r.silence_ms = 2_000;
    r.attempt_timeout_ms = 60_000;
    let specs = vec![
        Spec {
            name: "primary",
            honours_keys: true,
            script: vec![Behaviour::Answer { ms: 9_000 }],
        },
        Spec {
            name: "fallback",
            honours_keys: true,
            script: vec![Behaviour::Answer { ms: 1_000 }],
        },
    ];
    let Some(bench) = bench(backend, specs, r, |c| c.engine.loser_grace_ms = 30_000).await else {
        return;
    };
    let job = bench.submit("hedged-1").await;
    let (won, attempts) = bench
        .until(&job.id, WAIT, |j, _| j.state == JobState::Succeeded)
        .await;
    let hedge = attempts
        .iter()
        .find(|a| a.kind == AttemptKind::Hedge)
        .unwrap();
    assert_eq!(
        hedge.started_at - job.created_at,
        2_000,
        "the hedge starts at the silence threshold"
    );
    assert_eq!(
        won.updated_at - job.created_at,
        3_000,
        "and wins a second later"
    );
    let (job, attempts) = bench
        .until(&job.id, WAIT, |_, a| {
            a.iter()
                .any(|a| a.kind == AttemptKind::Primary && a.state == AttemptState::Discarded)
        })
        .await;
    let primary = attempts
        .iter()
        .find(|a| a.kind == AttemptKind::Primary)
        .unwrap();
    let hedge = attempts
        .iter()
        .find(|a| a.kind == AttemptKind::Hedge)
        .unwrap();
    assert_eq!(
        (hedge.provider.as_str(), hedge.state),
        ("fallback", AttemptState::Succeeded)
    );
    assert_eq!(job.completed_by.as_deref(), Some(hedge.id.as_str()));
    assert_eq!(job.result, won.result, "the late result changed nothing");
    assert_eq!(job.version, 1);
    assert!(
        primary.output.is_none(),
        "the late result is discarded, not stored"
    );
    assert!(primary.usage.is_some(), "its usage is kept for cost");
    assert_eq!(primary.finished_at.unwrap() - primary.started_at, 9_000);
    let events = bench.store.list_events(&job.id).await.unwrap();
    let race = events
        .iter()
        .find(|e| e.kind == "cas_lost")
        .expect("the race is logged");
    assert_eq!(race.attempt_id.as_deref(), Some(primary.id.as_str()));
    assert_eq!(bench.executions(&job.id, "primary"), 1);
    assert_eq!(bench.executions(&job.id, "fallback"), 1);
    bench.stop();
}

async fn the_lost_response_is_found_by_reconciliation(backend: Backend) {
    let mut r = route("primary", &[]);
    r.max_hedges = 0;
    let specs = vec![Spec {
        name: "primary",
        honours_keys: false,
        script: vec![Behaviour::LostResponse { ms: 500 }],
    }];
    let Some(bench) = bench(backend, specs, r, |_| {}).await else {
        return;
    };
    let job = bench.submit("lost-1").await;
    let (job, attempts) = bench
        .until(&job.id, WAIT, |j, _| j.state == JobState::Succeeded)
        .await;
    assert_eq!(attempts.len(), 1, "never retried: {attempts:?}");
    assert_eq!(attempts[0].state, AttemptState::Succeeded);
    assert_eq!(job.completed_by.as_deref(), Some(attempts[0].id.as_str()));
    assert_eq!(
        bench.executions(&job.id, "primary"),
        1,
        "exactly one execution for the key"
    );
    let kinds: Vec<String> = bench
        .store
        .list_events(&job.id)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind.to_string())
        .collect();
    assert!(kinds.contains(&"attempt_unknown".to_string()), "{kinds:?}");
    bench.stop();
}

/// What a process that died mid-attempt leaves behind, made through the store.
/// What a process leaves behind: a job created at `created_at` with lease
/// `lease`, and a started attempt of `kind` on `provider` (its id).
struct LeftBehind<'a> {
    key: &'a str,
    content: &'a str,
    created_at: Millis,
    lease: Option<(String, Millis)>,
    provider: &'a str,
    kind: AttemptKind,
    max_hedges: i64,
    started_at: Millis,
}

impl LeftBehind<'_> {
    /// Write the job (if `job_id` is `None`) and the attempt; the job's id
    /// and the attempt's.
    async fn write(&self, store: &SyncStore, job_id: Option<&JobId>) -> (JobId, AttemptId) {
        use onejob::domain::attempt::NewAttempt;
        use onejob::domain::job::NewJob;
        let job_id = match job_id {
            Some(id) => id.clone(),
            None => {
                let request = serde_json::json!({
                    "messages": [{"content": self.content, "role": "user"}],
                    "params": {},
                    "route": "default",
                })
                .to_string();
                let job = NewJob {
                    id: JobId::new(),
                    owner_id: OWNER.into(),
                    idempotency_key: self.key.into(),
                    fingerprint: "f".into(),
                    request,
                    route: "default".into(),
                    created_at: self.created_at,
                    lease: self.lease.clone(),
                    key_id: None,
                    primary: None,
                };
                let id = job.id.clone();
                store.create_job(job).await.unwrap();
                id
            }
        };
        let attempt = store
            .start_attempt(NewAttempt {
                id: AttemptId::new(),
                job_id: job_id.clone(),
                provider: self.provider.into(),
                kind: self.kind,
                max_hedges: self.max_hedges,
                reuses_key: false,
                started_at: self.started_at,
            })
            .await
            .unwrap()
            .unwrap();
        (job_id, attempt.id)
    }
}

async fn orphaned_attempt(bench: &Bench, key: &str, finished: bool) -> (JobId, AttemptId) {
    use onejob::store::{AttemptOutcome, FinishAttempt, JobTransition};
    let now = bench.clock.now_ms();
    let mut left = LeftBehind {
        key,
        content: "orphan",
        created_at: now - 10_000,
        // Held by a process that is gone; it runs out a minute from now.
        lease: Some(("dead-process".into(), now + 60_000)),
        provider: "primary",
        kind: AttemptKind::Primary,
        max_hedges: 1,
        started_at: now - 5_000,
    };
    let (job_id, orphan) = left.write(&bench.store, None).await;
    if finished {
        // Another attempt won; the orphan was a loser in its grace period.
        (left.provider, left.kind) = ("fallback", AttemptKind::Hedge);
        let (_, hedge) = left.write(&bench.store, Some(&job_id)).await;
        let won = AttemptOutcome::succeeded("\"done\"");
        let finish = FinishAttempt {
            attempt_id: hedge,
            outcome: won,
            at: now - 4_000,
            actor: "engine".into(),
        };
        bench.store.finish_attempt(finish).await.unwrap();
    } else {
        // Parked while its attempt was live (a lost write left it `started`).
        assert!(bench
            .store
            .transition_job(&job_id, None, JobTransition::BlockOnUnknown, now - 4_000)
            .await
            .unwrap());
    }
    (job_id, orphan)
}

async fn attempts_no_process_drives_are_recovered(backend: Backend) {
    let mut r = route("primary", &["fallback"]);
    r.silence_ms = 10_000;
    r.attempt_timeout_ms = 30_000;
    r.max_hedges = 0;
    let specs = vec![
        Spec {
            name: "primary",
            honours_keys: false,
            script: vec![],
        },
        Spec {
            name: "fallback",
            honours_keys: false,
            script: vec![],
        },
    ];
    let Some(bench) = bench(backend, specs, r, |c| c.engine.lease_margin_ms = 5_000).await else {
        return;
    };
    let longest_lease = 10_000 + 30_000 + 5_000;
    let (parked, parked_attempt) = orphaned_attempt(&bench, "orphan-parked", false).await;
    let (finished, finished_attempt) = orphaned_attempt(&bench, "orphan-finished", true).await;
    let set_up = bench.clock.now_ms();

    // Unknown (it may have reached the provider), reconciled (it did not), retried.
    let (job, attempts) = bench
        .until(&parked, WAIT, |j, _| j.state == JobState::Succeeded)
        .await;
    assert_eq!(attempts[0].id, parked_attempt);
    assert_eq!(
        (
            attempts[0].state,
            attempts[0].error_kind.as_ref().map(|k| k.as_str())
        ),
        (AttemptState::Failed, Some("not_executed"))
    );
    assert_eq!(job.completed_by.as_deref(), Some(attempts[1].id.as_str()));
    assert!(
        attempts[1].started_at >= set_up - 5_000 + longest_lease,
        "nothing was done while a lease could still be held"
    );
    let kinds: Vec<String> = bench
        .store
        .list_events(&parked)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.kind.to_string())
        .collect();
    assert!(kinds.contains(&"attempt_unknown".to_string()), "{kinds:?}");

    // On a finished job it is abandoned; the job's result is untouched.
    let (job, attempts) = bench
        .until(&finished, WAIT, |_, a| {
            a[0].state == AttemptState::Discarded
        })
        .await;
    assert_eq!(attempts[0].id, finished_attempt);
    assert_eq!(
        attempts[0].error_kind.as_ref().map(|k| k.as_str()),
        Some("abandoned")
    );
    assert_eq!((job.result.as_deref(), job.version), (Some("\"done\""), 1));
    bench.stop();
}

/// Over a page (200) of unknown attempts that no provider can settle —
/// their jobs wait in review for a human — sit at the front of the
/// reconciler's list. A newer unknown attempt behind them is still asked
/// about and settled: the reconciler walks the list in pages instead of
/// reading its first page forever.
async fn unknowns_nobody_can_settle_do_not_starve_the_rest(backend: Backend) {
    use onejob::store::{AttemptOutcome, FinishAttempt, JobTransition};
    let mut r = route("primary", &[]);
    r.max_hedges = 0;
    let specs = vec![Spec {
        name: "primary",
        honours_keys: false,
        script: vec![],
    }];
    let Some(bench) = bench(backend, specs, r, |_| {}).await else {
        return;
    };
    let now = bench.clock.now_ms();
    // `provider` "retired" is no longer configured: the reconciler cannot tell.
    let unknown_job = |key: String, provider: &'static str, age: Millis| {
        let store = bench.store.clone();
        async move {
            let left = LeftBehind {
                key: &key,
                content: "unknown",
                created_at: now - age,
                lease: None,
                provider,
                kind: AttemptKind::Primary,
                max_hedges: 0,
                started_at: now - age,
            };
            let (job_id, attempt) = left.write(&store, None).await;
            let end = AttemptOutcome::unknown("timeout".into(), "no answer");
            let finish = FinishAttempt {
                attempt_id: attempt.clone(),
                outcome: end,
                at: now - age + 1,
                actor: "engine".into(),
            };
            store.finish_attempt(finish).await.unwrap();
            (job_id, attempt)
        }
    };
    for i in 0..205 {
        let (job_id, _) = unknown_job(format!("retired-{i}"), "retired", 100_000 - i).await;
        let review = JobTransition::Review {
            reason: "nobody can say".into(),
        };
        assert!(bench
            .store
            .transition_job(&job_id, None, review, now)
            .await
            .unwrap());
    }
    let (behind, attempt) = unknown_job("behind".into(), "primary", 50_000).await;
    assert!(bench
        .store
        .transition_job(&behind, None, JobTransition::BlockOnUnknown, now)
        .await
        .unwrap());

    // The primary never executed the key: the attempt fails as not
    // executed and the job runs again and succeeds.
    let (job, attempts) = bench
        .until(&behind, Duration::from_secs(10), |j, _| {
            j.state == JobState::Succeeded
        })
        .await;
    assert_eq!(attempts[0].id, attempt);
    assert_eq!(
        (
            attempts[0].state,
            attempts[0].error_kind.as_ref().map(|k| k.as_str())
        ),
        (AttemptState::Failed, Some("not_executed"))
    );
    assert_eq!(job.completed_by.as_deref(), Some(attempts[1].id.as_str()));
    bench.stop();
}
