//! The workload and the operator of a swarm seed, each on a node of its own.
//!
//! - **Workload** (node `workload`): opens the accounts, then creates the payouts through the
//!   typed payment client over simulated time (not all at the start), rotating over the
//!   payment-resource replicas. `hot_share` of the payouts go to the hot accounts
//!   (`acct-0 ..`), the rest spread over all accounts. A refused or lost creation is retried
//!   with the same idempotency key ([`CREATE_TRIES_MAX`] times); a payout whose creation never
//!   answered is not counted (the oracle reads paydb, not this list, for safety).
//! - **Operator** (node `operator`): revokes the lock of a random hot account over L8 at
//!   drawn instants of the fault phase, and, every [`RESOLVE_EVERY_MS`], resolves the
//!   RAIL_AMBIGUOUS payouts the rail's own record can decide (a paid call: POSTED; only
//!   unpaid calls: FAILED; no call yet: left quarantined), with
//!   `PaymentStore::resolve_ambiguous` on paydb, as an operator's tooling does.

use std::sync::{Arc, Mutex};

use dlock_contract::payment::{NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::RailCallLog;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_payment_resource::store::{AmbiguousResolution, ListQuery, PaymentStore};
use dlock_rt::http::HttpClient;
use dlock_rt::{Clock, Duration};
use uuid::Uuid;

use crate::swarm::SwarmConfig;
use crate::world::{node_url, World};

/// Each account's opening balance (minor units).
pub const OPENING_BALANCE_MINOR: i64 = 50_000;
/// Tries of one creation (same idempotency key) before the workload gives it up: with
/// [`CREATE_RETRY_MS`] between tries, an upstream that keeps retrying for 30 s, so a
/// payment-resource down for a fault window (or restarting once its store is back) delays
/// the creations instead of silently shrinking the workload.
pub const CREATE_TRIES_MAX: u32 = 100;
/// Pause between two tries of one creation.
pub const CREATE_RETRY_MS: u64 = 300;
/// How often the operator looks for RAIL_AMBIGUOUS payouts.
pub const RESOLVE_EVERY_MS: u64 = 2_000;
/// Most RAIL_AMBIGUOUS payouts the operator reads per look.
pub const RESOLVE_BATCH_MAX: i64 = 100;

/// What the workload created so far, and whether it is done.
#[derive(Clone, Default)]
pub struct Created {
    inner: Arc<Mutex<(Vec<Uuid>, bool)>>,
}

impl Created {
    /// The payouts created (answered) so far, in creation order.
    pub fn ids(&self) -> Vec<Uuid> {
        self.inner.lock().map(|g| g.0.clone()).unwrap_or_default()
    }
    /// Whether the workload has tried every payout.
    pub fn done(&self) -> bool {
        self.inner.lock().map(|g| g.1).unwrap_or(true)
    }
    fn push(&self, id: Uuid) {
        if let Ok(mut g) = self.inner.lock() {
            g.0.push(id);
        }
    }
    fn finish(&self) {
        if let Ok(mut g) = self.inner.lock() {
            g.1 = true;
        }
    }
}

/// What the operator did.
#[derive(Clone, Default)]
pub struct OperatorLog {
    inner: Arc<Mutex<Vec<String>>>,
}

impl OperatorLog {
    pub fn lines(&self) -> Vec<String> {
        self.inner.lock().map(|g| g.clone()).unwrap_or_default()
    }
    fn push(&self, line: String) {
        if let Ok(mut g) = self.inner.lock() {
            g.push(line);
        }
    }
}

fn key(k: String) -> Option<IdempotencyKey> {
    IdempotencyKey::parse(&k).ok()
}

fn client(replica: usize) -> Option<PaymentClient> {
    let mut cfg = PaymentClientConfig::new(node_url(&format!("payment-{replica}")));
    cfg.write_read_timeout_ms = 10_000;
    PaymentClient::new(cfg).ok()
}

/// Starts the workload on node `workload` (added to `world`).
pub fn start_workload(world: &mut World, cfg: &SwarmConfig) -> Created {
    let created = Created::default();
    let node = world.add_node("workload");
    let (out, cfg) = (created.clone(), cfg.clone());
    let replicas = world.spec().topology.payment_replicas;
    node.spawn(async move {
        let Ok(ops) = OwnerId::parse("workload") else { return out.finish() };
        let clients: Vec<PaymentClient> = (1..=replicas).filter_map(client).collect();
        if clients.is_empty() {
            return out.finish();
        }
        for a in 0..cfg.accounts {
            let body = NewAccountRequest {
                account_id: format!("acct-{a}"),
                currency: "EUR".into(),
                opening_balance_minor: OPENING_BALANCE_MINOR,
            };
            let Some(k) = key(format!("open-{a}")) else { continue };
            for t in 0..CREATE_TRIES_MAX {
                if clients[(a + t as usize) % clients.len()].create_account(&ops, &k, &body).await.is_ok() {
                    break;
                }
                dlock_rt::sleep(Duration::from_millis(CREATE_RETRY_MS)).await;
            }
        }
        let gap_ms = cfg.arrival_ms / cfg.payouts.max(1) as u64;
        for i in 0..cfg.payouts {
            if gap_ms > 0 {
                dlock_rt::sleep(Duration::from_millis(dlock_rt::rand::random_u64() % (2 * gap_ms + 1))).await;
            }
            let hot = (dlock_rt::rand::random_u64() % 1_000) as f64 / 1_000.0 < cfg.hot_share;
            let account = if hot {
                dlock_rt::rand::random_u64() as usize % cfg.hot_accounts
            } else {
                dlock_rt::rand::random_u64() as usize % cfg.accounts
            };
            let body = NewPayoutRequest {
                payout_id: None,
                account_id: format!("acct-{account}"),
                amount_minor: 100 + (dlock_rt::rand::random_u64() % 900) as i64,
                currency: "EUR".into(),
                beneficiary_ref: format!("ben-{i}"),
            };
            let Some(k) = key(format!("create-{i}")) else { continue };
            for t in 0..CREATE_TRIES_MAX {
                match clients[(i + t as usize) % clients.len()].create_payout(&ops, &k, &body).await {
                    Ok(p) => {
                        out.push(p.payout_id);
                        break;
                    }
                    Err(_) => dlock_rt::sleep(Duration::from_millis(CREATE_RETRY_MS)).await,
                }
            }
        }
        out.finish();
    });
    created
}

/// Starts the operator on node `operator` (added to `world`); it acts during the first
/// `cfg.fault_ms` of simulated time.
pub fn start_operator(world: &mut World, cfg: &SwarmConfig) -> OperatorLog {
    let log = OperatorLog::default();
    if cfg.operator_revokes == 0 && !cfg.operator_resolves {
        return log;
    }
    let node = world.add_node("operator");
    let paydb = world.paydb.clone();
    let lock_replicas = world.spec().topology.lock_replicas;
    let (out, cfg) = (log.clone(), cfg.clone());
    node.spawn(async move {
        let mut revokes: Vec<u64> =
            (0..cfg.operator_revokes).map(|_| dlock_rt::rand::random_u64() % cfg.fault_ms.max(1)).collect();
        revokes.sort_unstable();
        let mut next_resolve = RESOLVE_EVERY_MS;
        let mut now = 0;
        let mut revokes = revokes.into_iter().peekable();
        while now < cfg.fault_ms {
            let next_revoke = revokes.peek().copied().unwrap_or(u64::MAX);
            let at = if cfg.operator_resolves { next_revoke.min(next_resolve) } else { next_revoke };
            if at >= cfg.fault_ms {
                break;
            }
            dlock_rt::sleep(Duration::from_millis(at - now)).await;
            now = at;
            if at == next_revoke {
                revokes.next();
                let account = dlock_rt::rand::random_u64() as usize % cfg.hot_accounts.max(1);
                let replica = dlock_rt::rand::random_u64() as usize % lock_replicas.max(1) + 1;
                let status = revoke(replica, &format!("payout:acct-{account}")).await;
                out.push(format!("operator: revoke payout:acct-{account} at lock-{replica} -> {status}"));
            } else {
                next_resolve += RESOLVE_EVERY_MS;
                for line in resolve_ambiguous(&*paydb).await {
                    out.push(line);
                }
            }
        }
    });
    log
}

/// L8 revoke of `key` at lock replica `replica`, from the current node; the answer's status
/// (0: no answer).
pub(crate) async fn revoke(replica: usize, key: &str) -> u16 {
    let body = serde_json::json!({ "operator": "sim-operator", "reason": "simulated operator revoke" });
    let Ok(bytes) = serde_json::to_vec(&body) else { return 0 };
    let path = format!("/v1/locks/{key}/revoke");
    let headers = [("content-type", "application/json"), ("x-owner-id", "sim-operator")];
    match HttpClient::new(1_000, 5_000)
        .send(&node_url(&format!("lock-{replica}")), http::Method::POST, &path, &headers, Some(bytes.into()))
        .await
    {
        Ok(r) => r.status,
        Err(_) => 0,
    }
}

/// Resolves the RAIL_AMBIGUOUS payouts the rail's record decides; one line per resolution.
pub async fn resolve_ambiguous(paydb: &dyn PaymentStore) -> Vec<String> {
    let mut lines = Vec::new();
    let q = ListQuery {
        state: PayoutState::RailAmbiguous,
        account_id: None,
        snapshot: Clock::system().wall(),
        created_after: None,
        after: None,
        limit: RESOLVE_BATCH_MAX,
    };
    let Ok(ambiguous) = paydb.list(&q).await else { return lines };
    if ambiguous.is_empty() {
        return lines;
    }
    let log = read_calls().await;
    for p in ambiguous {
        let id = p.payout_id.to_string();
        let calls: Vec<_> = log.calls.iter().filter(|c| c.client_ref == id).collect();
        if calls.is_empty() {
            continue;
        }
        let paid = calls.iter().find(|c| c.paid);
        let (resolved_as, reference) = match paid {
            Some(c) => (PayoutState::Posted, c.rail_reference.clone().unwrap_or_else(|| "rail-call".into())),
            None => (PayoutState::Failed, "rail record: no paid call".to_owned()),
        };
        let r = AmbiguousResolution {
            resolution_id: dlock_rt::rand::uuid_v4(),
            payout_id: p.payout_id,
            resolved_as,
            operator: "sim-operator".into(),
            reason: "simulated operator resolution from the rail's record".into(),
            rail_reference: reference,
            posting_id: dlock_rt::rand::uuid_v4(),
            entry_ids: [dlock_rt::rand::uuid_v4(), dlock_rt::rand::uuid_v4()],
            at: Clock::system().wall(),
        };
        let outcome = paydb.resolve_ambiguous(&r).await;
        lines.push(format!("operator: resolve {} as {resolved_as:?} -> {outcome:?}", p.payout_id));
    }
    lines
}

/// The rail's record (`GET /calls`) read from the current node.
async fn read_calls() -> RailCallLog {
    match HttpClient::new(1_000, 5_000).send(&node_url("rail-stub"), http::Method::GET, "/calls", &[], None).await {
        Ok(r) => serde_json::from_slice(&r.body).unwrap_or_default(),
        Err(_) => RailCallLog::default(),
    }
}
