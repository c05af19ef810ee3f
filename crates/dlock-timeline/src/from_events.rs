//! An incident trace from the services' durable events (C3-extensions E-20), so the console
//! can draw a production incident with the same [`crate::render_html`] as a simulated one.
//!
//! The events come from three stores (lockdb, and paydb as the payment-resource and the
//! rail-proxy serve it), each ordered by its own `seq`. They are merged on their `at`, the
//! writer's wall clock: a picture for people, never a decision (wall times are for humans). Within one stream, `seq` breaks ties, so a stream's own order is kept.
//!
//! What becomes what (anything else is left out):
//!
//! | event | trace line |
//! |---|---|
//! | `lock.granted` | `grant` (key, token, owner, session), held until the event that ended it (or the last event: the events carry no lease length) |
//! | `lock.renewed` | `renew` |
//! | `lock.released`, `lock.revoked`, `lock.expired` | `release`, `revoke`, `drop` |
//! | `session.expired` | `session_closed` |
//! | `fence.raised` | `fenced_write`, accepted (presented token, the fence it replaced) |
//! | `fence.refused` | `fenced_write`, fenced out (operation, writer, presented token, fence) |
//! | `rail.refused` with outcome `FENCED` | `fenced_write` `submit`, fenced out at the rail mark |
//! | `rail.intent`, with its `rail.outcome` | `intent_outcome` (writer, token, outcome) |
//!
//! Invariants: the output is deterministic for its input (no clock, no map iteration that
//! leaks order); every line has a numeric `t_ms` (ms after the earliest event) and a string
//! `kind`, so [`crate::render_html`] accepts it; at most [`EVENTS_IN_MAX`] events are read.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

/// Bound on the events one trace is made from.
pub const EVENTS_IN_MAX: usize = 2_000;

/// One event, placed: its writer's wall clock in ms, its stream and seq.
struct Placed<'a> {
    at_ms: i64,
    stream: &'a str,
    seq: i64,
    e: &'a Value,
}

fn at_ms(e: &Value) -> Option<i64> {
    let at = e.get("at")?.as_str()?;
    chrono::DateTime::parse_from_rfc3339(at).ok().map(|t| t.timestamp_millis())
}

fn data<'a>(e: &'a Value, k: &str) -> Option<&'a Value> {
    e.get("data").and_then(|d| d.get(k))
}

/// The incident trace (JSON lines) of `events`, the JSON of `GET /v1/events/recent`'s
/// events from any of the services, in any order; `title` names it in its first line.
pub fn trace_from_events(title: &str, events: &[Value]) -> String {
    let mut placed: Vec<Placed<'_>> = events
        .iter()
        .take(EVENTS_IN_MAX)
        .filter_map(|e| {
            let id = e.get("eventId")?.as_str()?;
            let stream = id.split('/').next()?;
            Some(Placed { at_ms: at_ms(e)?, stream, seq: e.get("seq")?.as_i64()?, e })
        })
        .collect();
    placed.sort_by(|a, b| (a.at_ms, a.stream, a.seq).cmp(&(b.at_ms, b.stream, b.seq)));
    placed.dedup_by(|a, b| a.stream == b.stream && a.seq == b.seq);
    let origin = placed.first().map_or(0, |p| p.at_ms);
    // Each submission's outcome, to close its intent.
    let mut outcomes: BTreeMap<&str, &Placed<'_>> = BTreeMap::new();
    for p in &placed {
        if p.e.get("kind").and_then(Value::as_str) == Some("rail.outcome") {
            if let Some(s) = data(p.e, "submissionId").and_then(Value::as_str) {
                outcomes.insert(s, p);
            }
        }
    }
    // Each grant's end as the events tell it (the event that ended it, else the last event):
    // the events carry no lease length, so a lease is drawn held until then.
    let last = placed.last().map_or(0, |p| p.at_ms - origin);
    let mut ends: BTreeMap<(String, i64), i64> = BTreeMap::new();
    for p in &placed {
        if matches!(p.e.get("kind").and_then(Value::as_str), Some("lock.released" | "lock.revoked" | "lock.expired")) {
            let key = data(p.e, "key").and_then(Value::as_str).unwrap_or("").to_owned();
            let token = data(p.e, "token").and_then(Value::as_i64).unwrap_or(0);
            ends.entry((key, token)).or_insert(p.at_ms - origin);
        }
    }
    let mut out = String::new();
    let head = json!({ "t_ms": 0, "kind": "trace_start", "config": title, "schema": "dlock-events/1",
        "clock": "wall" });
    out.push_str(&head.to_string());
    out.push('\n');
    for (n, p) in placed.iter().enumerate() {
        let Some(mut line) = line_of(p, &outcomes, origin) else { continue };
        if line.get("kind") == Some(&json!("grant")) {
            let key = line.get("key").and_then(Value::as_str).unwrap_or("").to_owned();
            let token = line.get("token").and_then(Value::as_i64).unwrap_or(0);
            line.insert("expires_at_ms".into(), json!(ends.get(&(key, token)).copied().unwrap_or(last)));
        }
        let t = u64::try_from(p.at_ms - origin).unwrap_or(0);
        line.insert("t_ms".into(), json!(t));
        line.insert("wall_ms".into(), json!(t));
        line.insert("seq".into(), json!(n));
        line.insert("eventId".into(), p.e.get("eventId").cloned().unwrap_or(Value::Null));
        out.push_str(&Value::Object(line).to_string());
        out.push('\n');
    }
    out
}

/// The trace line of one event, without its times; `None` for a kind not drawn.
fn line_of(p: &Placed<'_>, outcomes: &BTreeMap<&str, &Placed<'_>>, origin: i64) -> Option<Map<String, Value>> {
    let e = p.e;
    let d = |k: &str| data(e, k).cloned().unwrap_or(Value::Null);
    let node = match (p.stream, e.get("kind").and_then(Value::as_str)?) {
        ("lockdb", _) => "lock-server",
        (_, k) if k.starts_with("rail.") => "rail-proxy",
        _ => "payment-resource",
    };
    let account = e.get("accountId").cloned().unwrap_or(Value::Null);
    let lease = |kind: &str| {
        json!({ "kind": kind, "node": node, "key": d("key"), "token": d("token"), "owner": d("ownerId"),
            "session": d("sessionId") })
    };
    let v = match e.get("kind").and_then(Value::as_str)? {
        "lock.granted" => lease("grant"),
        "lock.renewed" => lease("renew"),
        "lock.released" => lease("release"),
        "lock.revoked" => lease("revoke"),
        "lock.expired" => lease("drop"),
        "session.expired" => json!({ "kind": "session_closed", "node": node, "session": d("sessionId") }),
        "fence.raised" => json!({ "kind": "fenced_write", "node": node, "op": "claim/post", "answer": "accepted",
            "account": account, "presented_token": d("presentedToken"), "stored_token": d("previousFence") }),
        "fence.refused" => json!({ "kind": "fenced_write", "node": node, "op": d("operation"),
            "answer": "fenced_out", "owner": d("ownerId"), "account": account,
            "presented_token": d("presentedToken"), "stored_token": d("fence") }),
        "rail.refused" if d("outcome") == json!("FENCED") => json!({ "kind": "fenced_write", "node": node,
            "op": "submit", "answer": "fenced_out", "owner": d("ownerId"), "account": account,
            "presented_token": d("presentedToken") }),
        "rail.intent" => {
            let mut v = json!({ "kind": "intent_outcome", "node": node, "owner": d("ownerId"),
                "presented_token": d("presentedToken"), "submission": d("submissionId"),
                "payout": e.get("payoutId").cloned().unwrap_or(Value::Null) });
            let done = d("submissionId").as_str().and_then(|s| outcomes.get(s));
            if let Some(o) = done {
                v["outcome"] = data(o.e, "outcome").cloned().unwrap_or(Value::Null);
                // On the trace's axis, where `wall_ms` is `t_ms`.
                v["resolved_wall_ms"] = json!(o.at_ms - origin);
            }
            v
        }
        _ => return None,
    };
    let Value::Object(mut m) = v else { return None };
    m.retain(|_, v| !v.is_null());
    Some(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(stream: &str, seq: i64, at: &str, kind: &str, extra: Value) -> Value {
        let mut e = json!({ "eventId": format!("{stream}/{seq}"), "seq": seq, "kind": kind, "at": at });
        if let (Value::Object(m), Value::Object(x)) = (&mut e, extra) {
            m.extend(x);
        }
        e
    }

    #[test]
    fn a_revoke_and_the_stale_holders_refused_claim_become_a_lease_ended_by_revoke_and_a_fenced_out_write() {
        let events = vec![
            ev(
                "paydb",
                9,
                "2026-12-07T03:00:02.500Z",
                "fence.refused",
                json!({ "accountId": "acct-1",
                "data": { "operation": "claim", "ownerId": "w-1", "presentedToken": 7, "fence": 9 } }),
            ),
            ev(
                "lockdb",
                3,
                "2026-12-07T03:00:00.000Z",
                "lock.granted",
                json!({ "lockKey": "payout:acct-1",
                "data": { "key": "payout:acct-1", "token": 7, "ownerId": "w-1", "sessionId": "s-1" } }),
            ),
            ev(
                "lockdb",
                4,
                "2026-12-07T03:00:01.000Z",
                "lock.revoked",
                json!({ "lockKey": "payout:acct-1",
                "data": { "key": "payout:acct-1", "token": 7, "ownerId": "w-1", "newTokenFloor": 8 } }),
            ),
            ev("paydb", 8, "2026-12-07T03:00:00.500Z", "payout.created", json!({ "data": {} })),
        ];
        let trace = trace_from_events("acct-1", &events);
        let lines: Vec<Value> = trace.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
        let kinds: Vec<&str> = lines.iter().filter_map(|l| l["kind"].as_str()).collect();
        assert_eq!(kinds, ["trace_start", "grant", "revoke", "fenced_write"], "{trace}");
        assert_eq!((lines[1]["t_ms"].as_u64(), lines[2]["t_ms"].as_u64()), (Some(0), Some(1_000)));
        assert_eq!(lines[3]["answer"], json!("fenced_out"));
        assert_eq!((lines[3]["presented_token"].as_i64(), lines[3]["stored_token"].as_i64()), (Some(7), Some(9)));
        let html = crate::render_html(&trace).expect("the timeline draws it");
        assert!(html.contains("data-answer=\"fenced_out\""), "the refused claim is drawn");
        assert!(html.contains("data-end=\"revoked\""), "the lease ends by the revoke");
        assert!(html.contains("wall-clock time →") && !html.contains("simulated"), "its axis is the writers' clocks");
        assert_eq!(lines[1]["expires_at_ms"], json!(1_000), "held until the revoke");
    }

    #[test]
    fn an_intent_is_closed_by_its_outcome_and_unknown_kinds_and_malformed_events_are_left_out() {
        let events = vec![
            ev(
                "paydb",
                1,
                "2026-12-07T03:00:00.000Z",
                "rail.intent",
                json!({
                "data": { "submissionId": "sub-1", "ownerId": "w-2", "presentedToken": 4 } }),
            ),
            ev(
                "paydb",
                2,
                "2026-12-07T03:00:03.000Z",
                "rail.outcome",
                json!({
                "data": { "submissionId": "sub-1", "outcome": "TIMEOUT" } }),
            ),
            json!({ "kind": "lock.granted", "at": "not a time", "eventId": "lockdb/1", "seq": 1 }),
            json!("not an object"),
        ];
        let trace = trace_from_events("t", &events);
        let lines: Vec<Value> = trace.lines().map(|l| serde_json::from_str(l).expect("JSON")).collect();
        assert_eq!(lines.len(), 2, "{trace}");
        assert_eq!(lines[1]["kind"], json!("intent_outcome"));
        assert_eq!(lines[1]["outcome"], json!("TIMEOUT"));
        assert_eq!(lines[1]["resolved_wall_ms"], json!(3_000));
        assert_eq!(trace, trace_from_events("t", &events), "deterministic");
    }
}
