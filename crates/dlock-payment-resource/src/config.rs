//! The payment-resource's keys (`payment.resource.*`, `payment.idempotency.*`) and their
//! one resolver, used by `dlock payment-resource`, `dlock up`/`demo`, the simulation and
//! the tests alike (see `dlock_config`).
//!
//! `payment.fencing.enabled` is the executor's switch (its lease check), resolved by
//! `dlock_executor::config`; the payment-resource's fences cannot be turned off.

use std::net::SocketAddr;

use dlock_config::{Layers, Profile, PAYDB_URL_DEFAULT};

use dlock_contract::grant::GrantVerifier;

use crate::service::PaymentConfig;

/// Every key the payment-resource reads.
pub const KEYS: &[&str] = &[
    "payment.resource.listen",
    "payment.resource.database-url",
    "payment.resource.body-bytes-max",
    "payment.idempotency.retention-ms",
    "payment.idempotency.purge-interval-ms",
    "payment.idempotency.purge-batch-max",
    "payment.events.retention-events",
    "payment.grants.verify-keys",
    "payment.grants.verify-keys-file",
    "payment.grants.accept-unsigned",
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
        grants: {
            let g = dlock_config::grant_keys(layers, profile, "payment.grants")?;
            GrantVerifier::from_config(&g.keys, g.accept_unsigned, profile == Profile::Production, "payment.grants")?
        },
        auth: dlock_http::auth::resolve(layers, profile)?,
        event_retention_events: layers.get("payment.events.retention-events", d.event_retention_events)?,
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

    /// [`authed`] with the test key trusted (production needs a verify key).
    fn keyed(pairs: &[(&str, &str)]) -> Layers {
        let mut l = authed(pairs);
        l.set_default("payment.grants.verify-keys", dlock_contract::grant::testing::signer().verify_key().to_base64());
        l
    }

    #[test]
    fn defaults_resolve_and_out_of_range_values_name_their_key() {
        let s = resolve(&keyed(&[]), Profile::Production).expect("defaults");
        let expected = PaymentConfig {
            grants: dlock_contract::grant::testing::verifier(),
            auth: s.config.auth.clone(),
            ..PaymentConfig::default()
        };
        assert_eq!((s.listen.port(), s.config.clone()), (8082, expected));
        assert!(s.config.auth.enabled, "authentication is on by default");
        let l = keyed(&[("payment.resource.body-bytes-max", "4096")]);
        assert_eq!(resolve(&l, Profile::Production).expect("ok").config.body_bytes_max, 4_096);
        let bad = keyed(&[("payment.idempotency.retention-ms", "1")]);
        assert!(resolve(&bad, Profile::Production).is_err_and(|e| e.contains("payment.idempotency.retention-ms")));
    }

    #[test]
    fn production_refuses_to_start_without_a_verify_key_and_refuses_the_transition_switch() {
        let err = resolve(&authed(&[]), Profile::Production).expect_err("no key");
        assert!(err.contains("payment.grants.verify-keys") && err.contains("will not start"), "{err}");
        let unsigned = keyed(&[("payment.grants.accept-unsigned", "true")]);
        let err = resolve(&unsigned, Profile::Production).expect_err("refused");
        assert!(err.contains("payment.grants.accept-unsigned") && err.contains("unsafe-test"), "{err}");
        let s = resolve(&authed(&[("payment.grants.accept-unsigned", "true")]), Profile::UnsafeTest).expect("ok");
        assert!(s.config.grants.accepts_unsigned() && s.config.grants.keys().is_empty());
        assert!(resolve(&keyed(&[]), Profile::Production).is_ok_and(|s| !s.config.grants.accepts_unsigned()));
        let bad = authed(&[("payment.grants.verify-keys", "not-a-key")]);
        assert!(resolve(&bad, Profile::Production).is_err_and(|e| e.contains("payment.grants.verify-keys")));
    }

    #[test]
    fn verify_keys_are_read_from_a_file_too() {
        let dir = std::env::temp_dir().join(format!("dlock-verify-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let file = dir.join("keys");
        let next = dlock_contract::grant::GrantSigner::from_seed(&dlock_contract::grant::testing::SEED_NEXT);
        std::fs::write(&file, format!("{}\n{}\n", next.verify_key().to_base64(), "")).expect("write");
        let path = file.display().to_string();
        let l = keyed(&[("payment.grants.verify-keys-file", path.as_str())]);
        let s = resolve(&l, Profile::Production).expect("ok");
        assert_eq!(s.config.grants.keys().len(), 2);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
