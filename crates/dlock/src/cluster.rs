//! The whole cluster in one process, for `dlock up` and `dlock demo`: lock-server,
//! payment-resource, rail-proxy and rail-stub, each on its own loopback port over embedded
//! SQLite under one data directory, plus executors and a periodic reconciler. Every piece is
//! the same code the separate subcommands run, started through the same entry points
//! (`dlock_<service>::start`) with settings from the same resolvers
//! (`dlock_<service>::config::resolve`); only the process boundary is gone.
//!
//! Keys resolve as for the separate processes (flag > environment > `--config` file >
//! command default > built-in default), with two exceptions the cluster imposes in the flags
//! layer: the keys that wire it together (every `*.listen`, `*.database-url`,
//! `lock.server.backend`, `rail.proxy.rail-url`, `executor.*-url`, `executor.owner-id`,
//! `reconcile.database-url`, `reconcile.rail-url`) and whatever `up`/`demo` flags were given.
//!
//! Invariant: every setting is resolved (and a disabled safety switch refused outside
//! `--profile unsafe-test`) before any service starts.
//!
//! The payment-resource and the rail-proxy both write paydb's one SQLite file; their stores
//! open it through `dlock_db::shared_sqlite_pool`, so the two queue in one pool of one
//! connection instead of sleeping in SQLite's busy handler against each other (C1 §1.1).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dlock_config::{Layers, Profile};
use dlock_executor::{Executor, ExecutorConfig};
use dlock_payment_resource::PaymentResource;
use dlock_rail_proxy::RailProxy;
use dlock_rail_stub::StubConfig;
use dlock_rt::http::BaseUrl;
use dlock_rt::{Clock, ServiceHandle};
use tokio::net::TcpListener;
use tokio::sync::watch;

/// The ports `dlock up` binds (the services' defaults); `dlock demo` binds port 0 for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ports {
    pub lock: u16,
    pub payment: u16,
    pub proxy: u16,
    pub stub: u16,
    pub executor: u16,
}

impl Ports {
    pub const DEFAULT: Ports = Ports { lock: 8081, payment: 8082, proxy: 8083, stub: 8084, executor: 8085 };
    pub const EPHEMERAL: Ports = Ports { lock: 0, payment: 0, proxy: 0, stub: 0, executor: 0 };
}

/// The port `dlock up` serves the operator's console on (`console.listen`'s default).
pub const CONSOLE_PORT: u16 = 8090;

/// The console's settings for a cluster whose services are at `lock`, `payment` and
/// `proxy`: its listen address and the service URLs are imposed (wiring keys, like every
/// `*.listen` of `dlock up`); everything else (`console.session-ttl-ms`, `auth.*`) resolves
/// from `layers`.
pub fn console_settings(
    layers: &Layers,
    profile: Profile,
    urls: [&BaseUrl; 3],
    port: u16,
) -> Result<dlock_console::ConsoleSettings, String> {
    let [lock, payment, proxy] = urls;
    let mut l = layers.clone();
    l.set_flag("console.listen", SocketAddr::from(([127, 0, 0, 1], port)));
    l.set_flag("console.lock-url", http(lock));
    l.set_flag("console.payment-url", http(payment));
    l.set_flag("console.proxy-url", http(proxy));
    dlock_console::config::resolve(&l, profile)
}

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub data_dir: PathBuf,
    /// paydb (default: `paydb.sqlite` under `data_dir`).
    pub paydb_url: Option<String>,
    /// lockdb (default: `lockdb.sqlite` under `data_dir`).
    pub lockdb_url: Option<String>,
    pub ports: Ports,
    /// Executors (each with its own owner id and lock sessions).
    pub executors: usize,
    /// The process's layers plus the command's defaults and flags.
    pub layers: Layers,
    pub profile: Profile,
    /// `dlock up`/`demo`'s local credentials, written (if new) once the settings are checked.
    pub local_credentials: Option<LocalCredentials>,
}

impl ClusterConfig {
    /// Unless the layers configure credentials of their own (or turn auth off): the data
    /// directory's local credentials ([`local_credentials`]), as every service's
    /// `auth.credentials-file` and the executors' token (command defaults, beneath the
    /// environment and the file).
    pub fn with_local_credentials(mut self) -> Result<(ClusterConfig, Option<LocalCredentials>), String> {
        if configures_own_credentials(&self.layers) {
            return Ok((self, None));
        }
        let c = local_credentials(&self.data_dir)?;
        // Inline until the settings are checked (a refused setting writes nothing), then
        // the file (see `Cluster::start`).
        self.layers.set_default("auth.credentials", c.text.expose());
        self.layers.set_default("executor.auth.token", c.worker.expose());
        self.local_credentials = Some(c.clone());
        Ok((self, Some(c)))
    }
}

/// A running cluster.
pub struct Cluster {
    pub lock_url: BaseUrl,
    pub payment_url: BaseUrl,
    pub proxy_url: BaseUrl,
    pub stub_url: BaseUrl,
    pub paydb_url: String,
    pub payment: Arc<PaymentResource>,
    pub proxy: Arc<RailProxy>,
    /// The resolved settings, for reporting.
    pub stub_cfg: StubConfig,
    /// One per executor, resolved at start (so a refused switch stops everything first).
    pub executor_cfgs: Vec<ExecutorConfig>,
    /// Every safety switch this run turns off (only possible under `unsafe-test`).
    pub unsafe_warnings: Vec<String>,
    pub executors: Vec<Arc<Executor>>,
    executor_port: u16,
    layers: Layers,
    stop: watch::Sender<bool>,
    lock: Option<ServiceHandle<dlock_lock_server::service::LockServer>>,
    stub: Option<ServiceHandle<dlock_rail_stub::RailStub>>,
    payment_handle: Option<ServiceHandle<PaymentResource>>,
    proxy_handle: Option<ServiceHandle<RailProxy>>,
    executor_stop: watch::Sender<bool>,
    executor_handles: Vec<ServiceHandle<Executor>>,
}

fn sqlite_url(dir: &Path, file: &str) -> String {
    format!("sqlite://{}", dir.join(file).display())
}

async fn bind(port: u16) -> Result<(TcpListener, BaseUrl), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = dlock_rt::http::bind(addr).await.map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let url = BaseUrl::parse(&format!("{}://{local}", dlock_rt::tls::process_scheme())).map_err(|e| e.to_string())?;
    Ok((listener, url))
}

fn signal(stop: &watch::Sender<bool>) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = stop.subscribe();
    async move {
        let _ = rx.wait_for(|s| *s).await;
    }
}

/// The URL a service is called at (`https://` when the process speaks TLS).
fn http(url: &BaseUrl) -> String {
    url.url()
}

/// Every service's settings for one cluster, resolved.
struct Plan {
    lock: dlock_lock_server::config::LockServerSettings,
    stub: dlock_rail_stub::config::StubSettings,
    payment: dlock_payment_resource::config::PaymentSettings,
    proxy: dlock_rail_proxy::config::ProxySettings,
    executors: Vec<ExecutorConfig>,
    unsafe_warnings: Vec<String>,
    layers: Layers,
}

/// The addresses the services are (or will be) bound to.
struct Wiring<'a> {
    lock: &'a BaseUrl,
    stub: &'a BaseUrl,
    payment: &'a BaseUrl,
    proxy: &'a BaseUrl,
    paydb_url: &'a str,
    lockdb_url: &'a str,
}

/// The file under the data directory holding the cluster's grant signing key (its seed).
pub const GRANT_KEY_FILE: &str = "grant-signing.key";

/// The cluster's grant signing seed: the one under the data directory from an earlier run,
/// or a fresh one (written by [`write_grant_seed`] once the cluster's settings resolved).
fn grant_seed(data_dir: &std::path::Path) -> Result<([u8; 32], bool), String> {
    let path = data_dir.join(GRANT_KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            dlock_contract::grant::parse_seed(&text).map(|s| (s, true)).map_err(|e| format!("{}: {e}", path.display()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok((dlock_rt::rand::secret_bytes::<32>(), false)),
        Err(e) => Err(format!("{}: {e}", path.display())),
    }
}

/// Writes a fresh signing seed under the data directory, readable by its owner only.
fn write_grant_seed(data_dir: &std::path::Path, seed: &[u8; 32]) -> Result<(), String> {
    use std::io::Write;
    let path = data_dir.join(GRANT_KEY_FILE);
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
    let mut f = opts.open(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(dlock_contract::grant::seed_text(seed).as_bytes()).map_err(|e| format!("{}: {e}", path.display()))
}

fn plan(cfg: &ClusterConfig, w: &Wiring<'_>, grant_seed: &[u8; 32]) -> Result<Plan, String> {
    // The wiring keys, imposed; everything else resolves from the layers.
    let mut l = cfg.layers.clone();
    let lock_backend = if w.lockdb_url.starts_with("sqlite:") { "sqlite" } else { "postgres" };
    for (key, value) in [
        ("lock.server.listen", w.lock.authority.clone()),
        ("lock.server.database-url", w.lockdb_url.to_owned()),
        ("lock.server.backend", lock_backend.to_owned()),
        ("rail.stub.listen", w.stub.authority.clone()),
        ("payment.resource.listen", w.payment.authority.clone()),
        ("payment.resource.database-url", w.paydb_url.to_owned()),
        ("rail.proxy.listen", w.proxy.authority.clone()),
        ("rail.proxy.database-url", w.paydb_url.to_owned()),
        ("rail.proxy.rail-url", http(w.stub)),
        ("executor.lock-url", http(w.lock)),
        ("executor.payment-url", http(w.payment)),
        ("executor.proxy-url", http(w.proxy)),
        ("reconcile.database-url", w.paydb_url.to_owned()),
        ("reconcile.rail-url", http(w.stub)),
    ] {
        l.set_flag(key, value);
    }
    let p = cfg.profile;
    let mut lock = dlock_lock_server::config::resolve(&l, p)?;
    // Grants are signed with `lock.grants.signing-key-file` if set, else with the data
    // directory's key; the resources trust its public key unless told otherwise.
    let signer = lock
        .config
        .signer
        .get_or_insert_with(|| dlock_contract::grant::GrantSigner::from_seed(grant_seed))
        .verify_key()
        .to_base64();
    l.set_default("payment.grants.verify-keys", &signer);
    l.set_default("rail.proxy.grants.verify-keys", &signer);
    let stub = dlock_rail_stub::config::resolve(&l, p)?;
    let payment = dlock_payment_resource::config::resolve(&l, p)?;
    let proxy = dlock_rail_proxy::config::resolve(&l, p)?;
    // The executors' submit budget follows the proxy's rail budget (C3 §3.8 "+ 2 s").
    l.set_default(
        "executor.submit.read-timeout-ms",
        proxy.config.read_timeout_ms + dlock_executor::config::SUBMIT_READ_MARGIN_MS,
    );
    let mut executors = Vec::new();
    for n in 0..cfg.executors {
        let mut el = l.clone();
        el.set_flag("executor.owner-id", format!("executor-{n}"));
        // Cut 6: each executor prefers its share of the accounts (a layer may override).
        el.set_default("executor.affinity-index", n);
        el.set_default("executor.affinity-count", cfg.executors);
        executors.push(dlock_executor::config::resolve(&el, p)?.config);
    }
    dlock_reconciler::config::resolve(&l, false)?;
    let mut unsafe_warnings = dlock_rail_proxy::config::unsafe_warnings(&proxy.config);
    if let Some(e) = executors.first() {
        unsafe_warnings.extend(dlock_executor::config::unsafe_warnings(e));
    }
    unsafe_warnings.dedup();
    Ok(Plan { lock, stub, payment, proxy, executors, unsafe_warnings, layers: l })
}

impl Cluster {
    /// Resolves every service's settings (before binding anything: a refused setting
    /// starts nothing), binds, then starts the four services (no executors yet; see
    /// [`Cluster::start_executors`]).
    pub async fn start(cfg: ClusterConfig) -> Result<Cluster, String> {
        let paydb_url = cfg.paydb_url.clone().unwrap_or_else(|| sqlite_url(&cfg.data_dir, "paydb.sqlite"));
        let lockdb_url = cfg.lockdb_url.clone().unwrap_or_else(|| sqlite_url(&cfg.data_dir, "lockdb.sqlite"));
        let scheme = dlock_rt::tls::process_scheme();
        let at = |port: u16| BaseUrl::parse(&format!("{scheme}://127.0.0.1:{port}")).map_err(|e| e.to_string());
        let (lock_at, stub_at, payment_at, proxy_at) =
            (at(cfg.ports.lock)?, at(cfg.ports.stub)?, at(cfg.ports.payment)?, at(cfg.ports.proxy)?);
        let wiring = Wiring {
            lock: &lock_at,
            stub: &stub_at,
            payment: &payment_at,
            proxy: &proxy_at,
            paydb_url: &paydb_url,
            lockdb_url: &lockdb_url,
        };
        let (seed, seed_on_disk) = grant_seed(&cfg.data_dir)?;
        plan(&cfg, &wiring, &seed)?;
        let mut cfg = cfg;
        if let Some(c) = &cfg.local_credentials {
            std::fs::create_dir_all(&cfg.data_dir)
                .map_err(|e| format!("cannot create the data directory {}: {e}", cfg.data_dir.display()))?;
            c.write_if_new()?;
            // From here on the services read the file (and follow edits to it).
            cfg.layers.set_default("auth.credentials", "");
            cfg.layers.set_default("auth.credentials-file", c.path.display());
        }
        let (lock_l, lock_url) = bind(cfg.ports.lock).await?;
        let (stub_l, stub_url) = bind(cfg.ports.stub).await?;
        let (payment_l, payment_url) = bind(cfg.ports.payment).await?;
        let (proxy_l, proxy_url) = bind(cfg.ports.proxy).await?;
        let wiring = Wiring {
            lock: &lock_url,
            stub: &stub_url,
            payment: &payment_url,
            proxy: &proxy_url,
            paydb_url: &paydb_url,
            lockdb_url: &lockdb_url,
        };
        let Plan {
            lock: lock_s,
            stub: stub_s,
            payment: payment_s,
            proxy: proxy_s,
            executors: executor_cfgs,
            unsafe_warnings,
            layers: l,
        } = plan(&cfg, &wiring, &seed)?;

        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|e| format!("cannot create the data directory {}: {e}", cfg.data_dir.display()))?;
        if !seed_on_disk {
            write_grant_seed(&cfg.data_dir, &seed)?;
        }
        let (stop, _) = watch::channel(false);
        let clock = Clock::system();

        let lock_store = crate::cli::open_lock_store(&lock_s.backend).await?;
        let lock = dlock_lock_server::start(lock_s.config, lock_store, clock, lock_l, signal(&stop)).await?;
        let stub_cfg = stub_s.config.clone();
        let stub = dlock_rail_stub::start(stub_s.config, clock, stub_l, signal(&stop)).await?;
        let pay_store = dlock_payment_resource::store_sql::open(&payment_s.database_url)
            .await
            .map_err(|e| format!("paydb: {e}"))?;
        let payment_handle =
            dlock_payment_resource::start(payment_s.config, pay_store, clock, payment_l, signal(&stop)).await?;
        let rail_store =
            dlock_rail_proxy::store_sql::open(&proxy_s.database_url).await.map_err(|e| format!("paydb: {e}"))?;
        let proxy_handle = dlock_rail_proxy::start(proxy_s.config, rail_store, clock, proxy_l, signal(&stop)).await?;

        let (executor_stop, _) = watch::channel(false);
        Ok(Cluster {
            lock_url,
            payment_url,
            proxy_url,
            stub_url,
            paydb_url,
            payment: payment_handle.service.clone(),
            proxy: proxy_handle.service.clone(),
            stub_cfg,
            executor_cfgs,
            unsafe_warnings,
            executors: Vec::new(),
            executor_port: cfg.ports.executor,
            layers: l,
            stop,
            lock: Some(lock),
            stub: Some(stub),
            payment_handle: Some(payment_handle),
            proxy_handle: Some(proxy_handle),
            executor_stop,
            executor_handles: Vec::new(),
        })
    }

    /// Starts the configured executors; the first serves its `/metrics` on the executor
    /// port, the others on ports of their own.
    pub async fn start_executors(&mut self) -> Result<(), String> {
        for (n, cfg) in self.executor_cfgs.clone().into_iter().enumerate() {
            let (l, _) = bind(if n == 0 { self.executor_port } else { 0 }).await?;
            let h = dlock_executor::start(cfg, Clock::system(), l, signal(&self.executor_stop)).await?;
            self.executors.push(h.service.clone());
            self.executor_handles.push(h);
        }
        Ok(())
    }

    /// Lets every executor task finish its current payout, then returns.
    pub async fn stop_executors(&mut self) {
        let _ = self.executor_stop.send(true);
        for h in self.executor_handles.drain(..) {
            h.stopped().await;
        }
    }

    /// Stops the executors, then the services (each drains its in-flight requests and
    /// stops its background tasks).
    pub async fn shutdown(mut self) {
        self.stop_executors().await;
        let _ = self.stop.send(true);
        if let Some(h) = self.proxy_handle.take() {
            h.stopped().await;
        }
        if let Some(h) = self.payment_handle.take() {
            h.stopped().await;
        }
        if let Some(h) = self.stub.take() {
            h.stopped().await;
        }
        if let Some(h) = self.lock.take() {
            h.stopped().await;
        }
    }

    /// Starts the operator's console on `port` (0: any), calling this cluster's services;
    /// it stops with them ([`Cluster::shutdown`] signals it; await its handle after).
    pub async fn start_console(&self, port: u16) -> Result<(ServiceHandle<dlock_console::Console>, BaseUrl), String> {
        let profile = self.layers.profile()?;
        let urls = [&self.lock_url, &self.payment_url, &self.proxy_url];
        let s = console_settings(&self.layers, profile, urls, port)?;
        let (listener, url) = bind(s.listen.port()).await?;
        let h = dlock_console::start(s.config, Clock::system(), listener, signal(&self.stop)).await?;
        Ok((h, url))
    }

    /// The reconciler's settings for this cluster (its keys resolved from the layers).
    pub fn reconcile_settings(&self, json: bool) -> Result<dlock_reconciler::cli::ReconcileSettings, String> {
        dlock_reconciler::config::resolve(&self.layers, json)
    }
}

/// A pause of `ms`, or less if `stop` turns true.
pub async fn pause_or_stop(ms: u64, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = dlock_rt::sleep(Duration::from_millis(ms)) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_data_dir_gets_an_owner_only_signing_key_that_later_runs_reuse() {
        let dir = std::env::temp_dir().join(format!("dlock-grant-seed-{}", dlock_rt::rand::random_u64()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (seed, on_disk) = grant_seed(&dir).expect("fresh");
        assert!(!on_disk, "nothing was written yet");
        write_grant_seed(&dir, &seed).expect("written");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.join(GRANT_KEY_FILE)).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        assert_eq!(grant_seed(&dir).expect("reread"), (seed, true));
        // Never overwritten.
        assert!(write_grant_seed(&dir, &[1; 32]).is_err());
        assert_eq!(grant_seed(&dir).expect("reread").0, seed);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The stores `start` opens on paydb: the payment-resource's and the rail-proxy's.
    #[cfg(not(madsim))]
    #[tokio::test]
    async fn the_payment_resource_and_the_proxy_share_one_pool_on_paydb() {
        let dir = dlock_testkit::TempDir::new("cluster-pool");
        let url = dlock_testkit::sqlite_url(&dir);
        let pay = dlock_payment_resource::store_sql::SqlitePaymentStore::open(&url).await.expect("payment store");
        let rail = dlock_rail_proxy::store_sql::SqliteRailStore::open(&url).await.expect("rail store");
        assert!(pay.shared_pool().same_pool(rail.shared_pool()), "two pools on one paydb file");
        assert_eq!(pay.pool.options().get_max_connections(), dlock_db::SQLITE_POOL_CONNECTIONS_MAX);
        // docs/performance.md "The SQLite writer thread": and one writer thread, on which
        // both stores' write transactions run.
        let pay_writer = dlock_payment_resource::store::PaymentStore::writer_thread(&pay).expect("a writer thread");
        let rail_writer = dlock_rail_proxy::store::RailStore::writer_thread(&rail).expect("a writer thread");
        assert!(pay_writer.is_same(&rail_writer), "two writer threads on one paydb file");
        let on = pay_writer.run(async { std::thread::current().name().map(str::to_owned) }).await;
        assert_eq!(on.as_deref(), Some(dlock_db::SQLITE_WRITER_THREAD_NAME));
    }
}
/// The name of the credentials file `dlock up` and `dlock demo` keep in the data directory.
pub const CREDENTIALS_FILE_NAME: &str = "credentials";

/// The local credentials of `dlock up`/`dlock demo` (C3-extensions E-13): one worker, one
/// operator and one reader token, generated on first run and reused after.
#[derive(Debug, Clone)]
pub struct LocalCredentials {
    pub path: PathBuf,
    pub worker: dlock_contract::auth::Secret,
    pub operator: dlock_contract::auth::Secret,
    /// The file's text (`Secret`: never printed).
    text: dlock_contract::auth::Secret,
    /// Whether this run creates the file (it did not exist).
    pub created: bool,
}

fn fresh_token() -> String {
    dlock_contract::auth::hex(&dlock_rt::rand::secret_bytes::<32>())
}

/// The first token of `role` in a credentials file's text.
fn token_of(text: &str, role: &str) -> Option<dlock_contract::auth::Secret> {
    text.lines().map(str::split_whitespace).find_map(|mut w| match (w.next(), w.next()) {
        (Some(r), Some(t)) if r == role => Some(dlock_contract::auth::Secret::new(t)),
        _ => None,
    })
}

/// Reads `<data_dir>/credentials`, or draws three fresh tokens (from
/// `dlock_rt::rand::secret_bytes`) for it; nothing is written here (see
/// [`LocalCredentials::write_if_new`]). A file that does not parse, or lacks one of the
/// three roles, is an error naming it (never a token).
pub fn local_credentials(data_dir: &Path) -> Result<LocalCredentials, String> {
    let path = data_dir.join(CREDENTIALS_FILE_NAME);
    let shown = path.display().to_string();
    let (text, created) = if path.exists() {
        (std::fs::read_to_string(&path).map_err(|e| format!("cannot read the credentials file {shown}: {e}"))?, false)
    } else {
        let text = format!(
            "# dlock local credentials (generated by dlock up/demo; keep secret).\n\
             # <role> <token> [owners=<id>,...]  (C3-extensions E-13)\n\
             worker {}\noperator {}\nreader {}\n",
            fresh_token(),
            fresh_token(),
            fresh_token()
        );
        (text, true)
    };
    dlock_contract::auth::parse_credentials(&text, &shown)?;
    let need = |role: &str| {
        token_of(&text, role).ok_or_else(|| format!("the credentials file {shown} has no {role} credential"))
    };
    need("reader")?;
    let (worker, operator) = (need("worker")?, need("operator")?);
    Ok(LocalCredentials { worker, operator, text: dlock_contract::auth::Secret::new(text), path, created })
}

impl LocalCredentials {
    /// Writes the file (mode 0600) if this run drew its tokens.
    pub fn write_if_new(&self) -> Result<(), String> {
        if !self.created || self.path.exists() {
            return Ok(());
        }
        write_private(&self.path, self.text.expose())
            .map_err(|e| format!("cannot write the credentials file {}: {e}", self.path.display()))
    }
}

#[cfg(unix)]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

/// Whether the layers configure credentials of their own (then `up`/`demo` leave them be).
pub fn configures_own_credentials(layers: &Layers) -> bool {
    ["auth.credentials-file", "auth.credentials"].iter().any(|k| layers.raw(k).is_some_and(|(v, _)| !v.is_empty()))
        || layers.get("auth.enabled", true).is_ok_and(|on| !on)
}
