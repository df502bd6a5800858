//! Secret hygiene: one run through everything that touches a secret — key
//! creation, use, rotation and revocation (CLI and HTTP), a provider called
//! with its API key, failed logins, limits, usage, and provider files with a
//! key pasted where it must not be — with every log line (TRACE, server and
//! simulator), every CLI output and every error body collected; none may
//! contain a secret's value (whole, or the part after `oj_`). The only texts
//! allowed to show a key are the answers whose purpose is to show it once:
//! the last line of `keys create` / `keys rotate`, and the body of a
//! successful key creation or rotation.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::TestDb;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const PROVIDER_KEY_ENV: &str = "ONEJOB_TEST_HYGIENE_PROVIDER_KEY";
const PROVIDER_KEY: &str = "sk-hygiene-provider-7f3a9c2e1b";
const PASTED: &str = "sk-hygiene-pasted-0d9e8f7a6b";

/// Everything the run printed, and which secrets it must not contain.
#[derive(Default)]
struct Collected {
    texts: Vec<(String, String)>,
    secrets: Vec<String>,
}

impl Collected {
    fn add(&mut self, what: impl Into<String>, text: impl Into<String>) {
        self.texts.push((what.into(), text.into()));
    }

    fn secret(&mut self, s: &str) {
        self.secrets.push(s.to_string());
        if let Some(body) = s.strip_prefix("oj_") {
            self.secrets.push(body.to_string());
        }
    }

    fn assert_clean(&self) {
        let mut leaks = Vec::new();
        for (what, text) in &self.texts {
            for secret in &self.secrets {
                if text.contains(secret.as_str()) {
                    let line = text
                        .lines()
                        .find(|l| l.contains(secret.as_str()))
                        .unwrap_or("");
                    leaks.push(format!("{what} shows {secret}: {line}"));
                }
            }
        }
        assert!(leaks.is_empty(), "secrets leaked:\n{}", leaks.join("\n"));
        let lines: usize = self.texts.iter().map(|(_, t)| t.lines().count()).sum();
        eprintln!(
            "secret hygiene: {} texts, {lines} lines, {} secret values checked",
            self.texts.len(),
            self.secrets.len()
        );
    }
}

/// `onejob ARGS`; (stdout, stderr), asserting it succeeded when `ok`.
fn cli(args: &[&str], ok: bool) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(args)
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .env("RUST_LOG", "trace")
        .env(PROVIDER_KEY_ENV, PROVIDER_KEY)
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.success(), ok, "{args:?}: {stdout}{stderr}");
    (stdout, stderr)
}

/// The key a `keys create`/`rotate` printed on its last line, and the output without it.
fn shown_once(stdout: &str) -> (String, String) {
    let mut lines: Vec<&str> = stdout.lines().collect();
    let key = lines.pop().unwrap().to_string();
    assert!(key.starts_with("oj_"), "{stdout}");
    (key, lines.join("\n"))
}

/// A child whose stdout's first line is its address; stderr (the logs) to `log`.
fn spawn_logged(args: &[&str], log: &Path, prefix: &str) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_onejob"))
        .args(args)
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .env("RUST_LOG", "trace")
        .env(PROVIDER_KEY_ENV, PROVIDER_KEY)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let address = line
        .trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{line}"))
        .to_string();
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    (child, address)
}

fn terminate(mut child: Child) {
    Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    child.wait().unwrap();
}

async fn call(
    c: &mut Collected,
    method: reqwest::Method,
    url: &str,
    bearer: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = reqwest::Client::new()
        .request(method, url)
        .bearer_auth(bearer)
        .header("Idempotency-Key", "hygiene-1")
        .header("Prefer", "wait=20");
    if let Some(b) = body {
        request = request.json(&b);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    if status >= 400 {
        c.add(format!("error body of {url} ({status})"), text.clone());
    }
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_log_line_cli_output_or_error_body_shows_a_secret() {
    let mut c = Collected::default();
    c.secret(PROVIDER_KEY);
    c.secret(PASTED);
    let dir = tempfile::tempdir().unwrap();
    let db = TestDb::new(common::Backend::Sqlite).await;
    let url = db.url_string();

    // The simulator, and a provider of kind openai that calls it with an API key.
    let sim_log = dir.path().join("sim.log");
    let (sim, sim_address) = spawn_logged(
        &["sim", "--listen", "127.0.0.1:0"],
        &sim_log,
        "onejob sim listening on ",
    );
    let providers = dir.path().join("providers");
    std::fs::create_dir(&providers).unwrap();
    std::fs::write(
        providers.join("up.toml"),
        format!(
            "kind = \"openai\"\nbase_url = \"{sim_address}\"\nmodel = \"healthy\"\napi_key_env = \"{PROVIDER_KEY_ENV}\"\n\
             tokenizer = \"o200k_base\"\ncontext_window = 16384\n"
        ),
    )
    .unwrap();
    let config = dir.path().join("onejob.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nproviders_dir = {:?}\ncontracts_dir = {:?}\n\n[routes.default]\nprimary = \"up\"\n\n\
             [limits.default]\ntokens_per_day = 1000000\n",
            providers.display().to_string(),
            dir.path().join("contracts").display().to_string()
        ),
    )
    .unwrap();
    let cfg = config.display().to_string();
    let db_args = ["--config", cfg.as_str(), "--database-url", url.as_str()];
    let with = |args: &[&str]| -> Vec<String> {
        args.iter()
            .chain(db_args.iter())
            .map(|s| s.to_string())
            .collect()
    };
    let run = |c: &mut Collected, args: Vec<String>, ok: bool| -> String {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let (stdout, stderr) = cli(&refs, ok);
        c.add(format!("stderr of onejob {}", args.join(" ")), stderr);
        stdout
    };

    // Keys from the CLI: shown once, on the last line.
    let out = run(
        &mut c,
        with(&["keys", "create", "--owner", "ops", "--admin"]),
        true,
    );
    let (admin, rest) = shown_once(&out);
    c.secret(&admin);
    c.add("keys create (ops)", rest);
    let out = run(
        &mut c,
        with(&["keys", "create", "--owner", "alice", "--expires-in", "30d"]),
        true,
    );
    let (alice, rest) = shown_once(&out);
    c.secret(&alice);
    c.add("keys create (alice)", rest);

    // The server, logging everything.
    let serve_log = dir.path().join("serve.log");
    let serve_args = with(&["serve", "--listen", "127.0.0.1:0"]);
    let refs: Vec<&str> = serve_args.iter().map(String::as_str).collect();
    let (server, address) = spawn_logged(&refs, &serve_log, "onejob listening on ");
    let base = address.clone();

    // A job through the provider's API key; a replay; a conflict; bad input.
    let job = json!({ "messages": [{ "role": "user", "content": "hello" }] });
    let (status, answer) = call(
        &mut c,
        reqwest::Method::POST,
        &format!("{base}/v1/jobs"),
        &alice,
        Some(job.clone()),
    )
    .await;
    assert_eq!(
        (status, answer["state"].as_str()),
        (201, Some("succeeded")),
        "{answer}"
    );
    call(
        &mut c,
        reqwest::Method::POST,
        &format!("{base}/v1/jobs"),
        &alice,
        Some(job),
    )
    .await;
    let (status, _) = call(
        &mut c,
        reqwest::Method::POST,
        &format!("{base}/v1/jobs"),
        &alice,
        Some(json!({ "messages": [{ "role": "user", "content": PASTED }] })),
    )
    .await;
    assert_eq!(status, 409);
    let (status, _) = call(
        &mut c,
        reqwest::Method::POST,
        &format!("{base}/v1/chat/completions"),
        &alice,
        Some(json!({ "model": PASTED, "messages": [] })),
    )
    .await;
    assert_eq!(status, 422);
    // Keys that do not open the door: a well-formed unknown key, the provider's key.
    let forged = format!("oj_{}", "ab".repeat(32));
    c.secret(&forged);
    for bearer in [forged.as_str(), PROVIDER_KEY, PASTED] {
        let (status, _) = call(
            &mut c,
            reqwest::Method::GET,
            &format!("{base}/v1/usage"),
            bearer,
            None,
        )
        .await;
        assert_eq!(status, 401);
    }
    // Admin: list, rotate (the body shows the new key once), revoke, limits, usage.
    let (status, listed) = call(
        &mut c,
        reqwest::Method::GET,
        &format!("{base}/v1/admin/keys"),
        &admin,
        None,
    )
    .await;
    assert_eq!(status, 200);
    c.add("GET /v1/admin/keys", listed.to_string());
    let alice_id = listed["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["owner"] == "alice")
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (status, rotated) = call(
        &mut c,
        reqwest::Method::POST,
        &format!("{base}/v1/admin/keys/{alice_id}/rotate"),
        &admin,
        Some(json!({ "grace": "1h" })),
    )
    .await;
    assert_eq!(status, 200);
    let new_alice = rotated["secret"].as_str().unwrap().to_string();
    c.secret(&new_alice);
    let (status, _) = call(
        &mut c,
        reqwest::Method::GET,
        &format!("{base}/v1/usage"),
        &new_alice,
        None,
    )
    .await;
    assert_eq!(status, 200);
    call(
        &mut c,
        reqwest::Method::POST,
        &format!("{base}/v1/admin/limits/alice"),
        &admin,
        Some(json!({ "limits": { "requests_per_second": -1 }, "reason": alice.clone() })),
    )
    .await;
    let (status, _) = call(
        &mut c,
        reqwest::Method::GET,
        &format!("{base}/v1/admin/keys"),
        &alice,
        None,
    )
    .await;
    assert_eq!(status, 403);
    let out = run(&mut c, with(&["keys", "rotate", &alice_id]), false);
    c.add("keys rotate (refused)", out);
    let out = run(&mut c, with(&["keys", "list"]), true);
    c.add("keys list", out);
    let out = run(&mut c, with(&["usage"]), true);
    c.add("usage", out);
    let out = run(&mut c, with(&["limits", "show"]), true);
    c.add("limits show", out);
    let out = run(&mut c, with(&["providers", "list"]), true);
    c.add("providers list", out);
    let out = run(&mut c, with(&["keys", "revoke", &alice_id]), true);
    c.add("keys revoke", out);

    // Provider files with a key pasted where it must not be.
    for (name, text) in [
        ("pasted.toml", format!("kind = \"sim\"\nbase_url = \"{sim_address}\"\nmodel = \"m\"\ntokenizer = \"o200k_base\"\ncontext_window = 1\napi_key = \"{PASTED}\"\n")),
        ("env.toml", format!("kind = \"openai\"\nbase_url = \"{sim_address}\"\nmodel = \"m\"\ntokenizer = \"o200k_base\"\ncontext_window = 1\napi_key_env = \"{PASTED}\"\n")),
    ] {
        let bad = dir.path().join(format!("bad-{name}"));
        std::fs::create_dir(&bad).unwrap();
        std::fs::write(bad.join(name), text).unwrap();
        let bad_config = dir.path().join(format!("bad-{name}.onejob.toml"));
        std::fs::write(&bad_config, format!("[server]\nproviders_dir = {:?}\n", bad.display().to_string())).unwrap();
        let (stdout, stderr) = cli(&["serve", "--validate", "--config", &bad_config.display().to_string(), "--database-url", &url], false);
        assert!(stderr.contains(name), "{stderr}");
        c.add(format!("serve --validate ({name})"), format!("{stdout}{stderr}"));
    }

    terminate(server);
    terminate(sim);
    let serve_text = std::fs::read_to_string(&serve_log).unwrap();
    assert!(
        serve_text.contains("TRACE") || serve_text.contains("DEBUG"),
        "the server logged at a low level"
    );
    c.add("server log", serve_text);
    c.add("simulator log", std::fs::read_to_string(&sim_log).unwrap());
    c.assert_clean();
}
