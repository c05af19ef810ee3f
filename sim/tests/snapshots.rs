//! Every shipped scenario's incident trace is an `insta` snapshot (docs/simulation.md
//! "Snapshots"): a change in what dlock does under a scenario shows up as a reviewable diff of
//! `sim/tests/snapshots/NAME.snap`, and the check fails on a change nobody accepted.
//!
//! What a snapshot holds, for one seed ([`SNAPSHOT_SEED`]) of each file in `scenarios/`:
//! - the incident trace of `campaign::run_seed_traced` (the path of `dlock-sim replay
//!   --scenario NAME --trace FILE`), projected to one readable line per event by [`project`]:
//!   `t_ms node kind field=value ...`, in the trace's own order, every field of every kind
//!   kept (kinds this file does not know too), with these changes only:
//!   - `seq` is left out (it is the line number);
//!   - `mono_ms` and `wall_ms` are shown only where the node's clocks differ from the
//!     reference (`mono=` when the node's monotonic clock drifted, `wall=+N` for a wall
//!     clock stepped N ms);
//!   - an absolute wall reading (a field named `*_ms` holding at least [`WALL_MS_MIN`], Unix
//!     ms) is shown relative to the trace's wall origin (`trace_start`'s `wall_ms`), signed;
//!   - a UUID value is shortened to its first [`UUID_PREFIX_LEN`] hex digits (the projection
//!     fails if two ids of one trace share a prefix);
//!   - a session's heartbeats are left out: its first `session` line (opened) is kept, the
//!     later ones (each renewal of its expiry) are not; `trace_end`'s `events` still counts
//!     them, so a change in the heartbeats still changes the snapshot;
//! - for a proxy-only scenario (`nodes = ["rail-stub", "rail-proxy"]`), whose incident trace
//!   is only its start and end, the proxy world's own run trace (`SeedOutcome::trace`: the
//!   steps and their answers, the rail's log, paydb's intent rows, the faults);
//! - the probes the seed fired.
//!
//! Invariants of this file: nothing in a snapshot is sorted or dropped beyond the list above;
//! the same seed gives the same snapshot (the trace is deterministic, `sim/tests/trace.rs`);
//! every `.snap` under `sim/tests/snapshots/` belongs to a shipped scenario and every shipped
//! scenario has one (insta fails a missing snapshot unless told to write it).
//!
//! CI runs this with `INSTA_UPDATE=no` (scripts/test.sh): a changed or missing snapshot fails.
//! A developer accepts a change with `INSTA_UPDATE=always` (or `cargo insta review`).
//! `a_changed_missing_or_orphaned_snapshot_fails_the_check_under_ci_settings` proves the check
//! can fail: it runs the check in a child process against snapshots in a temporary directory.

#![cfg(madsim)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use dlock_sim::campaign::{self, RunOptions};
use dlock_sim::scenario;
use serde_json::Value;

/// The one seed each scenario's snapshot is taken of.
const SNAPSHOT_SEED: u64 = 1;

/// A `*_ms` field at or above this is an absolute Unix-ms wall reading (2001 on), shown
/// relative to the trace's wall origin; below it, a simulated duration or instant.
const WALL_MS_MIN: i64 = 1_000_000_000_000;

/// Hex digits a UUID keeps in the projection.
const UUID_PREFIX_LEN: usize = 8;

/// Points the check at another snapshot directory (the failure proof's child process).
const SNAPSHOT_DIR_ENV: &str = "DLOCK_SNAPSHOT_DIR";

/// Restricts the check to one scenario (the failure proof's child process).
const SNAPSHOT_ONLY_ENV: &str = "DLOCK_SNAPSHOT_ONLY";

/// The scenario the failure proof plays (a world scenario with grants, a revoke and a
/// fenced-out post).
const PROOF_SCENARIO: &str = "revoke-mid-flight";

/// The name of the check, as the failure proof's child process runs it.
const CHECK_TEST_NAME: &str = "every_shipped_scenario_matches_its_snapshot";

/// The six fixed fields every trace line starts with (`trace::REQUIRED_FIELDS`).
const FIXED_FIELDS: [&str; 6] = dlock_sim::trace::REQUIRED_FIELDS;

fn committed_snapshot_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/snapshots")
}

fn snapshot_dir() -> PathBuf {
    std::env::var_os(SNAPSHOT_DIR_ENV).map_or_else(committed_snapshot_dir, PathBuf::from)
}

fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.char_indices().all(|(i, c)| if [8, 13, 18, 23].contains(&i) { c == '-' } else { c.is_ascii_hexdigit() })
}

/// A value as the projection shows it: a plain word bare, anything else as JSON.
fn show(v: &Value) -> String {
    match v {
        Value::String(s)
            if !s.is_empty()
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "_-./:#@+".contains(c))
                && s != "null" =>
        {
            s.clone()
        }
        other => other.to_string(),
    }
}

/// Shortens UUIDs (in strings and arrays) to their prefix, recording each prefix's full id.
fn shorten(v: &Value, ids: &mut BTreeMap<String, String>) -> Value {
    match v {
        Value::String(s) if is_uuid(s) => {
            let prefix = s[..UUID_PREFIX_LEN].to_owned();
            let full = ids.entry(prefix.clone()).or_insert_with(|| s.clone());
            assert_eq!(full, s, "two ids of one trace share the prefix {prefix}: raise UUID_PREFIX_LEN");
            Value::String(prefix)
        }
        Value::Array(a) => Value::Array(a.iter().map(|x| shorten(x, ids)).collect()),
        other => other.clone(),
    }
}

fn signed(n: i64) -> String {
    if n >= 0 {
        format!("+{n}")
    } else {
        n.to_string()
    }
}

/// The readable projection of an incident trace (module doc): one line per kept event, in
/// the trace's order.
fn project(lines: &[String]) -> Vec<String> {
    let parsed: Vec<serde_json::Map<String, Value>> = lines
        .iter()
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(Value::Object(m)) => m,
            other => panic!("not a JSON object ({other:?}): {l}"),
        })
        .collect();
    let int = |m: &serde_json::Map<String, Value>, f: &str| {
        m.get(f).and_then(Value::as_i64).unwrap_or_else(|| panic!("no integer {f} in {m:?}"))
    };
    // The wall clock at simulated time 0: the reference clock's reading minus its time.
    let origin = parsed.first().map_or(0, |m| int(m, "wall_ms") - int(m, "t_ms"));
    let mut ids = BTreeMap::new();
    let mut sessions_seen = std::collections::BTreeSet::new();
    let mut out = Vec::with_capacity(parsed.len());
    for m in &parsed {
        let kind = m.get("kind").and_then(Value::as_str).unwrap_or_default();
        if kind == "session" {
            let session = m.get("session").map(Value::to_string).unwrap_or_default();
            if !sessions_seen.insert(session) {
                continue;
            }
        }
        let (t, mono, wall) = (int(m, "t_ms"), int(m, "mono_ms"), int(m, "wall_ms"));
        let node = m.get("node").map(show).unwrap_or_default();
        let mut line = format!("{t:>7} {node} {kind}");
        if mono != t {
            line.push_str(&format!(" mono={mono}"));
        }
        if wall - origin - t != 0 {
            line.push_str(&format!(" wall={}", signed(wall - origin - t)));
        }
        for (k, v) in m.iter().filter(|(k, _)| !FIXED_FIELDS.contains(&k.as_str())) {
            let shown = match v.as_i64() {
                Some(n) if k.ends_with("_ms") && n >= WALL_MS_MIN => signed(n - origin),
                _ => show(&shorten(v, &mut ids)),
            };
            line.push_str(&format!(" {k}={shown}"));
        }
        out.push(line);
    }
    out
}

/// The snapshot text of one scenario: its seed's projected incident trace, the proxy
/// world's run trace for a proxy-only scenario, and the probes that fired.
fn snapshot_text(name: &str, proxy_only: bool) -> String {
    let opts = RunOptions { scenario: Some(name.to_owned()), ..RunOptions::default() };
    let (outcome, lines) = campaign::run_seed_traced(SNAPSHOT_SEED, &opts);
    let mut text = vec![format!(
        "# scenario {name}, seed {SNAPSHOT_SEED}: incident trace (projection: docs/simulation.md \"Snapshots\")"
    )];
    text.extend(project(&lines));
    if proxy_only {
        text.push("# the proxy world's run trace".to_owned());
        text.extend(outcome.trace.iter().cloned());
    }
    let probes: Vec<String> = outcome.probes.iter().map(|(p, n)| format!("{}={n}", p.name())).collect();
    text.push(format!("# probes: {}", if probes.is_empty() { "none".to_owned() } else { probes.join(" ") }));
    text.join("\n")
}

/// Every scenario file's seed-1 trace matches its committed snapshot; every snapshot file
/// belongs to a scenario. Mismatches are collected, so one run shows every changed scenario.
#[test]
fn every_shipped_scenario_matches_its_snapshot() {
    let only = std::env::var(SNAPSHOT_ONLY_ENV).ok();
    let all = scenario::all().expect("scenarios load");
    let dir = snapshot_dir();
    let mut settings = insta::Settings::clone_current();
    settings.set_snapshot_path(&dir);
    settings.set_prepend_module_to_snapshot(false);
    settings.set_omit_expression(true);
    let mut mismatched = Vec::new();
    let mut checked = 0;
    for (_, s) in all.iter().filter(|(_, s)| only.as_deref().is_none_or(|o| o == s.name)) {
        let text = snapshot_text(&s.name, s.is_proxy_only());
        let name = s.name.clone();
        let matched = settings.bind(|| {
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| insta::assert_snapshot!(name, text))).is_ok()
        });
        if !matched {
            mismatched.push(s.name.clone());
        }
        checked += 1;
    }
    assert!(checked > 0, "no scenario checked (filter {only:?})");
    assert!(
        mismatched.is_empty(),
        "scenario traces differ from their snapshots (or have none): {mismatched:?}. Review the diffs above; \
         accept with `INSTA_UPDATE=always cargo test -p dlock-sim --profile sim --test snapshots` (madsim cfg) \
         or `cargo insta review`"
    );
    let names: Vec<&str> = all.iter().map(|(_, s)| s.name.as_str()).collect();
    let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for p in entries.filter_map(Result::ok).map(|e| e.path()) {
        let stem = p.file_stem().and_then(|x| x.to_str()).unwrap_or_default();
        if p.extension().is_some_and(|x| x == "snap") {
            assert!(names.contains(&stem), "{} belongs to no scenario: remove it", p.display());
        }
    }
}

/// The check fails on a changed line, on a missing snapshot and on an orphaned one, and
/// passes on snapshots it wrote itself: the check run in a child process (insta reads
/// `INSTA_UPDATE` once per process) with CI's settings, on one scenario, against a
/// temporary snapshot directory (the committed snapshots are never touched).
#[test]
fn a_changed_missing_or_orphaned_snapshot_fails_the_check_under_ci_settings() {
    let dir = std::env::temp_dir().join(format!("dlock-snapshot-proof-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let exe = std::env::current_exe().expect("the test binary");
    let run = |update: &str| {
        let out = std::process::Command::new(&exe)
            .args(["--exact", CHECK_TEST_NAME, "--test-threads", "1"])
            .env("INSTA_UPDATE", update)
            .env("CI", "true")
            .env("INSTA_FORCE_PASS", "0")
            .env(SNAPSHOT_DIR_ENV, &dir)
            .env(SNAPSHOT_ONLY_ENV, PROOF_SCENARIO)
            .output()
            .expect("the test binary runs");
        let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), text)
    };
    let snap = dir.join(format!("{PROOF_SCENARIO}.snap"));

    // A missing snapshot fails under CI's settings, and nothing is written.
    let (ok, text) = run("no");
    assert!(!ok, "a missing snapshot passed: {text}");
    assert!(text.contains(PROOF_SCENARIO), "the failure does not name the scenario: {text}");
    assert!(!snap.exists(), "INSTA_UPDATE=no wrote a snapshot");

    // Accepting writes it; the same seed then matches it (control: the check can pass).
    let (ok, text) = run("always");
    assert!(ok && snap.exists(), "INSTA_UPDATE=always did not accept the snapshot: {text}");
    let accepted = std::fs::read_to_string(&snap).expect("snapshot written");
    let (ok, text) = run("no");
    assert!(ok, "a snapshot the check wrote itself did not match a second run: {text}");

    // One changed line fails, shows the diff, and leaves the file as it was.
    let grant = accepted.lines().find(|l| l.contains(" grant ")).expect("the proof scenario has a grant").to_owned();
    let changed = accepted.replacen(&grant, &grant.replacen(" token=", " token=9", 1), 1);
    assert_ne!(changed, accepted);
    std::fs::write(&snap, &changed).expect("snapshot changed");
    let (ok, text) = run("no");
    assert!(!ok, "a changed line passed: {text}");
    assert!(text.contains(PROOF_SCENARIO) && text.contains("token=9"), "the failure shows no diff: {text}");
    assert_eq!(std::fs::read_to_string(&snap).expect("snapshot kept"), changed, "INSTA_UPDATE=no rewrote it");

    // An orphaned snapshot (no scenario of that name) fails.
    std::fs::write(&snap, &accepted).expect("snapshot restored");
    std::fs::write(dir.join("no-such-scenario.snap"), &accepted).expect("orphan written");
    let (ok, text) = run("no");
    assert!(!ok && text.contains("no-such-scenario.snap"), "an orphaned snapshot passed: {text}");

    let _ = std::fs::remove_dir_all(&dir);
}

/// The projection keeps every event in order and every field but `seq`, shows clocks only
/// where they differ, wall readings relative to the origin, ids by their prefix, and a
/// session's first line only.
#[test]
fn the_projection_keeps_every_event_in_order_with_its_fields() {
    let id_a = "45c0c6ba-5c8e-4da4-8975-b83e24c019de";
    let id_b = "e0c905e4-368e-4df0-bc72-a7944126ab35";
    let lines: Vec<String> = [
        r#"{"seq":0,"t_ms":0,"node":"supervisor","mono_ms":0,"wall_ms":1000000000000,"kind":"trace_start","config":"seed=1 x","schema":"s/1","seed":1}"#.to_owned(),
        format!(r#"{{"seq":1,"t_ms":7,"node":"lock-1","mono_ms":7,"wall_ms":1000000000007,"kind":"session","expires_at_ms":1000000003007,"session":"{id_a}"}}"#),
        format!(r#"{{"seq":2,"t_ms":9,"node":"lock-1","mono_ms":9,"wall_ms":1000000000009,"kind":"grant","key":"payout:acct-0","owner":"executor-1/0","session":"{id_a}","token":3}}"#),
        format!(r#"{{"seq":3,"t_ms":1007,"node":"lock-1","mono_ms":1007,"wall_ms":1000000001007,"kind":"session","expires_at_ms":1000000004007,"session":"{id_a}"}}"#),
        format!(r#"{{"seq":4,"t_ms":1010,"node":"lock-1","mono_ms":1010,"wall_ms":1000000001010,"kind":"session","expires_at_ms":1000000004010,"session":"{id_b}"}}"#),
        r#"{"seq":5,"t_ms":1010,"node":"executor-1","mono_ms":600,"wall_ms":999999911010,"kind":"lease_belief","deadline_ms":900,"nodes":["a","b"],"stale":null,"what":"two words"}"#.to_owned(),
        r#"{"seq":6,"t_ms":1010,"node":"supervisor","mono_ms":1010,"wall_ms":1000000001010,"kind":"trace_end","dropped":0,"events":6}"#.to_owned(),
    ]
    .into();
    let expected = [
        "      0 supervisor trace_start config=\"seed=1 x\" schema=s/1 seed=1",
        "      7 lock-1 session expires_at_ms=+3007 session=45c0c6ba",
        "      9 lock-1 grant key=payout:acct-0 owner=executor-1/0 session=45c0c6ba token=3",
        "   1010 lock-1 session expires_at_ms=+4010 session=e0c905e4",
        "   1010 executor-1 lease_belief mono=600 wall=-90000 deadline_ms=900 nodes=[\"a\",\"b\"] stale=null what=\"two words\"",
        "   1010 supervisor trace_end dropped=0 events=6",
    ];
    assert_eq!(project(&lines), expected);
}

/// One changed value in one trace line changes the projection (what the snapshot compares).
#[test]
fn a_one_value_change_in_a_trace_line_changes_the_projection() {
    let base = |token: u64| -> Vec<String> {
        vec![
            r#"{"seq":0,"t_ms":0,"node":"supervisor","mono_ms":0,"wall_ms":1000000000000,"kind":"trace_start","seed":1}"#.to_owned(),
            format!(r#"{{"seq":1,"t_ms":5,"node":"payment-1","mono_ms":5,"wall_ms":1000000000005,"kind":"fenced_write","answer":"fenced_out","presented_token":{token},"stored_token":4}}"#),
        ]
    };
    assert_eq!(project(&base(3)), project(&base(3)));
    assert_ne!(project(&base(3)), project(&base(4)));
}

/// Two ids of one trace sharing the kept prefix is an error, not a silent merge.
#[test]
#[should_panic(expected = "share the prefix")]
fn two_ids_with_one_prefix_fail_the_projection() {
    let lines = vec![
        r#"{"seq":0,"t_ms":0,"node":"supervisor","mono_ms":0,"wall_ms":0,"kind":"note","line":"45c0c6ba-5c8e-4da4-8975-b83e24c019de"}"#.to_owned(),
        r#"{"seq":1,"t_ms":0,"node":"supervisor","mono_ms":0,"wall_ms":0,"kind":"note","line":"45c0c6ba-0000-4da4-8975-b83e24c019de"}"#.to_owned(),
    ];
    project(&lines);
}
