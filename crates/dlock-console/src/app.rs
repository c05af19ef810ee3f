//! The console's HTTP surface: the pages, the login and logout, the two actions (revoke a
//! lock; resolve a quarantined payout), the assets and `/live`.
//!
//! Every request passes, outermost first: the security headers ([`security_headers`]: the
//! CSP, `nosniff`, `same-origin` referrers, and `no-store` on everything but the assets), then
//! `dlock_http::envelope` (trace ids; a non-2xx answer without a page of its own becomes
//! the C3 envelope). A page answers HTML, and an HTML error page is marked
//! `dlock_http::Prerendered` so it passes through as HTML.
//!
//! A POST is checked in this order, each failure refused before the next check runs:
//! 1. an `Origin` header, when present, must be this console's own origin (else `403`);
//! 2. a live session (else `303` to `/login`; not for `/login` itself);
//! 3. the session's CSRF token in the form's `csrf` field (else `403`);
//! 4. the role the action needs: revoke and resolve need `operator` (else `403`), whatever
//!    the form;
//! 5. the form's values (else the page again with the problem, `400`).
//!
//! Every page re-authenticates the session's token against the live credential set (so a
//! credential removed from the file, once its rotation overlap ends, ends its sessions) and
//! takes the role from it.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::Response;
use axum::routing::{get, post};
use dlock_contract::auth::{Role, Secret, TOKEN_BYTES_MAX, TOKEN_BYTES_MIN};
use dlock_contract::payout::PayoutState;
use dlock_contract::IdempotencyKey;
use dlock_http::auth::Authenticator;
use dlock_rt::http::BaseUrl;
use dlock_rt::{Clock, Duration};
use futures::StreamExt;
use serde_json::Value;

use crate::config::ConsoleConfig;
use crate::html::{layout, pct, AssetUrls, Page, Viewer};
use crate::pages::{
    self, EventFilterForm, Fetched, PayoutFilter, ResolveForm, ResolveResult, RevokeResult, StateCount,
};
use crate::session::{csrf_matches, SessionView, Sessions, SessionsFull};
use crate::upstream::{self, UpstreamError};

/// The session cookie's name.
pub const SESSION_COOKIE: &str = "dlock_console_session";
/// The request header that asks for a page's main region only (the live refresh).
pub const FRAGMENT_HEADER: &str = "x-console-fragment";
/// The `Referrer-Policy`: a referrer only to the console itself, never to another site. Not
/// `no-referrer`: under it a browser sends `Origin: null` on the console's own form posts,
/// which the origin check (rightly) refuses, so nobody could sign in.
pub const REFERRER_POLICY: &str = "same-origin";
/// The Content-Security-Policy of every answer.
pub const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                       connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";
/// The `Content-Security-Policy` of an incident timeline (`/incidents/timeline`): the
/// timeline is one self-contained HTML file with its own inline style and script
/// (`dlock-timeline`), so it is served as a sandbox: an opaque origin that cannot read or
/// send the console's cookies, reach the network, submit a form or be framed.
pub const TIMELINE_CSP: &str = "sandbox allow-scripts; default-src 'none'; script-src 'unsafe-inline'; \
                                style-src 'unsafe-inline'; img-src data:; form-action 'none'; \
                                frame-ancestors 'none'; base-uri 'none'";
/// The route of an incident timeline.
pub const TIMELINE_PATH: &str = "/incidents/timeline";
/// `Cache-Control` of the assets (their URLs carry a hash of their content).
pub const ASSET_CACHE_CONTROL: &str = "public, max-age=31536000, immutable";
/// Largest form body accepted, bytes.
pub const FORM_BYTES_MAX: usize = 16 * 1024;
/// Most fields one form or query string may carry.
pub const FORM_FIELDS_MAX: usize = 16;
/// P1 pages read per state for the overview's counts (beyond them the count shows "≥ N").
pub const COUNT_PAGES_MAX: usize = 4;
/// P1 `limit` of the overview's counting pages (P1's largest).
pub const COUNT_PAGE_LIMIT: usize = 500;
/// P1 `limit` of the payouts page.
pub const PAYOUTS_PAGE_LIMIT: usize = 50;
/// Longest P1 cursor passed on (C5: a cursor is at most 512 characters).
pub const CURSOR_CHARS_MAX: usize = 512;
/// P1 pages of RAIL_AMBIGUOUS payouts the quarantine reads.
pub const QUARANTINE_PAGES_MAX: usize = 2;
/// P1 `limit` of the quarantine's pages.
pub const QUARANTINE_PAGE_LIMIT: usize = 50;
/// P4 reads the quarantine runs at once.
pub const QUARANTINE_FETCH_CONCURRENCY_MAX: usize = 8;
/// Events shown on the overview and fetched per source for it.
pub const OVERVIEW_EVENTS_MAX: usize = 20;
/// Events fetched per source for a payout's story and for the events page
/// (C3-extensions E-20's `RECENT_EVENTS_LIMIT_MAX`).
pub const STORY_EVENTS_MAX: usize = 200;
/// Longest value of an event filter (C3-extensions E-20's `FILTER_VALUE_CHARS_MAX`).
pub const FILTER_VALUE_CHARS_MAX: usize = 128;
/// Shortest and longest revoke reason (L8), characters.
pub const REASON_CHARS_MIN: usize = 8;
pub const REASON_CHARS_MAX: usize = 512;

const CSS: &str = include_str!("../assets/console.css");
const JS: &str = include_str!("../assets/console.js");

fn fnv(s: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in s.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The console's shared state.
pub struct Console {
    pub cfg: ConsoleConfig,
    pub sessions: Sessions,
    /// None: `auth.enabled=false` (unsafe-test): any token signs in as operator.
    pub auth: Option<Arc<Authenticator>>,
    pub clock: Clock,
    /// Cookies carry `Secure` (the console serves TLS).
    pub secure: bool,
    /// `/live` streams open now (bounded by `crate::live::LIVE_STREAMS_MAX`).
    pub live_open: Arc<AtomicUsize>,
    assets: AssetUrls,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").field("sessions", &self.sessions.len()).finish_non_exhaustive()
    }
}

impl Console {
    pub fn new(cfg: ConsoleConfig, auth: Option<Arc<Authenticator>>, clock: Clock, secure: bool) -> Console {
        let ttl = Duration::from_millis(cfg.session_ttl_ms);
        let assets = AssetUrls {
            css: format!("/assets/console.css?v={}", fnv(CSS)),
            js: format!("/assets/console.js?v={}", fnv(JS)),
        };
        Console { cfg, sessions: Sessions::new(ttl), auth, clock, secure, live_open: Arc::default(), assets }
    }

    /// The role `token` signs in with, if it may sign in at all.
    fn role_of(&self, token: &str) -> Option<Role> {
        match &self.auth {
            Some(a) => a.authenticate(token.as_bytes()).map(|c| c.role),
            None => Some(Role::Operator),
        }
    }

    /// The request's live session (its id and view), re-authenticated.
    pub fn current(&self, headers: &HeaderMap) -> Option<(String, SessionView)> {
        let id = session_cookie(headers)?;
        self.session(&id).map(|view| (id, view))
    }

    /// Session `id`, if it is live and its token still signs in (else it is ended), with
    /// the role its token has now.
    pub fn session(&self, id: &str) -> Option<SessionView> {
        let mut view = self.sessions.get(id, self.clock.now())?;
        match self.role_of(view.token.expose()) {
            Some(role) if role != Role::Worker => {
                view.role = role;
                Some(view)
            }
            _ => {
                self.sessions.delete(id);
                None
            }
        }
    }

    fn cookie(&self, value: &str, max_age_s: u64) -> String {
        let secure = if self.secure { "; Secure" } else { "" };
        format!("{SESSION_COOKIE}={value}; HttpOnly; SameSite=Strict; Path=/; Max-Age={max_age_s}{secure}")
    }

    /// Whether a request's `Origin`, if it has one, is this console: `http://` or
    /// `https://` followed by exactly the request's `Host` (the scheme is not compared, so a
    /// console behind a TLS terminator still accepts its own pages' forms). `null`, another
    /// host or another port is refused.
    fn origin_ok(&self, headers: &HeaderMap) -> bool {
        let Some(origin) = headers.get(header::ORIGIN) else { return true };
        let host = headers.get(header::HOST).and_then(|h| h.to_str().ok());
        let authority = origin.to_str().ok().and_then(|o| o.strip_prefix("https://").or(o.strip_prefix("http://")));
        matches!((authority, host), (Some(a), Some(h)) if !h.is_empty() && a.eq_ignore_ascii_case(h))
    }

    /// The live feed `url` (`/live?source=…&<filter>`) from the page's watermark: the
    /// service's head `seq` read now, *before* the page reads its data, as `&after=SEQ`
    /// (C3-extensions E-20: a snapshot's cursor is its watermark). An event the page's data
    /// missed is then after the watermark, and the feed tells the page; started from the
    /// newest event it saw instead, the feed would take that event as its starting point
    /// and the page would never show it. Unchanged when the service cannot say.
    pub async fn from_watermark(&self, url: String, token: &Secret) -> String {
        let Some(q) = url.strip_prefix("/live?") else { return url };
        let (f, problem) = event_filter(&parse_form(q).unwrap_or_default());
        if problem.is_some() {
            return url;
        }
        let base = self.source_url(&f.source);
        let path = format!("/v1/events/recent?limit=1{}", filter_query(&f));
        match upstream::get(base, &path, token).await.ok().and_then(|v| v.get("seq").and_then(Value::as_i64)) {
            Some(seq) => format!("{url}&after={seq}"),
            None => url,
        }
    }

    /// The service an event filter's `source` names (`payment`, `proxy`, `lock`;
    /// [`event_filter`] refuses any other).
    pub(crate) fn source_url(&self, source: &str) -> &BaseUrl {
        match source {
            "proxy" => &self.cfg.proxy_url,
            "lock" => &self.cfg.lock_url,
            _ => &self.cfg.payment_url,
        }
    }

    fn page(&self, headers: &HeaderMap, status: StatusCode, page: Page, viewer: Option<&Viewer>) -> Response {
        let fragment = headers.get(FRAGMENT_HEADER).is_some_and(|v| v.as_bytes() == b"1");
        let body = if fragment { page.main } else { layout(&page, viewer, &self.assets) };
        html(status, body)
    }

    fn error_page(&self, headers: &HeaderMap, status: StatusCode, title: &str, message: &str) -> Response {
        let page = Page { title: title.to_owned(), nav: "", main: pages::error(title, message), live: None };
        self.page(headers, status, page, None)
    }
}

/// An HTML answer; a non-2xx one is marked final so the envelope middleware keeps it.
fn html(status: StatusCode, body: String) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    if !status.is_success() {
        r.extensions_mut().insert(dlock_http::Prerendered);
    }
    r
}

fn redirect(location: &'static str) -> Response {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = StatusCode::SEE_OTHER;
    r.headers_mut().insert(header::LOCATION, HeaderValue::from_static(location));
    r
}

/// The `dlock_console_session` cookie's value, if the request carries one.
pub fn session_cookie(headers: &HeaderMap) -> Option<String> {
    headers.get_all(header::COOKIE).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(';')).find_map(|c| {
        let (name, value) = c.trim().split_once('=')?;
        (name == SESSION_COOKIE && !value.is_empty()).then(|| value.to_owned())
    })
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => match (hex_val(bytes[i + 1]), hex_val(bytes[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h * 16 + l);
                    i += 2;
                }
                _ => out.push(b'%'),
            },
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Decodes an `application/x-www-form-urlencoded` body or query string into its fields
/// (the first value of a repeated name wins). `None`: more than [`FORM_FIELDS_MAX`] fields.
pub fn parse_form(raw: &str) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for (n, pair) in raw.split('&').filter(|p| !p.is_empty()).enumerate() {
        if n >= FORM_FIELDS_MAX {
            return None;
        }
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        out.entry(decode(k)).or_insert_with(|| decode(v));
    }
    Some(out)
}

fn query_of(q: Option<String>) -> BTreeMap<String, String> {
    parse_form(q.as_deref().unwrap_or("")).unwrap_or_default()
}

fn nonempty(m: &BTreeMap<String, String>, k: &str) -> Option<String> {
    m.get(k).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty())
}

/// The console's router (not yet wrapped in its layers: see [`router`]).
fn routes(console: Arc<Console>) -> axum::Router {
    axum::Router::new()
        .route("/login", get(login_page).post(login_submit))
        .route("/logout", post(logout))
        .route("/", get(overview))
        .route("/payouts", get(payouts))
        .route("/payouts/{id}", get(payout))
        .route("/quarantine", get(quarantine))
        .route("/quarantine/resolve", post(resolve))
        .route("/locks", get(locks))
        .route("/locks/revoke", post(revoke))
        .route("/incidents", get(incidents))
        .route(TIMELINE_PATH, get(incident_timeline))
        .route("/events", get(events))
        .route("/live", get(crate::live::live))
        .route("/assets/console.css", get(|| async { asset("text/css; charset=utf-8", CSS) }))
        .route("/assets/console.js", get(|| async { asset("text/javascript; charset=utf-8", JS) }))
        .route("/health/live", get(|| async { dlock_http::json(StatusCode::OK, &serde_json::json!({"status": "ok"})) }))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(FORM_BYTES_MAX))
        .with_state(console)
}

/// The console's whole HTTP surface: [`routes`] inside the envelope middleware, inside the
/// security headers.
pub fn router(console: Arc<Console>) -> axum::Router {
    routes(console)
        .layer(axum::middleware::from_fn(dlock_http::envelope))
        .layer(axum::middleware::from_fn(security_headers))
}

/// Adds the security headers to every answer, and `no-store` to every answer but an asset.
pub async fn security_headers(req: Request, next: Next) -> Response {
    let asset = req.uri().path().starts_with("/assets/");
    let csp = if req.uri().path() == TIMELINE_PATH { TIMELINE_CSP } else { CSP };
    let mut resp = next.run(req).await;
    let h = resp.headers_mut();
    h.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(csp));
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static(REFERRER_POLICY));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    let cache = if asset && resp.status().is_success() { ASSET_CACHE_CONTROL } else { "no-store" };
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    resp
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut r = Response::new(Body::from(body));
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

async fn not_found(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    c.error_page(&headers, StatusCode::NOT_FOUND, "Not found", "There is no such page.")
}

fn forbidden(c: &Console, headers: &HeaderMap, why: &str) -> Response {
    c.error_page(headers, StatusCode::FORBIDDEN, "Refused", why)
}

/// Checks 1–3 of a POST (see the module doc): the session and the form, or the answer.
fn guard_post(
    c: &Console,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<(String, SessionView, BTreeMap<String, String>), Box<Response>> {
    if !c.origin_ok(headers) {
        return Err(Box::new(forbidden(c, headers, "This form was not sent from the console's own pages.")));
    }
    let Some((id, session)) = c.current(headers) else { return Err(Box::new(redirect("/login"))) };
    let form = std::str::from_utf8(body).ok().and_then(parse_form).unwrap_or_default();
    if !csrf_matches(&session, form.get("csrf").map(String::as_str)) {
        return Err(Box::new(forbidden(
            c,
            headers,
            "The form's CSRF token is missing or wrong. Reload the page and try again.",
        )));
    }
    Ok((id, session, form))
}

fn viewer(s: &SessionView) -> Viewer {
    Viewer { role: s.role, csrf: s.csrf.clone() }
}

async fn login_page(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    if c.current(&headers).is_some() {
        return redirect("/");
    }
    let page = Page { title: "Sign in".into(), nav: "", main: pages::login(None), live: None };
    c.page(&headers, StatusCode::OK, page, None)
}

async fn login_submit(State(c): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    if !c.origin_ok(&headers) {
        return forbidden(&c, &headers, "This form was not sent from the console's own pages.");
    }
    let form = std::str::from_utf8(&body).ok().and_then(parse_form).unwrap_or_default();
    let token = form.get("token").map(|t| t.trim().to_owned()).unwrap_or_default();
    let refuse = |status: StatusCode, why: &str| {
        let page = Page { title: "Sign in".into(), nav: "", main: pages::login(Some(why)), live: None };
        c.page(&headers, status, page, None)
    };
    let plausible = (TOKEN_BYTES_MIN..=TOKEN_BYTES_MAX).contains(&token.len());
    let role = if plausible { c.role_of(&token) } else { None };
    let role = match role {
        None => {
            tracing::info!("console_login_refused");
            return refuse(StatusCode::UNAUTHORIZED, "That token is not a valid credential here.");
        }
        Some(Role::Worker) => {
            tracing::info!(role = "worker", "console_login_refused");
            return refuse(
                StatusCode::FORBIDDEN,
                "A worker credential cannot sign in to the console: use an operator or a reader token.",
            );
        }
        Some(r) => r,
    };
    match c.sessions.create(Secret::new(token), role, c.clock.now()) {
        Err(SessionsFull) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "The console holds as many sessions as it may. Try again when one has ended.",
        ),
        Ok((id, _csrf)) => {
            tracing::info!(role = role.as_str(), "console_login");
            let mut r = redirect("/");
            let max_age = c.sessions.ttl().as_secs();
            if let Ok(v) = HeaderValue::from_str(&c.cookie(&id, max_age)) {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
    }
}

async fn logout(State(c): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    let (id, _, _) = match guard_post(&c, &headers, &body) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    c.sessions.delete(&id);
    tracing::info!("console_logout");
    let mut r = redirect("/login");
    if let Ok(v) = HeaderValue::from_str(&c.cookie("", 0)) {
        r.headers_mut().insert(header::SET_COOKIE, v);
    }
    r
}

fn shown(e: UpstreamError) -> String {
    e.to_string()
}

/// The events of `/v1/events/recent?query` at `base`.
async fn recent(base: &BaseUrl, query: &str, token: &Secret) -> Fetched<Vec<Value>> {
    let v = upstream::get(base, &format!("/v1/events/recent?{query}"), token).await.map_err(shown)?;
    Ok(v.get("events").and_then(Value::as_array).cloned().unwrap_or_default())
}

/// Both sources' events, deduplicated by `eventId`, in `seq` order, the newest `keep`. A
/// source that could not be read is left out, unless both could not.
fn merge(a: Fetched<Vec<Value>>, b: Fetched<Vec<Value>>, keep: usize) -> Fetched<Vec<Value>> {
    let (a, b) = match (a, b) {
        (Err(x), Err(y)) => return Err(format!("{x}; {y}")),
        (a, b) => (a.unwrap_or_default(), b.unwrap_or_default()),
    };
    let mut by_id: BTreeMap<(i64, String), Value> = BTreeMap::new();
    for e in a.into_iter().chain(b) {
        let seq = e.get("seq").and_then(Value::as_i64).unwrap_or(i64::MIN);
        let id = e.get("eventId").map(|v| v.to_string()).unwrap_or_default();
        by_id.entry((seq, id)).or_insert(e);
    }
    let all: Vec<Value> = by_id.into_values().collect();
    let skip = all.len().saturating_sub(keep);
    Ok(all.into_iter().skip(skip).collect())
}

async fn count_state(base: &BaseUrl, state: PayoutState, token: &Secret) -> StateCount {
    let mut total = 0usize;
    let mut cursor: Option<String> = None;
    let mut oldest: Option<String> = None;
    for _ in 0..COUNT_PAGES_MAX {
        let mut q = format!("/v1/payouts?state={}&limit={COUNT_PAGE_LIMIT}", state.as_str());
        if let Some(c) = &cursor {
            q.push_str(&format!("&cursor={}", pct(c)));
        }
        match upstream::get(base, &q, token).await {
            Err(e) => return StateCount { state, count: Err(shown(e)), oldest },
            Ok(v) => {
                let items = v.get("items").and_then(Value::as_array);
                if oldest.is_none() {
                    let first = items.and_then(|i| i.first()).and_then(|p| p.get("createdAt"));
                    oldest = first.and_then(Value::as_str).map(str::to_owned);
                }
                total += items.map_or(0, Vec::len);
                cursor = v.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
                if cursor.is_none() {
                    return StateCount { state, count: Ok((total, false)), oldest };
                }
            }
        }
    }
    StateCount { state, count: Ok((total, true)), oldest }
}

async fn overview(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let Some((_, s)) = c.current(&headers) else { return redirect("/login") };
    let pay = &c.cfg.payment_url;
    let live = c.from_watermark("/live?source=payment".into(), &s.token).await;
    let counts = futures::future::join_all(PayoutState::ALL.map(|st| count_state(pay, st, &s.token))).await;
    // Up to the page's bound, for the last hour's count; the table shows the newest.
    let fenced_q = format!("kind=fence.refused&limit={}", dlock_contract::stream::RECENT_EVENTS_LIMIT_MAX);
    let fenced = recent(pay, &fenced_q, &s.token).await;
    let q = format!("limit={OVERVIEW_EVENTS_MAX}");
    let (a, b) = futures::join!(recent(pay, &q, &s.token), recent(&c.cfg.proxy_url, &q, &s.token));
    let fenced_full = fenced.as_ref().is_ok_and(|f| f.len() >= dlock_contract::stream::RECENT_EVENTS_LIMIT_MAX);
    let now = pages::Now(c.clock.wall());
    let main = pages::overview(now, &counts, &fenced, fenced_full, &merge(a, b, OVERVIEW_EVENTS_MAX));
    let page = Page { title: "Overview".into(), nav: "/", main, live: Some(live) };
    c.page(&headers, StatusCode::OK, page, Some(&viewer(&s)))
}

async fn payouts(State(c): State<Arc<Console>>, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    let Some((_, s)) = c.current(&headers) else { return redirect("/login") };
    let q = query_of(q);
    let mut problem = None;
    let state = match nonempty(&q, "state") {
        None => Some(PayoutState::Pending),
        Some(raw) => {
            let st = PayoutState::parse(&raw);
            if st.is_none() {
                problem = Some("Unknown payout state.".to_owned());
            }
            st
        }
    };
    let account = nonempty(&q, "account");
    if account.as_deref().is_some_and(|a| !dlock_contract::rail::is_account_id(a)) {
        problem = Some("An account id is 1 to 64 characters of [a-zA-Z0-9:._-].".to_owned());
    }
    let cursor = nonempty(&q, "cursor");
    if cursor.as_deref().is_some_and(|c| c.chars().count() > CURSOR_CHARS_MAX) {
        problem = Some(format!("A cursor is at most {CURSOR_CHARS_MAX} characters."));
    }
    let filter = PayoutFilter { state, account: account.clone(), cursor: cursor.clone() };
    let live = match &account {
        Some(a) => format!("/live?source=payment&account={}", pct(a)),
        None => "/live?source=payment".to_owned(),
    };
    let live = c.from_watermark(live, &s.token).await;
    let fetched = match (&problem, state) {
        (None, Some(st)) => {
            let mut path = format!("/v1/payouts?state={}&limit={PAYOUTS_PAGE_LIMIT}", st.as_str());
            if let Some(a) = &account {
                path.push_str(&format!("&accountId={}", pct(a)));
            }
            if let Some(cur) = &cursor {
                path.push_str(&format!("&cursor={}", pct(cur)));
            }
            upstream::get(&c.cfg.payment_url, &path, &s.token).await.map_err(shown)
        }
        _ => Err(String::new()),
    };
    let status = if problem.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let main = pages::payouts(&filter, &fetched, problem.as_deref());
    let page = Page { title: "Payouts".into(), nav: "/payouts", main, live: Some(live) };
    c.page(&headers, status, page, Some(&viewer(&s)))
}

async fn payout(State(c): State<Arc<Console>>, headers: HeaderMap, Path(id): Path<String>) -> Response {
    let Some((_, s)) = c.current(&headers) else { return redirect("/login") };
    let Ok(uuid) = uuid::Uuid::parse_str(&id) else {
        return c.error_page(&headers, StatusCode::NOT_FOUND, "Not found", "A payout id is a UUID.");
    };
    let id = uuid.to_string();
    let live = c.from_watermark(format!("/live?source=payment&payout={id}"), &s.token).await;
    let p =
        upstream::get(&c.cfg.payment_url, &format!("/v1/payouts/{id}"), &s.token).await.map_err(|e| match e.status() {
            Some(404) => "no such payout".to_owned(),
            _ => shown(e),
        });
    let q = format!("payout={id}&limit={STORY_EVENTS_MAX}");
    let (a, b) = futures::join!(recent(&c.cfg.payment_url, &q, &s.token), recent(&c.cfg.proxy_url, &q, &s.token));
    let mut story = merge(a, b, STORY_EVENTS_MAX);
    // The account's fence events carry no payout id: those within the payout's life (and
    // every refusal naming it) join its story.
    let account = p.as_ref().ok().and_then(|v| v.get("accountId")).and_then(Value::as_str).map(str::to_owned);
    if let (Some(acct), Ok(own)) = (account, story.as_mut()) {
        let q = format!("account={}&kind=fence.raised,fence.refused&limit={STORY_EVENTS_MAX}", pct(&acct));
        if let Ok(fences) = recent(&c.cfg.payment_url, &q, &s.token).await {
            let seqs: Vec<i64> = own.iter().filter_map(|e| e.get("seq").and_then(Value::as_i64)).collect();
            let (lo, hi) = (seqs.iter().min().copied(), seqs.iter().max().copied());
            let joins = |e: &Value| {
                let names_it = e
                    .pointer("/data/payoutIds")
                    .and_then(Value::as_array)
                    .is_some_and(|ids| ids.iter().any(|x| x.as_str() == Some(id.as_str())));
                let seq = e.get("seq").and_then(Value::as_i64);
                let within = matches!((lo, hi, seq), (Some(l), Some(h), Some(s)) if l <= s && s <= h);
                names_it || (within && e.get("kind").and_then(Value::as_str) == Some("fence.raised"))
            };
            let extra: Vec<Value> = fences.into_iter().filter(joins).collect();
            story = merge(Ok(std::mem::take(own)), Ok(extra), STORY_EVENTS_MAX);
        }
    }
    let main = pages::payout(&id, &p, &story);
    let page = Page { title: format!("Payout {id}"), nav: "/payouts", main, live: Some(live) };
    c.page(&headers, StatusCode::OK, page, Some(&viewer(&s)))
}

async fn quarantined(base: &BaseUrl, token: &Secret) -> Fetched<(Vec<Fetched<Value>>, bool)> {
    let mut ids: Vec<String> = Vec::new();
    let mut cursor: Option<String> = None;
    let mut more = false;
    for page in 0..QUARANTINE_PAGES_MAX {
        let mut q = format!("/v1/payouts?state=RAIL_AMBIGUOUS&limit={QUARANTINE_PAGE_LIMIT}");
        if let Some(c) = &cursor {
            q.push_str(&format!("&cursor={}", pct(c)));
        }
        let v = upstream::get(base, &q, token).await.map_err(shown)?;
        let items = v.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
        ids.extend(items.iter().filter_map(|p| p.get("payoutId").and_then(Value::as_str)).map(str::to_owned));
        cursor = v.get("nextCursor").and_then(Value::as_str).map(str::to_owned);
        if cursor.is_none() {
            break;
        }
        more = page + 1 == QUARANTINE_PAGES_MAX;
    }
    let details = futures::stream::iter(ids.into_iter().map(|id| async move {
        match uuid::Uuid::parse_str(&id) {
            Ok(u) => upstream::get(base, &format!("/v1/payouts/{u}"), token).await.map_err(shown),
            Err(_) => Err(format!("the payout id {id:?} is not a UUID")),
        }
    }))
    .buffered(QUARANTINE_FETCH_CONCURRENCY_MAX)
    .collect::<Vec<_>>()
    .await;
    Ok((details, more))
}

/// A fresh idempotency key for one rendered Resolve form (C3-extensions E-21): a repeated
/// submission of that form is one request to the payment-resource, answered once.
fn fresh_resolve_key() -> String {
    format!("console-resolve:{}", dlock_rt::rand::uuid_v4())
}

async fn quarantine(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let Some((_, s)) = c.current(&headers) else { return redirect("/login") };
    let v = viewer(&s);
    let live = c.from_watermark("/live?source=payment&kind=payout.state_changed".into(), &s.token).await;
    let main = pages::quarantine(&v, &quarantined(&c.cfg.payment_url, &s.token).await, None, &fresh_resolve_key);
    let page = Page { title: "Quarantine".into(), nav: "/quarantine", main, live: Some(live) };
    c.page(&headers, StatusCode::OK, page, Some(&v))
}

/// What an operator typed into a Resolve form (the reason trimmed, as a revoke's).
fn resolve_form(form: &BTreeMap<String, String>) -> ResolveForm {
    ResolveForm {
        payout: nonempty(form, "payout").unwrap_or_default(),
        resolved_as: nonempty(form, "resolved_as").unwrap_or_default(),
        reason: form.get("reason").map(|r| r.trim().to_owned()).unwrap_or_default(),
        rail_reference: nonempty(form, "rail_reference").unwrap_or_default(),
        operator: nonempty(form, "operator").unwrap_or_default(),
    }
}

/// The payout and the idempotency key of a Resolve form whose every field holds to the rules
/// of `dlock resolve` (`dlock_contract::resolution`), or why the console refuses it.
fn check_resolve(entered: &ResolveForm, raw_key: Option<&str>) -> Result<(uuid::Uuid, IdempotencyKey), String> {
    use dlock_contract::resolution::{parse_operator, parse_rail_reference, parse_reason, parse_resolved_as};
    let payout = uuid::Uuid::parse_str(&entered.payout)
        .map_err(|_| "the form names no payout (a payout id is a UUID); reload the page".to_owned())?;
    let key = IdempotencyKey::parse(raw_key.unwrap_or(""))
        .map_err(|_| "the form's idempotency key is missing or malformed; reload the page".to_owned())?;
    parse_resolved_as(&entered.resolved_as).map_err(|_| "choose the outcome: POSTED or FAILED".to_owned())?;
    parse_reason(&entered.reason)?;
    parse_rail_reference(&entered.rail_reference)?;
    parse_operator(&entered.operator).map_err(|e| format!("{e} (your name is sent as X-Owner-Id)"))?;
    Ok((payout, key))
}

/// Whether a write's failure leaves its outcome unknown: no answer, an answer that is not
/// the service's JSON, or a server error other than `NOT_READY` (which says nothing changed;
/// an `INTERNAL` says the commit's answer was lost).
fn outcome_unknown(e: &UpstreamError) -> bool {
    match e {
        UpstreamError::Unreachable(_) | UpstreamError::NotJson(_) => true,
        UpstreamError::Refused { status, code, .. } => *status >= 500 && code != "NOT_READY",
    }
}

async fn resolve(State(c): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    let (_, s, form) = match guard_post(&c, &headers, &body) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if s.role != Role::Operator {
        tracing::warn!(role = s.role.as_str(), "console_action_refused");
        return forbidden(&c, &headers, "Only an operator session may resolve a payout.");
    }
    let v = viewer(&s);
    let render = |result: &ResolveResult, list: Fetched<(Vec<Fetched<Value>>, bool)>, status: StatusCode| {
        let main = pages::quarantine(&v, &list, Some(result), &fresh_resolve_key);
        // A result page follows no feed: a refresh would fetch this POST's URL.
        let page = Page { title: "Quarantine".into(), nav: "/quarantine", main, live: None };
        c.page(&headers, status, page, Some(&v))
    };
    let entered = resolve_form(&form);
    let (payout, key) = match check_resolve(&entered, form.get("idempotency_key").map(String::as_str)) {
        Ok(x) => x,
        Err(why) => {
            let list = quarantined(&c.cfg.payment_url, &s.token).await;
            return render(&ResolveResult::Invalid { form: entered, why }, list, StatusCode::BAD_REQUEST);
        }
    };
    let body = serde_json::json!({
        "resolvedAs": entered.resolved_as, "reason": entered.reason, "railReference": entered.rail_reference,
    });
    let path = format!("/v1/payouts/{payout}/resolution");
    let sent = [
        (dlock_contract::HEADER_OWNER_ID, entered.operator.as_str()),
        (dlock_contract::HEADER_IDEMPOTENCY_KEY, key.as_str()),
    ];
    let id = payout.to_string();
    let result = match upstream::post(&c.cfg.payment_url, &path, &sent, &body, &s.token).await {
        Ok(answer) => {
            tracing::info!(payoutId = %id, operator = %entered.operator, "console_resolve_done");
            ResolveResult::Done(answer)
        }
        Err(e) if outcome_unknown(&e) => {
            tracing::info!(payoutId = %id, operator = %entered.operator, error = %e, "console_resolve_unknown");
            ResolveResult::Unknown { payout: id, why: shown(e) }
        }
        Err(e) => {
            tracing::info!(payoutId = %id, operator = %entered.operator, error = %e, "console_resolve_refused");
            let why = match &e {
                UpstreamError::Refused { code, message, .. } if !message.is_empty() => format!("{message} ({code})"),
                _ => shown(e),
            };
            ResolveResult::Refused { payout: id, why }
        }
    };
    let list = quarantined(&c.cfg.payment_url, &s.token).await;
    render(&result, list, StatusCode::OK)
}

async fn lock_info(c: &Console, key: &str, token: &Secret) -> Fetched<Option<Value>> {
    match upstream::get(&c.cfg.lock_url, &format!("/v1/locks/{}", pct(key)), token).await {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.status() == Some(404) => Ok(None),
        Err(e) => Err(shown(e)),
    }
}

/// One page of the keys the lock server holds (C3-extensions E-23), after the key `after`.
async fn held_keys(c: &Console, after: Option<&str>, token: &Secret) -> Fetched<Value> {
    let path = match after {
        Some(a) => format!("/v1/locks?after={}", pct(a)),
        None => "/v1/locks".to_owned(),
    };
    upstream::get(&c.cfg.lock_url, &path, token).await.map_err(shown)
}

async fn locks(State(c): State<Arc<Console>>, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    let Some((_, s)) = c.current(&headers) else { return redirect("/login") };
    let q = query_of(q);
    let key = nonempty(&q, "key");
    let v = viewer(&s);
    let (status, main, live) = match key.as_deref() {
        // No key: the keys the lock server holds (E-23), a page from the cursor `after`.
        None => match nonempty(&q, "after") {
            Some(a) if !dlock_contract::lock::is_lock_key(&a) => (
                StatusCode::BAD_REQUEST,
                pages::locks(
                    &v,
                    None,
                    None,
                    None,
                    Some("A page cursor is a lock key: 1 to 128 characters of [a-zA-Z0-9:._-]."),
                    None,
                ),
                None,
            ),
            after => {
                let held = held_keys(&c, after.as_deref(), &s.token).await;
                let main = pages::locks(&v, None, None, None, None, None) + &pages::held_keys(&held, after.is_some());
                (StatusCode::OK, main, None)
            }
        },
        Some(k) if !dlock_contract::lock::is_lock_key(k) => (
            StatusCode::BAD_REQUEST,
            pages::locks(&v, Some(k), None, None, Some("A lock key is 1 to 128 characters of [a-zA-Z0-9:._-]."), None),
            None,
        ),
        Some(k) => {
            // The key's feed on the lock server, from a watermark read before the page's data.
            let live = c.from_watermark(format!("/live?source=lock&lockKey={}", pct(k)), &s.token).await;
            let q = format!("lockKey={}&limit={STORY_EVENTS_MAX}", pct(k));
            let (info, history) = futures::join!(lock_info(&c, k, &s.token), recent(&c.cfg.lock_url, &q, &s.token));
            (StatusCode::OK, pages::locks(&v, Some(k), Some(&info), Some(&history), None, None), Some(live))
        }
    };
    let page = Page { title: "Locks".into(), nav: "/locks", main, live };
    c.page(&headers, status, page, Some(&v))
}

async fn revoke(State(c): State<Arc<Console>>, headers: HeaderMap, body: Bytes) -> Response {
    let (_, s, form) = match guard_post(&c, &headers, &body) {
        Ok(x) => x,
        Err(r) => return *r,
    };
    if s.role != Role::Operator {
        tracing::warn!(role = s.role.as_str(), "console_action_refused");
        return forbidden(&c, &headers, "Only an operator session may revoke a lock.");
    }
    let v = viewer(&s);
    let key = nonempty(&form, "key").unwrap_or_default();
    let operator = nonempty(&form, "operator").unwrap_or_default();
    let reason = form.get("reason").map(|r| r.trim().to_owned()).unwrap_or_default();
    let expected = nonempty(&form, "expected_token");
    let problem = if !dlock_contract::lock::is_lock_key(&key) {
        Some("A lock key is 1 to 128 characters of [a-zA-Z0-9:._-].".to_owned())
    } else if dlock_contract::OwnerId::parse(&operator).is_err() {
        Some("Your name is 1 to 64 visible ASCII characters (it is sent as X-Owner-Id).".to_owned())
    } else if !(REASON_CHARS_MIN..=REASON_CHARS_MAX).contains(&reason.chars().count()) {
        Some(format!("The reason is {REASON_CHARS_MIN} to {REASON_CHARS_MAX} characters."))
    } else if expected.as_deref().is_some_and(|t| t.parse::<i64>().map_or(true, |t| t < 1)) {
        Some("The expected token is a positive whole number.".to_owned())
    } else {
        None
    };
    let render = |main: String, status: StatusCode| {
        let page = Page { title: "Locks".into(), nav: "/locks", main, live: None };
        c.page(&headers, status, page, Some(&v))
    };
    if let Some(p) = problem {
        let k = dlock_contract::lock::is_lock_key(&key).then_some(key.as_str());
        return render(pages::locks(&v, k, None, None, Some(&p), None), StatusCode::BAD_REQUEST);
    }
    let mut body = serde_json::json!({ "operator": operator, "reason": reason });
    if let Some(t) = expected.as_deref().and_then(|t| t.parse::<i64>().ok()) {
        body["expectedToken"] = Value::from(t);
    }
    let path = format!("/v1/locks/{}/revoke", pct(&key));
    let owner = [(dlock_contract::HEADER_OWNER_ID, operator.as_str())];
    let result = match upstream::post(&c.cfg.lock_url, &path, &owner, &body, &s.token).await {
        Ok(v) => {
            tracing::info!(key = %key, operator = %operator, "console_revoke_done");
            RevokeResult::Done(v)
        }
        Err(e) => {
            tracing::info!(key = %key, operator = %operator, error = %e, "console_revoke_refused");
            let unknown = matches!(e, UpstreamError::Unreachable(_));
            let mut why = shown(e);
            if unknown {
                why.push_str(" — the revoke may or may not have happened: look the lock up again before anything else");
            }
            RevokeResult::Refused(why)
        }
    };
    let info = lock_info(&c, &key, &s.token).await;
    render(pages::locks(&v, Some(&key), Some(&info), None, None, Some(&result)), StatusCode::OK)
}

/// Checks an event filter value (C3-extensions E-20's bound).
pub fn filter_value_ok(v: &str) -> bool {
    v.chars().count() <= FILTER_VALUE_CHARS_MAX && v.chars().all(|c| c.is_ascii_graphic())
}

/// The query string of an event filter (source excluded), percent-encoded.
pub fn filter_query(f: &EventFilterForm) -> String {
    let mut q = String::new();
    for (k, v) in [("kind", &f.kind), ("account", &f.account), ("payout", &f.payout), ("lockKey", &f.lock_key)] {
        if !v.is_empty() {
            q.push_str(&format!("&{k}={}", pct(v)));
        }
    }
    q
}

/// The event filter of a query, or the problem with it.
pub fn event_filter(q: &BTreeMap<String, String>) -> (EventFilterForm, Option<String>) {
    let f = EventFilterForm {
        source: nonempty(q, "source").unwrap_or_else(|| "payment".to_owned()),
        kind: nonempty(q, "kind").unwrap_or_default(),
        account: nonempty(q, "account").unwrap_or_default(),
        payout: nonempty(q, "payout").unwrap_or_default(),
        lock_key: nonempty(q, "lockKey").unwrap_or_default(),
    };
    let problem = if !pages::EVENT_SOURCES.iter().any(|(v, _)| *v == f.source) {
        Some("The source is payment, proxy or lock.".to_owned())
    } else if !f.kind.is_empty() && !pages::EVENT_KINDS.contains(&f.kind.as_str()) {
        Some("Unknown event kind.".to_owned())
    } else if ![&f.account, &f.payout, &f.lock_key].iter().all(|v| filter_value_ok(v)) {
        Some(format!("A filter value is at most {FILTER_VALUE_CHARS_MAX} visible ASCII characters."))
    } else {
        None
    };
    (f, problem)
}

async fn incidents(State(c): State<Arc<Console>>, headers: HeaderMap) -> Response {
    let Some((_, s)) = c.current(&headers) else { return redirect("/login") };
    let live = c.from_watermark("/live?source=payment&kind=fence.refused".into(), &s.token).await;
    let q = format!("kind=fence.refused&limit={STORY_EVENTS_MAX}");
    let rail = format!("kind=rail.refused&limit={STORY_EVENTS_MAX}");
    let (a, b) = futures::join!(recent(&c.cfg.payment_url, &q, &s.token), recent(&c.cfg.proxy_url, &rail, &s.token));
    // The rail-proxy's refusals of a stale token only (not its duplicates).
    let b = b.map(|v| {
        v.into_iter().filter(|e| e.pointer("/data/outcome").and_then(Value::as_str) == Some("FENCED")).collect()
    });
    let main = pages::incidents(&merge(a, b, STORY_EVENTS_MAX));
    let page = Page { title: "Incidents".into(), nav: "/incidents", main, live: Some(live) };
    c.page(&headers, StatusCode::OK, page, Some(&viewer(&s)))
}

/// `/incidents/timeline?account=ACCT`: one account's incident timeline, drawn by
/// `dlock-timeline` from the recent events of its lock key (the lock server), its payouts
/// (the payment-resource) and its rail submissions (the rail-proxy), merged on the writers'
/// wall clocks ([`dlock_timeline::trace_from_events`]). All three must answer: a picture
/// with a service missing would show a story that did not happen.
async fn incident_timeline(State(c): State<Arc<Console>>, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    let Some((_, s)) = c.current(&headers) else { return redirect("/login") };
    let q = query_of(q);
    let Some(account) = nonempty(&q, "account").filter(|a| dlock_contract::rail::is_account_id(a)) else {
        return c.error_page(
            &headers,
            StatusCode::BAD_REQUEST,
            "Incident timeline",
            "Name an account: ?account=ACCOUNT_ID.",
        );
    };
    let limit = dlock_contract::stream::RECENT_EVENTS_LIMIT_MAX;
    let lock_q = format!("lockKey={}&limit={limit}", pct(&format!("payout:{account}")));
    let account_q = format!("account={}&limit={limit}", pct(&account));
    let (lock, pay, proxy) = futures::join!(
        recent(&c.cfg.lock_url, &lock_q, &s.token),
        recent(&c.cfg.payment_url, &account_q, &s.token),
        recent(&c.cfg.proxy_url, &account_q, &s.token)
    );
    let mut events = Vec::new();
    for (service, got) in [("lock server", lock), ("payment-resource", pay), ("rail-proxy", proxy)] {
        match got {
            Ok(v) => events.extend(v),
            Err(e) => {
                let why = format!("The {service}'s events could not be read ({e}); no partial picture is drawn.");
                return c.error_page(&headers, StatusCode::BAD_GATEWAY, "Incident timeline", &why);
            }
        }
    }
    let trace = dlock_timeline::trace_from_events(&format!("account {account}"), &events);
    match dlock_timeline::render_html(&trace) {
        Ok(page) => html(StatusCode::OK, page),
        Err(e) => c.error_page(&headers, StatusCode::INTERNAL_SERVER_ERROR, "Incident timeline", &e),
    }
}

async fn events(State(c): State<Arc<Console>>, headers: HeaderMap, RawQuery(q): RawQuery) -> Response {
    let Some((_, s)) = c.current(&headers) else { return redirect("/login") };
    let (f, problem) = event_filter(&query_of(q));
    let base = c.source_url(&f.source);
    let (list, live) = match &problem {
        Some(_) => (Err(String::new()), None),
        None => {
            let fq = filter_query(&f);
            let live = c.from_watermark(format!("/live?source={}{fq}", pct(&f.source)), &s.token).await;
            let list = recent(base, &format!("limit={STORY_EVENTS_MAX}{fq}"), &s.token).await;
            (list, Some(live))
        }
    };
    let status = if problem.is_some() { StatusCode::BAD_REQUEST } else { StatusCode::OK };
    let main = pages::events(&f, &list, problem.as_deref());
    let page = Page { title: "Events".into(), nav: "/events", main, live };
    c.page(&headers, status, page, Some(&viewer(&s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_form_decodes_plus_and_percent_and_keeps_the_first_of_a_repeated_name() {
        let f = parse_form("a=1+2&b=%3Cx%3E&a=3&c&d=%zz%4").expect("small");
        assert_eq!(f.get("a").map(String::as_str), Some("1 2"));
        assert_eq!(f.get("b").map(String::as_str), Some("<x>"));
        assert_eq!(f.get("c").map(String::as_str), Some(""));
        assert_eq!(f.get("d").map(String::as_str), Some("%zz%4"));
        let many = (0..=FORM_FIELDS_MAX).map(|i| format!("f{i}=x")).collect::<Vec<_>>().join("&");
        assert!(parse_form(&many).is_none(), "a form beyond the bound is refused");
    }

    #[test]
    fn the_session_cookie_is_found_among_others() {
        let mut h = HeaderMap::new();
        h.insert(header::COOKIE, HeaderValue::from_static("a=1; dlock_console_session=abc; b=2"));
        assert_eq!(session_cookie(&h).as_deref(), Some("abc"));
        h.insert(header::COOKIE, HeaderValue::from_static("dlock_console_session="));
        assert_eq!(session_cookie(&h), None);
    }

    #[test]
    fn merged_events_are_deduplicated_and_in_seq_order() {
        let e = |seq: i64| serde_json::json!({"eventId": format!("paydb/{seq}"), "seq": seq});
        let m = merge(Ok(vec![e(3), e(1)]), Ok(vec![e(2), e(3)]), 10).expect("ok");
        let seqs: Vec<i64> = m.iter().filter_map(|v| v["seq"].as_i64()).collect();
        assert_eq!(seqs, [1, 2, 3]);
        let m = merge(Ok(vec![e(1), e(2), e(3)]), Err("down".into()), 2).expect("one source is enough");
        assert_eq!(m.len(), 2);
        assert!(merge(Err("a".into()), Err("b".into()), 2).is_err());
    }
}
