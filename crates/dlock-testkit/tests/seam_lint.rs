//! The seam is enforced by clippy (issue 36 §5): the workspace's `clippy.toml` refuses the
//! calls that must go through `dlock-rt` (`disallowed-methods`), and clippy runs with
//! `-D warnings` in both cfgs. This test holds the configuration to the seam's list, and
//! every exception to its rule: an `allow(clippy::disallowed_methods)` carries a reason, and
//! sits in `dlock-rt`, in a test or bench file, in the simulation harness, or in a unit-test
//! module of a service (never in service code). A checker fed a planted exception proves
//! it can fail.

use std::path::{Path, PathBuf};

/// Every path the seam routes through `dlock-rt` (the list, with the sockets and
/// tasks the rule also covers).
const SEAM: [&str; 14] = [
    "std::time::SystemTime::now",
    "std::time::Instant::now",
    "std::thread::spawn",
    "tokio::time::sleep",
    "tokio::time::sleep_until",
    "tokio::time::timeout",
    "tokio::time::interval",
    "tokio::time::Instant::now",
    "tokio::spawn",
    "rand::thread_rng",
    "tokio::net::TcpListener::bind",
    "tokio::net::TcpStream::connect",
    "std::net::TcpListener::bind",
    "hyper::server::conn::http1::Builder::serve_connection",
];

const ALLOW: &str = "allow(clippy::disallowed_methods";

/// Whether `line` is an `allow` attribute of the lint (inner or outer).
fn is_exception(line: &str) -> bool {
    let l = line.trim_start();
    (l.starts_with("#[") || l.starts_with("#![")) && l.contains(ALLOW)
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `disallowed-methods` paths of a `clippy.toml`.
fn disallowed(clippy_toml: &str) -> Result<Vec<String>, String> {
    let t: toml::Table = toml::from_str(clippy_toml).map_err(|e| e.to_string())?;
    let list = t.get("disallowed-methods").and_then(toml::Value::as_array).ok_or("no disallowed-methods")?;
    list.iter()
        .map(|v| {
            let path = v.get("path").and_then(toml::Value::as_str).ok_or("an entry without a path")?;
            v.get("reason").and_then(toml::Value::as_str).ok_or_else(|| format!("{path} has no reason"))?;
            Ok(path.to_owned())
        })
        .collect()
}

/// Whether a file at `rel` (relative to the workspace root) may hold an exception.
fn exempt_place(rel: &str) -> bool {
    rel.starts_with("crates/dlock-rt/")
        || rel.starts_with("sim/")
        || rel.starts_with("xtask/")
        || rel.contains("/tests/")
        || rel.contains("/benches/")
}

/// The exceptions in `text` (a file at `rel`) that break the rule, as `rel:line: why`.
fn bad_exceptions(rel: &str, text: &str) -> Vec<String> {
    let mut bad = Vec::new();
    // Where the file's unit-test module starts (`#[cfg(test)]`), if it has one.
    let tests_from = text.lines().position(|l| l.trim() == "#[cfg(test)]");
    for (i, line) in text.lines().enumerate() {
        if !is_exception(line) {
            continue;
        }
        if !line.contains("reason =") {
            bad.push(format!("{rel}:{}: an exception without a reason", i + 1));
        } else if !exempt_place(rel) && tests_from.is_none_or(|t| i <= t) {
            bad.push(format!("{rel}:{}: an exception in service code", i + 1));
        }
    }
    bad
}

#[test]
fn clippy_refuses_every_call_the_seam_routes_through_dlock_rt() {
    let text = std::fs::read_to_string(root().join("clippy.toml")).expect("clippy.toml");
    let listed = disallowed(&text).expect("clippy.toml reads");
    for path in SEAM {
        assert!(listed.iter().any(|p| p == path), "clippy.toml does not refuse {path}");
    }
    // The checker itself: an entry without its reason is refused.
    assert!(disallowed("disallowed-methods = [{ path = \"std::thread::spawn\" }]").is_err());
}

#[test]
fn every_exception_to_the_seam_has_a_reason_and_sits_outside_service_code() {
    let root = root();
    let mut files = Vec::new();
    for dir in ["crates", "sim", "xtask"] {
        files.extend(dlock_testkit::rust_files(&root.join(dir)));
    }
    assert!(files.len() > 100, "found only {} Rust files under {}", files.len(), root.display());
    let mut bad = Vec::new();
    let mut exceptions = 0;
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let rel = f.strip_prefix(&root).unwrap_or(f).display().to_string();
        exceptions += text.lines().filter(|l| is_exception(l)).count();
        bad.extend(bad_exceptions(&rel, &text));
    }
    assert!(bad.is_empty(), "exceptions to the seam that break its rule:\n{}", bad.join("\n"));
    assert!(exceptions >= 1, "dlock-rt's own exception was not found");
    // Planted: an exception in service code, and one without a reason, are each found.
    let planted = "#![allow(clippy::disallowed_methods, reason = \"x\")]\nfn main() {}\n";
    assert_eq!(bad_exceptions("crates/dlock-executor/src/worker.rs", planted).len(), 1);
    assert_eq!(bad_exceptions("crates/dlock/tests/x.rs", "#[allow(clippy::disallowed_methods)]\n").len(), 1);
    let in_unit_tests =
        "fn a() {}\n#[cfg(test)]\nmod tests {\n#[allow(clippy::disallowed_methods, reason = \"r\")]\n}\n";
    assert!(bad_exceptions("crates/dlock-http/src/lib.rs", in_unit_tests).is_empty());
}
