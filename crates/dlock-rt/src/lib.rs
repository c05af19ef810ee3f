//! The runtime seam. Service code takes time, sleep, tasks, randomness and sockets from
//! here and nowhere else, so the same code runs on tokio in production and inside a seeded
//! madsim world under `RUSTFLAGS="--cfg madsim"`.
//!
//! Rules this crate exists to enforce:
//! - Wall-clock readings go through a [`Clock`], which carries the node's skew. Leases are
//!   measured on the monotonic clock ([`Clock::now`], [`Instant::now`]), never on the wall
//!   clock.
//! - Time is node-local: [`Clock::now`], [`sleep`], [`sleep_until`], [`timeout`] and
//!   [`wait_until`] follow the clock of the node running the caller. In simulation each node's
//!   clock has its own rate and wall offset (`sim_clock`, under `cfg(madsim)`); an [`Instant`]
//!   only compares with instants of its own node. `tokio::time` used directly would read
//!   madsim's global clock and bypass the node's: service code never does.
//! - Randomness comes from [`rand`]: in simulation it is derived from the seed, so a seed
//!   replays bit for bit.
//! - Tasks are spawned with [`spawn`]; sockets are opened with [`http::bind`] and
//!   [`http::HttpClient`]. Both resolve to madsim's simulated network under `cfg(madsim)`.
//!
//! The workspace's `clippy.toml` refuses those calls (`disallowed-methods`) everywhere but
//! here: this crate is the one place allowed to make them.
#![allow(
    clippy::disallowed_methods,
    reason = "dlock-rt is the seam: the one crate that reads clocks, sleeps, spawns and serves"
)]

#[macro_use]
mod tally;
pub mod buggify;
pub mod clock;
pub mod dedicated;
pub mod events;
pub mod http;
#[cfg(not(madsim))]
pub mod otlp;
/// The OTLP exporter is production-only: under the simulation it is compiled out and
/// `telemetry.otlp.enabled` is refused at start-up.
#[cfg(madsim)]
pub mod otlp {
    pub fn install_process_exporter(
        settings: &dlock_config::telemetry::OtlpSettings,
        _service_name: &str,
    ) -> Result<(), String> {
        match settings.enabled {
            true => Err(format!("{} is not available in the simulation", dlock_config::telemetry::OTLP_ENABLED_KEY)),
            false => Ok(()),
        }
    }
}
pub mod probe;
pub mod rand;
pub mod service;
pub mod signal;
#[cfg(madsim)]
pub mod sim_clock;
pub mod tls;
pub mod trace;
pub mod traffic;
pub mod wire_log;

pub use clock::{Clock, Instant};
/// Test-only switches of the stale-writer defences (`cfg(madsim)` only; see the module).
pub use dlock_contract::defence;
/// Test-only planted bugs, the negative controls (`cfg(madsim)` only; see the module).
pub use dlock_contract::planted;
pub use service::ServiceHandle;

pub use tokio::task::JoinHandle;
pub use tokio::time::Duration;

/// Spawns a task on the current runtime (tokio, or the current madsim node).
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(future)
}

/// Sleeps until the current node's clock has advanced by `d` (virtual time in simulation,
/// where a node at rate `r` sleeps `d / r` of global time).
pub async fn sleep(d: Duration) {
    #[cfg(not(madsim))]
    tokio::time::sleep(d).await;
    #[cfg(madsim)]
    match sim_clock::deadline_in(d) {
        Some(deadline) => sim_clock::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `deadline`'s clock (in simulation: the node it was read on) reaches it.
pub async fn sleep_until(deadline: Instant) {
    #[cfg(not(madsim))]
    tokio::time::sleep_until(deadline).await;
    #[cfg(madsim)]
    sim_clock::sleep_until(deadline).await;
}

/// Runs `f` with a deadline `d` away on the current node's clock; `None` when the deadline
/// passed first. `f` is polled first, so a ready `f` wins even at a zero deadline.
#[cfg(not(madsim))]
pub async fn timeout<F: std::future::Future>(d: Duration, f: F) -> Option<F::Output> {
    tokio::time::timeout(d, f).await.ok()
}

/// Runs `f` with a deadline `d` away on the current node's clock; `None` when the deadline
/// passed first. `f` is polled first, so a ready `f` wins even at a zero deadline.
#[cfg(madsim)]
pub async fn timeout<F: std::future::Future>(d: Duration, f: F) -> Option<F::Output> {
    let Some(deadline) = sim_clock::deadline_in(d) else { return Some(f.await) };
    tokio::select! {
        biased;
        v = f => Some(v),
        () = sim_clock::sleep_until(deadline) => None,
    }
}

/// Polls `cond` every `interval` until it returns `Some` or `deadline` passes. The tool for
/// "wait until" in tests and start-up code: never a bare sleep.
pub async fn wait_until<T, F, Fut>(interval: Duration, deadline: Duration, mut cond: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = cond().await {
            return Some(v);
        }
        if start.elapsed() >= deadline {
            return None;
        }
        sleep(interval).await;
    }
}
