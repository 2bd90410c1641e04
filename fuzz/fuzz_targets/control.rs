//! Fuzz target `control`: [`koala_fuzz::control`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| koala_fuzz::control(data));
