//! Authentication and roles for every service (C3-extensions E-13): the `auth.*` keys, the
//! live credential set with rotation, and the middleware that answers `401
//! UNAUTHENTICATED` / `403 FORBIDDEN`.
//!
//! The middleware runs before routing and decides on method + route pattern only (the
//! service's table in [`dlock_contract::auth`]), so neither answer says whether the addressed
//! resource exists, and an unknown route without a credential is 401, not 404. The health
//! endpoints are open. A credential bound to owner ids is refused (`403`) when `X-Owner-Id`
//! names another owner; handlers that take an owner from a body check it against the
//! [`Principal`] the middleware leaves in the request's extensions ([`check_owner`]).
//!
//! Rotation: with `auth.credentials-file`, the file is re-read every
//! `auth.reload-interval-ms` (on the runtime clock) and on SIGHUP. A credential that
//! disappears from the file stays valid for `auth.rotation-overlap-ms` more; a malformed
//! file keeps the current set (logged), so a bad edit never locks everyone out.
//!
//! Invariants: a token never reaches a log or an answer; a token lookup compares against
//! every live credential ([`dlock_contract::auth::CredentialSet::find`]); a retired
//! credential is accepted only before its deadline.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use dlock_config::{Layers, Profile};
use dlock_contract::auth::{
    bearer_of, digest, need_for, parse_credentials, Credential, CredentialSet, Need, Role, RouteRule, Secret,
};
use dlock_contract::ErrorCode;
use dlock_rt::{Clock, Duration, Instant};

use crate::ApiError;

/// Every key this module reads (the same in every service).
pub const KEYS: &[&str] = &[
    "auth.enabled",
    "auth.credentials-file",
    "auth.credentials",
    "auth.rotation-overlap-ms",
    "auth.reload-interval-ms",
];

/// Default `auth.rotation-overlap-ms`: how long a credential removed from the file stays valid.
pub const ROTATION_OVERLAP_MS_DEFAULT: u64 = 300_000;
/// Default `auth.reload-interval-ms`: how often the credentials file is checked.
pub const RELOAD_INTERVAL_MS_DEFAULT: u64 = 1_000;
/// Smallest `auth.reload-interval-ms` honoured (smaller values are raised to it).
pub const RELOAD_INTERVAL_MS_MIN: u64 = 10;
/// Largest credentials file read (bytes).
pub const CREDENTIALS_FILE_BYTES_MAX: u64 = 1024 * 1024;

/// The resolved `auth.*` keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthSettings {
    pub enabled: bool,
    pub credentials_file: Option<PathBuf>,
    /// Inline credentials (same format as the file), e.g. from `DLOCK_AUTH_CREDENTIALS`.
    pub credentials: Option<Secret>,
    pub rotation_overlap_ms: u64,
    pub reload_interval_ms: u64,
}

impl AuthSettings {
    /// Authentication off: what an in-process test rig that builds a service from its
    /// `Default` config gets. Every process, `dlock up`/`demo` and the simulation resolve
    /// the keys instead ([`resolve`]), where it is on by default.
    pub fn disabled() -> AuthSettings {
        AuthSettings {
            enabled: false,
            credentials_file: None,
            credentials: None,
            rotation_overlap_ms: ROTATION_OVERLAP_MS_DEFAULT,
            reload_interval_ms: RELOAD_INTERVAL_MS_DEFAULT,
        }
    }

    /// Authentication on with `credentials` inline.
    pub fn inline(credentials: &str) -> AuthSettings {
        AuthSettings { enabled: true, credentials: Some(Secret::new(credentials)), ..AuthSettings::disabled() }
    }
}

/// Resolves the `auth.*` keys. `auth.enabled=false` is refused outside `unsafe-test`; with
/// auth on, no credentials (or credentials that do not parse) is an error.
pub fn resolve(layers: &Layers, profile: Profile) -> Result<AuthSettings, String> {
    let enabled = dlock_config::safety_switch(
        layers,
        profile,
        "auth.enabled",
        "without it any caller may acquire, claim, submit or revoke",
    )?;
    let settings = AuthSettings {
        enabled,
        credentials_file: layers
            .get_opt::<String>("auth.credentials-file")?
            .filter(|s| !s.is_empty())
            .map(PathBuf::from),
        credentials: layers.get_opt::<String>("auth.credentials")?.filter(|s| !s.trim().is_empty()).map(Secret::new),
        rotation_overlap_ms: layers.get("auth.rotation-overlap-ms", ROTATION_OVERLAP_MS_DEFAULT)?,
        reload_interval_ms: layers.get("auth.reload-interval-ms", RELOAD_INTERVAL_MS_DEFAULT)?,
    };
    if enabled {
        initial_set(&settings)?;
    }
    Ok(settings)
}

/// The warning a service logs when authentication is off.
pub fn unsafe_warning(s: &AuthSettings) -> Option<String> {
    (!s.enabled).then(|| "auth.enabled=false: every caller is trusted with every role".to_owned())
}

fn read_file(path: &Path) -> Result<(String, Stamp), String> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read the credentials file {shown}: {e}"))?;
    if meta.len() > CREDENTIALS_FILE_BYTES_MAX {
        return Err(format!("the credentials file {shown} is larger than {CREDENTIALS_FILE_BYTES_MAX} bytes"));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read the credentials file {shown}: {e}"))?;
    Ok((text, (meta.modified().ok(), meta.len())))
}

/// The credentials at start-up: the file's and the inline ones together.
fn initial_set(s: &AuthSettings) -> Result<(CredentialSet, Option<Stamp>, [u8; 32]), String> {
    let mut set = CredentialSet::default();
    let mut stamp = None;
    let mut file_digest = [0; 32];
    if let Some(path) = &s.credentials_file {
        let (text, st) = read_file(path)?;
        set = parse_credentials(&text, &path.display().to_string())?;
        stamp = Some(st);
        file_digest = digest(text.as_bytes());
    }
    if let Some(inline) = &s.credentials {
        let more = parse_credentials(inline.expose(), "auth.credentials")?;
        merge(&mut set, more, "auth.credentials")?;
    }
    if set.is_empty() {
        return Err("auth is on (auth.enabled) and no credentials are configured: set auth.credentials-file \
                    (DLOCK_AUTH_CREDENTIALS_FILE) or auth.credentials (DLOCK_AUTH_CREDENTIALS); \
                    `dlock up` and `dlock demo` generate a local file"
            .to_owned());
    }
    Ok((set, stamp, file_digest))
}

fn merge(set: &mut CredentialSet, more: CredentialSet, source: &str) -> Result<(), String> {
    for c in more.entries {
        if set.entries.iter().any(|e| e.digest() == c.digest()) {
            return Err(format!("credentials {source}: a token is listed twice (file and inline)"));
        }
        set.entries.push(c);
    }
    Ok(())
}

type Stamp = (Option<std::time::SystemTime>, u64);

/// The caller the middleware authenticated, in the request's extensions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub role: Role,
    pub owners: Option<BTreeSet<String>>,
    /// The credential's SHA-256 digest: who the caller is, for what binds to a caller (an
    /// event cursor, C3-extensions E-20). Never printed; a cursor carries only a keyed tag
    /// of it ([`crate::stream`]).
    pub subject: [u8; 32],
}

impl Principal {
    pub fn may_act_as(&self, owner: &str) -> bool {
        dlock_contract::auth::may_act_as(self.owners.as_ref(), owner)
    }
}

/// `403 FORBIDDEN` unless `principal` (absent: auth is off) may act as `owner`.
pub fn check_owner(principal: Option<&Principal>, owner: &str) -> Result<(), ApiError> {
    match principal {
        Some(p) if !p.may_act_as(owner) => Err(forbidden_owner()),
        _ => Ok(()),
    }
}

fn forbidden_owner() -> ApiError {
    ApiError::new(ErrorCode::Forbidden, "this credential is not bound to the owner id it names")
}

struct Live {
    current: CredentialSet,
    /// Credentials removed by a reload, valid until their deadline.
    retiring: Vec<(Credential, Instant)>,
    file_stamp: Option<Stamp>,
    file_digest: [u8; 32],
}

/// A service's live credentials and role table.
pub struct Authenticator {
    service: &'static str,
    table: &'static [RouteRule],
    settings: AuthSettings,
    clock: Clock,
    live: Mutex<Live>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator").field("service", &self.service).finish_non_exhaustive()
    }
}

impl Authenticator {
    /// Loads the credentials (an error names the file and line, never a token). `None` when
    /// auth is off (a warning is logged).
    pub fn new(
        service: &'static str,
        table: &'static [RouteRule],
        settings: &AuthSettings,
        clock: Clock,
    ) -> Result<Option<Arc<Authenticator>>, String> {
        if let Some(w) = unsafe_warning(settings) {
            tracing::warn!(service, "{w}");
            return Ok(None);
        }
        let (current, file_stamp, file_digest) = initial_set(settings).map_err(|e| format!("{service}: {e}"))?;
        let live = Live { current, retiring: Vec::new(), file_stamp, file_digest };
        Ok(Some(Arc::new(Authenticator { service, table, settings: settings.clone(), clock, live: Mutex::new(live) })))
    }

    /// Starts the reload task (the file every `auth.reload-interval-ms`, and SIGHUP);
    /// `None` without a credentials file (inline credentials cannot change).
    pub fn spawn_reloader(self: &Arc<Self>) -> Option<dlock_rt::JoinHandle<()>> {
        self.settings.credentials_file.as_ref()?;
        let me = self.clone();
        // Listening starts now, before the task first runs: a SIGHUP from here on reloads.
        let mut hangups = dlock_rt::signal::Hangups::new();
        Some(dlock_rt::spawn(async move {
            let every = Duration::from_millis(me.settings.reload_interval_ms.max(RELOAD_INTERVAL_MS_MIN));
            loop {
                let forced = tokio::select! {
                    () = dlock_rt::sleep(every) => false,
                    () = hangups.next() => true,
                };
                me.reload(forced);
            }
        }))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Live> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Re-reads the credentials file if it changed (`forced`: whatever its stamp). A file
    /// that cannot be read or parsed keeps the current set.
    pub fn reload(&self, forced: bool) {
        let Some(path) = &self.settings.credentials_file else { return };
        let stamp = std::fs::metadata(path).ok().map(|m| (m.modified().ok(), m.len()));
        let seen = self.lock().file_stamp;
        if !forced && stamp.is_some() && stamp == seen {
            return;
        }
        let (text, stamp) = match read_file(path) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(service = self.service, error = %e, "credentials_reload_failed_kept_current");
                return;
            }
        };
        let d = digest(text.as_bytes());
        {
            let mut live = self.lock();
            if live.file_digest == d {
                // Touched, not changed.
                live.file_stamp = Some(stamp);
                return;
            }
        }
        let parsed = parse_credentials(&text, &path.display().to_string()).and_then(|mut set| {
            if let Some(inline) = &self.settings.credentials {
                merge(&mut set, parse_credentials(inline.expose(), "auth.credentials")?, "auth.credentials")?;
            }
            if set.is_empty() {
                return Err(format!("the credentials file {} lists no credential", path.display()));
            }
            Ok(set)
        });
        let set = match parsed {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(service = self.service, error = %e, "credentials_reload_failed_kept_current");
                return;
            }
        };
        let now = self.clock.now();
        let deadline = now + Duration::from_millis(self.settings.rotation_overlap_ms);
        let mut live = self.lock();
        let removed: Vec<Credential> = live
            .current
            .entries
            .iter()
            .filter(|c| !set.entries.iter().any(|n| n.digest() == c.digest()))
            .cloned()
            .collect();
        live.retiring.retain(|(c, until)| *until > now && !set.entries.iter().any(|n| n.digest() == c.digest()));
        let retired = removed.len();
        live.retiring.extend(removed.into_iter().map(|c| (c, deadline)));
        let count = set.len();
        live.current = set;
        live.file_stamp = Some(stamp);
        live.file_digest = d;
        tracing::info!(
            service = self.service,
            credentials = count,
            retiring = retired,
            overlap_ms = self.settings.rotation_overlap_ms,
            "credentials_reloaded"
        );
    }

    /// The credential `token` names, if it is live (current, or retiring before its deadline).
    pub fn authenticate(&self, token: &[u8]) -> Option<Credential> {
        let now = self.clock.now();
        let live = self.lock();
        let d = digest(token);
        let current = live.current.find_digest(&d).cloned();
        let mut retiring = None;
        for (c, until) in &live.retiring {
            let hit = dlock_contract::auth::digest_eq(&d, c.digest());
            if hit && *until > now && retiring.is_none() {
                retiring = Some(c.clone());
            }
        }
        current.or(retiring)
    }

    /// The answer for a request, or the principal to attach: method + route + headers only.
    pub fn decide(
        &self,
        method: &str,
        path: &str,
        headers: &axum::http::HeaderMap,
    ) -> Result<Option<Principal>, ApiError> {
        let need = need_for(self.table, method, path);
        if need == Need::Open {
            return Ok(None);
        }
        let token = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer_of)
            .ok_or_else(|| {
                ApiError::new(ErrorCode::Unauthenticated, "a credential is required: Authorization: Bearer <token>")
            })?;
        let cred = self.authenticate(token.as_bytes()).ok_or_else(|| {
            ApiError::new(ErrorCode::Unauthenticated, "the credential is not valid here (unknown, or retired)")
        })?;
        if !cred.role.may(need) {
            return Err(ApiError::new(
                ErrorCode::Forbidden,
                format!("a {} credential may not call {method} on this route", cred.role),
            ));
        }
        if let Some(owner) = headers.get(dlock_contract::HEADER_OWNER_ID) {
            let ok = owner.to_str().is_ok_and(|o| cred.may_act_as(o.trim()));
            if !ok {
                return Err(forbidden_owner());
            }
        }
        Ok(Some(Principal { role: cred.role, owners: cred.owners.clone(), subject: *cred.digest() }))
    }
}

/// The middleware: see the module doc.
pub async fn middleware(State(auth): State<Arc<Authenticator>>, mut req: Request, next: Next) -> Response {
    match auth.decide(req.method().as_str(), req.uri().path(), req.headers()) {
        Err(e) => e.into_response(),
        Ok(principal) => {
            if let Some(p) = principal {
                req.extensions_mut().insert(p);
            }
            next.run(req).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;

    const W1: &str = "worker-token-000000000001";
    const W2: &str = "worker-token-000000000002";
    const OP: &str = "operator-token-0000000001";

    fn headers(token: Option<&str>, owner: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        if let Some(t) = token {
            h.insert("authorization", format!("Bearer {t}").parse().expect("value"));
        }
        if let Some(o) = owner {
            h.insert("x-owner-id", o.parse().expect("value"));
        }
        h
    }

    fn code(r: Result<Option<Principal>, ApiError>) -> Option<ErrorCode> {
        r.err().map(|e| e.code)
    }

    #[test]
    fn resolve_refuses_auth_off_outside_unsafe_test_and_on_without_credentials() {
        let off = Layers::of(&[("auth.enabled", "false")]);
        assert!(resolve(&off, Profile::Production).is_err_and(|e| e.contains("auth.enabled=false")));
        assert!(resolve(&off, Profile::UnsafeTest).is_ok_and(|s| !s.enabled));
        let none = resolve(&Layers::default(), Profile::Production).expect_err("no credentials");
        assert!(none.contains("no credentials"), "{none}");
        let bad = Layers::of(&[("auth.credentials", "admin xxxxxxxxxxxxxxxxxxxxxxxx")]);
        let e = resolve(&bad, Profile::Production).expect_err("malformed");
        assert!(e.contains("line 1") && !e.contains("xxxxxxxx"), "{e}");
        let ok = resolve(&Layers::of(&[("auth.credentials", &format!("worker {W1}"))]), Profile::Production);
        assert!(ok.is_ok_and(|s| s.enabled && s.rotation_overlap_ms == ROTATION_OVERLAP_MS_DEFAULT));
    }

    #[test]
    fn decisions_follow_the_role_table_and_the_owner_binding() {
        let text = format!("worker {W1} owners=exec-1\nworker {W2}\noperator {OP}\n");
        let a = Authenticator::new(
            "lock-server",
            dlock_contract::auth::LOCK_SERVER_ROUTES,
            &AuthSettings::inline(&text),
            Clock::system(),
        )
        .expect("load")
        .expect("on");
        let acquire = "/v1/locks/k/acquire";
        assert_eq!(code(a.decide("GET", "/health/live", &headers(None, None))), None);
        assert_eq!(code(a.decide("POST", acquire, &headers(None, None))), Some(ErrorCode::Unauthenticated));
        assert_eq!(code(a.decide("GET", "/nope", &headers(None, None))), Some(ErrorCode::Unauthenticated));
        assert_eq!(
            code(a.decide("POST", acquire, &headers(Some("x".repeat(20).as_str()), None))),
            Some(ErrorCode::Unauthenticated)
        );
        assert_eq!(code(a.decide("POST", acquire, &headers(Some(W1), Some("exec-1")))), None);
        assert_eq!(code(a.decide("POST", acquire, &headers(Some(W1), Some("exec-2")))), Some(ErrorCode::Forbidden));
        assert_eq!(code(a.decide("POST", acquire, &headers(Some(W2), Some("exec-2")))), None);
        assert_eq!(code(a.decide("POST", acquire, &headers(Some(OP), None))), Some(ErrorCode::Forbidden));
        assert_eq!(code(a.decide("POST", "/v1/locks/k/revoke", &headers(Some(W2), None))), Some(ErrorCode::Forbidden));
        assert_eq!(code(a.decide("POST", "/v1/locks/k/revoke", &headers(Some(OP), None))), None);
        assert_eq!(code(a.decide("GET", "/v1/locks/k", &headers(Some(OP), None))), None);
        let p = a.decide("POST", "/v1/sessions", &headers(Some(W1), None)).expect("ok").expect("principal");
        assert!(check_owner(Some(&p), "exec-1").is_ok());
        assert_eq!(check_owner(Some(&p), "exec-9").map_err(|e| e.code), Err(ErrorCode::Forbidden));
    }
}
