//! What a seed makes: the instances, the providers and their temper, the
//! route and engine settings, the jobs and their clicks (duplicate submits,
//! a conflicting body, retries, cancels), and the kills and restarts.

use super::provider::{Kind, Temper};
use onejob::config::RouteConfig;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[derive(Debug, Clone)]
pub struct ProviderPlan {
    pub name: String,
    pub honours_keys: bool,
    pub can_look_up: bool,
    pub temper: Temper,
}

#[derive(Debug, Clone)]
pub struct Click {
    pub at_ms: u64,
    /// Which instance the client reaches (the next live one if it is down).
    pub instance: usize,
    pub what: ClickKind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ClickKind {
    /// Submit the job's body with its key (the first one creates; the
    /// rest are double clicks and client retries).
    Submit,
    /// The same key with another body: must be a conflict.
    Conflict,
    /// `POST /retry`.
    Retry,
    /// `POST /cancel`.
    Cancel,
}

#[derive(Debug, Clone)]
pub struct JobPlan {
    pub key: String,
    pub text: String,
    pub clicks: Vec<Click>,
}

#[derive(Debug, Clone, Copy)]
pub enum KillAt {
    /// At this virtual time.
    Time(u64),
    /// At the instance's n-th store call: before it reaches the database,
    /// or right after it committed (the caller never hears).
    StoreCall { n: u64, after_commit: bool },
}

#[derive(Debug, Clone)]
pub struct Kill {
    pub instance: usize,
    pub at: KillAt,
    /// A new process (new engine, same database) starts this long after.
    pub restart_after_ms: Option<u64>,
}

#[derive(Debug, Clone)]
pub struct EngineTuning {
    pub poll_interval_ms: u64,
    pub reconcile_interval_ms: u64,
    pub reconcile_min_age_ms: u64,
    pub lease_margin_ms: u64,
    pub loser_grace_ms: u64,
    pub breaker_threshold: u32,
    pub breaker_open_ms: u64,
    pub breaker_probe_every: u32,
}

/// A database error an instance's connection sees (`store::faulty`).
#[derive(Debug, Clone)]
pub struct StoreFault {
    pub instance: usize,
    pub at_ms: u64,
    pub what: FaultKind,
}

#[derive(Debug, Clone)]
pub enum FaultKind {
    /// The next `n` calls of `method` fail: before reaching the database,
    /// or after committing (the answer is lost).
    FailNext {
        method: &'static str,
        n: usize,
        after_commit: bool,
    },
    /// Every call fails for this long (a blip).
    Down { for_ms: u64 },
}

#[derive(Debug, Clone)]
pub struct Scenario {
    pub seed: u64,
    pub instances: usize,
    pub providers: Vec<ProviderPlan>,
    pub route: RouteConfig,
    pub engine: EngineTuning,
    pub jobs: Vec<JobPlan>,
    pub kills: Vec<Kill>,
    pub faults: Vec<StoreFault>,
}

impl Scenario {
    pub fn from_seed(seed: u64) -> Scenario {
        let mut rng = StdRng::seed_from_u64(seed);
        let instances = rng.gen_range(1..=3);
        let names = ["alpha", "beta", "gamma"];
        let n_providers = rng.gen_range(1..=3);
        let providers: Vec<ProviderPlan> = names[..n_providers]
            .iter()
            .map(|name| ProviderPlan {
                name: name.to_string(),
                honours_keys: rng.gen_bool(0.4),
                can_look_up: rng.gen_bool(0.7),
                temper: temper(&mut rng),
            })
            .collect();
        let silence_ms = rng.gen_range(50..=400);
        let route = RouteConfig {
            primary: providers[0].name.clone(),
            fallbacks: providers[1..].iter().map(|p| p.name.clone()).collect(),
            silence_ms,
            attempt_timeout_ms: silence_ms * rng.gen_range(2..=5),
            max_hedges: rng.gen_range(0..=2),
            max_attempts: rng.gen_range(2..=5),
            same_provider_retries: rng.gen_range(0..=2),
            backoff_base_ms: rng.gen_range(5..=100),
            backoff_cap_ms: rng.gen_range(100..=1_000),
            unknown_deadline_ms: rng.gen_range(1_000..=4_000),
            stall_ms: 10_000,
            ..RouteConfig::builtin_default()
        };
        let engine = EngineTuning {
            poll_interval_ms: rng.gen_range(50..=400),
            reconcile_interval_ms: rng.gen_range(100..=800),
            reconcile_min_age_ms: rng.gen_range(0..=400),
            lease_margin_ms: rng.gen_range(100..=1_500),
            loser_grace_ms: rng.gen_range(0..=800),
            breaker_threshold: rng.gen_range(2..=6),
            breaker_open_ms: rng.gen_range(200..=3_000),
            breaker_probe_every: rng.gen_range(1..=4),
        };
        let n_jobs = rng.gen_range(1..=6);
        let jobs = (0..n_jobs)
            .map(|j| {
                let first = rng.gen_range(0..=1_500);
                let mut clicks = vec![Click {
                    at_ms: first,
                    instance: rng.gen_range(0..instances),
                    what: ClickKind::Submit,
                }];
                for _ in 0..rng.gen_range(0..=3) {
                    // Double clicks (same instant or soon) and client retries (later).
                    let later = if rng.gen_bool(0.5) {
                        rng.gen_range(0..=5)
                    } else {
                        rng.gen_range(0..=3_000)
                    };
                    clicks.push(Click {
                        at_ms: first + later,
                        instance: rng.gen_range(0..instances),
                        what: ClickKind::Submit,
                    });
                }
                let mut extra = |what, p: f64, rng: &mut StdRng| {
                    if rng.gen_bool(p) {
                        clicks.push(Click {
                            at_ms: first + rng.gen_range(0..=3_000),
                            instance: rng.gen_range(0..instances),
                            what,
                        });
                    }
                };
                extra(ClickKind::Conflict, 0.15, &mut rng);
                extra(ClickKind::Retry, 0.2, &mut rng);
                extra(ClickKind::Cancel, 0.1, &mut rng);
                clicks.sort_by_key(|c| c.at_ms);
                JobPlan {
                    key: format!("order-{j}"),
                    text: format!("summarise order {j}"),
                    clicks,
                }
            })
            .collect();
        let kills = (0..rng.gen_range(0..=2))
            .map(|_| Kill {
                instance: rng.gen_range(0..instances),
                at: if rng.gen_bool(0.5) {
                    KillAt::Time(rng.gen_range(0..=3_000))
                } else {
                    KillAt::StoreCall {
                        n: rng.gen_range(1..=40),
                        after_commit: rng.gen_bool(0.5),
                    }
                },
                restart_after_ms: rng.gen_bool(0.7).then(|| rng.gen_range(0..=2_000)),
            })
            .collect();
        Scenario {
            seed,
            instances,
            providers,
            route,
            engine,
            jobs,
            kills,
            faults: Vec::new(),
        }
    }

    /// The same scenario with database errors added (drawn from another
    /// stream of the seed, so the rest is unchanged).
    pub fn with_store_faults(seed: u64) -> Scenario {
        let mut scenario = Scenario::from_seed(seed);
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
        const METHODS: [&str; 8] = [
            "create_job",
            "start_attempt",
            "finish_attempt",
            "transition_job",
            "claim_jobs",
            "get_job",
            "list_attempts",
            "renew_lease",
        ];
        scenario.faults = (0..rng.gen_range(1..=3))
            .map(|_| StoreFault {
                instance: rng.gen_range(0..scenario.instances),
                at_ms: rng.gen_range(0..=3_000),
                what: if rng.gen_bool(0.7) {
                    FaultKind::FailNext {
                        method: METHODS[rng.gen_range(0..METHODS.len())],
                        n: rng.gen_range(1..=3),
                        after_commit: rng.gen_bool(0.4),
                    }
                } else {
                    FaultKind::Down {
                        for_ms: rng.gen_range(50..=1_000),
                    }
                },
            })
            .collect();
        scenario
    }
}

/// A provider's character: mostly healthy, flaky, slow, lossy or down.
fn temper(rng: &mut StdRng) -> Temper {
    use Kind::*;
    let weights = match rng.gen_range(0..5) {
        // healthy
        0 => vec![(Answer, 20), (Unavailable, 1)],
        // flaky: every kind of trouble now and then
        1 => vec![
            (Answer, 10),
            (Silence, 1),
            (LostResponse, 2),
            (ResetNotExecuted, 2),
            (Cut, 1),
            (RateLimited, 2),
            (Unavailable, 2),
            (Reject, 1),
        ],
        // lossy: answers are lost or cut after executing
        2 => vec![(Answer, 4), (LostResponse, 3), (Cut, 2), (Silence, 1)],
        // refusing: 429s and 5xx
        3 => vec![(Answer, 3), (RateLimited, 3), (Unavailable, 3), (Reject, 1)],
        // down or black-holed
        _ => vec![(Silence, 3), (Unavailable, 2), (ResetNotExecuted, 2)],
    };
    let slow = rng.gen_bool(0.3);
    let latency = if slow { (200, 3_000) } else { (5, 300) };
    Temper { weights, latency }
}
