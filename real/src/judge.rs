//! The judgement of a real run, by the simulation's own oracle code
//! ([`dlock_sim::oracle`], compiled for the normal build) over ground truth only:
//! - paydb's tables, read from PostgreSQL with plain SQL (no store code in between), into
//!   the oracle's [`PaydbRows`];
//! - the rail-stub's own record (`GET /calls`);
//! - the fences and marks sampled from paydb every [`SAMPLE_EVERY_MS`] while the run runs
//!   ([`Checker::sample`]: never lower, in sample order);
//! - the merged history of every process ([`crate::history`]): the holders' beliefs
//!   (`lease_belief`, `session_belief`) judged by the oracle's belief checker on the host's
//!   monotonic clock, a process's beliefs ended where the nemesis killed it;
//! - the reconciler's `--json` report, against the oracle's figures and the rail's record;
//! - the traced fenced writes and intent outcomes ([`oracle::traced`]): a refusal with no
//!   newer holder, a lower token accepted, an ambiguous payout admitted again, each ordered
//!   only across more than [`TRACED_SLACK_MS`], and never across a stop of the process that
//!   wrote the later event;
//! - the services' contradictions (`contradiction`: a state their rules say cannot be);
//! - the lock servers' store calls ([`lock_call_failures`]);
//! - what callers received on the wire ([`wire_failures`]), against paydb's records.
//!
//! Invariants: a failure is only ever what one of the oracle's checkers returned (this
//! module adds `workload_finishes` and `paydb_readable`, the harness's own ids, as the
//! simulation's campaign does); the worst class gives the exit code.

use std::collections::{BTreeMap, BTreeSet};

use dlock_contract::payout::PayoutState;
use dlock_contract::rail::{RailCallLog, SubmissionOutcome};
use dlock_paydb::pay::{is_unsettled, AccountKind, Direction, LedgerEntry};
use dlock_paydb::rail::SubmissionRow;
use dlock_payment_resource::store_mem::FencedOp;
use dlock_rt::wire_log::{Exchange, Fate};
use dlock_sim::oracle::{self, ids, AccountFacts, Checker, Effects, Known, PaydbRows, RailTruth, Stated, WireWrite};
use dlock_sim::outcome::Failure;
use sqlx::Row;
use uuid::Uuid;

use crate::history::Line;

/// One sample of every account's fence and mark: `(host mono ms, fences, marks)`.
pub type Sample = (u64, BTreeMap<String, i64>, BTreeMap<String, i64>);

/// How often the fences and marks are sampled while the run runs.
pub const SAMPLE_EVERY_MS: u64 = 500;

/// Bound on one sample's query (a paused PostgreSQL must not stall the sampler for long).
pub const SAMPLE_TIMEOUT_MS: u64 = 2_000;

fn uuid(s: &str) -> Result<Uuid, String> {
    Uuid::parse_str(s).map_err(|e| format!("{s}: {e}"))
}

fn err(e: sqlx::Error) -> String {
    e.to_string()
}

/// Samples every account's fence and mark every [`SAMPLE_EVERY_MS`] until `sampling` is
/// cleared; the samples, in order.
pub fn spawn_sampler(
    rt: &tokio::runtime::Runtime,
    pool: sqlx::PgPool,
    sampling: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (tokio::task::JoinHandle<()>, std::sync::Arc<std::sync::Mutex<Vec<Sample>>>) {
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = samples.clone();
    let task = rt.spawn(async move {
        while sampling.load(std::sync::atomic::Ordering::Relaxed) {
            let at = crate::history::now_mono_ms();
            let read = fences_and_marks(&pool);
            if let Ok(Ok((f, m))) =
                tokio::time::timeout(std::time::Duration::from_millis(SAMPLE_TIMEOUT_MS), read).await
            {
                if let Ok(mut g) = samples.lock() {
                    g.push((at, f, m));
                }
            }
            tokio::time::sleep(std::time::Duration::from_millis(SAMPLE_EVERY_MS)).await;
        }
    });
    (task, out)
}

/// Every account's fence and mark (`accounts.fence`, `rail_high_water`).
pub async fn fences_and_marks(pool: &sqlx::PgPool) -> Result<(BTreeMap<String, i64>, BTreeMap<String, i64>), String> {
    let mut fences = BTreeMap::new();
    for r in sqlx::query("SELECT account_id, fence FROM accounts").fetch_all(pool).await.map_err(err)? {
        fences.insert(r.try_get::<String, _>(0).map_err(err)?, r.try_get::<i64, _>(1).map_err(err)?);
    }
    let mut marks = BTreeMap::new();
    for r in sqlx::query("SELECT account_id, highest_token FROM rail_high_water").fetch_all(pool).await.map_err(err)? {
        marks.insert(r.try_get::<String, _>(0).map_err(err)?, r.try_get::<i64, _>(1).map_err(err)?);
    }
    Ok((fences, marks))
}

/// paydb's rows, in one repeatable-read transaction.
pub async fn read_rows(pool: &sqlx::PgPool) -> Result<PaydbRows, String> {
    let mut tx = pool.begin().await.map_err(err)?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").execute(&mut *tx).await.map_err(err)?;
    let mut rows = PaydbRows::default();
    let mut reserved: BTreeMap<String, i64> = BTreeMap::new();
    for r in sqlx::query("SELECT payout_id, account_id, amount_minor, state FROM payouts ORDER BY payout_id")
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?
    {
        let id = uuid(&r.try_get::<String, _>(0).map_err(err)?)?;
        let account: String = r.try_get(1).map_err(err)?;
        let amount: i64 = r.try_get(2).map_err(err)?;
        let raw: String = r.try_get(3).map_err(err)?;
        let state = PayoutState::parse(&raw).ok_or_else(|| format!("payout {id}: state {raw}"))?;
        if is_unsettled(state) {
            *reserved.entry(account.clone()).or_insert(0) += amount;
        }
        rows.payouts.push((id, state));
        rows.payout_accounts.insert(id, account);
    }
    for r in sqlx::query("SELECT account_id, kind, balance_minor, fence FROM accounts ORDER BY account_id")
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?
    {
        let account_id: String = r.try_get(0).map_err(err)?;
        let kind: String = r.try_get(1).map_err(err)?;
        rows.fences.insert(account_id.clone(), r.try_get(3).map_err(err)?);
        rows.accounts.push(AccountFacts {
            kind: AccountKind::parse(&kind).ok_or_else(|| format!("account {account_id}: kind {kind}"))?,
            balance_minor: r.try_get(2).map_err(err)?,
            reserved_minor: reserved.get(&account_id).copied().unwrap_or(0),
            account_id,
        });
    }
    for r in sqlx::query(
        "SELECT entry_id, posting_id, payout_id, account_id, direction, amount_minor, currency, fence, created_at \
         FROM ledger_entries ORDER BY entry_id",
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(err)?
    {
        let direction: String = r.try_get(4).map_err(err)?;
        rows.ledger.push(LedgerEntry {
            entry_id: uuid(&r.try_get::<String, _>(0).map_err(err)?)?,
            posting_id: uuid(&r.try_get::<String, _>(1).map_err(err)?)?,
            payout_id: r.try_get::<Option<String>, _>(2).map_err(err)?.map(|s| uuid(&s)).transpose()?,
            account_id: r.try_get(3).map_err(err)?,
            direction: Direction::parse(&direction).ok_or_else(|| format!("direction {direction}"))?,
            amount_minor: r.try_get(5).map_err(err)?,
            currency: r.try_get(6).map_err(err)?,
            fence: r.try_get(7).map_err(err)?,
            created_at: r.try_get(8).map_err(err)?,
        });
    }
    for r in sqlx::query(
        "SELECT submission_id, payout_id, account_id, presented_token, owner_id, idempotency_key, amount_minor, \
         currency, outcome, outcome_detail, rail_reference, submitted_at, resolved_at FROM rail_submission ORDER BY seq",
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(err)?
    {
        let outcome: Option<String> = r.try_get(8).map_err(err)?;
        rows.submissions.push(SubmissionRow {
            submission_id: uuid(&r.try_get::<String, _>(0).map_err(err)?)?,
            payout_id: uuid(&r.try_get::<String, _>(1).map_err(err)?)?,
            account_id: r.try_get(2).map_err(err)?,
            presented_token: r.try_get(3).map_err(err)?,
            owner_id: r.try_get(4).map_err(err)?,
            idempotency_key: r.try_get(5).map_err(err)?,
            amount_minor: r.try_get(6).map_err(err)?,
            currency: r.try_get(7).map_err(err)?,
            outcome: outcome
                .map(|o| SubmissionOutcome::parse(&o).ok_or_else(|| format!("submission outcome {o}")))
                .transpose()?,
            outcome_detail: r.try_get(9).map_err(err)?,
            rail_reference: r.try_get(10).map_err(err)?,
            submitted_at: r.try_get(11).map_err(err)?,
            resolved_at: r.try_get(12).map_err(err)?,
        });
    }
    for r in
        sqlx::query("SELECT account_id, highest_token FROM rail_high_water").fetch_all(&mut *tx).await.map_err(err)?
    {
        rows.marks.insert(r.try_get(0).map_err(err)?, r.try_get(1).map_err(err)?);
    }
    // Every claim's and post's recorded answer, and every batch's (its target `account:ID`);
    // a committed record always holds its answer.
    for r in sqlx::query(
        "SELECT operation, target_id, idempotency_key, fencing_token, response_status, response_body \
         FROM idempotency_records WHERE operation IN ('CLAIM', 'POST') AND response_status IS NOT NULL",
    )
    .fetch_all(&mut *tx)
    .await
    .map_err(err)?
    {
        let op = match r.try_get::<String, _>(0).map_err(err)?.as_str() {
            "CLAIM" => FencedOp::Claim,
            _ => FencedOp::Post,
        };
        let target: String = r.try_get(1).map_err(err)?;
        let (key, token): (String, i64) = (r.try_get(2).map_err(err)?, r.try_get(3).map_err(err)?);
        let status = u16::try_from(r.try_get::<i32, _>(4).map_err(err)?).map_err(|e| e.to_string())?;
        let answer = (status, r.try_get::<Vec<u8>, _>(5).map_err(err)?);
        match target.strip_prefix("account:") {
            Some(account) => rows.batch_records.insert((op, account.to_owned(), token, key), answer),
            None => rows.records.insert((op, uuid(&target)?, token, key), answer),
        };
    }
    tx.commit().await.map_err(err)?;
    Ok(rows)
}

/// The judged writes the processes sent, rebuilt from their `exchange_sent` and
/// `exchange_done` events (`dlock_rt::wire_log`, "On real processes") as the simulation's
/// wire log holds them, stamped with the host's monotonic clock. A write with no
/// `exchange_done` (its future dropped, its process killed), or whose body the event left
/// out, has an unknown fate.
pub fn exchanges(history: &[Line]) -> Vec<Exchange> {
    let mut open: BTreeMap<(String, u64, u64), usize> = BTreeMap::new();
    let mut out: Vec<Exchange> = Vec::new();
    for l in history.iter().filter(|l| l.kind == "exchange_sent" || l.kind == "exchange_done") {
        let n = |k: &str| l.fields.get(k).and_then(|v| v.as_u64());
        let s = |k: &str| l.fields.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        let (Some(run), Some(id)) = (n("run"), n("id")) else { continue };
        let key = (l.process.clone(), run, id);
        if l.kind == "exchange_sent" {
            let mut headers = Vec::new();
            for (field, header) in [
                ("fencing_token", dlock_contract::HEADER_FENCING_TOKEN),
                ("idempotency_key", dlock_contract::HEADER_IDEMPOTENCY_KEY),
            ] {
                if let Some(v) = s(field) {
                    headers.push((header.to_owned(), v));
                }
            }
            open.insert(key, out.len());
            out.push(Exchange {
                seq_sent: l.mono_ms,
                seq_done: None,
                authority: s("authority").unwrap_or_default(),
                method: s("method").unwrap_or_default(),
                path: s("path").unwrap_or_default(),
                headers,
                request: s("request").unwrap_or_default().into_bytes(),
                fate: None,
            });
        } else if let Some(e) = open.remove(&key).and_then(|i| out.get_mut(i)) {
            e.seq_done = Some(l.mono_ms);
            e.fate = if l.fields.get("failed").and_then(|v| v.as_bool()) == Some(true) {
                let nothing_sent = l.fields.get("nothing_sent").and_then(|v| v.as_bool()).unwrap_or(false);
                Some(Fate::Failed { nothing_sent })
            } else {
                let status = n("status").and_then(|v| u16::try_from(v).ok());
                status.zip(s("body")).map(|(status, body)| Fate::Answered { status, body: body.into_bytes() })
            };
        }
    }
    out
}

/// What callers received on the wire, against paydb ([`oracle::wire`]): every answer marked
/// `retrySafe: true` to a claim, post or submission left no trace
/// (`retry_safe_answer_left_no_trace`), and every answer below 500 to a claim, post or
/// batch whose identity paydb recorded is the recorded status and bytes
/// (`idempotent_replay_byte_identical_on_the_wire`). A batch's payouts count as written
/// when its recorded answer's item for them is 2xx. Acquires are not judged here: the
/// check orders an acquire's answer against its grant's commit by the simulation's one
/// counter, which real processes do not share.
pub fn wire_failures(history: &[Line], rows: &PaydbRows) -> Vec<Failure> {
    let wire: Vec<WireWrite> = exchanges(history).iter().flat_map(oracle::parse_wire_all).collect();
    let mut effects = Effects { writes: rows.effects(), grants: Vec::new() };
    for ((op, _, token, _), (status, body)) in &rows.batch_records {
        let Ok(answer) = serde_json::from_slice::<dlock_contract::batch::BatchAnswer>(body) else { continue };
        if *status == 200 {
            let written = answer.items.iter().filter(|i| (200..300).contains(&i.status));
            effects.writes.extend(written.map(|i| (*op, i.payout_id, *token)));
        }
    }
    let mut found = oracle::retry_safe_failures(&wire, &effects);
    found.extend(oracle::wire_replay_failures(&wire, &rows.records));
    found.extend(oracle::wire_batch_replay_failures(&wire, &rows.batch_records));
    found
}

/// How many payouts are not settled yet (PENDING, CLAIMED, SUBMITTED, RAIL_ACKED), and how
/// many intents have no outcome.
pub async fn open_counts(pool: &sqlx::PgPool) -> Result<(i64, i64), String> {
    let open: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM payouts WHERE state IN ('PENDING', 'CLAIMED', 'SUBMITTED', 'RAIL_ACKED')",
    )
    .fetch_one(pool)
    .await
    .map_err(err)?;
    let unresolved: i64 = sqlx::query_scalar("SELECT count(*) FROM rail_submission WHERE outcome IS NULL")
        .fetch_one(pool)
        .await
        .map_err(err)?;
    Ok((open, unresolved))
}

/// What the judge reads at the end, besides paydb.
pub struct Evidence<'a> {
    pub rows: &'a PaydbRows,
    pub rail: &'a RailCallLog,
    pub report: Option<&'a dlock_reconciler::report::Report>,
    /// `(host mono ms, fences, marks)` in sample order.
    pub samples: &'a [Sample],
    pub history: &'a [Line],
    pub not_created: u64,
}

/// The process index the belief checker names a node by.
pub fn node_index(process: &str) -> u64 {
    crate::nemesis::PROCESSES.iter().position(|p| *p == process).map_or(u64::MAX, |i| i as u64)
}

/// The online checks replayed over the run's samples and history: fences and marks never
/// lower, no two believing holders.
pub fn online_failures(e: &Evidence<'_>) -> Vec<Failure> {
    let mut c = Checker::new();
    c.judge_beliefs(dlock_lock_client::config::SAFETY_MARGIN_DEFAULT, Vec::new());
    // Samples and history merged by the host clock: one sequence of observations.
    let mut samples = e.samples.iter().peekable();
    for line in e.history {
        while let Some((at, f, m)) = samples.next_if(|(at, _, _)| *at <= line.mono_ms) {
            c.sample(f, m, *at);
        }
        match line.kind.as_str() {
            "lease_belief" | "session_belief" | "revoke" => {
                let at = line.mono_ms;
                c.on_belief(node_index(&line.process), &line.kind, &line.fields, at, |_| at);
            }
            "schedule" if line.process == "nemesis" => {
                let verb = line.fields.get("verb").and_then(|v| v.as_str()).unwrap_or_default();
                let skipped = line.fields.get("skipped").and_then(|v| v.as_bool()).unwrap_or(true);
                let first = line.fields.get("nodes").and_then(|v| v.as_array()).and_then(|a| a.first());
                if !skipped && verb == "crash" {
                    if let Some(n) = first.and_then(|v| v.as_str()) {
                        c.node_crashed(node_index(n));
                    }
                }
                if let Some(n) = line.fields.get("crashed").and_then(|v| v.as_str()).filter(|_| !skipped) {
                    c.node_crashed(node_index(n));
                }
            }
            _ => {}
        }
    }
    for (at, f, m) in samples {
        c.sample(f, m, *at);
    }
    c.failures().iter().map(|t| t.failure.clone()).collect()
}

/// How far apart two traced events of different processes (or tasks) must lie before the
/// traced fence checks order them: far beyond the gap between a commit and its event in a
/// process that runs (a stopped one is excused by the nemesis's own record, [`stopped`]).
pub const TRACED_SLACK_MS: u64 = 100;

/// The spans during which the nemesis held a process stopped (SIGSTOP to SIGCONT), from
/// its `schedule` lines; a span never closed lasts to the end.
pub fn stopped(history: &[Line]) -> Vec<oracle::traced::Stopped> {
    let mut open: BTreeMap<String, u64> = BTreeMap::new();
    let mut spans = Vec::new();
    for l in history.iter().filter(|l| l.kind == "schedule" && l.process == "nemesis") {
        let verb = l.fields.get("verb").and_then(|v| v.as_str()).unwrap_or_default();
        let skipped = l.fields.get("skipped").and_then(|v| v.as_bool()).unwrap_or(true);
        let node = l.fields.get("nodes").and_then(|v| v.as_array()).and_then(|a| a.first()).and_then(|v| v.as_str());
        let Some(node) = node.filter(|_| !skipped) else { continue };
        match verb {
            "pause" => {
                open.entry(node.to_owned()).or_insert(l.mono_ms);
            }
            "resume" => {
                if let Some(from_ms) = open.remove(node) {
                    spans.push(oracle::traced::Stopped { node: node.to_owned(), from_ms, to_ms: l.mono_ms });
                }
            }
            _ => {}
        }
    }
    spans.extend(open.into_iter().map(|(node, from_ms)| oracle::traced::Stopped { node, from_ms, to_ms: u64::MAX }));
    spans
}

/// The history's `fenced_write` and `intent_outcome` events, for the oracle's traced fence
/// checks ([`oracle::traced`]).
pub fn traced(history: &[Line]) -> (Vec<oracle::traced::TracedWrite>, Vec<oracle::traced::TracedOutcome>) {
    let s = |l: &Line, k: &str| l.fields.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let i = |l: &Line, k: &str| l.fields.get(k).and_then(|v| v.as_i64());
    let mut writes = Vec::new();
    let mut outcomes = Vec::new();
    for l in history {
        match l.kind.as_str() {
            "fenced_write" => {
                let (Some(op), Some(payout), Some(presented)) = (s(l, "op"), s(l, "payout"), i(l, "presented_token"))
                else {
                    continue;
                };
                writes.push(oracle::traced::TracedWrite {
                    at_ms: l.mono_ms,
                    node: l.process.clone(),
                    op,
                    payout,
                    account: s(l, "account").unwrap_or_default(),
                    owner: s(l, "owner").unwrap_or_default(),
                    presented,
                    stored: i(l, "stored_token"),
                    answer: s(l, "answer").unwrap_or_default(),
                    admission: s(l, "admission"),
                });
            }
            "intent_outcome" => {
                if let (Some(payout), Some(presented), Some(outcome)) =
                    (s(l, "payout"), i(l, "presented_token"), s(l, "outcome"))
                {
                    outcomes.push(oracle::traced::TracedOutcome { at_ms: l.mono_ms, payout, presented, outcome });
                }
            }
            _ => {}
        }
    }
    (writes, outcomes)
}

/// The oracle's lock-call checker ([`oracle::calls::Calls`]) fed the lock servers'
/// `store_call` and `store_answer` events in history order, on the host's monotonic clock:
/// `no_two_live_grants_per_key`, `lock_delay_honoured`,
/// `lock_tokens_increase_in_grant_order`, `heartbeat_keeps_its_session_live` and
/// `dead_grant_never_revived`. One checker per lockdb ([`lockdb_of`]): each has its own
/// keys and token order. On etcd each replica judges leases on its own monotonic clock: no
/// slack. On PostgreSQL they are judged by lockdb's clock, which only the judging
/// replica's monotonic clock advances, and which a decision reads as its last tick left it:
/// a lease may end up to `CLOCK_ADVANCE_MS_MAX` early in true time, the checker's slack
/// there (as the simulation's on its stores that keep that clock). No fault here makes
/// either clock run fast (rate 1). A call whose answer a kill cut off stays unknown, as a
/// lost acknowledgement does in the simulation.
pub fn lock_call_failures(history: &[Line]) -> Vec<Failure> {
    use oracle::calls::{Answered, Asked};
    let mut calls: BTreeMap<&'static str, oracle::calls::Calls> = BTreeMap::new();
    // (process, run, call) -> the checker's id, while the call is in flight.
    let mut ids: BTreeMap<(String, u64, u64), u64> = BTreeMap::new();
    let mut next = 0;
    let mut found = Vec::new();
    for l in history.iter().filter(|l| l.kind == "store_call" || l.kind == "store_answer") {
        let n = |k: &str| l.fields.get(k).and_then(|v| v.as_u64());
        let (Some(call), Some(run)) = (n("call"), n("run")) else { continue };
        let id = (l.process.clone(), run, call);
        let (lockdb, slack_ms) = lockdb_of(&l.process);
        let checker = calls.entry(lockdb).or_insert_with(|| oracle::calls::Calls::new(slack_ms));
        if l.kind == "store_call" {
            let Some(asked) = Asked::from_fields(|k| l.fields.get(k)) else { continue };
            ids.insert(id, next);
            checker.begin(next, asked, l.mono_ms);
            next += 1;
        } else if let Some(dense) = ids.remove(&id) {
            let answered = Answered::from_fields(|k| l.fields.get(k)).unwrap_or(Answered::Unknown);
            found.extend(checker.end(dense, answered, l.mono_ms, |_, _| 1.0));
        }
    }
    found
}

/// Lines of the history printed under a lock-call failure, so that a report read far from
/// its kept directory (a CI log) still shows what happened: every store call on the key the
/// failure names, each with its answer, the closes and refusals of the sessions they used,
/// every process's start, and the nemesis's and the run's own lines (faults, phases), up to [`EVIDENCE_LINES_MAX`] before the
/// instant it names (`granted by N ms`) and a few after. Empty when the failure names no key.
pub fn lock_evidence(history: &[Line], detail: &str) -> Vec<String> {
    let Some(key) = detail.strip_prefix("key ").and_then(|r| r.split(": ").next()) else { return Vec::new() };
    let by = detail
        .split("granted by ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(u64::MAX);
    let str_of = |l: &Line, k: &str| l.fields.get(k).and_then(|v| v.as_str()).map(str::to_owned);
    let id = |l: &Line| {
        let n = |k: &str| l.fields.get(k).and_then(|v| v.as_u64());
        (l.process.clone(), n("run"), n("call"))
    };
    let on_key = |l: &Line| l.kind == "store_call" && str_of(l, "key").as_deref() == Some(key);
    let sessions: BTreeSet<String> =
        history.iter().filter(|l| on_key(l)).filter_map(|l| str_of(l, "session")).collect();
    let mut calls = BTreeMap::new();
    let mut picked = Vec::new();
    for l in history.iter().take_while(|l| l.mono_ms <= by.saturating_add(EVIDENCE_AFTER_MS)) {
        let relevant = match l.kind.as_str() {
            "store_call" => {
                let asked = str_of(l, "asked").unwrap_or_default();
                let mine = on_key(l)
                    || (asked == "close" || asked == "open")
                        && str_of(l, "session").is_some_and(|s| sessions.contains(&s));
                if mine {
                    calls.insert(id(l), asked);
                }
                mine
            }
            "store_answer" => calls.contains_key(&id(l)),
            "trace_start" => true,
            _ => l.process == "nemesis" || l.process == "run",
        };
        if relevant {
            picked.push(l);
        }
    }
    let skip = picked.len().saturating_sub(EVIDENCE_LINES_MAX);
    picked
        .into_iter()
        .skip(skip)
        .map(|l| {
            let fields: BTreeMap<&str, &serde_json::Value> =
                l.fields.iter().filter(|(k, v)| !v.is_null() && **k != "config").map(|(k, v)| (*k, v)).collect();
            let asked = calls.get(&id(l)).filter(|_| l.kind == "store_answer").map(|a| format!(" ({a})"));
            format!(
                "  {} {} {}{} {}",
                l.mono_ms,
                l.process,
                l.kind,
                asked.unwrap_or_default(),
                serde_json::to_string(&fields).unwrap_or_default()
            )
        })
        .collect()
}

/// Bound on [`lock_evidence`]'s lines, and how far past the failure's instant it reads (ms).
pub const EVIDENCE_LINES_MAX: usize = 80;
pub const EVIDENCE_AFTER_MS: u64 = 2_000;

/// The lockdb a lock server's store calls go to (deploy/local/up.sh), and how early in true
/// time it may end a lease ([`lock_call_failures`]): `lock-server-pg`'s on PostgreSQL,
/// every other's on the etcd cluster.
pub fn lockdb_of(process: &str) -> (&'static str, u64) {
    if process == "lock-server-pg" {
        ("postgres", dlock_lock_server::lockdb_clock::CLOCK_ADVANCE_MS_MAX)
    } else {
        ("etcd", 0)
    }
}

/// The history's `contradiction` events.
pub fn contradictions(history: &[Line]) -> Vec<oracle::traced::TracedContradiction> {
    let s = |l: &Line, k: &str| l.fields.get(k).and_then(|v| v.as_str()).unwrap_or_default().to_owned();
    history
        .iter()
        .filter(|l| l.kind == "contradiction")
        .map(|l| oracle::traced::TracedContradiction {
            at_ms: l.mono_ms,
            node: l.process.clone(),
            method: s(l, "method"),
            path: s(l, "path"),
            cause: s(l, "cause"),
        })
        .collect()
}

/// Every failure of the run (module doc), safety first.
pub fn failures(e: &Evidence<'_>) -> Vec<Failure> {
    let calls: Vec<String> = e.rail.calls.iter().map(|c| c.client_ref.clone()).collect();
    let mut found = online_failures(e);
    let (writes, outcomes) = traced(e.history);
    found.extend(oracle::traced::traced_failures(&writes, &outcomes, &stopped(e.history), TRACED_SLACK_MS));
    found.extend(oracle::traced::contradiction_failures(&contradictions(e.history)));
    found.extend(lock_call_failures(e.history));
    found.extend(wire_failures(e.history, e.rows));
    found.extend(oracle::rail_failures(&calls, &e.rows.submissions));
    found.extend(oracle::ledger_failures(&e.rows.accounts, &e.rows.ledger));
    found.extend(oracle::ledger_account_failures(&e.rows.ledger, &e.rows.payout_accounts));
    found.extend(oracle::settle_failures(&e.rows.payouts, &e.rows.submissions));
    if e.not_created > 0 {
        found
            .push(Failure::liveness(ids::WORKLOAD_FINISHES, format!("{} payouts could not be created", e.not_created)));
    }
    match e.report {
        Some(r) => {
            let known: Known = e.rows.known(&calls);
            let stated = Known {
                max_rail_calls_per_payout: r.max_rail_calls_per_payout,
                ambiguous: r.ambiguous.iter().map(|a| a.payout_id).collect(),
                ledger_balanced: r.ledger_balanced,
                payouts_by_state: r.payouts_by_state.clone(),
            };
            found.extend(oracle::reconciler_failures(&known, &stated));
            found.extend(oracle::reconciler_truth_failures(&RailTruth::of(e.rail), &Stated::of(r)));
        }
        None => found.push(Failure::liveness(ids::RECONCILER_AGREES, "the reconciler produced no report")),
    }
    found.sort_by_key(|f| std::cmp::Reverse(f.class));
    found
}

/// p50 and p99 (ms) of create-to-post over the posted payouts: the create's answer to the
/// payment-resource's first accepted post of it.
pub fn latencies(created: &[crate::workload::Created], history: &[Line]) -> (Option<u64>, Option<u64>, usize) {
    let mut posted: BTreeMap<&str, u64> = BTreeMap::new();
    for l in history.iter().filter(|l| l.kind == "fenced_write") {
        let op = l.fields.get("op").and_then(|v| v.as_str()).unwrap_or_default();
        let answer = l.fields.get("answer").and_then(|v| v.as_str()).unwrap_or_default();
        if op.starts_with("post") && answer == "accepted" {
            if let Some(p) = l.fields.get("payout").and_then(|v| v.as_str()) {
                posted.entry(p).or_insert(l.mono_ms);
            }
        }
    }
    let mut ms: Vec<u64> = created
        .iter()
        .filter_map(|c| posted.get(c.payout_id.as_str()).map(|t| t.saturating_sub(c.at_mono_ms)))
        .collect();
    ms.sort_unstable();
    (percentile(&ms, 0.50), percentile(&ms, 0.99), ms.len())
}

/// The `p` quantile (nearest rank) of `sorted`; `None` when empty.
pub fn percentile(sorted: &[u64], p: f64) -> Option<u64> {
    let rank = (sorted.len() as f64 * p).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::parse_line;
    use dlock_sim::outcome::FailureClass;
    use oracle::calls::{Answered, Asked};

    fn belief(process: &str, mono: u64, key: &str, token: i64, session: &str, deadline: u64) -> Line {
        let text = format!(
            r#"{{"seq":0,"t_ms":0,"node":"{process}","mono_ms":{mono},"wall_ms":0,"kind":"lease_belief","key":"{key}","token":{token},"owner":"{process}","session":"{session}","local_deadline_mono_ms":{deadline},"source":"granted","reason":null}}"#
        );
        parse_line(process, &text).unwrap_or_else(|| panic!("bad test line"))
    }

    fn session(process: &str, mono: u64, session: &str, deadline: u64) -> Line {
        let text = format!(
            r#"{{"seq":0,"t_ms":0,"node":"{process}","mono_ms":{mono},"wall_ms":0,"kind":"session_belief","session":"{session}","local_deadline_mono_ms":{deadline},"source":"opened"}}"#
        );
        parse_line(process, &text).unwrap_or_else(|| panic!("bad test line"))
    }

    /// A claim of `payout` under token 5 and key `k` sent by executor-1 at `at` (exchange
    /// `id`), answered `answer` (status, body) 10 ms later, or never (`None`).
    fn claim_exchange(id: u64, at: u64, payout: Uuid, answer: Option<(u16, &str)>) -> Vec<Line> {
        let sent = serde_json::json!({
            "seq": 0, "t_ms": 0, "node": "http-client", "mono_ms": at, "wall_ms": 0, "kind": "exchange_sent",
            "run": 9, "id": id, "authority": "p:1", "method": "POST", "path": format!("/v1/payouts/{payout}/claim"),
            "fencing_token": "5", "idempotency_key": "k", "request": r#"{"expectedState":"PENDING"}"#,
        });
        let mut lines = vec![parse_line("executor-1", &sent.to_string()).unwrap_or_else(|| panic!("bad test line"))];
        if let Some((status, body)) = answer {
            let done = serde_json::json!({
                "seq": 0, "t_ms": 0, "node": "http-client", "mono_ms": at + 10, "wall_ms": 0,
                "kind": "exchange_done", "run": 9, "id": id, "status": status, "body": body,
            });
            lines.push(parse_line("executor-1", &done.to_string()).unwrap_or_else(|| panic!("bad test line")));
        }
        lines
    }

    #[test]
    fn an_answer_that_differs_from_its_record_or_a_retry_safe_answer_with_an_effect_fails_the_run() {
        let payout = Uuid::from_u128(7);
        let mut rows = PaydbRows::default();
        rows.records.insert((FencedOp::Claim, payout, 5, "k".into()), (200, b"{\"a\":1}".to_vec()));
        // The recorded bytes on the wire, then a replay with the same bytes: clean.
        let mut h = claim_exchange(0, 100, payout, Some((200, r#"{"a":1}"#)));
        h.extend(claim_exchange(1, 200, payout, Some((200, r#"{"a":1}"#))));
        assert!(wire_failures(&h, &rows).is_empty(), "{:?}", wire_failures(&h, &rows));
        // A replay answered with other bytes.
        h.extend(claim_exchange(2, 300, payout, Some((200, r#"{"a":2}"#))));
        let found = wire_failures(&h, &rows);
        assert_eq!(found.iter().map(|f| f.invariant).collect::<Vec<_>>(), [ids::WIRE_REPLAY_BYTE_IDENTICAL]);
        // Every send answered retry-safe, yet paydb holds the claim.
        let refused = r#"{"code":"UNAVAILABLE","retrySafe":true}"#;
        let h = claim_exchange(0, 100, payout, Some((503, refused)));
        let found = wire_failures(&h, &rows);
        assert_eq!(found.iter().map(|f| f.invariant).collect::<Vec<_>>(), [ids::RETRY_SAFE_LEFT_NO_TRACE]);
        // One send of it never ended (its outcome unknown): no finding.
        let mut h = claim_exchange(0, 100, payout, Some((503, refused)));
        h.extend(claim_exchange(1, 200, payout, None));
        assert!(wire_failures(&h, &rows).is_empty(), "{:?}", wire_failures(&h, &rows));
        // Nothing recorded: a retry-safe answer is what it says.
        let h = claim_exchange(0, 100, payout, Some((503, refused)));
        assert!(wire_failures(&h, &PaydbRows::default()).is_empty());
    }

    fn evidence<'a>(
        rows: &'a PaydbRows,
        rail: &'a RailCallLog,
        samples: &'a [Sample],
        history: &'a [Line],
    ) -> Evidence<'a> {
        Evidence { rows, rail, report: None, samples, history, not_created: 0 }
    }

    #[test]
    fn a_service_meeting_a_contradiction_fails_the_run() {
        let text = r#"{"seq":0,"t_ms":0,"node":"http","mono_ms":7,"wall_ms":0,"kind":"contradiction","method":"POST","path":"/v1/x","status":500,"cause":"unexpected store content: c"}"#;
        let line = parse_line("lock-server-1", text).unwrap_or_else(|| panic!("bad test line"));
        let found = contradictions(std::slice::from_ref(&line));
        assert_eq!(found.len(), 1, "{found:?}");
        assert_eq!((found[0].node.as_str(), found[0].path.as_str(), found[0].at_ms), ("lock-server-1", "/v1/x", 7));
        let (rows, rail) = (PaydbRows::default(), RailCallLog::default());
        let failures = failures_of(&rows, &rail, &[line]);
        assert!(
            failures.iter().any(|f| f.invariant == ids::NO_CONTRADICTION && f.class == FailureClass::Correctness),
            "{failures:?}"
        );
        assert!(failures_of(&rows, &rail, &[]).iter().all(|f| f.invariant != ids::NO_CONTRADICTION));
    }

    /// A store call through `process` (observer run 1): `asked` at `at`, `answered` `took`
    /// ms later, as a lock server's `EventObserver` writes them.
    fn call(process: &str, call: u64, at: u64, took: u64, asked: Asked, answered: Answered) -> [Line; 2] {
        let line = |mono_ms, kind: &str, own: Vec<(&'static str, serde_json::Value)>| {
            let mut fields: dlock_rt::events::Fields = own.into_iter().collect();
            fields.insert("call", call.into());
            fields.insert("run", 1.into());
            Line { process: process.into(), seq: 0, mono_ms, wall_ms: 0, kind: kind.into(), fields }
        };
        [line(at, "store_call", asked.fields().to_vec()), line(at + took, "store_answer", answered.fields().to_vec())]
    }

    /// Session `s` opened through `process` at `at` (a 10 s TTL).
    fn opened(process: &str, id: u64, at: u64, s: u128) -> [Line; 2] {
        let session = uuid::Uuid::from_u128(s);
        call(process, id, at, 5, Asked::Open { session }, Answered::SessionLive { ttl_ms: 10_000 })
    }

    /// An acquire of `k` by session `s` through `process`, begun at `at` and granted `token`
    /// 10 ms later (a 1 500 ms lease).
    fn granted(process: &str, id: u64, at: u64, s: u128, token: i64) -> [Line; 2] {
        let asked = Asked::Acquire { key: "k".into(), session: uuid::Uuid::from_u128(s), ttl_ms: 1_500, delay_ms: 0 };
        call(process, id, at, 10, asked, Answered::Granted { token })
    }

    /// Sessions 1 and 2 opened through `a` and `b`, then `k` granted to session 1 through
    /// `a` at 100 (token `t1`) and to session 2 through `b` at `at` (token `t2`).
    fn two_grants(a: &str, b: &str, t1: i64, t2: i64, at: u64) -> Vec<Line> {
        let mut h: Vec<Line> = Vec::new();
        h.extend(opened(a, 0, 0, 1));
        h.extend(opened(b, 1, 0, 2));
        h.extend(granted(a, 2, 100, 1, t1));
        h.extend(granted(b, 3, at, 2, t2));
        h
    }

    #[test]
    fn two_lock_servers_granting_one_key_within_a_lease_is_two_live_grants_and_a_release_between_is_not() {
        let h = two_grants("lock-server-1", "lock-server-2", 5, 6, 600);
        let found = lock_call_failures(&h);
        assert_eq!(found.iter().map(|f| f.invariant).collect::<Vec<_>>(), [ids::NO_TWO_LIVE_GRANTS], "{found:?}");
        // The same, the first grant released (by token) before the second acquire began.
        let mut h: Vec<Line> = Vec::new();
        h.extend(opened("lock-server-1", 0, 0, 1));
        h.extend(opened("lock-server-2", 0, 0, 2));
        h.extend(granted("lock-server-1", 1, 100, 1, 5));
        h.extend(call("lock-server-1", 2, 300, 10, Asked::Release { key: "k".into(), token: 5 }, Answered::Done));
        h.extend(granted("lock-server-2", 1, 600, 2, 6));
        assert!(lock_call_failures(&h).is_empty());
        // A restarted replica's ids start again: its new run is another call.
        let mut h: Vec<Line> = Vec::new();
        h.extend(opened("lock-server-1", 0, 0, 1));
        h.extend(granted("lock-server-1", 1, 100, 1, 5));
        let mut again = granted("lock-server-1", 1, 2_000, 1, 6);
        for l in &mut again {
            l.fields.insert("run", 2.into());
        }
        h.extend(again);
        assert!(lock_call_failures(&h).is_empty(), "the first lease had ended");
    }

    #[test]
    fn a_lock_failure_prints_the_history_of_its_key_and_nothing_of_other_keys() {
        let mut h = two_grants("lock-server-1", "lock-server-2", 5, 6, 600);
        let other =
            Asked::Acquire { key: "other".into(), session: uuid::Uuid::from_u128(1), ttl_ms: 1_500, delay_ms: 0 };
        h.extend(call("lock-server-1", 9, 20, 10, other, Answered::Granted { token: 4 }));
        h.extend(call("lock-server-2", 10, 5_000, 10, Asked::Release { key: "k".into(), token: 6 }, Answered::Done));
        let h = crate::history::merge(h);
        let found = lock_call_failures(&h);
        let detail = &found.first().expect("two live grants").detail;
        let lines = lock_evidence(&h, detail);
        // Both grants of `k`, each call with its answer, and the opens of their sessions; not
        // the other key's grant, nor the release after the failure's instant.
        assert_eq!(lines.len(), 8, "{lines:#?}");
        assert!(lines.iter().all(|l| !l.contains("\"other\"")), "{lines:#?}");
        assert!(lines.iter().any(|l| l.contains("store_answer (acquire)") && l.contains("\"token\":6")), "{lines:#?}");
        assert!(lines.iter().all(|l| !l.contains("release")), "{lines:#?}");
        assert!(lock_evidence(&h, "the fenced set lost 1 element").is_empty());
    }

    #[test]
    fn the_lock_server_on_postgresql_is_judged_against_its_own_lockdb_only() {
        // One key granted on etcd and on lockdb within a lease, the second with a lower
        // token: two lock services, two histories, no failure.
        let h = two_grants("lock-server-1", "lock-server-pg", 50, 6, 600);
        assert!(lock_call_failures(&h).is_empty(), "{:?}", lock_call_failures(&h));
        // Within lockdb's own history the same grants break it.
        let found = lock_call_failures(&two_grants("lock-server-pg", "lock-server-pg", 50, 6, 600));
        assert!(found.iter().any(|f| f.invariant == ids::NO_TWO_LIVE_GRANTS), "{found:?}");
        // lockdb's clock may end a lease up to CLOCK_ADVANCE_MS_MAX early; etcd's none.
        let early = |process: &str| lock_call_failures(&two_grants(process, process, 5, 6, 1_550));
        assert!(early("lock-server-pg").is_empty(), "{:?}", early("lock-server-pg"));
        assert!(early("lock-server-1").iter().any(|f| f.invariant == ids::NO_TWO_LIVE_GRANTS));
    }

    fn failures_of(rows: &PaydbRows, rail: &RailCallLog, history: &[Line]) -> Vec<Failure> {
        failures(&evidence(rows, rail, &[], history))
    }

    #[test]
    fn two_holders_believing_at_once_on_the_host_clock_is_a_correctness_failure() {
        let history = vec![
            session("executor-1", 1_000, "s1", 60_000),
            belief("executor-1", 1_000, "acct-1", 5, "s1", 2_000),
            session("executor-2", 1_500, "s2", 60_000),
            // executor-1 still believes until 2 000 on the shared clock: an overlap.
            belief("executor-2", 1_500, "acct-1", 6, "s2", 3_000),
        ];
        let (rows, rail) = (PaydbRows::default(), RailCallLog::default());
        let f = online_failures(&evidence(&rows, &rail, &[], &history));
        assert!(f.iter().any(|f| f.invariant == ids::NO_TWO_BELIEVING_HOLDERS), "{f:?}");
        // After executor-1's deadline, no overlap.
        let later = vec![history[0].clone(), history[1].clone(), session("executor-2", 2_500, "s2", 60_000), {
            let mut l = history[3].clone();
            l.mono_ms = 2_500;
            l
        }];
        assert!(online_failures(&evidence(&rows, &rail, &[], &later)).is_empty());
    }

    #[test]
    fn a_holder_the_nemesis_killed_believes_nothing_after() {
        let crash = parse_line(
            "nemesis",
            r#"{"seq":0,"t_ms":0,"node":"nemesis","mono_ms":1200,"wall_ms":0,"kind":"schedule","verb":"crash","nodes":["executor-1"],"skipped":false}"#,
        );
        let history = vec![
            session("executor-1", 1_000, "s1", 60_000),
            belief("executor-1", 1_000, "acct-1", 5, "s1", 2_000),
            crash.unwrap_or_else(|| panic!("bad test line")),
            session("executor-2", 1_500, "s2", 60_000),
            belief("executor-2", 1_500, "acct-1", 6, "s2", 3_000),
        ];
        let (rows, rail) = (PaydbRows::default(), RailCallLog::default());
        assert!(online_failures(&evidence(&rows, &rail, &[], &history)).is_empty());
    }

    #[test]
    fn a_fence_sampled_lower_than_before_is_a_correctness_failure() {
        let s = |at: u64, fence: i64| (at, BTreeMap::from([("acct-1".to_owned(), fence)]), BTreeMap::new());
        let samples = vec![s(100, 4), s(600, 7), s(1_100, 6)];
        let (rows, rail) = (PaydbRows::default(), RailCallLog::default());
        let f = online_failures(&evidence(&rows, &rail, &samples, &[]));
        assert!(f.iter().any(|f| f.invariant == ids::FENCE_NEVER_DECREASES), "{f:?}");
        assert!(online_failures(&evidence(&rows, &rail, &samples[..2], &[])).is_empty());
    }

    #[test]
    fn a_payout_the_rail_saw_twice_fails_the_run_as_correctness_and_sorts_first() {
        let id = Uuid::from_u128(7);
        let call = |paid: bool| dlock_contract::rail::RailCall {
            client_ref: id.to_string(),
            amount_minor: 100,
            currency: "EUR".into(),
            outcome: dlock_contract::rail::RailCallOutcome::Accepted,
            paid,
            rail_reference: Some("r".into()),
            received_at: chrono::DateTime::from_timestamp_millis(0).unwrap_or_default(),
        };
        let rail = RailCallLog { calls: vec![call(true), call(true)] };
        let rows = PaydbRows { payouts: vec![(id, PayoutState::Pending)], ..PaydbRows::default() };
        let e = Evidence { rows: &rows, rail: &rail, report: None, samples: &[], history: &[], not_created: 0 };
        let f = failures(&e);
        assert_eq!(
            f.first().map(|f| (f.class, f.invariant)),
            Some((FailureClass::Correctness, ids::AT_MOST_ONE_RAIL_CALL))
        );
        assert!(f.iter().any(|f| f.invariant == ids::EVERY_PAYOUT_SETTLES));
    }

    #[test]
    fn traced_fenced_writes_are_judged_as_the_services_write_them() {
        let line = |process: &str, mono: u64, body: &str| {
            let text = format!(r#"{{"seq":0,"t_ms":0,"node":"{process}","mono_ms":{mono},"wall_ms":0,{body}}}"#);
            parse_line(process, &text).unwrap_or_else(|| panic!("bad test line"))
        };
        let write = |mono: u64, payout: &str, token: i64, answer: &str, stored: i64| {
            line(
                "payment-resource",
                mono,
                &format!(
                    r#""kind":"fenced_write","op":"claim","payout":"{payout}","account":"acct-1","owner":"e/1","presented_token":{token},"stored_token":{stored},"answer":"{answer}","admission":null,"fenced":true,"state_before":null,"replay":false"#
                ),
            )
        };
        let history = vec![write(1_000, "p1", 7, "accepted", 7), write(5_000, "p2", 5, "accepted", 5)];
        let (writes, outcomes) = traced(&history);
        assert_eq!((writes.len(), outcomes.len()), (2, 0));
        let (rows, rail) = (PaydbRows::default(), RailCallLog::default());
        let f = failures(&evidence(&rows, &rail, &[], &history));
        assert!(f.iter().any(|f| f.invariant == ids::FENCE_ACCEPTS_RISING_TOKENS), "{f:?}");
        let refused = vec![write(1_000, "p1", 8, "fenced_out", 7)];
        let f = failures(&evidence(&rows, &rail, &[], &refused));
        assert!(f.iter().any(|f| f.invariant == ids::FENCED_OUT_HAS_NEWER_HOLDER), "{f:?}");
        // The payment-resource stopped in between (the nemesis's record): excused.
        let pause = |verb: &str, mono: u64| {
            line(
                "nemesis",
                mono,
                &format!(r#""kind":"schedule","verb":"{verb}","nodes":["payment-resource"],"skipped":false"#),
            )
        };
        let stopped_between =
            vec![history[0].clone(), pause("pause", 2_000), pause("resume", 4_000), history[1].clone()];
        assert_eq!(stopped(&stopped_between).len(), 1);
        let f = failures(&evidence(&rows, &rail, &[], &stopped_between));
        assert!(f.iter().all(|f| f.invariant != ids::FENCE_ACCEPTS_RISING_TOKENS), "{f:?}");
        let fine = vec![write(1_000, "p1", 5, "accepted", 5), write(5_000, "p2", 7, "accepted", 7)];
        let f = failures(&evidence(&rows, &rail, &[], &fine));
        assert!(f.iter().all(|f| f.class != FailureClass::Correctness), "{f:?}");
    }
}
