//! The runner binary with `--scenario NAME`: every seed plays `scenarios/NAME.toml` and the
//! summary (text or `--json`) and exit code are the swarm's; an unknown name is a usage
//! error (exit 2) that lists the known names.

#![cfg(madsim)]

use std::process::Command;

fn dlock_sim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_dlock-sim")).args(args).output().expect("dlock-sim runs");
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
}

#[test]
fn run_with_an_unknown_scenario_is_a_usage_error_listing_the_known_ones() {
    for cmd in
        [&["run", "--seeds", "2", "--scenario", "no-such"][..], &["replay", "--seed", "1", "--scenario", "no-such"]]
    {
        let (code, _, err) = dlock_sim(cmd);
        assert_eq!(code, 2, "{cmd:?}: {err}");
        assert!(err.contains("unknown scenario \"no-such\"") && err.contains("waiter-session-expires"), "{err}");
    }
}

#[test]
fn run_with_a_scenario_plays_it_under_each_seed_with_the_swarms_summary() {
    let (code, out, err) = dlock_sim(&[
        "run",
        "--seeds",
        "3",
        "--start",
        "5",
        "--jobs",
        "2",
        "--scenario",
        "stale-writer-second-proxy",
        "--json",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(err.contains("seeds 5..=7") && err.contains("scenario stale-writer-second-proxy"), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("--json summary");
    assert_eq!(v["seedsRun"], 3, "{v}");
    assert_eq!(v["exitCode"], 0, "{v}");
    // The probes are the scenario's: the stale writer was fenced at the rail in every seed.
    assert!(v["probes"]["fenced_out_rail"].as_u64().is_some_and(|n| n >= 3), "{v}");
    let (code, out, _) = dlock_sim(&["replay", "--seed", "6", "--scenario", "stale-writer-second-proxy"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.lines().any(|l| l.starts_with("seen @") && l.contains(" fenced in_flight=[")), "{out}");
}
