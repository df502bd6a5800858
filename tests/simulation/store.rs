//! The store as the simulation sees it: the real SQLite store (its own
//! runtime, its own threads), called so that each call completes before the
//! simulated world moves on. The simulation's runtime thread waits for the
//! answer, so no simulated task runs and no simulated time passes while the
//! database works: a call is one atomic step at one instant, and the order
//! of calls is the order the simulated tasks make them. That is what makes a
//! seed replay exactly (sqlx's SQLite connections answer from their own
//! threads, at times the simulation cannot control).

use async_trait::async_trait;
use onejob::store::prelude::*;
use onejob::store::{NewEvent, StoreError};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tokio::runtime::Handle;

/// One process's connection to the database. When the process dies, its
/// connection dies with it: every later call fails and nothing more is
/// written.
pub struct SyncStore {
    inner: Arc<dyn Store>,
    /// The runtime the real store's tasks (SQLite's group-commit writer) live on.
    rt: Handle,
    /// Calls made.
    calls: AtomicU64,
    dead: AtomicBool,
    /// Die at this call (1-based): before it reaches the database, or right
    /// after it committed (the caller never hears).
    kill_at: Option<(u64, bool)>,
    /// Called once when this store dies at `kill_at` (kills the engine).
    on_kill: Mutex<Option<Box<dyn FnOnce() + Send>>>,
}

fn dead<T>() -> Result<T, StoreError> {
    Err(StoreError::Closed)
}

impl SyncStore {
    pub fn new(inner: Arc<dyn Store>, rt: Handle, kill_at: Option<(u64, bool)>) -> Self {
        SyncStore {
            inner,
            rt,
            calls: AtomicU64::new(0),
            dead: AtomicBool::new(false),
            kill_at,
            on_kill: Mutex::new(None),
        }
    }

    pub fn on_kill(&self, f: impl FnOnce() + Send + 'static) {
        *self.on_kill.lock().unwrap() = Some(Box::new(f));
    }

    /// Close the real store (its connections and threads) and forget the
    /// kill hook (it holds the engine, which holds this store).
    pub fn shut(&self) {
        self.die();
        self.on_kill.lock().unwrap().take();
        let inner = self.inner.clone();
        run_on(&self.rt, async move { inner.close().await });
    }

    /// The process is gone: nothing more reaches the database from it.
    pub fn die(&self) {
        self.dead.store(true, Ordering::SeqCst);
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }

    fn die_at_kill_point(&self) {
        self.die();
        let kill = self.on_kill.lock().unwrap().take();
        if let Some(kill) = kill {
            kill();
        }
    }

    /// Run one store call to its end on the store's runtime, blocking this
    /// (the simulation's) thread meanwhile; `None` when the process is dead
    /// (or dies at this call).
    fn blocking<T: Send>(&self, call: impl Future<Output = T> + Send) -> Option<T> {
        if self.is_dead() {
            return None;
        }
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        let kill_here = self.kill_at.filter(|(at, _)| *at == n);
        if let Some((_, false)) = kill_here {
            self.die_at_kill_point();
            return None;
        }
        // On this thread, in the store runtime's context (anything the call
        // spawns goes there); nothing of the simulation's runtime runs meanwhile.
        // Unconstrained: the calling task's cooperative budget (128 channel
        // operations per poll) would otherwise run out after some 60 calls
        // made without yielding, and tokio defers the wake-up of an
        // exhausted budget to a scheduler this thread is blocking.
        let answer = {
            let _context = self.rt.enter();
            futures::executor::block_on(tokio::task::unconstrained(call))
        };
        if kill_here.is_some() {
            self.die_at_kill_point();
            return None;
        }
        Some(answer)
    }
}

/// Run `call` to its end on `rt` (from a thread of its own, so this works
/// from inside another runtime), blocking the calling thread meanwhile.
pub fn run_on<T: Send>(rt: &Handle, call: impl Future<Output = T> + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| rt.block_on(call))
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

// Every query run to its end as one blocking step.
onejob::forward_store!(impl SyncStore, inner, |this, _name, call| {
    this.blocking(call).unwrap_or_else(dead)
});

#[async_trait]
impl Store for SyncStore {
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.blocking(self.inner.migrate()).unwrap_or_else(dead)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        self.blocking(self.inner.ping()).unwrap_or_else(dead)
    }

    fn commit_counts(&self) -> onejob::store::CommitCounts {
        self.inner.commit_counts()
    }

    fn record_event_detached(&self, event: NewEvent) {
        // Waited for here: another process's write must not race it to the
        // database, or the event log's order would vary from run to run.
        let _ = self.blocking(self.inner.record_event(event));
    }

    async fn close(&self) {
        self.blocking(self.inner.close()).unwrap_or_default()
    }
}
