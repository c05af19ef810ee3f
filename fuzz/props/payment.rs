//! Properties of the payment-resource's request fingerprint (RFC 8785 JCS,
//! `dlock_payment_resource::idempotency`) and its keyset cursor codec
//! (`dlock_payment_resource::cursor`), shared by the fuzz targets (`fuzz/fuzz_targets/`)
//! and the corpus replay test (`crates/dlock-payment-resource/tests/fuzz_corpus.rs`).
#![allow(dead_code)] // each fuzz target uses one property of this file

use dlock_contract::payout::PayoutState;
use dlock_contract::rail::is_account_id;
use dlock_payment_resource::cursor::{CursorError, CursorKey, CursorPayload};
use dlock_payment_resource::idempotency::fingerprint;
use serde_json::{Map, Number, Value};
use uuid::Uuid;

/// Most leaves of one input that [`jcs_fingerprint`] mutates one at a time.
const MUTATED_LEAVES_MAX: usize = 64;

/// Writes `v` as JSON text with its object keys in reverse order and whitespace (chosen by
/// `ws`) around every token: the same value, spelled differently.
fn respell(v: &Value, ws: &[&str], i: &mut usize, out: &mut String) {
    fn pad(ws: &[&str], i: &mut usize, out: &mut String) {
        out.push_str(ws[*i % ws.len()]);
        *i += 1;
    }
    pad(ws, i, out);
    match v {
        Value::Object(m) => {
            out.push('{');
            for (n, (k, x)) in m.iter().rev().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                pad(ws, i, out);
                out.push_str(&Value::String(k.clone()).to_string());
                pad(ws, i, out);
                out.push(':');
                respell(x, ws, i, out);
            }
            pad(ws, i, out);
            out.push('}');
        }
        Value::Array(a) => {
            out.push('[');
            for (n, x) in a.iter().enumerate() {
                if n > 0 {
                    out.push(',');
                }
                respell(x, ws, i, out);
            }
            pad(ws, i, out);
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
    pad(ws, i, out);
}

/// Counts the leaves of `v` (scalars, empty arrays and objects count as one).
fn leaves(v: &Value) -> usize {
    match v {
        Value::Object(m) if !m.is_empty() => m.values().map(leaves).sum(),
        Value::Array(a) if !a.is_empty() => a.iter().map(leaves).sum(),
        _ => 1,
    }
}

/// A different value for a leaf: every scalar changes to another of its kind.
fn changed(leaf: &Value) -> Value {
    match leaf {
        Value::Null => Value::Bool(false),
        Value::Bool(b) => Value::Bool(!b),
        Value::String(s) => Value::String(format!("{s}x")),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                Value::from(if i == i64::MAX { i - 1 } else { i + 1 })
            } else if let Some(u) = n.as_u64() {
                Value::from(if u == u64::MAX { u - 1 } else { u + 1 })
            } else {
                let f = n.as_f64().unwrap_or(0.0);
                let g = if f.next_up().is_finite() { f.next_up() } else { f.next_down() };
                Number::from_f64(g).map_or(Value::Null, Value::Number)
            }
        }
        Value::Array(_) => Value::Array(vec![Value::Null]),
        Value::Object(_) => {
            let mut m = Map::new();
            m.insert(String::new(), Value::Null);
            Value::Object(m)
        }
    }
}

/// Replaces leaf number `target` (depth first) by [`changed`]; `seen` counts leaves passed.
fn mutate(v: &mut Value, target: usize, seen: &mut usize) -> bool {
    match v {
        Value::Object(m) if !m.is_empty() => m.values_mut().any(|x| mutate(x, target, seen)),
        Value::Array(a) if !a.is_empty() => a.iter_mut().any(|x| mutate(x, target, seen)),
        leaf => {
            *seen += 1;
            if *seen - 1 == target {
                *leaf = changed(leaf);
                true
            } else {
                false
            }
        }
    }
}

fn fp(body: &Value) -> String {
    fingerprint("create_payout", "/v1/payouts", "worker-1", body).expect("a JSON value always has a fingerprint")
}

/// The fingerprint of any JSON body is equal under key reordering and whitespace, and
/// different under any change of one value (and of the operation, target or owner).
pub fn jcs_fingerprint(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<Value>(data) else { return };
    let base = fp(&v);
    assert_eq!(base.len(), 64, "not a hex SHA-256");
    assert_eq!(fp(&v), base, "not deterministic");

    let ws = [" ", "", "\n", "\t ", "\r\n  ", ""];
    for start in 0..ws.len() {
        let mut text = String::new();
        respell(&v, &ws, &mut start.clone(), &mut text);
        let again: Value = serde_json::from_str(&text).expect("a respelt value parses");
        assert_eq!(fp(&again), base, "fingerprint changed under reordering/whitespace: {text:?}");
    }

    assert_ne!(fingerprint("claim", "/v1/payouts", "worker-1", &v).ok(), Some(base.clone()));
    assert_ne!(fingerprint("create_payout", "/v1/payouts/x", "worker-1", &v).ok(), Some(base.clone()));
    assert_ne!(fingerprint("create_payout", "/v1/payouts", "worker-2", &v).ok(), Some(base.clone()));

    for target in 0..leaves(&v).min(MUTATED_LEAVES_MAX) {
        let mut w = v.clone();
        assert!(mutate(&mut w, target, &mut 0), "leaf {target} not found");
        assert_ne!(w, v, "the mutation changed nothing");
        assert_ne!(fp(&w), base, "a changed value kept the fingerprint: {v} vs {w}");
    }
}

/// The key every cursor target uses (seed cursors in `fuzz/corpus/cursor_codec/` were signed
/// with it, so mutations of authentic cursors are explored too).
pub fn cursor_key() -> CursorKey {
    CursorKey::new([7; 32])
}

const STATES: [PayoutState; 3] = [PayoutState::Pending, PayoutState::Claimed, PayoutState::Posted];
const ACCOUNTS: [Option<&str>; 3] = [None, Some("acct:1"), Some("acct:2")];

/// Mode byte `0`: the rest, as text, is a presented cursor. Whatever the codec accepts is
/// exactly the cursor it would issue for that payload (no second spelling of a signed
/// cursor gets in), and for exactly one filter: every other (state, account) refuses it.
/// Any other mode byte: the rest builds a payload that must round-trip under its own
/// filter, be refused as `OtherFilter` under every other one, and be refused as
/// `NotIssuedHere` under another key and after any one-byte change.
pub fn cursor_codec(data: &[u8]) {
    let key = cursor_key();
    let Some((&mode, rest)) = data.split_first() else { return };
    if mode == 0 {
        let Ok(raw) = std::str::from_utf8(rest) else { return };
        let mut accepted = Vec::new();
        for state in STATES {
            for acct in ACCOUNTS {
                if let Ok(p) = key.decode(raw, state, acct) {
                    assert_eq!(key.encode(&p), raw, "accepted a cursor the codec never issues");
                    assert_eq!((p.state, p.account_id.as_deref()), (state, acct));
                    accepted.push((state, acct));
                }
            }
        }
        assert!(accepted.len() <= 1, "one cursor accepted under several filters: {accepted:?}");
        return;
    }
    let b = |i: usize| rest.get(i).copied().unwrap_or(0);
    let int = |at: usize| i64::from_le_bytes(std::array::from_fn(|k| b(at + k)));
    let state = STATES[usize::from(b(0)) % STATES.len()];
    let acct_text: String = rest.iter().skip(41).map(|&c| char::from(c)).collect();
    let account_id = if b(1) % 2 == 0 || !is_account_id(&acct_text) { None } else { Some(acct_text) };
    let p = CursorPayload {
        state,
        account_id,
        snapshot_ms: int(2),
        created_at_ms: int(10),
        payout_id: Uuid::from_bytes(std::array::from_fn(|k| b(18 + k))),
    };
    let raw = key.encode(&p);
    assert_eq!(key.decode(&raw, p.state, p.account_id.as_deref()), Ok(p.clone()));
    for s in STATES {
        for a in ACCOUNTS.into_iter().chain([p.account_id.as_deref()]) {
            if (s, a) != (p.state, p.account_id.as_deref()) {
                assert_eq!(key.decode(&raw, s, a), Err(CursorError::OtherFilter), "{s:?} {a:?}");
            }
        }
    }
    let other = CursorKey::new([b(34) ^ 7 | 1; 32]);
    if b(34) ^ 7 | 1 != 7 {
        assert_eq!(other.decode(&raw, p.state, p.account_id.as_deref()), Err(CursorError::NotIssuedHere));
    }
    let mut forged = raw.clone().into_bytes();
    let at = usize::from(b(35)) * 256 + usize::from(b(36));
    let at = at % forged.len();
    forged[at] = match b(37) {
        c if c != forged[at] && c.is_ascii() => c,
        _ => {
            if forged[at] == b'A' {
                b'B'
            } else {
                b'A'
            }
        }
    };
    if let Ok(forged) = String::from_utf8(forged) {
        assert_eq!(
            key.decode(&forged, p.state, p.account_id.as_deref()),
            Err(CursorError::NotIssuedHere),
            "a one-byte change of {raw:?} was accepted: {forged:?}"
        );
    }
}
