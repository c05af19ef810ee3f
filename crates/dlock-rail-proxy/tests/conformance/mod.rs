//! The rail store conformance suite: the same cases against every `RailStore`
//! implementation (SQLite, PostgreSQL, and the simulation store), so the simulation cannot
//! drift from SQL semantics. Each case names the behaviour it proves.

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_rail_proxy::store::{Admission, Attempt, Checked, NewPayout, RailStore, Resolution, Unstamped};
use uuid::Uuid;

pub fn t0() -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("valid instant")
}

pub async fn payout(store: &Arc<dyn RailStore>, account: &str, state: PayoutState) -> Uuid {
    let id = Uuid::new_v4();
    store
        .insert_payout(
            &NewPayout {
                payout_id: id,
                account_id: account.to_owned(),
                amount_minor: 1_000,
                currency: "EUR".into(),
                beneficiary_ref: "ben".into(),
                state,
            },
            t0(),
        )
        .await
        .expect("insert payout");
    id
}

pub fn attempt(payout_id: Uuid, account: &str, token: i64, at_ms: i64) -> Attempt {
    asked(payout_id, account, token).stamped(Uuid::new_v4(), t0() + Duration::milliseconds(at_ms))
}

async fn state_of(store: &Arc<dyn RailStore>, id: Uuid) -> PayoutState {
    store.payout(id).await.expect("read").expect("exists").state
}

pub async fn mark_advances_only_to_strictly_greater_tokens(store: Arc<dyn RailStore>) {
    let p1 = payout(&store, "acct-1", PayoutState::Claimed).await;
    let p2 = payout(&store, "acct-1", PayoutState::Claimed).await;
    let p3 = payout(&store, "acct-1", PayoutState::Claimed).await;
    assert!(matches!(store.admit(&attempt(p1, "acct-1", 42, 0)).await, Ok(Admission::Admitted { .. })));
    assert_eq!(store.high_water("acct-1").await, Ok(Some(42)));
    // Equal token: strictly greater, never >=.
    assert_eq!(store.admit(&attempt(p2, "acct-1", 42, 1)).await, Ok(Admission::Fenced { highest_token: 42 }));
    assert_eq!(store.admit(&attempt(p2, "acct-1", 41, 2)).await, Ok(Admission::Fenced { highest_token: 42 }));
    assert_eq!(store.high_water("acct-1").await, Ok(Some(42)));
    assert!(matches!(store.admit(&attempt(p3, "acct-1", 43, 3)).await, Ok(Admission::Admitted { .. })));
    assert_eq!(store.high_water("acct-1").await, Ok(Some(43)));
    // Marks are per account.
    assert_eq!(store.high_water("acct-2").await, Ok(None));
}

pub async fn fenced_attempt_leaves_one_fenced_row_and_the_payout_untouched(store: Arc<dyn RailStore>) {
    let p1 = payout(&store, "a", PayoutState::Claimed).await;
    let p2 = payout(&store, "a", PayoutState::Claimed).await;
    store.admit(&attempt(p1, "a", 10, 0)).await.expect("admit");
    let stale = attempt(p2, "a", 9, 1);
    assert_eq!(store.admit(&stale).await, Ok(Admission::Fenced { highest_token: 10 }));
    let rows = store.submissions(Some(p2)).await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, Some(SubmissionOutcome::Fenced));
    assert_eq!(rows[0].presented_token, 9);
    assert_eq!(rows[0].submission_id, stale.submission_id);
    assert_eq!(rows[0].resolved_at, Some(stale.at));
    assert_eq!(state_of(&store, p2).await, PayoutState::Claimed);
    let p = store.payout(p2).await.expect("read").expect("exists");
    assert_eq!(p.attempt_count, 0);
}

pub async fn admitted_attempt_commits_an_unresolved_intent_and_submits_the_payout(store: Arc<dyn RailStore>) {
    let p = payout(&store, "a", PayoutState::Claimed).await;
    let a = attempt(p, "a", 5, 0);
    assert_eq!(store.admit(&a).await, Ok(Admission::Admitted { submitted_at: a.at }));
    let rows = store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, None);
    assert_eq!(rows[0].resolved_at, None);
    assert_eq!(rows[0].owner_id, "worker-1");
    assert_eq!(rows[0].idempotency_key, format!("payout:{p}"));
    let row = store.payout(p).await.expect("read").expect("exists");
    assert_eq!((row.state, row.attempt_count), (PayoutState::Submitted, 1));
}

pub async fn second_forwardable_attempt_is_a_duplicate_whatever_the_token(store: Arc<dyn RailStore>) {
    let p = payout(&store, "a", PayoutState::Claimed).await;
    let first = attempt(p, "a", 1, 0);
    store.admit(&first).await.expect("admit");
    // While the intent is unresolved...
    let again = store.admit(&attempt(p, "a", 2, 1)).await.expect("admit");
    assert_eq!(again, Admission::Duplicate { first_submitted_at: first.at, first_submission_id: first.submission_id });
    // ...and after it was acknowledged.
    store
        .resolve(first.submission_id, &Resolution::Acked { rail_reference: "RR-1".into() }, t0())
        .await
        .expect("resolve");
    let later = store.admit(&attempt(p, "a", 3, 2)).await.expect("admit");
    assert!(matches!(later, Admission::Duplicate { .. }), "{later:?}");
    let outcomes: Vec<_> = store.submissions(Some(p)).await.expect("rows").iter().map(|r| r.outcome).collect();
    assert_eq!(
        outcomes,
        [Some(SubmissionOutcome::Acked), Some(SubmissionOutcome::Duplicate), Some(SubmissionOutcome::Duplicate)]
    );
    assert_eq!(state_of(&store, p).await, PayoutState::RailAcked);
    // A duplicate's token was still strictly greater: the mark follows it.
    assert_eq!(store.high_water("a").await, Ok(Some(3)));
}

pub async fn quarantined_payout_refuses_every_later_token(store: Arc<dyn RailStore>) {
    let p = payout(&store, "a", PayoutState::Claimed).await;
    let first = attempt(p, "a", 7, 0);
    store.admit(&first).await.expect("admit");
    store
        .resolve(first.submission_id, &Resolution::Timeout { detail: "no answer".into() }, t0())
        .await
        .expect("resolve");
    assert_eq!(state_of(&store, p).await, PayoutState::RailAmbiguous);
    for token in [8, 1_000, i64::MAX] {
        let r = store.admit(&attempt(p, "a", token, 1)).await.expect("admit");
        assert!(matches!(r, Admission::Duplicate { .. }), "{token}: {r:?}");
    }
    assert_eq!(state_of(&store, p).await, PayoutState::RailAmbiguous);
}

pub async fn unsent_attempt_frees_the_slot_for_a_newer_token(store: Arc<dyn RailStore>) {
    let p = payout(&store, "a", PayoutState::Claimed).await;
    let first = attempt(p, "a", 1, 0);
    store.admit(&first).await.expect("admit");
    store.resolve(first.submission_id, &Resolution::Unsent { detail: "refused".into() }, t0()).await.expect("resolve");
    assert_eq!(state_of(&store, p).await, PayoutState::Claimed);
    // The same token is now fenced (the mark already equals it)...
    assert_eq!(store.admit(&attempt(p, "a", 1, 1)).await, Ok(Admission::Fenced { highest_token: 1 }));
    // ...and a newer holder may try again.
    assert!(matches!(store.admit(&attempt(p, "a", 2, 2)).await, Ok(Admission::Admitted { .. })));
}

pub async fn not_claimable_payout_writes_nothing_and_keeps_the_mark(store: Arc<dyn RailStore>) {
    for state in [PayoutState::Pending, PayoutState::Failed, PayoutState::Abandoned, PayoutState::Posted] {
        let p = payout(&store, "nc", state).await;
        assert_eq!(store.admit(&attempt(p, "nc", 50, 0)).await, Ok(Admission::NotClaimable { state }));
        assert_eq!(store.submissions(Some(p)).await.expect("rows"), vec![]);
        assert_eq!(state_of(&store, p).await, state);
    }
    assert_eq!(store.high_water("nc").await, Ok(None));
}

pub async fn resolution_moves_the_payout_and_records_the_outcome_once(store: Arc<dyn RailStore>) {
    let cases = [
        (Resolution::Acked { rail_reference: "RR-9".into() }, PayoutState::RailAcked),
        (Resolution::Rejected { detail: "declined".into() }, PayoutState::Failed),
        (Resolution::Timeout { detail: "no answer".into() }, PayoutState::RailAmbiguous),
        (Resolution::Unsent { detail: "refused".into() }, PayoutState::Claimed),
    ];
    for (i, (resolution, expected)) in cases.into_iter().enumerate() {
        let account = format!("r{i}");
        let p = payout(&store, &account, PayoutState::Claimed).await;
        let a = attempt(p, &account, 1, 0);
        store.admit(&a).await.expect("admit");
        let at = t0() + Duration::milliseconds(500);
        store.resolve(a.submission_id, &resolution, at).await.expect("resolve");
        // A second resolution changes nothing.
        store
            .resolve(a.submission_id, &Resolution::Acked { rail_reference: "RR-other".into() }, at)
            .await
            .expect("resolve again");
        assert_eq!(state_of(&store, p).await, expected);
        let rows = store.submissions(Some(p)).await.expect("rows");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].outcome, Some(resolution.outcome()));
        assert_eq!(rows[0].rail_reference.as_deref(), resolution.rail_reference());
        assert_eq!(rows[0].outcome_detail.as_deref(), resolution.detail());
        assert_eq!(rows[0].resolved_at, Some(at));
    }
}

pub async fn disabled_fencing_skips_step_one_only(store: Arc<dyn RailStore>) {
    let p1 = payout(&store, "u", PayoutState::Claimed).await;
    let p2 = payout(&store, "u", PayoutState::Claimed).await;
    store.admit(&attempt(p1, "u", 10, 0)).await.expect("admit");
    let mut unfenced = attempt(p2, "u", 3, 1);
    unfenced.fencing_enabled = false;
    assert!(matches!(store.admit(&unfenced).await, Ok(Admission::Admitted { .. })));
    assert_eq!(store.high_water("u").await, Ok(Some(10)));
    let mut again = attempt(p2, "u", 2, 2);
    again.fencing_enabled = false;
    assert!(matches!(store.admit(&again).await, Ok(Admission::Duplicate { .. })));
}

pub async fn concurrent_admissions_admit_one_per_payout_and_leave_the_highest_mark(store: Arc<dyn RailStore>) {
    let payouts: Vec<Uuid> = {
        let mut v = Vec::new();
        for _ in 0..4 {
            v.push(payout(&store, "hot", PayoutState::Claimed).await);
        }
        v
    };
    // Interleaved tokens: 40 attempts over 4 payouts, tokens 1..=40 in a scrambled order.
    let mut tasks = Vec::new();
    for i in 0..40i64 {
        let token = (i * 17) % 40 + 1;
        let p = payouts[(i % 4) as usize];
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let a = attempt(p, "hot", token, i);
            (token, p, store.admit(&a).await)
        }));
    }
    let mut admitted = Vec::new();
    for t in tasks {
        let (token, p, r) = t.await.expect("task");
        match r.expect("admit") {
            Admission::Admitted { .. } => admitted.push((token, p)),
            Admission::Fenced { highest_token } => assert!(highest_token >= token),
            Admission::Duplicate { .. } => {}
            Admission::NotClaimable { state } => panic!("unexpected {state:?}"),
        }
    }
    let mut per_payout = std::collections::BTreeMap::new();
    for (_, p) in &admitted {
        *per_payout.entry(*p).or_insert(0) += 1;
    }
    assert!(per_payout.values().all(|n| *n == 1), "{per_payout:?}");
    let rows = store.submissions(None).await.expect("rows");
    assert_eq!(rows.len(), 40, "every attempt leaves exactly one row");
    let forwardable = rows.iter().filter(|r| r.outcome.is_none()).count();
    assert_eq!(forwardable, admitted.len());
    // The mark equals the highest token that passed step 1 (admitted or duplicate).
    let passed_step_one =
        rows.iter().filter(|r| r.outcome != Some(SubmissionOutcome::Fenced)).map(|r| r.presented_token).max();
    assert_eq!(store.high_water("hot").await.expect("mark"), passed_step_one);
    // In write order, every token that passed step 1 exceeded every earlier one.
    let mut highest = 0;
    for r in &rows {
        if r.outcome != Some(SubmissionOutcome::Fenced) {
            assert!(r.presented_token > highest, "token {} admitted after {highest}", r.presented_token);
            highest = r.presented_token;
        }
    }
}

pub async fn unresolved_intents_are_listed_oldest_first_before_the_bound(store: Arc<dyn RailStore>) {
    let old = payout(&store, "acct-u1", PayoutState::Claimed).await;
    let older = payout(&store, "acct-u2", PayoutState::Claimed).await;
    let recent = payout(&store, "acct-u3", PayoutState::Claimed).await;
    let resolved = payout(&store, "acct-u4", PayoutState::Claimed).await;
    let (a_old, a_older, a_recent, a_resolved) = (
        attempt(old, "acct-u1", 5, 200),
        attempt(older, "acct-u2", 5, 100),
        attempt(recent, "acct-u3", 5, 9_000),
        attempt(resolved, "acct-u4", 5, 50),
    );
    for a in [&a_old, &a_older, &a_recent, &a_resolved] {
        assert!(matches!(store.admit(a).await, Ok(Admission::Admitted { .. })));
    }
    store
        .resolve(a_resolved.submission_id, &Resolution::Acked { rail_reference: "RR".into() }, t0())
        .await
        .expect("resolve");
    let bound = t0() + Duration::milliseconds(5_000);
    assert_eq!(store.unresolved_before(bound, 10).await, Ok(vec![a_older.submission_id, a_old.submission_id]));
    assert_eq!(store.unresolved_before(bound, 1).await, Ok(vec![a_older.submission_id]));
    assert_eq!(store.unresolved_before(t0(), 10).await, Ok(vec![]));
}

/// What a submission for `payout_id` asks, with the terms [`payout`] writes.
pub fn asked(payout_id: Uuid, account: &str, token: i64) -> Unstamped {
    Unstamped {
        payout_id,
        account_id: account.to_owned(),
        presented_token: token,
        owner_id: "worker-1".into(),
        idempotency_key: format!("payout:{payout_id}"),
        amount_minor: 1_000,
        currency: "EUR".into(),
        beneficiary_ref: "ben".into(),
        fencing_enabled: true,
    }
}

/// `admit_checked` with a stamp that counts its calls: the answer, and the stamps drawn.
async fn checked(store: &Arc<dyn RailStore>, asked: &Unstamped, at_ms: i64) -> (Checked, usize) {
    let stamps = std::sync::atomic::AtomicUsize::new(0);
    let stamp = || {
        stamps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (Uuid::new_v4(), t0() + Duration::milliseconds(at_ms))
    };
    let answer = store.admit_checked(asked, &stamp).await.expect("admit_checked");
    (answer, stamps.into_inner())
}

/// Validation before step 1: a payout that does not exist, or whose terms the body does not
/// name (each term in turn), advances no mark and writes no row (a stamp may have been
/// drawn, at most one).
pub async fn a_checked_admission_of_a_missing_or_mismatched_payout_writes_nothing(store: Arc<dyn RailStore>) {
    let ghost = Uuid::new_v4();
    let (answer, stamps) = checked(&store, &asked(ghost, "acct", 5), 0).await;
    assert_eq!((answer, stamps <= 1), (Checked::Unmatched(None), true));
    let p = payout(&store, "acct", PayoutState::Claimed).await;
    let row = store.payout(p).await.expect("read").expect("exists");
    let mut wrong: Vec<Unstamped> = vec![asked(p, "acct-other", 5)];
    let mut a = asked(p, "acct", 5);
    a.amount_minor = 999;
    wrong.push(a);
    let mut a = asked(p, "acct", 5);
    a.currency = "USD".into();
    wrong.push(a);
    let mut a = asked(p, "acct", 5);
    a.beneficiary_ref = "someone-else".into();
    wrong.push(a);
    for (i, a) in wrong.iter().enumerate() {
        assert_eq!(a.mismatches(&row).len(), 1, "case {i} differs in one term");
        let (answer, stamps) = checked(&store, a, 0).await;
        assert_eq!((answer, stamps <= 1), (Checked::Unmatched(Some(row.clone())), true), "case {i}");
    }
    assert_eq!(store.high_water("acct").await, Ok(None));
    assert_eq!(store.high_water("acct-other").await, Ok(None));
    assert_eq!(store.submissions(None).await.expect("rows"), vec![]);
    assert_eq!(state_of(&store, p).await, PayoutState::Claimed);
}

/// A body that matches its payout is stamped once and decided exactly as `admit` decides:
/// admitted, fenced (its FENCED row written), a duplicate, not claimable; with fencing off
/// too.
pub async fn a_checked_admission_of_a_matching_payout_is_stamped_once_and_decided_as_admit_decides(
    store: Arc<dyn RailStore>,
) {
    let (p1, p2) =
        (payout(&store, "acct", PayoutState::Claimed).await, payout(&store, "acct", PayoutState::Claimed).await);
    let (answer, stamps) = checked(&store, &asked(p1, "acct", 10), 7).await;
    let Checked::Decided { attempt, admission } = answer else { panic!("not decided: {answer:?}") };
    assert_eq!((admission, stamps), (Admission::Admitted { submitted_at: t0() + Duration::milliseconds(7) }, 1));
    assert_eq!((attempt.payout_id, attempt.presented_token, attempt.at), (p1, 10, t0() + Duration::milliseconds(7)));
    let rows = store.submissions(Some(p1)).await.expect("rows");
    assert_eq!((rows.len(), rows[0].submission_id, rows[0].outcome), (1, attempt.submission_id, None));
    assert_eq!(state_of(&store, p1).await, PayoutState::Submitted);
    // Fenced: the mark refuses, the FENCED row is written, the payout stays.
    let (answer, stamps) = checked(&store, &asked(p2, "acct", 9), 8).await;
    assert!(
        matches!(answer, Checked::Decided { admission: Admission::Fenced { highest_token: 10 }, .. }),
        "{answer:?}"
    );
    assert_eq!(stamps, 1);
    let rows = store.submissions(Some(p2)).await.expect("rows");
    assert_eq!(rows.iter().map(|r| r.outcome).collect::<Vec<_>>(), vec![Some(SubmissionOutcome::Fenced)]);
    assert_eq!(state_of(&store, p2).await, PayoutState::Claimed);
    // A second attempt on the admitted payout: a duplicate, whatever its token.
    let (answer, _) = checked(&store, &asked(p1, "acct", 11), 9).await;
    assert!(matches!(answer, Checked::Decided { admission: Admission::Duplicate { .. }, .. }), "{answer:?}");
    // Not claimable: nothing written, the mark kept.
    let pending = payout(&store, "acct", PayoutState::Pending).await;
    let (answer, _) = checked(&store, &asked(pending, "acct", 20), 10).await;
    assert!(
        matches!(answer, Checked::Decided { admission: Admission::NotClaimable { state: PayoutState::Pending }, .. }),
        "{answer:?}"
    );
    assert_eq!(store.submissions(Some(pending)).await.expect("rows"), vec![]);
    assert_eq!(store.high_water("acct").await, Ok(Some(11)));
    // Fencing off (`--profile unsafe-test`): checked the same way, admitted below the mark.
    let p3 = payout(&store, "acct", PayoutState::Claimed).await;
    let mut unfenced = asked(p3, "acct", 1);
    unfenced.fencing_enabled = false;
    let (answer, stamps) = checked(&store, &unfenced, 11).await;
    assert!(matches!(answer, Checked::Decided { admission: Admission::Admitted { .. }, .. }), "{answer:?}");
    assert_eq!(stamps, 1);
    unfenced.beneficiary_ref = "someone-else".into();
    let p4 = payout(&store, "acct", PayoutState::Claimed).await;
    unfenced.payout_id = p4;
    assert!(matches!(checked(&store, &unfenced, 12).await, (Checked::Unmatched(Some(_)), 0 | 1)));
}

/// Declares one `#[tokio::test]` per case for a backend. `$make` is an async block that
/// yields `(Arc<dyn RailStore>, guard)`; the guard lives as long as the test.
#[macro_export]
macro_rules! rail_store_conformance {
    ($backend:ident, $make:expr) => {
        mod $backend {
            #[allow(unused_imports)]
            use super::*;
            use super::conformance as c;
            $crate::rail_store_conformance!(@cases $make;
                mark_advances_only_to_strictly_greater_tokens,
                fenced_attempt_leaves_one_fenced_row_and_the_payout_untouched,
                admitted_attempt_commits_an_unresolved_intent_and_submits_the_payout,
                second_forwardable_attempt_is_a_duplicate_whatever_the_token,
                quarantined_payout_refuses_every_later_token,
                unsent_attempt_frees_the_slot_for_a_newer_token,
                not_claimable_payout_writes_nothing_and_keeps_the_mark,
                resolution_moves_the_payout_and_records_the_outcome_once,
                disabled_fencing_skips_step_one_only,
                concurrent_admissions_admit_one_per_payout_and_leave_the_highest_mark,
                unresolved_intents_are_listed_oldest_first_before_the_bound,
                a_checked_admission_of_a_missing_or_mismatched_payout_writes_nothing,
                a_checked_admission_of_a_matching_payout_is_stamped_once_and_decided_as_admit_decides
            );
        }
    };
    (@cases $make:expr; $($case:ident),*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (store, _guard) = $make.await;
                c::$case(store).await;
            }
        )*
    };
}
