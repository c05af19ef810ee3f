//! A headless Chromium driven through the DevTools protocol (CDP), for the console's
//! browser test: Debian's `chromium` (which `scripts/test.sh` installs) started on a fresh
//! profile with its DevTools endpoint on a loopback port of its own choosing, one page per
//! [`Browser::page`], each a WebSocket to that page's target.
//!
//! Only what a test needs: navigate, evaluate an expression in the page and read its value,
//! poll an expression until it holds (with a deadline), set the viewport, take a
//! screenshot. Evaluation runs as DevTools' own, which the page's Content-Security-Policy
//! does not govern; the page's own scripts stay under it.
//!
//! Invariants: every wait is bounded ([`START_MS_MAX`], [`CALL_MS_MAX`], the deadline a
//! caller gives [`Page::wait_for`]); the browser process is killed and reaped when the
//! [`Browser`] is dropped, and its profile directory removed with it; events the page sends
//! between answers are read and dropped, at most [`EVENTS_PER_CALL_MAX`] per call.
#![allow(
    clippy::disallowed_methods,
    reason = "a test harness outside the services, never built in the simulation (`#[cfg(not(madsim))] pub mod browser`): it drives a browser over real sockets and bounds its own waits with the host's clock (the seam binds service code)"
)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::stream::MaybeTlsStream;
use tungstenite::{Message, WebSocket};

use crate::TempDir;

/// Longest Chromium may take to open its DevTools endpoint.
pub const START_MS_MAX: u64 = 30_000;
/// Longest one DevTools call may take to be answered.
pub const CALL_MS_MAX: u64 = 30_000;
/// Events read past while waiting for one answer, at most.
pub const EVENTS_PER_CALL_MAX: usize = 100_000;
/// Bound on the answer to `PUT /json/new`.
pub const JSON_NEW_BYTES_MAX: usize = 64 * 1024;
/// How often [`Page::wait_for`] evaluates its expression again.
pub const POLL_MS: u64 = 100;

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(name)).find(|p| p.is_file())
}

/// The chromium binary for `test` (`DLOCK_CHROMIUM`, else `chromium` on the `PATH`), or
/// `None` when the test may skip: chromium is missing and `DLOCK_SKIP_BROWSER=1` (it says
/// so on stderr). Missing without that knob, the test fails: `scripts/test.sh` installs it.
pub fn chromium(test: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("DLOCK_CHROMIUM") {
        return Some(PathBuf::from(p));
    }
    match find_on_path("chromium") {
        Some(p) => Some(p),
        None if std::env::var("DLOCK_SKIP_BROWSER").as_deref() == Ok("1") => {
            eprintln!("{test} SKIPPED: chromium is not installed and DLOCK_SKIP_BROWSER=1");
            None
        }
        None => panic!(
            "chromium is not installed: {test} needs Debian's `chromium` (scripts/test.sh installs it: \
             apt-get install chromium); set DLOCK_SKIP_BROWSER=1 to skip it"
        ),
    }
}

/// A running headless Chromium (module doc).
pub struct Browser {
    child: Child,
    port: u16,
    _profile: TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Browser {
    /// Starts `bin` ([`chromium`]) headless on a fresh profile, its window `width` × `height`.
    pub fn launch(bin: &Path, width: u32, height: u32) -> Result<Browser, String> {
        let profile = TempDir::new("chromium");
        let child = Command::new(bin)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"])
            .args(["--disable-extensions", "--disable-sync", "--hide-scrollbars", "--mute-audio"])
            .arg(format!("--user-data-dir={}", profile.0.display()))
            .args(["--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0"])
            .arg(format!("--window-size={width},{height}"))
            .arg("about:blank")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                format!("start chromium: {e} (is Debian's chromium installed? ./scripts/test.sh installs it)")
            })?;
        let mut browser = Browser { child, port: 0, _profile: profile };
        let file = browser._profile.0.join("DevToolsActivePort");
        let deadline = Instant::now() + Duration::from_millis(START_MS_MAX);
        loop {
            if let Some(port) = std::fs::read_to_string(&file).ok().and_then(|t| t.lines().next()?.parse().ok()) {
                browser.port = port;
                return Ok(browser);
            }
            if let Ok(Some(status)) = browser.child.try_wait() {
                return Err(format!("chromium exited before opening its DevTools endpoint: {status}"));
            }
            if Instant::now() > deadline {
                return Err(format!("chromium opened no DevTools endpoint within {START_MS_MAX} ms"));
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }

    /// A new page (tab) showing `about:blank`, and the connection that drives it.
    pub fn page(&self) -> Result<Page, String> {
        // `PUT /json/new` opens a target and answers its WebSocket URL.
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| format!("DevTools endpoint: {e}"))?;
        s.set_read_timeout(Some(Duration::from_millis(CALL_MS_MAX))).map_err(|e| e.to_string())?;
        let req =
            format!("PUT /json/new?about:blank HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nConnection: close\r\n\r\n", self.port);
        s.write_all(req.as_bytes()).map_err(|e| e.to_string())?;
        // Read the head, then the body its Content-Length names (the endpoint may keep the
        // connection open).
        let mut raw: Vec<u8> = Vec::new();
        let mut buf = [0u8; 4096];
        let body = loop {
            let n = s.read(&mut buf).map_err(|e| format!("DevTools /json/new: {e}"))?;
            raw.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&raw).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len = head
                    .lines()
                    .find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().to_owned()))
                    .and_then(|v| v.parse::<usize>().ok());
                if n == 0 || len.is_some_and(|l| body.len() >= l) {
                    break body.to_owned();
                }
            } else if n == 0 {
                return Err(format!("DevTools /json/new answered {text:?}"));
            }
            if raw.len() > JSON_NEW_BYTES_MAX {
                return Err(format!("DevTools /json/new answered more than {JSON_NEW_BYTES_MAX} bytes"));
            }
        };
        let raw = body.clone();
        let body = body.as_str();
        let target: Value =
            serde_json::from_str(body).map_err(|e| format!("DevTools /json/new answered {raw:?}: {e}"))?;
        let url = target
            .get("webSocketDebuggerUrl")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("no webSocketDebuggerUrl in {target}"))?;
        let (ws, _) = tungstenite::connect(url).map_err(|e| format!("connect {url}: {e}"))?;
        if let MaybeTlsStream::Plain(tcp) = ws.get_ref() {
            tcp.set_read_timeout(Some(Duration::from_millis(CALL_MS_MAX))).map_err(|e| e.to_string())?;
        }
        let mut page = Page { ws, next_id: 0 };
        page.call("Page.enable", json!({}))?;
        page.call("Runtime.enable", json!({}))?;
        Ok(page)
    }
}

/// One page of a [`Browser`].
pub struct Page {
    ws: WebSocket<MaybeTlsStream<TcpStream>>,
    next_id: u64,
}

impl Page {
    /// Calls DevTools method `method` with `params`; its `result`.
    pub fn call(&mut self, method: &str, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let id = self.next_id;
        let msg = json!({ "id": id, "method": method, "params": params }).to_string();
        self.ws.send(Message::text(msg)).map_err(|e| format!("{method}: {e}"))?;
        for _ in 0..EVENTS_PER_CALL_MAX {
            let text = match self.ws.read().map_err(|e| format!("{method}: {e}"))? {
                Message::Text(t) => t.to_string(),
                Message::Binary(b) => String::from_utf8_lossy(&b).into_owned(),
                _ => continue,
            };
            let v: Value = serde_json::from_str(&text).map_err(|e| format!("{method}: {e}"))?;
            if v.get("id").and_then(Value::as_u64) != Some(id) {
                continue;
            }
            if let Some(err) = v.get("error") {
                return Err(format!("{method}: {err}"));
            }
            return Ok(v.get("result").cloned().unwrap_or(Value::Null));
        }
        Err(format!("{method}: no answer among {EVENTS_PER_CALL_MAX} messages"))
    }

    /// The value of `expression` evaluated in the page (a promise is awaited); an exception
    /// thrown is an error carrying its text.
    pub fn eval(&mut self, expression: &str) -> Result<Value, String> {
        let r = self.call(
            "Runtime.evaluate",
            json!({ "expression": expression, "returnByValue": true, "awaitPromise": true }),
        )?;
        if let Some(ex) = r.get("exceptionDetails") {
            let text = ex.pointer("/exception/description").and_then(Value::as_str).unwrap_or_default();
            return Err(format!("{expression}: {text} {ex}"));
        }
        Ok(r.pointer("/result/value").cloned().unwrap_or(Value::Null))
    }

    /// Polls `expression` every [`POLL_MS`] until it is truthy (not null, false, 0 or ""),
    /// and answers its value; an error once `deadline_ms` have passed.
    pub fn wait_for(&mut self, expression: &str, deadline_ms: u64) -> Result<Value, String> {
        let deadline = Instant::now() + Duration::from_millis(deadline_ms);
        loop {
            // A navigation in flight may destroy the context an evaluation ran in: try again.
            let last = match self.eval(expression) {
                Ok(v) if truthy(&v) => return Ok(v),
                Ok(v) => v,
                Err(e) => Value::String(e),
            };
            if Instant::now() > deadline {
                return Err(format!("{expression} did not hold within {deadline_ms} ms (last: {last})"));
            }
            std::thread::sleep(Duration::from_millis(POLL_MS));
        }
    }

    /// Navigates to `url` and waits until its document has loaded.
    pub fn goto(&mut self, url: &str) -> Result<(), String> {
        let r = self.call("Page.navigate", json!({ "url": url }))?;
        if let Some(e) = r.get("errorText").and_then(Value::as_str) {
            return Err(format!("navigate {url}: {e}"));
        }
        self.loaded(&format!("location.href === {}", json!(url)))
    }

    /// Waits until the document that `condition` recognises has loaded (after a form
    /// submission, say).
    pub fn loaded(&mut self, condition: &str) -> Result<(), String> {
        self.wait_for(&format!("({condition}) && document.readyState === 'complete'"), CALL_MS_MAX).map(|_| ())
    }

    /// The page's viewport: `width` × `height` CSS px, as a phone when `mobile`.
    pub fn viewport(&mut self, width: u32, height: u32, mobile: bool) -> Result<(), String> {
        let scale = if mobile { 3 } else { 1 };
        self.call(
            "Emulation.setDeviceMetricsOverride",
            json!({ "width": width, "height": height, "deviceScaleFactor": scale, "mobile": mobile }),
        )
        .map(|_| ())
    }

    /// A PNG of the page as it is now, written to `path`.
    pub fn screenshot(&mut self, path: &Path) -> Result<(), String> {
        use base64::Engine as _;
        let r = self.call("Page.captureScreenshot", json!({ "format": "png", "captureBeyondViewport": false }))?;
        let data = r.get("data").and_then(Value::as_str).ok_or("no screenshot data")?;
        let png = base64::engine::general_purpose::STANDARD.decode(data).map_err(|e| e.to_string())?;
        std::fs::write(path, png).map_err(|e| format!("write {}: {e}", path.display()))
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|f| f != 0.0),
        Value::String(s) => !s.is_empty(),
        _ => true,
    }
}
