//! Test support shared by every crate's tests.
//!
//! - [`pg_database`]: a fresh, empty PostgreSQL database per test, created from the admin
//!   URL in `DLOCK_TEST_PG_URL` (`scripts/test.sh` starts a throwaway server and sets it).
//!   A missing variable fails the test loudly: a PostgreSQL test never passes by skipping.
//! - [`sqlite_url`]: a fresh SQLite file in a fresh temp directory.
//! - [`fake_service`]: a scripted fake HTTP peer for the client crates' tests.
//! - [`certs`]: CAs and certificates made in the test, for the TLS tests (normal cfg only).
//! - [`auth`]: the credentials every harness carries (authentication stays on in tests).
//! - [`browser`]: a headless Chromium driven through the DevTools protocol (normal cfg only).

pub mod auth;
#[cfg(not(madsim))]
pub mod browser;
#[cfg(not(madsim))]
pub mod certs;
pub mod fake_service;

/// Bound on waiting for a service's event stream to publish events a test wrote.
pub const EVENTS_PUBLISHED_MS_MAX: u64 = 10_000;

/// Polls `page()`, a `GET /v1/events/recent` answer (C3-extensions E-20), until it lists at
/// least `n` events, at most [`EVENTS_PUBLISHED_MS_MAX`]: then the events a test wrote are
/// at or below the head the service's stream has published, so a snapshot taken next
/// watermarks past them. Whether they were published in time.
pub async fn events_published<F, Fut>(n: usize, page: F) -> bool
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = serde_json::Value>,
{
    let step = dlock_rt::Duration::from_millis(20);
    let bound = dlock_rt::Duration::from_millis(EVENTS_PUBLISHED_MS_MAX);
    let page = &page;
    dlock_rt::wait_until(step, bound, || async move {
        page().await["events"].as_array().is_some_and(|e| e.len() >= n).then_some(())
    })
    .await
    .is_some()
}

use std::path::PathBuf;

/// Environment variable naming the admin URL of the test PostgreSQL server.
pub const PG_URL_ENV: &str = "DLOCK_TEST_PG_URL";

/// The admin URL of the test PostgreSQL server.
///
/// # Panics
/// When `DLOCK_TEST_PG_URL` is unset: run the suite with `./scripts/test.sh`.
pub fn pg_admin_url() -> String {
    match std::env::var(PG_URL_ENV) {
        Ok(u) if !u.is_empty() => u,
        _ => panic!(
            "{PG_URL_ENV} is not set. PostgreSQL tests need a server: run ./scripts/test.sh, \
             which starts one, or export {PG_URL_ENV}=postgres://user@127.0.0.1:PORT/postgres"
        ),
    }
}

/// Creates a fresh database on the test server and returns its URL.
#[cfg(not(madsim))]
pub async fn pg_database() -> String {
    pg_database_on(&pg_admin_url()).await
}

/// Creates a fresh database on the server at `admin` and returns its URL.
#[cfg(not(madsim))]
pub async fn pg_database_on(admin: &str) -> String {
    use sqlx::Connection;
    let admin = admin.to_owned();
    let name = format!("dlock_test_{}", uuid::Uuid::new_v4().simple());
    let mut conn = sqlx::PgConnection::connect(&admin).await.expect("connect to the test PostgreSQL server");
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("create test database");
    let _ = conn.close().await;
    replace_db_name(&admin, &name)
}

/// `postgres://u@h:p/old?x` with the database name swapped.
pub fn replace_db_name(url: &str, name: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(slash) => &base[..scheme_end + slash],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{name}?{q}"),
        None => format!("{base}/{name}"),
    }
}

/// Settings shared by the benches.
pub mod bench {
    /// A count from the environment, or `default`.
    pub fn env_usize(name: &str, default: usize) -> usize {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    /// The PostgreSQL server a bench may use: `DLOCK_BENCH_PG_URL`, else `DLOCK_TEST_PG_URL`.
    pub fn pg_admin_url() -> Option<String> {
        std::env::var("DLOCK_BENCH_PG_URL").or_else(|_| std::env::var(super::PG_URL_ENV)).ok().filter(|u| !u.is_empty())
    }
}

/// Every `.rs` file under `dir`, in path order, skipping `target` and hidden directories
/// (the repository checks read the sources through it).
pub fn rust_files(dir: &std::path::Path) -> Vec<PathBuf> {
    fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        let mut entries: Vec<PathBuf> = entries.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            let hidden = p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.'));
            if p.is_dir() && !p.ends_with("target") && !hidden {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, &mut out);
    out
}

/// A scratch directory, removed when dropped.
#[derive(Debug)]
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("dlock-{tag}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("create temp dir");
        TempDir(dir)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A fresh SQLite URL inside `dir`.
pub fn sqlite_url(dir: &TempDir) -> String {
    format!("sqlite://{}", dir.path().join("paydb.sqlite").display())
}

/// Which real database a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// A fresh database of `kind`; the returned dir keeps a SQLite file alive.
#[cfg(not(madsim))]
pub async fn fresh_database(kind: Db) -> (String, TempDir) {
    let dir = TempDir::new("db");
    let url = match kind {
        Db::Sqlite => sqlite_url(&dir),
        Db::Postgres => pg_database().await,
    };
    (url, dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_name_is_swapped_in_place() {
        assert_eq!(replace_db_name("postgres://p@127.0.0.1:5/postgres", "t1"), "postgres://p@127.0.0.1:5/t1");
        assert_eq!(
            replace_db_name("postgres://p@h:5/postgres?sslmode=disable", "t1"),
            "postgres://p@h:5/t1?sslmode=disable"
        );
        assert_eq!(replace_db_name("postgres://p@h:5", "t1"), "postgres://p@h:5/t1");
    }
}
