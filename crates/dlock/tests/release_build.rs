//! The simulation's test-only switches are absent from the release `dlock` binary
//! (docs/simulation.md "Planted bugs"): no planted-bug setter, no planted bug's state or
//! name, no defence-layer setter or state. The type system already keeps the setters out of
//! any build without `cfg(madsim)` (a `compile_fail` doctest on each module); this checks
//! the artifact that ships, so no feature, cfg leak or future call site can bring them back
//! unseen.
//!
//! The test builds the release binary (`cargo build --release --locked -p dlock`, with no
//! `RUSTFLAGS`: the production build) into the same target directory as this test, a no-op
//! when it is fresh (scripts/test.sh builds it in a stage of its own first, so its cost is
//! timed apart), then searches the file's bytes for the markers of
//! `common/compiled_out.rs`. Two controls keep the search honest: the binary's own `main`
//! and a `dlock_contract` symbol must be found (a stripped binary, or one without the crate
//! the switches live in, fails), and `sim/tests/compiled_out_control.rs` finds every marker
//! in a `cfg(madsim)` binary (a renamed switch fails there). `DLOCK_RELEASE_BIN=PATH`
//! checks a binary built elsewhere instead of building one.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

#[path = "common/compiled_out.rs"]
mod compiled_out;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use compiled_out::{found, searchable, CONTRACT_SYMBOL, DEFENCE_MODULE, DLOCK_MAIN, PLANTED_MODULE, SWITCH_SYMBOLS};

/// Bound on building the release binary from nothing (about 9 min measured on a loaded
/// 2-core machine; a no-op rebuild takes about a second).
const RELEASE_BUILD_S_MAX: u64 = 2_400;

/// How often the test looks whether the release build has finished.
const BUILD_POLL_MS: u64 = 200;

/// The target directory this test binary was built into (`<target>/<profile>/deps/<exe>`).
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors().nth(3).expect("the test binary sits in <target>/<profile>/deps").to_path_buf()
}

/// The release `dlock` binary: `DLOCK_RELEASE_BIN`, or built (or found fresh) by cargo.
fn release_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("DLOCK_RELEASE_BIN") {
        return PathBuf::from(p);
    }
    let target = target_dir();
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let started = Instant::now();
    let mut child = std::process::Command::new(cargo)
        .args(["build", "--release", "--locked", "-p", "dlock", "--target-dir"])
        .arg(&target)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("CARGO_BUILD_RUSTFLAGS")
        .env_remove("CARGO_TARGET_DIR")
        .spawn()
        .expect("cargo runs");
    let deadline = started + Duration::from_secs(RELEASE_BUILD_S_MAX);
    let status = loop {
        if let Some(status) = child.try_wait().expect("cargo build is waitable") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("cargo build --release -p dlock took over {RELEASE_BUILD_S_MAX} s");
        }
        std::thread::sleep(Duration::from_millis(BUILD_POLL_MS));
    };
    assert!(status.success(), "cargo build --release -p dlock failed: {status}");
    eprintln!("release build (or freshness check): {:.1} s", started.elapsed().as_secs_f64());
    target.join("release").join(format!("dlock{}", std::env::consts::EXE_SUFFIX))
}

#[test]
fn the_release_binary_holds_no_planted_bug_and_no_defence_switch() {
    let bin = release_binary();
    let bytes = std::fs::read(&bin).unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    let text = searchable(&bytes);

    // Controls: the symbol table is there, and so is the crate the switches live in.
    assert_eq!(
        found(&text, [DLOCK_MAIN, CONTRACT_SYMBOL]),
        [DLOCK_MAIN, CONTRACT_SYMBOL],
        "{}: the symbol search sees nothing (a stripped binary?), so it could prove nothing",
        bin.display()
    );

    let setters = found(&text, SWITCH_SYMBOLS.iter().map(|(m, _)| *m));
    let what: Vec<&str> = SWITCH_SYMBOLS.iter().filter(|(m, _)| setters.contains(m)).map(|(_, what)| *what).collect();
    assert!(what.is_empty(), "{}: the release binary holds {what:?}", bin.display());
    for (module, path) in [(PLANTED_MODULE, "dlock_contract::planted"), (DEFENCE_MODULE, "dlock_contract::defence")] {
        assert!(found(&text, [module]).is_empty(), "{}: the release binary links something of {path}", bin.display());
    }
    let names = found(&text, compiled_out::bug_names());
    assert!(names.is_empty(), "{}: the release binary holds the planted bugs' names {names:?}", bin.display());
}
