//! The real run stays what its requirement rows (DL-140..DL-149, DL-282, docs/contracts/
//! requirements.md) say: CI runs it after the release build (and the test-only build
//! before it), runs every planted bug a real run plants requiring each caught, and requires the lock-set's
//! control without the fence to lose elements; `up.sh` supervises every process
//! (PostgreSQL and the etcd members included, so a kill -9 is followed by a restart;
//! PostgreSQL acknowledges a commit only once its WAL is written, B20), gives
//! each dlock process its trace file and its fake wall clock, and removes everything on
//! exit. The runs themselves are the stage (they need root, etcd and PostgreSQL); this test
//! keeps the scripts from being weakened without a failing test, with a negative case for
//! each check.

#![cfg(not(madsim))]

use std::path::PathBuf;

fn read(rel: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(rel);
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

fn problems(test_sh: &str, up: &str) -> Vec<String> {
    let mut p = Vec::new();
    let line_of = |needle: &str| test_sh.lines().position(|l| l.trim() == needle);
    match (
        line_of("run_stage \"release build (dlock-real)\" cargo build --release --locked -p dlock-real"),
        line_of("run_stage \"real run\" real_run"),
    ) {
        (Some(build), Some(stage)) if build < stage => {}
        (_, None) => p.push("test.sh does not run_stage \"real run\"".to_owned()),
        _ => p.push("test.sh runs the real run before the release build".to_owned()),
    }
    match (
        line_of("run_stage \"release build (planted)\" planted_build"),
        line_of("run_stage \"release build\" cargo build --release --locked -p dlock"),
    ) {
        (Some(planted), Some(release)) if planted < release => {}
        _ => p.push("test.sh does not build the test-only binary before the production one".to_owned()),
    }
    let planted = function_body(test_sh, "planted_build");
    for needle in ["cargo build --release --locked -p dlock --features planted", "target/planted/dlock"] {
        if !planted.contains(needle) {
            p.push(format!("planted_build() lacks {needle:?}"));
        }
    }
    let body = function_body(test_sh, "real_run");
    for needle in [
        "target/release/dlock-real run --seed \"${DLOCK_REAL_SEED:-1}\" --duration \"${DLOCK_REAL_DURATION:-60s}\"",
        "[ \"${PIPESTATUS[0]}\" -eq 0 ] || return 1",
        "control without the fence [0-9]+ acknowledged, [1-9][0-9]* lost",
        "out=$(target/release/dlock-real plants 2>&1) || rc=$?",
        "[ \"$rc\" -ne 0 ]",
        "'fencing-off-both .* caught$'",
    ] {
        if !body.contains(needle) {
            p.push(format!("real_run() lacks {needle:?}"));
        }
    }
    let packages = function_body(test_sh, "ensure_packages");
    for needle in ["want iproute2", "want nftables"] {
        if !packages.contains(needle) {
            p.push(format!("ensure_packages lacks {needle:?}"));
        }
    }
    for needle in [
        "trap cleanup EXIT",
        "rm -rf \"$DIR\"",
        "--keep) KEEP=1",
        "echo \"$!\" >\"$RUN/$name.sup\"",
        "supervise postgres",
        "supervise \"etcd-$i\"",
        "for i in 1 2 3; do",
        "dlock_proc \"lock-server-$i\"",
        "dlock_proc \"rail-proxy-$i\"",
        "dlock_proc payment-resource",
        "dlock_proc rail-stub",
        "dlock_proc \"executor-$i\"",
        "DLOCK_LOCK_SERVER_BACKEND=etcd",
        "DLOCK_TRACE_FILE=$TRACE_DIR/$name.jsonl",
        "FAKETIME_DONT_FAKE_MONOTONIC=1",
        "synchronous_commit = on",
        "cat \"$CREDENTIALS_EXTRA\" >>\"$SECRETS/credentials\"",
    ] {
        if !up.contains(needle) {
            p.push(format!("up.sh lacks {needle:?}"));
        }
    }
    p
}

#[test]
fn the_test_script_runs_the_real_run_and_requires_its_planted_control_to_be_caught() {
    let found = problems(&read("scripts/test.sh"), &read("deploy/local/up.sh"));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn a_missing_stage_a_planted_run_allowed_to_pass_or_a_weakened_cluster_is_reported() {
    let (t, u) = (read("scripts/test.sh"), read("deploy/local/up.sh"));
    assert!(problems(&t, &u).is_empty());
    let cases: [(&str, String, String); 13] = [
        ("no stage", t.replace("run_stage \"real run\" real_run", ""), u.clone()),
        ("a plant may be missed", t.replace("[ \"$rc\" -ne 0 ]", "[ \"$rc\" -gt 1 ]"), u.clone()),
        ("no planted build", t.replace("run_stage \"release build (planted)\" planted_build", ""), u.clone()),
        ("production build", t.replace("-p dlock --features planted", "-p dlock"), u.clone()),
        ("control may keep all", t.replace("[1-9][0-9]* lost", "[0-9]+ lost"), u.clone()),
        ("no nftables", t.replace("want nftables", ""), u.clone()),
        ("no etcd cluster", t.clone(), u.replace("supervise \"etcd-$i\"", "supervise etcd")),
        ("postgres unsupervised", t.clone(), u.replace("supervise postgres", "run postgres")),
        ("dir kept", t.clone(), u.replace("rm -rf \"$DIR\"", "true")),
        ("no traces", t.clone(), u.replace("DLOCK_TRACE_FILE=$TRACE_DIR/$name.jsonl", "")),
        ("monotonic faked", t.clone(), u.replace("FAKETIME_DONT_FAKE_MONOTONIC=1", "")),
        ("commits acknowledged early", t.clone(), u.replace("synchronous_commit = on", "synchronous_commit = off")),
        ("no forger credentials", t.clone(), u.replace("cat \"$CREDENTIALS_EXTRA\" >>", "true ")),
    ];
    for (what, t, u) in cases {
        assert_eq!(problems(&t, &u).len(), 1, "{what}: {:?}", problems(&t, &u));
    }
}

#[test]
fn the_ci_run_creates_at_least_a_thousand_payouts_under_every_real_fault_kind() {
    let shape = dlock_real::workload::Shape {
        seed: 1,
        accounts: dlock_real::run::ACCOUNTS_DEFAULT,
        per_s: dlock_real::run::RATE_PER_S_DEFAULT,
        duration_ms: 60_000,
    };
    assert!(shape.payouts() >= 1_000, "{}", shape.payouts());
    let kinds = dlock_real::nemesis::parse_kinds("all").unwrap_or_default();
    assert_eq!(kinds.len(), dlock_real::nemesis::REAL_KINDS.len());
}
