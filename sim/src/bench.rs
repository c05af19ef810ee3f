//! The simulation's speed bench (`cargo xtask sim bench`): how fast the whole-cluster world
//! runs, for the two targets, and where its time goes.
//!
//! **The bench seed.** [`bench_config`] takes a seed's swarm draw (its topology, backend,
//! TTLs, stub chaos and fault rates stay drawn) and fixes its size: [`BENCH_EXECUTORS`]
//! executors of concurrency [`BENCH_CONCURRENCY`], [`BENCH_PAYOUTS`] payouts arriving over
//! [`BENCH_ARRIVAL_MS`], a fault phase of [`BENCH_FAULT_MS`]: about 60 simulated seconds
//! once the liveness phase settles the last payouts.
//!
//! **What it prints.** Seeds per second per core and simulated seconds per wall second
//! (the two targets: ≥ 20 and ≥ 1 000), beside a **baseline measured in the same run**: the
//! cost of one bare HTTP round trip through the same stack (`dlock_rt::http` client and
//! server, hyper over madsim's network, a router answering a fixed body), timed over
//! [`BASELINE_REQUESTS`] requests in a fresh runtime. The bench counts every request the
//! world's servers answered ([`dlock_rt::traffic`], by route) and prints what share of its
//! wall time that many bare round trips explain: the ratio says whether the HTTP hops or
//! the rest of the world (stores, oracle, timers) is where the time goes.
//!
//! Invariants: the bench never asserts a time; it reports. A bench seed is an ordinary seed
//! (the oracle runs; a failing bench seed is reported like a campaign's).

use std::collections::BTreeMap;

use crate::campaign::{run_config, RunOptions};
use crate::outcome::SeedOutcome;
use crate::swarm::SwarmConfig;

/// Executors of a bench seed.
pub const BENCH_EXECUTORS: usize = 4;
/// Each bench executor's `--concurrency`.
pub const BENCH_CONCURRENCY: usize = 4;
/// Payouts of a bench seed.
pub const BENCH_PAYOUTS: usize = 200;
/// The bench seed's payouts arrive over this much simulated time.
pub const BENCH_ARRIVAL_MS: u64 = 45_000;
/// The bench seed's fault phase.
pub const BENCH_FAULT_MS: u64 = 50_000;
/// Bare round trips the baseline times.
pub const BASELINE_REQUESTS: u32 = 2_000;
/// Seeds when `--seeds` is absent.
pub const BENCH_SEEDS_DEFAULT: u64 = 20;

/// `seed`'s swarm draw at the bench's fixed size.
pub fn bench_config(seed: u64) -> SwarmConfig {
    let mut c = SwarmConfig::draw(seed);
    c.executors = vec![BENCH_CONCURRENCY; BENCH_EXECUTORS];
    c.payouts = BENCH_PAYOUTS;
    c.arrival_ms = BENCH_ARRIVAL_MS;
    c.fault_ms = BENCH_FAULT_MS;
    c
}

/// One bench seed's measurements.
#[derive(Debug, Clone)]
pub struct BenchSeed {
    pub outcome: SeedOutcome,
    /// CPU time of the seed on its thread (runtime build and checks included).
    pub cpu_s: f64,
    /// Requests the world's servers answered, by route.
    pub traffic: BTreeMap<String, u64>,
}

/// CPU seconds the calling thread has used (user + system, from `/proc/thread-self/stat`,
/// in clock ticks of 10 ms), read outside any runtime (madsim answers clock reads inside
/// one with simulated time). `None` where `/proc` is absent.
pub fn thread_cpu_s() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): utime is field 14, stime field 15.
    let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// CPU seconds of the calling thread (wall seconds where `/proc` is absent) spent in `f`.
fn cpu_of<T>(f: impl FnOnce() -> T) -> (T, f64) {
    let (c0, w0) = (thread_cpu_s(), std::time::Instant::now());
    let v = f();
    let spent = match (c0, thread_cpu_s()) {
        (Some(a), Some(b)) => b - a,
        _ => w0.elapsed().as_secs_f64(),
    };
    (v, spent)
}

/// Runs the bench seed of `seed` on the calling thread.
pub fn run_bench_seed(seed: u64) -> BenchSeed {
    dlock_rt::traffic::reset();
    let (outcome, cpu_s) = cpu_of(|| run_config(bench_config(seed), &RunOptions::default()));
    BenchSeed { outcome, cpu_s, traffic: dlock_rt::traffic::snapshot() }
}

/// CPU seconds per bare HTTP round trip through `dlock_rt::http` on madsim's network: a
/// fresh runtime with [`BASELINE_REQUESTS`] sequential requests, less the same runtime
/// with none (its set-up), over the count. Timed from outside the runtime, since inside
/// one every clock reads simulated time.
pub fn baseline_round_trip_s() -> f64 {
    let (_, with) = cpu_of(|| baseline_run(BASELINE_REQUESTS));
    let (_, without) = cpu_of(|| baseline_run(0));
    ((with - without) / f64::from(BASELINE_REQUESTS)).max(0.0)
}

fn baseline_run(requests: u32) {
    let rt = madsim::runtime::Runtime::with_seed_and_config(1, madsim::Config::default());
    let _ = rt.block_on(async move {
        let h = madsim::runtime::Handle::current();
        let addr: std::net::SocketAddr = ([10, 9, 0, 1], 80).into();
        let server = h.create_node().name("baseline-server").ip(addr.ip()).build();
        server.spawn(async move {
            let router = axum::Router::new().route("/v1/echo", axum::routing::post(|| async { "{\"ok\":true}" }));
            if let Ok(l) = dlock_rt::http::bind(addr).await {
                dlock_rt::http::serve(l, router, std::future::pending()).await;
            }
        });
        let client = h.create_node().name("baseline-client").ip([10, 9, 0, 2].into()).build();
        client
            .spawn(async move {
                let Ok(base) = dlock_rt::http::BaseUrl::parse(&format!("http://{addr}")) else { return };
                let http = dlock_rt::http::HttpClient::new(1_000, 1_000);
                // The server binds first (its node starts on the next tick).
                let _ = dlock_rt::wait_until(
                    std::time::Duration::from_millis(10),
                    std::time::Duration::from_secs(5),
                    || {
                        let (http, base) = (http.clone(), base.clone());
                        async move { http.probe(&base).await.ok() }
                    },
                )
                .await;
                let body = bytes::Bytes::from_static(b"{\"payoutId\":\"00000000-0000-0000-0000-000000000000\"}");
                for _ in 0..requests {
                    let _ = http
                        .send(
                            &base,
                            http::Method::POST,
                            "/v1/echo",
                            &[("content-type", "application/json")],
                            Some(body.clone()),
                        )
                        .await;
                }
            })
            .await
    });
}

/// The bench's report over its seeds, `jobs` threads, `wall_s` of the whole run.
#[derive(Debug, Clone)]
pub struct BenchReport {
    pub seeds: usize,
    pub jobs: usize,
    pub wall_s: f64,
    /// Sum over seeds of each seed's CPU time: "per core" figures divide by it, so a
    /// loaded machine (other jobs on the cores) does not lower them.
    pub cpu_s: f64,
    pub sim_s: f64,
    pub failures: Vec<String>,
    /// The worst failure class among the seeds (the bench's exit code, as a campaign's).
    pub worst: Option<crate::outcome::FailureClass>,
    pub traffic: BTreeMap<String, u64>,
    pub round_trip_s: f64,
}

impl BenchReport {
    pub fn new(runs: &[BenchSeed], jobs: usize, wall_s: f64, round_trip_s: f64) -> BenchReport {
        let mut traffic = BTreeMap::new();
        for r in runs {
            for (k, n) in &r.traffic {
                *traffic.entry(k.clone()).or_insert(0) += n;
            }
        }
        BenchReport {
            seeds: runs.len(),
            jobs,
            wall_s,
            cpu_s: runs.iter().map(|r| r.cpu_s).sum(),
            sim_s: runs.iter().map(|r| r.outcome.sim_ms as f64 / 1_000.0).sum(),
            failures: runs.iter().flat_map(|r| r.outcome.failures.iter().map(|f| f.line(r.outcome.seed))).collect(),
            worst: runs.iter().filter_map(|r| r.outcome.worst()).max(),
            traffic,
            round_trip_s,
        }
    }

    /// Seeds per second per core: seeds over the seeds' own wall time.
    pub fn seeds_per_s_per_core(&self) -> f64 {
        self.seeds as f64 / self.cpu_s.max(1e-9)
    }

    /// Simulated seconds per wall second, per core.
    pub fn sim_per_wall_per_core(&self) -> f64 {
        self.sim_s / self.cpu_s.max(1e-9)
    }

    pub fn requests(&self) -> u64 {
        self.traffic.values().sum()
    }

    /// Share of the seeds' wall time that their requests, at the baseline's cost each,
    /// explain.
    pub fn http_share(&self) -> f64 {
        self.requests() as f64 * self.round_trip_s / self.cpu_s.max(1e-9)
    }

    pub fn render(&self) -> String {
        let per_seed = |n: u64| n as f64 / self.seeds.max(1) as f64;
        let mut out = String::new();
        out.push_str(&format!(
            "bench: {} seeds of {} payouts, {} executors x concurrency {}, fault phase {} ms, on {} jobs, {:.1} s wall\n",
            self.seeds, BENCH_PAYOUTS, BENCH_EXECUTORS, BENCH_CONCURRENCY, BENCH_FAULT_MS, self.jobs, self.wall_s
        ));
        out.push_str(&format!(
            "  simulated per seed        {:.1} s\n  CPU per seed              {:.3} s\n",
            self.sim_s / self.seeds.max(1) as f64,
            self.cpu_s / self.seeds.max(1) as f64
        ));
        out.push_str(&format!(
            "  seeds/s/core              {:.2}   (target 20: {:.3} of it)\n",
            self.seeds_per_s_per_core(),
            self.seeds_per_s_per_core() / 20.0
        ));
        out.push_str(&format!(
            "  simulated s per wall s    {:.0}   per core (target 1000: {:.3} of it)\n",
            self.sim_per_wall_per_core(),
            self.sim_per_wall_per_core() / 1_000.0
        ));
        out.push_str(&format!(
            "  baseline: one bare HTTP round trip {:.1} us of CPU (same run, {} requests)\n",
            self.round_trip_s * 1e6,
            BASELINE_REQUESTS
        ));
        out.push_str(&format!(
            "  requests per seed {:.0}; at the baseline's cost they explain {:.2} of the CPU time\n",
            per_seed(self.requests()),
            self.http_share()
        ));
        let mut routes: Vec<(&String, &u64)> = self.traffic.iter().collect();
        routes.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        for (route, n) in routes {
            out.push_str(&format!("    {:<40} {:>8.0} per seed\n", route, per_seed(*n)));
        }
        if self.failures.is_empty() {
            out.push_str("  failures: none\n");
        } else {
            for f in &self.failures {
                out.push_str(&format!("  failure: {f}\n"));
            }
        }
        out
    }
}

/// Runs `seeds` bench seeds on `jobs` threads, then the baseline; the report.
pub fn run_bench(seeds: &[u64], jobs: usize) -> BenchReport {
    let jobs = jobs.clamp(1, seeds.len().max(1));
    let runs = std::sync::Mutex::new(Vec::new());
    let started = std::time::Instant::now();
    crate::campaign::for_each_seed(seeds, jobs, &|seed| {
        let r = run_bench_seed(seed);
        if let Ok(mut runs) = runs.lock() {
            runs.push(r);
        }
    });
    let wall_s = started.elapsed().as_secs_f64();
    let round_trip_s = baseline_round_trip_s();
    let mut runs = runs.into_inner().unwrap_or_else(|e| e.into_inner());
    runs.sort_by_key(|r| r.outcome.seed);
    BenchReport::new(&runs, jobs, wall_s, round_trip_s)
}
