//! The client's settings: the executor → payment-resource budgets of C3 §3.8, unit last.
//! The executor maps its `executor.write.*` and `executor.read.*` keys onto these fields.

use dlock_contract::ErrorCode;
use dlock_rt::http::BaseUrl;

/// Claim / post (and create) connect budget (C3 §3.8: 500 ms / 3 s).
pub const WRITE_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 500;
/// Claim / post (and create) read budget.
pub const WRITE_READ_TIMEOUT_MS_DEFAULT: u64 = 3_000;
/// Re-sends of a write after the first, only on 503 or a connect failure (C3 §3.8 "1").
pub const WRITE_RETRIES_MAX_DEFAULT: u32 = 1;
/// Advisory GET connect budget (C3 §3.8: 300 ms / 1 s).
pub const READ_CONNECT_TIMEOUT_MS_DEFAULT: u64 = 300;
/// Advisory GET read budget.
pub const READ_READ_TIMEOUT_MS_DEFAULT: u64 = 1_000;
/// Advisory GET tries, the first included (C3 §3.8 "2").
pub const READ_TRIES_MAX_DEFAULT: u32 = 2;
/// Longest `retryAfterMillis` waited for before the re-send of a write (a longer one is cut
/// to this, as the executor always did).
pub const WRITE_RETRY_AFTER_MS_MAX: u64 = 1_000;
/// Pause between two tries of an advisory read.
pub const READ_RETRY_PAUSE_MS: u64 = 50;
/// Longest any budget may be set to.
pub const TIMEOUT_MS_CEILING_MAX: u64 = 60_000;
/// Largest number of tries or retries any call may be given.
pub const TRIES_CEILING_MAX: u32 = 10;

/// The refusals after which a write may be re-sent: the 503s that mean "nothing was
/// touched". Each is retry-safe in the catalogue (checked by a test and at every retry).
pub const WRITE_RETRY_CODES: &[ErrorCode] = &[ErrorCode::NotReady, ErrorCode::NotLeader, ErrorCode::RailUnavailable];

/// The client's settings. Build with [`PaymentClientConfig::new`] and adjust fields.
#[derive(Debug, Clone)]
pub struct PaymentClientConfig {
    /// The payment-resource, `http://host:port`.
    pub base_url: BaseUrl,
    pub write_connect_timeout_ms: u64,
    pub write_read_timeout_ms: u64,
    /// Re-sends after the first try (0 disables them).
    pub write_retries_max: u32,
    pub read_connect_timeout_ms: u64,
    pub read_read_timeout_ms: u64,
    /// Tries, the first included. At least 1.
    pub read_tries_max: u32,
    /// The credential every request presents (C3-extensions E-13); none: no header.
    pub bearer: Option<dlock_rt::http::Bearer>,
}

impl PaymentClientConfig {
    /// Settings with every C3 §3.8 default.
    pub fn new(base_url: BaseUrl) -> PaymentClientConfig {
        PaymentClientConfig {
            base_url,
            write_connect_timeout_ms: WRITE_CONNECT_TIMEOUT_MS_DEFAULT,
            write_read_timeout_ms: WRITE_READ_TIMEOUT_MS_DEFAULT,
            write_retries_max: WRITE_RETRIES_MAX_DEFAULT,
            read_connect_timeout_ms: READ_CONNECT_TIMEOUT_MS_DEFAULT,
            read_read_timeout_ms: READ_READ_TIMEOUT_MS_DEFAULT,
            read_tries_max: READ_TRIES_MAX_DEFAULT,
            bearer: None,
        }
    }

    /// Refuses settings outside their ranges, naming the field.
    pub fn validate(&self) -> Result<(), String> {
        let timeouts = [
            ("write_connect_timeout_ms", self.write_connect_timeout_ms),
            ("write_read_timeout_ms", self.write_read_timeout_ms),
            ("read_connect_timeout_ms", self.read_connect_timeout_ms),
            ("read_read_timeout_ms", self.read_read_timeout_ms),
        ];
        for (name, v) in timeouts {
            if v == 0 || v > TIMEOUT_MS_CEILING_MAX {
                return Err(format!("{name} must be 1..={TIMEOUT_MS_CEILING_MAX}"));
            }
        }
        if self.write_retries_max > TRIES_CEILING_MAX {
            return Err(format!("write_retries_max must be 0..={TRIES_CEILING_MAX}"));
        }
        if !(1..=TRIES_CEILING_MAX).contains(&self.read_tries_max) {
            return Err(format!("read_tries_max must be 1..={TRIES_CEILING_MAX}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> PaymentClientConfig {
        PaymentClientConfig::new(BaseUrl::parse("http://127.0.0.1:8082").expect("url"))
    }

    #[test]
    fn defaults_are_the_c3_3_8_payment_resource_budgets() {
        let c = cfg();
        assert_eq!((c.write_connect_timeout_ms, c.write_read_timeout_ms, c.write_retries_max), (500, 3_000, 1));
        assert_eq!((c.read_connect_timeout_ms, c.read_read_timeout_ms, c.read_tries_max), (300, 1_000, 2));
        assert_eq!(c.validate(), Ok(()));
    }

    #[test]
    fn write_retry_codes_are_catalogue_retry_safe_503s() {
        for code in WRITE_RETRY_CODES {
            assert!(code.retry_safe(), "{code}");
            assert_eq!(code.http_status(), 503, "{code}");
        }
    }

    #[test]
    fn out_of_range_settings_are_refused_by_name() {
        let mut c = cfg();
        c.read_tries_max = 0;
        assert!(c.validate().is_err_and(|e| e.contains("read_tries_max")));
        let mut c = cfg();
        c.write_read_timeout_ms = TIMEOUT_MS_CEILING_MAX + 1;
        assert!(c.validate().is_err_and(|e| e.contains("write_read_timeout_ms")));
        let mut c = cfg();
        c.write_retries_max = TRIES_CEILING_MAX + 1;
        assert!(c.validate().is_err_and(|e| e.contains("write_retries_max")));
    }
}
