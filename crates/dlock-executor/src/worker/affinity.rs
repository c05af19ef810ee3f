//! Which accounts an executor prefers (issue 14 cut 6): a stable hash of the account
//! assigns it one executor of `executor.affinity-count` ([`affinity_of`]); another
//! executor's account is taken only once its head (its oldest candidate) has stayed the
//! same payout for `executor.affinity-steal-after-ms` ([`next_heads`], [`stalled_accounts`]).
//! Pure functions of the scans and the instants the caller passes; the lock server stays
//! the only authority, this only narrows what is tried.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use uuid::Uuid;

use super::Candidate;

/// The account's place among `count` executors (issue 14 cut 6): a stable 64-bit FNV-1a
/// hash of its id, mod `count`. The same in every process and version (no seeded hasher).
pub fn affinity_of(account_id: &str, count: u32) -> u32 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = account_id.bytes().fold(FNV_OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME));
    (hash % u64::from(count.max(1))) as u32
}

/// Another executor's account as this executor's scans have seen it (cut 6): the payout at
/// its head (its oldest candidate by creation, then id) and since when that same payout
/// has been its head.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    pub payout_id: Uuid,
    pub since: dlock_rt::Instant,
}

/// The heads after a scan taken at `now` (pure, cut 6): for each account of `scan` that
/// `foreign` names (another executor's), its head, with `since` kept from `prev` when the
/// head is the same payout as before and `now` when it changed (a payout of the account
/// settled or left the scan: its owner made progress) or the account is new. Accounts
/// absent from `scan` are dropped, so the map holds no more accounts than the scan.
pub fn next_heads(
    prev: &BTreeMap<String, Head>,
    scan: &[Candidate],
    foreign: impl Fn(&str) -> bool,
    now: dlock_rt::Instant,
) -> BTreeMap<String, Head> {
    let mut oldest: BTreeMap<&str, &Candidate> = BTreeMap::new();
    for c in scan.iter().filter(|c| foreign(&c.account_id)) {
        let head = oldest.entry(&c.account_id).or_insert(c);
        if (c.created_at, c.payout_id) < (head.created_at, head.payout_id) {
            *head = c;
        }
    }
    oldest
        .into_iter()
        .map(|(account, c)| {
            let since = match prev.get(account) {
                Some(h) if h.payout_id == c.payout_id => h.since,
                _ => now,
            };
            (account.to_owned(), Head { payout_id: c.payout_id, since })
        })
        .collect()
}

/// The accounts of `heads` whose head has not moved for `steal_after` at `now` (pure,
/// cut 6): no payout of theirs settled in that long, as far as this executor has seen.
pub fn stalled_accounts(
    heads: &BTreeMap<String, Head>,
    now: dlock_rt::Instant,
    steal_after: Duration,
) -> BTreeSet<String> {
    heads
        .iter()
        .filter(|(_, h)| now.saturating_duration_since(h.since) >= steal_after)
        .map(|(account, _)| account.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_contract::payout::PayoutState;
    use dlock_rt::Clock;

    /// Cut 6: the affinity hash is stable (pinned values: a change would reshuffle every
    /// deployment's executors) and every account has exactly one preferred executor.
    #[test]
    fn affinity_is_a_stable_hash_and_gives_each_account_one_executor() {
        let pinned: Vec<u32> = (0..6).map(|a| affinity_of(&format!("acct-{a}"), 4)).collect();
        assert_eq!(pinned, PINNED_AFFINITY.to_vec());
        assert_eq!(affinity_of("anything", 1), 0);
        assert_eq!(affinity_of("anything", 0), 0, "a count of 0 is read as 1");
        for a in 0..200 {
            let account = format!("acct-{a}");
            let owners = (0..3).filter(|&i| affinity_of(&account, 3) == i).count();
            assert_eq!(owners, 1, "{account}");
        }
        let spread: std::collections::BTreeSet<u32> = (0..64).map(|a| affinity_of(&format!("a{a}"), 4)).collect();
        assert_eq!(spread.len(), 4, "64 accounts reach every one of 4 executors");
    }

    /// `affinity_of("acct-0".."acct-5", 4)`.
    const PINNED_AFFINITY: [u32; 6] = [3, 0, 1, 2, 3, 0];

    /// Cut 6: a head is another executor's account's oldest candidate; it keeps its `since`
    /// while it is the same payout, restarts when the owner settles it, and leaves with the
    /// account. A backlog far older than the bound whose owner settles a payout per scan
    /// never stalls (creation time plays no part); an owner that stops stalls after the bound.
    #[test]
    fn an_account_stalls_only_when_its_oldest_payout_stays_put_for_the_bound() {
        let t0 = Clock::system().now();
        let later = |ms: u64| t0.checked_add(Duration::from_millis(ms)).expect("in range");
        let long_ago = Clock::system().wall() - chrono::Duration::hours(1);
        let payout = |account: &str, n: u128, age_s: i64| Candidate {
            payout_id: Uuid::from_u128(n),
            account_id: account.to_owned(),
            state: PayoutState::Pending,
            created_at: Some(long_ago + chrono::Duration::seconds(age_s)),
        };
        let foreign = |a: &str| a != "mine";
        let bound = Duration::from_millis(5_000);
        // The owner of `a` settles its oldest payout between every two scans, 1 s apart.
        let mut heads = BTreeMap::new();
        for (scan, n) in (0u64..20).zip(0u128..) {
            let found = vec![payout("a", n + 1, n as i64 + 1), payout("a", n, n as i64), payout("mine", 99, 0)];
            heads = next_heads(&heads, &found, foreign, later(scan * 1_000));
            assert_eq!(heads.get("a").map(|h| h.payout_id.as_u128()), Some(n), "the oldest is the head");
            assert!(!heads.contains_key("mine"), "own accounts are not tracked");
            assert!(stalled_accounts(&heads, later(scan * 1_000), bound).is_empty(), "scan {scan}: it progresses");
        }
        // Then it stops: the same head from 19 s on.
        for s in 20u64..=23 {
            heads = next_heads(&heads, &[payout("a", 19, 19), payout("a", 20, 20)], foreign, later(s * 1_000));
            assert!(stalled_accounts(&heads, later(s * 1_000), bound).is_empty(), "{s} s: within the bound");
        }
        heads = next_heads(&heads, &[payout("a", 19, 19)], foreign, later(24_000));
        let stalled = stalled_accounts(&heads, later(24_000), bound);
        assert_eq!(stalled.into_iter().collect::<Vec<_>>(), vec!["a".to_owned()], "5 s on one head: at the bound");
        assert!(stalled_accounts(&heads, later(24_000), bound + Duration::from_millis(1)).is_empty());
        heads = next_heads(&heads, &[payout("b", 7, 0)], foreign, later(25_000));
        assert_eq!(
            heads.keys().cloned().collect::<Vec<_>>(),
            vec!["b".to_owned()],
            "an account not scanned is dropped"
        );
        assert!(stalled_accounts(&heads, later(25_000), bound).is_empty(), "a new head starts its own clock");
    }
}
