//! Fuzz target: `props::router::router_body` (its properties are documented there).
#![no_main]

#[path = "../props/router.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::router_body(data));
