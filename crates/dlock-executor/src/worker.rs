//! The executor's loop: scans, passes, chains and batches around one critical section per
//! account's payouts.
//!
//! For each payout found by a scan (RAIL_ACKED first, to finish what was paid; then
//! CLAIMED, whose holder may have gone; then PENDING; the tasks of one executor share a scan
//! younger than the poll interval, less the payouts they have worked since, and a pass
//! skips a candidate of its copy that the shared scan no longer lists in the same state),
//! a task runs one critical section: a [`run::PayoutRun`], the synchronous state machine
//! that decides every step (acquire, re-read, claim, submit with the post's grant rotated
//! beside it, post, release; [`run`] states its transitions and invariants), performed
//! through the typed clients by the async shell ([`shell`]). In short:
//!
//! 1. acquire `payout:{accountId}`: one attempt, queued at the lock server for at most
//!    `executor.lock-wait-ms` (default 0: no wait). A contended account is skipped and
//!    revisited on a later scan; an account a sibling task of this executor works, or one
//!    found busy earlier in the same pass, is skipped without asking the lock server;
//! 2. re-read the payout before acting (FR-14): for a PENDING or CLAIMED candidate the
//!    fenced claim, sent with `expectedState` from the scan, is the re-read; a RAIL_ACKED
//!    candidate is read (P4) for its acknowledged attempt. The read is only a hint;
//! 3. claim (P2) with the grant's token;
//! 4. submit once to the rail-proxy with the same token, never retried, whatever happens;
//! 5. post (P3) under a newer grant, rotated (E-18) beside step 4's submission (issue 14;
//!    C3-extensions C-10, C-12: each grant passes each fence once);
//! 6. release, from a spawned task (issue 14 cut 5): the task goes on to its next candidate
//!    while the DELETE is in flight; the account stays marked as worked by this executor
//!    until the release has answered. At most [`RELEASES_IN_FLIGHT_PER_TASK_MAX`] per task
//!    are in flight (past that the release is awaited in line), and shutdown waits up to
//!    [`RELEASE_DRAIN_MS_MAX`] for them.
//!
//! **Chains** (issue 14): when the pass still holds another candidate of the account just
//! posted, the run keeps the post's grant (rotated beside the post, kept only when the post
//! posted) and the task works that candidate next ([`next_candidate`]): one rotate in place
//! of a release and an acquire. A chain carries at most `executor.chain-payouts-max`
//! payouts, then its account is released so a lock-server waiter and the task's other
//! accounts get their turn; a chain whose account has no candidate left, or whose task
//! stops, is released in the background. Invariant (asserted in [`run::PayoutRun::new`]):
//! a kept grant is only ever rotated into a payout of its own account.
//!
//! **Batches** (issue 14, C3-extensions E-19): a pass holding more than one PENDING or
//! CLAIMED candidate of an account works up to `executor.payouts-per-grant-max` of them
//! together in one run ([`take_batch`]): one claim (P2b), one submission (R1b), one post
//! (P3b), each fence passed once for all of them. Batches chain like single payouts.
//!
//! **Account affinity** (issue 14 cut 6, [`affinity`]): with `executor.affinity-count`
//! n > 1, a pass tries only the accounts whose [`affinity_of`] is this executor's index and
//! the other executors' accounts that have shown no progress for
//! `executor.affinity-steal-after-ms` ([`stalled_accounts`]), and every candidate only when
//! the scan holds none of those. An acquire refused because another executor holds the
//! account drops that account's candidates from the shared scan until the next scan. All
//! of it only narrows what is tried; the lock server stays the only authority.
//!
//! Every hop is timed into `payout_hop_seconds{hop}` and a payout that ends POSTED or
//! FAILED here into `payout_end_to_end_seconds{outcome}` ([`crate::metrics`]).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use dlock_contract::payout::PayoutState;
use dlock_contract::OwnerId;
use dlock_lock_client::{LockClient, LockClientConfig, Session};
use dlock_payment_client::ListQuery;
use dlock_rt::Clock;
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::ExecutorConfig;
use crate::hops::Hops;
use crate::metrics::{ExecutorMetrics, Outcome};

pub mod affinity;
mod batch;
pub mod run;
mod shell;

pub use affinity::{affinity_of, next_heads, stalled_accounts, Head};
pub use batch::{batchable, take_batch};
pub use run::{write_key, Pass};
use shell::{Chain, RunInput};

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
                    let input = RunInput { session: s, owner: &owner, members, chained: carried, keep: more };
                    let (ended, step, kept) = self.execute_run(input).await;
                    chain = kept;
                    for (m, outcome) in ended {
                        worked = true;
                        self.forget_scanned(m.payout_id).await;
                        self.metrics.count(outcome);
                        tracing::info!(payoutId = %m.payout_id, accountId = %m.account_id, outcome = outcome.tag(),
                            ownerId = %owner, "payout_executed");
                    }
                    match step {
                        Pass::Reset => {
                            reset = true;
                            break;
                        }
                        Pass::Busy => {
                            busy.insert(c.account_id.clone());
                        }
                        Pass::Done => {}
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
    /// One critical section for `c`. `None` when the payout was skipped (its account is
    /// busy, or it no longer needs this executor).
    pub async fn execute(&self, session: &Session, owner: &str, c: &Candidate) -> Option<Outcome> {
        let input = RunInput { session, owner, members: vec![c.clone()], chained: None, keep: false };
        let (ended, _, _) = self.execute_run(input).await;
        ended.into_iter().next().map(|(_, outcome)| outcome)
    }
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
mod tests;
