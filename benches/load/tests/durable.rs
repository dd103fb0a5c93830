//! Black-box checks of `axhost-durable`: a one-second durable load with the request pair
//! against a fresh real host (`AXHOST_BIN`, or the `axhost` that `cargo test --workspace` builds
//! beside the tool) reports non-zero figures for every part; the SQLite probe commits; missing
//! pieces are clear errors. `benches/durable.sh` is the full run.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

fn durable(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_axhost-durable"))
        .args(args)
        .env_remove("AXHOST_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run axhost-durable")
}

fn axhost_bin() -> Option<PathBuf> {
    if let Ok(bin) = std::env::var("AXHOST_BIN") {
        return Some(bin.into());
    }
    let sibling =
        std::path::Path::new(env!("CARGO_BIN_EXE_axhost-durable")).with_file_name("axhost");
    sibling.is_file().then_some(sibling)
}

/// A host on a fresh data directory: the process, the directory, `IP:PORT` and the token it
/// printed.
fn start_host(bin: &std::path::Path, dir: &std::path::Path) -> (Child, Option<(String, String)>) {
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
        if let Some(rest) = line.strip_prefix("connect: ws://") {
            let found = rest
                .split_once("/axp?tkn=")
                .map(|(a, t)| (a.to_owned(), t.to_owned()));
            return (host, found);
        }
    }
    (host, None)
}

/// One numeric member of a JSON line (`null` is `None`).
fn number(json: &str, name: &str) -> Option<f64> {
    let key = format!("\"{name}\":");
    let at = json
        .find(&key)
        .unwrap_or_else(|| panic!("{name} in {json}"))
        + key.len();
    json[at..]
        .split([',', '}'])
        .next()
        .and_then(|v| v.parse().ok())
}

#[test]
fn a_second_of_durable_load_reports_every_figure() {
    let Some(bin) = axhost_bin() else {
        eprintln!("skipped: set AXHOST_BIN=/path/to/axhost (or run cargo test --workspace)");
        return;
    };
    let dir = std::env::temp_dir().join(format!("axhost-durable-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let (mut host, found) = start_host(&bin, &dir);
    let out = found.as_ref().map(|(addr, token)| {
        durable(&[
            "--addr",
            addr,
            "--token",
            token,
            "--writers",
            "2",
            "--requests",
            "--duration",
            "1s",
            "--warmup",
            "200ms",
            "--json",
        ])
    });
    let _ = host.kill();
    let _ = host.wait();
    let _ = std::fs::remove_dir_all(&dir);
    let out = out.expect("axhost printed no connect line");
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
        "changes",
        "changes_per_s",
        "echo_p50_us",
        "echo_p99_us",
        "writer_min",
        "request_count",
        "requests_per_s",
        "request_p50_us",
        "request_p99_us",
    ] {
        let v = number(json, name).unwrap_or(0.0);
        assert!(v > 0.0, "{name} is {v}: {json}");
    }
    assert!(
        number(json, "echo_p50_us") <= number(json, "echo_p99_us"),
        "{json}"
    );
    // Both writers' changes are in the count: each got some, together all of them.
    let (min, max, changes) = (
        number(json, "writer_min").unwrap_or(0.0),
        number(json, "writer_max").unwrap_or(0.0),
        number(json, "changes").unwrap_or(0.0),
    );
    assert!(min + max == changes, "{json}");
}

#[test]
fn the_sqlite_probe_commits() {
    let dir = std::env::temp_dir().join(format!("axhost-durable-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("probe dir");
    let out = durable(&[
        "--sqlite-probe",
        dir.to_str().expect("utf-8 temp dir"),
        "--warmup",
        "0s",
        "--duration",
        "300ms",
        "--json",
    ]);
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
        .unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout} {:?}", out.stderr);
    let json = stdout.lines().find(|l| l.starts_with('{')).expect("json");
    assert!(number(json, "commits").unwrap_or(0.0) > 0.0, "{json}");
    assert!(number(json, "commit_p50_us").unwrap_or(0.0) > 0.0, "{json}");
    assert!(left.is_empty(), "the probe left {left:?}");
}

#[test]
fn missing_pieces_are_clear_errors() {
    let out = durable(&["--addr", "127.0.0.1:1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("token"), "{stderr}");
    let out = durable(&["--addr", "127.0.0.1:1", "--token", "x", "--writers", "0"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("nothing to run"), "{stderr}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let out = durable(&["--addr", &addr, "--token", "x"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("cannot connect") && !stderr.contains("panicked"),
        "{stderr}"
    );
}
