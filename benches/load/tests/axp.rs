//! Black-box checks of `axhost-axp`: a short AXP load (4 sessions, renewals and settle/reserve
//! cycles inside the window, both turn cycles) against a fresh real host (`AXHOST_BIN`, or the
//! `axhost` that `cargo test --workspace` builds beside the tool) holds every invariant and
//! reports every figure; missing pieces are clear errors. `benches/axp.sh` is the full run.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn axp(args: &[&str], tokens: Option<(&str, &str)>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_axhost-axp"));
    c.args(args)
        .env_remove("AXHOST_MAINTAINER_TOKEN")
        .env_remove("AXHOST_CONTRIBUTOR_TOKEN")
        .stdin(Stdio::null());
    if let Some((m, k)) = tokens {
        c.env("AXHOST_MAINTAINER_TOKEN", m)
            .env("AXHOST_CONTRIBUTOR_TOKEN", k);
    }
    c.output().expect("run axhost-axp")
}

fn axhost_bin() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var("AXHOST_BIN") {
        return Some(bin.into());
    }
    let sibling = Path::new(env!("CARGO_BIN_EXE_axhost-axp")).with_file_name("axhost");
    sibling.is_file().then_some(sibling)
}

/// `axhost token add` on `dir`: the new token.
fn token(bin: &Path, dir: &Path, id: &str, role: &str) -> String {
    let out = Command::new(bin)
        .args(["token", "add", "--id", id, "--role", role, "--data-dir"])
        .arg(dir)
        .stdin(Stdio::null())
        .output()
        .expect("axhost token add");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// A host on `dir`: the process and the `IP:PORT` it listens on.
fn start_host(bin: &Path, dir: &Path) -> (Child, Option<String>) {
    let mut host = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir)
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
    while let Ok(line) = rx.recv_timeout(Duration::from_secs(20)) {
        if let Some(rest) = line.strip_prefix("axhost listening on ws://") {
            return (host, rest.split('/').next().map(str::to_owned));
        }
    }
    (host, None)
}

/// One member of a JSON line, as text (`null` is `None`).
fn member<'a>(json: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("{name} in {json}"))
        + key.len();
    json[at..].split([',', '}']).next().filter(|v| *v != "null")
}

fn number(json: &str, name: &str) -> f64 {
    member(json, name)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn short_run(cycle: &str) {
    let Some(bin) = axhost_bin() else {
        eprintln!("skipped: set AXHOST_BIN=/path/to/axhost (or run cargo test --workspace)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("axhost-axp-test-{cycle}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("data dir");
    let m = token(&bin, &dir, "bench-maintainer", "maintainer");
    let c = token(&bin, &dir, "bench-contributor", "contributor");
    let (mut host, addr) = start_host(&bin, &dir);
    let pid = host.id().to_string();
    let out = addr.as_ref().map(|addr| {
        axp(
            &[
                "--addr",
                addr,
                "--host-pid",
                &pid,
                "--sessions",
                "4",
                "--rate",
                "20",
                "--viewers",
                "2",
                "--settle-every",
                "5",
                "--lease-ms",
                "3000",
                "--cycle",
                cycle,
                "--duration",
                "1500ms",
                "--warmup",
                "200ms",
                "--json",
            ],
            Some((&m, &c)),
        )
    });
    let _ = host.kill();
    let _ = host.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.expect("axhost printed no listening line");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json = stdout
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("json line");
    for name in [
        "window_emits",
        "emits_per_s",
        "emit_reply_p50_ms",
        "emit_reply_p99_ms",
        "deliver_count",
        "deliver_p50_ms",
        "deliver_p99_ms",
        "deliveries_expected",
        "settles",
        "turns_started",
        "renewals",
        "cycle_count",
        "rss_before_kib",
        "rss_setup_kib",
        "rss_after_kib",
    ] {
        assert!(number(json, name) > 0.0, "{name}: {json}");
    }
    for name in [
        "leases_lost",
        "error_answers",
        "unanswered",
        "dead_executors",
    ] {
        assert_eq!(number(json, name), 0.0, "{name}: {json}");
    }
    assert_eq!(member(json, "invariants_hold"), Some("true"), "{json}");
    assert_eq!(
        number(json, "deliveries_expected"),
        number(json, "deliveries_received"),
        "{json}"
    );
    // Two viewers per session: each emit in the window is one sample on each.
    assert_eq!(
        number(json, "deliver_count"),
        2.0 * number(json, "window_emits"),
        "{json}"
    );
}

#[test]
fn a_short_run_with_the_maintainer_starting_turns_holds_every_invariant() {
    short_run("start");
}

#[test]
fn a_short_run_with_queued_turns_holds_every_invariant() {
    short_run("queue");
}

#[test]
fn missing_pieces_are_clear_errors() {
    let out = axp(&["--addr", "127.0.0.1:1"], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--maintainer-token"), "{stderr}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let out = axp(&["--addr", &addr, "-n", "2"], Some(("m", "c")));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot connect") && !stderr.contains("panicked"),
        "{stderr}"
    );
    let out = axp(
        &["--addr", &addr, "-n", "3000", "--connections-max", "10"],
        Some(("m", "c")),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("connections-max"), "{stderr}");
}
