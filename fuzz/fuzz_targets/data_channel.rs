//! Fuzz target `data_channel`: [`koala_fuzz::data_channel`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| koala_fuzz::data_channel(data));
