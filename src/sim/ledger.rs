//! The simulator's ledger: per idempotency key, how many times the work was
//! executed and what was answered. A repeated key replays the recorded
//! answer without executing again, so executions stay at one.

use crate::providers::Usage;
use serde::Serialize;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

/// What an execution answered, independent of the wire format.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Answer {
    pub id: String,
    pub model: String,
    pub output: String,
    pub usage: Usage,
    /// Tool calls, OpenAI-shaped, when the model called tools.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// Cut at the request's token limit (`max_tokens`): the answer stops
    /// for its length (`length`, `max_tokens`, `MAX_TOKENS`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
}

#[derive(Debug, Clone)]
struct Entry {
    executions: u64,
    /// Fingerprint of the request that executed: the key may not be reused
    /// with another body.
    request_digest: String,
    answer: Answer,
}

/// How a keyed request relates to the ledger.
#[derive(Debug, Clone, PartialEq)]
pub enum Recorded {
    /// Executed now, for the first time.
    Executed(Answer),
    /// Executed before with the same body: here is what was answered.
    Replayed(Answer),
    /// The key was used before with another body.
    KeyReused,
}

#[derive(Debug, Default)]
pub struct Ledger {
    entries: Mutex<HashMap<String, Entry>>,
    /// Keyed requests received, executed or replayed: how often a caller
    /// sent the same work, which `executions` (capped at one) cannot show.
    deliveries: Mutex<HashMap<String, u64>>,
    /// The W3C `traceparent` header of each keyed request that carried one,
    /// in arrival order: a caller's trace can be checked to reach here.
    traceparents: Mutex<HashMap<String, Vec<String>>>,
}

impl Ledger {
    fn entries(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock leaves a consistent map: every
        // mutation is a single insert.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Execute (`execute` builds the answer) unless `key` was executed
    /// before; check and record are one step under the lock.
    pub fn execute_once(
        &self,
        key: &str,
        request_digest: &str,
        execute: impl FnOnce() -> Answer,
    ) -> Recorded {
        let mut entries = self.entries();
        if let Some(entry) = entries.get(key) {
            return if entry.request_digest == request_digest {
                Recorded::Replayed(entry.answer.clone())
            } else {
                Recorded::KeyReused
            };
        }
        let answer = execute();
        entries.insert(
            key.to_string(),
            Entry {
                executions: 1,
                request_digest: request_digest.to_string(),
                answer: answer.clone(),
            },
        );
        Recorded::Executed(answer)
    }

    /// What the ledger holds for `key`, if it was executed: a replay, or a
    /// reuse with another body.
    pub fn recorded(&self, key: &str, request_digest: &str) -> Option<Recorded> {
        self.entries().get(key).map(|entry| {
            if entry.request_digest == request_digest {
                Recorded::Replayed(entry.answer.clone())
            } else {
                Recorded::KeyReused
            }
        })
    }

    /// Count one keyed request as received.
    pub fn note_delivery(&self, key: &str) {
        let mut deliveries = self.deliveries.lock().unwrap_or_else(|e| e.into_inner());
        *deliveries.entry(key.to_string()).or_default() += 1;
    }

    /// Keep the `traceparent` a keyed request arrived with.
    pub fn note_traceparent(&self, key: &str, traceparent: &str) {
        let mut seen = self.traceparents.lock().unwrap_or_else(|e| e.into_inner());
        seen.entry(key.to_string())
            .or_default()
            .push(traceparent.to_string());
    }

    /// The `traceparent` headers requests under `key` carried, oldest first.
    pub fn traceparents(&self, key: &str) -> Vec<String> {
        let seen = self.traceparents.lock().unwrap_or_else(|e| e.into_inner());
        seen.get(key).cloned().unwrap_or_default()
    }

    /// How many requests arrived under `key` (a replay counts too).
    pub fn deliveries(&self, key: &str) -> u64 {
        let deliveries = self.deliveries.lock().unwrap_or_else(|e| e.into_inner());
        deliveries.get(key).copied().unwrap_or(0)
    }

    pub fn executions(&self, key: &str) -> u64 {
        self.entries().get(key).map_or(0, |e| e.executions)
    }

    /// Executions of every key together.
    pub fn total_executions(&self) -> u64 {
        self.entries().values().map(|e| e.executions).sum()
    }

    pub fn answer(&self, key: &str) -> Option<Answer> {
        self.entries().get(key).map(|e| e.answer.clone())
    }
}
