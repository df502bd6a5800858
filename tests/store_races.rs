//! The guarded attempt insert (invariant 4) and the compare-and-swap finish
//! (invariant 5) under real concurrency, on both backends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, TestDb};
use onejob::domain::attempt::NewAttempt;
use onejob::domain::job::NewJob;
use onejob::domain::{new_id, AttemptId, AttemptKind, AttemptState, GuardRefusal, JobId, JobState};
use onejob::store::{
    AttemptOutcome, CreateOutcome, FinishAttempt, FinishOutcome, JobTransition, Store,
};
use std::sync::Arc;

on_both_backends!(
    no_retry_starts_while_an_attempt_is_started_or_unknown,
    exactly_one_of_twenty_retries_starts_once_all_attempts_finished,
    reverse_order_finish_lets_the_later_attempt_lose,
    twenty_concurrent_finishes_have_exactly_one_winner,
    a_finished_attempt_cannot_finish_again,
    an_unknown_settled_before_its_driver_blocks_leaves_the_job_runnable,
    a_create_with_its_primary_writes_four_rows_once,
    thirty_concurrent_creates_of_ten_keys_make_ten_jobs_each_written_once,
    forty_concurrent_wins_of_one_owner_add_up_across_shards,
    hedged_jobs_won_at_once_have_one_winner_each_and_pay_for_every_attempt,
    a_providers_nul_is_recorded_not_an_attempt_left_started,
);

async fn new_job(store: &dyn Store) -> JobId {
    let job = NewJob {
        id: JobId::new(),
        owner_id: "alice".into(),
        idempotency_key: new_id(),
        fingerprint: "f".into(),
        request: "{}".into(),
        route: "default".into(),
        created_at: 1,
        lease: None,
        key_id: None,
        primary: None,
    };
    match store.create_job(job).await.unwrap() {
        CreateOutcome::Created(job) => job.id,
        other => panic!("expected a new job, got {other:?}"),
    }
}

/// A new job and its primary attempt, started.
async fn job_with_primary(store: &dyn Store) -> (JobId, onejob::domain::Attempt) {
    let job_id = new_job(store).await;
    let primary = store
        .start_attempt(attempt(&job_id, AttemptKind::Primary, 1))
        .await
        .unwrap()
        .unwrap();
    (job_id, primary)
}

fn attempt(job_id: &JobId, kind: AttemptKind, max_hedges: i64) -> NewAttempt {
    NewAttempt {
        id: AttemptId::new(),
        job_id: job_id.clone(),
        // A hedge goes to a provider with no live attempt of the job (invariant 4).
        provider: if kind == AttemptKind::Hedge {
            "sim-backup"
        } else {
            "sim"
        }
        .into(),
        kind,
        max_hedges,
        reuses_key: false,
        started_at: 2,
    }
}

fn finish(attempt_id: &AttemptId, end: AttemptOutcome) -> FinishAttempt {
    FinishAttempt {
        attempt_id: attempt_id.clone(),
        outcome: end,
        at: 3,
        actor: "engine".into(),
    }
}

fn succeeded(output: &str) -> AttemptOutcome {
    AttemptOutcome::succeeded(output)
}

/// Race `n` retry inserts; returns how many the guard let through.
async fn race_retries(store: &Arc<dyn Store>, job_id: &JobId, n: usize) -> usize {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let store = store.clone();
        let new = attempt(job_id, AttemptKind::Retry, 1);
        tasks.push(tokio::spawn(async move {
            store.start_attempt(new).await.unwrap()
        }));
    }
    let mut started = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => started += 1,
            Err(refusal) => assert_eq!(refusal, GuardRefusal::OutcomeUnknown),
        }
    }
    started
}

async fn no_retry_starts_while_an_attempt_is_started_or_unknown(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let (job_id, primary) = job_with_primary(store.as_ref()).await;

    assert_eq!(
        race_retries(&store, &job_id, 20).await,
        0,
        "primary is started"
    );

    let unknown = AttemptOutcome::unknown("timeout".into(), "no answer in 60s");
    assert_eq!(
        store
            .finish_attempt(finish(&primary.id, unknown))
            .await
            .unwrap(),
        FinishOutcome::Recorded
    );
    assert_eq!(
        race_retries(&store, &job_id, 20).await,
        0,
        "primary is unknown"
    );

    let attempts = store.list_attempts(&job_id).await.unwrap();
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].state, AttemptState::Unknown);
    assert_eq!(
        store.get_job(&job_id).await.unwrap().unwrap().state,
        JobState::Running
    );
}

async fn exactly_one_of_twenty_retries_starts_once_all_attempts_finished(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let (job_id, primary) = job_with_primary(store.as_ref()).await;
    let failed = AttemptOutcome::failed("server_error".into(), "503");
    store
        .finish_attempt(finish(&primary.id, failed))
        .await
        .unwrap();

    assert_eq!(race_retries(&store, &job_id, 20).await, 1);
    let attempts = store.list_attempts(&job_id).await.unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[1].seq, 2);
    assert_eq!(attempts[1].kind, AttemptKind::Retry);
    let job = store.get_job(&job_id).await.unwrap().unwrap();
    assert_eq!(
        (job.attempt_count, job.version),
        (2, 0),
        "starting attempts does not bump the version"
    );
}

async fn reverse_order_finish_lets_the_later_attempt_lose(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let (job_id, a) = job_with_primary(store.as_ref()).await;
    let b = store
        .start_attempt(attempt(&job_id, AttemptKind::Hedge, 1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((a.read_version, b.read_version), (0, 0));
    // A second hedge is over the budget.
    assert_eq!(
        store
            .start_attempt(attempt(&job_id, AttemptKind::Hedge, 1))
            .await
            .unwrap(),
        Err(GuardRefusal::HedgeNotAllowed)
    );

    let won = store
        .finish_attempt(finish(&b.id, succeeded(r#"{"answer":"B"}"#)))
        .await
        .unwrap();
    let FinishOutcome::Won {
        version: 1,
        job: Some(handed),
    } = won
    else {
        panic!("B wins at version 1, with the job as committed: {won:?}");
    };
    let lost = store
        .finish_attempt(finish(&a.id, succeeded(r#"{"answer":"A"}"#)))
        .await
        .unwrap();
    assert_eq!(lost, FinishOutcome::Lost);

    let job = store.get_job(&job_id).await.unwrap().unwrap();
    assert_eq!(
        *handed, job,
        "the winner's outcome carries the job exactly as stored (what a waiter is handed)"
    );
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.result.as_deref(), Some(r#"{"answer":"B"}"#));
    assert_eq!(job.completed_by.as_deref(), Some(b.id.as_str()));
    assert_eq!(job.version, 1);
    let attempts = store.list_attempts(&job_id).await.unwrap();
    assert_eq!(attempts[0].state, AttemptState::Discarded);
    assert_eq!(
        attempts[0].output, None,
        "the late result is discarded, not stored"
    );
    assert_eq!(attempts[1].state, AttemptState::Succeeded);
    let events = store.list_events(&job_id).await.unwrap();
    let lost_race = events
        .iter()
        .find(|e| e.kind == "cas_lost")
        .expect("the race is logged");
    assert_eq!(lost_race.attempt_id.as_deref(), Some(a.id.as_str()));
    assert!(
        lost_race.detail.as_deref().unwrap().contains(b.id.as_str()),
        "{:?}",
        lost_race.detail
    );
}

async fn twenty_concurrent_finishes_have_exactly_one_winner(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let job_id = new_job(store.as_ref()).await;
    let mut ids = vec![
        store
            .start_attempt(attempt(&job_id, AttemptKind::Primary, 1))
            .await
            .unwrap()
            .unwrap()
            .id,
    ];
    for seq in 2..=20 {
        ids.push(common::insert_started_attempt_unguarded(&db, &job_id, seq).await);
    }
    let mut tasks = Vec::new();
    for id in ids {
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let outcome = store
                .finish_attempt(finish(&id, succeeded(&format!("\"{id}\""))))
                .await
                .unwrap();
            (id, outcome)
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        let (id, outcome) = task.await.unwrap();
        match outcome {
            FinishOutcome::Won { version, .. } => winners.push((id, version)),
            FinishOutcome::Lost => {}
            FinishOutcome::Recorded => panic!("a success must win or lose"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner");
    let (winner, version) = &winners[0];
    assert_eq!(*version, 1);
    let job = store.get_job(&job_id).await.unwrap().unwrap();
    assert_eq!(job.completed_by.as_deref(), Some(winner.as_str()));
    assert_eq!(job.result, Some(format!("\"{winner}\"")));
    let attempts = store.list_attempts(&job_id).await.unwrap();
    assert_eq!(
        attempts
            .iter()
            .filter(|a| a.state == AttemptState::Discarded)
            .count(),
        19
    );
    let events = store.list_events(&job_id).await.unwrap();
    assert_eq!(events.iter().filter(|e| e.kind == "cas_lost").count(), 19);
}

async fn a_finished_attempt_cannot_finish_again(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let (job_id, a) = job_with_primary(store.as_ref()).await;
    store
        .finish_attempt(finish(&a.id, succeeded("1")))
        .await
        .unwrap();
    let again = store.finish_attempt(finish(&a.id, succeeded("2"))).await;
    assert!(
        again.is_err(),
        "a finished attempt does not finish again: {again:?}"
    );
    let job = store.get_job(&job_id).await.unwrap().unwrap();
    assert_eq!((job.version, job.result.as_deref()), (1, Some("1")));
}

/// A provider's text with NUL in it (its request id, its error's message
/// and code) is recorded on both databases, the NUL made U+FFFD: on
/// PostgreSQL, whose text cannot hold NUL, the attempt's end was refused
/// and the attempt stayed `started` with its tokens unbilled.
async fn a_providers_nul_is_recorded_not_an_attempt_left_started(backend: Backend) {
    use onejob::domain::attempt::{Failure, Success};
    use onejob::domain::ErrorKind;
    let db = TestDb::new(backend).await;
    let store = db.store().await;

    let (job_id, a) = job_with_primary(store.as_ref()).await;
    let answer = AttemptOutcome::Succeeded(Success {
        provider_request_id: Some("chatcmpl-\0x".into()),
        ..Success::text("\0 in the answer")
    });
    let won = store.finish_attempt(finish(&a.id, answer)).await.unwrap();
    assert!(matches!(won, FinishOutcome::Won { .. }), "{won:?}");
    let row = &store.list_attempts(&job_id).await.unwrap()[0];
    assert_eq!(row.state, AttemptState::Succeeded);
    assert_eq!(
        row.provider_request_id.as_deref(),
        Some("chatcmpl-\u{FFFD}x")
    );
    let job = store.get_job(&job_id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Succeeded);
    assert_eq!(job.result.as_deref(), Some("\u{FFFD} in the answer"));

    let (job_id, a) = job_with_primary(store.as_ref()).await;
    let refused = AttemptOutcome::Failed(Failure {
        retryable: false,
        retry_after: None,
        kind: ErrorKind::Other("bad\0code".into()),
        message: "bad \0 input".into(),
        status: Some(400),
    });
    store.finish_attempt(finish(&a.id, refused)).await.unwrap();
    let row = &store.list_attempts(&job_id).await.unwrap()[0];
    assert_eq!(row.state, AttemptState::Failed);
    assert_eq!(row.error_message.as_deref(), Some("bad \u{FFFD} input"));
    assert_eq!(
        row.error_kind.as_ref().map(|k| k.as_str().to_string()),
        Some("bad\u{FFFD}code".to_string())
    );
}

/// The lost wake-up: a driver records an attempt `unknown`; before it
/// records that the job must wait for it, the reconciler settles the attempt
/// as never executed and wakes the job, which is a no-op while the driver
/// still holds it. The driver's block then comes second: it must leave the
/// job runnable, not waiting on an attempt that is no longer live.
async fn an_unknown_settled_before_its_driver_blocks_leaves_the_job_runnable(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let job = NewJob {
        id: JobId::new(),
        owner_id: "alice".into(),
        idempotency_key: new_id(),
        fingerprint: "f".into(),
        request: "{}".into(),
        route: "default".into(),
        created_at: 1,
        lease: Some(("driver".into(), 1_000)),
        key_id: None,
        primary: None,
    };
    let CreateOutcome::Created(job) = store.create_job(job).await.unwrap() else {
        panic!("expected a new job");
    };
    let first = store
        .start_attempt(attempt(&job.id, AttemptKind::Primary, 0))
        .await
        .unwrap()
        .unwrap();
    let unknown = AttemptOutcome::unknown("attempt_timeout".into(), "no answer");
    store
        .finish_attempt(finish(&first.id, unknown))
        .await
        .unwrap();
    // The reconciler: not executed, wake the job.
    let not_executed = AttemptOutcome::failed("not_executed".into(), "no record of the key");
    store
        .finish_attempt(finish(&first.id, not_executed))
        .await
        .unwrap();
    store.wake_job(&job.id, 4).await.unwrap();
    // The driver, second.
    store
        .transition_job(&job.id, Some("driver"), JobTransition::BlockOnUnknown, 5)
        .await
        .unwrap();
    let claimed = store
        .claim_jobs("other", 6, 10_000, 10, false)
        .await
        .unwrap();
    assert_eq!(
        claimed.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        [job.id.as_str()],
        "with nothing live the job goes on: {:?}",
        store.get_job(&job.id).await.unwrap()
    );
    let retry = store
        .start_attempt(attempt(&job.id, AttemptKind::Retry, 0))
        .await
        .unwrap();
    assert!(retry.is_ok(), "{retry:?}");
}

/// Create, claim and the primary's start in one step (one statement on
/// PostgreSQL, four on SQLite): the job `running` under its lease, its
/// attempt `started`, and the events `created` then `attempt_started`, in
/// that order. Twenty more creates with the same key, at once, write
/// nothing and answer the job as stored.
async fn a_create_with_its_primary_writes_four_rows_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store: Arc<dyn Store> = db.store().await;
    let id = JobId::new();
    let mut primary = attempt(&id, AttemptKind::Primary, 0);
    primary.started_at = 7;
    let job = NewJob {
        id: id.clone(),
        owner_id: "alice".into(),
        idempotency_key: "click-1".into(),
        fingerprint: "f".into(),
        request: "{}".into(),
        route: "default".into(),
        created_at: 7,
        lease: Some(("driver".into(), 1_000)),
        key_id: None,
        primary: Some(primary.clone()),
    };
    let CreateOutcome::Created(created) = store.create_job(job.clone()).await.unwrap() else {
        panic!("a new key creates");
    };
    assert_eq!(
        (created.state, created.attempt_count),
        (JobState::Running, 1)
    );
    let again: Vec<_> = (0..20)
        .map(|i| {
            let (store, mut job) = (store.clone(), job.clone());
            job.id = format!("other-{i}").into();
            tokio::spawn(async move { store.create_job(job).await.unwrap() })
        })
        .collect();
    for create in again {
        match create.await.unwrap() {
            CreateOutcome::Existing(existing) => assert_eq!(existing.id, id),
            CreateOutcome::Created(other) => panic!("the key created twice: {other:?}"),
        }
    }
    let stored = store.get_job(&id).await.unwrap().unwrap();
    assert_eq!(
        (
            stored.state,
            stored.lease_owner.as_deref(),
            stored.lease_until,
            stored.attempt_count
        ),
        (JobState::Running, Some("driver"), Some(1_000), 1)
    );
    let attempts = store.list_attempts(&id).await.unwrap();
    assert_eq!(attempts.len(), 1, "{attempts:?}");
    assert_eq!(
        (
            attempts[0].id.as_str(),
            attempts[0].seq,
            attempts[0].state,
            attempts[0].read_version,
            attempts[0].started_at
        ),
        (primary.id.as_str(), 1, AttemptState::Started, 0, 7)
    );
    let events = store.list_events(&id).await.unwrap();
    let seen: Vec<_> = events
        .iter()
        .map(|e| {
            (
                e.kind.as_str(),
                e.attempt_id.as_deref(),
                e.actor.as_str(),
                e.at,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            ("created", None, "alice", 7),
            ("attempt_started", Some(primary.id.as_str()), "engine", 7)
        ]
    );
    let detail: serde_json::Value =
        serde_json::from_str(events[1].detail.as_deref().unwrap()).unwrap();
    assert_eq!(
        detail,
        serde_json::json!({"provider": primary.provider, "kind": "primary", "seq": 1, "read_version": 0})
    );
    assert_eq!(
        store.count_jobs().await.unwrap(),
        1,
        "no other job was written"
    );
}

/// Ten keys, each sent three times at once (thirty creates in flight
/// together, so PostgreSQL batches them, with a key more than once in one
/// statement): ten jobs, each created by exactly one of its three, the
/// other two answered with that job; each job with its one attempt and
/// its two events in order, and nothing else written.
async fn thirty_concurrent_creates_of_ten_keys_make_ten_jobs_each_written_once(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store: Arc<dyn Store> = db.store().await;
    let creates: Vec<_> = (0..30)
        .map(|i| {
            let store = store.clone();
            let id = JobId::new();
            let mut primary = attempt(&id, AttemptKind::Primary, 0);
            primary.started_at = 100 + i;
            let job = NewJob {
                id: id.clone(),
                owner_id: "alice".into(),
                idempotency_key: format!("click-{}", i % 10),
                fingerprint: "f".into(),
                request: "{}".into(),
                route: "default".into(),
                created_at: 100 + i,
                lease: Some(("driver".into(), 1_000)),
                key_id: None,
                primary: Some(primary),
            };
            tokio::spawn(async move {
                (
                    job.idempotency_key.clone(),
                    id,
                    store.create_job(job).await.unwrap(),
                )
            })
        })
        .collect();
    let mut created = std::collections::BTreeMap::new();
    let mut existing = Vec::new();
    for create in creates {
        match create.await.unwrap() {
            (key, id, CreateOutcome::Created(job)) => {
                assert_eq!(job.id, id);
                assert!(created.insert(key, id).is_none(), "a key created twice");
            }
            (key, _, CreateOutcome::Existing(job)) => existing.push((key, job.id)),
        }
    }
    assert_eq!(created.len(), 10, "{created:?}");
    assert_eq!(existing.len(), 20);
    for (key, id) in &existing {
        assert_eq!(
            Some(id),
            created.get(key),
            "{key} answered with another job"
        );
    }
    assert_eq!(store.count_jobs().await.unwrap(), 10);
    for id in created.values() {
        let attempts = store.list_attempts(id).await.unwrap();
        assert_eq!(attempts.len(), 1, "{attempts:?}");
        assert_eq!(
            (attempts[0].seq, attempts[0].state),
            (1, AttemptState::Started)
        );
        let kinds: Vec<_> = store
            .list_events(id)
            .await
            .unwrap()
            .iter()
            .map(|e| e.kind.as_str().to_string())
            .collect();
        assert_eq!(kinds, ["created", "attempt_started"], "job {id}");
    }
}

/// Forty jobs of one owner, won at once, each reporting 3 + 5 tokens: the
/// owner's day adds up to all of them whichever rows hold it. On
/// PostgreSQL the day is spread over several shard rows (migration 0009:
/// concurrent finishes do not queue on one row's lock); on SQLite it is
/// one row.
async fn forty_concurrent_wins_of_one_owner_add_up_across_shards(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store: Arc<dyn Store> = db.store().await;
    let at = 1_700_000_000_000;
    let wins: Vec<_> = (0..40)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                let id = JobId::new();
                let mut primary = attempt(&id, AttemptKind::Primary, 0);
                primary.started_at = at;
                let job = NewJob {
                    id: id.clone(),
                    owner_id: "alice".into(),
                    idempotency_key: new_id(),
                    fingerprint: "f".into(),
                    request: "{}".into(),
                    route: "default".into(),
                    created_at: at,
                    lease: Some(("driver".into(), at + 1_000)),
                    key_id: None,
                    primary: Some(primary.clone()),
                };
                store.create_job(job).await.unwrap();
                let mut success = onejob::domain::attempt::Success::text("ok");
                success.usage = Some(onejob::domain::attempt::Usage::new(3, 5));
                let mut end = finish(&primary.id, AttemptOutcome::Succeeded(success));
                end.at = at + 10;
                store.finish_attempt(end).await.unwrap()
            })
        })
        .collect();
    for win in wins {
        assert!(matches!(win.await.unwrap(), FinishOutcome::Won { .. }));
    }
    let usage = store.usage(Some(&"alice".into()), 0).await.unwrap();
    let totals: Vec<_> = usage
        .iter()
        .map(|u| (u.attempts, u.won, u.prompt_tokens, u.completion_tokens))
        .collect();
    assert_eq!(totals, [(40, 40, 120, 200)], "{usage:?}");
    let rows = match &db.url {
        onejob::config::DatabaseUrl::Postgres(url) => {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
            let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM usage_daily")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            rows
        }
        onejob::config::DatabaseUrl::Sqlite(path) => {
            use sqlx::Connection;
            let url = format!("sqlite://{}", path.display());
            let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
            let (rows,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM usage_daily")
                .fetch_one(&mut conn)
                .await
                .unwrap();
            rows
        }
    };
    match backend {
        // Forty ids over 16 shards: all in one is (1/16)^39.
        Backend::Postgres => assert!(rows > 1, "one owner's day in {rows} row(s)"),
        Backend::Sqlite => assert_eq!(rows, 1),
    }
}

/// Twelve hedged jobs whose primary and hedge all succeed at once (on
/// PostgreSQL the wins of concurrent callers share a statement, so both
/// attempts of a job can meet in one): each job has one winner, whose
/// output is its result, and one discarded loser with its race logged;
/// every attempt's tokens are counted, the losers' as discarded.
async fn hedged_jobs_won_at_once_have_one_winner_each_and_pay_for_every_attempt(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store: Arc<dyn Store> = db.store().await;
    let mut jobs = Vec::new();
    for _ in 0..12 {
        let job_id = new_job(store.as_ref()).await;
        let mut pair = Vec::new();
        for kind in [AttemptKind::Primary, AttemptKind::Hedge] {
            let started = store.start_attempt(attempt(&job_id, kind, 1)).await;
            pair.push(started.unwrap().unwrap().id);
        }
        jobs.push((job_id, pair));
    }
    let finishes: Vec<_> = jobs
        .iter()
        .flat_map(|(_, pair)| pair.clone())
        .map(|id| {
            let store = store.clone();
            tokio::spawn(async move {
                let mut success = onejob::domain::attempt::Success::text(format!("from {id}"));
                success.usage = Some(onejob::domain::attempt::Usage::new(3, 5));
                let outcome = store
                    .finish_attempt(finish(&id, AttemptOutcome::Succeeded(success)))
                    .await
                    .unwrap();
                (id, outcome)
            })
        })
        .collect();
    let mut won = std::collections::HashMap::new();
    for finish in finishes {
        let (id, outcome) = finish.await.unwrap();
        match outcome {
            FinishOutcome::Won { version, job } => {
                assert_eq!(version, 1);
                let job = job.expect("the won job is handed over");
                assert_eq!(job.completed_by.as_deref(), Some(id.as_str()));
                assert!(won.insert(job.id.clone(), id).is_none(), "two winners");
            }
            FinishOutcome::Lost => {}
            FinishOutcome::Recorded => panic!("a success must win or lose"),
        }
    }
    for (job_id, pair) in &jobs {
        let winner = won.get(job_id).expect("every job has a winner");
        let job = store.get_job(job_id).await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Succeeded);
        assert_eq!(job.version, 1);
        assert_eq!(job.completed_by.as_deref(), Some(winner.as_str()));
        let text = job.result.unwrap();
        assert!(text.contains(winner.as_str()), "{text} is not {winner}'s");
        let states: Vec<_> = store
            .list_attempts(job_id)
            .await
            .unwrap()
            .into_iter()
            .map(|a| (a.id.clone(), a.state))
            .collect();
        for (id, state) in &states {
            let wanted = if id == winner {
                AttemptState::Succeeded
            } else {
                AttemptState::Discarded
            };
            assert_eq!(*state, wanted, "{id} of {pair:?}");
        }
        let kinds: Vec<_> = store
            .list_events(job_id)
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == "attempt_succeeded" || e.kind == "cas_lost")
            .map(|e| {
                let attempt = e.attempt_id.map(|a| a.to_string()).unwrap_or_default();
                (e.kind.as_str().to_string(), attempt)
            })
            .collect();
        let loser = pair.iter().find(|id| *id != winner).unwrap();
        assert_eq!(kinds.len(), 2, "{kinds:?}");
        assert!(kinds.contains(&("attempt_succeeded".to_string(), winner.to_string())));
        assert!(kinds.contains(&("cas_lost".to_string(), loser.to_string())));
    }
    let usage = store.usage(Some(&"alice".into()), 0).await.unwrap();
    let sum = |f: fn(&onejob::store::tenants::UsageRow) -> i64| usage.iter().map(f).sum::<i64>();
    assert_eq!(
        (
            sum(|u| u.attempts),
            sum(|u| u.won),
            sum(|u| u.prompt_tokens),
            sum(|u| u.completion_tokens),
            sum(|u| u.discarded_tokens)
        ),
        (24, 12, 72, 120, 96),
        "{usage:?}"
    );
}

/// Several writers on one SQLite file (each store has its own writer
/// connection, as separate processes would): the guard still admits one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn guard_holds_across_writers_on_one_sqlite_file() {
    let db = TestDb::new(Backend::Sqlite).await;
    let first = db.store().await;
    let job_id = new_job(first.as_ref()).await;
    let mut stores = vec![first];
    for _ in 0..3 {
        stores.push(db.store().await);
    }
    let mut tasks = Vec::new();
    for i in 0..20 {
        let store = stores[i % stores.len()].clone();
        let new = attempt(&job_id, AttemptKind::Primary, 1);
        tasks.push(tokio::spawn(async move {
            store.start_attempt(new).await.unwrap().is_ok()
        }));
    }
    let mut started = 0;
    for task in tasks {
        started += usize::from(task.await.unwrap());
    }
    assert_eq!(started, 1);
    assert_eq!(stores[0].list_attempts(&job_id).await.unwrap().len(), 1);
}
