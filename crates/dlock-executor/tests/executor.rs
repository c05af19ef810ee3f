//! The executor against real services in process (lock server, payment-resource, rail-proxy
//! and rail-stub on loopback, over simulation stores) and against scripted fakes that pin
//! each hop's retry rule (C3 §3.8).
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use dlock_config::{Layers, Profile};
use dlock_contract::payment::{NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_executor::{Executor, ExecutorConfig, Outcome};
use dlock_lock_client::Session;
use dlock_lock_server::store_mem::MemLockStore;
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_payment_resource::store::{is_system_account, Direction, PaymentStore};
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_rt::http::BaseUrl;
use dlock_rt::Clock;
use serde_json::{json, Value};
use uuid::Uuid;

/// Serves `router` on a loopback port until the returned sender is dropped.
async fn serve(router: axum::Router) -> (BaseUrl, tokio::sync::oneshot::Sender<()>) {
    let listener = dlock_rt::http::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("bind");
    let url = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(dlock_rt::http::serve(listener, router, async {
        let _ = rx.await;
    }));
    (url, tx)
}

struct Cluster {
    lock: BaseUrl,
    payment: BaseUrl,
    proxy: BaseUrl,
    stub: BaseUrl,
    paydb: Arc<MemPaydb>,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// A loopback listener and its URL.
async fn listener() -> (tokio::net::TcpListener, BaseUrl) {
    let listener = dlock_rt::http::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("bind");
    let url = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
    (listener, url)
}

/// A shutdown signal that fires when the returned sender is dropped.
fn stop_signal() -> (impl std::future::Future<Output = ()> + Send + 'static, tokio::sync::oneshot::Sender<()>) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    (
        async {
            let _ = rx.await;
        },
        tx,
    )
}

/// The lock server over the simulation store, started through its entry point.
async fn lock_server(locks: Arc<MemLockStore>) -> (BaseUrl, tokio::sync::oneshot::Sender<()>) {
    let mut cfg = dlock_lock_server::config::resolve(&authed(&[]), Profile::Production).expect("defaults").config;
    // Signs its grants with the test key, which the resources below trust (C3-extensions E-14).
    cfg.signer = Some(dlock_contract::grant::testing::signer());
    let (l, url) = listener().await;
    let (signal, stop) = stop_signal();
    dlock_lock_server::start(cfg, locks, Clock::system(), l, signal).await.expect("lock server");
    (url, stop)
}

/// Every service through its crate's entry point, the rail-stub's knobs set by `stub` (C5
/// keys `rail.stub.*`).
async fn cluster(stub: &[(&str, &str)]) -> Cluster {
    let (lock, s1) = lock_server(Arc::new(MemLockStore::new(Clock::system()))).await;
    let paydb = Arc::new(MemPaydb::new());
    let public = dlock_contract::grant::testing::signer().verify_key().to_base64();
    let pay_layers = authed(&[("payment.grants.verify-keys", &public)]);
    let pay_cfg = dlock_payment_resource::config::resolve(&pay_layers, Profile::Production).expect("ok").config;
    let (l, payment) = listener().await;
    let (signal, s2) = stop_signal();
    dlock_payment_resource::start(pay_cfg, paydb.clone(), Clock::system(), l, signal).await.expect("payment");
    let stub_cfg = dlock_rail_stub::config::resolve(&Layers::of(stub), Profile::Production).expect("stub").config;
    let (l, stub_url) = listener().await;
    let (signal, s3) = stop_signal();
    dlock_rail_stub::start(stub_cfg, Clock::system(), l, signal).await.expect("stub");
    let rail = format!("http://{}", stub_url.authority);
    let proxy_layers = authed(&[("rail.proxy.rail-url", &rail), ("rail.proxy.grants.verify-keys", &public)]);
    let proxy_cfg = dlock_rail_proxy::config::resolve(&proxy_layers, Profile::Production).expect("proxy").config;
    let (l, proxy) = listener().await;
    let (signal, s4) = stop_signal();
    dlock_rail_proxy::start(proxy_cfg, paydb.clone(), Clock::system(), l, signal).await.expect("proxy");
    Cluster { lock, payment, proxy, stub: stub_url, paydb, _stops: vec![s1, s2, s3, s4] }
}

/// Opens `accounts` accounts and `n` payouts spread over them through the payment client;
/// returns the payout ids.
async fn seed(c: &Cluster, accounts: usize, n: usize, opening: i64, amount: i64) -> Vec<Uuid> {
    let mut pcfg = PaymentClientConfig::new(c.payment.clone());
    pcfg.bearer = Some(dlock_testkit::auth::bearer());
    let client = PaymentClient::new(pcfg).expect("client");
    let ops = OwnerId::parse("ops").expect("owner");
    let key = |k: String| IdempotencyKey::parse(&k).expect("key");
    for a in 0..accounts {
        let body = NewAccountRequest {
            account_id: format!("acct-{a}"),
            currency: "EUR".into(),
            opening_balance_minor: opening,
        };
        client.create_account(&ops, &key(format!("open-{a}")), &body).await.expect("account opened");
    }
    let mut ids = Vec::new();
    for i in 0..n {
        let body = NewPayoutRequest {
            payout_id: None,
            account_id: format!("acct-{}", i % accounts),
            amount_minor: amount,
            currency: "EUR".into(),
            beneficiary_ref: format!("ben-{i}"),
        };
        let created = client.create_payout(&ops, &key(format!("create-{i}")), &body).await.expect("payout created");
        ids.push(created.payout_id);
    }
    ids
}

fn config(lock: &BaseUrl, payment: &BaseUrl, proxy: &BaseUrl, owner: &str) -> ExecutorConfig {
    let mut cfg =
        ExecutorConfig::new(lock.clone(), payment.clone(), proxy.clone(), OwnerId::parse(owner).expect("owner"));
    cfg.poll_interval_ms = 20;
    cfg.bearer = Some(dlock_testkit::auth::bearer_of(dlock_contract::auth::Role::Worker));
    cfg
}

/// Layers of `pairs` with the harness credentials (authentication on, as in production).
fn authed(pairs: &[(&str, &str)]) -> Layers {
    let mut l = Layers::of(pairs);
    l.set_flag("auth.credentials", dlock_testkit::auth::credentials());
    l
}

/// Longest the end-to-end tests wait for the queue to drain.
const DRAIN_MS_MAX: u64 = 60_000;

async fn states(paydb: &MemPaydb, ids: &[Uuid]) -> BTreeMap<Uuid, PayoutState> {
    let mut out = BTreeMap::new();
    for id in ids {
        let p = PaymentStore::payout(paydb, *id).await.expect("read").expect("exists");
        out.insert(*id, p.state);
    }
    out
}

async fn rail_calls(stub: &BaseUrl) -> Vec<String> {
    let r = dlock_testkit::auth::client(1_000, 5_000)
        .send(stub, http::Method::GET, "/calls", &[], None)
        .await
        .expect("calls");
    let v: Value = serde_json::from_slice(&r.body).expect("json");
    v["calls"].as_array().into_iter().flatten().filter_map(|c| c["clientRef"].as_str().map(str::to_owned)).collect()
}

/// Asserts the rail-stub was called exactly once for each of `ids` and for nothing else.
async fn assert_one_rail_call_each(c: &Cluster, ids: &[Uuid], what: &str) {
    let mut calls = rail_calls(&c.stub).await;
    calls.sort();
    let mut expected: Vec<String> = ids.iter().map(Uuid::to_string).collect();
    expected.sort();
    assert_eq!(calls, expected, "{what}");
}

async fn assert_ledger_balances(paydb: &MemPaydb) {
    for a in PaymentStore::accounts(paydb).await.expect("accounts") {
        if !is_system_account(&a.account_id) {
            assert_eq!(a.balance_minor, a.ledger_sum_minor, "{}", a.account_id);
            assert!(a.balance_minor - a.reserved_minor >= 0, "{}", a.account_id);
        }
    }
    let ledger = PaymentStore::ledger(paydb, None).await.expect("ledger");
    let side = |d| ledger.iter().filter(|e| e.direction == d).map(|e| e.amount_minor).sum::<i64>();
    assert_eq!(side(Direction::Debit), side(Direction::Credit));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn executors_settle_every_payout_once_with_a_balanced_ledger() {
    let c = cluster(&[]).await;
    let ids = seed(&c, 3, 24, 100_000, 1_000).await;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut runs = Vec::new();
    let mut executors = Vec::new();
    for e in 0..2 {
        let mut cfg = config(&c.lock, &c.payment, &c.proxy, &format!("executor-{e}"));
        cfg.concurrency = 3;
        let ex = Executor::new(cfg, Clock::system()).expect("config");
        executors.push(ex.clone());
        runs.push(tokio::spawn(ex.run(stop_rx.clone())));
    }
    let done = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(DRAIN_MS_MAX), || async {
        states(&c.paydb, &ids).await.values().all(|s| *s == PayoutState::Posted).then_some(())
    })
    .await;
    let _ = stop_tx.send(true);
    for r in runs {
        r.await.expect("executor stops");
    }
    assert!(done.is_some(), "not every payout was posted: {:?}", states(&c.paydb, &ids).await);
    assert_one_rail_call_each(&c, &ids, "each payout reaches the rail exactly once").await;
    assert_ledger_balances(&c.paydb).await;
    let posted: u64 = executors.iter().map(|e| e.metrics.get(Outcome::Posted)).sum();
    assert_eq!(posted, ids.len() as u64);
    let fenced: u64 = executors.iter().map(|e| e.metrics.get(Outcome::Fenced)).sum();
    assert_eq!(fenced, 0, "no executor was fenced out in a run without pauses");
}

/// Cut 6: with affinity, only executor 0 of 2 runs (executor 1 is dead from the start):
/// its own accounts' payouts come first, and once its run is dry it takes executor 1's
/// accounts too. Every payout is posted exactly once: preference never costs liveness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lone_executor_with_affinity_also_settles_the_accounts_of_a_dead_peer() {
    let c = cluster(&[]).await;
    let ids = seed(&c, 4, 16, 100_000, 1_000).await;
    let theirs = (0..4).filter(|a| dlock_executor::worker::affinity_of(&format!("acct-{a}"), 2) == 1).count();
    assert!(theirs > 0, "the dead peer owns some of the accounts");
    let mut cfg = config(&c.lock, &c.payment, &c.proxy, "executor-0");
    (cfg.concurrency, cfg.affinity_index, cfg.affinity_count) = (2, 0, 2);
    let ex = Executor::new(cfg, Clock::system()).expect("config");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(ex.clone().run(stop_rx));
    let done = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(DRAIN_MS_MAX), || async {
        states(&c.paydb, &ids).await.values().all(|s| *s == PayoutState::Posted).then_some(())
    })
    .await;
    let _ = stop_tx.send(true);
    run.await.expect("stops");
    assert!(done.is_some(), "not every payout was posted: {:?}", states(&c.paydb, &ids).await);
    assert_one_rail_call_each(&c, &ids, "each payout reaches the rail exactly once").await;
    assert_eq!(ex.metrics.get(Outcome::Posted), ids.len() as u64);
    assert_ledger_balances(&c.paydb).await;
}

/// Cut 5: the final release (after the post answered) is sent from a background task:
/// the critical section has returned, the release still lands with the session open, it
/// is timed as the `release` hop (the only release of the success path: the post's newer
/// grant is a rotate, timed as an `acquire`), and a drain waits for it within its bound.
#[tokio::test]
async fn the_final_release_is_sent_in_the_background_timed_and_drained() {
    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    let client = r.executor.lock_client(0).expect("client");
    let session = client.open_session().await.expect("session");
    let c = dlock_executor::worker::Candidate {
        payout_id: r.payout,
        account_id: "acct-1".into(),
        state: PayoutState::Pending,
        created_at: None,
    };
    assert_eq!(r.executor.execute(&session, "executor-1/0", &c).await, Some(Outcome::Posted));
    assert!(r.executor.drain_releases().await, "drained within RELEASE_DRAIN_MS_MAX");
    assert_eq!(r.executor.releases_in_flight(), 0);
    assert!(r.lock_is_free().await, "released while the session is still open");
    let text = r.executor.metrics.render();
    assert_eq!(sample(&text, "payout_hop_seconds_count{hop=\"release\"}"), 1.0, "{text}");
    assert_eq!(sample(&text, "payout_hop_seconds_count{hop=\"acquire\"}"), 2.0, "the acquire and the rotate: {text}");
    let _ = session.close().await;
}

/// Runs one executor until every payout in `ids` is terminal; returns the final states.
async fn drain(c: &Cluster, ids: &[Uuid]) -> (Arc<Executor>, BTreeMap<Uuid, PayoutState>) {
    drain_until(c, ids, |_| true).await
}

/// [`drain`], and also until `settled` holds of the executor (polled with the same deadline).
async fn drain_until(
    c: &Cluster,
    ids: &[Uuid],
    settled: impl Fn(&Executor) -> bool,
) -> (Arc<Executor>, BTreeMap<Uuid, PayoutState>) {
    drain_tuned(c, ids, |_| {}, settled).await
}

/// [`drain_until`] with the executor's settings changed by `tune` first.
async fn drain_tuned(
    c: &Cluster,
    ids: &[Uuid],
    tune: impl FnOnce(&mut ExecutorConfig),
    settled: impl Fn(&Executor) -> bool,
) -> (Arc<Executor>, BTreeMap<Uuid, PayoutState>) {
    let mut cfg = config(&c.lock, &c.payment, &c.proxy, "executor-1");
    tune(&mut cfg);
    let ex = Executor::new(cfg, Clock::system()).expect("config");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(ex.clone().run(stop_rx));
    let _ = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(DRAIN_MS_MAX), || async {
        (states(&c.paydb, ids).await.values().all(|s| s.is_terminal()) && settled(&ex)).then_some(())
    })
    .await;
    let _ = stop_tx.send(true);
    run.await.expect("stops");
    (ex.clone(), states(&c.paydb, ids).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payout_the_balance_cannot_cover_fails_and_never_reaches_the_rail() {
    let c = cluster(&[]).await;
    // 1 500 covers one of the two payouts of 1 000.
    let ids = seed(&c, 1, 2, 1_500, 1_000).await;
    let (ex, states) = drain(&c, &ids).await;
    let posted: Vec<Uuid> = states.iter().filter(|(_, s)| **s == PayoutState::Posted).map(|(id, _)| *id).collect();
    let failed = states.values().filter(|s| **s == PayoutState::Failed).count();
    assert_eq!((posted.len(), failed), (1, 1), "{states:?}");
    assert_eq!(rail_calls(&c.stub).await, vec![posted[0].to_string()], "the unfunded payout never reaches the rail");
    assert_eq!((ex.metrics.get(Outcome::Posted), ex.metrics.get(Outcome::Failed)), (1, 1));
    assert_ledger_balances(&c.paydb).await;
}

/// `GET /metrics` of the service at `url`, as text.
async fn metrics_of(url: &BaseUrl) -> String {
    let r = dlock_testkit::auth::client(1_000, 5_000)
        .send(url, http::Method::GET, "/metrics", &[], None)
        .await
        .expect("metrics");
    assert_eq!(r.status, 200);
    String::from_utf8_lossy(&r.body).into_owned()
}

/// The value of the sample line `series` in `text`.
fn sample(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')).and_then(|v| v.parse().ok()))
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_hop_the_rail_call_the_store_calls_and_each_payout_end_to_end_are_timed() {
    let c = cluster(&[]).await;
    // 1 500 covers one of the two payouts of 1 000: one is posted, one fails at the claim.
    let ids = seed(&c, 1, 2, 1_500, 1_000).await;
    // The backlog gauge is set by each scan: wait for a scan after the last payout ended too.
    // One payout per grant: the single writes' hops (a batch's are timed once per batch).
    let tune = |cfg: &mut ExecutorConfig| cfg.payouts_per_grant_max = 1;
    let (ex, states) = drain_tuned(&c, &ids, tune, |ex| ex.metrics.backlog_age_ms() == 0).await;
    assert!(states.values().all(|s| s.is_terminal()), "{states:?}");
    let text = ex.metrics.render();
    let hop = |h: &str| sample(&text, &format!("payout_hop_seconds_count{{hop=\"{h}\"}}"));
    // Two claims; the acquire and the rotates (timed as acquires); one release at least (the
    // posted payout's grant is passed on to the other payout's claim, not released).
    for (h, at_least) in [("acquire", 2.0), ("claim", 2.0), ("release", 1.0)] {
        assert!(hop(h) >= at_least, "{h}: {text}");
    }
    // FR-14: a PENDING candidate's fenced claim is its re-read, and the claim's answer
    // carries the payout's terms (C3-extensions C-30): no P4 read.
    assert_eq!(hop("reread"), 0.0, "{text}");
    // The unfunded payout never reaches the rail: one submit, one post.
    assert_eq!((hop("submit"), hop("post")), (1.0, 1.0), "{text}");
    assert!(hop("acquire") >= 3.0, "the post needs a newer grant (a rotate, timed as an acquire): {text}");
    let e2e = |o: &str| sample(&text, &format!("payout_end_to_end_seconds_count{{outcome=\"{o}\"}}"));
    assert_eq!((e2e("posted"), e2e("failed")), (1.0, 1.0), "{text}");
    assert!(sample(&text, "payout_end_to_end_seconds_sum{outcome=\"posted\"}") > 0.0, "{text}");
    assert_eq!(sample(&text, "payout_backlog_age_seconds"), 0.0, "the last scan found nothing PENDING");

    let proxy = metrics_of(&c.proxy).await;
    assert_eq!(sample(&proxy, "rail_call_seconds_count{outcome=\"acked\"}"), 1.0, "{proxy}");
    assert_eq!(sample(&proxy, "rail_call_seconds_count{outcome=\"ambiguous\"}"), 0.0, "{proxy}");
    assert_eq!(sample(&proxy, "rail_store_op_seconds_count{op=\"admit\"}"), 1.0, "{proxy}");
    assert_eq!(sample(&proxy, "rail_store_op_seconds_count{op=\"resolve\"}"), 1.0, "{proxy}");
    let payment = metrics_of(&c.payment).await;
    assert!(sample(&payment, "payout_store_op_seconds_count{op=\"claim\"}") >= 2.0, "{payment}");
    assert_eq!(sample(&payment, "payout_store_op_seconds_count{op=\"post\"}"), 1.0, "{payment}");
    assert!(sample(&payment, "payout_store_op_seconds_count{op=\"list\"}") >= 1.0, "{payment}");
    let lock = metrics_of(&c.lock).await;
    // The post's newer grant is one rotate (C3-extensions E-18), not a release and an
    // acquire; so is the posted payout's grant passed on to the other payout's claim (a chain).
    assert!(sample(&lock, "lock_store_op_seconds_count{op=\"acquire\"}") >= 1.0, "{lock}");
    assert_eq!(sample(&lock, "lock_store_op_seconds_count{op=\"rotate\"}"), 2.0, "{lock}");
    assert!(sample(&lock, "lock_store_op_seconds_count{op=\"release\"}") >= 1.0, "{lock}");
}

/// Issue 14: a posted payout's grant is rotated into the claim of the next payout of its
/// account in the same pass, instead of a release and an acquire, for at most
/// `executor.chain-payouts-max` payouts; then the account is released and acquired again.
/// Three payouts of one account, one task: with the default bound one acquire, five rotates
/// (three claim-to-post, two post-to-claim) and one release; with 2, two of each chain; with
/// 1, the acquire, rotate and release of every payout. Every payout posted once, never fenced
/// (each grant newer than the last), the ledger balanced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_posted_payouts_grant_is_rotated_into_the_next_claim_of_its_account_up_to_the_chain_bound() {
    for (chain_max, acquires, rotates, releases) in [(16, 1.0, 5.0, 1.0), (2, 2.0, 4.0, 2.0), (1, 3.0, 3.0, 3.0)] {
        let c = cluster(&[]).await;
        let ids = seed(&c, 1, 3, 100_000, 1_000).await;
        // One payout per grant: the chain of single payouts (E-18), not a batch (E-19).
        let tune = |cfg: &mut ExecutorConfig| {
            (cfg.concurrency, cfg.chain_payouts_max, cfg.payouts_per_grant_max) = (1, chain_max, 1)
        };
        let (ex, states) = drain_tuned(&c, &ids, tune, |_| true).await;
        assert!(states.values().all(|s| *s == PayoutState::Posted), "bound {chain_max}: {states:?}");
        assert_eq!(ex.metrics.get(Outcome::Fenced), 0, "bound {chain_max}");
        assert_one_rail_call_each(&c, &ids, &format!("bound {chain_max}: each payout reaches the rail exactly once"))
            .await;
        assert_ledger_balances(&c.paydb).await;
        let lock = metrics_of(&c.lock).await;
        let op = |o: &str| sample(&lock, &format!("lock_store_op_seconds_count{{op=\"{o}\"}}"));
        assert_eq!((op("acquire"), op("rotate"), op("release")), (acquires, rotates, releases), "bound {chain_max}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payout_the_rail_declines_fails_after_exactly_one_call() {
    let c = cluster(&[("rail.stub.decline-rate", "1")]).await;
    let ids = seed(&c, 2, 4, 10_000, 1_000).await;
    let (ex, states) = drain(&c, &ids).await;
    assert!(states.values().all(|s| *s == PayoutState::Failed), "{states:?}");
    assert_one_rail_call_each(&c, &ids, "one call per declined payout, never a second").await;
    assert_eq!(ex.metrics.get(Outcome::Failed), 4);
    assert_ledger_balances(&c.paydb).await;
}

// ---------------------------------------------------------------------------------------
// Scripted fakes: one hop at a time
// ---------------------------------------------------------------------------------------

/// A fake service: answers each path with the next scripted reply (the last one repeats)
/// and records every call.
#[derive(Clone, Default)]
struct Fake {
    script: Arc<Mutex<BTreeMap<String, Vec<Reply>>>>,
    calls: Arc<Mutex<Vec<String>>>,
    /// The JSON body of each call, by path (`Null` when it had none).
    bodies: Arc<Mutex<Vec<(String, Value)>>>,
    /// The `X-Fencing-Token` of each call, by path.
    tokens: Arc<Mutex<Vec<(String, Token)>>>,
    /// The calls answered so far, by path (a delayed reply counts once sent).
    answered: Arc<Mutex<Vec<String>>>,
}

/// A call's `X-Fencing-Token`, when it carried one that parses.
type Token = Option<i64>;

#[derive(Clone)]
enum Reply {
    Json(u16, Value),
    /// Hold the request longer than any client waits.
    Hang,
    /// Answer after this many milliseconds.
    Delayed(u64, u16, Value),
    /// A batch answer (C3-extensions E-19) whose `presentedToken` is the request's token.
    Batch(Value),
}

impl Fake {
    fn on(&self, path: &str, replies: Vec<Reply>) {
        self.script.lock().expect("lock").insert(path.to_owned(), replies);
    }

    fn calls(&self, path: &str) -> usize {
        self.calls.lock().expect("lock").iter().filter(|p| p.as_str() == path).count()
    }

    /// The JSON bodies sent to `path`, in order.
    fn bodies(&self, path: &str) -> Vec<Value> {
        self.bodies.lock().expect("lock").iter().filter(|(p, _)| p == path).map(|(_, b)| b.clone()).collect()
    }

    /// The fencing tokens presented to `path`, in order.
    fn tokens(&self, path: &str) -> Vec<Option<i64>> {
        self.tokens.lock().expect("lock").iter().filter(|(p, _)| p == path).map(|(_, t)| *t).collect()
    }

    fn answered(&self, path: &str) -> usize {
        self.answered.lock().expect("lock").iter().filter(|p| p.as_str() == path).count()
    }
}

async fn fake_answer(State(f): State<Fake>, uri: Uri, headers: http::HeaderMap, body: axum::body::Bytes) -> Response {
    let path = uri.path().to_owned();
    f.calls.lock().expect("lock").push(path.clone());
    let token = headers.get("x-fencing-token").and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok());
    f.tokens.lock().expect("lock").push((path.clone(), token));
    let sent = serde_json::from_slice(&body).unwrap_or(Value::Null);
    f.bodies.lock().expect("lock").push((path.clone(), sent));
    let reply = {
        let mut script = f.script.lock().expect("lock");
        // A script for the path with its query (a list's state) wins over the path's.
        let with_query = uri.path_and_query().map(|p| p.as_str().to_owned()).filter(|p| script.contains_key(p));
        match script.get_mut(&with_query.unwrap_or_else(|| path.clone())) {
            Some(r) if r.len() > 1 => Some(r.remove(0)),
            Some(r) => r.first().cloned(),
            None => None,
        }
    };
    let answered = |f: &Fake| f.answered.lock().expect("lock").push(path.clone());
    match reply {
        Some(Reply::Json(status, body)) => {
            answered(&f);
            (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), axum::Json(body)).into_response()
        }
        Some(Reply::Delayed(ms, status, body)) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            answered(&f);
            (StatusCode::from_u16(status).unwrap_or(StatusCode::OK), axum::Json(body)).into_response()
        }
        Some(Reply::Batch(mut body)) => {
            answered(&f);
            body["presentedToken"] = json!(token);
            (StatusCode::OK, axum::Json(body)).into_response()
        }
        Some(Reply::Hang) => {
            tokio::time::sleep(Duration::from_secs(30)).await;
            StatusCode::GATEWAY_TIMEOUT.into_response()
        }
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

async fn fake() -> (Fake, BaseUrl, tokio::sync::oneshot::Sender<()>) {
    let f = Fake::default();
    let router = axum::Router::new().fallback(fake_answer).with_state(f.clone());
    let (url, stop) = serve(router).await;
    (f, url, stop)
}

/// A C3 envelope for `code`, with the catalogue's `retrySafe` verdict.
fn envelope(code: &str, details: Value) -> Value {
    let retry_safe = serde_json::from_value::<dlock_contract::ErrorCode>(json!(code)).is_ok_and(|c| c.retry_safe());
    json!({"code": code, "message": "m", "retrySafe": retry_safe, "details": details, "traceId": "0".repeat(32)})
}

/// A P4 body (C3 §3.4) of a payout of 100 EUR on `acct-1`.
fn view(payout: Uuid) -> Value {
    json!({"payoutId": payout, "accountId": "acct-1", "amountMinor": 100, "currency": "EUR",
        "beneficiaryRef": "b", "state": "PENDING", "attemptCount": 0, "submissions": [],
        "createdAt": "2025-11-30T11:05:30.123Z", "updatedAt": "2025-11-30T11:05:30.123Z"})
}

struct Rig {
    executor: Arc<Executor>,
    payment: Fake,
    proxy: Fake,
    payout: Uuid,
    lock: BaseUrl,
    _stops: Vec<tokio::sync::oneshot::Sender<()>>,
}

/// A real lock server, and fakes for the payment-resource and the proxy with one PENDING
/// payout on `acct-1`.
async fn rig(tune: impl FnOnce(&mut ExecutorConfig)) -> Rig {
    let (lock, s1) = lock_server(Arc::new(MemLockStore::new(Clock::system()))).await;
    let (payment, payment_url, s2) = fake().await;
    let (proxy, proxy_url, s3) = fake().await;
    let payout = Uuid::new_v4();
    payment.on(&format!("/v1/payouts/{payout}"), vec![Reply::Json(200, view(payout))]);
    let mut cfg = config(&lock, &payment_url, &proxy_url, "executor-1");
    tune(&mut cfg);
    let executor = Executor::new(cfg, Clock::system()).expect("config");
    Rig { executor, payment, proxy, payout, lock, _stops: vec![s1, s2, s3] }
}

impl Rig {
    async fn execute_once(&self) -> Option<Outcome> {
        self.execute_as(0).await
    }

    /// One critical section for the rig's payout by the executor's task `index`, in a
    /// session of its own.
    async fn execute_as(&self, index: usize) -> Option<Outcome> {
        self.execute_candidate(index, PayoutState::Pending).await
    }

    /// One critical section for the rig's payout, found by a scan in `state`.
    async fn execute_candidate(&self, index: usize, state: PayoutState) -> Option<Outcome> {
        let client = self.executor.lock_client(index).expect("client");
        let session = client.open_session().await.expect("session");
        let outcome = self.execute_in(&session, index, state).await;
        let _ = session.close().await;
        outcome
    }

    /// [`Rig::execute_candidate`] in a session the caller opened with task `index`'s client.
    async fn execute_in(&self, session: &Session, index: usize, state: PayoutState) -> Option<Outcome> {
        let c = dlock_executor::worker::Candidate {
            payout_id: self.payout,
            account_id: "acct-1".into(),
            state,
            created_at: None,
        };
        self.executor.execute(session, &format!("executor-1/{index}"), &c).await
    }

    fn claim_path(&self) -> String {
        format!("/v1/payouts/{}/claim", self.payout)
    }

    fn post_path(&self) -> String {
        format!("/v1/payouts/{}/post", self.payout)
    }

    fn view_path(&self) -> String {
        format!("/v1/payouts/{}", self.payout)
    }

    /// The fencing token of the account's live grant, if any (L7).
    async fn held_token(&self) -> Option<i64> {
        held_token(&self.lock).await
    }

    /// Whether the account's lock is free again (the critical section released it).
    async fn lock_is_free(&self) -> bool {
        lock_view(&self.lock).await["held"] == false
    }
}

const SUBMISSIONS: &str = "/v1/rail/submissions";
/// How long the proxy fake holds a submission's answer where a test looks at what happens
/// meanwhile.
const SUBMISSION_HELD_MS: u64 = 1_500;

/// Acquire requests the lock server at `lock` has answered (its `lock_acquire_total`).
async fn acquires(lock: &BaseUrl) -> u64 {
    let r = dlock_testkit::auth::client(1_000, 2_000)
        .send(lock, http::Method::GET, "/metrics", &[], None)
        .await
        .expect("metrics");
    String::from_utf8_lossy(&r.body)
        .lines()
        .filter(|l| l.starts_with("lock_acquire_total{"))
        .filter_map(|l| l.rsplit(' ').next().and_then(|n| n.parse::<u64>().ok()))
        .sum()
}

/// `acct-1`'s lock as the lock server at `lock` answers L7 (`Null` if unreadable).
async fn lock_view(lock: &BaseUrl) -> Value {
    let r = dlock_testkit::auth::client(1_000, 2_000)
        .send(lock, http::Method::GET, "/v1/locks/payout:acct-1", &[], None)
        .await
        .expect("L7");
    serde_json::from_slice(&r.body).unwrap_or(Value::Null)
}

/// The fencing token of `acct-1`'s live grant on the lock server at `lock`, if any.
async fn held_token(lock: &BaseUrl) -> Option<i64> {
    let v = lock_view(lock).await;
    v["fencingToken"].as_i64().filter(|_| v["held"] == true)
}

#[tokio::test]
async fn a_sibling_task_skips_an_account_its_executor_works_without_asking_the_lock_server() {
    let rig = rig(|_| {}).await;
    // Task 0's claim (a PENDING candidate's re-read, FR-14) is slow, so it holds the
    // account's lock a while.
    rig.payment.on(
        &rig.claim_path(),
        vec![Reply::Delayed(1_500, 409, envelope("PAYOUT_NOT_CLAIMABLE", json!({"state": "POSTED"})))],
    );
    let sibling = async {
        // Task 0's grant, and its acquire counted: the server counts an acquire after its
        // grant commits, so a read of the lock can see the grant before the count has it.
        let held = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(5_000), || async {
            (!rig.lock_is_free().await && acquires(&rig.lock).await >= 1).then_some(())
        })
        .await;
        assert!(held.is_some(), "task 0 never took the account's lock");
        let before = acquires(&rig.lock).await;
        let outcome = rig.execute_as(1).await;
        (outcome, acquires(&rig.lock).await - before)
    };
    let (_, (outcome, asked)) = tokio::join!(rig.execute_once(), sibling);
    assert_eq!(outcome, None, "the sibling worked an account its executor already works");
    assert_eq!(asked, 0, "the sibling asked the lock server for an account its executor already works");
}

/// A P2 `200` body (the fakes do not check which payout it names).
fn claim_ack() -> Value {
    json!({"payoutId": Uuid::nil(), "state": "CLAIMED", "claimToken": 1, "accountFence": 1, "attemptCount": 1,
        "idempotencyKey": "payout:k"})
}

fn claimed_ok() -> Reply {
    Reply::Json(200, claim_ack())
}

fn acked() -> Reply {
    Reply::Json(
        200,
        json!({"submissionId": Uuid::new_v4(), "payoutId": Uuid::nil(), "presentedToken": 1, "outcome": "ACKED",
            "railReference": "RR-1", "submittedAt": "2025-11-30T11:05:30.123Z",
            "resolvedAt": "2025-11-30T11:05:31.000Z"}),
    )
}

/// A P3 `200` body.
fn posted_ok() -> Reply {
    Reply::Json(200, json!({"payoutId": Uuid::nil(), "state": "POSTED", "entries": [], "balanceMinor": 0}))
}

#[tokio::test]
async fn claim_is_retried_once_on_503_and_never_on_a_409() {
    let r = rig(|_| {}).await;
    r.payment.on(
        &r.claim_path(),
        vec![
            Reply::Json(
                503,
                json!({"code": "NOT_READY", "message": "m", "retrySafe": true, "retryAfterMillis": 10,
            "traceId": "0".repeat(32)}),
            ),
            claimed_ok(),
        ],
    );
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    assert_eq!(r.execute_once().await, Some(Outcome::Posted));
    assert_eq!(r.payment.calls(&r.claim_path()), 2, "one retry after a 503");

    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![Reply::Json(409, envelope("PAYOUT_NOT_CLAIMABLE", json!({"state": "POSTED"})))]);
    assert_eq!(r.execute_once().await, Some(Outcome::NotClaimable));
    assert_eq!(r.payment.calls(&r.claim_path()), 1, "a 409 is never retried");
    assert_eq!(r.proxy.calls(SUBMISSIONS), 0);
    assert!(r.lock_is_free().await);
}

/// A P2 `200` body carrying the payout's terms (C3-extensions C-30).
fn claim_ack_with_terms() -> Value {
    json!({"payoutId": Uuid::nil(), "state": "CLAIMED", "claimToken": 1, "accountFence": 1, "attemptCount": 0,
        "idempotencyKey": "payout:k", "accountId": "acct-1", "amountMinor": 250, "currency": "EUR",
        "beneficiaryRef": "ben-claim"})
}

#[tokio::test]
async fn a_pending_candidate_is_claimed_from_the_scan_and_submitted_from_the_claim_answer_without_a_read() {
    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![Reply::Json(200, claim_ack_with_terms())]);
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    assert_eq!(r.execute_once().await, Some(Outcome::Posted));
    assert_eq!(r.payment.calls(&r.view_path()), 0, "the fenced claim is the re-read (FR-14)");
    assert_eq!(r.payment.bodies(&r.claim_path()), [json!({"expectedState": "PENDING"})]);
    let sent = r.proxy.bodies(SUBMISSIONS);
    assert_eq!(sent.len(), 1);
    // The terms are the claim answer's (the P4 body the rig would serve says 100 and "b").
    assert_eq!(
        (&sent[0]["accountId"], &sent[0]["amountMinor"], &sent[0]["currency"], &sent[0]["beneficiaryRef"]),
        (&json!("acct-1"), &json!(250), &json!("EUR"), &json!("ben-claim"))
    );
    assert!(r.lock_is_free().await);
}

#[tokio::test]
async fn a_claimed_candidate_is_reclaimed_from_the_scan_state() {
    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![Reply::Json(200, claim_ack_with_terms())]);
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    assert_eq!(r.execute_candidate(0, PayoutState::Claimed).await, Some(Outcome::Posted));
    assert_eq!(r.payment.bodies(&r.claim_path()), [json!({"expectedState": "CLAIMED"})]);
    assert_eq!(r.payment.calls(&r.view_path()), 0);
}

#[tokio::test]
async fn a_replayed_claim_answer_without_the_terms_falls_back_to_one_read() {
    let r = rig(|_| {}).await;
    // An answer recorded before C-30 (no accountId, amountMinor, currency, beneficiaryRef).
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    assert_eq!(r.execute_once().await, Some(Outcome::Posted));
    assert_eq!(r.payment.calls(&r.view_path()), 1, "one P4 read supplies the terms");
    let sent = r.proxy.bodies(SUBMISSIONS);
    assert_eq!((&sent[0]["amountMinor"], &sent[0]["beneficiaryRef"]), (&json!(100), &json!("b")), "the read's terms");
}

#[tokio::test]
async fn a_stale_scan_state_is_corrected_by_the_claims_refusal() {
    // The scan said PENDING; another executor already claimed and paid it: the refusal names
    // RAIL_ACKED, the payout is read, and its acknowledged attempt is posted.
    let r = rig(|_| {}).await;
    r.payment.on(
        &r.claim_path(),
        vec![Reply::Json(409, envelope("PAYOUT_NOT_CLAIMABLE", json!({"payoutId": r.payout, "state": "RAIL_ACKED"})))],
    );
    let mut acked_view = view(r.payout);
    acked_view["state"] = json!("RAIL_ACKED");
    acked_view["attemptCount"] = json!(1);
    acked_view["submissions"] = json!([{"submissionId": Uuid::from_u128(7), "presentedToken": 1, "outcome": "ACKED",
        "railReference": "RR-7", "submittedAt": "2025-11-30T11:05:30.123Z", "resolvedAt": "2025-11-30T11:05:31.000Z"}]);
    r.payment.on(&r.view_path(), vec![Reply::Json(200, acked_view)]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    assert_eq!(r.execute_once().await, Some(Outcome::Posted));
    assert_eq!((r.payment.calls(&r.claim_path()), r.payment.calls(&r.view_path())), (1, 1));
    assert_eq!(r.proxy.calls(SUBMISSIONS), 0, "a paid payout is never submitted again");
    assert_eq!(r.payment.bodies(&r.post_path())[0]["railReference"], json!("RR-7"));

    // Any other state ends the attempt without a read, and a CLAIMED payout is never claimed
    // a second time under the same grant and key (one identity, one request).
    for state in ["POSTED", "CLAIMED"] {
        let r = rig(|_| {}).await;
        r.payment.on(
            &r.claim_path(),
            vec![Reply::Json(409, envelope("PAYOUT_NOT_CLAIMABLE", json!({"payoutId": r.payout, "state": state})))],
        );
        assert_eq!(r.execute_once().await, Some(Outcome::NotClaimable), "{state}");
        assert_eq!((r.payment.calls(&r.claim_path()), r.payment.calls(&r.view_path())), (1, 0), "{state}");
        assert!(r.lock_is_free().await);
    }
}

#[tokio::test]
async fn fenced_out_at_the_claim_aborts_the_critical_section() {
    let r = rig(|_| {}).await;
    r.payment.on(
        &r.claim_path(),
        vec![Reply::Json(409, envelope("FENCED_OUT", json!({"presentedToken": 1, "highestToken": 9})))],
    );
    assert_eq!(r.execute_once().await, Some(Outcome::Fenced));
    assert_eq!(r.payment.calls(&r.claim_path()), 1);
    assert_eq!(r.proxy.calls(SUBMISSIONS), 0, "nothing is submitted after a fence");
    assert_eq!(r.payment.calls(&r.post_path()), 0);
    assert!(r.lock_is_free().await);
}

#[tokio::test]
async fn fenced_out_at_the_rail_is_neither_retried_nor_posted() {
    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![Reply::Json(409, envelope("FENCED_OUT", json!({"resourceType": "rail"})))]);
    assert_eq!(r.execute_once().await, Some(Outcome::Fenced));
    assert_eq!(r.proxy.calls(SUBMISSIONS), 1);
    assert_eq!(r.payment.calls(&r.post_path()), 0);
}

#[tokio::test]
async fn rail_ambiguous_releases_and_is_never_resubmitted() {
    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![Reply::Json(409, envelope("RAIL_AMBIGUOUS", json!({"submissionId": "s"})))]);
    assert_eq!(r.execute_once().await, Some(Outcome::Ambiguous));
    assert_eq!(r.proxy.calls(SUBMISSIONS), 1);
    assert_eq!(r.payment.calls(&r.post_path()), 0);
    assert!(r.lock_is_free().await);
}

#[tokio::test]
async fn a_submission_whose_answer_is_lost_is_never_retried() {
    let r = rig(|cfg| cfg.submit_read_timeout_ms = 300).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![Reply::Hang]);
    assert_eq!(r.execute_once().await, Some(Outcome::AnswerLost));
    assert_eq!(r.proxy.calls(SUBMISSIONS), 1, "zero retries, ever");
    assert_eq!(r.payment.calls(&r.post_path()), 0);
}

#[tokio::test]
async fn a_503_from_the_proxy_is_not_retried_by_the_executor() {
    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![Reply::Json(503, envelope("RAIL_UNAVAILABLE", json!({})))]);
    assert_eq!(r.execute_once().await, Some(Outcome::Unavailable));
    assert_eq!(r.proxy.calls(SUBMISSIONS), 1);
}

#[tokio::test]
async fn the_post_runs_under_a_newer_grant_than_the_claim() {
    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    assert_eq!(r.execute_once().await, Some(Outcome::Posted));
    // The fakes record paths only; the tokens are checked end to end by the real services in
    // `executors_settle_every_payout_once_with_a_balanced_ledger` (an equal token is fenced).
    assert_eq!(r.payment.calls(&r.post_path()), 1);
    assert!(r.lock_is_free().await);
}

#[tokio::test]
async fn the_posts_newer_grant_is_rotated_while_the_submission_is_in_flight() {
    let r = rig(|_| {}).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    let Reply::Json(_, ack) = acked() else { unreachable!() };
    // The proxy holds its answer long enough for the test to look at the lock server.
    r.proxy.on(SUBMISSIONS, vec![Reply::Delayed(SUBMISSION_HELD_MS, 200, ack)]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    let watch = async {
        let deadline = std::time::Instant::now() + Duration::from_millis(SUBMISSION_HELD_MS);
        loop {
            let claimed = r.payment.tokens(&r.claim_path()).first().copied().flatten();
            let held = r.held_token().await;
            if let (Some(claimed), Some(held)) = (claimed, held) {
                if held > claimed {
                    // Seen with the submission sent and not yet answered.
                    return (r.proxy.calls(SUBMISSIONS), r.proxy.answered(SUBMISSIONS), claimed, held);
                }
            }
            assert!(std::time::Instant::now() < deadline, "no newer grant while the submission was in flight");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    let (outcome, (sent, answered, claimed, rotated)) = tokio::join!(r.execute_once(), watch);
    assert_eq!(outcome, Some(Outcome::Posted));
    assert_eq!((sent, answered), (1, 0), "the rotate went out before the submission's answer");
    assert_eq!(r.proxy.tokens(SUBMISSIONS), vec![Some(claimed)], "the submission carries the claim's token");
    assert_eq!(r.payment.tokens(&r.post_path()), vec![Some(rotated)], "the post carries the rotated one");
}

#[tokio::test]
async fn a_submission_that_outlasts_half_the_rotated_lease_gets_the_post_a_fresh_grant() {
    // A 4 s lease keeps a 2.8 s local deadline (30 % margin); the proxy answers after 1.2 s,
    // leaving the grant rotated beside it less than half a lease (2 s): the post gets one
    // more rotate, while the first one still has time to spare.
    let r = rig(|cfg| cfg.lock_ttl_ms = 4_000).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    let Reply::Json(_, ack) = acked() else { unreachable!() };
    r.proxy.on(SUBMISSIONS, vec![Reply::Delayed(1_200, 200, ack)]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    assert_eq!(r.execute_once().await, Some(Outcome::Posted));
    let rotates = |text: String| sample(&text, "lock_store_op_seconds_count{op=\"rotate\"}");
    assert_eq!(rotates(metrics_of(&r.lock).await), 2.0, "the rotate beside the submission, and one after it");
    let claimed = r.payment.tokens(&r.claim_path())[0].expect("claim token");
    let posted = r.payment.tokens(&r.post_path())[0].expect("post token");
    assert!(posted > claimed, "the post's token {posted} is newer than the claim's {claimed}");

    // A fast answer leaves the first rotate's grant to the post: one rotate.
    let r = rig(|cfg| cfg.lock_ttl_ms = 4_000).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    assert_eq!(r.execute_once().await, Some(Outcome::Posted));
    assert_eq!(rotates(metrics_of(&r.lock).await), 1.0);
}

#[tokio::test]
async fn a_rotated_grant_with_lease_to_spare_is_not_rotated_again_for_its_sessions_nearer_deadline() {
    // A 4 s lease keeps 2.8 s of local lease, and the session beats every 1.33 s: until its
    // first beat, the session's local deadline is 2.8 s from its opening. Taken once less
    // than 1.9 s of it is left (under half a lease, 2 s), the payout's grants are fresh
    // (2.8 s each): the post keeps the grant rotated beside the submission, as its own
    // lease covers the write; a rotate would not have moved the session's deadline.
    let r = rig(|cfg| cfg.lock_ttl_ms = 4_000).await;
    r.payment.on(&r.claim_path(), vec![claimed_ok()]);
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    r.payment.on(&r.post_path(), vec![posted_ok()]);
    let client = r.executor.lock_client(0).expect("client");
    let session = client.open_session().await.expect("session");
    let aged = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(3_000), || async {
        (session.remaining() < Duration::from_millis(1_900)).then_some(())
    })
    .await;
    assert!(aged.is_some(), "the session's local lease fell under 1.9 s: {:?}", session.remaining());
    assert_eq!(r.execute_in(&session, 0, PayoutState::Pending).await, Some(Outcome::Posted));
    let _ = session.close().await;
    let rotates = sample(&metrics_of(&r.lock).await, "lock_store_op_seconds_count{op=\"rotate\"}");
    assert_eq!(rotates, 1.0, "only the rotate beside the submission");
    let claimed = r.payment.tokens(&r.claim_path())[0].expect("claim token");
    let posted = r.payment.tokens(&r.post_path())[0].expect("post token");
    assert!(posted > claimed, "the post's token {posted} is newer than the claim's {claimed}");
}

#[tokio::test]
async fn a_payout_a_sibling_task_settled_during_the_pass_is_not_tried_again() {
    // Two tasks, one scan: a CLAIMED payout (slow: its claim answers after 600 ms) and a
    // PENDING one of another account, in that order in every task's copy (a scan's states
    // keep their order). The task that takes the slow one finds the other already settled
    // by its sibling when it gets to it, and leaves it alone.
    let (lock, s1) = lock_server(Arc::new(MemLockStore::new(Clock::system()))).await;
    let (payment, payment_url, s2) = fake().await;
    let (proxy, proxy_url, s3) = fake().await;
    let _stops = [s1, s2, s3];
    let (slow, fast) = (Uuid::new_v4(), Uuid::new_v4());
    let mut cfg = config(&lock, &payment_url, &proxy_url, "executor-1");
    cfg.concurrency = 2;
    // The fake lists each payout in one scan only: both tasks must work from that one shared
    // scan, so it stays fresh for a second (a task started later than the poll interval on a
    // loaded machine would scan again, find nothing, and leave the PENDING payout unclaimed).
    cfg.poll_interval_ms = 1_000;
    let batch_max = cfg.batch_max;
    let list = |state: &str| format!("/v1/payouts?state={state}&limit={batch_max}");
    let item = |id: Uuid, account: &str, state: &str| {
        json!({"payoutId": id, "accountId": account, "amountMinor": 100, "currency": "EUR", "state": state,
            "attemptCount": 0, "createdAt": "2025-11-30T11:05:30.123Z"})
    };
    let once = |items: Value| vec![Reply::Json(200, json!({ "items": items })), Reply::Json(200, json!({"items": []}))];
    payment.on(&list("CLAIMED"), once(json!([item(slow, "acct-1", "CLAIMED")])));
    payment.on(&list("PENDING"), once(json!([item(fast, "acct-2", "PENDING")])));
    payment.on(&list("RAIL_ACKED"), vec![Reply::Json(200, json!({"items": []}))]);
    let Reply::Json(_, claimed) = claimed_ok() else { unreachable!() };
    payment.on(&format!("/v1/payouts/{slow}/claim"), vec![Reply::Delayed(600, 200, claimed)]);
    let fast_claim = format!("/v1/payouts/{fast}/claim");
    let not_claimable =
        Reply::Json(409, envelope("PAYOUT_NOT_CLAIMABLE", json!({"payoutId": fast, "state": "POSTED"})));
    payment.on(&fast_claim, vec![claimed_ok(), not_claimable]);
    for id in [slow, fast] {
        payment.on(&format!("/v1/payouts/{id}"), vec![Reply::Json(200, view(id))]);
        payment.on(&format!("/v1/payouts/{id}/post"), vec![posted_ok()]);
    }
    proxy.on(SUBMISSIONS, vec![acked()]);
    let ex = Executor::new(cfg, Clock::system()).expect("config");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(ex.clone().run(stop_rx));
    let posts = [format!("/v1/payouts/{slow}/post"), format!("/v1/payouts/{fast}/post")];
    let both = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(DRAIN_MS_MAX), || async {
        posts.iter().all(|p| payment.answered(p) > 0).then_some(())
    })
    .await;
    assert!(both.is_some(), "both payouts posted: {:?}", payment.calls.lock().expect("lock"));
    // Passes have gone on since (idle tasks scan again every poll interval), so the slow
    // task has long been past the other payout; its release has answered.
    let scans = payment.calls("/v1/payouts");
    let settled = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(DRAIN_MS_MAX), || async {
        (ex.releases_in_flight() == 0 && payment.calls("/v1/payouts") >= scans + 12).then_some(())
    })
    .await;
    assert!(settled.is_some(), "the tasks went on scanning");
    let _ = stop_tx.send(true);
    run.await.expect("stops");
    assert_eq!(payment.calls(&fast_claim), 1, "the settled payout was claimed once");
}

#[tokio::test]
async fn a_chained_payouts_grant_is_rotated_while_the_previous_post_is_in_flight() {
    // Two PENDING payouts of one account in the scan: the first one's post keeps a grant for
    // the second, rotated beside the post (which the fake holds) rather than after it.
    let (lock, s1) = lock_server(Arc::new(MemLockStore::new(Clock::system()))).await;
    let (payment, payment_url, s2) = fake().await;
    let (proxy, proxy_url, s3) = fake().await;
    let _stops = [s1, s2, s3];
    let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
    let mut cfg = config(&lock, &payment_url, &proxy_url, "executor-1");
    // One payout per grant: a chain of single payouts (E-18), not a batch (E-19).
    (cfg.concurrency, cfg.payouts_per_grant_max) = (1, 1);
    let pending = format!("/v1/payouts?state=PENDING&limit={}", cfg.batch_max);
    let item = |id: Uuid| {
        json!({"payoutId": id, "accountId": "acct-1", "amountMinor": 100, "currency": "EUR", "state": "PENDING",
            "attemptCount": 0, "createdAt": "2025-11-30T11:05:30.123Z"})
    };
    payment.on(&pending, vec![Reply::Json(200, json!({"items": [item(a), item(b)]}))]);
    let Reply::Json(_, posted) = posted_ok() else { unreachable!() };
    for id in [a, b] {
        payment.on(&format!("/v1/payouts/{id}/claim"), vec![claimed_ok()]);
        payment.on(&format!("/v1/payouts/{id}"), vec![Reply::Json(200, view(id))]);
        payment.on(&format!("/v1/payouts/{id}/post"), vec![Reply::Delayed(SUBMISSION_HELD_MS, 200, posted.clone())]);
    }
    proxy.on(SUBMISSIONS, vec![acked()]);
    let ex = Executor::new(cfg, Clock::system()).expect("config");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(ex.clone().run(stop_rx));
    let posts = [format!("/v1/payouts/{a}/post"), format!("/v1/payouts/{b}/post")];
    let deadline = std::time::Instant::now() + Duration::from_millis(DRAIN_MS_MAX);
    let (first_post, held) = loop {
        let first = posts.iter().find(|p| payment.calls(p) > 0);
        let answered: usize = posts.iter().map(|p| payment.answered(p)).sum();
        assert_eq!(answered, 0, "no newer grant while the first post was in flight");
        if let Some(first) = first {
            let token = payment.tokens(first)[0].expect("post token");
            if let Some(held) = held_token(&lock).await.filter(|t| *t > token) {
                break (token, held);
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first post never went out: {:?}",
            payment.calls.lock().expect("lock")
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The second payout's claim goes out under that grant once the first post answers.
    let second_claim = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(DRAIN_MS_MAX), || async {
        [a, b]
            .iter()
            .filter_map(|id| payment.tokens(&format!("/v1/payouts/{id}/claim")).first().copied().flatten())
            .max()
            .filter(|t| *t > first_post)
    })
    .await
    .expect("the second payout was claimed");
    let _ = stop_tx.send(true);
    run.await.expect("stops");
    assert_eq!(second_claim, held, "the second claim carries the grant rotated beside the first post");
}

#[tokio::test]
async fn a_lease_that_lapses_during_the_claim_stops_the_submission() {
    // A 1 s lease keeps a 700 ms local deadline; the claim answers 200 after 1.2 s.
    let r = rig(|cfg| cfg.lock_ttl_ms = 1_000).await;
    r.payment.on(&r.claim_path(), vec![Reply::Delayed(1_200, 200, claim_ack())]);
    r.proxy.on(SUBMISSIONS, vec![acked()]);
    assert_eq!(r.execute_once().await, Some(Outcome::LeaseLost));
    assert_eq!(r.proxy.calls(SUBMISSIONS), 0, "nothing reaches the proxy once the local deadline passed");
}

#[tokio::test]
async fn an_advisory_read_is_tried_twice_and_a_failed_one_writes_nothing() {
    // A RAIL_ACKED candidate is read before anything is written (the read finds it PENDING).
    let r = rig(|_| {}).await;
    let view_path = format!("/v1/payouts/{}", r.payout);
    r.payment
        .on(&view_path, vec![Reply::Json(503, envelope("NOT_READY", json!({}))), Reply::Json(200, view(r.payout))]);
    r.payment.on(&r.claim_path(), vec![Reply::Json(409, envelope("PAYOUT_NOT_CLAIMABLE", json!({})))]);
    assert_eq!(r.execute_candidate(0, PayoutState::RailAcked).await, Some(Outcome::NotClaimable));
    assert_eq!(r.payment.calls(&view_path), 2, "the re-read is retried once");

    let r = rig(|_| {}).await;
    let view_path = format!("/v1/payouts/{}", r.payout);
    r.payment.on(&view_path, vec![Reply::Json(503, envelope("NOT_READY", json!({})))]);
    assert_eq!(r.execute_candidate(0, PayoutState::RailAcked).await, Some(Outcome::Unavailable));
    assert_eq!(r.payment.calls(&view_path), 2, "two tries, then give up");
    assert_eq!(r.payment.calls(&r.claim_path()), 0, "a failed advisory read never leads to a write");
    assert!(r.lock_is_free().await);
}

/// Every payout of `ids` POSTED in `paydb`, within the drain bound.
async fn all_posted(paydb: &MemPaydb, ids: &[Uuid]) -> bool {
    dlock_rt::wait_until(Duration::from_millis(20), Duration::from_millis(DRAIN_MS_MAX), || async {
        states(paydb, ids).await.values().all(|s| *s == PayoutState::Posted).then_some(())
    })
    .await
    .is_some()
}

/// Runs one executor of one task with `per_grant` payouts per grant until `ids` are all
/// POSTED; the claim token of each payout and the fence of each payout's ledger debit.
async fn work_one_account(per_grant: u32, n: usize) -> (Vec<i64>, Vec<i64>) {
    let c = cluster(&[]).await;
    let ids = seed(&c, 1, n, 100_000, 1_000).await;
    let mut cfg = config(&c.lock, &c.payment, &c.proxy, "executor-1");
    (cfg.concurrency, cfg.payouts_per_grant_max) = (1, per_grant);
    let ex = Executor::new(cfg, Clock::system()).expect("config");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(ex.clone().run(stop_rx));
    assert!(all_posted(&c.paydb, &ids).await, "every payout posted: {:?}", states(&c.paydb, &ids).await);
    let _ = stop_tx.send(true);
    run.await.expect("stops");
    assert_one_rail_call_each(&c, &ids, "each payout reached the rail once").await;
    assert_ledger_balances(&c.paydb).await;
    let mut claims = Vec::new();
    for id in &ids {
        let p = PaymentStore::payout(&*c.paydb, *id).await.expect("read").expect("exists");
        claims.push(p.claim_token.expect("claimed"));
    }
    let ledger = PaymentStore::ledger(&*c.paydb, Some("acct-0")).await.expect("ledger");
    let posts =
        ledger.iter().filter(|e| e.payout_id.is_some() && e.direction == Direction::Debit).map(|e| e.fence).collect();
    (claims, posts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_claims_an_accounts_payouts_under_one_grant_and_posts_them_under_one_newer_grant() {
    // One task, six PENDING payouts of one account in its scan: one batch (E-19).
    let (claims, posts) = work_one_account(16, 6).await;
    assert!(claims.iter().all(|t| *t == claims[0]), "one grant claimed them all: {claims:?}");
    assert_eq!(posts.len(), 6, "{posts:?}");
    assert!(posts.iter().all(|t| *t == posts[0]), "one newer grant posted them all: {posts:?}");
    assert!(posts[0] > claims[0], "the posts' grant is newer than the claims': {posts:?} {claims:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_one_payout_per_grant_each_payout_is_claimed_and_posted_under_grants_of_its_own() {
    let (claims, posts) = work_one_account(1, 4).await;
    let distinct: std::collections::BTreeSet<i64> = claims.iter().chain(posts.iter()).copied().collect();
    assert_eq!(distinct.len(), 8, "every claim and post under a grant of its own: {claims:?} {posts:?}");
}

#[tokio::test]
async fn a_batch_posts_only_what_the_rail_acknowledged_and_never_submits_again() {
    // Fakes: three PENDING payouts of acct-1; the proxy acknowledges the first, answers the
    // second RAIL_AMBIGUOUS and the third declined.
    let (lock, s1) = lock_server(Arc::new(MemLockStore::new(Clock::system()))).await;
    let (payment, payment_url, s2) = fake().await;
    let (proxy, proxy_url, s3) = fake().await;
    let _stops = [s1, s2, s3];
    let ids: Vec<Uuid> = (0..3).map(|_| Uuid::new_v4()).collect();
    let mut cfg = config(&lock, &payment_url, &proxy_url, "executor-1");
    cfg.concurrency = 1;
    let list = |state: &str| format!("/v1/payouts?state={state}&limit={}", cfg.batch_max);
    let items: Vec<Value> = ids
        .iter()
        .map(|id| {
            json!({"payoutId": id, "accountId": "acct-1", "amountMinor": 100, "currency": "EUR",
            "state": "PENDING", "attemptCount": 0, "createdAt": "2025-11-30T11:05:30.123Z"})
        })
        .collect();
    payment.on(
        &list("PENDING"),
        vec![Reply::Json(200, json!({ "items": items })), Reply::Json(200, json!({"items": []}))],
    );
    payment.on(&list("CLAIMED"), vec![Reply::Json(200, json!({"items": []}))]);
    payment.on(&list("RAIL_ACKED"), vec![Reply::Json(200, json!({"items": []}))]);
    let claimed: Vec<Value> = ids
        .iter()
        .map(|id| {
            json!({"payoutId": id, "status": 200, "body": {"payoutId": id, "state": "CLAIMED", "claimToken": 1,
                "accountFence": 1, "attemptCount": 0, "idempotencyKey": "claims:1", "accountId": "acct-1",
                "amountMinor": 100, "currency": "EUR", "beneficiaryRef": "b"}})
        })
        .collect();
    payment.on("/v1/accounts/acct-1/claims", vec![Reply::Batch(json!({"accountId": "acct-1", "items": claimed}))]);
    let submitted = json!({"accountId": "acct-1", "items": [
        {"payoutId": ids[0], "status": 200, "body": {"submissionId": Uuid::new_v4(), "payoutId": ids[0],
            "presentedToken": 1, "outcome": "ACKED", "railReference": "RR-1",
            "submittedAt": "2025-11-30T11:05:30.123Z", "resolvedAt": "2025-11-30T11:05:31.000Z"}},
        {"payoutId": ids[1], "status": 409, "body": envelope("RAIL_AMBIGUOUS", json!({"submissionId": Uuid::new_v4()}))},
        {"payoutId": ids[2], "status": 422, "body": envelope("VALIDATION_FAILED", json!({"outcome": "REJECTED"}))},
    ]});
    proxy.on("/v1/rail/submission-batches", vec![Reply::Batch(submitted)]);
    let posted = json!({"accountId": "acct-1", "items": [
        {"payoutId": ids[0], "status": 200, "body": {"payoutId": ids[0], "state": "POSTED", "entries": [], "balanceMinor": 0}}]});
    payment.on("/v1/accounts/acct-1/posts", vec![Reply::Batch(posted)]);
    let ex = Executor::new(cfg, Clock::system()).expect("config");
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let run = tokio::spawn(ex.clone().run(stop_rx));
    let done = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_millis(DRAIN_MS_MAX), || async {
        (payment.answered("/v1/accounts/acct-1/posts") > 0 && ex.releases_in_flight() == 0).then_some(())
    })
    .await;
    assert!(done.is_some(), "the batch was posted: {:?}", payment.calls.lock().expect("lock"));
    let _ = stop_tx.send(true);
    run.await.expect("stops");
    assert_eq!(proxy.calls("/v1/rail/submission-batches"), 1, "submitted once, never again");
    let sent = proxy.bodies("/v1/rail/submission-batches");
    assert_eq!(sent[0]["submissions"].as_array().map(Vec::len), Some(3), "{sent:?}");
    let posts = payment.bodies("/v1/accounts/acct-1/posts");
    let named: Vec<&str> =
        posts[0]["payouts"].as_array().expect("payouts").iter().filter_map(|p| p["payoutId"].as_str()).collect();
    assert_eq!(named, [ids[0].to_string()], "only the acknowledged payout is posted");
    // The claims carried one token, the post a newer one.
    let claim_token = payment.tokens("/v1/accounts/acct-1/claims")[0];
    assert_eq!(proxy.tokens("/v1/rail/submission-batches")[0], claim_token, "the submission carries the claims' grant");
    assert!(payment.tokens("/v1/accounts/acct-1/posts")[0] > claim_token, "the post carries a newer grant");
    let counted = [Outcome::Posted, Outcome::Ambiguous, Outcome::Failed].map(|o| ex.metrics.get(o));
    assert_eq!(counted, [1, 1, 1], "each payout's answer handled as its single write's");
}
