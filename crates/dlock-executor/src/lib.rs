//! The executor: the worker that moves payouts through the cluster.
//!
//! It is written against the runtime seam (`dlock-rt`) and speaks HTTP only, so the same
//! code runs as `dlock executor` on tokio and on a madsim node in the simulation. See
//! [`worker`] for the critical section and [`hops`] for the C3 §3.8 budgets.

pub mod config;
pub mod hops;
pub mod metrics;
pub mod openapi;
pub mod worker;

pub use config::ExecutorConfig;
pub use metrics::Outcome;
pub use worker::Executor;

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use axum::response::Response;
use axum::routing::get;

/// The executor's own small HTTP surface: `/metrics`, `/health/live`, `/health/ready`.
pub fn router(executor: Arc<Executor>) -> axum::Router {
    router_with_auth(executor, None)
}

/// [`router`] behind `auth` (none: authentication off): `/metrics` needs a credential.
pub fn router_with_auth(executor: Arc<Executor>, auth: Option<Arc<dlock_http::auth::Authenticator>>) -> axum::Router {
    let routes = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/health/live", get(dlock_http::health::live))
        .route("/health/ready", get(ready))
        .route(dlock_http::openapi::DOCUMENT_PATH, get(crate::openapi::openapi_json))
        .with_state(executor);
    dlock_http::finish_with_auth(routes, 1_024, auth)
}

/// Prometheus metrics (C4).
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses((status = 200, description = "Prometheus text exposition.", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String)))]
async fn metrics(State(e): State<Arc<Executor>>) -> Response {
    dlock_http::metrics::response(e.metrics.render())
}

/// Readiness (C4): the worker is running.
#[utoipa::path(get, path = "/health/ready", tag = "health",
    responses((status = 200, description = "Ready.", body = dlock_http::openapi::Health)))]
async fn ready(State(_e): State<Arc<Executor>>) -> Response {
    dlock_http::health::ready(BTreeMap::new())
}

/// How long the executor's own endpoints drain on shutdown.
pub const SHUTDOWN_GRACE_MS_MAX: u64 = 1_000;

/// The executor's one start entry point: runs the worker tasks ([`Executor::run`]) and
/// serves [`router`] on `listener` until `shutdown`; then each task finishes the payout in
/// hand, and [`dlock_rt::ServiceHandle::stopped`] waits for them. Logs a loud warning when
/// `cfg` turns the lease check off, and one when it injects stalls.
pub async fn start<F>(
    cfg: ExecutorConfig,
    clock: dlock_rt::Clock,
    listener: tokio::net::TcpListener,
    shutdown: F,
) -> Result<dlock_rt::ServiceHandle<Executor>, String>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if !cfg.fencing_enabled {
        tracing::warn!(profile = "unsafe-test", skipped = "the local lease deadline", "executor_fencing_disabled");
    }
    if cfg.pause_rate > 0.0 {
        tracing::warn!(pauseRate = cfg.pause_rate, pauseMs = cfg.pause_ms, "executor_chaos_stalls_enabled");
    }
    let auth =
        dlock_http::auth::Authenticator::new("executor", dlock_contract::auth::EXECUTOR_ROUTES, &cfg.auth, clock)?;
    let reloader = auth.as_ref().and_then(|a| a.spawn_reloader());
    let executor = Executor::new(cfg, clock)?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut server_stop = stop_rx.clone();
    let worker = dlock_rt::spawn(executor.clone().run(stop_rx));
    let signal = dlock_rt::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let handle = dlock_rt::ServiceHandle::serve(
        executor.clone(),
        listener,
        router_with_auth(executor, auth),
        SHUTDOWN_GRACE_MS_MAX,
        async move {
            let _ = server_stop.wait_for(|s| *s).await;
        },
    )
    .map_err(|e| format!("executor: {e}"))?;
    let handle = handle.with_draining(worker).with_background(signal);
    Ok(match reloader {
        Some(r) => handle.with_background(r),
        None => handle,
    })
}
