//! The real thing (issue 35, part 4; C1 §1.5.4): two `dlock lock-server` processes on one
//! real etcd, each with `libfaketimeMT` preloaded into `dlock` itself (not the `faketime`
//! wrapper, which forks and would leave the skewed process running when signalled): one's
//! wall clock 20 s ahead of the host's, the other's 20 s behind. Their monotonic clocks are
//! the host's (`FAKETIME_DONT_FAKE_MONOTONIC=1`). Everything is measured on this test
//! process's monotonic clock, the host time of both replicas:
//! - no two live grants: a grant made through the replica behind is not granted again
//!   through the one ahead before its lease is over, and is taken over within the lease
//!   plus [`TAKEOVER_SLACK`];
//! - no session expired by a correct heartbeat: a heartbeat through the replica behind
//!   keeps the session live through the one ahead;
//! - lock-delay honoured: the delay a lost grant imposes holds on the other replica for its
//!   whole time.
//!
//! `scripts/test.sh` installs Debian's `libfaketime`; without it the test fails, it never
//! skips. On the old rule (a replica's wall clock against a deadline another wrote) every
//! case fails (docs/contracts/requirements.md DL-247).
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

mod common;

use std::time::{Duration, Instant};

use common::*;
use dlock_rt::http::BaseUrl;
use serde_json::{json, Value};

/// Where Debian's `libfaketime` puts its multi-threaded library.
const LIBFAKETIME_MT: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";
/// The replicas' wall-clock offsets from the host's.
const AHEAD: &str = "+20s";
const BEHIND: &str = "-20s";
/// How often a contender asks again.
const POLL: Duration = Duration::from_millis(25);
/// How long after a lease's end a contender through the other replica may still be
/// refused: one reaper interval for that replica to see the grant (docs: C1 §1.5.4), a
/// poll, and the machine's scheduling.
const TAKEOVER_SLACK: Duration = Duration::from_millis(1_500);
/// The lock-delay the lock-delay case's replicas impose.
const DELAY_MS: u64 = 1_500;

/// One lock server on the test etcd under `prefix`, its wall clock at `offset`, imposing a
/// lock-delay of `delay_ms`.
fn replica(prefix: &str, offset: &str, delay_ms: u64) -> Service {
    assert!(
        std::path::Path::new(LIBFAKETIME_MT).exists(),
        "{LIBFAKETIME_MT} is missing: install Debian's libfaketime (scripts/test.sh does)"
    );
    let delay = delay_ms.to_string();
    let args = etcd_lock_server_args(prefix, &["--delay-ms", &delay, "--reaper-interval-ms", "200"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let env = [
        ("LD_PRELOAD", LIBFAKETIME_MT),
        ("FAKETIME", offset),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
        ("FAKETIME_NO_CACHE", "1"),
    ];
    Service::start_with_env(&args, &env)
}

/// Two replicas over one fresh prefix: (ahead, behind).
fn replicas(delay_ms: u64) -> (Service, Service) {
    let prefix = format!("/dlock-faketime-{}", uuid::Uuid::new_v4().simple());
    (replica(&prefix, AHEAD, delay_ms), replica(&prefix, BEHIND, delay_ms))
}

async fn call(
    base: &BaseUrl,
    method: http::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (u16, Value) {
    let mut all = vec![("content-type", "application/json"), ("x-owner-id", "faketime-worker")];
    all.extend_from_slice(headers);
    let r = client().send(base, method, path, &all, body.map(|b| b.to_string().into())).await.expect("answered");
    (r.status, json_of(&r))
}

async fn session(base: &BaseUrl, ttl_ms: u64) -> String {
    let (s, v) = call(base, http::Method::POST, "/v1/sessions", &[], Some(json!({ "ttlMillis": ttl_ms }))).await;
    assert_eq!(s, 201, "{v}");
    v["sessionId"].as_str().expect("sessionId").to_owned()
}

async fn acquire(base: &BaseUrl, key: &str, sid: &str, ttl_ms: u64) -> (u16, Value) {
    let body = json!({ "sessionId": sid, "ttlMillis": ttl_ms });
    call(base, http::Method::POST, &format!("/v1/locks/{key}/acquire"), &[], Some(body)).await
}

/// How long after `sent` session `sid` is granted the key through `base`, asking every
/// [`POLL`]; fails with `what` once `bound` has passed (`common::granted_after`).
async fn granted_after(base: &BaseUrl, sid: &str, sent: Instant, bound: Duration, what: &str) -> Duration {
    common::granted_after(|| acquire(base, "k", sid, 60_000), sent, bound, POLL, what).await
}

/// The replicas really run on clocks 40 s apart: each one's `serverTime`.
async fn assert_skewed(ahead: &BaseUrl, behind: &BaseUrl) {
    let mut time = Vec::new();
    for base in [ahead, behind] {
        let sid = session(base, 60_000).await;
        let (s, v) = call(base, http::Method::POST, &format!("/v1/sessions/{sid}/heartbeat"), &[], None).await;
        assert_eq!(s, 200, "{v}");
        let at = v["serverTime"].as_str().expect("serverTime");
        time.push(chrono::DateTime::parse_from_rfc3339(at).expect("rfc3339").timestamp_millis());
    }
    let apart = time[0] - time[1];
    assert!(
        (35_000..45_000).contains(&apart),
        "the replicas' clocks are {apart} ms apart, not 40 s: libfaketime is not in effect"
    );
}

/// A grant made through the replica behind is not granted again through the one ahead
/// while it lives (by host time), and is taken over within its lease plus the slack.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_40_s_ahead_of_the_granting_one_takes_over_only_after_the_lease() {
    const LEASE_MS: u64 = 2_000;
    let (ahead, behind) = replicas(0);
    assert_skewed(&ahead.base, &behind.base).await;
    let holder = session(&behind.base, 60_000).await;
    let contender = session(&ahead.base, 60_000).await;
    let sent = Instant::now();
    let (s, g) = acquire(&behind.base, "k", &holder, LEASE_MS).await;
    assert_eq!(s, 200, "{g}");
    let bound = Duration::from_millis(LEASE_MS) + TAKEOVER_SLACK;
    let taken = granted_after(&ahead.base, &contender, sent, bound, "no takeover within the slack").await;
    assert!(taken >= Duration::from_millis(LEASE_MS), "granted again after {taken:?}: two live grants");
}

/// A correct heartbeat through the replica behind keeps the session live through the one
/// ahead: it is not judged expired there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_heartbeat_through_the_replica_behind_keeps_the_session_live_through_the_one_ahead() {
    const TTL_MS: u64 = 3_000;
    let (ahead, behind) = replicas(0);
    let sid = session(&ahead.base, TTL_MS).await;
    let opened = Instant::now();
    tokio::time::sleep(Duration::from_millis(TTL_MS / 3)).await;
    let (s, v) = call(&behind.base, http::Method::POST, &format!("/v1/sessions/{sid}/heartbeat"), &[], None).await;
    assert_eq!(s, 200, "{v}");
    let beat = Instant::now();
    tokio::time::sleep((opened + Duration::from_millis(TTL_MS + 300)).saturating_duration_since(Instant::now())).await;
    let (s, v) = call(&ahead.base, http::Method::POST, &format!("/v1/sessions/{sid}/heartbeat"), &[], None).await;
    if beat.elapsed() < Duration::from_millis(TTL_MS) {
        assert_eq!(s, 200, "a session heartbeat {:?} ago through the other replica: {v}", beat.elapsed());
    }
}

/// The lock-delay of a grant lost through the replica behind holds on the one ahead for its
/// whole time after the lease ended (by host time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_delay_recorded_by_one_replica_holds_on_the_other_for_its_time() {
    const LEASE_MS: u64 = 1_000;
    let (ahead, behind) = replicas(DELAY_MS);
    let holder = session(&behind.base, 60_000).await;
    let other = session(&behind.base, 60_000).await;
    let contender = session(&ahead.base, 60_000).await;
    let sent = Instant::now();
    let (s, g) = acquire(&behind.base, "k", &holder, LEASE_MS).await;
    assert_eq!(s, 200, "{g}");
    // The replica behind judges the lease lost and records the delay (its own acquire is
    // then refused with lockDelayUntil).
    loop {
        let (s, v) = acquire(&behind.base, "k", &other, 60_000).await;
        assert_eq!(s, 409, "{v}");
        if v["details"]["lockDelayUntil"].is_string() {
            break;
        }
        assert!(sent.elapsed() < Duration::from_millis(LEASE_MS) + TAKEOVER_SLACK, "the lease never lapsed");
        tokio::time::sleep(POLL).await;
    }
    let bound = Duration::from_millis(LEASE_MS + DELAY_MS) + 2 * TAKEOVER_SLACK;
    let granted =
        granted_after(&ahead.base, &contender, sent, bound, "the lock-delay never ended on the replica ahead").await;
    assert!(
        granted >= Duration::from_millis(LEASE_MS + DELAY_MS),
        "granted {granted:?} after the grant: the {DELAY_MS} ms delay after a {LEASE_MS} ms lease was cut short"
    );
}
