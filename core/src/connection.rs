//! The connection table: who is connected, how far their handshake got, what they subscribe to,
//! and how many bytes wait in their outbound queue. Every frame leaves through `enqueue`.
//!
//! Frames that reveal state carry the number of the newest change issued when they were made
//! (`Order::After`). Until that change is durable they wait in the connection's held queue, in
//! order, counted in its queued bytes; an ordered frame also waits behind any frame already
//! held, so per-connection order (and `serverSeq` order) is kept. Unordered frames
//! (client-service traffic, pings) never wait. With nothing in flight and nothing held, an
//! ordered frame goes straight to the outbox, as an unordered one does.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
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
    /// Frames waiting for the change they depend on to be durable, oldest first.
    pub(crate) held: VecDeque<Held>,
}

/// How a frame is ordered against the write path.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Order<'a> {
    /// Depends on no unflushed state: sent at once, even past held frames.
    Unordered,
    /// Reveals state as of change `dep`; `durable` is the newest durable change.
    After {
        dep: u64,
        durable: u64,
        on_fail: Fail<'a>,
    },
}

/// What to do with a held frame when a change it depends on fails.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Fail<'a> {
    /// It reveals failed state: drop it.
    Drop,
    /// It reveals nothing that failed: send it anyway.
    Send,
    /// A reply to request `id` that included failed state: answer `-32603` instead.
    Answer(&'a str),
    /// Like `Answer`, for an `initialize` or `reconnect` reply: the connection also goes back
    /// to its handshake, as after a handshake that failed.
    Unready(&'a str),
    /// Like `Answer`, for a `subscribe` reply: the subscription is undone too.
    Unsubscribe(&'a str, &'a str),
    /// A catalog event: the observer loses it, so it is closed and re-snapshots.
    CloseObserver,
}

/// [`Fail`], owned, as a held frame keeps it.
#[derive(Clone, Debug)]
pub(crate) enum OnFail {
    Drop,
    Send,
    Answer(Box<str>),
    Unready(Box<str>),
    Unsubscribe(Box<str>, Box<str>),
    /// The sender of a failed `dispatchAction` gets its rejection echo.
    Reject(Box<crate::dispatch::Rejected>),
    CloseObserver,
}

impl Fail<'_> {
    fn to_owned(self) -> OnFail {
        match self {
            Fail::Drop => OnFail::Drop,
            Fail::Send => OnFail::Send,
            Fail::Answer(id) => OnFail::Answer(id.into()),
            Fail::Unready(id) => OnFail::Unready(id.into()),
            Fail::Unsubscribe(id, channel) => OnFail::Unsubscribe(id.into(), channel.into()),
            Fail::CloseObserver => OnFail::CloseObserver,
        }
    }
}

/// What a held entry carries out once released.
#[derive(Clone, Debug)]
pub(crate) enum HeldItem {
    Send(Frame),
    /// Nothing on success; only its `on_fail` matters (a dispatch sender's rejection).
    Marker,
    /// The host closed the connection after frames still held: the close waits behind them.
    Close(CloseCode, &'static str),
}

/// One held entry.
#[derive(Clone, Debug)]
pub(crate) struct Held {
    pub(crate) dep: u64,
    pub(crate) item: HeldItem,
    pub(crate) on_fail: OnFail,
}

/// What a failed change does to one held entry.
pub(crate) enum Rewrite {
    /// Forget it.
    Drop,
    /// Keep it, depending on `dep` now, with this item, then do `then`.
    Keep {
        dep: u64,
        item: HeldItem,
        then: Then,
    },
    /// Close the connection after what is kept.
    Close,
}

/// What a failed change does to a connection beyond its held frames.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Then {
    Nothing,
    Close,
    /// Back to the handshake phase.
    Unready,
    Unsubscribe(Box<str>),
}

/// Bytes a held entry counts in its connection's queue.
fn held_len(h: &Held) -> u64 {
    match &h.item {
        HeldItem::Send(frame) => frame.len() as u64,
        HeldItem::Marker | HeldItem::Close(..) => 0,
    }
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
    /// Connections with held frames.
    holding: BTreeSet<ConnId>,
}

impl Connections {
    pub(crate) fn len(&self) -> usize {
        self.table.len()
    }

    /// Every connection, in no particular order (callers sort before anything reaches an
    /// output).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&ConnId, &Connection)> {
        self.table.iter()
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
                held: VecDeque::new(),
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
        self.holding.remove(&conn);
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
        order: Order<'_>,
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
        match order {
            Order::After {
                dep,
                durable,
                on_fail,
            } if dep > durable || !c.held.is_empty() => {
                c.held.push_back(Held {
                    dep,
                    item: HeldItem::Send(frame),
                    on_fail: on_fail.to_owned(),
                });
                self.holding.insert(conn);
            }
            _ => outbox.push(Output::Send { conn, frame }),
        }
        Enqueued::Queued
    }

    /// Holds an entry with no frame for `conn` until change `dep` is durable; only its
    /// `on_fail` matters.
    pub(crate) fn hold_marker(&mut self, conn: ConnId, dep: u64, on_fail: OnFail) {
        if let Some(c) = self.table.get_mut(&conn).filter(|c| !c.closing) {
            c.held.push_back(Held {
                dep,
                item: HeldItem::Marker,
                on_fail,
            });
            self.holding.insert(conn);
        }
    }

    /// Sends every held entry whose change is durable, per connection in order.
    pub(crate) fn release(&mut self, outbox: &mut Outbox, durable: u64) {
        let holding = std::mem::take(&mut self.holding);
        for conn in holding {
            let Some(c) = self.table.get_mut(&conn) else {
                continue;
            };
            while c.held.front().is_some_and(|h| h.dep <= durable) {
                let Some(h) = c.held.pop_front() else { break };
                match h.item {
                    HeldItem::Send(frame) => outbox.push(Output::Send { conn, frame }),
                    HeldItem::Marker => {}
                    HeldItem::Close(code, reason) => {
                        outbox.push(Output::Close { conn, code, reason })
                    }
                }
            }
            if !c.held.is_empty() {
                self.holding.insert(conn);
            }
        }
    }

    /// Rewrites every held entry that depends on a change numbered `from` or later (they
    /// failed) as `decide` says; a held close waits for `floor` instead (the change every kept
    /// entry now depends on at most), so it still leaves right after what is ahead of it.
    /// Returns the connections to close, in ConnId order.
    pub(crate) fn rewrite_failed(
        &mut self,
        from: u64,
        floor: u64,
        mut decide: impl FnMut(ConnId, &Held) -> Rewrite,
    ) -> Vec<(ConnId, Then)> {
        let mut after = Vec::new();
        for &conn in &self.holding {
            let Some(c) = self.table.get_mut(&conn) else {
                continue;
            };
            let mut kept = VecDeque::with_capacity(c.held.len());
            for mut h in std::mem::take(&mut c.held) {
                if h.dep < from {
                    kept.push_back(h);
                    continue;
                }
                if matches!(h.item, HeldItem::Close(..)) {
                    h.dep = floor;
                    kept.push_back(h);
                    continue;
                }
                let old = held_len(&h);
                match decide(conn, &h) {
                    Rewrite::Drop => c.queued_bytes -= old,
                    Rewrite::Close => {
                        c.queued_bytes -= old;
                        after.push((conn, Then::Close));
                    }
                    Rewrite::Keep { dep, item, then } => {
                        if then != Then::Nothing {
                            after.push((conn, then));
                        }
                        let held = Held {
                            dep,
                            item,
                            on_fail: OnFail::Drop,
                        };
                        c.queued_bytes = c.queued_bytes - old + held_len(&held);
                        kept.push_back(held);
                    }
                }
            }
            c.held = kept;
        }
        after
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
        if c.held.is_empty() {
            outbox.push(Output::Close { conn, code, reason });
        } else {
            // Frames already decided go first, as the driver sends queued frames before a close.
            let dep = c.held.back().map_or(0, |h| h.dep);
            c.held.push_back(Held {
                dep,
                item: HeldItem::Close(code, reason),
                on_fail: OnFail::Send,
            });
        }
        for channel in &channels {
            self.unindex(channel, conn);
        }
        self.newly_closing.push(conn);
    }
}
