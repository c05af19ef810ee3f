//! lockdb's clock (C1 §1.4.2, C3-extensions C-31): the one clock every lease in a database
//! lockdb is judged by, and the judge that advances it. The loop here is the same on every
//! store that keeps the clock: PostgreSQL and SQLite (`store_sql::clock`, its statements)
//! and the simulation store (`store_mem`, the same row in memory), so the simulation plays
//! the production judge, takeover and grace.
//!
//! - **The clock.** One row ([`ClockRow`]): `now_ms`, the replica that judges it, and that
//!   judge's term. Every lease decision reads `now` from it, in the step that decides: the
//!   rules are unchanged, and every replica judges by one clock.
//! - **Only a monotonic clock moves it.** One replica at a time, the *judge*, adds to
//!   `now_ms` every [`CLOCK_TICK_MS`] the whole milliseconds its monotonic clock ran since
//!   its last tick ([`rules::clock_advance`]), guarded on its own name and term. No wall
//!   clock is read to advance it: neither a replica's nor the database host's, so a step of
//!   either shortens no lease. Between ticks the clock stands: a decision reads it as the
//!   last tick left it, and the next tick adds at most [`CLOCK_ADVANCE_MS_MAX`], so a lease
//!   ends in true time between that much early and one tick late. A judge that stalled adds
//!   no more than that either and drops the rest: the clock lags by the stall, which only
//!   extends leases.
//! - **Takeover.** Every other replica watches the row. When nobody judges it, or the row
//!   (value, judge, term) has stood unchanged for [`JUDGE_GRACE_MS`] on the watcher's own
//!   monotonic clock ([`rules::decide_clock`]), the watcher takes the role, guarded on the
//!   row as it read it, and the clock resumes from the value it stood at. So while no judge
//!   ticks (one died, or none runs at all) the clock stands and every lease is extended by
//!   that time: a replica that has just started judges nothing dead sooner than a full TTL
//!   after it took over. The grace never decides safety: the old judge's ticks fail their
//!   guard once the role moved. It only keeps a live judge from being displaced.
//! - **Unknown outcomes.** A tick whose answer was lost counts as applied (the next tick
//!   adds only what ran since), so the clock may lag a little and never runs ahead. A tick
//!   never sent (no pooled connection in time) carries its time to the next tick.
//!
//! ## Invariants
//! - The clock advances only by a judge's measured monotonic durations, in whole ms, at
//!   most [`CLOCK_ADVANCE_MS_MAX`] a tick, and only while that judge holds the role (its
//!   guard): it never runs faster than the judge's monotonic clock, whatever any wall clock
//!   does.
//! - A replica stops ticking when its store is dropped, and hands the role back (judge `''`)
//!   so the next replica takes over without waiting for the grace. A replica that dies
//!   without handing it back is replaced after the grace (probe `judge_took_over_after_grace`).
//!
//! ## Limits
//! [`CLOCK_TICK_MS`], [`CLOCK_ADVANCE_MS_MAX`], [`JUDGE_GRACE_MS`], and
//! [`CLOCK_STATEMENT_MS_MAX`] on each statement.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use dlock_rt::{Clock, Duration, Instant};

pub use crate::rules::ClockRow;
use crate::rules::{self, ClockMove};

/// How often the judge advances lockdb's clock, and a watcher reads it: the most a lease is
/// judged over late.
pub const CLOCK_TICK_MS: u64 = 50;
/// The most one tick advances lockdb's clock (two ticks): a judge that stalled longer adds
/// only this and drops the rest ([`rules::clock_advance`]). It bounds how early in true time
/// a lease can end: a decision reads the clock as the last tick left it, and the next tick
/// adds at most this.
pub const CLOCK_ADVANCE_MS_MAX: u64 = 2 * CLOCK_TICK_MS;
/// How long a watcher sees the clock row stand still before it takes the judge's role: the
/// extra time every lease lives when a judge dies.
pub const JUDGE_GRACE_MS: u64 = 1_000;
/// Bound on one statement of the clock's (a tick, a read, a takeover).
pub const CLOCK_STATEMENT_MS_MAX: u64 = 2_000;

/// Why a statement of the clock's failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClockFault {
    /// The store was closed: nothing sent from now on can apply.
    Closed,
    /// The statement never left this process (no connection in time): nothing applied.
    NeverSent,
    /// It may or may not have applied.
    Unknown(String),
}

impl std::fmt::Display for ClockFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClockFault::Closed => f.write_str("the store is closed"),
            ClockFault::NeverSent => f.write_str("no connection in time"),
            ClockFault::Unknown(cause) => f.write_str(cause),
        }
    }
}

/// The clock's statements on one store.
#[async_trait]
pub trait ClockDb: Send + Sync + 'static {
    async fn read(&self) -> Result<Option<ClockRow>, ClockFault>;
    /// Advances the clock by `advance_ms` if `judge` still judges it in `term`.
    async fn tick(&self, advance_ms: i64, judge: &str, term: i64) -> Result<bool, ClockFault>;
    /// Takes the role for `judge` if the row is still `seen`; the new term.
    async fn take(&self, judge: &str, seen: &ClockRow) -> Result<Option<i64>, ClockFault>;
    async fn resign(&self, judge: &str, term: i64) -> Result<(), ClockFault>;
}

/// This replica's part in lockdb's clock: its name, and whether it judges now. The store
/// holds it; when the last holder drops it, the ticking task hands the role back and stops.
#[derive(Debug)]
pub struct ClockJudge {
    id: String,
    judging: AtomicBool,
}

impl ClockJudge {
    /// Whether this replica advances lockdb's clock now.
    pub fn is_judging(&self) -> bool {
        self.judging.load(Ordering::Relaxed)
    }

    /// This replica's name in the clock row's `judge` (unique per process start).
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Starts this replica's clock task on `db` under the name `id` (unique per process start),
/// measuring on `clock`.
pub fn start(db: impl ClockDb, clock: Clock, id: String) -> Arc<ClockJudge> {
    let judge = Arc::new(ClockJudge { id, judging: AtomicBool::new(false) });
    dlock_rt::spawn(run(db, clock, Arc::downgrade(&judge), judge.id.clone()));
    judge
}

/// What this replica is to the clock.
enum Role {
    /// It judges in `term`; its monotonic clock counted up to `counted`.
    Judge { term: i64, counted: Instant },
    /// It watches: the row it last read, and when it first read it so.
    Watcher { seen: Option<(ClockRow, Instant)> },
    /// Its store is closed: it stops.
    Closed,
}

async fn run(db: impl ClockDb, clock: Clock, handle: Weak<ClockJudge>, id: String) {
    let mut role = Role::Watcher { seen: None };
    loop {
        let Some(me) = handle.upgrade() else {
            if let Role::Judge { term, .. } = role {
                let _ = bounded(db.resign(&id, term)).await;
            }
            return;
        };
        role = step(&db, &clock, &me, role).await;
        me.judging.store(matches!(role, Role::Judge { .. }), Ordering::Relaxed);
        if matches!(role, Role::Closed) {
            // The store was closed: nothing this task sends can apply any more.
            return;
        }
        drop(me);
        dlock_rt::sleep(Duration::from_millis(CLOCK_TICK_MS)).await;
    }
}

/// One statement bounded by [`CLOCK_STATEMENT_MS_MAX`]; `None`: it timed out (unknown).
async fn bounded<T>(f: impl std::future::Future<Output = Result<T, ClockFault>>) -> Option<Result<T, ClockFault>> {
    dlock_rt::timeout(Duration::from_millis(CLOCK_STATEMENT_MS_MAX), f).await
}

async fn step(db: &impl ClockDb, clock: &Clock, me: &ClockJudge, role: Role) -> Role {
    match role {
        Role::Closed => Role::Closed,
        Role::Judge { term, counted } => {
            let elapsed = clock.now().saturating_duration_since(counted);
            let elapsed_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
            let (advance_ms, counted_us) = rules::clock_advance(elapsed_us, CLOCK_ADVANCE_MS_MAX as i64);
            let after = counted + Duration::from_micros(counted_us);
            match bounded(db.tick(advance_ms, &me.id, term)).await {
                Some(Ok(true)) => Role::Judge { term, counted: after },
                Some(Ok(false)) => {
                    tracing::warn!(term, "lock_clock_judge_lost");
                    Role::Watcher { seen: None }
                }
                Some(Err(ClockFault::Closed)) => Role::Closed,
                Some(Err(ClockFault::NeverSent)) => Role::Judge { term, counted },
                Some(Err(ClockFault::Unknown(cause))) => {
                    // Perhaps applied: counted as applied, so the clock may lag, never lead.
                    tracing::warn!(term, cause, "lock_clock_tick_unknown");
                    Role::Judge { term, counted: after }
                }
                None => Role::Judge { term, counted: after },
            }
        }
        Role::Watcher { seen } => {
            let row = match bounded(db.read()).await {
                Some(Ok(Some(row))) => row,
                Some(Ok(None)) => {
                    tracing::error!("lock_clock_row_missing");
                    return Role::Watcher { seen: None };
                }
                Some(Err(ClockFault::Closed)) => return Role::Closed,
                Some(Err(_)) | None => return Role::Watcher { seen },
            };
            let now = clock.now();
            if row.judge == me.id {
                // A takeover whose answer was lost did apply: judge from here.
                return Role::Judge { term: row.term, counted: now };
            }
            let watched = seen
                .as_ref()
                .filter(|(r, _)| *r == row)
                .map(|(_, at)| i64::try_from(now.saturating_duration_since(*at).as_millis()).unwrap_or(i64::MAX));
            match rules::decide_clock(&row, watched, JUDGE_GRACE_MS as i64) {
                ClockMove::Watch => match seen {
                    Some((r, at)) if r == row => Role::Watcher { seen: Some((r, at)) },
                    _ => Role::Watcher { seen: Some((row, now)) },
                },
                ClockMove::TakeOver => match bounded(db.take(&me.id, &row)).await {
                    Some(Ok(Some(term))) => {
                        if !row.judge.is_empty() {
                            // The judge fell silent without handing the role back (it
                            // died, or stalled): the clock stood for the whole grace.
                            dlock_rt::probe::hit(dlock_rt::probe::Probe::JudgeTookOverAfterGrace);
                        }
                        tracing::info!(term, previous = %row.judge, "lock_clock_judge_taken");
                        Role::Judge { term, counted: now }
                    }
                    _ => Role::Watcher { seen: None },
                },
            }
        }
    }
}
