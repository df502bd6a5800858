//! The console's job list on both backends, page by page against a list
//! the test keeps itself: newest first (`created_at`, then `id`, both
//! descending), every filter alone and together, and the keyset cursor
//! walking the whole list without a job skipped or shown twice.
//!
//! Since migration 0015 (SQLite) / 0014 (PostgreSQL) no index is in the
//! list's order: newest first is one ordered read per state, merged, and a
//! key prefix is read owner by owner off the `(owner_id, idempotency_key)`
//! unique index. So the jobs here share `created_at`s across states and
//! owners, and the key prefixes take both of the list's ways: one few keys
//! have (read by key) and one at least 2,000 jobs have (read newest first).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, TestDb};
use onejob::domain::attempt::NewAttempt;
use onejob::domain::job::NewJob;
use onejob::domain::{AttemptId, AttemptKind, JobId, JobState};
use onejob::store::console::JobFilter;
use onejob::store::{CreateOutcome, Store};
use std::time::Duration;

on_both_backends!(the_job_list_pages_every_filter_newest_first,);

const JOBS: usize = 2_100;
const OWNERS: [&str; 3] = ["acme", "globex", "initech"];
const BASE: i64 = 1_800_000_000_000;
// Odd, so pages end inside a tie of `created_at`s.
const PAGE: i64 = 25;

/// One job as the test made it.
#[derive(Clone)]
struct Made {
    id: String,
    owner: &'static str,
    key: String,
    route: &'static str,
    state: JobState,
    created_at: i64,
    on_backup: bool,
}

fn made(i: usize) -> Made {
    Made {
        id: String::new(),
        owner: OWNERS[i % 3],
        key: format!("k-{i}"),
        route: if i.is_multiple_of(4) {
            "batch"
        } else {
            "default"
        },
        // Twelve jobs in a row share a `created_at`, two in each state:
        // ties both across the states' reads and within one.
        state: JobState::ALL[i % JobState::ALL.len()],
        created_at: BASE + (i / 12) as i64 * 1_000,
        on_backup: i % 50 == 7,
    }
}

async fn create(store: &dyn Store, mut job: Made) -> Made {
    let id = JobId::new();
    let primary = job.on_backup.then(|| NewAttempt {
        id: AttemptId::new(),
        job_id: id.clone(),
        provider: "backup".into(),
        kind: AttemptKind::Primary,
        max_hedges: 1,
        reuses_key: false,
        started_at: job.created_at + 1,
    });
    let outcome = store
        .create_job(NewJob {
            id: id.clone(),
            owner_id: job.owner.into(),
            idempotency_key: job.key.clone(),
            fingerprint: "f".into(),
            request: "{}".into(),
            route: job.route.into(),
            created_at: job.created_at,
            lease: None,
            key_id: None,
            primary,
        })
        .await
        .unwrap();
    assert!(matches!(outcome, CreateOutcome::Created(_)), "{outcome:?}");
    job.id = id.as_str().to_string();
    job
}

/// Moves each job to the state the test gave it, in one statement per
/// state (the store has no call that puts a job in any state at will).
async fn set_states(db: &TestDb, jobs: &[Made]) {
    for state in JobState::ALL {
        let ids: Vec<String> = jobs
            .iter()
            .filter(|j| j.state == state)
            .map(|j| format!("'{}'", j.id))
            .collect();
        let sql = format!(
            "UPDATE jobs SET state = '{}' WHERE id IN ({})",
            state.as_str(),
            ids.join(", ")
        );
        let changed = db.execute(&sql).await;
        assert_eq!(changed as usize, ids.len());
    }
}

/// What the list must show for `filter`, newest first.
fn expected(jobs: &[Made], filter: &JobFilter) -> Vec<String> {
    let mut matching: Vec<&Made> = jobs
        .iter()
        .filter(|j| {
            filter
                .state
                .as_deref()
                .is_none_or(|s| j.state.as_str() == s)
        })
        .filter(|j| filter.route.as_deref().is_none_or(|r| j.route == r))
        .filter(|j| filter.owner.as_ref().is_none_or(|o| j.owner == o.as_str()))
        .filter(|j| filter.created_from.is_none_or(|f| j.created_at >= f))
        .filter(|j| filter.created_to.is_none_or(|t| j.created_at < t))
        .filter(|j| {
            filter
                .provider
                .as_deref()
                .is_none_or(|p| p == "backup" && j.on_backup)
        })
        .filter(|j| {
            filter
                .key_prefix
                .as_deref()
                .is_none_or(|p| j.key.starts_with(p))
        })
        .filter(|j| {
            filter
                .before
                .as_ref()
                .is_none_or(|(at, id)| (j.created_at, &j.id) < (*at, id))
        })
        .collect();
    matching.sort_by(|a, b| (b.created_at, &b.id).cmp(&(a.created_at, &a.id)));
    matching.into_iter().map(|j| j.id.clone()).collect()
}

/// Every page of the list for `filter`, each from the last one's cursor.
async fn listed(store: &dyn Store, filter: &JobFilter) -> Vec<String> {
    let mut filter = filter.clone();
    let mut all = Vec::new();
    loop {
        // A guard, not a measure: a read that never stops fails here on
        // PostgreSQL (SQLite's reads run on this thread and cannot be cut
        // short; there such a read hangs the test instead).
        let page = tokio::time::timeout(Duration::from_secs(60), store.list_jobs(&filter, PAGE))
            .await
            .expect("a page within a minute")
            .unwrap();
        assert!(page.len() as i64 <= PAGE);
        all.extend(page.iter().map(|j| j.id.as_str().to_string()));
        match page.last() {
            Some(last) if page.len() as i64 == PAGE => {
                filter.before = Some((last.created_at, last.id.as_str().to_string()));
            }
            _ => return all,
        }
    }
}

async fn the_job_list_pages_every_filter_newest_first(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let mut jobs = Vec::with_capacity(JOBS);
    for chunk in (0..JOBS).collect::<Vec<_>>().chunks(32) {
        let made = chunk.iter().map(|&i| create(store.as_ref(), made(i)));
        jobs.extend(futures::future::join_all(made).await);
    }
    // And one job older than any span a window can be widened to without
    // saturating: the filters that read by window must still reach it, and
    // stop there.
    let ancient = Made {
        key: "k-ancient".into(),
        route: "batch",
        state: JobState::Succeeded,
        created_at: i64::MIN + 1,
        on_backup: true,
        ..made(0)
    };
    jobs.push(create(store.as_ref(), ancient).await);
    set_states(&db, &jobs).await;

    let middle = jobs[JOBS / 2].created_at;
    let filters = [
        ("no filter", JobFilter::default()),
        (
            "a cursor in the middle",
            JobFilter {
                before: Some((middle, jobs[JOBS / 2].id.clone())),
                ..JobFilter::default()
            },
        ),
        (
            "a key prefix few keys have",
            JobFilter {
                key_prefix: Some("k-1".into()),
                ..JobFilter::default()
            },
        ),
        (
            "a key prefix every job has",
            JobFilter {
                key_prefix: Some("k-".into()),
                ..JobFilter::default()
            },
        ),
        (
            "a whole key",
            JobFilter {
                key_prefix: Some("k-1234".into()),
                ..JobFilter::default()
            },
        ),
        (
            "a key prefix no job has",
            JobFilter {
                key_prefix: Some("order-".into()),
                ..JobFilter::default()
            },
        ),
        (
            "a key prefix, an owner and a state",
            JobFilter {
                key_prefix: Some("k-1".into()),
                owner: Some("globex".into()),
                state: Some("needs_review".into()),
                ..JobFilter::default()
            },
        ),
        (
            "every key, a route and a range",
            JobFilter {
                key_prefix: Some("k-".into()),
                route: Some("batch".into()),
                created_from: Some(BASE + 100_000),
                created_to: Some(middle),
                ..JobFilter::default()
            },
        ),
        (
            "an owner and a route",
            JobFilter {
                owner: Some("initech".into()),
                route: Some("batch".into()),
                ..JobFilter::default()
            },
        ),
        (
            "a provider",
            JobFilter {
                provider: Some("backup".into()),
                ..JobFilter::default()
            },
        ),
        (
            "a state no job is in",
            JobFilter {
                state: Some("bogus".into()),
                ..JobFilter::default()
            },
        ),
    ];
    let by_state = JobState::ALL.map(|state| {
        (
            state.as_str(),
            JobFilter {
                state: Some(state.as_str().into()),
                ..JobFilter::default()
            },
        )
    });
    for (what, filter) in filters.iter().chain(by_state.iter()) {
        let want = expected(&jobs, filter);
        let got = listed(store.as_ref(), filter).await;
        assert_eq!(got.len(), want.len(), "{what}: how many");
        assert!(got == want, "{what}: not the jobs, or not newest first");
    }
    // The filters above are not vacuous.
    assert_eq!(expected(&jobs, &filters[0].1).len(), JOBS + 1);
    assert_eq!(expected(&jobs, &filters[2].1).len(), 1 + 10 + 100 + 1_000);
    assert_eq!(expected(&jobs, &filters[4].1).len(), 1);
    assert!(expected(&jobs, &filters[6].1).len() > 10);
    assert!(expected(&jobs, &filters[9].1).len() > 10);
}
