//! Where a client's fresh connection goes: its authority's addresses, a host name's kept for
//! a short while (issue 14; docs/performance.md "Clients: connections and host names").
//!
//! Every acquire, submission and rail forward opens a fresh connection (the module doc of
//! [`super`] says why). Deployed, URLs name hosts (`http://lock-server:8081` in the compose
//! and Kubernetes files), and connecting by name asked the system resolver each time: a hop
//! to tokio's blocking pool and `getaddrinfo`, which in a cluster is one or more DNS
//! queries per connection, on the request's path and on the cluster's DNS server.
//!
//! Rules (asserted in release builds too, where they can be):
//! - An authority that is an IP address and port is connected to as it is: never looked up,
//!   never kept.
//! - A name's addresses are used for at most [`RESOLVE_KEEP_MS_MAX`] after the lookup that
//!   found them; after that the next connection looks the name up again. A lookup that
//!   fails or finds nothing is not kept.
//! - A connection that fails to open (refused, unreachable, or not open within the connect
//!   budget) forgets its authority's addresses, so a service that moved costs at most the
//!   one failed connect. That failure is "nothing sent", as every connect failure is: the
//!   caller's retry rules do not change.
//! - At most [`RESOLVE_HOSTS_MAX`] authorities are kept; a new one past that replaces the
//!   one looked up longest ago.
//! - Times are read on the reference clock ([`crate::Clock::reference`]), as the keep-alive
//!   pool's are: one client may serve tasks of several simulated nodes.
//!
//! Under `cfg(madsim)` names are the simulator's own, resolved in memory by its network:
//! connections go straight to `TcpStream::connect`, nothing is kept (a process-wide cache
//! would carry one seed's addresses into the next world).

// Under madsim only `connect` and `forget` are reached.
#![cfg_attr(madsim, allow(dead_code))]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpStream;

/// Longest a looked-up name's addresses are used, in milliseconds. Short next to a cluster
/// DNS record's lifetime (CoreDNS answers for Kubernetes services with 5 s), long next to
/// the time between two connections of a busy client.
pub const RESOLVE_KEEP_MS_MAX: u64 = 1_000;
/// Most authorities whose addresses are kept at once, per process.
pub const RESOLVE_HOSTS_MAX: usize = 256;

/// A name's addresses and when the lookup that found them ended.
#[derive(Debug, Clone)]
struct Kept {
    at: crate::Instant,
    addrs: std::sync::Arc<[SocketAddr]>,
}

/// Looked-up authorities (a `BTreeMap`: nothing depends on its order, and none leaks).
#[derive(Debug, Default)]
pub(super) struct Resolver {
    kept: std::sync::Mutex<BTreeMap<String, Kept>>,
    /// Lookups this resolver has asked the system for.
    lookups: std::sync::atomic::AtomicU64,
}

/// The process's resolver: every [`super::HttpClient`] connects through it.
pub(super) fn process() -> &'static Resolver {
    static PROCESS: std::sync::OnceLock<Resolver> = std::sync::OnceLock::new();
    PROCESS.get_or_init(Resolver::default)
}

/// Whether addresses looked up at `at` may still be used at `now`.
fn fresh(at: crate::Instant, now: crate::Instant) -> bool {
    now.saturating_duration_since(at) < Duration::from_millis(RESOLVE_KEEP_MS_MAX)
}

impl Resolver {
    /// Opens a TCP connection to `authority` (`host:port`). Failing, it forgets the
    /// authority's addresses. The caller bounds the whole (lookup included) by its connect
    /// budget, and calls [`Resolver::forget`] when that budget runs out first.
    pub(super) async fn connect(&self, authority: &str) -> std::io::Result<TcpStream> {
        #[cfg(madsim)]
        {
            let _ = self;
            TcpStream::connect(authority).await
        }
        #[cfg(not(madsim))]
        {
            if let Ok(addr) = authority.parse::<SocketAddr>() {
                return TcpStream::connect(addr).await;
            }
            let addrs = self.addrs(authority, crate::Clock::reference().now()).await?;
            match TcpStream::connect(&addrs[..]).await {
                Ok(stream) => Ok(stream),
                Err(e) => {
                    self.forget(authority);
                    Err(e)
                }
            }
        }
    }

    /// `authority`'s addresses at `now`: the kept ones while fresh, else a new lookup
    /// (kept when it found any).
    async fn addrs(&self, authority: &str, now: crate::Instant) -> std::io::Result<std::sync::Arc<[SocketAddr]>> {
        if let Some(kept) = self.kept_at(authority, now) {
            return Ok(kept);
        }
        self.lookups.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let addrs: std::sync::Arc<[SocketAddr]> = tokio::net::lookup_host(authority).await?.collect();
        if addrs.is_empty() {
            return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{authority} has no address")));
        }
        self.keep(authority, now, addrs.clone());
        Ok(addrs)
    }

    /// The kept addresses of `authority`, if looked up within the window before `now`.
    fn kept_at(&self, authority: &str, now: crate::Instant) -> Option<std::sync::Arc<[SocketAddr]>> {
        let kept = self.kept.lock().ok()?;
        kept.get(authority).filter(|k| fresh(k.at, now)).map(|k| k.addrs.clone())
    }

    /// Keeps `addrs` for `authority`, looked up at `at`. Stale entries go first; past
    /// [`RESOLVE_HOSTS_MAX`] the entry looked up longest ago makes room.
    fn keep(&self, authority: &str, at: crate::Instant, addrs: std::sync::Arc<[SocketAddr]>) {
        assert!(!addrs.is_empty(), "an empty lookup is never kept");
        let Ok(mut kept) = self.kept.lock() else { return };
        kept.retain(|_, k| fresh(k.at, at));
        if kept.len() >= RESOLVE_HOSTS_MAX && !kept.contains_key(authority) {
            let oldest = kept.iter().min_by_key(|(_, k)| k.at).map(|(a, _)| a.clone());
            if let Some(oldest) = oldest {
                kept.remove(&oldest);
            }
        }
        kept.insert(authority.to_owned(), Kept { at, addrs });
        assert!(kept.len() <= RESOLVE_HOSTS_MAX, "the kept addresses are bounded");
    }

    /// Forgets `authority`'s addresses: the next connection looks it up again.
    pub(super) fn forget(&self, authority: &str) {
        if let Ok(mut kept) = self.kept.lock() {
            kept.remove(authority);
        }
    }

    /// Lookups asked of the system so far.
    #[cfg(test)]
    pub(super) fn lookups(&self) -> u64 {
        self.lookups.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Whether `authority`'s addresses are kept (fresh or not).
    #[cfg(test)]
    pub(super) fn keeps(&self, authority: &str) -> bool {
        self.kept.lock().is_ok_and(|k| k.contains_key(authority))
    }
}

#[cfg(all(test, not(madsim)))]
mod tests {
    use super::*;

    /// An IP address and port is connected to as it is: no lookup, nothing kept.
    #[tokio::test]
    async fn an_ip_authority_is_never_looked_up_or_kept() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let authority = listener.local_addr().expect("addr").to_string();
        let r = Resolver::default();
        r.connect(&authority).await.expect("connect");
        assert_eq!(r.lookups(), 0);
        assert!(!r.keeps(&authority));
    }

    /// A name is looked up once and its addresses used until the window ends; the first
    /// connection after that looks it up again.
    #[tokio::test]
    async fn a_name_is_looked_up_once_per_window() {
        let r = Resolver::default();
        let now = crate::Clock::reference().now();
        let first = r.addrs("localhost:8081", now).await.expect("localhost resolves");
        assert!(!first.is_empty());
        let again = r.addrs("localhost:8081", now + Duration::from_millis(RESOLVE_KEEP_MS_MAX - 1)).await;
        assert_eq!(again.expect("kept"), first);
        assert_eq!(r.lookups(), 1, "within the window the kept addresses are used");
        r.addrs("localhost:8081", now + Duration::from_millis(RESOLVE_KEEP_MS_MAX)).await.expect("again");
        assert_eq!(r.lookups(), 2, "at the window's end the name is looked up again");
        r.addrs("localhost:8082", now).await.expect("another port");
        assert_eq!(r.lookups(), 3, "each authority is its own entry");
    }

    /// A connection that cannot open forgets its authority; the next one looks it up again.
    #[tokio::test]
    async fn a_failed_connection_forgets_its_authority() {
        // A port nothing listens on: bound, then closed.
        let port = {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            l.local_addr().expect("addr").port()
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let open = format!("localhost:{}", listener.local_addr().expect("addr").port());
        let closed = format!("localhost:{port}");
        let r = Resolver::default();
        r.connect(&open).await.expect("connect by name");
        r.connect(&open).await.expect("again");
        assert_eq!(r.lookups(), 1, "the second connection used the kept addresses");
        assert!(r.keeps(&open));
        assert!(r.connect(&closed).await.is_err(), "nothing listens there");
        assert!(!r.keeps(&closed), "a failed connection forgets its authority");
        assert!(r.connect(&closed).await.is_err());
        assert_eq!(r.lookups(), 3, "so the next connection looked it up again");
        r.forget(&open);
        r.connect(&open).await.expect("connect by name");
        assert_eq!(r.lookups(), 4, "forgotten by the caller (its connect budget ran out)");
    }

    /// At most RESOLVE_HOSTS_MAX authorities are kept; a new one replaces the oldest, and
    /// stale ones are dropped first.
    #[test]
    fn kept_authorities_are_bounded_and_the_oldest_makes_room() {
        let r = Resolver::default();
        let addr: SocketAddr = "127.0.0.1:1".parse().expect("addr");
        let t0 = crate::Clock::reference().now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for i in 0..RESOLVE_HOSTS_MAX {
            r.keep(&format!("h{i}:1"), at(1 + i as u64), [addr].into());
        }
        r.keep("h1:1", at(300), [addr].into());
        assert_eq!(r.kept.lock().expect("lock").len(), RESOLVE_HOSTS_MAX, "a kept authority is replaced in place");
        r.keep("new:1", at(400), [addr].into());
        assert_eq!(r.kept.lock().expect("lock").len(), RESOLVE_HOSTS_MAX);
        assert!(!r.keeps("h0:1"), "the entry looked up longest ago made room");
        assert!(r.keeps("new:1") && r.keeps("h1:1") && r.keeps("h2:1"));
        let late = at(400 + RESOLVE_KEEP_MS_MAX - 1);
        r.keep("late:1", late, [addr].into());
        assert_eq!(r.kept.lock().expect("lock").len(), 2, "stale entries are dropped before a new one is kept");
        assert!(r.kept_at("new:1", late).is_some());
        assert_eq!(r.kept_at("new:1", at(400 + RESOLVE_KEEP_MS_MAX)), None, "a stale entry is never used");
    }
}
