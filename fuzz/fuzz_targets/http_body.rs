//! Fuzz target `http_body`: [`koala_fuzz::http_body`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| koala_fuzz::http_body(data));
