//! What the load binaries share: the hand-rolled WebSocket client framing, the Redis and NATS
//! parsers, and the blocking per-protocol connection setup. `axhost-load` (notification load,
//! `src/main.rs`) and `axhost-durable` (durable-write load, `src/bin/durable/`) build on it.

pub mod nats;
pub mod resp;
pub mod setup;
pub mod ws;

use std::time::Duration;

/// A command-line duration: `10s`, `500ms`, `100us` (or `µs`), `2m`, or a bare number of
/// seconds; between 0 and one hour.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let err =
        || format!("duration {s:?}: expected e.g. 10s, 500ms, 100us, 2m or a number of seconds");
    let (num, unit) = if let Some(n) = s.strip_suffix("us").or_else(|| s.strip_suffix("µs")) {
        (n, 1e-6)
    } else if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num.parse().map_err(|_| err())?;
    let secs = v * unit;
    if !(0.0..=3600.0).contains(&secs) {
        return Err(format!("duration {s:?}: must be between 0 and 1 hour"));
    }
    Ok(Duration::from_secs_f64(secs))
}
