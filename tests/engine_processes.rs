//! The engine across real `onejob serve` processes: a server killed with
//! SIGKILL mid-flight loses nothing and runs nothing twice once another
//! takes over its jobs; three servers on one PostgreSQL database share the
//! work and still make one job, and one execution, per key.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::procs::{count, until_jobs, Process, ServeConfig};
use common::world::{distrust_keys_in, provider_dir, ProviderSpec};
use common::{chat_body, postgres_admin_url, Backend, TestDb};
use futures::StreamExt;
use onejob::clock::SystemClock;
use onejob::domain::JobId;
use onejob::domain::{AttemptKind, AttemptState, JobState};
use onejob::providers::stable_key;
use onejob::sim::{SimHandle, SimServer};
use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

on_both_backends!(
    a_server_killed_mid_flight_loses_nothing_and_runs_nothing_twice,
    every_201_survives_a_kill_the_moment_it_arrives,
);

/// `POST /v1/jobs` to `address`; the status and the job id answered. A
/// `503 store_unavailable` (the shared database busy for a moment) is
/// retried with the same key, as its `x-should-retry: true` tells a client.
async fn submit(
    client: &reqwest::Client,
    address: &str,
    api_key: &str,
    idempotency_key: &str,
) -> (u16, String) {
    let mut tries = 0;
    let response = loop {
        let response = client
            .post(format!("{address}/v1/jobs"))
            .bearer_auth(api_key)
            .header("Idempotency-Key", idempotency_key)
            .json(&chat_body(idempotency_key))
            .send()
            .await
            .unwrap();
        tries += 1;
        if response.status() != 503 || tries == 10 {
            break response;
        }
        assert_eq!(response.headers()["x-should-retry"], "true");
        // A client's backoff, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let status = response.status().as_u16();
    let body: serde_json::Value = response.json().await.unwrap();
    let id = body["id"]
        .as_str()
        .unwrap_or_else(|| panic!("no job id in {body}"))
        .to_string();
    (status, id)
}

/// What the simulator saw for a job's key at `provider`.
fn executions(sim: &SimHandle, job_id: &str, provider: &str) -> u64 {
    sim.ledger()
        .executions(&stable_key(&JobId::from(job_id), provider))
}

fn deliveries(sim: &SimHandle, job_id: &str, provider: &str) -> u64 {
    sim.ledger()
        .deliveries(&stable_key(&JobId::from(job_id), provider))
}

const JOBS: usize = 500;

async fn a_server_killed_mid_flight_loses_nothing_and_runs_nothing_twice(backend: Backend) {
    let began = Instant::now();
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let providers = provider_dir(
        &[
            ProviderSpec {
                name: "primary",
                model: "healthy:latency=300",
            },
            ProviderSpec {
                name: "fallback",
                model: "healthy:latency=300",
            },
        ],
        &sim.base_url(),
    );
    // Neither honours keys: an orphan found `unknown` after the kill blocks
    // re-sending there, so every key reaches each provider at most once.
    // (A provider that honours keys may be sent the same key again.)
    distrust_keys_in(providers.path(), "primary");
    distrust_keys_in(providers.path(), "fallback");
    let dir = tempfile::tempdir().unwrap();
    // Lease = 800 + 1000 + 1000 ms. Fifty jobs driven at once keep a few
    // hundred waiting, so the kill finds attempts in flight and jobs not begun.
    // A short margin is safe here: one process lives at a time, and a
    // process never drives a job twice itself, so a lease that runs out
    // under a busy machine only lets B start sooner after the kill.
    let config = ServeConfig {
        providers_dir: providers.path(),
        primary: "primary",
        fallbacks: &["fallback"],
        silence_ms: 800,
        attempt_timeout_ms: 1_000,
        max_attempts: 4,
        max_concurrent_jobs: Some(50),
        lease_margin_ms: Some(1_000),
    }
    .write(dir.path());
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let api_key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let a = Process::serve(&db, Some(&config));

    let client = reqwest::Client::new();
    let answers: Vec<(u16, String)> = futures::stream::iter(0..JOBS)
        .map(|i| {
            let (client, address, api_key) = (&client, &a.address, &api_key);
            async move { submit(client, address, api_key, &format!("crash-{i}")).await }
        })
        .buffer_unordered(50)
        .collect()
        .await;
    assert!(answers.iter().all(|(s, _)| *s == 201), "every job is new");
    let ids: HashSet<String> = answers.into_iter().map(|(_, id)| id).collect();
    assert_eq!(ids.len(), JOBS);
    let submitted = began.elapsed();

    let (jobs_at_kill, attempts_at_kill) =
        until_jobs(&db, Duration::from_secs(30), "work under way", |j, a| {
            count(j, "succeeded") >= 50 && count(a, "started") >= 20
        })
        .await;
    a.kill();
    let killed = began.elapsed();
    eprintln!("killed A at {killed:?}: jobs {jobs_at_kill:?}, attempts {attempts_at_kill:?}");

    let b = Process::serve(&db, Some(&config));
    let (jobs_at_end, attempts_at_end) =
        until_jobs(&db, Duration::from_secs(60), "every job settled", |j, _| {
            count(j, "succeeded") + count(j, "needs_review") == JOBS as i64
        })
        .await;
    let settled = began.elapsed();
    eprintln!("all settled at {settled:?}: jobs {jobs_at_end:?}, attempts {attempts_at_end:?}");

    assert_eq!(store.count_jobs().await.unwrap(), JOBS as i64);
    let mut recovered = 0;
    let mut reconciled_found = 0;
    let mut reconciled_not_executed = 0;
    let mut retried = 0;
    let mut hedged = 0;
    for id in &ids {
        let job = store
            .get_job(&JobId::from(id))
            .await
            .unwrap()
            .expect("the job exists");
        let attempts = store.list_attempts(&JobId::from(id)).await.unwrap();
        assert!(
            matches!(job.state, JobState::Succeeded | JobState::NeedsReview),
            "job {id} is {:?}",
            job.state
        );
        let has_hedge = attempts.iter().any(|a| a.kind == AttemptKind::Hedge);
        hedged += usize::from(has_hedge);
        for provider in ["primary", "fallback"] {
            assert!(
                executions(&sim, id, provider) <= 1,
                "job {id} executed twice on {provider}"
            );
            // The simulator replays a key without executing again, so a
            // second send would not show as an execution: count sends too.
            // Nothing in this healthy world calls for sending a key twice.
            assert!(
                deliveries(&sim, id, provider) <= 1,
                "job {id} was sent twice to {provider}: {attempts:?}"
            );
        }
        if executions(&sim, id, "primary") == 1 && executions(&sim, id, "fallback") == 1 {
            assert!(
                has_hedge,
                "job {id} executed on both providers without a hedge: {attempts:?}"
            );
        }
        // An orphan found executed keeps kind `driver_lost`; one found never
        // executed becomes `not_executed`.
        let lost = |kind: &str| {
            attempts
                .iter()
                .filter(|a| a.error_kind.as_ref().map(|k| k.as_str()) == Some(kind))
                .count()
        };
        let (found, not_found) = (lost("driver_lost"), lost("not_executed"));
        recovered += usize::from(found + not_found > 0);
        reconciled_found += found;
        reconciled_not_executed += not_found;
        retried += usize::from(attempts.iter().any(|a| a.kind == AttemptKind::Retry));
        if job.state == JobState::Succeeded {
            let winners: Vec<_> = attempts
                .iter()
                .filter(|a| a.state == AttemptState::Succeeded)
                .collect();
            assert_eq!(winners.len(), 1, "job {id}: {attempts:?}");
            assert_eq!(job.completed_by.as_deref(), Some(winners[0].id.as_str()));
            assert_eq!(
                executions(&sim, id, &winners[0].provider),
                1,
                "the winner's provider executed job {id}"
            );
        }
    }
    let review = count(&jobs_at_end, "needs_review");
    eprintln!(
        "{backend:?}: submitted in {submitted:?}, killed at {killed:?}, settled at {settled:?}; \
         {recovered} jobs recovered from A's orphaned attempts ({reconciled_found} found \
         executed by reconciliation, {reconciled_not_executed} never executed), {retried} \
         retried, {hedged} hedged, {review} in review"
    );
    assert!(
        recovered > 0,
        "the kill left attempts in flight for B to recover"
    );
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_servers_on_one_postgres_share_the_work_and_make_one_job_per_key() {
    if postgres_admin_url().is_none() {
        return;
    }
    const KEYS: usize = 500;
    let began = Instant::now();
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let providers = provider_dir(
        &[ProviderSpec {
            name: "primary",
            model: "healthy:latency=5",
        }],
        &sim.base_url(),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = ServeConfig {
        providers_dir: providers.path(),
        primary: "primary",
        fallbacks: &[],
        silence_ms: 2_000,
        attempt_timeout_ms: 5_000,
        max_attempts: 4,
        max_concurrent_jobs: None,
        lease_margin_ms: None,
    }
    .write(dir.path());
    let db = TestDb::new(Backend::Postgres).await;
    let store = db.store().await;
    let api_key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let servers: Vec<Process> = (0..3).map(|_| Process::serve(&db, Some(&config))).collect();

    // Request n goes to server n % 3; a key's two copies are requests 2i and
    // 2i + 1, so they always land on different servers, at the same time.
    let client = reqwest::Client::new();
    let answers: Vec<(usize, u16, String)> = futures::stream::iter(0..2 * KEYS)
        .map(|n| {
            let (client, api_key) = (&client, &api_key);
            let address = &servers[n % 3].address;
            async move {
                let (status, id) =
                    submit(client, address, api_key, &format!("shared-{}", n / 2)).await;
                (n / 2, status, id)
            }
        })
        .buffer_unordered(100)
        .collect()
        .await;
    let submitted = began.elapsed();
    let mut per_key: BTreeMap<usize, Vec<(u16, String)>> = BTreeMap::new();
    for (key, status, id) in answers {
        per_key.entry(key).or_default().push((status, id));
    }
    assert_eq!(per_key.len(), KEYS);
    for (key, answers) in &per_key {
        let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
        let ids: HashSet<&String> = answers.iter().map(|(_, id)| id).collect();
        assert_eq!(
            ids.len(),
            1,
            "key {key}: one job for both copies: {answers:?}"
        );
        assert!(
            statuses.contains(&201) && statuses.contains(&200),
            "key {key}: one copy created the job, the other replayed it: {statuses:?}"
        );
    }
    assert_eq!(store.count_jobs().await.unwrap(), KEYS as i64);

    let (jobs, attempts) = until_jobs(
        &db,
        Duration::from_secs(60),
        "every job succeeded",
        |j, _| count(j, "succeeded") == KEYS as i64,
    )
    .await;
    let settled = began.elapsed();
    let mut actors: BTreeMap<String, usize> = BTreeMap::new();
    for (_, answers) in per_key {
        let id = &answers[0].1;
        let job = store.get_job(&JobId::from(id)).await.unwrap().unwrap();
        let attempts = store.list_attempts(&JobId::from(id)).await.unwrap();
        let winners: Vec<_> = attempts
            .iter()
            .filter(|a| a.state == AttemptState::Succeeded)
            .collect();
        assert_eq!(winners.len(), 1, "job {id}: {attempts:?}");
        assert_eq!(job.completed_by.as_deref(), Some(winners[0].id.as_str()));
        assert_eq!(executions(&sim, id, "primary"), 1, "job {id}");
        assert_eq!(deliveries(&sim, id, "primary"), 1, "job {id} sent once");
        let events = store.list_events(&JobId::from(id)).await.unwrap();
        let won = events
            .iter()
            .find(|e| e.kind == "attempt_succeeded")
            .expect("the win is logged");
        *actors.entry(won.actor.clone()).or_default() += 1;
    }
    eprintln!(
        "3 servers: submitted {} requests in {submitted:?}, all succeeded at {settled:?}; \
         jobs {jobs:?}, attempts {attempts:?}; wins per engine {actors:?}",
        2 * KEYS
    );
    assert!(
        actors.keys().all(|a| a.starts_with("engine:")),
        "every win came from an engine: {actors:?}"
    );
    assert!(
        actors.len() > 1,
        "the work was shared between processes: {actors:?}"
    );
    drop(servers);
}

/// Invariant 8 under group commit: forty creates race, the server is killed
/// (SIGKILL) the moment the first `201` reaches the client, and every job
/// answered `201` — that one, and any other whose answer was already on its
/// way — is in the database afterwards. (A process kill keeps what reached
/// the operating system, so this shows that no `201` leaves before its
/// commit; `synchronous=FULL` is what carries a commit through a power cut.)
async fn every_201_survives_a_kill_the_moment_it_arrives(backend: Backend) {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let providers = provider_dir(
        &[ProviderSpec {
            name: "primary",
            model: "healthy:latency=2000",
        }],
        &sim.base_url(),
    );
    let dir = tempfile::tempdir().unwrap();
    let config = ServeConfig {
        providers_dir: providers.path(),
        primary: "primary",
        fallbacks: &[],
        silence_ms: 5_000,
        attempt_timeout_ms: 10_000,
        max_attempts: 4,
        max_concurrent_jobs: None,
        lease_margin_ms: None,
    }
    .write(dir.path());
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let api_key = onejob::keys::create_key(store.as_ref(), &SystemClock, "alice", false)
        .await
        .unwrap();
    let server = Process::serve(&db, Some(&config));
    let client = reqwest::Client::new();
    let address = server.address.clone();
    let mut creates: futures::stream::FuturesUnordered<_> = (0..40)
        .map(|i| {
            let request = client
                .post(format!("{address}/v1/jobs"))
                .bearer_auth(&api_key)
                .header("Idempotency-Key", format!("kill-{i}"))
                .json(&chat_body(&format!("kill-{i}")));
            async move {
                let response = request.send().await.ok()?;
                let status = response.status().as_u16();
                let body: serde_json::Value = response.json().await.ok()?;
                Some((status, body["id"].as_str()?.to_string()))
            }
        })
        .collect();
    let mut server = Some(server);
    let mut acknowledged = Vec::new();
    while let Some(answer) = creates.next().await {
        if let Some((201, id)) = answer {
            if let Some(server) = server.take() {
                server.kill();
            }
            acknowledged.push(id);
        }
    }
    assert!(server.is_none(), "no create was answered 201");
    for id in &acknowledged {
        let job = store.get_job(&JobId::from(id)).await.unwrap();
        assert!(
            job.is_some(),
            "job {id} was answered 201 and is not in the database"
        );
    }
    eprintln!(
        "{backend:?}: {} of 40 creates answered 201 before the kill; all found",
        acknowledged.len()
    );
}
