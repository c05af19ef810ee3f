//! Runs the lock store conformance suite (C3 §3.3, L1–L8; the invariants of
//! `dlock_lock_server::store`) against every `LockStore` backend. Today that is the
//! simulation store, which also runs under `--cfg madsim`.

mod conformance;

use std::sync::Arc;

use dlock_lock_server::store::LockStore;
use dlock_lock_server::store_mem::MemLockStore;
use dlock_rt::Clock;

async fn sim() -> (Arc<dyn LockStore>, ()) {
    (Arc::new(MemLockStore::new(Clock::system())), ())
}

lock_store_conformance!(sim_store, sim());

#[cfg(not(madsim))]
async fn sql(db: dlock_testkit::Db) -> (Arc<dyn LockStore>, dlock_testkit::TempDir) {
    let (url, dir) = dlock_testkit::fresh_database(db).await;
    (dlock_lock_server::store_sql::open(&url).await.expect("open lockdb"), dir)
}

#[cfg(not(madsim))]
lock_store_conformance!(sqlite_store, sql(dlock_testkit::Db::Sqlite));
#[cfg(not(madsim))]
lock_store_conformance!(postgres_store, sql(dlock_testkit::Db::Postgres));

/// The suite's runner: a case the machine outran is played again on a fresh store, one the
/// store failed is not, and one outrun on every try fails.
mod runner {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::FutureExt;

    use super::conformance as c;
    use super::sim;

    /// Plays `case` through `run_case`: whether it passed, and how many stores it was given.
    async fn played(case: impl Fn(usize) -> Option<&'static str>) -> (bool, usize) {
        let made = AtomicUsize::new(0);
        let run = c::run_case(
            || {
                made.fetch_add(1, Ordering::SeqCst);
                sim()
            },
            |_store| {
                let failure = case(made.load(Ordering::SeqCst));
                async move {
                    match failure {
                        Some("stalled") => c::stalled("a window closed".into()),
                        Some(other) => panic!("{other}"),
                        None => {}
                    }
                }
            },
        );
        let passed = std::panic::AssertUnwindSafe(run).catch_unwind().await.is_ok();
        (passed, made.load(Ordering::SeqCst))
    }

    #[tokio::test]
    async fn a_case_the_machine_outran_is_played_again_on_a_fresh_store() {
        assert_eq!(played(|store| (store == 1).then_some("stalled")).await, (true, 2));
    }

    #[tokio::test]
    async fn a_case_the_store_failed_is_not_played_again() {
        assert_eq!(played(|_| Some("the store answered wrong")).await, (false, 1));
    }

    #[tokio::test]
    async fn a_case_outrun_on_every_try_fails_after_the_last() {
        assert_eq!(played(|_| Some("stalled")).await, (false, c::STALLED_TRIES_MAX));
    }

    /// A grant by a session the store's own clock shows lapsed ends the case as outrun, not
    /// as a wrong refusal.
    #[tokio::test]
    async fn a_grant_by_a_session_the_store_shows_lapsed_ends_the_case_as_outrun() {
        let (store, ()) = sim().await;
        let s = c::open(&store, "owner-a", c::SHORT_MS).await;
        c::wait_past(&store, s.expires_at_ms).await;
        let taken = std::panic::AssertUnwindSafe(c::grant(&store, "k", &s, c::LONG_MS, 0)).catch_unwind().await;
        let payload = taken.expect_err("a lapsed session's grant is refused");
        assert!(c::is_stalled(&*payload), "not reported as outrun");
    }
}
