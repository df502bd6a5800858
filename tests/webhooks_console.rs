//! The console's webhooks page in a real browser (headless Chromium via
//! chromedriver): an admin creates an endpoint for an owner and is shown
//! its secret once, sees a finished job's delivery arrive (state, tries,
//! the receiver's answer), redelivers it (the same `webhook-id` arrives
//! again), rotates and deletes. Screenshots land under the target
//! directory. Skips loudly unless ONEJOB_TEST_CHROMEDRIVER is set.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::receiver::{Behaviour, Receiver};
use common::webdriver::Browser;
use common::world::{route, start_world, ProviderSpec};
use common::{chat_body, Backend};
use onejob::domain::OwnerId;
use std::time::{Duration, Instant};

const WAIT: Duration = Duration::from_secs(10);
const ENV: &str = "ONEJOB_TEST_CHROMEDRIVER";

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
async fn an_admin_manages_webhooks_in_the_console() {
    let Some(chromedriver) = std::env::var(ENV).ok().filter(|v| !v.is_empty()) else {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "SKIPPED (browser): the webhooks console test passes without running; \
             set {ENV}=/usr/bin/chromedriver (apt-get install chromium chromium-driver) to run it"
        );
        return;
    };
    let shots = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let mut receiver = Receiver::start(Behaviour {
        statuses: vec![503],
        ..Behaviour::default()
    })
    .await;
    let world = start_world(
        Backend::Sqlite,
        &[ProviderSpec {
            name: "primary",
            model: "healthy",
        }],
        route("primary", &[]),
        |c| {
            c.webhooks.allow_private_networks = true;
            c.webhooks.poll_interval_ms = 20;
            c.webhooks.retry_base_ms = 50;
            c.webhook_key = Some(onejob::webhooks::secrets::SecretKey::from_bytes([9; 32]));
        },
    )
    .await;
    let browser = Browser::start(&chromedriver).await;
    let ui = |path: &str| format!("{}{path}", world.address);
    browser.goto(&ui("/ui/login")).await;
    browser.find("#key").await.type_text(&world.admin_key).await;
    browser.find("#login").await.click().await;
    eventually("logged in", || async {
        browser.current_url().await.ends_with("/ui/overview")
    })
    .await;

    // Create an endpoint for alice: the secret is shown once.
    browser.goto(&ui("/ui/webhooks")).await;
    assert!(browser
        .find("#webhooks-empty")
        .await
        .text()
        .await
        .contains("No owner"));
    browser
        .find("#webhook-create input[name=owner]")
        .await
        .type_text("alice")
        .await;
    browser
        .find("#webhook-create input[name=url]")
        .await
        .type_text(&receiver.url)
        .await;
    browser
        .find("#webhook-create input[name=description]")
        .await
        .type_text("orders backend")
        .await;
    browser
        .find("#webhook-create button[type=submit]")
        .await
        .click()
        .await;
    eventually("the secret page", || async {
        browser.find_all("#webhook-secret").await.len() == 1
    })
    .await;
    let secret = browser.find("#webhook-secret").await.text().await;
    assert!(secret.starts_with("whsec_"), "{secret}");
    let endpoints = world
        .store
        .list_webhook_endpoints(Some(&OwnerId::from("alice")))
        .await
        .unwrap();
    assert_eq!(endpoints.len(), 1);
    let endpoint = endpoints[0].id.clone();

    // A finished job's event: first refused (503), then delivered.
    let (_, job) = world
        .submit("console-hook", &chat_body("hi"), Some(10))
        .await;
    let first = receiver.next().await;
    let second = receiver.next().await;
    assert_eq!(first.id, second.id);
    assert_eq!(second.job_id, job["id"].as_str().unwrap());
    eventually("the delivery shows delivered", || async {
        browser.goto(&ui("/ui/webhooks")).await;
        let rows = browser
            .find_all(&format!("tr[data-delivery='{}']", first.id))
            .await;
        match rows.first() {
            Some(row) => row.text().await.contains("delivered"),
            None => false,
        }
    })
    .await;
    let row = browser
        .find(&format!("tr[data-delivery='{}']", first.id))
        .await;
    let text = row.text().await;
    assert!(
        text.contains("job.succeeded") && text.contains("200 in"),
        "{text}"
    );
    assert!(
        !browser
            .find("body")
            .await
            .text()
            .await
            .contains(&secret[6..]),
        "the page never shows the secret again"
    );
    browser.screenshot(&shots.join("webhooks.png")).await;

    // Redeliver: the same id arrives again.
    browser
        .find(&format!(
            "tr[data-delivery='{}'] button[type=submit]",
            first.id
        ))
        .await
        .click()
        .await;
    let again = receiver.next().await;
    assert_eq!(again.id, first.id);
    assert_eq!(again.body, first.body);

    // Rotate: a new secret, shown once; then delete.
    browser.goto(&ui("/ui/webhooks")).await;
    browser
        .find(&format!(
            "form[action='/ui/webhooks/{endpoint}/rotate'] button"
        ))
        .await
        .click()
        .await;
    eventually("the rotated secret", || async {
        browser.find_all("#webhook-secret").await.len() == 1
    })
    .await;
    let rotated = browser.find("#webhook-secret").await.text().await;
    assert!(rotated.starts_with("whsec_") && rotated != secret);
    browser.goto(&ui("/ui/webhooks")).await;
    assert!(browser
        .find(&format!("[data-webhook='{endpoint}']"))
        .await
        .text()
        .await
        .contains("old secret signs too"));
    browser
        .find(&format!(
            "form[action='/ui/webhooks/{endpoint}/delete'] button"
        ))
        .await
        .click()
        .await;
    eventually("the endpoint is gone", || async {
        browser.current_url().await.ends_with("/ui/webhooks")
            && browser.find_all("#webhooks-empty").await.len() == 1
    })
    .await;
    assert!(world
        .store
        .list_webhook_endpoints(None)
        .await
        .unwrap()
        .is_empty());
    browser.quit().await;
    world.stop().await;
}
