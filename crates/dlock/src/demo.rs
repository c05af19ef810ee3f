//! `dlock up` and `dlock demo`: the whole cluster in one process (see [`crate::cluster`]).

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use dlock_config::{Layers, Profile};
use dlock_contract::payment::{NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::{IdempotencyKey, OwnerId};
use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_payment_resource::store::ListQuery;

use crate::cluster::{Cluster, ClusterConfig, LocalCredentials, Ports};

/// The chaos and sizing both commands share.
#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Fixed delay of the rail before every answer, in ms. Default: 0.
    #[arg(long, value_name = "MS")]
    pub rail_latency_ms: Option<u64>,
    /// Fraction of rail calls that fail (half 5xx, half held then dropped): RAIL_AMBIGUOUS.
    /// Default: 0.02 for `demo`, 0 for `up`.
    #[arg(long, value_name = "0..1")]
    pub rail_failure_rate: Option<f64>,
    /// Probability that the rail pays a repeated clientRef again (the proxy never lets one
    /// through). Default: 1.
    #[arg(long, value_name = "0..1")]
    pub rail_duplicate_ack_rate: Option<f64>,
    /// Fraction of rail calls declined (the payout ends FAILED). Default: 0.
    #[arg(long, value_name = "0..1")]
    pub rail_decline_rate: Option<f64>,
    /// Chance, at each fenced write, that an executor stalls longer than its lease (a GC
    /// pause between its lease check and the write). The fences must stop every such write.
    /// Default: 0.1 for `demo`, 0 for `up`.
    #[arg(long, value_name = "0..1")]
    pub pause_rate: Option<f64>,
    /// Executors in the cluster, each with its own lock sessions.
    #[arg(long, value_name = "N", default_value_t = 2)]
    pub executors: usize,
    /// Worker tasks per executor (the key executor.concurrency). Default: 8.
    #[arg(long, value_name = "N")]
    pub concurrency: Option<usize>,
}

/// Lease of every executor grant in the one-process cluster; an injected stall outlasts it.
pub const LEASE_MS: u64 = 1_500;
/// How long an injected stall lasts: twice [`LEASE_MS`], so that another executor has at
/// least a lease's time to take the key over and raise the fence before the stalled write
/// lands. (With 500 ms past the lease, most stalls ended before any takeover, and the stalled
/// write went through under a token still the highest: safe, but nothing to show.)
pub const PAUSE_MS: u64 = 3_000;
const _: () = assert!(PAUSE_MS >= 2 * LEASE_MS, "a stall leaves another executor a lease's time to take over");
/// `dlock demo`'s default chance of a stall at each fenced write. A write covers up to 16
/// payouts of one account (batches, C3-extensions E-19), so 10 % of writes is about one stall
/// per hundred payouts.
pub const DEMO_PAUSE_RATE: f64 = 0.1;
/// `dlock demo`'s default share of rail calls that fail (each one an ambiguous payout).
pub const DEMO_RAIL_FAILURE_RATE: f64 = 0.02;
/// The proxy's read timeout towards the rail here (a held-then-dropped call ends RAIL_AMBIGUOUS
/// after it), and how long the rail holds a dropped call.
pub const RAIL_READ_TIMEOUT_MS: u64 = 2_000;
pub const RAIL_DROP_HOLD_MS: u64 = 3_000;

/// Worker tasks per executor unless `--concurrency` or `executor.concurrency` says otherwise.
pub const CONCURRENCY_DEFAULT: usize = 8;
/// How often an idle executor of the one-process cluster scans its work queue.
pub const POLL_INTERVAL_MS: u64 = 50;

impl ChaosArgs {
    /// The cluster to start: the command's flags go in the flags layer of `layers`, its
    /// defaults (`defaults`: the rail's failure rate and the stall rate) beneath the file.
    fn cluster(
        &self,
        data_dir: PathBuf,
        ports: Ports,
        defaults: (f64, f64),
        mut layers: Layers,
        profile: Profile,
    ) -> Result<ClusterConfig, String> {
        let (failure_default, pause_default) = defaults;
        let rate = |v: Option<f64>, name: &str| -> Result<Option<f64>, String> {
            match v {
                Some(r) if !(0.0..=1.0).contains(&r) => Err(format!("--{name} must be within 0.0..=1.0")),
                other => Ok(other),
            }
        };
        if !(1..=16).contains(&self.executors) || self.concurrency.is_some_and(|c| !(1..=64).contains(&c)) {
            return Err("--executors must be 1..=16 and --concurrency 1..=64".into());
        }
        let l = &mut layers;
        l.set_flag_opt("rail.stub.latency-ms", self.rail_latency_ms.as_ref());
        l.set_flag_opt("rail.stub.failure-rate", rate(self.rail_failure_rate, "rail-failure-rate")?.as_ref());
        l.set_flag_opt(
            "rail.stub.duplicate-ack-rate",
            rate(self.rail_duplicate_ack_rate, "rail-duplicate-ack-rate")?.as_ref(),
        );
        l.set_flag_opt("rail.stub.decline-rate", rate(self.rail_decline_rate, "rail-decline-rate")?.as_ref());
        l.set_flag_opt("executor.chaos.pause-rate", rate(self.pause_rate, "pause-rate")?.as_ref());
        l.set_flag_opt("executor.concurrency", self.concurrency.as_ref());
        l.set_default("rail.stub.failure-rate", failure_default);
        l.set_default("rail.stub.drop-hold-ms", RAIL_DROP_HOLD_MS);
        l.set_default("rail.proxy.read-timeout-ms", RAIL_READ_TIMEOUT_MS);
        l.set_default("executor.concurrency", CONCURRENCY_DEFAULT);
        l.set_default("executor.lock-ttl-ms", LEASE_MS);
        l.set_default("executor.chaos.pause-rate", pause_default);
        l.set_default("executor.chaos.pause-ms", PAUSE_MS);
        l.set_default("executor.poll-interval-ms", POLL_INTERVAL_MS);
        Ok(ClusterConfig {
            data_dir,
            paydb_url: None,
            lockdb_url: None,
            ports,
            executors: self.executors,
            layers,
            profile,
            local_credentials: None,
        })
    }
}

/// Says where the local credentials are (never the tokens).
fn print_credentials(command: &str, creds: Option<&LocalCredentials>) {
    if let Some(c) = creds {
        let how = if c.created { "generated" } else { "reused" };
        println!("dlock {command}: credentials {how} in {} (worker, operator, reader; mode 0600)", c.path.display());
    }
}

/// Empties `dir` for a fresh demo run, except its credentials file (reused across runs).
fn clear_keeping_credentials(dir: &std::path::Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
    for entry in entries {
        let entry = entry.map_err(|e| format!("cannot clear {}: {e}", dir.display()))?;
        let path = entry.path();
        if entry.file_name() == crate::cluster::CREDENTIALS_FILE_NAME {
            continue;
        }
        let r = if path.is_dir() { std::fs::remove_dir_all(&path) } else { std::fs::remove_file(&path) };
        r.map_err(|e| format!("cannot clear {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Prints every disabled safety switch of `cluster` to stderr, loudly.
fn warn_unsafe(command: &str, cluster: &Cluster) {
    for w in &cluster.unsafe_warnings {
        eprintln!("dlock {command}: WARNING: SAFETY SWITCH OFF (--profile unsafe-test): {w}");
    }
}

#[derive(Debug, Clone, Args)]
pub struct UpArgs {
    /// Where the embedded SQLite databases live (paydb.sqlite, lockdb.sqlite).
    #[arg(long, value_name = "DIR", default_value = "./dlock-data")]
    pub data_dir: PathBuf,
    /// Pause between two reconciler runs, in ms.
    #[arg(long, value_name = "MS", default_value_t = 30_000)]
    pub reconcile_interval_ms: u64,
    /// paydb instead of the embedded one: sqlite://PATH or postgres://...
    #[arg(long, value_name = "URL")]
    pub paydb_url: Option<String>,
    /// lockdb instead of the embedded one: sqlite://PATH or postgres://...
    #[arg(long, value_name = "URL")]
    pub lockdb_url: Option<String>,
    #[command(flatten)]
    pub chaos: ChaosArgs,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Payouts to create and run through the cluster.
    #[arg(long, value_name = "N", default_value_t = 1_000)]
    pub payouts: usize,
    /// Accounts the payouts are spread over.
    #[arg(long, value_name = "N", default_value_t = 20)]
    pub accounts: usize,
    /// Where the demo's fresh databases go (wiped first).
    #[arg(long, value_name = "DIR", default_value = "./dlock-data/demo")]
    pub data_dir: PathBuf,
    /// Longest the run may take before it is judged as it stands, in ms.
    #[arg(long, value_name = "MS", default_value_t = 300_000)]
    pub timeout_ms: u64,
    /// Write the run's incident trace here: one JSON line per protocol event (grants,
    /// fenced writes, intents, rail calls, lease beliefs, reconciler findings), in the
    /// simulation's trace schema (docs/simulation.md "Incident trace").
    #[arg(long, value_name = "FILE.jsonl")]
    pub trace: Option<PathBuf>,
    /// Draw the run's incident trace as one self-contained HTML page here: a lane per
    /// executor with its leases and writes, the account fences and rail marks, each rail
    /// call (docs/simulation.md "Timeline"). Without `--trace` the trace is kept under the
    /// data dir as `trace.jsonl`.
    #[arg(long, value_name = "FILE.html")]
    pub timeline: Option<PathBuf>,
    #[command(flatten)]
    pub chaos: ChaosArgs,
}

/// `dlock up`: serves until SIGINT or SIGTERM, reconciling every `--reconcile-interval-ms`.
pub async fn up(a: UpArgs, layers: Layers, profile: Profile) -> Result<ExitCode, String> {
    let cfg = a.chaos.cluster(a.data_dir.clone(), Ports::DEFAULT, (0.0, 0.0), layers, profile)?;
    let cfg = ClusterConfig { paydb_url: a.paydb_url.clone(), lockdb_url: a.lockdb_url.clone(), ..cfg };
    let (cfg, creds) = cfg.with_local_credentials()?;
    // The console's settings are checked before anything is bound, as every service's.
    let scheme = dlock_rt::tls::process_scheme();
    let at =
        |port: u16| dlock_rt::http::BaseUrl::parse(&format!("{scheme}://127.0.0.1:{port}")).map_err(|e| e.to_string());
    let d = Ports::DEFAULT;
    let urls = [&at(d.lock)?, &at(d.payment)?, &at(d.proxy)?];
    crate::cluster::console_settings(&cfg.layers, profile, urls, crate::cluster::CONSOLE_PORT)?;
    let mut cluster = Cluster::start(cfg).await?;
    warn_unsafe("up", &cluster);
    print_credentials("up", creds.as_ref());
    cluster.start_executors().await?;
    println!("dlock up: paydb {}", redact(&cluster.paydb_url));
    for (name, url) in [
        ("lock-server", &cluster.lock_url),
        ("payment-resource", &cluster.payment_url),
        ("rail-proxy", &cluster.proxy_url),
        ("rail-stub", &cluster.stub_url),
    ] {
        println!("dlock {name} listening on {}", url.authority);
    }
    println!("dlock executor metrics on 127.0.0.1:{} ({} executors)", Ports::DEFAULT.executor, a.chaos.executors);
    let (console, console_url) = cluster.start_console(crate::cluster::CONSOLE_PORT).await?;
    println!(
        "dlock console on {} (sign in with the operator or reader token of the credentials file)",
        console_url.url()
    );
    println!("Ctrl-C stops everything gracefully.");
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let settings = cluster.reconcile_settings(false)?;
    let interval = a.reconcile_interval_ms.max(1_000);
    let reconciler = dlock_rt::spawn(async move {
        loop {
            crate::cluster::pause_or_stop(interval, &mut stop_rx).await;
            if *stop_rx.borrow() {
                return;
            }
            let now = dlock_rt::Clock::system().wall();
            match dlock_reconciler::cli::reconcile_once(&settings, now, Default::default()).await {
                Ok(r) if r.incidents > 0 => {
                    tracing::error!(incidents = r.incidents, warnings = r.warnings, "up_reconcile_incident");
                    eprintln!("{}", r.render_table());
                }
                Ok(r) => tracing::info!(warnings = r.warnings, payouts = r.payouts_total, "up_reconcile_clean"),
                Err(e) => tracing::warn!(cause = %e, "up_reconcile_failed"),
            }
        }
    });
    crate::cli::shutdown_signal().await;
    println!("dlock up: stopping (executors finish their payouts first)");
    let _ = stop_tx.send(true);
    let _ = reconciler.await;
    cluster.shutdown().await;
    console.stopped().await;
    Ok(ExitCode::SUCCESS)
}

/// How many payouts are in each state now (read from paydb, in process).
async fn count(cluster: &Cluster, states: &[PayoutState]) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for state in states {
        let q = ListQuery {
            state: *state,
            account_id: None,
            snapshot: dlock_payment_resource::store::snapshot_after_everything(),
            created_after: None,
            after: None,
            limit: i64::MAX,
        };
        out.push(cluster.payment.store.list(&q).await.map_err(|e| e.to_string())?.len());
    }
    Ok(out)
}

const UNSETTLED: [PayoutState; 4] =
    [PayoutState::Pending, PayoutState::Claimed, PayoutState::Submitted, PayoutState::RailAcked];

fn bar(done: usize, total: usize, elapsed: Duration, detail: &str) -> String {
    const WIDTH: usize = 30;
    let filled = (done * WIDTH).checked_div(total).unwrap_or(WIDTH).min(WIDTH);
    format!(
        "[{}{}] {done}/{total} settled {detail} {:.1}s",
        "#".repeat(filled),
        "-".repeat(WIDTH - filled),
        elapsed.as_secs_f64()
    )
}

/// The demo's seeding client: the payment client a worker holds, with a read budget for a
/// machine busy starting the cluster.
fn seeding_client(cluster: &Cluster, creds: Option<&LocalCredentials>) -> Result<PaymentClient, String> {
    let mut cfg = PaymentClientConfig::new(cluster.payment_url.clone());
    cfg.write_read_timeout_ms = 10_000;
    cfg.bearer = creds.map(|c| dlock_rt::http::Bearer::fixed(c.operator.clone()));
    PaymentClient::new(cfg)
}

/// The identity and idempotency key of one seeding write, as operator `demo`.
fn seeding(key: String) -> Result<(OwnerId, IdempotencyKey), String> {
    let owner = OwnerId::parse("demo").map_err(|e| e.to_string())?;
    Ok((owner, IdempotencyKey::parse(&key).map_err(|e| e.to_string())?))
}

/// `dlock demo`: seeds accounts and payouts, runs them through the cluster under a chaotic
/// rail and stalled executors, then judges the run with the reconciler. Exit 0 only if every
/// invariant holds.
pub async fn demo(a: DemoArgs, layers: Layers, profile: Profile) -> Result<ExitCode, String> {
    if a.payouts == 0 || a.accounts == 0 || a.accounts > a.payouts.max(1) {
        return Err("--payouts must be > 0 and --accounts 1..=payouts".into());
    }
    if a.data_dir.exists() {
        clear_keeping_credentials(&a.data_dir)?;
    }
    let cfg = a.chaos.cluster(
        a.data_dir.clone(),
        Ports::EPHEMERAL,
        (DEMO_RAIL_FAILURE_RATE, DEMO_PAUSE_RATE),
        layers,
        profile,
    )?;
    let (cfg, creds) = cfg.with_local_credentials()?;
    // `--timeline` draws from the trace: record one even without `--trace`.
    let trace_path = a.trace.clone().or_else(|| a.timeline.as_ref().map(|_| a.data_dir.join("trace.jsonl")));
    if trace_path.is_some() {
        std::fs::create_dir_all(&a.data_dir).map_err(|e| format!("cannot create {}: {e}", a.data_dir.display()))?;
    }
    let trace = match &trace_path {
        Some(path) => {
            let config = format!(
                "dlock demo --payouts {} --accounts {} --executors {}",
                a.payouts, a.accounts, a.chaos.executors
            );
            Some(crate::trace_file::TraceFile::start(path, &config)?)
        }
        None => None,
    };
    let phase = |name: &str, detail: &str| {
        if let Some(t) = &trace {
            t.phase(name, detail);
        }
    };
    // The host's clock (the seam's system clock), here and below: the demo's elapsed-time
    // report and progress bar are for the person watching and decide nothing.
    let clock = dlock_rt::Clock::system();
    let started = clock.now();
    let mut cluster = Cluster::start(cfg).await?;
    warn_unsafe("demo", &cluster);
    let stub = &cluster.stub_cfg;
    // `--executors` is 1..=16, so the first executor exists.
    let ex = cluster.executor_cfgs.first().ok_or("no executor configured")?;
    let chaos = format!(
        "rail latency {} ms, failure rate {}, duplicate-ack rate {}, decline rate {}; stalls of {} ms (lease {} ms) at rate {}",
        stub.latency_ms, stub.failure_rate, stub.duplicate_ack_rate, stub.decline_rate, ex.pause_ms, ex.lock_ttl_ms, ex.pause_rate
    );
    println!("dlock demo: {} payouts over {} accounts; {chaos}", a.payouts, a.accounts);
    for w in &cluster.unsafe_warnings {
        println!("dlock demo: SAFETY SWITCH OFF (--profile unsafe-test): {w}");
    }
    println!("data in {} (paydb.sqlite, lockdb.sqlite)", a.data_dir.display());
    print_credentials("demo", creds.as_ref());

    // Seed. Each account is funded for about 95 % of its payouts, so a few end FAILED for funds.
    phase("seed", &format!("{} accounts, {} payouts", a.accounts, a.payouts));
    let client = seeding_client(&cluster, creds.as_ref())?;
    let amount = |i: usize| 1_000 + (i as i64 % 97) * 10;
    let mut per_account = vec![0i64; a.accounts];
    for i in 0..a.payouts {
        per_account[i % a.accounts] += amount(i);
    }
    for (n, total) in per_account.iter().enumerate() {
        let body = NewAccountRequest {
            account_id: format!("acct-{n}"),
            currency: "EUR".into(),
            opening_balance_minor: total * 95 / 100,
        };
        let (owner, key) = seeding(format!("demo-open-{n}"))?;
        client.create_account(&owner, &key, &body).await.map_err(|e| e.to_string())?;
    }
    for i in 0..a.payouts {
        let body = NewPayoutRequest {
            payout_id: None,
            account_id: format!("acct-{}", i % a.accounts),
            amount_minor: amount(i),
            currency: "EUR".into(),
            beneficiary_ref: format!("ben-{i}"),
        };
        let (owner, key) = seeding(format!("demo-create-{i}"))?;
        client.create_payout(&owner, &key, &body).await.map_err(|e| e.to_string())?;
    }
    // The work queue lists what was created before its first page's millisecond.
    dlock_rt::sleep(Duration::from_millis(2)).await;
    let run_started = clock.now();
    phase("run", &format!("{} executors start", a.chaos.executors));
    cluster.start_executors().await?;

    let tty = std::io::stderr().is_terminal();
    let mut last_line = clock.now();
    let deadline = Duration::from_millis(a.timeout_ms);
    let mut settled_all = false;
    loop {
        let open = count(&cluster, &UNSETTLED).await?;
        let unsettled: usize = open.iter().sum();
        let done = a.payouts.saturating_sub(unsettled);
        let fenced: u64 = (0..3).map(|r| fenced_out(&cluster, r)).sum();
        let detail = format!("(in flight {unsettled}, fenced out {fenced})");
        let line = bar(done, a.payouts, run_started.elapsed(), &detail);
        if tty {
            eprint!("\r{line}");
            let _ = std::io::stderr().flush();
        } else if last_line.elapsed() >= Duration::from_secs(2) || unsettled == 0 {
            eprintln!("{line}");
            last_line = clock.now();
        }
        if unsettled == 0 {
            settled_all = true;
            break;
        }
        if run_started.elapsed() >= deadline {
            break;
        }
        dlock_rt::sleep(Duration::from_millis(200)).await;
    }
    if tty {
        eprintln!();
    }
    let run_time = run_started.elapsed();
    cluster.stop_executors().await;

    phase("checks", "the reconciler judges the run");
    let now = dlock_rt::Clock::system().wall();
    let report = dlock_reconciler::cli::reconcile_once(&cluster.reconcile_settings(false)?, now, Default::default())
        .await
        .map_err(|e| format!("reconcile: {e}"))?;
    let fenced = [fenced_out(&cluster, 0), fenced_out(&cluster, 1), fenced_out(&cluster, 2)];
    cluster.shutdown().await;
    if let (Some(t), Some(path)) = (trace, &trace_path) {
        let lines = t.finish()?;
        eprintln!("dlock demo: trace: {lines} lines in {}", path.display());
        if let Some(html) = &a.timeline {
            let jsonl = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let page = dlock_timeline::render_html(&jsonl).map_err(|e| format!("timeline: {e}"))?;
            std::fs::write(html, page).map_err(|e| format!("cannot write {}: {e}", html.display()))?;
            eprintln!("dlock demo: timeline: {}", html.display());
        }
    }

    println!();
    println!("payouts by final state");
    for (state, n) in &report.payouts_by_state {
        if *n > 0 || matches!(state, PayoutState::Posted | PayoutState::Failed | PayoutState::RailAmbiguous) {
            println!("  {:<16}{n:>8}", state.as_str());
        }
    }
    println!("fenced-out writes by resource (stale writers stopped)");
    for (name, n) in ["account", "ledger", "rail"].iter().zip(fenced) {
        println!("  {name:<16}{n:>8}");
    }
    println!("ambiguous payouts (quarantined; the rail's record classifies them)");
    for (class, n) in &report.ambiguous_by_class {
        println!("  {:<16}{n:>8}", format!("{class:?}"));
    }
    println!("rail calls per payout (max)      {}", report.max_rail_calls_per_payout);
    println!("ledger balanced                  {}", if report.ledger_balanced { "yes" } else { "NO" });
    println!(
        "run time                         {:.1} s ({:.0} payouts/s; {:.1} s in all)",
        run_time.as_secs_f64(),
        a.payouts as f64 / run_time.as_secs_f64().max(0.001),
        started.elapsed().as_secs_f64()
    );
    let ok = settled_all && report.exit_code() == 0 && report.max_rail_calls_per_payout <= 1 && report.ledger_balanced;
    if ok {
        println!("\ndlock demo: PASS: every invariant holds (no payout paid twice, the ledger balances)");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\n{}", report.render_table());
        if !settled_all {
            println!("dlock demo: FAIL: payouts were still in flight after {} ms", a.timeout_ms);
        } else {
            println!("dlock demo: FAIL: an invariant was broken (see the findings above)");
        }
        Ok(ExitCode::from(1))
    }
}

/// `lock_fenced_out_total{resource}` across the cluster: account and ledger (index 0, 1)
/// from the payment-resource, rail (index 2) from the proxy.
fn fenced_out(cluster: &Cluster, resource: usize) -> u64 {
    if resource == 2 {
        cluster.proxy.metrics.fenced_out.get(2)
    } else {
        cluster.payment.metrics.fenced_out.get(resource)
    }
}

/// `url` without the credentials of its user-info part, for printing.
fn redact(url: &str) -> String {
    dlock_db::redact_credentials(url)
}

#[cfg(test)]
mod tests {
    #[test]
    fn printed_database_urls_hide_their_credentials() {
        assert_eq!(super::redact("postgres://dlock:s3cret@db:5432/paydb"), "postgres://***@db:5432/paydb");
        assert_eq!(super::redact("sqlite://dlock-data/paydb.sqlite"), "sqlite://dlock-data/paydb.sqlite");
    }
}
