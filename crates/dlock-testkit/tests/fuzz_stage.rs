//! Keeps the fuzz stage honest (`fuzz/README.md`): every libFuzzer target declared in
//! `fuzz/Cargo.toml` has its source, a committed seed corpus and a corpus replay test in the
//! owning crate, and `scripts/test.sh` builds them on the stable toolchain (no `+nightly`,
//! `--locked` against the committed `fuzz/Cargo.lock`) and runs each one for a bounded time,
//! after the normal tests and before the madsim stages; and that the cheaper profile of the
//! fuzz build's third-party dependencies keeps every check and leaves dlock's code optimised
//! with line tables (requirement DL-265).

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

/// The problems of the fuzz build's release profile (`fuzz/Cargo.toml`) for `path_packages`
/// (dlock's own crates, the code under test): debug assertions and overflow checks must be
/// on for every package, line tables at least for dlock's crates and the targets, and the
/// cheaper profile of the third-party dependencies (`package."*"`) must not reach dlock's
/// crates (they are path dependencies outside the fuzz workspace, which `"*"` matches).
fn fuzz_profile_problems(manifest: &toml::Table, path_packages: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    let empty = toml::Table::new();
    let release = manifest.get("profile").and_then(|p| p.get("release")).and_then(|r| r.as_table()).unwrap_or(&empty);
    let packages = release.get("package").and_then(|p| p.as_table()).unwrap_or(&empty);
    let has_line_tables = |t: &toml::Table| match t.get("debug") {
        None => false,
        Some(toml::Value::Boolean(b)) => *b,
        Some(toml::Value::Integer(i)) => *i > 0,
        Some(toml::Value::String(s)) => s != "none",
        Some(_) => false,
    };
    for key in ["debug-assertions", "overflow-checks"] {
        if release.get(key) != Some(&toml::Value::Boolean(true)) {
            problems.push(format!("[profile.release] lacks {key} = true"));
        }
        for (name, p) in packages {
            if p.get(key) == Some(&toml::Value::Boolean(false)) {
                problems.push(format!("package {name} turns {key} off"));
            }
        }
    }
    if !has_line_tables(release) {
        problems.push("[profile.release] has no line tables: a crash's stack trace has no lines".to_owned());
    }
    if let Some(all) = packages.get("*").and_then(|p| p.as_table()) {
        let lowered = all.get("opt-level").is_some_and(|o| o != &toml::Value::Integer(3)) || all.contains_key("debug");
        for name in path_packages.iter().filter(|_| lowered) {
            match packages.get(name).and_then(|p| p.as_table()) {
                Some(p) if p.get("opt-level") == Some(&toml::Value::Integer(3)) && has_line_tables(p) => {}
                _ => problems.push(format!(
                    "{name}: under the dependencies' cheaper profile (needs opt-level 3 and line tables)"
                )),
            }
        }
    }
    problems
}

/// dlock's own crates in the fuzz build: the path packages (no `source`) of `fuzz/Cargo.lock`.
fn fuzz_path_packages() -> Vec<String> {
    let lock: toml::Table = read("fuzz/Cargo.lock").parse().expect("fuzz/Cargo.lock");
    lock.get("package")
        .and_then(|p| p.as_array())
        .expect("[[package]]")
        .iter()
        .filter(|p| p.get("source").is_none())
        .filter_map(|p| p.get("name").and_then(|n| n.as_str()).map(str::to_owned))
        .filter(|n| n != "dlock-fuzz")
        .collect()
}

#[test]
fn the_fuzz_build_keeps_dlocks_code_optimised_with_line_tables_and_every_crate_checked() {
    let manifest: toml::Table = read("fuzz/Cargo.toml").parse().expect("fuzz/Cargo.toml");
    let path_packages = fuzz_path_packages();
    assert!(path_packages.iter().any(|p| p == "dlock-contract"), "fuzz/Cargo.lock: {path_packages:?}");
    assert_eq!(fuzz_profile_problems(&manifest, &path_packages), Vec::<String>::new());
    // Planted: a new dlock crate in the fuzz build without its override; line tables off;
    // overflow checks off for the dependencies.
    let real = read("fuzz/Cargo.toml");
    let edit = |from: &str, to: &str| {
        assert!(real.contains(from), "fuzz/Cargo.toml lacks {from:?}");
        real.replacen(from, to, 1)
    };
    let with_new = path_packages.iter().cloned().chain(["dlock-new".to_owned()]).collect::<Vec<_>>();
    let planted = [
        (real.clone(), with_new, "dlock-new: under"),
        (
            edit("debug = \"line-tables-only\"\ndebug-assertions", "debug = 0\ndebug-assertions"),
            path_packages.clone(),
            "no line tables",
        ),
        (
            edit("[profile.release.package.\"*\"]\n", "[profile.release.package.\"*\"]\noverflow-checks = false\n"),
            path_packages.clone(),
            "turns overflow-checks off",
        ),
    ];
    for (text, packages, want) in planted {
        let m: toml::Table = text.parse().expect("planted manifest");
        let problems = fuzz_profile_problems(&m, &packages);
        assert!(problems.iter().any(|p| p.contains(want)), "planted {want:?} not caught: {problems:?}");
    }
}
