//! Signed grants (issue 12, C3-extensions E-14) with the real binary: the lock server signs
//! every grant, and the payment-resource (claim, post) and the rail-proxy (submission)
//! refuse, with 400 `INVALID_TOKEN` and nothing written, any token the lock server did not
//! sign for the payout's own account, this token and this owner.
//!
//! The harness (`common::grant_env`) gives every process the test signing key and the
//! resources its public key; these tests also start processes with keys of their own.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

mod common;

use std::time::Duration;

use common::*;
use dlock_contract::grant::{testing, GrantSigner};
use dlock_contract::payout::PayoutState;
use dlock_rt::http::BaseUrl;
use dlock_testkit::{fresh_database, Db, TempDir};
use serde_json::{json, Value};
use uuid::Uuid;

/// Longest a test waits for a real executor to settle a payout.
const SETTLE_MS_MAX: u64 = 30_000;

struct Cluster {
    stub: Service,
    proxy: Service,
    payment: Service,
    lock: Service,
    _dirs: (TempDir, TempDir),
}

async fn cluster() -> Cluster {
    let (url, dir) = fresh_database(Db::Sqlite).await;
    let lock_dir = TempDir::new("lockdb");
    let lockdb = dlock_testkit::sqlite_url(&lock_dir);
    let stub = Service::start(&["rail-stub", "--seed", "5"]);
    let payment = Service::start(&["payment-resource", "--database-url", &url]);
    let proxy = Service::start(&["rail-proxy", "--database-url", &url, "--rail-url", &stub.url()]);
    let lock =
        Service::start(&["lock-server", "--database-url", &lockdb, "--delay-ms", "0", "--reaper-interval-ms", "100"]);
    Cluster { stub, proxy, payment, lock, _dirs: (dir, lock_dir) }
}

async fn post_json(base: &BaseUrl, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let r = client()
        .send(base, http::Method::POST, path, &all, Some(body.to_string().into()))
        .await
        .expect("service answered");
    let v = json_of(&r);
    (r.status, v)
}

/// A real grant of `payout:{account}` for `owner`: its token and the lock server's signature.
async fn grant(lock: &BaseUrl, account: &str, owner: &str) -> (i64, String) {
    let (s, v) = post_json(lock, "/v1/sessions", &[("x-owner-id", owner)], json!({"ttlMillis": 30_000})).await;
    assert_eq!(s, 201, "{v}");
    let session = v["sessionId"].as_str().expect("session").to_owned();
    let (s, v) = post_json(
        lock,
        &format!("/v1/locks/payout:{account}/acquire"),
        &[("x-owner-id", owner)],
        json!({"sessionId": session, "ttlMillis": 30_000, "waitMillis": 5_000}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let sig = v["fencingSignature"].as_str().expect("the lock server signs every grant").to_owned();
    (v["fencingToken"].as_i64().expect("token"), sig)
}

/// A claim with exactly these headers (`sig` absent: no signature header).
async fn claim(
    payment: &BaseUrl,
    p: Uuid,
    token: &str,
    owner: &str,
    sig: Option<&str>,
    expected: &str,
) -> (u16, Value) {
    let key = format!("payout:{p}");
    let mut h = vec![("x-fencing-token", token), ("x-owner-id", owner), ("x-idempotency-key", key.as_str())];
    if let Some(s) = sig {
        h.push(("x-fencing-signature", s));
    }
    post_json(payment, &format!("/v1/payouts/{p}/claim"), &h, json!({ "expectedState": expected })).await
}

/// A submission of `p` (acct, 500 EUR minor, ben-1) with exactly these headers.
async fn submit(proxy: &BaseUrl, p: Uuid, account: &str, token: &str, owner: &str, sig: Option<&str>) -> (u16, Value) {
    let key = format!("payout:{p}");
    let mut h = vec![("x-fencing-token", token), ("x-owner-id", owner), ("x-idempotency-key", key.as_str())];
    if let Some(s) = sig {
        h.push(("x-fencing-signature", s));
    }
    let body =
        json!({"payoutId": p, "accountId": account, "amountMinor": 500, "currency": "EUR", "beneficiaryRef": "ben-1"});
    post_json(proxy, "/v1/rail/submissions", &h, body).await
}

async fn post(payment: &BaseUrl, p: Uuid, token: &str, owner: &str, sig: Option<&str>, ack: &Value) -> (u16, Value) {
    let key = format!("payout:{p}");
    let mut h = vec![("x-fencing-token", token), ("x-owner-id", owner), ("x-idempotency-key", key.as_str())];
    if let Some(s) = sig {
        h.push(("x-fencing-signature", s));
    }
    let body =
        json!({"submissionId": ack["submissionId"], "railReference": ack["railReference"], "railOutcome": "ACKED"});
    post_json(payment, &format!("/v1/payouts/{p}/post"), &h, body).await
}

/// Opens `account` (10 000 EUR minor) and creates one 500 payout on it.
async fn payout_on(payment: &Service, account: &str, n: usize) -> Uuid {
    let c = payment_client(payment);
    open_account(&c, &format!("open-{account}"), account, 10_000).await;
    create_payout(&c, &format!("create-{account}-{n}"), account, 500, "ben-1").await.payout_id
}

async fn another_payout(payment: &Service, account: &str, n: usize) -> Uuid {
    create_payout(&payment_client(payment), &format!("create-{account}-{n}"), account, 500, "ben-1").await.payout_id
}

async fn fence(payment: &Service, account: &str) -> i64 {
    payment_client(payment).account(account).await.expect("P5").fence
}

async fn state(payment: &Service, p: Uuid) -> (PayoutState, usize) {
    let v = payment_client(payment).payout(p).await.expect("P4");
    (v.state, v.submissions.len())
}

fn assert_invalid_token(answer: &(u16, Value), case: &str) {
    assert_eq!(answer.0, 400, "{case}: {}", answer.1);
    assert_eq!(answer.1["code"], "INVALID_TOKEN", "{case}: {}", answer.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_int64_maximum_claim_is_refused_and_the_fence_is_unchanged_and_a_real_worker_still_pays() {
    let c = cluster().await;
    let p = payout_on(&c.payment, "acct-1", 0).await;
    let max = i64::MAX.to_string();
    // Unsigned, and signed by the test key for another token: both refused.
    assert_invalid_token(&claim(&c.payment.base, p, &max, "w-1", None, "PENDING").await, "unsigned");
    let other = testing::sign_payout("acct-1", 7, "w-1");
    assert_invalid_token(&claim(&c.payment.base, p, &max, "w-1", Some(&other), "PENDING").await, "re-tokened");
    assert_eq!(fence(&c.payment, "acct-1").await, 0, "the fence moved");
    assert_eq!(state(&c.payment, p).await, (PayoutState::Pending, 0));

    // A real executor, with the lock server's signed grants, claims, submits and posts.
    let args = executor_args(&c.lock, &c.payment, &c.proxy, "executor-1", &["--poll-interval-ms", "50"]);
    let exec = Service::start(&strs(&args));
    let posted = dlock_rt::wait_until(
        dlock_rt::Duration::from_millis(50),
        dlock_rt::Duration::from_millis(SETTLE_MS_MAX),
        || async { (state(&c.payment, p).await.0 == PayoutState::Posted).then_some(()) },
    )
    .await;
    assert!(posted.is_some(), "the executor did not post within {SETTLE_MS_MAX} ms: {:?}", state(&c.payment, p).await);
    assert!(fence(&c.payment, "acct-1").await < i64::MAX);
    drop(exec);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_grant_for_one_account_is_refused_on_another_accounts_payout_and_writes_nothing() {
    let c = cluster().await;
    let _a = payout_on(&c.payment, "acct-a", 0).await;
    let b = payout_on(&c.payment, "acct-b", 0).await;
    let (token_a, sig_a) = grant(&c.lock.base, "acct-a", "w-1").await;
    let t = token_a.to_string();

    // Claim of B's payout under A's grant: refused, nothing written.
    assert_invalid_token(
        &claim(&c.payment.base, b, &t, "w-1", Some(&sig_a), "PENDING").await,
        "claim B with A's grant",
    );
    assert_eq!(fence(&c.payment, "acct-b").await, 0);
    assert_eq!(state(&c.payment, b).await, (PayoutState::Pending, 0));

    // B's own grant, under the same idempotency key: no refusal was recorded to replay.
    let (token_b, sig_b) = grant(&c.lock.base, "acct-b", "w-1").await;
    let tb = token_b.to_string();
    let claimed = claim(&c.payment.base, b, &tb, "w-1", Some(&sig_b), "PENDING").await;
    assert_eq!(claimed.0, 200, "{}", claimed.1);
    assert_eq!(fence(&c.payment, "acct-b").await, token_b);
    // The signature names its owner: another owner with B's grant is refused.
    assert_invalid_token(&claim(&c.payment.base, b, &tb, "w-2", Some(&sig_b), "CLAIMED").await, "other owner");

    // Submission of B under A's grant: refused before the mark, no row, no rail call.
    assert_invalid_token(&submit(&c.proxy.base, b, "acct-b", &t, "w-1", Some(&sig_a)).await, "submit B with A's grant");
    assert_eq!(state(&c.payment, b).await, (PayoutState::Claimed, 0));
    assert!(rail_calls(&c.stub).await.is_empty());

    // B's grant goes through the rail and to the ledger.
    let acked = submit(&c.proxy.base, b, "acct-b", &tb, "w-1", Some(&sig_b)).await;
    assert_eq!(acked.0, 200, "{}", acked.1);
    assert_invalid_token(&post(&c.payment.base, b, &t, "w-1", Some(&sig_a), &acked.1).await, "post B with A's grant");
    // The post's token must pass the ledger's fence: one above the claim's, signed by the
    // lock server's key (the harness's test key) as its next grant would be.
    let next = (token_b + 1).to_string();
    let sig_next = testing::sign_payout("acct-b", token_b + 1, "w-1");
    let posted = post(&c.payment.base, b, &next, "w-1", Some(&sig_next), &acked.1).await;
    assert_eq!(posted.0, 200, "{}", posted.1);
    assert_eq!(state(&c.payment, b).await, (PayoutState::Posted, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_signature_from_an_untrusted_key_and_malformed_or_oversized_headers_are_refused() {
    let c = cluster().await;
    let p = payout_on(&c.payment, "acct-1", 0).await;
    let rogue = GrantSigner::from_seed(&[9; 32]);
    let untrusted = rogue.sign("payout:acct-1", 5, "w-1");
    assert_invalid_token(&claim(&c.payment.base, p, "5", "w-1", Some(&untrusted), "PENDING").await, "untrusted claim");
    let good = testing::sign_payout("acct-1", 5, "w-1");
    let bad = [
        "garbage".to_owned(),
        "v1.".to_owned(),
        good[..good.len() - 2].to_owned(),
        format!("{good}xx"),
        format!("v1.{}", "A".repeat(300)),
        good.replace('.', "!"),
    ];
    for sig in &bad {
        assert_invalid_token(&claim(&c.payment.base, p, "5", "w-1", Some(sig), "PENDING").await, sig);
    }
    assert_eq!(fence(&c.payment, "acct-1").await, 0);
    // The good one works; then the proxy refuses the same forgeries.
    assert_eq!(claim(&c.payment.base, p, "5", "w-1", Some(&good), "PENDING").await.0, 200);
    let sub_untrusted = rogue.sign("payout:acct-1", 6, "w-1");
    assert_invalid_token(
        &submit(&c.proxy.base, p, "acct-1", "6", "w-1", Some(&sub_untrusted)).await,
        "untrusted submit",
    );
    assert_invalid_token(&submit(&c.proxy.base, p, "acct-1", "6", "w-1", None).await, "unsigned submit");
    for sig in &bad {
        assert_invalid_token(&submit(&c.proxy.base, p, "acct-1", "6", "w-1", Some(sig)).await, sig);
    }
    assert_eq!(state(&c.payment, p).await, (PayoutState::Claimed, 0));
    assert!(rail_calls(&c.stub).await.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn key_rotation_accepts_grants_of_every_configured_key_and_refuses_a_dropped_one() {
    let (url, _dir) = fresh_database(Db::Sqlite).await;
    let old = testing::signer();
    let new = GrantSigner::from_seed(&testing::SEED_NEXT);
    let both = format!("{},{}", old.verify_key().to_base64(), new.verify_key().to_base64());
    // The lock server signs with the new key.
    let key_dir = TempDir::new("grant-key");
    let key_file = key_dir.path().join("signing.key");
    std::fs::write(&key_file, dlock_contract::grant::seed_text(&testing::SEED_NEXT)).expect("key file");
    let key_path = key_file.display().to_string();
    let lock_dir = TempDir::new("lockdb");
    let lockdb = dlock_testkit::sqlite_url(&lock_dir);
    let lock = Service::start_with_env(
        &["lock-server", "--database-url", &lockdb, "--delay-ms", "0"],
        &[("DLOCK_LOCK_GRANTS_SIGNING_KEY_FILE", &key_path)],
    );
    let payment = Service::start_with_env(
        &["payment-resource", "--database-url", &url],
        &[("DLOCK_PAYMENT_GRANTS_VERIFY_KEYS", &both)],
    );
    let p1 = payout_on(&payment, "acct-1", 1).await;
    let p2 = another_payout(&payment, "acct-1", 2).await;
    let p3 = another_payout(&payment, "acct-1", 3).await;
    // A real grant of the lock server (new key) and one of the old key: both admitted
    // while both keys are configured.
    let (t, real_new) = grant(&lock.base, "acct-1", "w-1").await;
    assert!(real_new.contains(&new.key_id().to_string()), "the lock server signs with the new key: {real_new}");
    assert_eq!(claim(&payment.base, p1, &t.to_string(), "w-1", Some(&real_new), "PENDING").await.0, 200);
    let old_sig = old.sign("payout:acct-1", t + 10, "w-1");
    assert_eq!(claim(&payment.base, p2, &(t + 10).to_string(), "w-1", Some(&old_sig), "PENDING").await.0, 200);
    drop(payment);

    // The old key dropped: its grants are refused, the new key's still admitted.
    let payment = Service::start_with_env(
        &["payment-resource", "--database-url", &url],
        &[("DLOCK_PAYMENT_GRANTS_VERIFY_KEYS", &new.verify_key().to_base64())],
    );
    let late = t + 1_000;
    let old_late = old.sign("payout:acct-1", late, "w-1");
    let late_text = late.to_string();
    assert_invalid_token(&claim(&payment.base, p3, &late_text, "w-1", Some(&old_late), "PENDING").await, "dropped key");
    assert_eq!(fence(&payment, "acct-1").await, t + 10);
    let new_late = new.sign("payout:acct-1", late, "w-1");
    assert_eq!(claim(&payment.base, p3, &late_text, "w-1", Some(&new_late), "PENDING").await.0, 200);
}

/// `dlock ARGS` with `env`, to its exit: (success, stderr).
fn run_to_exit(args: &[&str], env: &[(&str, &str)]) -> (bool, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(args)
        .args(["--listen", "127.0.0.1:0"])
        .envs(grant_env())
        .envs(env.iter().map(|(k, v)| (k.to_string(), v.to_string())))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn dlock");
    let deadline = std::time::Instant::now() + Duration::from_millis(START_MS_MAX);
    loop {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("dlock {args:?} did not exit within {START_MS_MAX} ms (it should refuse to start)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (out.status.success(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_accept_unsigned_switch_is_refused_outside_unsafe_test_and_production_needs_verify_keys() {
    let (url, _dir) = fresh_database(Db::Sqlite).await;
    for (svc, key) in [
        ("payment-resource", "DLOCK_PAYMENT_GRANTS_ACCEPT_UNSIGNED"),
        ("rail-proxy", "DLOCK_RAIL_PROXY_GRANTS_ACCEPT_UNSIGNED"),
    ] {
        let (ok, err) = run_to_exit(&[svc, "--database-url", &url], &[(key, "true")]);
        assert!(!ok && err.contains("accept-unsigned") && err.contains("unsafe-test"), "{svc}: {err}");
    }
    for (svc, key) in [
        ("payment-resource", "DLOCK_PAYMENT_GRANTS_VERIFY_KEYS"),
        ("rail-proxy", "DLOCK_RAIL_PROXY_GRANTS_VERIFY_KEYS"),
    ] {
        let (ok, err) = run_to_exit(&[svc, "--database-url", &url], &[(key, "")]);
        assert!(!ok && err.contains("verify-keys") && err.contains("will not start"), "{svc}: {err}");
    }
    // Under unsafe-test the switch admits an unsigned token (and still judges a signature).
    let payment = Service::start_with_env(
        &["--profile", "unsafe-test", "payment-resource", "--database-url", &url],
        &[("DLOCK_PAYMENT_GRANTS_ACCEPT_UNSIGNED", "true"), ("DLOCK_PAYMENT_GRANTS_VERIFY_KEYS", "")],
    );
    let p = payout_on(&payment, "acct-1", 0).await;
    let rogue = GrantSigner::from_seed(&[9; 32]).sign("payout:acct-1", 3, "w-1");
    assert_invalid_token(
        &claim(&payment.base, p, "3", "w-1", Some(&rogue), "PENDING").await,
        "untrusted under the switch",
    );
    assert_eq!(claim(&payment.base, p, "3", "w-1", None, "PENDING").await.0, 200);
}
