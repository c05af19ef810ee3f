//! Fuzz target: `props::headers::fencing_token` (its properties are documented there).
#![no_main]

#[path = "../props/headers.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::fencing_token(data));
