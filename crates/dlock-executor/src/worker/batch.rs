//! One critical section for several payouts of one account (issue 14, C3-extensions E-19).
//!
//! A pass that holds more than one PENDING or CLAIMED candidate of an account works up to
//! `executor.payouts-per-grant-max` of them together ([`take_batch`]):
//!
//! 1. one grant of `payout:{accountId}` (an acquire, or the rotate of a chain's kept grant);
//! 2. P2b: every member claimed under that grant, the account's fence passed once;
//! 3. R1b: every claimed member submitted under the same grant, the rail's mark passed
//!    once, each payout forwarded exactly once by the proxy; the post's newer grant is
//!    rotated beside it (E-18 "Overlap");
//! 4. P3b: every acknowledged member posted under the newer grant, the fence passed once;
//! 5. the release in the background, or, when the pass holds more of the account, a rotate
//!    beside the post whose grant the next batch (or payout) of the account claims with.
//!
//! Each payout's item answer is handled exactly as its single write's answer is
//! ([`Executor::refused_submission`], the claim's and post's refusals), and every refusal
//! that concerns the whole request (`FENCED_OUT`, an unknown outcome) ends the section for
//! every payout in it. Before each hop the local lease is checked ([`Executor::may_write`]):
//! past it, nothing more is written for any member. Nothing here retries a submission.
//!
//! Invariants (asserted):
//! - Every member is of the batch's one account, named once, PENDING or CLAIMED.
//! - Each member ends with exactly one [`Outcome`].

use std::collections::{BTreeMap, VecDeque};

use dlock_contract::batch::{BatchAnswer, BatchItem};
use dlock_contract::payment::{
    ClaimAck, ClaimBatchItem, ClaimBatchRequest, ClaimedTerms, PostBatchItem, PostBatchRequest,
};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{SubmissionAck, SubmissionBatchItem, SubmissionBatchRequest, SubmissionOutcome};
use dlock_contract::{ErrorCode, IdempotencyKey, OwnerId};
use dlock_lock_client::{LockGuard, Session};
use dlock_rail_client::RailRefusal;
use uuid::Uuid;

use super::{write_key, Candidate, Chain, Executor, Step};
use crate::metrics::{Hop, Outcome};

/// Whether a candidate may be claimed in a batch: P2b claims from PENDING or CLAIMED only.
pub fn batchable(c: &Candidate) -> bool {
    matches!(c.state, PayoutState::Pending | PayoutState::Claimed)
}

/// The other members of `first`'s batch (pure): up to `more_max` further batchable
/// candidates of its account, taken out of `queue` in queue order. Candidates of other
/// accounts, and the account's RAIL_ACKED ones, stay in the queue in their order.
pub fn take_batch(queue: &mut VecDeque<Candidate>, first: &Candidate, more_max: usize) -> Vec<Candidate> {
    let mut taken = Vec::new();
    let mut kept = VecDeque::with_capacity(queue.len());
    while let Some(c) = queue.pop_front() {
        if taken.len() < more_max && c.account_id == first.account_id && c.payout_id != first.payout_id && batchable(&c)
        {
            taken.push(c);
        } else {
            kept.push_back(c);
        }
    }
    *queue = kept;
    taken
}

/// One batch's inputs.
pub(super) struct BatchAttempt<'a> {
    pub session: &'a Session,
    pub owner: &'a str,
    pub account: &'a str,
    pub members: Vec<Candidate>,
    /// The grant a posted payout (or batch) of the same account kept.
    pub chained: Option<Chain>,
    /// Whether the pass holds more of the account after this batch (keep the post's grant).
    pub keep: bool,
}

/// How each member ended, how the step ended, and the grant kept for the account's next.
pub(super) type BatchEnd = (Vec<(Candidate, Outcome)>, Step, Option<Chain>);

/// Every member's outcome so far, each set once.
struct Ends {
    members: Vec<Candidate>,
    outcomes: BTreeMap<Uuid, Outcome>,
}

impl Ends {
    fn set(&mut self, payout: Uuid, o: Outcome) {
        let first = self.outcomes.insert(payout, o);
        assert!(first.is_none(), "payout {payout} ended twice in one batch");
    }

    /// Every member without an outcome yet ends as `o`.
    fn rest(&mut self, o: Outcome) {
        for m in &self.members {
            self.outcomes.entry(m.payout_id).or_insert(o);
        }
    }

    fn done(mut self) -> Vec<(Candidate, Outcome)> {
        self.rest(Outcome::Unavailable);
        let outcomes = self.outcomes;
        self.members
            .into_iter()
            .map(|m| {
                let o = outcomes.get(&m.payout_id).copied().unwrap_or(Outcome::Unavailable);
                (m, o)
            })
            .collect()
    }
}

/// A batch's idempotency key (P2b, P3b): stable for the request's one retry, distinct per
/// grant (the identity is also keyed by the token).
fn batch_key(kind: &str, token: i64) -> Option<IdempotencyKey> {
    IdempotencyKey::parse(&format!("{kind}:{token}")).ok()
}

/// An item's refusal as the single submission's client would have read it.
fn item_refusal(item: &BatchItem) -> RailRefusal {
    match item.envelope() {
        Some(envelope) => RailRefusal::Refused { status: item.status, envelope },
        None => RailRefusal::Unreadable { status: item.status, cause: "not a C3 envelope".into() },
    }
}

impl Executor {
    /// One critical section for a batch's members ([`BatchAttempt`]); see the module doc.
    pub(super) async fn execute_batch_step(&self, a: BatchAttempt<'_>) -> BatchEnd {
        let root = self.traces.next_root();
        let span = root.work_span("payout_batch", a.account);
        let attempt = Box::pin(self.execute_batch(a));
        tracing::Instrument::instrument(root.scope(attempt), span).await
    }

    async fn execute_batch(&self, a: BatchAttempt<'_>) -> BatchEnd {
        let BatchAttempt { session, owner, account, members, chained, keep } = a;
        for m in &members {
            assert!(m.account_id == account && batchable(m), "a batch holds its account's claimable payouts only");
        }
        let started = self.clock.now();
        let (working, guard, links) = match self.grant_of(session, account, chained).await {
            Ok(granted) => granted,
            Err(step) => return (Vec::new(), step, None),
        };
        let links = links + u32::try_from(members.len()).unwrap_or(u32::MAX);
        let keep = keep && links < self.cfg.chain_payouts_max;
        let mut ends = Ends { members, outcomes: BTreeMap::new() };
        let kept = match OwnerId::parse(owner) {
            Ok(owner_id) => Box::pin(self.batch_held(&mut ends, keep, &owner_id, account, guard)).await,
            Err(_) => {
                tracing::error!(ownerId = owner, "executor_owner_invalid");
                self.release(guard).await;
                None
            }
        };
        let done = ends.done();
        for (m, o) in &done {
            self.observe_end(m, *o, started);
        }
        let chain = kept.map(|guard| Chain { guard, mark: working, links });
        (done, Step::Done, chain)
    }

    /// Claims, submits and posts the members under `guard` (and its rotated successor);
    /// the grant kept for the account's next payouts, if any.
    async fn batch_held(
        &self,
        ends: &mut Ends,
        keep: bool,
        owner: &OwnerId,
        account: &str,
        guard: LockGuard,
    ) -> Option<LockGuard> {
        let claimed = match self.batch_claim(ends, owner, account, &guard).await {
            Some(claimed) if !claimed.is_empty() => claimed,
            _ => {
                self.release(guard).await;
                return None;
            }
        };
        let (acked, newer) = self.batch_submit(ends, owner, account, guard, claimed).await;
        let newer = newer?;
        if acked.is_empty() {
            self.release_in_background(newer).await;
            return None;
        }
        self.batch_post(ends, keep, owner, account, newer, acked).await
    }

    /// P2b under `guard`: the members' terms, for those claimed.
    async fn batch_claim(
        &self,
        ends: &mut Ends,
        owner: &OwnerId,
        account: &str,
        guard: &LockGuard,
    ) -> Option<Vec<(Uuid, ClaimedTerms)>> {
        let token = guard.token().get();
        let Some(key) = batch_key("claims", token) else {
            ends.rest(Outcome::Unavailable);
            return None;
        };
        if !self.may_write(guard) {
            ends.rest(Outcome::LeaseLost);
            return None;
        }
        self.maybe_stall("claim", owner.as_str()).await;
        let body = ClaimBatchRequest {
            payouts: ends
                .members
                .iter()
                .map(|m| ClaimBatchItem { payout_id: m.payout_id, expected_state: m.state })
                .collect(),
        };
        let claim = self.hops.payment.claim_batch(account, guard.signed_token(), owner, &key, &body);
        let answer = match self.metrics.hops.time(&self.clock, Hop::Claim, claim).await {
            Ok(answer) => answer,
            Err(refusal) => {
                if refusal.code() == Some(ErrorCode::FencedOut) {
                    self.fenced("claim", owner, token, refusal.details());
                    ends.rest(Outcome::Fenced);
                } else {
                    // Unknown or refused as a whole: the members stay as they are (a claimed
                    // one is re-claimed from a later scan, under a newer grant).
                    tracing::warn!(accountId = account, answer = %refusal, "executor_claim_undecided");
                    ends.rest(Outcome::Unavailable);
                }
                return None;
            }
        };
        let mut claimed = Vec::new();
        for m in ends.members.clone() {
            let Some(item) = answer_item(&answer, account, token, m.payout_id) else {
                ends.set(m.payout_id, Outcome::Unavailable);
                continue;
            };
            match (item.ok::<ClaimAck>().and_then(|ack| ack.terms()), item.envelope().map(|e| e.code)) {
                (Some(terms), _) if terms.account_id == account => {
                    if m.state == PayoutState::Claimed {
                        dlock_rt::probe::hit(dlock_rt::probe::Probe::RecoveryReclaim);
                    }
                    claimed.push((m.payout_id, terms));
                }
                (_, Some(ErrorCode::InsufficientFunds)) => ends.set(m.payout_id, Outcome::Failed),
                (_, Some(ErrorCode::PayoutNotClaimable | ErrorCode::NotFound)) => {
                    ends.set(m.payout_id, Outcome::NotClaimable)
                }
                _ => {
                    tracing::warn!(payoutId = %m.payout_id, status = item.status, "executor_claim_undecided");
                    ends.set(m.payout_id, Outcome::Unavailable);
                }
            }
        }
        Some(claimed)
    }

    /// R1b under `guard`, with the post's newer grant rotated beside it: the members the rail
    /// acknowledged (submission id, rail reference), and the newer grant (`None` when the
    /// section ends here, every member's outcome set).
    async fn batch_submit(
        &self,
        ends: &mut Ends,
        owner: &OwnerId,
        account: &str,
        guard: LockGuard,
        claimed: Vec<(Uuid, ClaimedTerms)>,
    ) -> (Vec<(Uuid, Uuid, String)>, Option<LockGuard>) {
        let token = guard.token().get();
        if !self.may_write(&guard) {
            // The claimed members stay CLAIMED; a newer holder re-claims them.
            self.release(guard).await;
            ends.rest(Outcome::LeaseLost);
            return (Vec::new(), None);
        }
        let mut submissions = Vec::with_capacity(claimed.len());
        for (payout_id, terms) in &claimed {
            let Some(key) = write_key(*payout_id) else {
                ends.set(*payout_id, Outcome::Unavailable);
                continue;
            };
            submissions.push(SubmissionBatchItem {
                payout_id: *payout_id,
                amount_minor: terms.amount_minor,
                currency: terms.currency.clone(),
                beneficiary_ref: terms.beneficiary_ref.clone(),
                idempotency_key: key.as_str().to_owned(),
            });
        }
        let body = SubmissionBatchRequest { account_id: account.to_owned(), submissions };
        self.maybe_stall("submit", owner.as_str()).await;
        // As the single submission: the rotate goes out beside it (E-18 "Overlap"), the
        // submission carrying the claim's signed token taken before the rotate.
        let signed = guard.signed_token();
        let submission = async {
            let submit = self.hops.rail.submit_batch(signed.clone(), owner, &body);
            let answer = self.metrics.hops.time(&self.clock, Hop::Submit, submit).await;
            if dlock_rt::planted::on(dlock_rt::planted::Bug::ExecutorRetriesSubmit) {
                // Planted bug `executor-retries-submit` (simulation only), as in the single
                // path: the payouts whose outcome is unknown are submitted again, under fresh
                // idempotency keys.
                self.planted_batch_resubmit(&signed, owner, &body, &answer).await;
            }
            answer
        };
        let rotated = self.metrics.hops.time(&self.clock, Hop::Acquire, guard.rotate());
        let (answer, rotated) = tokio::join!(submission, rotated);
        let acked = match answer {
            Err(refusal) => {
                let outcome = self.refused_submission(Uuid::nil(), owner, token, &refusal);
                ends.rest(outcome);
                Vec::new()
            }
            Ok(answer) => {
                let mut acked = Vec::new();
                for s in &body.submissions {
                    let Some(item) = answer_item(&answer, account, token, s.payout_id) else {
                        ends.set(s.payout_id, Outcome::Unavailable);
                        continue;
                    };
                    match item.ok::<SubmissionAck>() {
                        Some(ack) if ack.outcome == SubmissionOutcome::Acked && ack.payout_id == s.payout_id => {
                            acked.push((s.payout_id, ack.submission_id, ack.rail_reference));
                        }
                        _ => {
                            let outcome = self.refused_submission(s.payout_id, owner, token, &item_refusal(item));
                            ends.set(s.payout_id, outcome);
                        }
                    }
                }
                acked
            }
        };
        let newer = match rotated {
            Ok(g) if acked.is_empty() => {
                self.release_in_background(g).await;
                return (acked, None);
            }
            Ok(g) => self.with_lease_for_a_write(g).await,
            Err(e) => Err(e),
        };
        match newer {
            Ok(g) => (acked, Some(g)),
            Err(e) => {
                // Paid and RAIL_ACKED: a later scan posts them.
                tracing::info!(accountId = account, cause = %e, "executor_post_deferred");
                for (payout_id, _, _) in &acked {
                    ends.set(*payout_id, Outcome::Unavailable);
                }
                (Vec::new(), None)
            }
        }
    }

    /// Planted bug `executor-retries-submit` for a batch: every payout whose answer was
    /// lost or `RAIL_AMBIGUOUS` is submitted again (simulation only, never otherwise).
    async fn planted_batch_resubmit(
        &self,
        signed: &dlock_contract::grant::SignedToken,
        owner: &OwnerId,
        body: &SubmissionBatchRequest,
        answer: &Result<BatchAnswer, RailRefusal>,
    ) {
        let unknown: Vec<SubmissionBatchItem> = body
            .submissions
            .iter()
            .filter(|s| match answer {
                Err(r) => matches!(r, RailRefusal::NoAnswer { .. }),
                Ok(a) => {
                    a.item(s.payout_id).and_then(BatchItem::envelope).map(|e| e.code) == Some(ErrorCode::RailAmbiguous)
                }
            })
            .map(|s| SubmissionBatchItem { idempotency_key: format!("{}:retry", s.idempotency_key), ..s.clone() })
            .collect();
        if !unknown.is_empty() {
            let again = SubmissionBatchRequest { account_id: body.account_id.clone(), submissions: unknown };
            let _ = self.hops.rail.submit_batch(signed.clone(), owner, &again).await;
        }
    }

    /// P3b under `newer`; with `keep`, the grant for the account's next payouts is rotated
    /// beside it and kept when every member posted.
    async fn batch_post(
        &self,
        ends: &mut Ends,
        keep: bool,
        owner: &OwnerId,
        account: &str,
        newer: LockGuard,
        acked: Vec<(Uuid, Uuid, String)>,
    ) -> Option<LockGuard> {
        let token = newer.token().get();
        let Some(key) = batch_key("posts", token) else {
            self.release_in_background(newer).await;
            ends.rest(Outcome::Unavailable);
            return None;
        };
        if !self.may_write(&newer) {
            self.release(newer).await;
            ends.rest(Outcome::LeaseLost);
            return None;
        }
        let body = PostBatchRequest {
            payouts: acked
                .iter()
                .map(|(payout_id, submission_id, rail_reference)| PostBatchItem {
                    payout_id: *payout_id,
                    rail_reference: rail_reference.clone(),
                    submission_id: *submission_id,
                    rail_outcome: SubmissionOutcome::Acked.as_str().to_owned(),
                })
                .collect(),
        };
        self.maybe_stall("post", owner.as_str()).await;
        let post = self.hops.payment.post_batch(account, newer.signed_token(), owner, &key, &body);
        let post = self.metrics.hops.time(&self.clock, Hop::Post, post);
        let (answer, next) = if keep {
            // As a chained single post: the next grant of the account is rotated beside it.
            let rotate = self.metrics.hops.time(&self.clock, Hop::Acquire, newer.rotate());
            let (answer, next) = tokio::join!(post, rotate);
            (answer, Some(next))
        } else {
            let answer = post.await;
            self.release_in_background(newer).await;
            (answer, None)
        };
        let mut all_posted = true;
        match answer {
            Err(refusal) => {
                all_posted = false;
                if refusal.code() == Some(ErrorCode::FencedOut) {
                    self.fenced("post", owner, token, refusal.details());
                    ends.rest(Outcome::Fenced);
                } else {
                    tracing::warn!(accountId = account, answer = %refusal, "executor_post_undecided");
                    ends.rest(Outcome::Unavailable);
                }
            }
            Ok(answer) => {
                for (payout_id, _, _) in &acked {
                    let outcome = match answer_item(&answer, account, token, *payout_id) {
                        Some(item) if (200..300).contains(&item.status) => Outcome::Posted,
                        Some(item) if item.envelope().map(|e| e.code) == Some(ErrorCode::PayoutNotClaimable) => {
                            Outcome::NotClaimable
                        }
                        other => {
                            tracing::warn!(payoutId = %payout_id, status = other.map(|i| i.status),
                                "executor_post_undecided");
                            Outcome::Unavailable
                        }
                    };
                    all_posted &= outcome == Outcome::Posted;
                    ends.set(*payout_id, outcome);
                }
            }
        }
        let posted = ends.outcomes.values().filter(|o| **o == Outcome::Posted).count();
        if posted >= 2 {
            dlock_rt::probe::hit(dlock_rt::probe::Probe::BatchPosted);
        }
        match next {
            Some(Ok(next)) if all_posted => Some(next),
            Some(Ok(next)) => {
                self.release_in_background(next).await;
                None
            }
            Some(Err(e)) => {
                tracing::debug!(accountId = account, cause = %e, "executor_chain_rotate_failed");
                None
            }
            None => None,
        }
    }
}

/// The item of `payout_id` in a batch answer that is for `account` under `token` (an answer
/// for anything else is no answer for this payout).
fn answer_item<'a>(answer: &'a BatchAnswer, account: &str, token: i64, payout_id: Uuid) -> Option<&'a BatchItem> {
    if answer.account_id != account || answer.presented_token != token {
        return None;
    }
    answer.item(payout_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(account: &str, state: PayoutState, n: u128) -> Candidate {
        Candidate { payout_id: Uuid::from_u128(n), account_id: account.to_owned(), state, created_at: None }
    }

    #[test]
    fn a_batch_takes_the_accounts_claimable_candidates_in_queue_order_up_to_its_bound() {
        let first = candidate("a", PayoutState::Pending, 1);
        let mut queue: VecDeque<Candidate> = [
            candidate("b", PayoutState::Pending, 2),
            candidate("a", PayoutState::RailAcked, 3),
            candidate("a", PayoutState::Claimed, 4),
            candidate("a", PayoutState::Pending, 5),
            candidate("a", PayoutState::Pending, 6),
        ]
        .into();
        let taken = take_batch(&mut queue, &first, 2);
        let ids = |cs: &[Candidate]| cs.iter().map(|c| c.payout_id.as_u128()).collect::<Vec<_>>();
        assert_eq!(ids(&taken), [4, 5]);
        assert_eq!(ids(&queue.iter().cloned().collect::<Vec<_>>()), [2, 3, 6]);
        let none = take_batch(&mut queue, &candidate("z", PayoutState::Pending, 9), 8);
        assert!(none.is_empty());
        assert_eq!(queue.len(), 3);
    }
}
