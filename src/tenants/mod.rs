//! Tenants that can be trusted: who is calling (keys, cached on the hot
//! path), how much they may ask (rate, concurrent jobs, tokens per day), and
//! what they used.
//!
//! - The key cache: a presented key is looked up once, then answered from
//!   memory. Every change that must reach running servers (a key revoked or
//!   rotated, an owner's limits) bumps one counter row in the same commit;
//!   a watcher reads it every [`WATCH_EVERY`] and empties the cache when it
//!   moves. Should the counter not have been read for [`STALE_AFTER`] (a
//!   slow or unreachable database), the cache is not trusted: every request
//!   looks its key up, so a revocation is honoured within about a second on
//!   every instance whatever the database does. Expiry is checked against
//!   the cached expiry time on every request, so it needs no poll.
//! - `last used`: noted in memory per request, written by the watcher for
//!   all keys used since, one batch per [`FLUSH_EVERY`].
//! - Limits: see [`limits`]. The request rate is a token bucket per owner in
//!   each process; the processes on one database heartbeat into
//!   `instances`, and each enforces `rate / live instances` (burst likewise,
//!   at least 1). Concurrent jobs and tokens per day are read from the
//!   database when a new job is admitted, so they hold across instances up
//!   to the jobs admitted at the same moment (see [`check_new_job`]).

pub mod limits;
pub mod usage;

use crate::clock::Clock;
use crate::domain::{Millis, OwnerId};
use crate::keys::{hash_key, Caller, KEY_PREFIX};
use crate::store::tenants::{day_of, OwnerLoad, MS_PER_DAY};
use crate::store::{Store, StoreError};
use limits::{Limits, LimitsConfig, RateBuckets};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

/// How often the change counter is read.
pub const WATCH_EVERY: Duration = Duration::from_millis(250);
/// Past this without a successful read of the counter, the key cache is bypassed.
pub const STALE_AFTER: Duration = Duration::from_millis(1_000);
/// How often `last used` and the instance heartbeat are written.
pub const FLUSH_EVERY: Duration = Duration::from_millis(1_000);
/// An instance not seen for this long no longer counts for the rate split.
const INSTANCE_TTL_MS: Millis = 5_000;
const CACHE_MAX: usize = 100_000;

/// Why a request or a new job is refused by a limit. `who` says whose
/// limit: `owner acme`, or `key 0193… of owner acme` for a key's own (a
/// rotated key's names the key sent and the one whose limit it shares).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LimitError {
    #[error("{who} is over its request rate ({rate}/s); retry after {retry_after_ms} ms")]
    RateLimited {
        who: String,
        rate: f64,
        retry_after_ms: u64,
    },
    #[error(
        "{who} has {active} jobs pending or running, its limit is {limit}; retry when one finishes"
    )]
    ConcurrencyLimited {
        who: String,
        active: i64,
        limit: u32,
    },
    #[error("{who} has used {used} of its {limit} tokens today (UTC){detail}; the budget renews at 00:00 UTC")]
    BudgetExhausted {
        who: String,
        used: i64,
        limit: u64,
        detail: String,
        retry_after_secs: u64,
    },
}

impl LimitError {
    pub fn code(&self) -> &'static str {
        match self {
            LimitError::RateLimited { .. } => "rate_limited",
            LimitError::ConcurrencyLimited { .. } => "concurrency_limited",
            LimitError::BudgetExhausted { .. } => "budget_exhausted",
        }
    }

    /// `Retry-After`, in milliseconds.
    pub fn retry_after_ms(&self) -> u64 {
        match self {
            LimitError::RateLimited { retry_after_ms, .. } => *retry_after_ms,
            LimitError::ConcurrencyLimited { .. } => 1_000,
            LimitError::BudgetExhausted {
                retry_after_secs, ..
            } => retry_after_secs * 1_000,
        }
    }

    /// Whether an SDK should retry by itself (`x-should-retry`): a rate or
    /// concurrency refusal clears soon; a spent budget does not.
    pub fn should_retry(&self) -> bool {
        !matches!(self, LimitError::BudgetExhausted { .. })
    }
}

/// A request let through the rate limit, with the owner's limits (and the
/// key's own) for the checks a new job needs.
#[derive(Debug, Clone, PartialEq)]
pub struct Admission {
    pub owner: OwnerId,
    pub limits: Limits,
    /// The key (family) the job is made with, and its own limits.
    pub key: Option<(String, Limits)>,
    /// The key the caller sent, when it is not its family's first (a
    /// rotation's successor): what a refusal names.
    pub sent_key: Option<String>,
}

impl Admission {
    /// No limits at all (tools and tests that submit directly).
    pub fn unlimited(owner: &OwnerId) -> Admission {
        Admission {
            owner: owner.clone(),
            limits: Limits::default(),
            key: None,
            sent_key: None,
        }
    }

    /// Whose limit a key's refusal is: the key the caller sent, and, when
    /// that key was rotated from `family`, that the two share one limit
    /// (one rate bucket, one count of live jobs and tokens).
    fn key_who(&self, family: &str) -> String {
        match self.sent_key.as_deref().filter(|sent| *sent != family) {
            Some(sent) => format!(
                "key {sent} of owner {} (rotated from key {family}, whose limits and counts it shares)",
                self.owner
            ),
            None => format!("key {family} of owner {}", self.owner),
        }
    }
}

#[derive(Debug, Clone)]
struct CachedKey {
    caller: Caller,
    expires_at: Option<Millis>,
}

pub struct Tenants {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    config: LimitsConfig,
    instance_id: String,
    /// Presented key → who it is. Positive lookups only.
    cache: RwLock<HashMap<String, CachedKey>>,
    /// Bumped whenever the cache is emptied: a lookup that began before may
    /// have read what the change replaced, so it must not fill the cache.
    generation: AtomicU64,
    /// The counter's value last read, and when (ms since `started`).
    seen_changes: AtomicI64,
    last_watch_ms: AtomicU64,
    started: Instant,
    /// Run-time limits per owner (over the config's).
    overrides: RwLock<Arc<HashMap<OwnerId, Limits>>>,
    /// Whether any owner has any limit (else admission is a no-op).
    any_limits: std::sync::atomic::AtomicBool,
    live_instances: AtomicU64,
    buckets: RateBuckets,
    /// Request-rate buckets of keys with a rate of their own, by key family.
    key_buckets: RateBuckets,
    /// Key id → last use not yet written.
    used: Mutex<HashMap<String, Millis>>,
}

impl Tenants {
    /// Load run-time limits and the change counter; fails when the store does.
    pub async fn load(
        store: Arc<dyn Store>,
        clock: Arc<dyn Clock>,
        config: LimitsConfig,
    ) -> Result<Arc<Tenants>, StoreError> {
        let tenants = Arc::new(Tenants {
            store,
            clock,
            any_limits: std::sync::atomic::AtomicBool::new(false),
            config,
            instance_id: crate::domain::new_id(),
            cache: RwLock::default(),
            generation: AtomicU64::new(0),
            seen_changes: AtomicI64::new(-1),
            last_watch_ms: AtomicU64::new(0),
            started: Instant::now(),
            overrides: RwLock::default(),
            live_instances: AtomicU64::new(1),
            buckets: RateBuckets::default(),
            key_buckets: RateBuckets::default(),
            used: Mutex::default(),
        });
        tenants.watch_once().await?;
        tenants.heartbeat().await?;
        Ok(tenants)
    }

    fn since_start_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn cache_trusted(&self) -> bool {
        let last = self.last_watch_ms.load(Ordering::Acquire);
        self.since_start_ms().saturating_sub(last) < STALE_AFTER.as_millis() as u64
    }

    fn clear_cache(&self) {
        let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
        self.generation.fetch_add(1, Ordering::AcqRel);
        cache.clear();
    }

    /// Who a presented key belongs to, if it is live (not revoked, not expired).
    pub async fn authenticate(&self, presented: &str) -> Result<Option<Caller>, StoreError> {
        let now = self.clock.now_ms();
        if self.cache_trusted() {
            let hit = self
                .cache
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .get(presented)
                .cloned();
            if let Some(entry) = hit {
                if entry.expires_at.is_some_and(|e| e <= now) {
                    return Ok(None);
                }
                self.note_use(&entry.caller.key_id, now);
                return Ok(Some(entry.caller));
            }
        }
        if !presented.starts_with(KEY_PREFIX) || presented.len() > 256 {
            return Ok(None);
        }
        let generation = self.generation.load(Ordering::Acquire);
        let Some(key) = self.store.find_api_key(&hash_key(presented)).await? else {
            return Ok(None);
        };
        if !key.is_live_at(now) {
            return Ok(None);
        }
        let caller = Caller::of(&key);
        {
            let mut cache = self.cache.write().unwrap_or_else(|e| e.into_inner());
            if self.generation.load(Ordering::Acquire) == generation {
                if cache.len() >= CACHE_MAX {
                    cache.clear();
                }
                cache.insert(
                    presented.to_string(),
                    CachedKey {
                        caller: caller.clone(),
                        expires_at: key.expires_at,
                    },
                );
            }
        }
        self.note_use(&key.id, now);
        Ok(Some(caller))
    }

    fn note_use(&self, key_id: &str, now: Millis) {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        match used.get_mut(key_id) {
            Some(at) => *at = (*at).max(now),
            None => {
                used.insert(key_id.to_string(), now);
            }
        }
    }

    /// The limits that apply to `owner` now.
    pub fn limits_for(&self, owner: &OwnerId) -> Limits {
        let base = self.config.for_owner(owner);
        match self
            .overrides
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(owner)
        {
            Some(o) => o.over(base),
            None => base,
        }
    }

    pub fn config(&self) -> &LimitsConfig {
        &self.config
    }

    /// How many servers share this database now (for the rate split).
    pub fn live_instances(&self) -> u64 {
        self.live_instances.load(Ordering::Acquire).max(1)
    }

    /// The request-rate check, made for every job request (replays too):
    /// the key's own rate, if it has one, then its owner's; both must pass.
    /// (A request the owner's bucket refuses has still taken its key's token.)
    pub fn admit(&self, caller: &Caller) -> Result<Admission, LimitError> {
        let key_limits = caller.key_limits;
        if !self.any_limits.load(Ordering::Acquire) && key_limits.is_unlimited() {
            let mut admission = Admission::unlimited(&caller.owner_id);
            admission.key = Some((caller.key_family.clone(), key_limits));
            admission.sent_key = Some(caller.key_id.clone());
            return Ok(admission);
        }
        let admission = Admission {
            owner: caller.owner_id.clone(),
            limits: self.limits_for(&caller.owner_id),
            key: Some((caller.key_family.clone(), key_limits)),
            sent_key: Some(caller.key_id.clone()),
        };
        let n = self.live_instances() as f64;
        let now = Instant::now();
        let take = |buckets: &RateBuckets, name: &str, limits: &Limits, who: String| {
            let Some(rate) = limits.requests_per_second else {
                return Ok(());
            };
            let capacity = (limits.burst_or_default() / n).max(1.0);
            buckets
                .take(name, rate / n, capacity, now)
                .map_err(|wait| LimitError::RateLimited {
                    who,
                    rate,
                    retry_after_ms: (wait.as_millis() as u64).max(1),
                })
        };
        take(
            &self.key_buckets,
            &caller.key_family,
            &key_limits,
            admission.key_who(&caller.key_family),
        )?;
        take(
            &self.buckets,
            &caller.owner_id,
            &admission.limits,
            format!("owner {}", caller.owner_id),
        )?;
        Ok(admission)
    }

    /// Read the change counter; on a move, empty the key cache and reload
    /// the run-time limits.
    pub async fn watch_once(&self) -> Result<(), StoreError> {
        let version = self.store.tenant_changes().await?;
        if version != self.seen_changes.load(Ordering::Acquire) {
            let rows = self.store.owner_limits().await?;
            let mut fresh = HashMap::new();
            for row in rows {
                match serde_json::from_str::<Limits>(&row.limits) {
                    Ok(l) => {
                        fresh.insert(row.owner_id, l);
                    }
                    Err(e) => {
                        tracing::error!(owner = %row.owner_id, error = %e, "unreadable stored limits; ignored")
                    }
                }
            }
            let any = !self.config.default.is_unlimited()
                || self.config.owners.values().any(|l| !l.is_unlimited())
                || fresh.values().any(|l| !l.is_unlimited());
            *self.overrides.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(fresh);
            self.any_limits.store(any, Ordering::Release);
            self.clear_cache();
            self.seen_changes.store(version, Ordering::Release);
        }
        self.last_watch_ms
            .store(self.since_start_ms(), Ordering::Release);
        Ok(())
    }

    /// Write `last used` of the keys used since the last flush, heartbeat,
    /// and count the live instances.
    pub async fn heartbeat(&self) -> Result<(), StoreError> {
        let used: Vec<(String, Millis)> = {
            let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
            used.drain().collect()
        };
        if !used.is_empty() {
            self.store.touch_api_keys(used).await?;
        }
        let now = self.clock.now_ms();
        let n = self
            .store
            .heartbeat(&self.instance_id, now, now - INSTANCE_TTL_MS)
            .await?;
        self.live_instances
            .store(n.max(1) as u64, Ordering::Release);
        Ok(())
    }

    /// Leave the instance count and write the last `last used` (at shutdown).
    pub async fn stop(&self) {
        if let Err(e) = self.heartbeat().await {
            tracing::warn!(error = %e, "last key-use write failed");
        }
        if let Err(e) = self.store.leave_instances(&self.instance_id).await {
            tracing::warn!(error = %e, "could not leave the instance list");
        }
    }

    /// Watch every [`WATCH_EVERY`], heartbeat every [`FLUSH_EVERY`], until
    /// aborted. A failure is logged once per streak; the old state stays
    /// (and the key cache stops being trusted after [`STALE_AFTER`]).
    pub fn spawn_watcher(self: Arc<Self>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(WATCH_EVERY);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_flush = Instant::now();
            let mut failing = false;
            loop {
                ticker.tick().await;
                let mut result = self.watch_once().await;
                if result.is_ok() && last_flush.elapsed() >= FLUSH_EVERY {
                    last_flush = Instant::now();
                    result = self.heartbeat().await;
                }
                match result {
                    Ok(()) if failing => {
                        failing = false;
                        tracing::info!("tenant watcher reads the database again");
                    }
                    Ok(()) => {}
                    Err(e) if !failing => {
                        failing = true;
                        tracing::warn!(error = %e, "tenant watcher cannot read the database; keys are looked up per request until it can");
                    }
                    Err(_) => {}
                }
            }
        })
    }
}

/// The checks a new job needs (not a replay): the owner's live jobs and
/// today's tokens, read in one query when either is limited. Exact for
/// tokens already recorded; jobs admitted at the same moment (on this or
/// another instance) all pass a check that sees none of them, and a job's
/// own tokens are known only when its attempts end, so the budget may be
/// overrun by what the jobs in flight when it ran out go on to use.
pub async fn check_new_job(
    store: &dyn Store,
    now: Millis,
    admission: &Admission,
    max_tokens: Option<u32>,
) -> Result<(), CheckError> {
    let key = admission
        .key
        .as_ref()
        .filter(|(_, limits)| limits.needs_load());
    if !admission.limits.needs_load() && key.is_none() {
        return Ok(());
    }
    let load: OwnerLoad = store
        .owner_load(
            &admission.owner,
            key.map(|(id, _)| id.as_str()),
            day_of(now),
        )
        .await?;
    // The key's own limits first: the narrower refusal says more.
    if let Some((id, limits)) = key {
        within(
            limits,
            load.key_active_jobs,
            load.key_tokens_today,
            admission.key_who(id),
            now,
            max_tokens,
        )?;
    }
    within(
        &admission.limits,
        load.active_jobs,
        load.tokens_today,
        format!("owner {}", admission.owner),
        now,
        max_tokens,
    )
}

/// Whether one more job fits `limits`, given the live jobs and today's
/// tokens of whoever they belong to (`who`).
fn within(
    limits: &Limits,
    active_jobs: i64,
    tokens_today: i64,
    who: String,
    now: Millis,
    max_tokens: Option<u32>,
) -> Result<(), CheckError> {
    if let Some(limit) = limits.concurrent_jobs {
        if active_jobs >= i64::from(limit) {
            return Err(CheckError::Limited(LimitError::ConcurrencyLimited {
                who,
                active: active_jobs,
                limit,
            }));
        }
    }
    if let Some(limit) = limits.tokens_per_day {
        let asked = max_tokens.map_or(0, i64::from);
        let over = tokens_today >= limit as i64 || tokens_today + asked > limit as i64;
        if over {
            let next_day = (day_of(now) + 1) * MS_PER_DAY;
            let detail = if tokens_today < limit as i64 {
                format!(" and this job may use {asked} more (max_tokens)")
            } else {
                String::new()
            };
            return Err(CheckError::Limited(LimitError::BudgetExhausted {
                who,
                used: tokens_today,
                limit,
                detail,
                retry_after_secs: ((next_day - now) as u64).div_ceil(1000).max(1),
            }));
        }
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Limited(#[from] LimitError),
    #[error(transparent)]
    Store(#[from] StoreError),
}
