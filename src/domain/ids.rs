//! The ids of the three concepts most often passed side by side: a job
//! ([`JobId`]), one of its attempts ([`AttemptId`]) and the owner (tenant)
//! it belongs to ([`OwnerId`]).
//!
//! Each is a `String` underneath and on every wire: the same text in JSON
//! (`serde(transparent)`), in a TEXT column and in a log line. What they
//! add is that they are three types, so the compiler now refuses what a
//! `String` let through silently:
//!
//! - an attempt's id (or an owner's) where a job's is wanted:
//!   `store.get_job(&attempt.id)`, `store.list_events(&job.owner_id)`;
//! - a job's id where an attempt's is wanted: `resolve_attempt(&job.id, …)`,
//!   `FinishAttempt { attempt_id: job.id.clone(), … }`;
//! - swapped arguments or fields: `NewEvent { job_id: attempt.id, attempt_id:
//!   Some(job.id), … }`, `find_job_by_key(&key, &owner)`;
//! - comparing two different kinds of id: `attempt.id == job.id`.
//!
//! Text from outside (a path segment, a CLI argument, a column) becomes an
//! id by `From` where it comes in; the id lends its text back as
//! [`as_str`](JobId::as_str) and by `Deref<Target = str>`, so the store's
//! SQL, which binds text, takes `&job.id` unchanged. `{}` and `{:?}` print
//! it as they printed the `String`; `Borrow<str>` lets a map keyed by id be
//! looked up with a `&str`. An id compares equal to its text (`job.id ==
//! "…"`), never to another kind of id.
//!
//! What only looks like one of these stays a `String`: a job's
//! `completed_by` is the winning attempt's id or `resolution:<actor>` for an
//! admin's answer, and a lease's `owner` is an engine instance, not a
//! tenant.

use serde::{Deserialize, Serialize};
use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The id's text.
            pub fn as_str(&self) -> &str {
                &self.0
            }

            /// The id's text, owned.
            pub fn into_string(self) -> String {
                self.0
            }
        }

        /// As its text is: `"…"`, so a `{:?}` of a row or a message reads as
        /// it did when the id was a `String`.
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Display::fmt(&self.0, f)
            }
        }

        impl From<String> for $name {
            fn from(id: String) -> Self {
                $name(id)
            }
        }

        impl From<&str> for $name {
            fn from(id: &str) -> Self {
                $name(id.to_string())
            }
        }

        impl From<&String> for $name {
            fn from(id: &String) -> Self {
                $name(id.clone())
            }
        }

        impl From<$name> for String {
            fn from(id: $name) -> String {
                id.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }
    };
}

id_type! {
    /// A job's id: `jobs.id`, and `job_id` wherever a row or a message
    /// names its job.
    JobId
}

id_type! {
    /// An attempt's id: `attempts.id`, and `attempt_id` wherever an event,
    /// a delivery or a finish names its attempt.
    AttemptId
}

id_type! {
    /// An owner's (a tenant's) id: `owner_id` of a job, a key, a limit, a
    /// usage row and a webhook endpoint.
    OwnerId
}

impl OwnerId {
    /// What an owner's name may be, wherever one is made: a key's owner, an
    /// owner's limits, a webhook endpoint's owner (the API and the CLI alike).
    pub const NAME_RULE: &'static str = "1-128 characters of letters, digits, '-', '_', '.' or '@'";

    /// `name` as an owner's id if it keeps [`OwnerId::NAME_RULE`]; also
    /// for a filter (`--owner`, `?owner=`), where a name no owner can have
    /// is a mistake to say, not a list that is empty.
    pub fn parse_name(name: &str) -> Result<OwnerId, String> {
        match Self::is_valid_name(name) {
            true => Ok(OwnerId::from(name)),
            false => Err(format!("must be {}", Self::NAME_RULE)),
        }
    }

    /// Whether `name` keeps [`OwnerId::NAME_RULE`].
    pub fn is_valid_name(name: &str) -> bool {
        (1..=128).contains(&name.len())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '@'))
    }
}

impl JobId {
    /// A fresh id for a new job ([`super::new_id`]).
    #[allow(clippy::new_without_default)] // a fresh id is no default
    pub fn new() -> Self {
        JobId(super::new_id())
    }
}

impl AttemptId {
    /// A fresh id for a new attempt ([`super::new_id`]).
    #[allow(clippy::new_without_default)] // a fresh id is no default
    pub fn new() -> Self {
        AttemptId(super::new_id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn an_id_is_its_text_on_the_wire_and_in_a_log() {
        let id = JobId::from("0190-job");
        assert_eq!(serde_json::to_string(&id).unwrap(), r#""0190-job""#);
        assert_eq!(serde_json::from_str::<JobId>(r#""0190-job""#).unwrap(), id);
        assert_eq!(
            format!("{id}|{id:>10}|{id:?}"),
            r#"0190-job|  0190-job|"0190-job""#
        );
        assert_eq!(id.as_str(), "0190-job");
        assert_eq!(&*id, "0190-job");
    }

    #[test]
    fn a_map_keyed_by_id_is_looked_up_by_text() {
        let mut map = HashMap::new();
        map.insert(AttemptId::from("a1"), 1);
        assert_eq!(map.get("a1"), Some(&1));
    }

    #[test]
    fn fresh_ids_differ() {
        assert_ne!(JobId::new(), JobId::new());
        assert_ne!(AttemptId::new(), AttemptId::new());
    }
}
