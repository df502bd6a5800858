//! The invariants (`docs/design.md`), checked on what a run left and on what its
//! clients saw along the way.

use super::world::{Outcome, Seen, EPOCH_MS};
use onejob::domain::{AttemptKind, AttemptState, JobState};
use onejob::providers::stable_key;
use std::collections::{BTreeMap, BTreeSet};

pub fn violations(o: &Outcome) -> Vec<String> {
    let mut v = o.live_violations.clone();
    let jobs_by_id: BTreeMap<&str, _> = o.jobs.iter().map(|j| (j.id.as_str(), j)).collect();

    // 1. One job per intent: every answer for a key named the same job, and
    //    the database holds one job per key.
    // 2. Every accepted submit's body is the job's: another body under the
    //    key was a conflict (whichever body came first made the job).
    let mut ids_by_key: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for seen in &o.seen {
        let (Seen::Accepted {
            key,
            job_id,
            text,
            at,
            ..
        }
        | Seen::ConflictAccepted {
            key,
            job_id,
            text,
            at,
        }) = seen
        else {
            continue;
        };
        ids_by_key.entry(key).or_default().insert(job_id);
        let stored = jobs_by_id.get(job_id.as_str()).and_then(|job| {
            let request: serde_json::Value = serde_json::from_str(&job.request).ok()?;
            request["messages"][0]["content"]
                .as_str()
                .map(str::to_string)
        });
        if stored.as_deref() != Some(text.as_str()) {
            v.push(format!(
                "invariant 2: {text:?} under key {key} was answered at t={} with job {job_id}, whose request says {stored:?}",
                at - EPOCH_MS
            ));
        }
    }
    for (key, ids) in &ids_by_key {
        if ids.len() != 1 {
            v.push(format!(
                "invariant 1: key {key} was answered with jobs {ids:?}"
            ));
        }
    }
    let mut keys_in_db: BTreeMap<&str, usize> = BTreeMap::new();
    for job in &o.jobs {
        *keys_in_db.entry(&job.idempotency_key).or_default() += 1;
    }
    for (key, n) in &keys_in_db {
        if *n != 1 {
            v.push(format!(
                "invariant 1: {n} jobs in the database for key {key}"
            ));
        }
    }

    // 8. Nothing acknowledged is lost.
    for (key, ids) in &ids_by_key {
        for id in ids {
            match jobs_by_id.get(id) {
                Some(job) if job.idempotency_key == *key => {}
                Some(job) => v.push(format!(
                    "invariant 8: job {id} acknowledged for key {key} has key {}",
                    job.idempotency_key
                )),
                None => v.push(format!(
                    "invariant 8: job {id} acknowledged for key {key} is gone"
                )),
            }
        }
    }

    // A result never changes once set; a final state never changes; the
    // version never goes back (as a client polling the job would see).
    let mut history: BTreeMap<&str, Vec<(i64, &onejob::domain::Job)>> = BTreeMap::new();
    for (at, job) in &o.samples {
        history.entry(&job.id).or_default().push((*at, job));
    }
    for job in &o.jobs {
        history.entry(&job.id).or_default().push((i64::MAX, job));
    }
    for (id, seen) in &history {
        // `POST /retry` may give a failed job another try (the README's API).
        let retried = o
            .events
            .get(*id)
            .is_some_and(|events| events.iter().any(|e| e.kind == "retry_requested"));
        for pair in seen.windows(2) {
            let ((_, a), (at, b)) = (pair[0], pair[1]);
            let when = if at == i64::MAX {
                "at the end".to_string()
            } else {
                format!("at t={}", at - EPOCH_MS)
            };
            if a.result.is_some() && a.result != b.result {
                v.push(format!(
                    "job {id}: its result changed {when}: {:?} -> {:?}",
                    a.result, b.result
                ));
            }
            let allowed = retried && a.state == JobState::Failed;
            if a.state.is_final() && a.state != b.state && !allowed {
                v.push(format!(
                    "job {id}: final state {:?} became {:?} {when}",
                    a.state, b.state
                ));
            }
            if b.version < a.version {
                v.push(format!(
                    "job {id}: version went back {} -> {} {when}",
                    a.version, b.version
                ));
            }
        }
    }

    for job in &o.jobs {
        let attempts = o.attempts.get(&job.id).cloned().unwrap_or_default();
        let events = o.events.get(&job.id).cloned().unwrap_or_default();
        let id = &job.id;

        // 5. At most one winner, and a succeeded job's result is its winner's.
        let winners: Vec<_> = attempts
            .iter()
            .filter(|a| a.state == AttemptState::Succeeded)
            .collect();
        if winners.len() > 1 {
            v.push(format!(
                "invariant 5: job {id} has {} succeeded attempts",
                winners.len()
            ));
        }
        match job.state {
            JobState::Succeeded => match winners.first() {
                Some(w) if job.completed_by.as_deref() == Some(w.id.as_str()) => {
                    if job.result != w.output {
                        v.push(format!(
                            "job {id}: result {:?} is not its winner's output {:?}",
                            job.result, w.output
                        ));
                    }
                }
                _ => v.push(format!(
                    "invariant 5: job {id} succeeded, completed_by {:?}, winners {:?}",
                    job.completed_by,
                    winners.iter().map(|w| &w.id).collect::<Vec<_>>()
                )),
            },
            _ => {
                if !winners.is_empty() || job.completed_by.is_some() {
                    v.push(format!("job {id} is {:?} but has a winner", job.state));
                }
            }
        }
        if let Some(result) = &job.result {
            // The result is a provider's answer to this job, as executed.
            let winner = winners.first();
            let provider = winner.map(|w| w.provider.as_str()).unwrap_or("");
            let key = stable_key(id, provider);
            if !result.contains(&key) {
                v.push(format!(
                    "job {id}: result {result} is not an answer to its key {key}"
                ));
            }
        }

        // 3 and 6. No second execution per (job, provider) unless the
        // provider honours keys (then it dedups; count it anyway).
        for (name, (honours, ledger)) in &o.ledgers {
            let ledger = ledger.lock().unwrap();
            if let Some(record) = ledger.get(&stable_key(id, name)) {
                if record.executions > 1 {
                    v.push(format!(
                        "invariant 3: job {id} executed {} times on {name} (honours keys: {honours})",
                        record.executions
                    ));
                }
            }
        }

        // 4. Guarded attempts, replayed from the event log: a primary or
        //    retry starts only when no attempt of the job is live; nothing
        //    starts on a provider with an unknown attempt unless it honours
        //    keys; at most max_hedges hedges.
        let by_id: BTreeMap<&str, _> = attempts.iter().map(|a| (a.id.as_str(), a)).collect();
        let honours = |p: &str| o.ledgers.get(p).is_some_and(|(h, _)| *h);
        let mut live: BTreeSet<&str> = BTreeSet::new();
        let mut unknown: BTreeSet<&str> = BTreeSet::new();
        for e in &events {
            let Some(aid) = e.attempt_id.as_deref() else {
                continue;
            };
            let Some(a) = by_id.get(aid) else { continue };
            match e.kind.as_str() {
                "attempt_started" => {
                    if a.kind != AttemptKind::Hedge && !live.is_empty() {
                        v.push(format!(
                            "invariant 4: job {id}: {:?} attempt {aid} on {} started at t={} while {live:?} were live",
                            a.kind, a.provider, e.at - EPOCH_MS
                        ));
                    }
                    let blocked = unknown
                        .iter()
                        .any(|u| by_id.get(u).is_some_and(|u| u.provider == a.provider));
                    if blocked && !honours(&a.provider) {
                        v.push(format!(
                            "invariant 3: job {id}: attempt {aid} started on {} at t={} while an attempt there was unknown",
                            a.provider, e.at - EPOCH_MS
                        ));
                    }
                    live.insert(aid);
                }
                "attempt_unknown" => {
                    live.remove(aid);
                    unknown.insert(aid);
                }
                "attempt_succeeded" | "attempt_failed" | "cas_lost" | "attempt_abandoned"
                | "attempt_resolved" => {
                    live.remove(aid);
                    unknown.remove(aid);
                }
                _ => {}
            }
        }
        let hedges = attempts
            .iter()
            .filter(|a| a.kind == AttemptKind::Hedge)
            .count();
        if hedges > o.scenario.route.max_hedges as usize {
            v.push(format!(
                "job {id}: {hedges} hedges > max_hedges {}",
                o.scenario.route.max_hedges
            ));
        }

        // The end: final, in review, or blocked on a visible unknown attempt.
        let final_or_review = job.state.is_final() || job.state == JobState::NeedsReview;
        let visibly_blocked = job.state == JobState::Running
            && job.next_run_at.is_none()
            && attempts.iter().any(|a| a.state == AttemptState::Unknown);
        if !final_or_review && !visibly_blocked {
            v.push(format!(
                "job {id} ({}) ended {:?} (next run {:?}, lease {:?}) — neither final, in review, nor blocked on a visible unknown",
                job.idempotency_key,
                job.state,
                job.next_run_at.map(|t| t - EPOCH_MS),
                job.lease_until.map(|t| t - EPOCH_MS)
            ));
        }
        if job.state.is_final() {
            if let Some(a) = attempts.iter().find(|a| a.state == AttemptState::Started) {
                v.push(format!(
                    "job {id} is {:?} with attempt {} still started at the end",
                    job.state, a.id
                ));
            }
        }
    }
    v
}
