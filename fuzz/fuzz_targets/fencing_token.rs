//! `FencingToken::parse` on arbitrary UTF-8: never panics; whatever it accepts is a
//! positive token whose canonical spelling is exactly the input (`[1-9][0-9]*`).
#![no_main]

use dlock_contract::FencingToken;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    if let Ok(t) = FencingToken::parse(s) {
        assert!(t.get() > 0, "accepted a non-positive token from {s:?}");
        assert_eq!(t.to_string(), s, "accepted a non-canonical spelling");
    }
});
