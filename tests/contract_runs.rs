//! Contract runs against the real simulator over HTTP: what each broken
//! behaviour fails and why, runs stored on both backends, eligibility as the
//! engine will read it, the `onejob contracts run` command and the admin
//! endpoint.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{spawn_app, test_config, Backend, TestDb};
use onejob::app::Application;
use onejob::clock::SystemClock;
use onejob::contracts::{
    load_all, profile_of, run_contracts, CheckKind, Contract, ContractReport, EligibilityCache,
    EligibilityStatus, RunError,
};
use onejob::providers::catalog::Catalog;
use onejob::sim::{SimHandle, SimServer};
use onejob::store::Store;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn shipped_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts")
}

fn shipped() -> BTreeMap<String, Contract> {
    load_all(&shipped_dir()).unwrap()
}

fn provider_toml(sim: &SimHandle, model: &str) -> String {
    format!(
        "kind = \"sim\"\nbase_url = \"{}\"\nmodel = \"{model}\"\ntokenizer = \"o200k_base\"\n\
         context_window = 16384\nhonours_idempotency_key = true\nlookup = \"sim_ledger\"\n\
         [timeouts]\nconnect_ms = 2000\nfirst_byte_ms = 20000\ntotal_ms = 30000\n",
        sim.base_url()
    )
}

/// A providers directory with one `NAME.toml` per (name, sim model).
fn write_providers(dir: &Path, sim: &SimHandle, providers: &[(&str, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, model) in providers {
        std::fs::write(dir.join(format!("{name}.toml")), provider_toml(sim, model)).unwrap();
    }
}

fn catalog(sim: &SimHandle, providers: &[(&str, &str)]) -> (tempfile::TempDir, Catalog) {
    let dir = tempfile::tempdir().unwrap();
    write_providers(dir.path(), sim, providers);
    let catalog = Catalog::load(dir.path(), None).unwrap();
    (dir, catalog)
}

/// A copy of one shipped contract in a temp dir, to edit.
fn contract_copy(name: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    copy_dir(&shipped_dir().join(name), &dir.path().join(name));
    dir
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let path = entry.unwrap().path();
        let target = to.join(path.file_name().unwrap());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).unwrap();
        }
    }
}

fn failures(report: &ContractReport, check: CheckKind) -> Vec<(String, String)> {
    report
        .failures()
        .filter(|c| c.check == check)
        .map(|c| (c.case.clone(), c.message.clone()))
        .collect()
}

fn report_of<'a>(reports: &'a [ContractReport], provider: &str) -> &'a ContractReport {
    reports.iter().find(|r| r.provider == provider).unwrap()
}

async fn sqlite_store() -> (TestDb, Arc<dyn Store>) {
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.store().await;
    (db, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn healthy_simulated_provider_passes_every_check_of_both_shipped_contracts() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, &[("sim", "healthy")]);
    let contracts = shipped();
    let (_db, store) = sqlite_store().await;

    let reports = run_contracts(
        &catalog,
        &contracts,
        store.as_ref(),
        &SystemClock,
        None,
        None,
        "test",
    )
    .await
    .unwrap();

    assert_eq!(reports.len(), 2);
    for report in &reports {
        assert!(report.passed, "{}", report.to_table());
        let cases = contracts[&report.contract].cases.len();
        assert_eq!(report.checks.len(), cases * 4);
        // Every case reached the simulator exactly once.
        for case in &contracts[&report.contract].cases {
            let key = onejob::contracts::contract_run_key(
                &contracts[&report.contract],
                &profile_of(catalog.get("sim").unwrap()),
                &case.name,
            );
            assert_eq!(sim.ledger().executions(&key), 1, "{key}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_broken_behaviour_fails_the_check_it_breaks_and_says_where() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(
        &sim,
        &[
            ("hallucinating", "hallucinate_key"),
            ("deaf", "ignore_system"),
            ("miscounting", "wrong_usage"),
        ],
    );
    let contracts = shipped();
    let (_db, store) = sqlite_store().await;
    let reports = run_contracts(
        &catalog,
        &contracts,
        store.as_ref(),
        &SystemClock,
        None,
        Some("ticket-triage"),
        "test",
    )
    .await
    .unwrap();
    let cases = contracts["ticket-triage"].cases.len();
    assert!(reports.iter().all(|r| !r.passed));

    let hallucinating = report_of(&reports, "hallucinating");
    let schema = failures(hallucinating, CheckKind::Schema);
    assert_eq!(schema.len(), cases, "{}", hallucinating.to_table());
    for (case, message) in &schema {
        assert!(
            message.contains("/confidence_note") && message.contains("output breaks the schema"),
            "{case}: {message}"
        );
    }
    assert!(failures(hallucinating, CheckKind::Tokenizer).is_empty());

    let deaf = report_of(&reports, "deaf");
    let schema = failures(deaf, CheckKind::Schema);
    let round_trip = failures(deaf, CheckKind::RoundTrip);
    assert_eq!(schema.len(), cases, "{}", deaf.to_table());
    assert_eq!(round_trip.len(), cases, "{}", deaf.to_table());
    assert!(schema
        .iter()
        .all(|(_, m)| m.starts_with("output is not JSON")));
    assert!(round_trip
        .iter()
        .all(|(_, m)| m.contains("output is not JSON")));

    let miscounting = report_of(&reports, "miscounting");
    let tokenizer = failures(miscounting, CheckKind::Tokenizer);
    assert_eq!(tokenizer.len(), cases, "{}", miscounting.to_table());
    for (case, message) in &tokenizer {
        assert!(
            message.contains("prompt tokens, we count") && message.contains("off by more than"),
            "{case}: {message}"
        );
    }
    assert_eq!(miscounting.failures().count(), cases);

    // Every failure names its case, and the table shows the reasons.
    let table = onejob::contracts::render_table(&reports);
    assert!(
        table.contains("hallucinating / arabic-delivery-delay / schema: output breaks the schema"),
        "{table}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_template_with_an_undefined_variable_fails_prompt_rendering() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, &[("sim", "healthy")]);
    let copy = contract_copy("ticket-triage");
    let toml_path = copy.path().join("ticket-triage/contract.toml");
    let text = std::fs::read_to_string(&toml_path).unwrap();
    let text = text.replacen(
        "Subject: {{ subject }}",
        "Subject: {{ subject }}\nOrder: {{ order_number }}",
        1,
    );
    std::fs::write(&toml_path, text).unwrap();
    let contracts = load_all(copy.path()).unwrap();
    let (_db, store) = sqlite_store().await;

    let reports = run_contracts(
        &catalog,
        &contracts,
        store.as_ref(),
        &SystemClock,
        None,
        None,
        "test",
    )
    .await
    .unwrap();

    let rendering = failures(&reports[0], CheckKind::PromptRendering);
    assert_eq!(rendering.len(), contracts["ticket-triage"].cases.len());
    for (case, message) in &rendering {
        assert!(
            message.contains("undefined variable `order_number` at template line"),
            "{case}: {message}"
        );
    }
    // Nothing was sent for a prompt that did not render.
    assert!(failures(&reports[0], CheckKind::Schema)
        .iter()
        .all(|(_, m)| m.contains("the prompt did not render")));
}

#[tokio::test]
async fn unknown_names_are_errors_that_name_them_and_store_nothing() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, &[("sim", "healthy")]);
    let contracts = shipped();
    let (_db, store) = sqlite_store().await;
    let err = run_contracts(
        &catalog,
        &contracts,
        store.as_ref(),
        &SystemClock,
        Some("nope"),
        None,
        "test",
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RunError::UnknownProvider { .. }));
    assert!(err.to_string().contains("\"nope\""), "{err}");
    let err = run_contracts(
        &catalog,
        &contracts,
        store.as_ref(),
        &SystemClock,
        None,
        Some("no-such-contract"),
        "test",
    )
    .await
    .unwrap_err();
    assert!(
        err.to_string()
            .contains("unknown contract \"no-such-contract\""),
        "{err}"
    );
    assert!(store.latest_contract_runs().await.unwrap().is_empty());
}

/// Every contract of `contracts` run against provider `good` of `catalog`.
async fn run_good(
    catalog: &Catalog,
    contracts: &BTreeMap<String, Contract>,
    store: &dyn Store,
) -> Vec<ContractReport> {
    run_contracts(
        catalog,
        contracts,
        store,
        &SystemClock,
        Some("good"),
        None,
        "tester",
    )
    .await
    .unwrap()
}

async fn runs_are_stored_and_decide_eligibility(backend: Backend) {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, &[("good", "healthy"), ("bad", "hallucinate_key")]);
    let catalog = Arc::new(catalog);
    let copy = contract_copy("ticket-triage");
    let contracts = Arc::new(load_all(copy.path()).unwrap());
    let db = TestDb::new(backend).await;
    let store = db.store().await;
    let cache = EligibilityCache::with_max_age(
        store.clone(),
        catalog.clone(),
        contracts.clone(),
        Duration::ZERO,
    );

    let before = cache.eligibility("good", "ticket-triage").await.unwrap();
    assert_eq!(before.status, EligibilityStatus::NeverRun);
    assert_eq!(before.reason, "no contract run yet");

    run_contracts(
        &catalog,
        &contracts,
        store.as_ref(),
        &SystemClock,
        None,
        None,
        "tester",
    )
    .await
    .unwrap();

    let latest = store.latest_contract_runs().await.unwrap();
    assert_eq!(latest.len(), 2);
    let good_run = latest.iter().find(|r| r.provider == "good").unwrap();
    assert!(good_run.passed);
    assert_eq!(
        good_run.contract_digest,
        contracts["ticket-triage"].digest()
    );
    assert_eq!(
        good_run.provider_digest,
        catalog.get("good").unwrap().digest
    );
    assert_eq!(good_run.actor, "tester");
    let stored = store.contract_run(&good_run.id).await.unwrap().unwrap();
    let report: ContractReport = serde_json::from_str(&stored.report).unwrap();
    assert!(report.passed);
    assert_eq!(report.provider, "good");

    let snapshot = cache.snapshot().await.unwrap();
    assert!(snapshot.is_eligible("good", "ticket-triage"));
    let bad = snapshot.get("bad", "ticket-triage");
    assert_eq!(bad.status, EligibilityStatus::LatestRunFailed);
    assert!(
        bad.reason.starts_with(
            "latest run failed: schema on case arabic-delivery-delay: output breaks the schema"
        ),
        "{}",
        bad.reason
    );

    // The contract's schema changes: the old run no longer counts.
    let schema_path = copy.path().join("ticket-triage/schema.json");
    let mut schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&schema_path).unwrap()).unwrap();
    schema["description"] = json!("Triage of one support ticket (edited).");
    std::fs::write(&schema_path, schema.to_string()).unwrap();
    let edited = Arc::new(load_all(copy.path()).unwrap());
    assert_ne!(
        edited["ticket-triage"].digest(),
        contracts["ticket-triage"].digest()
    );
    let cache = EligibilityCache::with_max_age(
        store.clone(),
        catalog.clone(),
        edited.clone(),
        Duration::ZERO,
    );
    let stale = cache.eligibility("good", "ticket-triage").await.unwrap();
    assert_eq!(stale.status, EligibilityStatus::ContractChanged);
    assert!(
        stale
            .reason
            .starts_with("contract changed since the last run (digest"),
        "{}",
        stale.reason
    );

    // A new passing run under the new digest makes it eligible again.
    run_good(&catalog, &edited, store.as_ref()).await;
    assert!(
        cache
            .eligibility("good", "ticket-triage")
            .await
            .unwrap()
            .eligible
    );

    // The provider's config changes: its runs no longer count.
    let (_dir2, changed) = self::catalog(&sim, &[("good", "healthy:latency=1")]);
    let changed = Arc::new(changed);
    let changed_cache = EligibilityCache::with_max_age(
        store.clone(),
        changed.clone(),
        edited.clone(),
        Duration::ZERO,
    );
    let stale = changed_cache
        .eligibility("good", "ticket-triage")
        .await
        .unwrap();
    assert_eq!(stale.status, EligibilityStatus::ProviderChanged);
    assert!(stale
        .reason
        .starts_with("provider config changed since the last run"));

    // The changed config is run (a staging run before its rollout): its
    // calls carry new keys, so the simulator, which honours keys, runs
    // them rather than refuse a key it saw with another model's body.
    let reports = run_good(&changed, &edited, store.as_ref()).await;
    assert!(reports[0].passed, "{}", reports[0].to_table());
    for case in &edited["ticket-triage"].cases {
        let key = onejob::contracts::contract_run_key(
            &edited["ticket-triage"],
            &profile_of(changed.get("good").unwrap()),
            &case.name,
        );
        assert_eq!(sim.ledger().executions(&key), 1, "{key}");
    }
    assert!(
        changed_cache
            .eligibility("good", "ticket-triage")
            .await
            .unwrap()
            .eligible
    );
    // ... and servers still on the config that passed keep it eligible,
    // though the pair's newest run was made with another config; so does
    // a failed run of a third config.
    let (_dir3, broken) = self::catalog(&sim, &[("good", "hallucinate_key")]);
    let reports = run_good(&broken, &edited, store.as_ref()).await;
    assert!(!reports[0].passed);
    let kept = cache.eligibility("good", "ticket-triage").await.unwrap();
    assert!(kept.eligible, "{}", kept.reason);
    assert!(
        changed_cache
            .eligibility("good", "ticket-triage")
            .await
            .unwrap()
            .eligible
    );

    // Disabled by ops: ineligible whatever the runs say.
    store
        .set_provider_enabled("good", false, "ops", "maintenance", 1)
        .await
        .unwrap();
    let disabled = cache.eligibility("good", "ticket-triage").await.unwrap();
    assert!(!disabled.eligible);
    assert_eq!(disabled.status, EligibilityStatus::Disabled);
    assert_eq!(disabled.reason, "disabled");

    // Six runs are stored; the latest of each pair and digests is listed
    // (good: the contract before and after its edit under the first
    // config, then two more configs; bad: one), and the one that decides
    // is the run of the config and contract as loaded.
    let latest = store.latest_contract_runs().await.unwrap();
    assert_eq!(latest.len(), 5);
    let first = catalog.get("good").unwrap();
    let deciding = onejob::contracts::eligibility::deciding_run(
        &latest,
        "good",
        &first.digest,
        &edited["ticket-triage"],
    )
    .unwrap();
    assert_ne!(deciding.id, good_run.id);
    assert!(deciding.passed);
    assert_eq!(deciding.contract_digest, edited["ticket-triage"].digest());
    assert_eq!(deciding.provider_digest, first.digest);
    assert!(store.contract_run(&good_run.id).await.unwrap().is_some());
    store.close().await;
}

on_both_backends!(runs_are_stored_and_decide_eligibility);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cached_eligibility_is_refreshed_after_its_max_age() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, &[("good", "healthy")]);
    let contracts = Arc::new(shipped());
    let (_db, store) = sqlite_store().await;
    let catalog = Arc::new(catalog);
    let cache = EligibilityCache::new(store.clone(), catalog.clone(), contracts.clone());
    let first = cache.snapshot().await.unwrap();
    assert!(!first.is_eligible("good", "ticket-triage"));
    run_contracts(
        &catalog,
        &contracts,
        store.as_ref(),
        &SystemClock,
        None,
        Some("ticket-triage"),
        "test",
    )
    .await
    .unwrap();
    // Within the max age the same snapshot is served...
    let again = cache.snapshot().await.unwrap();
    if again.taken_at() == first.taken_at() {
        assert!(Arc::ptr_eq(&first, &again));
    }
    // ...and after it, the store is read again.
    tokio::time::sleep(onejob::contracts::eligibility::DEFAULT_MAX_AGE).await;
    assert!(cache
        .snapshot()
        .await
        .unwrap()
        .is_eligible("good", "ticket-triage"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cli_run_exits_non_zero_on_a_failing_provider_and_writes_junit_and_json() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_providers(
        &dir.path().join("providers"),
        &sim,
        &[("healthy", "healthy"), ("broken", "hallucinate_key")],
    );
    let config = dir.path().join("onejob.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndatabase_url = \"{}\"\ncontracts_dir = \"{}\"\n",
            dir.path().join("cli.db").display(),
            shipped_dir().display()
        ),
    )
    .unwrap();
    let junit = dir.path().join("out/contracts.xml");
    let json_path = dir.path().join("contracts.json");
    std::fs::create_dir_all(junit.parent().unwrap()).unwrap();

    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args([
            "contracts",
            "run",
            "--contract",
            "ticket-triage",
            "--config",
        ])
        .arg(&config)
        .arg("--junit")
        .arg(&junit)
        .arg("--json")
        .arg(&json_path)
        .env_remove("ONEJOB_DATABASE_URL")
        .env_remove("ONEJOB_CONFIG")
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("1 of 2 contract runs failed"), "{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("broken") && l.ends_with("FAIL")),
        "{stdout}"
    );
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("healthy") && l.ends_with("PASS")),
        "{stdout}"
    );
    assert!(stdout.contains("broken / arabic-delivery-delay / schema: output breaks the schema"));

    let cases = shipped()["ticket-triage"].cases.len();
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(xml.starts_with("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites "));
    assert!(xml.trim_end().ends_with("</testsuites>"));
    assert_eq!(xml.matches("<testsuite ").count(), 2);
    assert_eq!(xml.matches("</testsuite>").count(), 2);
    assert_eq!(xml.matches("<testcase ").count(), 2 * cases * 4);
    assert_eq!(
        xml.matches("<failure ").count(),
        xml.matches("</failure>").count()
    );
    assert!(xml.contains(&format!(
        "<testsuites name=\"onejob contracts\" tests=\"{}\" failures=\"{cases}\">",
        2 * cases * 4
    )));
    assert!(xml.contains("name=\"ticket-triage/broken\""));

    let json: Value = serde_json::from_str(&std::fs::read_to_string(&json_path).unwrap()).unwrap();
    assert_eq!(json["passed"], false);
    let reports: Vec<ContractReport> = serde_json::from_value(json["reports"].clone()).unwrap();
    assert_eq!(reports.len(), 2);
    assert!(report_of(&reports, "healthy").passed);
    assert!(!report_of(&reports, "broken").passed);

    // Both runs were stored in the configured database.
    let store = onejob::store::connect(&onejob::config::DatabaseUrl::Sqlite(
        dir.path().join("cli.db"),
    ))
    .await
    .unwrap();
    let latest = store.latest_contract_runs().await.unwrap();
    assert_eq!(latest.len(), 2);
    assert!(latest.iter().all(|r| r.actor == "cli"));
    store.close().await;
}

/// An operator qualifying one provider sets that provider's credentials
/// only: the run with `--provider` builds and calls that one, so another
/// provider's unset API key variable does not stop it. A run that would
/// call the other provider, and the server, which builds every provider,
/// still refuse without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cli_run_of_one_provider_needs_only_its_credentials() {
    const UNSET: &str = "ONEJOB_TEST_CONTRACTS_KEY_THAT_IS_NOT_SET";
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers");
    write_providers(&providers, &sim, &[("healthy", "healthy")]);
    std::fs::write(
        providers.join("openai.toml"),
        format!(
            "kind = \"openai\"\nbase_url = \"https://api.openai.com\"\nmodel = \"gpt-4o-mini\"\n\
             api_key_env = \"{UNSET}\"\ntokenizer = \"o200k_base\"\ncontext_window = 128000\n"
        ),
    )
    .unwrap();
    let db = dir.path().join("one.db");
    let config = dir.path().join("onejob.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndatabase_url = \"{}\"\ncontracts_dir = \"{}\"\nlisten = \"127.0.0.1:0\"\n\
             [routes.default]\nprimary = \"healthy\"\n",
            db.display(),
            shipped_dir().display()
        ),
    )
    .unwrap();
    let onejob = |args: &[&str]| {
        let config = config.clone();
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        async move {
            tokio::process::Command::new("timeout")
                .arg("60")
                .arg(env!("CARGO_BIN_EXE_onejob"))
                .args(&args)
                .arg("--config")
                .arg(&config)
                .env_remove("ONEJOB_DATABASE_URL")
                .env_remove("ONEJOB_CONFIG")
                .env_remove(UNSET)
                .env("RUST_LOG", "warn")
                .output()
                .await
                .unwrap()
        }
    };

    let output = onejob(&[
        "contracts",
        "run",
        "--provider",
        "healthy",
        "--contract",
        "ticket-triage",
    ])
    .await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(!stderr.contains(UNSET), "{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.trim_start().starts_with("healthy") && l.ends_with("PASS")),
        "{stdout}"
    );
    let store = onejob::store::connect(&onejob::config::DatabaseUrl::Sqlite(db.clone()))
        .await
        .unwrap();
    let latest = store.latest_contract_runs().await.unwrap();
    assert_eq!(
        latest
            .iter()
            .map(|r| (r.provider.as_str(), r.contract.as_str(), r.passed))
            .collect::<Vec<_>>(),
        [("healthy", "ticket-triage", true)]
    );
    store.close().await;

    // Every provider, the keyless one included, is refused, naming the variable.
    for args in [
        &["contracts", "run"][..],
        &["contracts", "run", "--provider", "openai"],
    ] {
        let output = onejob(args).await;
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(UNSET), "{args:?}: {stderr}");
    }
    // The server builds every provider: it does not start without the key.
    let output = onejob(&["serve"]).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains(UNSET), "{stderr}");
}

#[tokio::test]
async fn running_contracts_needs_an_admin_key() {
    let app = spawn_app(Backend::Sqlite).await;
    let response = app
        .client
        .post(format!("{}/v1/admin/contracts/run", app.address))
        .bearer_auth(&app.key)
        .json(&json!({ "provider": "sim" }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 403);
    assert_eq!(common::error_code(response).await, "forbidden");
    let response = app.get(&app.key, "/v1/admin/contracts/runs").await;
    assert_eq!(response.status(), 403);
    assert!(app.store.latest_contract_runs().await.unwrap().is_empty());
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn admin_runs_contracts_over_http_and_sees_eligibility() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let db = TestDb::new(Backend::Sqlite).await;
    let mut config = test_config(&db);
    // The shipped providers/sim.toml and sim-backup.toml, pointed at this simulator.
    config.sim_base_url = Some(sim.base_url());
    let store = db.store().await;
    let app = Application::with_store(config, store.clone(), Arc::new(SystemClock))
        .await
        .unwrap();
    let address = format!("http://{}", app.local_addr());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(app.run_until_stopped(async {
        let _ = stopped.await;
    }));
    let admin = onejob::keys::create_key(store.as_ref(), &SystemClock, "ops", true)
        .await
        .unwrap();
    let client = reqwest::Client::new();
    let post = |body: Value| {
        client
            .post(format!("{address}/v1/admin/contracts/run"))
            .bearer_auth(&admin)
            .json(&body)
            .send()
    };

    let response = post(json!({ "provider": "nope" })).await.unwrap();
    assert_eq!(response.status(), 404);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "unknown_provider");
    assert!(body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("\"nope\""));
    let response = post(json!({ "contract": "nope" })).await.unwrap();
    assert_eq!(response.status(), 404);
    assert_eq!(common::error_code(response).await, "unknown_contract");
    let response = post(json!({ "provider": 3 })).await.unwrap();
    assert_eq!(response.status(), 422);

    let response = post(json!({ "provider": "sim", "contract": "ticket-triage" }))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["passed"], true, "{body:#}");
    assert_eq!(body["reports"].as_array().unwrap().len(), 1);
    assert_eq!(body["reports"][0]["provider"], "sim");

    let response = client
        .get(format!("{address}/v1/admin/contracts/runs"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    let runs = body["runs"].as_array().unwrap();
    let pair = |contract: &str, provider: &str| {
        runs.iter()
            .find(|r| r["contract"] == contract && r["provider"] == provider)
            .unwrap()
            .clone()
    };
    let ran = pair("ticket-triage", "sim");
    assert_eq!(ran["eligibility"]["eligible"], true, "{ran:#}");
    assert_eq!(ran["latest_run"]["passed"], true);
    let never = pair("invoice-extraction", "sim-backup");
    assert_eq!(never["eligibility"]["eligible"], false);
    assert_eq!(never["eligibility"]["status"], "never_run");
    assert!(never["latest_run"].is_null());

    let id = ran["latest_run"]["id"].as_str().unwrap();
    let response = client
        .get(format!("{address}/v1/admin/contracts/runs/{id}"))
        .bearer_auth(&admin)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["report"]["passed"], true);

    let _ = stop.send(());
    server.await.unwrap().unwrap();
}
