//! A campaign's summary: failures by class and invariant, probe counts, speed.
//!
//! Built from each seed's [`SeedOutcome`] as it ends ([`Summary::add`]); printed as text
//! ([`Summary::render`]) or JSON ([`Summary::to_json`]). The exit code is the worst class's
//! ([`Summary::exit_code`], 0 when clean).

use std::collections::BTreeMap;

use dlock_rt::defence::{Layer, Tally};
use dlock_rt::probe::Probe;
use serde_json::{json, Value};

use crate::outcome::{Failure, FailureClass, SeedOutcome};

/// The replay command of one seed, ready to paste.
pub fn replay_command(seed: u64) -> String {
    format!("cargo xtask sim replay --seed {seed}")
}

/// What a campaign saw.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub seeds_run: u64,
    /// (seed, drawn configuration, failure), in the order seeds ended.
    pub failures: Vec<(u64, String, Failure)>,
    /// Every probe's total over the seeds (zeros included).
    pub probes: BTreeMap<Probe, u64>,
    pub sim_ms: u64,
    /// Wall time the campaign took, in seconds (set by the runner).
    pub wall_s: f64,
    /// Worker threads (one madsim runtime each).
    pub jobs: usize,
    /// The defence layer the campaign switched off (`--layer-off`), if any.
    pub layer_off: Option<Layer>,
    /// What each defence layer stopped or (switched off) let through, over the seeds.
    pub defence: Tally,
}

impl Summary {
    pub fn new(jobs: usize) -> Summary {
        Summary { probes: Probe::ALL.iter().map(|p| (*p, 0)).collect(), jobs: jobs.max(1), ..Summary::default() }
    }

    pub fn add(&mut self, o: &SeedOutcome) {
        self.seeds_run += 1;
        self.sim_ms += o.sim_ms;
        for (p, n) in &o.probes {
            *self.probes.entry(*p).or_insert(0) += n;
        }
        for f in &o.failures {
            self.failures.push((o.seed, o.config.clone(), f.clone()));
        }
        self.defence.add(&o.defence);
    }

    /// The defence line: which layer was off, what each layer stopped and let through.
    pub fn defence_line(&self) -> String {
        let counts = |m: &BTreeMap<Layer, u64>| {
            let v: Vec<String> = m.iter().map(|(l, n)| format!("{l}={n}")).collect();
            if v.is_empty() {
                "none".to_owned()
            } else {
                v.join(" ")
            }
        };
        format!(
            "defence: {}; stopped {}; bypassed {}",
            self.layer_off.map(|l| format!("layer {l} OFF")).unwrap_or_else(|| "every layer on".to_owned()),
            counts(&self.defence.stopped),
            counts(&self.defence.bypassed)
        )
    }

    pub fn worst(&self) -> Option<FailureClass> {
        self.failures.iter().map(|(_, _, f)| f.class).max()
    }

    /// 0 when clean, else the worst class's code (127 crash, 128 liveness, 129 correctness).
    pub fn exit_code(&self) -> u8 {
        self.worst().map(FailureClass::exit_code).unwrap_or(0)
    }

    /// Failures counted by (class, invariant).
    pub fn by_invariant(&self) -> BTreeMap<(FailureClass, &'static str), u64> {
        let mut m = BTreeMap::new();
        for (_, _, f) in &self.failures {
            *m.entry((f.class, f.invariant)).or_insert(0) += 1;
        }
        m
    }

    /// Probes that never fired.
    pub fn silent_probes(&self) -> Vec<Probe> {
        Probe::ALL.iter().copied().filter(|p| self.probes.get(p).copied().unwrap_or(0) == 0).collect()
    }

    pub fn seeds_per_s(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.seeds_run as f64 / self.wall_s
        } else {
            0.0
        }
    }

    pub fn seeds_per_s_per_core(&self) -> f64 {
        self.seeds_per_s() / self.jobs as f64
    }

    /// Simulated seconds per wall second, summed over the workers.
    pub fn sim_speedup(&self) -> f64 {
        if self.wall_s > 0.0 {
            self.sim_ms as f64 / 1_000.0 / self.wall_s
        } else {
            0.0
        }
    }

    /// One line per failure, with its replay command.
    pub fn failure_lines(&self) -> Vec<String> {
        self.failures
            .iter()
            .map(|(seed, _, f)| format!("{}  replay: {}", f.line(*seed), replay_command(*seed)))
            .collect()
    }

    /// The text summary.
    pub fn render(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "dlock-sim: {} seeds, {} failures ({})\n",
            self.seeds_run,
            self.failures.len(),
            match self.worst() {
                Some(c) => format!("worst: {}, exit {}", c.name(), c.exit_code()),
                None => "clean, exit 0".to_owned(),
            }
        ));
        for ((class, inv), n) in self.by_invariant() {
            out.push_str(&format!("  {:<12} {inv}: {n}\n", class.name()));
        }
        for line in self.failure_lines() {
            out.push_str(&format!("  {line}\n"));
        }
        out.push_str(&self.defence_line());
        out.push('\n');
        out.push_str("probes:\n");
        for (p, n) in &self.probes {
            out.push_str(&format!("  {:<28} {n}\n", p.name()));
        }
        out.push_str(&format!(
            "speed: {:.1} seeds/s on {} jobs ({:.2} seeds/s/core), {:.0} simulated s per wall s ({:.1} s simulated in {:.1} s wall)\n",
            self.seeds_per_s(),
            self.jobs,
            self.seeds_per_s_per_core(),
            self.sim_speedup(),
            self.sim_ms as f64 / 1_000.0,
            self.wall_s
        ));
        out
    }

    /// The same summary, for machines.
    pub fn to_json(&self) -> Value {
        let by: Vec<Value> = self
            .by_invariant()
            .into_iter()
            .map(|((c, inv), n)| json!({"class": c.name(), "invariant": inv, "count": n}))
            .collect();
        let failures: Vec<Value> = self
            .failures
            .iter()
            .map(|(seed, config, f)| {
                json!({"seed": seed, "class": f.class.name(), "exitCode": f.class.exit_code(), "invariant": f.invariant,
                       "detail": f.detail, "config": config, "replay": replay_command(*seed)})
            })
            .collect();
        let probes: serde_json::Map<String, Value> =
            self.probes.iter().map(|(p, n)| (p.name().to_owned(), json!(n))).collect();
        json!({
            "seedsRun": self.seeds_run,
            "exitCode": self.exit_code(),
            "worst": self.worst().map(|c| c.name()),
            "byInvariant": by,
            "failures": failures,
            "probes": probes,
            "silentProbes": self.silent_probes().iter().map(|p| p.name()).collect::<Vec<_>>(),
            "simMs": self.sim_ms,
            "wallS": self.wall_s,
            "jobs": self.jobs,
            "seedsPerS": self.seeds_per_s(),
            "seedsPerSPerCore": self.seeds_per_s_per_core(),
            "simSecondsPerWallSecond": self.sim_speedup(),
            "layerOff": self.layer_off.map(|l| l.name()),
            "defence": {
                "stopped": self.defence.stopped.iter().map(|(l, n)| (l.name().to_owned(), json!(n))).collect::<serde_json::Map<_, _>>(),
                "bypassed": self.defence.bypassed.iter().map(|(l, n)| (l.name().to_owned(), json!(n))).collect::<serde_json::Map<_, _>>(),
            },
        })
    }
}

/// The seeds of a campaign: `count` seeds from `start`, and of those, with `shard = (k, n)`,
/// only the ones whose index `i` (0-based) has `i % n == k - 1` (nextest's partitioning).
pub fn seeds(start: u64, count: u64, shard: Option<(u64, u64)>) -> Vec<u64> {
    (0..count)
        .filter(|i| match shard {
            Some((k, n)) if n > 0 => i % n == k.saturating_sub(1),
            _ => true,
        })
        .map(|i| start.wrapping_add(i))
        .collect()
}

/// Parses `K/N` (1 <= K <= N).
pub fn parse_shard(s: &str) -> Result<(u64, u64), String> {
    let (k, n) = s.split_once('/').ok_or_else(|| format!("--shard {s}: expected K/N"))?;
    let k: u64 = k.parse().map_err(|_| format!("--shard {s}: K is not a number"))?;
    let n: u64 = n.parse().map_err(|_| format!("--shard {s}: N is not a number"))?;
    if k == 0 || n == 0 || k > n {
        return Err(format!("--shard {s}: need 1 <= K <= N"));
    }
    Ok((k, n))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_partition_the_seed_range_like_nextest() {
        let all = seeds(100, 10, None);
        assert_eq!(all, (100..110).collect::<Vec<_>>());
        let mut union: Vec<u64> = (1..=3).flat_map(|k| seeds(100, 10, Some((k, 3)))).collect();
        union.sort_unstable();
        assert_eq!(union, all);
        assert_eq!(seeds(100, 10, Some((1, 3))), vec![100, 103, 106, 109]);
        assert_eq!(parse_shard("2/4"), Ok((2, 4)));
        assert!(parse_shard("0/4").is_err() && parse_shard("5/4").is_err() && parse_shard("x").is_err());
    }

    #[test]
    fn the_summary_exits_with_the_worst_class_and_names_the_replay() {
        let mut s = Summary::new(2);
        assert_eq!(s.exit_code(), 0);
        s.add(&SeedOutcome {
            seed: 3,
            failures: vec![Failure::liveness("every_payout_settles", "1 open")],
            ..SeedOutcome::default()
        });
        assert_eq!(s.exit_code(), 128);
        s.add(&SeedOutcome {
            seed: 9,
            failures: vec![Failure::correctness("at_most_one_rail_call_per_payout", "p twice")],
            ..SeedOutcome::default()
        });
        assert_eq!(s.exit_code(), 129);
        assert!(s.failure_lines()[1].ends_with("cargo xtask sim replay --seed 9"));
        assert_eq!(s.to_json()["exitCode"], 129);
        assert_eq!(s.silent_probes().len(), Probe::ALL.len());
    }
}
