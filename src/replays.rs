//! Replays answered from memory.
//!
//! A job that has `succeeded` or been `cancelled` never changes again: no
//! attempt may start on it (the guard, invariant 4), every finish after it
//! loses the compare-and-swap (invariant 5), retry and resolve refuse it, and
//! a late loser's error is not written onto it. So its row, once read, can
//! answer every later replay of the same (owner, idempotency key) on any
//! instance without asking the database. A `failed` job is not kept: an
//! operator may still retry it.
//!
//! [`FinishedJobs`] is that memory, bounded by bytes. [`ReplayAudit`] keeps
//! the audit trail of replays without a write per replay: replays are counted
//! per job and written as one `replayed` event per job per flush
//! (`{"count": n, "last_at": ms}`, `at` the first replay's time), all of a
//! flush in one commit. A crash loses at most the replays counted since the
//! last flush (they were never acknowledged as anything but replays).

use crate::domain::{Attempt, Job, JobId, Millis, OwnerId};
use crate::store::{event, NewEvent, Store};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// How often counted replays are written to the event log.
pub const AUDIT_FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Bytes of job rows kept by default (request and result text included).
pub const DEFAULT_CAPACITY_BYTES: usize = 32 << 20;

/// The replay memory of one server: finished jobs, and the replays counted
/// for the audit trail.
#[derive(Default)]
pub struct Replays {
    pub finished: FinishedJobs,
    pub audit: Arc<ReplayAudit>,
}

/// One remembered job, with the digest of a raw body that matched its
/// fingerprint: the same bytes again are the same request, no parse needed.
#[derive(Clone)]
pub struct Remembered {
    pub job: Arc<Job>,
    /// The attempt that won a succeeded job, once a door has read it (its
    /// `output` left out: that is the job's result): a door that answers
    /// with the result names its provider and usage without reading the
    /// job's attempts again. A winning attempt never changes either.
    pub winner: Option<Arc<Attempt>>,
    body_digest: Option<[u8; 32]>,
}

impl Remembered {
    /// Whether `body` is byte for byte a body already found to be this job's request.
    pub fn same_body(&self, digest: &[u8; 32]) -> bool {
        self.body_digest.as_ref() == Some(digest)
    }
}

/// Finished jobs by (owner, idempotency key), bounded by the bytes of their
/// rows. Two generations: lookups check the young one, then the old one
/// (moving a hit to the young); when the young one holds half the budget it
/// becomes the old one and the old one is dropped. Every operation is O(1);
/// a job replayed within the last half-budget of insertions stays.
pub struct FinishedJobs {
    inner: Mutex<Generations>,
    half: usize,
}

#[derive(Default)]
struct Generations {
    young: HashMap<String, Remembered>,
    young_bytes: usize,
    old: HashMap<String, Remembered>,
}

fn slot(owner: &str, key: &str) -> String {
    // Idempotency keys are printable ASCII; a newline cannot occur in one.
    let mut s = String::with_capacity(owner.len() + key.len() + 1);
    s.push_str(owner);
    s.push('\n');
    s.push_str(key);
    s
}

fn size_of(remembered: &Remembered) -> usize {
    let winner = remembered.winner.as_deref().map_or(0, |a| {
        std::mem::size_of::<Attempt>()
            + a.id.len()
            + a.job_id.len()
            + a.provider.len()
            + a.usage.as_ref().map_or(0, String::len)
            + a.provider_request_id.as_ref().map_or(0, String::len)
    });
    job_size(&remembered.job) + winner
}

fn job_size(job: &Job) -> usize {
    std::mem::size_of::<Job>()
        + job.id.len()
        + job.owner_id.len()
        + 2 * job.idempotency_key.len()
        + job.fingerprint.len()
        + job.request.len()
        + job.route.len()
        + job.result.as_ref().map_or(0, String::len)
        + job.completed_by.as_ref().map_or(0, String::len)
        + job.last_error.as_ref().map_or(0, String::len)
        + 64
}

/// The SHA-256 of a raw request body.
pub fn body_digest(body: &[u8]) -> [u8; 32] {
    Sha256::digest(body).into()
}

impl Default for FinishedJobs {
    fn default() -> Self {
        FinishedJobs::with_capacity(DEFAULT_CAPACITY_BYTES)
    }
}

impl FinishedJobs {
    pub fn with_capacity(bytes: usize) -> Self {
        FinishedJobs {
            inner: Mutex::default(),
            half: (bytes / 2).max(1),
        }
    }

    pub fn get(&self, owner: &OwnerId, key: &str) -> Option<Remembered> {
        let slot = slot(owner, key);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(hit) = g.young.get(&slot) {
            return Some(hit.clone());
        }
        let hit = g.old.remove(&slot)?;
        g.insert(slot, hit.clone(), self.half);
        Some(hit)
    }

    /// Keep `job` if it can never change; `body_digest` is the digest of a
    /// raw body whose fingerprint matched it, when known.
    pub fn remember(&self, job: &Job, body_digest: Option<[u8; 32]>) {
        self.keep(job, body_digest, None);
    }

    /// Keep a succeeded `job` with the attempt that won it (`completed_by`),
    /// as a door read it; anything else is kept as [`Self::remember`] would.
    pub fn remember_winner(&self, job: &Job, winner: &Attempt) {
        self.remember_with_winner(job, None, winner);
    }

    /// [`Self::remember`] and [`Self::remember_winner`] in one.
    pub fn remember_with_winner(&self, job: &Job, body_digest: Option<[u8; 32]>, winner: &Attempt) {
        if job.completed_by.as_deref() != Some(winner.id.as_str()) {
            return self.remember(job, body_digest);
        }
        let winner = Attempt {
            output: None,
            ..winner.clone()
        };
        self.keep(job, body_digest, Some(Arc::new(winner)));
    }

    fn keep(&self, job: &Job, body_digest: Option<[u8; 32]>, winner: Option<Arc<Attempt>>) {
        if !job.state.is_settled_for_good() {
            return;
        }
        let slot = slot(&job.owner_id, &job.idempotency_key);
        let mut g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        // What an earlier remembering of this very job knew is kept.
        let earlier = g
            .young
            .get(&slot)
            .or_else(|| g.old.get(&slot))
            .filter(|r| r.job.id == job.id);
        let remembered = Remembered {
            body_digest: body_digest.or_else(|| earlier.and_then(|r| r.body_digest)),
            winner: winner.or_else(|| earlier.and_then(|r| r.winner.clone())),
            job: Arc::new(job.clone()),
        };
        if size_of(&remembered) > self.half / 8 {
            return;
        }
        g.old.remove(&slot);
        g.insert(slot, remembered, self.half);
    }

    /// Jobs held now (both generations).
    pub fn len(&self) -> usize {
        let g = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        g.young.len() + g.old.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl Generations {
    fn insert(&mut self, slot: String, remembered: Remembered, half: usize) {
        let size = size_of(&remembered);
        if let Some(previous) = self.young.insert(slot, remembered) {
            self.young_bytes = self.young_bytes.saturating_sub(size_of(&previous));
        }
        self.young_bytes += size;
        if self.young_bytes >= half {
            self.old = std::mem::take(&mut self.young);
            self.young_bytes = 0;
        }
    }
}

/// Replays counted per job between flushes.
#[derive(Default)]
pub struct ReplayAudit {
    pending: Mutex<HashMap<JobId, Counted>>,
}

struct Counted {
    actor: String,
    count: u64,
    first_at: Millis,
    last_at: Millis,
}

impl ReplayAudit {
    /// Count one replay of `job_id` by `actor` at `at`.
    pub fn record(&self, job_id: &JobId, actor: &str, at: Millis) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        match pending.get_mut(job_id) {
            Some(c) => {
                c.count += 1;
                c.first_at = c.first_at.min(at);
                c.last_at = c.last_at.max(at);
            }
            None => {
                pending.insert(
                    job_id.clone(),
                    Counted {
                        actor: actor.to_string(),
                        count: 1,
                        first_at: at,
                        last_at: at,
                    },
                );
            }
        }
    }

    /// Write what was counted since the last flush, in one commit. On a
    /// failure the counts are lost (logged); the replays were answered.
    pub async fn flush(&self, store: &dyn Store) {
        let drained: Vec<(JobId, Counted)> = {
            let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if pending.is_empty() {
                return;
            }
            pending.drain().collect()
        };
        let events: Vec<NewEvent> = drained
            .into_iter()
            .map(|(job_id, c)| NewEvent {
                job_id,
                attempt_id: None,
                kind: event::REPLAYED,
                actor: c.actor,
                detail: Some(
                    serde_json::json!({ "count": c.count, "last_at": c.last_at }).to_string(),
                ),
                at: c.first_at,
            })
            .collect();
        let n = events.len();
        if let Err(e) = store.record_events(events).await {
            tracing::warn!(error = %e, jobs = n, "replay audit write failed; those replays are not in the event log");
        }
    }

    /// Flush every [`AUDIT_FLUSH_EVERY`] until aborted.
    pub fn spawn_flusher(self: Arc<Self>, store: Arc<dyn Store>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(AUDIT_FLUSH_EVERY);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                self.flush(store.as_ref()).await;
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::JobState;

    fn job(key: &str, state: JobState, result: &str) -> Job {
        Job {
            id: format!("job-{key}").into(),
            owner_id: "acme".into(),
            idempotency_key: key.into(),
            fingerprint: "f".into(),
            request: "{}".into(),
            route: "default".into(),
            state,
            version: 1,
            result: Some(result.into()),
            completed_by: None,
            last_error: None,
            attempt_count: 1,
            created_at: 0,
            updated_at: 0,
            next_run_at: None,
            lease_owner: None,
            lease_until: None,
            budget_start: 0,
        }
    }

    #[test]
    fn only_jobs_that_cannot_change_are_remembered() {
        let jobs = FinishedJobs::default();
        jobs.remember(&job("a", JobState::Succeeded, "x"), None);
        jobs.remember(&job("b", JobState::Cancelled, "x"), None);
        jobs.remember(&job("c", JobState::Failed, "x"), None);
        jobs.remember(&job("d", JobState::Running, "x"), None);
        jobs.remember(&job("e", JobState::NeedsReview, "x"), None);
        assert!(jobs.get(&"acme".into(), "a").is_some());
        assert!(jobs.get(&"acme".into(), "b").is_some());
        assert!(jobs.get(&"acme".into(), "c").is_none());
        assert!(jobs.get(&"acme".into(), "d").is_none());
        assert!(jobs.get(&"acme".into(), "e").is_none());
        assert!(
            jobs.get(&"other-owner".into(), "a").is_none(),
            "keys are per owner"
        );
    }

    #[test]
    fn memory_stays_within_its_budget_and_keeps_what_is_replayed() {
        let one = job_size(&job("k00000", JobState::Succeeded, "x"));
        let jobs = FinishedJobs::with_capacity(100 * one);
        jobs.remember(&job("hot", JobState::Succeeded, "x"), None);
        for i in 0..10_000 {
            jobs.remember(&job(&format!("k{i:05}"), JobState::Succeeded, "x"), None);
            if i % 20 == 0 {
                assert!(
                    jobs.get(&"acme".into(), "hot").is_some(),
                    "a replayed job stays"
                );
            }
        }
        assert!(jobs.len() <= 100, "held {}", jobs.len());
        assert!(
            jobs.get(&"acme".into(), "k00000").is_none(),
            "the oldest went"
        );
        assert!(
            jobs.get(&"acme".into(), "k09999").is_some(),
            "the newest stays"
        );
    }

    #[test]
    fn a_body_digest_is_kept_across_a_refresh() {
        let jobs = FinishedJobs::default();
        let digest = body_digest(b"{\"messages\":[]}");
        jobs.remember(&job("a", JobState::Succeeded, "x"), Some(digest));
        jobs.remember(&job("a", JobState::Succeeded, "x"), None);
        let hit = jobs.get(&"acme".into(), "a").expect("remembered");
        assert!(hit.same_body(&digest));
        assert!(!hit.same_body(&body_digest(b"{}")));
    }
}
