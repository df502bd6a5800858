//! Contract runs for the provider kinds with their own wire and their own
//! count-tokens API (gemini's `countTokens`, bedrock's `CountTokens`,
//! anthropic's `count_tokens`), each against the simulator's wire for it
//! over HTTP: an honest model passes every check, its own tokenizer check
//! included (the provider's count compared with ours within the
//! contract's tolerance); a model deaf to the system prompt fails, and so
//! does one whose count disagrees with ours. Runs are stored on both
//! backends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, TestDb};
use onejob::clock::SystemClock;
use onejob::contracts::{load_all, profile_of, run_contracts, CheckKind, Contract, ContractReport};
use onejob::providers::catalog::Catalog;
use onejob::sim::{SimHandle, SimServer};
use std::collections::BTreeMap;
use std::path::Path;

on_both_backends!(an_honest_model_passes_every_check_with_its_own_token_count);

const KINDS: [&str; 3] = ["gemini", "bedrock", "anthropic"];
const KEY_ENV: &str = "ONEJOB_TEST_NATIVE_CONTRACT_KEY";
const KEY_ID_ENV: &str = "ONEJOB_TEST_CONTRACT_AWS_KEY_ID";
const SECRET_ENV: &str = "ONEJOB_TEST_CONTRACT_AWS_SECRET";

fn shipped() -> BTreeMap<String, Contract> {
    load_all(&Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts")).unwrap()
}

/// A providers directory of `kind` providers on the simulator, one per
/// (name, simulated model).
fn catalog(
    sim: &SimHandle,
    kind: &str,
    providers: &[(&str, &str)],
) -> (tempfile::TempDir, Catalog) {
    std::env::set_var(KEY_ENV, "native-test-key");
    std::env::set_var(KEY_ID_ENV, "AKIDEXAMPLE");
    std::env::set_var(SECRET_ENV, "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY");
    let dir = tempfile::tempdir().unwrap();
    for (name, model) in providers {
        let auth = match kind {
            "bedrock" => format!(
                "region = \"us-east-1\"\naccess_key_id_env = \"{KEY_ID_ENV}\"\n\
                 secret_access_key_env = \"{SECRET_ENV}\"\n"
            ),
            _ => format!("api_key_env = \"{KEY_ENV}\"\n"),
        };
        let text = format!(
            "kind = \"{kind}\"\nbase_url = \"{}\"\nmodel = \"{model}\"\n{auth}\
             tokenizer = \"o200k_base\"\ncontext_window = 16384\n\
             [timeouts]\nconnect_ms = 2000\nfirst_byte_ms = 20000\ntotal_ms = 30000\n",
            sim.base_url()
        );
        std::fs::write(dir.path().join(format!("{name}.toml")), text).unwrap();
    }
    let catalog = Catalog::load(dir.path(), None).unwrap();
    (dir, catalog)
}

fn failures(report: &ContractReport, check: CheckKind) -> Vec<(String, String)> {
    report
        .failures()
        .filter(|c| c.check == check)
        .map(|c| (c.case.clone(), c.message.clone()))
        .collect()
}

async fn an_honest_model_passes_every_check_with_its_own_token_count(backend: Backend) {
    for kind in KINDS {
        honest(backend, kind).await;
    }
}

async fn honest(backend: Backend, kind: &str) {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, kind, &[(kind, "healthy")]);
    let contracts = shipped();
    let db = TestDb::new(backend).await;
    let store = db.store().await;
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
    assert_eq!(reports.len(), contracts.len());
    for report in &reports {
        assert!(report.passed, "{kind}: {}", report.to_table());
        let contract = &contracts[&report.contract];
        assert_eq!(report.checks.len(), contract.cases.len() * 4);
        for check in report
            .checks
            .iter()
            .filter(|c| c.check == CheckKind::Tokenizer)
        {
            assert!(
                check.message.contains("its count-tokens API says"),
                "{kind} {}: {}",
                check.case,
                check.message
            );
        }
        for check in report
            .checks
            .iter()
            .filter(|c| c.check == CheckKind::PromptRendering)
        {
            assert!(
                check.message.starts_with("Anthropic layout"),
                "{}",
                check.message
            );
        }
        // Each case ran once on the simulator (counting runs nothing).
        for case in &contract.cases {
            let profile = profile_of(catalog.get(kind).unwrap());
            let key = onejob::contracts::contract_run_key(contract, &profile, &case.name);
            assert_eq!(sim.ledger().executions(&key), 1, "{key}");
        }
    }
    let latest = store.latest_contract_runs().await.unwrap();
    assert_eq!(latest.len(), contracts.len());
    assert!(latest.iter().all(|r| r.passed && r.provider == kind));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_deaf_to_the_system_prompt_or_miscounting_fails_on_each_wire() {
    for kind in KINDS {
        deaf_or_miscounting(kind).await;
    }
}

async fn deaf_or_miscounting(kind: &str) {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(
        &sim,
        kind,
        &[("deaf", "ignore_system"), ("miscounting", "wrong_usage")],
    );
    let contracts = shipped();
    let db = TestDb::new(Backend::Sqlite).await;
    let store = db.store().await;
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
    let report = |name: &str| reports.iter().find(|r| r.provider == name).unwrap();

    let deaf = report("deaf");
    assert!(!deaf.passed, "{kind}");
    let schema = failures(deaf, CheckKind::Schema);
    assert_eq!(schema.len(), cases, "{kind}: {}", deaf.to_table());
    assert!(schema
        .iter()
        .all(|(_, m)| m.starts_with("output is not JSON")));
    assert!(
        failures(deaf, CheckKind::Tokenizer).is_empty(),
        "{}",
        deaf.to_table()
    );

    let miscounting = report("miscounting");
    let tokenizer = failures(miscounting, CheckKind::Tokenizer);
    assert_eq!(tokenizer.len(), cases, "{kind}: {}", miscounting.to_table());
    assert_eq!(miscounting.failures().count(), cases);
    for (case, message) in &tokenizer {
        assert!(message.contains("off by more than"), "{case}: {message}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn count_tokens_alone_can_fail_the_tokenizer_check() {
    for kind in KINDS {
        count_alone(kind).await;
    }
}

async fn count_alone(kind: &str) {
    // `wrong_usage` miscounts in the count API as in its usage: 1.5 times ours.
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, kind, &[(kind, "wrong_usage")]);
    let provider = catalog.get(kind).unwrap().client.clone();
    let contract = &shipped()["ticket-triage"];
    let case = &contract.cases[0];
    let request = contract
        .chat_request(
            &case.input,
            onejob::contracts::WireFormat::Anthropic,
            "k-count".into(),
        )
        .unwrap();
    let prompt = contract
        .render(&case.input, onejob::contracts::WireFormat::Anthropic)
        .unwrap();
    let ours = onejob::contracts::count_prompt_tokens("o200k_base", &prompt).unwrap();
    let theirs = provider.count_tokens(&request).await.unwrap().unwrap();
    assert_eq!(theirs, ours * 3 / 2 + 1, "{kind}");
    assert_eq!(
        sim.ledger().executions("k-count"),
        0,
        "counting executes nothing"
    );
}
