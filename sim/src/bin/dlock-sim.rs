//! The simulation runner: `dlock-sim run --seeds N [--start S] [--jobs J] [--shard K/N]
//! [--scenario NAME] [--layer-off LAYER] [--plant BUG] [--json] [--require-probes] [--verbose]`,
//! `dlock-sim replay --seed S [--scenario NAME] [--layer-off LAYER] [--plant BUG] [--trace FILE.jsonl]
//! [--timeline FILE.html]` (`--trace`: the seed's incident trace, JSON lines, `docs/simulation.md`
//! "Incident trace"; `--timeline`: the same trace drawn as one self-contained HTML page,
//! `dlock_timeline::render_html`, `docs/simulation.md` "Timeline") and
//! `dlock-sim bench [--seeds N]`, and `dlock-sim shrink --seed S [--scenario NAME] [--plant BUG]
//! [--layer-off LAYER] [--out FILE.toml]`: delta debugging of a failing seed down to a small
//! scenario file that breaks the same invariant (`dlock_sim::shrink`, docs/simulation.md
//! "Shrinking"); it prints the size before and after and the replay command, and writes
//! `scenarios/shrunk-S[-BUG].toml` unless `--out` names the file (a `--scenario` ending in
//! `.toml` is a path, so the file replays from anywhere). Shrinking a clean seed is refused
//! (exit 2); a seed whose plan does not reproduce as a scenario exits 1. `--plant BUG` plants one bug for every seed (the negative
//! controls, `dlock_rt::planted`); an unknown name is a usage error (exit 2). With `--scenario NAME` every seed
//! plays `scenarios/NAME.toml` instead of its swarm draw; an unknown name is a usage error
//! (exit 2) listing the known ones. Built and run under `--cfg madsim` by `cargo xtask sim
//! ...` (target/sim); a build without the simulation cfg only explains how to run it.
//!
//! Exit codes: 0 clean; 127 crash, 128 liveness, 129 correctness (the worst failing seed's
//! class); 3 coverage (`--require-probes` and no seed failed, but a probe never fired); 2
//! usage. A failing seed's drawn configuration is printed before its failure lines; with
//! `--verbose` every seed's configuration is printed (stderr) before the seed runs.

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
    use dlock_rt::planted::Bug;
    use dlock_sim::campaign::{self, RunOptions};
    use dlock_sim::summary::{self, replay_command_with};

    pub const USAGE: &str = "usage: dlock-sim run --seeds N [--start S] [--jobs J] [--shard K/N] [--scenario NAME] [--layer-off LAYER] [--plant BUG] [--json] [--require-probes] [--verbose]\n       dlock-sim replay --seed S [--scenario NAME] [--layer-off LAYER] [--plant BUG] [--trace FILE.jsonl] [--timeline FILE.html]\n       dlock-sim bench [--seeds N] [--start S] [--jobs J]\n       dlock-sim envelope [--seeds N] [--start S] [--jobs J]\n       dlock-sim shrink --seed S [--scenario NAME] [--plant BUG] [--layer-off LAYER] [--out FILE.toml]\n  LAYER: executor-lease-check | claim-fence | post-fence | rail-mark | duplicate-guard | state-checks\n  BUG: fencing-off-payment | fencing-off-proxy | fencing-off-both | executor-retries-submit | mark-ge | mark-after-call | revoke-keeps-floor | grant-unexpired | skip-grant-signature-check | skip-owner-check | etcd-wall-clock-judge | reconciler-trusts-answer | fence-off-by-one | lease-end-inclusive | rotate-lapsed-session | batch-ignores-account | p1-hides-ahead\nexit: 0 clean, 127 crash, 128 liveness, 129 correctness (worst class), 3 coverage (--require-probes: a probe never fired), 2 usage; shrink: 0 written, 1 its plan does not reproduce, 2 a clean seed or usage; envelope: 0 every promise held, 129 one broken";

    /// Seeds when `--seeds` is absent.
    const SEEDS_DEFAULT: u64 = 100;

    struct Args {
        seeds: u64,
        start: u64,
        jobs: usize,
        shard: Option<(u64, u64)>,
        scenario: Option<String>,
        layer_off: Option<Layer>,
        planted: Option<Bug>,
        json: bool,
        seed: Option<u64>,
        require_probes: bool,
        verbose: bool,
        trace: Option<String>,
        timeline: Option<String>,
        out: Option<String>,
    }

    fn parse(args: &[String]) -> Result<Args, String> {
        let mut a = Args {
            seeds: SEEDS_DEFAULT,
            start: 1,
            jobs: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            shard: None,
            scenario: None,
            layer_off: None,
            planted: None,
            json: false,
            seed: None,
            require_probes: false,
            verbose: false,
            trace: None,
            timeline: None,
            out: None,
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
                "--plant" => {
                    let v = value()?;
                    a.planted = Some(Bug::parse(&v).ok_or_else(|| format!("--plant {v}: no such bug"))?);
                }
                "--json" => a.json = true,
                "--require-probes" => a.require_probes = true,
                "--verbose" => a.verbose = true,
                "--trace" => a.trace = Some(value()?),
                "--timeline" => a.timeline = Some(value()?),
                "--out" => a.out = Some(value()?),
                other => return Err(format!("unknown argument {other}")),
            }
        }
        Ok(a)
    }

    pub fn main(args: &[String]) -> Result<u8, String> {
        let parsed = |args: &[String]| -> Result<Args, String> {
            let a = parse(args)?;
            if let Some(name) = &a.scenario {
                // An unknown name is a usage error listing the known ones, before any seed runs.
                dlock_sim::scenario::load_named(name)?;
            }
            Ok(a)
        };
        match args.first().map(String::as_str) {
            Some("run") => run(parsed(&args[1..])?),
            Some("replay") => replay(parsed(&args[1..])?),
            Some("bench") => {
                let given = args.iter().any(|a| a == "--seeds");
                bench(parsed(&args[1..])?, given)
            }
            Some("shrink") => shrink(parsed(&args[1..])?),
            Some("envelope") => {
                let given = args.iter().any(|a| a == "--seeds");
                envelope(parsed(&args[1..])?, given)
            }
            _ => Err("expected `run`, `replay`, `bench`, `shrink` or `envelope`".into()),
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
            a.scenario.as_deref().map(|s| format!(", scenario {s}")).unwrap_or_default()
        );
        if let Some(l) = a.layer_off {
            eprintln!("dlock-sim: defence layer {l} switched off for every seed");
        }
        if let Some(b) = a.planted {
            eprintln!("dlock-sim: bug {b} planted in every seed");
        }
        // --verbose: each seed's drawn configuration on stderr before it runs (plain progress
        // lines then, so the bar does not overwrite them).
        let opts = RunOptions {
            scenario: a.scenario.clone(),
            print_config: a.verbose,
            layer_off: a.layer_off,
            planted: a.planted,
            ..RunOptions::default()
        };
        let tty = std::io::stderr().is_terminal() && !a.verbose;
        let failures = Mutex::new(0usize);
        let mut s = campaign::run_campaign(&seeds, a.jobs, &opts, &|done, total, o| {
            let mut err = std::io::stderr().lock();
            let mut failed = failures.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(l) = a.layer_off.filter(|l| o.defence.bypassed(*l) > 0) {
                if tty {
                    let _ = write!(err, "\r\x1b[K");
                }
                let _ =
                    writeln!(err, "dlock-sim: seed {}: layer {l} (off) let {} through", o.seed, o.defence.bypassed(l));
            }
            if !o.failures.is_empty() {
                if tty {
                    let _ = write!(err, "\r\x1b[K");
                }
                // The drawn configuration first, then each failure with its replay command.
                let _ = writeln!(err, "config: {}", o.config);
            }
            for f in &o.failures {
                *failed += 1;
                let _ = writeln!(
                    err,
                    "{}  replay: {}",
                    f.line(o.seed),
                    replay_command_with(o.seed, &o.config, a.layer_off, a.planted)
                );
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
        s.require_probes = a.require_probes;
        if a.json {
            println!("{}", s.to_json());
        } else {
            print!("{}", s.render());
        }
        Ok(s.exit_code())
    }

    /// The speed bench (sim/src/bench.rs): fixed-size seeds, the figures against their
    /// targets, a bare-round-trip baseline from the same run, requests per seed by route.
    fn bench(a: Args, seeds_given: bool) -> Result<u8, String> {
        let n = if seeds_given { a.seeds } else { dlock_sim::bench::BENCH_SEEDS_DEFAULT };
        let seeds = summary::seeds(a.start, n, a.shard);
        eprintln!(
            "dlock-sim bench: seeds {}..={} ({} seeds) on {} jobs",
            a.start,
            a.start + n.saturating_sub(1),
            n,
            a.jobs
        );
        let report = dlock_sim::bench::run_bench(&seeds, a.jobs);
        print!("{}", report.render());
        Ok(report.worst.map(|c| c.exit_code()).unwrap_or(0))
    }

    /// The clock envelope (`dlock_sim::envelope`): every row over the seeds, the table on
    /// stdout; exit 129 when a row broke a promise.
    fn envelope(a: Args, seeds_given: bool) -> Result<u8, String> {
        use dlock_sim::envelope::{self, Row};
        let n = if seeds_given { a.seeds } else { envelope::ENVELOPE_SEEDS_DEFAULT };
        let seeds = summary::seeds(a.start, n, a.shard);
        let rows = Row::all();
        eprintln!(
            "dlock-sim envelope: {} rows over seeds {}..={} ({} seeds, each twice: fences on and off) on {} jobs",
            rows.len(),
            a.start,
            a.start + n.saturating_sub(1),
            n,
            a.jobs
        );
        let table = envelope::sweep(&rows, &seeds, a.jobs, &|row, cell| {
            eprintln!("dlock-sim envelope: {}: {cell:?}", row.label());
        });
        print!("{}", envelope::render(&table, &seeds));
        let broken: Vec<String> = table.iter().flat_map(|(row, cell)| row.broken_promises(cell)).collect();
        for line in &broken {
            println!("broken: {line}");
        }
        Ok(if broken.is_empty() { 0 } else { 129 })
    }

    /// Shrinks a failing seed into a scenario file (`dlock_sim::shrink`).
    fn shrink(a: Args) -> Result<u8, String> {
        use dlock_sim::shrink::{ShrinkError, ShrinkOptions};
        let seed = a.seed.ok_or("shrink needs --seed S")?;
        let tag = a.planted.map(|b| format!("-{b}")).or(a.layer_off.map(|l| format!("-{l}-off"))).unwrap_or_default();
        let (path, name, replay_as) = match &a.out {
            Some(out) => {
                let path = std::path::PathBuf::from(out);
                let stem = path.file_stem().and_then(|s| s.to_str()).map(str::to_owned);
                match stem.filter(|_| out.ends_with(".toml")) {
                    Some(stem) => (path.clone(), stem, Some(path.display().to_string())),
                    None => return Err(format!("--out {out}: expected a FILE.toml")),
                }
            }
            None => {
                let name = format!("shrunk-{seed}{tag}");
                (dlock_sim::scenario::scenarios_dir().join(format!("{name}.toml")), name, None)
            }
        };
        eprintln!("dlock-sim shrink: seed {seed}: at most {} runs", dlock_sim::shrink::SHRINK_RUNS_MAX);
        let opts = ShrinkOptions {
            seed,
            scenario: a.scenario.clone(),
            planted: a.planted,
            layer_off: a.layer_off,
            name: name.clone(),
            replay_as: replay_as.clone(),
        };
        let s = match dlock_sim::shrink::shrink(&opts) {
            Ok(s) => s,
            Err(ShrinkError::Clean(e)) => {
                eprintln!("dlock-sim shrink: refused: {e}");
                return Ok(2);
            }
            Err(ShrinkError::Scenario(e)) => return Err(e),
            Err(ShrinkError::NotReproduced(e)) => {
                eprintln!("dlock-sim shrink: {e}");
                return Ok(1);
            }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        std::fs::write(&path, &s.text).map_err(|e| format!("{}: {e}", path.display()))?;
        println!("invariant: {}", s.invariant);
        println!("before: {}", s.before);
        println!("after:  {}", s.after);
        println!("runs:   {} of {}", s.runs, dlock_sim::shrink::SHRINK_RUNS_MAX);
        println!("wrote {}", path.display());
        let scenario = replay_as.unwrap_or(name);
        println!("replay: {}", dlock_sim::shrink::replay_command(seed, &scenario, a.planted, a.layer_off));
        Ok(0)
    }

    fn replay(a: Args) -> Result<u8, String> {
        let seed = a.seed.ok_or("replay needs --seed S")?;
        let opts = RunOptions {
            scenario: a.scenario,
            print_config: true,
            full_trace: true,
            layer_off: a.layer_off,
            planted: a.planted,
            ..RunOptions::default()
        };
        let o = if a.trace.is_none() && a.timeline.is_none() {
            campaign::run_seed(seed, &opts)
        } else {
            let (o, lines) = campaign::run_seed_traced(seed, &opts);
            let mut text = lines.join("\n");
            text.push('\n');
            if let Some(path) = &a.trace {
                std::fs::write(path, &text).map_err(|e| format!("--trace {path}: {e}"))?;
                eprintln!("dlock-sim: incident trace of seed {seed}: {} lines in {path}", lines.len());
            }
            if let Some(path) = &a.timeline {
                let html = dlock_timeline::render_html(&text).map_err(|e| format!("--timeline {path}: {e}"))?;
                std::fs::write(path, html).map_err(|e| format!("--timeline {path}: {e}"))?;
                eprintln!("dlock-sim: timeline of seed {seed} in {path} (open it in a browser)");
            }
            o
        };
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
