//! `dlock-real run --seed S --duration D [--nemesis LIST] [--plant BUG] [--json] [--keep]
//! [--dir DIR] [--rate N] [--accounts N] [--settle S] [--no-queue]
//! [--no-lock-set] [--dry-run]`: one real run (`--dry-run`: print the plan the seed draws, and exit) (the crate's doc,
//! docs/real-runs.md). `dlock-real plants [--only LIST]`: every planted bug a real run
//! plants, at its pinned seed, each required caught. Exit 0 clean, 127 crash, 128 liveness, 129 correctness, 2 usage.

#[cfg(not(madsim))]
const USAGE: &str = "usage: dlock-real run --seed S --duration D [--nemesis LIST] [--plant BUG] [--json] [--keep] [--dir DIR] [--rate PAYOUTS_PER_S] [--accounts N] [--settle SECONDS] [--no-queue] [--no-lock-set] [--dry-run]
  D: 90s, 10m, 1h
  LIST: comma-separated kinds (default all): pause, crash, partition, one-way, clog, lossy-link, skew, store-unavailable, leader-loss
  BUG: a planted bug; the fencing bugs (fencing-off-payment, fencing-off-proxy, fencing-off-both) are the
       unsafe-test profile's switches, the others need the test-only build in target/planted/dlock
       (docs/real-runs.md, \"Planted bugs on real processes\"); without --nemesis, the faults that reach it
exit: 0 clean, 127 crash, 128 liveness, 129 correctness (worst class), 2 usage
       dlock-real plants [--only BUG,BUG]
  every planted bug a real run plants, each at its pinned seed; exit 0 when each was caught, 1 otherwise";

#[cfg(not(madsim))]
fn main() -> std::process::ExitCode {
    use dlock_real::{nemesis, run};
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = || {
        std::env::var_os("DLOCK_REAL_ROOT")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
    };
    if args.first().map(String::as_str) == Some("plants") {
        // Every planted bug a real run can plant, at its pinned seed: each must be caught.
        let only: Vec<String> = match args.get(1..) {
            Some([flag, list]) if flag == "--only" => list.split(',').map(str::to_owned).collect(),
            Some([]) | None => Vec::new(),
            Some(_) => {
                eprintln!("{USAGE}");
                return std::process::ExitCode::from(2);
            }
        };
        if let Some(bad) = only.iter().find(|n| dlock_real::plants::find(n).is_err()) {
            eprintln!("dlock-real: {}", dlock_real::plants::find(bad).err().unwrap_or_default());
            return std::process::ExitCode::from(2);
        }
        let runs = dlock_real::plants::run_all(&root(), &only);
        return std::process::ExitCode::from(if runs.iter().all(|r| r.caught) { 0 } else { 1 });
    }
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
    let mut nemesis_given = false;
    let mut dry_run = false;
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
                "--nemesis" => {
                    a.kinds = nemesis::parse_kinds(&value()?)?;
                    nemesis_given = true;
                }
                "--plant" => a.plant = Some(value()?),
                "--json" => a.json = true,
                "--keep" => a.keep = true,
                "--no-queue" => a.queue = false,
                "--no-lock-set" => a.lock_set = false,
                "--dry-run" => dry_run = true,
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
    if let (Some(p), false) = (&a.plant, nemesis_given) {
        match dlock_real::plants::find(p).and_then(|p| nemesis::parse_kinds(p.nemesis)) {
            Ok(k) => a.kinds = k,
            Err(e) => return usage(e),
        }
    }
    a.seed = seed;
    if dry_run {
        // The plan only: what the seed draws, without a cluster (and without root).
        for l in nemesis::Plan::draw(a.seed, a.duration_ms, &a.kinds).lines() {
            println!("{l}");
        }
        return std::process::ExitCode::SUCCESS;
    }
    std::process::ExitCode::from(run::run(&root(), &a))
}

/// The real run drives real processes; it is not built for the simulation.
#[cfg(madsim)]
fn main() {
    eprintln!("dlock-real is not built for simulation");
    std::process::exit(2);
}
