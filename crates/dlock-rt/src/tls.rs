//! Optional TLS on serve and connect, mutual when a client CA is set (the `tls.*` keys,
//! [`dlock_config::tls`], C3-extensions E-15). rustls on the `ring` provider.
//!
//! - A server with a [`ServerTls`] completes a TLS handshake on every accepted connection
//!   within [`TLS_HANDSHAKE_MS_MAX`] before hyper reads a byte; with a client CA it
//!   requires a client certificate chaining to it, so a client without one (or with one
//!   from another CA) is refused at the handshake and no handler runs.
//! - A client with a [`ClientTls`] trusts only its CA file's certificates, names the
//!   server by the URL's host (an IP address or a DNS name, checked against the
//!   certificate), and presents its own identity when it has one.
//! - The process's TLS ([`install_process_tls`]) is set once at start-up from the keys;
//!   [`crate::ServiceHandle::serve`] and [`crate::http::HttpClient::new`] use it, so every
//!   service and every client of one process speak the same transport.
//!
//! Production only: under `cfg(madsim)` the types and the keys compile, but no TLS value
//! can be built ([`load`] refuses `tls.enabled = true`), so the simulation never
//! handshakes.
//!
//! Invariants: an error names the key and the file, never a byte of key material; once
//! TLS is installed, a client never sends a request in plaintext (`http://` is refused
//! before connecting) and a server never serves one (every connection handshakes first).

use std::sync::OnceLock;

pub use dlock_config::tls::TlsSettings;
use dlock_config::tls::{TLS_CA_FILE_KEY, TLS_CERT_FILE_KEY, TLS_CLIENT_CA_FILE_KEY, TLS_KEY_FILE_KEY};

/// Longest a TLS handshake may take, on either side (a client's is also bounded by its
/// connect budget).
pub const TLS_HANDSHAKE_MS_MAX: u64 = 10_000;

/// A server's TLS: its identity and, for mutual TLS, the CAs its clients must chain to.
#[derive(Clone)]
pub struct ServerTls {
    #[cfg(not(madsim))]
    acceptor: tokio_rustls::TlsAcceptor,
    #[cfg(madsim)]
    never: std::convert::Infallible,
}

/// A client's TLS: the CAs it trusts, and its identity when it has one.
#[derive(Clone)]
pub struct ClientTls {
    #[cfg(not(madsim))]
    connector: tokio_rustls::TlsConnector,
    #[cfg(madsim)]
    never: std::convert::Infallible,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ServerTls")
    }
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientTls")
    }
}

/// A process's TLS, loaded from [`TlsSettings`].
#[derive(Debug, Clone)]
pub struct Tls {
    /// `None` when the process has no identity (`tls.cert-file`): it may connect, not serve.
    pub server: Option<ServerTls>,
    pub client: ClientTls,
}

/// One PEM input: the key it came from, where it is, and its bytes.
#[derive(Clone, Copy)]
pub struct Pem<'a> {
    pub key: &'a str,
    pub source: &'a str,
    pub bytes: &'a [u8],
}

impl<'a> Pem<'a> {
    /// PEM bytes given in memory (tests); `source` names them in errors.
    pub fn new(key: &'a str, source: &'a str, bytes: &'a [u8]) -> Pem<'a> {
        Pem { key, source, bytes }
    }

    #[cfg(not(madsim))]
    fn error(&self, what: &str) -> String {
        format!("{} = {}: {what}", self.key, self.source)
    }
}

/// Reads the files the settings name and builds the process's TLS; `None` when
/// `tls.enabled` is false. Under `cfg(madsim)`, enabled TLS is refused.
pub fn load(settings: &TlsSettings) -> Result<Option<Tls>, String> {
    if !settings.enabled {
        return Ok(None);
    }
    if cfg!(madsim) {
        return Err("tls.enabled is not supported in the simulation (TLS is production-only)".to_owned());
    }
    let read = |key: &str, path: &std::path::Path| -> Result<(String, Vec<u8>), String> {
        let source = path.display().to_string();
        std::fs::read(path).map(|b| (source.clone(), b)).map_err(|e| format!("{key} = {source}: cannot read: {e}"))
    };
    let ca_path = settings.ca_file.as_deref().ok_or_else(|| format!("{TLS_CA_FILE_KEY} is required"))?;
    let ca = read(TLS_CA_FILE_KEY, ca_path)?;
    let identity = match &settings.identity {
        Some((c, k)) => Some((read(TLS_CERT_FILE_KEY, c)?, read(TLS_KEY_FILE_KEY, k)?)),
        None => None,
    };
    let client_ca = match &settings.client_ca_file {
        Some(p) => Some(read(TLS_CLIENT_CA_FILE_KEY, p)?),
        None => None,
    };
    let ident = identity
        .as_ref()
        .map(|(c, k)| (Pem::new(TLS_CERT_FILE_KEY, &c.0, &c.1), Pem::new(TLS_KEY_FILE_KEY, &k.0, &k.1)));
    let client = ClientTls::from_pem(Pem::new(TLS_CA_FILE_KEY, &ca.0, &ca.1), ident)?;
    let server = match ident {
        Some((cert, key)) => Some(ServerTls::from_pem(
            cert,
            key,
            client_ca.as_ref().map(|f| Pem::new(TLS_CLIENT_CA_FILE_KEY, &f.0, &f.1)),
        )?),
        None if client_ca.is_some() => {
            return Err(format!(
                "{TLS_CLIENT_CA_FILE_KEY} is set without {TLS_CERT_FILE_KEY}: a server needs an identity"
            ))
        }
        None => None,
    };
    Ok(Some(Tls { server, client }))
}

static PROCESS_TLS: OnceLock<Tls> = OnceLock::new();

/// Loads the settings and makes them this process's TLS (once, at start-up, before any
/// service starts). Disabled settings install nothing.
pub fn install_process_tls(settings: &TlsSettings) -> Result<(), String> {
    let Some(tls) = load(settings)? else { return Ok(()) };
    PROCESS_TLS.set(tls).map_err(|_| "the process's TLS is installed twice".to_owned())
}

/// This process's TLS, if installed.
pub fn process_tls() -> Option<&'static Tls> {
    PROCESS_TLS.get()
}

/// `https` when this process speaks TLS, else `http`: the scheme of the URLs it builds
/// for its own services.
pub fn process_scheme() -> &'static str {
    if process_tls().is_some() {
        "https"
    } else {
        "http"
    }
}

/// The start-up check of a URL key: with TLS installed it must be `https://`, without it
/// `http://` (the client would refuse every call otherwise; better to refuse to start,
/// naming the key).
pub fn check_url_scheme(key: &str, url: &crate::http::BaseUrl) -> Result<(), String> {
    match (process_tls().is_some(), url.tls) {
        (true, false) => Err(format!("{key} = {}: tls.enabled is true, so the URL must be https://", url.url())),
        (false, true) => Err(format!("{key} = {}: an https:// URL needs tls.enabled = true", url.url())),
        _ => Ok(()),
    }
}

#[cfg(not(madsim))]
mod real {
    use std::sync::Arc;

    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

    use super::{ClientTls, Pem, ServerTls};

    fn provider() -> Arc<rustls::crypto::CryptoProvider> {
        Arc::new(rustls::crypto::ring::default_provider())
    }

    fn certs(pem: Pem<'_>) -> Result<Vec<CertificateDer<'static>>, String> {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.bytes)
            .collect::<Result<_, _>>()
            .map_err(|_| pem.error("not a PEM file of certificates"))?;
        if certs.is_empty() {
            return Err(pem.error("holds no PEM certificate"));
        }
        Ok(certs)
    }

    fn key(pem: Pem<'_>) -> Result<PrivateKeyDer<'static>, String> {
        // The parser's own error may quote a line of the file: never shown.
        PrivateKeyDer::from_pem_slice(pem.bytes)
            .map_err(|_| pem.error("holds no PEM private key (PKCS#8, PKCS#1 or SEC1)"))
    }

    fn roots(pem: Pem<'_>) -> Result<rustls::RootCertStore, String> {
        let mut store = rustls::RootCertStore::empty();
        for c in certs(pem)? {
            store.add(c).map_err(|e| pem.error(&format!("a CA certificate is not usable: {e}")))?;
        }
        Ok(store)
    }

    impl ServerTls {
        /// A server identity (`cert` chain and `key`); with `client_ca`, clients must
        /// present a certificate chaining to it (mutual TLS).
        pub fn from_pem(cert: Pem<'_>, key: Pem<'_>, client_ca: Option<Pem<'_>>) -> Result<ServerTls, String> {
            let builder = rustls::ServerConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS: {e}"))?;
            let builder = match client_ca {
                Some(ca) => {
                    let verifier =
                        rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider())
                            .build()
                            .map_err(|e| ca.error(&format!("cannot verify clients: {e}")))?;
                    builder.with_client_cert_verifier(verifier)
                }
                None => builder.with_no_client_auth(),
            };
            let mut config = builder
                .with_single_cert(certs(cert)?, self::key(key)?)
                .map_err(|e| format!("{} = {}, {} = {}: {e}", cert.key, cert.source, key.key, key.source))?;
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(ServerTls { acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)) })
        }

        /// The server side of the handshake on an accepted connection.
        pub(crate) async fn accept(
            &self,
            stream: tokio::net::TcpStream,
        ) -> std::io::Result<tokio_rustls::server::TlsStream<tokio::net::TcpStream>> {
            self.acceptor.accept(stream).await
        }
    }

    impl ClientTls {
        /// A client trusting `ca`, presenting `identity` (cert chain, key) when given.
        pub fn from_pem(ca: Pem<'_>, identity: Option<(Pem<'_>, Pem<'_>)>) -> Result<ClientTls, String> {
            let builder = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| format!("TLS: {e}"))?
                .with_root_certificates(roots(ca)?);
            let mut config = match identity {
                Some((cert, key)) => builder
                    .with_client_auth_cert(certs(cert)?, self::key(key)?)
                    .map_err(|e| format!("{} = {}, {} = {}: {e}", cert.key, cert.source, key.key, key.source))?,
                None => builder.with_no_client_auth(),
            };
            config.alpn_protocols = vec![b"http/1.1".to_vec()];
            Ok(ClientTls { connector: tokio_rustls::TlsConnector::from(Arc::new(config)) })
        }

        /// The client side of the handshake with `host` (the URL's host: an IP address or
        /// a DNS name) on a connected stream.
        pub(crate) async fn connect(
            &self,
            host: &str,
            stream: tokio::net::TcpStream,
        ) -> std::io::Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
            let name =
                ServerName::try_from(host.trim_start_matches('[').trim_end_matches(']').to_owned()).map_err(|e| {
                    std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("server name {host}: {e}"))
                })?;
            self.connector.connect(name, stream).await
        }
    }
}

#[cfg(madsim)]
mod sim {
    use super::{ClientTls, Pem, ServerTls};

    const REFUSED: &str = "TLS is production-only: not available under the simulation";

    impl ServerTls {
        /// Refused in the simulation (see the module doc).
        pub fn from_pem(_cert: Pem<'_>, _key: Pem<'_>, _client_ca: Option<Pem<'_>>) -> Result<ServerTls, String> {
            Err(REFUSED.to_owned())
        }

        pub(crate) async fn accept(&self, _stream: tokio::net::TcpStream) -> std::io::Result<tokio::net::TcpStream> {
            match self.never {}
        }
    }

    impl ClientTls {
        /// Refused in the simulation (see the module doc).
        pub fn from_pem(_ca: Pem<'_>, _identity: Option<(Pem<'_>, Pem<'_>)>) -> Result<ClientTls, String> {
            Err(REFUSED.to_owned())
        }

        pub(crate) async fn connect(
            &self,
            _host: &str,
            _stream: tokio::net::TcpStream,
        ) -> std::io::Result<tokio::net::TcpStream> {
            match self.never {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn enabled_tls_is_refused_in_the_simulation_and_read_from_its_files_outside_it() {
        let s = TlsSettings {
            enabled: true,
            identity: None,
            client_ca_file: None,
            ca_file: Some("/nonexistent/dlock-ca.pem".into()),
        };
        let err = load(&s).expect_err("no usable TLS");
        if cfg!(madsim) {
            assert!(err.contains("not supported in the simulation"), "{err}");
        } else {
            assert!(err.starts_with("tls.ca-file = /nonexistent/dlock-ca.pem: cannot read"), "{err}");
        }
        assert!(load(&TlsSettings::default()).expect("off").is_none());
        // Nothing installed in this process: plain HTTP, and an https:// URL key is refused.
        assert_eq!(process_scheme(), "http");
        let https = crate::http::BaseUrl::parse("https://127.0.0.1:1").expect("url");
        assert!(check_url_scheme("x.url", &https).expect_err("https without tls").starts_with("x.url = https://"));
        assert!(check_url_scheme("x.url", &crate::http::BaseUrl::plain("127.0.0.1:1")).is_ok());
    }
}
