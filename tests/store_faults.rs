//! The fault-injecting store wrapper does what the tests that use it rely
//! on: an injected failure writes nothing, a failure after commit writes
//! and still reports the error, a blip fails every call until it ends, and
//! a hold parks a call where asked. On both backends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, TestDb};
use onejob::domain::job::NewJob;
use onejob::domain::{JobId, OwnerId};
use onejob::store::faulty::{FaultyStore, HoldPoint};
use onejob::store::prelude::*;
use onejob::store::{CreateOutcome, Store};
use std::sync::Arc;
use std::time::Duration;

on_both_backends!(
    a_failed_call_writes_nothing_and_the_next_goes_through,
    a_failure_after_commit_has_written_the_row,
    a_blip_fails_every_call_until_it_ends,
    a_held_call_parks_after_the_commit_until_released,
);

fn new_job(key: &str) -> NewJob {
    NewJob {
        id: JobId::new(),
        owner_id: "alice".into(),
        idempotency_key: key.into(),
        fingerprint: "f".into(),
        request: "{}".into(),
        route: "default".into(),
        created_at: 1,
        lease: None,
        key_id: None,
        primary: None,
    }
}

async fn faulty(backend: Backend) -> (TestDb, Arc<FaultyStore>) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    (db, Arc::new(FaultyStore::new(store)))
}

async fn a_failed_call_writes_nothing_and_the_next_goes_through(backend: Backend) {
    let (_db, store) = faulty(backend).await;
    store.fail_next("create_job", 2);
    for _ in 0..2 {
        let err = store.create_job(new_job("k")).await.unwrap_err();
        assert!(err.is_transient(), "{err}");
    }
    assert_eq!(store.count_jobs().await.unwrap(), 0);
    let created = store.create_job(new_job("k")).await.unwrap();
    assert!(matches!(created, CreateOutcome::Created(_)));
    assert_eq!(store.count_jobs().await.unwrap(), 1);
    assert_eq!(store.calls("create_job"), 3);
}

async fn a_failure_after_commit_has_written_the_row(backend: Backend) {
    let (_db, store) = faulty(backend).await;
    store.fail_next_after_commit("create_job", 1);
    assert!(store.create_job(new_job("k")).await.is_err());
    assert!(store
        .find_job_by_key(&OwnerId::from("alice"), "k")
        .await
        .unwrap()
        .is_some());
    // The client's retry finds the job the lost answer had created.
    let again = store.create_job(new_job("k")).await.unwrap();
    assert!(matches!(again, CreateOutcome::Existing(_)), "{again:?}");
}

async fn a_blip_fails_every_call_until_it_ends(backend: Backend) {
    let (_db, store) = faulty(backend).await;
    store.set_down(true);
    assert!(store.ping().await.unwrap_err().is_transient());
    assert!(store.create_job(new_job("k")).await.is_err());
    assert!(store.get_job(&JobId::from("nope")).await.is_err());
    store.set_down(false);
    store.ping().await.unwrap();
    assert_eq!(store.count_jobs().await.unwrap(), 0);
}

async fn a_held_call_parks_after_the_commit_until_released(backend: Backend) {
    let (_db, store) = faulty(backend).await;
    store.hold("create_job", HoldPoint::After);
    let call = tokio::spawn({
        let store = store.clone();
        async move { store.create_job(new_job("k")).await }
    });
    tokio::time::timeout(Duration::from_secs(10), store.parked("create_job", 1))
        .await
        .expect("the call parks");
    // Committed, and its caller has not been answered.
    assert!(store
        .find_job_by_key(&OwnerId::from("alice"), "k")
        .await
        .unwrap()
        .is_some());
    assert!(!call.is_finished());
    store.release("create_job");
    let created = call.await.unwrap().unwrap();
    assert!(matches!(created, CreateOutcome::Created(_)));
}
