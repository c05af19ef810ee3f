//! The rail-proxy's keys (`rail.proxy.*`) and their one resolver, used by `dlock
//! rail-proxy`, `dlock up`/`demo`, the simulation and the tests alike (see `dlock_config`).
//!
//! Invariant: `rail.proxy.fencing.enabled=false` and
//! `rail.proxy.duplicate-guard.enabled=false` resolve only under `--profile unsafe-test`;
//! otherwise [`resolve`] refuses them, with the same error for every command.

use std::net::SocketAddr;

use dlock_config::{safety_switch, Layers, Profile, PAYDB_URL_DEFAULT};
use dlock_rt::http::BaseUrl;

use crate::service::{ProxyConfig, BODY_BYTES_MAX_DEFAULT, CONNECT_TIMEOUT_MS_DEFAULT, READ_TIMEOUT_MS_DEFAULT};

/// Every key the rail-proxy reads.
pub const KEYS: &[&str] = &[
    "rail.proxy.listen",
    "rail.proxy.database-url",
    "rail.proxy.rail-url",
    "rail.proxy.connect-timeout-ms",
    "rail.proxy.read-timeout-ms",
    "rail.proxy.fencing.enabled",
    "rail.proxy.body-bytes-max",
    "rail.proxy.duplicate-guard.enabled",
    "rail.proxy.grants.verify-keys",
    "rail.proxy.grants.verify-keys-file",
    "rail.proxy.grants.accept-unsigned",
];

/// Default `rail.proxy.listen`.
pub const LISTEN_DEFAULT: ([u8; 4], u16) = ([127, 0, 0, 1], 8083);
/// Default `rail.proxy.rail-url`.
pub const RAIL_URL_DEFAULT: &str = "http://127.0.0.1:8084";

/// The rail-proxy's resolved settings.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    pub listen: SocketAddr,
    /// paydb.
    pub database_url: String,
    pub config: ProxyConfig,
}

/// Resolves every `rail.proxy.*` key, refusing a disabled safety switch outside
/// `unsafe-test`.
pub fn resolve(layers: &Layers, profile: Profile) -> Result<ProxySettings, String> {
    let listen = layers.get("rail.proxy.listen", SocketAddr::from(LISTEN_DEFAULT))?;
    let database_url = layers.get("rail.proxy.database-url", PAYDB_URL_DEFAULT.to_owned())?;
    let rail = layers.get("rail.proxy.rail-url", RAIL_URL_DEFAULT.to_owned())?;
    let fencing_enabled = safety_switch(
        layers,
        profile,
        "rail.proxy.fencing.enabled",
        "without the fence a stale writer can move money",
    )?;
    let duplicate_guard_enabled = safety_switch(
        layers,
        profile,
        "rail.proxy.duplicate-guard.enabled",
        "without it a payout can reach the rail twice",
    )?;
    let config = ProxyConfig {
        rail_url: BaseUrl::parse(&rail).map_err(|e| format!("rail.proxy.rail-url: {e}"))?,
        connect_timeout_ms: layers.get("rail.proxy.connect-timeout-ms", CONNECT_TIMEOUT_MS_DEFAULT)?,
        read_timeout_ms: layers.get("rail.proxy.read-timeout-ms", READ_TIMEOUT_MS_DEFAULT)?,
        fencing_enabled,
        duplicate_guard_enabled,
        body_bytes_max: layers.get("rail.proxy.body-bytes-max", BODY_BYTES_MAX_DEFAULT)?,
        grants: {
            let g = dlock_config::grant_keys(layers, profile, "rail.proxy.grants")?;
            dlock_contract::grant::GrantVerifier::from_config(
                &g.keys,
                g.accept_unsigned,
                profile == Profile::Production,
                "rail.proxy.grants",
            )?
        },
        auth: dlock_http::auth::resolve(layers, profile)?,
    };
    Ok(ProxySettings { listen, database_url, config })
}

/// One line per safety switch `cfg` turns off (empty in production), for the loud warning
/// every start gives.
pub fn unsafe_warnings(cfg: &ProxyConfig) -> Vec<String> {
    let mut w = Vec::new();
    if !cfg.fencing_enabled {
        w.push("rail.proxy.fencing.enabled=false: the rail-proxy skips step 1 (the high-water mark); a stale writer reaches the rail".to_owned());
    }
    if cfg.grants.accepts_unsigned() {
        w.push(
            "rail.proxy.grants.accept-unsigned=true: the rail-proxy admits tokens the lock server did not sign"
                .to_owned(),
        );
    }
    w.extend(dlock_http::auth::unsafe_warning(&cfg.auth));
    if !cfg.duplicate_guard_enabled {
        w.push("rail.proxy.duplicate-guard.enabled=false: the rail-proxy forwards what step 2 refused; a payout can be paid twice".to_owned());
    }
    w
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
        l.set_default(
            "rail.proxy.grants.verify-keys",
            dlock_contract::grant::testing::signer().verify_key().to_base64(),
        );
        l
    }

    #[test]
    fn proxy_defaults_follow_c3_budgets() {
        let s = resolve(&keyed(&[]), Profile::Production).expect("defaults");
        assert_eq!(s.config.grants, dlock_contract::grant::testing::verifier());
        assert_eq!(s.listen.port(), 8083);
        assert_eq!(s.database_url, PAYDB_URL_DEFAULT);
        assert_eq!((s.config.connect_timeout_ms, s.config.read_timeout_ms), (1_000, 8_000));
        assert!(s.config.fencing_enabled && s.config.duplicate_guard_enabled);
        assert_eq!(s.config.rail_url.authority, "127.0.0.1:8084");
        assert!(unsafe_warnings(&s.config).is_empty());
    }

    #[test]
    fn disabling_fencing_needs_the_unsafe_test_profile() {
        let l = keyed(&[("rail.proxy.fencing.enabled", "false")]);
        let err = resolve(&l, Profile::Production).expect_err("refused");
        assert!(err.contains("rail.proxy.fencing.enabled") && err.contains("unsafe-test"), "{err}");
        let s = resolve(&l, Profile::UnsafeTest).expect("allowed");
        assert!(!s.config.fencing_enabled);
        assert_eq!(unsafe_warnings(&s.config).len(), 1);
    }

    #[test]
    fn the_grant_switches_follow_the_profile() {
        let err = resolve(&authed(&[]), Profile::Production).expect_err("no key");
        assert!(err.contains("rail.proxy.grants.verify-keys") && err.contains("will not start"), "{err}");
        let l = authed(&[("rail.proxy.grants.accept-unsigned", "true")]);
        let err = resolve(&l, Profile::Production).expect_err("refused");
        assert!(err.contains("rail.proxy.grants.accept-unsigned") && err.contains("unsafe-test"), "{err}");
        let s = resolve(&l, Profile::UnsafeTest).expect("allowed");
        assert!(s.config.grants.accepts_unsigned());
        assert_eq!(unsafe_warnings(&s.config).len(), 1);
    }

    #[test]
    fn bypassing_the_duplicate_guard_needs_the_unsafe_test_profile() {
        let l = keyed(&[("rail.proxy.duplicate-guard.enabled", "false")]);
        let err = resolve(&l, Profile::Production).expect_err("refused");
        assert!(err.contains("rail.proxy.duplicate-guard.enabled") && err.contains("unsafe-test"), "{err}");
        assert!(!resolve(&l, Profile::UnsafeTest).expect("allowed").config.duplicate_guard_enabled);
    }
}
