//! Harness for tests that run real `dlock` processes on loopback.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use dlock_contract::payout::PayoutState;
use dlock_rail_proxy::store::{NewPayout, RailStore};
use dlock_rt::http::{BaseUrl, ClientError, ClientResponse, HttpClient};
use serde_json::{json, Value};
use uuid::Uuid;

/// Stamps each `case(db: Db)` out as `sqlite::case` and `postgres::case` tests.
#[allow(unused_macros)]
macro_rules! on_both_databases {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() { super::$case(dlock_testkit::Db::Sqlite).await }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() { super::$case(dlock_testkit::Db::Postgres).await }
            )*
        }
    };
}

/// Longest a service may take to print its listening line.
pub const START_MS_MAX: u64 = 20_000;

/// Every line some processes wrote, shared by the threads that read their pipes.
#[derive(Debug, Clone, Default)]
pub struct Transcript(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

impl Transcript {
    pub fn push(&self, line: String) {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(line);
    }

    pub fn lines(&self) -> Vec<String> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A running `dlock` service process, killed when dropped.
pub struct Service {
    child: Child,
    pub addr: String,
    pub base: BaseUrl,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl Service {
    /// Starts `dlock <args> --listen 127.0.0.1:0` and waits for its listening line.
    pub fn start(args: &[&str]) -> Service {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        Service::start_owned(args, "127.0.0.1:0")
    }

    /// [`Service::start`], and a channel that receives one `()` per stderr line containing
    /// `needle` (the line is echoed to this process's stderr too).
    pub fn start_watching(args: &[&str], needle: &str) -> (Service, mpsc::Receiver<()>) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let (tx, rx) = mpsc::channel();
        let svc = Service::spawn(args, "127.0.0.1:0", Some((needle.to_owned(), tx)));
        (svc, rx)
    }

    /// [`Service::start`] with `env` set on top of the harness's (e.g. its own credentials).
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Service {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Service::spawn_env(args, "127.0.0.1:0", None, env, None)
    }

    /// [`Service::start_with_env`], keeping every line the process writes (stdout and
    /// stderr, in arrival order per stream) in `transcript`: for the secret scan.
    pub fn start_recorded(args: &[&str], env: &[(&str, &str)], transcript: &Transcript) -> Service {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Service::spawn_env(args, "127.0.0.1:0", None, env, Some(transcript.clone()))
    }

    /// [`Service::start_watching`] with `env` set on top of the harness's.
    pub fn start_watching_with_env(args: &[&str], needle: &str, env: &[(&str, &str)]) -> (Service, mpsc::Receiver<()>) {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        let (tx, rx) = mpsc::channel();
        let svc = Service::spawn_env(args, "127.0.0.1:0", Some((needle.to_owned(), tx)), env, None);
        (svc, rx)
    }

    fn start_owned(args: Vec<String>, listen: &str) -> Service {
        Service::spawn(args, listen, None)
    }

    fn spawn(args: Vec<String>, listen: &str, watch: Option<(String, mpsc::Sender<()>)>) -> Service {
        Service::spawn_env(args, listen, watch, Vec::new(), None)
    }

    /// Every process carries the harness credentials (authentication stays on, E-13):
    /// `DLOCK_AUTH_CREDENTIALS` for the services and `DLOCK_EXECUTOR_AUTH_TOKEN` for an
    /// executor; `env` is set on top.
    fn spawn_env(
        args: Vec<String>,
        listen: &str,
        watch: Option<(String, mpsc::Sender<()>)>,
        env: Vec<(String, String)>,
        record: Option<Transcript>,
    ) -> Service {
        let mut child = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(&args)
            .args(["--listen", listen])
            .envs(grant_env())
            .env("DLOCK_LOG", "warn")
            .env("DLOCK_AUTH_CREDENTIALS", dlock_testkit::auth::credentials())
            .env("DLOCK_EXECUTOR_AUTH_TOKEN", dlock_testkit::auth::WORKER_TOKEN)
            .envs(env.clone())
            .stdout(Stdio::piped())
            .stderr(if watch.is_some() || record.is_some() { Stdio::piped() } else { Stdio::inherit() })
            .spawn()
            .expect("spawn dlock");
        if let Some((needle, tx)) = watch {
            let stderr = child.stderr.take().expect("stderr is piped when watched");
            std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    eprintln!("{line}");
                    if line.contains(&needle) {
                        let _ = tx.send(());
                    }
                }
            });
        }
        let transcript_of = record.clone();
        let mut recorder = None;
        if let (Some(t), Some(stderr)) = (record.clone(), child.stderr.take()) {
            recorder = Some(std::thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    t.push(line);
                }
            }));
        }
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(t) = &record {
                    t.push(line.clone());
                }
                if let Some(addr) = line.split(" listening on ").nth(1) {
                    let _ = tx.send(addr.trim().to_owned());
                }
            }
        });
        let addr = match rx.recv_timeout(Duration::from_millis(START_MS_MAX)) {
            Ok(a) => a,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                // The pipe closed with the process: everything it wrote is in the transcript.
                let _ = recorder.map(std::thread::JoinHandle::join);
                let said = transcript_of.map(|t| t.lines().join("\n")).unwrap_or_default();
                panic!("dlock {args:?} did not print its listening line within {START_MS_MAX} ms\n{said}");
            }
        };
        let base = BaseUrl::parse(&format!("http://{addr}")).expect("base url");
        Service { child, addr, base, args, env }
    }

    /// SIGKILLs the process (no graceful shutdown) and starts it again on the same address.
    pub fn crash_and_restart(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let fresh = Service::spawn_env(self.args.clone(), &self.addr, None, self.env.clone(), None);
        drop(std::mem::replace(self, fresh));
    }

    /// Sends SIGTERM and waits (with a deadline) for the process to exit on its own.
    pub fn terminate(&mut self, deadline: Duration) -> Option<std::process::ExitStatus> {
        let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
        let start = std::time::Instant::now();
        while start.elapsed() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    /// The process id, for signals (SIGSTOP / SIGCONT).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The harness's client: it presents the harness token of the role each endpoint needs.
/// `dlock executor` against these services as `owner`, then `extra` flags.
pub fn executor_args(lock: &Service, payment: &Service, proxy: &Service, owner: &str, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = ["executor", "--lock-url", &lock.url(), "--payment-url", &payment.url()]
        .into_iter()
        .map(str::to_owned)
        .collect();
    args.extend(["--proxy-url".to_owned(), proxy.url(), "--owner-id".to_owned(), owner.to_owned()]);
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// Borrows owned arguments as [`Service::start`] takes them.
pub fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

/// `dlock lock-server` on the test etcd (`DLOCK_TEST_ETCD_ENDPOINTS`, which
/// `scripts/test.sh` sets; a test fails without it, it never skips) under `prefix`, then
/// `extra`.
pub fn etcd_lock_server_args(prefix: &str, extra: &[&str]) -> Vec<String> {
    let endpoints = std::env::var("DLOCK_TEST_ETCD_ENDPOINTS")
        .expect("DLOCK_TEST_ETCD_ENDPOINTS is not set: run ./scripts/test.sh, which starts etcd");
    let mut args: Vec<String> =
        ["lock-server", "--backend", "etcd", "--etcd-endpoints", &endpoints, "--etcd-prefix", prefix]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// How long after `sent` an acquire (`try_acquire`: its status and body) is first answered
/// `200`, asked again every `every` while it is refused `409`; fails with `what` once `bound`
/// has passed, and on any other answer.
pub async fn granted_after<F, Fut>(
    mut try_acquire: F,
    sent: std::time::Instant,
    bound: Duration,
    every: Duration,
    what: &str,
) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = (u16, Value)>,
{
    loop {
        let (s, v) = try_acquire().await;
        match s {
            200 => return sent.elapsed(),
            409 => {}
            other => panic!("the contender was answered {other}: {v}"),
        }
        assert!(sent.elapsed() < bound, "{what}");
        tokio::time::sleep(every).await;
    }
}

pub fn client() -> HttpClient {
    dlock_testkit::auth::client(1_000, 20_000)
}

/// A client without any credential.
pub fn anonymous_client() -> HttpClient {
    HttpClient::new(1_000, 20_000)
}

pub async fn get(svc: &Service, path: &str) -> ClientResponse {
    client().send(&svc.base, http::Method::GET, path, &[], None).await.expect("GET")
}

pub fn json_of(r: &ClientResponse) -> Value {
    serde_json::from_slice(&r.body).unwrap_or(Value::Null)
}

/// Inserts a CLAIMED payout and returns its id.
pub async fn claimed_payout(store: &dyn RailStore, account: &str, amount_minor: i64) -> Uuid {
    let id = Uuid::new_v4();
    store
        .insert_payout(
            &NewPayout {
                payout_id: id,
                account_id: account.to_owned(),
                amount_minor,
                currency: "EUR".into(),
                beneficiary_ref: "ben-1".into(),
                state: PayoutState::Claimed,
            },
            dlock_rt::Clock::system().wall(),
        )
        .await
        .expect("insert payout");
    id
}

/// The environment every harness process gets: the lock server signs grants with the test
/// key ([`dlock_contract::grant::testing`]), and the resources trust its public key, so a
/// test signs its own fenced writes with [`sign_payout`] (C3-extensions E-14).
pub fn grant_env() -> Vec<(String, String)> {
    static KEY_FILE: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    let path = KEY_FILE.get_or_init(|| {
        let path = std::env::temp_dir().join(format!("dlock-test-grant-{}.key", std::process::id()));
        std::fs::write(&path, dlock_contract::grant::seed_text(&dlock_contract::grant::testing::SEED))
            .expect("write the test signing key");
        path
    });
    let public = dlock_contract::grant::testing::signer().verify_key().to_base64();
    vec![
        ("DLOCK_LOCK_GRANTS_SIGNING_KEY_FILE".into(), path.display().to_string()),
        ("DLOCK_PAYMENT_GRANTS_VERIFY_KEYS".into(), public.clone()),
        ("DLOCK_RAIL_PROXY_GRANTS_VERIFY_KEYS".into(), public),
    ]
}

/// The test key's `X-Fencing-Signature` for a grant of `payout:{account}` (`token` as
/// text: a malformed one, which the resource refuses before any signature, gets none).
pub fn sign_payout(account: &str, token: &str, owner: &str) -> Option<String> {
    let t: i64 = token.parse().ok()?;
    Some(dlock_contract::grant::testing::sign_payout(account, t, owner))
}

/// The account of `payout` as the payment-resource stores it (for signing a grant).
pub async fn account_of(payment: &BaseUrl, payout: Uuid) -> String {
    let r = client().send(payment, http::Method::GET, &format!("/v1/payouts/{payout}"), &[], None).await;
    let r = r.expect("payout read answered");
    json_of(&r)["accountId"].as_str().unwrap_or_default().to_owned()
}

/// `token` with the test key's signature for `payout`'s stored account and `owner`.
pub async fn signed_token(
    payment: &BaseUrl,
    payout: Uuid,
    token: i64,
    owner: &str,
) -> dlock_contract::grant::SignedToken {
    let account = account_of(payment, payout).await;
    let t = dlock_contract::FencingToken::new(token).expect("token > 0");
    dlock_contract::grant::SignedToken::new(t, sign_payout(&account, &token.to_string(), owner))
}

/// `POST /v1/rail/submissions` for `payout` with `token`; the transport's verdict as is.
pub async fn try_submit(
    proxy: &BaseUrl,
    payout: Uuid,
    account: &str,
    amount_minor: i64,
    token: &str,
) -> Result<ClientResponse, ClientError> {
    let body = json!({
        "payoutId": payout,
        "accountId": account,
        "amountMinor": amount_minor,
        "currency": "EUR",
        "beneficiaryRef": "ben-1",
    });
    let key = format!("payout:{payout}");
    let signature = sign_payout(account, token, "worker-1");
    let mut headers = vec![
        ("content-type", "application/json"),
        ("x-fencing-token", token),
        ("x-owner-id", "worker-1"),
        ("x-idempotency-key", &key),
    ];
    if let Some(sig) = &signature {
        headers.push(("x-fencing-signature", sig.as_str()));
    }
    client().send(proxy, http::Method::POST, "/v1/rail/submissions", &headers, Some(body.to_string().into())).await
}

/// `POST /v1/rail/submissions` for `payout` with `token`, which must be answered.
pub async fn submit(proxy: &Service, payout: Uuid, account: &str, amount_minor: i64, token: &str) -> ClientResponse {
    try_submit(&proxy.base, payout, account, amount_minor, token).await.expect("submission answered")
}

/// [`try_submit`] on its own task, for a submission to stay in flight while the test acts.
pub fn submit_in_background(
    proxy: &Service,
    payout: Uuid,
    account: &str,
    amount_minor: i64,
    token: &str,
) -> tokio::task::JoinHandle<Result<ClientResponse, ClientError>> {
    let (base, account, token) = (proxy.base.clone(), account.to_owned(), token.to_owned());
    tokio::spawn(async move { try_submit(&base, payout, &account, amount_minor, &token).await })
}

/// Polls the rail's call log until it holds `n` calls, within [`RAIL_CALLS_WAIT_MS_MAX`].
pub async fn wait_for_rail_calls(stub: &Service, n: usize) {
    let seen = dlock_rt::wait_until(
        dlock_rt::Duration::from_millis(20),
        dlock_rt::Duration::from_millis(RAIL_CALLS_WAIT_MS_MAX),
        || async { (rail_calls(stub).await.len() >= n).then_some(()) },
    )
    .await;
    assert!(seen.is_some(), "the rail did not see {n} call(s) within {RAIL_CALLS_WAIT_MS_MAX} ms");
}

/// Longest a test waits for the rail to log an expected call.
pub const RAIL_CALLS_WAIT_MS_MAX: u64 = 10_000;

/// The rail's own record: every inbound call, in arrival order.
pub async fn rail_calls(stub: &Service) -> Vec<Value> {
    let r = get(stub, "/calls").await;
    json_of(&r)["calls"].as_array().cloned().unwrap_or_default()
}

/// A payment client of `svc` as a worker holds one (C3 §3.8 budgets), with this harness's
/// longer read budget for writes: a `dlock` process on a busy machine may answer slowly.
pub fn payment_client(svc: &Service) -> dlock_payment_client::PaymentClient {
    let mut cfg = dlock_payment_client::PaymentClientConfig::new(svc.base.clone());
    cfg.write_read_timeout_ms = client().read_timeout_ms;
    cfg.bearer = Some(dlock_testkit::auth::bearer());
    dlock_payment_client::PaymentClient::new(cfg).expect("payment client")
}

/// Opens `account_id` in EUR with `opening_minor`, as operator `ops` under `key`.
pub async fn open_account(
    payment: &dlock_payment_client::PaymentClient,
    key: &str,
    account_id: &str,
    opening_minor: i64,
) -> dlock_contract::payment::AccountBody {
    let body = dlock_contract::payment::NewAccountRequest {
        account_id: account_id.to_owned(),
        currency: "EUR".into(),
        opening_balance_minor: opening_minor,
    };
    let (ops, key) = (ops(), dlock_contract::IdempotencyKey::parse(key).expect("key"));
    payment.create_account(&ops, &key, &body).await.expect("account opened")
}

/// Creates a PENDING EUR payout on `account_id`, as operator `ops` under `key`.
pub async fn create_payout(
    payment: &dlock_payment_client::PaymentClient,
    key: &str,
    account_id: &str,
    amount_minor: i64,
    beneficiary_ref: &str,
) -> dlock_contract::payment::PayoutBody {
    let body = dlock_contract::payment::NewPayoutRequest {
        payout_id: None,
        account_id: account_id.to_owned(),
        amount_minor,
        currency: "EUR".into(),
        beneficiary_ref: beneficiary_ref.to_owned(),
    };
    let (ops, key) = (ops(), dlock_contract::IdempotencyKey::parse(key).expect("key"));
    payment.create_payout(&ops, &key, &body).await.expect("payout created")
}

fn ops() -> dlock_contract::OwnerId {
    dlock_contract::OwnerId::parse("ops").expect("owner")
}

/// A child process killed and reaped when dropped (whatever the test's outcome).
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The payment client of `base` holding the bearer `token` (an operator seeding a run).
pub fn payment_client_with(base: &BaseUrl, token: &str) -> dlock_payment_client::PaymentClient {
    let mut cfg = dlock_payment_client::PaymentClientConfig::new(base.clone());
    cfg.write_read_timeout_ms = 5_000;
    cfg.bearer = Some(dlock_rt::http::Bearer::fixed(dlock_contract::auth::Secret::new(token)));
    dlock_payment_client::PaymentClient::new(cfg).expect("payment client")
}

/// The first token of `role` in a credentials file's text (`dlock up`'s, say).
pub fn token_of(text: &str, role: &str) -> String {
    text.lines()
        .filter_map(|l| l.split_once(' '))
        .find(|(r, _)| *r == role)
        .map(|(_, rest)| rest.split_whitespace().next().unwrap_or_default().to_owned())
        .unwrap_or_else(|| panic!("no {role} credential"))
}

/// An idempotency key from a literal.
pub fn key(k: &str) -> dlock_contract::IdempotencyKey {
    dlock_contract::IdempotencyKey::parse(k).expect("key")
}
