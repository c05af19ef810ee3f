//! The payment-resource as the event-stream and resolution tests run it: production
//! settings, the test signing key's public half for grants, and authentication on with the
//! test credentials (`dlock_testkit::auth`), over any payment store.

use std::sync::Arc;

use dlock_payment_resource::{PaymentResource, PaymentStore};
use dlock_rt::Clock;

/// Production settings with the test grant key and the test credentials.
pub fn payment_cfg() -> dlock_payment_resource::PaymentConfig {
    let public = dlock_contract::grant::testing::signer().verify_key().to_base64();
    let mut l = dlock_config::Layers::of(&[("payment.grants.verify-keys", public.as_str())]);
    l.set_flag("auth.credentials", dlock_testkit::auth::credentials());
    dlock_payment_resource::config::resolve(&l, dlock_config::Profile::Production).expect("settings").config
}

/// The service's router over `store`, behind authentication.
pub async fn app_over(store: Arc<dyn PaymentStore>) -> axum::Router {
    let cfg = payment_cfg();
    let auth = dlock_http::auth::Authenticator::new(
        dlock_payment_resource::NODE,
        dlock_contract::auth::PAYMENT_ROUTES,
        &cfg.auth,
        Clock::system(),
    )
    .expect("auth");
    let pr = PaymentResource::start(store, cfg, Clock::system()).await.expect("start");
    dlock_payment_resource::app::router_with_auth(pr, auth)
}
