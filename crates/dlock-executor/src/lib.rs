//! The executor: the worker that moves payouts through the cluster.
//!
//! It is written against the runtime seam (`dlock-rt`) and speaks HTTP only, so the same
//! code runs as `dlock executor` on tokio and on a madsim node in the simulation. See
//! [`worker`] for the critical section and [`hops`] for the C3 §3.8 budgets.

pub mod config;
pub mod hops;
pub mod metrics;
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
    let routes = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/health/live", get(dlock_http::health::live))
        .route("/health/ready", get(ready))
        .with_state(executor);
    dlock_http::finish(routes, 1_024)
}

async fn metrics(State(e): State<Arc<Executor>>) -> Response {
    dlock_http::metrics::response(e.metrics.render())
}

async fn ready(State(_e): State<Arc<Executor>>) -> Response {
    dlock_http::health::ready(BTreeMap::new())
}
