//! Black-box: sockets without a token cannot keep authenticated clients out.
//!
//! The driver holds unauthenticated sockets (still sending their HTTP head, or answered over
//! HTTP and lingering) in a table of their own, `pre_auth_sockets_max`; a newcomer evicts one of
//! them when it is full, never a WebSocket. Each test floods that table many times over with one
//! kind of socket, keeps the flood going, and meanwhile authenticated clients connect, work and
//! leave, as does one that stayed connected throughout. The table is configured small so the
//! flood is a few hundred sockets.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ROOT: &str = "ahp-root://";
const PRE_AUTH_SOCKETS_MAX: usize = 16;
const CONNECTIONS_MAX: usize = 8;
/// Every socket the host may hold: the pre-authentication table, open WebSockets, and as many
/// closing ones.
const TABLE: usize = PRE_AUTH_SOCKETS_MAX + 2 * CONNECTIONS_MAX;
/// The flood opens sockets one per `FLOOD_PACE` and keeps them all open; clients come and go
/// until it has opened `FLOOD_SOCKETS`, many times the table.
const FLOOD_SOCKETS: usize = 12 * TABLE;
const FLOOD_MAX: usize = 4 * FLOOD_SOCKETS;
const FLOOD_PACE: Duration = Duration::from_millis(1);
/// Authenticated clients that connect, initialize, ping and leave during the flood, at least.
const CLIENTS: usize = 12;
/// Most one of them may take, connect to pong (on this loaded 2-core machine, at worst, a few
/// scheduler pauses; a starved client never gets in at all).
const CLIENT_TIME_MAX: Duration = Duration::from_secs(5);

fn host() -> HostProcess {
    HostProcess::builder()
        .config(&format!(
            "keepalive_ms = 0\n[limits]\nconnections_max = {CONNECTIONS_MAX}\n\
             pre_auth_sockets_max = {PRE_AUTH_SOCKETS_MAX}\n"
        ))
        .start()
}

/// Opens sockets to `port` until `stop`, each sending `request` (if any) and then nothing,
/// never closing; returns them when stopped. `opened` counts them as they go.
fn flood(
    port: u16,
    request: Option<&'static [u8]>,
    stop: Arc<AtomicBool>,
    opened: Arc<AtomicUsize>,
) -> JoinHandle<Vec<TcpStream>> {
    std::thread::spawn(move || {
        let mut held = Vec::new();
        let addr = ("127.0.0.1", port);
        while !stop.load(Ordering::Relaxed) && held.len() < FLOOD_MAX {
            let Ok(mut s) = TcpStream::connect(addr) else {
                continue;
            };
            if let Some(r) = request {
                // The host may already have evicted it; that is the point.
                let _ = s.write_all(r);
            }
            held.push(s);
            opened.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(FLOOD_PACE);
        }
        held
    })
}

/// Runs a flood of `request` sockets past the whole table and checks that authenticated
/// clients keep getting in and working, and that the flood did fill the table (the host logged
/// the eviction `evicted`).
fn clients_get_in_during(request: Option<&'static [u8]>, evicted: &str) -> Vec<TcpStream> {
    let h = host();
    let (mut steady, _) = h.ws_init("steady", &[ROOT]);
    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let flooder = flood(h.port, request, stop.clone(), opened.clone());
    let deadline = Instant::now() + Duration::from_secs(30);
    while opened.load(Ordering::Relaxed) < 4 * TABLE {
        assert!(Instant::now() < deadline, "the flood did not get going");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut slowest = Duration::ZERO;
    let mut i = 0;
    while i < CLIENTS || opened.load(Ordering::Relaxed) < FLOOD_SOCKETS {
        assert!(Instant::now() < deadline, "the flood stalled");
        i += 1;
        let started = Instant::now();
        let (mut ws, _) = h.ws_init(&format!("client-{i}"), &[ROOT]);
        assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
        let took = started.elapsed();
        slowest = slowest.max(took);
        assert!(
            took < CLIENT_TIME_MAX,
            "client {i} took {took:?} to get in and be answered during the flood"
        );
        ws.close();
        assert_eq!(steady.ok("ping", json!({"channel": ROOT})), Value::Null);
    }
    stop.store(true, Ordering::Relaxed);
    let held = flooder.join().expect("flood thread");
    // Still fine once the flood stops, with its sockets still open on the peer's side.
    let (mut late, _) = h.ws_init("late", &[]);
    assert_eq!(late.ok("ping", json!({"channel": ROOT})), Value::Null);
    let log = h.stderr();
    assert!(
        log.contains(evicted),
        "the flood never filled the pre-authentication table (no {evicted:?} warning); \
         slowest client {slowest:?}\n{log}"
    );
    held
}

#[test]
fn answered_sockets_that_never_close_cannot_lock_clients_out() {
    let held = clients_get_in_during(
        Some(b"GET /nope HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"),
        "too many answered sockets without a WebSocket; oldest dropped",
    );
    // The flood's sockets were answered before they were let go.
    let mut first = held.into_iter().next().expect("a flood socket");
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut answer = Vec::new();
    let _ = first.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer:?}");
}

#[test]
fn silent_sockets_cannot_lock_clients_out() {
    clients_get_in_during(
        None,
        "too many sockets without a request head; oldest dropped",
    );
}

#[test]
fn head_senders_that_stall_cannot_lock_clients_out() {
    clients_get_in_during(
        Some(b"GET /axp HTTP/1.1\r\nHost: 127.0.0.1\r\n"),
        "too many sockets without a request head; oldest dropped",
    );
}

/// At `connections_max` an upgrade is answered 503; the answered socket is an unauthenticated
/// one like any other, and a place freed by a leaving client is taken by the next.
#[test]
fn a_full_websocket_table_answers_503_until_a_client_leaves() {
    let h = host();
    let mut open: Vec<Ws> = (0..CONNECTIONS_MAX)
        .map(|i| h.ws_init(&format!("c{i}"), &[]).0)
        .collect();
    let refused = Ws::connect(h.port, &format!("/axp?tkn={}", h.token()), &[])
        .err()
        .expect("an upgrade past connections_max is refused");
    assert_eq!(refused_status(&refused), Some(503), "{refused:?}");
    open.pop().expect("one").close();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match Ws::connect(h.port, &format!("/axp?tkn={}", h.token()), &[]) {
            Ok(mut ws) => {
                ws.initialize("again", &[]);
                break;
            }
            Err(e) if refused_status(&e) == Some(503) && Instant::now() < deadline => {
                // The core learns of the close a moment after the peer sent it.
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("no place after a client left: {}", describe_ws_error(&e)),
        }
    }
}
