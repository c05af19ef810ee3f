//! `dlock-real run --seed S --duration D [--nemesis LIST] [--plant BUG] [--json] [--keep]
//! [--dir DIR] [--rate N] [--accounts N] [--settle S] [--no-queue]
//! [--no-lock-set]`: one real run (the crate's doc,
//! docs/real-runs.md). Exit 0 clean, 127 crash, 128 liveness, 129 correctness, 2 usage.

#[cfg(not(madsim))]
const USAGE: &str = "usage: dlock-real run --seed S --duration D [--nemesis LIST] [--plant BUG] [--json] [--keep] [--dir DIR] [--rate PAYOUTS_PER_S] [--accounts N] [--settle SECONDS] [--no-queue] [--no-lock-set]
  D: 90s, 10m, 1h
  LIST: comma-separated kinds (default all): pause, crash, partition, one-way, clog, lossy-link, skew, store-unavailable, leader-loss
  BUG: fencing-off-both (the unsafe-test profile's switches in the release binaries)
exit: 0 clean, 127 crash, 128 liveness, 129 correctness (worst class), 2 usage";

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    use dlock_real::{nemesis, run};
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) != Some("run") {
        eprintln!("{USAGE}");
        return std::process::ExitCode::from(2);
    }
    let mut a = run::Args {
        seed: 0,
        duration_ms: 0,
        kinds: nemesis::REAL_KINDS.to_vec(),
        json: false,
        plant: None,
        keep: false,
        dir: None,
        per_s: run::RATE_PER_S_DEFAULT,
        accounts: run::ACCOUNTS_DEFAULT,
        settle_s: run::SETTLE_S_DEFAULT,
        queue: true,
        lock_set: true,
    };
    let mut seed = None;
    let mut it = args[1..].iter();
    let usage = |msg: String| {
        eprintln!("dlock-real: {msg}\n{USAGE}");
        std::process::ExitCode::from(2)
    };
    while let Some(flag) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
        let r: Result<(), String> = (|| {
            match flag.as_str() {
                "--seed" => seed = Some(value()?.parse::<u64>().map_err(|e| format!("--seed: {e}"))?),
                "--duration" => a.duration_ms = run::parse_duration(&value()?)?,
                "--nemesis" => a.kinds = nemesis::parse_kinds(&value()?)?,
                "--plant" => a.plant = Some(value()?),
                "--json" => a.json = true,
                "--keep" => a.keep = true,
                "--no-queue" => a.queue = false,
                "--no-lock-set" => a.lock_set = false,
                "--dir" => a.dir = Some(std::path::PathBuf::from(value()?)),
                "--rate" => a.per_s = value()?.parse().map_err(|e| format!("--rate: {e}"))?,
                "--accounts" => a.accounts = value()?.parse().map_err(|e| format!("--accounts: {e}"))?,
                "--settle" => a.settle_s = value()?.parse().map_err(|e| format!("--settle: {e}"))?,
                other => return Err(format!("unknown argument {other}")),
            }
            Ok(())
        })();
        if let Err(e) = r {
            return usage(e);
        }
    }
    let Some(seed) = seed else { return usage("--seed is required".into()) };
    if a.duration_ms == 0 {
        return usage("--duration is required".into());
    }
    if a.per_s == 0 || a.accounts == 0 {
        return usage("--rate and --accounts must be positive".into());
    }
    a.seed = seed;
    let root = std::env::var_os("DLOCK_REAL_ROOT")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."));
    std::process::ExitCode::from(run::run(&root, &a))
}

/// The real run drives real processes; it is not built for the simulation.
#[cfg(madsim)]
fn main() {
    eprintln!("dlock-real is not built for simulation");
    std::process::exit(2);
}
