//! Fuzz target: `props::payment::jcs_fingerprint` (its properties are documented there).
#![no_main]

#[path = "../props/payment.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::jcs_fingerprint(data));
