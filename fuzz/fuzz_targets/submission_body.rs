//! Fuzz target: `props::headers::submission_body` (its properties are documented there).
#![no_main]

#[path = "../props/headers.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::submission_body(data));
