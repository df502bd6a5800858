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

/// The venv of `tests/python/requirements-instructor.txt`: instructor caps
/// `jiter` below what the pinned `openai` 3.x needs, so it gets a venv of
/// its own, with the newest openai 2.x it takes.
pub const INSTRUCTOR_PYTHON_ENV: &str = "ONEJOB_TEST_PYTHON_INSTRUCTOR";

/// The Python with instructor installed, or `None` (and one loud line on
/// the real stderr per test binary).
pub fn instructor_python() -> Option<PathBuf> {
    match std::env::var(INSTRUCTOR_PYTHON_ENV) {
        Ok(path) if !path.is_empty() => Some(PathBuf::from(path)),
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED (instructor): the instructor tests pass without running; run .ci/run, or set \
                     {INSTRUCTOR_PYTHON_ENV}=/tmp/onejob-venv-instructor/bin/python \
                     (a venv with tests/python/requirements-instructor.txt)"
                );
            });
            None
        }
    }
}

/// Run `cases` of `tests/python/sdk_cases.py`, in order in one Python
/// process, against the server at `address` as the holder of `api_key`;
/// what each printed, as JSON. A case's own assertion failure fails the
/// test with its stderr.
pub async fn sdk_cases<const N: usize>(
    python: &PathBuf,
    address: &str,
    api_key: &str,
    cases: [&str; N],
) -> [Value; N] {
    cases_of("sdk_cases.py", python, address, api_key, cases).await
}

/// [`sdk_cases`] of another script in `tests/python/` (one per SDK).
pub async fn cases_of<const N: usize>(
    script: &str,
    python: &PathBuf,
    address: &str,
    api_key: &str,
    cases: [&str; N],
) -> [Value; N] {
    cases_with(script, python, address, api_key, &[], cases).await
}

/// [`cases_of`] with more variables set for the script.
pub async fn cases_with<const N: usize>(
    script: &str,
    python: &PathBuf,
    address: &str,
    api_key: &str,
    envs: &[(&str, &str)],
    cases: [&str; N],
) -> [Value; N] {
    let script = format!("{}/tests/python/{script}", env!("CARGO_MANIFEST_DIR"));
    let output = tokio::process::Command::new(python)
        .arg(&script)
        .args(cases)
        .env("ONEJOB_BASE_URL", address)
        .env("ONEJOB_API_KEY", api_key)
        .envs(envs.iter().copied())
        .output()
        .await
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "SDK cases {cases:?} failed ({}):\n{}\n{stdout}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), N, "cases {cases:?} printed {stdout:?}");
    std::array::from_fn(|i| {
        serde_json::from_str(lines[i].trim())
            .unwrap_or_else(|e| panic!("case {} printed {:?}: {e}", cases[i], lines[i]))
    })
}
