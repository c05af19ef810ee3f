//! Command-line surface. Each service subcommand resolves its settings (flag, then
//! environment, then `--config` file, then default; see `config.rs`), binds, prints one line
//! `dlock <service> listening on <addr>` to stdout, and serves until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use dlock_contract::payout::PayoutState;
use dlock_lock_server::config::LockBackend;
use dlock_rail_proxy::store::NewPayout;
use dlock_rt::Clock;

use crate::config::{self, Layers, Profile, LOCKDB_URL_DEFAULT, PAYDB_URL_DEFAULT};

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
    /// [tls.enabled] Serve and call the other services over TLS (default false).
    #[arg(long, global = true, env = "DLOCK_TLS_ENABLED", value_name = "BOOL")]
    tls_enabled: Option<bool>,
    /// [tls.cert-file] PEM certificate chain: the services' identity, and the clients'.
    #[arg(long, global = true, env = "DLOCK_TLS_CERT_FILE", value_name = "FILE")]
    tls_cert_file: Option<String>,
    /// [tls.key-file] PEM private key of tls.cert-file.
    #[arg(long, global = true, env = "DLOCK_TLS_KEY_FILE", value_name = "FILE")]
    tls_key_file: Option<String>,
    /// [tls.client-ca-file] PEM CAs a client certificate must chain to (set: mutual TLS).
    #[arg(long, global = true, env = "DLOCK_TLS_CLIENT_CA_FILE", value_name = "FILE")]
    tls_client_ca_file: Option<String>,
    /// [tls.ca-file] PEM CAs the clients trust for the services they call.
    #[arg(long, global = true, env = "DLOCK_TLS_CA_FILE", value_name = "FILE")]
    tls_ca_file: Option<String>,
    /// [telemetry.otlp.enabled] Export spans over OTLP/HTTP JSON to telemetry.otlp.endpoint.
    #[arg(long, global = true, env = "DLOCK_TELEMETRY_OTLP_ENABLED", value_name = "BOOL")]
    telemetry_otlp_enabled: Option<bool>,
    /// [telemetry.otlp.endpoint] The OTLP collector, http://host:port (spans go to /v1/traces).
    #[arg(long, global = true, env = "DLOCK_TELEMETRY_OTLP_ENDPOINT", value_name = "URL")]
    telemetry_otlp_endpoint: Option<String>,
    /// [telemetry.otlp.service-name] The spans' service.name (default: the command's name).
    #[arg(long, global = true, env = "DLOCK_TELEMETRY_OTLP_SERVICE_NAME", value_name = "NAME")]
    telemetry_otlp_service_name: Option<String>,
    /// [trace.file] A service appends its protocol events to FILE as incident-trace lines
    /// (docs/simulation.md "Incident trace"; docs/real-runs.md). Off when absent.
    #[arg(long, global = true, env = "DLOCK_TRACE_FILE", value_name = "FILE")]
    trace_file: Option<PathBuf>,
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
    /// under --data-dir, with executors and a periodic reconciler, until Ctrl-C. Every
    /// service key (--config, DLOCK_*) applies as for the separate processes; a safety
    /// switch turned off needs --profile unsafe-test.
    Up(crate::demo::UpArgs),
    /// Seed payouts, run them through the cluster under a chaotic rail and stalled executors,
    /// and judge the run with the reconciler. Exit 0 only if every invariant holds. Every
    /// service key (--config, DLOCK_*) applies as for the separate processes; a safety
    /// switch turned off needs --profile unsafe-test.
    Demo(crate::demo::DemoArgs),
    /// Sessions, leases and fencing tokens (C3 §3.3).
    LockServer(LockServerArgs),
    /// The operator's web console (docs/operating/console.md): sign in with an operator or
    /// reader token; payouts, the quarantine, locks (revoke) and events, kept live.
    Console(ConsoleArgs),
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
struct ConsoleArgs {
    /// [console.listen] Address to serve the console on.
    #[arg(long, env = "DLOCK_CONSOLE_LISTEN", value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// [console.payment-url] Base URL of the payment-resource.
    #[arg(long, env = "DLOCK_CONSOLE_PAYMENT_URL", value_name = "URL")]
    payment_url: Option<String>,
    /// [console.lock-url] Base URL of the lock server.
    #[arg(long, env = "DLOCK_CONSOLE_LOCK_URL", value_name = "URL")]
    lock_url: Option<String>,
    /// [console.proxy-url] Base URL of the rail-proxy.
    #[arg(long, env = "DLOCK_CONSOLE_PROXY_URL", value_name = "URL")]
    proxy_url: Option<String>,
    /// [console.session-ttl-ms] How long a console session lives after its login.
    #[arg(long, env = "DLOCK_CONSOLE_SESSION_TTL_MS", value_name = "MS")]
    session_ttl_ms: Option<u64>,
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
    /// [payment.events.retention-events] paydb events kept for the event stream (>= 100).
    #[arg(long, env = "DLOCK_PAYMENT_EVENTS_RETENTION_EVENTS", value_name = "N")]
    events_retention_events: Option<i64>,
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
    /// [executor.lock-wait-ms] Wait in the lock server's queue for a contended account, at most 1500 and lock-ttl-ms / 4 (0: skip it).
    #[arg(long, env = "DLOCK_EXECUTOR_LOCK_WAIT_MS", value_name = "MS")]
    lock_wait_ms: Option<u64>,
    /// [executor.affinity-index] This executor's place among its peers, 0..affinity-count: it prefers the accounts whose stable hash mod affinity-count is this index.
    #[arg(long, env = "DLOCK_EXECUTOR_AFFINITY_INDEX", value_name = "N")]
    affinity_index: Option<u32>,
    /// [executor.affinity-count] How many executors share the accounts (1: no preference).
    #[arg(long, env = "DLOCK_EXECUTOR_AFFINITY_COUNT", value_name = "N")]
    affinity_count: Option<u32>,
    /// [executor.affinity-steal-after-ms] Another executor's account whose oldest payout has not moved for this long (no progress seen) is tried like an own one.
    #[arg(long, env = "DLOCK_EXECUTOR_AFFINITY_STEAL_AFTER_MS", value_name = "MS")]
    affinity_steal_after_ms: Option<u64>,
    /// [executor.chain-payouts-max] Payouts of one account a task works under one chain of rotated grants before it releases the account (1: acquire and release per payout).
    #[arg(long, env = "DLOCK_EXECUTOR_CHAIN_PAYOUTS_MAX", value_name = "N")]
    chain_payouts_max: Option<u32>,
    /// [executor.payouts-per-grant-max] PENDING or CLAIMED payouts of one account a task claims, submits and posts together under one grant (1: one payout at a time, through the single writes).
    #[arg(long, env = "DLOCK_EXECUTOR_PAYOUTS_PER_GRANT_MAX", value_name = "N")]
    payouts_per_grant_max: Option<u32>,
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
    /// [lock.events.retention-events] lockdb events kept for the event stream (>= 100).
    #[arg(long, env = "DLOCK_LOCK_EVENTS_RETENTION_EVENTS", value_name = "N")]
    events_retention_events: Option<i64>,
    /// [lock.events.purge-interval-ms] Least pause between purges of lockdb events (> 0).
    #[arg(long, env = "DLOCK_LOCK_EVENTS_PURGE_INTERVAL_MS", value_name = "MS")]
    events_purge_interval_ms: Option<u64>,
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

/// A panic becomes one line on stderr: where, and its message with any credential in a
/// URL redacted; never a stack trace (whatever `RUST_BACKTRACE` says) and never the
/// default hook's output (docs/security.md "Secret hygiene"). The process's behaviour is
/// unchanged: a panicking task still ends, a panicking main thread still exits.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| (*s).to_owned())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        let location = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
        // stderr directly: a log filter (the demo's is `off`) must not hide a panic.
        eprintln!("dlock: panic at {location}: {}", dlock_db::redact_credentials(&message));
    }));
}

pub fn main() -> ExitCode {
    if let Err(code) = announce_planted_bug() {
        return code;
    }
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
    install_panic_hook();
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

/// A test-only build (`--features planted`, `dlock_contract::planted`) says on stderr which
/// bug it plants, and refuses a `DLOCK_PLANTED_BUG` it cannot plant.
#[cfg(feature = "planted")]
fn announce_planted_bug() -> Result<(), ExitCode> {
    use dlock_contract::planted;
    match planted::parse_env(std::env::var(planted::ENV).ok().as_deref()) {
        Ok(Some(bug)) => {
            eprintln!("dlock: TEST-ONLY BUILD: planted bug {bug} is on ({}); never run it with money", planted::ENV);
            Ok(())
        }
        Ok(None) => {
            eprintln!("dlock: TEST-ONLY BUILD (planted bugs): no bug planted ({} unset)", planted::ENV);
            Ok(())
        }
        Err(e) => {
            eprintln!("dlock: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// Any build but the test-only one says that it ignores `DLOCK_PLANTED_BUG`, so a tester who
/// runs the wrong binary knows. It links nothing of `dlock_contract::planted`
/// (`tests/release_build.rs`).
#[cfg(not(feature = "planted"))]
fn announce_planted_bug() -> Result<(), ExitCode> {
    if std::env::var("DLOCK_PLANTED_BUG").is_ok_and(|v| !v.trim().is_empty()) {
        eprintln!("dlock: DLOCK_PLANTED_BUG is ignored: this build cannot plant bugs");
    }
    Ok(())
}

fn init_logging(format: LogFormat, default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("DLOCK_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // The OTLP exporter's layer comes first, empty until `telemetry.otlp.enabled` fills it
    // (the keys are read after logging starts).
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let registry = tracing_subscriber::registry().with(dlock_rt::otlp::layer()).with(filter);
    let fmt = tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr);
    match format {
        LogFormat::Text => registry.with(fmt).init(),
        LogFormat::Json => registry.with(fmt.json().flatten_event(true)).init(),
    }
}

/// The `service.name` of the spans a command exports (`telemetry.otlp.service-name` wins).
fn telemetry_service_name(command: &Command) -> &'static str {
    match command {
        Command::RailStub(_) => "rail-stub",
        Command::RailProxy(_) => "rail-proxy",
        Command::PaymentResource(_) => "payment-resource",
        Command::Executor(_) => "executor",
        Command::LockServer(_) => "lock-server",
        Command::Console(_) => "console",
        _ => "dlock",
    }
}

impl StubArgs {
    fn flags(&self, l: &mut Layers) {
        l.set_flag_opt("rail.stub.listen", self.listen.as_ref());
        l.set_flag_opt("rail.stub.latency-ms", self.latency_ms.as_ref());
        l.set_flag_opt("rail.stub.failure-rate", self.failure_rate.as_ref());
        l.set_flag_opt("rail.stub.duplicate-ack-rate", self.duplicate_ack_rate.as_ref());
        l.set_flag_opt("rail.stub.decline-rate", self.decline_rate.as_ref());
        l.set_flag_opt("rail.stub.drop-hold-ms", self.drop_hold_ms.as_ref());
        l.set_flag_opt("rail.stub.seed", self.seed.as_ref());
    }
}

impl ProxyArgs {
    fn flags(&self, l: &mut Layers) {
        l.set_flag_opt("rail.proxy.listen", self.listen.as_ref());
        l.set_flag_opt("rail.proxy.database-url", self.database_url.as_ref());
        l.set_flag_opt("rail.proxy.rail-url", self.rail_url.as_ref());
        l.set_flag_opt("rail.proxy.connect-timeout-ms", self.connect_timeout_ms.as_ref());
        l.set_flag_opt("rail.proxy.read-timeout-ms", self.read_timeout_ms.as_ref());
        l.set_flag_opt("rail.proxy.fencing.enabled", self.fencing_enabled.as_ref());
        l.set_flag_opt("rail.proxy.body-bytes-max", self.body_bytes_max.as_ref());
        l.set_flag_opt("rail.proxy.duplicate-guard.enabled", self.duplicate_guard_enabled.as_ref());
    }
}

impl ConsoleArgs {
    fn flags(&self, l: &mut Layers) {
        l.set_flag_opt("console.listen", self.listen.as_ref());
        l.set_flag_opt("console.payment-url", self.payment_url.as_ref());
        l.set_flag_opt("console.lock-url", self.lock_url.as_ref());
        l.set_flag_opt("console.proxy-url", self.proxy_url.as_ref());
        l.set_flag_opt("console.session-ttl-ms", self.session_ttl_ms.as_ref());
    }
}

impl PaymentArgs {
    fn flags(&self, l: &mut Layers) {
        l.set_flag_opt("payment.resource.listen", self.listen.as_ref());
        l.set_flag_opt("payment.resource.database-url", self.database_url.as_ref());
        l.set_flag_opt("payment.resource.body-bytes-max", self.body_bytes_max.as_ref());
        l.set_flag_opt("payment.idempotency.retention-ms", self.idempotency_retention_ms.as_ref());
        l.set_flag_opt("payment.idempotency.purge-interval-ms", self.idempotency_purge_interval_ms.as_ref());
        l.set_flag_opt("payment.idempotency.purge-batch-max", self.idempotency_purge_batch_max.as_ref());
        l.set_flag_opt("payment.events.retention-events", self.events_retention_events.as_ref());
    }
}

impl ExecutorArgs {
    fn flags(&self, l: &mut Layers) {
        l.set_flag_opt("executor.listen", self.listen.as_ref());
        l.set_flag_opt("executor.lock-url", self.lock_url.as_ref());
        l.set_flag_opt("executor.payment-url", self.payment_url.as_ref());
        l.set_flag_opt("executor.proxy-url", self.proxy_url.as_ref());
        l.set_flag_opt("executor.owner-id", self.owner_id.as_ref());
        l.set_flag_opt("executor.concurrency", self.concurrency.as_ref());
        l.set_flag_opt("executor.poll-interval-ms", self.poll_interval_ms.as_ref());
        l.set_flag_opt("executor.batch-max", self.batch_max.as_ref());
        l.set_flag_opt("executor.lock-ttl-ms", self.lock_ttl_ms.as_ref());
        l.set_flag_opt("executor.lock-wait-ms", self.lock_wait_ms.as_ref());
        l.set_flag_opt("executor.affinity-index", self.affinity_index.as_ref());
        l.set_flag_opt("executor.affinity-count", self.affinity_count.as_ref());
        l.set_flag_opt("executor.affinity-steal-after-ms", self.affinity_steal_after_ms.as_ref());
        l.set_flag_opt("executor.chain-payouts-max", self.chain_payouts_max.as_ref());
        l.set_flag_opt("executor.payouts-per-grant-max", self.payouts_per_grant_max.as_ref());
        l.set_flag_opt("executor.write.connect-timeout-ms", self.write_connect_timeout_ms.as_ref());
        l.set_flag_opt("executor.write.read-timeout-ms", self.write_read_timeout_ms.as_ref());
        l.set_flag_opt("executor.write.retries-max", self.write_retries_max.as_ref());
        l.set_flag_opt("executor.submit.connect-timeout-ms", self.submit_connect_timeout_ms.as_ref());
        l.set_flag_opt("executor.submit.read-timeout-ms", self.submit_read_timeout_ms.as_ref());
        l.set_flag_opt("executor.read.connect-timeout-ms", self.read_connect_timeout_ms.as_ref());
        l.set_flag_opt("executor.read.read-timeout-ms", self.read_read_timeout_ms.as_ref());
        l.set_flag_opt("executor.read.tries-max", self.read_tries_max.as_ref());
        l.set_flag_opt("payment.fencing.enabled", self.fencing_enabled.as_ref());
        l.set_flag_opt("executor.chaos.pause-rate", self.pause_rate.as_ref());
        l.set_flag_opt("executor.chaos.pause-ms", self.pause_ms.as_ref());
        l.set_flag_opt("executor.chaos.pause-hops", self.pause_hops.as_ref());
    }
}

impl LockServerArgs {
    fn flags(&self, l: &mut Layers) {
        l.set_flag_opt("lock.server.listen", self.listen.as_ref());
        l.set_flag_opt("lock.server.backend", self.backend.as_ref());
        l.set_flag_opt("lock.server.database-url", self.database_url.as_ref());
        l.set_flag_opt("lock.server.etcd-endpoints", self.etcd_endpoints.as_ref());
        l.set_flag_opt("lock.server.etcd-prefix", self.etcd_prefix.as_ref());
        l.set_flag_opt("lock.session.ttl-ms", self.session_ttl_ms.as_ref());
        l.set_flag_opt("lock.default.ttl-ms", self.default_ttl_ms.as_ref());
        l.set_flag_opt("lock.delay-ms", self.delay_ms.as_ref());
        l.set_flag_opt("lock.waiters-max", self.waiters_max.as_ref());
        l.set_flag_opt("lock.session.retention-ms", self.session_retention_ms.as_ref());
        l.set_flag_opt("lock.reaper.interval-ms", self.reaper_interval_ms.as_ref());
        l.set_flag_opt("lock.wait.poll-ms", self.wait_poll_ms.as_ref());
        l.set_flag_opt("lock.events.retention-events", self.events_retention_events.as_ref());
        l.set_flag_opt("lock.events.purge-interval-ms", self.events_purge_interval_ms.as_ref());
    }
}

fn reconcile_flags(a: &dlock_reconciler::cli::ReconcileArgs, l: &mut Layers) {
    l.set_flag_opt("reconcile.database-url", a.database_url.as_ref());
    l.set_flag_opt("reconcile.rail-url", a.rail_url.as_ref());
    l.set_flag_opt("reconcile.intent-unresolved-ms-max", a.intent_unresolved_ms_max.as_ref());
    l.set_flag_opt("reconcile.acked-unposted-ms-max", a.acked_unposted_ms_max.as_ref());
    l.set_flag_opt("reconcile.record-findings", a.record_findings.as_ref());
}

async fn run(cli: Cli) -> Result<ExitCode, String> {
    let mut layers = config::process_layers(config::load_file(cli.config.as_deref())?);
    layers.set_flag_opt(config::PROFILE_KEY, cli.profile.as_ref());
    let profile = layers.profile()?;
    layers.set_flag_opt(config::HTTP_HEADER_BYTES_MAX_KEY, cli.http_header_bytes_max.as_ref());
    dlock_rt::http::set_process_header_bytes_max(
        layers.get(config::HTTP_HEADER_BYTES_MAX_KEY, dlock_rt::http::HEADER_BYTES_MAX_DEFAULT)?,
    )?;
    {
        use dlock_config::tls as k;
        layers.set_flag_opt(k::TLS_ENABLED_KEY, cli.tls_enabled.as_ref());
        layers.set_flag_opt(k::TLS_CERT_FILE_KEY, cli.tls_cert_file.as_ref());
        layers.set_flag_opt(k::TLS_KEY_FILE_KEY, cli.tls_key_file.as_ref());
        layers.set_flag_opt(k::TLS_CLIENT_CA_FILE_KEY, cli.tls_client_ca_file.as_ref());
        layers.set_flag_opt(k::TLS_CA_FILE_KEY, cli.tls_ca_file.as_ref());
        // Before any service starts or any client is built: all of them use it.
        dlock_rt::tls::install_process_tls(&k::resolve(&layers)?)?;
    }
    {
        use dlock_config::telemetry as k;
        layers.set_flag_opt(k::OTLP_ENABLED_KEY, cli.telemetry_otlp_enabled.as_ref());
        layers.set_flag_opt(k::OTLP_ENDPOINT_KEY, cli.telemetry_otlp_endpoint.as_ref());
        layers.set_flag_opt(k::OTLP_SERVICE_NAME_KEY, cli.telemetry_otlp_service_name.as_ref());
        // After TLS (an https:// collector uses the process's CAs).
        dlock_rt::otlp::install_process_exporter(&k::resolve(&layers)?, telemetry_service_name(&cli.command))?;
    }
    match cli.command {
        Command::Reconcile(a) => {
            reconcile_flags(&a, &mut layers);
            let s = dlock_reconciler::config::resolve(&layers, a.json)?;
            if let Ok(url) = dlock_rt::http::BaseUrl::parse(&s.rail_url) {
                dlock_rt::tls::check_url_scheme("reconcile.rail-url", &url)?;
            }
            return Ok(dlock_reconciler::cli::run_reconcile(&s).await);
        }
        Command::Resolve(a) => {
            layers.set_flag_opt("resolve.database-url", a.database_url.as_ref());
            let url = dlock_reconciler::config::resolve_database_url(&layers)?;
            return Ok(dlock_reconciler::cli::run_resolve(&a, &url).await);
        }
        Command::Up(a) => return crate::demo::up(a, layers, profile).await,
        Command::Demo(a) => return crate::demo::demo(a, layers, profile).await,
        _ => {}
    }
    layers.set_flag_opt(config::TRACE_FILE_KEY, cli.trace_file.as_ref().map(|p| p.display().to_string()).as_ref());
    // Kept for the process's life: every event a service emits is appended to the file.
    let _trace = match layers.get_opt::<String>(config::TRACE_FILE_KEY)? {
        Some(path) => {
            let node = telemetry_service_name(&cli.command);
            let about = format!("{node} pid {}", std::process::id());
            Some(crate::trace_file::TraceFile::start_service(std::path::Path::new(&path), node, &about)?)
        }
        None => None,
    };
    run_service(cli.command, layers, profile).await.map(|()| ExitCode::SUCCESS)
}

async fn run_service(command: Command, mut layers: Layers, profile: Profile) -> Result<(), String> {
    let clock = Clock::system();
    match command {
        Command::Reconcile(_) | Command::Resolve(_) | Command::Up(_) | Command::Demo(_) => Ok(()),
        Command::RailStub(a) => {
            a.flags(&mut layers);
            let s = dlock_rail_stub::config::resolve(&layers, profile)?;
            let l = bind("rail-stub", s.listen).await?;
            stopped("rail-stub", dlock_rail_stub::start(s.config, clock, l, shutdown_signal()).await?).await
        }
        Command::RailProxy(a) => {
            a.flags(&mut layers);
            let s = dlock_rail_proxy::config::resolve(&layers, profile)?;
            dlock_rt::tls::check_url_scheme("rail.proxy.rail-url", &s.config.rail_url)?;
            let store = dlock_rail_proxy::store_sql::open(&s.database_url).await.map_err(|e| format!("paydb: {e}"))?;
            let l = bind("rail-proxy", s.listen).await?;
            stopped("rail-proxy", dlock_rail_proxy::start(s.config, store, clock, l, shutdown_signal()).await?).await
        }
        Command::PaymentResource(a) => {
            a.flags(&mut layers);
            let s = dlock_payment_resource::config::resolve(&layers, profile)?;
            let store =
                dlock_payment_resource::store_sql::open(&s.database_url).await.map_err(|e| format!("paydb: {e}"))?;
            let l = bind("payment-resource", s.listen).await?;
            let h = dlock_payment_resource::start(s.config, store, clock, l, shutdown_signal()).await?;
            stopped("payment-resource", h).await
        }
        Command::Executor(a) => {
            a.flags(&mut layers);
            let s = dlock_executor::config::resolve(&layers, profile)?;
            for (key, url) in [
                ("executor.lock-url", &s.config.lock_url),
                ("executor.payment-url", &s.config.payment_url),
                ("executor.proxy-url", &s.config.proxy_url),
            ] {
                dlock_rt::tls::check_url_scheme(key, url)?;
            }
            let l = bind("executor", s.listen).await?;
            // On SIGINT or SIGTERM each task finishes its payout, then the process exits.
            stopped("executor", dlock_executor::start(s.config, clock, l, shutdown_signal()).await?).await
        }
        Command::LockServer(a) => {
            a.flags(&mut layers);
            let s = dlock_lock_server::config::resolve(&layers, profile)?;
            let store = open_lock_store(&s.backend).await?;
            let l = bind("lock-server", s.listen).await?;
            stopped("lock-server", dlock_lock_server::start(s.config, store, clock, l, shutdown_signal()).await?).await
        }
        Command::Console(a) => {
            a.flags(&mut layers);
            let s = dlock_console::config::resolve(&layers, profile)?;
            let l = bind("console", s.listen).await?;
            stopped("console", dlock_console::start(s.config, clock, l, shutdown_signal()).await?).await
        }
        Command::Migrate(a) => {
            let (name, versions) = match a.db {
                MigrateDb::Paydb => {
                    let url = match a.database_url {
                        Some(u) => u,
                        None => layers.get("rail.proxy.database-url", PAYDB_URL_DEFAULT.to_owned())?,
                    };
                    ("paydb", dlock_rail_proxy::store_sql::migrate(&url).await.map_err(|e| e.to_string())?)
                }
                MigrateDb::Lockdb => {
                    let url = match a.database_url {
                        Some(u) => u,
                        None => layers.get("lock.server.database-url", LOCKDB_URL_DEFAULT.to_owned())?,
                    };
                    ("lockdb", dlock_lock_server::store_sql::migrate(&url).await.map_err(|e| e.to_string())?)
                }
            };
            let list = versions.iter().map(i64::to_string).collect::<Vec<_>>().join(", ");
            println!("{name} migrations applied: {list}");
            Ok(())
        }
        Command::Dev(DevCommand::SeedPayout(a)) => seed_payout(a, &layers).await,
    }
}

/// Opens the lock server's store on `backend`.
pub(crate) async fn open_lock_store(
    backend: &LockBackend,
) -> Result<std::sync::Arc<dyn dlock_lock_server::store::LockStore>, String> {
    match backend {
        LockBackend::Sql(url) => dlock_lock_server::store_sql::open(url).await.map_err(|e| format!("lockdb: {e}")),
        LockBackend::Etcd(endpoints, prefix) => Ok(std::sync::Arc::new(
            dlock_lock_server::store_etcd::EtcdLockStore::connect(endpoints, prefix)
                .await
                .map_err(|e| format!("etcd: {e}"))?,
        )),
    }
}

async fn seed_payout(a: SeedArgs, layers: &Layers) -> Result<(), String> {
    let url = match a.database_url {
        Some(u) => u,
        None => layers.get("rail.proxy.database-url", PAYDB_URL_DEFAULT.to_owned())?,
    };
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

/// Binds `listen` and prints `dlock <name> listening on <addr>`.
async fn bind(name: &str, listen: SocketAddr) -> Result<tokio::net::TcpListener, String> {
    let listener = dlock_rt::http::bind(listen).await.map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    println!("dlock {name} listening on {local}");
    tracing::info!(service = name, addr = %local, "listening");
    Ok(listener)
}

/// Waits for a started service to stop (after SIGINT or SIGTERM and its drain).
async fn stopped<S>(name: &str, handle: dlock_rt::ServiceHandle<S>) -> Result<(), String> {
    handle.stopped().await;
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
        let known = crate::config::known_keys();
        let mut checked = 0;
        for sub in cmd.get_subcommands() {
            for arg in sub.get_arguments() {
                let Some(help) = arg.get_help().map(|h| h.to_string()) else { continue };
                let Some(key) = help.strip_prefix('[').and_then(|h| h.split(']').next()) else { continue };
                assert!(known.contains(&key), "{key} is not a known key");
                let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
                assert_eq!(env, Some(dlock_config::env_name(key)), "flag --{:?}", arg.get_long());
                checked += 1;
            }
        }
        assert!(checked >= 15, "only {checked} keyed flags found");
    }

    fn layers_of(args: &[&str]) -> (Layers, Profile) {
        let cli = Cli::try_parse_from(args).expect("parses");
        let mut l = Layers::default();
        l.set_flag_opt(config::PROFILE_KEY, cli.profile.as_ref());
        // A credential, as every service needs (E-13).
        l.set_default("auth.credentials", "worker cli-unit-test-token-00000001");
        l.set_default("executor.auth.token", "cli-unit-test-token-00000001");
        match &cli.command {
            Command::RailProxy(a) => a.flags(&mut l),
            Command::Executor(a) => a.flags(&mut l),
            Command::LockServer(a) => a.flags(&mut l),
            Command::PaymentResource(a) => a.flags(&mut l),
            Command::RailStub(a) => a.flags(&mut l),
            Command::Console(a) => a.flags(&mut l),
            _ => {}
        }
        let profile = l.profile().expect("profile");
        (l, profile)
    }

    #[test]
    fn a_service_flag_sets_the_key_its_resolver_reads() {
        let (mut l, p) = layers_of(&["dlock", "rail-proxy", "--read-timeout-ms", "123", "--listen", "127.0.0.1:9"]);
        let public = dlock_contract::grant::testing::signer().verify_key().to_base64();
        l.set_default("rail.proxy.grants.verify-keys", public);
        let s = dlock_rail_proxy::config::resolve(&l, p).expect("resolves");
        assert_eq!((s.config.read_timeout_ms, s.listen.port()), (123, 9));
        let (l, p) = layers_of(&["dlock", "executor", "--pause-hops", "submit", "--concurrency", "3"]);
        let c = dlock_executor::config::resolve(&l, p).expect("resolves").config;
        assert_eq!((c.concurrency, c.pause_hops.claim, c.pause_hops.submit), (3, false, true));
        let (l, p) = layers_of(&["dlock", "lock-server", "--reaper-interval-ms", "200"]);
        assert_eq!(dlock_lock_server::config::resolve(&l, p).expect("resolves").config.reap_interval_ms, 200);
    }

    #[test]
    fn the_console_flags_set_the_keys_its_resolver_reads() {
        let (l, p) = layers_of(&[
            "dlock",
            "console",
            "--listen",
            "127.0.0.1:9",
            "--lock-url",
            "http://127.0.0.1:7",
            "--session-ttl-ms",
            "120000",
        ]);
        let s = dlock_console::config::resolve(&l, p).expect("resolves");
        assert_eq!((s.listen.port(), s.config.lock_url.authority.as_str()), (9, "127.0.0.1:7"));
        assert_eq!(s.config.session_ttl_ms, 120_000);
    }

    #[test]
    fn the_safety_switch_flags_need_the_unsafe_test_profile() {
        let (l, p) = layers_of(&["dlock", "rail-proxy", "--fencing-enabled", "false"]);
        assert!(dlock_rail_proxy::config::resolve(&l, p).is_err_and(|e| e.contains("unsafe-test")));
        let (l, p) =
            layers_of(&["dlock", "--profile", "unsafe-test", "rail-proxy", "--duplicate-guard-enabled", "false"]);
        assert!(!dlock_rail_proxy::config::resolve(&l, p).expect("allowed").config.duplicate_guard_enabled);
        let (l, p) = layers_of(&["dlock", "executor", "--fencing-enabled", "false"]);
        assert!(dlock_executor::config::resolve(&l, p).is_err_and(|e| e.contains("payment.fencing.enabled")));
    }
}
