//! Fuzz target: `props::auth::credential_file` (its properties are documented there).
#![no_main]

#[path = "../props/auth.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::credential_file(data));
