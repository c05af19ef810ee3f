//! The pages' main regions, as plain functions of what the services answered. No I/O:
//! `app.rs` fetches, these render. Every interpolated value goes through
//! [`crate::html::esc`] (directly or through [`field`]); see `html.rs` for the rules.

use dlock_contract::auth::Role;
use dlock_contract::headers::OWNER_ID_CHARS_MAX;
use dlock_contract::payout::PayoutState;
use dlock_contract::resolution::{
    RESOLUTION_RAIL_REFERENCE_CHARS_MAX, RESOLUTION_REASON_CHARS_MAX, RESOLUTION_REASON_CHARS_MIN,
};
use serde_json::Value;

use crate::html::{csrf_field, display, esc, field, notice, payout_link, pct, str_of, table, Viewer};

/// A value fetched from a service, or why not (already a display message).
pub type Fetched<T> = Result<T, String>;

fn failed(what: &str, why: &str) -> String {
    notice("bad", &format!("{} could not be read: {}", esc(what), esc(why)))
}

/// The count of one state: the payouts seen, and whether more pages remained unread.
#[derive(Debug, Clone)]
pub struct StateCount {
    pub state: PayoutState,
    pub count: Fetched<(usize, bool)>,
    /// The oldest payout's `createdAt` (P1 lists oldest first), as the payment-resource
    /// stamped it.
    pub oldest: Option<String>,
}

/// What the overview says of time, from this console's wall clock `now`: for people only
/// (two processes' wall clocks are never compared to decide anything).
#[derive(Debug, Clone, Copy)]
pub struct Now(pub chrono::DateTime<chrono::Utc>);

impl Now {
    /// `at` (RFC 3339), as an age: "about 3 min ago".
    fn age(self, at: &str) -> Option<String> {
        let t = chrono::DateTime::parse_from_rfc3339(at).ok()?;
        let secs = (self.0 - t.with_timezone(&chrono::Utc)).num_seconds().max(0);
        Some(match secs {
            0..=119 => format!("about {secs} s ago"),
            120..=7_199 => format!("about {} min ago", secs / 60),
            _ => format!("about {} h ago", secs / 3_600),
        })
    }

    /// Whether `at` (RFC 3339) is within the last `secs` of `now`.
    fn within(self, at: &str, secs: i64) -> bool {
        chrono::DateTime::parse_from_rfc3339(at)
            .is_ok_and(|t| (self.0 - t.with_timezone(&chrono::Utc)).num_seconds() <= secs)
    }
}

/// Fenced-out writes the overview's table shows (the newest).
pub const OVERVIEW_FENCED_SHOWN: usize = 20;
/// The window of the overview's fenced-out count, s.
pub const FENCED_WINDOW_S: i64 = 3_600;

fn count_text(c: &Fetched<(usize, bool)>) -> String {
    match c {
        Ok((n, false)) => esc(&n.to_string()),
        Ok((n, true)) => format!("≥ {}", esc(&n.to_string())),
        Err(e) => format!("<span class=\"bad\">unknown ({})</span>", esc(e)),
    }
}

/// A one-line account of an event, for the timeline and the event tables.
pub fn describe(e: &Value) -> String {
    let d = e.get("data").cloned().unwrap_or(Value::Null);
    let f = |k: &str| field(&d, k);
    match str_of(e, "kind").unwrap_or("") {
        "account.created" => format!("Account created: {} {} opening balance", f("balanceMinor"), f("currency")),
        "payout.created" => format!(
            "Created: {} {} to beneficiary <span class=\"mono\">{}</span> (state {})",
            f("amountMinor"),
            f("currency"),
            f("beneficiaryRef"),
            f("state")
        ),
        "payout.state_changed" => format!(
            "State {} → <strong>{}</strong> (attempt {}, claim token {})",
            f("from"),
            f("to"),
            f("attemptCount"),
            f("claimToken")
        ),
        "fence.raised" => {
            format!(
                "Claim/post raised the account fence {} → <strong>{}</strong>",
                f("previousFence"),
                f("presentedToken")
            )
        }
        "fence.refused" => format!(
            "<strong class=\"bad\">Fenced out</strong>: {} by <span class=\"mono\">{}</span> presented token {}, \
             the fence is {}; nothing was written",
            f("operation"),
            f("ownerId"),
            f("presentedToken"),
            f("fence")
        ),
        "rail.mark_raised" => {
            format!("The rail-proxy's mark rose {} → <strong>{}</strong>", f("previousMark"), f("presentedToken"))
        }
        "rail.intent" => format!(
            "Intent recorded before the rail call: submission <span class=\"mono\">{}</span> under token {} by \
             <span class=\"mono\">{}</span>",
            f("submissionId"),
            f("presentedToken"),
            f("ownerId")
        ),
        "rail.refused" => format!(
            "<strong class=\"bad\">The rail-proxy refused a submission</strong> ({}) under token {} by \
             <span class=\"mono\">{}</span>: it never reached the rail",
            f("outcome"),
            f("presentedToken"),
            f("ownerId")
        ),
        "rail.outcome" => format!(
            "Rail outcome <strong>{}</strong> for submission <span class=\"mono\">{}</span> (reference {})",
            f("outcome"),
            f("submissionId"),
            f("railReference")
        ),
        "operator.resolution" => format!(
            "Operator <span class=\"mono\">{}</span> resolved it as <strong>{}</strong>: {}",
            f("operator"),
            f("resolvedAs"),
            f("reason")
        ),
        "session.opened" => {
            format!("Session opened by <span class=\"mono\">{}</span> (TTL {} ms)", f("ownerId"), f("ttlMs"))
        }
        "session.expired" => format!("Session of <span class=\"mono\">{}</span> expired", f("ownerId")),
        "lock.granted" => format!(
            "<strong>Granted</strong> to <span class=\"mono\">{}</span> with token <strong>{}</strong>",
            f("ownerId"),
            f("token")
        ),
        "lock.renewed" => {
            format!("Lease renewed by <span class=\"mono\">{}</span> (token {})", f("ownerId"), f("token"))
        }
        "lock.released" => format!("Released by <span class=\"mono\">{}</span> (token {})", f("ownerId"), f("token")),
        "lock.expired" => format!(
            "<strong class=\"bad\">Expired</strong>: <span class=\"mono\">{}</span>'s grant (token {}) lapsed \
             without release",
            f("ownerId"),
            f("token")
        ),
        "lock.revoked" => format!(
            "<strong class=\"bad\">Revoked</strong> by operator <span class=\"mono\">{}</span>: \
             <span class=\"mono\">{}</span>'s token {} fenced out, the token floor is now <strong>{}</strong> ({})",
            f("operator"),
            f("ownerId"),
            f("token"),
            f("newTokenFloor"),
            f("reason")
        ),
        "reconciler.finding" => {
            let class = match str_of(&d, "class") {
                Some(_) => format!(" (the rail's record: {})", f("class")),
                None => String::new(),
            };
            match str_of(&d, "status") {
                Some("cleared") => format!(
                    "The reconciler no longer finds <strong>{}</strong>{class} (run <span class=\"mono\">{}</span>)",
                    f("finding"),
                    f("runId")
                ),
                _ => format!(
                    "<strong class=\"bad\">The reconciler found {}</strong> ({}){class}: {} (run \
                     <span class=\"mono\">{}</span>)",
                    f("finding"),
                    f("severity"),
                    f("detail"),
                    f("runId")
                ),
            }
        }
        other => format!("{}: <span class=\"mono\">{}</span>", esc(other), esc(&d.to_string())),
    }
}

/// The reconciler's verdict on one payout, from its `reconciler.finding` events (oldest
/// first): the findings still open, each the latest event of its `findingKey`.
pub fn reconciler_verdict(events: &[Value]) -> String {
    let mut latest: std::collections::BTreeMap<String, &Value> = std::collections::BTreeMap::new();
    let mut any = false;
    for e in events.iter().filter(|e| str_of(e, "kind") == Some("reconciler.finding")) {
        any = true;
        let key = e.get("data").and_then(|d| str_of(d, "findingKey")).unwrap_or_default().to_owned();
        latest.insert(key, e);
    }
    let open: Vec<&&Value> =
        latest.values().filter(|e| e.get("data").and_then(|d| str_of(d, "status")) == Some("open")).collect();
    let mut s = String::from("<section aria-labelledby=\"verdict\"><h2 id=\"verdict\">The reconciler's verdict</h2>");
    if open.is_empty() {
        s.push_str(if any {
            "<p>Every finding the reconciler recorded for this payout has cleared.</p>"
        } else {
            "<p>The reconciler has recorded no finding for this payout (among the events kept).</p>"
        });
    } else {
        s.push_str("<ul class=\"verdict\">");
        for e in open {
            s.push_str(&format!("<li><span class=\"when mono\">{}</span> {}</li>", field(e, "at"), describe(e)));
        }
        s.push_str("</ul>");
    }
    s.push_str("</section>");
    s
}

fn event_class(e: &Value) -> &'static str {
    match str_of(e, "kind").unwrap_or("") {
        "fence.refused" | "rail.refused" => "ev bad",
        "fence.raised" | "rail.mark_raised" => "ev fence",
        "rail.intent" | "rail.outcome" => "ev rail",
        "reconciler.finding" if e.get("data").and_then(|d| str_of(d, "status")) == Some("cleared") => "ev",
        "reconciler.finding" => "ev bad",
        _ => "ev",
    }
}

/// Rows of an event table.
pub fn event_rows(events: &[Value]) -> Vec<Vec<String>> {
    events
        .iter()
        .map(|e| {
            vec![
                format!("<span class=\"mono\">{}</span>", field(e, "at")),
                format!("<span class=\"{}\">{}</span>", event_class(e), field(e, "kind")),
                format!("<span class=\"mono\">{}</span>", field(e, "accountId")),
                payout_link(str_of(e, "payoutId")),
                format!("<span class=\"mono\">{}</span>", field(e, "lockKey")),
                describe(e),
            ]
        })
        .collect()
}

const EVENT_HEAD: [&str; 6] = ["At", "Kind", "Account", "Payout", "Lock key", "What happened"];

fn events_table(caption: &str, events: &Fetched<Vec<Value>>) -> String {
    match events {
        Ok(list) => table(caption, &EVENT_HEAD, &event_rows(list)),
        Err(e) => failed(caption, e),
    }
}

/// One fenced-out write of an incident row: the fence that refused it (`None`: the rail's
/// refusal, whose mark its event does not carry), and the gap, the fence less the token
/// presented (how many grants went by while the writer held its stale one).
pub fn fence_gap(e: &Value) -> (Option<i64>, Option<i64>, Option<i64>) {
    let presented = e.pointer("/data/presentedToken").and_then(Value::as_i64);
    let fence = e.pointer("/data/fence").and_then(Value::as_i64);
    let gap = match (presented, fence) {
        (Some(p), Some(f)) => Some(f.saturating_sub(p)),
        _ => None,
    };
    (presented, fence, gap)
}

/// `/incidents`: every fenced-out write the services recorded recently, newest last: the
/// resource that refused it (the account's fence at the payment-resource, or the rail
/// mark at the rail-proxy), who wrote, the token presented, the fence, the gap, and the
/// payouts it was for (each linked to its story).
pub fn incidents(fenced: &Fetched<Vec<Value>>) -> String {
    let mut s = String::from("<h1>Incidents</h1>");
    s.push_str(&notice(
        "info",
        "Each row is a write refused because a newer lock holder exists: two workers believed they held one \
         lock, and the fence stopped the stale one. The <strong>gap</strong> is the refusing fence less the \
         token presented.",
    ));
    let list = match fenced {
        Ok(list) => list,
        Err(e) => return s + &failed("The fenced-out writes", e),
    };
    let mono = |v: String| format!("<span class=\"mono\">{v}</span>");
    let num = |n: Option<i64>| n.map_or_else(|| "—".to_owned(), |n| n.to_string());
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|e| {
            let (presented, fence, gap) = fence_gap(e);
            let resource = match str_of(e, "kind") {
                Some("rail.refused") => format!("rail mark, account {}", mono(field(e, "accountId"))),
                _ => format!("account fence {}", mono(field(e, "accountId"))),
            };
            let mut payouts: Vec<String> = e
                .pointer("/data/payoutIds")
                .and_then(Value::as_array)
                .map(|ids| ids.iter().map(|id| payout_link(id.as_str())).collect())
                .unwrap_or_default();
            if payouts.is_empty() {
                payouts.push(payout_link(str_of(e, "payoutId")));
            }
            let op = e.pointer("/data/operation").and_then(Value::as_str).unwrap_or("submit");
            vec![
                mono(field(e, "at")),
                resource,
                esc(op),
                mono(e.pointer("/data/ownerId").and_then(Value::as_str).map(esc).unwrap_or_default()),
                num(presented),
                num(fence),
                format!("<strong>{}</strong>", num(gap)),
                payouts.join(" "),
                timeline_link(str_of(e, "accountId")),
            ]
        })
        .collect();
    s.push_str(&table(
        "Fenced-out writes, oldest first",
        &["At", "Refused by", "Write", "Writer", "Token presented", "Fence", "Gap", "Payouts", "Timeline"],
        &rows,
    ));
    s
}

/// A link to an account's incident timeline (`/incidents/timeline`), or `—` for a value
/// that is not an account id.
fn timeline_link(account: Option<&str>) -> String {
    match account.filter(|a| dlock_contract::rail::is_account_id(a)) {
        Some(a) => format!(
            "<a href=\"{}?account={}\" target=\"_blank\" rel=\"noopener\">Timeline of {}</a>",
            crate::app::TIMELINE_PATH,
            esc(&pct(a)),
            esc(a)
        ),
        None => "—".to_owned(),
    }
}

/// `/`: payouts by state, the quarantine, fenced-out writes, recent events.
pub fn overview(
    now: Now,
    counts: &[StateCount],
    fenced: &Fetched<Vec<Value>>,
    fenced_full: bool,
    recent: &Fetched<Vec<Value>>,
) -> String {
    let mut s = String::from("<h1>Overview</h1>");
    // The backlog: how long the oldest PENDING payout has waited, and the fenced-out writes
    // of the last hour.
    let backlog = match counts.iter().find(|c| c.state == PayoutState::Pending).and_then(|c| c.oldest.as_deref()) {
        Some(at) => format!(
            "The oldest PENDING payout was created at <span class=\"mono\">{}</span>{}.",
            esc(at),
            now.age(at).map(|a| format!(" ({}, by this console's clock)", esc(&a))).unwrap_or_default()
        ),
        None => "No payout is PENDING.".to_owned(),
    };
    let last_hour = match fenced {
        Ok(list) => {
            let n = list.iter().filter(|e| str_of(e, "at").is_some_and(|at| now.within(at, FENCED_WINDOW_S))).count();
            let more = if fenced_full { "at least " } else { "" };
            format!("Fenced-out writes in the last hour: <strong>{more}{n}</strong>.")
        }
        Err(_) => "Fenced-out writes in the last hour: unknown.".to_owned(),
    };
    s.push_str(&format!("<p class=\"backlog\">{backlog} {last_hour}</p>"));
    let ambiguous = counts.iter().find(|c| c.state == PayoutState::RailAmbiguous);
    if let Some(a) = ambiguous {
        let kind = match a.count {
            Ok((0, false)) => "info",
            _ => "warn",
        };
        s.push_str(&notice(
            kind,
            &format!(
                "Ambiguous payouts waiting for an operator (RAIL_AMBIGUOUS): <strong>{}</strong>. \
                 <a href=\"/quarantine\">Open the quarantine</a>.",
                count_text(&a.count)
            ),
        ));
    }
    s.push_str("<section aria-labelledby=\"by-state\"><h2 id=\"by-state\">Payouts by state</h2><ul class=\"cards\">");
    for c in counts {
        s.push_str(&format!(
            "<li class=\"card\"><a href=\"/payouts?state={}\"><span class=\"label\">{}</span>\
             <span class=\"count\">{}</span></a></li>",
            esc(&pct(c.state.as_str())),
            esc(c.state.as_str()),
            count_text(&c.count)
        ));
    }
    s.push_str("</ul></section>");
    s.push_str("<section aria-labelledby=\"fenced\"><h2 id=\"fenced\">Recent fenced-out writes</h2>");
    s.push_str(
        "<p class=\"hint\">A write refused because a newer lock holder exists. Each one means two workers \
         believed they held one lock; the fence stopped the stale one.</p>",
    );
    let newest =
        fenced.as_ref().map(|f| f[f.len().saturating_sub(OVERVIEW_FENCED_SHOWN)..].to_vec()).map_err(Clone::clone);
    s.push_str(&events_table("Recent fence.refused events (payment-resource)", &newest));
    s.push_str("</section><section aria-labelledby=\"recent\"><h2 id=\"recent\">Recent events</h2>");
    s.push_str(&events_table("The newest events (payment-resource and rail-proxy)", recent));
    s.push_str("</section>");
    s
}

/// The filter of the payouts page.
#[derive(Debug, Clone, Default)]
pub struct PayoutFilter {
    pub state: Option<PayoutState>,
    pub account: Option<String>,
    pub cursor: Option<String>,
}

fn state_select(selected: Option<PayoutState>) -> String {
    let mut s = String::from("<select id=\"state\" name=\"state\">");
    for st in PayoutState::ALL {
        let sel = if Some(st) == selected { " selected" } else { "" };
        s.push_str(&format!("<option value=\"{}\"{sel}>{}</option>", esc(st.as_str()), esc(st.as_str())));
    }
    s.push_str("</select>");
    s
}

/// `/payouts`: one P1 page.
pub fn payouts(filter: &PayoutFilter, page: &Fetched<Value>, problem: Option<&str>) -> String {
    let state = filter.state.unwrap_or(PayoutState::Pending);
    let account = filter.account.clone().unwrap_or_default();
    let mut s = String::from("<h1>Payouts</h1>");
    s.push_str(&format!(
        "<form method=\"get\" action=\"/payouts\" class=\"filters\">\
         <div class=\"field\"><label for=\"state\">State</label>{}</div>\
         <div class=\"field\"><label for=\"account\">Account id</label>\
         <input id=\"account\" name=\"account\" value=\"{}\" maxlength=\"64\" autocomplete=\"off\"></div>\
         <button type=\"submit\">Show</button></form>",
        state_select(Some(state)),
        esc(&account)
    ));
    if let Some(p) = problem {
        s.push_str(&notice("bad", &esc(p)));
        return s;
    }
    let v = match page {
        Ok(v) => v,
        Err(e) => return s + &failed("The payouts", e),
    };
    let items = v.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|p| {
            vec![
                payout_link(str_of(p, "payoutId")),
                format!("<span class=\"mono\">{}</span>", field(p, "accountId")),
                format!("{} {}", field(p, "amountMinor"), field(p, "currency")),
                field(p, "state"),
                field(p, "attemptCount"),
                format!("<span class=\"mono\">{}</span>", field(p, "createdAt")),
            ]
        })
        .collect();
    let caption = format!("{} payouts, oldest first", state.as_str());
    s.push_str(&table(&caption, &["Payout", "Account", "Amount (minor units)", "State", "Attempts", "Created"], &rows));
    if let Some(next) = str_of(v, "nextCursor") {
        let mut href = format!("/payouts?state={}", pct(state.as_str()));
        if !account.is_empty() {
            href.push_str(&format!("&account={}", pct(&account)));
        }
        href.push_str(&format!("&cursor={}", pct(next)));
        s.push_str(&format!("<p><a class=\"button\" href=\"{}\" rel=\"next\">Next page</a></p>", esc(&href)));
    }
    s
}

fn submissions_table(p: &Value) -> String {
    let subs = p.get("submissions").and_then(Value::as_array).cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = subs
        .iter()
        .map(|x| {
            vec![
                format!("<span class=\"mono\">{}</span>", field(x, "submissionId")),
                field(x, "presentedToken"),
                field(x, "outcome"),
                format!("<span class=\"mono\">{}</span>", field(x, "railReference")),
                format!("<span class=\"mono\">{}</span>", field(x, "submittedAt")),
                format!("<span class=\"mono\">{}</span>", field(x, "resolvedAt")),
            ]
        })
        .collect();
    table(
        "Rail submissions (intent rows), in attempt order",
        &["Submission", "Token", "Outcome", "Rail reference", "Submitted", "Resolved"],
        &rows,
    )
}

/// `/payouts/{id}`: P4 and the payout's story.
pub fn payout(id: &str, p: &Fetched<Value>, events: &Fetched<Vec<Value>>) -> String {
    let mut s = format!("<h1>Payout <span class=\"mono\">{}</span></h1>", esc(id));
    match p {
        Err(e) => s.push_str(&failed("The payout", e)),
        Ok(p) => {
            if str_of(p, "state") == Some(PayoutState::RailAmbiguous.as_str()) {
                s.push_str(&notice(
                    "warn",
                    "This payout is <strong>RAIL_AMBIGUOUS</strong>: the rail may or may not have paid. It is \
                     quarantined; see <a href=\"/quarantine\">the quarantine</a>.",
                ));
            }
            s.push_str("<dl class=\"facts\">");
            for (label, key) in [
                ("State", "state"),
                ("Account", "accountId"),
                ("Amount (minor units)", "amountMinor"),
                ("Currency", "currency"),
                ("Beneficiary", "beneficiaryRef"),
                ("Attempts", "attemptCount"),
                ("Claim token", "claimToken"),
                ("Claimed by", "claimedBy"),
                ("Claimed at", "claimedAt"),
                ("Created", "createdAt"),
                ("Updated", "updatedAt"),
            ] {
                s.push_str(&format!("<dt>{}</dt><dd class=\"mono\">{}</dd>", esc(label), field(p, key)));
            }
            s.push_str("</dl>");
            s.push_str(&submissions_table(p));
        }
    }
    if let Ok(list) = events {
        s.push_str(&reconciler_verdict(list));
    }
    s.push_str("<section aria-labelledby=\"story\"><h2 id=\"story\">Story</h2>");
    s.push_str(
        "<p class=\"hint\">Created → claim (the fence rises to the grant's token) → intent (recorded before the \
         rail call) → outcome → post. Every fenced-out write is shown where it happened, and every finding \
         the reconciler recorded.</p>",
    );
    match events {
        Err(e) => s.push_str(&failed("The payout's events", e)),
        Ok(list) if list.is_empty() => s.push_str("<p>No events recorded for this payout.</p>"),
        Ok(list) => {
            s.push_str("<ol class=\"timeline\">");
            for e in list {
                s.push_str(&format!(
                    "<li class=\"{}\"><span class=\"when mono\">{}</span> <span class=\"kind\">{}</span> \
                     <span class=\"what\">{}</span></li>",
                    event_class(e),
                    field(e, "at"),
                    field(e, "kind"),
                    describe(e)
                ));
            }
            s.push_str("</ol>");
        }
    }
    s.push_str("</section>");
    s
}

/// What an operator typed into a Resolve form, shown again when the console refused it
/// (each value is escaped where it is put into the page).
#[derive(Debug, Clone, Default)]
pub struct ResolveForm {
    pub payout: String,
    pub resolved_as: String,
    pub reason: String,
    pub rail_reference: String,
    pub operator: String,
}

/// What became of a Resolve form, to show on the quarantine page.
#[derive(Debug, Clone)]
pub enum ResolveResult {
    /// The console refused the form before sending anything (`why` is a display message).
    Invalid { form: ResolveForm, why: String },
    /// The payment-resource resolved the payout: its `200` answer.
    Done(Value),
    /// The payment-resource refused: its envelope's message. Nothing changed.
    Refused { payout: String, why: String },
    /// No answer: the resolution may or may not have happened.
    Unknown { payout: String, why: String },
}

fn resolve_notice(result: &ResolveResult) -> String {
    match result {
        ResolveResult::Invalid { why, .. } => notice("bad", &format!("Not sent: {}. Nothing changed.", esc(why))),
        ResolveResult::Done(v) => notice(
            "info",
            &format!(
                "Payout <span class=\"mono\">{}</span> is now <strong>{}</strong>. Resolution \
                 <span class=\"mono\">{}</span>; the account's balance is now {}.",
                field(v, "payoutId"),
                field(v, "state"),
                field(v, "resolutionId"),
                field(v, "balanceMinor")
            ),
        ),
        ResolveResult::Refused { payout, why } => {
            notice("bad", &format!("Payout <span class=\"mono\">{}</span> was not resolved: {}", esc(payout), esc(why)))
        }
        ResolveResult::Unknown { payout, why } => notice(
            "bad",
            &format!(
                "The outcome of resolving payout <span class=\"mono\">{}</span> is unknown ({}): it may or may \
                 not have been resolved. Look the payout up again before anything else: \
                 <a href=\"/payouts/{}\">open the payout</a>.",
                esc(payout),
                esc(why),
                esc(&pct(payout))
            ),
        ),
    }
}

/// The Resolve form of payout `id` (an operator's only), prefilled with `entered` if the
/// console refused it, under the idempotency key `key` (one per rendered form).
fn resolve_form(viewer: &Viewer, id: &str, key: &str, entered: Option<&ResolveForm>) -> String {
    let e = entered.cloned().unwrap_or_default();
    let idx = esc(&pct(id));
    let checked = |v: &str| if e.resolved_as == v { " checked" } else { "" };
    format!(
        "<section aria-labelledby=\"resolve-{idx}\"><h3 id=\"resolve-{idx}\">Resolve</h3>\
         <p class=\"hint\">Read the rail's own record for this payout first (its statement, or the reconciler's \
         report). <strong>POSTED</strong>: the rail paid; the ledger entries are written. <strong>FAILED</strong>: \
         it did not; the reserved amount is released. A resolution is final and audited.</p>\
         <form method=\"post\" action=\"/quarantine/resolve\" class=\"stack\" \
         data-confirm=\"Resolve this payout? A resolution is final.\">{csrf}\
         <input type=\"hidden\" name=\"payout\" value=\"{id}\">\
         <input type=\"hidden\" name=\"idempotency_key\" value=\"{key}\">\
         <fieldset class=\"choices\"><legend>Outcome, from the rail's record</legend>\
         <div class=\"choice\"><input type=\"radio\" id=\"as-posted-{idx}\" name=\"resolved_as\" value=\"POSTED\" required{posted}>\
         <label for=\"as-posted-{idx}\">POSTED: the rail paid</label></div>\
         <div class=\"choice\"><input type=\"radio\" id=\"as-failed-{idx}\" name=\"resolved_as\" value=\"FAILED\"{failed}>\
         <label for=\"as-failed-{idx}\">FAILED: the rail did not pay</label></div></fieldset>\
         <div class=\"field\"><label for=\"reason-{idx}\">Reason (at least {min} characters: what the rail's record shows)</label>\
         <textarea id=\"reason-{idx}\" name=\"reason\" required minlength=\"{min}\" maxlength=\"{max}\" rows=\"3\">{reason}</textarea></div>\
         <div class=\"field\"><label for=\"rail-reference-{idx}\">Rail reference (or statement line; no spaces)</label>\
         <input id=\"rail-reference-{idx}\" name=\"rail_reference\" required maxlength=\"{ref_max}\" autocomplete=\"off\" value=\"{rail_reference}\"></div>\
         <div class=\"field\"><label for=\"operator-{idx}\">Your name (operator)</label>\
         <input id=\"operator-{idx}\" name=\"operator\" required maxlength=\"{op_max}\" autocomplete=\"username\" value=\"{operator}\"></div>\
         <button type=\"submit\" class=\"danger\">Resolve</button></form></section>",
        csrf = csrf_field(&viewer.csrf),
        id = esc(id),
        key = esc(key),
        posted = checked("POSTED"),
        failed = checked("FAILED"),
        min = RESOLUTION_REASON_CHARS_MIN,
        max = RESOLUTION_REASON_CHARS_MAX,
        ref_max = RESOLUTION_RAIL_REFERENCE_CHARS_MAX,
        op_max = OWNER_ID_CHARS_MAX,
        reason = esc(&e.reason),
        rail_reference = esc(&e.rail_reference),
        operator = esc(&e.operator),
    )
}

/// `/quarantine`: every RAIL_AMBIGUOUS payout with its intent rows, and no retry; for an
/// operator, a Resolve form per payout, each under a fresh idempotency key from `fresh_key`,
/// and what the last Resolve came to (`result`).
pub fn quarantine(
    viewer: &Viewer,
    list: &Fetched<(Vec<Fetched<Value>>, bool)>,
    result: Option<&ResolveResult>,
    fresh_key: &dyn Fn() -> String,
) -> String {
    let mut s = String::from("<h1>Quarantine</h1>");
    if let Some(r) = result {
        s.push_str(&resolve_notice(r));
    }
    s.push_str(&notice(
        "info",
        "Each payout here reached the rail and got no usable answer: the rail may have paid. \
         <strong>No second submission can happen</strong>: the rail-proxy refuses any further submission of a \
         RAIL_AMBIGUOUS payout under any token, and the executors never pick it up again. Only an operator's \
         resolution, from the rail's own record, settles it.",
    ));
    let (items, more) = match list {
        Err(e) => return s + &failed("The quarantined payouts", e),
        Ok(x) => x,
    };
    if items.is_empty() {
        s.push_str("<p>No payout is quarantined.</p>");
    }
    let entered = match result {
        Some(ResolveResult::Invalid { form, .. }) => Some(form),
        _ => None,
    };
    for item in items {
        match item {
            Err(e) => s.push_str(&failed("A quarantined payout", e)),
            Ok(p) => {
                let id = str_of(p, "payoutId").unwrap_or("");
                s.push_str(&format!(
                    "<article class=\"quarantined\"><h2>{}</h2><p>{} {} from account <span class=\"mono\">{}</span> \
                     to <span class=\"mono\">{}</span>, {} attempt(s).</p>",
                    payout_link(Some(id)),
                    field(p, "amountMinor"),
                    field(p, "currency"),
                    field(p, "accountId"),
                    field(p, "beneficiaryRef"),
                    field(p, "attemptCount")
                ));
                s.push_str(&submissions_table(p));
                if viewer.role == Role::Operator {
                    let mine = entered.filter(|f| f.payout == id);
                    s.push_str(&resolve_form(viewer, id, &fresh_key(), mine));
                }
                let cmd = format!(
                    "dlock resolve {id} --as posted|failed --operator NAME --reason TEXT [--rail-reference REF]"
                );
                s.push_str(&format!(
                    "<details class=\"cli\"><summary>From a host with paydb access</summary>\
                     <label for=\"cmd-{idx}\">The same resolution with the command line</label>\
                     <textarea id=\"cmd-{idx}\" class=\"mono cmd\" readonly rows=\"2\">{cmd}</textarea></details></article>",
                    idx = esc(&pct(id)),
                    cmd = esc(&cmd)
                ));
            }
        }
    }
    if *more {
        s.push_str(&notice("warn", "More quarantined payouts exist than this page shows."));
    }
    s
}

/// What a revoke answered, to show on the locks page.
#[derive(Debug, Clone)]
pub enum RevokeResult {
    Done(Value),
    Refused(String),
}

/// `/locks`: L7 for one key, and the revoke form for an operator.
pub fn locks(
    viewer: &Viewer,
    key: Option<&str>,
    info: Option<&Fetched<Option<Value>>>,
    history: Option<&Fetched<Vec<Value>>>,
    problem: Option<&str>,
    result: Option<&RevokeResult>,
) -> String {
    let mut s = String::from("<h1>Locks</h1>");
    s.push_str(&format!(
        "<form method=\"get\" action=\"/locks\" class=\"filters\"><div class=\"field\">\
         <label for=\"key\">Lock key</label><input id=\"key\" name=\"key\" value=\"{}\" maxlength=\"128\" \
         placeholder=\"payout:ACCOUNT\" autocomplete=\"off\" required></div><button type=\"submit\">Look up</button></form>",
        esc(key.unwrap_or(""))
    ));
    s.push_str(
        "<p class=\"hint\">An advisory read (L7): the lock may change the moment after. Time left is the lock \
         server's own judgement, on its clock; only the fenced write decides.</p>",
    );
    match result {
        Some(RevokeResult::Done(v)) => s.push_str(&notice(
            "info",
            &format!(
                "Revoked token {}. The token floor is now {}: the evicted holder is fenced out at the resources. \
                 Revocation <span class=\"mono\">{}</span>.",
                field(v, "revokedToken"),
                field(v, "newTokenFloor"),
                field(v, "revocationId")
            ),
        )),
        Some(RevokeResult::Refused(why)) => s.push_str(&notice("bad", &format!("Not revoked: {}", esc(why)))),
        None => {}
    }
    if let Some(p) = problem {
        s.push_str(&notice("bad", &esc(p)));
    }
    let (Some(key), Some(info)) = (key, info) else { return s };
    let v = match info {
        Err(e) => return s + &failed("The lock", e),
        Ok(None) => return s + &notice("info", "This key was never granted (L7 answers 404)."),
        Ok(Some(v)) => v,
    };
    let held = v.get("held").and_then(Value::as_bool).unwrap_or(false);
    s.push_str("<dl class=\"facts\">");
    s.push_str(&format!("<dt>Key</dt><dd class=\"mono\">{}</dd>", field(v, "key")));
    s.push_str(&format!("<dt>Held</dt><dd>{}</dd>", if held { "yes" } else { "no" }));
    for (label, k) in [
        ("Holder (owner id)", "ownerId"),
        ("Fencing token", "fencingToken"),
        ("Acquired at", "acquiredAt"),
        ("Lease expires at (server clock)", "expiresAt"),
    ] {
        s.push_str(&format!("<dt>{}</dt><dd class=\"mono\">{}</dd>", esc(label), field(v, k)));
    }
    let ms = |k: &str| v.get(k).and_then(Value::as_i64);
    let left = match ms("leaseRemainingMs") {
        Some(l) => format!("{} (by the lock server's judgement)", duration_text(l)),
        None if held => "not reported".to_owned(),
        None => "none: not held".to_owned(),
    };
    s.push_str(&format!("<dt>Lease remaining</dt><dd>{}</dd>", esc(&left)));
    let delay = match ms("lockDelayRemainingMs") {
        Some(d) => format!("{}: nobody is granted the key before it ends", duration_text(d)),
        None => "none running".to_owned(),
    };
    s.push_str(&format!("<dt>Lock-delay</dt><dd>{}</dd>", esc(&delay)));
    s.push_str(&format!("<dt>Waiters</dt><dd class=\"mono\">{}</dd>", field(v, "waiterCount")));
    let floor = match ms("tokenFloor") {
        Some(f) => format!("{f}: every later grant's token exceeds it"),
        None => "not reported".to_owned(),
    };
    s.push_str(&format!("<dt>Token floor</dt><dd>{}</dd></dl>", esc(&floor)));
    if viewer.role == Role::Operator && held {
        let token = v.get("fencingToken").map(|t| display(Some(t))).unwrap_or_default();
        s.push_str(&format!(
            "<section aria-labelledby=\"revoke\"><h2 id=\"revoke\">Revoke</h2>\
             <p class=\"hint\">Revoking raises the token floor, so the current holder's in-flight writes are \
             fenced out at the resources. It does not pay or cancel anything.</p>\
             <form method=\"post\" action=\"/locks/revoke\" class=\"stack\" \
             data-confirm=\"Revoke this lock? The holder will be fenced out.\">{csrf}\
             <input type=\"hidden\" name=\"key\" value=\"{key}\">\
             <div class=\"field\"><label for=\"operator\">Your name (operator)</label>\
             <input id=\"operator\" name=\"operator\" required maxlength=\"64\" autocomplete=\"username\"></div>\
             <div class=\"field\"><label for=\"reason\">Reason (at least 8 characters)</label>\
             <textarea id=\"reason\" name=\"reason\" required minlength=\"8\" maxlength=\"512\" rows=\"3\"></textarea></div>\
             <div class=\"field\"><label for=\"expected_token\">Expected token (revoke only if still this grant)</label>\
             <input id=\"expected_token\" name=\"expected_token\" inputmode=\"numeric\" pattern=\"[0-9]+\" value=\"{token}\" required></div>\
             <button type=\"submit\" class=\"danger\">Revoke</button></form></section>",
            csrf = csrf_field(&viewer.csrf),
            key = esc(key),
            token = esc(&token),
        ));
    }
    if let Some(h) = history {
        s.push_str(&events_table("The key's recent history on the lock server, oldest first", h));
    }
    s
}

/// `/locks` without a key: one page of the keys the lock server holds (C3-extensions
/// E-23), each linked to its own view, with a link to the next page. `paged`: this page
/// follows another (a link back to the first).
pub fn held_keys(page: &Fetched<Value>, paged: bool) -> String {
    let v = match page {
        Ok(v) => v,
        Err(e) => return failed("The held keys", e),
    };
    let ms = |item: &Value, k: &str| item.get(k).and_then(Value::as_i64).map(duration_text);
    let items = v.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
    let rows: Vec<Vec<String>> = items
        .iter()
        .map(|item| {
            let key = str_of(item, "key").unwrap_or_default();
            let held = item.get("held").and_then(Value::as_bool).unwrap_or(false);
            vec![
                format!("<a class=\"mono\" href=\"/locks?key={}\">{}</a>", esc(&pct(key)), esc(key)),
                (if held { "yes" } else { "no: lapsed, not yet removed" }).to_owned(),
                format!("<span class=\"mono\">{}</span>", field(item, "ownerId")),
                format!("<span class=\"mono\">{}</span>", field(item, "fencingToken")),
                esc(&ms(item, "leaseRemainingMs").unwrap_or_else(|| "—".to_owned())),
                esc(&ms(item, "lockDelayRemainingMs").unwrap_or_else(|| "none running".to_owned())),
                format!("<span class=\"mono\">{}</span>", field(item, "tokenFloor")),
            ]
        })
        .collect();
    let head = ["Key", "Held", "Holder (owner id)", "Token", "Lease remaining", "Lock-delay remaining", "Token floor"];
    let mut s = table("Keys with a stored grant, in key order (the lock server's judgement)", &head, &rows);
    let mut links = Vec::new();
    if paged {
        links.push("<a class=\"button\" href=\"/locks\">First page</a>".to_owned());
    }
    if let Some(next) = str_of(v, "nextCursor") {
        let href = format!("/locks?after={}", pct(next));
        links.push(format!("<a class=\"button\" href=\"{}\" rel=\"next\">Next page</a>", esc(&href)));
    }
    if !links.is_empty() {
        s.push_str(&format!("<p>{}</p>", links.join(" ")));
    }
    s
}

/// A duration for people: `12.3 s`, or `850 ms` under a second.
fn duration_text(ms: i64) -> String {
    if ms < 1_000 {
        format!("{ms} ms")
    } else {
        format!("{}.{} s", ms / 1_000, (ms % 1_000) / 100)
    }
}

/// The filter of the events page.
#[derive(Debug, Clone, Default)]
pub struct EventFilterForm {
    pub source: String,
    pub kind: String,
    pub account: String,
    pub payout: String,
    pub lock_key: String,
}

/// The services whose events a page may follow: the filter's `source`, and its label.
pub const EVENT_SOURCES: [(&str, &str); 3] =
    [("payment", "payment-resource"), ("proxy", "rail-proxy"), ("lock", "lock server")];

/// The event kinds a filter may pick (C3-extensions E-20: paydb's kinds, then lockdb's).
pub const EVENT_KINDS: [&str; 17] = [
    "account.created",
    "payout.created",
    "payout.state_changed",
    "fence.raised",
    "fence.refused",
    "rail.mark_raised",
    "rail.intent",
    "rail.refused",
    "rail.outcome",
    "operator.resolution",
    "session.opened",
    "session.expired",
    "lock.granted",
    "lock.renewed",
    "lock.released",
    "lock.expired",
    "lock.revoked",
];

/// `/events`: the recent events of one source, filtered.
pub fn events(f: &EventFilterForm, events: &Fetched<Vec<Value>>, problem: Option<&str>) -> String {
    let mut s = String::from("<h1>Events</h1>");
    let mut sources = String::new();
    for (v, label) in EVENT_SOURCES {
        let sel = if f.source == v { " selected" } else { "" };
        sources.push_str(&format!("<option value=\"{}\"{sel}>{}</option>", esc(v), esc(label)));
    }
    let mut kinds = String::from("<option value=\"\">any</option>");
    for k in EVENT_KINDS {
        let sel = if f.kind == k { " selected" } else { "" };
        kinds.push_str(&format!("<option value=\"{}\"{sel}>{}</option>", esc(k), esc(k)));
    }
    s.push_str(&format!(
        "<form method=\"get\" action=\"/events\" class=\"filters\">\
         <div class=\"field\"><label for=\"source\">Source</label><select id=\"source\" name=\"source\">{sources}</select></div>\
         <div class=\"field\"><label for=\"kind\">Kind</label><select id=\"kind\" name=\"kind\">{kinds}</select></div>\
         <div class=\"field\"><label for=\"account\">Account id</label><input id=\"account\" name=\"account\" value=\"{}\" maxlength=\"128\" autocomplete=\"off\"></div>\
         <div class=\"field\"><label for=\"payout\">Payout id</label><input id=\"payout\" name=\"payout\" value=\"{}\" maxlength=\"128\" autocomplete=\"off\"></div>\
         <div class=\"field\"><label for=\"lockKey\">Lock key</label><input id=\"lockKey\" name=\"lockKey\" value=\"{}\" maxlength=\"128\" autocomplete=\"off\"></div>\
         <button type=\"submit\">Filter</button></form>",
        esc(&f.account),
        esc(&f.payout),
        esc(&f.lock_key)
    ));
    if let Some(p) = problem {
        s.push_str(&notice("bad", &esc(p)));
        return s;
    }
    s.push_str(&events_table("The newest events, oldest first", events));
    s
}

/// `/login`.
pub fn login(problem: Option<&str>) -> String {
    let mut s = String::from("<h1>Sign in</h1>");
    if let Some(p) = problem {
        s.push_str(&notice("bad", &esc(p)));
    }
    s.push_str(
        "<p>Sign in with a dlock bearer token (operator or reader; C3-extensions E-13). The console keeps it \
         on the server for your session and calls the services with it.</p>\
         <form method=\"post\" action=\"/login\" class=\"stack\">\
         <div class=\"field\"><label for=\"token\">Token</label>\
         <input id=\"token\" name=\"token\" type=\"password\" required autocomplete=\"current-password\" maxlength=\"512\"></div>\
         <button type=\"submit\">Sign in</button></form>",
    );
    s
}

/// A short page for an error (`title` and `message` are literal or escaped here).
pub fn error(title: &str, message: &str) -> String {
    format!("<h1>{}</h1><p>{}</p><p><a href=\"/\">Back to the overview</a></p>", esc(title), esc(message))
}

#[cfg(test)]
mod tests {
    use super::*;

    const XSS: &str = "<script>alert(1)</script>\"><img src=x onerror=alert(1)>";

    #[test]
    fn the_overview_says_the_backlogs_age_and_the_last_hours_fenced_out_writes() {
        let at = |t: &str| chrono::DateTime::parse_from_rfc3339(t).expect("time").with_timezone(&chrono::Utc);
        let now = Now(at("2026-12-07T03:00:00Z"));
        let pending = |oldest: Option<&str>| StateCount {
            state: PayoutState::Pending,
            count: Ok((3, false)),
            oldest: oldest.map(str::to_owned),
        };
        let ev = |t: &str| serde_json::json!({"kind": "fence.refused", "at": t, "data": {}});
        let fenced =
            Ok(vec![ev("2026-12-07T01:00:00.000Z"), ev("2026-12-07T02:30:00.000Z"), ev("2026-12-07T02:59:00Z")]);
        let page = overview(now, &[pending(Some("2026-12-07T02:55:00.000Z"))], &fenced, false, &Ok(vec![]));
        assert!(
            page.contains("created at <span class=\"mono\">2026-12-07T02:55:00.000Z</span> (about 5 min ago"),
            "{page}"
        );
        assert!(page.contains("in the last hour: <strong>2</strong>"), "{page}");
        let page = overview(now, &[pending(Some(XSS))], &fenced, true, &Ok(vec![]));
        assert!(page.contains("in the last hour: <strong>at least 2</strong>"), "a full page is a lower bound: {page}");
        assert!(!page.contains("<script>alert(1)") && page.contains("&lt;script&gt;"), "{page}");
        let page = overview(now, &[pending(None)], &Err("down".into()), false, &Ok(vec![]));
        assert!(page.contains("No payout is PENDING.") && page.contains("last hour: unknown"), "{page}");
    }

    #[test]
    fn only_an_operator_gets_a_resolve_form_one_per_payout_each_under_its_own_key() {
        let payout = |id: &str| Ok(serde_json::json!({"payoutId": id, "beneficiaryRef": XSS}));
        let list = Ok((vec![payout("p-1"), payout("p-2")], false));
        let n = std::cell::Cell::new(0);
        let key = || {
            n.set(n.get() + 1);
            format!("key-{}", n.get())
        };
        let reader = Viewer { role: Role::Reader, csrf: "c".into() };
        let page = quarantine(&reader, &list, None, &key);
        assert!(!page.contains("/quarantine/resolve") && !page.contains("name=\"resolved_as\""), "{page}");
        assert_eq!(n.get(), 0, "no key is drawn for a page without forms");
        let operator = Viewer { role: Role::Operator, csrf: "c".into() };
        let page = quarantine(&operator, &list, None, &key);
        assert_eq!(page.matches("action=\"/quarantine/resolve\"").count(), 2);
        assert!(page.contains("value=\"key-1\"") && page.contains("value=\"key-2\""), "{page}");
        assert!(!page.contains("<script>") && !page.contains("<img"), "{page}");
        let entered = ResolveForm {
            payout: "p-2".into(),
            resolved_as: "FAILED".into(),
            reason: XSS.into(),
            rail_reference: XSS.into(),
            operator: XSS.into(),
        };
        let refused = ResolveResult::Invalid { form: entered, why: XSS.into() };
        let page = quarantine(&operator, &list, Some(&refused), &key);
        assert!(!page.contains("<script>") && !page.contains("<img"), "{page}");
        assert_eq!(page.matches(&format!(">{}</textarea>", esc(XSS))).count(), 1, "only p-2's form is refilled");
        assert_eq!(page.matches(" checked").count(), 1, "{page}");
    }

    #[test]
    fn every_event_kind_renders_its_hostile_data_escaped() {
        for kind in EVENT_KINDS.iter().copied().chain(["unknown.kind", XSS]) {
            let data: serde_json::Map<String, Value> = [
                "ownerId",
                "reason",
                "operator",
                "beneficiaryRef",
                "railReference",
                "submissionId",
                "outcome",
                "from",
                "to",
                "operation",
                "currency",
                "state",
                "resolvedAs",
            ]
            .iter()
            .map(|k| ((*k).to_owned(), Value::String(XSS.to_owned())))
            .collect();
            let e = serde_json::json!({"kind": kind, "at": XSS, "accountId": XSS, "payoutId": XSS, "lockKey": XSS, "data": data});
            let html = event_rows(std::slice::from_ref(&e)).concat().concat() + &describe(&e);
            assert!(!html.contains("<script>") && !html.contains("<img"), "{kind}: {html}");
        }
    }
}
