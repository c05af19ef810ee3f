//! One real run, end to end (docs/real-runs.md): the plan printed, the cluster started,
//! the workload and the fence sampler running while the nemesis plays the plan's timeline,
//! then every fault healed, the cluster left to settle, and the run judged.
//!
//! Exit codes are the simulation's classes (`dlock_sim::outcome::FailureClass::exit_code`):
//! 0 clean, 127 crash (the harness or the cluster broke), 128 liveness, 129 correctness;
//! 2 usage. A failure prints the seed, the plan and the first broken invariant, and the run's
//! directory keeps the merged history (`incident.jsonl`) and its timeline (`timeline.html`).
//!
//! Invariants: the plan is printed before any process starts; every fault is healed before
//! the settle phase; the cluster is stopped on every path out (its `Drop`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_rt::http::{BaseUrl, Bearer, HttpClient};
use dlock_sim::outcome::{Failure, FailureClass};
use serde_json::Value;

use crate::cluster::{Cluster, Start};
use crate::history::{self, Own};
use crate::judge::{self, Evidence};
use crate::mechanism::Nemesis;
use crate::nemesis::{describe, Plan};
use crate::report::Outcome;
use crate::workload::{self, Shape};

/// The lease and stall of the run's executors (as `dlock demo` uses).
pub const LEASE_MS: u64 = 1_500;
pub const STALL_MS: u64 = 2_000;

/// The workload's default rate and accounts (`--rate`, `--accounts`).
pub const RATE_PER_S_DEFAULT: u32 = 20;
pub const ACCOUNTS_DEFAULT: u32 = 40;

/// Bound on the settle phase after the heal.
pub const SETTLE_S_DEFAULT: u64 = 180;

/// A real run's arguments.
#[derive(Debug, Clone)]
pub struct Args {
    pub seed: u64,
    pub duration_ms: u64,
    pub kinds: Vec<&'static str>,
    pub json: bool,
    pub plant: Option<String>,
    pub keep: bool,
    pub dir: Option<PathBuf>,
    pub per_s: u32,
    pub accounts: u32,
    pub settle_s: u64,
    /// Run the plain queue beside dlock (`crate::queue`); `--no-queue` turns it off.
    pub queue: bool,
    /// Run the lock-set workload beside it (`crate::lockset`); `--no-lock-set` turns it off.
    pub lock_set: bool,
}

/// `90`, `90s`, `10m`, `1h`: a duration in ms.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let (num, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad duration {s:?} (e.g. 90s, 10m)"))?;
    let ms = match unit {
        "ms" => n,
        "s" => n * 1_000,
        "m" => n * 60_000,
        "h" => n * 3_600_000,
        _ => return Err(format!("bad duration unit in {s:?} (ms, s, m, h)")),
    };
    if ms == 0 {
        return Err("the duration must be positive".to_owned());
    }
    Ok(ms)
}

/// The settings every process of the run gets (module doc of `crate::cluster`).
fn cluster_env(plan: &Plan, plant: Option<&crate::plants::RealPlant>) -> (String, Vec<(String, String)>) {
    let mut env: Vec<(String, String)> = plan.rail.env().into_iter().map(|(k, v)| (k.to_owned(), v)).collect();
    let mut set = |k: &str, v: String| env.push((k.to_owned(), v));
    set("DLOCK_RAIL_STUB_DROP_HOLD_MS", "3000".into());
    set("DLOCK_RAIL_STUB_SEED", plan.seed.to_string());
    set("DLOCK_RAIL_PROXY_READ_TIMEOUT_MS", "2000".into());
    set("DLOCK_EXECUTOR_SUBMIT_READ_TIMEOUT_MS", "4000".into());
    set("DLOCK_EXECUTOR_LOCK_TTL_MS", LEASE_MS.to_string());
    set("DLOCK_EXECUTOR_CHAOS_PAUSE_RATE", "0.02".into());
    set("DLOCK_EXECUTOR_CHAOS_PAUSE_MS", STALL_MS.to_string());
    set("DLOCK_EXECUTOR_CONCURRENCY", "8".into());
    set("DLOCK_EXECUTOR_POLL_INTERVAL_MS", "50".into());
    let mut profile = "production".to_owned();
    if let Some(p) = plant {
        let (pr, more) = crate::plants::cluster_settings(p);
        profile = pr.to_owned();
        for (k, v) in more {
            env.retain(|(have, _)| *have != k);
            env.push((k, v));
        }
    }
    (profile, env)
}

/// The test-only build a plant runs, checked to be one that plants it (it says so on
/// stderr at every start: `dlock`'s `announce_planted_bug`).
fn planted_binary(root: &Path, p: &crate::plants::RealPlant) -> Result<Option<PathBuf>, String> {
    let Some(rel) = p.binary() else {
        return Ok(None);
    };
    let bin = root.join(rel);
    let build = "cargo xtask real plants, or: cargo build --release -p dlock --features planted, copy target/release/dlock to target/planted/dlock, then cargo build --release -p dlock";
    let out = std::process::Command::new(&bin)
        .arg("--version")
        .env(dlock_contract::planted::ENV, p.bug.name())
        .output()
        .map_err(|e| format!("{}: {e} (build it: {build})", bin.display()))?;
    let said = String::from_utf8_lossy(&out.stderr);
    if !said.contains(&format!("planted bug {} is on", p.bug.name())) {
        return Err(format!(
            "{} is not the test-only build (build it: {build}); it said: {}",
            bin.display(),
            said.trim()
        ));
    }
    Ok(Some(bin))
}

pub(crate) fn say(json: bool, line: &str) {
    if json {
        eprintln!("{line}");
    } else {
        println!("{line}");
    }
}

/// Runs; the process exit code (module doc).
pub fn run(root: &Path, a: &Args) -> u8 {
    run_verdict(root, a).0
}

/// Runs; the exit code, and whether the planted bug was caught (`None`: no plant, or the
/// run never reached its judgement).
pub fn run_verdict(root: &Path, a: &Args) -> (u8, Option<bool>) {
    let plant = match a.plant.as_deref().map(crate::plants::find).transpose() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("dlock-real: {e}");
            return (2, None);
        }
    };
    let planted_bin = match plant.map(|p| planted_binary(root, p)).transpose() {
        Ok(b) => b.flatten(),
        Err(e) => {
            eprintln!("dlock-real: {e}");
            return (2, None);
        }
    };
    let plan = Plan::draw(a.seed, a.duration_ms, &a.kinds);
    for l in plan.lines() {
        say(a.json, &l);
    }
    let dir =
        a.dir.clone().unwrap_or_else(|| PathBuf::from(format!("/tmp/dlock-real-{}-{}", a.seed, std::process::id())));
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock-real: no runtime: {e}");
            return (FailureClass::Crash.exit_code(), None);
        }
    };
    let (profile, mut env) = cluster_env(&plan, plant);
    if let Some(bin) = &planted_bin {
        env.push(("LOCAL_DLOCK_BIN".to_owned(), bin.display().to_string()));
    }
    // The forger's two owner-bound credentials (crate::forger), in a file only root reads.
    let creds = crate::forger::Credentials::fresh();
    let creds_file = dir.with_extension("credentials");
    if let Err(e) = crate::cluster::write_private(&creds_file, &creds.lines()) {
        eprintln!("dlock-real: crash: {}: {e}", creds_file.display());
        return (FailureClass::Crash.exit_code(), None);
    }
    let started = Instant::now();
    let start = Start { root, dir: &dir, profile: &profile, env, keep: true, credentials_extra: Some(&creds_file) };
    let cluster = match Cluster::start(&start) {
        Ok(c) => c,
        Err(e) => {
            let _ = std::fs::remove_file(&creds_file);
            eprintln!("dlock-real: crash: the cluster did not start: {e}");
            return (FailureClass::Crash.exit_code(), None);
        }
    };
    say(a.json, &format!("cluster up in {:.1} s ({})", started.elapsed().as_secs_f64(), dir.display()));
    let outcome = play_and_judge(&rt, &cluster, &plan, a, plant, &creds);
    let code = crate::report::report(&dir, &plan, a, &outcome);
    let caught = crate::report::planted_caught(a.plant.as_deref(), &outcome.failures);
    drop(cluster);
    let _ = std::fs::remove_file(&creds_file);
    if !a.keep && (code == 0 || caught == Some(true)) {
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_file(dir.with_extension("up.log"));
    } else {
        say(a.json, &format!("kept {}", dir.display()));
    }
    (code, caught)
}

fn crash(msg: String) -> Outcome {
    Outcome { failures: vec![Failure::crash(dlock_sim::oracle::ids::WORLD_BUILDS, msg)], ..Outcome::default() }
}

fn play_and_judge(
    rt: &tokio::runtime::Runtime,
    cluster: &Cluster,
    plan: &Plan,
    a: &Args,
    plant: Option<&crate::plants::RealPlant>,
    creds: &crate::forger::Credentials,
) -> Outcome {
    let trace_dir = cluster.trace_dir();
    let (nem_out, run_out) = match (Own::create(&trace_dir, "nemesis"), Own::create(&trace_dir, "run")) {
        (Ok(n), Ok(r)) => (n, r),
        (Err(e), _) | (_, Err(e)) => return crash(e),
    };
    let paydb_url = cluster.var("PAYDB_URL");
    let pool = match rt.block_on(sqlx::postgres::PgPoolOptions::new().max_connections(4).connect(&paydb_url)) {
        Ok(p) => p,
        Err(e) => return crash(format!("paydb: {e}")),
    };
    let bearer = |var: &str| Bearer::file(Path::new(&cluster.var(var))).ok();
    let operator = HttpClient::new(2_000, 5_000).with_bearer(bearer("OPERATOR_TOKEN_FILE"));
    let reader = HttpClient::new(2_000, 10_000).with_bearer(bearer("READER_TOKEN_FILE"));
    let Ok(payment) = BaseUrl::parse(&cluster.var("PAYMENT_URL")) else {
        return crash("no payment-resource URL".into());
    };
    let Ok(stub) = BaseUrl::parse(&cluster.var("STUB_URL")) else {
        return crash("no rail-stub URL".into());
    };
    let shape = Shape { seed: plan.seed, accounts: a.accounts, per_s: a.per_s, duration_ms: plan.duration_ms };
    if let Err(e) = rt.block_on(workload::open_accounts(&operator, &payment, &shape)) {
        return crash(format!("opening the accounts: {e}"));
    }
    // The plain queue beside it: its own rail-stub (same knobs, same seed) and database.
    let mut queue_stub = None;
    let queue = if a.queue {
        let started = start_queue_stub(cluster, plan).and_then(|(child, url)| {
            queue_stub = Some(ChildGuard(child));
            rt.block_on(async {
                let q = crate::queue::Queue::setup(&paydb_url, url, plan.seed).await?;
                q.open_accounts(&shape).await?;
                Ok::<_, String>(q)
            })
        });
        match started {
            Ok(q) => Some(q),
            Err(e) => return crash(format!("the queue baseline did not start: {e}")),
        }
    } else {
        None
    };

    // The workload and the sampler run on the runtime while this thread plays the plan.
    let stop = Arc::new(AtomicBool::new(false));
    run_out.write("phase", &[("phase", "faults".into()), ("detail", format!("{} payouts/s", a.per_s).into())]);
    let work = {
        let (operator, payment, shape, stop) = (operator.clone(), payment.clone(), shape.clone(), stop.clone());
        rt.spawn(async move { workload::create_payouts(&operator, &payment, &shape, stop).await })
    };
    let lock_set_stop = Arc::new(AtomicBool::new(false));
    let lock_set = if a.lock_set {
        let token = PathBuf::from(cluster.var("DIR")).join("secrets/executor-token");
        let started = rt.block_on(crate::lockset::LockSet::start(
            &paydb_url,
            &[cluster.var("LOCK_PG_URL")],
            &token,
            plan.seed,
            lock_set_stop.clone(),
        ));
        match started {
            Ok(l) => Some(l),
            Err(e) => return crash(format!("the lock-set workload did not start: {e}")),
        }
    } else {
        None
    };
    let queue_stop = Arc::new(AtomicBool::new(false));
    let (queue_work, queue_create) = match &queue {
        Some(q) => (q.spawn(rt, queue_stop.clone()), Some(rt.spawn(q.clone().create(shape.clone())))),
        None => (Vec::new(), None),
    };
    let sampling = Arc::new(AtomicBool::new(true));
    let (sampler, samples) = judge::spawn_sampler(rt, pool.clone(), sampling.clone());

    // The soak's gauges, for the whole run (crate::soak).
    let working = Arc::new(AtomicBool::new(true));
    let (gauger, gauges) =
        crate::soak::spawn(rt, pool.clone(), PathBuf::from(cluster.var("RUN")), sampling.clone(), working.clone());

    let mut nemesis = Nemesis::new(cluster, a.accounts);
    let t0 = Instant::now();
    let applied = play(plan, &mut nemesis, queue.as_deref(), &nem_out, a.json);
    if let Some(q) = &queue {
        q.heal();
    }
    for e in nemesis.heal_all() {
        nem_out.write("note", &[("what", "heal-all".into()), ("result", e.clone().into())]);
    }
    lock_set_stop.store(true, Ordering::Relaxed);
    let lock_set = lock_set.map(|l| rt.block_on(l.finish()));
    say(a.json, &format!("  {:>7.3}s every fault healed; settling", t0.elapsed().as_secs_f64()));
    run_out.write("phase", &[("phase", "settle".into()), ("detail", "every fault healed".into())]);
    // The workload creates every payout it drew (late ones after the heal); each create is
    // bounded (workload::CREATE_RETRY_S_MAX), and the settle bound stops the rest.
    let settle_deadline = Instant::now() + Duration::from_secs(a.settle_s);
    while !work.is_finished() && Instant::now() < settle_deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let done = rt.block_on(work).unwrap_or_default();
    working.store(false, Ordering::Relaxed);

    // Settle: every payout terminal or quarantined, every intent resolved, within the bound.
    let deadline = settle_deadline;
    loop {
        match rt.block_on(judge::open_counts(&pool)) {
            Ok((0, 0)) => break,
            _ if Instant::now() > deadline => break,
            _ => std::thread::sleep(Duration::from_millis(500)),
        }
    }
    let queue_created = queue_create.map(|h| rt.block_on(h).unwrap_or(0)).unwrap_or(0);
    if let Some(q) = &queue {
        while Instant::now() < deadline && !matches!(rt.block_on(q.open()), Ok(0)) {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    queue_stop.store(true, Ordering::Relaxed);
    for h in queue_work {
        let _ = rt.block_on(h);
    }
    let queue_outcome = queue.as_ref().map(|q| rt.block_on(q.outcome(queue_created)));
    drop(queue_stub);
    sampling.store(false, Ordering::Relaxed);
    let _ = rt.block_on(sampler);
    let _ = rt.block_on(gauger);
    let soak = gauges.lock().map(|g| g.clone()).unwrap_or_default();
    // The forger, after the settle and before the checks (crate::forger).
    run_out.write(
        "phase",
        &[
            ("phase", "forger".into()),
            ("detail", "forged writes, owner attacks, a lapsed session, a cross-account batch".into()),
        ],
    );
    let forged = crate::forger::aim(
        Path::new(&cluster.var("DIR")),
        &[cluster.var("PAYMENT_URL")],
        &cluster.list("PROXY_URLS"),
        &cluster.list("LOCK_URLS"),
        creds,
    )
    .and_then(|aim| rt.block_on(crate::forger::run(&aim, &pool, plan.seed)));
    let forged = match forged {
        Ok(log) => log,
        Err(e) => return crash(format!("the forger could not run: {e}")),
    };
    for line in forged.lines() {
        run_out.write("note", &[("what", "forger".into()), ("result", line.into())]);
    }
    say(a.json, &format!("  forger: {} requests, {} got through", forged.lines().len(), forged.failures().len()));
    run_out.write("phase", &[("phase", "checks".into()), ("detail", "".into())]);

    // The evidence.
    let report = reconcile(cluster, plant);
    let rail = match rt.block_on(reader.send(&stub, http::Method::GET, "/calls", &[], None)) {
        Ok(r) if r.status == 200 => serde_json::from_slice(&r.body).ok(),
        _ => None,
    };
    let Some(rail): Option<dlock_contract::rail::RailCallLog> = rail else {
        return crash("the rail-stub's record (GET /calls) could not be read".into());
    };
    let rows = match rt.block_on(judge::read_rows(&pool)) {
        Ok(r) => r,
        Err(e) => {
            let mut o = crash(format!("paydb unreadable: {e}"));
            o.failures[0].invariant = dlock_sim::oracle::ids::PAYDB_READABLE;
            return o;
        }
    };
    let (lines, unparsed) = history::read_dir(&trace_dir);
    let merged = history::merge(lines);
    let samples = samples.lock().map(|g| g.clone()).unwrap_or_default();
    let evidence = Evidence {
        rows: &rows,
        rail: &rail,
        report: report.as_ref(),
        samples: &samples,
        history: &merged,
        not_created: done.not_created,
    };
    let mut failures = judge::failures(&evidence);
    failures.extend(forged.failures());
    let lock_set = match lock_set {
        Some(Ok(o)) => {
            if !o.fenced.lost.is_empty() {
                failures.insert(
                    0,
                    Failure::correctness(
                        crate::lockset::ids::LOCK_SET_KEEPS_ACKNOWLEDGED,
                        format!(
                            "the fenced set lost {} acknowledged elements: {:?}",
                            o.fenced.lost.len(),
                            o.fenced.lost
                        ),
                    ),
                );
            }
            Some(o)
        }
        Some(Err(e)) => {
            failures.push(Failure::crash(dlock_sim::oracle::ids::WORLD_BUILDS, format!("lock-set unreadable: {e}")));
            None
        }
        None => None,
    };
    let (p50, p99, measured) = judge::latencies(&done.created, &merged);
    let evidence = failures
        .iter()
        .find(|f| f.detail.starts_with("key "))
        .map(|f| judge::lock_evidence(&merged, &f.detail))
        .unwrap_or_default();
    // The history opens with the run's own `trace_start` (the seed and the plan's header, as
    // the simulation's does), and the judgement's failures close it.
    let mut merged = merged;
    let start = merged.first().map_or(0, |l| l.mono_ms);
    merged.insert(
        0,
        history::Line {
            process: "dlock-real".into(),
            seq: 0,
            mono_ms: start,
            wall_ms: chrono::Utc::now().timestamp_millis(),
            kind: "trace_start".into(),
            fields: [
                ("schema", Value::from(dlock_rt::events::SCHEMA)),
                ("seed", Value::from(plan.seed)),
                ("config", Value::from(plan.lines().first().cloned().unwrap_or_default())),
            ]
            .into_iter()
            .collect(),
        },
    );
    let end = merged.last().map_or(0, |l| l.mono_ms);
    for (i, f) in failures.iter().enumerate() {
        merged.push(history::Line {
            process: "dlock-real".into(),
            seq: i as u64,
            mono_ms: end,
            wall_ms: chrono::Utc::now().timestamp_millis(),
            kind: "failure".into(),
            fields: [
                ("class", Value::from(f.class.name())),
                ("invariant", Value::from(f.invariant)),
                ("detail", Value::from(f.detail.clone())),
            ]
            .into_iter()
            .collect(),
        });
    }
    let mut by_state = BTreeMap::new();
    for (_, s) in &rows.payouts {
        *by_state.entry(s.as_str().to_owned()).or_insert(0) += 1;
    }
    let posted = by_state.get("POSTED").copied().unwrap_or(0);
    let first = done.created.first().map(|c| c.at_mono_ms);
    let last_post = merged
        .iter()
        .rev()
        .find(|l| {
            l.kind == "fenced_write"
                && l.fields.get("answer").and_then(|v| v.as_str()) == Some("accepted")
                && l.fields.get("op").and_then(|v| v.as_str()).is_some_and(|o| o.starts_with("post"))
        })
        .map(|l| l.mono_ms);
    let posted_per_s = match (first, last_post) {
        (Some(f), Some(l)) if l > f => Some(posted as f64 * 1000.0 / (l - f) as f64),
        _ => None,
    };
    let mut per_ref: BTreeMap<&str, u64> = BTreeMap::new();
    for c in rail.calls.iter().filter(|c| c.paid) {
        *per_ref.entry(c.client_ref.as_str()).or_insert(0) += 1;
    }
    Outcome {
        failures,
        created: done.created.len(),
        not_created: done.not_created,
        by_state,
        applied,
        posted_per_s,
        p50_ms: p50,
        p99_ms: p99,
        posted_measured: measured,
        rail_calls: rail.calls.len(),
        paid_twice: per_ref.values().filter(|n| **n > 1).count() as u64,
        history: history::render(&merged),
        unparsed_lines: unparsed,
        queue: queue_outcome,
        soak,
        lock_set,
        evidence,
    }
}

/// Plays the plan's timeline on the cluster until the end of its duration, closing the
/// self-closing faults on time and mirroring each applied fault on the queue; every fault
/// is recorded as the simulation's `schedule` line and printed. The faults applied, by kind.
fn play(
    plan: &Plan,
    nemesis: &mut Nemesis<'_>,
    queue: Option<&crate::queue::Queue>,
    nem_out: &Own,
    json: bool,
) -> BTreeMap<String, u64> {
    let mut applied: BTreeMap<String, u64> = BTreeMap::new();
    let t0 = Instant::now();
    let close_due = |nemesis: &mut Nemesis<'_>| {
        for c in nemesis.close_due() {
            nem_out.write("note", &[("what", "close".into()), ("result", c.into())]);
        }
    };
    for (at, f) in plan.timeline() {
        let due = t0 + Duration::from_millis(at);
        while Instant::now() < due {
            close_due(nemesis);
            std::thread::sleep(Duration::from_millis(20).min(due.saturating_duration_since(Instant::now())));
        }
        if at >= plan.duration_ms {
            continue; // an undo past the end: the heal closes it
        }
        let r = nemesis.apply(&f);
        if let (Ok(_), Some(q)) = (&r, queue) {
            q.mirror(&f);
        }
        // The simulation's `schedule` line (sim/src/trace.rs), so the timeline draws it.
        let mut fields: Vec<(&'static str, Value)> = vec![
            ("verb", f.verb().into()),
            ("fault_kind", f.kind().map_or(Value::Null, Value::from)),
            ("nodes", f.nodes().into()),
            ("event", format!("{f:?}").into()),
        ];
        match &r {
            Ok(done) => {
                fields.push(("result", done.clone().into()));
                fields.push(("skipped", false.into()));
                if let Some(crashed) = done.strip_prefix("etcd leader ").and_then(|s| s.split(' ').next()) {
                    fields.push(("crashed", crashed.to_owned().into()));
                }
                if let Some(k) = f.kind() {
                    *applied.entry(k.to_owned()).or_insert(0) += 1;
                }
            }
            Err(e) => {
                fields.push(("result", format!("SKIPPED: {e}").into()));
                fields.push(("skipped", true.into()));
            }
        }
        nem_out.write("schedule", &fields);
        let done = r.unwrap_or_else(|e| format!("NOT APPLIED: {e}"));
        say(json, &format!("  {:>7.3}s {} -> {done}", t0.elapsed().as_secs_f64(), describe(&f)));
    }
    while t0.elapsed() < Duration::from_millis(plan.duration_ms) {
        close_due(nemesis);
        std::thread::sleep(Duration::from_millis(20));
    }
    applied
}

/// A child process killed when dropped.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The queue's own rail-stub: the same binary, knobs and seed as the cluster's, on a free
/// loopback port, its log in the run's directory.
fn start_queue_stub(cluster: &Cluster, plan: &Plan) -> Result<(std::process::Child, BaseUrl), String> {
    let port =
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string())?.port();
    let log = std::fs::File::create(cluster.dir.join("logs/rail-stub-queue.log")).map_err(|e| e.to_string())?;
    let mut cmd = std::process::Command::new(cluster.var("DLOCK"));
    cmd.arg("rail-stub")
        .env("DLOCK_RAIL_STUB_LISTEN", format!("127.0.0.1:{port}"))
        .env("DLOCK_RAIL_STUB_DROP_HOLD_MS", "3000")
        .env("DLOCK_RAIL_STUB_SEED", plan.seed.to_string())
        .stdout(log.try_clone().map_err(|e| e.to_string())?)
        .stderr(log);
    for (k, v) in plan.rail.env() {
        cmd.env(k, v);
    }
    let child = cmd.spawn().map_err(|e| format!("rail-stub for the queue: {e}"))?;
    let url = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).map_err(|e| format!("{e:?}"))?;
    let deadline = Instant::now() + Duration::from_secs(30);
    let probe = HttpClient::new(500, 1_000);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    while rt.block_on(probe.send(&url, http::Method::GET, "/health/ready", &[], None)).map(|r| r.status).ok()
        != Some(200)
    {
        if Instant::now() > deadline {
            return Err("the queue's rail-stub is not ready after 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok((child, url))
}

/// `dlock reconcile --json` against the cluster's paydb and rail.
/// Under a plant made in the test-only build, the reconciler runs with it too.
fn reconcile(cluster: &Cluster, plant: Option<&crate::plants::RealPlant>) -> Option<dlock_reconciler::report::Report> {
    let mut cmd = std::process::Command::new(cluster.var("DLOCK"));
    if let Some(p) = plant.filter(|p| p.binary().is_some()) {
        cmd.env(dlock_contract::planted::ENV, p.bug.name());
    }
    let out = cmd
        .args(["reconcile", "--json", "--database-url"])
        .arg(cluster.var("PAYDB_URL"))
        .arg("--rail-url")
        .arg(cluster.var("STUB_URL"))
        .env("DLOCK_AUTH_CREDENTIALS_FILE", cluster.var("CREDENTIALS_FILE"))
        .output()
        .ok()?;
    serde_json::from_slice(&out.stdout).ok()
}
