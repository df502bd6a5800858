//! Every job state and every attempt state, walked through the store's
//! operations on real databases: which operations accept a job (or an
//! attempt) in that state must be exactly what the lifecycle predicates of
//! `domain::lifecycle` say. A rule written twice that disagrees — an SQL
//! state list against a Rust check — fails here.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, TestDb};
use onejob::config::DatabaseUrl;
use onejob::domain::attempt::NewAttempt;
use onejob::domain::job::NewJob;
use onejob::domain::{new_id, AttemptId, AttemptKind, AttemptState, JobId, JobState, OwnerId};
use onejob::store::{
    AttemptOutcome, AttemptResolution, CreateOutcome, FinishAttempt, JobResolution, JobTransition,
    Store,
};
use std::sync::Arc;

on_both_backends!(
    every_job_state_is_accepted_exactly_where_the_predicates_say,
    every_attempt_state_is_accepted_exactly_where_the_predicates_say,
    a_job_is_blocked_exactly_while_parked_on_a_live_attempt,
);

const OWNER: &str = "walker";

/// A direct connection to the test database, for test setup: put a row in
/// a state the API would reach only by a story.
enum Raw {
    Sqlite(sqlx::SqliteConnection),
    Postgres(sqlx::PgConnection),
}

static RAW: tokio::sync::Mutex<Vec<(String, Raw)>> = tokio::sync::Mutex::const_new(Vec::new());

/// Run one statement with text parameters on the test database directly,
/// on a connection kept per database.
async fn exec(db: &TestDb, sql: &str, binds: &[&str]) {
    use sqlx::Connection;
    let name = db.url_string();
    let mut raws = RAW.lock().await;
    if !raws.iter().any(|(n, _)| *n == name) {
        let raw = match &db.url {
            DatabaseUrl::Sqlite(path) => Raw::Sqlite(
                sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
                    .await
                    .unwrap(),
            ),
            DatabaseUrl::Postgres(url) => {
                Raw::Postgres(sqlx::PgConnection::connect(url).await.unwrap())
            }
        };
        raws.push((name.clone(), raw));
    }
    let raw = &mut raws.iter_mut().find(|(n, _)| *n == name).unwrap().1;
    match raw {
        Raw::Sqlite(conn) => {
            let mut query = sqlx::query(sql);
            for b in binds {
                query = query.bind(*b);
            }
            query.execute(conn).await.unwrap();
        }
        Raw::Postgres(conn) => {
            let mut query = sqlx::query(sql);
            for b in binds {
                query = query.bind(*b);
            }
            query.execute(conn).await.unwrap();
        }
    }
}

/// A job of `OWNER` in `state`, runnable (as far as its row goes) and free.
async fn job_in(db: &TestDb, store: &dyn Store, state: JobState) -> JobId {
    job_of(db, store, state, OWNER).await
}

async fn job_of(db: &TestDb, store: &dyn Store, state: JobState, owner: &str) -> JobId {
    let job = NewJob {
        id: JobId::new(),
        owner_id: owner.into(),
        idempotency_key: new_id(),
        fingerprint: "f".into(),
        request: "{}".into(),
        route: "default".into(),
        created_at: 1,
        lease: None,
        key_id: Some(format!("key-of-{owner}")),
        primary: None,
    };
    let CreateOutcome::Created(job) = store.create_job(job).await.unwrap() else {
        panic!("a new key creates")
    };
    exec(
        db,
        "UPDATE jobs SET state = $1 WHERE id = $2",
        &[state.as_str(), &job.id],
    )
    .await;
    job.id
}

/// An attempt row of `job_id` on `provider` in `state`.
async fn attempt_in(db: &TestDb, job_id: &JobId, provider: &str, state: AttemptState) -> AttemptId {
    let id = AttemptId::new();
    exec(
        db,
        "INSERT INTO attempts (id, job_id, seq, provider, kind, state, read_version, started_at) \
         VALUES ($1, $2, 1, $3, 'primary', $4, 0, 1)",
        &[&id, job_id, provider, state.as_str()],
    )
    .await;
    exec(
        db,
        "UPDATE jobs SET attempt_count = 1 WHERE id = $1",
        &[job_id],
    )
    .await;
    id
}

fn new_attempt(job_id: &JobId, provider: &str, kind: AttemptKind) -> NewAttempt {
    NewAttempt {
        id: AttemptId::new(),
        job_id: job_id.clone(),
        provider: provider.into(),
        kind,
        max_hedges: 1,
        reuses_key: false,
        started_at: 2,
    }
}

fn transitions() -> Vec<JobTransition> {
    vec![
        JobTransition::Backoff {
            next_run_at: 5,
            lease_until: 50,
            reason: "walk".into(),
        },
        JobTransition::BlockOnUnknown,
        JobTransition::Fail {
            reason: "walk".into(),
        },
        JobTransition::Review {
            reason: "walk".into(),
        },
        JobTransition::Release { next_run_at: 5 },
    ]
}

async fn store(backend: Backend) -> (TestDb, Arc<dyn Store>) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    (db, store)
}

async fn every_job_state_is_accepted_exactly_where_the_predicates_say(backend: Backend) {
    // One database; every check on a job of its own.
    let (db, store) = store(backend).await;
    let s = store.as_ref();
    for state in JobState::ALL {
        let takes = state.takes_attempts();

        let owner = OwnerId::from(format!("owner-{}", state.as_str()));
        let depth_before = store.review_queue_depth().await.unwrap();
        let id = job_of(&db, s, state, &owner).await;
        let claimed = store
            .claim_jobs("engine-a", 10, 100, 1_000, false)
            .await
            .unwrap();
        assert_eq!(claimed.iter().any(|j| j.id == id), takes, "claim {state:?}");
        let load = store
            .owner_load(&owner, Some(&format!("key-of-{owner}")), 0)
            .await
            .unwrap();
        assert_eq!(
            (load.active_jobs, load.key_active_jobs),
            (i64::from(takes), i64::from(takes)),
            "live jobs counted for the owner's and the key's limits {state:?}"
        );
        let awaits = state.awaits_decision();
        assert_eq!(
            store.review_queue_depth().await.unwrap() - depth_before,
            i64::from(awaits),
            "{state:?}"
        );
        let review = store.list_review(1_000).await.unwrap();
        assert_eq!(review.iter().any(|r| r.job.id == id), awaits, "{state:?}");

        let id = job_in(&db, s, state).await;
        let started = store
            .start_attempt(new_attempt(&id, "p", AttemptKind::Primary))
            .await
            .unwrap();
        assert_eq!(
            started.is_ok(),
            takes,
            "start_attempt {state:?}: {started:?}"
        );

        for transition in transitions() {
            let id = job_in(&db, s, state).await;
            let applied = store
                .transition_job(&id, None, transition.clone(), 3)
                .await
                .unwrap();
            assert_eq!(applied, takes, "{transition:?} on {state:?}");
            if !applied {
                let job = store.get_job(&id).await.unwrap().unwrap();
                assert_eq!(job.state, state, "a refused step changed nothing");
            }
        }

        let id = job_in(&db, s, state).await;
        exec(
            &db,
            "UPDATE jobs SET next_run_at = NULL WHERE id = $1",
            &[&id],
        )
        .await;
        store.wake_job(&id, 7).await.unwrap();
        let woken = store.get_job(&id).await.unwrap().unwrap().next_run_at;
        assert_eq!(woken.is_some(), takes, "wake_job {state:?}");

        let retry = state.accepts_retry();
        let id = job_in(&db, s, state).await;
        let asked = store.request_retry(&id, OWNER, 3).await.unwrap();
        assert_eq!(asked.is_ok(), retry, "request_retry {state:?}: {asked:?}");
        if let Ok(job) = asked {
            assert_eq!(job.state, JobState::Pending);
            assert!(job.next_run_at.is_some(), "a retried job is runnable");
        }
        for resolution in [JobResolution::Retry, JobResolution::Close] {
            let id = job_in(&db, s, state).await;
            let resolved = store
                .resolve_job(&id, resolution.clone(), "admin:ops", "walk", 3)
                .await
                .unwrap();
            assert_eq!(resolved.is_ok(), retry, "{resolution:?} on {state:?}");
        }

        let id = job_in(&db, s, state).await;
        let cancelled = store.cancel_job(&id, OWNER, "walk", 3).await.unwrap();
        assert_eq!(
            cancelled.is_ok(),
            state.accepts_cancel(),
            "cancel {state:?}"
        );
    }
    store.close().await;
}

async fn every_attempt_state_is_accepted_exactly_where_the_predicates_say(backend: Backend) {
    let ends = || {
        [
            (AttemptOutcome::succeeded("{}"), AttemptState::Succeeded),
            (
                AttemptOutcome::failed("walk".into(), "walk"),
                AttemptState::Failed,
            ),
            (
                AttemptOutcome::unknown("walk".into(), "walk"),
                AttemptState::Unknown,
            ),
            (
                AttemptOutcome::Abandoned {
                    reason: "walk".into(),
                },
                AttemptState::Discarded,
            ),
        ]
    };
    let (db, store) = store(backend).await;
    let s = store.as_ref();
    for state in AttemptState::ALL {
        let live = state.is_live();

        let job = job_in(&db, s, JobState::Running).await;
        let attempt = attempt_in(&db, &job, "p", state).await;
        let unknown = store.list_unknown_attempts(None, 1_000).await.unwrap();
        assert_eq!(
            unknown.iter().any(|a| a.id == attempt),
            state.awaits_settlement(),
            "list_unknown_attempts {state:?}"
        );
        // Invariant 4: no retry to the same provider while an attempt is live.
        let retry = store
            .start_attempt(new_attempt(&job, "p", AttemptKind::Retry))
            .await
            .unwrap();
        assert_eq!(
            retry.is_err(),
            live,
            "retry beside a {state:?} attempt: {retry:?}"
        );

        let job = job_in(&db, s, JobState::Running).await;
        attempt_in(&db, &job, "p", state).await;
        let asked = store.request_retry(&job, OWNER, 3).await.unwrap();
        assert_eq!(asked.is_err(), live, "request_retry beside {state:?}");

        let job = job_in(&db, s, JobState::Running).await;
        let attempt = attempt_in(&db, &job, "p", state).await;
        let resolved = store
            .resolve_attempt(
                &attempt,
                AttemptResolution::NotExecuted,
                "admin:ops",
                "walk",
                3,
            )
            .await
            .unwrap();
        assert_eq!(
            resolved.is_ok(),
            state.awaits_settlement(),
            "resolve {state:?}"
        );

        for (end, wanted) in ends() {
            let job = job_in(&db, s, JobState::Running).await;
            let attempt = attempt_in(&db, &job, "p", state).await;
            let finished = store
                .finish_attempt(FinishAttempt {
                    attempt_id: attempt,
                    outcome: end.clone(),
                    at: 3,
                    actor: "walk".into(),
                })
                .await;
            assert_eq!(
                finished.is_ok(),
                state.may_become(wanted),
                "{state:?} → {wanted:?}: {finished:?}"
            );
        }
    }
    store.close().await;
}

async fn a_job_is_blocked_exactly_while_parked_on_a_live_attempt(backend: Backend) {
    let (db, store) = store(backend).await;
    for state in AttemptState::ALL {
        let job = job_in(&db, store.as_ref(), JobState::Running).await;
        let attempt = attempt_in(&db, &job, "p", state).await;
        assert!(store
            .transition_job(&job, None, JobTransition::BlockOnUnknown, 3)
            .await
            .unwrap());
        let parked = store.get_job(&job).await.unwrap().unwrap();
        assert_eq!(parked.is_blocked_on_unknown(), state.is_live(), "{state:?}");
        if state.awaits_settlement() {
            // The reconciler learns it never executed: runnable in the same commit.
            store
                .finish_attempt(FinishAttempt {
                    attempt_id: attempt,
                    outcome: AttemptOutcome::failed("not_executed".into(), "walk"),
                    at: 4,
                    actor: "reconciler".into(),
                })
                .await
                .unwrap();
            let woken = store.get_job(&job).await.unwrap().unwrap();
            assert!(!woken.is_blocked_on_unknown());
            assert_eq!(woken.next_run_at, Some(4));
        }
    }
    store.close().await;
}
