//! Fuzz target `handshake`: [`koala_fuzz::handshake`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| koala_fuzz::handshake(data));
