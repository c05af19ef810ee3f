//! The clock envelope's short form (`dlock-sim envelope`; the long form and its table are in
//! docs/simulation.md, "The clock envelope"): a few seeds of the rows that carry its
//! promises, and one row beyond the holders' bound that must break one, so the sweep is
//! shown able to fail.

#![cfg(madsim)]

use dlock_sim::envelope::{self, Class, Row};

#[test]
fn clock_steps_and_rates_within_the_bound_break_no_promise_and_rates_beyond_it_are_seen() {
    let seeds: Vec<u64> = (1..=8).collect();
    let rows = [
        Row::Rates { rho_percent: 0 },
        Row::Rates { rho_percent: 30 },
        Row::Steps { class: Class::LockReplicas, step_ms: 3_600_000 },
        Row::Steps { class: Class::Executors, step_ms: 3_600_000 },
        Row::Rates { rho_percent: 60 },
    ];
    let jobs = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let table = envelope::sweep(&rows, &seeds, jobs, &|_, _| {});
    eprintln!("{}", envelope::render(&table, &seeds));
    for (row, cell) in &table[..4] {
        assert_eq!(row.broken_promises(cell), Vec::<String>::new());
        assert_eq!((cell.seeds, cell.other), (8, 0), "{}", row.label());
    }
    let (beyond, cell) = &table[4];
    assert!(cell.beliefs > 0, "{}: no two holders believed at once: {cell:?}", beyond.label());
    assert!(cell.server > 0, "{}: no lease ended early: {cell:?}", beyond.label());
    assert_eq!(cell.money, 0, "the fences keep the money whatever the clocks");
}
