//! The forger in the simulated world (parent module doc): its node, its aim at the world's
//! replicas and keys, and the parts that read the world's own stores (settled payouts and
//! PENDING payouts from paydb) or its wire log (the executors' signed writes it replays).

use std::time::Duration;

use dlock_contract::auth::Secret;
use dlock_contract::grant::GrantSigner;
use dlock_contract::payout::PayoutState;
use dlock_payment_resource::store::{ListQuery, PaymentStore};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::Clock;

use super::*;
use crate::world::{grant_signer, node_url, Topology, World, FORGER_WORKER_TOKEN, VICTIM_WORKER_TOKEN};

/// The forger's aim in a world of `topology`: every replica by its node name, the world's
/// grant key, the process default bearer for its writes, the world's bound credentials.
fn aim(topology: &Topology) -> Aim {
    let urls = |service: &str, n: usize| (1..=n).map(|i| node_url(&format!("{service}-{i}"))).collect();
    Aim {
        payment: urls("payment", topology.payment_replicas),
        proxy: urls("proxy", topology.proxy_replicas),
        lock: urls("lock", topology.lock_replicas),
        signer: grant_signer(),
        writer: None,
        creator: None,
        forger_token: Secret::new(FORGER_WORKER_TOKEN),
        victim_token: Secret::new(VICTIM_WORKER_TOKEN),
    }
}

/// Starts the forger's fault phase on its node `forger` (never faulted; added to `world`):
/// [`FAULT_ROUNDS`] rounds, each at a drawn instant of its share of the first `fault_ms`,
/// while the faults play. A round replays the newest accepted signed claim or post with its
/// original token ([`replay_signed_writes`]) and sends a claim batch of the forger's own
/// account naming other accounts' PENDING payouts ([`foreign_batch`]). The returned log
/// goes on into [`run_forger`].
pub fn start_forger(world: &mut World, fault_ms: u64) -> ForgerLog {
    let log = ForgerLog::default();
    let node = world.add_node("forger");
    let paydb = world.paydb.clone();
    let aim = aim(&world.spec().topology);
    let out = log.clone();
    node.spawn(async move {
        let share = (fault_ms / FAULT_ROUNDS).max(1);
        let mut now = 0;
        for round in 0..FAULT_ROUNDS {
            let at = round * share + dlock_rt::rand::random_u64() % share;
            dlock_rt::sleep(Duration::from_millis(at.saturating_sub(now))).await;
            now = at;
            replay_signed_writes(&*paydb, &out, Replays::ClaimsAndPosts(1)).await;
            foreign_batch(&*paydb, &aim, &out).await;
        }
    });
    log
}

/// Runs the forger to its end on its node `forger`: after the seed's liveness phase, when
/// the payouts have settled and every fault has healed, and before the checks. `log` is
/// what its fault phase sent ([`start_forger`]; a fresh log when it had none).
pub async fn run_forger(world: &World, log: ForgerLog) -> ForgerLog {
    let node = match world.node("forger") {
        Some(n) => n.clone(),
        None => madsim::runtime::Handle::current()
            .create_node()
            .name("forger")
            .ip(std::net::IpAddr::from(crate::world::FORGER_IP))
            .build(),
    };
    let paydb = world.paydb.clone();
    let topology = world.spec().topology.clone();
    let out = log.clone();
    let task = node.spawn(async move {
        let aim = aim(&topology);
        forge_writes(&*paydb, &aim, &out).await;
        run_owner_attacks(&aim, dlock_rt::rand::random_u64(), &out).await;
        run_lapsed_session(&aim, dlock_rt::rand::random_u64(), &out).await;
        replay_signed_writes(&*paydb, &out, Replays::EveryFence(REPLAYS_PER_SEED)).await;
        run_cross_account_batch(&aim, dlock_rt::rand::random_u64(), &out).await;
    });
    let _ = task.await;
    log
}

/// The forged writes ([`FORGED_WRITES_PER_SEED`]; fewer when paydb has no settled payout).
async fn forge_writes(paydb: &dyn PaymentStore, aim: &Aim, out: &ForgerLog) {
    let rogue = GrantSigner::from_seed(&dlock_rt::rand::secret_bytes::<32>());
    for _ in 0..FORGED_WRITES_PER_SEED {
        let Some(target) = settled_payout(paydb).await else { return };
        let Ok(Some(view)) = paydb.payout(target).await else { continue };
        let target = Target {
            payout_id: target,
            account_id: view.account_id,
            amount_minor: view.amount_minor,
            currency: view.currency,
            beneficiary_ref: view.beneficiary_ref,
        };
        forge_one(aim, &rogue, &target, dlock_rt::rand::random_u64(), out).await;
    }
}

/// What a fenced write the wire log holds names: its hop and payout.
fn replayable(e: &dlock_rt::wire_log::Exchange) -> Option<(&'static str, uuid::Uuid)> {
    let answered_ok = matches!(&e.fate, Some(dlock_rt::wire_log::Fate::Answered { status: 200, .. }));
    let owner = e.header(dlock_contract::HEADER_OWNER_ID).unwrap_or_default();
    if e.method != "POST" || !answered_ok || owner.starts_with(FORGER_OWNER) {
        return None;
    }
    e.header(dlock_contract::HEADER_FENCING_SIGNATURE)?;
    if e.path == "/v1/rail/submissions" {
        let body: serde_json::Value = serde_json::from_slice(&e.request).ok()?;
        return Some(("submit", body["payoutId"].as_str()?.parse().ok()?));
    }
    let rest = e.path.strip_prefix("/v1/payouts/")?;
    let (id, hop) = rest.split_once('/')?;
    let hop = match hop {
        "claim" => "claim",
        "post" => "post",
        _ => return None,
    };
    Some((hop, id.parse().ok()?))
}

/// Which signed writes [`replay_signed_writes`] sends again, and how many at most.
#[derive(Debug, Clone, Copy)]
enum Replays {
    /// Claims and posts only (during the fault phase, a submission's payout may turn
    /// RAIL_AMBIGUOUS between the look and the send).
    ClaimsAndPosts(usize),
    /// Claims, posts and submissions (at the end, when everything settled).
    EveryFence(usize),
}

/// Equal-token replays (module doc): the newest accepted signed write of each fence (the
/// claim or post of an account, the submission at its mark) sent again as it was, its token
/// and signature unchanged, under a fresh idempotency key, newest first. A submission of a
/// payout now RAIL_AMBIGUOUS is left alone (that one is the executors' invariant,
/// `ambiguous_payout_never_resubmitted`).
async fn replay_signed_writes(paydb: &dyn PaymentStore, out: &ForgerLog, which: Replays) {
    let (most, submissions) = match which {
        Replays::ClaimsAndPosts(n) => (n, false),
        Replays::EveryFence(n) => (n, true),
    };
    let log = dlock_rt::wire_log::snapshot();
    let mut fences_done: Vec<(bool, String)> = Vec::new();
    for e in log.iter().rev() {
        if fences_done.len() >= most {
            break;
        }
        let Some((hop, payout)) = replayable(e).filter(|(hop, _)| submissions || *hop != "submit") else { continue };
        let Ok(Some(view)) = paydb.payout(payout).await else { continue };
        let fence = (hop == "submit", view.account_id.clone());
        if fences_done.contains(&fence) || (hop == "submit" && view.state == PayoutState::RailAmbiguous) {
            continue;
        }
        fences_done.push(fence);
        let key = format!("forger-replay:{}", e.seq_sent);
        let headers: Vec<(&str, &str)> = e
            .headers
            .iter()
            .filter(|(k, _)| k != "authorization")
            .map(|(k, v)| {
                if k == dlock_contract::HEADER_IDEMPOTENCY_KEY {
                    (k.as_str(), key.as_str())
                } else {
                    (k.as_str(), v.as_str())
                }
            })
            .collect();
        let token = e.header(dlock_contract::HEADER_FENCING_TOKEN).and_then(|t| t.parse().ok()).unwrap_or(0);
        let answer = HttpClient::new(FORGER_CONNECT_MS, FORGER_READ_MS)
            .send(
                &BaseUrl::plain(e.authority.clone()),
                http::Method::POST,
                &e.path,
                &headers,
                Some(e.request.clone().into()),
            )
            .await;
        let (status, code) = status_and_code(answer);
        out.push_replayed(Replayed { hop, payout: payout.to_string(), token, status, code });
    }
}

/// A fault-phase cross-account batch: [`FORGER_ACCOUNT_A`] (opened at zero) names up to
/// [`FOREIGN_PAYOUTS_MAX`] PENDING payouts of the workload's accounts. A store that honours
/// the batch's account answers each `NOT_FOUND` and writes nothing.
async fn foreign_batch(paydb: &dyn PaymentStore, aim: &Aim, out: &ForgerLog) {
    let Some((replica, client)) = payment_client(aim, dlock_rt::rand::random_u64()) else { return };
    if !open_account(&client, FORGER_ACCOUNT_A).await {
        return;
    }
    let q = ListQuery {
        state: PayoutState::Pending,
        account_id: None,
        snapshot: Clock::system().wall(),
        created_after: None,
        after: None,
        limit: FOREIGN_PAYOUTS_MAX,
    };
    let Ok(page) = paydb.list(&q).await else { return };
    let payouts: Vec<uuid::Uuid> =
        page.iter().filter(|p| !p.account_id.starts_with("forger-")).map(|p| p.payout_id).collect();
    if payouts.is_empty() {
        return;
    }
    let key = format!("forger-foreign-{}", dlock_rt::rand::random_u64());
    send_foreign_batch(aim, &replica, &payouts, &key, out).await;
}

/// A settled payout (POSTED or FAILED) drawn from paydb, if any.
async fn settled_payout(paydb: &dyn PaymentStore) -> Option<uuid::Uuid> {
    let mut found = Vec::new();
    for state in [PayoutState::Posted, PayoutState::Failed] {
        let q = ListQuery {
            state,
            account_id: None,
            snapshot: Clock::system().wall(),
            created_after: None,
            after: None,
            limit: TARGETS_MAX,
        };
        if let Ok(page) = paydb.list(&q).await {
            found.extend(page.into_iter().map(|p| p.payout_id));
        }
    }
    if found.is_empty() {
        return None;
    }
    Some(found[dlock_rt::rand::random_u64() as usize % found.len()])
}
