//! Secret hygiene, tried end to end (docs/security.md "Secret hygiene"): a cluster of real
//! `dlock` processes is configured with known secrets (three role tokens, a grant signing
//! key, a database password in every database URL's userinfo), logs at debug level with
//! `RUST_BACKTRACE=1`, does real work (an executor pays payouts) and is sent a battery of
//! hostile requests (no, wrong, near-miss, Basic and key-as-token credentials, forged and
//! cross-account tokens, malformed bodies, unknown routes). Every response body and header,
//! every log line, every metrics page and every `--help` text is then scanned: none may hold
//! any form of any secret, a stack trace or a panic message.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

mod common;

use std::time::{Duration, Instant};

use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use common::*;
use dlock_rt::http::{BaseUrl, ClientResponse, HttpClient};
use dlock_testkit::{fresh_database, Db, TempDir};
use serde_json::{json, Value};

const WORKER: &str = "scan-worker-7f3a9c1e5b2d4f60";
const OPERATOR: &str = "scan-operator-0c9d8e7f6a5b4c3d";
const READER: &str = "scan-reader-a1b2c3d4e5f60718";
const DB_PASSWORD: &str = "pgpass-Zq81xvK2";
/// The grant signing key's seed.
const SEED: [u8; 32] = [
    0x5a, 0x11, 0x3c, 0x7e, 0x42, 0x99, 0x01, 0xd4, 0x6b, 0x20, 0xee, 0x17, 0x88, 0x35, 0xc2, 0x4f, 0x90, 0x0d, 0xa7,
    0x63, 0x1e, 0xb9, 0x54, 0xf8, 0x2a, 0x71, 0xcd, 0x06, 0x9b, 0x3f, 0xe0, 0x48,
];
/// Longest the executor may take to pay the seeded payouts.
const PAID_MS_MAX: u64 = 60_000;
const PAYOUTS: usize = 4;

/// Every spelling of every secret the scan looks for.
fn needles() -> Vec<(String, String)> {
    let b64 = STANDARD.encode(SEED);
    assert_eq!(format!("{b64}\n"), dlock_contract::grant::seed_text(&SEED), "the key file's own spelling");
    let b64url = URL_SAFE_NO_PAD.encode(SEED);
    let hex: String = SEED.iter().map(|b| format!("{b:02x}")).collect();
    let mut n = vec![
        ("worker token".to_owned(), WORKER.to_owned()),
        ("operator token".to_owned(), OPERATOR.to_owned()),
        ("reader token".to_owned(), READER.to_owned()),
        ("database password".to_owned(), DB_PASSWORD.to_owned()),
        ("signing key (base64)".to_owned(), b64.trim_end_matches('=').to_owned()),
        ("signing key (base64url)".to_owned(), b64url),
        ("signing key (hex)".to_owned(), hex.clone()),
        ("signing key (HEX)".to_owned(), hex.to_uppercase()),
        ("stack trace".to_owned(), "stack backtrace".to_owned()),
        ("panic message".to_owned(), "panicked at".to_owned()),
        ("rust source path".to_owned(), "/src/".to_owned()),
    ];
    // A token's prefix long enough to identify it, in case something truncates.
    for (what, t) in [("worker", WORKER), ("operator", OPERATOR), ("reader", READER)] {
        n.push((format!("{what} token prefix"), t[..16].to_owned()));
    }
    n
}

/// What the scan saw: every answer and every text, with where it came from.
#[derive(Default)]
struct Seen {
    texts: Vec<(String, String)>,
}

impl Seen {
    fn answer(&mut self, what: &str, r: &ClientResponse) {
        let mut text = format!("{} ", r.status);
        for (k, v) in r.headers.iter() {
            text.push_str(&format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())));
        }
        text.push_str(&String::from_utf8_lossy(&r.body));
        self.texts.push((what.to_owned(), text));
    }

    fn text(&mut self, what: &str, text: String) {
        self.texts.push((what.to_owned(), text));
    }

    /// Every (source, secret) pair found.
    fn leaks(&self) -> Vec<String> {
        let needles = needles();
        let mut found = Vec::new();
        for (source, text) in &self.texts {
            for (what, needle) in &needles {
                if text.contains(needle.as_str()) {
                    found.push(format!("{what} in {source}: {}", excerpt(text, needle)));
                }
            }
        }
        found
    }
}

fn excerpt(text: &str, needle: &str) -> String {
    let at = text.find(needle).unwrap_or(0);
    let from = text[..at].char_indices().rev().nth(60).map_or(0, |(i, _)| i);
    let to = text[at..].char_indices().nth(needle.len() + 40).map_or(text.len(), |(i, _)| at + i);
    text[from..to].to_owned()
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn send(
    seen: &mut Seen,
    base: &BaseUrl,
    what: &str,
    method: http::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> ClientResponse {
    let c = HttpClient::new(1_000, 20_000).without_bearer();
    let mut h: Vec<(&str, &str)> = headers.to_vec();
    if body.is_some() {
        h.push(("content-type", "application/json"));
    }
    let r = c
        .send(base, method, path, &h, body.map(|b| b.to_string().into()))
        .await
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    seen.answer(what, &r);
    r
}

/// The credential headers the battery tries on every route.
fn hostile_credentials() -> Vec<(&'static str, String)> {
    let near_miss = format!("{}x", &WORKER[..WORKER.len() - 1]);
    let basic = STANDARD.encode(format!("worker:{DB_PASSWORD}"));
    let hex: String = SEED.iter().map(|b| format!("{b:02x}")).collect();
    vec![
        ("none", String::new()),
        ("unknown token", bearer("scan-unknown-token-000000000000")),
        ("near-miss token", bearer(&near_miss)),
        ("basic with the password", format!("Basic {basic}")),
        ("the signing key as a token", bearer(&hex)),
        ("the token without a scheme", WORKER.to_owned()),
        ("reader", bearer(READER)),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_a_response_a_log_line_a_metric_or_help_text() {
    let dir = TempDir::new("secret-scan");
    let creds = dir.path().join("credentials");
    std::fs::write(
        &creds,
        format!("worker {WORKER} owners=scan-exec/*,scan-w\noperator {OPERATOR}\nreader {READER}\n"),
    )
    .expect("credentials");
    let key_file = dir.path().join("grant.key");
    std::fs::write(&key_file, dlock_contract::grant::seed_text(&SEED)).expect("key");
    let token_file = dir.path().join("worker.token");
    std::fs::write(&token_file, format!("{WORKER}\n")).expect("token");
    let public = dlock_contract::grant::GrantSigner::from_seed(&SEED).verify_key().to_base64();
    let (pg, _pg_dir) = fresh_database(Db::Postgres).await;
    let paydb = pg.replacen("postgres@", &format!("postgres:{DB_PASSWORD}@"), 1);
    assert!(paydb.contains(DB_PASSWORD), "the test database URL carries the password: {paydb}");
    let lockdb = dlock_testkit::sqlite_url(&dir);
    let (creds_s, key_s, token_s) =
        (creds.display().to_string(), key_file.display().to_string(), token_file.display().to_string());
    let env: Vec<(&str, &str)> = vec![
        ("DLOCK_LOG", "debug"),
        ("RUST_BACKTRACE", "1"),
        ("DLOCK_AUTH_CREDENTIALS", ""),
        ("DLOCK_AUTH_CREDENTIALS_FILE", &creds_s),
        ("DLOCK_EXECUTOR_AUTH_TOKEN", ""),
        ("DLOCK_EXECUTOR_AUTH_TOKEN_FILE", &token_s),
        ("DLOCK_LOCK_GRANTS_SIGNING_KEY_FILE", &key_s),
        ("DLOCK_PAYMENT_GRANTS_VERIFY_KEYS", &public),
        ("DLOCK_RAIL_PROXY_GRANTS_VERIFY_KEYS", &public),
    ];
    let logs = Transcript::default();
    let stub = Service::start_recorded(
        &["rail-stub", "--seed", "5", "--failure-rate", "0", "--decline-rate", "0", "--duplicate-ack-rate", "0"],
        &env,
        &logs,
    );
    let lock = Service::start_recorded(&["lock-server", "--database-url", &lockdb, "--delay-ms", "0"], &env, &logs);
    let payment = Service::start_recorded(&["payment-resource", "--database-url", &paydb], &env, &logs);
    let rail = stub.url();
    let proxy = Service::start_recorded(&["rail-proxy", "--database-url", &paydb, "--rail-url", &rail], &env, &logs);

    let mut seen = Seen::default();
    let op = bearer(OPERATOR);
    let wk = bearer(WORKER);
    let post = http::Method::POST;
    let r = send(
        &mut seen,
        &payment.base,
        "open account",
        post.clone(),
        "/v1/accounts",
        &[("authorization", &op), ("x-idempotency-key", "scan-open-1"), ("x-owner-id", "scan-op")],
        Some(json!({"accountId": "acct-s", "currency": "EUR", "openingBalanceMinor": 1_000_000})),
    )
    .await;
    assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
    let mut payouts = Vec::new();
    for i in 0..PAYOUTS {
        let key = format!("scan-payout-{i}");
        let r = send(
            &mut seen,
            &payment.base,
            "create payout",
            post.clone(),
            "/v1/payouts",
            &[("authorization", &op), ("x-idempotency-key", &key), ("x-owner-id", "scan-op")],
            Some(json!({"accountId": "acct-s", "amountMinor": 100 + i, "currency": "EUR", "beneficiaryRef": "ben-s"})),
        )
        .await;
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        payouts.push(json_of(&r)["payoutId"].as_str().expect("payoutId").to_owned());
    }

    // The hostile battery: every credential form on every service's routes.
    let p0 = payouts[0].clone();
    let claim_path = format!("/v1/payouts/{p0}/claim");
    let routes: Vec<(&Service, http::Method, String, Option<Value>)> = vec![
        (&lock, post.clone(), "/v1/sessions".into(), Some(json!({"ownerId": "scan-w", "ttlMillis": 5_000}))),
        (&lock, post.clone(), "/v1/locks/payout:acct-s/revoke".into(), Some(json!({}))),
        (&lock, http::Method::GET, "/v1/locks/payout:acct-s".into(), None),
        (&lock, http::Method::GET, "/no/such/route".into(), None),
        (&payment, post.clone(), claim_path.clone(), Some(json!({"expectedState": "PENDING"}))),
        (&payment, http::Method::GET, format!("/v1/payouts/{p0}"), None),
        (&payment, http::Method::GET, "/v1/payouts/00000000-0000-4000-8000-000000000000".into(), None),
        (&payment, http::Method::GET, "/metrics".into(), None),
        (&proxy, post.clone(), "/v1/rail/submissions".into(), Some(json!({"payoutId": p0}))),
        (&proxy, http::Method::GET, "/metrics".into(), None),
        (&proxy, http::Method::DELETE, "/v1/rail/submissions".into(), None),
    ];
    for (svc, method, path, body) in &routes {
        for (who, auth) in hostile_credentials() {
            let mut h = vec![("x-owner-id", "scan-w"), ("x-idempotency-key", "scan-k"), ("x-fencing-token", "7")];
            if !auth.is_empty() {
                h.push(("authorization", auth.as_str()));
            }
            let what = format!("{method} {path} with {who}");
            let r = send(&mut seen, &svc.base, &what, method.clone(), path, &h, body.clone()).await;
            if who != "reader" {
                assert_eq!(r.status, 401, "{what}: {}", String::from_utf8_lossy(&r.body));
            }
        }
    }
    // Forged and cross-account grants, malformed bodies, under the real worker credential.
    let rogue = dlock_contract::grant::GrantSigner::from_seed(&[3; 32]).sign("payout:acct-s", 7, "scan-w");
    let other = dlock_contract::grant::GrantSigner::from_seed(&SEED).sign("payout:acct-other", 7, "scan-w");
    let max = i64::MAX.to_string();
    for (what, token, sig) in [
        ("int64-max unsigned claim", max.as_str(), None),
        ("rogue-key claim", "7", Some(rogue.as_str())),
        ("cross-account claim", "7", Some(other.as_str())),
        ("malformed signature claim", "7", Some("v1.zz.not-base64")),
    ] {
        let mut h = vec![("authorization", wk.as_str()), ("x-owner-id", "scan-w"), ("x-idempotency-key", "scan-f")];
        h.push(("x-fencing-token", token));
        if let Some(s) = sig {
            h.push(("x-fencing-signature", s));
        }
        let body = Some(json!({"expectedState": "PENDING"}));
        let r = send(&mut seen, &payment.base, what, post.clone(), &claim_path, &h, body).await;
        assert_eq!((r.status, json_of(&r)["code"].clone()), (400, json!("INVALID_TOKEN")), "{what}");
    }
    let h = [("authorization", wk.as_str()), ("x-owner-id", "scan-w"), ("x-idempotency-key", "scan-m")];
    let c = HttpClient::new(1_000, 20_000).without_bearer();
    let mut hb = h.to_vec();
    hb.push(("content-type", "application/json"));
    let r = c
        .send(&payment.base, post.clone(), &claim_path, &hb, Some("{\"expectedState\": PENDING".into()))
        .await
        .expect("malformed json answered");
    seen.answer("malformed JSON", &r);
    assert!(r.status >= 400);

    // Real work: an executor with the worker token file pays every payout.
    let args = executor_args(&lock, &payment, &proxy, "scan-exec", &["--poll-interval-ms", "50"]);
    let exec = Service::start_recorded(&strs(&args), &env, &logs);
    let start = Instant::now();
    loop {
        let mut settled = 0;
        let mut states = Vec::new();
        for p in &payouts {
            let path = format!("/v1/payouts/{p}");
            let r = send(
                &mut seen,
                &payment.base,
                "payout state",
                http::Method::GET,
                &path,
                &[("authorization", &bearer(READER))],
                None,
            )
            .await;
            states.push(json_of(&r)["state"].clone());
            if json_of(&r)["state"] == json!("POSTED") {
                settled += 1;
            }
        }
        if settled == payouts.len() {
            break;
        }
        if start.elapsed() > Duration::from_millis(PAID_MS_MAX) {
            let lines = logs.lines();
            let loud = lines.iter().filter(|l| !l.contains("DEBUG")).cloned().collect::<Vec<_>>();
            let tail = loud.iter().rev().take(40).rev().cloned().collect::<Vec<_>>().join("\n");
            panic!("the executor did not pay within {PAID_MS_MAX} ms: {states:?}\n{tail}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for (name, svc) in
        [("lock-server", &lock), ("payment-resource", &payment), ("rail-proxy", &proxy), ("executor", &exec)]
    {
        let what = format!("{name} metrics");
        send(&mut seen, &svc.base, &what, http::Method::GET, "/metrics", &[("authorization", &bearer(READER))], None)
            .await;
    }
    drop(exec);
    drop((lock, payment, proxy, stub));

    // Help texts, with every secret in the environment.
    for sub in [
        vec!["--help"],
        vec!["lock-server", "--help"],
        vec!["payment-resource", "--help"],
        vec!["rail-proxy", "--help"],
        vec!["rail-stub", "--help"],
        vec!["executor", "--help"],
        vec!["reconcile", "--help"],
        vec!["resolve", "--help"],
        vec!["up", "--help"],
        vec!["demo", "--help"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(&sub)
            .envs(env.iter().copied())
            .env("DLOCK_AUTH_CREDENTIALS", format!("worker {WORKER}"))
            .env("DLOCK_EXECUTOR_AUTH_TOKEN", WORKER)
            .env("DLOCK_PAYMENT_RESOURCE_DATABASE_URL", &paydb)
            .env("DLOCK_RAIL_PROXY_DATABASE_URL", &paydb)
            .output()
            .expect("dlock --help");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(text.contains("Usage"), "{sub:?}: {text}");
        seen.text(&format!("dlock {}", sub.join(" ")), text);
    }
    // A refused start-up (a bad credentials line) names the file and line, never the token.
    std::fs::write(&creds, format!("worker {WORKER} owners=\n")).expect("bad credentials");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["payment-resource", "--database-url", &paydb, "--listen", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .output()
        .expect("dlock payment-resource");
    assert!(!out.status.success(), "started with a malformed credentials file");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&creds_s), "the refusal names the file: {text}");
    seen.text("refused start-up", text);

    let lines = logs.lines();
    assert!(lines.len() > 50, "the processes logged at debug level ({} lines)", lines.len());
    assert!(lines.iter().any(|l| l.contains("listening on")));
    for (i, l) in lines.iter().enumerate() {
        seen.text(&format!("log line {i}"), l.clone());
    }
    assert!(seen.texts.len() > 150, "the scan saw {} texts", seen.texts.len());
    let leaks = seen.leaks();
    assert!(leaks.is_empty(), "{} leaks:\n{}", leaks.len(), leaks.join("\n"));
}

/// The scan itself can fail: a text holding any spelling of a secret is reported.
#[test]
fn the_scan_reports_every_spelling_of_a_secret() {
    let mut seen = Seen::default();
    let hex: String = SEED.iter().map(|b| format!("{b:02x}")).collect();
    for (i, t) in [WORKER.to_owned(), format!("x{DB_PASSWORD}y"), hex, "thread 'main' panicked at src/x.rs".into()]
        .into_iter()
        .enumerate()
    {
        seen.text(&format!("t{i}"), t);
    }
    seen.text("clean", "nothing to see here".into());
    let leaks = seen.leaks();
    for want in ["worker token in t0", "database password in t1", "signing key (hex) in t2", "panic message in t3"] {
        assert!(leaks.iter().any(|l| l.starts_with(want)), "{want} not reported: {leaks:?}");
    }
    assert!(!leaks.iter().any(|l| l.contains("in clean")));
}
