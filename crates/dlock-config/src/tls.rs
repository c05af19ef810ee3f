//! The transport-security keys (`tls.*`, C3-extensions E-15): one set for the whole
//! process, so a single `--config` file secures every service `dlock up` runs, and the
//! separate processes read the same keys.
//!
//! - `tls.enabled` (default `false`): serve and connect over TLS.
//! - `tls.cert-file`, `tls.key-file` (PEM): this process's certificate chain and private
//!   key; the identity its servers present, and the client certificate its clients present.
//! - `tls.client-ca-file` (PEM): when set, every server requires a client certificate
//!   signed by one of these CAs (mutual TLS); a client without one is refused at the
//!   handshake.
//! - `tls.ca-file` (PEM): the CAs this process's clients trust for the servers they call.
//!
//! Invariant: [`resolve`] only reads and cross-checks the keys (which must be set
//! together); the files themselves are read by `dlock_rt::tls`, whose errors name the key
//! and the file and never print key material.

use std::path::PathBuf;

use crate::Layers;

/// `tls.enabled`.
pub const TLS_ENABLED_KEY: &str = "tls.enabled";
/// `tls.cert-file`.
pub const TLS_CERT_FILE_KEY: &str = "tls.cert-file";
/// `tls.key-file`.
pub const TLS_KEY_FILE_KEY: &str = "tls.key-file";
/// `tls.client-ca-file`.
pub const TLS_CLIENT_CA_FILE_KEY: &str = "tls.client-ca-file";
/// `tls.ca-file`.
pub const TLS_CA_FILE_KEY: &str = "tls.ca-file";

/// Every `tls.*` key.
pub const KEYS: &[&str] =
    &[TLS_ENABLED_KEY, TLS_CERT_FILE_KEY, TLS_KEY_FILE_KEY, TLS_CLIENT_CA_FILE_KEY, TLS_CA_FILE_KEY];

/// The resolved `tls.*` keys (paths, not yet read).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub enabled: bool,
    /// `tls.cert-file` and `tls.key-file`, set together.
    pub identity: Option<(PathBuf, PathBuf)>,
    pub client_ca_file: Option<PathBuf>,
    pub ca_file: Option<PathBuf>,
}

/// Reads the `tls.*` keys. With `tls.enabled = false` nothing else is read (the files may
/// be set and switched off). With it on, `tls.cert-file` and `tls.key-file` come as a pair
/// and `tls.ca-file` is required (the clients trust nothing else).
pub fn resolve(layers: &Layers) -> Result<TlsSettings, String> {
    let enabled = layers.get(TLS_ENABLED_KEY, false)?;
    if !enabled {
        return Ok(TlsSettings::default());
    }
    let path = |key: &str| -> Result<Option<PathBuf>, String> {
        match layers.get_opt::<String>(key)? {
            Some(p) if p.trim().is_empty() => Err(format!("{key} is empty (tls.enabled is true)")),
            Some(p) => Ok(Some(PathBuf::from(p))),
            None => Ok(None),
        }
    };
    let identity = match (path(TLS_CERT_FILE_KEY)?, path(TLS_KEY_FILE_KEY)?) {
        (Some(c), Some(k)) => Some((c, k)),
        (None, None) => None,
        (Some(_), None) => return Err(format!("{TLS_CERT_FILE_KEY} is set without {TLS_KEY_FILE_KEY}")),
        (None, Some(_)) => return Err(format!("{TLS_KEY_FILE_KEY} is set without {TLS_CERT_FILE_KEY}")),
    };
    let ca_file = path(TLS_CA_FILE_KEY)?;
    if ca_file.is_none() {
        return Err(format!("{TLS_CA_FILE_KEY} is required when {TLS_ENABLED_KEY} is true (the CAs clients trust)"));
    }
    Ok(TlsSettings { enabled, identity, client_ca_file: path(TLS_CLIENT_CA_FILE_KEY)?, ca_file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_is_off_by_default_and_its_files_are_ignored_while_off() {
        assert_eq!(resolve(&Layers::default()), Ok(TlsSettings::default()));
        let l = Layers::of(&[(TLS_CERT_FILE_KEY, "c.pem")]);
        assert_eq!(resolve(&l), Ok(TlsSettings::default()));
    }

    #[test]
    fn enabled_tls_needs_a_ca_and_a_whole_identity() {
        let ok = Layers::of(&[
            (TLS_ENABLED_KEY, "true"),
            (TLS_CERT_FILE_KEY, "c.pem"),
            (TLS_KEY_FILE_KEY, "k.pem"),
            (TLS_CA_FILE_KEY, "ca.pem"),
            (TLS_CLIENT_CA_FILE_KEY, "cca.pem"),
        ]);
        let s = resolve(&ok).expect("valid");
        assert!(s.enabled);
        assert_eq!(s.identity, Some((PathBuf::from("c.pem"), PathBuf::from("k.pem"))));
        assert_eq!(s.client_ca_file, Some(PathBuf::from("cca.pem")));
        let no_ca = Layers::of(&[(TLS_ENABLED_KEY, "true"), (TLS_CERT_FILE_KEY, "c"), (TLS_KEY_FILE_KEY, "k")]);
        assert!(resolve(&no_ca).expect_err("no ca").contains(TLS_CA_FILE_KEY));
        let half = Layers::of(&[(TLS_ENABLED_KEY, "true"), (TLS_CERT_FILE_KEY, "c"), (TLS_CA_FILE_KEY, "ca")]);
        assert!(resolve(&half).expect_err("half").contains(TLS_KEY_FILE_KEY));
        let bad = Layers::of(&[(TLS_ENABLED_KEY, "yes")]);
        assert!(resolve(&bad).expect_err("bad bool").contains(TLS_ENABLED_KEY));
    }
}
