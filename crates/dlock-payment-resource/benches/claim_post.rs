//! Fenced claims and posts per second through the payment-resource's store, next to the raw
//! conditional-UPDATE rate of the same database measured in the same run on the same
//! machine. Prints the ratio (design §8 item 6).
//!
//! `cargo bench -p dlock-payment-resource --bench claim_post`
//!
//! - SQLite always (a temp file, the embedded default's pool: WAL, synchronous=FULL).
//! - PostgreSQL when `DLOCK_BENCH_PG_URL` (or `DLOCK_TEST_PG_URL`) names a server; the bench
//!   makes a fresh database on it.
//! - `DLOCK_BENCH_N` payouts per run (default 400), spread over `DLOCK_BENCH_CONCURRENCY`
//!   accounts (default 4), one task per account, all accounts at once.
//!
//! The store is driven through the `PaymentStore` trait, with a real idempotency identity
//! (fingerprint included), as the fenced-write pipeline builds it: a single claim or post is
//! the batch of one of its payout's account, and the store renders the answer it records.
//! Per account, tokens rise strictly and are never reused:
//! 1. claims, PENDING→CLAIMED with tokens `1..=m` (timed);
//! 2. the rail-proxy's `admit` and `resolve(Acked)` for each payout, CLAIMED→RAIL_ACKED
//!    (untimed: the proxy has its own bench);
//! 3. posts, RAIL_ACKED→POSTED with newer tokens `m+1..=2m` (timed).
//!
//! Each timed claim and post starts with the grant check's store read (the handler's
//! `verify_grant` reads the payout's account before the transaction), so the cost of that
//! read is in the rates.
//!
//! The baseline runs on the same pool: one row per account and `UPDATE bench_fence SET fence
//! = $1 WHERE id = $2 AND fence < $1`, one autocommitted statement per operation, the same
//! number of operations (2N) per account split and concurrency. A claim or a post is one
//! transaction of several statements (the idempotency row, the fence, the transition and,
//! for a post, two ledger entries) with one commit, so the ratio measures what the extra
//! statements cost next to the single fenced write. The baseline is timed on its second run,
//! after an untimed one, so that like the rows it runs in a steady state (a fresh SQLite
//! file's first commits also grow its WAL). Nothing here asserts on timings.
//!
//! **Batches** (C3-extensions E-19): a second row per database runs the same payouts through
//! P2b and P3b, `DLOCK_BENCH_BATCH` payouts of an account per batch (default 16, the
//! executor's `executor.payouts-per-grant-max`): one token per batch for its claims, one
//! newer for its posts, each fence passed once per batch; the rail-proxy moves each batch's
//! payouts to RAIL_ACKED with one `admit_batch` and one `resolve_batch` (untimed). Its rates
//! are payouts per second, against the same baseline of single conditional UPDATEs.
#![allow(clippy::disallowed_methods, reason = "a benchmark times itself on the host's clock, outside the services")]

#[cfg(madsim)]
fn main() {}

#[cfg(not(madsim))]
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(bench::run());
}

#[cfg(not(madsim))]
mod bench {
    use std::sync::Arc;
    // Real wall-clock time on purpose: a bench measures the real machine, and benches are
    // built only outside the simulation (`cfg(not(madsim))`), so no seam is bypassed.
    use std::time::Instant;

    use chrono::{DateTime, Utc};
    use dlock_contract::payment::{ClaimRequest, NewAccountRequest, PostRequest};
    use dlock_contract::payout::PayoutState;
    use dlock_db::Dialect;
    use dlock_payment_resource::answer::{Answering, Shape};
    use dlock_payment_resource::idempotency::fingerprint;
    use dlock_payment_resource::store::{
        Claim, ClaimBatch, ClaimBatchOutcome, ClaimBatchPayout, ClaimOutcome, CreateAccountOutcome,
        CreatePayoutOutcome, IdemRequest, Idempotent, NewAccount, NewPayout, Operation, PaymentStore, Post, PostBatch,
        PostBatchOutcome, PostBatchPayout, PostOutcome,
    };
    use dlock_payment_resource::store_sql::{PgPaymentStore, SqlitePaymentStore};
    use dlock_rail_proxy::store::{Admission, Attempt, Checked, RailStore, Resolution, Unstamped};
    use dlock_rt::Clock;
    use uuid::Uuid;

    const AMOUNT_MINOR: i64 = 100;
    const CURRENCY: &str = "EUR";
    /// `payment.idempotency.retention-ms`'s default, 24 h.
    const RETENTION_MS: i64 = 86_400_000;

    pub async fn run() {
        let n = dlock_testkit::bench::env_usize("DLOCK_BENCH_N", 400).max(1);
        let accounts = dlock_testkit::bench::env_usize("DLOCK_BENCH_CONCURRENCY", 4).clamp(1, n);
        let batch =
            dlock_testkit::bench::env_usize("DLOCK_BENCH_BATCH", 16).clamp(2, dlock_contract::batch::BATCH_PAYOUTS_MAX);
        println!(
            "payment-resource claim+post bench: n={n} payouts, {accounts} accounts (one task each); batches of {batch}"
        );
        println!(
            "{:<10} {:>10} {:>10} {:>12} {:>14} {:>7}",
            "database", "claims/s", "posts/s", "combined/s", "cond UPDATE/s", "ratio"
        );
        let dir = dlock_testkit::TempDir::new("bench");
        let batched = dlock_testkit::TempDir::new("bench-batch");
        let baseline = report("sqlite", &dlock_testkit::sqlite_url(&dir), n, accounts, 1, None).await;
        let sqlite_b = dlock_testkit::sqlite_url(&batched);
        report(&format!("sqlite b{batch}"), &sqlite_b, n, accounts, batch, Some(baseline)).await;
        match dlock_testkit::bench::pg_admin_url() {
            Some(admin) => {
                let url = dlock_testkit::pg_database_on(&admin).await;
                let baseline = report("postgres", &url, n, accounts, 1, None).await;
                let url = dlock_testkit::pg_database_on(&admin).await;
                report(&format!("postgres b{batch}"), &url, n, accounts, batch, Some(baseline)).await;
            }
            None => println!("postgres   (skipped: set DLOCK_BENCH_PG_URL or DLOCK_TEST_PG_URL to include it)"),
        }
        println!(
            "combined = 2N / (claim time + post time), N payouts; ratio = combined / cond UPDATE; \
             bK: K payouts per batch (P2b, P3b), against the same database kind's baseline"
        );
    }

    /// One row: `batch` 1 runs P2 and P3, more runs P2b and P3b with that many payouts per
    /// batch. The baseline is measured on this database unless `baseline` gives the one
    /// measured before on the same kind. Returns the baseline.
    async fn report(name: &str, url: &str, n: usize, accounts: usize, batch: usize, baseline: Option<f64>) -> f64 {
        let (store, pool) = open(url).await;
        let baseline = match baseline {
            Some(b) => b,
            None => {
                // One untimed run first: on a fresh SQLite file the first run also grows the
                // WAL (each commit's flush then writes the file's new size too), which the
                // rows after it never pay; measured that way the baseline read about two
                // thirds of its steady rate (docs/performance.md "How the benches measure").
                conditional_update_rate(&pool, 2 * n, accounts).await;
                conditional_update_rate(&pool, 2 * n, accounts).await
            }
        };
        let r = claim_post_rates(store, url, n, accounts, batch).await;
        println!(
            "{name:<12} {:>10.0} {:>10.0} {:>12.0} {baseline:>14.0} {:>7.2}",
            r.claims,
            r.posts,
            r.combined,
            r.combined / baseline
        );
        baseline
    }

    /// The store and its pool: the baseline runs on the very connections the store uses.
    async fn open(url: &str) -> (Arc<dyn PaymentStore>, Pool) {
        match Dialect::of_url(url).expect("dialect") {
            Dialect::Sqlite => {
                let s = SqlitePaymentStore::open(url).await.expect("open paydb");
                let pool = Pool::Sqlite(s.pool.clone());
                (Arc::new(s), pool)
            }
            Dialect::Postgres => {
                let s = PgPaymentStore::open(url).await.expect("open paydb");
                let pool = Pool::Pg(s.pool.clone());
                (Arc::new(s), pool)
            }
        }
    }

    #[derive(Clone)]
    enum Pool {
        Sqlite(sqlx::SqlitePool),
        Pg(sqlx::PgPool),
    }

    impl Pool {
        /// Runs one autocommitted statement binding `(value, id)`; returns rows affected.
        async fn execute(&self, sql: &str, value: i64, id: &str) -> u64 {
            match self {
                Pool::Sqlite(p) => {
                    let sql = Dialect::Sqlite.sql(sql);
                    sqlx::query(&sql).bind(value).bind(id).execute(p).await.expect("sqlite statement").rows_affected()
                }
                Pool::Pg(p) => {
                    sqlx::query(sql).bind(value).bind(id).execute(p).await.expect("pg statement").rows_affected()
                }
            }
        }
    }

    /// How many of `total` payouts (or baseline operations) each account gets: item `i` goes to
    /// account `i % accounts`.
    fn per_account(total: usize, accounts: usize) -> Vec<usize> {
        (0..accounts).map(|w| (0..total).filter(|i| i % accounts == w).count()).collect()
    }

    fn account_id(w: usize) -> String {
        format!("bench-{w}")
    }

    /// One row per account, `ops` conditional UPDATEs spread over them with strictly
    /// increasing values per row, one task per account, each statement its own commit.
    async fn conditional_update_rate(pool: &Pool, ops: usize, accounts: usize) -> f64 {
        let create = match pool {
            Pool::Sqlite(_) => "CREATE TABLE IF NOT EXISTS bench_fence (id TEXT PRIMARY KEY, fence INTEGER NOT NULL)",
            Pool::Pg(_) => "CREATE TABLE IF NOT EXISTS bench_fence (id TEXT PRIMARY KEY, fence BIGINT NOT NULL)",
        };
        match pool {
            Pool::Sqlite(p) => {
                sqlx::query(create).execute(p).await.expect("create bench_fence");
            }
            Pool::Pg(p) => {
                sqlx::query(create).execute(p).await.expect("create bench_fence");
            }
        }
        for w in 0..accounts {
            let seeded = pool
                .execute(
                    "INSERT INTO bench_fence (id, fence) VALUES ($2, $1) ON CONFLICT (id) DO UPDATE SET fence = $1",
                    0,
                    &account_id(w),
                )
                .await;
            assert_eq!(seeded, 1, "seed bench_fence");
        }
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (w, count) in per_account(ops, accounts).into_iter().enumerate() {
            let pool = pool.clone();
            tasks.push(tokio::spawn(async move {
                let id = account_id(w);
                for token in 1..=count as i64 {
                    let moved = pool
                        .execute("UPDATE bench_fence SET fence = $1 WHERE id = $2 AND fence < $1", token, &id)
                        .await;
                    assert_eq!(moved, 1, "a strictly greater value must pass the fence");
                }
            }));
        }
        for t in tasks {
            t.await.expect("baseline task");
        }
        ops as f64 / start.elapsed().as_secs_f64()
    }

    struct Rates {
        claims: f64,
        posts: f64,
        combined: f64,
    }

    /// One payout as the phases carry it.
    #[derive(Clone)]
    struct Item {
        payout_id: Uuid,
        claim_token: i64,
        post_token: i64,
        submission_id: Uuid,
        rail_reference: String,
    }

    fn now() -> DateTime<Utc> {
        dlock_contract::time::truncate_ms(Clock::system().wall())
    }

    /// The identity of one request, as `PaymentResource::identity` builds it.
    fn identity<T: serde::Serialize>(
        operation: Operation,
        target: &str,
        key: &str,
        token: i64,
        owner: &str,
        body: &T,
        at: DateTime<Utc>,
    ) -> IdemRequest {
        IdemRequest {
            operation,
            target_id: target.to_owned(),
            key: key.to_owned(),
            token,
            owner_id: owner.to_owned(),
            fingerprint: fingerprint(operation.as_str(), target, owner, body).expect("fingerprint"),
            at,
            expires_at: at + chrono::Duration::milliseconds(RETENTION_MS),
        }
    }

    async fn claim_post_rates(
        store: Arc<dyn PaymentStore>,
        url: &str,
        n: usize,
        accounts: usize,
        batch: usize,
    ) -> Rates {
        let work = seed(&store, n, accounts, batch).await;
        // Each account's work in units: one payout (P2, P3), or one batch (P2b, P3b).
        let units: Vec<Vec<Vec<Item>>> =
            work.iter().map(|items| items.chunks(batch).map(<[Item]>::to_vec).collect()).collect();

        // Phase 1: claims (timed).
        let t1 = phase(&units, |w, unit| {
            let store = store.clone();
            async move {
                match unit.as_slice() {
                    [it] if batch == 1 => claim(&store, w, it).await,
                    _ => claim_batch(&store, w, &unit).await,
                }
            }
        })
        .await;

        // Phase 2: the rail-proxy moves every payout to RAIL_ACKED (untimed).
        let rail = dlock_rail_proxy::store_sql::open(url).await.expect("open rail store");
        phase(&units, |w, unit| {
            let rail = rail.clone();
            async move {
                match unit.as_slice() {
                    [it] if batch == 1 => acknowledge(&*rail, w, it).await,
                    _ => acknowledge_batch(&*rail, w, &unit).await,
                }
            }
        })
        .await;
        drop(rail);

        // Phase 3: posts with newer tokens (timed).
        let t3 = phase(&units, |w, unit| {
            let store = store.clone();
            async move {
                match unit.as_slice() {
                    [it] if batch == 1 => post(&store, w, it).await,
                    _ => post_batch(&store, w, &unit).await,
                }
            }
        })
        .await;

        // Every reservation became a posting: each account is back at zero.
        for w in 0..accounts {
            let view = store.account(&account_id(w)).await.expect("account").expect("account exists");
            assert_eq!((view.balance_minor, view.ledger_sum_minor, view.reserved_minor), (0, 0, 0), "{view:?}");
        }
        Rates { claims: n as f64 / t1, posts: n as f64 / t3, combined: (2 * n) as f64 / (t1 + t3) }
    }

    /// Runs `each` over every account's work units in order, one task per account, all
    /// accounts at once; the seconds it took.
    async fn phase<F, Fut>(units: &[Vec<Vec<Item>>], each: F) -> f64
    where
        F: Fn(usize, Vec<Item>) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        let start = Instant::now();
        let tasks: Vec<_> = units
            .iter()
            .enumerate()
            .map(|(w, account)| {
                let work: Vec<Fut> = account.iter().cloned().map(|unit| each(w, unit)).collect();
                tokio::spawn(async move {
                    for unit in work {
                        unit.await;
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("bench task");
        }
        start.elapsed().as_secs_f64()
    }

    /// P2b as the handler runs it (no grant read: the account is the path's): identity,
    /// fingerprint, one store call on the writer thread. Every payout claimed.
    async fn claim_batch(store: &Arc<dyn PaymentStore>, w: usize, items: &[Item]) {
        let (owner, account, token) = (owner(w), account_id(w), items[0].claim_token);
        let key = format!("claims:{token}");
        let req = dlock_contract::payment::ClaimBatchRequest {
            payouts: items
                .iter()
                .map(|it| dlock_contract::payment::ClaimBatchItem {
                    payout_id: it.payout_id,
                    expected_state: PayoutState::Pending,
                })
                .collect(),
        };
        let at = now();
        let target = dlock_contract::batch::batch_target(&account);
        let idem = identity(Operation::Claim, &target, &key, token, &owner, &req, at);
        let payouts =
            items.iter().map(|it| ClaimBatchPayout { payout_id: it.payout_id, expected: PayoutState::Pending });
        let b = ClaimBatch { account_id: account.clone(), token, owner_id: owner, payouts: payouts.collect(), at };
        let how = Answering { shape: Shape::Batch, key, trace_id: "bench".into() };
        let s = store.clone();
        let decided = as_handlers(store, async move { s.claim(&b, &idem, &how).await }).await;
        match decided.expect("claim batch") {
            Idempotent::Executed { outcome: ClaimBatchOutcome::Decided { items: claimed }, stored: Some(_) }
                if claimed.iter().all(|(_, o)| matches!(o, ClaimOutcome::Claimed { .. })) => {}
            other => panic!("claim batch token {token}: {other:?}"),
        }
    }

    /// The rail-proxy's two transactions around a batch the rail acknowledged.
    async fn acknowledge_batch(rail: &dyn RailStore, w: usize, items: &[Item]) {
        let asked: Vec<Unstamped> = items
            .iter()
            .map(|it| Unstamped {
                payout_id: it.payout_id,
                account_id: account_id(w),
                presented_token: it.claim_token,
                owner_id: owner(w),
                idempotency_key: payout_key(it.payout_id),
                amount_minor: AMOUNT_MINOR,
                currency: CURRENCY.into(),
                beneficiary_ref: "bench".into(),
                fencing_enabled: true,
            })
            .collect();
        let ids: Vec<Uuid> = items.iter().map(|it| it.submission_id).collect();
        let next = std::sync::atomic::AtomicUsize::new(0);
        let stamp = || (ids[next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)], now());
        let checked = rail.admit_batch(&asked, &stamp).await.expect("admit batch");
        assert!(
            checked.iter().all(|c| matches!(c, Checked::Decided { admission: Admission::Admitted { .. }, .. })),
            "{checked:?}"
        );
        let acked: Vec<(Uuid, Resolution)> = items
            .iter()
            .map(|it| (it.submission_id, Resolution::Acked { rail_reference: it.rail_reference.clone() }))
            .collect();
        rail.resolve_batch(&acked, now()).await.expect("resolve batch");
    }

    /// P3b as the handler runs it, with a token newer than every claim of the account.
    async fn post_batch(store: &Arc<dyn PaymentStore>, w: usize, items: &[Item]) {
        let (owner, account, token) = (owner(w), account_id(w), items[0].post_token);
        let key = format!("posts:{token}");
        let req = dlock_contract::payment::PostBatchRequest {
            payouts: items
                .iter()
                .map(|it| dlock_contract::payment::PostBatchItem {
                    payout_id: it.payout_id,
                    rail_reference: it.rail_reference.clone(),
                    submission_id: it.submission_id,
                    rail_outcome: "ACKED".into(),
                })
                .collect(),
        };
        let at = now();
        let target = dlock_contract::batch::batch_target(&account);
        let idem = identity(Operation::Post, &target, &key, token, &owner, &req, at);
        let payouts = items.iter().map(|it| PostBatchPayout {
            payout_id: it.payout_id,
            submission_id: it.submission_id,
            rail_reference: it.rail_reference.clone(),
            posting_id: Uuid::new_v4(),
            entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
        });
        let b = PostBatch { account_id: account.clone(), token, owner_id: owner, payouts: payouts.collect(), at };
        let how = Answering { shape: Shape::Batch, key, trace_id: "bench".into() };
        let s = store.clone();
        let decided = as_handlers(store, async move { s.post(&b, &idem, &how).await }).await;
        match decided.expect("post batch") {
            Idempotent::Executed { outcome: PostBatchOutcome::Decided { items: posted }, stored: Some(_) }
                if posted.iter().all(|(_, o)| matches!(o, PostOutcome::Posted { .. })) => {}
            other => panic!("post batch token {token}: {other:?}"),
        }
    }

    /// Untimed: one account per task funded for exactly its payouts, and its PENDING payouts;
    /// with `batch` > 1, the payouts of one batch share their claim and their post tokens.
    async fn seed(store: &Arc<dyn PaymentStore>, n: usize, accounts: usize, batch: usize) -> Vec<Vec<Item>> {
        let counts = per_account(n, accounts);
        let mut tasks = Vec::new();
        for (w, count) in counts.into_iter().enumerate() {
            let store = store.clone();
            tasks.push(tokio::spawn(async move {
                let account = account_id(w);
                let req = NewAccountRequest {
                    account_id: account.clone(),
                    currency: CURRENCY.into(),
                    opening_balance_minor: AMOUNT_MINOR * count as i64,
                };
                let at = now();
                let idem = identity(Operation::CreateAccount, "accounts", &account, 0, "bench", &req, at);
                let a = NewAccount {
                    account_id: account.clone(),
                    currency: CURRENCY.into(),
                    opening_balance_minor: req.opening_balance_minor,
                    posting_id: Uuid::new_v4(),
                    entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
                    at,
                };
                let how = Answering { shape: Shape::Single, key: idem.key.clone(), trace_id: "bench".into() };
                match store.create_account(&a, &idem, &how).await.expect("create account") {
                    Idempotent::Executed { outcome: CreateAccountOutcome::Created(_), stored: Some(_) } => {}
                    other => panic!("create account {account}: {other:?}"),
                }
                let mut items = Vec::with_capacity(count);
                for k in 0..count as i64 {
                    let payout_id = Uuid::new_v4();
                    let body = serde_json::json!({
                        "payoutId": payout_id, "accountId": account, "amountMinor": AMOUNT_MINOR,
                        "currency": CURRENCY, "beneficiaryRef": "bench"
                    });
                    let at = now();
                    let key = format!("create:{payout_id}");
                    let idem = identity(Operation::CreatePayout, "payouts", &key, 0, "bench", &body, at);
                    let p = NewPayout {
                        payout_id,
                        account_id: account.clone(),
                        amount_minor: AMOUNT_MINOR,
                        currency: CURRENCY.into(),
                        beneficiary_ref: "bench".into(),
                        at,
                    };
                    let how = Answering { shape: Shape::Single, key: idem.key.clone(), trace_id: "bench".into() };
                    match store.create_payout(&p, &idem, &how).await.expect("create payout") {
                        Idempotent::Executed { outcome: CreatePayoutOutcome::Created(_), stored: Some(_) } => {}
                        other => panic!("create payout {payout_id}: {other:?}"),
                    }
                    let (slot, slots) = (k / batch as i64, count.div_ceil(batch) as i64);
                    items.push(Item {
                        payout_id,
                        claim_token: slot + 1,
                        post_token: slots + slot + 1,
                        submission_id: Uuid::new_v4(),
                        rail_reference: format!("bench-ref-{payout_id}"),
                    });
                }
                items
            }));
        }
        let mut work = Vec::new();
        for t in tasks {
            work.push(t.await.expect("seed task"));
        }
        work
    }

    fn owner(w: usize) -> String {
        format!("bench-worker-{w}")
    }

    fn payout_key(payout_id: Uuid) -> String {
        format!("payout:{payout_id}")
    }

    /// The grant check's store read (`app.rs` `verify_grant`): the payout's account, which
    /// the grant's signature covers (one single-column read since
    /// docs/performance.md "The grant check's account read"; the payout and all its
    /// submissions before). Timed with the claim and the post it precedes.
    async fn grant_read(store: &dyn PaymentStore, it: &Item, w: usize) {
        let account = store.payout_account(it.payout_id).await.expect("grant read").expect("payout exists");
        assert_eq!(account, account_id(w), "the grant check reads the payout's account");
    }

    /// A store write as the handlers run it (`PaymentResource::write`): on the store's writer
    /// thread when it has one (SQLite, docs/performance.md "The SQLite writer thread").
    async fn as_handlers<T: Send + 'static>(
        store: &Arc<dyn PaymentStore>,
        work: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        dlock_rt::dedicated::run_on(store.writer_thread(), work).await
    }

    /// P2 as the pipeline runs it: the grant check's read, identity, fingerprint, one store
    /// call of a batch of one (on the writer thread, as the pipeline's).
    async fn claim(store: &Arc<dyn PaymentStore>, w: usize, it: &Item) {
        grant_read(&**store, it, w).await;
        let owner = owner(w);
        let key = payout_key(it.payout_id);
        let target = it.payout_id.to_string();
        let req = ClaimRequest { expected_state: PayoutState::Pending };
        let at = now();
        let idem = identity(Operation::Claim, &target, &key, it.claim_token, &owner, &req, at);
        let c =
            Claim { payout_id: it.payout_id, token: it.claim_token, owner_id: owner, expected: req.expected_state, at };
        let (payout_id, token) = (it.payout_id, it.claim_token);
        let how = Answering { shape: Shape::Single, key, trace_id: "bench".into() };
        let (s, account) = (store.clone(), account_id(w));
        let decided = as_handlers(store, async move { s.claim(&c.batch_of_one(&account), &idem, &how).await });
        match decided.await.expect("claim").map(|o| o.into_single(&account_id(w))) {
            Idempotent::Executed { outcome: ClaimOutcome::Claimed { .. }, stored: Some(r) } if r.status == 200 => {}
            other => panic!("claim {payout_id} token {token}: {other:?}"),
        }
    }

    /// The rail-proxy's two transactions around a forward that the rail acknowledged.
    async fn acknowledge(rail: &dyn RailStore, w: usize, it: &Item) {
        let attempt = Attempt {
            submission_id: it.submission_id,
            payout_id: it.payout_id,
            account_id: account_id(w),
            presented_token: it.claim_token,
            owner_id: owner(w),
            idempotency_key: payout_key(it.payout_id),
            amount_minor: AMOUNT_MINOR,
            currency: CURRENCY.into(),
            at: now(),
            fencing_enabled: true,
        };
        match rail.admit(&attempt).await.expect("admit") {
            Admission::Admitted { .. } => {}
            other => panic!("admit {}: {other:?}", it.payout_id),
        }
        let acked = Resolution::Acked { rail_reference: it.rail_reference.clone() };
        rail.resolve(it.submission_id, &acked, now()).await.expect("resolve");
    }

    /// P3 as the handler runs it, with a token newer than every claim of the account.
    async fn post(store: &Arc<dyn PaymentStore>, w: usize, it: &Item) {
        grant_read(&**store, it, w).await;
        let owner = owner(w);
        let key = payout_key(it.payout_id);
        let target = it.payout_id.to_string();
        let req = PostRequest {
            rail_reference: it.rail_reference.clone(),
            submission_id: it.submission_id,
            rail_outcome: "ACKED".into(),
        };
        let at = now();
        let idem = identity(Operation::Post, &target, &key, it.post_token, &owner, &req, at);
        let p = Post {
            payout_id: it.payout_id,
            token: it.post_token,
            owner_id: owner,
            submission_id: req.submission_id,
            rail_reference: req.rail_reference.clone(),
            posting_id: Uuid::new_v4(),
            entry_ids: [Uuid::new_v4(), Uuid::new_v4()],
            at,
        };
        let payout_id = it.payout_id;
        let how = Answering { shape: Shape::Single, key, trace_id: "bench".into() };
        let (s, account) = (store.clone(), account_id(w));
        let decided = as_handlers(store, async move { s.post(&p.batch_of_one(&account), &idem, &how).await });
        match decided.await.expect("post").map(|o| o.into_single(&account_id(w))) {
            Idempotent::Executed { outcome: PostOutcome::Posted { .. }, stored: Some(r) } if r.status == 200 => {}
            other => panic!("post {payout_id} token {}: {other:?}", it.post_token),
        }
    }
}
