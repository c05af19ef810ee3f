//! Keeps the fuzz stage honest (`fuzz/README.md`): every libFuzzer target declared in
//! `fuzz/Cargo.toml` has its source, a committed seed corpus and a corpus replay test in the
//! owning crate, and `scripts/test.sh` builds them on the stable toolchain (no `+nightly`,
//! `--locked` against the committed `fuzz/Cargo.lock`) and runs each one for a bounded time,
//! after the normal tests and before the madsim stages.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The `[[bin]]` names of `fuzz/Cargo.toml`.
fn fuzz_targets() -> Vec<String> {
    let manifest = read("fuzz/Cargo.toml");
    let mut names = Vec::new();
    let mut in_bin = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_bin = line == "[[bin]]";
        } else if in_bin {
            if let Some(name) = line.strip_prefix("name = \"").and_then(|r| r.strip_suffix('"')) {
                names.push(name.to_owned());
            }
        }
    }
    names
}

fn crate_tests() -> String {
    let mut all = String::new();
    let crates = std::fs::read_dir(root().join("crates")).expect("crates/");
    for c in crates.filter_map(Result::ok) {
        let Ok(tests) = std::fs::read_dir(c.path().join("tests")) else { continue };
        for t in tests.filter_map(Result::ok) {
            all.push_str(&std::fs::read_to_string(t.path()).unwrap_or_default());
        }
    }
    all
}

#[test]
fn every_fuzz_target_has_a_source_a_seed_corpus_and_a_corpus_replay_test() {
    let targets = fuzz_targets();
    assert!(targets.len() >= 6, "fuzz/Cargo.toml declares only {targets:?}");
    let tests = crate_tests();
    for t in &targets {
        assert!(root().join(format!("fuzz/fuzz_targets/{t}.rs")).is_file(), "{t}: no source");
        let seeds = std::fs::read_dir(root().join(format!("fuzz/corpus/{t}")))
            .map(|d| d.filter_map(Result::ok).count())
            .unwrap_or(0);
        assert!(seeds >= 3, "{t}: {seeds} seeds in fuzz/corpus/{t}/");
        assert!(tests.contains(&format!("replay(\"{t}\"")), "{t}: no corpus replay test under crates/*/tests");
    }
    assert!(root().join("fuzz/Cargo.lock").is_file(), "fuzz/Cargo.lock is not committed");
}

#[test]
fn the_test_script_fuzzes_every_target_on_stable_between_the_tests_and_the_madsim_stages() {
    let script = read("scripts/test.sh");
    for needle in [
        "cargo build --manifest-path fuzz/Cargo.toml --locked --release --bins --target",
        "-Cpasses=sancov-module",
        "-max_total_time=\"$FUZZ_SECONDS_PER_TARGET\"",
        "FUZZ_SECONDS_PER_TARGET=\"${FUZZ_SECONDS_PER_TARGET:-",
        "DLOCK_SKIP_FUZZ",
        "\"fuzz/corpus/$t\"",
    ] {
        assert!(script.contains(needle), "scripts/test.sh lacks {needle:?}");
    }
    assert!(!script.contains("+nightly") && !script.contains("RUSTC_BOOTSTRAP"), "the fuzz stage must run on stable");
    // The targets it runs are read from fuzz/Cargo.toml's `[[bin]]` names, not listed by hand.
    assert!(script.contains("sed -n 's/^name = "), "the stage does not read the targets from fuzz/Cargo.toml");
    let pos = |needle: &str| script.find(needle).unwrap_or_else(|| panic!("scripts/test.sh lacks {needle:?}"));
    let fuzz = pos("run_stage \"fuzz\" fuzz_all");
    assert!(pos("run_stage \"tests (cargo test)\"") < fuzz, "fuzz runs before the normal tests");
    assert!(fuzz < pos("run_stage \"tests (madsim)\""), "fuzz runs after the madsim stages");
}
