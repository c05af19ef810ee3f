//! The event stream's wire vocabulary (C3-extensions E-20, `GET /v1/events`): the event
//! kinds, the stored event, the filter, and the named bounds every service applies.
//!
//! A service streams the events of its store (paydb for the payment-resource and the
//! rail-proxy, lockdb for the lock server), each written in the transaction of the change
//! it describes, in the order the store committed them ([`StoredEvent::seq`]). Delivery is
//! at least once; a client deduplicates by [`WireEvent::event_id`].
//!
//! Invariants:
//! - a kind's wire name is stable and parses back ([`EventKind::parse`]); the two control
//!   kinds ([`ControlKind`]) are never stored;
//! - a filter is canonical ([`EventFilter::canonical`]): two filters that select the same
//!   events have one form, which a cursor binds.

use std::collections::BTreeSet;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The store-written event kinds. paydb's are written by triggers
/// (`migrations/paydb/*/20261207100000_create_events.sql`), `fence.refused` by the
/// payment-resource's store in a transaction of its own, `reconciler.finding` by the
/// reconciler in the transaction that records its findings. lockdb's ([`EventKind::is_lock`])
/// are written in the transaction of the change: by triggers on SQL
/// (`migrations/lockdb/*/20261207110000_create_events.sql`), in the change's txn on etcd,
/// under the store's lock in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum EventKind {
    AccountCreated,
    PayoutCreated,
    PayoutStateChanged,
    FenceRaised,
    FenceRefused,
    RailMarkRaised,
    RailIntent,
    RailRefused,
    RailOutcome,
    OperatorResolution,
    /// A grant: an acquire, or the acquire half of a rotate.
    LockGranted,
    /// A live grant's lease extended (its token unchanged).
    LockRenewed,
    /// A live grant released: by its holder, by a rotate's release half, or by its
    /// session's close.
    LockReleased,
    /// A dead grant removed: taken over by an acquire, or reaped, after its lease or its
    /// session lapsed.
    LockExpired,
    /// A live grant revoked by an operator; the body carries the new token floor.
    LockRevoked,
    SessionOpened,
    /// A lapsed session marked expired by the reaper (its grants expire with it).
    SessionExpired,
    /// A reconciliation run found a problem that the last recorded run had not (`status`
    /// `open`), or no longer finds one it had recorded (`cleared`). Written by the
    /// reconciler in the transaction that records its findings in paydb.
    ReconcilerFinding,
}

impl EventKind {
    /// Every kind, in wire order.
    pub const ALL: [EventKind; 18] = [
        EventKind::AccountCreated,
        EventKind::PayoutCreated,
        EventKind::PayoutStateChanged,
        EventKind::FenceRaised,
        EventKind::FenceRefused,
        EventKind::RailMarkRaised,
        EventKind::RailIntent,
        EventKind::RailRefused,
        EventKind::RailOutcome,
        EventKind::OperatorResolution,
        EventKind::LockGranted,
        EventKind::LockRenewed,
        EventKind::LockReleased,
        EventKind::LockExpired,
        EventKind::LockRevoked,
        EventKind::SessionOpened,
        EventKind::SessionExpired,
        EventKind::ReconcilerFinding,
    ];

    /// The wire name (the `kind` column, the SSE `event:` field).
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::AccountCreated => "account.created",
            EventKind::PayoutCreated => "payout.created",
            EventKind::PayoutStateChanged => "payout.state_changed",
            EventKind::FenceRaised => "fence.raised",
            EventKind::FenceRefused => "fence.refused",
            EventKind::RailMarkRaised => "rail.mark_raised",
            EventKind::RailIntent => "rail.intent",
            EventKind::RailRefused => "rail.refused",
            EventKind::RailOutcome => "rail.outcome",
            EventKind::OperatorResolution => "operator.resolution",
            EventKind::LockGranted => "lock.granted",
            EventKind::LockRenewed => "lock.renewed",
            EventKind::LockReleased => "lock.released",
            EventKind::LockExpired => "lock.expired",
            EventKind::LockRevoked => "lock.revoked",
            EventKind::SessionOpened => "session.opened",
            EventKind::SessionExpired => "session.expired",
            EventKind::ReconcilerFinding => "reconciler.finding",
        }
    }

    pub fn parse(s: &str) -> Option<EventKind> {
        EventKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether the rail-proxy streams this kind (the rail's); the payment-resource streams
    /// every other paydb kind.
    pub fn is_rail(self) -> bool {
        matches!(
            self,
            EventKind::RailMarkRaised | EventKind::RailIntent | EventKind::RailRefused | EventKind::RailOutcome
        )
    }

    /// Whether the lock server streams this kind (lockdb's); no paydb store writes one.
    pub fn is_lock(self) -> bool {
        matches!(
            self,
            EventKind::LockGranted
                | EventKind::LockRenewed
                | EventKind::LockReleased
                | EventKind::LockExpired
                | EventKind::LockRevoked
                | EventKind::SessionOpened
                | EventKind::SessionExpired
        )
    }
}

/// The control events a stream sends, never stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlKind {
    /// The cursor is fresh up to here: nothing the filter selects was committed between the
    /// last event sent and this cursor. Sent after [`BOOKMARK_INTERVAL_MS`] without one.
    Bookmark,
    /// The stream cannot continue from the cursor (absent, not issued here, another subject
    /// or filter, expired, or the client fell [`EVENT_LAG_EVENTS_MAX`] behind): take a new
    /// snapshot, then connect with its cursor. The stream ends after it.
    ResyncRequired,
}

impl ControlKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ControlKind::Bookmark => "bookmark",
            ControlKind::ResyncRequired => "resync_required",
        }
    }
}

/// Why a stream sent `resync_required` (its `reason` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResyncReason {
    /// No cursor: the client has no snapshot to continue from.
    Absent,
    /// Not a cursor this deployment issued (malformed, tampered, another key).
    Invalid,
    /// Issued to another subject.
    OtherSubject,
    /// Issued for another filter.
    OtherFilter,
    /// Events after the cursor were purged ([`EVENT_RETENTION_EVENTS_DEFAULT`]).
    Expired,
    /// The client fell more than [`EVENT_LAG_EVENTS_MAX`] events behind the head.
    TooSlow,
}

impl ResyncReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ResyncReason::Absent => "absent",
            ResyncReason::Invalid => "invalid",
            ResyncReason::OtherSubject => "other_subject",
            ResyncReason::OtherFilter => "other_filter",
            ResyncReason::Expired => "expired",
            ResyncReason::TooSlow => "too_slow",
        }
    }
}

/// One event as its store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEvent {
    /// The store's commit order; unique, never reused (a purge leaves a gap below the
    /// oldest kept event, never a reused number).
    pub seq: i64,
    pub kind: EventKind,
    /// The writer's wall clock at the change (for humans: nothing is decided on it).
    pub at: DateTime<Utc>,
    pub account_id: Option<String>,
    pub payout_id: Option<String>,
    pub lock_key: Option<String>,
    /// The kind's fields, a JSON object.
    pub body: serde_json::Value,
}

/// What one read of a store's outbox returned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EventRead {
    /// Events with `after < seq <= head`, in seq order.
    pub events: Vec<StoredEvent>,
    /// Every seq at or below it is final: returned, purged, or never to exist. `head >= after`.
    pub head: i64,
    /// The highest seq the retention purge has deleted (0: none).
    pub purged_through: i64,
}

impl EventRead {
    /// This read (of at most `limit` events after `after`) cut at `upto`, every seq at or
    /// below which the reader knows final: its events in `(after, upto]`, and a head at
    /// `upto` unless a full page ended below it.
    pub fn clipped(mut self, after: i64, upto: i64, limit: usize) -> EventRead {
        let full = self.events.len() >= limit;
        self.events.retain(|e| e.seq <= upto);
        self.head = match self.events.last() {
            Some(e) if full && self.events.len() >= limit => e.seq,
            _ => upto.max(after),
        };
        self
    }
}

/// One event on the wire (the SSE `data:` field, and an item of the recent-events page).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WireEvent {
    /// `"{stream}/{seq}"`: unique within the deployment; the client's dedupe key.
    pub event_id: String,
    pub seq: i64,
    pub kind: String,
    /// RFC 3339, UTC, milliseconds.
    pub at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub account_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub payout_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lock_key: Option<String>,
    /// The kind's fields (C3-extensions E-20).
    #[schema(value_type = Object)]
    pub data: serde_json::Value,
}

impl WireEvent {
    pub fn of(stream: &str, e: &StoredEvent) -> WireEvent {
        WireEvent {
            event_id: format!("{stream}/{}", e.seq),
            seq: e.seq,
            kind: e.kind.as_str().to_owned(),
            at: crate::time::rfc3339_ms(e.at),
            account_id: e.account_id.clone(),
            payout_id: e.payout_id.clone(),
            lock_key: e.lock_key.clone(),
            data: e.body.clone(),
        }
    }
}

/// What a client selects: every dimension given narrows (AND); within one, any value
/// matches (OR). An empty filter selects every event the service streams.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EventFilter {
    pub accounts: BTreeSet<String>,
    pub payouts: BTreeSet<String>,
    pub lock_keys: BTreeSet<String>,
    pub kinds: BTreeSet<EventKind>,
}

/// Why a filter was refused (400 `VALIDATION_FAILED` naming the field).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError {
    pub field: &'static str,
    pub problem: String,
}

impl EventFilter {
    /// Parses the query pairs `account`, `payout`, `lockKey`, `kind` (each repeatable, and
    /// each value may be a comma-separated list). Any other parameter but `cursor` is
    /// refused, as are more than [`FILTER_VALUES_MAX`] values or a value longer than
    /// [`FILTER_VALUE_CHARS_MAX`].
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<EventFilter, FilterError> {
        let mut f = EventFilter::default();
        let mut n = 0usize;
        for (name, value) in pairs {
            let field: &'static str = match name {
                "account" => "account",
                "payout" => "payout",
                "lockKey" => "lockKey",
                "kind" => "kind",
                "cursor" => continue,
                _ => {
                    return Err(FilterError { field: "query", problem: "names an unknown parameter".to_owned() });
                }
            };
            for v in value.split(',').filter(|v| !v.is_empty()) {
                n += 1;
                if n > FILTER_VALUES_MAX {
                    return Err(FilterError { field, problem: format!("more than {FILTER_VALUES_MAX} filter values") });
                }
                if v.chars().count() > FILTER_VALUE_CHARS_MAX {
                    return Err(FilterError {
                        field,
                        problem: format!("longer than {FILTER_VALUE_CHARS_MAX} characters"),
                    });
                }
                match field {
                    "account" => {
                        f.accounts.insert(v.to_owned());
                    }
                    "payout" => {
                        f.payouts.insert(v.to_owned());
                    }
                    "lockKey" => {
                        f.lock_keys.insert(v.to_owned());
                    }
                    _ => {
                        let k = EventKind::parse(v)
                            .ok_or_else(|| FilterError { field, problem: "is not an event kind".to_owned() })?;
                        f.kinds.insert(k);
                    }
                }
            }
        }
        Ok(f)
    }

    /// Whether `e` is selected.
    pub fn selects(&self, e: &StoredEvent) -> bool {
        fn one(set: &BTreeSet<String>, v: &Option<String>) -> bool {
            set.is_empty() || v.as_ref().is_some_and(|v| set.contains(v))
        }
        (self.kinds.is_empty() || self.kinds.contains(&e.kind))
            && one(&self.accounts, &e.account_id)
            && one(&self.payouts, &e.payout_id)
            && one(&self.lock_keys, &e.lock_key)
    }

    /// The one text of this filter (sorted, deduplicated), which a cursor binds.
    pub fn canonical(&self) -> String {
        let join = |s: &BTreeSet<String>| s.iter().map(String::as_str).collect::<Vec<_>>().join(",");
        let kinds: Vec<&str> = self.kinds.iter().map(|k| k.as_str()).collect();
        format!(
            "a={};p={};l={};k={}",
            join(&self.accounts),
            join(&self.payouts),
            join(&self.lock_keys),
            kinds.join(",")
        )
    }
}

/// Values a filter may name, over all its parameters.
pub const FILTER_VALUES_MAX: usize = 64;
/// Characters of one filter value.
pub const FILTER_VALUE_CHARS_MAX: usize = 128;
/// Events a store keeps by default; older ones are purged and a cursor below them is
/// expired (config key `events.retention_events`).
pub const EVENT_RETENTION_EVENTS_DEFAULT: i64 = 1_000_000;
/// The smallest retention a deployment may configure.
pub const EVENT_RETENTION_EVENTS_MIN: i64 = 100;
/// Events one read of the store returns, and so the most one connection holds in memory.
pub const EVENT_PAGE_EVENTS_MAX: usize = 256;
/// How far behind the head a connection may fall before it is sent `resync_required`.
pub const EVENT_LAG_EVENTS_MAX: i64 = 100_000;
/// A bookmark is sent after this long without an event.
pub const BOOKMARK_INTERVAL_MS: u64 = 15_000;
/// How often a service reads its store's head when nothing woke it.
pub const EVENT_POLL_MS: u64 = 250;
/// Open streams one service process serves at once; one more is answered 503.
pub const EVENT_STREAMS_MAX: usize = 256;
/// Characters of a cursor a service reads.
pub const EVENT_CURSOR_CHARS_MAX: usize = 1_024;
/// Events of the recent-events page, at most.
pub const RECENT_EVENTS_LIMIT_MAX: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_name_is_stable_and_parses_back() {
        for k in EventKind::ALL {
            assert_eq!(EventKind::parse(k.as_str()), Some(k));
        }
        assert_eq!(EventKind::parse("bookmark"), None, "a control kind is never a stored kind");
    }

    #[test]
    fn the_lock_kinds_are_the_lock_servers_and_no_rail_kind_is_one() {
        let lock: Vec<&str> = EventKind::ALL.into_iter().filter(|k| k.is_lock()).map(|k| k.as_str()).collect();
        assert_eq!(
            lock,
            [
                "lock.granted",
                "lock.renewed",
                "lock.released",
                "lock.expired",
                "lock.revoked",
                "session.opened",
                "session.expired"
            ]
        );
        assert!(EventKind::ALL.into_iter().all(|k| !(k.is_lock() && k.is_rail())));
    }

    #[test]
    fn a_filter_is_canonical_and_refuses_unknown_parameters_and_kinds() {
        let a = EventFilter::from_pairs([("kind", "payout.created,fence.raised"), ("account", "b"), ("account", "a")])
            .expect("valid");
        let b = EventFilter::from_pairs([("account", "a,b"), ("kind", "fence.raised"), ("kind", "payout.created")])
            .expect("valid");
        assert_eq!(a.canonical(), b.canonical());
        assert_eq!(EventFilter::from_pairs([("acct", "a")]).unwrap_err().field, "query");
        assert_eq!(EventFilter::from_pairs([("kind", "nope")]).unwrap_err().field, "kind");
        let many = "x,".repeat(FILTER_VALUES_MAX + 1);
        assert!(EventFilter::from_pairs([("account", many.as_str())]).is_err());
    }

    #[test]
    fn a_filter_selects_by_every_dimension_it_names() {
        let e = StoredEvent {
            seq: 1,
            kind: EventKind::PayoutCreated,
            at: DateTime::<Utc>::UNIX_EPOCH,
            account_id: Some("a".into()),
            payout_id: Some("p".into()),
            lock_key: None,
            body: serde_json::json!({}),
        };
        assert!(EventFilter::default().selects(&e));
        assert!(EventFilter::from_pairs([("account", "a")]).unwrap().selects(&e));
        assert!(!EventFilter::from_pairs([("account", "b")]).unwrap().selects(&e));
        assert!(!EventFilter::from_pairs([("lockKey", "k")]).unwrap().selects(&e));
        assert!(!EventFilter::from_pairs([("kind", "fence.raised")]).unwrap().selects(&e));
    }
}
