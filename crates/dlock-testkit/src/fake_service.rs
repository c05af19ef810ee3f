//! A scripted fake HTTP service, served on 127.0.0.1:0 through `dlock_rt::http`. Each
//! `(method, path)` answers from its script (front first), then from its default (a 404
//! envelope unless set); every request is recorded with its arrival instant, headers and
//! body. The client crates' tests (payment, rail) script their peer with it; it runs on
//! tokio and on madsim alike.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use dlock_contract::{ErrorCode, ErrorEnvelope};
use dlock_rt::http::{BaseUrl, DropConnection};
use dlock_rt::{Clock, Duration, Instant};

/// Largest request body the fake reads.
const BODY_BYTES_MAX: usize = 64 * 1024;

/// What the fake answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// This status with this JSON body.
    Json(u16, serde_json::Value),
    /// The C3 envelope for `code` (its catalogue status and verdict), with
    /// `retryAfterMillis` when given.
    Refuse(ErrorCode, Option<u64>),
    /// This status with a body that is not JSON.
    Text(u16, &'static str),
    /// `then`, after this many milliseconds.
    Slow(u64, Box<Reply>),
    /// The connection is dropped without an answer.
    Drop,
}

pub fn refuse(code: ErrorCode) -> Reply {
    Reply::Refuse(code, None)
}

pub fn slow(delay_ms: u64, then: Reply) -> Reply {
    Reply::Slow(delay_ms, Box::new(then))
}

/// One request the fake received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub at: Instant,
    pub headers: BTreeMap<String, String>,
    pub query: Option<String>,
    pub body: serde_json::Value,
}

type Route = (String, String);

#[derive(Debug, Default)]
struct FakeState {
    scripts: BTreeMap<Route, VecDeque<Reply>>,
    defaults: BTreeMap<Route, Reply>,
    seen: BTreeMap<Route, Vec<Seen>>,
}

type Shared = Arc<Mutex<FakeState>>;

fn state(s: &Shared) -> MutexGuard<'_, FakeState> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

fn route(method: &str, path: &str) -> Route {
    (method.to_owned(), path.to_owned())
}

pub struct FakeService {
    pub base: BaseUrl,
    shared: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeService {
    pub async fn start() -> FakeService {
        let shared: Shared = Arc::default();
        let router = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        dlock_rt::spawn(dlock_rt::http::serve(listener, router, async {
            let _ = rx.await;
        }));
        FakeService { base, shared, stop: Some(tx) }
    }

    /// Queues `replies` for `method path`, answered before its default.
    pub fn script(&self, method: &str, path: &str, replies: impl IntoIterator<Item = Reply>) {
        state(&self.shared).scripts.entry(route(method, path)).or_default().extend(replies);
    }

    /// What `method path` answers once its script is spent.
    pub fn set_default(&self, method: &str, path: &str, reply: Reply) {
        state(&self.shared).defaults.insert(route(method, path), reply);
    }

    pub fn count(&self, method: &str, path: &str) -> usize {
        state(&self.shared).seen.get(&route(method, path)).map_or(0, Vec::len)
    }

    pub fn seen(&self, method: &str, path: &str) -> Vec<Seen> {
        state(&self.shared).seen.get(&route(method, path)).cloned().unwrap_or_default()
    }
}

impl Drop for FakeService {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// A base URL on which nothing listens (madsim keeps a dropped listener's port registered,
/// so there a port that was never bound is used).
pub async fn nobody_listens() -> BaseUrl {
    let addr: std::net::SocketAddr = if cfg!(madsim) {
        "127.0.0.1:9".parse().expect("addr")
    } else {
        let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        listener.local_addr().expect("addr")
    };
    BaseUrl::parse(&format!("http://{addr}")).expect("url")
}

fn envelope(code: ErrorCode, retry_after_ms: Option<u64>) -> Response {
    let mut env = ErrorEnvelope::new(code, format!("scripted {code}"), dlock_rt::rand::trace_id());
    env.retry_after_millis = retry_after_ms;
    let status = StatusCode::from_u16(code.http_status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    dlock_http::json(status, &env)
}

async fn handle(State(shared): State<Shared>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, BODY_BYTES_MAX).await.unwrap_or_default();
    let key = route(parts.method.as_str(), parts.uri.path());
    let headers =
        parts.headers.iter().filter_map(|(k, v)| Some((k.as_str().to_owned(), v.to_str().ok()?.to_owned()))).collect();
    let seen = Seen {
        at: Clock::system().now(),
        headers,
        query: parts.uri.query().map(str::to_owned),
        body: serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null),
    };
    let mut reply = {
        let mut st = state(&shared);
        st.seen.entry(key.clone()).or_default().push(seen);
        let scripted = st.scripts.get_mut(&key).and_then(VecDeque::pop_front);
        scripted.or_else(|| st.defaults.get(&key).cloned()).unwrap_or(Reply::Refuse(ErrorCode::NotFound, None))
    };
    loop {
        match reply {
            Reply::Slow(delay_ms, then) => {
                dlock_rt::sleep(Duration::from_millis(delay_ms)).await;
                reply = *then;
            }
            Reply::Drop => {
                let mut r = Response::new(Body::empty());
                r.extensions_mut().insert(DropConnection);
                return r;
            }
            Reply::Refuse(code, retry_after_ms) => return envelope(code, retry_after_ms),
            Reply::Json(status, body) => {
                return dlock_http::json(StatusCode::from_u16(status).unwrap_or(StatusCode::OK), &body);
            }
            Reply::Text(status, text) => {
                return Response::builder()
                    .status(StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY))
                    .header("content-type", "text/html")
                    .body(Body::from(text))
                    .unwrap_or_default();
            }
        }
    }
}
