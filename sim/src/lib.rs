//! Deterministic simulation of the dlock cluster.
//!
//! A [`scenario::Scenario`] (a TOML file under `scenarios/`) names the rail's chaos knobs,
//! per-node clock skews, a list of steps (submissions, process crashes) and the invariants
//! to check. Under `RUSTFLAGS="--cfg madsim"`, every scenario plays on the one world
//! builder, `world::build`: a proxy scenario through `scenario_seed::run_proxy` (on
//! `WorldSpec::proxy_only()`), which returns a [`Report`]: the
//! event trace (the same seed gives the same trace, bit for bit) and every broken
//! invariant, each in one line.
//!
//! Invariants are checked against the rail's own call log and paydb, never against what
//! the proxy says it did.
//!
//! Swarm campaigns: [`swarm::SwarmConfig::draw`] turns a seed into a world's configuration,
//! `campaign::run_seed` plays one seed in its own madsim runtime (fault phase, liveness
//! phase, checks) into an [`outcome::SeedOutcome`], and `campaign::run_campaign` runs many on
//! worker threads into a [`summary::Summary`]. `world::build` is the one world builder.
//! `cargo xtask sim run` drives the runner binary (`src/bin/dlock-sim.rs`).
#![allow(
    clippy::disallowed_methods,
    reason = "the simulation harness drives madsim's clock directly and times its own runs on the host's clock; the seam binds service code"
)]

pub mod fault;
pub mod forger;
pub mod oracle;
pub mod outcome;
pub mod scenario;
pub mod schedule;
pub mod store_faults;
pub mod summary;
pub mod swarm;

#[cfg(madsim)]
pub mod bench;
#[cfg(madsim)]
pub mod campaign;
#[cfg(madsim)]
pub mod envelope;
#[cfg(madsim)]
pub mod faults;
#[cfg(madsim)]
pub mod scenario_seed;
#[cfg(madsim)]
pub mod shrink;
#[cfg(madsim)]
pub mod trace;
#[cfg(madsim)]
pub mod watcher;
#[cfg(madsim)]
pub mod workload;
#[cfg(madsim)]
pub mod world;

/// What a scenario run produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Report {
    /// One line per event, in order.
    pub trace: Vec<String>,
    /// One line per broken invariant or unmet step expectation.
    pub violations: Vec<String>,
}

/// Environment variable naming a directory where every scenario run writes its trace, one
/// file per scenario and seed (`{scenario}-{seed}.trace`), for diffing two runs.
pub const TRACE_DIR_ENV: &str = "DLOCK_SIM_TRACE_DIR";

impl Report {
    /// Writes the trace to `$DLOCK_SIM_TRACE_DIR/{scenario}-{seed}.trace` when that variable is
    /// set; returns the path written.
    pub fn write_trace(&self, scenario: &str, seed: u64) -> Option<std::path::PathBuf> {
        let dir = std::path::PathBuf::from(std::env::var_os(TRACE_DIR_ENV)?);
        std::fs::create_dir_all(&dir).ok()?;
        let path = dir.join(format!("{scenario}-{seed}.trace"));
        let mut text = self.trace.join("\n");
        text.push('\n');
        for v in &self.violations {
            text.push_str(&format!("VIOLATION {v}\n"));
        }
        std::fs::write(&path, text).ok()?;
        Some(path)
    }

    /// Panics with the first violation, in one line, if any.
    pub fn assert_clean(&self, seed: u64) {
        if let Some(v) = self.violations.first() {
            panic!("{v} (replay with MADSIM_TEST_SEED={seed}); trace:\n{}", self.trace.join("\n"));
        }
    }
}
