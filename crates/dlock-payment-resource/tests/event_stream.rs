//! The event stream over HTTP (C3-extensions E-20): `GET /v1/events` and
//! `GET /v1/events/recent` on the payment-resource, behind authentication, over the
//! simulation's paydb and over SQLite: a snapshot's cursor streams every change after it in
//! commit order; a cursor of another caller, another filter, a tampered one or none gets
//! `resync_required`; a fenced-out claim is streamed with both tokens.

#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Body;
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_testkit::TempDir;
use futures::StreamExt;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use uuid::Uuid;

/// How long a test reads a stream for the frames it expects.
const STREAM_WAIT_MS_MAX: u64 = 10_000;

mod authed;
use authed::app_over;

async fn backends() -> Vec<(&'static str, axum::Router, Option<TempDir>)> {
    let dir = TempDir::new("event-stream");
    let sqlite = dlock_payment_resource::store_sql::open(&dlock_testkit::sqlite_url(&dir)).await.expect("sqlite");
    vec![("memory", app_over(Arc::new(MemPaydb::new())).await, None), ("sqlite", app_over(sqlite).await, Some(dir))]
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

async fn send(
    app: &axum::Router,
    method: &str,
    uri: &str,
    headers: &[(&str, String)],
    body: Option<String>,
) -> (u16, Value) {
    let mut b = axum::http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    let resp =
        app.clone().oneshot(b.body(Body::from(body.unwrap_or_default())).expect("request")).await.expect("infallible");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn operator(key: &str) -> Vec<(&'static str, String)> {
    vec![
        ("authorization", bearer(dlock_testkit::auth::OPERATOR_TOKEN)),
        ("content-type", "application/json".to_owned()),
        ("x-owner-id", "ops".to_owned()),
        ("x-idempotency-key", key.to_owned()),
    ]
}

fn reader() -> Vec<(&'static str, String)> {
    vec![("authorization", bearer(dlock_testkit::auth::READER_TOKEN))]
}

async fn seed(app: &axum::Router) -> (Uuid, Uuid) {
    let body = json!({"accountId": "acct-1", "currency": "EUR", "openingBalanceMinor": 10_000}).to_string();
    assert_eq!(send(app, "POST", "/v1/accounts", &operator("a1"), Some(body)).await.0, 201);
    let mut ids = Vec::new();
    for _ in 0..2 {
        let id = Uuid::new_v4();
        let body = json!({"payoutId": id, "accountId": "acct-1", "amountMinor": 100, "currency": "EUR",
            "beneficiaryRef": "<script>alert(1)</script>"})
        .to_string();
        assert_eq!(send(app, "POST", "/v1/payouts", &operator(&format!("c:{id}")), Some(body)).await.0, 201);
        ids.push(id);
    }
    (ids[0], ids[1])
}

async fn claim(app: &axum::Router, payout: Uuid, token: i64) -> u16 {
    let sig = dlock_contract::grant::testing::sign_payout("acct-1", token, "w-1");
    let headers = vec![
        ("authorization", bearer(dlock_testkit::auth::WORKER_TOKEN)),
        ("content-type", "application/json".to_owned()),
        ("x-owner-id", "w-1".to_owned()),
        ("x-idempotency-key", format!("payout:{payout}")),
        ("x-fencing-token", token.to_string()),
        ("x-fencing-signature", sig),
    ];
    send(app, "POST", &format!("/v1/payouts/{payout}/claim"), &headers, Some(r#"{"expectedState":"PENDING"}"#.into()))
        .await
        .0
}

/// Reads SSE frames `(event, id, data)` until `done` says enough, or the stream ends, or
/// [`STREAM_WAIT_MS_MAX`] passes.
async fn frames(
    app: &axum::Router,
    uri: &str,
    headers: &[(&str, String)],
    done: impl Fn(&[(String, String, Value)]) -> bool,
) -> (u16, Vec<(String, String, Value)>) {
    let mut b = axum::http::Request::builder().method("GET").uri(uri);
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    let resp = app.clone().oneshot(b.body(Body::empty()).expect("request")).await.expect("infallible");
    let status = resp.status().as_u16();
    let mut body = resp.into_body().into_data_stream();
    let mut text = String::new();
    let mut out: Vec<(String, String, Value)> = Vec::new();
    let deadline = dlock_rt::Duration::from_millis(STREAM_WAIT_MS_MAX);
    let _ = dlock_rt::timeout(deadline, async {
        while !done(&out) {
            let Some(Ok(chunk)) = body.next().await else { break };
            text.push_str(std::str::from_utf8(&chunk).expect("utf-8"));
            while let Some(end) = text.find("\n\n") {
                let raw: String = text.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), String::new(), Value::Null);
                for line in raw.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = v.to_owned();
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(v).expect("data is JSON");
                    }
                }
                out.push((event, id, data));
            }
        }
    })
    .await;
    (status, out)
}

fn with_cursor(mut h: Vec<(&'static str, String)>, cursor: &str) -> Vec<(&'static str, String)> {
    h.push(("last-event-id", cursor.to_owned()));
    h
}

#[tokio::test]
async fn a_snapshot_cursor_streams_every_change_after_it_in_commit_order() {
    for (name, app, _dir) in backends().await {
        let (status, page) = send(&app, "GET", "/v1/events/recent?limit=5", &reader(), None).await;
        assert_eq!(status, 200, "{name}: {page}");
        let cursor = page["cursor"].as_str().expect("cursor").to_owned();
        let from = page["seq"].as_i64().expect("seq");
        let (p1, _p2) = seed(&app).await;
        assert_eq!(claim(&app, p1, 5).await, 200, "{name}");
        let want = ["account.created", "payout.created", "payout.created", "fence.raised", "payout.state_changed"];
        let (status, got) =
            frames(&app, "/v1/events", &with_cursor(reader(), &cursor), |f| f.len() >= want.len()).await;
        assert_eq!(status, 200, "{name}");
        let kinds: Vec<&str> = got.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!(kinds, want, "{name}: {got:?}");
        let seqs: Vec<i64> = got.iter().map(|(_, _, d)| d["seq"].as_i64().expect("seq")).collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]) && seqs[0] > from, "{name}: {seqs:?} after {from}");
        for (_, id, d) in &got {
            assert!(!id.is_empty(), "{name}: every event carries its cursor");
            assert_eq!(d["eventId"], json!(format!("paydb/{}", d["seq"])), "{name}");
        }
        assert_eq!(got[3].2["data"]["presentedToken"], json!(5), "{name}: {:?}", got[3]);
        assert_eq!(got[4].2["data"]["to"], json!("CLAIMED"), "{name}");
        assert_eq!(got[1].2["data"]["beneficiaryRef"], json!("<script>alert(1)</script>"), "{name}: data as written");
        // Resuming from the third event's id sends what follows it, and only that.
        let (_, again) = frames(&app, "/v1/events", &with_cursor(reader(), &got[2].1), |f| f.len() >= 2).await;
        let again: Vec<i64> = again.iter().map(|(_, _, d)| d["seq"].as_i64().expect("seq")).collect();
        assert_eq!(again, seqs[3..].to_vec(), "{name}");
    }
}

#[tokio::test]
async fn a_cursor_of_another_caller_or_filter_a_tampered_one_or_none_gets_resync_required() {
    for (name, app, _dir) in backends().await {
        let (_, page) = send(&app, "GET", "/v1/events/recent?account=acct-1", &reader(), None).await;
        let cursor = page["cursor"].as_str().expect("cursor").to_owned();
        let operator_read = vec![("authorization", bearer(dlock_testkit::auth::OPERATOR_TOKEN))];
        let mut tampered = cursor.clone();
        tampered.insert(3, 'x');
        for (uri, headers, reason) in [
            ("/v1/events?account=acct-1", with_cursor(operator_read, &cursor), "other_subject"),
            ("/v1/events?account=acct-2", with_cursor(reader(), &cursor), "other_filter"),
            ("/v1/events?account=acct-1", with_cursor(reader(), &tampered), "invalid"),
            ("/v1/events?account=acct-1", reader(), "absent"),
        ] {
            let (status, got) = frames(&app, uri, &headers, |f| !f.is_empty()).await;
            assert_eq!(status, 200, "{name}");
            assert_eq!(got.len(), 1, "{name}: {got:?}");
            assert_eq!(got[0].0, "resync_required", "{name}");
            assert_eq!(got[0].2["reason"], json!(reason), "{name}: {uri}");
        }
        let (status, _) = send(&app, "GET", "/v1/events", &[], None).await;
        assert_eq!(status, 401, "{name}: the stream needs a credential");
        let (status, body) = send(&app, "GET", "/v1/events?colour=red", &reader(), None).await;
        assert_eq!((status, body["code"].as_str()), (400, Some("VALIDATION_FAILED")), "{name}");
    }
}

#[tokio::test]
async fn a_fenced_out_claim_is_streamed_with_the_presented_token_and_the_fence() {
    for (name, app, _dir) in backends().await {
        let (_, page) = send(&app, "GET", "/v1/events/recent?kind=fence.refused", &reader(), None).await;
        let cursor = page["cursor"].as_str().expect("cursor").to_owned();
        let (p1, p2) = seed(&app).await;
        assert_eq!(claim(&app, p1, 9).await, 200, "{name}");
        assert_eq!(claim(&app, p2, 4).await, 409, "{name}: fenced out");
        let (_, got) =
            frames(&app, "/v1/events?kind=fence.refused", &with_cursor(reader(), &cursor), |f| !f.is_empty()).await;
        assert_eq!(got.len(), 1, "{name}: {got:?}");
        let d = &got[0].2;
        assert_eq!(d["kind"], json!("fence.refused"), "{name}");
        assert_eq!(d["accountId"], json!("acct-1"), "{name}");
        assert_eq!(
            (d["data"]["presentedToken"].as_i64(), d["data"]["fence"].as_i64()),
            (Some(4), Some(9)),
            "{name}: {d}"
        );
        assert_eq!(d["data"]["operation"], json!("claim"), "{name}");
    }
}

/// A GET's status, response headers and JSON body.
async fn get_with(app: &axum::Router, uri: &str, headers: &[(&str, String)]) -> (u16, axum::http::HeaderMap, Value) {
    let mut b = axum::http::Request::builder().method("GET").uri(uri);
    for (k, v) in headers {
        b = b.header(*k, v.as_str());
    }
    let resp = app.clone().oneshot(b.body(Body::empty()).expect("request")).await.expect("infallible");
    let (status, h) = (resp.status().as_u16(), resp.headers().clone());
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, h, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

/// A snapshot's cursor and seq from its response headers, when it has them.
fn mark_of(h: &axum::http::HeaderMap) -> Option<(String, i64)> {
    let cursor = h.get("x-event-cursor")?.to_str().ok()?.to_owned();
    Some((cursor, h.get("x-event-seq")?.to_str().ok()?.parse().ok()?))
}

/// P4 and P1 are snapshots (C3-extensions E-20, "Snapshots"): asked with `Prefer:
/// event-cursor`, each answers the cursor of a watermark read before it, bound to its
/// filter (P4: the payout; P1: its `accountId`); a stream from it delivers the claim that
/// follows, above the watermark, and a stream of another filter must resync.
#[tokio::test]
async fn p1_and_p4_answer_their_event_cursor_when_asked_and_the_stream_from_it_delivers_what_follows() {
    for (name, app, _dir) in backends().await {
        let (p1, _p2) = seed(&app).await;
        // The seeded events are at or below the next head published: the claim is then
        // the first change after the snapshots.
        let published = dlock_testkit::events_published(3, || {
            let app = app.clone();
            async move { send(&app, "GET", "/v1/events/recent?account=acct-1", &reader(), None).await.1 }
        })
        .await;
        assert!(published, "{name}: the seeded events were never published");

        let (s, h, _) = get_with(&app, &format!("/v1/payouts/{p1}"), &reader()).await;
        assert_eq!((s, mark_of(&h)), (200, None), "{name}: a cursor nobody asked for");
        let mut asking = reader();
        asking.push(("prefer", "event-cursor".to_owned()));
        let (s, h, payout) = get_with(&app, &format!("/v1/payouts/{p1}"), &asking).await;
        assert_eq!((s, &payout["state"]), (200, &json!("PENDING")), "{name}: {payout}");
        let (p4_cursor, p4_mark) = mark_of(&h).expect("P4's cursor");
        let (s, h, page) = get_with(&app, "/v1/payouts?state=PENDING&accountId=acct-1", &asking).await;
        assert_eq!(s, 200, "{name}: {page}");
        assert_eq!(h.get("preference-applied").and_then(|v| v.to_str().ok()), Some("event-cursor"), "{name}");
        let (p1_cursor, p1_mark) = mark_of(&h).expect("P1's cursor");

        assert_eq!(claim(&app, p1, 5).await, 200, "{name}");
        let (_, got) =
            frames(&app, &format!("/v1/events?payout={p1}"), &with_cursor(reader(), &p4_cursor), |f| !f.is_empty())
                .await;
        assert_eq!(got.first().map(|(k, _, _)| k.as_str()), Some("payout.state_changed"), "{name}: {got:?}");
        assert_eq!(got[0].2["data"]["to"], json!("CLAIMED"), "{name}");
        assert!(got[0].2["seq"].as_i64().is_some_and(|s| s > p4_mark), "{name}: at or below {p4_mark}: {got:?}");
        let (_, got) =
            frames(&app, "/v1/events?account=acct-1", &with_cursor(reader(), &p1_cursor), |f| f.len() >= 2).await;
        let kinds: Vec<&str> = got.iter().map(|(k, _, _)| k.as_str()).collect();
        assert_eq!(kinds, ["fence.raised", "payout.state_changed"], "{name}: {got:?}");
        assert!(got.iter().all(|(_, _, d)| d["seq"].as_i64().is_some_and(|s| s > p1_mark)), "{name}: {got:?}");
        // Each cursor is its filter's.
        let (_, got) =
            frames(&app, "/v1/events?account=acct-1", &with_cursor(reader(), &p4_cursor), |f| !f.is_empty()).await;
        assert_eq!(
            got.first().map(|(k, _, d)| (k.as_str(), &d["reason"])),
            Some(("resync_required", &json!("other_filter"))),
            "{name}: {got:?}"
        );
    }
}
