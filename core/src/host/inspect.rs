//! Read-only views of the host for drivers, tests and the simulator's checker. None of them
//! changes anything; none is on a hot path.

use serde_json::Value;

use std::collections::BTreeMap;

use crate::ahp::clients::ClientRecord;
use crate::host::Host;
use crate::kernel::time::Instant;
use crate::kernel::Stats;
use crate::limits::Limits;
use crate::log::store::Store;
use crate::net::connection::ConnId;
use crate::principal::Principal;

/// What [`Host::axp_inspect`] returns: the AXP state as JSON, shaped as the wire shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct AxpInspect {
    /// Each session's exchange state (`axp-session:/ID`), by session id.
    pub exchanges: BTreeMap<String, Value>,
    /// The state of `axp-executors://` (`{resource, entries}`).
    pub executors: Value,
    /// Bytes and index entries the stored blobs charge against `blob_storage_bytes_max`.
    pub blob_storage_bytes: u64,
    /// The state of `axp-memory://` (`{resource, entries}`).
    pub memory: Value,
}

impl<S: Store> Host<S> {
    /// Open connections, including ones the host is closing.
    pub fn connection_count(&self) -> usize {
        self.k.conns().len()
    }

    /// Sessions the host holds, open and closed.
    pub fn session_count(&self) -> usize {
        self.sessions.len()
    }

    /// What the turns of all chats cost against `chat_bytes_total_max`.
    pub fn chat_bytes_total(&self) -> u64 {
        self.sessions.chat_bytes_total()
    }

    /// Recounts what every chat's turns cost and compares it with the running counts the
    /// chat limits are enforced on; the simulator calls it after every call into the host.
    pub fn audit_chat_bytes(&self) -> Result<(), String> {
        self.sessions.audit_chat_bytes(self.k.limits())
    }

    /// The last `serverSeq` handed out (changes in flight included).
    pub fn server_seq(&self) -> u64 {
        self.k.server_seq()
    }

    /// The newest change handed out as `Output::Commit` (0 before any).
    pub fn changes_issued(&self) -> u64 {
        self.k.issued()
    }

    /// The newest change reported durable.
    pub fn changes_durable(&self) -> u64 {
        self.k.durable()
    }

    /// Changes handed out and not yet reported durable or failed.
    pub fn changes_in_flight(&self) -> usize {
        self.k.in_flight()
    }

    /// Messages held until the write path has room (backpressure), and their bytes.
    pub fn held_messages(&self) -> (usize, u64) {
        (self.k.held_messages(), self.k.held_message_bytes())
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        self.k.stats()
    }

    /// The limits in force.
    pub fn limits(&self) -> &Limits {
        self.k.limits()
    }

    /// The current state of a channel (the newest, changes in flight included), as a
    /// snapshot would carry it. The catalog has no single state: see
    /// [`Host::channel_state_for`].
    pub fn channel_state(&self, uri: &str) -> Option<Value> {
        match crate::channel::ChannelRef::parse(uri) {
            crate::channel::ChannelRef::Executors => Some(self.axp.registry_json()),
            crate::channel::ChannelRef::Memory => Some(self.axp.memory.json()),
            _ => self.sessions.channel_state(uri),
        }
    }

    /// The state of a channel as `viewer` sees it.
    pub fn channel_state_for(&self, viewer: &Principal, uri: &str) -> Option<Value> {
        self.state_for(viewer, uri)
    }

    /// Every clientId binding, in clientId order (changes in flight included).
    pub fn client_bindings(&self) -> impl Iterator<Item = &ClientRecord> + '_ {
        self.clients.records()
    }

    /// How many clientIds that never dispatched `owner` keeps bound.
    pub fn idle_client_ids(&self, owner: &str) -> usize {
        self.clients.idle_count(owner)
    }

    /// Registered client services.
    pub fn service_count(&self) -> usize {
        self.services.service_count()
    }

    /// Requests waiting for an outcome.
    pub fn pending_requests(&self) -> usize {
        self.services.relay.len()
    }

    /// The deadline of every pending request, for liveness checks.
    pub fn pending_deadlines(&self) -> Vec<Instant> {
        self.services.pending_deadlines()
    }

    /// Whether the host accepted `conn`'s handshake (its answer may still be held).
    pub fn connection_ready(&self, conn: ConnId) -> bool {
        self.k.is_ready(conn)
    }

    /// Whether the host decided to close `conn` (its close may wait behind held frames): its
    /// messages are ignored from then on.
    pub fn connection_closing(&self, conn: ConnId) -> bool {
        self.k.conn(conn).is_some_and(|c| c.closing)
    }

    /// The channels `conn` is subscribed to.
    pub fn subscriptions(&self, conn: ConnId) -> Vec<String> {
        self.k
            .conn(conn)
            .map(|c| c.subscriptions.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Bytes handed to the driver for `conn` and not yet reported flushed.
    pub fn queued_bytes(&self, conn: ConnId) -> Option<u64> {
        self.k.conn(conn).map(|c| c.queued_bytes)
    }

    /// Bytes held for `conn` until their changes are durable (the queue limits count them
    /// with the queued ones).
    pub fn held_bytes(&self, conn: ConnId) -> Option<u64> {
        self.k.conn(conn).map(|c| c.held_bytes)
    }

    /// Frames held for `conn` until their changes are durable.
    pub fn held_frames(&self, conn: ConnId) -> usize {
        self.k.conns().held_count(conn)
    }

    /// The AXP state the host holds (changes in flight included), for oracles: every
    /// session's exchange state (`axp-session:/ID`) by session id, the executor registry
    /// (`axp-executors://`) and what stored blobs take against `blob_storage_bytes_max`.
    pub fn axp_inspect(&self) -> AxpInspect {
        AxpInspect {
            exchanges: self
                .sessions
                .values()
                .map(|e| {
                    let state = serde_json::to_value(&e.exchange).unwrap_or(Value::Null);
                    (e.id.clone(), state)
                })
                .collect(),
            executors: self.axp.registry_json(),
            blob_storage_bytes: self.axp.blobs.used(),
            memory: self.axp.memory.json(),
        }
    }

    /// The store, for inspection.
    pub fn store(&self) -> &S {
        self.k.store()
    }

    /// The store, for drivers that commit on the core's own store (tests, the simulator).
    pub fn store_mut(&mut self) -> &mut S {
        self.k.store_mut()
    }

    /// Stops the host and hands back its store (a restart builds a new host over it).
    pub fn into_store(self) -> S {
        self.k.into_store()
    }
}
