//! The soak's gauges: every [`SOAK_SAMPLE_EVERY_MS`] the run reads each process's resident
//! memory, open file descriptors and threads (`/proc/PID/status`, `/proc/PID/fd`),
//! PostgreSQL's database sizes and connection count, etcd's database size, and the payouts
//! posted so far. [`trends`] turns each series into its trend and a judgement
//! (docs/real-runs.md "The soak"):
//! - **flat**: it ends within [`FLAT_FRACTION`] of where it started;
//! - **levels off**: it grew, but over the run's last half by less than [`FLAT_FRACTION`]
//!   of its first value (a bound, a pool or a cache filled up);
//! - **grows with work**: it grew over the last half too, and stopped growing when the work
//!   stopped (the settle phase): rows the stores keep per payout;
//! - **grows with time**: it kept growing after the work stopped: a leak.
//!
//! Invariants: a sample never blocks the run for longer than [`SOAK_READ_TIMEOUT_MS`] (a
//! paused PostgreSQL yields a sample without its database figures); a process that is down
//! contributes no point to its series (a restart starts from its new value, never a gap
//! read as zero).

use std::collections::BTreeMap;
use std::time::Duration;

/// How often the gauges are read.
pub const SOAK_SAMPLE_EVERY_MS: u64 = 5_000;
/// Bound on one sample's database reads.
pub const SOAK_READ_TIMEOUT_MS: u64 = 2_000;
/// A series within this fraction of its first value is flat.
pub const FLAT_FRACTION: f64 = 0.10;

/// One sample: host monotonic ms, whether the work was still flowing, payouts posted, and
/// every gauge's value by name (`executor-1.rss_kb`, `paydb.bytes`, ...).
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub at_ms: u64,
    pub working: bool,
    pub posted: u64,
    pub gauges: BTreeMap<String, f64>,
}

/// `VmRSS` (kB), `Threads` and open fds of `pid`, or `None` when it is gone.
pub fn process_gauges(pid: i32) -> Option<(f64, f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| -> Option<f64> {
        status.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse().ok()
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as f64;
    Some((field("VmRSS:")?, field("Threads:")?, fds))
}

/// PostgreSQL's gauges: paydb's and queuedb's size, and its connections.
pub async fn database_gauges(pool: &sqlx::PgPool, out: &mut BTreeMap<String, f64>) {
    let read = async {
        let paydb: i64 = sqlx::query_scalar("SELECT pg_database_size('paydb')").fetch_one(pool).await.ok()?;
        let conns: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_activity").fetch_one(pool).await.ok()?;
        let posted: i64 =
            sqlx::query_scalar("SELECT count(*) FROM payouts WHERE state = 'POSTED'").fetch_one(pool).await.ok()?;
        Some((paydb, conns, posted))
    };
    if let Ok(Some((paydb, conns, posted))) =
        tokio::time::timeout(Duration::from_millis(SOAK_READ_TIMEOUT_MS), read).await
    {
        out.insert("postgres.paydb_kb".into(), paydb as f64 / 1024.0);
        out.insert("postgres.connections".into(), conns as f64);
        out.insert("posted".into(), posted as f64);
    }
}

/// Samples the gauges of every process of the cluster (their pid files in `run_dir`) and
/// of PostgreSQL every [`SOAK_SAMPLE_EVERY_MS`] until `sampling` is cleared; `working` says
/// whether the workload still flows. The samples, in order.
pub fn spawn(
    rt: &tokio::runtime::Runtime,
    pool: sqlx::PgPool,
    run_dir: std::path::PathBuf,
    sampling: std::sync::Arc<std::sync::atomic::AtomicBool>,
    working: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> (tokio::task::JoinHandle<()>, std::sync::Arc<std::sync::Mutex<Vec<Sample>>>) {
    use std::sync::atomic::Ordering;
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let out = samples.clone();
    let task = rt.spawn(async move {
        let mut posted = 0;
        while sampling.load(Ordering::Relaxed) {
            let at_ms = crate::history::now_mono_ms();
            let mut g = BTreeMap::new();
            for name in crate::nemesis::PROCESSES {
                let pid_file = run_dir.join(format!("{name}.pid"));
                let pid = std::fs::read_to_string(pid_file).ok().and_then(|s| s.trim().parse().ok());
                if let Some((rss, threads, fds)) = pid.and_then(process_gauges) {
                    g.insert(format!("{name}.rss_kb"), rss);
                    g.insert(format!("{name}.threads"), threads);
                    g.insert(format!("{name}.fds"), fds);
                }
            }
            database_gauges(&pool, &mut g).await;
            if let Some(p) = g.remove("posted") {
                posted = p as u64;
            }
            let sample = Sample { at_ms, working: working.load(Ordering::Relaxed), posted, gauges: g };
            if let Ok(mut v) = samples.lock() {
                v.push(sample);
            }
            tokio::time::sleep(Duration::from_millis(SOAK_SAMPLE_EVERY_MS)).await;
        }
    });
    (task, out)
}

/// One series' trend (module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Trend {
    pub name: String,
    pub first: f64,
    pub last: f64,
    pub max: f64,
    /// Change per minute over the run's second half.
    pub per_min_late: f64,
    /// Change per 1 000 payouts posted, over the whole run.
    pub per_1000_payouts: Option<f64>,
    pub verdict: &'static str,
}

/// Least-squares slope of `ys` over `xs`; 0 with fewer than two points or no spread.
fn slope(xs: &[f64], ys: &[f64]) -> f64 {
    let n = xs.len().min(ys.len()) as f64;
    if n < 2.0 {
        return 0.0;
    }
    let (mx, my) = (xs.iter().sum::<f64>() / n, ys.iter().sum::<f64>() / n);
    let (mut num, mut den) = (0.0, 0.0);
    for (x, y) in xs.iter().zip(ys) {
        num += (x - mx) * (y - my);
        den += (x - mx) * (x - mx);
    }
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// Every gauge's trend over `samples` (module doc), in name order.
pub fn trends(samples: &[Sample]) -> Vec<Trend> {
    let mut names: Vec<&String> = samples.iter().flat_map(|s| s.gauges.keys()).collect();
    names.sort();
    names.dedup();
    let mut out = Vec::new();
    for name in names.into_iter().filter(|n| n.as_str() != "posted") {
        let points: Vec<(u64, bool, u64, f64)> =
            samples.iter().filter_map(|s| s.gauges.get(name).map(|v| (s.at_ms, s.working, s.posted, *v))).collect();
        let (Some(first), Some(last)) = (points.first(), points.last()) else { continue };
        let max = points.iter().map(|p| p.3).fold(f64::MIN, f64::max);
        let t0 = first.0;
        let mid = t0 + (last.0 - t0) / 2;
        let late: Vec<&(u64, bool, u64, f64)> = points.iter().filter(|p| p.0 >= mid).collect();
        let xs: Vec<f64> = late.iter().map(|p| (p.0 - t0) as f64 / 60_000.0).collect();
        let ys: Vec<f64> = late.iter().map(|p| p.3).collect();
        let per_min_late = slope(&xs, &ys);
        let posted_span = last.2.saturating_sub(first.2) as f64;
        let per_1000_payouts = (posted_span > 0.0).then(|| (last.3 - first.3) * 1000.0 / posted_span);
        // After the work stopped: did it keep growing?
        let idle: Vec<&(u64, bool, u64, f64)> = points.iter().filter(|p| !p.1).collect();
        let idle_growth = match (idle.first(), idle.last()) {
            (Some(a), Some(b)) => b.3 - a.3,
            _ => 0.0,
        };
        let scale = first.3.abs().max(1.0);
        let late_growth = per_min_late * ((last.0 - mid) as f64 / 60_000.0);
        let verdict = if (last.3 - first.3).abs() <= FLAT_FRACTION * scale {
            "flat"
        } else if late_growth.abs() <= FLAT_FRACTION * scale {
            "levels off"
        } else if idle.len() >= 2 && idle_growth > FLAT_FRACTION * scale {
            "grows with time"
        } else {
            "grows with work"
        };
        out.push(Trend {
            name: name.clone(),
            first: first.3,
            last: last.3,
            max,
            per_min_late,
            per_1000_payouts,
            verdict,
        });
    }
    out
}

/// Payouts posted per minute, minute by minute, from the samples' `posted` counter.
pub fn posted_per_minute(samples: &[Sample]) -> Vec<u64> {
    let Some(t0) = samples.first().map(|s| s.at_ms) else { return Vec::new() };
    let mut at_minute: BTreeMap<u64, u64> = BTreeMap::new();
    for s in samples {
        at_minute.insert((s.at_ms - t0) / 60_000, s.posted);
    }
    let mut out = Vec::new();
    let mut before = samples.first().map_or(0, |s| s.posted);
    for (_, posted) in at_minute {
        out.push(posted.saturating_sub(before));
        before = posted;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(values: &[(f64, bool)], posted_per_step: u64) -> Vec<Sample> {
        let mut posted = 0;
        values
            .iter()
            .enumerate()
            .map(|(i, (v, working))| {
                if *working {
                    posted += posted_per_step;
                }
                Sample {
                    at_ms: i as u64 * 60_000,
                    working: *working,
                    posted,
                    gauges: BTreeMap::from([("x".to_owned(), *v)]),
                }
            })
            .collect()
    }

    #[test]
    fn a_series_is_judged_flat_levelling_off_growing_with_work_or_leaking() {
        let flat = series(&[(100.0, true), (104.0, true), (98.0, true), (103.0, false)], 100);
        assert_eq!(trends(&flat)[0].verdict, "flat");
        let levels = series(&[(100.0, true), (180.0, true), (200.0, true), (201.0, true), (202.0, false)], 100);
        assert_eq!(trends(&levels)[0].verdict, "levels off");
        let work = series(
            &[
                (100.0, true),
                (150.0, true),
                (200.0, true),
                (250.0, true),
                (300.0, true),
                (350.0, true),
                (351.0, false),
                (351.0, false),
            ],
            100,
        );
        let t = &trends(&work)[0];
        assert_eq!(t.verdict, "grows with work");
        assert_eq!(t.per_1000_payouts.map(|v| v.round()), Some(502.0));
        let leak =
            series(&[(100.0, true), (150.0, true), (200.0, true), (250.0, false), (300.0, false), (350.0, false)], 100);
        assert_eq!(trends(&leak)[0].verdict, "grows with time");
    }

    #[test]
    fn throughput_per_minute_counts_the_posts_of_each_minute() {
        let s = series(&[(1.0, true), (1.0, true), (1.0, true)], 600);
        assert_eq!(posted_per_minute(&s), vec![0, 600, 600]);
    }

    #[test]
    fn this_process_has_gauges_and_a_process_that_is_gone_has_none() {
        let me = i32::try_from(std::process::id()).unwrap_or(1);
        let (rss, threads, fds) = process_gauges(me).unwrap_or_default();
        assert!(rss > 0.0 && threads >= 1.0 && fds >= 1.0, "{rss} {threads} {fds}");
        assert!(process_gauges(i32::MAX).is_none());
    }
}
