//! The connection table: who is connected, how far their handshake got, what they subscribe to,
//! what waits to be revealed, and how many bytes wait for the socket. Every frame leaves
//! through `enqueue`.
//!
//! ## Held frames
//! A frame that reveals state (an event, a snapshot, the answer to a mutation) may leave only
//! once the change it depends on is durable. `enqueue` takes a [`Hold`]: the change number the
//! frame depends on (`dep`) and what becomes of it if that change fails. A frame whose change
//! is durable and that has nothing held before it goes out at once; any other frame waits in
//! the connection's `held` queue, in order, and `release` lets the queue's head out as the
//! durable number passes it. Frames given no hold (client-service notifications, relayed
//! requests and answers, pings) depend on nothing unflushed and go out at once, past anything
//! held; they carry no `serverSeq`, so no connection ever sees `serverSeq` go backwards.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use crate::hash::IdMap;
use crate::limits::Limits;
use crate::net::output::{CloseCode, Frame, Outbox, Output};
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

/// What becomes of a held frame when the change it depends on fails.
#[derive(Debug)]
pub(crate) enum OnFail {
    /// An event of the failed change: never shown.
    Drop,
    /// Nothing in it is undone (a refusal, an error, a catalog event): it goes out once the
    /// host's numbers are covered again.
    Send,
    /// The answer to the request (raw JSON id) that made the failed change: `-32603` instead.
    Error(Box<str>),
    /// The echo of the dispatched action that made the failed change: its rejection instead.
    Reject(Box<Rejection>),
    /// The answer to request `id` (raw JSON) revealed state that is rolled back (a
    /// handshake, a snapshot, a replay, a listing): it becomes `-32603`, the connection is
    /// closed after it, and the client reconnects to the durable state.
    Close(Box<str>),
}

/// An accepted `dispatchAction` notification, kept to echo its rejection if its change fails.
#[derive(Debug)]
pub(crate) struct Rejection {
    pub(crate) channel: String,
    /// The action as received (raw JSON).
    pub(crate) action: String,
    pub(crate) client_id: String,
    pub(crate) client_seq: u64,
}

/// The change a frame depends on, and what becomes of it if that change fails.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) dep: u64,
    pub(crate) on_fail: OnFail,
}

#[derive(Debug)]
enum HeldItem {
    Send(Frame),
    Close(CloseCode, &'static str),
    /// Nothing to send once durable; something (its `OnFail`) to send if the change fails.
    Marker,
}

#[derive(Debug)]
struct Held {
    dep: u64,
    item: HeldItem,
    on_fail: OnFail,
}

impl Held {
    fn bytes(&self) -> u64 {
        match &self.item {
            HeldItem::Send(f) => f.len() as u64,
            HeldItem::Close(..) | HeldItem::Marker => 0,
        }
    }
}

pub(crate) struct Connection {
    pub(crate) principal: Arc<Principal>,
    pub(crate) phase: Phase,
    /// Channels this connection receives envelopes for.
    pub(crate) subscriptions: BTreeSet<String>,
    /// Bytes handed to the driver and not yet reported flushed.
    pub(crate) queued_bytes: u64,
    /// Bytes of held frames (not yet handed to the driver). The queue limits apply to both.
    pub(crate) held_bytes: u64,
    /// Whether any message arrived yet (`reconnect` must be the first).
    pub(crate) seen_message: bool,
    /// Messages of this connection in the kernel's input hold: while any is, every later
    /// message waits behind it.
    pub(crate) messages_held: u32,
    /// The host decided to close it; its inputs are ignored and it receives nothing new. Its
    /// `Output::Close` may still wait behind held frames.
    pub(crate) closing: bool,
    /// Frames waiting for their change to be durable, in order.
    held: VecDeque<Held>,
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
    /// Sent, or held in order.
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
    /// Looked up several times per message, never iterated on the way to an output (fan-out
    /// goes by `subscribers`, releases by `with_held`).
    table: IdMap<ConnId, Connection>,
    /// Channel → subscribers, for fan-out. Invariant: mirrors every `Connection::subscriptions`.
    subscribers: BTreeMap<String, BTreeSet<ConnId>>,
    /// Connections with held frames. Invariant: exactly those whose `held` is not empty.
    with_held: BTreeSet<ConnId>,
    /// The newest durable change: a frame depending on it or less needs no holding.
    durable: u64,
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
                held_bytes: 0,
                seen_message: false,
                messages_held: 0,
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
        for channel in &c.subscriptions {
            self.unindex(channel, conn);
        }
        self.with_held.remove(&conn);
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
    /// and recovers by `reconnect`); client-service traffic is dropped instead. With a `hold`,
    /// the frame waits for its change and for every frame held before it.
    pub(crate) fn enqueue(
        &mut self,
        outbox: &mut Outbox,
        conn: ConnId,
        frame: Frame,
        class: FrameClass,
        limits: &Limits,
        hold: Option<Hold>,
    ) -> Enqueued {
        let Some(c) = self.table.get_mut(&conn).filter(|c| !c.closing) else {
            return Enqueued::Gone;
        };
        let before = c.queued_bytes + c.held_bytes;
        let len = frame.len() as u64;
        let queued = before + len;
        let over = match class {
            FrameClass::Reply => before > limits.queue_bytes_hard,
            FrameClass::State => queued > limits.queue_bytes_hard,
            FrameClass::Droppable => {
                if before > limits.queue_bytes_soft || queued > limits.queue_bytes_hard {
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
        match hold {
            Some(h) if h.dep > self.durable || !c.held.is_empty() => {
                c.held_bytes += len;
                c.held.push_back(Held {
                    dep: h.dep,
                    item: HeldItem::Send(frame),
                    on_fail: h.on_fail,
                });
                self.with_held.insert(conn);
            }
            _ => {
                c.queued_bytes += len;
                outbox.push(Output::Send { conn, frame });
            }
        }
        Enqueued::Queued
    }

    /// Holds nothing for `conn` until change `hold.dep` is durable, and what `hold.on_fail`
    /// says if it fails: how a sender that will see no answer on success is still told of a
    /// failure (a dispatch sent as a notification by a connection not subscribed to its chat).
    pub(crate) fn enqueue_marker(&mut self, conn: ConnId, hold: Hold) {
        if hold.dep <= self.durable {
            return;
        }
        let Some(c) = self.table.get_mut(&conn).filter(|c| !c.closing) else {
            return;
        };
        c.held.push_back(Held {
            dep: hold.dep,
            item: HeldItem::Marker,
            on_fail: hold.on_fail,
        });
        self.with_held.insert(conn);
    }

    /// The driver wrote `bytes` of `conn`'s frames.
    pub(crate) fn flushed(&mut self, conn: ConnId, bytes: u64) {
        if let Some(c) = self.table.get_mut(&conn) {
            // Pair assertion with `enqueue`: the driver can only flush what we queued.
            debug_assert!(bytes <= c.queued_bytes, "{conn:?} flushed more than queued");
            c.queued_bytes = c.queued_bytes.saturating_sub(bytes);
        }
    }

    /// Closes `conn` now: held frames are dropped, and from now on its inputs are ignored.
    pub(crate) fn close(
        &mut self,
        outbox: &mut Outbox,
        conn: ConnId,
        code: CloseCode,
        reason: &'static str,
    ) {
        if !self.begin_close(conn) {
            return;
        }
        if let Some(c) = self.table.get_mut(&conn) {
            c.held.clear();
            c.held_bytes = 0;
        }
        self.with_held.remove(&conn);
        outbox.push(Output::Close { conn, code, reason });
    }

    /// Closes `conn` once what is held for it, and change `dep`, are durable: a close that
    /// must not overtake the answer before it. Its inputs are ignored from now on.
    pub(crate) fn close_after(
        &mut self,
        outbox: &mut Outbox,
        conn: ConnId,
        dep: u64,
        code: CloseCode,
        reason: &'static str,
    ) {
        if !self.begin_close(conn) {
            return;
        }
        let durable = self.durable;
        let Some(c) = self.table.get_mut(&conn) else {
            return;
        };
        if dep <= durable && c.held.is_empty() {
            outbox.push(Output::Close { conn, code, reason });
            return;
        }
        c.held.push_back(Held {
            dep,
            item: HeldItem::Close(code, reason),
            on_fail: OnFail::Send,
        });
        self.with_held.insert(conn);
    }

    /// Marks `conn` closing: unsubscribed, noted for the host to release what it holds.
    /// Whether it was open.
    fn begin_close(&mut self, conn: ConnId) -> bool {
        let Some(c) = self.table.get_mut(&conn).filter(|c| !c.closing) else {
            return false;
        };
        c.closing = true;
        // A closing connection receives nothing more, so it observes nothing.
        let channels = std::mem::take(&mut c.subscriptions);
        for channel in &channels {
            self.unindex(channel, conn);
        }
        self.newly_closing.push(conn);
        true
    }

    /// Change `durable` and every one before it are durable: lets out every held frame whose
    /// change that is, in order.
    pub(crate) fn release(&mut self, outbox: &mut Outbox, durable: u64) {
        self.durable = self.durable.max(durable);
        let durable = self.durable;
        let waiting: Vec<ConnId> = self.with_held.iter().copied().collect();
        for conn in waiting {
            let Some(c) = self.table.get_mut(&conn) else {
                self.with_held.remove(&conn);
                continue;
            };
            while c.held.front().is_some_and(|h| h.dep <= durable) {
                let Some(h) = c.held.pop_front() else { break };
                match h.item {
                    HeldItem::Send(frame) => {
                        let len = frame.len() as u64;
                        c.held_bytes -= len;
                        c.queued_bytes += len;
                        outbox.push(Output::Send { conn, frame });
                    }
                    HeldItem::Marker => {}
                    HeldItem::Close(code, reason) => {
                        outbox.push(Output::Close { conn, code, reason });
                        c.held.clear();
                        c.held_bytes = 0;
                    }
                }
            }
            if c.held.is_empty() {
                self.with_held.remove(&conn);
            }
        }
    }

    /// Changes from `first_failed` on failed. Rewrites what was held on them as each frame's
    /// [`OnFail`] says: the frame is dropped, kept, replaced by `rewrite`'s answer, or the
    /// connection closes after what precedes it. Kept and replaced frames now wait for `cover`
    /// (the change that covers the host's numbers again, or one already durable).
    pub(crate) fn fail_from(
        &mut self,
        outbox: &mut Outbox,
        first_failed: u64,
        cover: u64,
        mut rewrite: impl FnMut(&OnFail) -> Option<Frame>,
    ) {
        let waiting: Vec<ConnId> = self.with_held.iter().copied().collect();
        let mut closing = Vec::new();
        for conn in waiting {
            let Some(c) = self.table.get_mut(&conn) else {
                continue;
            };
            let mut kept = VecDeque::with_capacity(c.held.len());
            let mut close = false;
            for mut h in c.held.drain(..) {
                if close {
                    c.held_bytes -= h.bytes();
                    continue;
                }
                if h.dep < first_failed {
                    kept.push_back(h);
                    continue;
                }
                match &h.on_fail {
                    OnFail::Drop => c.held_bytes -= h.bytes(),
                    OnFail::Send => {
                        h.dep = cover;
                        kept.push_back(h);
                    }
                    OnFail::Error(_) | OnFail::Reject(_) | OnFail::Close(_) => {
                        let old = h.bytes();
                        close = matches!(h.on_fail, OnFail::Close(_));
                        if let Some(frame) = rewrite(&h.on_fail) {
                            c.held_bytes = c.held_bytes - old + frame.len() as u64;
                            kept.push_back(Held {
                                dep: cover,
                                item: HeldItem::Send(frame),
                                on_fail: OnFail::Send,
                            });
                        } else {
                            c.held_bytes -= old;
                        }
                    }
                }
            }
            c.held = kept;
            if close {
                closing.push(conn);
            }
        }
        for conn in closing {
            self.close_after(
                outbox,
                conn,
                cover,
                CloseCode::InternalError,
                "host state rolled back; reconnect",
            );
        }
        self.with_held
            .retain(|conn| self.table.get(conn).is_some_and(|c| !c.held.is_empty()));
    }

    /// Frames held for `conn` (for tests and the simulator's checks).
    pub(crate) fn held_count(&self, conn: ConnId) -> usize {
        self.table.get(&conn).map_or(0, |c| c.held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(text: &str) -> Frame {
        Frame::new(text.as_bytes().to_vec())
    }

    fn setup() -> (Connections, Outbox, Limits) {
        let mut conns = Connections::default();
        conns.insert(ConnId(1), Arc::new(Principal::maintainer("m")));
        (conns, Outbox::default(), Limits::default())
    }

    fn sent(outbox: &mut Outbox) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(o) = outbox.pop() {
            out.push(match o {
                Output::Send { frame, .. } => frame.as_str().to_owned(),
                Output::Close { code, .. } => format!("close {}", code.code()),
                Output::Commit(_) => "commit".into(),
            });
        }
        out
    }

    fn hold(dep: u64, on_fail: OnFail) -> Option<Hold> {
        Some(Hold { dep, on_fail })
    }

    #[test]
    fn held_frames_leave_in_order_as_changes_become_durable_and_passable_ones_pass() {
        let (mut c, mut out, l) = setup();
        let conn = ConnId(1);
        let r = c.enqueue(
            &mut out,
            conn,
            frame("a"),
            FrameClass::State,
            &l,
            hold(2, OnFail::Drop),
        );
        assert_eq!(r, Enqueued::Queued);
        // Depends on nothing in flight, but must not overtake "a".
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("b"),
            FrameClass::Reply,
            &l,
            hold(0, OnFail::Send),
        );
        // No hold: passes.
        let _ = c.enqueue(&mut out, conn, frame("n"), FrameClass::Droppable, &l, None);
        assert_eq!(sent(&mut out), ["n"]);
        assert_eq!(
            c.get(conn).map(|x| (x.queued_bytes, x.held_bytes)),
            Some((1, 2))
        );
        c.release(&mut out, 1);
        assert!(sent(&mut out).is_empty());
        c.release(&mut out, 2);
        assert_eq!(sent(&mut out), ["a", "b"]);
        assert_eq!(c.held_count(conn), 0);
        // Nothing held, dependency durable: out at once.
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("c"),
            FrameClass::State,
            &l,
            hold(2, OnFail::Drop),
        );
        assert_eq!(sent(&mut out), ["c"]);
    }

    #[test]
    fn a_failure_drops_events_rewrites_answers_and_closes_where_state_was_revealed() {
        let (mut c, mut out, l) = setup();
        let conn = ConnId(1);
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("ok"),
            FrameClass::State,
            &l,
            hold(1, OnFail::Drop),
        );
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("ev"),
            FrameClass::State,
            &l,
            hold(2, OnFail::Drop),
        );
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("ans"),
            FrameClass::Reply,
            &l,
            hold(2, OnFail::Error("7".into())),
        );
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("refusal"),
            FrameClass::Reply,
            &l,
            hold(3, OnFail::Send),
        );
        c.release(&mut out, 1);
        assert_eq!(sent(&mut out), ["ok"]);
        c.fail_from(&mut out, 2, 4, |f| match f {
            OnFail::Error(id) => Some(frame(&format!("err {id}"))),
            _ => None,
        });
        assert!(sent(&mut out).is_empty());
        c.release(&mut out, 4);
        assert_eq!(sent(&mut out), ["err 7", "refusal"]);
        assert_eq!(
            c.get(conn).map(|x| (x.queued_bytes, x.held_bytes)),
            Some((2 + 5 + 7, 0))
        );

        let _ = c.enqueue(
            &mut out,
            conn,
            frame("snap"),
            FrameClass::Reply,
            &l,
            hold(5, OnFail::Close("9".into())),
        );
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("after"),
            FrameClass::State,
            &l,
            hold(5, OnFail::Drop),
        );
        c.fail_from(&mut out, 5, 6, |f| match f {
            OnFail::Close(id) => Some(frame(&format!("err {id}"))),
            _ => None,
        });
        c.release(&mut out, 6);
        assert_eq!(sent(&mut out), ["err 9", "close 1011"]);
        assert!(c.get(conn).is_some_and(|x| x.closing));
        assert_eq!(c.take_newly_closing(), vec![conn]);
    }

    #[test]
    fn an_ordered_close_waits_for_the_answer_before_it() {
        let (mut c, mut out, l) = setup();
        let conn = ConnId(1);
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("answer"),
            FrameClass::Reply,
            &l,
            hold(1, OnFail::Send),
        );
        c.close_after(&mut out, conn, 0, CloseCode::Policy, "bye");
        // Closing: nothing new is taken.
        let r = c.enqueue(&mut out, conn, frame("late"), FrameClass::State, &l, None);
        assert_eq!(r, Enqueued::Gone);
        assert!(sent(&mut out).is_empty());
        c.release(&mut out, 1);
        assert_eq!(sent(&mut out), ["answer", "close 1008"]);
    }

    #[test]
    fn a_slow_consumer_close_drops_what_was_held() {
        let (mut c, mut out, mut l) = setup();
        l.queue_bytes_hard = 10;
        let conn = ConnId(1);
        let _ = c.enqueue(
            &mut out,
            conn,
            frame("12345678"),
            FrameClass::State,
            &l,
            hold(1, OnFail::Drop),
        );
        let r = c.enqueue(
            &mut out,
            conn,
            frame("123"),
            FrameClass::State,
            &l,
            hold(1, OnFail::Drop),
        );
        assert_eq!(r, Enqueued::Closing);
        assert_eq!(sent(&mut out), ["close 1008"]);
        assert_eq!(c.get(conn).map(|x| x.queued_bytes + x.held_bytes), Some(0));
        assert_eq!(c.held_count(conn), 0);
    }
}
