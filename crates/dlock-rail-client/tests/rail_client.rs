//! The rail client against a scripted fake rail-proxy: the `SubmissionAck`, each refusal
//! class, the hard zero retries and the submit budget of C3 §3.8. Every test is named after
//! the behaviour it proves.

use chrono::{TimeZone, Utc};
use dlock_contract::rail::{SubmissionAck, SubmissionOutcome, SubmissionRequest};
use dlock_contract::{ErrorCode, FencingToken, IdempotencyKey, OwnerId};
use dlock_rail_client::{RailClient, RailClientConfig, RailRefusal, SUBMISSIONS_PATH};
use dlock_rt::{Clock, Duration};
use dlock_testkit::fake_service::{nobody_listens, refuse, slow, FakeService, Reply};
use uuid::Uuid;

const PAYOUT: Uuid = Uuid::from_u128(0x4b6f_1b5e_8d0a_4a39_9f5e_2f1d_1a0c_9e11);

fn ack() -> SubmissionAck {
    let at = Utc.timestamp_millis_opt(1_764_500_730_123).single().expect("instant");
    SubmissionAck {
        submission_id: Uuid::from_u128(2),
        payout_id: PAYOUT,
        presented_token: 7,
        outcome: SubmissionOutcome::Acked,
        rail_reference: "RR-1".into(),
        submitted_at: at,
        resolved_at: at,
    }
}

fn request() -> SubmissionRequest {
    SubmissionRequest {
        payout_id: PAYOUT,
        account_id: "acct-1".into(),
        amount_minor: 100,
        currency: "EUR".into(),
        beneficiary_ref: "ben-1".into(),
    }
}

fn client(base: &dlock_rt::http::BaseUrl, edit: impl FnOnce(&mut RailClientConfig)) -> RailClient {
    let mut cfg = RailClientConfig::new(base.clone());
    edit(&mut cfg);
    RailClient::new(cfg).expect("valid config")
}

async fn submit(c: &RailClient) -> Result<SubmissionAck, RailRefusal> {
    let owner = OwnerId::parse("executor-1/0").expect("owner");
    let key = IdempotencyKey::parse(&format!("payout:{PAYOUT}")).expect("key");
    c.submit(FencingToken::new(7).expect("token"), &owner, &key, &request()).await
}

fn count(fake: &FakeService) -> usize {
    fake.count("POST", SUBMISSIONS_PATH)
}

#[tokio::test]
async fn submit_sends_token_owner_key_and_body_and_returns_the_submission_ack() {
    let fake = FakeService::start().await;
    fake.script("POST", SUBMISSIONS_PATH, [Reply::Json(200, serde_json::to_value(ack()).expect("json"))]);
    let c = client(&fake.base, |_| {});

    assert_eq!(submit(&c).await, Ok(ack()));

    let seen = fake.seen("POST", SUBMISSIONS_PATH);
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(h.get("x-fencing-token").map(String::as_str), Some("7"));
    assert_eq!(h.get("x-owner-id").map(String::as_str), Some("executor-1/0"));
    assert_eq!(h.get("x-idempotency-key"), Some(&format!("payout:{PAYOUT}")));
    assert_eq!(seen[0].body, serde_json::to_value(request()).expect("json"));
}

#[tokio::test]
async fn a_submission_is_sent_once_whatever_the_refusal_even_a_retry_safe_503() {
    let fake = FakeService::start().await;
    let c = client(&fake.base, |_| {});
    for (n, code) in ErrorCode::ALL.into_iter().enumerate() {
        fake.script("POST", SUBMISSIONS_PATH, [Reply::Refuse(code, Some(10))]);
        let r = submit(&c).await.expect_err("refused");
        assert_eq!(r.code(), Some(code));
        assert_eq!(r.retry_safe(), code.retry_safe(), "{code}: the catalogue's verdict");
        assert_eq!(count(&fake), n + 1, "{code} was re-sent");
    }
}

#[tokio::test]
async fn rail_ambiguous_is_an_unknown_outcome_naming_its_submission() {
    let fake = FakeService::start().await;
    let mut envelope = dlock_contract::ErrorEnvelope::new(ErrorCode::RailAmbiguous, "m", "t");
    envelope.details = Some(serde_json::json!({"submissionId": "7c1e0d2a-3b4f-4c5d-8e6f-a0b1c2d3e4f5"}));
    fake.script("POST", SUBMISSIONS_PATH, [Reply::Json(409, serde_json::to_value(&envelope).expect("json"))]);
    let c = client(&fake.base, |_| {});

    let r = submit(&c).await.expect_err("ambiguous");

    assert!(matches!(r, RailRefusal::Refused { status: 409, .. }), "{r:?}");
    assert!(r.outcome_unknown() && !r.retry_safe());
    assert_eq!(r.ambiguous_submission_id(), Some("7c1e0d2a-3b4f-4c5d-8e6f-a0b1c2d3e4f5"));
}

#[tokio::test]
async fn a_submission_whose_answer_is_lost_is_ambiguous_and_never_re_sent() {
    let fake = FakeService::start().await;
    fake.script("POST", SUBMISSIONS_PATH, [slow(5_000, refuse(ErrorCode::NotReady)), Reply::Drop]);
    let c = client(&fake.base, |c| c.read_timeout_ms = 200);

    let timed_out = submit(&c).await.expect_err("timed out");
    assert!(matches!(timed_out, RailRefusal::NoAnswer { .. }), "{timed_out:?}");
    assert!(timed_out.outcome_unknown() && !timed_out.retry_safe());
    assert_eq!(count(&fake), 1);

    let dropped = submit(&c).await.expect_err("dropped");
    assert!(matches!(dropped, RailRefusal::NoAnswer { .. }), "{dropped:?}");
    assert_eq!(count(&fake), 2, "one request per call");
}

#[tokio::test]
async fn the_submit_read_budget_bounds_a_slow_answer() {
    let fake = FakeService::start().await;
    fake.set_default(
        "POST",
        SUBMISSIONS_PATH,
        slow(5_000, Reply::Json(200, serde_json::to_value(ack()).expect("json"))),
    );
    let c = client(&fake.base, |c| c.read_timeout_ms = 300);
    let clock = Clock::system();

    let start = clock.now();
    let r = submit(&c).await.expect_err("timed out");
    let took = clock.now().duration_since(start);

    assert!(matches!(r, RailRefusal::NoAnswer { .. }), "{r:?}");
    assert!(took >= Duration::from_millis(300), "waited its budget: {took:?}");
    assert!(took < Duration::from_millis(2_000), "and not the proxy's 5 s: {took:?}");
}

#[tokio::test]
async fn a_proxy_nobody_listens_on_is_nothing_sent() {
    let base = nobody_listens().await;
    let r = submit(&client(&base, |_| {})).await.expect_err("refused");
    assert!(matches!(r, RailRefusal::NothingSent { .. }), "{r:?}");
    assert!(r.retry_safe() && !r.outcome_unknown());
}

#[tokio::test]
async fn an_answer_that_is_not_c3_is_unreadable_and_an_unknown_outcome() {
    let fake = FakeService::start().await;
    fake.script(
        "POST",
        SUBMISSIONS_PATH,
        [Reply::Text(502, "<html>bad gateway</html>"), Reply::Json(200, serde_json::json!({"outcome": "ACKED"}))],
    );
    let c = client(&fake.base, |_| {});

    let gateway = submit(&c).await.expect_err("no envelope");
    assert!(matches!(gateway, RailRefusal::Unreadable { status: 502, .. }), "{gateway:?}");
    let short = submit(&c).await.expect_err("not a SubmissionAck");
    assert!(matches!(short, RailRefusal::Unreadable { status: 200, .. }), "{short:?}");
    assert!(gateway.outcome_unknown() && short.outcome_unknown());
    assert_eq!(count(&fake), 2);
}

fn batch_request() -> dlock_contract::rail::SubmissionBatchRequest {
    dlock_contract::rail::SubmissionBatchRequest {
        account_id: "acct-1".into(),
        submissions: vec![dlock_contract::rail::SubmissionBatchItem {
            payout_id: PAYOUT,
            amount_minor: 100,
            currency: "EUR".into(),
            beneficiary_ref: "ben-1".into(),
            idempotency_key: format!("payout:{PAYOUT}"),
        }],
    }
}

async fn submit_batch(c: &RailClient) -> Result<dlock_contract::batch::BatchAnswer, RailRefusal> {
    let owner = OwnerId::parse("executor-1/0").expect("owner");
    c.submit_batch(FencingToken::new(7).expect("token"), &owner, &batch_request()).await
}

#[tokio::test]
async fn a_batch_is_sent_once_with_token_and_owner_and_no_idempotency_key_and_returns_its_items() {
    use dlock_rail_client::SUBMISSION_BATCHES_PATH;
    let answer = dlock_contract::batch::BatchAnswer {
        account_id: "acct-1".into(),
        presented_token: 7,
        items: vec![dlock_contract::batch::BatchItem {
            payout_id: PAYOUT,
            status: 200,
            body: serde_json::to_value(ack()).expect("json"),
        }],
    };
    let fake = FakeService::start().await;
    fake.script("POST", SUBMISSION_BATCHES_PATH, [Reply::Json(200, serde_json::to_value(&answer).expect("json"))]);
    let c = client(&fake.base, |_| {});

    let got = submit_batch(&c).await.expect("answered");
    assert_eq!(got, answer);
    assert_eq!(got.items[0].ok::<SubmissionAck>(), Some(ack()));

    let seen = fake.seen("POST", SUBMISSION_BATCHES_PATH);
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(h.get("x-fencing-token").map(String::as_str), Some("7"));
    assert_eq!(h.get("x-owner-id").map(String::as_str), Some("executor-1/0"));
    assert_eq!(h.get("x-idempotency-key"), None, "each submission carries its key in the body");
    assert_eq!(seen[0].body, serde_json::to_value(batch_request()).expect("json"));
    assert_eq!(count(&fake), 0, "nothing went to the single submission's path");
}

#[tokio::test]
async fn a_batch_is_sent_once_whatever_the_refusal_and_a_lost_answer_is_an_unknown_outcome() {
    use dlock_rail_client::SUBMISSION_BATCHES_PATH;
    let fake = FakeService::start().await;
    let c = client(&fake.base, |c| c.read_timeout_ms = 200);
    for (n, code) in [ErrorCode::RailUnavailable, ErrorCode::FencedOut, ErrorCode::Internal].into_iter().enumerate() {
        fake.script("POST", SUBMISSION_BATCHES_PATH, [Reply::Refuse(code, Some(10))]);
        let r = submit_batch(&c).await.expect_err("refused");
        assert_eq!(r.code(), Some(code));
        assert_eq!(fake.count("POST", SUBMISSION_BATCHES_PATH), n + 1, "{code} was re-sent");
    }
    fake.script("POST", SUBMISSION_BATCHES_PATH, [slow(5_000, refuse(ErrorCode::NotReady))]);
    let lost = submit_batch(&c).await.expect_err("timed out");
    assert!(matches!(lost, RailRefusal::NoAnswer { .. }) && lost.outcome_unknown() && !lost.retry_safe(), "{lost:?}");
    assert_eq!(fake.count("POST", SUBMISSION_BATCHES_PATH), 4);
}
