//! The operator's resolution over HTTP, `POST /v1/payouts/{payoutId}/resolution`
//! (C3-extensions E-21), behind authentication, over the simulation's paydb and over
//! SQLite: an operator resolves a RAIL_AMBIGUOUS payout as POSTED or FAILED with exactly the
//! ledger and audit row of `dlock resolve`'s statements; the answer is recorded under its
//! idempotency key; every refusal is the envelope and writes nothing; only an operator
//! credential may call it; the resolution is on the event stream as `operator.resolution`.

#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Body;
use chrono::Utc;
use dlock_contract::payout::PayoutState;
use dlock_contract::CONTENT_TYPE_JSON;
use dlock_payment_resource::store::{AmbiguousResolution, Direction, ResolveOutcome, StoreFault};
use dlock_payment_resource::store_fault::FaultyPaymentStore;
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_payment_resource::PaymentStore;
use dlock_rail_proxy::store::{Admission, Attempt, RailStore, Resolution};
use dlock_testkit::auth::{OPERATOR_TOKEN, READER_TOKEN, WORKER_TOKEN};
use dlock_testkit::TempDir;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use uuid::Uuid;

/// How long a test reads the event stream for the frames it expects.
const STREAM_WAIT_MS_MAX: u64 = 10_000;
/// How often a test asks the recent page again while the service has not yet read the head.
const RECENT_POLL_MS: u64 = 10;
/// Every account here opens with this balance, in minor units.
const OPENING_MINOR: i64 = 10_000;
/// Every payout here is for this amount, in minor units.
const AMOUNT_MINOR: i64 = 700;

mod authed;
use authed::app_over;

/// One paydb behind the service: the app, the payment store and the proxy's store over it.
struct Backend {
    name: &'static str,
    app: axum::Router,
    pay: Arc<dyn PaymentStore>,
    rail: Arc<dyn RailStore>,
    _dir: Option<TempDir>,
}

async fn backends() -> Vec<Backend> {
    let mem = Arc::new(MemPaydb::new());
    let dir = TempDir::new("resolution-http");
    let url = dlock_testkit::sqlite_url(&dir);
    let sqlite = dlock_payment_resource::store_sql::open(&url).await.expect("sqlite");
    let sqlite_rail = dlock_rail_proxy::store_sql::open(&url).await.expect("sqlite rail");
    vec![
        Backend { name: "memory", app: app_over(mem.clone()).await, pay: mem.clone(), rail: mem, _dir: None },
        Backend {
            name: "sqlite",
            app: app_over(sqlite.clone()).await,
            pay: sqlite,
            rail: sqlite_rail,
            _dir: Some(dir),
        },
    ]
}

struct Answer {
    status: u16,
    content_type: String,
    bytes: Vec<u8>,
    json: Value,
}

async fn send(app: &axum::Router, method: &str, uri: &str, headers: &[(&str, String)], body: Option<String>) -> Answer {
    let mut b = axum::http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    let resp =
        app.clone().oneshot(b.body(Body::from(body.unwrap_or_default())).expect("request")).await.expect("infallible");
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes().to_vec();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer { status, content_type, bytes, json }
}

fn assert_envelope(a: &Answer, status: u16, code: &str, retry_safe: bool, what: &str) {
    assert_eq!(a.status, status, "{what}: {}", a.json);
    assert_eq!(a.content_type, CONTENT_TYPE_JSON, "{what}");
    assert_eq!(a.json["code"], code, "{what}: {}", a.json);
    assert_eq!(a.json["retrySafe"], retry_safe, "{what}: {}", a.json);
    assert!(a.json["message"].is_string(), "{what}: {}", a.json);
    assert_eq!(a.json["traceId"].as_str().map(str::len), Some(32), "{what}: {}", a.json);
}

/// A write's headers with `token`'s bearer, the owner and the key.
fn write_headers(token: &str, owner: &str, key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("authorization", format!("Bearer {token}")),
        ("content-type", "application/json".to_owned()),
        ("x-owner-id", owner.to_owned()),
        ("x-idempotency-key", key.to_owned()),
    ]
}

fn reader() -> Vec<(&'static str, String)> {
    vec![("authorization", format!("Bearer {READER_TOKEN}"))]
}

fn resolution_body(resolved_as: &str, reason: &str, rail_reference: &str) -> String {
    json!({"resolvedAs": resolved_as, "reason": reason, "railReference": rail_reference}).to_string()
}

/// `POST /v1/payouts/{payout}/resolution` by the operator `ops-alice` under `key`.
async fn resolve(app: &axum::Router, payout: Uuid, key: &str, body: String) -> Answer {
    let uri = format!("/v1/payouts/{payout}/resolution");
    send(app, "POST", &uri, &write_headers(OPERATOR_TOKEN, "ops-alice", key), Some(body)).await
}

async fn create_account(app: &axum::Router, account: &str) {
    let body = json!({"accountId": account, "currency": "EUR", "openingBalanceMinor": OPENING_MINOR}).to_string();
    let a =
        send(app, "POST", "/v1/accounts", &write_headers(OPERATOR_TOKEN, "ops", &format!("a:{account}")), Some(body))
            .await;
    assert_eq!(a.status, 201, "{}", a.json);
}

async fn create_payout(app: &axum::Router, account: &str) -> Uuid {
    let id = Uuid::new_v4();
    let body = json!({"payoutId": id, "accountId": account, "amountMinor": AMOUNT_MINOR, "currency": "EUR",
        "beneficiaryRef": "bene-1"})
    .to_string();
    let a =
        send(app, "POST", "/v1/payouts", &write_headers(OPERATOR_TOKEN, "ops", &format!("c:{id}")), Some(body)).await;
    assert_eq!(a.status, 201, "{}", a.json);
    id
}

/// A payout of `account` driven to RAIL_AMBIGUOUS: claimed over HTTP under `token`, admitted
/// by the proxy's store, and its forward timed out.
async fn ambiguous_payout(b: &Backend, account: &str, token: i64) -> Uuid {
    let payout = create_payout(&b.app, account).await;
    let sig = dlock_contract::grant::testing::sign_payout(account, token, "w-1");
    let mut h = write_headers(WORKER_TOKEN, "w-1", &format!("payout:{payout}"));
    h.push(("x-fencing-token", token.to_string()));
    h.push(("x-fencing-signature", sig));
    let claimed =
        send(&b.app, "POST", &format!("/v1/payouts/{payout}/claim"), &h, Some(r#"{"expectedState":"PENDING"}"#.into()))
            .await;
    assert_eq!(claimed.status, 200, "{}: {}", b.name, claimed.json);
    let submission_id = Uuid::new_v4();
    let at = dlock_contract::time::truncate_ms(Utc::now());
    let attempt = Attempt {
        submission_id,
        payout_id: payout,
        account_id: account.into(),
        presented_token: token,
        owner_id: "w-1".into(),
        idempotency_key: format!("payout:{payout}"),
        amount_minor: AMOUNT_MINOR,
        currency: "EUR".into(),
        at,
        fencing_enabled: true,
    };
    let admitted = b.rail.admit(&attempt).await.expect("admit");
    assert!(matches!(admitted, Admission::Admitted { .. }), "{}: {admitted:?}", b.name);
    let timeout = Resolution::Timeout { detail: "read timed out".into() };
    b.rail.resolve(submission_id, &timeout, at).await.expect("resolve the attempt");
    assert_eq!(state_of(b, payout).await, PayoutState::RailAmbiguous, "{}", b.name);
    payout
}

async fn state_of(b: &Backend, payout: Uuid) -> PayoutState {
    b.pay.payout(payout).await.expect("read").expect("exists").state
}

async fn account(b: &Backend, account: &str) -> Value {
    let a = send(&b.app, "GET", &format!("/v1/accounts/{account}"), &reader(), None).await;
    assert_eq!(a.status, 200, "{}: {}", b.name, a.json);
    a.json
}

/// What `dlock resolve` runs for the same verdict: the store's `resolve_ambiguous`, the
/// statements `ReconcileStore::resolve_ambiguous` runs on paydb.
async fn resolve_as_the_cli_does(b: &Backend, payout: Uuid, resolved_as: PayoutState) {
    let r = AmbiguousResolution {
        resolution_id: Uuid::new_v4(),
        payout_id: payout,
        resolved_as,
        operator: "ops-alice".into(),
        reason: "rail statement line 42".into(),
        rail_reference: "RR-42".into(),
        posting_id: Uuid::new_v4(),
        entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
        at: Utc::now(),
    };
    let o = b.pay.resolve_ambiguous(&r).await.expect("resolve");
    assert!(matches!(o, ResolveOutcome::Resolved { .. }), "{}: {o:?}", b.name);
}

/// The payout's ledger entries as (account, direction, amount, fence), in entry order.
async fn entries_of(b: &Backend, payout: Uuid) -> Vec<(String, Direction, i64, i64)> {
    let mut rows: Vec<(String, Direction, i64, i64)> = b
        .pay
        .ledger(None)
        .await
        .expect("ledger")
        .into_iter()
        .filter(|e| e.payout_id == Some(payout))
        .map(|e| (e.account_id, e.direction, e.amount_minor, e.fence))
        .collect();
    rows.sort();
    rows
}

/// What a refusal must leave as it was: the payout's state, the account, the resolutions
/// and the idempotency records.
async fn untouched(b: &Backend, payout: Uuid, account_id: &str, before: &Value, records: u64, what: &str) {
    assert_eq!(state_of(b, payout).await, PayoutState::RailAmbiguous, "{}: {what}", b.name);
    assert_eq!(&account(b, account_id).await, before, "{}: {what}", b.name);
    assert!(b.pay.resolutions(Some(payout)).await.expect("resolutions").is_empty(), "{}: {what}", b.name);
    assert!(entries_of(b, payout).await.is_empty(), "{}: {what}", b.name);
    assert_eq!(b.pay.idempotency_record_count().await.expect("count"), records, "{}: {what}", b.name);
}

#[tokio::test]
async fn an_operator_resolves_an_ambiguous_payout_as_posted_with_the_clis_ledger_and_an_audit_row() {
    for b in backends().await {
        create_account(&b.app, "acct-1").await;
        create_account(&b.app, "acct-2").await;
        let by_http = ambiguous_payout(&b, "acct-1", 5).await;
        let by_cli = ambiguous_payout(&b, "acct-2", 5).await;
        assert_eq!(account(&b, "acct-1").await["availableMinor"], OPENING_MINOR - AMOUNT_MINOR, "{}", b.name);

        let body = resolution_body("POSTED", "rail statement line 42", "RR-42");
        let a = resolve(&b.app, by_http, "resolve-1", body).await;
        assert_eq!(a.status, 200, "{}: {}", b.name, a.json);
        assert_eq!(a.content_type, CONTENT_TYPE_JSON);
        assert_eq!(a.json["payoutId"], json!(by_http.to_string()), "{}", b.name);
        assert_eq!(a.json["state"], "POSTED", "{}", b.name);
        assert_eq!(a.json["balanceMinor"], OPENING_MINOR - AMOUNT_MINOR, "{}", b.name);
        let resolution_id: Uuid = a.json["resolutionId"].as_str().and_then(|s| s.parse().ok()).expect("an id");
        assert_eq!(state_of(&b, by_http).await, PayoutState::Posted, "{}", b.name);

        // The audit row, as `dlock resolve` writes it, the operator from X-Owner-Id.
        let rows = b.pay.resolutions(Some(by_http)).await.expect("resolutions");
        assert_eq!(rows.len(), 1, "{}", b.name);
        let row = &rows[0];
        assert_eq!(row.resolution_id, resolution_id, "{}", b.name);
        assert_eq!(row.resolved_as, PayoutState::Posted, "{}", b.name);
        assert_eq!(
            (row.operator.as_str(), row.reason.as_str(), row.rail_reference.as_str()),
            ("ops-alice", "rail statement line 42", "RR-42"),
            "{}",
            b.name
        );

        // The same verdict by the CLI's statements on an identical payout of another account:
        // the same balance, the same two balanced entries with fence 0.
        resolve_as_the_cli_does(&b, by_cli, PayoutState::Posted).await;
        let (http_account, cli_account) = (account(&b, "acct-1").await, account(&b, "acct-2").await);
        for field in ["balanceMinor", "ledgerSumMinor", "availableMinor", "fence"] {
            assert_eq!(http_account[field], cli_account[field], "{}: {field}", b.name);
        }
        assert_eq!(http_account["balanceMinor"], OPENING_MINOR - AMOUNT_MINOR, "{}", b.name);
        assert_eq!(http_account["ledgerSumMinor"], OPENING_MINOR - AMOUNT_MINOR, "{}", b.name);
        let http_entries = entries_of(&b, by_http).await;
        assert_eq!(
            http_entries,
            vec![
                ("#settlement:EUR".to_owned(), Direction::Credit, AMOUNT_MINOR, 0),
                ("acct-1".to_owned(), Direction::Debit, AMOUNT_MINOR, 0),
            ],
            "{}",
            b.name
        );
        let cli_entries: Vec<_> = entries_of(&b, by_cli)
            .await
            .into_iter()
            .map(|(a, d, m, f)| (if a == "acct-2" { "acct-1".to_owned() } else { a }, d, m, f))
            .collect();
        assert_eq!(http_entries, cli_entries, "{}", b.name);
    }
}

#[tokio::test]
async fn an_operator_resolves_an_ambiguous_payout_as_failed_releasing_its_reservation_as_the_cli_does() {
    for b in backends().await {
        create_account(&b.app, "acct-1").await;
        create_account(&b.app, "acct-2").await;
        let by_http = ambiguous_payout(&b, "acct-1", 5).await;
        let by_cli = ambiguous_payout(&b, "acct-2", 5).await;
        let body = resolution_body("FAILED", "rail statement shows no transfer", "none");
        let a = resolve(&b.app, by_http, "resolve-1", body).await;
        assert_eq!(a.status, 200, "{}: {}", b.name, a.json);
        assert_eq!(a.json["state"], "FAILED", "{}", b.name);
        assert_eq!(a.json["balanceMinor"], OPENING_MINOR, "{}: the balance is not debited", b.name);
        assert_eq!(state_of(&b, by_http).await, PayoutState::Failed, "{}", b.name);
        let rows = b.pay.resolutions(Some(by_http)).await.expect("resolutions");
        assert_eq!(rows.len(), 1, "{}", b.name);
        assert_eq!((rows[0].resolved_as, rows[0].rail_reference.as_str()), (PayoutState::Failed, "none"));
        assert_eq!(rows[0].resolution_id.to_string(), a.json["resolutionId"].as_str().unwrap_or_default());
        assert!(entries_of(&b, by_http).await.is_empty(), "{}: FAILED writes no entry", b.name);

        resolve_as_the_cli_does(&b, by_cli, PayoutState::Failed).await;
        let (http_account, cli_account) = (account(&b, "acct-1").await, account(&b, "acct-2").await);
        assert_eq!(http_account["availableMinor"], OPENING_MINOR, "{}: the reservation is released", b.name);
        for field in ["balanceMinor", "ledgerSumMinor", "availableMinor", "fence"] {
            assert_eq!(http_account[field], cli_account[field], "{}: {field}", b.name);
        }
    }
}

#[tokio::test]
async fn a_resolution_replays_its_answer_under_its_key_and_a_changed_request_under_it_is_a_conflict() {
    for b in backends().await {
        create_account(&b.app, "acct-1").await;
        let p = ambiguous_payout(&b, "acct-1", 5).await;
        let body = resolution_body("POSTED", "rail statement line 42", "RR-42");
        let first = resolve(&b.app, p, "resolve-1", body.clone()).await;
        assert_eq!(first.status, 200, "{}: {}", b.name, first.json);
        let again = resolve(&b.app, p, "resolve-1", body).await;
        assert_eq!((again.status, &again.bytes), (200, &first.bytes), "{}: the recorded answer, byte for byte", b.name);
        assert_eq!(b.pay.resolutions(Some(p)).await.expect("resolutions").len(), 1, "{}: resolved once", b.name);
        assert_eq!(account(&b, "acct-1").await["balanceMinor"], OPENING_MINOR - AMOUNT_MINOR, "{}", b.name);

        let changed =
            resolve(&b.app, p, "resolve-1", resolution_body("FAILED", "rail statement line 42", "RR-42")).await;
        assert_envelope(&changed, 422, "IDEMPOTENCY_CONFLICT", false, b.name);
        // A new key on the resolved payout is judged afresh: no longer RAIL_AMBIGUOUS.
        let fresh = resolve(&b.app, p, "resolve-2", resolution_body("POSTED", "rail statement line 42", "RR-42")).await;
        assert_envelope(&fresh, 409, "PAYOUT_NOT_CLAIMABLE", false, b.name);
        assert_eq!(fresh.json["details"]["state"], "POSTED", "{}", b.name);
        assert_eq!(b.pay.resolutions(Some(p)).await.expect("resolutions").len(), 1, "{}", b.name);
    }
}

#[tokio::test]
async fn a_reader_or_worker_credential_is_refused_403_and_writes_nothing() {
    for b in backends().await {
        create_account(&b.app, "acct-1").await;
        let p = ambiguous_payout(&b, "acct-1", 5).await;
        let before = account(&b, "acct-1").await;
        let records = b.pay.idempotency_record_count().await.expect("count");
        let body = resolution_body("POSTED", "rail statement line 42", "RR-42");
        let uri = format!("/v1/payouts/{p}/resolution");
        for token in [READER_TOKEN, WORKER_TOKEN] {
            let a = send(&b.app, "POST", &uri, &write_headers(token, "ops-alice", "k"), Some(body.clone())).await;
            assert_envelope(&a, 403, "FORBIDDEN", false, b.name);
        }
        let mut anonymous = write_headers(OPERATOR_TOKEN, "ops-alice", "k");
        anonymous.retain(|(name, _)| *name != "authorization");
        let a = send(&b.app, "POST", &uri, &anonymous, Some(body)).await;
        assert_envelope(&a, 401, "UNAUTHENTICATED", false, b.name);
        untouched(&b, p, "acct-1", &before, records, "refused credentials").await;
    }
}

#[tokio::test]
async fn a_payout_not_rail_ambiguous_is_refused_409_in_the_envelope_and_an_unknown_one_404() {
    for b in backends().await {
        create_account(&b.app, "acct-1").await;
        let pending = create_payout(&b.app, "acct-1").await;
        let records = b.pay.idempotency_record_count().await.expect("count");
        let body = resolution_body("POSTED", "rail statement line 42", "RR-42");
        let a = resolve(&b.app, pending, "resolve-1", body.clone()).await;
        assert_envelope(&a, 409, "PAYOUT_NOT_CLAIMABLE", false, b.name);
        assert_eq!(a.json["details"], json!({"payoutId": pending.to_string(), "state": "PENDING"}), "{}", b.name);
        assert_eq!(state_of(&b, pending).await, PayoutState::Pending, "{}", b.name);
        let unknown = resolve(&b.app, Uuid::new_v4(), "resolve-2", body).await;
        assert_envelope(&unknown, 404, "NOT_FOUND", false, b.name);
        assert!(b.pay.resolutions(None).await.expect("resolutions").is_empty(), "{}", b.name);
        assert_eq!(
            b.pay.idempotency_record_count().await.expect("count"),
            records,
            "{}: refusals record nothing",
            b.name
        );
        assert_eq!(account(&b, "acct-1").await["balanceMinor"], OPENING_MINOR, "{}", b.name);
    }
}

#[tokio::test]
async fn bad_input_is_refused_400_validation_failed_naming_the_field_and_writes_nothing() {
    for b in backends().await {
        create_account(&b.app, "acct-1").await;
        let p = ambiguous_payout(&b, "acct-1", 5).await;
        let before = account(&b, "acct-1").await;
        let records = b.pay.idempotency_record_count().await.expect("count");
        let uri = format!("/v1/payouts/{p}/resolution");
        let ok_reason = "rail statement line 42";
        let long_reference = "R".repeat(dlock_contract::resolution::RESOLUTION_RAIL_REFERENCE_CHARS_MAX + 1);
        let long_reason = "x".repeat(dlock_contract::resolution::RESOLUTION_REASON_CHARS_MAX + 1);
        // (why, body, the field named)
        let bodies = [
            ("short reason", resolution_body("POSTED", "too few", "RR-1"), "reason"),
            ("blank reason", resolution_body("POSTED", "          ", "RR-1"), "reason"),
            ("long reason", resolution_body("POSTED", &long_reason, "RR-1"), "reason"),
            ("control char", resolution_body("POSTED", "statement\nline 42", "RR-1"), "reason"),
            ("verdict", resolution_body("RAIL_AMBIGUOUS", ok_reason, "RR-1"), "resolvedAs"),
            ("lower-case verdict", resolution_body("posted", ok_reason, "RR-1"), "resolvedAs"),
            ("space in reference", resolution_body("POSTED", ok_reason, "RR 1"), "railReference"),
            ("empty reference", resolution_body("POSTED", ok_reason, ""), "railReference"),
            ("long reference", resolution_body("POSTED", ok_reason, &long_reference), "railReference"),
            ("no reference", json!({"resolvedAs": "POSTED", "reason": ok_reason}).to_string(), "railReference"),
            ("not an object", "[1]".to_owned(), "$"),
        ];
        for (why, body, field) in bodies {
            let a = send(&b.app, "POST", &uri, &write_headers(OPERATOR_TOKEN, "ops-alice", "k"), Some(body)).await;
            assert_envelope(&a, 400, "VALIDATION_FAILED", false, why);
            let fields: Vec<&str> = a.json["details"]["fields"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|f| f["field"].as_str())
                .collect();
            assert_eq!(fields, [field], "{}: {why}", b.name);
        }
        let body = resolution_body("POSTED", ok_reason, "RR-1");
        let long_operator = "o".repeat(dlock_contract::headers::OWNER_ID_CHARS_MAX + 1);
        let mut no_owner = write_headers(OPERATOR_TOKEN, "x", "k");
        no_owner.retain(|(n, _)| *n != "x-owner-id");
        let mut no_key = write_headers(OPERATOR_TOKEN, "ops-alice", "k");
        no_key.retain(|(n, _)| *n != "x-idempotency-key");
        let headers = [
            ("operator with a space", write_headers(OPERATOR_TOKEN, "ops alice", "k"), uri.clone()),
            ("operator too long", write_headers(OPERATOR_TOKEN, &long_operator, "k"), uri.clone()),
            ("no operator", no_owner, uri.clone()),
            ("no idempotency key", no_key, uri.clone()),
            ("path not a uuid", write_headers(OPERATOR_TOKEN, "ops-alice", "k"), "/v1/payouts/nope/resolution".into()),
        ];
        for (why, h, uri) in headers {
            let a = send(&b.app, "POST", &uri, &h, Some(body.clone())).await;
            assert_envelope(&a, 400, "VALIDATION_FAILED", false, why);
        }
        untouched(&b, p, "acct-1", &before, records, "bad input").await;
    }
}

/// Reads SSE frames `(event, data)` until `done` says enough, or the stream ends, or
/// [`STREAM_WAIT_MS_MAX`] passes.
async fn frames(
    app: &axum::Router,
    uri: &str,
    cursor: &str,
    done: impl Fn(&[(String, Value)]) -> bool,
) -> Vec<(String, Value)> {
    let mut b = axum::http::Request::builder().method("GET").uri(uri);
    for (k, v) in reader() {
        b = b.header(k, v);
    }
    b = b.header("last-event-id", cursor);
    let resp = app.clone().oneshot(b.body(Body::empty()).expect("request")).await.expect("infallible");
    assert_eq!(resp.status().as_u16(), 200);
    let mut body = resp.into_body().into_data_stream();
    let mut text = String::new();
    let mut out: Vec<(String, Value)> = Vec::new();
    let _ = dlock_rt::timeout(dlock_rt::Duration::from_millis(STREAM_WAIT_MS_MAX), async {
        while !done(&out) {
            let Some(Ok(chunk)) = body.next().await else { break };
            text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
            while let Some(end) = text.find("\n\n") {
                let raw: String = text.drain(..end + 2).collect();
                let (mut event, mut data) = (String::new(), Value::Null);
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(v).expect("data is JSON");
                    }
                }
                out.push((event, data));
            }
        }
    })
    .await;
    out
}

#[tokio::test]
async fn a_resolution_is_on_the_event_stream_as_operator_resolution() {
    for b in backends().await {
        create_account(&b.app, "acct-1").await;
        let p = ambiguous_payout(&b, "acct-1", 5).await;
        let filter = format!("payout={p}");
        let snapshot = send(&b.app, "GET", &format!("/v1/events/recent?{filter}"), &reader(), None).await;
        let cursor = snapshot.json["cursor"].as_str().expect("cursor").to_owned();
        let a = resolve(&b.app, p, "resolve-1", resolution_body("POSTED", "rail statement line 42", "RR-42")).await;
        assert_eq!(a.status, 200, "{}: {}", b.name, a.json);

        // The stream from the snapshot before it: the move to POSTED, then the resolution.
        let got = frames(&b.app, &format!("/v1/events?{filter}"), &cursor, |f| f.len() >= 2).await;
        let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(kinds, ["payout.state_changed", "operator.resolution"], "{}: {got:?}", b.name);
        assert_eq!(
            (got[0].1["data"]["from"].as_str(), got[0].1["data"]["to"].as_str()),
            (Some("RAIL_AMBIGUOUS"), Some("POSTED"))
        );
        assert_eq!(got[1].1["data"]["resolutionId"], a.json["resolutionId"], "{}", b.name);

        // The recent page (the service reads its store's head on its poll): the resolution.
        let uri = format!("/v1/events/recent?{filter}&kind=operator.resolution");
        let wait =
            (dlock_rt::Duration::from_millis(RECENT_POLL_MS), dlock_rt::Duration::from_millis(STREAM_WAIT_MS_MAX));
        let events = dlock_rt::wait_until(wait.0, wait.1, || async {
            let recent = send(&b.app, "GET", &uri, &reader(), None).await;
            assert_eq!(recent.status, 200, "{}: {}", b.name, recent.json);
            recent.json["events"].as_array().filter(|e| !e.is_empty()).cloned()
        })
        .await
        .unwrap_or_default();
        assert_eq!(events.len(), 1, "{}: {events:?}", b.name);
        let e = &events[0];
        assert_eq!((e["kind"].as_str(), e["accountId"].as_str()), (Some("operator.resolution"), Some("acct-1")));
        assert_eq!(
            e["data"],
            json!({"resolutionId": a.json["resolutionId"], "resolvedAs": "POSTED", "operator": "ops-alice",
                "reason": "rail statement line 42", "railReference": "RR-42"}),
            "{}",
            b.name
        );
    }
}

#[tokio::test]
async fn a_store_failure_of_a_resolution_is_retry_safe_only_when_nothing_happened() {
    // (class, status, code, retrySafe, the resolution committed)
    let cases = [
        (StoreFault::Unavailable, 503, "NOT_READY", true, false),
        (StoreFault::CommitUnknown, 500, "INTERNAL", false, true),
        (StoreFault::Corrupt, 500, "INTERNAL", false, false),
    ];
    for (fault, status, code, retry_safe, committed) in cases {
        let paydb = Arc::new(MemPaydb::new());
        let faulty = Arc::new(FaultyPaymentStore::new(paydb.clone()));
        let b = Backend {
            name: "memory",
            app: app_over(faulty.clone()).await,
            pay: paydb.clone(),
            rail: paydb,
            _dir: None,
        };
        create_account(&b.app, "acct-1").await;
        let p = ambiguous_payout(&b, "acct-1", 5).await;
        faulty.faults.inject("resolve_recorded", fault);
        let body = resolution_body("POSTED", "rail statement line 42", "RR-42");
        let a = resolve(&b.app, p, "resolve-1", body.clone()).await;
        assert_envelope(&a, status, code, retry_safe, &format!("{fault:?}"));
        let want = if committed { PayoutState::Posted } else { PayoutState::RailAmbiguous };
        assert_eq!(state_of(&b, p).await, want, "{fault:?}");
        // The same request again learns the outcome: the recorded answer of a lost commit,
        // or a resolution run afresh.
        let again = resolve(&b.app, p, "resolve-1", body).await;
        assert_eq!((again.status, again.json["state"].as_str()), (200, Some("POSTED")), "{fault:?}: {}", again.json);
        assert_eq!(b.pay.resolutions(Some(p)).await.expect("resolutions").len(), 1, "{fault:?}");
    }
}
