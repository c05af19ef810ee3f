//! The reconciler's recorded findings: the `reconciler_findings` table (the problems still
//! open) and the `reconciler.finding` events that say when one opened and when it cleared
//! (C3-extensions E-20; docs/operating/reconciler-findings.md).
//!
//! A run hands its findings over as a [`FindingsRun`]. One pure rule ([`plan`]) compares
//! them with the open rows: a finding not open yet is opened (a row and an event, status
//! `open`); an open row the run no longer finds is cleared (the row deleted, an event with
//! status `cleared`), but only by a *complete* run, one that read every source: a run that
//! could not read the rail cannot say a double payment is gone. Every store applies the
//! plan in one transaction ([`MemFindings`] under paydb's mutex, [`sql`] on PostgreSQL and
//! SQLite), each row write conditional (insert if absent, delete if present) and each event
//! written only when its row write took effect, so two reconcilers racing write each
//! transition once.
//!
//! Invariants:
//! - a finding's identity is its [`RecordedFinding::key`]; at most one open row per key;
//! - every open row was written with an `open` event, and every deleted row with a
//!   `cleared` event, in the same transaction: replaying the events of one key alternates
//!   `open`, `cleared`, `open`, … starting with `open`;
//! - an incomplete run clears nothing.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use dlock_contract::stream::EventKind;
use serde_json::json;

use crate::events::MemEvents;
use crate::StoreError;

/// Most findings one run records (a bound on the transaction; the rest are counted in
/// [`RecordOutcome::dropped`], and stay unrecorded until a later run has room).
pub const RECORDED_FINDINGS_MAX: usize = 10_000;
/// Longest `finding_key` (the table's CHECK).
pub const FINDING_KEY_BYTES_MAX: usize = 512;
/// Longest `detail` kept (a longer one is cut at a character boundary).
pub const FINDING_DETAIL_BYTES_MAX: usize = 2_048;

/// One finding as the reconciler records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedFinding {
    /// The finding's wire kind (`DOUBLE_PAYMENT`, …).
    pub kind: String,
    /// `incident` or `warning`.
    pub severity: String,
    pub account_id: Option<String>,
    pub payout_id: Option<String>,
    /// For an ambiguous payout, the rail's classification (`PAID`, `NOT_PAID`, `UNKNOWN`).
    pub class: Option<String>,
    /// For people; part of the key only when the finding names neither a payout nor an
    /// account (then the detail is what tells two of one kind apart).
    pub detail: String,
}

impl RecordedFinding {
    /// What the finding is about: kind, payout, account and class, and the detail when it
    /// names neither payout nor account. At most [`FINDING_KEY_BYTES_MAX`] bytes.
    pub fn key(&self) -> String {
        let mut k = format!(
            "{}|{}|{}|{}",
            self.kind,
            self.payout_id.as_deref().unwrap_or(""),
            self.account_id.as_deref().unwrap_or(""),
            self.class.as_deref().unwrap_or("")
        );
        if self.payout_id.is_none() && self.account_id.is_none() {
            k.push('|');
            k.push_str(&self.detail);
        }
        cut(&k, FINDING_KEY_BYTES_MAX).to_owned()
    }
}

/// `s` cut to at most `max` bytes at a character boundary.
pub fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// One reconciliation run's findings, to record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindingsRun {
    /// The run's id (the events carry it).
    pub run_id: String,
    /// The run's "now" (the reconciler's wall clock: for people, nothing is decided on it).
    pub at: DateTime<Utc>,
    /// Every source was read: only such a run clears a finding.
    pub complete: bool,
    pub findings: Vec<RecordedFinding>,
}

/// What recording one run changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecordOutcome {
    /// Findings opened (a row and an `open` event each).
    pub opened: u64,
    /// Findings cleared (a row deleted and a `cleared` event each).
    pub cleared: u64,
    /// Open rows after the run.
    pub open: u64,
    /// Findings beyond [`RECORDED_FINDINGS_MAX`], not recorded.
    pub dropped: u64,
}

/// What one run does to the open rows.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Plan {
    /// Findings to open, in key order (one per key).
    pub open: Vec<(String, RecordedFinding)>,
    /// Keys to clear, in key order.
    pub clear: Vec<String>,
    pub dropped: u64,
}

/// The rule: `open_keys` are the rows open now (any order); the run's findings are
/// deduplicated by key (the first kept) and bounded by [`RECORDED_FINDINGS_MAX`].
pub fn plan(open_keys: &[String], run: &FindingsRun) -> Plan {
    let mut found: BTreeMap<String, &RecordedFinding> = BTreeMap::new();
    for f in &run.findings {
        found.entry(f.key()).or_insert(f);
    }
    let dropped = found.len().saturating_sub(RECORDED_FINDINGS_MAX) as u64;
    let found: BTreeMap<String, &RecordedFinding> = found.into_iter().take(RECORDED_FINDINGS_MAX).collect();
    let open_now: std::collections::BTreeSet<&str> = open_keys.iter().map(String::as_str).collect();
    let open =
        found.iter().filter(|(k, _)| !open_now.contains(k.as_str())).map(|(k, f)| (k.clone(), (*f).clone())).collect();
    // A dropped finding still open is not cleared: the run did not record it, it did see it.
    let clear = if run.complete && dropped == 0 {
        open_now.iter().filter(|k| !found.contains_key(**k)).map(|k| (*k).to_owned()).collect()
    } else {
        Vec::new()
    };
    Plan { open, clear, dropped }
}

/// The body of a `reconciler.finding` event.
pub fn event_body(status: &str, run_id: &str, key: &str, f: &OpenFinding) -> serde_json::Value {
    let mut b = json!({
        "status": status,
        "finding": f.kind,
        "severity": f.severity,
        "detail": f.detail,
        "runId": run_id,
        "findingKey": key,
    });
    if let (Some(class), Some(o)) = (&f.class, b.as_object_mut()) {
        o.insert("class".into(), json!(class));
    }
    b
}

/// One open row of `reconciler_findings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenFinding {
    pub kind: String,
    pub severity: String,
    pub account_id: Option<String>,
    pub payout_id: Option<String>,
    pub class: Option<String>,
    pub detail: String,
    pub run_id: String,
    pub opened_at: DateTime<Utc>,
}

impl OpenFinding {
    fn of(f: &RecordedFinding, run: &FindingsRun) -> OpenFinding {
        OpenFinding {
            kind: f.kind.clone(),
            severity: f.severity.clone(),
            account_id: f.account_id.clone(),
            payout_id: f.payout_id.clone(),
            class: f.class.clone(),
            detail: cut(&f.detail, FINDING_DETAIL_BYTES_MAX).to_owned(),
            run_id: run.run_id.clone(),
            opened_at: run.at,
        }
    }
}

fn check(run: &FindingsRun) -> Result<(), StoreError> {
    for f in &run.findings {
        if !matches!(f.severity.as_str(), "incident" | "warning") {
            return Err(StoreError::Corrupt(format!("finding {}: severity {:?} is not recorded", f.kind, f.severity)));
        }
    }
    Ok(())
}

/// `reconciler_findings` in memory.
#[derive(Debug, Default, Clone)]
pub struct MemFindings {
    rows: BTreeMap<String, OpenFinding>,
}

impl MemFindings {
    /// Applies one run ([`plan`]), writing its events to `events` (the caller holds paydb's
    /// mutex: one transaction).
    pub fn record(&mut self, events: &mut MemEvents, run: &FindingsRun) -> Result<RecordOutcome, StoreError> {
        check(run)?;
        let keys: Vec<String> = self.rows.keys().cloned().collect();
        let p = plan(&keys, run);
        let mut out = RecordOutcome { dropped: p.dropped, ..RecordOutcome::default() };
        for (key, f) in &p.open {
            let row = OpenFinding::of(f, run);
            events.emit(
                EventKind::ReconcilerFinding,
                run.at,
                row.account_id.as_deref(),
                row.payout_id.clone(),
                event_body("open", &run.run_id, key, &row),
            );
            self.rows.insert(key.clone(), row);
            out.opened += 1;
        }
        for key in &p.clear {
            if let Some(row) = self.rows.remove(key) {
                events.emit(
                    EventKind::ReconcilerFinding,
                    run.at,
                    row.account_id.as_deref(),
                    row.payout_id.clone(),
                    event_body("cleared", &run.run_id, key, &row),
                );
                out.cleared += 1;
            }
        }
        out.open = self.rows.len() as u64;
        Ok(out)
    }

    /// The open rows, in key order.
    pub fn open(&self) -> impl Iterator<Item = (&String, &OpenFinding)> {
        self.rows.iter()
    }
}

#[cfg(not(madsim))]
pub mod sql {
    //! `reconciler_findings` on PostgreSQL and SQLite.

    use sqlx::Row;

    use super::{check, event_body, plan, FindingsRun, OpenFinding, RecordOutcome};
    use crate::sql::{commit_error, db_error};
    use crate::StoreError;

    /// One run on one database (`$db`), in one transaction whose first statement (`$first`)
    /// is a write: on PostgreSQL it takes the transaction's xid before any event draws a seq
    /// (the event reader's hole rule, `crate::events::sql::PgEventReader`); on SQLite it
    /// takes the write lock before the first read (waiting within the busy timeout), so
    /// the transaction never has to upgrade a read snapshot a service's commit has made
    /// stale (`SQLITE_BUSY_SNAPSHOT`, which no busy timeout waits out).
    macro_rules! record_findings {
        ($(#[$doc:meta])* $name:ident, $db:ty, $first:literal, $ins:literal, $del:literal, $ev:literal) => {
            $(#[$doc])*
            pub async fn $name(pool: &sqlx::Pool<$db>, run: &FindingsRun) -> Result<RecordOutcome, StoreError> {
                check(run)?;
                let mut tx = pool.begin().await.map_err(db_error)?;
                sqlx::query($first).execute(&mut *tx).await.map_err(db_error)?;
                let rows = sqlx::query("SELECT finding_key FROM reconciler_findings ORDER BY finding_key")
                    .fetch_all(&mut *tx)
                    .await
                    .map_err(db_error)?;
                let keys: Vec<String> =
                    rows.iter().map(|r| r.try_get::<String, _>("finding_key")).collect::<Result<_, _>>().map_err(db_error)?;
                let p = plan(&keys, run);
                let mut out = RecordOutcome { dropped: p.dropped, ..RecordOutcome::default() };
                for (key, f) in &p.open {
                    let row = OpenFinding::of(f, run);
                    let done = sqlx::query($ins)
                        .bind(key)
                        .bind(&row.kind)
                        .bind(&row.severity)
                        .bind(&row.account_id)
                        .bind(&row.payout_id)
                        .bind(&row.class)
                        .bind(&row.detail)
                        .bind(&row.run_id)
                        .bind(row.opened_at)
                        .execute(&mut *tx)
                        .await
                        .map_err(db_error)?;
                    if done.rows_affected() == 1 {
                        event(&mut tx, run, &row, event_body("open", &run.run_id, key, &row)).await?;
                        out.opened += 1;
                    }
                }
                for key in &p.clear {
                    let gone = sqlx::query($del).bind(key).fetch_optional(&mut *tx).await.map_err(db_error)?;
                    if let Some(r) = gone {
                        let row = OpenFinding {
                            kind: r.try_get("kind").map_err(db_error)?,
                            severity: r.try_get("severity").map_err(db_error)?,
                            account_id: r.try_get("account_id").map_err(db_error)?,
                            payout_id: r.try_get("payout_id").map_err(db_error)?,
                            class: r.try_get("class").map_err(db_error)?,
                            detail: r.try_get("detail").map_err(db_error)?,
                            run_id: r.try_get("run_id").map_err(db_error)?,
                            opened_at: r.try_get("opened_at").map_err(db_error)?,
                        };
                        event(&mut tx, run, &row, event_body("cleared", &run.run_id, key, &row)).await?;
                        out.cleared += 1;
                    }
                }
                let open: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM reconciler_findings")
                    .fetch_one(&mut *tx)
                    .await
                    .map_err(db_error)?;
                tx.commit().await.map_err(commit_error)?;
                out.open = u64::try_from(open).unwrap_or(0);
                return Ok(out);

                async fn event(
                    tx: &mut sqlx::Transaction<'_, $db>,
                    run: &FindingsRun,
                    row: &OpenFinding,
                    body: serde_json::Value,
                ) -> Result<(), StoreError> {
                    sqlx::query($ev)
                        .bind(dlock_contract::stream::EventKind::ReconcilerFinding.as_str())
                        .bind(run.at)
                        .bind(&row.account_id)
                        .bind(&row.payout_id)
                        .bind(body.to_string())
                        .execute(&mut **tx)
                        .await
                        .map_err(db_error)?;
                    Ok(())
                }
            }
        };
    }

    record_findings!(
        /// PostgreSQL: records one run's findings.
        pg_record_findings,
        sqlx::Postgres,
        "SELECT pg_current_xact_id()",
        "INSERT INTO reconciler_findings (finding_key, kind, severity, account_id, payout_id, class, detail, run_id, \
         opened_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) ON CONFLICT (finding_key) DO NOTHING",
        "DELETE FROM reconciler_findings WHERE finding_key = $1 \
         RETURNING kind, severity, account_id, payout_id, class, detail, run_id, opened_at",
        "INSERT INTO events (kind, at, account_id, payout_id, body) VALUES ($1, $2, $3, $4, $5)"
    );
    record_findings!(
        /// SQLite: as [`pg_record_findings`].
        sqlite_record_findings,
        sqlx::Sqlite,
        "UPDATE event_retention SET purged_through = purged_through WHERE id = 1",
        "INSERT INTO reconciler_findings (finding_key, kind, severity, account_id, payout_id, class, detail, run_id, \
         opened_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9) ON CONFLICT (finding_key) DO NOTHING",
        "DELETE FROM reconciler_findings WHERE finding_key = ?1 \
         RETURNING kind, severity, account_id, payout_id, class, detail, run_id, opened_at",
        "INSERT INTO events (kind, at, account_id, payout_id, body) VALUES (?1, ?2, ?3, ?4, ?5)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(kind: &str, payout: Option<&str>, detail: &str) -> RecordedFinding {
        RecordedFinding {
            kind: kind.into(),
            severity: "incident".into(),
            account_id: None,
            payout_id: payout.map(str::to_owned),
            class: None,
            detail: detail.into(),
        }
    }

    fn run(complete: bool, findings: Vec<RecordedFinding>) -> FindingsRun {
        FindingsRun { run_id: "r".into(), at: DateTime::<Utc>::UNIX_EPOCH, complete, findings }
    }

    #[test]
    fn a_run_opens_what_is_new_and_a_complete_run_alone_clears_what_is_gone() {
        let a = f("DOUBLE_PAYMENT", Some("p1"), "paid twice");
        let b = f("LEDGER_UNBALANCED", None, "EUR: debits 1, credits 2");
        let open = vec![a.key(), "GONE|||".to_owned()];
        let p = plan(&open, &run(true, vec![a.clone(), b.clone(), a.clone()]));
        assert_eq!(p.open.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), vec![b.key()]);
        assert_eq!(p.clear, vec!["GONE|||".to_owned()]);
        let incomplete = plan(&open, &run(false, vec![b.clone()]));
        assert_eq!((incomplete.open.len(), incomplete.clear.len()), (1, 0), "an incomplete run clears nothing");
    }

    #[test]
    fn a_finding_with_neither_payout_nor_account_is_told_apart_by_its_detail() {
        let eur = f("LEDGER_UNBALANCED", None, "EUR");
        let usd = f("LEDGER_UNBALANCED", None, "USD");
        assert_ne!(eur.key(), usd.key());
        let p1 = f("INTENT_UNRESOLVED", Some("p1"), "age 61 s");
        assert_eq!(p1.key(), f("INTENT_UNRESOLVED", Some("p1"), "age 62 s").key(), "an age is not identity");
        let long = f("X", None, &"é".repeat(600));
        assert!(long.key().len() <= FINDING_KEY_BYTES_MAX);
    }

    #[test]
    fn the_memory_table_writes_one_event_per_transition_and_none_for_a_repeat() {
        let mut t = MemFindings::default();
        let mut ev = MemEvents::default();
        let a = f("DOUBLE_PAYMENT", Some("p1"), "paid twice");
        let o = t.record(&mut ev, &run(true, vec![a.clone()])).expect("record");
        assert_eq!((o.opened, o.cleared, o.open), (1, 0, 1));
        let again = t.record(&mut ev, &run(true, vec![a.clone()])).expect("record");
        assert_eq!((again.opened, again.cleared, again.open), (0, 0, 1));
        let gone = t.record(&mut ev, &run(true, vec![])).expect("record");
        assert_eq!((gone.opened, gone.cleared, gone.open), (0, 1, 0));
        let statuses: Vec<String> =
            ev.rows().map(|e| e.body["status"].as_str().unwrap_or_default().to_owned()).collect();
        assert_eq!(statuses, vec!["open", "cleared"]);
        let bad = RecordedFinding { severity: "info".into(), ..a };
        assert!(t.record(&mut ev, &run(true, vec![bad])).is_err(), "an info finding is not recorded");
        assert_eq!(ev.last_seq(), 2, "a refused run writes nothing");
    }
}
