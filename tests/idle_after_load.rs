//! The real `axhost serve` goes back to sleep once its load stops: after a burst of back-to-back
//! requests, and after a flat-out sender of one notification per write (the load that can make
//! the driver coalesce its reads, `io/src/server/coalesce.rs`), an idle host burns no CPU and
//! answers the next message at once. Neither spinning rule may outlive its load: busy-polling
//! (`io/src/server/busy_poll.rs`) wastes at most one budget after a burst, and coalescing stops
//! its gaps when the sender does. Whether a rule started under the load is not asserted here: it
//! depends on how closely a debug-build client's messages follow each other on this machine, and
//! the rules' own unit tests check when they start.

#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

/// Notifications the flat-out sender sends.
const FLOOD: u64 = 50_000;

/// User plus system CPU time of `pid`, in clock ticks (`/proc/PID/stat` fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("read stat");
    // The command name (field 2) may hold spaces; fields after it are plain.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields[11].parse().expect("utime");
    let stime: u64 = fields[12].parse().expect("stime");
    utime + stime
}

/// Lets the last spin end, then watches the idle host for a second: a host that kept spinning
/// would show ~100 ticks (CLK_TCK is 100 on Linux).
fn assert_sleeps(pid: u32, after: &str) {
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let idle = cpu_ticks(pid) - before;
    assert!(
        idle <= 5,
        "host used {idle} ticks of CPU in 1 s of idleness after {after}"
    );
}

#[test]
fn an_idle_host_sleeps_after_a_burst() {
    let host = HostProcess::start();
    let pid = host.pid().expect("pid");
    let (mut ws, _) = host.ws_init("burst", &[]);
    let started = Instant::now();
    for _ in 0..5_000 {
        assert_eq!(
            ws.ok("ping", json!({"channel": "ahp-root://"})),
            Value::Null
        );
    }
    let burst = started.elapsed();
    assert_sleeps(pid, &format!("a {burst:?} burst"));
    // And it still answers at once.
    assert_eq!(
        ws.ok("ping", json!({"channel": "ahp-root://"})),
        Value::Null
    );
}

#[test]
fn a_host_stops_coalescing_and_sleeps_after_a_flat_out_sender() {
    let host = HostProcess::builder()
        .env("RUST_LOG", "info,axhost_io::server=debug")
        .start();
    let pid = host.pid().expect("pid");
    let (mut owner, _) = host.ws_init("owner", &[]);
    let service = owner.register_service(json!({"protocol": "flood"}), None);
    let (mut sender, _) = host.ws_init("sender", &[]);
    // The owner reads on its own thread while the sender writes one frame per `send`.
    let reader = std::thread::spawn(move || {
        let mut next = 0;
        loop {
            match owner.next(Duration::from_secs(3)) {
                Incoming::Json(v) => {
                    let n = v["params"]["params"]["n"].as_u64().expect("n");
                    // The host may drop above a connection's queue bound, never reorder or repeat.
                    assert!(
                        n >= next,
                        "notification {n} after {next}: reordered or repeated"
                    );
                    next = n + 1;
                    if n == FLOOD - 1 {
                        return owner;
                    }
                }
                Incoming::Timeout => return owner,
                Incoming::Closed(c) => panic!("owner closed: {c:?}"),
            }
        }
    });
    for n in 0..FLOOD {
        sender.notify_service(&service, "n", json!({"n": n}));
    }
    let mut owner = reader.join().expect("reader");
    assert_sleeps(pid, "the flood");
    // The next notification is relayed at once, without a gap left over.
    let started = Instant::now();
    sender.notify_service(&service, "n", json!({"n": FLOOD}));
    let v = owner.recv_within(Duration::from_secs(5));
    assert_eq!(v["params"]["params"]["n"], json!(FLOOD), "{v}");
    let after_flood = started.elapsed();
    assert!(
        after_flood < Duration::from_millis(500),
        "took {after_flood:?}"
    );
    // Whether this build got saturated with small turns depends on its speed (a debug host
    // falls behind a debug sender and reads large turns); report it, the unit tests decide.
    let log = host.stderr();
    eprintln!(
        "coalescing started {} times, stopped {} times",
        log.matches("read coalescing started").count(),
        log.matches("read coalescing stopped").count()
    );
}
