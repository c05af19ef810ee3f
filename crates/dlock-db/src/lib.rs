//! SQL plumbing shared by every store (paydb and lockdb, PostgreSQL and SQLite).
//!
//! Stores write their SQL once, with PostgreSQL's `$n` placeholders; [`Dialect::sql`] turns
//! them into SQLite's numbered `?n`, which mean the same. Nothing here exists under
//! `cfg(madsim)`: sqlx uses real sockets and threads, so the simulation uses in-memory stores
//! held to the SQL ones by conformance suites.

#![cfg(not(madsim))]

use std::borrow::Cow;
use std::str::FromStr;
use std::time::Duration;

/// Most connections one service opens to one PostgreSQL database.
pub const PG_POOL_CONNECTIONS_MAX: u32 = 16;
/// Most connections one service opens to one SQLite file. One: SQLite has one writer at a
/// time anyway, and a second connection would only wait in SQLite's busy handler, whose
/// sleeps (up to 100 ms each) cost far more under contention than queueing in the pool.
pub const SQLITE_POOL_CONNECTIONS_MAX: u32 = 1;
/// Longest a request waits for a pooled connection.
pub const POOL_ACQUIRE_MS_MAX: u64 = 2_000;
/// Longest SQLite waits for the write lock before answering busy.
pub const SQLITE_BUSY_MS_MAX: u64 = 5_000;

/// The database behind a `--database-url`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Postgres,
    Sqlite,
}

impl Dialect {
    pub fn of_url(url: &str) -> Result<Dialect, String> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Dialect::Postgres)
        } else if url.starts_with("sqlite:") {
            Ok(Dialect::Sqlite)
        } else {
            Err("database url must start with sqlite:// or postgres://".into())
        }
    }

    /// `sql` with its `$n` placeholders in this dialect's spelling.
    pub fn sql(self, sql: &str) -> Cow<'_, str> {
        match self {
            Dialect::Postgres => Cow::Borrowed(sql),
            Dialect::Sqlite => Cow::Owned(sql.replace('$', "?")),
        }
    }
}

/// The file path inside a `sqlite://PATH[?query]` URL (`None` for in-memory databases).
pub fn sqlite_path(url: &str) -> Option<&str> {
    let rest = url.strip_prefix("sqlite://").or_else(|| url.strip_prefix("sqlite:"))?;
    let path = rest.split('?').next().unwrap_or(rest);
    (!path.is_empty() && path != ":memory:").then_some(path)
}

/// Describes a sqlx error without its connection string or bind values (and, should a
/// message ever quote a URL, without that URL's credentials: [`redact_credentials`]).
pub fn describe(e: &sqlx::Error) -> String {
    match e {
        sqlx::Error::Database(db) => {
            redact_credentials(&format!("database error {}: {}", db.code().unwrap_or_default(), db.message()))
        }
        other => redact_credentials(&other.to_string()),
    }
}

/// `text` with the credentials of every URL in it replaced by `***`: the user-info part
/// (`postgres://user:pw@host` becomes `postgres://***@host`) and any `password=` query
/// value. Every message, log line or error that may quote a database URL goes through it.
/// It errs towards hiding: everything between `://` and the last `@` of a word is hidden.
pub fn redact_credentials(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(i) = rest.find("://") {
        let (head, tail) = rest.split_at(i + 3);
        out.push_str(head);
        let word_end =
            tail.find(|c: char| c.is_whitespace() || matches!(c, '"' | '\'' | '`' | '<' | '>')).unwrap_or(tail.len());
        let (word, after) = tail.split_at(word_end);
        let word = match word.rfind('@') {
            Some(at) => format!("***{}", &word[at..]),
            None => word.to_owned(),
        };
        out.push_str(&redact_password_param(&word));
        rest = after;
    }
    out.push_str(rest);
    out
}

/// `word` with the value of every `password=` parameter replaced by `***`.
fn redact_password_param(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    let mut rest = word;
    while let Some(i) = rest.to_ascii_lowercase().find("password=") {
        let (head, tail) = rest.split_at(i + "password=".len());
        out.push_str(head);
        let end = tail.find('&').unwrap_or(tail.len());
        out.push_str("***");
        rest = &tail[end..];
    }
    out.push_str(rest);
    out
}

/// Whether an error means "the database said something we cannot read" rather than
/// "the database could not be reached or refused to decide".
pub fn is_decode_error(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) | sqlx::Error::ColumnNotFound(_))
}

/// Whether a failed `COMMIT` lost its answer: the connection broke (I/O, TLS, protocol,
/// the SQLite worker, SQLite's `SQLITE_IOERR` family) after the commit was sent, so the
/// write may have committed. Every other failure of a commit is a refusal: nothing
/// committed. Every SQL store classifies its commits with this one rule
/// (`StoreFault::CommitUnknown` in `dlock-contract`).
pub fn is_commit_answer_lost(e: &sqlx::Error) -> bool {
    match e {
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) | sqlx::Error::WorkerCrashed => true,
        // SQLITE_IOERR (10) and its extended codes.
        sqlx::Error::Database(db) => {
            db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
                && db.code().unwrap_or_default().parse::<i32>().is_ok_and(|c| c & 0xff == 10)
        }
        _ => false,
    }
}

/// A PostgreSQL pool with the shared bounds.
pub async fn pg_pool(url: &str) -> Result<sqlx::PgPool, sqlx::Error> {
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(PG_POOL_CONNECTIONS_MAX)
        .acquire_timeout(Duration::from_millis(POOL_ACQUIRE_MS_MAX))
        .connect(url)
        .await
}

/// [`pg_pool`] whose sessions give up waiting for a row lock after `lock_timeout_ms`
/// (PostgreSQL's `lock_timeout`, set as a startup parameter: no extra round trip). A
/// statement that waited too long fails with SQLSTATE 55P03 and its transaction rolls back.
pub async fn pg_pool_with_lock_timeout(url: &str, lock_timeout_ms: u64) -> Result<sqlx::PgPool, sqlx::Error> {
    let opts =
        sqlx::postgres::PgConnectOptions::from_str(url)?.options([("lock_timeout", format!("{lock_timeout_ms}ms"))]);
    sqlx::postgres::PgPoolOptions::new()
        .max_connections(PG_POOL_CONNECTIONS_MAX)
        .acquire_timeout(Duration::from_millis(POOL_ACQUIRE_MS_MAX))
        .connect_with(opts)
        .await
}

/// A SQLite pool (WAL, synchronous=FULL, foreign keys on, bounded busy wait), creating
/// the file and its directory when missing.
pub async fn sqlite_pool(url: &str) -> Result<sqlx::SqlitePool, sqlx::Error> {
    if let Some(parent) = sqlite_path(url).and_then(|p| std::path::Path::new(p).parent()) {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent).map_err(sqlx::Error::Io)?;
        }
    }
    let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url)?
        .create_if_missing(true)
        .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
        .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(Duration::from_millis(SQLITE_BUSY_MS_MAX));
    sqlx::sqlite::SqlitePoolOptions::new()
        .max_connections(SQLITE_POOL_CONNECTIONS_MAX)
        .acquire_timeout(Duration::from_millis(POOL_ACQUIRE_MS_MAX + SQLITE_BUSY_MS_MAX))
        .connect_with(opts)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlite_placeholders_keep_their_numbers() {
        assert_eq!(Dialect::Sqlite.sql("a = $1 AND b = $10 OR c = $1"), "a = ?1 AND b = ?10 OR c = ?1");
        assert_eq!(Dialect::Postgres.sql("a = $1"), "a = $1");
    }

    #[test]
    fn sqlite_path_is_read_from_the_url() {
        assert_eq!(sqlite_path("sqlite://dlock-data/paydb.sqlite"), Some("dlock-data/paydb.sqlite"));
        assert_eq!(sqlite_path("sqlite:///tmp/x.db?mode=rwc"), Some("/tmp/x.db"));
        assert_eq!(sqlite_path("sqlite::memory:"), None);
    }

    #[test]
    fn printed_urls_never_carry_their_credentials() {
        let cases = [
            (
                "cannot connect to postgres://u:s3cret@db:5432/paydb: refused",
                "cannot connect to postgres://***@db:5432/paydb: refused",
            ),
            ("postgresql://s3cret@h/x and sqlite://a/b", "postgresql://***@h/x and sqlite://a/b"),
            ("\"postgres://u:p/s3cret@h/db\"", "\"postgres://***@h/db\""),
            (
                "postgres://h/db?user=u&password=s3cret&sslmode=require",
                "postgres://h/db?user=u&password=***&sslmode=require",
            ),
            ("no url here", "no url here"),
        ];
        for (raw, want) in cases {
            assert_eq!(redact_credentials(raw), want);
            assert!(!redact_credentials(raw).contains("s3cret"));
        }
    }

    #[test]
    fn dialect_follows_the_url_scheme() {
        assert_eq!(Dialect::of_url("postgres://u@h/db"), Ok(Dialect::Postgres));
        assert_eq!(Dialect::of_url("sqlite://x"), Ok(Dialect::Sqlite));
        assert!(Dialect::of_url("mysql://x").is_err());
    }

    #[test]
    fn a_commit_whose_connection_broke_lost_its_answer_and_a_refusal_did_not() {
        let broken = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(is_commit_answer_lost(&sqlx::Error::Io(broken)));
        assert!(is_commit_answer_lost(&sqlx::Error::WorkerCrashed));
        assert!(is_commit_answer_lost(&sqlx::Error::Protocol("unexpected message".into())));
        assert!(!is_commit_answer_lost(&sqlx::Error::PoolTimedOut), "no connection: nothing was sent");
        assert!(!is_commit_answer_lost(&sqlx::Error::RowNotFound));
    }
}
