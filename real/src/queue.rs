//! The control beside dlock in the same real run: a plain work queue, as a user writes one
//! without fencing, under the same workload and the same faults, paying through a rail-stub
//! of its own with the same knobs and seed (its record kept apart from dlock's, so each is
//! judged on its own calls). Its payments counted twice come from that stub's record.
//!
//! The queue is the end-to-end bench's peer baseline (crates/dlock/benches/end_to_end.rs:
//! `SELECT … FOR UPDATE SKIP LOCKED` in PostgreSQL, one rail call, then mark paid) with the
//! one thing a production queue adds: a job claimed longer ago than the visibility timeout
//! ([`VISIBILITY_MS`], the executors' lease) goes back to PENDING, so a stalled or dead
//! worker's job is taken by another (at-least-once delivery, as Sidekiq, SQS or River
//! rescue stuck jobs). It checks nothing dlock checks: no lease belief, no fence, no intent.
//!
//! Its workers are tasks of `dlock-real`, in three groups of [`TASKS_PER_GROUP`] like the
//! three executors' tasks. The nemesis's pause and crash of `executor-N` are mirrored on
//! group N (frozen at its next step; a crash drops the jobs in hand and stops the group for
//! `for-ms`), and its tasks stall 2 s before 2 % of their rail calls, as the executors stall
//! before 2 % of their writes. Faults of the shared processes (PostgreSQL paused or killed)
//! reach it by themselves; network faults of `executor-3` are not mirrored.
//!
//! Invariants: every job is created once (its id is its index); a job is only re-queued
//! while SUBMITTING past the visibility timeout; the queue's database is its own
//! (`queuedb`), never paydb.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::rand::Rng;
use dlock_sim::fault::Fault;
use serde_json::{json, Value};

use crate::history::now_mono_ms;
use crate::workload::Shape;

/// The visibility timeout: a SUBMITTING job claimed longer ago goes back to PENDING.
pub const VISIBILITY_MS: u64 = crate::run::LEASE_MS;
/// How often the rescuer looks for stuck jobs.
pub const RESCUE_EVERY_MS: u64 = 500;
/// Worker tasks per group (as many as an executor's tasks).
pub const TASKS_PER_GROUP: usize = 8;
/// Worker groups, one per executor.
pub const GROUPS: usize = 3;
/// The stall before a rail call, and its probability (the executors' chaos stall).
pub const STALL_MS: u64 = crate::run::STALL_MS;
pub const STALL_RATE: f64 = 0.02;
/// A worker's pause when the queue is empty.
pub const IDLE_MS: u64 = 50;

/// The faults mirrored on a group: frozen or down until an instant.
#[derive(Default)]
struct GroupState {
    frozen: bool,
    down_until: Option<Instant>,
    /// Bumped at each crash: a task holding a job of an older epoch drops it.
    epoch: u64,
}

/// What the queue did.
#[derive(Debug, Default, Clone)]
pub struct QueueOutcome {
    pub created: usize,
    pub paid: usize,
    pub failed: usize,
    pub rail_calls: usize,
    pub paid_twice: u64,
    pub called_twice: u64,
    pub paid_per_s: Option<f64>,
    pub p50_ms: Option<u64>,
    pub p99_ms: Option<u64>,
}

/// The queue (module doc).
pub struct Queue {
    pool: sqlx::PgPool,
    stub: BaseUrl,
    client: HttpClient,
    seed: u64,
    groups: Vec<Mutex<GroupState>>,
    /// Host monotonic ms of each job's create, and of its first paid answer.
    created_at: Mutex<BTreeMap<i64, u64>>,
    paid_at: Mutex<BTreeMap<i64, u64>>,
}

fn err(e: sqlx::Error) -> String {
    e.to_string()
}

impl Queue {
    /// Creates `queuedb` on the PostgreSQL of `paydb_url`, and the queue's tables.
    pub async fn setup(paydb_url: &str, stub: BaseUrl, seed: u64) -> Result<Arc<Queue>, String> {
        let pool = crate::cluster::create_database(
            paydb_url,
            "queuedb",
            u32::try_from(GROUPS * TASKS_PER_GROUP / 2).unwrap_or(12),
        )
        .await?;
        for ddl in [
            "CREATE TABLE q_accounts (id TEXT PRIMARY KEY, balance_minor BIGINT NOT NULL)",
            "CREATE TABLE q_payouts (id BIGINT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES q_accounts(id), \
             amount_minor BIGINT NOT NULL, state TEXT NOT NULL, claimed_at TIMESTAMPTZ, attempts INT NOT NULL DEFAULT 0, \
             rail_reference TEXT)",
            "CREATE INDEX q_payouts_pending ON q_payouts (id) WHERE state = 'PENDING'",
        ] {
            sqlx::query(ddl).execute(&pool).await.map_err(err)?;
        }
        Ok(Arc::new(Queue {
            pool,
            stub,
            client: HttpClient::new(2_000, 4_000),
            seed,
            groups: (0..GROUPS).map(|_| Mutex::new(GroupState::default())).collect(),
            created_at: Mutex::new(BTreeMap::new()),
            paid_at: Mutex::new(BTreeMap::new()),
        }))
    }

    /// Opens the accounts as the dlock workload does (95 % of what their payouts ask).
    pub async fn open_accounts(&self, shape: &Shape) -> Result<(), String> {
        let mut per_account: BTreeMap<String, i64> = BTreeMap::new();
        for i in 0..shape.payouts() {
            *per_account.entry(shape.account(i)).or_insert(0) += shape.amount(i);
        }
        for (a, total) in per_account {
            sqlx::query("INSERT INTO q_accounts VALUES ($1, $2)")
                .bind(a)
                .bind(total * 95 / 100)
                .execute(&self.pool)
                .await
                .map_err(err)?;
        }
        Ok(())
    }

    /// Creates the jobs at the shape's rate (the same payouts as dlock's workload).
    pub async fn create(self: Arc<Self>, shape: Shape) -> usize {
        let t0 = Instant::now();
        let mut created = 0;
        for i in 0..shape.payouts() {
            let due = t0 + Duration::from_millis(i * 1000 / u64::from(shape.per_s.max(1)));
            tokio::time::sleep_until(due.into()).await;
            let deadline = Instant::now() + Duration::from_secs(crate::workload::CREATE_RETRY_S_MAX);
            let id = i64::try_from(i).unwrap_or(i64::MAX);
            loop {
                let r = sqlx::query(
                    "INSERT INTO q_payouts (id, account_id, amount_minor, state) VALUES ($1, $2, $3, 'PENDING') \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(id)
                .bind(shape.account(i))
                .bind(shape.amount(i))
                .execute(&self.pool)
                .await;
                if r.is_ok() {
                    created += 1;
                    if let Ok(mut g) = self.created_at.lock() {
                        g.insert(id, now_mono_ms());
                    }
                    break;
                }
                if Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
        created
    }

    /// Mirrors a nemesis fault of `executor-N` on group N (module doc).
    pub fn mirror(&self, f: &Fault) {
        let group = |node: &str| -> Option<usize> {
            let n: usize = node.strip_prefix("executor-")?.parse().ok()?;
            (1..=GROUPS).contains(&n).then(|| n - 1)
        };
        let with = |node: &str, apply: &dyn Fn(&mut GroupState)| {
            if let Some(g) = group(node).and_then(|g| self.groups.get(g)) {
                if let Ok(mut s) = g.lock() {
                    apply(&mut s);
                }
            }
        };
        match f {
            Fault::Pause { node, .. } => with(node, &|s| s.frozen = true),
            Fault::Resume { node } => with(node, &|s| s.frozen = false),
            Fault::Crash { node, .. } => with(node, &|s| {
                s.epoch += 1;
                s.frozen = false;
                s.down_until = Some(Instant::now() + Duration::from_secs(3_600));
            }),
            Fault::Start { node } => with(node, &|s| s.down_until = None),
            Fault::Heal { name: None } => {
                for g in &self.groups {
                    if let Ok(mut s) = g.lock() {
                        s.frozen = false;
                    }
                }
            }
            _ => {}
        }
    }

    /// Ends every mirrored fault (the run's heal).
    pub fn heal(&self) {
        for g in &self.groups {
            if let Ok(mut s) = g.lock() {
                s.frozen = false;
                s.down_until = None;
            }
        }
    }

    /// Waits while group `g` is frozen or down; the epoch to hold a job under.
    async fn gate(&self, g: usize) -> u64 {
        loop {
            let (blocked, epoch) = match self.groups[g].lock() {
                Ok(s) => (s.frozen || s.down_until.is_some_and(|t| Instant::now() < t), s.epoch),
                Err(_) => (false, 0),
            };
            if !blocked {
                return epoch;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn crashed_since(&self, g: usize, epoch: u64) -> bool {
        self.groups[g].lock().map(|s| s.epoch != epoch).unwrap_or(false)
    }

    /// One job through the queue: `Ok(false)` when none is PENDING.
    async fn work_one(&self, g: usize, rng: &mut dlock_rt::rand::SeededRng) -> Result<bool, String> {
        let epoch = self.gate(g).await;
        let mut tx = self.pool.begin().await.map_err(err)?;
        let row: Option<(i64, i64)> = sqlx::query_as(
            "SELECT id, amount_minor FROM q_payouts WHERE state = 'PENDING' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED",
        )
        .fetch_optional(&mut *tx)
        .await
        .map_err(err)?;
        let Some((id, amount)) = row else {
            tx.commit().await.map_err(err)?;
            return Ok(false);
        };
        sqlx::query(
            "UPDATE q_payouts SET state = 'SUBMITTING', claimed_at = now(), attempts = attempts + 1 WHERE id = $1",
        )
        .bind(id)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
        tx.commit().await.map_err(err)?;
        if rng.gen_bool(STALL_RATE) {
            tokio::time::sleep(Duration::from_millis(STALL_MS)).await;
        }
        self.gate(g).await;
        if self.crashed_since(g, epoch) {
            return Ok(true); // the job died with the worker; the rescuer re-queues it
        }
        let body =
            json!({"clientRef": format!("q-{id}"), "amountMinor": amount, "currency": crate::workload::CURRENCY});
        let r = self
            .client
            .send(
                &self.stub,
                http::Method::POST,
                "/submit",
                &[("content-type", "application/json")],
                Some(body.to_string().into()),
            )
            .await;
        self.gate(g).await;
        if self.crashed_since(g, epoch) {
            return Ok(true);
        }
        match r {
            Ok(r) if r.status == 200 => {
                let ack: Value = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
                let reference = ack.get("railReference").and_then(Value::as_str).unwrap_or_default().to_owned();
                let mut tx = self.pool.begin().await.map_err(err)?;
                let account: Option<(String,)> = sqlx::query_as(
                    "UPDATE q_payouts SET state = 'PAID', rail_reference = $2 WHERE id = $1 AND state <> 'PAID' RETURNING account_id",
                )
                .bind(id)
                .bind(&reference)
                .fetch_optional(&mut *tx)
                .await
                .map_err(err)?;
                if let Some((account,)) = account {
                    sqlx::query("UPDATE q_accounts SET balance_minor = balance_minor - $2 WHERE id = $1")
                        .bind(account)
                        .bind(amount)
                        .execute(&mut *tx)
                        .await
                        .map_err(err)?;
                }
                tx.commit().await.map_err(err)?;
                if let Ok(mut p) = self.paid_at.lock() {
                    p.entry(id).or_insert_with(now_mono_ms);
                }
            }
            Ok(r) if r.status == 402 => {
                sqlx::query("UPDATE q_payouts SET state = 'FAILED' WHERE id = $1 AND state = 'SUBMITTING'")
                    .bind(id)
                    .execute(&self.pool)
                    .await
                    .map_err(err)?;
            }
            // A 5xx or no answer: left SUBMITTING; the rescuer re-queues it (at-least-once).
            _ => {}
        }
        Ok(true)
    }

    /// Runs the workers and the rescuer until `stop`.
    pub fn spawn(
        self: &Arc<Self>,
        rt: &tokio::runtime::Runtime,
        stop: Arc<AtomicBool>,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        let mut handles = Vec::new();
        for g in 0..GROUPS {
            for t in 0..TASKS_PER_GROUP {
                let (q, stop) = (self.clone(), stop.clone());
                let seed = self.seed ^ ((g * TASKS_PER_GROUP + t) as u64).wrapping_mul(0x2545_F491_4F6C_DD1D);
                handles.push(rt.spawn(async move {
                    let mut rng = dlock_rt::rand::seeded(seed);
                    while !stop.load(Ordering::Relaxed) {
                        match q.work_one(g, &mut rng).await {
                            Ok(true) => {}
                            _ => tokio::time::sleep(Duration::from_millis(IDLE_MS)).await,
                        }
                    }
                }));
            }
        }
        let (q, stop) = (self.clone(), stop);
        handles.push(rt.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let _ = sqlx::query(
                    "UPDATE q_payouts SET state = 'PENDING' WHERE state = 'SUBMITTING' \
                     AND claimed_at < now() - make_interval(secs => $1::float8 / 1000)",
                )
                .bind(VISIBILITY_MS as f64)
                .execute(&q.pool)
                .await;
                tokio::time::sleep(Duration::from_millis(RESCUE_EVERY_MS)).await;
            }
        }));
        handles
    }

    /// Jobs not yet PAID or FAILED.
    pub async fn open(&self) -> Result<i64, String> {
        sqlx::query_scalar("SELECT count(*) FROM q_payouts WHERE state NOT IN ('PAID', 'FAILED')")
            .fetch_one(&self.pool)
            .await
            .map_err(err)
    }

    /// The queue's figures, its double payments from its stub's record.
    pub async fn outcome(&self, created: usize) -> QueueOutcome {
        let mut o = QueueOutcome { created, ..QueueOutcome::default() };
        let counts: Vec<(String, i64)> = sqlx::query_as("SELECT state, count(*) FROM q_payouts GROUP BY state")
            .fetch_all(&self.pool)
            .await
            .unwrap_or_default();
        for (s, n) in counts {
            match s.as_str() {
                "PAID" => o.paid = usize::try_from(n).unwrap_or(0),
                "FAILED" => o.failed = usize::try_from(n).unwrap_or(0),
                _ => {}
            }
        }
        if let Ok(r) = self.client.send(&self.stub, http::Method::GET, "/calls", &[], None).await {
            if let Ok(log) = serde_json::from_slice::<dlock_contract::rail::RailCallLog>(&r.body) {
                o.rail_calls = log.calls.len();
                let mut paid: BTreeMap<&str, u64> = BTreeMap::new();
                let mut called: BTreeMap<&str, u64> = BTreeMap::new();
                for c in &log.calls {
                    *called.entry(c.client_ref.as_str()).or_insert(0) += 1;
                    if c.paid {
                        *paid.entry(c.client_ref.as_str()).or_insert(0) += 1;
                    }
                }
                o.paid_twice = paid.values().filter(|n| **n > 1).count() as u64;
                o.called_twice = called.values().filter(|n| **n > 1).count() as u64;
            }
        }
        let created_at = self.created_at.lock().map(|g| g.clone()).unwrap_or_default();
        let paid_at = self.paid_at.lock().map(|g| g.clone()).unwrap_or_default();
        let mut ms: Vec<u64> =
            paid_at.iter().filter_map(|(id, t)| created_at.get(id).map(|c| t.saturating_sub(*c))).collect();
        ms.sort_unstable();
        o.p50_ms = crate::judge::percentile(&ms, 0.50);
        o.p99_ms = crate::judge::percentile(&ms, 0.99);
        if let (Some(first), Some(last)) = (created_at.values().min(), paid_at.values().max()) {
            if last > first {
                o.paid_per_s = Some(o.paid as f64 * 1000.0 / (last - first) as f64);
            }
        }
        o
    }
}
