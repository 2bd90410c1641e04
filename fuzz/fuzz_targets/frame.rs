//! Fuzz target `frame`: [`koala_fuzz::frames`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| koala_fuzz::frames(data));
