//! Authentication and roles (C3-extensions E-13): the pure parts every service and client
//! share — the three [`Role`]s, the per-endpoint role tables, the credential-file parser, a
//! constant-time token check and the redacting [`Secret`].
//!
//! Invariants:
//! - A token is never printed: [`Secret`]'s `Debug` and `Display` are `***`, and no parse
//!   error echoes the content of a line (only the file and the line number).
//! - A token check does the same work whatever the content: both sides are hashed to a
//!   fixed-length SHA-256 digest and the digests are folded without an early exit
//!   ([`digest_eq`]); a lookup ([`CredentialSet::find`]) compares against every entry.
//! - Authorization depends on method and route pattern only ([`need_for`]), never on
//!   whether the addressed resource exists.
//! - Roles do not nest upwards: a worker and an operator may read (they hold [`Role::Reader`]'s
//!   rights too), an operator can never do a worker's write (claim/post/submit move money)
//!   and a worker can never do an operator's (revoke, create).

use std::collections::BTreeSet;

use sha2::{Digest, Sha256};

/// Longest credential token accepted (bytes); a longer one is a malformed line.
pub const TOKEN_BYTES_MAX: usize = 512;
/// Shortest credential token accepted (bytes): below this a token is guessable.
pub const TOKEN_BYTES_MIN: usize = 16;
/// Most owner ids one credential may be bound to.
pub const OWNERS_PER_CREDENTIAL_MAX: usize = 64;
/// Most credentials one file may hold.
pub const CREDENTIALS_MAX: usize = 1_024;

/// A caller's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Sessions, acquire, renew, release, claim, post, submit — and every read.
    Worker,
    /// Revoke, create accounts and payouts, resolve a quarantined payout, console actions —
    /// and every read.
    Operator,
    /// The advisory GETs and metrics only.
    Reader,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Worker, Role::Operator, Role::Reader];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Worker => "worker",
            Role::Operator => "operator",
            Role::Reader => "reader",
        }
    }

    pub fn parse(s: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Whether this role may call an endpoint that needs `need`.
    pub fn may(self, need: Need) -> bool {
        match need {
            Need::Open | Need::Read => true,
            Need::Role(r) => r == self,
            Need::Nobody => false,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an endpoint needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// No credential at all (health endpoints).
    Open,
    /// Any valid credential (the advisory GETs, metrics; also an unknown route or method,
    /// so an anonymous caller learns nothing about which routes exist).
    Read,
    /// Exactly this role.
    Role(Role),
    /// No role: a write (any method but GET/HEAD) on a route the table does not list. A
    /// route added without a row is refused to everyone (fail closed), never open to all.
    Nobody,
}

/// One row of a service's role table: `method` and a route `pattern` whose `{name}`
/// segments match any one non-empty path segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteRule {
    pub method: &'static str,
    pub pattern: &'static str,
    pub need: Need,
}

const fn rule(method: &'static str, pattern: &'static str, need: Need) -> RouteRule {
    RouteRule { method, pattern, need }
}

const W: Need = Need::Role(Role::Worker);
const O: Need = Need::Role(Role::Operator);
const R: Need = Need::Read;
const OPEN: Need = Need::Open;

/// The health endpoints, open on every service; metrics and the OpenAPI document
/// (C3-extensions E-16) need any valid credential.
pub const HEALTH_ROUTES: &[RouteRule] = &[
    rule("GET", "/health/live", OPEN),
    rule("GET", "/health/ready", OPEN),
    rule("GET", "/metrics", R),
    rule("GET", "/v1/openapi.json", R),
];

/// The lock server's role table (C3 §3.3).
pub const LOCK_SERVER_ROUTES: &[RouteRule] = &[
    rule("POST", "/v1/sessions", W),
    rule("POST", "/v1/sessions/{sessionId}/heartbeat", W),
    rule("DELETE", "/v1/sessions/{sessionId}", W),
    rule("POST", "/v1/locks/{key}/acquire", W),
    rule("POST", "/v1/locks/{key}/renew", W),
    rule("POST", "/v1/locks/{key}/rotate", W),
    rule("DELETE", "/v1/locks/{key}", W),
    rule("POST", "/v1/locks/{key}/revoke", O),
    rule("GET", "/v1/locks/{key}", R),
    rule("GET", "/v1/locks", R),
    rule("GET", "/v1/events", R),
    rule("GET", "/v1/events/recent", R),
];

/// The payment-resource's role table (C3 §3.4).
pub const PAYMENT_ROUTES: &[RouteRule] = &[
    rule("POST", "/v1/accounts", O),
    rule("GET", "/v1/accounts/{accountId}", R),
    rule("POST", "/v1/payouts", O),
    rule("GET", "/v1/payouts", R),
    rule("GET", "/v1/payouts/{payoutId}", R),
    rule("POST", "/v1/payouts/{payoutId}/resolution", O),
    rule("POST", "/v1/payouts/{payoutId}/claim", W),
    rule("POST", "/v1/payouts/{payoutId}/post", W),
    rule("POST", "/v1/accounts/{accountId}/claims", W),
    rule("POST", "/v1/accounts/{accountId}/posts", W),
    rule("GET", "/v1/events", R),
    rule("GET", "/v1/events/recent", R),
];

/// The rail-proxy's role table (C3 §3.5).
pub const RAIL_PROXY_ROUTES: &[RouteRule] = &[
    rule("POST", "/v1/rail/submissions", W),
    rule("POST", "/v1/rail/submission-batches", W),
    rule("GET", "/v1/events", R),
    rule("GET", "/v1/events/recent", R),
];

/// The executor serves only health and metrics.
pub const EXECUTOR_ROUTES: &[RouteRule] = &[];

/// Every service's table (health first), for a caller that talks to all of them.
pub fn all_routes() -> impl Iterator<Item = &'static RouteRule> {
    HEALTH_ROUTES.iter().chain(LOCK_SERVER_ROUTES).chain(PAYMENT_ROUTES).chain(RAIL_PROXY_ROUTES).chain(EXECUTOR_ROUTES)
}

fn matches(pattern: &str, path: &str) -> bool {
    let mut p = pattern.split('/');
    let mut s = path.split('/');
    loop {
        match (p.next(), s.next()) {
            (None, None) => return true,
            (Some(want), Some(got)) => {
                let wild = want.starts_with('{') && want.ends_with('}');
                if (wild && got.is_empty()) || (!wild && want != got) {
                    return false;
                }
            }
            _ => return false,
        }
    }
}

/// What `method path` needs under `table` (plus [`HEALTH_ROUTES`]): the matching row's
/// need; else, for a GET or HEAD, [`Need::Read`] (an unknown route still needs a
/// credential, then the router answers 404/405), and for any other method
/// [`Need::Nobody`] (fail closed: a write the table does not list is refused to all).
pub fn need_for<'a>(table: impl IntoIterator<Item = &'a RouteRule>, method: &str, path: &str) -> Need {
    let path = path.split('?').next().unwrap_or_default();
    // The router answers HEAD on every GET route: it needs what the GET needs.
    let method = if method.eq_ignore_ascii_case("HEAD") { "GET" } else { method };
    HEALTH_ROUTES
        .iter()
        .chain(table)
        .find(|r| r.method.eq_ignore_ascii_case(method) && matches(r.pattern, path))
        .map_or(if method.eq_ignore_ascii_case("GET") { Need::Read } else { Need::Nobody }, |r| r.need)
}

/// A secret string whose `Debug` and `Display` print `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: impl Into<String>) -> Secret {
        Secret(s.into())
    }

    /// The secret itself: only for the one place that puts it on the wire.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

/// A bearer token (the value after `Authorization: Bearer `).
pub type BearerToken = Secret;

/// The SHA-256 digest of `bytes`.
pub fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// Whether two digests are equal, folding every byte (no early exit on content).
pub fn digest_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    diff == 0
}

/// Constant-time equality of two tokens of any length: compares their digests.
pub fn token_eq(a: &[u8], b: &[u8]) -> bool {
    digest_eq(&digest(a), &digest(b))
}

/// Whether a credential bound to `owners` (`None`: unbound) may act as `owner`: an entry
/// names one owner id exactly, or, ending in `*`, every owner id starting with the rest.
pub fn may_act_as(owners: Option<&BTreeSet<String>>, owner: &str) -> bool {
    owners.is_none_or(|o| {
        o.iter().any(|id| match id.strip_suffix('*') {
            Some(prefix) => owner.starts_with(prefix),
            None => id == owner,
        })
    })
}

/// One credential: a role, its token's digest and the owner ids it may act as (`None`:
/// any owner).
#[derive(Clone, PartialEq, Eq)]
pub struct Credential {
    pub role: Role,
    digest: [u8; 32],
    pub owners: Option<BTreeSet<String>>,
}

impl Credential {
    pub fn new(role: Role, token: &Secret, owners: Option<BTreeSet<String>>) -> Credential {
        Credential { role, digest: digest(token.expose().as_bytes()), owners }
    }

    /// Whether this credential may act as `owner`: an entry names one owner id exactly,
    /// or, ending in `*`, every owner id that starts with what precedes it (`exec-1/*`: the
    /// tasks of executor `exec-1`, whose owner ids are `exec-1/<task>`).
    pub fn may_act_as(&self, owner: &str) -> bool {
        may_act_as(self.owners.as_ref(), owner)
    }

    pub fn digest(&self) -> &[u8; 32] {
        &self.digest
    }
}

impl std::fmt::Debug for Credential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credential")
            .field("role", &self.role)
            .field("token", &"***")
            .field("owners", &self.owners)
            .finish()
    }
}

/// A parsed credentials file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CredentialSet {
    pub entries: Vec<Credential>,
}

impl CredentialSet {
    /// The credential whose token is `token`, comparing against every entry.
    pub fn find(&self, token: &[u8]) -> Option<&Credential> {
        self.find_digest(&digest(token))
    }

    /// [`CredentialSet::find`] by the token's [`digest`], comparing against every entry.
    pub fn find_digest(&self, d: &[u8; 32]) -> Option<&Credential> {
        let mut found = None;
        for c in &self.entries {
            let eq = digest_eq(d, &c.digest);
            if eq && found.is_none() {
                found = Some(c);
            }
        }
        found
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_graphic()
}

/// Parses a credentials file (`source` names it in errors):
/// one `<role> <token> [owners=<id>[,<id>...]]` per line, `#` comments and blank lines
/// ignored. An error names the source and the line number, never the line's content.
pub fn parse_credentials(text: &str, source: &str) -> Result<CredentialSet, String> {
    let mut set = CredentialSet::default();
    for (n, raw) in text.lines().enumerate() {
        let line_no = n + 1;
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = |why: &str| format!("credentials {source}, line {line_no}: {why}");
        let mut words = line.split_whitespace();
        let role = words.next().unwrap_or_default();
        let role = Role::parse(role).ok_or_else(|| bad("the first word must be worker, operator or reader"))?;
        let token = words.next().ok_or_else(|| bad("a role must be followed by a token"))?;
        if token.len() < TOKEN_BYTES_MIN || token.len() > TOKEN_BYTES_MAX || !token.chars().all(is_token_char) {
            return Err(bad(&format!(
                "the token must be {TOKEN_BYTES_MIN}..={TOKEN_BYTES_MAX} printable ASCII characters"
            )));
        }
        let mut owners = None;
        for extra in words {
            let Some(list) = extra.strip_prefix("owners=") else {
                return Err(bad("after the token only owners=<id>[,<id>...] may follow"));
            };
            if owners.is_some() {
                return Err(bad("owners= is given twice"));
            }
            let ids: BTreeSet<String> = list.split(',').map(str::to_owned).collect();
            if ids.iter().any(|id| crate::OwnerId::parse(id).is_err()) {
                return Err(bad("owners= must list valid owner ids separated by commas"));
            }
            if ids.len() > OWNERS_PER_CREDENTIAL_MAX {
                return Err(bad(&format!("at most {OWNERS_PER_CREDENTIAL_MAX} owners per credential")));
            }
            owners = Some(ids);
        }
        let cred = Credential::new(role, &Secret::new(token), owners);
        if set.find(token.as_bytes()).is_some() {
            return Err(bad("this token is already listed on an earlier line"));
        }
        if set.entries.len() >= CREDENTIALS_MAX {
            return Err(bad(&format!("at most {CREDENTIALS_MAX} credentials per file")));
        }
        set.entries.push(cred);
    }
    Ok(set)
}

/// The token of an `Authorization` header value, if it is `Bearer <token>`.
pub fn bearer_of(header: &str) -> Option<&str> {
    let (scheme, rest) = header.split_once(' ')?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// Hex of `bytes` (lower case): how generated tokens are written.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const T1: &str = "0123456789abcdef0123";
    const T2: &str = "fedcba9876543210fedc";

    #[test]
    fn a_credentials_file_parses_roles_tokens_owners_and_skips_comments() {
        let text = format!("# local\n\nworker {T1} owners=exec-1,exec-2\n  operator {T2}  \n");
        let set = parse_credentials(&text, "f").expect("parse");
        assert_eq!(set.len(), 2);
        let w = set.find(T1.as_bytes()).expect("worker");
        assert_eq!(w.role, Role::Worker);
        assert!(w.may_act_as("exec-1") && w.may_act_as("exec-2") && !w.may_act_as("exec-3"));
        let o = set.find(T2.as_bytes()).expect("operator");
        assert_eq!((o.role, o.may_act_as("anyone")), (Role::Operator, true));
        assert!(set.find(b"nope-nope-nope-nope").is_none());
    }

    #[test]
    fn an_owner_entry_ending_in_a_star_binds_every_owner_id_with_that_prefix() {
        let text = format!("worker {T1} owners=exec-1/*,w-9\n");
        let w = parse_credentials(&text, "f").expect("parse").find(T1.as_bytes()).cloned().expect("worker");
        assert!(w.may_act_as("exec-1/0") && w.may_act_as("exec-1/17") && w.may_act_as("w-9"));
        assert!(!w.may_act_as("exec-2/0") && !w.may_act_as("exec-1") && !w.may_act_as("w-9/0"));
    }

    #[test]
    fn malformed_lines_name_the_file_and_line_and_never_echo_the_token() {
        let cases = [
            format!("admin {T1}"),
            "worker".to_owned(),
            "worker short".to_owned(),
            format!("worker {T1} owners="),
            format!("worker {T1} owners=a,,b"),
            format!("worker {T1} extra"),
            format!("worker {T1} owners=a owners=b"),
            format!("worker {}", "x".repeat(TOKEN_BYTES_MAX + 1)),
        ];
        for bad in cases {
            let text = format!("# header\nreader {T2}\n{bad}\n");
            let err = parse_credentials(&text, "/etc/dlock/creds").expect_err(&bad);
            assert!(err.contains("/etc/dlock/creds") && err.contains("line 3"), "{err}");
            assert!(!err.contains(T1) && !err.contains(T2) && !err.contains("short"), "{err}");
        }
    }

    #[test]
    fn a_duplicate_token_is_refused_even_under_another_role() {
        let err = parse_credentials(&format!("worker {T1}\nreader {T1}\n"), "f").expect_err("dup");
        assert!(err.contains("line 2") && err.contains("already listed"), "{err}");
    }

    #[test]
    fn token_comparison_is_by_digest_and_exact() {
        assert!(token_eq(T1.as_bytes(), T1.as_bytes()));
        assert!(!token_eq(T1.as_bytes(), T2.as_bytes()));
        assert!(!token_eq(T1.as_bytes(), &T1.as_bytes()[..T1.len() - 1]));
        assert!(!token_eq(b"", T1.as_bytes()));
        let (a, mut b) = (digest(b"x"), digest(b"x"));
        assert!(digest_eq(&a, &b));
        b[31] ^= 1;
        assert!(!digest_eq(&a, &b));
        b[31] ^= 1;
        b[0] ^= 0x80;
        assert!(!digest_eq(&a, &b));
    }

    #[test]
    fn secrets_and_credentials_redact_their_debug_and_display() {
        let s = Secret::new(T1);
        assert_eq!(format!("{s:?} {s}"), "*** ***");
        let c = Credential::new(Role::Worker, &s, None);
        let shown = format!("{c:?} {:?}", CredentialSet { entries: vec![c.clone()] });
        assert!(!shown.contains(T1) && shown.contains("***"), "{shown}");
    }

    #[test]
    fn the_role_tables_give_each_endpoint_its_role_and_unknown_routes_need_a_credential() {
        let lock = || LOCK_SERVER_ROUTES.iter();
        assert_eq!(need_for(lock(), "POST", "/v1/locks/a/acquire"), Need::Role(Role::Worker));
        assert_eq!(need_for(lock(), "POST", "/v1/locks/a/revoke"), Need::Role(Role::Operator));
        assert_eq!(need_for(lock(), "GET", "/v1/locks/a?x=1"), Need::Read);
        assert_eq!(need_for(lock(), "GET", "/v1/locks?prefix=a"), Need::Read);
        assert_eq!(need_for(lock(), "POST", "/v1/locks"), Need::Nobody);
        assert_eq!(need_for(lock(), "DELETE", "/v1/locks/a"), Need::Role(Role::Worker));
        assert_eq!(need_for(lock(), "GET", "/health/live"), Need::Open);
        assert_eq!(need_for(lock(), "HEAD", "/health/ready"), Need::Open);
        assert_eq!(need_for(lock(), "GET", "/nope"), Need::Read);
        assert_eq!(need_for(lock(), "POST", "/v1/locks//acquire"), Need::Nobody);
        assert_eq!(need_for(lock(), "PUT", "/v1/locks/a"), Need::Nobody);
        assert!(Role::ALL.iter().all(|r| !r.may(Need::Nobody)), "an unlisted write is refused to every role");
        let pay = || PAYMENT_ROUTES.iter();
        assert_eq!(need_for(pay(), "POST", "/v1/payouts"), Need::Role(Role::Operator));
        assert_eq!(need_for(pay(), "POST", "/v1/payouts/p/claim"), Need::Role(Role::Worker));
        assert_eq!(need_for(pay(), "POST", "/v1/payouts/p/resolution"), Need::Role(Role::Operator));
        assert_eq!(need_for(pay(), "GET", "/v1/payouts/p"), Need::Read);
        assert_eq!(need_for(pay(), "POST", "/v1/accounts/a/claims"), Need::Role(Role::Worker));
        assert_eq!(need_for(pay(), "POST", "/v1/accounts/a/posts"), Need::Role(Role::Worker));
        let proxy = || RAIL_PROXY_ROUTES.iter();
        assert_eq!(need_for(proxy(), "POST", "/v1/rail/submission-batches"), Need::Role(Role::Worker));
        assert!(Role::Operator.may(Need::Read) && Role::Worker.may(Need::Read) && Role::Reader.may(Need::Read));
        assert!(!Role::Operator.may(Need::Role(Role::Worker)) && !Role::Worker.may(Need::Role(Role::Operator)));
        assert!(!Role::Reader.may(Need::Role(Role::Worker)));
    }

    #[test]
    fn only_a_bearer_authorization_carries_a_token() {
        assert_eq!(bearer_of("Bearer abc"), Some("abc"));
        assert_eq!(bearer_of("bearer abc"), Some("abc"));
        assert_eq!(bearer_of("Basic abc"), None);
        assert_eq!(bearer_of("Bearer "), None);
        assert_eq!(bearer_of("Bearer"), None);
    }
}
