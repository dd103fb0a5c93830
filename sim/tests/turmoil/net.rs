//! Client side of the wire: WebSocket over turmoil TCP, the official client's transport, a raw
//! JSON-RPC client, and the trace every client records.
//!
//! `ahp-ws` 1.0.0 cannot carry the official client here: `WebSocketTransport::connect` dials
//! with tokio's own `TcpStream`, and `from_stream` only takes
//! `WebSocketStream<MaybeTlsStream<tokio::net::TcpStream>>`. `TurmoilTransport` below is the same
//! ~40 lines as `ahp-ws`'s `Transport` impl over a `WebSocketStream<turmoil::net::TcpStream>`;
//! everything above the `ahp::Transport` trait (requests, timeouts, dispatch, reconnect, event
//! fan-out, reducers) is the official `ahp` 1.0.0 code, unchanged.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ahp1::{Transport, TransportError, TransportMessage};
use futures_util::{SinkExt, StreamExt};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::driver::{token_for, PORT};

pub type Ws = WebSocketStream<turmoil::net::TcpStream>;

/// Every frame each client saw, in order, with the simulated time it saw it: the determinism
/// check compares these hashes across two runs of one seed.
#[derive(Clone, Default)]
pub struct Trace(Arc<Mutex<BTreeMap<String, (Sha256, u64)>>>);

impl Trace {
    pub fn record(&self, who: &str, dir: &str, text: &str) {
        let ms = turmoil::sim_elapsed().map_or(0, |d| d.as_millis());
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let (hasher, count) = map.entry(who.to_owned()).or_default();
        hasher.update(format!("{ms} {dir} {}\n", text.len()).as_bytes());
        hasher.update(text.as_bytes());
        *count += 1;
    }

    /// One line per client: name, frames seen, hash; then the hash of all of them.
    pub fn digest(&self) -> String {
        let map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut all = Sha256::new();
        let mut out = String::new();
        for (who, (hasher, count)) in map.iter() {
            let h = hex(&hasher.clone().finalize());
            let line = format!("{who}: {count} frames {h}\n");
            all.update(line.as_bytes());
            out.push_str(&line);
        }
        out.push_str(&format!("all: {}", hex(&all.finalize())));
        out
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Opens a WebSocket to the host node as principal `principal` (bearer token header).
pub async fn dial(host: &str, principal: &str) -> std::io::Result<Ws> {
    let stream = turmoil::net::TcpStream::connect((host, PORT)).await?;
    let mut req = format!("ws://{host}:{PORT}/axp")
        .into_client_request()
        .map_err(std::io::Error::other)?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token_for(principal)))
        .map_err(std::io::Error::other)?;
    req.headers_mut().insert("authorization", bearer);
    let (ws, _) = tokio_tungstenite::client_async(req, stream)
        .await
        .map_err(std::io::Error::other)?;
    Ok(ws)
}

/// `dial` with a deadline per attempt, retried until it works: during a partition a SYN is
/// dropped and turmoil's `connect` never returns.
pub async fn dial_retrying(host: &str, principal: &str, every: Duration) -> Ws {
    loop {
        if let Ok(Ok(ws)) = tokio::time::timeout(every, dial(host, principal)).await {
            return ws;
        }
        tokio::time::sleep(every).await;
    }
}

/// The official client's transport over a turmoil WebSocket; records every frame in `trace`.
pub struct TurmoilTransport {
    ws: Ws,
    trace: Trace,
    who: String,
}

impl TurmoilTransport {
    pub fn new(ws: Ws, trace: Trace, who: &str) -> TurmoilTransport {
        TurmoilTransport {
            ws,
            trace,
            who: who.to_owned(),
        }
    }
}

impl Transport for TurmoilTransport {
    async fn send(&mut self, msg: TransportMessage) -> Result<(), TransportError> {
        let text = match msg {
            TransportMessage::Parsed(m) => {
                serde_json::to_string(&m).map_err(|e| TransportError::Protocol(e.to_string()))?
            }
            TransportMessage::Text(s) => s,
            TransportMessage::Binary(_) => {
                return Err(TransportError::Protocol("binary frames unsupported".into()))
            }
        };
        self.trace.record(&self.who, ">", &text);
        self.ws
            .send(Message::text(text))
            .await
            .map_err(|e| TransportError::Io(e.to_string()))
    }

    // Cancel-safe (the client's select! drops it): `next()` keeps partial frames buffered.
    async fn recv(&mut self) -> Result<Option<TransportMessage>, TransportError> {
        loop {
            match self.ws.next().await {
                None | Some(Ok(Message::Close(_))) => return Ok(None),
                Some(Err(e)) => return Err(TransportError::Io(e.to_string())),
                Some(Ok(Message::Text(s))) => {
                    self.trace.record(&self.who, "<", s.as_str());
                    return Ok(Some(TransportMessage::Text(s.to_string())));
                }
                Some(Ok(_)) => continue,
            }
        }
    }

    async fn close(&mut self) -> Result<(), TransportError> {
        self.ws
            .close(None)
            .await
            .map_err(|e| TransportError::Io(e.to_string()))
    }
}

/// A raw JSON-RPC-over-WebSocket client: every frame as JSON, recorded in the trace.
pub struct Raw {
    pub ws: Ws,
    trace: Trace,
    who: String,
    next_id: u64,
    /// Frames read while waiting for something else, in arrival order.
    pub backlog: std::collections::VecDeque<Value>,
}

impl Raw {
    pub async fn connect(host: &str, principal: &str, who: &str, trace: &Trace) -> Raw {
        let ws = dial(host, principal)
            .await
            .unwrap_or_else(|e| panic!("{who}: dial: {e}"));
        Raw {
            ws,
            trace: trace.clone(),
            who: who.to_owned(),
            next_id: 1,
            backlog: Default::default(),
        }
    }

    pub async fn send(&mut self, v: &Value) {
        let text = v.to_string();
        self.trace.record(&self.who, ">", &text);
        self.ws
            .send(Message::text(text))
            .await
            .unwrap_or_else(|e| panic!("{}: send: {e}", self.who));
    }

    /// Sends a request with the next id; returns the id.
    pub async fn request(&mut self, method: &str, params: Value) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .await;
        id
    }

    /// The next frame from the socket (not the backlog), or `None` after `within` of silence.
    pub async fn read(&mut self, within: Duration) -> Option<Value> {
        loop {
            let msg = match tokio::time::timeout(within, self.ws.next()).await {
                Err(_) => return None,
                Ok(None) => panic!("{}: connection closed", self.who),
                Ok(Some(Err(e))) => panic!("{}: read: {e}", self.who),
                Ok(Some(Ok(m))) => m,
            };
            match msg {
                Message::Text(t) => {
                    self.trace.record(&self.who, "<", t.as_str());
                    return Some(
                        serde_json::from_str(t.as_str())
                            .unwrap_or_else(|e| panic!("{}: bad JSON ({e}): {t}", self.who)),
                    );
                }
                Message::Close(f) => panic!("{}: closed by the host: {f:?}", self.who),
                _ => {}
            }
        }
    }

    /// The response to request `id` (other frames go to the backlog).
    pub async fn response(&mut self, id: u64, within: Duration) -> Value {
        if let Some(i) = self.backlog.iter().position(|v| is_response_to(v, id)) {
            return self.backlog.remove(i).unwrap_or_default();
        }
        loop {
            let v = self
                .read(within)
                .await
                .unwrap_or_else(|| panic!("{}: no response to {id} within {within:?}", self.who));
            if is_response_to(&v, id) {
                return v;
            }
            self.backlog.push_back(v);
        }
    }

    /// A request and its successful result.
    pub async fn ok(&mut self, method: &str, params: Value) -> Value {
        let id = self.request(method, params).await;
        let r = self.response(id, Duration::from_secs(10)).await;
        match r.get("result") {
            Some(v) => v.clone(),
            None => panic!("{}: {method} failed: {r}", self.who),
        }
    }

    pub async fn initialize(&mut self, client_id: &str, subs: &[&str]) -> Value {
        self.ok(
            "initialize",
            json!({"channel": "ahp-root://", "clientId": client_id,
                   "protocolVersions": ["0.9.0"], "initialSubscriptions": subs}),
        )
        .await
    }

    /// Every frame until `quiet` passes without one (backlog first).
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Value> {
        let mut out: Vec<Value> = self.backlog.drain(..).collect();
        while let Some(v) = self.read(quiet).await {
            out.push(v);
        }
        out
    }
}

fn is_response_to(v: &Value, id: u64) -> bool {
    v.get("method").is_none() && v["id"].as_u64() == Some(id)
}
