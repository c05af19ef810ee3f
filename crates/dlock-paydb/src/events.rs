//! paydb's event outbox (C3-extensions E-20): the `events` table in memory ([`MemEvents`])
//! and, outside the simulation, its reads, the store-written `fence.refused` event and the
//! retention purge on PostgreSQL and SQLite ([`sql`]).
//!
//! On SQL the events are written by triggers (`migrations/paydb/*/20261207100000_create_events.sql`),
//! in the transaction of the change each describes; in memory, by the table methods that
//! make the change ([`MemEvents::emit`], under the one mutex), with the same kinds and
//! bodies. The conformance suites hold the two to one sequence.
//!
//! Invariants:
//! - `seq` is unique and never reused; in memory and on SQLite it is commit order;
//! - a read ([`EventRead`]) returns only *final* seqs: every seq up to its `head` is either
//!   returned, purged, or will never exist. On PostgreSQL a seq may be drawn by a
//!   transaction still in flight while a later one is already visible; the reader then
//!   stops below the hole until every transaction that was in flight when it first saw the
//!   hole has ended ([`sql::PgEventReader`]);
//! - the purge keeps the newest `keep` events and records the highest seq it deleted
//!   (`purged_through`), so a cursor below it is known to be expired.

use std::collections::VecDeque;

/// paydb's stream name: the prefix of its event ids (`paydb/<seq>`).
pub const STREAM: &str = "paydb";

use chrono::{DateTime, Utc};
use dlock_contract::stream::{EventKind, StoredEvent};

/// What one read of the outbox returned (the contract's, shared with lockdb).
pub use dlock_contract::stream::EventRead;

/// paydb's `events` and `event_retention` tables in memory.
#[derive(Debug, Default, Clone)]
pub struct MemEvents {
    rows: VecDeque<StoredEvent>,
    last_seq: i64,
    purged_through: i64,
    /// What the purge deleted, in seq order: not a table (a purged row is gone for every
    /// reader), kept so the simulation's checkers can judge a stream against every event
    /// ever written ([`MemEvents::history`]).
    purged: Vec<StoredEvent>,
}

impl MemEvents {
    /// Appends one event with the next seq (the caller holds paydb's mutex: this is a write
    /// of the transaction it is in).
    pub fn emit(
        &mut self,
        kind: EventKind,
        at: DateTime<Utc>,
        account_id: Option<&str>,
        payout_id: Option<String>,
        body: serde_json::Value,
    ) {
        self.last_seq += 1;
        self.rows.push_back(StoredEvent {
            seq: self.last_seq,
            kind,
            at,
            account_id: account_id.map(str::to_owned),
            payout_id,
            lock_key: None,
            body,
        });
    }

    /// The events after `after`, at most `limit` (every committed seq is final in memory).
    pub fn read(&self, after: i64, limit: usize) -> EventRead {
        let start = self.rows.partition_point(|e| e.seq <= after);
        let events: Vec<StoredEvent> = self.rows.iter().skip(start).take(limit).cloned().collect();
        let head = match events.last() {
            Some(e) if events.len() == limit => e.seq,
            _ => self.last_seq.max(after),
        };
        EventRead { events, head, purged_through: self.purged_through }
    }

    /// Deletes all but the newest `keep` events; returns how many it deleted.
    pub fn purge(&mut self, keep: i64) -> u64 {
        let keep = usize::try_from(keep.max(0)).unwrap_or(usize::MAX);
        let mut n = 0;
        while self.rows.len() > keep {
            if let Some(e) = self.rows.pop_front() {
                self.purged_through = self.purged_through.max(e.seq);
                self.purged.push(e);
                n += 1;
            }
        }
        n
    }

    /// Every event kept, in seq order (the simulation's checkers read the table itself).
    pub fn rows(&self) -> impl Iterator<Item = &StoredEvent> {
        self.rows.iter()
    }

    /// Every event ever written, the purged ones included, in seq order.
    pub fn history(&self) -> impl Iterator<Item = &StoredEvent> {
        self.purged.iter().chain(self.rows.iter())
    }

    pub fn last_seq(&self) -> i64 {
        self.last_seq
    }
}

/// The body of a `fence.refused` event: a fenced write refused because its token was not
/// strictly greater than the one stored (the refusal changed nothing, so the store writes
/// this event in a transaction of its own).
pub fn fence_refused_body(
    operation: &str,
    presented_token: i64,
    fence: i64,
    owner_id: &str,
    payout_ids: &[String],
) -> serde_json::Value {
    serde_json::json!({
        "operation": operation,
        "presentedToken": presented_token,
        "fence": fence,
        "ownerId": owner_id,
        "payoutIds": payout_ids,
    })
}

#[cfg(not(madsim))]
pub mod sql {
    //! The outbox on PostgreSQL and SQLite.

    use std::sync::Mutex;

    use chrono::{DateTime, Utc};
    use dlock_contract::stream::{EventKind, StoredEvent};
    use sqlx::Row;

    use super::EventRead;
    use crate::sql::{commit_error, db_error};
    use crate::StoreError;

    const READ_SQL: &str =
        "SELECT seq, kind, at, account_id, payout_id, body FROM events WHERE seq > $1 ORDER BY seq LIMIT $2";
    const SQLITE_READ_SQL: &str =
        "SELECT seq, kind, at, account_id, payout_id, body FROM events WHERE seq > ?1 ORDER BY seq LIMIT ?2";
    const PURGED_SQL: &str = "SELECT purged_through FROM event_retention WHERE id = 1";
    const INSERT_SQL: &str = "INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ($1, $2, $3, $4, $5)";
    const SQLITE_INSERT_SQL: &str =
        "INSERT INTO events (kind, at, account_id, payout_id, body) VALUES (?1, ?2, ?3, ?4, ?5)";

    fn event_of(
        seq: i64,
        kind: &str,
        at: DateTime<Utc>,
        account_id: Option<String>,
        payout_id: Option<String>,
        body: &str,
    ) -> Result<StoredEvent, StoreError> {
        let kind =
            EventKind::parse(kind).ok_or_else(|| StoreError::Corrupt(format!("events: unknown kind {kind:?}")))?;
        let body = serde_json::from_str(body).map_err(|e| StoreError::Corrupt(format!("events: body: {e}")))?;
        Ok(StoredEvent { seq, kind, at, account_id, payout_id, lock_key: None, body })
    }

    /// One `events` row (of either database) as a [`StoredEvent`].
    macro_rules! event_of_row {
        ($r:expr) => {{
            let r = $r;
            event_of(
                r.try_get("seq").map_err(db_error)?,
                r.try_get::<String, _>("kind").map_err(db_error)?.as_str(),
                r.try_get("at").map_err(db_error)?,
                r.try_get("account_id").map_err(db_error)?,
                r.try_get("payout_id").map_err(db_error)?,
                r.try_get::<String, _>("body").map_err(db_error)?.as_str(),
            )
        }};
    }

    /// The generic hole logic, shared with lockdb's reader (`dlock_db::events`).
    pub use dlock_db::events::{walk, Snapshot};

    /// A hole the reader saw below a visible seq: the transactions in flight at that read.
    #[derive(Debug, Clone, PartialEq, Eq)]
    struct Hole {
        /// Holes below this seq (the highest one that read saw) are covered.
        below: i64,
        in_flight: Vec<u64>,
    }

    /// The PostgreSQL reader of one stream: remembers the hole it waits on.
    #[derive(Debug, Default)]
    pub struct PgEventReader {
        hole: Mutex<Option<Hole>>,
    }

    impl PgEventReader {
        pub fn new() -> PgEventReader {
            PgEventReader::default()
        }

        /// The final events after `after` (at most `limit`), with the head and the purge mark:
        /// one REPEATABLE READ transaction reads the snapshot, the rows and the mark.
        pub async fn read(&self, pool: &sqlx::PgPool, after: i64, limit: usize) -> Result<EventRead, StoreError> {
            let mut tx = pool.begin().await.map_err(db_error)?;
            sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
            let snap: String =
                sqlx::query_scalar("SELECT pg_current_snapshot()::text").fetch_one(&mut *tx).await.map_err(db_error)?;
            let snap = Snapshot::parse(&snap).ok_or_else(|| StoreError::Corrupt(format!("snapshot {snap:?}")))?;
            let rows = sqlx::query(READ_SQL)
                .bind(after)
                .bind(i64::try_from(limit).unwrap_or(i64::MAX))
                .fetch_all(&mut *tx)
                .await
                .map_err(db_error)?;
            let purged_through: i64 = sqlx::query_scalar(PURGED_SQL).fetch_one(&mut *tx).await.map_err(db_error)?;
            tx.commit().await.map_err(db_error)?;
            let seqs: Vec<i64> =
                rows.iter().map(|r| r.try_get::<i64, _>("seq")).collect::<Result<_, _>>().map_err(db_error)?;
            let mut hole = self.hole.lock().map_err(|_| StoreError::Corrupt("events reader poisoned".into()))?;
            let max_seen = seqs.last().copied().unwrap_or(after);
            let (n, head) = walk(after.max(purged_through), &seqs, |_from, to| {
                // A hole is passable once every transaction in flight at the read that first
                // saw it (with a seq above it visible) has ended: a filler of the hole drew
                // its seq before that visible one, so it was one of them.
                hole.as_ref().is_some_and(|h| to <= h.below && h.in_flight.iter().all(|&x| !snap.in_progress(x)))
            });
            if let Some(&next) = seqs.get(n) {
                // Waiting on the hole below `next`: remember who could fill it, unless a
                // remembered read already covers it.
                if hole.as_ref().is_none_or(|h| next > h.below) {
                    *hole = Some(Hole { below: max_seen, in_flight: snap.xip.clone() });
                }
            } else {
                *hole = None;
            }
            drop(hole);
            let events = rows
                .iter()
                .take(n)
                .map(|r| -> Result<StoredEvent, StoreError> { event_of_row!(r) })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(EventRead { events, head: head.max(after), purged_through })
        }
    }

    /// PostgreSQL: the events in `(after, upto]`, at most `limit`, where every seq at or below
    /// `upto` is already known final (a hub read it so): one statement, no hole to wait on.
    pub async fn pg_read_final(
        pool: &sqlx::PgPool,
        after: i64,
        upto: i64,
        limit: usize,
    ) -> Result<EventRead, StoreError> {
        let mut tx = pool.begin().await.map_err(db_error)?;
        let rows = sqlx::query(
            "SELECT seq, kind, at, account_id, payout_id, body FROM events WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3",
        )
        .bind(after)
        .bind(upto)
        .bind(i64::try_from(limit).unwrap_or(i64::MAX))
        .fetch_all(&mut *tx)
        .await
        .map_err(db_error)?;
        let purged_through: i64 = sqlx::query_scalar(PURGED_SQL).fetch_one(&mut *tx).await.map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        let events = rows
            .iter()
            .map(|r| -> Result<StoredEvent, StoreError> { event_of_row!(r) })
            .collect::<Result<Vec<_>, _>>()?;
        let head = match events.last() {
            Some(e) if events.len() == limit => e.seq,
            _ => upto.max(after),
        };
        Ok(EventRead { events, head, purged_through })
    }

    /// SQLite: the events after `after` (one writer: every committed seq is final).
    pub async fn sqlite_read(pool: &sqlx::SqlitePool, after: i64, limit: usize) -> Result<EventRead, StoreError> {
        let mut tx = pool.begin().await.map_err(db_error)?;
        let rows = sqlx::query(SQLITE_READ_SQL)
            .bind(after)
            .bind(i64::try_from(limit).unwrap_or(i64::MAX))
            .fetch_all(&mut *tx)
            .await
            .map_err(db_error)?;
        let purged_through: i64 = sqlx::query_scalar(PURGED_SQL).fetch_one(&mut *tx).await.map_err(db_error)?;
        let last: Option<i64> =
            sqlx::query_scalar("SELECT MAX(seq) FROM events").fetch_one(&mut *tx).await.map_err(db_error)?;
        tx.commit().await.map_err(db_error)?;
        let events = rows
            .iter()
            .map(|r| -> Result<StoredEvent, StoreError> { event_of_row!(r) })
            .collect::<Result<Vec<_>, _>>()?;
        let head = match events.last() {
            Some(e) if events.len() == limit => e.seq,
            _ => last.unwrap_or(0).max(after),
        };
        Ok(EventRead { events, head, purged_through })
    }

    /// PostgreSQL: writes one store-written event (`fence.refused`) in a transaction of its
    /// own. The transaction takes its xid before it draws the seq, so a reader that sees a
    /// later seq first knows this one is in flight ([`PgEventReader`]).
    pub async fn pg_insert(
        pool: &sqlx::PgPool,
        kind: EventKind,
        at: DateTime<Utc>,
        account_id: Option<&str>,
        payout_id: Option<&str>,
        body: &serde_json::Value,
    ) -> Result<(), StoreError> {
        let mut tx = pool.begin().await.map_err(db_error)?;
        sqlx::query("SELECT pg_current_xact_id()").execute(&mut *tx).await.map_err(db_error)?;
        sqlx::query(INSERT_SQL)
            .bind(kind.as_str())
            .bind(at)
            .bind(account_id)
            .bind(payout_id)
            .bind(body.to_string())
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(commit_error)
    }

    /// SQLite: as [`pg_insert`].
    pub async fn sqlite_insert(
        pool: &sqlx::SqlitePool,
        kind: EventKind,
        at: DateTime<Utc>,
        account_id: Option<&str>,
        payout_id: Option<&str>,
        body: &serde_json::Value,
    ) -> Result<(), StoreError> {
        sqlx::query(SQLITE_INSERT_SQL)
            .bind(kind.as_str())
            .bind(at)
            .bind(account_id)
            .bind(payout_id)
            .bind(body.to_string())
            .execute(pool)
            .await
            .map_err(db_error)?;
        Ok(())
    }

    /// The `paydb_secrets` row of the P1 cursor key, which the event stream's cursors are
    /// signed with too (under their own tag): read and written by the payment-resource's
    /// and the rail-proxy's SQL stores alike, through [`pg_cursor_secret`] and
    /// [`sqlite_cursor_secret`].
    pub const CURSOR_SECRET_NAME: &str = "p1-cursor";

    /// The stored key: 64 hex digits, or [`StoreError::Corrupt`].
    pub fn parse_secret(raw: &str) -> Result<[u8; 32], StoreError> {
        let mut out = [0u8; 32];
        let bytes = raw.as_bytes();
        if bytes.len() != 64 {
            return Err(StoreError::Corrupt(format!(
                "{CURSOR_SECRET_NAME} secret is {} hex digits, not 64",
                bytes.len()
            )));
        }
        for (i, pair) in bytes.chunks(2).enumerate() {
            let hex = std::str::from_utf8(pair).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
            out[i] = hex.ok_or_else(|| StoreError::Corrupt(format!("bad {CURSOR_SECRET_NAME} secret")))?;
        }
        Ok(out)
    }

    fn hex_of(bytes: &[u8; 32]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The deployment's cursor key on one database (`$pool`, its placeholders `$p1`…`$p3`):
    /// `candidate` is written if no key is, and the stored one answered (the first candidate
    /// wins; every replica reads it).
    macro_rules! cursor_secret {
        ($(#[$doc:meta])* $name:ident, $pool:ty, $p1:literal, $p2:literal, $p3:literal) => {
            $(#[$doc])*
            pub async fn $name(pool: &$pool, candidate: [u8; 32], at: DateTime<Utc>) -> Result<[u8; 32], StoreError> {
                let mut tx = pool.begin().await.map_err(db_error)?;
                sqlx::query(concat!(
                    "INSERT INTO paydb_secrets (name, secret_hex, created_at) VALUES (",
                    $p1, ", ", $p2, ", ", $p3, ") ON CONFLICT (name) DO NOTHING"
                ))
                .bind(CURSOR_SECRET_NAME)
                .bind(hex_of(&candidate))
                .bind(at)
                .execute(&mut *tx)
                .await
                .map_err(db_error)?;
                let stored: String =
                    sqlx::query_scalar(concat!("SELECT secret_hex FROM paydb_secrets WHERE name = ", $p1))
                        .bind(CURSOR_SECRET_NAME)
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db_error)?;
                tx.commit().await.map_err(commit_error)?;
                parse_secret(&stored)
            }
        };
    }

    cursor_secret!(
        /// PostgreSQL: the deployment's cursor key (the first candidate written wins).
        pg_cursor_secret, sqlx::PgPool, "$1", "$2", "$3"
    );
    cursor_secret!(
        /// SQLite: as [`pg_cursor_secret`].
        sqlite_cursor_secret, sqlx::SqlitePool, "?1", "?2", "?3"
    );

    /// The purge's statements: the mark first (the highest seq it deletes), then the rows.
    const PG_PURGE_MARK_SQL: &str = "UPDATE event_retention SET purged_through = GREATEST(purged_through, \
         COALESCE((SELECT seq FROM events ORDER BY seq DESC OFFSET $1 LIMIT 1), 0)) WHERE id = 1 RETURNING purged_through";
    const SQLITE_PURGE_MARK_SQL: &str = "UPDATE event_retention SET purged_through = MAX(purged_through, \
         COALESCE((SELECT seq FROM events ORDER BY seq DESC LIMIT 1 OFFSET ?1), 0)) WHERE id = 1 RETURNING purged_through";

    /// PostgreSQL: keeps the newest `keep` events, in one transaction; returns how many it
    /// deleted.
    pub async fn pg_purge(pool: &sqlx::PgPool, keep: i64) -> Result<u64, StoreError> {
        let mut tx = pool.begin().await.map_err(db_error)?;
        let through: i64 =
            sqlx::query_scalar(PG_PURGE_MARK_SQL).bind(keep).fetch_one(&mut *tx).await.map_err(db_error)?;
        let n = sqlx::query("DELETE FROM events WHERE seq <= $1")
            .bind(through)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(commit_error)?;
        Ok(n.rows_affected())
    }

    /// SQLite: as [`pg_purge`].
    pub async fn sqlite_purge(pool: &sqlx::SqlitePool, keep: i64) -> Result<u64, StoreError> {
        let mut tx = pool.begin().await.map_err(db_error)?;
        let through: i64 =
            sqlx::query_scalar(SQLITE_PURGE_MARK_SQL).bind(keep).fetch_one(&mut *tx).await.map_err(db_error)?;
        let n = sqlx::query("DELETE FROM events WHERE seq <= ?1")
            .bind(through)
            .execute(&mut *tx)
            .await
            .map_err(db_error)?;
        tx.commit().await.map_err(commit_error)?;
        Ok(n.rows_affected())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn emit(m: &mut MemEvents, n: usize) {
        for _ in 0..n {
            m.emit(EventKind::PayoutCreated, DateTime::<Utc>::UNIX_EPOCH, Some("a"), None, serde_json::json!({}));
        }
    }

    #[test]
    fn memory_reads_in_seq_order_and_pages_with_a_final_head() {
        let mut m = MemEvents::default();
        emit(&mut m, 5);
        let r = m.read(0, 2);
        assert_eq!(r.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2]);
        assert_eq!(r.head, 2);
        let r = m.read(2, 10);
        assert_eq!(r.events.len(), 3);
        assert_eq!(r.head, 5);
        assert_eq!(m.read(5, 10).head, 5);
    }

    #[test]
    fn a_purge_keeps_the_newest_and_marks_what_it_deleted_and_never_reuses_a_seq() {
        let mut m = MemEvents::default();
        emit(&mut m, 5);
        assert_eq!(m.purge(2), 3);
        let r = m.read(0, 10);
        assert_eq!(r.purged_through, 3);
        assert_eq!(r.events.first().map(|e| e.seq), Some(4));
        emit(&mut m, 1);
        assert_eq!(m.read(5, 10).events.first().map(|e| e.seq), Some(6));
    }
}
