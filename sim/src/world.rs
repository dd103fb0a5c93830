//! The world: a discrete-event simulation of one host, its store, a network and its clients.
//!
//! Time jumps to the next event. An event is a network delivery (either direction), the host's
//! own deadline, or something on the agenda (a client's turn, a connect, a late `Flushed`
//! report, a service owner's delayed answer, a host restart, a wall-clock jump). After every
//! call into the host the world drains its outputs into the network and the checker checks
//! them against their one cause; after every step it looks at everything.
//!
//! Two phases, as in TigerBeetle's VOPR: the *safety* phase runs a bounded number of steps
//! with every fault on; the *liveness* phase ([`World::settle`]) heals the network, disarms the
//! store, stops the clients' own actions and requires every client that can be connected to
//! converge (initialized, nothing owed, nothing in flight) within a budget.
//!
//! Everything random comes from one seed: the options are drawn first, then each
//! sub-generator's seed, in a fixed order.
//!
//! Stepping (events, the drain, deliveries, connects) is here; the two phases and the helpers
//! named scenarios steer a run with are in `world/phases.rs`, restarts in `world/restart.rs`, the
//! clients' connections and turns in `world/clients.rs`.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use axhost_core::drive::{Commits, Drive};
use axhost_core::{
    Change, ConnId, Host, HostConfig, Input, Instant, Now, Output, Principal, SessionScope,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::checker::{Checker, Digest, Durable, Violation};
use crate::client::SimClient;
use crate::due::Due;
use crate::net::{Direction, SimNet, ToClient, ToHost};
use crate::options::{Options, Ratio, WallDrift};
use crate::roles::Gossip;
use crate::script::Intent;
use crate::store::SimStore;
use crate::writer::{Outcome, SimWriter, WriterStats};

mod clients;
mod phases;
mod restart;

/// Wall-clock origin of every run: 2026-01-01T00:00:00Z.
const EPOCH_MS: u64 = 1_767_225_600_000;
/// Simulated time the liveness phase may take.
pub const SETTLE_BUDGET_MS: u64 = 120_000;
/// Steps the liveness phase may take.
const SETTLE_STEPS_MAX: u64 = 50_000;

/// The driver's clocks: monotonic simulated time and a wall clock that may drift.
struct SimClock {
    mono_ms: u64,
    wall_offset_ms: i64,
    drift: WallDrift,
}

impl SimClock {
    fn now(&self) -> Now {
        let linear = match self.drift {
            WallDrift::Linear { ppm } => (self.mono_ms as i64).saturating_mul(ppm) / 1_000_000,
            _ => 0,
        };
        let wall = (EPOCH_MS as i64 + self.mono_ms as i64 + self.wall_offset_ms + linear).max(0);
        Now {
            mono: Instant(self.mono_ms),
            wall_unix_ms: wall as u64,
        }
    }

    fn advance_to(&mut self, at_ms: u64) {
        // Monotonic time never goes back; events due "in the past" run now.
        self.mono_ms = self.mono_ms.max(at_ms);
    }
}

/// Things on the agenda.
#[derive(Clone, Debug)]
enum Event {
    /// A client's turn.
    Turn(usize),
    /// A client opens a connection (if it has none).
    Connect(usize),
    /// The driver reports bytes it wrote late.
    Flushed { conn: ConnId, bytes: u64 },
    /// The host process restarts over its store (cleanly or killed, drawn then).
    Restart,
    /// The host process is killed with commits in flight.
    Crash,
    /// The wall clock jumps.
    WallJump,
    /// A calm client retries a refused handshake on `conn`.
    Handshake { client: usize, conn: ConnId },
    /// A service owner's answer to `host_id`, which it was sent on `conn`, falls due.
    Answer {
        client: usize,
        conn: ConnId,
        host_id: u64,
        /// Host restarts before it was scheduled: host ids mean nothing to a later host.
        generation: u64,
        frame: String,
    },
}

/// Counters for the report.
#[derive(Clone, Debug, Default)]
pub struct Counters {
    /// Host restarts.
    pub restarts: u64,
    /// Client-initiated disconnects.
    pub disconnects: u64,
    /// Closes initiated by the host, delivered to clients.
    pub host_closes: u64,
    /// Clogs started.
    pub clogs: u64,
    /// Host closes by reason.
    pub close_reasons: BTreeMap<&'static str, u64>,
    /// Largest frame the host sent.
    pub frame_bytes_max: u64,
    /// Slow-consumer closes of connections whose handshake answer never arrived.
    pub handshake_slow_closes: u64,
    /// Idle clientId bindings the host released, over every host lifetime.
    pub client_ids_released: u64,
    /// Messages the driver left unread for a while because the host took no input (its write
    /// path was full: backpressure).
    pub unread: u64,
}

/// One run's outcome.
#[derive(Clone, Debug)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// Trace digest.
    pub digest: Digest,
    /// Steps taken, both phases.
    pub steps: u64,
    /// Simulated milliseconds.
    pub sim_ms: u64,
    /// Outputs hashed.
    pub outputs: u64,
    /// The host's final `serverSeq`.
    pub server_seq: u64,
    /// Replica comparisons made by the checker.
    pub comparisons: u64,
    /// World counters.
    pub counters: Counters,
    /// Reconnects answered by replay, by snapshots, and refused.
    pub reconnects: (u64, u64, u64),
    /// Rejection echoes and own accepted echoes seen by clients.
    pub echoes: (u64, u64),
    /// Of those rejections, the chat limits' (`chat_bytes_max`, `chat_bytes_total_max`).
    pub chat_limit_rejections: u64,
    /// Store calls refused on purpose.
    pub store_faults: u64,
    /// What the simulated writer did.
    pub commits: WriterStats,
    /// What the durability oracles checked.
    pub durability: crate::durability::DurabilityStats,
    /// Client-services outcomes the checker saw, by kind.
    pub services: BTreeMap<&'static str, u64>,
}

/// The simulated world. See the module docs.
pub struct World {
    /// The run's configuration.
    pub options: Options,
    rng: ChaCha8Rng,
    clock: SimClock,
    config: HostConfig,
    host: Option<Host<SimStore>>,
    /// The driver's writer: commits the host's changes later, in order, in groups.
    writer: SimWriter<Box<Change>>,
    /// The shared drive loop, handing every output (commits included) to this world.
    drive: Drive,
    net: SimNet,
    /// The clients.
    pub clients: Vec<SimClient>,
    checker: Checker,
    agenda: BTreeMap<(u64, u64), Event>,
    agenda_next: u64,
    conn_next: u64,
    /// Steps taken.
    pub steps: u64,
    /// Calls into the host so far; the host's state can only change with one.
    epoch: u64,
    liveness: bool,
    store_faults_before: u64,
    /// Counters.
    pub counters: Counters,
    /// Print every step to stderr (the CLI's `--trace`).
    pub trace: bool,
    /// Every client has left for good ([`World::depart`]).
    departed: bool,
    /// What clients told each other.
    gossip: Gossip,
    /// Backpressure, as the production driver does it: what reached the host's side of a link
    /// while the host took no input (`Host::accepting_input`), unread, in arrival order, with
    /// whatever of the same connection arrived after it. Read once the writer catches up.
    unread: VecDeque<(ConnId, ToHost)>,
}

impl World {
    /// A world whose options are drawn from `seed` (swarm testing).
    pub fn new(seed: u64) -> World {
        let mut root = ChaCha8Rng::seed_from_u64(seed);
        let options = Options::swarm(seed, &mut root);
        World::build(options, root)
    }

    /// A world with fixed options (scripted scenarios); randomness still comes from the seed.
    pub fn with_options(options: Options) -> World {
        let root = ChaCha8Rng::seed_from_u64(options.seed ^ 0x5eed_5eed_5eed_5eed);
        World::build(options, root)
    }

    fn build(options: Options, mut root: ChaCha8Rng) -> World {
        let host_seed: u64 = root.random();
        let net_rng = ChaCha8Rng::seed_from_u64(root.random());
        let store_rng = ChaCha8Rng::seed_from_u64(root.random());
        let mut rng = ChaCha8Rng::seed_from_u64(root.random());
        let config = HostConfig {
            limits: options.limits.clone(),
            trust_groups: options.trust_groups.clone(),
            ..HostConfig::default()
        };
        let store = SimStore::new(store_rng, options.store_fault);
        // Limits come from `Options`, which validates them in its tests; a refusal is a bug there.
        let host = Host::new(config.clone(), store, host_seed).ok();
        let pool = options.session_ids();
        let clients = (0..options.clients as usize)
            .map(|i| {
                let principal = Arc::new(draw_principal(&mut rng, &options, i));
                let client_rng = ChaCha8Rng::seed_from_u64(rng.random());
                let mut c = SimClient::new(
                    i,
                    principal,
                    format!("client-{i}"),
                    client_rng,
                    pool.clone(),
                );
                c.calm = !options.autonomous;
                c.owners = options.owners;
                c
            })
            .collect();
        let checker = Checker::new(&config);
        // The writer draws from a stream of its own, so the rest of every seed's history stays
        // what it was before commits became asynchronous.
        let writer_rng = ChaCha8Rng::seed_from_u64(options.seed ^ 0x7717_e5c0_ffee_0001);
        let writer = SimWriter::new(options.commits, writer_rng);
        let mut world = World {
            writer,
            drive: Drive::immediate()
                .commits(Commits::Handed)
                .flush_at_once(false)
                .close_at_once(false),
            net: SimNet::new(net_rng, options.latency_ms_min, options.latency_ms_max),
            clock: SimClock {
                mono_ms: 0,
                wall_offset_ms: 0,
                drift: options.wall_drift,
            },
            options,
            rng,
            config,
            host,
            clients,
            checker,
            agenda: BTreeMap::new(),
            agenda_next: 0,
            conn_next: 1,
            steps: 0,
            epoch: 0,
            liveness: false,
            store_faults_before: 0,
            counters: Counters::default(),
            trace: false,
            departed: false,
            gossip: Gossip::default(),
            unread: VecDeque::new(),
        };
        world.seed_agenda();
        world
    }

    fn seed_agenda(&mut self) {
        if !self.options.autonomous {
            return;
        }
        for i in 0..self.clients.len() {
            let at = self.rng.random_range(0..=self.options.think_ms_max);
            self.schedule(at, Event::Connect(i));
            let at = at + self.rng.random_range(1..=self.options.think_ms_max);
            self.schedule(at, Event::Turn(i));
        }
        if let Some(interval) = self.options.restart_interval_ms {
            let at = self.rng.random_range(1..=2 * interval);
            self.schedule(at, Event::Restart);
        }
        if matches!(self.options.wall_drift, WallDrift::Jumps { .. }) {
            self.schedule(1000, Event::WallJump);
        }
    }

    fn schedule(&mut self, at_ms: u64, event: Event) {
        self.agenda.insert((at_ms, self.agenda_next), event);
        self.agenda_next += 1;
    }

    /// Simulated time now, in milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.clock.mono_ms
    }

    /// The host (absent only if it failed to start).
    pub fn host(&self) -> Option<&Host<SimStore>> {
        self.host.as_ref()
    }

    /// The digest of every output so far.
    pub fn digest(&self) -> Digest {
        self.checker.digest()
    }

    fn violation(&self, message: impl Into<String>) -> Violation {
        Violation {
            seed: self.options.seed,
            step: self.steps,
            at_ms: self.clock.mono_ms,
            message: message.into(),
        }
    }

    fn host_mut(&mut self) -> Result<&mut Host<SimStore>, Violation> {
        match self.host.as_mut() {
            Some(h) => Ok(h),
            None => Err(Violation {
                seed: self.options.seed,
                step: self.steps,
                at_ms: self.clock.mono_ms,
                message: "the host failed to start".into(),
            }),
        }
    }

    /// Feeds one input to the host at the current time, drains what it decided and checks
    /// it against its cause.
    fn feed(&mut self, input: Input<'_>) -> Result<(), Violation> {
        let now = self.clock.now();
        self.epoch += 1;
        self.checker
            .feeding(&input, self.clock.mono_ms, self.host.as_ref());
        self.host_mut()?.handle(now, input);
        self.fed()
    }

    /// Fires the host's timers at the current time, likewise.
    fn tick(&mut self) -> Result<(), Violation> {
        let now = self.clock.now();
        self.epoch += 1;
        self.checker.timer(self.clock.mono_ms);
        self.host_mut()?.handle_timeout(now);
        self.fed()
    }

    fn fed(&mut self) -> Result<(), Violation> {
        self.drain()?;
        let Some(host) = self.host.as_ref() else {
            return Ok(());
        };
        let result = self.checker.fed(host);
        result.map_err(|m| self.violation(m))
    }

    // ─── Stepping ───────────────────────────────────────────────────────────────────────────

    fn next_due(&self) -> Option<(u64, Due)> {
        crate::due::next_due(self.host.as_ref(), &self.writer, &self.net, &self.agenda)
    }

    /// Runs the earliest event, drains the host and checks every invariant. False when
    /// nothing is left to run.
    pub fn step(&mut self) -> Result<bool, Violation> {
        let Some((at, due)) = self.next_due() else {
            return Ok(false);
        };
        self.clock.advance_to(at);
        self.steps += 1;
        if self.trace {
            let what = match due {
                Due::Agenda(at, n) => format!("{:?}", self.agenda.get(&(at, n))),
                other => format!("{other:?}"),
            };
            eprintln!("[{:>6} t={:>7}] {what}", self.steps, self.clock.mono_ms);
        }
        match due {
            Due::HostTimer => self.tick()?,
            Due::Writer => self.run_writer()?,
            Due::Net(conn, Direction::ToHost) => self.deliver_to_host(conn)?,
            Due::Net(conn, Direction::ToClient) => self.deliver_to_client(conn)?,
            Due::Agenda(at, n) => {
                if let Some(event) = self.agenda.remove(&(at, n)) {
                    self.fire(event)?;
                }
            }
        }
        self.read_unread()?;
        self.drain()?;
        self.check()?;
        Ok(true)
    }

    fn check(&mut self) -> Result<(), Violation> {
        let Some(host) = self.host.as_ref() else {
            return Ok(());
        };
        let result = self
            .checker
            .after_step(host, &self.net, &self.clients, self.epoch);
        result.map_err(|m| self.violation(m))
    }

    /// Moves every host output into the network, and every change to the writer.
    fn drain(&mut self) -> Result<(), Violation> {
        let now_ms = self.clock.mono_ms;
        let now = self.clock.now();
        let Some(host) = self.host.as_mut() else {
            return Ok(());
        };
        let (checker, net, writer, counters, trace) = (
            &mut self.checker,
            &mut self.net,
            &mut self.writer,
            &mut self.counters,
            self.trace,
        );
        let drained = self.drive.drain_checked(host, now, |host, out| {
            checker.on_output(&out, host.store().mem())?;
            if trace {
                match &out {
                    Output::Send { conn, frame } => {
                        eprintln!("    host -> {conn:?}: {}", clip(frame.as_str()))
                    }
                    Output::Close { conn, code, reason } => {
                        eprintln!("    host closes {conn:?}: {} {reason}", code.code())
                    }
                    Output::Commit(change) => eprintln!(
                        "    host commits change {} (generation {}, {} events)",
                        change.number,
                        change.generation,
                        change.events.len()
                    ),
                }
            }
            let known = match out {
                Output::Send { conn, frame } => {
                    let len = frame.len() as u64;
                    counters.frame_bytes_max = counters.frame_bytes_max.max(len);
                    net.send_to_client(conn, frame, now_ms)
                }
                Output::Close { conn, code, reason } => {
                    net.close_to_client(conn, code, reason, now_ms)
                }
                Output::Commit(change) => {
                    writer.submit(change, now_ms)?;
                    true
                }
            };
            if known {
                Ok(())
            } else {
                Err("output for a connection the driver no longer has".to_owned())
            }
        });
        drained.map_err(|m| self.violation(m))
    }

    /// Does what the writer has due now: finishes a transaction against the store, takes what
    /// is queued, and tells the host what it learned.
    fn run_writer(&mut self) -> Result<(), Violation> {
        let now_ms = self.clock.mono_ms;
        let Some(host) = self.host.as_mut() else {
            return Ok(());
        };
        let outcomes = self
            .writer
            .run_due(now_ms, |batch| host.store_mut().commit_group(batch));
        self.report_outcomes(outcomes)?;
        // A crash may land while a transaction is taken, done or reported (armed runs only).
        if !self.liveness && self.writer.busy() && self.options.crash_in_flight.hit(&mut self.rng) {
            let at = now_ms + self.rng.random_range(0..=3);
            self.schedule(at, Event::Crash);
        }
        Ok(())
    }

    fn report_outcomes(&mut self, outcomes: Vec<Outcome>) -> Result<(), Violation> {
        for outcome in outcomes {
            match outcome {
                Outcome::Durable { through } => self.feed(Input::Durable { through })?,
                Outcome::Failed { number } => {
                    self.feed(Input::CommitFailed { number })?;
                    let pool = self.options.session_ids();
                    if let Some(host) = self.host.as_ref() {
                        let result =
                            self.checker
                                .durability
                                .after_failure(host, &self.config, &pool);
                        result.map_err(|m| self.violation(m))?;
                    }
                }
            }
        }
        Ok(())
    }

    fn deliver_to_host(&mut self, conn: ConnId) -> Result<(), Violation> {
        let Some(item) = self.net.pop_to_host(conn) else {
            return Ok(());
        };
        // While the host takes no input the driver reads no socket: a message waits, and so
        // does everything of its connection behind it (a close too).
        let waits = self.unread.iter().any(|(c, _)| *c == conn)
            || (matches!(item, ToHost::Message(_)) && !self.accepting_input());
        if waits {
            if matches!(item, ToHost::Message(_)) {
                self.counters.unread += 1;
            }
            self.unread.push_back((conn, item));
            return Ok(());
        }
        self.read_from_client(conn, item)
    }

    fn read_from_client(&mut self, conn: ConnId, item: ToHost) -> Result<(), Violation> {
        match item {
            ToHost::Message(text) => match std::str::from_utf8(&text) {
                Ok(text) => self.feed(Input::Message { conn, text }),
                // The driver's WebSocket layer only ever delivers UTF-8 text messages.
                Err(_) => Err(self.violation("a simulated client sent a non-UTF-8 text message")),
            },
            ToHost::Closed => {
                self.net.remove(conn);
                self.checker.closed(conn);
                self.feed(Input::Closed { conn })
            }
        }
    }

    /// Whether the host takes input now (no host: nothing to hold back for).
    fn accepting_input(&self) -> bool {
        self.host.as_ref().is_none_or(Host::accepting_input)
    }

    /// Reads what waited while the host took no input, oldest first, for as long as it takes
    /// input (a close needs no room and is read whenever it is next).
    fn read_unread(&mut self) -> Result<(), Violation> {
        while let Some((_, item)) = self.unread.front() {
            if matches!(item, ToHost::Message(_)) && !self.accepting_input() {
                break;
            }
            let Some((conn, item)) = self.unread.pop_front() else {
                break;
            };
            self.read_from_client(conn, item)?;
        }
        Ok(())
    }

    fn deliver_to_client(&mut self, conn: ConnId) -> Result<(), Violation> {
        let Some(client) = self.net.link(conn).map(|l| l.client) else {
            return Ok(());
        };
        match self.net.pop_to_client(conn) {
            Some(ToClient::Frame(frame)) => {
                let bytes = frame.len() as u64;
                if !self.liveness && self.options.flush_delay.hit(&mut self.rng) {
                    let at = self.clock.mono_ms
                        + self
                            .rng
                            .random_range(1..=self.options.flush_delay_ms_max.max(1));
                    self.schedule(at, Event::Flushed { conn, bytes });
                } else {
                    self.net.flushed(conn, bytes);
                    self.feed(Input::Flushed { conn, bytes })?;
                }
                let result = self.clients[client].on_frame(conn, frame.as_bytes());
                result.map_err(|m| self.violation(format!("client {client} {conn:?}: {m}")))?;
                self.collect(client);
                self.send_outbox(client);
                if std::mem::take(&mut self.clients[client].handshake_retry_wanted) {
                    let at = self.clock.mono_ms + self.clients[client].handshake_retry_delay_ms();
                    self.schedule(at, Event::Handshake { client, conn });
                }
                Ok(())
            }
            Some(ToClient::Close(code, reason)) => {
                tracing::debug!(
                    conn = conn.0,
                    code = code.code(),
                    reason,
                    "host closed connection"
                );
                self.counters.host_closes += 1;
                *self.counters.close_reasons.entry(reason).or_default() += 1;
                let mut broken = Ok(());
                if self.clients[client]
                    .connection
                    .as_ref()
                    .is_some_and(|c| c.conn == conn)
                {
                    broken = self.clients[client].closed_by_host(code.code(), reason);
                }
                broken.map_err(|m| self.violation(format!("client {client} {conn:?}: {m}")))?;
                self.net.remove(conn);
                // The socket is gone, with whatever was still unread in it.
                self.unread.retain(|(c, _)| *c != conn);
                self.checker.closed(conn);
                self.feed(Input::Closed { conn })?;
                self.schedule_reconnect(client);
                Ok(())
            }
            None => Ok(()),
        }
    }

    fn fire(&mut self, event: Event) -> Result<(), Violation> {
        match event {
            Event::Turn(i) => {
                if self.liveness {
                    return Ok(());
                }
                let intent = self.clients[i].turn(&self.options, &self.gossip);
                self.act(i, intent)?;
                let at = self.clock.mono_ms
                    + self.rng.random_range(1..=self.options.think_ms_max.max(1));
                self.schedule(at, Event::Turn(i));
                Ok(())
            }
            Event::Connect(i) => self.connect(i),
            Event::Handshake { client, conn } => {
                self.clients[client].retry_handshake(conn);
                self.send_outbox(client);
                Ok(())
            }
            Event::Flushed { conn, bytes } => {
                if self.net.link(conn).is_some() {
                    self.net.flushed(conn, bytes);
                    self.feed(Input::Flushed { conn, bytes })?;
                }
                Ok(())
            }
            Event::Crash => {
                if self.liveness {
                    return Ok(());
                }
                self.restart_with(true)
            }
            Event::Restart => {
                if self.liveness {
                    return Ok(());
                }
                let kill = self.options.restart_kills.hit(&mut self.rng);
                self.restart_with(kill)?;
                if let Some(interval) = self.options.restart_interval_ms {
                    let at = self.clock.mono_ms + self.rng.random_range(1..=2 * interval);
                    self.schedule(at, Event::Restart);
                }
                Ok(())
            }
            Event::Answer {
                client,
                conn,
                host_id,
                generation,
                frame,
            } => {
                let same_host = generation == self.counters.restarts;
                if self.clients[client].answer_due(conn, host_id, same_host) {
                    self.clients[client].send_raw(frame.into_bytes(), false);
                    self.send_outbox(client);
                }
                Ok(())
            }
            Event::WallJump => {
                if let WallDrift::Jumps { ms_max } = self.options.wall_drift {
                    let ms_max = ms_max as i64;
                    self.clock.wall_offset_ms += self.rng.random_range(-ms_max..=ms_max);
                    if !self.liveness {
                        let at = self.clock.mono_ms + self.rng.random_range(100..=5000);
                        self.schedule(at, Event::WallJump);
                    }
                }
                Ok(())
            }
        }
    }
}

/// The start of a frame, for traces.
fn clip(text: &str) -> String {
    if text.len() <= 300 {
        return text.to_owned();
    }
    format!(
        "{}… ({} bytes)",
        text.chars().take(300).collect::<String>(),
        text.len()
    )
}

/// Client `i`'s principal: mostly maintainers seeing everything, some observers, some scoped
/// to part of the session pool.
fn draw_principal(rng: &mut ChaCha8Rng, options: &Options, i: usize) -> Principal {
    let mut p = Principal::maintainer(&format!("p{}", i as u32 % options.principals.max(1)));
    if options.observer.hit(rng) {
        p.role = axhost_core::Role::Observer;
    }
    if options.scoped.hit(rng) {
        let ids = options.session_ids();
        let mut scope: std::collections::BTreeSet<String> = ids
            .iter()
            .filter(|_| Ratio::new(1, 2).hit(rng))
            .cloned()
            .collect();
        if scope.is_empty() {
            scope.insert(ids[rng.random_range(0..ids.len())].clone());
        }
        p.sessions = SessionScope::Only(scope);
    }
    p
}
