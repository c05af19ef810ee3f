//! T-024's nine acceptance criteria, with every service a real `dlock` process on
//! loopback, on SQLite and on PostgreSQL. Criterion 1 (the build, fmt and clippy) is the
//! CI gate itself; the rest are here. Assertions about the rail use the stub's own call
//! log (`GET /calls`), never the proxy's logs.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

#[macro_use]
mod common;

use std::sync::Arc;

use common::*;
use dlock_contract::payout::PayoutState;
use dlock_contract::rail::SubmissionOutcome;
use dlock_rail_proxy::store::RailStore;
use dlock_testkit::{fresh_database, Db, TempDir};

struct Cluster {
    stub: Service,
    proxy: Service,
    store: Arc<dyn RailStore>,
    db_url: String,
    _dir: TempDir,
}

async fn cluster(db: Db, stub_args: &[&str], proxy_args: &[&str]) -> Cluster {
    let (url, dir) = fresh_database(db).await;
    let mut s = vec!["rail-stub", "--seed", "7"];
    s.extend_from_slice(stub_args);
    let stub = Service::start(&s);
    let rail = stub.url();
    let mut p = vec!["rail-proxy", "--database-url", &url, "--rail-url", &rail];
    p.extend_from_slice(proxy_args);
    let proxy = Service::start(&p);
    let store = dlock_rail_proxy::store_sql::open(&url).await.expect("open paydb");
    Cluster { stub, proxy, store, db_url: url, _dir: dir }
}

async fn strictly_greater_token_is_acked_and_advances_the_mark(db: Db) {
    let c = cluster(db, &[], &[]).await;
    let p = claimed_payout(&*c.store, "acct-1", 1_250).await;
    let r = submit(&c.proxy, p, "acct-1", 1_250, "42").await;
    assert_eq!(r.status, 200, "{:?}", json_of(&r));
    let body = json_of(&r);
    assert_eq!(body["outcome"], "ACKED");
    assert_eq!(body["presentedToken"], 42);
    assert_eq!(body["payoutId"], p.to_string());
    assert!(body["railReference"].as_str().is_some_and(|s| !s.is_empty()));
    assert_eq!(c.store.high_water("acct-1").await, Ok(Some(42)));
    let payout = c.store.payout(p).await.expect("read").expect("exists");
    assert_eq!(payout.state, PayoutState::RailAcked);
    let rows = c.store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, Some(SubmissionOutcome::Acked));
    assert_eq!(rows[0].rail_reference.as_deref(), body["railReference"].as_str());
}

async fn lower_or_equal_token_is_fenced_with_a_fenced_row(db: Db) {
    let c = cluster(db, &[], &[]).await;
    let p1 = claimed_payout(&*c.store, "acct-1", 100).await;
    let p2 = claimed_payout(&*c.store, "acct-1", 100).await;
    assert_eq!(submit(&c.proxy, p1, "acct-1", 100, "42").await.status, 200);
    for token in ["42", "41", "1"] {
        let r = submit(&c.proxy, p2, "acct-1", 100, token).await;
        assert_eq!(r.status, 409, "token {token}");
        let e = json_of(&r);
        assert_eq!(e["code"], "FENCED_OUT");
        assert_eq!(e["retrySafe"], false);
        let d = &e["details"];
        assert_eq!(d["presentedToken"].as_i64(), token.parse::<i64>().ok());
        assert_eq!(d["highestToken"], 42);
        assert_eq!(d["resourceType"], "rail");
        assert_eq!(d["resourceId"], "acct-1");
        assert_eq!(d["ownerId"], "worker-1");
        assert_eq!(d["outcome"], "FENCED");
    }
    let rows = c.store.submissions(Some(p2)).await.expect("rows");
    assert_eq!(rows.len(), 3);
    assert!(rows.iter().all(|r| r.outcome == Some(SubmissionOutcome::Fenced)));
    assert_eq!(c.store.payout(p2).await.expect("read").expect("exists").state, PayoutState::Claimed);
    assert_eq!(c.store.high_water("acct-1").await, Ok(Some(42)));
}

async fn fenced_path_makes_no_rail_call(db: Db) {
    let c = cluster(db, &[], &[]).await;
    let p1 = claimed_payout(&*c.store, "acct-1", 100).await;
    let p2 = claimed_payout(&*c.store, "acct-1", 100).await;
    assert_eq!(submit(&c.proxy, p1, "acct-1", 100, "42").await.status, 200);
    assert_eq!(submit(&c.proxy, p2, "acct-1", 100, "41").await.status, 409);
    let calls = rail_calls(&c.stub).await;
    let refs: Vec<_> = calls.iter().map(|c| c["clientRef"].as_str().unwrap_or("").to_owned()).collect();
    assert_eq!(refs, [p1.to_string()], "the stub saw a call for the fenced payout");
}

async fn repeat_payout_is_a_counted_duplicate(db: Db) {
    let c = cluster(db, &[], &[]).await;
    let p = claimed_payout(&*c.store, "acct-1", 100).await;
    let first = submit(&c.proxy, p, "acct-1", 100, "42").await;
    assert_eq!(first.status, 200);
    let again = submit(&c.proxy, p, "acct-1", 100, "43").await;
    assert_eq!(again.status, 409);
    let e = json_of(&again);
    assert_eq!(e["code"], "DUPLICATE_SUBMISSION");
    assert_eq!(e["details"]["firstSubmissionId"], json_of(&first)["submissionId"]);
    assert_eq!(e["details"]["firstSubmittedAt"], json_of(&first)["submittedAt"]);
    let metrics = String::from_utf8_lossy(&get(&c.proxy, "/metrics").await.body).into_owned();
    assert!(metrics.contains("\nrail_duplicate_attempted_total 1\n"), "{metrics}");
    assert_eq!(rail_calls(&c.stub).await.len(), 1);
    let outcomes: Vec<_> = c.store.submissions(Some(p)).await.expect("rows").iter().map(|r| r.outcome).collect();
    assert_eq!(outcomes, [Some(SubmissionOutcome::Acked), Some(SubmissionOutcome::Duplicate)]);
}

async fn rail_slower_than_the_read_timeout_is_ambiguous_with_one_timeout_row(db: Db) {
    let c = cluster(db, &["--latency-ms", "1500"], &["--read-timeout-ms", "300"]).await;
    let p = claimed_payout(&*c.store, "acct-1", 100).await;
    let r = submit(&c.proxy, p, "acct-1", 100, "42").await;
    assert_eq!(r.status, 409);
    let e = json_of(&r);
    assert_eq!(e["code"], "RAIL_AMBIGUOUS");
    assert_eq!(e["retrySafe"], false);
    assert_eq!(e["details"]["outcome"], "TIMEOUT");
    let rows = c.store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows.len(), 1, "exactly one row");
    assert_eq!(rows[0].outcome, Some(SubmissionOutcome::Timeout));
    assert!(rows[0].resolved_at.is_some());
    assert_eq!(c.store.payout(p).await.expect("read").expect("exists").state, PayoutState::RailAmbiguous);
    // The rail saw exactly one call, whatever it then did with it.
    assert_eq!(rail_calls(&c.stub).await.len(), 1);
    // And the quarantine holds against a newer token.
    let later = submit(&c.proxy, p, "acct-1", 100, "99").await;
    assert_eq!(json_of(&later)["code"], "DUPLICATE_SUBMISSION");
    assert_eq!(rail_calls(&c.stub).await.len(), 1);
}

async fn restarting_the_proxy_does_not_readmit_a_lower_token(db: Db) {
    let mut c = cluster(db, &[], &[]).await;
    let p1 = claimed_payout(&*c.store, "acct-1", 100).await;
    let p2 = claimed_payout(&*c.store, "acct-1", 100).await;
    assert_eq!(submit(&c.proxy, p1, "acct-1", 100, "42").await.status, 200);
    c.proxy.crash_and_restart();
    let r = submit(&c.proxy, p2, "acct-1", 100, "41").await;
    assert_eq!(r.status, 409);
    assert_eq!(json_of(&r)["code"], "FENCED_OUT");
    let rows = c.store.submissions(Some(p2)).await.expect("rows");
    assert_eq!(rows.iter().map(|r| r.outcome).collect::<Vec<_>>(), [Some(SubmissionOutcome::Fenced)]);
    assert_eq!(rail_calls(&c.stub).await.len(), 1);
}

async fn the_mark_lives_in_the_database_not_in_the_process(db: Db) {
    let c = cluster(db, &[], &[]).await;
    // A second replica over the same paydb: a stale writer gains nothing by switching pods.
    let (url, rail) = (c.db_url.clone(), c.stub.url());
    let replica = Service::start(&["rail-proxy", "--database-url", &url, "--rail-url", &rail]);
    let p1 = claimed_payout(&*c.store, "acct-1", 100).await;
    let p2 = claimed_payout(&*c.store, "acct-1", 100).await;
    let p3 = claimed_payout(&*c.store, "acct-1", 100).await;
    assert_eq!(submit(&c.proxy, p1, "acct-1", 100, "42").await.status, 200);
    assert_eq!(json_of(&submit(&replica, p2, "acct-1", 100, "41").await)["code"], "FENCED_OUT");
    // The replica admitted 50; the first process, never told, must fence 45 all the same.
    assert_eq!(submit(&replica, p2, "acct-1", 100, "50").await.status, 200);
    assert_eq!(json_of(&submit(&c.proxy, p3, "acct-1", 100, "45").await)["code"], "FENCED_OUT");
    assert_eq!(c.store.high_water("acct-1").await, Ok(Some(50)));
}

async fn metrics_expose_only_pinned_tag_values(db: Db) {
    let c = cluster(db, &[], &[]).await;
    let p1 = claimed_payout(&*c.store, "acct-1", 100).await;
    let p2 = claimed_payout(&*c.store, "acct-1", 100).await;
    submit(&c.proxy, p1, "acct-1", 100, "42").await;
    submit(&c.proxy, p2, "acct-1", 100, "41").await;
    submit(&c.proxy, p1, "acct-1", 100, "43").await;
    let text = String::from_utf8_lossy(&get(&c.proxy, "/metrics").await.body).into_owned();
    // Every family's labels, each with its closed value set (`le`: the histograms' buckets).
    let buckets: Vec<String> = dlock_http::metrics::HOP_BUCKETS_SECONDS
        .iter()
        .chain(&dlock_http::metrics::RAIL_BUCKETS_SECONDS)
        .map(f64::to_string)
        .chain(["+Inf".to_owned()])
        .collect();
    let le: Vec<&str> = buckets.iter().map(String::as_str).collect();
    let store_ops: &[&str] = &[
        "ping",
        "payout",
        "admit",
        "resolve",
        "admit_batch",
        "resolve_batch",
        "high_water",
        "submissions",
        "unresolved_before",
        "insert_payout",
        "read_events",
        "cursor_secret",
    ];
    let rail_calls: &[&str] = &["acked", "rejected", "ambiguous", "unsent"];
    // (family, [(label, its values)]).
    type Labels<'a> = &'a [(&'a str, &'a [&'a str])];
    let pinned: &[(&str, Labels)] = &[
        ("rail_submission_total", &[("outcome", &["fenced", "duplicate", "acked", "rejected", "timeout", "unsent"])]),
        ("lock_fenced_out_total", &[("resource", &["account", "ledger", "rail"])]),
        ("rail_duplicate_attempted_total", &[]),
        ("rail_call_seconds_bucket", &[("outcome", rail_calls), ("le", &le)]),
        ("rail_call_seconds_sum", &[("outcome", rail_calls)]),
        ("rail_call_seconds_count", &[("outcome", rail_calls)]),
        ("rail_store_op_seconds_bucket", &[("op", store_ops), ("le", &le)]),
        ("rail_store_op_seconds_sum", &[("op", store_ops)]),
        ("rail_store_op_seconds_count", &[("op", store_ops)]),
        ("dlock_db_pool_connections", &[("state", &["idle", "in_use"])]),
        ("rail_store_writes_off_writer_total", &[]),
    ];
    let mut families = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (series, _value) = line.rsplit_once(' ').expect("sample line");
        let name = series.split('{').next().unwrap_or(series);
        families.insert(name.to_owned());
        let Some((_, labels)) = pinned.iter().find(|(n, _)| *n == name) else {
            panic!("unexpected series {line}");
        };
        let inner = series.strip_prefix(name).and_then(|s| s.strip_prefix('{')).and_then(|s| s.strip_suffix('}'));
        let pairs: Vec<(&str, &str)> =
            inner.map(|i| i.split(',').map(|p| p.split_once('=').expect("label=value")).collect()).unwrap_or_default();
        assert_eq!(
            pairs.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            labels.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            "{line}"
        );
        for ((_, v), (_, values)) in pairs.iter().zip(labels.iter()) {
            assert!(values.contains(&v.trim_matches('"')), "unpinned tag value in {line}");
        }
    }
    assert_eq!(families.len(), pinned.len(), "{families:?}");
    assert!(!text.contains(&p1.to_string()) && !text.contains(&p2.to_string()), "a payout id leaked into metrics");
    assert!(text.contains("rail_submission_total{outcome=\"acked\"} 1"));
    assert!(text.contains("rail_submission_total{outcome=\"fenced\"} 1"));
    assert!(text.contains("lock_fenced_out_total{resource=\"rail\"} 1"));
    // docs/performance.md "The SQLite writer thread": every admission and resolution ran
    // through the write helper.
    assert!(text.contains("\nrail_store_writes_off_writer_total 0\n"), "{text}");
}

async fn concurrent_interleaved_tokens_forward_each_payout_at_most_once(db: Db) {
    let c = cluster(db, &[], &[]).await;
    let mut payouts = Vec::new();
    for _ in 0..6 {
        payouts.push(claimed_payout(&*c.store, "hot", 100).await);
    }
    let proxy = Arc::new(c.proxy);
    let mut tasks = Vec::new();
    for i in 0..48u32 {
        let token = ((i * 29) % 48 + 1).to_string();
        let p = payouts[(i % 6) as usize];
        let proxy = proxy.clone();
        tasks.push(tokio::spawn(async move {
            let r = submit(&proxy, p, "hot", 100, &token).await;
            (token.parse::<i64>().unwrap_or(0), r.status)
        }));
    }
    let mut acked = Vec::new();
    for t in tasks {
        let (token, status) = t.await.expect("task");
        assert!(matches!(status, 200 | 409), "status {status}");
        if status == 200 {
            acked.push(token);
        }
    }
    let calls = rail_calls(&c.stub).await;
    let mut per_payout = std::collections::BTreeMap::new();
    for call in &calls {
        *per_payout.entry(call["clientRef"].as_str().unwrap_or("").to_owned()).or_insert(0) += 1;
    }
    assert!(per_payout.values().all(|n| *n == 1), "a payout reached the rail twice: {per_payout:?}");
    assert_eq!(calls.len(), acked.len());
    let rows = c.store.submissions(None).await.expect("rows");
    assert_eq!(rows.len(), 48, "every attempt leaves exactly one row");
    let highest_admitted =
        rows.iter().filter(|r| r.outcome != Some(SubmissionOutcome::Fenced)).map(|r| r.presented_token).max();
    assert_eq!(c.store.high_water("hot").await.expect("mark"), highest_admitted);
}

async fn proxy_killed_mid_forward_leaves_the_intent_as_evidence(db: Db) {
    let mut c = cluster(db, &["--latency-ms", "3000"], &[]).await;
    let p = claimed_payout(&*c.store, "acct-1", 100).await;
    let in_flight = submit_in_background(&c.proxy, p, "acct-1", 100, "42");
    // Wait until the rail has the call (the forward is in flight), then kill the proxy.
    wait_for_rail_calls(&c.stub, 1).await;
    c.proxy.crash_and_restart();
    let answered = in_flight.await.expect("task");
    assert!(answered.is_err(), "the caller must see a lost answer, got {answered:?}");
    // The intent committed before the socket opened: it survives the crash, unresolved.
    let rows = c.store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].outcome, None);
    assert_eq!(c.store.payout(p).await.expect("read").expect("exists").state, PayoutState::Submitted);
    // And it still blocks any resubmission, whatever the token.
    let again = submit(&c.proxy, p, "acct-1", 100, "50").await;
    assert_eq!(json_of(&again)["code"], "DUPLICATE_SUBMISSION");
    assert_eq!(rail_calls(&c.stub).await.len(), 1);
}

async fn sigterm_drains_the_in_flight_forward_and_records_it(db: Db) {
    // The rail answers after 6 s: longer than a generic 5 s drain, within the proxy's
    // (connect + read + margin) drain.
    let mut c = cluster(db, &["--latency-ms", "6000"], &[]).await;
    let p = claimed_payout(&*c.store, "acct-1", 100).await;
    let in_flight = submit_in_background(&c.proxy, p, "acct-1", 100, "42");
    wait_for_rail_calls(&c.stub, 1).await;
    let status = tokio::task::block_in_place(|| c.proxy.terminate(std::time::Duration::from_secs(20)));
    assert!(status.is_some_and(|s| s.success()), "the proxy did not drain and exit cleanly: {status:?}");
    let answered = in_flight.await.expect("task").expect("the in-flight request was answered");
    assert_eq!(answered.status, 200, "{:?}", json_of(&answered));
    let rows = c.store.submissions(Some(p)).await.expect("rows");
    assert_eq!(rows.iter().map(|r| r.outcome).collect::<Vec<_>>(), [Some(SubmissionOutcome::Acked)]);
}

on_both_databases!(
    strictly_greater_token_is_acked_and_advances_the_mark,
    lower_or_equal_token_is_fenced_with_a_fenced_row,
    fenced_path_makes_no_rail_call,
    repeat_payout_is_a_counted_duplicate,
    rail_slower_than_the_read_timeout_is_ambiguous_with_one_timeout_row,
    restarting_the_proxy_does_not_readmit_a_lower_token,
    the_mark_lives_in_the_database_not_in_the_process,
    metrics_expose_only_pinned_tag_values,
    concurrent_interleaved_tokens_forward_each_payout_at_most_once,
    proxy_killed_mid_forward_leaves_the_intent_as_evidence,
    sigterm_drains_the_in_flight_forward_and_records_it,
);
