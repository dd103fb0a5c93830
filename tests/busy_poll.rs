//! The real `axhost serve` busy-polls only under load: after a burst of back-to-back requests
//! (which starts the spinning), an idle host goes back to sleeping and burns no CPU.

#![cfg(target_os = "linux")]

mod common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

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
    // Let the last spin end, then watch the idle host for a second.
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(1));
    let idle = cpu_ticks(pid) - before;
    // A host that kept spinning would show ~100 ticks (CLK_TCK is 100 on Linux).
    assert!(
        idle <= 5,
        "host used {idle} ticks of CPU in 1 s of idleness after a {burst:?} burst"
    );
    // And it still answers at once.
    assert_eq!(
        ws.ok("ping", json!({"channel": "ahp-root://"})),
        Value::Null
    );
}
