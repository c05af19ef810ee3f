//! paydb's own guards (design §2, D2): whoever writes, the database refuses a payout
//! transition outside C2, a change to a payout's fixed columns, a lowered fence, an edit of
//! the ledger, and a payout or rail mark for an unknown account. Run on SQLite and on
//! PostgreSQL (`DLOCK_TEST_PG_URL`), through the very migrations the stores apply.

#![cfg(not(madsim))]

use std::collections::BTreeSet;

use dlock_contract::payout::{PayoutState, TRANSITIONS};
use dlock_payment_resource::store_sql::{PgPaymentStore, SqlitePaymentStore};
use dlock_testkit::TempDir;

const T0: &str = "2026-12-01T10:00:00+00:00";

/// One freshly migrated paydb, either dialect. Statements are test constants (no binds), so
/// the same text runs on both.
enum Paydb {
    /// The directory keeps the file alive.
    Sqlite {
        pool: sqlx::SqlitePool,
        _dir: TempDir,
    },
    Postgres(sqlx::PgPool),
}

impl Paydb {
    async fn sqlite() -> Paydb {
        let dir = TempDir::new("paydb-guards");
        let store = SqlitePaymentStore::open(&dlock_testkit::sqlite_url(&dir)).await.expect("open sqlite paydb");
        Paydb::Sqlite { pool: store.pool, _dir: dir }
    }

    async fn postgres() -> Paydb {
        let store = PgPaymentStore::open(&dlock_testkit::pg_database().await).await.expect("open postgres paydb");
        Paydb::Postgres(store.pool)
    }

    /// Runs `sql`: the rows it touched, or the database's refusal.
    async fn exec(&self, sql: &str) -> Result<u64, String> {
        let done = match self {
            Paydb::Sqlite { pool, .. } => sqlx::query(sql).execute(pool).await.map(|r| r.rows_affected()),
            Paydb::Postgres(pool) => sqlx::query(sql).execute(pool).await.map(|r| r.rows_affected()),
        };
        done.map_err(|e| match e {
            sqlx::Error::Database(db) => db.message().to_owned(),
            other => panic!("not a refusal but {other}"),
        })
    }

    async fn ok(&self, sql: &str) -> u64 {
        match self.exec(sql).await {
            Ok(n) => n,
            Err(e) => panic!("{sql}: refused: {e}"),
        }
    }

    async fn refused(&self, sql: &str) -> String {
        match self.exec(sql).await {
            Ok(n) => panic!("{sql}: accepted ({n} rows)"),
            Err(e) => e,
        }
    }

    async fn text(&self, sql: &str) -> String {
        match self {
            Paydb::Sqlite { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await,
            Paydb::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn int(&self, sql: &str) -> i64 {
        match self {
            Paydb::Sqlite { pool, .. } => sqlx::query_scalar(sql).fetch_one(pool).await,
            Paydb::Postgres(pool) => sqlx::query_scalar(sql).fetch_one(pool).await,
        }
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    }

    async fn account(&self, id: &str, currency: &str, balance: i64, fence: i64) {
        self.ok(&format!(
            "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
             VALUES ('{id}', 'CUSTOMER', '{currency}', {balance}, {fence}, '{T0}', '{T0}')"
        ))
        .await;
    }

    async fn payout(&self, id: &str, account: &str, state: PayoutState) {
        self.ok(&payout_insert(id, account, state)).await;
    }

    async fn state(&self, id: &str) -> String {
        self.text(&format!("SELECT state FROM payouts WHERE payout_id = '{id}'")).await
    }
}

fn payout_insert(id: &str, account: &str, state: PayoutState) -> String {
    format!(
        "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, attempt_count, \
         created_at, updated_at) VALUES ('{id}', '{account}', 100, 'EUR', 'ben', '{}', 0, '{T0}', '{T0}')",
        state.as_str()
    )
}

fn allowed(from: PayoutState, to: PayoutState) -> bool {
    dlock_contract::payout::may_write_state(from, to)
}

async fn database_refuses_a_transition_c2_does_not_allow(db: Paydb) {
    db.account("acct", "EUR", 0, 0).await;
    let mut n = 0;
    for from in PayoutState::ALL {
        for to in PayoutState::ALL {
            n += 1;
            let id = format!("p-{n}");
            db.payout(&id, "acct", from).await;
            let update = format!("UPDATE payouts SET state = '{}' WHERE payout_id = '{id}'", to.as_str());
            if allowed(from, to) {
                assert_eq!(db.ok(&update).await, 1, "{from:?} -> {to:?}");
                assert_eq!(db.state(&id).await, to.as_str());
            } else {
                let e = db.refused(&update).await;
                assert!(e.contains("not in C2"), "{from:?} -> {to:?}: {e}");
                assert_eq!(db.state(&id).await, from.as_str(), "a refused write changes nothing");
            }
        }
    }
    // The columns fixed at insert stay fixed, whatever the state does.
    db.account("other", "EUR", 0, 0).await;
    db.payout("fixed", "acct", PayoutState::Pending).await;
    for set in [
        "account_id = 'other'",
        "amount_minor = 99",
        "currency = 'USD'",
        "beneficiary_ref = 'someone-else'",
        "created_at = '2026-12-02T10:00:00+00:00'",
    ] {
        let e = db.refused(&format!("UPDATE payouts SET {set} WHERE payout_id = 'fixed'")).await;
        assert!(e.contains("never change"), "{set}: {e}");
    }
    assert_eq!(db.int("SELECT amount_minor FROM payouts WHERE payout_id = 'fixed'").await, 100);
    // The mutable columns still move.
    db.ok("UPDATE payouts SET attempt_count = 1, claim_token = 7, claimed_by = 'w', updated_at = created_at \
           WHERE payout_id = 'fixed'")
        .await;
}

async fn database_refuses_lowering_a_fence_or_editing_the_ledger(db: Paydb) {
    db.account("acct", "EUR", 500, 5).await;
    let raise = "UPDATE accounts SET fence = 7 WHERE account_id = 'acct'";
    assert_eq!(db.ok(raise).await, 1);
    assert_eq!(db.ok(raise).await, 1, "an equal fence is not a lowering");
    let e = db.refused("UPDATE accounts SET fence = 6 WHERE account_id = 'acct'").await;
    assert!(e.contains("fence only rises"), "{e}");
    assert_eq!(db.int("SELECT fence FROM accounts WHERE account_id = 'acct'").await, 7);
    for set in ["currency = 'USD'", "kind = 'FUNDING'"] {
        db.refused(&format!("UPDATE accounts SET {set} WHERE account_id = 'acct'")).await;
    }
    db.refused("UPDATE accounts SET balance_minor = -1 WHERE account_id = 'acct'").await;
    assert_eq!(db.text("SELECT currency FROM accounts WHERE account_id = 'acct'").await, "EUR");

    // System accounts keep no balance and no fence; only they may be named with '#'.
    let system = |id: &str, kind: &str, balance: i64, fence: i64| {
        format!(
            "INSERT INTO accounts (account_id, kind, currency, balance_minor, fence, created_at, updated_at) \
             VALUES ('{id}', '{kind}', 'EUR', {balance}, {fence}, '{T0}', '{T0}')"
        )
    };
    db.ok(&system("#funding:EUR", "FUNDING", 0, 0)).await;
    db.ok(&system("#settlement:EUR", "SETTLEMENT", 0, 0)).await;
    db.refused(&system("#settlement:USD", "SETTLEMENT", 0, 1)).await;
    db.refused(&system("#funding:USD", "FUNDING", 10, 0)).await;
    db.refused(&system("#x", "CUSTOMER", 0, 0)).await;
    db.refused(&system("plain", "FUNDING", 0, 0)).await;
    db.refused("UPDATE accounts SET fence = 1 WHERE account_id = '#settlement:EUR'").await;

    // The ledger is append-only; a payout is posted once.
    db.payout("p1", "acct", PayoutState::Posted).await;
    let entry = |entry: &str, posting: &str, payout: &str, account: &str, direction: &str| {
        format!(
            "INSERT INTO ledger_entries (entry_id, posting_id, payout_id, account_id, direction, amount_minor, \
             currency, fence, created_at) VALUES ('{entry}', '{posting}', {payout}, '{account}', '{direction}', 100, \
             'EUR', 7, '{T0}')"
        )
    };
    db.ok(&entry("e1", "post-1", "'p1'", "acct", "DEBIT")).await;
    db.ok(&entry("e2", "post-1", "'p1'", "#settlement:EUR", "CREDIT")).await;
    db.refused(&entry("e3", "post-2", "'p1'", "acct", "DEBIT")).await;
    db.refused(&entry("e4", "post-1", "NULL", "acct", "DEBIT")).await;
    db.refused(&entry("e5", "post-3", "NULL", "nobody", "DEBIT")).await;
    let e = db.refused("UPDATE ledger_entries SET amount_minor = 1 WHERE entry_id = 'e1'").await;
    assert!(e.contains("append-only"), "{e}");
    let e = db.refused("DELETE FROM ledger_entries WHERE entry_id = 'e2'").await;
    assert!(e.contains("append-only"), "{e}");
    assert_eq!(db.int("SELECT COUNT(*) FROM ledger_entries").await, 2);
    assert_eq!(db.int("SELECT amount_minor FROM ledger_entries WHERE entry_id = 'e1'").await, 100);
}

/// The operator's audit trail: append-only, one resolution per payout, only POSTED or FAILED,
/// and a reason of at least 8 characters.
async fn database_keeps_payout_resolutions_append_only(db: Paydb) {
    db.account("acct", "EUR", 500, 0).await;
    db.payout("p1", "acct", PayoutState::Posted).await;
    db.payout("p2", "acct", PayoutState::Failed).await;
    let row = |id: &str, payout: &str, resolved_as: &str, reason: &str| {
        format!(
            "INSERT INTO payout_resolutions (resolution_id, payout_id, resolved_as, operator, reason, rail_reference, \
             resolved_at) VALUES ('{id}', '{payout}', '{resolved_as}', 'ops', '{reason}', 'RR-1', '{T0}')"
        )
    };
    db.ok(&row("r1", "p1", "POSTED", "statement line 42")).await;
    db.refused(&row("r2", "p1", "FAILED", "statement line 43")).await;
    db.refused(&row("r3", "p2", "CLAIMED", "statement line 44")).await;
    db.refused(&row("r4", "p2", "FAILED", "short")).await;
    db.refused(&row("r5", "nope", "FAILED", "statement line 45")).await;
    let e = db.refused("UPDATE payout_resolutions SET reason = 'another reason' WHERE resolution_id = 'r1'").await;
    assert!(e.contains("append-only"), "{e}");
    let e = db.refused("DELETE FROM payout_resolutions WHERE resolution_id = 'r1'").await;
    assert!(e.contains("append-only"), "{e}");
    assert_eq!(db.int("SELECT COUNT(*) FROM payout_resolutions").await, 1);
    assert_eq!(db.text("SELECT reason FROM payout_resolutions WHERE resolution_id = 'r1'").await, "statement line 42");
}

async fn database_refuses_a_payout_for_an_unknown_account(db: Paydb) {
    db.refused(&payout_insert("p1", "nobody", PayoutState::Pending)).await;
    db.refused(&format!(
        "INSERT INTO rail_high_water (account_id, highest_token, updated_at) VALUES ('nobody', 3, '{T0}')"
    ))
    .await;
    assert_eq!(db.int("SELECT COUNT(*) FROM payouts").await, 0);
    db.account("nobody", "EUR", 0, 0).await;
    db.payout("p1", "nobody", PayoutState::Pending).await;
    db.ok(&format!("INSERT INTO rail_high_water (account_id, highest_token, updated_at) VALUES ('nobody', 3, '{T0}')"))
        .await;
    // A referenced account cannot be removed from under its payouts.
    db.refused("DELETE FROM accounts WHERE account_id = 'nobody'").await;
    assert_eq!(db.int("SELECT COUNT(*) FROM accounts").await, 1);
}

/// The backfill of the first migration: every account a seeded payout or rail mark names.
async fn migration_backfills_accounts_from_seeded_rows(db: Paydb, first: sqlx::migrate::Migrator) {
    // Runs the tree's first migration only, seeds rows as the rail-proxy did, then the rest.
    let mut only_first = first;
    let before = only_first.migrations.iter().take(1).cloned().collect::<Vec<_>>();
    let all = std::mem::replace(&mut only_first.migrations, std::borrow::Cow::Owned(before));
    match &db {
        Paydb::Sqlite { pool, .. } => only_first.run(pool).await,
        Paydb::Postgres(pool) => only_first.run(pool).await,
    }
    .expect("first migration");
    let seed = |id: &str, account: &str, currency: &str, at: &str| {
        format!(
            "INSERT INTO payouts (payout_id, account_id, amount_minor, currency, beneficiary_ref, state, \
             attempt_count, created_at, updated_at) VALUES ('{id}', '{account}', 100, '{currency}', 'ben', 'CLAIMED', 0, \
             '{at}', '{at}')"
        )
    };
    db.ok(&seed("p1", "a", "EUR", "2026-12-01T10:00:00+00:00")).await;
    db.ok(&seed("p2", "a", "EUR", "2026-12-01T09:00:00+00:00")).await;
    db.ok(&seed("p3", "b", "USD", "2026-12-01T11:00:00+00:00")).await;
    db.ok(&format!("INSERT INTO rail_high_water (account_id, highest_token, updated_at) VALUES ('a', 4, '{T0}')"))
        .await;
    db.ok(&format!("INSERT INTO rail_high_water (account_id, highest_token, updated_at) VALUES ('m', 2, '{T0}')"))
        .await;
    only_first.migrations = all;
    match &db {
        Paydb::Sqlite { pool, .. } => only_first.run(pool).await,
        Paydb::Postgres(pool) => only_first.run(pool).await,
    }
    .expect("the remaining migrations");
    assert_eq!(db.int("SELECT COUNT(*) FROM accounts").await, 3);
    for (id, currency) in [("a", "EUR"), ("b", "USD"), ("m", "XXX")] {
        let q = format!(
            "SELECT currency || ':' || kind || ':' || CAST(balance_minor AS TEXT) || ':' || CAST(fence AS TEXT) \
             FROM accounts WHERE account_id = '{id}'"
        );
        assert_eq!(db.text(&q).await, format!("{currency}:CUSTOMER:0:0"), "{id}");
    }
    assert_eq!(
        db.int("SELECT COUNT(*) FROM accounts WHERE account_id = 'a' AND created_at < updated_at").await,
        1,
        "created_at is the oldest payout's, updated_at the newest's"
    );
}

mod sqlite {
    use super::*;

    #[tokio::test]
    async fn database_refuses_a_transition_c2_does_not_allow() {
        super::database_refuses_a_transition_c2_does_not_allow(Paydb::sqlite().await).await;
    }

    #[tokio::test]
    async fn database_refuses_lowering_a_fence_or_editing_the_ledger() {
        super::database_refuses_lowering_a_fence_or_editing_the_ledger(Paydb::sqlite().await).await;
    }

    #[tokio::test]
    async fn database_refuses_a_payout_for_an_unknown_account() {
        super::database_refuses_a_payout_for_an_unknown_account(Paydb::sqlite().await).await;
    }

    #[tokio::test]
    async fn database_keeps_payout_resolutions_append_only() {
        super::database_keeps_payout_resolutions_append_only(Paydb::sqlite().await).await;
    }

    #[tokio::test]
    async fn migration_backfills_accounts_from_seeded_rows() {
        let dir = TempDir::new("paydb-backfill");
        let pool = dlock_db::sqlite_pool(&dlock_testkit::sqlite_url(&dir)).await.expect("sqlite pool");
        let migrator = sqlx::migrate!("../../migrations/paydb/sqlite");
        super::migration_backfills_accounts_from_seeded_rows(Paydb::Sqlite { pool, _dir: dir }, migrator).await;
    }

    #[tokio::test]
    async fn a_guard_refusal_is_corrupt_and_rolls_back_everything() {
        let dir = TempDir::new("paydb-corrupt");
        super::a_guard_refusal_is_corrupt_and_rolls_back_everything(&dlock_testkit::sqlite_url(&dir)).await;
    }
}

mod postgres {
    use super::*;

    #[tokio::test]
    async fn database_refuses_a_transition_c2_does_not_allow() {
        super::database_refuses_a_transition_c2_does_not_allow(Paydb::postgres().await).await;
    }

    #[tokio::test]
    async fn database_refuses_lowering_a_fence_or_editing_the_ledger() {
        super::database_refuses_lowering_a_fence_or_editing_the_ledger(Paydb::postgres().await).await;
    }

    #[tokio::test]
    async fn database_refuses_a_payout_for_an_unknown_account() {
        super::database_refuses_a_payout_for_an_unknown_account(Paydb::postgres().await).await;
    }

    #[tokio::test]
    async fn database_keeps_payout_resolutions_append_only() {
        super::database_keeps_payout_resolutions_append_only(Paydb::postgres().await).await;
    }

    #[tokio::test]
    async fn migration_backfills_accounts_from_seeded_rows() {
        let pool = dlock_db::pg_pool(&dlock_testkit::pg_database().await).await.expect("postgres pool");
        let migrator = sqlx::migrate!("../../migrations/paydb/postgres");
        super::migration_backfills_accounts_from_seeded_rows(Paydb::Postgres(pool), migrator).await;
    }

    #[tokio::test]
    async fn a_guard_refusal_is_corrupt_and_rolls_back_everything() {
        super::a_guard_refusal_is_corrupt_and_rolls_back_everything(&dlock_testkit::pg_database().await).await;
    }

    /// A claim stuck behind a transaction that holds the account's fence row gives up at
    /// the store's lock bound (`IDEMPOTENCY_WAIT_MS_MAX`) with `Unavailable` (503, retry-safe),
    /// changes nothing, and succeeds once the row is free. Without the bound it would wait
    /// for as long as the other transaction lives (this test would hang until its timeout).
    #[tokio::test]
    async fn a_claim_behind_a_held_row_gives_up_at_the_lock_bound_and_changes_nothing() {
        use chrono::{DateTime, Duration, Utc};
        use dlock_payment_resource::store::{
            Claim, ClaimOutcome, IdemRequest, Idempotent, NewAccount, NewPayout, Operation, SingleWrites, StoreError,
        };
        use uuid::Uuid;

        let url = dlock_testkit::pg_database().await;
        let store = PgPaymentStore::open(&url).await.expect("open");
        let pay = dlock_payment_resource::store_sql::open(&url).await.expect("open");
        let t0 = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("valid instant");
        let idem = |operation: Operation, target: &str, key: &str, token: i64| IdemRequest {
            operation,
            target_id: target.into(),
            key: key.into(),
            token,
            owner_id: "w".into(),
            fingerprint: "a".repeat(64),
            at: t0,
            expires_at: t0 + Duration::days(1),
        };
        let a = NewAccount {
            account_id: "held".into(),
            currency: "EUR".into(),
            opening_balance_minor: 1_000,
            posting_id: Uuid::new_v4(),
            entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
            at: t0,
        };
        let r = dlock_payment_resource::answer::Answering {
            shape: dlock_payment_resource::answer::Shape::Single,
            key: "k".into(),
            trace_id: "t".into(),
        };
        let created = pay.create_account(&a, &idem(Operation::CreateAccount, "accounts", "a", 0), &r).await;
        assert!(matches!(created, Ok(Idempotent::Executed { .. })), "{created:?}");
        let p = NewPayout {
            payout_id: Uuid::new_v4(),
            account_id: "held".into(),
            amount_minor: 100,
            currency: "EUR".into(),
            beneficiary_ref: "b".into(),
            at: t0,
        };
        let created = pay.create_payout(&p, &idem(Operation::CreatePayout, "payouts", "p", 0), &r).await;
        assert!(matches!(created, Ok(Idempotent::Executed { .. })), "{created:?}");

        let mut holder = store.pool.begin().await.expect("begin");
        sqlx::query("SELECT fence FROM accounts WHERE account_id = 'held' FOR UPDATE")
            .fetch_one(&mut *holder)
            .await
            .expect("hold the row");
        let c =
            Claim { payout_id: p.payout_id, token: 5, owner_id: "w".into(), expected: PayoutState::Pending, at: t0 };
        let target = p.payout_id.to_string();
        let i = idem(Operation::Claim, &target, "payout:k", 5);
        let stuck = pay.claim_one(&c, &i, &r).await;
        assert!(matches!(stuck, Err(StoreError::Unavailable(_))), "{stuck:?}");
        holder.rollback().await.expect("release the row");

        assert_eq!(pay.idempotency_record_count().await, Ok(1 + 1), "only the two creates are recorded");
        let view = pay.payout(p.payout_id).await.expect("read").expect("exists");
        assert_eq!(view.state, PayoutState::Pending);
        let claimed = pay.claim_one(&c, &i, &r).await;
        assert!(
            matches!(claimed, Ok(Idempotent::Executed { outcome: ClaimOutcome::Claimed { .. }, .. })),
            "{claimed:?}"
        );
    }
}

/// A write the store issues and a guard refuses is `Corrupt` (500), and the whole
/// transaction rolls back, identity row included. Here: a payout seeded through the proxy
/// on an account with no funds reaches RAIL_ACKED (seeds bypass the funds check), and its
/// post would take the balance below zero.
async fn a_guard_refusal_is_corrupt_and_rolls_back_everything(url: &str) {
    use chrono::{DateTime, Duration, Utc};
    use dlock_payment_resource::store::{IdemRequest, Operation, Post, SingleWrites};
    use dlock_rail_proxy::store::{Admission, Attempt, NewPayout, Resolution};
    use uuid::Uuid;

    let t0 = DateTime::<Utc>::from_timestamp_millis(1_795_000_000_000).expect("valid instant");
    let pay = dlock_payment_resource::store_sql::open(url).await.expect("open payment store");
    let rail = dlock_rail_proxy::store_sql::open(url).await.expect("open rail store");
    let payout_id = Uuid::new_v4();
    let seed = NewPayout {
        payout_id,
        account_id: "broke".into(),
        amount_minor: 700,
        currency: "EUR".into(),
        beneficiary_ref: "ben".into(),
        state: PayoutState::Claimed,
    };
    rail.insert_payout(&seed, t0).await.expect("seed");
    let submission_id = Uuid::new_v4();
    let attempt = Attempt {
        submission_id,
        payout_id,
        account_id: "broke".into(),
        presented_token: 3,
        owner_id: "worker-1".into(),
        idempotency_key: format!("payout:{payout_id}"),
        amount_minor: 700,
        currency: "EUR".into(),
        at: t0,
        fencing_enabled: true,
    };
    assert!(matches!(rail.admit(&attempt).await, Ok(Admission::Admitted { .. })));
    rail.resolve(submission_id, &Resolution::Acked { rail_reference: "RR".into() }, t0).await.expect("resolve");

    let post = Post {
        payout_id,
        token: 4,
        owner_id: "worker-1".into(),
        submission_id,
        rail_reference: "RR".into(),
        posting_id: Uuid::new_v4(),
        entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
        at: t0 + Duration::milliseconds(5),
    };
    let i = IdemRequest {
        operation: Operation::Post,
        target_id: payout_id.to_string(),
        key: format!("payout:{payout_id}"),
        token: 4,
        owner_id: "worker-1".into(),
        fingerprint: "f".repeat(64),
        at: post.at,
        expires_at: post.at + Duration::days(1),
    };
    let render = dlock_payment_resource::answer::Answering {
        shape: dlock_payment_resource::answer::Shape::Single,
        key: i.key.clone(),
        trace_id: "t".into(),
    };
    let answer = pay.post_one(&post, &i, &render).await;
    assert!(matches!(answer, Err(dlock_payment_resource::store::StoreError::Corrupt(_))), "{answer:?}");
    let view = pay.payout(payout_id).await.expect("read").expect("exists");
    assert_eq!(view.state, PayoutState::RailAcked);
    let account = pay.account("broke").await.expect("read").expect("exists");
    assert_eq!((account.balance_minor, account.fence, account.ledger_sum_minor), (0, 0, 0));
    assert_eq!(pay.ledger(None).await, Ok(Vec::new()));
    assert_eq!(pay.account("#settlement:EUR").await, Ok(None));
    assert_eq!(pay.idempotency_record_count().await, Ok(0));
}

/// Every `'X>Y'` literal in `sql` whose sides are upper-case state spellings.
fn pair_literals(sql: &str) -> Vec<(String, String)> {
    let bytes = sql.as_bytes();
    let is_name = |b: u8| b.is_ascii_uppercase() || b == b'_';
    let mut pairs = Vec::new();
    for (at, _) in sql.match_indices('>') {
        let mut start = at;
        while start > 0 && is_name(bytes[start - 1]) {
            start -= 1;
        }
        let mut end = at + 1;
        while end < bytes.len() && is_name(bytes[end]) {
            end += 1;
        }
        let quoted = start > 0 && bytes[start - 1] == b'\'' && bytes.get(end) == Some(&b'\'');
        if quoted && start < at && at + 1 < end {
            pairs.push((sql[start..at].to_owned(), sql[at + 1..end].to_owned()));
        }
    }
    pairs
}

#[test]
fn payout_state_trigger_matches_c2_transitions() {
    let expected: BTreeSet<(String, String)> = TRANSITIONS
        .iter()
        .filter(|(from, to, _)| from != to)
        .map(|(from, to, _)| (from.as_str().to_owned(), to.as_str().to_owned()))
        .collect();
    assert_eq!(expected.len(), TRANSITIONS.len() - 1, "C2's only same-state pair is CLAIMED>CLAIMED");
    for (tree, sql) in [
        ("postgres", include_str!("../../../migrations/paydb/postgres/20261201100100_extend_payouts_for_claims.sql")),
        ("sqlite", include_str!("../../../migrations/paydb/sqlite/20261201100100_extend_payouts_for_claims.sql")),
    ] {
        let found = pair_literals(sql);
        let set: BTreeSet<(String, String)> = found.iter().cloned().collect();
        assert_eq!(set, expected, "{tree}: the trigger's pairs are C2's transitions");
        assert_eq!(found.len(), set.len(), "{tree}: each pair is written once");
        for (from, to) in &found {
            assert!(PayoutState::parse(from).is_some() && PayoutState::parse(to).is_some(), "{tree}: {from}>{to}");
        }
    }
}

#[test]
fn pair_literals_reads_only_quoted_state_pairs() {
    let sql = "OLD.state || '>' || NEW.state NOT IN ('PENDING>CLAIMED', 'RAIL_ACKED>POSTED') -- A>B, 'x>Y'";
    assert_eq!(
        pair_literals(sql),
        vec![("PENDING".to_owned(), "CLAIMED".to_owned()), ("RAIL_ACKED".to_owned(), "POSTED".to_owned())]
    );
}
