//! HTTP upgrade with credentials, then WebSocket frames, as the server reads them. See
//! `src/websocket.rs`. Also bounds memory: the peak heap during one input stays within a few
//! times the largest frame the server accepts (16 MiB), whatever lengths the frames announce.
#![no_main]

use axhost_fuzz::meter::{self, Meter};
use libfuzzer_sys::fuzz_target;

#[global_allocator]
static ALLOC: Meter = Meter;

/// Default `frame_bytes_max` is 16 MiB; the reader grows its buffer to one frame, assembles up
/// to one message, and the check copies a message once. Anything above this is unbounded growth.
const PEAK_BYTES_MAX: usize = 4 * 16 * 1024 * 1024 + (1 << 20);

fuzz_target!(|data: &[u8]| {
    let base = meter::reset();
    axhost_fuzz::websocket::check(data);
    let peak = meter::peak_above(base);
    assert!(
        peak <= PEAK_BYTES_MAX,
        "peak heap {peak} bytes for a {}-byte input",
        data.len()
    );
});
