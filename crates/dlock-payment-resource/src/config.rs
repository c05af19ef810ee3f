//! The payment-resource's keys (`payment.resource.*`, `payment.idempotency.*`) and their
//! one resolver, used by `dlock payment-resource`, `dlock up`/`demo`, the simulation and
//! the tests alike (see `dlock_config`).
//!
//! `payment.fencing.enabled` is the executor's switch (its lease check), resolved by
//! `dlock_executor::config`; the payment-resource's fences cannot be turned off.

use std::net::SocketAddr;

use dlock_config::{Layers, Profile, PAYDB_URL_DEFAULT};

use crate::service::PaymentConfig;

/// Every key the payment-resource reads.
pub const KEYS: &[&str] = &[
    "payment.resource.listen",
    "payment.resource.database-url",
    "payment.resource.body-bytes-max",
    "payment.idempotency.retention-ms",
    "payment.idempotency.purge-interval-ms",
    "payment.idempotency.purge-batch-max",
];

/// Default `payment.resource.listen`.
pub const LISTEN_DEFAULT: ([u8; 4], u16) = ([127, 0, 0, 1], 8082);

/// The payment-resource's resolved settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentSettings {
    pub listen: SocketAddr,
    /// paydb (the proxy's paydb).
    pub database_url: String,
    pub config: PaymentConfig,
}

/// Resolves every payment-resource key and checks the ranges.
pub fn resolve(layers: &Layers, profile: Profile) -> Result<PaymentSettings, String> {
    let d = PaymentConfig::default();
    let listen = layers.get("payment.resource.listen", SocketAddr::from(LISTEN_DEFAULT))?;
    let database_url = layers.get("payment.resource.database-url", PAYDB_URL_DEFAULT.to_owned())?;
    let config = PaymentConfig {
        body_bytes_max: layers.get("payment.resource.body-bytes-max", d.body_bytes_max)?,
        idempotency_retention_ms: layers.get("payment.idempotency.retention-ms", d.idempotency_retention_ms)?,
        purge_interval_ms: layers.get("payment.idempotency.purge-interval-ms", d.purge_interval_ms)?,
        purge_batch_max: layers.get("payment.idempotency.purge-batch-max", d.purge_batch_max)?,
        auth: dlock_http::auth::resolve(layers, profile)?,
    };
    config.validate()?;
    Ok(PaymentSettings { listen, database_url, config })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Layers of `pairs` with a credential, as every resolved service needs (E-13).
    fn authed(pairs: &[(&str, &str)]) -> Layers {
        let mut l = Layers::of(pairs);
        l.set_flag("auth.credentials", "worker unit-test-token-0000000001");
        l
    }

    #[test]
    fn defaults_resolve_and_out_of_range_values_name_their_key() {
        let s = resolve(&authed(&[]), Profile::Production).expect("defaults");
        let d = PaymentConfig { auth: s.config.auth.clone(), ..PaymentConfig::default() };
        assert_eq!((s.listen.port(), s.config.clone()), (8082, d));
        assert!(s.config.auth.enabled, "authentication is on by default");
        let l = authed(&[("payment.resource.body-bytes-max", "4096")]);
        assert_eq!(resolve(&l, Profile::Production).expect("ok").config.body_bytes_max, 4_096);
        let bad = authed(&[("payment.idempotency.retention-ms", "1")]);
        assert!(resolve(&bad, Profile::Production).is_err_and(|e| e.contains("payment.idempotency.retention-ms")));
    }
}
