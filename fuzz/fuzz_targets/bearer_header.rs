//! Fuzz target: `props::auth::bearer_header` (its properties are documented there).
#![no_main]

#[path = "../props/auth.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::bearer_header(data));
