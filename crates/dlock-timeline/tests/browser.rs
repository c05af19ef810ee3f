//! The timeline in a real browser: headless Debian `chromium` loads the page drawn from a
//! real trace (tests/fixtures/swarm-seed-122.jsonl: executor-5 paused past its lease and
//! fenced out), its script runs, and the DOM it dumps has the lanes and the fenced-out
//! write; a screenshot is kept under target/ (the path is printed).
//!
//! `scripts/test.sh` installs chromium. Without it this test fails, unless
//! `DLOCK_SKIP_BROWSER=1` is set (then it prints that it skipped). `DLOCK_CHROMIUM` names
//! another binary.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SWARM_122: &str = include_str!("fixtures/swarm-seed-122.jsonl");

/// Bound on one chromium run.
const CHROMIUM_TIMEOUT_MS: u64 = 120_000;
/// Interval between checks that chromium has exited.
const POLL_INTERVAL_MS: u64 = 50;
/// The screenshot's size.
const WINDOW_W_PX: u32 = 1800;
const WINDOW_H_PX: u32 = 1500;

fn out_dir() -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("dlock-timeline");
    std::fs::create_dir_all(&d).expect("output dir");
    d
}

/// Runs chromium headless on `page` with `extra` arguments, in a fresh profile; its stdout.
fn run_chromium(bin: &Path, page: &Path, extra: &[String], profile: &Path) -> String {
    let _ = std::fs::remove_dir_all(profile);
    std::fs::create_dir_all(profile).expect("profile dir");
    let out_file = profile.with_extension("stdout");
    let stdout = std::fs::File::create(&out_file).expect("stdout file");
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--hide-scrollbars",
            "--disable-dev-shm-usage",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
    let deadline = Instant::now() + Duration::from_millis(CHROMIUM_TIMEOUT_MS);
    let status = loop {
        match child.try_wait().expect("wait for chromium") {
            Some(s) => break s,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not finish within {CHROMIUM_TIMEOUT_MS} ms");
            }
            None => std::thread::sleep(Duration::from_millis(POLL_INTERVAL_MS)),
        }
    };
    assert!(status.success(), "chromium {extra:?} failed: {status}");
    let _ = std::fs::remove_dir_all(profile);
    std::fs::read_to_string(&out_file).expect("chromium's output")
}

#[test]
fn headless_chromium_draws_the_lanes_and_the_fenced_out_write() {
    let Some(bin) = dlock_testkit::browser::chromium("the timeline's browser test") else { return };
    let dir = out_dir();
    let page = dir.join("timeline-swarm-seed-122.html");
    let html = dlock_timeline::render_html(SWARM_122).expect("renders");
    std::fs::write(&page, &html).expect("page written");

    let dom =
        run_chromium(&bin, &page, &["--dump-dom".to_owned()], &dir.join(format!("profile-dom-{}", std::process::id())));
    // The script ran to its end: it marks the document with the number of marks it wired.
    let ready = dom
        .split("data-timeline-ready=\"")
        .nth(1)
        .and_then(|r| r.split('"').next())
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or_else(|| {
            panic!("the page's script did not run (no data-timeline-ready): {}", &dom[..dom.len().min(400)])
        });
    assert_eq!(ready, html.matches(r#"class="ev"#).count(), "every mark is wired for hover");
    for n in 1..=5 {
        assert!(dom.contains(&format!(r#"data-lane="executor-{n}""#)), "lane executor-{n} in the DOM");
    }
    for lane in ["faults", "rail", "invariants", "account acct-3"] {
        assert!(dom.contains(&format!(r#"data-lane="{lane}""#)), "lane {lane} in the DOM");
    }
    assert!(dom.contains(r#"data-answer="fenced_out" data-presented="17" data-stored="30""#), "the fenced-out write");
    assert!(dom.contains(r#"data-band="paused""#), "executor-5's pause");

    let png = dir.join("timeline-swarm-seed-122.png");
    let _ = std::fs::remove_file(&png);
    run_chromium(
        &bin,
        &page,
        &[format!("--screenshot={}", png.display()), format!("--window-size={WINDOW_W_PX},{WINDOW_H_PX}")],
        &dir.join(format!("profile-png-{}", std::process::id())),
    );
    let bytes = std::fs::read(&png).expect("screenshot written");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG");
    let dim = |at: usize| u32::from_be_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    assert_eq!((dim(16), dim(20)), (WINDOW_W_PX, WINDOW_H_PX), "the window's size");
    assert!(bytes.len() > 50_000, "a drawn picture, not a blank page ({} bytes)", bytes.len());
    println!("timeline screenshot: {}", png.display());
}
