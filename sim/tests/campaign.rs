//! The swarm campaign `cargo test` runs under the simulation cfg: [`DEFAULT_SEEDS`] seeds in
//! an optimised build (`--profile sim`, as scripts/test.sh runs it; 100 in an unoptimised
//! one) (`DLOCK_SIM_SEEDS` raises or lowers it; `DLOCK_SIM_START` moves the range; `DLOCK_SIM_JOBS`
//! sets the worker threads, default the machine's cores), each drawing its own world
//! ([`dlock_sim::swarm::SwarmConfig`]), with zero failures expected. Prints the summary
//! (failures by class and invariant, probe counts, seeds/s, simulated s per wall s).

#![cfg(madsim)]

use dlock_sim::campaign::{self, RunOptions};
use dlock_sim::summary;

/// Seeds of the default campaign in an optimised build (`--profile sim`, as
/// scripts/test.sh runs it), sized to fit the simulation stage's budget on 2 cores; see
/// docs/simulation.md "Speed".
const DEFAULT_SEEDS: u64 = 2_000;
/// Seeds of the default campaign in an unoptimised build (`dev`), about 5x slower per seed.
const DEFAULT_SEEDS_UNOPTIMISED: u64 = 100;
/// Default first seed (a fixed range: the default campaign is the same on every run).
const DEFAULT_START: u64 = 1;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

#[test]
fn a_swarm_campaign_of_drawn_worlds_finds_no_failure() {
    let optimised = env!("DLOCK_SIM_OPT_LEVEL") != "0";
    if !optimised && env("DLOCK_SIM_SEEDS").is_none() {
        eprintln!(
            "dlock-sim campaign: unoptimised build, {DEFAULT_SEEDS_UNOPTIMISED} seeds by default \
             ({DEFAULT_SEEDS} under `--profile sim`; DLOCK_SIM_SEEDS sets it)"
        );
    }
    let default = if optimised { DEFAULT_SEEDS } else { DEFAULT_SEEDS_UNOPTIMISED };
    let count = env("DLOCK_SIM_SEEDS").unwrap_or(default);
    let start = env("DLOCK_SIM_START").unwrap_or(DEFAULT_START);
    let jobs = env("DLOCK_SIM_JOBS")
        .map(|j| j as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    let seeds = summary::seeds(start, count, None);
    eprintln!("dlock-sim campaign: seeds {start}..{} on {jobs} jobs", start + count);
    let step = (seeds.len() / 20).max(1);
    let s = campaign::run_campaign(&seeds, jobs, &RunOptions::default(), &|done, total, o| {
        for f in &o.failures {
            eprintln!("{}  [{}]", f.line(o.seed), o.config);
        }
        if done % step == 0 || done == total {
            eprintln!("dlock-sim campaign: {done}/{total}");
        }
    });
    eprintln!("{}", s.render());
    assert_eq!(s.seeds_run as usize, seeds.len());
    assert_eq!(s.exit_code(), 0, "{}", s.failure_lines().join("\n"));
    // Every fault kind the swarm can draw was played somewhere in the default set.
    let unplayed = s.unplayed_fault_kinds();
    assert!(unplayed.is_empty(), "fault kinds no seed of {start}..{} applied: {unplayed:?}", start + count);
}

/// A seed replays bit for bit: the same configuration, failures, probe counts and trace.
#[test]
fn a_swarm_seed_replays_the_same_outcome() {
    let opts = RunOptions { full_trace: true, ..RunOptions::default() };
    for seed in [7, 11] {
        let (a, b) = (campaign::run_seed(seed, &opts), campaign::run_seed(seed, &opts));
        assert_eq!(a.config, b.config);
        assert_eq!(a.failures, b.failures);
        assert_eq!(a.probes, b.probes);
        assert_eq!(a.sim_ms, b.sim_ms);
        assert_eq!(a.trace, b.trace);
        assert!(a.trace.len() > 2, "{:?}", a.trace);
    }
}
