//! The payment-resource's rules, once: the strict fence, the claim decision, the post
//! decision and the ledger posting, as pure functions from the facts a store read to the
//! decision it applies. No I/O, no clock reads, no randomness; integer arithmetic only
//! (amounts are minor units, checked: an overflow is an error, never a wrap).
//!
//! Every store (SQLite, PostgreSQL, the simulation store) reads the facts inside its
//! transaction, calls these functions, and applies the answer under its own conditional
//! writes: in SQL, `UPDATE accounts … WHERE fence < :presented` and `UPDATE payouts … WHERE
//! state = :expected` stay the authority against races, and the state triggers and CHECKs
//! stay the last line.
//!
//! ## Invariants (asserted in release builds too)
//! - **The fence is strict and never decreases**: a token passes iff it is strictly greater
//!   than the stored fence, and the fence then equals it ([`raise_fence`]).
//! - **Only C2's transitions**: every state a decision moves a payout to is one
//!   [`payout::may_transition`] allows the payment-resource.
//! - **No overdraft**: a claim is funded iff `balance − reserved ≥ amount`, where `reserved`
//!   is Σ amount of the account's *other* unsettled payouts; a post leaves the balance ≥ 0.
//! - **Balanced pairs**: a posting is exactly one DEBIT and one CREDIT of one positive
//!   amount, one currency, one posting id, two different accounts ([`assert_balanced`]).
//!
//! - **A batch decides as singles would** (C3-extensions E-19): each payout of a batch
//!   claim or post is decided by [`decide_claim`] or [`decide_post`] in the request's order,
//!   on what the payouts before it left: the reservation ([`BatchReservation`],
//!   [`decide_claim_batch`]) or the balance ([`decide_post_batch`]). Tests hold each fold to
//!   deciding one payout after another from scratch.
//!
//! Defence in depth: the claim's state compare-and-set is where the state-checks layer
//! decides for a claim (with [`payout::may_transition`], where it decides for every
//! transition); only a simulation campaign can switch it off (`dlock_rt::defence`).
//!
//! The ledger rules ([`payout_posting`], [`assert_balanced`], [`balance_after_debit`] and
//! [`RuleError`]) live in [`dlock_paydb::ledger`], because code in `dlock-paydb` applies them
//! too (a payout's posting, the operator's resolution) and it depends on no service crate;
//! they are re-exported here, so this module is still the one place the payment-resource's
//! rules are read from.

use dlock_contract::payout::{self, Actor, PayoutState};
use dlock_paydb::pay::is_unsettled;
use dlock_rt::defence::{self, Layer};

pub use dlock_paydb::ledger::{assert_balanced, balance_after_debit, payout_posting, RuleError};

/// The fence decision (FR-15, C3 §3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FenceVerdict {
    /// `stored < presented`: the write may proceed, raising the fence to the token.
    Passes,
    /// An equal or lower token loses; nothing changes.
    Fenced { highest_token: i64 },
}

/// Strictly greater, never `>=`: the SQL predicate `fence < :bound`, with `:bound` the
/// presented token's [`fence_sql_bound`].
pub fn fence_check(stored_fence: i64, presented: i64) -> FenceVerdict {
    // Planted bug `fence-off-by-one` (the simulation, and the real run's test-only build
    // through `fence_sql_bound`): the token right above the fence is refused, as if a newer
    // holder had written.
    let bar = if dlock_contract::planted::on(dlock_contract::planted::Bug::FenceOffByOne) {
        stored_fence.saturating_add(1)
    } else {
        stored_fence
    };
    if bar < presented {
        FenceVerdict::Passes
    } else {
        FenceVerdict::Fenced { highest_token: stored_fence }
    }
}

/// What the SQL stores' fence statement compares the stored fence with, `fence < :bound`, for
/// a presented token: the token itself, so the statement passes exactly what [`fence_check`]
/// passes (a unit test holds the two to one answer). The fence then rises to the token, not
/// to the bound.
pub fn fence_sql_bound(presented: i64) -> i64 {
    if dlock_contract::planted::on(dlock_contract::planted::Bug::FenceOffByOne) {
        presented.saturating_sub(1)
    } else {
        presented
    }
}

/// Whether a batch whose fence is `batch_account`'s may write a payout of `payout_account`
/// (C3-extensions E-19): only its own account's; another account's payout is not found.
pub fn batch_may_write(batch_account: &str, payout_account: &str) -> bool {
    // Planted bug `batch-ignores-account` (the simulation, and the real run's test-only
    // build): a payout read by its id alone, whatever account the batch's fence passed.
    dlock_contract::planted::on(dlock_contract::planted::Bug::BatchIgnoresAccount) || batch_account == payout_account
}

/// The fence after a passing write: the presented token. Asserts it rose.
pub fn raise_fence(stored_fence: i64, presented: i64) -> i64 {
    assert!(presented > stored_fence, "fence would not rise: {stored_fence} -> {presented}");
    presented
}

/// What a claim read (after its fence passed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimFacts {
    pub state: PayoutState,
    /// What the caller expects: PENDING, or CLAIMED for a recovery re-claim.
    pub expected: PayoutState,
    pub amount_minor: i64,
    pub balance_minor: i64,
    /// Σ amount of the account's other unsettled payouts.
    pub reserved_minor: i64,
}

/// The claim decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimDecision {
    /// The payout is not in the expected state, or the expected state is not claimable
    /// (the fence write rolls back with it).
    NotClaimable { state: PayoutState },
    /// → CLAIMED. `reclaimed` for CLAIMED→CLAIMED (recovery).
    Claimed { reclaimed: bool },
    /// → FAILED: the funds are short.
    InsufficientFunds { available_minor: i64 },
}

impl ClaimDecision {
    /// The state the payout moves to, if it moves.
    pub fn next_state(&self) -> Option<PayoutState> {
        match self {
            ClaimDecision::NotClaimable { .. } => None,
            ClaimDecision::Claimed { .. } => Some(PayoutState::Claimed),
            ClaimDecision::InsufficientFunds { .. } => Some(PayoutState::Failed),
        }
    }
}

/// Decides a claim (P2): the payout must be in the expected state, and the expected state
/// must be one the payment-resource may claim from ([`payout::sources`] of CLAIMED: PENDING,
/// or CLAIMED for a re-claim). Funded iff `balance − reserved ≥ amount`; else FAILED.
pub fn decide_claim(f: &ClaimFacts) -> Result<ClaimDecision, RuleError> {
    let claimable = payout::may_transition(f.expected, PayoutState::Claimed, Actor::PaymentResource);
    // The compare-and-set on the state read is a state check too: with the state-checks
    // layer switched off (simulation only, `dlock_rt::defence`) it lets any state through.
    if !claimable || defence::stops(Layer::StateChecks, f.state != f.expected) {
        return Ok(ClaimDecision::NotClaimable { state: f.state });
    }
    let available = f
        .balance_minor
        .checked_sub(f.reserved_minor)
        .ok_or_else(|| RuleError(format!("available balance {} − {} overflows", f.balance_minor, f.reserved_minor)))?;
    let decision = if available >= f.amount_minor {
        ClaimDecision::Claimed { reclaimed: f.state == PayoutState::Claimed }
    } else {
        ClaimDecision::InsufficientFunds { available_minor: available }
    };
    if let Some(next) = decision.next_state() {
        assert!(payout::may_transition(f.state, next, Actor::PaymentResource), "claim {:?}>{next:?}", f.state);
    }
    Ok(decision)
}

/// What a post read (after its fence passed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostFacts {
    pub state: PayoutState,
    /// The named attempt `(submission id, rail reference)` is this payout's ACKED one (I7).
    pub acked: bool,
    pub balance_minor: i64,
    pub amount_minor: i64,
}

/// The post decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PostDecision {
    /// Not RAIL_ACKED (C2 allows POSTED from nothing else for the payment-resource).
    NotClaimable { state: PayoutState },
    /// The named attempt is not the payout's acknowledged one.
    RailMismatch,
    /// → POSTED, with the account's balance after the debit.
    Posted { balance_after_minor: i64 },
}

/// Decides a post (P3): RAIL_ACKED → POSTED, only for the acknowledged attempt; the balance
/// follows the ledger (`balance − amount`) and never falls below zero (an invariant the
/// claim's funds check keeps: a breach is an error, the CHECK the SQL row would hit).
pub fn decide_post(f: &PostFacts) -> Result<PostDecision, RuleError> {
    if !payout::may_transition(f.state, PayoutState::Posted, Actor::PaymentResource) {
        return Ok(PostDecision::NotClaimable { state: f.state });
    }
    if !f.acked {
        return Ok(PostDecision::RailMismatch);
    }
    let balance_after_minor = balance_after_debit(f.balance_minor, f.amount_minor)?;
    Ok(PostDecision::Posted { balance_after_minor })
}

/// One payout of a batch claim (P2b, C3-extensions E-19) as the batch's transaction read it,
/// before the batch moved any payout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClaimBatchFacts {
    pub state: PayoutState,
    /// What the caller expects: PENDING, or CLAIMED for a recovery re-claim.
    pub expected: PayoutState,
    pub amount_minor: i64,
}

/// The running reservation of a batch claim: Σ amount of the account's unsettled payouts as
/// the payouts decided so far left it. A batch reads the account's unsettled total once;
/// each payout is then decided by [`decide_claim`] on what the payouts before it left
/// ([`BatchReservation::facts`]), and each move is folded in ([`BatchReservation::moved`]):
/// a PENDING payout claimed joins the total, a CLAIMED one failed for funds leaves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchReservation {
    unsettled_minor: i64,
}

impl BatchReservation {
    /// The reservation the batch's read saw: Σ amount of every unsettled payout of the
    /// account (the batch's own included).
    pub fn new(unsettled_minor: i64) -> BatchReservation {
        BatchReservation { unsettled_minor }
    }

    /// Σ amount of the account's unsettled payouts now.
    pub fn unsettled_minor(&self) -> i64 {
        self.unsettled_minor
    }

    /// The claim facts of the next payout: its reservation is every *other* unsettled
    /// payout, so its own amount leaves the total when it is unsettled itself.
    pub fn facts(&self, p: &ClaimBatchFacts, balance_minor: i64) -> Result<ClaimFacts, RuleError> {
        let own = if is_unsettled(p.state) { p.amount_minor } else { 0 };
        let reserved_minor =
            self.unsettled_minor.checked_sub(own).filter(|r| *r >= 0).ok_or_else(|| {
                RuleError(format!("reservation {} − {own} is not a reservation", self.unsettled_minor))
            })?;
        Ok(ClaimFacts {
            state: p.state,
            expected: p.expected,
            amount_minor: p.amount_minor,
            balance_minor,
            reserved_minor,
        })
    }

    /// A payout of `amount_minor` moved from `from` to `to`.
    pub fn moved(&mut self, amount_minor: i64, from: PayoutState, to: PayoutState) -> Result<(), RuleError> {
        let held = |s: PayoutState| if is_unsettled(s) { amount_minor } else { 0 };
        self.unsettled_minor = self
            .unsettled_minor
            .checked_add(held(to))
            .and_then(|u| u.checked_sub(held(from)))
            .filter(|u| *u >= 0)
            .ok_or_else(|| RuleError(format!("reservation {} overflows with {amount_minor}", self.unsettled_minor)))?;
        Ok(())
    }
}

/// Decides each payout of a batch claim, in the request's order, exactly as one claim after
/// another would: [`decide_claim`] with the reservation the payouts before it left
/// ([`BatchReservation`]), on an account of `balance_minor` whose unsettled payouts sum to
/// `unsettled_minor` before the batch (a claim never moves the balance).
pub fn decide_claim_batch(
    balance_minor: i64,
    unsettled_minor: i64,
    payouts: &[ClaimBatchFacts],
) -> Result<Vec<ClaimDecision>, RuleError> {
    let mut reservation = BatchReservation::new(unsettled_minor);
    let mut decisions = Vec::with_capacity(payouts.len());
    for p in payouts {
        let decision = decide_claim(&reservation.facts(p, balance_minor)?)?;
        if let Some(next) = decision.next_state() {
            reservation.moved(p.amount_minor, p.state, next)?;
        }
        decisions.push(decision);
    }
    Ok(decisions)
}

/// One payout of a batch post (P3b, C3-extensions E-19) as the batch's transaction read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostBatchFacts {
    pub state: PayoutState,
    /// The named attempt is this payout's ACKED one (I7).
    pub acked: bool,
    pub amount_minor: i64,
}

/// Decides each payout of a batch post, in the request's order, exactly as one post after
/// another would: [`decide_post`] on the balance the posts before it left.
pub fn decide_post_batch(balance_minor: i64, payouts: &[PostBatchFacts]) -> Result<Vec<PostDecision>, RuleError> {
    let mut balance = balance_minor;
    let mut decisions = Vec::with_capacity(payouts.len());
    for p in payouts {
        let decision = decide_post(&PostFacts {
            state: p.state,
            acked: p.acked,
            balance_minor: balance,
            amount_minor: p.amount_minor,
        })?;
        if let PostDecision::Posted { balance_after_minor } = decision {
            balance = balance_after_minor;
        }
        decisions.push(decision);
    }
    Ok(decisions)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{DateTime, Utc};
    use proptest::prelude::*;
    use uuid::Uuid;

    use super::*;
    use crate::store::{is_unsettled, Direction, LedgerEntry, PayoutPosting};

    #[test]
    fn a_batch_writes_only_payouts_of_the_account_whose_fence_it_passed() {
        assert!(batch_may_write("acct-1", "acct-1"));
        assert!(!batch_may_write("acct-1", "acct-2"));
        assert!(!batch_may_write("acct-1", "acct-10"));
    }

    /// The SQL stores' fence statement (`fence < :bound`) and the rule answer alike, at the
    /// edges of the token range too.
    #[test]
    fn sql_fence_statement_passes_exactly_what_the_fence_rule_passes() {
        let edges = [i64::MIN, i64::MIN + 1, -1, 0, 1, 2, 41, 42, 43, i64::MAX - 1, i64::MAX];
        for stored in edges {
            for presented in edges {
                let sql = stored < fence_sql_bound(presented);
                assert_eq!(sql, fence_check(stored, presented) == FenceVerdict::Passes, "{stored} vs {presented}");
            }
        }
    }

    proptest! {
        /// Against the history of accepted tokens: a token passes iff it exceeds every token
        /// accepted before (and the opening fence), and the fence never decreases.
        #[test]
        fn fence_accepts_exactly_tokens_above_every_earlier_acceptance(
            tokens in proptest::collection::vec(0i64..20, 1..40), opening in 0i64..5,
        ) {
            let mut fence = opening;
            let mut accepted: Vec<i64> = Vec::new();
            for t in tokens {
                let reference = t > opening && accepted.iter().all(|a| t > *a);
                match fence_check(fence, t) {
                    FenceVerdict::Passes => {
                        prop_assert!(reference);
                        let raised = raise_fence(fence, t);
                        prop_assert!(raised > fence);
                        fence = raised;
                        accepted.push(t);
                    }
                    FenceVerdict::Fenced { highest_token } => {
                        prop_assert!(!reference);
                        prop_assert_eq!(highest_token, fence);
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "fence would not rise")]
    fn an_equal_token_never_raises_the_fence_in_release_builds() {
        raise_fence(7, 7);
    }

    /// One account, a few payouts, operations in any order.
    #[derive(Debug, Clone)]
    enum Op {
        Claim(usize, bool),
        /// The proxy submits and the rail acknowledges (CLAIMED → SUBMITTED → RAIL_ACKED).
        Ack(usize),
        /// The proxy submits and the rail rejects (→ FAILED).
        Reject(usize),
        Post(usize, bool),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0usize..4, any::<bool>()).prop_map(|(i, re)| Op::Claim(i, re)),
            (0usize..4).prop_map(Op::Ack),
            (0usize..4).prop_map(Op::Reject),
            (0usize..4, any::<bool>()).prop_map(|(i, acked)| Op::Post(i, acked)),
        ]
    }

    proptest! {
        /// The claim and post decisions and the posting, driven over random schedules of one
        /// account's payouts, against a reference model that recomputes from scratch: a claim
        /// is funded iff the opening balance minus everything posted or reserved by the other
        /// payouts covers it; states only move along C2; the balance never goes below zero
        /// and equals the opening balance minus Σ DEBIT; Σ DEBIT = Σ CREDIT.
        #[test]
        fn claim_and_post_keep_the_ledger_balanced_and_never_overdraw(
            opening in 0i64..300,
            amounts in proptest::collection::vec(1i64..120, 4),
            ops in proptest::collection::vec(op(), 1..60),
        ) {
            let at = DateTime::<Utc>::UNIX_EPOCH;
            let mut states = vec![PayoutState::Pending; 4];
            let mut balance = opening;
            let mut ledger: Vec<LedgerEntry> = Vec::new();
            for op in ops {
                let reserved = |states: &[PayoutState], except: usize| -> i64 {
                    (0..4).filter(|j| *j != except && is_unsettled(states[*j])).map(|j| amounts[j]).sum()
                };
                match op {
                    Op::Claim(i, re) => {
                        let expected = if re { PayoutState::Claimed } else { PayoutState::Pending };
                        let facts = ClaimFacts {
                            state: states[i],
                            expected,
                            amount_minor: amounts[i],
                            balance_minor: balance,
                            reserved_minor: reserved(&states, i),
                        };
                        let d = decide_claim(&facts).expect("no overflow at these sizes");
                        // Reference: posted amounts are gone from the opening balance.
                        let posted: i64 = (0..4).filter(|j| states[*j] == PayoutState::Posted).map(|j| amounts[j]).sum();
                        let covers = opening - posted - reserved(&states, i) >= amounts[i];
                        match d {
                            ClaimDecision::NotClaimable { state } => prop_assert!(state == states[i] && state != expected),
                            ClaimDecision::Claimed { reclaimed } => {
                                prop_assert!(covers && states[i] == expected);
                                prop_assert_eq!(reclaimed, expected == PayoutState::Claimed);
                            }
                            ClaimDecision::InsufficientFunds { .. } => prop_assert!(!covers && states[i] == expected),
                        }
                        if let Some(next) = d.next_state() {
                            prop_assert!(payout::may_transition(states[i], next, Actor::PaymentResource));
                            states[i] = next;
                        }
                    }
                    Op::Ack(i) | Op::Reject(i) => {
                        if payout::may_transition(states[i], PayoutState::Submitted, Actor::RailProxy) {
                            let to = if matches!(op, Op::Ack(_)) { PayoutState::RailAcked } else { PayoutState::Failed };
                            prop_assert!(payout::may_transition(PayoutState::Submitted, to, Actor::RailProxy));
                            states[i] = to;
                        }
                    }
                    Op::Post(i, acked) => {
                        let facts = PostFacts { state: states[i], acked, balance_minor: balance, amount_minor: amounts[i] };
                        match decide_post(&facts).expect("a claimed payout is always covered") {
                            PostDecision::NotClaimable { state } => prop_assert!(state != PayoutState::RailAcked),
                            PostDecision::RailMismatch => prop_assert!(!acked && states[i] == PayoutState::RailAcked),
                            PostDecision::Posted { balance_after_minor } => {
                                let posting = PayoutPosting {
                                    payout_id: Uuid::from_u128(i as u128),
                                    posting_id: Uuid::from_u128(100 + ledger.len() as u128),
                                    entry_ids: [Uuid::nil(), Uuid::nil()],
                                    account_id: "acct",
                                    amount_minor: amounts[i],
                                    currency: "EUR",
                                    fence: 1,
                                    at,
                                };
                                ledger.extend(payout_posting(&posting));
                                balance = balance_after_minor;
                                states[i] = PayoutState::Posted;
                            }
                        }
                    }
                }
                // No overdraft: balance − Σ unsettled ≥ 0.
                let unsettled: i64 = (0..4).filter(|j| is_unsettled(states[*j])).map(|j| amounts[j]).sum();
                prop_assert!(balance - unsettled >= 0, "overdraft: {} − {} with {:?}", balance, unsettled, states);
                // The balance follows the ledger; the ledger balances.
                let mut sums: BTreeMap<(&str, Direction), i64> = BTreeMap::new();
                for e in &ledger {
                    *sums.entry((e.account_id.as_str(), e.direction)).or_default() += e.amount_minor;
                }
                let debits: i64 = ledger.iter().filter(|e| e.direction == Direction::Debit).map(|e| e.amount_minor).sum();
                let credits: i64 = ledger.iter().filter(|e| e.direction == Direction::Credit).map(|e| e.amount_minor).sum();
                prop_assert_eq!(debits, credits);
                prop_assert_eq!(balance, opening - sums.get(&("acct", Direction::Debit)).copied().unwrap_or(0));
            }
        }
    }

    fn any_state() -> impl Strategy<Value = PayoutState> {
        proptest::sample::select(PayoutState::ALL.to_vec())
    }

    proptest! {
        /// A batch claim decides each payout as claims one after another would: the fold
        /// over the account's unsettled total read once gives every payout the reservation
        /// recomputed from scratch over the states the payouts before it left (a claimed
        /// PENDING payout reserves, a CLAIMED one failed for funds releases).
        #[test]
        fn a_batch_claim_decides_each_payout_as_one_claim_after_another(
            balance in 0i64..1_000,
            account in proptest::collection::vec((any_state(), 1i64..400), 1..10),
            order in proptest::sample::subsequence((0usize..10).collect::<Vec<_>>(), 0..10),
            shuffle in any::<u64>(),
            expectations in proptest::collection::vec(
                proptest::sample::select(vec![PayoutState::Pending, PayoutState::Claimed, PayoutState::Posted]), 10),
        ) {
            // The batch: distinct payouts of the account, in a drawn order.
            let mut batch: Vec<usize> = order.into_iter().filter(|i| *i < account.len()).collect();
            let k = batch.len().max(1);
            batch.rotate_left((shuffle as usize) % k);
            if shuffle % 2 == 1 {
                batch.reverse();
            }
            let mut states: Vec<PayoutState> = account.iter().map(|(s, _)| *s).collect();
            let unsettled: i64 = account.iter().filter(|(s, _)| is_unsettled(*s)).map(|(_, a)| a).sum();
            let facts: Vec<ClaimBatchFacts> = batch
                .iter()
                .map(|i| ClaimBatchFacts { state: states[*i], expected: expectations[*i], amount_minor: account[*i].1 })
                .collect();
            let folded = decide_claim_batch(balance, unsettled, &facts).expect("no overflow at these sizes");
            prop_assert_eq!(folded.len(), batch.len());
            for (k, i) in batch.iter().enumerate() {
                let reserved: i64 = (0..account.len())
                    .filter(|j| j != i && is_unsettled(states[*j]))
                    .map(|j| account[j].1)
                    .sum();
                let one = decide_claim(&ClaimFacts {
                    state: states[*i],
                    expected: expectations[*i],
                    amount_minor: account[*i].1,
                    balance_minor: balance,
                    reserved_minor: reserved,
                })
                .expect("no overflow at these sizes");
                prop_assert_eq!(folded[k], one, "payout {} (#{} of the batch)", i, k);
                if let Some(next) = one.next_state() {
                    states[*i] = next;
                }
            }
        }

        /// A batch post decides each payout as posts one after another would: each on the
        /// balance the posts before it left, and a breach of the balance is the same error.
        #[test]
        fn a_batch_post_decides_each_payout_as_one_post_after_another(
            balance in 0i64..1_000,
            payouts in proptest::collection::vec((any_state(), any::<bool>(), 1i64..400), 0..10),
        ) {
            let facts: Vec<PostBatchFacts> =
                payouts.iter().map(|(state, acked, amount_minor)| PostBatchFacts { state: *state, acked: *acked, amount_minor: *amount_minor }).collect();
            let folded = decide_post_batch(balance, &facts);
            let mut running = balance;
            let mut one_by_one = Ok(Vec::new());
            for p in &facts {
                match decide_post(&PostFacts { state: p.state, acked: p.acked, balance_minor: running, amount_minor: p.amount_minor }) {
                    Ok(d) => {
                        if let PostDecision::Posted { balance_after_minor } = d {
                            running = balance_after_minor;
                        }
                        if let Ok(v) = one_by_one.as_mut() {
                            v.push(d);
                        }
                    }
                    Err(e) => {
                        one_by_one = Err(e);
                        break;
                    }
                }
            }
            prop_assert_eq!(folded, one_by_one);
        }
    }

    #[test]
    fn a_batch_reservation_follows_what_each_move_holds() {
        let mut r = BatchReservation::new(300);
        let pending =
            ClaimBatchFacts { state: PayoutState::Pending, expected: PayoutState::Pending, amount_minor: 100 };
        assert_eq!(r.facts(&pending, 1_000).map(|f| f.reserved_minor), Ok(300));
        r.moved(100, PayoutState::Pending, PayoutState::Claimed).expect("moved");
        assert_eq!(r.unsettled_minor(), 400);
        let claimed = ClaimBatchFacts { state: PayoutState::Claimed, expected: PayoutState::Claimed, amount_minor: 50 };
        assert_eq!(
            r.facts(&claimed, 1_000).map(|f| f.reserved_minor),
            Ok(350),
            "its own amount is not reserved against it"
        );
        r.moved(50, PayoutState::Claimed, PayoutState::Claimed).expect("re-claimed");
        assert_eq!(r.unsettled_minor(), 400, "a re-claim reserves once");
        r.moved(50, PayoutState::Claimed, PayoutState::Failed).expect("failed");
        assert_eq!(r.unsettled_minor(), 350);
        // An unsettled payout worth more than the total read is a store that lied.
        let lying =
            ClaimBatchFacts { state: PayoutState::Claimed, expected: PayoutState::Claimed, amount_minor: 1_000 };
        assert!(r.facts(&lying, 1_000).is_err());
    }

    /// Three payouts of 400 on a balance of 1 000: the third is failed for funds, whatever
    /// the first two were decided from.
    #[test]
    fn a_batch_claim_fails_the_payout_the_earlier_ones_left_no_funds_for() {
        let p = ClaimBatchFacts { state: PayoutState::Pending, expected: PayoutState::Pending, amount_minor: 400 };
        let decided = decide_claim_batch(1_000, 0, &[p, p, p]).expect("decided");
        assert_eq!(
            decided,
            vec![
                ClaimDecision::Claimed { reclaimed: false },
                ClaimDecision::Claimed { reclaimed: false },
                ClaimDecision::InsufficientFunds { available_minor: 200 },
            ]
        );
    }
}
