//! The simulation store's own cases: how a batch and a single write (a batch of one) are
//! reported to paydb's observer (what the simulation's oracle judges), and the fence's
//! defence-in-depth switch.

use std::sync::{Arc, Mutex};

use dlock_contract::batch::batch_target;

use super::*;
use crate::store::{Claim, ClaimBatchPayout, Operation};

#[derive(Default)]
struct Seen(Mutex<Vec<FencedWrite>>);

impl PaydbObserver for Seen {
    fn fenced_write(&self, _: &PaydbTables, w: &FencedWrite) {
        if let Ok(mut v) = self.0.lock() {
            v.push(w.clone());
        }
    }
}

fn at(ms: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000 + ms).expect("instant")
}

fn idem(operation: Operation, target: &str, key: &str, token: i64, fingerprint: char) -> IdemRequest {
    IdemRequest {
        operation,
        target_id: target.to_owned(),
        key: key.to_owned(),
        token,
        owner_id: "w-1".into(),
        fingerprint: fingerprint.to_string().repeat(64),
        at: at(0),
        expires_at: at(86_400_000),
    }
}

/// How these tests' requests are answered: as a batch (P2b), or a single write.
fn render() -> Answering {
    shaped(Shape::Batch)
}

fn shaped(shape: Shape) -> Answering {
    Answering { shape, key: "k".into(), trace_id: "t".into() }
}

/// The account `acct` (1 000 EUR) and two PENDING payouts of 100 on it.
fn seeded() -> (MemPaydb, Uuid, Uuid) {
    let db = MemPaydb::new();
    let (p1, p2) = (Uuid::from_u128(1), Uuid::from_u128(2));
    futures::executor::block_on(async {
        let a = NewAccount {
            account_id: "acct".into(),
            currency: "EUR".into(),
            opening_balance_minor: 1_000,
            posting_id: Uuid::from_u128(10),
            entry_ids: [Uuid::from_u128(11), Uuid::from_u128(12)],
            at: at(0),
        };
        db.create_account(&a, &idem(Operation::CreateAccount, "accounts", "a", 0, 'a'), &render())
            .await
            .expect("account");
        for (n, p) in [p1, p2].into_iter().enumerate() {
            let np = NewPayout {
                payout_id: p,
                account_id: "acct".into(),
                amount_minor: 100,
                currency: "EUR".into(),
                beneficiary_ref: "b".into(),
                at: at(0),
            };
            db.create_payout(&np, &idem(Operation::CreatePayout, "payouts", &format!("p{n}"), 0, 'b'), &render())
                .await
                .expect("payout");
        }
    });
    (db, p1, p2)
}

fn batch(token: i64, payouts: &[(Uuid, PayoutState)]) -> ClaimBatch {
    ClaimBatch {
        account_id: "acct".into(),
        token,
        owner_id: "w-1".into(),
        payouts: payouts
            .iter()
            .map(|(payout_id, expected)| ClaimBatchPayout { payout_id: *payout_id, expected: *expected })
            .collect(),
        at: at(1),
    }
}

#[test]
fn a_batch_reports_each_payout_under_one_fence_pass_with_the_batchs_identity() {
    let (db, p1, p2) = seeded();
    let seen = Arc::new(Seen::default());
    db.set_observer(seen.clone());
    let missing = Uuid::from_u128(3);
    let b = batch(5, &[(p1, PayoutState::Pending), (p2, PayoutState::Claimed), (missing, PayoutState::Pending)]);
    let i = idem(Operation::Claim, &batch_target("acct"), "k", 5, 'c');
    let decided = futures::executor::block_on(db.claim(&b, &i, &render())).expect("batch");
    let Idempotent::Executed { stored: Some(stored), .. } = decided else { panic!("{decided:?}") };
    // A second batch under the same token is fenced; the first one replays.
    let fenced = batch(5, &[(p2, PayoutState::Pending)]);
    let other = idem(Operation::Claim, &batch_target("acct"), "k2", 5, 'd');
    futures::executor::block_on(db.claim(&fenced, &other, &render())).expect("fenced");
    futures::executor::block_on(db.claim(&b, &i, &render())).expect("replay");

    let w = seen.0.lock().expect("lock").clone();
    assert_eq!(w.len(), 3 + 1 + 3, "one write per payout of each batch");
    let identity: Identity = (Operation::Claim, "account:acct".into(), "k".into(), 5);
    let first = &w[..3];
    assert!(first.iter().all(|x| x.batch_pass.is_some() && x.batch_pass == first[0].batch_pass));
    assert!(first.iter().all(|x| x.identity.as_ref() == Some(&identity) && x.recorded.as_ref() == Some(&stored)));
    assert!(first.iter().all(|x| x.op == FencedOp::Claim && x.token == 5 && x.fenced && x.replayed.is_none()));
    let verdicts: Vec<&FenceVerdictSeen> = first.iter().map(|x| &x.verdict).collect();
    assert_eq!(verdicts, [&FenceVerdictSeen::Accepted, &FenceVerdictSeen::Other, &FenceVerdictSeen::Other]);
    let before: Vec<Option<PayoutState>> = first.iter().map(|x| x.state_before).collect();
    assert_eq!(before, [Some(PayoutState::Pending), Some(PayoutState::Pending), None]);
    let accounts: Vec<&str> = first.iter().map(|x| x.account_id.as_str()).collect();
    assert_eq!(accounts, ["acct", "acct", ""]);
    assert_eq!(w[3].verdict, FenceVerdictSeen::FencedOut { highest_token: 5 });
    assert!(w[3].batch_pass.is_some() && w[3].batch_pass != first[0].batch_pass, "each batch its own pass");
    let replays = &w[4..];
    assert!(replays.iter().all(|x| x.verdict == FenceVerdictSeen::Other && x.replayed.as_ref() == Some(&stored)));
}

/// A single write is a batch of one, reported as a single write: its payout's account,
/// no batch pass (and none drawn: the next batch's pass is the first), the single
/// write's identity, and the single answer recorded.
#[test]
fn a_single_write_is_reported_as_a_single_write_with_no_batch_pass() {
    let (db, p1, p2) = seeded();
    let seen = Arc::new(Seen::default());
    db.set_observer(seen.clone());
    let single = Claim { payout_id: p1, token: 5, owner_id: "w-1".into(), expected: PayoutState::Pending, at: at(1) };
    let i = idem(Operation::Claim, &p1.to_string(), "k", 5, 'c');
    let decided = futures::executor::block_on(db.claim(&single.batch_of_one("acct"), &i, &shaped(Shape::Single)));
    let Ok(Idempotent::Executed { outcome, stored: Some(stored) }) = decided else { panic!("{decided:?}") };
    let outcome = outcome.into_single("acct");
    assert_eq!(stored, answer::claim_item(&outcome, p1, 5, "k", "t"), "the single answer, not a batch's");
    let b = batch(6, &[(p2, PayoutState::Pending)]);
    let bi = idem(Operation::Claim, &batch_target("acct"), "k2", 6, 'd');
    futures::executor::block_on(db.claim(&b, &bi, &render())).expect("batch");
    let w = seen.0.lock().expect("lock").clone();
    assert_eq!(w.len(), 2);
    assert_eq!((w[0].batch_pass, w[0].fence_account.as_str(), w[0].account_id.as_str()), (None, "acct", "acct"));
    assert_eq!(w[0].identity, Some((Operation::Claim, p1.to_string(), "k".into(), 5)));
    assert_eq!((&w[0].verdict, w[0].recorded.as_ref()), (&FenceVerdictSeen::Accepted, Some(&stored)));
    assert_eq!(w[1].batch_pass, Some(1), "the single write drew no pass");
}

/// With the claim's fence switched off (a simulation campaign), a batch under a stale
/// token goes on without moving the fence, and its report says the fence was bypassed.
#[cfg(madsim)]
#[test]
fn with_the_claim_fence_off_a_stale_batch_goes_on_and_leaves_the_fence_where_it_was() {
    let (db, p1, p2) = seeded();
    futures::executor::block_on(async {
        let i = idem(Operation::Claim, &batch_target("acct"), "k", 5, 'c');
        db.claim(&batch(5, &[(p1, PayoutState::Pending)]), &i, &render()).await.expect("batch");
    });
    let seen = Arc::new(Seen::default());
    db.set_observer(seen.clone());
    defence::set_off(Some(Layer::ClaimFence));
    let i = idem(Operation::Claim, &batch_target("acct"), "k", 4, 'e');
    let decided = futures::executor::block_on(db.claim(&batch(4, &[(p2, PayoutState::Pending)]), &i, &render()));
    defence::set_off(None);
    assert!(matches!(decided, Ok(Idempotent::Executed { stored: Some(_), .. })), "{decided:?}");
    let fence = db.with_tables(|t| t.accounts.get("acct").map(|a| a.fence)).expect("tables");
    assert_eq!(fence, Some(5), "a lower token never lowers the fence");
    let w = seen.0.lock().expect("lock").clone();
    assert_eq!((w[0].verdict.clone(), w[0].fenced), (FenceVerdictSeen::Accepted, false));
}
