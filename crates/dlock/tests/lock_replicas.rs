//! Two lock-server replicas over one backend, hammered on one key by many clients. A
//! checker over the recorded holds proves that no two grants of the key overlapped in
//! time, and that tokens, taken in grant order, strictly increase.
//!
//! Holds are measured on this test process's monotonic clock: a hold starts when the grant
//! arrives and ends when the release is sent, so an overlap means two clients were told
//! they held the key at the same moment.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use dlock_rt::http::BaseUrl;
use dlock_rt::Instant;
use dlock_testkit::{fresh_database, Db};
use serde_json::{json, Value};

/// Clients per replica.
const CLIENTS_PER_REPLICA: usize = 4;
/// Grants each client takes.
const ROUNDS_PER_CLIENT: usize = 10;

#[derive(Debug, Clone, Copy)]
struct Hold {
    token: i64,
    start: Instant,
    end: Instant,
}

async fn post(base: &BaseUrl, path: &str, headers: &[(&str, &str)], body: Value) -> (u16, Value) {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    let r = client()
        .send(base, http::Method::POST, path, &all, Some(body.to_string().into()))
        .await
        .expect("lock server answered");
    (r.status, json_of(&r))
}

async fn client_loop(base: BaseUrl, owner: String, holds: Arc<Mutex<Vec<Hold>>>) {
    let (s, v) = post(&base, "/v1/sessions", &[("x-owner-id", &owner)], json!({ "ttlMillis": 30_000 })).await;
    assert_eq!(s, 201, "{v}");
    let sid = v["sessionId"].as_str().expect("sessionId").to_owned();
    let mut taken = 0;
    while taken < ROUNDS_PER_CLIENT {
        let (s, g) = post(
            &base,
            "/v1/locks/hot/acquire",
            &[("x-owner-id", &owner)],
            json!({ "sessionId": sid, "ttlMillis": 30_000, "waitMillis": 10_000 }),
        )
        .await;
        match s {
            200 => {}
            409 | 429 => continue,
            other => panic!("acquire answered {other}: {g}"),
        }
        let start = Instant::now();
        let token = g["fencingToken"].as_i64().expect("token");
        tokio::task::yield_now().await;
        let end = Instant::now();
        let t = token.to_string();
        let r = client()
            .send(
                &base,
                http::Method::DELETE,
                &format!("/v1/locks/hot?sessionId={sid}"),
                &[("x-owner-id", &owner), ("x-fencing-token", &t)],
                None,
            )
            .await
            .expect("release answered");
        assert_eq!(r.status, 204, "{:?}", json_of(&r));
        holds.lock().expect("holds").push(Hold { token, start, end });
        taken += 1;
    }
}

async fn two_replicas_never_grant_one_key_twice(db: Db) {
    let (url, _dir) = fresh_database(db).await;
    let args = ["lock-server", "--database-url", &url, "--wait-poll-ms", "10"];
    hammer([Service::start(&args), Service::start(&args)]).await;
}

async fn hammer(replicas: [Service; 2]) {
    let holds = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (r, replica) in replicas.iter().enumerate() {
        for c in 0..CLIENTS_PER_REPLICA {
            let base = replica.base.clone();
            let holds = holds.clone();
            tasks.push(tokio::spawn(client_loop(base, format!("r{r}-c{c}"), holds)));
        }
    }
    for t in tasks {
        t.await.expect("client");
    }
    let mut holds = holds.lock().expect("holds").clone();
    assert_eq!(holds.len(), 2 * CLIENTS_PER_REPLICA * ROUNDS_PER_CLIENT);
    holds.sort_by_key(|h| h.start);
    for w in holds.windows(2) {
        assert!(w[0].end <= w[1].start, "two holds overlapped: {:?} and {:?}", w[0], w[1]);
        assert!(w[0].token < w[1].token, "tokens went backwards in grant order: {} then {}", w[0].token, w[1].token);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_over_postgres_never_grant_one_key_twice() {
    two_replicas_never_grant_one_key_twice(Db::Postgres).await
}

/// Two replicas over one etcd (the endpoints come from `DLOCK_TEST_ETCD_ENDPOINTS`, which
/// `scripts/test.sh` sets; the test fails without it, it never skips).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_over_etcd_never_grant_one_key_twice() {
    let prefix = format!("/dlock-test-{}", uuid::Uuid::new_v4().simple());
    let args = etcd_lock_server_args(&prefix, &["--wait-poll-ms", "10"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    hammer([Service::start(&args), Service::start(&args)]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_over_sqlite_never_grant_one_key_twice() {
    two_replicas_never_grant_one_key_twice(Db::Sqlite).await
}
