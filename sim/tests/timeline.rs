//! `dlock-sim replay --timeline FILE.html` (docs/simulation.md "Timeline"): the seed's
//! incident trace drawn by `dlock_timeline::render_html`, byte-identical on a second run and
//! the same page the trace file renders to; `--timeline` works without `--trace`.

#![cfg(madsim)]

use std::path::PathBuf;

fn temp_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("dlock-timeline-test-{}-{name}", std::process::id()))
}

fn replay(args: &[&str]) {
    let bin = env!("CARGO_BIN_EXE_dlock-sim");
    let out = std::process::Command::new(bin).arg("replay").args(args).output().expect("dlock-sim runs");
    assert!(out.status.success(), "dlock-sim replay {args:?} failed: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    if args.contains(&"--timeline") {
        assert!(stderr.contains("dlock-sim: timeline of seed"), "it says where the page is: {stderr}");
    }
}

fn path_str(p: &std::path::Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}

#[test]
fn replay_with_timeline_writes_the_seeds_trace_drawn_as_html() {
    let (trace, a, b) = (temp_path("t.jsonl"), temp_path("a.html"), temp_path("b.html"));
    let seed = ["--seed", "1", "--scenario", "stale-writer-second-proxy"];
    replay(&[&seed[..], &["--trace", path_str(&trace), "--timeline", path_str(&a)]].concat());
    replay(&[&seed[..], &["--timeline", path_str(&b)]].concat());
    let text = std::fs::read_to_string(&trace).expect("trace written");
    let (html_a, html_b) = (
        std::fs::read_to_string(&a).expect("timeline written"),
        std::fs::read_to_string(&b).expect("timeline written"),
    );
    for f in [&trace, &a, &b] {
        let _ = std::fs::remove_file(f);
    }
    assert!(html_a == html_b, "two replays of one seed give byte-identical timelines");
    assert_eq!(html_a, dlock_timeline::render_html(&text).expect("renders"), "the page is the trace's");
    for lane in ["executor-1", "executor-2", "account acct-0", "rail", "faults", "invariants"] {
        assert!(html_a.contains(&format!(r#"data-lane="{lane}""#)), "lane {lane}");
    }
    // The zombie (executor-1) is fenced out at the other proxy, twice.
    assert_eq!(
        html_a.matches(r#"class="ev write" data-seq"#).count(),
        text.matches(r#""kind":"fenced_write""#).count()
    );
    assert_eq!(html_a.matches(r#"data-op="admit" data-answer="fenced_out""#).count(), 2);
    assert!(html_a.starts_with("<!DOCTYPE html>"));
}
