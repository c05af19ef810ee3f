//! The payment client against a scripted fake payment-resource: the contract's success
//! bodies, each refusal class, the C3 §3.8 retry rules and budgets. Every test is named
//! after the behaviour it proves.

use chrono::{TimeZone, Utc};
use dlock_contract::payment::{
    AccountBody, ClaimAck, ClaimRequest, EntryBody, NewAccountRequest, NewPayoutRequest, PayoutBody, PayoutItem,
    PayoutPage, PostAck, PostRequest,
};
use dlock_contract::payout::PayoutState;
use dlock_contract::{ErrorCode, FencingToken, IdempotencyKey, OwnerId};
use dlock_payment_client::{ListQuery, Operation, PaymentClient, PaymentClientConfig, PaymentRefusal};
use dlock_rt::{Clock, Duration};
use dlock_testkit::fake_service::{nobody_listens, refuse, slow, FakeService, Reply};
use uuid::Uuid;

const PAYOUT: Uuid = Uuid::from_u128(0x4b6f_1b5e_8d0a_4a39_9f5e_2f1d_1a0c_9e11);

fn claim_path() -> String {
    format!("/v1/payouts/{PAYOUT}/claim")
}

fn post_path() -> String {
    format!("/v1/payouts/{PAYOUT}/post")
}

fn view_path() -> String {
    format!("/v1/payouts/{PAYOUT}")
}

fn at() -> chrono::DateTime<Utc> {
    Utc.timestamp_millis_opt(1_764_500_730_123).single().expect("instant")
}

fn claim_ack() -> ClaimAck {
    ClaimAck {
        payout_id: PAYOUT,
        state: PayoutState::Claimed,
        claim_token: 7,
        account_fence: 7,
        attempt_count: 1,
        idempotency_key: format!("payout:{PAYOUT}"),
        account_id: Some("acct-1".into()),
        amount_minor: Some(1250),
        currency: Some("EUR".into()),
        beneficiary_ref: Some("ben-1".into()),
    }
}

fn post_ack() -> PostAck {
    let entry = |direction: &str, account: &str| EntryBody {
        entry_id: Uuid::from_u128(1),
        account_id: account.into(),
        direction: direction.into(),
        amount_minor: 100,
        fence: 8,
    };
    PostAck {
        payout_id: PAYOUT,
        state: PayoutState::Posted,
        entries: vec![entry("DEBIT", "acct-1"), entry("CREDIT", "settlement")],
        balance_minor: 900,
    }
}

fn payout_body() -> PayoutBody {
    PayoutBody {
        payout_id: PAYOUT,
        account_id: "acct-1".into(),
        amount_minor: 100,
        currency: "EUR".into(),
        beneficiary_ref: "ben-1".into(),
        state: PayoutState::Pending,
        attempt_count: 0,
        claim_token: None,
        claimed_by: None,
        claimed_at: None,
        created_at: at(),
        updated_at: at(),
        submissions: vec![],
    }
}

fn account_body() -> AccountBody {
    AccountBody {
        account_id: "acct-1".into(),
        currency: "EUR".into(),
        balance_minor: 1_000,
        fence: 0,
        ledger_sum_minor: 1_000,
        available_minor: 1_000,
        created_at: at(),
        updated_at: at(),
    }
}

fn json<T: serde::Serialize>(status: u16, body: &T) -> Reply {
    Reply::Json(status, serde_json::to_value(body).expect("serialize"))
}

fn owner() -> OwnerId {
    OwnerId::parse("executor-1/0").expect("owner")
}

fn key() -> IdempotencyKey {
    IdempotencyKey::parse(&format!("payout:{PAYOUT}")).expect("key")
}

fn token() -> FencingToken {
    FencingToken::new(7).expect("token")
}

fn client(base: &dlock_rt::http::BaseUrl, edit: impl FnOnce(&mut PaymentClientConfig)) -> PaymentClient {
    let mut cfg = PaymentClientConfig::new(base.clone());
    edit(&mut cfg);
    PaymentClient::new(cfg).expect("valid config")
}

async fn claim(c: &PaymentClient) -> Result<ClaimAck, PaymentRefusal> {
    c.claim(PAYOUT, token(), &owner(), &key(), &ClaimRequest { expected_state: PayoutState::Pending }).await
}

fn post_request() -> PostRequest {
    PostRequest { rail_reference: "RR-1".into(), submission_id: Uuid::from_u128(2), rail_outcome: "ACKED".into() }
}

#[tokio::test]
async fn claim_sends_token_owner_key_and_body_and_returns_the_claim_ack() {
    let fake = FakeService::start().await;
    fake.script("POST", &claim_path(), [json(200, &claim_ack())]);
    let c = client(&fake.base, |_| {});

    assert_eq!(claim(&c).await, Ok(claim_ack()));

    let seen = fake.seen("POST", &claim_path());
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(h.get("x-fencing-token").map(String::as_str), Some("7"));
    assert_eq!(h.get("x-owner-id").map(String::as_str), Some("executor-1/0"));
    assert_eq!(h.get("x-idempotency-key"), Some(&format!("payout:{PAYOUT}")));
    assert!(h.get("content-type").is_some_and(|t| t.starts_with("application/json")));
    assert_eq!(seen[0].body, serde_json::json!({"expectedState": "PENDING"}));
}

#[tokio::test]
async fn post_reads_and_creates_return_the_contracts_bodies() {
    let fake = FakeService::start().await;
    fake.script("POST", &post_path(), [json(200, &post_ack())]);
    fake.script("GET", &view_path(), [json(200, &payout_body())]);
    fake.script("GET", "/v1/accounts/acct-1", [json(200, &account_body())]);
    let item = PayoutItem {
        payout_id: PAYOUT,
        account_id: "acct-1".into(),
        amount_minor: 100,
        currency: "EUR".into(),
        state: PayoutState::Pending,
        attempt_count: 0,
        created_at: at(),
    };
    let page = PayoutPage { items: vec![item], next_cursor: Some("c.1".into()) };
    fake.script("GET", "/v1/payouts", [json(200, &page)]);
    fake.script("POST", "/v1/accounts", [json(201, &account_body())]);
    fake.script("POST", "/v1/payouts", [json(201, &payout_body())]);
    let c = client(&fake.base, |_| {});

    assert_eq!(c.post(PAYOUT, token(), &owner(), &key(), &post_request()).await, Ok(post_ack()));
    assert_eq!(c.payout(PAYOUT).await, Ok(payout_body()));
    assert_eq!(c.account("acct-1").await, Ok(account_body()));
    assert_eq!(c.list(&ListQuery::new(PayoutState::Pending).limit(50)).await, Ok(page));
    let ops = OwnerId::parse("ops").expect("owner");
    let open = NewAccountRequest { account_id: "acct-1".into(), currency: "EUR".into(), opening_balance_minor: 1_000 };
    let open_key = IdempotencyKey::parse("open-1").expect("key");
    assert_eq!(c.create_account(&ops, &open_key, &open).await, Ok(account_body()));
    let create = NewPayoutRequest {
        payout_id: Some(PAYOUT),
        account_id: "acct-1".into(),
        amount_minor: 100,
        currency: "EUR".into(),
        beneficiary_ref: "ben-1".into(),
    };
    let create_key = IdempotencyKey::parse("create-1").expect("key");
    assert_eq!(c.create_payout(&ops, &create_key, &create).await, Ok(payout_body()));

    assert_eq!(fake.seen("GET", "/v1/payouts")[0].query.as_deref(), Some("state=PENDING&limit=50"));
    assert_eq!(fake.seen("POST", &post_path())[0].body, serde_json::to_value(post_request()).expect("json"));
    let created = &fake.seen("POST", "/v1/accounts")[0];
    assert_eq!(created.headers.get("x-idempotency-key").map(String::as_str), Some("open-1"));
    assert!(!created.headers.contains_key("x-fencing-token"), "a create carries no token");
}

#[tokio::test]
async fn an_envelope_is_a_refusal_with_its_code_and_the_catalogues_verdict() {
    let fake = FakeService::start().await;
    fake.script("POST", &claim_path(), [refuse(ErrorCode::FencedOut)]);
    let c = client(&fake.base, |_| {});

    let r = claim(&c).await.expect_err("fenced");

    assert!(matches!(r, PaymentRefusal::Refused { operation: Operation::Claim, status: 409, .. }), "{r:?}");
    assert_eq!(r.code(), Some(ErrorCode::FencedOut));
    assert!(!r.retry_safe());
    assert!(!r.outcome_unknown());
}

#[tokio::test]
async fn every_non_retry_safe_code_ends_a_write_after_one_request() {
    let fake = FakeService::start().await;
    let c = client(&fake.base, |c| c.write_retries_max = 3);
    let codes: Vec<ErrorCode> = ErrorCode::ALL.into_iter().filter(|c| !c.retry_safe()).collect();
    for (n, code) in codes.iter().enumerate() {
        fake.script("POST", &claim_path(), [refuse(*code)]);
        let r = claim(&c).await.expect_err("refused");
        assert_eq!(r.code(), Some(*code));
        assert_eq!(fake.count("POST", &claim_path()), n + 1, "{code} was re-sent");
    }
}

#[tokio::test]
async fn a_retry_safe_409_or_429_is_not_re_sent_either() {
    let fake = FakeService::start().await;
    fake.set_default("POST", &post_path(), json(200, &post_ack()));
    let c = client(&fake.base, |_| {});
    for code in [ErrorCode::LockContended, ErrorCode::ContentionExceeded] {
        fake.script("POST", &post_path(), [refuse(code)]);
        let r = c.post(PAYOUT, token(), &owner(), &key(), &post_request()).await.expect_err("refused");
        assert_eq!(r.code(), Some(code));
    }
    assert_eq!(fake.count("POST", &post_path()), 2, "one request per call");
}

#[tokio::test]
async fn a_write_is_re_sent_once_after_a_503_and_waits_its_retry_after() {
    let fake = FakeService::start().await;
    fake.script("POST", &claim_path(), [Reply::Refuse(ErrorCode::NotReady, Some(200)), json(200, &claim_ack())]);
    let c = client(&fake.base, |_| {});

    assert_eq!(claim(&c).await, Ok(claim_ack()));

    let seen = fake.seen("POST", &claim_path());
    assert_eq!(seen.len(), 2);
    let gap = seen[1].at.duration_since(seen[0].at);
    assert!(gap >= Duration::from_millis(200), "retryAfterMillis honoured: {gap:?}");
    assert_eq!(seen[0].body, seen[1].body, "the identical body is re-sent");
    assert_eq!(seen[0].headers.get("x-idempotency-key"), seen[1].headers.get("x-idempotency-key"));
}

#[tokio::test]
async fn a_write_gets_at_most_write_retries_max_re_sends() {
    let fake = FakeService::start().await;
    fake.set_default("POST", &claim_path(), refuse(ErrorCode::NotReady));
    let c = client(&fake.base, |_| {});
    let r = claim(&c).await.expect_err("always 503");
    assert_eq!(r.code(), Some(ErrorCode::NotReady));
    assert_eq!(fake.count("POST", &claim_path()), 2, "C3 §3.8: one retry");

    let c = client(&fake.base, |c| c.write_retries_max = 0);
    let _ = claim(&c).await.expect_err("always 503");
    assert_eq!(fake.count("POST", &claim_path()), 3, "no retry when write_retries_max is 0");
}

#[tokio::test]
async fn a_write_whose_answer_is_lost_is_ambiguous_and_never_re_sent() {
    let fake = FakeService::start().await;
    fake.script("POST", &claim_path(), [slow(5_000, json(200, &claim_ack()))]);
    fake.script("POST", &post_path(), [Reply::Drop]);
    let c = client(&fake.base, |c| {
        c.write_read_timeout_ms = 200;
        c.write_retries_max = 3;
    });

    let lost = claim(&c).await.expect_err("timed out");
    assert!(matches!(lost, PaymentRefusal::NoAnswer { operation: Operation::Claim, .. }), "{lost:?}");
    assert!(lost.outcome_unknown() && !lost.retry_safe());
    let dropped = c.post(PAYOUT, token(), &owner(), &key(), &post_request()).await.expect_err("dropped");
    assert!(matches!(dropped, PaymentRefusal::NoAnswer { operation: Operation::Post, .. }), "{dropped:?}");

    assert_eq!(fake.count("POST", &claim_path()), 1);
    assert_eq!(fake.count("POST", &post_path()), 1);
}

/// Cut 9: reads and writes keep their connections alive (one per budget here), and a
/// write whose *reused* connection breaks before the answer is `NoAnswer`, never
/// `NothingSent`, so it is not re-sent whatever `write_retries_max` allows.
#[tokio::test]
async fn a_write_on_a_reused_connection_that_breaks_is_no_answer_and_never_re_sent() {
    let fake = FakeService::start().await;
    fake.script("GET", &view_path(), [json(200, &payout_body()), json(200, &payout_body())]);
    fake.script("POST", &claim_path(), [json(200, &claim_ack())]);
    fake.script("POST", &post_path(), [Reply::Drop]);
    let c = client(&fake.base, |c| c.write_retries_max = 3);

    c.payout(PAYOUT).await.expect("read");
    c.payout(PAYOUT).await.expect("read again");
    claim(&c).await.expect("claimed");
    assert_eq!(c.connections_opened(), 2, "one connection per budget, reused");
    let dropped = c.post(PAYOUT, token(), &owner(), &key(), &post_request()).await.expect_err("dropped");
    assert!(matches!(dropped, PaymentRefusal::NoAnswer { operation: Operation::Post, .. }), "{dropped:?}");
    assert!(dropped.outcome_unknown() && !dropped.retry_safe());
    assert_eq!(fake.count("POST", &post_path()), 1, "never re-sent");
    assert_eq!(c.connections_opened(), 2, "the post went on the claim's connection");
}

#[tokio::test]
async fn the_write_read_budget_bounds_a_slow_answer() {
    let fake = FakeService::start().await;
    fake.set_default("POST", &claim_path(), slow(5_000, json(200, &claim_ack())));
    let c = client(&fake.base, |c| c.write_read_timeout_ms = 300);
    let clock = Clock::system();

    let start = clock.now();
    let r = claim(&c).await.expect_err("timed out");
    let took = clock.now().duration_since(start);

    assert!(matches!(r, PaymentRefusal::NoAnswer { .. }), "{r:?}");
    assert!(took >= Duration::from_millis(300), "waited its budget: {took:?}");
    assert!(took < Duration::from_millis(2_000), "and not the server's 5 s: {took:?}");
}

#[tokio::test]
async fn a_service_nobody_listens_on_is_nothing_sent() {
    let base = nobody_listens().await;
    let c = client(&base, |_| {});

    let r = claim(&c).await.expect_err("refused");
    assert!(matches!(r, PaymentRefusal::NothingSent { operation: Operation::Claim, .. }), "{r:?}");
    assert!(r.retry_safe() && !r.outcome_unknown());
    let r = c.payout(PAYOUT).await.expect_err("refused");
    assert!(matches!(r, PaymentRefusal::NothingSent { operation: Operation::Payout, .. }), "{r:?}");
}

#[tokio::test]
async fn an_answer_that_is_not_c3_is_unreadable_and_a_write_is_not_re_sent() {
    let fake = FakeService::start().await;
    fake.script("POST", &claim_path(), [Reply::Text(503, "<html>busy</html>")]);
    fake.script("POST", &post_path(), [Reply::Json(200, serde_json::json!({"state": "POSTED"}))]);
    let c = client(&fake.base, |_| {});

    let garbled = claim(&c).await.expect_err("no envelope");
    assert!(matches!(garbled, PaymentRefusal::Unreadable { status: 503, .. }), "{garbled:?}");
    assert!(garbled.outcome_unknown());
    let short = c.post(PAYOUT, token(), &owner(), &key(), &post_request()).await.expect_err("not a PostAck");
    assert!(matches!(short, PaymentRefusal::Unreadable { status: 200, .. }), "{short:?}");

    assert_eq!(fake.count("POST", &claim_path()), 1, "a 503 without an envelope has no catalogue verdict");
    assert_eq!(fake.count("POST", &post_path()), 1);
}

#[tokio::test]
async fn an_advisory_read_is_tried_read_tries_max_times_and_stops_at_a_4xx() {
    let fake = FakeService::start().await;
    fake.script("GET", &view_path(), [refuse(ErrorCode::NotReady), json(200, &payout_body())]);
    let c = client(&fake.base, |_| {});
    assert_eq!(c.payout(PAYOUT).await, Ok(payout_body()));
    assert_eq!(fake.count("GET", &view_path()), 2);

    fake.set_default("GET", &view_path(), Reply::Drop);
    let r = c.payout(PAYOUT).await.expect_err("lost twice");
    assert!(matches!(r, PaymentRefusal::NoAnswer { operation: Operation::Payout, .. }), "{r:?}");
    assert!(r.retry_safe() && !r.outcome_unknown(), "a lost read has no side effect");
    assert_eq!(fake.count("GET", &view_path()), 4, "two tries, then give up");

    let r = c.account("acct-9").await.expect_err("unknown");
    assert_eq!(r.code(), Some(ErrorCode::NotFound));
    assert_eq!(fake.count("GET", "/v1/accounts/acct-9"), 1, "a 4xx is an answer");

    let c3 = client(&fake.base, |c| c.read_tries_max = 3);
    let _ = c3.payout(PAYOUT).await.expect_err("lost three times");
    assert_eq!(fake.count("GET", &view_path()), 7);
}

#[tokio::test]
async fn the_read_budget_bounds_each_try_of_a_slow_read() {
    let fake = FakeService::start().await;
    fake.set_default("GET", &view_path(), slow(5_000, json(200, &payout_body())));
    let c = client(&fake.base, |c| c.read_read_timeout_ms = 200);
    let clock = Clock::system();

    let start = clock.now();
    let r = c.payout(PAYOUT).await.expect_err("timed out");
    let took = clock.now().duration_since(start);

    assert!(matches!(r, PaymentRefusal::NoAnswer { .. }), "{r:?}");
    assert_eq!(fake.count("GET", &view_path()), 2);
    assert!(took >= Duration::from_millis(400), "two tries of 200 ms: {took:?}");
    assert!(took < Duration::from_millis(2_500), "never the server's 5 s: {took:?}");
}

#[tokio::test]
async fn an_account_id_that_is_not_path_safe_is_refused_before_sending() {
    let fake = FakeService::start().await;
    let c = client(&fake.base, |_| {});
    let r = c.account("a/../b").await.expect_err("invalid");
    assert!(matches!(r, PaymentRefusal::NothingSent { operation: Operation::Account, .. }), "{r:?}");
}

// ------------------------------------------------------------------ P2b, P3b (E-19)

fn batch_answer() -> dlock_contract::batch::BatchAnswer {
    use dlock_contract::batch::{BatchAnswer, BatchItem};
    BatchAnswer {
        account_id: "acct-1".into(),
        presented_token: 7,
        items: vec![
            BatchItem { payout_id: PAYOUT, status: 200, body: serde_json::to_value(claim_ack()).expect("json") },
            BatchItem {
                payout_id: Uuid::from_u128(9),
                status: 404,
                body: serde_json::json!({"code": "NOT_FOUND", "message": "no such payout", "retrySafe": false,
                    "traceId": "t"}),
            },
        ],
    }
}

fn claim_batch_request() -> dlock_contract::payment::ClaimBatchRequest {
    use dlock_contract::payment::{ClaimBatchItem, ClaimBatchRequest};
    ClaimBatchRequest {
        payouts: vec![
            ClaimBatchItem { payout_id: PAYOUT, expected_state: PayoutState::Pending },
            ClaimBatchItem { payout_id: Uuid::from_u128(9), expected_state: PayoutState::Claimed },
        ],
    }
}

fn post_batch_request() -> dlock_contract::payment::PostBatchRequest {
    use dlock_contract::payment::{PostBatchItem, PostBatchRequest};
    PostBatchRequest {
        payouts: vec![PostBatchItem {
            payout_id: PAYOUT,
            rail_reference: "RR-1".into(),
            submission_id: Uuid::from_u128(2),
            rail_outcome: "ACKED".into(),
        }],
    }
}

const CLAIMS_PATH: &str = "/v1/accounts/acct-1/claims";
const POSTS_PATH: &str = "/v1/accounts/acct-1/posts";

fn batch_key() -> IdempotencyKey {
    IdempotencyKey::parse("batch:acct-1:7").expect("key")
}

#[tokio::test]
async fn a_batch_claim_goes_to_its_accounts_path_with_token_owner_and_key_and_returns_every_item() {
    let fake = FakeService::start().await;
    fake.script("POST", CLAIMS_PATH, [json(200, &batch_answer())]);
    let c = client(&fake.base, |_| {});

    let answer = c.claim_batch("acct-1", token(), &owner(), &batch_key(), &claim_batch_request()).await;

    assert_eq!(answer, Ok(batch_answer()));
    let answer = answer.expect("answer");
    assert_eq!(answer.item(PAYOUT).and_then(|i| i.ok::<ClaimAck>()), Some(claim_ack()));
    assert_eq!(answer.items[1].envelope().map(|e| e.code), Some(ErrorCode::NotFound));
    let seen = fake.seen("POST", CLAIMS_PATH);
    assert_eq!(seen.len(), 1);
    let h = &seen[0].headers;
    assert_eq!(h.get("x-fencing-token").map(String::as_str), Some("7"));
    assert_eq!(h.get("x-owner-id").map(String::as_str), Some("executor-1/0"));
    assert_eq!(h.get("x-idempotency-key").map(String::as_str), Some("batch:acct-1:7"));
    assert_eq!(
        seen[0].body,
        serde_json::json!({"payouts": [{"payoutId": PAYOUT, "expectedState": "PENDING"},
            {"payoutId": Uuid::from_u128(9), "expectedState": "CLAIMED"}]})
    );
}

#[tokio::test]
async fn a_batch_post_is_re_sent_once_after_a_503_with_the_identical_request() {
    let fake = FakeService::start().await;
    fake.script("POST", POSTS_PATH, [refuse(ErrorCode::NotReady), json(200, &batch_answer())]);
    let c = client(&fake.base, |_| {});

    assert_eq!(
        c.post_batch("acct-1", token(), &owner(), &batch_key(), &post_batch_request()).await,
        Ok(batch_answer())
    );

    let seen = fake.seen("POST", POSTS_PATH);
    assert_eq!(seen.len(), 2, "C3 §3.8: one retry on a retry-safe 503");
    assert_eq!(seen[0].body, seen[1].body);
    assert_eq!(seen[0].headers.get("x-idempotency-key"), seen[1].headers.get("x-idempotency-key"));
    assert_eq!(
        seen[0].body,
        serde_json::json!({"payouts": [{"payoutId": PAYOUT, "railReference": "RR-1",
            "submissionId": Uuid::from_u128(2), "railOutcome": "ACKED"}]})
    );
}

#[tokio::test]
async fn a_fenced_or_unanswered_batch_is_a_refusal_of_the_whole_batch_and_never_re_sent() {
    let fake = FakeService::start().await;
    fake.script("POST", CLAIMS_PATH, [refuse(ErrorCode::FencedOut)]);
    fake.script("POST", POSTS_PATH, [Reply::Drop]);
    let c = client(&fake.base, |c| c.write_retries_max = 3);

    let fenced = c.claim_batch("acct-1", token(), &owner(), &batch_key(), &claim_batch_request()).await;
    let fenced = fenced.expect_err("fenced");
    assert!(
        matches!(fenced, PaymentRefusal::Refused { operation: Operation::ClaimBatch, status: 409, .. }),
        "{fenced:?}"
    );
    assert_eq!(fenced.code(), Some(ErrorCode::FencedOut));
    let lost = c.post_batch("acct-1", token(), &owner(), &batch_key(), &post_batch_request()).await;
    let lost = lost.expect_err("dropped");
    assert!(matches!(lost, PaymentRefusal::NoAnswer { operation: Operation::PostBatch, .. }), "{lost:?}");
    assert!(lost.outcome_unknown() && !lost.retry_safe());

    assert_eq!(fake.count("POST", CLAIMS_PATH), 1);
    assert_eq!(fake.count("POST", POSTS_PATH), 1);
}

#[tokio::test]
async fn a_batch_for_an_account_id_that_is_not_path_safe_is_refused_before_sending() {
    let fake = FakeService::start().await;
    let c = client(&fake.base, |_| {});
    let r = c.claim_batch("a/../b", token(), &owner(), &batch_key(), &claim_batch_request()).await;
    assert!(matches!(r, Err(PaymentRefusal::NothingSent { operation: Operation::ClaimBatch, .. })), "{r:?}");
    let r = c.post_batch("a b", token(), &owner(), &batch_key(), &post_batch_request()).await;
    assert!(matches!(r, Err(PaymentRefusal::NothingSent { operation: Operation::PostBatch, .. })), "{r:?}");
}
