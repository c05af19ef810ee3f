//! The clock envelope (issue 35 part 5): what dlock guarantees under clock faults,
//! measured by a simulation sweep rather than argued (`dlock-sim envelope`, the table in
//! docs/simulation.md "The clock envelope").
//!
//! Each [`Row`] imposes one clock condition on every seed of the sweep, over the swarm's
//! own draw (topology, backend, workload, every other fault) with its drawn clock faults
//! removed (no drift or skew events, no drawn drifted executor):
//! - **rates:** a rate difference ρ between the judges and the holders, the direction that
//!   hurts: every lock replica's clock runs at `1 + ρ/2` (it ends leases early) and every
//!   executor's at `1 − ρ/2` (it believes its lease long), for the whole fault phase;
//! - **steps:** every node of one class (lock replicas, or executors) steps its wall clock
//!   by `±X` (sign drawn per node) once at a drawn instant of the fault phase.
//!
//! A database host's wall clock is not simulated: no decision reads it (lockdb's clock,
//! C1 §1.4.2); `crates/dlock/tests/faketime_sql.rs` steps a real PostgreSQL host's.
//!
//! The columns, per row, from the oracle of each seed ([`crate::oracle::calls::ClockTally`]
//! and the failures):
//! - **server exclusion:** seeds in which the store ended a lease or a session early in
//!   true time (`no_two_live_grants_per_key`, `lock_delay_honoured`,
//!   `heartbeat_keeps_its_session_live`, failed or excused only by a fast judge's rate);
//! - **belief exclusion:** seeds in which two holders believed they held one key at once
//!   (`no_two_believing_holders`, failed or excused only by rates);
//! - **longest takeover delay:** the longest an acquire was still refused after everything
//!   that might hold its key had run its ttl and lock-delay in true time;
//! - **money:** seeds that paid a payout twice or unbalanced the ledger, with the fences on,
//!   and with both fences planted off (`fencing-off-both`).
//!
//! Invariants of this module: a row changes only clock events; a seed plays the same world
//! in every row (the same draw), so rows differ by their clocks alone; the sweep is
//! deterministic (seeds and rows in order, each seed replayable with `--seed`).

use std::fmt::Write as _;

use dlock_rt::rand::Rng;

use crate::campaign::{self, RunOptions};
use crate::outcome::{FailureClass, SeedOutcome};
use crate::schedule::{Fault, Timed};
use crate::swarm::SwarmConfig;

/// Seeds per row when `--seeds` is absent (the short form CI runs; the published table
/// uses more, see docs/simulation.md).
pub const ENVELOPE_SEEDS_DEFAULT: u64 = 40;

/// Rate differences ρ of the rate rows, in percent: the issue's, and two beyond the
/// holders' bound to show where it breaks.
pub const RATE_ROWS_PERCENT: [u32; 8] = [0, 1, 5, 10, 20, 30, 40, 60];
/// Wall-clock steps of the step rows, in ms: 1 s, 1 min, 1 h.
pub const STEP_ROWS_MS: [i64; 3] = [1_000, 60_000, 3_600_000];

/// The node class a step row steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    LockReplicas,
    Executors,
}

impl Class {
    fn name(self) -> &'static str {
        match self {
            Class::LockReplicas => "lock replicas",
            Class::Executors => "executors",
        }
    }

    fn nodes(self, cfg: &SwarmConfig) -> Vec<String> {
        match self {
            Class::LockReplicas => (1..=cfg.lock_replicas).map(|i| format!("lock-{i}")).collect(),
            Class::Executors => (1..=cfg.executors.len()).map(|i| format!("executor-{i}")).collect(),
        }
    }
}

/// One clock condition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Row {
    /// Judges at `1 + ρ/2`, holders at `1 − ρ/2` (ρ in percent).
    Rates { rho_percent: u32 },
    /// Every node of `class` steps its wall clock by ±`step_ms` once.
    Steps { class: Class, step_ms: i64 },
}

impl Row {
    /// Every row of the table, in its order.
    pub fn all() -> Vec<Row> {
        let mut rows: Vec<Row> = RATE_ROWS_PERCENT.iter().map(|r| Row::Rates { rho_percent: *r }).collect();
        for class in [Class::LockReplicas, Class::Executors] {
            rows.extend(STEP_ROWS_MS.iter().map(|s| Row::Steps { class, step_ms: *s }));
        }
        rows
    }

    /// The row's label in the table.
    pub fn label(&self) -> String {
        match self {
            Row::Rates { rho_percent } => format!("rates differ by {rho_percent} %"),
            Row::Steps { class, step_ms } => format!("{} step ±{}", class.name(), human(*step_ms)),
        }
    }

    /// `seed`'s swarm draw under this row's clocks (the drawn clock faults removed).
    pub fn config(&self, seed: u64) -> SwarmConfig {
        let mut cfg = SwarmConfig::draw(seed);
        cfg.faults.set("drift", 0.0);
        cfg.faults.set("skew", 0.0);
        cfg.drifted_executor = None;
        let at = Timed::fault;
        cfg.clock_events = match *self {
            Row::Rates { rho_percent } => {
                let half = f64::from(rho_percent) / 200.0;
                let judges = Class::LockReplicas.nodes(&cfg).into_iter();
                let holders = Class::Executors.nodes(&cfg).into_iter();
                judges
                    .map(|node| at(0, Fault::DriftClock { node, rate: 1.0 + half }))
                    .chain(holders.map(|node| at(0, Fault::DriftClock { node, rate: 1.0 - half })))
                    .collect()
            }
            Row::Steps { class, step_ms } => {
                // Drawn from the seed apart from the runtime's stream: the world plays the
                // same draw in every row.
                let mut rng = dlock_rt::rand::seeded(seed ^ 0x5eed_c10c);
                let span = cfg.fault_ms.max(1);
                class
                    .nodes(&cfg)
                    .into_iter()
                    .map(|node| {
                        let ms = if rng.gen_bool(0.5) { step_ms } else { -step_ms };
                        at(rng.gen_range(0..span), Fault::SkewClock { node, ms })
                    })
                    .collect()
            }
        };
        cfg
    }
}

fn human(ms: i64) -> String {
    match ms {
        3_600_000 => "1 h".to_owned(),
        60_000 => "1 min".to_owned(),
        1_000 => "1 s".to_owned(),
        ms => format!("{ms} ms"),
    }
}

/// Server-side invariants: the store ended a lease or a session early in true time.
const SERVER: [&str; 3] = ["no_two_live_grants_per_key", "lock_delay_honoured", "heartbeat_keeps_its_session_live"];
/// Money: a payout paid twice, or the ledger unbalanced.
const MONEY: [&str; 4] = [
    "at_most_one_rail_call_per_payout",
    "balance_equals_ledger_sum",
    "debits_equal_credits",
    "no_negative_available_balance",
];

fn breaks(o: &SeedOutcome, ids: &[&str]) -> bool {
    o.failures.iter().any(|f| f.class == FailureClass::Correctness && ids.contains(&f.invariant))
}

/// One row's measurements over its seeds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cell {
    pub seeds: u64,
    /// Seeds whose store ended a lease or session early in true time (failed, or excused
    /// only by a fast judge's rate).
    pub server: u64,
    /// Seeds with two believing holders (failed, or excused only by rates).
    pub beliefs: u64,
    /// The longest takeover delay over the seeds, ms.
    pub longest_takeover_ms: u64,
    /// Seeds that lost money with the fences on.
    pub money: u64,
    /// Seeds that lost money with both fences off.
    pub money_fences_off: u64,
    /// Seeds in which a stale writer's write was accepted with both fences off (what the
    /// fences stop; the duplicate guard and the state checks still keep the money).
    pub stale_accepted_fences_off: u64,
    /// Seeds with any other correctness, liveness or crash failure (with the fences on).
    pub other: u64,
}

impl Cell {
    fn add(&mut self, on: &SeedOutcome, off: &SeedOutcome) {
        self.seeds += 1;
        self.server += u64::from(breaks(on, &SERVER) || on.clock.excused_by_rate > 0);
        self.beliefs += u64::from(breaks(on, &["no_two_believing_holders"]) || on.clock.beliefs_excused_by_rate > 0);
        self.longest_takeover_ms = self.longest_takeover_ms.max(on.clock.longest_takeover_ms);
        self.money += u64::from(breaks(on, &MONEY));
        self.money_fences_off += u64::from(breaks(off, &MONEY));
        self.stale_accepted_fences_off += u64::from(breaks(off, &["fence_accepts_only_rising_tokens"]));
        let known = |name: &str| SERVER.contains(&name) || MONEY.contains(&name) || name == "no_two_believing_holders";
        self.other += u64::from(on.failures.iter().any(|f| !known(f.invariant)));
    }
}

/// The holders' bound: beliefs stay exclusive while the judges' and the holders' rates
/// differ by at most this (percent, in the rows' direction: `1 − ρ/2 ≥ (1 − m)(1 + ρ/2)`
/// for the lock client's margin `m` = 0.3 gives ρ ≤ 35.3 %).
pub const BELIEF_BOUND_PERCENT: u32 = 35;

impl Row {
    /// What dlock promises under this row, broken by `c`: money is never lost with the
    /// fences on; within the holders' bound no two holders believe at once; and a wall-clock
    /// step, or equal rates, never ends a lease early at the server.
    pub fn broken_promises(&self, c: &Cell) -> Vec<String> {
        let mut broken = Vec::new();
        if c.money > 0 {
            broken.push(format!("{}: money lost with the fences on in {} seeds", self.label(), c.money));
        }
        let (within, steady) = match self {
            Row::Rates { rho_percent } => (*rho_percent <= BELIEF_BOUND_PERCENT, *rho_percent == 0),
            Row::Steps { .. } => (true, true),
        };
        if within && c.beliefs > 0 {
            broken.push(format!("{}: two holders believed at once in {} seeds", self.label(), c.beliefs));
        }
        if steady && c.server > 0 {
            broken.push(format!("{}: a lease or session ended early in {} seeds", self.label(), c.server));
        }
        broken
    }
}

/// Runs every row over `seeds` on `jobs` threads: each seed twice per row (fences on, and
/// both fences planted off). `progress(row, cell)` after each row.
pub fn sweep(rows: &[Row], seeds: &[u64], jobs: usize, progress: &dyn Fn(&Row, &Cell)) -> Vec<(Row, Cell)> {
    let off = RunOptions { planted: Some(dlock_rt::planted::Bug::FencingOffBoth), ..RunOptions::default() };
    let on = RunOptions::default();
    rows.iter()
        .map(|row| {
            let pairs = std::sync::Mutex::new(Vec::new());
            campaign::for_each_seed(seeds, jobs, &|seed| {
                let a = campaign::run_config(row.config(seed), &on);
                let b = campaign::run_config(row.config(seed), &off);
                if let Ok(mut p) = pairs.lock() {
                    p.push((seed, a, b));
                }
            });
            let mut pairs = pairs.into_inner().unwrap_or_else(|e| e.into_inner());
            pairs.sort_by_key(|(seed, ..)| *seed);
            let mut cell = Cell::default();
            for (_, a, b) in &pairs {
                cell.add(a, b);
            }
            progress(row, &cell);
            (*row, cell)
        })
        .collect()
}

/// The table, in Markdown.
pub fn render(table: &[(Row, Cell)], seeds: &[u64]) -> String {
    let range = match (seeds.first(), seeds.last()) {
        (Some(a), Some(b)) => format!("seeds {a}..={b}"),
        _ => "no seeds".to_owned(),
    };
    let mut out = format!(
        "| clocks ({range}, each row) | server: a lease or session ended early | holders: two believed at once | \
         longest takeover delay | money lost (fences on) | fences off: stale write accepted | fences off: money \
         lost | other failures |\n\
         |---|---|---|---|---|---|---|---|\n"
    );
    for (row, c) in table {
        let _ = writeln!(
            out,
            "| {} | {} of {} | {} of {} | {} ms | {} of {} | {} of {} | {} of {} | {} |",
            row.label(),
            c.server,
            c.seeds,
            c.beliefs,
            c.seeds,
            c.longest_takeover_ms,
            c.money,
            c.seeds,
            c.stale_accepted_fences_off,
            c.seeds,
            c.money_fences_off,
            c.seeds,
            c.other
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Event;

    /// A row changes only the clocks: the same draw otherwise, its clock events on the
    /// nodes it names, and no drawn clock fault left.
    #[test]
    fn a_row_imposes_its_clocks_on_the_seeds_draw_and_nothing_else() {
        for row in Row::all() {
            let (drawn, cfg) = (SwarmConfig::draw(7), row.config(7));
            assert_eq!(
                (cfg.executors.clone(), cfg.backend, cfg.payouts),
                (drawn.executors, drawn.backend, drawn.payouts)
            );
            assert_eq!((cfg.faults.get("drift"), cfg.faults.get("skew"), cfg.drifted_executor), (0.0, 0.0, None));
            assert!(!cfg.clock_events.is_empty(), "{}", row.label());
            assert_eq!(cfg.clock_events, row.config(7).clock_events, "deterministic");
            for e in &cfg.clock_events {
                match (&row, &e.event) {
                    (Row::Rates { rho_percent }, Event::Fault(Fault::DriftClock { node, rate })) => {
                        let half = f64::from(*rho_percent) / 200.0;
                        let want = if node.starts_with("lock-") { 1.0 + half } else { 1.0 - half };
                        assert!((rate - want).abs() < 1e-9, "{node} at {rate}");
                    }
                    (Row::Steps { class, step_ms }, Event::Fault(Fault::SkewClock { node, ms })) => {
                        assert!(class.nodes(&cfg).contains(node) && ms.abs() == *step_ms);
                        assert!(e.at_ms < cfg.fault_ms);
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }

    #[test]
    fn the_table_has_a_line_per_row() {
        let table: Vec<(Row, Cell)> =
            Row::all().into_iter().map(|r| (r, Cell { seeds: 3, ..Cell::default() })).collect();
        let text = render(&table, &[1, 2, 3]);
        assert_eq!(text.lines().count(), 2 + Row::all().len());
        assert!(text.contains("| rates differ by 20 % | 0 of 3 |"), "{text}");
        assert!(text.contains("| executors step ±1 h |"), "{text}");
    }
}
