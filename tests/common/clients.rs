//! What the client tests (tests/clients_python.rs, tests/clients_node.rs)
//! share: a world with retry protection on for keyless clients, and the
//! check that each step a client took was one job, run upstream once.

use super::world::{route, start_world, ProviderSpec, World};
use super::Backend;
use onejob::config::IdempotencyMode;
use serde_json::{json, Value};
use std::collections::BTreeSet;

/// A world with retry protection on for keyless clients: `default` is a
/// healthy simulator, `down` a provider that always answers 503, `slow` one
/// that answers after 1.5 s.
pub async fn client_world(backend: Backend) -> World {
    let providers = [
        ProviderSpec {
            name: "primary",
            model: "healthy:latency=5",
        },
        ProviderSpec {
            name: "broken",
            model: "fail:503",
        },
        ProviderSpec {
            name: "sluggish",
            model: "healthy:latency=1500",
        },
    ];
    start_world(backend, &providers, route("primary", &[]), |c| {
        c.idempotency = IdempotencyMode::Fingerprint;
        c.routes.insert("down".into(), route("broken", &[]));
        c.routes.insert("slow".into(), route("sluggish", &[]));
    })
    .await
}

pub async fn request_of(world: &World, job_id: &str) -> Value {
    let job = world.store.get_job(&job_id.into()).await.unwrap().unwrap();
    serde_json::from_str(&job.request).unwrap()
}

/// Every answer a case saw: one job per request, all distinct, each
/// succeeded and executed upstream exactly once. The job ids, in order.
pub async fn one_execution_per_step(world: &World, seen: &Value, steps: usize) -> Vec<String> {
    assert_eq!(seen["requests"], steps, "requests the client sent: {seen}");
    let ids: Vec<String> = seen["job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().expect("every answer names its job").to_string())
        .collect();
    assert_eq!(ids.len(), steps, "{seen}");
    let distinct: BTreeSet<&String> = ids.iter().collect();
    assert_eq!(
        distinct.len(),
        steps,
        "each step is a job of its own: {seen}"
    );
    for id in &ids {
        assert_eq!(world.job(id).await["state"], "succeeded", "job {id}");
        assert_eq!(
            world.executions(id, "primary"),
            1,
            "job {id} ran upstream once"
        );
        assert_eq!(world.deliveries(id, "primary"), 1, "job {id} was sent once");
    }
    ids
}

/// No job but the steps' (`jobs` of them).
pub async fn jobs_made(world: &World, jobs: i64) {
    assert_eq!(
        world.store.count_jobs().await.unwrap(),
        jobs,
        "no job but the steps'"
    );
}

/// A call to `down` that failed, however often the client tried: every
/// answer named the one job, and upstream saw that job's own attempts, no
/// more (a 503 executes nothing). The job id and how many attempts it made.
pub async fn one_failed_job(world: &World, seen: &Value) -> (String, usize) {
    let ids: BTreeSet<&str> = seen["job_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|id| id.as_str().expect("every answer names its job"))
        .collect();
    assert_eq!(ids.len(), 1, "every try named the one job: {seen}");
    let id = ids.into_iter().next().unwrap().to_string();
    let state = world.job(&id).await["state"].clone();
    assert!(
        state == "failed" || state == "needs_review",
        "{state} {seen}"
    );
    let attempts = world.attempts(&id).await;
    assert_eq!(
        world.deliveries(&id, "broken"),
        u64::try_from(attempts.len()).unwrap(),
        "upstream saw the job's own attempts, no more: {attempts:?}"
    );
    assert_eq!(world.executions(&id, "broken"), 0);
    (id, attempts.len())
}

/// Whether the server has the Responses door (`/v1/responses`), which lands
/// on another branch; if not, one loud line saying that `what` is skipped.
/// Without the door both probes are 404. With it, `GET /v1/responses` is
/// 405 (the path is served, by POST), and a body with no `model` is
/// refused before a job is made.
pub async fn responses_served(world: &World, what: &str) -> bool {
    let (get, _) = world.get(&world.key, "/v1/responses").await;
    let (post, body) = world.post(&world.key, "/v1/responses", &json!({})).await;
    if get == 404 && post == 404 {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED ({what}): POST /v1/responses answers 404 ({body}); the Responses door \
             is not on this build, so this client's Responses API calls cannot be proven yet"
        );
        return false;
    }
    jobs_made(world, 0).await;
    true
}
