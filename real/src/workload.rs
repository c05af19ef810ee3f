//! The workload of a real run: accounts opened, then payouts created through the
//! payment-resource's API (P-routes of C3) at an even rate for the run's duration, each
//! with its own idempotency key, retried with the same key until it answers below 500.
//! Amounts and accounts are drawn from the seed.
//!
//! Invariants: a payout is created at most once per key (the key is its index); a create
//! that never got an answer within [`CREATE_RETRY_S_MAX`] is counted as not created, never
//! as created.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::rand::Rng;
use serde_json::{json, Value};

use crate::history::now_mono_ms;

/// Bound on retrying one create (the same key) through faults.
pub const CREATE_RETRY_S_MAX: u64 = 60;

/// The run's currency.
pub const CURRENCY: &str = "EUR";

/// The workload's shape.
#[derive(Debug, Clone)]
pub struct Shape {
    pub seed: u64,
    pub accounts: u32,
    pub per_s: u32,
    pub duration_ms: u64,
}

impl Shape {
    pub fn payouts(&self) -> u64 {
        u64::from(self.per_s) * self.duration_ms / 1000
    }

    /// Amount of payout `i` (seeded, 1 000–1 970 minor units).
    pub fn amount(&self, i: u64) -> i64 {
        let mut rng = dlock_rt::rand::seeded(self.seed ^ i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        1_000 + 10 * rng.gen_range(0..98)
    }

    pub fn account(&self, i: u64) -> String {
        format!("acct-{}", i % u64::from(self.accounts.max(1)))
    }
}

/// One payout created: its id and when the create was answered (host monotonic ms).
#[derive(Debug, Clone)]
pub struct Created {
    pub payout_id: String,
    pub at_mono_ms: u64,
}

/// What the workload did.
#[derive(Debug, Default, Clone)]
pub struct Done {
    pub created: Vec<Created>,
    pub not_created: u64,
}

async fn write(client: &HttpClient, base: &BaseUrl, path: &str, key: &str, body: Value) -> Result<Value, String> {
    let deadline = Instant::now() + Duration::from_secs(CREATE_RETRY_S_MAX);
    let bytes = Bytes::from(body.to_string());
    loop {
        let headers = [("X-Owner-Id", "real-run"), ("X-Idempotency-Key", key), ("Content-Type", "application/json")];
        match client.send(base, http::Method::POST, path, &headers, Some(bytes.clone())).await {
            Ok(r) if r.status < 300 => return serde_json::from_slice(&r.body).map_err(|e| e.to_string()),
            Ok(r) if r.status < 500 => {
                return Err(format!("POST {path} ({key}) answered {}: {}", r.status, String::from_utf8_lossy(&r.body)))
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!("POST {path} ({key}) got no answer below 500 for {CREATE_RETRY_S_MAX} s"));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Opens the accounts, each funded for 95 % of what its payouts ask (some fail for funds).
pub async fn open_accounts(client: &HttpClient, base: &BaseUrl, shape: &Shape) -> Result<(), String> {
    let mut per_account = vec![0i64; shape.accounts.max(1) as usize];
    for i in 0..shape.payouts() {
        per_account[(i % u64::from(shape.accounts.max(1))) as usize] += shape.amount(i);
    }
    for (n, total) in per_account.iter().enumerate() {
        let body =
            json!({"accountId": format!("acct-{n}"), "currency": CURRENCY, "openingBalanceMinor": total * 95 / 100});
        write(client, base, "/v1/accounts", &format!("open-{n}"), body).await?;
    }
    Ok(())
}

/// Creates the payouts at the shape's rate until done or `stop`.
pub async fn create_payouts(client: &HttpClient, base: &BaseUrl, shape: &Shape, stop: Arc<AtomicBool>) -> Done {
    let mut done = Done::default();
    let t0 = Instant::now();
    let n = shape.payouts();
    for i in 0..n {
        if stop.load(Ordering::Relaxed) {
            done.not_created += n - i;
            break;
        }
        let due = t0 + Duration::from_millis(i * 1000 / u64::from(shape.per_s.max(1)));
        tokio::time::sleep_until(due.into()).await;
        let body = json!({
            "accountId": shape.account(i),
            "amountMinor": shape.amount(i),
            "currency": CURRENCY,
            "beneficiaryRef": format!("ben-{i}"),
        });
        match write(client, base, "/v1/payouts", &format!("create-{i}"), body).await {
            Ok(v) => match v.get("payoutId").and_then(Value::as_str) {
                Some(id) => done.created.push(Created { payout_id: id.to_owned(), at_mono_ms: now_mono_ms() }),
                None => done.not_created += 1,
            },
            Err(_) => done.not_created += 1,
        }
    }
    done
}
