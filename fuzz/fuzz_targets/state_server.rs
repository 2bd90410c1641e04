//! Fuzz target `state_server`: [`koala_fuzz::state_server`].
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| koala_fuzz::state_server(data));
