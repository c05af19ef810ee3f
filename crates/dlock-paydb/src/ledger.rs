//! paydb's ledger rules, once: the balanced payout posting and the debit of a CUSTOMER
//! balance, as pure functions. No I/O, no clock reads, no randomness; integer arithmetic only
//! (amounts are minor units, checked: an overflow is an error, never a wrap).
//!
//! They live here, below the services, because code in this crate applies them
//! ([`PayoutPosting::entries`], the operator's resolution over [`crate::mem::PaydbTables`]
//! and in [`crate::sql`]); the payment-resource's `rules` module re-exports them beside its
//! fence, claim and post decisions, and every store calls them from there or from here.
//!
//! ## Invariants (asserted in release builds too)
//! - **Balanced pairs**: a posting is exactly one DEBIT and one CREDIT of one positive
//!   amount, one currency, one posting id, two different accounts ([`assert_balanced`]).
//! - **No overdraft**: a debit never leaves a CUSTOMER balance below zero
//!   ([`balance_after_debit`] refuses it).

use crate::pay::{settlement_account, Direction, LedgerEntry, PayoutPosting};

/// A rule could not be applied to the facts: an amount overflowed, or the facts break an
/// invariant a CHECK would refuse. The store answers it as corrupt content (500).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct RuleError(pub String);

/// A CUSTOMER balance after the debit of a posting: `balance − amount`, never below zero.
pub fn balance_after_debit(balance_minor: i64, amount_minor: i64) -> Result<i64, RuleError> {
    balance_minor
        .checked_sub(amount_minor)
        .filter(|b| *b >= 0)
        .ok_or_else(|| RuleError(format!("accounts: balance {balance_minor} − {amount_minor} would fall below 0")))
}

/// A payout's posting: DEBIT the payout's account, CREDIT `#settlement:{CUR}`, one amount,
/// both entries carrying the posting's fence. Asserts the pair balances.
pub fn payout_posting(p: &PayoutPosting<'_>) -> [LedgerEntry; 2] {
    let entry = |entry_id, account_id, direction| LedgerEntry {
        entry_id,
        posting_id: p.posting_id,
        payout_id: Some(p.payout_id),
        account_id,
        direction,
        amount_minor: p.amount_minor,
        currency: p.currency.to_owned(),
        fence: p.fence,
        created_at: p.at,
    };
    let entries = [
        entry(p.entry_ids[0], p.account_id.to_owned(), Direction::Debit),
        entry(p.entry_ids[1], settlement_account(p.currency), Direction::Credit),
    ];
    assert_balanced(&entries);
    entries
}

/// Asserts a posting is one balanced pair: one DEBIT and one CREDIT of the same positive
/// amount, currency and posting id, on two different accounts (FR-25: Σ DEBIT = Σ CREDIT).
pub fn assert_balanced(entries: &[LedgerEntry]) {
    let [a, b] = entries else { panic!("a posting is two entries, not {}", entries.len()) };
    assert!(
        a.direction != b.direction
            && a.amount_minor == b.amount_minor
            && a.amount_minor > 0
            && a.currency == b.currency
            && a.posting_id == b.posting_id
            && a.account_id != b.account_id,
        "unbalanced posting: {a:?} / {b:?}"
    );
}

#[cfg(test)]
mod tests {
    use chrono::{DateTime, Utc};
    use uuid::Uuid;

    use super::*;

    #[test]
    #[should_panic(expected = "unbalanced posting")]
    fn an_unbalanced_pair_is_refused_in_release_builds() {
        let at = DateTime::<Utc>::UNIX_EPOCH;
        let p = PayoutPosting {
            payout_id: Uuid::nil(),
            posting_id: Uuid::nil(),
            entry_ids: [Uuid::nil(), Uuid::nil()],
            account_id: "a",
            amount_minor: 5,
            currency: "EUR",
            fence: 1,
            at,
        };
        let mut entries = payout_posting(&p).to_vec();
        entries[1].amount_minor = 4;
        assert_balanced(&entries);
    }
}
