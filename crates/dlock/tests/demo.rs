//! `dlock demo` and `dlock up` as a user runs them: real processes, embedded SQLite.

#![cfg(not(madsim))]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dlock_contract::payment::{NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_testkit::TempDir;

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

/// A child process killed and reaped when dropped (whatever the test's outcome).
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The payment client of `base`, as an operator seeding the demo holds one.
fn payment_client(base: &BaseUrl) -> PaymentClient {
    let mut cfg = PaymentClientConfig::new(base.clone());
    cfg.write_read_timeout_ms = 5_000;
    PaymentClient::new(cfg).expect("payment client")
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::parse(k).expect("key")
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
    let typed = payment_client(&payment);
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
