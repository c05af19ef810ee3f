//! The rail-stub: a hostile, memoryless stand-in for the bank rail (C3 §3.6).
//!
//! It knows nothing of locks, tokens, sessions or fences, and it must not: every safety
//! property of dlock has to hold with this process treated as a black box that is slow,
//! flaky, and happy to pay twice. What it offers tests is its own record, `GET /calls`:
//! every inbound `/submit` in arrival order, including the ones it dropped, and whether
//! each moved money. Tests assert against that log, never against the proxy's.
//!
//! Chaos is drawn from one seeded stream, a fixed number of draws per call, in arrival
//! order: the same seed and the same arrival order give the same outcomes.

pub mod config;
pub mod openapi;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use dlock_contract::rail::{RailAck, RailCall, RailCallLog, RailCallOutcome};
use dlock_contract::ErrorCode;
use dlock_http::metrics::{LabeledCounter, Registry};
use dlock_http::{ApiError, JsonBody};
use dlock_rt::rand::{Rng, SeededRng};
use dlock_rt::Clock;
use serde_json::Value;

/// Most calls the stub records; past this it answers 503 and moves no money.
/// The rail-stub's name for itself in emitted protocol events ([`dlock_rt::events`]).
pub const NODE: &str = "rail-stub";

pub const CALL_LOG_ENTRIES_MAX: usize = 1_000_000;
/// Largest `/submit` body the stub reads.
pub const BODY_BYTES_MAX: usize = 16 * 1024;
/// Longest `clientRef` the stub accepts.
pub const CLIENT_REF_CHARS_MAX: usize = 128;

/// The stub's chaos knobs (C5 keys `rail.stub.*`).
#[derive(Debug, Clone, PartialEq)]
pub struct StubConfig {
    /// `rail.stub.latency-ms`: fixed delay before every answer.
    pub latency_ms: u64,
    /// `rail.stub.failure-rate`: fraction of calls that fail (half 5xx, half dropped).
    pub failure_rate: f64,
    /// `rail.stub.duplicate-ack-rate`: probability a repeated `clientRef` is paid again
    /// under a new reference (otherwise it is declined).
    pub duplicate_ack_rate: f64,
    /// `rail.stub.decline-rate`: fraction of calls declined with 402.
    pub decline_rate: f64,
    /// `rail.stub.drop-hold-ms`: how long a dropped connection is held open first.
    pub drop_hold_ms: u64,
    /// `rail.stub.seed`: seed of the chaos stream.
    pub seed: u64,
}

impl Default for StubConfig {
    fn default() -> Self {
        StubConfig {
            latency_ms: 0,
            failure_rate: 0.0,
            duplicate_ack_rate: 1.0,
            decline_rate: 0.0,
            drop_hold_ms: 10_000,
            seed: 0,
        }
    }
}

impl StubConfig {
    /// Checks that every rate is a probability.
    pub fn validate(&self) -> Result<(), String> {
        for (name, v) in [
            ("rail.stub.failure-rate", self.failure_rate),
            ("rail.stub.duplicate-ack-rate", self.duplicate_ack_rate),
            ("rail.stub.decline-rate", self.decline_rate),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be between 0.0 and 1.0, got {v}"));
            }
        }
        Ok(())
    }
}

/// What the stub decided for one call, before it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    Accept { reference: String },
    Decline,
    Error,
    Drop,
}

/// Draws the decision for one call. Always consumes exactly five draws, so one call's
/// branch never shifts the stream seen by the next.
fn decide(cfg: &StubConfig, rng: &mut SeededRng, repeat: bool) -> (Decision, bool) {
    let fail: f64 = rng.gen();
    let fail_kind: bool = rng.gen();
    let dup: f64 = rng.gen();
    let decline: f64 = rng.gen();
    let reference: u64 = rng.gen();
    if fail < cfg.failure_rate {
        return if fail_kind {
            (Decision::Error, false)
        } else {
            // A dropped connection is the hostile case: the money may or may not move.
            (Decision::Drop, reference.is_multiple_of(2))
        };
    }
    if (repeat && dup >= cfg.duplicate_ack_rate) || decline < cfg.decline_rate {
        return (Decision::Decline, false);
    }
    (Decision::Accept { reference: format!("RR-{reference:016x}") }, true)
}

struct StubState {
    rng: SeededRng,
    calls: Vec<RailCall>,
    seen: BTreeMap<String, u32>,
}

/// The stub's shared state.
pub struct RailStub {
    cfg: StubConfig,
    clock: Clock,
    state: Mutex<StubState>,
    calls_total: LabeledCounter<4>,
    registry: Registry,
}

impl RailStub {
    pub fn new(cfg: StubConfig, clock: Clock) -> Arc<RailStub> {
        let rng = dlock_rt::rand::seeded(cfg.seed);
        let registry = Registry::default();
        Arc::new(RailStub {
            cfg,
            clock,
            state: Mutex::new(StubState { rng, calls: Vec::new(), seen: BTreeMap::new() }),
            calls_total: LabeledCounter::new(
                &registry,
                "rail_stub_calls_total",
                "Inbound /submit calls by what the rail did with them.",
                "outcome",
                ["accepted", "declined", "error", "dropped"],
            ),
            registry,
        })
    }

    pub fn config(&self) -> &StubConfig {
        &self.cfg
    }

    /// A copy of the call log, in arrival order.
    pub fn calls(&self) -> Vec<RailCall> {
        self.state.lock().map(|s| s.calls.clone()).unwrap_or_default()
    }

    fn record(
        &self,
        client_ref: String,
        amount_minor: i64,
        currency: String,
    ) -> Result<(Decision, RailCall), ApiError> {
        let mut st = self.state.lock().map_err(|_| ApiError::internal("rail-stub state poisoned"))?;
        if st.calls.len() >= CALL_LOG_ENTRIES_MAX {
            return Err(ApiError::new(ErrorCode::NotReady, "the rail's call log is full").with_retry_after_ms(1_000));
        }
        let repeat = st.seen.get(&client_ref).copied().unwrap_or(0) > 0;
        let (decision, paid) = decide(&self.cfg, &mut st.rng, repeat);
        let (outcome, rail_reference) = match &decision {
            Decision::Accept { reference } => (RailCallOutcome::Accepted, Some(reference.clone())),
            Decision::Decline => (RailCallOutcome::Declined, None),
            Decision::Error => (RailCallOutcome::Error, None),
            Decision::Drop => (RailCallOutcome::Dropped, None),
        };
        let call = RailCall {
            client_ref: client_ref.clone(),
            amount_minor,
            currency,
            outcome,
            paid,
            rail_reference,
            received_at: self.clock.wall(),
        };
        *st.seen.entry(client_ref).or_insert(0) += 1;
        let index = st.calls.len();
        dlock_rt::events::emit(NODE, "rail_call", || {
            [
                ("index", index.into()),
                ("client_ref", call.client_ref.clone().into()),
                ("amount_minor", call.amount_minor.into()),
                ("currency", call.currency.clone().into()),
                ("outcome", format!("{:?}", call.outcome).into()),
                ("paid", call.paid.into()),
                ("rail_reference", dlock_rt::events::opt(call.rail_reference.clone())),
                ("received_wall_ms", call.received_at.timestamp_millis().into()),
            ]
        });
        st.calls.push(call.clone());
        self.calls_total.inc(match outcome {
            RailCallOutcome::Accepted => 0,
            RailCallOutcome::Declined => 1,
            RailCallOutcome::Error => 2,
            RailCallOutcome::Dropped => 3,
        });
        Ok((decision, call))
    }
}

/// The rail-stub's one start entry point: serves [`router`] on `listener` until `shutdown`.
/// The stub has no store and no background task.
pub async fn start<F>(
    cfg: StubConfig,
    clock: Clock,
    listener: tokio::net::TcpListener,
    shutdown: F,
) -> Result<dlock_rt::ServiceHandle<RailStub>, String>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let stub = RailStub::new(cfg, clock);
    tracing::info!(
        seed = stub.cfg.seed,
        latencyMs = stub.cfg.latency_ms,
        failureRate = stub.cfg.failure_rate,
        duplicateAckRate = stub.cfg.duplicate_ack_rate,
        declineRate = stub.cfg.decline_rate,
        "rail_stub_starting"
    );
    dlock_rt::ServiceHandle::serve(
        stub.clone(),
        listener,
        router(stub),
        dlock_rt::http::SHUTDOWN_GRACE_MS_DEFAULT,
        shutdown,
    )
    .map_err(|e| format!("rail-stub: {e}"))
}

/// The stub's routes: `POST /submit`, `GET /calls`, health and metrics.
pub fn router(stub: Arc<RailStub>) -> axum::Router {
    let routes = axum::Router::new()
        .route("/submit", post(submit))
        .route("/calls", get(calls))
        .route("/health/live", get(dlock_http::health::live))
        .route("/health/ready", get(crate::openapi::ready))
        .route("/metrics", get(metrics))
        .route(dlock_http::openapi::DOCUMENT_PATH, get(crate::openapi::openapi_json))
        .with_state(stub);
    dlock_http::finish(routes, BODY_BYTES_MAX)
}

fn parse_submit(body: &Value) -> Result<(String, i64, String), ApiError> {
    let client_ref =
        body.get("clientRef").and_then(Value::as_str).filter(|s| !s.is_empty() && s.len() <= CLIENT_REF_CHARS_MAX);
    let amount = body.get("amountMinor").and_then(Value::as_i64);
    let currency = body.get("currency").and_then(Value::as_str).filter(|s| !s.is_empty());
    match (client_ref, amount, currency) {
        (Some(c), Some(a), Some(cur)) => Ok((c.to_owned(), a, cur.to_owned())),
        _ => {
            Err(ApiError::validation("clientRef (1..128 chars), amountMinor (int64) and currency are required", vec![]))
        }
    }
}

/// The rail's transfer endpoint (C3 §3.6): pays, declines (`402`), fails (`500`) or drops
/// the connection, as the seeded chaos decides.
#[utoipa::path(post, path = "/submit", tag = "rail",
    request_body(content = dlock_contract::rail::RailSubmit, content_type = "application/json"),
    responses((status = 200, description = "Paid.", body = RailAck)))]
async fn submit(State(stub): State<Arc<RailStub>>, JsonBody(body): JsonBody) -> Response {
    let (client_ref, amount_minor, currency) = match parse_submit(&body) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    let (decision, call) = match stub.record(client_ref, amount_minor, currency) {
        Ok(v) => v,
        Err(e) => return e.into_response(),
    };
    tracing::info!(
        clientRef = %call.client_ref,
        outcome = ?call.outcome,
        paid = call.paid,
        "rail_stub_call"
    );
    if stub.cfg.latency_ms > 0 {
        dlock_rt::sleep(dlock_rt::Duration::from_millis(stub.cfg.latency_ms)).await;
    }
    match decision {
        Decision::Accept { reference } => {
            dlock_http::json(StatusCode::OK, &RailAck { rail_reference: reference, accepted_at: call.received_at })
        }
        Decision::Decline => {
            ApiError::new(ErrorCode::ValidationFailed, "declined by the rail").with_status(402).into_response()
        }
        // A knob, not a contradiction: the same envelope as `ApiError::internal`'s.
        Decision::Error => {
            ApiError::new(ErrorCode::Internal, "internal error").with_internal("injected rail failure").into_response()
        }
        Decision::Drop => {
            dlock_rt::sleep(dlock_rt::Duration::from_millis(stub.cfg.drop_hold_ms)).await;
            let mut resp = Response::new(axum::body::Body::empty());
            resp.extensions_mut().insert(dlock_rt::http::DropConnection);
            resp
        }
    }
}

/// The rail's own record of every inbound `/submit`, in arrival order.
#[utoipa::path(get, path = "/calls", tag = "rail",
    responses((status = 200, description = "The call log.", body = RailCallLog)))]
async fn calls(State(stub): State<Arc<RailStub>>) -> Response {
    dlock_http::json(StatusCode::OK, &RailCallLog { calls: stub.calls() })
}

/// Prometheus metrics (C4).
#[utoipa::path(get, path = "/metrics", tag = "metrics",
    responses((status = 200, description = "Prometheus text exposition.", content_type = "text/plain; version=0.0.4; charset=utf-8", body = String)))]
async fn metrics(State(stub): State<Arc<RailStub>>) -> Response {
    dlock_http::metrics::response(stub.registry.render())
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    async fn post_submit(app: &axum::Router, client_ref: &str) -> (u16, Value) {
        let req = axum::http::Request::post("/submit")
            .header("content-type", "application/json")
            .body(axum::body::Body::from(
                serde_json::json!({"clientRef": client_ref, "amountMinor": 100, "currency": "EUR"}).to_string(),
            ))
            .expect("request");
        let resp = app.clone().oneshot(req).await.expect("infallible");
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
    }

    #[tokio::test]
    async fn repeated_client_ref_is_paid_again_under_a_new_reference() {
        let stub = RailStub::new(StubConfig { seed: 1, ..StubConfig::default() }, Clock::system());
        let app = router(stub.clone());
        let (s1, a1) = post_submit(&app, "p-1").await;
        let (s2, a2) = post_submit(&app, "p-1").await;
        assert_eq!((s1, s2), (200, 200));
        assert_ne!(a1["railReference"], a2["railReference"]);
        let calls = stub.calls();
        assert_eq!(calls.len(), 2);
        assert!(calls.iter().all(|c| c.paid && c.client_ref == "p-1"));
    }

    #[tokio::test]
    async fn duplicate_ack_rate_zero_declines_every_repeat() {
        let cfg = StubConfig { seed: 1, duplicate_ack_rate: 0.0, ..StubConfig::default() };
        let app = router(RailStub::new(cfg, Clock::system()));
        assert_eq!(post_submit(&app, "p-1").await.0, 200);
        let (status, body) = post_submit(&app, "p-1").await;
        assert_eq!(status, 402);
        assert_eq!(body["code"], "VALIDATION_FAILED");
    }

    #[tokio::test]
    async fn decline_rate_one_declines_everything_and_pays_nothing() {
        let cfg = StubConfig { seed: 1, decline_rate: 1.0, ..StubConfig::default() };
        let stub = RailStub::new(cfg, Clock::system());
        let app = router(stub.clone());
        assert_eq!(post_submit(&app, "a").await.0, 402);
        assert!(stub.calls().iter().all(|c| !c.paid && c.outcome == RailCallOutcome::Declined));
    }

    #[test]
    fn same_seed_gives_the_same_chaos_sequence() {
        let cfg = StubConfig { seed: 42, failure_rate: 0.5, decline_rate: 0.2, ..StubConfig::default() };
        let run = || {
            let mut rng = dlock_rt::rand::seeded(cfg.seed);
            (0..64).map(|i| decide(&cfg, &mut rng, i % 3 == 0)).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        assert!(a.iter().any(|(d, _)| *d == Decision::Drop));
        assert!(a.iter().any(|(d, _)| *d == Decision::Error));
        assert!(a.iter().any(|(d, _)| matches!(d, Decision::Accept { .. })));
    }

    #[test]
    fn rates_outside_zero_to_one_are_refused() {
        assert!(StubConfig { failure_rate: 1.5, ..StubConfig::default() }.validate().is_err());
        assert!(StubConfig { decline_rate: -0.1, ..StubConfig::default() }.validate().is_err());
        assert!(StubConfig::default().validate().is_ok());
    }

    #[tokio::test]
    async fn call_log_lists_every_call_in_arrival_order() {
        let stub = RailStub::new(StubConfig::default(), Clock::system());
        let app = router(stub.clone());
        for r in ["a", "b", "c"] {
            post_submit(&app, r).await;
        }
        let req = axum::http::Request::get("/calls").body(axum::body::Body::empty()).expect("request");
        let resp = app.oneshot(req).await.expect("infallible");
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        let log: RailCallLog = serde_json::from_slice(&bytes).expect("log");
        let refs: Vec<_> = log.calls.iter().map(|c| c.client_ref.as_str()).collect();
        assert_eq!(refs, ["a", "b", "c"]);
    }
}
