//! Each checker, fed a hand-made violation, reports exactly its invariant (and nothing on
//! the clean version of the same data): the oracle can fail.

use super::*;
use chrono::{DateTime, Utc};
use dlock_contract::rail::SubmissionOutcome;
use dlock_lock_server::store::GrantRow;
use dlock_payment_resource::store::{Operation, StoredResponse};

fn at() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant")
}

fn invariants(fs: &[Failure]) -> Vec<&'static str> {
    fs.iter().map(|f| f.invariant).collect()
}

fn online(c: &Checker) -> Vec<&'static str> {
    c.failures().iter().map(|t| t.failure.invariant).collect()
}

fn uuid(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn write(op: FencedOp, account: &str, token: i64, verdict: FenceVerdictSeen) -> FencedWrite {
    FencedWrite {
        op,
        payout_id: uuid(1),
        account_id: account.into(),
        fence_account: account.into(),
        token,
        owner_id: "executor-a".into(),
        fenced: true,
        state_before: Some(PayoutState::Pending),
        verdict,
        identity: None,
        recorded: None,
        replayed: None,
        admission: None,
        batch_pass: None,
    }
}

fn accepted(op: FencedOp, account: &str, token: i64) -> FencedWrite {
    write(op, account, token, FenceVerdictSeen::Accepted)
}

fn facts(fence: i64, mark: i64) -> PaydbFacts {
    PaydbFacts {
        fences: [("a".to_owned(), fence)].into(),
        marks: [("a".to_owned(), mark)].into(),
        forwardable_tokens: vec![],
        unresolved: vec![],
        payout_account: Some("a".to_owned()),
    }
}

fn row(payout: Uuid, token: i64, outcome: Option<SubmissionOutcome>) -> SubmissionRow {
    SubmissionRow {
        submission_id: Uuid::from_u128(u128::from(token.unsigned_abs()) + 1000),
        payout_id: payout,
        account_id: "a".into(),
        presented_token: token,
        owner_id: "w".into(),
        idempotency_key: "k".into(),
        amount_minor: 1,
        currency: "EUR".into(),
        outcome,
        outcome_detail: None,
        rail_reference: None,
        submitted_at: at(),
        resolved_at: None,
    }
}

#[test]
fn a_payout_called_twice_by_the_rail_is_at_most_one_rail_call() {
    let p = uuid(7);
    let rows = [row(p, 5, Some(SubmissionOutcome::Acked)), row(p, 6, Some(SubmissionOutcome::Timeout))];
    assert!(rail_failures(&[p.to_string()], &rows).is_empty());
    let broken = rail_failures(&[p.to_string(), p.to_string()], &rows);
    assert_eq!(invariants(&broken), [ids::AT_MOST_ONE_RAIL_CALL], "{broken:?}");
    // Another payout's call between the two is not counted against it.
    let other = uuid(8);
    let rows = [row(p, 5, Some(SubmissionOutcome::Acked)), row(other, 5, Some(SubmissionOutcome::Acked))];
    let broken = rail_failures(&[p.to_string(), other.to_string(), p.to_string()], &rows);
    assert_eq!(invariants(&broken), [ids::AT_MOST_ONE_RAIL_CALL, ids::RAIL_CALL_HAS_INTENT], "{broken:?}");
    assert!(broken[0].detail.contains(&format!("payout {p} reached the rail 2 times")), "{broken:?}");
}

#[test]
fn a_rail_call_without_a_forwardable_intent_is_reported() {
    let p = uuid(7);
    let fenced_only = [row(p, 5, Some(SubmissionOutcome::Fenced)), row(p, 6, Some(SubmissionOutcome::Duplicate))];
    assert_eq!(invariants(&rail_failures(&[p.to_string()], &fenced_only)), [ids::RAIL_CALL_HAS_INTENT]);
    let admitted = [row(p, 6, Some(SubmissionOutcome::Acked))];
    assert!(rail_failures(&[p.to_string()], &admitted).is_empty());
}

#[test]
fn a_mark_that_disagrees_with_the_admitted_tokens_is_reported() {
    let p = uuid(7);
    let rows = [row(p, 7, Some(SubmissionOutcome::Acked)), row(p, 9, Some(SubmissionOutcome::Fenced))];
    let marks = |m: Option<i64>| m.map(|m| (rows[0].account_id.clone(), m)).into_iter().collect::<BTreeMap<_, _>>();
    assert!(mark_failures(&marks(Some(7)), &rows).is_empty());
    assert_eq!(invariants(&mark_failures(&marks(Some(9)), &rows)), [ids::MARK_EQUALS_HIGHEST_ADMITTED]);
    assert_eq!(invariants(&mark_failures(&marks(None), &rows)), [ids::MARK_EQUALS_HIGHEST_ADMITTED]);
    assert!(mark_failures(&BTreeMap::new(), &[]).is_empty());
}

fn account(id: &str, balance: i64, reserved: i64) -> AccountFacts {
    AccountFacts {
        account_id: id.into(),
        kind: AccountKind::Customer,
        balance_minor: balance,
        reserved_minor: reserved,
    }
}

fn entry(account: &str, direction: Direction, amount: i64) -> LedgerEntry {
    LedgerEntry {
        entry_id: Uuid::from_u128(amount as u128),
        posting_id: uuid(99),
        payout_id: None,
        account_id: account.into(),
        direction,
        amount_minor: amount,
        currency: "EUR".into(),
        fence: 0,
        created_at: at(),
    }
}

#[test]
fn an_unbalanced_ledger_is_reported_by_each_of_its_invariants() {
    let ledger = [entry("a", Direction::Credit, 100), entry("#funding:EUR", Direction::Debit, 100)];
    assert!(ledger_failures(&[account("a", 100, 40)], &ledger).is_empty());
    // The balance moved without its entries.
    assert_eq!(invariants(&ledger_failures(&[account("a", 90, 40)], &ledger)), [ids::BALANCE_IS_LEDGER_SUM]);
    // One side of a pair is missing.
    let half = [entry("a", Direction::Credit, 100), entry("#funding:EUR", Direction::Debit, 60)];
    assert_eq!(invariants(&ledger_failures(&[account("a", 100, 0)], &half)), [ids::DEBITS_EQUAL_CREDITS]);
    // More reserved than held.
    assert_eq!(invariants(&ledger_failures(&[account("a", 100, 101)], &ledger)), [ids::NO_NEGATIVE_AVAILABLE]);
}

#[test]
fn a_ledger_entry_of_a_payout_on_another_account_is_reported() {
    let of_payout = |account: &str, direction, payout| LedgerEntry {
        payout_id: Some(uuid(payout)),
        ..entry(account, direction, 100)
    };
    let accounts: BTreeMap<Uuid, String> = [(uuid(7), "a".to_owned()), (uuid(8), "b".to_owned())].into();
    let right = [of_payout("a", Direction::Debit, 7), of_payout("#settlement:EUR", Direction::Credit, 7)];
    assert!(ledger_account_failures(&right, &accounts).is_empty());
    // Payout 8 (of b) debited from a: money moved between accounts.
    let moved = [of_payout("a", Direction::Debit, 8), of_payout("#settlement:EUR", Direction::Credit, 8)];
    assert_eq!(invariants(&ledger_account_failures(&moved, &accounts)), [ids::LEDGER_ENTRY_ON_ITS_PAYOUTS_ACCOUNT]);
    // An entry of a payout paydb does not know.
    let unknown = [of_payout("a", Direction::Debit, 9)];
    assert_eq!(invariants(&ledger_account_failures(&unknown, &accounts)), [ids::LEDGER_ENTRY_ON_ITS_PAYOUTS_ACCOUNT]);
}

#[test]
fn a_fenced_write_accepted_under_another_accounts_fence_is_reported() {
    // A batch of account "a" that passed a's fence and wrote a payout of account "b".
    let mut w = accepted(FencedOp::Claim, "b", 5);
    w.fence_account = "a".into();
    w.batch_pass = Some(1);
    let facts_b = PaydbFacts { payout_account: Some("b".into()), ..facts(5, 0) };
    let mut c = Checker::new();
    c.on_fenced_write(&w, &facts_b, 1);
    assert_eq!(online(&c), [ids::FENCED_WRITE_WITHIN_ITS_ACCOUNT]);
    // The same batch on its own account's payout is clean; a refused one is not judged.
    let mut c = Checker::new();
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 5), &facts(5, 0), 1);
    let refused = FencedWrite { verdict: FenceVerdictSeen::Other, ..w.clone() };
    c.on_fenced_write(&refused, &facts_b, 2);
    assert!(online(&c).is_empty(), "{:?}", c.failures());
}

#[test]
fn a_token_accepted_after_a_larger_one_fails_at_that_acceptance() {
    let mut c = Checker::new();
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 7), &facts(7, 0), 10);
    // The rail's mark is another fence: a lower token there is not a regression here.
    c.on_fenced_write(&accepted(FencedOp::Admit, "a", 5), &facts(7, 5), 11);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    c.on_fenced_write(&accepted(FencedOp::Post, "a", 6), &facts(7, 5), 12);
    assert_eq!(online(&c), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
    assert_eq!(c.failures()[0].at_ms, 12, "it fires at the acceptance, not at the end");
    // Equal is not greater: the fence is strict.
    let mut c = Checker::new();
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 7), &facts(7, 0), 1);
    c.on_fenced_write(&accepted(FencedOp::Post, "a", 7), &facts(7, 0), 2);
    assert_eq!(online(&c), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
    // Refusals are not acceptances, and an admission with the rail fence off is not fenced.
    let mut c = Checker::new();
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 7), &facts(7, 0), 1);
    c.on_fenced_write(
        &write(FencedOp::Claim, "a", 3, FenceVerdictSeen::FencedOut { highest_token: 7 }),
        &facts(7, 0),
        2,
    );
    c.on_fenced_write(&accepted(FencedOp::Post, "a", 8), &facts(8, 0), 3);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    assert_eq!((c.acceptances, c.fenced_outs), (2, 1));
}

#[test]
fn a_batchs_payouts_share_its_one_pass_and_only_that_pass_may_repeat_its_token() {
    let in_pass = |payout: u128, token: i64, pass: Option<u64>| {
        let mut w = accepted(FencedOp::Claim, "a", token);
        w.payout_id = uuid(payout);
        w.batch_pass = pass;
        w
    };
    // One batch (pass 1): three payouts under token 7, then a post batch (pass 2) under 9.
    let mut c = Checker::new();
    for p in 1..=3 {
        c.on_fenced_write(&in_pass(p, 7, Some(1)), &facts(7, 0), 1);
    }
    let mut post = in_pass(1, 9, Some(2));
    post.op = FencedOp::Post;
    c.on_fenced_write(&post, &facts(9, 0), 2);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    assert_eq!(c.acceptances, 4);
    // Token 7 again in another pass, or in none, is a second acceptance of an equal token.
    for stray in [Some(3), None] {
        let mut c = Checker::new();
        c.on_fenced_write(&in_pass(1, 7, Some(1)), &facts(7, 0), 1);
        c.on_fenced_write(&in_pass(2, 7, stray), &facts(7, 0), 2);
        assert_eq!(online(&c), [ids::FENCE_ACCEPTS_RISING_TOKENS], "pass {stray:?}");
    }
    // A lower token is never excused by a pass.
    let mut c = Checker::new();
    c.on_fenced_write(&in_pass(1, 7, Some(1)), &facts(7, 0), 1);
    c.on_fenced_write(&in_pass(2, 6, Some(1)), &facts(7, 0), 2);
    assert_eq!(online(&c), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
}

#[test]
fn a_stale_token_taken_by_a_switched_off_fence_is_reported_unless_the_campaign_expects_it() {
    let mut stale = accepted(FencedOp::Admit, "a", 5);
    stale.fenced = false;
    let mut c = Checker::new();
    c.on_fenced_write(&accepted(FencedOp::Admit, "a", 9), &facts(0, 9), 1);
    c.on_fenced_write(&stale, &facts(0, 9), 2);
    assert_eq!(online(&c), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
    assert!(c.failures()[0].failure.detail.contains("switched off"), "{:?}", c.failures());
    let mut c = Checker::new();
    c.expect_layer_off(Fence::Rail);
    c.on_fenced_write(&accepted(FencedOp::Admit, "a", 9), &facts(0, 9), 1);
    c.on_fenced_write(&stale, &facts(0, 9), 2);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
}

#[test]
fn a_fence_declared_off_excuses_only_the_writes_that_bypassed_it() {
    // The claim's fence is off (defence in depth): a stale claim it let through is expected;
    // a stale post the same account fence did compare is still a finding.
    let mut stale_claim = accepted(FencedOp::Claim, "a", 5);
    stale_claim.fenced = false;
    let stale_post = accepted(FencedOp::Post, "a", 6);
    let mut c = Checker::new();
    c.expect_layer_off(Fence::Account);
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 9), &facts(9, 0), 1);
    c.on_fenced_write(&stale_claim, &facts(9, 0), 2);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    c.on_fenced_write(&stale_post, &facts(9, 0), 3);
    assert_eq!(online(&c), [ids::FENCE_ACCEPTS_RISING_TOKENS]);
    assert!(c.failures()[0].failure.detail.contains("token 6 at its post"), "{:?}", c.failures());
}

#[test]
fn a_decreasing_fence_or_mark_is_reported() {
    let mut c = Checker::new();
    c.sample(&facts(7, 9).fences, &facts(7, 9).marks, 1);
    c.sample(&facts(8, 9).fences, &facts(8, 9).marks, 2);
    assert!(c.failures().is_empty());
    c.sample(&facts(8, 4).fences, &facts(8, 4).marks, 3);
    assert_eq!(online(&c), [ids::MARK_NEVER_DECREASES]);
    let mut c = Checker::new();
    c.sample(&facts(7, 0).fences, &facts(7, 0).marks, 1);
    c.sample(&facts(6, 0).fences, &facts(6, 0).marks, 2);
    assert_eq!(online(&c), [ids::FENCE_NEVER_DECREASES]);
    // A fence that vanished decreased too.
    let mut c = Checker::new();
    c.sample(&facts(7, 0).fences, &BTreeMap::new(), 1);
    c.sample(&BTreeMap::new(), &BTreeMap::new(), 2);
    assert_eq!(online(&c), [ids::FENCE_NEVER_DECREASES]);
}

#[test]
fn a_resubmitted_ambiguous_payout_is_reported_even_when_refused() {
    let mut w = write(FencedOp::Admit, "a", 9, FenceVerdictSeen::Accepted);
    w.state_before = Some(PayoutState::RailAmbiguous);
    w.admission = Some("duplicate");
    let f = PaydbFacts { forwardable_tokens: vec![8], ..facts(0, 9) };
    let mut c = Checker::new();
    c.on_fenced_write(&w, &f, 5);
    assert_eq!(online(&c), [ids::AMBIGUOUS_NEVER_RESUBMITTED]);
    // A stale writer below the ambiguous attempt's token predates the ambiguity: the fence
    // stops it, and it is not a resubmission.
    let mut stale = write(FencedOp::Admit, "a", 4, FenceVerdictSeen::FencedOut { highest_token: 9 });
    stale.state_before = Some(PayoutState::RailAmbiguous);
    let mut c = Checker::new();
    c.on_fenced_write(&stale, &f, 5);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
}

/// A newer holder that claimed before the stale writer's attempt was admitted submits
/// after that attempt went ambiguous: a race it could not see, not a resubmission. The same
/// holder retrying (the ambiguous attempt's token), or a holder that claimed after the
/// admission, is still reported.
#[test]
fn a_newer_holder_that_claimed_before_the_ambiguous_attempt_is_not_a_resubmitter() {
    let submit_after_ambiguity = |token: i64| {
        let mut w = write(FencedOp::Admit, "a", token, FenceVerdictSeen::Other);
        w.state_before = Some(PayoutState::RailAmbiguous);
        w.admission = Some("duplicate");
        w
    };
    let mut stale_admit = write(FencedOp::Admit, "a", 10, FenceVerdictSeen::Accepted);
    stale_admit.admission = Some("admitted");
    let f = PaydbFacts { forwardable_tokens: vec![10], ..facts(20, 10) };
    // Claims 10 (the stale holder) and 20 (the newer one), then the stale admission.
    let mut c = Checker::new();
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 10), &facts(10, 0), 1);
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 20), &facts(20, 0), 2);
    c.on_fenced_write(&stale_admit, &f, 3);
    c.on_fenced_write(&submit_after_ambiguity(20), &f, 4);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    // The same holder retrying is reported.
    c.on_fenced_write(&submit_after_ambiguity(10), &f, 5);
    assert_eq!(online(&c), [ids::AMBIGUOUS_NEVER_RESUBMITTED]);
    // A claim accepted after the admission is reported.
    let mut c = Checker::new();
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 10), &facts(10, 0), 1);
    c.on_fenced_write(&stale_admit, &f, 2);
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 20), &facts(20, 10), 3);
    c.on_fenced_write(&submit_after_ambiguity(20), &f, 4);
    assert_eq!(online(&c), [ids::AMBIGUOUS_NEVER_RESUBMITTED]);
}

#[test]
fn a_replay_whose_bytes_differ_from_the_record_is_reported() {
    let identity: Identity = (Operation::Claim, uuid(1).to_string(), "k".into(), 7);
    let mut first = accepted(FencedOp::Claim, "a", 7);
    first.identity = Some(identity.clone());
    first.recorded = Some(StoredResponse { status: 200, body: b"{\"a\":1}".to_vec() });
    let mut replay = write(FencedOp::Claim, "a", 7, FenceVerdictSeen::Other);
    replay.identity = Some(identity);
    replay.replayed = Some(StoredResponse { status: 200, body: b"{\"a\":1}".to_vec() });
    let mut c = Checker::new();
    c.on_fenced_write(&first, &facts(7, 0), 1);
    c.on_fenced_write(&replay, &facts(7, 0), 2);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    replay.replayed = Some(StoredResponse { status: 200, body: b"{\"a\":2}".to_vec() });
    c.on_fenced_write(&replay, &facts(7, 0), 3);
    assert_eq!(online(&c), [ids::REPLAY_BYTE_IDENTICAL]);
}

fn grant(key: &str, session: u128, token: i64, now: i64, ttl: i64) -> LockEvent {
    LockEvent::Granted {
        grant: GrantRow {
            key: key.into(),
            session_id: uuid(session),
            owner_id: format!("w{session}"),
            fencing_token: token,
            acquired_at_ms: now,
            expires_at_ms: now + ttl,
        },
        now_ms: now,
    }
}

fn session(id: u128, end: i64) -> LockEvent {
    LockEvent::SessionEnds { session_id: uuid(id), expires_at_ms: end }
}

fn refused(refusal: Refusal, now: i64) -> LockEvent {
    LockEvent::Refused { refusal, now_ms: now }
}

#[test]
fn a_dead_grant_renewed_or_rotated_is_reported() {
    let renewed = |token, now| LockEvent::Renewed { key: "k".into(), token, expires_at_ms: now + 3_000, now_ms: now };
    let released = |token, now| LockEvent::Released { key: "k".into(), token, now_ms: now };
    // Live: renewed before its lease ends, rotated before its session ends.
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 5_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 3_000), 0);
    c.on_lock_event(&renewed(1, 2_999), 1);
    c.on_lock_event(&released(1, 4_999), 2);
    c.on_lock_event(&grant("k", 1, 2, 4_999, 3_000), 2);
    assert!(online(&c).is_empty(), "{:?}", c.failures());
    // Renewed at the very tick its lease ended.
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 10_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 3_000), 0);
    c.on_lock_event(&renewed(1, 3_000), 1);
    assert_eq!(online(&c), [ids::DEAD_GRANT_NEVER_REVIVED]);
    // Rotated after its session lapsed (the lease alone still ran).
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 1_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 60_000), 0);
    c.on_lock_event(&released(1, 1_500), 1);
    c.on_lock_event(&grant("k", 1, 2, 1_500, 60_000), 1);
    assert_eq!(online(&c), [ids::DEAD_GRANT_NEVER_REVIVED]);
    // Renewed after another token replaced it.
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 10_000), 0);
    c.on_lock_event(&session(2, 10_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 1_000), 0);
    c.on_lock_event(&grant("k", 2, 2, 1_000, 3_000), 1);
    c.on_lock_event(&renewed(1, 1_500), 2);
    assert_eq!(online(&c), [ids::DEAD_GRANT_NEVER_REVIVED]);
}

#[test]
fn a_lock_decision_its_records_do_not_justify_is_reported_in_both_directions() {
    use dlock_lock_server::store::SessionRefusal;
    let held = |session| Refusal::Held { key: "k".into(), session_id: uuid(session) };
    let lost = |token, session| Refusal::Lost { key: "k".into(), token, session_id: uuid(session) };
    let expired = |session| Refusal::Session { session_id: uuid(session), refusal: SessionRefusal::Expired };
    // Justified: held while the grant lives, lost once it died, expired once the session
    // ended, and a delay is not judged.
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 5_000), 0);
    c.on_lock_event(&session(2, 20_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 3_000), 0);
    c.on_lock_event(&refused(held(2), 2_999), 1);
    c.on_lock_event(&refused(lost(1, 1), 3_000), 2);
    c.on_lock_event(&refused(expired(1), 5_000), 3);
    c.on_lock_event(&refused(Refusal::Delayed { key: "k".into(), until_ms: 9_000 }, 5_001), 4);
    assert!(online(&c).is_empty(), "{:?}", c.failures());
    // The conservative direction, at the boundary: held at the very tick the lease ended.
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 10_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 3_000), 0);
    c.on_lock_event(&refused(held(2), 3_000), 1);
    assert_eq!(online(&c), [ids::LOCK_DECISION_JUSTIFIED]);
    // Lost while live; expired while live; held with no grant at all.
    for r in [lost(1, 1), expired(1), Refusal::Held { key: "free".into(), session_id: uuid(2) }] {
        let mut c = Checker::new();
        c.on_lock_event(&session(1, 10_000), 0);
        c.on_lock_event(&grant("k", 1, 1, 0, 3_000), 0);
        c.on_lock_event(&refused(r.clone(), 1_000), 1);
        assert_eq!(online(&c), [ids::LOCK_DECISION_JUSTIFIED], "{r:?}");
    }
    // A grant to a session that had ended, or was closed.
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 1_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 1_000, 3_000), 1);
    c.on_lock_event(&LockEvent::SessionClosed { session_id: uuid(3), now_ms: 1_100 }, 2);
    c.on_lock_event(&grant("j", 3, 2, 1_200, 3_000), 3);
    assert_eq!(online(&c), [ids::LOCK_DECISION_JUSTIFIED, ids::LOCK_DECISION_JUSTIFIED]);
}

#[test]
fn two_overlapping_grants_of_one_key_are_reported() {
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 10_000), 0);
    c.on_lock_event(&session(2, 10_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 3_000), 0);
    c.on_lock_event(&grant("k", 2, 2, 1_000, 3_000), 1);
    assert_eq!(online(&c), [ids::NO_TWO_LIVE_GRANTS]);
    // After a release, an expiry or a revoke the key is free.
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 10_000), 0);
    c.on_lock_event(&session(2, 20_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 3_000), 0);
    c.on_lock_event(&LockEvent::Released { key: "k".into(), token: 1, now_ms: 500 }, 0);
    c.on_lock_event(&grant("k", 2, 2, 1_000, 3_000), 0);
    c.on_lock_event(&grant("k", 1, 3, 4_000, 3_000), 0);
    c.on_lock_event(&LockEvent::Revoked { key: "k".into(), token: 3, new_token_floor: 4, now_ms: 4_100 }, 0);
    c.on_lock_event(&grant("k", 2, 5, 4_200, 3_000), 0);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    // A live grant the store dropped still lives for the oracle: the next grant overlaps.
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 10_000), 0);
    c.on_lock_event(&grant("k", 1, 1, 0, 3_000), 0);
    c.on_lock_event(&LockEvent::Dropped { key: "k".into(), token: 1, now_ms: 100 }, 0);
    c.on_lock_event(&grant("k", 2, 2, 200, 3_000), 0);
    assert_eq!(online(&c), [ids::NO_TWO_LIVE_GRANTS]);
}

#[test]
fn a_revoke_that_leaves_the_token_floor_at_or_below_the_revoked_token_is_reported() {
    let mut c = Checker::new();
    c.on_lock_event(&LockEvent::Revoked { key: "k".into(), token: 5, new_token_floor: 6, now_ms: 0 }, 0);
    assert!(c.failures().is_empty(), "{:?}", c.failures());
    c.on_lock_event(&LockEvent::Revoked { key: "k".into(), token: 9, new_token_floor: 6, now_ms: 10 }, 0);
    assert_eq!(online(&c), [ids::REVOKE_RAISES_FLOOR]);
}

#[test]
fn a_token_not_above_every_earlier_grant_is_reported() {
    let mut c = Checker::new();
    c.on_lock_event(&session(1, 100_000), 0);
    c.on_lock_event(&grant("k", 1, 5, 0, 1_000), 0);
    c.on_lock_event(&grant("other", 1, 4, 2_000, 1_000), 0);
    assert_eq!(online(&c), [ids::TOKENS_INCREASE]);
    // Below a revoke's floor is a regression too.
    let mut c = Checker::new();
    c.on_lock_event(&LockEvent::Revoked { key: "k".into(), token: 5, new_token_floor: 6, now_ms: 0 }, 0);
    c.on_lock_event(&grant("k", 1, 6, 0, 1_000), 0);
    assert_eq!(online(&c), [ids::TOKENS_INCREASE]);
}

#[test]
fn unsettled_payouts_and_unresolved_intents_are_liveness_failures() {
    let p = uuid(3);
    let done = [(p, PayoutState::Posted), (uuid(4), PayoutState::RailAmbiguous)];
    assert!(settle_failures(&done, &[row(p, 1, Some(SubmissionOutcome::Acked))]).is_empty());
    let open = settle_failures(&[(p, PayoutState::Submitted)], &[]);
    assert_eq!(invariants(&open), [ids::EVERY_PAYOUT_SETTLES]);
    assert_eq!(open[0].class, crate::outcome::FailureClass::Liveness);
    assert_eq!(invariants(&settle_failures(&done, &[row(p, 1, None)])), [ids::NO_UNRESOLVED_INTENT]);
}

#[test]
fn a_reconciler_report_that_differs_from_the_oracle_is_reported() {
    let known = Known {
        max_rail_calls_per_payout: 1,
        ambiguous: [uuid(1)].into(),
        ledger_balanced: true,
        payouts_by_state: [(PayoutState::Posted, 3), (PayoutState::Failed, 0)].into(),
    };
    let same = Known { payouts_by_state: [(PayoutState::Posted, 3)].into(), ..known.clone() };
    assert!(reconciler_failures(&known, &same).is_empty(), "zero counts do not count");
    let missed = Known { ambiguous: BTreeSet::new(), ..known.clone() };
    assert_eq!(invariants(&reconciler_failures(&known, &missed)), [ids::RECONCILER_AGREES]);
    let double = Known { max_rail_calls_per_payout: 2, ..known.clone() };
    assert_eq!(invariants(&reconciler_failures(&double, &known)), [ids::RECONCILER_AGREES]);
}

fn rail_call(
    payout: Uuid,
    paid: bool,
    outcome: dlock_contract::rail::RailCallOutcome,
    reference: &str,
) -> dlock_contract::rail::RailCall {
    dlock_contract::rail::RailCall {
        client_ref: payout.to_string(),
        amount_minor: 100,
        currency: "EUR".into(),
        outcome,
        paid,
        rail_reference: paid.then(|| reference.to_owned()),
        received_at: at(),
    }
}

#[test]
fn a_fenced_out_write_without_a_newer_holder_is_reported() {
    let fenced = |op, token, highest_token| write(op, "a", token, FenceVerdictSeen::FencedOut { highest_token });
    // Justified: a greater token holds the fence; the same claim presented again (a replay
    // of a write that passed).
    let mut c = Checker::new();
    c.on_fenced_write(&accepted(FencedOp::Claim, "a", 5), &facts(5, 0), 1);
    c.on_fenced_write(&fenced(FencedOp::Claim, 3, 5), &facts(5, 0), 2);
    c.on_fenced_write(&fenced(FencedOp::Claim, 5, 5), &facts(5, 0), 3);
    c.on_fenced_write(&accepted(FencedOp::Admit, "a", 6), &facts(5, 6), 4);
    c.on_fenced_write(&fenced(FencedOp::Admit, 6, 6), &facts(5, 6), 5);
    assert!(online(&c).is_empty(), "{:?}", c.failures());
    // A fence below the token refused it: nobody newer holds the account.
    let mut below = Checker::new();
    below.on_fenced_write(&fenced(FencedOp::Post, 8, 7), &facts(7, 0), 1);
    assert_eq!(online(&below), [ids::FENCED_OUT_HAS_NEWER_HOLDER]);
    assert_eq!(below.failures()[0].failure.class, crate::outcome::FailureClass::Correctness);
    // Fenced by its own token at another write: the post presented the claim's token.
    let mut own = Checker::new();
    own.on_fenced_write(&accepted(FencedOp::Claim, "a", 5), &facts(5, 0), 1);
    own.on_fenced_write(&fenced(FencedOp::Post, 5, 5), &facts(5, 0), 2);
    assert_eq!(online(&own), [ids::FENCED_OUT_HAS_NEWER_HOLDER]);
    // An equal token nobody passed before is no replay either.
    let mut never = Checker::new();
    never.on_fenced_write(&fenced(FencedOp::Claim, 5, 5), &facts(5, 0), 1);
    assert_eq!(online(&never), [ids::FENCED_OUT_HAS_NEWER_HOLDER]);
}

#[test]
fn a_reconciler_finding_that_differs_from_the_rails_record_is_reported_payout_by_payout() {
    use dlock_contract::rail::{RailCallLog, RailCallOutcome};
    // Payout 1 was paid by a call the rail dropped (no answer); 2 was declined; 3 was paid
    // twice; 4 was called twice and paid once.
    let log = RailCallLog {
        calls: vec![
            rail_call(uuid(1), true, RailCallOutcome::Dropped, "RR-1"),
            rail_call(uuid(2), false, RailCallOutcome::Declined, ""),
            rail_call(uuid(3), true, RailCallOutcome::Accepted, "RR-3a"),
            rail_call(uuid(3), true, RailCallOutcome::Accepted, "RR-3b"),
            rail_call(uuid(4), false, RailCallOutcome::Error, ""),
            rail_call(uuid(4), true, RailCallOutcome::Accepted, "RR-4"),
        ],
    };
    let truth = RailTruth::of(&log);
    let right = Stated {
        rail_read: true,
        ambiguous: [
            (uuid(1), (AmbiguousClass::Paid, Some("RR-1".to_owned()))),
            (uuid(2), (AmbiguousClass::NotPaid, None)),
            (uuid(3), (AmbiguousClass::Unknown, None)),
        ]
        .into(),
        double_payments: [uuid(3)].into(),
        repeated_calls: [uuid(4)].into(),
    };
    assert!(reconciler_truth_failures(&truth, &right).is_empty());
    // The rail's answer taken for what it did: the dropped paid call read as not paid.
    let mut by_answer = right.clone();
    by_answer.ambiguous.insert(uuid(1), (AmbiguousClass::NotPaid, None));
    let found = reconciler_truth_failures(&truth, &by_answer);
    assert_eq!(invariants(&found), [ids::RECONCILER_MATCHES_RAIL]);
    assert_eq!(found[0].class, crate::outcome::FailureClass::Correctness);
    assert!(found[0].detail.contains("classified NOT_PAID"), "{}", found[0].detail);
    // The wrong reference for the paying call.
    let mut wrong_ref = right.clone();
    wrong_ref.ambiguous.insert(uuid(1), (AmbiguousClass::Paid, Some("RR-9".to_owned())));
    assert_eq!(invariants(&reconciler_truth_failures(&truth, &wrong_ref)), [ids::RECONCILER_MATCHES_RAIL]);
    // A double payment missed, and one the record does not support.
    let missed = Stated { double_payments: BTreeSet::new(), ..right.clone() };
    assert_eq!(invariants(&reconciler_truth_failures(&truth, &missed)), [ids::RECONCILER_MATCHES_RAIL]);
    let unsupported = Stated { double_payments: [uuid(3), uuid(2)].into(), ..right.clone() };
    assert_eq!(invariants(&reconciler_truth_failures(&truth, &unsupported)), [ids::RECONCILER_MATCHES_RAIL]);
    let no_repeat = Stated { repeated_calls: BTreeSet::new(), ..right.clone() };
    assert_eq!(invariants(&reconciler_truth_failures(&truth, &no_repeat)), [ids::RECONCILER_MATCHES_RAIL]);
    // A report that could not read the rail says UNKNOWN for everything, and is not held
    // to the findings only the record gives.
    let unread = Stated {
        rail_read: false,
        ambiguous: right.ambiguous.keys().map(|p| (*p, (AmbiguousClass::Unknown, None))).collect(),
        ..Stated::default()
    };
    assert!(reconciler_truth_failures(&truth, &unread).is_empty());
}

#[cfg(madsim)]
#[test]
fn a_revoked_or_drifted_holder_fenced_out_fires_its_correlation_probe() {
    probe::reset();
    let mut c = Checker::new();
    c.note_drifted_owner("executor-slow");
    c.on_lock_event(&LockEvent::Revoked { key: "k".into(), token: 5, new_token_floor: 6, now_ms: 0 }, 0);
    c.on_fenced_write(
        &write(FencedOp::Claim, "a", 4, FenceVerdictSeen::FencedOut { highest_token: 6 }),
        &facts(6, 0),
        1,
    );
    assert_eq!(probe::snapshot().get(&Probe::RevokeFencedHolder), None, "token 4 was not revoked");
    c.on_fenced_write(
        &write(FencedOp::Post, "a", 5, FenceVerdictSeen::FencedOut { highest_token: 6 }),
        &facts(6, 0),
        2,
    );
    assert_eq!(probe::snapshot().get(&Probe::RevokeFencedHolder), Some(&1));
    let mut slow = write(FencedOp::Admit, "a", 3, FenceVerdictSeen::FencedOut { highest_token: 6 });
    slow.owner_id = "executor-slow-1".into();
    c.on_fenced_write(&slow, &facts(6, 6), 3);
    assert_eq!(probe::snapshot().get(&Probe::DriftCaughtByFence), Some(&1));
    c.on_lock_event(&session(1, 10_000), 0);
    c.on_lock_event(&grant("k", 1, 7, 100, 5_000), 100);
    assert!(!c.partition_healed(50, 1_000), "the grant came after the partition began");
    assert!(c.partition_healed(500, 1_000));
    assert_eq!(probe::snapshot().get(&Probe::PartitionHealedMidLease), Some(&1));
    // A rotate after the partition began carries the holder's hold on (E-18); a grant to
    // another session does not.
    c.on_lock_event(&LockEvent::Released { key: "k".into(), token: 7, now_ms: 600 }, 600);
    c.on_lock_event(&grant("k", 1, 8, 600, 5_000), 600);
    assert!(c.partition_healed(500, 1_000), "rotated from a grant taken before the partition");
    c.on_lock_event(&LockEvent::Released { key: "k".into(), token: 8, now_ms: 700 }, 700);
    c.on_lock_event(&grant("k", 1, 9, 800, 5_000), 800);
    assert!(!c.partition_healed(500, 1_000), "granted anew after it began");
}

// ---- the wire checks ---------------------------------------------------------------

fn envelope(code: &str, retry_safe: bool) -> dlock_rt::wire_log::Fate {
    let body = format!(r#"{{"code":"{code}","message":"m","retrySafe":{retry_safe},"traceId":"t"}}"#);
    dlock_rt::wire_log::Fate::Answered { status: 503, body: body.into_bytes() }
}

fn wire(target: WireTarget, seq_sent: u64, seq_done: Option<u64>, fate: Option<dlock_rt::wire_log::Fate>) -> WireWrite {
    WireWrite { target, seq_sent, seq_done, fate }
}

fn claim_target(token: i64) -> WireTarget {
    WireTarget::Fenced { op: FencedOp::Claim, payout: uuid(1), token, key: "payout:k".into() }
}

#[test]
fn the_wire_log_parses_claims_posts_submissions_and_acquires_and_nothing_else() {
    let ex = |path: &str, headers: &[(&str, &str)], body: &str| dlock_rt::wire_log::Exchange {
        seq_sent: 1,
        seq_done: None,
        authority: "a:1".into(),
        method: "POST".into(),
        path: path.into(),
        headers: headers.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        request: body.as_bytes().to_vec(),
        fate: None,
    };
    let p = uuid(1);
    let fenced = [("x-fencing-token", "7"), ("x-idempotency-key", "payout:k")];
    let claim = parse_wire(&ex(&format!("/v1/payouts/{p}/claim"), &fenced, "{}")).expect("claim");
    assert_eq!(claim.target, claim_target(7));
    let post = parse_wire(&ex(&format!("/v1/payouts/{p}/post"), &fenced, "{}")).expect("post");
    assert!(matches!(post.target, WireTarget::Fenced { op: FencedOp::Post, token: 7, .. }));
    let body = format!(r#"{{"payoutId":"{p}"}}"#);
    let submit = parse_wire(&ex("/v1/rail/submissions", &fenced, &body)).expect("submission");
    assert!(matches!(submit.target, WireTarget::Fenced { op: FencedOp::Admit, payout, token: 7, .. } if payout == p));
    let s = uuid(9);
    let acquire = parse_wire(&ex("/v1/locks/payout:a/acquire", &[], &format!(r#"{{"sessionId":"{s}"}}"#)));
    assert_eq!(acquire.map(|w| w.target), Some(WireTarget::Acquire { session: s, key: "payout:a".into() }));
    assert_eq!(parse_wire(&ex("/v1/payouts", &fenced, "{}")), None);
    assert_eq!(parse_wire(&ex(&format!("/v1/sessions/{s}/heartbeat"), &[], "{}")), None);
}

#[test]
fn a_claim_answered_retry_safe_whose_effect_the_store_holds_is_a_trace() {
    let sends = [wire(claim_target(7), 1, Some(2), Some(envelope("NOT_LEADER", true)))];
    let clean = Effects::default();
    assert!(retry_safe_failures(&sends, &clean).is_empty());
    let planted = Effects { writes: [(FencedOp::Claim, uuid(1), 7)].into(), grants: vec![] };
    let broken = retry_safe_failures(&sends, &planted);
    assert_eq!(invariants(&broken), [ids::RETRY_SAFE_LEFT_NO_TRACE], "{broken:?}");
    assert!(broken[0].detail.contains("NOT_LEADER"), "{broken:?}");
    // A retry of the same identity that was not answered retry-safe may be what committed.
    let retried = [
        sends[0].clone(),
        wire(claim_target(7), 3, Some(4), Some(dlock_rt::wire_log::Fate::Answered { status: 200, body: vec![] })),
    ];
    assert!(retry_safe_failures(&retried, &planted).is_empty());
    // An answer that is not retry-safe (INTERNAL: unknown) may have committed.
    let unknown = [wire(claim_target(7), 1, Some(2), Some(envelope("INTERNAL", false)))];
    assert!(retry_safe_failures(&unknown, &planted).is_empty());
}

#[test]
fn a_submission_answered_retry_safe_with_a_forwardable_intent_row_is_a_trace() {
    let target = WireTarget::Fenced { op: FencedOp::Admit, payout: uuid(1), token: 5, key: "payout:k".into() };
    let sends = [wire(target, 1, Some(2), Some(envelope("RAIL_UNAVAILABLE", true)))];
    // An UNSENT row is not forwardable: PaydbRows::effects leaves it out.
    let rows =
        PaydbRows { submissions: vec![row(uuid(1), 5, Some(SubmissionOutcome::Unsent))], ..PaydbRows::default() };
    assert!(retry_safe_failures(&sends, &Effects { writes: rows.effects(), grants: vec![] }).is_empty());
    let rows = PaydbRows { submissions: vec![row(uuid(1), 5, None)], ..PaydbRows::default() };
    let broken = retry_safe_failures(&sends, &Effects { writes: rows.effects(), grants: vec![] });
    assert_eq!(invariants(&broken), [ids::RETRY_SAFE_LEFT_NO_TRACE], "{broken:?}");
}

#[test]
fn an_acquire_answered_retry_safe_that_the_lock_store_granted_is_a_trace() {
    let (s, key) = (uuid(9), "payout:a".to_owned());
    let target = WireTarget::Acquire { session: s, key: key.clone() };
    let contended = wire(target.clone(), 10, Some(20), Some(envelope("LOCK_CONTENDED", true)));
    // The grant commits while only the refused acquire was in flight.
    let planted = Effects { writes: BTreeSet::new(), grants: vec![(15, s, key.clone())] };
    let broken = retry_safe_failures(std::slice::from_ref(&contended), &planted);
    assert_eq!(invariants(&broken), [ids::RETRY_SAFE_LEFT_NO_TRACE], "{broken:?}");
    // ... or after it, before the session asked again.
    let late = Effects { writes: BTreeSet::new(), grants: vec![(25, s, key.clone())] };
    assert_eq!(
        invariants(&retry_safe_failures(std::slice::from_ref(&contended), &late)),
        [ids::RETRY_SAFE_LEFT_NO_TRACE]
    );
    // A later acquire that succeeded explains a grant in its window; another session's
    // grant is not this one's.
    let granted = wire(target, 30, Some(40), Some(dlock_rt::wire_log::Fate::Answered { status: 200, body: vec![] }));
    let fine = Effects { writes: BTreeSet::new(), grants: vec![(35, s, key.clone()), (15, uuid(8), key)] };
    assert!(retry_safe_failures(&[contended, granted], &fine).is_empty());
}

#[test]
fn an_answer_on_the_wire_that_differs_from_its_record_is_not_a_byte_identical_replay() {
    let record = (200u16, br#"{"payoutId":"1","traceId":"first"}"#.to_vec());
    let records: Records = [((FencedOp::Claim, uuid(1), 7, "payout:k".to_owned()), record.clone())].into();
    let answered = |status: u16, body: &[u8]| {
        wire(claim_target(7), 1, Some(2), Some(dlock_rt::wire_log::Fate::Answered { status, body: body.to_vec() }))
    };
    assert!(wire_replay_failures(&[answered(200, &record.1), answered(503, b"other")], &records).is_empty());
    let planted = answered(200, br#"{"payoutId":"1","traceId":"second"}"#);
    let broken = wire_replay_failures(&[answered(200, &record.1), planted], &records);
    assert_eq!(invariants(&broken), [ids::WIRE_REPLAY_BYTE_IDENTICAL], "{broken:?}");
    // An identity with no record (never committed) is not judged here.
    let other = WireWrite { target: claim_target(8), ..answered(409, b"x") };
    assert!(wire_replay_failures(&[other], &records).is_empty());
}

#[test]
fn a_batch_on_the_wire_is_each_payout_with_its_items_answer_and_the_batch_itself() {
    let (a, b) = (uuid(1), uuid(2));
    let ex = |path: &str, body: String, fate: Option<dlock_rt::wire_log::Fate>| dlock_rt::wire_log::Exchange {
        seq_sent: 1,
        seq_done: Some(2),
        authority: "a:1".into(),
        method: "POST".into(),
        path: path.into(),
        headers: [("x-fencing-token", "7"), ("x-idempotency-key", "claims:7")]
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        request: body.into_bytes(),
        fate,
    };
    let body = format!(r#"{{"payouts":[{{"payoutId":"{a}"}},{{"payoutId":"{b}"}}]}}"#);
    // Answered 200: each payout's fate is its item; the second item is a retry-safe refusal.
    let answer = serde_json::json!({"accountId": "acct", "presentedToken": 7, "items": [
        {"payoutId": a, "status": 200, "body": {"payoutId": a}},
        {"payoutId": b, "status": 503, "body": {"code": "NOT_READY", "message": "m", "retrySafe": true, "traceId": "t"}},
    ]});
    let fate = dlock_rt::wire_log::Fate::Answered { status: 200, body: serde_json::to_vec(&answer).expect("json") };
    let writes = parse_wire_all(&ex("/v1/accounts/acct/claims", body.clone(), Some(fate)));
    assert_eq!(writes.len(), 3, "{writes:?}");
    assert_eq!(
        writes[0].target,
        WireTarget::Fenced { op: FencedOp::Claim, payout: a, token: 7, key: "claims:7".into() }
    );
    assert_eq!(writes[0].retry_safe_code(), None);
    assert_eq!(writes[1].retry_safe_code().as_deref(), Some("NOT_READY"));
    assert!(
        matches!(&writes[2].target, WireTarget::Batch { op: FencedOp::Claim, account, token: 7, .. } if account == "acct")
    );
    // A retry-safe item whose claim paydb holds is a trace, judged like a single claim.
    let held = Effects { writes: [(FencedOp::Claim, b, 7)].into(), grants: vec![] };
    assert_eq!(invariants(&retry_safe_failures(&writes, &held)), [ids::RETRY_SAFE_LEFT_NO_TRACE]);
    // A whole-batch refusal is every payout's.
    let refused = Some(envelope("NOT_READY", true));
    let writes = parse_wire_all(&ex("/v1/accounts/acct/posts", body, refused));
    assert!(writes[..2].iter().all(|w| w.retry_safe_code().as_deref() == Some("NOT_READY")), "{writes:?}");
    // R1b: each submission with its own key, no batch identity.
    let subs = format!(r#"{{"accountId":"acct","submissions":[{{"payoutId":"{a}","idempotencyKey":"payout:a"}}]}}"#);
    let writes = parse_wire_all(&ex(dlock_rail_client::SUBMISSION_BATCHES_PATH, subs, None));
    assert_eq!(writes.len(), 1);
    assert_eq!(
        writes[0].target,
        WireTarget::Fenced { op: FencedOp::Admit, payout: a, token: 7, key: "payout:a".into() }
    );
}

#[test]
fn a_batch_answered_other_than_its_record_is_not_a_byte_identical_replay() {
    let target = WireTarget::Batch { op: FencedOp::Post, account: "acct".into(), token: 9, key: "posts:9".into() };
    let answered = |status: u16, body: &[u8]| {
        wire(target.clone(), 1, Some(2), Some(dlock_rt::wire_log::Fate::Answered { status, body: body.to_vec() }))
    };
    let records: BatchRecords =
        [((FencedOp::Post, "acct".to_owned(), 9, "posts:9".to_owned()), (200, b"first".to_vec()))].into();
    assert!(wire_batch_replay_failures(&[answered(200, b"first"), answered(503, b"x")], &records).is_empty());
    let broken = wire_batch_replay_failures(&[answered(200, b"second")], &records);
    assert_eq!(invariants(&broken), [ids::WIRE_REPLAY_BYTE_IDENTICAL], "{broken:?}");
}
