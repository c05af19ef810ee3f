//! `cargo xtask sim run --seeds N [--start S] [--jobs J] [--shard K/N] [--scenario NAME] [--json]
//! [--layer-off LAYER] [--plant BUG] [--require-probes] [--verbose]`, `cargo xtask sim replay --seed S
//! [--scenario NAME] [--layer-off LAYER] [--plant BUG] [--trace FILE.jsonl] [--timeline FILE.html]` (LAYER: one defence switched off,
//! `dlock_rt::defence::Layer`; BUG: one planted bug, `dlock_rt::planted::Bug`) and
//! `cargo xtask sim bench [--seeds N]` (the speed bench, sim/src/bench.rs) and `cargo xtask
//! sim shrink --seed S [--scenario NAME] [--plant BUG] [--layer-off LAYER] [--out FILE.toml]`
//! (a failing seed shrunk into a scenario file, sim/src/shrink.rs) and `cargo xtask sim
//! envelope [--seeds N]` (the clock envelope, sim/src/envelope.rs): builds the
//! simulation runner (`dlock-sim`, in the `dlock-sim` crate) with `RUSTFLAGS="--cfg madsim"`
//! into `target/sim` under the `sim` profile, runs it with the arguments, and exits with its
//! exit code (0 clean, 127 crash, 128 liveness, 129 correctness, 3 coverage: with
//! `--require-probes`, a probe never fired; 2 usage).
//!
//! `cargo xtask real run --seed S --duration D [--nemesis LIST] [--plant BUG] [--json]
//! [--keep] [--dir DIR] [--rate N] [--accounts N] [--settle S]` (the real run,
//! docs/real-runs.md): builds the release binaries (`dlock`, `dlock-real`) and runs
//! `dlock-real` with the arguments, exiting with its exit code (the same classes).
//! `cargo xtask real plants [--only LIST]` runs every planted bug a real run plants, at its
//! pinned seed; with `plants` or `--plant` it first builds the test-only binary
//! (`--features planted`) into `target/planted/dlock`.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

const USAGE: &str = "usage: cargo xtask real run --seed S --duration D [--nemesis LIST] [--plant BUG] [--json] [--keep] [--dir DIR] [--rate N] [--accounts N] [--settle S] [--dry-run]\n       cargo xtask real plants [--only BUG,BUG]\n       cargo xtask sim run --seeds N [--start S] [--jobs J] [--shard K/N] [--scenario NAME] [--layer-off LAYER] [--plant BUG] [--json] [--require-probes] [--verbose]\n       cargo xtask sim replay --seed S [--scenario NAME] [--layer-off LAYER] [--plant BUG] [--trace FILE.jsonl] [--timeline FILE.html]\n       cargo xtask sim bench [--seeds N] [--start S] [--jobs J]\n       cargo xtask sim envelope [--seeds N] [--start S] [--jobs J]\n       cargo xtask sim shrink --seed S [--scenario NAME] [--plant BUG] [--layer-off LAYER] [--out FILE.toml]\n  LAYER: executor-lease-check | claim-fence | post-fence | rail-mark | duplicate-guard | state-checks\n  BUG: fencing-off-payment | fencing-off-proxy | fencing-off-both | executor-retries-submit | mark-ge | mark-after-call | revoke-keeps-floor | grant-unexpired | skip-grant-signature-check | skip-owner-check | etcd-wall-clock-judge | reconciler-trusts-answer | fence-off-by-one | lease-end-inclusive | rotate-lapsed-session | batch-ignores-account | p1-hides-ahead\nexit: 0 clean, 127 crash, 128 liveness, 129 correctness (worst class), 3 coverage (--require-probes: a probe never fired), 2 usage; shrink: 0 written, 1 its plan does not reproduce, 2 a clean seed or usage; envelope: 0 every promise held, 129 one broken";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("sim") if args.len() >= 2 => sim(&args[1..]),
        Some("real") if args.len() >= 2 => real(&args[1..]),
        _ => {
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn sim(args: &[String]) -> ExitCode {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    // The runner runs from the workspace root: a relative `--trace FILE`, `--timeline FILE`,
    // `--out FILE` or `--scenario FILE.toml` is made absolute against the caller's directory first.
    let args = absolute_paths(args, &|flag, v| {
        matches!(flag, "--trace" | "--timeline" | "--out") || (flag == "--scenario" && v.ends_with(".toml"))
    });
    let status = Command::new(cargo)
        .current_dir(&root)
        .env("RUSTFLAGS", "--cfg madsim")
        .env("CARGO_TARGET_DIR", root.join("target/sim"))
        .args(["run", "--quiet", "--profile", "sim", "-p", "dlock-sim", "--bin", "dlock-sim", "--"])
        .args(args)
        .status();
    match status {
        Ok(s) => ExitCode::from(s.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: cannot run cargo: {e}");
            ExitCode::from(2)
        }
    }
}

/// `args` with each value whose flag `is_path` says names a path made absolute against the
/// caller's directory (the runners run from the workspace root).
fn absolute_paths(args: &[String], is_path: &dyn Fn(&str, &str) -> bool) -> Vec<String> {
    let here = std::env::current_dir().unwrap_or_default();
    args.iter()
        .enumerate()
        .map(|(i, v)| match i.checked_sub(1).and_then(|p| args.get(p)) {
            Some(flag) if is_path(flag, v) => here.join(v).to_string_lossy().into_owned(),
            _ => v.clone(),
        })
        .collect()
}

fn exit_of(status: std::io::Result<std::process::ExitStatus>) -> ExitCode {
    match status {
        Ok(s) => ExitCode::from(s.code().and_then(|c| u8::try_from(c).ok()).unwrap_or(1)),
        Err(e) => {
            eprintln!("xtask: cannot run: {e}");
            ExitCode::from(2)
        }
    }
}

fn real(args: &[String]) -> ExitCode {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().map(PathBuf::from).unwrap_or_default();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let args = absolute_paths(args, &|flag, _| flag == "--dir");
    // A planted bug needs the test-only build (`--features planted`), copied aside first;
    // the production build then takes `target/release/dlock` back.
    if args.iter().any(|a| a == "plants" || a == "--plant") {
        let built = Command::new(&cargo)
            .current_dir(&root)
            .args(["build", "--quiet", "--release", "--locked", "-p", "dlock", "--features", "planted"])
            .status();
        match built {
            Ok(s) if s.success() => {}
            other => return exit_of(other),
        }
        let planted = root.join("target/planted");
        // Copied, then renamed into place: a planted binary still running keeps its file.
        let copied = std::fs::create_dir_all(&planted)
            .and_then(|()| std::fs::copy(root.join("target/release/dlock"), planted.join("dlock.new")))
            .and_then(|_| std::fs::rename(planted.join("dlock.new"), planted.join("dlock")));
        if let Err(e) = copied {
            eprintln!("xtask: cannot copy the test-only build to {}: {e}", planted.display());
            return ExitCode::from(1);
        }
    }
    // One build each: built together, `dlock`'s dependencies would get `dlock-real`'s
    // features too, and the binary would no longer be the production build.
    for package in ["dlock", "dlock-real"] {
        let built = Command::new(&cargo)
            .current_dir(&root)
            .args(["build", "--quiet", "--release", "--locked", "-p", package])
            .status();
        match built {
            Ok(s) if s.success() => {}
            other => return exit_of(other),
        }
    }
    let status = Command::new(root.join("target/release/dlock-real"))
        .current_dir(&root)
        .env("DLOCK_REAL_ROOT", &root)
        .args(args)
        .status();
    exit_of(status)
}
