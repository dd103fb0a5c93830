//! A small blocking AHP JSON-RPC client over one WebSocket, for programs (the `axhost services`,
//! `call` and `notify` commands, the git sidecar) and tests.
//!
//! One [`Client`] is one connection. Everything is synchronous: [`Client::request`] sends a
//! request and reads frames until its response arrives, keeping every other frame (host
//! requests, notifications, other responses) in a queue that [`Client::next_frame`] hands out
//! first, in arrival order. Nothing is lost and nothing is reordered.
//!
//! ```no_run
//! # fn main() -> Result<(), axhost_io::client::ClientError> {
//! use axhost_io::client::Client;
//! use serde_json::json;
//! let mut c = Client::connect("ws://127.0.0.1:7331/axp", Some("tkn_..."))?;
//! c.initialize("my-tool", &[])?;
//! let id = c.register_service(&json!({"protocol": "echo"}), None)?;
//! # let _ = id; Ok(()) }
//! ```
//!
//! Only `ws://` is spoken (no TLS); put a TLS terminator in front for remote hosts.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tungstenite::client::IntoClientRequest;
use tungstenite::handshake::HandshakeError;
use tungstenite::http::HeaderValue;
use tungstenite::{Message, WebSocket};

/// The client-services channel every client-service message names.
pub const CATALOG: &str = "x-client-services://";
/// The root channel `initialize` names.
pub const ROOT: &str = "ahp-root://";
/// The protocol version this client offers.
pub const PROTOCOL_VERSION: &str = "0.9.0";
/// Catalog change action types.
pub const SERVICE_ADDED: &str = "x-clientServices/serviceAdded";
/// See [`SERVICE_ADDED`].
pub const SERVICE_UPDATED: &str = "x-clientServices/serviceUpdated";
/// See [`SERVICE_ADDED`].
pub const SERVICE_REMOVED: &str = "x-clientServices/serviceRemoved";

/// How long TCP connect and the WebSocket upgrade may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one blocked write may take before the connection counts as dead.
const WRITE_TIMEOUT: Duration = Duration::from_secs(30);
/// Default wait for the answer to an ordinary request.
const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Extra wait beyond a relayed request's own deadline: the host answers `-32050` itself at the
/// deadline, so this only covers transit.
const RELAY_MARGIN: Duration = Duration::from_secs(5);
/// The host's default relay timeout when `initialize` did not advertise one.
const DEFAULT_RELAY_TIMEOUT_MS: u64 = 30_000;

/// A JSON-RPC error object as the host (or a service through it) returned it.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcErr {
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl RpcErr {
    /// Reads an `error` object; anything malformed becomes a `-32603` describing it.
    pub fn from_value(v: &Value) -> RpcErr {
        RpcErr {
            code: v.get("code").and_then(Value::as_i64).unwrap_or(-32603),
            message: v
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("malformed error object")
                .to_owned(),
            data: v.get("data").cloned(),
        }
    }
}

impl fmt::Display for RpcErr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "error {}: {}", self.code, self.message)?;
        if let Some(d) = &self.data {
            write!(f, " (data: {d})")?;
        }
        Ok(())
    }
}

/// Everything that can go wrong talking to a host.
#[derive(Debug)]
pub enum ClientError {
    /// The URL is not a usable `ws://` URL.
    Url(String),
    /// TCP connect failed.
    Connect(io::Error),
    /// The host refused the WebSocket upgrade with this HTTP status (401: bad or missing token).
    Refused { status: u16, body: String },
    /// The WebSocket layer failed (I/O error, protocol violation, write timeout).
    WebSocket(tungstenite::Error),
    /// The connection is closed (by the host or after an earlier error).
    Closed,
    /// No answer within the wait.
    Timeout,
    /// The host sent something that is not JSON-RPC.
    Protocol(String),
    /// The request was answered with a JSON-RPC error.
    Rpc(RpcErr),
}

impl ClientError {
    /// The JSON-RPC error, if this is one.
    pub fn rpc(&self) -> Option<&RpcErr> {
        match self {
            ClientError::Rpc(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the connection is unusable after this error (reconnect to go on).
    pub fn is_fatal(&self) -> bool {
        !matches!(self, ClientError::Rpc(_) | ClientError::Timeout)
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::Url(m) => write!(f, "bad URL: {m}"),
            ClientError::Connect(e) => write!(f, "cannot connect: {e}"),
            ClientError::Refused { status, body } if body.is_empty() => {
                write!(f, "host refused the connection: HTTP {status}")
            }
            ClientError::Refused { status, body } => {
                write!(
                    f,
                    "host refused the connection: HTTP {status}: {}",
                    body.trim()
                )
            }
            ClientError::WebSocket(e) => write!(f, "WebSocket: {e}"),
            ClientError::Closed => write!(f, "connection closed"),
            ClientError::Timeout => write!(f, "timed out waiting for the host"),
            ClientError::Protocol(m) => write!(f, "protocol violation: {m}"),
            ClientError::Rpc(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ClientError {}

/// What one incoming frame is.
#[derive(Debug, PartialEq)]
pub enum FrameKind<'a> {
    /// A request from the host (e.g. `clientService/handleRequest`): answer it by `id`.
    Request {
        id: &'a Value,
        method: &'a str,
        params: &'a Value,
    },
    /// A notification (`action`, `clientService/notification`, `$/cancelRequest`, ...).
    Notification { method: &'a str, params: &'a Value },
    /// A response to one of our requests.
    Response { id: &'a Value },
    /// Anything else.
    Other,
}

/// Classifies a frame.
pub fn frame_kind(v: &Value) -> FrameKind<'_> {
    static NULL: Value = Value::Null;
    let params = v.get("params").unwrap_or(&NULL);
    match (v.get("method").and_then(Value::as_str), v.get("id")) {
        (Some(method), Some(id)) => FrameKind::Request { id, method, params },
        (Some(method), None) => FrameKind::Notification { method, params },
        (None, Some(id)) if v.get("result").is_some() || v.get("error").is_some() => {
            FrameKind::Response { id }
        }
        _ => FrameKind::Other,
    }
}

/// A default client id for a tool run with `token`: `PREFIX-` plus 12 hex digits of the
/// token's SHA-256. Stable for one credential (so the host keeps no record per run) and
/// distinct across principals (client ids are bound to the first principal that uses them).
pub fn default_client_id(prefix: &str, token: Option<&str>) -> String {
    match token {
        Some(t) => {
            let d = crate::credentials::digest(t);
            format!("{prefix}-{}", &crate::credentials::to_hex(&d)[..12])
        }
        None => prefix.to_owned(),
    }
}

/// The token a URL carries in `?tkn=` / `?token=`, if any.
pub fn token_in_url(url: &str) -> Option<String> {
    let query = url.split_once('?')?.1;
    crate::credentials::token_from_request(&[], Some(query))
}

/// `url` fit for an error message: a query (`?tkn=...`), fragment or user info (`user:pw@`)
/// may hold a credential, so each is replaced by `...`.
pub fn redacted_url(url: &str) -> String {
    let (rest, tail) = match url.find(['?', '#']) {
        Some(i) => (&url[..i], "?..."),
        None => (url, ""),
    };
    let (scheme, after) = match rest.split_once("://") {
        Some((scheme, after)) => (Some(scheme), after),
        None => (None, rest),
    };
    let authority_end = after.find('/').unwrap_or(after.len());
    let after = match after[..authority_end].rfind('@') {
        Some(at) => format!("...@{}", &after[at + 1..]),
        None => after.to_owned(),
    };
    match scheme {
        Some(scheme) => format!("{scheme}://{after}{tail}"),
        None => format!("{after}{tail}"),
    }
}

/// One blocking connection to a host.
pub struct Client {
    ws: WebSocket<TcpStream>,
    next_id: u64,
    queued: VecDeque<Value>,
    closed: bool,
    request_timeout: Duration,
    relay_timeout_ms: u64,
    relay_timeout_ms_max: u64,
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("next_id", &self.next_id)
            .field("queued", &self.queued.len())
            .field("closed", &self.closed)
            .finish()
    }
}

impl Client {
    /// Opens `url` (`ws://HOST:PORT/axp`, optionally with `?tkn=`). `token`, when given, goes in
    /// an `Authorization: Bearer` header (and wins over one in the URL).
    pub fn connect(url: &str, token: Option<&str>) -> Result<Client, ClientError> {
        // Errors name the URL without its query or user info, which may carry the token.
        let url_shown = redacted_url(url);
        let mut req = url
            .into_client_request()
            .map_err(|e| ClientError::Url(format!("{url_shown}: {e}")))?;
        match req.uri().scheme_str() {
            Some("ws") => {}
            Some("wss") => {
                return Err(ClientError::Url(format!(
                "{url_shown}: wss:// is not supported; connect with ws:// (a local TLS terminator can \
                     bridge)"
            )))
            }
            _ => {
                return Err(ClientError::Url(format!(
                    "{url_shown}: expected ws://HOST:PORT/axp"
                )))
            }
        }
        if let Some(t) = token {
            let value = HeaderValue::from_str(&format!("Bearer {t}")).map_err(|_| {
                ClientError::Url("the token has characters a header cannot carry".into())
            })?;
            req.headers_mut().insert("authorization", value);
        }
        let host = req
            .uri()
            .host()
            .ok_or_else(|| ClientError::Url(format!("{url_shown}: no host")))?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = req.uri().port_u16().unwrap_or(80);
        let stream = tcp_connect(&host, port)?;
        stream
            .set_read_timeout(Some(CONNECT_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(WRITE_TIMEOUT)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(ClientError::Connect)?;
        let (ws, _resp) = tungstenite::client(req, stream).map_err(|e| match e {
            HandshakeError::Failure(tungstenite::Error::Http(resp)) => ClientError::Refused {
                status: resp.status().as_u16(),
                body: resp
                    .body()
                    .as_deref()
                    .map(|b| String::from_utf8_lossy(b).into_owned())
                    .unwrap_or_default(),
            },
            HandshakeError::Failure(e) => ClientError::WebSocket(e),
            HandshakeError::Interrupted(_) => ClientError::Timeout,
        })?;
        Ok(Client {
            ws,
            next_id: 1,
            queued: VecDeque::new(),
            closed: false,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            relay_timeout_ms: DEFAULT_RELAY_TIMEOUT_MS,
            relay_timeout_ms_max: 300_000,
        })
    }

    /// How long [`Client::request`] waits for an answer (default 60 s).
    pub fn set_request_timeout(&mut self, timeout: Duration) {
        self.request_timeout = timeout;
    }

    /// `initialize` offering 0.9.0 with `initialSubscriptions`; returns the result (snapshots of
    /// `subs` in `result.snapshots`). Remembers the advertised request timeouts.
    pub fn initialize(&mut self, client_id: &str, subs: &[&str]) -> Result<Value, ClientError> {
        let result = self.request(
            "initialize",
            json!({
                "channel": ROOT,
                "protocolVersions": [PROTOCOL_VERSION],
                "clientId": client_id,
                "initialSubscriptions": subs,
            }),
        )?;
        let limits = &result["_meta"]["x-client-services"]["limits"];
        if let Some(ms) = limits["requestTimeoutMs"].as_u64() {
            self.relay_timeout_ms = ms;
        }
        if let Some(ms) = limits["requestTimeoutMsMax"].as_u64() {
            self.relay_timeout_ms_max = ms;
        }
        Ok(result)
    }

    /// Sends a request and waits for its answer (queuing every other frame).
    pub fn request(&mut self, method: &str, params: Value) -> Result<Value, ClientError> {
        let timeout = self.request_timeout;
        self.request_within(method, params, timeout)
    }

    /// [`Client::request`] with its own wait.
    pub fn request_within(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, ClientError> {
        let id = self.send_request(method, params)?;
        self.wait_response(id, timeout)
    }

    /// Sends a request without waiting; returns its id (for [`Client::wait_response`] or
    /// [`Client::cancel`]).
    pub fn send_request(&mut self, method: &str, params: Value) -> Result<u64, ClientError> {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))?;
        Ok(id)
    }

    /// Waits for the response to request `id`: its result, or its error as
    /// [`ClientError::Rpc`]. Other frames are queued for [`Client::next_frame`].
    pub fn wait_response(&mut self, id: u64, timeout: Duration) -> Result<Value, ClientError> {
        let want = Value::from(id);
        let matches =
            |v: &Value| matches!(frame_kind(v), FrameKind::Response { id } if *id == want);
        if let Some(i) = self.queued.iter().position(matches) {
            if let Some(v) = self.queued.remove(i) {
                return outcome(v);
            }
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Timeout);
            }
            match self.read_frame(left)? {
                None => return Err(ClientError::Timeout),
                Some(v) if matches(&v) => return outcome(v),
                Some(v) => self.queued.push_back(v),
            }
        }
    }

    /// Sends a notification.
    pub fn notify(&mut self, method: &str, params: Value) -> Result<(), ClientError> {
        self.send(&json!({"jsonrpc": "2.0", "method": method, "params": params}))
    }

    /// The next frame that is not the answer to a request being waited for: queued frames
    /// first. `Ok(None)` when nothing arrived within `timeout`; [`ClientError::Closed`] once the
    /// host closed.
    pub fn next_frame(&mut self, timeout: Duration) -> Result<Option<Value>, ClientError> {
        if let Some(v) = self.queued.pop_front() {
            return Ok(Some(v));
        }
        self.read_frame(timeout)
    }

    /// Answers a host request (`clientService/handleRequest`) with a result.
    pub fn respond(&mut self, id: &Value, result: Value) -> Result<(), ClientError> {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}))
    }

    /// Answers a host request with a JSON-RPC error.
    pub fn respond_error(
        &mut self,
        id: &Value,
        code: i64,
        message: &str,
        data: Option<Value>,
    ) -> Result<(), ClientError> {
        let mut error = json!({"code": code, "message": message});
        if let Some(d) = data {
            error["data"] = d;
        }
        self.send(&json!({"jsonrpc": "2.0", "id": id, "error": error}))
    }

    /// `subscribe`; returns the snapshot (`{resource, state, fromSeq}`).
    pub fn subscribe(&mut self, channel: &str) -> Result<Value, ClientError> {
        let r = self.request("subscribe", json!({ "channel": channel }))?;
        Ok(r.get("snapshot").cloned().unwrap_or(r))
    }

    /// `client/registerService`; returns the new service id.
    pub fn register_service(
        &mut self,
        metadata: &Value,
        audience: Option<&[&str]>,
    ) -> Result<String, ClientError> {
        let mut params = json!({ "channel": CATALOG, "metadata": metadata });
        if let Some(a) = audience {
            params["audience"] = json!(a);
        }
        let r = self.request("client/registerService", params)?;
        r["serviceId"].as_str().map(str::to_owned).ok_or_else(|| {
            ClientError::Protocol(format!("registerService result without serviceId: {r}"))
        })
    }

    /// `client/updateService`. `audience`: `None` leaves it, `Some(None)` clears it.
    pub fn update_service(
        &mut self,
        service_id: &str,
        metadata: Option<&Value>,
        audience: Option<Option<&[&str]>>,
    ) -> Result<(), ClientError> {
        let mut params = json!({ "channel": CATALOG, "serviceId": service_id });
        if let Some(m) = metadata {
            params["metadata"] = m.clone();
        }
        if let Some(a) = audience {
            params["audience"] = json!(a);
        }
        self.request("client/updateService", params).map(drop)
    }

    /// `client/unregisterService`.
    pub fn unregister_service(&mut self, service_id: &str) -> Result<(), ClientError> {
        self.request(
            "client/unregisterService",
            json!({ "channel": CATALOG, "serviceId": service_id }),
        )
        .map(drop)
    }

    /// The parameters of a `clientService/request`.
    pub fn service_request_params(
        service_id: &str,
        method: &str,
        params: Value,
        timeout_ms: Option<u64>,
    ) -> Value {
        let mut p = json!({
            "channel": CATALOG,
            "serviceId": service_id,
            "method": method,
            "params": params,
        });
        if let Some(ms) = timeout_ms {
            p["timeoutMs"] = json!(ms);
        }
        p
    }

    /// `clientService/request`: the service's result, or its (or the host's) error. Waits as
    /// long as the host may take to answer (`timeout_ms`, else the advertised default, capped by
    /// the advertised maximum) plus a transit margin.
    pub fn call_service(
        &mut self,
        service_id: &str,
        method: &str,
        params: Value,
        timeout_ms: Option<u64>,
    ) -> Result<Value, ClientError> {
        let ms = timeout_ms
            .unwrap_or(self.relay_timeout_ms)
            .min(self.relay_timeout_ms_max);
        let p = Client::service_request_params(service_id, method, params, timeout_ms);
        self.request_within(
            "clientService/request",
            p,
            Duration::from_millis(ms) + RELAY_MARGIN,
        )
    }

    /// `clientService/notify`: fire and forget. Nothing ever comes back.
    pub fn notify_service(
        &mut self,
        service_id: &str,
        method: &str,
        params: Value,
    ) -> Result<(), ClientError> {
        self.notify(
            "clientService/notify",
            json!({
                "channel": CATALOG,
                "serviceId": service_id,
                "method": method,
                "params": params,
            }),
        )
    }

    /// `$/cancelRequest` for one of our own pending requests.
    pub fn cancel(&mut self, id: u64) -> Result<(), ClientError> {
        self.notify("$/cancelRequest", json!({ "channel": CATALOG, "id": id }))
    }

    /// Closes politely (close frame, then flush). Errors are ignored: the peer may be gone.
    pub fn close(mut self) {
        if !self.closed {
            let _ = self.ws.close(None);
            let deadline = Instant::now() + Duration::from_secs(1);
            // Read until the host's close frame so the close handshake finishes.
            while Instant::now() < deadline {
                let _ = self
                    .ws
                    .get_mut()
                    .set_read_timeout(Some(Duration::from_millis(200)));
                match self.ws.read() {
                    Ok(_) => continue,
                    Err(tungstenite::Error::Io(e)) if is_timeout(&e) => continue,
                    Err(_) => break,
                }
            }
        }
    }

    fn send(&mut self, v: &Value) -> Result<(), ClientError> {
        if self.closed {
            return Err(ClientError::Closed);
        }
        match self.ws.send(Message::text(v.to_string())) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.closed = true;
                Err(match e {
                    tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
                        ClientError::Closed
                    }
                    other => ClientError::WebSocket(other),
                })
            }
        }
    }

    /// Reads one JSON frame from the socket (not the queue).
    fn read_frame(&mut self, timeout: Duration) -> Result<Option<Value>, ClientError> {
        if self.closed {
            return Err(ClientError::Closed);
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            // Reading with a timeout is safe mid-frame: tungstenite keeps partial input.
            self.ws
                .get_mut()
                .set_read_timeout(Some(left))
                .map_err(|e| ClientError::WebSocket(tungstenite::Error::Io(e)))?;
            match self.ws.read() {
                Ok(Message::Text(t)) => {
                    return serde_json::from_str(t.as_str()).map(Some).map_err(|e| {
                        ClientError::Protocol(format!("a text frame that is not JSON: {e}"))
                    });
                }
                Ok(Message::Binary(_)) => {
                    return Err(ClientError::Protocol("a binary frame".into()));
                }
                Ok(Message::Close(_)) => {
                    self.closed = true;
                    // Answer the close handshake; the host may already be gone.
                    let _ = self.ws.flush();
                    return Err(ClientError::Closed);
                }
                Ok(_) => continue, // ping, pong: tungstenite answers pings itself
                Err(tungstenite::Error::Io(e)) if is_timeout(&e) => continue,
                Err(tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed) => {
                    self.closed = true;
                    return Err(ClientError::Closed);
                }
                Err(e) => {
                    self.closed = true;
                    return Err(ClientError::WebSocket(e));
                }
            }
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn outcome(v: Value) -> Result<Value, ClientError> {
    if let Some(e) = v.get("error") {
        return Err(ClientError::Rpc(RpcErr::from_value(e)));
    }
    Ok(v.get("result").cloned().unwrap_or(Value::Null))
}

fn tcp_connect(host: &str, port: u16) -> Result<TcpStream, ClientError> {
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(ClientError::Connect)?
        .collect();
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for addr in addrs {
        match TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(ClientError::Connect(last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_classified() {
        let req =
            json!({"jsonrpc":"2.0","id":3,"method":"clientService/handleRequest","params":{}});
        assert!(matches!(
            frame_kind(&req),
            FrameKind::Request {
                method: "clientService/handleRequest",
                ..
            }
        ));
        let note = json!({"jsonrpc":"2.0","method":"action","params":{"x":1}});
        assert!(matches!(
            frame_kind(&note),
            FrameKind::Notification {
                method: "action",
                ..
            }
        ));
        let resp = json!({"jsonrpc":"2.0","id":3,"result":null});
        assert_eq!(frame_kind(&resp), FrameKind::Response { id: &json!(3) });
        let err = json!({"jsonrpc":"2.0","id":null,"error":{"code":-32700,"message":"x"}});
        assert!(matches!(frame_kind(&err), FrameKind::Response { .. }));
        assert_eq!(frame_kind(&json!({"jsonrpc":"2.0"})), FrameKind::Other);
    }

    #[test]
    fn errors_keep_code_message_and_data() {
        let e = RpcErr::from_value(
            &json!({"code": -32008, "message": "Unknown service", "data": {"a": 1}}),
        );
        assert_eq!(e.code, -32008);
        assert_eq!(
            e.to_string(),
            "error -32008: Unknown service (data: {\"a\":1})"
        );
        assert_eq!(RpcErr::from_value(&json!("junk")).code, -32603);
    }

    #[test]
    fn default_client_ids_follow_the_token() {
        let a = default_client_id("cli", Some("tkn_a"));
        assert_eq!(a, default_client_id("cli", Some("tkn_a")));
        assert_ne!(a, default_client_id("cli", Some("tkn_b")));
        assert!(a.starts_with("cli-") && a.len() == 16, "{a}");
        assert!(axhost_core::valid_id(&a));
        assert_eq!(default_client_id("cli", None), "cli");
    }

    #[test]
    fn tokens_are_found_in_urls() {
        assert_eq!(token_in_url("ws://h:1/axp?tkn=abc").as_deref(), Some("abc"));
        assert_eq!(
            token_in_url("ws://h:1/axp?x=1&token=q").as_deref(),
            Some("q")
        );
        assert_eq!(token_in_url("ws://h:1/axp"), None);
    }

    #[test]
    fn errors_never_echo_a_token_in_the_url() {
        assert_eq!(
            redacted_url("ws://h:1/axp?tkn=secret1&x=2"),
            "ws://h:1/axp?..."
        );
        assert_eq!(redacted_url("ws://h:1/axp#token=s"), "ws://h:1/axp?...");
        assert_eq!(redacted_url("ws://u:pw@h:1/axp"), "ws://...@h:1/axp");
        assert_eq!(redacted_url("ws://h:1/a@b"), "ws://h:1/a@b");
        assert_eq!(redacted_url("ws://h:1/axp"), "ws://h:1/axp");
        assert_eq!(redacted_url("not a url?token=s"), "not a url?...");
        for url in [
            "wss://127.0.0.1:1/axp?tkn=secret2",
            "http://127.0.0.1:1/axp?token=secret2",
            "ws://[::1/axp?tkn=secret2",
            "ws:///axp?tkn=secret2",
            "ws://user:secret2@/axp",
        ] {
            let e = Client::connect(url, None).map(drop).expect_err(url);
            let shown = e.to_string();
            assert!(!shown.contains("secret2"), "{url}: {shown}");
        }
    }

    #[test]
    fn only_ws_urls_are_accepted() {
        let e = Client::connect("wss://127.0.0.1:1/axp", None).map(drop);
        assert!(matches!(e, Err(ClientError::Url(_))), "{e:?}");
        let e = Client::connect("http://127.0.0.1:1/axp", None).map(drop);
        assert!(matches!(e, Err(ClientError::Url(_))), "{e:?}");
    }

    #[test]
    fn a_closed_port_is_a_connect_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .unwrap_or(1);
        let e = Client::connect(&format!("ws://127.0.0.1:{port}/axp"), None).map(drop);
        assert!(matches!(e, Err(ClientError::Connect(_))), "{e:?}");
    }
}
