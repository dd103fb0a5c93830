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
//!
//! The model's state, its per-cause bookkeeping and rules 3 and 4 are here; rule 1 is in
//! `relay.rs`, rule 2 in `notify.rs`, the handshake and catalog in `registry.rs`, and reading
//! messages and frames off the wire in `wire.rs`.

use std::collections::{BTreeMap, BTreeSet};

use axhost_core::{ConnId, Host, HostConfig, Input, Limits, Output, Principal, Stats};
use serde_json::Value;

use crate::replica::CATALOG;
use crate::store::SimStore;

mod notify;
mod registry;
mod relay;
mod wire;

use wire::*;

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

impl Effects {
    /// Whether the call sent any answer, completion, cancel, close or other frame (forwards to
    /// an owner aside).
    fn answers_or_closes(&self) -> bool {
        self.direct.is_some()
            || !self.completions.is_empty()
            || !self.cancels.is_empty()
            || !self.closed.is_empty()
            || self.others > 0
    }
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

    fn peer(&self, conn: ConnId) -> Result<&Peer, String> {
        self.peers
            .get(&conn)
            .ok_or_else(|| format!("model: unknown connection {conn:?}"))
    }

    /// Whether a frame of about `bytes` to `conn` may have been dropped as overload: its queue
    /// (sent and held frames alike) is over the soft limit, or the frame would cross the hard
    /// one. Read after the call, when the queue holds at least what it held at the decision.
    fn overloaded(&self, host: &Host<SimStore>, conn: ConnId, bytes: usize) -> bool {
        let q = host.queued_bytes(conn).unwrap_or(0) + host.held_bytes(conn).unwrap_or(0);
        q > self.limits.queue_bytes_soft || q + bytes as u64 > self.limits.queue_bytes_hard
    }

    // ─── Notifications ──────────────────────────────────────────────────────────────────────

    // ─── After every call ───────────────────────────────────────────────────────────────────

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
