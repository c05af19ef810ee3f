//! Golden scripts of the critical section, without services (issue 36 §2): each test
//! feeds a [`PayoutRun`] the clients' answers as events and holds the commands it returns
//! to a script, one line per step (`event => commands`). One script per C3 refusal code the
//! executor reads and per C3 §3.8 budget rule it keeps; then an exhaustive walk over every
//! answer sequence, which checks the machine's invariants on every path.

use std::collections::{BTreeSet, HashSet, VecDeque};

use dlock_contract::payment::PayoutBody;
use dlock_contract::rail::SubmissionOutcome;

use super::*;

const TTL_MS: u64 = 6_000;

fn limits() -> Limits {
    // One write hop is 500 + 3 000 ms; half a lease 3 000 ms: a rotated grant needs 3 000.
    Limits { lock_wait_ms: 0, write_hop_ms: 3_500, lock_ttl_ms: TTL_MS, chain_payouts_max: 3 }
}

fn p(n: u128) -> Uuid {
    Uuid::from_u128(n)
}

fn name(id: Uuid) -> String {
    format!("p{}", id.as_u128())
}

fn start(states: &[PayoutState]) -> Start {
    Start {
        account: "a".into(),
        members: (1u128..).zip(states).map(|(n, s)| Member { payout_id: p(n), state: *s }).collect(),
        chained: None,
        keep: false,
        owner_valid: true,
    }
}

fn single(state: PayoutState) -> Start {
    start(&[state])
}

fn terms() -> Terms {
    Terms { account_id: "a".into(), amount_minor: 100, currency: "EUR".into(), beneficiary_ref: "b".into() }
}

fn acked(n: u128) -> Acked {
    Acked { payout_id: p(n), submission_id: p(100 + n), rail_reference: format!("RR-{n}") }
}

fn refusal(code: ErrorCode) -> Refusal {
    Refusal { code: Some(code), status: Some(409), text: format!("{code:?}"), ..Refusal::default() }
}

fn unavailable() -> Refusal {
    Refusal { code: Some(ErrorCode::RailUnavailable), status: Some(503), text: "503".into(), ..Refusal::default() }
}

fn not_claimable_now(state: PayoutState) -> Refusal {
    Refusal { state: Some(state), ..refusal(ErrorCode::PayoutNotClaimable) }
}

fn lost() -> Refusal {
    Refusal { lost: Some("timed out".into()), text: "lost".into(), ..Refusal::default() }
}

fn declined() -> Refusal {
    Refusal { code: Some(ErrorCode::ValidationFailed), status: Some(422), text: "422".into(), ..Refusal::default() }
}

fn lock_refused(code: ErrorCode) -> LockRefusal {
    LockRefusal { ambiguous: false, code: Some(code), text: format!("{code:?}") }
}

fn lock_unknown() -> LockRefusal {
    LockRefusal { ambiguous: true, code: None, text: "outcome unknown".into() }
}

fn ok_lease() -> Event {
    Event::LeaseChecked { may_write: true }
}

fn view(state: PayoutState, acked_attempt: Option<u128>) -> Event {
    Event::Read(Some(View { state, terms: terms(), acked: acked_attempt.map(|n| (p(100 + n), format!("RR-{n}"))) }))
}

/// One command, as a script line shows it.
fn show(c: &Command) -> String {
    let ids = |ids: &mut dyn Iterator<Item = Uuid>| ids.map(name).collect::<Vec<_>>().join(",");
    let beside = |rotate: bool| if rotate { " +rotate" } else { "" };
    match c {
        Command::Mark { account } => format!("mark {account}"),
        Command::Acquire { key, wait_ms: None } => format!("acquire {key}"),
        Command::Acquire { key, wait_ms: Some(ms) } => format!("acquire {key} wait {ms}"),
        Command::GrantLease => "grant-lease?".into(),
        Command::Rotate => "rotate".into(),
        Command::CheckLease => "lease?".into(),
        Command::Read { payout_id } => format!("read {}", name(*payout_id)),
        Command::Claim { payout_id, expected_state, token, .. } => {
            format!("claim {} from {} @{token}", name(*payout_id), expected_state.as_str())
        }
        Command::ClaimBatch { members, token, .. } => {
            format!("claim-batch {} @{token}", ids(&mut members.iter().map(|m| m.payout_id)))
        }
        Command::Submit { payout_id, token, .. } => format!("submit {} @{token} +rotate", name(*payout_id)),
        Command::SubmitBatch { submissions, token, .. } => {
            format!("submit-batch {} @{token} +rotate", ids(&mut submissions.iter().map(|s| s.payout_id)))
        }
        Command::Post { acked, token, rotate, .. } => {
            format!("post {} @{token}{}", name(acked.payout_id), beside(*rotate))
        }
        Command::PostBatch { acked, token, rotate, .. } => {
            format!("post-batch {} @{token}{}", ids(&mut acked.iter().map(|a| a.payout_id)), beside(*rotate))
        }
        Command::Release { background: false } => "release".into(),
        Command::Release { background: true } => "release-bg".into(),
        Command::ForgetAccount { account } => format!("forget {account}"),
        Command::Probe(probe) => format!("probe {probe:?}"),
        Command::Log(log) => format!("log {}", log.name()),
        Command::Done(end) => {
            let outcomes: Vec<String> =
                end.outcomes.iter().map(|(id, o)| format!("{}={}", name(*id), o.tag())).collect();
            let kept = end.kept_links.map(|l| format!(" keep {l}")).unwrap_or_default();
            format!("done {:?} [{}]{kept}", end.pass, outcomes.join(" "))
        }
    }
}

/// Plays `steps` (each event, and the commands it must return, `; `-separated) from
/// `start`; the run after them.
fn play(start: Start, steps: &[(Event, &str)]) -> PayoutRun {
    let mut run = PayoutRun::new(limits(), start);
    for (i, (event, want)) in steps.iter().enumerate() {
        let got: Vec<String> = run.step(event.clone()).iter().map(show).collect();
        assert_eq!(got.join("; "), *want, "step {i}: {event:?}");
    }
    run
}

/// The steps of a fresh single PENDING payout up to its claim under token 7.
fn to_the_claim() -> Vec<(Event, &'static str)> {
    vec![
        (Event::Start, "mark a"),
        (Event::Marked { free: true }, "acquire payout:a"),
        (Event::Granted(Ok(7)), "lease?"),
        (ok_lease(), "claim p1 from PENDING @7"),
    ]
}

/// ... and on to its submission (the claim answer carries the terms).
fn to_the_submission() -> Vec<(Event, &'static str)> {
    let mut s = to_the_claim();
    s.extend([(Event::Claimed(Ok(Some(terms()))), "lease?"), (ok_lease(), "submit p1 @7 +rotate")]);
    s
}

/// ... and on to its post under token 8.
fn to_the_post() -> Vec<(Event, &'static str)> {
    let mut s = to_the_submission();
    s.extend([
        (Event::Submitted { answer: Ok(acked(1)), rotated: Ok(8) }, "grant-lease?"),
        (Event::GrantLease { remaining_ms: 5_900 }, "lease?"),
        (ok_lease(), "post p1 @8"),
    ]);
    s
}

fn with(mut steps: Vec<(Event, &'static str)>, more: &[(Event, &'static str)]) -> Vec<(Event, &'static str)> {
    steps.extend(more.iter().cloned());
    steps
}

#[test]
fn a_pending_payout_is_claimed_submitted_once_and_posted_under_the_rotated_grant() {
    let run = play(
        single(PayoutState::Pending),
        &with(to_the_post(), &[(Event::Posted { answer: Ok(()), rotated: None }, "release-bg; done Done [p1=posted]")]),
    );
    assert!(run.is_done());
}

#[test]
fn a_claimed_payout_is_reclaimed_from_its_scan_state_and_probed_as_a_recovery() {
    play(
        single(PayoutState::Claimed),
        &[
            (Event::Start, "mark a"),
            (Event::Marked { free: true }, "acquire payout:a"),
            (Event::Granted(Ok(7)), "lease?"),
            (ok_lease(), "claim p1 from CLAIMED @7"),
            (Event::Claimed(Ok(Some(terms()))), "probe RecoveryReclaim; lease?"),
        ],
    );
}

#[test]
fn a_replayed_claim_answer_without_terms_reads_them_once_and_an_unread_payout_is_not_submitted() {
    let claim = with(to_the_claim(), &[(Event::Claimed(Ok(None)), "read p1")]);
    play(single(PayoutState::Pending), &with(claim.clone(), &[(view(PayoutState::Claimed, None), "lease?")]));
    play(single(PayoutState::Pending), &with(claim, &[(Event::Read(None), "release; done Done [p1=unavailable]")]));
}

#[test]
fn a_rail_acked_candidate_is_read_and_posted_from_its_acked_attempt() {
    let read = [
        (Event::Start, "mark a"),
        (Event::Marked { free: true }, "acquire payout:a"),
        (Event::Granted(Ok(7)), "read p1"),
    ];
    let acked_one =
        with(read.to_vec(), &[(view(PayoutState::RailAcked, Some(1)), "lease?"), (ok_lease(), "post p1 @7")]);
    play(single(PayoutState::RailAcked), &acked_one);
    let without = with(read.to_vec(), &[(view(PayoutState::RailAcked, None), "release; done Done [p1=unavailable]")]);
    play(single(PayoutState::RailAcked), &without);
    let settled = with(read.to_vec(), &[(view(PayoutState::Posted, None), "release; done Done []")]);
    play(single(PayoutState::RailAcked), &settled);
    let unread = with(read.to_vec(), &[(Event::Read(None), "release; done Done [p1=unavailable]")]);
    play(single(PayoutState::RailAcked), &unread);
}

/// C3 refusal codes at the claim (P2): how each ends the run. Only `PAYOUT_NOT_CLAIMABLE`
/// naming RAIL_ACKED goes on (FR-14: read it and post); no refusal is followed by a
/// second claim under the grant.
#[test]
fn each_claim_refusal_code_ends_the_run_as_its_table_row_says() {
    let rows: [(Refusal, &str); 6] = [
        (refusal(ErrorCode::FencedOut), "log executor_fenced_out; release; done Done [p1=fenced]"),
        (not_claimable_now(PayoutState::Posted), "release; done Done [p1=not_claimable]"),
        (not_claimable_now(PayoutState::RailAcked), "read p1"),
        (refusal(ErrorCode::InsufficientFunds), "release; done Done [p1=failed]"),
        (unavailable(), "log executor_claim_undecided; release; done Done [p1=unavailable]"),
        (lost(), "log executor_claim_undecided; release; done Done [p1=unavailable]"),
    ];
    for (r, want) in rows {
        play(single(PayoutState::Pending), &with(to_the_claim(), &[(Event::Claimed(Err(r)), want)]));
    }
}

#[test]
fn a_stale_scan_state_corrected_to_rail_acked_is_read_and_posted_and_never_claimed_again() {
    let steps = with(
        to_the_claim(),
        &[
            (Event::Claimed(Err(not_claimable_now(PayoutState::RailAcked))), "read p1"),
            (view(PayoutState::RailAcked, Some(1)), "lease?"),
            (ok_lease(), "post p1 @7"),
            (Event::Posted { answer: Ok(()), rotated: None }, "release-bg; done Done [p1=posted]"),
        ],
    );
    play(single(PayoutState::Pending), &steps);
    // A claim whose state came from a read is not corrected again: it ends not claimable.
    let read_first = [
        (Event::Start, "mark a"),
        (Event::Marked { free: true }, "acquire payout:a"),
        (Event::Granted(Ok(7)), "read p1"),
        (view(PayoutState::Pending, None), "lease?"),
        (ok_lease(), "claim p1 from PENDING @7"),
        (Event::Claimed(Err(not_claimable_now(PayoutState::RailAcked))), "release; done Done [p1=not_claimable]"),
    ];
    play(single(PayoutState::RailAcked), &read_first);
}

/// C3 §3.7, §3.8: each refusal of the submission ends the run without a second
/// submission, and the grant rotated beside it is released in line.
#[test]
fn each_submission_refusal_ends_the_run_without_a_second_submission() {
    let rows: [(Refusal, &str); 7] = [
        (refusal(ErrorCode::FencedOut), "log executor_fenced_out; release; done Done [p1=fenced]"),
        (
            refusal(ErrorCode::DuplicateSubmission),
            "log executor_duplicate_submission; release; done Done [p1=duplicate]",
        ),
        (refusal(ErrorCode::RailAmbiguous), "log rail_ambiguous; release; done Done [p1=ambiguous]"),
        (declined(), "release; done Done [p1=failed]"),
        (refusal(ErrorCode::PayoutNotClaimable), "release; done Done [p1=not_claimable]"),
        (lost(), "log executor_submission_answer_lost; release; done Done [p1=answer_lost]"),
        (unavailable(), "log executor_submission_undecided; release; done Done [p1=unavailable]"),
    ];
    for (r, want) in rows {
        let steps = with(to_the_submission(), &[(Event::Submitted { answer: Err(r.clone()), rotated: Ok(8) }, want)]);
        play(single(PayoutState::Pending), &steps);
        // The rotate failed too: nothing is left to release.
        let bare = want.replace("release; ", "");
        let steps = with(
            to_the_submission(),
            &[(Event::Submitted { answer: Err(r), rotated: Err(lock_refused(ErrorCode::LockLost)) }, bare.leak())],
        );
        play(single(PayoutState::Pending), &steps);
    }
}

/// C3 refusal codes at the post (P3).
#[test]
fn each_post_refusal_code_ends_the_run_as_its_table_row_says() {
    let rows: [(Refusal, &str); 3] = [
        (refusal(ErrorCode::FencedOut), "log executor_fenced_out; release-bg; done Done [p1=fenced]"),
        (refusal(ErrorCode::PayoutNotClaimable), "release-bg; done Done [p1=not_claimable]"),
        (unavailable(), "log executor_post_undecided; release-bg; done Done [p1=unavailable]"),
    ];
    for (r, want) in rows {
        play(
            single(PayoutState::Pending),
            &with(to_the_post(), &[(Event::Posted { answer: Err(r), rotated: None }, want)]),
        );
    }
}

/// C3 §3.8 / FR-11: past the local lease deadline the run writes nothing more, before the
/// claim, the submission or the post alike, and releases in line.
#[test]
fn a_lapsed_lease_stops_each_write_before_it_is_sent() {
    let lapsed = Event::LeaseChecked { may_write: false };
    let end = "release; done Done [p1=lease_lost]";
    let mut claim = to_the_claim();
    claim.pop();
    play(single(PayoutState::Pending), &with(claim, &[(lapsed.clone(), end)]));
    let mut submit = to_the_submission();
    submit.pop();
    play(single(PayoutState::Pending), &with(submit, &[(lapsed.clone(), end)]));
    let mut post = to_the_post();
    post.pop();
    play(single(PayoutState::Pending), &with(post, &[(lapsed, end)]));
}

/// The post's grant, rotated beside the submission, is rotated once more only when its own
/// lease left is under one write hop or half a lease (here 3 000 ms); a failed rotate
/// leaves the paid payout for a later scan to post.
#[test]
fn a_rotated_grant_short_of_a_writes_lease_is_rotated_once_more_before_the_post() {
    let mut at = to_the_submission();
    at.push((Event::Submitted { answer: Ok(acked(1)), rotated: Ok(8) }, "grant-lease?"));
    play(single(PayoutState::Pending), &with(at.clone(), &[(Event::GrantLease { remaining_ms: 3_000 }, "lease?")]));
    let short = with(
        at.clone(),
        &[
            (Event::GrantLease { remaining_ms: 2_999 }, "rotate"),
            (Event::Granted(Ok(9)), "lease?"),
            (ok_lease(), "post p1 @9"),
        ],
    );
    play(single(PayoutState::Pending), &short);
    let failed = with(
        at,
        &[
            (Event::GrantLease { remaining_ms: 0 }, "rotate"),
            (Event::Granted(Err(lock_unknown())), "log executor_post_deferred; done Done [p1=unavailable]"),
        ],
    );
    play(single(PayoutState::Pending), &failed);
    let no_rotate = with(
        to_the_submission(),
        &[(
            Event::Submitted { answer: Ok(acked(1)), rotated: Err(lock_refused(ErrorCode::LockLost)) },
            "log executor_post_deferred; done Done [p1=unavailable]",
        )],
    );
    play(single(PayoutState::Pending), &no_rotate);
}

/// The acquire: a sibling's account is skipped without asking; `LOCK_CONTENDED` forgets
/// the account for the pass; an unknown outcome resets the session; `executor.lock-wait-ms`
/// rides on the acquire.
#[test]
fn an_account_not_granted_is_skipped_forgotten_or_resets_the_session() {
    play(single(PayoutState::Pending), &[(Event::Start, "mark a"), (Event::Marked { free: false }, "done Busy []")]);
    let acquire = [(Event::Start, "mark a"), (Event::Marked { free: true }, "acquire payout:a")];
    let rows: [(LockRefusal, &str); 3] = [
        (lock_refused(ErrorCode::LockContended), "forget a; log executor_account_busy; done Busy []"),
        (lock_refused(ErrorCode::ContentionExceeded), "log executor_account_busy; done Busy []"),
        (lock_unknown(), "log executor_session_reset; done Reset []"),
    ];
    for (e, want) in rows {
        play(single(PayoutState::Pending), &with(acquire.to_vec(), &[(Event::Granted(Err(e)), want)]));
    }
    let mut run = PayoutRun::new(Limits { lock_wait_ms: 200, ..limits() }, single(PayoutState::Pending));
    run.step(Event::Start);
    assert_eq!(
        run.step(Event::Marked { free: true }).iter().map(show).collect::<Vec<_>>(),
        ["acquire payout:a wait 200"]
    );
}

/// Chains (issue 14): a posted payout's grant is rotated beside its post and kept while the
/// pass holds more of its account, within `executor.chain-payouts-max` (3 here); the kept
/// grant starts the next run, rotated first only when short of lease.
#[test]
fn a_posted_payouts_grant_is_kept_for_its_accounts_next_run_within_the_chain_bound() {
    let keeping = Start { keep: true, ..single(PayoutState::Pending) };
    let mut steps = to_the_post();
    steps.pop();
    steps.push((ok_lease(), "post p1 @8 +rotate"));
    let posted = with(
        steps.clone(),
        &[(Event::Posted { answer: Ok(()), rotated: Some(Ok(9)) }, "done Done [p1=posted] keep 1")],
    );
    play(keeping.clone(), &posted);
    let refused = Event::Posted { answer: Err(unavailable()), rotated: Some(Ok(9)) };
    let not_kept =
        with(steps.clone(), &[(refused, "log executor_post_undecided; release-bg; done Done [p1=unavailable]")]);
    play(keeping.clone(), &not_kept);
    let failed = Event::Posted { answer: Ok(()), rotated: Some(Err(lock_unknown())) };
    play(keeping.clone(), &with(steps, &[(failed, "log executor_chain_rotate_failed; done Done [p1=posted]")]));
    // The next run starts from the kept grant; the third link is the chain's last.
    let chained = |links| Start { chained: Some(Kept { key: "payout:a".into(), token: 9, links }), ..keeping.clone() };
    play(
        chained(1),
        &[
            (Event::Start, "grant-lease?"),
            (Event::GrantLease { remaining_ms: 5_000 }, "probe GrantChained; lease?"),
            (ok_lease(), "claim p1 from PENDING @9"),
        ],
    );
    let last = play(
        chained(2),
        &[
            (Event::Start, "grant-lease?"),
            (Event::GrantLease { remaining_ms: 100 }, "rotate"),
            (Event::Granted(Ok(10)), "probe GrantChained; lease?"),
            (ok_lease(), "claim p1 from PENDING @10"),
            (Event::Claimed(Ok(Some(terms()))), "lease?"),
            (ok_lease(), "submit p1 @10 +rotate"),
            (Event::Submitted { answer: Ok(acked(1)), rotated: Ok(11) }, "grant-lease?"),
            (Event::GrantLease { remaining_ms: 5_900 }, "lease?"),
            (ok_lease(), "post p1 @11"),
            (Event::Posted { answer: Ok(()), rotated: None }, "release-bg; done Done [p1=posted]"),
        ],
    );
    assert!(last.is_done());
    play(
        chained(1),
        &[
            (Event::Start, "grant-lease?"),
            (Event::GrantLease { remaining_ms: 0 }, "rotate"),
            (Event::Granted(Err(lock_unknown())), "log executor_session_reset; done Reset []"),
        ],
    );
}

#[test]
#[should_panic(expected = "a chained grant is only ever rotated into its own account's payouts")]
fn a_kept_grant_is_never_rotated_into_another_accounts_payout() {
    let other =
        Start { chained: Some(Kept { key: "payout:b".into(), token: 9, links: 1 }), ..single(PayoutState::Pending) };
    let _ = PayoutRun::new(limits(), other);
}

#[test]
#[should_panic(expected = "does not answer phase")]
fn an_event_that_answers_no_outstanding_command_is_refused() {
    let mut run = PayoutRun::new(limits(), single(PayoutState::Pending));
    run.step(Event::Start);
    run.step(Event::Claimed(Ok(None)));
}

#[test]
fn an_invalid_owner_id_writes_nothing_and_releases() {
    let bad = Start { owner_valid: false, ..single(PayoutState::Pending) };
    play(
        bad,
        &[
            (Event::Start, "mark a"),
            (Event::Marked { free: true }, "acquire payout:a"),
            (Event::Granted(Ok(7)), "log executor_owner_invalid; release; done Done [p1=unavailable]"),
        ],
    );
}

fn batch_of(items: &[(u128, ClaimItem)]) -> Event {
    Event::ClaimedBatch(Ok(Batch {
        account_id: "a".into(),
        presented_token: 7,
        items: items.iter().map(|(n, i)| (p(*n), i.clone())).collect(),
    }))
}

fn claimed_item() -> ClaimItem {
    ClaimItem { status: 200, terms: Some(terms()), code: None }
}

fn refused_item(status: u16, code: ErrorCode) -> ClaimItem {
    ClaimItem { status, terms: None, code: Some(code) }
}

fn submit_items(token: i64, items: &[(u128, Result<Acked, Refusal>)]) -> Batch<SubmitItem> {
    Batch {
        account_id: "a".into(),
        presented_token: token,
        items: items
            .iter()
            .map(|(n, r)| {
                let item = match r {
                    Ok(a) => SubmitItem { acked: Some(a.clone()), refusal: Refusal::default() },
                    Err(r) => SubmitItem { acked: None, refusal: r.clone() },
                };
                (p(*n), item)
            })
            .collect(),
    }
}

/// E-19: a batch is the same machine over N payouts: one claim, one submission, one post
/// under the rotated grant; each item read as its single write's answer.
#[test]
fn a_batch_claims_submits_and_posts_its_payouts_once_each_reading_items_as_single_answers() {
    let claim = [
        (Event::Start, "mark a"),
        (Event::Marked { free: true }, "acquire payout:a"),
        (Event::Granted(Ok(7)), "lease?"),
        (ok_lease(), "claim-batch p1,p2,p3,p4 @7"),
    ];
    let claimed = batch_of(&[
        (1, claimed_item()),
        (2, refused_item(409, ErrorCode::InsufficientFunds)),
        (3, ClaimItem { status: 200, terms: Some(terms()), code: None }),
        (4, refused_item(404, ErrorCode::NotFound)),
    ]);
    let submitted = submit_items(7, &[(1, Ok(acked(1))), (3, Err(refusal(ErrorCode::RailAmbiguous)))]);
    let posted =
        Batch { account_id: "a".into(), presented_token: 8, items: vec![(p(1), PostItem { status: 201, code: None })] };
    let steps = with(
        claim.to_vec(),
        &[
            (claimed, "probe RecoveryReclaim; lease?"),
            (ok_lease(), "submit-batch p1,p3 @7 +rotate"),
            (Event::SubmittedBatch { answer: Ok(submitted), rotated: Ok(8) }, "log rail_ambiguous; grant-lease?"),
            (Event::GrantLease { remaining_ms: 5_000 }, "lease?"),
            (ok_lease(), "post-batch p1 @8"),
            (
                Event::PostedBatch { answer: Ok(posted), rotated: None },
                "release-bg; done Done [p1=posted p2=failed p3=ambiguous p4=not_claimable]",
            ),
        ],
    );
    let four = [PayoutState::Pending, PayoutState::Pending, PayoutState::Claimed, PayoutState::Pending];
    play(start(&four), &steps);
    // An answer for another account, or under another token, is no answer: each payout
    // ends unavailable, and with none claimed the grant is released in line.
    let elsewhere = Event::ClaimedBatch(Ok(Batch {
        account_id: "b".into(),
        presented_token: 7,
        items: vec![(p(1), claimed_item())],
    }));
    let steps = with(
        claim.to_vec(),
        &[(elsewhere, "release; done Done [p1=unavailable p2=unavailable p3=unavailable p4=unavailable]")],
    );
    play(start(&four), &steps);
}

/// A refusal of a whole batch request ends every payout still open, as the single write's
/// refusal would.
#[test]
fn a_refused_batch_request_ends_every_open_payout_of_it() {
    let two = [PayoutState::Pending, PayoutState::Pending];
    let claim = [
        (Event::Start, "mark a"),
        (Event::Marked { free: true }, "acquire payout:a"),
        (Event::Granted(Ok(7)), "lease?"),
        (ok_lease(), "claim-batch p1,p2 @7"),
    ];
    let fenced = Event::ClaimedBatch(Err(refusal(ErrorCode::FencedOut)));
    play(
        start(&two),
        &with(claim.to_vec(), &[(fenced, "log executor_fenced_out; release; done Done [p1=fenced p2=fenced]")]),
    );
    let submit = with(
        claim.to_vec(),
        &[
            (batch_of(&[(1, claimed_item()), (2, claimed_item())]), "lease?"),
            (ok_lease(), "submit-batch p1,p2 @7 +rotate"),
        ],
    );
    let lost_all = Event::SubmittedBatch { answer: Err(lost()), rotated: Ok(8) };
    let want = "log executor_submission_answer_lost; release-bg; done Done [p1=answer_lost p2=answer_lost]";
    play(start(&two), &with(submit.clone(), &[(lost_all, want)]));
    let lapsed = Event::LeaseChecked { may_write: false };
    let mut before = submit.clone();
    before.pop();
    play(start(&two), &with(before, &[(lapsed, "release; done Done [p1=lease_lost p2=lease_lost]")]));
    let post = with(
        submit,
        &[
            (
                Event::SubmittedBatch {
                    answer: Ok(submit_items(7, &[(1, Ok(acked(1))), (2, Ok(acked(2)))])),
                    rotated: Ok(8),
                },
                "grant-lease?",
            ),
            (Event::GrantLease { remaining_ms: 5_000 }, "lease?"),
            (ok_lease(), "post-batch p1,p2 @8"),
        ],
    );
    let fenced = Event::PostedBatch { answer: Err(refusal(ErrorCode::FencedOut)), rotated: None };
    play(start(&two), &with(post, &[(fenced, "release-bg; log executor_fenced_out; done Done [p1=fenced p2=fenced]")]));
}

/// The answers a walk offers for each command that asks for one.
fn answers(c: &Command) -> Vec<Event> {
    let grants = |next: i64| {
        vec![
            Event::Granted(Ok(next)),
            Event::Granted(Err(lock_unknown())),
            Event::Granted(Err(lock_refused(ErrorCode::LockContended))),
        ]
    };
    let claim_refusals = || {
        vec![
            refusal(ErrorCode::FencedOut),
            not_claimable_now(PayoutState::RailAcked),
            not_claimable_now(PayoutState::Posted),
            refusal(ErrorCode::InsufficientFunds),
            unavailable(),
        ]
    };
    let submit_refusals =
        || vec![refusal(ErrorCode::FencedOut), refusal(ErrorCode::RailAmbiguous), declined(), lost(), unavailable()];
    let rotations = |rotate: bool, next: i64| -> Vec<Option<Result<i64, LockRefusal>>> {
        if rotate {
            vec![Some(Ok(next)), Some(Err(lock_unknown()))]
        } else {
            vec![None]
        }
    };
    match c {
        Command::Mark { .. } => vec![Event::Marked { free: true }, Event::Marked { free: false }],
        Command::Acquire { .. } => grants(7),
        Command::Rotate => grants(20),
        Command::GrantLease => vec![Event::GrantLease { remaining_ms: 0 }, Event::GrantLease { remaining_ms: TTL_MS }],
        Command::CheckLease => vec![ok_lease(), Event::LeaseChecked { may_write: false }],
        Command::Read { .. } => vec![
            Event::Read(None),
            view(PayoutState::Pending, None),
            view(PayoutState::RailAcked, Some(1)),
            view(PayoutState::RailAcked, None),
            view(PayoutState::Posted, None),
        ],
        Command::Claim { .. } => {
            let mut e = vec![Event::Claimed(Ok(Some(terms()))), Event::Claimed(Ok(None))];
            e.extend(claim_refusals().into_iter().map(|r| Event::Claimed(Err(r))));
            e
        }
        Command::ClaimBatch { members, token, .. } => {
            let mut e: Vec<Event> = claim_refusals().into_iter().map(|r| Event::ClaimedBatch(Err(r))).collect();
            let options = [
                claimed_item(),
                refused_item(409, ErrorCode::InsufficientFunds),
                refused_item(409, ErrorCode::PayoutNotClaimable),
            ];
            for a in &options {
                for b in &options {
                    let items = vec![(members[0].payout_id, a.clone()), (members[1].payout_id, b.clone())];
                    e.push(Event::ClaimedBatch(Ok(Batch { account_id: "a".into(), presented_token: *token, items })));
                }
            }
            e
        }
        Command::Submit { payout_id, token, .. } => {
            let mut e = Vec::new();
            for rotated in [Ok(token + 1), Err(lock_unknown())] {
                let ok = Acked { payout_id: *payout_id, ..acked(1) };
                e.push(Event::Submitted { answer: Ok(ok), rotated: rotated.clone() });
                for r in submit_refusals() {
                    e.push(Event::Submitted { answer: Err(r), rotated: rotated.clone() });
                }
            }
            e
        }
        Command::SubmitBatch { submissions, token, .. } => {
            let mut e = Vec::new();
            for rotated in [Ok(token + 1), Err(lock_unknown())] {
                e.push(Event::SubmittedBatch { answer: Err(lost()), rotated: rotated.clone() });
                let options = [Ok(()), Err(refusal(ErrorCode::RailAmbiguous)), Err(declined())];
                let ids: Vec<u128> = submissions.iter().map(|s| s.payout_id.as_u128()).collect();
                let mut combos: Vec<Vec<(u128, Result<Acked, Refusal>)>> = vec![Vec::new()];
                for id in &ids {
                    combos = combos
                        .into_iter()
                        .flat_map(|prefix| {
                            options.iter().map(move |o| {
                                let mut next = prefix.clone();
                                next.push((*id, o.clone().map(|()| acked(*id))));
                                next
                            })
                        })
                        .collect();
                }
                for combo in combos {
                    e.push(Event::SubmittedBatch {
                        answer: Ok(submit_items(*token, &combo)),
                        rotated: rotated.clone(),
                    });
                }
            }
            e
        }
        Command::Post { token, rotate, .. } => {
            let mut e = Vec::new();
            for rotated in rotations(*rotate, token + 1) {
                for answer in [Ok(()), Err(refusal(ErrorCode::FencedOut)), Err(unavailable())] {
                    e.push(Event::Posted { answer, rotated: rotated.clone() });
                }
            }
            e
        }
        Command::PostBatch { acked, token, rotate, .. } => {
            let mut e = Vec::new();
            for rotated in rotations(*rotate, token + 1) {
                e.push(Event::PostedBatch { answer: Err(refusal(ErrorCode::FencedOut)), rotated: rotated.clone() });
                for status in [201, 409] {
                    let items = acked.iter().map(|a| (a.payout_id, PostItem { status, code: None })).collect();
                    let answer = Batch { account_id: "a".into(), presented_token: *token, items };
                    e.push(Event::PostedBatch { answer: Ok(answer), rotated: rotated.clone() });
                }
            }
            e
        }
        _ => unreachable!("{c:?} is not answered"),
    }
}

/// Walks every answer sequence from `start` (states deduplicated by their hash, as a model
/// checker would); checks each run's end. The number of distinct states seen.
fn walk(start: Start) -> (usize, usize) {
    let members: BTreeSet<Uuid> = start.members.iter().map(|m| m.payout_id).collect();
    let (batch, keep) = (members.len() > 1, start.keep);
    let mut seen: HashSet<PayoutRun> = HashSet::new();
    let mut queue: VecDeque<(PayoutRun, Event, usize, usize)> = VecDeque::new();
    queue.push_back((PayoutRun::new(limits(), start), Event::Start, 0, 1));
    let mut deepest = 0;
    let mut ends = 0;
    while let Some((mut run, event, submissions, depth)) = queue.pop_front() {
        deepest = deepest.max(depth);
        let commands = run.step(event);
        let submissions = submissions
            + commands.iter().filter(|c| matches!(c, Command::Submit { .. } | Command::SubmitBatch { .. })).count();
        assert!(submissions <= 1, "a run submits at most once");
        let last = commands.last().expect("a step commands something");
        if let Command::Done(end) = last {
            ends += 1;
            let ended: BTreeSet<Uuid> = end.outcomes.iter().map(|(id, _)| *id).collect();
            assert_eq!(ended.len(), end.outcomes.len(), "each payout ends once");
            if batch && end.pass == Pass::Done {
                assert_eq!(ended, members, "a batch ends with one outcome per member");
            }
            assert!(ended.is_subset(&members));
            if end.kept_links.is_some() {
                assert!(
                    keep && end.outcomes.iter().any(|(_, o)| *o == Outcome::Posted),
                    "only a posted run keeps its grant"
                );
            }
            continue;
        }
        if !seen.insert(run.clone()) {
            continue;
        }
        for answer in answers(last) {
            queue.push_back((run.clone(), answer, submissions, depth + 1));
        }
    }
    assert!(ends > 0);
    (seen.len(), deepest)
}

/// Every answer sequence the clients can give ends the run within [`RUN_STEPS_MAX`] steps,
/// never submits twice, ends each payout once (a batch every member) and keeps a grant only
/// after a post: single payouts of each scan state, fresh and chained, and a batch of two.
#[test]
fn every_answer_sequence_ends_the_run_keeping_its_invariants() {
    let (mut states, mut deepest) = (0, 0);
    let mut starts = Vec::new();
    for state in [PayoutState::Pending, PayoutState::Claimed, PayoutState::RailAcked] {
        starts.push(single(state));
        starts.push(Start { keep: true, ..single(state) });
        let chained = Some(Kept { key: "payout:a".into(), token: 5, links: 1 });
        starts.push(Start { keep: true, chained, ..single(state) });
    }
    starts.push(start(&[PayoutState::Pending, PayoutState::Claimed]));
    starts.push(Start { keep: true, ..start(&[PayoutState::Pending, PayoutState::Pending]) });
    for s in starts {
        let (seen, depth) = walk(s);
        states += seen;
        deepest = deepest.max(depth);
    }
    assert!(states > 100, "the walk reached {states} states");
    // A chained payout whose stale scan state a read corrects, rotated twice: 14 steps.
    assert_eq!(deepest, 14, "the longest run, within RUN_STEPS_MAX ({RUN_STEPS_MAX})");
}

#[test]
fn the_acked_attempt_is_found_among_the_submissions() {
    let at = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
    let attempt =
        |n: u128, outcome: SubmissionOutcome, reference: Option<&str>| dlock_contract::payment::SubmissionBody {
            submission_id: Uuid::from_u128(n),
            presented_token: 1,
            outcome: Some(outcome),
            rail_reference: reference.map(str::to_owned),
            submitted_at: at,
            resolved_at: Some(at),
        };
    let mut view = PayoutBody {
        payout_id: Uuid::from_u128(9),
        account_id: "a".into(),
        amount_minor: 1,
        currency: "EUR".into(),
        beneficiary_ref: "b".into(),
        state: PayoutState::RailAcked,
        attempt_count: 2,
        claim_token: None,
        claimed_by: None,
        claimed_at: None,
        created_at: at,
        updated_at: at,
        submissions: vec![
            attempt(1, SubmissionOutcome::Unsent, None),
            attempt(2, SubmissionOutcome::Acked, Some("RR-2")),
        ],
    };
    assert_eq!(acked_submission(&view), Some((Uuid::from_u128(2), "RR-2".into())));
    view.submissions.clear();
    assert_eq!(acked_submission(&view), None);
}
