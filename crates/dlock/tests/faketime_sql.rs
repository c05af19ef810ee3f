//! The real thing on the SQL backends (issue 35, part 4; C1 §1.4.2): a wall clock stepped an
//! hour forward, then back, in the middle of leases. `libfaketimeMT` is preloaded into the
//! process itself (never the `faketime` wrapper, which forks), with its offset read from a
//! file on every clock read (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`), so the test
//! steps a running process's wall clock by rewriting the file. Monotonic clocks stay the
//! host's. Two stepped clocks:
//! - **SQLite**: the lock server's own, which is also SQLite's (it is embedded);
//! - **PostgreSQL**: the database server's, a private cluster started for the test under
//!   libfaketime, under two lock servers whose own wall clocks run 20 s ahead of the host's
//!   and 20 s behind (a grant through each is taken over through the other).
//!
//! Through each step, measured on this test process's monotonic clock (host time):
//! - no two live grants: a grant is not given to another session before its lease is over
//!   (less one tick's advance of lockdb's clock, `CLOCK_ADVANCE_MS_MAX`: C1 §1.4.2);
//! - takeover within the lease plus [`TAKEOVER_SLACK`], a backward step included;
//! - a correct heartbeat keeps its session: no `410` after the step.
//!
//! `scripts/test.sh` installs Debian's `libfaketime` and `postgresql`; without them the test
//! fails, it never skips. On the old rule (the database's wall clock decides) both cases
//! fail (docs/contracts/requirements.md DL-248).
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use dlock_rt::http::BaseUrl;
use serde_json::{json, Value};

/// Where Debian's `libfaketime` puts its multi-threaded library.
const LIBFAKETIME_MT: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// The lease every grant here takes.
const LEASE_MS: u64 = 2_000;
/// The ttl of the session that heartbeats across the step.
const SESSION_TTL_MS: u64 = 3_000;
/// The step, each way.
const STEP_MS: i64 = 3_600_000;
/// How often a contender asks again.
const POLL: Duration = Duration::from_millis(25);
/// How long after a lease's end a contender may still be refused: lockdb's clock runs up to
/// one tick behind (`CLOCK_TICK_MS`), a poll, and the machine's scheduling.
const TAKEOVER_SLACK: Duration = Duration::from_millis(1_000);
/// Bound on the private PostgreSQL cluster's start.
const PG_START_MAX: Duration = Duration::from_secs(60);

/// The offset a process under libfaketime reads its wall clock with, rewritten to step it.
struct StepFile {
    dir: dlock_testkit::TempDir,
    path: PathBuf,
}

impl StepFile {
    /// A file under /tmp (the postgres OS user must reach it) holding offset `+0`.
    fn new() -> StepFile {
        let dir = tmp_dir("faketime");
        let path = dir.path().join("offset");
        let file = StepFile { dir, path };
        file.set("+0");
        allow_postgres(file.dir.path());
        file
    }

    /// Steps every process reading this file to `offset` (libfaketime's syntax). Written
    /// whole, then renamed over: a reader never sees half an offset.
    fn set(&self, offset: &str) {
        let next = self.dir.path().join("offset.next");
        std::fs::write(&next, format!("{offset}\n")).expect("write offset");
        std::fs::rename(&next, &self.path).expect("rename offset");
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        assert!(
            Path::new(LIBFAKETIME_MT).exists(),
            "{LIBFAKETIME_MT} is missing: install Debian's libfaketime (scripts/test.sh does)"
        );
        vec![
            ("LD_PRELOAD", LIBFAKETIME_MT.to_owned()),
            ("FAKETIME_TIMESTAMP_FILE", self.path.display().to_string()),
            ("FAKETIME_NO_CACHE", "1".to_owned()),
            ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ]
    }
}

/// A fresh directory under /tmp (not $TMPDIR), which the postgres OS user can always reach.
fn tmp_dir(tag: &str) -> dlock_testkit::TempDir {
    let dir = PathBuf::from("/tmp").join(format!("dlock-{tag}-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dlock_testkit::TempDir(dir)
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().map(|o| o.stdout.starts_with(b"0\n")).unwrap_or(false)
}

/// Lets the postgres OS user (which PostgreSQL runs as when the tests run as root) use `dir`.
fn allow_postgres(dir: &Path) {
    if is_root() {
        let ok = Command::new("chown").arg("-R").arg("postgres:postgres").arg(dir).status().expect("chown");
        assert!(ok.success(), "chown {dir:?}");
    }
}

/// `argv` as the postgres OS user when the tests run as root (initdb and postgres refuse root).
fn as_postgres(argv: &[&str]) -> Command {
    let mut c = if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).args(argv);
        c
    } else {
        let mut c = Command::new(argv[0]);
        c.args(&argv[1..]);
        c
    };
    c.stdin(std::process::Stdio::null());
    c
}

/// The PostgreSQL server binaries (Debian: /usr/lib/postgresql/<major>/bin).
fn pg_bin() -> PathBuf {
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("/usr/lib/postgresql: install Debian's postgresql (scripts/test.sh does)")
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|b| b.join("initdb").exists() && b.join("pg_ctl").exists())
        .collect();
    found.sort();
    found.pop().expect("no PostgreSQL server under /usr/lib/postgresql/*/bin")
}

/// A private PostgreSQL cluster whose server runs under libfaketime, reading `step`'s offset;
/// stopped (immediately) when dropped.
struct SteppedPostgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
    _dir: dlock_testkit::TempDir,
}

impl SteppedPostgres {
    fn start(step: &StepFile) -> SteppedPostgres {
        let bin = pg_bin();
        let dir = tmp_dir("pg-stepped");
        allow_postgres(dir.path());
        let data = dir.path().join("data");
        let initdb = bin.join("initdb");
        let out = as_postgres(&[
            &initdb.display().to_string(),
            "-D",
            &data.display().to_string(),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
        ])
        .output()
        .expect("initdb");
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let pg_ctl = bin.join("pg_ctl").display().to_string();
        let opts = format!(
            "-p {port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c fsync=off",
            dir.path().display()
        );
        let log = dir.path().join("postgres.log").display().to_string();
        let mut argv: Vec<String> = vec!["env".into()];
        argv.extend(step.env().into_iter().map(|(k, v)| format!("{k}={v}")));
        argv.extend([
            pg_ctl,
            "-D".into(),
            data.display().to_string(),
            "-o".into(),
            opts,
            "-l".into(),
            log,
            "-w".into(),
            "start".into(),
        ]);
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        let started = as_postgres(&argv).output().expect("pg_ctl start");
        let pg = SteppedPostgres { bin, data, port, _dir: dir };
        assert!(started.status.success(), "pg_ctl start: {}", String::from_utf8_lossy(&started.stderr));
        pg
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Waits until the server answers (bounded by [`PG_START_MAX`]).
    async fn ready(&self) {
        let url = self.url();
        let up = dlock_rt::wait_until(Duration::from_millis(100), PG_START_MAX, || {
            let url = url.clone();
            async move { dlock_db::pg_pool(&url).await.ok() }
        })
        .await;
        assert!(up.is_some(), "the stepped PostgreSQL never answered at {url}");
    }
}

impl Drop for SteppedPostgres {
    fn drop(&mut self) {
        let pg_ctl = self.bin.join("pg_ctl").display().to_string();
        let data = self.data.display().to_string();
        let _ = as_postgres(&[&pg_ctl, "-D", &data, "-m", "immediate", "-w", "stop"]).output();
    }
}

/// The lock servers' constant wall-clock offsets from the host's, in the PostgreSQL case.
const AHEAD: &str = "+20s";
const BEHIND: &str = "-20s";

/// A process's environment for a constant wall-clock `offset` (libfaketime's syntax).
fn offset_env(offset: &str) -> Vec<(&'static str, String)> {
    assert!(Path::new(LIBFAKETIME_MT).exists(), "{LIBFAKETIME_MT} is missing: install Debian's libfaketime");
    vec![
        ("LD_PRELOAD", LIBFAKETIME_MT.to_owned()),
        ("FAKETIME", offset.to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_owned()),
        ("FAKETIME_NO_CACHE", "1".to_owned()),
    ]
}

/// `dlock lock-server` on `url`, with `env` on top of the harness's.
fn lock_server(url: &str, env: &[(&'static str, String)]) -> Service {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    Service::start_with_env(
        &["lock-server", "--database-url", url, "--delay-ms", "0", "--reaper-interval-ms", "200"],
        &env,
    )
}

async fn call(base: &BaseUrl, method: http::Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let headers = [("content-type", "application/json"), ("x-owner-id", "faketime-worker")];
    let r = client().send(base, method, path, &headers, body.map(|b| b.to_string().into())).await.expect("answered");
    (r.status, json_of(&r))
}

async fn session(base: &BaseUrl, ttl_ms: u64) -> String {
    let (s, v) = call(base, http::Method::POST, "/v1/sessions", Some(json!({ "ttlMillis": ttl_ms }))).await;
    assert_eq!(s, 201, "{v}");
    v["sessionId"].as_str().expect("sessionId").to_owned()
}

async fn acquire(base: &BaseUrl, sid: &str, ttl_ms: u64) -> (u16, Value) {
    call(base, http::Method::POST, "/v1/locks/k/acquire", Some(json!({ "sessionId": sid, "ttlMillis": ttl_ms }))).await
}

/// A heartbeat of `sid`, which must be answered `200` (`what` says when): its `serverTime`.
async fn heartbeat(base: &BaseUrl, sid: &str, what: &str) -> i64 {
    let (s, v) = call(base, http::Method::POST, &format!("/v1/sessions/{sid}/heartbeat"), None).await;
    assert_eq!(s, 200, "a correct heartbeat {what} was refused: {v}");
    let at = v["serverTime"].as_str().expect("serverTime");
    chrono::DateTime::parse_from_rfc3339(at).expect("rfc3339").timestamp_millis()
}

/// How long after `sent` session `sid` is granted the key through `base`, asking every
/// [`POLL`]; fails with `what` once `bound` has passed (`common::granted_after`).
async fn granted_after(base: &BaseUrl, sid: &str, sent: Instant, bound: Duration, what: &str) -> Duration {
    common::granted_after(|| acquire(base, sid, LEASE_MS), sent, bound, POLL, what).await
}

/// Whose wall clock the step moves.
enum Stepped {
    /// The lock server's (SQLite's too: it is embedded).
    LockServer,
    /// The PostgreSQL server's at this URL.
    Postgres(String),
}

impl Stepped {
    fn name(&self) -> &'static str {
        match self {
            Stepped::LockServer => "the lock server's wall clock",
            Stepped::Postgres(_) => "PostgreSQL's wall clock",
        }
    }

    /// The stepped wall clock now (epoch ms): the lock server's `serverTime` in the answer
    /// to `beat`, or PostgreSQL's `clock_timestamp()`.
    async fn wall(&self, beat: i64) -> i64 {
        match self {
            Stepped::LockServer => beat,
            Stepped::Postgres(url) => {
                let pool = dlock_db::pg_pool(url).await.expect("pool");
                sqlx::query_scalar::<_, i64>("SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT")
                    .fetch_one(&pool)
                    .await
                    .expect("PostgreSQL's clock")
            }
        }
    }
}

/// The whole case on lock servers `a` and `b` (one server: the same) whose leases the clock
/// `step` steers under the old rule: a grant through `a`, a step forward an hour during its
/// lease, a takeover through `b`, a step back two hours during that lease, a takeover
/// through `a`; a session heartbeated through `a` across both.
async fn leases_keep_their_length_through_steps(a: &BaseUrl, b: &BaseUrl, step: &StepFile, stepped: Stepped) {
    let clock_of = stepped.name();
    let base = a;
    let holder = session(a, 60_000).await;
    let contender = session(b, 60_000).await;
    let third = session(a, 60_000).await;
    let beating = session(a, SESSION_TTL_MS).await;
    let before = stepped.wall(heartbeat(base, &beating, "before the step").await).await;

    let sent = Instant::now();
    let (s, g) = acquire(base, &holder, LEASE_MS).await;
    assert_eq!(s, 200, "{g}");
    step.set("+1h");
    let beat = heartbeat(base, &beating, &format!("just after {clock_of} stepped an hour forward")).await;
    let after = stepped.wall(beat).await;
    assert!(after - before >= STEP_MS - 60_000, "{clock_of} moved {} ms: the step is not in effect", after - before);
    let bound = Duration::from_millis(LEASE_MS) + TAKEOVER_SLACK;
    let taken = granted_after(b, &contender, sent, bound, "no takeover within the lease and the slack").await;
    // A decision reads lockdb's clock as its last tick left it, so a lease may end up to one
    // tick's advance early in true time (C1 §1.4.2), never more.
    let earliest = Duration::from_millis(LEASE_MS - dlock_lock_server::lockdb_clock::CLOCK_ADVANCE_MS_MAX);
    assert!(taken >= earliest, "granted again {taken:?} after a {LEASE_MS} ms grant");
    heartbeat(base, &beating, "after the forward step").await;

    let sent = Instant::now();
    step.set("-1h");
    heartbeat(base, &beating, &format!("just after {clock_of} stepped two hours back")).await;
    let taken = granted_after(a, &third, sent, bound, "after a backward step, no takeover within the lease").await;
    assert!(taken < bound, "taken over {taken:?} after the lease");
    heartbeat(base, &beating, "after the backward step").await;
}

/// SQLite: the lock server's own wall clock (SQLite's, embedded) steps an hour forward and
/// then two hours back, and every lease keeps its length by host time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_sqlite_a_step_of_the_lock_servers_wall_clock_neither_shortens_nor_stretches_a_lease() {
    let step = StepFile::new();
    let (url, _dir) = dlock_testkit::fresh_database(dlock_testkit::Db::Sqlite).await;
    let server = lock_server(&url, &step.env());
    leases_keep_their_length_through_steps(&server.base, &server.base, &step, Stepped::LockServer).await;
}

/// PostgreSQL: the database server's wall clock steps an hour forward and then two hours
/// back, under two lock servers whose own wall clocks run 20 s ahead of the host's and 20 s
/// behind; a grant through each is taken over through the other. Every lease keeps its
/// length by host time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_postgresql_a_step_of_the_database_servers_wall_clock_neither_shortens_nor_stretches_a_lease() {
    let step = StepFile::new();
    let pg = SteppedPostgres::start(&step);
    pg.ready().await;
    let ahead = lock_server(&pg.url(), &offset_env(AHEAD));
    let behind = lock_server(&pg.url(), &offset_env(BEHIND));
    leases_keep_their_length_through_steps(&ahead.base, &behind.base, &step, Stepped::Postgres(pg.url())).await;
}
