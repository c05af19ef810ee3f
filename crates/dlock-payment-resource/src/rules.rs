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

/// Strictly greater, never `>=`: the SQL predicate `fence < :presented`.
pub fn fence_check(stored_fence: i64, presented: i64) -> FenceVerdict {
    if stored_fence < presented {
        FenceVerdict::Passes
    } else {
        FenceVerdict::Fenced { highest_token: stored_fence }
    }
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use chrono::{DateTime, Utc};
    use proptest::prelude::*;
    use uuid::Uuid;

    use super::*;
    use crate::store::{is_unsettled, Direction, LedgerEntry, PayoutPosting};

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
}
