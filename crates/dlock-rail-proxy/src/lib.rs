//! The rail-proxy: enforcement point (c), the only process permitted to call the rail.
//!
//! The rail cannot compare tokens (no token, no idempotency key, no memory), so the fence
//! is moved into a process we control, in front of it. Every `POST /v1/rail/submissions`
//! runs the admission order of C3 §3.5, which is not negotiable:
//!
//! 1. **Fence.** Advance `rail_high_water` for the account to the presented token, only if
//!    strictly greater (`>`, never `>=`: an equal-token retry after a timeout must lose).
//!    Otherwise record a FENCED row and answer 409 `FENCED_OUT`. No rail call is ever made.
//! 2. **Duplicate.** The unique index over forwardable attempts admits one per payout.
//!    Otherwise record a DUPLICATE row and answer 409 `DUPLICATE_SUBMISSION` (and page).
//! 3. **Intent.** Steps 1–3 commit together, with the payout moved to SUBMITTED, *before*
//!    any socket opens. If that commit provably failed, answer 503 `RAIL_UNAVAILABLE`:
//!    nothing was presented. If its answer was lost (the intent may have committed), answer
//!    500 `INTERNAL`, never a retry-safe code (C3-extensions C-29).
//! 4. **Forward once.** One connection, one request, the `1 s / 8 s` budget, zero retries.
//!    Record the outcome: ack (200), decline (422), no answer (409 `RAIL_AMBIGUOUS`, the
//!    payout is quarantined), or could-not-connect (503 `RAIL_UNAVAILABLE`).
//!
//! Steps 1–3 are decided by one pure function, [`admission::decide_admission`], which every
//! store applies under its own conditional writes.
//!
//! **Batches** (`POST /v1/rail/submission-batches`, C3-extensions E-19): one grant, several
//! payouts of one account. The grant is checked once; step 1 runs once for all of them and
//! steps 2–3 per payout, all in one transaction ([`admission::decide_batch_admission`],
//! [`RailStore::admit_batch`]), so every intent commits before any socket opens; each
//! admitted payout is forwarded exactly once, all at once, never retried; the outcomes are
//! recorded in one transaction ([`RailStore::resolve_batch`]). Per payout, everything (its
//! rows, its answer, its events, metrics and log lines) is the single submission's.
//!
//! The mark lives only in paydb. This crate holds no token in memory between requests: a
//! restart, a second replica, or a cache cannot re-admit a stale writer.

pub mod admission;
pub mod app;
pub mod config;
pub mod metrics;
pub mod openapi;
pub mod service;
pub mod store;
pub mod store_fault;
pub mod store_layer;
pub mod store_mem;
#[cfg(not(madsim))]
pub mod store_sql;
pub mod store_timed;

/// The rail-proxy's name for itself in emitted protocol events ([`dlock_rt::events`]).
pub const NODE: &str = "rail-proxy";

pub use app::router;
pub use service::{ProxyConfig, RailProxy};
pub use store::RailStore;

/// The rail-proxy's one start entry point: serves [`router`] on `listener` over `store`
/// until `shutdown` (draining for [`ProxyConfig::shutdown_grace_ms`]), with the orphan
/// sweeper ([`RailProxy::run_orphan_sweeper`]) running until it stops. Logs a loud warning
/// for each safety switch `cfg` turns off.
pub async fn start<F>(
    cfg: ProxyConfig,
    store: std::sync::Arc<dyn RailStore>,
    clock: dlock_rt::Clock,
    listener: tokio::net::TcpListener,
    shutdown: F,
) -> Result<dlock_rt::ServiceHandle<RailProxy>, String>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if !cfg.fencing_enabled {
        tracing::warn!(
            profile = "unsafe-test",
            skipped = "step 1 (the high-water mark)",
            "rail_proxy_fencing_disabled"
        );
    }
    if cfg.grants.accepts_unsigned() {
        tracing::warn!(
            profile = "unsafe-test",
            admitted = "tokens without a grant signature",
            "rail_proxy_grants_unsigned_accepted"
        );
    }
    if !cfg.duplicate_guard_enabled {
        tracing::warn!(
            profile = "unsafe-test",
            skipped = "step 2 (one attempt per payout)",
            "rail_proxy_duplicate_guard_disabled"
        );
    }
    let auth = dlock_http::auth::Authenticator::new(NODE, dlock_contract::auth::RAIL_PROXY_ROUTES, &cfg.auth, clock)?;
    let reloader = auth.as_ref().and_then(|a| a.spawn_reloader());
    let grace_ms = cfg.shutdown_grace_ms();
    let proxy = RailProxy::new(store, cfg, clock);
    let sweeper = dlock_rt::spawn(proxy.clone().run_orphan_sweeper());
    let router = app::router_with_auth(proxy.clone(), auth);
    let handle = dlock_rt::ServiceHandle::serve(proxy.clone(), listener, router, grace_ms, shutdown)
        .map_err(|e| format!("rail-proxy: {e}"))?;
    let handle = handle.with_background(sweeper);
    Ok(match reloader {
        Some(r) => handle.with_background(r),
        None => handle,
    })
}
