//! `onejob review` from the command line: the queue shows the business key,
//! resolutions follow the API's rules and land in the event log.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, TestDb};
use onejob::domain::attempt::NewAttempt;
use onejob::domain::job::NewJob;
use onejob::domain::{AttemptId, AttemptKind, AttemptState, JobId, JobState};
use onejob::store::{AttemptOutcome, FinishAttempt, JobResolution, JobTransition, Store};
use std::process::{Command, Output};

on_both_backends!(
    review_queue_from_the_command_line,
    a_job_completed_by_hand_keeps_no_error_that_says_it_is_blocked,
);

fn onejob(db: &TestDb, args: &[&str]) -> Output {
    let url = db.url_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--database-url", &url]);
    Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(&all)
        .env("USER", "tester")
        .env("RUST_LOG", "error")
        .output()
        .unwrap()
}

/// A job whose only attempt is unknown and that went to review.
async fn job_in_review(store: &dyn Store) -> (JobId, AttemptId) {
    let job = NewJob {
        id: JobId::new(),
        owner_id: "alice".into(),
        idempotency_key: "invoice-7:send".into(),
        fingerprint: "f".into(),
        request: "{}".into(),
        route: "default".into(),
        created_at: 1,
        lease: None,
        key_id: None,
        primary: None,
    };
    let job_id = job.id.clone();
    store.create_job(job).await.unwrap();
    let attempt = NewAttempt {
        id: AttemptId::new(),
        job_id: job_id.clone(),
        provider: "sim".into(),
        kind: AttemptKind::Primary,
        max_hedges: 1,
        reuses_key: false,
        started_at: 2,
    };
    let attempt = store.start_attempt(attempt).await.unwrap().unwrap();
    let unknown = AttemptOutcome::unknown("attempt_timeout".into(), "no answer");
    store
        .finish_attempt(FinishAttempt {
            attempt_id: attempt.id.clone(),
            outcome: unknown,
            at: 3,
            actor: "engine".into(),
        })
        .await
        .unwrap();
    let review = JobTransition::Review {
        reason: "unknown past deadline".into(),
    };
    assert!(store
        .transition_job(&job_id, None, review, 4)
        .await
        .unwrap());
    (job_id, attempt.id)
}

async fn review_queue_from_the_command_line(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let (job_id, attempt_id) = job_in_review(store.as_ref()).await;

    let out = onejob(&db, &["review", "list"]);
    assert!(out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout
        .lines()
        .find(|l| l.starts_with(job_id.as_str()))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        row.contains("alice")
            && row.contains("invoice-7:send")
            && row.contains("unknown past deadline"),
        "{row}"
    );

    // Rules as in the API: complete needs a result; the attempt must be unknown to settle.
    let out = onejob(
        &db,
        &[
            "review",
            "resolve",
            &job_id,
            "--action",
            "complete",
            "--reason",
            "paid by hand",
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--result: required with action complete")
    );
    assert_eq!(
        store.get_job(&job_id).await.unwrap().unwrap().state,
        JobState::NeedsReview,
        "nothing changed"
    );
    let out = onejob(
        &db,
        &[
            "review", "resolve", &job_id, "--action", "retry", "--reason", "x",
        ],
    );
    assert!(!out.status.success(), "an unknown attempt blocks a retry");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("unknown"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let out = onejob(
        &db,
        &[
            "review",
            "resolve-attempt",
            &attempt_id,
            "--outcome",
            "not_executed",
            "--reason",
            "vendor confirmed no charge",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let job = store.get_job(&job_id).await.unwrap().unwrap();
    assert_eq!(job.state, JobState::Pending, "the job may go again");
    assert!(job.next_run_at.is_some());
    let attempts = store.list_attempts(&job_id).await.unwrap();
    assert_eq!(attempts[0].state, AttemptState::Cancelled);
    let events = store.list_events(&job_id).await.unwrap();
    let settled = events
        .iter()
        .find(|e| e.kind == "attempt_resolved")
        .unwrap();
    assert_eq!(settled.actor, "cli:tester");
    assert!(settled
        .detail
        .as_deref()
        .unwrap()
        .contains("vendor confirmed no charge"));
    assert_eq!(
        onejob(&db, &["review", "list"]).stdout,
        b"the review queue is empty\n"
    );
}

/// An admin's `complete` settles the job: its `last_error` no longer says
/// why it was waiting (the outcome was unknown past the deadline), as an
/// attempt's win clears it; the reason stays in the event log.
async fn a_job_completed_by_hand_keeps_no_error_that_says_it_is_blocked(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let (job_id, _) = job_in_review(store.as_ref()).await;
    assert_eq!(
        store
            .get_job(&job_id)
            .await
            .unwrap()
            .unwrap()
            .last_error
            .as_deref(),
        Some("unknown past deadline")
    );
    let complete = JobResolution::Complete {
        result: "\"paid by hand\"".into(),
    };
    let job = store
        .resolve_job(&job_id, complete, "cli:tester", "vendor confirmed", 5)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((job.state, job.last_error), (JobState::Succeeded, None));
    let out = onejob(&db, &["jobs", "show", &job_id]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(shown["state"], "succeeded", "{shown}");
    assert_eq!(shown["last_error"], serde_json::Value::Null, "{shown}");
    let events = store.list_events(&job_id).await.unwrap();
    let parked = events.iter().find(|e| e.kind == "needs_review").unwrap();
    assert!(parked
        .detail
        .as_deref()
        .unwrap()
        .contains("unknown past deadline"));
    assert!(events.iter().any(|e| e.kind == "resolved"));
}
