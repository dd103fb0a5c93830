//! Whole-core input sequences across connections → `Host<MemStore>`. See `src/sequence.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| axhost_fuzz::sequence::check(data));
