//! Black-box harness: runs the real `axhost` binary on a free port over a temporary data
//! directory, and speaks raw WebSocket / HTTP to it.
//!
//! Everything here goes through the documented command-line contract:
//! - `axhost serve --listen 127.0.0.1:0 --data-dir DIR` prints a stdout line containing
//!   `ws://IP:PORT/axp` once it accepts connections; on a fresh data directory it also prints
//!   `connect: ws://IP:PORT/axp?tkn=<token>` with a generated maintainer token.
//! - `axhost token add --data-dir DIR --id ID --role ROLE [--sessions URI,...]` prints the new
//!   token as its last stdout line.
//! - configuration is read from `DIR/axhost.toml` at start; SIGTERM exits cleanly.

#![allow(dead_code)]

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::client::IntoClientRequest;
use tungstenite::handshake::HandshakeError;
use tungstenite::http::HeaderValue;
use tungstenite::protocol::frame::coding::CloseCode;
use tungstenite::protocol::CloseFrame;
use tungstenite::{Message, WebSocket};

/// How long a host gets to print its listening line.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Default wait for one expected frame.
pub const FRAME_TIMEOUT: Duration = Duration::from_secs(10);

/// The binary under test: this build's, or the one `AXHOST_BIN` names (to run the black-box
/// suites against another build of the host, e.g. a work in progress elsewhere).
pub fn axhost_bin() -> &'static str {
    static BIN: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        std::env::var("AXHOST_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_axhost").to_owned())
    })
}

/// An extra principal created with `axhost token add` before the host starts.
#[derive(Clone, Debug)]
pub struct PrincipalSpec {
    pub id: String,
    pub role: String,
    /// `None` = all sessions (the CLI default).
    pub sessions: Option<Vec<String>>,
}

/// Builds a host: optional `axhost.toml` text and extra principals.
#[derive(Default)]
pub struct HostBuilder {
    config: Option<String>,
    /// Text appended to `axhost.toml` after the principals exist (e.g. `[[trust_group]]`,
    /// which may only name configured principals).
    config_after: Option<String>,
    principals: Vec<PrincipalSpec>,
    env: Vec<(String, String)>,
}

/// The id of the maintainer the harness adds itself whenever the data directory is not left
/// fresh (config or principals given), because then no generated token is guaranteed.
pub const ADMIN: &str = "admin";

impl HostBuilder {
    pub fn new() -> HostBuilder {
        HostBuilder::default()
    }

    /// Text written to `DIR/axhost.toml` before any principal is added or the host starts.
    pub fn config(mut self, toml: &str) -> HostBuilder {
        self.config = Some(toml.to_owned());
        self
    }

    /// Text appended to `DIR/axhost.toml` once every principal was added, before the host
    /// starts: the place for `[[trust_group]]`, which may only name configured principals.
    pub fn config_after_principals(mut self, toml: &str) -> HostBuilder {
        self.config_after = Some(toml.to_owned());
        self
    }

    /// An environment variable for the `serve` process (e.g. `RUST_LOG`).
    pub fn env(mut self, key: &str, value: &str) -> HostBuilder {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// Adds a principal with `axhost token add` before start.
    pub fn principal(mut self, id: &str, role: &str, sessions: Option<&[&str]>) -> HostBuilder {
        self.principals.push(PrincipalSpec {
            id: id.to_owned(),
            role: role.to_owned(),
            sessions: sessions.map(|s| s.iter().map(|x| (*x).to_owned()).collect()),
        });
        self
    }

    pub fn start(self) -> HostProcess {
        let tmp = tempfile::Builder::new()
            .prefix("axhost-test-")
            .tempdir()
            .expect("tempdir");
        let data_dir = tmp.path().join("data");
        let fresh =
            self.config.is_none() && self.config_after.is_none() && self.principals.is_empty();
        let mut tokens = BTreeMap::new();
        if !fresh {
            create_private_dir(&data_dir);
            if let Some(cfg) = &self.config {
                std::fs::write(data_dir.join("axhost.toml"), cfg).expect("write axhost.toml");
            }
            let admin = PrincipalSpec {
                id: ADMIN.into(),
                role: "maintainer".into(),
                sessions: None,
            };
            for p in std::iter::once(&admin).chain(self.principals.iter()) {
                let sessions: Option<Vec<&str>> = p
                    .sessions
                    .as_ref()
                    .map(|s| s.iter().map(String::as_str).collect());
                let token = token_add(&data_dir, &p.id, &p.role, sessions.as_deref());
                tokens.insert(p.id.clone(), token);
            }
            if let Some(extra) = &self.config_after {
                let path = data_dir.join("axhost.toml");
                let mut text = std::fs::read_to_string(&path).unwrap_or_default();
                text.push('\n');
                text.push_str(extra);
                std::fs::write(&path, text).expect("append to axhost.toml");
            }
        }
        let mut host = HostProcess {
            tmp: Arc::new(tmp),
            data_dir,
            child: None,
            port: 0,
            generated_token: None,
            tokens,
            stdout_lines: Arc::new(Mutex::new(Vec::new())),
            env: self.env,
        };
        host.spawn(fresh);
        host
    }
}

fn create_private_dir(dir: &Path) {
    std::fs::create_dir_all(dir).expect("create data dir");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    }
}

/// Runs `axhost ARGS...` to completion.
pub fn run_cli(args: &[&str]) -> Output {
    Command::new(axhost_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run axhost")
}

/// `axhost token add`; returns the token (last stdout line).
pub fn token_add(data_dir: &Path, id: &str, role: &str, sessions: Option<&[&str]>) -> String {
    let dir = data_dir.to_str().expect("utf-8 path");
    let joined = sessions.map(|s| s.join(","));
    let mut args = vec![
        "token",
        "add",
        "--data-dir",
        dir,
        "--id",
        id,
        "--role",
        role,
    ];
    if let Some(j) = &joined {
        args.push("--sessions");
        args.push(j);
    }
    let out = run_cli(&args);
    assert!(
        out.status.success(),
        "axhost {} failed: {:?}\nstdout: {}\nstderr: {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let token = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim()
        .to_owned();
    assert!(
        token.len() >= 24,
        "token add printed no usable token as its last line: {stdout:?}"
    );
    token
}

/// A running `axhost serve`. Sends SIGTERM and waits on drop.
pub struct HostProcess {
    tmp: Arc<tempfile::TempDir>,
    pub data_dir: PathBuf,
    child: Option<Child>,
    pub port: u16,
    /// The maintainer token the host printed on first start of a fresh data directory.
    pub generated_token: Option<String>,
    /// Tokens of principals created with `token add`, by id (includes [`ADMIN`] when added).
    pub tokens: BTreeMap<String, String>,
    stdout_lines: Arc<Mutex<Vec<String>>>,
    env: Vec<(String, String)>,
}

impl HostProcess {
    /// A fresh host with default configuration and its generated maintainer token.
    pub fn start() -> HostProcess {
        HostBuilder::new().start()
    }

    pub fn builder() -> HostBuilder {
        HostBuilder::new()
    }

    fn stderr_path(&self) -> PathBuf {
        self.tmp.path().join("stderr.log")
    }

    /// What the host wrote to stderr so far (for failure messages).
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.stderr_path()).unwrap_or_default()
    }

    /// What the host wrote to stdout so far.
    pub fn stdout(&self) -> Vec<String> {
        self.stdout_lines
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    fn spawn(&mut self, expect_generated_token: bool) {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stderr_path())
            .expect("stderr log");
        let mut child = Command::new(axhost_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&self.data_dir)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn axhost serve");
        let stdout = child.stdout.take().expect("stdout pipe");
        let (tx, rx) = mpsc::channel::<String>();
        let lines = self.stdout_lines.clone();
        std::thread::spawn(move || {
            // Keeps draining stdout for the life of the process so it never blocks on a pipe.
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Ok(mut l) = lines.lock() {
                    l.push(line.clone());
                }
                let _ = tx.send(line);
            }
        });
        self.child = Some(child);
        self.wait_ready(&rx, expect_generated_token);
    }

    fn wait_ready(&mut self, rx: &Receiver<String>, expect_generated_token: bool) {
        let deadline = Instant::now() + START_TIMEOUT;
        let mut port = None;
        let mut token = None;
        while port.is_none() || (expect_generated_token && token.is_none()) {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Some(p) = parse_ws_port(&line) {
                        port.get_or_insert(p);
                    }
                    if let Some(t) = parse_token(&line) {
                        token.get_or_insert(t);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    self.fail_start("timed out waiting for the ws:// line")
                }
                Err(RecvTimeoutError::Disconnected) => {
                    self.fail_start("stdout closed before the ws:// line")
                }
            }
        }
        self.port = port.unwrap_or_default();
        if token.is_some() {
            self.generated_token = token;
        }
    }

    fn fail_start(&mut self, why: &str) -> ! {
        let status = self
            .child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten());
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        panic!(
            "axhost serve: {why} (exit: {status:?})\nstdout:\n{}\nstderr:\n{}",
            self.stdout().join("\n"),
            self.stderr()
        );
    }

    /// The maintainer token tests use: the generated one, else [`ADMIN`]'s.
    pub fn token(&self) -> &str {
        self.generated_token
            .as_deref()
            .or_else(|| self.tokens.get(ADMIN).map(String::as_str))
            .expect("no maintainer token: fresh host printed none and no admin was added")
    }

    /// Token of a principal added before start.
    pub fn token_of(&self, id: &str) -> &str {
        self.tokens
            .get(id)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("no principal {id}"))
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `ws://127.0.0.1:PORT/axp?tkn=TOKEN`
    pub fn ws_url(&self, token: &str) -> String {
        format!("ws://127.0.0.1:{}/axp?tkn={token}", self.port)
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// SIGTERM, then wait (10 s) for the exit; SIGKILL if it does not go.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        self.stop_with("TERM")
    }

    /// Sends `signal` (`TERM`, `INT`), then waits (10 s) for the exit; SIGKILL if it does not go.
    pub fn stop_with(&mut self, signal: &str) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    panic!("axhost did not exit within 10 s of SIG{signal} (killed: {status:?})");
                }
            }
        }
    }

    /// SIGKILL: no chance to flush or clean up, as in a crash or power loss of the process.
    pub fn crash(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops the host if it runs (asserting a clean exit) and starts a new process on the same
    /// data directory (new port).
    pub fn restart(&mut self) {
        if self.child.is_some() {
            let status = self.stop();
            assert!(
                status.is_some_and(|s| s.success()),
                "host did not exit cleanly on SIGTERM: {status:?}\nstderr:\n{}",
                self.stderr()
            );
        }
        self.spawn(false);
    }

    /// Starts a second `serve` on this data directory and returns its output (it must exit).
    pub fn second_serve(&self) -> Output {
        let mut child = Command::new(axhost_bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&self.data_dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn second serve");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match child.try_wait() {
                Ok(Some(_)) => return child.wait_with_output().expect("output"),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                _ => {
                    let _ = child.kill();
                    let out = child.wait_with_output().expect("output");
                    panic!(
                        "a second serve on a data directory in use kept running\nstdout: {}\nstderr: {}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    );
                }
            }
        }
    }

    /// A raw WebSocket on `/axp` with the maintainer token in `?tkn=`. Panics if refused.
    pub fn ws(&self) -> Ws {
        self.ws_as(self.token())
    }

    /// A raw WebSocket on `/axp` with `token` in `?tkn=`. Panics if refused.
    pub fn ws_as(&self, token: &str) -> Ws {
        Ws::connect(self.port, &format!("/axp?tkn={token}"), &[])
            .unwrap_or_else(|e| panic!("WebSocket connect refused: {}", describe_ws_error(&e)))
    }

    /// A raw WebSocket that has completed `initialize` offering `["0.9.0"]`.
    pub fn ws_init(&self, client_id: &str, subs: &[&str]) -> (Ws, Value) {
        self.ws_init_as(self.token(), client_id, subs)
    }

    pub fn ws_init_as(&self, token: &str, client_id: &str, subs: &[&str]) -> (Ws, Value) {
        let mut ws = self.ws_as(token);
        let result = ws.initialize(client_id, subs);
        (ws, result)
    }

    /// One HTTP/1.1 request; returns (status, body).
    pub fn http(&self, method: &str, path: &str) -> (u16, String) {
        http_request(self.port, method, path, &[])
    }
}

impl Drop for HostProcess {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The port of the first `ws://IP:PORT/axp` in a line.
pub fn parse_ws_port(line: &str) -> Option<u16> {
    let rest = &line[line.find("ws://")? + 5..];
    let end = rest.find("/axp")?;
    let authority = &rest[..end];
    authority.rsplit_once(':')?.1.parse().ok()
}

/// The token of a `...?tkn=TOKEN` (or `token=`) URL in a line.
pub fn parse_token(line: &str) -> Option<String> {
    let i = line
        .find("?tkn=")
        .map(|i| i + 5)
        .or_else(|| line.find("?token=").map(|i| i + 7))?;
    let t: String = line[i..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '&')
        .collect();
    (!t.is_empty()).then_some(t)
}

// ─── HTTP ────────────────────────────────────────────────────────────────────

/// Sends one HTTP/1.1 request with `Connection: close`; returns (status, body).
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut req =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).expect("write request");
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        // Stop as soon as the whole response is in, even if the host keeps the socket open.
        if let Some((status, body)) = parse_http_response(&buf) {
            return (status, body);
        }
        if Instant::now() > deadline {
            break;
        }
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                break
            }
            Err(_) => break,
        }
    }
    // EOF: whatever came is the response.
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, body.to_owned())
}

fn parse_http_response(buf: &[u8]) -> Option<(u16, String)> {
    let text = std::str::from_utf8(buf).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    let len = head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("content-length")
            .then(|| v.trim().parse::<usize>().ok())
            .flatten()
    })?;
    (body.len() >= len).then(|| (status, body[..len].to_owned()))
}

// ─── Raw WebSocket ───────────────────────────────────────────────────────────

/// What came off a raw WebSocket.
#[derive(Debug)]
pub enum Incoming {
    /// A text frame holding JSON.
    Json(Value),
    /// The host closed (with its close frame, if it sent one) or the stream ended.
    Closed(Option<CloseFrame>),
    /// Nothing arrived in time.
    Timeout,
}

/// A blocking raw WebSocket client with JSON helpers.
pub struct Ws {
    ws: WebSocket<TcpStream>,
    next_id: u64,
    /// Frames read while waiting for something else (e.g. notifications before a response).
    queued: VecDeque<Value>,
    closed: Option<Option<CloseFrame>>,
    /// Every JSON frame read from this socket, in arrival order (the connection's wire trace).
    pub received: Vec<Value>,
}

/// Human-readable form of a refused handshake, with the HTTP status when there is one.
pub fn describe_ws_error(e: &tungstenite::Error) -> String {
    match e {
        tungstenite::Error::Http(resp) => format!(
            "HTTP {} {}",
            resp.status(),
            resp.body()
                .as_deref()
                .map(String::from_utf8_lossy)
                .unwrap_or_default()
        ),
        other => other.to_string(),
    }
}

/// The HTTP status of a refused WebSocket handshake, if the host answered with one.
pub fn refused_status(e: &tungstenite::Error) -> Option<u16> {
    match e {
        tungstenite::Error::Http(resp) => Some(resp.status().as_u16()),
        _ => None,
    }
}

impl Ws {
    /// Opens `ws://127.0.0.1:PORT{path_and_query}` with extra request headers.
    pub fn connect(
        port: u16,
        path_and_query: &str,
        headers: &[(&str, &str)],
    ) -> Result<Ws, tungstenite::Error> {
        let url = format!("ws://127.0.0.1:{port}{path_and_query}");
        let mut req = url.into_client_request()?;
        for (k, v) in headers {
            let name = tungstenite::http::header::HeaderName::from_bytes(k.as_bytes())
                .expect("header name");
            req.headers_mut()
                .insert(name, HeaderValue::from_str(v).expect("header value"));
        }
        let stream = TcpStream::connect(("127.0.0.1", port)).map_err(tungstenite::Error::Io)?;
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .map_err(tungstenite::Error::Io)?;
        stream.set_nodelay(true).map_err(tungstenite::Error::Io)?;
        let (ws, _resp) = tungstenite::client(req, stream).map_err(|e| match e {
            HandshakeError::Failure(e) => e,
            HandshakeError::Interrupted(_) => tungstenite::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "handshake timed out",
            )),
        })?;
        Ok(Ws {
            ws,
            next_id: 1,
            queued: VecDeque::new(),
            closed: None,
            received: Vec::new(),
        })
    }

    /// Lets this client read frames of up to `bytes` (tungstenite reads at most 16 MiB a frame
    /// by default; a host may answer with one larger frame, e.g. a maximal AXP blob).
    pub fn set_max_frame(&mut self, bytes: usize) {
        self.ws.set_config(|c| {
            c.max_frame_size = Some(bytes);
            c.max_message_size = Some(bytes.max(c.max_message_size.unwrap_or(0)));
        });
    }

    pub fn send_text(&mut self, text: &str) {
        self.ws.send(Message::text(text)).expect("send text frame");
    }

    /// Sends a text frame; false if the connection is gone (for tests that kill the host).
    pub fn try_send_text(&mut self, text: &str) -> bool {
        self.ws.send(Message::text(text)).is_ok()
    }

    pub fn send_json(&mut self, v: &Value) {
        self.send_text(&v.to_string());
    }

    pub fn send_binary(&mut self, bytes: &[u8]) {
        self.ws
            .send(Message::binary(bytes.to_vec()))
            .expect("send binary frame");
    }

    /// Sends a request with the next numeric id; returns the id.
    pub fn send_request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send_json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        id
    }

    /// Sends a notification.
    pub fn notify(&mut self, method: &str, params: Value) {
        self.send_json(&json!({"jsonrpc": "2.0", "method": method, "params": params}));
    }

    /// `dispatchAction` notification.
    pub fn dispatch(&mut self, channel: &str, client_seq: u64, action: Value) {
        self.notify(
            "dispatchAction",
            json!({"channel": channel, "clientSeq": client_seq, "action": action}),
        );
    }

    /// Reads the next frame from the socket (ignoring what is queued).
    fn read_frame(&mut self, timeout: Duration) -> Incoming {
        if let Some(c) = &self.closed {
            return Incoming::Closed(c.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Incoming::Timeout;
            }
            let _ = self.ws.get_mut().set_read_timeout(Some(left));
            match self.ws.read() {
                Ok(Message::Text(t)) => {
                    let v: Value = serde_json::from_str(t.as_str()).unwrap_or_else(|e| {
                        panic!("host sent a text frame that is not JSON ({e}): {t}")
                    });
                    self.received.push(v.clone());
                    return Incoming::Json(v);
                }
                Ok(Message::Binary(b)) => panic!("host sent a binary frame ({} bytes)", b.len()),
                Ok(Message::Close(frame)) => {
                    self.closed = Some(frame.clone());
                    return Incoming::Closed(frame);
                }
                Ok(_) => continue, // ping / pong / raw frame
                Err(tungstenite::Error::Io(e))
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    continue; // re-check the deadline
                }
                Err(_) => {
                    self.closed = Some(None);
                    return Incoming::Closed(None);
                }
            }
        }
    }

    /// The next frame: queued ones first.
    pub fn next(&mut self, timeout: Duration) -> Incoming {
        match self.queued.pop_front() {
            Some(v) => Incoming::Json(v),
            None => self.read_frame(timeout),
        }
    }

    /// The next JSON frame; panics on timeout or close.
    pub fn recv(&mut self) -> Value {
        self.recv_within(FRAME_TIMEOUT)
    }

    pub fn recv_within(&mut self, timeout: Duration) -> Value {
        match self.next(timeout) {
            Incoming::Json(v) => v,
            other => panic!("expected a JSON frame, got {other:?}"),
        }
    }

    /// Asserts that nothing arrives within `ms` milliseconds.
    pub fn expect_no_frame(&mut self, ms: u64) {
        match self.next(Duration::from_millis(ms)) {
            Incoming::Timeout => {}
            Incoming::Json(v) => panic!("expected no frame within {ms} ms, got {v}"),
            Incoming::Closed(c) => {
                panic!("expected no frame within {ms} ms, but the connection closed: {c:?}")
            }
        }
    }

    /// Waits for the connection to close; returns the close frame (if any). Frames that arrive
    /// first are returned too.
    pub fn expect_closed(&mut self, timeout: Duration) -> (Option<CloseFrame>, Vec<Value>) {
        let deadline = Instant::now() + timeout;
        let mut seen = Vec::new();
        loop {
            match self.next(deadline.saturating_duration_since(Instant::now())) {
                Incoming::Json(v) => seen.push(v),
                Incoming::Closed(c) => return (c, seen),
                Incoming::Timeout => {
                    panic!("connection still open after {timeout:?}; frames seen: {seen:?}")
                }
            }
        }
    }

    /// Waits for the response with `id`, queuing anything else that arrives first.
    pub fn response(&mut self, id: u64) -> Value {
        if let Some(i) = self
            .queued
            .iter()
            .position(|v| v.get("id") == Some(&json!(id)) && is_response(v))
        {
            return self.queued.remove(i).expect("queued");
        }
        let deadline = Instant::now() + FRAME_TIMEOUT;
        loop {
            match self.read_frame(deadline.saturating_duration_since(Instant::now())) {
                Incoming::Json(v) if v.get("id") == Some(&json!(id)) && is_response(&v) => {
                    return v
                }
                Incoming::Json(v) => self.queued.push_back(v),
                other => panic!("waiting for the response to request {id}, got {other:?}"),
            }
        }
    }

    /// Sends a request and returns the whole response object.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send_request(method, params);
        self.response(id)
    }

    /// Sends a request and returns its `result`; panics on an error response.
    pub fn ok(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params);
        assert!(r.get("error").is_none(), "{method} failed: {r}");
        assert_eq!(r["jsonrpc"], "2.0", "response without jsonrpc 2.0: {r}");
        r.get("result")
            .cloned()
            .unwrap_or_else(|| panic!("{method}: response has no result: {r}"))
    }

    /// Sends a request and returns its `error` object; panics on success.
    pub fn err(&mut self, method: &str, params: Value) -> Value {
        let r = self.call(method, params);
        r.get("error")
            .cloned()
            .unwrap_or_else(|| panic!("{method} should have failed: {r}"))
    }

    /// `initialize` offering `["0.9.0"]`; returns the result.
    pub fn initialize(&mut self, client_id: &str, subs: &[&str]) -> Value {
        self.ok(
            "initialize",
            json!({
                "channel": "ahp-root://",
                "protocolVersions": ["0.9.0"],
                "clientId": client_id,
                "initialSubscriptions": subs,
            }),
        )
    }

    /// The next notification with `method` (others before it are kept queued).
    pub fn notification(&mut self, method: &str) -> Value {
        if let Some(i) = self.queued.iter().position(|v| v["method"] == method) {
            return self.queued.remove(i).expect("queued");
        }
        let deadline = Instant::now() + FRAME_TIMEOUT;
        loop {
            match self.read_frame(deadline.saturating_duration_since(Instant::now())) {
                Incoming::Json(v) if v["method"] == method => return v,
                Incoming::Json(v) => self.queued.push_back(v),
                other => panic!("waiting for a {method} notification, got {other:?}"),
            }
        }
    }

    /// Writes raw bytes to the socket, bypassing the WebSocket layer (for hand-made frames).
    pub fn write_raw(&mut self, bytes: &[u8]) {
        let s = self.ws.get_mut();
        s.write_all(bytes).expect("write raw bytes");
        s.flush().expect("flush raw bytes");
    }

    /// Sends a text frame and at once shuts down the sending side (TCP FIN, no close frame), so
    /// the frame and the FIN reach the host together.
    pub fn send_text_then_fin(&mut self, text: &str) {
        self.write_raw(&client_frame(true, 0x1, text.as_bytes()));
        let _ = self.ws.get_mut().shutdown(std::net::Shutdown::Write);
    }

    /// Closes the WebSocket politely.
    pub fn close(mut self) {
        let _ = self.ws.close(None);
        let _ = self.ws.flush();
    }
}

/// A masked client frame (RFC 6455 5.2) with `opcode`, `fin` set as given.
pub fn client_frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![(u8::from(fin) << 7) | opcode];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xFFFF => {
            out.push(0x80 | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let key = [0x5a, 0x13, 0xc7, 0x2e];
    out.extend_from_slice(&key);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    out
}

fn is_response(v: &Value) -> bool {
    v.get("result").is_some() || v.get("error").is_some()
}

/// The close code of a close frame, if any.
pub fn close_code(frame: &Option<CloseFrame>) -> Option<u16> {
    frame.as_ref().map(|f| u16::from(f.code))
}

pub const CLOSE_UNSUPPORTED: u16 = 1003;
pub const CLOSE_POLICY: u16 = 1008;

/// For symmetry with the tungstenite constant names in assertions.
pub fn close_code_name(code: u16) -> String {
    format!("{:?}", CloseCode::from(code))
}

// ─── JSON helpers ────────────────────────────────────────────────────────────

/// A `chat/turnStarted` action with a user message.
pub fn turn_started(turn_id: &str, text: &str) -> Value {
    json!({
        "type": "chat/turnStarted",
        "turnId": turn_id,
        "startedAt": "2020-01-01T00:00:00.000Z",
        "message": {"text": text, "origin": {"kind": "user"}},
    })
}

/// A `chat/pendingMessageSet` with a user message.
pub fn pending_set(kind: &str, id: &str, text: &str) -> Value {
    json!({
        "type": "chat/pendingMessageSet",
        "kind": kind,
        "id": id,
        "message": {"text": text, "origin": {"kind": "user"}},
    })
}

/// The `error.code` of a response or error object.
pub fn code(v: &Value) -> i64 {
    let e = v.get("error").unwrap_or(v);
    e["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("no error code in {v}"))
}

// ─── Client services ─────────────────────────────────────────────────────────

/// The client-services channel.
pub const CATALOG: &str = "x-client-services://";

impl Ws {
    /// Every frame that arrives until the connection has been quiet for `quiet_ms` (queued
    /// frames first). Panics if it closes.
    pub fn drain(&mut self, quiet_ms: u64) -> Vec<Value> {
        let mut out: Vec<Value> = self.queued.drain(..).collect();
        loop {
            match self.read_frame(Duration::from_millis(quiet_ms)) {
                Incoming::Json(v) => out.push(v),
                Incoming::Timeout => return out,
                Incoming::Closed(c) => panic!("connection closed while draining ({c:?}): {out:?}"),
            }
        }
    }

    /// `client/registerService`; returns the service id.
    pub fn register_service(&mut self, metadata: Value, audience: Option<&[&str]>) -> String {
        let mut params = json!({"channel": CATALOG, "metadata": metadata});
        if let Some(a) = audience {
            params["audience"] = json!(a);
        }
        let r = self.ok("client/registerService", params);
        r["serviceId"]
            .as_str()
            .unwrap_or_else(|| panic!("registerService result without serviceId: {r}"))
            .to_owned()
    }

    /// Sends `clientService/request` with the next id (no wait); returns the id.
    pub fn send_service_request(
        &mut self,
        service_id: &str,
        method: &str,
        params: Value,
        timeout_ms: Option<u64>,
    ) -> u64 {
        self.send_request(
            "clientService/request",
            service_request(service_id, method, params, timeout_ms),
        )
    }

    /// `clientService/notify`.
    pub fn notify_service(&mut self, service_id: &str, method: &str, params: Value) {
        self.notify(
            "clientService/notify",
            json!({"channel": CATALOG, "serviceId": service_id, "method": method, "params": params}),
        );
    }

    /// Answers a host request with a result.
    pub fn respond(&mut self, id: &Value, result: Value) {
        self.send_json(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    /// Answers a host request with an error object.
    pub fn respond_error(&mut self, id: &Value, error: Value) {
        self.send_json(&json!({"jsonrpc": "2.0", "id": id, "error": error}));
    }
}

/// `clientService/request` params.
pub fn service_request(
    service_id: &str,
    method: &str,
    params: Value,
    timeout_ms: Option<u64>,
) -> Value {
    let mut p =
        json!({"channel": CATALOG, "serviceId": service_id, "method": method, "params": params});
    if let Some(ms) = timeout_ms {
        p["timeoutMs"] = json!(ms);
    }
    p
}

// ─── Child programs (sidecars, long-running CLI commands) ────────────────────

/// A child process whose stdout lines are collected; SIGKILLed on drop if still running.
pub struct Proc {
    child: Option<Child>,
    lines: Receiver<String>,
    pub stdout: Vec<String>,
    stderr_path: PathBuf,
    _tmp: tempfile::TempDir,
}

impl Proc {
    /// Spawns `bin ARGS` with extra environment; stderr goes to a file.
    pub fn spawn(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Proc {
        let tmp = tempfile::tempdir().expect("tempdir");
        let stderr_path = tmp.path().join("stderr.log");
        let stderr = std::fs::File::create(&stderr_path).expect("stderr file");
        let mut child = Command::new(bin)
            .args(args)
            .env_remove("AXHOST_URL")
            .env_remove("AXHOST_TOKEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {bin}: {e}"));
        let stdout = child.stdout.take().expect("stdout pipe");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Proc {
            child: Some(child),
            lines: rx,
            stdout: Vec::new(),
            stderr_path,
            _tmp: tmp,
        }
    }

    /// What the process wrote to stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_path).unwrap_or_default()
    }

    /// The next stdout line within `timeout`, or `None`.
    pub fn next_line(&mut self, timeout: Duration) -> Option<String> {
        let line = self.lines.recv_timeout(timeout).ok()?;
        self.stdout.push(line.clone());
        Some(line)
    }

    /// The first stdout line (from now on) for which `pred` holds; panics after `timeout`.
    pub fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next_line(left) {
                Some(l) if pred(&l) => return l,
                Some(_) => continue,
                None => panic!(
                    "no matching stdout line within {timeout:?}\nstdout: {:?}\nstderr: {}",
                    self.stdout,
                    self.stderr()
                ),
            }
        }
    }

    /// Sends `signal` (e.g. `TERM`) and waits up to 10 s for the exit.
    pub fn signal_and_wait(&mut self, signal: &str) -> ExitStatus {
        let mut child = self.child.take().expect("process already reaped");
        let _ = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "process did not exit within 10 s of SIG{signal}\nstderr: {}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits up to `timeout` for the process to exit on its own.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        let mut child = self.child.take().expect("process already reaped");
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "process still running after {timeout:?}\nstderr: {}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Resident memory of a process in KiB, from /proc (Linux).
pub fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}
