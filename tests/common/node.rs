//! Node clients (tests/node/package.json, installed by `npm ci --prefix
//! tests/node`) against a running server: `.ci/run` installs them and
//! exports `ONEJOB_TEST_NODE`; without it these tests skip loudly.

use serde_json::Value;
use std::path::PathBuf;

pub const NODE_ENV: &str = "ONEJOB_TEST_NODE";

/// The `node` to run the cases with, or `None` (and one loud line on the
/// real stderr per test binary) when the Node client tests are not enabled.
/// Enabled without the packages installed, it fails saying how to install them.
pub fn node() -> Option<PathBuf> {
    match std::env::var(NODE_ENV) {
        Ok(path) if !path.is_empty() => {
            let modules = format!("{}/tests/node/node_modules", env!("CARGO_MANIFEST_DIR"));
            assert!(
                std::path::Path::new(&modules).join("ai").is_dir(),
                "{NODE_ENV} is set but {modules} has no clients: run `npm ci --prefix tests/node`"
            );
            Some(PathBuf::from(path))
        }
        _ => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                use std::io::Write;
                let _ = writeln!(
                    std::io::stderr(),
                    "SKIPPED (Node clients): the openai-node and AI SDK tests pass without running; \
                     run .ci/run, or `npm ci --prefix tests/node` and set {NODE_ENV}=node"
                );
            });
            None
        }
    }
}

/// Run `cases` of `tests/node/cases.mjs`, in order in one Node process,
/// against the server at `address` as the holder of `api_key`; what each
/// printed, as JSON.
pub async fn node_cases<const N: usize>(
    node: &std::path::Path,
    address: &str,
    api_key: &str,
    cases: [&str; N],
) -> [Value; N] {
    let script = format!("{}/tests/node/cases.mjs", env!("CARGO_MANIFEST_DIR"));
    let output = tokio::process::Command::new(node)
        .arg(&script)
        .args(cases)
        .env("ONEJOB_BASE_URL", address)
        .env("ONEJOB_API_KEY", api_key)
        .kill_on_drop(true)
        .output()
        .await
        .unwrap_or_else(|e| panic!("{node:?} {script}: {e}"));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "Node cases {cases:?} failed ({}):\n{}\n{stdout}",
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
