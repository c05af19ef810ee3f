//! The payment-resource: enforcement point (a) (C3 §3.4).
//!
//! It serves P1–P5, two create endpoints and the operator's resolution of a quarantined
//! payout (C3-extensions E-21) over paydb, and trusts no lock state: only the
//! token it is handed and the fence it has stored (FR-15). Every protected write is one
//! conditional statement, `UPDATE accounts SET fence = :presented … WHERE … AND fence <
//! :presented`, in the same transaction as the state transition and, for a post, the two
//! balanced ledger entries. An equal token loses: strictly greater, never `>=`.
//!
//! The rules (the strict fence, the claim and post decisions, the ledger posting) are pure
//! functions, once, in [`rules`]; every store reads its facts, calls them, and applies the
//! answer under its own conditional writes.
//!
//! Every mutating request is recorded in a durable idempotency ledger, with its fingerprint
//! and complete response, atomically with the mutation (see [`store`]).

pub mod answer;
pub mod app;
pub mod config;
pub mod cursor;
pub mod fenced;
pub mod idempotency;
pub mod metrics;
pub mod openapi;
pub mod payout_accounts;
pub mod rules;
pub mod service;
pub mod store;
pub mod store_fault;
pub mod store_layer;
pub mod store_mem;
#[cfg(not(madsim))]
pub mod store_sql;
pub mod store_timed;

/// The payment-resource's name for itself in emitted protocol events ([`dlock_rt::events`]).
pub const NODE: &str = "payment-resource";

pub use app::router;
pub use service::{PaymentConfig, PaymentResource};
pub use store::PaymentStore;

/// The payment-resource's one start entry point: reads (or creates) the cursor key in
/// `store`, then serves [`router`] on `listener` until `shutdown` (draining for
/// [`service::SHUTDOWN_GRACE_MS_MAX`]), with the idempotency purger
/// ([`PaymentResource::run_purger`]) running until it stops.
pub async fn start<F>(
    cfg: PaymentConfig,
    store: std::sync::Arc<dyn PaymentStore>,
    clock: dlock_rt::Clock,
    listener: tokio::net::TcpListener,
    shutdown: F,
) -> Result<dlock_rt::ServiceHandle<PaymentResource>, String>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    if cfg.grants.accepts_unsigned() {
        tracing::warn!(
            profile = "unsafe-test",
            admitted = "tokens without a grant signature",
            "payment_grants_unsigned_accepted"
        );
    }
    let auth = dlock_http::auth::Authenticator::new(NODE, dlock_contract::auth::PAYMENT_ROUTES, &cfg.auth, clock)?;
    let reloader = auth.as_ref().and_then(|a| a.spawn_reloader());
    let pr = PaymentResource::start(store, cfg, clock).await.map_err(|e| format!("paydb: {e}"))?;
    let purger = dlock_rt::spawn(pr.clone().run_purger());
    let grace = service::SHUTDOWN_GRACE_MS_MAX;
    let router = app::router_with_auth(pr.clone(), auth);
    let handle = dlock_rt::ServiceHandle::serve(pr.clone(), listener, router, grace, shutdown)
        .map_err(|e| format!("payment-resource: {e}"))?;
    let handle = handle.with_background(purger);
    Ok(match reloader {
        Some(r) => handle.with_background(r),
        None => handle,
    })
}
