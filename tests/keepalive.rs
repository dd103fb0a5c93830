//! Keepalive against the real `axhost serve`: a WebSocket that stays silent is pinged, and one
//! that does not answer (a peer that vanished without closing, or stopped reading) is closed
//! with 1001 so the host forgets its subscriptions and services. A healthy idle client, whose
//! WebSocket library answers pings, stays connected however long it is quiet.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ROOT: &str = "ahp-root://";
const CATALOG: &str = "x-client-services://";

#[test]
fn silent_peers_are_pinged_and_unanswered_ones_are_closed() {
    let host = HostProcess::builder()
        .config("keepalive_ms = 200\n")
        .start();
    // `gone` registers a service, then never reads again: its pongs never come.
    let (mut gone, _) = host.ws_init("gone", &[]);
    let r = gone.ok(
        "client/registerService",
        json!({"channel": CATALOG, "metadata": {"kind": "keepalive-test"}}),
    );
    assert!(r["serviceId"].is_string(), "{r}");
    // `idle` reads (tungstenite answers pings while reading) but sends nothing itself.
    let (mut idle, _) = host.ws_init("idle", &[CATALOG]);
    let started = Instant::now();
    // The catalog snapshot came with initialize; the next thing `idle` sees is the removal of
    // `gone`'s service once the host gives up on `gone` (2 x 200 ms of silence, then a probe).
    let removed = idle.recv_within(Duration::from_secs(5));
    let waited = started.elapsed();
    assert!(
        removed
            .to_string()
            .contains("x-clientServices/serviceRemoved"),
        "expected the service of the silent peer to go: {removed}"
    );
    assert!(
        waited >= Duration::from_millis(200) && waited < Duration::from_secs(3),
        "removed after {waited:?}"
    );
    // Pings kept `idle` alive through many intervals without it sending anything.
    idle.expect_no_frame(1_000);
    assert_eq!(idle.ok("ping", json!({"channel": ROOT})), Value::Null);
    // `gone` finds its close frame waiting when it finally reads.
    let (frame, _) = gone.expect_closed(Duration::from_secs(5));
    assert_eq!(close_code(&frame), Some(1001), "close frame {frame:?}");
}
