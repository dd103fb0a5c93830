//! Accepting sockets into the pre-authentication table (`server/driver_limits.rs`): sockets
//! still sending their request head, and sockets answered over HTTP while they linger. A full
//! table evicts one of its own before it accepts; WebSockets are never evicted for a newcomer.

use std::io;
use std::net::SocketAddr;

use axhost_core::Store;
use mio::{Interest, Token};

use super::buffered_socket::BufferedSocket;
use super::slots::{Phase, Slot};
use super::Driver;

/// Pause before accepting again after an accept error such as running out of descriptors.
const ACCEPT_RETRY_MS: u64 = 100;

/// At most one warning per this interval about sockets dropped at accept; the rest are counted.
const OVERLOAD_LOG_MS: u64 = 1_000;

impl<S: Store> Driver<S> {
    /// Accepts waiting sockets into the pre-authentication table (`server/driver_limits.rs`):
    /// at `pre_auth_sockets_max`, each newcomer first evicts one (`evict_pre_auth`). WebSockets
    /// are never evicted for a newcomer, so no flood of sockets without a token reaches them.
    pub(super) fn accept(&mut self) {
        self.accept_retry_ms = None;
        if self.listener.is_none() {
            return;
        }
        let pre_auth_max = self.driver_limits.pre_auth_sockets_max as usize;
        loop {
            let now_ms = self.clock.now().mono.0;
            if self.heads.len() + self.answered.len() >= pre_auth_max
                && !self.evict_pre_auth(now_ms)
            {
                // Every socket in the table is a head with bytes not read yet: most likely a
                // burst of real clients, whose heads come right behind their handshakes. The
                // next ones wait in the listen backlog until this turn has read those heads.
                self.accept_retry_ms = Some(now_ms);
                return;
            }
            let Some(listener) = self.listener.as_mut() else {
                return;
            };
            let (mut tcp, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted
                            | io::ErrorKind::ConnectionAborted
                            | io::ErrorKind::ConnectionReset
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed; retrying shortly");
                    self.accept_retry_ms = Some(now_ms.saturating_add(ACCEPT_RETRY_MS));
                    return;
                }
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(peer = %peer, error = %e, "TCP_NODELAY not set");
            }
            let id = self.next_id;
            self.next_id += 1;
            if let Err(e) =
                self.poll
                    .registry()
                    .register(&mut tcp, Token(id as usize), Interest::READABLE)
            {
                tracing::warn!(peer = %peer, error = %e, "register failed; dropped");
                continue;
            }
            let deadline_ms = now_ms.saturating_add(self.host.limits().handshake_timeout_ms);
            self.deadlines.insert((deadline_ms, id));
            self.heads.insert(id);
            let phase = Phase::Head {
                socket: BufferedSocket::new(tcp),
                head: Vec::new(),
                deadline_ms,
                read: false,
            };
            self.slots.insert(
                id,
                Slot {
                    peer,
                    phase,
                    writable: false,
                    in_backlog: true,
                    parked: false,
                    in_dirty: false,
                    sent_turn: 0,
                },
            );
            self.backlog.push(id);
            tracing::debug!(conn = id, peer = %peer, "accepted");
        }
    }

    /// Makes room in the full pre-authentication table for a new socket: drops the oldest
    /// socket answered over HTTP, else the oldest one still sending its head that the driver
    /// has read at least once and that has no unread bytes announced since. A real client's head
    /// comes right behind its handshake, so it is there by the first read or announced before
    /// the next accept, and the socket leaves the table as soon as it is answered or upgraded.
    /// Returns whether one was dropped.
    fn evict_pre_auth(&mut self, now_ms: u64) -> bool {
        let victim = match self.answered.first() {
            Some(&(_, oldest)) => Some((
                oldest,
                "too many answered sockets without a WebSocket; oldest dropped",
            )),
            None => self
                .heads
                .iter()
                .find(|id| {
                    self.slots.get(id).is_some_and(|s| {
                        !s.in_backlog && matches!(s.phase, Phase::Head { read: true, .. })
                    })
                })
                .map(|&id| {
                    (
                        id,
                        "too many sockets without a request head; oldest dropped",
                    )
                }),
        };
        let Some((victim, what)) = victim else {
            return false;
        };
        let peer = self.slots.get(&victim).map(|s| s.peer);
        let now = self.clock.now();
        self.drop_slot(victim, "evicted from the pre-authentication table", now);
        if let Some(peer) = peer {
            self.overloaded(now_ms, peer, what);
        }
        true
    }

    /// Counts a socket dropped for lack of room and warns at most once per `OVERLOAD_LOG_MS`
    /// (a flood would otherwise log a line per socket).
    fn overloaded(&mut self, now_ms: u64, peer: SocketAddr, what: &'static str) {
        self.overload_dropped += 1;
        if now_ms < self.overload_log_ms {
            return;
        }
        tracing::warn!(
            peer = %peer,
            dropped = self.overload_dropped,
            sockets = self.slots.len(),
            waiting_for_head = self.heads.len(),
            answered = self.answered.len(),
            "{what}"
        );
        self.overload_dropped = 0;
        self.overload_log_ms = now_ms.saturating_add(OVERLOAD_LOG_MS);
    }
}
