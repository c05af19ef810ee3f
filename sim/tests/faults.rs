//! Each fault mechanism does what it says: a partitioned node cannot be reached, a one-way
//! partition drops one direction only, a paused node serves nothing until resumed, a killed
//! node restarts through its init with its database intact, a lossy link refuses some
//! connects, and a lost commit ack leaves the write committed although the caller saw an
//! error. Schedules play at their simulated times.

#![cfg(madsim)]

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use dlock_contract::payment::{ClaimRequest, NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_payment_resource::store::PaymentStore;
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_rt::probe::{self, Probe};
use dlock_sim::faults::Faults;
use dlock_sim::schedule::{Fault, Schedule, Stage, Timed};
use dlock_sim::store_faults::{Injected, PlannedPaymentStore, StoreFaultPlan, StoreName};
use dlock_sim::world::{self, url, PAYMENT_IP, PAYMENT_PORT};
use madsim::task::NodeId;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PORT: u16 = 7000;
/// How long a probe request may take before it counts as "no answer".
const ANSWER_MS_MAX: u64 = 2_000;

fn ip(last: u8) -> IpAddr {
    IpAddr::from([10, 0, 5, last])
}

/// A node at `10.0.5.last` answering each connection's byte with `byte + 1`; its init runs
/// at every (re)start and counts the starts in `starts` (state outside the node).
fn echo_node(name: &str, last: u8, starts: Arc<AtomicU64>) -> madsim::runtime::NodeHandle {
    madsim::runtime::Handle::current()
        .create_node()
        .name(name)
        .ip(ip(last))
        .init(move || {
            let starts = starts.clone();
            async move {
                starts.fetch_add(1, Ordering::SeqCst);
                let listener = tokio::net::TcpListener::bind(SocketAddr::new(ip(last), PORT)).await.expect("bind");
                loop {
                    let Ok((mut s, _)) = listener.accept().await else { continue };
                    tokio::spawn(async move {
                        let mut b = [0u8; 1];
                        if s.read_exact(&mut b).await.is_ok() && s.write_all(&[b[0].wrapping_add(1)]).await.is_ok() {
                            let _ = s.flush().await;
                        }
                    });
                }
            }
        })
        .build()
}

/// From the current node: connect to `10.0.5.last`, send 41, expect 42 within the bound.
/// `Err("connect")` when the connect is refused, `Err("timeout")` when no answer came.
async fn ask(last: u8) -> Result<u8, &'static str> {
    let run = async {
        let mut s = tokio::net::TcpStream::connect(SocketAddr::new(ip(last), PORT)).await.map_err(|_| "connect")?;
        s.write_all(&[41]).await.map_err(|_| "write")?;
        s.flush().await.map_err(|_| "write")?;
        let mut b = [0u8; 1];
        s.read_exact(&mut b).await.map_err(|_| "read")?;
        Ok(b[0])
    };
    dlock_rt::timeout(dlock_rt::Duration::from_millis(ANSWER_MS_MAX), run).await.unwrap_or(Err("timeout"))
}

fn client_node(name: &str, last: u8) -> madsim::runtime::NodeHandle {
    madsim::runtime::Handle::current().create_node().name(name).ip(ip(last)).build()
}

async fn settle() {
    dlock_rt::sleep(dlock_rt::Duration::from_millis(100)).await;
}

#[madsim::test]
async fn a_partitioned_node_cannot_connect_until_the_partition_heals() {
    let faults = Faults::new();
    let server = echo_node("server", 1, Arc::default());
    let client = client_node("client", 2);
    settle().await;
    assert_eq!(client.spawn(ask(1)).await.expect("client"), Ok(42));
    let id = faults.partition(&[client.id()], &[server.id()]);
    assert_eq!(client.spawn(ask(1)).await.expect("client"), Err("connect"));
    assert_eq!(faults.open_partitions().len(), 1);
    faults.heal(id);
    assert_eq!(client.spawn(ask(1)).await.expect("client"), Ok(42));
    let spans = faults.partitions();
    assert!(spans[0].healed_ms.is_some_and(|h| h >= spans[0].started_ms), "{spans:?}");
}

#[madsim::test]
async fn a_one_way_partition_drops_one_direction_only() {
    let faults = Faults::new();
    let a = echo_node("a", 1, Arc::default());
    let b = echo_node("b", 2, Arc::default());
    settle().await;
    faults.one_way(a.id(), b.id());
    // a cannot reach b at all.
    assert_eq!(a.spawn(ask(2)).await.expect("a"), Err("connect"));
    // b connects to a and sends, but a's answer (a -> b) never arrives.
    assert_eq!(b.spawn(ask(1)).await.expect("b"), Err("timeout"));
    faults.heal_all();
    assert_eq!(a.spawn(ask(2)).await.expect("a"), Ok(42));
    assert_eq!(b.spawn(ask(1)).await.expect("b"), Ok(42));
}

#[madsim::test]
async fn a_paused_node_serves_nothing_until_resumed() {
    let faults = Faults::new();
    let server = echo_node("server", 1, Arc::default());
    let client = client_node("client", 2);
    settle().await;
    faults.pause(server.id());
    assert_eq!(client.spawn(ask(1)).await.expect("client"), Err("timeout"));
    assert_eq!(faults.paused(), vec![server.id()]);
    faults.resume(server.id());
    assert_eq!(client.spawn(ask(1)).await.expect("client"), Ok(42));
    assert!(faults.paused().is_empty());
}

#[madsim::test]
async fn a_killed_node_restarts_through_its_init_and_its_database_survives() {
    let faults = Faults::new();
    // The "database": state outside the node, as paydb and lockdb are in the world.
    let starts = Arc::new(AtomicU64::new(0));
    let server = echo_node("server", 1, starts.clone());
    let client = client_node("client", 2);
    settle().await;
    assert_eq!(starts.load(Ordering::SeqCst), 1);
    faults.kill(server.id());
    assert_eq!(client.spawn(ask(1)).await.expect("client"), Err("connect"));
    faults.restart(server.id());
    settle().await;
    assert_eq!(starts.load(Ordering::SeqCst), 2, "the restart did not run the node's init");
    assert_eq!(client.spawn(ask(1)).await.expect("client"), Ok(42));

    // A real service: the payment-resource over a paydb outside its node keeps its rows.
    let paydb = Arc::new(MemPaydb::new());
    let store: Arc<dyn PaymentStore> = paydb.clone();
    let payment = world::start_payment_node(&world::layers(&[]), 0, store);
    let setup = client_node("setup", 3);
    settle().await;
    let payout = setup.spawn(seed_payout()).await.expect("setup");
    faults.kill(payment.id());
    faults.restart(payment.id());
    let seen = setup
        .spawn(async move {
            dlock_rt::wait_until(
                dlock_rt::Duration::from_millis(50),
                dlock_rt::Duration::from_millis(5_000),
                || async { payment_client().payout(payout).await.ok() },
            )
            .await
        })
        .await
        .expect("setup");
    assert!(seen.is_some_and(|p| p.payout_id == payout), "the restarted payment-resource lost its payout");
    let kinds: Vec<String> = faults.trace();
    assert!(kinds.iter().any(|l| l.contains("Kill")) && kinds.iter().any(|l| l.contains("Restart")), "{kinds:?}");
}

#[madsim::test]
async fn a_lossy_link_refuses_some_connects_and_recovers() {
    let faults = Faults::new();
    let server = echo_node("server", 1, Arc::default());
    let client = client_node("client", 2);
    settle().await;
    faults.lossy_link(client.id(), server.id(), 0.5, 20_000);
    let answers = client
        .spawn(async {
            let mut v = Vec::new();
            for _ in 0..40 {
                v.push(ask(1).await);
                dlock_rt::sleep(dlock_rt::Duration::from_millis(60)).await;
            }
            v
        })
        .await
        .expect("client");
    let ok = answers.iter().filter(|a| **a == Ok(42)).count();
    assert!(ok > 0 && ok < answers.len(), "a 50 % lossy link answered {ok}/{}", answers.len());
    dlock_rt::sleep(dlock_rt::Duration::from_millis(20_000)).await;
    assert_eq!(client.spawn(ask(1)).await.expect("client"), Ok(42), "the link stayed lossy past its end");
}

fn payment_client() -> PaymentClient {
    let mut cfg = PaymentClientConfig::new(url(PAYMENT_IP, PAYMENT_PORT));
    cfg.write_retries_max = 0;
    PaymentClient::new(cfg).expect("payment client")
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::parse(k).expect("key")
}

/// One account and one PENDING payout, through the payment-resource.
async fn seed_payout() -> uuid::Uuid {
    let client = payment_client();
    let ops = OwnerId::parse("ops").expect("owner");
    let open = NewAccountRequest { account_id: "acct-1".into(), currency: "EUR".into(), opening_balance_minor: 10_000 };
    client.create_account(&ops, &key("acct-1"), &open).await.expect("account opened");
    let body = NewPayoutRequest {
        payout_id: None,
        account_id: "acct-1".into(),
        amount_minor: 1_000,
        currency: "EUR".into(),
        beneficiary_ref: "b".into(),
    };
    client.create_payout(&ops, &key("create-0"), &body).await.expect("payout created").payout_id
}

#[madsim::test]
async fn a_commit_unknown_claim_is_committed_although_the_caller_saw_an_error() {
    probe::reset();
    let paydb = Arc::new(MemPaydb::new());
    let plan = Arc::new(StoreFaultPlan::new());
    let store: Arc<dyn PaymentStore> = Arc::new(PlannedPaymentStore { inner: paydb.clone(), plan: plan.clone() });
    world::start_payment_node(&world::layers(&[]), 0, store);
    let worker = client_node("worker", 3);
    settle().await;
    let payout = worker.spawn(seed_payout()).await.expect("setup");
    plan.inject(StoreName::Paydb, "claim", Injected::CommitUnknown, 1);
    let answer = worker
        .spawn(async move {
            let token = dlock_sim::world::signed("acct-1", 7, "worker");
            let owner = OwnerId::parse("worker").expect("owner");
            let body = ClaimRequest { expected_state: PayoutState::Pending };
            payment_client().claim(payout, token, &owner, &key(&format!("payout:{payout}")), &body).await
        })
        .await
        .expect("worker");
    let refusal = answer.expect_err("the caller must see the lost ack as an error");
    assert!(refusal.code().is_some_and(|c| !c.retry_safe()), "a lost ack must not be answered retry-safe: {refusal}");
    let row = PaymentStore::payout(paydb.as_ref(), payout).await.expect("read").expect("payout");
    assert_eq!(row.state, PayoutState::Claimed, "the claim was not committed");
    assert_eq!(probe::snapshot().get(&Probe::LostAckClaim), Some(&1));
    assert_eq!(plan.record().len(), 1);
}

#[madsim::test]
async fn an_unavailable_window_refuses_calls_then_lets_them_through() {
    let paydb = Arc::new(MemPaydb::new());
    let plan = Arc::new(StoreFaultPlan::new());
    let store = PlannedPaymentStore { inner: paydb, plan: plan.clone() };
    plan.unavailable_for(StoreName::Paydb, None, 1_000);
    assert!(store.accounts().await.is_err());
    dlock_rt::sleep(dlock_rt::Duration::from_millis(1_001)).await;
    assert!(store.accounts().await.is_ok());
    plan.latency_for(StoreName::Paydb, Some("accounts"), 300, 10_000);
    let t0 = dlock_rt::sim_clock::reference_now();
    assert!(store.accounts().await.is_ok());
    assert!(t0.elapsed() >= dlock_rt::Duration::from_millis(300), "no latency was injected");
}

/// Seed 4419's failure: a payment-resource restarted while paydb was unavailable failed
/// its start (it reads its cursor key from paydb) and stayed down for good, leaving every
/// payout PENDING. The world runs services as the shipped systemd units do
/// (`Restart=on-failure`, `RestartSec=2s`): the start is tried again until the store is back.
#[madsim::test]
async fn a_service_whose_store_is_unavailable_at_start_comes_back_once_the_store_does() {
    let paydb = Arc::new(MemPaydb::new());
    let plan = Arc::new(StoreFaultPlan::new());
    let store: Arc<dyn PaymentStore> = Arc::new(PlannedPaymentStore { inner: paydb, plan: plan.clone() });
    let window_ms = 3 * world::SUPERVISOR_RESTART_MS;
    plan.unavailable_for(StoreName::Paydb, None, window_ms);
    let _payment = world::start_payment_node(&world::layers(&[]), 0, store);
    let client = client_node("client", 3);
    let started = dlock_rt::sim_clock::reference_now();
    let answered = client
        .spawn(async move {
            dlock_rt::wait_until(
                dlock_rt::Duration::from_millis(50),
                dlock_rt::Duration::from_millis(20_000),
                || async {
                    match payment_client().payout(uuid::Uuid::nil()).await {
                        Err(dlock_payment_client::PaymentRefusal::Refused { status: 404, .. }) => Some(()),
                        _ => None,
                    }
                },
            )
            .await
        })
        .await
        .expect("client");
    assert!(answered.is_some(), "the payment-resource never started after paydb came back");
    let waited = started.elapsed();
    assert!(
        waited >= dlock_rt::Duration::from_millis(window_ms),
        "it answered after {waited:?}, inside the unavailable window: the store fault was not applied"
    );
    assert!(plan.record().iter().any(|r| r.op == "cursor_secret"), "the start never met the store fault");
}

/// A stage over named echo nodes.
struct Echoes {
    faults: Faults,
    nodes: Vec<(String, NodeId)>,
}

impl Stage for Echoes {
    fn node(&self, name: &str) -> Option<NodeId> {
        self.nodes.iter().find(|(n, _)| n == name).map(|(_, id)| *id)
    }
    fn faults(&self) -> &Faults {
        &self.faults
    }
    fn store_plan(&self) -> Option<&StoreFaultPlan> {
        None
    }
    fn revoke<'a>(
        &'a self,
        _key: Option<&'a str>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<String, String>> + Send + 'a>> {
        Box::pin(async { Ok("revoked".to_owned()) })
    }
}

#[madsim::test]
async fn a_schedule_applies_each_event_at_its_simulated_time() {
    let faults = Faults::new();
    let server = echo_node("server", 1, Arc::default());
    let client = client_node("client", 2);
    settle().await;
    let stage = Echoes { faults: faults.clone(), nodes: vec![("server".into(), server.id())] };
    let at = Timed::fault;
    let schedule = Schedule {
        events: vec![
            at(1_000, Fault::Pause { node: "server".into(), for_ms: None }),
            at(6_000, Fault::Resume { node: "server".into() }),
            at(5_000, Fault::Pause { node: "nobody".into(), for_ms: None }),
        ],
    };
    let probe = client.spawn(async {
        let mut seen = Vec::new();
        for t in [500u64, 2_000, 7_000] {
            let now = madsim::time::TimeHandle::current().elapsed().as_millis() as u64;
            dlock_rt::sleep(dlock_rt::Duration::from_millis(t.saturating_sub(now))).await;
            seen.push(ask(1).await);
        }
        seen
    });
    let trace = schedule.play(&stage).await;
    assert_eq!(probe.await.expect("client"), [Ok(42), Err("timeout"), Ok(42)]);
    // The timeline is in time order: the event at 5 s is played second.
    assert!(trace[1].contains("SKIPPED: unknown node \"nobody\""), "{trace:?}");
    let rec = faults.record();
    assert_eq!(rec.len(), 2);
    assert!(rec[0].at_ms >= 1_100 && rec[1].at_ms >= 6_100, "{rec:?}");
}

fn lock_client(owner: &str) -> dlock_lock_client::LockClient {
    let cfg = dlock_lock_client::LockClientConfig::new(
        url(world::LOCK_IP, world::LOCK_PORT),
        OwnerId::parse(owner).expect("owner"),
    );
    dlock_lock_client::LockClient::new(cfg).expect("lock client")
}

/// Opens a session from `node`; `Ok(())` or the refusal's code.
async fn open_session_from(node: &madsim::runtime::NodeHandle) -> Result<(), Option<dlock_contract::ErrorCode>> {
    node.spawn(async {
        match lock_client("w").open_session().await {
            Ok(_) => Ok(()),
            Err(e) => {
                eprintln!("open_session refused: {e}");
                Err(e.code())
            }
        }
    })
    .await
    .expect("worker")
}

/// Reads a key's advisory info from `node`; the status.
async fn info_status_from(node: &madsim::runtime::NodeHandle) -> u16 {
    node.spawn(async {
        dlock_rt::http::HttpClient::new(1_000, 10_000)
            .send(&url(world::LOCK_IP, world::LOCK_PORT), http::Method::GET, "/v1/locks/payout:acct-1", &[], None)
            .await
            .map_or(0, |r| r.status)
    })
    .await
    .expect("worker")
}

#[madsim::test]
async fn lockdb_unavailable_is_not_leader_at_the_lock_server_until_the_window_ends() {
    let plan = Arc::new(StoreFaultPlan::new());
    let mem = Arc::new(dlock_lock_server::store_mem::MemLockStore::new(dlock_rt::Clock::reference()));
    let store: Arc<dyn dlock_lock_server::store::LockStore> =
        Arc::new(dlock_sim::store_faults::PlannedLockStore { inner: mem, plan: plan.clone() });
    world::start_lock_node(&world::layers(&[]), 0, move || {
        let store = store.clone();
        async move { store }
    });
    let worker = client_node("worker", 3);
    settle().await;
    assert_eq!(open_session_from(&worker).await, Ok(()));
    plan.unavailable_for(StoreName::Lockdb, None, 5_000);
    assert_eq!(open_session_from(&worker).await, Err(Some(dlock_contract::ErrorCode::NotLeader)));
    assert_eq!(info_status_from(&worker).await, 503);
    dlock_rt::sleep(dlock_rt::Duration::from_millis(5_000)).await;
    assert_eq!(open_session_from(&worker).await, Ok(()));
}

#[madsim::test]
async fn an_etcd_leader_loss_refuses_lock_server_calls_until_it_ends_and_etcd_keeps_its_data() {
    const ETCD: &str = "10.0.2.1:2379";
    let faults = Faults::new();
    let etcd = madsim::runtime::Handle::current().create_node().name("etcd").ip(IpAddr::from([10, 0, 2, 1])).build();
    etcd.spawn(async {
        etcd_client::SimServer::builder().serve(ETCD.parse().expect("addr")).await.expect("simulated etcd serves");
    });
    world::start_lock_node(&world::layers(&[]), 0, || async {
        let endpoints = vec![format!("http://{ETCD}")];
        let store =
            dlock_rt::wait_until(dlock_rt::Duration::from_millis(50), dlock_rt::Duration::from_millis(5_000), || {
                let endpoints = endpoints.clone();
                async move { dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, "/dlock").await.ok() }
            })
            .await
            .expect("simulated etcd reachable");
        let store: Arc<dyn dlock_lock_server::store::LockStore> = Arc::new(store);
        store
    });
    let worker = client_node("worker", 3);
    dlock_rt::sleep(dlock_rt::Duration::from_millis(500)).await;
    let grant = worker
        .spawn(async {
            let s = lock_client("holder").open_session().await.expect("session");
            let g = s.acquire("payout:acct-1").await.expect("grant");
            g.token().get()
        })
        .await
        .expect("worker");
    faults.etcd_leader_loss(etcd.id(), 3_000);
    let lost_at = dlock_rt::sim_clock::reference_now();
    // A read is provably harmless: NOT_LEADER (503). A write whose txn the simulated etcd
    // refused is answered NOT_LEADER when nothing was sent (a refused connection: the client
    // retries it, retry-safe) or, when the store cannot prove it was not applied, INTERNAL
    // (an unknown outcome, never retry-safe: the client's `code()` is `None`); either way
    // nothing is granted while the leader is gone.
    assert_eq!(info_status_from(&worker).await, 503);
    let refused = open_session_from(&worker).await;
    let waited = lost_at.elapsed();
    assert!(
        matches!(refused, Err(None | Some(dlock_contract::ErrorCode::NotLeader)))
            || (refused.is_ok() && waited >= dlock_rt::Duration::from_millis(3_000)),
        "{refused:?} after {waited:?}: a session opened while the etcd leader was gone"
    );
    dlock_rt::sleep(dlock_rt::Duration::from_millis(3_000)).await;
    assert_eq!(open_session_from(&worker).await, Ok(()));
    // The data survived the election: the next grant of the key is above the first.
    let next = worker
        .spawn(async {
            let s = lock_client("next").open_session().await.expect("session");
            let g = dlock_rt::wait_until(
                dlock_rt::Duration::from_millis(250),
                dlock_rt::Duration::from_millis(60_000),
                || {
                    let s = &s;
                    async move { s.acquire("payout:acct-1").await.ok() }
                },
            )
            .await
            .expect("grant once the first lapsed");
            g.token().get()
        })
        .await
        .expect("worker");
    assert!(next > grant, "token {next} after the leader loss is not above {grant}");
    assert!(faults.trace().iter().any(|l| l.contains("EtcdLeaderBack")), "{:?}", faults.trace());
}
