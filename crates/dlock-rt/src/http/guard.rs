//! Every request head is validated here before hyper sees it, so that a malformed request
//! line, a target that is not a URI (a path that is not UTF-8), a malformed header or
//! framing, or a header section over `header_bytes_max` is answered with the C3 envelope
//! instead of hyper's own bodyless `400`/`431`.
//!
//! [`HeadGuard`] sits between the socket and hyper's HTTP/1 connection. It follows the
//! request stream message by message: it buffers one head, parses it with `httparse` (the
//! parser hyper uses, with hyper's settings) and the checks hyper makes after parsing
//! (`http::Uri`, `Content-Length`, `Transfer-Encoding`), hands the head on, then hands on
//! exactly the body that head declares (`Content-Length` bytes, or a chunked body up to its
//! last chunk and trailers), and starts over at the next head. So keep-alive and pipelined
//! requests are each checked.
//!
//! A refused head is never given to hyper. In its place hyper gets a synthetic request,
//! `connection: close`, carrying [`REJECT_HEADER`] with a per-connection random nonce; the
//! connection's service answers that request with the envelope ([`rejection_response`]),
//! in order after any earlier response, and hyper then closes the connection. The nonce
//! is drawn only when a head is refused, and never leaves the process, so a client cannot
//! forge a rejection, and a normal connection draws no randomness.
//!
//! Invariants:
//! - Bytes reach hyper only once they are a validated head or the body a validated head
//!   declared (until the guard passes through, below).
//! - The head buffer never holds more than `header_bytes_max + READ_CHUNK_BYTES` bytes.
//! - If the body tracking ever loses its place (a chunked body hyper itself would refuse),
//!   the guard stops inspecting and passes bytes through: hyper then ends the connection on
//!   its own terms, which is the pre-guard behaviour, never a wrong answer.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::{Buf, BytesMut};
use dlock_contract::{ErrorCode, ErrorEnvelope, CONTENT_TYPE_JSON};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Most headers one request may carry (hyper's default, set explicitly on the builder).
pub const HEADERS_COUNT_MAX: usize = 100;
/// Bytes read from the socket per read while the guard buffers.
const READ_CHUNK_BYTES: usize = 8_192;
/// hyper refuses a `Content-Length` this large (its two reserved lengths).
const CONTENT_LENGTH_CEILING: u64 = u64::MAX - 1;
/// The header that marks the synthetic request standing in for a refused head.
pub(crate) const REJECT_HEADER: &str = "x-dlock-head-rejected";

/// Why a request head was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Rejection {
    /// The request line is not `METHOD SP target SP HTTP/1.x`.
    RequestLine,
    /// The request target is not a valid URI (for example, bytes that are not UTF-8).
    Target,
    /// A header name or value is malformed (for example, it contains a NUL byte).
    Header,
    /// `Content-Length` / `Transfer-Encoding` do not frame a body unambiguously.
    Framing,
    /// The header section (or the header count) is over its limit.
    TooLarge,
}

impl Rejection {
    pub(crate) fn code(self) -> ErrorCode {
        match self {
            Rejection::TooLarge => ErrorCode::HeadersTooLarge,
            _ => ErrorCode::ValidationFailed,
        }
    }

    fn message(self, header_bytes_max: usize) -> String {
        match self {
            Rejection::RequestLine => "the request line is malformed".to_owned(),
            Rejection::Target => {
                "the request target is not a valid URI (it must be UTF-8; percent-encode other bytes)".to_owned()
            }
            Rejection::Header => "a request header is malformed".to_owned(),
            Rejection::Framing => "Content-Length and Transfer-Encoding do not frame the body unambiguously".to_owned(),
            Rejection::TooLarge => {
                format!("the request header section is over {header_bytes_max} bytes or {HEADERS_COUNT_MAX} headers")
            }
        }
    }
}

/// A refusal waiting for its synthetic request, shared by the guard and the service.
#[derive(Debug, Default)]
pub(crate) struct Slot(Mutex<Option<(String, Rejection)>>);

impl Slot {
    fn put(&self, nonce: String, r: Rejection) {
        if let Ok(mut g) = self.0.lock() {
            *g = Some((nonce, r));
        }
    }

    /// The refusal `headers` stands in for, if it is the guard's synthetic request.
    pub(crate) fn take_for(&self, headers: &http::HeaderMap) -> Option<Rejection> {
        let presented = headers.get(REJECT_HEADER)?.to_str().ok()?;
        let mut g = self.0.lock().ok()?;
        match g.as_ref() {
            Some((nonce, _)) if nonce == presented => g.take().map(|(_, r)| r),
            _ => None,
        }
    }
}

/// The envelope answer to a refused head (a fresh trace id; the connection then closes).
pub(crate) fn rejection_response(r: Rejection, header_bytes_max: usize) -> http::Response<Body> {
    let trace_id = crate::rand::trace_id();
    let code = r.code();
    let env = ErrorEnvelope::new(code, r.message(header_bytes_max), trace_id.clone());
    let body = serde_json::to_vec(&env).unwrap_or_else(|_| b"{}".to_vec());
    let status = code.http_status();
    tracing::debug!(code = code.as_str(), status, traceId = %trace_id, "request_failed");
    let mut resp = http::Response::new(Body::from(body));
    *resp.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::BAD_REQUEST);
    resp.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(CONTENT_TYPE_JSON));
    resp.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    resp
}

/// Where the guard is in the request stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Buffering the next request head.
    Head,
    /// Inside a `Content-Length` body: this many bytes left.
    Length(u64),
    /// Inside a chunked body.
    Chunked(Chunk),
    /// Not inspecting any more (see the module's invariants).
    Passthrough,
    /// A head was refused: after the synthetic request, nothing more.
    Rejected,
}

/// A chunked body's parse position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// In a chunk-size line: the size so far, whether a digit was seen, whether the digits
    /// ended (extensions or whitespace follow).
    Size { size: u64, digits: bool, ended: bool },
    /// This many data bytes left in the current chunk.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// In the trailer section: whether the current line is empty so far.
    Trailer { empty: bool },
}

/// See the module documentation.
pub(crate) struct HeadGuard<T> {
    inner: T,
    header_bytes_max: usize,
    slot: Arc<Slot>,
    /// Bytes read from the socket and not yet handed to hyper.
    pending: BytesMut,
    /// How many bytes at the front of `pending` are validated and may be handed on.
    ready: usize,
    /// While buffering a head: how many of its bytes were already parsed. It is parsed
    /// again only once a new line has ended (an LF arrived), so a head dripped in byte by
    /// byte costs at most one parse per line (at most [`HEADERS_COUNT_MAX`] + 2 lines get
    /// that far), not one per byte.
    head_scanned: usize,
    state: State,
    inner_eof: bool,
}

impl<T> HeadGuard<T> {
    pub(crate) fn new(inner: T, header_bytes_max: usize, slot: Arc<Slot>) -> Self {
        HeadGuard {
            inner,
            header_bytes_max,
            slot,
            pending: BytesMut::new(),
            ready: 0,
            head_scanned: 0,
            state: State::Head,
            inner_eof: false,
        }
    }

    /// Advances over whatever `pending` holds past `ready`; returns whether it needs more
    /// bytes from the socket to make progress.
    fn advance(&mut self) -> bool {
        loop {
            let avail = self.pending.len() - self.ready;
            match self.state {
                State::Rejected => return false,
                State::Passthrough => {
                    self.ready = self.pending.len();
                    return avail == 0;
                }
                State::Length(0) => self.state = State::Head,
                State::Length(n) => {
                    if avail == 0 {
                        return true;
                    }
                    let take = n.min(avail as u64);
                    self.ready += take as usize;
                    self.state = State::Length(n - take);
                    if n - take == 0 {
                        self.state = State::Head;
                    }
                }
                State::Chunked(c) => {
                    if avail == 0 {
                        return true;
                    }
                    match self.chunk_step(c) {
                        Some(next) => self.state = next,
                        None => self.state = State::Passthrough,
                    }
                }
                State::Head => {
                    if self.ready > 0 {
                        // Hand the previous message on before buffering the next head.
                        return false;
                    }
                    match self.check_head() {
                        HeadCheck::Partial => return true,
                        HeadCheck::Valid { len, body } => {
                            self.ready = len;
                            self.head_scanned = 0;
                            self.state = body;
                            if self.state == State::Head {
                                return false;
                            }
                        }
                        HeadCheck::Refused(r) => {
                            self.reject(r);
                            return false;
                        }
                    }
                }
            }
        }
    }

    /// Consumes bytes of a chunked body from `pending[ready..]`; `None` when the body is
    /// not one hyper would accept (the guard then stops inspecting).
    fn chunk_step(&mut self, c: Chunk) -> Option<State> {
        let b = self.pending[self.ready];
        let next = match c {
            Chunk::Data(n) => {
                let avail = (self.pending.len() - self.ready) as u64;
                let take = n.min(avail);
                self.ready += take as usize;
                return Some(State::Chunked(if n - take == 0 { Chunk::DataEnd } else { Chunk::Data(n - take) }));
            }
            Chunk::Size { size, digits, ended } => match b {
                b'\n' if digits => {
                    if size == 0 {
                        Chunk::Trailer { empty: true }
                    } else {
                        Chunk::Data(size)
                    }
                }
                b'\n' => return None,
                b'\r' => Chunk::Size { size, digits, ended: true },
                _ if !ended && b.is_ascii_hexdigit() => {
                    let digit = u64::from((b as char).to_digit(16)?);
                    let size = size.checked_mul(16)?.checked_add(digit)?;
                    Chunk::Size { size, digits: true, ended }
                }
                _ if digits => Chunk::Size { size, digits, ended: true },
                _ => return None,
            },
            Chunk::DataEnd => match b {
                b'\r' => Chunk::DataEnd,
                b'\n' => Chunk::Size { size: 0, digits: false, ended: false },
                _ => return None,
            },
            Chunk::Trailer { empty } => match b {
                b'\n' if empty => {
                    self.ready += 1;
                    return Some(State::Head);
                }
                b'\n' => Chunk::Trailer { empty: true },
                b'\r' => Chunk::Trailer { empty },
                _ => Chunk::Trailer { empty: false },
            },
        };
        self.ready += 1;
        Some(State::Chunked(next))
    }

    fn check_head(&mut self) -> HeadCheck {
        if !self.pending[self.head_scanned..].contains(&b'\n') {
            self.head_scanned = self.pending.len();
            return if self.pending.len() > self.header_bytes_max {
                HeadCheck::Refused(Rejection::TooLarge)
            } else {
                HeadCheck::Partial
            };
        }
        let mut headers = [httparse::EMPTY_HEADER; HEADERS_COUNT_MAX];
        let mut req = httparse::Request::new(&mut headers);
        let parsed = req.parse(&self.pending);
        let len = match parsed {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => {
                self.head_scanned = self.pending.len();
                return if self.pending.len() > self.header_bytes_max {
                    HeadCheck::Refused(Rejection::TooLarge)
                } else {
                    HeadCheck::Partial
                };
            }
            Err(httparse::Error::TooManyHeaders) => return HeadCheck::Refused(Rejection::TooLarge),
            Err(httparse::Error::Token) if req.method.is_some() => return HeadCheck::Refused(Rejection::Target),
            Err(httparse::Error::HeaderName | httparse::Error::HeaderValue) => {
                return HeadCheck::Refused(Rejection::Header)
            }
            Err(_) => return HeadCheck::Refused(Rejection::RequestLine),
        };
        if len > self.header_bytes_max {
            return HeadCheck::Refused(Rejection::TooLarge);
        }
        let (Some(method), Some(path)) = (req.method, req.path) else {
            return HeadCheck::Refused(Rejection::RequestLine);
        };
        if http::Method::from_bytes(method.as_bytes()).is_err() {
            return HeadCheck::Refused(Rejection::RequestLine);
        }
        if http::Uri::try_from(path.as_bytes()).is_err() {
            return HeadCheck::Refused(Rejection::Target);
        }
        match framing(req.version == Some(1), req.headers) {
            Some(body) => HeadCheck::Valid { len, body },
            None => HeadCheck::Refused(Rejection::Framing),
        }
    }

    /// Replaces everything unread with the synthetic request standing in for `r`.
    fn reject(&mut self, r: Rejection) {
        let nonce = crate::rand::trace_id();
        let synthetic =
            format!("GET / HTTP/1.1\r\nhost: dlock\r\nconnection: close\r\n{REJECT_HEADER}: {nonce}\r\n\r\n");
        self.slot.put(nonce, r);
        self.pending.clear();
        self.pending.extend_from_slice(synthetic.as_bytes());
        self.ready = self.pending.len();
        self.state = State::Rejected;
    }
}

enum HeadCheck {
    Partial,
    Valid { len: usize, body: State },
    Refused(Rejection),
}

/// The body a valid head declares, by hyper's rules (RFC 9112 §6.3): `Transfer-Encoding`
/// ending in `chunked` wins over `Content-Length`; any other `Transfer-Encoding`, or one on
/// HTTP/1.0, is refused; `Content-Length` must be digits, and repeats must agree.
fn framing(http_11: bool, headers: &[httparse::Header<'_>]) -> Option<State> {
    let mut te_chunked = None;
    let mut length: Option<u64> = None;
    for h in headers {
        if h.name.eq_ignore_ascii_case("transfer-encoding") {
            if !http_11 {
                return None;
            }
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or_default();
            te_chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if h.name.eq_ignore_ascii_case("content-length") && te_chunked.is_none() {
            let v = h.value.trim_ascii();
            if v.is_empty() || !v.iter().all(u8::is_ascii_digit) {
                return None;
            }
            let n: u64 = std::str::from_utf8(v).ok()?.parse().ok()?;
            if n >= CONTENT_LENGTH_CEILING {
                return None;
            }
            if length.is_some_and(|prev| prev != n) {
                return None;
            }
            length = Some(n);
        }
    }
    match (te_chunked, length) {
        (Some(true), _) => Some(State::Chunked(Chunk::Size { size: 0, digits: false, ended: false })),
        (Some(false), _) => None,
        (None, Some(n)) if n > 0 => Some(State::Length(n)),
        (None, _) => Some(State::Head),
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for HeadGuard<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = &mut *self;
        loop {
            let needs_more = this.advance();
            if this.ready > 0 {
                let n = this.ready.min(buf.remaining());
                buf.put_slice(&this.pending[..n]);
                this.pending.advance(n);
                this.ready -= n;
                return Poll::Ready(Ok(()));
            }
            if this.state == State::Rejected {
                // The synthetic request is out. Never report end of stream: hyper would take
                // it as the peer leaving mid-message and drop the answer. It answers, then
                // closes the connection (the synthetic request says `connection: close`).
                return Poll::Pending;
            }
            if !needs_more || this.inner_eof {
                // The peer closed (a partial head at end of stream is dropped, as hyper
                // would): end of stream for hyper.
                return Poll::Ready(Ok(()));
            }
            let mut chunk = [0u8; READ_CHUNK_BYTES];
            let mut rb = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut rb) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) => {
                    if rb.filled().is_empty() {
                        this.inner_eof = true;
                    } else {
                        this.pending.extend_from_slice(rb.filled());
                        // The guard reads only with nothing ready to hand on, and, while
                        // buffering a head, only while the head is within its limit.
                        assert!(
                            this.pending.len() <= this.header_bytes_max + READ_CHUNK_BYTES,
                            "head guard buffer over its bound"
                        );
                    }
                }
            }
        }
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for HeadGuard<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
