//! `dlock demo` and `dlock up` as a user runs them: real processes, embedded SQLite.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_contract::payment::{NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::OwnerId;
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_testkit::TempDir;

mod common;
use common::{key, payment_client_with, token_of, Reaped};

/// Longest `dlock up` may take to serve, and to settle one payout.
const UP_WAIT_MS_MAX: u64 = 30_000;

#[test]
fn demo_runs_payouts_through_a_chaotic_cluster_and_passes_only_when_every_invariant_holds() {
    let dir = TempDir::new("demo");
    let data = dir.0.join("data");
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["demo", "--payouts", "80", "--accounts", "4", "--rail-failure-rate", "0.05", "--pause-rate", "0.05"])
        .arg("--data-dir")
        .arg(&data)
        .output()
        .expect("run dlock demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("dlock demo: PASS"), "{stdout}");
    assert!(
        stdout.contains("rail calls per payout (max)      1") || stdout.contains("rail calls per payout (max)      0")
    );
    assert!(stdout.contains("ledger balanced                  yes"), "{stdout}");
    for section in ["payouts by final state", "fenced-out writes by resource", "ambiguous payouts"] {
        assert!(stdout.contains(section), "{section} missing:\n{stdout}");
    }
    assert!(data.join("paydb.sqlite").exists() && data.join("lockdb.sqlite").exists());
}

#[test]
fn demo_refuses_bad_flags_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["demo", "--rail-failure-rate", "1.5"])
        .output()
        .expect("run dlock demo");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--rail-failure-rate"));
}

/// The three stale-writer defences, each in its own config file line.
const SAFETY_SWITCHES: [(&str, &str); 3] = [
    ("payment.fencing", "payment.fencing.enabled"),
    ("rail.proxy.fencing", "rail.proxy.fencing.enabled"),
    ("rail.proxy.duplicate-guard", "rail.proxy.duplicate-guard.enabled"),
];

/// FR-27 through `dlock demo`: `--config F` turns off the executor's lease check, the
/// proxy's fence and its duplicate guard; under `--profile unsafe-test` the demo really
/// runs with them off, says so loudly at start, and executors stalled before each
/// submission (past their lease) make the rail pay payouts twice. The demo's reconciler
/// catches it (DOUBLE_PAYMENT) and the demo exits 1. (With the same stalls and the defences
/// on, the demo test above passes.)
#[test]
fn demo_under_unsafe_test_with_the_three_switches_off_pays_twice_and_its_reconciler_fails_the_run() {
    let dir = TempDir::new("demo-unsafe");
    let file = dir.0.join("unsafe.toml");
    let mut text: String = SAFETY_SWITCHES.iter().map(|(table, _)| format!("[{table}]\nenabled = false\n")).collect();
    // Every executor tries every account at once (no affinity wait), so a stalled worker's
    // payout is taken over by its peer while the stalled one still holds its old grant.
    text.push_str("[executor]\naffinity-steal-after-ms = 0\n");
    text.push_str("[executor.chaos]\npause-hops = \"submit\"\n");
    std::fs::write(&file, text).expect("write config");
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["demo", "--profile", "unsafe-test", "--payouts", "6", "--accounts", "2", "--executors", "2"])
        .args(["--concurrency", "3", "--pause-rate", "1", "--rail-failure-rate", "0", "--timeout-ms", "60000"])
        .arg("--config")
        .arg(&file)
        .arg("--data-dir")
        .arg(dir.0.join("data"))
        .output()
        .expect("run dlock demo");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(1), "the demo must fail the run:\n{stdout}\n{stderr}");
    for (_, key) in SAFETY_SWITCHES {
        assert!(
            stderr.lines().any(|l| l.contains("WARNING: SAFETY SWITCH OFF") && l.contains(&format!("{key}=false"))),
            "no loud warning for {key}:\n{stderr}"
        );
    }
    assert!(stdout.contains("DOUBLE_PAYMENT"), "the reconciler did not find the double payment:\n{stdout}");
    let max_calls = stdout
        .lines()
        .find_map(|l| l.strip_prefix("rail calls per payout (max)"))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert!(max_calls.is_some_and(|n| n >= 2), "{max_calls:?}\n{stdout}");
    assert!(stdout.contains("dlock demo: FAIL") && !stdout.contains("PASS"), "{stdout}");
}

/// The error a command gives, from its stderr.
fn refusal(args: &[&str], file: &std::path::Path, env: Option<(&str, &str)>) -> (Option<i32>, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_dlock"));
    cmd.args(args).arg("--config").arg(file);
    if let Some((k, v)) = env {
        cmd.env(k, v);
    }
    let out = cmd.stdout(Stdio::null()).output().expect("run dlock");
    let line = String::from_utf8_lossy(&out.stderr).lines().find(|l| l.contains("refused")).unwrap_or("").to_owned();
    (out.status.code(), line)
}

/// Without `--profile unsafe-test`, `dlock demo` and `dlock up` refuse each safety switch
/// turned off (from `--config` or from its environment variable) with exactly the error the
/// separate process that owns the key gives, and start nothing.
#[test]
fn demo_and_up_refuse_each_safety_switch_off_without_unsafe_test_with_the_services_own_error() {
    let dir = TempDir::new("demo-refuse");
    let empty = dir.0.join("empty.toml");
    std::fs::write(&empty, "").expect("write config");
    for (table, key) in SAFETY_SWITCHES {
        let file = dir.0.join(format!("{key}.toml"));
        std::fs::write(&file, format!("[{table}]\nenabled = false\n")).expect("write config");
        let owner = if key.starts_with("payment.") { "executor" } else { "rail-proxy" };
        let (code, own) = refusal(&[owner], &file, None);
        assert_eq!(code, Some(2), "{owner} must refuse {key}");
        assert!(own.contains(&format!("{key}=false is refused outside --profile unsafe-test")), "{own}");
        let data = dir.0.join("data");
        let data = data.to_str().expect("utf-8 path");
        for args in
            [vec!["demo", "--payouts", "2", "--accounts", "1", "--data-dir", data], vec!["up", "--data-dir", data]]
        {
            let (code, line) = refusal(&args, &file, None);
            assert_eq!((code, line.as_str()), (Some(2), own.as_str()), "dlock {args:?} with {key}=false in --config");
            let env = (dlock_config::env_name(key), "false".to_owned());
            let (code, line) = refusal(&args, &empty, Some((&env.0, &env.1)));
            assert_eq!((code, line.as_str()), (Some(2), own.as_str()), "dlock {args:?} with {}=false", env.0);
            assert!(!std::path::Path::new(data).exists(), "dlock {args:?} started something before refusing");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn up_serves_the_cluster_on_the_default_ports_settles_payouts_and_stops_on_sigterm() {
    let dir = TempDir::new("up");
    let mut up = Reaped(
        Command::new(env!("CARGO_BIN_EXE_dlock"))
            .arg("up")
            .arg("--data-dir")
            .arg(&dir.0)
            .env("DLOCK_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn dlock up"),
    );
    let payment = BaseUrl::parse("http://127.0.0.1:8082").expect("url");
    let client = HttpClient::new(500, 2_000);
    let ready = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(UP_WAIT_MS_MAX), || async {
        let r = client.send(&payment, http::Method::GET, "/health/ready", &[], None).await.ok()?;
        (r.status == 200).then_some(())
    })
    .await;
    assert!(ready.is_some(), "dlock up did not serve the payment-resource on 127.0.0.1:8082");
    // The credentials `dlock up` generated in its data dir (E-13): the operator seeds.
    let creds = std::fs::read_to_string(dir.0.join("credentials")).expect("dlock up wrote its credentials");
    let operator = token_of(&creds, "operator");
    let typed = payment_client_with(&payment, &operator);
    let ops = OwnerId::parse("ops").expect("owner");
    let open = NewAccountRequest { account_id: "acct-1".into(), currency: "EUR".into(), opening_balance_minor: 5_000 };
    typed.create_account(&ops, &key("open"), &open).await.expect("account opened");
    let create = NewPayoutRequest {
        payout_id: None,
        account_id: "acct-1".into(),
        amount_minor: 1_200,
        currency: "EUR".into(),
        beneficiary_ref: "b".into(),
    };
    let id = typed.create_payout(&ops, &key("create"), &create).await.expect("payout created").payout_id;
    let posted = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(UP_WAIT_MS_MAX), || {
        let typed = typed.clone();
        async move { (typed.payout(id).await.ok()?.state == PayoutState::Posted).then_some(()) }
    })
    .await;
    let _ = Command::new("kill").args(["-TERM", &up.0.id().to_string()]).status();
    let start = Instant::now();
    let mut status = None;
    while start.elapsed() < Duration::from_millis(UP_WAIT_MS_MAX) {
        if let Ok(Some(s)) = up.0.try_wait() {
            status = Some(s);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(posted.is_some(), "the executors of dlock up did not settle the payout");
    assert!(status.is_some_and(|s| s.success()), "dlock up did not stop cleanly on SIGTERM: {status:?}");
}

/// The node names the demo's trace may give (the services' own, the executors', the demo's).
fn demo_trace_node(n: &str) -> bool {
    // `http-client`: the judged writes the executors send (`exchange_sent`, `exchange_done`).
    ["demo", "lock-server", "payment-resource", "rail-proxy", "rail-stub", "reconciler", "http-client"].contains(&n)
        || n.strip_prefix("executor-").is_some_and(|i| i.parse::<u32>().is_ok())
}

/// DL-93, DL-94: `dlock demo --trace FILE.jsonl` writes the real cluster's run in the
/// simulation's trace schema: every line JSON with the six fixed fields first and in order,
/// `seq` the line number, `t_ms` never going back, and the protocol's events (grants, fenced
/// writes, a stalled worker's fenced-out write below the stored token, intents, rail calls,
/// lease beliefs matching their grants, the reconciler's findings) from the services' nodes.
#[test]
fn demo_with_trace_writes_the_runs_protocol_events_in_the_simulation_trace_schema() {
    let dir = TempDir::new("demo-trace");
    let file = dir.0.join("run.jsonl");
    let html = dir.0.join("run.html");
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["demo", "--payouts", "80", "--accounts", "2", "--rail-failure-rate", "0.3", "--pause-rate", "0.2"])
        // Stalls twice the lease past it: time for another worker to take the key over and
        // raise the fence before the stalled write lands (with the demo's 500 ms past a
        // 1 500 ms lease, a run could end with no takeover in time and no fenced-out write).
        // 80 payouts: a run of 40 ended, 2 times in 14, before any stalled write landed
        // behind a takeover.
        .env("DLOCK_EXECUTOR_CHAOS_PAUSE_MS", "4500")
        .arg("--data-dir")
        .arg(dir.0.join("data"))
        .arg("--trace")
        .arg(&file)
        .arg("--timeline")
        .arg(&html)
        .output()
        .expect("run dlock demo");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "exit {:?}\n{stdout}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
    let text = std::fs::read_to_string(&file).expect("the trace file was written");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() > 40, "{} lines", lines.len());
    let fixed = ["seq", "t_ms", "node", "mono_ms", "wall_ms", "kind"];
    let mut parsed = Vec::new();
    let mut last_t = 0;
    for (i, line) in lines.iter().enumerate() {
        let m = match serde_json::from_str::<serde_json::Value>(line) {
            Ok(serde_json::Value::Object(m)) => m,
            other => panic!("line {i} is not a JSON object ({other:?}): {line}"),
        };
        let keys: Vec<&str> = m.keys().map(String::as_str).collect();
        let mut at = 0;
        for f in fixed {
            let pos = line.find(&format!("\"{f}\":")).unwrap_or_else(|| panic!("no {f}: {line}"));
            assert!(pos >= at, "field {f} out of order: {line}");
            at = pos;
        }
        assert!(line.starts_with("{\"seq\":"), "{line}");
        assert_eq!(m["seq"].as_u64(), Some(i as u64), "seq is the line number: {line}");
        let t = m["t_ms"].as_u64().unwrap_or_else(|| panic!("t_ms: {line}"));
        assert!(t >= last_t, "t_ms went back: {line}");
        last_t = t;
        assert!(m["mono_ms"].as_u64().is_some() && m["wall_ms"].as_i64().is_some(), "clocks: {line} {keys:?}");
        let node = m["node"].as_str().unwrap_or_default();
        assert!(demo_trace_node(node), "unknown node {node}: {line}");
        parsed.push(m);
    }
    let first = &parsed[0];
    assert_eq!(first["kind"], "trace_start");
    assert_eq!(first["schema"], "dlock-incident-trace/1");
    assert_eq!(parsed[parsed.len() - 1]["kind"], "trace_end");
    let of = |kind: &str| parsed.iter().filter(|m| m["kind"] == kind).collect::<Vec<_>>();
    for kind in [
        "session",
        "grant",
        "fenced_write",
        "intent",
        "rail_call",
        "intent_outcome",
        "lease_belief",
        "reconciler_finding",
    ] {
        assert!(!of(kind).is_empty(), "no {kind} line in the demo's trace");
    }
    for (kind, node) in [
        ("session", "lock-server"),
        ("grant", "lock-server"),
        ("intent", "rail-proxy"),
        ("rail_call", "rail-stub"),
        ("reconciler_finding", "reconciler"),
    ] {
        assert!(of(kind).iter().all(|m| m["node"] == node), "{kind} lines come from {node}");
    }
    // The fences stopped a stalled worker: presented below the stored token.
    let refused: Vec<_> = of("fenced_write").into_iter().filter(|m| m["answer"] == "fenced_out").collect();
    assert!(!refused.is_empty(), "no fenced-out write although workers stalled past their lease:\n{stdout}");
    for m in &refused {
        assert!(m["presented_token"].as_i64() <= m["stored_token"].as_i64(), "{m:?}");
    }
    assert!(refused.iter().any(|m| m["presented_token"].as_i64() < m["stored_token"].as_i64()), "{refused:?}");
    // Every granted belief is of a grant the lock server made, from an executor's node.
    for b in of("lease_belief").into_iter().filter(|m| m["source"] == "granted") {
        assert!(b["node"].as_str().is_some_and(|n| n.starts_with("executor-")), "{b:?}");
        assert!(
            of("grant").iter().any(|g| g["key"] == b["key"] && g["token"] == b["token"]),
            "a belief without its grant: {b:?}"
        );
    }
    // Every grant is of a session the lock server opened (DL-242).
    for g in of("grant") {
        assert!(of("session").iter().any(|s| s["session"] == g["session"]), "a grant without its session: {g:?}");
    }
    // `--timeline`: the same trace drawn, the same page the renderer makes of the file, with
    // a lane per executor and the fenced-out writes drawn.
    let page = std::fs::read_to_string(&html).expect("the timeline was written");
    assert_eq!(page, dlock_timeline::render_html(&text).expect("renders"), "the page is the trace's drawing");
    assert!(page.contains(r#"data-lane-kind="executor""#), "no executor lane");
    assert!(page.contains(r#"data-answer="fenced_out""#), "no fenced-out write drawn");
}
