//! Fuzz target: `props::headers::owner_id` (its properties are documented there).
#![no_main]

#[path = "../props/headers.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::owner_id(data));
