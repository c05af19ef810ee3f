//! HTML building blocks: the one escaping helper ([`esc`]), the page layout, and small
//! helpers that read a field of a service's JSON answer for display.
//!
//! Invariants:
//! - Every value that did not come from a string literal in this crate goes through [`esc`]
//!   before it is put into a page, in text and in attributes alike (it escapes `&`, `<`,
//!   `>`, `"` and `'`, so an attribute value is always double-quoted and cannot be left).
//! - A page holds no inline `<script>` body, no `style=` attribute and no `on…=` handler:
//!   the Content-Security-Policy forbids them, and the JS (`/assets/console.js`) attaches
//!   its handlers itself. Data reaches the JS only through escaped `data-*` attributes.
//! - A URL built from data percent-encodes the data ([`pct`]) and is then escaped.

use dlock_contract::auth::Role;
use serde_json::Value;

/// Escapes `s` for HTML text and for a double- or single-quoted attribute value.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes `s` for a URL path segment or query value (everything but RFC 3986's
/// unreserved characters).
pub fn pct(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            b => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// A JSON value as display text (not yet escaped): a string as is, `null` or absent as an
/// em dash, anything else as its JSON.
pub fn display(v: Option<&Value>) -> String {
    match v {
        None | Some(Value::Null) => "—".to_owned(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Field `key` of `v`, escaped for the page.
pub fn field(v: &Value, key: &str) -> String {
    esc(&display(v.get(key)))
}

/// Field `key` of `v` as a string, if it is one.
pub fn str_of<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// A link to the console's page of payout `id` (escaped, percent-encoded), or an em dash.
pub fn payout_link(id: Option<&str>) -> String {
    match id {
        Some(id) => format!("<a href=\"/payouts/{}\">{}</a>", esc(&pct(id)), esc(id)),
        None => "—".to_owned(),
    }
}

/// The pages of the nav, in order: (path, label).
pub const NAV: [(&str, &str); 6] = [
    ("/", "Overview"),
    ("/payouts", "Payouts"),
    ("/quarantine", "Quarantine"),
    ("/incidents", "Incidents"),
    ("/locks", "Locks"),
    ("/events", "Events"),
];

/// The session a page is rendered for.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub role: Role,
    pub csrf: String,
}

/// One page: its title, which nav entry is current, its main region, and the `/live` URL
/// its main region follows (none: a static page).
#[derive(Debug, Clone)]
pub struct Page {
    pub title: String,
    pub nav: &'static str,
    pub main: String,
    pub live: Option<String>,
}

/// The versioned URLs of the two assets (see `crate::assets`).
pub struct AssetUrls {
    pub css: String,
    pub js: String,
}

/// The whole document for `page`, as seen by `viewer` (none: the login page).
pub fn layout(page: &Page, viewer: Option<&Viewer>, assets: &AssetUrls) -> String {
    let mut nav = String::new();
    if let Some(v) = viewer {
        nav.push_str("<nav aria-label=\"Main\"><ul>");
        for (path, label) in NAV {
            let current = if path == page.nav { " aria-current=\"page\"" } else { "" };
            nav.push_str(&format!("<li><a href=\"{}\"{current}>{}</a></li>", esc(path), esc(label)));
        }
        nav.push_str("</ul></nav>");
        nav.push_str(&format!(
            "<div class=\"who\"><span class=\"role\">Signed in as <strong>{}</strong></span>\
             <span id=\"live-status\" class=\"live-status\" role=\"status\" aria-live=\"polite\"></span>\
             <form method=\"post\" action=\"/logout\" class=\"inline\">{}<button type=\"submit\">Log out</button></form></div>",
            esc(v.role.as_str()),
            csrf_field(&v.csrf)
        ));
    }
    let live = match &page.live {
        Some(url) => format!(" data-live=\"{}\"", esc(url)),
        None => String::new(),
    };
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <meta name=\"referrer\" content=\"same-origin\">\
         <title>{title} · dlock console</title>\
         <link rel=\"stylesheet\" href=\"{css}\">\
         <script src=\"{js}\" defer></script></head>\
         <body><a class=\"skip\" href=\"#main\">Skip to content</a>\
         <header class=\"top\"><span class=\"brand\">dlock console</span>{nav}</header>\
         <main id=\"main\" tabindex=\"-1\"{live}>{main}</main></body></html>\n",
        title = esc(&page.title),
        css = esc(&assets.css),
        js = esc(&assets.js),
        main = page.main,
    )
}

/// The hidden CSRF field every POST form carries.
pub fn csrf_field(csrf: &str) -> String {
    format!("<input type=\"hidden\" name=\"csrf\" value=\"{}\">", esc(csrf))
}

/// A notice box: `kind` is `info`, `warn` or `bad`; `html` is already escaped.
pub fn notice(kind: &str, html: &str) -> String {
    format!("<div class=\"notice {}\" role=\"status\">{html}</div>", esc(kind))
}

/// A table: `head` are literal labels, each row's cells are already-escaped HTML.
pub fn table(caption: &str, head: &[&str], rows: &[Vec<String>]) -> String {
    let mut s = format!("<div class=\"scroll\"><table><caption>{}</caption><thead><tr>", esc(caption));
    for h in head {
        s.push_str(&format!("<th scope=\"col\">{}</th>", esc(h)));
    }
    s.push_str("</tr></thead><tbody>");
    if rows.is_empty() {
        s.push_str(&format!("<tr><td colspan=\"{}\">None.</td></tr>", head.len().max(1)));
    }
    for r in rows {
        s.push_str("<tr>");
        for c in r {
            s.push_str(&format!("<td>{c}</td>"));
        }
        s.push_str("</tr>");
    }
    s.push_str("</tbody></table></div>");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn esc_leaves_no_character_that_can_open_a_tag_or_leave_an_attribute() {
        let raw = "<script>alert(1)</script>\"'><img src=x onerror=alert(1)>&";
        let e = esc(raw);
        for c in ['<', '>', '"', '\''] {
            assert!(!e.contains(c), "{e}");
        }
        assert_eq!(esc("a&b"), "a&amp;b");
        assert_eq!(esc("<b>"), "&lt;b&gt;");
    }

    #[test]
    fn pct_keeps_only_unreserved_characters() {
        assert_eq!(pct("a b/c?d=\"<"), "a%20b%2Fc%3Fd%3D%22%3C");
        assert_eq!(pct("payout:acct-1.x_y~"), "payout%3Aacct-1.x_y~");
    }

    #[test]
    fn a_payout_link_of_a_hostile_id_stays_inside_its_attribute() {
        let l = payout_link(Some("\"><img src=x onerror=alert(1)>"));
        assert!(!l.contains("<img"), "{l}");
        assert!(l.starts_with("<a href=\"/payouts/%22%3E%3Cimg"), "{l}");
    }
}
