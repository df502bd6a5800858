//! Provider files of kind `gemini` (AI Studio and Vertex AI),
//! `azure_openai` and `bedrock`: each bad file is explained by file, line and field, by
//! the loader and by `onejob serve --validate`, and no credential — a key,
//! a service-account file's content, an AWS secret — is ever printed back.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use onejob::providers::build_provider;
use onejob::providers::config::{ProviderConfig, ProviderKind, GEMINI_AI_STUDIO_URL};
use std::path::Path;
use std::process::Command;

const STUDIO: &str = "kind = \"gemini\"\nmodel = \"gemini-2.0-flash\"\n\
api_key_env = \"GEMINI_API_KEY\"\ntokenizer = \"o200k_base\"\ncontext_window = 1048576\n";

const VERTEX: &str = "kind = \"gemini\"\nmodel = \"gemini-2.0-flash\"\n\
vertex_project = \"my-project\"\nvertex_location = \"us-central1\"\n\
credentials_env = \"ONEJOB_TEST_NATIVE_SA\"\ntokenizer = \"o200k_base\"\ncontext_window = 1048576\n";

const AZURE: &str =
    "kind = \"azure_openai\"\nbase_url = \"https://my-resource.openai.azure.com\"\n\
model = \"gpt-4o\"\ndeployment = \"gpt-4o-prod\"\napi_version = \"2024-10-21\"\n\
api_key_env = \"AZURE_OPENAI_API_KEY\"\ntokenizer = \"o200k_base\"\ncontext_window = 128000\n";

const PASTED: &str = "AIzaSyPASTED-0123456789abcdefghijklmno";

fn parse(text: &str) -> Result<ProviderConfig, String> {
    ProviderConfig::parse(text, Path::new("providers/native.toml")).map_err(|e| e.to_string())
}

#[test]
fn good_files_of_each_kind_load_with_googles_endpoints_by_default() {
    let studio = parse(STUDIO).unwrap();
    assert_eq!(studio.kind, ProviderKind::Gemini);
    assert_eq!(studio.base_url, GEMINI_AI_STUDIO_URL);
    let vertex = parse(VERTEX).unwrap();
    assert_eq!(
        vertex.base_url,
        "https://us-central1-aiplatform.googleapis.com"
    );
    let azure = parse(AZURE).unwrap();
    assert_eq!(azure.kind, ProviderKind::AzureOpenai);
    assert_eq!(azure.deployment.as_deref(), Some("gpt-4o-prod"));
    // Neither can look an attempt up by key, and neither stores.
    for config in [&studio, &vertex, &azure] {
        assert_eq!(config.lookup, onejob::providers::config::LookupMode::None);
        assert!(!config.continues_prefill());
    }
    let stored = format!("{AZURE}store = true\n");
    assert!(parse(&stored).unwrap_err().contains("store"));
}

#[test]
fn each_bad_file_names_the_file_the_line_and_the_field() {
    let cases: Vec<(String, &str, &str)> = vec![
        // (text, the field named, the line named)
        (
            STUDIO.replace("api_key_env = \"GEMINI_API_KEY\"\n", ""),
            "api_key_env",
            "",
        ),
        (
            VERTEX.replace("vertex_location = \"us-central1\"\n", ""),
            "vertex_location",
            "",
        ),
        (
            VERTEX.replace("credentials_env = \"ONEJOB_TEST_NATIVE_SA\"\n", ""),
            "credentials_env",
            "",
        ),
        (
            VERTEX.replace("us-central1", "us central/1"),
            "vertex_location",
            "line 4",
        ),
        (
            STUDIO.replace(
                "model = \"gemini-2.0-flash\"\n",
                "model = \"m\"\nvertex_location = \"eu\"\n",
            ),
            "vertex_location",
            "line 3",
        ),
        (
            format!("{STUDIO}deployment = \"d\"\n"),
            "deployment",
            "line 6",
        ),
        (
            AZURE.replace("deployment = \"gpt-4o-prod\"\n", ""),
            "deployment",
            "",
        ),
        (
            AZURE.replace("api_version = \"2024-10-21\"\n", ""),
            "api_version",
            "",
        ),
        (
            AZURE.replace("api_version = \"2024-10-21\"", "api_version = 2024"),
            "api_version",
            "line 5",
        ),
        (
            AZURE.replace("https://my-resource.openai.azure.com", "my-resource"),
            "base_url",
            "line 2",
        ),
        (
            AZURE.replace("base_url = \"https://my-resource.openai.azure.com\"\n", ""),
            "base_url",
            "",
        ),
        (
            format!("{AZURE}azure_auth = \"cookie\"\n"),
            "azure_auth",
            "line 9",
        ),
        (
            format!("{AZURE}vertex_project = \"p\"\n"),
            "vertex_project",
            "line 9",
        ),
        (format!("{VERTEX}colour = \"red\"\n"), "colour", "line 8"),
    ];
    for (text, field, line) in cases {
        let message = parse(&text).expect_err(&text);
        assert!(message.starts_with("providers/native.toml: "), "{message}");
        assert!(message.contains(field), "{field}: {message}");
        assert!(message.contains(line), "{field} {line}: {message}");
    }
}

#[test]
fn a_credential_pasted_into_the_file_is_never_printed_back() {
    let json_key = r#"{\"type\": \"service_account\", \"private_key\": \"-----BEGIN PRIVATE KEY-----PASTED\"}"#;
    let cases = [
        STUDIO.replace("GEMINI_API_KEY", PASTED),
        format!("{STUDIO}api_key = \"{PASTED}\"\n"),
        VERTEX.replace("ONEJOB_TEST_NATIVE_SA", PASTED),
        VERTEX.replace("ONEJOB_TEST_NATIVE_SA", json_key),
        VERTEX.replace("ONEJOB_TEST_NATIVE_SA", "/etc/keys/PASTED-sa.json"),
        AZURE.replace("AZURE_OPENAI_API_KEY", PASTED),
    ];
    for (i, text) in cases.iter().enumerate() {
        let message = parse(text).expect_err(text);
        assert!(
            message.contains("providers/native.toml"),
            "case {i}: {message}"
        );
        assert!(!message.contains("PASTED"), "case {i} leaks: {message}");
    }
}

#[test]
fn a_vertex_key_file_that_is_missing_or_broken_is_named_never_shown() {
    let config = parse(VERTEX).unwrap();
    std::env::remove_var("ONEJOB_TEST_NATIVE_SA");
    let err = built_err(&config);
    assert!(
        err.contains("providers/native.toml")
            && err.contains("credentials_env")
            && err.contains("ONEJOB_TEST_NATIVE_SA")
            && err.contains("not set"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sa.json");
    let secret_body = "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC-SECRET-BODY";
    std::fs::write(
        &path,
        format!(
            r#"{{"type": "service_account", "client_email": "a@b.iam.gserviceaccount.com",
               "private_key": "-----BEGIN PRIVATE KEY-----\n{secret_body}\n-----END PRIVATE KEY-----\n"}}"#
        ),
    )
    .unwrap();
    std::env::set_var("ONEJOB_TEST_NATIVE_SA", &path);
    let err = built_err(&config);
    assert!(
        err.contains("sa.json") && err.contains("private_key"),
        "{err}"
    );
    assert!(!err.contains("SECRET"), "{err}");
}

fn built_err(config: &ProviderConfig) -> String {
    match build_provider("vertex", config) {
        Ok(_) => panic!("built without usable credentials"),
        Err(e) => e.to_string(),
    }
}

fn onejob_validate(dir: &Path) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(["serve", "--validate", "--config"])
        .arg(dir.join("onejob.toml"))
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .env("RUST_LOG", "warn")
        .output()
        .unwrap();
    assert!(!output.status.success());
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

#[test]
fn serve_validate_explains_a_bad_file_of_each_kind_without_its_secret() {
    for (kind, bad, line) in [
        (
            "gemini",
            format!("{STUDIO}api_key = \"{PASTED}\"\n"),
            "line 6",
        ),
        ("vertex", VERTEX.replace("us-central1", PASTED), "line 4"),
        (
            "azure_openai",
            AZURE.replace("2024-10-21", PASTED),
            "line 5",
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let providers = dir.path().join("providers");
        std::fs::create_dir(&providers).unwrap();
        std::fs::write(providers.join("broken.toml"), &bad).unwrap();
        std::fs::write(
            dir.path().join("onejob.toml"),
            "[server]\nproviders_dir = \"providers\"\ndatabase_url = \"onejob.db\"\n",
        )
        .unwrap();
        let all = onejob_validate(dir.path());
        assert!(
            all.contains("broken.toml") && all.contains(line),
            "{kind}: {all}"
        );
        assert!(!all.contains("PASTED"), "{kind} leaks: {all}");
    }
}

#[test]
fn the_example_file_of_each_kind_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("providers/examples");
    for (file, kind) in [
        ("gemini.toml", ProviderKind::Gemini),
        ("vertex.toml", ProviderKind::Gemini),
        ("azure_openai.toml", ProviderKind::AzureOpenai),
    ] {
        let config = ProviderConfig::load(&dir.join(file)).unwrap();
        assert_eq!(config.kind, kind, "{file}");
    }
    let vertex = ProviderConfig::load(&dir.join("vertex.toml")).unwrap();
    assert_eq!(
        vertex.base_url,
        "https://us-central1-aiplatform.googleapis.com"
    );
}

const BEDROCK: &str = "kind = \"bedrock\"\nregion = \"us-east-1\"\n\
model = \"us.anthropic.claude-3-5-sonnet-20241022-v2:0\"\n\
access_key_id_env = \"ONEJOB_TEST_NATIVE_AWS_KEY_ID\"\n\
secret_access_key_env = \"ONEJOB_TEST_NATIVE_AWS_SECRET\"\n\
tokenizer = \"cl100k_base\"\ncontext_window = 200000\n";

/// What an AWS secret access key looks like, pasted where a name belongs.
const PASTED_AWS: &str = "PASTEDwJalrXUtnFEMI/K7MDENG+bPxRfiCYzzzKEY";

#[test]
fn a_bedrock_file_loads_with_the_regions_endpoint_and_no_lookup() {
    let config = parse(BEDROCK).unwrap();
    assert_eq!(config.kind, ProviderKind::Bedrock);
    assert_eq!(
        config.base_url,
        "https://bedrock-runtime.us-east-1.amazonaws.com"
    );
    assert_eq!(config.lookup, onejob::providers::config::LookupMode::None);
    assert!(!config.continues_prefill());
    let overridden = BEDROCK.replace(
        "region = \"us-east-1\"\n",
        "region = \"us-east-1\"\nbase_url = \"https://vpce-1.bedrock-runtime.us-east-1.vpce.amazonaws.com\"\n",
    );
    assert_eq!(
        parse(&overridden).unwrap().base_url,
        "https://vpce-1.bedrock-runtime.us-east-1.vpce.amazonaws.com"
    );
}

#[test]
fn each_bad_bedrock_file_names_the_file_the_line_and_the_field() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            BEDROCK.replace("region = \"us-east-1\"\n", ""),
            "region",
            "",
        ),
        (
            BEDROCK.replace("us-east-1", "US East 1"),
            "region",
            "line 2",
        ),
        (
            format!("{BEDROCK}api_key_env = \"AWS_KEY\"\n"),
            "api_key_env",
            "line 8",
        ),
        (
            BEDROCK.replace("ONEJOB_TEST_NATIVE_AWS_SECRET", "not a name"),
            "secret_access_key_env",
            "line 5",
        ),
        (
            format!("{BEDROCK}lookup = \"openai_stored\"\n"),
            "lookup",
            "line 8",
        ),
        (format!("{BEDROCK}store = true\n"), "store", "line 8"),
        (
            format!("{STUDIO}region = \"us-east-1\"\n"),
            "region",
            "line 6",
        ),
        (
            format!("{BEDROCK}aws_secret_access_key = \"x\"\n"),
            "aws_secret_access_key",
            "line 8",
        ),
    ];
    for (text, field, line) in cases {
        let message = parse(&text).expect_err(&text);
        assert!(message.starts_with("providers/native.toml: "), "{message}");
        assert!(message.contains(field), "{field}: {message}");
        assert!(message.contains(line), "{field} {line}: {message}");
    }
}

#[test]
fn an_aws_credential_pasted_into_the_file_is_never_printed_back() {
    let cases = [
        BEDROCK.replace("ONEJOB_TEST_NATIVE_AWS_SECRET", PASTED_AWS),
        BEDROCK.replace("ONEJOB_TEST_NATIVE_AWS_KEY_ID", PASTED_AWS),
        format!("{BEDROCK}session_token_env = \"{PASTED_AWS}\"\n"),
        format!("{BEDROCK}aws_secret_access_key = \"{PASTED_AWS}\"\n"),
        BEDROCK.replace("us-east-1", PASTED_AWS),
    ];
    for (i, text) in cases.iter().enumerate() {
        let message = parse(text).expect_err(text);
        assert!(
            message.contains("providers/native.toml"),
            "case {i}: {message}"
        );
        assert!(!message.contains("PASTED"), "case {i} leaks: {message}");
    }
}

#[test]
fn missing_aws_credentials_are_named_by_their_variable_never_shown() {
    let config = parse(BEDROCK).unwrap();
    std::env::remove_var("ONEJOB_TEST_NATIVE_AWS_KEY_ID");
    std::env::set_var("ONEJOB_TEST_NATIVE_AWS_SECRET", PASTED_AWS);
    let err = match build_provider("bedrock", &config) {
        Ok(_) => panic!("built without an access key id"),
        Err(e) => e.to_string(),
    };
    assert!(
        err.contains("providers/native.toml")
            && err.contains("access_key_id_env")
            && err.contains("ONEJOB_TEST_NATIVE_AWS_KEY_ID")
            && err.contains("not set"),
        "{err}"
    );
    assert!(!err.contains("PASTED"), "{err}");
    std::env::set_var("ONEJOB_TEST_NATIVE_AWS_KEY_ID", "AKIDEXAMPLE");
    let built = build_provider("bedrock", &config).unwrap();
    assert_eq!(built.name(), "bedrock");
}

#[test]
fn serve_validate_explains_a_bad_bedrock_file_without_its_secret() {
    let dir = tempfile::tempdir().unwrap();
    let providers = dir.path().join("providers");
    std::fs::create_dir(&providers).unwrap();
    let bad = BEDROCK.replace("ONEJOB_TEST_NATIVE_AWS_SECRET", PASTED_AWS);
    std::fs::write(providers.join("broken.toml"), &bad).unwrap();
    std::fs::write(
        dir.path().join("onejob.toml"),
        "[server]\nproviders_dir = \"providers\"\ndatabase_url = \"onejob.db\"\n",
    )
    .unwrap();
    let all = onejob_validate(dir.path());
    assert!(
        all.contains("broken.toml")
            && all.contains("line 5")
            && all.contains("secret_access_key_env"),
        "{all}"
    );
    assert!(!all.contains("PASTED"), "leaks: {all}");
}

/// `--validate` refuses what the server's start refuses: credentials a
/// file names but the environment does not hold (an API key is checked by
/// `serve_validate_explains_a_bad_file_of_each_kind_without_its_secret`).
#[test]
fn serve_validate_names_the_credentials_start_would_miss() {
    for (kind, file, var) in [
        (
            "bedrock",
            BEDROCK.replace(
                "ONEJOB_TEST_NATIVE_AWS_KEY_ID",
                "ONEJOB_TEST_VALIDATE_UNSET_KEY_ID",
            ),
            "ONEJOB_TEST_VALIDATE_UNSET_KEY_ID",
        ),
        (
            "vertex",
            VERTEX.replace("ONEJOB_TEST_NATIVE_SA", "ONEJOB_TEST_VALIDATE_UNSET_SA"),
            "ONEJOB_TEST_VALIDATE_UNSET_SA",
        ),
    ] {
        assert!(std::env::var_os(var).is_none(), "{var} must be unset");
        let dir = tempfile::tempdir().unwrap();
        let providers = dir.path().join("providers");
        std::fs::create_dir(&providers).unwrap();
        std::fs::write(providers.join("needs-credentials.toml"), &file).unwrap();
        std::fs::write(
            dir.path().join("onejob.toml"),
            "[server]\nproviders_dir = \"providers\"\ndatabase_url = \"onejob.db\"\n\
             [routes.default]\nprimary = \"needs-credentials\"\n",
        )
        .unwrap();
        let all = onejob_validate(dir.path());
        assert!(
            all.contains("needs-credentials.toml") && all.contains(var),
            "{kind}: {all}"
        );
        assert!(!all.contains("config ok"), "{kind}: {all}");
    }
}

#[test]
fn the_bedrock_example_file_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("providers/examples");
    let config = ProviderConfig::load(&dir.join("bedrock.toml")).unwrap();
    assert_eq!(config.kind, ProviderKind::Bedrock);
    assert_eq!(
        config.base_url,
        "https://bedrock-runtime.us-east-1.amazonaws.com"
    );
    assert!(config.model.contains(':'), "an inference-profile id");
}
