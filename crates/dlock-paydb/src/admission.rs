//! The admission decision of C3 §3.5, once: fence, duplicate, intent, as pure functions
//! from the facts a store read to the decision it applies. No I/O, no clock reads, no
//! randomness; tokens compare as exact integers.
//!
//! It lives in `dlock-paydb`, below the services, because [`crate::mem::RailTables::admit`]
//! applies it here (the proxy's simulation store and the payment-resource's [`crate::MemPaydb`]
//! share that code); the rail-proxy's `admission` module re-exports it.
//!
//! Every store (SQLite, PostgreSQL, the simulation store) reads the facts in its one
//! transaction and applies the decision; in SQL the statements stay the race authority (the
//! mark's `ON CONFLICT … WHERE highest_token < EXCLUDED.highest_token`, the unique index over
//! forwardable attempts, `UPDATE payouts … WHERE state IN …`), and the store calls the step
//! functions here to choose its answer from what each statement revealed. An answer the
//! rule would not give is corrupt content, never a guess.
//!
//! ## Invariants (asserted in release builds too)
//! - **The mark only rises**, and only to a token strictly greater than it (`>`, never `>=`:
//!   an equal-token retry after a timeout must lose) ([`advanced_mark`]).
//! - **Order**: fence, then duplicate, then intent. A fenced attempt never reaches the
//!   duplicate check; a duplicate raises the mark (step 1 committed) but never moves the
//!   payout; a payout the proxy may not submit ([`payout::may_transition`] CLAIMED →
//!   SUBMITTED) changes nothing at all.
//!
//!
//! **Batches** (C3-extensions E-19): [`decide_batch_admission`] decides several payouts of
//! one account under one token with **one** [`mark_verdict`], then each payout, in the
//! request's order, exactly as [`decide_admission`] decides it after that verdict: all
//! fenced when the mark fences; otherwise, per payout, duplicate, not claimable or admitted.
//! The mark is written once, when at least one payout passed step 1 (a duplicate or an
//! admission); a batch whose every payout is not claimable writes nothing, as a single
//! not-claimable attempt writes nothing. A batch of one decides exactly as
//! [`decide_admission`] (property-tested). Each payout's decision reads only its own facts
//! (its forwardable slot and its state): the payouts of a batch are distinct, and a payout's
//! writes touch no other payout's facts.
//!
//! Defence in depth: step 1 ([`mark_verdict`]) is where the rail-mark layer decides, and
//! step 2 ([`decide_admission`]) where the duplicate guard does
//! ([`dlock_contract::defence`], `Layer::RailMark`, `Layer::DuplicateGuard`). Only a
//! simulation campaign can switch one off: a switched-off mark is [`MarkVerdict::Skipped`]
//! for the token it would have fenced (the mark does not move); a switched-off guard lets
//! the attempt on to step 3, the state check.

use chrono::{DateTime, Utc};
use dlock_contract::defence::{self, Layer};
use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_contract::planted::{self, Bug};
use uuid::Uuid;

use crate::rail::Admission;

/// Step 1: what the mark says about a presented token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkVerdict {
    /// Strictly greater than the mark (or no mark yet): the mark advances to `to`.
    Advance { to: i64 },
    /// Equal or lower: a FENCED row, and no rail call.
    Fenced { highest_token: i64 },
    /// `rail.proxy.fencing.enabled = false` (only under `--profile unsafe-test`).
    Skipped,
}

/// Step 1, the fence: the mark for the account (`None`: no attempt yet) against the token.
pub fn mark_verdict(fencing_enabled: bool, mark: Option<i64>, presented: i64) -> MarkVerdict {
    if !fencing_enabled {
        return MarkVerdict::Skipped;
    }
    match mark {
        // Planted bug `mark-ge` (simulation only): `>=` where `>` belongs, so a token equal to
        // the mark passes (and the mark stays where it is).
        Some(highest) if highest == presented && planted::on(Bug::MarkGe) => MarkVerdict::Advance { to: presented },
        Some(highest) if highest >= presented => {
            if defence::stops(Layer::RailMark, true) {
                MarkVerdict::Fenced { highest_token: highest }
            } else {
                // The simulation switched the mark off: the token is not compared, and the
                // mark stays where it is.
                MarkVerdict::Skipped
            }
        }
        _ => MarkVerdict::Advance { to: advanced_mark(mark, presented) },
    }
}

/// The mark after an advance to `presented`. Asserts it rose strictly.
pub fn advanced_mark(mark: Option<i64>, presented: i64) -> i64 {
    assert!(mark.is_none_or(|m| presented > m), "mark would not rise: {mark:?} -> {presented}");
    presented
}

/// The account's one forwardable attempt (outcome NULL, ACKED, REJECTED or TIMEOUT) for the
/// payout, if there is one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FirstAttempt {
    pub submission_id: Uuid,
    pub submitted_at: DateTime<Utc>,
}

/// Step 3, the intent: whether the proxy may move a payout in `state` to SUBMITTED.
pub fn may_submit(state: PayoutState) -> bool {
    payout::may_transition(state, PayoutState::Submitted, Actor::RailProxy)
}

/// What one attempt's transaction read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionFacts {
    pub fencing_enabled: bool,
    pub mark: Option<i64>,
    pub presented_token: i64,
    pub first_forwardable: Option<FirstAttempt>,
    /// The payout's state (`None`: the payout row is gone).
    pub state: Option<PayoutState>,
}

/// What the transaction applies. `mark` is the account's new mark to write (`None`: leave it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdmissionDecision {
    /// Write a FENCED row; commit. The mark does not move.
    Fenced { highest_token: i64 },
    /// Write a DUPLICATE row and the advanced mark; commit. The payout does not move.
    Duplicate { first: FirstAttempt, mark: Option<i64> },
    /// Write nothing (roll back).
    NotClaimable { state: PayoutState },
    /// Write the intent row (outcome NULL), the mark, and move the payout to SUBMITTED with
    /// `attempt_count + 1`; commit before any socket opens.
    Admit { mark: Option<i64> },
    /// The payout row is gone (the caller read it before): corrupt content, roll back.
    Vanished,
}

impl AdmissionDecision {
    /// The answer the store returns (`None` for [`AdmissionDecision::Vanished`]).
    pub fn admission(&self, at: DateTime<Utc>) -> Option<Admission> {
        Some(match *self {
            AdmissionDecision::Fenced { highest_token } => Admission::Fenced { highest_token },
            AdmissionDecision::Duplicate { first, .. } => Admission::Duplicate {
                first_submitted_at: first.submitted_at,
                first_submission_id: first.submission_id,
            },
            AdmissionDecision::NotClaimable { state } => Admission::NotClaimable { state },
            AdmissionDecision::Admit { .. } => Admission::Admitted { submitted_at: at },
            AdmissionDecision::Vanished => return None,
        })
    }
}

/// Steps 1–3 in order, on one snapshot.
pub fn decide_admission(f: &AdmissionFacts) -> AdmissionDecision {
    let verdict = mark_verdict(f.fencing_enabled, f.mark, f.presented_token);
    decide_after_verdict(verdict, &PayoutFacts { first_forwardable: f.first_forwardable, state: f.state })
}

/// Steps 2–3 of one payout after step 1's `verdict` (the one place both rules decide them).
fn decide_after_verdict(verdict: MarkVerdict, p: &PayoutFacts) -> AdmissionDecision {
    let mark = match verdict {
        MarkVerdict::Fenced { highest_token } => return AdmissionDecision::Fenced { highest_token },
        MarkVerdict::Advance { to } => Some(to),
        MarkVerdict::Skipped => None,
    };
    if let Some(first) = p.first_forwardable {
        if defence::stops(Layer::DuplicateGuard, true) {
            return AdmissionDecision::Duplicate { first, mark };
        }
    }
    match p.state {
        None => AdmissionDecision::Vanished,
        Some(state) if !may_submit(state) => AdmissionDecision::NotClaimable { state },
        Some(_) => AdmissionDecision::Admit { mark },
    }
}

/// What a batch's transaction read of one of its payouts (the mark and the token are the
/// batch's, [`BatchFacts`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PayoutFacts {
    pub first_forwardable: Option<FirstAttempt>,
    /// The payout's state (`None`: the payout row is gone).
    pub state: Option<PayoutState>,
}

/// What a batch's one transaction read (C3-extensions E-19): the account's mark once, and
/// each payout's facts in the request's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchFacts {
    pub fencing_enabled: bool,
    pub mark: Option<i64>,
    pub presented_token: i64,
    pub payouts: Vec<PayoutFacts>,
}

/// What a batch's transaction applies: each payout's decision, in the request's order, and
/// the account's new mark, written once (`None`: leave it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchDecision {
    pub decisions: Vec<AdmissionDecision>,
    pub mark: Option<i64>,
}

impl BatchDecision {
    /// Whether the mark fenced the batch: then every decision is [`AdmissionDecision::Fenced`].
    pub fn fenced(&self) -> Option<i64> {
        match self.decisions.first() {
            Some(AdmissionDecision::Fenced { highest_token }) => Some(*highest_token),
            _ => None,
        }
    }
}

/// The mark a decision writes, if it passed step 1 (a duplicate or an admission).
fn mark_written(d: &AdmissionDecision) -> Option<Option<i64>> {
    match d {
        AdmissionDecision::Duplicate { mark, .. } | AdmissionDecision::Admit { mark } => Some(*mark),
        _ => None,
    }
}

/// A batch (C3-extensions E-19): one [`mark_verdict`] for the batch's token, then each
/// payout in order as [`decide_admission`] decides it after that verdict. The mark to
/// write is the one the passing payouts carry, once; none when no payout passed step 1.
/// Asserts (in release builds too) that a fenced batch fences every payout and that every
/// passing payout carries the same mark.
pub fn decide_batch_admission(f: &BatchFacts) -> BatchDecision {
    let verdict = mark_verdict(f.fencing_enabled, f.mark, f.presented_token);
    let decisions: Vec<AdmissionDecision> = f.payouts.iter().map(|p| decide_after_verdict(verdict, p)).collect();
    let mut passed = decisions.iter().filter_map(mark_written);
    let mark = passed.next().flatten();
    assert!(passed.all(|m| m == mark), "a batch passes step 1 once, with one mark");
    let fenced = decisions.iter().filter(|d| matches!(d, AdmissionDecision::Fenced { .. })).count();
    assert!(fenced == 0 || fenced == decisions.len(), "a batch is fenced whole or not at all");
    BatchDecision { decisions, mark }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    #[should_panic(expected = "mark would not rise")]
    fn an_equal_token_never_advances_the_mark_in_release_builds() {
        advanced_mark(Some(9), 9);
    }

    #[test]
    fn an_equal_token_is_fenced_and_disabled_fencing_skips_the_mark() {
        assert_eq!(mark_verdict(true, Some(9), 9), MarkVerdict::Fenced { highest_token: 9 });
        assert_eq!(mark_verdict(true, Some(9), 10), MarkVerdict::Advance { to: 10 });
        assert_eq!(mark_verdict(true, None, 1), MarkVerdict::Advance { to: 1 });
        assert_eq!(mark_verdict(false, Some(9), 1), MarkVerdict::Skipped);
    }

    /// Attempts and rail outcomes on one account's payouts.
    #[derive(Debug, Clone)]
    enum Op {
        /// Payout, token.
        Attempt(usize, i64),
        /// Resolve the payout's open attempt: 0 ACKED, 1 REJECTED, 2 TIMEOUT, 3 UNSENT.
        Resolve(usize, u8),
        /// A worker re-claims a payout an UNSENT left CLAIMED, or the payment-resource
        /// claims a PENDING one.
        Claim(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..3, 0i64..12).prop_map(|(p, t)| Op::Attempt(p, t)),
            (0usize..3, 0u8..4).prop_map(|(p, o)| Op::Resolve(p, o)),
            (0usize..3).prop_map(Op::Claim),
        ]
    }

    /// One attempt in the reference history.
    #[derive(Debug, Clone)]
    struct Tried {
        payout: usize,
        token: i64,
        /// Passed step 1 (admitted or duplicate).
        passed_fence: bool,
        admitted: bool,
        /// 0..=3 as in [`Op::Resolve`], once resolved.
        outcome: Option<u8>,
    }

    proptest! {
        /// The decision over random schedules, against a reference that recomputes from the
        /// whole history: fenced iff the token does not exceed every token that ever passed
        /// the fence; duplicate iff an admitted attempt of the payout is not UNSENT; admitted
        /// iff neither and the payout is CLAIMED. The mark never decreases; at most one
        /// forwardable attempt per payout.
        #[test]
        fn admission_matches_the_history_model(ops in proptest::collection::vec(op(), 1..80)) {
            let at = DateTime::<Utc>::UNIX_EPOCH;
            let mut states = [PayoutState::Pending, PayoutState::Claimed, PayoutState::Claimed];
            let mut mark: Option<i64> = None;
            let mut hist: Vec<Tried> = Vec::new();
            for op in ops {
                match op {
                    Op::Attempt(p, token) => {
                        let open = |h: &Tried| h.payout == p && h.admitted && h.outcome != Some(3);
                        let first = hist.iter().position(open).map(|i| FirstAttempt {
                            submission_id: Uuid::from_u128(i as u128),
                            submitted_at: at,
                        });
                        let facts = AdmissionFacts {
                            fencing_enabled: true,
                            mark,
                            presented_token: token,
                            first_forwardable: first,
                            state: Some(states[p]),
                        };
                        let d = decide_admission(&facts);
                        let fenced = !hist.iter().filter(|h| h.passed_fence).all(|h| token > h.token);
                        let duplicate = !fenced && hist.iter().any(open);
                        let admitted = !fenced && !duplicate && states[p] == PayoutState::Claimed;
                        match d {
                            AdmissionDecision::Fenced { highest_token } => {
                                prop_assert!(fenced);
                                prop_assert_eq!(Some(highest_token), mark);
                            }
                            AdmissionDecision::Duplicate { mark: m, .. } => {
                                prop_assert!(duplicate);
                                prop_assert!(m > mark);
                                mark = m;
                            }
                            AdmissionDecision::NotClaimable { state } => {
                                prop_assert!(!fenced && !duplicate && !admitted);
                                prop_assert_eq!(state, states[p]);
                            }
                            AdmissionDecision::Vanished => prop_assert!(false, "the payout exists"),
                            AdmissionDecision::Admit { mark: m } => {
                                prop_assert!(admitted);
                                prop_assert!(m > mark);
                                mark = m;
                                states[p] = PayoutState::Submitted;
                            }
                        }
                        let passed = matches!(d, AdmissionDecision::Duplicate { .. } | AdmissionDecision::Admit { .. });
                        let admitted = matches!(d, AdmissionDecision::Admit { .. });
                        hist.push(Tried { payout: p, token, passed_fence: passed, admitted, outcome: None });
                    }
                    Op::Resolve(p, o) => {
                        if let Some(h) = hist.iter_mut().find(|h| h.payout == p && h.admitted && h.outcome.is_none()) {
                            h.outcome = Some(o);
                            let to = [PayoutState::RailAcked, PayoutState::Failed, PayoutState::RailAmbiguous, PayoutState::Claimed][usize::from(o)];
                            prop_assert!(payout::may_transition(states[p], to, Actor::RailProxy));
                            states[p] = to;
                        }
                    }
                    Op::Claim(p) => {
                        if states[p] == PayoutState::Pending {
                            states[p] = PayoutState::Claimed;
                        }
                    }
                }
                for p in 0..3 {
                    let forwardable = hist.iter().filter(|h| h.payout == p && h.admitted && h.outcome != Some(3)).count();
                    prop_assert!(forwardable <= 1, "payout {} has {} forwardable attempts", p, forwardable);
                }
            }
        }
    }

    fn first_attempt() -> impl Strategy<Value = Option<FirstAttempt>> {
        proptest::option::of((0u128..4, 0i64..3).prop_map(|(id, ms)| FirstAttempt {
            submission_id: Uuid::from_u128(id),
            submitted_at: DateTime::<Utc>::UNIX_EPOCH + chrono::Duration::milliseconds(ms),
        }))
    }

    fn payout_facts() -> impl Strategy<Value = PayoutFacts> {
        let state = proptest::option::of(proptest::sample::select(PayoutState::ALL.to_vec()));
        (first_attempt(), state).prop_map(|(first_forwardable, state)| PayoutFacts { first_forwardable, state })
    }

    #[test]
    fn an_empty_batch_decides_nothing_and_writes_no_mark() {
        let f = BatchFacts { fencing_enabled: true, mark: Some(3), presented_token: 9, payouts: vec![] };
        assert_eq!(decide_batch_admission(&f), BatchDecision { decisions: vec![], mark: None });
    }

    #[test]
    fn a_batch_passes_the_mark_once_for_all_its_payouts() {
        let claimed = PayoutFacts { first_forwardable: None, state: Some(PayoutState::Claimed) };
        let f = BatchFacts { fencing_enabled: true, mark: Some(3), presented_token: 4, payouts: vec![claimed; 3] };
        let d = decide_batch_admission(&f);
        assert_eq!(d.decisions, vec![AdmissionDecision::Admit { mark: Some(4) }; 3]);
        assert_eq!((d.mark, d.fenced()), (Some(4), None));
        // The same token again is fenced for every payout, whatever each payout's facts.
        let pending = PayoutFacts { first_forwardable: None, state: Some(PayoutState::Pending) };
        let f =
            BatchFacts { fencing_enabled: true, mark: Some(4), presented_token: 4, payouts: vec![claimed, pending] };
        let d = decide_batch_admission(&f);
        assert_eq!(d.decisions, vec![AdmissionDecision::Fenced { highest_token: 4 }; 2]);
        assert_eq!((d.mark, d.fenced()), (None, Some(4)));
        // Only payouts that are not claimable: nothing passed step 1, so no mark is written.
        let f = BatchFacts { fencing_enabled: true, mark: Some(4), presented_token: 5, payouts: vec![pending; 2] };
        assert_eq!(decide_batch_admission(&f).mark, None);
    }

    proptest! {
        /// A batch of one is the single submission: the same decision, and the mark the
        /// single decision writes (a duplicate's or an admission's), for every fact.
        #[test]
        fn a_batch_of_one_decides_exactly_as_the_single_rule(
            fencing_enabled in any::<bool>(),
            mark in proptest::option::of(1i64..12),
            presented_token in 1i64..12,
            p in payout_facts(),
        ) {
            let single = decide_admission(&AdmissionFacts {
                fencing_enabled,
                mark,
                presented_token,
                first_forwardable: p.first_forwardable,
                state: p.state,
            });
            let batch = decide_batch_admission(&BatchFacts { fencing_enabled, mark, presented_token, payouts: vec![p] });
            prop_assert_eq!(&batch.decisions, &vec![single]);
            prop_assert_eq!(batch.mark, mark_written(&single).flatten());
        }

        /// Every payout of a batch decides as a batch of one on the same verdict would: the
        /// batch adds one shared verdict and nothing else.
        #[test]
        fn each_payout_of_a_batch_decides_as_it_would_alone(
            mark in proptest::option::of(1i64..12),
            presented_token in 1i64..12,
            payouts in proptest::collection::vec(payout_facts(), 0..8),
        ) {
            let batch = decide_batch_admission(&BatchFacts { fencing_enabled: true, mark, presented_token, payouts: payouts.clone() });
            for (p, d) in payouts.iter().zip(&batch.decisions) {
                let alone = decide_batch_admission(&BatchFacts { fencing_enabled: true, mark, presented_token, payouts: vec![*p] });
                prop_assert_eq!(&alone.decisions[0], d);
            }
            let passed: Vec<Option<i64>> = batch.decisions.iter().filter_map(mark_written).collect();
            prop_assert_eq!(batch.mark, passed.first().copied().flatten());
        }
    }

    /// A schedule over one account's three payouts: single attempts, batches, rail outcomes
    /// and claims.
    #[derive(Debug, Clone)]
    enum BatchOp {
        /// Payouts (distinct, in request order), token.
        Batch(Vec<usize>, i64),
        Single(usize, i64),
        Resolve(usize, u8),
        Claim(usize),
    }

    fn batch_op() -> impl Strategy<Value = BatchOp> {
        let payouts = proptest::sample::subsequence(vec![0usize, 1, 2], 1..=3).prop_shuffle();
        prop_oneof![
            (payouts, 0i64..12).prop_map(|(ps, t)| BatchOp::Batch(ps, t)),
            (0usize..3, 0i64..12).prop_map(|(p, t)| BatchOp::Single(p, t)),
            (0usize..3, 0u8..4).prop_map(|(p, o)| BatchOp::Resolve(p, o)),
            (0usize..3).prop_map(BatchOp::Claim),
        ]
    }

    proptest! {
        /// Batches and single attempts over random schedules, against a reference that
        /// recomputes from the whole history: a batch is fenced (every payout of it) iff its
        /// token does not exceed every token that ever passed the fence; otherwise each
        /// payout is a duplicate iff it has an admitted attempt that is not UNSENT, admitted
        /// iff neither and CLAIMED, else not claimable; the batch passes the fence (and the
        /// mark rises to its token, once) iff one of its payouts is a duplicate or admitted.
        /// The mark never decreases; at most one forwardable attempt per payout.
        #[test]
        fn batch_admission_matches_the_history_model(ops in proptest::collection::vec(batch_op(), 1..60)) {
            let at = DateTime::<Utc>::UNIX_EPOCH;
            let mut states = [PayoutState::Pending, PayoutState::Claimed, PayoutState::Claimed];
            let mut mark: Option<i64> = None;
            // (payout, token, admitted, outcome), and every token that passed the fence.
            let mut hist: Vec<(usize, i64, bool, Option<u8>)> = Vec::new();
            let mut passed_tokens: Vec<i64> = Vec::new();
            for op in ops {
                let (payouts, token) = match op {
                    BatchOp::Batch(ps, t) => (ps, t),
                    BatchOp::Single(p, t) => (vec![p], t),
                    BatchOp::Resolve(p, o) => {
                        if let Some(h) = hist.iter_mut().find(|h| h.0 == p && h.2 && h.3.is_none()) {
                            h.3 = Some(o);
                            let to = [PayoutState::RailAcked, PayoutState::Failed, PayoutState::RailAmbiguous, PayoutState::Claimed][usize::from(o)];
                            states[p] = to;
                        }
                        continue;
                    }
                    BatchOp::Claim(p) => {
                        if states[p] == PayoutState::Pending {
                            states[p] = PayoutState::Claimed;
                        }
                        continue;
                    }
                };
                let open = |hist: &[(usize, i64, bool, Option<u8>)], p: usize| hist.iter().position(|h| h.0 == p && h.2 && h.3 != Some(3));
                let facts = BatchFacts {
                    fencing_enabled: true,
                    mark,
                    presented_token: token,
                    payouts: payouts
                        .iter()
                        .map(|p| PayoutFacts {
                            first_forwardable: open(&hist, *p).map(|i| FirstAttempt { submission_id: Uuid::from_u128(i as u128), submitted_at: at }),
                            state: Some(states[*p]),
                        })
                        .collect(),
                };
                let d = decide_batch_admission(&facts);
                let fenced = !passed_tokens.iter().all(|t| token > *t);
                let mut any_passed = false;
                for (p, decision) in payouts.iter().zip(&d.decisions) {
                    let duplicate = !fenced && open(&hist, *p).is_some();
                    let admitted = !fenced && !duplicate && states[*p] == PayoutState::Claimed;
                    match decision {
                        AdmissionDecision::Fenced { highest_token } => {
                            prop_assert!(fenced);
                            prop_assert_eq!(Some(*highest_token), mark);
                        }
                        AdmissionDecision::Duplicate { mark: m, .. } => {
                            prop_assert!(duplicate);
                            prop_assert_eq!(*m, Some(token));
                            any_passed = true;
                        }
                        AdmissionDecision::NotClaimable { state } => {
                            prop_assert!(!fenced && !duplicate && !admitted);
                            prop_assert_eq!(*state, states[*p]);
                        }
                        AdmissionDecision::Admit { mark: m } => {
                            prop_assert!(admitted);
                            prop_assert_eq!(*m, Some(token));
                            any_passed = true;
                            states[*p] = PayoutState::Submitted;
                        }
                        AdmissionDecision::Vanished => prop_assert!(false, "the payout exists"),
                    }
                    hist.push((*p, token, matches!(decision, AdmissionDecision::Admit { .. }), None));
                }
                prop_assert_eq!(d.mark, any_passed.then_some(token));
                if let Some(m) = d.mark {
                    prop_assert!(mark.is_none_or(|before| m > before), "the mark only rises");
                    mark = Some(m);
                    passed_tokens.push(token);
                }
                for p in 0..3 {
                    let forwardable = hist.iter().filter(|h| h.0 == p && h.2 && h.3 != Some(3)).count();
                    prop_assert!(forwardable <= 1, "payout {} has {} forwardable attempts", p, forwardable);
                }
            }
        }
    }
}
