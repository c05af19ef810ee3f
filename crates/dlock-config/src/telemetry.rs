//! The trace-export keys (`telemetry.otlp.*`, C3-extensions E-17): one set for the whole
//! process, like `tls.*`.
//!
//! - `telemetry.otlp.enabled` (default `false`): export this process's spans over OTLP/HTTP
//!   (JSON) to a collector.
//! - `telemetry.otlp.endpoint`: the collector, `http://host:port` or `https://host:port`
//!   (spans are posted to `/v1/traces`); required when enabled.
//! - `telemetry.otlp.service-name`: the `service.name` the spans carry (default: the
//!   command's name, e.g. `rail-proxy`).
//!
//! Invariant: [`resolve`] only reads and cross-checks the keys; the exporter itself
//! (`dlock_rt::otlp`) is production-only and refused under the simulation.

use crate::Layers;

/// `telemetry.otlp.enabled`.
pub const OTLP_ENABLED_KEY: &str = "telemetry.otlp.enabled";
/// `telemetry.otlp.endpoint`.
pub const OTLP_ENDPOINT_KEY: &str = "telemetry.otlp.endpoint";
/// `telemetry.otlp.service-name`.
pub const OTLP_SERVICE_NAME_KEY: &str = "telemetry.otlp.service-name";
/// Longest `telemetry.otlp.service-name`, in characters.
pub const SERVICE_NAME_CHARS_MAX: usize = 128;

/// Every `telemetry.*` key.
pub const KEYS: &[&str] = &[OTLP_ENABLED_KEY, OTLP_ENDPOINT_KEY, OTLP_SERVICE_NAME_KEY];

/// The resolved `telemetry.otlp.*` keys.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OtlpSettings {
    pub enabled: bool,
    /// The collector's base URL (checked as a URL by `dlock_rt::otlp`).
    pub endpoint: String,
    /// `None`: the command's name.
    pub service_name: Option<String>,
}

/// Reads the `telemetry.otlp.*` keys. With `telemetry.otlp.enabled = false` nothing else is
/// read; with it on, `telemetry.otlp.endpoint` is required.
pub fn resolve(layers: &Layers) -> Result<OtlpSettings, String> {
    let enabled = layers.get(OTLP_ENABLED_KEY, false)?;
    if !enabled {
        return Ok(OtlpSettings::default());
    }
    let endpoint = match layers.get_opt::<String>(OTLP_ENDPOINT_KEY)? {
        Some(e) if !e.trim().is_empty() => e.trim().to_owned(),
        _ => return Err(format!("{OTLP_ENDPOINT_KEY} is required when {OTLP_ENABLED_KEY} is true")),
    };
    let service_name = match layers.get_opt::<String>(OTLP_SERVICE_NAME_KEY)? {
        Some(n) if n.trim().is_empty() || n.chars().count() > SERVICE_NAME_CHARS_MAX => {
            return Err(format!("{OTLP_SERVICE_NAME_KEY} must be 1 to {SERVICE_NAME_CHARS_MAX} characters"));
        }
        other => other,
    };
    Ok(OtlpSettings { enabled, endpoint, service_name })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers(pairs: &[(&str, &str)]) -> Layers {
        Layers::default().with_env(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())))
    }

    #[test]
    fn export_is_off_by_default_and_the_endpoint_is_required_when_on() {
        assert_eq!(resolve(&Layers::default()), Ok(OtlpSettings::default()));
        let off = layers(&[("DLOCK_TELEMETRY_OTLP_ENDPOINT", "http://127.0.0.1:4318")]);
        assert!(!resolve(&off).expect("off").enabled);
        let missing = layers(&[("DLOCK_TELEMETRY_OTLP_ENABLED", "true")]);
        assert!(resolve(&missing).expect_err("no endpoint").contains(OTLP_ENDPOINT_KEY));
        let on = layers(&[
            ("DLOCK_TELEMETRY_OTLP_ENABLED", "true"),
            ("DLOCK_TELEMETRY_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
            ("DLOCK_TELEMETRY_OTLP_SERVICE_NAME", "proxy-a"),
        ]);
        let s = resolve(&on).expect("on");
        assert_eq!(
            (s.enabled, s.endpoint.as_str(), s.service_name.as_deref()),
            (true, "http://127.0.0.1:4318", Some("proxy-a"))
        );
    }
}
