//! The console in a real browser (issue 38): headless Chromium driven through the DevTools
//! protocol (`dlock_testkit::browser`) against `dlock up` running a chaotic cluster (a
//! quarter of rail calls failing into quarantine, executors stalling past their lease), as
//! an operator at 03:00 would meet it: sign in, watch a payout reach POSTED without
//! reloading, resolve a quarantined payout, revoke a lock and see its holder fenced out (on
//! the Events and Incidents pages), then as a reader see no action and have a forged action
//! refused; and the overview at a phone's width, with every control labelled.
//!
//! `dlock up` binds the default ports, as `demo.rs`'s test does: the two are one nextest
//! test group (`.config/nextest.toml`), never run at once.
//!
//! Screenshots go to `target/console-browser/` (the README shows one of them).
#![allow(
    clippy::disallowed_methods,
    reason = "a test outside the services: it bounds its own waits on real processes with the host's clock (the seam binds service code)"
)]
#![cfg(not(madsim))]

use std::path::PathBuf;
use std::process::{Command, Stdio};

use dlock_contract::payment::{ClaimRequest, NewAccountRequest, NewPayoutRequest};
use dlock_contract::payout::PayoutState;
use dlock_contract::OwnerId;
use dlock_lock_client::{LockClient, LockClientConfig};
use dlock_payment_client::{PaymentClient, PaymentRefusal};
use dlock_rt::http::{BaseUrl, HttpClient};
use dlock_rt::Duration;
use dlock_testkit::browser::{Browser, Page};
use dlock_testkit::TempDir;
use serde_json::json;
use uuid::Uuid;

mod common;
use common::{key, payment_client_with, token_of, Reaped};

/// Longest `dlock up` may take to serve.
const UP_WAIT_MS_MAX: u64 = 30_000;
/// Longest a payout may take to settle in the chaotic cluster, and the page to show it.
const SETTLE_MS_MAX: u64 = 60_000;
/// Payouts created while their POSTED list is open (one failing into quarantine in four).
const WATCHED: usize = 8;
/// Payouts created at once to have the rail quarantine at least one.
const QUARANTINE_BATCH: usize = 24;
/// The console `dlock up` serves.
const CONSOLE: &str = "http://127.0.0.1:8090";

fn shots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("../console-browser");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir
}

fn at(path: &str) -> String {
    format!("{CONSOLE}{path}")
}

/// Panics with `what`, the error and where the page stands (its URL and text) when `r` failed.
fn ok<T>(page: &mut Page, r: Result<T, String>, what: &str) -> T {
    r.unwrap_or_else(|e| {
        let at = page
            .eval("location.href + '\\n' + (document.querySelector('main') || document.body).innerText.slice(-2000)")
            .unwrap_or_default();
        panic!("{what}: {e}\npage: {}", at.as_str().unwrap_or_default())
    })
}

/// Signs in on `page` with `token` and waits for the overview.
fn sign_in(page: &mut Page, token: &str) {
    page.goto(&at("/login")).expect("login page");
    page.eval(&format!(
        "document.getElementById('token').value = {}; document.querySelector('form[action=\"/login\"]').submit(); true",
        json!(token)
    ))
    .expect("submit the login form");
    let r = page.loaded("location.pathname === '/' && !!document.querySelector('form[action=\"/logout\"]')");
    ok(page, r, "signed in");
}

/// Signs out through the header's button and waits for the login page.
fn sign_out(page: &mut Page) {
    page.eval("document.querySelector('form[action=\"/logout\"]').submit(); true").expect("submit logout");
    page.loaded("location.pathname === '/login'").expect("signed out");
}

/// The text of the page's main region.
const MAIN_TEXT: &str = "(document.querySelector('main') || document.body).innerText";

struct Up {
    _process: Reaped,
    _dir: TempDir,
    operator: String,
    reader: String,
    worker: String,
    payment: BaseUrl,
    lock: BaseUrl,
}

fn start_up(rt: &tokio::runtime::Runtime) -> Up {
    let dir = TempDir::new("console-browser");
    let process = Reaped(
        Command::new(env!("CARGO_BIN_EXE_dlock"))
            .args(["up", "--rail-failure-rate", "0.25", "--pause-rate", "0.05", "--reconcile-interval-ms", "5000"])
            .arg("--data-dir")
            .arg(&dir.0)
            .env("DLOCK_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn dlock up"),
    );
    let client = HttpClient::new(500, 2_000);
    let ready =
        rt.block_on(dlock_rt::wait_until(Duration::from_millis(50), Duration::from_millis(UP_WAIT_MS_MAX), || {
            let client = client.clone();
            async move {
                for url in ["http://127.0.0.1:8082", CONSOLE] {
                    let base = BaseUrl::parse(url).ok()?;
                    let path = if url == CONSOLE { "/health/live" } else { "/health/ready" };
                    let r = client.send(&base, http::Method::GET, path, &[], None).await.ok()?;
                    if r.status != 200 {
                        return None;
                    }
                }
                Some(())
            }
        }));
    assert!(ready.is_some(), "dlock up did not serve the payment-resource and the console");
    let creds = std::fs::read_to_string(dir.0.join("credentials")).expect("dlock up wrote its credentials");
    Up {
        operator: token_of(&creds, "operator"),
        reader: token_of(&creds, "reader"),
        worker: token_of(&creds, "worker"),
        payment: BaseUrl::parse("http://127.0.0.1:8082").expect("url"),
        lock: BaseUrl::parse("http://127.0.0.1:8081").expect("url"),
        _process: process,
        _dir: dir,
    }
}

fn open_account(rt: &tokio::runtime::Runtime, typed: &PaymentClient, account: &str) {
    let ops = OwnerId::parse("ops").expect("owner");
    let open =
        NewAccountRequest { account_id: account.into(), currency: "EUR".into(), opening_balance_minor: 10_000_000 };
    rt.block_on(typed.create_account(&ops, &key(&format!("open-{account}")), &open)).expect("account opened");
}

fn create_payout(rt: &tokio::runtime::Runtime, typed: &PaymentClient, account: &str, n: usize) -> Uuid {
    let ops = OwnerId::parse("ops").expect("owner");
    let create = NewPayoutRequest {
        payout_id: None,
        account_id: account.into(),
        amount_minor: 100 + n as i64,
        currency: "EUR".into(),
        beneficiary_ref: format!("<img src=x onerror=alert(1)>-{n}"),
    };
    rt.block_on(typed.create_payout(&ops, &key(&format!("create-{account}-{n}")), &create))
        .expect("payout created")
        .payout_id
}

#[test]
fn the_console_in_a_real_browser_signs_in_watches_resolves_revokes_and_refuses_a_reader() {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
    let Some(chromium) = dlock_testkit::browser::chromium("the console's browser test") else { return };
    let up = start_up(&rt);
    let typed = payment_client_with(&up.payment, &up.operator);
    for account in ["acct-watch", "acct-quarantine", "acct-revoke"] {
        open_account(&rt, &typed, account);
    }
    let shots = shots();
    let browser = Browser::launch(&chromium, 1280, 900).expect("headless chromium");
    let mut page = browser.page().expect("a page");

    // 1. Sign in as the operator.
    sign_in(&mut page, &up.operator);
    page.screenshot(&shots.join("overview.png")).expect("screenshot");

    // 2. A payout created while its account's POSTED list is open shows up there, the
    // page never reloaded (the marker set on this document survives).
    page.goto(&at("/payouts?state=POSTED&account=acct-watch")).expect("payouts page");
    page.eval("window.__kept = 'same document'; true").expect("marker");
    // A quarter of rail calls fail into quarantine: of WATCHED payouts one is POSTED.
    let watched: Vec<String> = (0..WATCHED).map(|n| create_payout(&rt, &typed, "acct-watch", n).to_string()).collect();
    page.wait_for(
        &format!("{}.some(id => {MAIN_TEXT}.includes(id)) && window.__kept === 'same document'", json!(watched)),
        SETTLE_MS_MAX,
    )
    .expect("a payout appeared as POSTED without a reload");
    page.screenshot(&shots.join("payouts-live.png")).expect("screenshot");

    // 3. Revoke a lock through the console; its holder is then fenced out, and the console
    // shows the refusal.
    let mut lc = LockClientConfig::new(up.lock.clone(), OwnerId::parse("holder-1").expect("owner"));
    lc.bearer = Some(dlock_rt::http::Bearer::fixed(dlock_contract::auth::Secret::new(&up.worker)));
    let holder = LockClient::new(lc).expect("lock client");
    let session = rt.block_on(holder.open_session()).expect("holder's session");
    let guard = rt.block_on(session.acquire("payout:acct-revoke")).expect("holder acquires");
    let held = guard.signed_token();
    page.goto(&at("/locks?key=payout:acct-revoke")).expect("locks page");
    page.wait_for(&format!("{MAIN_TEXT}.includes({})", json!(held.token.get().to_string())), SETTLE_MS_MAX)
        .expect("the lock's holder and token shown");
    // The lease left as the lock server judged it, the token floor, and the grant in the
    // key's history from the lock server's stream.
    let judged = json!("by the lock server's judgement");
    page.wait_for(
        &format!("{MAIN_TEXT}.includes({judged}) && {MAIN_TEXT}.includes('Token floor') && {MAIN_TEXT}.includes('lock.granted')"),
        SETTLE_MS_MAX,
    )
    .expect("the server's judgement and the key's history shown");
    page.eval(
        "document.getElementById('operator').value = 'ops-oncall'; \
         document.getElementById('reason').value = 'holder stuck in a GC pause, revoking'; \
         document.querySelector('form[action=\"/locks/revoke\"]').submit(); true",
    )
    .expect("submit the revoke");
    page.loaded(&format!("{MAIN_TEXT}.includes('Revoked token {}')", held.token.get())).expect("the revoke answered");
    page.screenshot(&shots.join("revoked.png")).expect("screenshot");
    page.goto(&at("/locks?key=payout:acct-revoke")).expect("locks page after the revoke");
    page.wait_for(&format!("{MAIN_TEXT}.includes('lock.revoked') && {MAIN_TEXT}.includes('Revoked')"), SETTLE_MS_MAX)
        .expect("the revoke in the key's history, with its new floor");
    page.screenshot(&shots.join("lock-history.png")).expect("screenshot");
    // A new holder's work raises the account's fence past the revoked token.
    let after = create_payout(&rt, &typed, "acct-revoke", 0);
    let settled = [PayoutState::Posted, PayoutState::Failed, PayoutState::RailAmbiguous];
    let posted =
        rt.block_on(dlock_rt::wait_until(Duration::from_millis(100), Duration::from_millis(SETTLE_MS_MAX), || async {
            let state = typed.payout(after).await.ok()?.state;
            settled.contains(&state).then_some(())
        }));
    assert!(posted.is_some(), "a payout of acct-revoke settled after the revoke");
    let worker = payment_client_with(&up.payment, &up.worker);
    let stale = rt.block_on(worker.claim(
        after,
        held.clone(),
        &OwnerId::parse("holder-1").expect("owner"),
        &key("stale-claim"),
        &ClaimRequest { expected_state: PayoutState::Pending },
    ));
    match stale {
        Err(PaymentRefusal::Refused { status: 409, envelope, .. }) if envelope.code.as_str() == "FENCED_OUT" => {}
        other => panic!("the revoked holder's write was not fenced out: {other:?}"),
    }
    page.goto(&at("/events?source=payment&kind=fence.refused&account=acct-revoke")).expect("events page");
    let rows = "Array.from(document.querySelectorAll('main table tbody tr')).map(r => r.innerText).join('\\n')";
    let r = page.wait_for(
        &format!("{rows}.includes('fence.refused') && {rows}.includes({})", json!(held.token.get().to_string())),
        SETTLE_MS_MAX,
    );
    ok(&mut page, r, "the console shows the holder fenced out");
    page.screenshot(&shots.join("fenced-out.png")).expect("screenshot");
    page.goto(&at("/incidents")).expect("incidents page");
    let r = page.wait_for(&format!("{rows}.includes('holder-1')"), SETTLE_MS_MAX);
    ok(&mut page, r, "the incident lists the fenced-out holder");
    page.screenshot(&shots.join("incidents.png")).expect("screenshot");
    // Its timeline, drawn from the three services' events in a sandboxed page: the revoke
    // ends the holder's lease, and its refused claim is a fenced-out mark.
    page.goto(&at("/incidents/timeline?account=acct-revoke")).expect("timeline page");
    let drawn = "document.querySelector('svg#tl [data-answer=\"fenced_out\"]') !== null \
                 && document.querySelector('svg#tl [data-kind=\"grant\"][data-end=\"revoked\"]') !== null";
    let r = page.wait_for(drawn, SETTLE_MS_MAX);
    ok(&mut page, r, "the account's timeline draws the revoke and the fenced-out claim");
    page.screenshot(&shots.join("incident-timeline.png")).expect("screenshot");

    // 4. A payout the rail left ambiguous is resolved as the operator, from its
    // quarantine entry: the verdict reaches paydb, audited.
    let batch: Vec<Uuid> = (0..QUARANTINE_BATCH).map(|n| create_payout(&rt, &typed, "acct-quarantine", n)).collect();
    let quarantined =
        rt.block_on(dlock_rt::wait_until(Duration::from_millis(200), Duration::from_millis(SETTLE_MS_MAX), || async {
            for id in &batch {
                if typed.payout(*id).await.ok()?.state == PayoutState::RailAmbiguous {
                    return Some(*id);
                }
            }
            None
        }));
    let q = quarantined.expect("the chaotic rail quarantined a payout").to_string();
    page.goto(&at("/quarantine")).expect("quarantine page");
    let form = format!(
        "Array.from(document.querySelectorAll('form[action=\"/quarantine/resolve\"]')).find(f => f.querySelector('input[name=payout]').value === {})",
        json!(q)
    );
    let r = page.wait_for(&format!("!!({form})"), SETTLE_MS_MAX);
    ok(&mut page, r, "the quarantined payout has a Resolve form");
    page.screenshot(&shots.join("quarantine.png")).expect("screenshot");
    page.eval(&format!(
        "const f = {form}; f.querySelector('input[value=FAILED]').checked = true; \
         f.querySelector('textarea[name=reason]').value = 'the rail statement shows no debit for it'; \
         f.querySelector('input[name=rail_reference]').value = 'stmt-2026-12-07-0001'; \
         f.querySelector('input[name=operator]').value = 'ops-oncall'; f.submit(); true"
    ))
    .expect("submit the resolution");
    let r = page.loaded("location.pathname === '/quarantine/resolve'");
    ok(&mut page, r, "the resolution answered");
    let resolved = rt.block_on(typed.payout(q.parse().expect("uuid"))).expect("the payout").state;
    assert_eq!(resolved, PayoutState::Failed, "the operator's verdict reached paydb");
    page.screenshot(&shots.join("resolved.png")).expect("screenshot");
    // The overview of the busy cluster (the README's picture).
    page.goto(&at("/")).expect("overview");
    page.screenshot(&shots.join("overview-busy.png")).expect("screenshot");

    // 5. A reader sees no action, and the console refuses one forged from its session.
    sign_out(&mut page);
    sign_in(&mut page, &up.reader);
    page.goto(&at("/locks?key=payout:acct-revoke")).expect("locks page as reader");
    let forms =
        page.eval("document.querySelectorAll('form[method=post]:not([action=\"/logout\"])').length").expect("count");
    assert_eq!(forms, json!(0), "a reader's locks page offers an action");
    page.goto(&at("/quarantine")).expect("quarantine as reader");
    let forms =
        page.eval("document.querySelectorAll('form[method=post]:not([action=\"/logout\"])').length").expect("count");
    assert_eq!(forms, json!(0), "a reader's quarantine page offers an action");
    let forged = page
        .eval(
            "fetch('/locks/revoke', {method: 'POST', headers: {'content-type': 'application/x-www-form-urlencoded'}, \
             body: 'csrf=' + encodeURIComponent(document.querySelector('input[name=csrf]').value) + \
             '&key=payout:acct-watch&operator=mallory&reason=forged+by+a+reader&expected_token=1'}).then(r => r.status)",
        )
        .expect("forged revoke");
    assert_eq!(forged, json!(403), "the console let a reader's session revoke");

    // 6. A phone's width: nothing wider than the screen, and every control labelled.
    page.viewport(390, 844, true).expect("phone viewport");
    page.goto(&at("/")).expect("overview on a phone");
    let fits = page.eval("document.documentElement.scrollWidth <= window.innerWidth + 1").expect("width");
    assert_eq!(fits, json!(true), "the overview is wider than a phone's screen");
    page.goto(&at("/events")).expect("events on a phone");
    let unlabelled = page
        .eval(
            "Array.from(document.querySelectorAll('input:not([type=hidden]), select, textarea, button')) \
             .filter(e => !(e.labels && e.labels.length) && !e.getAttribute('aria-label') && !e.innerText.trim()) \
             .map(e => e.outerHTML)",
        )
        .expect("labels");
    assert_eq!(unlabelled, json!([]), "controls without a label");
    page.screenshot(&shots.join("phone.png")).expect("screenshot");
    drop(session);
}
