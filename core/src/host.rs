//! The host: one input at a time in, decisions out. Routes inputs to the protocol handlers and
//! owns every table. See the crate docs for the run loop.

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::binding::ClientBindings;
use crate::channel::{self, ChannelRef, ROOT};
use crate::connection::{
    ConnId, Connection, Connections, Enqueued, Fail, FrameClass, Order, Phase,
};
use crate::error::{RpcError, INVALID_REQUEST, LIMIT, METHOD_NOT_FOUND, PERMISSION_DENIED};
use crate::limits::{Limits, LimitsError, REQUEST_ID_BYTES_MAX};
use crate::output::{CloseCode, Frame, FramePool, Outbox, Output};
use crate::principal::Principal;
use crate::receipts::RecentReceipts;
use crate::relay::Relay;
use crate::sequencer::Sequencer;
use crate::services::Services;
use crate::session::{self, SessionEntry, Which};
use crate::store::{ClientRecord, Store, StoreError, Table};
use crate::time::{Instant, Now, Timer, Timers};
use crate::wire::{self, Message};
use crate::write::WritePath;

/// Static configuration of a host.
#[derive(Clone, Debug)]
pub struct HostConfig {
    /// Every bound the host enforces.
    pub limits: Limits,
    /// `serverInfo.name` in `initialize`.
    pub server_name: String,
    /// `serverInfo.version` in `initialize`.
    pub server_version: String,
    /// Groups of principal ids whose client services may see and call each other.
    pub trust_groups: Vec<Vec<String>>,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            limits: Limits::default(),
            server_name: "axhost".into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            trust_groups: Vec::new(),
        }
    }
}

/// Why a host could not start.
#[derive(Debug)]
pub enum HostError {
    /// The limits contradict each other.
    Limits(LimitsError),
    /// The store could not be read.
    Store(StoreError),
    /// The store holds a record the host cannot read; named by key, never by content.
    CorruptRecord(String),
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostError::Limits(e) => write!(f, "{e}"),
            HostError::Store(e) => write!(f, "{e}"),
            HostError::CorruptRecord(key) => write!(f, "store record {key:?} is unreadable"),
        }
    }
}

impl std::error::Error for HostError {}

/// One thing that happened outside the core.
#[derive(Debug)]
pub enum Input<'a> {
    /// A transport is up and authenticated. `conn` is fresh and never reused.
    Connected {
        /// The new connection.
        conn: ConnId,
        /// Who it is, from its transport credential.
        principal: Arc<Principal>,
    },
    /// One complete WebSocket text message.
    Message {
        /// The connection it came from.
        conn: ConnId,
        /// Its text. WebSocket text messages are UTF-8 (RFC 6455 §5.6) and the driver's
        /// WebSocket layer has already checked that (closing 1007 otherwise), so the core reads
        /// `&str` and never validates UTF-8 a second time.
        text: &'a str,
    },
    /// The driver wrote `bytes` of this connection's queued frames to its socket.
    Flushed {
        /// The connection.
        conn: ConnId,
        /// Bytes written.
        bytes: u64,
    },
    /// The transport is gone. Inputs for `conn` after this are ignored.
    Closed {
        /// The connection.
        conn: ConnId,
    },
    /// Every change numbered up to `through` (from `Output::Commit`) is durable.
    Durable {
        /// The last change number in the durable transaction.
        through: u64,
    },
    /// The transaction starting with change `number` failed: nothing of it was written.
    /// Every later change the core issued fails with it (the writer drops them).
    CommitFailed {
        /// The first change number in the failed transaction.
        number: u64,
    },
}

/// Counters for metrics and tests. They only ever grow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages received.
    pub messages_in: u64,
    /// Frames handed to the driver.
    pub frames_out: u64,
    /// Error responses sent.
    pub errors_out: u64,
    /// Changes reported durable.
    pub commits: u64,
    /// Changes that failed (refused by the store, or issued after one that was); each was
    /// rolled back.
    pub commit_failures: u64,
    /// Connections closed for being over the outbound queue limit.
    pub slow_consumer_closes: u64,
    /// Notifications dropped because they were malformed, unknown, unauthorized or over a
    /// limit. Never reported to the sender.
    pub notifications_dropped: u64,
    /// Client-service notifications forwarded to a service owner.
    pub notifications_forwarded: u64,
    /// Client-service requests forwarded to a service owner.
    pub requests_relayed: u64,
    /// Relayed requests that reached their one outcome.
    pub requests_completed: u64,
    /// Relayed requests that timed out.
    pub requests_timed_out: u64,
    /// Relayed requests cancelled by their caller.
    pub requests_cancelled: u64,
    /// Responses that matched no request sent to that connection (late, duplicate, foreign).
    pub responses_dropped: u64,
    /// Idle clientId bindings released to keep a principal within
    /// `Limits::idle_client_ids_per_principal`.
    pub client_ids_released: u64,
}

/// Supported AHP protocol range: `>=0.9.0 <0.10.0`.
pub(crate) const SUPPORTED_PROTOCOL_VERSIONS: &[&str] = &["0.9.0"];

/// The baseline methods this host serves, advertised nowhere but kept in one place.
pub(crate) const AXP_METHODS: &[&str] = &[];

/// The sans-IO host. Generic over its durable store.
pub struct Host<S: Store> {
    pub(crate) config: HostConfig,
    pub(crate) store: S,
    pub(crate) rng: ChaCha8Rng,
    pub(crate) conns: Connections,
    pub(crate) outbox: Outbox,
    pub(crate) timers: Timers,
    pub(crate) seq: Sequencer,
    pub(crate) sessions: BTreeMap<String, SessionEntry>,
    pub(crate) bindings: ClientBindings,
    /// Receipts committed lately or in flight, so a retry is known without a store read.
    pub(crate) receipts: RecentReceipts,
    /// Change numbers, the durable mark and the changes in flight.
    pub(crate) write: WritePath,
    pub(crate) root_state: Value,
    pub(crate) services: Services,
    pub(crate) relay: Relay,
    pub(crate) frame_pool: FramePool,
    /// The sum of every session's `chat_bytes`, held against `chat_bytes_total_max`.
    pub(crate) chat_bytes_total: u64,
    /// Latest `now` seen; `wall_unix_ms` is a high-water mark so timestamps never go back.
    pub(crate) now: Now,
    pub(crate) stats: Stats,
}

impl<S: Store> Host<S> {
    /// Builds a host over `store`, resuming whatever it holds. `seed` determines every id the
    /// host generates: same config, store contents, seed and inputs give the same outputs.
    pub fn new(config: HostConfig, mut store: S, seed: u64) -> Result<Host<S>, HostError> {
        config.limits.validate().map_err(HostError::Limits)?;
        let loaded = store
            .load(config.limits.replay_events_max)
            .map_err(HostError::Store)?;
        let mut records: BTreeMap<String, String> = BTreeMap::new();
        let mut clients = Vec::new();
        for r in loaded.records {
            match r.table {
                Table::State => {
                    records.insert(r.key, r.value);
                }
                Table::Client => {
                    let record = ClientRecord::parse(&r.value)
                        .filter(|c| c.client_id == r.key)
                        .ok_or_else(|| HostError::CorruptRecord(format!("client:{}", r.key)))?;
                    clients.push(record);
                }
            }
        }
        let mut sessions = BTreeMap::new();
        for key in records.keys() {
            if let Some(id) = SessionEntry::id_of_meta_key(key) {
                let entry = SessionEntry::restore_from(id, &records, &mut store)?;
                sessions.insert(id.to_owned(), entry);
            }
        }
        let wall_high_water = sessions
            .values()
            .map(SessionEntry::latest_timestamp_ms)
            .max()
            .unwrap_or(0);
        let services = Services::new(&config.trust_groups);
        let bindings = ClientBindings::load(clients);
        // A store over lowered chat limits loads whole; only new turns are refused.
        let chat_bytes_total = sessions.values().map(|e| e.chat_bytes).sum();
        Ok(Host {
            seq: Sequencer::new(
                loaded.server_seq,
                loaded.events_tail,
                config.limits.replay_events_max,
            ),
            config,
            store,
            rng: ChaCha8Rng::seed_from_u64(seed),
            conns: Connections::default(),
            outbox: Outbox::default(),
            timers: Timers::default(),
            sessions,
            bindings,
            receipts: RecentReceipts::default(),
            write: WritePath::default(),
            root_state: session::root_state(),
            services,
            relay: Relay::default(),
            frame_pool: FramePool::default(),
            chat_bytes_total,
            // Timestamps already handed out and stored; new ones never go below them.
            now: Now {
                mono: Instant(0),
                wall_unix_ms: wall_high_water,
            },
            stats: Stats::default(),
        })
    }

    /// (B) Feeds one input seen at `now`. Never blocks; never panics on peer bytes.
    pub fn handle(&mut self, now: Now, input: Input<'_>) {
        self.advance(now);
        match input {
            Input::Connected { conn, principal } => self.on_connected(conn, principal),
            Input::Message { conn, text } => self.on_message(conn, text),
            Input::Flushed { conn, bytes } => self.conns.flushed(conn, bytes),
            Input::Closed { conn } => {
                self.timers.disarm(Timer::Handshake(conn));
                if let Some(Connection {
                    phase: Phase::Ready { client_id },
                    ..
                }) = self.conns.remove(conn)
                {
                    self.bindings.detach(&client_id);
                }
                self.forget(conn);
            }
            Input::Durable { through } => self.on_durable(through),
            Input::CommitFailed { number } => self.on_commit_failed(number),
        }
        self.reap();
    }

    /// Releases what a connection that is closing or closed still holds: its relayed requests
    /// and its services. Runs as soon as the host decides to close it, so nothing routes to it.
    fn reap(&mut self) {
        // Forgetting one connection can close others (a removal announced to an observer over
        // its limit), so repeat until a pass closes nothing new. Each pass closes connections
        // that were open before it, so this ends.
        loop {
            let closing = self.conns.take_newly_closing();
            if closing.is_empty() {
                break;
            }
            for conn in closing {
                self.forget(conn);
            }
        }
    }

    pub(crate) fn forget_conn(&mut self, conn: ConnId) {
        self.forget(conn);
    }

    fn forget(&mut self, conn: ConnId) {
        self.release_caller(conn);
        self.remove_services_of(conn);
    }

    /// (B) Fires every timer due at or before `now.mono`. Early or repeated calls do nothing.
    pub fn handle_timeout(&mut self, now: Now) {
        self.advance(now);
        while let Some(timer) = self.timers.pop_due(self.now.mono) {
            match timer {
                Timer::Relay(id) => self.relay_timeout(id),
                Timer::Handshake(conn) => {
                    let waiting = self
                        .conns
                        .get(conn)
                        .is_some_and(|c| c.phase == Phase::Handshake);
                    if waiting {
                        self.conns.close(
                            &mut self.outbox,
                            conn,
                            CloseCode::Policy,
                            "Initialize required",
                        );
                    }
                }
            }
        }
        self.reap();
    }

    /// (C) Gives back a frame from `Output::Send` once its bytes were copied out, so its buffer
    /// is reused for the next forwarded notification. Optional: a frame simply dropped is
    /// freed.
    pub fn recycle(&mut self, frame: Frame) {
        self.frame_pool.give_back(frame);
    }

    /// (D) The next decision, in the order the host made them. Drain to `None` before sleeping.
    pub fn poll_output(&mut self) -> Option<Output> {
        let out = self.outbox.pop();
        if matches!(out, Some(Output::Send { .. })) {
            self.stats.frames_out += 1;
        }
        out
    }

    /// (D) The earliest deadline. Read it after `poll_output` returned `None`.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    /// (A) Open connections, including ones the host is closing.
    pub fn connection_count(&self) -> usize {
        self.conns.len()
    }

    /// (A) Sessions the host holds, open and closed.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// (A) What the turns of all chats cost against `chat_bytes_total_max`.
    pub fn chat_bytes_total(&self) -> u64 {
        self.chat_bytes_total
    }

    /// (A) Recounts what every chat's turns cost and compares it with the running counts the
    /// chat limits are enforced on; the simulator calls it after every call into the host.
    /// Returns the first mismatch, or a charge over its limit (the limits only ever refuse, so
    /// under the limits the store was written with, none can be).
    pub fn audit_chat_bytes(&self) -> Result<(), String> {
        // `session` names the chat checked; `None` is all of them.
        let check = |session: Option<&str>, counted: u64, charged: u64, limit: (&str, u64)| {
            let what = || session.map_or("all chats".to_owned(), |id| format!("session {id}"));
            if counted != charged {
                return Err(format!(
                    "{}: the turns cost {counted} bytes but {charged} are charged",
                    what()
                ));
            }
            if counted > limit.1 {
                return Err(format!(
                    "{}: the turns cost {counted} bytes, over {} {}",
                    what(),
                    limit.0,
                    limit.1
                ));
            }
            Ok(())
        };
        let limits = &self.config.limits;
        let mut total = 0;
        for (id, entry) in &self.sessions {
            let counted = session::chat_cost(&entry.chat);
            check(
                Some(id),
                counted,
                entry.chat_bytes,
                ("chat_bytes_max", limits.chat_bytes_max),
            )?;
            total += counted;
        }
        check(
            None,
            total,
            self.chat_bytes_total,
            ("chat_bytes_total_max", limits.chat_bytes_total_max),
        )
    }

    /// (A) The last assigned `serverSeq`.
    pub fn server_seq(&self) -> u64 {
        self.seq.current()
    }

    /// (A) Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// (A) The limits in force.
    pub fn limits(&self) -> &Limits {
        &self.config.limits
    }

    /// (A) The current state of a channel, as a snapshot would carry it.
    pub fn channel_state(&self, uri: &str) -> Option<Value> {
        match ChannelRef::parse(uri) {
            ChannelRef::Root => Some(self.root_state.clone()),
            ChannelRef::Session(id) => self.sessions.get(id).map(|e| e.state_json(Which::Session)),
            ChannelRef::Chat(id) => self.sessions.get(id).map(|e| e.state_json(Which::Chat)),
            ChannelRef::Changeset(id) => self
                .sessions
                .get(id)
                .map(|e| e.state_json(Which::Changeset)),
            ChannelRef::Catalog | ChannelRef::Unknown => None,
        }
    }

    /// (A) The state of a channel as `viewer` sees it (the catalog differs per observer).
    pub fn channel_state_for(&self, viewer: &Principal, uri: &str) -> Option<Value> {
        match ChannelRef::parse(uri) {
            ChannelRef::Catalog => Some(self.services.catalog_for(viewer)),
            _ => self.channel_state(uri),
        }
    }

    /// (A) Every clientId binding, in clientId order: what the store holds, once every commit
    /// succeeded.
    pub fn client_bindings(&self) -> impl Iterator<Item = &ClientRecord> + '_ {
        self.bindings.records()
    }

    /// (A) How many clientIds that never dispatched `owner` keeps bound.
    pub fn idle_client_ids(&self, owner: &str) -> usize {
        self.bindings.idle_count(owner)
    }

    /// (A) Registered client services.
    pub fn service_count(&self) -> usize {
        self.services.by_id.len()
    }

    /// (A) The channels `conn` is subscribed to.
    pub fn subscriptions(&self, conn: ConnId) -> Vec<String> {
        self.conns
            .get(conn)
            .map(|c| c.subscriptions.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// (A) Bytes queued for `conn` and not yet reported flushed.
    pub fn queued_bytes(&self, conn: ConnId) -> Option<u64> {
        self.conns.get(conn).map(|c| c.queued_bytes)
    }

    /// (A) The store, for inspection.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// (B) The store, for a driver that commits `Output::Commit` changes on the host's own
    /// store (`axhost_core::drive`, or a driver committing on its loop thread). The core
    /// itself only reads it.
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// (A) The newest change number issued, and the newest reported durable.
    pub fn commit_numbers(&self) -> (u64, u64) {
        (self.write.issued(), self.write.durable())
    }

    /// (A) Changes issued and not yet reported durable or failed.
    pub fn commits_in_flight(&self) -> usize {
        self.write.in_flight()
    }

    /// Stops the host and hands back its store (a restart builds a new host over it).
    pub fn into_store(self) -> S {
        self.store
    }

    fn advance(&mut self, now: Now) {
        debug_assert!(now.mono >= self.now.mono, "monotonic time went backwards");
        self.now.mono = self.now.mono.max(now.mono);
        self.now.wall_unix_ms = self.now.wall_unix_ms.max(now.wall_unix_ms);
    }

    fn on_connected(&mut self, conn: ConnId, principal: Arc<Principal>) {
        let full = self.conns.len() >= self.config.limits.connections_max as usize;
        self.conns.insert(conn, principal);
        if full {
            self.conns.close(
                &mut self.outbox,
                conn,
                CloseCode::TryAgainLater,
                "Too many connections",
            );
            return;
        }
        let deadline = self
            .now
            .mono
            .plus_ms(self.config.limits.handshake_timeout_ms);
        self.timers.arm(Timer::Handshake(conn), deadline);
    }

    /// A message from `conn`; ignored unless it is open and not closing.
    fn on_message(&mut self, conn: ConnId, text: &str) {
        let first = match self.conns.live_mut(conn) {
            Some(c) => !std::mem::replace(&mut c.seen_message, true),
            None => return,
        };
        self.stats.messages_in += 1;
        let limits = &self.config.limits;
        let too_big = |method: Option<&str>| text.len() > limits.message_bytes_max_for(method);
        if let Some(notify) = wire::parse_compact_notify(text) {
            // The hot path. `forward_notify` drops a notify from a connection still in its
            // handshake (it needs the sender's client id), so no separate readiness lookup.
            if too_big(Some("clientService/notify")) {
                self.stats.notifications_dropped += 1;
                return;
            }
            return self.forward_notify(conn, Some(notify));
        }
        match wire::parse_text(text) {
            Err(malformed) => self.reply_error(conn, "null", &malformed.to_error()),
            Ok(Message::Request { id, method, params }) => {
                if too_big(Some(&method)) {
                    let e = RpcError::new(
                        LIMIT,
                        "Message too large. Upload it as a blob and send a reference instead.",
                    );
                    return self.reply_error(conn, id.get(), &e);
                }
                self.on_request(conn, first, id.get(), &method, params);
            }
            Ok(Message::Notification { method, params }) => {
                if too_big(Some(&method)) {
                    self.stats.notifications_dropped += 1;
                    return;
                }
                self.on_notification(conn, &method, params);
            }
            Ok(Message::Response { id, outcome }) => {
                // An oversized answer still ends its request, at once, with a limit error.
                let outcome = if too_big(None) { None } else { Some(outcome) };
                self.on_response(conn, id, outcome);
            }
        }
    }

    fn on_request(
        &mut self,
        conn: ConnId,
        first: bool,
        id: &str,
        method: &str,
        params: Option<&RawValue>,
    ) {
        let ready = self
            .conns
            .get(conn)
            .is_some_and(|c| matches!(c.phase, Phase::Ready { .. }));
        // How a reply that depended on a failed change is answered instead.
        let on_fail = match method {
            "initialize" | "reconnect" => Fail::Unready(id),
            // Its outcome is answered by a rejection echo: the reply itself stays true.
            "dispatchAction" => Fail::Send,
            _ => Fail::Answer(id),
        };
        // Client-service answers depend on no unflushed state (the registry is memory only; a
        // relayed request is answered by its service; a refusal reveals nothing durable), so
        // they pass at once, like `ping`. The catalog events a registration makes stay ordered.
        let unordered = matches!(
            method,
            "client/registerService"
                | "client/updateService"
                | "client/unregisterService"
                | "clientService/request"
        );
        let outcome = match method {
            "ping" => {
                // Depends on nothing: passes frames held for the connection.
                let frame = wire::result_frame(id, "null");
                return self.send_unordered(conn, frame, FrameClass::Reply);
            }
            "initialize" => self.initialize(conn, params),
            "reconnect" => self.reconnect(conn, first, params),
            "clientService/request" if id.len() > REQUEST_ID_BYTES_MAX => {
                // A relayed request's id is kept until the request ends, so its length is
                // bounded. An id too long to keep is not echoed either: JSON-RPC answers a
                // request whose id cannot be taken with `id: null`, as for ids it cannot read.
                let e = RpcError::new(
                    INVALID_REQUEST,
                    format!(
                        "Invalid JSON-RPC request: a clientService/request id may be at most \
                         {REQUEST_ID_BYTES_MAX} bytes"
                    ),
                );
                return self.reply_error(conn, "null", &e);
            }
            _ if !ready => Err(RpcError::new(
                PERMISSION_DENIED,
                "Initialize before using sessions",
            )),
            "subscribe" => match self.subscribe(conn, params) {
                Ok((result, channel)) => {
                    let frame = wire::result_frame(id, &result);
                    let order = self.write.order(Fail::Unsubscribe(id, &channel));
                    return self.enqueue(conn, frame, FrameClass::Reply, order);
                }
                Err(e) => Err(e),
            },
            "unsubscribe" => self.unsubscribe(conn, params).map(|()| "null".to_owned()),
            "createSession" => self.create_session(conn, params),
            "listSessions" => self.list_sessions(conn, params),
            "dispatchAction" => {
                self.dispatch_action(conn, params);
                Ok("null".to_owned())
            }
            "resourceRead" => self.resource_read(conn, params),
            "client/registerService" => self.register_service(conn, params),
            "client/updateService" => self.update_service(conn, params),
            "client/unregisterService" => self.unregister_service(conn, params),
            "clientService/request" => match self.request_service(conn, id, params) {
                // The answer comes later, from the service or the relay.
                Ok(()) => return,
                Err(e) => Err(e),
            },
            _ => Err(RpcError::new(METHOD_NOT_FOUND, "Unknown method")),
        };
        match outcome {
            Ok(result) if unordered => {
                self.send_unordered(conn, wire::result_frame(id, &result), FrameClass::Reply)
            }
            Ok(result) => self.reply_with(conn, wire::result_frame(id, &result), on_fail),
            Err(e) => {
                self.stats.errors_out += 1;
                let frame = wire::error_frame(id, &e);
                let unsupported = e.code == crate::error::UNSUPPORTED_PROTOCOL_VERSION;
                if unordered {
                    self.send_unordered(conn, frame, FrameClass::Reply);
                } else if unsupported {
                    // Version negotiation reads no state: the `-32005` stays true whatever
                    // fails, and the close below waits behind it.
                    self.reply_with(conn, frame, Fail::Send);
                } else {
                    self.reply_with(conn, frame, on_fail);
                }
                if unsupported {
                    self.conns.close(
                        &mut self.outbox,
                        conn,
                        CloseCode::Policy,
                        "Unsupported protocol version",
                    );
                }
            }
        }
    }

    fn is_ready(&self, conn: ConnId) -> bool {
        self.conns
            .get(conn)
            .is_some_and(|c| matches!(c.phase, Phase::Ready { .. }))
    }

    fn on_notification(&mut self, conn: ConnId, method: &str, params: Option<&RawValue>) {
        if !self.is_ready(conn) {
            self.stats.notifications_dropped += 1;
            return;
        }
        match method {
            "clientService/notify" => self.notify_service(conn, params),
            "$/cancelRequest" => self.cancel_request(conn, params),
            "dispatchAction" => self.dispatch_action(conn, params),
            "unsubscribe" => {
                if self.unsubscribe(conn, params).is_err() {
                    self.stats.notifications_dropped += 1;
                }
            }
            _ => self.stats.notifications_dropped += 1,
        }
    }

    /// Queues the answer to something `conn` asked for. A reply is refused (and the connection
    /// closed) only when the connection is already over its limit: one large snapshot or replay
    /// to a reader that keeps up must not cost it its connection on every attempt.
    ///
    /// It reveals the state as it is now, so it waits for every change issued so far to be
    /// durable; if one fails the reply is sent anyway (it does not depend on that change's
    /// outcome). Replies that do go through [`Host::reply_with`].
    pub(crate) fn reply(&mut self, conn: ConnId, frame: Frame) {
        self.reply_with(conn, frame, Fail::Send);
    }

    /// A reply with its answer for the case that a change it depends on fails.
    pub(crate) fn reply_with(&mut self, conn: ConnId, frame: Frame, on_fail: Fail<'_>) {
        let order = self.write.order(on_fail);
        self.enqueue(conn, frame, FrameClass::Reply, order);
    }

    /// Queues a state event or root notification `conn` did not ask for: refused when it
    /// would take the connection over its limit. Dropped if a change it depends on fails.
    pub(crate) fn push_state(&mut self, conn: ConnId, frame: Frame) {
        let order = self.write.order(Fail::Drop);
        self.enqueue(conn, frame, FrameClass::State, order);
    }

    /// Queues a frame that depends on no unflushed state (a ping reply, a relayed answer).
    pub(crate) fn send_unordered(&mut self, conn: ConnId, frame: Frame, class: FrameClass) {
        self.enqueue(conn, frame, class, Order::Unordered);
    }

    pub(crate) fn enqueue(
        &mut self,
        conn: ConnId,
        frame: Frame,
        class: FrameClass,
        order: Order<'_>,
    ) {
        let limits = &self.config.limits;
        if self
            .conns
            .enqueue(&mut self.outbox, conn, frame, class, limits, order)
            == Enqueued::Closing
        {
            self.stats.slow_consumer_closes += 1;
        }
    }

    /// An error reply that reveals nothing (the request could not be read): it depends on no
    /// unflushed state, so it passes held frames, like `ping`.
    pub(crate) fn reply_error(&mut self, conn: ConnId, id: &str, error: &RpcError) {
        self.stats.errors_out += 1;
        self.send_unordered(conn, wire::error_frame(id, error), FrameClass::Reply);
    }

    /// Sends one frame to every subscriber of `channel`, in ConnId order.
    pub(crate) fn broadcast(&mut self, channel: &str, frame: &Frame) {
        for conn in self.conns.subscribers(channel) {
            self.push_state(conn, frame.clone());
        }
    }

    /// Sends a root notification to root subscribers allowed to read session `id`.
    pub(crate) fn notify_root(&mut self, session_id: &str, frame: &Frame) {
        for conn in self.conns.subscribers(ROOT) {
            let allowed = self
                .conns
                .get(conn)
                .is_some_and(|c| c.principal.can_read_session(session_id));
            if allowed {
                self.push_state(conn, frame.clone());
            }
        }
    }

    /// A fresh random UUID (v4 layout) from the host's seeded generator.
    pub(crate) fn uuid(&mut self) -> String {
        let mut b = [0u8; 16];
        self.rng.fill_bytes(&mut b);
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    /// Checks that `principal` may read `uri` and that it exists.
    pub(crate) fn allowed(&self, principal: &Principal, uri: &str) -> Result<(), RpcError> {
        let r = ChannelRef::parse(uri);
        match r {
            ChannelRef::Root | ChannelRef::Catalog => Ok(()),
            ChannelRef::Unknown => Err(RpcError::not_found("Unknown channel")),
            _ => {
                let id = r.session_id().unwrap_or_default();
                if !principal.can_read_session(id) {
                    return Err(RpcError::forbidden("You don't have access to this channel"));
                }
                if !self.sessions.contains_key(id) {
                    return Err(RpcError::not_found("Unknown channel"));
                }
                Ok(())
            }
        }
    }

    /// `{resource, state, fromSeq}` for a channel that exists, as `viewer` sees it.
    pub(crate) fn snapshot(&self, viewer: &Principal, uri: &str) -> Option<Value> {
        let state = self.channel_state_for(viewer, uri)?;
        Some(json!({ "resource": uri, "state": state, "fromSeq": self.seq.current() }))
    }

    /// Returns the reply and the channel subscribed.
    fn subscribe(
        &mut self,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<(String, String), RpcError> {
        let p: ChannelParams = parse_params(params)?;
        let principal = self.principal(conn)?;
        self.allowed(&principal, &p.channel)?;
        let (count, already) = self
            .conns
            .get(conn)
            .map(|c| (c.subscriptions.len(), c.subscriptions.contains(&p.channel)))
            .unwrap_or_default();
        if !already && count >= self.config.limits.subscriptions_per_conn_max as usize {
            return Err(RpcError::limit("Subscription limit reached"));
        }
        // Snapshot and registration happen in one step: nothing can be sequenced between them.
        let snapshot = self
            .snapshot(&principal, &p.channel)
            .ok_or_else(|| RpcError::not_found("Unknown channel"))?;
        self.conns.subscribe(conn, &p.channel);
        Ok((json!({ "snapshot": snapshot }).to_string(), p.channel))
    }

    fn unsubscribe(&mut self, conn: ConnId, params: Option<&RawValue>) -> Result<(), RpcError> {
        let p: ChannelParams = parse_params(params)?;
        self.conns.unsubscribe(conn, &p.channel);
        Ok(())
    }

    fn resource_read(
        &mut self,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        #[derive(Deserialize)]
        struct P {
            uri: String,
        }
        let p: P = parse_params(params)?;
        let principal = self.principal(conn)?;
        let Some(rest) = p.uri.strip_prefix("axp-blob:/") else {
            return Err(RpcError::forbidden("Only AXP blob resources are readable"));
        };
        // `axp-blob:/<encoded exchange channel>/<sha256>`: the owning session decides access.
        let channel = rest
            .rsplit_once('/')
            .map(|(c, _)| percent_decode(c))
            .unwrap_or_default();
        let session = channel.strip_prefix("axp-session:/").unwrap_or_default();
        if !channel::valid_session_id(session) {
            return Err(RpcError::not_found("Blob not found"));
        }
        if !principal.can_read_session(session) {
            return Err(RpcError::forbidden("You don't have access to this channel"));
        }
        Err(RpcError::not_found("Blob not found in this session"))
    }

    pub(crate) fn principal(&self, conn: ConnId) -> Result<Arc<Principal>, RpcError> {
        self.conns
            .get(conn)
            .map(|c| c.principal.clone())
            .ok_or_else(|| RpcError::new(crate::error::INTERNAL_ERROR, "Connection is gone"))
    }

    pub(crate) fn client_id(&self, conn: ConnId) -> Option<String> {
        match &self.conns.get(conn)?.phase {
            Phase::Ready { client_id } => Some(client_id.clone()),
            Phase::Handshake => None,
        }
    }
}

/// Params of every method that names only a channel.
#[derive(Deserialize)]
pub(crate) struct ChannelParams {
    pub(crate) channel: String,
}

/// Decodes params into `T`, or a `-32602` naming what is wrong.
pub(crate) fn parse_params<'a, T: Deserialize<'a>>(
    params: Option<&'a RawValue>,
) -> Result<T, RpcError> {
    let text = params.map_or("null", RawValue::get);
    serde_json::from_str(text)
        .map_err(|e| RpcError::invalid_params(format!("Invalid parameters: {e}")))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = hex {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{HostConfig, MemStore};

    /// A host holding one session whose chat started one turn.
    fn with_a_turn() -> Host<MemStore> {
        let mut host = Host::new(HostConfig::default(), MemStore::new(), 1).expect("host");
        let mut entry = SessionEntry::create("s1", "t".into(), "task".into(), 0);
        let message: ahp_types::state::Message =
            serde_json::from_value(json!({"text": "hi", "origin": {"kind": "user"}}))
                .expect("message");
        entry.chat.active_turn = Some(ahp_types::state::ActiveTurn {
            id: "t1".into(),
            started_at: String::new(),
            message: message.clone(),
            response_parts: vec![],
            usage: None,
        });
        entry.turn_started("t1", &message);
        host.chat_bytes_total = entry.chat_bytes;
        host.sessions.insert("s1".into(), entry);
        host
    }

    #[test]
    fn the_chat_audit_finds_every_count_that_strays_and_every_limit_passed() {
        assert_eq!(with_a_turn().audit_chat_bytes(), Ok(()));
        let charged = with_a_turn().chat_bytes_total;

        let mut host = with_a_turn();
        if let Some(e) = host.sessions.get_mut("s1") {
            e.chat_bytes += 1;
        }
        let err = host
            .audit_chat_bytes()
            .expect_err("a session's count strayed");
        assert!(err.starts_with("session s1: "), "{err}");

        let mut host = with_a_turn();
        host.chat_bytes_total -= 1;
        let err = host
            .audit_chat_bytes()
            .expect_err("the host's count strayed");
        assert!(err.starts_with("all chats: "), "{err}");

        let mut host = with_a_turn();
        host.config.limits.chat_bytes_max = charged - 1;
        let err = host.audit_chat_bytes().expect_err("a chat over its limit");
        assert!(err.contains("over chat_bytes_max"), "{err}");

        let mut host = with_a_turn();
        host.config.limits.chat_bytes_total_max = charged - 1;
        let err = host
            .audit_chat_bytes()
            .expect_err("all chats over their limit");
        assert!(err.contains("over chat_bytes_total_max"), "{err}");
    }
}
