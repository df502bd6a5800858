//! Limits per owner: what the config file and an admin say, merged.
//!
//! `[limits.default]` applies to every owner, `[limits.owners.NAME]` over it
//! for one owner, and limits an admin set at run time over both. A field
//! left out (or `null`) means "as the level below"; unset at every level
//! means unlimited. A key may carry limits of its own, checked besides its
//! owner's. The rules are pure; [`crate::tenants`] enforces them.

use super::OwnerId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The slowest rate a limit may set: one request a day.
pub const MIN_REQUESTS_PER_SECOND: f64 = 1.0 / 86_400.0;

/// The limits of one owner; every field optional. Read from an object
/// (a JSON object, a TOML table) only: serde's derive would also take an
/// array, its items read by position (`[1, 2, 3, 4]` as a rate of 1, a
/// burst of 2…).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Limits {
    /// Sustained requests per second to the doors that make jobs (`POST
    /// /v1/jobs`, `/v1/chat/completions`, `/v1/messages`, `/v1/responses`),
    /// replays included.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requests_per_second: Option<f64>,
    /// Requests allowed at once above the rate [default: the rate, at least 1].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<u32>,
    /// Jobs `pending` or `running` at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_jobs: Option<u32>,
    /// Prompt + completion tokens per UTC day, every attempt counted
    /// (hedges and discarded answers too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_day: Option<u64>,
}

/// [`Limits`]' fields as serde's derive reads them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFields {
    #[serde(default)]
    requests_per_second: Option<f64>,
    #[serde(default)]
    burst: Option<u32>,
    #[serde(default)]
    concurrent_jobs: Option<u32>,
    #[serde(default)]
    tokens_per_day: Option<u64>,
}

impl<'de> Deserialize<'de> for Limits {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> serde::de::Visitor<'de> for Object {
            type Value = Limits;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }

            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<Limits, A::Error> {
                let fields =
                    LimitsFields::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(Limits {
                    requests_per_second: fields.requests_per_second,
                    burst: fields.burst,
                    concurrent_jobs: fields.concurrent_jobs,
                    tokens_per_day: fields.tokens_per_day,
                })
            }
        }
        deserializer.deserialize_map(Object)
    }
}

/// `[limits]` in `onejob.toml`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    #[serde(default)]
    pub default: Limits,
    #[serde(default)]
    pub owners: BTreeMap<OwnerId, Limits>,
}

impl Limits {
    /// These limits, with `base`'s where these leave a field unset.
    pub fn over(self, base: Limits) -> Limits {
        Limits {
            requests_per_second: self.requests_per_second.or(base.requests_per_second),
            burst: self.burst.or(base.burst),
            concurrent_jobs: self.concurrent_jobs.or(base.concurrent_jobs),
            tokens_per_day: self.tokens_per_day.or(base.tokens_per_day),
        }
    }

    pub fn is_unlimited(&self) -> bool {
        self.requests_per_second.is_none()
            && self.concurrent_jobs.is_none()
            && self.tokens_per_day.is_none()
    }

    /// Whether admitting a new job needs the owner's load from the database.
    pub fn needs_load(&self) -> bool {
        self.concurrent_jobs.is_some() || self.tokens_per_day.is_some()
    }

    /// The first rule these break, as `field: why`. A rate below one
    /// request a day is refused: it is a typo, and the wait it implies
    /// overflows what a clock can say.
    pub fn check(&self) -> Result<(), String> {
        if let Some(r) = self.requests_per_second {
            if !(r.is_finite() && (MIN_REQUESTS_PER_SECOND..=1e6).contains(&r)) {
                return Err(
                    "requests_per_second: must be a number from 1/86400 (one a day) to 1000000"
                        .into(),
                );
            }
        }
        if self.burst == Some(0) {
            return Err("burst: must be at least 1".into());
        }
        if self.concurrent_jobs == Some(0) {
            return Err("concurrent_jobs: must be at least 1".into());
        }
        // Counted against a day's usage as a signed 64-bit sum (both
        // databases' BIGINT): a larger budget could never be compared.
        if let Some(t) = self.tokens_per_day {
            if t == 0 || t > i64::MAX as u64 {
                return Err(format!("tokens_per_day: must be in [1, {}]", i64::MAX));
            }
        }
        Ok(())
    }

    /// A burst is the size of the rate's bucket: with no rate over it, it
    /// would limit nothing. `where_no_rate` says where a rate was looked
    /// for, for the refusal.
    pub fn check_burst_has_rate(&self, where_no_rate: &str) -> Result<(), String> {
        match (self.burst, self.requests_per_second) {
            (Some(_), None) => Err(format!(
                "burst: limits nothing without requests_per_second, and none is set {where_no_rate}"
            )),
            _ => Ok(()),
        }
    }

    /// The bucket size: `burst`, or the rate rounded up (at least 1).
    pub fn burst_or_default(&self) -> f64 {
        match (self.burst, self.requests_per_second) {
            (Some(b), _) => f64::from(b),
            (None, Some(r)) => r.ceil().max(1.0),
            (None, None) => 1.0,
        }
    }
}

impl LimitsConfig {
    /// Every level's rules hold, and every burst has a rate over it: an
    /// owner's in its own table or the default's; the default's in the
    /// default's or some owner's (whose bucket it then sizes).
    pub fn check(&self) -> Result<(), String> {
        self.default
            .check()
            .map_err(|e| format!("limits.default.{e}"))?;
        let some_owner_has_a_rate = self
            .owners
            .values()
            .any(|l| l.requests_per_second.is_some());
        if !some_owner_has_a_rate {
            self.default
                .check_burst_has_rate("in limits.default or any limits.owners table")
                .map_err(|e| format!("limits.default.{e}"))?;
        }
        for (owner, limits) in &self.owners {
            limits
                .check()
                .and_then(|()| {
                    if limits.burst.is_some() {
                        limits
                            .over(self.default)
                            .check_burst_has_rate("here or in limits.default")
                    } else {
                        Ok(())
                    }
                })
                .map_err(|e| format!("limits.owners.{owner}.{e}"))?;
        }
        Ok(())
    }

    /// Limits an admin sets for `owner` at run time, over this file's: their
    /// own rules, and a burst they set needs a rate at some level.
    pub fn check_override(&self, owner: &OwnerId, limits: &Limits) -> Result<(), String> {
        limits.check()?;
        if limits.burst.is_some() {
            limits
                .over(self.for_owner(owner))
                .check_burst_has_rate(&format!(
                    "for {owner} here or in the config file's [limits]"
                ))?;
        }
        Ok(())
    }

    /// The config file's limits for `owner` (without run-time changes).
    pub fn for_owner(&self, owner: &OwnerId) -> Limits {
        match self.owners.get(owner) {
            Some(own) => own.over(self.default),
            None => self.default,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_read_from_an_object_only() {
        let read = |text: &str| serde_json::from_str::<Limits>(text).map_err(|e| e.to_string());
        assert_eq!(
            read(r#"{"burst": 2, "tokens_per_day": null}"#),
            Ok(Limits {
                burst: Some(2),
                ..Limits::default()
            })
        );
        assert_eq!(read("{}"), Ok(Limits::default()));
        for bad in ["[1, 2, 3, 4]", "[]", "3", r#"{"brust": 2}"#] {
            assert!(read(bad).is_err(), "{bad}");
        }
        assert!(read("[]").unwrap_err().contains("expected an object"));
    }

    #[test]
    fn owner_over_default_field_by_field() {
        let config: LimitsConfig = toml::from_str(
            "[default]\nrequests_per_second = 10\ntokens_per_day = 1000\n\
             [owners.big]\ntokens_per_day = 5000\n",
        )
        .unwrap();
        let big = config.for_owner(&"big".into());
        assert_eq!(big.requests_per_second, Some(10.0));
        assert_eq!(big.tokens_per_day, Some(5000));
        assert_eq!(config.for_owner(&"small".into()).tokens_per_day, Some(1000));
        assert!(config.check().is_ok());
    }

    #[test]
    fn bad_limits_are_named() {
        let config: LimitsConfig = toml::from_str("[owners.x]\nrequests_per_second = 0\n").unwrap();
        let err = config.check().unwrap_err();
        assert!(
            err.starts_with("limits.owners.x.requests_per_second"),
            "{err}"
        );
        assert!(toml::from_str::<LimitsConfig>("[default]\nrps = 1\n").is_err());
        // Slower than one a day: a typo whose wait no clock can say.
        let config: LimitsConfig =
            toml::from_str("[default]\nrequests_per_second = 1e-300\n").unwrap();
        let err = config.check().unwrap_err();
        assert!(
            err.starts_with("limits.default.requests_per_second"),
            "{err}"
        );
        let one_a_day = Limits {
            requests_per_second: Some(MIN_REQUESTS_PER_SECOND),
            ..Limits::default()
        };
        assert!(one_a_day.check().is_ok());
    }

    #[test]
    fn a_burst_needs_a_rate_at_some_level() {
        let refused = |text: &str| toml::from_str::<LimitsConfig>(text).unwrap().check();
        let err = refused("[owners.x]\nburst = 5\n").unwrap_err();
        assert!(
            err.starts_with("limits.owners.x.burst: limits nothing"),
            "{err}"
        );
        let err = refused("[default]\nburst = 5\n").unwrap_err();
        assert!(err.starts_with("limits.default.burst"), "{err}");
        // A rate below or beside it sizes it.
        assert!(refused("[default]\nrequests_per_second = 2\n[owners.x]\nburst = 5\n").is_ok());
        assert!(refused("[default]\nburst = 5\n[owners.x]\nrequests_per_second = 2\n").is_ok());

        let config: LimitsConfig =
            toml::from_str("[owners.paid]\nrequests_per_second = 2\n").unwrap();
        let burst = Limits {
            burst: Some(5),
            ..Limits::default()
        };
        let err = config.check_override(&"free".into(), &burst).unwrap_err();
        assert!(err.contains("none is set for free"), "{err}");
        assert!(config.check_override(&"paid".into(), &burst).is_ok());
        let with_rate = Limits {
            requests_per_second: Some(1.0),
            ..burst
        };
        assert!(config.check_override(&"free".into(), &with_rate).is_ok());
    }
}
