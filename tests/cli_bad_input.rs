//! The operator's commands refuse bad values before writing anything, with
//! one line that says what is wrong and never echoes a secret: values that
//! were once accepted and then broke the server (a budget too large to
//! compare, an owner no other command could name), and report paths found
//! unwritable only after the providers were called.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

/// A config beside a fresh SQLite file, with the shipped providers and
/// contracts; migrated.
fn setup(dir: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = dir.join("onejob.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndatabase_url = \"onejob.db\"\nproviders_dir = {:?}\ncontracts_dir = {:?}\n",
            root.join("providers"),
            root.join("contracts"),
        ),
    )
    .unwrap();
    let config = config.to_str().unwrap().to_string();
    let migrated = onejob(&["migrate", "--config", &config], &[]);
    assert!(migrated.status.success(), "{}", text(&migrated));
    config
}

fn onejob(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_onejob"));
    command
        .args(args)
        .env_remove("ONEJOB_CONFIG")
        .env_remove("ONEJOB_DATABASE_URL")
        .env_remove("ONEJOB_WEBHOOK_KEY")
        .env_remove(UNSET)
        .env("RUST_LOG", "warn")
        .env("USER", "tester");
    for (name, value) in env {
        command.env(name, value);
    }
    command.output().unwrap()
}

fn text(output: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Run `args`, which must fail naming `names` on stderr.
fn refused(args: &[&str], env: &[(&str, &str)], names: &str) -> String {
    let output = onejob(args, env);
    assert!(
        !output.status.success(),
        "{args:?} succeeded:\n{}",
        text(&output)
    );
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        stderr.contains(names),
        "{args:?} does not name {names:?}:\n{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

fn table(config: &str, args: &[&str]) -> String {
    let mut all = args.to_vec();
    all.extend(["--config", config]);
    let output = onejob(&all, &[]);
    assert!(output.status.success(), "{}", text(&output));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn bad_values_are_refused_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let c = config.as_str();
    let keys_before = table(c, &["keys", "list"]);
    let limits_before = table(c, &["limits", "show"]);

    // A budget past i64::MAX: once stored, every job of the key was refused.
    refused(
        &[
            "keys",
            "create",
            "--config",
            c,
            "--owner",
            "alice",
            "--tokens-per-day",
            "9223372036854775808",
        ],
        &[],
        "tokens-per-day",
    );
    refused(
        &[
            "limits",
            "set",
            "alice",
            "--config",
            c,
            "--tokens-per-day",
            "9223372036854775808",
            "--reason",
            "r",
        ],
        &[],
        "tokens-per-day",
    );
    // An owner no key could have.
    for owner in ["", " ", "al ice", &"x".repeat(129)] {
        refused(
            &[
                "limits", "set", owner, "--config", c, "--rps", "5", "--reason", "r",
            ],
            &[],
            "1-128 characters",
        );
    }
    // A filter by an owner no key could have is a mistake, not an empty list.
    for args in [
        vec!["keys", "list", "--owner", "al ice"],
        vec!["usage", "--owner", "al ice"],
        vec!["webhooks", "list", "--owner", "al ice"],
    ] {
        let mut all = args.clone();
        all.extend(["--config", c]);
        refused(&all, &[], "1-128 characters");
    }
    // A key expired as it is made.
    refused(
        &[
            "keys",
            "create",
            "--config",
            c,
            "--owner",
            "alice",
            "--expires-in",
            "0s",
        ],
        &[],
        "expires_in",
    );
    // Ranges the HTTP API has too.
    refused(&["usage", "--config", c, "--days", "0"], &[], "--days");
    refused(&["usage", "--config", c, "--days", "367"], &[], "--days");
    refused(
        &[
            "webhooks",
            "deliveries",
            "wh_x",
            "--config",
            c,
            "--limit",
            "501",
        ],
        &[],
        "--limit",
    );
    // A webhook endpoint for an owner no key could have.
    let keygen = onejob(&["webhooks", "keygen"], &[]);
    assert!(keygen.status.success(), "{}", text(&keygen));
    let webhook_key = String::from_utf8_lossy(&keygen.stdout).trim().to_string();
    refused(
        &[
            "webhooks",
            "create",
            "--config",
            c,
            "--owner",
            "al ice",
            "--url",
            "https://example.com/hook",
        ],
        &[("ONEJOB_WEBHOOK_KEY", &webhook_key)],
        "1-128 characters",
    );

    assert_eq!(table(c, &["keys", "list"]), keys_before);
    assert_eq!(table(c, &["limits", "show"]), limits_before);
    assert!(!table(c, &["webhooks", "list"]).contains("al ice"));

    // The same command with good values works, `--rps` included.
    let set = onejob(
        &[
            "limits", "set", "alice", "--config", c, "--rps", "5", "--reason", "launch",
        ],
        &[],
    );
    assert!(set.status.success(), "{}", text(&set));
    assert!(table(c, &["limits", "show"]).contains("launch"));
}

#[test]
fn a_secret_given_for_an_id_is_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let secret = format!("oj_{}", "a1".repeat(32));
    for action in ["revoke", "rotate"] {
        let stderr = refused(
            &["keys", action, &secret, "--config", &config],
            &[],
            "not its id",
        );
        assert!(!stderr.contains(&secret[3..]), "{stderr}");
    }
}

#[test]
fn an_unwritable_report_path_stops_contracts_run_before_any_run() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let nowhere = dir.path().join("no-such-dir/report.xml");
    refused(
        &[
            "contracts",
            "run",
            "--config",
            &config,
            "--junit",
            nowhere.to_str().unwrap(),
        ],
        &[],
        "cannot write JUnit XML",
    );
    // A report kept from an earlier run is not emptied when the other
    // path is the bad one.
    let earlier = dir.path().join("earlier.xml");
    std::fs::write(&earlier, "<testsuites/>").unwrap();
    let nowhere_json = dir.path().join("no-such-dir/report.json");
    let stderr = refused(
        &[
            "contracts",
            "run",
            "--config",
            &config,
            "--junit",
            earlier.to_str().unwrap(),
            "--json",
            nowhere_json.to_str().unwrap(),
        ],
        &[],
        "cannot write JSON",
    );
    assert!(stderr.contains("nothing was run"), "{stderr}");
    assert_eq!(std::fs::read_to_string(&earlier).unwrap(), "<testsuites/>");
    let db = rusqlite::Connection::open(dir.path().join("onejob.db")).unwrap();
    let runs: i64 = db
        .query_row("SELECT COUNT(*) FROM contract_runs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(runs, 0, "no run was stored");
}

/// A config beside a SQLite file that does not exist yet, with the shipped
/// contracts and a providers folder of the shipped `sim` and an OpenAI
/// provider whose key variable `UNSET` is not set; the database's path.
fn fresh(dir: &Path) -> (String, std::path::PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let providers = dir.join("providers");
    std::fs::create_dir(&providers).unwrap();
    std::fs::copy(root.join("providers/sim.toml"), providers.join("sim.toml")).unwrap();
    std::fs::write(
        providers.join("openai.toml"),
        format!(
            "kind = \"openai\"\nbase_url = \"https://api.openai.com\"\nmodel = \"gpt-4o-mini\"\n\
             api_key_env = \"{UNSET}\"\ntokenizer = \"o200k_base\"\ncontext_window = 128000\n"
        ),
    )
    .unwrap();
    std::fs::create_dir(dir.join("empty")).unwrap();
    let config = dir.join("onejob.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\ndatabase_url = \"onejob.db\"\nproviders_dir = \"providers\"\ncontracts_dir = {:?}\n",
            root.join("contracts"),
        ),
    )
    .unwrap();
    (config.to_str().unwrap().to_string(), dir.join("onejob.db"))
}

const UNSET: &str = "ONEJOB_TEST_BAD_INPUT_KEY_THAT_IS_NOT_SET";

/// A refused command leaves no database behind: every name, value and
/// credential it can check without one is checked before the database is
/// opened, which creates a new SQLite file (and migrates a new schema).
#[test]
fn a_refused_command_creates_no_database() {
    let dir = tempfile::tempdir().unwrap();
    let (config, db) = fresh(dir.path());
    let c = config.as_str();
    let junit = dir.path().join("contracts.xml");
    let junit = junit.to_str().unwrap();
    let nowhere = dir.path().join("no-such-dir/contracts.json");
    let nowhere = nowhere.to_str().unwrap();
    let empty = dir.path().join("empty");
    let empty_config = dir.path().join("empty.toml");
    std::fs::write(
        &empty_config,
        format!(
            "[server]\ndatabase_url = \"onejob.db\"\nproviders_dir = {:?}\ncontracts_dir = {:?}\n",
            empty,
            Path::new(env!("CARGO_MANIFEST_DIR")).join("contracts"),
        ),
    )
    .unwrap();
    let empty_config = empty_config.to_str().unwrap();
    let secret = format!("oj_{}", "b2".repeat(32));
    let long_reason = "r".repeat(501);
    // An address already taken, for a server that cannot listen.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = taken.local_addr().unwrap().to_string();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        // A server refused at start: a provider's key is not set, or its
        // address is taken (checked first).
        (vec!["serve", "--listen", "127.0.0.1:0"], UNSET),
        (vec!["serve", "--listen", &taken], "cannot listen"),
        (
            vec!["contracts", "run", "--provider", "nope"],
            "unknown provider \"nope\" (known: openai, sim)",
        ),
        (
            vec!["contracts", "run", "--contract", "nope"],
            "unknown contract \"nope\"",
        ),
        // The run would call the provider whose key is not set.
        (vec!["contracts", "run"], UNSET),
        (vec!["contracts", "run", "--provider", "openai"], UNSET),
        // The good report path is not left behind empty either.
        (
            vec![
                "contracts",
                "run",
                "--provider",
                "sim",
                "--junit",
                junit,
                "--json",
                nowhere,
            ],
            "cannot write JSON",
        ),
        (vec!["contracts", "run", "--bogus"], "--bogus"),
        (
            vec!["keys", "create", "--owner", "al ice"],
            "1-128 characters",
        ),
        (
            vec!["keys", "create", "--owner", "alice", "--expires-in", "0s"],
            "expires_in",
        ),
        (
            vec!["keys", "limits", "key_1", "--rps", "5", "--reason", ""],
            "--reason",
        ),
        (vec!["keys", "revoke", &secret], "not its id"),
        (vec!["keys", "rotate", &secret], "not its id"),
        (
            vec!["keys", "revoke", "key_1", "--reason", " "],
            "--reason: required",
        ),
        (
            vec!["keys", "rotate", "key_1", "--reason", &long_reason],
            "--reason: 501 characters",
        ),
        (
            vec![
                "webhooks",
                "create",
                "--owner",
                "alice",
                "--url",
                "https://example.com/h",
            ],
            "ONEJOB_WEBHOOK_KEY",
        ),
        (vec!["webhooks", "rotate", "wh_1"], "ONEJOB_WEBHOOK_KEY"),
        (vec!["usage", "--days", "0"], "--days"),
    ];
    for (args, names) in &cases {
        let mut all = args.clone();
        all.extend(["--config", c]);
        let stderr = refused(&all, &[], names);
        assert!(!stderr.contains(&secret[3..]), "{stderr}");
        assert!(!db.exists(), "{args:?} created the database: {stderr}");
    }
    assert!(!Path::new(junit).exists(), "an empty report is left behind");
    // Nothing to run (no providers) is said before the database is made.
    refused(
        &["contracts", "run", "--config", empty_config],
        &[],
        "nothing to run",
    );
    assert!(!empty.join("onejob.db").exists() && !dir.path().join("onejob.db").exists());
    // A webhook the server could never call, or for events that do not
    // exist, with the key set.
    let keygen = onejob(&["webhooks", "keygen"], &[]);
    assert!(keygen.status.success(), "{}", text(&keygen));
    let key = String::from_utf8_lossy(&keygen.stdout).trim().to_string();
    let long_url = format!("https://example.com/{}", "a".repeat(2_040));
    let long_description = "d".repeat(501);
    for (args, names) in [
        (vec!["--url", "http://127.0.0.1/h"], "https"),
        (
            vec!["--url", "https://example.com/h", "--event", "job.nope"],
            "unknown event type",
        ),
        (vec!["--url", &long_url], "url is longer than 2048 bytes"),
        (
            vec![
                "--url",
                "https://example.com/h",
                "--description",
                &long_description,
            ],
            "description is longer than 500 characters",
        ),
        (
            vec![
                "--url",
                "https://example.com/h",
                "--description",
                "a\u{1b}[2Jb",
            ],
            "description must not hold control characters",
        ),
    ] {
        let mut all = vec!["webhooks", "create", "--owner", "alice", "--config", c];
        all.extend(args);
        refused(&all, &[("ONEJOB_WEBHOOK_KEY", &key)], names);
        assert!(!db.exists(), "{all:?} created the database");
    }

    // The same commands with good values make it.
    let created = onejob(&["keys", "create", "--owner", "alice", "--config", c], &[]);
    assert!(created.status.success(), "{}", text(&created));
    assert!(db.exists());
}

/// A command that only reads, or acts on something named by its id, given
/// a SQLite path with no file there (a typo) says so and makes no file:
/// it used to create an empty database and answer "not found" or an empty
/// list. A command that writes still makes a new one.
#[test]
fn a_read_only_command_does_not_create_a_missing_database() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let c = config.as_str();
    let typo = dir.path().join("onejbo.db");
    let t = typo.to_str().unwrap();
    let webhook_key = "KioqKioqKioqKioqKioqKioqKioqKioqKioqKioqKio=";
    let job = "01JAAAAAAAAAAAAAAAAAAAAAAA";
    let cases: Vec<Vec<&str>> = vec![
        vec!["jobs", "show", job],
        vec!["jobs", "attempts", job],
        vec!["review", "list"],
        vec![
            "review", "resolve", job, "--action", "close", "--reason", "r",
        ],
        vec![
            "review",
            "resolve-attempt",
            job,
            "--outcome",
            "not_executed",
            "--reason",
            "r",
        ],
        vec!["keys", "list"],
        vec!["keys", "revoke", "key_1"],
        vec!["keys", "rotate", "key_1"],
        vec!["keys", "limits", "key_1", "--reason", "r"],
        vec!["limits", "show"],
        vec!["usage"],
        vec!["providers", "list"],
        vec!["webhooks", "list"],
        vec!["webhooks", "deliveries", "wh_1"],
        vec!["webhooks", "redeliver", "wh_1", "msg_1"],
        vec!["webhooks", "delete", "wh_1"],
        vec!["webhooks", "rotate", "wh_1"],
    ];
    for args in &cases {
        let mut all = args.clone();
        all.extend(["--config", c, "--database-url", t]);
        let stderr = refused(
            &all,
            &[("ONEJOB_WEBHOOK_KEY", webhook_key)],
            "no such SQLite file",
        );
        assert!(
            stderr.contains(t),
            "{args:?} does not name the path: {stderr}"
        );
        assert!(!typo.exists(), "{args:?} created {t}");
    }
    // A command that writes makes the database it is pointed at.
    let created = onejob(
        &[
            "keys",
            "create",
            "--owner",
            "alice",
            "--config",
            c,
            "--database-url",
            t,
        ],
        &[],
    );
    assert!(created.status.success(), "{}", text(&created));
    assert!(typo.exists());
    assert!(table(c, &["keys", "list", "--database-url", t]).contains("alice"));
}

/// `keys create` is audited; `keys revoke` and `keys rotate` keep the
/// `--reason` given in their audit rows, as `cli:$USER`.
#[test]
fn key_changes_from_the_cli_are_audited_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let c = config.as_str();
    let created = onejob(&["keys", "create", "--owner", "alice", "--config", c], &[]);
    assert!(created.status.success(), "{}", text(&created));
    let stdout = String::from_utf8_lossy(&created.stdout).into_owned();
    // "created a key ID for owner alice; …"
    let id = stdout.split_whitespace().nth(3).unwrap().to_string();
    let rotated = onejob(
        &[
            "keys",
            "rotate",
            &id,
            "--reason",
            "rotated quarterly",
            "--config",
            c,
        ],
        &[],
    );
    assert!(rotated.status.success(), "{}", text(&rotated));
    let revoked = onejob(
        &[
            "keys",
            "revoke",
            &id,
            "--reason",
            "alice left",
            "--config",
            c,
        ],
        &[],
    );
    assert!(revoked.status.success(), "{}", text(&revoked));
    let db = rusqlite::Connection::open(dir.path().join("onejob.db")).unwrap();
    let mut rows = db
        .prepare("SELECT action, actor, COALESCE(detail, '') FROM tenant_audit WHERE subject = ?1 ORDER BY id")
        .unwrap();
    let rows: Vec<(String, String, String)> = rows
        .query_map([format!("key:{id}")], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let actions: Vec<&str> = rows.iter().map(|r| r.0.as_str()).collect();
    assert_eq!(actions, ["create", "rotate", "revoke"], "{rows:?}");
    assert!(rows.iter().all(|r| r.1 == "cli:tester"), "{rows:?}");
    assert!(rows[0].2.contains("\"owner\":\"alice\""), "{rows:?}");
    assert!(
        rows[1].2.contains("\"reason\":\"rotated quarterly\""),
        "{rows:?}"
    );
    assert!(rows[2].2.contains("\"reason\":\"alice left\""), "{rows:?}");
}

/// `webhooks list` shows each endpoint's description, as the API does;
/// one of two lines stays one row.
#[test]
fn webhooks_list_shows_the_description() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    let c = config.as_str();
    let keygen = onejob(&["webhooks", "keygen"], &[]);
    assert!(keygen.status.success(), "{}", text(&keygen));
    let key = String::from_utf8_lossy(&keygen.stdout).trim().to_string();
    for (owner, url, description) in [
        (
            "alice",
            "https://example.com/orders",
            Some("orders service\nbilling"),
        ),
        ("bob", "https://example.com/plain", None),
    ] {
        let mut args = vec![
            "webhooks", "create", "--config", c, "--owner", owner, "--url", url,
        ];
        if let Some(d) = description {
            args.extend(["--description", d]);
        }
        let created = onejob(&args, &[("ONEJOB_WEBHOOK_KEY", &key)]);
        assert!(created.status.success(), "{}", text(&created));
    }
    let listed = table(c, &["webhooks", "list"]);
    let lines: Vec<&str> = listed.lines().collect();
    assert_eq!(lines.len(), 3, "{listed}");
    assert!(lines[0].ends_with("DESCRIPTION"), "{listed}");
    assert!(
        lines[1].starts_with("alice")
            && lines[1].ends_with("https://example.com/orders  orders service\\nbilling"),
        "{listed}"
    );
    assert!(
        lines[2].starts_with("bob") && lines[2].ends_with("https://example.com/plain   -"),
        "{listed}"
    );
}

/// A PostgreSQL server that is not there is said at once and why: the pool
/// alone retried a refused connection for its whole acquire timeout (10 s)
/// and then said only "pool timed out".
#[test]
fn a_database_that_refuses_says_so() {
    // A port nothing listens on: bind one, note it, let it go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://postgres@127.0.0.1:{port}/x");
    let err = refused(&["keys", "list", "--database-url", &url], &[], "");
    assert!(err.contains("Connection refused"), "{err}");
    assert!(!err.contains("pool timed out"), "{err}");
}

/// A bad `--listen` is blamed on the flag, not on a config file that never
/// named it.
#[test]
fn a_bad_listen_flag_is_named_as_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let config = setup(dir.path());
    for (args, env) in [
        (
            vec!["serve", "--listen", "abc", "--config", &config],
            vec![],
        ),
        (
            vec!["serve", "--validate", "--config", &config],
            vec![("ONEJOB_LISTEN", "abc")],
        ),
    ] {
        let err = refused(&args, &env, "--listen (or ONEJOB_LISTEN)");
        assert!(err.contains("\"abc\" is not an address"), "{err}");
        assert!(!err.contains("onejob.toml"), "{err}");
    }
}
