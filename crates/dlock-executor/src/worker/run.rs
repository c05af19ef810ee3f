//! The critical section as a synchronous state machine (issue 36 §2): [`PayoutRun`].
//!
//! A run is one critical section for the payouts of one account that one grant covers: a
//! single payout, or a batch of up to `executor.payouts-per-grant-max` PENDING or CLAIMED
//! payouts (C3-extensions E-19; the same machine over N payouts, N > 1 sending the batch
//! requests P2b, R1b and P3b where N = 1 sends P2, R1 and P3). [`PayoutRun::step`] takes one
//! [`Event`] (a typed answer or refusal of a client, or a reading the shell took) and
//! returns the [`Command`]s that follow from it. It does no I/O, reads no clock and draws
//! nothing: the lease arithmetic comes in as readings ([`Event::GrantLease`],
//! [`Event::LeaseChecked`]), so a table of events replays it exactly (the golden scripts
//! in `worker/run/scripts.rs`), and a model checker can drive it (the machine is
//! `Clone + Debug + Eq + Hash`). The async shell (`worker/shell.rs`) performs the commands in
//! order through the typed clients; a command that asks for an answer is always the last
//! of its step, and its answer is the next event.
//!
//! # Transitions
//!
//! | phase | event | commands, and the next phase |
//! |---|---|---|
//! | ready | `Start` (fresh) | `Mark`: marking |
//! | ready | `Start` (chained) | `GrantLease`: refreshing the kept grant |
//! | marking | `Marked` free / busy | `Acquire`: acquiring / `Done(Busy)` |
//! | acquiring | `Granted` ok / refused | held (below) / `ForgetAccount`?, `Log`, `Done(Busy or Reset)` |
//! | refreshing | `GrantLease` ≥ a write's lease / less | go on / `Rotate`: refreshing |
//! | refreshing | `Granted` ok / refused | go on / chain: as a refused acquire; post: `Log(PostDeferred)`, `Done` |
//! | held, single | PENDING or CLAIMED / else | `CheckLease`: checking (claim) / `Read`: reading |
//! | held, batch | | `CheckLease`: checking (claim batch) |
//! | checking | `LeaseChecked` may write / may not | the write: claiming, submitting or posting / `Release`, `Done(LeaseLost)` |
//! | reading | `Read` PENDING/CLAIMED / RAIL_ACKED / other / none | claim with its terms / post its acked attempt / `Release`, `Done` (no outcome) / `Release`, `Done(Unavailable)` |
//! | claiming | `Claimed` ok / refused | submit (terms from the read, the answer, or one `Read`) / by code, below |
//! | submitting | `Submitted` (with the rotate beside it) | acked: refreshing the rotated grant for the post / refused: by code, `Release` of the rotated grant |
//! | posting | `Posted` (with the rotate beside it when keeping) | `Done`, the rotated grant kept when every payout posted, else released in the background |
//!
//! A claim refused `FENCED_OUT` ends the run `Fenced` (logged); `PAYOUT_NOT_CLAIMABLE` ends it
//! `NotClaimable`, except a scan-state claim whose refusal names RAIL_ACKED (FR-14: read it
//! and post); `INSUFFICIENT_FUNDS` ends it `Failed`; anything else `Unavailable`. A refused
//! submission is never sent again: `FENCED_OUT` → `Fenced`, `DUPLICATE_SUBMISSION` →
//! `Duplicate`, `RAIL_AMBIGUOUS` → `Ambiguous`, a 422 → `Failed`, `PAYOUT_NOT_CLAIMABLE` →
//! `NotClaimable`, a lost answer → `AnswerLost`, else `Unavailable` (C3 §3.7, §3.8). A post
//! refused `FENCED_OUT` → `Fenced`, `PAYOUT_NOT_CLAIMABLE` → `NotClaimable`, else
//! `Unavailable`. A batch reads each item as its single write's answer, and a refusal of the
//! whole request ends every payout still open.
//!
//! # Invariants (asserted on every step, in release builds)
//!
//! - An event answers the phase's one outstanding command; a command that asks for an
//!   answer is the last of its step, and `Done` ends the run.
//! - A kept grant is only ever rotated into a run of its own account; every member of a run
//!   is of that account, named once; a batch's members are PENDING or CLAIMED.
//! - A fenced write is sent only under a grant the run holds, after a `LeaseChecked` that
//!   allowed it, and carries that grant's token; the post is never sent under the grant
//!   that claimed (C3-extensions C-10: each grant passes each fence once).
//! - A run submits at most once (C3 §3.8: zero retries, ever).
//! - A run ends holding no grant unless it keeps it for the next run of its account, and
//!   only a run whose post posted every payout it carried keeps it, within
//!   `executor.chain-payouts-max`.
//! - Each payout's outcome is set at most once; a batch ends with one outcome per member, a
//!   single run with one, or none when the payout needed nothing (it was no longer
//!   PENDING, CLAIMED or RAIL_ACKED).
//! - A run takes at most [`RUN_STEPS_MAX`] steps.

use dlock_contract::payout::PayoutState;
use dlock_contract::{ErrorCode, IdempotencyKey};
use dlock_rt::probe::Probe;
use uuid::Uuid;

use crate::config::ExecutorConfig;
use crate::metrics::Outcome;

mod events;
pub use events::*;

/// Most steps a run takes (the longest path, a chained single payout whose stale scan is
/// corrected by a read, takes 14).
pub const RUN_STEPS_MAX: usize = 32;

/// The settings a run decides with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// `executor.lock-wait-ms` (0: no `waitMillis`).
    pub lock_wait_ms: u64,
    /// One try of a claim's or post's hop: its connect plus read budget.
    pub write_hop_ms: u64,
    /// `executor.lock-ttl-ms`.
    pub lock_ttl_ms: u64,
    /// `executor.chain-payouts-max`.
    pub chain_payouts_max: u32,
}

impl Limits {
    pub fn of(cfg: &ExecutorConfig) -> Limits {
        Limits {
            lock_wait_ms: cfg.lock_wait_ms,
            write_hop_ms: cfg.write_connect_timeout_ms.saturating_add(cfg.write_read_timeout_ms),
            lock_ttl_ms: cfg.lock_ttl_ms,
            chain_payouts_max: cfg.chain_payouts_max,
        }
    }

    /// The grant lease a rotated grant must have left for a write without one more rotate:
    /// one try of a write hop, or half a lease, whichever is less (a fresh grant could not
    /// offer much more).
    pub fn lease_for_a_write_ms(&self) -> u64 {
        self.write_hop_ms.min(self.lock_ttl_ms / 2)
    }
}

/// The grant a run believes it holds: its token, and which of the run's grants it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Grant {
    token: i64,
    generation: u32,
}

/// The write a lease check stands before.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Next {
    Claim { expected: PayoutState, view: Option<Terms>, key: IdempotencyKey },
    ClaimBatch { key: IdempotencyKey },
    Submit { terms: Terms, key: IdempotencyKey },
    SubmitBatch { claimed: Vec<(Uuid, Terms)> },
    Post { acked: Acked },
    PostBatch { acked: Vec<Acked>, key: IdempotencyKey },
}

/// Why a grant's lease is being refreshed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Refresh {
    /// A chain's kept grant, before the run's claim.
    Chain,
    /// The grant rotated beside the submission, before the post.
    Post(Vec<Acked>),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Ready,
    Marking,
    Acquiring,
    Refreshing {
        why: Refresh,
        rotating: bool,
    },
    Checking(Next),
    /// A single payout's P4: to act on its state (`terms` false) or for its terms.
    Reading {
        terms: bool,
    },
    Claiming {
        expected: PayoutState,
        view: Option<Terms>,
    },
    ClaimingBatch,
    Submitting {
        token: i64,
    },
    SubmittingBatch {
        token: i64,
        sent: Vec<Uuid>,
    },
    Posting {
        acked: Vec<Acked>,
        token: i64,
        rotate: bool,
    },
    Done,
}

/// One critical section (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PayoutRun {
    limits: Limits,
    account: String,
    members: Vec<Member>,
    outcomes: Vec<Option<Outcome>>,
    chained: Option<Kept>,
    keep_asked: bool,
    /// Whether the post may keep its grant (set once granted).
    keep: bool,
    links: u32,
    owner_valid: bool,
    grant: Option<Grant>,
    /// Grants this run has been given (a generation counter).
    generations: u32,
    /// The generation of the grant that claimed.
    claimed_under: Option<u32>,
    submitted: bool,
    steps: usize,
    phase: Phase,
}

/// The payout's stable idempotency key, carried by each of its fenced writes with the
/// grant's token and the worker's owner id (C3 §3.1: derived from the payout, never
/// regenerated).
pub fn write_key(payout_id: Uuid) -> Option<IdempotencyKey> {
    IdempotencyKey::parse(&format!("payout:{payout_id}")).ok()
}

/// A batch's idempotency key (P2b, P3b): stable for the request's one retry, distinct per
/// grant (the identity is also keyed by the token).
pub fn batch_key(kind: &str, token: i64) -> Option<IdempotencyKey> {
    IdempotencyKey::parse(&format!("{kind}:{token}")).ok()
}

/// The lock key of `account`'s payouts.
pub fn lock_key(account: &str) -> String {
    format!("payout:{account}")
}

impl PayoutRun {
    /// A run of `start`; [`Event::Start`] is its first event.
    pub fn new(limits: Limits, start: Start) -> PayoutRun {
        let Start { account, members, chained, keep, owner_valid } = start;
        assert!(!members.is_empty(), "a run has a payout");
        for (i, m) in members.iter().enumerate() {
            assert!(members[..i].iter().all(|o| o.payout_id != m.payout_id), "a run names each payout once");
            assert!(
                members.len() == 1 || matches!(m.state, PayoutState::Pending | PayoutState::Claimed),
                "a batch holds its account's claimable payouts only"
            );
        }
        if let Some(k) = &chained {
            assert_eq!(
                k.key,
                lock_key(&account),
                "a chained grant is only ever rotated into its own account's payouts"
            );
        }
        PayoutRun {
            limits,
            outcomes: vec![None; members.len()],
            account,
            members,
            chained,
            keep_asked: keep,
            keep: false,
            links: 0,
            owner_valid,
            grant: None,
            generations: 0,
            claimed_under: None,
            submitted: false,
            steps: 0,
            phase: Phase::Ready,
        }
    }

    /// Whether the run is over.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    fn batch(&self) -> bool {
        self.members.len() > 1
    }

    /// One transition: what follows from `event` (see the module doc's table).
    pub fn step(&mut self, event: Event) -> Vec<Command> {
        self.steps += 1;
        assert!(self.steps <= RUN_STEPS_MAX, "a run takes at most {RUN_STEPS_MAX} steps");
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        let mut out = Vec::new();
        match (phase, event) {
            (Phase::Ready, Event::Start) => self.start(&mut out),
            (Phase::Marking, Event::Marked { free: false }) => self.done(&mut out, Pass::Busy),
            (Phase::Marking, Event::Marked { free: true }) => {
                self.phase = Phase::Acquiring;
                let wait_ms = (self.limits.lock_wait_ms > 0).then_some(self.limits.lock_wait_ms);
                out.push(Command::Acquire { key: lock_key(&self.account), wait_ms });
            }
            (Phase::Acquiring, Event::Granted(Ok(token))) => {
                self.grant_given(token);
                self.granted(&mut out);
            }
            (Phase::Acquiring | Phase::Refreshing { why: Refresh::Chain, rotating: true }, Event::Granted(Err(e))) => {
                self.grant = None;
                self.not_granted(&mut out, e);
            }
            (Phase::Refreshing { why, rotating: false }, Event::GrantLease { remaining_ms }) => {
                assert!(self.grant.is_some(), "a lease is read of a grant held");
                if remaining_ms >= self.limits.lease_for_a_write_ms() {
                    self.refreshed(&mut out, why);
                } else {
                    self.phase = Phase::Refreshing { why, rotating: true };
                    self.grant = None;
                    out.push(Command::Rotate);
                }
            }
            (Phase::Refreshing { why, rotating: true }, Event::Granted(Ok(token))) => {
                self.grant_given(token);
                self.refreshed(&mut out, why);
            }
            (Phase::Refreshing { why: Refresh::Post(acked), rotating: true }, Event::Granted(Err(e))) => {
                self.post_deferred(&mut out, &acked, e.text);
            }
            (Phase::Checking(next), Event::LeaseChecked { may_write }) => {
                assert!(self.grant.is_some(), "a lease check is of a grant held");
                if may_write {
                    self.write(&mut out, next);
                } else {
                    self.finish_into(&mut out, Outcome::LeaseLost);
                }
            }
            (Phase::Reading { terms: false }, Event::Read(view)) => self.read_to_act(&mut out, view),
            (Phase::Reading { terms: true }, Event::Read(view)) => match view {
                Some(v) => self.submit(&mut out, v.terms),
                None => self.finish_into(&mut out, Outcome::Unavailable),
            },
            (Phase::Claiming { expected, view }, Event::Claimed(answer)) => {
                self.claimed(&mut out, expected, view, answer)
            }
            (Phase::ClaimingBatch, Event::ClaimedBatch(answer)) => self.claimed_batch(&mut out, answer),
            (Phase::Submitting { token }, Event::Submitted { answer, rotated }) => {
                self.submitted(&mut out, token, answer, rotated)
            }
            (Phase::SubmittingBatch { token, sent }, Event::SubmittedBatch { answer, rotated }) => {
                self.submitted_batch(&mut out, token, &sent, answer, rotated)
            }
            (Phase::Posting { acked, token, rotate }, Event::Posted { answer, rotated }) => {
                assert_eq!(rotated.is_some(), rotate, "a post's rotate is answered exactly when it was sent");
                self.posted(&mut out, &acked, token, answer, rotated)
            }
            (Phase::Posting { acked, token, rotate }, Event::PostedBatch { answer, rotated }) => {
                assert_eq!(rotated.is_some(), rotate, "a post's rotate is answered exactly when it was sent");
                self.posted_batch(&mut out, &acked, token, answer, rotated)
            }
            (phase, event) => panic!("event {event:?} does not answer phase {phase:?}"),
        }
        self.check(&out);
        out
    }

    /// The step's postconditions (module doc, "Invariants").
    fn check(&self, out: &[Command]) {
        let (last, rest) = out.split_last().expect("every step commands something");
        assert!(
            rest.iter().all(|c| !c.is_answered() && !matches!(c, Command::Done(_))),
            "only a step's last command asks or ends"
        );
        assert!(
            last.is_answered() || matches!(last, Command::Done(_)),
            "a step ends asking for an answer or ending the run"
        );
        assert_eq!(
            matches!(last, Command::Done(_)),
            self.phase == Phase::Done,
            "the run is over exactly when it says so"
        );
    }

    fn start(&mut self, out: &mut Vec<Command>) {
        match self.chained.clone() {
            Some(kept) => {
                // The kept grant was rotated beside the previous payout's post, so no fenced
                // write has carried its token.
                self.grant_given(kept.token);
                self.links = kept.links;
                self.phase = Phase::Refreshing { why: Refresh::Chain, rotating: false };
                out.push(Command::GrantLease);
            }
            None => {
                self.phase = Phase::Marking;
                out.push(Command::Mark { account: self.account.clone() });
            }
        }
    }

    fn grant_given(&mut self, token: i64) {
        self.generations += 1;
        self.grant = Some(Grant { token, generation: self.generations });
    }

    fn refreshed(&mut self, out: &mut Vec<Command>, why: Refresh) {
        match why {
            Refresh::Chain => {
                out.push(Command::Probe(Probe::GrantChained));
                self.granted(out);
            }
            Refresh::Post(acked) => self.post(out, acked),
        }
    }

    /// How a run whose acquire (or chained rotate) was refused ends: `Reset` after an unknown
    /// outcome (the session refuses the key from then on), else `Busy`; an account another
    /// executor holds (`LOCK_CONTENDED`) leaves the shared scan.
    fn not_granted(&mut self, out: &mut Vec<Command>, e: LockRefusal) {
        let key = lock_key(&self.account);
        if e.ambiguous {
            out.push(Command::Log(Log::SessionReset { key, cause: e.text }));
            return self.done(out, Pass::Reset);
        }
        if e.code == Some(ErrorCode::LockContended) {
            out.push(Command::ForgetAccount { account: self.account.clone() });
        }
        out.push(Command::Log(Log::AccountBusy { key, cause: e.text }));
        self.done(out, Pass::Busy)
    }

    /// The run holds its first grant (acquired, or the chain's, refreshed).
    fn granted(&mut self, out: &mut Vec<Command>) {
        // This run's payouts are the chain's next; its grant may be kept for one more run
        // while that stays within `executor.chain-payouts-max`.
        let n = u32::try_from(self.members.len()).unwrap_or(u32::MAX);
        self.links = self.links.saturating_add(n);
        self.keep = self.keep_asked && self.links < self.limits.chain_payouts_max;
        if !self.owner_valid {
            out.push(Command::Log(Log::OwnerInvalid));
            return self.finish_into(out, Outcome::Unavailable);
        }
        if self.batch() {
            let Some(key) = batch_key("claims", self.token()) else {
                return self.finish_into(out, Outcome::Unavailable);
            };
            return self.check_lease(out, Next::ClaimBatch { key });
        }
        // FR-14: a PENDING or CLAIMED candidate's re-read is its fenced claim (expected
        // state from the scan); any other is read first. Only a hint; the fenced write decides.
        let m = self.members[0].clone();
        match m.state {
            PayoutState::Pending | PayoutState::Claimed => self.claim(out, m.state, None),
            _ => self.read(out, false),
        }
    }

    fn token(&self) -> i64 {
        self.grant.map(|g| g.token).expect("the run holds a grant")
    }

    fn single(&self) -> Uuid {
        assert!(!self.batch(), "a single payout's step");
        self.members[0].payout_id
    }

    fn check_lease(&mut self, out: &mut Vec<Command>, next: Next) {
        self.phase = Phase::Checking(next);
        out.push(Command::CheckLease);
    }

    fn read(&mut self, out: &mut Vec<Command>, terms: bool) {
        self.phase = Phase::Reading { terms };
        out.push(Command::Read { payout_id: self.single() });
    }

    /// A single payout's P4 answer, read to act on its state.
    fn read_to_act(&mut self, out: &mut Vec<Command>, view: Option<View>) {
        let Some(view) = view else {
            return self.finish_into(out, Outcome::Unavailable);
        };
        match view.state {
            s @ (PayoutState::Pending | PayoutState::Claimed) => self.claim(out, s, Some(view.terms)),
            PayoutState::RailAcked => match view.acked {
                Some((submission_id, rail_reference)) => {
                    let acked = Acked { payout_id: self.single(), submission_id, rail_reference };
                    self.post(out, vec![acked])
                }
                None => self.finish_into(out, Outcome::Unavailable),
            },
            _ => {
                // Nothing to do here: released, no outcome.
                self.release(out, false);
                self.done(out, Pass::Done)
            }
        }
    }

    /// Claims the single payout from `expected` (`view`: its terms as just read; `None`
    /// when the state is the scan's and the claim is the re-read).
    fn claim(&mut self, out: &mut Vec<Command>, expected: PayoutState, view: Option<Terms>) {
        let Some(key) = write_key(self.single()) else {
            return self.finish_into(out, Outcome::Unavailable);
        };
        self.check_lease(out, Next::Claim { expected, view, key });
    }

    /// The write a lease check allowed.
    fn write(&mut self, out: &mut Vec<Command>, next: Next) {
        let token = self.token();
        match next {
            Next::Claim { expected, view, key } => {
                self.phase = Phase::Claiming { expected, view };
                out.push(Command::Claim { payout_id: self.single(), key, expected_state: expected, token });
            }
            Next::ClaimBatch { key } => {
                self.phase = Phase::ClaimingBatch;
                out.push(Command::ClaimBatch {
                    account: self.account.clone(),
                    key,
                    members: self.members.clone(),
                    token,
                });
            }
            Next::Submit { terms, key } => {
                self.submit_once();
                self.phase = Phase::Submitting { token };
                out.push(Command::Submit { payout_id: self.single(), key, terms, token });
            }
            Next::SubmitBatch { claimed } => {
                let mut submissions = Vec::with_capacity(claimed.len());
                for (payout_id, terms) in claimed {
                    let Some(key) = write_key(payout_id) else {
                        self.set(payout_id, Outcome::Unavailable);
                        continue;
                    };
                    submissions.push(Submission { payout_id, key, terms });
                }
                self.submit_once();
                let sent = submissions.iter().map(|s| s.payout_id).collect();
                self.phase = Phase::SubmittingBatch { token, sent };
                out.push(Command::SubmitBatch { account: self.account.clone(), submissions, token });
            }
            Next::Post { acked } => {
                let Some(key) = write_key(acked.payout_id) else {
                    return self.finish_into(out, Outcome::Unavailable);
                };
                self.post_under_a_newer_grant();
                let rotate = self.keep;
                self.phase = Phase::Posting { acked: vec![acked.clone()], token, rotate };
                out.push(Command::Post { acked, key, token, rotate });
                self.beside(rotate);
            }
            Next::PostBatch { acked, key } => {
                self.post_under_a_newer_grant();
                let rotate = self.keep;
                self.phase = Phase::Posting { acked: acked.clone(), token, rotate };
                out.push(Command::PostBatch { account: self.account.clone(), key, acked, token, rotate });
                self.beside(rotate);
            }
        }
    }

    fn submit_once(&mut self) {
        assert!(!self.submitted, "a run submits at most once");
        assert!(self.claimed_under.is_some(), "a run submits only what it claimed");
        self.submitted = true;
        // The rotate beside the submission ends the belief in the claim's grant.
        self.grant = None;
    }

    fn post_under_a_newer_grant(&mut self) {
        let generation = self.grant.map(|g| g.generation);
        assert!(
            self.claimed_under.is_none() || self.claimed_under != generation,
            "the post is never sent under the grant that claimed (C-10)"
        );
    }

    /// A post that rotates its grant beside it gives the grant up to the rotate (a post
    /// that does not still holds it, to release once it answered).
    fn beside(&mut self, rotate: bool) {
        if rotate {
            self.grant = None;
        }
    }

    /// A single claim's answer.
    fn claimed(
        &mut self,
        out: &mut Vec<Command>,
        expected: PayoutState,
        view: Option<Terms>,
        answer: Result<Option<Terms>, Refusal>,
    ) {
        let token = self.token();
        let terms = match answer {
            Ok(terms) => terms,
            Err(r) => {
                return match r.code {
                    Some(ErrorCode::FencedOut) => {
                        out.push(Command::Log(Log::FencedOut { hop: Write::Claim, token, fence: r.fence }));
                        self.finish_into(out, Outcome::Fenced)
                    }
                    // The scan was stale; the refusal names the state now (FR-14). Paid
                    // already (RAIL_ACKED): read it and post. Anything else ends the run: a
                    // second claim under this grant and key would be a second request with one
                    // identity (a CLAIMED payout is re-claimed from a later scan, under a
                    // newer grant).
                    Some(ErrorCode::PayoutNotClaimable)
                        if view.is_none() && r.state == Some(PayoutState::RailAcked) =>
                    {
                        self.read(out, false)
                    }
                    Some(ErrorCode::PayoutNotClaimable) => self.finish_into(out, Outcome::NotClaimable),
                    Some(ErrorCode::InsufficientFunds) => self.finish_into(out, Outcome::Failed),
                    _ => {
                        let about = About::Payout(self.single());
                        out.push(Command::Log(Log::ClaimUndecided { about, answer: r.text }));
                        self.finish_into(out, Outcome::Unavailable)
                    }
                };
            }
        };
        self.claimed_under = self.grant.map(|g| g.generation);
        if expected == PayoutState::Claimed {
            // CLAIMED -> CLAIMED under this newer grant: an earlier holder left it (recovery).
            out.push(Command::Probe(Probe::RecoveryReclaim));
        }
        // What the submission carries: the read's, the claim answer's (C-30), or, for a
        // replayed answer recorded without them, a read now.
        match (view, terms) {
            (Some(terms), _) | (None, Some(terms)) => self.submit(out, terms),
            (None, None) => self.read(out, true),
        }
    }

    fn submit(&mut self, out: &mut Vec<Command>, terms: Terms) {
        let Some(key) = write_key(self.single()) else {
            return self.finish_into(out, Outcome::Unavailable);
        };
        self.check_lease(out, Next::Submit { terms, key });
    }

    /// A single submission's answer, and the rotate's beside it.
    fn submitted(
        &mut self,
        out: &mut Vec<Command>,
        token: i64,
        answer: Result<Acked, Refusal>,
        rotated: Result<i64, LockRefusal>,
    ) {
        let payout_id = self.single();
        match (answer, rotated) {
            (Err(r), rotated) => {
                let outcome = self.refused_submission(out, payout_id, token, &r);
                self.set(payout_id, outcome);
                if let Ok(newer) = rotated {
                    self.grant_given(newer);
                    self.release(out, false);
                }
                self.done(out, Pass::Done)
            }
            (Ok(acked), Ok(newer)) => {
                assert_eq!(acked.payout_id, payout_id, "an acknowledgement of the payout submitted");
                self.grant_given(newer);
                self.refresh_for_the_post(out, vec![acked]);
            }
            // Paid and RAIL_ACKED: a later scan posts it.
            (Ok(acked), Err(e)) => self.post_deferred(out, &[acked], e.text),
        }
    }

    /// The grant rotated beside the submission, checked for a post's worth of lease.
    fn refresh_for_the_post(&mut self, out: &mut Vec<Command>, acked: Vec<Acked>) {
        self.phase = Phase::Refreshing { why: Refresh::Post(acked), rotating: false };
        out.push(Command::GrantLease);
    }

    /// The acknowledged payouts are left RAIL_ACKED for a later scan to post.
    fn post_deferred(&mut self, out: &mut Vec<Command>, acked: &[Acked], cause: String) {
        assert!(self.grant.is_none(), "a post is deferred only when no grant is left for it");
        let about = if self.batch() { About::Account(self.account.clone()) } else { About::Payout(self.single()) };
        out.push(Command::Log(Log::PostDeferred { about, cause }));
        for a in acked {
            self.set(a.payout_id, Outcome::Unavailable);
        }
        self.done(out, Pass::Done)
    }

    /// What a refused submission comes to. Nothing here submits again: not after a lost
    /// answer, not after `RAIL_AMBIGUOUS`, not after a 503 (C3 §3.8: zero retries, ever).
    fn refused_submission(&self, out: &mut Vec<Command>, payout_id: Uuid, token: i64, r: &Refusal) -> Outcome {
        match r.code {
            Some(ErrorCode::FencedOut) => {
                out.push(Command::Log(Log::FencedOut { hop: Write::Submit, token, fence: r.fence.clone() }));
                Outcome::Fenced
            }
            Some(ErrorCode::DuplicateSubmission) => {
                out.push(Command::Log(Log::DuplicateSubmission { payout_id, token }));
                Outcome::Duplicate
            }
            Some(ErrorCode::RailAmbiguous) => {
                let submission_id = r.submission_id.clone().unwrap_or_default();
                out.push(Command::Log(Log::RailAmbiguous { payout_id, submission_id, token }));
                Outcome::Ambiguous
            }
            _ if r.status == Some(422) => Outcome::Failed,
            Some(ErrorCode::PayoutNotClaimable) => Outcome::NotClaimable,
            _ => match &r.lost {
                Some(cause) => {
                    out.push(Command::Log(Log::SubmissionAnswerLost { payout_id, cause: cause.clone() }));
                    Outcome::AnswerLost
                }
                None => {
                    out.push(Command::Log(Log::SubmissionUndecided { payout_id, answer: r.text.clone() }));
                    Outcome::Unavailable
                }
            },
        }
    }

    /// The post of `acked` under the grant held (single: after its lease check; batch:
    /// after its key, then its lease check).
    fn post(&mut self, out: &mut Vec<Command>, acked: Vec<Acked>) {
        if !self.batch() {
            let [acked] = <[Acked; 1]>::try_from(acked).expect("a single payout posts one acknowledgement");
            return self.check_lease(out, Next::Post { acked });
        }
        let Some(key) = batch_key("posts", self.token()) else {
            self.rest(Outcome::Unavailable);
            self.release(out, true);
            return self.done(out, Pass::Done);
        };
        self.check_lease(out, Next::PostBatch { acked, key });
    }

    /// A single post's answer, and the rotate's beside it when it keeps its grant.
    fn posted(
        &mut self,
        out: &mut Vec<Command>,
        acked: &[Acked],
        token: i64,
        answer: Result<(), Refusal>,
        rotated: Option<Result<i64, LockRefusal>>,
    ) {
        let payout_id = self.single();
        assert!(acked.len() == 1 && acked[0].payout_id == payout_id, "a single post posts its payout");
        let outcome = match answer {
            Ok(()) => Outcome::Posted,
            Err(r) => match r.code {
                Some(ErrorCode::FencedOut) => {
                    out.push(Command::Log(Log::FencedOut { hop: Write::Post, token, fence: r.fence }));
                    Outcome::Fenced
                }
                Some(ErrorCode::PayoutNotClaimable) => Outcome::NotClaimable,
                _ => {
                    out.push(Command::Log(Log::PostUndecided { about: About::Payout(payout_id), answer: r.text }));
                    Outcome::Unavailable
                }
            },
        };
        self.set(payout_id, outcome);
        self.after_post(out, acked, outcome == Outcome::Posted, rotated, About::Payout(payout_id));
    }

    /// A batch post's answer, and the rotate's beside it when it keeps its grant.
    fn posted_batch(
        &mut self,
        out: &mut Vec<Command>,
        acked: &[Acked],
        token: i64,
        answer: Result<Batch<PostItem>, Refusal>,
        rotated: Option<Result<i64, LockRefusal>>,
    ) {
        if rotated.is_none() {
            // Nothing fenced follows: the release leaves the critical path once the post
            // answered.
            self.release(out, true);
        }
        let mut all_posted = true;
        match answer {
            Err(r) => {
                all_posted = false;
                if r.code == Some(ErrorCode::FencedOut) {
                    out.push(Command::Log(Log::FencedOut { hop: Write::Post, token, fence: r.fence }));
                    self.rest(Outcome::Fenced);
                } else {
                    let about = About::Account(self.account.clone());
                    out.push(Command::Log(Log::PostUndecided { about, answer: r.text }));
                    self.rest(Outcome::Unavailable);
                }
            }
            Ok(answer) => {
                for a in acked {
                    let outcome = match answer.item(&self.account, token, a.payout_id) {
                        Some(item) if (200..300).contains(&item.status) => Outcome::Posted,
                        Some(item) if item.code == Some(ErrorCode::PayoutNotClaimable) => Outcome::NotClaimable,
                        other => {
                            let status = other.map(|i| i.status);
                            out.push(Command::Log(Log::PostItemUndecided { payout_id: a.payout_id, status }));
                            Outcome::Unavailable
                        }
                    };
                    all_posted &= outcome == Outcome::Posted;
                    self.set(a.payout_id, outcome);
                }
            }
        }
        if self.outcomes.iter().filter(|o| **o == Some(Outcome::Posted)).count() >= 2 {
            out.push(Command::Probe(Probe::BatchPosted));
        }
        self.after_post(out, acked, all_posted, rotated, About::Account(self.account.clone()));
    }

    /// After a post: the grant rotated beside it is kept when every payout posted (else
    /// released in the background); without a rotate, the post's grant is released in the
    /// background (a batch released it before reading the answer). A failed rotate ends the
    /// chain: the next run of the account acquires (an unknown outcome leaves the key
    /// refused by this session, and that acquire resets it).
    fn after_post(
        &mut self,
        out: &mut Vec<Command>,
        acked: &[Acked],
        posted: bool,
        rotated: Option<Result<i64, LockRefusal>>,
        about: About,
    ) {
        match rotated {
            None => {
                if self.grant.is_some() {
                    self.release(out, true);
                }
                self.done(out, Pass::Done)
            }
            Some(Ok(next)) => {
                self.grant_given(next);
                if posted {
                    return self.keep_grant(out, acked);
                }
                self.release(out, true);
                self.done(out, Pass::Done)
            }
            Some(Err(e)) => {
                out.push(Command::Log(Log::ChainRotateFailed { about, cause: e.text }));
                self.done(out, Pass::Done)
            }
        }
    }

    /// A batch claim's answer.
    fn claimed_batch(&mut self, out: &mut Vec<Command>, answer: Result<Batch<ClaimItem>, Refusal>) {
        let token = self.token();
        let answer = match answer {
            Ok(answer) => answer,
            Err(r) => {
                if r.code == Some(ErrorCode::FencedOut) {
                    out.push(Command::Log(Log::FencedOut { hop: Write::Claim, token, fence: r.fence }));
                    return self.finish_into(out, Outcome::Fenced);
                }
                // Unknown or refused as a whole: the members stay as they are (a claimed one
                // is re-claimed from a later scan, under a newer grant).
                let about = About::Account(self.account.clone());
                out.push(Command::Log(Log::ClaimUndecided { about, answer: r.text }));
                return self.finish_into(out, Outcome::Unavailable);
            }
        };
        let mut claimed = Vec::new();
        for m in self.members.clone() {
            let Some(item) = answer.item(&self.account, token, m.payout_id) else {
                self.set(m.payout_id, Outcome::Unavailable);
                continue;
            };
            match (&item.terms, item.code) {
                (Some(terms), _) if terms.account_id == self.account => {
                    if m.state == PayoutState::Claimed {
                        out.push(Command::Probe(Probe::RecoveryReclaim));
                    }
                    claimed.push((m.payout_id, terms.clone()));
                }
                (_, Some(ErrorCode::InsufficientFunds)) => self.set(m.payout_id, Outcome::Failed),
                (_, Some(ErrorCode::PayoutNotClaimable | ErrorCode::NotFound)) => {
                    self.set(m.payout_id, Outcome::NotClaimable)
                }
                _ => {
                    out.push(Command::Log(Log::ClaimItemUndecided { payout_id: m.payout_id, status: item.status }));
                    self.set(m.payout_id, Outcome::Unavailable);
                }
            }
        }
        if claimed.is_empty() {
            return self.finish_into(out, Outcome::Unavailable);
        }
        self.claimed_under = self.grant.map(|g| g.generation);
        self.check_lease(out, Next::SubmitBatch { claimed });
    }

    /// A batch submission's answer, and the rotate's beside it.
    fn submitted_batch(
        &mut self,
        out: &mut Vec<Command>,
        token: i64,
        sent: &[Uuid],
        answer: Result<Batch<SubmitItem>, Refusal>,
        rotated: Result<i64, LockRefusal>,
    ) {
        let mut acked = Vec::new();
        match answer {
            Err(r) => {
                let outcome = self.refused_submission(out, Uuid::nil(), token, &r);
                self.rest(outcome);
            }
            Ok(answer) => {
                for &payout_id in sent {
                    let Some(item) = answer.item(&self.account, token, payout_id) else {
                        self.set(payout_id, Outcome::Unavailable);
                        continue;
                    };
                    match &item.acked {
                        Some(a) if a.payout_id == payout_id => acked.push(a.clone()),
                        _ => {
                            let outcome = self.refused_submission(out, payout_id, token, &item.refusal);
                            self.set(payout_id, outcome);
                        }
                    }
                }
            }
        }
        match rotated {
            Ok(newer) if acked.is_empty() => {
                self.grant_given(newer);
                self.release(out, true);
                self.done(out, Pass::Done)
            }
            Ok(newer) => {
                self.grant_given(newer);
                self.refresh_for_the_post(out, acked);
            }
            // Paid and RAIL_ACKED: a later scan posts them.
            Err(e) => self.post_deferred(out, &acked, e.text),
        }
    }

    /// Every payout without an outcome yet ends as `o`.
    fn rest(&mut self, o: Outcome) {
        for slot in &mut self.outcomes {
            slot.get_or_insert(o);
        }
    }

    fn set(&mut self, payout_id: Uuid, o: Outcome) {
        let at = self.members.iter().position(|m| m.payout_id == payout_id);
        let slot = at.map(|i| &mut self.outcomes[i]).expect("an outcome is of a member");
        assert!(slot.is_none(), "payout {payout_id} ended twice in one run");
        *slot = Some(o);
    }

    fn release(&mut self, out: &mut Vec<Command>, background: bool) {
        assert!(self.grant.take().is_some(), "a release is of a grant held");
        out.push(Command::Release { background });
    }

    /// The payouts still open end as `o`; the grant is released in line.
    fn finish_into(&mut self, out: &mut Vec<Command>, o: Outcome) {
        self.rest(o);
        self.release(out, false);
        self.done(out, Pass::Done)
    }

    fn keep_grant(&mut self, out: &mut Vec<Command>, acked: &[Acked]) {
        assert!(self.keep && self.grant.is_some(), "only a run allowed to keep its grant keeps one");
        for a in acked {
            let at = self.members.iter().position(|m| m.payout_id == a.payout_id);
            assert!(at.is_some_and(|i| self.outcomes[i] == Some(Outcome::Posted)), "only a posted run keeps its grant");
        }
        self.end(out, Pass::Done, Some(self.links));
    }

    fn done(&mut self, out: &mut Vec<Command>, pass: Pass) {
        assert!(self.grant.is_none(), "a run ends holding no grant it does not keep");
        self.end(out, pass, None);
    }

    fn end(&mut self, out: &mut Vec<Command>, pass: Pass, kept_links: Option<u32>) {
        if self.batch() && pass == Pass::Done {
            // A batch ends with one outcome per member.
            self.rest(Outcome::Unavailable);
        }
        let outcomes =
            self.members.iter().zip(&self.outcomes).filter_map(|(m, o)| o.map(|o| (m.payout_id, o))).collect();
        self.phase = Phase::Done;
        out.push(Command::Done(End { outcomes, pass, kept_links }));
    }
}

#[cfg(test)]
mod scripts;
