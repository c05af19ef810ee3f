//! The reconciler's keys (`reconcile.*`, `resolve.*`) and their one resolver, used by
//! `dlock reconcile`/`resolve`, `dlock up`/`demo` and the tests alike (see `dlock_config`).
//!
//! `reconcile.database-url` and `resolve.database-url` default to the value of
//! `payment.resource.database-url`, `reconcile.rail-url` to that of `rail.proxy.rail-url`
//! (from the environment or the file: those are other commands' flags).

use dlock_config::{Layers, PAYDB_URL_DEFAULT};

use crate::cli::{ReconcileSettings, RAIL_URL_DEFAULT};
use crate::reconcile::{Bounds, ACKED_UNPOSTED_MS_MAX_DEFAULT, INTENT_UNRESOLVED_MS_MAX_DEFAULT};

/// Every key the reconciler and `dlock resolve` read.
pub const KEYS: &[&str] = &[
    "reconcile.database-url",
    "reconcile.rail-url",
    "reconcile.intent-unresolved-ms-max",
    "reconcile.acked-unposted-ms-max",
    "reconcile.record-findings",
    "resolve.database-url",
];

fn paydb_default(layers: &Layers) -> Result<String, String> {
    layers.get("payment.resource.database-url", PAYDB_URL_DEFAULT.to_owned())
}

/// Resolves `dlock reconcile`'s settings; `json` chooses the report's format.
pub fn resolve(layers: &Layers, json: bool) -> Result<ReconcileSettings, String> {
    let rail_default = layers.get("rail.proxy.rail-url", RAIL_URL_DEFAULT.to_owned())?;
    Ok(ReconcileSettings {
        database_url: layers.get("reconcile.database-url", paydb_default(layers)?)?,
        rail_url: layers.get("reconcile.rail-url", rail_default)?,
        json,
        bounds: Bounds {
            intent_unresolved_ms_max: layers
                .get("reconcile.intent-unresolved-ms-max", INTENT_UNRESOLVED_MS_MAX_DEFAULT)?,
            acked_unposted_ms_max: layers.get("reconcile.acked-unposted-ms-max", ACKED_UNPOSTED_MS_MAX_DEFAULT)?,
        },
        record_findings: layers.get("reconcile.record-findings", true)?,
    })
}

/// `dlock resolve`'s paydb.
pub fn resolve_database_url(layers: &Layers) -> Result<String, String> {
    layers.get("resolve.database-url", paydb_default(layers)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_default_to_the_services_keys() {
        let l = Layers::of(&[("payment.resource.database-url", "sqlite://p"), ("rail.proxy.rail-url", "http://r:1")]);
        let s = resolve(&l, false).expect("ok");
        assert_eq!((s.database_url.as_str(), s.rail_url.as_str()), ("sqlite://p", "http://r:1"));
        assert_eq!(resolve_database_url(&l), Ok("sqlite://p".to_owned()));
        let d = resolve(&Layers::default(), true).expect("defaults");
        assert_eq!((d.database_url.as_str(), d.rail_url.as_str(), d.json), (PAYDB_URL_DEFAULT, RAIL_URL_DEFAULT, true));
        assert_eq!(d.bounds, Bounds::default());
        let own = Layers::of(&[("reconcile.rail-url", "http://x:2"), ("rail.proxy.rail-url", "http://r:1")]);
        assert_eq!(resolve(&own, false).expect("ok").rail_url, "http://x:2");
    }
}
