//! The console's keys (C5 "Console") and its one resolver. The console reads the same
//! `auth.*` keys as the services ([`dlock_http::auth::resolve`]): a token that signs in is
//! a token the services accept.

use std::net::SocketAddr;

use dlock_config::{Layers, Profile};
use dlock_http::auth::AuthSettings;
use dlock_rt::http::BaseUrl;

/// Every key the console reads besides `auth.*`.
pub const KEYS: &[&str] =
    &["console.listen", "console.payment-url", "console.lock-url", "console.proxy-url", "console.session-ttl-ms"];

/// `console.listen`: the port after the executor's 8085 range, free among C5's defaults.
pub const LISTEN_DEFAULT: &str = "127.0.0.1:8090";
/// `console.payment-url`: the payment-resource's default listen address.
pub const PAYMENT_URL_DEFAULT: &str = "http://127.0.0.1:8082";
/// `console.lock-url`: the lock server's default listen address.
pub const LOCK_URL_DEFAULT: &str = "http://127.0.0.1:8081";
/// `console.proxy-url`: the rail-proxy's default listen address.
pub const PROXY_URL_DEFAULT: &str = "http://127.0.0.1:8083";
/// `console.session-ttl-ms`: a session lives one hour after its login.
pub const SESSION_TTL_MS_DEFAULT: u64 = 3_600_000;
/// Shortest `console.session-ttl-ms` accepted.
pub const SESSION_TTL_MS_MIN: u64 = 60_000;
/// Longest `console.session-ttl-ms` accepted (a day).
pub const SESSION_TTL_MS_MAX: u64 = 86_400_000;

/// What the console needs to run, besides its listener.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    pub payment_url: BaseUrl,
    pub lock_url: BaseUrl,
    pub proxy_url: BaseUrl,
    pub session_ttl_ms: u64,
    pub auth: AuthSettings,
}

/// The resolved keys.
#[derive(Debug, Clone)]
pub struct ConsoleSettings {
    pub listen: SocketAddr,
    pub config: ConsoleConfig,
}

fn url(layers: &Layers, key: &str, default: &str) -> Result<BaseUrl, String> {
    let raw: String = layers.get(key, default.to_owned())?;
    BaseUrl::parse(&raw).map_err(|e| format!("{key}: {e}"))
}

/// Resolves the console's keys and `auth.*` (refusing `auth.enabled=false` outside
/// `--profile unsafe-test`, as every service does).
pub fn resolve(layers: &Layers, profile: Profile) -> Result<ConsoleSettings, String> {
    let listen_raw: String = layers.get("console.listen", LISTEN_DEFAULT.to_owned())?;
    let listen = listen_raw.parse().map_err(|_| format!("console.listen: {listen_raw:?} is not IP:port"))?;
    let session_ttl_ms: u64 = layers.get("console.session-ttl-ms", SESSION_TTL_MS_DEFAULT)?;
    if !(SESSION_TTL_MS_MIN..=SESSION_TTL_MS_MAX).contains(&session_ttl_ms) {
        return Err(format!(
            "console.session-ttl-ms must be {SESSION_TTL_MS_MIN} to {SESSION_TTL_MS_MAX} ms, not {session_ttl_ms}"
        ));
    }
    let config = ConsoleConfig {
        payment_url: url(layers, "console.payment-url", PAYMENT_URL_DEFAULT)?,
        lock_url: url(layers, "console.lock-url", LOCK_URL_DEFAULT)?,
        proxy_url: url(layers, "console.proxy-url", PROXY_URL_DEFAULT)?,
        session_ttl_ms,
        auth: dlock_http::auth::resolve(layers, profile)?,
    };
    for (key, u) in [
        ("console.payment-url", &config.payment_url),
        ("console.lock-url", &config.lock_url),
        ("console.proxy-url", &config.proxy_url),
    ] {
        dlock_rt::tls::check_url_scheme(key, u)?;
    }
    Ok(ConsoleSettings { listen, config })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDS: &str = "operator console-config-test-token-01";

    #[test]
    fn the_defaults_are_the_services_default_addresses_and_port_8090() {
        let l = Layers::of(&[("auth.credentials", CREDS)]);
        let s = resolve(&l, Profile::Production).expect("resolves");
        assert_eq!(s.listen.to_string(), LISTEN_DEFAULT);
        assert_eq!(s.config.payment_url.url(), PAYMENT_URL_DEFAULT);
        assert_eq!(s.config.lock_url.url(), LOCK_URL_DEFAULT);
        assert_eq!(s.config.proxy_url.url(), PROXY_URL_DEFAULT);
        assert_eq!(s.config.session_ttl_ms, SESSION_TTL_MS_DEFAULT);
    }

    #[test]
    fn a_session_ttl_out_of_range_or_a_bad_url_is_a_start_up_error_naming_its_key() {
        let l = Layers::of(&[("auth.credentials", CREDS), ("console.session-ttl-ms", "10")]);
        assert!(resolve(&l, Profile::Production).is_err_and(|e| e.contains("console.session-ttl-ms")));
        let l = Layers::of(&[("auth.credentials", CREDS), ("console.lock-url", "ftp://x:1")]);
        assert!(resolve(&l, Profile::Production).is_err_and(|e| e.contains("console.lock-url")));
        let l = Layers::of(&[("auth.enabled", "false")]);
        assert!(resolve(&l, Profile::Production).is_err_and(|e| e.contains("auth.enabled")));
    }
}
