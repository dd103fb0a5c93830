//! The AXP world: one host over a fault-injecting store, its asynchronous writer, the seeded
//! network, and the AXP actors, driven event by event in simulated time.
//!
//! It shares the network ([`SimNet`]), the writer ([`SimWriter`]), the store ([`SimStore`])
//! and the durability oracle ([`DurabilityOracle`]) with the AHP world; what it adds is the
//! AXP roles ([`crate::axp::actors`]) and the AXP oracles ([`crate::axp::oracle`]).
//!
//! Two phases: a *safety* phase of `duration_ms` with every fault on (cut connections, stalled
//! actors, slow and failed commits, crashes with commits in flight, restarts, late renewals, overspends),
//! then a *liveness* phase that heals everything, lets executors finish and release, runs the
//! clock past every lease, and requires that every observer's mirror equals the host and that
//! every acknowledged reservation ended in exactly one usage entry.

use std::collections::BTreeMap;

use axhost_core::drive::{Commits, Drive};
use axhost_core::{
    Change, ConnId, Host, HostConfig, Input, Instant, Now, Output, Principal, Role, SessionScope,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use sha2::{Digest as _, Sha256};

use crate::axp::actors::{Actor, Board, Kind, Temper};
use crate::axp::options::AxpOptions;
use crate::axp::oracle::{AxpOracle, OracleStats};
use crate::axp::replica::EXECUTORS;
use crate::checker::{Digest, Violation};
use crate::due::Due;
use crate::durability::DurabilityOracle;
use crate::net::{Direction, SimNet, ToClient, ToHost};
use crate::options::Ratio;
use crate::store::SimStore;
use crate::writer::{CleanStop, Outcome, SimWriter, WriterStats};

/// Wall-clock origin of every run: 2026-01-01T00:00:00Z.
const EPOCH_MS: u64 = 1_767_225_600_000;
/// Simulated time the liveness phase may take before it is a failure.
const SETTLE_BUDGET_MS: u64 = 120_000;
/// The longest lease an executor asks for, plus a margin: past it every lease has ended.
const LEASE_MS_MAX: u64 = 12_000;

/// Things on the agenda.
#[derive(Clone, Debug)]
enum Event {
    Turn(usize),
    Connect(usize),
    Restart,
}

/// One run's outcome.
#[derive(Clone, Debug)]
pub struct AxpReport {
    /// The seed.
    pub seed: u64,
    /// SHA-256 over every output, in order.
    pub digest: Digest,
    /// Steps taken.
    pub steps: u64,
    /// Simulated milliseconds.
    pub sim_ms: u64,
    /// Restarts (clean and killed).
    pub restarts: u64,
    /// Connections cut.
    pub cuts: u64,
    /// Actors stalled.
    pub stalls: u64,
    /// Requests sent, mutations sent again after a cut, deliberate duplicates.
    pub requests: (u64, u64, u64),
    /// What the oracles checked.
    pub oracle: OracleStats,
    /// What the writer did.
    pub commits: WriterStats,
}

/// See the module docs.
pub struct AxpWorld {
    /// The run's configuration.
    pub options: AxpOptions,
    rng: ChaCha8Rng,
    config: HostConfig,
    host: Option<Host<SimStore>>,
    writer: SimWriter<Box<Change>>,
    /// The shared drive loop, handing every output (commits included) to this world.
    drive: Drive,
    net: SimNet,
    /// The actors.
    pub actors: Vec<Actor>,
    board: Board,
    oracle: AxpOracle,
    durability: DurabilityOracle,
    agenda: BTreeMap<(u64, u64), Event>,
    agenda_next: u64,
    conn_next: u64,
    now_ms: u64,
    /// Steps taken.
    pub steps: u64,
    liveness: bool,
    hash: Sha256,
    restarts: u64,
    cuts: u64,
    stalls: u64,
    /// Print every step to stderr.
    pub trace: bool,
}

impl AxpWorld {
    /// A world drawn from `seed`.
    pub fn new(seed: u64) -> AxpWorld {
        AxpWorld::with_options(AxpOptions::swarm(seed))
    }

    /// A world with fixed options (named scenarios).
    pub fn with_options(options: AxpOptions) -> AxpWorld {
        let mut root = ChaCha8Rng::seed_from_u64(options.seed ^ 0xa4e0_0000_0000_0001);
        // Small registries, so the bounds are reached (-32043) by five executors.
        let limits = axhost_core::Limits {
            grants_per_session_max: 4,
            executors_max: 4,
            // Four lessons race for the same ids; small bounds are reached too.
            memory_lessons_max: 3,
            memory_evidence_max: 4,
            ..axhost_core::Limits::default()
        };
        let config = HostConfig {
            limits,
            ..HostConfig::default()
        };
        let store = SimStore::new(
            ChaCha8Rng::seed_from_u64(root.random()),
            options.store_fault,
        );
        let host = Host::new(config.clone(), store, root.random()).ok();
        let (executors, maintainers, observers) = options.actors;
        let mut actors = Vec::new();
        // With two watchers, a verifier joins them.
        let verifiers = usize::from(observers > 1);
        for i in 0..executors + maintainers + observers + verifiers {
            let (kind, principal) = if i < executors {
                let id = format!("c{}", i as u32 % options.contributors.max(1));
                let role = if i == 0 && Ratio::new(1, 4).hit(&mut root) {
                    Role::Maintainer
                } else {
                    Role::Contributor
                };
                (Kind::Executor, principal(&id, role))
            } else if i < executors + maintainers {
                (
                    Kind::Maintainer,
                    principal(&format!("m{i}"), Role::Maintainer),
                )
            } else if i < executors + maintainers + observers {
                // Every other observer is scoped to the first session: what it may not read
                // (other sessions, lessons citing them) must never reach it.
                let mut p = principal(&format!("o{i}"), Role::Observer);
                if options.sessions.len() > 1 && i % 2 == 1 {
                    p.sessions = SessionScope::Only([options.sessions[0].clone()].into());
                }
                (Kind::Observer, p)
            } else {
                (Kind::Verifier, principal(&format!("v{i}"), Role::Verifier))
            };
            let rng = ChaCha8Rng::seed_from_u64(root.random());
            let temper = Temper {
                closes: options.temper.closes && kind == Kind::Maintainer,
                ..options.temper.clone()
            };
            actors.push(Actor::new(
                i,
                kind,
                principal,
                rng,
                temper,
                options.sessions.clone(),
            ));
        }
        let writer = SimWriter::new(options.commits, ChaCha8Rng::seed_from_u64(root.random()));
        let net = SimNet::new(
            ChaCha8Rng::seed_from_u64(root.random()),
            options.latency_ms.0,
            options.latency_ms.1,
        );
        let mut oracle = AxpOracle::default();
        oracle.store_faults = options.store_fault.is_some();
        let mut world = AxpWorld {
            rng: root,
            config,
            host,
            writer,
            drive: Drive::immediate()
                .commits(Commits::Handed)
                .flush_at_once(false)
                .close_at_once(false),
            net,
            actors,
            board: Board::default(),
            oracle,
            durability: DurabilityOracle::default(),
            agenda: BTreeMap::new(),
            agenda_next: 0,
            conn_next: 1,
            now_ms: 0,
            steps: 0,
            liveness: false,
            hash: Sha256::new(),
            restarts: 0,
            cuts: 0,
            stalls: 0,
            trace: false,
            options,
        };
        for i in 0..world.actors.len() {
            let at = world.rng.random_range(0..=world.options.think_ms_max);
            world.schedule(at, Event::Connect(i));
            world.schedule(at + 1, Event::Turn(i));
        }
        if let Some(interval) = world.options.restart_interval_ms {
            let at = world.rng.random_range(1..=2 * interval);
            world.schedule(at, Event::Restart);
        }
        world
    }

    fn schedule(&mut self, at_ms: u64, event: Event) {
        self.agenda.insert((at_ms, self.agenda_next), event);
        self.agenda_next += 1;
    }

    fn now(&self) -> Now {
        Now {
            mono: Instant(self.now_ms),
            wall_unix_ms: EPOCH_MS + self.now_ms,
        }
    }

    fn violation(&self, message: impl Into<String>) -> Violation {
        Violation {
            seed: self.options.seed,
            step: self.steps,
            at_ms: self.now_ms,
            message: format!("axp: {}", message.into()),
        }
    }

    fn host(&self) -> Result<&Host<SimStore>, Violation> {
        self.host
            .as_ref()
            .ok_or_else(|| self.violation("the host failed to start"))
    }

    // ─── Calls into the host ────────────────────────────────────────────────────────────────

    fn feed(&mut self, input: Input<'_>) -> Result<(), Violation> {
        let now = self.now();
        let Some(host) = self.host.as_ref() else {
            return Err(self.violation("the host failed to start"));
        };
        match &input {
            Input::Message { conn, text } => {
                let wall_ms = now.wall_unix_ms;
                self.oracle
                    .feeding(*conn, text, wall_ms, || host.axp_inspect());
                self.durability.feeding(&input);
            }
            Input::Connected { conn, principal } => self.oracle.connected(*conn, principal),
            Input::Closed { conn } => {
                self.oracle.closed(*conn);
                self.durability.closed(*conn);
            }
            Input::CommitFailed { .. } => self.oracle.rolling_back(),
            _ => {}
        }
        // Only a message, a timer or a failed commit can change the exchange: delivery reports,
        // durability reports and connection events leave it as it is (checked in unit tests).
        let changes = matches!(input, Input::Message { .. } | Input::CommitFailed { .. });
        if let Some(h) = self.host.as_mut() {
            h.handle(now, input);
        }
        if changes {
            self.fed()
        } else {
            self.drain()
        }
    }

    fn fed(&mut self) -> Result<(), Violation> {
        self.drain()?;
        let inspect = self.host()?.axp_inspect();
        let checked = self.oracle.fed(inspect);
        checked.map_err(|m| self.violation(m))
    }

    fn drain(&mut self) -> Result<(), Violation> {
        let now = self.now();
        let now_ms = self.now_ms;
        let Some(host) = self.host.as_mut() else {
            return Ok(());
        };
        let (hash, durability, oracle, net, writer, trace) = (
            &mut self.hash,
            &mut self.durability,
            &mut self.oracle,
            &mut self.net,
            &mut self.writer,
            self.trace,
        );
        let drained = self.drive.drain_checked(host, now, |host, out| {
            match out {
                Output::Send { conn, frame } => {
                    hash.update(conn.0.to_le_bytes());
                    hash.update(frame.as_bytes());
                    let text = frame.as_str().to_owned();
                    durability.on_send(conn, &text, host.store().mem())?;
                    oracle.on_send(conn, &text)?;
                    if trace {
                        eprintln!("    host -> {conn:?}: {}", clip(&text));
                    }
                    if !net.send_to_client(conn, frame, now_ms) {
                        return Err("output for a connection the driver no longer has".to_owned());
                    }
                }
                Output::Close { conn, code, reason } => {
                    hash.update(b"close");
                    hash.update(conn.0.to_le_bytes());
                    net.close_to_client(conn, code, reason, now_ms);
                }
                Output::Commit(change) => {
                    hash.update(change.number.to_le_bytes());
                    writer.submit(change, now_ms)?;
                }
            }
            Ok(())
        });
        drained.map_err(|m| self.violation(m))
    }

    // ─── Stepping ───────────────────────────────────────────────────────────────────────────

    fn next_due(&self) -> Option<(u64, Due)> {
        crate::due::next_due(self.host.as_ref(), &self.writer, &self.net, &self.agenda)
    }

    /// Runs the earliest event. False when nothing is left to run.
    pub fn step(&mut self) -> Result<bool, Violation> {
        let Some((at, due)) = self.next_due() else {
            return Ok(false);
        };
        self.now_ms = self.now_ms.max(at);
        self.steps += 1;
        if self.trace {
            eprintln!("[{:>6} t={:>7}] {due:?}", self.steps, self.now_ms);
        }
        match due {
            Due::HostTimer => {
                let now = self.now();
                if let Some(h) = self.host.as_mut() {
                    h.handle_timeout(now);
                }
                self.fed()?;
            }
            Due::Writer => self.run_writer()?,
            Due::Net(conn, Direction::ToHost) => match self.net.pop_to_host(conn) {
                Some(ToHost::Message(bytes)) => {
                    let text = String::from_utf8(bytes)
                        .map_err(|_| self.violation("an actor sent non-UTF-8"))?;
                    self.feed(Input::Message { conn, text: &text })?;
                }
                Some(ToHost::Closed) => {
                    self.net.remove(conn);
                    self.feed(Input::Closed { conn })?;
                }
                None => {}
            },
            Due::Net(conn, Direction::ToClient) => self.deliver(conn)?,
            Due::Agenda(at, n) => {
                if let Some(event) = self.agenda.remove(&(at, n)) {
                    self.fire(event)?;
                }
            }
        }
        Ok(true)
    }

    fn run_writer(&mut self) -> Result<(), Violation> {
        let Some(host) = self.host.as_mut() else {
            return Ok(());
        };
        let outcomes = self
            .writer
            .run_due(self.now_ms, |batch| host.store_mut().commit_group(batch));
        self.report(outcomes)
    }

    fn report(&mut self, outcomes: Vec<Outcome>) -> Result<(), Violation> {
        for outcome in outcomes {
            match outcome {
                Outcome::Durable { through } => self.feed(Input::Durable { through })?,
                Outcome::Failed { number } => {
                    self.feed(Input::CommitFailed { number })?;
                    let inspect = self.host()?.axp_inspect();
                    let checked = self.oracle.rolled_back(inspect);
                    checked.map_err(|m| self.violation(format!("after a failed commit: {m}")))?;
                }
            }
        }
        Ok(())
    }

    fn deliver(&mut self, conn: ConnId) -> Result<(), Violation> {
        let Some(i) = self.net.link(conn).map(|l| l.client) else {
            return Ok(());
        };
        match self.net.pop_to_client(conn) {
            Some(ToClient::Frame(frame)) => {
                let bytes = frame.len() as u64;
                self.net.flushed(conn, bytes);
                self.feed(Input::Flushed { conn, bytes })?;
                if self.actors[i].conn.is_some_and(|(c, _)| c == conn) {
                    let handled = self.actors[i].on_frame(frame.as_str(), &mut self.board);
                    handled.map_err(|m| self.violation(format!("actor {i}: {m}")))?;
                    self.flush(i);
                }
            }
            Some(ToClient::Close(..)) => {
                if self.actors[i].conn.is_some_and(|(c, _)| c == conn) {
                    self.actors[i].disconnected();
                    self.reconnect_later(i);
                }
                self.net.remove(conn);
                self.feed(Input::Closed { conn })?;
            }
            None => {}
        }
        Ok(())
    }

    fn flush(&mut self, i: usize) {
        let Some((conn, _)) = self.actors[i].conn else {
            self.actors[i].outbox.clear();
            return;
        };
        for text in std::mem::take(&mut self.actors[i].outbox) {
            if self.trace {
                eprintln!(
                    "    actor {i} -> {conn:?}: {}",
                    clip(&String::from_utf8_lossy(&text))
                );
            }
            self.net.send_to_host(conn, text, self.now_ms);
        }
    }

    fn reconnect_later(&mut self, i: usize) {
        let at = self.now_ms + self.rng.random_range(1..=self.options.think_ms_max * 2 + 1);
        self.schedule(at, Event::Connect(i));
    }

    fn fire(&mut self, event: Event) -> Result<(), Violation> {
        match event {
            Event::Connect(i) => self.connect(i),
            Event::Turn(i) => {
                if !self.liveness && self.options.cut.hit(&mut self.rng) {
                    self.cut(i);
                } else if !self.liveness && self.options.stall.hit(&mut self.rng) {
                    let ms = self.rng.random_range(1..=self.options.stall_ms_max.max(1));
                    self.stall(i, ms);
                } else {
                    self.actors[i].act(self.now_ms, &self.board);
                    self.flush(i);
                }
                let at = self.now_ms + self.rng.random_range(1..=self.options.think_ms_max);
                self.schedule(at, Event::Turn(i));
                Ok(())
            }
            Event::Restart => {
                if self.liveness {
                    return Ok(());
                }
                let kill = self.options.kills.hit(&mut self.rng);
                self.restart(kill)?;
                if let Some(interval) = self.options.restart_interval_ms {
                    let at = self.now_ms + self.rng.random_range(1..=2 * interval);
                    self.schedule(at, Event::Restart);
                }
                Ok(())
            }
        }
    }

    fn connect(&mut self, i: usize) -> Result<(), Violation> {
        if self.actors[i].conn.is_some() || self.host.is_none() {
            return Ok(());
        }
        let conn = ConnId(self.conn_next);
        self.conn_next += 1;
        self.net.open(conn, i);
        let principal = self.actors[i].principal.clone();
        let client_id = self.actors[i].client_id.clone();
        self.durability.connected(conn, &client_id, &principal);
        self.feed(Input::Connected { conn, principal })?;
        self.actors[i].connected(conn);
        self.flush(i);
        Ok(())
    }

    /// Actor `i` loses its connection (abruptly: what it sent may be lost too).
    fn cut(&mut self, i: usize) {
        let Some((conn, _)) = self.actors[i].conn else {
            return;
        };
        self.cuts += 1;
        self.actors[i].disconnected();
        self.net.client_disconnect(conn, true, self.now_ms);
        self.reconnect_later(i);
    }

    /// Actor `i` stalls for `ms`: it reads nothing (the link holds what the host sends) and
    /// does nothing, as a half-open connection or a suspended process would; its heartbeats
    /// stop, so its lease may run out meanwhile.
    fn stall(&mut self, i: usize, ms: u64) {
        let Some((conn, _)) = self.actors[i].conn else {
            return;
        };
        self.stalls += 1;
        self.net.clog(conn, self.now_ms + ms);
        self.actors[i].stalled_until_ms = self.now_ms + ms;
    }

    /// Stops the host (killed: commits in flight are lost; clean: the writer finishes first)
    /// and starts a new one over the same store. Every connection dies with the process.
    fn restart(&mut self, kill: bool) -> Result<(), Violation> {
        if kill {
            self.writer.crash();
        } else {
            let mut stop = CleanStop::at(self.now_ms);
            while self.writer.busy() {
                let Some(host) = self.host.as_mut() else {
                    break;
                };
                let outcomes = self
                    .writer
                    .stop_round(&mut stop, |batch| host.store_mut().commit_group(batch))
                    .map_err(|m| self.violation(m))?;
                self.report(outcomes)?;
            }
            self.writer.crash();
        }
        let Some(host) = self.host.take() else {
            return Ok(());
        };
        let mut store = host.into_store();
        store.refused = 0;
        for (conn, link) in self.net.drop_all() {
            if self.actors[link.client]
                .conn
                .is_some_and(|(c, _)| c == conn)
            {
                self.actors[link.client].disconnected();
                self.reconnect_later(link.client);
            }
        }
        self.oracle.restarted();
        self.durability.restarted();
        self.restarts += 1;
        let host = Host::new(self.config.clone(), store, self.rng.random())
            .map_err(|e| self.violation(format!("the host failed to restart: {e}")))?;
        let resumed = self.durability.after_restart(host.server_seq());
        resumed.map_err(|m| self.violation(m))?;
        let inspect = host.axp_inspect();
        self.host = Some(host);
        let checked = self.oracle.rolled_back(inspect);
        checked.map_err(|m| self.violation(format!("after a restart: {m}")))?;
        // The new process orphaned every lease in one change of its own.
        self.drain()
    }

    // ─── Phases ─────────────────────────────────────────────────────────────────────────────

    /// The safety phase.
    pub fn run_safety(&mut self) -> Result<(), Violation> {
        while self.now_ms < self.options.duration_ms {
            if !self.step()? {
                break;
            }
        }
        Ok(())
    }

    /// The liveness phase: heal, wind down, let every lease run out, then compare.
    pub fn settle(&mut self) -> Result<(), Violation> {
        self.liveness = true;
        self.net.heal();
        self.writer.heal();
        if let Some(h) = &self.host {
            h.store().disarm();
        }
        for a in &mut self.actors {
            a.winding_down = true;
        }
        let deadline = self.now_ms + SETTLE_BUDGET_MS;
        // Executors settle and release; every actor's requests are answered.
        while let Some(why) = self.unsettled() {
            if self.now_ms > deadline || !self.step()? {
                return Err(self.violation(format!("liveness: did not wind down: {why}")));
            }
        }
        // Leases the executors lost track of run out on the host's timers.
        let until = self.now_ms + LEASE_MS_MAX + 1;
        while let Some((at, _)) = self.next_due() {
            if at > until {
                break;
            }
            self.step()?;
        }
        self.now_ms = self.now_ms.max(until);
        // Observers subscribe to every session they do not mirror yet; then all quiet.
        while let Some(why) = self.unsettled() {
            if self.now_ms > deadline + SETTLE_BUDGET_MS || !self.step()? {
                return Err(self.violation(format!("liveness: did not settle: {why}")));
            }
        }
        self.final_check()
    }

    /// Why the world is not quiet yet.
    fn unsettled(&self) -> Option<String> {
        for a in &self.actors {
            match a.conn {
                None => return Some(format!("actor {} is offline", a.index)),
                Some((_, false)) => return Some(format!("actor {} has no handshake", a.index)),
                Some(_) => {}
            }
            if !a.idle() {
                return Some(format!("actor {} awaits answers", a.index));
            }
            if a.kind == Kind::Executor && a.busy() {
                return Some(format!("executor {} still holds work", a.index));
            }
            if a.kind == Kind::Observer {
                let missing = self.board.sessions.iter().find(|s| {
                    a.principal.can_read_session(s)
                        && !a.mirrors.contains_key(&format!("axp-session:/{s}"))
                });
                if let Some(s) = missing {
                    return Some(format!("observer {} does not mirror {s}", a.index));
                }
            }
        }
        if !self.net.is_idle() {
            return Some("frames in flight".into());
        }
        if self.writer.busy() {
            return Some("commits in flight".into());
        }
        None
    }

    fn final_check(&mut self) -> Result<(), Violation> {
        let inspect = self.host()?.axp_inspect();
        let checked = self.oracle.final_check(&inspect);
        checked.map_err(|m| self.violation(format!("liveness: {m}")))?;
        for a in self.actors.iter().filter(|a| a.kind == Kind::Observer) {
            for (channel, mirror) in &a.mirrors {
                let host = if channel == EXECUTORS {
                    Some(&inspect.executors)
                } else {
                    channel
                        .strip_prefix("axp-session:/")
                        .and_then(|s| inspect.exchanges.get(s))
                };
                let Some(host) = host else {
                    return Err(self.violation(format!(
                        "observer {} mirrors {channel}, which the host does not hold",
                        a.index
                    )));
                };
                if *host != mirror.state {
                    return Err(self.violation(format!(
                        "observer {}'s mirror of {channel} differs from the host: {}",
                        a.index,
                        crate::replica::difference(&mirror.state, host, ("mirror", "host"))
                    )));
                }
            }
        }
        Ok(())
    }

    /// The run's report.
    pub fn report_now(&self) -> AxpReport {
        let sum = |f: fn(&Actor) -> u64| self.actors.iter().map(f).sum::<u64>();
        AxpReport {
            seed: self.options.seed,
            digest: Digest(self.hash.clone().finalize().into()),
            steps: self.steps,
            sim_ms: self.now_ms,
            restarts: self.restarts,
            cuts: self.cuts,
            stalls: self.stalls,
            requests: (
                sum(|a| a.counts.0),
                sum(|a| a.counts.1),
                sum(|a| a.counts.2),
            ),
            oracle: self.oracle.stats.clone(),
            commits: self.writer.stats.clone(),
        }
    }
}

fn principal(id: &str, role: Role) -> Principal {
    Principal {
        role,
        ..Principal::maintainer(id)
    }
}

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
