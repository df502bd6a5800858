//! `onejob providers list|enable|disable`: the operator's view of the
//! configured providers and their switches, straight from the database
//! (running servers pick a switch up within a refresh period).

use super::{open_existing_store, open_store, DbArgs};
use crate::clock::SystemClock;
use crate::clock::{rfc3339, Clock};
use crate::config::Config;
use crate::domain::reason::check_reason;
use crate::domain::text::OneLine;
use crate::providers::config::{load_dir, ProviderConfig, ProviderKind};
use crate::providers::switches::{switch_provider, SwitchError};
use std::collections::BTreeMap;

/// The configured providers, by name. API keys are not resolved: listing
/// and switching need none.
fn configured(config: &Config) -> anyhow::Result<BTreeMap<String, ProviderConfig>> {
    if !config.providers_dir.exists() {
        return Ok(BTreeMap::new());
    }
    Ok(load_dir(&config.providers_dir)?)
}

fn kind_name(kind: ProviderKind) -> &'static str {
    match kind {
        ProviderKind::Openai => "openai",
        ProviderKind::Anthropic => "anthropic",
        ProviderKind::Sim => "sim",
        ProviderKind::Gemini => "gemini",
        ProviderKind::AzureOpenai => "azure_openai",
        ProviderKind::Bedrock => "bedrock",
    }
}

/// `onejob providers list`: one row per configured provider.
pub async fn list(db: &DbArgs) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let providers = configured(&config)?;
    if providers.is_empty() {
        let missing = if config.providers_dir.exists() {
            ""
        } else {
            " (the directory does not exist: see [server] providers_dir)"
        };
        eprintln!(
            "no providers configured in {}{missing}",
            config.providers_dir.display()
        );
    }
    let contracts = if config.contracts_dir.exists() {
        crate::contracts::load_all(&config.contracts_dir)?
    } else {
        BTreeMap::new()
    };
    let store = open_existing_store(&config).await?;
    let switches = store.provider_switches().await;
    let runs = store.latest_contract_runs().await;
    store.close().await;
    let (switches, runs) = (switches?, runs?);
    let eligibility_rows = eligibility_rows(&providers, &contracts, &switches, &runs);
    let switches: BTreeMap<String, _> = switches.into_iter().map(|s| (s.name.clone(), s)).collect();
    let mut rows = vec![[
        "NAME".to_string(),
        "KIND".into(),
        "MODEL".into(),
        "ENABLED".into(),
        "CHANGED_BY".into(),
        "CHANGED_AT".into(),
        "REASON".into(),
    ]];
    for (name, provider) in &providers {
        let switch = switches.get(name);
        rows.push([
            name.clone(),
            kind_name(provider.kind).into(),
            provider.model.clone(),
            if switch.is_none_or(|s| s.enabled) {
                "yes"
            } else {
                "no"
            }
            .into(),
            switch.map_or("-".into(), |s| s.changed_by.clone()),
            switch.map_or("-".into(), |s| rfc3339(s.changed_at)),
            switch.map_or("-".into(), |s| s.reason.clone()),
        ]);
    }
    print!("{}", table(&rows));
    if eligibility_rows.len() > 1 {
        println!("\nEligibility as a fallback, per contract:");
        print!("{}", table(&eligibility_rows));
    }
    Ok(())
}

/// Provider × contract: may it take over a job of that contract, and why not.
fn eligibility_rows(
    providers: &BTreeMap<String, ProviderConfig>,
    contracts: &BTreeMap<String, crate::contracts::Contract>,
    switches: &[crate::store::ProviderSwitch],
    runs: &[crate::store::ContractRunSummary],
) -> Vec<[String; 4]> {
    let mut rows = vec![[
        "PROVIDER".to_string(),
        "CONTRACT".into(),
        "ELIGIBLE".into(),
        "WHY".into(),
    ]];
    for (name, provider) in providers {
        let enabled = crate::contracts::eligibility::is_enabled(switches, name);
        for (contract_name, contract) in contracts {
            let digest = provider.digest();
            let latest = crate::contracts::eligibility::deciding_run(runs, name, &digest, contract);
            let e = crate::contracts::eligibility(enabled, &digest, contract, latest);
            rows.push([
                name.clone(),
                contract_name.clone(),
                if e.eligible { "yes" } else { "no" }.into(),
                e.reason,
            ]);
        }
    }
    rows
}

/// Left-aligned columns two spaces apart; the last column is not padded.
/// A cell's text on one line (a line break or an escape written escaped,
/// as [`OneLine`] writes it), so that a multi-line reason cannot show as
/// rows of its own.
pub(crate) fn table<const N: usize>(rows: &[[String; N]]) -> String {
    let rows: Vec<[String; N]> = rows
        .iter()
        .map(|row| row.clone().map(|cell| OneLine(&cell).to_string()))
        .collect();
    let mut widths = [0usize; N];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == N {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Who a CLI switch is audited as: `cli:$USER`, or `cli`.
fn actor() -> String {
    match std::env::var("USER") {
        Ok(user) if !user.trim().is_empty() => format!("cli:{}", user.trim()),
        _ => "cli".to_string(),
    }
}

/// `onejob providers enable|disable NAME --reason TEXT`.
pub async fn switch(db: &DbArgs, name: &str, enabled: bool, reason: &str) -> anyhow::Result<()> {
    let config = db.load(None)?;
    let providers = configured(&config)?;
    // Refuse before touching the database: nothing is written for a typo.
    if !providers.contains_key(name) {
        let known: Vec<&str> = providers.keys().map(String::as_str).collect();
        anyhow::bail!(
            "{}; configured in {}: {}",
            SwitchError::UnknownProvider(name.to_string()),
            config.providers_dir.display(),
            if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            }
        );
    }
    check_reason(reason).map_err(|e| anyhow::anyhow!("--reason: {e}"))?;
    let store = open_store(&config).await?;
    let result = switch_provider(
        store.as_ref(),
        true,
        name,
        enabled,
        &actor(),
        Some(reason),
        SystemClock.now_ms(),
    )
    .await;
    store.close().await;
    let switch = result?;
    println!(
        "{name} {} by {}: {}",
        if switch.enabled {
            "enabled"
        } else {
            "disabled"
        },
        switch.changed_by,
        OneLine(&switch.reason)
    );
    println!("running servers pick this up within a second");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_aligns_columns() {
        let rows = [
            ["NAME".to_string(), "ENABLED".into(), "REASON".into()],
            ["sim-backup".to_string(), "no".into(), "flaky".into()],
        ];
        assert_eq!(
            table(&rows),
            "NAME        ENABLED  REASON\nsim-backup  no       flaky\n"
        );
        // A reason of two lines is one row, its break written escaped.
        let forged = [
            ["NAME".to_string(), "REASON".into()],
            ["sim".to_string(), "one\nsim-fake  yes".into()],
        ];
        assert_eq!(table(&forged), "NAME  REASON\nsim   one\\nsim-fake  yes\n");
    }
}
