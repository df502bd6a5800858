//! Provider configuration errors name the file, the line and the field, and
//! a key never shows.
#![allow(clippy::unwrap_used)]

mod upstream;

use onejob::providers::build_provider;
use onejob::providers::config::{load_dir, ProviderConfig};
use std::path::Path;

const VALID: &str = "kind = \"openai\"\nbase_url = \"http://127.0.0.1:9\"\nmodel = \"m\"\n\
api_key_env = \"ONEJOB_TEST_SURELY_UNSET_KEY\"\ntokenizer = \"o200k_base\"\ncontext_window = 8192\n";

#[test]
fn unknown_field_names_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("good.toml"), VALID.replace("openai", "sim")).unwrap();
    std::fs::write(
        dir.path().join("bad.toml"),
        format!("{VALID}colour = \"red\"\n"),
    )
    .unwrap();
    let message = load_dir(dir.path()).unwrap_err().to_string();
    assert!(message.contains("bad.toml"), "{message}");
    assert!(message.contains("line 7"), "{message}");
    assert!(message.contains("colour"), "{message}");
}

#[test]
fn missing_key_variable_names_file_field_and_variable() {
    let config = ProviderConfig::parse(VALID, Path::new("providers/openai.toml")).unwrap();
    let Err(err) = build_provider("openai", &config) else {
        panic!("built without a key")
    };
    let message = err.to_string();
    for part in [
        "providers/openai.toml",
        "api_key_env",
        "ONEJOB_TEST_SURELY_UNSET_KEY",
    ] {
        assert!(message.contains(part), "{message} lacks {part}");
    }
}

#[test]
fn the_key_never_shows_in_debug_output() {
    std::env::set_var(upstream::KEY_ENV, upstream::KEY_VALUE);
    let text = VALID.replace("ONEJOB_TEST_SURELY_UNSET_KEY", upstream::KEY_ENV);
    let config = ProviderConfig::parse(&text, Path::new("providers/openai.toml")).unwrap();
    let key = config.resolve_api_key().unwrap();
    assert_eq!(key.as_ref().map(|k| k.expose()), Some(upstream::KEY_VALUE));
    let shown = format!("{key:?} {config:?}");
    assert!(!shown.contains(upstream::KEY_VALUE), "{shown}");
}

#[tokio::test]
async fn unreachable_base_url_names_file_and_url() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let text = VALID.replace("http://127.0.0.1:9", &url);
    let config = ProviderConfig::parse(&text, Path::new("providers/down.toml")).unwrap();
    let message = config.check_reachable().await.unwrap_err().to_string();
    assert!(
        message.contains("providers/down.toml") && message.contains(&url),
        "{message}"
    );

    let up = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let text = VALID.replace(
        "http://127.0.0.1:9",
        &format!("http://{}", up.local_addr().unwrap()),
    );
    let config = ProviderConfig::parse(&text, Path::new("providers/up.toml")).unwrap();
    config.check_reachable().await.unwrap();
}

#[test]
fn shipped_provider_files_load_and_differ_in_digest() {
    let providers = load_dir(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("providers")
            .as_path(),
    )
    .unwrap();
    let sim = &providers["sim"];
    let backup = &providers["sim-backup"];
    assert_eq!(sim.base_url, "http://127.0.0.1:8090");
    assert_eq!(backup.model, "healthy:latency=20");
    assert_ne!(sim.digest(), backup.digest());
    assert_eq!(sim.digest().len(), 64);
}

const PASTED_SECRET: &str = "sk-live-PASTED0123456789abcdef";

#[test]
fn a_secret_pasted_into_a_provider_file_is_never_printed_back() {
    let cases = [
        // Where the variable name belongs.
        VALID.replace("ONEJOB_TEST_SURELY_UNSET_KEY", PASTED_SECRET),
        // Under a field that does not exist.
        format!("{VALID}api_key = \"{PASTED_SECRET}\"\n"),
        // As the value of a field of another type.
        VALID.replace("8192", &format!("\"{PASTED_SECRET}\"")),
        // As a URL.
        VALID.replace("http://127.0.0.1:9", PASTED_SECRET),
        // As a key name, bare.
        format!("{VALID}{PASTED_SECRET}\n"),
    ];
    for (i, text) in cases.iter().enumerate() {
        let err = ProviderConfig::parse(text, Path::new("providers/leaky.toml")).unwrap_err();
        let message = err.to_string();
        assert!(
            message.contains("providers/leaky.toml"),
            "case {i}: {message}"
        );
        assert!(
            !message.contains(PASTED_SECRET),
            "case {i} leaks: {message}"
        );
        assert!(
            !message.contains("PASTED"),
            "case {i} leaks a part: {message}"
        );
    }
    let err = ProviderConfig::parse(&cases[0], Path::new("p.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("api_key_env") && err.contains("NAME"), "{err}");
    let err = ProviderConfig::parse(&cases[1], Path::new("p.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("line 7") && err.contains("`api_key`"), "{err}");
    let err = ProviderConfig::parse(&cases[2], Path::new("p.toml"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("context_window"), "{err}");
}

#[test]
fn api_key_env_must_be_a_variable_name() {
    for bad in ["1KEY", "MY-KEY", "MY KEY", "K=V", "", "sk-abc"] {
        let text = VALID.replace("ONEJOB_TEST_SURELY_UNSET_KEY", bad);
        let err = ProviderConfig::parse(&text, Path::new("p.toml"));
        assert!(err.is_err(), "{bad:?} accepted");
    }
    for good in ["OPENAI_API_KEY", "_K", "k2"] {
        let text = VALID.replace("ONEJOB_TEST_SURELY_UNSET_KEY", good);
        ProviderConfig::parse(&text, Path::new("p.toml")).unwrap();
    }
}
