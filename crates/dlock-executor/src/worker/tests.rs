//! The pass's pure helpers and the affinity filter (`Executor::prefer_own`).

use super::*;

fn candidate(state: PayoutState, n: u128) -> Candidate {
    Candidate { payout_id: Uuid::from_u128(n), account_id: format!("a-{n}"), state, created_at: None }
}

/// Issue 14 chains: while a chain holds an account, the pass works that account's next
/// candidate first (wherever it sits), else the front; a payout may keep its grant only
/// while another candidate of its account is left.
#[test]
fn a_chain_takes_its_accounts_next_candidate_first_and_only_while_one_is_left() {
    let at = |account: &str, n: u128| Candidate {
        payout_id: Uuid::from_u128(n),
        account_id: account.to_owned(),
        state: PayoutState::Pending,
        created_at: None,
    };
    let mut queue: VecDeque<Candidate> = vec![at("a", 1), at("b", 2), at("a", 3), at("c", 4)].into();
    assert!(chain_has_next(&queue, "a") && !chain_has_next(&queue, "z"));
    let ids = |q: &VecDeque<Candidate>| q.iter().map(|c| c.payout_id.as_u128()).collect::<Vec<_>>();
    assert_eq!(next_candidate(&mut queue, Some("a")).map(|c| c.payout_id.as_u128()), Some(1));
    assert_eq!(next_candidate(&mut queue, Some("a")).map(|c| c.payout_id.as_u128()), Some(3), "past b");
    assert_eq!(ids(&queue), vec![2, 4]);
    assert!(!chain_has_next(&queue, "a"), "a has nothing left to chain to");
    assert_eq!(next_candidate(&mut queue, Some("a")).map(|c| c.payout_id.as_u128()), Some(2), "none left: the front");
    assert_eq!(next_candidate(&mut queue, None).map(|c| c.payout_id.as_u128()), Some(4));
    assert!(next_candidate(&mut queue, Some("c")).is_none());
}

fn executor(index: u32, count: u32, steal_after_ms: u64) -> Arc<Executor> {
    let url = |p: u16| dlock_rt::http::BaseUrl::parse(&format!("http://127.0.0.1:{p}")).expect("url");
    let mut cfg = ExecutorConfig::new(url(1), url(2), url(3), OwnerId::parse("e").expect("owner"));
    (cfg.affinity_index, cfg.affinity_count, cfg.affinity_steal_after_ms) = (index, count, steal_after_ms);
    Executor::new(cfg, Clock::system()).expect("valid")
}

/// Cut 6: a pass tries its own accounts (and the stalled accounts of others) in scan
/// order; another executor's accounts only when none of its own is in the scan; with
/// one executor, everything.
#[tokio::test]
async fn a_pass_prefers_own_accounts_and_takes_others_only_when_dry_or_stalled() {
    let mine = (0..64).map(|a| format!("acct-{a}")).find(|a| affinity_of(a, 2) == 0).expect("one of mine");
    let theirs = (0..64).map(|a| format!("acct-{a}")).find(|a| affinity_of(a, 2) == 1).expect("one of theirs");
    let stuck = (0..64)
        .map(|a| format!("acct-{a}"))
        .find(|a| affinity_of(a, 2) == 1 && *a != theirs)
        .expect("another of theirs");
    let at = |account: &str, n: u128| Candidate {
        payout_id: Uuid::from_u128(n),
        account_id: account.to_owned(),
        state: PayoutState::Pending,
        created_at: Some(Clock::system().wall()),
    };
    let ids = |c: Vec<Candidate>| c.iter().map(|c| c.payout_id.as_u128()).collect::<Vec<_>>();
    let e = executor(0, 2, 5_000);
    // Instants after the clock's reading, not before it (a simulated clock starts at 0).
    let t0 = e.clock.now();
    let later = |ms: u64| t0.checked_add(Duration::from_millis(ms)).expect("in range");
    let scan = vec![at(&theirs, 1), at(&mine, 2), at(&stuck, 3), at(&mine, 4)];
    assert_eq!(ids(e.prefer_own_at(scan.clone(), later(6_000))), vec![2, 4], "no head seen yet: none stalled");
    // At t0 both accounts of theirs had the heads `stuck` still has at +6 s; by +3 s
    // `theirs` had settled a payout (its head moved), `stuck` had not.
    e.note_heads(&[at(&theirs, 0), at(&theirs, 1), at(&stuck, 3)], t0);
    e.note_heads(&scan, later(3_000));
    let six = later(6_000);
    assert_eq!(ids(e.prefer_own_at(scan.clone(), six)), vec![2, 3, 4], "own ones and the stalled one, in order");
    assert_eq!(ids(e.prefer_own_at(scan.clone(), later(4_999))), vec![2, 4], "a ms before the bound");
    let dry = vec![at(&theirs, 1), at(&theirs, 5)];
    assert_eq!(ids(e.prefer_own_at(dry, six)), vec![1, 5], "a dry run takes the others");
    let other = executor(1, 2, 5_000);
    assert_eq!(ids(other.prefer_own_at(scan.clone(), six)), vec![1, 3], "its own accounts, no head of mine seen");
    assert_eq!(ids(executor(0, 1, 5_000).prefer_own(scan.clone())), vec![1, 2, 3, 4], "one executor: all");
    let never_steal = executor(0, 2, crate::config::AFFINITY_STEAL_AFTER_MS_MAX);
    never_steal.note_heads(&scan, t0);
    assert_eq!(ids(never_steal.prefer_own_at(scan.clone(), six)), vec![2, 4]);
    let at_once = executor(0, 2, 0);
    at_once.note_heads(&scan, t0);
    assert_eq!(ids(at_once.prefer_own_at(scan, t0)), vec![1, 2, 3, 4], "a bound of 0 steals every head seen");
}

#[test]
fn shuffling_keeps_the_scan_order_between_states() {
    let mut c: Vec<Candidate> = (0..5)
        .map(|n| candidate(PayoutState::RailAcked, n))
        .chain((5..20).map(|n| candidate(PayoutState::Pending, n)))
        .collect();
    let mut rng = dlock_rt::rand::seeded(7);
    shuffle_within_states(&mut c, &mut rng);
    assert!(c[..5].iter().all(|x| x.state == PayoutState::RailAcked));
    assert!(c[5..].iter().all(|x| x.state == PayoutState::Pending));
    let mut ids: Vec<u128> = c.iter().map(|x| x.payout_id.as_u128()).collect();
    assert_ne!(ids, (0..20).collect::<Vec<_>>(), "seed 7 moves something");
    ids.sort_unstable();
    assert_eq!(ids, (0..20).collect::<Vec<_>>());
}
