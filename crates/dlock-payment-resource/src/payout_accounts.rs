//! The payout-to-account map the grant check reads
//! (docs/performance.md "The grant check's account read"), remembered per store so a
//! payout's second fenced write (its post, after its claim) does not read it from the
//! database again.
//!
//! What makes it safe to remember: a payout's account is written once, when the payout is
//! created, and no statement of paydb changes it or deletes the payout (the schema's
//! `payouts.account_id` is never updated; no payout row is ever deleted), so an answer read
//! once is the answer forever, on every replica. Only found payouts are remembered: an
//! unknown id is read again next time (it may have been created since).
//!
//! Invariant, asserted in release builds too: the map never holds more than
//! [`PAYOUT_ACCOUNTS_MAX`] entries. It keeps two generations of at most half that each; when
//! the newer fills, the older is dropped and the newer takes its place, so the payouts of the
//! last few thousand writes stay remembered at O(1) per call with no iteration (no order of a
//! hash map ever leaks).

use std::collections::HashMap;
use std::sync::Mutex;

use uuid::Uuid;

/// Most payouts remembered at once (two generations of half each; ~100 bytes per entry).
pub const PAYOUT_ACCOUNTS_MAX: usize = 8_192;

/// A bounded, process-local map of payout id to its account id.
#[derive(Debug, Default)]
pub struct PayoutAccounts {
    generations: Mutex<Generations>,
}

#[derive(Debug, Default)]
struct Generations {
    newer: HashMap<Uuid, String>,
    older: HashMap<Uuid, String>,
}

impl Generations {
    fn held(&self) -> usize {
        self.newer.len() + self.older.len()
    }
}

impl PayoutAccounts {
    pub fn new() -> PayoutAccounts {
        PayoutAccounts::default()
    }

    /// The account remembered for `payout_id`, if any.
    pub fn get(&self, payout_id: Uuid) -> Option<String> {
        let g = self.lock();
        g.newer.get(&payout_id).or_else(|| g.older.get(&payout_id)).cloned()
    }

    /// Remembers that `payout_id` belongs to `account_id` (read from paydb, or committed by
    /// this store's own create).
    pub fn remember(&self, payout_id: Uuid, account_id: &str) {
        let mut g = self.lock();
        if g.newer.contains_key(&payout_id) {
            return;
        }
        if g.newer.len() >= PAYOUT_ACCOUNTS_MAX / 2 {
            g.older = std::mem::take(&mut g.newer);
        }
        g.newer.insert(payout_id, account_id.to_owned());
        let held = g.held();
        assert!(held <= PAYOUT_ACCOUNTS_MAX, "payout-account map holds {held} > {PAYOUT_ACCOUNTS_MAX} entries");
    }

    /// How many entries are held (both generations).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().held()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Generations> {
        // A panic while held leaves the maps whole (each call's writes are single inserts).
        self.generations.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_remembered_payout_answers_its_account() {
        let m = PayoutAccounts::new();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        assert_eq!(m.get(a), None);
        m.remember(a, "acct-1");
        m.remember(b, "acct-2");
        assert_eq!(m.get(a).as_deref(), Some("acct-1"));
        assert_eq!(m.get(b).as_deref(), Some("acct-2"));
        assert_eq!(m.len(), 2);
    }

    #[test]
    fn the_map_never_holds_more_than_its_bound_and_keeps_the_newest() {
        let m = PayoutAccounts::new();
        let ids: Vec<Uuid> = (0..PAYOUT_ACCOUNTS_MAX * 3).map(|_| Uuid::new_v4()).collect();
        for (i, id) in ids.iter().enumerate() {
            m.remember(*id, &format!("acct-{i}"));
            assert!(m.len() <= PAYOUT_ACCOUNTS_MAX);
        }
        // The newest half is always held; the oldest are gone.
        for (i, id) in ids.iter().enumerate().rev().take(PAYOUT_ACCOUNTS_MAX / 2) {
            assert_eq!(m.get(*id), Some(format!("acct-{i}")));
        }
        assert_eq!(m.get(ids[0]), None);
    }

    #[test]
    fn remembering_a_held_payout_again_does_not_evict() {
        let m = PayoutAccounts::new();
        let keep = Uuid::new_v4();
        m.remember(keep, "acct-keep");
        for _ in 0..PAYOUT_ACCOUNTS_MAX / 2 - 1 {
            m.remember(Uuid::new_v4(), "acct");
        }
        // The newer generation is full now; remembering `keep` again must not roll it over.
        m.remember(keep, "acct-keep");
        assert_eq!(m.len(), PAYOUT_ACCOUNTS_MAX / 2);
    }
}
