//! The README's first command, `onejob demo`, plays every scenario and shows
//! what a user would see: one job and one execution per intent.
#![allow(clippy::unwrap_used)]

use std::process::Command;

#[test]
fn the_demo_plays_the_breakpoints_and_the_lost_response() {
    let output = Command::new(env!("CARGO_BIN_EXE_onejob"))
        .arg("demo")
        .env("RUST_LOG", "error")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for expected in [
        "answers: [200, 200, 200, 200, 200, 200, 200, 200, 200, 201]",
        "409 \"idempotency_key_reused\"",
        "jobs in the database: 1",
        "blocked_on \"unknown_attempt\"",
        "POST /retry -> 409 \"attempt_outcome_unknown\"",
        "failed: not_executed (reconciler)",
        "LOST the compare-and-swap",
        "primary executed 1, fallback executed 1",
        "outcome UNKNOWN (connection_reset)",
        "executed 1 time(s) (no second charge)",
        "learned true from",
        "hedged at the learned threshold",
    ] {
        assert!(
            stdout.contains(expected),
            "missing {expected:?} in:\n{stdout}"
        );
    }
    assert_eq!(
        stdout
            .matches("provider ledger: the key executed 1 time(s)")
            .count(),
        1,
        "{stdout}"
    );
}
