//! A small tokio driver for the axhost core, run as a turmoil host.
//!
//! ```text
//!   accept task ─► per connection: WebSocket server handshake (bearer token → principal)
//!                   ├─ reader task: text message ─► Event::Message ─┐
//!                   └─ writer task ◄─ WriterCmd::{Frame, Close}    │ one unbounded mpsc
//!                        └─ after the write: Event::Flushed ─────────┤
//!   core task: owns the ONE Host<MemStore>; handle(), handle_timeout() at poll_timeout(),
//!              drain poll_output() to None after every input, Input::Closed once per conn
//! ```
//!
//! `Flushed` is reported by the writer task after `send` on the WebSocket sink returned, i.e.
//! after the frame's bytes were written into turmoil's TCP socket (as `io/` reports bytes that
//! reached the kernel), not when the core task hands the frame to the writer. That keeps the
//! core's per-connection byte accounting honest: a held link fills turmoil's send window
//! (`tcp_capacity` segments), the writer blocks, and the core sees the queue grow, exactly the
//! backpressure the production driver produces.
//!
//! Time: `Now::mono` is milliseconds of tokio's (turmoil-simulated, paused) clock since the
//! driver started; `Now::wall_unix_ms` is the simulation epoch plus the same offset, so every
//! timestamp the host hands out is a function of the seed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axhost_core::drive::commit_one;
use axhost_core::{ConnId, Host, HostConfig, Input, MemStore, Now, Output, Principal, Stats};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::Message;

/// The port the host listens on.
pub const PORT: u16 = 9100;

/// Unix milliseconds of the simulation epoch (2023-11-14T22:13:20Z).
pub const EPOCH_UNIX_MS: u64 = 1_700_000_000_000;

/// What the host node runs with.
#[derive(Clone)]
pub struct HostSpec {
    /// The core's configuration.
    pub config: HostConfig,
    /// The core's seed.
    pub seed: u64,
    /// Bearer tokens and the principals they authenticate.
    pub tokens: BTreeMap<String, Principal>,
}

impl HostSpec {
    /// Default config; every token is a maintainer named like the token.
    pub fn maintainers(seed: u64, names: &[&str]) -> HostSpec {
        HostSpec {
            config: HostConfig::default(),
            seed,
            tokens: names
                .iter()
                .map(|n| (token_for(n), Principal::maintainer(n)))
                .collect(),
        }
    }
}

/// The token the tests use for principal `name`.
pub fn token_for(name: &str) -> String {
    format!("tkn-{name}")
}

/// What the test can read about the host after (or during) a run; updated after every step of
/// the core task.
#[derive(Clone, Debug, Default)]
pub struct Probe {
    pub stats: Stats,
    pub server_seq: u64,
    pub connections: usize,
    /// Connections accepted (WebSocket handshakes that reached the core).
    pub connected: u64,
    /// `Input::Closed` reported, per connection id (each must be exactly once).
    pub closed: BTreeMap<u64, u32>,
    /// Connections the core closed (`Output::Close`), with their codes.
    pub core_closes: Vec<(u64, u16)>,
    /// Rejected upgrades (bad token).
    pub refused: u64,
}

pub type SharedProbe = Arc<Mutex<Probe>>;

/// Registers the host node `name` running `spec`. The node can be bounced: each start builds
/// a fresh host over a fresh `MemStore` (the tests here never bounce it).
pub fn install(sim: &mut turmoil::Sim<'_>, name: &str, spec: HostSpec, probe: SharedProbe) {
    sim.host(name, move || serve(spec.clone(), probe.clone()));
}

enum Event {
    Connected {
        conn: ConnId,
        principal: Arc<Principal>,
        writer: mpsc::UnboundedSender<WriterCmd>,
    },
    Message {
        conn: ConnId,
        text: String,
    },
    Flushed {
        conn: ConnId,
        bytes: u64,
    },
    /// The socket is gone (EOF, reset, close frame, write error).
    Gone {
        conn: ConnId,
    },
}

enum WriterCmd {
    Frame(axhost_core::Frame),
    Close(u16, &'static str),
}

async fn serve(spec: HostSpec, probe: SharedProbe) -> turmoil::Result {
    let host = Host::new(spec.config.clone(), MemStore::new(), spec.seed)
        .map_err(|e| format!("host config: {e:?}"))?;
    let listener = turmoil::net::TcpListener::bind(("0.0.0.0", PORT)).await?;
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let mut core = tokio::task::spawn_local(core_task(host, events_rx, probe.clone()));
    let tokens = Arc::new(spec.tokens);
    let mut next_id = 1u64;
    loop {
        tokio::select! {
            biased;
            // The core task never ends on its own; if it does, it panicked (a host bug): fail
            // the simulation instead of letting tokio swallow the panic.
            r = &mut core => {
                return Err(format!("core task ended: {r:?}").into());
            }
            accepted = listener.accept() => {
                let (stream, _peer) = accepted?;
                let conn = ConnId(next_id);
                next_id += 1;
                tokio::task::spawn_local(connection(
                    stream,
                    conn,
                    tokens.clone(),
                    events_tx.clone(),
                    probe.clone(),
                ));
            }
        }
    }
}

/// Milliseconds since the driver started, on tokio's simulated clock.
struct Clock {
    start: tokio::time::Instant,
}

impl Clock {
    fn now(&self) -> Now {
        let ms = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        Now {
            mono: axhost_core::Instant(ms),
            wall_unix_ms: EPOCH_UNIX_MS + ms,
        }
    }

    fn instant(&self, at: axhost_core::Instant) -> tokio::time::Instant {
        self.start + Duration::from_millis(at.0)
    }
}

async fn core_task(
    mut host: Host<MemStore>,
    mut events: mpsc::UnboundedReceiver<Event>,
    probe: SharedProbe,
) {
    let clock = Clock {
        start: tokio::time::Instant::now(),
    };
    // Open connections and their writers. A connection leaves this map exactly when the driver
    // reports `Input::Closed` for it, which is therefore reported once.
    let mut open: BTreeMap<ConnId, mpsc::UnboundedSender<WriterCmd>> = BTreeMap::new();
    let mut gone: BTreeSet<ConnId> = BTreeSet::new();
    loop {
        let event = match host.poll_timeout() {
            Some(at) => {
                tokio::select! {
                    biased;
                    ev = events.recv() => ev,
                    () = tokio::time::sleep_until(clock.instant(at)) => {
                        host.handle_timeout(clock.now());
                        drain(&mut host, &mut open, &probe, clock.now());
                        publish(&host, &probe);
                        continue;
                    }
                }
            }
            None => events.recv().await,
        };
        // The accept task holds a sender for the node's lifetime.
        let Some(event) = event else { return };
        let now = clock.now();
        match event {
            Event::Connected {
                conn,
                principal,
                writer,
            } => {
                open.insert(conn, writer);
                host.handle(now, Input::Connected { conn, principal });
                lock(&probe).connected += 1;
            }
            Event::Message { conn, text } => {
                if open.contains_key(&conn) {
                    host.handle(
                        now,
                        Input::Message {
                            conn,
                            text: text.as_str(),
                        },
                    );
                }
            }
            Event::Flushed { conn, bytes } => {
                if open.contains_key(&conn) {
                    host.handle(now, Input::Flushed { conn, bytes });
                }
            }
            Event::Gone { conn } => {
                if open.remove(&conn).is_some() {
                    host.handle(now, Input::Closed { conn });
                    *lock(&probe).closed.entry(conn.0).or_default() += 1;
                }
                gone.insert(conn);
            }
        }
        drain(&mut host, &mut open, &probe, now);
        publish(&host, &probe);
    }
}

/// Carries out every decision the core made, in order. A close hands the writer its close frame
/// (after the frames queued before it) and reports `Input::Closed` at once, as `io/` does; a
/// change is committed to the store at once and reported durable.
fn drain(
    host: &mut Host<MemStore>,
    open: &mut BTreeMap<ConnId, mpsc::UnboundedSender<WriterCmd>>,
    probe: &SharedProbe,
    now: Now,
) {
    while let Some(output) = host.poll_output() {
        match output {
            Output::Send { conn, frame } => {
                if let Some(writer) = open.get(&conn) {
                    // A writer that is gone already sent (or will send) `Gone`.
                    let _ = writer.send(WriterCmd::Frame(frame));
                }
            }
            Output::Close { conn, code, reason } => {
                if let Some(writer) = open.remove(&conn) {
                    let _ = writer.send(WriterCmd::Close(code.code(), reason));
                    host.handle(now, Input::Closed { conn });
                    let mut p = lock(probe);
                    *p.closed.entry(conn.0).or_default() += 1;
                    p.core_closes.push((conn.0, code.code()));
                }
            }
            // A writer that keeps up: each change committed at once, in order, and reported.
            Output::Commit(change) => {
                commit_one(host, now, &change);
            }
        }
    }
}

fn publish(host: &Host<MemStore>, probe: &SharedProbe) {
    let mut p = lock(probe);
    p.stats = host.stats().clone();
    p.server_seq = host.server_seq();
    p.connections = host.connection_count();
}

fn lock(probe: &SharedProbe) -> std::sync::MutexGuard<'_, Probe> {
    // A poisoned probe means a test thread already panicked; keep reporting.
    probe
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The bearer token of an upgrade request: `Authorization: Bearer T`, or `?tkn=T` / `?token=T`
/// (the forms `io/` accepts).
fn token_of(req: &Request) -> Option<String> {
    if let Some(v) = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
    {
        if let Some(t) = v.strip_prefix("Bearer ") {
            return Some(t.trim().to_owned());
        }
    }
    req.uri().query().and_then(|q| {
        q.split('&').find_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            (k == "tkn" || k == "token").then(|| v.to_owned())
        })
    })
}

async fn connection(
    stream: turmoil::net::TcpStream,
    conn: ConnId,
    tokens: Arc<BTreeMap<String, Principal>>,
    events: mpsc::UnboundedSender<Event>,
    probe: SharedProbe,
) {
    let mut principal = None;
    // The signature is tungstenite's `Callback`.
    #[allow(clippy::result_large_err)]
    let callback = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
        match token_of(req).and_then(|t| tokens.get(&t).cloned()) {
            Some(p) => {
                principal = Some(Arc::new(p));
                Ok(resp)
            }
            None => {
                let mut refused = ErrorResponse::new(None);
                *refused.status_mut() = StatusCode::UNAUTHORIZED;
                Err(refused)
            }
        }
    };
    let ws = match tokio_tungstenite::accept_hdr_async(stream, callback).await {
        Ok(ws) => ws,
        Err(_) => {
            lock(&probe).refused += 1;
            return;
        }
    };
    let Some(principal) = principal else { return };
    let (mut sink, mut source) = ws.split();
    let (writer_tx, mut writer_rx) = mpsc::unbounded_channel::<WriterCmd>();
    if events
        .send(Event::Connected {
            conn,
            principal,
            writer: writer_tx,
        })
        .is_err()
    {
        return;
    }
    // Writer: frames in the core's order; Flushed after each write; the close frame last.
    let writer_events = events.clone();
    tokio::task::spawn_local(async move {
        while let Some(cmd) = writer_rx.recv().await {
            match cmd {
                WriterCmd::Frame(frame) => {
                    let bytes = frame.len() as u64;
                    let text = Message::text(frame.as_str());
                    if sink.send(text).await.is_err() {
                        let _ = writer_events.send(Event::Gone { conn });
                        return;
                    }
                    let _ = writer_events.send(Event::Flushed { conn, bytes });
                }
                WriterCmd::Close(code, reason) => {
                    let frame = CloseFrame {
                        code: CloseCode::from(code),
                        reason: reason.into(),
                    };
                    let _ = sink.send(Message::Close(Some(frame))).await;
                    let _ = sink.close().await;
                    return;
                }
            }
        }
        // The core forgot the connection (the reader reported it gone): end the stream.
        let _ = sink.close().await;
    });
    // Reader: text messages to the core; anything that ends the stream is `Gone`.
    while let Some(msg) = source.next().await {
        match msg {
            Ok(Message::Text(text)) => {
                let _ = events.send(Event::Message {
                    conn,
                    text: text.as_str().to_owned(),
                });
            }
            Ok(Message::Close(_)) | Err(_) => break,
            // Binary frames would close with 1003 in `io/`; no test sends them.
            Ok(_) => {}
        }
    }
    let _ = events.send(Event::Gone { conn });
}
