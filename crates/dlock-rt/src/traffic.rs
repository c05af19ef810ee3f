//! Request counts by route, for the simulation's speed report ("where the time goes").
//!
//! Every request a [`crate::http`] server answers is counted under its method and route
//! (the path with its identifiers replaced by `{}`: `POST /v1/payouts/{}/claim`). A
//! simulation bench sums the counts over its seeds and prints requests per seed by route,
//! so the cost of a simulated second can be read off the table.
//!
//! Invariants:
//! - Outside `cfg(madsim)` [`count`] compiles to nothing: production keeps no state.
//! - Under `cfg(madsim)` counts are per thread (one madsim runtime per thread), like
//!   [`crate::probe`]: [`reset`] before a seed and [`snapshot`] after it give that seed's.

/// Segments after which a path segment is an identifier.
const ID_AFTER: &[&str] = &["locks", "accounts", "payouts", "sessions"];

/// `GET /v1/payouts/6f1c…/claim?x=1` → `GET /v1/payouts/{}/claim`.
pub fn route(method: &str, path: &str) -> String {
    let path = path.split('?').next().unwrap_or_default();
    let mut out = String::with_capacity(method.len() + path.len() + 1);
    out.push_str(method);
    out.push(' ');
    let mut prev = "";
    for (i, seg) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        out.push_str(if ID_AFTER.contains(&prev) { "{}" } else { seg });
        prev = seg;
    }
    out
}

per_thread_tally!(String);

/// Counts one request answered (a no-op outside the simulation: the route is not even
/// formed).
#[inline]
pub fn count(method: &http::Method, path: &str) {
    #[cfg(madsim)]
    add(route(method.as_str(), path));
    #[cfg(not(madsim))]
    let _ = (method, path);
}

#[cfg(test)]
mod tests {
    use super::route;

    #[test]
    fn route_replaces_identifiers_and_drops_the_query() {
        assert_eq!(route("POST", "/v1/payouts/6f1c/claim"), "POST /v1/payouts/{}/claim");
        assert_eq!(route("GET", "/v1/payouts?state=PENDING&limit=5"), "GET /v1/payouts");
        assert_eq!(route("POST", "/v1/locks/payout:acct-1/acquire"), "POST /v1/locks/{}/acquire");
        assert_eq!(route("PUT", "/v1/sessions/s-1/heartbeat"), "PUT /v1/sessions/{}/heartbeat");
        assert_eq!(route("GET", "/health/ready"), "GET /health/ready");
    }
}
