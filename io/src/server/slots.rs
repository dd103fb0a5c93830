//! The socket table: what each socket is doing (`Phase`), its timers (a late request head, a
//! keepalive probe, a closing linger), the lists of sockets to read and write this turn, and
//! forgetting a socket.

use std::net::SocketAddr;

use axhost_core::{ConnId, Input, Now, Store};

use super::buffered_socket::BufferedSocket;
use super::websocket::FrameReader;
use super::Driver;

/// Time a closing WebSocket gets to drain its buffer and see the peer's EOF before it is dropped.
const CLOSING_LINGER_MS: u64 = 5_000;

/// The same for a socket answered over plain HTTP (an error status, or `/healthz`): its answer
/// is a few hundred bytes, gone at once; the linger only spares the peer a reset while its
/// request's last bytes are still read. Short, because such sockets cost the pre-authentication
/// budget.
const ANSWERED_LINGER_MS: u64 = 1_000;

/// A driver timer: a connection's HTTP head is late, or its closing linger ran out.
pub(super) type Deadline = (u64, u64);

/// What one socket is doing.
pub(super) enum Phase {
    /// Reading the HTTP request head into `head` until `deadline_ms`. `read`: the driver has
    /// read the socket at least once and found no complete head, which makes it evictable while
    /// no new bytes are announced (`Driver::evict_pre_auth`).
    Head {
        socket: BufferedSocket,
        head: Vec<u8>,
        deadline_ms: u64,
        read: bool,
    },
    /// A WebSocket the core knows as `ConnId(id)`. `heard_ms`: when the peer last sent
    /// anything; `probe_ms`: its keepalive deadline in `deadlines`, if keepalive is on.
    Open {
        socket: BufferedSocket,
        reader: Box<FrameReader>,
        heard_ms: u64,
        probe_ms: Option<u64>,
    },
    /// Draining its last bytes, then shutting down and waiting for the peer's EOF, until
    /// `deadline_ms`. The core no longer knows it. `answered`: it was answered over HTTP and
    /// never was a WebSocket (it counts against the pre-authentication budget).
    Closing {
        socket: BufferedSocket,
        deadline_ms: u64,
        shut: bool,
        peer_eof: bool,
        answered: bool,
    },
    /// Only between two phases.
    Moving,
}

/// One accepted socket, under its id in `Driver::slots`.
pub(super) struct Slot {
    pub(super) peer: SocketAddr,
    pub(super) phase: Phase,
    /// Whether the socket is registered for WRITABLE too (only while bytes are stuck).
    pub(super) writable: bool,
    /// Listed in `Driver::backlog` (to read this turn), or parked: read-pending either way /
    /// listed in `Driver::dirty` (to write).
    pub(super) in_backlog: bool,
    /// Parked while the core takes no input, with input waiting (`input_gate`).
    pub(super) parked: bool,
    pub(super) in_dirty: bool,
    /// The last turn in which the core sent this connection a frame (`TurnLoad::destinations`).
    pub(super) sent_turn: u64,
}

impl Slot {
    pub(super) fn socket(&self) -> Option<&BufferedSocket> {
        match &self.phase {
            Phase::Head { socket, .. }
            | Phase::Closing { socket, .. }
            | Phase::Open { socket, .. } => Some(socket),
            Phase::Moving => None,
        }
    }

    pub(super) fn socket_mut(&mut self) -> Option<&mut BufferedSocket> {
        match &mut self.phase {
            Phase::Head { socket, .. }
            | Phase::Closing { socket, .. }
            | Phase::Open { socket, .. } => Some(socket),
            Phase::Moving => None,
        }
    }
}

impl<S: Store> Driver<S> {
    pub(super) fn on_deadline(&mut self, id: u64) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get(&id) else {
            return;
        };
        match slot.phase {
            Phase::Head { .. } => self.drop_slot(id, "no request head in time", now),
            Phase::Closing { .. } => self.drop_slot(id, "close linger over", now),
            Phase::Open { .. } => self.keepalive(id, now),
            Phase::Moving => {}
        }
    }

    /// A keepalive deadline: probe a silent WebSocket, close one that stayed silent, or look
    /// again when the interval since it was last heard from runs out. A half-open connection
    /// (the peer vanished without a FIN or RST) is otherwise never noticed while the host has
    /// nothing to write to it, and it would hold its subscriptions and services forever.
    fn keepalive(&mut self, id: u64, now: Now) {
        let Some(interval) = self.keepalive_ms else {
            return;
        };
        // Input waits unread while the core takes none: the peer is there.
        let parked = self.parked_open(id);
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Open {
            socket,
            heard_ms,
            probe_ms,
            ..
        } = &mut slot.phase
        else {
            return;
        };
        if parked {
            *heard_ms = now.mono.0;
        }
        let silent = now.mono.0.saturating_sub(*heard_ms);
        let next = if silent >= interval.saturating_mul(2) {
            *probe_ms = None;
            tracing::info!(
                conn = id,
                silent_ms = silent,
                "no answer to keepalive pings"
            );
            return self.close(id, 1001, "no answer to pings", now);
        } else if silent >= interval {
            socket.push_ping();
            if !std::mem::replace(&mut slot.in_dirty, true) {
                self.dirty.push(id);
            }
            heard_ms.saturating_add(interval.saturating_mul(2))
        } else {
            heard_ms.saturating_add(interval)
        };
        *probe_ms = Some(next);
        self.deadlines.insert((next, id));
    }

    /// Puts `socket` into the closing phase of slot `id`: drain, shut down, wait for EOF.
    /// `answered`: an HTTP answer, in the pre-authentication table; otherwise a WebSocket, and
    /// past `connections_max` closing ones the oldest is dropped at once.
    pub(super) fn linger(&mut self, id: u64, socket: BufferedSocket, answered: bool, now: Now) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let linger_ms = if answered {
            ANSWERED_LINGER_MS
        } else {
            CLOSING_LINGER_MS
        };
        let deadline_ms = now.mono.0.saturating_add(linger_ms);
        slot.phase = Phase::Closing {
            socket,
            deadline_ms,
            shut: false,
            peer_eof: false,
            answered,
        };
        self.deadlines.insert((deadline_ms, id));
        if answered {
            self.answered.insert((deadline_ms, id));
        } else {
            self.closed_websockets.insert((deadline_ms, id));
            let closing_max = self.host.limits().connections_max as usize;
            if self.closed_websockets.len() > closing_max {
                if let Some(&(_, oldest)) = self.closed_websockets.first() {
                    self.drop_slot(oldest, "closing linger cut: too many closing", now);
                }
            }
        }
        self.mark_dirty(id);
        // A closing socket is read (what it still sends is discarded) whatever the input gate.
        self.unpark(id);
        self.mark_readable(id);
    }

    /// Lists `id` to be read this turn (once).
    pub(super) fn mark_readable(&mut self, id: u64) {
        if let Some(slot) = self.slots.get_mut(&id) {
            if !std::mem::replace(&mut slot.in_backlog, true) {
                self.backlog.push(id);
            }
        }
    }

    /// Lists `id` to be written this turn (once).
    pub(super) fn mark_dirty(&mut self, id: u64) {
        if let Some(slot) = self.slots.get_mut(&id) {
            if !std::mem::replace(&mut slot.in_dirty, true) {
                self.dirty.push(id);
            }
        }
    }

    /// Forgets a socket at once. An open WebSocket is reported closed to the core.
    pub(super) fn drop_slot(&mut self, id: u64, why: &'static str, now: Now) {
        let Some(mut slot) = self.slots.remove(&id) else {
            return;
        };
        match &slot.phase {
            Phase::Head { deadline_ms, .. } => {
                self.deadlines.remove(&(*deadline_ms, id));
                self.heads.remove(&id);
            }
            Phase::Closing {
                deadline_ms,
                answered,
                ..
            } => {
                self.deadlines.remove(&(*deadline_ms, id));
                if *answered {
                    self.answered.remove(&(*deadline_ms, id));
                } else {
                    self.closed_websockets.remove(&(*deadline_ms, id));
                }
            }
            Phase::Open { probe_ms, .. } => {
                if let Some(at) = probe_ms {
                    self.deadlines.remove(&(*at, id));
                }
                self.host.handle(now, Input::Closed { conn: ConnId(id) });
            }
            Phase::Moving => {}
        }
        if let Some(socket) = slot.socket_mut() {
            let _ = self.poll.registry().deregister(&mut socket.tcp);
        }
        tracing::debug!(conn = id, peer = %slot.peer, why, "socket dropped");
    }
}
