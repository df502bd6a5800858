//! The ops console at `/ui` through the real server: who is refused (no
//! session, a non-admin key, a form without the session's CSRF token), and
//! what an admin sees and does (a hedged job's timeline, a provider switched
//! off with a reason that the API then reports, a review item resolved and
//! audited).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::world::{route, start_world, ProviderSpec, World};
use common::{chat_body, Backend};
use onejob::domain::JobId;
use serde_json::json;
use std::time::Duration;

on_both_backends!(
    the_console_refuses_without_a_session_a_non_admin_key_or_a_csrf_token,
    an_admin_sees_a_hedged_job_switches_a_provider_and_resolves_a_review_item,
);

const WAIT: Duration = Duration::from_secs(10);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// The value of the first `name="csrf"` hidden input on a page.
fn csrf_of(html: &str) -> String {
    let at = html.find("name=\"csrf\" value=\"").expect("a CSRF field") + 19;
    html[at..].split('"').next().unwrap().to_string()
}

/// `name=value` of a `Set-Cookie` named `name`.
fn cookie_of(response: &reqwest::Response, name: &str) -> Option<String> {
    response
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with(&format!("{name}=")))
        .map(|v| v.split(';').next().unwrap().to_string())
}

struct Login {
    status: u16,
    session: Option<String>,
    set_cookie: Option<String>,
}

async fn log_in(world: &World, key: &str) -> Login {
    let http = client();
    let form = http
        .get(format!("{}/ui/login", world.address))
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), 200);
    let login_cookie = cookie_of(&form, "onejob_login_csrf").expect("a login CSRF cookie");
    let csrf = csrf_of(&form.text().await.unwrap());
    let answer = http
        .post(format!("{}/ui/login", world.address))
        .header("cookie", login_cookie)
        .form(&[("key", key), ("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    let set_cookie = answer
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find(|v| v.starts_with("onejob_session="))
        .map(str::to_string);
    Login {
        status: answer.status().as_u16(),
        session: cookie_of(&answer, "onejob_session"),
        set_cookie,
    }
}

async fn page(world: &World, session: &str, path: &str) -> (u16, String) {
    let r = client()
        .get(format!("{}{path}", world.address))
        .header("cookie", session)
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

async fn post_form(
    world: &World,
    session: &str,
    path: &str,
    form: &[(&str, &str)],
) -> (u16, String, String) {
    let r = client()
        .post(format!("{}{path}", world.address))
        .header("cookie", session)
        .form(form)
        .send()
        .await
        .unwrap();
    let location = r
        .headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (r.status().as_u16(), location, r.text().await.unwrap())
}

async fn the_console_refuses_without_a_session_a_non_admin_key_or_a_csrf_token(backend: Backend) {
    let providers = [ProviderSpec {
        name: "primary",
        model: "healthy",
    }];
    let world = start_world(backend, &providers, route("primary", &[]), |_| {}).await;

    // No session: every page sends the browser to the login form; a form
    // post changes nothing.
    for path in ["/ui/overview", "/ui/jobs", "/ui/review", "/ui/providers"] {
        let r = client()
            .get(format!("{}{path}", world.address))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 303, "{path}");
        assert_eq!(r.headers()["location"], "/ui/login", "{path}");
    }
    let (status, location, _) = post_form(
        &world,
        "onejob_session=forged",
        "/ui/providers/primary/switch",
        &[("to", "disable"), ("reason", "x"), ("csrf", "x")],
    )
    .await;
    assert_eq!((status, location.as_str()), (303, "/ui/login"));

    // A non-admin key gets no session.
    let login = log_in(&world, &world.key).await;
    assert_eq!(login.status, 403);
    assert!(login.session.is_none(), "no session for a non-admin key");
    let login = log_in(&world, "oj_not_a_key").await;
    assert_eq!(login.status, 401);
    assert!(login.session.is_none());

    // The login form itself needs its CSRF token.
    let r = client()
        .post(format!("{}/ui/login", world.address))
        .form(&[("key", world.admin_key.as_str()), ("csrf", "guess")])
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(cookie_of(&r, "onejob_session").is_none());

    // An admin session, but a form without (or with another) CSRF token.
    let login = log_in(&world, &world.admin_key).await;
    assert_eq!(login.status, 303);
    let set_cookie = login.set_cookie.unwrap();
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/ui"] {
        assert!(set_cookie.contains(attribute), "{set_cookie}");
    }
    assert!(!set_cookie.contains("Secure"), "plain HTTP: not Secure");
    let session = login.session.unwrap();
    for csrf in ["", "0123456789abcdef"] {
        let (status, _, body) = post_form(
            &world,
            &session,
            "/ui/providers/primary/switch",
            &[("to", "disable"), ("reason", "csrf test"), ("csrf", csrf)],
        )
        .await;
        assert_eq!(status, 403, "{body}");
        assert!(body.contains("CSRF"), "{body}");
    }
    // A form or query string that does not decode gets the console's
    // refusal page, naming the field, not a line of plain text.
    let (_, overview) = page(&world, &session, "/ui/overview").await;
    let csrf = csrf_of(&overview);
    let (status, _, body) = post_form(
        &world,
        &session,
        "/ui/providers/primary/switch",
        &[("reason", "no direction"), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(body.contains("<title>Refused"), "{body}");
    assert!(body.contains("missing field `to`"), "{body}");
    let (status, body) = page(&world, &session, "/ui/jobs?state=failed&state=running").await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("<title>Refused"), "{body}");
    assert!(body.contains("duplicate field `state`"), "{body}");
    let (_, providers) = world.get(&world.admin_key, "/v1/admin/providers").await;
    assert_eq!(
        providers["providers"][0]["enabled"], true,
        "nothing was switched"
    );
    let (_, audit) = world
        .get(&world.admin_key, "/v1/admin/providers/primary/audit")
        .await;
    assert_eq!(audit["audit"].as_array().unwrap().len(), 0);

    // Logging out ends the session.
    let (_, overview) = page(&world, &session, "/ui/overview").await;
    let csrf = csrf_of(&overview);
    let (status, location, _) = post_form(&world, &session, "/ui/logout", &[("csrf", &csrf)]).await;
    assert_eq!((status, location.as_str()), (303, "/ui/login"));
    let r = client()
        .get(format!("{}/ui/overview", world.address))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 303, "the old cookie no longer opens a page");
    world.stop().await;
}

async fn an_admin_sees_a_hedged_job_switches_a_provider_and_resolves_a_review_item(
    backend: Backend,
) {
    let providers = [
        ProviderSpec {
            name: "slow",
            model: "healthy:latency=900",
        },
        ProviderSpec {
            name: "quick",
            model: "healthy:latency=50",
        },
        ProviderSpec {
            name: "broken",
            model: "broken-model",
        },
    ];
    let mut r = route("slow", &["quick"]);
    r.silence_ms = 200;
    let world = start_world(backend, &providers, r, |c| {
        c.engine.loser_grace_ms = 5_000;
        let mut review = route("broken", &[]);
        review.max_attempts = 1;
        c.routes.insert("review".into(), review);
    })
    .await;
    world.sim.models().set("broken-model", "fail:500").unwrap();
    let (_, job) = world.submit("hedged-1", &chat_body("hedge me"), None).await;
    let hedged = job["id"].as_str().unwrap().to_string();
    let (_, attempts) = world
        .until(&hedged, WAIT, |_, a| {
            a.iter()
                .any(|a| a["kind"] == "hedge" && a["state"] == "succeeded")
                && a.iter()
                    .any(|a| a["kind"] == "primary" && a["state"] == "discarded")
        })
        .await;
    let mut review_body = chat_body("review me");
    review_body["route"] = json!("review");
    let (_, job) = world.submit("review-1", &review_body, None).await;
    let stuck = job["id"].as_str().unwrap().to_string();
    world
        .until(&stuck, WAIT, |j, _| j["state"] == "needs_review")
        .await;

    let session = log_in(&world, &world.admin_key).await.session.unwrap();

    // The job list, filtered by the start of a key, finds the hedged job;
    // the search is by prefix (an index range), so a middle part does not.
    let (status, list) = page(&world, &session, "/ui/jobs?key=hedged").await;
    assert_eq!(status, 200);
    assert!(list.contains(&format!("data-job=\"{hedged}\"")), "{list}");
    assert!(
        list.contains("Idempotency key starts with"),
        "the form says so"
    );
    let (_, list) = page(&world, &session, "/ui/jobs?key=edged-1").await;
    assert!(!list.contains(&format!("data-job=\"{hedged}\"")), "{list}");
    let (_, list) = page(&world, &session, "/ui/jobs?key=hedged-1").await;
    assert!(
        list.contains(&format!("data-job=\"{hedged}\"")),
        "a whole key"
    );
    assert!(
        !list.contains(&format!("data-job=\"{stuck}\"")),
        "the filter filters"
    );
    let (_, list) = page(&world, &session, "/ui/jobs?state=needs_review").await;
    assert!(list.contains(&format!("data-job=\"{stuck}\"")));
    assert!(!list.contains(&format!("data-job=\"{hedged}\"")));
    let (_, list) = page(&world, &session, "/ui/jobs?provider=quick").await;
    assert!(list.contains(&format!("data-job=\"{hedged}\"")));
    assert!(!list.contains(&format!("data-job=\"{stuck}\"")));

    // Its timeline: both attempts on one axis, the hedge marked as the winner.
    let (status, job_page) = page(&world, &session, &format!("/ui/jobs/{hedged}")).await;
    assert_eq!(status, 200);
    let hedge = attempts.iter().find(|a| a["kind"] == "hedge").unwrap();
    let primary = attempts.iter().find(|a| a["kind"] == "primary").unwrap();
    assert_eq!(
        job_page.matches("<rect class=\"attempt ").count(),
        2,
        "{job_page}"
    );
    assert!(job_page.contains(&format!(
        "class=\"attempt won\" data-attempt=\"{}\" data-kind=\"hedge\"",
        hedge["id"].as_str().unwrap()
    )));
    assert!(job_page.contains(&format!(
        "class=\"attempt discarded\" data-attempt=\"{}\" data-kind=\"primary\"",
        primary["id"].as_str().unwrap()
    )));
    assert!(job_page.contains("silence threshold 200 ms"));
    assert!(job_page.contains("cas_lost"), "the event log is beneath");

    // Switch a provider off with a reason; the API agrees.
    let csrf = csrf_of(&job_page);
    let (status, location, _) = post_form(
        &world,
        &session,
        "/ui/providers/quick/switch",
        &[
            ("to", "disable"),
            ("reason", "vendor incident 42"),
            ("csrf", &csrf),
        ],
    )
    .await;
    assert_eq!((status, location.as_str()), (303, "/ui/providers"));
    let (_, providers_page) = page(&world, &session, "/ui/providers").await;
    assert!(
        providers_page.contains("data-provider=\"quick\" data-enabled=\"false\""),
        "{providers_page}"
    );
    assert!(providers_page.contains("vendor incident 42"));
    let (_, api) = world.get(&world.admin_key, "/v1/admin/providers").await;
    let quick = api["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "quick")
        .unwrap();
    assert_eq!(quick["enabled"], false);
    assert_eq!(quick["reason"], "vendor incident 42");
    assert_eq!(quick["changed_by"], "admin:ops");

    // A decision needs a reason, as in the API.
    let resolve = format!("/ui/jobs/{stuck}/resolve");
    let (status, _, body) = post_form(
        &world,
        &session,
        &resolve,
        &[("action", "close"), ("reason", " "), ("csrf", &csrf)],
    )
    .await;
    assert_eq!(status, 422, "{body}");
    let (_, review_page) = page(&world, &session, "/ui/review").await;
    assert!(review_page.contains(&format!("data-review-job=\"{stuck}\"")));
    assert!(
        review_page.contains("review-1"),
        "the business key is shown"
    );
    let (status, location, _) = post_form(
        &world,
        &session,
        &resolve,
        &[
            ("action", "close"),
            ("reason", "customer refunded"),
            ("csrf", &csrf),
            ("back", "/ui/review"),
        ],
    )
    .await;
    assert_eq!((status, location.as_str()), (303, "/ui/review"));
    let job = world.job(&stuck).await;
    assert_eq!(job["state"], "cancelled");
    let events = world.store.list_events(&JobId::from(&stuck)).await.unwrap();
    let resolved = events.iter().find(|e| e.kind == "resolved").unwrap();
    assert_eq!(resolved.actor, "admin:ops");
    assert!(resolved
        .detail
        .as_deref()
        .unwrap()
        .contains("customer refunded"));
    let (_, review_page) = page(&world, &session, "/ui/review").await;
    assert!(!review_page.contains(&format!("data-review-job=\"{stuck}\"")));

    // The overview draws from the database.
    let (status, overview) = page(&world, &session, "/ui/overview?window=1h").await;
    assert_eq!(status, 200);
    assert!(overview.contains("<b id=\"stat-jobs\">2</b>"), "{overview}");
    assert!(
        overview.contains("<b id=\"stat-hedge-rate\">50%</b>"),
        "{overview}"
    );
    assert!(
        overview.contains("<b id=\"stat-hedge-win-rate\">100%</b>"),
        "{overview}"
    );
    assert!(overview.contains("id=\"chart-latency\""));
    world.stop().await;
}
