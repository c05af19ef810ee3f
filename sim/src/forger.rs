//! The forger (issue 12): a client on node `forger` that presents fenced writes under
//! tokens the lock server never granted it, to the payment-resource (claim, post) and the
//! rail-proxy (submission): [`FORGED_WRITES_PER_SEED`] of them at the end of every swarm
//! seed, after its liveness phase and before its checks ([`run_forger`]). Its forgeries
//! ([`Forgery`]):
//!
//! - `unsigned`: no signature at all;
//! - `made_up`: a well-formed signature of random bytes under the world key's id;
//! - `oversized`: a signature header far above the named bound;
//! - `untrusted_key`: a valid signature from a key the resources do not trust;
//! - `other_account`: a real signature of the world key, for another account's lock key
//!   (a grant for `payout:acct-A` presented on a payout of `acct-B`);
//! - `other_token`: a real signature for the right lock key and owner, presented with
//!   another token.
//!
//! Claims and posts present `X-Fencing-Token: 9223372036854775807` (before issue 12 it
//! raised the account's fence for good); submissions present 1.
//!
//! ## Invariant (checked by [`ForgerLog::failures`])
//! **Nothing the forger sends passes the signature check**: every answer is 400
//! `INVALID_TOKEN`, or no decision at all (no answer, 5xx: a fault, nothing written). Any
//! other answer means the resource judged the write on its merits, so a forged grant got
//! past the check: the seed fails `forged_write_refused` (correctness).
//!
//! Each forged write aims at a settled payout (POSTED or FAILED, whose state never changes
//! again), so one that got through is seen (a 409 or 400 on its merits) without changing
//! anything the rest of the seed's oracle judges: a planted `skip-grant-signature-check` is
//! found by this invariant alone. Its refusals fire the probe `forged_token_refused` at the
//! resources. The forger draws its targets, kinds and its untrusted key from the runtime,
//! so a seed replays bit for bit.

use std::sync::{Arc, Mutex};

use dlock_contract::grant::{GrantSignature, GrantSigner, SIGNATURE_HEADER_CHARS_MAX};
use dlock_contract::payout::PayoutState;
use dlock_payment_resource::store::{ListQuery, PaymentStore};
use dlock_rt::http::HttpClient;
use dlock_rt::Clock;

use crate::outcome::Failure;
use crate::world::{grant_signer, node_url, World};

/// Forged writes per swarm seed.
pub const FORGED_WRITES_PER_SEED: usize = 6;
/// The forger's owner id (`X-Owner-Id`).
pub const FORGER_OWNER: &str = "forger";
/// Settled payouts the forger reads per look.
pub const TARGETS_MAX: i64 = 50;
/// The forger's connect budget.
pub const FORGER_CONNECT_MS: u64 = 1_000;
/// The forger's read budget.
pub const FORGER_READ_MS: u64 = 5_000;

/// One kind of forged grant (module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forgery {
    Unsigned,
    MadeUp,
    Oversized,
    UntrustedKey,
    OtherAccount,
    OtherToken,
}

impl Forgery {
    pub const ALL: [Forgery; 6] = [
        Forgery::Unsigned,
        Forgery::MadeUp,
        Forgery::Oversized,
        Forgery::UntrustedKey,
        Forgery::OtherAccount,
        Forgery::OtherToken,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Forgery::Unsigned => "unsigned",
            Forgery::MadeUp => "made_up",
            Forgery::Oversized => "oversized",
            Forgery::UntrustedKey => "untrusted_key",
            Forgery::OtherAccount => "other_account",
            Forgery::OtherToken => "other_token",
        }
    }

    /// The signature header of this forgery of a grant of `account` presented with
    /// `token`.
    fn signature(
        self,
        world: &GrantSigner,
        rogue: &GrantSigner,
        account: &str,
        token: i64,
        draw: u64,
    ) -> Option<String> {
        let key = dlock_contract::grant::payout_lock_key(account);
        match self {
            Forgery::Unsigned => None,
            Forgery::MadeUp => {
                let mut signature = [0u8; 64];
                for (i, b) in signature.iter_mut().enumerate() {
                    *b = (draw.rotate_left(i as u32) & 0xff) as u8;
                }
                Some(GrantSignature { key_id: world.key_id(), signature }.to_string())
            }
            Forgery::Oversized => Some(format!("v1.{}", "A".repeat(4 * SIGNATURE_HEADER_CHARS_MAX))),
            Forgery::UntrustedKey => Some(rogue.sign(&key, token, FORGER_OWNER)),
            Forgery::OtherAccount => {
                let other = dlock_contract::grant::payout_lock_key(&format!("{account}-other"));
                Some(world.sign(&other, token, FORGER_OWNER))
            }
            Forgery::OtherToken => {
                let signed = if token == i64::MAX { token - 1 } else { token + 1 };
                Some(world.sign(&key, signed, FORGER_OWNER))
            }
        }
    }
}

/// One forged write and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Forged {
    pub forgery: Forgery,
    pub hop: &'static str,
    pub payout: String,
    /// 0: no answer.
    pub status: u16,
    pub code: String,
}

impl Forged {
    /// Whether the resource judged this write on its merits (it passed the grant check).
    pub fn got_through(&self) -> bool {
        let undecided = self.status == 0 || self.status >= 500;
        let refused = self.status == 400 && self.code == "INVALID_TOKEN";
        !(undecided || refused)
    }

    pub fn line(&self) -> String {
        format!("forger: {} {} on {} -> {} {}", self.forgery.name(), self.hop, self.payout, self.status, self.code)
    }
}

/// What the forger sent.
#[derive(Clone, Default)]
pub struct ForgerLog {
    inner: Arc<Mutex<Vec<Forged>>>,
}

impl ForgerLog {
    pub fn writes(&self) -> Vec<Forged> {
        self.inner.lock().map(|g| g.clone()).unwrap_or_default()
    }

    fn push(&self, f: Forged) {
        if let Ok(mut g) = self.inner.lock() {
            g.push(f);
        }
    }

    /// `forged_write_refused`, once per forged write that got past the grant check.
    pub fn failures(&self) -> Vec<Failure> {
        self.writes()
            .iter()
            .filter(|f| f.got_through())
            .map(|f| Failure::correctness("forged_write_refused", f.line()))
            .collect()
    }
}

/// Runs the forger on a node `forger` of its own (never faulted) to its end: after the seed's
/// liveness phase, when the payouts have settled and every fault has healed, and before the
/// checks. Played there, it moves nothing the seed did before (a forged write sent during
/// the run would move every later draw of the runtime, and so every existing seed).
pub async fn run_forger(world: &World) -> ForgerLog {
    let log = ForgerLog::default();
    let node = madsim::runtime::Handle::current()
        .create_node()
        .name("forger")
        .ip(std::net::IpAddr::from(crate::world::FORGER_IP))
        .build();
    let paydb = world.paydb.clone();
    let topology = world.spec().topology.clone();
    let out = log.clone();
    let task = node.spawn(async move {
        let signer = grant_signer();
        let rogue = GrantSigner::from_seed(&dlock_rt::rand::secret_bytes::<32>());
        for _ in 0..FORGED_WRITES_PER_SEED {
            let Some(target) = settled_payout(&*paydb).await else { return };
            let Ok(Some(view)) = paydb.payout(target).await else { continue };
            let draw = dlock_rt::rand::random_u64();
            let forgery = Forgery::ALL[(draw % Forgery::ALL.len() as u64) as usize];
            let hop = ["claim", "post", "submit"][((draw >> 8) % 3) as usize];
            // Claims and posts present the int64 maximum (today's account killer); a
            // submission presents 1, so that one the check let through is fenced at the mark
            // (or finds the payout settled) instead of raising it.
            let token = if hop == "submit" { 1 } else { i64::MAX };
            let signature = forgery.signature(&signer, &rogue, &view.account_id, token, draw);
            let replica = |n: usize| ((draw >> 16) as usize % n.max(1)) + 1;
            let (base, path, body) = match hop {
                "claim" => (
                    node_url(&format!("payment-{}", replica(topology.payment_replicas))),
                    format!("/v1/payouts/{target}/claim"),
                    serde_json::json!({ "expectedState": "PENDING" }),
                ),
                "post" => (
                    node_url(&format!("payment-{}", replica(topology.payment_replicas))),
                    format!("/v1/payouts/{target}/post"),
                    serde_json::json!({
                        "submissionId": dlock_rt::rand::uuid_v4(),
                        "railReference": "forged",
                        "railOutcome": "ACKED",
                    }),
                ),
                _ => (
                    node_url(&format!("proxy-{}", replica(topology.proxy_replicas))),
                    "/v1/rail/submissions".to_owned(),
                    serde_json::json!({
                        "payoutId": target,
                        "accountId": view.account_id,
                        "amountMinor": view.amount_minor,
                        "currency": view.currency,
                        "beneficiaryRef": view.beneficiary_ref,
                    }),
                ),
            };
            let token_text = token.to_string();
            let key = format!("forged:{target}:{draw}");
            let mut headers = vec![
                ("content-type", "application/json"),
                (dlock_contract::HEADER_FENCING_TOKEN, token_text.as_str()),
                (dlock_contract::HEADER_OWNER_ID, FORGER_OWNER),
                (dlock_contract::HEADER_IDEMPOTENCY_KEY, key.as_str()),
            ];
            if let Some(sig) = &signature {
                headers.push((dlock_contract::HEADER_FENCING_SIGNATURE, sig.as_str()));
            }
            let answer = HttpClient::new(FORGER_CONNECT_MS, FORGER_READ_MS)
                .send(&base, http::Method::POST, &path, &headers, Some(body.to_string().into()))
                .await;
            let (status, code) = match answer {
                Ok(r) => {
                    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
                    (r.status, v["code"].as_str().unwrap_or_default().to_owned())
                }
                Err(_) => (0, String::new()),
            };
            out.push(Forged { forgery, hop, payout: target.to_string(), status, code });
        }
    });
    let _ = task.await;
    log
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
