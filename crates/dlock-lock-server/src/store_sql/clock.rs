//! lockdb's clock on PostgreSQL and SQLite: its statements. The judge, its takeover and
//! grace, and the invariants are [`crate::lockdb_clock`]'s (C1 §1.4.2, C3-extensions C-31);
//! this module is the row `lock_clock` and the SQL that reads, ticks, takes and resigns it.
//!
//! - Every lease decision reads `now` from the row ([`CLOCK_NOW`]) in the statement that
//!   decides, exactly where the database's own clock was read before: the rules and every
//!   SQL predicate are unchanged.
//! - **Durability.** On SQLite a tick is an unflushed commit (`dlock_db::sqlite_unflushed`):
//!   a power loss can undo ticks, which sets the clock back, which only extends leases.
//! - A pool timeout is a statement never sent ([`ClockFault::NeverSent`]); a closed pool is
//!   [`ClockFault::Closed`]; any other error may have applied.

use async_trait::async_trait;
use dlock_db::Dialect;
use sqlx::Row;

use crate::lockdb_clock::{ClockDb, ClockFault};
pub use crate::lockdb_clock::{
    ClockJudge, CLOCK_ADVANCE_MS_MAX, CLOCK_STATEMENT_MS_MAX, CLOCK_TICK_MS, JUDGE_GRACE_MS,
};
use crate::rules::ClockRow;

/// lockdb's now, as every lease decision reads it (the `{NOW}` of the store's statements).
pub const CLOCK_NOW: &str = "(SELECT now_ms FROM lock_clock WHERE id = 1)";

const READ: &str = "SELECT now_ms, judge, term FROM lock_clock WHERE id = 1";
const TICK: &str =
    "UPDATE lock_clock SET now_ms = now_ms + $1 WHERE id = 1 AND judge = $2 AND term = $3 RETURNING now_ms";
const TAKE: &str = "UPDATE lock_clock SET judge = $1, term = term + 1 \
     WHERE id = 1 AND judge = $2 AND term = $3 AND now_ms = $4 RETURNING term";
const RESIGN: &str = "UPDATE lock_clock SET judge = '' WHERE id = 1 AND judge = $1 AND term = $2";

/// A statement's error as the clock's loop reads it.
fn fault(e: sqlx::Error) -> ClockFault {
    match e {
        sqlx::Error::PoolClosed => ClockFault::Closed,
        sqlx::Error::PoolTimedOut => ClockFault::NeverSent,
        e => ClockFault::Unknown(dlock_db::describe(&e)),
    }
}

/// The statements both dialects run alike (`$n` spelled for `$dialect`); `tick` is each
/// one's own (SQLite's is unflushed).
macro_rules! clock_db {
    ($pool:ty, $dialect:expr, $tick:item) => {
        #[async_trait]
        impl ClockDb for $pool {
            async fn read(&self) -> Result<Option<ClockRow>, ClockFault> {
                let row = sqlx::query(&$dialect.sql(READ)).fetch_optional(self).await.map_err(fault)?;
                row.map(|r| {
                    Ok(ClockRow { now_ms: r.try_get("now_ms")?, judge: r.try_get("judge")?, term: r.try_get("term")? })
                })
                .transpose()
                .map_err(fault)
            }

            $tick

            async fn take(&self, judge: &str, seen: &ClockRow) -> Result<Option<i64>, ClockFault> {
                let row = sqlx::query(&$dialect.sql(TAKE))
                    .bind(judge.to_owned())
                    .bind(seen.judge.clone())
                    .bind(seen.term)
                    .bind(seen.now_ms)
                    .fetch_optional(self)
                    .await
                    .map_err(fault)?;
                row.map(|r| r.try_get("term")).transpose().map_err(fault)
            }

            async fn resign(&self, judge: &str, term: i64) -> Result<(), ClockFault> {
                sqlx::query(&$dialect.sql(RESIGN))
                    .bind(judge.to_owned())
                    .bind(term)
                    .execute(self)
                    .await
                    .map(|_| ())
                    .map_err(fault)
            }
        }
    };
}

clock_db!(
    sqlx::PgPool,
    Dialect::Postgres,
    async fn tick(&self, advance_ms: i64, judge: &str, term: i64) -> Result<bool, ClockFault> {
        let row = sqlx::query(TICK)
            .bind(advance_ms)
            .bind(judge.to_owned())
            .bind(term)
            .fetch_optional(self)
            .await
            .map_err(fault)?;
        Ok(row.is_some())
    }
);

clock_db!(
    sqlx::SqlitePool,
    Dialect::Sqlite,
    async fn tick(&self, advance_ms: i64, judge: &str, term: i64) -> Result<bool, ClockFault> {
        static SQL: std::sync::LazyLock<String> =
            std::sync::LazyLock::new(|| dlock_db::sqlite_unflushed_sql(&[(TICK, 3)]));
        let tick = sqlx::query(&SQL).bind(advance_ms).bind(judge.to_owned()).bind(term);
        let parts = dlock_db::sqlite_unflushed(self, tick, 1).await.map_err(fault)?;
        Ok(parts.first().is_some_and(|p| !p.rows.is_empty()))
    }
);

/// Starts this replica's clock task on `db` (a fresh name for this process), measuring on
/// `clock`.
pub(super) fn start(db: impl ClockDb, clock: dlock_rt::Clock) -> std::sync::Arc<ClockJudge> {
    crate::lockdb_clock::start(db, clock, dlock_rt::rand::uuid_v4().to_string())
}

#[cfg(test)]
mod tests {
    //! lockdb's clock on SQLite (PostgreSQL runs the same statements; every PostgreSQL test
    //! whose lease must end needs its judge to tick).

    use dlock_rt::{Clock, Duration};

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
