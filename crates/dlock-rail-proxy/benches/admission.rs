//! Proxy admissions per second, next to the raw single-row conditional-UPDATE rate of the
//! same database, measured in the same run on the same machine. Prints the ratio.
//!
//! `cargo bench -p dlock-rail-proxy --bench admission`
//!
//! - SQLite always (a temp file, WAL, synchronous=FULL: the embedded default's settings).
//! - PostgreSQL when `DLOCK_TEST_PG_URL` (or `DLOCK_BENCH_PG_URL`) names a server.
//! - `DLOCK_BENCH_N` submissions per run (default 1000), `DLOCK_BENCH_CONCURRENCY`
//!   in flight (default 8). The stub's latency is 0.
//!
//! An admission is the whole proxy path: validation and steps 1–3 in one transaction
//! (`RailStore::admit_checked`), the forward to the stub over loopback, and the resolving
//! transaction. It costs two commits, so against one conditional UPDATE per commit at the
//! same concurrency its ceiling is 0.5. Two baselines are printed: one connection updating
//! one row (the first, kept for comparison with older runs; the proxy's 8 concurrent
//! submissions share commits on PostgreSQL, so this ratio can exceed 1), and on PostgreSQL
//! `DLOCK_BENCH_CONCURRENCY` connections each updating a row of its own (the fair one;
//! SQLite has one writer, so there the two are the same).
//!
//! **Batches** (C3-extensions E-19): a second row per database sends the same submissions
//! through `POST /v1/rail/submission-batches`, `DLOCK_BENCH_BATCH` payouts of an account per
//! batch (default 16, the executor's `executor.payouts-per-grant-max`) under one token: one
//! mark pass and one intent transaction per batch, every payout forwarded once, the
//! outcomes in one transaction. Its rate is payouts per second, against the same baselines.
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

    use dlock_config::Layers;
    use dlock_contract::payout::PayoutState;
    use dlock_rail_proxy::store::{NewPayout, RailStore};
    use dlock_rt::http::BaseUrl;
    use dlock_rt::Clock;
    use sqlx::Connection;

    pub async fn run() {
        let n = dlock_testkit::bench::env_usize("DLOCK_BENCH_N", 1_000);
        let concurrency = dlock_testkit::bench::env_usize("DLOCK_BENCH_CONCURRENCY", 8).max(1);
        let batch =
            dlock_testkit::bench::env_usize("DLOCK_BENCH_BATCH", 16).clamp(2, dlock_contract::batch::BATCH_PAYOUTS_MAX);
        println!("rail-proxy admission bench: n={n} concurrency={concurrency} stub latency=0; batches of {batch}");
        println!(
            "{:<10} {:>16} {:>22} {:>8} {:>22} {:>8}",
            "database", "admissions/s", "cond. UPDATE/s 1 conn", "ratio", "UPDATE/s same conc.", "ratio"
        );
        let dir = dlock_testkit::TempDir::new("bench");
        let batched = dlock_testkit::TempDir::new("bench-batch");
        let base = report("sqlite", &dlock_testkit::sqlite_url(&dir), n, concurrency, 1, None).await;
        report(&format!("sqlite b{batch}"), &dlock_testkit::sqlite_url(&batched), n, concurrency, batch, Some(base))
            .await;
        match dlock_testkit::bench::pg_admin_url() {
            Some(admin) => {
                let url = dlock_testkit::pg_database_on(&admin).await;
                let base = report("postgres", &url, n, concurrency, 1, None).await;
                let url = dlock_testkit::pg_database_on(&admin).await;
                report(&format!("postgres b{batch}"), &url, n, concurrency, batch, Some(base)).await;
            }
            None => println!("postgres   (skipped: set DLOCK_TEST_PG_URL to include it)"),
        }
    }

    /// One row: `batch` 1 sends single submissions, more sends batches of that many. The
    /// baselines are measured on this database unless `baselines` gives the ones measured
    /// before on the same kind. Returns the baselines (1 connection, same concurrency).
    async fn report(
        name: &str,
        url: &str,
        n: usize,
        concurrency: usize,
        batch: usize,
        baselines: Option<(f64, f64)>,
    ) -> (f64, f64) {
        let (baseline, concurrent) = match baselines {
            Some(b) => b,
            None => {
                let baseline = conditional_update_rate(url, n).await;
                // PostgreSQL commits concurrent transactions together: the same number of
                // connections, each updating a row of its own, is the fair price of a fenced
                // write at this concurrency. SQLite has one writer, so its baseline is the one
                // above.
                let concurrent = if url.starts_with("sqlite") {
                    baseline
                } else {
                    concurrent_update_rate(url, n, concurrency).await
                };
                (baseline, concurrent)
            }
        };
        let admissions = admission_rate(url, n, concurrency, batch).await;
        println!(
            "{name:<12} {admissions:>14.0} {baseline:>22.0} {:>8.2} {concurrent:>22.0} {:>8.2}",
            admissions / baseline,
            admissions / concurrent
        );
        (baseline, concurrent)
    }

    /// [`conditional_update_rate`] on `concurrency` connections at once, each on its own row,
    /// `n` updates in all.
    async fn concurrent_update_rate(url: &str, n: usize, concurrency: usize) -> f64 {
        let mut conns = Vec::new();
        for w in 0..concurrency {
            let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query("INSERT INTO bench_fence VALUES ($1, 0) ON CONFLICT (id) DO UPDATE SET v = 0")
                .bind(w as i32 + 100)
                .execute(&mut c)
                .await
                .expect("seed");
            conns.push(c);
        }
        let start = Instant::now();
        let mut tasks = Vec::new();
        for (w, mut c) in conns.into_iter().enumerate() {
            let per = n / concurrency + usize::from(w < n % concurrency);
            tasks.push(tokio::spawn(async move {
                for i in 1..=per as i64 {
                    sqlx::query("UPDATE bench_fence SET v = $1 WHERE id = $2 AND v < $1")
                        .bind(i)
                        .bind(w as i32 + 100)
                        .execute(&mut c)
                        .await
                        .expect("update");
                }
            }));
        }
        for t in tasks {
            t.await.expect("worker");
        }
        n as f64 / start.elapsed().as_secs_f64()
    }

    /// One row, `UPDATE ... SET v = $1 WHERE id = 1 AND v < $1`, one commit per statement,
    /// `n` times with increasing values: the database's own price of a fenced write.
    async fn conditional_update_rate(url: &str, n: usize) -> f64 {
        let store = dlock_rail_proxy::store_sql::open(url).await.expect("open");
        drop(store);
        let q = |sql: &str| if url.starts_with("sqlite") { sql.replace('$', "?") } else { sql.to_owned() };
        if url.starts_with("sqlite") {
            let mut c = sqlx::SqliteConnection::connect(&format!("{url}?mode=rwc")).await.expect("connect");
            sqlx::query("PRAGMA journal_mode=WAL").execute(&mut c).await.expect("wal");
            sqlx::query("PRAGMA synchronous=FULL").execute(&mut c).await.expect("sync");
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_fence (id INTEGER PRIMARY KEY, v INTEGER NOT NULL)")
                .execute(&mut c)
                .await
                .expect("create");
            sqlx::query("INSERT OR REPLACE INTO bench_fence VALUES (1, 0)").execute(&mut c).await.expect("seed");
            let stmt = q("UPDATE bench_fence SET v = $1 WHERE id = 1 AND v < $1");
            let start = Instant::now();
            for i in 1..=n as i64 {
                sqlx::query(&stmt).bind(i).execute(&mut c).await.expect("update");
            }
            n as f64 / start.elapsed().as_secs_f64()
        } else {
            let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_fence (id INTEGER PRIMARY KEY, v BIGINT NOT NULL)")
                .execute(&mut c)
                .await
                .expect("create");
            sqlx::query("INSERT INTO bench_fence VALUES (1, 0) ON CONFLICT (id) DO UPDATE SET v = 0")
                .execute(&mut c)
                .await
                .expect("seed");
            let stmt = q("UPDATE bench_fence SET v = $1 WHERE id = 1 AND v < $1");
            let start = Instant::now();
            for i in 1..=n as i64 {
                sqlx::query(&stmt).bind(i).execute(&mut c).await.expect("update");
            }
            n as f64 / start.elapsed().as_secs_f64()
        }
    }

    async fn admission_rate(url: &str, n: usize, concurrency: usize, batch: usize) -> f64 {
        let store = dlock_rail_proxy::store_sql::open(url).await.expect("open");
        // Both services through their entry points, settings from their own resolvers.
        let production = dlock_config::Profile::Production;
        let stub_cfg = dlock_rail_stub::config::resolve(&Layers::default(), production).expect("stub").config;
        let stub_listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let rail_url = format!("http://{}", stub_listener.local_addr().expect("addr"));
        let _stub = dlock_rail_stub::start(stub_cfg, Clock::system(), stub_listener, std::future::pending())
            .await
            .expect("stub");
        let creds = dlock_testkit::auth::credentials();
        // The proxy verifies every grant's signature (C3-extensions E-14): the test key's.
        let verify_key = dlock_contract::grant::testing::signer().verify_key().to_base64();
        let proxy_layers = Layers::of(&[
            ("rail.proxy.rail-url", &rail_url),
            ("rail.proxy.grants.verify-keys", &verify_key),
            ("auth.credentials", &creds),
        ]);
        let cfg = dlock_rail_proxy::config::resolve(&proxy_layers, production).expect("proxy").config;
        let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let proxy_url = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
        let _proxy = dlock_rail_proxy::start(cfg, store.clone(), Clock::system(), listener, std::future::pending())
            .await
            .expect("proxy");

        // One account per worker, so tokens rise per account without coordination.
        let mut work: Vec<Vec<(uuid::Uuid, String, i64)>> = vec![Vec::new(); concurrency];
        for i in 0..n {
            let w = i % concurrency;
            let account = format!("bench-{w}");
            let id = uuid::Uuid::new_v4();
            let p = NewPayout {
                payout_id: id,
                account_id: account.clone(),
                amount_minor: 100,
                currency: "EUR".into(),
                beneficiary_ref: "b".into(),
                state: PayoutState::Claimed,
            };
            store.insert_payout(&p, Clock::system().wall()).await.expect("seed payout");
            // A batch's payouts share one token; single submissions each have their own.
            work[w].push((id, account, (i / (concurrency * batch) + 1) as i64));
        }
        let store: Arc<dyn RailStore> = store;
        let start = Instant::now();
        let mut tasks = Vec::new();
        for items in work {
            let url = proxy_url.clone();
            if batch > 1 {
                tasks.push(tokio::spawn(submit_batches(url, items, batch)));
                continue;
            }
            tasks.push(tokio::spawn(async move {
                let client = dlock_testkit::auth::client(1_000, 10_000);
                for (id, account, token) in items {
                    let body = serde_json::json!({
                        "payoutId": id, "accountId": account, "amountMinor": 100,
                        "currency": "EUR", "beneficiaryRef": "b"
                    });
                    let signature = dlock_contract::grant::testing::sign_payout(&account, token, "bench");
                    let token = token.to_string();
                    let key = format!("payout:{id}");
                    let r = client
                        .send(
                            &url,
                            http::Method::POST,
                            "/v1/rail/submissions",
                            &[
                                ("content-type", "application/json"),
                                ("x-fencing-token", &token),
                                ("x-owner-id", "bench"),
                                ("x-idempotency-key", &key),
                                ("x-fencing-signature", &signature),
                            ],
                            Some(body.to_string().into()),
                        )
                        .await
                        .expect("submission");
                    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                }
            }));
        }
        for t in tasks {
            t.await.expect("worker");
        }
        let rate = n as f64 / start.elapsed().as_secs_f64();
        let acked = store.submissions(None).await.expect("rows").len();
        assert_eq!(acked, n);
        rate
    }

    /// One worker's payouts (one account) as batches of `batch` submissions, each batch under
    /// its own token: every item acknowledged.
    async fn submit_batches(url: BaseUrl, items: Vec<(uuid::Uuid, String, i64)>, batch: usize) {
        let client = dlock_testkit::auth::client(1_000, 10_000);
        for chunk in items.chunks(batch) {
            let (account, token) = (chunk[0].1.clone(), chunk[0].2);
            let submissions: Vec<serde_json::Value> = chunk
                .iter()
                .map(|(id, _, _)| {
                    serde_json::json!({"payoutId": id, "amountMinor": 100, "currency": "EUR",
                        "beneficiaryRef": "b", "idempotencyKey": format!("payout:{id}")})
                })
                .collect();
            let body = serde_json::json!({"accountId": account, "submissions": submissions});
            let signature = dlock_contract::grant::testing::sign_payout(&account, token, "bench");
            let token = token.to_string();
            let headers = [
                ("content-type", "application/json"),
                ("x-fencing-token", token.as_str()),
                ("x-owner-id", "bench"),
                ("x-fencing-signature", signature.as_str()),
            ];
            let r = client
                .send(&url, http::Method::POST, "/v1/rail/submission-batches", &headers, Some(body.to_string().into()))
                .await
                .expect("batch");
            assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
            let answer: dlock_contract::batch::BatchAnswer = serde_json::from_slice(&r.body).expect("batch answer");
            assert!(answer.items.iter().all(|i| i.status == 200), "{answer:?}");
        }
    }
}
