//! Black-box checks of the `axhost-load` binary: clear errors (never panics) when the server is
//! missing, refuses or closes; and short real runs against an `axhost` binary (`AXHOST_BIN`, or
//! the one built beside this tool), on one thread and on several. `benches/compare.sh` is the
//! full end-to-end check with Redis and NATS.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn load(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_axhost-load"))
        .args(args)
        .env_remove("AXHOST_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run axhost-load")
}

fn assert_clean_failure(out: &Output, expect: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "panicked: {stderr}");
    assert!(stderr.contains(expect), "expected {expect:?} in: {stderr}");
}

/// A port nothing listens on (bound, then released).
fn dead_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn connection_refused_is_a_clear_error() {
    let addr = format!("127.0.0.1:{}", dead_port());
    for target in ["redis", "nats"] {
        let out = load(&["--target", target, "--addr", &addr, "--duration", "100ms"]);
        assert_clean_failure(&out, "cannot connect");
    }
    let out = load(&["--target", "axhost", "--addr", &addr, "--token", "x"]);
    assert_clean_failure(&out, "cannot connect");
}

#[test]
fn axhost_without_a_token_is_a_clear_error() {
    let out = load(&["--target", "axhost", "--addr", "127.0.0.1:1"]);
    assert_clean_failure(&out, "token");
}

/// Accepts one connection, optionally writes `reply`, and closes it.
fn one_shot_server(reply: &'static [u8]) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        if let Ok((mut s, _)) = l.accept() {
            let _ = s.set_read_timeout(Some(Duration::from_millis(200)));
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(reply);
        }
    });
    addr
}

#[test]
fn server_closing_during_setup_is_a_clear_error() {
    let addr = one_shot_server(b"");
    let out = load(&["--target", "nats", "--addr", &addr]);
    assert_clean_failure(&out, "closed the connection during setup");
    let addr = one_shot_server(b"");
    let out = load(&["--target", "redis", "--addr", &addr]);
    assert_clean_failure(&out, "closed the connection during setup");
}

#[test]
fn refused_upgrade_is_a_clear_error() {
    let addr = one_shot_server(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n");
    let out = load(&["--target", "axhost", "--addr", &addr, "--token", "wrong"]);
    assert_clean_failure(&out, "upgrade refused: HTTP/1.1 401 Unauthorized");
}

/// The `axhost` binary to run against: `AXHOST_BIN`, else the one `cargo test --workspace`
/// built next to this tool (target/debug/axhost).
fn axhost_bin() -> Option<std::path::PathBuf> {
    if let Ok(bin) = std::env::var("AXHOST_BIN") {
        return Some(bin.into());
    }
    let sibling = std::path::Path::new(env!("CARGO_BIN_EXE_axhost-load")).with_file_name("axhost");
    sibling.is_file().then_some(sibling)
}

/// A fresh host; two senders and two receivers at 2000 msg/s for one second on one thread,
/// then three senders and five receivers over three threads without kernel receive stamps,
/// then two and two again with the sleeping pace, its default millisecond and a 100 µs timer:
/// nothing lost, every message stamped, in all four; sleeping, the messages leave late (in
/// bursts, less late with the finer timer) yet at the offered rate; with kernel stamps, the
/// latency to the socket is at most the latency to the tool's read. "Less late with the finer
/// timer" compares latencies and is checked only with `AXHOST_TIMING_ASSERTS=1`. Skipped when
/// no `axhost` binary is found.
#[test]
fn real_axhost_runs_on_one_and_several_threads() {
    let Some(bin) = axhost_bin() else {
        eprintln!("skipped: set AXHOST_BIN=/path/to/axhost (or run cargo test --workspace)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("axhost-load-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut host = Command::new(&bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start axhost");
    let stdout = host.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    // Fresh data dir: `connect: ws://IP:PORT/axp?tkn=TOKEN`.
    let mut connect = None;
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) {
        if let Some(rest) = line.strip_prefix("connect: ws://") {
            connect = Some(rest.to_owned());
            break;
        }
    }
    let runs = connect.map(|c| {
        let (addr, token) = c.split_once("/axp?tkn=").expect("connect line shape");
        [
            ("2", "2", "1", "2000", "spin", "1ms", true),
            ("3", "5", "3", "2000", "spin", "1ms", false),
            ("2", "2", "1", "2000", "sleep", "1ms", true),
            ("2", "2", "1", "2000", "sleep", "100us", true),
            ("1", "1", "1", "20000", "sleep", "1ms", true),
        ]
        .map(
            |(senders, receivers, threads, rate, pace, sleep_min, stamps)| {
                let mut args = vec![
                    "--target",
                    "axhost",
                    "--addr",
                    addr,
                    "--token",
                    token,
                    "--senders",
                    senders,
                    "--receivers",
                    receivers,
                    "--threads",
                    threads,
                    "--rate",
                    rate,
                    "--pace",
                    pace,
                    "--sleep-min",
                    sleep_min,
                    "--duration",
                    "1s",
                    "--warmup",
                    "200ms",
                    "--json",
                ];
                if !stamps {
                    args.push("--no-socket-stamps");
                }
                (threads, rate, pace, sleep_min, stamps, load(&args))
            },
        )
    });
    let _ = host.kill();
    let _ = host.wait();
    let _ = std::fs::remove_dir_all(&dir);
    for (threads, rate, pace, sleep_min, stamps, out) in
        runs.expect("axhost printed no connect line")
    {
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{threads} thread(s): stdout: {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let json = stdout
            .lines()
            .find(|l| l.starts_with('{'))
            .expect("json line");
        assert!(json.contains("\"lost\":0,"), "{threads} thread(s): {json}");
        assert!(
            json.contains("\"unstamped\":0}"),
            "{threads} thread(s): {json}"
        );
        // One numeric member of the JSON line (counts and microseconds alike).
        let number = |name: &str| -> f64 {
            let key = format!("\"{name}\":");
            let at = json.find(&key).expect(name) + key.len();
            json[at..]
                .split(|c: char| c != '.' && !c.is_ascii_digit())
                .next()
                .and_then(|v| v.parse().ok())
                .expect(name)
        };
        // The rate for 1.2 s (2400 or 24,000 sent), all of them received. At 20k/s one
        // sender's millisecond of messages takes longer than the 20 µs slice, so its bursts
        // yield to the reads and resume.
        let (sent, received) = (number("sent") as u64, number("received") as u64);
        let rate: u64 = rate.parse().expect("rate");
        assert!(
            (rate..=rate * 7 / 5).contains(&sent),
            "{threads} thread(s), {rate}/s: {json}"
        );
        assert_eq!(sent, received, "{threads} thread(s): {json}");
        assert!(json.contains(&format!("\"pace\":\"{pace}\"")), "{json}");
        if cfg!(target_os = "linux") && stamps {
            // The kernel stamped (nearly) every read in the window; stamping starts from a
            // deferred kernel work item, which the 200 ms warmup covers.
            let unstamped = number("socket_unstamped");
            assert!(unstamped * 100.0 <= received as f64, "{json}");
            // Each message reaches its socket before the tool reads it.
            for q in ["p50", "p99"] {
                let (socket, read) = (
                    number(&format!("socket_{q}_us")),
                    number(&format!("{q}_us")),
                );
                assert!(
                    socket <= read,
                    "{q}: socket {socket} µs, read {read} µs: {json}"
                );
            }
        } else {
            assert!(json.contains("\"socket_p50_us\":null,"), "{json}");
        }
        if pace == "sleep" && sleep_min == "1ms" && rate == 2000 {
            // At least a millisecond between wakes, and the two senders' messages are due 0.5
            // ms apart, so most leave hundreds of µs late: the lag shows the sleeps. (Not at
            // 20k/s, where the replies wake the one sender every few tens of µs.)
            let lag = number("lag_p99_us");
            assert!(lag >= 400.0, "sleeping pace, lag p99 {lag} µs: {json}");
            // Stamped when written, the latency does not contain the lag (stamped when due,
            // every message's latency would be at least its lag). A comparison of two
            // latencies holds on a quiet machine only (CI once measured a 2.4 ms p50 beside a
            // 0.7 ms lag), so it runs when asked for.
            let (p50, lag_p50) = (number("p50_us"), number("lag_p50_us"));
            assert!(
                !timing_asserts() || p50 < lag_p50,
                "sleeping pace, p50 {p50} µs, lag p50 {lag_p50} µs: {json}"
            );
        }
        if pace == "sleep" && sleep_min == "100us" && cfg!(target_os = "linux") && timing_asserts()
        {
            // The timer wakes for each message, not on the next millisecond (about 480 µs
            // late at the median with `1ms` on the machine this was written on, 35-50 µs here).
            let lag_p50 = number("lag_p50_us");
            assert!(
                lag_p50 < 300.0,
                "100 µs timer, lag p50 {lag_p50} µs: {json}"
            );
        }
    }
}

/// Whether the assertions that compare latencies run (`AXHOST_TIMING_ASSERTS=1`): they
/// describe a quiet machine, and a loaded CI runner breaks them without any bug.
fn timing_asserts() -> bool {
    std::env::var_os("AXHOST_TIMING_ASSERTS").is_some_and(|v| v == "1")
}

/// A NATS stand-in for `connections` clients: it greets each (`INFO`), answers its `PING`, then
/// swallows what it sends; `fail_at` gets `-ERR` a moment after setup.
fn nats_that_fails_one(connections: usize, fail_at: usize) -> String {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for n in 0..connections {
            let Ok((mut s, _)) = l.accept() else { return };
            std::thread::spawn(move || {
                let _ = s.write_all(b"INFO {}\r\n");
                let mut seen = Vec::new();
                let mut buf = [0u8; 4096];
                while !seen.windows(6).any(|w| w == b"PING\r\n") {
                    match s.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(k) => seen.extend_from_slice(&buf[..k]),
                    }
                }
                let _ = s.write_all(b"PONG\r\n");
                if n == fail_at {
                    std::thread::sleep(Duration::from_millis(300));
                    let _ = s.write_all(b"-ERR 'stand-in failure'\r\n");
                }
                while matches!(s.read(&mut buf), Ok(k) if k > 0) {}
            });
        }
    });
    addr
}

/// An error on one load thread ends the whole run at once, and it is the error reported (the
/// other threads stop rather than run out the 10 s window and the drain).
#[test]
fn an_error_on_one_thread_stops_them_all() {
    // Receivers connect first: receiver 1 is on thread 1, the sender and receiver 0 on thread 0.
    let addr = nats_that_fails_one(3, 1);
    let started = std::time::Instant::now();
    let out = load(&[
        "--target",
        "nats",
        "--addr",
        &addr,
        "--senders",
        "1",
        "--receivers",
        "2",
        "--threads",
        "2",
        "--rate",
        "1000",
        "--duration",
        "10s",
    ]);
    assert_clean_failure(&out, "receiver 1: nats error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("stand-in failure"));
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "took {:?}",
        started.elapsed()
    );
}
