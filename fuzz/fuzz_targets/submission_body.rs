//! `SubmissionRequest::from_json` on any JSON value: never panics; whatever it accepts has
//! a positive amount and an ISO 4217 currency.
#![no_main]

use dlock_contract::currency::is_iso_4217;
use dlock_contract::rail::SubmissionRequest;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else {
        return;
    };
    if let Ok(r) = SubmissionRequest::from_json(&v) {
        assert!(
            r.amount_minor > 0,
            "accepted amountMinor {}",
            r.amount_minor
        );
        assert!(
            is_iso_4217(&r.currency),
            "accepted currency {:?}",
            r.currency
        );
    }
});
