//! Trace propagation and the OTLP exporter (C3-extensions E-17), with every service a real
//! `dlock` process on loopback (SQLite) and a collector stand-in written here: an HTTP
//! server that keeps every OTLP/HTTP JSON export posted to it.
//!
//! One payout attempt is one trace: the executor's root span, its client span per hop, the
//! lock-server's, payment-resource's and rail-proxy's server spans, the proxy's client
//! span to the rail and the rail-stub's server span all share its trace id, each naming
//! its caller's span as parent. The servers' logs carry it; an error answer's `traceId` is
//! the trace id of the request's `traceparent`. A collector that is down changes nothing
//! for the payout.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

#[macro_use]
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use dlock_testkit::{fresh_database, Db, TempDir};
use serde_json::Value;
use uuid::Uuid;

/// Longest the payout may take to be POSTED.
const SETTLE_MS_MAX: u64 = 60_000;
/// Longest the collector may wait for every service's spans of the trace.
const SPANS_MS_MAX: u64 = 30_000;
/// The services that must each export spans of the payout's trace.
const SERVICES: [&str; 5] = ["executor", "lock-server", "payment-resource", "rail-proxy", "rail-stub"];
/// The trace a test presents itself.
const SENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";

/// One exported span, as the collector stand-in keeps it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    trace: String,
    span: String,
    parent: String,
    kind: i64,
    name: String,
    attrs: BTreeMap<String, String>,
}

/// The collector stand-in: `POST /v1/traces` (OTLP/HTTP JSON) appends every span.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Got>>>);

impl Collector {
    fn spans(&self) -> Vec<Got> {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn keep(&self, export: &Value) {
        let mut out = self.0.lock().unwrap_or_else(|p| p.into_inner());
        for rs in export["resourceSpans"].as_array().into_iter().flatten() {
            let service = rs["resource"]["attributes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|a| a["key"] == "service.name")
                .and_then(|a| a["value"]["stringValue"].as_str())
                .unwrap_or("?")
                .to_owned();
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    let text = |k: &str| s[k].as_str().unwrap_or("").to_owned();
                    let attrs = s["attributes"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|a| {
                            let v = &a["value"];
                            let v = v["stringValue"].as_str().map(str::to_owned).unwrap_or_else(|| v.to_string());
                            (a["key"].as_str().unwrap_or("").to_owned(), v)
                        })
                        .collect();
                    out.push(Got {
                        service: service.clone(),
                        trace: text("traceId"),
                        span: text("spanId"),
                        parent: text("parentSpanId"),
                        kind: s["kind"].as_i64().unwrap_or(0),
                        name: text("name"),
                        attrs,
                    });
                }
            }
        }
    }

    /// Serves the stand-in on a free loopback port; returns its URL.
    async fn start(&self) -> String {
        use axum::routing::post;
        let me = self.clone();
        let router = axum::Router::new().route(
            "/v1/traces",
            post(move |body: axum::body::Bytes| {
                let me = me.clone();
                async move {
                    let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                    me.keep(&v);
                    ([("content-type", "application/json")], "{}")
                }
            }),
        );
        let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        tokio::spawn(dlock_rt::http::serve(listener, router, std::future::pending()));
        url
    }
}

struct Cluster {
    stub: Service,
    lock: Service,
    payment: Service,
    proxy: Service,
    executor: Option<Service>,
    logs: BTreeMap<&'static str, Transcript>,
    env: Vec<(String, String)>,
    _dirs: (TempDir, TempDir),
}

impl Cluster {
    /// Every service but the executor, exporting to `collector` with JSON logs kept.
    async fn start(collector: &str) -> Cluster {
        let env: Vec<(String, String)> = [
            ("DLOCK_TELEMETRY_OTLP_ENABLED", "true"),
            ("DLOCK_TELEMETRY_OTLP_ENDPOINT", collector),
            ("DLOCK_LOG", "info,dlock_http=debug"),
            ("DLOCK_LOG_FORMAT", "json"),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let logs: BTreeMap<&'static str, Transcript> = SERVICES.iter().map(|s| (*s, Transcript::default())).collect();
        let e: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let (url, paydb_dir) = fresh_database(Db::Sqlite).await;
        let lock_dir = TempDir::new("lockdb");
        let lockdb = dlock_testkit::sqlite_url(&lock_dir);
        let calm = ["--failure-rate", "0", "--duplicate-ack-rate", "0", "--decline-rate", "0"];
        let mut stub_args = vec!["rail-stub", "--seed", "5", "--latency-ms", "0"];
        stub_args.extend_from_slice(&calm);
        let stub = Service::start_recorded(&stub_args, &e, &logs["rail-stub"]);
        let lock = Service::start_recorded(
            &["lock-server", "--database-url", &lockdb, "--delay-ms", "0", "--reaper-interval-ms", "100"],
            &e,
            &logs["lock-server"],
        );
        let payment =
            Service::start_recorded(&["payment-resource", "--database-url", &url], &e, &logs["payment-resource"]);
        let rail = stub.url();
        let proxy = Service::start_recorded(
            &["rail-proxy", "--database-url", &url, "--rail-url", &rail],
            &e,
            &logs["rail-proxy"],
        );
        Cluster { stub, lock, payment, proxy, executor: None, logs, env, _dirs: (paydb_dir, lock_dir) }
    }

    /// Opens an account, creates one payout, starts one executor; returns the payout.
    async fn one_payout(&mut self) -> Uuid {
        let payment = payment_client(&self.payment);
        open_account(&payment, "open-t", "acct-t", 1_000_000).await;
        let created = create_payout(&payment, "create-t", "acct-t", 1_234, "ben-t").await;
        let args = executor_args(
            &self.lock,
            &self.payment,
            &self.proxy,
            "executor-t",
            &["--concurrency", "1", "--poll-interval-ms", "50"],
        );
        let e: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        self.executor = Some(Service::start_recorded(&strs(&args), &e, &self.logs["executor"]));
        created.payout_id
    }

    async fn wait_posted(&self, id: Uuid) {
        let payment = payment_client(&self.payment);
        let posted = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(SETTLE_MS_MAX), || async {
            payment.payout(id).await.ok().filter(|p| p.state.as_str() == "POSTED").map(|_| ())
        })
        .await;
        assert!(posted.is_some(), "payout {id} was not POSTED: {:?}", payment.payout(id).await.map(|p| p.state));
    }

    fn services(&self) -> Vec<(&'static str, &Service)> {
        let mut out = vec![
            ("lock-server", &self.lock),
            ("payment-resource", &self.payment),
            ("rail-proxy", &self.proxy),
            ("rail-stub", &self.stub),
        ];
        if let Some(e) = &self.executor {
            out.push(("executor", e));
        }
        out
    }

    /// Every service answers an error with the trace id of the `traceparent` it was sent,
    /// and ignores an invalid one (a new trace id).
    async fn error_answers_carry_the_sent_trace(&self) {
        let good = format!("00-{SENT_TRACE}-00f067aa0ba902b7-01");
        let bad = format!("00-{}-00f067aa0ba902b7-01", SENT_TRACE.to_ascii_uppercase());
        for (name, svc) in self.services() {
            for (value, adopted) in [(good.as_str(), true), (bad.as_str(), false)] {
                let h = [("traceparent", value)];
                let r =
                    client().send(&svc.base, http::Method::GET, "/v1/no-such-route", &h, None).await.expect("answered");
                assert!(r.status >= 400, "{name}: {}", r.status);
                let trace = json_of(&r)["traceId"].as_str().unwrap_or("").to_owned();
                assert_eq!(trace.len(), 32, "{name}");
                assert_eq!(trace == SENT_TRACE, adopted, "{name}: traceparent {value} answered traceId {trace}");
            }
        }
    }
}

/// The spans of `id`'s payout attempt, once every service's spans of it arrived and the
/// tree is complete (every parent present); the attempt's trace id with them.
async fn attempt_spans(collector: &Collector, id: Uuid) -> Option<(String, Vec<Got>)> {
    dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(SPANS_MS_MAX), || async {
        let spans = collector.spans();
        let root = spans.iter().find(|s| {
            s.service == "executor" && s.name == "payout_attempt" && s.attrs.get("subject") == Some(&id.to_string())
        })?;
        let trace: Vec<Got> = spans.iter().filter(|s| s.trace == root.trace).cloned().collect();
        let services: BTreeSet<&str> = trace.iter().map(|s| s.service.as_str()).collect();
        let ids: BTreeSet<&str> = trace.iter().map(|s| s.span.as_str()).collect();
        let complete = services.len() == SERVICES.len()
            && trace.iter().all(|s| s.parent.is_empty() || ids.contains(s.parent.as_str()));
        complete.then(|| (root.trace.clone(), trace))
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_payout_attempt_is_one_trace_across_every_hop_and_each_service_exports_its_spans() {
    let collector = Collector::default();
    let url = collector.start().await;
    let mut c = Cluster::start(&url).await;
    let id = c.one_payout().await;
    c.wait_posted(id).await;

    let found = attempt_spans(&collector, id).await;
    let services: BTreeSet<String> = collector.spans().iter().map(|s| s.service.clone()).collect();
    let Some((trace, spans)) = found else {
        panic!("no complete trace of the attempt; services seen: {services:?}; spans: {:#?}", collector.spans());
    };
    assert_eq!(trace.len(), 32);
    assert_ne!(trace, "0".repeat(32));
    let by_id: BTreeMap<&str, &Got> = spans.iter().map(|s| (s.span.as_str(), s)).collect();
    assert_eq!(by_id.len(), spans.len(), "span ids are unique within the trace");
    let roots: Vec<&Got> = spans.iter().filter(|s| s.parent.is_empty()).collect();
    assert_eq!(roots.len(), 1, "one root: the attempt {roots:#?}");
    assert_eq!((roots[0].service.as_str(), roots[0].name.as_str()), ("executor", "payout_attempt"));
    // Each server span's parent is its caller's client span: the executor's for the three
    // services it calls, the rail-proxy's for the rail-stub (itself under the proxy's
    // server span).
    let parent = |s: &Got| by_id.get(s.parent.as_str()).copied();
    for s in spans.iter().filter(|s| s.kind == 2) {
        let p = parent(s).unwrap_or_else(|| panic!("{s:?} has no parent in the trace"));
        assert_eq!(p.kind, 3, "{s:?} is not under a client span");
        let caller = if s.service == "rail-stub" { "rail-proxy" } else { "executor" };
        assert_eq!(p.service, caller, "{s:?} under {p:?}");
        if caller == "rail-proxy" {
            let above = parent(p).expect("the proxy's call has a parent");
            assert_eq!((above.service.as_str(), above.kind), ("rail-proxy", 2), "{above:?}");
        }
    }
    for svc in ["lock-server", "payment-resource", "rail-proxy", "rail-stub"] {
        assert!(spans.iter().any(|s| s.service == svc && s.kind == 2), "no server span from {svc}");
        // Every hop's server log carries the trace id.
        let lines = c.logs[svc].lines();
        assert!(lines.iter().any(|l| l.contains(&trace)), "{svc}'s log never shows trace {trace}");
    }
    // The executor's hops: acquire (lock-server), claim and post (payment-resource), submit
    // (rail-proxy), each a client span of the attempt.
    let hop = |p: &str| match p {
        p if p.starts_with("/v1/locks/") => "lock",
        p if p.starts_with("/v1/payouts/") => "payment",
        p if p.starts_with("/v1/rail/submissions") => "proxy",
        _ => "other",
    };
    let hops: BTreeSet<&str> = spans
        .iter()
        .filter(|s| s.service == "executor" && s.kind == 3)
        .filter_map(|s| s.attrs.get("path"))
        .map(|p| hop(p))
        .collect();
    assert!(hops.is_superset(&BTreeSet::from(["lock", "payment", "proxy"])), "{hops:?}");
    c.error_answers_carry_the_sent_trace().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_down_changes_nothing_for_the_payout() {
    // A port nobody listens on.
    let down = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        format!("http://{}", l.local_addr().expect("addr"))
    };
    let mut c = Cluster::start(&down).await;
    let id = c.one_payout().await;
    c.wait_posted(id).await;
    c.error_answers_carry_the_sent_trace().await;
    // The exporter was on, and failing: it said so (once per outage), and nothing else.
    let said = dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(SPANS_MS_MAX), || async {
        c.logs["rail-proxy"].lines().iter().any(|l| l.contains("otlp_export_failed")).then_some(())
    })
    .await;
    assert!(said.is_some(), "the proxy's exporter never reported the down collector");
}
