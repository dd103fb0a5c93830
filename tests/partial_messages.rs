//! Black-box: what partially received messages may hold, per connection and in total.
//!
//! A connection may send at most twice the largest message the core accepts (client-service
//! payload plus envelope: 2 × 1,114,112 bytes by default), and the driver refuses a frame or a
//! fragment announced past that from its header (1009). What every connection's unfinished
//! messages hold together is bounded by `partial_message_bytes_total_max`: the connection
//! whose message would cross it is closed with 1013, and no other.

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ROOT: &str = "ahp-root://";
const TEXT: u8 = 0x1;
const CONTINUATION: u8 = 0x0;
/// Largest message any role may send with default limits: twice 1 MiB of client-service payload
/// plus 64 KiB of envelope.
const ROLE_CAP: usize = 2 * (1024 * 1024 + 64 * 1024);

/// A masked frame header announcing `len` payload bytes (the 8-byte length form), and its key.
fn header(fin: bool, opcode: u8, len: u64) -> Vec<u8> {
    let mut h = vec![u8::from(fin) << 7 | opcode, 0x80 | 127];
    h.extend_from_slice(&len.to_be_bytes());
    h.extend_from_slice(&[0, 0, 0, 0]); // a zero key: the payload goes as written
    h
}

/// Whether the host closed `ws`, and with which code, within `timeout`.
fn closed_within(ws: &mut Ws, timeout: Duration) -> Option<Option<u16>> {
    match ws.next(timeout) {
        Incoming::Closed(frame) => Some(close_code(&frame)),
        Incoming::Timeout => None,
        Incoming::Json(v) => panic!("unexpected frame {v}"),
    }
}

/// Observers each start a fragmented message and never finish it: together they would hold
/// twice the configured total. The ones whose message would cross it are closed with 1013;
/// the others keep theirs, stay open, and finish their message later; the host's memory grows
/// by about the total, not by what the observers sent.
#[cfg(target_os = "linux")]
#[test]
fn hoarded_fragments_stay_under_the_total_and_close_only_the_one_that_crosses_it() {
    const TOTAL: usize = 8 << 20;
    const HOARDERS: usize = 16;
    const PIECE: usize = 512 * 1024;
    const PIECES: usize = 2;
    // Blob uploads kept small: the total must hold the largest message any role may send,
    // and this test is about observers' messages.
    let host = HostProcess::builder()
        .config(&format!(
            "keepalive_ms = 0\n[limits]\npartial_message_bytes_total_max = {TOTAL}\n\
             blob_bytes_max = 1000000\n"
        ))
        .principal("watcher", "observer", None)
        .start();
    let pid = host.pid().expect("pid");
    let (mut warm, _) = host.ws_init("warm", &[]);
    assert_eq!(warm.ok("ping", json!({"channel": ROOT})), Value::Null);
    let before = common::rss_kib(pid);
    // A ping request, opened and padded, that the last fragment closes: `{"jsonrpc":…,"pad":"xx…"}`.
    let opening =
        br#"{"jsonrpc":"2.0","id":7,"method":"ping","params":{"channel":"ahp-root://"},"pad":""#;
    let mut hoarders = Vec::new();
    for i in 0..HOARDERS {
        let (mut ws, _) = host.ws_init_as(host.token_of("watcher"), &format!("hoarder-{i}"), &[]);
        let mut first = opening.to_vec();
        first.resize(PIECE, b'x');
        ws.write_raw(&client_frame(false, TEXT, &first));
        for _ in 1..PIECES {
            ws.write_raw(&client_frame(false, CONTINUATION, &vec![b'x'; PIECE]));
        }
        hoarders.push(ws);
    }
    // The host is one thread: once it answers this, it has read what came before.
    assert_eq!(warm.ok("ping", json!({"channel": ROOT})), Value::Null);
    let grown_kib = common::rss_kib(pid).saturating_sub(before);
    let sent = HOARDERS * PIECE * PIECES;
    assert!(
        grown_kib * 1024 < (TOTAL + (4 << 20)) as u64,
        "{HOARDERS} observers sent {} MiB of unfinished messages and the host grew by {} MiB, \
         more than the {} MiB total allows",
        sent >> 20,
        grown_kib / 1024,
        TOTAL >> 20
    );
    let mut kept = Vec::new();
    let mut refused = 0;
    for (i, mut ws) in hoarders.into_iter().enumerate() {
        match closed_within(&mut ws, Duration::from_millis(200)) {
            Some(Some(1013)) => refused += 1,
            Some(other) => panic!("hoarder {i} closed with {other:?}, not 1013"),
            None => kept.push(ws),
        }
    }
    let per_hoarder = PIECE * PIECES;
    assert!(
        kept.len() * per_hoarder <= TOTAL,
        "{} hoarders kept {per_hoarder} bytes each, past the {TOTAL}-byte total",
        kept.len()
    );
    assert!(
        kept.len() >= TOTAL / per_hoarder / 2,
        "only {} of {HOARDERS} hoarders kept their message; the total is {TOTAL}",
        kept.len()
    );
    assert_eq!(refused + kept.len(), HOARDERS);
    // The ones kept are whole connections: they finish their message and are answered (the
    // core refuses a ping that large, by id, which shows it arrived in one piece).
    for ws in &mut kept {
        ws.write_raw(&client_frame(true, CONTINUATION, b"\"}"));
        let r = ws.response(7);
        assert_eq!(code(&r), -32043, "{r}");
    }
    // Finished messages gave their room back: another observer may hold as much again.
    let (mut next, _) = host.ws_init_as(host.token_of("watcher"), "next", &[]);
    let mut first = opening.to_vec();
    first.resize(TOTAL / 4, b'x');
    next.write_raw(&client_frame(false, TEXT, &first));
    next.write_raw(&client_frame(true, CONTINUATION, b"\"}"));
    assert_eq!(code(&next.response(7)), -32043);
    assert_eq!(warm.ok("ping", json!({"channel": ROOT})), Value::Null);
}

/// A frame announced past the role's cap is refused from its header, with nothing read after
/// it; one announced under it waits for its payload. Fragments count together.
#[test]
fn a_frame_or_message_past_the_role_cap_is_refused_from_its_header() {
    let host = HostProcess::builder()
        .config("keepalive_ms = 0\n")
        .principal("watcher", "observer", None)
        .start();
    let watcher = host.token_of("watcher").to_owned();
    // Past the cap (and far below frame_bytes_max, 24 MiB): 1009 at once.
    let (mut over, _) = host.ws_init_as(&watcher, "over", &[]);
    let started = Instant::now();
    over.write_raw(&header(true, TEXT, ROLE_CAP as u64 + 1));
    assert_eq!(
        closed_within(&mut over, FRAME_TIMEOUT),
        Some(Some(1009)),
        "a frame over the cap"
    );
    assert!(started.elapsed() < Duration::from_secs(5));
    // At the cap: the host waits for the payload.
    let (mut at, _) = host.ws_init_as(&watcher, "at", &[]);
    at.write_raw(&header(true, TEXT, ROLE_CAP as u64));
    at.write_raw(&[b' '; 1000]);
    assert_eq!(closed_within(&mut at, Duration::from_millis(300)), None);
    // Fragments: a continuation that would take the message past the cap is refused from its
    // header too.
    let (mut pieces, _) = host.ws_init_as(&watcher, "pieces", &[]);
    pieces.write_raw(&client_frame(false, TEXT, &vec![b' '; ROLE_CAP / 2]));
    pieces.write_raw(&header(false, CONTINUATION, (ROLE_CAP / 2 + 1) as u64));
    assert_eq!(closed_within(&mut pieces, FRAME_TIMEOUT), Some(Some(1009)));
    // A maintainer may upload blobs: past the observers' cap it waits for the payload, and
    // only past the frame limit (24 MiB, room for a maximal upload) is it refused.
    let mut admin = host.ws();
    admin.write_raw(&header(true, TEXT, ROLE_CAP as u64 + 1));
    admin.write_raw(&[b' '; 1000]);
    assert_eq!(closed_within(&mut admin, Duration::from_millis(300)), None);
    let mut over_frame = host.ws();
    over_frame.write_raw(&header(true, TEXT, (24 << 20) + 1));
    assert_eq!(
        closed_within(&mut over_frame, FRAME_TIMEOUT),
        Some(Some(1009))
    );
    let (mut fine, _) = host.ws_init("fine", &[]);
    assert_eq!(fine.ok("ping", json!({"channel": ROOT})), Value::Null);
}

/// The largest legitimate message, a client-service request of 1,000,000 bytes of params,
/// arrives whole, as one frame and in 64 KiB fragments, and an observer may send it too.
#[test]
fn the_largest_legitimate_messages_still_arrive() {
    let host = HostProcess::builder()
        .config("keepalive_ms = 0\n")
        .principal("watcher", "observer", None)
        .start();
    let (mut owner, _) = host.ws_init("owner", &[]);
    let service = owner.register_service(json!({"protocol": "big"}), None);
    let payload = "p".repeat(1_000_000);
    let (mut caller, _) = host.ws_init("caller", &[]);
    // One frame.
    let id = caller.send_service_request(&service, "take", json!(payload), Some(10_000));
    let handled = owner.notification("clientService/handleRequest");
    assert_eq!(handled["params"]["params"], json!(payload));
    owner.respond(&handled["id"], json!("ok"));
    assert_eq!(caller.response(id)["result"], "ok");
    // Fragments of 64 KiB.
    let text = json!({
        "jsonrpc": "2.0",
        "id": 99,
        "method": "clientService/request",
        "params": service_request(&service, "take", json!(payload), Some(10_000)),
    })
    .to_string();
    let chunks: Vec<&[u8]> = text.as_bytes().chunks(64 * 1024).collect();
    for (n, chunk) in chunks.iter().enumerate() {
        let opcode = if n == 0 { TEXT } else { CONTINUATION };
        caller.write_raw(&client_frame(n + 1 == chunks.len(), opcode, chunk));
    }
    let handled = owner.notification("clientService/handleRequest");
    assert_eq!(handled["params"]["params"], json!(payload));
    owner.respond(&handled["id"], json!("ok again"));
    assert_eq!(caller.response(99)["result"], "ok again");
    // An observer may send it too (to its own service: services are seen by their principal).
    let watcher = host.token_of("watcher").to_owned();
    let (mut own, _) = host.ws_init_as(&watcher, "watcher-service", &[]);
    let own_service = own.register_service(json!({"protocol": "big"}), None);
    let (mut asking, _) = host.ws_init_as(&watcher, "watcher-caller", &[]);
    let id = asking.send_service_request(&own_service, "take", json!(payload), Some(10_000));
    let handled = own.notification("clientService/handleRequest");
    assert_eq!(handled["params"]["params"], json!(payload));
    own.respond(&handled["id"], json!("observed"));
    assert_eq!(asking.response(id)["result"], "observed");
}
