#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| flagpost_fuzz::checks::block(data));
