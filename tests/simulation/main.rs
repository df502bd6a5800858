//! Deterministic simulation (issue 9): several engine instances over one
//! real SQLite file, the dispatcher, reconciler, leases and breakers, on
//! tokio's paused clock, against scripted providers (latency, silence,
//! resets, cuts, 429/5xx, lost responses, late answers, keys honoured or
//! not), with clients that double-click, retry and cancel, and instances
//! killed at a chosen time or store call and restarted. One u64 seed fixes
//! the whole run; a failing seed replays exactly:
//!
//! ```sh
//! ONEJOB_SIM_SEED=1234 cargo test --test simulation -- --nocapture  # one seed, with its trace
//! ONEJOB_SIM_SEEDS=5000 cargo test --release --test simulation -- --ignored --nocapture
//! ```
//!
//! After every run the invariants of `docs/design.md` are checked (`check.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod check;
mod hedging;
mod provider;
mod scenario;
mod store;
mod world;

use scenario::Scenario;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use store::run_on;
use tokio::runtime::Runtime;

/// Seeds `cargo test` runs every time.
const SEEDS_IN_CARGO_TEST: u64 = 300;
/// Seeds with database errors `cargo test` runs every time (their first
/// ones: the scenario of each is the plain seed's, with errors added).
const STORE_ERROR_SEEDS_IN_CARGO_TEST: u64 = 100;

/// The runtime the real stores' tasks (SQLite's writers) run on, shared by
/// every run of this binary.
fn store_rt() -> &'static Runtime {
    static RT: OnceLock<Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap()
    })
}

/// A migrated, empty database, copied for each run (migrating takes longer
/// than a whole run). Kept on /dev/shm when there is one: the simulation
/// tests the SQL, not the disk.
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &TEMPLATE
        .get_or_init(|| {
            let dir = scratch_dir();
            let path = dir.path().join("template.db");
            let p = path.clone();
            run_on(store_rt().handle(), async move {
                let store = onejob::store::sqlite::SqliteStore::open(&p).await.unwrap();
                onejob::store::Store::migrate(&store).await.unwrap();
                onejob::store::Store::close(&store).await;
            });
            (dir, path)
        })
        .1
}

fn scratch_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(dir) = tempfile::tempdir_in(shm) {
            return dir;
        }
    }
    tempfile::tempdir().unwrap()
}

/// Run one seed to its end on a fresh current-thread runtime with a paused
/// clock; ids are counted, not random, on this thread meanwhile.
fn run_seed(seed: u64) -> world::Outcome {
    run_scenario(seed, Scenario::from_seed)
}

fn run_scenario(seed: u64, make: fn(u64) -> Scenario) -> world::Outcome {
    let dir = scratch_dir();
    let db = dir.path().join("onejob.db");
    std::fs::copy(template(), &db).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let _ids = onejob::domain::ids_from_counter(u128::from(seed) << 64);
    let scenario = make(seed);
    let outcome = rt.block_on(world::run(scenario, db, store_rt().handle().clone()));
    drop(rt);
    outcome
}

/// Everything a run wrote and did, as text: jobs, attempts and events with
/// their times, what clients saw, what providers were asked.
fn trace(o: &world::Outcome) -> String {
    let mut t = String::new();
    for job in &o.jobs {
        t += &format!("{job:?}\n");
        for a in &o.attempts[&job.id] {
            t += &format!("  {a:?}\n");
        }
        for e in &o.events[&job.id] {
            t += &format!("  {e:?}\n");
        }
    }
    for s in &o.seen {
        t += &format!("{s:?}\n");
    }
    for (name, log) in &o.provider_logs {
        for entry in log.lock().unwrap().iter() {
            t += &format!("{name} {entry:?}\n");
        }
    }
    t += &format!("end at {} ms\n", o.end_ms);
    t
}

/// Run seeds `from..to` of `make`'s scenarios on a few threads (each seed
/// on one thread, so each replays the same); the failures, each with its
/// violations.
fn run_seeds_of(from: u64, to: u64, make: fn(u64) -> Scenario) -> (Vec<(u64, Vec<String>)>, Stats) {
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(1, 4) as u64;
    let parts: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                run_seeds_here((from..to).filter(move |s| s % threads == t), make)
            })
        })
        .collect();
    let mut failures = Vec::new();
    let mut stats = Stats::default();
    for part in parts {
        let (f, s) = part.join().unwrap();
        failures.extend(f);
        stats.merge(s);
    }
    failures.sort_by_key(|(seed, _)| *seed);
    (failures, stats)
}

fn run_seeds_here(
    seeds: impl Iterator<Item = u64>,
    make: fn(u64) -> Scenario,
) -> (Vec<(u64, Vec<String>)>, Stats) {
    let mut failures = Vec::new();
    let mut stats = Stats::default();
    let verbose = std::env::var("ONEJOB_SIM_VERBOSE").is_ok();
    for seed in seeds {
        let t = std::time::Instant::now();
        let outcome = run_scenario(seed, make);
        if verbose {
            println!(
                "seed {seed}: {:?} real, {} ms simulated, {} jobs, {} store calls",
                t.elapsed(),
                outcome.end_ms,
                outcome.jobs.len(),
                outcome.store_calls
            );
        }
        stats.add(&outcome);
        let v = check::violations(&outcome);
        if !v.is_empty() {
            println!("{}", report(&[(seed, v.clone())]));
            failures.push((seed, v));
        }
    }
    (failures, stats)
}

#[derive(Default, Debug)]
struct Stats {
    seeds: u64,
    jobs: u64,
    attempts: u64,
    virtual_ms: u64,
    kills: u64,
    by_state: std::collections::BTreeMap<String, u64>,
}

impl Stats {
    fn merge(&mut self, other: Stats) {
        self.seeds += other.seeds;
        self.jobs += other.jobs;
        self.attempts += other.attempts;
        self.virtual_ms += other.virtual_ms;
        self.kills += other.kills;
        for (k, v) in other.by_state {
            *self.by_state.entry(k).or_default() += v;
        }
    }

    fn add(&mut self, o: &world::Outcome) {
        self.seeds += 1;
        self.jobs += o.jobs.len() as u64;
        self.attempts += o.attempts.values().map(|a| a.len() as u64).sum::<u64>();
        self.virtual_ms += o.end_ms;
        self.kills += o.scenario.kills.len() as u64;
        for j in &o.jobs {
            *self
                .by_state
                .entry(j.state.as_str().to_string())
                .or_default() += 1;
        }
    }
}

fn report(failures: &[(u64, Vec<String>)]) -> String {
    let mut text = String::new();
    for (seed, v) in failures {
        text += &format!(
            "\nseed {seed} broke {} check(s) — replay: ONEJOB_SIM_SEED={seed} cargo test --test simulation -- --nocapture (with ONEJOB_SIM_STORE_FAULTS=1 if it came from seeds_with_store_errors)\n",
            v.len()
        );
        for line in v.iter().take(8) {
            text += &format!("  - {line}\n");
        }
    }
    text
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// Run seeds `from..to` of `make`'s scenarios; print what they did and fail
/// with every failing seed's violations.
fn assert_seeds_keep_the_invariants(what: &str, from: u64, to: u64, make: fn(u64) -> Scenario) {
    let started = std::time::Instant::now();
    let (failures, stats) = run_seeds_of(from, to, make);
    println!("{what} {from}..{to}: {stats:?} in {:?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} of {} {what} failed:{}",
        failures.len(),
        to - from,
        report(&failures)
    );
}

#[test]
fn every_seed_keeps_the_invariants() {
    if let Some(seed) = env_u64("ONEJOB_SIM_SEED") {
        let outcome = if std::env::var("ONEJOB_SIM_STORE_FAULTS").is_ok() {
            run_scenario(seed, Scenario::with_store_faults)
        } else {
            run_seed(seed)
        };
        println!("{:#?}", outcome.scenario);
        println!("{}", trace(&outcome));
        let v = check::violations(&outcome);
        assert!(v.is_empty(), "{}", report(&[(seed, v)]));
        return;
    }
    assert_seeds_keep_the_invariants("seeds", 0, SEEDS_IN_CARGO_TEST, Scenario::from_seed);
}

/// The same scenarios with database errors (`store::faulty`): calls that
/// fail before or after they commit, and the database down for a while.
#[test]
fn every_seed_with_store_errors_keeps_the_invariants() {
    if env_u64("ONEJOB_SIM_SEED").is_some() {
        return; // replayed by `every_seed_keeps_the_invariants`
    }
    assert_seeds_keep_the_invariants(
        "store-error seeds",
        0,
        STORE_ERROR_SEEDS_IN_CARGO_TEST,
        Scenario::with_store_faults,
    );
}

/// The test that says whether the simulation is deterministic: the same
/// seed twice gives the same trace (every row, time and id).
#[test]
fn a_seed_replays_exactly() {
    for seed in [7, 1_000_003, 42_424_242] {
        let first = trace(&run_seed(seed));
        let second = trace(&run_seed(seed));
        if first != second {
            let line = first
                .lines()
                .zip(second.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(0);
            panic!(
                "seed {seed} ran differently twice; first difference at line {line}:\n{}\n{}",
                first.lines().nth(line).unwrap_or(""),
                second.lines().nth(line).unwrap_or("")
            );
        }
        assert!(
            first.contains("attempt_started") || first.lines().count() > 3,
            "the run did something: {first}"
        );
    }
}

/// Many more seeds: `ONEJOB_SIM_SEEDS=N` (default 2,000) starting at
/// `ONEJOB_SIM_FIRST` (default 300, after the ones `cargo test` runs).
#[test]
#[ignore]
fn many_seeds() {
    let first = env_u64("ONEJOB_SIM_FIRST").unwrap_or(SEEDS_IN_CARGO_TEST);
    let n = env_u64("ONEJOB_SIM_SEEDS").unwrap_or(2_000);
    assert_seeds_keep_the_invariants("seeds", first, first + n, Scenario::from_seed);
}

/// Many more seeds with database errors: `ONEJOB_SIM_SEEDS=N` (default
/// 2,000) starting at `ONEJOB_SIM_FIRST` (default: after the ones `cargo
/// test` runs). Replay one with
/// `ONEJOB_SIM_STORE_FAULTS=1 ONEJOB_SIM_SEED=N cargo test --test simulation -- --nocapture`.
#[test]
#[ignore]
fn seeds_with_store_errors() {
    let first = env_u64("ONEJOB_SIM_FIRST").unwrap_or(STORE_ERROR_SEEDS_IN_CARGO_TEST);
    let n = env_u64("ONEJOB_SIM_SEEDS").unwrap_or(2_000);
    assert_seeds_keep_the_invariants(
        "store-error seeds",
        first,
        first + n,
        Scenario::with_store_faults,
    );
}
