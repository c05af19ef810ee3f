//! Acquire+release pairs per second through the lock server's HTTP surface, for one hot
//! key and for 1 000 keys, next to the backend's raw baseline measured in the same run:
//! a PostgreSQL (or SQLite) `nextval` + upsert transaction and a delete transaction, the
//! least any correct implementation must do. Prints the ratio (goal: at least 0.5).
//!
//! Each row has a baseline of its own, interleaved with it: after one untimed run of each
//! (the files grown, the statements prepared), the row's pairs run in [`bench::ROUNDS`]
//! rounds, each right after an equal share of the baseline's, on the same server and the same
//! baseline connection throughout; the ratio is the row's pairs per second over the
//! baseline's, both over all rounds. The disk's flush time drifts by tens of percent within
//! one run (another database flushing, the host), and a baseline taken in the same seconds
//! as its row sees the same drift. (Short runs on fresh connections would not measure the
//! steady state: a SQLite file's last connection to close checkpoints and removes the WAL,
//! which the next one grows again.)
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
    // Real wall-clock time on purpose: a bench measures the real machine, and benches are
    // built only outside the simulation (`cfg(not(madsim))`), so no seam is bypassed.
    use std::sync::Arc;
    use std::time::Instant;

    use dlock_lock_server::service::{AcquireOutcome, LockServer, LockServerConfig};
    use dlock_lock_server::store::LockStore;
    use dlock_rt::http::{BaseUrl, HttpClient};
    use dlock_rt::Clock;
    use sqlx::Connection;

    /// Rounds each row is split into, each after an equal share of its baseline.
    pub const ROUNDS: usize = 4;

    pub async fn run() {
        let n = dlock_testkit::bench::env_usize("DLOCK_BENCH_N", 1_000);
        let clients = dlock_testkit::bench::env_usize("DLOCK_BENCH_CONCURRENCY", 4).max(1);
        println!("lock-server acquire+release bench: n={n} clients={clients} rounds={ROUNDS}");
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
                let mut raw = RawPair::etcd(&endpoints).await;
                raw.run(n).await;
                for (keys, clients) in shapes(clients) {
                    let prefix = format!("/dlock-bench-{}", uuid::Uuid::new_v4().simple());
                    let store =
                        dlock_lock_server::store_etcd::EtcdLockStore::connect(&endpoints, &prefix).await.expect("etcd");
                    let server = Served::start(Arc::new(store)).await;
                    let (rate, baseline) =
                        interleaved(n, clients, &mut raw, &Row::Http { server: &server, keys }).await;
                    row("etcd", keys, clients, rate, baseline);
                }
            }
            Err(_) => println!("etcd       (skipped: set DLOCK_TEST_ETCD_ENDPOINTS to include it)"),
        }
    }

    /// What one row measures.
    enum Row<'a> {
        /// Pairs through the server's HTTP surface, over `keys` keys.
        Http { server: &'a Served, keys: usize },
        /// Pairs through the server's store calls, no HTTP (one client, one key).
        Store(&'a Arc<LockServer>),
    }

    impl Row<'_> {
        /// `m` pairs by `clients` clients; answers pairs per second.
        async fn run(&self, m: usize, clients: usize) -> f64 {
            match self {
                Row::Http { server, keys } => server.run(m, clients, *keys).await,
                Row::Store(server) => store_only_rate(server, m).await,
            }
        }
    }

    /// About `n` pairs of `row` and as many of `raw`, in [`ROUNDS`] rounds of an equal share
    /// of each, the baseline's first (a share is a multiple of `clients`, which split it
    /// evenly), after one untimed share of the row: answers both rates over all rounds, each
    /// the pairs over the sum of their rounds' times.
    async fn interleaved(n: usize, clients: usize, raw: &mut RawPair, row: &Row<'_>) -> (f64, f64) {
        let m = (n / ROUNDS / clients).max(1) * clients;
        row.run(m, clients).await;
        let (mut raw_s, mut row_s) = (0.0, 0.0);
        for _ in 0..ROUNDS {
            raw_s += m as f64 / raw.run(m).await;
            row_s += m as f64 / row.run(m, clients).await;
        }
        let pairs = (m * ROUNDS) as f64;
        (pairs / row_s, pairs / raw_s)
    }

    async fn report(name: &str, url: &str, n: usize, clients: usize) {
        let mut raw = RawPair::open(url).await;
        raw.run(n).await;
        for (keys, clients) in shapes(clients) {
            let server = Served::start(dlock_lock_server::store_sql::open(url).await.expect("open")).await;
            let (rate, baseline) = interleaved(n, clients, &mut raw, &Row::Http { server: &server, keys }).await;
            row(name, keys, clients, rate, baseline);
        }
        let store = dlock_lock_server::store_sql::open(url).await.expect("open");
        let server = LockServer::new(store, LockServerConfig::default(), Clock::system());
        let (store, baseline) = interleaved(n, 1, &mut raw, &Row::Store(&server)).await;
        println!("{name:<10} {:<6} {:<8} {store:>10.0} {baseline:>12.0} {:>7.2}", "store", 1, store / baseline);
    }

    /// The SQLite counter's next token.
    const SQLITE_TOKEN: &str =
        "UPDATE token_floor SET last_issued = last_issued + 1 WHERE id = 1 RETURNING last_issued";
    /// The key's row, holding the token, in SQLite's placeholders.
    const SQLITE_UPSERT: &str =
        "INSERT INTO bench_locks (k, t) VALUES ('hot', ?1) ON CONFLICT (k) DO UPDATE SET t = excluded.t";
    /// PostgreSQL's next token.
    const PG_TOKEN: &str = "SELECT nextval('fencing_token_seq')";
    /// The key's row, holding the token, in PostgreSQL's placeholders.
    const PG_UPSERT: &str =
        "INSERT INTO bench_locks (k, t) VALUES ('hot', $1) ON CONFLICT (k) DO UPDATE SET t = EXCLUDED.t";

    /// One raw SQL pair on connection `$c`: BEGIN; the next token (`$token`); the key's row
    /// holding it (`$upsert`); COMMIT; then DELETE the row (autocommit). A macro, not a
    /// function: the two connection types share no executor bound worth spelling out.
    macro_rules! sql_pair {
        ($c:expr, $token:expr, $upsert:expr) => {{
            let mut tx = $c.begin().await.expect("begin");
            let t: i64 = sqlx::query_scalar($token).fetch_one(&mut *tx).await.expect("token");
            sqlx::query($upsert).bind(t).execute(&mut *tx).await.expect("upsert");
            tx.commit().await.expect("commit");
            sqlx::query("DELETE FROM bench_locks WHERE k = 'hot'").execute(&mut *$c).await.expect("delete");
        }};
    }

    /// The raw baseline, on one connection kept for the whole run.
    enum RawPair {
        /// BEGIN; the SQLite counter; upsert the key's row; COMMIT; then DELETE the row
        /// (autocommit), every commit flushed (`synchronous = FULL`).
        Sqlite(sqlx::SqliteConnection),
        /// BEGIN; `nextval`; upsert the key's row; COMMIT; then DELETE the row (autocommit).
        Postgres(sqlx::PgConnection),
        /// etcd's own lock service: lock/unlock pairs on one name under one lease.
        Etcd { client: Box<etcd_client::Client>, lease: i64, name: String },
    }

    impl RawPair {
        async fn open(url: &str) -> RawPair {
            drop(dlock_lock_server::store_sql::open(url).await.expect("migrate"));
            if url.starts_with("sqlite") {
                let mut c = sqlx::SqliteConnection::connect(url).await.expect("connect");
                sqlx::query("PRAGMA journal_mode=WAL").execute(&mut c).await.expect("wal");
                sqlx::query("PRAGMA synchronous=FULL").execute(&mut c).await.expect("sync");
                sqlx::query("CREATE TABLE IF NOT EXISTS bench_locks (k TEXT PRIMARY KEY, t INTEGER NOT NULL)")
                    .execute(&mut c)
                    .await
                    .expect("t");
                RawPair::Sqlite(c)
            } else {
                let mut c = sqlx::PgConnection::connect(url).await.expect("connect");
                sqlx::query("CREATE TABLE IF NOT EXISTS bench_locks (k TEXT PRIMARY KEY, t BIGINT NOT NULL)")
                    .execute(&mut c)
                    .await
                    .expect("t");
                RawPair::Postgres(c)
            }
        }

        async fn etcd(endpoints: &[String]) -> RawPair {
            let mut client = etcd_client::Client::connect(endpoints, None).await.expect("etcd connect");
            let lease = client.lease_grant(600, None).await.expect("lease").id();
            let name = format!("/dlock-bench-baseline-{}", uuid::Uuid::new_v4().simple());
            RawPair::Etcd { client: Box::new(client), lease, name }
        }

        /// `m` pairs; answers pairs per second.
        async fn run(&mut self, m: usize) -> f64 {
            let start = Instant::now();
            for _ in 0..m {
                match self {
                    RawPair::Sqlite(c) => sql_pair!(c, SQLITE_TOKEN, SQLITE_UPSERT),
                    RawPair::Postgres(c) => sql_pair!(c, PG_TOKEN, PG_UPSERT),
                    RawPair::Etcd { client, lease, name } => {
                        let options = etcd_client::LockOptions::new().with_lease(*lease);
                        let locked = client.lock(name.clone(), Some(options)).await.expect("etcd lock");
                        client.unlock(locked.key().to_vec()).await.expect("etcd unlock");
                    }
                }
            }
            m as f64 / start.elapsed().as_secs_f64()
        }
    }

    /// The pairs of the 1 key / 1 client row through the server's store calls (the
    /// acquire as the HTTP handler makes it, the release on the store's writer), no HTTP.
    async fn store_only_rate(server: &Arc<LockServer>, m: usize) -> f64 {
        let session = uuid::Uuid::new_v4();
        server.write(move |s| async move { s.open_session(session, "bench", 600_000).await }).await.expect("session");
        let start = Instant::now();
        for _ in 0..m {
            let AcquireOutcome::Granted(g) = server.acquire("hot", session, 60_000, 0).await.expect("acquire") else {
                panic!("the one client's key is free")
            };
            let token = g.fencing_token;
            let released = server.write(move |s| async move { s.release("hot", token).await }).await;
            assert!(matches!(released, Ok(Ok(()))), "release: {released:?}");
        }
        m as f64 / start.elapsed().as_secs_f64()
    }

    /// The measured shapes: one key and one client (like for like with the one-client
    /// baseline), one hot key contended by `clients`, and 1 000 keys shared by `clients`.
    fn shapes(clients: usize) -> [(usize, usize); 3] {
        [(1, 1), (1, clients), (1_000, clients)]
    }

    fn row(name: &str, keys: usize, clients: usize, rate: f64, baseline: f64) {
        println!("{name:<10} {keys:<6} {clients:<8} {rate:>10.0} {baseline:>12.0} {:>7.2}", rate / baseline);
    }

    /// A lock server over one store, served on a local port for a row's rounds.
    struct Served {
        base: BaseUrl,
        serving: tokio::task::JoinHandle<()>,
    }

    impl Drop for Served {
        fn drop(&mut self) {
            self.serving.abort();
        }
    }

    impl Served {
        async fn start(store: Arc<dyn LockStore>) -> Served {
            let server = LockServer::new(store, LockServerConfig::default(), Clock::system());
            let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
            let base = BaseUrl::parse(&format!("http://{}", listener.local_addr().expect("addr"))).expect("url");
            let serving = tokio::spawn(dlock_rt::http::serve(
                listener,
                dlock_lock_server::app::router(server),
                std::future::pending(),
            ));
            Served { base, serving }
        }

        /// `m` pairs by `clients` clients (each with a session of its own) over `keys` keys;
        /// answers pairs per second.
        async fn run(&self, m: usize, clients: usize, keys: usize) -> f64 {
            let per_client = m / clients;
            let start = Instant::now();
            let mut tasks = Vec::new();
            for c in 0..clients {
                let base = self.base.clone();
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
                            .send(
                                &base,
                                http::Method::POST,
                                &format!("/v1/locks/{key}/acquire"),
                                &json,
                                Some(body.into()),
                            )
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
            (per_client * clients) as f64 / start.elapsed().as_secs_f64()
        }
    }
}
