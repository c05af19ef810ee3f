//! Payouts per second end to end through `dlock up` (the real binary, every service and two
//! executors in one process), on SQLite and on PostgreSQL, at rail-stub latency 0; p50 and
//! p99 per payout (from creation to POSTED, as paydb stamps them); next to the floor the
//! design allows: the same run's raw per-hop database commits, measured on the same
//! databases in the same run. Prints the ratio. Not a test: it asserts no timing.
//!
//! `cargo bench -p dlock --bench end_to_end`
//!
//! - `DLOCK_BENCH_N` payouts (default 300) over `DLOCK_BENCH_ACCOUNTS` accounts (default 8).
//! - PostgreSQL when `DLOCK_BENCH_PG_URL` or `DLOCK_TEST_PG_URL` names a server (paydb and
//!   lockdb each get a fresh database).
//!
//! **The floor.** A settled payout costs eight commits: on lockdb two acquires and two
//! releases (the post needs a newer grant than the claim), on paydb the claim, the proxy's
//! intent, its resolution and the post. The floor runs 4N single-row conditional UPDATEs on
//! each database, concurrently, with as many workers as the executors have tasks.
//! `dlock up` binds the default ports (8081–8085): nothing else may hold them.

#[cfg(madsim)]
fn main() {}

#[cfg(not(madsim))]
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(bench::run());
}

#[cfg(not(madsim))]
mod bench {
    use std::process::{Child, Command, Stdio};
    // Real wall-clock time on purpose: a bench measures the real machine, and it is built
    // only outside the simulation.
    use std::time::{Duration, Instant};

    use dlock_rt::http::{BaseUrl, HttpClient};
    use dlock_testkit::bench::env_usize;
    use serde_json::{json, Value};

    /// Executors and tasks per executor of the measured `dlock up`.
    const EXECUTORS: usize = 2;
    const CONCURRENCY: usize = 4;
    /// Commits one settled payout costs on each database (see the module docs).
    const COMMITS_PER_PAYOUT_PER_DB: usize = 4;
    /// Longest a run may take.
    const RUN_MS_MAX: u64 = 600_000;

    struct Up(Child);

    impl Drop for Up {
        fn drop(&mut self) {
            let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.0.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    pub async fn run() {
        let n = env_usize("DLOCK_BENCH_N", 300).max(1);
        let accounts = env_usize("DLOCK_BENCH_ACCOUNTS", 8).clamp(1, n);
        println!(
            "end-to-end bench through `dlock up`: n={n} accounts={accounts} executors={EXECUTORS}x{CONCURRENCY} stub latency=0"
        );
        println!(
            "{:<10} {:>11} {:>9} {:>9} {:>14} {:>8}",
            "database", "payouts/s", "p50 ms", "p99 ms", "floor payout/s", "ratio"
        );
        let dir = dlock_testkit::TempDir::new("bench-e2e");
        let paydb = format!("sqlite://{}", dir.path().join("paydb.sqlite").display());
        let lockdb = format!("sqlite://{}", dir.path().join("lockdb.sqlite").display());
        measure("sqlite", &dir, &paydb, &lockdb, n, accounts).await;
        match dlock_testkit::bench::pg_admin_url() {
            Some(admin) => {
                let paydb = dlock_testkit::pg_database_on(&admin).await;
                let lockdb = dlock_testkit::pg_database_on(&admin).await;
                measure("postgres", &dir, &paydb, &lockdb, n, accounts).await;
            }
            None => println!("postgres   (skipped: set DLOCK_TEST_PG_URL to include it)"),
        }
    }

    async fn measure(name: &str, dir: &dlock_testkit::TempDir, paydb: &str, lockdb: &str, n: usize, accounts: usize) {
        let (rate, p50, p99) = end_to_end(dir, paydb, lockdb, n, accounts).await;
        let floor = floor_rate(paydb, lockdb, n).await;
        println!("{name:<10} {rate:>11.1} {p50:>9} {p99:>9} {floor:>14.1} {:>8.2}", rate / floor);
    }

    async fn send(client: &HttpClient, base: &BaseUrl, path: &str, key: &str, body: Value) -> Value {
        let r = client
            .send(
                base,
                http::Method::POST,
                path,
                &[("content-type", "application/json"), ("x-owner-id", "bench"), ("x-idempotency-key", key)],
                Some(body.to_string().into()),
            )
            .await
            .expect("payment-resource answers");
        assert_eq!(r.status, 201, "{}", String::from_utf8_lossy(&r.body));
        serde_json::from_slice(&r.body).expect("json")
    }

    /// Runs `n` payouts through `dlock up`; returns payouts/s and p50/p99 ms per payout.
    async fn end_to_end(
        dir: &dlock_testkit::TempDir,
        paydb: &str,
        lockdb: &str,
        n: usize,
        accounts: usize,
    ) -> (f64, i64, i64) {
        let data = dir.path().join(format!("up-{}", uuid::Uuid::new_v4().simple()));
        let _up = Up(Command::new(env!("CARGO_BIN_EXE_dlock"))
            .arg("up")
            .arg("--data-dir")
            .arg(&data)
            .args(["--paydb-url", paydb, "--lockdb-url", lockdb])
            .args(["--executors", &EXECUTORS.to_string(), "--concurrency", &CONCURRENCY.to_string()])
            .env("DLOCK_LOG", "error")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn dlock up"));
        let payment = BaseUrl::parse("http://127.0.0.1:8082").expect("url");
        let client = HttpClient::new(1_000, 10_000);
        let ready = dlock_rt::wait_until(Duration::from_millis(50), Duration::from_secs(60), || async {
            let r = client.send(&payment, http::Method::GET, "/health/ready", &[], None).await.ok()?;
            (r.status == 200).then_some(())
        })
        .await;
        assert!(ready.is_some(), "dlock up did not become ready on 127.0.0.1:8082");
        for a in 0..accounts {
            let body =
                json!({"accountId": format!("acct-{a}"), "currency": "EUR", "openingBalanceMinor": 1_000_000_000});
            send(&client, &payment, "/v1/accounts", &format!("open-{a}"), body).await;
        }
        let mut ids = Vec::with_capacity(n);
        for i in 0..n {
            let body = json!({"accountId": format!("acct-{}", i % accounts), "amountMinor": 1_000, "currency": "EUR",
                "beneficiaryRef": format!("ben-{i}")});
            let v = send(&client, &payment, "/v1/payouts", &format!("create-{i}"), body).await;
            ids.push(v["payoutId"].as_str().expect("id").to_owned());
        }
        // Wait for every payout to be POSTED, then read its creation and posting instants.
        let mut latencies = Vec::with_capacity(n);
        let mut first_created = i64::MAX;
        let mut last_posted = i64::MIN;
        let deadline = Instant::now() + Duration::from_millis(RUN_MS_MAX);
        for id in &ids {
            let view = dlock_rt::wait_until(Duration::from_millis(20), deadline - Instant::now(), || async {
                let r = client.send(&payment, http::Method::GET, &format!("/v1/payouts/{id}"), &[], None).await.ok()?;
                let v: Value = serde_json::from_slice(&r.body).ok()?;
                (v["state"] == "POSTED").then_some(v)
            })
            .await
            .expect("every payout is posted within the bench's bound");
            let ms = |field: &str| {
                view[field]
                    .as_str()
                    .and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
                    .map(|t| t.timestamp_millis())
                    .expect("timestamp")
            };
            let (created, posted) = (ms("createdAt"), ms("updatedAt"));
            first_created = first_created.min(created);
            last_posted = last_posted.max(posted);
            latencies.push(posted - created);
        }
        latencies.sort_unstable();
        let pct = |p: usize| latencies[(latencies.len() * p / 100).min(latencies.len() - 1)];
        let seconds = ((last_posted - first_created).max(1)) as f64 / 1000.0;
        (n as f64 / seconds, pct(50), pct(99))
    }

    /// The floor: `4n` autocommitted single-row conditional UPDATEs on each database, both
    /// databases at once, with as many workers as the executors have tasks. Payouts/s.
    async fn floor_rate(paydb: &str, lockdb: &str, n: usize) -> f64 {
        let started = Instant::now();
        let (a, b) =
            tokio::join!(updates(paydb, n * COMMITS_PER_PAYOUT_PER_DB), updates(lockdb, n * COMMITS_PER_PAYOUT_PER_DB));
        a.and(b).expect("floor updates");
        n as f64 / started.elapsed().as_secs_f64()
    }

    async fn updates(url: &str, total: usize) -> Result<(), String> {
        let workers = EXECUTORS * CONCURRENCY;
        if url.starts_with("postgres") {
            let pool = dlock_db::pg_pool(url).await.map_err(|e| e.to_string())?;
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_floor (id BIGINT PRIMARY KEY, fence BIGINT NOT NULL)")
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
            let mut tasks = Vec::new();
            for w in 0..workers {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    let id = w as i64;
                    sqlx::query("INSERT INTO bench_floor VALUES ($1, 0) ON CONFLICT DO NOTHING")
                        .bind(id)
                        .execute(&pool)
                        .await?;
                    for i in 0..(total / workers) {
                        sqlx::query("UPDATE bench_floor SET fence = $1 WHERE id = $2 AND fence < $1")
                            .bind(i as i64 + 1)
                            .bind(id)
                            .execute(&pool)
                            .await?;
                    }
                    Ok::<(), sqlx::Error>(())
                }));
            }
            for t in tasks {
                t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
            }
        } else {
            let pool = dlock_db::sqlite_pool(url).await.map_err(|e| e.to_string())?;
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_floor (id INTEGER PRIMARY KEY, fence INTEGER NOT NULL)")
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
            let mut tasks = Vec::new();
            for w in 0..workers {
                let pool = pool.clone();
                tasks.push(tokio::spawn(async move {
                    let id = w as i64;
                    sqlx::query("INSERT OR IGNORE INTO bench_floor VALUES (?1, 0)").bind(id).execute(&pool).await?;
                    for i in 0..(total / workers) {
                        sqlx::query("UPDATE bench_floor SET fence = ?1 WHERE id = ?2 AND fence < ?1")
                            .bind(i as i64 + 1)
                            .bind(id)
                            .execute(&pool)
                            .await?;
                    }
                    Ok::<(), sqlx::Error>(())
                }));
            }
            for t in tasks {
                t.await.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }
}
