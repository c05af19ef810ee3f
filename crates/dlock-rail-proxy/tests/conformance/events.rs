//! The event outbox as the proxy's store writes it (C3-extensions E-20): every change the
//! SQL triggers watch writes its event in its own transaction, with the same kind, account,
//! payout and body on every backend, and a read pages through them with a final head.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::stream::{EventKind, StoredEvent};
use dlock_rail_proxy::store::{Admission, Checked, NewPayout, RailStore, Resolution, StoreError};
use serde_json::{json, Value};
use uuid::Uuid;

use super::{asked, attempt, t0};

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

fn ms(at_ms: i64) -> DateTime<Utc> {
    t0() + Duration::milliseconds(at_ms)
}

/// Every event after `after`, read page by page until a read brings nothing new (a
/// PostgreSQL reader may stop below a hole a while: [`IDLE_READS`]).
pub async fn events_after(store: &Arc<dyn RailStore>, mut after: i64) -> Vec<StoredEvent> {
    let mut all = Vec::new();
    let mut idle = 0;
    while idle < IDLE_READS {
        let page = store.read_events(after, 3).await.expect("read events");
        assert!(page.head >= after, "the head never goes back");
        if page.events.is_empty() && page.head == after {
            idle += 1;
            tokio::time::sleep(std::time::Duration::from_millis(IDLE_READ_MS)).await;
            continue;
        }
        idle = 0;
        if let Some(last) = page.events.last() {
            assert!(last.seq <= page.head, "every event returned is at or below the head");
        }
        all.extend(page.events);
        after = page.head;
    }
    all
}

/// A payout of the suite's terms with a chosen id.
async fn payout_with(store: &Arc<dyn RailStore>, id: Uuid, account: &str, state: PayoutState) {
    let p = NewPayout {
        payout_id: id,
        account_id: account.to_owned(),
        amount_minor: 1_000,
        currency: "EUR".into(),
        beneficiary_ref: "ben".into(),
        state,
    };
    store.insert_payout(&p, t0()).await.expect("insert payout");
}

/// `n` fresh payout ids in ascending order: a multi-row statement may touch its rows in key
/// order, so a batch named in key order has one event order on every backend.
fn sorted_ids(n: usize) -> Vec<Uuid> {
    let mut ids: Vec<Uuid> = (0..n).map(|_| Uuid::new_v4()).collect();
    ids.sort();
    ids
}

fn ev(kind: EventKind, at_ms: i64, account: &str, payout: Option<Uuid>, body: Value) -> Seen {
    (kind, ms(at_ms), Some(account.to_owned()), payout.map(|p| p.to_string()), body)
}

fn state_changed(at_ms: i64, payout: Uuid, from: &str, to: &str, attempts: i32) -> Seen {
    let body = json!({ "from": from, "to": to, "attemptCount": attempts, "claimToken": null });
    (EventKind::PayoutStateChanged, ms(at_ms), Some("acct".into()), Some(payout.to_string()), body)
}

fn submission(kind: EventKind, at_ms: i64, payout: Uuid, submission_id: Uuid, token: i64, outcome: Value) -> Seen {
    let body = json!({
        "submissionId": submission_id.to_string(), "presentedToken": token, "ownerId": "worker-1",
        "amountMinor": 1_000, "currency": "EUR", "outcome": outcome,
    });
    ev(kind, at_ms, "acct", Some(payout), body)
}

fn outcome(at_ms: i64, payout: Uuid, submission_id: Uuid, token: i64, o: &str, reference: Value) -> Seen {
    let body = json!({
        "submissionId": submission_id.to_string(), "presentedToken": token, "outcome": o, "railReference": reference,
    });
    ev(EventKind::RailOutcome, at_ms, "acct", Some(payout), body)
}

fn mark(at_ms: i64, previous: i64, token: i64) -> Seen {
    ev(EventKind::RailMarkRaised, at_ms, "acct", None, json!({ "previousMark": previous, "presentedToken": token }))
}

/// A scripted flow (payouts inserted, an admission and its acknowledgement, a fenced and a
/// duplicate attempt, a timeout that quarantines, a batch with a payout not claimable and
/// its resolutions) writes exactly the trigger's events, in commit order, on every backend.
pub async fn every_rail_change_writes_its_event_in_its_own_transaction_on_every_backend(store: Arc<dyn RailStore>) {
    let ids = sorted_ids(5);
    let (p1, p2, p3, p4, p5) = (ids[0], ids[1], ids[2], ids[3], ids[4]);
    for (p, state) in [(p1, PayoutState::Claimed), (p2, PayoutState::Claimed), (p3, PayoutState::Claimed)] {
        payout_with(&store, p, "acct", state).await;
    }
    payout_with(&store, p4, "acct", PayoutState::Claimed).await;
    payout_with(&store, p5, "acct", PayoutState::Pending).await;
    let mut expected: Vec<Seen> =
        vec![ev(EventKind::AccountCreated, 0, "acct", None, json!({ "currency": "EUR", "balanceMinor": 0 }))];
    for (p, state) in [(p1, "CLAIMED"), (p2, "CLAIMED"), (p3, "CLAIMED"), (p4, "CLAIMED"), (p5, "PENDING")] {
        let body = json!({ "amountMinor": 1_000, "currency": "EUR", "beneficiaryRef": "ben", "state": state });
        expected.push(ev(EventKind::PayoutCreated, 0, "acct", Some(p), body));
    }

    // Admitted, then acknowledged.
    let a1 = attempt(p1, "acct", 5, 10);
    assert_eq!(store.admit(&a1).await, Ok(Admission::Admitted { submitted_at: a1.at }));
    store.resolve(a1.submission_id, &Resolution::Acked { rail_reference: "RR-1".into() }, ms(11)).await.expect("ack");
    expected.extend([
        mark(10, 0, 5),
        submission(EventKind::RailIntent, 10, p1, a1.submission_id, 5, Value::Null),
        state_changed(10, p1, "CLAIMED", "SUBMITTED", 1),
        outcome(11, p1, a1.submission_id, 5, "ACKED", json!("RR-1")),
        state_changed(11, p1, "SUBMITTED", "RAIL_ACKED", 1),
    ]);
    // Fenced: its row, nothing else. A resolution already recorded writes nothing.
    let stale = attempt(p2, "acct", 5, 12);
    assert_eq!(store.admit(&stale).await, Ok(Admission::Fenced { highest_token: 5 }));
    store.resolve(a1.submission_id, &Resolution::Acked { rail_reference: "RR-1".into() }, ms(12)).await.expect("again");
    expected.push(submission(EventKind::RailRefused, 12, p2, stale.submission_id, 5, json!("FENCED")));
    // A duplicate under a newer token: the mark rises, then its refused row.
    let dup = attempt(p1, "acct", 6, 13);
    assert!(matches!(store.admit(&dup).await, Ok(Admission::Duplicate { .. })));
    expected
        .extend([mark(13, 5, 6), submission(EventKind::RailRefused, 13, p1, dup.submission_id, 6, json!("DUPLICATE"))]);
    // A timeout quarantines.
    let a2 = attempt(p2, "acct", 7, 14);
    assert_eq!(store.admit(&a2).await, Ok(Admission::Admitted { submitted_at: a2.at }));
    store
        .resolve(a2.submission_id, &Resolution::Timeout { detail: "no answer".into() }, ms(15))
        .await
        .expect("timeout");
    expected.extend([
        mark(14, 6, 7),
        submission(EventKind::RailIntent, 14, p2, a2.submission_id, 7, Value::Null),
        state_changed(14, p2, "CLAIMED", "SUBMITTED", 1),
        outcome(15, p2, a2.submission_id, 7, "TIMEOUT", Value::Null),
        state_changed(15, p2, "SUBMITTED", "RAIL_AMBIGUOUS", 1),
    ]);
    // A batch: two admitted, one not claimable (nothing of it stays, its event neither).
    let stamp = || (Uuid::new_v4(), ms(16));
    let batch = [asked(p3, "acct", 8), asked(p4, "acct", 8), asked(p5, "acct", 8)];
    let checked = store.admit_batch(&batch, &stamp).await.expect("batch");
    let sid = |k: usize| match &checked[k] {
        Checked::Decided { attempt, .. } => attempt.submission_id,
        other => panic!("{other:?}"),
    };
    assert!(matches!(&checked[2], Checked::Decided { admission: Admission::NotClaimable { .. }, .. }), "{checked:?}");
    let (s3, s4) = (sid(0), sid(1));
    expected.extend([
        mark(16, 7, 8),
        submission(EventKind::RailIntent, 16, p3, s3, 8, Value::Null),
        submission(EventKind::RailIntent, 16, p4, s4, 8, Value::Null),
        state_changed(16, p3, "CLAIMED", "SUBMITTED", 1),
        state_changed(16, p4, "CLAIMED", "SUBMITTED", 1),
    ]);
    // Their outcomes, one transaction: each outcome, then the payout it moves.
    let outcomes =
        [(s3, Resolution::Rejected { detail: "closed".into() }), (s4, Resolution::Unsent { detail: "refused".into() })];
    store.resolve_batch(&outcomes, ms(17)).await.expect("resolve batch");
    expected.extend([
        outcome(17, p3, s3, 8, "REJECTED", Value::Null),
        state_changed(17, p3, "SUBMITTED", "FAILED", 1),
        outcome(17, p4, s4, 8, "UNSENT", Value::Null),
        state_changed(17, p4, "SUBMITTED", "CLAIMED", 1),
    ]);

    let got: Vec<Seen> = events_after(&store, 0).await.iter().map(seen).collect();
    assert_eq!(got.len(), expected.len(), "{got:#?}");
    for (k, (g, e)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(g, e, "event {k}");
    }
}

/// A write the store refuses (a batch of another shape, a payout inserted twice, an unknown
/// submission resolved) leaves no event.
pub async fn a_refused_rail_write_leaves_no_event(store: Arc<dyn RailStore>) {
    let p = super::payout(&store, "acct", PayoutState::Claimed).await;
    let q = super::payout(&store, "acct", PayoutState::Claimed).await;
    let before = events_after(&store, 0).await;
    let head = before.last().map_or(0, |e| e.seq);
    let twice = NewPayout {
        payout_id: p,
        account_id: "acct".into(),
        amount_minor: 1_000,
        currency: "EUR".into(),
        beneficiary_ref: "ben".into(),
        state: PayoutState::Claimed,
    };
    assert!(store.insert_payout(&twice, t0()).await.is_err());
    let stamp = || (Uuid::new_v4(), ms(1));
    let shapeless = [asked(p, "acct", 5), asked(q, "acct", 6)];
    assert!(matches!(store.admit_batch(&shapeless, &stamp).await, Err(StoreError::Corrupt(_))));
    let unknown = [(Uuid::new_v4(), Resolution::Acked { rail_reference: "RR".into() })];
    // The SQL stores record nothing for it; the simulation's refuses it.
    let _ = store.resolve_batch(&unknown, ms(2)).await;
    assert_eq!(events_after(&store, head).await, Vec::new());
    let read = store.read_events(0, 100).await.expect("read");
    assert_eq!(read.events.len(), before.len());
}

/// A read returns at most `limit` events after `after`, in seq order, with a head every seq
/// at or below which is final: paging by the head reads every event once.
pub async fn rail_event_reads_page_by_their_head(store: Arc<dyn RailStore>) {
    for _ in 0..4 {
        super::payout(&store, "acct", PayoutState::Claimed).await;
    }
    let all = events_after(&store, 0).await;
    assert_eq!(all.len(), 5, "the account's and four payouts'");
    let first = store.read_events(0, 2).await.expect("read");
    assert_eq!(first.events, all[..2].to_vec());
    assert_eq!(first.head, all[1].seq);
    let rest = store.read_events(first.head, 10).await.expect("read");
    assert_eq!(rest.events, all[2..].to_vec());
    assert_eq!(rest.head, all[4].seq);
    let none = store.read_events(rest.head, 10).await.expect("read");
    assert!(none.events.is_empty());
    assert_eq!((none.head, none.purged_through), (rest.head, 0));
    assert!(all.windows(2).all(|w| w[0].seq < w[1].seq), "seq order");
}
