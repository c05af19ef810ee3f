//! The operator's web console (issue 38): server-rendered pages over the services' HTTP
//! APIs, for a human at 03:00: payouts by state, each payout's story (created → claim →
//! intent → outcome → post, and every fenced-out write), the quarantine of ambiguous
//! payouts with the operator's resolution of each, a lock lookup with the operator's revoke,
//! and the recent events, kept live.
//!
//! It holds no data of its own and no authority of its own: a person signs in with a dlock
//! bearer token (operator or reader, C3-extensions E-13), the console keeps it in a
//! server-side session ([`session`]) and calls the services with it, and the services
//! authorize every call again. The console's own checks (a session, the CSRF token, the
//! origin, the role an action needs) come first, so a refused action never reaches a
//! service.
//!
//! Invariants:
//! - Every value a client or a service controls is escaped by the one helper
//!   [`html::esc`] wherever it is put into a page; no page holds an inline script, a
//!   `style=` attribute or an `on…=` handler, and every answer carries the CSP
//!   ([`app::CSP`]) that forbids them.
//! - No token (bearer, session id, CSRF) reaches a log or a page but the CSRF token in its
//!   own hidden field.
//! - Every bound is a named constant: sessions ([`session::SESSIONS_MAX`]), live streams
//!   ([`live::LIVE_STREAMS_MAX`]), pages read per count ([`app::COUNT_PAGES_MAX`]), form
//!   size and fields, upstream budgets ([`upstream`]).
//!
//! The console drives real sockets through `dlock_rt` and is not part of the simulation:
//! under `--cfg madsim` this crate is empty.

#[cfg(not(madsim))]
pub mod app;
#[cfg(not(madsim))]
pub mod config;
#[cfg(not(madsim))]
pub mod html;
#[cfg(not(madsim))]
pub mod live;
#[cfg(not(madsim))]
pub mod pages;
#[cfg(not(madsim))]
pub mod session;
#[cfg(not(madsim))]
pub mod upstream;

#[cfg(not(madsim))]
pub use app::Console;
#[cfg(not(madsim))]
pub use config::{ConsoleConfig, ConsoleSettings};

/// The service name the console's authenticator logs under.
pub const NODE: &str = "console";

/// Longest a graceful shutdown waits for in-flight requests (a `/live` stream is cut), ms.
pub const SHUTDOWN_GRACE_MS_MAX: u64 = 2_000;

/// The console's one start entry point (`dlock console` and `dlock up`): loads the
/// credentials (and follows the credentials file), then serves the console on `listener`
/// until `shutdown`.
#[cfg(not(madsim))]
pub async fn start<F>(
    cfg: ConsoleConfig,
    clock: dlock_rt::Clock,
    listener: tokio::net::TcpListener,
    shutdown: F,
) -> Result<dlock_rt::ServiceHandle<Console>, String>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let auth = dlock_http::auth::Authenticator::new(NODE, dlock_contract::auth::HEALTH_ROUTES, &cfg.auth, clock)?;
    if auth.is_none() {
        tracing::warn!(service = NODE, "console_auth_off_every_token_signs_in_as_operator");
    }
    let reloader = auth.as_ref().and_then(|a| a.spawn_reloader());
    let secure = dlock_rt::tls::process_tls().is_some();
    let console = std::sync::Arc::new(Console::new(cfg, auth, clock, secure));
    let router = app::router(console.clone());
    let handle = dlock_rt::ServiceHandle::serve(console, listener, router, SHUTDOWN_GRACE_MS_MAX, shutdown)
        .map_err(|e| format!("console: {e}"))?;
    Ok(match reloader {
        Some(r) => handle.with_background(r),
        None => handle,
    })
}
