//! The unit tests of `store_sql`: the folded statements, held to the rules they apply
//! (mostly SQLite; PostgreSQL runs the same text, and the tests named `on_postgresql_…`
//! need `DLOCK_TEST_PG_URL`; the conformance suite runs both stores). Invariants held: a
//! request its identity gate refuses raises no fence; a payout's account is read once;
//! the batch statements have one text whatever the batch's size; a claim's transitions
//! are conditional on its read; a post moves exactly when the post rule posts.

use super::claim::{
    pg_claim_batch_move_and_record_sql, pg_claim_one_move_and_record_sql, sqlite_claim_batch_move_and_record_sql,
    ClaimBatchWrites, PG_CLAIM_BATCH_READ_SQL, SQLITE_CLAIM_BATCH_READ_SQL,
};
use super::gate::pg_batch_gate_fence_sql;
use super::post::{
    pg_post_batch_writes_sql, pg_post_one_writes_sql, sqlite_post_batch_writes_sql, sqlite_post_one_writes_sql,
    PG_POST_BATCH_READ_SQL, POST_ONE_READ_SQL,
};
use super::*;
use crate::answer::Shape;
use crate::rules::{self, PostDecision, PostFacts};
use crate::store::{funding_account, settlement_account, AccountKind, Claim, Post};
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;

/// What the attempt table holds for the payout in one case: nothing, or one attempt
/// (submission id, outcome, reference).
type AttemptCase = Option<(Uuid, SubmissionOutcome, Option<&'static str>)>;

/// docs/performance.md "The SQLite writer thread": on SQLite the service runs its
/// writes on the process's SQLite writer thread (through the timing wrapper `start`
/// puts around the store); elsewhere in line.
#[tokio::test]
async fn the_service_runs_sqlite_writes_on_the_writer_thread() {
    let (url, _dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
    let store: Arc<dyn PaymentStore> = Arc::new(SqlitePaymentStore::open(&url).await.expect("open paydb"));
    let cfg = crate::service::PaymentConfig::default();
    let pr = crate::service::PaymentResource::start(store, cfg, dlock_rt::Clock::system()).await.expect("start");
    let thread = || async { std::thread::current().name().map(str::to_owned) };
    let on = pr.write(|_| thread()).await;
    assert_eq!(on.as_deref(), Some(dlock_db::SQLITE_WRITER_THREAD_NAME));
    let mem: Arc<dyn PaymentStore> = Arc::new(crate::store_mem::MemPaydb::new());
    let pr = crate::service::PaymentResource::start(
        mem,
        crate::service::PaymentConfig::default(),
        dlock_rt::Clock::system(),
    )
    .await
    .expect("start");
    let here = std::thread::current().name().map(str::to_owned);
    assert_eq!(pr.write(|_| thread()).await, here, "a store without a writer thread writes in line");
}

/// What the store tests below start from: a fresh store of a kind with the instant they
/// write at (`fresh`), and rows written by hand: the CUSTOMER account `acct` (EUR,
/// balance 500, fence 0), or a PENDING payout of 200 on it; or a payout deleted by hand.
macro_rules! seed {
    ($store:ty, $db:expr, fresh) => {{
        let (url, dir) = dlock_testkit::fresh_database($db).await;
        let store = <$store>::open(&url).await.expect("open paydb");
        let at = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant");
        (store, at, url, dir)
    }};
    ($store:expr, $sql:path, $at:expr, account) => {
        sqlx::query(&$sql(
            "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
             VALUES ('acct', 'CUSTOMER', 'EUR', 500, 0, $1, $1)",
        ))
        .bind($at)
        .execute(&$store.pool)
        .await
        .expect("account")
    };
    ($store:expr, $sql:path, deleted $id:expr) => {
        sqlx::query(&$sql("DELETE FROM payouts WHERE payout_id = $1"))
            .bind($id.to_string())
            .execute(&$store.pool)
            .await
            .expect("delete by hand")
    };
    ($store:expr, $sql:path, $at:expr, payout $id:expr) => {
        sqlx::query(&$sql(
            "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, \
             attempt_count, created_at, updated_at) VALUES ($1, 'acct', 200, 'EUR', 'ben', 'PENDING', 0, $2, $2)",
        ))
        .bind($id.to_string())
        .bind($at)
        .execute(&$store.pool)
        .await
        .expect("payout")
    };
}

/// The identity gate and the fence are chained in SQL: on SQLite one batch with the
/// statement after the fence
/// (docs/performance.md "SQLite: statements batched into one call"), on PostgreSQL one
/// statement (docs/performance.md "Claims and posts: folded statements"). A request
/// whose identity has a live record is answered from it (a replay, or a conflict for
/// another fingerprint) and raises no fence and moves nothing, even with the account's
/// fence below its token (a state the API never builds: a committed record's request
/// raised the fence to its token).
macro_rules! a_refused_gate_raises_no_fence {
    ($name:ident, $store:ty, $db:expr, $sql:path) => {
        #[tokio::test]
        async fn $name() {
            let (store, at, _url, _dir) = seed!($store, $db, fresh);
            let payout_id = Uuid::from_u128(77);
            seed!(store, $sql, at, account);
            seed!(store, $sql, at, payout payout_id);
            sqlx::query(&$sql(
                "INSERT INTO idempotency_records (operation, target_id, idempotency_key, fencing_token, \
                 request_sha256, owner_id, response_status, response_body, created_at, expires_at) \
                 VALUES ('CLAIM', $1, 'payout:k', 5, $2, 'o', 200, $3, $4, $5)",
            ))
            .bind(payout_id.to_string())
            .bind("a".repeat(64))
            .bind(b"{}".to_vec())
            .bind(at)
            .bind(at + chrono::Duration::days(1))
            .execute(&store.pool)
            .await
            .expect("live record");
            let claim = Claim { payout_id, token: 5, owner_id: "o".into(), expected: PayoutState::Pending, at };
            let identity = |fingerprint: &str| IdemRequest {
                operation: crate::store::Operation::Claim,
                target_id: payout_id.to_string(),
                key: "payout:k".into(),
                token: 5,
                owner_id: "o".into(),
                fingerprint: fingerprint.into(),
                at,
                expires_at: at + chrono::Duration::days(1),
            };
            let answering = Answering { shape: Shape::Single, key: "payout:k".into(), trace_id: "t".into() };
            let batch = claim.batch_of_one("acct");
            let replayed = store.claim(&batch, &identity(&"a".repeat(64)), &answering).await.expect("claim");
            assert_eq!(replayed, Idempotent::Replayed(StoredResponse { status: 200, body: b"{}".to_vec() }));
            let conflict = store.claim(&batch, &identity(&"b".repeat(64)), &answering).await.expect("claim");
            assert_eq!(conflict, Idempotent::Conflict);
            let fence: i64 = sqlx::query_scalar("SELECT fence FROM accounts WHERE account_id = 'acct'")
                .fetch_one(&store.pool)
                .await
                .expect("fence");
            let state: String = sqlx::query_scalar(&$sql("SELECT state FROM payouts WHERE payout_id = $1"))
                .bind(payout_id.to_string())
                .fetch_one(&store.pool)
                .await
                .expect("state");
            assert_eq!((fence, state.as_str()), (0, "PENDING"), "the refused requests wrote nothing");
        }
    };
}

a_refused_gate_raises_no_fence!(
    a_request_its_identity_gate_refuses_raises_no_fence_and_moves_nothing,
    SqlitePaymentStore,
    dlock_testkit::Db::Sqlite,
    sqlite_sql
);
a_refused_gate_raises_no_fence!(
    on_postgresql_a_request_its_identity_gate_refuses_raises_no_fence_and_moves_nothing,
    PgPaymentStore,
    dlock_testkit::Db::Postgres,
    pg_sql
);

/// docs/performance.md "The grant check's account read": the grant check reads a
/// payout's account from paydb once per store, then from memory (shown by deleting the
/// payout row by hand: the store still answers its account, a freshly opened one does
/// not); an unknown payout is read every time, so a payout created after a miss is
/// found.
macro_rules! a_payouts_account_is_read_once {
    ($name:ident, $store:ty, $db:expr, $sql:path) => {
        #[tokio::test]
        async fn $name() {
            let (store, at, url, _dir) = seed!($store, $db, fresh);
            let payout_id = Uuid::from_u128(78);
            seed!(store, $sql, at, account);
            assert_eq!(store.payout_account(payout_id).await.expect("read"), None);
            seed!(store, $sql, at, payout payout_id);
            assert_eq!(store.payout_account(payout_id).await.expect("read").as_deref(), Some("acct"));
            seed!(store, $sql, deleted payout_id);
            let remembered = store.payout_account(payout_id).await.expect("read");
            assert_eq!(remembered.as_deref(), Some("acct"), "the second read came from paydb");
            let fresh = <$store>::open(&url).await.expect("reopen paydb");
            assert_eq!(fresh.payout_account(payout_id).await.expect("read"), None);

            // A payout this store created is remembered from its commit: not read at all.
            let created_id = Uuid::from_u128(79);
            let new = NewPayout {
                payout_id: created_id,
                account_id: "acct".into(),
                amount_minor: 100,
                currency: "EUR".into(),
                beneficiary_ref: "ben".into(),
                at,
            };
            let identity = IdemRequest {
                operation: crate::store::Operation::CreatePayout,
                target_id: "acct".into(),
                key: "create:k".into(),
                token: 0,
                owner_id: String::new(),
                fingerprint: "c".repeat(64),
                at,
                expires_at: at + chrono::Duration::days(1),
            };
            let answering = Answering { shape: Shape::Single, key: "create:k".into(), trace_id: "t".into() };
            let created = fresh.create_payout(&new, &identity, &answering).await.expect("create");
            assert!(matches!(created, Idempotent::Executed { outcome: CreatePayoutOutcome::Created(_), .. }));
            seed!(fresh, $sql, deleted created_id);
            let remembered = fresh.payout_account(created_id).await.expect("read");
            assert_eq!(remembered.as_deref(), Some("acct"), "the created payout's account was read from paydb");
        }
    };
}

a_payouts_account_is_read_once!(
    a_payouts_account_is_read_from_paydb_once_and_an_unknown_payout_every_time,
    SqlitePaymentStore,
    dlock_testkit::Db::Sqlite,
    sqlite_sql
);
a_payouts_account_is_read_once!(
    on_postgresql_a_payouts_account_is_read_from_paydb_once_and_an_unknown_payout_every_time,
    PgPaymentStore,
    dlock_testkit::Db::Postgres,
    pg_sql
);

/// docs/performance.md "Claims and posts: folded statements": the PostgreSQL
/// gate-and-fence statement is the gate's and the fence's texts, the fence chained to
/// the gate, placeholders numbered on (8 for the gate, then 4).
#[test]
fn the_postgresql_gate_and_fence_statement_chains_the_fence_to_the_gate() {
    let q = pg_batch_gate_fence_sql();
    assert!(q.starts_with("WITH gate AS (INSERT INTO idempotency_records"), "{q}");
    assert!(q.contains("fence AS (UPDATE accounts SET fence = $9, updated_at = $10"), "{q}");
    assert!(
        q.contains("WHERE account_id = $11 AND kind = 'CUSTOMER' AND fence < $12 AND EXISTS (SELECT 1 FROM gate)"),
        "{q}"
    );
    assert!(!q.contains("$13"), "{q}");
}

/// E-19: a batch's statements are built once, whatever its size (the payouts travel as
/// one array or JSON bind), with their placeholders in order (the builders assert it); on
/// PostgreSQL a claim that moves one payout has its own move statement, with the same
/// placeholders as scalars and no array.
#[test]
fn the_batch_statements_have_one_text_whatever_the_batch_size() {
    let pg = [
        pg_batch_gate_fence_sql(),
        PG_CLAIM_BATCH_READ_SQL,
        PG_POST_BATCH_READ_SQL,
        pg_claim_batch_move_and_record_sql(),
        pg_post_batch_writes_sql(),
        pg_claim_one_move_and_record_sql(),
    ];
    for (q, last) in pg.iter().zip([12, 2, 3, 14, 25, 14]) {
        assert!(q.contains(&format!("${last}")) && !q.contains(&format!("${}", last + 1)), "{q}");
    }
    assert!(pg_batch_gate_fence_sql().contains("WHERE account_id = $11 AND kind = 'CUSTOMER' AND fence < $12"));
    assert!(PG_CLAIM_BATCH_READ_SQL.ends_with("= ANY($2)"));
    // The one-payout forms: no array, no `json_each` (the builders assert the placeholders).
    let one =
        [pg_claim_one_move_and_record_sql(), pg_post_one_writes_sql(), sqlite_post_one_writes_sql(), POST_ONE_READ_SQL];
    for q in one {
        assert!(!q.contains("unnest") && !q.contains("[]") && !q.contains("json_each"), "{q}");
    }
    for q in [sqlite_claim_batch_move_and_record_sql(), sqlite_post_batch_writes_sql()] {
        assert!(!q.contains('$'), "SQLite binds anonymously: {q}");
    }
    assert!(SQLITE_CLAIM_BATCH_READ_SQL.ends_with("IN (SELECT value FROM json_each($2))"));
}

/// E-19: a batch claim's transitions are conditional, each on the state and attempt count
/// the batch's read saw (a single claim is a batch of one): a payout that moved since is not written
/// (the caller then answers `Unavailable` and rolls back).
macro_rules! a_batch_claim_moves_only_what_it_read {
    ($name:ident, $store:ty, $db:expr, $sql:path) => {
        #[tokio::test]
        async fn $name() {
            let (store, at, _url, _dir) = seed!($store, $db, fresh);
            let (p1, p2, p3) = (Uuid::from_u128(81), Uuid::from_u128(82), Uuid::from_u128(83));
            seed!(store, $sql, at, account);
            for p in [p1, p2, p3] {
                seed!(store, $sql, at, payout p);
            }
            let b = ClaimBatch { account_id: "acct".into(), token: 5, owner_id: "o".into(), payouts: Vec::new(), at };
            let identity = IdemRequest {
                operation: crate::store::Operation::Claim,
                target_id: "account:acct".into(),
                key: "k".into(),
                token: 5,
                owner_id: "o".into(),
                fingerprint: "a".repeat(64),
                at,
                expires_at: at + chrono::Duration::days(1),
            };
            let response = StoredResponse { status: 200, body: b"{}".to_vec() };
            let (pending, claimed) = (PayoutState::Pending, PayoutState::Claimed);
            let moves = vec![
                (p1.to_string(), claimed, pending, 0),
                // Read as CLAIMED (it is PENDING now), read with another attempt count.
                (p2.to_string(), claimed, claimed, 0),
                (p3.to_string(), claimed, pending, 1),
            ];
            let w = ClaimBatchWrites { b: &b, at, moves, identity: &identity, response: &response };
            let mut tx = store.pool.begin().await.expect("begin");
            let (moved, recorded) = <$store>::claim_batch_move_and_record(&mut tx, &w).await.expect("moves");
            assert_eq!((moved, recorded), (1, 0), "only p1 moved; no identity row to record in");
            let state: String = sqlx::query_scalar(&$sql("SELECT state FROM payouts WHERE payout_id = $1"))
                .bind(p1.to_string())
                .fetch_one(&mut *tx)
                .await
                .expect("state");
            assert_eq!(state, "CLAIMED");
            tx.rollback().await.expect("rollback");
            // One payout at a time (PostgreSQL's one-payout statement): the same verdicts.
            let alone = [
                ((p1.to_string(), claimed, pending, 0), 1),
                ((p2.to_string(), claimed, claimed, 0), 0),
                ((p3.to_string(), claimed, pending, 1), 0),
            ];
            for (one, expected) in alone {
                let w = ClaimBatchWrites { b: &b, at, moves: vec![one.clone()], identity: &identity, response: &response };
                let mut tx = store.pool.begin().await.expect("begin");
                let (moved, _) = <$store>::claim_batch_move_and_record(&mut tx, &w).await.expect("move");
                assert_eq!(moved, expected, "{one:?} alone");
                tx.rollback().await.expect("rollback");
            }
        }
    };
}

a_batch_claim_moves_only_what_it_read!(
    a_batch_claims_transitions_move_only_payouts_still_as_its_read_saw_them,
    SqlitePaymentStore,
    dlock_testkit::Db::Sqlite,
    sqlite_sql
);
a_batch_claim_moves_only_what_it_read!(
    on_postgresql_a_batch_claims_transitions_move_only_payouts_still_as_its_read_saw_them,
    PgPaymentStore,
    dlock_testkit::Db::Postgres,
    pg_sql
);

/// The post's rule, held to the store's real post (a batch of one, as the API runs a single
/// post): for each of 8 states × 6 attempt tables, on an account and payout of its own, the
/// payout moves to POSTED exactly when `rules::decide_post` says `Posted`; otherwise it is
/// left as it was and the post's one item is the rule's refusal.
#[tokio::test]
async fn post_statement_moves_exactly_when_the_post_rule_posts() {
    let (url, _dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
    let store = SqlitePaymentStore::open(&url).await.expect("open paydb");
    let at = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant");
    let mut cases = 0;
    for state in PayoutState::ALL {
        for shape in 0..6 {
            cases += 1;
            let account = format!("acct-{cases}");
            let payout_id = Uuid::from_u128(1_000 + cases);
            // The attempt the post names, and another; distinct per case (submission ids
            // are unique).
            let named = Uuid::from_u128(100_000 + cases);
            let other = Uuid::from_u128(200_000 + cases);
            let attempts: [AttemptCase; 6] = [
                None,
                Some((named, SubmissionOutcome::Acked, Some("RR-1"))),
                Some((named, SubmissionOutcome::Acked, Some("RR-other"))),
                Some((other, SubmissionOutcome::Acked, Some("RR-1"))),
                Some((named, SubmissionOutcome::Timeout, None)),
                Some((named, SubmissionOutcome::Rejected, None)),
            ];
            let attempt = attempts[shape];
            sqlx::query(
                "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
                 VALUES (?1, 'CUSTOMER', 'EUR', 500, 0, ?2, ?2)",
            )
            .bind(&account)
            .bind(at)
            .execute(&store.pool)
            .await
            .expect("account");
            sqlx::query(
                "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, \
                 attempt_count, created_at, updated_at) VALUES (?1, ?2, 200, 'EUR', 'ben', ?3, 1, ?4, ?4)",
            )
            .bind(payout_id.to_string())
            .bind(&account)
            .bind(state.as_str())
            .bind(at)
            .execute(&store.pool)
            .await
            .expect("payout");
            if let Some((submission_id, outcome, reference)) = attempt {
                sqlx::query(
                    "INSERT INTO rail_submission (submission_id, payout_id, account_id, presented_token, owner_id, \
                     idempotency_key, amount_minor, currency, outcome, rail_reference, submitted_at, resolved_at) \
                     VALUES (?1, ?2, ?3, 1, 'o', 'k', 200, 'EUR', ?4, ?5, ?6, ?6)",
                )
                .bind(submission_id.to_string())
                .bind(payout_id.to_string())
                .bind(&account)
                .bind(outcome.as_str())
                .bind(reference)
                .bind(at)
                .execute(&store.pool)
                .await
                .expect("attempt");
            }
            let post = Post {
                payout_id,
                token: 2,
                owner_id: "o".into(),
                submission_id: named,
                rail_reference: "RR-1".into(),
                posting_id: Uuid::from_u128(300_000 + cases),
                entry_ids: [Uuid::from_u128(400_000 + cases), Uuid::from_u128(500_000 + cases)],
                at,
            };
            let identity = IdemRequest {
                operation: crate::store::Operation::Post,
                target_id: payout_id.to_string(),
                key: format!("payout:post-{cases}"),
                token: 2,
                owner_id: "o".into(),
                fingerprint: "a".repeat(64),
                at,
                expires_at: at + chrono::Duration::days(1),
            };
            let answering = Answering { shape: Shape::Single, key: identity.key.clone(), trace_id: "t".into() };
            let acked = matches!(attempt, Some((id, SubmissionOutcome::Acked, Some("RR-1"))) if id == named);
            let facts = PostFacts { state, acked, balance_minor: 500, amount_minor: 200 };
            let rule = rules::decide_post(&facts).expect("covered");
            let case = format!("{state:?} with {attempt:?}");
            let decided = store.post(&post.batch_of_one(&account), &identity, &answering).await.expect("post");
            let Idempotent::Executed { outcome, .. } = decided else {
                panic!("{case}: a fresh identity was not executed: {decided:?}");
            };
            let outcome = outcome.into_single(&account);
            let after: String = sqlx::query_scalar("SELECT state FROM payouts WHERE payout_id = ?1")
                .bind(payout_id.to_string())
                .fetch_one(&store.pool)
                .await
                .expect("state");
            match rule {
                PostDecision::Posted { .. } => {
                    assert_eq!(after, "POSTED", "{case}");
                    assert!(matches!(outcome, PostOutcome::Posted { .. }), "{case}: {outcome:?}");
                }
                PostDecision::NotClaimable { state } => {
                    assert_eq!(after, state.as_str(), "{case}: a refused post moves nothing");
                    assert_eq!(outcome, PostOutcome::NotClaimable { state }, "{case}");
                }
                PostDecision::RailMismatch => {
                    assert_eq!(after, state.as_str(), "{case}: a refused post moves nothing");
                    assert_eq!(outcome, PostOutcome::RailMismatch, "{case}");
                }
            }
        }
    }
    assert_eq!(cases, 8 * 6);
}

#[tokio::test]
async fn a_posting_is_one_insert_of_both_entries() {
    let (url, _dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
    let store = SqlitePaymentStore::open(&url).await.expect("open paydb");
    let at = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("instant");
    let mut tx = store.pool.begin().await.expect("begin");
    dlock_paydb::sql::sqlite::upsert_system_accounts(
        &mut tx,
        &[(funding_account("EUR"), AccountKind::Funding), (settlement_account("EUR"), AccountKind::Settlement)],
        "EUR",
        at,
    )
    .await
    .expect("system accounts");
    let a = NewAccount {
        account_id: "acct".into(),
        currency: "EUR".into(),
        opening_balance_minor: 50,
        posting_id: Uuid::from_u128(1),
        entry_ids: [Uuid::from_u128(2), Uuid::from_u128(3)],
        at,
    };
    sqlx::query(
        "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
         VALUES ('acct', 'CUSTOMER', 'EUR', 50, 0, ?1, ?1)",
    )
    .bind(at)
    .execute(&mut *tx)
    .await
    .expect("account");
    let entries = a.opening_entries(at);
    dlock_paydb::sql::sqlite::insert_entries(&mut tx, &entries).await.expect("one insert");
    let rows: Vec<(String, String, i64)> =
        sqlx::query_as("SELECT entry_id, direction, amount_minor FROM ledger_entries ORDER BY entry_id")
            .fetch_all(&mut *tx)
            .await
            .expect("read");
    let expected: Vec<(String, String, i64)> =
        entries.iter().map(|e| (e.entry_id.to_string(), e.direction.as_str().to_owned(), e.amount_minor)).collect();
    assert_eq!(rows, expected);
    tx.rollback().await.expect("rollback");
}

#[test]
fn cursor_secret_must_be_32_bytes_of_hex() {
    use dlock_paydb::events::sql::parse_secret;
    assert_eq!(parse_secret(&"ab".repeat(32)), Ok([0xab; 32]));
    assert!(matches!(parse_secret("ab"), Err(StoreError::Corrupt(_))));
    assert!(matches!(parse_secret(&"zz".repeat(32)), Err(StoreError::Corrupt(_))));
}
