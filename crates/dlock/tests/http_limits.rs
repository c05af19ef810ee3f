//! `http.header-bytes-max` as an operator sets it: the real binary serves with the limit it
//! is given, answers a header section over it with the `431` envelope, and refuses to start
//! with a value outside its range.
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it drives them over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// Kills the child it holds when dropped (the test started it; nothing else is touched).
/// Its stdout stays open meanwhile, so a later line never meets a closed pipe.
struct Running {
    child: Child,
    _stdout: BufReader<std::process::ChildStdout>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `dlock rail-stub` on a free loopback port with `extra` flags; returns it and its address.
fn rail_stub(extra: &[&str]) -> (Running, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_dlock"))
        .args(["rail-stub", "--listen", "127.0.0.1:0", "--seed", "1"])
        .args(extra)
        .env_remove("DLOCK_CONFIG")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn dlock");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let read = stdout.read_line(&mut line);
    let running = Running { child, _stdout: stdout };
    read.expect("read");
    let addr = line.trim().rsplit(' ').next().unwrap_or_default().to_owned();
    assert!(line.contains("listening on"), "dlock rail-stub did not start: {line:?}");
    (running, addr)
}

/// Sends one request with an `x-pad` header of `pad` bytes; returns the raw answer.
fn request_with_header_of(addr: &str, pad: usize) -> String {
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    let req =
        format!("GET /health/live HTTP/1.1\r\nhost: a\r\nx-pad: {}\r\nconnection: close\r\n\r\n", "p".repeat(pad));
    s.write_all(req.as_bytes()).expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).expect("the server answers and closes");
    String::from_utf8_lossy(&out).into_owned()
}

#[test]
fn the_configured_header_limit_is_enforced_with_the_envelope() {
    let (_stub, addr) = rail_stub(&["--http-header-bytes-max", "2048"]);
    let under = request_with_header_of(&addr, 1_500);
    assert!(under.starts_with("HTTP/1.1 200"), "{under}");
    let over = request_with_header_of(&addr, 3_000);
    assert!(over.starts_with("HTTP/1.1 431"), "{over}");
    assert!(over.to_ascii_lowercase().contains("content-type: application/json; charset=utf-8"), "{over}");
    let body = over.split("\r\n\r\n").nth(1).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(body).expect("envelope");
    assert_eq!((v["code"].as_str(), v["retrySafe"].as_bool()), (Some("HEADERS_TOO_LARGE"), Some(false)), "{v}");
    assert_eq!(v["traceId"].as_str().map(str::len), Some(32), "{v}");

    // The default (16 384 bytes) lets the same 3 000-byte header through.
    let (_stub, addr) = rail_stub(&[]);
    let default = request_with_header_of(&addr, 3_000);
    assert!(default.starts_with("HTTP/1.1 200"), "{default}");
}

#[test]
fn a_header_limit_outside_its_range_refuses_to_start() {
    for bad in ["10", "1000000"] {
        let out = Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(["rail-stub", "--listen", "127.0.0.1:0", "--http-header-bytes-max", bad])
            .env_remove("DLOCK_CONFIG")
            .output()
            .expect("run dlock");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains("http.header-bytes-max must be 1024 to 65536 bytes"), "{err}");
    }
}
