//! Fuzz target: `props::headers::idempotency_key` (its properties are documented there).
#![no_main]

#[path = "../props/headers.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::idempotency_key(data));
