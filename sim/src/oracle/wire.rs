//! The oracle's checks of what callers received on the wire ([`dlock_rt::wire_log`]) against
//! what the stores hold.
//!
//! - **Retry-safe answers left no trace** ([`retry_safe_failures`]): a claim, a post, a
//!   submission or an acquire answered with an envelope marked `retrySafe: true` must have
//!   no effect in the stores. A claim or post is one identity (payout, token): when every
//!   send of it was answered retry-safe, paydb holds neither its fence acceptance nor its
//!   idempotency record. A submission (payout, token) answered retry-safe has no
//!   forwardable intent row (C3-extensions C-5: an UNSENT row is the evidence that nothing
//!   was presented, and allowed). An acquire (session, key) answered retry-safe was not
//!   granted: no grant of that key to that session commits while only retry-safe-answered
//!   acquires of it were in flight, nor after one before the session asks again.
//! - **Idempotent replays are byte-identical on the wire** ([`wire_replay_failures`]):
//!   every answer below 500 to a claim or post whose identity paydb recorded is exactly the
//!   recorded status and bytes (the first execution's answer and every replay alike).
//!
//! Both are plain functions over parsed exchanges ([`WireWrite`]) and plain facts, so each
//! is proven able to fail by a unit test with a planted violation (`oracle/tests.rs`).

use std::collections::{BTreeMap, BTreeSet};

use dlock_contract::{HEADER_FENCING_TOKEN, HEADER_IDEMPOTENCY_KEY};
use dlock_payment_resource::store_mem::FencedOp;
use dlock_rt::wire_log::{Exchange, Fate};
use uuid::Uuid;

use super::ids;
use crate::outcome::Failure;

/// What a recorded write asked for.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum WireTarget {
    /// A claim (P2), post (P3) or submission (`FencedOp::Admit`) of `payout` under `token`.
    Fenced { op: FencedOp, payout: Uuid, token: i64, key: String },
    /// An acquire (L4) of `key` in `session`.
    Acquire { session: Uuid, key: String },
    /// A batch (C3-extensions E-19: P2b `FencedOp::Claim`, P3b `FencedOp::Post`) of
    /// `account` under `token`, as one request: its whole answer, for the replay check.
    /// Each payout it names is also a [`WireTarget::Fenced`] of its own ([`parse_wire_all`]).
    Batch { op: FencedOp, account: String, token: i64, key: String },
}

/// One write a client sent, as the oracle reads it from the wire log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireWrite {
    pub target: WireTarget,
    pub seq_sent: u64,
    pub seq_done: Option<u64>,
    pub fate: Option<Fate>,
}

impl WireWrite {
    /// The envelope's code when the answer is marked `retrySafe: true`.
    pub fn retry_safe_code(&self) -> Option<String> {
        let Some(Fate::Answered { status, body }) = &self.fate else { return None };
        if (200..300).contains(status) {
            return None;
        }
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        (v.get("retrySafe")? == &serde_json::Value::Bool(true))
            .then(|| v.get("code").and_then(serde_json::Value::as_str).unwrap_or("?").to_owned())
    }
}

/// The write an exchange carried, if it is one the checks judge (claim, post, submission,
/// acquire); anything else (creations, heartbeats, the proxy's forward to the rail) is
/// `None`.
pub fn parse_wire(e: &Exchange) -> Option<WireWrite> {
    let token = || e.header(HEADER_FENCING_TOKEN).and_then(|t| t.parse::<i64>().ok());
    let body = || serde_json::from_slice::<serde_json::Value>(&e.request).ok();
    let field_uuid = |name: &str| body()?.get(name)?.as_str().and_then(|s| Uuid::parse_str(s).ok());
    let key = e.header(HEADER_IDEMPOTENCY_KEY).unwrap_or_default().to_owned();
    let target = if let Some(rest) = e.path.strip_prefix("/v1/payouts/") {
        let (id, action) = rest.split_once('/')?;
        let op = match action {
            "claim" => FencedOp::Claim,
            "post" => FencedOp::Post,
            _ => return None,
        };
        WireTarget::Fenced { op, payout: Uuid::parse_str(id).ok()?, token: token()?, key }
    } else if e.path == dlock_rail_client::SUBMISSIONS_PATH {
        WireTarget::Fenced { op: FencedOp::Admit, payout: field_uuid("payoutId")?, token: token()?, key }
    } else if let Some(lock) = e.path.strip_prefix("/v1/locks/").and_then(|r| r.strip_suffix("/acquire")) {
        WireTarget::Acquire { session: field_uuid("sessionId")?, key: lock.to_owned() }
    } else {
        return None;
    };
    Some(WireWrite { target, seq_sent: e.seq_sent, seq_done: e.seq_done, fate: e.fate.clone() })
}

/// Every write an exchange carried: [`parse_wire`]'s one, or for a batch (C3-extensions
/// E-19) one [`WireTarget::Fenced`] per payout it names, whose fate is that payout's item
/// when the batch answered `200` (else the batch's own fate: a whole-request refusal, or no
/// answer, is every payout's), and for P2b and P3b the batch itself ([`WireTarget::Batch`]).
pub fn parse_wire_all(e: &Exchange) -> Vec<WireWrite> {
    let Some((op, account, items_field)) = batch_of(e) else {
        return parse_wire(e).into_iter().collect();
    };
    let Some(token) = e.header(HEADER_FENCING_TOKEN).and_then(|t| t.parse::<i64>().ok()) else {
        return Vec::new();
    };
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(&e.request) else { return Vec::new() };
    let account = account.or_else(|| body.get("accountId").and_then(|a| a.as_str()).map(str::to_owned));
    let answer = match &e.fate {
        Some(Fate::Answered { status: 200, body }) => {
            serde_json::from_slice::<dlock_contract::batch::BatchAnswer>(body).ok()
        }
        _ => None,
    };
    let header_key = e.header(HEADER_IDEMPOTENCY_KEY).unwrap_or_default().to_owned();
    let mut out = Vec::new();
    let items = body.get(items_field).and_then(|v| v.as_array()).cloned().unwrap_or_default();
    for item in &items {
        let Some(payout) = item.get("payoutId").and_then(|v| v.as_str()).and_then(|s| Uuid::parse_str(s).ok()) else {
            continue;
        };
        let key = match op {
            FencedOp::Admit => item.get("idempotencyKey").and_then(|k| k.as_str()).unwrap_or_default().to_owned(),
            _ => header_key.clone(),
        };
        let fate = match answer.as_ref().and_then(|a| a.item(payout)) {
            Some(i) => Some(Fate::Answered { status: i.status, body: serde_json::to_vec(&i.body).unwrap_or_default() }),
            None => e.fate.clone(),
        };
        out.push(WireWrite {
            target: WireTarget::Fenced { op, payout, token, key },
            seq_sent: e.seq_sent,
            seq_done: e.seq_done,
            fate,
        });
    }
    if let (FencedOp::Claim | FencedOp::Post, Some(account)) = (op, account) {
        out.push(WireWrite {
            target: WireTarget::Batch { op, account, token, key: header_key },
            seq_sent: e.seq_sent,
            seq_done: e.seq_done,
            fate: e.fate.clone(),
        });
    }
    out
}

/// A batch exchange's kind: its op, its account (from the path, for P2b and P3b), and the
/// body's array of payouts.
fn batch_of(e: &Exchange) -> Option<(FencedOp, Option<String>, &'static str)> {
    if e.path == dlock_rail_client::SUBMISSION_BATCHES_PATH {
        return Some((FencedOp::Admit, None, "submissions"));
    }
    let rest = e.path.strip_prefix("/v1/accounts/")?;
    let (account, action) = rest.split_once('/')?;
    let op = match action {
        "claims" => FencedOp::Claim,
        "posts" => FencedOp::Post,
        _ => return None,
    };
    Some((op, Some(account.to_owned()), "payouts"))
}

/// What the stores hold, as the retry-safe check needs it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Effects {
    /// (op, payout, token) of every claim or post paydb committed (its fence accepted it, or
    /// an idempotency record holds it) and of every submission with a forwardable intent
    /// row (`FencedOp::Admit`).
    pub writes: BTreeSet<(FencedOp, Uuid, i64)>,
    /// Every grant the lock store committed: ([`dlock_rt::wire_log::seq`] at its commit,
    /// session, key).
    pub grants: Vec<(u64, Uuid, String)>,
}

fn op_word(op: FencedOp) -> &'static str {
    match op {
        FencedOp::Claim => "claim",
        FencedOp::Post => "post",
        FencedOp::Admit => "submission",
    }
}

/// Every answer marked `retrySafe: true` left no trace (module doc).
pub fn retry_safe_failures(writes: &[WireWrite], effects: &Effects) -> Vec<Failure> {
    let mut found = Vec::new();
    // Claims, posts and submissions: per identity, every send answered retry-safe.
    let mut fenced: BTreeMap<(FencedOp, Uuid, i64), Vec<&WireWrite>> = BTreeMap::new();
    let mut acquires: BTreeMap<(Uuid, &str), Vec<&WireWrite>> = BTreeMap::new();
    for w in writes {
        match &w.target {
            WireTarget::Fenced { op, payout, token, .. } => fenced.entry((*op, *payout, *token)).or_default().push(w),
            WireTarget::Acquire { session, key } => acquires.entry((*session, key.as_str())).or_default().push(w),
            // Judged through the payouts it names.
            WireTarget::Batch { .. } => {}
        }
    }
    for ((op, payout, token), sends) in &fenced {
        let codes: Vec<String> = sends.iter().filter_map(|w| w.retry_safe_code()).collect();
        if codes.len() == sends.len() && effects.writes.contains(&(*op, *payout, *token)) {
            found.push(Failure::correctness(
                ids::RETRY_SAFE_LEFT_NO_TRACE,
                format!(
                    "{} of payout {payout} under token {token} was answered retry-safe ({}) yet paydb holds its effect",
                    op_word(*op),
                    codes.join(", ")
                ),
            ));
        }
    }
    // Acquires: a grant of (session, key) whose candidate requests (those in flight at its
    // commit, else the last one sent before it) were all answered retry-safe.
    for (seq, session, key) in &effects.grants {
        let Some(sends) = acquires.get(&(*session, key.as_str())) else { continue };
        let before: Vec<&&WireWrite> = sends.iter().filter(|w| w.seq_sent < *seq).collect();
        let in_flight: Vec<&&WireWrite> =
            before.iter().copied().filter(|w| w.seq_done.is_none_or(|d| d > *seq)).collect();
        let candidates: Vec<&&WireWrite> = if in_flight.is_empty() {
            before.iter().copied().max_by_key(|w| w.seq_sent).into_iter().collect()
        } else {
            in_flight
        };
        let codes: Vec<String> = candidates.iter().filter_map(|w| w.retry_safe_code()).collect();
        if !candidates.is_empty() && codes.len() == candidates.len() {
            found.push(Failure::correctness(
                ids::RETRY_SAFE_LEFT_NO_TRACE,
                format!(
                    "acquire of {key} in session {session} was answered retry-safe ({}) yet the lock store granted it",
                    codes.join(", ")
                ),
            ));
        }
    }
    found
}

/// The recorded answer of each idempotency identity: (op, payout, token, key) → (status,
/// bytes), claims and posts only.
pub type Records = BTreeMap<(FencedOp, Uuid, i64, String), (u16, Vec<u8>)>;

/// The recorded answer of each batch's idempotency identity (C3-extensions E-19): (op,
/// account, token, key) → (status, bytes).
pub type BatchRecords = BTreeMap<(FencedOp, String, i64, String), (u16, Vec<u8>)>;

/// Every answer below 500 to a batch (P2b, P3b) whose identity paydb recorded is the
/// recorded status and bytes, exactly: a batch is one request with one identity.
pub fn wire_batch_replay_failures(writes: &[WireWrite], records: &BatchRecords) -> Vec<Failure> {
    let mut found = Vec::new();
    for w in writes {
        let WireTarget::Batch { op, account, token, key } = &w.target else { continue };
        let Some(Fate::Answered { status, body }) = &w.fate else { continue };
        if *status >= 500 {
            continue;
        }
        let Some((r_status, r_body)) = records.get(&(*op, account.clone(), *token, key.clone())) else { continue };
        if r_status != status || r_body != body {
            found.push(Failure::correctness(
                ids::WIRE_REPLAY_BYTE_IDENTICAL,
                format!(
                    "the {} batch of account {account} under token {token} was answered {status} ({} bytes) on the \
                     wire where {r_status} ({} bytes) is recorded",
                    op_word(*op),
                    body.len(),
                    r_body.len()
                ),
            ));
        }
    }
    found
}

/// Every answer below 500 to a claim or post whose identity paydb recorded is the recorded
/// status and bytes, exactly.
pub fn wire_replay_failures(writes: &[WireWrite], records: &Records) -> Vec<Failure> {
    let mut found = Vec::new();
    for w in writes {
        let WireTarget::Fenced { op: op @ (FencedOp::Claim | FencedOp::Post), payout, token, key } = &w.target else {
            continue;
        };
        let Some(Fate::Answered { status, body }) = &w.fate else { continue };
        if *status >= 500 {
            continue;
        }
        let Some((r_status, r_body)) = records.get(&(*op, *payout, *token, key.clone())) else { continue };
        if r_status != status || r_body != body {
            found.push(Failure::correctness(
                ids::WIRE_REPLAY_BYTE_IDENTICAL,
                format!(
                    "{} of payout {payout} under token {token} was answered {status} ({} bytes) on the wire where \
                     {r_status} ({} bytes) is recorded",
                    op_word(*op),
                    body.len(),
                    r_body.len()
                ),
            ));
        }
    }
    found
}
