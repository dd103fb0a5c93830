//! The checker's reference model of client services, built from what the driver feeds the host
//! and what the host outputs, and compared with the host's (A) getters after every host call.
//!
//! The world drains the host after every call into it, so every output is attributed to exactly
//! one cause: a message, a connect, a flush report, a close, or the host's timers. The model
//! knows who is connected as whom (principal, clientId, handshake done, closing), which services
//! exist (owner, principal, audience) and who may see them (docs/client-services.md: own
//! principal always; another only through a trust group and the audience), and every relayed
//! request in flight host-side. For each cause it requires exactly what the contract allows:
//!
//! 1. A `clientService/request` is forwarded once as `handleRequest` (fresh host id, to the
//!    service's owner, host-stamped `senderClientId`, method and params byte for byte) or
//!    refused at once with the one documented code the model predicts: -32043 oversized, -32009
//!    before the handshake, -32602 malformed, -32008 unknown or invisible, -32600 a pending
//!    duplicate id, -32043 in-flight limits or an owner whose queue is full. A relayed request
//!    completes at most once, only to its caller under the caller's id, and only for a reason
//!    the cause carries: its owner's answer (result bytes as sent; error code, message cut at
//!    4 KiB, data kept up to the limit; -32043 for a result over the payload limit, -32603 for a
//!    malformed error), the caller's `$/cancelRequest` (-32800), its deadline now (-32050), or
//!    its service gone in this very call (-32051). If the reason is there, the completion must
//!    be too; a caller that is gone releases its entries instead. `$/cancelRequest` reaches an
//!    owner only for its own request that just timed out, was cancelled or lost its caller.
//!    Late, duplicate and foreign answers change nothing and make the host send nothing.
//! 2. A `clientService/notify` is forwarded at most once, to the owner, stamped with the
//!    sender's clientId, params byte for byte, and nothing else is sent to anyone; it is dropped
//!    only for a reason the model names (malformed, oversized, before the handshake, unknown,
//!    stale or invisible service, or the owner's queue over its soft limit), and counted either
//!    way. Forwarded sequence numbers per (sender connection, service) strictly increase.
//! 3. The host's tables equal the model after every call: `pending_requests()`,
//!    `pending_deadlines()` (deadline = arrival + `min(timeoutMs or default, maximum)`, never
//!    in the past: the timer fires exactly at it) and `service_count()`. A notification thus
//!    never allocates request state, and a connection the host closes (or the driver reports
//!    closed) holds no service and no request once that call returns.
//! 4. Host request ids are never handed out twice by one host process; service ids never in
//!    the whole run.
//!
//! A broken rule is returned as a message naming ids, connections and codes.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use axhost_core::{ConnId, Host, HostConfig, Input, Limits, Output, Principal, Stats};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::replica::CATALOG;
use crate::store::SimStore;

/// -32008: unknown or invisible service.
pub const UNKNOWN_SERVICE: i64 = -32008;
/// -32009: a client-services request before the handshake.
pub const NOT_READY: i64 = -32009;
/// -32043: a size or count limit, or an owner whose queue is full.
pub const LIMIT: i64 = -32043;
/// -32050: the service did not answer in time.
pub const TIMEOUT: i64 = -32050;
/// -32051: the service was unregistered or its connection closed while the request was pending.
pub const SERVICE_GONE: i64 = -32051;
/// -32800: cancelled by the caller.
pub const CANCELLED: i64 = -32800;
/// -32600: the caller already has a pending request with this id.
pub const DUPLICATE_ID: i64 = -32600;
/// -32602: malformed request.
pub const MALFORMED: i64 = -32602;
/// -32603: the service's error object is malformed.
pub const BAD_SERVICE_ERROR: i64 = -32603;
/// A service's error message is cut at this many bytes (on a character boundary).
pub const ERROR_MESSAGE_BYTES_MAX: usize = 4096;

/// Generous bound on a forwarded frame's bytes besides the payload and the escaped strings.
const FORWARD_ENVELOPE_BYTES: usize = 200;

// ─── Parsing ────────────────────────────────────────────────────────────────────────────────

/// One JSON-RPC message, borrowed from its frame.
#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Keeps a field that is present even when it is `null` (`"id": null` is still an id).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// `clientService/request` params, as the contract types them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CallParams<'a> {
    #[serde(borrow)]
    channel: Cow<'a, str>,
    #[serde(borrow)]
    service_id: Cow<'a, str>,
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: &'a RawValue,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

/// `clientService/notify` params, as the contract types them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct NotifyParams<'a> {
    #[serde(borrow)]
    channel: Cow<'a, str>,
    #[serde(borrow)]
    service_id: Cow<'a, str>,
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: &'a RawValue,
}

/// What the host forwards to an owner (`handleRequest` and `notification` params).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Forwarded<'a> {
    #[serde(borrow)]
    channel: Cow<'a, str>,
    #[serde(borrow)]
    service_id: Cow<'a, str>,
    #[serde(borrow)]
    sender_client_id: Cow<'a, str>,
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: &'a RawValue,
}

/// `$/cancelRequest` params.
#[derive(Deserialize)]
struct CancelParams<'a> {
    #[serde(borrow)]
    channel: Cow<'a, str>,
    #[serde(borrow)]
    id: &'a RawValue,
}

/// A JSON-RPC error object as a service sends it.
#[derive(Deserialize)]
struct ErrorObject<'a> {
    code: i64,
    #[serde(borrow)]
    message: Cow<'a, str>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

/// A client message, owned: what the model needs of it.
#[derive(Clone, Debug)]
enum Message {
    Request {
        id: String,
        method: String,
        params: Option<String>,
    },
    Notification {
        method: String,
        params: Option<String>,
    },
    Response {
        id: String,
        outcome: Result<String, String>,
    },
    /// Answered with an `id: null` error, or not at all.
    Malformed,
}

/// JSON-RPC ids are numbers, strings or null.
fn valid_id(id: &RawValue) -> bool {
    matches!(
        id.get().as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9' | b'n')
    )
}

fn parse_message(text: &[u8]) -> Message {
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Message::Malformed;
    }
    let Ok(env) = serde_json::from_slice::<Envelope<'_>>(text) else {
        return Message::Malformed;
    };
    if env.jsonrpc.as_deref() != Some("2.0") {
        return Message::Malformed;
    }
    let params = env.params.map(|p| p.get().to_owned());
    match (env.method, env.id) {
        (Some(method), Some(id)) if valid_id(id) => Message::Request {
            id: id.get().to_owned(),
            method: method.into_owned(),
            params,
        },
        (Some(method), None) => Message::Notification {
            method: method.into_owned(),
            params,
        },
        (None, Some(id)) => match (env.result, env.error) {
            (Some(r), None) => Message::Response {
                id: id.get().to_owned(),
                outcome: Ok(r.get().to_owned()),
            },
            (None, Some(e)) => Message::Response {
                id: id.get().to_owned(),
                outcome: Err(e.get().to_owned()),
            },
            _ => Message::Malformed,
        },
        _ => Message::Malformed,
    }
}

/// One host output, as the model sees it.
#[derive(Clone, Debug)]
enum Sent {
    /// A response: to the current input, or a relayed request's completion.
    Answer {
        conn: ConnId,
        id: String,
        outcome: Result<String, String>,
    },
    HandleRequest {
        conn: ConnId,
        id: String,
        params: String,
    },
    Notification {
        conn: ConnId,
        params: String,
    },
    Cancel {
        conn: ConnId,
        params: String,
    },
    Close {
        conn: ConnId,
    },
    /// Anything else (state envelopes, root notifications).
    Other,
}

fn classify(conn: ConnId, frame: &[u8]) -> Sent {
    let Ok(env) = serde_json::from_slice::<Envelope<'_>>(frame) else {
        return Sent::Other;
    };
    let params = || env.params.map(|p| p.get().to_owned()).unwrap_or_default();
    match (env.method.as_deref(), env.id) {
        (Some("clientService/handleRequest"), Some(id)) => Sent::HandleRequest {
            conn,
            id: id.get().to_owned(),
            params: params(),
        },
        (Some("clientService/notification"), None) => Sent::Notification {
            conn,
            params: params(),
        },
        (Some("$/cancelRequest"), None) => Sent::Cancel {
            conn,
            params: params(),
        },
        (None, Some(id)) => Sent::Answer {
            conn,
            id: id.get().to_owned(),
            outcome: match (env.result, env.error) {
                (Some(r), _) => Ok(r.get().to_owned()),
                (None, e) => Err(e.map(|e| e.get().to_owned()).unwrap_or_default()),
            },
        },
        _ => Sent::Other,
    }
}

fn error_code(raw: &str) -> Option<i64> {
    serde_json::from_str::<Value>(raw)
        .ok()?
        .get("code")
        .and_then(Value::as_i64)
}

/// A JSON string literal's largest encoded length.
fn escaped_max(s: &str) -> usize {
    2 + 6 * s.len()
}

// ─── The model ──────────────────────────────────────────────────────────────────────────────

#[derive(Clone, Debug)]
struct Peer {
    client_id: String,
    principal: String,
    ready: bool,
    closing: bool,
}

#[derive(Clone, Debug)]
struct Service {
    owner: ConnId,
    principal: String,
    audience: Option<BTreeSet<String>>,
}

#[derive(Clone, Debug)]
struct Flight {
    caller: ConnId,
    caller_id: String,
    service: String,
    owner: ConnId,
    deadline_ms: u64,
}

/// How a relayed request ended.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum End {
    Answered,
    TimedOut,
    Cancelled,
    Gone,
    CallerLeft,
    /// The service went and the caller left in one call: whichever the host handled first
    /// decides whether the owner hears a `$/cancelRequest`.
    GoneAndLeft,
}

/// What the host was just asked to do.
#[derive(Clone, Debug)]
enum Cause {
    Idle,
    Connected,
    Message {
        conn: ConnId,
        len: usize,
        msg: Message,
    },
    Flushed,
    Closed(ConnId),
    Timer,
    /// The writer reported changes durable or failed: held frames leave now.
    Commits,
}

/// What the model expects of the current call, decided before it ran.
enum Expected {
    Nothing,
    /// A forward, or a refusal with this code.
    Call(Result<Forward, i64>),
    /// A forward, or a drop for this reason.
    Notify(Result<Forward, &'static str>),
    /// The id a `$/cancelRequest` names and the pending request it cancels, if any.
    Cancel(Option<String>, Option<u64>),
    /// An owner's answer to its own pending request.
    Answer,
    /// An answer matching nothing this connection was sent.
    Dropped(String),
}

/// What a call should lead to.
struct Forward {
    owner: ConnId,
    service: String,
    method: String,
    params: String,
    sender: String,
    deadline_ms: u64,
}

/// What an owner's answer should become for its caller.
#[derive(Debug)]
enum Relayed {
    Result(String),
    Error {
        code: i64,
        message: Option<String>,
        data: Option<Value>,
    },
}

/// The model. See the module docs.
pub struct ServiceModel {
    limits: Limits,
    trusted: BTreeMap<String, BTreeSet<String>>,
    peers: BTreeMap<ConnId, Peer>,
    services: BTreeMap<String, Service>,
    /// Every service id handed out in this run, across restarts.
    ever: BTreeSet<String>,
    flights: BTreeMap<u64, Flight>,
    by_caller: BTreeMap<(ConnId, String), u64>,
    /// Every host request id this host process handed out: owner, and how it ended.
    history: BTreeMap<u64, (ConnId, Option<End>)>,
    /// Highest sequence number forwarded per (sender connection, service).
    fifo: BTreeMap<(ConnId, String), u64>,
    /// Requests (not client-service ones) whose answer the host holds for the disk: by
    /// `(conn, id)`, their method. Their answer leaves with a later input.
    deferred: BTreeMap<(ConnId, String), String>,
    cause: Cause,
    now_ms: u64,
    sent: Vec<Sent>,
    /// The host's counters after the previous call.
    stats: Stats,
    /// What happened, by kind, for the report.
    pub tally: BTreeMap<&'static str, u64>,
}

/// Facts about one host call, gathered from its outputs.
#[derive(Default)]
struct Effects {
    closed: BTreeSet<ConnId>,
    direct: Option<Result<String, String>>,
    forwarded: Option<(ConnId, String, String)>,
    notified: Option<(ConnId, String)>,
    cancels: Vec<(ConnId, String)>,
    completions: Vec<(u64, Flight, Result<String, String>)>,
    /// Services gone in this call.
    removed: BTreeSet<String>,
    others: usize,
}

impl ServiceModel {
    /// An empty model for a host with `config`.
    pub fn new(config: &HostConfig) -> ServiceModel {
        let mut trusted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for group in &config.trust_groups {
            for a in group {
                for b in group {
                    if a != b {
                        trusted.entry(a.clone()).or_default().insert(b.clone());
                    }
                }
            }
        }
        ServiceModel {
            limits: config.limits.clone(),
            trusted,
            peers: BTreeMap::new(),
            services: BTreeMap::new(),
            ever: BTreeSet::new(),
            flights: BTreeMap::new(),
            by_caller: BTreeMap::new(),
            history: BTreeMap::new(),
            fifo: BTreeMap::new(),
            deferred: BTreeMap::new(),
            cause: Cause::Idle,
            now_ms: 0,
            sent: Vec::new(),
            stats: Stats::default(),
            tally: BTreeMap::new(),
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.tally.entry(what).or_default() += 1;
    }

    /// A connection is about to be reported to the host.
    pub fn connected(&mut self, conn: ConnId, client_id: &str, principal: &Principal) {
        self.peers.insert(
            conn,
            Peer {
                client_id: client_id.to_owned(),
                principal: principal.id.clone(),
                ready: false,
                closing: false,
            },
        );
    }

    /// The host process died: nothing of it survives but the service ids it handed out.
    pub fn restarted(&mut self) {
        self.peers.clear();
        self.services.clear();
        self.flights.clear();
        self.by_caller.clear();
        self.history.clear();
        self.fifo.clear();
        self.deferred.clear();
        self.sent.clear();
        self.cause = Cause::Idle;
        self.stats = Stats::default();
    }

    /// The driver is about to feed `input` at `now_ms`.
    pub fn feeding(&mut self, input: &Input<'_>, now_ms: u64, host: Option<&Host<SimStore>>) {
        self.now_ms = now_ms;
        self.sent.clear();
        // A connection the host decided to close ignores messages from then on, even while its
        // close waits behind held frames (the model hears of the close only when it leaves).
        if let (Input::Message { conn, .. }, Some(host)) = (input, host) {
            if host.connection_closing(*conn) {
                if let Some(p) = self.peers.get_mut(conn) {
                    p.closing = true;
                }
            }
        }
        self.cause = match input {
            Input::Connected { .. } => Cause::Connected,
            Input::Message { conn, text } => Cause::Message {
                conn: *conn,
                len: text.len(),
                msg: parse_message(text.as_bytes()),
            },
            Input::Flushed { .. } => Cause::Flushed,
            Input::Closed { conn } => {
                self.deferred.retain(|(c, _), _| c != conn);
                Cause::Closed(*conn)
            }
            Input::Durable { .. } | Input::CommitFailed { .. } => Cause::Commits,
        };
    }

    /// The driver is about to fire the host's timers at `now_ms`.
    pub fn timer(&mut self, now_ms: u64) {
        self.now_ms = now_ms;
        self.sent.clear();
        self.cause = Cause::Timer;
    }

    /// One output of the current call.
    pub fn observe(&mut self, out: &Output) {
        self.sent.push(match out {
            Output::Send { conn, frame } => classify(*conn, frame.as_bytes()),
            Output::Close { conn, .. } => Sent::Close { conn: *conn },
            Output::Commit(_) => Sent::Other,
        });
    }

    fn visible(&self, s: &Service, viewer: &str) -> bool {
        s.principal == viewer
            || (self
                .trusted
                .get(&s.principal)
                .is_some_and(|peers| peers.contains(viewer))
                && s.audience.as_ref().is_none_or(|a| a.contains(viewer)))
    }

    /// The current call returned: checks everything it did and updates the model.
    pub fn fed(&mut self, host: &Host<SimStore>) -> Result<(), String> {
        let cause = std::mem::replace(&mut self.cause, Cause::Idle);
        let sent = std::mem::take(&mut self.sent);
        let mut ignored = false;
        if let Cause::Message { conn, .. } = &cause {
            ignored = self.peers.get(conn).is_none_or(|p| p.closing);
            if ignored && !sent.is_empty() {
                return Err(format!(
                    "a message from {conn:?}, which the host is closing, caused {} outputs: {:?}",
                    sent.len(),
                    sent.first()
                ));
            }
        }
        // What the model, as it was before this call, says must happen.
        let mut expected = Expected::Nothing;
        if let (false, Cause::Message { conn, len, msg }) = (ignored, &cause) {
            expected = match msg {
                Message::Request { id, method, params } if method == "clientService/request" => {
                    Expected::Call(self.expect_call(*conn, id, params.as_deref(), *len)?)
                }
                Message::Notification { method, params } if method == "clientService/notify" => {
                    Expected::Notify(self.expect_notify(*conn, params.as_deref(), *len)?)
                }
                Message::Notification { method, params } if method == "$/cancelRequest" => {
                    let named = params
                        .as_deref()
                        .and_then(|p| serde_json::from_str::<CancelParams<'_>>(p).ok())
                        .filter(|p| p.channel == CATALOG)
                        .map(|p| p.id.get().to_owned());
                    let h = named
                        .as_ref()
                        .and_then(|id| self.by_caller.get(&(*conn, id.clone())).copied());
                    Expected::Cancel(named, h)
                }
                Message::Response { id, .. } => {
                    let h = id.parse::<u64>().ok();
                    match h.and_then(|h| self.flights.get(&h)) {
                        Some(f) if f.owner == *conn => Expected::Answer,
                        _ => Expected::Dropped(id.clone()),
                    }
                }
                _ => Expected::Nothing,
            };
        }
        let mut fx = self.effects(&cause, sent)?;
        // A close the host decided in this call may wait behind held frames; the host releases
        // what the connection held (services, calls) at the decision, so the model does too.
        for (conn, p) in self.peers.iter_mut() {
            if !p.closing && host.connection_closing(*conn) {
                p.closing = true;
                fx.closed.insert(*conn);
            }
        }
        if let Cause::Closed(conn) = cause {
            fx.closed.insert(conn);
        }
        match (&cause, expected) {
            (Cause::Message { conn, .. }, Expected::Call(call)) => {
                let id = match &cause {
                    Cause::Message {
                        msg: Message::Request { id, .. },
                        ..
                    } => id.clone(),
                    _ => String::new(),
                };
                self.on_call(host, *conn, &id, call, &mut fx)?;
            }
            (Cause::Message { conn, .. }, Expected::Notify(notify)) => {
                self.on_notify(host, *conn, notify, &mut fx)?;
            }
            (Cause::Message { conn, .. }, Expected::Cancel(named, h)) => {
                self.on_cancel(*conn, named, h, &fx)?;
            }
            (Cause::Message { conn, .. }, Expected::Dropped(id)) => {
                self.dropped_response(host, *conn, &id, &fx)?;
            }
            (
                Cause::Message {
                    conn,
                    msg: Message::Request { method, params, .. },
                    ..
                },
                _,
            ) if !ignored => self.on_request(*conn, method, params.as_deref(), &mut fx)?,
            _ => {}
        }
        if let (
            false,
            Cause::Message {
                conn,
                msg: Message::Request { id, method, .. },
                ..
            },
        ) = (ignored, &cause)
        {
            if fx.direct.is_none() && method != "clientService/request" {
                self.deferred.insert((*conn, id.clone()), method.clone());
                // The host decides a handshake when it handles it, and answers once what it
                // shows is durable: the peer is ready from the decision on.
                if method == "initialize" || method == "reconnect" {
                    let ready = host.connection_ready(*conn);
                    if let Some(p) = self.peers.get_mut(conn) {
                        p.ready = ready;
                    }
                }
            }
        }
        if fx.forwarded.is_some() || fx.notified.is_some() {
            return Err(format!(
                "the host forwarded client-service traffic nothing asked for: {:?} {:?}",
                fx.forwarded, fx.notified
            ));
        }
        // An ignored input carries no reason for anything.
        self.settle(host, if ignored { &Cause::Idle } else { &cause }, fx)
    }

    /// Sorts the outputs of one call: answers to the input, completions, forwards, closes.
    fn effects(&mut self, cause: &Cause, sent: Vec<Sent>) -> Result<Effects, String> {
        let mut fx = Effects::default();
        let asked: Option<(ConnId, &str)> = match cause {
            Cause::Message {
                conn,
                msg: Message::Request { id, .. },
                ..
            } => Some((*conn, id.as_str())),
            Cause::Message {
                conn,
                msg: Message::Malformed,
                ..
            } => Some((*conn, "null")),
            _ => None,
        };
        for s in sent {
            match s {
                Sent::Close { conn } => {
                    fx.closed.insert(conn);
                    if let Some(p) = self.peers.get_mut(&conn) {
                        p.closing = true;
                    }
                }
                Sent::Answer { conn, id, outcome } => {
                    if fx.direct.is_none() && asked == Some((conn, id.as_str())) {
                        fx.direct = Some(outcome);
                    } else if let Some(method) = self.deferred.remove(&(conn, id.clone())) {
                        // A held answer, released now: a handshake that succeeded makes the
                        // peer ready, as the host made it when it accepted the handshake.
                        let handshake = method == "initialize" || method == "reconnect";
                        let ready = self.peers.get(&conn).is_some_and(|p| p.ready);
                        if handshake && outcome.is_ok() && !ready {
                            return Err(format!(
                                "{conn:?}: {method} {id} answered with success, but the host had refused it"
                            ));
                        }
                        fx.others += 1;
                    } else if let Some(h) = self.by_caller.remove(&(conn, id.clone())) {
                        let Some(f) = self.flights.remove(&h) else {
                            return Err(format!("model: no flight {h}"));
                        };
                        fx.completions.push((h, f, outcome));
                    } else {
                        return Err(format!(
                            "the host answered id {id} on {conn:?}, which answers nothing asked there (a second completion, or one on the wrong connection): {outcome:?}"
                        ));
                    }
                }
                Sent::HandleRequest { conn, id, params } => {
                    if fx.forwarded.is_some() {
                        return Err(format!(
                            "one call forwarded twice (second as {id} to {conn:?})"
                        ));
                    }
                    fx.forwarded = Some((conn, id, params));
                }
                Sent::Notification { conn, params } => {
                    if fx.notified.is_some() {
                        return Err(format!(
                            "one input forwarded two notifications (second to {conn:?}: {params})"
                        ));
                    }
                    fx.notified = Some((conn, params));
                }
                Sent::Cancel { conn, params } => fx.cancels.push((conn, params)),
                Sent::Other => fx.others += 1,
            }
        }
        Ok(fx)
    }

    // ─── Requests ───────────────────────────────────────────────────────────────────────────

    /// Registrations, updates, unregistrations and handshakes that succeeded.
    fn on_request(
        &mut self,
        conn: ConnId,
        method: &str,
        params: Option<&str>,
        fx: &mut Effects,
    ) -> Result<(), String> {
        let succeeded = || match &fx.direct {
            Some(Ok(r)) => Some(r.clone()),
            _ => None,
        };
        match method {
            "initialize" | "reconnect" => {
                if succeeded().is_some() {
                    if let Some(p) = self.peers.get_mut(&conn) {
                        p.ready = true;
                    }
                }
                Ok(())
            }
            "client/registerService" => {
                let Some(result) = succeeded() else {
                    return Ok(());
                };
                let id = serde_json::from_str::<Value>(&result)
                    .ok()
                    .and_then(|v| {
                        v.get("serviceId")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    })
                    .ok_or_else(|| format!("registerService result without serviceId: {result}"))?;
                if !self.ever.insert(id.clone()) {
                    return Err(format!("service id {id} handed out twice"));
                }
                let p: Value = params
                    .and_then(|p| serde_json::from_str(p).ok())
                    .unwrap_or_default();
                let principal = self.peer(conn)?.principal.clone();
                self.services.insert(
                    id,
                    Service {
                        owner: conn,
                        principal,
                        audience: audience(p.get("audience")),
                    },
                );
                self.count("services registered");
                Ok(())
            }
            "client/updateService" | "client/unregisterService" => {
                if succeeded().is_none() {
                    return Ok(());
                }
                let p: Value = params
                    .and_then(|p| serde_json::from_str(p).ok())
                    .unwrap_or_default();
                let sid = p
                    .get("serviceId")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let Some(s) = self.services.get_mut(sid) else {
                    return Err(format!(
                        "{method} of {sid} succeeded, but no such service exists"
                    ));
                };
                if s.owner != conn {
                    return Err(format!(
                        "{method} of {sid} by {conn:?} succeeded, but {:?} owns it",
                        s.owner
                    ));
                }
                if method == "client/unregisterService" {
                    self.services.remove(sid);
                    fx.removed.insert(sid.to_owned());
                } else if let Some(a) = p.get("audience") {
                    s.audience = audience(Some(a));
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    fn peer(&self, conn: ConnId) -> Result<&Peer, String> {
        self.peers
            .get(&conn)
            .ok_or_else(|| format!("model: unknown connection {conn:?}"))
    }

    /// What a call must lead to: a forward, or a refusal with one code.
    fn expect_call(
        &self,
        conn: ConnId,
        id: &str,
        params: Option<&str>,
        len: usize,
    ) -> Result<Result<Forward, i64>, String> {
        let l = &self.limits;
        if len > l.message_bytes_max_for(Some("clientService/request")) {
            return Ok(Err(LIMIT));
        }
        let peer = self.peer(conn)?;
        if !peer.ready {
            return Ok(Err(NOT_READY));
        }
        let Ok(p) = serde_json::from_str::<CallParams<'_>>(params.unwrap_or("null")) else {
            return Ok(Err(MALFORMED));
        };
        if p.channel != CATALOG
            || p.method.is_empty()
            || p.method.len() > l.service_method_bytes_max as usize
        {
            return Ok(Err(MALFORMED));
        }
        if p.params.get().len() > l.service_payload_bytes_max as usize {
            return Ok(Err(LIMIT));
        }
        if p.timeout_ms == Some(0) {
            return Ok(Err(MALFORMED));
        }
        let Some(s) = self
            .services
            .get(p.service_id.as_ref())
            .filter(|s| self.visible(s, &peer.principal))
        else {
            return Ok(Err(UNKNOWN_SERVICE));
        };
        if self.by_caller.contains_key(&(conn, id.to_owned())) {
            return Ok(Err(DUPLICATE_ID));
        }
        let of_caller = self.flights.values().filter(|f| f.caller == conn).count();
        let of_service = self
            .flights
            .values()
            .filter(|f| f.service == p.service_id)
            .count();
        if of_caller >= l.relays_per_conn_max as usize
            || of_service >= l.relays_per_service_max as usize
        {
            return Ok(Err(LIMIT));
        }
        let timeout = p
            .timeout_ms
            .unwrap_or(l.relay_timeout_ms)
            .min(l.relay_timeout_ms_max);
        Ok(Ok(Forward {
            owner: s.owner,
            service: p.service_id.into_owned(),
            method: p.method.into_owned(),
            params: p.params.get().to_owned(),
            sender: peer.client_id.clone(),
            deadline_ms: self.now_ms.saturating_add(timeout),
        }))
    }

    /// Whether a frame of about `bytes` to `conn` may have been dropped as overload: its queue
    /// (sent and held frames alike) is over the soft limit, or the frame would cross the hard
    /// one. Read after the call, when the queue holds at least what it held at the decision.
    fn overloaded(&self, host: &Host<SimStore>, conn: ConnId, bytes: usize) -> bool {
        let q = host.queued_bytes(conn).unwrap_or(0) + host.held_bytes(conn).unwrap_or(0);
        q > self.limits.queue_bytes_soft || q + bytes as u64 > self.limits.queue_bytes_hard
    }

    fn on_call(
        &mut self,
        host: &Host<SimStore>,
        conn: ConnId,
        id: &str,
        expected: Result<Forward, i64>,
        fx: &mut Effects,
    ) -> Result<(), String> {
        let forwarded = fx.forwarded.take();
        let caller_closed = fx.closed.contains(&conn);
        match (expected, &fx.direct, forwarded) {
            (Err(code), Some(Err(e)), None) => {
                let got = error_code(e);
                if got != Some(code) {
                    return Err(format!(
                        "call {id} on {conn:?} refused with {got:?}, the contract says {code}: {e}"
                    ));
                }
                self.count(refusal_name(code));
                Ok(())
            }
            (Err(_), None, None) if caller_closed => Ok(()),
            (Err(code), direct, forwarded) => Err(format!(
                "call {id} on {conn:?} must be refused with {code}; the host answered {direct:?} and forwarded {forwarded:?}"
            )),
            (Ok(fwd), None, Some((owner, host_id, fparams))) => {
                self.check_forward(conn, id, &fwd, owner, &host_id, &fparams)?;
                let h = host_id.parse::<u64>().unwrap_or_default();
                self.history.insert(h, (owner, None));
                self.by_caller.insert((conn, id.to_owned()), h);
                self.flights.insert(
                    h,
                    Flight {
                        caller: conn,
                        caller_id: id.to_owned(),
                        service: fwd.service,
                        owner,
                        deadline_ms: fwd.deadline_ms,
                    },
                );
                self.count("calls forwarded");
                Ok(())
            }
            (Ok(fwd), Some(Err(e)), None) => {
                let bytes = FORWARD_ENVELOPE_BYTES
                    + escaped_max(&fwd.service)
                    + escaped_max(&fwd.sender)
                    + escaped_max(&fwd.method)
                    + fwd.params.len();
                if error_code(e) != Some(LIMIT) || !self.overloaded(host, fwd.owner, bytes) {
                    return Err(format!(
                        "call {id} on {conn:?} to {} refused with {e}, but it must be forwarded to {:?} (queue {:?} bytes)",
                        fwd.service,
                        fwd.owner,
                        host.queued_bytes(fwd.owner)
                    ));
                }
                self.count("calls refused: owner overloaded (-32043)");
                Ok(())
            }
            (Ok(_), None, None) if caller_closed => Ok(()),
            (Ok(fwd), direct, forwarded) => Err(format!(
                "call {id} on {conn:?} must be forwarded to {:?}; the host answered {direct:?} and forwarded {forwarded:?}",
                fwd.owner
            )),
        }
    }

    fn check_forward(
        &self,
        conn: ConnId,
        id: &str,
        fwd: &Forward,
        owner: ConnId,
        host_id: &str,
        fparams: &str,
    ) -> Result<(), String> {
        let what = format!("call {id} on {conn:?} forwarded as {host_id} to {owner:?}");
        if owner != fwd.owner {
            return Err(format!("{what}, but {:?} owns {}", fwd.owner, fwd.service));
        }
        let h = host_id
            .parse::<u64>()
            .map_err(|_| format!("{what}: the host id is not a u64"))?;
        if let Some((first, _)) = self.history.get(&h) {
            return Err(format!(
                "{what}: host id {h} was already handed out (to {first:?}) by this host process"
            ));
        }
        let f = serde_json::from_str::<Forwarded<'_>>(fparams)
            .map_err(|e| format!("{what}: params do not decode ({e}): {fparams}"))?;
        if f.channel != CATALOG
            || f.service_id != fwd.service
            || f.method != fwd.method
            || f.sender_client_id != fwd.sender
        {
            return Err(format!(
                "{what}: expected service {} method {} sender {}, got {fparams}",
                fwd.service, fwd.method, fwd.sender
            ));
        }
        if f.params.get() != fwd.params {
            return Err(format!(
                "{what}: params not forwarded byte for byte: sent {}, forwarded {}",
                fwd.params,
                f.params.get()
            ));
        }
        Ok(())
    }

    /// What the owner's answer must become for the caller.
    fn relayed(&self, outcome: &Result<String, String>, len: usize) -> Relayed {
        let l = &self.limits;
        let limit = Relayed::Error {
            code: LIMIT,
            message: None,
            data: None,
        };
        if len > l.message_bytes_max_for(None) {
            return limit;
        }
        match outcome {
            Ok(r) if r.len() > l.service_payload_bytes_max as usize => limit,
            Ok(r) => Relayed::Result(r.clone()),
            Err(e) => match serde_json::from_str::<ErrorObject<'_>>(e) {
                Ok(e) => {
                    let mut message = e.message.into_owned();
                    if message.len() > ERROR_MESSAGE_BYTES_MAX {
                        let mut cut = ERROR_MESSAGE_BYTES_MAX;
                        while !message.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        message.truncate(cut);
                    }
                    let data = e
                        .data
                        .filter(|d| d.get().len() <= l.service_error_data_bytes_max as usize)
                        .map(|d| serde_json::from_str(d.get()).unwrap_or(Value::Null));
                    Relayed::Error {
                        code: e.code,
                        message: Some(message),
                        data,
                    }
                }
                Err(_) => Relayed::Error {
                    code: BAD_SERVICE_ERROR,
                    message: None,
                    data: None,
                },
            },
        }
    }

    /// An answer that matches no request this connection was sent: nothing may happen.
    fn dropped_response(
        &mut self,
        host: &Host<SimStore>,
        conn: ConnId,
        id: &str,
        fx: &Effects,
    ) -> Result<(), String> {
        if self.peers.get(&conn).is_none_or(|p| p.closing) {
            return Ok(());
        }
        if fx.direct.is_some()
            || !fx.completions.is_empty()
            || !fx.cancels.is_empty()
            || !fx.closed.is_empty()
            || fx.others > 0
        {
            return Err(format!(
                "an answer to {id} from {conn:?}, which was not sent that request, made the host send something"
            ));
        }
        let kind = match id.parse::<u64>().ok().and_then(|h| self.history.get(&h)) {
            Some((owner, _)) if *owner != conn => "answers dropped: foreign",
            Some((_, Some(End::Answered))) => "answers dropped: duplicate",
            Some((_, Some(End::TimedOut))) => "answers dropped: late, after the timeout",
            Some((_, Some(End::Cancelled))) => "answers dropped: late, after a cancel",
            Some((_, Some(End::Gone | End::CallerLeft | End::GoneAndLeft))) => {
                "answers dropped: late, service or caller gone"
            }
            Some((_, None)) => "answers dropped: foreign",
            None => "answers dropped: unknown id",
        };
        self.count(kind);
        let dropped = host.stats().responses_dropped - self.stats.responses_dropped;
        if dropped != 1 {
            return Err(format!(
                "an answer to {id} from {conn:?} was dropped, but responses_dropped grew by {dropped}"
            ));
        }
        Ok(())
    }

    // ─── Notifications ──────────────────────────────────────────────────────────────────────

    /// Where a notification must go, or why it must be dropped.
    fn expect_notify(
        &self,
        conn: ConnId,
        params: Option<&str>,
        len: usize,
    ) -> Result<Result<Forward, &'static str>, String> {
        let l = &self.limits;
        if len > l.message_bytes_max_for(Some("clientService/notify")) {
            return Ok(Err("notifications dropped: oversized"));
        }
        let peer = self.peer(conn)?;
        if !peer.ready {
            return Ok(Err("notifications dropped: before the handshake"));
        }
        let Some(Ok(p)) = params.map(serde_json::from_str::<NotifyParams<'_>>) else {
            return Ok(Err("notifications dropped: malformed"));
        };
        if p.channel != CATALOG
            || p.method.is_empty()
            || p.method.len() > l.service_method_bytes_max as usize
        {
            return Ok(Err("notifications dropped: malformed"));
        }
        if p.params.get().len() > l.service_payload_bytes_max as usize {
            return Ok(Err("notifications dropped: oversized"));
        }
        let service = p.service_id.as_ref();
        let Some(s) = self
            .services
            .get(service)
            .filter(|s| self.visible(s, &peer.principal))
        else {
            return Ok(Err(if self.services.contains_key(service) {
                "notifications dropped: invisible service"
            } else if self.ever.contains(service) {
                "notifications dropped: stale service"
            } else {
                "notifications dropped: unknown service"
            }));
        };
        Ok(Ok(Forward {
            owner: s.owner,
            service: service.to_owned(),
            method: p.method.into_owned(),
            params: p.params.get().to_owned(),
            sender: peer.client_id.clone(),
            deadline_ms: 0,
        }))
    }

    fn on_notify(
        &mut self,
        host: &Host<SimStore>,
        conn: ConnId,
        expected: Result<Forward, &'static str>,
        fx: &mut Effects,
    ) -> Result<(), String> {
        let notified = fx.notified.take();
        // Nothing at all but the one forward: no answer, no error, nothing to the sender.
        if fx.direct.is_some()
            || fx.forwarded.is_some()
            || !fx.cancels.is_empty()
            || !fx.completions.is_empty()
            || !fx.closed.is_empty()
            || fx.others > 0
        {
            return Err(format!(
                "a notification from {conn:?} made the host send more than one forward: answer {:?}, {} cancels, {} completions, closes {:?}, {} other frames",
                fx.direct,
                fx.cancels.len(),
                fx.completions.len(),
                fx.closed,
                fx.others
            ));
        }
        let stats = host.stats();
        let forwarded = stats.notifications_forwarded - self.stats.notifications_forwarded;
        let dropped = stats.notifications_dropped - self.stats.notifications_dropped;
        let notified = notified.as_ref();
        if (forwarded, dropped) != (u64::from(notified.is_some()), u64::from(notified.is_none())) {
            return Err(format!(
                "a notification from {conn:?} was {}, but the host counted {forwarded} forwarded and {dropped} dropped",
                if notified.is_some() { "forwarded" } else { "dropped" }
            ));
        }
        match (expected, notified) {
            (Err(why), None) => {
                self.count(why);
                Ok(())
            }
            (Err(why), Some((owner, _))) => Err(format!(
                "a notification from {conn:?} was forwarded to {owner:?}; it must be dropped ({why})"
            )),
            (Ok(fwd), None) => {
                let bytes = FORWARD_ENVELOPE_BYTES
                    + escaped_max(&fwd.service)
                    + escaped_max(&fwd.sender)
                    + escaped_max(&fwd.method)
                    + fwd.params.len();
                if !self.overloaded(host, fwd.owner, bytes) {
                    return Err(format!(
                        "a notification from {conn:?} to {} was dropped, but {:?} has room ({:?} bytes queued)",
                        fwd.service,
                        fwd.owner,
                        host.queued_bytes(fwd.owner)
                    ));
                }
                self.count("notifications dropped: owner overloaded");
                Ok(())
            }
            (Ok(fwd), Some((owner, fparams))) => {
                let what = format!("a notification from {conn:?} to {}", fwd.service);
                if *owner != fwd.owner {
                    return Err(format!(
                        "{what} went to {owner:?}, but {:?} owns it",
                        fwd.owner
                    ));
                }
                let f = serde_json::from_str::<Forwarded<'_>>(fparams)
                    .map_err(|e| format!("{what}: forwarded params do not decode ({e})"))?;
                if f.channel != CATALOG
                    || f.service_id != fwd.service
                    || f.method != fwd.method
                    || f.sender_client_id != fwd.sender
                {
                    return Err(format!(
                        "{what}: expected method {} stamped {}, forwarded {fparams}",
                        fwd.method, fwd.sender
                    ));
                }
                if f.params.get() != fwd.params {
                    return Err(format!(
                        "{what}: params not forwarded byte for byte: sent {}, forwarded {}",
                        fwd.params,
                        f.params.get()
                    ));
                }
                if let Some(seq) = serde_json::from_str::<Value>(&fwd.params)
                    .ok()
                    .and_then(|v| v.get("seq").and_then(Value::as_u64))
                {
                    let last = self.fifo.insert((conn, fwd.service.clone()), seq);
                    if last.is_some_and(|l| l >= seq) {
                        return Err(format!(
                            "{what}: seq {seq} forwarded after seq {last:?} (FIFO)"
                        ));
                    }
                }
                self.count("notifications forwarded");
                Ok(())
            }
        }
    }

    /// `$/cancelRequest` from a caller: completes its own pending request (checked with the
    /// completions), or does nothing at all.
    fn on_cancel(
        &mut self,
        conn: ConnId,
        named: Option<String>,
        pending: Option<u64>,
        fx: &Effects,
    ) -> Result<(), String> {
        if pending.is_some() {
            self.count("cancels sent");
            return Ok(());
        }
        if fx.direct.is_some()
            || !fx.completions.is_empty()
            || !fx.cancels.is_empty()
            || !fx.closed.is_empty()
            || fx.others > 0
        {
            return Err(format!(
                "a $/cancelRequest from {conn:?} naming nothing pending ({named:?}) made the host send something"
            ));
        }
        self.count("cancels naming nothing");
        Ok(())
    }

    // ─── After every call ───────────────────────────────────────────────────────────────────

    /// Justifies every completion, releases what closed connections held, requires every
    /// completion a cause calls for, checks cancellations and compares with the host.
    fn settle(
        &mut self,
        host: &Host<SimStore>,
        cause: &Cause,
        mut fx: Effects,
    ) -> Result<(), String> {
        let now = self.now_ms;
        let gone: Vec<String> = self
            .services
            .iter()
            .filter(|(_, s)| fx.closed.contains(&s.owner))
            .map(|(id, _)| id.clone())
            .collect();
        let mut released = 0;
        for id in &gone {
            self.services.remove(id);
            fx.removed.insert(id.clone());
        }
        let answer = match cause {
            Cause::Message {
                conn,
                len,
                msg: Message::Response { id, outcome },
            } => id.parse::<u64>().ok().map(|h| (*conn, h, outcome, *len)),
            _ => None,
        };
        let cancel = match cause {
            Cause::Message {
                conn,
                msg: Message::Notification { method, params },
                ..
            } if method == "$/cancelRequest" => params
                .as_deref()
                .and_then(|p| serde_json::from_str::<CancelParams<'_>>(p).ok())
                .filter(|p| p.channel == CATALOG)
                .map(|p| (*conn, p.id.get().to_owned())),
            _ => None,
        };
        let timer = matches!(cause, Cause::Timer);
        let mut ended: BTreeMap<u64, End> = BTreeMap::new();
        for (h, f, outcome) in std::mem::take(&mut fx.completions) {
            let what = format!(
                "request {h} (id {} of {:?} to {} owned by {:?})",
                f.caller_id, f.caller, f.service, f.owner
            );
            let code = outcome.as_ref().err().and_then(|e| error_code(e));
            let mut kind = None;
            let end = if let Some((_, _, answered, len)) =
                answer.filter(|(c, a, _, _)| *c == f.owner && *a == h)
            {
                kind = Some(self.check_relayed(&what, answered, len, &outcome)?);
                End::Answered
            } else if cancel
                .as_ref()
                .is_some_and(|(c, id)| *c == f.caller && *id == f.caller_id)
                && code == Some(CANCELLED)
            {
                End::Cancelled
            } else if timer && code == Some(TIMEOUT) {
                if f.deadline_ms != now {
                    return Err(format!(
                        "{what} timed out at {now} ms, its deadline is {} ms",
                        f.deadline_ms
                    ));
                }
                End::TimedOut
            } else if fx.removed.contains(&f.service) && code == Some(SERVICE_GONE) {
                End::Gone
            } else {
                return Err(format!(
                    "{what} completed for no reason this call carries: {outcome:?}"
                ));
            };
            self.count(match end {
                End::Answered => kind.unwrap_or("completed: result"),
                End::TimedOut => "completed: timeout (-32050)",
                End::Cancelled => "completed: cancelled (-32800)",
                End::Gone => "completed: service gone (-32051)",
                End::CallerLeft | End::GoneAndLeft => "released: caller left",
            });
            ended.insert(h, end);
        }
        let pending: Vec<u64> = self.flights.keys().copied().collect();
        for h in pending {
            let Some(f) = self.flights.get(&h).cloned() else {
                continue;
            };
            let what = format!(
                "request {h} (id {} of {:?} to {} owned by {:?})",
                f.caller_id, f.caller, f.service, f.owner
            );
            if fx.closed.contains(&f.caller) {
                // The caller is gone: the request was released, or it ended for a reason this
                // call carries and the host could not deliver the answer (the caller was over
                // its queue limit, so the reply closed it instead).
                self.flights.remove(&h);
                self.by_caller.remove(&(f.caller, f.caller_id.clone()));
                let end = if answer.is_some_and(|(c, a, _, _)| c == f.owner && a == h) {
                    End::Answered
                } else if cancel
                    .as_ref()
                    .is_some_and(|(c, id)| *c == f.caller && *id == f.caller_id)
                {
                    End::Cancelled
                } else if timer && f.deadline_ms <= now {
                    End::TimedOut
                } else if fx.removed.contains(&f.service) {
                    End::GoneAndLeft
                } else {
                    End::CallerLeft
                };
                released += 1;
                self.count(match end {
                    End::CallerLeft => "released: caller left",
                    End::GoneAndLeft => "released: caller left as its service went",
                    _ => "ended, answer lost: the caller was closed",
                });
                ended.insert(h, end);
            } else if fx.removed.contains(&f.service) {
                return Err(format!(
                    "{what}: its service is gone, but it did not fail with -32051"
                ));
            } else if f.deadline_ms <= now {
                return Err(format!(
                    "{what} is pending at {now} ms, past its deadline {} ms",
                    f.deadline_ms
                ));
            } else if answer.is_some_and(|(c, a, _, _)| c == f.owner && a == h) {
                return Err(format!(
                    "{what}: its owner answered, but the caller got nothing"
                ));
            } else if cancel
                .as_ref()
                .is_some_and(|(c, id)| *c == f.caller && *id == f.caller_id)
            {
                return Err(format!(
                    "{what}: its caller cancelled it, but it is still pending"
                ));
            }
        }
        for (&h, &end) in &ended {
            if let Some(entry) = self.history.get_mut(&h) {
                entry.1 = Some(end);
            }
        }
        self.check_cancels(host, &fx, &ended)?;
        if let Cause::Closed(conn) = cause {
            self.peers.remove(conn);
        }
        self.compare(host).map_err(|e| {
            if fx.closed.is_empty() {
                return e;
            }
            format!(
                "{e}; this call closed {:?}, whose {} services and {released} requests the model dropped with them",
                fx.closed,
                gone.len()
            )
        })
    }

    /// Checks that the caller got what the owner answered; returns what kind of completion it
    /// was.
    fn check_relayed(
        &self,
        what: &str,
        answered: &Result<String, String>,
        len: usize,
        outcome: &Result<String, String>,
    ) -> Result<&'static str, String> {
        let expected = self.relayed(answered, len);
        let kind = match &expected {
            Relayed::Result(_) => "completed: result",
            Relayed::Error {
                code: LIMIT,
                message: None,
                ..
            } => "completed: result over the payload limit (-32043)",
            Relayed::Error { message: None, .. } => "completed: malformed service error (-32603)",
            Relayed::Error {
                message: Some(m), ..
            } if m.len() == ERROR_MESSAGE_BYTES_MAX - 1 || m.len() == ERROR_MESSAGE_BYTES_MAX => {
                "completed: service error, message cut"
            }
            Relayed::Error { data: None, .. }
                if answered
                    .as_ref()
                    .err()
                    .is_some_and(|e| e.contains("\"data\"")) =>
            {
                "completed: service error, data over the limit dropped"
            }
            Relayed::Error { .. } => "completed: service error",
        };
        let matches = match (&expected, outcome) {
            (Relayed::Result(r), Ok(got)) => r == got,
            (
                Relayed::Error {
                    code,
                    message,
                    data,
                },
                Err(got),
            ) => {
                let got: Value = serde_json::from_str(got).unwrap_or_default();
                got.get("code").and_then(Value::as_i64) == Some(*code)
                    && message
                        .as_ref()
                        .is_none_or(|m| got.get("message").and_then(Value::as_str) == Some(m))
                    && (message.is_none() || got.get("data") == data.as_ref())
            }
            _ => false,
        };
        if !matches {
            return Err(format!(
                "{what}: the owner answered {answered:?}, the caller must get {expected:?}, got {outcome:?}"
            ));
        }
        Ok(kind)
    }

    /// `$/cancelRequest` to an owner only for its own request that just timed out, was
    /// cancelled or lost its caller, once; and one for each such request unless the owner is
    /// closing or its queue is full.
    fn check_cancels(
        &mut self,
        host: &Host<SimStore>,
        fx: &Effects,
        ended: &BTreeMap<u64, End>,
    ) -> Result<(), String> {
        let mut told = BTreeSet::new();
        for (owner, params) in &fx.cancels {
            let h = serde_json::from_str::<Value>(params)
                .ok()
                .filter(|v| v.get("channel").and_then(Value::as_str) == Some(CATALOG))
                .and_then(|v| v.get("id").and_then(Value::as_u64))
                .ok_or_else(|| {
                    format!("a $/cancelRequest to {owner:?} without a host id: {params}")
                })?;
            let fits = matches!(
                ended.get(&h),
                Some(End::TimedOut | End::Cancelled | End::CallerLeft | End::GoneAndLeft)
            );
            let sent_to = self.history.get(&h).map(|(o, _)| *o);
            if !fits || sent_to != Some(*owner) || !told.insert(h) {
                return Err(format!(
                    "$/cancelRequest for {h} to {owner:?} (sent to {sent_to:?}, ended {:?} now)",
                    ended.get(&h)
                ));
            }
        }
        for (&h, end) in ended {
            if !matches!(end, End::TimedOut | End::Cancelled | End::CallerLeft) || told.contains(&h)
            {
                continue;
            }
            let Some(&(owner, _)) = self.history.get(&h) else {
                continue;
            };
            let closing =
                fx.closed.contains(&owner) || self.peers.get(&owner).is_none_or(|p| p.closing);
            if closing {
                continue;
            }
            let bytes = FORWARD_ENVELOPE_BYTES + 20;
            if !self.overloaded(host, owner, bytes) {
                return Err(format!(
                    "request {h} ended ({end:?}) without a $/cancelRequest to its owner {owner:?}, which has room"
                ));
            }
            self.count("cancels to owners dropped: overloaded");
        }
        Ok(())
    }

    /// The host's tables against the model.
    fn compare(&mut self, host: &Host<SimStore>) -> Result<(), String> {
        let pending = host.pending_requests();
        if pending != self.flights.len() {
            return Err(format!(
                "the host has {pending} requests pending, the model {} ({:?})",
                self.flights.len(),
                self.flights.keys().collect::<Vec<_>>()
            ));
        }
        let mut held: Vec<u64> = host.pending_deadlines().iter().map(|d| d.0).collect();
        held.sort_unstable();
        let mut model: Vec<u64> = self.flights.values().map(|f| f.deadline_ms).collect();
        model.sort_unstable();
        if held != model {
            return Err(format!(
                "pending deadlines: host {held:?}, model {model:?} (now {} ms)",
                self.now_ms
            ));
        }
        let services = host.service_count();
        if services != self.services.len() {
            return Err(format!(
                "the host holds {services} services, the model {}",
                self.services.len()
            ));
        }
        let stats = host.stats();
        let relayed = stats.requests_relayed - self.stats.requests_relayed;
        if relayed > 1 {
            return Err(format!("one call into the host relayed {relayed} requests"));
        }
        self.stats = stats.clone();
        Ok(())
    }

    /// Requests in flight host-side, as the model sees them.
    pub fn pending(&self) -> usize {
        self.flights.len()
    }
}

/// `audience` from register or update params: absent or null is none.
fn audience(v: Option<&Value>) -> Option<BTreeSet<String>> {
    v.and_then(Value::as_array).map(|a| {
        a.iter()
            .filter_map(|p| p.as_str().map(str::to_owned))
            .collect()
    })
}

fn refusal_name(code: i64) -> &'static str {
    match code {
        UNKNOWN_SERVICE => "calls refused: unknown or invisible (-32008)",
        NOT_READY => "calls refused: before the handshake (-32009)",
        LIMIT => "calls refused: limit (-32043)",
        DUPLICATE_ID => "calls refused: duplicate pending id (-32600)",
        MALFORMED => "calls refused: malformed (-32602)",
        _ => "calls refused: other",
    }
}
