//! lockdb's clock on PostgreSQL and SQLite (C1 §1.4.2, C3-extensions C-28): the one clock
//! every lease on the database is judged by, and the judge that advances it.
//!
//! - **The clock.** One row, `lock_clock`: `now_ms`, the replica that judges it, and that
//!   judge's term. Every lease decision reads `now` from it ([`CLOCK_NOW`]) in the statement
//!   that decides, exactly where the database's own clock was read before: the rules and
//!   every SQL predicate are unchanged, and every replica judges by one clock.
//! - **Only a monotonic clock moves it.** One replica at a time, the *judge*, adds to
//!   `now_ms` every [`CLOCK_TICK_MS`] the whole milliseconds its monotonic clock ran since
//!   its last tick ([`rules::clock_advance`]), guarded on its own name and term. No wall
//!   clock is read to advance it: neither a replica's nor the database host's, so a step of
//!   either shortens no lease. Between ticks the clock stands, so a lease is judged over at
//!   most one tick (plus a commit) late: it extends, never shortens.
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
//! - **Durability.** On SQLite a tick is an unflushed commit (`dlock_db::sqlite_unflushed`):
//!   a power loss can undo ticks, which sets the clock back, which only extends leases.
//!
//! ## Invariants
//! - The clock advances only by a judge's measured monotonic durations, in whole ms, and
//!   only while that judge holds the role (its guard): it never runs faster than the judge's
//!   monotonic clock, whatever any wall clock does.
//! - A replica stops ticking when its store is dropped, and hands the role back (judge `''`)
//!   so the next replica takes over without waiting for the grace.
//!
//! ## Limits
//! [`CLOCK_TICK_MS`], [`JUDGE_GRACE_MS`], and [`CLOCK_STATEMENT_MS_MAX`] on each statement.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use async_trait::async_trait;
use dlock_db::Dialect;
use dlock_rt::{Clock, Duration, Instant};
use sqlx::Row;

use crate::rules::{self, ClockMove, ClockRow};

/// How often the judge advances lockdb's clock, and a watcher reads it: the most a lease is
/// judged over late.
pub const CLOCK_TICK_MS: u64 = 50;
/// How long a watcher sees the clock row stand still before it takes the judge's role: the
/// extra time every lease lives when a judge dies.
pub const JUDGE_GRACE_MS: u64 = 1_000;
/// Bound on one statement of the clock's (a tick, a read, a takeover).
pub const CLOCK_STATEMENT_MS_MAX: u64 = 2_000;

/// lockdb's now, as every lease decision reads it (the `{NOW}` of the store's statements).
pub const CLOCK_NOW: &str = "(SELECT now_ms FROM lock_clock WHERE id = 1)";

const READ: &str = "SELECT now_ms, judge, term FROM lock_clock WHERE id = 1";
const TICK: &str =
    "UPDATE lock_clock SET now_ms = now_ms + $1 WHERE id = 1 AND judge = $2 AND term = $3 RETURNING now_ms";
const TAKE: &str = "UPDATE lock_clock SET judge = $1, term = term + 1 \
     WHERE id = 1 AND judge = $2 AND term = $3 AND now_ms = $4 RETURNING term";
const RESIGN: &str = "UPDATE lock_clock SET judge = '' WHERE id = 1 AND judge = $1 AND term = $2";

/// The clock's statements on one database.
#[async_trait]
pub(super) trait ClockDb: Send + Sync + 'static {
    async fn read(&self) -> Result<Option<ClockRow>, sqlx::Error>;
    /// Advances the clock by `advance_ms` if `judge` still judges it in `term`.
    async fn tick(&self, advance_ms: i64, judge: &str, term: i64) -> Result<bool, sqlx::Error>;
    /// Takes the role for `judge` if the row is still `seen`; the new term.
    async fn take(&self, judge: &str, seen: &ClockRow) -> Result<Option<i64>, sqlx::Error>;
    async fn resign(&self, judge: &str, term: i64) -> Result<(), sqlx::Error>;
}

/// The statements both dialects run alike (`$n` spelled for `$dialect`); `tick` is each
/// one's own (SQLite's is unflushed).
macro_rules! clock_db {
    ($pool:ty, $dialect:expr, $tick:item) => {
        #[async_trait]
        impl ClockDb for $pool {
            async fn read(&self) -> Result<Option<ClockRow>, sqlx::Error> {
                let row = sqlx::query(&$dialect.sql(READ)).fetch_optional(self).await?;
                row.map(|r| {
                    Ok(ClockRow { now_ms: r.try_get("now_ms")?, judge: r.try_get("judge")?, term: r.try_get("term")? })
                })
                .transpose()
            }

            $tick

            async fn take(&self, judge: &str, seen: &ClockRow) -> Result<Option<i64>, sqlx::Error> {
                let row = sqlx::query(&$dialect.sql(TAKE))
                    .bind(judge.to_owned())
                    .bind(seen.judge.clone())
                    .bind(seen.term)
                    .bind(seen.now_ms)
                    .fetch_optional(self)
                    .await?;
                row.map(|r| r.try_get("term")).transpose()
            }

            async fn resign(&self, judge: &str, term: i64) -> Result<(), sqlx::Error> {
                sqlx::query(&$dialect.sql(RESIGN)).bind(judge.to_owned()).bind(term).execute(self).await.map(|_| ())
            }
        }
    };
}

clock_db!(
    sqlx::PgPool,
    Dialect::Postgres,
    async fn tick(&self, advance_ms: i64, judge: &str, term: i64) -> Result<bool, sqlx::Error> {
        let row = sqlx::query(TICK).bind(advance_ms).bind(judge.to_owned()).bind(term).fetch_optional(self).await?;
        Ok(row.is_some())
    }
);

clock_db!(
    sqlx::SqlitePool,
    Dialect::Sqlite,
    async fn tick(&self, advance_ms: i64, judge: &str, term: i64) -> Result<bool, sqlx::Error> {
        static SQL: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| dlock_db::sqlite_unflushed_sql(&[(TICK, 3)]));
        let tick = sqlx::query(&SQL).bind(advance_ms).bind(judge.to_owned()).bind(term);
        let parts = dlock_db::sqlite_unflushed(self, tick, 1).await?;
        Ok(parts.first().is_some_and(|p| !p.rows.is_empty()))
    }
);

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

    /// This replica's name in `lock_clock.judge`.
    pub fn id(&self) -> &str {
        &self.id
    }
}

/// Starts this replica's clock task on `db`, measuring on `clock`.
pub(super) fn start(db: impl ClockDb, clock: Clock) -> Arc<ClockJudge> {
    let judge = Arc::new(ClockJudge { id: dlock_rt::rand::uuid_v4().to_string(), judging: AtomicBool::new(false) });
    dlock_rt::spawn(run(db, clock, Arc::downgrade(&judge), judge.id.clone()));
    judge
}

/// What this replica is to the clock.
enum Role {
    /// It judges in `term`; its monotonic clock counted up to `counted`.
    Judge { term: i64, counted: Instant },
    /// It watches: the row it last read, and when it first read it so.
    Watcher { seen: Option<(ClockRow, Instant)> },
    /// Its pool is closed: it stops.
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
            // The store's pool was closed: nothing this task sends can apply any more.
            return;
        }
        drop(me);
        dlock_rt::sleep(Duration::from_millis(CLOCK_TICK_MS)).await;
    }
}

/// One statement bounded by [`CLOCK_STATEMENT_MS_MAX`]; `None`: it timed out (unknown).
async fn bounded<T>(f: impl std::future::Future<Output = Result<T, sqlx::Error>>) -> Option<Result<T, sqlx::Error>> {
    dlock_rt::timeout(Duration::from_millis(CLOCK_STATEMENT_MS_MAX), f).await
}

/// A statement that never left this process: nothing of it applied.
fn never_sent(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::PoolTimedOut)
}

async fn step(db: &impl ClockDb, clock: &Clock, me: &ClockJudge, role: Role) -> Role {
    match role {
        Role::Closed => Role::Closed,
        Role::Judge { term, counted } => {
            let elapsed = clock.now().saturating_duration_since(counted);
            let (advance_ms, counted_us) = rules::clock_advance(u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX));
            let after = counted + Duration::from_micros(counted_us);
            match bounded(db.tick(advance_ms, &me.id, term)).await {
                Some(Ok(true)) => Role::Judge { term, counted: after },
                Some(Ok(false)) => {
                    tracing::warn!(term, "lock_clock_judge_lost");
                    Role::Watcher { seen: None }
                }
                Some(Err(sqlx::Error::PoolClosed)) => Role::Closed,
                Some(Err(e)) if never_sent(&e) => Role::Judge { term, counted },
                Some(Err(e)) => {
                    // Perhaps applied: counted as applied, so the clock may lag, never lead.
                    tracing::warn!(term, cause = %dlock_db::describe(&e), "lock_clock_tick_unknown");
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
                Some(Err(sqlx::Error::PoolClosed)) => return Role::Closed,
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
                        tracing::info!(term, previous = %row.judge, "lock_clock_judge_taken");
                        Role::Judge { term, counted: now }
                    }
                    _ => Role::Watcher { seen: None },
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! lockdb's clock on SQLite (PostgreSQL runs the same statements; every PostgreSQL test
    //! whose lease must end needs its judge to tick).

    use super::*;

    async fn database() -> (sqlx::SqlitePool, dlock_testkit::TempDir) {
        let (url, dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
        let pool = dlock_db::sqlite_pool(&url).await.expect("pool");
        super::super::SQLITE_MIGRATOR.run(&pool).await.expect("migrate");
        (pool, dir)
    }

    async fn row(pool: &sqlx::SqlitePool) -> ClockRow {
        pool.read().await.expect("read").expect("the clock row")
    }

    /// Polls `cond` on the clock row until it holds (bounded); the row then.
    async fn row_until(pool: &sqlx::SqlitePool, what: &str, cond: impl Fn(&ClockRow) -> bool) -> ClockRow {
        let found = dlock_rt::wait_until(Duration::from_millis(10), Duration::from_secs(10), || async {
            let r = row(pool).await;
            cond(&r).then_some(r)
        })
        .await;
        found.unwrap_or_else(|| panic!("{what}: not within the deadline"))
    }

    /// A judge's guard holds: once another replica took the role, the old judge's ticks
    /// change nothing, and only the new judge advances the clock.
    #[tokio::test]
    async fn a_displaced_judge_cannot_advance_the_clock() {
        let (pool, _dir) = database().await;
        let first = row(&pool).await;
        assert_eq!((first.judge.as_str(), first.term), ("", 0), "a new database has no judge");
        let a = pool.take("a", &first).await.expect("take").expect("nobody judged: a takes over");
        assert!(pool.tick(5, "a", a).await.expect("tick"), "a judges");
        let seen = row(&pool).await;
        assert_eq!(seen.now_ms, first.now_ms + 5);
        assert_eq!(pool.take("b", &first).await.expect("take"), None, "a takeover guarded on an old row fails");
        let b = pool.take("b", &seen).await.expect("take").expect("b takes over");
        assert!(b > a, "each takeover is a new term");
        assert!(!pool.tick(5, "a", a).await.expect("tick"), "the displaced judge's tick is refused");
        assert_eq!(row(&pool).await.now_ms, seen.now_ms, "and changed nothing");
        assert!(pool.tick(7, "b", b).await.expect("tick"));
        assert_eq!(row(&pool).await.now_ms, seen.now_ms + 7);
        pool.resign("b", b).await.expect("resign");
        assert_eq!(row(&pool).await.judge, "", "a resigned role is free");
    }

    /// The clock advances only while a judge ticks, never faster than the judge's monotonic
    /// clock; when its judge falls silent it stands still, and a watcher takes over only
    /// after the grace, resuming from the value it stood at.
    #[tokio::test]
    async fn the_clock_stands_while_no_judge_ticks_and_a_watcher_takes_over_after_the_grace() {
        let (pool, _dir) = database().await;
        let (init, started) = (row(&pool).await, Clock::system().now());
        let judge = start(pool.clone(), Clock::system());
        let r0 = row_until(&pool, "the replica judges", |r| r.judge == judge.id()).await;
        let r1 = row_until(&pool, "the clock advances", |r| r.now_ms >= r0.now_ms + 300).await;
        // Every ms it counted ran after it took the role, so after `started`.
        let ran = i64::try_from(started.elapsed().as_millis()).expect("ms");
        assert!(r1.now_ms - init.now_ms <= ran, "the clock ran {} ms in {ran} ms", r1.now_ms - init.now_ms);
        // Another replica took the role and died at once: nobody ticks.
        sqlx::query("UPDATE lock_clock SET judge = 'dead', term = term + 1").execute(&pool).await.expect("displace");
        let stood = row(&pool).await;
        let silent = Clock::system().now();
        let taken = row_until(&pool, "the watcher takes over", |r| r.judge == judge.id()).await;
        let waited = silent.elapsed();
        assert!(waited >= Duration::from_millis(JUDGE_GRACE_MS), "took over after {waited:?}, within the grace");
        assert_eq!(taken.now_ms, stood.now_ms, "the clock stood still while nobody judged it");
        assert_eq!(taken.term, stood.term + 1);
        row_until(&pool, "the clock resumes", |r| r.now_ms > stood.now_ms).await;
        assert!(judge.is_judging());
    }

    /// A replica whose store is dropped stops ticking and hands the role back at once.
    #[tokio::test]
    async fn a_dropped_judge_hands_the_role_back() {
        let (pool, _dir) = database().await;
        let judge = start(pool.clone(), Clock::system());
        let id = judge.id().to_owned();
        row_until(&pool, "the replica judges", |r| r.judge == id).await;
        drop(judge);
        let freed = row_until(&pool, "the role is handed back", |r| r.judge.is_empty()).await;
        dlock_rt::sleep(Duration::from_millis(CLOCK_TICK_MS * 3)).await;
        assert_eq!(row(&pool).await.now_ms, freed.now_ms, "nobody ticks after the hand-back");
    }
}
