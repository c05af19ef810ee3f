//! The rail store conformance suite: the same cases against every `RailStore`
//! implementation (SQLite, PostgreSQL, and the simulation store), so the simulation cannot
//! drift from SQL semantics. Each case names the behaviour it proves.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]

use std::sync::Arc;

use chrono::{DateTime, Duration, Utc};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_rail_proxy::store::{Admission, Attempt, Checked, NewPayout, RailStore, Resolution, Unstamped};
use uuid::Uuid;

mod events;
pub use events::*;

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

/// `admit_batch` with a stamp that counts its calls and stamps the `n`-th validated payout
/// `at_ms + n` ms: the answers, and the stamps drawn.
async fn batch(store: &Arc<dyn RailStore>, asked: &[Unstamped], at_ms: i64) -> (Vec<Checked>, usize) {
    let stamps = std::sync::atomic::AtomicUsize::new(0);
    let stamp = || {
        let n = stamps.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (Uuid::new_v4(), t0() + Duration::milliseconds(at_ms + n as i64))
    };
    let answers = store.admit_batch(asked, &stamp).await.expect("admit_batch");
    (answers, stamps.into_inner())
}

/// The admissions of decided answers, in order (`None` for an unmatched payout).
fn admissions(answers: &[Checked]) -> Vec<Option<Admission>> {
    answers
        .iter()
        .map(|c| match c {
            Checked::Decided { admission, .. } => Some(admission.clone()),
            Checked::Unmatched(_) => None,
        })
        .collect()
}

/// The attempt of a decided answer.
fn decided(c: &Checked) -> &Attempt {
    match c {
        Checked::Decided { attempt, .. } => attempt,
        Checked::Unmatched(p) => panic!("unmatched: {p:?}"),
    }
}

async fn claimed_payouts(store: &Arc<dyn RailStore>, account: &str, n: usize) -> Vec<Uuid> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(payout(store, account, PayoutState::Claimed).await);
    }
    v
}

/// C3-extensions E-19: one batch passes the mark once, raising it to its token, and admits
/// every payout under that one token (each stamped once, in order); the same token is then
/// fenced, for a single submission as for another batch.
pub async fn a_batch_passes_the_mark_once_and_raises_it_to_its_token(store: Arc<dyn RailStore>) {
    let ps = claimed_payouts(&store, "acct-b", 3).await;
    let asked_all: Vec<Unstamped> = ps.iter().map(|p| asked(*p, "acct-b", 10)).collect();
    let (answers, stamps) = batch(&store, &asked_all, 0).await;
    assert_eq!(stamps, 3);
    for (k, (c, p)) in answers.iter().zip(&ps).enumerate() {
        let at = t0() + Duration::milliseconds(k as i64);
        let Checked::Decided { attempt, admission } = c else { panic!("{c:?}") };
        assert_eq!((attempt.payout_id, attempt.presented_token, attempt.at), (*p, 10, at));
        assert_eq!(*admission, Admission::Admitted { submitted_at: at });
        let row = store.payout(*p).await.expect("read").expect("exists");
        assert_eq!((row.state, row.attempt_count), (PayoutState::Submitted, 1));
    }
    assert_eq!(store.high_water("acct-b").await, Ok(Some(10)));
    let more = claimed_payouts(&store, "acct-b", 2).await;
    assert_eq!(store.admit(&attempt(more[0], "acct-b", 10, 5)).await, Ok(Admission::Fenced { highest_token: 10 }));
    let (again, _) = batch(&store, &[asked(more[1], "acct-b", 10)], 6).await;
    assert_eq!(admissions(&again), vec![Some(Admission::Fenced { highest_token: 10 })]);
    let (next, _) = batch(&store, &[asked(more[1], "acct-b", 11)], 7).await;
    assert!(matches!(admissions(&next)[..], [Some(Admission::Admitted { .. })]), "{next:?}");
    assert_eq!(store.high_water("acct-b").await, Ok(Some(11)));
}

/// A fenced batch writes one FENCED row per payout that passed validation (its token, its
/// stamp, resolved as written), none for a payout that did not, and moves nothing.
pub async fn a_fenced_batch_writes_one_fenced_row_per_validated_payout_and_moves_nothing(store: Arc<dyn RailStore>) {
    let ps = claimed_payouts(&store, "acct-f", 3).await;
    store.admit(&attempt(ps[0], "acct-f", 10, 0)).await.expect("admit");
    let ghost = Uuid::new_v4();
    let mut mismatched = asked(ps[2], "acct-f", 10);
    mismatched.amount_minor = 999;
    let asked_all =
        vec![asked(ps[1], "acct-f", 10), asked(ghost, "acct-f", 10), mismatched, asked(ps[0], "acct-f", 10)];
    let (answers, stamps) = batch(&store, &asked_all, 100).await;
    assert_eq!(stamps, 2, "one stamp per validated payout");
    let row2 = store.payout(ps[2]).await.expect("read");
    assert_eq!(answers[1], Checked::Unmatched(None));
    assert_eq!(answers[2], Checked::Unmatched(row2));
    let fenced = Some(Admission::Fenced { highest_token: 10 });
    assert_eq!(admissions(&answers), vec![fenced.clone(), None, None, fenced]);
    for (c, p) in [(&answers[0], ps[1]), (&answers[3], ps[0])] {
        let a = decided(c);
        let rows: Vec<_> = store.submissions(Some(p)).await.expect("rows");
        let fenced_row = rows.iter().find(|r| r.submission_id == a.submission_id).expect("its FENCED row");
        assert_eq!(fenced_row.outcome, Some(SubmissionOutcome::Fenced));
        assert_eq!((fenced_row.presented_token, fenced_row.resolved_at), (10, Some(a.at)));
        assert_eq!(fenced_row.submitted_at, a.at);
    }
    assert_eq!(store.submissions(Some(ps[1])).await.expect("rows").len(), 1);
    assert_eq!(store.submissions(Some(ps[2])).await.expect("rows"), vec![]);
    assert_eq!(store.submissions(Some(ghost)).await.expect("rows"), vec![]);
    for (p, count) in [(ps[1], 0), (ps[2], 0)] {
        let row = store.payout(p).await.expect("read").expect("exists");
        assert_eq!((row.state, row.attempt_count), (PayoutState::Claimed, count));
    }
    assert_eq!(store.high_water("acct-f").await, Ok(Some(10)));
}

/// Past the mark, each payout of a batch is decided as `admit` decides it: a duplicate (its
/// DUPLICATE row, the payout untouched), not claimable (nothing written for it), admitted.
/// A batch none of whose payouts passes step 1 writes nothing, the mark included.
pub async fn a_batch_decides_duplicates_and_not_claimable_payouts_per_payout(store: Arc<dyn RailStore>) {
    let dup = payout(&store, "acct-d", PayoutState::Claimed).await;
    let pending = payout(&store, "acct-d", PayoutState::Pending).await;
    let fresh = payout(&store, "acct-d", PayoutState::Claimed).await;
    let first = attempt(dup, "acct-d", 1, 0);
    store.admit(&first).await.expect("admit");
    let (answers, stamps) =
        batch(&store, &[asked(dup, "acct-d", 2), asked(pending, "acct-d", 2), asked(fresh, "acct-d", 2)], 10).await;
    assert_eq!(stamps, 3);
    let dup_at = t0() + Duration::milliseconds(10);
    assert_eq!(
        admissions(&answers),
        vec![
            Some(Admission::Duplicate { first_submitted_at: first.at, first_submission_id: first.submission_id }),
            Some(Admission::NotClaimable { state: PayoutState::Pending }),
            Some(Admission::Admitted { submitted_at: t0() + Duration::milliseconds(12) }),
        ]
    );
    let dup_rows = store.submissions(Some(dup)).await.expect("rows");
    assert_eq!(dup_rows.iter().map(|r| r.outcome).collect::<Vec<_>>(), vec![None, Some(SubmissionOutcome::Duplicate)]);
    assert_eq!((dup_rows[1].presented_token, dup_rows[1].resolved_at), (2, Some(dup_at)));
    assert_eq!(dup_rows[1].submission_id, decided(&answers[0]).submission_id);
    assert_eq!(store.payout(dup).await.expect("read").expect("exists").attempt_count, 1);
    assert_eq!(store.submissions(Some(pending)).await.expect("rows"), vec![], "not claimable: nothing written");
    assert_eq!(state_of(&store, pending).await, PayoutState::Pending);
    assert_eq!(store.payout(pending).await.expect("read").expect("exists").attempt_count, 0);
    assert_eq!(state_of(&store, fresh).await, PayoutState::Submitted);
    assert_eq!(store.high_water("acct-d").await, Ok(Some(2)));
    // Only not-claimable payouts: nothing passes step 1, nothing is written, the mark stays.
    let pending2 = payout(&store, "acct-d", PayoutState::Pending).await;
    let (answers, _) = batch(&store, &[asked(pending, "acct-d", 3), asked(pending2, "acct-d", 3)], 20).await;
    assert_eq!(admissions(&answers), vec![Some(Admission::NotClaimable { state: PayoutState::Pending }); 2]);
    assert_eq!(store.high_water("acct-d").await, Ok(Some(2)));
    assert_eq!(store.submissions(Some(pending)).await.expect("rows"), vec![]);
    assert_eq!(store.submissions(Some(pending2)).await.expect("rows"), vec![]);
}

/// A batch whose every payout fails validation (missing, or a body that does not match)
/// writes nothing and draws no stamp; a batch that is not one pass (two tokens) is refused
/// whole before anything is written.
pub async fn unmatched_payouts_of_a_batch_write_nothing(store: Arc<dyn RailStore>) {
    let p = payout(&store, "acct-u", PayoutState::Claimed).await;
    let mut wrong = asked(p, "acct-u", 5);
    wrong.beneficiary_ref = "someone-else".into();
    let (answers, stamps) = batch(&store, &[asked(Uuid::new_v4(), "acct-u", 5), wrong], 0).await;
    assert_eq!(stamps, 0);
    assert!(matches!(answers[..], [Checked::Unmatched(None), Checked::Unmatched(Some(_))]), "{answers:?}");
    assert_eq!(store.high_water("acct-u").await, Ok(None));
    assert_eq!(store.submissions(None).await.expect("rows"), vec![]);
    let p2 = payout(&store, "acct-u", PayoutState::Claimed).await;
    let never = || -> (Uuid, DateTime<Utc>) { panic!("no stamp for a refused batch") };
    let mixed = store.admit_batch(&[asked(p, "acct-u", 5), asked(p2, "acct-u", 6)], &never).await;
    assert!(matches!(mixed, Err(dlock_rail_proxy::store::StoreError::Corrupt(_))), "{mixed:?}");
    let twice = store.admit_batch(&[asked(p, "acct-u", 5), asked(p, "acct-u", 5)], &never).await;
    assert!(matches!(twice, Err(dlock_rail_proxy::store::StoreError::Corrupt(_))), "{twice:?}");
    assert_eq!(store.admit_batch(&[], &never).await, Ok(vec![]));
    assert_eq!(store.high_water("acct-u").await, Ok(None));
    assert_eq!(store.submissions(None).await.expect("rows"), vec![]);
    assert_eq!(state_of(&store, p).await, PayoutState::Claimed);
}

/// A batch of the most payouts one batch names commits every intent before it returns:
/// each row unresolved, carrying its token, owner, key and stamp (its instant ordered as a
/// single intent's is), each payout SUBMITTED once.
pub async fn a_batch_admitting_k_intents_commits_them_all_before_returning(store: Arc<dyn RailStore>) {
    let k = dlock_contract::batch::BATCH_PAYOUTS_MAX;
    let ps = claimed_payouts(&store, "acct-k", k).await;
    let asked_all: Vec<Unstamped> = ps.iter().map(|p| asked(*p, "acct-k", 3)).collect();
    let (answers, stamps) = batch(&store, &asked_all, 1).await;
    assert_eq!(stamps, k);
    assert!(admissions(&answers).iter().all(|a| matches!(a, Some(Admission::Admitted { .. }))), "{answers:?}");
    let rows = store.submissions(None).await.expect("rows");
    assert_eq!(rows.len(), k);
    for (c, p) in answers.iter().zip(&ps) {
        let a = decided(c);
        let row = rows.iter().find(|r| r.payout_id == *p).expect("its intent");
        assert_eq!((row.submission_id, row.outcome, row.resolved_at), (a.submission_id, None, None));
        assert_eq!((row.presented_token, row.owner_id.as_str()), (3, "worker-1"));
        assert_eq!((row.idempotency_key.clone(), row.submitted_at), (format!("payout:{p}"), a.at));
        let payout = store.payout(*p).await.expect("read").expect("exists");
        assert_eq!((payout.state, payout.attempt_count), (PayoutState::Submitted, 1));
    }
    // Stamped 1, 2, ... ms after t0: the sweep's bound compares them as it compares any intent.
    let bound = t0() + Duration::milliseconds(11);
    assert_eq!(store.unresolved_before(bound, 1_000).await.expect("unresolved").len(), 10);
    assert_eq!(store.high_water("acct-k").await, Ok(Some(3)));
}

/// `resolve_batch` records each outcome once and moves each payout exactly as `resolve`
/// does; an outcome already recorded is kept, and its payout stays where it is.
pub async fn resolve_batch_records_each_outcome_once_and_moves_each_payout_as_resolve_does(store: Arc<dyn RailStore>) {
    let cases = [
        (Resolution::Acked { rail_reference: "RR-9".into() }, PayoutState::RailAcked),
        (Resolution::Rejected { detail: "declined".into() }, PayoutState::Failed),
        (Resolution::Timeout { detail: "no answer".into() }, PayoutState::RailAmbiguous),
        (Resolution::Unsent { detail: "refused".into() }, PayoutState::Claimed),
    ];
    let ps = claimed_payouts(&store, "acct-r", cases.len()).await;
    let asked_all: Vec<Unstamped> = ps.iter().map(|p| asked(*p, "acct-r", 1)).collect();
    let (answers, _) = batch(&store, &asked_all, 0).await;
    let ids: Vec<Uuid> = answers.iter().map(|c| decided(c).submission_id).collect();
    // The first one is recorded alone, first (an orphan sweep's TIMEOUT, say).
    store.resolve(ids[0], &Resolution::Timeout { detail: "swept".into() }, t0()).await.expect("resolve");
    let at = t0() + Duration::milliseconds(500);
    let outcomes: Vec<(Uuid, Resolution)> = ids.iter().copied().zip(cases.iter().map(|(r, _)| r.clone())).collect();
    store.resolve_batch(&outcomes, at).await.expect("resolve_batch");
    // Again, with other outcomes: nothing changes.
    let others: Vec<(Uuid, Resolution)> =
        ids.iter().map(|id| (*id, Resolution::Acked { rail_reference: "RR-other".into() })).collect();
    store.resolve_batch(&others, at + Duration::milliseconds(1)).await.expect("resolve_batch again");
    assert_eq!(state_of(&store, ps[0]).await, PayoutState::RailAmbiguous, "the first outcome recorded stays");
    let first = store.submissions(Some(ps[0])).await.expect("rows");
    assert_eq!((first[0].outcome_detail.as_deref(), first[0].resolved_at), (Some("swept"), Some(t0())));
    for ((resolution, expected), p) in cases.iter().zip(&ps).skip(1) {
        assert_eq!(state_of(&store, *p).await, *expected);
        let rows = store.submissions(Some(*p)).await.expect("rows");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].outcome, Some(resolution.outcome()));
        assert_eq!(rows[0].rail_reference.as_deref(), resolution.rail_reference());
        assert_eq!(rows[0].outcome_detail.as_deref(), resolution.detail());
        assert_eq!(rows[0].resolved_at, Some(at));
    }
    assert_eq!(store.resolve_batch(&[], at).await, Ok(()));
}

/// With fencing off (`--profile unsafe-test`) a batch skips step 1 only: admitted below the
/// mark, the mark untouched, a second attempt still a duplicate.
pub async fn a_batch_with_fencing_off_skips_step_one_only(store: Arc<dyn RailStore>) {
    let ps = claimed_payouts(&store, "acct-o", 3).await;
    store.admit(&attempt(ps[0], "acct-o", 10, 0)).await.expect("admit");
    let unfenced = |p: Uuid, token: i64| Unstamped { fencing_enabled: false, ..asked(p, "acct-o", token) };
    let (answers, _) = batch(&store, &[unfenced(ps[1], 3), unfenced(ps[2], 3)], 1).await;
    assert!(admissions(&answers).iter().all(|a| matches!(a, Some(Admission::Admitted { .. }))), "{answers:?}");
    assert_eq!(store.high_water("acct-o").await, Ok(Some(10)));
    let (answers, _) = batch(&store, &[unfenced(ps[1], 2)], 5).await;
    assert!(matches!(admissions(&answers)[..], [Some(Admission::Duplicate { .. })]), "{answers:?}");
}

/// Batches and single submissions racing on one account: every payout keeps at most one
/// forwardable attempt, each batch is fenced whole or not at all, every validated attempt
/// leaves one row, and the mark ends at the highest token that passed step 1, every such
/// token having exceeded every earlier one in write order.
pub async fn concurrent_batches_and_single_admissions_keep_one_forwardable_attempt_per_payout_and_the_highest_mark(
    store: Arc<dyn RailStore>,
) {
    let ps = claimed_payouts(&store, "hot-b", 6).await;
    let mut tasks = Vec::new();
    for i in 0..30i64 {
        let token = (i * 17) % 30 + 1;
        // Even tasks: a batch of three payouts (a window over the six); odd: a single one.
        let chosen: Vec<Uuid> = if i % 2 == 0 {
            (0..3).map(|k| ps[((i / 2 + k) % 6) as usize]).collect()
        } else {
            vec![ps[(i % 6) as usize]]
        };
        let store = store.clone();
        tasks.push(tokio::spawn(async move {
            let asked_all: Vec<Unstamped> = chosen.iter().map(|p| asked(*p, "hot-b", token)).collect();
            let answers = if asked_all.len() == 1 {
                vec![checked(&store, &asked_all[0], i).await.0]
            } else {
                batch(&store, &asked_all, i).await.0
            };
            (token, answers)
        }));
    }
    let mut attempts = 0;
    for t in tasks {
        let (token, answers) = t.await.expect("task");
        let decided: Vec<Admission> = admissions(&answers).into_iter().map(|a| a.expect("validated")).collect();
        attempts += decided.len();
        let fenced = decided.iter().filter(|a| matches!(a, Admission::Fenced { .. })).count();
        assert!(fenced == 0 || fenced == decided.len(), "token {token}: fenced {fenced} of {}", decided.len());
        for a in &decided {
            assert!(!matches!(a, Admission::NotClaimable { .. }), "token {token}: {a:?}");
        }
    }
    let rows = store.submissions(None).await.expect("rows");
    assert_eq!(rows.len(), attempts, "every validated attempt leaves exactly one row");
    for p in &ps {
        let forwardable = rows.iter().filter(|r| r.payout_id == *p && r.outcome.is_none()).count();
        assert!(forwardable <= 1, "payout {p}: {forwardable} forwardable attempts");
        let expected = if forwardable == 1 { PayoutState::Submitted } else { PayoutState::Claimed };
        assert_eq!(state_of(&store, *p).await, expected, "payout {p}");
    }
    let passed = |r: &&dlock_rail_proxy::store::SubmissionRow| r.outcome != Some(SubmissionOutcome::Fenced);
    assert_eq!(
        store.high_water("hot-b").await.expect("mark"),
        rows.iter().filter(passed).map(|r| r.presented_token).max()
    );
    // In write order, each token that passed step 1 is at least every earlier one (equal only
    // within its own batch: every task presents its own token).
    let mut highest = 0;
    for r in rows.iter().filter(passed) {
        assert!(r.presented_token >= highest, "token {} passed after {highest}", r.presented_token);
        highest = r.presented_token;
    }
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
                a_checked_admission_of_a_matching_payout_is_stamped_once_and_decided_as_admit_decides,
                a_batch_passes_the_mark_once_and_raises_it_to_its_token,
                a_fenced_batch_writes_one_fenced_row_per_validated_payout_and_moves_nothing,
                a_batch_decides_duplicates_and_not_claimable_payouts_per_payout,
                unmatched_payouts_of_a_batch_write_nothing,
                a_batch_admitting_k_intents_commits_them_all_before_returning,
                resolve_batch_records_each_outcome_once_and_moves_each_payout_as_resolve_does,
                a_batch_with_fencing_off_skips_step_one_only,
                concurrent_batches_and_single_admissions_keep_one_forwardable_attempt_per_payout_and_the_highest_mark,
                every_rail_change_writes_its_event_in_its_own_transaction_on_every_backend,
                a_refused_rail_write_leaves_no_event,
                rail_event_reads_page_by_their_head
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
