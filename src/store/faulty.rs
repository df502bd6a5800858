//! A fault-injecting [`Store`] wrapper, for tests (test-support type).
//!
//! [`FaultyStore`] wraps a real store (SQLite or PostgreSQL) and forwards
//! every call to it, except where a test asked for a fault:
//!
//! - [`FaultyStore::fail_next`]: the next `n` calls of one method fail with a
//!   transient database error before reaching the database (nothing written);
//! - [`FaultyStore::fail_next_after_commit`]: the next `n` calls of one method
//!   reach the database and commit, then the caller gets the error anyway (the
//!   acknowledgement was lost: the ambiguous case a retry must survive);
//! - [`FaultyStore::set_down`]: while on, every call fails (a database blip);
//! - [`FaultyStore::hold`]: calls of one method park before or after reaching
//!   the database until [`FaultyStore::release`] (to drop a caller at a
//!   chosen await, deterministically).
//!
//! Method names are the [`Store`] trait's (`"create_job"`, `"start_attempt"`,
//! `"finish_attempt"`, …): every query of [`METHODS`], and
//! `migrate` and `ping`. A name that is none of them panics, so a misspelled
//! one cannot silently never fire. [`FaultyStore::calls`] counts the calls
//! each method received, failed ones included (`record_event_detached` too). The injected error is
//! [`StoreError::Database`] with an `io::ErrorKind::ConnectionReset`, which
//! [`StoreError::is_transient`] reports as transient, like a real dropped
//! connection.

use super::{NewEvent, Store, StoreError};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::watch;

/// Where a held call parks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldPoint {
    /// Before the call reaches the database: nothing is written yet.
    Before,
    /// After the database answered (a write is committed), before the caller
    /// sees the answer.
    After,
}

struct Hold {
    point: HoldPoint,
    /// How many calls have parked so far.
    parked: watch::Sender<usize>,
    /// Turned on by `release`.
    open: watch::Sender<bool>,
}

#[derive(Default)]
struct Faults {
    fail_before: HashMap<String, usize>,
    fail_after: HashMap<String, usize>,
    holds: HashMap<String, Arc<Hold>>,
    calls: HashMap<String, usize>,
    failed: HashMap<String, usize>,
}

/// A [`Store`] that forwards to a real one and fails or holds chosen calls.
/// Test support: a server never builds one.
pub struct FaultyStore {
    inner: Arc<dyn Store>,
    down: AtomicBool,
    faults: Mutex<Faults>,
}

/// The name of every query of the resource traits, in their order: the
/// names the fault points know, with [`HAND_WRITTEN`].
pub const METHODS: &[&str] = crate::forward_store!(names);

/// The hand-written [`Store`] methods that pass through the fault points,
/// besides the resource traits' queries.
const HAND_WRITTEN: &[&str] = &["migrate", "ping"];

/// Panics unless `method` passes through the fault points (`counted`: or is
/// at least counted, as `record_event_detached` is), naming the caller.
fn expect_method(caller: &str, method: &str, counted: bool) {
    let known = METHODS.contains(&method)
        || HAND_WRITTEN.contains(&method)
        || (counted && method == "record_event_detached");
    assert!(
        known,
        "FaultyStore::{caller}({method:?}): no Store method of that name goes through \
         the fault points, so this would never fire (a misspelling?)"
    );
}

/// The error an injected fault returns: a connection reset, as when the
/// database server goes away mid-call.
pub fn injected_error() -> StoreError {
    StoreError::Database(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "injected by FaultyStore",
    )))
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn Store>) -> Self {
        FaultyStore {
            inner,
            down: AtomicBool::new(false),
            faults: Mutex::new(Faults::default()),
        }
    }

    /// The wrapped store.
    pub fn inner(&self) -> &Arc<dyn Store> {
        &self.inner
    }

    /// The next `n` calls of `method` fail before reaching the database.
    pub fn fail_next(&self, method: &str, n: usize) {
        expect_method("fail_next", method, false);
        *self
            .faults()
            .fail_before
            .entry(method.to_string())
            .or_default() += n;
    }

    /// The next `n` calls of `method` reach the database (and commit), then
    /// return the injected error instead of the answer.
    pub fn fail_next_after_commit(&self, method: &str, n: usize) {
        expect_method("fail_next_after_commit", method, false);
        *self
            .faults()
            .fail_after
            .entry(method.to_string())
            .or_default() += n;
    }

    /// While on, every call fails before reaching the database.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    pub fn is_down(&self) -> bool {
        self.down.load(Ordering::SeqCst)
    }

    /// Calls of `method` park at `point` until [`FaultyStore::release`].
    pub fn hold(&self, method: &str, point: HoldPoint) {
        expect_method("hold", method, false);
        let hold = Hold {
            point,
            parked: watch::channel(0).0,
            open: watch::channel(false).0,
        };
        self.faults()
            .holds
            .insert(method.to_string(), Arc::new(hold));
    }

    /// Wait until `n` calls of `method` are parked by its hold (counting
    /// since `hold` was called). Returns at once if `method` is not held.
    pub async fn parked(&self, method: &str, n: usize) {
        expect_method("parked", method, false);
        let hold = self.faults().holds.get(method).cloned();
        if let Some(hold) = hold {
            let mut rx = hold.parked.subscribe();
            let _ = rx.wait_for(|parked| *parked >= n).await;
        }
    }

    /// Let every parked call of `method` go on and stop holding new ones.
    pub fn release(&self, method: &str) {
        expect_method("release", method, false);
        if let Some(hold) = self.faults().holds.remove(method) {
            hold.open.send_replace(true);
        }
    }

    /// How many calls `method` has received (failed and held ones included).
    pub fn calls(&self, method: &str) -> usize {
        expect_method("calls", method, true);
        self.faults().calls.get(method).copied().unwrap_or(0)
    }

    /// How many calls of `method` got an injected error.
    pub fn failures(&self, method: &str) -> usize {
        expect_method("failures", method, false);
        self.faults().failed.get(method).copied().unwrap_or(0)
    }

    fn faults(&self) -> MutexGuard<'_, Faults> {
        // A panic while holding this lock cannot leave the maps half-updated.
        self.faults.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Count the call, fail it if asked, park it if held before.
    async fn before(&self, method: &str) -> Result<(), StoreError> {
        let hold = {
            let mut faults = self.faults();
            *faults.calls.entry(method.to_string()).or_default() += 1;
            let fail = match faults.fail_before.get_mut(method) {
                Some(left) if *left > 0 => {
                    *left -= 1;
                    true
                }
                _ => self.is_down(),
            };
            if fail {
                *faults.failed.entry(method.to_string()).or_default() += 1;
                return Err(injected_error());
            }
            faults.holds.get(method).cloned()
        };
        if let Some(hold) = hold {
            if hold.point == HoldPoint::Before {
                park(&hold).await;
            }
        }
        Ok(())
    }

    /// Park the call if held after; fail it if asked to fail after commit.
    async fn after<T>(&self, method: &str, result: Result<T, StoreError>) -> Result<T, StoreError> {
        let hold = self.faults().holds.get(method).cloned();
        if let Some(hold) = hold {
            if hold.point == HoldPoint::After {
                park(&hold).await;
            }
        }
        let mut faults = self.faults();
        if let Some(left) = faults.fail_after.get_mut(method) {
            if *left > 0 {
                *left -= 1;
                *faults.failed.entry(method.to_string()).or_default() += 1;
                return Err(injected_error());
            }
        }
        result
    }
}

async fn park(hold: &Hold) {
    let mut open = hold.open.subscribe();
    hold.parked.send_modify(|parked| *parked += 1);
    let _ = open.wait_for(|open| *open).await;
}

#[async_trait]
impl Store for FaultyStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    fn commit_counts(&self) -> crate::store::CommitCounts {
        self.inner.commit_counts()
    }

    /// Detached events are dropped (with nothing written) while the store is
    /// down, as a real detached write would fail.
    fn record_event_detached(&self, event: NewEvent) {
        *self
            .faults()
            .calls
            .entry("record_event_detached".to_string())
            .or_default() += 1;
        if !self.is_down() {
            self.inner.record_event_detached(event);
        }
    }

    async fn close(&self) {
        self.inner.close().await
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.before("migrate").await?;
        let result = self.inner.migrate().await;
        self.after("migrate", result).await
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.before("ping").await?;
        let result = self.inner.ping().await;
        self.after("ping", result).await
    }
}

// Every query forwarded through the fault points, under its name.
crate::forward_store!(impl FaultyStore, inner, |this, name, call| {
    this.before(name).await?;
    let result = call.await;
    this.after(name, result).await
});

#[cfg(test)]
mod tests {
    use super::*;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    #[tokio::test]
    async fn a_name_that_is_no_store_method_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let inner = crate::store::sqlite::SqliteStore::open(&dir.path().join("t.db"))
            .await
            .unwrap();
        let faulty = FaultyStore::new(Arc::new(inner));
        // Every forwarded query and the hand-written ones are accepted.
        assert!(super::METHODS.contains(&"claim_jobs"));
        assert!(super::METHODS.contains(&"window_stats"));
        for method in METHODS.iter().chain(HAND_WRITTEN) {
            faulty.fail_next(method, 0);
            faulty.fail_next_after_commit(method, 0);
            faulty.hold(method, HoldPoint::Before);
            faulty.parked(method, 0).await;
            faulty.release(method);
            assert_eq!(faulty.calls(method), 0);
            assert_eq!(faulty.failures(method), 0);
        }
        assert_eq!(faulty.calls("record_event_detached"), 0);

        // A misspelled name panics, naming the call and the name.
        type Call<'a> = Box<dyn FnOnce() + 'a>;
        let refused: Vec<(&str, Call<'_>)> = vec![
            ("fail_next", Box::new(|| faulty.fail_next("claim_job", 1))),
            (
                "fail_next_after_commit",
                Box::new(|| faulty.fail_next_after_commit("claim_job", 1)),
            ),
            (
                "hold",
                Box::new(|| faulty.hold("claim_job", HoldPoint::After)),
            ),
            ("release", Box::new(|| faulty.release("claim_job"))),
            (
                "calls",
                Box::new(|| {
                    let _ = faulty.calls("claim_job");
                }),
            ),
            (
                "failures",
                Box::new(|| {
                    let _ = faulty.failures("claim_job");
                }),
            ),
            // Counted, but no fault ever fires on it.
            (
                "fail_next",
                Box::new(|| faulty.fail_next("record_event_detached", 1)),
            ),
        ];
        for (caller, call) in refused {
            let panic = catch_unwind(AssertUnwindSafe(call)).expect_err(caller);
            let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
            assert!(
                message.starts_with(&format!("FaultyStore::{caller}(")),
                "{message}"
            );
        }
        let parked = AssertUnwindSafe(faulty.parked("claim_job", 1));
        let panic = futures::FutureExt::catch_unwind(parked)
            .await
            .expect_err("parked");
        let message = panic.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(message.contains("\"claim_job\""), "{message}");
        faulty.close().await;
    }
}
