//! Bytes → `axhost_core::jsonrpc::parse`. See `src/envelope.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| axhost_fuzz::envelope::check(data));
