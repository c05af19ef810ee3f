//! A started service: what every service crate's `start` entry point returns.
//!
//! A service is its router served on one listener until a shutdown signal, plus the
//! background tasks it owns (a reaper, a purger, an orphan sweeper: loops that run until
//! the process ends) and the tasks that must drain before it stops (the executor's
//! workers). [`ServiceHandle::stopped`] waits for the server to drain after the signal,
//! then for the draining tasks, then aborts the background loops.
//!
//! Invariant: a background task never outlives its handle's `stopped` or `abort`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;

use crate::JoinHandle;

/// A running service; `service` is the shared state its router serves.
pub struct ServiceHandle<S> {
    pub service: Arc<S>,
    /// Where the listener is bound (port 0 resolved).
    pub local_addr: SocketAddr,
    server: JoinHandle<()>,
    draining: Vec<JoinHandle<()>>,
    background: Vec<JoinHandle<()>>,
}

impl<S> ServiceHandle<S> {
    /// Serves `router` on `listener` until `shutdown`, allowing in-flight requests up to
    /// `grace_ms_max` to finish, with this process's header limit
    /// ([`crate::http::process_header_bytes_max`], `http.header-bytes-max`) and its TLS
    /// ([`crate::tls::process_tls`], `tls.*`; refused when TLS is on without an identity).
    pub fn serve<F>(
        service: Arc<S>,
        listener: TcpListener,
        router: axum::Router,
        grace_ms_max: u64,
        shutdown: F,
    ) -> std::io::Result<ServiceHandle<S>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let local_addr = listener.local_addr()?;
        let tls = match crate::tls::process_tls() {
            None => None,
            Some(crate::tls::Tls { server: Some(server), .. }) => Some(server.clone()),
            Some(crate::tls::Tls { server: None, .. }) => {
                return Err(std::io::Error::other(
                    "tls.enabled is true but tls.cert-file and tls.key-file are not set: a service cannot serve TLS",
                ));
            }
        };
        let server = crate::spawn(crate::http::serve_with_tls(
            listener,
            router,
            shutdown,
            crate::http::ServeLimits { grace_ms_max, header_bytes_max: crate::http::process_header_bytes_max() },
            tls,
        ));
        Ok(ServiceHandle { service, local_addr, server, draining: Vec::new(), background: Vec::new() })
    }

    /// Adds a loop that runs until the service stops (aborted then).
    pub fn with_background(mut self, task: JoinHandle<()>) -> ServiceHandle<S> {
        self.background.push(task);
        self
    }

    /// Adds a task that ends by itself after the shutdown signal; [`ServiceHandle::stopped`]
    /// waits for it.
    pub fn with_draining(mut self, task: JoinHandle<()>) -> ServiceHandle<S> {
        self.draining.push(task);
        self
    }

    /// Waits until the server has drained (after its shutdown signal) and every draining
    /// task has ended, then stops the background loops.
    pub async fn stopped(self) {
        let _ = self.server.await;
        for t in self.draining {
            let _ = t.await;
        }
        for t in self.background {
            t.abort();
            let _ = t.await;
        }
    }

    /// Stops everything at once, in-flight requests included (a crash, not a drain).
    pub fn abort(&self) {
        self.server.abort();
        for t in self.draining.iter().chain(&self.background) {
            t.abort();
        }
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    #[tokio::test]
    async fn a_stopped_service_drains_its_tasks_then_aborts_its_background_loops() {
        let listener = crate::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let drained = Arc::new(AtomicBool::new(false));
        let d = drained.clone();
        let (loop_tx, mut loop_rx) = tokio::sync::mpsc::channel::<()>(1);
        let h = ServiceHandle::serve(Arc::new(()), listener, axum::Router::new(), 1_000, async {
            let _ = rx.await;
        })
        .expect("serve")
        .with_draining(crate::spawn(async move {
            crate::sleep(crate::Duration::from_millis(50)).await;
            d.store(true, Ordering::SeqCst);
        }))
        .with_background(crate::spawn(async move {
            let _keep = loop_tx;
            std::future::pending::<()>().await;
        }));
        assert_ne!(h.local_addr.port(), 0);
        let _ = tx.send(());
        h.stopped().await;
        assert!(drained.load(Ordering::SeqCst), "stopped returned before the draining task ended");
        assert_eq!(loop_rx.recv().await, None, "the background loop outlived its service");
    }
}
