//! Generated messages with a known meaning → `jsonrpc::parse`. See `src/structured.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| axhost_fuzz::structured::check(data));
