//! The providers this server knows: every `providers/*.toml`, loaded once at
//! start, each with its adapter built. Whether a provider may be used right
//! now (enabled, contract-eligible, breaker) is decided elsewhere; this is
//! only what exists.

use super::config::{load_dir, ProviderConfig, ProviderConfigError, ProviderKind};
use super::{build_provider, Provider};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

pub struct ProviderEntry {
    pub name: String,
    pub config: ProviderConfig,
    pub client: Arc<dyn Provider>,
    /// SHA-256 of the canonical config; a contract run is valid only for it.
    pub digest: String,
}

#[derive(Default)]
pub struct Catalog {
    entries: BTreeMap<String, ProviderEntry>,
}

impl Catalog {
    /// Load `dir` (a missing directory is an empty catalog). With
    /// `sim_base_url`, every simulator provider talks to that server instead
    /// of its configured one (the demo and tests start their own simulator).
    pub fn load(dir: &Path, sim_base_url: Option<&str>) -> Result<Self, ProviderConfigError> {
        let configs = if dir.exists() {
            load_dir(dir)?
        } else {
            BTreeMap::new()
        };
        Self::from_configs(configs, sim_base_url)
    }

    pub fn from_configs(
        configs: BTreeMap<String, ProviderConfig>,
        sim_base_url: Option<&str>,
    ) -> Result<Self, ProviderConfigError> {
        let mut entries = BTreeMap::new();
        for (name, mut config) in configs {
            if let (ProviderKind::Sim, Some(url)) = (config.kind, sim_base_url) {
                config.base_url = url.to_string();
            }
            let client = build_provider(&name, &config)?;
            let digest = config.digest();
            entries.insert(
                name.clone(),
                ProviderEntry {
                    name,
                    config,
                    client,
                    digest,
                },
            );
        }
        Ok(Catalog { entries })
    }

    /// Add (or replace) a provider with a client of the caller's making: the
    /// deterministic simulation's scripted providers.
    pub fn insert(&mut self, name: &str, config: ProviderConfig, client: Arc<dyn Provider>) {
        let digest = config.digest();
        self.entries.insert(
            name.to_string(),
            ProviderEntry {
                name: name.to_string(),
                config,
                client,
                digest,
            },
        );
    }

    pub fn get(&self, name: &str) -> Option<&ProviderEntry> {
        self.entries.get(name)
    }

    pub fn entries(&self) -> impl Iterator<Item = &ProviderEntry> {
        self.entries.values()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}
