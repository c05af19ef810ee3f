//! Certificates made in the test (rcgen, ring): a CA, a server certificate for
//! `127.0.0.1` and `localhost`, a client certificate, each as PEM; and [`TlsFiles`], the
//! same written to a temp directory for the `tls.*` keys of a real process.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};

/// A certificate and its private key, PEM.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

/// A certificate authority that issues server and client certificates.
pub struct TestCa {
    cert: Certificate,
    key: KeyPair,
}

impl TestCa {
    /// A fresh self-signed CA named `name`.
    pub fn new(name: &str) -> TestCa {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("ca params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("ca key");
        let cert = p.self_signed(&key).expect("ca cert");
        TestCa { cert, key }
    }

    /// The CA's certificate, PEM (what a `tls.ca-file` or `tls.client-ca-file` holds).
    pub fn cert_pem(&self) -> String {
        self.cert.pem()
    }

    fn issue(&self, name: &str, sans: &[&str], purposes: Vec<ExtendedKeyUsagePurpose>) -> Issued {
        let mut p = CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>()).expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.extended_key_usages = purposes;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.cert, &self.key).expect("signed");
        Issued { cert_pem: cert.pem(), key_pem: key.serialize_pem() }
    }

    /// A server certificate for `127.0.0.1` and `localhost`.
    pub fn server(&self) -> Issued {
        self.issue("dlock test server", &["127.0.0.1", "localhost"], vec![ExtendedKeyUsagePurpose::ServerAuth])
    }

    /// A client certificate named `name`.
    pub fn client(&self, name: &str) -> Issued {
        self.issue(name, &[], vec![ExtendedKeyUsagePurpose::ClientAuth])
    }
}

/// PEM files for a process's `tls.*` keys, in a fresh temp directory: `ca.pem` (the
/// trusted CA), `server.pem`/`server.key` (the services' identity; it also authenticates
/// as a client), `client.pem`/`client.key` (a client identity from the same CA),
/// `rogue.pem`/`rogue.key` (a client identity from an untrusted CA).
pub struct TlsFiles {
    pub dir: PathBuf,
}

impl TlsFiles {
    /// Makes the CA and the certificates, and writes them.
    pub fn new() -> TlsFiles {
        let dir = std::env::temp_dir().join(format!("dlock-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let ca = TestCa::new("dlock test CA");
        let rogue = TestCa::new("untrusted CA");
        // One identity for serving and for calling the other services: both purposes.
        let server = ca.issue(
            "dlock services",
            &["127.0.0.1", "localhost"],
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth],
        );
        let client = ca.client("dlock test client");
        let rogue_client = rogue.client("rogue client");
        let write = |name: &str, text: &str| std::fs::write(dir.join(name), text).expect("write pem");
        write("ca.pem", &ca.cert_pem());
        write("server.pem", &server.cert_pem);
        write("server.key", &server.key_pem);
        write("client.pem", &client.cert_pem);
        write("client.key", &client.key_pem);
        write("rogue.pem", &rogue_client.cert_pem);
        write("rogue.key", &rogue_client.key_pem);
        TlsFiles { dir }
    }

    /// The path of one of the files.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The contents of one of the files.
    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).expect("read pem")
    }

    /// A config file turning mutual TLS on with these files (`tls.client-ca-file` = the CA).
    pub fn mtls_config(&self) -> String {
        let p = |n: &str| self.path(n).display().to_string();
        format!(
            "[tls]\nenabled = true\ncert-file = {:?}\nkey-file = {:?}\nca-file = {:?}\nclient-ca-file = {:?}\n",
            p("server.pem"),
            p("server.key"),
            p("ca.pem"),
            p("ca.pem")
        )
    }
}

impl Default for TlsFiles {
    fn default() -> Self {
        TlsFiles::new()
    }
}

impl Drop for TlsFiles {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
