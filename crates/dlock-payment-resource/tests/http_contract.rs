//! The payment-resource's HTTP contract, in process: every row and code of P1–P5 and the
//! two creates, the envelope on every refusal, byte-identical replays, and the fenced-out
//! log line and counter. The store is the simulation store (the conformance suite holds it
//! to the SQL stores); the proxy's half of paydb is driven through `RailStore`.

#![cfg(not(madsim))]

use std::io::Write;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use chrono::Utc;
use dlock_contract::CONTENT_TYPE_JSON;
use dlock_payment_resource::store_mem::MemPaydb;
use dlock_payment_resource::{router, PaymentResource, PaymentStore};
use dlock_rail_proxy::store::{Admission, Attempt, RailStore, Resolution};
use dlock_rt::Clock;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;
use uuid::Uuid;

struct Rig {
    app: axum::Router,
    paydb: Arc<MemPaydb>,
}

/// The payment-resource's settings in these tests (a small body limit), from its resolver.
fn payment_cfg() -> dlock_payment_resource::PaymentConfig {
    let public = dlock_contract::grant::testing::signer().verify_key().to_base64();
    let mut l = dlock_config::Layers::of(&[
        ("payment.resource.body-bytes-max", "4096"),
        ("payment.grants.verify-keys", public.as_str()),
    ]);
    l.set_flag("auth.credentials", dlock_testkit::auth::credentials());
    dlock_payment_resource::config::resolve(&l, dlock_config::Profile::Production).expect("settings").config
}

async fn rig() -> Rig {
    let paydb = Arc::new(MemPaydb::new());
    let pr = PaymentResource::start(paydb.clone(), payment_cfg(), Clock::system()).await.expect("start");
    Rig { app: router(pr), paydb }
}

struct Answer {
    status: u16,
    content_type: String,
    bytes: Vec<u8>,
    json: Value,
}

async fn send(app: &axum::Router, method: &str, uri: &str, headers: &[(&str, &str)], body: Option<&str>) -> Answer {
    let mut b = axum::http::Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b.body(Body::from(body.unwrap_or("").to_owned())).expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_owned();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes().to_vec();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Answer { status, content_type, bytes, json }
}

fn write_headers<'a>(owner: &'a str, key: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![("content-type", "application/json"), ("x-owner-id", owner), ("x-idempotency-key", key)]
}

/// A fenced write's headers, with the test key's signature of a grant of `payout:acct-1`
/// (every payout here is acct-1's) when the token is a number.
fn fenced_headers<'a>(token: &'a str, owner: &'a str, key: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut h = write_headers(owner, key);
    h.push(("x-fencing-token", token));
    if let Ok(t) = token.parse::<i64>() {
        // Leaked: a few bytes per request of a test process.
        let sig: &'static str =
            Box::leak(dlock_contract::grant::testing::sign_payout("acct-1", t, owner).into_boxed_str());
        h.push(("x-fencing-signature", sig));
    }
    h
}

fn assert_envelope(a: &Answer, status: u16, code: &str) {
    assert_eq!(a.status, status, "{}", a.json);
    assert_eq!(a.content_type, CONTENT_TYPE_JSON);
    assert_eq!(a.json["code"], code, "{}", a.json);
    assert!(a.json["message"].is_string() && a.json["retrySafe"].is_boolean(), "{}", a.json);
    assert_eq!(a.json["traceId"].as_str().map(str::len), Some(32), "{}", a.json);
}

async fn create_account(app: &axum::Router, id: &str, opening: i64) -> Answer {
    let body = json!({"accountId": id, "currency": "EUR", "openingBalanceMinor": opening}).to_string();
    let key = format!("acct:{id}");
    send(app, "POST", "/v1/accounts", &write_headers("ops", &key), Some(&body)).await
}

/// Waits (polling, at most a second) until the wall clock has left the current millisecond:
/// a P1 walk lists rows created before its first page's millisecond.
async fn let_the_millisecond_pass() {
    let created_by = Utc::now().timestamp_millis();
    let passed =
        dlock_rt::wait_until(dlock_rt::Duration::from_millis(1), dlock_rt::Duration::from_millis(1_000), || async {
            (Utc::now().timestamp_millis() > created_by).then_some(())
        })
        .await;
    assert!(passed.is_some(), "the clock did not pass {created_by} ms");
}

async fn create_payout(app: &axum::Router, account: &str, amount: i64) -> Uuid {
    let id = Uuid::new_v4();
    let body = json!({"payoutId": id, "accountId": account, "amountMinor": amount, "currency": "EUR",
        "beneficiaryRef": "bene-1"})
    .to_string();
    let a = send(app, "POST", "/v1/payouts", &write_headers("ops", &format!("create:{id}")), Some(&body)).await;
    assert_eq!(a.status, 201, "{}", a.json);
    id
}

async fn claim(app: &axum::Router, payout: Uuid, token: i64, expected: &str) -> Answer {
    let t = token.to_string();
    let key = format!("payout:{payout}");
    let body = json!({"expectedState": expected}).to_string();
    send(app, "POST", &format!("/v1/payouts/{payout}/claim"), &fenced_headers(&t, "w-1", &key), Some(&body)).await
}

async fn post(app: &axum::Router, payout: Uuid, token: i64, submission: Uuid, reference: &str) -> Answer {
    let t = token.to_string();
    let key = format!("payout:{payout}");
    let body = json!({"railReference": reference, "submissionId": submission, "railOutcome": "ACKED"}).to_string();
    send(app, "POST", &format!("/v1/payouts/{payout}/post"), &fenced_headers(&t, "w-1", &key), Some(&body)).await
}

/// Drives the proxy's half: CLAIMED → SUBMITTED → `resolution`. Returns the submission id.
async fn through_rail(paydb: &MemPaydb, payout: Uuid, account: &str, token: i64, resolution: Resolution) -> Uuid {
    let submission_id = Uuid::new_v4();
    let at = dlock_contract::time::truncate_ms(Utc::now());
    let attempt = Attempt {
        submission_id,
        payout_id: payout,
        account_id: account.into(),
        presented_token: token,
        owner_id: "w-1".into(),
        idempotency_key: format!("payout:{payout}"),
        amount_minor: 0,
        currency: "EUR".into(),
        at,
        fencing_enabled: true,
    };
    let admitted = RailStore::admit(paydb, &attempt).await.expect("admit");
    assert!(matches!(admitted, Admission::Admitted { .. }), "{admitted:?}");
    RailStore::resolve(paydb, submission_id, &resolution, at).await.expect("resolve");
    submission_id
}

#[tokio::test]
async fn creates_require_owner_and_key_and_answer_201() {
    let r = rig().await;
    let body = json!({"accountId": "acct-1", "currency": "EUR", "openingBalanceMinor": 10_000}).to_string();
    let no_owner = send(
        &r.app,
        "POST",
        "/v1/accounts",
        &[("content-type", "application/json"), ("x-idempotency-key", "k")],
        Some(&body),
    )
    .await;
    assert_envelope(&no_owner, 400, "VALIDATION_FAILED");
    let no_key = send(
        &r.app,
        "POST",
        "/v1/accounts",
        &[("content-type", "application/json"), ("x-owner-id", "ops")],
        Some(&body),
    )
    .await;
    assert_envelope(&no_key, 400, "VALIDATION_FAILED");

    let created = send(&r.app, "POST", "/v1/accounts", &write_headers("ops", "k"), Some(&body)).await;
    assert_eq!(created.status, 201, "{}", created.json);
    assert_eq!(created.content_type, CONTENT_TYPE_JSON);
    assert_eq!(created.json["accountId"], "acct-1");
    assert_eq!(created.json["balanceMinor"], 10_000);
    assert_eq!(created.json["ledgerSumMinor"], 10_000);
    assert_eq!(created.json["fence"], 0);

    let again = create_account(&r.app, "acct-1", 5).await;
    assert_envelope(&again, 400, "VALIDATION_FAILED");
    assert_eq!(again.json["details"]["fields"][0]["field"], "accountId");

    let bad = send(
        &r.app,
        "POST",
        "/v1/accounts",
        &write_headers("ops", "k2"),
        Some(r#"{"accountId":"has space","currency":"EUR","openingBalanceMinor":-1}"#),
    )
    .await;
    assert_envelope(&bad, 400, "VALIDATION_FAILED");
    let fields: Vec<&str> =
        bad.json["details"]["fields"].as_array().expect("fields").iter().filter_map(|f| f["field"].as_str()).collect();
    assert!(fields.contains(&"accountId") && fields.contains(&"openingBalanceMinor"), "{fields:?}");

    // Payouts: 201 in PENDING, with a generated id when none is given.
    let body = json!({"accountId": "acct-1", "amountMinor": 700, "currency": "EUR", "beneficiaryRef": "b"}).to_string();
    let p = send(&r.app, "POST", "/v1/payouts", &write_headers("ops", "p-1"), Some(&body)).await;
    assert_eq!(p.status, 201, "{}", p.json);
    assert_eq!(p.json["state"], "PENDING");
    assert_eq!(p.json["attemptCount"], 0);
    assert!(Uuid::parse_str(p.json["payoutId"].as_str().unwrap_or("")).is_ok(), "{}", p.json);
    // The same request again is the same payout (the generated id is part of the record).
    let replay = send(&r.app, "POST", "/v1/payouts", &write_headers("ops", "p-1"), Some(&body)).await;
    assert_eq!(replay.bytes, p.bytes);

    let unknown =
        json!({"accountId": "nobody", "amountMinor": 1, "currency": "EUR", "beneficiaryRef": "b"}).to_string();
    let a = send(&r.app, "POST", "/v1/payouts", &write_headers("ops", "p-2"), Some(&unknown)).await;
    assert_envelope(&a, 400, "VALIDATION_FAILED");
    assert_eq!(a.json["details"]["fields"][0]["field"], "accountId");
    let usd = json!({"accountId": "acct-1", "amountMinor": 1, "currency": "USD", "beneficiaryRef": "b"}).to_string();
    let a = send(&r.app, "POST", "/v1/payouts", &write_headers("ops", "p-3"), Some(&usd)).await;
    assert_envelope(&a, 400, "VALIDATION_FAILED");
    assert_eq!(a.json["details"]["fields"][0]["field"], "currency");
}

#[tokio::test]
async fn p2_claim_answers_every_c3_code() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p = create_payout(&r.app, "acct-1", 600).await;

    // 400 INVALID_TOKEN: absent, zero, non-numeric, overflowing.
    for token in [None, Some("0"), Some("abc"), Some("9223372036854775808")] {
        let mut h = write_headers("w-1", "k");
        if let Some(t) = token {
            h.push(("x-fencing-token", t));
        }
        let a =
            send(&r.app, "POST", &format!("/v1/payouts/{p}/claim"), &h, Some(r#"{"expectedState":"PENDING"}"#)).await;
        assert_envelope(&a, 400, "INVALID_TOKEN");
    }
    // 400 VALIDATION_FAILED: a path that is no uuid, an expectedState a claim cannot name.
    let a = send(&r.app, "POST", "/v1/payouts/nope/claim", &fenced_headers("5", "w-1", "k"), Some("{}")).await;
    assert_envelope(&a, 400, "VALIDATION_FAILED");
    let a = claim(&r.app, p, 5, "POSTED").await;
    assert_envelope(&a, 400, "VALIDATION_FAILED");
    assert_eq!(a.json["details"]["fields"][0]["field"], "expectedState");
    // 404.
    let a = claim(&r.app, Uuid::new_v4(), 5, "PENDING").await;
    assert_envelope(&a, 404, "NOT_FOUND");

    // 200.
    let ok = claim(&r.app, p, 5, "PENDING").await;
    assert_eq!(ok.status, 200, "{}", ok.json);
    assert_eq!(
        ok.json,
        json!({"payoutId": p, "state": "CLAIMED", "claimToken": 5, "accountFence": 5, "attemptCount": 0,
            "idempotencyKey": format!("payout:{p}"), "accountId": "acct-1", "amountMinor": 600, "currency": "EUR",
            "beneficiaryRef": "bene-1"})
    );
    // 409 FENCED_OUT: an equal token (under another key, so the ledger does not replay) and a lower one.
    for (token, key) in [("5", "other-key"), ("4", "payout:x")] {
        let a = send(
            &r.app,
            "POST",
            &format!("/v1/payouts/{p}/claim"),
            &fenced_headers(token, "w-2", key),
            Some(r#"{"expectedState":"CLAIMED"}"#),
        )
        .await;
        assert_envelope(&a, 409, "FENCED_OUT");
        assert_eq!(a.json["retrySafe"], false);
        let d = &a.json["details"];
        assert_eq!(d["presentedToken"], token.parse::<i64>().expect("int"));
        assert_eq!(d["highestToken"], 5);
        assert_eq!(d["resourceType"], "account");
        assert_eq!(d["resourceId"], "acct-1");
        assert_eq!(d["ownerId"], "w-2");
        assert_eq!(d["payoutId"], p.to_string());
    }
    // 409 PAYOUT_NOT_CLAIMABLE: expected PENDING, it is CLAIMED; the fence does not move.
    let a = claim(&r.app, p, 9, "PENDING").await;
    assert_envelope(&a, 409, "PAYOUT_NOT_CLAIMABLE");
    assert_eq!(a.json["details"]["state"], "CLAIMED");
    let acct = send(&r.app, "GET", "/v1/accounts/acct-1", &[], None).await;
    assert_eq!(acct.json["fence"], 5);
    // Recovery re-claim by a newer holder.
    let re = claim(&r.app, p, 9, "CLAIMED").await;
    assert_eq!(re.status, 200, "{}", re.json);
    assert_eq!(re.json["accountFence"], 9);

    // 422 INSUFFICIENT_FUNDS: 600 is reserved of 1 000, a second payout of 500 does not fit.
    let q = create_payout(&r.app, "acct-1", 500).await;
    let a = claim(&r.app, q, 10, "PENDING").await;
    assert_envelope(&a, 422, "INSUFFICIENT_FUNDS");
    assert_eq!(
        a.json["details"],
        json!({"payoutId": q, "accountId": "acct-1", "amountMinor": 500, "availableMinor": 400, "state": "FAILED"})
    );
    let view = send(&r.app, "GET", &format!("/v1/payouts/{q}"), &[], None).await;
    assert_eq!(view.json["state"], "FAILED");
    // The 422 was recorded: the same request replays it byte for byte, trace id included.
    let replay = claim(&r.app, q, 10, "PENDING").await;
    assert_eq!(replay.status, 422);
    assert_eq!(replay.bytes, a.bytes);
}

#[tokio::test]
async fn p3_post_answers_every_c3_code() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p = create_payout(&r.app, "acct-1", 600).await;
    assert_eq!(claim(&r.app, p, 5, "PENDING").await.status, 200);

    // Not yet RAIL_ACKED: 409 PAYOUT_NOT_CLAIMABLE.
    let a = post(&r.app, p, 6, Uuid::new_v4(), "ref-1").await;
    assert_envelope(&a, 409, "PAYOUT_NOT_CLAIMABLE");
    assert_eq!(a.json["details"]["state"], "CLAIMED");

    let submission = through_rail(&r.paydb, p, "acct-1", 5, Resolution::Acked { rail_reference: "ref-1".into() }).await;
    // 400: the body must name the acknowledged attempt.
    let a = post(&r.app, p, 6, Uuid::new_v4(), "ref-1").await;
    assert_envelope(&a, 400, "VALIDATION_FAILED");
    let a = post(&r.app, p, 6, submission, "ref-other").await;
    assert_envelope(&a, 400, "VALIDATION_FAILED");
    let a = send(
        &r.app,
        "POST",
        &format!("/v1/payouts/{p}/post"),
        &fenced_headers("6", "w-1", "k"),
        Some(&json!({"railReference": "ref-1", "submissionId": submission, "railOutcome": "REJECTED"}).to_string()),
    )
    .await;
    assert_envelope(&a, 400, "VALIDATION_FAILED");
    assert_eq!(a.json["details"]["fields"][0]["field"], "railOutcome");
    // 400 INVALID_TOKEN.
    let a = send(&r.app, "POST", &format!("/v1/payouts/{p}/post"), &fenced_headers("-3", "w-1", "k"), Some("{}")).await;
    assert_envelope(&a, 400, "INVALID_TOKEN");
    // 409 FENCED_OUT with the claim's own token (equal) or a lower one: a ledger write.
    for token in [5, 2] {
        let a = post(&r.app, p, token, submission, "ref-1").await;
        assert_envelope(&a, 409, "FENCED_OUT");
        let d = &a.json["details"];
        assert_eq!(d["presentedToken"], token);
        assert_eq!(d["highestToken"], 5);
        assert_eq!(d["resourceType"], "ledger");
        assert_eq!(d["resourceId"], p.to_string());
        assert_eq!(d["ownerId"], "w-1");
    }
    // 200: two balanced entries, both carrying the fence; the balance after.
    let ok = post(&r.app, p, 6, submission, "ref-1").await;
    assert_eq!(ok.status, 200, "{}", ok.json);
    assert_eq!(ok.json["state"], "POSTED");
    assert_eq!(ok.json["balanceMinor"], 400);
    let entries = ok.json["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0]["direction"], "DEBIT");
    assert_eq!(entries[0]["accountId"], "acct-1");
    assert_eq!(entries[1]["direction"], "CREDIT");
    for e in entries {
        assert_eq!(e["amountMinor"], 600);
        assert_eq!(e["fence"], 6);
    }
    // A newer token on a POSTED payout: not claimable, nothing written.
    let a = post(&r.app, p, 7, submission, "ref-1").await;
    assert_envelope(&a, 409, "PAYOUT_NOT_CLAIMABLE");
    assert_eq!(a.json["details"]["state"], "POSTED");
    let acct = send(&r.app, "GET", "/v1/accounts/acct-1", &[], None).await;
    assert_eq!(acct.json["balanceMinor"], 400);
    assert_eq!(acct.json["ledgerSumMinor"], 400);
    assert_eq!(acct.json["fence"], 6);
    // 404.
    let a = post(&r.app, Uuid::new_v4(), 8, submission, "ref-1").await;
    assert_envelope(&a, 404, "NOT_FOUND");
}

#[tokio::test]
async fn p4_payout_is_advisory_with_submissions_and_404() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p = create_payout(&r.app, "acct-1", 100).await;
    claim(&r.app, p, 3, "PENDING").await;
    let s = through_rail(&r.paydb, p, "acct-1", 3, Resolution::Acked { rail_reference: "ref-9".into() }).await;
    let a = send(&r.app, "GET", &format!("/v1/payouts/{p}"), &[], None).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["payoutId"], p.to_string());
    assert_eq!(a.json["state"], "RAIL_ACKED");
    assert_eq!(a.json["attemptCount"], 1);
    assert_eq!(a.json["claimToken"], 3);
    assert_eq!(a.json["claimedBy"], "w-1");
    assert_eq!(a.json["beneficiaryRef"], "bene-1");
    let subs = a.json["submissions"].as_array().expect("submissions");
    assert_eq!(subs.len(), 1);
    assert_eq!(subs[0]["submissionId"], s.to_string());
    assert_eq!(subs[0]["presentedToken"], 3);
    assert_eq!(subs[0]["outcome"], "ACKED");
    assert_eq!(subs[0]["railReference"], "ref-9");
    let missing = send(&r.app, "GET", &format!("/v1/payouts/{}", Uuid::new_v4()), &[], None).await;
    assert_envelope(&missing, 404, "NOT_FOUND");
    let bad = send(&r.app, "GET", "/v1/payouts/not-a-uuid", &[], None).await;
    assert_envelope(&bad, 400, "VALIDATION_FAILED");
}

#[tokio::test]
async fn p5_account_reports_the_ledger_sum_and_404() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 2_500).await;
    let p = create_payout(&r.app, "acct-1", 1_000).await;
    claim(&r.app, p, 4, "PENDING").await;
    let a = send(&r.app, "GET", "/v1/accounts/acct-1", &[], None).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!(a.json["accountId"], "acct-1");
    assert_eq!(a.json["currency"], "EUR");
    assert_eq!(a.json["balanceMinor"], 2_500);
    assert_eq!(a.json["ledgerSumMinor"], 2_500);
    assert_eq!(a.json["availableMinor"], 1_500);
    assert_eq!(a.json["fence"], 4);
    assert!(a.json["updatedAt"].as_str().is_some_and(|t| t.ends_with('Z')), "{}", a.json);
    let missing = send(&r.app, "GET", "/v1/accounts/nobody", &[], None).await;
    assert_envelope(&missing, 404, "NOT_FOUND");
    let bad = send(&r.app, "GET", "/v1/accounts/a%20b", &[], None).await;
    assert_envelope(&bad, 400, "VALIDATION_FAILED");
}

/// A payout created through a replica whose clock runs a minute ahead is in the PENDING work
/// queue of a replica on the right time at once, not a minute later, and a walk over pages
/// lists it once, after the others. (Found by the simulation: seed 971584 stepped a
/// payment-resource's wall clock 116 s ahead while payouts were created and back at the heal;
/// every scan then missed them for 116 s.)
#[tokio::test]
async fn p1_lists_a_payout_stamped_by_a_clock_ahead_of_its_own() {
    let r = rig().await;
    let ahead =
        PaymentResource::start(r.paydb.clone(), payment_cfg(), Clock::with_skew_ms(60_000)).await.expect("start");
    let ahead = router(ahead);
    create_account(&r.app, "acct-1", 10_000).await;
    let mut created = Vec::new();
    for _ in 0..3 {
        created.push(create_payout(&r.app, "acct-1", 10).await);
    }
    let future = create_payout(&ahead, "acct-1", 10).await;
    // Let this clock pass the last on-time creation (bounded; at most a millisecond).
    let_the_millisecond_pass().await;
    let page = send(&r.app, "GET", "/v1/payouts?state=PENDING&limit=10", &[], None).await;
    assert_eq!(page.status, 200, "{}", page.json);
    let ids = |page: &Answer| -> Vec<Uuid> {
        page.json["items"]
            .as_array()
            .expect("items")
            .iter()
            .map(|i| Uuid::parse_str(i["payoutId"].as_str().expect("id")).expect("uuid"))
            .collect()
    };
    // On-time payouts of one millisecond come in payout id order: compare them as a set.
    let listed = ids(&page);
    assert_eq!(listed.last(), Some(&future), "the payout stamped ahead is listed, last: {listed:?}");
    let mut on_time = listed[..listed.len() - 1].to_vec();
    on_time.sort();
    created.sort();
    assert_eq!(on_time, created);
    // Two at a time: every payout once, the one ahead included.
    let mut walked = Vec::new();
    let mut uri = "/v1/payouts?state=PENDING&limit=2".to_owned();
    for _ in 0..4 {
        let page = send(&r.app, "GET", &uri, &[], None).await;
        assert_eq!(page.status, 200, "{}", page.json);
        walked.extend(ids(&page));
        match page.json["nextCursor"].as_str() {
            Some(c) => uri = format!("/v1/payouts?state=PENDING&limit=2&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(walked, listed, "the walk lists every payout once, in the first page's order");
}

#[tokio::test]
async fn p1_lists_pages_and_refuses_bad_queries_and_cursors() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 10_000).await;
    create_account(&r.app, "acct-2", 10_000).await;
    let mut mine = Vec::new();
    for i in 0..7 {
        mine.push(create_payout(&r.app, if i % 2 == 0 { "acct-1" } else { "acct-2" }, 10).await);
    }
    // A walk lists rows created before its first page's millisecond: let the clock pass
    // the last creation (bounded; at most a millisecond).
    let_the_millisecond_pass().await;
    // Walk PENDING two at a time: every payout once, in creation order.
    let mut seen = Vec::new();
    let mut uri = "/v1/payouts?state=PENDING&limit=2".to_owned();
    for _ in 0..10 {
        let page = send(&r.app, "GET", &uri, &[], None).await;
        assert_eq!(page.status, 200, "{}", page.json);
        for item in page.json["items"].as_array().expect("items") {
            assert_eq!(item["state"], "PENDING");
            for field in ["payoutId", "accountId", "amountMinor", "currency", "attemptCount", "createdAt"] {
                assert!(!item[field].is_null(), "{field} in {item}");
            }
            seen.push(Uuid::parse_str(item["payoutId"].as_str().expect("id")).expect("uuid"));
        }
        match page.json["nextCursor"].as_str() {
            Some(c) => {
                // A payout created mid-walk is after the snapshot: it does not appear.
                if seen.len() == 2 {
                    create_payout(&r.app, "acct-1", 10).await;
                }
                uri = format!("/v1/payouts?state=PENDING&limit=2&cursor={c}");
            }
            None => break,
        }
    }
    let mut sorted = seen.clone();
    sorted.dedup();
    assert_eq!(seen.len(), 7, "{seen:?}");
    assert_eq!(sorted.len(), 7);
    let expected: std::collections::BTreeSet<Uuid> = mine.iter().copied().collect();
    assert_eq!(seen.iter().copied().collect::<std::collections::BTreeSet<_>>(), expected);

    // The account filter.
    let page = send(&r.app, "GET", "/v1/payouts?state=PENDING&accountId=acct-2", &[], None).await;
    assert!(page.json["items"].as_array().expect("items").iter().all(|i| i["accountId"] == "acct-2"));
    assert_eq!(page.json["items"].as_array().map(Vec::len), Some(3));

    // Refusals: 400 VALIDATION_FAILED naming the parameter.
    let first = send(&r.app, "GET", "/v1/payouts?state=PENDING&limit=1", &[], None).await;
    let cursor = first.json["nextCursor"].as_str().expect("cursor").to_owned();
    let mut tampered = cursor.clone().into_bytes();
    tampered[3] = if tampered[3] == b'A' { b'B' } else { b'A' };
    let tampered = String::from_utf8(tampered).expect("ascii");
    let cases: Vec<(String, &str)> = vec![
        ("/v1/payouts".into(), "state"),
        ("/v1/payouts?state=NOPE".into(), "state"),
        ("/v1/payouts?state=PENDING&limit=0".into(), "limit"),
        ("/v1/payouts?state=PENDING&limit=501".into(), "limit"),
        ("/v1/payouts?state=PENDING&limit=ten".into(), "limit"),
        ("/v1/payouts?state=PENDING&accountId=a%20b".into(), "accountId"),
        ("/v1/payouts?state=PENDING&status=x".into(), "status"),
        (format!("/v1/payouts?state=PENDING&cursor={tampered}"), "cursor"),
        ("/v1/payouts?state=PENDING&cursor=garbage".into(), "cursor"),
        (format!("/v1/payouts?state=CLAIMED&cursor={cursor}"), "cursor"),
        (format!("/v1/payouts?state=PENDING&accountId=acct-1&cursor={cursor}"), "cursor"),
    ];
    for (uri, field) in cases {
        let a = send(&r.app, "GET", &uri, &[], None).await;
        assert_envelope(&a, 400, "VALIDATION_FAILED");
        assert_eq!(a.json["details"]["fields"][0]["field"], field, "{uri}: {}", a.json);
    }
    // A cursor from another deployment (another key) is refused too.
    let other = rig().await;
    create_account(&other.app, "acct-1", 10).await;
    let a = send(&other.app, "GET", &format!("/v1/payouts?state=PENDING&cursor={cursor}"), &[], None).await;
    assert_envelope(&a, 400, "VALIDATION_FAILED");
    assert!(a.json["details"]["fields"][0]["problem"].as_str().is_some_and(|p| p.contains("not a cursor")));
}

#[tokio::test]
async fn payment_refusals_are_the_envelope() {
    let r = rig().await;
    let cases = [
        send(&r.app, "GET", "/v1/nope", &[], None).await,
        send(&r.app, "DELETE", "/v1/payouts", &[], None).await,
        send(&r.app, "POST", "/v1/accounts", &[("x-owner-id", "o"), ("x-idempotency-key", "k")], Some("{}")).await,
        send(&r.app, "POST", "/v1/accounts", &write_headers("o", "k"), Some("{not json")).await,
        send(&r.app, "POST", "/v1/accounts", &write_headers("o", "k"), Some(&"x".repeat(5_000))).await,
    ];
    let expected = [
        (404, "NOT_FOUND"),
        (405, "METHOD_NOT_ALLOWED"),
        (415, "UNSUPPORTED_MEDIA_TYPE"),
        (400, "VALIDATION_FAILED"),
        (413, "PAYLOAD_TOO_LARGE"),
    ];
    for (a, (status, code)) in cases.iter().zip(expected) {
        assert_envelope(a, status, code);
    }
    // Nothing was written by any of them.
    assert_eq!(PaymentStore::idempotency_record_count(&*r.paydb).await.expect("count"), 0);
}

#[tokio::test]
async fn key_order_and_whitespace_are_not_a_change_but_a_field_is() {
    let r = rig().await;
    let first = send(
        &r.app,
        "POST",
        "/v1/accounts",
        &write_headers("ops", "same-key"),
        Some(r#"{"accountId":"acct-1","currency":"EUR","openingBalanceMinor":100}"#),
    )
    .await;
    assert_eq!(first.status, 201);
    let reordered = send(
        &r.app,
        "POST",
        "/v1/accounts",
        &write_headers("ops", "same-key"),
        Some("{ \"openingBalanceMinor\" : 100,\n  \"currency\":\"EUR\", \"accountId\":\"acct-1\" }"),
    )
    .await;
    assert_eq!(reordered.status, 201);
    assert_eq!(reordered.bytes, first.bytes, "a reordered, re-spaced body is the same request");
    let changed = send(
        &r.app,
        "POST",
        "/v1/accounts",
        &write_headers("ops", "same-key"),
        Some(r#"{"accountId":"acct-1","currency":"EUR","openingBalanceMinor":101}"#),
    )
    .await;
    assert_envelope(&changed, 422, "IDEMPOTENCY_CONFLICT");
    assert_eq!(changed.json["details"]["operation"], "CREATE_ACCOUNT");
    let acct = send(&r.app, "GET", "/v1/accounts/acct-1", &[], None).await;
    assert_eq!(acct.json["balanceMinor"], 100, "the conflicting request had no effect");
}

/// Collects formatted log lines for the assertions below.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().map_err(|_| std::io::Error::other("poisoned"))?.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn fenced_out_is_logged_and_counted_with_both_tokens() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt().json().with_writer(move || sink.clone()).finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p = create_payout(&r.app, "acct-1", 100).await;
    assert_eq!(claim(&r.app, p, 8, "PENDING").await.status, 200);
    let stale = send(
        &r.app,
        "POST",
        &format!("/v1/payouts/{p}/claim"),
        &fenced_headers("7", "zombie", "payout:z"),
        Some(r#"{"expectedState":"CLAIMED"}"#),
    )
    .await;
    assert_envelope(&stale, 409, "FENCED_OUT");

    let text = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf8");
    let line = text.lines().find(|l| l.contains("\"fenced_out\"")).expect("a fenced_out log line");
    let v: Value = serde_json::from_str(line).expect("json log line");
    let f = &v["fields"];
    assert_eq!(v["level"], "WARN");
    assert_eq!(f["presentedToken"], 7);
    assert_eq!(f["highestToken"], 8);
    assert_eq!(f["resource"], "account");
    assert_eq!(f["resourceId"], "acct-1");
    assert_eq!(f["ownerId"], "zombie");
    assert_eq!(f["traceId"], stale.json["traceId"]);

    let m = send(&r.app, "GET", "/metrics", &[], None).await;
    let text = String::from_utf8(m.bytes).expect("utf8");
    assert!(text.contains("lock_fenced_out_total{resource=\"account\"} 1"), "{text}");
    assert!(text.contains("lock_fenced_out_total{resource=\"ledger\"} 0"), "{text}");
    assert!(text.contains("payout_claim_total{outcome=\"fenced\"} 1"), "{text}");
}

#[tokio::test]
async fn payment_metrics_expose_only_pinned_tag_values() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p = create_payout(&r.app, "acct-1", 100).await;
    claim(&r.app, p, 1, "PENDING").await;
    claim(&r.app, p, 1, "PENDING").await;
    let m = send(&r.app, "GET", "/metrics", &[], None).await;
    let text = String::from_utf8(m.bytes).expect("utf8");
    for series in [
        "lock_fenced_out_total{resource=\"rail\"} 0",
        "payout_claim_total{outcome=\"claimed\"} 1",
        "payout_claim_total{outcome=\"insufficient_funds\"} 0",
        "payout_post_total{outcome=\"posted\"} 0",
        "idempotency_request_total{outcome=\"replayed\"} 1",
        "idempotency_purged_total 0",
        "payout_backlog_age_seconds 0",
    ] {
        assert!(text.contains(series), "{series} missing from\n{text}");
    }
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        assert!(!line.contains(&p.to_string()) && !line.contains("acct-1"), "an id leaked into a tag: {line}");
    }
}

#[tokio::test]
async fn the_grant_check_reads_only_the_payouts_account_once_per_fenced_write() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p = create_payout(&r.app, "acct-1", 100).await;
    assert_eq!(claim(&r.app, p, 1, "PENDING").await.status, 200);
    let submission = through_rail(&r.paydb, p, "acct-1", 1, Resolution::Acked { rail_reference: "RR-1".into() }).await;
    assert_eq!(post(&r.app, p, 2, submission, "RR-1").await.status, 200);
    let m = send(&r.app, "GET", "/metrics", &[], None).await;
    let text = String::from_utf8(m.bytes).expect("utf8");
    for series in
        ["payout_store_op_seconds_count{op=\"payout_account\"} 2", "payout_store_op_seconds_count{op=\"payout\"} 0"]
    {
        assert!(text.contains(series), "{series} missing from\n{text}");
    }
}

#[tokio::test]
async fn each_injected_store_fault_of_a_claim_maps_to_its_code_and_retry_safety() {
    use dlock_payment_resource::store::StoreFault;
    use dlock_payment_resource::store_fault::FaultyPaymentStore;
    // (class, status, code, retrySafe, the claim committed)
    let cases = [
        (StoreFault::Unavailable, 503, "NOT_READY", true, false),
        (StoreFault::CommitUnknown, 500, "INTERNAL", false, true),
        (StoreFault::Corrupt, 500, "INTERNAL", false, false),
    ];
    for (fault, status, code, retry_safe, committed) in cases {
        let paydb = Arc::new(MemPaydb::new());
        let faulty = Arc::new(FaultyPaymentStore::new(paydb.clone()));
        let app = router(PaymentResource::start(faulty.clone(), payment_cfg(), Clock::system()).await.expect("start"));
        assert_eq!(create_account(&app, "acct-1", 10_000).await.status, 201);
        let p = create_payout(&app, "acct-1", 500).await;
        faulty.faults.inject("claim", fault);
        let a = claim(&app, p, 7, "PENDING").await;
        assert_envelope(&a, status, code);
        assert_eq!(a.json["retrySafe"], retry_safe, "{fault:?}: {}", a.json);
        let state = PaymentStore::payout(&*paydb, p).await.expect("read").expect("exists").state;
        let want = if committed { "CLAIMED" } else { "PENDING" };
        assert_eq!(state.as_str(), want, "{fault:?}");
        // The same request again: a lost answer replays the committed claim; after a
        // refusal it runs afresh. Either way it now answers 200.
        let again = claim(&app, p, 7, "PENDING").await;
        assert_eq!(again.status, 200, "{fault:?}: {}", again.json);
    }
}

// ---------------------------------------------------------------------------------------
// P2b, P3b: batches (C3-extensions E-19)
// ---------------------------------------------------------------------------------------

/// The trace every batch test sends (so that envelopes can be compared byte for byte).
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// A fenced write's headers under the test trace, signed for a grant of `payout:{account}`.
fn account_headers<'a>(account: &str, token: &'a str, owner: &'a str, key: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut h = write_headers(owner, key);
    h.push(("x-fencing-token", token));
    h.push(("traceparent", TRACEPARENT));
    if let Ok(t) = token.parse::<i64>() {
        let sig: &'static str =
            Box::leak(dlock_contract::grant::testing::sign_payout(account, t, owner).into_boxed_str());
        h.push(("x-fencing-signature", sig));
    }
    h
}

async fn claim_batch(app: &axum::Router, account: &str, token: i64, key: &str, payouts: &[(Uuid, &str)]) -> Answer {
    let items: Vec<Value> = payouts.iter().map(|(p, e)| json!({"payoutId": p, "expectedState": e})).collect();
    let body = json!({ "payouts": items }).to_string();
    let t = token.to_string();
    let uri = format!("/v1/accounts/{account}/claims");
    send(app, "POST", &uri, &account_headers(account, &t, "w-1", key), Some(&body)).await
}

async fn post_batch(
    app: &axum::Router,
    account: &str,
    token: i64,
    key: &str,
    payouts: &[(Uuid, Uuid, &str)],
) -> Answer {
    let items: Vec<Value> = payouts
        .iter()
        .map(|(p, s, r)| json!({"payoutId": p, "submissionId": s, "railReference": r, "railOutcome": "ACKED"}))
        .collect();
    let body = json!({ "payouts": items }).to_string();
    let t = token.to_string();
    let uri = format!("/v1/accounts/{account}/posts");
    send(app, "POST", &uri, &account_headers(account, &t, "w-1", key), Some(&body)).await
}

/// P2 and P3 of one payout under the test trace, with the given key.
async fn single(app: &axum::Router, path: &str, token: i64, key: &str, body: Value) -> Answer {
    let t = token.to_string();
    send(app, "POST", path, &account_headers("acct-1", &t, "w-1", key), Some(&body.to_string())).await
}

async fn create_payout_as(app: &axum::Router, id: Uuid, account: &str, amount: i64) {
    let body = json!({"payoutId": id, "accountId": account, "amountMinor": amount, "currency": "EUR",
        "beneficiaryRef": "bene-1"})
    .to_string();
    let a = send(app, "POST", "/v1/payouts", &write_headers("ops", &format!("create:{id}")), Some(&body)).await;
    assert_eq!(a.status, 201, "{}", a.json);
}

/// Each item of a batch's answer: its status and its body's bytes as they are on the wire.
fn raw_items(a: &Answer) -> Vec<(u16, String)> {
    #[derive(serde::Deserialize)]
    struct Item {
        status: u16,
        body: Box<serde_json::value::RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Batch {
        items: Vec<Item>,
    }
    let b: Batch = serde_json::from_slice(&a.bytes).expect("a batch answer");
    b.items.into_iter().map(|i| (i.status, i.body.get().to_owned())).collect()
}

/// A body with every `entryId` blanked (fresh per request).
fn without_entry_ids(mut v: Value) -> Value {
    if let Some(entries) = v.get_mut("entries").and_then(Value::as_array_mut) {
        for e in entries {
            e["entryId"] = Value::Null;
        }
    }
    v
}

#[tokio::test]
async fn p2b_answers_each_payout_exactly_as_p2_would_in_the_same_situation() {
    let (p1, p2, p3, missing) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    // 1 000 on the account: p1 (600) fits, p2 (500) then does not, p3 is already CLAIMED.
    let setup = || async {
        let r = rig().await;
        create_account(&r.app, "acct-1", 1_000).await;
        create_payout_as(&r.app, p1, "acct-1", 600).await;
        create_payout_as(&r.app, p2, "acct-1", 500).await;
        create_payout_as(&r.app, p3, "acct-1", 100).await;
        assert_eq!(claim(&r.app, p3, 2, "PENDING").await.status, 200);
        r
    };
    let items = [(p1, "PENDING"), (p2, "PENDING"), (p3, "PENDING"), (missing, "PENDING")];
    let r = setup().await;
    let batch = claim_batch(&r.app, "acct-1", 5, "k-batch", &items).await;
    assert_eq!(batch.status, 200, "{}", batch.json);
    assert_eq!(batch.content_type, CONTENT_TYPE_JSON);
    let answer: dlock_contract::batch::BatchAnswer = serde_json::from_slice(&batch.bytes).expect("BatchAnswer");
    assert_eq!((answer.account_id.as_str(), answer.presented_token), ("acct-1", 5));
    assert_eq!(answer.items.iter().map(|i| i.payout_id).collect::<Vec<_>>(), vec![p1, p2, p3, missing]);
    assert_eq!(answer.items.iter().map(|i| i.status).collect::<Vec<_>>(), vec![200, 422, 409, 404]);
    for item in &answer.items[1..] {
        assert_eq!(item.envelope().map(|e| e.trace_id), Some(TRACE_ID.to_owned()), "the batch's trace id");
    }
    let raw = raw_items(&batch);
    // Each item against P2 of that payout, under the same token and key, on an account as
    // the payouts before it in the batch left it (a twin paydb, brought there by a batch
    // under an older token).
    for (k, (payout, expected)) in items.iter().enumerate() {
        let twin = setup().await;
        if k > 0 {
            assert_eq!(claim_batch(&twin.app, "acct-1", 4, "k-earlier", &items[..k]).await.status, 200);
        }
        let path = format!("/v1/payouts/{payout}/claim");
        let one = single(&twin.app, &path, 5, "k-batch", json!({"expectedState": expected})).await;
        assert_eq!(raw[k].0, one.status, "payout #{k}: {}", one.json);
        assert_eq!(raw[k].1.as_bytes(), &one.bytes[..], "payout #{k}: the item is P2's answer, byte for byte");
    }
    // The batch's effects are the singles': p1 CLAIMED, p2 FAILED, p3 untouched.
    let states: Vec<Value> = futures::future::join_all([p1, p2, p3].map(|p| {
        let app = r.app.clone();
        async move { send(&app, "GET", &format!("/v1/payouts/{p}"), &[], None).await.json["state"].clone() }
    }))
    .await;
    assert_eq!(states, vec![json!("CLAIMED"), json!("FAILED"), json!("CLAIMED")]);
    let acct = send(&r.app, "GET", "/v1/accounts/acct-1", &[], None).await;
    assert_eq!((acct.json["fence"].clone(), acct.json["availableMinor"].clone()), (json!(5), json!(300)));
}

#[tokio::test]
async fn p3b_answers_each_payout_exactly_as_p3_would_in_the_same_situation() {
    let (p1, p2, p3, missing) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    // p1 and p2 acknowledged by the rail, p3 still CLAIMED.
    let setup = || async {
        let r = rig().await;
        create_account(&r.app, "acct-1", 1_000).await;
        create_payout_as(&r.app, p1, "acct-1", 600).await;
        create_payout_as(&r.app, p2, "acct-1", 300).await;
        create_payout_as(&r.app, p3, "acct-1", 100).await;
        let all = [(p1, "PENDING"), (p2, "PENDING"), (p3, "PENDING")];
        assert_eq!(claim_batch(&r.app, "acct-1", 1, "k-claims", &all).await.status, 200);
        let s1 = through_rail(&r.paydb, p1, "acct-1", 1, Resolution::Acked { rail_reference: "ref-1".into() }).await;
        let s2 = through_rail(&r.paydb, p2, "acct-1", 2, Resolution::Acked { rail_reference: "ref-2".into() }).await;
        (r, s1, s2)
    };
    let (other_s, other_p) = (Uuid::new_v4(), Uuid::new_v4());
    let items_of = |s1: Uuid, s2: Uuid| {
        vec![(p1, s1, "ref-1"), (p2, s2, "ref-wrong"), (p3, other_s, "ref-3"), (missing, other_p, "ref-4")]
    };
    let (r, s1, s2) = setup().await;
    let batch = post_batch(&r.app, "acct-1", 6, "k-posts", &items_of(s1, s2)).await;
    assert_eq!(batch.status, 200, "{}", batch.json);
    let answer: dlock_contract::batch::BatchAnswer = serde_json::from_slice(&batch.bytes).expect("BatchAnswer");
    assert_eq!(answer.items.iter().map(|i| i.status).collect::<Vec<_>>(), vec![200, 400, 409, 404]);
    let raw = raw_items(&batch);
    for k in 0..4 {
        let (twin, t1, t2) = setup().await;
        let items = items_of(t1, t2);
        if k > 0 {
            assert_eq!(post_batch(&twin.app, "acct-1", 5, "k-earlier", &items[..k]).await.status, 200);
        }
        let (payout, submission, reference) = items[k];
        let body = json!({"railReference": reference, "submissionId": submission, "railOutcome": "ACKED"});
        let one = single(&twin.app, &format!("/v1/payouts/{payout}/post"), 6, "k-posts", body).await;
        assert_eq!(raw[k].0, one.status, "payout #{k}: {}", one.json);
        if one.status == 200 {
            // Entry ids are fresh per posting; everything else is P3's.
            let item: Value = serde_json::from_str(&raw[k].1).expect("json");
            assert_eq!(without_entry_ids(item), without_entry_ids(one.json.clone()), "payout #{k}");
        } else {
            assert_eq!(raw[k].1.as_bytes(), &one.bytes[..], "payout #{k}: the item is P3's answer, byte for byte");
        }
    }
    let ok = &answer.items[0].body;
    assert_eq!((ok["state"].clone(), ok["balanceMinor"].clone()), (json!("POSTED"), json!(400)));
    let entries = ok["entries"].as_array().expect("entries");
    assert_eq!(entries.len(), 2);
    assert!(entries.iter().all(|e| e["fence"] == 6 && e["amountMinor"] == 600));
    let acct = send(&r.app, "GET", "/v1/accounts/acct-1", &[], None).await;
    assert_eq!((acct.json["balanceMinor"].clone(), acct.json["ledgerSumMinor"].clone()), (json!(400), json!(400)));
}

#[tokio::test]
async fn a_batch_answers_what_concerns_the_whole_request_with_one_envelope_and_writes_nothing() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    create_account(&r.app, "acct-2", 1_000).await;
    let p = create_payout(&r.app, "acct-1", 100).await;
    let records = PaymentStore::idempotency_record_count(&*r.paydb).await.expect("count");
    // Valid for both P2b and P3b (each reads its own fields).
    let element = json!({"payoutId": p, "expectedState": "PENDING", "submissionId": p, "railReference": "r",
        "railOutcome": "ACKED"});
    let body = json!({ "payouts": [element.clone()] }).to_string();
    for tail in ["claims", "posts"] {
        let uri = format!("/v1/accounts/acct-1/{tail}");
        // 400 INVALID_TOKEN: absent, zero.
        let a = send(&r.app, "POST", &uri, &write_headers("w-1", "k"), Some(&body)).await;
        assert_envelope(&a, 400, "INVALID_TOKEN");
        let a = send(&r.app, "POST", &uri, &account_headers("acct-1", "0", "w-1", "k"), Some(&body)).await;
        assert_envelope(&a, 400, "INVALID_TOKEN");
        // 400 VALIDATION_FAILED: no owner, no key, a path that is no account id.
        let mut no_owner = account_headers("acct-1", "5", "w-1", "k");
        no_owner.retain(|(h, _)| *h != "x-owner-id");
        assert_envelope(&send(&r.app, "POST", &uri, &no_owner, Some(&body)).await, 400, "VALIDATION_FAILED");
        let mut no_key = account_headers("acct-1", "5", "w-1", "k");
        no_key.retain(|(h, _)| *h != "x-idempotency-key");
        assert_envelope(&send(&r.app, "POST", &uri, &no_key, Some(&body)).await, 400, "VALIDATION_FAILED");
        let bad_path = format!("/v1/accounts/a%20b/{tail}");
        let a = send(&r.app, "POST", &bad_path, &account_headers("a b", "5", "w-1", "k"), Some(&body)).await;
        assert_envelope(&a, 400, "VALIDATION_FAILED");
        assert_eq!(a.json["details"]["fields"][0]["field"], "accountId");
        // 400 VALIDATION_FAILED with the field list: no payouts, one named twice.
        for (bad, field) in [
            (json!({"payouts": []}), "payouts"),
            (json!({ "payouts": [element.clone(), element.clone()] }), "payouts[1].payoutId"),
        ] {
            let a =
                send(&r.app, "POST", &uri, &account_headers("acct-1", "5", "w-1", "k"), Some(&bad.to_string())).await;
            assert_envelope(&a, 400, "VALIDATION_FAILED");
            assert_eq!(a.json["details"]["fields"][0]["field"], field, "{}", a.json);
        }
        // 400 INVALID_TOKEN: the signature is checked against the path's account.
        let a = send(&r.app, "POST", &uri, &account_headers("acct-2", "5", "w-1", "k"), Some(&body)).await;
        assert_envelope(&a, 400, "INVALID_TOKEN");
        // 404: no such account.
        let unknown = format!("/v1/accounts/nobody/{tail}");
        let a = send(&r.app, "POST", &unknown, &account_headers("nobody", "5", "w-1", "k"), Some(&body)).await;
        assert_envelope(&a, 404, "NOT_FOUND");
    }
    let typed = claim_batch(&r.app, "acct-1", 5, "k", &[(p, "POSTED")]).await;
    assert_envelope(&typed, 400, "VALIDATION_FAILED");
    assert_eq!(typed.json["details"]["fields"][0]["field"], "payouts[0].expectedState");
    // Nothing was written by any of them.
    assert_eq!(PaymentStore::idempotency_record_count(&*r.paydb).await.expect("count"), records);
    let acct = send(&r.app, "GET", "/v1/accounts/acct-1", &[], None).await;
    assert_eq!(acct.json["fence"], 0);
    // 422: the same key and token with another body.
    assert_eq!(claim_batch(&r.app, "acct-1", 5, "k", &[(p, "PENDING")]).await.status, 200);
    let q = create_payout(&r.app, "acct-1", 100).await;
    let a = claim_batch(&r.app, "acct-1", 5, "k", &[(q, "PENDING")]).await;
    assert_envelope(&a, 422, "IDEMPOTENCY_CONFLICT");
    assert_eq!(a.json["details"], json!({"operation": "CLAIM", "targetId": "account:acct-1"}));
    // A payout of another account is that item's 404, and its account is untouched.
    let foreign = create_payout(&r.app, "acct-2", 100).await;
    let a = claim_batch(&r.app, "acct-1", 6, "k-6", &[(foreign, "PENDING"), (q, "PENDING")]).await;
    assert_eq!(a.status, 200, "{}", a.json);
    assert_eq!((a.json["items"][0]["status"].clone(), a.json["items"][1]["status"].clone()), (json!(404), json!(200)));
    let other = send(&r.app, "GET", "/v1/accounts/acct-2", &[], None).await;
    assert_eq!(other.json["fence"], 0);
}

#[tokio::test]
async fn a_fenced_batch_is_one_fenced_out_with_the_accounts_details_logged_and_counted_once() {
    let captured = Captured::default();
    let sink = captured.clone();
    let subscriber = tracing_subscriber::fmt().json().with_writer(move || sink.clone()).finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p1 = create_payout(&r.app, "acct-1", 100).await;
    let p2 = create_payout(&r.app, "acct-1", 100).await;
    assert_eq!(claim(&r.app, p1, 8, "PENDING").await.status, 200);
    let stale = claim_batch(&r.app, "acct-1", 7, "k-stale", &[(p2, "PENDING"), (p1, "CLAIMED")]).await;
    assert_envelope(&stale, 409, "FENCED_OUT");
    assert_eq!(stale.json["retrySafe"], false);
    assert_eq!(
        stale.json["details"],
        json!({"presentedToken": 7, "highestToken": 8, "resourceType": "account", "resourceId": "acct-1",
            "ownerId": "w-1"})
    );
    assert_eq!(stale.json["traceId"], TRACE_ID);
    // The claim's own token at the ledger: a post batch needs a newer grant.
    let post = post_batch(&r.app, "acct-1", 8, "k-post", &[(p1, Uuid::new_v4(), "ref")]).await;
    assert_envelope(&post, 409, "FENCED_OUT");
    assert_eq!(
        post.json["details"],
        json!({"presentedToken": 8, "highestToken": 8, "resourceType": "ledger", "resourceId": "acct-1",
            "ownerId": "w-1"})
    );

    let text = String::from_utf8(captured.0.lock().expect("lock").clone()).expect("utf8");
    let lines: Vec<Value> = text
        .lines()
        .filter(|l| l.contains("\"fenced_out\""))
        .map(|l| serde_json::from_str(l).expect("json log line"))
        .collect();
    assert_eq!(lines.len(), 2, "one log line per refused batch: {text}");
    assert_eq!(lines[0]["fields"]["resource"], "account");
    assert_eq!(lines[0]["fields"]["resourceId"], "acct-1");
    assert_eq!(lines[0]["fields"]["presentedToken"], 7);
    assert_eq!(lines[1]["fields"]["resource"], "ledger");

    let m = send(&r.app, "GET", "/metrics", &[], None).await;
    let text = String::from_utf8(m.bytes).expect("utf8");
    for series in [
        "lock_fenced_out_total{resource=\"account\"} 1",
        "lock_fenced_out_total{resource=\"ledger\"} 1",
        // Per payout, as the single writes would count them.
        "payout_claim_total{outcome=\"fenced\"} 2",
        "payout_post_total{outcome=\"fenced\"} 1",
    ] {
        assert!(text.contains(series), "{series} missing from\n{text}");
    }
    let v1 = send(&r.app, "GET", &format!("/v1/payouts/{p2}"), &[], None).await;
    assert_eq!(v1.json["state"], "PENDING");
}

#[tokio::test]
async fn a_batch_replays_its_bytes_and_counts_each_payout_as_its_single_write() {
    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p1 = create_payout(&r.app, "acct-1", 600).await;
    let p2 = create_payout(&r.app, "acct-1", 500).await;
    let p3 = create_payout(&r.app, "acct-1", 100).await;
    let items = [(p1, "PENDING"), (p2, "PENDING"), (p3, "CLAIMED")];
    let first = claim_batch(&r.app, "acct-1", 5, "k", &items).await;
    assert_eq!(first.status, 200, "{}", first.json);
    let records = PaymentStore::idempotency_record_count(&*r.paydb).await.expect("count");
    let replay = claim_batch(&r.app, "acct-1", 5, "k", &items).await;
    assert_eq!((replay.status, &replay.bytes), (200, &first.bytes), "a replay is the recorded bytes");
    // A batch that moves nothing is answered, not recorded, and judged afresh.
    let idle = [(p3, "CLAIMED")];
    let a = claim_batch(&r.app, "acct-1", 6, "k-idle", &idle).await;
    assert_eq!((a.status, a.json["items"][0]["status"].clone()), (200, json!(409)));
    assert_eq!(PaymentStore::idempotency_record_count(&*r.paydb).await.expect("count"), records);
    assert_eq!(send(&r.app, "GET", "/v1/accounts/acct-1", &[], None).await.json["fence"], 5);
    assert_eq!(claim(&r.app, p3, 6, "PENDING").await.status, 200);
    let a = claim_batch(&r.app, "acct-1", 7, "k-idle", &[(p3, "CLAIMED")]).await;
    assert_eq!(a.json["items"][0]["status"], 200, "{}", a.json);

    let m = send(&r.app, "GET", "/metrics", &[], None).await;
    let text = String::from_utf8(m.bytes).expect("utf8");
    for series in [
        "payout_claim_total{outcome=\"claimed\"} 2",
        "payout_claim_total{outcome=\"reclaimed\"} 1",
        "payout_claim_total{outcome=\"insufficient_funds\"} 1",
        "payout_claim_total{outcome=\"not_claimable\"} 2",
        "idempotency_request_total{outcome=\"replayed\"} 1",
        "payout_store_op_seconds_count{op=\"claim_batch\"} 4",
        // The grant of a batch is its path's account's: nothing is read for it.
        "payout_store_op_seconds_count{op=\"payout_account\"} 1",
    ] {
        assert!(text.contains(series), "{series} missing from\n{text}");
    }
}

#[tokio::test]
async fn each_injected_store_fault_of_a_batch_maps_to_its_code_and_retry_safety() {
    use dlock_payment_resource::store::StoreFault;
    use dlock_payment_resource::store_fault::FaultyPaymentStore;
    // (operation, class, status, code, retrySafe, the batch committed)
    let cases = [
        ("claim_batch", StoreFault::Unavailable, 503, "NOT_READY", true, false),
        ("claim_batch", StoreFault::CommitUnknown, 500, "INTERNAL", false, true),
        ("claim_batch", StoreFault::Corrupt, 500, "INTERNAL", false, false),
        ("post_batch", StoreFault::Unavailable, 503, "NOT_READY", true, false),
        ("post_batch", StoreFault::CommitUnknown, 500, "INTERNAL", false, true),
    ];
    for (op, fault, status, code, retry_safe, committed) in cases {
        let paydb = Arc::new(MemPaydb::new());
        let faulty = Arc::new(FaultyPaymentStore::new(paydb.clone()));
        let app = router(PaymentResource::start(faulty.clone(), payment_cfg(), Clock::system()).await.expect("start"));
        assert_eq!(create_account(&app, "acct-1", 10_000).await.status, 201);
        let p = create_payout(&app, "acct-1", 500).await;
        let a = if op == "claim_batch" {
            faulty.faults.inject(op, fault);
            claim_batch(&app, "acct-1", 7, "k", &[(p, "PENDING")]).await
        } else {
            assert_eq!(claim(&app, p, 6, "PENDING").await.status, 200);
            let s = through_rail(&paydb, p, "acct-1", 6, Resolution::Acked { rail_reference: "ref".into() }).await;
            faulty.faults.inject(op, fault);
            post_batch(&app, "acct-1", 7, "k", &[(p, s, "ref")]).await
        };
        assert_envelope(&a, status, code);
        assert_eq!(a.json["retrySafe"], retry_safe, "{op} {fault:?}: {}", a.json);
        let state = PaymentStore::payout(&*paydb, p).await.expect("read").expect("exists").state;
        let moved = if op == "claim_batch" { "CLAIMED" } else { "POSTED" };
        let stayed = if op == "claim_batch" { "PENDING" } else { "RAIL_ACKED" };
        assert_eq!(state.as_str(), if committed { moved } else { stayed }, "{op} {fault:?}");
    }
}

/// Records the payment-resource's `fenced_write` events.
#[derive(Default)]
struct Events(Mutex<Vec<dlock_rt::events::Fields>>);

impl dlock_rt::events::Sink for Events {
    fn record(&self, _node: &str, kind: &'static str, fields: dlock_rt::events::Fields) {
        if kind == "fenced_write" {
            if let Ok(mut v) = self.0.lock() {
                v.push(fields);
            }
        }
    }
}

#[tokio::test]
async fn each_payout_of_a_batch_emits_its_single_writes_fenced_write_event() {
    let events = Arc::new(Events::default());
    let _installed = dlock_rt::events::install(events.clone());
    let r = rig().await;
    create_account(&r.app, "acct-1", 1_000).await;
    let p1 = create_payout(&r.app, "acct-1", 100).await;
    let p2 = create_payout(&r.app, "acct-1", 100).await;
    let missing = Uuid::new_v4();
    let ok = claim_batch(&r.app, "acct-1", 5, "k", &[(p1, "PENDING"), (missing, "PENDING"), (p2, "PENDING")]).await;
    assert_eq!(ok.status, 200);
    let stale = claim_batch(&r.app, "acct-1", 4, "k", &[(p1, "CLAIMED"), (p2, "CLAIMED")]).await;
    assert_envelope(&stale, 409, "FENCED_OUT");
    let replay = claim_batch(&r.app, "acct-1", 5, "k", &[(p1, "PENDING"), (missing, "PENDING"), (p2, "PENDING")]).await;
    assert_eq!(replay.bytes, ok.bytes);
    let mine: Vec<String> = [p1, missing, p2].iter().map(Uuid::to_string).collect();
    let seen: Vec<(String, String, Value, Value, bool)> = events
        .0
        .lock()
        .expect("lock")
        .iter()
        .filter(|f| f.get("payout").and_then(Value::as_str).is_some_and(|p| mine.iter().any(|m| m == p)))
        .map(|f| {
            (
                f["payout"].as_str().unwrap_or_default().to_owned(),
                f["answer"].as_str().unwrap_or_default().to_owned(),
                f["stored_token"].clone(),
                f["account"].clone(),
                f["replay"].as_bool().unwrap_or_default(),
            )
        })
        .collect();
    let (s1, sm, s2) = (p1.to_string(), missing.to_string(), p2.to_string());
    assert_eq!(
        seen,
        vec![
            (s1.clone(), "accepted".into(), json!(5), json!("acct-1"), false),
            (sm.clone(), "no_decision".into(), Value::Null, json!(""), false),
            (s2.clone(), "accepted".into(), json!(5), json!("acct-1"), false),
            (s1.clone(), "fenced_out".into(), json!(5), json!("acct-1"), false),
            (s2.clone(), "fenced_out".into(), json!(5), json!("acct-1"), false),
            (s1, "no_decision".into(), Value::Null, json!(""), true),
            (sm, "no_decision".into(), Value::Null, json!(""), true),
            (s2, "no_decision".into(), Value::Null, json!(""), true),
        ]
    );
}
