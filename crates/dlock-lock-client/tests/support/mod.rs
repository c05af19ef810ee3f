//! A scripted fake lock server (C3 §3.3 paths and bodies), served on 127.0.0.1:0 through
//! `dlock_rt::http`. Each operation answers from its script (front first), then from its
//! default; every request is recorded with its arrival instant and headers.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::Response;
use dlock_contract::lock::{HeartbeatAck, LockGrant, LockInfo, SessionOpened};
use dlock_contract::{ErrorCode, ErrorEnvelope, OwnerId, HEADER_FENCING_TOKEN, HEADER_OWNER_ID};
use dlock_lock_client::LockClientConfig;
use dlock_rt::http::{BaseUrl, DropConnection};
use dlock_rt::{Clock, Duration, Instant};
use uuid::Uuid;

/// Largest request body the fake reads.
const BODY_BYTES_MAX: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Open,
    Heartbeat,
    Close,
    Acquire,
    Renew,
    Rotate,
    Release,
    Inspect,
}

/// What the fake answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The operation's success body.
    Ok,
    /// The C3 envelope for `code`, with `retryAfterMillis` when given.
    Refuse(ErrorCode, Option<u64>),
    /// `then`, after `delay_ms`.
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
    pub owner: Option<String>,
    pub token: Option<String>,
    pub body: serde_json::Value,
}

#[derive(Debug, Default)]
struct FakeState {
    scripts: BTreeMap<Op, VecDeque<Reply>>,
    defaults: BTreeMap<Op, Reply>,
    seen: BTreeMap<Op, Vec<Seen>>,
    last_token: i64,
}

type Shared = Arc<Mutex<FakeState>>;

fn state(s: &Shared) -> MutexGuard<'_, FakeState> {
    s.lock().unwrap_or_else(PoisonError::into_inner)
}

pub struct FakeLockServer {
    pub base: BaseUrl,
    shared: Shared,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeLockServer {
    pub async fn start() -> FakeLockServer {
        let shared: Shared = Arc::default();
        let router = axum::Router::new().fallback(handle).with_state(shared.clone());
        let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        dlock_rt::spawn(dlock_rt::http::serve(listener, router, async {
            let _ = rx.await;
        }));
        FakeLockServer { base, shared, stop: Some(tx) }
    }

    /// The C3 defaults against this server, as owner `worker-1`.
    pub fn config(&self) -> LockClientConfig {
        LockClientConfig::new(self.base.clone(), OwnerId::parse("worker-1").expect("owner"))
    }

    /// Queues `replies` for `op`, answered before its default.
    pub fn script(&self, op: Op, replies: impl IntoIterator<Item = Reply>) {
        state(&self.shared).scripts.entry(op).or_default().extend(replies);
    }

    /// What `op` answers once its script is spent (initially [`Reply::Ok`]).
    pub fn set_default(&self, op: Op, reply: Reply) {
        state(&self.shared).defaults.insert(op, reply);
    }

    pub fn count(&self, op: Op) -> usize {
        state(&self.shared).seen.get(&op).map_or(0, Vec::len)
    }

    pub fn seen(&self, op: Op) -> Vec<Seen> {
        state(&self.shared).seen.get(&op).cloned().unwrap_or_default()
    }
}

impl Drop for FakeLockServer {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

fn route(method: &str, path: &str) -> Option<(Op, String)> {
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let op = match (method, segs.as_slice()) {
        ("POST", ["v1", "sessions"]) => Op::Open,
        ("POST", ["v1", "sessions", _, "heartbeat"]) => Op::Heartbeat,
        ("DELETE", ["v1", "sessions", _]) => Op::Close,
        ("POST", ["v1", "locks", _, "acquire"]) => Op::Acquire,
        ("POST", ["v1", "locks", _, "renew"]) => Op::Renew,
        ("POST", ["v1", "locks", _, "rotate"]) => Op::Rotate,
        ("DELETE", ["v1", "locks", _]) => Op::Release,
        ("GET", ["v1", "locks", _]) => Op::Inspect,
        _ => return None,
    };
    Some((op, segs.get(2).copied().unwrap_or_default().to_owned()))
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
    let Some((op, id)) = route(parts.method.as_str(), parts.uri.path()) else {
        return envelope(ErrorCode::NotFound, None);
    };
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    let seen = Seen {
        at: Clock::system().now(),
        owner: header(HEADER_OWNER_ID),
        token: header(HEADER_FENCING_TOKEN),
        body: body.clone(),
    };
    let mut reply = {
        let mut st = state(&shared);
        st.seen.entry(op).or_default().push(seen.clone());
        let scripted = st.scripts.get_mut(&op).and_then(VecDeque::pop_front);
        scripted.or_else(|| st.defaults.get(&op).cloned()).unwrap_or(Reply::Ok)
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
            Reply::Ok => return success(&shared, op, &id, &seen),
        }
    }
}

fn success(shared: &Shared, op: Op, id: &str, seen: &Seen) -> Response {
    let now = Clock::system().wall();
    let owner = seen.owner.clone().unwrap_or_default();
    let ttl_ms = seen.body.get("ttlMillis").and_then(serde_json::Value::as_i64).unwrap_or(10_000);
    let session_id =
        seen.body.get("sessionId").and_then(serde_json::Value::as_str).and_then(|s| Uuid::parse_str(s).ok());
    let expires_at = now + chrono::Duration::milliseconds(ttl_ms);
    match op {
        Op::Open => dlock_http::json(
            StatusCode::CREATED,
            &SessionOpened {
                session_id: dlock_rt::rand::uuid_v4(),
                owner_id: seen.body.get("ownerId").and_then(serde_json::Value::as_str).unwrap_or("").to_owned(),
                ttl_millis: ttl_ms,
                expires_at,
            },
        ),
        Op::Heartbeat => dlock_http::json(
            StatusCode::OK,
            &HeartbeatAck {
                session_id: Uuid::parse_str(id).unwrap_or_default(),
                expires_at,
                server_time: now,
                held_lock_count: 0,
            },
        ),
        Op::Close | Op::Release => {
            Response::builder().status(StatusCode::NO_CONTENT).body(Body::empty()).unwrap_or_default()
        }
        Op::Acquire | Op::Renew | Op::Rotate => {
            let token = match op {
                Op::Renew => seen.token.as_deref().and_then(|t| t.parse().ok()).unwrap_or(0),
                _ => {
                    let mut st = state(shared);
                    st.last_token += 1;
                    st.last_token
                }
            };
            // Signed as the lock server signs (C3-extensions E-14), with the test key.
            let fencing_signature = Some(dlock_contract::grant::testing::signer().sign(id, token, &owner));
            dlock_http::json(
                StatusCode::OK,
                &LockGrant {
                    fencing_signature,
                    key: id.to_owned(),
                    owner_id: owner,
                    session_id: session_id.unwrap_or_default(),
                    fencing_token: token,
                    acquired_at: now,
                    expires_at,
                },
            )
        }
        Op::Inspect => dlock_http::json(
            StatusCode::OK,
            &LockInfo {
                key: id.to_owned(),
                held: true,
                owner_id: Some("someone".into()),
                fencing_token: Some(7),
                acquired_at: Some(now),
                expires_at: Some(expires_at),
                waiter_count: 0,
                lease_remaining_ms: Some(1_000),
                lock_delay_remaining_ms: None,
                token_floor: Some(7),
            },
        ),
    }
}
