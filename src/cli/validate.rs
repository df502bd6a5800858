//! `onejob serve --validate [--check-reachable]`: everything the server
//! would refuse at start (or trip over on the first job), checked without
//! starting it: the config file, every provider file (named by file and
//! line), the credentials they name (each provider is built as the server
//! builds it: API key variables, AWS credential variables, a Vertex AI
//! service-account file), the routes' providers, the contracts, and
//! optionally a TCP connect to each provider.

use crate::config::Config;
use crate::providers::build_provider;
use crate::providers::config::load_dir;
use std::collections::BTreeMap;

pub async fn validate(config: &Config, check_reachable: bool) -> anyhow::Result<()> {
    let providers = if config.providers_dir.exists() {
        load_dir(&config.providers_dir)?
    } else {
        BTreeMap::new()
    };
    let mut problems = Vec::new();
    for (name, provider) in &providers {
        if let Err(e) = build_provider(name, provider) {
            problems.push(e.to_string());
        }
    }
    // As the server refuses them at start: with an engine, which runs jobs.
    if config.engine.enabled {
        problems.extend(config.unconfigured_route_providers(|p| providers.contains_key(p)));
    }
    // A contract that does not load is one more problem: the others found
    // so far are listed with it.
    let contracts = if config.contracts_dir.exists() {
        match crate::contracts::load_all(&config.contracts_dir) {
            Ok(contracts) => contracts,
            Err(e) => {
                problems.push(e.to_string());
                BTreeMap::new()
            }
        }
    } else {
        BTreeMap::new()
    };
    if check_reachable {
        for provider in providers.values() {
            if let Err(e) = provider.check_reachable().await {
                problems.push(e.to_string());
            }
        }
    }
    if !problems.is_empty() {
        for problem in &problems {
            eprintln!("{problem}");
        }
        anyhow::bail!("configuration has {} problem(s)", problems.len());
    }
    println!(
        "config ok: {} route(s), {} provider(s){}, {} contract(s), database {}",
        config.routes.len(),
        providers.len(),
        if check_reachable { " reachable" } else { "" },
        contracts.len(),
        config.database
    );
    Ok(())
}
