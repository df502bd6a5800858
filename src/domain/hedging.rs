//! The arithmetic of hedging that tunes itself ("The Tail at Scale"): a
//! route's [`HedgePolicy`], a [`LatencyEstimate`] of one provider's time to
//! first token (streamed) or to answer (not streamed) that forgets at a
//! chosen pace, and the [`HedgeWindow`] of a route's jobs and hedges over a
//! sliding window, which holds the hedge budget and the cost of hedging.
//! Time is passed in, so everything here is pure.

use super::Millis;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Samples a provider needs (decayed: recent ones weigh more) before its
/// learned threshold replaces the route's fixed `silence_ms`.
pub const MIN_SAMPLES: f64 = 30.0;

/// Buckets grow by this factor: a quantile is read within ±2.5%.
const GROWTH: f64 = 1.05;

/// The sliding window is kept in this many slots.
const SLOTS: i64 = 20;

/// The default lower clamp of a learned threshold.
pub const DEFAULT_SILENCE_MIN_MS: u64 = 50;

/// The default budget of a route with `silence = "auto"`.
pub const DEFAULT_BUDGET_PERCENT: f64 = 5.0;

/// What a route says about hedging, with its defaults resolved.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct HedgePolicy {
    pub auto: bool,
    pub quantile: f64,
    pub fixed_ms: u64,
    pub min_ms: u64,
    pub max_ms: u64,
    /// `None`: hedges are not budgeted (a fixed silence without a budget).
    pub budget_percent: Option<f64>,
    pub window_ms: i64,
}

impl HedgePolicy {
    /// The longest silence a round of this route may wait before hedging.
    pub fn longest_silence_ms(&self) -> u64 {
        if self.auto {
            self.max_ms.max(self.fixed_ms)
        } else {
            self.fixed_ms
        }
    }

    /// The threshold in force for a provider whose estimate is `estimate`:
    /// the learned quantile, clamped, once it rests on [`MIN_SAMPLES`];
    /// otherwise (or with a fixed silence) `silence_ms`. The flag says
    /// whether it was learned.
    pub fn threshold_ms(&self, estimate: Option<&Reading>) -> (u64, bool) {
        match estimate {
            Some(r) if self.auto && r.samples >= MIN_SAMPLES => match r.quantile(self.quantile) {
                Some(q) => ((q.round() as u64).clamp(self.min_ms, self.max_ms), true),
                None => (self.fixed_ms, false),
            },
            _ => (self.fixed_ms, false),
        }
    }
}

fn bucket_of(ms: f64) -> i32 {
    (ms.max(1.0).ln() / GROWTH.ln()).floor() as i32
}

fn bucket_low(b: i32) -> f64 {
    GROWTH.powi(b)
}

/// A histogram of latencies on log-spaced buckets whose samples' weights
/// halve every `half_life_ms` ("forward decay": a sample is added with a
/// weight that grows with its time, so nothing is touched to age the rest).
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyEstimate {
    half_life_ms: f64,
    /// The time weights are relative to.
    origin: Millis,
    buckets: BTreeMap<i32, f64>,
    /// Samples ever added (not decayed), for ops.
    pub observed: u64,
}

impl LatencyEstimate {
    pub fn new(half_life_ms: i64, now: Millis) -> Self {
        LatencyEstimate {
            half_life_ms: half_life_ms.max(1) as f64,
            origin: now,
            buckets: BTreeMap::new(),
            observed: 0,
        }
    }

    fn growth(&self, at: Millis) -> f64 {
        ((at - self.origin) as f64 / self.half_life_ms).exp2()
    }

    /// Move the origin to `now` when weights would grow too large.
    fn rebase(&mut self, now: Millis) {
        if (now - self.origin) as f64 > 40.0 * self.half_life_ms {
            let scale = 1.0 / self.growth(now);
            self.buckets.values_mut().for_each(|w| *w *= scale);
            self.buckets.retain(|_, w| *w > 1e-9);
            self.origin = now;
        }
    }

    /// One latency of `ms` observed at `now`.
    pub fn observe(&mut self, ms: i64, now: Millis) {
        self.rebase(now);
        let w = self.growth(now);
        *self.buckets.entry(bucket_of(ms as f64)).or_default() += w;
        self.observed += 1;
    }

    /// The estimate as of `now`: weights decayed to `now`, per bucket.
    pub fn snapshot(&self, now: Millis) -> Snapshot {
        Snapshot {
            at: now,
            half_life_ms: self.half_life_ms as i64,
            buckets: self.decayed(now).collect(),
            observed: self.observed,
        }
    }

    /// Each bucket's weight decayed to `now`, by bucket, leaving out those
    /// that have decayed to nothing.
    fn decayed(&self, now: Millis) -> impl Iterator<Item = (i32, f64)> + '_ {
        let scale = 1.0 / self.growth(now);
        self.buckets
            .iter()
            .map(move |(b, w)| (*b, w * scale))
            .filter(|(_, w)| *w > 1e-6)
    }
}

/// A [`LatencyEstimate`] as of one instant: what instances share through
/// the database.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Snapshot {
    pub at: Millis,
    pub half_life_ms: i64,
    /// (bucket, weight at `at`).
    pub buckets: Vec<(i32, f64)>,
    pub observed: u64,
}

/// Snapshots merged and decayed to one instant: what a threshold is read from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reading {
    /// Decayed sample count.
    pub samples: f64,
    pub observed: u64,
    /// (bucket, weight), by bucket, each bucket once. A reading is made
    /// for each round a job starts, so it is a vector, not a map: a map
    /// allocated a node for each of the tens of buckets, each time.
    buckets: Vec<(i32, f64)>,
}

impl Reading {
    /// Add `snapshot`, decayed from its instant to `now`.
    pub fn add(&mut self, snapshot: &Snapshot, now: Millis) {
        let age = (now - snapshot.at).max(0) as f64;
        let scale = (-age / snapshot.half_life_ms.max(1) as f64).exp2();
        self.merge(snapshot.buckets.iter().map(|(b, w)| (*b, w * scale)));
        self.observed += snapshot.observed;
    }

    /// Add `estimate` as of `now`: the same as adding its
    /// [`snapshot`](LatencyEstimate::snapshot) at `now`, without making one.
    pub fn add_estimate(&mut self, estimate: &LatencyEstimate, now: Millis) {
        self.merge(estimate.decayed(now));
        self.observed += estimate.observed;
    }

    /// Add each (bucket, weight) to the bucket's weight, in the order given
    /// (so the sums are the same as a map's would be).
    fn merge(&mut self, weights: impl Iterator<Item = (i32, f64)>) {
        let had = self.buckets.len();
        // One allocation, not one per doubling: a reading is made for each
        // round a job starts.
        let (_, most) = weights.size_hint();
        self.buckets.reserve(most.unwrap_or(0));
        for (b, w) in weights {
            self.buckets.push((b, w));
            self.samples += w;
        }
        let sorted = self.buckets.windows(2).all(|p| p[0].0 < p[1].0);
        if had == 0 && sorted {
            return;
        }
        // Stable: a bucket's weights stay in the order they were added.
        self.buckets.sort_by_key(|(b, _)| *b);
        let mut merged: Vec<(i32, f64)> = Vec::with_capacity(self.buckets.len());
        for (b, w) in self.buckets.drain(..) {
            match merged.last_mut() {
                Some((last, sum)) if *last == b => *sum += w,
                _ => merged.push((b, w)),
            }
        }
        self.buckets = merged;
    }

    /// The `q` quantile (ms), interpolated within its bucket.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        if self.samples <= 0.0 {
            return None;
        }
        let target = q.clamp(0.0, 1.0) * self.samples;
        let mut seen = 0.0;
        for (b, w) in &self.buckets {
            if seen + w >= target {
                let within = if *w > 0.0 { (target - seen) / w } else { 0.0 };
                let (lo, hi) = (bucket_low(*b), bucket_low(b + 1));
                return Some(lo + (hi - lo) * within);
            }
            seen += w;
        }
        self.buckets.last().map(|(b, _)| bucket_low(b + 1))
    }
}

/// What a route's window counts; summed over slots and instances.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct HedgeCounts {
    /// Jobs that started their first round on the route.
    pub jobs: u64,
    /// Hedges started (after a silence or to back up an unknown attempt).
    pub hedges: u64,
    /// Hedges whose answer won the job.
    pub hedges_won: u64,
    /// Hedges the budget refused.
    pub denied: u64,
    /// Winning hedges whose primary also answered (within the loser grace).
    pub saved_samples: u64,
    /// ... and how much earlier the hedge's answer was, summed (ms).
    pub saved_ms: u64,
    /// Tokens of attempts whose answer was discarded (lost the CAS).
    pub discarded_tokens: u64,
}

impl HedgeCounts {
    fn add(&mut self, o: &HedgeCounts) {
        self.jobs += o.jobs;
        self.hedges += o.hedges;
        self.hedges_won += o.hedges_won;
        self.denied += o.denied;
        self.saved_samples += o.saved_samples;
        self.saved_ms += o.saved_ms;
        self.discarded_tokens += o.discarded_tokens;
    }

    /// Hedges per job in the window.
    pub fn hedge_rate(&self) -> f64 {
        ratio(self.hedges, self.jobs)
    }

    /// Winning hedges per hedge.
    pub fn win_rate(&self) -> f64 {
        ratio(self.hedges_won, self.hedges)
    }

    /// Whether one more hedge stays within `percent` of the jobs.
    pub fn admits_hedge(&self, percent: f64) -> bool {
        (self.hedges + 1) as f64 * 100.0 <= percent * self.jobs as f64
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Counts over a sliding window of `window_ms`, in slots of a twentieth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HedgeWindow {
    pub window_ms: i64,
    /// (slot number: time / slot width, counts), oldest first.
    pub slots: Vec<(i64, HedgeCounts)>,
}

impl HedgeWindow {
    pub fn new(window_ms: i64) -> Self {
        HedgeWindow {
            window_ms: window_ms.max(SLOTS),
            slots: Vec::new(),
        }
    }

    fn slot_ms(&self) -> i64 {
        (self.window_ms / SLOTS).max(1)
    }

    /// The oldest slot still inside the window at `now`.
    fn first_slot(&self, now: Millis) -> i64 {
        now / self.slot_ms() - SLOTS + 1
    }

    /// The counts of the slot `now` falls in, to add to.
    pub fn at(&mut self, now: Millis) -> &mut HedgeCounts {
        let slot = now / self.slot_ms();
        let first = self.first_slot(now);
        self.slots.retain(|(s, _)| *s >= first);
        if self.slots.last().is_none_or(|(s, _)| *s < slot) {
            self.slots.push((slot, HedgeCounts::default()));
        }
        let i = self
            .slots
            .iter()
            .rposition(|(s, _)| *s <= slot)
            .unwrap_or(0);
        &mut self.slots[i].1
    }

    /// The counts inside the window at `now`.
    pub fn total(&self, now: Millis) -> HedgeCounts {
        let first = self.first_slot(now);
        let mut sum = HedgeCounts::default();
        for (_, c) in self.slots.iter().filter(|(s, _)| *s >= first) {
            sum.add(c);
        }
        sum
    }

    /// Add another window's counts (another instance's) inside this window at `now`.
    pub fn total_with(&self, others: &[&HedgeWindow], now: Millis) -> HedgeCounts {
        let mut sum = self.total(now);
        for o in others {
            // Another instance's slots are read in time, not slot numbers:
            // its window may be another width after a config change.
            let width = o.slot_ms();
            for (s, c) in &o.slots {
                if (s + 1) * width > now - self.window_ms && s * width <= now {
                    sum.add(c);
                }
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn read(e: &LatencyEstimate, now: Millis) -> Reading {
        let mut r = Reading::default();
        r.add(&e.snapshot(now), now);
        r
    }

    #[test]
    fn the_quantile_of_a_uniform_sample_is_within_its_bucket() {
        let mut e = LatencyEstimate::new(60_000, 0);
        for ms in 1..=1000 {
            e.observe(ms, 0);
        }
        let r = read(&e, 0);
        let p95 = r.quantile(0.95).unwrap();
        assert!((p95 - 950.0).abs() < 950.0 * 0.05, "p95 {p95}");
        let p50 = r.quantile(0.5).unwrap();
        assert!((p50 - 500.0).abs() < 500.0 * 0.05, "p50 {p50}");
        assert!((r.samples - 1000.0).abs() < 1e-6);
    }

    #[test]
    fn old_samples_fade_so_the_estimate_follows_a_slower_provider() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut e = LatencyEstimate::new(10_000, 0);
        // 40 s of a provider answering in 100-200 ms, one sample per 10 ms.
        for t in (0..40_000).step_by(10) {
            e.observe(rng.gen_range(100..=200), t);
        }
        let before = read(&e, 40_000).quantile(0.95).unwrap();
        assert!((185.0..=205.0).contains(&before), "{before}");
        // Five times slower for four half-lives.
        for t in (40_000..80_000).step_by(10) {
            e.observe(rng.gen_range(500..=1_000), t);
        }
        let after = read(&e, 80_000).quantile(0.95).unwrap();
        assert!((900.0..=1_010.0).contains(&after), "{after}");
        // One sample per 10 ms with a half-life of 10 s: about 1,443
        // samples' worth (1 / (1 - 2^-0.001)), however long it runs.
        let r = read(&e, 80_000);
        assert!((1_400.0..=1_460.0).contains(&r.samples), "{}", r.samples);
    }

    #[test]
    fn an_estimate_survives_a_long_run_of_rebasing() {
        let mut e = LatencyEstimate::new(1_000, 0);
        for t in (0..10_000_000).step_by(1_000) {
            e.observe(300, t);
        }
        // Read at the last sample: 1 + 1/2 + 1/4 + … samples' worth.
        let r = read(&e, 9_999_000);
        assert!((r.samples - 2.0).abs() < 0.01, "{}", r.samples);
        let q = r.quantile(0.95).unwrap();
        assert!((285.0..=315.0).contains(&q), "{q}");
    }

    #[test]
    fn an_estimate_added_directly_reads_as_its_snapshot() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let (mut a, mut b) = (
            LatencyEstimate::new(5_000, 0),
            LatencyEstimate::new(5_000, 0),
        );
        for t in 0..2_000 {
            a.observe(rng.gen_range(1..5_000), t * 10);
            b.observe(rng.gen_range(1..500), t * 10);
        }
        let now = 30_000;
        let (mut by_snapshot, mut direct) = (Reading::default(), Reading::default());
        by_snapshot.add(&a.snapshot(now), now);
        by_snapshot.add(&b.snapshot(now - 1_000), now);
        direct.add_estimate(&a, now);
        direct.add(&b.snapshot(now - 1_000), now);
        assert_eq!(direct, by_snapshot);
        assert!(direct.buckets.windows(2).all(|p| p[0].0 < p[1].0));
        assert!(direct.buckets.len() > 10, "{:?}", direct.buckets);
        for q in [0.5, 0.9, 0.95, 0.99] {
            assert_eq!(direct.quantile(q), by_snapshot.quantile(q));
        }
        // Each bucket's weight is the sum of both estimates' weights there.
        let shared = a
            .snapshot(now)
            .buckets
            .iter()
            .filter(|(x, _)| b.snapshot(now - 1_000).buckets.iter().any(|(y, _)| x == y))
            .count();
        assert!(shared > 0);
        assert_eq!(
            direct.buckets.len(),
            a.snapshot(now).buckets.len() + b.snapshot(now - 1_000).buckets.len() - shared
        );
    }

    #[test]
    fn snapshots_of_two_instances_add_up() {
        let (mut a, mut b) = (
            LatencyEstimate::new(10_000, 0),
            LatencyEstimate::new(10_000, 0),
        );
        for _ in 0..50 {
            a.observe(100, 0);
            b.observe(1_000, 10_000);
        }
        // a wrote its snapshot a half-life ago; b's is fresh.
        let mut r = Reading::default();
        r.add(&a.snapshot(0), 10_000);
        r.add(&b.snapshot(10_000), 10_000);
        assert!((r.samples - 75.0).abs() < 0.01, "{}", r.samples);
        assert_eq!(r.observed, 100);
        let p50 = r.quantile(0.5).unwrap();
        assert!(p50 > 900.0, "{p50}");
    }

    #[test]
    fn the_budget_admits_a_share_of_the_window_and_forgets_old_slots() {
        let mut w = HedgeWindow::new(10_000);
        for t in 0..100 {
            w.at(t * 10).jobs += 1;
        }
        let mut started = 0;
        for _ in 0..10 {
            if w.total(1_000).admits_hedge(5.0) {
                w.at(1_000).hedges += 1;
                started += 1;
            } else {
                w.at(1_000).denied += 1;
            }
        }
        assert_eq!(started, 5);
        assert_eq!(w.total(1_000).denied, 5);
        // A window later, nothing of it is left.
        assert_eq!(w.total(12_000), HedgeCounts::default());
        assert!(!w.total(12_000).admits_hedge(5.0));
        // Another instance's jobs count too.
        let mut other = HedgeWindow::new(10_000);
        other.at(11_000).jobs += 40;
        assert!(w.total_with(&[&other], 12_000).admits_hedge(5.0));
        assert_eq!(w.total_with(&[&other], 30_000).jobs, 0);
    }
}
