//! Payouts per second end to end through `dlock up` (the real binary, every service and two
//! executors in one process), on SQLite and on PostgreSQL, next to the **peer baseline** a
//! user who does not adopt dlock would write (a plain work queue on the same database kind,
//! same rail stub, same number of workers), and next to the floor the design allows (the
//! same run's raw per-hop database commits). Prints dlock / baseline and dlock / floor. Not a
//! test: it asserts no timing.
//!
//! `cargo bench -p dlock --bench end_to_end`
//!
//! - `DLOCK_BENCH_N` payouts (default 300) over `DLOCK_BENCH_ACCOUNTS` accounts (default 8).
//! - `DLOCK_BENCH_RAIL_LATENCY_MS` (default 0): the rail stub's fixed delay, for both sides.
//! - `DLOCK_BENCH_DBS` (default `sqlite,postgres`): which database kinds to run.
//! - PostgreSQL when `DLOCK_BENCH_PG_URL` or `DLOCK_TEST_PG_URL` names a server (paydb,
//!   lockdb and the baseline's queue each get a fresh database).
//! - `DLOCK_BENCH_CONSUMERS` (default 50; 0 leaves it out): the stream's load. On the first
//!   database kind the bench runs dlock's side once more with that many consumers following
//!   the payment-resource's event stream (`GET /v1/events`, C3-extensions E-20) through the
//!   whole window, each from the newest event at its start and reconnecting from its last
//!   `id:` whenever a page ends, as the console and any dashboard do, and prints payouts/s
//!   with them against the run without, as a ratio of the same bench run, with the events
//!   they read.
//! - `DLOCK_BENCH_SWEEP=1` adds the sweeps (executors 1, 2, 4, 8; accounts 1, 10, 100, 1000;
//!   rail latency 0, 50, 500 ms; `DLOCK_BENCH_SWEEP_N` payouts per point, default 150) on
//!   PostgreSQL when one is configured, else on SQLite. They are written as a CSV and an SVG
//!   to `DLOCK_BENCH_SVG` (default `target/bench/end_to_end.svg`, the CSV next to it).
//!   On the accounts axis a point runs at least one payout per account (n grows to 1 000).
//!   The SVG writes the ratio dlock / baseline over each of dlock's points.
//! - **Memory.** `dlock up` runs every service (lock server, payment-resource, rail proxy,
//!   stub) and the executors in one process; the bench samples that process's `VmRSS` at the
//!   window's start, with every poll, and at its end, and prints start -> peak -> end and the
//!   growth per run (the CSV has the KiB). The database servers are not counted.
//!
//! - **Where the time went.** Under each database's row the bench prints, for the window
//!   only (a `/metrics` scrape at its start subtracted from one at its end, with the
//!   operator's token): the first executor's mean time per hop (`payout_hop_seconds`; its
//!   `acquire` counts the post's rotate too), every store operation's mean time
//!   (`lock_store_op_seconds`, `payout_store_op_seconds`, `rail_store_op_seconds`, each
//!   including its wait for a pooled connection), the rail call, the lock server's
//!   acquire outcomes (refused acquires are wasted work), and how the first executor's
//!   attempts ended (`payout_execute_total`: a `not_claimable` one found its payout moved
//!   on by the time it held the account, a wasted grant and claim).
//!
//! **The window.** `dlock up` starts its executors with the cluster, so the bench holds every
//! account's lock (a session of its own, the lock server's public API) while it creates the
//! payouts [`CREATE_CONCURRENCY`] at a time: the executors' acquires are refused meanwhile,
//! and the whole backlog is queued when the bench releases the locks at `t0`, as the
//! baseline's is when its workers start (with batches, C3-extensions E-19, the executors
//! would otherwise drain it faster than it is created, and the window would see only its
//! tail). The window starts when the last payout
//! has been created (bench wall clock, `t0`) and ends at the last payout's POSTED instant
//! (paydb's `updatedAt`); payouts/s counts only the payouts posted after `t0` (the column
//! "in window"). While the window runs the bench polls
//! one list endpoint (`GET /v1/payouts?state=POSTED`, every [`POLL_MS`]), not every payout;
//! it reads each payout's timestamps only after the window. Latency (p50/p99) is
//! POSTED − max(createdAt, `t0`): with the whole backlog queued at `t0` it is mostly queueing,
//! the same definition as the baseline's (paid − its workers' start, with every row queued
//! before the start).
//!
//! **The peer baseline** (its own tables in a fresh database: `q_accounts`, `q_payouts` with a
//! state, `q_submissions` with one unique row per payout). Each worker loops, in the
//! two-transaction shape a user would write so that no transaction stays open across the
//! rail call:
//! 1. transaction 1: claim one PENDING payout (PostgreSQL: `SELECT … FOR UPDATE SKIP LOCKED
//!    LIMIT 1`; SQLite has no SKIP LOCKED, so an `UPDATE … WHERE id = (SELECT … LIMIT 1)
//!    RETURNING`, atomic because SQLite serialises writers), mark it SUBMITTING, insert its
//!    unique submission row, commit;
//! 2. one `POST /submit` to the same `dlock rail-stub` binary (started by the bench, same
//!    latency, no chaos), `clientRef` = the payout id;
//! 3. transaction 2: mark the payout PAID with the rail's reference, stamp the submission
//!    row, debit the account's balance, commit.
//!
//! It runs as many workers as `dlock up` runs executor tasks, on the same pool settings
//! (`dlock_db`'s pools). It checks nothing dlock checks (no fencing, no lease, no proxy
//! intent): that is what the ratio prices.
//!
//! **The floor.** A settled payout costs eight commits: on lockdb two acquires and two
//! releases (the post needs a newer grant than the claim), on paydb the claim, the proxy's
//! intent, its resolution and the post. The floor runs 4N single-row conditional UPDATEs on
//! each database, concurrently, with as many workers as the executors have tasks.
//! `dlock up` binds the default ports (8081–8085): nothing else may hold them.
#![allow(clippy::disallowed_methods, reason = "a benchmark times itself on the host's clock, outside the services")]

#[cfg(madsim)]
fn main() {}

#[cfg(not(madsim))]
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(bench::run());
}

#[cfg(not(madsim))]
mod bench {
    use std::fmt::Write as _;
    use std::process::{Child, Command, Stdio};
    use std::sync::Arc;
    // Real wall-clock time on purpose: a bench measures the real machine, and it is built
    // only outside the simulation.
    use std::time::{Duration, Instant};

    use dlock_rt::http::{BaseUrl, HttpClient};
    use dlock_testkit::bench::env_usize;
    use futures::StreamExt as _;
    use serde_json::{json, Value};

    /// Executors and tasks per executor of the measured `dlock up` (the default run).
    const EXECUTORS: usize = 2;
    const CONCURRENCY: usize = 4;
    /// Commits one settled payout costs on each database (see the module docs).
    const COMMITS_PER_PAYOUT_PER_DB: usize = 4;
    /// Longest a run may take.
    const RUN_MS_MAX: u64 = 600_000;
    /// How often the bench polls the POSTED list while a window runs.
    const POLL_MS: u64 = 250;
    /// Page size of that poll (P1's maximum).
    const PAGE_LIMIT_MAX: usize = 500;
    /// Payouts per sweep point unless `DLOCK_BENCH_SWEEP_N` says otherwise.
    const SWEEP_N_DEFAULT: usize = 150;
    /// The sweeps' axes.
    const SWEEP_EXECUTORS: [usize; 4] = [1, 2, 4, 8];
    const SWEEP_ACCOUNTS: [usize; 4] = [1, 10, 100, 1000];
    const SWEEP_LATENCY_MS: [u64; 3] = [0, 50, 500];
    /// Payout creations the bench keeps in flight.
    const CREATE_CONCURRENCY: usize = 16;
    /// The bench's HTTP timeouts.
    const CONNECT_TIMEOUT_MS: u64 = 1_000;
    const READ_TIMEOUT_MS: u64 = 10_000;

    /// Idle budget of a stream consumer's read (the stream sends a bookmark every 15 s).
    const CONSUMER_IDLE_MS: u64 = 30_000;
    /// A consumer's pause before it connects again after a refused or broken connection.
    const CONSUMER_RETRY_MS: u64 = 100;

    /// One measured configuration.
    #[derive(Clone, Copy)]
    struct Point {
        n: usize,
        accounts: usize,
        executors: usize,
        latency_ms: u64,
        /// Consumers following the payment-resource's event stream through the window.
        consumers: usize,
    }

    impl Point {
        fn workers(&self) -> usize {
            self.executors * CONCURRENCY
        }
    }

    /// Payouts/s and p50/p99 ms of one side of one point.
    #[derive(Clone)]
    struct Rate {
        per_s: f64,
        p50_ms: i64,
        p99_ms: i64,
        /// Payouts inside the window (dlock: those posted after the last creation).
        counted: usize,
        /// dlock only: the `dlock up` process's resident memory over the window.
        rss: Option<Rss>,
        /// dlock only: where the window's time went, from the services' `/metrics`.
        breakdown: Option<String>,
        /// dlock only: events the stream consumers read ([`Point::consumers`]).
        events_read: u64,
    }

    /// Resident set size of one process (`VmRSS`, KiB) at the window's start, its peak over
    /// the samples taken with each poll, and at the window's end.
    #[derive(Clone, Copy)]
    struct Rss {
        start_kib: u64,
        peak_kib: u64,
        end_kib: u64,
        samples: usize,
    }

    impl Rss {
        fn new(kib: u64) -> Rss {
            Rss { start_kib: kib, peak_kib: kib, end_kib: kib, samples: 1 }
        }

        fn sample(&mut self, kib: u64) {
            self.peak_kib = self.peak_kib.max(kib);
            self.end_kib = kib;
            self.samples += 1;
        }

        /// `start -> peak -> end MiB (+growth)`.
        fn show(&self) -> String {
            let mib = |k: u64| k as f64 / 1024.0;
            format!(
                "{:.0}->{:.0}->{:.0} MiB ({:+.1})",
                mib(self.start_kib),
                mib(self.peak_kib),
                mib(self.end_kib),
                mib(self.end_kib) - mib(self.start_kib)
            )
        }
    }

    /// `VmRSS` of process `pid` in KiB, from `/proc/<pid>/status` (Linux).
    fn rss_kib(pid: u32) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// A child process, stopped with SIGTERM (then SIGKILL) when dropped.
    struct Proc(Child);

    impl Drop for Proc {
        fn drop(&mut self) {
            let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    /// Where each database kind of a run lives.
    enum Dbs {
        Sqlite,
        Postgres(String),
    }

    impl Dbs {
        fn name(&self) -> &'static str {
            match self {
                Dbs::Sqlite => "sqlite",
                Dbs::Postgres(_) => "postgres",
            }
        }

        async fn fresh(&self, dir: &dlock_testkit::TempDir, tag: &str) -> String {
            match self {
                Dbs::Sqlite => format!(
                    "sqlite://{}",
                    dir.path().join(format!("{tag}-{}.sqlite", uuid::Uuid::new_v4().simple())).display()
                ),
                Dbs::Postgres(admin) => dlock_testkit::pg_database_on(admin).await,
            }
        }
    }

    pub async fn run() {
        let n = env_usize("DLOCK_BENCH_N", 300).max(1);
        let accounts = env_usize("DLOCK_BENCH_ACCOUNTS", 8).clamp(1, n);
        let latency_ms = env_usize("DLOCK_BENCH_RAIL_LATENCY_MS", 0) as u64;
        let consumers = env_usize("DLOCK_BENCH_CONSUMERS", 50);
        let point = Point { n, accounts, executors: EXECUTORS, latency_ms, consumers: 0 };
        println!(
            "end-to-end bench through `dlock up`: n={n} accounts={accounts} executors={EXECUTORS}x{CONCURRENCY} stub latency={latency_ms} ms; baseline: SKIP LOCKED queue, {} workers",
            point.workers()
        );
        println!(
            "{:<10} {:>9} {:>11} {:>9} {:>9} {:>12} {:>9} {:>9} {:>8} {:>14} {:>8}  dlock up RSS start->peak->end",
            "database",
            "in window",
            "payouts/s",
            "p50 ms",
            "p99 ms",
            "baseline/s",
            "p50 ms",
            "p99 ms",
            "vs base",
            "floor payout/s",
            "vs floor"
        );
        let dir = dlock_testkit::TempDir::new("bench-e2e");
        // `DLOCK_BENCH_DBS` (default `sqlite,postgres`) narrows the run to some kinds.
        let only = std::env::var("DLOCK_BENCH_DBS").unwrap_or_else(|_| "sqlite,postgres".into());
        let wanted = |name: &str| only.split(',').any(|k| k.trim() == name);
        let mut kinds = Vec::new();
        if wanted("sqlite") {
            kinds.push(Dbs::Sqlite);
        }
        match dlock_testkit::bench::pg_admin_url() {
            Some(admin) if wanted("postgres") => kinds.push(Dbs::Postgres(admin)),
            Some(_) => {}
            None => println!("postgres   (skipped: set DLOCK_TEST_PG_URL to include it)"),
        }
        for kind in &kinds {
            let paydb = kind.fresh(&dir, "paydb").await;
            let lockdb = kind.fresh(&dir, "lockdb").await;
            let d = end_to_end(&dir, &paydb, &lockdb, point).await;
            let b = baseline(&kind.fresh(&dir, "queue").await, point).await;
            let floor = floor_rate(&paydb, &lockdb, n, point.workers()).await;
            println!(
                "{:<10} {:>9} {:>11.1} {:>9} {:>9} {:>12.1} {:>9} {:>9} {:>8.2} {:>14.1} {:>8.2}  {}",
                kind.name(),
                d.counted,
                d.per_s,
                d.p50_ms,
                d.p99_ms,
                b.per_s,
                b.p50_ms,
                b.p99_ms,
                d.per_s / b.per_s,
                floor,
                d.per_s / floor,
                d.rss.map(|r| r.show()).unwrap_or_default()
            );
            if let Some(b) = &d.breakdown {
                println!("{b}");
            }
            if consumers > 0 && std::ptr::eq(kind, &kinds[0]) {
                let (paydb, lockdb) = (kind.fresh(&dir, "paydb").await, kind.fresh(&dir, "lockdb").await);
                let loaded = end_to_end(&dir, &paydb, &lockdb, Point { consumers, ..point }).await;
                println!(
                    "{:<10} {:>9} {:>11.1} {:>9} {:>9}   with {consumers} stream consumers: {:.2} of the run without them; {} events read",
                    kind.name(),
                    loaded.counted,
                    loaded.per_s,
                    loaded.p50_ms,
                    loaded.p99_ms,
                    loaded.per_s / d.per_s,
                    loaded.events_read,
                );
            }
        }
        if std::env::var("DLOCK_BENCH_SWEEP").is_ok_and(|v| v == "1") {
            let Some(kind) = kinds.pop() else { return };
            sweep(&dir, &kind, accounts).await;
        }
    }

    /// The three sweeps; each varies one axis from the default point.
    async fn sweep(dir: &dlock_testkit::TempDir, kind: &Dbs, accounts: usize) {
        let n = env_usize("DLOCK_BENCH_SWEEP_N", SWEEP_N_DEFAULT).max(1);
        let base = Point { n, accounts, executors: EXECUTORS, latency_ms: 0, consumers: 0 };
        let axes: [(&str, Vec<(u64, Point)>); 3] = [
            ("executors", SWEEP_EXECUTORS.iter().map(|&e| (e as u64, Point { executors: e, ..base })).collect()),
            // Every account gets at least one payout: n grows to the account count.
            (
                "accounts",
                SWEEP_ACCOUNTS.iter().map(|&a| (a as u64, Point { accounts: a, n: n.max(a), ..base })).collect(),
            ),
            ("rail latency ms", SWEEP_LATENCY_MS.iter().map(|&l| (l, Point { latency_ms: l, ..base })).collect()),
        ];
        println!(
            "sweep on {} (n={n} per point; other axes: executors={EXECUTORS}, accounts={accounts}, latency 0 ms)",
            kind.name()
        );
        println!(
            "{:<16} {:>6} {:>6} {:>9} {:>11} {:>12} {:>8}  dlock up RSS start->peak->end",
            "axis", "x", "n", "in window", "dlock/s", "baseline/s", "ratio"
        );
        let mut csv = String::from("axis,x,database,executors,accounts,rail_latency_ms,n,dlock_per_s,dlock_p50_ms,dlock_p99_ms,baseline_per_s,baseline_p50_ms,baseline_p99_ms,rss_start_kib,rss_peak_kib,rss_end_kib\n");
        let mut curves: Vec<Curve> = Vec::new();
        for (axis, points) in &axes {
            let mut curve = Vec::new();
            for &(x, p) in points {
                let paydb = kind.fresh(dir, "paydb").await;
                let lockdb = kind.fresh(dir, "lockdb").await;
                let d = end_to_end(dir, &paydb, &lockdb, p).await;
                let b = baseline(&kind.fresh(dir, "queue").await, p).await;
                println!(
                    "{axis:<16} {x:>6} {:>6} {:>9} {:>11.1} {:>12.1} {:>8.2}  {}",
                    p.n,
                    d.counted,
                    d.per_s,
                    b.per_s,
                    d.per_s / b.per_s,
                    d.rss.map(|r| r.show()).unwrap_or_default()
                );
                let rss = d.rss.map(|r| (r.start_kib, r.peak_kib, r.end_kib)).unwrap_or_default();
                let _ = writeln!(
                    csv,
                    "{axis},{x},{},{},{},{},{},{:.1},{},{},{:.1},{},{},{},{},{}",
                    kind.name(),
                    p.executors,
                    p.accounts,
                    p.latency_ms,
                    p.n,
                    d.per_s,
                    d.p50_ms,
                    d.p99_ms,
                    b.per_s,
                    b.p50_ms,
                    b.p99_ms,
                    rss.0,
                    rss.1,
                    rss.2
                );
                curve.push((x, d.per_s, b.per_s));
            }
            curves.push((axis, curve));
        }
        let svg_path = std::env::var("DLOCK_BENCH_SVG")
            .unwrap_or_else(|_| concat!(env!("CARGO_MANIFEST_DIR"), "/../../target/bench/end_to_end.svg").to_owned());
        let svg_path = std::path::PathBuf::from(svg_path);
        if let Some(parent) = svg_path.parent() {
            std::fs::create_dir_all(parent).expect("create the SVG's directory");
        }
        let title =
            format!("dlock vs a plain work queue (SKIP LOCKED on PostgreSQL), {} ({n} payouts per point)", kind.name());
        std::fs::write(&svg_path, svg(&title, &curves)).expect("write the SVG");
        let csv_path = svg_path.with_extension("csv");
        std::fs::write(&csv_path, csv).expect("write the CSV");
        println!("sweep written to {} and {}", svg_path.display(), csv_path.display());
    }

    /// One sweep's curve: its axis and, per point, x, dlock's and the baseline's payouts/s.
    type Curve<'a> = (&'a str, Vec<(u64, f64, f64)>);

    /// A hand-written SVG: one panel per axis, x evenly spaced by index, y linear from 0.
    fn svg(title: &str, curves: &[Curve]) -> String {
        const PANEL_W: f64 = 300.0;
        const PANEL_H: f64 = 220.0;
        const PAD: f64 = 50.0;
        let width = PAD + curves.len() as f64 * (PANEL_W + PAD);
        let height = PANEL_H + 2.0 * PAD + 40.0;
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">"#
        );
        let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
        let _ = writeln!(s, r#"<text x="{PAD}" y="20" font-size="14">{title}</text>"#);
        let _ = writeln!(
            s,
            "<line x1=\"{PAD}\" y1=\"34\" x2=\"{}\" y2=\"34\" stroke=\"#1f77b4\" stroke-width=\"2\"/><text x=\"{}\" y=\"38\">dlock payouts/s</text>",
            PAD + 20.0,
            PAD + 25.0
        );
        let _ = writeln!(
            s,
            "<line x1=\"{}\" y1=\"34\" x2=\"{}\" y2=\"34\" stroke=\"#d62728\" stroke-width=\"2\" stroke-dasharray=\"5,3\"/><text x=\"{}\" y=\"38\">baseline payouts/s</text>",
            PAD + 140.0,
            PAD + 160.0,
            PAD + 165.0
        );
        for (i, (axis, pts)) in curves.iter().enumerate() {
            let x0 = PAD + i as f64 * (PANEL_W + PAD);
            let y0 = PAD + 10.0;
            let ymax = pts.iter().map(|p| p.1.max(p.2)).fold(1.0_f64, f64::max) * 1.1;
            let _ = writeln!(
                s,
                "<rect x=\"{x0}\" y=\"{y0}\" width=\"{PANEL_W}\" height=\"{PANEL_H}\" fill=\"none\" stroke=\"#888\"/>"
            );
            for k in 0..=4 {
                let v = ymax * k as f64 / 4.0;
                let y = y0 + PANEL_H - PANEL_H * k as f64 / 4.0;
                let _ = writeln!(
                    s,
                    "<line x1=\"{x0}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#eee\"/><text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{v:.0}</text>",
                    x0 + PANEL_W,
                    x0 - 4.0,
                    y + 4.0
                );
            }
            let step = PANEL_W / (pts.len().max(1)) as f64;
            let at = |j: usize, v: f64| (x0 + step * (j as f64 + 0.5), y0 + PANEL_H - PANEL_H * v / ymax);
            for (j, p) in pts.iter().enumerate() {
                let (x, _) = at(j, 0.0);
                let _ = writeln!(
                    s,
                    r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                    y0 + PANEL_H + 14.0,
                    p.0
                );
            }
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">{axis}</text>"#,
                x0 + PANEL_W / 2.0,
                y0 + PANEL_H + 30.0
            );
            for (series, color, dash) in [(1, "#1f77b4", ""), (2, "#d62728", " stroke-dasharray=\"5,3\"")] {
                let line: Vec<String> = pts
                    .iter()
                    .enumerate()
                    .map(|(j, p)| {
                        let (x, y) = at(j, if series == 1 { p.1 } else { p.2 });
                        format!("{x:.1},{y:.1}")
                    })
                    .collect();
                let _ = writeln!(
                    s,
                    r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"{dash}/>"#,
                    line.join(" ")
                );
                for (j, p) in pts.iter().enumerate() {
                    let (x, y) = at(j, if series == 1 { p.1 } else { p.2 });
                    let _ = writeln!(s, r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{color}"/>"#);
                    if series == 1 && p.2 > 0.0 {
                        // The ratio dlock / baseline over each dlock point.
                        let _ = writeln!(
                            s,
                            r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle" fill="{color}">{:.2}x</text>"#,
                            y - 7.0,
                            p.1 / p.2
                        );
                    }
                }
            }
        }
        s.push_str("</svg>\n");
        s
    }

    fn percentiles(mut latencies: Vec<i64>) -> (i64, i64) {
        if latencies.is_empty() {
            return (0, 0);
        }
        latencies.sort_unstable();
        let pct = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
        (pct(50), pct(99))
    }

    async fn send(client: &HttpClient, base: &BaseUrl, path: &str, key: &str, body: Value) -> Value {
        let r = client
            .send(
                base,
                http::Method::POST,
                path,
                &[("content-type", "application/json"), ("x-owner-id", "bench"), ("x-idempotency-key", key)],
                Some(body.to_string().into()),
            )
            .await
            .expect("payment-resource answers");
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        serde_json::from_slice(&r.body).expect("json")
    }

    /// Every account's lock, held by the bench in a session of its own while it creates the
    /// backlog (the lock server's L1, L4, L6, L3).
    struct Hold {
        session: String,
        /// (key, token) of each held lock.
        grants: Vec<(String, i64)>,
    }

    /// `dlock up`'s lock server.
    const LOCK_URL: &str = "http://127.0.0.1:8081";
    /// The hold's session and lease: longer than any backlog's creation takes.
    const HOLD_TTL_MS: u64 = 60_000;

    impl Hold {
        async fn take(client: &HttpClient, accounts: usize) -> Hold {
            let s = hold_post(client, "/v1/sessions", json!({"ownerId": "bench-hold", "ttlMillis": HOLD_TTL_MS})).await;
            let session = s["sessionId"].as_str().expect("session id").to_owned();
            let mut grants = Vec::with_capacity(accounts);
            for a in 0..accounts {
                let key = format!("payout:acct-{a}");
                // Waits out an executor's grant of the account, if one got it first.
                let body = json!({"sessionId": session, "ttlMillis": HOLD_TTL_MS, "waitMillis": 10_000});
                let g = hold_post(client, &format!("/v1/locks/{key}/acquire"), body).await;
                grants.push((key, g["fencingToken"].as_i64().expect("token")));
            }
            Hold { session, grants }
        }

        async fn release(self, client: &HttpClient) {
            let lock = BaseUrl::parse(LOCK_URL).expect("url");
            for (key, token) in &self.grants {
                let token = token.to_string();
                let headers =
                    [("content-type", "application/json"), ("x-owner-id", "bench-hold"), ("x-fencing-token", &token)];
                let (path, body) = (format!("/v1/locks/{key}"), json!({"sessionId": self.session}).to_string());
                let r = client.send(&lock, http::Method::DELETE, &path, &headers, Some(body.into())).await;
                assert_eq!(r.map(|r| r.status).ok(), Some(204), "release {key}");
            }
            let path = format!("/v1/sessions/{}", self.session);
            let _ = client.send(&lock, http::Method::DELETE, &path, &[("x-owner-id", "bench-hold")], None).await;
        }
    }

    /// One POST of the hold to the lock server; its 200 or 201 body.
    async fn hold_post(client: &HttpClient, path: &str, body: Value) -> Value {
        let lock = BaseUrl::parse(LOCK_URL).expect("url");
        let headers = [("content-type", "application/json"), ("x-owner-id", "bench-hold")];
        let r = client.send(&lock, http::Method::POST, path, &headers, Some(body.to_string().into())).await;
        let r = r.expect("lock server answers");
        assert!(r.status == 200 || r.status == 201, "{path}: {}", String::from_utf8_lossy(&r.body));
        serde_json::from_slice(&r.body).expect("json")
    }

    async fn get_json(client: &HttpClient, base: &BaseUrl, path: &str) -> Option<Value> {
        let r = client.send(base, http::Method::GET, path, &[], None).await.ok()?;
        (r.status == 200).then(|| serde_json::from_slice(&r.body).ok()).flatten()
    }

    /// How many payouts are POSTED, walking P1's pages.
    async fn posted_count(client: &HttpClient, base: &BaseUrl) -> Option<usize> {
        let mut count = 0;
        let mut cursor: Option<String> = None;
        loop {
            let mut path = format!("/v1/payouts?state=POSTED&limit={PAGE_LIMIT_MAX}");
            if let Some(c) = &cursor {
                path.push_str("&cursor=");
                path.push_str(c);
            }
            let page = get_json(client, base, &path).await?;
            count += page["items"].as_array()?.len();
            match page["nextCursor"].as_str() {
                Some(c) => cursor = Some(c.to_owned()),
                None => return Some(count),
            }
        }
    }

    /// Runs `p.n` payouts through `dlock up`; payouts/s and p50/p99 ms (see the window).
    async fn end_to_end(dir: &dlock_testkit::TempDir, paydb: &str, lockdb: &str, p: Point) -> Rate {
        let data = dir.path().join(format!("up-{}", uuid::Uuid::new_v4().simple()));
        // `dlock up` reuses a credentials file in its data dir: the bench writes one so it
        // knows the operator's token.
        let operator = format!("bench-operator-{}", uuid::Uuid::new_v4().simple());
        let worker = format!("bench-worker-{}", uuid::Uuid::new_v4().simple());
        std::fs::create_dir_all(&data).expect("data dir");
        let creds = data.join("credentials");
        std::fs::write(
            &creds,
            format!("worker {worker}\noperator {operator}\nreader bench-reader-{}\n", uuid::Uuid::new_v4().simple()),
        )
        .expect("credentials file");
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&creds, std::fs::Permissions::from_mode(0o600)).expect("mode 0600");
        }
        let client = HttpClient::new(CONNECT_TIMEOUT_MS, READ_TIMEOUT_MS)
            .with_bearer(Some(dlock_rt::http::Bearer::fixed(dlock_contract::auth::Secret::new(operator))));
        let _up = Proc(
            Command::new(env!("CARGO_BIN_EXE_dlock"))
                .arg("up")
                .arg("--data-dir")
                .arg(&data)
                .args(["--paydb-url", paydb, "--lockdb-url", lockdb])
                .args(["--executors", &p.executors.to_string(), "--concurrency", &CONCURRENCY.to_string()])
                .args(["--rail-latency-ms", &p.latency_ms.to_string()])
                .env("DLOCK_LOG", "error")
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn dlock up"),
        );
        let payment = BaseUrl::parse("http://127.0.0.1:8082").expect("url");
        let ready = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_secs(60), || async {
            let r = client.send(&payment, http::Method::GET, "/health/ready", &[], None).await.ok()?;
            (r.status == 200).then_some(())
        })
        .await;
        assert!(ready.is_some(), "dlock up did not become ready on 127.0.0.1:8082");
        for a in 0..p.accounts {
            let body =
                json!({"accountId": format!("acct-{a}"), "currency": "EUR", "openingBalanceMinor": 1_000_000_000});
            send(&client, &payment, "/v1/accounts", &format!("open-{a}"), body).await;
        }
        // The executors run from the start: the bench holds every account's lock while it
        // creates the backlog (their acquires are refused meanwhile) and releases them all
        // when the window starts, so dlock, like the baseline, starts with the whole backlog
        // queued (with batches it drains faster than payouts are created).
        let lock_client = HttpClient::new(CONNECT_TIMEOUT_MS, READ_TIMEOUT_MS)
            .with_bearer(Some(dlock_rt::http::Bearer::fixed(dlock_contract::auth::Secret::new(worker))));
        let held = Hold::take(&lock_client, p.accounts).await;
        // Created [`CREATE_CONCURRENCY`] at a time.
        let ids: Vec<String> = futures::stream::iter(0..p.n)
            .map(|i| {
                let (client, payment) = (&client, &payment);
                async move {
                    let body = json!({"accountId": format!("acct-{}", i % p.accounts), "amountMinor": 1_000,
                        "currency": "EUR", "beneficiaryRef": format!("ben-{i}")});
                    let v = send(client, payment, "/v1/payouts", &format!("create-{i}"), body).await;
                    v["payoutId"].as_str().expect("id").to_owned()
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .collect()
            .await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let readers: Vec<_> =
            (0..p.consumers).map(|_| tokio::spawn(consume(client.clone(), payment.clone(), stop.clone()))).collect();
        let t0 = chrono::Utc::now().timestamp_millis();
        let metrics_at_t0 = Metrics::scrape(&client).await;
        held.release(&lock_client).await;
        // The window: poll one list endpoint at a modest rate until every payout is POSTED,
        // sampling `dlock up`'s resident memory with each poll.
        let pid = _up.0.id();
        let rss = std::cell::Cell::new(rss_kib(pid).map(Rss::new));
        let done = dlock_rt::wait_until(Duration::from_millis(POLL_MS), Duration::from_millis(RUN_MS_MAX), || async {
            if let (Some(mut r), Some(kib)) = (rss.get(), rss_kib(pid)) {
                r.sample(kib);
                rss.set(Some(r));
            }
            (posted_count(&client, &payment).await? >= p.n).then_some(())
        })
        .await;
        assert!(done.is_some(), "every payout is posted within the bench's bound");
        let breakdown = Some(Metrics::scrape(&client).await.since(&metrics_at_t0).show());
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        let mut events_read = 0;
        for r in readers {
            events_read += r.await.unwrap_or(0);
        }
        // After the window: each payout's creation and posting instants.
        let mut latencies = Vec::with_capacity(p.n);
        let mut last_posted = t0;
        for id in &ids {
            let view = get_json(&client, &payment, &format!("/v1/payouts/{id}")).await.expect("payout view");
            assert_eq!(view["state"], "POSTED");
            let ms = |field: &str| {
                view[field]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.timestamp_millis())
                    .expect("timestamp")
            };
            let (created, posted) = (ms("createdAt"), ms("updatedAt"));
            if posted >= t0 {
                last_posted = last_posted.max(posted);
                latencies.push(posted - created.max(t0));
            }
        }
        let counted = latencies.len();
        let (p50_ms, p99_ms) = percentiles(latencies);
        let seconds = ((last_posted - t0).max(1)) as f64 / 1000.0;
        Rate { per_s: counted as f64 / seconds, p50_ms, p99_ms, counted, rss: rss.get(), breakdown, events_read }
    }

    /// One stream consumer (`DLOCK_BENCH_CONSUMERS`): follows the payment-resource's event
    /// stream from the newest event at its start, reconnecting from its last `id:` when a
    /// page ends (or from a fresh snapshot after `resync_required`), until `stop`; the
    /// events it read (bookmarks not counted).
    async fn consume(client: HttpClient, payment: BaseUrl, stop: Arc<std::sync::atomic::AtomicBool>) -> u64 {
        use std::sync::atomic::Ordering::SeqCst;
        let snapshot = |client: HttpClient, payment: BaseUrl| async move {
            let v = get_json(&client, &payment, "/v1/events/recent?limit=1").await?;
            v["cursor"].as_str().map(str::to_owned)
        };
        let mut cursor = None;
        let mut events = 0;
        while !stop.load(SeqCst) {
            let Some(c) = cursor.clone().or(snapshot(client.clone(), payment.clone()).await) else {
                tokio::time::sleep(Duration::from_millis(CONSUMER_RETRY_MS)).await;
                continue;
            };
            let path = format!("/v1/events?cursor={}", pct(&c));
            let Ok(mut stream) = client.get_streaming(&payment, &path, &[]).await else {
                tokio::time::sleep(Duration::from_millis(CONSUMER_RETRY_MS)).await;
                continue;
            };
            cursor = Some(c);
            let mut buf = String::new();
            while !stop.load(SeqCst) {
                let Ok(Some(chunk)) = stream.next_chunk(CONSUMER_IDLE_MS).await else { break };
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(end) = buf.find("\n\n") {
                    let frame: String = buf.drain(..end + 2).collect();
                    let event = frame.lines().find_map(|l| l.strip_prefix("event: ")).unwrap_or_default();
                    if event == "resync_required" {
                        cursor = None;
                    } else if let Some(id) = frame.lines().find_map(|l| l.strip_prefix("id: ")) {
                        cursor = Some(id.to_owned());
                        if event != "bookmark" {
                            events += 1;
                        }
                    }
                }
            }
        }
        events
    }

    /// `s` percent-encoded for a query value.
    fn pct(s: &str) -> String {
        s.bytes()
            .map(|b| match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect()
    }

    /// The timing families the bench reads from `dlock up`'s services, by port: the first
    /// executor's hops and attempt outcomes, every store's operations, the rail call, the
    /// lock server's acquire outcomes.
    const METRIC_SOURCES: [(u16, &[&str]); 4] = [
        (8085, &["payout_hop_seconds", "payout_execute_total"]),
        (8081, &["lock_store_op_seconds", "lock_acquire_total"]),
        (8082, &["payout_store_op_seconds"]),
        (8083, &["rail_store_op_seconds", "rail_call_seconds"]),
    ];

    /// Histogram sums and counts, and counters, by `family{labels}`: one scrape.
    #[derive(Default)]
    struct Metrics(std::collections::BTreeMap<String, (f64, f64)>);

    impl Metrics {
        async fn scrape(client: &HttpClient) -> Metrics {
            let mut m = Metrics::default();
            for (port, families) in METRIC_SOURCES {
                let Ok(base) = BaseUrl::parse(&format!("http://127.0.0.1:{port}")) else { continue };
                let Ok(r) = client.send(&base, http::Method::GET, "/metrics", &[], None).await else { continue };
                for line in String::from_utf8_lossy(&r.body).lines() {
                    let Some((name, value)) = line.rsplit_once(' ') else { continue };
                    let Ok(value) = value.parse::<f64>() else { continue };
                    for family in families {
                        let Some(rest) = name.strip_prefix(family) else { continue };
                        let (slot, labels) = match rest.split_once('{') {
                            Some(("_sum", l)) => (0, l),
                            Some(("_count", l)) => (1, l),
                            Some(("", l)) => (1, l),
                            _ => continue,
                        };
                        let key = format!("{family}{{{labels}");
                        let e = m.0.entry(key).or_default();
                        if slot == 0 {
                            e.0 = value;
                        } else {
                            e.1 = value;
                        }
                    }
                }
            }
            m
        }

        /// What happened between `before` and this scrape.
        fn since(&self, before: &Metrics) -> Metrics {
            let mut d = Metrics::default();
            for (k, &(sum, count)) in &self.0 {
                let (s0, c0) = before.0.get(k).copied().unwrap_or_default();
                if count - c0 > 0.0 {
                    d.0.insert(k.clone(), (sum - s0, count - c0));
                }
            }
            d
        }

        /// One line per family: `label mean-ms (n)`, or `label n` for a counter.
        fn show(&self) -> String {
            let mut out = String::from(
                "  where the window's time went (mean ms per call, calls; executor-0's hops, every store):",
            );
            for (_, families) in METRIC_SOURCES {
                for family in families {
                    let items: Vec<String> = self
                        .0
                        .iter()
                        .filter_map(|(k, &(sum, count))| {
                            let labels = k.strip_prefix(family)?.strip_prefix('{')?;
                            let label = labels.split('"').nth(1).unwrap_or(labels);
                            Some(if family.ends_with("_total") {
                                format!("{label} {count:.0}")
                            } else {
                                format!("{label} {:.2} ({count:.0})", 1000.0 * sum / count)
                            })
                        })
                        .collect();
                    if !items.is_empty() {
                        let _ = write!(out, "\n    {family:<24} {}", items.join("  "));
                    }
                }
            }
            out
        }
    }

    /// A free loopback port (bound, then released; the stub binds it right after).
    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port()
    }

    /// The peer baseline (see the module docs) on a fresh database at `url`.
    async fn baseline(url: &str, p: Point) -> Rate {
        let port = free_port();
        let _stub = Proc(
            Command::new(env!("CARGO_BIN_EXE_dlock"))
                .arg("rail-stub")
                .args(["--listen", &format!("127.0.0.1:{port}")])
                .args(["--latency-ms", &p.latency_ms.to_string()])
                .args(["--failure-rate", "0", "--duplicate-ack-rate", "0", "--decline-rate", "0"])
                .env("DLOCK_LOG", "error")
                .stdout(Stdio::null())
                .spawn()
                .expect("spawn dlock rail-stub"),
        );
        let rail = BaseUrl::parse(&format!("http://127.0.0.1:{port}")).expect("url");
        let client = Arc::new(HttpClient::new(CONNECT_TIMEOUT_MS, READ_TIMEOUT_MS));
        let ready = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_secs(60), || async {
            let r = client.send(&rail, http::Method::GET, "/health/ready", &[], None).await.ok()?;
            (r.status == 200).then_some(())
        })
        .await;
        assert!(ready.is_some(), "dlock rail-stub did not become ready on 127.0.0.1:{port}");
        let queue = if url.starts_with("postgres") {
            Queue::Pg(dlock_db::pg_pool(url).await.expect("baseline pool"))
        } else {
            Queue::Sqlite(dlock_db::sqlite_pool(url).await.expect("baseline pool"))
        };
        queue.setup(p).await.expect("baseline tables");
        let started = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..p.workers() {
            let (queue, client, rail) = (queue.clone(), client.clone(), rail.clone());
            tasks.push(tokio::spawn(async move {
                let mut latencies = Vec::new();
                while queue.work_one(&client, &rail).await? {
                    latencies.push(started.elapsed().as_millis() as i64);
                }
                Ok::<Vec<i64>, String>(latencies)
            }));
        }
        let mut latencies = Vec::with_capacity(p.n);
        for t in tasks {
            latencies.extend(t.await.expect("worker").expect("baseline worker"));
        }
        assert_eq!(latencies.len(), p.n, "the baseline paid every payout once");
        let last_ms = latencies.iter().copied().max().unwrap_or(1).max(1);
        let (p50_ms, p99_ms) = percentiles(latencies);
        Rate {
            per_s: p.n as f64 / (last_ms as f64 / 1000.0),
            p50_ms,
            p99_ms,
            counted: p.n,
            rss: None,
            breakdown: None,
            events_read: 0,
        }
    }

    /// The same body for both of the queue's pools: `$q` renders a statement written with
    /// PostgreSQL's `$n` placeholders for the pool's database (SQLite: `?n`).
    macro_rules! on_pool {
        ($queue:expr, $pool:ident, $q:ident, $is_pg:ident => $body:block) => {
            match $queue {
                Queue::Pg($pool) => {
                    let $q = |s: &'static str| std::borrow::Cow::Borrowed(s);
                    let $is_pg = true;
                    $body
                }
                Queue::Sqlite($pool) => {
                    let $q = |s: &'static str| std::borrow::Cow::<str>::Owned(s.replace('$', "?"));
                    let $is_pg = false;
                    $body
                }
            }
        };
    }

    #[derive(Clone)]
    enum Queue {
        Pg(sqlx::PgPool),
        Sqlite(sqlx::SqlitePool),
    }

    impl Queue {
        /// The queue's tables, its accounts and `p.n` PENDING payouts, before any worker runs.
        async fn setup(&self, p: Point) -> Result<(), sqlx::Error> {
            let ddl = [
                "CREATE TABLE q_accounts (id TEXT PRIMARY KEY, balance_minor BIGINT NOT NULL)",
                "CREATE TABLE q_payouts (id BIGINT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES q_accounts(id), \
                 amount_minor BIGINT NOT NULL, state TEXT NOT NULL, rail_reference TEXT)",
                "CREATE INDEX q_payouts_pending ON q_payouts (id) WHERE state = 'PENDING'",
                "CREATE TABLE q_submissions (payout_id BIGINT NOT NULL UNIQUE REFERENCES q_payouts(id), \
                 client_ref TEXT NOT NULL, rail_reference TEXT)",
            ];
            on_pool!(self, pool, q, _is_pg => {
                for d in ddl {
                    sqlx::query(d).execute(pool).await?;
                }
                let mut tx = pool.begin().await?;
                for a in 0..p.accounts {
                    sqlx::query(&q("INSERT INTO q_accounts VALUES ($1, 1000000000)"))
                        .bind(format!("acct-{a}"))
                        .execute(&mut *tx)
                        .await?;
                }
                for i in 0..p.n {
                    sqlx::query(&q("INSERT INTO q_payouts VALUES ($1, $2, 1000, 'PENDING', NULL)"))
                        .bind(i as i64)
                        .bind(format!("acct-{}", i % p.accounts))
                        .execute(&mut *tx)
                        .await?;
                }
                tx.commit().await?;
            });
            Ok(())
        }

        /// One payout through the queue; `false` when none is PENDING. The statements are
        /// written once with PostgreSQL's `$n` placeholders; SQLite gets them as `?n`.
        async fn work_one(&self, client: &HttpClient, rail: &BaseUrl) -> Result<bool, String> {
            let e = |e: sqlx::Error| e.to_string();
            // Transaction 1: claim + the unique submission row. PostgreSQL skips rows other
            // workers hold; SQLite serialises writers, so one `UPDATE … RETURNING` claims.
            const CLAIM_PG: &str =
                "SELECT id, amount_minor FROM q_payouts WHERE state = 'PENDING' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED";
            const MARK_PG: &str = "UPDATE q_payouts SET state = 'SUBMITTING' WHERE id = $1";
            const CLAIM_SQLITE: &str = "UPDATE q_payouts SET state = 'SUBMITTING' WHERE id = \
                 (SELECT id FROM q_payouts WHERE state = 'PENDING' ORDER BY id LIMIT 1) RETURNING id, amount_minor";
            const SUBMISSION: &str = "INSERT INTO q_submissions (payout_id, client_ref) VALUES ($1, $2)";
            // Transaction 2: mark paid, stamp the submission, debit the account.
            const PAID: &str = "UPDATE q_payouts SET state = 'PAID', rail_reference = $2 WHERE id = $1 AND state = 'SUBMITTING' RETURNING account_id";
            const STAMP: &str = "UPDATE q_submissions SET rail_reference = $2 WHERE payout_id = $1";
            const DEBIT: &str = "UPDATE q_accounts SET balance_minor = balance_minor - $2 WHERE id = $1";
            let claimed: Option<(i64, i64)> = on_pool!(self, pool, q, is_pg => {
                let mut tx = pool.begin().await.map_err(e)?;
                let claim = if is_pg { CLAIM_PG } else { CLAIM_SQLITE };
                let row: Option<(i64, i64)> = sqlx::query_as(&q(claim)).fetch_optional(&mut *tx).await.map_err(e)?;
                if let Some((id, _)) = row {
                    if is_pg {
                        sqlx::query(&q(MARK_PG)).bind(id).execute(&mut *tx).await.map_err(e)?;
                    }
                    sqlx::query(&q(SUBMISSION)).bind(id).bind(format!("q-{id}")).execute(&mut *tx).await.map_err(e)?;
                }
                tx.commit().await.map_err(e)?;
                row
            });
            let Some((id, amount)) = claimed else { return Ok(false) };
            // The one rail call.
            let body = json!({"clientRef": format!("q-{id}"), "amountMinor": amount, "currency": "EUR"});
            let r = client
                .send(
                    rail,
                    http::Method::POST,
                    "/submit",
                    &[("content-type", "application/json")],
                    Some(body.to_string().into()),
                )
                .await
                .map_err(|e| format!("rail: {e:?}"))?;
            if r.status != 200 {
                return Err(format!("rail answered {}", r.status));
            }
            let ack: Value = serde_json::from_slice(&r.body).map_err(|e| e.to_string())?;
            let reference = ack["railReference"].as_str().unwrap_or_default().to_owned();
            on_pool!(self, pool, q, _is_pg => {
                let mut tx = pool.begin().await.map_err(e)?;
                let (account,): (String,) =
                    sqlx::query_as(&q(PAID)).bind(id).bind(&reference).fetch_one(&mut *tx).await.map_err(e)?;
                sqlx::query(&q(STAMP)).bind(id).bind(&reference).execute(&mut *tx).await.map_err(e)?;
                sqlx::query(&q(DEBIT)).bind(account).bind(amount).execute(&mut *tx).await.map_err(e)?;
                tx.commit().await.map_err(e)?;
            });
            Ok(true)
        }
    }

    /// The floor: `4n` autocommitted single-row conditional UPDATEs on each database, both
    /// databases at once, with as many workers as the executors have tasks. Payouts/s.
    async fn floor_rate(paydb: &str, lockdb: &str, n: usize, workers: usize) -> f64 {
        let started = Instant::now();
        let (a, b) = tokio::join!(
            updates(paydb, n * COMMITS_PER_PAYOUT_PER_DB, workers),
            updates(lockdb, n * COMMITS_PER_PAYOUT_PER_DB, workers)
        );
        a.and(b).expect("floor updates");
        n as f64 / started.elapsed().as_secs_f64()
    }

    async fn updates(url: &str, total: usize, workers: usize) -> Result<(), String> {
        if url.starts_with("postgres") {
            let pool = dlock_db::pg_pool(url).await.map_err(|e| e.to_string())?;
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_floor (id BIGINT PRIMARY KEY, fence BIGINT NOT NULL)")
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
            let mut tasks = Vec::new();
            for w in 0..workers {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    let id = w as i64;
                    sqlx::query("INSERT INTO bench_floor VALUES ($1, 0) ON CONFLICT DO NOTHING")
                        .bind(id)
                        .execute(&pool)
                        .await?;
                    for i in 0..(total / workers) {
                        sqlx::query("UPDATE bench_floor SET fence = $1 WHERE id = $2 AND fence < $1")
                            .bind(i as i64 + 1)
                            .bind(id)
                            .execute(&pool)
                            .await?;
                    }
                    Ok::<(), sqlx::Error>(())
                }));
            }
            for t in tasks {
                t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
            }
        } else {
            let pool = dlock_db::sqlite_pool(url).await.map_err(|e| e.to_string())?;
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_floor (id INTEGER PRIMARY KEY, fence INTEGER NOT NULL)")
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
            let mut tasks = Vec::new();
            for w in 0..workers {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    let id = w as i64;
                    sqlx::query("INSERT OR IGNORE INTO bench_floor VALUES (?1, 0)").bind(id).execute(&pool).await?;
                    for i in 0..(total / workers) {
                        sqlx::query("UPDATE bench_floor SET fence = ?1 WHERE id = ?2 AND fence < ?1")
                            .bind(i as i64 + 1)
                            .bind(id)
                            .execute(&pool)
                            .await?;
                    }
                    Ok::<(), sqlx::Error>(())
                }));
            }
            for t in tasks {
                t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}
