//! The executor's loop and its one critical section per payout.
//!
//! For each payout found by a scan (RAIL_ACKED first, to finish what was paid; then
//! CLAIMED, whose holder may have gone; then PENDING; the tasks of one executor share a scan
//! younger than the poll interval, less the payouts they have worked since, and a pass
//! skips a candidate of its copy that the shared scan no longer lists in the same state):
//!
//! 1. acquire `payout:{accountId}` through the lock client: one attempt, queued at the lock
//!    server for at most `executor.lock-wait-ms` (default 0: no wait). A contended account
//!    is skipped and revisited on a later scan; an account a sibling task of this executor
//!    works, or one found busy earlier in the same pass, is skipped without asking the lock
//!    server;
//! 2. re-read the payout before acting (FR-14). For a PENDING or CLAIMED candidate the
//!    fenced claim is the re-read: it is sent with `expectedState` from the scan and answers
//!    `PAYOUT_NOT_CLAIMABLE` with the current state when the scan was stale (then, for
//!    RAIL_ACKED, the payout is read, P4, and posted; any other state ends the attempt as
//!    not claimable, and a CLAIMED payout is re-claimed from a later scan: never a second
//!    claim under one grant and key); its
//!    answer carries the payout's terms for the submission (C3-extensions C-30), and a
//!    replayed answer without them falls back to a P4 read. A RAIL_ACKED candidate is read
//!    (P4) for its acknowledged attempt. The read is only a hint: the fenced write decides;
//! 3. claim (P2) with the grant's token (PENDING, or CLAIMED for recovery);
//! 4. submit once to the rail-proxy with the same token. Never retried, whatever happens;
//! 5. release, acquire a newer grant, and post (P3) with it: each grant passes each fence
//!    once (C3-extensions C-10, C-12). The release and acquire are one rotate (E-18), sent
//!    beside step 4's submission rather than after its answer (issue 14): the submission
//!    already carries the claim's signed token, the rotate keeps the key in this session,
//!    and each fence judges only the token it is shown. A submission slow enough to leave
//!    the rotated grant less lease of its own than one post hop (or half a lease) gets one
//!    more rotate (`Executor::with_lease_for_a_write`; its session's deadline, which a
//!    rotate does not move, is left to the heartbeats and the write's own check);
//! 6. release, from a spawned task (issue 14 cut 5): the task goes on to its next candidate
//!    while the DELETE is in flight. No fenced write follows a release, so no check moves;
//!    the account stays marked as worked by this executor until the release has answered
//!    (a sibling does not ask for it meanwhile). At most [`RELEASES_IN_FLIGHT_PER_TASK_MAX`]
//!    per task are in flight (past that the release is awaited in line), and shutdown
//!    waits up to [`RELEASE_DRAIN_MS_MAX`] for them. The `release` hop is still timed.
//!
//! **Chains** (issue 14): when the pass still holds another candidate of the account just
//! posted, the task keeps the post's grant instead of releasing it, and works that
//! candidate next ([`next_candidate`]) with one rotate (C3-extensions E-18) of the post's
//! grant in place of step 6's release and the next step 1's acquire: one call and one
//! lock-server commit fewer per payout, and the account never free in between. The rotate
//! goes out beside the post (it needs nothing from the post's answer), and its grant is
//! kept only when the post posted (else released); a kept grant with less than a write
//! hop's lease left (or half a lease) is rotated once more before the claim. Every
//! payout still claims under a grant of its own and posts under a newer one (C-10, C-12:
//! each grant passes each fence once), each token greater than the last. Only a posted
//! payout keeps its grant; a chain carries at most `executor.chain-payouts-max` payouts,
//! then its account is released so a lock-server waiter (a rotate skips the queue) and
//! the task's other accounts get their turn. A chained rotate that fails ends the chain
//! (the next payout of the account acquires; after an unknown outcome the session refuses
//! the key and that acquire resets the session), and a chain whose account has no
//! candidate left, or whose task stops, is released in the background as in step 6. Invariant (asserted): a kept grant is only
//! ever rotated into a payout of its own account.
//!
//! **Batches** (issue 14, C3-extensions E-19): a pass holding more than one PENDING or
//! CLAIMED candidate of an account works up to `executor.payouts-per-grant-max` of them
//! together under one grant ([`batch`]): one claim (P2b) and one submission (R1b) under
//! it, one post (P3b) under the rotated grant, each fence passed once for all of them, each
//! payout's answer handled as its single write's. Batches chain like single payouts.
//!
//! **Account affinity** (issue 14 cut 6): with `executor.affinity-count` n > 1, the executor
//! with `executor.affinity-index` i prefers the accounts whose [`affinity_of`] is i: a pass
//! tries only those (and the accounts of others that have shown no progress for
//! `executor.affinity-steal-after-ms`, [`stalled_accounts`]), and every candidate only when
//! the scan holds none of its own. Progress is what this executor's own scans saw: another
//! executor's account is stalled when the payout at its head (its oldest candidate) has
//! stayed the same payout for the bound ([`next_heads`]). A backlog older than the bound
//! whose owner is working it is therefore left to its owner (one account's payouts go one
//! at a time under its one lock key, so a second executor could only be refused), while a
//! dead or stuck owner's accounts are taken once the bound has passed with no payout of
//! theirs settled. The heads are kept for the accounts of the last scan only (at most its
//! [`SCAN_STATES`] x `executor.batch-max` candidates). An acquire refused because another
//! executor holds the account drops that account's candidates from the shared scan until
//! the next scan. All of it only narrows what is tried; the lock server stays the only
//! authority, and a dead executor's accounts are taken by the others once their own runs
//! are dry or its accounts have stalled for the bound (liveness).
//!
//! Before each fenced write the local lease deadline is checked; once it has passed, the
//! executor does not write (FR-11). `FENCED_OUT` anywhere aborts the critical section: no
//! retry, no re-acquire-and-continue; it is logged (`executor_fenced_out`, error) and
//! counted. `RAIL_AMBIGUOUS` emits `rail_ambiguous`, releases and stops: that payout is never
//! submitted again (C3 §3.7).
//!
//! Every hop (acquire, the re-read, claim, submit, post, release) is timed on the executor's
//! clock into `payout_hop_seconds{hop}`, answered or not, and a payout that ends POSTED or
//! FAILED here is observed in `payout_end_to_end_seconds{outcome}` ([`crate::metrics`]).
//! Timing never changes what a hop does.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use dlock_contract::payment::{ClaimRequest, ClaimedTerms, PayoutBody, PostRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{SubmissionOutcome, SubmissionRequest};
use dlock_contract::{ErrorCode, IdempotencyKey, OwnerId};
use dlock_lock_client::{AcquireOptions, LockClient, LockClientConfig, LockClientError, LockGuard, Session};
use dlock_payment_client::ListQuery;
use dlock_rail_client::RailRefusal;
use dlock_rt::Clock;
use serde_json::Value;
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::ExecutorConfig;
use crate::hops::Hops;
use crate::metrics::{ExecutorMetrics, Hop, Outcome, Terminal};

mod batch;
pub use batch::{batchable, take_batch};

/// BUGGIFY fault point between a hop's lease check and its write (`dlock_rt::buggify`,
/// never firing outside the simulation): how often, and for at most how long.
const BUGGIFY_HOP_DELAY_P: f64 = 0.05;
const BUGGIFY_HOP_DELAY_MS_MAX: u64 = 2_000;

/// A payout a scan found, as P1 lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub payout_id: Uuid,
    pub account_id: String,
    pub state: PayoutState,
    pub created_at: Option<chrono::DateTime<chrono::Utc>>,
}

/// Longest pause between two attempts to open a lock session while the lock server is down.
pub const SESSION_RETRY_MS_MAX: u64 = 5_000;

/// The states a scan reads, in the order they are worked.
pub const SCAN_STATES: [PayoutState; 3] = [PayoutState::RailAcked, PayoutState::Claimed, PayoutState::Pending];

/// Final releases (after the post answered) one task may have in flight in the background;
/// past that the next is awaited in line.
pub const RELEASES_IN_FLIGHT_PER_TASK_MAX: usize = 2;
/// Longest shutdown waits for the background releases still in flight (the lock client's
/// release connect + read budget, 500 ms + 2 s, plus margin); past it the grants expire on
/// the server.
pub const RELEASE_DRAIN_MS_MAX: u64 = 3_000;

/// The account's place among `count` executors (issue 14 cut 6): a stable 64-bit FNV-1a
/// hash of its id, mod `count`. The same in every process and version (no seeded hasher).
pub fn affinity_of(account_id: &str, count: u32) -> u32 {
    const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;
    let hash = account_id.bytes().fold(FNV_OFFSET, |h, b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME));
    (hash % u64::from(count.max(1))) as u32
}

/// Another executor's account as this executor's scans have seen it (cut 6): the payout at
/// its head (its oldest candidate by creation, then id) and since when that same payout
/// has been its head.
#[derive(Debug, Clone, Copy)]
pub struct Head {
    pub payout_id: Uuid,
    pub since: dlock_rt::Instant,
}

/// The heads after a scan taken at `now` (pure, cut 6): for each account of `scan` that
/// `foreign` names (another executor's), its head, with `since` kept from `prev` when the
/// head is the same payout as before and `now` when it changed (a payout of the account
/// settled or left the scan: its owner made progress) or the account is new. Accounts
/// absent from `scan` are dropped, so the map holds no more accounts than the scan.
pub fn next_heads(
    prev: &BTreeMap<String, Head>,
    scan: &[Candidate],
    foreign: impl Fn(&str) -> bool,
    now: dlock_rt::Instant,
) -> BTreeMap<String, Head> {
    let mut oldest: BTreeMap<&str, &Candidate> = BTreeMap::new();
    for c in scan.iter().filter(|c| foreign(&c.account_id)) {
        let head = oldest.entry(&c.account_id).or_insert(c);
        if (c.created_at, c.payout_id) < (head.created_at, head.payout_id) {
            *head = c;
        }
    }
    oldest
        .into_iter()
        .map(|(account, c)| {
            let since = match prev.get(account) {
                Some(h) if h.payout_id == c.payout_id => h.since,
                _ => now,
            };
            (account.to_owned(), Head { payout_id: c.payout_id, since })
        })
        .collect()
}

/// The accounts of `heads` whose head has not moved for `steal_after` at `now` (pure,
/// cut 6): no payout of theirs settled in that long, as far as this executor has seen.
pub fn stalled_accounts(
    heads: &BTreeMap<String, Head>,
    now: dlock_rt::Instant,
    steal_after: Duration,
) -> BTreeSet<String> {
    heads
        .iter()
        .filter(|(_, h)| now.saturating_duration_since(h.since) >= steal_after)
        .map(|(account, _)| account.clone())
        .collect()
}

/// The worker. Cheap to share; each task keeps its own lock session.
#[derive(Debug)]
pub struct Executor {
    pub cfg: ExecutorConfig,
    pub metrics: Arc<ExecutorMetrics>,
    hops: Hops,
    clock: Clock,
    /// Accounts one of this executor's tasks is working on (acquiring or holding). A sibling
    /// skips them without asking the lock server: only ever "do less", the lock server stays
    /// the only authority (at most [`ExecutorConfig::concurrency`] entries).
    /// Counted: a background release keeps its account marked until it has answered.
    working: Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>,
    /// Slots for background final releases ([`RELEASES_IN_FLIGHT_PER_TASK_MAX`] per task);
    /// shutdown takes them all back to drain.
    release_slots: Arc<tokio::sync::Semaphore>,
    /// The last scan of the work queue and when it was taken: a task that finds it younger
    /// than `executor.poll-interval-ms` works from it instead of scanning again (an idle
    /// task would have slept that long anyway); a payout a task has worked leaves it.
    /// An async lock held across a scan, so tasks that wake together wait for one scan
    /// instead of each taking its own.
    last_scan: tokio::sync::Mutex<Option<(dlock_rt::Instant, Vec<Candidate>)>>,
    /// Cut 6: the heads of other executors' accounts in the last fresh scan ([`next_heads`]),
    /// from which a pass reads which of them have stalled.
    heads: std::sync::Mutex<BTreeMap<String, Head>>,
    /// One trace per payout attempt (C3-extensions E-17), its id derived without a draw.
    traces: dlock_rt::trace::TraceSeed,
}

/// How one candidate ended for the task that tried it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Worked (or found nothing to do): go on with the next candidate.
    Done,
    /// Its account is busy (a sibling task works it, or the lock server refused the grant):
    /// the pass skips the account's other candidates.
    Busy,
    /// The session must be replaced (an acquire whose answer was lost).
    Reset,
}

/// A posted payout's grant, kept for the next payout of its account in the same pass
/// (issue 14: a chain of rotated grants, `executor.chain-payouts-max`), with the account's
/// mark in [`Executor::working`] and how many payouts the chain has carried.
struct Chain {
    guard: LockGuard,
    mark: Working,
    links: u32,
}

/// One critical section's inputs.
struct Attempt<'a> {
    session: &'a Session,
    owner: &'a str,
    c: &'a Candidate,
    /// The grant a posted payout of the same account kept: the attempt's first act is then
    /// a rotate of it, not an acquire.
    chained: Option<Chain>,
    /// Whether this payout's post may keep its grant for a next payout of the account.
    keep: bool,
}

/// Whether an attempt's post may keep its grant (`wanted`), and the grant it kept.
struct Keep {
    wanted: bool,
    kept: Option<LockGuard>,
}

/// The next candidate of a pass (pure): while a chain holds `chained`, the first of that
/// account's candidates left in `queue` (the one the chain was kept for); else, and when
/// none is left, the front.
pub fn next_candidate(queue: &mut VecDeque<Candidate>, chained: Option<&str>) -> Option<Candidate> {
    let at = chained.and_then(|a| queue.iter().position(|c| c.account_id == a)).unwrap_or(0);
    queue.remove(at)
}

/// Whether a payout of `account` may keep its post's grant for the next one (pure): the
/// pass still holds another candidate of the account.
pub fn chain_has_next(queue: &VecDeque<Candidate>, account: &str) -> bool {
    queue.iter().any(|c| c.account_id == account)
}

/// An account marked in [`Executor::working`], unmarked when dropped (every way a critical
/// section ends, cancellation included). Marks are counted: a background release adds one.
struct Working {
    set: Arc<std::sync::Mutex<std::collections::BTreeMap<String, usize>>>,
    account: String,
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

/// The payout's stable idempotency key, carried by each of its fenced writes with the
/// grant's token and the worker's owner id (C3 §3.1: derived from the payout, never
/// regenerated).
pub fn write_key(payout_id: Uuid) -> Option<IdempotencyKey> {
    IdempotencyKey::parse(&format!("payout:{payout_id}")).ok()
}

impl Executor {
    pub fn new(cfg: ExecutorConfig, clock: Clock) -> Result<Arc<Executor>, String> {
        cfg.validate()?;
        let hops = Hops::new(&cfg)?;
        let traces = dlock_rt::trace::TraceSeed::new(&[
            dlock_rt::trace::hash_str(cfg.owner_id.as_str()),
            clock.wall().timestamp_millis() as u64,
        ]);
        let release_slots = Arc::new(tokio::sync::Semaphore::new(cfg.concurrency * RELEASES_IN_FLIGHT_PER_TASK_MAX));
        Ok(Arc::new(Executor {
            traces,
            cfg,
            metrics: Arc::new(ExecutorMetrics::default()),
            hops,
            clock,
            release_slots,
            working: Arc::new(std::sync::Mutex::new(std::collections::BTreeMap::new())),
            last_scan: tokio::sync::Mutex::new(None),
            heads: std::sync::Mutex::new(BTreeMap::new()),
        }))
    }

    /// Runs `concurrency` tasks until `stop` turns true; each finishes its current payout
    /// first, then closes its lock session.
    pub async fn run(self: Arc<Self>, stop: watch::Receiver<bool>) {
        let mut tasks = Vec::new();
        for index in 0..self.cfg.concurrency {
            tasks.push(dlock_rt::spawn(self.clone().task(index, stop.clone())));
        }
        for t in tasks {
            let _ = t.await;
        }
        self.drain_releases().await;
    }

    /// Waits, up to [`RELEASE_DRAIN_MS_MAX`], until no background release is in flight.
    /// `true` when none is left.
    pub async fn drain_releases(&self) -> bool {
        let all = u32::try_from(self.cfg.concurrency * RELEASES_IN_FLIGHT_PER_TASK_MAX).unwrap_or(u32::MAX);
        let drained =
            dlock_rt::timeout(Duration::from_millis(RELEASE_DRAIN_MS_MAX), self.release_slots.acquire_many(all));
        match drained.await {
            Some(Ok(_permits)) => true,
            _ => {
                tracing::warn!(boundMs = RELEASE_DRAIN_MS_MAX, "executor_releases_not_drained");
                false
            }
        }
    }

    /// Background final releases in flight now.
    pub fn releases_in_flight(&self) -> usize {
        self.cfg.concurrency * RELEASES_IN_FLIGHT_PER_TASK_MAX - self.release_slots.available_permits()
    }

    /// The lock client of task `index`: owner `{owner}/{index}` (FR-30), one acquire attempt
    /// (a contended account is skipped after at most `executor.lock-wait-ms` in the server's
    /// queue; see [`Executor::acquire`]).
    pub fn lock_client(&self, index: usize) -> Result<LockClient, String> {
        let owner = format!("{}/{index}", self.cfg.owner_id.as_str());
        let owner = OwnerId::parse(&owner).map_err(|e| format!("executor.owner-id: {e}"))?;
        let mut cfg = LockClientConfig::new(self.cfg.lock_url.clone(), owner);
        cfg.lock_ttl_ms = self.cfg.lock_ttl_ms;
        cfg.session_ttl_ms = self.cfg.lock_ttl_ms;
        cfg.acquire_attempts_max = 1;
        cfg.bearer = self.cfg.bearer.clone();
        LockClient::new(cfg).map_err(|e| e.to_string())
    }

    async fn task(self: Arc<Self>, index: usize, mut stop: watch::Receiver<bool>) {
        let client = match self.lock_client(index) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(cause = %e, "executor_task_not_started");
                return;
            }
        };
        let owner = client.config().owner_id.as_str().to_owned();
        let mut rng = dlock_rt::rand::from_runtime();
        let mut session: Option<Session> = None;
        let idle = Duration::from_millis(self.cfg.poll_interval_ms);
        // After a failed session open, the next try waits twice as long, up to a bound; the
        // failure is logged once per outage.
        let mut backoff_ms = self.cfg.poll_interval_ms;
        while !*stop.borrow() {
            if !session.as_ref().is_some_and(Session::is_alive) {
                session = match client.open_session().await {
                    Ok(s) => {
                        if backoff_ms > self.cfg.poll_interval_ms {
                            tracing::info!(ownerId = %owner, "executor_session_reopened");
                        }
                        backoff_ms = self.cfg.poll_interval_ms;
                        Some(s)
                    }
                    Err(e) => {
                        if backoff_ms == self.cfg.poll_interval_ms {
                            tracing::warn!(ownerId = %owner, cause = %e, "executor_session_not_opened");
                        }
                        tokio::select! {
                            () = dlock_rt::sleep(Duration::from_millis(backoff_ms)) => {}
                            _ = stop.changed() => {}
                        }
                        backoff_ms = (backoff_ms * 2).min(SESSION_RETRY_MS_MAX);
                        continue;
                    }
                };
            }
            let mut worked = false;
            let mut reset = false;
            if let Some(s) = &session {
                let mut candidates = self.shared_scan().await;
                shuffle_within_states(&mut candidates, &mut rng);
                let mut queue: VecDeque<Candidate> = self.prefer_own(candidates).into();
                // Accounts found busy in this pass: their other candidates wait for a later
                // scan instead of asking the lock server again.
                let mut busy = std::collections::BTreeSet::new();
                // A posted payout's grant, kept for the next payout of its account.
                let mut chain: Option<Chain> = None;
                while let Some(c) = next_candidate(&mut queue, chain.as_ref().map(|ch| ch.mark.account.as_str())) {
                    // A candidate the shared scan no longer lists in its state was worked by a
                    // sibling since this pass copied it (or left the queue, or its account is
                    // held elsewhere): asking for its account would buy a refused claim.
                    if !self.still_listed(&c) {
                        continue;
                    }
                    let carried = match chain.take() {
                        Some(ch) if ch.mark.account == c.account_id => Some(ch),
                        Some(ch) => {
                            self.release_in_background(ch.guard).await;
                            None
                        }
                        None => None,
                    };
                    if *stop.borrow() || !s.is_alive() {
                        if let Some(ch) = carried {
                            self.release_in_background(ch.guard).await;
                        }
                        break;
                    }
                    if carried.is_none() && busy.contains(&c.account_id) {
                        continue;
                    }
                    // E-19: the account's other claimable candidates of this pass go with it,
                    // under one grant, up to `executor.payouts-per-grant-max`.
                    let per_grant = usize::try_from(self.cfg.payouts_per_grant_max).unwrap_or(1);
                    let mut members = vec![c.clone()];
                    if per_grant > 1 && batchable(&c) {
                        members.extend(
                            take_batch(&mut queue, &c, per_grant - 1).into_iter().filter(|m| self.still_listed(m)),
                        );
                    }
                    let more = chain_has_next(&queue, &c.account_id);
                    let (ended, step, kept) = if members.len() > 1 {
                        let account = &c.account_id;
                        let attempt = batch::BatchAttempt {
                            session: s,
                            owner: &owner,
                            account,
                            members,
                            chained: carried,
                            keep: more,
                        };
                        self.execute_batch_step(attempt).await
                    } else {
                        let attempt = Attempt { session: s, owner: &owner, c: &c, chained: carried, keep: more };
                        let (outcome, step, kept) = self.execute_step(attempt).await;
                        (outcome.map(|o| (c.clone(), o)).into_iter().collect(), step, kept)
                    };
                    chain = kept;
                    for (m, outcome) in ended {
                        worked = true;
                        self.forget_scanned(m.payout_id).await;
                        self.metrics.count(outcome);
                        tracing::info!(payoutId = %m.payout_id, accountId = %m.account_id, outcome = outcome.tag(),
                            ownerId = %owner, "payout_executed");
                    }
                    match step {
                        Step::Reset => {
                            reset = true;
                            break;
                        }
                        Step::Busy => {
                            busy.insert(c.account_id.clone());
                        }
                        Step::Done => {}
                    }
                }
                if let Some(ch) = chain.take() {
                    self.release_in_background(ch.guard).await;
                }
            }
            if reset {
                if let Some(s) = session.take() {
                    let _ = s.close().await;
                }
                continue;
            }
            if !worked {
                tokio::select! {
                    () = dlock_rt::sleep(idle) => {}
                    _ = stop.changed() => {}
                }
            }
        }
        if let Some(s) = session {
            let _ = s.close().await;
        }
    }

    /// The work queue as this executor last saw it (less the payouts its tasks have worked
    /// since), if a task scanned it less than `executor.poll-interval-ms` ago; else a fresh
    /// [`Executor::scan`], kept for the siblings. One scan per executor per poll interval
    /// instead of one per task: the queue is advisory (every candidate is re-read under
    /// its lock), so a sibling's scan is as good as one's own.
    async fn shared_scan(&self) -> Vec<Candidate> {
        let fresh_for = Duration::from_millis(self.cfg.poll_interval_ms);
        let mut last = self.last_scan.lock().await;
        if let Some((at, found)) = last.as_ref() {
            if self.clock.now().saturating_duration_since(*at) < fresh_for {
                return found.clone();
            }
        }
        let taken = self.clock.now();
        let found = self.scan().await;
        self.note_heads(&found, taken);
        *last = Some((taken, found.clone()));
        found
    }

    /// Cut 6: records the heads of other executors' accounts in a fresh scan taken at `at`
    /// ([`next_heads`]). Nothing to record with `executor.affinity-count` 1. A scan that
    /// could not read one of its states (paydb unavailable) drops the heads seen only in that
    /// state, so after an outage of the store a stalled account is stolen one bound after the
    /// scans read it again: later, never sooner.
    pub fn note_heads(&self, scan: &[Candidate], at: dlock_rt::Instant) {
        let (count, index) = (self.cfg.affinity_count, self.cfg.affinity_index);
        if count <= 1 {
            return;
        }
        if let Ok(mut heads) = self.heads.lock() {
            let next = next_heads(&heads, scan, |account| affinity_of(account, count) != index, at);
            *heads = next;
        }
    }

    /// Cut 6: the candidates this executor tries in a pass. With `executor.affinity-count`
    /// 1 all of them; else its own accounts' ([`affinity_of`] = its index) and those of the
    /// other executors' accounts that have stalled for `executor.affinity-steal-after-ms`
    /// ([`stalled_accounts`] of the heads [`Executor::note_heads`] recorded), in scan order;
    /// and all of them when the scan holds none of those (its own run is dry). Never adds
    /// a candidate.
    pub fn prefer_own(&self, candidates: Vec<Candidate>) -> Vec<Candidate> {
        self.prefer_own_at(candidates, self.clock.now())
    }

    /// [`Executor::prefer_own`] as of `now` on this executor's clock.
    pub fn prefer_own_at(&self, candidates: Vec<Candidate>, now: dlock_rt::Instant) -> Vec<Candidate> {
        let (count, index) = (self.cfg.affinity_count, self.cfg.affinity_index);
        if count <= 1 {
            return candidates;
        }
        let steal_after = Duration::from_millis(self.cfg.affinity_steal_after_ms);
        let stalled = match self.heads.lock() {
            Ok(heads) => stalled_accounts(&heads, now, steal_after),
            Err(_) => BTreeSet::new(),
        };
        let (own, others): (Vec<Candidate>, Vec<Candidate>) = candidates
            .into_iter()
            .partition(|c| affinity_of(&c.account_id, count) == index || stalled.contains(&c.account_id));
        if own.is_empty() {
            return others;
        }
        own
    }

    /// Cut 6: another executor was just seen holding `account` (a refused acquire): its
    /// candidates leave the shared scan, so no sibling asks for it again before the next scan.
    async fn forget_account(&self, account: &str) {
        if let Some((_, found)) = self.last_scan.lock().await.as_mut() {
            found.retain(|c| c.account_id != account);
        }
    }

    /// Whether the shared scan (the newest, less what this executor's tasks have worked
    /// since and the accounts found held elsewhere) still lists `c` in the state its pass
    /// found it in. A pass works a copy of the scan, so a payout a sibling settled while
    /// the pass went on is still in that copy; trying it would cost a grant and a claim
    /// answered `PAYOUT_NOT_CLAIMABLE` (5-11 % of the attempts on the end-to-end bench,
    /// docs/performance.md "Around the payouts"). Advisory like the scan itself: a payout
    /// skipped here is found again by a later scan, and every payout tried is still re-read
    /// under its lock. Never waits: while a sibling holds the shared scan (it is scanning),
    /// the candidate is tried as before (a pass waiting out a scan per candidate was
    /// measured slower).
    fn still_listed(&self, c: &Candidate) -> bool {
        match self.last_scan.try_lock() {
            Ok(last) => match last.as_ref() {
                Some((_, found)) => found.iter().any(|f| f.payout_id == c.payout_id && f.state == c.state),
                None => true,
            },
            Err(_) => true,
        }
    }

    /// Takes a payout this executor has worked out of the shared scan, so a sibling does
    /// not pick it up again from there.
    async fn forget_scanned(&self, payout_id: Uuid) {
        if let Some((_, found)) = self.last_scan.lock().await.as_mut() {
            found.retain(|c| c.payout_id != payout_id);
        }
    }

    /// Acquires `key` in `session`: one attempt, waiting in the lock server's queue for at
    /// most `executor.lock-wait-ms` when the key is held (no `waitMillis` when it is 0).
    async fn acquire(&self, session: &Session, key: &str) -> Result<LockGuard, LockClientError> {
        let wait_ms = (self.cfg.lock_wait_ms > 0).then_some(self.cfg.lock_wait_ms);
        let acquired = session.acquire_with(key, AcquireOptions { ttl_ms: None, wait_ms });
        self.metrics.hops.time(&self.clock, Hop::Acquire, acquired).await
    }

    /// Releases `guard` (L6), timed as the `release` hop; its answer changes nothing here.
    async fn release(&self, guard: LockGuard) {
        let _ = self.metrics.hops.time(&self.clock, Hop::Release, guard.release()).await;
    }

    /// One scan of the work queue (advisory reads), in [`SCAN_STATES`] order. Updates the
    /// backlog gauge from the oldest PENDING payout seen.
    pub async fn scan(&self) -> Vec<Candidate> {
        let mut out = Vec::new();
        for state in SCAN_STATES {
            let Ok(page) = self.hops.payment.list(&ListQuery::new(state).limit(self.cfg.batch_max)).await else {
                continue;
            };
            let found: Vec<Candidate> = page
                .items
                .into_iter()
                .map(|i| Candidate {
                    payout_id: i.payout_id,
                    account_id: i.account_id,
                    state,
                    created_at: Some(i.created_at),
                })
                .collect();
            if state == PayoutState::Pending {
                let oldest = found.iter().filter_map(|c| c.created_at).min();
                let age = oldest.map_or(0, |t| (self.clock.wall() - t).num_milliseconds());
                self.metrics.set_backlog_age_ms(age);
            }
            out.extend(found);
        }
        out
    }

    /// One critical section for `c`. `None` when the payout was skipped (its account is
    /// busy, or it no longer needs this executor).
    pub async fn execute(&self, session: &Session, owner: &str, c: &Candidate) -> Option<Outcome> {
        self.execute_step(Attempt { session, owner, c, chained: None, keep: false }).await.0
    }

    /// [`Executor::execute`], and how the step ended: [`Step::Reset`] when the session must
    /// be closed and replaced (after an acquire whose answer was lost, the grant may exist
    /// in this session and the client refuses that key until a new session; the server then
    /// reclaims the grant), [`Step::Busy`] when the account is worked by a sibling task or
    /// held elsewhere.
    /// The grant a post kept for the next payout ([`Attempt::keep`]) is the third value.
    async fn execute_step(&self, a: Attempt<'_>) -> (Option<Outcome>, Step, Option<Chain>) {
        // E-17: the attempt is one trace; each hop below is a child span of its root.
        let root = self.traces.next_root();
        let span = root.work_span("payout_attempt", &a.c.payout_id.to_string());
        // Boxed: the attempt's state machine (every hop, timed and traced) is large, and a
        // debug build polled on a 2 MiB thread stack (a test thread, a runtime worker)
        // overflowed it. One allocation per attempt; the hops below are boxed for the same reason.
        let attempt = Box::pin(self.execute_attempt(a));
        tracing::Instrument::instrument(root.scope(attempt), span).await
    }

    async fn execute_attempt(&self, a: Attempt<'_>) -> (Option<Outcome>, Step, Option<Chain>) {
        let Attempt { session, owner, c, chained, keep } = a;
        let started = self.clock.now();
        let (working, guard, links) = match self.grant_of(session, &c.account_id, chained).await {
            Ok(granted) => granted,
            Err(step) => return (None, step, None),
        };
        // This payout is the chain's `links + 1`-th; its grant may be kept for one more
        // while that stays within `executor.chain-payouts-max`.
        let links = links + 1;
        let mut held = Keep { wanted: keep && links < self.cfg.chain_payouts_max, kept: None };
        let outcome = self.execute_held(&mut held, owner, c, guard).await;
        if let Some(outcome) = outcome {
            self.observe_end(c, outcome, started);
        }
        let chain = held.kept.map(|guard| Chain { guard, mark: working, links });
        (outcome, Step::Done, chain)
    }

    /// The grant an attempt at `account` works under, with the account's mark and the
    /// chain's links so far: the chain's kept grant rotated (C3-extensions E-18; one rotate
    /// in place of the previous payout's release and this one's acquire, timed as the
    /// acquire), or a fresh acquire. `Err` is how the step ends when none was granted.
    async fn grant_of(
        &self,
        session: &Session,
        account: &str,
        chained: Option<Chain>,
    ) -> Result<(Working, LockGuard, u32), Step> {
        let key = format!("payout:{account}");
        let (working, granted, links) = match chained {
            Some(chain) => {
                assert_eq!(
                    chain.guard.key(),
                    key,
                    "a chained grant is only ever rotated into its own account's payouts"
                );
                // The kept grant was rotated beside the previous payout's post, so no fenced
                // write has carried its token.
                let granted = self.with_lease_for_a_write(chain.guard).await;
                if granted.is_ok() {
                    dlock_rt::probe::hit(dlock_rt::probe::Probe::GrantChained);
                }
                (chain.mark, granted, chain.links)
            }
            None => {
                let Some(working) = self.mark_working(account) else {
                    return Err(Step::Busy);
                };
                (working, self.acquire(session, &key).await, 0)
            }
        };
        match granted {
            Ok(guard) => Ok((working, guard, links)),
            Err(e) => Err(self.not_granted(account, &key, e).await),
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

    /// How an attempt ends whose acquire (or chained rotate) of `key` was not granted:
    /// [`Step::Reset`] after an unknown outcome (the session refuses the key from then on),
    /// else [`Step::Busy`]; an account another executor holds (`LOCK_CONTENDED`) leaves the
    /// shared scan.
    async fn not_granted(&self, account: &str, key: &str, e: LockClientError) -> Step {
        if matches!(e, LockClientError::Ambiguous { .. }) {
            tracing::warn!(key, cause = %e, "executor_session_reset");
            return Step::Reset;
        }
        if e.code() == Some(ErrorCode::LockContended) {
            self.forget_account(account).await;
        }
        tracing::debug!(key, cause = %e, "executor_account_busy");
        Step::Busy
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

    /// Cut 5: the final release, sent from a spawned task while the caller goes on; the
    /// account stays marked until it answers, and the `release` hop is timed there. Awaited
    /// in line when [`RELEASES_IN_FLIGHT_PER_TASK_MAX`] per task are already in flight.
    async fn release_in_background(&self, guard: LockGuard) {
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

    async fn execute_held(&self, keep: &mut Keep, owner: &str, c: &Candidate, guard: LockGuard) -> Option<Outcome> {
        let Ok(owner_id) = OwnerId::parse(owner) else {
            tracing::error!(ownerId = owner, "executor_owner_invalid");
            return Some(self.finish(guard, Outcome::Unavailable).await);
        };
        // FR-14: a PENDING or CLAIMED candidate's re-read is its fenced claim (expected
        // state from the scan); any other is read first. Only a hint; the fenced write decides.
        if matches!(c.state, PayoutState::Pending | PayoutState::Claimed) {
            return Box::pin(self.claim_submit_post(keep, guard, &owner_id, c.payout_id, c.state, None)).await;
        }
        Box::pin(self.reread_and_act(keep, guard, &owner_id, c.payout_id)).await
    }

    /// Reads the payout (P4) under `guard` and works it from the state read: claim (PENDING,
    /// CLAIMED), post (RAIL_ACKED), or release and leave it (any other state).
    async fn reread_and_act(
        &self,
        keep: &mut Keep,
        guard: LockGuard,
        owner: &OwnerId,
        payout_id: Uuid,
    ) -> Option<Outcome> {
        let view = match self.metrics.hops.time(&self.clock, Hop::Reread, self.hops.payment.payout(payout_id)).await {
            Ok(view) => view,
            Err(_) => return Some(self.finish(guard, Outcome::Unavailable).await),
        };
        match view.state {
            s @ (PayoutState::Pending | PayoutState::Claimed) => {
                Box::pin(self.claim_submit_post(keep, guard, owner, payout_id, s, Some(&view))).await
            }
            PayoutState::RailAcked => match acked_submission(&view) {
                Some((submission_id, reference)) => {
                    Some(Box::pin(self.post(keep, guard, owner, payout_id, submission_id, reference)).await)
                }
                None => Some(self.finish(guard, Outcome::Unavailable).await),
            },
            _ => {
                self.release(guard).await;
                None
            }
        }
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

    async fn finish(&self, guard: LockGuard, outcome: Outcome) -> Outcome {
        self.release(guard).await;
        outcome
    }

    fn fenced(&self, hop: &str, owner: &OwnerId, token: i64, details: Option<&Value>) {
        let d = details.cloned().unwrap_or(Value::Null);
        let highest = d.get("highestToken").and_then(serde_json::Value::as_i64);
        let text = |k: &str| d.get(k).and_then(serde_json::Value::as_str).unwrap_or("").to_owned();
        let (resource, resource_id, payout) = (text("resourceType"), text("resourceId"), text("payoutId"));
        tracing::error!(
            hop,
            ownerId = owner.as_str(),
            presentedToken = token,
            highestToken = highest,
            resource = %resource,
            resourceId = %resource_id,
            payoutId = %payout,
            "executor_fenced_out"
        );
    }

    /// Claims the payout from `state` (`view`: the payout as just read; `None` when the state
    /// is the scan's and the claim is the re-read), submits it and posts it.
    async fn claim_submit_post(
        &self,
        keep: &mut Keep,
        guard: LockGuard,
        owner: &OwnerId,
        payout_id: Uuid,
        state: PayoutState,
        view: Option<&PayoutBody>,
    ) -> Option<Outcome> {
        let Some(key) = write_key(payout_id) else {
            return Some(self.finish(guard, Outcome::Unavailable).await);
        };
        let token = guard.token();
        if !self.may_write(&guard) {
            return Some(self.finish(guard, Outcome::LeaseLost).await);
        }
        self.maybe_stall("claim", owner.as_str()).await;
        let request = ClaimRequest { expected_state: state };
        let claim = self.hops.payment.claim(payout_id, guard.signed_token(), owner, &key, &request);
        let ack = match self.metrics.hops.time(&self.clock, Hop::Claim, claim).await {
            Ok(ack) => ack,
            Err(refusal) => {
                return match refusal.code() {
                    Some(ErrorCode::FencedOut) => {
                        self.fenced("claim", owner, token.get(), refusal.details());
                        Some(self.finish(guard, Outcome::Fenced).await)
                    }
                    Some(ErrorCode::PayoutNotClaimable) if view.is_none() => {
                        // The scan was stale; the refusal names the state now (FR-14). Paid
                        // already (RAIL_ACKED): read it and post. Anything else ends the
                        // attempt: a second claim under this grant and key would be a second
                        // request with one identity (a CLAIMED payout is re-claimed from a
                        // later scan, under a newer grant).
                        let now = refusal
                            .details()
                            .and_then(|d| d.get("state"))
                            .and_then(Value::as_str)
                            .and_then(PayoutState::parse);
                        match now {
                            Some(PayoutState::RailAcked) => {
                                Box::pin(self.reread_and_act(keep, guard, owner, payout_id)).await
                            }
                            _ => Some(self.finish(guard, Outcome::NotClaimable).await),
                        }
                    }
                    Some(ErrorCode::PayoutNotClaimable) => Some(self.finish(guard, Outcome::NotClaimable).await),
                    Some(ErrorCode::InsufficientFunds) => Some(self.finish(guard, Outcome::Failed).await),
                    _ => {
                        tracing::warn!(payoutId = %payout_id, answer = %refusal, "executor_claim_undecided");
                        Some(self.finish(guard, Outcome::Unavailable).await)
                    }
                };
            }
        };
        if state == PayoutState::Claimed {
            // CLAIMED -> CLAIMED under this newer grant: an earlier holder left it (recovery).
            dlock_rt::probe::hit(dlock_rt::probe::Probe::RecoveryReclaim);
        }
        // What the submission carries: the read's, the claim answer's (C-30), or, for a
        // replayed answer recorded without them, a read now.
        let terms = match (view, ack.terms()) {
            (Some(v), _) => ClaimedTerms {
                account_id: v.account_id.clone(),
                amount_minor: v.amount_minor,
                currency: v.currency.clone(),
                beneficiary_ref: v.beneficiary_ref.clone(),
            },
            (None, Some(terms)) => terms,
            (None, None) => {
                match self.metrics.hops.time(&self.clock, Hop::Reread, self.hops.payment.payout(payout_id)).await {
                    Ok(v) => ClaimedTerms {
                        account_id: v.account_id,
                        amount_minor: v.amount_minor,
                        currency: v.currency,
                        beneficiary_ref: v.beneficiary_ref,
                    },
                    // The payout stays CLAIMED; a later scan re-claims it.
                    Err(_) => return Some(self.finish(guard, Outcome::Unavailable).await),
                }
            }
        };
        Some(Box::pin(self.submit_post(keep, guard, owner, payout_id, terms)).await)
    }

    /// Submits the claimed payout once (with its `terms`) and posts it under a newer grant.
    async fn submit_post(
        &self,
        keep: &mut Keep,
        guard: LockGuard,
        owner: &OwnerId,
        payout_id: Uuid,
        terms: ClaimedTerms,
    ) -> Outcome {
        let Some(key) = write_key(payout_id) else {
            return self.finish(guard, Outcome::Unavailable).await;
        };
        let token = guard.token();
        if !self.may_write(&guard) {
            // The payout stays CLAIMED; a newer holder re-claims it.
            return self.finish(guard, Outcome::LeaseLost).await;
        }
        let body = SubmissionRequest {
            payout_id,
            account_id: terms.account_id,
            amount_minor: terms.amount_minor,
            currency: terms.currency,
            beneficiary_ref: terms.beneficiary_ref,
        };
        self.maybe_stall("submit", owner.as_str()).await;
        // The post needs a newer grant than the claim (C3-extensions C-10): one rotate (E-18)
        // releases the claim's grant and grants a greater token to this session in one call,
        // timed as the acquire it replaces. It goes out beside the submission (issue 14),
        // not after it: neither needs the other's answer. The submission carries the claim's
        // signed token, taken before the rotate ends the belief in that grant; the rotate
        // keeps the key in this session (nobody can be granted it in between); the proxy's
        // mark judges the submission's token, paydb's fence the post's. An unknown outcome
        // of the rotate leaves the key refused by this session, as after an ambiguous
        // acquire. (The guard carries its session.)
        let signed = guard.signed_token();
        let submission = async {
            let submit = self.hops.rail.submit(signed.clone(), owner, &key, &body);
            let mut answer = self.metrics.hops.time(&self.clock, Hop::Submit, submit).await;
            if dlock_rt::planted::on(dlock_rt::planted::Bug::ExecutorRetriesSubmit) {
                // Planted bug `executor-retries-submit` (simulation only): after a rail
                // timeout or a lost answer the executor submits again, under a fresh
                // idempotency key.
                let unknown = matches!(&answer, Err(r) if r.code() == Some(ErrorCode::RailAmbiguous)
                    || matches!(r, RailRefusal::NoAnswer { .. }));
                if let (true, Ok(retry_key)) = (unknown, IdempotencyKey::parse(&format!("payout:{payout_id}:retry"))) {
                    answer = self.hops.rail.submit(signed.clone(), owner, &retry_key, &body).await;
                }
            }
            answer
        };
        let rotated = self.metrics.hops.time(&self.clock, Hop::Acquire, guard.rotate());
        let (answer, rotated) = tokio::join!(submission, rotated);
        let ack = match answer {
            Ok(ack) => ack,
            Err(refusal) => {
                let outcome = self.refused_submission(payout_id, owner, token.get(), &refusal);
                return match rotated {
                    Ok(newer) => self.finish(newer, outcome).await,
                    Err(_) => outcome,
                };
            }
        };
        let newer = match rotated {
            Ok(g) => self.with_lease_for_a_write(g).await,
            Err(e) => Err(e),
        };
        let newer = match newer {
            Ok(g) => g,
            Err(e) => {
                // Paid and RAIL_ACKED: a later scan posts it.
                tracing::info!(payoutId = %payout_id, cause = %e, "executor_post_deferred");
                return Outcome::Unavailable;
            }
        };
        Box::pin(self.post(keep, newer, owner, payout_id, ack.submission_id, ack.rail_reference)).await
    }

    /// `guard`, when its own local lease still covers one try of a claim's or post's hop
    /// (its connect and read budgets) or half a lease, whichever is less (a fresh grant
    /// could not offer much more); else one more rotate of it. For a grant rotated beside a
    /// hop (the submission, or the previous payout's post) that a slow hop may have used up.
    /// The grant's own deadline, not its session's ([`LockGuard::grant_remaining`]): a
    /// rotate renews only the grant, and a session's local lease falls to 37 % of a lease
    /// before each heartbeat (70 % kept, a beat every third), under the half this asks for:
    /// the session's deadline made ~0.8 rotates per payout for nothing
    /// (docs/performance.md "A chain of payouts of one account"). The write still checks
    /// both deadlines (`Executor::may_write`).
    async fn with_lease_for_a_write(&self, guard: LockGuard) -> Result<LockGuard, LockClientError> {
        let hop_ms = self.cfg.write_connect_timeout_ms.saturating_add(self.cfg.write_read_timeout_ms);
        if guard.grant_remaining() >= Duration::from_millis(hop_ms.min(self.cfg.lock_ttl_ms / 2)) {
            return Ok(guard);
        }
        self.metrics.hops.time(&self.clock, Hop::Acquire, guard.rotate()).await
    }

    /// What a refused submission comes to. Nothing here submits again: not after a lost
    /// answer, not after `RAIL_AMBIGUOUS`, not after a 503 (C3 §3.8: zero retries, ever).
    fn refused_submission(&self, payout_id: Uuid, owner: &OwnerId, token: i64, refusal: &RailRefusal) -> Outcome {
        match (refusal, refusal.code()) {
            (_, Some(ErrorCode::FencedOut)) => {
                self.fenced("submit", owner, token, refusal.details());
                Outcome::Fenced
            }
            (_, Some(ErrorCode::DuplicateSubmission)) => {
                tracing::error!(payoutId = %payout_id, ownerId = owner.as_str(), presentedToken = token,
                    "executor_duplicate_submission");
                Outcome::Duplicate
            }
            (_, Some(ErrorCode::RailAmbiguous)) => {
                let submission = refusal.ambiguous_submission_id().unwrap_or("").to_owned();
                tracing::warn!(
                    payoutId = %payout_id,
                    submissionId = %submission,
                    presentedToken = token,
                    ownerId = owner.as_str(),
                    outcome = "timeout",
                    "rail_ambiguous"
                );
                Outcome::Ambiguous
            }
            _ if refusal.status() == Some(422) => Outcome::Failed,
            (_, Some(ErrorCode::PayoutNotClaimable)) => Outcome::NotClaimable,
            (RailRefusal::NoAnswer { cause }, _) => {
                tracing::warn!(payoutId = %payout_id, cause, "executor_submission_answer_lost");
                Outcome::AnswerLost
            }
            _ => {
                tracing::warn!(payoutId = %payout_id, answer = %refusal, "executor_submission_undecided");
                Outcome::Unavailable
            }
        }
    }

    async fn post(
        &self,
        keep: &mut Keep,
        guard: LockGuard,
        owner: &OwnerId,
        payout_id: Uuid,
        submission_id: Uuid,
        rail_reference: String,
    ) -> Outcome {
        if !self.may_write(&guard) {
            return self.finish(guard, Outcome::LeaseLost).await;
        }
        let Some(key) = write_key(payout_id) else {
            return self.finish(guard, Outcome::Unavailable).await;
        };
        let token = guard.token();
        let body =
            PostRequest { rail_reference, submission_id, rail_outcome: SubmissionOutcome::Acked.as_str().to_owned() };
        self.maybe_stall("post", owner.as_str()).await;
        let post = self.hops.payment.post(payout_id, guard.signed_token(), owner, &key, &body);
        let post = self.metrics.hops.time(&self.clock, Hop::Post, post);
        if keep.wanted {
            // Chained (issue 14): the pass holds another payout of this account, so the grant
            // that payout's claim needs is rotated beside this post, not after its answer
            // (the post already carries this grant's signed token; the rotate keeps the key
            // in this session). Kept only when the post posted; otherwise released. A failed
            // rotate ends the chain: the next payout of the account acquires (an unknown
            // outcome leaves the key refused by this session, and that acquire resets it).
            let rotate = self.metrics.hops.time(&self.clock, Hop::Acquire, guard.rotate());
            let (answer, next) = tokio::join!(post, rotate);
            let outcome = self.posted(owner, payout_id, token.get(), answer);
            match next {
                Ok(next) if outcome == Outcome::Posted => keep.kept = Some(next),
                Ok(next) => self.release_in_background(next).await,
                Err(e) => tracing::debug!(payoutId = %payout_id, cause = %e, "executor_chain_rotate_failed"),
            }
            return outcome;
        }
        let outcome = self.posted(owner, payout_id, token.get(), post.await);
        // Cut 5: the post has answered; nothing fenced follows, so the release leaves the
        // critical path.
        self.release_in_background(guard).await;
        outcome
    }

    /// What a post's answer comes to.
    fn posted(
        &self,
        owner: &OwnerId,
        payout_id: Uuid,
        token: i64,
        answer: Result<dlock_contract::payment::PostAck, dlock_payment_client::PaymentRefusal>,
    ) -> Outcome {
        match answer {
            Ok(_) => Outcome::Posted,
            Err(refusal) => match refusal.code() {
                Some(ErrorCode::FencedOut) => {
                    self.fenced("post", owner, token, refusal.details());
                    Outcome::Fenced
                }
                Some(ErrorCode::PayoutNotClaimable) => Outcome::NotClaimable,
                _ => {
                    tracing::warn!(payoutId = %payout_id, answer = %refusal, "executor_post_undecided");
                    Outcome::Unavailable
                }
            },
        }
    }
}

/// The ACKED attempt of a P4 body: (submissionId, railReference).
fn acked_submission(view: &PayoutBody) -> Option<(Uuid, String)> {
    view.submissions.iter().find_map(|s| {
        (s.outcome == Some(SubmissionOutcome::Acked)).then_some(())?;
        Some((s.submission_id, s.rail_reference.clone()?))
    })
}

/// Shuffles each state's run of candidates (so concurrent tasks spread over accounts)
/// while keeping the [`SCAN_STATES`] order between runs.
fn shuffle_within_states(c: &mut [Candidate], rng: &mut dlock_rt::rand::SeededRng) {
    use dlock_rt::rand::Rng;
    let mut start = 0;
    while start < c.len() {
        let state = c[start].state;
        let end = start + c[start..].iter().take_while(|x| x.state == state).count();
        for i in (start + 1..end).rev() {
            let j = rng.gen_range(start..=i);
            c.swap(i, j);
        }
        start = end;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn candidate(state: PayoutState, n: u128) -> Candidate {
        Candidate { payout_id: Uuid::from_u128(n), account_id: format!("a-{n}"), state, created_at: None }
    }

    /// Cut 6: the affinity hash is stable (pinned values: a change would reshuffle every
    /// deployment's executors) and every account has exactly one preferred executor.
    #[test]
    fn affinity_is_a_stable_hash_and_gives_each_account_one_executor() {
        let pinned: Vec<u32> = (0..6).map(|a| affinity_of(&format!("acct-{a}"), 4)).collect();
        assert_eq!(pinned, PINNED_AFFINITY.to_vec());
        assert_eq!(affinity_of("anything", 1), 0);
        assert_eq!(affinity_of("anything", 0), 0, "a count of 0 is read as 1");
        for a in 0..200 {
            let account = format!("acct-{a}");
            let owners = (0..3).filter(|&i| affinity_of(&account, 3) == i).count();
            assert_eq!(owners, 1, "{account}");
        }
        let spread: std::collections::BTreeSet<u32> = (0..64).map(|a| affinity_of(&format!("a{a}"), 4)).collect();
        assert_eq!(spread.len(), 4, "64 accounts reach every one of 4 executors");
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
        assert_eq!(
            next_candidate(&mut queue, Some("a")).map(|c| c.payout_id.as_u128()),
            Some(2),
            "none left: the front"
        );
        assert_eq!(next_candidate(&mut queue, None).map(|c| c.payout_id.as_u128()), Some(4));
        assert!(next_candidate(&mut queue, Some("c")).is_none());
    }

    /// `affinity_of("acct-0".."acct-5", 4)`.
    const PINNED_AFFINITY: [u32; 6] = [3, 0, 1, 2, 3, 0];

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

    /// Cut 6: a head is another executor's account's oldest candidate; it keeps its `since`
    /// while it is the same payout, restarts when the owner settles it, and leaves with the
    /// account. A backlog far older than the bound whose owner settles a payout per scan
    /// never stalls (creation time plays no part); an owner that stops stalls after the bound.
    #[test]
    fn an_account_stalls_only_when_its_oldest_payout_stays_put_for_the_bound() {
        let t0 = Clock::system().now();
        let later = |ms: u64| t0.checked_add(Duration::from_millis(ms)).expect("in range");
        let long_ago = Clock::system().wall() - chrono::Duration::hours(1);
        let payout = |account: &str, n: u128, age_s: i64| Candidate {
            payout_id: Uuid::from_u128(n),
            account_id: account.to_owned(),
            state: PayoutState::Pending,
            created_at: Some(long_ago + chrono::Duration::seconds(age_s)),
        };
        let foreign = |a: &str| a != "mine";
        let bound = Duration::from_millis(5_000);
        // The owner of `a` settles its oldest payout between every two scans, 1 s apart.
        let mut heads = BTreeMap::new();
        for (scan, n) in (0u64..20).zip(0u128..) {
            let found = vec![payout("a", n + 1, n as i64 + 1), payout("a", n, n as i64), payout("mine", 99, 0)];
            heads = next_heads(&heads, &found, foreign, later(scan * 1_000));
            assert_eq!(heads.get("a").map(|h| h.payout_id.as_u128()), Some(n), "the oldest is the head");
            assert!(!heads.contains_key("mine"), "own accounts are not tracked");
            assert!(stalled_accounts(&heads, later(scan * 1_000), bound).is_empty(), "scan {scan}: it progresses");
        }
        // Then it stops: the same head from 19 s on.
        for s in 20u64..=23 {
            heads = next_heads(&heads, &[payout("a", 19, 19), payout("a", 20, 20)], foreign, later(s * 1_000));
            assert!(stalled_accounts(&heads, later(s * 1_000), bound).is_empty(), "{s} s: within the bound");
        }
        heads = next_heads(&heads, &[payout("a", 19, 19)], foreign, later(24_000));
        let stalled = stalled_accounts(&heads, later(24_000), bound);
        assert_eq!(stalled.into_iter().collect::<Vec<_>>(), vec!["a".to_owned()], "5 s on one head: at the bound");
        assert!(stalled_accounts(&heads, later(24_000), bound + Duration::from_millis(1)).is_empty());
        heads = next_heads(&heads, &[payout("b", 7, 0)], foreign, later(25_000));
        assert_eq!(
            heads.keys().cloned().collect::<Vec<_>>(),
            vec!["b".to_owned()],
            "an account not scanned is dropped"
        );
        assert!(stalled_accounts(&heads, later(25_000), bound).is_empty(), "a new head starts its own clock");
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
}
