//! The event outbox as paydb's stores write it (C3-extensions E-20): every change a SQL
//! trigger watches writes its event in the transaction of the change, a refusal writes
//! none but for the fence's own refusal (`fence.refused`, in a transaction of its own), a
//! read pages with a final head, and the retention purge keeps the newest events without
//! ever reusing a seq. The same on SQLite, PostgreSQL and the simulation store.

use chrono::{DateTime, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::stream::{EventKind, StoredEvent};
use dlock_payment_resource::store::{
    ClaimBatchOutcome, ClaimOutcome, CreateAccountOutcome, CreatePayoutOutcome, Idempotent, NewPayout, Operation,
    PostOutcome, ResolveOutcome,
};
use dlock_rail_proxy::store::{Admission, Resolution};
use serde_json::{json, Value};
use uuid::Uuid;

use super::{at, claim_batch_of, claim_of, fingerprint, fresh_key, idem, new_account, resolution_of, Paydb, EUR};

/// Reads that bring nothing new before a walk of the outbox ends, and the pause between
/// them: a PostgreSQL reader passes a hole (a seq rolled back or deleted) only once every
/// transaction in flight when it saw it has ended, the other tests' on the server included.
const IDLE_READS: u32 = 10;
const IDLE_READ_MS: u64 = 20;

/// One event as the suite compares it: kind, instant, account, payout, body.
pub type Seen = (EventKind, DateTime<Utc>, Option<String>, Option<String>, Value);

fn seen(e: &StoredEvent) -> Seen {
    (e.kind, e.at, e.account_id.clone(), e.payout_id.clone(), e.body.clone())
}

fn ev(kind: EventKind, at_ms: i64, payout: Option<Uuid>, body: Value) -> Seen {
    (kind, at(at_ms), Some("acct".into()), payout.map(|p| p.to_string()), body)
}

fn state_changed(at_ms: i64, payout: Uuid, from: &str, to: &str, attempts: i32, claim_token: i64) -> Seen {
    let body = json!({ "from": from, "to": to, "attemptCount": attempts, "claimToken": claim_token });
    ev(EventKind::PayoutStateChanged, at_ms, Some(payout), body)
}

fn fence_raised(at_ms: i64, previous: i64, token: i64) -> Seen {
    ev(EventKind::FenceRaised, at_ms, None, json!({ "previousFence": previous, "presentedToken": token }))
}

fn fence_refused(at_ms: i64, operation: &str, token: i64, fence: i64, owner: &str, payouts: &[Uuid]) -> Seen {
    let ids: Vec<String> = payouts.iter().map(Uuid::to_string).collect();
    let body = json!({
        "operation": operation, "presentedToken": token, "fence": fence, "ownerId": owner, "payoutIds": ids,
    });
    ev(EventKind::FenceRefused, at_ms, None, body)
}

impl Paydb {
    /// Every event after `after`, read page by page until a read brings nothing new (a
    /// PostgreSQL reader may stop below a hole, a rolled-back seq, a while:
    /// [`IDLE_READS`]).
    pub async fn events_after(&self, mut after: i64) -> Vec<StoredEvent> {
        let mut all = Vec::new();
        let mut idle = 0;
        while idle < IDLE_READS {
            let page = self.pay.read_events(after, 4).await.expect("read events");
            assert!(page.head >= after, "the head never goes back");
            if page.events.is_empty() && page.head == after {
                idle += 1;
                tokio::time::sleep(std::time::Duration::from_millis(IDLE_READ_MS)).await;
                continue;
            }
            idle = 0;
            assert!(page.events.iter().all(|e| e.seq > after && e.seq <= page.head), "{page:?}");
            all.extend(page.events);
            after = page.head;
        }
        all
    }

    /// The head: the highest final seq.
    pub async fn event_head(&self) -> i64 {
        self.events_after(0).await.last().map_or(0, |e| e.seq)
    }

    /// A PENDING payout of `amount` with the chosen id.
    async fn payout_with(&self, id: Uuid, amount: i64, now: DateTime<Utc>) {
        let p = NewPayout {
            payout_id: id,
            account_id: "acct".into(),
            amount_minor: amount,
            currency: EUR.into(),
            beneficiary_ref: "ben-1".into(),
            at: now,
        };
        let i = idem(Operation::CreatePayout, "payouts", &fresh_key(), 0, &fingerprint(), now);
        let created = self.pay.create_payout(&p, &i).await.expect("create payout");
        assert!(matches!(created, Idempotent::Executed { outcome: CreatePayoutOutcome::Created(_), .. }));
    }
}

/// `n` fresh payout ids in ascending order: a multi-row statement may touch its rows in key
/// order, so a batch named in key order has one event order on every backend.
fn sorted_ids(n: usize) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    ids.sort();
    ids
}

/// A scripted flow (an account, three payouts, a batch claim, a fenced-out claim, the
/// proxy's admissions and outcomes, a quarantine, a post, a fenced-out post, an operator's
/// resolution and an abandon) writes exactly the triggers' events and the fence's refusals,
/// in commit order, on every backend.
pub async fn every_change_writes_its_event_in_its_own_transaction_on_every_backend(db: Paydb) {
    let ids = sorted_ids(3);
    let (p1, p2, p3) = (ids[0], ids[1], ids[2]);
    db.account("acct", EUR, 1_000, at(0)).await;
    for (p, amount) in [(p1, 100), (p2, 200), (p3, 300)] {
        db.payout_with(p, amount, at(1)).await;
    }
    let mut expected: Vec<Seen> =
        vec![ev(EventKind::AccountCreated, 0, None, json!({ "currency": "EUR", "balanceMinor": 1_000 }))];
    for (p, amount) in [(p1, 100), (p2, 200), (p3, 300)] {
        let body = json!({ "amountMinor": amount, "currency": "EUR", "beneficiaryRef": "ben-1", "state": "PENDING" });
        expected.push(ev(EventKind::PayoutCreated, 1, Some(p), body));
    }
    // A batch claim: the fence once, then each payout in the request's order.
    let all3 = [(p1, PayoutState::Pending), (p2, PayoutState::Pending), (p3, PayoutState::Pending)];
    let claimed = db.claim_batch("acct", 5, &all3, at(2)).await;
    assert!(matches!(claimed, Idempotent::Executed { stored: Some(_), .. }), "{claimed:?}");
    expected.push(fence_raised(2, 0, 5));
    for p in [p1, p2, p3] {
        expected.push(state_changed(2, p, "PENDING", "CLAIMED", 0, 5));
    }
    // Fenced out: the refusal's own event, nothing else.
    let fenced = db.claim(p1, 4, PayoutState::Claimed, at(3)).await;
    assert!(matches!(fenced, Idempotent::Executed { outcome: ClaimOutcome::Fenced { .. }, stored: None }));
    expected.push(fence_refused(3, "claim", 4, 5, "worker-1", &[p1]));
    // The proxy: admitted and acknowledged; admitted and timed out (the quarantine).
    let s1 = db.submit(p1, 5, Some(Resolution::Acked { rail_reference: "RR-1".into() }), at(4)).await;
    let s2 = db.submit(p2, 6, Some(Resolution::Timeout { detail: "no answer".into() }), at(5)).await;
    for (t, p, s, token, amount, previous, outcome, to, reference) in [
        (4, p1, s1, 5, 100, 0, "ACKED", "RAIL_ACKED", json!("RR-1")),
        (5, p2, s2, 6, 200, 5, "TIMEOUT", "RAIL_AMBIGUOUS", Value::Null),
    ] {
        let submission = s.to_string();
        expected.extend([
            ev(EventKind::RailMarkRaised, t, None, json!({ "previousMark": previous, "presentedToken": token })),
            ev(
                EventKind::RailIntent,
                t,
                Some(p),
                json!({ "submissionId": submission, "presentedToken": token, "ownerId": "worker-1",
                        "amountMinor": amount, "currency": "EUR", "outcome": null }),
            ),
            state_changed(t, p, "CLAIMED", "SUBMITTED", 1, 5),
            ev(
                EventKind::RailOutcome,
                t,
                Some(p),
                json!({ "submissionId": submission, "presentedToken": token, "outcome": outcome,
                        "railReference": reference }),
            ),
            state_changed(t, p, "SUBMITTED", to, 1, 5),
        ]);
    }
    // A fenced attempt at the rail: its refused row.
    let stale = db.attempt(p3, 3, at(6)).await;
    assert_eq!(db.rail.admit(&stale).await, Ok(Admission::Fenced { highest_token: 6 }));
    expected.push(ev(
        EventKind::RailRefused,
        6,
        Some(p3),
        json!({ "submissionId": stale.submission_id.to_string(), "presentedToken": 3, "ownerId": "worker-1",
                "amountMinor": 300, "currency": "EUR", "outcome": "FENCED" }),
    ));
    // The post: the fence, then the payout; a stale post is fenced out.
    let posted = db.post(p1, 7, s1, "RR-1", at(7)).await;
    assert!(matches!(posted, Idempotent::Executed { outcome: PostOutcome::Posted { .. }, .. }), "{posted:?}");
    expected.extend([fence_raised(7, 5, 7), state_changed(7, p1, "RAIL_ACKED", "POSTED", 1, 5)]);
    let stale_post = db.post(p1, 6, s1, "RR-1", at(8)).await;
    assert!(matches!(stale_post, Idempotent::Executed { outcome: PostOutcome::Fenced { .. }, stored: None }));
    expected.push(fence_refused(8, "post", 6, 7, "worker-2", &[p1]));
    // The operator: the quarantined payout resolved as FAILED; another abandoned.
    let r = resolution_of(p2, PayoutState::Failed, at(9));
    assert!(matches!(db.pay.resolve_ambiguous(&r).await, Ok(ResolveOutcome::Resolved { .. })));
    expected.extend([
        state_changed(9, p2, "RAIL_AMBIGUOUS", "FAILED", 1, 5),
        ev(
            EventKind::OperatorResolution,
            9,
            Some(p2),
            json!({ "resolutionId": r.resolution_id.to_string(), "resolvedAs": "FAILED", "operator": "ops-alice",
                    "reason": "rail statement line checked by hand", "railReference": "RR-statement-1" }),
        ),
    ]);
    assert!(db.pay.abandon(p3, at(10)).await.is_ok());
    expected.push(state_changed(10, p3, "CLAIMED", "ABANDONED", 0, 5));

    let got: Vec<Seen> = db.events_after(0).await.iter().map(seen).collect();
    assert_eq!(got.len(), expected.len(), "{got:#?}");
    for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "event {k}");
    }
}

/// A refused write (an account or payout that exists, an unknown account, a payout not
/// claimable, a batch that moves nothing, an idempotency conflict, a replay) leaves no
/// event; a fenced-out claim or batch leaves exactly its `fence.refused`.
pub async fn a_refused_write_leaves_no_event_but_a_fenced_out_one_leaves_its_refusal(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    let p = db.payout("acct", 100, at(1)).await;
    db.claimed(p, 5, PayoutState::Pending, at(2)).await;
    let head = db.event_head().await;
    // The account exists.
    let a = new_account("acct", EUR, 10, at(3));
    let i = idem(Operation::CreateAccount, "accounts", &fresh_key(), 0, &fingerprint(), at(3));
    assert!(matches!(
        db.pay.create_account(&a, &i).await,
        Ok(Idempotent::Executed { outcome: CreateAccountOutcome::Exists, stored: None })
    ));
    // An unknown account.
    let q = super::new_payout("nobody", 10, EUR, at(3));
    let i = idem(Operation::CreatePayout, "payouts", &fresh_key(), 0, &fingerprint(), at(3));
    assert!(matches!(
        db.pay.create_payout(&q, &i).await,
        Ok(Idempotent::Executed { outcome: CreatePayoutOutcome::UnknownAccount, stored: None })
    ));
    // Not claimable, under a newer token: the fence would rise, but nothing moved.
    let refused = db.claim(p, 9, PayoutState::Pending, at(4)).await;
    assert!(matches!(refused, Idempotent::Executed { outcome: ClaimOutcome::NotClaimable { .. }, stored: None }));
    let nothing = db.claim_batch("acct", 9, &[(p, PayoutState::Pending)], at(4)).await;
    assert!(matches!(nothing, Idempotent::Executed { stored: None, .. }), "{nothing:?}");
    // A replay and a conflict under one identity.
    let c = claim_of(p, 6, PayoutState::Claimed, at(5));
    let i = idem(Operation::Claim, &p.to_string(), "k-1", 6, &fingerprint(), at(5));
    assert!(matches!(db.pay.claim(&c, &i).await, Ok(Idempotent::Executed { stored: Some(_), .. })));
    let after_reclaim = db.event_head().await;
    assert_eq!(db.events_after(head).await.len(), 1, "the re-claim raised the fence; the state did not change");
    assert!(matches!(db.pay.claim(&c, &i).await, Ok(Idempotent::Replayed(_))));
    let other = idem(Operation::Claim, &p.to_string(), "k-1", 6, &fingerprint(), at(5));
    assert!(matches!(db.pay.claim(&c, &other).await, Ok(Idempotent::Conflict)));
    assert_eq!(db.events_after(after_reclaim).await, Vec::new(), "no refusal wrote an event");
    // Fenced out, single and batch: one `fence.refused` each, nothing else.
    let fenced = db.claim(p, 6, PayoutState::Claimed, at(6)).await;
    assert!(matches!(fenced, Idempotent::Executed { outcome: ClaimOutcome::Fenced { .. }, stored: None }));
    let b = claim_batch_of("acct", 2, &[(p, PayoutState::Claimed)], at(7));
    let i =
        idem(Operation::Claim, &dlock_contract::batch::batch_target("acct"), &fresh_key(), 2, &fingerprint(), at(7));
    let batch = db.pay.claim_batch(&b, &i).await.expect("batch");
    assert!(matches!(batch, Idempotent::Executed { outcome: ClaimBatchOutcome::Fenced { highest_token: 6 }, .. }));
    let got: Vec<Seen> = db.events_after(after_reclaim).await.iter().map(seen).collect();
    assert_eq!(
        got,
        vec![fence_refused(6, "claim", 6, 6, "worker-1", &[p]), fence_refused(7, "claim", 2, 6, "worker-1", &[p])]
    );
}

/// A read returns at most `limit` final events after `after`, in seq order, and a head at
/// or above `after` below which every seq is final: paging by the head reads each once.
pub async fn event_reads_page_by_their_final_head(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    for k in 0..4 {
        db.payout("acct", 10, at(1 + k)).await;
    }
    let all = db.events_after(0).await;
    assert_eq!(all.len(), 5);
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "seq order");
    let first = db.pay.read_events(0, 2).await.expect("read");
    assert_eq!(first.events, all[..2].to_vec());
    assert_eq!(first.head, all[1].seq);
    let rest = db.pay.read_events(first.head, 10).await.expect("read");
    assert_eq!(rest.events, all[2..].to_vec());
    assert_eq!(rest.head, all[4].seq);
    let none = db.pay.read_events(rest.head, 10).await.expect("read");
    assert!(none.events.is_empty());
    assert_eq!((none.head, none.purged_through), (rest.head, 0));
    // Below a head already known final, a read of a range answers it, paged the same way.
    let upto = all[3].seq;
    let range = db.pay.read_final_events(all[0].seq, upto, 2).await.expect("read");
    assert_eq!((range.events.clone(), range.head), (all[1..3].to_vec(), all[2].seq));
    let tail = db.pay.read_final_events(range.head, upto, 10).await.expect("read");
    assert_eq!((tail.events.clone(), tail.head), (all[3..4].to_vec(), upto));
}

/// The purge keeps the newest `keep` events and marks the highest seq it deleted; a seq
/// is never reused after it.
pub async fn the_purge_keeps_the_newest_events_and_never_reuses_a_seq(db: Paydb) {
    db.account("acct", EUR, 1_000, at(0)).await;
    for k in 0..4 {
        db.payout("acct", 10, at(1 + k)).await;
    }
    let all = db.events_after(0).await;
    assert_eq!(db.pay.purge_events(2).await, Ok(3));
    let read = db.pay.read_events(0, 10).await.expect("read");
    assert_eq!(read.events, all[3..].to_vec());
    assert_eq!(read.purged_through, all[2].seq);
    assert_eq!(read.head, all[4].seq);
    assert_eq!(db.pay.purge_events(2).await, Ok(0), "nothing more to purge");
    assert_eq!(db.pay.purge_events(0).await, Ok(2));
    let empty = db.pay.read_events(0, 10).await.expect("read");
    assert!(empty.events.is_empty());
    assert_eq!(empty.purged_through, all[4].seq);
    db.payout("acct", 10, at(9)).await;
    let next = db.events_after(all[4].seq).await;
    assert_eq!(next.len(), 1);
    assert!(next[0].seq > all[4].seq, "seq {} reused", next[0].seq);
}
