//! The whole payout path with every service a real `dlock` process on loopback, on SQLite
//! and on PostgreSQL: lock-server, payment-resource, rail-proxy, rail-stub, and two
//! `dlock executor` processes. One executor is frozen with SIGSTOP while it holds an
//! account, past its lease, then thawed with SIGCONT: its stale write is fenced out. The
//! checks read the rail's own call log and paydb (through P4/P5), never the executors' word.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

#[macro_use]
mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use common::*;
use dlock_testkit::{fresh_database, Db, TempDir};
use serde_json::Value;
use uuid::Uuid;

/// Payouts per run, spread over [`ACCOUNTS`] accounts.
const PAYOUTS: usize = 24;
const ACCOUNTS: usize = 2;
/// Longest a run may take to settle every payout.
const SETTLE_MS_MAX: u64 = 90_000;
/// The frozen executor's lease, and how long it stays frozen (well past the lease).
const LEASE_MS: u64 = 2_000;
const FROZEN_MS: u64 = 6_000;

struct Cluster {
    stub: Service,
    lock: Service,
    payment: Service,
    proxy: Service,
    paydb_url: String,
    _dirs: (TempDir, TempDir),
}

async fn cluster(db: Db) -> Cluster {
    cluster_with(db, &[]).await
}

async fn cluster_with(db: Db, proxy_extra: &[&str]) -> Cluster {
    let (url, paydb_dir) = fresh_database(db).await;
    let lock_dir = TempDir::new("lockdb");
    let lockdb = dlock_testkit::sqlite_url(&lock_dir);
    let stub = Service::start(&["rail-stub", "--seed", "11", "--latency-ms", "50"]);
    let lock =
        Service::start(&["lock-server", "--database-url", &lockdb, "--delay-ms", "0", "--reaper-interval-ms", "100"]);
    let payment = Service::start(&["payment-resource", "--database-url", &url]);
    let rail = stub.url();
    // A short rail budget: an intent orphaned by a killed proxy is swept (quarantined) after
    // connect + read + 5 s.
    let mut proxy_args = vec![
        "rail-proxy",
        "--database-url",
        &url,
        "--rail-url",
        &rail,
        "--connect-timeout-ms",
        "500",
        "--read-timeout-ms",
        "1000",
    ];
    proxy_args.extend_from_slice(proxy_extra);
    let proxy = Service::start(&proxy_args);
    Cluster { stub, lock, payment, proxy, paydb_url: url, _dirs: (paydb_dir, lock_dir) }
}

async fn seed(c: &Cluster) -> Vec<Uuid> {
    let payment = payment_client(&c.payment);
    for a in 0..ACCOUNTS {
        open_account(&payment, &format!("open-{a}"), &format!("acct-{a}"), 1_000_000).await;
    }
    let mut ids = Vec::new();
    for i in 0..PAYOUTS {
        let account = format!("acct-{}", i % ACCOUNTS);
        let created =
            create_payout(&payment, &format!("create-{i}"), &account, 1_000 + i as i64, &format!("ben-{i}")).await;
        ids.push(created.payout_id);
    }
    ids
}

fn executor(c: &Cluster, owner: &str, extra: &[&str]) -> Service {
    Service::start(&strs(&args_for(c, owner, extra)))
}

fn executor_watching(
    c: &Cluster,
    owner: &str,
    extra: &[&str],
    needle: &str,
) -> (Service, std::sync::mpsc::Receiver<()>) {
    Service::start_watching(&strs(&args_for(c, owner, extra)), needle)
}

/// This cluster's executor as `owner`: two tasks polling every 50 ms, then `extra`.
fn args_for(c: &Cluster, owner: &str, extra: &[&str]) -> Vec<String> {
    let mut flags = vec!["--concurrency", "2", "--poll-interval-ms", "50"];
    flags.extend_from_slice(extra);
    executor_args(&c.lock, &c.payment, &c.proxy, owner, &flags)
}

/// Each payout's state as P4 reads it ("?" when the read is refused).
async fn states(c: &Cluster, ids: &[Uuid]) -> BTreeMap<Uuid, String> {
    let payment = payment_client(&c.payment);
    let mut out = BTreeMap::new();
    for id in ids {
        let state = payment.payout(*id).await.map_or_else(|_| "?".to_owned(), |p| p.state.as_str().to_owned());
        out.insert(*id, state);
    }
    out
}

/// Account `acct-{a}` as P5 reads it.
async fn account(c: &Cluster, a: usize) -> dlock_contract::payment::AccountBody {
    payment_client(&c.payment).account(&format!("acct-{a}")).await.expect("P5")
}

fn settled(state: &str) -> bool {
    matches!(state, "POSTED" | "FAILED" | "ABANDONED" | "RAIL_AMBIGUOUS")
}

/// The value of the sample `series` (its name and labels) on a service's /metrics.
async fn metric(svc: &Service, series: &str) -> Option<f64> {
    let text = String::from_utf8(get(svc, "/metrics").await.body.to_vec()).unwrap_or_default();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The value of `payout_execute_total{outcome}` on an executor's /metrics.
async fn executed(e: &Service, outcome: &str) -> u64 {
    metric(e, &format!("payout_execute_total{{outcome=\"{outcome}\"}}")).await.map_or(0, |v| v as u64)
}

/// `dlock reconcile --json` over the run: its exit code and report.
fn reconcile(c: &Cluster) -> (Option<i32>, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["reconcile", "--json", "--database-url", &c.paydb_url, "--rail-url", &c.stub.url()])
        .env("DLOCK_LOG", "warn")
        .output()
        .expect("run dlock reconcile");
    (out.status.code(), serde_json::from_slice(&out.stdout).unwrap_or(Value::Null))
}

fn signal(svc: &Service, sig: &str) {
    let status = Command::new("kill").args([sig, &svc.pid().to_string()]).status().expect("kill");
    assert!(status.success(), "kill {sig} failed");
}

async fn a_stalled_executor_is_fenced_out_and_nothing_is_paid_twice(db: Db) {
    let c = cluster(db).await;
    let ids = seed(&c).await;
    let lease = LEASE_MS.to_string();
    // The executor to freeze: every fenced write waits 500 ms after its lease check (and
    // logs `executor_injected_stall` as it starts waiting). It is frozen inside that window,
    // the worst moment: the check has passed, the write is not yet sent.
    let (zombie, stalls) = executor_watching(
        &c,
        "executor-z",
        &["--lock-ttl-ms", &lease, "--pause-rate", "1", "--pause-ms", "500"],
        "executor_injected_stall",
    );
    let stalled = stalls.recv_timeout(Duration::from_millis(SETTLE_MS_MAX));
    assert!(stalled.is_ok(), "the executor to freeze never reached a write");
    signal(&zombie, "-STOP");
    let healthy = executor(&c, "executor-h", &[]);
    tokio::time::sleep(Duration::from_millis(FROZEN_MS)).await;
    signal(&zombie, "-CONT");

    let done = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(SETTLE_MS_MAX), || async {
        states(&c, &ids).await.values().all(|s| settled(s)).then_some(())
    })
    .await;
    assert!(done.is_some(), "unsettled: {:?}", states(&c, &ids).await);
    let fenced = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(10_000), || async {
        (executed(&zombie, "fenced").await >= 1).then_some(())
    })
    .await;
    assert!(fenced.is_some(), "the thawed executor's stale write was not fenced out");
    assert_eq!(executed(&healthy, "fenced").await, 0);

    // The rail saw each payout at most once; every POSTED payout exactly once.
    let calls = rail_calls(&c.stub).await;
    let mut per_payout: BTreeMap<String, usize> = BTreeMap::new();
    for call in &calls {
        *per_payout.entry(call["clientRef"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
    }
    assert!(per_payout.values().all(|n| *n == 1), "a payout reached the rail twice: {per_payout:?}");
    for (id, state) in states(&c, &ids).await {
        if state == "POSTED" {
            assert_eq!(per_payout.get(&id.to_string()), Some(&1), "{id} is POSTED without its rail call");
        }
    }
    // The ledger balances on every account.
    for a in 0..ACCOUNTS {
        let v = account(&c, a).await;
        assert_eq!(v.balance_minor, v.ledger_sum_minor, "{v:?}");
        assert!(v.available_minor >= 0, "{v:?}");
    }
    // And the reconciler, reading paydb and the rail's record itself, finds nothing.
    let (code, report) = reconcile(&c);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["clean"], true, "{report}");
    assert_eq!(report["ledgerBalanced"], true, "{report}");
    assert_every_store_write_ran_on_the_writer_thread(&c).await;
}

/// docs/performance.md "The SQLite writer thread": each service ran every store write of
/// the run through its write helper (on SQLite, on the process's writer thread):
/// `*_store_writes_off_writer_total` is exported and 0 on the lock server, the
/// payment-resource and the rail-proxy.
async fn assert_every_store_write_ran_on_the_writer_thread(c: &Cluster) {
    for (svc, family) in [
        (&c.lock, "lock_store_writes_off_writer_total"),
        (&c.payment, "payout_store_writes_off_writer_total"),
        (&c.proxy, "rail_store_writes_off_writer_total"),
    ] {
        assert_eq!(metric(svc, family).await, Some(0.0), "{family}");
    }
}

/// Waits until at least `n` payouts are POSTED.
async fn posted_at_least(c: &Cluster, ids: &[Uuid], n: usize) {
    let reached = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(SETTLE_MS_MAX), || async {
        (states(c, ids).await.values().filter(|s| s.as_str() == "POSTED").count() >= n).then_some(())
    })
    .await;
    assert!(reached.is_some(), "fewer than {n} payouts were posted: {:?}", states(c, ids).await);
}

/// Every payout settled (terminal or quarantined), none on the rail twice, every POSTED one
/// there exactly once, every ledger balanced, and the reconciler clean.
async fn assert_the_run_is_whole(c: &Cluster, ids: &[Uuid]) {
    let done = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(SETTLE_MS_MAX), || async {
        states(c, ids).await.values().all(|s| settled(s)).then_some(())
    })
    .await;
    assert!(done.is_some(), "unsettled: {:?}", states(c, ids).await);
    let mut per_payout: BTreeMap<String, usize> = BTreeMap::new();
    for call in rail_calls(&c.stub).await {
        *per_payout.entry(call["clientRef"].as_str().unwrap_or("?").to_owned()).or_default() += 1;
    }
    assert!(per_payout.values().all(|n| *n == 1), "a payout reached the rail twice: {per_payout:?}");
    for (id, state) in states(c, ids).await {
        if state == "POSTED" {
            assert_eq!(per_payout.get(&id.to_string()), Some(&1), "{id} is POSTED without its rail call");
        }
    }
    for a in 0..ACCOUNTS {
        let v = account(c, a).await;
        assert_eq!(v.balance_minor, v.ledger_sum_minor, "{v:?}");
    }
    let (code, report) = reconcile(c);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!(report["clean"], true, "{report}");
}

async fn killing_each_service_mid_run_loses_no_payout_and_pays_none_twice(db: Db) {
    let mut c = cluster(db).await;
    let ids = seed(&c).await;
    let _e1 = executor(&c, "executor-1", &[]);
    let _e2 = executor(&c, "executor-2", &[]);
    posted_at_least(&c, &ids, 4).await;
    c.proxy.crash_and_restart();
    posted_at_least(&c, &ids, 10).await;
    c.lock.crash_and_restart();
    posted_at_least(&c, &ids, 16).await;
    c.payment.crash_and_restart();
    assert_the_run_is_whole(&c, &ids).await;
}

/// FR-27's other half: with every stale-writer defence turned off (`--profile unsafe-test`:
/// the executor's lease check, the proxy's fence and its one-attempt-per-payout guard), a
/// worker stalled past its lease between its claim and its submission wakes and submits a
/// payout a newer holder already paid, and the rail pays it twice. The reconciler, reading
/// the rail's record, catches it and exits non-zero. (With the same stall and the defences
/// on, `a_stalled_executor_is_fenced_out_and_nothing_is_paid_twice` pays nothing twice.)
async fn with_the_defences_off_a_stalled_executor_pays_twice_and_the_reconciler_catches_it(db: Db) {
    let unsafe_proxy = ["--profile", "unsafe-test", "--fencing-enabled", "false", "--duplicate-guard-enabled", "false"];
    let c = cluster_with(db, &unsafe_proxy).await;
    let ids = seed(&c).await;
    let (_zombie, stalls) = executor_watching(
        &c,
        "executor-z",
        &[
            "--profile",
            "unsafe-test",
            "--fencing-enabled",
            "false",
            "--lock-ttl-ms",
            "1000",
            "--pause-rate",
            "1",
            "--pause-ms",
            "2500",
            "--pause-hops",
            "submit",
        ],
        "executor_injected_stall",
    );
    assert!(stalls.recv_timeout(Duration::from_millis(SETTLE_MS_MAX)).is_ok(), "the zombie never claimed a payout");
    let _healthy = executor(&c, "executor-h", &[]);
    let doubled = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(SETTLE_MS_MAX), || async {
        let mut seen = BTreeMap::new();
        for call in rail_calls(&c.stub).await {
            *seen.entry(call["clientRef"].as_str().unwrap_or("?").to_owned()).or_insert(0usize) += 1;
        }
        seen.values().any(|n| *n > 1).then_some(())
    })
    .await;
    assert!(doubled.is_some(), "the unsafe run never paid a payout twice");
    let (code, report) = reconcile(&c);
    assert_eq!(code, Some(1), "the reconciler must exit non-zero: {report}");
    assert_eq!(report["clean"], false, "{report}");
    let kinds: Vec<&str> =
        report["findings"].as_array().into_iter().flatten().filter_map(|f| f["kind"].as_str()).collect();
    assert!(kinds.contains(&"DOUBLE_PAYMENT"), "{kinds:?}");
    assert!(report["maxRailCallsPerPayout"].as_u64().is_some_and(|n| n >= 2), "{report}");
    let _ = ids;
}

on_both_databases!(
    with_the_defences_off_a_stalled_executor_pays_twice_and_the_reconciler_catches_it,
    a_stalled_executor_is_fenced_out_and_nothing_is_paid_twice,
    killing_each_service_mid_run_loses_no_payout_and_pays_none_twice,
);
