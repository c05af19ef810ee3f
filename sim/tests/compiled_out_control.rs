//! The control of the release check (`crates/dlock/tests/release_build.rs`, docs/simulation.md
//! "Planted bugs"): a binary built with `cfg(madsim)` that plants bugs and switches layers
//! off (`dlock-sim`) holds every marker the release check must not find. If a setter, its
//! state or a bug's name were renamed, the release check would search for a name nothing
//! has and pass vacuously; this fails first.

#![cfg(madsim)]

#[path = "../../crates/dlock/tests/common/compiled_out.rs"]
mod compiled_out;

use compiled_out::{found, searchable, DEFENCE_MODULE, PLANTED_MODULE, SWITCH_SYMBOLS};

#[test]
fn a_simulation_binary_holds_every_marker_the_release_check_looks_for() {
    let bin = env!("CARGO_BIN_EXE_dlock-sim");
    let bytes = std::fs::read(bin).unwrap_or_else(|e| panic!("{bin}: {e}"));
    let text = searchable(&bytes);
    let symbols: Vec<&str> = SWITCH_SYMBOLS.iter().map(|(m, _)| *m).chain([PLANTED_MODULE, DEFENCE_MODULE]).collect();
    assert_eq!(found(&text, symbols.iter().copied()), symbols, "{bin}: a switch's symbol is missing");
    let names = compiled_out::bug_names();
    assert_eq!(found(&text, names.iter().copied()), names, "{bin}: a planted bug's name is missing");
}
