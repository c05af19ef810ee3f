//! The executor's three HTTP hops, each with its C3 §3.8 budget and retry rule, as the
//! typed clients carry them (`dlock-payment-client`, `dlock-rail-client`):
//!
//! | hop | budget | retries |
//! |---|---|---|
//! | claim / post → payment-resource | 500 ms / 3 s | 1, only on 503 or a connect failure (nothing sent); never on a 409 |
//! | submit → rail-proxy | 1 s / rail read timeout + 2 s | 0, ever |
//! | advisory GETs → payment-resource | 300 ms / 1 s | 2 tries |
//!
//! This module maps the `executor.write.*`, `executor.submit.*` and `executor.read.*` keys
//! onto the clients' settings; the rules themselves live in the clients.

use dlock_payment_client::{PaymentClient, PaymentClientConfig};
use dlock_rail_client::{RailClient, RailClientConfig};

use crate::config::ExecutorConfig;

/// Longest `retryAfterMillis` honoured before the one retry of a claim or post.
pub const WRITE_RETRY_AFTER_MS_MAX: u64 = dlock_payment_client::WRITE_RETRY_AFTER_MS_MAX;
/// Pause before the retry of an advisory read.
pub const READ_RETRY_PAUSE_MS: u64 = dlock_payment_client::READ_RETRY_PAUSE_MS;

/// The two clients, with the executor's budgets.
#[derive(Debug, Clone)]
pub struct Hops {
    /// Claims, posts (write budget) and advisory reads (read budget).
    pub payment: PaymentClient,
    /// The one submission (submit budget, never retried).
    pub rail: RailClient,
}

impl Hops {
    /// The clients of `cfg`; refuses budgets the clients refuse.
    pub fn new(cfg: &ExecutorConfig) -> Result<Hops, String> {
        let payment = PaymentClient::new(PaymentClientConfig {
            base_url: cfg.payment_url.clone(),
            write_connect_timeout_ms: cfg.write_connect_timeout_ms,
            write_read_timeout_ms: cfg.write_read_timeout_ms,
            write_retries_max: cfg.write_retries_max,
            read_connect_timeout_ms: cfg.read_connect_timeout_ms,
            read_read_timeout_ms: cfg.read_read_timeout_ms,
            read_tries_max: cfg.read_tries_max,
            bearer: cfg.bearer.clone(),
        })?;
        let rail = RailClient::new(RailClientConfig {
            base_url: cfg.proxy_url.clone(),
            connect_timeout_ms: cfg.submit_connect_timeout_ms,
            read_timeout_ms: cfg.submit_read_timeout_ms,
            bearer: cfg.bearer.clone(),
        })?;
        Ok(Hops { payment, rail })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlock_contract::OwnerId;
    use dlock_rt::http::BaseUrl;

    #[test]
    fn the_clients_carry_the_executors_budgets() {
        let url = |p: u16| BaseUrl::parse(&format!("http://127.0.0.1:{p}")).expect("url");
        let mut cfg = ExecutorConfig::new(url(1), url(2), url(3), OwnerId::parse("e").expect("owner"));
        cfg.write_read_timeout_ms = 3_100;
        cfg.write_retries_max = 2;
        cfg.submit_read_timeout_ms = 12_000;
        cfg.read_tries_max = 3;
        let hops = Hops::new(&cfg).expect("valid");
        let p = hops.payment.config();
        assert_eq!(p.base_url, url(2));
        assert_eq!((p.write_connect_timeout_ms, p.write_read_timeout_ms, p.write_retries_max), (500, 3_100, 2));
        assert_eq!((p.read_connect_timeout_ms, p.read_read_timeout_ms, p.read_tries_max), (300, 1_000, 3));
        let r = hops.rail.config();
        assert_eq!((r.base_url.clone(), r.connect_timeout_ms, r.read_timeout_ms), (url(3), 1_000, 12_000));
    }
}
