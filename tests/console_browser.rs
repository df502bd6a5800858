//! The ops console in a real browser: headless Chromium driven through
//! Debian's chromedriver. Logs in with an admin key, checks a hedged job's
//! timeline shows both attempts and the winner, switches a provider off with
//! a reason (and the API agrees), resolves a review item, and saves
//! screenshots of the overview, the job timeline and the review queue under
//! the target directory. Skips loudly unless ONEJOB_TEST_CHROMEDRIVER names
//! the chromedriver binary (`.ci/run` installs it and sets it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::webdriver::Browser;
use common::world::{route, start_world, ProviderSpec};
use common::{chat_body, Backend};
use onejob::domain::JobId;
use serde_json::json;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);
const ENV: &str = "ONEJOB_TEST_CHROMEDRIVER";

/// Polls `check` until it holds (a page reload follows a form post).
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + WAIT;
    while !check().await {
        assert!(Instant::now() < deadline, "never true: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_admin_works_the_console_in_a_browser() {
    let Some(chromedriver) = std::env::var(ENV).ok().filter(|v| !v.is_empty()) else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED (browser): the console's browser test passes without running; \
             set {ENV}=/usr/bin/chromedriver (apt-get install chromium chromium-driver) to run it"
        );
        return;
    };
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();

    let providers = [
        ProviderSpec {
            name: "slow",
            model: "healthy:latency=900",
        },
        ProviderSpec {
            name: "quick",
            model: "healthy:latency=60",
        },
        ProviderSpec {
            name: "broken",
            model: "broken-model",
        },
    ];
    let mut r = route("slow", &["quick"]);
    r.silence_ms = 200;
    let world = start_world(Backend::Sqlite, &providers, r, |c| {
        c.engine.loser_grace_ms = 5_000;
        let mut review = route("broken", &[]);
        review.max_attempts = 2;
        c.routes.insert("review".into(), review);
    })
    .await;
    world.sim.models().set("broken-model", "fail:500").unwrap();
    // A few jobs, so the overview has something to draw.
    for i in 0..3 {
        world
            .submit(
                &format!("quiet-{i}"),
                &chat_body(&format!("order {i}")),
                None,
            )
            .await;
    }
    let (_, job) = world
        .submit("hedged-order-7", &chat_body("hedge me"), None)
        .await;
    let hedged = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world
        .until(&hedged, WAIT, |_, a| {
            a.iter()
                .any(|a| a["kind"] == "hedge" && a["state"] == "succeeded")
                && a.iter()
                    .any(|a| a["kind"] == "primary" && a["state"] == "discarded")
        })
        .await;
    let hedge_id = attempts.iter().find(|a| a["kind"] == "hedge").unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mut body = chat_body("refund me");
    body["route"] = json!("review");
    let (_, job) = world.submit("refund-991", &body, None).await;
    let stuck = job["id"].as_str().unwrap().to_string();
    world
        .until(&stuck, WAIT, |j, _| j["state"] == "needs_review")
        .await;

    let browser = Browser::start(&chromedriver).await;
    let ui = |path: &str| format!("{}{path}", world.address);

    // Log in with the admin key.
    browser.goto(&ui("/ui/overview")).await;
    assert!(
        browser.current_url().await.ends_with("/ui/login"),
        "sent to the login form"
    );
    browser.find("#key").await.type_text(&world.admin_key).await;
    browser.find("#login").await.click().await;
    eventually("the overview opens", || async {
        browser.current_url().await.ends_with("/ui/overview")
    })
    .await;
    assert_eq!(browser.find("#stat-jobs").await.text().await, "5");
    assert_eq!(
        browser.find("#stat-hedge-win-rate").await.text().await,
        "100%"
    );
    browser.screenshot(&shots.join("overview.png")).await;

    // Find the hedged job by its key and open its timeline.
    browser.goto(&ui("/ui/jobs")).await;
    browser
        .find("input[name=key]")
        .await
        .type_text("hedged")
        .await;
    browser
        .find("#job-filters button[type=submit]")
        .await
        .click()
        .await;
    eventually("the filtered list", || async {
        browser.current_url().await.contains("key=hedged")
    })
    .await;
    let rows = browser.find_all("#jobs tbody tr[data-job]").await;
    assert_eq!(rows.len(), 1, "only the hedged job matches");
    browser
        .find(&format!("tr[data-job='{hedged}'] td.mono a"))
        .await
        .click()
        .await;
    eventually("the job page", || async {
        browser.current_url().await.ends_with(&hedged)
    })
    .await;
    let bars = browser.find_all("#job-timeline rect.attempt").await;
    assert_eq!(bars.len(), 2, "both attempts on the timeline");
    let mut kinds = Vec::new();
    for bar in &bars {
        kinds.push((
            bar.attribute("data-kind").await.unwrap(),
            bar.attribute("class").await.unwrap(),
        ));
    }
    kinds.sort();
    assert_eq!(
        kinds,
        [
            ("hedge".to_string(), "attempt won".to_string()),
            ("primary".to_string(), "attempt discarded".to_string())
        ]
    );
    let winner = browser.find("#job-timeline rect.attempt.won").await;
    assert_eq!(winner.attribute("data-attempt").await.unwrap(), hedge_id);
    assert_eq!(browser.find("#completed-by").await.text().await, hedge_id);
    browser.screenshot(&shots.join("job-timeline.png")).await;

    // Switch the fallback off with a reason; the page and the API agree.
    browser.goto(&ui("/ui/providers")).await;
    browser
        .find("#provider-quick .switch-form input[name=reason]")
        .await
        .type_text("vendor incident 42")
        .await;
    browser
        .find("#provider-quick .switch-form button")
        .await
        .click()
        .await;
    eventually("the provider shows disabled", || async {
        browser
            .find_all("#provider-quick[data-enabled=false]")
            .await
            .len()
            == 1
    })
    .await;
    assert_eq!(
        browser
            .find("#provider-quick .switch-reason")
            .await
            .text()
            .await,
        "vendor incident 42"
    );
    let (_, api) = world.get(&world.admin_key, "/v1/admin/providers").await;
    let quick = api["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "quick")
        .unwrap();
    assert_eq!(
        (quick["enabled"].clone(), quick["reason"].clone()),
        (json!(false), json!("vendor incident 42"))
    );
    browser.screenshot(&shots.join("providers.png")).await;

    // Resolve the review item.
    browser.goto(&ui("/ui/review")).await;
    let item = format!("[data-review-job='{stuck}']");
    assert!(browser
        .find(&item)
        .await
        .text()
        .await
        .contains("refund-991"));
    browser.screenshot(&shots.join("review-queue.png")).await;
    browser
        .find(&format!("{item} select[name=action] option[value=close]"))
        .await
        .click()
        .await;
    browser
        .find(&format!("{item} input[name=reason]"))
        .await
        .type_text("refunded by support")
        .await;
    browser
        .find(&format!("{item} button[type=submit]"))
        .await
        .click()
        .await;
    eventually("the item leaves the queue", || async {
        browser.find_all(&item).await.is_empty()
    })
    .await;
    assert_eq!(world.job(&stuck).await["state"], "cancelled");
    let events = world.store.list_events(&JobId::from(&stuck)).await.unwrap();
    let resolved = events.iter().find(|e| e.kind == "resolved").unwrap();
    assert_eq!(resolved.actor, "admin:ops");
    assert!(resolved
        .detail
        .as_deref()
        .unwrap()
        .contains("refunded by support"));

    browser.quit().await;
    eprintln!("console screenshots in {}", shots.display());
    world.stop().await;
}
