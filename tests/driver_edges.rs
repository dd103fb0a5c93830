//! Edges of the production driver's socket handling, against the real `axhost serve`: a last
//! frame that arrives with the peer's FIN, a reply larger than the driver's own byte cap, a
//! frame that announces far more than it sends, a lone sender's burst to many receivers (read
//! in several rounds per turn), a frame that arrives in pieces, idle
//! connections (which hold no read buffer), and sockets that never send a request head.
//!
//! Every test starts its own host process on a free port, so they run in parallel.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ROOT: &str = "ahp-root://";

/// Reads `observer` until a `serviceRemoved` for `service` arrives; false after `timeout`.
fn removal_seen(observer: &mut Ws, service: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        match observer.next(deadline.saturating_duration_since(Instant::now())) {
            Incoming::Json(v) => {
                let action = &v["params"]["action"];
                if action["type"] == "x-clientServices/serviceRemoved"
                    && action["serviceId"] == service
                {
                    return true;
                }
            }
            Incoming::Timeout => return false,
            Incoming::Closed(c) => panic!("observer closed: {c:?}"),
        }
    }
}

/// A peer whose last frame and FIN arrive in one readiness event must still be noticed as
/// gone at once, not after keepalive (here off) gives up on it. Several rounds, because
/// whether the FIN is already queued when the host wakes is up to the scheduler.
#[test]
fn a_last_frame_that_arrives_with_the_fin_still_ends_the_connection() {
    let host = HostProcess::builder().config("keepalive_ms = 0\n").start();
    let (mut observer, _) = host.ws_init("observer", &[CATALOG]);
    for round in 0..12 {
        let (mut peer, _) = host.ws_init(&format!("peer-{round}"), &[]);
        let service = peer.register_service(json!({"kind": "eof-test"}), None);
        let added = observer.recv();
        assert_eq!(
            added["params"]["action"]["type"], "x-clientServices/serviceAdded",
            "{added}"
        );
        peer.send_text_then_fin(
            r#"{"jsonrpc":"2.0","id":99,"method":"ping","params":{"channel":"ahp-root://"}}"#,
        );
        assert!(
            removal_seen(&mut observer, &service, Duration::from_secs(3)),
            "round {round}: the host kept a connection whose peer sent FIN with its last \
             frame\nstderr: {}",
            host.stderr()
        );
        // The host answered the frame that came with the FIN before it let go.
        assert_eq!(peer.recv()["id"], 99);
    }
}

/// A reply may exceed `queue_bytes_hard` (an initialize snapshot here); a reader that keeps
/// up gets it whole, however far it is above what the driver buffers for its own frames.
#[test]
fn a_reply_far_larger_than_the_queue_limit_reaches_a_reader_that_keeps_up() {
    const HARD: usize = 100_000;
    const SESSIONS: usize = 120;
    const TEXT_BYTES: usize = 60_000;
    let host = HostProcess::builder()
        .config(&format!(
            "[limits]\nqueue_bytes_hard = {HARD}\nqueue_bytes_soft = {}\n",
            HARD / 2
        ))
        .start();
    let (mut writer, _) = host.ws_init("writer", &[]);
    let text = "z".repeat(TEXT_BYTES);
    let mut chats = Vec::new();
    for i in 0..SESSIONS {
        let r = writer.ok(
            "createSession",
            json!({"channel": format!("ahp-session:/big{i}")}),
        );
        assert_eq!(r, Value::Null);
        let chat = format!("ahp-chat:/big{i}");
        writer.dispatch(&chat, 1, turn_started("t1", &text));
        chats.push(chat);
    }
    // Messages are handled in order: once this answers, every dispatch was.
    assert_eq!(writer.ok("ping", json!({"channel": ROOT})), Value::Null);

    let subs: Vec<&str> = chats.iter().map(String::as_str).collect();
    let mut reader = host.ws();
    let id = reader.send_request(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": "reader",
               "initialSubscriptions": subs}),
    );
    let started = Instant::now();
    let reply = reader.response(id);
    let bytes = reply.to_string().len();
    let snapshots = reply["result"]["snapshots"]
        .as_array()
        .unwrap_or_else(|| panic!("initialize failed: {}", &reply.to_string()[..200]));
    assert_eq!(snapshots.len(), SESSIONS);
    // The old driver cap was 2 x queue_bytes_hard + 1 MiB.
    assert!(
        bytes > 4 * (2 * HARD + (1 << 20)),
        "reply only {bytes} bytes"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    // And the connection is still fine.
    assert_eq!(reader.ok("ping", json!({"channel": ROOT})), Value::Null);
}

/// The driver still bounds what it queues on its own: a peer that sends pings and never reads
/// the pongs is closed (and the host says so at warn level).
#[test]
fn a_peer_that_never_reads_its_pongs_is_closed() {
    let host = HostProcess::builder()
        .config("keepalive_ms = 0\n")
        .env("RUST_LOG", "warn")
        .start();
    let mut ws = host.ws();
    let ping = client_frame(true, 0x9, &[b'p'; 125]);
    let batch: Vec<u8> = ping
        .iter()
        .copied()
        .cycle()
        .take(ping.len() * 1000)
        .collect();
    let deadline = Instant::now() + Duration::from_secs(20);
    // Far more pongs than socket buffers and the driver's own cap hold together.
    while !host.stderr().contains("control frames") {
        assert!(
            Instant::now() < deadline,
            "still not closed\nstderr: {}",
            host.stderr()
        );
        ws.write_raw(&batch);
    }
    // Nothing was written to the log but ids and counts.
    assert!(!host.stderr().contains("ppp"), "{}", host.stderr());
}

/// A frame header that announces 16 MiB commits no more memory than the bytes that came.
#[cfg(target_os = "linux")]
#[test]
fn an_announced_frame_does_not_reserve_its_length() {
    const PEERS: usize = 12;
    // The frame limit must hold a blob upload (~21.4 MB); a maintainer may announce that much.
    let host = HostProcess::builder()
        .config("keepalive_ms = 0\n[limits]\nframe_bytes_max = 25165824\n")
        .start();
    let pid = host.pid().expect("pid");
    // Warm up: one ordinary connection, so allocator arenas exist before the baseline.
    let (mut warm, _) = host.ws_init("warm", &[]);
    assert_eq!(warm.ok("ping", json!({"channel": ROOT})), Value::Null);
    let before = common::rss_kib(pid);
    let mut peers = Vec::new();
    for _ in 0..PEERS {
        let mut ws = host.ws();
        // A 16 MiB text frame: its header, then 100 bytes, then nothing.
        let mut header = vec![0x81, 0x80 | 127];
        header.extend_from_slice(&(16u64 << 20).to_be_bytes());
        header.extend_from_slice(&[1, 2, 3, 4]);
        header.extend_from_slice(&[b'x'; 100]);
        ws.write_raw(&header);
        peers.push(ws);
    }
    // The host is single-threaded: once it answers this, it has read every header.
    assert_eq!(warm.ok("ping", json!({"channel": ROOT})), Value::Null);
    let grown_mib = common::rss_kib(pid).saturating_sub(before) / 1024;
    assert!(
        grown_mib < 32,
        "{PEERS} stalled 16 MiB headers grew the host by {grown_mib} MiB"
    );
}

/// Connections that went quiet hold no read buffer (the driver lends one per read): each costs
/// the host a few KiB, not the 16 KiB buffer plus its state it cost when every connection kept a
/// buffer of its own (19 KB each, measured).
#[cfg(target_os = "linux")]
#[test]
fn idle_connections_hold_no_read_buffer() {
    const PEERS: usize = 300;
    let host = HostProcess::builder().config("keepalive_ms = 0\n").start();
    let pid = host.pid().expect("pid");
    // Warm up: allocator arenas and the first buffers exist before the baseline.
    let mut warm: Vec<Ws> = (0..8)
        .map(|i| host.ws_init(&format!("warm-{i}"), &[]).0)
        .collect();
    for ws in &mut warm {
        assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
    }
    let before = common::rss_kib(pid);
    let mut peers = Vec::new();
    for i in 0..PEERS {
        // Each one has initialized and been answered, then goes quiet.
        let (mut ws, _) = host.ws_init(&format!("idle-{i}"), &[]);
        assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
        peers.push(ws);
    }
    let per_peer = common::rss_kib(pid).saturating_sub(before) * 1024 / PEERS as u64;
    assert!(
        per_peer < 10 * 1024,
        "{PEERS} idle connections cost the host {per_peer} bytes each"
    );
}

/// A lone sender's burst fanned out to many receivers reaches each of them whole and in order.
/// The driver reads such a sender several times per loop turn (`read_rounds`: up to 16 rounds of
/// 64 steps before it writes, where one round would give each receiver 4 frames), parking its
/// read buffer between rounds; this drives that path through the real binary with frames cut
/// anywhere by TCP, and checks from the driver's debug log that it was taken.
#[test]
fn a_lone_senders_burst_to_many_receivers_arrives_whole_and_in_order() {
    const OWNERS: usize = 16;
    const PER_OWNER: usize = 300;
    // At debug the driver logs each turn that read more than one round.
    let host = HostProcess::builder()
        .env("RUST_LOG", "info,axhost_io::server=debug")
        .start();
    let mut owners = Vec::new();
    let mut services = Vec::new();
    for i in 0..OWNERS {
        let (mut ws, _) = host.ws_init(&format!("owner-{i}"), &[]);
        services.push(ws.register_service(json!({"protocol": "burst"}), None));
        owners.push(ws);
    }
    let (mut sender, _) = host.ws_init("sender", &[]);
    let mut burst = Vec::new();
    for n in 0..OWNERS * PER_OWNER {
        let text = json!({"jsonrpc": "2.0", "method": "clientService/notify",
                          "params": {"channel": CATALOG, "serviceId": services[n % OWNERS],
                                     "method": "seq", "params": {"n": n}}})
        .to_string();
        burst.extend(client_frame(true, 0x1, text.as_bytes()));
    }
    // Answered only after every notification before it was handled.
    let ping = json!({"jsonrpc": "2.0", "id": 99, "method": "ping", "params": {"channel": ROOT}});
    burst.extend(client_frame(true, 0x1, ping.to_string().as_bytes()));
    sender.write_raw(&burst);
    assert_eq!(sender.response(99)["result"], Value::Null);
    for (i, owner) in owners.iter_mut().enumerate() {
        for k in 0..PER_OWNER {
            let v = owner.notification("clientService/notification");
            assert_eq!(
                v["params"]["params"]["n"],
                json!(k * OWNERS + i),
                "owner {i}, notification {k}: {v}"
            );
        }
        // Nothing more, and the connection is still served.
        assert_eq!(owner.ok("ping", json!({"channel": ROOT})), Value::Null);
        assert!(
            !owner
                .drain(0)
                .iter()
                .any(|v| v["method"] == "clientService/notification"),
            "owner {i} got more than its {PER_OWNER}"
        );
    }
    // The burst did take the multi-round path: one sender's 64 steps a round fed 16
    // destinations 4 frames each, so turns went round again (16 rounds of 64 when the socket
    // held enough).
    let log = host.stderr();
    let rounds: Vec<u64> = log
        .lines()
        .filter(|l| l.contains("turn read in rounds"))
        .filter_map(|l| {
            l.split("rounds=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert!(
        rounds.iter().any(|&r| r >= 4),
        "no turn read the burst in several rounds: {rounds:?}"
    );
}

/// A frame larger than the read buffer that trickles in, in pieces, is read whole.
#[test]
fn a_frame_that_arrives_in_pieces_is_read_whole() {
    let host = HostProcess::start();
    let mut ws = host.ws();
    let pad = "p".repeat(50_000);
    let text = json!({"jsonrpc": "2.0", "id": 7, "method": "ping",
                      "params": {"channel": ROOT, "pad": pad}})
    .to_string();
    let frame = client_frame(true, 0x1, text.as_bytes());
    for piece in frame.chunks(997) {
        ws.write_raw(piece);
        std::thread::sleep(Duration::from_millis(1));
    }
    let r = ws.recv();
    assert_eq!(r["id"], 7, "{r}");
    assert_eq!(r["result"], Value::Null, "{r}");
    // The next frame after it is read as usual.
    assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
}

/// Sockets that connect and never send a request head cannot lock real clients out: past the
/// cap on such sockets the oldest is dropped to make room.
#[test]
fn idle_sockets_without_a_request_head_do_not_lock_clients_out() {
    const IDLE: usize = 1_100;
    let started = Instant::now();
    let host = HostProcess::builder()
        .config("[limits]\nconnections_max = 4\nhandshake_timeout_ms = 60000\n")
        .env("RUST_LOG", "warn")
        .start();
    let mut idle = Vec::new();
    for _ in 0..IDLE {
        let s = TcpStream::connect(("127.0.0.1", host.port)).expect("connect");
        idle.push(s);
    }
    // Let the host accept every one of them before the real client comes.
    let (status, _) = host.http("GET", "/healthz");
    assert_eq!(status, 200);
    let (mut ws, _) = host.ws_init("real", &[]);
    assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
    // The oldest idle sockets were the ones let go: the host closed them.
    let mut first = idle.remove(0);
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut buf = [0u8; 16];
    let n = first.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "the oldest idle socket should have been closed");
    // The newest is still served when it finally speaks.
    let mut last = idle.pop().expect("newest");
    last.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    last.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut got = Vec::new();
    let _ = last.read_to_end(&mut got);
    assert!(
        got.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&got)
    );
    // Hundreds of evictions, but the warning about them comes at most once a second.
    let warnings = host.stderr().matches("oldest dropped").count();
    let seconds = started.elapsed().as_secs() as usize + 1;
    assert!(
        (1..=seconds).contains(&warnings),
        "{warnings} eviction warnings in {seconds} s\nstderr: {}",
        host.stderr()
    );
}
