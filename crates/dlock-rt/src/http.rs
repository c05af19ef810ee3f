//! HTTP serve and connect over tokio's or madsim's TCP.
//!
//! Servers are axum routers driven by hyper's HTTP/1 connection builder, one task per
//! connection (keep-alive: one connection may carry many requests). A client opens one
//! connection per request by default, so a request's fate (never sent, sent and answered,
//! sent and lost) is never blurred by a pool: the rail-proxy and the executor's submit
//! depend on telling "could not connect" (nothing presented) from "sent, no answer"
//! (ambiguous), and so does the lock client's acquire.
//!
//! A client made with [`HttpClient::with_keep_alive`] keeps answered connections open for
//! the next request to the same authority: only for hops where a lost answer is already
//! safe to ask again (advisory GETs, idempotency-keyed writes, lock release and heartbeat).
//! Its invariants (asserted in release builds too):
//! - A failure on a reused connection is never "nothing sent": once a request is handed to
//!   a connection, every failure is [`ClientError::Broken`] or [`ClientError::Timeout`].
//!   `Connect` comes only from opening a fresh connection. An idle connection found closed
//!   (or not ready within the connect budget) *before* the request is handed to it is
//!   dropped unused, so no byte of that request went anywhere.
//! - Bounded: at most [`KEEP_ALIVE_IDLE_PER_HOST_MAX`] idle connections per authority, none
//!   reused after [`KEEP_ALIVE_IDLE_MS_MAX`] idle, which is shorter than the server's idle
//!   close ([`HEADER_READ_MS_MAX`]); a connection leaves the pool while it carries a request.
//!
//! A fresh connection to a host name uses that name's addresses from a lookup at most
//! [`RESOLVE_KEEP_MS_MAX`] old ([`resolve`]); an IP address is connected to as it is.
//!
//! Every request head a server receives is validated before hyper parses it (see
//! [`guard`]): a malformed request line, a target that is not a URI, a malformed header or
//! body framing, or a header section over [`ServeLimits::header_bytes_max`] is answered with
//! the C3 envelope (`400 VALIDATION_FAILED` or `431 HEADERS_TOO_LARGE`), never with
//! hyper's bodyless answer.
//!
//! Both sides may speak TLS ([`crate::tls`], production only): a server given a
//! [`crate::tls::ServerTls`] ([`serve_with_tls`]) handshakes every connection before the
//! guard sees a byte; a client with a [`crate::tls::ClientTls`] calls `https://` URLs,
//! handshaking as part of connecting (a failed handshake on its side is "nothing sent").
//! A server that refuses the client's certificate (mutual TLS) does so after the client's
//! last handshake flight under TLS 1.3, so the client sees that refusal as a broken
//! exchange: ambiguous, the conservative reading.

mod bearer;
mod guard;
mod resolve;

pub use bearer::{Bearer, BearerSource, TOKEN_FILE_BYTES_MAX};
pub use resolve::{RESOLVE_HOSTS_MAX, RESOLVE_KEEP_MS_MAX};

pub use guard::HEADERS_COUNT_MAX;

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tower::ServiceExt;

/// Default bound on how long a graceful shutdown waits for in-flight requests.
pub const SHUTDOWN_GRACE_MS_DEFAULT: u64 = 5_000;
/// Longest an idle server connection may take to send its request head.
pub const HEADER_READ_MS_MAX: u64 = 30_000;
/// Longest a kept-alive client connection ([`HttpClient::with_keep_alive`]) may sit idle
/// and still be reused: shorter than the server's idle close ([`HEADER_READ_MS_MAX`]), so a
/// server does not close a connection for idleness just as the client reuses it.
pub const KEEP_ALIVE_IDLE_MS_MAX: u64 = 4_000;
const _: () = assert!(KEEP_ALIVE_IDLE_MS_MAX < HEADER_READ_MS_MAX);
/// Most idle connections one kept-alive client holds per authority (more in use at once
/// are closed after their answer instead of being kept).
pub const KEEP_ALIVE_IDLE_PER_HOST_MAX: usize = 16;
/// Default bound on a request's header section (request line, headers, final CRLF), in
/// bytes: `http.header-bytes-max`.
pub const HEADER_BYTES_MAX_DEFAULT: usize = 16_384;
/// Smallest `header_bytes_max` a server honours (smaller values are raised to it).
pub const HEADER_BYTES_MAX_FLOOR: usize = 1_024;
/// Largest `header_bytes_max` a server honours (larger values are lowered to it). It keeps
/// every request target under hyper's own URI limit, so that limit never answers first.
pub const HEADER_BYTES_MAX_CEILING: usize = 65_536;

/// `http.header-bytes-max` of this process: every server started through
/// [`crate::service::ServiceHandle::serve`] enforces it. Set once at start-up (the binary
/// resolves the key before any service starts); [`HEADER_BYTES_MAX_DEFAULT`] until then.
static PROCESS_HEADER_BYTES_MAX: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(HEADER_BYTES_MAX_DEFAULT);

/// Sets this process's header limit (`http.header-bytes-max`), refusing a value outside
/// [`HEADER_BYTES_MAX_FLOOR`]..=[`HEADER_BYTES_MAX_CEILING`].
pub fn set_process_header_bytes_max(bytes: usize) -> Result<(), String> {
    if !(HEADER_BYTES_MAX_FLOOR..=HEADER_BYTES_MAX_CEILING).contains(&bytes) {
        return Err(format!(
            "http.header-bytes-max must be {HEADER_BYTES_MAX_FLOOR} to {HEADER_BYTES_MAX_CEILING} bytes, not {bytes}"
        ));
    }
    PROCESS_HEADER_BYTES_MAX.store(bytes, std::sync::atomic::Ordering::Relaxed);
    Ok(())
}

/// This process's header limit (see [`set_process_header_bytes_max`]).
pub fn process_header_bytes_max() -> usize {
    PROCESS_HEADER_BYTES_MAX.load(std::sync::atomic::Ordering::Relaxed)
}

/// The named bounds of one server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// Longest wait for in-flight requests after shutdown (see [`serve_with_grace`]).
    pub grace_ms_max: u64,
    /// Largest request header section accepted, in bytes; over it the answer is `431
    /// HEADERS_TOO_LARGE`. Clamped into [`HEADER_BYTES_MAX_FLOOR`]..=[`HEADER_BYTES_MAX_CEILING`].
    pub header_bytes_max: usize,
}

impl Default for ServeLimits {
    fn default() -> Self {
        ServeLimits { grace_ms_max: SHUTDOWN_GRACE_MS_DEFAULT, header_bytes_max: HEADER_BYTES_MAX_DEFAULT }
    }
}

impl ServeLimits {
    /// The header limit actually enforced.
    pub fn effective_header_bytes_max(&self) -> usize {
        self.header_bytes_max.clamp(HEADER_BYTES_MAX_FLOOR, HEADER_BYTES_MAX_CEILING)
    }
}

/// Marker a handler puts in a response's extensions to make the server drop the
/// connection without answering (the rail-stub's injected "connection held, then dropped").
#[derive(Debug, Clone, Copy)]
pub struct DropConnection;

#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose")
    }
}

impl std::error::Error for Dropped {}

/// Binds a listener (port 0 picks a free port; read it back with `local_addr`).
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves `router` on `listener` until `shutdown` resolves, then lets in-flight
/// requests finish for up to [`SHUTDOWN_GRACE_MS_DEFAULT`].
pub async fn serve<S>(listener: TcpListener, router: axum::Router, shutdown: S)
where
    S: Future<Output = ()> + Send,
{
    serve_with_grace(listener, router, shutdown, SHUTDOWN_GRACE_MS_DEFAULT).await
}

/// [`serve`], with the longest wait for in-flight requests after `shutdown` set to
/// `grace_ms_max`. A service whose requests can legitimately run long (the rail-proxy's
/// one forward) passes a grace longer than its longest request, so a deploy never cuts a
/// forward between the rail's answer and its recording.
pub async fn serve_with_grace<S>(listener: TcpListener, router: axum::Router, shutdown: S, grace_ms_max: u64)
where
    S: Future<Output = ()> + Send,
{
    serve_with_limits(listener, router, shutdown, ServeLimits { grace_ms_max, ..ServeLimits::default() }).await
}

/// [`serve`], with every bound of [`ServeLimits`] given.
pub async fn serve_with_limits<S>(listener: TcpListener, router: axum::Router, shutdown: S, limits: ServeLimits)
where
    S: Future<Output = ()> + Send,
{
    serve_with_tls(listener, router, shutdown, limits, None).await
}

/// [`serve_with_limits`], over TLS when `tls` is given: every accepted connection
/// completes its handshake within [`crate::tls::TLS_HANDSHAKE_MS_MAX`] (else it is
/// closed, unanswered) before a byte reaches hyper; a client the server's TLS refuses
/// (mutual TLS: no certificate, or one from another CA) never reaches a handler.
pub async fn serve_with_tls<S>(
    listener: TcpListener,
    router: axum::Router,
    shutdown: S,
    limits: ServeLimits,
    tls: Option<crate::tls::ServerTls>,
) where
    S: Future<Output = ()> + Send,
{
    let header_bytes_max = limits.effective_header_bytes_max();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let mut conns: Vec<tokio::task::JoinHandle<()>> = Vec::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            accepted = listener.accept() => {
                let Ok((stream, peer)) = accepted else { continue };
                conns.retain(|h| !h.is_finished());
                let (router, stop_rx) = (router.clone(), stop_rx.clone());
                conns.push(match &tls {
                    None => tokio::spawn(serve_connection(SkipEmptyFlush::new(stream), router, stop_rx, header_bytes_max)),
                    Some(tls) => {
                        let tls = tls.clone();
                        tokio::spawn(async move {
                            let handshake = Duration::from_millis(crate::tls::TLS_HANDSHAKE_MS_MAX);
                            match crate::timeout(handshake, tls.accept(stream)).await {
                                Some(Ok(io)) => serve_connection(io, router, stop_rx, header_bytes_max).await,
                                Some(Err(e)) => tracing::warn!(%peer, "TLS handshake refused: {e}"),
                                None => tracing::warn!(%peer, "TLS handshake not done within {} ms", crate::tls::TLS_HANDSHAKE_MS_MAX),
                            }
                        })
                    }
                });
            }
        }
    }
    drop(listener);
    let _ = stop_tx.send(true);
    let grace = Duration::from_millis(limits.grace_ms_max);
    let all = async {
        for c in conns.iter_mut() {
            let _ = c.await;
        }
    };
    if crate::timeout(grace, all).await.is_none() {
        for c in &conns {
            c.abort();
        }
    }
}

async fn serve_connection<T>(
    stream: T,
    router: axum::Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
    header_bytes_max: usize,
) where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let slot = std::sync::Arc::new(guard::Slot::default());
    let io = guard::HeadGuard::new(stream, header_bytes_max, slot.clone());
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let router = router.clone();
        crate::traffic::count(req.method(), req.uri().path());
        let refused = slot.take_for(req.headers());
        async move {
            if let Some(refused) = refused {
                return Ok(guard::rejection_response(refused, header_bytes_max));
            }
            let resp = match router.oneshot(req.map(Body::new)).await {
                Ok(r) => r,
                Err(never) => match never {},
            };
            if resp.extensions().get::<DropConnection>().is_some() {
                return Err(Dropped);
            }
            Ok::<_, Dropped>(resp)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(RtTimer)
        .header_read_timeout(Duration::from_millis(HEADER_READ_MS_MAX))
        .max_headers(HEADERS_COUNT_MAX)
        .max_header_size(header_bytes_max)
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    let stopped = async move {
        loop {
            let now_stopped = *stop.borrow_and_update();
            if now_stopped || stop.changed().await.is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = conn.as_mut() => {}
        () = stopped => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// hyper's timer, backed by the runtime's node-local sleep ([`crate::sleep`]: in
/// simulation it follows the node's clock, rate included, as every other wait does).
#[derive(Debug, Clone, Copy)]
struct RtTimer;

/// A node-local sleep for hyper, which wants its timers `Sync`: the future sits behind a
/// mutex that only its own polls take.
struct RtSleep(std::sync::Mutex<std::pin::Pin<Box<dyn Future<Output = ()> + Send>>>);

impl Future for RtSleep {
    type Output = ();
    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        match self.0.lock() {
            Ok(mut f) => f.as_mut().poll(cx),
            // A poisoned timer (a panic inside an earlier poll) has fired.
            Err(_) => std::task::Poll::Ready(()),
        }
    }
}

impl hyper::rt::Sleep for RtSleep {}

impl hyper::rt::Timer for RtTimer {
    fn sleep(&self, duration: Duration) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        Box::pin(RtSleep(std::sync::Mutex::new(Box::pin(crate::sleep(duration)))))
    }

    fn sleep_until(&self, deadline: std::time::Instant) -> std::pin::Pin<Box<dyn hyper::rt::Sleep>> {
        let now = std::time::Instant::now();
        self.sleep(deadline.saturating_duration_since(now))
    }
}

/// Forwards reads and writes, and skips flushes with nothing written since the last one.
/// madsim's stream sends a message on every flush (even an empty one) and fails it once the
/// peer has gone, which would turn hyper's final no-op flush into a spurious reset.
struct SkipEmptyFlush<T> {
    inner: T,
    dirty: bool,
}

impl<T> SkipEmptyFlush<T> {
    fn new(inner: T) -> Self {
        SkipEmptyFlush { inner, dirty: false }
    }
}

impl<T: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for SkipEmptyFlush<T> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<T: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for SkipEmptyFlush<T> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let r = std::pin::Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, std::task::Poll::Ready(Ok(n)) if n > 0) {
            self.dirty = true;
        }
        r
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        if !self.dirty {
            return std::task::Poll::Ready(Ok(()));
        }
        let r = std::pin::Pin::new(&mut self.inner).poll_flush(cx);
        if matches!(r, std::task::Poll::Ready(Ok(()))) {
            self.dirty = false;
        }
        r
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How a client request failed. The variants are the three fates a request can have.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No connection was opened (refused, unreachable, or connect timeout): not a byte of
    /// the request left this process.
    #[error("could not connect: {0}")]
    Connect(String),
    /// The request may have been sent, and no complete answer arrived within the read
    /// timeout.
    #[error("no complete answer within {0} ms")]
    Timeout(u64),
    /// The request may have been sent, and the connection failed before a complete answer.
    #[error("connection failed after the request was sent: {0}")]
    Broken(String),
    /// The URL is not `http://host:port/...`.
    #[error("bad url: {0}")]
    BadUrl(String),
}

impl ClientError {
    /// Whether the request provably never reached the peer.
    pub fn nothing_sent(&self) -> bool {
        matches!(self, ClientError::Connect(_) | ClientError::BadUrl(_))
    }
}

/// A parsed `http://host:port` or `https://host:port` base URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BaseUrl {
    pub authority: String,
    /// `https://`: the client speaks TLS to it ([`crate::tls`]).
    pub tls: bool,
}

impl BaseUrl {
    /// Parses `http://host:port` or `https://host:port` (a trailing `/` is allowed;
    /// nothing else may follow).
    pub fn parse(raw: &str) -> Result<BaseUrl, ClientError> {
        let (rest, tls) = match (raw.strip_prefix("http://"), raw.strip_prefix("https://")) {
            (Some(rest), _) => (rest, false),
            (None, Some(rest)) => (rest, true),
            (None, None) => {
                return Err(ClientError::BadUrl(format!("{raw}: only http:// and https:// are supported")));
            }
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        let ok = !authority.is_empty()
            && !authority.contains('/')
            && authority.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok());
        if !ok {
            return Err(ClientError::BadUrl(format!("{raw}: expected http://host:port or https://host:port")));
        }
        Ok(BaseUrl { authority: authority.to_owned(), tls })
    }

    /// A plain-HTTP base URL for `authority` (`host:port`).
    pub fn plain(authority: impl Into<String>) -> BaseUrl {
        BaseUrl { authority: authority.into(), tls: false }
    }

    /// The host part of the authority (what a TLS client names the server by).
    pub fn host(&self) -> &str {
        self.authority.rsplit_once(':').map_or(self.authority.as_str(), |(h, _)| h)
    }

    /// The URL again: `http://host:port` or `https://host:port`.
    pub fn url(&self) -> String {
        format!("{}://{}", if self.tls { "https" } else { "http" }, self.authority)
    }
}

/// The token source every [`HttpClient`] starts with, for a harness that runs many clients
/// in one process (the simulation: every node shares it). A production binary never sets
/// it: each client is given its credential by its own keys.
static PROCESS_BEARER: std::sync::OnceLock<Bearer> = std::sync::OnceLock::new();

/// Sets the process default token source (the first call wins; later ones change nothing).
pub fn set_process_default_bearer(bearer: Bearer) {
    let _ = PROCESS_BEARER.set(bearer);
}

/// A one-connection-per-request HTTP/1 client with explicit connect and read budgets.
/// With TLS ([`HttpClient::new`] takes the process's, [`crate::tls::install_process_tls`])
/// it calls `https://` URLs and refuses `http://` ones; without, it refuses `https://`.
#[derive(Debug, Clone)]
pub struct HttpClient {
    pub connect_timeout_ms: u64,
    pub read_timeout_ms: u64,
    tls: Option<crate::tls::ClientTls>,
    /// Where the `Authorization` header comes from (none: no header).
    pub bearer: Option<Bearer>,
    /// Kept-alive connections ([`HttpClient::with_keep_alive`]), shared by clones; `None`:
    /// one connection per request.
    pool: Option<std::sync::Arc<Pool>>,
}

/// One open client connection: hyper's sender and the task driving the socket (aborted,
/// and so the socket closed, when this is dropped).
struct Conn {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    driver: tokio::task::JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.driver.abort();
    }
}

/// The idle connections of one kept-alive client, by authority (a `BTreeMap`: nothing
/// depends on its order, and none leaks).
#[derive(Default)]
struct Pool {
    idle: std::sync::Mutex<std::collections::BTreeMap<String, Vec<(crate::Instant, Conn)>>>,
    /// Connections this client has opened (reused ones are not counted again).
    opened: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("opened", &self.opened.load(std::sync::atomic::Ordering::Relaxed)).finish()
    }
}

impl Pool {
    /// Pool timestamps are read on the reference clock: one client may be used from tasks
    /// of several simulated nodes, whose own instants do not compare.
    fn now() -> crate::Instant {
        crate::Clock::reference().now()
    }

    fn fresh(since: crate::Instant, now: crate::Instant) -> bool {
        now.saturating_duration_since(since) < Duration::from_millis(KEEP_ALIVE_IDLE_MS_MAX)
    }

    /// The most recently idle connection to `authority` that is still open and within
    /// the idle window; older or closed ones are dropped.
    fn take(&self, authority: &str) -> Option<Conn> {
        let now = Pool::now();
        let mut idle = self.idle.lock().ok()?;
        let list = idle.get_mut(authority)?;
        while let Some((since, conn)) = list.pop() {
            if Pool::fresh(since, now) && !conn.sender.is_closed() {
                return Some(conn);
            }
        }
        None
    }

    /// Keeps `conn` for the next request to `authority`, unless it is closed or the
    /// authority already has [`KEEP_ALIVE_IDLE_PER_HOST_MAX`] idle ones.
    fn put(&self, authority: &str, conn: Conn) {
        if conn.sender.is_closed() {
            return;
        }
        let now = Pool::now();
        let Ok(mut idle) = self.idle.lock() else { return };
        let list = idle.entry(authority.to_owned()).or_default();
        list.retain(|(since, c)| Pool::fresh(*since, now) && !c.sender.is_closed());
        if list.len() < KEEP_ALIVE_IDLE_PER_HOST_MAX {
            list.push((now, conn));
        }
        assert!(list.len() <= KEEP_ALIVE_IDLE_PER_HOST_MAX, "the idle pool is bounded");
    }
}

/// A response whose body is read chunk by chunk ([`HttpClient::get_streaming`]). Dropping
/// it closes its connection.
pub struct StreamingResponse {
    pub status: u16,
    pub headers: http::HeaderMap,
    body: hyper::body::Incoming,
    _conn: Conn,
}

impl std::fmt::Debug for StreamingResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamingResponse").field("status", &self.status).finish_non_exhaustive()
    }
}

impl StreamingResponse {
    /// The next chunk of the body; `Ok(None)` at its end. Waits at most `idle_ms` for it.
    pub async fn next_chunk(&mut self, idle_ms: u64) -> Result<Option<Bytes>, ClientError> {
        loop {
            let frame = match crate::timeout(Duration::from_millis(idle_ms), self.body.frame()).await {
                None => return Err(ClientError::Timeout(idle_ms)),
                Some(None) => return Ok(None),
                Some(Some(f)) => f.map_err(|e| ClientError::Broken(e.to_string()))?,
            };
            if let Ok(data) = frame.into_data() {
                return Ok(Some(data));
            }
        }
    }
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct ClientResponse {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl HttpClient {
    /// A client with this process's TLS (none unless installed).
    pub fn new(connect_timeout_ms: u64, read_timeout_ms: u64) -> HttpClient {
        let tls = crate::tls::process_tls().map(|t| t.client.clone());
        HttpClient { connect_timeout_ms, read_timeout_ms, tls, bearer: PROCESS_BEARER.get().cloned(), pool: None }
    }

    /// This client, keeping answered connections open for its next requests (a new, empty
    /// pool shared by this client's clones; see the module doc for its bounds and rules).
    /// Only for requests whose lost answer is already safe to ask again: never for an
    /// acquire, a submission or a rail call.
    pub fn with_keep_alive(mut self) -> HttpClient {
        self.pool = Some(std::sync::Arc::new(Pool::default()));
        self
    }

    /// Whether this client keeps connections alive.
    pub fn keeps_alive(&self) -> bool {
        self.pool.is_some()
    }

    /// Connections a kept-alive client has opened so far (0 for a one-connection-per-request
    /// client, which keeps no count).
    pub fn connections_opened(&self) -> u64 {
        self.pool.as_ref().map_or(0, |p| p.opened.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// This client with `tls` instead of the process's.
    pub fn with_tls(mut self, tls: Option<crate::tls::ClientTls>) -> HttpClient {
        self.tls = tls;
        self
    }

    /// Refuses a URL whose scheme does not match this client's transport: nothing is sent.
    fn check_scheme(&self, base: &BaseUrl) -> Result<(), ClientError> {
        match (base.tls, self.tls.is_some()) {
            (true, false) => Err(ClientError::BadUrl(format!("{}: https:// needs tls.enabled", base.url()))),
            (false, true) => Err(ClientError::BadUrl(format!(
                "{}: tls.enabled is true, a plaintext http:// request is refused (use https://)",
                base.url()
            ))),
            _ => Ok(()),
        }
    }

    /// This client, presenting `bearer`'s token on every request (C3-extensions E-13);
    /// `None` keeps the client's current source (the process default, if any).
    pub fn with_bearer(mut self, bearer: Option<Bearer>) -> HttpClient {
        if bearer.is_some() {
            self.bearer = bearer;
        }
        self
    }

    /// This client with no credential at all, whatever the process default: for calls
    /// outside dlock (the rail), which must never see a dlock token.
    pub fn without_bearer(mut self) -> HttpClient {
        self.bearer = None;
        self
    }

    /// Opens a connection to `base` and closes it: the rail's reachability, for readiness.
    pub async fn probe(&self, base: &BaseUrl) -> Result<(), ClientError> {
        self.connect(base).await.map(drop)
    }

    /// A TCP connection to `base` within the connect budget, through the process's
    /// resolver ([`resolve`]: a host name's addresses are kept for a short while). A
    /// connection not open within the budget forgets its authority's addresses, as one
    /// that failed does.
    async fn connect(&self, base: &BaseUrl) -> Result<TcpStream, ClientError> {
        let resolver = resolve::process();
        let connect = resolver.connect(base.authority.as_str());
        match crate::timeout(Duration::from_millis(self.connect_timeout_ms), connect).await {
            None => {
                resolver.forget(&base.authority);
                Err(ClientError::Connect(format!("timed out after {} ms", self.connect_timeout_ms)))
            }
            Some(Err(e)) => Err(ClientError::Connect(e.to_string())),
            Some(Ok(stream)) => Ok(stream),
        }
    }

    /// Sends one request on a fresh connection and reads the whole answer.
    /// `path_and_query` starts with `/`. In the simulation every `POST` and its fate go to
    /// [`crate::wire_log`] (nothing is kept outside it); on a real process with a trace
    /// file, each judged write goes to the event seam ([`crate::wire_log::trace_begin`]).
    /// Called inside a trace ([`crate::trace::current`]), the call is a child span of it and
    /// carries its `traceparent` (unless the caller gave that header itself).
    pub async fn send(
        &self,
        base: &BaseUrl,
        method: http::Method,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<ClientResponse, ClientError> {
        // E-17: inside a trace, each call is a child span, sent on as `traceparent`.
        let Some(hop) = crate::trace::current().map(|parent| parent.child()) else {
            return self.send_logged(None, base, method, path_and_query, headers, body).await;
        };
        let span = hop.client_span(method.as_str(), &base.authority, path_and_query);
        tracing::Instrument::instrument(self.send_logged(Some(&hop), base, method, path_and_query, headers, body), span)
            .await
    }

    async fn send_logged(
        &self,
        hop: Option<&crate::trace::TraceContext>,
        base: &BaseUrl,
        method: http::Method,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<ClientResponse, ClientError> {
        if method != http::Method::POST {
            return self.send_unrecorded(hop, base, method, path_and_query, headers, body).await;
        }
        let bytes = body.as_deref().unwrap_or_default();
        let entry = crate::wire_log::begin(&base.authority, method.as_str(), path_and_query, headers, bytes);
        let traced = crate::wire_log::trace_begin(&base.authority, method.as_str(), path_and_query, headers, bytes);
        let result = self.send_unrecorded(hop, base, method, path_and_query, headers, body).await;
        if entry.is_some() || traced.is_some() {
            let fate = match &result {
                Ok(r) => crate::wire_log::Fate::Answered { status: r.status, body: r.body.to_vec() },
                Err(e) => crate::wire_log::Fate::Failed { nothing_sent: e.nothing_sent() },
            };
            crate::wire_log::trace_finish(traced, &fate);
            crate::wire_log::finish(entry, fate);
        }
        result
    }

    async fn send_unrecorded(
        &self,
        hop: Option<&crate::trace::TraceContext>,
        base: &BaseUrl,
        method: http::Method,
        path_and_query: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<ClientResponse, ClientError> {
        self.check_scheme(base)?;
        assert_eq!(base.tls, self.tls.is_some(), "E-15: a request's transport is its URL's scheme");
        // The one place a credential is put on the wire (after the wire log, never logged).
        let authorization = match &self.bearer {
            Some(b) if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("authorization")) => {
                b.header_value(&method, path_and_query)
            }
            _ => None,
        };
        let mut builder =
            Request::builder().method(method).uri(path_and_query).header(http::header::HOST, base.authority.as_str());
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        if let Some(v) = authorization {
            builder = builder.header(http::header::AUTHORIZATION, v);
        }
        if let Some(hop) = hop.filter(|_| !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("traceparent"))) {
            builder = builder.header(crate::trace::TRACEPARENT_HEADER, hop.traceparent());
        }
        let req = builder.body(Full::new(body.unwrap_or_default())).map_err(|e| ClientError::BadUrl(e.to_string()))?;
        let Some(pool) = &self.pool else {
            let mut conn = self.open(base).await?;
            return self.exchange(&mut conn, req).await;
        };
        let (mut conn, reused) = match self.reusable(pool, base).await {
            Some(conn) => (conn, true),
            None => (self.open(base).await?, false),
        };
        let result = self.exchange(&mut conn, req).await;
        // From the hand-over on, a failure is ambiguous, on a reused connection above all.
        assert!(
            !(reused && result.as_ref().is_err_and(ClientError::nothing_sent)),
            "a failure on a reused connection is never \"nothing sent\""
        );
        if result.is_ok() {
            pool.put(&base.authority, conn);
        }
        result
    }

    /// An idle connection of `pool` to `base`, ready for a request within the connect
    /// budget. One that is closed or not ready is dropped before any request is handed to
    /// it (nothing of this request was sent on it), and the next is tried.
    async fn reusable(&self, pool: &Pool, base: &BaseUrl) -> Option<Conn> {
        let budget = Duration::from_millis(self.connect_timeout_ms);
        while let Some(mut conn) = pool.take(&base.authority) {
            if let Some(Ok(())) = crate::timeout(budget, conn.sender.ready()).await {
                return Some(conn);
            }
        }
        None
    }

    /// Opens a connection to `base` (TCP, then TLS when the client has it) and starts
    /// hyper's driver on it. Every failure here is "nothing sent": no byte of a request is
    /// written before this returns.
    async fn open(&self, base: &BaseUrl) -> Result<Conn, ClientError> {
        let stream = self.connect(base).await?;
        let _ = stream.set_nodelay(true);
        if let Some(pool) = &self.pool {
            pool.opened.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        match &self.tls {
            None => Self::start(SkipEmptyFlush::new(stream)).await,
            Some(tls) => {
                // The handshake is part of connecting: no byte of the request is written
                // before it completes, so its failure is "nothing sent".
                let handshake_ms = self.connect_timeout_ms.min(crate::tls::TLS_HANDSHAKE_MS_MAX);
                let io = match crate::timeout(Duration::from_millis(handshake_ms), tls.connect(base.host(), stream))
                    .await
                {
                    None => {
                        return Err(ClientError::Connect(format!("TLS handshake timed out after {handshake_ms} ms")))
                    }
                    Some(Err(e)) => return Err(ClientError::Connect(format!("TLS handshake failed: {e}"))),
                    Some(Ok(io)) => io,
                };
                Self::start(io).await
            }
        }
    }

    /// hyper's HTTP/1 client side on `io`, its driver spawned (it writes nothing by itself).
    async fn start<T>(io: T) -> Result<Conn, ClientError>
    where
        T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| ClientError::Broken(e.to_string()))?;
        let driver = tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(Conn { sender, driver })
    }

    /// Sends `req` on `conn` and reads the whole answer within the read budget.
    /// From here on the request may reach the peer: every failure is ambiguous.
    /// A `GET` whose body is read as it arrives (a Server-Sent Events stream, C3-extensions
    /// E-20), on a connection of its own: the head within the read budget, then each chunk
    /// through [`StreamingResponse::next_chunk`] with its own idle budget. Never recorded in
    /// the wire log (a read).
    pub async fn get_streaming(
        &self,
        base: &BaseUrl,
        path_and_query: &str,
        headers: &[(&str, &str)],
    ) -> Result<StreamingResponse, ClientError> {
        self.check_scheme(base)?;
        let authorization = match &self.bearer {
            Some(b) if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("authorization")) => {
                b.header_value(&http::Method::GET, path_and_query)
            }
            _ => None,
        };
        let mut builder = Request::builder()
            .method(http::Method::GET)
            .uri(path_and_query)
            .header(http::header::HOST, base.authority.as_str());
        for (k, v) in headers {
            builder = builder.header(*k, *v);
        }
        if let Some(v) = authorization {
            builder = builder.header(http::header::AUTHORIZATION, v);
        }
        let req = builder.body(Full::new(Bytes::new())).map_err(|e| ClientError::BadUrl(e.to_string()))?;
        let mut conn = self.open(base).await?;
        let head = async { conn.sender.send_request(req).await.map_err(|e| ClientError::Broken(e.to_string())) };
        let resp = match crate::timeout(Duration::from_millis(self.read_timeout_ms), head).await {
            None => return Err(ClientError::Timeout(self.read_timeout_ms)),
            Some(r) => r?,
        };
        let (parts, body) = resp.into_parts();
        Ok(StreamingResponse { status: parts.status.as_u16(), headers: parts.headers, body, _conn: conn })
    }

    async fn exchange(&self, conn: &mut Conn, req: Request<Full<Bytes>>) -> Result<ClientResponse, ClientError> {
        let exchange = async {
            let resp = conn.sender.send_request(req).await.map_err(|e| ClientError::Broken(e.to_string()))?;
            let (parts, body) = resp.into_parts();
            let body = body.collect().await.map_err(|e| ClientError::Broken(e.to_string()))?.to_bytes();
            Ok(ClientResponse { status: parts.status.as_u16(), headers: parts.headers, body })
        };
        match crate::timeout(Duration::from_millis(self.read_timeout_ms), exchange).await {
            None => Err(ClientError::Timeout(self.read_timeout_ms)),
            Some(r) => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_url_accepts_only_http_or_https_host_port() {
        assert_eq!(BaseUrl::parse("http://127.0.0.1:8084").expect("valid").authority, "127.0.0.1:8084");
        assert!(BaseUrl::parse("http://localhost:1/").is_ok());
        let tls = BaseUrl::parse("https://localhost:8443").expect("https");
        assert!(tls.tls && tls.host() == "localhost" && tls.url() == "https://localhost:8443");
        for bad in ["ftp://a:1", "https://a", "http://a", "http://:1", "http://a:1/x", "a:1", "http://a:99999"] {
            assert!(BaseUrl::parse(bad).is_err(), "{bad}");
        }
    }

    #[tokio::test]
    async fn client_reports_refused_connection_as_nothing_sent() {
        // A port nobody listens on. (madsim keeps a dropped listener's port registered, so
        // there the test uses a port that was never bound.)
        let addr: std::net::SocketAddr = if cfg!(madsim) {
            "127.0.0.1:9".parse().expect("addr")
        } else {
            let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
            listener.local_addr().expect("addr")
        };
        let base = BaseUrl::parse(&format!("http://{addr}")).expect("url");
        let err = HttpClient::new(500, 500).send(&base, http::Method::GET, "/", &[], None).await.expect_err("refused");
        assert!(err.nothing_sent(), "{err}");
    }

    #[tokio::test]
    async fn served_router_answers_and_dropped_connection_is_ambiguous() {
        use axum::routing::get;
        let router = axum::Router::new().route("/ok", get(|| async { "hi" })).route(
            "/drop",
            get(|| async {
                let mut r = axum::response::Response::new(Body::empty());
                r.extensions_mut().insert(DropConnection);
                r
            }),
        );
        let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, async {
            let _ = rx.await;
        }));
        let client = HttpClient::new(1_000, 2_000);
        let ok = client.send(&base, http::Method::GET, "/ok", &[], None).await.expect("ok");
        assert_eq!(ok.status, 200);
        assert_eq!(&ok.body[..], b"hi");
        let dropped = client.send(&base, http::Method::GET, "/drop", &[], None).await.expect_err("dropped");
        assert!(matches!(dropped, ClientError::Broken(_)), "{dropped}");
        assert!(!dropped.nothing_sent());
        let _ = tx.send(());
        server.await.expect("server stops");
    }

    /// The client puts its bearer's token on the wire as `Authorization: Bearer <token>`,
    /// once, unless the caller gave that header itself; without a bearer it sends none.
    #[tokio::test]
    async fn a_client_with_a_bearer_sends_its_token_once_and_an_explicit_header_wins() {
        use axum::routing::get;
        let router = axum::Router::new().route(
            "/who",
            get(|h: http::HeaderMap| async move {
                let all: Vec<String> = h
                    .get_all(http::header::AUTHORIZATION)
                    .iter()
                    .map(|v| v.to_str().unwrap_or("?").to_owned())
                    .collect();
                all.join("|")
            }),
        );
        let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, async {
            let _ = rx.await;
        }));
        let token = Bearer::fixed(dlock_contract::auth::Secret::new("client-token-0123456789"));
        let with = HttpClient::new(1_000, 2_000).with_bearer(Some(token));
        let r = with.send(&base, http::Method::GET, "/who", &[], None).await.expect("answered");
        assert_eq!(&r.body[..], b"Bearer client-token-0123456789");
        let own = [("authorization", "Bearer mine-0123456789abcdef")];
        let r = with.send(&base, http::Method::GET, "/who", &own, None).await.expect("answered");
        assert_eq!(&r.body[..], b"Bearer mine-0123456789abcdef");
        let r = with.clone().without_bearer().send(&base, http::Method::GET, "/who", &[], None).await.expect("ok");
        assert_eq!(&r.body[..], b"");
        let shown = format!("{with:?}");
        assert!(!shown.contains("client-token"), "{shown}");
        let _ = tx.send(());
        server.await.expect("server stops");
    }

    /// E-17: inside a trace every call carries a `traceparent` naming a new child span of
    /// the caller's; outside one no header is sent; a caller's own header wins.
    #[tokio::test]
    async fn a_call_inside_a_trace_sends_a_child_traceparent_and_none_outside() {
        use axum::routing::get;
        let router = axum::Router::new().route(
            "/tp",
            get(|h: http::HeaderMap| async move {
                h.get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or("-").to_owned()
            }),
        );
        let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, router, async {
            let _ = rx.await;
        }));
        let client = HttpClient::new(1_000, 2_000);
        let outside = client.send(&base, http::Method::GET, "/tp", &[], None).await.expect("answered");
        assert_eq!(&outside.body[..], b"-");
        let root = crate::trace::TraceContext::root(0x1234, crate::trace::FLAG_SAMPLED);
        let (first, second, own) = root
            .clone()
            .scope(async {
                let get = |h: &'static [(&'static str, &'static str)]| {
                    let (client, base) = (client.clone(), base.clone());
                    async move {
                        let r = client.send(&base, http::Method::GET, "/tp", h, None).await.expect("answered");
                        String::from_utf8(r.body.to_vec()).expect("utf8")
                    }
                };
                let mine: &'static [(&'static str, &'static str)] =
                    &[("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")];
                (get(&[]).await, get(&[]).await, get(mine).await)
            })
            .await;
        let (a, b) = (
            crate::trace::TraceParent::parse(&first).expect("valid"),
            crate::trace::TraceParent::parse(&second).expect("valid"),
        );
        assert_eq!((a.trace_id, b.trace_id), (0x1234, 0x1234));
        assert!(a.parent_id != b.parent_id && a.parent_id != root.span_id(), "{first} {second}");
        assert_eq!(own, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
        let _ = tx.send(());
        server.await.expect("server stops");
    }

    /// Serves a small router (`GET /ok`, `POST /echo`) with `limits`; the sender stops it.
    async fn served(limits: ServeLimits) -> (SocketAddr, tokio::sync::oneshot::Sender<()>) {
        use axum::routing::{get, post};
        let router = axum::Router::new()
            .route("/ok", get(|| async { "hi" }))
            .route("/echo", post(|body: Bytes| async move { body }));
        let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(serve_with_limits(
            listener,
            router,
            async {
                let _ = rx.await;
            },
            limits,
        ));
        (addr, tx)
    }

    /// Writes `bytes` on a fresh connection and reads until the server closes it.
    async fn exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(bytes).await.expect("write");
        stream.flush().await.expect("flush");
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
            .await
            .expect("the server closes the connection")
            .expect("read");
        out
    }

    /// One parsed response: status, lowercase headers, body.
    type Answer = (u16, Vec<(String, String)>, Vec<u8>);

    /// Splits a connection's bytes into its responses (each framed by Content-Length).
    fn responses(mut raw: &[u8]) -> Vec<Answer> {
        let mut out = Vec::new();
        while !raw.is_empty() {
            let end = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a complete head") + 4;
            let head = std::str::from_utf8(&raw[..end]).expect("ascii head");
            let mut lines = head.split("\r\n");
            let status: u16 =
                lines.next().and_then(|l| l.split(' ').nth(1)).and_then(|s| s.parse().ok()).expect("status");
            let headers: Vec<(String, String)> = lines
                .filter_map(|l| l.split_once(':'))
                .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
                .collect();
            let len: usize = headers
                .iter()
                .find(|(k, _)| k == "content-length")
                .and_then(|(_, v)| v.parse().ok())
                .expect("content-length");
            out.push((status, headers, raw[end..end + len].to_vec()));
            raw = &raw[end + len..];
        }
        out
    }

    fn header<'a>(a: &'a Answer, name: &str) -> Option<&'a str> {
        a.1.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// `a` is the C3 envelope with `status` and `code`.
    fn assert_envelope(a: &Answer, status: u16, code: &str, case: &str) {
        assert_eq!(a.0, status, "{case}");
        assert_eq!(header(a, "content-type"), Some(dlock_contract::CONTENT_TYPE_JSON), "{case}");
        let v: serde_json::Value = serde_json::from_slice(&a.2).expect("envelope json");
        assert_eq!(v["code"], code, "{case}: {v}");
        assert_eq!(v["retrySafe"], false, "{case}: {v}");
        assert!(v["message"].as_str().is_some_and(|m| !m.is_empty()), "{case}: {v}");
        assert_eq!(v["traceId"].as_str().map(str::len), Some(32), "{case}: {v}");
    }

    #[tokio::test]
    async fn malformed_request_heads_are_answered_with_the_envelope() {
        let (addr, _stop) = served(ServeLimits { header_bytes_max: 1_024, ..ServeLimits::default() }).await;
        let big = format!("GET /ok HTTP/1.1\r\nhost: a\r\nx-big: {}\r\n\r\n", "a".repeat(2_000));
        let many: String = (0..HEADERS_COUNT_MAX + 1).map(|i| format!("x-{i}: 1\r\n")).collect();
        let many = format!("GET /ok HTTP/1.1\r\n{many}\r\n");
        let cases: Vec<(&str, Vec<u8>, u16, &str)> = vec![
            ("no version", b"GET /ok\r\n\r\n".to_vec(), 400, "VALIDATION_FAILED"),
            ("not a request line", b"GARBAGE\r\n\r\n".to_vec(), 400, "VALIDATION_FAILED"),
            // Refused as soon as its first line ends, not when the head would have ended.
            ("a bad first line alone", b"GARBAGE\r\n".to_vec(), 400, "VALIDATION_FAILED"),
            ("non-UTF-8 path", b"GET /\xff\xfe HTTP/1.1\r\nhost: a\r\n\r\n".to_vec(), 400, "VALIDATION_FAILED"),
            (
                "NUL in a header",
                b"GET /ok HTTP/1.1\r\nhost: a\r\nx-owner-id: a\0b\r\n\r\n".to_vec(),
                400,
                "VALIDATION_FAILED",
            ),
            (
                "conflicting lengths",
                b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\nab".to_vec(),
                400,
                "VALIDATION_FAILED",
            ),
            (
                "unknown transfer-encoding",
                b"POST /echo HTTP/1.1\r\nhost: a\r\ntransfer-encoding: gzip\r\n\r\n".to_vec(),
                400,
                "VALIDATION_FAILED",
            ),
            ("header section over the limit", big.into_bytes(), 431, "HEADERS_TOO_LARGE"),
            ("too many headers", many.into_bytes(), 431, "HEADERS_TOO_LARGE"),
        ];
        for (case, bytes, status, code) in cases {
            let answers = responses(&exchange(addr, &bytes).await);
            assert_eq!(answers.len(), 1, "{case}");
            assert_envelope(&answers[0], status, code, case);
            assert_eq!(header(&answers[0], "connection"), Some("close"), "{case}");
        }
    }

    #[tokio::test]
    async fn keep_alive_requests_are_each_checked_and_still_served() {
        let (addr, _stop) = served(ServeLimits { header_bytes_max: 1_024, ..ServeLimits::default() }).await;
        let padded = format!("GET /ok HTTP/1.1\r\nhost: a\r\nx-pad: {}\r\n\r\n", "p".repeat(600));
        let mut stream = Vec::new();
        stream.extend_from_slice(b"GET /ok HTTP/1.1\r\nhost: a\r\n\r\n");
        stream.extend_from_slice(b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 3\r\n\r\nabc");
        stream.extend_from_slice(
            b"POST /echo HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n\
              3\r\nabc\r\n2;ext=1\r\nde\r\n0\r\nx-trailer: 1\r\n\r\n",
        );
        stream.extend_from_slice(padded.as_bytes());
        // A body that looks like a bad head is a body, not a head.
        stream.extend_from_slice(b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 9\r\n\r\nGARBAGE\r\n");
        stream.extend_from_slice(b"GET /ok HTTP/1.1\r\nhost: a\r\nconnection: close\r\n\r\n");
        let answers = responses(&exchange(addr, &stream).await);
        let got: Vec<(u16, &[u8])> = answers.iter().map(|a| (a.0, a.2.as_slice())).collect();
        let want: Vec<(u16, &[u8])> =
            vec![(200, b"hi"), (200, b"abc"), (200, b"abcde"), (200, b"hi"), (200, b"GARBAGE\r\n"), (200, b"hi")];
        assert_eq!(got, want);

        // The same connection, then a bad head: every good answer, then the envelope.
        let mut stream = Vec::new();
        stream.extend_from_slice(b"GET /ok HTTP/1.1\r\nhost: a\r\n\r\n");
        stream.extend_from_slice(b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 2\r\n\r\nxy");
        stream.extend_from_slice(b"GET /\xff HTTP/1.1\r\nhost: a\r\n\r\n");
        stream.extend_from_slice(b"GET /ok HTTP/1.1\r\nhost: a\r\n\r\n");
        let answers = responses(&exchange(addr, &stream).await);
        assert_eq!(answers.len(), 3, "nothing is answered after the refused head");
        assert_eq!((answers[0].0, answers[0].2.as_slice()), (200, &b"hi"[..]));
        assert_eq!((answers[1].0, answers[1].2.as_slice()), (200, &b"xy"[..]));
        assert_envelope(&answers[2], 400, "VALIDATION_FAILED", "bad head after good ones");
    }

    #[tokio::test]
    async fn a_refused_head_is_answered_even_with_more_bytes_behind_it() {
        // The bytes after a refused head are never read as requests; the answer still
        // arrives (unread input at close would reset the connection under the answer).
        let (addr, _stop) = served(ServeLimits::default()).await;
        let mut stream = b"GET /\xff HTTP/1.1\r\nhost: a\r\n\r\n".to_vec();
        for _ in 0..400 {
            stream.extend_from_slice(
                b"GET /ok HTTP/1.1\r\nhost: a\r\nx-fill: 0123456789012345678901234567890123456789\r\n\r\n",
            );
        }
        let answers = responses(&exchange(addr, &stream).await);
        assert_eq!(answers.len(), 1);
        assert_envelope(&answers[0], 400, "VALIDATION_FAILED", "bad head, then more");
    }

    #[tokio::test]
    async fn a_head_split_across_reads_is_reassembled() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let (addr, _stop) = served(ServeLimits::default()).await;
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let _ = stream.set_nodelay(true);
        let pieces: [&[u8]; 5] = [b"GET /o", b"k HTTP/1.1\r", b"\nhost: a\r\nconnec", b"tion: close\r\n", b"\r\n"];
        for piece in pieces {
            stream.write_all(piece).await.expect("write");
            stream.flush().await.expect("flush");
            tokio::task::yield_now().await;
        }
        let mut out = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out))
            .await
            .expect("the server closes the connection")
            .expect("read");
        let answers = responses(&out);
        assert_eq!(answers.len(), 1);
        assert_eq!((answers[0].0, answers[0].2.as_slice()), (200, &b"hi"[..]));
    }

    #[tokio::test]
    async fn a_forged_rejection_header_is_an_ordinary_header() {
        let (addr, _stop) = served(ServeLimits::default()).await;
        let req = b"GET /ok HTTP/1.1\r\nhost: a\r\nx-dlock-head-rejected: 0\r\nconnection: close\r\n\r\n";
        let answers = responses(&exchange(addr, req).await);
        assert_eq!(answers.len(), 1);
        assert_eq!((answers[0].0, answers[0].2.as_slice()), (200, &b"hi"[..]));
    }

    /// Serves `/ok`, `/close` (answers with `connection: close`) and `/drop` (drops the
    /// connection unanswered) with a hand-written accept loop that counts the connections
    /// it accepts.
    async fn counting_server() -> (BaseUrl, std::sync::Arc<std::sync::atomic::AtomicU64>) {
        use axum::routing::get;
        let router = axum::Router::new()
            .route("/ok", get(|| async { "hi" }))
            .route(
                "/close",
                get(|| async {
                    let mut r = axum::response::Response::new(Body::from("bye"));
                    r.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
                    r
                }),
            )
            .route(
                "/drop",
                get(|| async {
                    let mut r = axum::response::Response::new(Body::empty());
                    r.extensions_mut().insert(DropConnection);
                    r
                }),
            );
        let listener = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = accepted.clone();
        let (_stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _keep = _stop_tx;
            while let Ok((stream, _)) = listener.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(serve_connection(
                    SkipEmptyFlush::new(stream),
                    router.clone(),
                    stop_rx.clone(),
                    HEADER_BYTES_MAX_DEFAULT,
                ));
            }
        });
        (base, accepted)
    }

    fn accepted(n: &std::sync::atomic::AtomicU64) -> u64 {
        n.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Fresh connections to a host name use one lookup (issue 14, [`resolve`]); a
    /// connection refused at a name is "nothing sent" and forgets the name.
    #[cfg(not(madsim))]
    #[tokio::test]
    async fn fresh_connections_to_a_host_name_share_one_lookup_and_a_refused_one_forgets_it() {
        let (base, count) = counting_server().await;
        let port = base.authority.rsplit(':').next().expect("port");
        let named = BaseUrl::parse(&format!("http://localhost:{port}")).expect("url");
        let client = HttpClient::new(1_000, 2_000);
        let resolver = resolve::process();
        let before = resolver.lookups();
        for _ in 0..10 {
            let r = client.send(&named, http::Method::GET, "/ok", &[], None).await.expect("answered");
            assert_eq!(r.status, 200);
        }
        assert_eq!(accepted(&count), 10, "still one fresh connection per request");
        assert!(resolver.keeps(&named.authority));
        // One lookup, or two if the machine stalled past the window between requests.
        let looked_up = resolver.lookups() - before;
        assert!(looked_up <= 2, "10 connections made {looked_up} lookups");

        let closed = {
            let l = bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
            l.local_addr().expect("addr").port()
        };
        let gone = BaseUrl::parse(&format!("http://localhost:{closed}")).expect("url");
        let refused = client.send(&gone, http::Method::GET, "/ok", &[], None).await.expect_err("nothing listens");
        assert!(refused.nothing_sent(), "a refused connection is nothing sent: {refused:?}");
        assert!(!resolver.keeps(&gone.authority), "and forgets the name's addresses");
    }

    /// Cut 9: a kept-alive client sends sequential requests on one connection (in the
    /// simulation too: this test runs on madsim's network under `cfg(madsim)`); a plain
    /// client opens one per request.
    #[tokio::test]
    async fn a_kept_alive_client_reuses_one_connection_and_a_plain_one_does_not() {
        let (base, count) = counting_server().await;
        let pooled = HttpClient::new(1_000, 2_000).with_keep_alive();
        assert!(pooled.keeps_alive() && !HttpClient::new(1, 1).keeps_alive());
        for _ in 0..5 {
            let r = pooled.send(&base, http::Method::GET, "/ok", &[], None).await.expect("answered");
            assert_eq!((r.status, &r.body[..]), (200, &b"hi"[..]));
        }
        assert_eq!((accepted(&count), pooled.connections_opened()), (1, 1));
        let clone = pooled.clone();
        clone.send(&base, http::Method::GET, "/ok", &[], None).await.expect("answered");
        assert_eq!(accepted(&count), 1, "clones share the pool");
        let plain = HttpClient::new(1_000, 2_000);
        for _ in 0..3 {
            plain.send(&base, http::Method::GET, "/ok", &[], None).await.expect("answered");
        }
        assert_eq!(accepted(&count), 4);
    }

    /// Cut 9: a request whose reused connection breaks before its answer is `Broken` (may
    /// have been sent), never "nothing sent"; the broken connection is not kept.
    #[tokio::test]
    async fn a_failure_on_a_reused_connection_is_broken_never_nothing_sent() {
        let (base, count) = counting_server().await;
        let pooled = HttpClient::new(1_000, 2_000).with_keep_alive();
        pooled.send(&base, http::Method::GET, "/ok", &[], None).await.expect("answered");
        let err = pooled.send(&base, http::Method::GET, "/drop", &[], None).await.expect_err("dropped");
        assert!(matches!(err, ClientError::Broken(_)), "{err}");
        assert!(!err.nothing_sent(), "{err}");
        assert_eq!(accepted(&count), 1, "the failure happened on the reused connection");
        pooled.send(&base, http::Method::GET, "/ok", &[], None).await.expect("answered");
        assert_eq!(accepted(&count), 2, "a broken connection is never reused");
    }

    /// Cut 9: a connection the server closed after its answer (`connection: close`) is
    /// dropped before the next request is handed to it: that request goes on a fresh
    /// connection and is answered.
    #[tokio::test]
    async fn a_connection_the_server_closed_is_not_reused() {
        let (base, count) = counting_server().await;
        let pooled = HttpClient::new(1_000, 2_000).with_keep_alive();
        let r = pooled.send(&base, http::Method::GET, "/close", &[], None).await.expect("answered");
        assert_eq!(&r.body[..], b"bye");
        let r = pooled.send(&base, http::Method::GET, "/ok", &[], None).await.expect("answered");
        assert_eq!(&r.body[..], b"hi");
        assert_eq!((accepted(&count), pooled.connections_opened()), (2, 2));
    }

    /// Cut 9: the pool's bounds are named, and the idle window is shorter than the
    /// server's idle close.
    #[tokio::test]
    async fn keep_alive_bounds_are_named_and_the_idle_window_is_below_the_servers() {
        const { assert!(KEEP_ALIVE_IDLE_MS_MAX < HEADER_READ_MS_MAX) };
        const { assert!(KEEP_ALIVE_IDLE_PER_HOST_MAX > 0) };
        let t0 = Pool::now();
        assert!(Pool::fresh(t0, t0));
        assert!(!Pool::fresh(t0, t0 + Duration::from_millis(KEEP_ALIVE_IDLE_MS_MAX)));
    }

    #[test]
    fn header_limit_defaults_and_clamps_are_named() {
        assert_eq!(ServeLimits::default().header_bytes_max, HEADER_BYTES_MAX_DEFAULT);
        assert_eq!(ServeLimits::default().grace_ms_max, SHUTDOWN_GRACE_MS_DEFAULT);
        let at = |n| ServeLimits { header_bytes_max: n, ..ServeLimits::default() }.effective_header_bytes_max();
        assert_eq!(at(1), HEADER_BYTES_MAX_FLOOR);
        assert_eq!(at(usize::MAX), HEADER_BYTES_MAX_CEILING);
        assert_eq!(at(4_096), 4_096);
    }
}
