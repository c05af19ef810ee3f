//! The oracle: what the simulation judges a seed by, from ground truth only.
//!
//! Ground truth is the stores' own records and the rail's own call log, never an answer a
//! service gave: paydb's tables ([`MemPaydb`]: payouts, submission rows, accounts, ledger,
//! fences, marks, idempotency records), the simulation lockdb's committed changes
//! ([`MemLockStore`]) and the rail-stub's `GET /calls`. The answers callers received
//! ([`dlock_rt::wire_log`]) are never evidence of what happened; the [`wire`] checks judge
//! them against that ground truth.
//!
//! Three parts:
//! - **Online** ([`Monitor`], the part that must run while the world runs): an observer on
//!   paydb sees every fenced write *inside its transaction* (under paydb's one mutex, in
//!   commit order), and an observer on the lock store sees every committed grant, renew,
//!   release, revoke, drop and session end. Each is judged by a [`Checker`] at the moment it
//!   commits; a failure records the simulated time it fired. Fences and marks are sampled at
//!   every fenced write (every account, so any write that lowered one is seen at the next).
//! - **End of run** ([`check`]): the rail's log against paydb's rows, the ledger, the
//!   online failures, and what callers received on the wire ([`dlock_rt::wire_log`], the
//!   [`wire`] checks): every answer marked `retrySafe: true` left no trace, and every
//!   answer to a recorded claim or post is its record's bytes.
//! - **Liveness** ([`liveness`], after every fault healed): every payout settled, no intent
//!   unresolved, and the reconciler's report equal to what the oracle computed itself.
//!
//! Each failure names a stable invariant id ([`ids`]); `docs/simulation.md` ("Oracle") maps
//! each to the FR/DL ids it proves. The checkers are plain functions over plain data, so
//! each is proven able to fail by a unit test feeding it a hand-made violation.
//!
//! Invariants of this module:
//! - The oracle never calls a service; it reads stores and the rail's record only.
//! - An observer callback never takes a store's lock (it is called under it) and never
//!   blocks: it only updates the checker behind its own mutex.

use std::collections::{BTreeMap, BTreeSet};

use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_lock_server::store_mem::{LockEvent, Refusal};
use dlock_payment_resource::store::{is_system_account, is_unsettled, AccountKind, Direction, LedgerEntry};
use dlock_payment_resource::store_mem::{FenceVerdictSeen, FencedOp, FencedWrite, Identity};
use dlock_rail_proxy::store::{is_forwardable, SubmissionRow};
use dlock_reconciler::report::AmbiguousClass;
use dlock_rt::probe::{self, Probe};
use uuid::Uuid;

use crate::outcome::Failure;

pub mod belief;
pub mod calls;
pub mod traced;
pub mod wire;
pub use wire::{
    parse_wire, parse_wire_all, retry_safe_failures, wire_batch_replay_failures, wire_replay_failures, BatchRecords,
    Effects, Records, WireTarget, WireWrite,
};

/// The invariant ids (stable: campaign summaries and `--json` print them).
pub mod ids {
    /// The rail saw each payout at most once (its own log).
    pub const AT_MOST_ONE_RAIL_CALL: &str = "at_most_one_rail_call_per_payout";
    /// Every rail call has a forwardable intent row behind it.
    pub const RAIL_CALL_HAS_INTENT: &str = "rail_call_has_an_intent";
    /// Every CUSTOMER balance equals Σ CREDIT − Σ DEBIT of its entries.
    pub const BALANCE_IS_LEDGER_SUM: &str = "balance_equals_ledger_sum";
    /// Σ DEBIT = Σ CREDIT over the ledger, per currency.
    pub const DEBITS_EQUAL_CREDITS: &str = "debits_equal_credits";
    /// balance − Σ unsettled payouts ≥ 0 for every CUSTOMER account.
    pub const NO_NEGATIVE_AVAILABLE: &str = "no_negative_available_balance";
    /// Each fenced write a resource accepts carries a token strictly above the one it
    /// accepted before for that account (online, in acceptance order).
    pub const FENCE_ACCEPTS_RISING_TOKENS: &str = "fence_accepts_only_rising_tokens";
    /// A write refused `FENCED_OUT` was refused for a newer holder: the fence or mark holds a
    /// greater token, or the same token after this very write (the same op, payout and
    /// token) passed it before, a replay. A fence below the token, or an executor fenced by
    /// its own token at another write, is a defect (issue 41 item 5).
    pub const FENCED_OUT_HAS_NEWER_HOLDER: &str = "fenced_out_means_a_newer_holder";
    /// Every write a fence or mark accepted is of a payout of the account whose fence judged
    /// it: a batch (C3-extensions E-19) that passed one account's fence wrote only that
    /// account's payouts (online, issue 41 item 1).
    pub const FENCED_WRITE_WITHIN_ITS_ACCOUNT: &str = "fenced_write_within_its_account";
    /// Every ledger entry of a payout on a CUSTOMER account is on that payout's own account
    /// (end of run, issue 41 item 1).
    pub const LEDGER_ENTRY_ON_ITS_PAYOUTS_ACCOUNT: &str = "ledger_entry_on_its_payouts_account";
    /// `accounts.fence` never decreases.
    pub const FENCE_NEVER_DECREASES: &str = "fence_never_decreases";
    /// `rail_high_water` never decreases.
    pub const MARK_NEVER_DECREASES: &str = "high_water_mark_never_decreases";
    /// At the end of a run, each account's `rail_high_water` equals the highest token any
    /// of its submissions presented past the mark (every row not FENCED): the mark never
    /// lags (a stale writer could get in) and never runs ahead of a presented token. Judged
    /// where a scenario asks for it ([`super::mark_failures`]), not on swarm seeds.
    pub const MARK_EQUALS_HIGHEST_ADMITTED: &str = "mark_equals_highest_admitted";
    /// At no instant of the lock store's truth do two grants of one key live.
    pub const NO_TWO_LIVE_GRANTS: &str = "no_two_live_grants_per_key";
    /// At no instant do two holders (of two sessions) believe they hold one key, while
    /// clock rates stay within the lock client's margin ([`super::belief`]).
    pub const NO_TWO_BELIEVING_HOLDERS: &str = super::belief::NO_TWO_BELIEVING_HOLDERS;
    /// A grant that died is never renewed or rotated (issue 41 item 2). Judged exactly on
    /// the simulation lockdb (its lease or session ended by lockdb's clock at the decision),
    /// and on every backend from acknowledged calls (released, revoked, its session closed,
    /// or replaced by a greater token, before the renew or rotate began: [`super::calls`]).
    pub const DEAD_GRANT_NEVER_REVIVED: &str = "dead_grant_never_revived";
    /// Every grant, refusal and renewal the simulation lockdb decides is justified by its
    /// own records at its own clock, in both directions (issue 41 item 4): a grant only to a
    /// live session over no live grant, `SESSION_EXPIRED`/`SESSION_UNKNOWN` only for a
    /// session that is not live, `LOCK_CONTENDED` (held) only while a grant of the key lives,
    /// `LOCK_LOST` only when the named grant does not live.
    pub const LOCK_DECISION_JUSTIFIED: &str = "lock_decision_justified";
    /// Tokens strictly increase in grant order.
    pub const TOKENS_INCREASE: &str = "lock_tokens_increase_in_grant_order";
    /// A revoke raises the token floor above the revoked token (L8): every later grant is
    /// then issued above it, whatever the store's token source.
    pub const REVOKE_RAISES_FLOOR: &str = "revoke_raises_the_token_floor";
    /// A RAIL_AMBIGUOUS payout is never submitted again (counted at the proxy's admission,
    /// refused attempts included).
    pub const AMBIGUOUS_NEVER_RESUBMITTED: &str = "ambiguous_payout_never_resubmitted";
    /// A replay answers exactly the bytes first recorded for its identity.
    pub const REPLAY_BYTE_IDENTICAL: &str = "idempotent_replay_byte_identical";
    /// On the wire: every answer below 500 to a claim or post whose identity paydb recorded
    /// is the recorded status and bytes (first execution and replays alike).
    pub const WIRE_REPLAY_BYTE_IDENTICAL: &str = "idempotent_replay_byte_identical_on_the_wire";
    /// A claim, post, submission or acquire answered `retrySafe: true` left no effect in the
    /// stores.
    pub const RETRY_SAFE_LEFT_NO_TRACE: &str = "retry_safe_answer_left_no_trace";
    /// paydb's tables could be read for the end-of-run checks (a crash when not).
    pub const PAYDB_READABLE: &str = "paydb_readable";
    /// The wire log kept every exchange of the seed (`dlock_rt::wire_log::EXCHANGES_MAX`).
    pub const WIRE_LOG_COMPLETE: &str = "wire_log_within_its_bound";
    /// Liveness: every payout reached POSTED, FAILED, ABANDONED or RAIL_AMBIGUOUS.
    pub const EVERY_PAYOUT_SETTLES: &str = "every_payout_settles";
    /// Liveness: no intent row is left without an outcome.
    pub const NO_UNRESOLVED_INTENT: &str = "no_unresolved_intent";
    /// Liveness: the reconciler's report equals what the oracle computed.
    pub const RECONCILER_AGREES: &str = "reconciler_agrees_with_oracle";
    /// The reconciler's findings equal the rail's own record payout by payout: every
    /// RAIL_AMBIGUOUS payout classified PAID (with the paying call's reference), NOT_PAID or
    /// UNKNOWN exactly as the record says, every double payment and repeated call found, and
    /// none the record does not support ([`super::reconciler_truth_failures`]).
    pub const RECONCILER_MATCHES_RAIL: &str = "reconciler_findings_match_the_rails_record";

    // What the campaign harness itself judges a seed by (same id set, same summaries).
    /// The scenario file of a scenario seed loads (a crash when not).
    pub const SCENARIO_LOADS: &str = "scenario_loads";
    /// Nothing panicked: a service, the world, the runtime's time limit (a crash).
    pub const NO_PANIC: &str = "no_panic";
    /// The seed's world builds from its spec (a crash when not).
    pub const WORLD_BUILDS: &str = "world_builds";
    /// Liveness: the workload created every payout it drew.
    pub const WORKLOAD_FINISHES: &str = "workload_finishes";
    /// Every step of a scenario applied, and every trigger it waited for came (a crash when
    /// not).
    pub const SCENARIO_STEP_APPLIES: &str = "scenario_step_applies";
    /// A proxy scenario's `submit` got the answer its `expect` names.
    pub const SCENARIO_EXPECTATION: &str = "scenario_expectation";
    /// A proxy scenario's run could not be judged (setup, its client task, paydb unread).
    pub const SCENARIO_CHECK: &str = "scenario_check";
    /// The forger's forged writes were all refused (`crate::forger`).
    pub const FORGED_WRITE_REFUSED: &str = "forged_write_refused";
    /// The forger's owner attacks were all refused (`crate::forger`).
    pub const OWNER_ATTACK_REFUSED: &str = "owner_attack_refused";
    /// No service met a state its rules say cannot be (answered `500 INTERNAL`, and no unknown
    /// outcome): judged by the real run over its traced `contradiction` events
    /// (`traced::contradiction_failures`).
    pub const NO_CONTRADICTION: &str = "no_contradiction_met";
}

/// Which stored fence a fenced write is compared against: the payment-resource's
/// `accounts.fence` (claim and post share it) or the proxy's `rail_high_water`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fence {
    Account,
    Rail,
}

impl Fence {
    fn of(op: FencedOp) -> Fence {
        match op {
            FencedOp::Claim | FencedOp::Post => Fence::Account,
            FencedOp::Admit => Fence::Rail,
        }
    }
}

fn op_name(op: FencedOp) -> &'static str {
    match op {
        FencedOp::Claim => "claim (account)",
        FencedOp::Post => "post (ledger)",
        FencedOp::Admit => "admission (rail)",
    }
}

/// A failure with the simulated time (ms since the monitor started) it fired at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimedFailure {
    pub at_ms: u64,
    pub failure: Failure,
}

/// What a fenced write saw of paydb, inside its transaction: the facts the checker needs
/// beyond the write itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PaydbFacts {
    /// Every account's stored fence.
    pub fences: BTreeMap<String, i64>,
    /// Every account's high-water mark.
    pub marks: BTreeMap<String, i64>,
    /// The written payout's forwardable submission rows' tokens, oldest first (for an
    /// admission).
    pub forwardable_tokens: Vec<i64>,
    /// Every intent row still without an outcome (a forward in flight): account, token,
    /// owner.
    pub unresolved: Vec<(String, i64, String)>,
    /// The written payout's own account, as paydb's row holds it (`None`: no such payout).
    pub payout_account: Option<String>,
}

impl PaydbFacts {
    /// Reads the facts from paydb's tables (called under paydb's mutex).
    pub fn read(t: &dlock_payment_resource::store_mem::PaydbTables, payout_id: Uuid) -> PaydbFacts {
        PaydbFacts {
            fences: t.accounts.iter().map(|(id, a)| (id.clone(), a.fence)).collect(),
            marks: t.rail.high_water.clone(),
            forwardable_tokens: t
                .rail
                .submissions
                .iter()
                .filter(|s| s.payout_id == payout_id && is_forwardable(s.outcome))
                .map(|s| s.presented_token)
                .collect(),
            unresolved: t
                .rail
                .submissions
                .iter()
                .filter(|s| s.outcome.is_none())
                .map(|s| (s.account_id.clone(), s.presented_token, s.owner_id.clone()))
                .collect(),
            payout_account: t.rail.payouts.get(&payout_id).map(|p| p.row.account_id.clone()),
        }
    }
}

/// Bound on the checker's log of what it saw ([`Checker::seen`]); past it, entries are
/// counted, not kept.
pub const SEEN_LOG_MAX: usize = 20_000;

/// One thing the online checker saw, in commit order: what a scenario test asserts on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Seen {
    /// A fenced write and its verdict, with the account's forwards in flight at that
    /// instant (intent rows without an outcome: token and owner).
    Fenced {
        at_ms: u64,
        op: FencedOp,
        payout_id: Uuid,
        account_id: String,
        token: i64,
        owner_id: String,
        accepted: bool,
        admission: Option<&'static str>,
        in_flight: Vec<(i64, String)>,
    },
    /// A grant the lock store committed.
    Granted { at_ms: u64, key: String, token: i64, session_id: Uuid, owner_id: String },
}

impl std::fmt::Display for Seen {
    /// One trace line: `seen @1200ms admit acct-0 payout=... token=7 by executor-1/0 fenced_out in_flight=[8 by executor-2/0]`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Seen::Fenced { at_ms, op, payout_id, account_id, token, owner_id, accepted, admission, in_flight } => {
                let verdict = admission.unwrap_or(if *accepted { "accepted" } else { "fenced_out" });
                let flight: Vec<String> = in_flight.iter().map(|(t, o)| format!("{t} by {o}")).collect();
                let op = match op {
                    FencedOp::Claim => "claim",
                    FencedOp::Post => "post",
                    FencedOp::Admit => "admit",
                };
                write!(
                    f,
                    "seen @{at_ms}ms {op} {account_id} payout={payout_id} token={token} by {owner_id} {verdict} in_flight=[{}]",
                    flight.join(", ")
                )
            }
            Seen::Granted { at_ms, key, token, session_id, owner_id } => {
                write!(f, "seen @{at_ms}ms grant {key} token={token} to {owner_id} session={session_id}")
            }
        }
    }
}

#[derive(Debug, Clone)]
struct ModelGrant {
    token: i64,
    session_id: Uuid,
    /// When the monitor saw it committed (monitor ms, true time); for a grant rotated from
    /// another of its session, when the first of that chain was.
    seen_at_ms: u64,
    lease_end_ms: i64,
}

/// The online checker: fed every fenced write and every lock event in commit order, it
/// judges each at once. Plain data in, failures out: [`Monitor`] wires it to a world, the
/// unit tests feed it by hand.
#[derive(Debug, Default)]
pub struct Checker {
    /// The last token each fence accepted, per (account, fence), with what accepted it and
    /// the batch pass it was accepted in (C3-extensions E-19), if any.
    accepted: BTreeMap<(String, Fence), (i64, FencedOp, Option<u64>)>,
    fences: BTreeMap<String, i64>,
    marks: BTreeMap<String, i64>,
    /// The bytes first recorded per idempotency identity.
    recorded: BTreeMap<Identity, (u16, Vec<u8>)>,
    /// The lock store as the model sees it: each key's grant, each session's end.
    grants: BTreeMap<String, ModelGrant>,
    sessions: BTreeMap<Uuid, i64>,
    /// The grant the last event released: (key, session, store now, when it was first seen,
    /// whether it lived at that now).
    released: Option<(String, Uuid, i64, u64, bool)>,
    last_token: i64,
    revoked_tokens: BTreeSet<i64>,
    /// Owner-id prefixes of writers on nodes whose clock drifted beyond the margin.
    drifted_owners: BTreeSet<String>,
    /// Fences a campaign switched off on purpose: acceptances there are not judged.
    layers_off: BTreeSet<Fence>,
    /// (op, payout, token) of every fenced write a fence accepted (the retry-safe check's
    /// effects).
    accepted_writes: BTreeSet<(FencedOp, Uuid, i64)>,
    /// Per payout, the claim tokens accepted before its first forwardable admission (the
    /// attempt that may turn out ambiguous): holders that could not know of it.
    claimed_before_intent: BTreeMap<Uuid, BTreeSet<i64>>,
    /// Every committed grant: (wire-log sequence at its commit, session, key).
    grant_seqs: Vec<(u64, Uuid, String)>,
    failures: Vec<TimedFailure>,
    /// The holders' beliefs ([`belief`]): no two believing holders of one key.
    beliefs: belief::Beliefs,
    /// The lock store judged from its callers' acknowledged calls, in true time ([`calls`]).
    calls: calls::Calls,
    /// What was seen, in commit order (at most [`SEEN_LOG_MAX`]).
    seen: Vec<Seen>,
    /// Counts of what was observed (for the trace and the tests).
    pub acceptances: u64,
    pub fenced_outs: u64,
    pub grants_seen: u64,
}

impl Checker {
    pub fn new() -> Checker {
        Checker::default()
    }

    fn fail(&mut self, at_ms: u64, f: Failure) {
        self.failures.push(TimedFailure { at_ms, failure: f });
    }

    /// Judges holders' beliefs with the lock client's safety margin `margin`, against the
    /// reference clock and `judges` (etcd's lock replicas) ([`belief`]).
    pub fn judge_beliefs(&mut self, margin: f64, judges: Vec<belief::Node>) {
        self.beliefs = belief::Beliefs::new(margin, judges);
    }

    /// A holder's belief (`lease_belief`, `session_belief`) emitted on `node` at `at_ms`;
    /// `reading` reads a node's monotonic clock now.
    pub fn on_belief(
        &mut self,
        node: belief::Node,
        kind: &str,
        fields: &dlock_rt::events::Fields,
        at_ms: u64,
        reading: impl Fn(belief::Node) -> u64,
    ) {
        if let Some(f) = self.beliefs.on_event(node, kind, fields, at_ms, reading) {
            self.fail(at_ms, f);
        }
    }

    /// `node`'s clock rate was set to `rate` at `at_ms` (an overlap of beliefs it explains
    /// is excused).
    pub fn note_rate(&mut self, node: belief::Node, at_ms: u64, rate: f64) {
        self.beliefs.note_rate(node, at_ms, rate);
    }

    /// `node` crashed: its holders believe nothing any more.
    pub fn node_crashed(&mut self, node: belief::Node) {
        self.beliefs.node_crashed(node);
    }

    /// Judges lockdb's calls for a store that may end a lease up to `slack_ms` early in
    /// true time ([`calls::Calls::new`]).
    pub fn judge_calls(&mut self, slack_ms: u64) {
        self.calls = calls::Calls::new(slack_ms);
    }

    /// A lock-store call `id` began at `at_ms` ([`calls`]).
    pub fn on_call_begin(&mut self, id: u64, asked: calls::Asked, at_ms: u64) {
        self.calls.begin(id, asked, at_ms);
    }

    /// Lock-store call `id` ended at `at_ms` ([`calls`]): judged against the grants and
    /// sessions acknowledged before, clock rates of the judges excusing.
    pub fn on_call_end(&mut self, id: u64, answered: calls::Answered, at_ms: u64) {
        let beliefs = &self.beliefs;
        let found = self.calls.end(id, answered, at_ms, |from, to| beliefs.fastest_judge(from, to));
        for f in found {
            self.fail(at_ms, f);
        }
    }

    /// Grants judged against a predecessor by the call checker so far, and whether a full
    /// table switched it off ([`calls::Calls::partial`]).
    pub fn calls_judged(&self) -> (u64, bool) {
        (self.calls.pairs_judged, self.calls.partial())
    }

    /// What the lock store's calls and the holders' beliefs showed of the clocks so far.
    pub fn clock_tally(&self) -> calls::ClockTally {
        calls::ClockTally { beliefs_excused_by_rate: self.beliefs.excused(), ..self.calls.tally() }
    }

    /// Overlapping beliefs excused by clock rates so far.
    pub fn beliefs_excused(&self) -> u64 {
        self.beliefs.excused()
    }

    /// (op, payout, token) of every fenced write accepted so far.
    pub fn accepted_writes(&self) -> &BTreeSet<(FencedOp, Uuid, i64)> {
        &self.accepted_writes
    }

    /// A grant of `key` to `session` committed at wire-log sequence `seq`.
    pub fn note_grant_seq(&mut self, seq: u64, session: Uuid, key: &str) {
        self.grant_seqs.push((seq, session, key.to_owned()));
    }

    /// Every grant noted with [`Checker::note_grant_seq`], in commit order.
    pub fn grant_seqs(&self) -> &[(u64, Uuid, String)] {
        &self.grant_seqs
    }

    /// Every failure so far, in the order they fired.
    pub fn failures(&self) -> &[TimedFailure] {
        &self.failures
    }

    /// Every fenced write and grant seen so far, in commit order (the first
    /// [`SEEN_LOG_MAX`]).
    pub fn seen(&self) -> &[Seen] {
        &self.seen
    }

    fn note(&mut self, s: Seen) {
        if self.seen.len() < SEEN_LOG_MAX {
            self.seen.push(s);
        }
    }

    /// A writer whose owner id starts with `owner_prefix` runs on a node whose clock drifted
    /// beyond the lock client's safety margin: its fenced-out writes fire
    /// [`Probe::DriftCaughtByFence`].
    pub fn note_drifted_owner(&mut self, owner_prefix: &str) {
        self.drifted_owners.insert(owner_prefix.to_owned());
    }

    /// A campaign switched `fence` off on purpose (a defence-in-depth run): acceptances of
    /// lower tokens that bypassed it (`FencedWrite::fenced == false`) are expected and not
    /// reported; an acceptance the fence did compare (the post when only the claim's fence
    /// is off, say) is still judged, and every other invariant still holds.
    /// By default every acceptance is judged, a switched-off fence included: a stale token
    /// it took is exactly the defect the fence exists to stop.
    pub fn expect_layer_off(&mut self, fence: Fence) {
        self.layers_off.insert(fence);
    }

    /// One fenced write, as paydb decided it, with what its transaction left (`facts`).
    pub fn on_fenced_write(&mut self, w: &FencedWrite, facts: &PaydbFacts, at_ms: u64) {
        let fence = Fence::of(w.op);
        if matches!(w.verdict, FenceVerdictSeen::Accepted | FenceVerdictSeen::FencedOut { .. }) {
            self.note(Seen::Fenced {
                at_ms,
                op: w.op,
                payout_id: w.payout_id,
                account_id: w.account_id.clone(),
                token: w.token,
                owner_id: w.owner_id.clone(),
                accepted: matches!(w.verdict, FenceVerdictSeen::Accepted),
                admission: w.admission,
                in_flight: facts
                    .unresolved
                    .iter()
                    .filter(|(a, _, _)| *a == w.account_id)
                    .map(|(_, t, o)| (*t, o.clone()))
                    .collect(),
            });
        }
        match &w.verdict {
            FenceVerdictSeen::Accepted => {
                self.acceptances += 1;
                self.accepted_writes.insert((w.op, w.payout_id, w.token));
                if w.op == FencedOp::Admit && w.admission == Some("admitted") {
                    let claims = &self.accepted_writes;
                    self.claimed_before_intent.entry(w.payout_id).or_insert_with(|| {
                        claims
                            .iter()
                            .filter(|(op, p, _)| *op == FencedOp::Claim && *p == w.payout_id)
                            .map(|(_, _, t)| *t)
                            .collect()
                    });
                }
                if facts.payout_account.as_deref().is_some_and(|a| a != w.fence_account) {
                    let detail = format!(
                        "payout {} of account {:?} written at its {} under account {}'s fence (token {} by {})",
                        w.payout_id,
                        facts.payout_account,
                        op_name(w.op),
                        w.fence_account,
                        w.token,
                        w.owner_id
                    );
                    self.fail(at_ms, Failure::correctness(ids::FENCED_WRITE_WITHIN_ITS_ACCOUNT, detail));
                }
                let slot = (w.fence_account.clone(), fence);
                if let Some((before, by, pass)) = self.accepted.get(&slot).copied() {
                    // A batch passes its fence once for all its payouts (C3-extensions E-19):
                    // the payouts after its first carry the same token in the same pass.
                    let same_pass = w.token == before && w.batch_pass.is_some() && w.batch_pass == pass;
                    if w.token <= before && !same_pass && (w.fenced || !self.layers_off.contains(&fence)) {
                        let detail = format!(
                            "account {} accepted token {} at its {}{} after token {} at its {}",
                            w.fence_account,
                            w.token,
                            op_name(w.op),
                            if w.fenced { "" } else { " (its fence switched off)" },
                            before,
                            op_name(by)
                        );
                        self.fail(at_ms, Failure::correctness(ids::FENCE_ACCEPTS_RISING_TOKENS, detail));
                    }
                }
                if self.accepted.get(&slot).is_none_or(|(before, _, _)| w.token > *before) {
                    self.accepted.insert(slot, (w.token, w.op, w.batch_pass));
                }
            }
            FenceVerdictSeen::FencedOut { highest_token } => {
                self.fenced_outs += 1;
                let replay = self.accepted_writes.contains(&(w.op, w.payout_id, w.token));
                if *highest_token == w.token && replay {
                    probe::hit(Probe::EqualTokenReplayRefused);
                }
                if *highest_token < w.token || (*highest_token == w.token && !replay) {
                    let why = if *highest_token < w.token {
                        "below it: no newer holder".to_owned()
                    } else {
                        format!(
                            "equal to it, and this {} never passed under it: fenced by its own token",
                            op_name(w.op)
                        )
                    };
                    let detail = format!(
                        "account {}: token {} by {} refused FENCED_OUT at its {} (payout {}), the fence at {} {why}",
                        w.fence_account,
                        w.token,
                        w.owner_id,
                        op_name(w.op),
                        w.payout_id,
                        highest_token
                    );
                    self.fail(at_ms, Failure::correctness(ids::FENCED_OUT_HAS_NEWER_HOLDER, detail));
                }
                if self.revoked_tokens.contains(&w.token) {
                    probe::hit(Probe::RevokeFencedHolder);
                }
                if self.drifted_owners.iter().any(|p| w.owner_id.starts_with(p.as_str())) {
                    probe::hit(Probe::DriftCaughtByFence);
                }
            }
            _ => {}
        }
        if w.op == FencedOp::Admit && w.state_before == Some(PayoutState::RailAmbiguous) {
            // The attempt whose outcome is unknown: its token is the first forwardable row's.
            // A writer at that token or above (the same holder, or a newer one) submitted a
            // quarantined payout: an executor defect even when the proxy refused it. A lower
            // token is a stale writer from before the ambiguity, which the fences stop.
            let ambiguous_token = facts.forwardable_tokens.first().copied();
            // A newer holder whose claim was accepted before the ambiguous attempt was even
            // admitted (a stale writer reached the rail first, between that claim and its
            // own submission) could not know: its submission is a race the duplicate guard
            // settles, not a resubmission. The same token, or a claim after, is.
            let raced = ambiguous_token.is_some_and(|t| {
                w.token > t && self.claimed_before_intent.get(&w.payout_id).is_some_and(|c| c.contains(&w.token))
            });
            if !raced && ambiguous_token.is_none_or(|t| w.token >= t) {
                let detail = format!(
                    "payout {} was submitted again while RAIL_AMBIGUOUS: token {} by {:?} (ambiguous attempt's token {:?}), \
                     the proxy answered {}",
                    w.payout_id,
                    w.token,
                    w.owner_id,
                    ambiguous_token,
                    w.admission.unwrap_or("?")
                );
                self.fail(at_ms, Failure::correctness(ids::AMBIGUOUS_NEVER_RESUBMITTED, detail));
            }
        }
        if let (Some(identity), Some(r)) = (&w.identity, &w.recorded) {
            self.recorded.insert(identity.clone(), (r.status, r.body.clone()));
        }
        if let (Some(identity), Some(r)) = (&w.identity, &w.replayed) {
            match self.recorded.get(identity) {
                Some((status, body)) if *status != r.status || *body != r.body => {
                    let detail = format!(
                        "payout {} {:?} replayed {} ({} bytes) where {} ({} bytes) was recorded",
                        w.payout_id,
                        identity.0,
                        r.status,
                        r.body.len(),
                        status,
                        body.len()
                    );
                    self.fail(at_ms, Failure::correctness(ids::REPLAY_BYTE_IDENTICAL, detail));
                }
                Some(_) => {}
                None => {
                    self.recorded.insert(identity.clone(), (r.status, r.body.clone()));
                }
            }
        }
        self.sample(&facts.fences, &facts.marks, at_ms);
    }

    /// Every account's fence and mark, as they stand now: neither may be below what was
    /// seen before.
    pub fn sample(&mut self, fences: &BTreeMap<String, i64>, marks: &BTreeMap<String, i64>, at_ms: u64) {
        let mut found = Vec::new();
        for (seen, now, id) in
            [(&self.fences, fences, ids::FENCE_NEVER_DECREASES), (&self.marks, marks, ids::MARK_NEVER_DECREASES)]
        {
            for (account, before) in seen {
                let after = now.get(account).copied();
                if after.is_none_or(|a| a < *before) {
                    found.push(Failure::correctness(id, format!("account {account}: {before} -> {after:?}")));
                }
            }
        }
        for f in found {
            self.fail(at_ms, f);
        }
        for (a, v) in fences {
            let e = self.fences.entry(a.clone()).or_insert(*v);
            *e = (*e).max(*v);
        }
        for (a, v) in marks {
            let e = self.marks.entry(a.clone()).or_insert(*v);
            *e = (*e).max(*v);
        }
    }

    fn live(&self, g: &ModelGrant, now_ms: i64) -> bool {
        now_ms < g.lease_end_ms && self.sessions.get(&g.session_id).is_some_and(|end| now_ms < *end)
    }

    /// A refusal of the simulation lockdb, held to the model of its records at its clock
    /// ([`ids::LOCK_DECISION_JUSTIFIED`]). A lock-delay's refusal is not judged: the model
    /// does not keep the keys' delays.
    fn refused(&mut self, refusal: &Refusal, now_ms: i64, at_ms: u64) {
        let unjustified = match refusal {
            Refusal::Session { session_id, refusal } => self
                .sessions
                .get(session_id)
                .filter(|end| now_ms < **end)
                .map(|end| format!("session {session_id}: refused {refusal:?} at {now_ms}, live until {end}")),
            Refusal::Held { key, session_id } => match self.grants.get(key) {
                Some(g) if self.live(g, now_ms) => None,
                Some(g) => Some(format!(
                    "key {key}: an acquire by session {session_id} refused as held at {now_ms}, its grant (token {}) \
                     dead by then (lease to {}, session to {:?})",
                    g.token,
                    g.lease_end_ms,
                    self.sessions.get(&g.session_id)
                )),
                None => Some(format!(
                    "key {key}: an acquire by session {session_id} refused as held at {now_ms}, with no grant of it"
                )),
            },
            Refusal::Lost { key, token, session_id } => self
                .grants
                .get(key)
                .filter(|g| g.token == *token && g.session_id == *session_id && self.live(g, now_ms))
                .map(|g| {
                    format!(
                        "key {key}: token {token} of session {session_id} refused as lost at {now_ms}, live until \
                         {} (session to {:?})",
                        g.lease_end_ms,
                        self.sessions.get(session_id)
                    )
                }),
            Refusal::Delayed { .. } => None,
        };
        if let Some(detail) = unjustified {
            self.fail(at_ms, Failure::correctness(ids::LOCK_DECISION_JUSTIFIED, detail));
        }
    }

    /// One committed lock-store change.
    pub fn on_lock_event(&mut self, e: &LockEvent, at_ms: u64) {
        match e {
            LockEvent::SessionEnds { session_id, expires_at_ms } => {
                self.sessions.insert(*session_id, *expires_at_ms);
            }
            LockEvent::SessionClosed { session_id, .. } => {
                // Closed is dead for good: nothing may act in its name again.
                self.sessions.insert(*session_id, i64::MIN);
                self.grants.retain(|_, g| g.session_id != *session_id);
            }
            LockEvent::Granted { grant, now_ms } => {
                self.grants_seen += 1;
                // A rotate (C3-extensions E-18) is a release and a grant of one key to one
                // session in one step: the holder's hold goes on, since its first grant.
                let chained = self
                    .released
                    .take()
                    .filter(|(k, s, at, ..)| *k == grant.key && *s == grant.session_id && at == now_ms);
                let chained_from = chained.as_ref().map(|(_, _, _, seen, _)| *seen);
                match chained {
                    Some((.., false)) => {
                        let detail = format!(
                            "key {}: rotated at {now_ms} into token {} from a grant of session {} that was dead \
                             by then",
                            grant.key, grant.fencing_token, grant.session_id
                        );
                        self.fail(at_ms, Failure::correctness(ids::DEAD_GRANT_NEVER_REVIVED, detail));
                    }
                    Some(_) => {}
                    None => {
                        if let Some(end) = self.sessions.get(&grant.session_id).filter(|end| **end <= *now_ms) {
                            let detail = format!(
                                "key {}: token {} granted at {now_ms} to session {}, which ended at {}",
                                grant.key,
                                grant.fencing_token,
                                grant.session_id,
                                if *end == i64::MIN { "its close".to_owned() } else { end.to_string() }
                            );
                            self.fail(at_ms, Failure::correctness(ids::LOCK_DECISION_JUSTIFIED, detail));
                        }
                    }
                }
                self.note(Seen::Granted {
                    at_ms,
                    key: grant.key.clone(),
                    token: grant.fencing_token,
                    session_id: grant.session_id,
                    owner_id: grant.owner_id.clone(),
                });
                if let Some(prior) = self.grants.get(&grant.key) {
                    if self.live(prior, *now_ms) {
                        let detail = format!(
                            "key {}: token {} granted at {} while token {} (lease to {}) still lived",
                            grant.key, grant.fencing_token, now_ms, prior.token, prior.lease_end_ms
                        );
                        self.fail(at_ms, Failure::correctness(ids::NO_TWO_LIVE_GRANTS, detail));
                    }
                }
                if grant.fencing_token <= self.last_token {
                    let detail = format!(
                        "key {}: token {} granted after token {}",
                        grant.key, grant.fencing_token, self.last_token
                    );
                    self.fail(at_ms, Failure::correctness(ids::TOKENS_INCREASE, detail));
                }
                self.last_token = self.last_token.max(grant.fencing_token);
                // The holder's session is live at its grant (the store checked it); keep the
                // later of what we know.
                self.grants.insert(
                    grant.key.clone(),
                    ModelGrant {
                        token: grant.fencing_token,
                        session_id: grant.session_id,
                        seen_at_ms: chained_from.unwrap_or(at_ms),
                        lease_end_ms: grant.expires_at_ms,
                    },
                );
            }
            LockEvent::Renewed { key, token, expires_at_ms, now_ms } => {
                let held = self.grants.get(key).filter(|g| g.token == *token);
                if !held.is_some_and(|g| self.live(g, *now_ms)) {
                    let detail = match held {
                        Some(g) => format!(
                            "key {key}: token {token} renewed at {now_ms}, dead by then (lease to {}, session to {:?})",
                            g.lease_end_ms,
                            self.sessions.get(&g.session_id)
                        ),
                        None => format!("key {key}: token {token} renewed at {now_ms}, no longer the key's grant"),
                    };
                    self.fail(at_ms, Failure::correctness(ids::DEAD_GRANT_NEVER_REVIVED, detail));
                }
                if let Some(g) = self.grants.get_mut(key).filter(|g| g.token == *token) {
                    g.lease_end_ms = *expires_at_ms;
                }
            }
            LockEvent::Released { key, token, now_ms } => {
                if let Some(g) = self.grants.get(key).filter(|g| g.token == *token) {
                    self.released = Some((key.clone(), g.session_id, *now_ms, g.seen_at_ms, self.live(g, *now_ms)));
                    self.grants.remove(key);
                }
            }
            LockEvent::Refused { refusal, now_ms } => self.refused(refusal, *now_ms, at_ms),
            LockEvent::Revoked { key, token, new_token_floor, .. } => {
                if *new_token_floor <= *token {
                    let detail = format!("key {key}: token {token} revoked, the token floor left at {new_token_floor}");
                    self.fail(at_ms, Failure::correctness(ids::REVOKE_RAISES_FLOOR, detail));
                }
                self.revoked_tokens.insert(*token);
                self.beliefs.revoked(key, *token);
                self.last_token = self.last_token.max(*new_token_floor);
                if self.grants.get(key).is_some_and(|g| g.token == *token) {
                    self.grants.remove(key);
                }
            }
            LockEvent::Dropped { key, token, now_ms } => {
                // A drop ends a grant only if it was dead: a live grant dropped stays live in
                // the model, so the next grant of its key is an overlap.
                let live = self.grants.get(key).filter(|g| g.token == *token).is_some_and(|g| self.live(g, *now_ms));
                if !live && self.grants.get(key).is_some_and(|g| g.token == *token) {
                    self.grants.remove(key);
                }
            }
        }
    }

    /// A partition that began at `started_at_ms` (monitor ms, true time) healed at `now_ms`
    /// (lock-store time): fires [`Probe::PartitionHealedMidLease`] when a grant committed
    /// before it began (or rotated since from one that was, the same holder's hold) still
    /// lives.
    pub fn partition_healed(&mut self, started_at_ms: u64, now_ms: i64) -> bool {
        let mid_lease = self.grants.values().any(|g| g.seen_at_ms < started_at_ms && self.live(g, now_ms));
        if mid_lease {
            probe::hit(Probe::PartitionHealedMidLease);
        }
        mid_lease
    }
}

/// One account row, as the end-of-run ledger checks read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountFacts {
    pub account_id: String,
    pub kind: AccountKind,
    pub balance_minor: i64,
    /// Σ amount of its unsettled payouts.
    pub reserved_minor: i64,
}

/// FR-25 over raw rows: every CUSTOMER balance is its ledger sum, no available balance is
/// negative, and Σ DEBIT = Σ CREDIT per currency.
pub fn ledger_failures(accounts: &[AccountFacts], ledger: &[LedgerEntry]) -> Vec<Failure> {
    let mut found = Vec::new();
    let mut sums: BTreeMap<&str, i128> = BTreeMap::new();
    let mut sides: BTreeMap<(&str, Direction), i128> = BTreeMap::new();
    for e in ledger {
        let signed = match e.direction {
            Direction::Credit => i128::from(e.amount_minor),
            Direction::Debit => -i128::from(e.amount_minor),
        };
        *sums.entry(e.account_id.as_str()).or_insert(0) += signed;
        *sides.entry((e.currency.as_str(), e.direction)).or_insert(0) += i128::from(e.amount_minor);
    }
    for a in accounts.iter().filter(|a| a.kind == AccountKind::Customer && !is_system_account(&a.account_id)) {
        let sum = sums.get(a.account_id.as_str()).copied().unwrap_or(0);
        if i128::from(a.balance_minor) != sum {
            found.push(Failure::correctness(
                ids::BALANCE_IS_LEDGER_SUM,
                format!("account {}: balance {} != ledger sum {sum}", a.account_id, a.balance_minor),
            ));
        }
        let available = i128::from(a.balance_minor) - i128::from(a.reserved_minor);
        if available < 0 {
            found.push(Failure::correctness(
                ids::NO_NEGATIVE_AVAILABLE,
                format!("account {}: available {available} < 0", a.account_id),
            ));
        }
    }
    let currencies: BTreeSet<&str> = sides.keys().map(|(c, _)| *c).collect();
    for c in currencies {
        let debit = sides.get(&(c, Direction::Debit)).copied().unwrap_or(0);
        let credit = sides.get(&(c, Direction::Credit)).copied().unwrap_or(0);
        if debit != credit {
            found.push(Failure::correctness(
                ids::DEBITS_EQUAL_CREDITS,
                format!("{c}: debits {debit} != credits {credit}"),
            ));
        }
    }
    found
}

/// Every ledger entry of a payout on a CUSTOMER account is on that payout's own account
/// (`payout_accounts`: each payout's account, as paydb's row holds it).
pub fn ledger_account_failures(ledger: &[LedgerEntry], payout_accounts: &BTreeMap<Uuid, String>) -> Vec<Failure> {
    ledger
        .iter()
        .filter(|e| !is_system_account(&e.account_id))
        .filter_map(|e| {
            let payout = e.payout_id?;
            let own = payout_accounts.get(&payout);
            (own != Some(&e.account_id)).then(|| {
                Failure::correctness(
                    ids::LEDGER_ENTRY_ON_ITS_PAYOUTS_ACCOUNT,
                    format!(
                        "entry {} ({:?} {} {}) of payout {payout} is on account {}, the payout's is {own:?}",
                        e.entry_id, e.direction, e.amount_minor, e.currency, e.account_id
                    ),
                )
            })
        })
        .collect()
}

/// The rail's own log against paydb's submission rows: no payout reached the rail twice, and
/// none reached it without a forwardable intent row (`calls` are `clientRef`s, in arrival
/// order).
pub fn rail_failures(calls: &[String], rows: &[SubmissionRow]) -> Vec<Failure> {
    let mut per_ref: BTreeMap<&str, u64> = BTreeMap::new();
    for c in calls {
        *per_ref.entry(c.as_str()).or_insert(0) += 1;
    }
    let mut intents: BTreeMap<String, u64> = BTreeMap::new();
    for r in rows.iter().filter(|r| is_forwardable(r.outcome)) {
        *intents.entry(r.payout_id.to_string()).or_insert(0) += 1;
    }
    let mut found = Vec::new();
    for (client_ref, n) in per_ref {
        if n > 1 {
            found.push(Failure::correctness(
                ids::AT_MOST_ONE_RAIL_CALL,
                format!("payout {client_ref} reached the rail {n} times"),
            ));
        }
        let admitted = intents.get(client_ref).copied().unwrap_or(0);
        if n > admitted {
            found.push(Failure::correctness(
                ids::RAIL_CALL_HAS_INTENT,
                format!("payout {client_ref} reached the rail {n} times with {admitted} forwardable intent rows"),
            ));
        }
    }
    found
}

/// Each account's mark (`marks`: `rail_high_water` by account) against its submission rows:
/// the mark equals the highest token presented by a row that passed it (any outcome but
/// FENCED); an account with neither a mark nor such a row is clean
/// ([`ids::MARK_EQUALS_HIGHEST_ADMITTED`]).
pub fn mark_failures(marks: &BTreeMap<String, i64>, rows: &[SubmissionRow]) -> Vec<Failure> {
    let mut highest: BTreeMap<&str, i64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.outcome != Some(SubmissionOutcome::Fenced)) {
        let h = highest.entry(r.account_id.as_str()).or_insert(r.presented_token);
        *h = (*h).max(r.presented_token);
    }
    let accounts: BTreeSet<&str> =
        marks.keys().map(String::as_str).chain(rows.iter().map(|r| r.account_id.as_str())).collect();
    accounts
        .into_iter()
        .filter_map(|account| {
            let (mark, admitted) = (marks.get(account).copied(), highest.get(account).copied());
            (mark != admitted).then(|| {
                Failure::correctness(
                    ids::MARK_EQUALS_HIGHEST_ADMITTED,
                    format!("account {account} mark {mark:?}, highest admitted {admitted:?}"),
                )
            })
        })
        .collect()
}

/// The oracle's end-of-run checks on paydb's raw rows and the rail's log alone (no monitor,
/// no wire log), for a test that drives a world by hand: [`rail_failures`],
/// [`ledger_failures`] and [`ledger_account_failures`], and [`ids::PAYDB_READABLE`] (a crash)
/// when paydb's tables cannot be read. `rail_calls` are the rail's `clientRef`s in arrival
/// order.
pub fn safety_failures(paydb: &dlock_payment_resource::store_mem::MemPaydb, rail_calls: &[String]) -> Vec<Failure> {
    if let Err(e) = paydb.with_tables(|_| ()) {
        return vec![Failure::crash(ids::PAYDB_READABLE, format!("paydb unreadable: {e}"))];
    }
    let rows = PaydbRows::read(paydb);
    let mut found = rail_failures(rail_calls, &rows.submissions);
    found.extend(ledger_failures(&rows.accounts, &rows.ledger));
    found.extend(ledger_account_failures(&rows.ledger, &rows.payout_accounts));
    found
}

/// Liveness over raw rows: every payout settled, every intent resolved.
pub fn settle_failures(payouts: &[(Uuid, PayoutState)], rows: &[SubmissionRow]) -> Vec<Failure> {
    let settled = |s: PayoutState| {
        matches!(s, PayoutState::Posted | PayoutState::Failed | PayoutState::Abandoned | PayoutState::RailAmbiguous)
    };
    let mut found = Vec::new();
    let open: Vec<String> =
        payouts.iter().filter(|(_, s)| !settled(*s)).map(|(id, s)| format!("{id} {}", s.as_str())).collect();
    if !open.is_empty() {
        found.push(Failure::liveness(
            ids::EVERY_PAYOUT_SETTLES,
            format!("{} unsettled: {}", open.len(), open.join(", ")),
        ));
    }
    let unresolved: Vec<String> = rows
        .iter()
        .filter(|r| r.outcome.is_none())
        .map(|r| format!("{} (payout {})", r.submission_id, r.payout_id))
        .collect();
    if !unresolved.is_empty() {
        found.push(Failure::liveness(
            ids::NO_UNRESOLVED_INTENT,
            format!("{} unresolved: {}", unresolved.len(), unresolved.join(", ")),
        ));
    }
    found
}

/// What the oracle knows that a reconciler's report also states.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Known {
    pub max_rail_calls_per_payout: u64,
    pub ambiguous: BTreeSet<Uuid>,
    pub ledger_balanced: bool,
    pub payouts_by_state: BTreeMap<PayoutState, u64>,
}

/// The reconciler's report against the oracle's own figures; one failure naming every
/// difference.
pub fn reconciler_failures(known: &Known, report: &Known) -> Vec<Failure> {
    let mut diffs = Vec::new();
    if known.max_rail_calls_per_payout != report.max_rail_calls_per_payout {
        diffs.push(format!(
            "max rail calls per payout: oracle {}, reconciler {}",
            known.max_rail_calls_per_payout, report.max_rail_calls_per_payout
        ));
    }
    if known.ambiguous != report.ambiguous {
        diffs.push(format!("ambiguous: oracle {:?}, reconciler {:?}", known.ambiguous, report.ambiguous));
    }
    if known.ledger_balanced != report.ledger_balanced {
        diffs.push(format!("ledger balanced: oracle {}, reconciler {}", known.ledger_balanced, report.ledger_balanced));
    }
    let nonzero = |m: &BTreeMap<PayoutState, u64>| -> BTreeMap<PayoutState, u64> {
        m.iter().filter(|(_, n)| **n > 0).map(|(s, n)| (*s, *n)).collect()
    };
    if nonzero(&known.payouts_by_state) != nonzero(&report.payouts_by_state) {
        diffs.push(format!(
            "payouts by state: oracle {:?}, reconciler {:?}",
            nonzero(&known.payouts_by_state),
            nonzero(&report.payouts_by_state)
        ));
    }
    if diffs.is_empty() {
        Vec::new()
    } else {
        vec![Failure::liveness(ids::RECONCILER_AGREES, diffs.join("; "))]
    }
}

/// What the rail's own record (`GET /calls`) says of one `clientRef`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RefTruth {
    pub calls: u64,
    /// Calls that moved money (`paid`), whatever the rail answered.
    pub paid: u64,
    /// The references of the calls that moved money, in arrival order.
    pub paid_references: Vec<Option<String>>,
}

/// The rail's record, per `clientRef` (a payout id): the ground truth a reconciler's
/// findings are held to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RailTruth {
    pub per_ref: BTreeMap<String, RefTruth>,
}

impl RailTruth {
    pub fn of(log: &dlock_contract::rail::RailCallLog) -> RailTruth {
        let mut per_ref: BTreeMap<String, RefTruth> = BTreeMap::new();
        for c in &log.calls {
            let t = per_ref.entry(c.client_ref.clone()).or_default();
            t.calls += 1;
            if c.paid {
                t.paid += 1;
                t.paid_references.push(c.rail_reference.clone());
            }
        }
        RailTruth { per_ref }
    }

    fn of_payout(&self, payout: Uuid) -> RefTruth {
        self.per_ref.get(&payout.to_string()).cloned().unwrap_or_default()
    }
}

/// What a reconciler's report states payout by payout.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stated {
    /// The report read the rail's record.
    pub rail_read: bool,
    /// Each RAIL_AMBIGUOUS payout's classification and the reference it names.
    pub ambiguous: BTreeMap<Uuid, (AmbiguousClass, Option<String>)>,
    /// Payouts of a `DOUBLE_PAYMENT` finding.
    pub double_payments: BTreeSet<Uuid>,
    /// Payouts of a `REPEATED_RAIL_CALL` finding.
    pub repeated_calls: BTreeSet<Uuid>,
}

impl Stated {
    pub fn of(r: &dlock_reconciler::Report) -> Stated {
        use dlock_reconciler::report::FindingKind;
        let of_kind = |kind: FindingKind| -> BTreeSet<Uuid> {
            r.findings.iter().filter(|f| f.kind == kind).filter_map(|f| f.payout_id).collect()
        };
        Stated {
            rail_read: r.sources.rail.read,
            ambiguous: r
                .ambiguous
                .iter()
                .map(|a| (a.payout_id, (a.classification, a.rail_reference.clone())))
                .collect(),
            double_payments: of_kind(FindingKind::DoublePayment),
            repeated_calls: of_kind(FindingKind::RepeatedRailCall),
        }
    }
}

/// Differences listed per failure line, at most.
const DIFFS_SHOWN_MAX: usize = 8;

/// The reconciler's findings against the rail's own record, payout by payout
/// ([`ids::RECONCILER_MATCHES_RAIL`]): what an operator is told to do with each quarantined
/// payout must be what the rail did. One correctness failure naming every difference.
pub fn reconciler_truth_failures(truth: &RailTruth, stated: &Stated) -> Vec<Failure> {
    let mut diffs = Vec::new();
    for (payout, (class, reference)) in &stated.ambiguous {
        let t = truth.of_payout(*payout);
        let expected = match t.paid {
            _ if !stated.rail_read => AmbiguousClass::Unknown,
            0 => AmbiguousClass::NotPaid,
            1 => AmbiguousClass::Paid,
            _ => AmbiguousClass::Unknown,
        };
        let expected_reference =
            (expected == AmbiguousClass::Paid).then(|| t.paid_references.first().cloned().flatten()).flatten();
        if *class != expected || *reference != expected_reference {
            diffs.push(format!(
                "payout {payout} classified {} (reference {reference:?}) where the rail's record ({} call(s), {} paid) \
                 says {} (reference {expected_reference:?})",
                class.as_str(),
                t.calls,
                t.paid,
                expected.as_str()
            ));
        }
    }
    if stated.rail_read {
        let payouts = |f: fn(&RefTruth) -> bool| -> BTreeSet<Uuid> {
            truth.per_ref.iter().filter(|(_, t)| f(t)).filter_map(|(r, _)| Uuid::parse_str(r).ok()).collect()
        };
        for (name, found, truly) in [
            ("double payments", &stated.double_payments, payouts(|t| t.paid >= 2)),
            ("repeated rail calls", &stated.repeated_calls, payouts(|t| t.calls >= 2 && t.paid <= 1)),
        ] {
            let missed: Vec<&Uuid> = truly.difference(found).collect();
            let unsupported: Vec<&Uuid> = found.difference(&truly).collect();
            if !missed.is_empty() || !unsupported.is_empty() {
                diffs.push(format!("{name}: not found {missed:?}, found without support {unsupported:?}"));
            }
        }
    }
    if diffs.is_empty() {
        return Vec::new();
    }
    let n = diffs.len();
    diffs.truncate(DIFFS_SHOWN_MAX);
    let more = if n > DIFFS_SHOWN_MAX { format!("; and {} more", n - DIFFS_SHOWN_MAX) } else { String::new() };
    vec![Failure::correctness(ids::RECONCILER_MATCHES_RAIL, format!("{}{more}", diffs.join("; ")))]
}

/// The fenced write an idempotency record's operation is (claims and posts only).
fn fenced_op(op: dlock_payment_resource::store::Operation) -> Option<FencedOp> {
    match op {
        dlock_payment_resource::store::Operation::Claim => Some(FencedOp::Claim),
        dlock_payment_resource::store::Operation::Post => Some(FencedOp::Post),
        _ => None,
    }
}

/// paydb's rows the end checks read, in one transaction.
#[derive(Debug, Clone, Default)]
pub struct PaydbRows {
    pub accounts: Vec<AccountFacts>,
    pub ledger: Vec<LedgerEntry>,
    pub submissions: Vec<SubmissionRow>,
    pub payouts: Vec<(Uuid, PayoutState)>,
    /// Each payout's account.
    pub payout_accounts: BTreeMap<Uuid, String>,
    pub fences: BTreeMap<String, i64>,
    pub marks: BTreeMap<String, i64>,
    /// Every claim's and post's idempotency record.
    pub records: Records,
    /// Every batch's (P2b, P3b) idempotency record (C3-extensions E-19).
    pub batch_records: BatchRecords,
}

impl PaydbRows {
    /// Reads the raw tables (no store code in between).
    pub fn read(paydb: &dlock_payment_resource::store_mem::MemPaydb) -> PaydbRows {
        paydb
            .with_tables(|t| {
                let reserved = |account: &str| -> i64 {
                    t.rail
                        .payouts
                        .values()
                        .filter(|p| p.row.account_id == account && is_unsettled(p.row.state))
                        .map(|p| p.row.amount_minor)
                        .sum()
                };
                PaydbRows {
                    accounts: t
                        .accounts
                        .iter()
                        .map(|(id, a)| AccountFacts {
                            account_id: id.clone(),
                            kind: a.kind,
                            balance_minor: a.balance_minor,
                            reserved_minor: reserved(id),
                        })
                        .collect(),
                    ledger: t.ledger.clone(),
                    submissions: t.rail.submissions.clone(),
                    payouts: t.rail.payouts.values().map(|p| (p.row.payout_id, p.row.state)).collect(),
                    payout_accounts: t
                        .rail
                        .payouts
                        .values()
                        .map(|p| (p.row.payout_id, p.row.account_id.clone()))
                        .collect(),
                    fences: t.accounts.iter().map(|(id, a)| (id.clone(), a.fence)).collect(),
                    marks: t.rail.high_water.clone(),
                    records: t
                        .idempotency
                        .iter()
                        .filter_map(|((op, target, key, token), r)| {
                            let op = fenced_op(*op)?;
                            let payout = Uuid::parse_str(target).ok()?;
                            Some(((op, payout, *token, key.clone()), (r.response.status, r.response.body.clone())))
                        })
                        .collect(),
                    batch_records: t
                        .idempotency
                        .iter()
                        .filter_map(|((op, target, key, token), r)| {
                            let op = fenced_op(*op)?;
                            let account = target.strip_prefix("account:")?.to_owned();
                            Some(((op, account, *token, key.clone()), (r.response.status, r.response.body.clone())))
                        })
                        .collect(),
                }
            })
            .unwrap_or_default()
    }

    /// What paydb holds of each claim, post and submission, for the retry-safe check: the
    /// recorded claims and posts, and every submission with a forwardable intent row.
    pub fn effects(&self) -> BTreeSet<(FencedOp, Uuid, i64)> {
        let recorded = self.records.keys().map(|(op, payout, token, _)| (*op, *payout, *token));
        let forwardable = self
            .submissions
            .iter()
            .filter(|r| is_forwardable(r.outcome))
            .map(|r| (FencedOp::Admit, r.payout_id, r.presented_token));
        recorded.chain(forwardable).collect()
    }

    /// The oracle's own figures for the reconciler comparison.
    pub fn known(&self, calls: &[String]) -> Known {
        let mut per_ref: BTreeMap<&str, u64> = BTreeMap::new();
        for c in calls {
            *per_ref.entry(c.as_str()).or_insert(0) += 1;
        }
        let mut by_state: BTreeMap<PayoutState, u64> = BTreeMap::new();
        for (_, s) in &self.payouts {
            *by_state.entry(*s).or_insert(0) += 1;
        }
        Known {
            max_rail_calls_per_payout: per_ref.values().copied().max().unwrap_or(0),
            ambiguous: self
                .payouts
                .iter()
                .filter(|(_, s)| *s == PayoutState::RailAmbiguous)
                .map(|(id, _)| *id)
                .collect(),
            ledger_balanced: ledger_failures(&self.accounts, &self.ledger).is_empty(),
            payouts_by_state: by_state,
        }
    }
}

#[cfg(madsim)]
pub use online::{check, liveness, Monitor, ORACLE_RECONCILER_IP};

#[cfg(madsim)]
mod online {
    use std::net::IpAddr;
    use std::sync::{Arc, Mutex};

    use dlock_lock_server::store_mem::{LockEvent, LockObserver};
    use dlock_payment_resource::store_mem::{FencedWrite, PaydbObserver, PaydbTables};
    use dlock_rt::Clock;

    use super::{
        ids, ledger_account_failures, ledger_failures, parse_wire_all, rail_failures, reconciler_failures,
        reconciler_truth_failures, retry_safe_failures, settle_failures, wire_batch_replay_failures,
        wire_replay_failures, Checker, Effects, FencedOp, Known, PaydbFacts, PaydbRows, RailTruth, Stated,
        TimedFailure, WireWrite,
    };
    use crate::outcome::Failure;
    use crate::world::{self, World};

    /// The node the oracle's reconciler run lives on.
    pub const ORACLE_RECONCILER_IP: [u8; 4] = [10, 0, 9, 8];

    struct Hook {
        checker: Arc<Mutex<Checker>>,
        start: madsim::time::Instant,
        /// The seed's incident trace, when one is kept (`crate::trace`).
        trace: Option<crate::trace::Trace>,
    }

    impl Hook {
        fn at_ms(&self) -> u64 {
            u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
        }
    }

    impl PaydbObserver for Hook {
        fn fenced_write(&self, tables: &PaydbTables, write: &FencedWrite) {
            let facts = PaydbFacts::read(tables, write.payout_id);
            let at = self.at_ms();
            if let Ok(mut c) = self.checker.lock() {
                c.on_fenced_write(write, &facts, at);
            }
            if let Some(t) = &self.trace {
                t.fenced_write(tables, write);
            }
        }
    }

    impl LockObserver for Hook {
        fn event(&self, e: &LockEvent) {
            let at = self.at_ms();
            if let Ok(mut c) = self.checker.lock() {
                c.on_lock_event(e, at);
                if let LockEvent::Granted { grant, .. } = e {
                    c.note_grant_seq(dlock_rt::wire_log::seq(), grant.session_id, &grant.key);
                }
            }
            if let Some(t) = &self.trace {
                t.lock_event(e);
            }
        }
    }

    impl super::calls::CallObserver for Hook {
        fn begin(&self, id: u64, asked: super::calls::Asked) {
            let at = self.at_ms();
            if let Ok(mut c) = self.checker.lock() {
                c.on_call_begin(id, asked, at);
            }
        }

        fn end(&self, id: u64, answered: super::calls::Answered) {
            let at = self.at_ms();
            if let Ok(mut c) = self.checker.lock() {
                c.on_call_end(id, answered, at);
            }
        }
    }

    /// The oracle's sink on the services' event seam: the holders' beliefs go to the
    /// checker (as they are emitted, on the node whose task emitted them); every event goes
    /// on to the sink installed before (the incident trace's, when one is kept).
    struct Seam {
        checker: Arc<Mutex<Checker>>,
        start: madsim::time::Instant,
        then: Option<Arc<dyn dlock_rt::events::Sink>>,
    }

    impl dlock_rt::events::Sink for Seam {
        fn record(&self, node: &str, kind: &'static str, fields: dlock_rt::events::Fields) {
            if matches!(kind, "lease_belief" | "session_belief" | "revoke") {
                let at = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
                let reading = |n| dlock_rt::sim_clock::now_on(n).reading_ms();
                if let Ok(mut c) = self.checker.lock() {
                    c.on_belief(madsim::plugin::node(), kind, &fields, at, reading);
                }
            }
            if let Some(then) = &self.then {
                then.record(node, kind, fields);
            }
        }
    }

    /// The online half of the oracle. [`Monitor::start`] registers observers on the world's
    /// paydb and simulation lockdb (call it right after `world::start`, before any
    /// workload); from then on every fenced write and every grant is judged as it commits,
    /// and every holder's belief as it is emitted ([`super::belief`]). Clones share the one
    /// checker (a fault layer's heal hook holds one); the seam sink stays installed until
    /// the last clone drops.
    #[derive(Clone)]
    pub struct Monitor {
        checker: Arc<Mutex<Checker>>,
        start: madsim::time::Instant,
        _seam: Arc<dlock_rt::events::Installed>,
    }

    impl Monitor {
        pub fn start(world: &World) -> Monitor {
            Monitor::start_traced(world, None)
        }

        /// [`Monitor::start`], recording every observed grant and fenced write in `trace`
        /// as well.
        pub fn start_traced(world: &World, trace: Option<crate::trace::Trace>) -> Monitor {
            // What callers receive on the wire, from now on (this seed's thread).
            dlock_rt::wire_log::enable();
            let checker = Arc::new(Mutex::new(Checker::new()));
            let judges = world.lock_judges();
            if let Ok(mut c) = checker.lock() {
                c.judge_beliefs(dlock_lock_client::config::SAFETY_MARGIN_DEFAULT, judges);
                c.judge_calls(world.lock_clock_slack_ms());
            }
            let start = madsim::time::Instant::now();
            world.paydb.set_observer(Arc::new(Hook { checker: checker.clone(), start, trace: trace.clone() }));
            world.locks.set_observer(Arc::new(Hook { checker: checker.clone(), start, trace }));
            world.lock_calls.set_observer(Arc::new(Hook { checker: checker.clone(), start, trace: None }));
            let then = dlock_rt::events::installed();
            let seam = dlock_rt::events::install(Arc::new(Seam { checker: checker.clone(), start, then }));
            Monitor { checker, start, _seam: Arc::new(seam) }
        }

        /// `node`'s clock rate was set to `rate` now.
        pub fn note_rate(&self, node: madsim::task::NodeId, rate: f64) {
            let at = self.elapsed_ms();
            let _ = self.with(|c| c.note_rate(node, at, rate));
        }

        /// `node` crashed now.
        pub fn node_crashed(&self, node: madsim::task::NodeId) {
            let _ = self.with(|c| c.node_crashed(node));
        }

        /// Simulated ms since the monitor started.
        pub fn elapsed_ms(&self) -> u64 {
            u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
        }

        /// Every online failure so far, with the simulated time it fired.
        pub fn failures(&self) -> Vec<TimedFailure> {
            self.checker.lock().map(|c| c.failures().to_vec()).unwrap_or_default()
        }

        /// Runs `f` over the checker (counts, notes).
        pub fn with<R>(&self, f: impl FnOnce(&mut Checker) -> R) -> Option<R> {
            self.checker.lock().ok().map(|mut c| f(&mut c))
        }

        /// A campaign switched `fence` off on purpose (see [`Checker::expect_layer_off`]).
        pub fn expect_layer_off(&self, fence: super::Fence) {
            let _ = self.with(|c| c.expect_layer_off(fence));
        }

        /// Writers whose owner id starts with `owner_prefix` run on a node drifted beyond the
        /// lock client's margin (see [`Checker::note_drifted_owner`]).
        pub fn note_drifted_owner(&self, owner_prefix: &str) {
            let _ = self.with(|c| c.note_drifted_owner(owner_prefix));
        }

        /// A partition that began `ago_ms` before now healed now (`now_ms` on the simulation
        /// lockdb's clock, `MemLockStore::clock_now_ms`); fires `partition_healed_mid_lease`
        /// if a grant committed before it began still lives.
        pub fn partition_healed(&self, ago_ms: u64, now_ms: i64) -> bool {
            let started = self.elapsed_ms().saturating_sub(ago_ms);
            self.with(|c| c.partition_healed(started, now_ms)).unwrap_or(false)
        }
    }

    /// The end-of-run safety check: the monitor's online failures, then the rail's log
    /// against paydb, the ledger, a last sample of fences and marks, and the wire checks
    /// (retry-safe answers left no trace; answers to recorded claims and posts are their
    /// records' bytes). Every failure is correctness-class, but a wire log over its bound
    /// (a crash: the checks would be partial). `async` because the rail's log is read over
    /// the simulated network.
    pub async fn check(world: &World, monitor: &Monitor) -> Vec<Failure> {
        let calls = world.rail_calls().await;
        let rows = PaydbRows::read(&world.paydb);
        let at = monitor.elapsed_ms();
        let _ = monitor.with(|c| c.sample(&rows.fences, &rows.marks, at));
        let mut found: Vec<Failure> = monitor.failures().into_iter().map(|t| t.failure).collect();
        found.extend(rail_failures(&calls, &rows.submissions));
        found.extend(ledger_failures(&rows.accounts, &rows.ledger));
        found.extend(ledger_account_failures(&rows.ledger, &rows.payout_accounts));
        // What callers received on the wire, against the stores.
        let wire: Vec<WireWrite> = dlock_rt::wire_log::snapshot().iter().flat_map(parse_wire_all).collect();
        let mut effects = Effects { writes: rows.effects(), grants: Vec::new() };
        let _ = monitor.with(|c| {
            effects.writes.extend(c.accepted_writes().iter().filter(|(op, ..)| *op != FencedOp::Admit).copied());
            effects.grants = c.grant_seqs().to_vec();
        });
        found.extend(retry_safe_failures(&wire, &effects));
        found.extend(wire_replay_failures(&wire, &rows.records));
        found.extend(wire_batch_replay_failures(&wire, &rows.batch_records));
        if dlock_rt::wire_log::overflowed() {
            found.push(Failure::crash(
                ids::WIRE_LOG_COMPLETE,
                format!("more than {} writes: the wire checks are partial", dlock_rt::wire_log::EXCHANGES_MAX),
            ));
        }
        found
    }

    /// The liveness check, after every fault healed and the world had its bounded time to
    /// settle: every payout settled, no intent unresolved, and the reconciler (run on a node
    /// of its own over the world's paydb and the rail's record) states what the oracle
    /// computed. Liveness-class failures.
    pub async fn liveness(world: &World) -> Vec<Failure> {
        let log = world.read_rail_call_log().await;
        let calls: Vec<String> = log.iter().flat_map(|l| l.calls.iter().map(|c| c.client_ref.clone())).collect();
        let rows = PaydbRows::read(&world.paydb);
        let mut found = settle_failures(&rows.payouts, &rows.submissions);
        let known = rows.known(&calls);
        let paydb = world.paydb.clone();
        let node = madsim::runtime::Handle::current()
            .create_node()
            .name("oracle-reconciler")
            .ip(IpAddr::from(ORACLE_RECONCILER_IP))
            .build();
        let report = node
            .spawn(async move {
                let budget = dlock_reconciler::budget::ReadBudget::default();
                let rail =
                    dlock_reconciler::rail::HttpRailRecord::new(world::url(world::STUB_IP, world::STUB_PORT), &budget);
                let source = dlock_reconciler::Paydb { store: paydb, describe: "simulation paydb".into() };
                let params =
                    dlock_reconciler::Params { budget, ..dlock_reconciler::Params::at(Clock::system().wall()) };
                dlock_reconciler::reconcile(&source, &rail, &params).await
            })
            .await;
        match report {
            Ok(r) => {
                let stated = Known {
                    max_rail_calls_per_payout: r.max_rail_calls_per_payout,
                    ambiguous: r.ambiguous.iter().map(|a| a.payout_id).collect(),
                    ledger_balanced: r.ledger_balanced,
                    payouts_by_state: r.payouts_by_state.clone(),
                };
                found.extend(reconciler_failures(&known, &stated));
                // Payout by payout against the rail's record, when the oracle could read it.
                if let Some(log) = &log {
                    found.extend(reconciler_truth_failures(&RailTruth::of(log), &Stated::of(&r)));
                }
            }
            Err(e) => found.push(Failure::crash(ids::RECONCILER_AGREES, format!("the reconciler's node failed: {e}"))),
        }
        found
    }
}

#[cfg(test)]
mod tests;
