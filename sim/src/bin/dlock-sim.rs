//! The simulation runner: `dlock-sim run --seeds N [--start S] [--jobs J] [--shard K/N]
//! [--scenario NAME] [--layer-off LAYER] [--json]` and `dlock-sim replay --seed S [--layer-off LAYER]`. Built and run under
//! `--cfg madsim` by `cargo xtask sim ...` (target/sim); a build without the simulation cfg
//! only explains how to run it.

#[cfg(not(madsim))]
fn main() {
    eprintln!(
        "dlock-sim runs only in the simulation build: use `cargo xtask sim run --seeds N` \
         (it builds with RUSTFLAGS=\"--cfg madsim\" into target/sim)"
    );
    std::process::exit(2);
}

#[cfg(madsim)]
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match runner::main(&args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dlock-sim: {e}\n{}", runner::USAGE);
            2
        }
    };
    std::process::exit(i32::from(code));
}

#[cfg(madsim)]
mod runner {
    use std::io::{IsTerminal, Write};
    use std::sync::Mutex;

    use dlock_rt::defence::Layer;
    use dlock_sim::campaign::{self, RunOptions};
    use dlock_sim::summary::{self, replay_command};

    pub const USAGE: &str = "usage: dlock-sim run --seeds N [--start S] [--jobs J] [--shard K/N] [--scenario NAME] [--layer-off LAYER] [--json]\n       dlock-sim replay --seed S [--layer-off LAYER]\n  LAYER: executor-lease-check | claim-fence | post-fence | rail-mark | duplicate-guard | state-checks";

    /// Seeds when `--seeds` is absent.
    const SEEDS_DEFAULT: u64 = 100;

    struct Args {
        seeds: u64,
        start: u64,
        jobs: usize,
        shard: Option<(u64, u64)>,
        scenario: Option<String>,
        layer_off: Option<Layer>,
        json: bool,
        seed: Option<u64>,
    }

    fn parse(args: &[String]) -> Result<Args, String> {
        let mut a = Args {
            seeds: SEEDS_DEFAULT,
            start: 1,
            jobs: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            shard: None,
            scenario: None,
            layer_off: None,
            json: false,
            seed: None,
        };
        let mut it = args.iter();
        while let Some(flag) = it.next() {
            let mut value = || it.next().cloned().ok_or_else(|| format!("{flag} needs a value"));
            let num = |v: String| v.parse::<u64>().map_err(|_| format!("{flag} {v}: not a number"));
            match flag.as_str() {
                "--seeds" => a.seeds = num(value()?)?,
                "--start" => a.start = num(value()?)?,
                "--seed" => a.seed = Some(num(value()?)?),
                "--jobs" => a.jobs = num(value()?)?.max(1) as usize,
                "--shard" => a.shard = Some(summary::parse_shard(&value()?)?),
                "--scenario" => a.scenario = Some(value()?),
                "--layer-off" => {
                    let v = value()?;
                    a.layer_off = Some(Layer::parse(&v).ok_or_else(|| format!("--layer-off {v}: no such layer"))?);
                }
                "--json" => a.json = true,
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(a)
    }

    pub fn main(args: &[String]) -> Result<u8, String> {
        match args.first().map(String::as_str) {
            Some("run") => run(parse(&args[1..])?),
            Some("replay") => replay(parse(&args[1..])?),
            _ => Err("expected `run` or `replay`".into()),
        }
    }

    fn run(a: Args) -> Result<u8, String> {
        let seeds = summary::seeds(a.start, a.seeds, a.shard);
        let shard = a.shard.map(|(k, n)| format!(", shard {k}/{n}: {} seeds", seeds.len())).unwrap_or_default();
        eprintln!(
            "dlock-sim: seeds {}..={} ({} seeds{shard}) on {} jobs{}",
            a.start,
            a.start.wrapping_add(a.seeds.saturating_sub(1)),
            a.seeds,
            a.jobs,
            a.scenario.as_deref().map(|s| format!(", scenario {s} (passed through)")).unwrap_or_default()
        );
        if let Some(l) = a.layer_off {
            eprintln!("dlock-sim: defence layer {l} switched off for every seed");
        }
        let opts = RunOptions { scenario: a.scenario.clone(), layer_off: a.layer_off, ..RunOptions::default() };
        let tty = std::io::stderr().is_terminal();
        let failures = Mutex::new(0usize);
        let s = campaign::run_campaign(&seeds, a.jobs, &opts, &|done, total, o| {
            let mut err = std::io::stderr().lock();
            let mut failed = failures.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(l) = a.layer_off.filter(|l| o.defence.bypassed(*l) > 0) {
                if tty {
                    let _ = write!(err, "\r\x1b[K");
                }
                let _ =
                    writeln!(err, "dlock-sim: seed {}: layer {l} (off) let {} through", o.seed, o.defence.bypassed(l));
            }
            for f in &o.failures {
                *failed += 1;
                if tty {
                    let _ = write!(err, "\r\x1b[K");
                }
                let _ = writeln!(err, "{}  [{}]  replay: {}", f.line(o.seed), o.config, replay_command(o.seed));
            }
            if tty {
                let width = 40;
                let filled = done * width / total.max(1);
                let _ = write!(
                    err,
                    "\r[{}{}] {done}/{total} failures {}",
                    "#".repeat(filled),
                    ".".repeat(width - filled),
                    *failed
                );
                if done == total {
                    let _ = writeln!(err);
                }
            } else if done % (total / 20).max(1) == 0 || done == total {
                let _ = writeln!(err, "dlock-sim: {done}/{total} seeds, {} failures", *failed);
            }
        });
        if a.json {
            println!("{}", s.to_json());
        } else {
            print!("{}", s.render());
        }
        Ok(s.exit_code())
    }

    fn replay(a: Args) -> Result<u8, String> {
        let seed = a.seed.ok_or("replay needs --seed S")?;
        let opts = RunOptions {
            scenario: a.scenario,
            print_config: true,
            full_trace: true,
            layer_off: a.layer_off,
            ..RunOptions::default()
        };
        let o = campaign::run_seed(seed, &opts);
        // The configuration (the trace's first line) was printed before the seed ran.
        for line in o.trace.iter().skip(1) {
            println!("{line}");
        }
        for f in &o.failures {
            println!("{}", f.line(seed));
        }
        let probes: Vec<String> = o.probes.iter().map(|(p, n)| format!("{}={n}", p.name())).collect();
        println!("probes: {}", probes.join(" "));
        let mut d = summary::Summary::new(1);
        d.layer_off = a.layer_off;
        d.defence = o.defence.clone();
        println!("{}", d.defence_line());
        println!("simulated {} ms", o.sim_ms);
        Ok(o.worst().map(|c| c.exit_code()).unwrap_or(0))
    }
}
