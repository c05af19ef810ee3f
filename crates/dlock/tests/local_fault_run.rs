//! The local fault run (`deploy/local/`, stage "local fault run" of `scripts/test.sh`)
//! stays what its requirement rows (DL-140..DL-149) say: CI runs it after the release
//! build, and runs its planted twin requiring a failure; the fault run keeps at least
//! 2 000 payouts, a chaotic rail, stalls past the lease and its five faults; `up.sh`
//! starts the whole topology and removes it on exit. The runs themselves are the stage
//! (they need root, etcd and PostgreSQL); this test keeps the scripts from being weakened
//! without a failing test, and has a negative case for each check.

#![cfg(not(madsim))]

use std::path::PathBuf;

/// Fewest payouts a fault run may default to (issue 13).
const FAULT_RUN_PAYOUTS_MIN: u64 = 2_000;

fn read(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of shell function `name` in `text` (from `name() {` to the closing `}`).
fn function_body(text: &str, name: &str) -> String {
    text.lines()
        .skip_while(|l| !l.starts_with(&format!("{name}() {{")))
        .take_while(|l| !l.starts_with('}'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The first `NAME=<integer>` assignment in `text`.
fn first_number(text: &str, name: &str) -> Option<u64> {
    text.lines().find_map(|l| l.trim().strip_prefix(&format!("{name}="))?.parse().ok())
}

fn problems(test_sh: &str, fault_run: &str, up: &str) -> Vec<String> {
    let mut p = Vec::new();
    let line_of = |needle: &str| test_sh.lines().position(|l| l.trim() == needle);
    match (
        line_of("run_stage \"release build\" cargo build --release --locked -p dlock"),
        line_of("run_stage \"local fault run\" local_fault_run"),
    ) {
        (Some(build), Some(stage)) if build < stage => {}
        (_, None) => p.push("test.sh does not run_stage \"local fault run\"".to_owned()),
        _ => p.push("test.sh runs the local fault run before the release build".to_owned()),
    }
    let body = function_body(test_sh, "local_fault_run");
    for needle in ["deploy/local/fault-run.sh || return 1", "fault-run.sh --planted", "\"$rc\" -ne 1", "DOUBLE PAYMENT"]
    {
        if !body.contains(needle) {
            p.push(format!("local_fault_run() lacks {needle:?}"));
        }
    }
    if !function_body(test_sh, "ensure_packages").contains("want iproute2") {
        p.push("ensure_packages does not install iproute2".to_owned());
    }

    match first_number(fault_run, "PAYOUTS") {
        Some(n) if n >= FAULT_RUN_PAYOUTS_MIN => {}
        other => p.push(format!("fault-run.sh defaults to {other:?} payouts, fewer than {FAULT_RUN_PAYOUTS_MIN}")),
    }
    match (first_number(fault_run, "STALL_MS"), first_number(fault_run, "LEASE_MS")) {
        (Some(stall), Some(lease)) if stall > lease => {}
        other => p.push(format!("fault-run.sh's stalls do not outlast the lease: (stall, lease) = {other:?}")),
    }
    if !fault_run.lines().any(|l| l.trim().starts_with("export DLOCK_RAIL_STUB_FAILURE_RATE=0.0")) {
        p.push("fault-run.sh's rail is not chaotic (DLOCK_RAIL_STUB_FAILURE_RATE)".to_owned());
    }
    // The schedule: the last `if [ "$PLANTED" = 1 ]` block's `else` branch, at top level.
    let lines: Vec<&str> = fault_run.lines().collect();
    let schedule: String = match lines.iter().rposition(|l| l.starts_with("if [ \"$PLANTED\" = 1 ]; then")) {
        Some(at) => lines[at..]
            .iter()
            .skip_while(|l| **l != "else")
            .take_while(|l| **l != "fi")
            .copied()
            .collect::<Vec<_>>()
            .join("\n"),
        None => String::new(),
    };
    for needle in [
        "fault_etcd_leader",
        "kill9_service F2 lock-server-",
        "kill9_service F3 rail-proxy-",
        "fault_sigstop",
        "fault_partition",
    ] {
        if !schedule.contains(needle) {
            p.push(format!("fault-run.sh's schedule lacks {needle}"));
        }
    }
    for needle in [
        "kill -9 \"$old\"",
        "kill -STOP",
        "kill -CONT",
        "route replace \"$LOCK_IP/32\"",
        "route del \"$LOCK_IP/32\"",
        "W judge",
        "exit \"$RC\"",
    ] {
        if !fault_run.contains(needle) {
            p.push(format!("fault-run.sh lacks {needle:?}"));
        }
    }

    for needle in [
        "trap cleanup EXIT",
        "rm -rf \"$DIR\"",
        "--keep) KEEP=1",
        "supervise \"etcd-$i\"",
        "for i in 1 2 3; do",
        "supervise \"lock-server-$i\"",
        "supervise \"rail-proxy-$i\"",
        "supervise payment-resource",
        "supervise rail-stub",
        "supervise \"executor-$i\"",
        "DLOCK_LOCK_SERVER_BACKEND=etcd",
        "reconcile --database-url",
    ] {
        if !up.contains(needle) {
            p.push(format!("up.sh lacks {needle:?}"));
        }
    }
    p
}

#[test]
fn the_test_script_runs_the_local_fault_run_and_requires_its_planted_run_to_fail() {
    let found = problems(&read("scripts/test.sh"), &read("deploy/local/fault-run.sh"), &read("deploy/local/up.sh"));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_missing_stage_a_planted_run_allowed_to_pass_or_a_weakened_fault_run_is_reported() {
    let (t, f, u) = (read("scripts/test.sh"), read("deploy/local/fault-run.sh"), read("deploy/local/up.sh"));
    assert!(problems(&t, &f, &u).is_empty());
    let cases: [(&str, String, String, String); 9] = [
        ("no stage", t.replace("run_stage \"local fault run\" local_fault_run", ""), f.clone(), u.clone()),
        ("planted may pass", t.replace("\"$rc\" -ne 1", "\"$rc\" -ne 0"), f.clone(), u.clone()),
        ("no iproute2", t.replace("want iproute2", ""), f.clone(), u.clone()),
        ("few payouts", t.clone(), f.replacen("PAYOUTS=2000", "PAYOUTS=200", 1), u.clone()),
        ("stall within lease", t.clone(), f.replacen("STALL_MS=2000", "STALL_MS=1000", 1), u.clone()),
        ("calm rail", t.clone(), f.replace("export DLOCK_RAIL_STUB_FAILURE_RATE=0.02", ""), u.clone()),
        ("no partition", t.clone(), f.replace("    fault_partition 3 8\n", ""), u.clone()),
        ("no etcd cluster", t.clone(), f.clone(), u.replace("supervise \"etcd-$i\"", "supervise etcd")),
        ("dir kept", t.clone(), f.clone(), u.replace("rm -rf \"$DIR\"", "true")),
    ];
    for (what, t, f, u) in cases {
        assert_eq!(problems(&t, &f, &u).len(), 1, "{what}: {:?}", problems(&t, &f, &u));
    }
}
