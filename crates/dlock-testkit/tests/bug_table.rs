//! Keeps `docs/testing/bugs.md` ("Every bug we found") able to find every old bug: each
//! row names a reproduction, or says "none yet" outright; every test a reproduction names
//! exists (a renamed or deleted test would quietly lose the bug); every planted bug it names
//! is one `--plant` accepts; every test file, crate and script it names is there. A
//! reproduction that is a planted switch is proven to fail by the simulation's planted-bug
//! tests; one that is a test is proven by that test's own negative case.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A crate's directory by its package name.
fn crate_dir(name: &str) -> PathBuf {
    match name {
        "dlock-sim" => root().join("sim"),
        "dlock-real" => root().join("real"),
        other => root().join("crates").join(other),
    }
}

/// Every `fn NAME` in the crate's sources.
fn functions(crate_name: &str) -> Vec<String> {
    let mut files = Vec::new();
    files.extend(dlock_testkit::rust_files(&crate_dir(crate_name)));
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        for piece in text.split("fn ").skip(1) {
            let name: String = piece.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

const KINDS: [&str; 7] =
    ["**plant**", "**layer**", "**scenario**", "**seed**", "**test**", "**stage**", "**none yet**"];

/// What is wrong with the table's reproductions, one line each.
fn problems(table: &str) -> Vec<String> {
    let plants: Vec<&str> = dlock_contract::planted::Bug::ALL.iter().map(|b| b.name()).collect();
    let mut p = Vec::new();
    let mut rows = 0;
    for line in table.lines().filter(|l| l.starts_with("| [B")) {
        rows += 1;
        let cells: Vec<&str> = line.split(" | ").collect();
        let id = cells.first().map(|c| c.trim_start_matches("| ").to_owned()).unwrap_or_default();
        let Some(cell) = cells.get(4) else {
            p.push(format!("{id}: fewer than six columns"));
            continue;
        };
        if !KINDS.iter().any(|k| cell.contains(k)) {
            p.push(format!("{id}: no reproduction and no \"none yet\""));
        }
        for cmd in cell.split('`').skip(1).step_by(2) {
            let words: Vec<&str> = cmd.split_whitespace().collect();
            if let Some(i) = words.iter().position(|w| *w == "--plant") {
                match words.get(i + 1) {
                    Some(name) if plants.contains(name) => {}
                    other => p.push(format!("{id}: --plant {other:?} is no planted bug")),
                }
            }
            if let Some(script) = words.first().filter(|w| w.starts_with("scripts/")) {
                if !root().join(script).exists() {
                    p.push(format!("{id}: {script} does not exist"));
                }
            }
            let is_test = cmd.starts_with("cargo test") || cmd.starts_with("sim_test");
            if !is_test {
                continue;
            }
            let package = if cmd.starts_with("sim_test") {
                "dlock-sim"
            } else {
                words.iter().position(|w| *w == "-p").and_then(|i| words.get(i + 1)).copied().unwrap_or("")
            };
            if !crate_dir(package).join("Cargo.toml").exists() {
                p.push(format!("{id}: no crate {package:?}"));
                continue;
            }
            if let Some(file) = words.iter().position(|w| *w == "--test").and_then(|i| words.get(i + 1)) {
                if !crate_dir(package).join("tests").join(format!("{file}.rs")).exists() {
                    p.push(format!("{id}: {package} has no test file {file}.rs"));
                }
            }
            // The filter: the last word, unless it is a flag or a flag's value.
            let last = words.last().copied().unwrap_or("");
            let before = words.len().checked_sub(2).and_then(|i| words.get(i)).copied().unwrap_or("");
            let is_filter = !last.starts_with('-') && !matches!(before, "-p" | "--test") && last != "test";
            if is_filter && !functions(package).iter().any(|f| f.contains(last)) {
                p.push(format!("{id}: no test in {package} matches {last}"));
            }
        }
    }
    if rows < 6 {
        p.push(format!("only {rows} rows: the table's rows were not found"));
    }
    p
}

#[test]
fn every_reproduction_in_the_bug_table_names_what_exists() {
    let table = std::fs::read_to_string(root().join("docs/testing/bugs.md")).unwrap_or_default();
    let found = problems(&table);
    assert!(found.is_empty(), "docs/testing/bugs.md:\n{}", found.join("\n"));
}

#[test]
fn a_renamed_test_an_unknown_plant_or_a_row_without_a_reproduction_is_reported() {
    let table = std::fs::read_to_string(root().join("docs/testing/bugs.md")).unwrap_or_default();
    assert!(problems(&table).is_empty());
    let cases = [
        (
            "renamed test",
            table.replacen("a_request_whose_client_goes_away_still_runs_to_its_end", "a_request_renamed", 1),
        ),
        ("unknown plant", table.replacen("--plant skip-owner-check", "--plant skip-everything", 1)),
        ("missing test file", table.replacen("--test etcd_member_down", "--test etcd_member_gone", 1)),
        ("no reproduction", table.replacen("| **test**: `cargo test -p dlock-http", "| `cargo test -p dlock-http", 1)),
    ];
    for (what, t) in cases {
        assert_ne!(t, table, "{what}: the mutation did not apply");
        assert_eq!(problems(&t).len(), 1, "{what}: {:?}", problems(&t));
    }
}
