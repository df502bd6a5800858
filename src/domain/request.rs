//! The job request body: parsing, validation and normalisation.
//!
//! A request names a contract and passes its variables, or carries chat
//! messages directly. The normalised form (defaults filled in) is what is
//! stored and fingerprinted, so `{"route":"default"}` and an omitted route are
//! the same intent.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Largest `max_tokens` a request may ask for.
pub const MAX_TOKENS_LIMIT: u32 = 1_000_000;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub contract: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<Map<String, Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub messages: Option<Vec<Message>>,
    #[serde(default)]
    pub params: Params,
    #[serde(default = "default_route")]
    pub route: String,
    /// What a front door keeps of its request beyond the job's own fields
    /// (a Response's instructions, metadata, input items as given), under
    /// the door's name: stored and fingerprinted with the request, never
    /// read by the engine or sent to a provider.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub door: Option<Map<String, Value>>,
}

/// One chat turn. Beyond role and text, a turn may carry what the OpenAI
/// chat format has (each omitted when absent, so older requests and their
/// fingerprints are unchanged): the assistant's tool calls, the id of the
/// call a `tool` turn answers, and content parts other than text (images),
/// kept as given, with `content` holding the text parts joined.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Message {
    pub role: Role,
    pub content: String,
    /// OpenAI-shaped `{"id","type":"function","function":{"name","arguments"}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// The content parts as given, when any is not text (e.g. `image_url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parts: Option<Vec<Value>>,
    /// The participant's name (OpenAI's message `name`), passed to
    /// OpenAI-wire providers; the other wire formats have no such field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// A `tool` turn that reports the tool's failure (Anthropic's
    /// `tool_result` `is_error`), passed to Anthropic-wire providers; the
    /// other wire formats have no such field and get the text alone.
    /// `Some(true)` or absent, so a result that is no error fingerprints as
    /// it always has.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
}

impl Message {
    /// A plain text turn.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        Message {
            role,
            content: content.into(),
            tool_calls: None,
            tool_call_id: None,
            parts: None,
            name: None,
            is_error: None,
        }
    }

    /// Whether the turn carries an image part.
    pub fn has_images(&self) -> bool {
        self.parts
            .as_ref()
            .is_some_and(|parts| parts.iter().any(|p| p["type"] == "image_url"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// The result of a tool call, answering the assistant's `tool_calls`.
    Tool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Params {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    /// Up to 4 sequences where the provider stops.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<i64>,
    /// The end user, passed to providers that take it (abuse monitoring).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f64>,
    /// Tools offered, in OpenAI's shape `{"type":"function","function":{"name",…}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<Value>>,
    /// `"none"`, `"auto"`, `"required"` or `{"type":"function","function":{"name"}}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// `{"type":"text"}`, `{"type":"json_object"}` or
    /// `{"type":"json_schema","json_schema":{"name","schema",…}}`: an answer
    /// that breaks it is a `contract_violation`, never the result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// `false` asks for at most one tool call per turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parallel_tool_calls: Option<bool>,
    /// Chat Completions fields only OpenAI's wire format has
    /// ([`OPENAI_PASS_THROUGH`]), passed to OpenAI-wire providers as given.
    /// A provider on another wire skips the job when one of them changes
    /// the answer ([`OPENAI_ANSWER_CHANGING`]) and ignores the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openai: Option<Map<String, Value>>,
}

/// The Chat Completions fields carried in [`Params::openai`].
pub const OPENAI_PASS_THROUGH: &[&str] = &[
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
    "reasoning_effort",
    "verbosity",
];

/// Those of [`OPENAI_PASS_THROUGH`] that change the answer, so that a
/// provider that cannot take them must not run the job.
pub const OPENAI_ANSWER_CHANGING: &[&str] = &["reasoning_effort", "verbosity"];

fn default_route() -> String {
    "default".to_string()
}

/// A request that cannot become a job. `Malformed` is not JSON at all (400);
/// `Invalid` is JSON that breaks the request's rules (422). Both name the
/// field at fault where there is one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("body is not valid JSON: {0}")]
    Malformed(String),
    #[error("{0}")]
    Invalid(String),
}

impl JobRequest {
    /// Parse and validate a request body.
    ///
    /// A well-formed body is read in one pass, from its bytes straight into
    /// the request. Anything that pass does not take (not an object, not
    /// JSON, a field of the wrong type, a key given twice) is read again
    /// through a [`Value`], which words every error with the field's path
    /// and keeps the last of a repeated key, as `serde_json` does: the one
    /// pass accepts nothing the other would refuse or read differently.
    pub fn parse(body: &[u8]) -> Result<Self, RequestError> {
        if let Some(request) = Self::parse_in_one_pass(body) {
            request.validate()?;
            return Ok(request);
        }
        let value: Value =
            serde_json::from_slice(body).map_err(|e| RequestError::Malformed(e.to_string()))?;
        Self::from_value(value)
    }

    /// The request, when the body is an object that deserialises as it
    /// stands; `None` sends it the way that explains why not.
    fn parse_in_one_pass(body: &[u8]) -> Option<Self> {
        if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
            return None;
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let request = JobRequest::deserialize(&mut de).ok()?;
        de.end().ok()?;
        Some(request)
    }

    /// The request a JSON tree holds, validated; a field of the wrong type
    /// is named by its path.
    pub fn from_value(value: Value) -> Result<Self, RequestError> {
        if let Ok(request) = JobRequest::deserialize(&value) {
            request.validate()?;
            return Ok(request);
        }
        if !value.is_object() {
            return Err(RequestError::Invalid("body must be a JSON object".into()));
        }
        let request: JobRequest = serde_path_to_error::deserialize(value).map_err(|e| {
            // `door` is written by onejob's other doors, never by a client
            // of this one: it is not a field to suggest.
            RequestError::Invalid(super::json_error::path_error(e).replace(", `door`", ""))
        })?;
        request.validate()?;
        Ok(request)
    }

    /// The request's rules beyond its shape, which [`JobRequest::parse`]
    /// checks too; a door that builds a request itself checks them here.
    pub fn validate(&self) -> Result<(), RequestError> {
        let invalid = |m: &str| Err(RequestError::Invalid(m.to_string()));
        match (&self.contract, &self.messages) {
            (Some(_), Some(_)) => {
                return invalid("give either contract (with input) or messages, not both")
            }
            (None, None) => return invalid("contract or messages is required"),
            (Some(name), None) => {
                if name.trim().is_empty() {
                    return invalid("contract: must not be empty");
                }
                if self.input.is_none() {
                    return invalid(
                        "input: required with contract (an object of template variables)",
                    );
                }
            }
            (None, Some(messages)) => {
                if self.input.is_some() {
                    return invalid("input: only allowed with contract");
                }
                if messages.is_empty() {
                    return invalid("messages: must hold at least one message");
                }
                if !messages.iter().any(|m| m.role == Role::User) {
                    return invalid("messages: at least one message must have role user");
                }
                if let Some(i) = messages
                    .iter()
                    .position(|m| m.is_error.is_some() && m.role != Role::Tool)
                {
                    return Err(RequestError::Invalid(format!(
                        "messages[{i}].is_error: only a tool turn reports a tool's failure"
                    )));
                }
            }
        }
        if let Some(t) = self.params.temperature {
            if !(0.0..=2.0).contains(&t) {
                return invalid("params.temperature: must be between 0 and 2");
            }
        }
        if let Some(p) = self.params.top_p {
            if !(0.0..=1.0).contains(&p) {
                return invalid("params.top_p: must be between 0 and 1");
            }
        }
        if let Some(m) = self.params.max_tokens {
            if m == 0 || m > MAX_TOKENS_LIMIT {
                return invalid("params.max_tokens: must be between 1 and 1000000");
            }
        }
        if self.route.trim().is_empty() {
            return invalid("route: must not be empty");
        }
        self.params
            .validate_openai_fields(self.contract.is_some())?;
        Ok(())
    }

    /// The normalised request as JSON, the form that is stored and fingerprinted.
    pub fn to_value(&self) -> Value {
        // Serialising plain data structs into a Value cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrong_type_names_the_field() {
        let err = JobRequest::parse(
            br#"{"messages":[{"role":"user","content":"hi"}],"params":{"temperature":"hot"}}"#,
        )
        .unwrap_err();
        assert!(
            matches!(&err, RequestError::Invalid(m) if m.starts_with("params.temperature")),
            "{err}"
        );
    }

    #[test]
    fn unknown_field_is_invalid() {
        let err = JobRequest::parse(br#"{"messages":[{"role":"user","content":"hi"}],"extra":1}"#)
            .unwrap_err();
        assert!(
            matches!(&err, RequestError::Invalid(m) if m.contains("extra")),
            "{err}"
        );
    }

    #[test]
    fn omitted_route_equals_default_route() {
        let a = JobRequest::parse(br#"{"messages":[{"role":"user","content":"hi"}]}"#).unwrap();
        let b = JobRequest::parse(
            br#"{"route":"default","messages":[{"content":"hi","role":"user"}]}"#,
        )
        .unwrap();
        assert_eq!(a.to_value(), b.to_value());
    }

    /// The one pass and the way through a `Value` read every body alike,
    /// and a body the one pass refuses gets the same answer as before.
    #[test]
    fn one_pass_reads_what_the_value_reads() {
        let through_value = |body: &[u8]| {
            serde_json::from_slice::<Value>(body)
                .map_err(|e| RequestError::Malformed(e.to_string()))
                .and_then(JobRequest::from_value)
        };
        let bodies: [&[u8]; 12] = [
            br#"{"messages":[{"role":"user","content":"hi"}],"params":{"temperature":0,"max_tokens":64},"route":"default"}"#,
            br#" {"contract":"summary","input":{"text":"a","text":"b"}} "#,
            br#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":"u","name":"n"}],"params":{"stop":["x"],"seed":7,"openai":{"logit_bias":{"1":2}}}}"#,
            br#"{"messages":[{"role":"user","content":"first"}],"messages":[{"role":"user","content":"second"}]}"#,
            br#"{"messages":[{"role":"user","content":"hi"}],"params":{"temperature":"hot"}}"#,
            br#"{"messages":[{"role":"user","content":"hi"}],"extra":1}"#,
            br#"{"messages":[{"role":"user","content":"hi"}]} trailing"#,
            br#"[{"role":"user","content":"hi"}]"#,
            br#""a string""#,
            b"{\"messages\":",
            br#"{"messages":[]}"#,
            br#"{"messages":[{"role":"user","content":"hi"}],"params":{"max_tokens":64.5}}"#,
        ];
        for body in bodies {
            assert_eq!(
                JobRequest::parse(body),
                through_value(body),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
        // A key given twice: the one pass refuses it, and the last one
        // counts, as it always has.
        let twice = JobRequest::parse(bodies[3]).unwrap();
        assert_eq!(twice.messages.unwrap()[0].content, "second");
        assert!(JobRequest::parse_in_one_pass(bodies[3]).is_none());
        assert!(JobRequest::parse_in_one_pass(bodies[0]).is_some());
    }

    #[test]
    fn malformed_json_is_not_invalid() {
        assert!(matches!(
            JobRequest::parse(b"{\"messages\":"),
            Err(RequestError::Malformed(_))
        ));
    }
}

impl Params {
    /// The OpenAI-style fields: within their ranges, tools well formed, a
    /// named tool choice among the tools, a response format onejob checks.
    fn validate_openai_fields(&self, has_contract: bool) -> Result<(), RequestError> {
        let invalid = |m: String| Err(RequestError::Invalid(m));
        for (name, value) in [
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ] {
            if value.is_some_and(|v| !(-2.0..=2.0).contains(&v)) {
                return invalid(format!("params.{name}: must be between -2 and 2"));
            }
        }
        if let Some(stop) = &self.stop {
            if stop.len() > 4 || stop.iter().any(String::is_empty) {
                return invalid("params.stop: at most 4 non-empty sequences".into());
            }
        }
        let mut tool_names = Vec::new();
        for (i, tool) in self.tools.iter().flatten().enumerate() {
            let name = tool.pointer("/function/name").and_then(Value::as_str);
            match (tool["type"].as_str(), name) {
                (Some("function"), Some(name)) if !name.is_empty() => tool_names.push(name),
                _ => {
                    return invalid(format!(
                        "params.tools[{i}]: must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ))
                }
            }
        }
        if let Some(choice) = &self.tool_choice {
            match choice {
                Value::String(s) if matches!(s.as_str(), "none" | "auto" | "required") => {}
                Value::Object(_) => {
                    let named = choice.pointer("/function/name").and_then(Value::as_str);
                    if !named.is_some_and(|n| tool_names.contains(&n)) {
                        return invalid(
                            "params.tool_choice: must name a function among the tools".into(),
                        );
                    }
                }
                _ => {
                    return invalid(
                        "params.tool_choice: \"none\", \"auto\", \"required\" or a named function"
                            .into(),
                    )
                }
            }
            if self.tools.is_none() {
                return invalid("params.tool_choice: given without tools".into());
            }
        }
        if let Some(fields) = &self.openai {
            if let Some(key) = fields
                .keys()
                .find(|k| !OPENAI_PASS_THROUGH.contains(&k.as_str()))
            {
                return invalid(format!(
                    "params.openai.{key}: not a Chat Completions field onejob passes on ({})",
                    OPENAI_PASS_THROUGH.join(", ")
                ));
            }
            if fields.get("metadata").is_some_and(|m| !m.is_object()) {
                return invalid("params.openai.metadata: an object is required".into());
            }
        }
        if let Some(format) = &self.response_format {
            if has_contract {
                return invalid(
                    "params.response_format: a contract job's output is defined by its contract"
                        .into(),
                );
            }
            match format["type"].as_str() {
                Some("text" | "json_object") => {}
                Some("json_schema") => {
                    if !format
                        .pointer("/json_schema/schema")
                        .is_some_and(Value::is_object)
                    {
                        return invalid(
                            "params.response_format.json_schema.schema: a JSON Schema object is required"
                                .into(),
                        );
                    }
                    if let Some(schema) = format.pointer("/json_schema/schema") {
                        if let Err(e) = jsonschema::validator_for(schema) {
                            return invalid(format!(
                                "params.response_format.json_schema.schema: not a valid JSON Schema: {e}"
                            ));
                        }
                    }
                }
                _ => {
                    return invalid(
                        "params.response_format.type: \"text\", \"json_object\" or \"json_schema\""
                            .into(),
                    )
                }
            }
        }
        Ok(())
    }
}

/// A validated `Idempotency-Key`: 1–255 printable ASCII characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub const MAX_LEN: usize = 255;

    pub fn parse(raw: &[u8]) -> Result<Self, String> {
        if raw.is_empty() {
            return Err("Idempotency-Key must not be empty".to_string());
        }
        if raw.len() > Self::MAX_LEN {
            return Err(format!(
                "Idempotency-Key is {} bytes; at most {} are allowed",
                raw.len(),
                Self::MAX_LEN
            ));
        }
        if let Some(pos) = raw.iter().position(|b| !(0x20..=0x7e).contains(b)) {
            return Err(format!(
                "Idempotency-Key must be printable ASCII; byte {pos} is not"
            ));
        }
        // Every byte is printable ASCII, so this is valid UTF-8.
        Ok(IdempotencyKey(String::from_utf8_lossy(raw).into_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod key_tests {
    use super::IdempotencyKey;

    #[test]
    fn keys_are_bounded_printable_ascii() {
        assert!(IdempotencyKey::parse(b"order-42:confirm").is_ok());
        assert!(IdempotencyKey::parse(b"").is_err());
        assert!(IdempotencyKey::parse(&[b'k'; 256]).is_err());
        assert!(IdempotencyKey::parse(&[b'k'; 255]).is_ok());
        assert!(IdempotencyKey::parse("clé".as_bytes()).is_err());
        assert!(IdempotencyKey::parse(b"a\tb").is_err());
    }
}
