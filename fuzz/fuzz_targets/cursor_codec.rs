//! Fuzz target: `props::payment::cursor_codec` (its properties are documented there).
#![no_main]

#[path = "../props/payment.rs"]
mod props;

libfuzzer_sys::fuzz_target!(|data: &[u8]| props::cursor_codec(data));
