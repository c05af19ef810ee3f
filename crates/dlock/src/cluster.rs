//! The whole cluster in one process, for `dlock up` and `dlock demo`: lock-server,
//! payment-resource, rail-proxy and rail-stub, each on its own loopback port over embedded
//! SQLite under one data directory, plus executors and a periodic reconciler. Every piece is
//! the same code the separate subcommands run; only the process boundary is gone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use dlock_executor::{Executor, ExecutorConfig};
use dlock_payment_resource::{PaymentConfig, PaymentResource};
use dlock_rail_proxy::{ProxyConfig, RailProxy};
use dlock_rail_stub::{RailStub, StubConfig};
use dlock_rt::http::BaseUrl;
use dlock_rt::Clock;
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

/// What to start.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub data_dir: PathBuf,
    /// paydb (default: `paydb.sqlite` under `data_dir`).
    pub paydb_url: Option<String>,
    /// lockdb (default: `lockdb.sqlite` under `data_dir`).
    pub lockdb_url: Option<String>,
    pub ports: Ports,
    pub stub: StubConfig,
    /// The proxy's read timeout towards the rail.
    pub rail_read_timeout_ms: u64,
    /// Executors (each with its own owner id and lock sessions).
    pub executors: usize,
    /// Tasks per executor.
    pub concurrency: usize,
    pub lock_ttl_ms: u64,
    pub pause_rate: f64,
    pub pause_ms: u64,
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
    pub executors: Vec<Arc<Executor>>,
    cfg: ClusterConfig,
    stop: watch::Sender<bool>,
    /// The servers: they return once drained after `stop`.
    tasks: Vec<dlock_rt::JoinHandle<()>>,
    /// Reaper and purger: they loop until aborted.
    background: Vec<dlock_rt::JoinHandle<()>>,
    executor_stop: watch::Sender<bool>,
    executor_tasks: Vec<dlock_rt::JoinHandle<()>>,
}

fn sqlite_url(dir: &Path, file: &str) -> String {
    format!("sqlite://{}", dir.join(file).display())
}

async fn bind(port: u16) -> Result<(tokio::net::TcpListener, BaseUrl), String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let listener = dlock_rt::http::bind(addr).await.map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let local = listener.local_addr().map_err(|e| e.to_string())?;
    let url = BaseUrl::parse(&format!("http://{local}")).map_err(|e| e.to_string())?;
    Ok((listener, url))
}

fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    stop: &watch::Sender<bool>,
) -> dlock_rt::JoinHandle<()> {
    let mut rx = stop.subscribe();
    dlock_rt::spawn(async move {
        dlock_rt::http::serve_with_grace(
            listener,
            router,
            async move {
                let _ = rx.wait_for(|s| *s).await;
            },
            dlock_rt::http::SHUTDOWN_GRACE_MS_DEFAULT,
        )
        .await;
    })
}

impl Cluster {
    /// Starts the four services (no executors yet; see [`Cluster::start_executors`]).
    pub async fn start(cfg: ClusterConfig) -> Result<Cluster, String> {
        std::fs::create_dir_all(&cfg.data_dir)
            .map_err(|e| format!("cannot create the data directory {}: {e}", cfg.data_dir.display()))?;
        let paydb_url = cfg.paydb_url.clone().unwrap_or_else(|| sqlite_url(&cfg.data_dir, "paydb.sqlite"));
        let lockdb_url = cfg.lockdb_url.clone().unwrap_or_else(|| sqlite_url(&cfg.data_dir, "lockdb.sqlite"));
        let (stop, _) = watch::channel(false);
        let mut tasks = Vec::new();
        let mut background = Vec::new();

        let lock_store = dlock_lock_server::store_sql::open(&lockdb_url).await.map_err(|e| format!("lockdb: {e}"))?;
        let lock = dlock_lock_server::service::LockServer::new(
            lock_store,
            dlock_lock_server::service::LockServerConfig::default(),
            Clock::system(),
        );
        let (l, lock_url) = bind(cfg.ports.lock).await?;
        background.push(dlock_rt::spawn(lock.clone().run_reaper()));
        tasks.push(serve(l, dlock_lock_server::app::router(lock), &stop));

        let stub = RailStub::new(cfg.stub.clone(), Clock::system());
        let (l, stub_url) = bind(cfg.ports.stub).await?;
        tasks.push(serve(l, dlock_rail_stub::router(stub), &stop));

        let pay_store = dlock_payment_resource::store_sql::open(&paydb_url).await.map_err(|e| format!("paydb: {e}"))?;
        let payment = PaymentResource::start(pay_store, PaymentConfig::default(), Clock::system())
            .await
            .map_err(|e| format!("paydb: {e}"))?;
        let (l, payment_url) = bind(cfg.ports.payment).await?;
        background.push(dlock_rt::spawn(payment.clone().run_purger()));
        tasks.push(serve(l, dlock_payment_resource::router(payment.clone()), &stop));

        let rail_store = dlock_rail_proxy::store_sql::open(&paydb_url).await.map_err(|e| format!("paydb: {e}"))?;
        let proxy_cfg = ProxyConfig {
            rail_url: stub_url.clone(),
            connect_timeout_ms: dlock_rail_proxy::service::CONNECT_TIMEOUT_MS_DEFAULT,
            read_timeout_ms: cfg.rail_read_timeout_ms,
            fencing_enabled: true,
            duplicate_guard_enabled: true,
            body_bytes_max: dlock_rail_proxy::service::BODY_BYTES_MAX_DEFAULT,
        };
        let proxy = RailProxy::new(rail_store, proxy_cfg, Clock::system());
        background.push(dlock_rt::spawn(proxy.clone().run_orphan_sweeper()));
        let (l, proxy_url) = bind(cfg.ports.proxy).await?;
        tasks.push(serve(l, dlock_rail_proxy::router(proxy.clone()), &stop));

        let (executor_stop, _) = watch::channel(false);
        Ok(Cluster {
            lock_url,
            payment_url,
            proxy_url,
            stub_url,
            paydb_url,
            payment,
            proxy,
            executors: Vec::new(),
            cfg,
            stop,
            tasks,
            background,
            executor_stop,
            executor_tasks: Vec::new(),
        })
    }

    /// Starts the configured executors; the first serves its `/metrics` on the executor port.
    pub async fn start_executors(&mut self) -> Result<(), String> {
        for n in 0..self.cfg.executors {
            let owner = dlock_contract::OwnerId::parse(&format!("executor-{n}")).map_err(|e| e.to_string())?;
            let mut ec =
                ExecutorConfig::new(self.lock_url.clone(), self.payment_url.clone(), self.proxy_url.clone(), owner);
            ec.concurrency = self.cfg.concurrency;
            ec.lock_ttl_ms = self.cfg.lock_ttl_ms;
            ec.pause_rate = self.cfg.pause_rate;
            ec.pause_ms = self.cfg.pause_ms;
            ec.poll_interval_ms = 50;
            ec.submit_read_timeout_ms = self.cfg.rail_read_timeout_ms + dlock_executor::config::SUBMIT_READ_MARGIN_MS;
            let executor = Executor::new(ec, Clock::system())?;
            if n == 0 {
                let (l, _) = bind(self.cfg.ports.executor).await?;
                self.tasks.push(serve(l, dlock_executor::router(executor.clone()), &self.stop));
            }
            self.executor_tasks.push(dlock_rt::spawn(executor.clone().run(self.executor_stop.subscribe())));
            self.executors.push(executor);
        }
        Ok(())
    }

    /// Lets every executor task finish its current payout, then returns.
    pub async fn stop_executors(&mut self) {
        let _ = self.executor_stop.send(true);
        for t in self.executor_tasks.drain(..) {
            let _ = t.await;
        }
    }

    /// Stops the executors, then the services (each drains its in-flight requests).
    pub async fn shutdown(mut self) {
        self.stop_executors().await;
        let _ = self.stop.send(true);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        for t in self.background.drain(..) {
            t.abort();
            let _ = t.await;
        }
    }

    /// The reconciler's settings for this cluster.
    pub fn reconcile_settings(&self, json: bool) -> dlock_reconciler::cli::ReconcileSettings {
        dlock_reconciler::cli::ReconcileSettings {
            database_url: self.paydb_url.clone(),
            rail_url: format!("http://{}", self.stub_url.authority),
            json,
            bounds: dlock_reconciler::Bounds::default(),
        }
    }
}

/// A pause of `ms`, or less if `stop` turns true.
pub async fn pause_or_stop(ms: u64, stop: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = dlock_rt::sleep(Duration::from_millis(ms)) => {}
        _ = stop.wait_for(|s| *s) => {}
    }
}
