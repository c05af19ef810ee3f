//! The runtime seam. Service code takes time, sleep, tasks, randomness and sockets from
//! here and nowhere else, so the same code runs on tokio in production and inside a seeded
//! madsim world under `RUSTFLAGS="--cfg madsim"`.
//!
//! Rules this crate exists to enforce:
//! - Wall-clock readings go through a [`Clock`], which carries the node's skew. Leases are
//!   measured on the monotonic clock ([`Clock::now`]), never on the wall clock.
//! - Randomness comes from [`rand`]: in simulation it is derived from the seed, so a seed
//!   replays bit for bit.
//! - Tasks are spawned with [`spawn`]; sockets are opened with [`http::bind`] and
//!   [`http::HttpClient`]. Both resolve to madsim's simulated network under `cfg(madsim)`.

pub mod clock;
pub mod http;
pub mod rand;
pub mod service;

pub use clock::Clock;
pub use service::ServiceHandle;

pub use tokio::task::JoinHandle;
pub use tokio::time::{Duration, Instant};

/// Spawns a task on the current runtime (tokio, or the current madsim node).
pub fn spawn<F>(future: F) -> JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(future)
}

/// Sleeps on the runtime's timer (virtual time in simulation).
pub async fn sleep(d: Duration) {
    tokio::time::sleep(d).await
}

/// Runs `f` with a deadline on the runtime's timer; `None` when the deadline passed first.
pub async fn timeout<F: std::future::Future>(d: Duration, f: F) -> Option<F::Output> {
    tokio::time::timeout(d, f).await.ok()
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
