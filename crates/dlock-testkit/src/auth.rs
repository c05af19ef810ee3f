//! Credentials every test harness carries (C3-extensions E-13), so tests run with
//! authentication on, as production does, instead of turning it off.
//!
//! [`credentials`] is a credentials text with one token per role; [`bearer`] is a client
//! token source that presents, for each request, the token of the role the endpoint needs
//! (worker for the worker writes, operator for revoke and create, reader otherwise): a
//! harness client that talks to every service. These tokens are fixed because they exist
//! only in tests; `dlock up`/`demo` draw theirs from the OS generator.

use std::sync::Arc;

use dlock_contract::auth::{all_routes, need_for, Need, Role, Secret};
use dlock_rt::http::{Bearer, BearerSource, HttpClient};

/// The harness's worker token (unbound: any owner id).
pub const WORKER_TOKEN: &str = "test-worker-token-0000000000000001";
/// The harness's operator token.
pub const OPERATOR_TOKEN: &str = "test-operator-token-00000000000001";
/// The harness's reader token.
pub const READER_TOKEN: &str = "test-reader-token-0000000000000001";

/// The credentials text of the three harness tokens (for `auth.credentials` /
/// `DLOCK_AUTH_CREDENTIALS`).
pub fn credentials() -> String {
    format!("worker {WORKER_TOKEN}\noperator {OPERATOR_TOKEN}\nreader {READER_TOKEN}\n")
}

/// The harness token of `role`.
pub fn token(role: Role) -> &'static str {
    match role {
        Role::Worker => WORKER_TOKEN,
        Role::Operator => OPERATOR_TOKEN,
        Role::Reader => READER_TOKEN,
    }
}

/// Presents the token of the role each endpoint needs.
#[derive(Debug)]
struct ByRoute;

impl BearerSource for ByRoute {
    fn token(&self, method: &http::Method, path: &str) -> Option<Secret> {
        let role = match need_for(all_routes(), method.as_str(), path) {
            Need::Role(r) => r,
            Need::Read | Need::Open | Need::Nobody => Role::Reader,
        };
        Some(Secret::new(token(role)))
    }
}

/// A token source with the role each request needs (see the module doc).
pub fn bearer() -> Bearer {
    Bearer::from_source(Arc::new(ByRoute))
}

/// A fixed token source of `role`.
pub fn bearer_of(role: Role) -> Bearer {
    Bearer::fixed(Secret::new(token(role)))
}

/// An HTTP client with these budgets that carries [`bearer`].
pub fn client(connect_timeout_ms: u64, read_timeout_ms: u64) -> HttpClient {
    HttpClient::new(connect_timeout_ms, read_timeout_ms).with_bearer(Some(bearer()))
}

/// `pairs` plus `auth.credentials` (the harness tokens), as config layer pairs.
pub fn with_credentials<'a>(pairs: &[(&'a str, &'a str)], creds: &'a str) -> Vec<(&'a str, &'a str)> {
    let mut v = pairs.to_vec();
    v.push(("auth.credentials", creds));
    v
}
