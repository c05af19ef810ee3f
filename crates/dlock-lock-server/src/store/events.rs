//! lockdb's event outbox (C3-extensions E-20): what each lock operation records, and the
//! outbox in memory ([`MemOutbox`]).
//!
//! Every backend writes an operation's events in the same atomic step as the change they
//! describe, so a crash can neither lose one nor leave one for a change that did not commit:
//! - **SQL**: triggers (`migrations/lockdb/*/20261207110000_create_events.sql`) on the rows
//!   the store already writes; no statement and no round trip is added to any operation;
//! - **etcd**: one record `P/e/{id}` per txn holding the txn's events in order, put in the
//!   txn of the change (`store_etcd`, "Events");
//! - **memory**: [`MemOutbox::emit`] under the store's one mutex.
//!
//! What is recorded, identically on every backend (the conformance suites hold them to one
//! sequence):
//! | operation | events, in order |
//! |---|---|
//! | open a session | `session.opened` |
//! | acquire | `lock.expired` of a dead grant it removes, then `lock.granted` |
//! | renew | `lock.renewed` |
//! | release | `lock.released` |
//! | rotate | `lock.released` of the old token, then `lock.granted` of the fresh one |
//! | close a session | per grant, by key: `lock.expired` (it had died) or `lock.released` |
//! | revoke | `lock.revoked` (with the new token floor) |
//! | reap | per lapsed session: its grants' `lock.expired`, then `session.expired`; then `lock.expired` of each grant whose lease lapsed |
//!
//! A refused operation changes nothing and records nothing; a heartbeat, a session's close
//! and its forgetting after retention record nothing.
//!
//! Invariants:
//! - `seq` is unique, never reused, and commit order; a read returns only final seqs (every
//!   seq up to its `head` is returned, purged, or will never exist);
//! - a body is a JSON object with camelCase keys: `key`, `token`, `sessionId`, `ownerId` for a
//!   grant (and `newTokenFloor`, `revocationId`, `operator`, `reason` for a revoke);
//!   `sessionId`, `ownerId` (and `ttlMs` when opened) for a session;
//! - the purge keeps the newest `keep` events (on etcd, whole txns: at least `keep`) and
//!   records the highest seq it deleted;
//! - in memory, what the purge deleted stays behind the table ([`MemOutbox::history`]):
//!   gone for every reader, kept so the simulation can judge a stream against every event
//!   ever written, as paydb's outbox does (`dlock_paydb::events::MemEvents::history`).

/// lockdb's stream name: the prefix of its event ids (`lockdb/<seq>`).
pub const STREAM: &str = "lockdb";
use std::collections::VecDeque;

use chrono::{DateTime, Utc};
use dlock_contract::stream::{EventKind, EventRead, StoredEvent};
use serde_json::json;
use uuid::Uuid;

/// One event as an operation records it, before the store gives it a seq.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockEventRecord {
    pub kind: EventKind,
    pub lock_key: Option<String>,
    pub body: serde_json::Value,
}

impl LockEventRecord {
    /// An event about the grant `(key, token)` of `session_id` (owned by `owner_id`).
    pub fn grant(kind: EventKind, key: &str, token: i64, session_id: Uuid, owner_id: &str) -> LockEventRecord {
        assert!(kind.is_lock() && kind != EventKind::LockRevoked, "{} is no plain grant event", kind.as_str());
        LockEventRecord { kind, lock_key: Some(key.to_owned()), body: grant_body(key, token, session_id, owner_id) }
    }

    /// `lock.revoked`: the live grant `(key, token)` revoked, the floor raised to `floor`.
    pub fn revoked(
        key: &str,
        token: i64,
        (session_id, owner_id): (Uuid, &str),
        floor: i64,
        (revocation_id, operator, reason): (Uuid, &str, &str),
    ) -> LockEventRecord {
        let mut body = grant_body(key, token, session_id, owner_id);
        if let Some(o) = body.as_object_mut() {
            o.insert("newTokenFloor".into(), json!(floor));
            o.insert("revocationId".into(), json!(revocation_id.to_string()));
            o.insert("operator".into(), json!(operator));
            o.insert("reason".into(), json!(reason));
        }
        LockEventRecord { kind: EventKind::LockRevoked, lock_key: Some(key.to_owned()), body }
    }

    pub fn session_opened(session_id: Uuid, owner_id: &str, ttl_ms: i64) -> LockEventRecord {
        LockEventRecord {
            kind: EventKind::SessionOpened,
            lock_key: None,
            body: json!({ "sessionId": session_id.to_string(), "ownerId": owner_id, "ttlMs": ttl_ms }),
        }
    }

    pub fn session_expired(session_id: Uuid, owner_id: &str) -> LockEventRecord {
        LockEventRecord {
            kind: EventKind::SessionExpired,
            lock_key: None,
            body: json!({ "sessionId": session_id.to_string(), "ownerId": owner_id }),
        }
    }

    /// The stored event, with its seq and instant.
    pub fn stored(self, seq: i64, at: DateTime<Utc>) -> StoredEvent {
        StoredEvent {
            seq,
            kind: self.kind,
            at,
            account_id: None,
            payout_id: None,
            lock_key: self.lock_key,
            body: self.body,
        }
    }
}

fn grant_body(key: &str, token: i64, session_id: Uuid, owner_id: &str) -> serde_json::Value {
    json!({ "key": key, "token": token, "sessionId": session_id.to_string(), "ownerId": owner_id })
}

/// Whether a grant removed without release or revoke had died (`lock.expired`) or was live
/// (`lock.released`, a close's release).
pub fn removal_kind(died: bool) -> EventKind {
    if died {
        EventKind::LockExpired
    } else {
        EventKind::LockReleased
    }
}

/// lockdb's `events` and `event_retention` in memory: seqs from 1, in commit order (the
/// caller holds the store's mutex).
#[derive(Debug, Default, Clone)]
pub struct MemOutbox {
    rows: VecDeque<StoredEvent>,
    last_seq: i64,
    purged_through: i64,
    /// What the purge deleted, in seq order: not a table (a purged row is gone for every
    /// reader), kept for [`MemOutbox::history`].
    purged: Vec<StoredEvent>,
}

impl MemOutbox {
    /// Appends `e` with the next seq: a write of the transaction the caller is in.
    pub fn emit(&mut self, e: LockEventRecord, at: DateTime<Utc>) {
        self.last_seq += 1;
        self.rows.push_back(e.stored(self.last_seq, at));
    }

    /// The events after `after`, at most `limit` (every seq in memory is final).
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

    /// Every event ever written, the purged ones included, in seq order (the simulation's
    /// ground truth for the lock server's stream; no reader of the outbox sees a purged one).
    pub fn history(&self) -> impl Iterator<Item = &StoredEvent> {
        self.purged.iter().chain(self.rows.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_pages_with_a_final_head_and_a_purge_never_reuses_a_seq() {
        let mut m = MemOutbox::default();
        for _ in 0..5 {
            m.emit(LockEventRecord::session_opened(Uuid::nil(), "o", 1), DateTime::<Utc>::UNIX_EPOCH);
        }
        let r = m.read(0, 2);
        assert_eq!((r.events.iter().map(|e| e.seq).collect::<Vec<_>>(), r.head), (vec![1, 2], 2));
        assert_eq!(m.read(2, 10).head, 5);
        assert_eq!(m.purge(2), 3);
        assert_eq!(m.read(0, 10).purged_through, 3);
        m.emit(LockEventRecord::session_expired(Uuid::nil(), "o"), DateTime::<Utc>::UNIX_EPOCH);
        assert_eq!(m.read(5, 10).events.first().map(|e| e.seq), Some(6));
    }

    #[test]
    fn the_history_keeps_every_event_ever_written_in_seq_order_though_readers_lose_the_purged() {
        let mut m = MemOutbox::default();
        for _ in 0..4 {
            m.emit(LockEventRecord::session_opened(Uuid::nil(), "o", 1), DateTime::<Utc>::UNIX_EPOCH);
        }
        assert_eq!(m.purge(1), 3);
        m.emit(LockEventRecord::session_expired(Uuid::nil(), "o"), DateTime::<Utc>::UNIX_EPOCH);
        assert_eq!(m.history().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3, 4, 5]);
        assert_eq!(m.history().last().map(|e| e.kind), Some(EventKind::SessionExpired));
        assert_eq!(m.read(0, 10).events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![4, 5]);
    }
}
