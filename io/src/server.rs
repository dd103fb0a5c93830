//! The production driver: one thread, one mio `Poll`, carrying the core's decisions to sockets.
//!
//! ```text
//!   TCP accept ─► HTTP head (bounded, timed) ─► /healthz: 200, close
//!                                            ─► /axp or /: token, Origin, capacity ─► 101
//!                                            ─► anything else: 4xx, close
//!   WebSocket text message ─► Input::Message     Output::Send  ─► text frame into its buffer
//!   bytes reach the socket ─► Input::Flushed     Output::Close ─► close frame, drain, shutdown
//!   binary / oversized / broken frames ─► close 1003 / 1009 / 1002 and Input::Closed
//!   EOF, reset, peer close ─► Input::Closed (once)
//!   SIGINT / SIGTERM ─► stop accepting, close 1001 to every WebSocket, drain briefly, return
//! ```
//!
//! Each loop turn: wait for events or the earliest deadline, read what is readable (in read
//! rounds of a bounded number of steps per connection, more rounds only while the writes they
//! feed are small: `read_rounds`), fire due timers, drain `poll_output` to `None`, write every
//! connection with pending bytes, report what reached the socket, and repeat.
//!
//! Every connection gets a fresh `ConnId` at accept time (also used as its mio token), so ids are
//! never reused; only connections that become WebSockets are ever shown to the core. The driver
//! logs ids, peers, statuses, close codes and byte counts, never payloads or tokens.

mod buffered_socket;
mod busy_poll;
mod coalesce;
mod driver_limits;
pub mod http;
mod read_rounds;
pub mod websocket;

use std::collections::BTreeSet;
use std::io::{self, Read};
use std::net::{Shutdown, SocketAddr};
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::credentials::{token_from_request, Credentials};
use axhost_core::{ConnId, Host, Input, Now, Output, Role, Store, U64Map};
use buffered_socket::BufferedSocket;
use busy_poll::BusyPoll;
use coalesce::Coalesce;
pub use driver_limits::{
    message_bytes_max_for_role, DriverLimits, DEFAULT_PARTIAL_MESSAGE_BYTES_TOTAL_MAX,
    DEFAULT_PRE_AUTH_SOCKETS_MAX,
};
use http::{Head, Route, Status};
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Token};
use read_rounds::TurnLoad;
pub use read_rounds::MESSAGES_PER_READ_MAX;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use websocket::{BufferPool, FrameReader, PartialBudget, Step};

/// How the driver serves.
pub struct ServeOptions {
    /// Address to bind (`127.0.0.1:0` picks a free port; `on_ready` gets the real one).
    pub listen: SocketAddr,
    /// Transport credentials checked on every WebSocket upgrade.
    pub credentials: Credentials,
    /// When set, an upgrade whose `Origin` header is present and not listed gets 403.
    pub allowed_origins: Option<Vec<String>>,
    /// A WebSocket silent this long gets a ping; silent twice as long, it is closed (1001) and
    /// the core forgets it, its subscriptions and its services. `None` never probes.
    pub keepalive_ms: Option<u64>,
    /// Busy-polling budget in microseconds: while events arrive closer together than this and
    /// the driver is mostly busy, it polls for up to this long before sleeping
    /// (`server/busy_poll.rs`). 0 = off.
    pub busy_poll_us: u64,
    /// Read-coalescing gap in microseconds: while the driver is saturated by peers that do not
    /// batch, it spends a gap before each turn, starting at this and adapting to the peer
    /// between 65% and 200% of it, and reads one round per turn (`server/coalesce.rs`). 0 = off.
    pub coalesce_us: u64,
    /// The driver's own bounds: unauthenticated sockets and partial messages
    /// (`server/driver_limits.rs`).
    pub driver_limits: DriverLimits,
}

/// Runs `host` on `opts.listen` until SIGINT or SIGTERM. Calls `on_ready` with the bound address
/// once the listener accepts connections. Returns `Ok(())` after a clean shutdown; an `Err` only
/// when the listener, the poller or signal registration fails.
pub fn serve<S: Store>(
    host: Host<S>,
    opts: ServeOptions,
    on_ready: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let mut driver = Driver::new(host, opts)?;
    on_ready(driver.local_addr);
    driver.run()
}

const LISTENER: Token = Token(usize::MAX - 1);
const SIGNALS: Token = Token(usize::MAX - 2);

/// Events taken from one `poll` call.
const EVENTS_PER_POLL_MAX: usize = 1024;

/// Reads of discarded bytes per read round for a connection that is closing.
const DISCARD_READS_PER_ROUND_MAX: usize = 16;

/// A frame reader for a connection that upgraded under `limits`: frames and messages capped at
/// `frame_bytes_max`, starting with the bytes that followed the HTTP head, with a partial-message
/// budget of its own. Public for the `websocket` fuzz target, which reads frames as the server
/// does; the server itself caps each connection lower, by role, and shares one budget
/// ([`role_frame_reader`]).
pub fn frame_reader(limits: &axhost_core::Limits, early: &[u8]) -> FrameReader {
    let max = usize::try_from(limits.frame_bytes_max).unwrap_or(usize::MAX);
    FrameReader::new(max, early)
}

/// The frame reader the driver gives a connection of `role` that upgraded under `limits`:
/// messages capped at [`message_bytes_max_for_role`], partial messages charged to `budget`.
pub fn role_frame_reader(
    limits: &axhost_core::Limits,
    role: Role,
    early: &[u8],
    budget: Rc<PartialBudget>,
) -> FrameReader {
    FrameReader::sharing(message_bytes_max_for_role(limits, role), early, budget)
}

/// Connections whose input queue a coalescing turn looks at (`Driver::filled_share`): one per
/// flat-out sender, and a few senders at most are what makes a host coalesce.
const FILLED_SHARE_SAMPLES_MAX: usize = 8;

/// Time a closing WebSocket gets to drain its buffer and see the peer's EOF before it is dropped.
const CLOSING_LINGER_MS: u64 = 5_000;

/// The same for a socket answered over plain HTTP (an error status, or `/healthz`): its answer
/// is a few hundred bytes, gone at once; the linger only spares the peer a reset while its
/// request's last bytes are still read. Short, because such sockets cost the pre-authentication
/// budget.
const ANSWERED_LINGER_MS: u64 = 1_000;

/// Time a shutdown gives WebSockets to receive their close frames before the driver returns.
const SHUTDOWN_DRAIN_MS: u64 = 2_000;

/// Pause before accepting again after an accept error such as running out of descriptors.
const ACCEPT_RETRY_MS: u64 = 100;

/// At most one warning per this interval about sockets dropped at accept; the rest are counted.
const OVERLOAD_LOG_MS: u64 = 1_000;

/// Cap on one WebSocket's unsent bytes that the driver added itself (pongs, keepalive pings,
/// the close frame), which the core does not count. Core frames are not counted here: the core
/// bounds them (`queue_bytes_hard`, plus one reply it deliberately lets exceed that so a large
/// snapshot or replay reaches a reader that keeps up). A peer that sends pings and never reads
/// their pongs reaches this; an honest one never queues more than a few frames of its own.
const OWN_BYTES_MAX: u64 = 1 << 20;

/// Loop passes of "drain outputs, write sockets, report flushed" per turn.
const FLUSH_PASSES_MAX: usize = 4;

/// A driver timer: a connection's HTTP head is late, or its closing linger ran out.
type Deadline = (u64, u64);

/// What one socket is doing.
enum Phase {
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

struct Slot {
    peer: SocketAddr,
    phase: Phase,
    /// Whether the socket is registered for WRITABLE too (only while bytes are stuck).
    writable: bool,
    /// Listed in `Driver::backlog` (to read this turn) / `Driver::dirty` (to write).
    in_backlog: bool,
    in_dirty: bool,
    /// The last turn in which the core sent this connection a frame (`TurnLoad::destinations`).
    sent_turn: u64,
}

impl Slot {
    fn socket(&self) -> Option<&BufferedSocket> {
        match &self.phase {
            Phase::Head { socket, .. }
            | Phase::Closing { socket, .. }
            | Phase::Open { socket, .. } => Some(socket),
            Phase::Moving => None,
        }
    }

    fn socket_mut(&mut self) -> Option<&mut BufferedSocket> {
        match &mut self.phase {
            Phase::Head { socket, .. }
            | Phase::Closing { socket, .. }
            | Phase::Open { socket, .. } => Some(socket),
            Phase::Moving => None,
        }
    }
}

/// The monotonic clock the core sees: milliseconds since the driver started.
struct Clock {
    start: std::time::Instant,
}

impl Clock {
    fn now(&self) -> Now {
        let mono = u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX);
        let wall_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Now {
            mono: axhost_core::Instant(mono),
            wall_unix_ms,
        }
    }
}

struct Driver<S: Store> {
    host: Host<S>,
    poll: Poll,
    listener: Option<TcpListener>,
    signals: Signals,
    local_addr: SocketAddr,
    credentials: Credentials,
    allowed_origins: Option<Vec<String>>,
    clock: Clock,
    /// Looked up per message (and never iterated in an order that matters).
    slots: U64Map<Slot>,
    /// Carries out the core's `Output::Commit`s on this thread.
    writer: axhost_core::drive::SyncWriter,
    /// The next connection id; ids start at 1 and are never reused.
    next_id: u64,
    /// Head timeouts, keepalive probes and closing lingers. Invariant: one entry per `Head` or
    /// `Closing` slot, and per `Open` slot while keepalive is on.
    deadlines: BTreeSet<Deadline>,
    /// Ids of the `Head` slots. Ids grow with accept order, so the first is the oldest.
    /// Invariant: exactly the slots in the `Head` phase.
    heads: BTreeSet<u64>,
    /// The `Closing` slots answered over HTTP (`answered`), as (linger deadline, id): the first
    /// was answered first. With `heads`, the pre-authentication table: at most
    /// `pre_auth_sockets_max` together.
    answered: BTreeSet<Deadline>,
    /// The other `Closing` slots, WebSockets that closed, likewise; at most `connections_max`.
    closed_websockets: BTreeSet<Deadline>,
    driver_limits: DriverLimits,
    /// What every connection's partial messages hold, shared by their frame readers.
    partial_budget: Rc<PartialBudget>,
    /// Sockets dropped at accept (or evicted to make room) since the last warning about it.
    overload_dropped: u64,
    /// When the next such warning may be logged.
    overload_log_ms: u64,
    keepalive_ms: Option<u64>,
    /// Connections to read this turn even without a new readiness event (mio is edge-triggered),
    /// each listed once (`Slot::in_backlog`). Ids of slots dropped since may linger; skipped.
    backlog: Vec<u64>,
    /// Connections with bytes to write this turn, each listed once (`Slot::in_dirty`).
    dirty: Vec<u64>,
    /// Loop turns so far; `Slot::sent_turn` compares with it.
    turn_no: u64,
    /// What the current turn has read and queued, for `read_rounds`.
    load: TurnLoad,
    accept_retry_ms: Option<u64>,
    /// Set once a signal asked us to stop: the time by which the driver returns regardless.
    stop_by_ms: Option<u64>,
    busy_poll: BusyPoll,
    coalesce: Coalesce,
    /// Connections that filled their share of the last coalescing round (up to
    /// `FILLED_SHARE_SAMPLES_MAX`): the next turn asks the kernel how much input each still
    /// has queued, and the gap adapts to the deepest (`Coalesce::queue_observed`).
    filled_share: Vec<u64>,
    /// Read buffers lent to connections while they read.
    read_buffers: BufferPool,
    /// When the last wait returned: the work since then is the current turn.
    woke_at: std::time::Instant,
}

impl<S: Store> Driver<S> {
    fn new(host: Host<S>, opts: ServeOptions) -> io::Result<Driver<S>> {
        let poll = Poll::new()?;
        let mut listener = TcpListener::bind(opts.listen)?;
        let local_addr = listener.local_addr()?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        let mut signals = Signals::new([SIGINT, SIGTERM])?;
        poll.registry()
            .register(&mut signals, SIGNALS, Interest::READABLE)?;
        tracing::info!(addr = %local_addr, "listening");
        Ok(Driver {
            host,
            poll,
            listener: Some(listener),
            signals,
            local_addr,
            credentials: opts.credentials,
            allowed_origins: opts.allowed_origins,
            keepalive_ms: opts.keepalive_ms.filter(|&ms| ms > 0),
            clock: Clock {
                start: std::time::Instant::now(),
            },
            slots: U64Map::default(),
            writer: axhost_core::drive::SyncWriter::default(),
            next_id: 1,
            deadlines: BTreeSet::new(),
            heads: BTreeSet::new(),
            answered: BTreeSet::new(),
            closed_websockets: BTreeSet::new(),
            partial_budget: PartialBudget::new(
                usize::try_from(opts.driver_limits.partial_message_bytes_total_max)
                    .unwrap_or(usize::MAX),
            ),
            driver_limits: opts.driver_limits,
            overload_dropped: 0,
            overload_log_ms: 0,
            backlog: Vec::new(),
            turn_no: 0,
            load: TurnLoad::default(),
            dirty: Vec::new(),
            accept_retry_ms: None,
            stop_by_ms: None,
            busy_poll: BusyPoll::new(Duration::from_micros(opts.busy_poll_us)),
            coalesce: Coalesce::new(Duration::from_micros(opts.coalesce_us)),
            filled_share: Vec::with_capacity(FILLED_SHARE_SAMPLES_MAX),
            read_buffers: BufferPool::default(),
            woke_at: std::time::Instant::now(),
        })
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL_MAX);
        loop {
            self.wait(&mut events)?;
            let mut accept = false;
            let mut signalled = false;
            for event in events.iter() {
                match event.token() {
                    LISTENER => accept = true,
                    SIGNALS => signalled = true,
                    Token(t) => {
                        let id = t as u64;
                        if event.is_read_closed() || event.is_error() {
                            // This edge is the only report of the FIN: read through to it.
                            if let Some(socket) = self.slots.get_mut(&id).and_then(Slot::socket_mut)
                            {
                                socket.mark_read_closed();
                            }
                        }
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.mark_readable(id);
                        }
                        if event.is_writable() || event.is_write_closed() {
                            self.mark_dirty(id);
                        }
                    }
                }
            }
            if signalled && self.on_signal() {
                tracing::warn!("second signal: stopping without waiting for peers");
                return Ok(());
            }
            let retry_due = self
                .accept_retry_ms
                .is_some_and(|at| self.clock.now().mono.0 >= at);
            if accept || retry_due {
                self.accept();
            }
            self.turn();
            if let Some(stop_by_ms) = self.stop_by_ms {
                if self.slots.is_empty() || self.clock.now().mono.0 >= stop_by_ms {
                    tracing::info!(sockets_left = self.slots.len(), "stopped");
                    return Ok(());
                }
            }
        }
    }

    /// Waits for events until the next deadline: first the coalescing gap, when the driver is
    /// coalescing (`server/coalesce.rs`), then a poll without sleeping, then more of them while
    /// the busy-polling rule says the next event is near and the driver is busy anyway, and
    /// last a poll that sleeps.
    fn wait(&mut self, events: &mut Events) -> io::Result<()> {
        let started = std::time::Instant::now();
        let worked = started.saturating_duration_since(self.woke_at);
        let (gap, change) = self.coalesce.gap_before_wait(started, self.load.steps);
        log_coalesce(change);
        // Spun, not slept: the driver is saturated, and a short sleep can take many times its
        // length on a VM.
        while started.elapsed() < gap {
            std::hint::spin_loop();
        }
        events.clear();
        let mut zero_polled = false;
        if self.coalesce.enabled() {
            // Whether input is already there is what coalescing starts and stops on.
            self.poll_once(events, Some(Duration::ZERO))?;
            zero_polled = true;
        }
        let polled = std::time::Instant::now();
        let waiting = !events.is_empty() || !self.backlog.is_empty();
        log_coalesce(self.coalesce.observe(polled, waiting));
        let timeout = self.poll_timeout();
        let spin = self.busy_poll.spin_for(timeout);
        while !spin.is_zero() && events.is_empty() && polled.elapsed() < spin {
            // Pause first: a zero-timeout poll may have just found nothing.
            std::hint::spin_loop();
            self.poll_once(events, Some(Duration::ZERO))?;
            zero_polled = true;
        }
        // A zero timeout is served by a zero-timeout poll above, when one ran.
        if events.is_empty() && !(zero_polled && timeout == Some(Duration::ZERO)) {
            self.poll_once(events, timeout.map(|t| t.saturating_sub(polled.elapsed())))?;
        }
        self.woke_at = std::time::Instant::now();
        let waited = self.woke_at.saturating_duration_since(polled);
        log_coalesce(self.coalesce.after_wait(self.woke_at, waited));
        // The gap is work, not waiting: busy-polling judges the wait from the first poll.
        self.busy_poll
            .cycle(worked + gap, self.woke_at.saturating_duration_since(polled));
        Ok(())
    }

    /// One `epoll_wait`; an interrupted wait returns with no events.
    fn poll_once(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        match self.poll.poll(events, timeout) {
            Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
            _ => Ok(()),
        }
    }

    /// One turn after the events are sorted: read (in rounds, `read_rounds`), time, decide,
    /// write.
    fn turn(&mut self) {
        self.turn_no += 1;
        if self.coalesce.on() {
            // After the gap, so what the peer wrote meanwhile is counted.
            let deepest = self
                .filled_share
                .iter()
                .filter_map(|id| self.slots.get(id)?.socket()?.queued_input())
                .max();
            self.coalesce.queue_observed(deepest);
        }
        self.filled_share.clear();
        self.load = TurnLoad {
            coalescing: self.coalesce.on(),
            ..TurnLoad::default()
        };
        while !self.backlog.is_empty() && (self.load.rounds == 0 || self.load.read_again()) {
            for id in std::mem::take(&mut self.backlog) {
                match self.slots.get_mut(&id) {
                    Some(slot) => slot.in_backlog = false,
                    None => continue,
                }
                let steps = self.on_readable(id);
                self.load.steps += steps;
            }
            self.load.rounds += 1;
        }
        if self.load.rounds > 1 {
            let l = self.load;
            tracing::debug!(
                rounds = l.rounds,
                steps = l.steps,
                frames = l.frames,
                destinations = l.destinations,
                "turn read in rounds"
            );
        }
        let now = self.clock.now();
        if self.host.poll_timeout().is_some_and(|at| at <= now.mono) {
            self.host.handle_timeout(now);
        }
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now.mono.0 {
                break;
            }
            self.deadlines.remove(&(at, id));
            self.on_deadline(id);
        }
        for _ in 0..FLUSH_PASSES_MAX {
            self.drain_outputs(now);
            if self.dirty.is_empty() {
                break;
            }
            for id in std::mem::take(&mut self.dirty) {
                match self.slots.get_mut(&id) {
                    Some(slot) => slot.in_dirty = false,
                    None => continue,
                }
                self.write(id);
            }
        }
        // Never sleep on undrained decisions; anything this queues is written next turn (the
        // poll timeout is zero while `dirty` is not empty).
        self.drain_outputs(now);
    }

    /// Milliseconds until the earliest of: a core timer, a driver deadline, an accept retry, the
    /// shutdown bound. Zero when connections wait on the read backlog.
    fn poll_timeout(&self) -> Option<Duration> {
        if !self.backlog.is_empty() || !self.dirty.is_empty() {
            return Some(Duration::ZERO);
        }
        let earliest = [
            self.host.poll_timeout().map(|at| at.0),
            self.deadlines.first().map(|&(at, _)| at),
            self.accept_retry_ms,
            self.stop_by_ms,
        ]
        .into_iter()
        .flatten()
        .min()?;
        let now_ms = self.clock.now().mono.0;
        Some(Duration::from_millis(earliest.saturating_sub(now_ms)))
    }

    /// Returns true when this is the second stop request (stop at once).
    fn on_signal(&mut self) -> bool {
        let stop = self.signals.pending().any(|s| s == SIGINT || s == SIGTERM);
        if !stop {
            return false;
        }
        if self.stop_by_ms.is_some() {
            return true;
        }
        let now = self.clock.now();
        tracing::info!(connections = self.host.connection_count(), "stopping");
        self.stop_by_ms = Some(now.mono.0.saturating_add(SHUTDOWN_DRAIN_MS));
        if let Some(mut listener) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        self.accept_retry_ms = None;
        let ids: Vec<u64> = self.slots.keys().copied().collect();
        for id in ids {
            let open = self
                .slots
                .get(&id)
                .is_some_and(|s| matches!(s.phase, Phase::Open { .. }));
            if open {
                self.close(id, 1001, "Host shutting down", now);
            } else if self
                .slots
                .get(&id)
                .is_some_and(|s| matches!(s.phase, Phase::Head { .. }))
            {
                self.drop_slot(id, "shutdown", now);
            }
        }
        false
    }

    /// Accepts waiting sockets into the pre-authentication table (`server/driver_limits.rs`):
    /// at `pre_auth_sockets_max`, each newcomer first evicts one (`evict_pre_auth`). WebSockets
    /// are never evicted for a newcomer, so no flood of sockets without a token reaches them.
    fn accept(&mut self) {
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

    /// Reads what connection `id` has for this read round; returns its share of the round as
    /// `read_rounds` counts it.
    fn on_readable(&mut self, id: u64) -> usize {
        let Some(slot) = self.slots.get_mut(&id) else {
            return 0;
        };
        if let Some(socket) = slot.socket_mut() {
            socket.start_read_round();
        }
        match slot.phase {
            Phase::Head { .. } => {
                self.read_head(id);
                0
            }
            Phase::Open { .. } => self.read_messages(id),
            Phase::Closing { .. } => {
                // Discarding counts as a full share: a closing peer that keeps sending earns no
                // extra rounds.
                self.read_discard(id);
                MESSAGES_PER_READ_MAX
            }
            Phase::Moving => 0,
        }
    }

    fn on_deadline(&mut self, id: u64) {
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

    /// Reads the request head until it is complete, invalid, or the socket has nothing more.
    fn read_head(&mut self, id: u64) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Head {
            socket, head, read, ..
        } = &mut slot.phase
        else {
            return;
        };
        let mut chunk = [0u8; 4096];
        let outcome = loop {
            let room = http::HEAD_BYTES_MAX
                .saturating_sub(head.len())
                .min(chunk.len());
            match socket.read(&mut chunk[..room.max(1)]) {
                Ok(0) => break Err("closed before a request head"),
                Ok(n) => {
                    head.extend_from_slice(&chunk[..n]);
                    match http::parse_head(head) {
                        Head::Partial => {}
                        decided => break Ok(decided),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    *read = true;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Err("read error before a request head"),
            }
        };
        match outcome {
            Err(why) => self.drop_slot(id, why, now),
            Ok(Head::Complete { request, len }) => self.on_request(id, &request, len, now),
            Ok(Head::Invalid(status)) => self.respond(id, status, "", now),
            Ok(Head::Partial) => {}
        }
    }

    fn on_request(&mut self, id: u64, request: &http::Request, head_len: usize, now: Now) {
        let key = match http::route(request) {
            Route::Health => return self.respond(id, Status::Ok, &http::health_body(), now),
            Route::Reject(status) => return self.respond(id, status, "", now),
            Route::Upgrade { key } => key,
        };
        let token = token_from_request(&request.headers, request.query.as_deref());
        let Some(principal) = token.and_then(|t| self.credentials.authenticate(&t)) else {
            return self.respond(id, Status::Unauthorized, "", now);
        };
        let origins = self.allowed_origins.as_deref();
        if !http::origin_allowed(origins, request.header("origin")) {
            return self.respond(id, Status::Forbidden, "", now);
        }
        let limits = self.host.limits();
        if self.host.connection_count() >= limits.connections_max as usize {
            return self.respond(id, Status::ServiceUnavailable, "", now);
        }
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Head {
            mut socket,
            head,
            deadline_ms,
            ..
        } = std::mem::replace(&mut slot.phase, Phase::Moving)
        else {
            return;
        };
        self.deadlines.remove(&(deadline_ms, id));
        self.heads.remove(&id);
        socket.push_raw(&http::switching_protocols(&key));
        // Bytes after the head were sent early (frames); the reader parses them first.
        let early = head.get(head_len..).unwrap_or_default();
        let reader = Box::new(role_frame_reader(
            self.host.limits(),
            principal.role,
            early,
            self.partial_budget.clone(),
        ));
        let probe_ms = self.keepalive_ms.map(|ms| now.mono.0.saturating_add(ms));
        if let Some(at) = probe_ms {
            self.deadlines.insert((at, id));
        }
        slot.phase = Phase::Open {
            socket,
            reader,
            heard_ms: now.mono.0,
            probe_ms,
        };
        tracing::info!(
            conn = id,
            peer = %slot.peer,
            role = principal.role.as_str(),
            path = request.path.as_str(),
            "websocket open"
        );
        self.host.handle(
            now,
            Input::Connected {
                conn: ConnId(id),
                principal,
            },
        );
        self.mark_dirty(id);
        // More may already wait in the socket or in the early bytes; edge-triggered polls would
        // not say so again.
        self.mark_readable(id);
    }

    /// Answers a request that ends the connection, then lingers until the answer is out.
    fn respond(&mut self, id: u64, status: Status, body: &str, now: Now) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Head {
            mut socket,
            deadline_ms,
            ..
        } = std::mem::replace(&mut slot.phase, Phase::Moving)
        else {
            return;
        };
        self.deadlines.remove(&(deadline_ms, id));
        self.heads.remove(&id);
        socket.push_raw(&http::response(status, body));
        if status == Status::Ok {
            tracing::debug!(conn = id, peer = %slot.peer, status = status.code(), "http");
        } else {
            tracing::info!(conn = id, peer = %slot.peer, status = status.code(), "http refused");
        }
        self.linger(id, socket, true, now);
    }

    /// Puts `socket` into the closing phase of slot `id`: drain, shut down, wait for EOF.
    /// `answered`: an HTTP answer, in the pre-authentication table; otherwise a WebSocket, and
    /// past `connections_max` closing ones the oldest is dropped at once.
    fn linger(&mut self, id: u64, socket: BufferedSocket, answered: bool, now: Now) {
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
        self.mark_readable(id);
    }

    /// Reads up to a read round's worth of WebSocket messages (`MESSAGES_PER_READ_MAX`) and
    /// feeds the core, carrying out the core's decisions after each one; returns the steps taken
    /// (frames, pings and fragments included, so a flood of control frames earns no extra read
    /// rounds). Doing that at once, rather than after the whole turn, frees each forwarded frame
    /// right after it is copied into its socket's buffer, while it is still in cache, and keeps the allocator recycling one buffer instead of holding a turn's worth (a
    /// batch of allocations and then a batch of frees took `malloc` off its fast path: 10% of
    /// the host at 64->64).
    fn read_messages(&mut self, id: u64) -> usize {
        let now = self.clock.now();
        let conn = ConnId(id);
        let mut heard = false;
        let mut stop = Stop::Budget;
        let mut steps = 0;
        for _ in 0..MESSAGES_PER_READ_MAX {
            let Some(slot) = self.slots.get_mut(&id) else {
                return steps;
            };
            let Phase::Open { socket, reader, .. } = &mut slot.phase else {
                // The core closed it while handling the last message.
                return steps;
            };
            steps += 1;
            let step = reader.read_from(socket, &mut self.read_buffers);
            socket.push_answer(&step);
            match step {
                Step::Text(text) => {
                    heard = true;
                    self.host.handle(now, Input::Message { conn, text });
                    self.drain_outputs(now);
                }
                Step::Ping(_) => {
                    heard = true;
                    self.mark_dirty(id);
                }
                Step::Pong(_) | Step::Fragment => heard = true,
                Step::Close(code) => {
                    heard = true;
                    stop = Stop::PeerClosed(code.unwrap_or(1005));
                    break;
                }
                Step::Fail((code, reason)) => {
                    stop = Stop::Close(code, reason);
                    break;
                }
                Step::Drained => {
                    stop = Stop::Drained;
                    break;
                }
                Step::Eof => {
                    // RFC 6455 7.1.5: a connection closed without a close frame is code 1006.
                    // The peer may still read (half-close), so it is closed like one that sent a
                    // close frame: replies to its last frames drain, bounded by the linger.
                    stop = Stop::PeerClosed(1006);
                    break;
                }
                Step::Error(_) => {
                    stop = Stop::Gone("transport error");
                    break;
                }
            }
        }
        if let Some(Phase::Open {
            heard_ms, reader, ..
        }) = self.slots.get_mut(&id).map(|s| &mut s.phase)
        {
            if heard {
                // Any frame, pongs included, shows the peer is there; the keepalive deadline
                // looks at this when it comes (no timer churn per message).
                *heard_ms = now.mono.0;
            }
            reader.park(&mut self.read_buffers);
        }
        match stop {
            Stop::Drained => {}
            Stop::Budget => {
                // Edge-triggered: no new event will say the rest is there. Read it in the next
                // round or turn.
                self.mark_readable(id);
                if self.load.coalescing && self.filled_share.len() < FILLED_SHARE_SAMPLES_MAX {
                    self.filled_share.push(id);
                }
            }
            Stop::Close(code, reason) => self.close(id, code, reason, now),
            Stop::PeerClosed(code) => {
                tracing::info!(conn = id, code, "peer closed");
                self.close_with(id, None, now);
            }
            Stop::Gone(why) => self.drop_slot(id, why, now),
        }
        steps
    }

    /// Reads and throws away what a closing peer still sends, watching for its EOF.
    fn read_discard(&mut self, id: u64) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Closing {
            socket,
            shut,
            peer_eof,
            ..
        } = &mut slot.phase
        else {
            return;
        };
        let mut sink = [0u8; 4096];
        for _ in 0..DISCARD_READS_PER_ROUND_MAX {
            match socket.read(&mut sink) {
                Ok(0) => {
                    *peer_eof = true;
                    if *shut {
                        self.drop_slot(id, "closed", now);
                    }
                    return;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.drop_slot(id, "closed (reset)", now),
            }
        }
        self.mark_readable(id);
    }

    /// Takes every decision the core made and carries it out (buffers; `write` sends).
    fn drain_outputs(&mut self, now: Now) {
        while let Some(output) = self.host.poll_output() {
            match output {
                Output::Send { conn, frame } => {
                    let Some(slot) = self.slots.get_mut(&conn.0) else {
                        continue;
                    };
                    if let Phase::Open { socket, .. } = &mut slot.phase {
                        socket.push_text(frame.as_bytes());
                        if !std::mem::replace(&mut slot.in_dirty, true) {
                            self.dirty.push(conn.0);
                        }
                        self.load.frames += 1;
                        self.load.bytes += frame.as_bytes().len();
                        if std::mem::replace(&mut slot.sent_turn, self.turn_no) != self.turn_no {
                            self.load.destinations += 1;
                        }
                    }
                    self.host.recycle(frame);
                }
                Output::Close { conn, code, reason } => {
                    self.close(conn.0, code.code(), reason, now)
                }
                // For now committed here, on the loop thread; what the outcome releases comes
                // out of this same loop.
                Output::Commit(change) => self.writer.commit(&mut self.host, now, &change),
            }
        }
    }

    /// Closes an open WebSocket with a close frame and tells the core it is gone.
    fn close(&mut self, id: u64, code: u16, reason: &'static str, now: Now) {
        tracing::info!(conn = id, code, reason, "closing");
        self.close_with(id, Some((code, reason)), now);
    }

    /// Moves an open WebSocket to the closing phase, appending our close frame when `frame` is
    /// set (a peer-initiated close already has our reply in the buffer), and reports
    /// `Input::Closed`. Frames the core sent before the close stay ahead of it in the buffer.
    fn close_with(&mut self, id: u64, frame: Option<(u16, &'static str)>, now: Now) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        if !matches!(slot.phase, Phase::Open { .. }) {
            // Already closing (the core may close a connection the peer just closed).
            return;
        }
        let Phase::Open {
            mut socket,
            probe_ms,
            ..
        } = std::mem::replace(&mut slot.phase, Phase::Moving)
        else {
            return;
        };
        if let Some(at) = probe_ms {
            self.deadlines.remove(&(at, id));
        }
        if let Some((code, reason)) = frame {
            socket.push_close(code, reason);
        }
        self.host.handle(now, Input::Closed { conn: ConnId(id) });
        self.linger(id, socket, false, now);
    }

    /// Writes a connection's pending bytes and reports core frames that reached the socket.
    fn write(&mut self, id: u64) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Some(socket) = slot.socket_mut() else {
            return;
        };
        let drained = match socket.send() {
            Ok(drained) => drained,
            Err(e) => {
                let why = if e.kind() == io::ErrorKind::BrokenPipe {
                    "peer gone"
                } else {
                    "write error"
                };
                return self.drop_slot(id, why, now);
            }
        };
        let flushed = socket.settle();
        let own_pending = socket.own_pending_bytes();
        if drained == slot.writable {
            let interest = if drained {
                Interest::READABLE
            } else {
                Interest::READABLE | Interest::WRITABLE
            };
            let token = Token(id as usize);
            let registered = slot
                .socket_mut()
                .map(|w| self.poll.registry().reregister(&mut w.tcp, token, interest));
            if let Some(Err(e)) = registered {
                tracing::warn!(conn = id, error = %e, "reregister failed");
                return self.drop_slot(id, "reregister failed", now);
            }
            slot.writable = !drained;
        }
        match &mut slot.phase {
            Phase::Open { .. } => {
                if flushed > 0 {
                    self.host.handle(
                        now,
                        Input::Flushed {
                            conn: ConnId(id),
                            bytes: flushed,
                        },
                    );
                }
                if own_pending > OWN_BYTES_MAX {
                    tracing::warn!(
                        conn = id,
                        peer = %slot.peer,
                        own_pending,
                        "peer does not read the control frames it asks for; closing"
                    );
                    self.close(id, 1008, "Control frames not read", now);
                }
            }
            Phase::Closing {
                socket,
                shut,
                peer_eof,
                ..
            } if drained && !*shut => {
                *shut = true;
                let _ = socket.tcp.shutdown(Shutdown::Write);
                if *peer_eof {
                    self.drop_slot(id, "closed", now);
                }
            }
            _ => {}
        }
    }

    /// Lists `id` to be read this turn (once).
    fn mark_readable(&mut self, id: u64) {
        if let Some(slot) = self.slots.get_mut(&id) {
            if !std::mem::replace(&mut slot.in_backlog, true) {
                self.backlog.push(id);
            }
        }
    }

    /// Lists `id` to be written this turn (once).
    fn mark_dirty(&mut self, id: u64) {
        if let Some(slot) = self.slots.get_mut(&id) {
            if !std::mem::replace(&mut slot.in_dirty, true) {
                self.dirty.push(id);
            }
        }
    }

    /// Forgets a socket at once. An open WebSocket is reported closed to the core.
    fn drop_slot(&mut self, id: u64, why: &'static str, now: Now) {
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

/// Why a read round on a WebSocket stopped.
enum Stop {
    /// The socket has nothing more for now.
    Drained,
    /// The round's step budget ran out; more may wait.
    Budget,
    /// We close it with this code and reason.
    Close(u16, &'static str),
    /// The peer sent a close frame with this code (1005: none), or only its EOF (1006).
    PeerClosed(u16),
    /// It is gone without a close handshake.
    Gone(&'static str),
}

/// Logs a change of the coalescing state (at most fifty a second: `coalesce::HOLD`).
fn log_coalesce(change: Option<coalesce::Change>) {
    match change {
        Some(coalesce::Change::Started) => tracing::debug!("read coalescing started"),
        Some(coalesce::Change::Stopped(why)) => {
            tracing::debug!(?why, "read coalescing stopped");
        }
        None => {}
    }
}
