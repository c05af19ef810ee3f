//! The binary's side of layered configuration (C5). The machinery (flag > environment >
//! `--config FILE` > command default > built-in default) lives in `dlock_config`; each
//! service crate owns its keys and its one resolver (`dlock_<service>::config::resolve`).
//! This module only knows which keys exist: the union of every service's, plus the
//! profile. Every command, `dlock up` and `dlock demo` included, builds its [`Layers`] here.

pub use dlock_config::{FileConfig, Layers, Profile, LOCKDB_URL_DEFAULT, PAYDB_URL_DEFAULT, PROFILE_KEY};

/// `http.header-bytes-max`: the request header bound of every server this process runs
/// (one process-wide value; see `dlock_rt::http::set_process_header_bytes_max`).
pub const HTTP_HEADER_BYTES_MAX_KEY: &str = "http.header-bytes-max";

/// `trace.file`: a service process appends its protocol events to this file as incident-trace
/// lines (`crate::trace_file`); absent, it writes none.
pub const TRACE_FILE_KEY: &str = "trace.file";

/// Every key a config file may set. An unknown key is an error, not a silent no-op: a typo
/// in a payment system's config should stop the process, not be ignored.
pub fn known_keys() -> Vec<&'static str> {
    let mut keys = vec![PROFILE_KEY, HTTP_HEADER_BYTES_MAX_KEY, TRACE_FILE_KEY];
    // `tls.*`: one transport for every service and client of the process (E-15).
    keys.extend_from_slice(dlock_config::tls::KEYS);
    // `telemetry.*`: the process's optional OTLP exporter (E-17).
    keys.extend_from_slice(dlock_config::telemetry::KEYS);
    for service in [
        dlock_rail_stub::config::KEYS,
        dlock_rail_proxy::config::KEYS,
        dlock_payment_resource::config::KEYS,
        dlock_executor::config::KEYS,
        dlock_reconciler::config::KEYS,
        dlock_lock_server::config::KEYS,
        dlock_console::config::KEYS,
        dlock_http::auth::KEYS,
    ] {
        keys.extend_from_slice(service);
    }
    keys
}

/// The layers of this process: `file` (already checked against [`known_keys`]) beneath
/// the `DLOCK_*` environment; the command adds its flags.
pub fn process_layers(file: FileConfig) -> Layers {
    Layers::new(file).with_process_env()
}

/// Reads `--config` (none: no file), refusing unknown keys.
pub fn load_file(path: Option<&std::path::Path>) -> Result<FileConfig, String> {
    FileConfig::load(path, &known_keys())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_belongs_to_exactly_one_service() {
        let keys = known_keys();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), keys.len(), "a key is claimed twice");
        assert!(keys.len() >= 60, "{}", keys.len());
    }

    #[test]
    fn a_file_may_set_any_service_key_and_no_other() {
        let ok = FileConfig::parse(
            "profile = \"unsafe-test\"\n[rail.proxy.fencing]\nenabled = false\n[payment.fencing]\nenabled = false\n",
            "f",
            &known_keys(),
        );
        assert!(ok.is_ok(), "{ok:?}");
        assert!(FileConfig::parse("[rail.proxy]\nfencing = false\n", "f", &known_keys()).is_err());
    }
}
