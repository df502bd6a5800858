//! The operator's commands as real processes: `onejob providers …` switching
//! providers under running servers, refusing bad input, `onejob sim`, and
//! `onejob serve --validate`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::procs::Process;
use common::{Backend, TestDb};
use onejob::clock::SystemClock;
use serde_json::Value;
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

on_both_backends!(a_cli_switch_reaches_every_running_server_within_a_second);

/// Run `onejob ARGS` to completion.
fn onejob(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(args)
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .env("USER", "tester")
        .output()
        .unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `sim` as `GET /v1/admin/providers` of the server at `address` shows it.
async fn sim_view(client: &reqwest::Client, address: &str, key: &str) -> Value {
    let body: Value = client
        .get(format!("{address}/v1/admin/providers"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "sim")
        .cloned()
        .unwrap()
}

/// Poll every 20 ms until `sim` shows `enabled` on `address`, or `deadline`.
async fn wait_for_sim(
    client: &reqwest::Client,
    address: &str,
    key: &str,
    enabled: bool,
    deadline: Instant,
) -> Value {
    loop {
        let view = sim_view(client, address, key).await;
        if view["enabled"] == enabled {
            return view;
        }
        assert!(
            Instant::now() < deadline,
            "{address} still shows {view} after the deadline"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn a_cli_switch_reaches_every_running_server_within_a_second(backend: Backend) {
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let key = onejob::keys::create_key(store.as_ref(), &SystemClock, "ops", true)
        .await
        .unwrap();
    let servers = [Process::serve(&db, None), Process::serve(&db, None)];
    let client = reqwest::Client::new();
    for server in &servers {
        assert_eq!(
            sim_view(&client, &server.address, &key).await["enabled"],
            true
        );
    }

    let url = db.url_string();
    let output = onejob(&[
        "providers",
        "disable",
        "sim",
        "--reason",
        "drill: upstream down",
        "--database-url",
        &url,
    ]);
    // The switch is committed once the command has exited; from here on
    // every server has one second.
    let deadline = Instant::now() + Duration::from_secs(1);
    assert!(output.status.success(), "{}", text(&output));
    for server in &servers {
        let view = wait_for_sim(&client, &server.address, &key, false, deadline).await;
        assert_eq!(view["changed_by"], "cli:tester", "{view}");
        assert_eq!(view["reason"], "drill: upstream down", "{view}");
    }

    let output = onejob(&["providers", "list", "--database-url", &url]);
    assert!(output.status.success(), "{}", text(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    let sim_row = stdout
        .lines()
        .find(|l| l.starts_with("sim "))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        sim_row.contains(" no ") && sim_row.contains("cli:tester"),
        "{stdout}"
    );
    assert!(sim_row.ends_with("drill: upstream down"), "{stdout}");
    // Eligibility per contract, with the reason: disabled comes first.
    let eligibility = stdout
        .lines()
        .find(|l| l.starts_with("sim ") && l.contains("ticket-triage"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        eligibility.contains(" no ") && eligibility.ends_with("disabled"),
        "{stdout}"
    );

    let output = onejob(&[
        "providers",
        "enable",
        "sim",
        "--reason",
        "drill over",
        "--database-url",
        &url,
    ]);
    let deadline = Instant::now() + Duration::from_secs(1);
    assert!(output.status.success(), "{}", text(&output));
    for server in &servers {
        wait_for_sim(&client, &server.address, &key, true, deadline).await;
    }
    let audit = store.provider_audit(Some("sim"), 10).await.unwrap();
    assert_eq!(audit.len(), 2);
    assert!(audit.iter().all(|e| e.actor == "cli:tester"));
    for server in servers {
        assert!(server.terminate().success());
    }
}

#[tokio::test]
async fn switching_an_unknown_provider_fails_and_writes_nothing() {
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.store().await;
    let url = db.url_string();
    let output = onejob(&[
        "providers",
        "disable",
        "no-such-provider",
        "--reason",
        "typo",
        "--database-url",
        &url,
    ]);
    assert!(!output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no-such-provider"), "{stderr}");
    assert!(stderr.contains("sim-backup"), "lists what exists: {stderr}");
    assert!(store.provider_switches().await.unwrap().is_empty());
    assert!(store.provider_audit(None, 10).await.unwrap().is_empty());
}

/// A config whose providers directory holds one good and one bad file.
fn config_with_bad_provider(dir: &Path) -> String {
    let providers = dir.join("providers");
    std::fs::create_dir(&providers).unwrap();
    let good = "kind = \"sim\"\nbase_url = \"http://127.0.0.1:8090\"\nmodel = \"healthy\"\n\
                tokenizer = \"o200k_base\"\ncontext_window = 16384\n";
    std::fs::write(providers.join("good.toml"), good).unwrap();
    std::fs::write(
        providers.join("broken.toml"),
        good.replace(
            "model = \"healthy\"\n",
            "model = \"healthy\"\ntemprature = 0\n",
        ),
    )
    .unwrap();
    let config = dir.join("onejob.toml");
    std::fs::write(
        &config,
        "[server]\nproviders_dir = \"providers\"\ndatabase_url = \"onejob.db\"\n",
    )
    .unwrap();
    config.display().to_string()
}

#[test]
fn providers_list_names_the_bad_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_bad_provider(dir.path());
    let output = onejob(&["providers", "list", "--config", &config]);
    assert!(!output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("broken.toml: line 4"), "{stderr}");
    assert!(stderr.contains("temprature"), "{stderr}");
}

#[test]
fn serve_validate_never_prints_a_secret_pasted_into_a_provider_file() {
    let secret = "sk-proj-CLIPASTED9f8e7d6c5b4a";
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_bad_provider(dir.path());
    let providers = dir.path().join("providers");
    let good = std::fs::read_to_string(providers.join("good.toml")).unwrap();
    for (file, body) in [
        ("broken.toml", format!("{good}api_key = \"{secret}\"\n")),
        (
            "broken.toml",
            good.replace("kind = \"sim\"", "kind = \"openai\"")
                + &format!("api_key_env = \"{secret}\"\n"),
        ),
    ] {
        std::fs::write(providers.join(file), &body).unwrap();
        let output = onejob(&["serve", "--validate", "--config", &config]);
        assert!(!output.status.success(), "{}", text(&output));
        let all = text(&output);
        assert!(all.contains("broken.toml"), "{all}");
        assert!(!all.contains(secret), "the secret is printed: {all}");
    }
}

#[test]
fn serve_validate_names_the_bad_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_bad_provider(dir.path());
    let output = onejob(&["serve", "--validate", "--config", &config]);
    assert!(!output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("broken.toml: line 4"), "{stderr}");
}

#[test]
fn serve_validate_names_an_unset_api_key_variable_and_unknown_route_providers() {
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers");
    std::fs::create_dir(&providers).unwrap();
    std::fs::write(
        providers.join("openai.toml"),
        "kind = \"openai\"\nbase_url = \"https://api.openai.com\"\nmodel = \"gpt-4o-mini\"\n\
         api_key_env = \"ONEJOB_TEST_KEY_THAT_IS_NOT_SET\"\ntokenizer = \"o200k_base\"\n\
         context_window = 128000\n",
    )
    .unwrap();
    // And a contract that does not load: listed with the rest.
    let contract = dir.path().join("contracts/broken-contract");
    std::fs::create_dir_all(&contract).unwrap();
    std::fs::write(contract.join("contract.toml"), "template = \"{{ x }\"\n").unwrap();
    let config = dir.path().join("onejob.toml");
    std::fs::write(
        &config,
        "[routes.default]\nprimary = \"openai\"\nfallbacks = [\"missing\"]\n",
    )
    .unwrap();
    let output = onejob(&[
        "serve",
        "--validate",
        "--config",
        &config.display().to_string(),
    ]);
    assert!(!output.status.success(), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("openai.toml"), "{stderr}");
    assert!(
        stderr.contains("ONEJOB_TEST_KEY_THAT_IS_NOT_SET"),
        "{stderr}"
    );
    assert!(stderr.contains("routes.default.fallbacks"), "{stderr}");
    assert!(stderr.contains("\"missing\""), "{stderr}");
    assert!(stderr.contains("broken-contract"), "{stderr}");
    assert!(stderr.contains("3 problem(s)"), "{stderr}");
}

/// A server that runs jobs refuses to start with a route naming a provider
/// it does not have: every job of the route would be acknowledged and then
/// fail. One without an engine (whose jobs other servers run) starts.
#[test]
fn serve_refuses_a_route_naming_a_provider_it_does_not_have() {
    let dir = tempfile::tempdir().unwrap();
    let config = config_with_bad_provider(dir.path());
    std::fs::remove_file(dir.path().join("providers/broken.toml")).unwrap();
    let text_of = |routes: &str| {
        format!(
            "[server]\nproviders_dir = \"providers\"\ndatabase_url = \"onejob.db\"\n\
             listen = \"127.0.0.1:0\"\n{routes}"
        )
    };
    std::fs::write(
        &config,
        text_of("[routes.default]\nprimary = \"good\"\nfallbacks = [\"missing\"]\n"),
    )
    .unwrap();
    // Bounded by `timeout`: a server that starts would run for ever.
    let serve = |extra: &[&str]| {
        Command::new("timeout")
            .args([
                "20",
                env!("CARGO_BIN_EXE_onejob"),
                "serve",
                "--config",
                &config,
            ])
            .args(extra)
            .env_remove("ONEJOB_CONFIG")
            .env_remove("ONEJOB_DATABASE_URL")
            .env("RUST_LOG", "warn")
            .output()
            .unwrap()
    };
    let output = serve(&[]);
    assert_eq!(output.status.code(), Some(1), "{}", text(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("routes.default.fallbacks: provider \"missing\" is not configured"),
        "{stderr}"
    );
    let output = onejob(&["serve", "--validate", "--config", &config]);
    assert!(!output.status.success(), "{}", text(&output));
    // Without an engine the same routes are other servers' to run.
    let mut without = text_of("[routes.default]\nprimary = \"good\"\nfallbacks = [\"missing\"]\n");
    without.push_str("[engine]\nenabled = false\n");
    std::fs::write(&config, without).unwrap();
    let output = onejob(&["serve", "--validate", "--config", &config]);
    assert!(output.status.success(), "{}", text(&output));
}

#[test]
fn serve_validate_accepts_the_shipped_configuration() {
    let output = onejob(&["serve", "--validate", "--config", "onejob.toml"]);
    assert!(output.status.success(), "{}", text(&output));
    assert!(String::from_utf8_lossy(&output.stdout).starts_with("config ok:"));
}

#[tokio::test]
async fn serve_validate_check_reachable_reports_a_closed_port() {
    // A port nobody listens on: bind, note it, close.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers");
    std::fs::create_dir(&providers).unwrap();
    let sim = format!(
        "kind = \"sim\"\nbase_url = \"http://127.0.0.1:{port}\"\nmodel = \"healthy\"\n\
         tokenizer = \"o200k_base\"\ncontext_window = 16384\n"
    );
    std::fs::write(providers.join("sim.toml"), &sim).unwrap();
    let config = dir.path().join("onejob.toml");
    std::fs::write(&config, "[routes.default]\nprimary = \"sim\"\n").unwrap();
    let config = config.display().to_string();

    let output = onejob(&["serve", "--validate", "--config", &config]);
    assert!(output.status.success(), "{}", text(&output));
    let output = onejob(&[
        "serve",
        "--validate",
        "--check-reachable",
        "--config",
        &config,
    ]);
    assert!(!output.status.success(), "{}", text(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("unreachable"),
        "{}",
        text(&output)
    );
}

#[tokio::test]
async fn sim_listens_answers_healthz_and_stops_on_sigterm() {
    let sim = Process::start(
        &["sim", "--listen", "127.0.0.1:0"],
        "onejob sim listening on ",
    );
    let response = reqwest::get(format!("{}/healthz", sim.address))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert!(sim.terminate().success(), "SIGTERM is a clean stop");
}

/// A SIGTERM sent the moment the simulator says it listens, before it has
/// served anything, is a clean stop: the handler is installed before that
/// line is printed, not when the serving task first runs.
#[tokio::test]
async fn sim_stops_cleanly_on_a_sigterm_sent_as_it_says_it_listens() {
    for _ in 0..5 {
        let sim = Process::start(
            &["sim", "--listen", "127.0.0.1:0"],
            "onejob sim listening on ",
        );
        assert!(sim.terminate().success(), "SIGTERM is a clean stop");
    }
}
