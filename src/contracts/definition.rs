//! A contract's files, how they are loaded and checked, and its digest.
//!
//! Loading fails early, naming the file and the field at fault, for anything a
//! contract run would otherwise trip over later: unknown keys, a template that
//! does not parse, a schema that does not compile, a case whose expectations
//! a schema-valid answer could not meet.

use serde::Deserialize;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The template's name inside the contract's minijinja environment.
pub(crate) const TEMPLATE_NAME: &str = "template";

/// A loaded, checked contract. Cheap to clone; the template and the schema are
/// compiled once here.
#[derive(Debug, Clone)]
pub struct Contract {
    /// The folder name; also used in idempotency keys, so `[a-z0-9_-]+`.
    pub name: String,
    pub dir: PathBuf,
    pub version: u32,
    pub description: String,
    pub system: String,
    pub template: String,
    pub temperature: f64,
    pub max_tokens: u32,
    /// Allowed relative difference between our prompt token count and the
    /// provider's reported one, e.g. `0.1` for 10 %.
    pub prompt_token_tolerance: f64,
    /// Whether `expect.values` must come back exactly (see [`Expectation`]).
    pub exact_values: bool,
    /// Static example turns placed before the rendered user turn.
    pub few_shot: Vec<FewShotTurn>,
    pub schema: Value,
    pub cases: Vec<Case>,
    digest: String,
    pub(crate) environment: minijinja::Environment<'static>,
    pub(crate) validator: std::sync::Arc<jsonschema::Validator>,
}

/// `contract.toml`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ContractFile {
    version: u32,
    description: String,
    system: String,
    template: String,
    params: ParamsSection,
    tokenizer: TokenizerSection,
    #[serde(default)]
    round_trip: RoundTripSection,
    #[serde(default)]
    few_shot: Vec<FewShotTurn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ParamsSection {
    temperature: f64,
    max_tokens: u32,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizerSection {
    prompt_token_tolerance: f64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RoundTripSection {
    #[serde(default)]
    exact: bool,
}

/// One example exchange shown to the model before the real question.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FewShotTurn {
    pub user: String,
    pub assistant: String,
}

/// One test case, `cases/NAME.json`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    /// Template variables.
    pub input: Map<String, Value>,
    pub expect: Expectation,
}

/// What must come back for a case to pass `round_trip`.
///
/// The rule: every name in `fields` is a top-level property the schema
/// *requires* and does not allow to be `null` (checked at load), and must be
/// present and non-null in the answer. `values` are compared exactly only
/// when the contract says `[round_trip] exact = true`; otherwise they document
/// what a capable model should answer but are not checked, so a healthy
/// provider that answers schema-valid JSON (such as the simulator, which
/// cannot know the facts except by echo) passes.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expectation {
    pub fields: Vec<String>,
    #[serde(default)]
    pub values: Map<String, Value>,
}

#[derive(Debug, thiserror::Error)]
pub enum ContractError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The toml error text names the line, column and key.
    #[error("{}: {message}", path.display())]
    Toml { path: PathBuf, message: String },
    #[error("{}:{line}:{column}: {message}", path.display())]
    Json {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{}: {field}: {message}", path.display())]
    Invalid {
        path: PathBuf,
        field: String,
        message: String,
    },
}

fn invalid(path: &Path, field: &str, message: impl Into<String>) -> ContractError {
    ContractError::Invalid {
        path: path.to_path_buf(),
        field: field.to_string(),
        message: message.into(),
    }
}

fn read(path: &Path) -> Result<Vec<u8>, ContractError> {
    std::fs::read(path).map_err(|source| ContractError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse_json<T: serde::de::DeserializeOwned>(
    path: &Path,
    bytes: &[u8],
) -> Result<T, ContractError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(&mut deserializer).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        let message = if field == "." {
            inner.to_string()
        } else {
            format!("{field}: {inner}")
        };
        ContractError::Json {
            path: path.to_path_buf(),
            line: inner.line(),
            column: inner.column(),
            message,
        }
    })
}

fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_')
}

/// Load every contract folder under `contracts_dir` (hidden entries and plain
/// files are ignored), keyed by name.
pub fn load_all(contracts_dir: &Path) -> Result<BTreeMap<String, Contract>, ContractError> {
    let entries = std::fs::read_dir(contracts_dir).map_err(|source| ContractError::Io {
        path: contracts_dir.to_path_buf(),
        source,
    })?;
    let mut contracts = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|source| ContractError::Io {
            path: contracts_dir.to_path_buf(),
            source,
        })?;
        let path = entry.path();
        let hidden = entry.file_name().to_string_lossy().starts_with('.');
        if hidden || !path.is_dir() {
            continue;
        }
        let contract = Contract::load(&path)?;
        contracts.insert(contract.name.clone(), contract);
    }
    Ok(contracts)
}

impl Contract {
    /// Load and check the contract in `dir` (its name is the folder name).
    pub fn load(dir: &Path) -> Result<Self, ContractError> {
        let name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if !is_plain_name(&name) {
            return Err(invalid(
                dir,
                "name",
                format!("contract folder name {name:?} must match [a-z0-9_-]+"),
            ));
        }

        let toml_path = dir.join("contract.toml");
        let toml_bytes = read(&toml_path)?;
        let toml_text = String::from_utf8(toml_bytes.clone())
            .map_err(|_| invalid(&toml_path, "(file)", "not valid UTF-8"))?;
        let file: ContractFile = toml::from_str(&toml_text).map_err(|e| ContractError::Toml {
            path: toml_path.clone(),
            message: e.to_string(),
        })?;
        check_contract_file(&toml_path, &file)?;
        let environment = compile_template(&toml_path, &toml_text, &file.template)?;

        let schema_path = dir.join("schema.json");
        let schema_bytes = read(&schema_path)?;
        let schema: Value = parse_json(&schema_path, &schema_bytes)?;
        let validator = compile_schema(&schema_path, &schema)?;
        check_few_shot_answers(&toml_path, &file.few_shot, &validator)?;

        let mut hasher = Sha256::new();
        hash_file(&mut hasher, "contract.toml", &toml_bytes);
        hash_file(&mut hasher, "schema.json", &schema_bytes);

        let mut cases = Vec::new();
        let mut seen = BTreeSet::new();
        for case_path in case_files(dir)? {
            let bytes = read(&case_path)?;
            let relative = case_path
                .strip_prefix(dir)
                .unwrap_or(&case_path)
                .to_string_lossy()
                .replace('\\', "/");
            hash_file(&mut hasher, &relative, &bytes);
            let case: Case = parse_json(&case_path, &bytes)?;
            check_case(&case_path, &case, &schema)?;
            if !seen.insert(case.name.clone()) {
                return Err(invalid(
                    &case_path,
                    "name",
                    format!("case name {:?} is used twice", case.name),
                ));
            }
            cases.push(case);
        }
        if cases.is_empty() {
            return Err(invalid(
                &dir.join("cases"),
                "(folder)",
                "a contract needs at least one case in cases/*.json",
            ));
        }

        Ok(Contract {
            name,
            dir: dir.to_path_buf(),
            version: file.version,
            description: file.description,
            system: file.system,
            template: file.template,
            temperature: file.params.temperature,
            max_tokens: file.params.max_tokens,
            prompt_token_tolerance: file.tokenizer.prompt_token_tolerance,
            exact_values: file.round_trip.exact,
            few_shot: file.few_shot,
            schema,
            cases,
            digest: hex::encode(hasher.finalize()),
            environment,
            validator: std::sync::Arc::new(validator),
        })
    }

    /// SHA-256 (hex) over the bytes of contract.toml, schema.json and every
    /// case file, each framed by its relative path and length: any change to
    /// any of them makes runs recorded under the old digest stale.
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The first 12 hex digits of the digest, for keys and tables.
    pub fn digest_prefix(&self) -> &str {
        self.digest.get(..12).unwrap_or(&self.digest)
    }

    pub fn case(&self, name: &str) -> Option<&Case> {
        self.cases.iter().find(|c| c.name == name)
    }
}

fn hash_file(hasher: &mut Sha256, relative: &str, bytes: &[u8]) {
    // Framing keeps "a" + "bc" and "ab" + "c" apart.
    hasher.update(relative.as_bytes());
    hasher.update([0]);
    hasher.update((bytes.len() as u64).to_be_bytes());
    hasher.update(bytes);
}

/// `cases/*.json`, sorted by file name so the digest is stable.
fn case_files(dir: &Path) -> Result<Vec<PathBuf>, ContractError> {
    let cases_dir = dir.join("cases");
    let entries = std::fs::read_dir(&cases_dir).map_err(|source| ContractError::Io {
        path: cases_dir.clone(),
        source,
    })?;
    let mut files = Vec::new();
    for entry in entries {
        let path = entry
            .map_err(|source| ContractError::Io {
                path: cases_dir.clone(),
                source,
            })?
            .path();
        if path.is_file() && path.extension().is_some_and(|e| e == "json") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

fn check_contract_file(path: &Path, file: &ContractFile) -> Result<(), ContractError> {
    if file.system.trim().is_empty() {
        return Err(invalid(path, "system", "must not be empty"));
    }
    if file.template.trim().is_empty() {
        return Err(invalid(path, "template", "must not be empty"));
    }
    if !(0.0..=2.0).contains(&file.params.temperature) {
        return Err(invalid(
            path,
            "params.temperature",
            "must be between 0 and 2",
        ));
    }
    if file.params.max_tokens == 0 {
        return Err(invalid(path, "params.max_tokens", "must be at least 1"));
    }
    let tolerance = file.tokenizer.prompt_token_tolerance;
    if !(0.0..=1.0).contains(&tolerance) {
        return Err(invalid(
            path,
            "tokenizer.prompt_token_tolerance",
            "must be a fraction between 0 and 1 (0.1 means 10 %)",
        ));
    }
    for (i, turn) in file.few_shot.iter().enumerate() {
        if turn.user.trim().is_empty() || turn.assistant.trim().is_empty() {
            return Err(invalid(
                path,
                &format!("few_shot[{i}]"),
                "user and assistant must not be empty",
            ));
        }
    }
    Ok(())
}

/// An example answer that breaks the schema would teach the model to break it.
fn check_few_shot_answers(
    path: &Path,
    few_shot: &[FewShotTurn],
    validator: &jsonschema::Validator,
) -> Result<(), ContractError> {
    for (i, turn) in few_shot.iter().enumerate() {
        let field = format!("few_shot[{i}].assistant");
        let answer: Value = serde_json::from_str(&turn.assistant)
            .map_err(|e| invalid(path, &field, format!("not JSON: {e}")))?;
        let first_error = validator
            .iter_errors(&answer)
            .next()
            .map(|error| format!("breaks schema.json at {}: {error}", error.instance_path()));
        if let Some(message) = first_error {
            return Err(invalid(path, &field, message));
        }
    }
    Ok(())
}

fn compile_template(
    path: &Path,
    toml_text: &str,
    template: &str,
) -> Result<minijinja::Environment<'static>, ContractError> {
    let mut environment = minijinja::Environment::new();
    environment.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    // Prompts are plain text: never HTML-escape user input.
    environment.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    let refused = |e: minijinja::Error| {
        // Point at the line in contract.toml, not inside the template.
        let offset = template_line_offset(toml_text);
        let line = e.line().map(|l| l + offset).unwrap_or(offset);
        invalid(
            path,
            "template",
            format!(
                "line {line}: {}",
                e.detail().unwrap_or(&e.kind().to_string())
            ),
        )
    };
    environment
        .add_template_owned(TEMPLATE_NAME, template.to_string())
        .map_err(refused)?;
    if let Some(e) = unknown_name(template) {
        return Err(refused(e));
    }
    Ok(environment)
}

/// A filter, test, function or method the template names that does not
/// exist: minijinja finds it only when it renders, so a job (whose client
/// would be blamed for its input) or a contract run would meet it first. A
/// trial render with every variable undefined (and allowed to be) meets it
/// on the paths that need no variable to be set.
fn unknown_name(template: &str) -> Option<minijinja::Error> {
    use minijinja::ErrorKind;
    let mut trial = minijinja::Environment::new();
    trial.set_undefined_behavior(minijinja::UndefinedBehavior::Chainable);
    match trial.render_str(template, ()) {
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::UnknownFilter
                    | ErrorKind::UnknownTest
                    | ErrorKind::UnknownFunction
                    | ErrorKind::UnknownMethod
            ) =>
        {
            Some(e)
        }
        _ => None,
    }
}

/// The line of contract.toml just before the template's first line (0 when
/// it cannot be told), so template line N is file line N + offset.
fn template_line_offset(toml_text: &str) -> usize {
    toml_text
        .lines()
        .position(|l| l.trim_start().starts_with("template"))
        .map(|i| {
            let line = toml_text.lines().nth(i).unwrap_or_default();
            // A multi-line string starts on the next line.
            if line.trim_end().ends_with("\"\"\"") || line.trim_end().ends_with("'''") {
                i + 1
            } else {
                i
            }
        })
        .unwrap_or(0)
}

fn compile_schema(path: &Path, schema: &Value) -> Result<jsonschema::Validator, ContractError> {
    if schema.get("type").and_then(Value::as_str) != Some("object") {
        return Err(invalid(
            path,
            "/type",
            "the output schema's top level must be \"object\"",
        ));
    }
    if !schema.get("properties").is_some_and(Value::is_object) {
        return Err(invalid(
            path,
            "/properties",
            "the output schema must declare its top-level properties",
        ));
    }
    jsonschema::validator_for(schema).map_err(|e| {
        invalid(
            path,
            &e.schema_path().to_string(),
            format!("schema does not compile: {e}"),
        )
    })
}

/// Whether `property_schema` admits `null` (by `type`, `enum`, `const`, or
/// one of its `anyOf`/`oneOf` alternatives).
fn admits_null(property_schema: &Value) -> bool {
    let by_type = match property_schema.get("type") {
        Some(Value::String(t)) => t == "null",
        Some(Value::Array(types)) => types.iter().any(|t| t == "null"),
        _ => false,
    };
    let by_enum = property_schema
        .get("enum")
        .and_then(Value::as_array)
        .is_some_and(|values| values.iter().any(Value::is_null));
    let by_alternative = ["anyOf", "oneOf"].iter().any(|keyword| {
        property_schema
            .get(*keyword)
            .and_then(Value::as_array)
            .is_some_and(|alternatives| alternatives.iter().any(admits_null))
    });
    by_type || by_enum || by_alternative || property_schema.get("const").is_some_and(Value::is_null)
}

/// Whether `value` is valid for one property's schema, as schema.json's
/// validator would take it there (the root's `$defs` and `definitions`
/// carried along, for a `$ref` into them); `None` when it cannot be told.
fn property_admits(root: &Value, property: &Value, value: &Value) -> Option<bool> {
    let mut alone = property.clone();
    if let Some(fields) = alone.as_object_mut() {
        for defs in ["$defs", "definitions"] {
            if let Some(found) = root.get(defs) {
                fields
                    .entry(defs.to_string())
                    .or_insert_with(|| found.clone());
            }
        }
        if let Some(dialect) = root.get("$schema") {
            fields
                .entry("$schema".to_string())
                .or_insert_with(|| dialect.clone());
        }
    }
    jsonschema::validator_for(&alone)
        .ok()
        .map(|v| v.is_valid(value))
}

fn check_case(path: &Path, case: &Case, schema: &Value) -> Result<(), ContractError> {
    if !is_plain_name(&case.name) {
        return Err(invalid(path, "name", "must match [a-z0-9_-]+"));
    }
    if case.expect.fields.is_empty() {
        return Err(invalid(path, "expect.fields", "list at least one field"));
    }
    let required: BTreeSet<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let properties = schema.get("properties").and_then(Value::as_object);
    for (i, field) in case.expect.fields.iter().enumerate() {
        let at = format!("expect.fields[{i}]");
        if !required.contains(field.as_str()) {
            return Err(invalid(
                path,
                &at,
                format!("{field:?} is not a required property of schema.json, so a valid answer may omit it"),
            ));
        }
        if properties.and_then(|p| p.get(field)).is_some_and(|p| {
            admits_null(p) || property_admits(schema, p, &Value::Null) == Some(true)
        }) {
            return Err(invalid(
                path,
                &at,
                format!(
                    "{field:?} may be null by schema.json, so a valid answer may leave it empty"
                ),
            ));
        }
    }
    for (key, value) in &case.expect.values {
        if !case.expect.fields.contains(key) {
            return Err(invalid(
                path,
                &format!("expect.values.{key}"),
                "a checked value must also be listed in expect.fields",
            ));
        }
        let property = properties.and_then(|p| p.get(key));
        if property.is_some_and(|p| property_admits(schema, p, value) == Some(false)) {
            return Err(invalid(
                path,
                &format!("expect.values.{key}"),
                format!(
                    "{value} is not a valid {key:?} by schema.json, so no valid answer can hold it"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn shipped_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts")
    }

    /// A copy of a shipped contract in a temporary directory, to mutate.
    fn copy_contract(name: &str) -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let to = tmp.path().join(name);
        copy_dir(&shipped_dir().join(name), &to);
        (tmp, to)
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let target = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy_dir(&path, &target);
            } else {
                std::fs::copy(&path, &target).unwrap();
            }
        }
    }

    #[test]
    fn both_shipped_contracts_load_with_cases() {
        let contracts = load_all(&shipped_dir()).unwrap();
        let names: Vec<&str> = contracts.keys().map(String::as_str).collect();
        assert_eq!(names, ["invoice-extraction", "ticket-triage"]);
        for contract in contracts.values() {
            assert!(contract.cases.len() >= 4, "{}", contract.name);
            assert_eq!(contract.digest().len(), 64);
        }
    }

    #[test]
    fn digest_changes_when_schema_changes() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        let before = Contract::load(&dir).unwrap().digest().to_string();
        let original = Contract::load(&shipped_dir().join("ticket-triage")).unwrap();
        assert_eq!(before, original.digest(), "a copy has the same digest");

        let schema_path = dir.join("schema.json");
        let mut schema: Value =
            serde_json::from_slice(&std::fs::read(&schema_path).unwrap()).unwrap();
        schema["description"] = Value::from("edited");
        std::fs::write(&schema_path, serde_json::to_vec_pretty(&schema).unwrap()).unwrap();
        assert_ne!(Contract::load(&dir).unwrap().digest(), before);
    }

    #[test]
    fn digest_changes_when_a_case_changes() {
        let (_tmp, dir) = copy_contract("invoice-extraction");
        let before = Contract::load(&dir).unwrap().digest().to_string();
        let case_path = case_files(&dir).unwrap().remove(0);
        let mut bytes = std::fs::read(&case_path).unwrap();
        bytes.push(b'\n');
        std::fs::write(&case_path, bytes).unwrap();
        assert_ne!(Contract::load(&dir).unwrap().digest(), before);
    }

    #[test]
    fn unknown_toml_key_names_file_and_key() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        let path = dir.join("contract.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("[params]", "[params]\ntemprature = 0.5"),
        )
        .unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(err.contains("contract.toml"), "{err}");
        assert!(err.contains("temprature"), "{err}");
        assert!(err.contains("line"), "{err}");
    }

    #[test]
    fn template_syntax_error_names_the_line() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        let path = dir.join("contract.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("{{ body }}", "{{ body }")).unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(err.contains("contract.toml: template: line"), "{err}");
    }

    #[test]
    fn an_unknown_filter_is_refused_at_load_naming_the_line() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        let path = dir.join("contract.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, text.replace("{{ body }}", "{{ body | shout }}")).unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(err.contains("contract.toml: template: line"), "{err}");
        assert!(err.contains("shout"), "{err}");
        // A known filter on the same variable loads.
        std::fs::write(&path, text.replace("{{ body }}", "{{ body | trim }}")).unwrap();
        Contract::load(&dir).unwrap();
    }

    #[test]
    fn a_case_no_valid_answer_can_meet_is_refused() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        let schema: Value =
            serde_json::from_slice(&std::fs::read(dir.join("schema.json")).unwrap()).unwrap();
        let case_path = case_files(&dir).unwrap().remove(0);
        let original: Value = serde_json::from_slice(&std::fs::read(&case_path).unwrap()).unwrap();
        // A value the field's enum does not hold.
        let mut case = original.clone();
        let field = case["expect"]["fields"][0].as_str().unwrap().to_string();
        assert!(schema["properties"][&field]["enum"].is_array(), "{schema}");
        case["expect"]["values"] = serde_json::json!({ field.clone(): "zzz" });
        std::fs::write(&case_path, serde_json::to_vec(&case).unwrap()).unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(err.contains(&format!("expect.values.{field}")), "{err}");
        assert!(err.contains("\"zzz\""), "{err}");
        // A required field whose schema says nothing of its type: null is
        // valid there, so a valid answer may leave it empty.
        std::fs::write(&case_path, serde_json::to_vec(&original).unwrap()).unwrap();
        let mut untyped = schema.clone();
        untyped["properties"][&field] = serde_json::json!({"description": "anything"});
        std::fs::write(dir.join("schema.json"), untyped.to_string()).unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(err.contains("may be null"), "{err}");
    }

    #[test]
    fn expected_field_that_schema_does_not_require_is_refused() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        let case_path = case_files(&dir).unwrap().remove(0);
        let mut case: Value = serde_json::from_slice(&std::fs::read(&case_path).unwrap()).unwrap();
        case["expect"]["fields"] = serde_json::json!(["category", "mood"]);
        std::fs::write(&case_path, serde_json::to_vec(&case).unwrap()).unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(err.contains("expect.fields[1]"), "{err}");
        assert!(err.contains("mood"), "{err}");
    }

    #[test]
    fn few_shot_answer_that_breaks_the_schema_is_refused() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        let path = dir.join("contract.toml");
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(
            &path,
            text.replace("\"priority\":\"normal\"", "\"priority\":\"meh\""),
        )
        .unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(
            err.contains("few_shot[0].assistant: breaks schema.json at /priority"),
            "{err}"
        );
    }

    #[test]
    fn malformed_case_json_names_line_and_column() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        std::fs::write(
            dir.join("cases/zz-broken.json"),
            "{\n  \"name\": \"x\",\n  oops\n}",
        )
        .unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(err.contains("zz-broken.json:3:"), "{err}");
    }

    #[test]
    fn schema_that_is_not_an_object_is_refused() {
        let (_tmp, dir) = copy_contract("ticket-triage");
        std::fs::write(dir.join("schema.json"), r#"{"type":"array"}"#).unwrap();
        let err = Contract::load(&dir).unwrap_err().to_string();
        assert!(err.contains("schema.json: /type"), "{err}");
    }
}
