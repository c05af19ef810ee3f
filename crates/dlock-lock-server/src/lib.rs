//! The lock server (C3 §3.3): sessions, leases and fencing tokens.
//!
//! A worker opens a session (L1) and keeps it alive with heartbeats (L2). It acquires a key
//! (L4) and receives a grant with a fencing token, strictly greater than every token issued
//! before; it renews (L5) and releases (L6) that grant by `(key, token)`. An operator can
//! revoke a grant (L8), which also raises the token floor so the evicted holder is fenced out
//! at the resource, not merely forgotten here.
//!
//! The rules are pure functions, once, in [`rules`]; every store reads its facts, calls them,
//! and applies the answer under its own conditional write. The store decides everything that
//! must be atomic (see [`store`]); this crate's service
//! layer adds what is per-replica and advisory: the fair FIFO waiter queue for `waitMillis`,
//! the reaper, metrics and logs. A replica never answers a guess: when the backend cannot
//! decide, the answer is `503 NOT_LEADER`.

pub mod app;
pub mod config;
pub mod lockdb_clock;
pub mod openapi;
pub mod rules;
pub mod service;
pub mod store;
pub mod store_etcd;
pub mod store_fault;
pub mod store_layer;
pub mod store_mem;
pub mod store_observed;
#[cfg(not(madsim))]
pub mod store_sql;
pub mod store_timed;

/// How long a graceful shutdown waits for in-flight requests: the longest `waitMillis`
/// plus a second.
/// The lock server's name for itself in emitted protocol events ([`dlock_rt::events`]).
pub const NODE: &str = "lock-server";

pub const SHUTDOWN_GRACE_MS_MAX: u64 = dlock_contract::lock::WAIT_MS_MAX as u64 + 1_000;

/// The lock server's one start entry point: serves [`app::router`] on `listener` over
/// `store` until `shutdown` (draining for [`SHUTDOWN_GRACE_MS_MAX`]), with the reaper
/// ([`service::LockServer::run_reaper`]) running until it stops.
pub async fn start<F>(
    cfg: service::LockServerConfig,
    store: std::sync::Arc<dyn store::LockStore>,
    clock: dlock_rt::Clock,
    listener: tokio::net::TcpListener,
    shutdown: F,
) -> Result<dlock_rt::ServiceHandle<service::LockServer>, String>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let auth = dlock_http::auth::Authenticator::new(NODE, dlock_contract::auth::LOCK_SERVER_ROUTES, &cfg.auth, clock)?;
    let reloader = auth.as_ref().and_then(|a| a.spawn_reloader());
    let server = service::LockServer::new(store, cfg, clock);
    let reaper = dlock_rt::spawn(server.clone().run_reaper());
    let router = app::router_with_auth(server.clone(), auth);
    let handle = dlock_rt::ServiceHandle::serve(server.clone(), listener, router, SHUTDOWN_GRACE_MS_MAX, shutdown)
        .map_err(|e| format!("lock-server: {e}"))?;
    let handle = handle.with_background(reaper);
    Ok(match reloader {
        Some(r) => handle.with_background(r),
        None => handle,
    })
}
