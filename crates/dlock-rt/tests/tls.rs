//! TLS on dlock-rt's serve and connect (E-15), with certificates made in the test: a
//! client trusting the CA is served; under mutual TLS a client without a certificate, or
//! with one from an untrusted CA, is refused at the handshake and no handler runs; a
//! client refuses a server whose certificate it cannot chain to its CA; a scheme that
//! does not match the client's transport is refused before connecting; a broken file is
//! an error naming its key and path, never its contents.
#![cfg(not(madsim))]
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use dlock_rt::http::{BaseUrl, ClientError, HttpClient, ServeLimits};
use dlock_rt::tls::{ClientTls, Pem, ServerTls, TlsSettings};
use dlock_testkit::certs::{Issued, TestCa};

/// A served router over `tls` whose `GET /ok` counts its calls; the sender stops it.
async fn serve(tls: ServerTls) -> (BaseUrl, Arc<AtomicUsize>, tokio::sync::oneshot::Sender<()>) {
    use axum::routing::get;
    let calls = Arc::new(AtomicUsize::new(0));
    let c = calls.clone();
    let router = axum::Router::new().route(
        "/ok",
        get(move || {
            let c = c.clone();
            async move {
                c.fetch_add(1, Ordering::SeqCst);
                "hi"
            }
        }),
    );
    let listener = dlock_rt::http::bind("127.0.0.1:0".parse().expect("addr")).await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async {
        let _ = rx.await;
    };
    tokio::spawn(dlock_rt::http::serve_with_tls(listener, router, stop, ServeLimits::default(), Some(tls)));
    (BaseUrl::parse(&format!("https://{addr}")).expect("url"), calls, tx)
}

fn server_tls(server: &Issued, client_ca: Option<&TestCa>) -> ServerTls {
    let ca_pem = client_ca.map(TestCa::cert_pem);
    ServerTls::from_pem(
        Pem::new("tls.cert-file", "server.pem", server.cert_pem.as_bytes()),
        Pem::new("tls.key-file", "server.key", server.key_pem.as_bytes()),
        ca_pem.as_ref().map(|p| Pem::new("tls.client-ca-file", "ca.pem", p.as_bytes())),
    )
    .expect("server tls")
}

fn client(ca: &TestCa, identity: Option<&Issued>) -> HttpClient {
    let ca_pem = ca.cert_pem();
    let tls = ClientTls::from_pem(
        Pem::new("tls.ca-file", "ca.pem", ca_pem.as_bytes()),
        identity.map(|i| {
            (
                Pem::new("tls.cert-file", "client.pem", i.cert_pem.as_bytes()),
                Pem::new("tls.key-file", "client.key", i.key_pem.as_bytes()),
            )
        }),
    )
    .expect("client tls");
    HttpClient::new(2_000, 5_000).with_tls(Some(tls))
}

async fn get_ok(c: &HttpClient, base: &BaseUrl) -> Result<(u16, Vec<u8>), ClientError> {
    c.send(base, http::Method::GET, "/ok", &[], None).await.map(|r| (r.status, r.body.to_vec()))
}

#[tokio::test]
async fn a_client_trusting_the_ca_is_served_over_tls_by_ip_and_by_name() {
    let ca = TestCa::new("ca");
    let (base, calls, _stop) = serve(server_tls(&ca.server(), None)).await;
    let c = client(&ca, None);
    assert_eq!(get_ok(&c, &base).await.expect("served"), (200, b"hi".to_vec()));
    let by_name = BaseUrl::parse(&base.url().replace("127.0.0.1", "localhost")).expect("url");
    assert_eq!(get_ok(&c, &by_name).await.expect("served by name"), (200, b"hi".to_vec()));
    assert_eq!(calls.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn mutual_tls_serves_a_client_whose_certificate_chains_to_the_client_ca() {
    let ca = TestCa::new("ca");
    let (base, calls, _stop) = serve(server_tls(&ca.server(), Some(&ca))).await;
    let c = client(&ca, Some(&ca.client("executor")));
    assert_eq!(get_ok(&c, &base).await.expect("served"), (200, b"hi".to_vec()));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn mutual_tls_refuses_a_client_without_a_certificate_or_with_one_from_an_untrusted_ca() {
    let ca = TestCa::new("ca");
    let rogue = TestCa::new("rogue");
    let (base, calls, _stop) = serve(server_tls(&ca.server(), Some(&ca))).await;
    for (case, c) in [("no certificate", client(&ca, None)), ("untrusted CA", client(&ca, Some(&rogue.client("x"))))] {
        let err = get_ok(&c, &base).await.expect_err(case);
        // Under TLS 1.3 the server's verdict on the client's certificate arrives after the
        // client's handshake: a broken exchange (ambiguous), or a failed connect.
        assert!(matches!(err, ClientError::Broken(_) | ClientError::Connect(_)), "{case}: {err}");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0, "a refused client reached the handler");
    // The same server still serves a client with the right certificate.
    assert!(get_ok(&client(&ca, Some(&ca.client("ok"))), &base).await.is_ok());
}

#[tokio::test]
async fn a_client_refuses_a_server_whose_certificate_is_from_an_untrusted_ca() {
    let ca = TestCa::new("ca");
    let rogue = TestCa::new("rogue");
    let (base, calls, _stop) = serve(server_tls(&rogue.server(), None)).await;
    let err = get_ok(&client(&ca, None), &base).await.expect_err("untrusted server");
    assert!(matches!(err, ClientError::Connect(ref m) if m.contains("TLS handshake")), "{err}");
    assert!(err.nothing_sent(), "the request left the client before the server was verified");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_url_whose_scheme_does_not_match_the_clients_transport_is_refused_before_connecting() {
    let ca = TestCa::new("ca");
    let (base, calls, _stop) = serve(server_tls(&ca.server(), None)).await;
    let plain = HttpClient::new(2_000, 5_000).with_tls(None);
    let err = get_ok(&plain, &base).await.expect_err("https without tls");
    assert!(matches!(err, ClientError::BadUrl(ref m) if m.contains("tls.enabled")), "{err}");
    let http_url = BaseUrl::plain(base.authority.clone());
    let err = get_ok(&client(&ca, None), &http_url).await.expect_err("plaintext with tls on");
    assert!(matches!(err, ClientError::BadUrl(ref m) if m.contains("plaintext")), "{err}");
    // A plaintext request that reaches a TLS server is not served either.
    let err = get_ok(&plain, &http_url).await.expect_err("plaintext to a TLS server");
    assert!(!matches!(err, ClientError::BadUrl(_)), "{err}");
    assert_eq!(calls.load(Ordering::SeqCst), 0);
}

#[test]
fn a_broken_tls_file_is_an_error_naming_its_key_and_path_never_its_contents() {
    let files = dlock_testkit::certs::TlsFiles::new();
    let secret_line = "c2VjcmV0LWtleS1tYXRlcmlhbA==";
    std::fs::write(files.path("broken.key"), format!("-----BEGIN PRIVATE KEY-----\n{secret_line}\n")).expect("write");
    let settings = |key: &str| TlsSettings {
        enabled: true,
        identity: Some((files.path("server.pem"), files.path(key))),
        client_ca_file: None,
        ca_file: Some(files.path("ca.pem")),
    };
    for (key_file, want) in [("broken.key", "no PEM private key"), ("missing.key", "cannot read"), ("client.key", "")] {
        let err = dlock_rt::tls::load(&settings(key_file)).expect_err(key_file);
        assert!(err.contains("tls.key-file"), "{key_file}: {err}");
        assert!(err.contains(&files.path(key_file).display().to_string()), "{key_file}: {err}");
        assert!(err.contains(want), "{key_file}: {err}");
        assert!(!err.contains(secret_line) && !err.contains("BEGIN"), "{key_file}: key material in {err}");
        let key = String::from_utf8(files.read("client.key")).expect("pem");
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!err.contains(line), "{key_file}: key material in {err}");
        }
    }
    let mut no_ca = settings("server.key");
    no_ca.ca_file = Some(files.path("absent-ca.pem"));
    let err = dlock_rt::tls::load(&no_ca).expect_err("absent ca");
    assert!(err.contains("tls.ca-file") && err.contains("absent-ca.pem"), "{err}");
    assert!(dlock_rt::tls::load(&settings("server.key")).expect("valid").is_some_and(|t| t.server.is_some()));
    assert!(dlock_rt::tls::load(&TlsSettings::default()).expect("off").is_none());
}
