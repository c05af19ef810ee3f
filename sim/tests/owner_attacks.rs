//! The forger's owner attacks (docs/simulation.md "The forger", C3-extensions E-9 "Owner
//! binding"): at the end of every swarm seed the forger, under a credential bound to
//! `owners=forger/*`, addresses a session and a grant its victim (bound to
//! `owners=forger-victim/*`) holds on a lock replica: a heartbeat, an acquire through the
//! victim's session, a renew, a rotate, a release with a made-up session id and the victim's
//! token, a close. With nothing planted each is refused `403 FORBIDDEN` and the seed is
//! clean; the planted `skip-owner-check` is found by the same invariant
//! (`owner_attack_refused`) in `sim/tests/planted.rs`.

#![cfg(madsim)]

use dlock_sim::campaign::{self, RunOptions};
use dlock_sim::forger::OwnerAttack;

/// Seeds each test plays (the first ones of the default campaign).
const SEEDS: [u64; 4] = [1, 2, 3, 4];

/// The forger's owner-attack lines of a seed's full trace, in order.
fn attack_lines(trace: &[String]) -> Vec<&str> {
    trace.iter().map(String::as_str).filter(|l| l.starts_with("forger: owner attack ")).collect()
}

fn full_trace() -> RunOptions {
    RunOptions { full_trace: true, ..RunOptions::default() }
}

#[test]
fn every_owner_attack_of_the_forger_is_refused_forbidden_and_the_seed_is_clean() {
    let outcomes = std::sync::Mutex::new(Vec::new());
    campaign::for_each_seed(&SEEDS, 2, &|seed| {
        let o = campaign::run_seed(seed, &full_trace());
        if let Ok(mut v) = outcomes.lock() {
            v.push(o);
        }
    });
    let mut outcomes = outcomes.into_inner().unwrap_or_else(|e| e.into_inner());
    outcomes.sort_by_key(|o| o.seed);
    let mut refused_everywhere = 0;
    for o in &outcomes {
        let seed = o.seed;
        assert!(o.failures.is_empty(), "seed {seed}: {:?}", o.failures);
        let lines = attack_lines(&o.trace);
        // A victim setup that got no grant sends nothing; one that did sends every attack,
        // in order, each refused (or, under a fault, not decided).
        if lines.is_empty() {
            continue;
        }
        assert_eq!(lines.len(), OwnerAttack::ALL.len(), "seed {seed}: {lines:?}");
        for (line, attack) in lines.iter().zip(OwnerAttack::ALL) {
            let named = format!("forger: owner attack {} on forger-victim:", attack.name());
            assert!(line.starts_with(&named), "seed {seed}: {line} is not the {} attack", attack.name());
        }
        if lines.iter().all(|l| l.ends_with("-> 403 FORBIDDEN")) {
            refused_everywhere += 1;
        }
    }
    assert_eq!(outcomes.len(), SEEDS.len());
    assert!(refused_everywhere > 0, "no seed of {SEEDS:?} had every owner attack refused 403 FORBIDDEN");
}

#[test]
fn the_forgers_owner_attacks_replay_bit_for_bit() {
    let (a, b) = (campaign::run_seed(SEEDS[0], &full_trace()), campaign::run_seed(SEEDS[0], &full_trace()));
    assert_eq!(attack_lines(&a.trace), attack_lines(&b.trace));
    assert_eq!(a.failures, b.failures);
}
