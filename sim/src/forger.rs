//! The forger (issue 12, issue 41): a client on node `forger` (never faulted) that presents
//! writes no honest holder sends. At the end of every swarm seed, after its liveness phase
//! and before its checks ([`run_forger`]), it sends [`FORGED_WRITES_PER_SEED`] fenced writes
//! under tokens the lock server never granted it, to the payment-resource (claim, post) and
//! the rail-proxy (submission); then its owner attacks, its lapsed-session calls, its
//! equal-token replays and its cross-account batch (sections below). During the fault phase
//! ([`start_forger`], [`FAULT_ROUNDS`] rounds at drawn instants) it replays and sends
//! cross-account batches too, while the faults play. Its forgeries ([`Forgery`]):
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
//!
//! ## Owner attacks (C3-extensions E-9, "Owner binding")
//! After its forged writes, on the same node, the forger attacks another owner's session and
//! grant on a drawn lock replica. A victim, under the world's credential bound to
//! `owners=forger-victim/*` ([`crate::world::VICTIM_WORKER_TOKEN`], `X-Owner-Id:
//! forger-victim/0`), opens a session and acquires a key no executor uses
//! (`forger-victim:<n>`). Then the forger, under its own credential bound to `owners=forger/*`
//! ([`crate::world::FORGER_WORKER_TOKEN`], `X-Owner-Id: forger/0`, an id it may use), sends
//! each [`OwnerAttack`] once, in this order: `heartbeat` (L2 of the victim's session),
//! `acquire` (L4 of another key through the victim's session), `renew` (L5 of the victim's
//! grant, `ttlMillis` 1000), `rotate` (of the victim's grant), `release` (L6 of the victim's
//! grant with a made-up session id and the victim's token), `close` (L3 of the victim's
//! session). A victim setup that gets no grant (no answer, a fault) skips the attacks.
//!
//! ## Equal-token replays (issue 41)
//! The strict `>` at every fence exists for a token presented twice. The forger takes the
//! newest signed writes the executors sent and had accepted (the simulation's wire log:
//! a claim or post per account, and at the end a submission per mark) and sends each again
//! exactly as it was, token and signature included, under a fresh idempotency key. Each must
//! be refused `FENCED_OUT` (the oracle: an equal token accepted breaks
//! `fence_accepts_only_rising_tokens`; the refusal fires `equal_token_replay_refused`). A
//! planted `mark-ge` is found this way.
//!
//! ## Cross-account batches (issue 41)
//! A claim batch passes one account's fence and writes the payouts it names: each must be
//! of that account. The forger opens its own account [`FORGER_ACCOUNT_A`] at zero and sends
//! a claim batch for it under a grant of its key signed with the world's key (what a holder
//! of that account's lock presents), naming other accounts' PENDING payouts: during the
//! fault phase the workload's, at the end one of its own second account
//! [`FORGER_ACCOUNT_B`], which it then settles (a claim under B's own grant fails it for
//! lack of funds). Every named payout must come back `NOT_FOUND` with nothing written (the
//! oracle: `fenced_write_within_its_account`; the refusal fires
//! `foreign_payout_refused_in_batch`). A planted `batch-ignores-account` is found this way.
//!
//! ## Lapsed sessions (issue 41)
//! At the end, after its owner attacks, on a drawn lock replica, under its own credential, the forger opens a session of
//! the shortest TTL ([`LAPSE_SESSION_TTL_MS`]), acquires a key no executor uses
//! (`forger-lapse:<n>`) with a lease far longer ([`LAPSE_LEASE_TTL_MS`]), and stops
//! heartbeating. Once that replica says the key is no longer held (polled, bounded by
//! [`LAPSE_WAIT_MS_MAX`]), it renews the grant, then rotates it: a holder that woke after
//! its session lapsed.
//!
//! ## Invariant (checked by [`ForgerLog::failures`])
//! **A grant whose session lapsed never comes back**: neither call is answered 200, or the
//! seed fails `dead_grant_never_revived` (correctness), on every backend. The oracle judges
//! the same calls from the store's side as well (`oracle::calls` and the simulation
//! lockdb's model).
//!
//! ## Invariant (checked by [`ForgerLog::failures`])
//! **No owner attack passes the owner check**: every answer is `403 FORBIDDEN`, or no
//! decision at all (no answer, 5xx, `503 NOT_LEADER`: nothing changed). Any other answer means
//! the lock server judged the write on its merits: the seed fails `owner_attack_refused`
//! (correctness). A planted `skip-owner-check` is found by this invariant alone: the victim's
//! key is no executor's, so an attack that got through changes nothing the rest of the
//! oracle judges.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use dlock_contract::auth::Secret;
use dlock_contract::grant::{GrantSignature, GrantSigner, SIGNATURE_HEADER_CHARS_MAX};
use dlock_rt::http::{BaseUrl, Bearer, HttpClient};

use crate::outcome::Failure;

#[cfg(madsim)]
mod in_world;
#[cfg(madsim)]
pub use in_world::{run_forger, start_forger};

/// Where the forger aims and what it holds: the simulated world's nodes and keys
/// (`in_world`), or a real cluster's (the real run, docs/real-runs.md "The forger").
#[derive(Clone)]
pub struct Aim {
    /// The payment-resource replicas, then the rail-proxy's, then the lock server's.
    pub payment: Vec<BaseUrl>,
    pub proxy: Vec<BaseUrl>,
    pub lock: Vec<BaseUrl>,
    /// The key every lock-server replica signs grants with (the forger signs with it what
    /// a holder of another account's lock would present).
    pub signer: GrantSigner,
    /// The bearer of its forged writes to the resources (`None`: the process default).
    pub writer: Option<Bearer>,
    /// The bearer of its creates (its own accounts and payout; `None`: the process default).
    pub creator: Option<Bearer>,
    /// A worker credential bound to `owners=forger/*` (its owner attacks and lapsed
    /// sessions), and one bound to `owners=forger-victim/*` (its victim's).
    pub forger_token: Secret,
    pub victim_token: Secret,
}

impl Aim {
    /// The lock replica a draw picks, and its name (`lock-N`, from 1).
    fn lock_replica(&self, draw: u64) -> (String, BaseUrl) {
        let i = (draw % self.lock.len().max(1) as u64) as usize;
        let name = format!("lock-{}", i + 1);
        (name, self.lock.get(i).cloned().unwrap_or_else(|| BaseUrl::plain(String::new())))
    }
}

/// A settled payout a forged write aims at: what a submission names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub payout_id: uuid::Uuid,
    pub account_id: String,
    pub amount_minor: i64,
    pub currency: String,
    pub beneficiary_ref: String,
}

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
/// The forger's owner id in its owner attacks (its credential is bound to `forger/*`).
pub const ATTACKER_OWNER: &str = "forger/0";
/// The victim's owner id (its credential is bound to `forger-victim/*`).
pub const VICTIM_OWNER: &str = "forger-victim/0";
/// The victim's session TTL and lock TTL: far longer than the attacks take.
pub const VICTIM_TTL_MS: i64 = 60_000;
/// The lease the forger's `renew` attack asks for (it would cut the victim's lease short).
pub const ATTACK_RENEW_TTL_MS: i64 = 1_000;
/// The session id of the forger's `release` attack: one nobody opened.
pub const MADE_UP_SESSION: &str = "00000000-0000-4000-8000-00000000f0e1";

/// The session TTL of the forger's lapsed-session attacks: the shortest a session may ask.
pub const LAPSE_SESSION_TTL_MS: i64 = dlock_contract::lock::SESSION_TTL_MS_MIN;
/// The lease of its grant there: far longer than the session, so only the session ends it.
pub const LAPSE_LEASE_TTL_MS: i64 = 60_000;
/// How often, and how long at most, it asks the replica whether the grant still lives.
pub const LAPSE_POLL_MS: u64 = 200;
pub const LAPSE_WAIT_MS_MAX: u64 = 15_000;

/// Signed writes the forger replays at the end of a seed, at most ([`replay_signed_writes`]).
pub const REPLAYS_PER_SEED: usize = 4;
/// Rounds the forger plays during the fault phase ([`start_forger`]), each at a drawn
/// instant of its share of the phase: one equal-token replay and one cross-account batch.
pub const FAULT_ROUNDS: u64 = 2;
/// Another account's PENDING payouts a fault-phase cross-account batch names, at most.
pub const FOREIGN_PAYOUTS_MAX: i64 = 3;
/// The forger's own accounts for its cross-account batch ([`run_cross_account_batch`]): the
/// batch passes `FORGER_ACCOUNT_A`'s fence and names a payout of `FORGER_ACCOUNT_B`.
pub const FORGER_ACCOUNT_A: &str = "forger-a";
pub const FORGER_ACCOUNT_B: &str = "forger-b";
/// The amount of the forger's payout (its accounts open at zero: a claim fails it for
/// lack of funds, which settles it).
pub const FORGER_PAYOUT_MINOR: i64 = 100;
/// Tries of each of the forger's setup writes (its accounts, its payout, the claim that
/// settles the payout).
pub const FORGER_TRIES_MAX: u32 = 3;

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

/// Whether an answer `(status, code)` shows the request judged on its merits: neither the
/// refusal the check under attack gives (`refused`) nor no decision (no answer, a 5xx).
fn judged_on_merits(status: u16, code: &str, refused: (u16, &str)) -> bool {
    let undecided = status == 0 || status >= 500;
    !(undecided || (status, code) == refused)
}

impl Forged {
    /// Whether the resource judged this write on its merits (it passed the grant check).
    pub fn got_through(&self) -> bool {
        judged_on_merits(self.status, &self.code, (400, "INVALID_TOKEN"))
    }

    pub fn line(&self) -> String {
        format!("forger: {} {} on {} -> {} {}", self.forgery.name(), self.hop, self.payout, self.status, self.code)
    }
}

/// One owner attack (module doc, "Owner attacks"): a lock-server write that addresses the
/// victim's session or grant, sent under the forger's credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerAttack {
    Heartbeat,
    Acquire,
    Renew,
    Rotate,
    Release,
    Close,
}

impl OwnerAttack {
    /// Every attack, in the order the forger sends them.
    pub const ALL: [OwnerAttack; 6] = [
        OwnerAttack::Heartbeat,
        OwnerAttack::Acquire,
        OwnerAttack::Renew,
        OwnerAttack::Rotate,
        OwnerAttack::Release,
        OwnerAttack::Close,
    ];

    pub fn name(self) -> &'static str {
        match self {
            OwnerAttack::Heartbeat => "heartbeat",
            OwnerAttack::Acquire => "acquire",
            OwnerAttack::Renew => "renew",
            OwnerAttack::Rotate => "rotate",
            OwnerAttack::Release => "release",
            OwnerAttack::Close => "close",
        }
    }
}

/// One owner attack and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attacked {
    pub attack: OwnerAttack,
    /// The lock replica it was sent to (`lock-N`).
    pub replica: String,
    /// The victim's lock key.
    pub key: String,
    /// 0: no answer.
    pub status: u16,
    pub code: String,
}

impl Attacked {
    /// Whether the lock server judged this write on its merits (it passed the owner check).
    pub fn got_through(&self) -> bool {
        judged_on_merits(self.status, &self.code, (403, "FORBIDDEN"))
    }

    pub fn line(&self) -> String {
        format!(
            "forger: owner attack {} on {} at {} -> {} {}",
            self.attack.name(),
            self.key,
            self.replica,
            self.status,
            self.code
        )
    }
}

/// One renew or rotate of the forger's own grant after its session lapsed (module doc,
/// "Lapsed sessions"), and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lapsed {
    /// `renew` or `rotate`.
    pub call: &'static str,
    /// The lock replica it was sent to (`lock-N`), the one that said the grant had died.
    pub replica: String,
    pub key: String,
    pub token: i64,
    /// 0: no answer.
    pub status: u16,
    pub code: String,
}

impl Lapsed {
    /// Whether the dead grant came back: the call was answered 200.
    pub fn revived(&self) -> bool {
        self.status == 200
    }

    pub fn line(&self) -> String {
        format!(
            "forger: {} of {} token {} after its session lapsed, at {} -> {} {}",
            self.call, self.key, self.token, self.replica, self.status, self.code
        )
    }
}

/// One signed write of an executor the forger sent again, with its original token and
/// signature and a fresh idempotency key (module doc, "Equal-token replays"), or the
/// forger's cross-account batch; and its answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replayed {
    /// `claim`, `post`, `submit`, or `batch` (the cross-account batch).
    pub hop: &'static str,
    /// The payout it names.
    pub payout: String,
    pub token: i64,
    /// 0: no answer.
    pub status: u16,
    pub code: String,
}

impl Replayed {
    /// A cross-account batch whose store judged a payout it named on its merits: an item
    /// answered anything but `404 NOT_FOUND` (each must come back so, module doc
    /// "Cross-account batches"; a claim refused for funds has failed the payout already).
    /// A batch refused whole, or not answered, names no item.
    pub fn wrote_foreign(&self) -> bool {
        self.hop == "batch" && !self.code.is_empty() && self.code.split(',').any(|item| item != "404 NOT_FOUND")
    }

    pub fn line(&self) -> String {
        format!("forger: {} of {} under token {} -> {} {}", self.hop, self.payout, self.token, self.status, self.code)
    }
}

/// What the forger sent.
#[derive(Clone, Default)]
pub struct ForgerLog {
    inner: Arc<Mutex<Vec<Forged>>>,
    attacks: Arc<Mutex<Vec<Attacked>>>,
    lapsed: Arc<Mutex<Vec<Lapsed>>>,
    replayed: Arc<Mutex<Vec<Replayed>>>,
}

impl ForgerLog {
    pub fn writes(&self) -> Vec<Forged> {
        self.inner.lock().map(|g| g.clone()).unwrap_or_default()
    }

    /// The owner attacks sent, in order (none when the victim's setup failed).
    pub fn attacks(&self) -> Vec<Attacked> {
        self.attacks.lock().map(|g| g.clone()).unwrap_or_default()
    }

    fn push(&self, f: Forged) {
        if let Ok(mut g) = self.inner.lock() {
            g.push(f);
        }
    }

    fn push_attack(&self, a: Attacked) {
        if let Ok(mut g) = self.attacks.lock() {
            g.push(a);
        }
    }

    /// The renews and rotates of lapsed grants sent, in order.
    pub fn lapsed(&self) -> Vec<Lapsed> {
        self.lapsed.lock().map(|g| g.clone()).unwrap_or_default()
    }

    fn push_lapsed(&self, l: Lapsed) {
        if let Ok(mut g) = self.lapsed.lock() {
            g.push(l);
        }
    }

    /// The signed writes replayed and the cross-account batch, in order.
    pub fn replayed(&self) -> Vec<Replayed> {
        self.replayed.lock().map(|g| g.clone()).unwrap_or_default()
    }

    fn push_replayed(&self, r: Replayed) {
        if let Ok(mut g) = self.replayed.lock() {
            g.push(r);
        }
    }

    /// One line per forged write, then one per owner attack, per lapsed call, per replay.
    pub fn lines(&self) -> Vec<String> {
        let mut lines: Vec<String> = self.writes().iter().map(Forged::line).collect();
        lines.extend(self.attacks().iter().map(Attacked::line));
        lines.extend(self.lapsed().iter().map(Lapsed::line));
        lines.extend(self.replayed().iter().map(Replayed::line));
        lines
    }

    /// `forged_write_refused`, once per forged write that got past the grant check, then
    /// `owner_attack_refused`, once per owner attack that got past the owner check, then
    /// `dead_grant_never_revived`, once per lapsed call answered 200, then
    /// `fenced_write_within_its_account`, once per cross-account batch that wrote a payout
    /// it named.
    pub fn failures(&self) -> Vec<Failure> {
        let mut found: Vec<Failure> = self
            .writes()
            .iter()
            .filter(|f| f.got_through())
            .map(|f| Failure::correctness(crate::oracle::ids::FORGED_WRITE_REFUSED, f.line()))
            .collect();
        found.extend(
            self.attacks()
                .iter()
                .filter(|a| a.got_through())
                .map(|a| Failure::correctness(crate::oracle::ids::OWNER_ATTACK_REFUSED, a.line())),
        );
        found.extend(
            self.lapsed()
                .iter()
                .filter(|l| l.revived())
                .map(|l| Failure::correctness(crate::oracle::ids::DEAD_GRANT_NEVER_REVIVED, l.line())),
        );
        found.extend(
            self.replayed()
                .iter()
                .filter(|r| r.wrote_foreign())
                .map(|r| Failure::correctness(crate::oracle::ids::FENCED_WRITE_WITHIN_ITS_ACCOUNT, r.line())),
        );
        found
    }
}

/// One forged write (module doc) at `target`, drawn by `draw`: its forgery, its hop
/// (claim, post or submission) and its replica; `rogue` is the untrusted key.
pub async fn forge_one(aim: &Aim, rogue: &GrantSigner, target: &Target, draw: u64, out: &ForgerLog) {
    let forgery = Forgery::ALL[(draw % Forgery::ALL.len() as u64) as usize];
    let hop = ["claim", "post", "submit"][((draw >> 8) % 3) as usize];
    // Claims and posts present the int64 maximum (today's account killer); a
    // submission presents 1, so that one the check let through is fenced at the mark
    // (or finds the payout settled) instead of raising it.
    let token = if hop == "submit" { 1 } else { i64::MAX };
    let signature = forgery.signature(&aim.signer, rogue, &target.account_id, token, draw);
    let replica = |urls: &[BaseUrl]| {
        let n = urls.len().max(1);
        urls.get((draw >> 16) as usize % n).cloned().unwrap_or_else(|| BaseUrl::plain(String::new()))
    };
    let payout = target.payout_id;
    let (base, path, body) = match hop {
        "claim" => (
            replica(&aim.payment),
            format!("/v1/payouts/{payout}/claim"),
            serde_json::json!({ "expectedState": "PENDING" }),
        ),
        "post" => (
            replica(&aim.payment),
            format!("/v1/payouts/{payout}/post"),
            serde_json::json!({
                "submissionId": dlock_rt::rand::uuid_v4(),
                "railReference": "forged",
                "railOutcome": "ACKED",
            }),
        ),
        _ => (
            replica(&aim.proxy),
            "/v1/rail/submissions".to_owned(),
            serde_json::json!({
                "payoutId": payout,
                "accountId": target.account_id,
                "amountMinor": target.amount_minor,
                "currency": target.currency,
                "beneficiaryRef": target.beneficiary_ref,
            }),
        ),
    };
    let token_text = token.to_string();
    let key = format!("forged:{payout}:{draw}");
    let mut headers = vec![
        ("content-type", "application/json"),
        (dlock_contract::HEADER_FENCING_TOKEN, token_text.as_str()),
        (dlock_contract::HEADER_OWNER_ID, FORGER_OWNER),
        (dlock_contract::HEADER_IDEMPOTENCY_KEY, key.as_str()),
    ];
    if let Some(sig) = &signature {
        headers.push((dlock_contract::HEADER_FENCING_SIGNATURE, sig.as_str()));
    }
    let answer =
        forger_client(aim).send(&base, http::Method::POST, &path, &headers, Some(body.to_string().into())).await;
    let (status, code) = status_and_code(answer);
    out.push(Forged { forgery, hop, payout: payout.to_string(), status, code });
}

/// The forger's HTTP client for fenced writes: its budgets, and the aim's writer bearer.
fn forger_client(aim: &Aim) -> HttpClient {
    let client = HttpClient::new(FORGER_CONNECT_MS, FORGER_READ_MS);
    if aim.writer.is_some() {
        client.with_bearer(aim.writer.clone())
    } else {
        client
    }
}

/// The forger's payment client (its creates, under the aim's creator bearer) on the payment
/// replica `draw` picks, and that replica.
pub fn payment_client(aim: &Aim, draw: u64) -> Option<(BaseUrl, dlock_payment_client::PaymentClient)> {
    let replica = aim.payment.get((draw % aim.payment.len().max(1) as u64) as usize)?.clone();
    let mut cfg = dlock_payment_client::PaymentClientConfig::new(replica.clone());
    cfg.write_read_timeout_ms = FORGER_READ_MS;
    cfg.bearer = aim.creator.clone();
    Some((replica, dlock_payment_client::PaymentClient::new(cfg).ok()?))
}

// Opens the forger's `account` at zero (idempotent: the same key each time); whether it
/// exists.
pub async fn open_account(client: &dlock_payment_client::PaymentClient, account: &str) -> bool {
    let (Ok(owner), Ok(k)) = (
        dlock_contract::OwnerId::parse(FORGER_OWNER),
        dlock_contract::IdempotencyKey::parse(&format!("forger-open-{account}")),
    ) else {
        return false;
    };
    let body = dlock_contract::payment::NewAccountRequest {
        account_id: account.to_owned(),
        currency: "EUR".into(),
        opening_balance_minor: 0,
    };
    for _ in 0..FORGER_TRIES_MAX {
        if client.create_account(&owner, &k, &body).await.is_ok() {
            return true;
        }
    }
    false
}

/// A fenced write of the forger to `path` under token 1 of `account`'s lock key, signed with
/// the aim's key (what a holder of that account's lock presents).
async fn send_as_holder(
    aim: &Aim,
    replica: &BaseUrl,
    path: &str,
    account: &str,
    key: &str,
    body: serde_json::Value,
) -> Result<dlock_rt::http::ClientResponse, dlock_rt::http::ClientError> {
    let signature = aim.signer.sign(&dlock_contract::grant::payout_lock_key(account), 1, FORGER_OWNER);
    let headers = [
        ("content-type", "application/json"),
        (dlock_contract::HEADER_FENCING_TOKEN, "1"),
        (dlock_contract::HEADER_FENCING_SIGNATURE, signature.as_str()),
        (dlock_contract::HEADER_OWNER_ID, FORGER_OWNER),
        (dlock_contract::HEADER_IDEMPOTENCY_KEY, key),
    ];
    forger_client(aim).send(replica, http::Method::POST, path, &headers, Some(body.to_string().into())).await
}

/// A claim batch of [`FORGER_ACCOUNT_A`] naming `payouts` (of other accounts), sent and
/// logged; the probe fires when every item came back `NOT_FOUND`.
pub async fn send_foreign_batch(aim: &Aim, replica: &BaseUrl, payouts: &[uuid::Uuid], key: &str, out: &ForgerLog) {
    let items: Vec<serde_json::Value> =
        payouts.iter().map(|p| serde_json::json!({ "payoutId": p, "expectedState": "PENDING" })).collect();
    let path = format!("/v1/accounts/{FORGER_ACCOUNT_A}/claims");
    let answer =
        send_as_holder(aim, replica, &path, FORGER_ACCOUNT_A, key, serde_json::json!({ "payouts": items })).await;
    let (status, items) = match &answer {
        Ok(r) => {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            let items: Vec<String> = v["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| format!("{} {}", i["status"], i["body"]["code"].as_str().unwrap_or_default()))
                .collect();
            (r.status, items)
        }
        Err(_) => (0, Vec::new()),
    };
    if !items.is_empty() && items.iter().all(|i| i == "404 NOT_FOUND") {
        dlock_rt::probe::hit(dlock_rt::probe::Probe::ForeignPayoutRefusedInBatch);
    }
    let named: Vec<String> = payouts.iter().map(|p| p.to_string()).collect();
    out.push_replayed(Replayed { hop: "batch", payout: named.join(","), token: 1, status, code: items.join(",") });
}

/// The cross-account batch (module doc): the forger opens two accounts of its own at zero,
/// creates a payout of [`FORGER_ACCOUNT_B`], and sends a claim batch for
/// [`FORGER_ACCOUNT_A`], under a grant of A's key signed with the aim's key (what a
/// holder of A's lock presents), naming B's payout. A's fence passes; B's payout must come
/// back `NOT_FOUND`. Then it claims the payout under a grant of B's own key, which fails it
/// for lack of funds: the forger leaves nothing unsettled.
pub async fn run_cross_account_batch(aim: &Aim, draw: u64, out: &ForgerLog) {
    let Some((replica, client)) = payment_client(aim, draw) else { return };
    for account in [FORGER_ACCOUNT_A, FORGER_ACCOUNT_B] {
        if !open_account(&client, account).await {
            return;
        }
    }
    let Ok(owner) = dlock_contract::OwnerId::parse(FORGER_OWNER) else { return };
    let body = dlock_contract::payment::NewPayoutRequest {
        payout_id: None,
        account_id: FORGER_ACCOUNT_B.to_owned(),
        amount_minor: FORGER_PAYOUT_MINOR,
        currency: "EUR".into(),
        beneficiary_ref: "forger-beneficiary".into(),
    };
    let Ok(k) = dlock_contract::IdempotencyKey::parse("forger-payout") else { return };
    let mut payout = None;
    for _ in 0..FORGER_TRIES_MAX {
        if let Ok(p) = client.create_payout(&owner, &k, &body).await {
            payout = Some(p.payout_id);
            break;
        }
    }
    let Some(payout) = payout else { return };
    send_foreign_batch(aim, &replica, &[payout], "forger-batch", out).await;
    // Settle the payout under its own account's grant: no funds, so FAILED.
    for t in 0..FORGER_TRIES_MAX {
        let claim = serde_json::json!({ "expectedState": "PENDING" });
        let path = format!("/v1/payouts/{payout}/claim");
        let answer = send_as_holder(aim, &replica, &path, FORGER_ACCOUNT_B, &format!("forger-settle-{t}"), claim).await;
        if answer.is_ok_and(|r| r.status < 500) {
            break;
        }
    }
}

/// One lock-server request under the credential `token`, as `owner`: the answer's status
/// and body (`(0, null)`: no answer within the forger's budgets).
async fn lock_call(
    base: &BaseUrl,
    token: &Secret,
    owner: &str,
    method: http::Method,
    path: &str,
    fencing_token: Option<&str>,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    // An explicit bearer: it wins over the process default ([`crate::world::layers`]).
    let client = HttpClient::new(FORGER_CONNECT_MS, FORGER_READ_MS).with_bearer(Some(Bearer::fixed(token.clone())));
    let mut headers = vec![(dlock_contract::HEADER_OWNER_ID, owner)];
    if let Some(t) = fencing_token {
        headers.push((dlock_contract::HEADER_FENCING_TOKEN, t));
    }
    if body.is_some() {
        headers.push(("content-type", "application/json"));
    }
    match client.send(base, method, path, &headers, body.map(|b| b.to_string().into())).await {
        Ok(r) => (r.status, serde_json::from_slice(&r.body).unwrap_or_default()),
        Err(_) => (0, serde_json::Value::Null),
    }
}

/// The owner attacks (module doc, "Owner attacks"): the victim's setup on a drawn lock
/// replica, then each [`OwnerAttack`] once under the forger's own credential. Nothing is
/// sent when the setup gets no session or no grant. `draw` picks the replica and the key.
pub async fn run_owner_attacks(aim: &Aim, draw: u64, out: &ForgerLog) {
    let (replica, base) = aim.lock_replica(draw);
    let key = format!("forger-victim:{}", draw >> 32);
    let victim = |method: http::Method, path: String, fencing: Option<String>, body: Option<serde_json::Value>| {
        let base = base.clone();
        async move { lock_call(&base, &aim.victim_token, VICTIM_OWNER, method, &path, fencing.as_deref(), body).await }
    };
    let forger = |method: http::Method, path: String, fencing: Option<String>, body: Option<serde_json::Value>| {
        let base = base.clone();
        async move { lock_call(&base, &aim.forger_token, ATTACKER_OWNER, method, &path, fencing.as_deref(), body).await }
    };
    // The victim's session and grant.
    let opened = serde_json::json!({ "ttlMillis": VICTIM_TTL_MS });
    let (status, answer) = victim(http::Method::POST, "/v1/sessions".to_owned(), None, Some(opened)).await;
    let Some(session) = answer["sessionId"].as_str().filter(|_| status == 201).map(str::to_owned) else { return };
    let acquire = serde_json::json!({ "sessionId": session, "ttlMillis": VICTIM_TTL_MS });
    let path = format!("/v1/locks/{key}/acquire");
    let (status, grant) = victim(http::Method::POST, path, None, Some(acquire)).await;
    let Some(mut token) = grant["fencingToken"].as_i64().filter(|_| status == 200) else { return };
    // The forger, bound to `forger/*`, at the victim's session and grant.
    for attack in OwnerAttack::ALL {
        let held = Some(token.to_string());
        let (method, path, fencing, body) = match attack {
            OwnerAttack::Heartbeat => (http::Method::POST, format!("/v1/sessions/{session}/heartbeat"), None, None),
            OwnerAttack::Acquire => (
                http::Method::POST,
                format!("/v1/locks/{key}:forger/acquire"),
                None,
                Some(serde_json::json!({ "sessionId": session, "ttlMillis": VICTIM_TTL_MS })),
            ),
            OwnerAttack::Renew => (
                http::Method::POST,
                format!("/v1/locks/{key}/renew"),
                held,
                Some(serde_json::json!({ "sessionId": session, "ttlMillis": ATTACK_RENEW_TTL_MS })),
            ),
            OwnerAttack::Rotate => (
                http::Method::POST,
                format!("/v1/locks/{key}/rotate"),
                held,
                Some(serde_json::json!({ "sessionId": session })),
            ),
            OwnerAttack::Release => {
                (http::Method::DELETE, format!("/v1/locks/{key}?sessionId={MADE_UP_SESSION}"), held, None)
            }
            OwnerAttack::Close => (http::Method::DELETE, format!("/v1/sessions/{session}"), None, None),
        };
        let (status, answer) = forger(method, path, fencing, body).await;
        // A rotate that got through replaced the victim's token: the release that follows
        // presents the new one, so it too is judged on its merits.
        if let (OwnerAttack::Rotate, 200, Some(rotated)) = (attack, status, answer["fencingToken"].as_i64()) {
            token = rotated;
        }
        let code = answer["code"].as_str().unwrap_or_default().to_owned();
        out.push_attack(Attacked { attack, replica: replica.clone(), key: key.clone(), status, code });
    }
}

/// The lapsed-session calls (module doc, "Lapsed sessions"): on a drawn lock replica, the
/// forger opens a session of [`LAPSE_SESSION_TTL_MS`], acquires a key no executor uses for
/// [`LAPSE_LEASE_TTL_MS`], never heartbeats, and asks that replica (`GET /v1/locks/{key}`,
/// every [`LAPSE_POLL_MS`], at most [`LAPSE_WAIT_MS_MAX`]) until it says the key is not held.
/// Then it renews the grant, and rotates it. Nothing is sent when the setup gets no grant or
/// the replica never says the grant died. `draw` picks the replica and the key.
pub async fn run_lapsed_session(aim: &Aim, draw: u64, out: &ForgerLog) {
    let (replica, base) = aim.lock_replica(draw);
    let key = format!("forger-lapse:{}", draw >> 32);
    let me = |method: http::Method, path: String, fencing: Option<String>, body: Option<serde_json::Value>| {
        let base = base.clone();
        async move { lock_call(&base, &aim.forger_token, ATTACKER_OWNER, method, &path, fencing.as_deref(), body).await }
    };
    let opened = serde_json::json!({ "ttlMillis": LAPSE_SESSION_TTL_MS });
    let (status, answer) = me(http::Method::POST, "/v1/sessions".to_owned(), None, Some(opened)).await;
    let Some(session) = answer["sessionId"].as_str().filter(|_| status == 201).map(str::to_owned) else { return };
    let acquire = serde_json::json!({ "sessionId": session, "ttlMillis": LAPSE_LEASE_TTL_MS });
    let (status, grant) = me(http::Method::POST, format!("/v1/locks/{key}/acquire"), None, Some(acquire)).await;
    let Some(token) = grant["fencingToken"].as_i64().filter(|_| status == 200) else { return };
    // Poll the replica's own view until the grant died with its session (no heartbeat).
    let mut waited_ms = 0;
    loop {
        dlock_rt::sleep(Duration::from_millis(LAPSE_POLL_MS)).await;
        waited_ms += LAPSE_POLL_MS;
        let (status, info) = me(http::Method::GET, format!("/v1/locks/{key}"), None, None).await;
        if status == 200 && info["held"] == serde_json::Value::Bool(false) {
            break;
        }
        if waited_ms >= LAPSE_WAIT_MS_MAX {
            return;
        }
    }
    let held = Some(token.to_string());
    for (call, body) in [
        ("renew", serde_json::json!({ "sessionId": session, "ttlMillis": LAPSE_LEASE_TTL_MS })),
        ("rotate", serde_json::json!({ "sessionId": session })),
    ] {
        let path = format!("/v1/locks/{key}/{call}");
        let (status, answer) = me(http::Method::POST, path, held.clone(), Some(body)).await;
        let code = answer["code"].as_str().unwrap_or_default().to_owned();
        if matches!(code.as_str(), "SESSION_EXPIRED" | "SESSION_UNKNOWN" | "LOCK_LOST") {
            dlock_rt::probe::hit(dlock_rt::probe::Probe::LapsedGrantRefused);
        }
        out.push_lapsed(Lapsed { call, replica: replica.clone(), key: key.clone(), token, status, code });
    }
}

/// An answer's status and envelope `code` (`(0, "")`: no answer).
fn status_and_code(answer: Result<dlock_rt::http::ClientResponse, dlock_rt::http::ClientError>) -> (u16, String) {
    match answer {
        Ok(r) => {
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            (r.status, v["code"].as_str().unwrap_or_default().to_owned())
        }
        Err(_) => (0, String::new()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answered(status: u16, code: &str) -> Attacked {
        let (replica, key) = ("lock-1".to_owned(), "forger-victim:1".to_owned());
        Attacked { attack: OwnerAttack::Renew, replica, key, status, code: code.to_owned() }
    }

    #[test]
    fn an_owner_attack_passes_only_as_forbidden_or_undecided() {
        for (status, code) in [(403, "FORBIDDEN"), (0, ""), (500, "INTERNAL"), (503, "NOT_LEADER")] {
            assert!(!answered(status, code).got_through(), "{status} {code}");
        }
        for (status, code) in [(200, ""), (204, ""), (409, "LOCK_LOST"), (404, "SESSION_UNKNOWN"), (403, "OTHER")] {
            assert!(answered(status, code).got_through(), "{status} {code}");
        }
        let log = ForgerLog::default();
        log.push_attack(answered(403, "FORBIDDEN"));
        log.push_attack(answered(200, ""));
        let failures = log.failures();
        assert_eq!(failures.len(), 1, "{failures:?}");
        assert_eq!(failures[0].invariant, "owner_attack_refused");
        assert_eq!(log.lines()[1], "forger: owner attack renew on forger-victim:1 at lock-1 -> 200 ");
    }

    #[test]
    fn a_cross_account_batch_fails_the_run_only_when_it_wrote_a_payout_it_named() {
        let batch = |status: u16, code: &str| Replayed {
            hop: "batch",
            payout: "p1,p2".to_owned(),
            token: 1,
            status,
            code: code.to_owned(),
        };
        let log = ForgerLog::default();
        for clean in [batch(200, "404 NOT_FOUND,404 NOT_FOUND"), batch(0, ""), batch(409, ""), batch(503, "")] {
            assert!(!clean.wrote_foreign(), "{clean:?}");
            log.push_replayed(clean);
        }
        log.push_replayed(Replayed { hop: "claim", ..batch(200, "200 ") });
        assert!(log.failures().is_empty(), "{:?}", log.failures());
        log.push_replayed(batch(200, "404 NOT_FOUND,422 INSUFFICIENT_FUNDS"));
        log.push_replayed(batch(200, "200 "));
        let failures = log.failures();
        assert_eq!(failures.len(), 2, "{failures:?}");
        assert!(failures.iter().all(|f| f.invariant == "fenced_write_within_its_account"), "{failures:?}");
    }
}
