//! The kernel: what every protocol surface shares, lent to the components that need it.
//!
//! It owns the connections and their outbound accounting, the outbox, the timers, the
//! sequencer and replay ring, the write path with its receipt cache, the seeded generator,
//! `now`, the frame pool and the stats. Its fields are private: components reach them through
//! the methods below, which keep the invariants that span them (a frame that reveals state
//! waits for its change; a change is numbered once; a failure rolls back every piece of the
//! log at once). Components are called as `component.handle(&mut kernel, ...)`, the way
//! quinn-proto lends `Streams` to its connection: methods live with the state they change.

pub(crate) mod input_hold;
pub(crate) mod time;

use std::sync::Arc;

use rand::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::RpcError;
use crate::kernel::input_hold::{HeldMessage, InputHold};
use crate::kernel::time::{Instant, Now, Timer, Timers};
use crate::limits::Limits;
use crate::log::change::{Event, Loaded, Receipt, StoreError};
use crate::log::receipts::{Known, RecentReceipts};
use crate::log::sequencer::Sequencer;
use crate::log::store::Store;
use crate::log::write_path::{Failed, Txn, View, WritePath};
use crate::net::connection::{
    ConnId, Connection, Connections, Enqueued, FrameClass, Hold, OnFail, Phase,
};
use crate::net::jsonrpc;
use crate::net::output::{CloseCode, Frame, FramePool, Outbox, Output};
use crate::principal::Principal;

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
    /// The repository this host serves (one per host, as in the AXP host): every exchange
    /// names it and `initialize` advertises it. The driver binds it to its database.
    pub repository: String,
}

impl Default for HostConfig {
    fn default() -> Self {
        HostConfig {
            limits: Limits::default(),
            server_name: "axhost".into(),
            server_version: env!("CARGO_PKG_VERSION").into(),
            trust_groups: Vec::new(),
            repository: "default".into(),
        }
    }
}

/// Counters for metrics and tests. They only ever grow.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Messages received.
    pub messages_in: u64,
    /// Frames handed to the driver.
    pub frames_out: u64,
    /// Errors answered.
    pub errors_out: u64,
    /// Changes reported durable.
    pub commits: u64,
    /// Changes that failed (each change of a failed batch counts).
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
    /// Messages held while the write path was full (backpressure), handled once it had room.
    pub messages_held: u64,
    /// Messages that arrived while the hold was full: refused with `-32043`, or their
    /// connection closed (1008) when it had messages held before them.
    pub messages_past_hold: u64,
}

/// Time between two warnings about messages past the hold (the first is logged at once).
const PAST_HOLD_LOG_MS: u64 = 1_000;

/// The shared machinery. See the module docs.
pub(crate) struct Kernel<S: Store> {
    config: HostConfig,
    store: S,
    rng: ChaCha8Rng,
    /// Latest `now` seen; `wall_unix_ms` is a high-water mark so timestamps never go back.
    now: Now,
    conns: Connections,
    outbox: Outbox,
    timers: Timers,
    seq: Sequencer,
    path: WritePath,
    receipts: RecentReceipts,
    frame_pool: FramePool,
    stats: Stats,
    /// Messages waiting for room on the write path (see `input_hold`).
    hold: InputHold,
    /// When a message past the hold was last logged, and how many since went unlogged.
    past_hold_logged: Option<Instant>,
    past_hold_unlogged: u64,
}

impl<S: Store> Kernel<S> {
    /// A kernel resuming what `loaded` holds; `wall_floor` is the newest timestamp already
    /// handed out (timestamps never go below it).
    pub(crate) fn new(
        config: HostConfig,
        store: S,
        seed: u64,
        loaded: &mut Loaded,
        wall_floor: u64,
    ) -> Kernel<S> {
        let tail = std::mem::take(&mut loaded.events_tail);
        Kernel {
            seq: Sequencer::new(loaded.server_seq, tail, config.limits.replay_events_max),
            config,
            store,
            rng: ChaCha8Rng::seed_from_u64(seed),
            now: Now {
                mono: Instant(0),
                wall_unix_ms: wall_floor,
            },
            conns: Connections::default(),
            outbox: Outbox::default(),
            timers: Timers::default(),
            path: WritePath::default(),
            receipts: RecentReceipts::default(),
            frame_pool: FramePool::default(),
            stats: Stats::default(),
            hold: InputHold::default(),
            past_hold_logged: None,
            past_hold_unlogged: 0,
        }
    }

    // ---- time, randomness, configuration, counters ----

    /// Takes in the driver's clocks; neither ever goes back as the core sees it.
    pub(crate) fn advance(&mut self, now: Now) {
        debug_assert!(now.mono >= self.now.mono, "monotonic time went backwards");
        self.now.mono = self.now.mono.max(now.mono);
        self.now.wall_unix_ms = self.now.wall_unix_ms.max(now.wall_unix_ms);
    }

    pub(crate) fn now(&self) -> Now {
        self.now
    }

    /// Timestamps handed out before a restart (read from the store): new ones never go below.
    pub(crate) fn raise_wall_floor(&mut self, unix_ms: u64) {
        self.now.wall_unix_ms = self.now.wall_unix_ms.max(unix_ms);
    }

    /// Wall-clock Unix milliseconds for timestamps users see (never decreasing).
    pub(crate) fn wall_ms(&self) -> u64 {
        self.now.wall_unix_ms
    }

    pub(crate) fn config(&self) -> &HostConfig {
        &self.config
    }

    pub(crate) fn limits(&self) -> &Limits {
        &self.config.limits
    }

    pub(crate) fn stats(&self) -> &Stats {
        &self.stats
    }

    pub(crate) fn stats_mut(&mut self) -> &mut Stats {
        &mut self.stats
    }

    /// Fills `bytes` from the host's seeded generator.
    pub(crate) fn random_bytes(&mut self, bytes: &mut [u8]) {
        self.rng.fill_bytes(bytes);
    }

    /// A fresh random UUID (v4 layout) from the seeded generator.
    pub(crate) fn uuid(&mut self) -> String {
        let mut b = [0u8; 16];
        self.rng.fill_bytes(&mut b);
        b[6] = (b[6] & 0x0f) | 0x40;
        b[8] = (b[8] & 0x3f) | 0x80;
        let h = crate::canonical::hex(&b);
        format!(
            "{}-{}-{}-{}-{}",
            &h[0..8],
            &h[8..12],
            &h[12..16],
            &h[16..20],
            &h[20..32]
        )
    }

    // ---- timers ----

    pub(crate) fn arm(&mut self, timer: Timer, at: Instant) {
        self.timers.arm(timer, at);
    }

    pub(crate) fn disarm(&mut self, timer: &Timer) {
        self.timers.disarm(timer);
    }

    pub(crate) fn pop_due_timer(&mut self) -> Option<Timer> {
        self.timers.pop_due(self.now.mono)
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.timers.next_deadline()
    }

    // ---- connections ----

    pub(crate) fn conns(&self) -> &Connections {
        &self.conns
    }

    pub(crate) fn conns_mut(&mut self) -> &mut Connections {
        &mut self.conns
    }

    pub(crate) fn conn(&self, conn: ConnId) -> Option<&Connection> {
        self.conns.get(conn)
    }

    /// The principal of a connection the host still knows.
    pub(crate) fn principal(&self, conn: ConnId) -> Result<Arc<Principal>, RpcError> {
        self.conns
            .get(conn)
            .map(|c| c.principal.clone())
            .ok_or_else(|| RpcError::new(crate::error::INTERNAL_ERROR, "Connection is gone"))
    }

    /// The clientId a ready connection is bound to.
    pub(crate) fn client_id(&self, conn: ConnId) -> Option<&str> {
        match &self.conns.get(conn)?.phase {
            Phase::Ready { client_id } => Some(client_id),
            Phase::Handshake => None,
        }
    }

    pub(crate) fn is_ready(&self, conn: ConnId) -> bool {
        self.client_id(conn).is_some()
    }

    pub(crate) fn subscribers(&self, channel: &str) -> Vec<ConnId> {
        self.conns.subscribers(channel)
    }

    pub(crate) fn subscribe(&mut self, conn: ConnId, channel: &str) {
        self.conns.subscribe(conn, channel);
    }

    pub(crate) fn unsubscribe(&mut self, conn: ConnId, channel: &str) {
        self.conns.unsubscribe(conn, channel);
    }

    /// Closes `conn` now; frames held for it are dropped.
    pub(crate) fn close(&mut self, conn: ConnId, code: CloseCode, reason: &'static str) {
        self.conns.close(&mut self.outbox, conn, code, reason);
    }

    /// Closes `conn` after every frame queued for it and every change issued so far.
    pub(crate) fn close_after_issued(
        &mut self,
        conn: ConnId,
        code: CloseCode,
        reason: &'static str,
    ) {
        let dep = self.path.newest_live();
        self.conns
            .close_after(&mut self.outbox, conn, dep, code, reason);
    }

    pub(crate) fn take_newly_closing(&mut self) -> Vec<ConnId> {
        self.conns.take_newly_closing()
    }

    // ---- what goes out ----

    /// Hands `frame` to `conn` under its class's queue limits, waiting for `hold`.
    pub(crate) fn send(
        &mut self,
        conn: ConnId,
        frame: Frame,
        class: FrameClass,
        hold: Option<Hold>,
    ) -> Enqueued {
        let r = self.conns.enqueue(
            &mut self.outbox,
            conn,
            frame,
            class,
            &self.config.limits,
            hold,
        );
        if r == Enqueued::Closing {
            self.stats.slow_consumer_closes += 1;
        }
        r
    }

    /// Holds a frame for every change the newest state depends on.
    fn after_issued(&self, on_fail: OnFail) -> Option<Hold> {
        Some(Hold {
            dep: self.path.newest_live(),
            on_fail,
        })
    }

    /// The answer to request `id` that shows the newest state (a handshake, a snapshot, a
    /// replay, a listing): it waits for every change issued; if one of them fails it becomes
    /// `-32603` and the connection is closed after it.
    pub(crate) fn reply_state(&mut self, conn: ConnId, id: &str, frame: Frame) {
        let hold = self.after_issued(OnFail::Close(id.into()));
        let _ = self.send(conn, frame, FrameClass::Reply, hold);
    }

    /// The answer to the request `id` whose mutation is change `change`: it waits for it, and
    /// becomes `-32603` if it fails.
    pub(crate) fn reply_change(&mut self, conn: ConnId, id: &str, frame: Frame, change: u64) {
        let hold = Some(Hold {
            dep: change,
            on_fail: OnFail::Error(id.into()),
        });
        let _ = self.send(conn, frame, FrameClass::Reply, hold);
    }

    /// An error answer, kept in order behind what is held and after every change issued (the
    /// refusal may rest on state in flight). A failure of those changes does not withdraw it:
    /// a refusal changed nothing, and a retry is judged against the restored state.
    pub(crate) fn reply_error(&mut self, conn: ConnId, id: &str, e: &RpcError) {
        self.stats.errors_out += 1;
        let hold = self.after_issued(OnFail::Send);
        let _ = self.send(conn, jsonrpc::error_frame(id, e), FrameClass::Reply, hold);
    }

    /// An answer that depends on nothing in flight (`ping`, client-service calls): at once.
    pub(crate) fn reply_now(&mut self, conn: ConnId, frame: Frame) {
        let _ = self.send(conn, frame, FrameClass::Reply, None);
    }

    /// An error that depends on nothing in flight: at once.
    pub(crate) fn reply_error_now(&mut self, conn: ConnId, id: &str, e: &RpcError) {
        self.stats.errors_out += 1;
        self.reply_now(conn, jsonrpc::error_frame(id, e));
    }

    /// An answer held for change `dep` that stays as it is if `dep` fails (a refusal or an
    /// echo whose content survives any rollback).
    pub(crate) fn reply_after(&mut self, conn: ConnId, frame: Frame, dep: u64, on_fail: OnFail) {
        let _ = self.send(conn, frame, FrameClass::Reply, Some(Hold { dep, on_fail }));
    }

    /// An event of change `change`, to a connection that did not ask for it.
    pub(crate) fn push_event(&mut self, conn: ConnId, frame: Frame, change: u64) {
        let hold = Some(Hold {
            dep: change,
            on_fail: OnFail::Drop,
        });
        let _ = self.send(conn, frame, FrameClass::State, hold);
    }

    /// An event of change `change` to every subscriber of `channel`, in ConnId order; `skip`
    /// gets its copy some other way (the sender's echo).
    pub(crate) fn broadcast(
        &mut self,
        channel: &str,
        frame: &Frame,
        change: u64,
        skip: Option<ConnId>,
    ) {
        for conn in self.conns.subscribers(channel) {
            if Some(conn) != skip {
                self.push_event(conn, frame.clone(), change);
            }
        }
    }

    /// A catalog event numbered under the reservation of change `dep`: it keeps its place
    /// behind held frames (its number must not overtake theirs) and survives any failure.
    pub(crate) fn push_catalog(&mut self, conn: ConnId, frame: Frame, dep: u64) {
        let hold = Some(Hold {
            dep,
            on_fail: OnFail::Send,
        });
        let _ = self.send(conn, frame, FrameClass::State, hold);
    }

    /// Tells the sender of change `change` of its failure, should it fail, as `on_fail` says;
    /// sends nothing if it is durable.
    pub(crate) fn on_failure_tell(&mut self, conn: ConnId, change: u64, on_fail: OnFail) {
        self.conns.enqueue_marker(
            conn,
            Hold {
                dep: change,
                on_fail,
            },
        );
    }

    /// Client-service traffic: passes everything held, dropped above the soft limit.
    pub(crate) fn pass(&mut self, conn: ConnId, frame: Frame) -> Enqueued {
        self.send(conn, frame, FrameClass::Droppable, None)
    }

    pub(crate) fn poll_output(&mut self) -> Option<Output> {
        self.outbox.pop()
    }

    /// A buffer for a frame built by hand (the notification path).
    pub(crate) fn frame_buffer(&mut self) -> std::rc::Rc<Vec<u8>> {
        self.frame_pool.take()
    }

    pub(crate) fn recycle(&mut self, frame: Frame) {
        self.frame_pool.give_back(frame);
    }

    // ---- the log ----

    /// The last `serverSeq` handed out.
    pub(crate) fn server_seq(&self) -> u64 {
        self.seq.current()
    }

    /// The newest change issued.
    pub(crate) fn issued(&self) -> u64 {
        self.path.issued()
    }

    /// The newest change the newest state depends on (durable or in flight).
    pub(crate) fn newest_live(&self) -> u64 {
        self.path.newest_live()
    }

    /// The newest change known durable.
    pub(crate) fn durable(&self) -> u64 {
        self.path.durable()
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.path.in_flight()
    }

    /// Whether another change may be issued (`Limits::in_flight_changes_max`).
    pub(crate) fn has_room(&self) -> bool {
        self.path
            .has_room(self.config.limits.in_flight_changes_max as usize)
    }

    /// Refuses a durable change while the writer is too far behind. Messages that may need a
    /// change wait in the hold while the path is full, so only a message past the hold (and
    /// nothing a timer does: timers retry) is refused here, with `-32043`.
    pub(crate) fn room(&self) -> Result<(), RpcError> {
        if self.has_room() {
            Ok(())
        } else {
            Err(RpcError::busy())
        }
    }

    // ---- the input hold (backpressure) ----

    /// Whether the host takes new input: the write path has room and nothing is held. A
    /// driver stops reading while it is false.
    pub(crate) fn accepting_input(&self) -> bool {
        self.hold.is_empty() && self.has_room()
    }

    pub(crate) fn held_messages(&self) -> usize {
        self.hold.len()
    }

    pub(crate) fn held_message_bytes(&self) -> u64 {
        self.hold.bytes()
    }

    /// Holds a message of `conn` (open, not closing) until the write path has room; false
    /// when the hold is full.
    pub(crate) fn hold_message(
        &mut self,
        conn: ConnId,
        text: &str,
        first: bool,
        needs_room: bool,
    ) -> bool {
        let limits = &self.config.limits;
        if !self.hold.fits(
            text.len(),
            limits.held_messages_max,
            limits.held_message_bytes_max,
        ) {
            return false;
        }
        let Some(c) = self.conns.live_mut(conn) else {
            return false;
        };
        c.messages_held += 1;
        self.hold.push(HeldMessage {
            conn,
            text: text.into(),
            first,
            needs_room,
        });
        self.stats.messages_held += 1;
        true
    }

    /// The oldest held message, if the write path has room for it (or it needs none).
    pub(crate) fn next_held(&mut self) -> Option<HeldMessage> {
        if self.hold.is_empty() {
            return None;
        }
        let room = self.has_room();
        let message = self.hold.pop_ready(room)?;
        if let Some(c) = self.conns.get_mut(message.conn) {
            c.messages_held = c.messages_held.saturating_sub(1);
        }
        Some(message)
    }

    /// Forgets what `conn` had held (it closed, or the host is closing it).
    pub(crate) fn drop_held(&mut self, conn: ConnId) {
        if self.hold.is_empty() {
            return;
        }
        let dropped = self.hold.drop_conn(conn);
        if dropped > 0 {
            tracing::debug!(
                conn = conn.0,
                dropped,
                "held messages dropped: connection closed"
            );
        }
        if let Some(c) = self.conns.get_mut(conn) {
            c.messages_held = 0;
        }
    }

    /// Notes a message of `conn` that found the hold full (`reason` says what became of it):
    /// counted, and logged at once or, while they keep coming, once a second with a count.
    pub(crate) fn past_hold(&mut self, conn: ConnId, reason: &'static str) {
        self.stats.messages_past_hold += 1;
        let now = self.now.mono;
        let due = self
            .past_hold_logged
            .is_none_or(|at| now.0 >= at.0.saturating_add(PAST_HOLD_LOG_MS));
        if !due {
            self.past_hold_unlogged += 1;
            return;
        }
        tracing::warn!(
            conn = conn.0,
            reason,
            held = self.hold.len(),
            held_bytes = self.hold.bytes(),
            in_flight = self.path.in_flight(),
            more_since_last = std::mem::take(&mut self.past_hold_unlogged),
            "message past the input hold: the write path is full and the hold too"
        );
        self.past_hold_logged = Some(now);
    }

    /// Issues `txn` (numbered from `server_seq() + 1`, built against the newest state):
    /// records its events in the ring and its receipts in the cache, and hands it to the
    /// driver. Returns its change number. The caller checked [`Kernel::room`].
    pub(crate) fn commit(&mut self, txn: Txn) -> u64 {
        let last = txn.events.last().map_or(0, |e| e.seq);
        let mark = self.seq.mark_after(last).max(txn.reservation.unwrap_or(0));
        let receipts: Vec<Receipt> = txn.receipts.clone();
        let events: Vec<Event> = txn.events.clone();
        let change = self.path.issue(txn, mark);
        self.seq.issue(change.number, mark, &events);
        for r in receipts {
            self.receipts
                .insert(&r.owner, &r.key, r.fingerprint, r.result, change.number);
        }
        let number = change.number;
        self.outbox.push(Output::Commit(Box::new(change)));
        number
    }

    /// `Input::Durable { through }`: retires those changes and lets out what waited on them.
    pub(crate) fn on_durable(&mut self, through: u64) {
        let (retired, mark) = self.path.durable_through(through);
        if retired == 0 {
            return;
        }
        self.stats.commits += retired as u64;
        if let Some(mark) = mark {
            self.seq.durable(mark);
        }
        let durable = self.path.durable();
        self.receipts.durable(durable);
        self.conns.release(&mut self.outbox, durable);
    }

    /// `Input::CommitFailed { number }`, first half: retires what was durable before it and
    /// rolls the log back (numbers, ring, receipts). The host then rebuilds what the failed
    /// changes touched and calls [`Kernel::after_failure`]. `None` for a stale report.
    pub(crate) fn on_commit_failed(&mut self, number: u64) -> Option<Failed> {
        if self
            .path
            .first_in_flight()
            .is_none_or(|first| number < first)
        {
            return None;
        }
        // Writers commit in order: the transaction starting at `number` was tried only after
        // every earlier one was durable.
        self.on_durable(number - 1);
        let failed = self.path.fail(number)?;
        tracing::warn!(
            first = number,
            changes = failed.count,
            "commit failed; rolling back to the last durable state"
        );
        self.stats.commit_failures += failed.count as u64;
        self.seq.roll_back(failed.first_event);
        self.receipts.forget_from(number);
        Some(failed)
    }

    /// `Input::CommitFailed`, second half: covers the numbers the failed changes handed out
    /// with a fresh reservation (nothing newer may show a number the store could lose), then
    /// rewrites what was held on them (see [`OnFail`]).
    pub(crate) fn after_failure(&mut self, failed: &Failed) {
        let cover = if self.seq.uncovered() {
            self.commit(Txn::reservation(self.seq.next_reservation()))
        } else {
            self.path.durable()
        };
        let server_seq = self.seq.current();
        let error = RpcError::commit_failed();
        self.conns.fail_from(
            &mut self.outbox,
            failed.first,
            cover,
            |on_fail| match on_fail {
                OnFail::Error(id) | OnFail::Close(id) => Some(jsonrpc::error_frame(id, &error)),
                OnFail::Reject(r) => Some(jsonrpc::rejection_frame(
                    &r.channel,
                    &r.action,
                    &r.client_id,
                    r.client_seq,
                    server_seq,
                    &error.message,
                )),
                _ => None,
            },
        );
        let durable = self.path.durable();
        self.conns.release(&mut self.outbox, durable);
    }

    /// Reads through the changes in flight (see `log::write_path::View`).
    pub(crate) fn view(&mut self) -> View<'_, S> {
        self.path.view(&mut self.store)
    }

    pub(crate) fn store(&self) -> &S {
        &self.store
    }

    pub(crate) fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    pub(crate) fn into_store(self) -> S {
        self.store
    }

    /// The receipt under `(owner, key)`: from the cache (which holds every one in flight),
    /// else from the store.
    pub(crate) fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Known>, RpcError> {
        if let Some(k) = self.receipts.get(owner, key) {
            return Ok(Some(k.clone()));
        }
        match self.store.receipt(owner, key) {
            Ok(r) => Ok(r.map(|r| Known {
                fingerprint: r.fingerprint,
                result: r.result,
                change: 0,
            })),
            Err(e) => {
                tracing::warn!(error = %e, "receipt read failed");
                Err(RpcError::commit_failed())
            }
        }
    }

    /// The greatest receipt key under `owner` starting with `prefix`: the cache's (which holds
    /// every receipt in flight) or the store's, whichever is greater.
    pub(crate) fn last_receipt_key(
        &mut self,
        owner: &str,
        prefix: &str,
    ) -> Result<Option<String>, StoreError> {
        let stored = self.store.last_receipt_key(owner, prefix)?;
        let cached = self.receipts.last_key(owner, prefix).map(str::to_owned);
        Ok(stored.into_iter().chain(cached).max())
    }

    /// Makes sure the next catalog event has a reserved number, issuing the next block once
    /// half of the current one is used. Fails only when none is left and none can be issued.
    pub(crate) fn reserve_ahead(&mut self) -> Result<(), RpcError> {
        if !self.seq.wants_reservation() {
            return Ok(());
        }
        if let Err(busy) = self.room() {
            return if self.seq.ephemeral_reserved() {
                Ok(())
            } else {
                Err(busy)
            };
        }
        self.commit(Txn::reservation(self.seq.next_reservation()));
        Ok(())
    }

    /// The next catalog number and the change its reservation depends on.
    pub(crate) fn next_ephemeral(&mut self) -> (u64, u64) {
        self.seq.next_ephemeral()
    }

    /// Events after `cursor` on channels `wanted` accepts; `None` past the ring.
    pub(crate) fn replay(
        &self,
        cursor: u64,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<Vec<Arc<str>>> {
        self.seq.replay(cursor, wanted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::store::{Commit, MemStore};
    use crate::HostConfig;

    fn receipt(key: &str) -> Receipt {
        Receipt {
            owner: "o".into(),
            key: key.into(),
            fingerprint: "f".into(),
            result: "null".into(),
        }
    }

    #[test]
    fn the_last_receipt_key_is_the_greater_of_the_cache_and_the_store() {
        let mut store = MemStore::new();
        let stored = crate::log::change::Change {
            number: 1,
            receipts: vec![receipt("dispatch:c:05")],
            ..Default::default()
        };
        store.commit(&stored).expect("commit");
        let mut k = Kernel::new(HostConfig::default(), store, 1, &mut Loaded::default(), 0);
        assert_eq!(
            k.last_receipt_key("o", "dispatch:c:")
                .expect("read")
                .as_deref(),
            Some("dispatch:c:05"),
            "the store's, the cache being empty"
        );
        // A change in flight (the store does not have it yet) with a greater key.
        k.commit(Txn {
            receipts: vec![receipt("dispatch:c:07")],
            ..Txn::default()
        });
        assert_eq!(
            k.last_receipt_key("o", "dispatch:c:")
                .expect("read")
                .as_deref(),
            Some("dispatch:c:07")
        );
        // The store gains a greater one (as a store may hold changes the host has not yet
        // heard are durable): that one.
        let later = crate::log::change::Change {
            number: 2,
            receipts: vec![receipt("dispatch:c:09")],
            ..Default::default()
        };
        k.store_mut().commit(&later).expect("commit");
        assert_eq!(
            k.last_receipt_key("o", "dispatch:c:")
                .expect("read")
                .as_deref(),
            Some("dispatch:c:09")
        );
        assert_eq!(k.last_receipt_key("p", "dispatch:c:").expect("read"), None);
    }
}
