//! The async shell of the critical section (issue 36 §2): it performs a [`PayoutRun`]'s
//! commands, in the order given, through the typed clients (`dlock-lock-client`,
//! `dlock-payment-client`, `dlock-rail-client`), and hands each answer back as the next
//! [`Event`]. It decides nothing: what to send, when to stop, what an answer comes to are
//! the machine's. What it adds is what the machine must not touch: the lock guards (at most
//! one held per run), the account's mark in [`Executor::working`], the
//! clock's readings (the lease checks, the hop timings, `payout_end_to_end_seconds`), the
//! injected stalls between a lease check and its write, the planted bug
//! `executor-retries-submit`, and the trace of each run (C3-extensions E-17).
//!
//! Invariants (asserted):
//! - A command that needs a grant finds one held, and a fenced write's token is the held
//!   grant's (the machine and the shell agree on the grant).
//! - The submission and the rotate beside it go out together (`tokio::join!`, the
//!   submission polled first), and so do a keeping post and its rotate: the I/O order of
//!   the recursion this replaced (issue 14).
//! - A run ends holding a guard exactly when it keeps it for a chain.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use dlock_contract::batch::{BatchAnswer, BatchItem};
use dlock_contract::payment::{
    ClaimBatchItem, ClaimBatchRequest, ClaimRequest, PostBatchItem, PostBatchRequest, PostRequest,
};
use dlock_contract::rail::{SubmissionBatchItem, SubmissionBatchRequest, SubmissionOutcome, SubmissionRequest};
use dlock_contract::{ErrorCode, IdempotencyKey, OwnerId};
use dlock_lock_client::{AcquireOptions, LockClientError, LockGuard, Session};
use dlock_rail_client::RailRefusal;

use super::run::{
    About, Acked, Batch, ClaimItem, Command, Event, Kept, Limits, LockRefusal, Log, Member, Pass, PayoutRun, PostItem,
    Refusal, Start, SubmitItem, Terms, View, RUN_STEPS_MAX,
};
use super::{Candidate, Executor};
use crate::metrics::{Hop, Outcome, Terminal};

/// BUGGIFY fault point between a hop's lease check and its write (`dlock_rt::buggify`,
/// never firing outside the simulation): how often, and for at most how long.
const BUGGIFY_HOP_DELAY_P: f64 = 0.05;
const BUGGIFY_HOP_DELAY_MS_MAX: u64 = 2_000;

/// A posted run's grant, kept for the next run of its account in the same pass (issue 14:
/// a chain of rotated grants, `executor.chain-payouts-max`), with the account's mark in
/// [`Executor::working`] and how many payouts the chain has carried.
pub(super) struct Chain {
    pub guard: LockGuard,
    pub mark: Working,
    pub links: u32,
}

/// An account marked in [`Executor::working`], unmarked when dropped (every way a critical
/// section ends, cancellation included). Marks are counted: a background release adds one.
pub(super) struct Working {
    set: Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>,
    pub account: String,
}

impl Drop for Working {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            if let Some(n) = set.get_mut(&self.account) {
                *n -= 1;
                if *n == 0 {
                    set.remove(&self.account);
                }
            }
        }
    }
}

/// One run's inputs.
pub(super) struct RunInput<'a> {
    pub session: &'a Session,
    pub owner: &'a str,
    /// The run's payouts, all of one account: one, or a batch (E-19).
    pub members: Vec<Candidate>,
    /// The grant a posted run of the same account kept.
    pub chained: Option<Chain>,
    /// Whether the pass holds more of the account after this run (keep the post's grant).
    pub keep: bool,
}

/// How each payout ended, how the pass goes on, and the grant kept for the account's next.
pub(super) type RunEnd = (Vec<(Candidate, Outcome)>, Pass, Option<Chain>);

/// What the shell holds for a run: its one guard and the account's mark.
struct Io<'a> {
    session: &'a Session,
    owner: &'a str,
    owner_id: Option<OwnerId>,
    guard: Option<LockGuard>,
    mark: Option<Working>,
}

impl Io<'_> {
    fn guard(&self) -> &LockGuard {
        self.guard.as_ref().expect("the run holds a grant for this command")
    }

    fn take(&mut self) -> LockGuard {
        self.guard.take().expect("the run holds a grant for this command")
    }

    /// The held grant, checked to be the one the machine names.
    fn writing(&self, token: i64) -> &LockGuard {
        let g = self.guard();
        assert_eq!(g.token().get(), token, "a fenced write carries the held grant's token");
        g
    }

    fn owner(&self) -> &OwnerId {
        self.owner_id.as_ref().expect("the run writes only with a valid owner id")
    }
}

impl Executor {
    /// One critical section for `input`'s payouts, as one trace (E-17: each hop is a child
    /// span of its root): `payout_attempt` for a single payout, `payout_batch` for a batch.
    pub(super) async fn execute_run(&self, input: RunInput<'_>) -> RunEnd {
        let root = self.traces.next_root();
        let span = match input.members.as_slice() {
            [one] => root.work_span("payout_attempt", &one.payout_id.to_string()),
            more => root.work_span("payout_batch", more.first().map_or("", |c| c.account_id.as_str())),
        };
        // Boxed: the run's future (every hop, timed and traced) is large, and a debug build
        // polled on a 2 MiB thread stack (a test thread, a runtime worker) overflowed it.
        let run = Box::pin(self.drive(input));
        tracing::Instrument::instrument(root.scope(run), span).await
    }

    async fn drive(&self, input: RunInput<'_>) -> RunEnd {
        let RunInput { session, owner, members, chained, keep } = input;
        let started = self.clock.now();
        let account = members.first().map(|c| c.account_id.clone()).unwrap_or_default();
        let owner_id = OwnerId::parse(owner).ok();
        let (guard, mark, kept) = match chained {
            Some(Chain { guard, mark, links }) => {
                let kept = Kept { key: guard.key().to_owned(), token: guard.token().get(), links };
                (Some(guard), Some(mark), Some(kept))
            }
            None => (None, None, None),
        };
        let start = Start {
            account: account.clone(),
            members: members.iter().map(|c| Member { payout_id: c.payout_id, state: c.state }).collect(),
            chained: kept,
            keep,
            owner_valid: owner_id.is_some(),
        };
        for c in &members {
            assert_eq!(c.account_id, account, "a run holds its account's payouts only");
        }
        let mut run = PayoutRun::new(Limits::of(&self.cfg), start);
        let mut io = Io { session, owner, owner_id, guard, mark };
        let mut commands: VecDeque<Command> = run.step(Event::Start).into();
        for _ in 0..RUN_STEPS_MAX {
            let mut answer = None;
            while let Some(command) = commands.pop_front() {
                assert!(answer.is_none(), "an answered command is its step's last");
                if let Command::Done(end) = command {
                    assert!(commands.is_empty() && run.is_done(), "`Done` ends the run");
                    return self.ended(end, members, io, started);
                }
                // Boxed, as the hops of the recursion this replaced were: one allocation per
                // command keeps the run's future small.
                answer = Box::pin(self.perform(command, &mut io)).await;
            }
            let event = answer.expect("a step that does not end the run asks for an answer");
            commands = run.step(event).into();
        }
        panic!("a run takes at most {RUN_STEPS_MAX} steps");
    }

    /// The run's end: each payout's outcome observed when terminal
    /// (`payout_end_to_end_seconds`), and the kept grant handed to the chain.
    fn ended(
        &self,
        end: super::run::End,
        members: Vec<Candidate>,
        mut io: Io<'_>,
        started: dlock_rt::Instant,
    ) -> RunEnd {
        let mut ended = Vec::with_capacity(end.outcomes.len());
        for (payout_id, outcome) in end.outcomes {
            if let Some(c) = members.iter().find(|c| c.payout_id == payout_id) {
                self.observe_end(c, outcome, started);
                ended.push((c.clone(), outcome));
            }
        }
        let chain = match end.kept_links {
            Some(links) => {
                let guard = io.take();
                let mark = io.mark.take().expect("a kept grant's account is marked");
                Some(Chain { guard, mark, links })
            }
            None => {
                assert!(io.guard.is_none(), "a run ends holding a guard only to keep it");
                None
            }
        };
        (ended, end.pass, chain)
    }

    /// Performs one command; its answer, when it has one.
    async fn perform(&self, command: Command, io: &mut Io<'_>) -> Option<Event> {
        let event = match command {
            Command::Mark { account } => {
                io.mark = self.mark_working(&account);
                Event::Marked { free: io.mark.is_some() }
            }
            Command::Acquire { key, wait_ms } => {
                let acquired = io.session.acquire_with(&key, AcquireOptions { ttl_ms: None, wait_ms });
                Event::Granted(self.granted(io, self.metrics.hops.time(&self.clock, Hop::Acquire, acquired).await))
            }
            Command::GrantLease => {
                let remaining = io.guard().grant_remaining();
                Event::GrantLease { remaining_ms: u64::try_from(remaining.as_millis()).unwrap_or(u64::MAX) }
            }
            Command::Rotate => {
                let rotated = self.metrics.hops.time(&self.clock, Hop::Acquire, io.take().rotate()).await;
                Event::Granted(self.granted(io, rotated))
            }
            Command::CheckLease => Event::LeaseChecked { may_write: self.may_write(io.guard()) },
            Command::Read { payout_id } => {
                let read = self.metrics.hops.time(&self.clock, Hop::Reread, self.hops.payment.payout(payout_id)).await;
                Event::Read(read.ok().map(|body| View::of(&body)))
            }
            Command::Claim { payout_id, key, expected_state, token } => {
                self.maybe_stall("claim", io.owner().as_str()).await;
                let request = ClaimRequest { expected_state };
                let signed = io.writing(token).signed_token();
                let claim = self.hops.payment.claim(payout_id, signed, io.owner(), &key, &request);
                let answer = self.metrics.hops.time(&self.clock, Hop::Claim, claim).await;
                Event::Claimed(match answer {
                    Ok(ack) => Ok(ack.terms().map(Terms::from)),
                    Err(r) => Err(Refusal::of_payment(&r)),
                })
            }
            Command::ClaimBatch { account, key, members, token } => {
                self.maybe_stall("claim", io.owner().as_str()).await;
                let body = ClaimBatchRequest {
                    payouts: members
                        .iter()
                        .map(|m| ClaimBatchItem { payout_id: m.payout_id, expected_state: m.state })
                        .collect(),
                };
                let signed = io.writing(token).signed_token();
                let claim = self.hops.payment.claim_batch(&account, signed, io.owner(), &key, &body);
                let answer = self.metrics.hops.time(&self.clock, Hop::Claim, claim).await;
                Event::ClaimedBatch(match answer {
                    Ok(a) => Ok(Batch::of(&a, ClaimItem::of)),
                    Err(r) => Err(Refusal::of_payment(&r)),
                })
            }
            Command::Submit { payout_id, key, terms, token } => self.submit(io, payout_id, key, terms, token).await,
            Command::SubmitBatch { account, submissions, token } => {
                let body = SubmissionBatchRequest {
                    account_id: account,
                    submissions: submissions
                        .into_iter()
                        .map(|s| SubmissionBatchItem {
                            payout_id: s.payout_id,
                            amount_minor: s.terms.amount_minor,
                            currency: s.terms.currency,
                            beneficiary_ref: s.terms.beneficiary_ref,
                            idempotency_key: s.key.as_str().to_owned(),
                        })
                        .collect(),
                };
                self.submit_batch(io, body, token).await
            }
            Command::Post { acked, key, token, rotate } => {
                let Acked { payout_id, submission_id, rail_reference } = acked;
                let body = PostRequest {
                    rail_reference,
                    submission_id,
                    rail_outcome: SubmissionOutcome::Acked.as_str().to_owned(),
                };
                let owner = io.owner().clone();
                self.maybe_stall("post", owner.as_str()).await;
                let signed = io.writing(token).signed_token();
                let post = self.hops.payment.post(payout_id, signed, &owner, &key, &body);
                let post = self.metrics.hops.time(&self.clock, Hop::Post, post);
                // Chained (issue 14): the grant the account's next run claims with is rotated
                // beside this post, not after its answer (the post already carries this
                // grant's signed token; the rotate keeps the key in this session).
                let (answer, rotated) = self.maybe_beside_rotate(io, rotate, post).await;
                Event::Posted { answer: answer.map(|_| ()).map_err(|r| Refusal::of_payment(&r)), rotated }
            }
            Command::PostBatch { account, key, acked, token, rotate } => {
                let body = PostBatchRequest {
                    payouts: acked
                        .into_iter()
                        .map(|a| PostBatchItem {
                            payout_id: a.payout_id,
                            rail_reference: a.rail_reference,
                            submission_id: a.submission_id,
                            rail_outcome: SubmissionOutcome::Acked.as_str().to_owned(),
                        })
                        .collect(),
                };
                let owner = io.owner().clone();
                self.maybe_stall("post", owner.as_str()).await;
                let signed = io.writing(token).signed_token();
                let post = self.hops.payment.post_batch(&account, signed, &owner, &key, &body);
                let post = self.metrics.hops.time(&self.clock, Hop::Post, post);
                // As a chained single post: the next grant of the account is rotated beside it.
                let (answer, rotated) = self.maybe_beside_rotate(io, rotate, post).await;
                let answer = answer.map(|a| Batch::of(&a, PostItem::of)).map_err(|r| Refusal::of_payment(&r));
                Event::PostedBatch { answer, rotated }
            }
            Command::Release { background: false } => {
                let guard = io.take();
                self.release(guard).await;
                return None;
            }
            Command::Release { background: true } => {
                let guard = io.take();
                self.release_in_background(guard).await;
                return None;
            }
            Command::ForgetAccount { account } => {
                self.forget_account(&account).await;
                return None;
            }
            Command::Probe(probe) => {
                dlock_rt::probe::hit(probe);
                return None;
            }
            Command::Log(log) => {
                self.log(io, log);
                return None;
            }
            Command::Done(_) => unreachable!("the run's end is not performed"),
        };
        Some(event)
    }

    /// A new grant held, as the machine reads it.
    /// `call`, with the run's grant rotated beside it (`tokio::join!`, the write polled
    /// first): the write's answer and the rotated grant's token (E-18 "Overlap").
    async fn beside_rotate<T>(
        &self,
        io: &mut Io<'_>,
        call: impl std::future::Future<Output = T>,
    ) -> (T, Result<i64, LockRefusal>) {
        let rotate = self.metrics.hops.time(&self.clock, Hop::Acquire, io.take().rotate());
        let (answer, next) = tokio::join!(call, rotate);
        (answer, self.granted(io, next))
    }

    /// [`Self::beside_rotate`] when `rotate`, else `call` alone.
    async fn maybe_beside_rotate<T>(
        &self,
        io: &mut Io<'_>,
        rotate: bool,
        call: impl std::future::Future<Output = T>,
    ) -> (T, Option<Result<i64, LockRefusal>>) {
        if rotate {
            let (answer, next) = self.beside_rotate(io, call).await;
            (answer, Some(next))
        } else {
            (call.await, None)
        }
    }

    fn granted(&self, io: &mut Io<'_>, answer: Result<LockGuard, LockClientError>) -> Result<i64, LockRefusal> {
        match answer {
            Ok(g) => {
                let token = g.token().get();
                assert!(io.guard.is_none(), "a run holds one grant at a time");
                io.guard = Some(g);
                Ok(token)
            }
            Err(e) => Err(LockRefusal::of(&e)),
        }
    }

    /// R1, once, with the post's newer grant rotated beside it. The post needs a newer grant
    /// than the claim (C3-extensions C-10): one rotate (E-18) releases the claim's grant and
    /// grants a greater token to this session in one call, timed as the acquire it replaces.
    /// It goes out beside the submission (issue 14), not after it: neither needs the other's
    /// answer. The submission carries the claim's signed token, taken before the rotate ends
    /// the belief in that grant; the rotate keeps the key in this session (nobody can be
    /// granted it in between); the proxy's mark judges the submission's token, paydb's
    /// fence the post's. An unknown outcome of the rotate leaves the key refused by this
    /// session, as after an ambiguous acquire. (The guard carries its session.)
    async fn submit(
        &self,
        io: &mut Io<'_>,
        payout_id: uuid::Uuid,
        key: IdempotencyKey,
        terms: Terms,
        token: i64,
    ) -> Event {
        let body = SubmissionRequest {
            payout_id,
            account_id: terms.account_id,
            amount_minor: terms.amount_minor,
            currency: terms.currency,
            beneficiary_ref: terms.beneficiary_ref,
        };
        let owner = io.owner().clone();
        self.maybe_stall("submit", owner.as_str()).await;
        let signed = io.writing(token).signed_token();
        let submission = async {
            let submit = self.hops.rail.submit(signed.clone(), &owner, &key, &body);
            let mut answer = self.metrics.hops.time(&self.clock, Hop::Submit, submit).await;
            if dlock_rt::planted::on(dlock_rt::planted::Bug::ExecutorRetriesSubmit) {
                // Planted bug `executor-retries-submit` (simulation only): after a rail
                // timeout or a lost answer the executor submits again, under a fresh
                // idempotency key.
                let unknown = matches!(&answer, Err(r) if r.code() == Some(ErrorCode::RailAmbiguous)
                    || matches!(r, RailRefusal::NoAnswer { .. }));
                if let (true, Ok(retry_key)) = (unknown, IdempotencyKey::parse(&format!("payout:{payout_id}:retry"))) {
                    answer = self.hops.rail.submit(signed.clone(), &owner, &retry_key, &body).await;
                }
            }
            answer
        };
        let (answer, rotated) = self.beside_rotate(io, submission).await;
        let answer = match answer {
            Ok(ack) => Ok(Acked { payout_id, submission_id: ack.submission_id, rail_reference: ack.rail_reference }),
            Err(r) => Err(Refusal::of_rail(&r)),
        };
        Event::Submitted { answer, rotated }
    }

    /// R1b, once, with the post's newer grant rotated beside it (E-18 "Overlap"), as the
    /// single submission.
    async fn submit_batch(&self, io: &mut Io<'_>, body: SubmissionBatchRequest, token: i64) -> Event {
        let owner = io.owner().clone();
        self.maybe_stall("submit", owner.as_str()).await;
        let signed = io.writing(token).signed_token();
        let submission = async {
            let submit = self.hops.rail.submit_batch(signed.clone(), &owner, &body);
            let answer = self.metrics.hops.time(&self.clock, Hop::Submit, submit).await;
            if dlock_rt::planted::on(dlock_rt::planted::Bug::ExecutorRetriesSubmit) {
                // Planted bug `executor-retries-submit` (simulation only), as in the single
                // path: the payouts whose outcome is unknown are submitted again, under fresh
                // idempotency keys.
                self.planted_batch_resubmit(&signed, &owner, &body, &answer).await;
            }
            answer
        };
        let (answer, rotated) = self.beside_rotate(io, submission).await;
        let answer = answer.map(|a| Batch::of(&a, SubmitItem::of)).map_err(|r| Refusal::of_rail(&r));
        Event::SubmittedBatch { answer, rotated }
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

    /// Observes `c`'s time from creation to `outcome` when it is terminal
    /// (`payout_end_to_end_seconds`; from `started` when the scan gave no creation instant).
    fn observe_end(&self, c: &Candidate, outcome: Outcome, started: dlock_rt::Instant) {
        let Some(terminal) = Terminal::of(outcome) else { return };
        let took = match c.created_at {
            Some(created) => {
                let ms = (self.clock.wall() - created).num_milliseconds().max(0);
                Duration::from_millis(u64::try_from(ms).unwrap_or(0))
            }
            None => self.clock.now() - started,
        };
        self.metrics.end_to_end.observe(terminal, took);
    }

    /// Marks `account` as worked by the calling task; `None` when a sibling already works it.
    fn mark_working(&self, account: &str) -> Option<Working> {
        let mut set = self.working.lock().ok()?;
        if set.contains_key(account) {
            return None;
        }
        set.insert(account.to_owned(), 1);
        Some(Working { set: self.working.clone(), account: account.to_owned() })
    }

    /// One more mark on `account`, held by a background release (the account may be
    /// marked already: marks are counted).
    fn pin_working(&self, account: &str) -> Option<Working> {
        let mut set = self.working.lock().ok()?;
        *set.entry(account.to_owned()).or_insert(0) += 1;
        Some(Working { set: self.working.clone(), account: account.to_owned() })
    }

    /// Releases `guard` (L6), timed as the `release` hop; its answer changes nothing here.
    async fn release(&self, guard: LockGuard) {
        let _ = self.metrics.hops.time(&self.clock, Hop::Release, guard.release()).await;
    }

    /// Cut 5: the final release, sent from a spawned task while the caller goes on; the
    /// account stays marked until it answers, and the `release` hop is timed there. Awaited
    /// in line when [`super::RELEASES_IN_FLIGHT_PER_TASK_MAX`] per task are already in flight.
    pub(super) async fn release_in_background(&self, guard: LockGuard) {
        let Ok(slot) = self.release_slots.clone().try_acquire_owned() else {
            return self.release(guard).await;
        };
        let account = guard.key().strip_prefix("payout:").unwrap_or(guard.key()).to_owned();
        let pin = self.pin_working(&account);
        let (metrics, clock) = (self.metrics.clone(), self.clock);
        let _detached = dlock_rt::spawn(async move {
            let _ = metrics.hops.time(&clock, Hop::Release, guard.release()).await;
            drop(pin);
            drop(slot);
        });
    }

    /// Whether a fenced write may be sent under `guard`: its local deadline has not passed.
    /// The executor-lease-check layer of defence in depth decides here, and only here
    /// (`dlock_rt::defence`; only a simulation campaign can switch it off).
    fn may_write(&self, guard: &LockGuard) -> bool {
        !self.cfg.fencing_enabled
            || !dlock_rt::defence::stops(dlock_rt::defence::Layer::ExecutorLeaseCheck, !guard.is_held())
    }

    /// The injected stall (`executor.chaos.*`): between the lease check and the write.
    async fn maybe_stall(&self, hop: &str, owner: &str) {
        // BUGGIFY (simulation only): a short stall between the lease check and the write.
        dlock_rt::buggify::delay(BUGGIFY_HOP_DELAY_P, BUGGIFY_HOP_DELAY_MS_MAX).await;
        if self.cfg.pause_rate <= 0.0 || self.cfg.pause_ms == 0 || !self.cfg.pause_hops.contains(hop) {
            return;
        }
        let draw = dlock_rt::rand::random_u64() as f64 / u64::MAX as f64;
        if draw < self.cfg.pause_rate {
            tracing::warn!(hop, ownerId = owner, pauseMs = self.cfg.pause_ms, "executor_injected_stall");
            dlock_rt::sleep(Duration::from_millis(self.cfg.pause_ms)).await;
        }
    }

    /// The one `tracing` event of each [`Log`] record.
    fn log(&self, io: &Io<'_>, log: Log) {
        match log {
            Log::SessionReset { key, cause } => tracing::warn!(key, cause = %cause, "executor_session_reset"),
            Log::AccountBusy { key, cause } => tracing::debug!(key, cause = %cause, "executor_account_busy"),
            Log::OwnerInvalid => tracing::error!(ownerId = io.owner, "executor_owner_invalid"),
            Log::FencedOut { hop, token, fence } => tracing::error!(
                hop = hop.tag(),
                ownerId = io.owner().as_str(),
                presentedToken = token,
                highestToken = fence.as_ref().map(|f| f.highest_token),
                resource = fence.as_ref().map_or("", |f| f.resource_type.as_str()),
                resourceId = fence.as_ref().map_or("", |f| f.resource_id.as_str()),
                payoutId = %fence.as_ref().and_then(|f| f.payout_id).map(|p| p.to_string()).unwrap_or_default(),
                "executor_fenced_out"
            ),
            Log::ClaimUndecided { about: About::Payout(p), answer } => {
                tracing::warn!(payoutId = %p, answer = %answer, "executor_claim_undecided")
            }
            Log::ClaimUndecided { about: About::Account(a), answer } => {
                tracing::warn!(accountId = a.as_str(), answer = %answer, "executor_claim_undecided")
            }
            Log::ClaimItemUndecided { payout_id, status } => {
                tracing::warn!(payoutId = %payout_id, status, "executor_claim_undecided")
            }
            Log::DuplicateSubmission { payout_id, token } => tracing::error!(payoutId = %payout_id,
                ownerId = io.owner().as_str(), presentedToken = token, "executor_duplicate_submission"),
            Log::RailAmbiguous { payout_id, submission_id, token } => tracing::warn!(
                payoutId = %payout_id,
                submissionId = %submission_id,
                presentedToken = token,
                ownerId = io.owner().as_str(),
                outcome = "timeout",
                "rail_ambiguous"
            ),
            Log::SubmissionAnswerLost { payout_id, cause } => {
                tracing::warn!(payoutId = %payout_id, cause, "executor_submission_answer_lost")
            }
            Log::SubmissionUndecided { payout_id, answer } => {
                tracing::warn!(payoutId = %payout_id, answer = %answer, "executor_submission_undecided")
            }
            Log::PostDeferred { about: About::Payout(p), cause } => {
                tracing::info!(payoutId = %p, cause = %cause, "executor_post_deferred")
            }
            Log::PostDeferred { about: About::Account(a), cause } => {
                tracing::info!(accountId = a.as_str(), cause = %cause, "executor_post_deferred")
            }
            Log::PostUndecided { about: About::Payout(p), answer } => {
                tracing::warn!(payoutId = %p, answer = %answer, "executor_post_undecided")
            }
            Log::PostUndecided { about: About::Account(a), answer } => {
                tracing::warn!(accountId = a.as_str(), answer = %answer, "executor_post_undecided")
            }
            Log::PostItemUndecided { payout_id, status } => {
                tracing::warn!(payoutId = %payout_id, status, "executor_post_undecided")
            }
            Log::ChainRotateFailed { about: About::Payout(p), cause } => {
                tracing::debug!(payoutId = %p, cause = %cause, "executor_chain_rotate_failed")
            }
            Log::ChainRotateFailed { about: About::Account(a), cause } => {
                tracing::debug!(accountId = a.as_str(), cause = %cause, "executor_chain_rotate_failed")
            }
        }
    }
}
