//! The production driver: one thread, one mio `Poll`, carrying the core's decisions to sockets.
//!
//! ```text
//!   TCP accept ─► HTTP head (bounded, timed) ─► /healthz: 200, close
//!                                            ─► /axp or /: token, Origin, capacity ─► 101
//!                                            ─► anything else: 4xx, close
//!   WebSocket text message ─► Input::Message     Output::Send  ─► text frame into its buffer
//!   bytes reach the socket ─► Input::Flushed     Output::Close ─► close frame, drain, shutdown
//!   writer outcome (waker) ─► Input::Durable     Output::Commit ─► the writer thread
//!                             / CommitFailed                       (`writer.rs`)
//!   binary / oversized / broken frames ─► close 1003 / 1009 / 1002 and Input::Closed
//!   EOF, reset, peer close ─► Input::Closed (once)
//!   SIGINT / SIGTERM ─► stop accepting, let the writer settle (what it makes durable is
//!                       answered), close 1001 to every WebSocket, drain briefly, finish the
//!                       writer, return
//! ```
//!
//! Each loop turn: wait for events or the earliest deadline, read what is readable (in read
//! rounds of a bounded number of steps per connection, more rounds only while the writes they
//! feed are small: `read_rounds`), fire due timers, feed the writer's outcomes, drain
//! `poll_output` to `None` (handing commits to the writer), write every connection with pending
//! bytes, report what reached the socket, and repeat. The loop never waits for the disk, except
//! when the writer's queue budget is spent (`writer.rs`). While the core takes no input (its
//! write path is full: `Host::accepting_input`), WebSockets are not read at all until the
//! writer's outcomes free room (`input_gate`).
//!
//! Every connection gets a fresh `ConnId` at accept time (also used as its mio token), so ids are
//! never reused; only connections that become WebSockets are ever shown to the core. The driver
//! logs ids, peers, statuses, close codes and byte counts, never payloads or tokens.

//!
//! This file holds the driver's state and entry points; what the driver does is split by
//! concept: `turn` (the event loop), `accept` (the pre-authentication table), `handshake`
//! (request head to 101 or an HTTP answer), `traffic` (WebSocket reads, the core's outputs,
//! writes and closes), `slots` (each socket's phase and timers), `shutdown` (signals),
//! `durability` (the writer thread's side) and `input_gate` (reading paused while the core's
//! write path is full).

mod accept;
mod buffered_socket;
mod busy_poll;
mod coalesce;
mod driver_limits;
mod durability;
mod handshake;
pub mod http;
mod input_gate;
mod read_rounds;
mod shutdown;
mod slots;
mod traffic;
mod turn;
pub mod websocket;

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::credentials::Credentials;
use crate::writer::{BatchStore, Writer};
use axhost_core::{Change, Host, Now, Role, Store, U64Map};
use busy_poll::BusyPoll;
use coalesce::Coalesce;
pub use driver_limits::{
    message_bytes_max_for_role, DriverLimits, DEFAULT_PARTIAL_MESSAGE_BYTES_TOTAL_MAX,
    DEFAULT_PRE_AUTH_SOCKETS_MAX,
};
use input_gate::InputGate;
use mio::net::TcpListener;
use mio::{Interest, Poll, Token};
use read_rounds::TurnLoad;
pub use read_rounds::MESSAGES_PER_READ_MAX;
use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook_mio::v1_0::Signals;
use slots::{Deadline, Slot};
use websocket::{BufferPool, FrameReader, PartialBudget};

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
    /// Writer spin in microseconds: after a commit, the writer thread polls its queue for up to
    /// this long before sleeping, while changes come that close together (`writer.rs`,
    /// "Waiting"). 0 = off.
    pub writer_spin_us: u64,
    /// The driver's own bounds: unauthenticated sockets and partial messages
    /// (`server/driver_limits.rs`).
    pub driver_limits: DriverLimits,
}

/// Runs `host` on `opts.listen` until SIGINT or SIGTERM. Calls `on_ready` with the bound address
/// once the listener accepts connections. Returns `Ok(())` after a clean shutdown; an `Err` only
/// when the listener, the poller or signal registration fails.
pub fn serve<S: Store, W: BatchStore<Change = Box<Change>>>(
    host: Host<S>,
    store_writes: W,
    opts: ServeOptions,
    on_ready: impl FnOnce(SocketAddr),
) -> io::Result<()> {
    let mut driver = Driver::new(host, store_writes, opts)?;
    on_ready(driver.local_addr);
    let result = driver.run();
    // What the last turns handed over still becomes durable (no one sees it: every
    // WebSocket is closed by now).
    driver
        .writer
        .finish(Duration::from_millis(SHUTDOWN_WRITER_MS));
    result
}

const LISTENER: Token = Token(usize::MAX - 1);
const SIGNALS: Token = Token(usize::MAX - 2);
/// The writer thread's waker: outcomes are ready.
const WRITER: Token = Token(usize::MAX - 3);

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

/// Time a shutdown gives the writer to commit what is queued before WebSockets are closed,
/// and again, after the loop stops, for what the last turns queued.
const SHUTDOWN_WRITER_MS: u64 = 5_000;

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
    /// The writer thread that commits the core's `Output::Commit`s (`writer.rs`).
    writer: Writer<Box<Change>>,
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
    /// Reading paused while the core takes no input (the write path is full), and the
    /// connections parked meanwhile (`input_gate`).
    gate: InputGate,
}

impl<S: Store> Driver<S> {
    fn new<W: BatchStore<Change = Box<Change>>>(
        host: Host<S>,
        store_writes: W,
        opts: ServeOptions,
    ) -> io::Result<Driver<S>> {
        let poll = Poll::new()?;
        let spin = Duration::from_micros(opts.writer_spin_us);
        let writer = durability::start_writer(poll.registry(), store_writes, spin)?;
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
            writer,
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
            gate: InputGate::default(),
        })
    }
}
