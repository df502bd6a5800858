//! Contract runs for `kind = "anthropic"` providers against the simulator's
//! Messages wire over HTTP: an honest model passes every check, its own
//! tokenizer check included (Anthropic's `count_tokens` compared with our
//! count within the contract's tolerance), and one whose count disagrees
//! with ours fails it. Runs are stored on both backends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Backend, TestDb};
use onejob::clock::SystemClock;
use onejob::contracts::{load_all, run_contracts, CheckKind, Contract, ContractReport};
use onejob::providers::catalog::Catalog;
use onejob::sim::{SimHandle, SimServer};
use std::collections::BTreeMap;
use std::path::Path;

on_both_backends!(an_honest_anthropic_model_passes_every_check_with_its_own_token_count);

const KEY_ENV: &str = "ONEJOB_TEST_ANTHROPIC_CONTRACT_KEY";

fn shipped() -> BTreeMap<String, Contract> {
    load_all(&Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts")).unwrap()
}

/// A providers directory of anthropic providers on the simulator, one per
/// (name, simulated model).
fn catalog(sim: &SimHandle, providers: &[(&str, &str)]) -> (tempfile::TempDir, Catalog) {
    std::env::set_var(KEY_ENV, "anthropic-test-key");
    let dir = tempfile::tempdir().unwrap();
    for (name, model) in providers {
        let text = format!(
            "kind = \"anthropic\"\nbase_url = \"{}\"\nmodel = \"{model}\"\napi_key_env = \"{KEY_ENV}\"\n\
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

async fn an_honest_anthropic_model_passes_every_check_with_its_own_token_count(backend: Backend) {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, &[("claude", "healthy")]);
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
        assert!(report.passed, "{}", report.to_table());
        let contract = &contracts[&report.contract];
        assert_eq!(report.checks.len(), contract.cases.len() * 4);
        for check in report
            .checks
            .iter()
            .filter(|c| c.check == CheckKind::Tokenizer)
        {
            assert!(
                check.message.contains("its count-tokens API says"),
                "{}: {}",
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
        // Each case ran once on the simulator (count_tokens runs nothing).
        for case in &contract.cases {
            let key = onejob::contracts::contract_run_key(contract, "claude", &case.name);
            assert_eq!(sim.ledger().executions(&key), 1, "{key}");
        }
    }
    let latest = store.latest_contract_runs().await.unwrap();
    assert_eq!(latest.len(), contracts.len());
    assert!(latest.iter().all(|r| r.passed && r.provider == "claude"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_model_whose_count_disagrees_fails_the_tokenizer_check() {
    let sim = SimServer::start("127.0.0.1:0").await.unwrap();
    let (_dir, catalog) = catalog(&sim, &[("miscounting", "wrong_usage")]);
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
    let report = &reports[0];
    assert!(!report.passed);
    let tokenizer = failures(report, CheckKind::Tokenizer);
    assert_eq!(
        tokenizer.len(),
        contracts["ticket-triage"].cases.len(),
        "{}",
        report.to_table()
    );
    assert!(failures(report, CheckKind::Schema).is_empty());
}
