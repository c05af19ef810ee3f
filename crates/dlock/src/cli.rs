//! Command-line surface. Each service subcommand resolves its settings (flag, then
//! environment, then `--config` file, then default; see `config.rs`), binds, prints one line
//! `dlock <service> listening on <addr>` to stdout, and serves until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use dlock_contract::payout::PayoutState;
use dlock_rail_proxy::service::{BODY_BYTES_MAX_DEFAULT, CONNECT_TIMEOUT_MS_DEFAULT, READ_TIMEOUT_MS_DEFAULT};
use dlock_rail_proxy::store::NewPayout;
use dlock_rail_proxy::{ProxyConfig, RailProxy};
use dlock_rail_stub::{RailStub, StubConfig};
use dlock_rt::http::BaseUrl;
use dlock_rt::Clock;

use crate::config::{resolve, FileConfig, Profile};

/// The embedded default paydb.
pub const PAYDB_URL_DEFAULT: &str = "sqlite://dlock-data/paydb.sqlite";
/// The embedded default lockdb.
pub const LOCKDB_URL_DEFAULT: &str = "sqlite://dlock-data/lockdb.sqlite";

#[derive(Debug, Parser)]
#[command(name = "dlock", version, about = "Distributed locks with fencing tokens, so no payout is paid twice.")]
struct Cli {
    /// TOML file of dotted config keys; flags and environment variables override it.
    #[arg(long, global = true, env = "DLOCK_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Deployment profile: production, or unsafe-test (the only one that may disable fencing).
    #[arg(long, global = true, env = "DLOCK_PROFILE", value_name = "PROFILE")]
    profile: Option<String>,
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "DLOCK_LOG_FORMAT")]
    log_format: LogFormat,
    /// [http.header-bytes-max] Largest request header section a service accepts (431 over it).
    #[arg(long, global = true, env = "DLOCK_HTTP_HEADER_BYTES_MAX", value_name = "BYTES")]
    http_header_bytes_max: Option<usize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The hostile stand-in for the bank rail (C3 §3.6).
    RailStub(StubArgs),
    /// The only door to the rail: fences every submission on a durable high-water mark.
    RailProxy(ProxyArgs),
    /// Payouts, accounts and the ledger: fenced claim and post (C3 §3.4).
    PaymentResource(PaymentArgs),
    /// The worker: acquire, re-read, claim, submit once, post under a newer grant, release.
    Executor(ExecutorArgs),
    /// Detective check of paydb against the rail's record; reports, never repairs. Exit 0
    /// clean, 1 incident-grade finding, 3 a source could not be read.
    Reconcile(dlock_reconciler::cli::ReconcileArgs),
    /// Operator: settle a RAIL_AMBIGUOUS payout as posted or failed, from the rail's record.
    Resolve(dlock_reconciler::cli::ResolveArgs),
    /// The whole cluster in one process on the default loopback ports, over embedded SQLite
    /// under --data-dir, with executors and a periodic reconciler, until Ctrl-C.
    Up(crate::demo::UpArgs),
    /// Seed payouts, run them through the cluster under a chaotic rail and stalled executors,
    /// and judge the run with the reconciler. Exit 0 only if every invariant holds.
    Demo(crate::demo::DemoArgs),
    /// Sessions, leases and fencing tokens (C3 §3.3).
    LockServer(LockServerArgs),
    /// Apply pending database migrations, then exit.
    Migrate(MigrateArgs),
    /// Developer tools.
    #[command(subcommand)]
    Dev(DevCommand),
}

#[derive(Debug, Args)]
struct StubArgs {
    /// [rail.stub.listen] Address to serve on.
    #[arg(long, env = "DLOCK_RAIL_STUB_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// [rail.stub.latency-ms] Fixed delay before every answer.
    #[arg(long, env = "DLOCK_RAIL_STUB_LATENCY_MS", value_name = "MS")]
    latency_ms: Option<u64>,
    /// [rail.stub.failure-rate] Fraction of calls that fail (half 5xx, half dropped).
    #[arg(long, env = "DLOCK_RAIL_STUB_FAILURE_RATE", value_name = "0..1")]
    failure_rate: Option<f64>,
    /// [rail.stub.duplicate-ack-rate] Probability a repeated clientRef is paid again.
    #[arg(long, env = "DLOCK_RAIL_STUB_DUPLICATE_ACK_RATE", value_name = "0..1")]
    duplicate_ack_rate: Option<f64>,
    /// [rail.stub.decline-rate] Fraction of calls declined with 402.
    #[arg(long, env = "DLOCK_RAIL_STUB_DECLINE_RATE", value_name = "0..1")]
    decline_rate: Option<f64>,
    /// [rail.stub.drop-hold-ms] How long a dropped connection is held open first.
    #[arg(long, env = "DLOCK_RAIL_STUB_DROP_HOLD_MS", value_name = "MS")]
    drop_hold_ms: Option<u64>,
    /// [rail.stub.seed] Seed of the chaos sequence (random when absent).
    #[arg(long, env = "DLOCK_RAIL_STUB_SEED", value_name = "N")]
    seed: Option<u64>,
}

#[derive(Debug, Default, Args)]
struct ProxyArgs {
    /// [rail.proxy.listen] Address to serve on.
    #[arg(long, env = "DLOCK_RAIL_PROXY_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// [rail.proxy.database-url] paydb: sqlite://PATH or postgres://...
    #[arg(long, env = "DLOCK_RAIL_PROXY_DATABASE_URL", value_name = "URL")]
    database_url: Option<String>,
    /// [rail.proxy.rail-url] Base URL of the rail.
    #[arg(long, env = "DLOCK_RAIL_PROXY_RAIL_URL", value_name = "URL")]
    rail_url: Option<String>,
    /// [rail.proxy.connect-timeout-ms] Connect budget for the one forward.
    #[arg(long, env = "DLOCK_RAIL_PROXY_CONNECT_TIMEOUT_MS", value_name = "MS")]
    connect_timeout_ms: Option<u64>,
    /// [rail.proxy.read-timeout-ms] Read budget for the one forward.
    #[arg(long, env = "DLOCK_RAIL_PROXY_READ_TIMEOUT_MS", value_name = "MS")]
    read_timeout_ms: Option<u64>,
    /// [rail.proxy.fencing.enabled] false only under --profile unsafe-test.
    #[arg(long, env = "DLOCK_RAIL_PROXY_FENCING_ENABLED", value_name = "BOOL")]
    fencing_enabled: Option<bool>,
    /// [rail.proxy.body-bytes-max] Largest request body accepted.
    #[arg(long, env = "DLOCK_RAIL_PROXY_BODY_BYTES_MAX", value_name = "BYTES")]
    body_bytes_max: Option<usize>,
    /// [rail.proxy.duplicate-guard.enabled] false only under --profile unsafe-test: forward what step 2 refused.
    #[arg(long, env = "DLOCK_RAIL_PROXY_DUPLICATE_GUARD_ENABLED", value_name = "BOOL")]
    duplicate_guard_enabled: Option<bool>,
}

#[derive(Debug, Default, Args)]
struct PaymentArgs {
    /// [payment.resource.listen] Address to serve on.
    #[arg(long, env = "DLOCK_PAYMENT_RESOURCE_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// [payment.resource.database-url] paydb: sqlite://PATH or postgres://... (the proxy's paydb).
    #[arg(long, env = "DLOCK_PAYMENT_RESOURCE_DATABASE_URL", value_name = "URL")]
    database_url: Option<String>,
    /// [payment.resource.body-bytes-max] Largest request body accepted.
    #[arg(long, env = "DLOCK_PAYMENT_RESOURCE_BODY_BYTES_MAX", value_name = "BYTES")]
    body_bytes_max: Option<usize>,
    /// [payment.idempotency.retention-ms] How long a recorded answer is replayed (60000..=604800000).
    #[arg(long, env = "DLOCK_PAYMENT_IDEMPOTENCY_RETENTION_MS", value_name = "MS")]
    idempotency_retention_ms: Option<u64>,
    /// [payment.idempotency.purge-interval-ms] Pause between purges of expired records.
    #[arg(long, env = "DLOCK_PAYMENT_IDEMPOTENCY_PURGE_INTERVAL_MS", value_name = "MS")]
    idempotency_purge_interval_ms: Option<u64>,
    /// [payment.idempotency.purge-batch-max] Records one purge statement deletes at most.
    #[arg(long, env = "DLOCK_PAYMENT_IDEMPOTENCY_PURGE_BATCH_MAX", value_name = "N")]
    idempotency_purge_batch_max: Option<i64>,
}

#[derive(Debug, Default, Args)]
struct ExecutorArgs {
    /// [executor.listen] Address of the executor's /metrics and /health endpoints.
    #[arg(long, env = "DLOCK_EXECUTOR_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// [executor.lock-url] The lock server.
    #[arg(long, env = "DLOCK_EXECUTOR_LOCK_URL", value_name = "URL")]
    lock_url: Option<String>,
    /// [executor.payment-url] The payment-resource.
    #[arg(long, env = "DLOCK_EXECUTOR_PAYMENT_URL", value_name = "URL")]
    payment_url: Option<String>,
    /// [executor.proxy-url] The rail-proxy.
    #[arg(long, env = "DLOCK_EXECUTOR_PROXY_URL", value_name = "URL")]
    proxy_url: Option<String>,
    /// [executor.owner-id] X-Owner-Id of this process; each task appends /N.
    #[arg(long, env = "DLOCK_EXECUTOR_OWNER_ID", value_name = "ID")]
    owner_id: Option<String>,
    /// [executor.concurrency] Worker tasks in this process.
    #[arg(long, env = "DLOCK_EXECUTOR_CONCURRENCY", value_name = "N")]
    concurrency: Option<usize>,
    /// [executor.poll-interval-ms] Pause after a scan that found nothing to do.
    #[arg(long, env = "DLOCK_EXECUTOR_POLL_INTERVAL_MS", value_name = "MS")]
    poll_interval_ms: Option<u64>,
    /// [executor.batch-max] Payouts read per state per scan.
    #[arg(long, env = "DLOCK_EXECUTOR_BATCH_MAX", value_name = "N")]
    batch_max: Option<u32>,
    /// [executor.lock-ttl-ms] Lease asked for on each grant (70 % of it is the local deadline).
    #[arg(long, env = "DLOCK_EXECUTOR_LOCK_TTL_MS", value_name = "MS")]
    lock_ttl_ms: Option<u64>,
    /// [executor.write.connect-timeout-ms] Claim and post: connect budget.
    #[arg(long, env = "DLOCK_EXECUTOR_WRITE_CONNECT_TIMEOUT_MS", value_name = "MS")]
    write_connect_timeout_ms: Option<u64>,
    /// [executor.write.read-timeout-ms] Claim and post: read budget.
    #[arg(long, env = "DLOCK_EXECUTOR_WRITE_READ_TIMEOUT_MS", value_name = "MS")]
    write_read_timeout_ms: Option<u64>,
    /// [executor.write.retries-max] Claim and post: retries on 503 or a connect failure only.
    #[arg(long, env = "DLOCK_EXECUTOR_WRITE_RETRIES_MAX", value_name = "N")]
    write_retries_max: Option<u32>,
    /// [executor.submit.connect-timeout-ms] Submission to the rail-proxy: connect budget.
    #[arg(long, env = "DLOCK_EXECUTOR_SUBMIT_CONNECT_TIMEOUT_MS", value_name = "MS")]
    submit_connect_timeout_ms: Option<u64>,
    /// [executor.submit.read-timeout-ms] Submission: read budget (the rail's read timeout + 2 s). Never retried.
    #[arg(long, env = "DLOCK_EXECUTOR_SUBMIT_READ_TIMEOUT_MS", value_name = "MS")]
    submit_read_timeout_ms: Option<u64>,
    /// [executor.read.connect-timeout-ms] Advisory GETs: connect budget.
    #[arg(long, env = "DLOCK_EXECUTOR_READ_CONNECT_TIMEOUT_MS", value_name = "MS")]
    read_connect_timeout_ms: Option<u64>,
    /// [executor.read.read-timeout-ms] Advisory GETs: read budget.
    #[arg(long, env = "DLOCK_EXECUTOR_READ_READ_TIMEOUT_MS", value_name = "MS")]
    read_read_timeout_ms: Option<u64>,
    /// [executor.read.tries-max] Advisory GETs: tries, the first included.
    #[arg(long, env = "DLOCK_EXECUTOR_READ_TRIES_MAX", value_name = "N")]
    read_tries_max: Option<u32>,
    /// [payment.fencing.enabled] false only under --profile unsafe-test: write without checking the lease.
    #[arg(long, env = "DLOCK_PAYMENT_FENCING_ENABLED", value_name = "BOOL")]
    fencing_enabled: Option<bool>,
    /// [executor.chaos.pause-rate] Chaos: chance of a stall between the lease check and each fenced write.
    #[arg(long, env = "DLOCK_EXECUTOR_CHAOS_PAUSE_RATE", value_name = "0..1")]
    pause_rate: Option<f64>,
    /// [executor.chaos.pause-ms] Chaos: how long an injected stall lasts.
    #[arg(long, env = "DLOCK_EXECUTOR_CHAOS_PAUSE_MS", value_name = "MS")]
    pause_ms: Option<u64>,
    /// [executor.chaos.pause-hops] Chaos: the writes a stall may precede, e.g. claim,submit,post.
    #[arg(long, env = "DLOCK_EXECUTOR_CHAOS_PAUSE_HOPS", value_name = "HOPS")]
    pause_hops: Option<String>,
}

#[derive(Debug, Default, Args)]
struct LockServerArgs {
    /// [lock.server.listen] Address to serve on.
    #[arg(long, env = "DLOCK_LOCK_SERVER_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// [lock.server.backend] sqlite, postgres or etcd (default: from --database-url, else sqlite).
    #[arg(long, env = "DLOCK_LOCK_SERVER_BACKEND", value_name = "BACKEND")]
    backend: Option<String>,
    /// [lock.server.database-url] lockdb: sqlite://PATH or postgres://...
    #[arg(long, env = "DLOCK_LOCK_SERVER_DATABASE_URL", value_name = "URL")]
    database_url: Option<String>,
    /// [lock.server.etcd-endpoints] Comma-separated etcd endpoints (backend etcd).
    #[arg(long, env = "DLOCK_LOCK_SERVER_ETCD_ENDPOINTS", value_name = "URLS")]
    etcd_endpoints: Option<String>,
    /// [lock.server.etcd-prefix] Key prefix of this lock service's records in etcd.
    #[arg(long, env = "DLOCK_LOCK_SERVER_ETCD_PREFIX", value_name = "PREFIX")]
    etcd_prefix: Option<String>,
    /// [lock.session.ttl-ms] Session TTL when L1 names none (clamped to 1000..60000).
    #[arg(long, env = "DLOCK_LOCK_SESSION_TTL_MS", value_name = "MS")]
    session_ttl_ms: Option<i64>,
    /// [lock.default.ttl-ms] Lock lease when L4 names none (clamped to 1000..60000).
    #[arg(long, env = "DLOCK_LOCK_DEFAULT_TTL_MS", value_name = "MS")]
    default_ttl_ms: Option<i64>,
    /// [lock.delay-ms] After a holder is lost (not released), nobody gets the key for this long.
    #[arg(long, env = "DLOCK_LOCK_DELAY_MS", value_name = "MS")]
    delay_ms: Option<i64>,
    /// [lock.waiters-max] Waiters per key on this replica; beyond it, CONTENTION_EXCEEDED.
    #[arg(long, env = "DLOCK_LOCK_WAITERS_MAX", value_name = "N")]
    waiters_max: Option<usize>,
    /// [lock.session.retention-ms] How long a lapsed session answers SESSION_EXPIRED.
    #[arg(long, env = "DLOCK_LOCK_SESSION_RETENTION_MS", value_name = "MS")]
    session_retention_ms: Option<i64>,
    /// [lock.reaper.interval-ms] Pause between reaper passes.
    #[arg(long, env = "DLOCK_LOCK_REAPER_INTERVAL_MS", value_name = "MS")]
    reaper_interval_ms: Option<u64>,
    /// [lock.wait.poll-ms] How often a waiting request re-asks the backend.
    #[arg(long, env = "DLOCK_LOCK_WAIT_POLL_MS", value_name = "MS")]
    wait_poll_ms: Option<u64>,
}

#[derive(Debug, Args)]
struct MigrateArgs {
    /// The database: sqlite://PATH or postgres://... (default: the key rail.proxy.database-url
    /// for paydb or lock.server.database-url for lockdb, from the environment or --config).
    #[arg(long, value_name = "URL")]
    database_url: Option<String>,
    /// Which database to migrate: paydb or lockdb.
    #[arg(long = "db", value_enum, default_value_t = MigrateDb::Paydb)]
    db: MigrateDb,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum MigrateDb {
    Paydb,
    Lockdb,
}

#[derive(Debug, Subcommand)]
enum DevCommand {
    /// Insert a payout into paydb (until the payment-resource owns payout creation).
    SeedPayout(SeedArgs),
}

#[derive(Debug, Args)]
struct SeedArgs {
    #[arg(long, env = "DLOCK_RAIL_PROXY_DATABASE_URL", value_name = "URL")]
    database_url: Option<String>,
    /// Payout id (a UUID); random when absent.
    #[arg(long)]
    payout_id: Option<uuid::Uuid>,
    #[arg(long)]
    account: String,
    #[arg(long)]
    amount_minor: i64,
    #[arg(long, default_value = "EUR")]
    currency: String,
    #[arg(long, default_value = "beneficiary-1")]
    beneficiary_ref: String,
    /// Initial state, e.g. CLAIMED (what the proxy accepts) or PENDING.
    #[arg(long, default_value = "CLAIMED")]
    state: String,
}

/// The command line, with the environment's values hidden from every help text: an
/// argument such as `--database-url` may carry a password in `DLOCK_*_DATABASE_URL`, and
/// `--help` must never print it. Applied to every argument of every subcommand, so a new
/// argument cannot forget it.
fn command() -> clap::Command {
    fn hide_env_values(cmd: clap::Command) -> clap::Command {
        cmd.mut_args(|a| a.hide_env_values(true)).mut_subcommands(hide_env_values)
    }
    hide_env_values(<Cli as clap::CommandFactory>::command())
}

/// `http.header-bytes-max`, resolved once at start-up for every service this process serves.
static HEADER_BYTES_MAX: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

pub fn main() -> ExitCode {
    let cli = match <Cli as clap::FromArgMatches>::from_arg_matches(&command().get_matches()) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    };
    // The demo and the operator tools report on stdout; their events stay quiet unless
    // DLOCK_LOG asks for them. Services log at info.
    let default_filter = match cli.command {
        Command::Demo(_) => "off",
        Command::Reconcile(_) | Command::Resolve(_) => "warn",
        _ => "info",
    };
    init_logging(cli.log_format, default_filter);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dlock: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dlock: {}", dlock_db::redact_credentials(&e));
            ExitCode::from(2)
        }
    }
}

fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_ansi(ansi).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

/// The paydb URL the operator tools default to: `payment.resource.database-url` (flag-less:
/// its environment variable, then the file, then the embedded default).
fn paydb_url_default(file: &FileConfig) -> Result<String, String> {
    let env = std::env::var(crate::config::env_name("payment.resource.database-url")).ok();
    resolve(env, file, "payment.resource.database-url", PAYDB_URL_DEFAULT.to_owned())
}

async fn run(cli: Cli) -> Result<ExitCode, String> {
    let file = FileConfig::load(cli.config.as_deref())?;
    let profile: Profile =
        resolve(cli.profile.as_deref().map(str::parse).transpose()?, &file, "profile", Profile::Production)?;
    let header_bytes_max =
        resolve(cli.http_header_bytes_max, &file, "http.header-bytes-max", dlock_rt::http::HEADER_BYTES_MAX_DEFAULT)?;
    use dlock_rt::http::{HEADER_BYTES_MAX_CEILING, HEADER_BYTES_MAX_FLOOR};
    if !(HEADER_BYTES_MAX_FLOOR..=HEADER_BYTES_MAX_CEILING).contains(&header_bytes_max) {
        return Err(format!(
            "http.header-bytes-max must be {HEADER_BYTES_MAX_FLOOR} to {HEADER_BYTES_MAX_CEILING} bytes, not {header_bytes_max}"
        ));
    }
    let _ = HEADER_BYTES_MAX.set(header_bytes_max);
    match cli.command {
        Command::Reconcile(a) => {
            use dlock_reconciler::reconcile::{ACKED_UNPOSTED_MS_MAX_DEFAULT, INTENT_UNRESOLVED_MS_MAX_DEFAULT};
            let rail_env = std::env::var(crate::config::env_name("rail.proxy.rail-url")).ok();
            let rail =
                resolve(rail_env, &file, "rail.proxy.rail-url", dlock_reconciler::cli::RAIL_URL_DEFAULT.to_owned())?;
            let s = dlock_reconciler::cli::ReconcileSettings {
                database_url: resolve(
                    a.database_url.clone(),
                    &file,
                    "reconcile.database-url",
                    paydb_url_default(&file)?,
                )?,
                rail_url: resolve(a.rail_url.clone(), &file, "reconcile.rail-url", rail)?,
                json: a.json,
                bounds: dlock_reconciler::Bounds {
                    intent_unresolved_ms_max: resolve(
                        a.intent_unresolved_ms_max,
                        &file,
                        "reconcile.intent-unresolved-ms-max",
                        INTENT_UNRESOLVED_MS_MAX_DEFAULT,
                    )?,
                    acked_unposted_ms_max: resolve(
                        a.acked_unposted_ms_max,
                        &file,
                        "reconcile.acked-unposted-ms-max",
                        ACKED_UNPOSTED_MS_MAX_DEFAULT,
                    )?,
                },
            };
            return Ok(dlock_reconciler::cli::run_reconcile(&s).await);
        }
        Command::Resolve(a) => {
            let url = resolve(a.database_url.clone(), &file, "resolve.database-url", paydb_url_default(&file)?)?;
            return Ok(dlock_reconciler::cli::run_resolve(&a, &url).await);
        }
        Command::Up(a) => return crate::demo::up(a).await,
        Command::Demo(a) => return crate::demo::demo(a).await,
        _ => {}
    }
    run_service(cli.command, &file, profile).await.map(|()| ExitCode::SUCCESS)
}

async fn run_service(command: Command, file: &FileConfig, profile: Profile) -> Result<(), String> {
    match command {
        Command::Reconcile(_) | Command::Resolve(_) | Command::Up(_) | Command::Demo(_) => Ok(()),
        Command::RailStub(a) => run_stub(a, file).await,
        Command::RailProxy(a) => run_proxy(a, file, profile).await,
        Command::PaymentResource(a) => run_payment_resource(a, file).await,
        Command::Executor(a) => run_executor(a, file, profile).await,
        Command::LockServer(a) => run_lock_server(a, file).await,
        Command::Migrate(a) => {
            let (name, versions) = match a.db {
                MigrateDb::Paydb => {
                    let url = a
                        .database_url
                        .or_else(|| std::env::var(crate::config::env_name("rail.proxy.database-url")).ok());
                    let url = resolve(url, file, "rail.proxy.database-url", PAYDB_URL_DEFAULT.to_owned())?;
                    ("paydb", dlock_rail_proxy::store_sql::migrate(&url).await.map_err(|e| e.to_string())?)
                }
                MigrateDb::Lockdb => {
                    let url = a
                        .database_url
                        .or_else(|| std::env::var(crate::config::env_name("lock.server.database-url")).ok());
                    let url = resolve(url, file, "lock.server.database-url", LOCKDB_URL_DEFAULT.to_owned())?;
                    ("lockdb", dlock_lock_server::store_sql::migrate(&url).await.map_err(|e| e.to_string())?)
                }
            };
            let list = versions.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
            println!("{name} migrations applied: {list}");
            Ok(())
        }
        Command::Dev(DevCommand::SeedPayout(a)) => seed_payout(a, file).await,
    }
}

fn stub_config(a: &StubArgs, file: &FileConfig) -> Result<(SocketAddr, StubConfig), String> {
    let d = StubConfig::default();
    let listen = resolve(a.listen, file, "rail.stub.listen", SocketAddr::from(([127, 0, 0, 1], 8084)))?;
    let seed = match (a.seed, file.get::<u64>("rail.stub.seed")?) {
        (Some(s), _) | (None, Some(s)) => s,
        (None, None) => dlock_rt::rand::random_u64(),
    };
    let cfg = StubConfig {
        latency_ms: resolve(a.latency_ms, file, "rail.stub.latency-ms", d.latency_ms)?,
        failure_rate: resolve(a.failure_rate, file, "rail.stub.failure-rate", d.failure_rate)?,
        duplicate_ack_rate: resolve(a.duplicate_ack_rate, file, "rail.stub.duplicate-ack-rate", d.duplicate_ack_rate)?,
        decline_rate: resolve(a.decline_rate, file, "rail.stub.decline-rate", d.decline_rate)?,
        drop_hold_ms: resolve(a.drop_hold_ms, file, "rail.stub.drop-hold-ms", d.drop_hold_ms)?,
        seed,
    };
    cfg.validate()?;
    Ok((listen, cfg))
}

async fn run_stub(a: StubArgs, file: &FileConfig) -> Result<(), String> {
    let (listen, cfg) = stub_config(&a, file)?;
    tracing::info!(
        seed = cfg.seed,
        latencyMs = cfg.latency_ms,
        failureRate = cfg.failure_rate,
        duplicateAckRate = cfg.duplicate_ack_rate,
        declineRate = cfg.decline_rate,
        "rail_stub_starting"
    );
    let stub = RailStub::new(cfg, Clock::system());
    serve("rail-stub", listen, dlock_rail_stub::router(stub), dlock_rt::http::SHUTDOWN_GRACE_MS_DEFAULT).await
}

fn proxy_config(
    a: &ProxyArgs,
    file: &FileConfig,
    profile: Profile,
) -> Result<(SocketAddr, String, ProxyConfig), String> {
    let listen = resolve(a.listen, file, "rail.proxy.listen", SocketAddr::from(([127, 0, 0, 1], 8083)))?;
    let url = resolve(a.database_url.clone(), file, "rail.proxy.database-url", PAYDB_URL_DEFAULT.to_owned())?;
    let rail = resolve(a.rail_url.clone(), file, "rail.proxy.rail-url", "http://127.0.0.1:8084".to_owned())?;
    let fencing_enabled = resolve(a.fencing_enabled, file, "rail.proxy.fencing.enabled", true)?;
    if !fencing_enabled && profile != Profile::UnsafeTest {
        return Err("rail.proxy.fencing.enabled=false is refused outside --profile unsafe-test: \
                    without the fence a stale writer can move money"
            .into());
    }
    let duplicate_guard_enabled = resolve(a.duplicate_guard_enabled, file, "rail.proxy.duplicate-guard.enabled", true)?;
    if !duplicate_guard_enabled && profile != Profile::UnsafeTest {
        return Err("rail.proxy.duplicate-guard.enabled=false is refused outside --profile unsafe-test: \
                    without it a payout can reach the rail twice"
            .into());
    }
    let cfg = ProxyConfig {
        rail_url: BaseUrl::parse(&rail).map_err(|e| format!("rail.proxy.rail-url: {e}"))?,
        connect_timeout_ms: resolve(
            a.connect_timeout_ms,
            file,
            "rail.proxy.connect-timeout-ms",
            CONNECT_TIMEOUT_MS_DEFAULT,
        )?,
        read_timeout_ms: resolve(a.read_timeout_ms, file, "rail.proxy.read-timeout-ms", READ_TIMEOUT_MS_DEFAULT)?,
        fencing_enabled,
        duplicate_guard_enabled,
        body_bytes_max: resolve(a.body_bytes_max, file, "rail.proxy.body-bytes-max", BODY_BYTES_MAX_DEFAULT)?,
    };
    Ok((listen, url, cfg))
}

async fn run_proxy(a: ProxyArgs, file: &FileConfig, profile: Profile) -> Result<(), String> {
    let (listen, url, cfg) = proxy_config(&a, file, profile)?;
    if !cfg.fencing_enabled {
        tracing::warn!(
            profile = "unsafe-test",
            skipped = "step 1 (the high-water mark)",
            "rail_proxy_fencing_disabled"
        );
    }
    if !cfg.duplicate_guard_enabled {
        tracing::warn!(
            profile = "unsafe-test",
            skipped = "step 2 (one attempt per payout)",
            "rail_proxy_duplicate_guard_disabled"
        );
    }
    let store = dlock_rail_proxy::store_sql::open(&url).await.map_err(|e| format!("paydb: {e}"))?;
    let grace_ms = cfg.shutdown_grace_ms();
    let proxy = RailProxy::new(store, cfg, Clock::system());
    let sweeper = dlock_rt::spawn(proxy.clone().run_orphan_sweeper());
    let result = serve("rail-proxy", listen, dlock_rail_proxy::router(proxy), grace_ms).await;
    sweeper.abort();
    result
}

fn payment_config(
    a: &PaymentArgs,
    file: &FileConfig,
) -> Result<(SocketAddr, String, dlock_payment_resource::PaymentConfig), String> {
    let d = dlock_payment_resource::PaymentConfig::default();
    let listen = resolve(a.listen, file, "payment.resource.listen", SocketAddr::from(([127, 0, 0, 1], 8082)))?;
    let url = resolve(a.database_url.clone(), file, "payment.resource.database-url", PAYDB_URL_DEFAULT.to_owned())?;
    let cfg = dlock_payment_resource::PaymentConfig {
        body_bytes_max: resolve(a.body_bytes_max, file, "payment.resource.body-bytes-max", d.body_bytes_max)?,
        idempotency_retention_ms: resolve(
            a.idempotency_retention_ms,
            file,
            "payment.idempotency.retention-ms",
            d.idempotency_retention_ms,
        )?,
        purge_interval_ms: resolve(
            a.idempotency_purge_interval_ms,
            file,
            "payment.idempotency.purge-interval-ms",
            d.purge_interval_ms,
        )?,
        purge_batch_max: resolve(
            a.idempotency_purge_batch_max,
            file,
            "payment.idempotency.purge-batch-max",
            d.purge_batch_max,
        )?,
    };
    cfg.validate()?;
    Ok((listen, url, cfg))
}

async fn run_payment_resource(a: PaymentArgs, file: &FileConfig) -> Result<(), String> {
    let (listen, url, cfg) = payment_config(&a, file)?;
    let store = dlock_payment_resource::store_sql::open(&url).await.map_err(|e| format!("paydb: {e}"))?;
    let pr = dlock_payment_resource::PaymentResource::start(store, cfg, Clock::system())
        .await
        .map_err(|e| format!("paydb: {e}"))?;
    let purger = dlock_rt::spawn(pr.clone().run_purger());
    let grace = dlock_payment_resource::service::SHUTDOWN_GRACE_MS_MAX;
    let result = serve("payment-resource", listen, dlock_payment_resource::router(pr), grace).await;
    purger.abort();
    result
}

fn executor_config(
    a: &ExecutorArgs,
    file: &FileConfig,
    profile: Profile,
) -> Result<(SocketAddr, dlock_executor::ExecutorConfig), String> {
    use dlock_executor::ExecutorConfig;
    let listen = resolve(a.listen, file, "executor.listen", SocketAddr::from(([127, 0, 0, 1], 8085)))?;
    let url = |v: &Option<String>, key: &str, default: &str| -> Result<BaseUrl, String> {
        let raw = resolve(v.clone(), file, key, default.to_owned())?;
        BaseUrl::parse(&raw).map_err(|e| format!("{key}: {e}"))
    };
    let owner = resolve(a.owner_id.clone(), file, "executor.owner-id", "executor".to_owned())?;
    let owner = dlock_contract::OwnerId::parse(&owner).map_err(|e| format!("executor.owner-id: {e}"))?;
    let mut cfg = ExecutorConfig::new(
        url(&a.lock_url, "executor.lock-url", "http://127.0.0.1:8081")?,
        url(&a.payment_url, "executor.payment-url", "http://127.0.0.1:8082")?,
        url(&a.proxy_url, "executor.proxy-url", "http://127.0.0.1:8083")?,
        owner,
    );
    cfg.concurrency = resolve(a.concurrency, file, "executor.concurrency", cfg.concurrency)?;
    cfg.poll_interval_ms = resolve(a.poll_interval_ms, file, "executor.poll-interval-ms", cfg.poll_interval_ms)?;
    cfg.batch_max = resolve(a.batch_max, file, "executor.batch-max", cfg.batch_max)?;
    cfg.lock_ttl_ms = resolve(a.lock_ttl_ms, file, "executor.lock-ttl-ms", cfg.lock_ttl_ms)?;
    cfg.write_connect_timeout_ms =
        resolve(a.write_connect_timeout_ms, file, "executor.write.connect-timeout-ms", cfg.write_connect_timeout_ms)?;
    cfg.write_read_timeout_ms =
        resolve(a.write_read_timeout_ms, file, "executor.write.read-timeout-ms", cfg.write_read_timeout_ms)?;
    cfg.write_retries_max = resolve(a.write_retries_max, file, "executor.write.retries-max", cfg.write_retries_max)?;
    cfg.submit_connect_timeout_ms = resolve(
        a.submit_connect_timeout_ms,
        file,
        "executor.submit.connect-timeout-ms",
        cfg.submit_connect_timeout_ms,
    )?;
    cfg.submit_read_timeout_ms =
        resolve(a.submit_read_timeout_ms, file, "executor.submit.read-timeout-ms", cfg.submit_read_timeout_ms)?;
    cfg.read_connect_timeout_ms =
        resolve(a.read_connect_timeout_ms, file, "executor.read.connect-timeout-ms", cfg.read_connect_timeout_ms)?;
    cfg.read_read_timeout_ms =
        resolve(a.read_read_timeout_ms, file, "executor.read.read-timeout-ms", cfg.read_read_timeout_ms)?;
    cfg.read_tries_max = resolve(a.read_tries_max, file, "executor.read.tries-max", cfg.read_tries_max)?;
    cfg.fencing_enabled = resolve(a.fencing_enabled, file, "payment.fencing.enabled", true)?;
    cfg.pause_rate = resolve(a.pause_rate, file, "executor.chaos.pause-rate", cfg.pause_rate)?;
    cfg.pause_ms = resolve(a.pause_ms, file, "executor.chaos.pause-ms", cfg.pause_ms)?;
    let hops = resolve(a.pause_hops.clone(), file, "executor.chaos.pause-hops", "claim,submit,post".to_owned())?;
    cfg.pause_hops = dlock_executor::config::parse_hops(&hops)?;
    if !cfg.fencing_enabled && profile != Profile::UnsafeTest {
        return Err("payment.fencing.enabled=false is refused outside --profile unsafe-test: \
                    a worker that writes past its lease can move money twice"
            .into());
    }
    cfg.validate()?;
    Ok((listen, cfg))
}

async fn run_executor(a: ExecutorArgs, file: &FileConfig, profile: Profile) -> Result<(), String> {
    let (listen, cfg) = executor_config(&a, file, profile)?;
    if !cfg.fencing_enabled {
        tracing::warn!(profile = "unsafe-test", skipped = "the local lease deadline", "executor_fencing_disabled");
    }
    if cfg.pause_rate > 0.0 {
        tracing::warn!(pauseRate = cfg.pause_rate, pauseMs = cfg.pause_ms, "executor_chaos_stalls_enabled");
    }
    let executor = dlock_executor::Executor::new(cfg, Clock::system())?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let worker = dlock_rt::spawn(executor.clone().run(stop_rx));
    let result = serve("executor", listen, dlock_executor::router(executor), 1_000).await;
    // Serving stopped (SIGINT or SIGTERM): let each task finish its payout, then exit.
    let _ = stop_tx.send(true);
    let _ = worker.await;
    result
}

fn lock_server_config(
    a: &LockServerArgs,
    file: &FileConfig,
) -> Result<(SocketAddr, LockBackend, dlock_lock_server::service::LockServerConfig), String> {
    use dlock_lock_server::service::LockServerConfig;
    let d = LockServerConfig::default();
    let listen = resolve(a.listen, file, "lock.server.listen", SocketAddr::from(([127, 0, 0, 1], 8081)))?;
    let url = resolve(a.database_url.clone(), file, "lock.server.database-url", LOCKDB_URL_DEFAULT.to_owned())?;
    let backend = match (a.backend.clone(), file.get::<String>("lock.server.backend")?) {
        (Some(b), _) | (None, Some(b)) => b,
        (None, None) => if url.starts_with("postgres") { "postgres" } else { "sqlite" }.to_owned(),
    };
    let backend = match (backend.as_str(), dlock_db::Dialect::of_url(&url)) {
        ("sqlite", Ok(dlock_db::Dialect::Sqlite)) | ("postgres", Ok(dlock_db::Dialect::Postgres)) => {
            LockBackend::Sql(url)
        }
        ("etcd", _) => {
            let endpoints = resolve(a.etcd_endpoints.clone(), file, "lock.server.etcd-endpoints", String::new())?;
            let endpoints: Vec<String> =
                endpoints.split(',').map(str::trim).filter(|e| !e.is_empty()).map(str::to_owned).collect();
            if endpoints.is_empty() {
                return Err("lock.server.backend=etcd needs --etcd-endpoints http://HOST:PORT[,...]".into());
            }
            let prefix = resolve(
                a.etcd_prefix.clone(),
                file,
                "lock.server.etcd-prefix",
                dlock_lock_server::store_etcd::DEFAULT_PREFIX.to_owned(),
            )?;
            if !prefix.starts_with('/') || prefix.len() < 2 {
                return Err("lock.server.etcd-prefix must start with / and name something, e.g. /dlock".into());
            }
            LockBackend::Etcd(endpoints, prefix)
        }
        ("sqlite" | "postgres", _) => {
            return Err(format!(
                "lock.server.backend={backend} does not match lock.server.database-url {}",
                dlock_db::redact_credentials(&url)
            ))
        }
        (other, _) => return Err(format!("unknown lock.server.backend {other:?} (sqlite, postgres, etcd)")),
    };
    let cfg = LockServerConfig {
        session_ttl_ms_default: resolve(a.session_ttl_ms, file, "lock.session.ttl-ms", d.session_ttl_ms_default)?,
        lock_ttl_ms_default: resolve(a.default_ttl_ms, file, "lock.default.ttl-ms", d.lock_ttl_ms_default)?,
        delay_ms: resolve(a.delay_ms, file, "lock.delay-ms", d.delay_ms)?.max(0),
        waiters_per_key_max: resolve(a.waiters_max, file, "lock.waiters-max", d.waiters_per_key_max)?,
        session_retention_ms: resolve(
            a.session_retention_ms,
            file,
            "lock.session.retention-ms",
            d.session_retention_ms,
        )?,
        reap_interval_ms: resolve(a.reaper_interval_ms, file, "lock.reaper.interval-ms", d.reap_interval_ms)?,
        reap_batch_max: d.reap_batch_max,
        wait_poll_ms: resolve(a.wait_poll_ms, file, "lock.wait.poll-ms", d.wait_poll_ms)?,
    };
    Ok((listen, backend, cfg))
}

/// Where the lock server keeps its state.
#[derive(Debug, Clone, PartialEq, Eq)]
enum LockBackend {
    /// lockdb on SQLite or PostgreSQL, at this URL.
    Sql(String),
    /// etcd, at these endpoints, under this key prefix.
    Etcd(Vec<String>, String),
}

async fn run_lock_server(a: LockServerArgs, file: &FileConfig) -> Result<(), String> {
    let (listen, backend, cfg) = lock_server_config(&a, file)?;
    let store: std::sync::Arc<dyn dlock_lock_server::store::LockStore> = match backend {
        LockBackend::Sql(url) => dlock_lock_server::store_sql::open(&url).await.map_err(|e| format!("lockdb: {e}"))?,
        LockBackend::Etcd(endpoints, prefix) => std::sync::Arc::new(
            dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, &prefix)
                .await
                .map_err(|e| format!("etcd: {e}"))?,
        ),
    };
    let server = dlock_lock_server::service::LockServer::new(store, cfg, Clock::system());
    let reaper = dlock_rt::spawn(server.clone().run_reaper());
    let grace = dlock_contract::lock::WAIT_MS_MAX as u64 + 1_000;
    let result = serve("lock-server", listen, dlock_lock_server::app::router(server), grace).await;
    reaper.abort();
    result
}

async fn seed_payout(a: SeedArgs, file: &FileConfig) -> Result<(), String> {
    let url = resolve(a.database_url, file, "rail.proxy.database-url", PAYDB_URL_DEFAULT.to_owned())?;
    let state = PayoutState::parse(&a.state).ok_or_else(|| format!("unknown payout state {:?}", a.state))?;
    if !dlock_contract::rail::is_account_id(&a.account) {
        return Err("--account must be 1 to 64 characters of [a-zA-Z0-9:._-]".into());
    }
    if a.amount_minor <= 0 || !dlock_contract::currency::is_iso_4217(&a.currency) {
        return Err("--amount-minor must be > 0 and --currency an ISO 4217 code".into());
    }
    let store = dlock_rail_proxy::store_sql::open(&url).await.map_err(|e| format!("paydb: {e}"))?;
    let payout_id = a.payout_id.unwrap_or_else(dlock_rt::rand::uuid_v4);
    let p = NewPayout {
        payout_id,
        account_id: a.account,
        amount_minor: a.amount_minor,
        currency: a.currency,
        beneficiary_ref: a.beneficiary_ref,
        state,
    };
    store.insert_payout(&p, Clock::system().wall()).await.map_err(|e| e.to_string())?;
    println!("{payout_id}");
    Ok(())
}

async fn serve(name: &str, listen: SocketAddr, router: axum::Router, grace_ms: u64) -> Result<(), String> {
    let listener = dlock_rt::http::bind(listen).await.map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("dlock {name} listening on {local}");
    tracing::info!(service = name, addr = %local, "listening");
    let limits = dlock_rt::http::ServeLimits {
        grace_ms_max: grace_ms,
        header_bytes_max: HEADER_BYTES_MAX.get().copied().unwrap_or(dlock_rt::http::HEADER_BYTES_MAX_DEFAULT),
    };
    dlock_rt::http::serve_with_limits(listener, router, shutdown_signal(), limits).await;
    tracing::info!(service = name, "stopped");
    Ok(())
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
        command().debug_assert();
    }

    #[test]
    fn no_help_text_shows_an_environment_value() {
        fn check(cmd: &clap::Command, path: &str) -> usize {
            let mut n = 0;
            for arg in cmd.get_arguments() {
                if arg.get_env().is_some() {
                    assert!(arg.is_hide_env_values_set(), "{path} --{:?} would print its env value", arg.get_long());
                    n += 1;
                }
            }
            n + cmd.get_subcommands().map(|s| check(s, &format!("{path} {}", s.get_name()))).sum::<usize>()
        }
        assert!(check(&command(), "dlock") > 10);
    }

    #[test]
    fn every_config_flag_reads_the_environment_variable_named_after_its_key() {
        let cmd = Cli::command();
        let mut checked = 0;
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(help) = arg.get_help().map(|h| h.to_string()) else { continue };
                let Some(key) = help.strip_prefix('[').and_then(|h| h.split(']').next()) else { continue };
                assert!(crate::config::KNOWN_KEYS.contains(&key), "{key} is not a known key");
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                assert_eq!(env, Some(crate::config::env_name(key)), "flag --{:?}", arg.get_long());
                checked += 1;
            }
        }
        assert!(checked >= 15, "only {checked} keyed flags found");
    }

    #[test]
    fn an_executor_without_fencing_refuses_to_start_outside_unsafe_test() {
        let args = ExecutorArgs { fencing_enabled: Some(false), ..ExecutorArgs::default() };
        let file = FileConfig::default();
        let err = executor_config(&args, &file, Profile::Production).expect_err("refused");
        assert!(err.contains("payment.fencing.enabled") && err.contains("unsafe-test"), "{err}");
        let (_, cfg) = executor_config(&args, &file, Profile::UnsafeTest).expect("allowed in unsafe-test");
        assert!(!cfg.fencing_enabled);
        let (_, cfg) = executor_config(&ExecutorArgs::default(), &file, Profile::Production).expect("defaults");
        assert!(cfg.fencing_enabled);
        assert_eq!((cfg.write_read_timeout_ms, cfg.submit_read_timeout_ms, cfg.read_tries_max), (3_000, 10_000, 2));
    }

    #[test]
    fn bypassing_the_duplicate_guard_needs_the_unsafe_test_profile() {
        let args = ProxyArgs { duplicate_guard_enabled: Some(false), ..ProxyArgs::default() };
        let file = FileConfig::default();
        let err = proxy_config(&args, &file, Profile::Production).expect_err("refused");
        assert!(err.contains("rail.proxy.duplicate-guard.enabled") && err.contains("unsafe-test"), "{err}");
        let (_, _, cfg) = proxy_config(&args, &file, Profile::UnsafeTest).expect("allowed");
        assert!(!cfg.duplicate_guard_enabled);
    }

    #[test]
    fn disabling_fencing_needs_the_unsafe_test_profile() {
        let args = ProxyArgs { fencing_enabled: Some(false), ..ProxyArgs::default() };
        let file = FileConfig::default();
        let err = proxy_config(&args, &file, Profile::Production).expect_err("refused");
        assert!(err.contains("unsafe-test"), "{err}");
        assert!(proxy_config(&args, &file, Profile::UnsafeTest).is_ok());
    }

    #[test]
    fn lock_backend_follows_the_flags_and_refuses_mismatches() {
        let file = FileConfig::default();
        let (listen, backend, _) = lock_server_config(&LockServerArgs::default(), &file).expect("defaults");
        assert_eq!(listen.port(), 8081);
        assert_eq!(backend, LockBackend::Sql(LOCKDB_URL_DEFAULT.to_owned()));
        let pg = LockServerArgs { database_url: Some("postgres://u@h/lockdb".into()), ..LockServerArgs::default() };
        assert_eq!(lock_server_config(&pg, &file).expect("pg").1, LockBackend::Sql("postgres://u@h/lockdb".into()));
        let etcd = LockServerArgs {
            backend: Some("etcd".into()),
            etcd_endpoints: Some("http://a:2379, http://b:2379".into()),
            ..LockServerArgs::default()
        };
        assert_eq!(
            lock_server_config(&etcd, &file).expect("etcd").1,
            LockBackend::Etcd(vec!["http://a:2379".into(), "http://b:2379".into()], "/dlock".into())
        );
        let no_endpoints = LockServerArgs { backend: Some("etcd".into()), ..LockServerArgs::default() };
        assert!(lock_server_config(&no_endpoints, &file).is_err());
        let mismatch = LockServerArgs { backend: Some("postgres".into()), ..LockServerArgs::default() };
        assert!(lock_server_config(&mismatch, &file).is_err());
        let unknown = LockServerArgs { backend: Some("zookeeper".into()), ..LockServerArgs::default() };
        assert!(lock_server_config(&unknown, &file).is_err());
    }

    #[test]
    fn proxy_defaults_follow_c3_budgets() {
        let args = ProxyArgs::default();
        let (listen, url, cfg) = proxy_config(&args, &FileConfig::default(), Profile::Production).expect("defaults");
        assert_eq!(listen.port(), 8083);
        assert_eq!(url, PAYDB_URL_DEFAULT);
        assert_eq!((cfg.connect_timeout_ms, cfg.read_timeout_ms), (1_000, 8_000));
        assert!(cfg.fencing_enabled);
        assert_eq!(cfg.rail_url.authority, "127.0.0.1:8084");
    }
}
