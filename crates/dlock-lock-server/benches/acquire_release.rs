//! Acquire+release pairs per second through the lock server's HTTP surface, for one hot
//! key and for 1 000 keys, next to the backend's raw baseline measured in the same run:
//! a PostgreSQL (or SQLite) `nextval` + upsert transaction and a delete transaction, the
//! least any correct implementation must do. Prints the ratio (goal: at least 0.5). The
//! baseline is measured before and after the HTTP rows; the ratio is against their mean.
//!
//! The clients connect as the lock client does (`dlock-lock-client`'s transport): each
//! acquire on a fresh connection (so a refused connect stays "nothing sent"), releases on
//! kept-alive connections. A `store` row prints the same pairs through the server's store
//! calls without HTTP (one client, one key), to show what HTTP adds.
//!
//! `cargo bench -p dlock-lock-server --bench acquire_release`
//! PostgreSQL runs when `DLOCK_TEST_PG_URL` (or `DLOCK_BENCH_PG_URL`) is set; etcd when
//! `DLOCK_TEST_ETCD_ENDPOINTS` is, against etcd's own lock/unlock pair (its v3 lock service,
//! through the same client library) as the baseline. `DLOCK_BENCH_N` pairs per run (default
//! 1000), `DLOCK_BENCH_CONCURRENCY` clients (default 4).

#[cfg(madsim)]
fn main() {}

#[cfg(not(madsim))]
fn main() {
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
    rt.block_on(bench::run());
}

#[cfg(not(madsim))]
mod bench {
    // Real wall-clock time on purpose: a bench measures the real machine, and benches are
    // built only outside the simulation (`cfg(not(madsim))`), so no seam is bypassed.
    use std::time::Instant;

    use dlock_lock_server::service::{LockServer, LockServerConfig};
    use dlock_rt::http::{BaseUrl, HttpClient};
    use dlock_rt::Clock;
    use sqlx::Connection;

    pub async fn run() {
        let n = dlock_testkit::bench::env_usize("DLOCK_BENCH_N", 1_000);
        let clients = dlock_testkit::bench::env_usize("DLOCK_BENCH_CONCURRENCY", 4).max(1);
        println!("lock-server acquire+release bench: n={n} clients={clients}");
        println!(
            "{:<10} {:<6} {:<8} {:>10} {:>12} {:>7}",
            "backend", "keys", "clients", "pairs/s", "baseline/s", "ratio"
        );
        let dir = dlock_testkit::TempDir::new("bench");
        let sqlite = format!("sqlite://{}", dir.path().join("lockdb.sqlite").display());
        report("sqlite", &sqlite, n, clients).await;
        if let Some(admin) = dlock_testkit::bench::pg_admin_url() {
            let url = dlock_testkit::pg_database_on(&admin).await;
            report("postgres", &url, n, clients).await;
        } else {
            println!("postgres   (skipped: set DLOCK_TEST_PG_URL to include it)");
        }
        match std::env::var("DLOCK_TEST_ETCD_ENDPOINTS") {
            Ok(endpoints) => {
                let endpoints: Vec<String> = endpoints.split(',').map(str::to_owned).collect();
                let baseline = etcd_baseline_rate(&endpoints, n).await;
                for (keys, clients) in shapes(clients) {
                    let prefix = format!("/dlock-bench-{}", uuid::Uuid::new_v4().simple());
                    let store =
                        dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, &prefix).await.expect("etcd");
                    let rate = store_rate(std::sync::Arc::new(store), n, clients, keys).await;
                    row("etcd", keys, clients, rate, baseline);
                }
            }
            Err(_) => println!("etcd       (skipped: set DLOCK_TEST_ETCD_ENDPOINTS to include it)"),
        }
    }

    /// etcd's own lock service: `n` lock/unlock pairs on one name, one client, under one lease.
    async fn etcd_baseline_rate(endpoints: &[String], n: usize) -> f64 {
        let mut c = etcd_client::Client::connect(endpoints, None).await.expect("etcd connect");
        let lease = c.lease_grant(60, None).await.expect("lease").id();
        let name = format!("/dlock-bench-baseline-{}", uuid::Uuid::new_v4().simple());
        let start = Instant::now();
        for _ in 0..n {
            let locked =
                c.lock(name.clone(), Some(etcd_client::LockOptions::new().with_lease(lease))).await.expect("etcd lock");
            c.unlock(locked.key().to_vec()).await.expect("etcd unlock");
        }
        n as f64 / start.elapsed().as_secs_f64()
    }

    async fn report(name: &str, url: &str, n: usize, clients: usize) {
        let before = baseline_rate(url, n).await;
        let mut rates = Vec::new();
        for (keys, clients) in shapes(clients) {
            rates.push((keys, clients, server_rate(url, n, clients, keys).await));
        }
        let store = store_only_rate(url, n).await;
        let after = baseline_rate(url, n).await;
        let baseline = (before + after) / 2.0;
        for (keys, clients, rate) in rates {
            row(name, keys, clients, rate, baseline);
        }
        println!("{name:<10} {:<6} {:<8} {store:>10.0} {baseline:>12.0} {:>7.2}", "store", 1, store / baseline);
        println!("{name:<10} baseline before {before:.0}/s, after {after:.0}/s");
    }

    /// The pairs of the 1 key / 1 client row through the server's store calls (the
    /// acquire as the HTTP handler makes it, the release on the store's writer), no HTTP.
    async fn store_only_rate(url: &str, n: usize) -> f64 {
        use dlock_lock_server::service::AcquireOutcome;
        let store = dlock_lock_server::store_sql::open(url).await.expect("open");
        let server = LockServer::new(store, LockServerConfig::default(), Clock::system());
        let session = uuid::Uuid::new_v4();
        server.write(move |s| async move { s.open_session(session, "bench", 600_000).await }).await.expect("session");
        let start = Instant::now();
        for _ in 0..n {
            let AcquireOutcome::Granted(g) = server.acquire("hot", session, 60_000, 0).await.expect("acquire") else {
                panic!("the one client's key is free")
            };
            let token = g.fencing_token;
            let released = server.write(move |s| async move { s.release("hot", token).await }).await;
            assert!(matches!(released, Ok(Ok(()))), "release: {released:?}");
        }
        n as f64 / start.elapsed().as_secs_f64()
    }

    /// The measured shapes: one key and one client (like for like with the one-client
    /// baseline), one hot key contended by `clients`, and 1 000 keys shared by `clients`.
    fn shapes(clients: usize) -> [(usize, usize); 3] {
        [(1, 1), (1, clients), (1_000, clients)]
    }

    fn row(name: &str, keys: usize, clients: usize, rate: f64, baseline: f64) {
        println!("{name:<10} {keys:<6} {clients:<8} {rate:>10.0} {baseline:>12.0} {:>7.2}", rate / baseline);
    }

    /// One connection, `n` times: BEGIN; nextval (or the SQLite counter); upsert the key's
    /// row; COMMIT; then DELETE the row (autocommit).
    async fn baseline_rate(url: &str, n: usize) -> f64 {
        drop(dlock_lock_server::store_sql::open(url).await.expect("migrate"));
        if url.starts_with("sqlite") {
            let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
            sqlx::query("PRAGMA journal_mode=WAL").execute(&mut c).await.expect("wal");
            sqlx::query("PRAGMA synchronous=FULL").execute(&mut c).await.expect("sync");
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_locks (k TEXT PRIMARY KEY, t INTEGER NOT NULL)")
                .execute(&mut c)
                .await
                .expect("t");
            let start = Instant::now();
            for _ in 0..n {
                let mut tx = c.begin().await.expect("begin");
                let t: i64 = sqlx::query_scalar(
                    "UPDATE token_floor SET last_issued = last_issued + 1 WHERE id = 1 RETURNING last_issued",
                )
                .fetch_one(&mut *tx)
                .await
                .expect("token");
                sqlx::query(
                    "INSERT INTO bench_locks (k, t) VALUES ('hot', ?1) ON CONFLICT (k) DO UPDATE SET t = excluded.t",
                )
                .bind(t)
                .execute(&mut *tx)
                .await
                .expect("upsert");
                tx.commit().await.expect("commit");
                sqlx::query("DELETE FROM bench_locks WHERE k = 'hot'").execute(&mut c).await.expect("delete");
            }
            n as f64 / start.elapsed().as_secs_f64()
        } else {
            let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
            sqlx::query("CREATE TABLE IF NOT EXISTS bench_locks (k TEXT PRIMARY KEY, t BIGINT NOT NULL)")
                .execute(&mut c)
                .await
                .expect("t");
            let start = Instant::now();
            for _ in 0..n {
                let mut tx = c.begin().await.expect("begin");
                let t: i64 = sqlx::query_scalar("SELECT nextval('fencing_token_seq')")
                    .fetch_one(&mut *tx)
                    .await
                    .expect("nextval");
                sqlx::query(
                    "INSERT INTO bench_locks (k, t) VALUES ('hot', $1) ON CONFLICT (k) DO UPDATE SET t = EXCLUDED.t",
                )
                .bind(t)
                .execute(&mut *tx)
                .await
                .expect("upsert");
                tx.commit().await.expect("commit");
                sqlx::query("DELETE FROM bench_locks WHERE k = 'hot'").execute(&mut c).await.expect("delete");
            }
            n as f64 / start.elapsed().as_secs_f64()
        }
    }

    async fn server_rate(url: &str, n: usize, clients: usize, keys: usize) -> f64 {
        store_rate(dlock_lock_server::store_sql::open(url).await.expect("open"), n, clients, keys).await
    }

    async fn store_rate(
        store: std::sync::Arc<dyn dlock_lock_server::store::LockStore>,
        n: usize,
        clients: usize,
        keys: usize,
    ) -> f64 {
        let server = LockServer::new(store, LockServerConfig::default(), Clock::system());
        let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
        let serving = tokio::spawn(dlock_rt::http::serve(
            listener,
            dlock_lock_server::app::router(server),
            std::future::pending(),
        ));
        let per_client = n / clients;
        let start = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            let base = base.clone();
            tasks.push(tokio::spawn(async move {
                // As the lock client's transport: acquires on fresh connections, releases kept alive.
                let http = HttpClient::new(1_000, 30_000);
                let release = HttpClient::new(1_000, 30_000).with_keep_alive();
                let owner = format!("bench-{c}");
                let json = [("content-type", "application/json"), ("x-owner-id", owner.as_str())];
                let r = http
                    .send(&base, http::Method::POST, "/v1/sessions", &json, Some(r#"{"ttlMillis":60000}"#.into()))
                    .await
                    .expect("session");
                let sid = serde_json::from_slice::<serde_json::Value>(&r.body).expect("json")["sessionId"]
                    .as_str()
                    .expect("sid")
                    .to_owned();
                let mut done = 0;
                let mut i = c;
                while done < per_client {
                    let key = format!("k{}", i % keys);
                    i += clients;
                    let body = format!(r#"{{"sessionId":"{sid}","waitMillis":10000}}"#);
                    let r = http
                        .send(&base, http::Method::POST, &format!("/v1/locks/{key}/acquire"), &json, Some(body.into()))
                        .await
                        .expect("acquire");
                    if r.status != 200 {
                        continue;
                    }
                    let token = serde_json::from_slice::<serde_json::Value>(&r.body).expect("json")["fencingToken"]
                        .as_i64()
                        .expect("token")
                        .to_string();
                    let r = release
                        .send(
                            &base,
                            http::Method::DELETE,
                            &format!("/v1/locks/{key}?sessionId={sid}"),
                            &[("x-owner-id", owner.as_str()), ("x-fencing-token", &token)],
                            None,
                        )
                        .await
                        .expect("release");
                    assert_eq!(r.status, 204);
                    done += 1;
                }
            }));
        }
        for t in tasks {
            t.await.expect("client");
        }
        let rate = (per_client * clients) as f64 / start.elapsed().as_secs_f64();
        serving.abort();
        rate
    }
}
