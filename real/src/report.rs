//! The report of a real run (docs/real-runs.md "Exit codes and the report"): the text
//! lines or the one `--json` object, the merged history written as `incident.jsonl` and its
//! timeline, and the exit code.
//!
//! Invariants: the exit code is the worst failure's class (0 when none); a planted run says
//! whether its bug's invariant is among the failures; at most [`FAILURE_LINES_MAX`]
//! failures are printed as text, every one is in the JSON.

use std::collections::BTreeMap;
use std::path::Path;

use dlock_sim::outcome::{Failure, FailureClass};
use serde_json::json;

use crate::nemesis::Plan;
use crate::run::{say, Args};

/// Bound on the failure lines the text report prints (`--json` has them all).
pub const FAILURE_LINES_MAX: usize = 20;

/// Runs at least this long print every gauge's trend (shorter ones only a leak's).
pub const SOAK_TABLE_MS: u64 = 600_000;

/// What a run produced.
#[derive(Default)]
pub struct Outcome {
    pub failures: Vec<Failure>,
    pub created: usize,
    pub not_created: u64,
    pub by_state: BTreeMap<String, u64>,
    pub applied: BTreeMap<String, u64>,
    pub posted_per_s: Option<f64>,
    pub p50_ms: Option<u64>,
    pub p99_ms: Option<u64>,
    pub posted_measured: usize,
    pub rail_calls: usize,
    pub paid_twice: u64,
    pub history: String,
    pub unparsed_lines: u64,
    pub queue: Option<crate::queue::QueueOutcome>,
    pub soak: Vec<crate::soak::Sample>,
    pub lock_set: Option<crate::lockset::LockSetOutcome>,
    /// The history around the first failure that names a lock key
    /// ([`crate::judge::lock_evidence`]): printed under it.
    pub evidence: Vec<String>,
}

/// Prints the report; the exit code (module doc).
/// Whether a planted run's failures hold one of its bug's invariants (`None`: no plant).
pub fn planted_caught(plant: Option<&str>, failures: &[dlock_sim::outcome::Failure]) -> Option<bool> {
    plant.map(|p| {
        let want = crate::plants::find(p).map(|p| p.invariants).unwrap_or_default();
        failures.iter().any(|f| want.contains(&f.invariant))
    })
}

pub fn report(dir: &Path, plan: &Plan, a: &Args, o: &Outcome) -> u8 {
    let worst = o.failures.iter().map(|f| f.class).max();
    let code = worst.map_or(0, FailureClass::exit_code);
    let incident = dir.join("incident.jsonl");
    let timeline = dir.join("timeline.html");
    let _ = std::fs::write(&incident, &o.history);
    if let Ok(html) = dlock_timeline::render_html(&o.history) {
        let _ = std::fs::write(&timeline, html);
    }
    let verdict = match worst {
        None => "clean".to_owned(),
        Some(c) => c.name().to_owned(),
    };
    let throughput = o.posted_per_s.map_or("-".to_owned(), |r| format!("{r:.1}"));
    let ms = |v: Option<u64>| v.map_or("-".to_owned(), |v| v.to_string());
    let planted_caught = planted_caught(a.plant.as_deref(), &o.failures);
    if a.json {
        let v = json!({
            "seed": plan.seed,
            "duration_s": plan.duration_ms / 1000,
            "nemesis": plan.kinds,
            "plan": plan.lines(),
            "plant": a.plant,
            "planted_caught": planted_caught,
            "faults_applied": o.applied,
            "payouts": {"created": o.created, "not_created": o.not_created, "by_state": o.by_state},
            "rail_calls": o.rail_calls,
            "paid_twice": o.paid_twice,
            "posted_per_s": o.posted_per_s,
            "p50_ms": o.p50_ms,
            "p99_ms": o.p99_ms,
            "latency_sample": o.posted_measured,
            "lock_set": o.lock_set.as_ref().map(|l| json!({
                "fenced": {"acknowledged": l.fenced.acknowledged, "lost": l.fenced.lost.len(), "refused": l.fenced.refused, "final_size": l.fenced.final_size},
                "control": {"acknowledged": l.control.acknowledged, "lost": l.control.lost.len(), "final_size": l.control.final_size},
            })),
            "soak": {
                "samples": o.soak.len(),
                "posted_per_minute": crate::soak::posted_per_minute(&o.soak),
                "trends": crate::soak::trends(&o.soak).iter().map(|t| json!({
                    "name": t.name, "first": t.first, "last": t.last, "max": t.max,
                    "per_min_late": t.per_min_late, "per_1000_payouts": t.per_1000_payouts, "verdict": t.verdict,
                })).collect::<Vec<_>>(),
            },
            "queue": o.queue.as_ref().map(|q| json!({
                "created": q.created, "paid": q.paid, "failed": q.failed, "rail_calls": q.rail_calls,
                "called_twice": q.called_twice, "paid_twice": q.paid_twice, "paid_per_s": q.paid_per_s,
                "p50_ms": q.p50_ms, "p99_ms": q.p99_ms,
            })),
            "history_lines_unparsed": o.unparsed_lines,
            "failures": o.failures.iter().map(|f| json!({"class": f.class.name(), "invariant": f.invariant, "detail": f.detail})).collect::<Vec<_>>(),
            "verdict": verdict,
            "exit": code,
            "incident_trace": incident,
            "timeline": timeline,
        });
        println!("{v}");
    } else {
        println!("payouts: {} created, {} not created, by state {:?}", o.created, o.not_created, o.by_state);
        println!(
            "dlock: {throughput} posted/s, p50 {} ms, p99 {} ms (create to post, {} payouts), {} rail calls, {} paid twice",
            ms(o.p50_ms),
            ms(o.p99_ms),
            o.posted_measured,
            o.rail_calls,
            o.paid_twice
        );
        if let Some(q) = &o.queue {
            println!(
                "queue: {} paid/s, p50 {} ms, p99 {} ms (create to paid), {} rail calls, {} called twice, {} paid twice",
                q.paid_per_s.map_or("-".to_owned(), |r| format!("{r:.1}")),
                ms(q.p50_ms),
                ms(q.p99_ms),
                q.rail_calls,
                q.called_twice,
                q.paid_twice
            );
        }
        if let Some(l) = &o.lock_set {
            println!(
                "lock-set: fenced {} acknowledged, {} lost ({} refused as fenced out); control without the fence {} acknowledged, {} lost",
                l.fenced.acknowledged,
                l.fenced.lost.len(),
                l.fenced.refused,
                l.control.acknowledged,
                l.control.lost.len()
            );
        }
        println!("faults applied: {:?}", o.applied);
        let trends = crate::soak::trends(&o.soak);
        let per_min = crate::soak::posted_per_minute(&o.soak);
        let by_verdict = trends.iter().fold(BTreeMap::<&str, usize>::new(), |mut m, t| {
            *m.entry(t.verdict).or_insert(0) += 1;
            m
        });
        println!(
            "soak: {} samples, {} series {by_verdict:?}; posted per minute {per_min:?}",
            o.soak.len(),
            trends.len()
        );
        for t in trends.iter().filter(|t| plan.duration_ms >= SOAK_TABLE_MS || t.verdict == "grows with time") {
            println!(
                "  {:<34} {:>12.0} -> {:>12.0} (max {:>12.0}) {:>+10.1}/min late, {:>+10.1} per 1 000 payouts: {}",
                t.name,
                t.first,
                t.last,
                t.max,
                t.per_min_late,
                t.per_1000_payouts.unwrap_or(0.0),
                t.verdict
            );
        }
        for f in o.failures.iter().take(FAILURE_LINES_MAX) {
            println!("{}", f.line(plan.seed));
        }
        if o.failures.len() > FAILURE_LINES_MAX {
            println!("... and {} more failures (--json lists them all)", o.failures.len() - FAILURE_LINES_MAX);
        }
        if let Some(first) = o.failures.first() {
            println!("first broken invariant: {} (seed {}; the plan is printed above)", first.invariant, plan.seed);
            if !o.evidence.is_empty() {
                println!("the history of its lock key (store calls and answers, sessions' closes, faults):");
                for l in &o.evidence {
                    println!("{l}");
                }
            }
            println!("incident trace {}; timeline {}", incident.display(), timeline.display());
        }
        println!("verdict: {verdict} (exit {code})");
    }
    match planted_caught {
        Some(true) => say(a.json, "planted bug caught"),
        Some(false) => say(a.json, "planted bug NOT caught: the checker missed it"),
        None => {}
    }
    code
}
