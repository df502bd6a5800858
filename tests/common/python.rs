//! The official `openai` Python SDK against a running server: `.ci/run`
//! makes a venv with `tests/python/requirements.txt` and exports
//! `ONEJOB_TEST_PYTHON`; without it these tests skip loudly.

use serde_json::Value;
use std::path::PathBuf;

pub const PYTHON_ENV: &str = "ONEJOB_TEST_PYTHON";

/// The Python with the SDK installed, or `None` (and one loud line on the
/// real stderr per test binary) when the SDK tests are not enabled.
pub fn python() -> Option<PathBuf> {
    match std::env::var(PYTHON_ENV) {
        Ok(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED (Python SDK): the openai SDK tests pass without running; run .ci/run, \
                     or set {PYTHON_ENV}=/tmp/onejob-venv/bin/python (a venv with tests/python/requirements.txt)"
                );
            });
            None
        }
    }
}

/// Run `case` of `tests/python/sdk_cases.py` against the server at
/// `address` as the holder of `api_key`; what it printed, as JSON. The
/// case's own assertion failures fail the test with its stderr.
pub async fn sdk_case(python: &PathBuf, address: &str, api_key: &str, case: &str) -> Value {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/sdk_cases.py");
    let output = tokio::process::Command::new(python)
        .arg(script)
        .arg(case)
        .env("ONEJOB_BASE_URL", address)
        .env("ONEJOB_API_KEY", api_key)
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "SDK case {case} failed ({}):\n{}\n{stdout}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("case {case} printed {stdout:?}: {e}"))
}
