//! Fuzz target: `props::auth::grant_signature` (its properties are documented there).
#![no_main]

#[path = "../props/auth.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::grant_signature(data));
