//! The connection table: who is connected, how far their handshake got, what they subscribe to,
//! and how many bytes wait in their outbound queue. Every frame leaves through `enqueue`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::hash::IdMap;

use crate::limits::Limits;
use crate::output::{CloseCode, Frame, Outbox, Output};
use crate::principal::Principal;

/// A connection's identity, chosen by the driver. Never reused within one host's lifetime.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConnId(pub u64);

/// How far a connection got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Phase {
    /// Connected; only `ping`, `initialize` and `reconnect` are accepted.
    Handshake,
    /// `initialize` or `reconnect` succeeded.
    Ready {
        /// The clientId bound to this connection's principal.
        client_id: String,
    },
}

pub(crate) struct Connection {
    pub(crate) principal: Arc<Principal>,
    pub(crate) phase: Phase,
    /// Channels this connection receives envelopes for.
    pub(crate) subscriptions: BTreeSet<String>,
    /// Bytes handed to the driver and not yet reported flushed.
    pub(crate) queued_bytes: u64,
    /// Whether any message arrived yet (`reconnect` must be the first).
    pub(crate) seen_message: bool,
    /// The host closed it; its inputs are ignored until the driver reports `Closed`.
    pub(crate) closing: bool,
}

/// Why a frame is sent, which decides how the hard queue limit applies to it.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum FrameClass {
    /// The answer to the connection's own request (or its rejection echo): refused only when
    /// the connection is already over the limit, so one reply larger than the limit still
    /// reaches a reader that keeps up.
    Reply,
    /// A state event or notification the connection did not ask for: refused when it would
    /// cross the limit.
    State,
    /// Client-service traffic: dropped (never closing anything) above the soft limit or where
    /// it would cross the hard one.
    Droppable,
}

/// What happened to a frame handed to `enqueue`.
#[must_use]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Enqueued {
    Queued,
    /// A droppable frame was not queued: the connection is over its soft limit.
    Dropped,
    /// The connection went over its hard limit and is now closing; the frame was not sent.
    Closing,
    /// The connection is unknown or already closing.
    Gone,
}

#[derive(Default)]
pub(crate) struct Connections {
    /// Looked up several times per message, never iterated (fan-out goes by `subscribers`).
    table: IdMap<ConnId, Connection>,
    /// Channel → subscribers, for fan-out. Invariant: mirrors every `Connection::subscriptions`.
    subscribers: BTreeMap<String, BTreeSet<ConnId>>,
    /// Closed since the host last looked; it releases what they hold.
    newly_closing: Vec<ConnId>,
}

impl Connections {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// The connection if it is open and not closing: the only state in which its messages
    /// count.
    pub(crate) fn live_mut(&mut self, conn: ConnId) -> Option<&mut Connection> {
        self.table.get_mut(&conn).filter(|c| !c.closing)
    }

    pub(crate) fn insert(&mut self, conn: ConnId, principal: Arc<Principal>) {
        let old = self.table.insert(
            conn,
            Connection {
                principal,
                phase: Phase::Handshake,
                subscriptions: BTreeSet::new(),
                queued_bytes: 0,
                seen_message: false,
                closing: false,
            },
        );
        assert!(old.is_none(), "driver reused {conn:?}");
    }

    pub(crate) fn get(&self, conn: ConnId) -> Option<&Connection> {
        self.table.get(&conn)
    }

    pub(crate) fn get_mut(&mut self, conn: ConnId) -> Option<&mut Connection> {
        self.table.get_mut(&conn)
    }

    /// Forgets `conn` entirely (after the driver reported it closed).
    pub(crate) fn remove(&mut self, conn: ConnId) -> Option<Connection> {
        let c = self.table.remove(&conn)?;
        for channel in &c.subscriptions {
            self.unindex(channel, conn);
        }
        Some(c)
    }

    pub(crate) fn subscribe(&mut self, conn: ConnId, channel: &str) {
        if let Some(c) = self.table.get_mut(&conn) {
            if c.subscriptions.insert(channel.to_owned()) {
                self.subscribers
                    .entry(channel.to_owned())
                    .or_default()
                    .insert(conn);
            }
        }
    }

    pub(crate) fn unsubscribe(&mut self, conn: ConnId, channel: &str) {
        if let Some(c) = self.table.get_mut(&conn) {
            if c.subscriptions.remove(channel) {
                self.unindex(channel, conn);
            }
        }
    }

    fn unindex(&mut self, channel: &str, conn: ConnId) {
        if let Some(set) = self.subscribers.get_mut(channel) {
            set.remove(&conn);
            if set.is_empty() {
                self.subscribers.remove(channel);
            }
        }
    }

    /// Connections closed since the last call.
    pub(crate) fn take_newly_closing(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.newly_closing)
    }

    /// Subscribers of `channel`, in ConnId order.
    pub(crate) fn subscribers(&self, channel: &str) -> Vec<ConnId> {
        self.subscribers
            .get(channel)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    /// The only way a frame leaves the host. Counts bytes and applies the queue limits by
    /// class: replies and state are never dropped (a connection over the hard limit is closed
    /// and recovers by `reconnect`); client-service traffic is dropped instead.
    pub(crate) fn enqueue(
        &mut self,
        outbox: &mut Outbox,
        conn: ConnId,
        frame: Frame,
        class: FrameClass,
        limits: &Limits,
    ) -> Enqueued {
        let Some(c) = self.table.get_mut(&conn).filter(|c| !c.closing) else {
            return Enqueued::Gone;
        };
        let queued = c.queued_bytes + frame.len() as u64;
        let over = match class {
            FrameClass::Reply => c.queued_bytes > limits.queue_bytes_hard,
            FrameClass::State => queued > limits.queue_bytes_hard,
            FrameClass::Droppable => {
                if c.queued_bytes > limits.queue_bytes_soft || queued > limits.queue_bytes_hard {
                    return Enqueued::Dropped;
                }
                false
            }
        };
        if over {
            self.close(
                outbox,
                conn,
                CloseCode::Policy,
                "outbound queue limit exceeded; reconnect",
            );
            return Enqueued::Closing;
        }
        c.queued_bytes = queued;
        outbox.push(Output::Send { conn, frame });
        Enqueued::Queued
    }

    /// The driver wrote `bytes` of `conn`'s frames.
    pub(crate) fn flushed(&mut self, conn: ConnId, bytes: u64) {
        if let Some(c) = self.table.get_mut(&conn) {
            // Pair assertion with `enqueue`: the driver can only flush what we queued.
            debug_assert!(bytes <= c.queued_bytes, "{conn:?} flushed more than queued");
            c.queued_bytes = c.queued_bytes.saturating_sub(bytes);
        }
    }

    /// Asks the driver to close `conn`; from now on its inputs are ignored.
    pub(crate) fn close(
        &mut self,
        outbox: &mut Outbox,
        conn: ConnId,
        code: CloseCode,
        reason: &'static str,
    ) {
        let Some(c) = self.table.get_mut(&conn).filter(|c| !c.closing) else {
            return;
        };
        c.closing = true;
        // A closing connection receives nothing more, so it observes nothing.
        let channels = std::mem::take(&mut c.subscriptions);
        for channel in &channels {
            self.unindex(channel, conn);
        }
        self.newly_closing.push(conn);
        outbox.push(Output::Close { conn, code, reason });
    }
}
