//! Fuzz target `config`: [`koala_fuzz::config`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| koala_fuzz::config(data));
