//! A campaign's summary: failures by class and invariant, probe counts, speed.
//!
//! Built from each seed's [`SeedOutcome`] as it ends ([`Summary::add`]); printed as text
//! ([`Summary::render`]) or JSON ([`Summary::to_json`]). The exit code is the worst class's
//! ([`Summary::exit_code`], 0 when clean); when the campaign requires every probe
//! ([`Summary::require_probes`], the runner's `--require-probes`, the default campaign test)
//! and no seed failed, a probe that never fired makes it [`COVERAGE_EXIT_CODE`].
//!
//! Invariant: a failing seed always outranks a coverage gap (127/128/129 over 3), and the
//! coverage verdict ([`Summary::coverage_failure`]) names every probe of [`Probe::ALL`] with a
//! zero total and the seed range it was judged over.

use std::collections::BTreeMap;

use dlock_rt::defence::{Layer, Tally};
use dlock_rt::probe::Probe;
use serde_json::{json, Value};

use crate::outcome::{Failure, FailureClass, SeedOutcome};

/// Exit code of a campaign without failures in which a probe of [`Probe::ALL`] never fired,
/// when every probe is required (`--require-probes`): "the simulation stopped exploring".
/// Below the seed classes (127 crash, 128 liveness, 129 correctness) and distinct from 2
/// (usage).
pub const COVERAGE_EXIT_CODE: u8 = 3;

/// The replay command of one seed, ready to paste.
pub fn replay_command(seed: u64) -> String {
    format!("cargo xtask sim replay --seed {seed}")
}

/// The replay command of a seed whose configuration line is `config`: a scenario seed's
/// (`seed=S scenario=NAME ...`) replays with `--scenario NAME`.
pub fn replay_command_of(seed: u64, config: &str) -> String {
    match config.split(' ').find_map(|w| w.strip_prefix("scenario=")) {
        Some(name) => format!("{} --scenario {name}", replay_command(seed)),
        None => replay_command(seed),
    }
}

/// The replay command of a seed of a campaign run with `layer_off` switched off and
/// `planted` planted: [`replay_command_of`] with the same switches, so the pasted command
/// replays the same run.
pub fn replay_command_with(
    seed: u64,
    config: &str,
    layer_off: Option<Layer>,
    planted: Option<dlock_rt::planted::Bug>,
) -> String {
    let mut c = replay_command_of(seed, config);
    if let Some(l) = layer_off {
        c.push_str(&format!(" --layer-off {l}"));
    }
    if let Some(b) = planted {
        c.push_str(&format!(" --plant {b}"));
    }
    c
}

/// What a campaign saw.
#[derive(Debug, Clone, Default)]
pub struct Summary {
    pub seeds_run: u64,
    /// (seed, drawn configuration, failure), in the order seeds ended.
    pub failures: Vec<(u64, String, Failure)>,
    /// Every probe's total over the seeds (zeros included).
    pub probes: BTreeMap<Probe, u64>,
    /// Fault events applied over the seeds, by kind (every kind of
    /// [`crate::fault::KINDS`], zeros included).
    pub faults: BTreeMap<&'static str, u64>,
    pub sim_ms: u64,
    /// Wall time the campaign took, in seconds (set by the runner).
    pub wall_s: f64,
    /// Worker threads (one madsim runtime each).
    pub jobs: usize,
    /// The lowest and highest seed run (for the coverage verdict).
    pub seed_range: Option<(u64, u64)>,
    /// Whether a probe that never fired fails the campaign ([`COVERAGE_EXIT_CODE`]).
    pub require_probes: bool,
    /// The defence layer the campaign switched off (`--layer-off`), if any.
    pub layer_off: Option<Layer>,
    /// The bug planted for every seed, if any (`--plant`).
    pub planted: Option<dlock_rt::planted::Bug>,
    /// What each defence layer stopped or (switched off) let through, over the seeds.
    pub defence: Tally,
}

impl Summary {
    pub fn new(jobs: usize) -> Summary {
        Summary {
            probes: Probe::ALL.iter().map(|p| (*p, 0)).collect(),
            faults: crate::fault::KINDS.iter().map(|k| (k.name, 0)).collect(),
            jobs: jobs.max(1),
            ..Summary::default()
        }
    }

    pub fn add(&mut self, o: &SeedOutcome) {
        self.seeds_run += 1;
        self.sim_ms += o.sim_ms;
        self.seed_range = Some(match self.seed_range {
            Some((lo, hi)) => (lo.min(o.seed), hi.max(o.seed)),
            None => (o.seed, o.seed),
        });
        for (p, n) in &o.probes {
            *self.probes.entry(*p).or_insert(0) += n;
        }
        for (k, n) in &o.faults {
            *self.faults.entry(k).or_insert(0) += n;
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

    /// 0 when clean, else the worst class's code (127 crash, 128 liveness, 129 correctness);
    /// with [`Summary::require_probes`] and no failing seed, [`COVERAGE_EXIT_CODE`] when a
    /// probe never fired.
    pub fn exit_code(&self) -> u8 {
        match self.worst() {
            Some(c) => c.exit_code(),
            None if self.require_probes && self.coverage_failure().is_some() => COVERAGE_EXIT_CODE,
            None => 0,
        }
    }

    /// The seeds judged, as `first..=last (N seeds)`.
    pub fn seed_range_text(&self) -> String {
        match self.seed_range {
            Some((lo, hi)) => format!("seeds {lo}..={hi} ({} seeds)", self.seeds_run),
            None => "no seeds".to_owned(),
        }
    }

    /// The coverage verdict, whether or not it is required: `None` when every probe of
    /// [`Probe::ALL`] fired at least once, else one line naming each probe that never fired
    /// and the seed range.
    pub fn coverage_failure(&self) -> Option<String> {
        let silent = self.silent_probes();
        if silent.is_empty() {
            return None;
        }
        let names: Vec<&str> = silent.iter().map(|p| p.name()).collect();
        Some(format!(
            "coverage: {} of {} probes never fired across {}: {}",
            silent.len(),
            Probe::ALL.len(),
            self.seed_range_text(),
            names.join(", ")
        ))
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

    /// Fault kinds no seed's schedule applied: a campaign that never played one has not
    /// explored it.
    pub fn unplayed_fault_kinds(&self) -> Vec<&'static str> {
        crate::fault::KINDS.iter().map(|k| k.name).filter(|k| self.faults.get(k).copied().unwrap_or(0) == 0).collect()
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
            .map(|(seed, config, f)| {
                format!(
                    "{}  replay: {}",
                    f.line(*seed),
                    replay_command_with(*seed, config, self.layer_off, self.planted)
                )
            })
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
        if let Some(b) = self.planted {
            out.push_str(&format!("planted: bug {b} in every seed (a negative control: failures are expected)\n"));
        }
        out.push_str("probes:\n");
        for (p, n) in &self.probes {
            out.push_str(&format!("  {:<32} {n}{}\n", p.name(), if *n == 0 { "  (never fired)" } else { "" }));
        }
        match self.coverage_failure() {
            Some(line) if self.require_probes && self.worst().is_none() => {
                out.push_str(&format!("{line} (required: exit {COVERAGE_EXIT_CODE})\n"))
            }
            Some(line) => out.push_str(&format!("{line}\n")),
            None => out.push_str(&format!("coverage: every probe fired across {}\n", self.seed_range_text())),
        }
        out.push_str("fault events applied:\n");
        for (k, n) in &self.faults {
            out.push_str(&format!("  {k:<32} {n}\n"));
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
                       "detail": f.detail, "config": config, "replay": replay_command_with(*seed, config, self.layer_off, self.planted)})
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
            "faults": self.faults,
            "unplayedFaultKinds": self.unplayed_fault_kinds(),
            "everyProbeFired": self.coverage_failure().is_none(),
            "probesRequired": self.require_probes,
            "seedRange": self.seed_range.map(|(lo, hi)| json!({"first": lo, "last": hi})),
            "simMs": self.sim_ms,
            "wallS": self.wall_s,
            "jobs": self.jobs,
            "seedsPerS": self.seeds_per_s(),
            "seedsPerSPerCore": self.seeds_per_s_per_core(),
            "simSecondsPerWallSecond": self.sim_speedup(),
            "layerOff": self.layer_off.map(|l| l.name()),
            "planted": self.planted.map(|b| b.name()),
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
    fn a_failure_lines_replay_command_carries_the_campaigns_switches() {
        use dlock_rt::planted::Bug;
        let mut s = Summary::new(1);
        s.layer_off = Some(Layer::RailMark);
        s.planted = Some(Bug::GrantUnexpired);
        s.failures.push((
            7,
            "seed=7 scenario=revoke-mid-flight topo=lock1".to_owned(),
            crate::outcome::Failure {
                class: crate::outcome::FailureClass::Correctness,
                invariant: "no_two_live_grants_per_key",
                detail: "x".to_owned(),
            },
        ));
        let lines = s.failure_lines();
        assert_eq!(lines.len(), 1);
        assert!(
            lines[0].ends_with(
                "replay: cargo xtask sim replay --seed 7 --scenario revoke-mid-flight --layer-off rail-mark --plant grant-unexpired"
            ),
            "{}",
            lines[0]
        );
        assert!(s.render().contains("planted: bug grant-unexpired"));
        assert_eq!(replay_command_with(3, "seed=3 topo=x", None, None), "cargo xtask sim replay --seed 3");
    }

    #[test]
    fn a_fault_kind_no_seed_applied_is_reported_unplayed() {
        let mut s = Summary::new(1);
        assert_eq!(s.unplayed_fault_kinds().len(), crate::fault::KINDS.len());
        let mut o = SeedOutcome::default();
        for k in crate::fault::KINDS.iter().map(|k| k.name).filter(|k| *k != "lossy-link") {
            o.faults.insert(k, 1);
        }
        s.add(&o);
        assert_eq!(s.unplayed_fault_kinds(), vec!["lossy-link"]);
        assert!(s.render().contains("lossy-link"));
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

    fn seed_with_probes(seed: u64, probes: &[Probe]) -> SeedOutcome {
        SeedOutcome { seed, probes: probes.iter().map(|p| (*p, 1)).collect(), ..SeedOutcome::default() }
    }

    #[test]
    fn a_probe_that_never_fired_fails_a_campaign_that_requires_every_probe() {
        let mut s = Summary::new(1);
        let all_but_two: Vec<Probe> = Probe::ALL
            .iter()
            .copied()
            .filter(|p| !matches!(p, Probe::WaiterGrantedAfterWait | Probe::DriftCaughtByFence))
            .collect();
        s.add(&seed_with_probes(5, &all_but_two));
        s.add(&seed_with_probes(9, &[]));
        // Not required: reported, exit 0.
        let line = s.coverage_failure().expect("two probes never fired");
        assert_eq!(
            line,
            "coverage: 2 of 22 probes never fired across seeds 5..=9 (2 seeds): waiter_granted_after_wait, \
             drift_caught_by_fence"
        );
        assert_eq!(s.exit_code(), 0);
        assert!(s.render().contains(&line), "{}", s.render());
        assert_eq!(s.to_json()["everyProbeFired"], false);
        assert_eq!(s.to_json()["silentProbes"], json!(["waiter_granted_after_wait", "drift_caught_by_fence"]));
        // Required: the coverage exit code, in the text and the JSON.
        s.require_probes = true;
        assert_eq!(s.exit_code(), COVERAGE_EXIT_CODE);
        assert_eq!(s.to_json()["exitCode"], 3);
        assert!(s.render().contains("(required: exit 3)"), "{}", s.render());
        // A failing seed outranks the coverage gap.
        s.add(&SeedOutcome { seed: 7, failures: vec![Failure::crash("no_panic", "boom")], ..SeedOutcome::default() });
        assert_eq!(s.exit_code(), 127);
        // Once the last two fire, the campaign is clean again.
        let mut s = Summary { require_probes: true, ..Summary::new(1) };
        s.add(&seed_with_probes(1, &all_but_two));
        s.add(&seed_with_probes(2, &[Probe::WaiterGrantedAfterWait, Probe::DriftCaughtByFence]));
        assert_eq!(s.coverage_failure(), None);
        assert_eq!(s.exit_code(), 0);
        assert!(s.render().contains("coverage: every probe fired across seeds 1..=2 (2 seeds)"));
    }
}
