//! Provider configuration: one TOML file per provider in `providers/`, the
//! provider's name being the file stem.
//!
//! Keys are never written in these files: `api_key_env` names the environment
//! variable that holds one, and the key lives in a [`Secret`] whose `Debug`
//! prints `***`. Every error names the file and the field at fault.

use crate::domain::fingerprint::fingerprint;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Default `anthropic-version` header.
pub const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

/// The `max_tokens` an Anthropic request carries when the job sets no limit
/// (the Messages API requires one): 4,096, the largest output every Claude
/// model takes. `default_max_tokens` in the provider file changes it.
pub const DEFAULT_ANTHROPIC_MAX_TOKENS: u32 = 4096;

/// Google AI Studio's endpoint, the default `base_url` of a gemini provider
/// without `vertex_project`.
pub const GEMINI_AI_STUDIO_URL: &str = "https://generativelanguage.googleapis.com";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    Openai,
    Anthropic,
    Sim,
    /// Google's Gemini API: AI Studio by API key, or Vertex AI by OAuth.
    Gemini,
    /// Azure OpenAI: OpenAI's wire at a deployment's URL.
    #[serde(rename = "azure_openai")]
    AzureOpenai,
    /// AWS Bedrock's Converse API, signed with SigV4.
    Bedrock,
}

/// The request field OpenAI's wire carries a job's token limit in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// OpenAI's current field, the only one its reasoning models (o1, o3,
    /// o4-mini, gpt-5) take.
    MaxCompletionTokens,
    /// The deprecated field, for OpenAI-compatible servers that know no other.
    MaxTokens,
}

impl MaxTokensField {
    /// A kind's field when its file names none: the simulator's is
    /// `max_tokens`, OpenAI's and Azure's the current one.
    pub fn default_for(kind: ProviderKind) -> MaxTokensField {
        match kind {
            ProviderKind::Sim => MaxTokensField::MaxTokens,
            _ => MaxTokensField::MaxCompletionTokens,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
            MaxTokensField::MaxTokens => "max_tokens",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tokenizer {
    #[serde(rename = "o200k_base")]
    O200kBase,
    #[serde(rename = "cl100k_base")]
    Cl100kBase,
}

impl Tokenizer {
    /// The tiktoken name, as written in the provider file.
    pub fn name(self) -> &'static str {
        match self {
            Tokenizer::O200kBase => "o200k_base",
            Tokenizer::Cl100kBase => "cl100k_base",
        }
    }
}

/// How an unknown attempt can be reconciled with this provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LookupMode {
    #[default]
    None,
    /// OpenAI stored completions listed by `metadata[onejob_key]`.
    OpenaiStored,
    /// The simulator's ledger (`GET /sim/ledger?key=K`).
    SimLedger,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// TCP (and TLS) connect; a connect that times out provably never sent.
    #[serde(default = "defaults::connect_ms")]
    pub connect_ms: u64,
    /// From sending until the response headers arrive.
    #[serde(default = "defaults::first_byte_ms")]
    pub first_byte_ms: u64,
    /// The whole exchange, body included.
    #[serde(default = "defaults::total_ms")]
    pub total_ms: u64,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect_ms: defaults::connect_ms(),
            first_byte_ms: defaults::first_byte_ms(),
            total_ms: defaults::total_ms(),
        }
    }
}

impl Timeouts {
    pub fn connect(&self) -> Duration {
        Duration::from_millis(self.connect_ms)
    }
    pub fn first_byte(&self) -> Duration {
        Duration::from_millis(self.first_byte_ms)
    }
    pub fn total(&self) -> Duration {
        Duration::from_millis(self.total_ms)
    }
}

mod defaults {
    pub fn connect_ms() -> u64 {
        2_000
    }
    pub fn first_byte_ms() -> u64 {
        30_000
    }
    pub fn total_ms() -> u64 {
        60_000
    }
}

/// One provider, as written in `providers/NAME.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    pub kind: ProviderKind,
    /// Required, except for gemini, where it defaults to Google's endpoint
    /// (AI Studio's, or the Vertex location's).
    #[serde(default)]
    pub base_url: String,
    pub model: String,
    /// Name of the environment variable holding the API key (never the key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_key_env: Option<String>,
    pub tokenizer: Tokenizer,
    pub context_window: u32,
    #[serde(default)]
    pub timeouts: Timeouts,
    #[serde(default)]
    pub honours_idempotency_key: bool,
    /// Whether image content parts may be sent (default: true for the
    /// simulator, false otherwise); a job with images skips providers
    /// that do not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepts_images: Option<bool>,
    #[serde(default)]
    pub lookup: LookupMode,
    /// OpenAI-style only: send `store: true` and `metadata.onejob_key`.
    #[serde(default)]
    pub store: bool,
    /// OpenAI's wire: ask a stream for its usage with
    /// `stream_options.include_usage` (default true). False for a server
    /// that refuses the field; a stream then reports the usage it sends
    /// unasked, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_usage: Option<bool>,
    /// OpenAI's wire: request fields this server refuses (a 400 or 422 for
    /// an unknown field), among [`REFUSABLE`]. One that does not change the
    /// answer is left out of the request; a job that sets one that does is
    /// never sent here (another provider on the route takes it).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub refuses: Vec<String>,
    /// OpenAI's wire: the field a job's token limit goes in (sent only when
    /// the job sets one). Unset: `max_completion_tokens` for `openai` and
    /// `azure_openai`, `max_tokens` for `sim`; `max_tokens` for an
    /// OpenAI-compatible server that refuses the newer field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens_field: Option<MaxTokensField>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anthropic_version: Option<String>,
    /// Anthropic's wire requires `max_tokens`: what a job that sets no
    /// limit is sent with (unset: [`DEFAULT_ANTHROPIC_MAX_TOKENS`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_max_tokens: Option<u32>,
    /// Whether the provider continues a trailing assistant turn (prefill), so
    /// a stream cut mid-answer may be finished here. Unset: true for the
    /// Anthropic wire format and the simulator, false for OpenAI's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supports_prefill: Option<bool>,
    /// Gemini on Vertex AI: the Google Cloud project, its location (region),
    /// and the NAME of the variable holding the service-account JSON file's
    /// path. Without `vertex_project` a gemini provider is AI Studio's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertex_project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vertex_location: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_env: Option<String>,
    /// Azure OpenAI: the deployment name in the URL, the `api-version`
    /// query parameter, and how the key is sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deployment: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub azure_auth: Option<AzureAuth>,
    /// AWS Bedrock: the region (`us-east-1`), and the NAMES of the variables
    /// holding the access key id, the secret access key and the session
    /// token (default `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`,
    /// `AWS_SESSION_TOKEN`; the token only when set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_key_id_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_access_key_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_token_env: Option<String>,
    /// The file this came from; not part of the configuration itself.
    #[serde(skip)]
    pub source: PathBuf,
}

/// The Chat Completions fields a provider file may say its server refuses
/// (`refuses`), and whether leaving one out would change the answer.
pub const REFUSABLE: &[(&str, bool)] = &[
    ("user", false),
    ("name", false),
    ("metadata", false),
    ("store", false),
    ("service_tier", false),
    ("prompt_cache_key", false),
    ("safety_identifier", false),
    ("seed", true),
    ("presence_penalty", true),
    ("frequency_penalty", true),
    ("stop", true),
    ("parallel_tool_calls", true),
    ("reasoning_effort", true),
    ("verbosity", true),
];

/// How an Azure OpenAI provider sends the secret from `api_key_env`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AzureAuth {
    /// The resource key, as the `api-key` header.
    #[default]
    ApiKey,
    /// A Microsoft Entra ID token, as `Authorization: Bearer`.
    Bearer,
}

/// An API key. It can be used, never shown: `Debug` prints `***` and there is
/// no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ProviderConfigError {
    #[error("cannot read provider directory {}: {source}", dir.display())]
    ReadDir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: line {line}: {message}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: {}{field}: {message}", path.display(), line.map(|l| format!("line {l}: ")).unwrap_or_default())]
    Invalid {
        path: PathBuf,
        /// The line that sets `field`, when the file sets it.
        line: Option<usize>,
        field: &'static str,
        message: String,
    },
    #[error("{}: api_key_env: environment variable {var} is not set (or not unicode)", path.display())]
    MissingApiKey { path: PathBuf, var: String },
    #[error("{}: base_url {base_url}: unreachable within {connect_ms} ms: {message}", path.display())]
    Unreachable {
        path: PathBuf,
        base_url: String,
        connect_ms: u64,
        message: String,
    },
    /// The service-account file named by `credentials_env` is missing or
    /// unreadable. The message never quotes the file's content.
    #[error("{}: credentials_env: {var}: {message}", path.display())]
    Credentials {
        path: PathBuf,
        var: String,
        message: String,
    },
    /// An AWS credential's variable is not set; names the variable only.
    #[error("{}: {field}: environment variable {var} is not set (or not unicode)", path.display())]
    MissingCredential {
        path: PathBuf,
        field: &'static str,
        var: String,
    },
    #[error("{}: cannot build HTTP client: {message}", path.display())]
    Client { path: PathBuf, message: String },
}

/// Load every `*.toml` in `dir`, keyed by file stem.
pub fn load_dir(dir: &Path) -> Result<BTreeMap<String, ProviderConfig>, ProviderConfigError> {
    let read_dir = |source| ProviderConfigError::ReadDir {
        dir: dir.to_path_buf(),
        source,
    };
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(read_dir)? {
        let path = entry.map_err(read_dir)?.path();
        if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
            paths.push(path);
        }
    }
    let mut out = BTreeMap::new();
    for path in paths {
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        out.insert(name.to_string(), ProviderConfig::load(&path)?);
    }
    Ok(out)
}

impl ProviderConfig {
    /// Whether image content parts may be sent to this provider.
    pub fn takes_images(&self) -> bool {
        self.accepts_images
            .unwrap_or(self.kind == ProviderKind::Sim)
    }

    pub fn load(path: &Path) -> Result<Self, ProviderConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ProviderConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, path)
    }

    /// Parse the text of `path` (named in errors) and check its rules.
    pub fn parse(text: &str, path: &Path) -> Result<Self, ProviderConfigError> {
        let mut config: ProviderConfig = toml::from_str(text).map_err(|e| {
            let start = e.span().map_or(0, |span| span.start.min(text.len()));
            let start = (0..=start)
                .rev()
                .find(|i| text.is_char_boundary(*i))
                .unwrap_or(0);
            let line = text[..start].matches('\n').count() + 1;
            // The field is named from the offending line's key, even when
            // toml's message (e.g. "invalid type: string, expected u32")
            // does not name it. Never the line itself, nor a quoted value:
            // a secret pasted into the file would be printed back.
            let source_line = text.lines().nth(line - 1).unwrap_or("");
            let message = redact_values(e.message().trim());
            ProviderConfigError::Parse {
                path: path.to_path_buf(),
                line,
                message: match field_of_line(source_line) {
                    Some(field) => format!("field `{field}`: {message}"),
                    None => message,
                },
            }
        })?;
        config.source = path.to_path_buf();
        if config.base_url.is_empty() {
            if let Some(url) = config.default_base_url() {
                config.base_url = url;
            }
        }
        config.validate().map_err(|e| match e {
            ProviderConfigError::Invalid {
                path,
                line: None,
                field,
                message,
            } => ProviderConfigError::Invalid {
                line: text
                    .lines()
                    .position(|l| field_of_line(l) == Some(field))
                    .map(|i| i + 1),
                path,
                field,
                message,
            },
            other => other,
        })?;
        Ok(config)
    }

    fn invalid(&self, field: &'static str, message: impl Into<String>) -> ProviderConfigError {
        ProviderConfigError::Invalid {
            path: self.source.clone(),
            line: None,
            field,
            message: message.into(),
        }
    }

    /// Google's endpoint for a gemini provider that names none; the
    /// region's Bedrock runtime endpoint for a bedrock one.
    fn default_base_url(&self) -> Option<String> {
        if self.kind == ProviderKind::Bedrock {
            return self
                .region
                .as_deref()
                .filter(|r| is_aws_region(r))
                .map(|r| format!("https://bedrock-runtime.{r}.amazonaws.com"));
        }
        if self.kind != ProviderKind::Gemini {
            return None;
        }
        Some(match &self.vertex_location {
            Some(location) if self.vertex_project.is_some() => {
                format!("https://{location}-aiplatform.googleapis.com")
            }
            _ => GEMINI_AI_STUDIO_URL.to_string(),
        })
    }

    fn validate(&self) -> Result<(), ProviderConfigError> {
        // First: a bad location or region would otherwise show as a bad
        // (or missing) default URL.
        self.validate_gemini()?;
        self.validate_bedrock()?;
        if self.base_url.is_empty() {
            return Err(self.invalid("base_url", "required for this kind"));
        }
        let url = reqwest::Url::parse(&self.base_url)
            .map_err(|e| self.invalid("base_url", format!("not a URL: {e}")))?;
        if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
            return Err(self.invalid("base_url", "must be an http(s) URL with a host"));
        }
        if self.model.trim().is_empty() {
            return Err(self.invalid("model", "must not be empty"));
        }
        match (&self.api_key_env, self.kind) {
            (Some(var), _) if !is_env_var_name(var) => {
                // The value is not echoed: what is written here may be a key.
                return Err(self.invalid(
                    "api_key_env",
                    "must be the NAME of an environment variable (letters, digits and _, \
                     not starting with a digit, at most 128), never the key itself",
                ));
            }
            (None, ProviderKind::Openai | ProviderKind::Anthropic | ProviderKind::AzureOpenai) => {
                return Err(self.invalid("api_key_env", "required for this kind"))
            }
            (Some(_), ProviderKind::Bedrock) => {
                return Err(self.invalid(
                    "api_key_env",
                    "not for kind = \"bedrock\": AWS credentials are named by \
                     access_key_id_env, secret_access_key_env and session_token_env",
                ))
            }
            (None, ProviderKind::Gemini) if self.vertex_project.is_none() => {
                return Err(self.invalid(
                    "api_key_env",
                    "required for AI Studio (or set vertex_project, vertex_location and \
                     credentials_env for Vertex AI)",
                ))
            }
            _ => {}
        }
        if self.context_window == 0 {
            return Err(self.invalid("context_window", "must be positive"));
        }
        let t = &self.timeouts;
        if t.connect_ms == 0 || t.first_byte_ms == 0 || t.total_ms == 0 {
            return Err(self.invalid("timeouts", "every timeout must be positive"));
        }
        if t.first_byte_ms > t.total_ms || t.connect_ms > t.first_byte_ms {
            return Err(self.invalid(
                "timeouts",
                "expected connect_ms <= first_byte_ms <= total_ms",
            ));
        }
        match (self.lookup, self.kind) {
            (LookupMode::OpenaiStored, ProviderKind::Openai) if !self.store => {
                return Err(self.invalid("lookup", "openai_stored needs store = true"))
            }
            (LookupMode::OpenaiStored, ProviderKind::Openai)
            | (LookupMode::SimLedger, ProviderKind::Sim)
            | (LookupMode::None, _) => {}
            (LookupMode::OpenaiStored, _) => {
                return Err(self.invalid("lookup", "openai_stored needs kind = \"openai\""))
            }
            (LookupMode::SimLedger, _) => {
                return Err(self.invalid("lookup", "sim_ledger needs kind = \"sim\""))
            }
        }
        if self.store && self.kind == ProviderKind::Anthropic {
            return Err(self.invalid("store", "only OpenAI-style providers store completions"));
        }
        if self.stream_usage.is_some()
            && !matches!(
                self.kind,
                ProviderKind::Openai | ProviderKind::AzureOpenai | ProviderKind::Sim
            )
        {
            return Err(self.invalid(
                "stream_usage",
                "only for OpenAI's wire (kind = \"openai\", \"azure_openai\", \"sim\")",
            ));
        }
        if !self.refuses.is_empty() {
            if !matches!(
                self.kind,
                ProviderKind::Openai | ProviderKind::AzureOpenai | ProviderKind::Sim
            ) {
                return Err(self.invalid(
                    "refuses",
                    "only for OpenAI's wire (kind = \"openai\", \"azure_openai\", \"sim\")",
                ));
            }
            if let Some(field) = self
                .refuses
                .iter()
                .find(|f| !REFUSABLE.iter().any(|(name, _)| name == f))
            {
                let known: Vec<&str> = REFUSABLE.iter().map(|(name, _)| *name).collect();
                return Err(self.invalid(
                    "refuses",
                    format!("{field:?} is not one of {}", known.join(", ")),
                ));
            }
            if self.store && self.refuses.iter().any(|f| f == "store") {
                return Err(self.invalid(
                    "refuses",
                    "\"store\" cannot be refused with store = true (the lookup needs it)",
                ));
            }
        }
        if self.anthropic_version.is_some() && self.kind != ProviderKind::Anthropic {
            return Err(self.invalid("anthropic_version", "only for kind = \"anthropic\""));
        }
        if self.default_max_tokens.is_some() && self.kind != ProviderKind::Anthropic {
            return Err(self.invalid(
                "default_max_tokens",
                "only for kind = \"anthropic\" (no other wire requires a token limit)",
            ));
        }
        if self.default_max_tokens == Some(0) {
            return Err(self.invalid("default_max_tokens", "must be at least 1"));
        }
        if self.max_tokens_field.is_some()
            && !matches!(
                self.kind,
                ProviderKind::Openai | ProviderKind::AzureOpenai | ProviderKind::Sim
            )
        {
            return Err(self.invalid(
                "max_tokens_field",
                "only for OpenAI's wire (kind = \"openai\", \"azure_openai\", \"sim\")",
            ));
        }
        if self.store
            && matches!(
                self.kind,
                ProviderKind::Gemini | ProviderKind::AzureOpenai | ProviderKind::Bedrock
            )
        {
            return Err(self.invalid("store", "only OpenAI-style providers store completions"));
        }
        self.validate_azure()
    }

    fn validate_gemini(&self) -> Result<(), ProviderConfigError> {
        let gemini = self.kind == ProviderKind::Gemini;
        for (field, given) in [
            ("vertex_project", self.vertex_project.is_some()),
            ("vertex_location", self.vertex_location.is_some()),
            ("credentials_env", self.credentials_env.is_some()),
        ] {
            if given && !gemini {
                return Err(self.invalid(field, "only for kind = \"gemini\""));
            }
        }
        if !gemini || self.vertex_project.is_none() {
            return match (&self.vertex_location, &self.credentials_env) {
                (None, None) => Ok(()),
                (Some(_), _) => Err(self.invalid("vertex_location", "needs vertex_project")),
                (_, Some(_)) => Err(self.invalid("credentials_env", "needs vertex_project")),
            };
        }
        // Google's project ids and locations: lower-case letters, digits, -.
        let path_segment = |v: &str| {
            !v.is_empty()
                && v.len() <= 63
                && v.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if !self.vertex_project.as_deref().is_some_and(path_segment) {
            return Err(self.invalid(
                "vertex_project",
                "must be a project id (lower-case letters, digits and -)",
            ));
        }
        match self.vertex_location.as_deref() {
            Some(l) if path_segment(l) => {}
            Some(_) => {
                return Err(self.invalid(
                    "vertex_location",
                    "must be a location such as us-central1 (lower-case letters, digits and -)",
                ))
            }
            None => return Err(self.invalid("vertex_location", "required with vertex_project")),
        }
        match self.credentials_env.as_deref() {
            Some(var) if is_env_var_name(var) => Ok(()),
            // The value is not echoed: it may be a path or the JSON itself.
            Some(_) => Err(self.invalid(
                "credentials_env",
                "must be the NAME of an environment variable holding the service-account \
                 file's path, never the path or the key itself",
            )),
            None => Err(self.invalid("credentials_env", "required with vertex_project")),
        }
    }

    fn validate_bedrock(&self) -> Result<(), ProviderConfigError> {
        let bedrock = self.kind == ProviderKind::Bedrock;
        for (field, given) in [
            ("region", self.region.is_some()),
            ("access_key_id_env", self.access_key_id_env.is_some()),
            (
                "secret_access_key_env",
                self.secret_access_key_env.is_some(),
            ),
            ("session_token_env", self.session_token_env.is_some()),
        ] {
            if given && !bedrock {
                return Err(self.invalid(field, "only for kind = \"bedrock\""));
            }
        }
        if !bedrock {
            return Ok(());
        }
        match self.region.as_deref() {
            Some(r) if is_aws_region(r) => {}
            // The value is not echoed: a secret may have been pasted here.
            Some(_) => {
                return Err(self.invalid(
                    "region",
                    "must be an AWS region such as us-east-1 (lower-case letters, digits and -)",
                ))
            }
            None => return Err(self.invalid("region", "required for kind = \"bedrock\"")),
        }
        for (field, var) in [
            ("access_key_id_env", &self.access_key_id_env),
            ("secret_access_key_env", &self.secret_access_key_env),
            ("session_token_env", &self.session_token_env),
        ] {
            if var.as_deref().is_some_and(|v| !is_env_var_name(v)) {
                return Err(self.invalid(
                    field,
                    "must be the NAME of an environment variable (letters, digits and _, \
                     not starting with a digit, at most 128), never the credential itself",
                ));
            }
        }
        Ok(())
    }

    fn validate_azure(&self) -> Result<(), ProviderConfigError> {
        let azure = self.kind == ProviderKind::AzureOpenai;
        for (field, given) in [
            ("deployment", self.deployment.is_some()),
            ("api_version", self.api_version.is_some()),
            ("azure_auth", self.azure_auth.is_some()),
        ] {
            if given && !azure {
                return Err(self.invalid(field, "only for kind = \"azure_openai\""));
            }
        }
        if !azure {
            return Ok(());
        }
        let segment = |v: &str| {
            !v.is_empty()
                && v.len() <= 64
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        if !self.deployment.as_deref().is_some_and(segment) {
            return Err(self.invalid(
                "deployment",
                "required: the deployment name (letters, digits, -, _ and .)",
            ));
        }
        if !self
            .api_version
            .as_deref()
            .is_some_and(is_azure_api_version)
        {
            return Err(self.invalid(
                "api_version",
                "required: a dated version such as \"2024-10-21\" or \"2025-01-01-preview\"",
            ));
        }
        Ok(())
    }

    /// The API key from the environment variable named by `api_key_env`;
    /// `None` when the provider needs none.
    pub fn resolve_api_key(&self) -> Result<Option<Secret>, ProviderConfigError> {
        let Some(var) = &self.api_key_env else {
            return Ok(None);
        };
        match std::env::var(var) {
            Ok(value) if !value.is_empty() => Ok(Some(Secret(value))),
            _ => Err(ProviderConfigError::MissingApiKey {
                path: self.source.clone(),
                var: var.clone(),
            }),
        }
    }

    /// Open (and close) a TCP connection to `base_url`'s host and port within
    /// the connect timeout.
    pub async fn check_reachable(&self) -> Result<(), ProviderConfigError> {
        let unreachable = |message: String| ProviderConfigError::Unreachable {
            path: self.source.clone(),
            base_url: self.base_url.clone(),
            connect_ms: self.timeouts.connect_ms,
            message,
        };
        let url = reqwest::Url::parse(&self.base_url).map_err(|e| unreachable(e.to_string()))?;
        let host = url
            .host_str()
            .ok_or_else(|| unreachable("no host".into()))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let port = url
            .port_or_known_default()
            .ok_or_else(|| unreachable("no port".into()))?;
        let connect = tokio::net::TcpStream::connect((host.as_str(), port));
        match tokio::time::timeout(self.timeouts.connect(), connect).await {
            Ok(Ok(_stream)) => Ok(()),
            Ok(Err(e)) => Err(unreachable(e.to_string())),
            Err(_) => Err(unreachable("connect timed out".into())),
        }
    }

    /// Hex SHA-256 of the canonical JSON of this configuration (source path
    /// left out): contract runs made under another digest are stale. A
    /// setting written out at its default reads as one left unset, and a
    /// `base_url` with a trailing `/` as one without, so that neither makes
    /// a passed provider look changed (the form of an unset one is the
    /// form digests had before, so no stored pass goes stale).
    pub fn digest(&self) -> String {
        let mut plain = self.clone();
        let kind = self.kind;
        plain.base_url = self.base().to_string();
        if plain.accepts_images == Some(kind == ProviderKind::Sim) {
            plain.accepts_images = None;
        }
        if plain.stream_usage == Some(true) {
            plain.stream_usage = None;
        }
        if plain.supports_prefill
            == Some(matches!(kind, ProviderKind::Anthropic | ProviderKind::Sim))
        {
            plain.supports_prefill = None;
        }
        if plain.anthropic_version.as_deref() == Some(DEFAULT_ANTHROPIC_VERSION) {
            plain.anthropic_version = None;
        }
        if plain.max_tokens_field == Some(MaxTokensField::default_for(kind)) {
            plain.max_tokens_field = None;
        }
        if plain.default_max_tokens == Some(DEFAULT_ANTHROPIC_MAX_TOKENS) {
            plain.default_max_tokens = None;
        }
        fingerprint(&serde_json::to_value(&plain).unwrap_or(serde_json::Value::Null))
    }

    /// See `supports_prefill`: the stated value, or the wire format's default.
    pub fn continues_prefill(&self) -> bool {
        self.supports_prefill.unwrap_or(matches!(
            self.kind,
            ProviderKind::Anthropic | ProviderKind::Sim
        ))
    }

    /// See `max_tokens_field`: the stated field, or the kind's default.
    pub fn max_tokens_field(&self) -> MaxTokensField {
        self.max_tokens_field
            .unwrap_or(MaxTokensField::default_for(self.kind))
    }

    /// The token limit this provider's wire requires when a job sets none
    /// (Anthropic's `max_tokens`); `None` where a limit is optional.
    pub fn required_max_tokens(&self) -> Option<u32> {
        (self.kind == ProviderKind::Anthropic).then(|| {
            self.default_max_tokens
                .unwrap_or(DEFAULT_ANTHROPIC_MAX_TOKENS)
        })
    }

    pub fn anthropic_version(&self) -> &str {
        self.anthropic_version
            .as_deref()
            .unwrap_or(DEFAULT_ANTHROPIC_VERSION)
    }

    /// `base_url` without a trailing slash, ready for `format!("{}/v1/…")`.
    pub fn base(&self) -> &str {
        self.base_url.trim_end_matches('/')
    }
}

/// An AWS region name: `us-east-1`, `eu-central-2`, `us-gov-west-1`.
fn is_aws_region(r: &str) -> bool {
    (4..=32).contains(&r.len())
        && r.contains('-')
        && r.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !r.starts_with('-')
        && !r.ends_with('-')
}

/// Azure's `api-version`: `YYYY-MM-DD`, optionally `-preview`.
fn is_azure_api_version(v: &str) -> bool {
    let date = v.strip_suffix("-preview").unwrap_or(v);
    let bytes = date.as_bytes();
    bytes.len() == 10
        && bytes.iter().enumerate().all(|(i, b)| match i {
            4 | 7 => *b == b'-',
            _ => b.is_ascii_digit(),
        })
}

/// A portable environment variable name: `[A-Za-z_][A-Za-z0-9_]*`.
pub fn is_env_var_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && name.len() <= 128
}

/// The key of a `key = value` line, when it looks like a field name.
fn field_of_line(line: &str) -> Option<&str> {
    let key = line.split_once('=')?.0.trim();
    looks_like_field(key).then_some(key)
}

fn looks_like_field(word: &str) -> bool {
    (1..=40).contains(&word.len())
        && word
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
}

/// toml's message with every quoted value replaced: `"…"` always, and a
/// backquoted word unless it looks like a field or variant name.
fn redact_values(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(open) = rest.find(['"', '`']) {
        out.push_str(&rest[..open]);
        let quote = &rest[open..open + 1];
        let after = &rest[open + 1..];
        let Some(close) = after.find(quote) else {
            out.push_str("<value>");
            return out;
        };
        let inner = &after[..close];
        if quote == "`" && looks_like_field(inner) {
            out.push('`');
            out.push_str(inner);
            out.push('`');
        } else {
            out.push_str("<value>");
        }
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIM: &str = r#"
kind = "sim"
base_url = "http://127.0.0.1:8090"
model = "healthy"
tokenizer = "o200k_base"
context_window = 16384
lookup = "sim_ledger"
"#;

    #[test]
    fn omitted_defaults_equal_written_defaults_in_the_digest() {
        let a = ProviderConfig::parse(SIM, Path::new("a.toml")).unwrap();
        let with = format!("{SIM}\n[timeouts]\nconnect_ms = 2000\n");
        let b = ProviderConfig::parse(&with, Path::new("b.toml")).unwrap();
        assert_eq!(a.digest(), b.digest());
        let other = SIM.replace("\"healthy\"", "\"hang\"");
        let c = ProviderConfig::parse(&other, Path::new("a.toml")).unwrap();
        assert_ne!(a.digest(), c.digest());
        // Options written out at their defaults, and a trailing slash.
        let written = format!(
            "accepts_images = true\nsupports_prefill = true\nstream_usage = true\n{}",
            SIM.replace("8090\"", "8090/\"")
        );
        let d = ProviderConfig::parse(&written, Path::new("d.toml")).unwrap();
        assert_eq!(a.digest(), d.digest());
        // Not at their defaults, they count.
        let e = ProviderConfig::parse(&format!("accepts_images = false\n{SIM}"), Path::new("e"));
        assert_ne!(a.digest(), e.unwrap().digest());
        // A file with nothing written at its default keeps the digest it
        // had before defaults were read as unset: no stored pass went stale.
        assert_eq!(a.digest(), fingerprint(&serde_json::to_value(&a).unwrap()));
    }

    #[test]
    fn refuses_and_stream_usage_are_checked() {
        let parse = |extra: &str| {
            ProviderConfig::parse(&format!("{extra}\n{SIM}"), Path::new("p/x.toml"))
                .map_err(|e| e.to_string())
        };
        let ok = parse("refuses = [\"user\", \"seed\"]\nstream_usage = false").unwrap();
        assert_eq!(ok.refuses, ["user", "seed"]);
        let unknown = parse("refuses = [\"colour\"]").unwrap_err();
        assert!(
            unknown.contains("refuses") && unknown.contains("colour"),
            "{unknown}"
        );
        assert!(
            unknown.contains("reasoning_effort"),
            "lists the known: {unknown}"
        );
        let anthropic = SIM
            .replace("kind = \"sim\"", "kind = \"anthropic\"")
            .replace("lookup = \"sim_ledger\"", "api_key_env = \"SOME_KEY\"");
        for extra in ["refuses = [\"user\"]", "stream_usage = false"] {
            let err =
                ProviderConfig::parse(&format!("{extra}\n{anthropic}"), Path::new("p/a.toml"))
                    .unwrap_err()
                    .to_string();
            assert!(err.contains("only for OpenAI's wire"), "{err}");
        }
    }

    #[test]
    fn token_limit_settings_are_checked_and_default_by_kind() {
        let sim = ProviderConfig::parse(SIM, Path::new("p/s.toml")).unwrap();
        assert_eq!(sim.max_tokens_field(), MaxTokensField::MaxTokens);
        assert_eq!(sim.required_max_tokens(), None);
        let openai = SIM
            .replace("kind = \"sim\"", "kind = \"openai\"")
            .replace("lookup = \"sim_ledger\"", "api_key_env = \"SOME_KEY\"");
        let parse = |text: &str| {
            ProviderConfig::parse(text, Path::new("p/x.toml")).map_err(|e| e.to_string())
        };
        let plain = parse(&openai).unwrap();
        assert_eq!(
            plain.max_tokens_field(),
            MaxTokensField::MaxCompletionTokens
        );
        let compat = parse(&format!("max_tokens_field = \"max_tokens\"\n{openai}")).unwrap();
        assert_eq!(compat.max_tokens_field(), MaxTokensField::MaxTokens);
        assert_ne!(plain.digest(), compat.digest());
        let written = parse(&format!(
            "max_tokens_field = \"max_completion_tokens\"\n{openai}"
        ));
        assert_eq!(plain.digest(), written.unwrap().digest());
        let anthropic = openai.replace("kind = \"openai\"", "kind = \"anthropic\"");
        assert_eq!(
            parse(&anthropic).unwrap().required_max_tokens(),
            Some(DEFAULT_ANTHROPIC_MAX_TOKENS)
        );
        let tuned = parse(&format!("default_max_tokens = 8192\n{anthropic}")).unwrap();
        assert_eq!(tuned.required_max_tokens(), Some(8192));
        for (extra, text, wanted) in [
            (
                "default_max_tokens = 8192",
                &openai,
                "only for kind = \"anthropic\"",
            ),
            ("default_max_tokens = 0", &anthropic, "at least 1"),
            (
                "max_tokens_field = \"max_tokens\"",
                &anthropic,
                "only for OpenAI's wire",
            ),
        ] {
            let err = parse(&format!("{extra}\n{text}")).unwrap_err();
            assert!(err.contains(wanted), "{extra}: {err}");
        }
    }

    #[test]
    fn wrong_type_names_the_line_and_field() {
        let text = SIM.replace("16384", "\"big\"");
        let err = ProviderConfig::parse(&text, Path::new("p/x.toml")).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("p/x.toml: line 6:"), "{msg}");
        assert!(msg.contains("context_window"), "{msg}");
    }

    #[test]
    fn secret_debug_hides_the_key() {
        assert_eq!(format!("{:?}", Secret::new("sk-live")), "***");
    }

    #[test]
    fn openai_stored_lookup_needs_store() {
        let text = SIM
            .replace("\"sim\"", "\"openai\"")
            .replace("sim_ledger", "openai_stored")
            + "api_key_env = \"K\"\n";
        let err = ProviderConfig::parse(&text, Path::new("o.toml")).unwrap_err();
        assert!(err.to_string().contains("lookup"), "{err}");
    }
}
