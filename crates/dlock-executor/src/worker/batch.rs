//! Which candidates go together in one batch run (issue 14, C3-extensions E-19).
//!
//! A pass that holds more than one PENDING or CLAIMED candidate of an account works up to
//! `executor.payouts-per-grant-max` of them together ([`take_batch`]) as one
//! [`super::run::PayoutRun`] over N payouts: one grant, one claim (P2b), one submission
//! (R1b) with the post's newer grant rotated beside it, one post (P3b) under that grant,
//! each fence passed once for all of them, each payout's item answer read as its single
//! write's answer (see [`super::run`] for the transitions and their invariants).
//!
//! Invariant (asserted by the run): every member is of the batch's one account, named
//! once, PENDING or CLAIMED.

use std::collections::VecDeque;

use dlock_contract::payout::PayoutState;

use super::Candidate;

/// Whether a candidate may be claimed in a batch: P2b claims from PENDING or CLAIMED only.
pub fn batchable(c: &Candidate) -> bool {
    matches!(c.state, PayoutState::Pending | PayoutState::Claimed)
}

/// The other members of `first`'s batch (pure): up to `more_max` further batchable
/// candidates of its account, taken out of `queue` in queue order. Candidates of other
/// accounts, and the account's RAIL_ACKED ones, stay in the queue in their order.
pub fn take_batch(queue: &mut VecDeque<Candidate>, first: &Candidate, more_max: usize) -> Vec<Candidate> {
    let mut taken = Vec::new();
    let mut kept = VecDeque::with_capacity(queue.len());
    while let Some(c) = queue.pop_front() {
        if taken.len() < more_max && c.account_id == first.account_id && c.payout_id != first.payout_id && batchable(&c)
        {
            taken.push(c);
        } else {
            kept.push_back(c);
        }
    }
    *queue = kept;
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use uuid::Uuid;

    fn candidate(account: &str, state: PayoutState, n: u128) -> Candidate {
        Candidate { payout_id: Uuid::from_u128(n), account_id: account.to_owned(), state, created_at: None }
    }

    #[test]
    fn a_batch_takes_the_accounts_claimable_candidates_in_queue_order_up_to_its_bound() {
        let first = candidate("a", PayoutState::Pending, 1);
        let mut queue: VecDeque<Candidate> = [
            candidate("b", PayoutState::Pending, 2),
            candidate("a", PayoutState::RailAcked, 3),
            candidate("a", PayoutState::Claimed, 4),
            candidate("a", PayoutState::Pending, 5),
            candidate("a", PayoutState::Pending, 6),
        ]
        .into();
        let taken = take_batch(&mut queue, &first, 2);
        let ids = |cs: &[Candidate]| cs.iter().map(|c| c.payout_id.as_u128()).collect::<Vec<_>>();
        assert_eq!(ids(&taken), [4, 5]);
        assert_eq!(ids(&queue.iter().cloned().collect::<Vec<_>>()), [2, 3, 6]);
        let none = take_batch(&mut queue, &candidate("z", PayoutState::Pending, 9), 8);
        assert!(none.is_empty());
        assert_eq!(queue.len(), 3);
    }
}
