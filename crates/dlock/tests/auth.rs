//! Authentication and roles of the real `dlock` processes (C3-extensions E-13, DL-104..DL-109):
//! every role boundary answered `401 UNAUTHENTICATED` / `403 FORBIDDEN` in the envelope
//! before any lookup (the same answer for an existing and a missing resource), the owner
//! binding, rotation without restart (file change and SIGHUP, with the overlap window),
//! start-up refusals, and the local credentials of `dlock demo`.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{anonymous_client, json_of, Service};
use dlock_testkit::TempDir;
use serde_json::{json, Value};

const WORKER: &str = "auth-test-worker-00000000000000001";
const BOUND: &str = "auth-test-bound-worker-0000000001";
const OPERATOR: &str = "auth-test-operator-000000000000001";
const READER: &str = "auth-test-reader-00000000000000001";
const STRANGER: &str = "auth-test-nobody-knows-this-token1";

/// Longest a test waits for a reload to take effect.
const RELOAD_WAIT_MS_MAX: u64 = 15_000;

fn credentials() -> String {
    format!("worker {WORKER}\nworker {BOUND} owners=exec-1\noperator {OPERATOR}\nreader {READER}\n")
}

/// One request with `token` (none: no Authorization header) and `headers`.
async fn call(
    svc: &Service,
    method: &str,
    path: &str,
    token: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let auth = token.map(|t| format!("Bearer {t}"));
    let mut h: Vec<(&str, &str)> = headers.to_vec();
    if let Some(a) = &auth {
        h.push(("authorization", a));
    }
    if body.is_some() {
        h.push(("content-type", "application/json"));
    }
    let method = http::Method::from_bytes(method.as_bytes()).expect("method");
    let r = anonymous_client()
        .send(&svc.base, method, path, &h, body.map(|b| b.to_string().into()))
        .await
        .expect("answered");
    (r.status, json_of(&r))
}

/// The envelope's (status, code, message, retrySafe): all but the trace id.
fn shape(r: &(u16, Value)) -> (u16, String, String, bool) {
    let v = &r.1;
    (
        r.0,
        v["code"].as_str().unwrap_or_default().to_owned(),
        v["message"].as_str().unwrap_or_default().to_owned(),
        v["retrySafe"].as_bool().unwrap_or(true),
    )
}

fn assert_refused(r: &(u16, Value), status: u16, what: &str) {
    let code = if status == 401 { "UNAUTHENTICATED" } else { "FORBIDDEN" };
    assert_eq!((r.0, r.1["code"].as_str()), (status, Some(code)), "{what}: {}", r.1);
    assert_eq!(r.1["retrySafe"], false, "{what}");
    assert_eq!(r.1["traceId"].as_str().map(str::len), Some(32), "{what}");
}

fn with_creds(args: &[&str]) -> Service {
    Service::start_with_env(args, &[("DLOCK_AUTH_CREDENTIALS", &credentials())])
}

/// DL-104, DL-105: the lock server's role boundaries and owner binding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_server_answers_401_and_403_by_role_before_any_lookup() {
    let dir = TempDir::new("auth-lock");
    let url = dlock_testkit::sqlite_url(&dir);
    let lock = with_creds(&["lock-server", "--database-url", &url, "--delay-ms", "0"]);

    assert_eq!(call(&lock, "GET", "/health/live", None, &[], None).await.0, 200, "health is open");
    assert_eq!(call(&lock, "GET", "/health/ready", None, &[], None).await.0, 200, "health is open");
    for (m, p) in [("POST", "/v1/locks/k/acquire"), ("GET", "/v1/locks/k"), ("GET", "/metrics"), ("GET", "/nope")] {
        assert_refused(&call(&lock, m, p, None, &[], None).await, 401, &format!("{m} {p} without a credential"));
        let r = call(&lock, m, p, Some(STRANGER), &[], None).await;
        assert_refused(&r, 401, &format!("{m} {p} with an unknown credential"));
    }
    let r = call(&lock, "GET", "/v1/locks/k", Some("not-a-bearer"), &[("authorization", "Basic abc")], None).await;
    assert_eq!(r.0, 401, "a non-Bearer scheme is no credential");
    // With a credential an unknown route is the router's 404.
    assert_eq!(call(&lock, "GET", "/nope", Some(READER), &[], None).await.0, 404);
    // A write the role table does not list is refused to every role (fail closed).
    for t in [WORKER, OPERATOR, READER] {
        assert_refused(&call(&lock, "POST", "/nope", Some(t), &[], None).await, 403, "an unlisted write");
    }
    assert_refused(&call(&lock, "POST", "/nope", None, &[], None).await, 401, "an anonymous unlisted write");

    // A session and a held lock exist for key `held`; key `missing` has none.
    let owner = [("x-owner-id", "exec-1")];
    let s = call(&lock, "POST", "/v1/sessions", Some(WORKER), &owner, Some(json!({"ttlMillis": 60000}))).await;
    assert_eq!(s.0, 201, "{}", s.1);
    let session = s.1["sessionId"].as_str().expect("session id").to_owned();
    let body = json!({"sessionId": session, "ttlMillis": 60000});
    let g = call(&lock, "POST", "/v1/locks/held/acquire", Some(WORKER), &owner, Some(body.clone())).await;
    assert_eq!(g.0, 200, "{}", g.1);
    let revoke = json!({"reason": "operator test revoke", "operator": "ops"});
    for key in ["held", "missing"] {
        let acquire = format!("/v1/locks/{key}/acquire");
        let revoke_path = format!("/v1/locks/{key}/revoke");
        let reader_acquire = call(&lock, "POST", &acquire, Some(READER), &owner, Some(body.clone())).await;
        assert_refused(&reader_acquire, 403, "a reader acquires");
        let op_acquire = call(&lock, "POST", &acquire, Some(OPERATOR), &owner, Some(body.clone())).await;
        assert_refused(&op_acquire, 403, "an operator acquires");
        let worker_revoke = call(&lock, "POST", &revoke_path, Some(WORKER), &owner, Some(revoke.clone())).await;
        assert_refused(&worker_revoke, 403, "a worker revokes");
        let anonymous = call(&lock, "GET", &format!("/v1/locks/{key}"), None, &[], None).await;
        assert_refused(&anonymous, 401, "an anonymous read");
        let bound = call(&lock, "POST", &acquire, Some(BOUND), &[("x-owner-id", "exec-2")], Some(body.clone())).await;
        assert_refused(&bound, 403, "a worker bound to exec-1 acts as exec-2");
    }
    // Neither answer depends on whether the key exists.
    for (token, path) in [(Some(READER), "acquire"), (Some(WORKER), "revoke"), (None, "acquire")] {
        let a = call(&lock, "POST", &format!("/v1/locks/held/{path}"), token, &owner, Some(revoke.clone())).await;
        let b = call(&lock, "POST", &format!("/v1/locks/missing/{path}"), token, &owner, Some(revoke.clone())).await;
        assert_eq!(shape(&a), shape(&b), "{path} as {token:?}: existing vs missing key");
    }
    assert_refused(&call(&lock, "POST", "/v1/sessions", Some(READER), &owner, None).await, 403, "a reader opens");

    // The owner binding: the header, and `ownerId` in a session-create body.
    let other = call(&lock, "POST", "/v1/sessions", Some(BOUND), &[], Some(json!({"ownerId": "exec-2"}))).await;
    assert_refused(&other, 403, "a bound worker opens a session for another owner");
    let mine = call(&lock, "POST", "/v1/sessions", Some(BOUND), &[], Some(json!({"ownerId": "exec-1"}))).await;
    assert_eq!(mine.0, 201, "{}", mine.1);
    let header = call(&lock, "POST", "/v1/sessions", Some(BOUND), &[("x-owner-id", "exec-2")], None).await;
    assert_refused(&header, 403, "a bound worker names another owner in X-Owner-Id");

    // What each role may do: the operator revokes, every role reads.
    let r = call(&lock, "POST", "/v1/locks/held/revoke", Some(OPERATOR), &[("x-owner-id", "ops")], Some(revoke)).await;
    assert_eq!(r.0, 200, "{}", r.1);
    for t in [READER, WORKER, OPERATOR] {
        assert_eq!(call(&lock, "GET", "/v1/locks/held", Some(t), &[], None).await.0, 200);
        assert_eq!(call(&lock, "GET", "/metrics", Some(t), &[], None).await.0, 200);
    }
}

/// DL-104: the payment-resource's and the rail-proxy's role boundaries: no operator
/// credential moves money (claim, post, submit), no worker creates, a reader only reads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn payment_resource_and_rail_proxy_keep_money_moves_to_workers_and_creation_to_operators() {
    let dir = TempDir::new("auth-pay");
    let url = dlock_testkit::sqlite_url(&dir);
    let payment = with_creds(&["payment-resource", "--database-url", &url]);
    let proxy = with_creds(&["rail-proxy", "--database-url", &url, "--rail-url", "http://127.0.0.1:9"]);

    let ops = [("x-owner-id", "ops"), ("x-idempotency-key", "open-1")];
    let account = json!({"accountId": "acct-1", "currency": "EUR", "openingBalanceMinor": 5000});
    for t in [WORKER, READER] {
        let r = call(&payment, "POST", "/v1/accounts", Some(t), &ops, Some(account.clone())).await;
        assert_refused(&r, 403, "a worker or reader creates an account");
    }
    let r = call(&payment, "POST", "/v1/accounts", Some(OPERATOR), &ops, Some(account)).await;
    assert_eq!(r.0, 201, "{}", r.1);
    let ops = [("x-owner-id", "ops"), ("x-idempotency-key", "create-1")];
    let payout = json!({"accountId": "acct-1", "amountMinor": 100, "currency": "EUR", "beneficiaryRef": "b"});
    let r = call(&payment, "POST", "/v1/payouts", Some(WORKER), &ops, Some(payout.clone())).await;
    assert_refused(&r, 403, "a worker creates a payout");
    let created = call(&payment, "POST", "/v1/payouts", Some(OPERATOR), &ops, Some(payout)).await;
    assert_eq!(created.0, 201, "{}", created.1);
    let existing = created.1["payoutId"].as_str().expect("payout id").to_owned();
    let missing = "00000000-0000-4000-8000-000000000001".to_owned();

    let fenced = [("x-owner-id", "exec-1"), ("x-fencing-token", "7"), ("x-idempotency-key", "k-1")];
    for id in [&existing, &missing] {
        for hop in ["claim", "post"] {
            let path = format!("/v1/payouts/{id}/{hop}");
            for t in [OPERATOR, READER] {
                let r = call(&payment, "POST", &path, Some(t), &fenced, Some(json!({}))).await;
                assert_refused(&r, 403, &format!("{hop} as a non-worker"));
            }
            assert_refused(&call(&payment, "POST", &path, None, &fenced, None).await, 401, hop);
        }
        assert_refused(&call(&payment, "GET", &format!("/v1/payouts/{id}"), None, &[], None).await, 401, "read");
    }
    let a = call(&payment, "POST", &format!("/v1/payouts/{existing}/claim"), Some(OPERATOR), &fenced, None).await;
    let b = call(&payment, "POST", &format!("/v1/payouts/{missing}/claim"), Some(OPERATOR), &fenced, None).await;
    assert_eq!(shape(&a), shape(&b), "an operator's claim: existing vs missing payout");
    let a = call(&payment, "GET", &format!("/v1/payouts/{existing}"), None, &[], None).await;
    let b = call(&payment, "GET", &format!("/v1/payouts/{missing}"), None, &[], None).await;
    assert_eq!(shape(&a), shape(&b), "an anonymous read: existing vs missing payout");
    // Every role reads (the executor GETs payouts with its worker credential).
    for t in [READER, WORKER, OPERATOR] {
        assert_eq!(call(&payment, "GET", &format!("/v1/payouts/{existing}"), Some(t), &[], None).await.0, 200);
    }

    let submit = json!({"payoutId": existing, "accountId": "acct-1", "amountMinor": 100, "currency": "EUR", "beneficiaryRef": "b"});
    for t in [OPERATOR, READER] {
        let r = call(&proxy, "POST", "/v1/rail/submissions", Some(t), &fenced, Some(submit.clone())).await;
        assert_refused(&r, 403, "a non-worker submits");
    }
    let r = call(&proxy, "POST", "/v1/rail/submissions", None, &fenced, Some(submit)).await;
    assert_refused(&r, 401, "an anonymous submission");
    assert_eq!(call(&proxy, "GET", "/health/live", None, &[], None).await.0, 200);
}

/// Polls `cond` every 25 ms until it holds, within [`RELOAD_WAIT_MS_MAX`].
async fn eventually<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let seen = dlock_rt::wait_until(
        dlock_rt::Duration::from_millis(25),
        dlock_rt::Duration::from_millis(RELOAD_WAIT_MS_MAX),
        || {
            let f = cond();
            async move { f.await.then_some(()) }
        },
    )
    .await;
    assert!(seen.is_some(), "{what} within {RELOAD_WAIT_MS_MAX} ms");
}

async fn reads(svc: &Service, token: &str) -> u16 {
    call(svc, "GET", "/metrics", Some(token), &[], None).await.0
}

const OLD: &str = "rotation-old-token-00000000000001";
const NEW: &str = "rotation-new-token-00000000000001";

/// DL-106: a running service follows its credentials file: the new token works without a
/// restart, the old one still works inside `auth.rotation-overlap-ms` and fails after it, and
/// a malformed file keeps the current set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_credentials_file_rotates_without_restart_with_an_overlap_window() {
    let dir = TempDir::new("auth-rotate");
    let file = dir.0.join("credentials");
    std::fs::write(&file, format!("reader {OLD}\n")).expect("write");
    let url = dlock_testkit::sqlite_url(&dir);
    let (lock, failed_reload) = Service::start_watching_with_env(
        &["lock-server", "--database-url", &url],
        "credentials_reload_failed_kept_current",
        &[
            ("DLOCK_AUTH_CREDENTIALS", ""),
            ("DLOCK_AUTH_CREDENTIALS_FILE", file.to_str().expect("utf-8")),
            ("DLOCK_AUTH_RELOAD_INTERVAL_MS", "50"),
            ("DLOCK_AUTH_ROTATION_OVERLAP_MS", "4000"),
        ],
    );
    assert_eq!(reads(&lock, OLD).await, 200);
    assert_eq!(reads(&lock, NEW).await, 401);

    std::fs::write(&file, format!("# rotated\nreader {NEW}\n")).expect("rotate");
    eventually("the new token works", || async { reads(&lock, NEW).await == 200 }).await;
    let rotated_at = Instant::now();
    assert_eq!(reads(&lock, OLD).await, 200, "the old token works inside the overlap window");
    eventually("the old token stops working after the overlap", || async { reads(&lock, OLD).await == 401 }).await;
    assert!(rotated_at.elapsed() < Duration::from_millis(RELOAD_WAIT_MS_MAX));
    let r = call(&lock, "GET", "/metrics", Some(OLD), &[], None).await;
    assert_refused(&r, 401, "a retired token");

    // A malformed file is refused at reload; the current set stays.
    std::fs::write(&file, "reader\n").expect("break");
    let logged = failed_reload.recv_timeout(Duration::from_millis(RELOAD_WAIT_MS_MAX));
    assert!(logged.is_ok(), "the malformed file was not reported");
    assert_eq!(reads(&lock, NEW).await, 200, "a malformed file must not lock everyone out");
}

/// DL-106: SIGHUP re-reads the credentials file at once (the poll here is ten minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_credentials_file() {
    let dir = TempDir::new("auth-hup");
    let file = dir.0.join("credentials");
    std::fs::write(&file, format!("reader {OLD}\n")).expect("write");
    let url = dlock_testkit::sqlite_url(&dir);
    let lock = Service::start_with_env(
        &["lock-server", "--database-url", &url],
        &[
            ("DLOCK_AUTH_CREDENTIALS", ""),
            ("DLOCK_AUTH_CREDENTIALS_FILE", file.to_str().expect("utf-8")),
            ("DLOCK_AUTH_RELOAD_INTERVAL_MS", "600000"),
        ],
    );
    assert_eq!(reads(&lock, OLD).await, 200);
    std::fs::write(&file, format!("reader {NEW}\n")).expect("rotate");
    assert_eq!(reads(&lock, NEW).await, 401, "no reload before the signal");
    let status = Command::new("kill").args(["-HUP", &lock.pid().to_string()]).status().expect("kill");
    assert!(status.success());
    eventually("the new token works after SIGHUP", || async { reads(&lock, NEW).await == 200 }).await;
    assert_eq!(reads(&lock, OLD).await, 200, "the old token is inside the default overlap window");
}

/// `dlock lock-server` with `env`: its exit code and stderr (it must refuse to start).
fn refused(env: &[(&str, &str)], args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["lock-server", "--listen", "127.0.0.1:0"])
        .args(args)
        .env_remove("DLOCK_CONFIG")
        .env_remove("DLOCK_AUTH_CREDENTIALS")
        .env_remove("DLOCK_AUTH_CREDENTIALS_FILE")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .output()
        .expect("run dlock");
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// DL-107: a service refuses to start with auth on and no credentials, with a malformed
/// credentials file (naming the file and line, never the token), and with auth off outside
/// `--profile unsafe-test`.
#[test]
fn a_service_refuses_to_start_without_valid_credentials_or_with_auth_off() {
    let dir = TempDir::new("auth-refuse");
    let url = dlock_testkit::sqlite_url(&dir);
    let db = ["--database-url", url.as_str()];
    let (code, err) = refused(&[], &db);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("no credentials are configured"), "{err}");

    let file = dir.0.join("creds");
    std::fs::write(&file, format!("reader {READER}\nsuperuser {WORKER}\n")).expect("write");
    let (code, err) = refused(&[("DLOCK_AUTH_CREDENTIALS_FILE", file.to_str().expect("utf-8"))], &db);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(file.to_str().expect("utf-8")) && err.contains("line 2"), "{err}");
    assert!(!err.contains(WORKER) && !err.contains(READER), "a token leaked: {err}");

    let (code, err) = refused(&[("DLOCK_AUTH_ENABLED", "false")], &db);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("auth.enabled=false is refused outside --profile unsafe-test"), "{err}");
}

/// DL-108: `dlock demo` generates its credentials (mode 0600) under the data dir on the
/// first run, reuses them on the second, prints where they are and never a token, and its
/// executors settle every payout with them.
#[test]
fn demo_generates_private_credentials_once_and_reuses_them() {
    let dir = TempDir::new("auth-demo");
    let data = dir.0.join("data");
    let run = || {
        let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(["demo", "--payouts", "6", "--accounts", "2", "--rail-failure-rate", "0", "--pause-rate", "0"])
            .arg("--data-dir")
            .arg(&data)
            .env_remove("DLOCK_AUTH_CREDENTIALS")
            .env_remove("DLOCK_CONFIG")
            .output()
            .expect("run dlock demo");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "exit {:?}\n{stdout}\n{stderr}", out.status);
        assert!(stdout.contains("dlock demo: PASS"), "{stdout}");
        format!("{stdout}{stderr}")
    };
    let first = run();
    let path = data.join("credentials");
    assert!(first.contains(&format!("credentials generated in {}", path.display())), "{first}");
    let text = std::fs::read_to_string(&path).expect("the credentials file");
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the credentials file is private");
    }
    let tokens: Vec<&str> =
        text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| l.split_whitespace().nth(1)).collect();
    assert_eq!(tokens.len(), 3, "one worker, one operator, one reader: {}", tokens.len());
    assert!(tokens.iter().all(|t| t.len() == 64 && t.chars().all(|c| c.is_ascii_hexdigit())));
    assert!(tokens[0] != tokens[1] && tokens[1] != tokens[2] && tokens[0] != tokens[2]);
    for t in &tokens {
        assert!(!first.contains(t), "a token was printed");
    }
    let second = run();
    assert!(second.contains(&format!("credentials reused in {}", path.display())), "{second}");
    assert_eq!(std::fs::read_to_string(&path).expect("still there"), text, "the second run reuses the file");
    for t in &tokens {
        assert!(!second.contains(t), "a token was printed");
    }
}
