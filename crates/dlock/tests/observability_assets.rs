//! The shipped observability assets (`deploy/observability/`) speak about metrics that
//! exist: every metric name in an alert rule, in the alert rules' unit tests and in the
//! Grafana dashboard is exported by a real `dlock` process's `/metrics`, with every label
//! value a selector names; and `scripts/test.sh` runs `promtool check rules` and
//! `promtool test rules` on them, so a rule that does not parse or does not fire as its
//! unit test says fails CI.

#![cfg(not(madsim))]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use common::*;
use dlock_testkit::{fresh_database, Db, TempDir};

/// The prefixes of dlock's metric families (C4): an identifier in an expression that starts
/// with one of them names a metric.
const METRIC_PREFIXES: [&str; 5] = ["lock_", "rail_", "payout_", "idempotency_", "dlock_"];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Family name -> every `label=value` pair it was exported with.
type Exported = BTreeMap<String, BTreeSet<(String, String)>>;

/// Parses Prometheus text exposition (the `# TYPE` lines and the samples).
fn parse_exposition(text: &str, into: &mut Exported) {
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            if let Some(name) = rest.split_whitespace().next() {
                into.entry(name.to_owned()).or_default();
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let (name, labels) = match line.split_once('{') {
            Some((n, rest)) => (n, rest.split_once('}').map_or("", |(l, _)| l)),
            None => (line.split_whitespace().next().unwrap_or(""), ""),
        };
        let pairs = into.entry(name.to_owned()).or_default();
        for pair in labels.split(',').filter(|p| !p.is_empty()) {
            if let Some((k, v)) = pair.split_once('=') {
                pairs.insert((k.trim().to_owned(), v.trim().trim_matches('"').to_owned()));
            }
        }
    }
}

/// Every (metric, label matchers) an expression or series selector names.
fn selectors(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let bytes = expr.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let starts_ident = (c.is_ascii_alphabetic() || c == b'_') && (i == 0 || !is_ident(bytes[i - 1]));
        if !starts_ident {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && is_ident(bytes[i]) {
            i += 1;
        }
        let ident = &expr[start..i];
        if !METRIC_PREFIXES.iter().any(|p| ident.starts_with(p)) {
            continue;
        }
        let mut matchers = Vec::new();
        if bytes.get(i) == Some(&b'{') {
            let end = expr[i..].find('}').map_or(expr.len(), |e| i + e);
            for m in expr[i + 1..end].split(',').filter(|m| !m.trim().is_empty()) {
                let (k, v) = m.split_once('=').unwrap_or_else(|| panic!("matcher {m:?} in {expr:?}"));
                matchers.push((k.trim().trim_end_matches('!').to_owned(), v.trim().trim_matches('"').to_owned()));
            }
            i = end;
        }
        out.push((ident.to_owned(), matchers));
    }
    out
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b':'
}

/// Every PromQL expression of the shipped assets, with where it comes from.
fn shipped_expressions() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (file, key) in [
        ("deploy/observability/prometheus/alerts.yml", "expr:"),
        ("deploy/observability/prometheus/alerts_test.yml", "- series:"),
    ] {
        for (n, line) in read(file).lines().enumerate() {
            if let Some(e) = line.trim().strip_prefix(key) {
                out.push((format!("{file}:{}", n + 1), e.trim().trim_matches('\'').to_owned()));
            }
        }
    }
    let dash: serde_json::Value =
        serde_json::from_str(&read("deploy/observability/grafana/dlock.json")).expect("the dashboard is JSON");
    for panel in dash["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().expect("targets") {
            let title = panel["title"].as_str().unwrap_or("?");
            out.push((format!("dashboard panel {title:?}"), t["expr"].as_str().expect("expr").to_owned()));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_and_the_dashboard_name_is_exported_with_its_label_values() {
    let (paydb, _paydb_dir) = fresh_database(Db::Sqlite).await;
    let lock_dir = TempDir::new("obs-lockdb");
    let lockdb = dlock_testkit::sqlite_url(&lock_dir);
    let stub = Service::start(&["rail-stub", "--seed", "3"]);
    let lock = Service::start(&["lock-server", "--database-url", &lockdb]);
    let payment = Service::start(&["payment-resource", "--database-url", &paydb]);
    let rail = stub.url();
    let proxy = Service::start(&["rail-proxy", "--database-url", &paydb, "--rail-url", &rail]);
    let executor = Service::start(&strs(&executor_args(&lock, &payment, &proxy, "obs", &[])));
    let mut exported = Exported::new();
    for svc in [&lock, &payment, &proxy, &executor] {
        let r = get(svc, "/metrics").await;
        assert_eq!(r.status, 200, "{}", svc.url());
        parse_exposition(&String::from_utf8_lossy(&r.body), &mut exported);
    }
    assert!(exported.contains_key("lock_fenced_out_total"), "{:?}", exported.keys());

    let exprs = shipped_expressions();
    assert!(exprs.len() >= 10, "{} expressions found", exprs.len());
    let mut unknown = Vec::new();
    let mut named = BTreeSet::new();
    for (source, expr) in &exprs {
        let sel = selectors(expr);
        assert!(!sel.is_empty(), "{source}: {expr:?} names no dlock metric");
        for (name, matchers) in sel {
            named.insert(name.clone());
            let Some(pairs) = exported.get(&name) else {
                unknown.push(format!("{source}: {name} is not exported"));
                continue;
            };
            for (k, v) in matchers {
                if k == "job" {
                    continue; // Prometheus's own target label
                }
                if !pairs.contains(&(k.clone(), v.clone())) {
                    unknown.push(format!("{source}: {name}{{{k}=\"{v}\"}} is never exported"));
                }
            }
        }
    }
    assert!(unknown.is_empty(), "{}", unknown.join("\n"));
    for must in [
        "lock_fenced_out_total",
        "rail_duplicate_attempted_total",
        "payout_backlog_age_seconds",
        // Issue 13: the latency percentiles, the waiter queues and the pools.
        "payout_hop_seconds_bucket",
        "payout_end_to_end_seconds_bucket",
        "rail_call_seconds_bucket",
        "lock_store_op_seconds_bucket",
        "payout_store_op_seconds_bucket",
        "rail_store_op_seconds_bucket",
        "lock_waiter_queues",
        "dlock_db_pool_connections",
    ] {
        assert!(named.contains(must), "the assets never mention {must}");
    }
    // Every histogram is exported with every value of its closed tag, before any sample.
    for (family, label, values) in [
        ("payout_hop_seconds_bucket", "hop", &["acquire", "reread", "claim", "submit", "post", "release"][..]),
        ("payout_end_to_end_seconds_bucket", "outcome", &["posted", "failed"][..]),
        ("rail_call_seconds_bucket", "outcome", &["acked", "rejected", "ambiguous", "unsent"][..]),
        ("lock_store_op_seconds_bucket", "op", &["acquire", "release", "heartbeat", "reap"][..]),
        ("payout_store_op_seconds_bucket", "op", &["claim", "post", "list", "oldest_pending_created_at"][..]),
        ("rail_store_op_seconds_bucket", "op", &["admit", "resolve", "payout"][..]),
        ("dlock_db_pool_connections", "state", &["idle", "in_use"][..]),
    ] {
        for v in values {
            let pair = (label.to_owned(), (*v).to_owned());
            assert!(
                exported.get(family).is_some_and(|p| p.contains(&pair)),
                "{family}{{{label}=\"{v}\"}} not exported"
            );
        }
    }
}

#[test]
fn the_selector_reader_sees_names_and_label_matchers() {
    let sel = selectors(r#"sum by (job) (increase(payout_execute_total{outcome="ambiguous"}[15m])) > 0"#);
    assert_eq!(sel, vec![("payout_execute_total".to_owned(), vec![("outcome".to_owned(), "ambiguous".to_owned())])]);
    assert!(selectors("sum(rate(up[5m]))").is_empty(), "not a dlock metric");
    let mut e = Exported::new();
    parse_exposition("# TYPE lock_waiters gauge\nlock_waiters 0\nx_total{a=\"b\"} 1\n", &mut e);
    assert!(e["x_total"].contains(&("a".to_owned(), "b".to_owned())) && e.contains_key("lock_waiters"));
}

#[test]
fn the_test_script_checks_and_unit_tests_the_alert_rules_with_promtool() {
    let script = read("scripts/test.sh");
    for needle in [
        "promtool check rules",
        "promtool test rules",
        "deploy/observability/prometheus/alerts.yml",
        "alerts_test.yml",
        "missing+=(prometheus)",
    ] {
        assert!(script.contains(needle), "scripts/test.sh lacks {needle:?}");
    }
}
