//! What a binary must not contain when the simulation's test-only switches are compiled out
//! (docs/simulation.md "Planted bugs", "The release build"), and how to look: shared by
//! `crates/dlock/tests/release_build.rs` (the release `dlock` binary holds none of it) and
//! `sim/tests/compiled_out_control.rs` (a `cfg(madsim)` binary holds each of it, so a
//! renamed switch cannot make the release check pass vacuously).
//!
//! Symbol markers are pieces of mangled Rust symbol names: both manglings (legacy `_ZN…` and
//! v0 `_R…`) spell a path as length-prefixed identifiers (`14dlock_contract7planted3set`), so
//! a byte search of the file finds a function or static by its path in the symbol table.
//! String markers are the switches' stable names (`--plant NAME`, `--layer-off NAME`).

#![allow(dead_code)]

/// Symbols of the switches' simulation-only parts: the setters and the per-thread state
/// they set (`dlock_contract::planted` and `dlock_contract::defence`, re-exported by
/// `dlock_rt`).
pub const SWITCH_SYMBOLS: [(&str, &str); 4] = [
    ("7planted3set", "dlock_contract::planted::set (the planted-bug setter)"),
    ("7planted5state", "dlock_contract::planted::state (the planted bug of the thread)"),
    ("7defence7set_off", "dlock_contract::defence::set_off (the defence-layer setter)"),
    ("7defence5state", "dlock_contract::defence::state (the layer switched off, the tallies)"),
];

/// Every symbol of the planted-bug module at all (its enum's `name`, `parse`, `Display`, …):
/// a release binary links none of it.
pub const PLANTED_MODULE: &str = "14dlock_contract7planted";

/// Every symbol of the defence-switch module: in a release binary each call site folds to
/// the production decision (`off` is `false`, `stops` the identity, both `#[inline]`), so
/// nothing of the module is linked either.
pub const DEFENCE_MODULE: &str = "14dlock_contract7defence";

/// A symbol every `dlock` binary has (its `main`): the control that the symbol table is
/// there to be searched (a stripped binary fails it).
pub const DLOCK_MAIN: &str = "5dlock4main";

/// A symbol of `dlock_contract` that the release binary links (the payout state machine):
/// the control that the crate the switches live in is in the binary.
pub const CONTRACT_SYMBOL: &str = "14dlock_contract6payout";

/// The stable names of the planted bugs (`Bug::name`).
pub fn bug_names() -> Vec<&'static str> {
    dlock_contract::planted::Bug::ALL.iter().map(|b| b.name()).collect()
}

/// A binary's bytes as text to search: every marker is ASCII, and ASCII bytes survive the
/// lossy conversion unchanged (std's substring search is optimised code even in a debug
/// test build).
pub fn searchable(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The markers of `markers` found in `text`.
pub fn found<'a>(text: &str, markers: impl IntoIterator<Item = &'a str>) -> Vec<&'a str> {
    markers.into_iter().filter(|m| !m.is_empty() && text.contains(m)).collect()
}
