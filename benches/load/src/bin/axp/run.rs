//! The run: blocking connection setup (in a few threads), then one thread and one mio `Poll`
//! for everything else, every connection non-blocking and every request pipelined.
//!
//! Phases: the maintainer creates the N sessions; viewers subscribe to the chats while each
//! executor subscribes to its exchange channel, registers, grants and claims; the maintainer
//! starts every first turn and each executor reserves it; then the steady state (warmup, then
//! the measured window), then a drain that waits for every answer and every delivery. Renewals
//! start as soon as a lease is claimed and run through every phase but the drain.
//!
//! Times: an emit is stamped (`@T<ns>@` in its last action's content) when it is queued for
//! the socket, with nanoseconds since the run's start on the monotonic clock; a viewer's
//! latency is the read that completed the echoed envelope minus that stamp. Reply latencies
//! run from the same moment to the read of the answer. Samples count in the window when the
//! emit was sent inside it.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axhost_load::{setup, ws};
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::report::{Quantiles, Report};
use crate::{procfs, proto, Args, Cycle};

/// Bytes asked of one `read`.
const READ_CHUNK: usize = 64 * 1024;
/// Unparsed bytes one connection may hold: the largest frame the parser accepts and its header.
const IN_MAX: usize = ws::MAX_FRAME + 14;
/// How often unanswered requests are checked against `--reply-timeout`.
const STALL_CHECK: Duration = Duration::from_millis(100);
/// Every grant's limit, in tokens, USD micros and turns: never reached in a run.
const GRANT_LIMIT: u64 = 1_000_000_000_000_000;
/// Each reservation's token (and USD micros) ceiling.
const CEILING: u64 = 100_000;
/// Error samples kept for the report.
const ERROR_SAMPLES: usize = 8;

#[derive(Copy, Clone, Debug)]
enum Req {
    Create(usize),
    ViewerSubscribe,
    SubscribeExchange(usize),
    SubscribeChat(usize),
    Register(usize),
    Grant(usize),
    Claim(usize),
    TurnStart(usize),
    Queue(usize),
    Reserve(usize),
    Emit(usize, u64),
    Renew(usize),
    Settle(usize),
}

impl Req {
    fn name(self) -> &'static str {
        match self {
            Req::Create(_) => "createSession",
            Req::ViewerSubscribe | Req::SubscribeExchange(_) | Req::SubscribeChat(_) => "subscribe",
            Req::Register(_) => "_axp/register",
            Req::Grant(_) => "_axp/grant",
            Req::Claim(_) => "_axp/claim",
            Req::TurnStart(_) => "dispatchAction chat/turnStarted",
            Req::Queue(_) => "dispatchAction chat/pendingMessageSet",
            Req::Reserve(_) => "_axp/reserve",
            Req::Emit(..) => "_axp/emit",
            Req::Renew(_) => "_axp/renew",
            Req::Settle(_) => "_axp/settle",
        }
    }

    fn exec(self) -> Option<usize> {
        match self {
            Req::Create(i)
            | Req::SubscribeExchange(i)
            | Req::SubscribeChat(i)
            | Req::Register(i)
            | Req::Grant(i)
            | Req::Claim(i)
            | Req::TurnStart(i)
            | Req::Queue(i)
            | Req::Reserve(i)
            | Req::Emit(i, _)
            | Req::Renew(i)
            | Req::Settle(i) => Some(i),
            Req::ViewerSubscribe => None,
        }
    }
}

struct Pending {
    req: Req,
    sent: Instant,
}

enum Role {
    Maintainer {
        /// The last `clientSeq` dispatched.
        seq: u64,
    },
    Executors,
    Viewer {
        /// Sessions whose chats it watches.
        sessions: Vec<usize>,
        /// Stamped envelopes received (one per emit of a watched session).
        received: u64,
    },
}

struct Conn {
    stream: TcpStream,
    what: String,
    inbuf: Vec<u8>,
    out: Vec<u8>,
    out_head: usize,
    rng: ws::Rng,
    next_id: u64,
    pending: HashMap<u64, Pending>,
    role: Role,
    dirty: bool,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum State {
    /// Subscribing, registering, granting, claiming.
    Setup,
    /// Claimed; waiting for a turn to reserve.
    WaitTurn,
    Reserving,
    /// Reserved: emits flow.
    Ready,
    /// K emits sent; the settle waits for the queued next message to be answered (queue cycle).
    SettleDue,
    Settling,
    /// Lost its lease or got an error answer: does nothing more.
    Dead,
}

struct Exec {
    conn: usize,
    session: String,
    executor: String,
    grant: String,
    epoch: u64,
    heartbeat: Duration,
    state: State,
    /// The current (reserved or reserving) turn and its number.
    turn: String,
    turn_no: u64,
    /// The next turn to reserve, once known (start cycle: the maintainer's answer; queue
    /// cycle: the host's `chat/turnStarted` on the executor's chat).
    next_turn: Option<String>,
    /// Queue cycle: the next message is queued (answered) for the current turn.
    queued_next: bool,
    opened_part: bool,
    emits_in_turn: u32,
    /// Operation ids are `{executor}-{op}`.
    op: u64,
    inflight: u32,
    /// An emit that fell due while the executor could not send it.
    blocked_due: Option<Instant>,
    acked: u64,
    /// Reserved its first turn (the end of setup).
    reserved_once: bool,
    last_renew_ack: Option<Instant>,
    settle_sent: Option<Instant>,
}

impl Exec {
    fn next_op(&mut self, kind: &str) -> String {
        self.op += 1;
        format!("{kind}-{}-{}", self.executor, self.op)
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    Emit,
    Renew,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Phase {
    Sessions,
    Claims,
    Turns,
    Steady,
    Drain,
}

fn histogram() -> Histogram<u64> {
    // Nanoseconds, up to a minute, 3 significant digits.
    #[allow(clippy::unwrap_used)]
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

struct Hists {
    emit_reply: Histogram<u64>,
    deliver: Histogram<u64>,
    renew: Histogram<u64>,
    cycle: Histogram<u64>,
    lag: Histogram<u64>,
}

struct World<'a> {
    args: &'a Args,
    t0: Instant,
    conns: Vec<Conn>,
    execs: Vec<Exec>,
    timers: BinaryHeap<Reverse<(Instant, Timer, usize)>>,
    dirty: Vec<usize>,
    phase: Phase,
    period: Duration,
    /// The measured window (set when the steady state starts).
    start: Instant,
    end: Instant,
    h: Hists,
    created: usize,
    viewer_subs: usize,
    window_emits: u64,
    settles: u64,
    turns_started: u64,
    lease_changed_null: u64,
    stale_answers: u64,
    errors: BTreeMap<i64, u64>,
    error_samples: Vec<String>,
    max_renew_gap: Duration,
    renewals: u64,
}

fn run_tag() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}{:05x}", std::process::id() & 0xffff, nanos >> 12)
}

/// A connection ready for the loop: its socket, its name and its `initialize` answer.
type Connected = (setup::Ready, String, String);

/// Connects `who` (what, clientId, token) with `threads` threads; the results in order.
fn connect_all(
    args: &Args,
    addr: SocketAddr,
    who: Vec<(String, String, String)>,
) -> Result<Vec<Connected>, String> {
    let threads = (args.connect_threads as usize).clamp(1, who.len().max(1));
    let chunk = who.len().div_ceil(threads).max(1);
    let results: Vec<Result<Vec<Connected>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> = who
            .chunks(chunk)
            .enumerate()
            .map(|(t, part)| {
                s.spawn(move || {
                    let mut rng = ws::Rng::new(0x5eed ^ ((t as u64 + 1) << 32));
                    let mut out = Vec::with_capacity(part.len());
                    for (what, client_id, token) in part {
                        let c = setup::Ahp::connect(
                            addr,
                            &args.path,
                            token,
                            what.clone(),
                            client_id,
                            &mut rng,
                        )?;
                        let init = c.initialize_reply().to_owned();
                        out.push((c.done(None)?, what.clone(), init));
                    }
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a connect thread panicked".into()))
            })
            .collect()
    });
    let mut all = Vec::with_capacity(who.len());
    for r in results {
        all.extend(r?);
    }
    Ok(all)
}

/// Checks that the host serves what the run needs, from an `initialize` answer.
fn check_host(init: &str, role: &str) -> Result<(), String> {
    for m in [
        "_axp/register",
        "_axp/grant",
        "_axp/claim",
        "_axp/renew",
        "_axp/reserve",
        "_axp/settle",
        "_axp/emit",
    ] {
        if !init.contains(&format!("\"{m}\"")) {
            return Err(format!(
                "the host does not advertise {m} in initialize's _meta[\"org.axp.exchange\"].methods \
                 (an axhost without the AXP commands?): {}",
                init.chars().take(600).collect::<String>()
            ));
        }
    }
    if !init.contains(&format!("\"role\":\"{role}\"")) {
        return Err(format!(
            "the token meant for a {role} initializes as another role: {}",
            init.chars().take(600).collect::<String>()
        ));
    }
    Ok(())
}

pub fn run(args: &Args, addr: SocketAddr, mtok: &str, ctok: &str) -> Result<Report, String> {
    let n = args.sessions as usize;
    let v = args.viewers as usize;
    let subs_max = args.subscriptions_max.max(1) as usize;
    // Viewers: V groups, each covering every session, ⌈N/subs_max⌉ connections per group.
    let per_group = n.div_ceil(subs_max);
    let per_viewer = n.div_ceil(per_group);
    let viewer_conns = v * per_group;
    let budget = (args.connections_max as usize)
        .checked_sub(args.spare_connections as usize + 1 + viewer_conns)
        .filter(|b| *b > 0)
        .ok_or_else(|| {
            format!(
                "--connections-max {} leaves no room for executors beside {viewer_conns} viewer \
                 connection(s), the maintainer and {} spare",
                args.connections_max, args.spare_connections
            )
        })?;
    let exec_conns = n.min(budget);
    let per_exec_conn = n.div_ceil(exec_conns);
    let subs_per_exec = if args.cycle == Cycle::Queue { 2 } else { 1 };
    if per_exec_conn * subs_per_exec > subs_max {
        return Err(format!(
            "{n} executors on {exec_conns} connections need {} subscriptions on one, over {subs_max}",
            per_exec_conn * subs_per_exec
        ));
    }
    let rss_before = args.host_pid.and_then(procfs::rss_kib);
    let tag = run_tag();
    let prefix = &args.session_prefix;

    // ── Connections ──
    let t_connect = Instant::now();
    let mut who = vec![(
        "maintainer".to_owned(),
        format!("axp-{tag}-m"),
        mtok.to_owned(),
    )];
    for c in 0..exec_conns {
        who.push((
            format!("executor connection {c}"),
            format!("axp-{tag}-x{c}"),
            ctok.to_owned(),
        ));
    }
    for c in 0..viewer_conns {
        who.push((
            format!("viewer connection {c}"),
            format!("axp-{tag}-v{c}"),
            ctok.to_owned(),
        ));
    }
    let ready = connect_all(args, addr, who)?;
    let connect_s = t_connect.elapsed().as_secs_f64();
    check_host(&ready[0].2, "maintainer")?;
    if let Some(c) = ready.get(1) {
        check_host(&c.2, "contributor")?;
    }
    let mut conns = Vec::with_capacity(ready.len());
    for (k, (r, what, _)) in ready.into_iter().enumerate() {
        let role = if k == 0 {
            Role::Maintainer { seq: 0 }
        } else if k <= exec_conns {
            Role::Executors
        } else {
            let vc = k - 1 - exec_conns;
            let first = (vc % per_group) * per_viewer;
            Role::Viewer {
                sessions: (first..(first + per_viewer).min(n)).collect(),
                received: 0,
            }
        };
        r.stream
            .set_nonblocking(true)
            .map_err(|e| format!("{what}: set non-blocking: {e}"))?;
        conns.push(Conn {
            stream: TcpStream::from_std(r.stream),
            what,
            inbuf: r.leftover,
            out: Vec::with_capacity(8192),
            out_head: 0,
            rng: ws::Rng::new(0xa5a5 ^ ((k as u64 + 1) << 20)),
            next_id: 10,
            pending: HashMap::new(),
            role,
            dirty: false,
        });
    }
    let execs: Vec<Exec> = (0..n)
        .map(|i| Exec {
            conn: 1 + i % exec_conns,
            session: format!("{prefix}-{i}"),
            executor: format!("x{tag}-{i}"),
            grant: format!("g{tag}-{i}"),
            epoch: 0,
            heartbeat: Duration::from_millis(args.lease_ms / 3),
            state: State::Setup,
            turn: String::new(),
            turn_no: 0,
            next_turn: None,
            queued_next: false,
            opened_part: false,
            emits_in_turn: 0,
            op: 0,
            inflight: 0,
            blocked_due: None,
            acked: 0,
            reserved_once: false,
            last_renew_ack: None,
            settle_sent: None,
        })
        .collect();

    let mut poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
    for (k, c) in conns.iter_mut().enumerate() {
        poll.registry()
            .register(
                &mut c.stream,
                Token(k),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| format!("{}: register: {e}", c.what))?;
    }
    let t0 = Instant::now();
    let far = t0 + Duration::from_secs(365 * 86_400);
    let mut w = World {
        args,
        t0,
        conns,
        execs,
        timers: BinaryHeap::new(),
        dirty: Vec::new(),
        phase: Phase::Sessions,
        period: Duration::from_secs_f64(1.0 / args.rate),
        start: far,
        end: far,
        h: Hists {
            emit_reply: histogram(),
            deliver: histogram(),
            renew: histogram(),
            cycle: histogram(),
            lag: histogram(),
        },
        created: 0,
        viewer_subs: 0,
        window_emits: 0,
        settles: 0,
        turns_started: 0,
        lease_changed_null: 0,
        stale_answers: 0,
        errors: BTreeMap::new(),
        error_samples: Vec::new(),
        max_renew_gap: Duration::ZERO,
        renewals: 0,
    };

    // ── Sessions ──
    for i in 0..n {
        let s = w.execs[i].session.clone();
        w.request(0, Req::Create(i), |id| proto::create_session(id, &s));
    }
    let mut t_phase = Instant::now();
    let (mut sessions_s, mut claims_s, mut turns_s) = (0.0, 0.0, 0.0);
    let mut rss_setup = None;
    let mut cpu_at_start: Option<(Option<f64>, Option<f64>, Option<f64>)> = None;
    let mut cpu_window = (None, None, None);

    let mut events = Events::with_capacity(4096);
    let mut last_check = Instant::now();
    let mut drain_until = far;
    // A fatal error (a connection the host closed, an answer that never came) ends the loop
    // but not the report: what was measured until then is printed with it.
    let outcome = (|| -> Result<(), String> {
        loop {
            let now = Instant::now();
            // Phase changes.
            match w.phase {
                Phase::Sessions if w.created == n => {
                    sessions_s = t_phase.elapsed().as_secs_f64();
                    t_phase = now;
                    w.phase = Phase::Claims;
                    w.start_claims();
                }
                Phase::Claims
                    if w.viewer_subs == n * v
                        && w.execs.iter().all(|e| e.state != State::Setup) =>
                {
                    claims_s = t_phase.elapsed().as_secs_f64();
                    t_phase = now;
                    w.phase = Phase::Turns;
                    for i in 0..n {
                        w.start_turn(i);
                    }
                }
                Phase::Turns
                    if w.execs
                        .iter()
                        .all(|e| e.reserved_once || e.state == State::Dead) =>
                {
                    turns_s = t_phase.elapsed().as_secs_f64();
                    rss_setup = args.host_pid.and_then(procfs::rss_kib);
                    w.phase = Phase::Steady;
                    w.start = now + args.warmup;
                    w.end = w.start + args.duration;
                    for i in 0..n {
                        // Spread the executors' emits evenly over one period.
                        let offset = w.period.mul_f64(i as f64 / n as f64);
                        w.timers.push(Reverse((now + offset, Timer::Emit, i)));
                    }
                }
                Phase::Steady if now >= w.start && cpu_at_start.is_none() => {
                    cpu_at_start = Some((
                        args.host_pid
                            .and_then(|p| procfs::cpu_seconds(&p.to_string())),
                        procfs::cpu_seconds("self"),
                        procfs::steal_seconds(),
                    ));
                }
                Phase::Steady if now >= w.end => {
                    let at_end = (
                        args.host_pid
                            .and_then(|p| procfs::cpu_seconds(&p.to_string())),
                        procfs::cpu_seconds("self"),
                        procfs::steal_seconds(),
                    );
                    if let Some(s) = cpu_at_start {
                        let secs = (now - w.start).as_secs_f64();
                        let pct = |a: Option<f64>, b: Option<f64>| {
                            a.zip(b).map(|(a, b)| (b - a) / secs * 100.0)
                        };
                        cpu_window = (
                            pct(s.0, at_end.0),
                            pct(s.1, at_end.1),
                            s.2.zip(at_end.2).map(|(a, b)| (b - a) * 1000.0),
                        );
                    }
                    w.phase = Phase::Drain;
                    drain_until = now + args.drain;
                }
                Phase::Drain if w.drained() || now >= drain_until => break,
                _ => {}
            }
            if now - last_check >= STALL_CHECK {
                last_check = now;
                w.check_stalls(now)?;
            }
            // Timers.
            while let Some(Reverse((at, timer, i))) = w.timers.peek().copied() {
                if at > now {
                    break;
                }
                w.timers.pop();
                w.on_timer(timer, i, at, now);
            }
            w.flush_dirty()?;
            let mut wait = STALL_CHECK;
            if let Some(Reverse((at, _, _))) = w.timers.peek() {
                wait = wait.min(at.saturating_duration_since(now));
            }
            if w.phase == Phase::Steady {
                wait = wait.min(w.end.saturating_duration_since(now));
            }
            match poll.poll(&mut events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(format!("poll: {e}")),
            }
            for ev in &events {
                let k = ev.token().0;
                if k >= w.conns.len() {
                    continue;
                }
                if ev.is_writable() {
                    w.flush(k)?;
                }
                if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                    w.on_readable(k)?;
                }
            }
            w.flush_dirty()?;
        }
        Ok(())
    })();
    let rss_after = args.host_pid.and_then(procfs::rss_kib);
    let mut report = w.report(
        (exec_conns, viewer_conns),
        (connect_s, sessions_s, claims_s, turns_s),
        (rss_before, rss_setup, rss_after),
        cpu_window,
    );
    report.fatal = outcome.err();
    Ok(report)
}

impl World<'_> {
    fn ns(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.t0).as_nanos() as u64
    }

    fn in_window(&self, sent: Instant) -> bool {
        sent >= self.start && sent < self.end
    }

    /// Queues request `req` on connection `c`; `build` gets its id.
    fn request(&mut self, c: usize, req: Req, build: impl FnOnce(u64) -> String) -> Instant {
        let conn = &mut self.conns[c];
        let id = conn.next_id;
        conn.next_id += 1;
        let text = build(id);
        ws::encode(
            &mut conn.out,
            ws::OP_TEXT,
            text.as_bytes(),
            conn.rng.next_u32().to_ne_bytes(),
        );
        let sent = Instant::now();
        conn.pending.insert(id, Pending { req, sent });
        if !conn.dirty {
            conn.dirty = true;
            self.dirty.push(c);
        }
        sent
    }

    fn flush(&mut self, c: usize) -> Result<(), String> {
        let conn = &mut self.conns[c];
        while conn.out_head < conn.out.len() {
            match conn.stream.write(&conn.out[conn.out_head..]) {
                Ok(0) => return Err(format!("{}: socket closed while writing", conn.what)),
                Ok(k) => conn.out_head += k,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{}: write: {e}", conn.what)),
            }
        }
        conn.out.clear();
        conn.out_head = 0;
        Ok(())
    }

    fn flush_dirty(&mut self) -> Result<(), String> {
        let dirty = std::mem::take(&mut self.dirty);
        for &c in &dirty {
            self.conns[c].dirty = false;
            self.flush(c)?;
        }
        self.dirty = dirty;
        self.dirty.clear();
        Ok(())
    }

    fn check_stalls(&self, now: Instant) -> Result<(), String> {
        for c in &self.conns {
            for p in c.pending.values() {
                if now - p.sent > self.args.reply_timeout {
                    let who = p
                        .req
                        .exec()
                        .map_or(String::new(), |i| format!(" ({})", self.execs[i].session));
                    return Err(format!(
                        "{}: no answer to {}{who} after {:?} (phase {:?}; the host lost an answer or stalled)",
                        c.what,
                        p.req.name(),
                        self.args.reply_timeout,
                        self.phase
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every answer in, and every viewer holds every acknowledged emit of its sessions.
    fn drained(&self) -> bool {
        self.conns.iter().all(|c| c.pending.is_empty())
            && self.conns.iter().all(|c| match &c.role {
                Role::Viewer { sessions, received } => {
                    *received >= sessions.iter().map(|&i| self.execs[i].acked).sum::<u64>()
                }
                _ => true,
            })
    }

    // ── Setup steps ──

    fn start_claims(&mut self) {
        for c in 0..self.conns.len() {
            let sessions = match &self.conns[c].role {
                Role::Viewer { sessions, .. } => sessions.clone(),
                _ => continue,
            };
            for i in sessions {
                let chat = format!("ahp-chat:/{}", self.execs[i].session);
                self.request(c, Req::ViewerSubscribe, |id| proto::subscribe(id, &chat));
            }
        }
        for i in 0..self.execs.len() {
            let e = &self.execs[i];
            let ch = format!("axp-session:/{}", e.session);
            self.request(e.conn, Req::SubscribeExchange(i), |id| {
                proto::subscribe(id, &ch)
            });
        }
    }

    fn register(&mut self, i: usize) {
        let ttl = self.args.ttl_ms;
        let e = &mut self.execs[i];
        let conn = e.conn;
        let op = e.next_op("reg");
        let executor = e.executor.clone();
        self.request(conn, Req::Register(i), |id| {
            proto::register(id, &op, &executor, ttl)
        });
    }

    fn grant(&mut self, i: usize) {
        let e = &mut self.execs[i];
        let conn = e.conn;
        let op = e.next_op("grant");
        let (s, g) = (e.session.clone(), e.grant.clone());
        self.request(conn, Req::Grant(i), |id| {
            proto::grant(id, &s, &op, &g, GRANT_LIMIT)
        });
    }

    fn claim(&mut self, i: usize) {
        let lease = self.args.lease_ms;
        let e = &mut self.execs[i];
        let conn = e.conn;
        let op = e.next_op("claim");
        let (s, x, g) = (e.session.clone(), e.executor.clone(), e.grant.clone());
        self.request(conn, Req::Claim(i), |id| {
            proto::claim(id, &s, &op, &x, &g, lease)
        });
    }

    /// The maintainer starts turn `turn_no + 1` on session `i`.
    fn start_turn(&mut self, i: usize) {
        let Role::Maintainer { seq } = &mut self.conns[0].role else {
            return;
        };
        *seq += 1;
        let seq = *seq;
        let e = &self.execs[i];
        let turn = format!("t{}-{}", i, e.turn_no + 1);
        let s = e.session.clone();
        self.request(0, Req::TurnStart(i), |id| {
            proto::turn_started(id, &s, seq, &turn)
        });
    }

    /// The maintainer queues the message that becomes session `i`'s next turn.
    fn queue_next(&mut self, i: usize) {
        let Role::Maintainer { seq } = &mut self.conns[0].role else {
            return;
        };
        *seq += 1;
        let seq = *seq;
        let e = &self.execs[i];
        let m = format!("q{}-{}", i, e.turn_no + 1);
        let s = e.session.clone();
        self.request(0, Req::Queue(i), |id| proto::queue_message(id, &s, seq, &m));
    }

    /// Reserves the next turn if it is known and the executor waits for one.
    fn maybe_reserve(&mut self, i: usize) {
        let e = &mut self.execs[i];
        let conn = e.conn;
        if e.state != State::WaitTurn {
            return;
        }
        let Some(next) = e.next_turn.take() else {
            return;
        };
        if next == e.turn {
            return;
        }
        e.turn = next;
        e.turn_no += 1;
        e.state = State::Reserving;
        e.opened_part = false;
        e.emits_in_turn = 0;
        e.queued_next = false;
        let op = e.next_op("reserve");
        let (s, t, epoch) = (e.session.clone(), e.turn.clone(), e.epoch);
        self.request(conn, Req::Reserve(i), |id| {
            proto::reserve(id, &s, &op, epoch, &t, CEILING)
        });
    }

    fn settle(&mut self, i: usize) {
        let k = u64::from(self.args.settle_every) * u64::from(self.args.batch);
        let e = &mut self.execs[i];
        let conn = e.conn;
        e.state = State::Settling;
        let op = e.next_op("settle");
        let (s, t, epoch) = (e.session.clone(), e.turn.clone(), e.epoch);
        let usage = proto::Usage {
            input: 200,
            output: 4 * k,
            cache_read: 100,
            cost_micros: 1000,
        };
        let sent = self.request(conn, Req::Settle(i), |id| {
            proto::settle(id, &s, &op, epoch, &t, usage)
        });
        self.execs[i].settle_sent = Some(sent);
    }

    // ── Steady state ──

    fn on_timer(&mut self, timer: Timer, i: usize, due: Instant, now: Instant) {
        let open = matches!(self.phase, Phase::Steady);
        match timer {
            Timer::Renew => {
                if self.phase == Phase::Drain || self.execs[i].state == State::Dead {
                    return;
                }
                let e = &mut self.execs[i];
                let conn = e.conn;
                let op = e.next_op("renew");
                let (s, epoch, hb) = (e.session.clone(), e.epoch, e.heartbeat);
                self.request(conn, Req::Renew(i), |id| proto::renew(id, &s, &op, epoch));
                self.timers.push(Reverse((due + hb, Timer::Renew, i)));
            }
            Timer::Emit => {
                if !open || self.execs[i].state == State::Dead {
                    return;
                }
                let e = &self.execs[i];
                if e.state == State::Ready && e.inflight < self.args.max_inflight {
                    self.emit(i, due, now);
                } else {
                    self.execs[i].blocked_due = Some(due);
                }
            }
        }
    }

    /// Sends the emit that fell due at `due`, schedules the next, and settles after the K-th.
    fn emit(&mut self, i: usize, due: Instant, now: Instant) {
        let batch = self.args.batch;
        let stamp_at = Instant::now();
        let stamp = self.ns(stamp_at);
        let e = &mut self.execs[i];
        let conn = e.conn;
        e.blocked_due = None;
        let opens = !e.opened_part;
        e.opened_part = true;
        e.emits_in_turn += 1;
        e.inflight += 1;
        let op = e.next_op("emit");
        let part = format!("p{}", e.turn_no);
        let (s, t, epoch) = (e.session.clone(), e.turn.clone(), e.epoch);
        self.request(conn, Req::Emit(i, stamp), |id| {
            proto::emit(id, &s, &op, epoch, &t, &part, opens, batch, stamp)
        });
        if self.in_window(stamp_at) {
            self.h
                .lag
                .saturating_record(now.saturating_duration_since(due).as_nanos() as u64);
        }
        self.timers
            .push(Reverse((due + self.period, Timer::Emit, i)));
        // The first turn is a share of K emits long, spread over the executors, so that their
        // settles (and the next turns' starts and reservations) spread over K periods instead
        // of coming all together every K periods.
        let k = self.args.settle_every;
        let turn_len = if self.execs[i].turn_no <= 1 {
            let n = self.execs.len() as u64;
            (u64::from(k) * (i as u64 + 1)).div_ceil(n).max(1) as u32
        } else {
            k
        };
        if self.execs[i].emits_in_turn >= turn_len {
            if self.args.cycle == Cycle::Queue && !self.execs[i].queued_next {
                self.execs[i].state = State::SettleDue;
            } else {
                self.settle(i);
            }
        }
    }

    /// Sends an emit that waited, if the executor can now.
    fn unblock(&mut self, i: usize) {
        let e = &self.execs[i];
        if self.phase != Phase::Steady
            || e.state != State::Ready
            || e.inflight >= self.args.max_inflight
        {
            return;
        }
        if let Some(due) = e.blocked_due {
            self.emit(i, due, Instant::now());
        }
    }

    // ── Reading ──

    fn on_readable(&mut self, c: usize) -> Result<(), String> {
        let mut chunk = [0u8; READ_CHUNK];
        loop {
            let read = self.conns[c].stream.read(&mut chunk);
            match read {
                Ok(0) => {
                    return Err(format!(
                        "{}: the host closed the connection (phase {:?})",
                        self.conns[c].what, self.phase
                    ))
                }
                Ok(k) => {
                    let now = Instant::now();
                    let mut inbuf = std::mem::take(&mut self.conns[c].inbuf);
                    if inbuf.len() + k > IN_MAX {
                        return Err(format!(
                            "{}: over {IN_MAX} bytes unparsed",
                            self.conns[c].what
                        ));
                    }
                    inbuf.extend_from_slice(&chunk[..k]);
                    let res = self.frames(c, &mut inbuf, now);
                    self.conns[c].inbuf = inbuf;
                    res?;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{}: read: {e}", self.conns[c].what)),
            }
        }
    }

    fn frames(&mut self, c: usize, inbuf: &mut Vec<u8>, now: Instant) -> Result<(), String> {
        let mut used = 0;
        while let Some(f) =
            ws::parse(&mut inbuf[used..]).map_err(|e| format!("{}: {e}", self.conns[c].what))?
        {
            let (start, end) = (used + f.start, used + f.end);
            used += f.end;
            if !f.fin || f.opcode == ws::OP_CONT {
                return Err(format!(
                    "{}: fragmented frame from the host",
                    self.conns[c].what
                ));
            }
            match f.opcode {
                ws::OP_TEXT => {
                    let text = std::str::from_utf8(&inbuf[start..end])
                        .map_err(|_| format!("{}: text frame not UTF-8", self.conns[c].what))?;
                    self.on_text(c, text, now)?;
                }
                ws::OP_PING => {
                    let body = inbuf[start..end].to_vec();
                    let conn = &mut self.conns[c];
                    ws::encode(
                        &mut conn.out,
                        ws::OP_PONG,
                        &body,
                        conn.rng.next_u32().to_ne_bytes(),
                    );
                    if !conn.dirty {
                        conn.dirty = true;
                        self.dirty.push(c);
                    }
                }
                ws::OP_CLOSE => {
                    let body = &inbuf[start..end];
                    let code = body.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
                    return Err(format!(
                        "{}: the host closed the WebSocket (code {code:?}, reason {:?}, phase {:?})",
                        self.conns[c].what,
                        String::from_utf8_lossy(body.get(2..).unwrap_or(&[])),
                        self.phase
                    ));
                }
                _ => {}
            }
        }
        inbuf.drain(..used);
        Ok(())
    }

    fn on_text(&mut self, c: usize, text: &str, now: Instant) -> Result<(), String> {
        match proto::classify(text) {
            proto::Incoming::Reply { id, error } => {
                let Some(p) = self.conns[c].pending.remove(&id) else {
                    return Err(format!(
                        "{}: an answer to request {id}, which is not outstanding: {}",
                        self.conns[c].what,
                        text.chars().take(300).collect::<String>()
                    ));
                };
                match error {
                    None => self.on_result(p, text, now),
                    Some(code) => {
                        self.on_error(c, p, code, text);
                        Ok(())
                    }
                }
            }
            proto::Incoming::Action { channel } => {
                self.on_action(c, channel, text, now);
                Ok(())
            }
            proto::Incoming::Other => Ok(()),
        }
    }

    fn on_error(&mut self, c: usize, p: Pending, code: i64, text: &str) {
        *self.errors.entry(code).or_default() += 1;
        if code == -32040 {
            self.stale_answers += 1;
        }
        if self.error_samples.len() < ERROR_SAMPLES {
            let who = p
                .req
                .exec()
                .map_or(String::new(), |i| format!(" on {}", self.execs[i].session));
            self.error_samples.push(format!(
                "{} {}{who}: {code} {:?} (phase {:?})",
                self.conns[c].what,
                p.req.name(),
                proto::error_message(text),
                self.phase
            ));
        }
        match p.req {
            Req::Emit(i, _) => {
                self.execs[i].inflight = self.execs[i].inflight.saturating_sub(1);
                self.kill(i);
            }
            // Counted as done, so setup ends; the error fails the run.
            Req::ViewerSubscribe => self.viewer_subs += 1,
            Req::Create(i) => {
                self.created += 1;
                self.kill(i);
            }
            req => {
                if let Some(i) = req.exec() {
                    self.kill(i);
                }
            }
        }
    }

    /// An executor that got an error answer or lost its lease stops; the run goes on (and
    /// fails at the end), so the report shows how many broke.
    fn kill(&mut self, i: usize) {
        let e = &mut self.execs[i];
        e.state = State::Dead;
        e.blocked_due = None;
    }

    fn on_result(&mut self, p: Pending, text: &str, now: Instant) -> Result<(), String> {
        let elapsed = now.saturating_duration_since(p.sent);
        match p.req {
            Req::Create(_) => self.created += 1,
            Req::ViewerSubscribe => self.viewer_subs += 1,
            Req::SubscribeExchange(i) => {
                if self.execs[i].state == State::Dead {
                    return Ok(());
                }
                if self.args.cycle == Cycle::Queue {
                    let e = &self.execs[i];
                    let ch = format!("ahp-chat:/{}", e.session);
                    self.request(e.conn, Req::SubscribeChat(i), |id| {
                        proto::subscribe(id, &ch)
                    });
                } else {
                    self.register(i);
                }
            }
            Req::SubscribeChat(i) => {
                if self.execs[i].state != State::Dead {
                    self.register(i);
                }
            }
            Req::Register(i) => {
                if self.execs[i].state != State::Dead {
                    self.grant(i);
                }
            }
            Req::Grant(i) => {
                if self.execs[i].state != State::Dead {
                    self.claim(i);
                }
            }
            Req::Claim(i) => {
                let e = &mut self.execs[i];
                if e.state == State::Dead {
                    return Ok(());
                }
                let (Some(epoch), Some(hb)) = (
                    proto::int_after(text, "epoch").and_then(|x| u64::try_from(x).ok()),
                    proto::int_after(text, "heartbeatMs").and_then(|x| u64::try_from(x).ok()),
                ) else {
                    return Err(format!(
                        "{}: _axp/claim answer without epoch and heartbeatMs: {}",
                        e.session,
                        text.chars().take(300).collect::<String>()
                    ));
                };
                e.epoch = epoch;
                e.heartbeat = Duration::from_millis(hb.max(1));
                e.state = State::WaitTurn;
                e.last_renew_ack = Some(now);
                // The first renewal comes a share of a heartbeat after the claim, spread over
                // the executors (at most one heartbeat), so that claims made together do not
                // renew together for the rest of the run: N / heartbeat renewals a second.
                let first = e
                    .heartbeat
                    .mul_f64((i + 1) as f64 / self.execs.len() as f64);
                self.timers.push(Reverse((now + first, Timer::Renew, i)));
            }
            Req::TurnStart(i) => {
                self.turns_started += 1;
                let e = &mut self.execs[i];
                if e.state == State::Dead {
                    return Ok(());
                }
                if self.args.cycle == Cycle::Start {
                    e.next_turn = Some(format!("t{}-{}", i, e.turn_no + 1));
                    self.maybe_reserve(i);
                }
            }
            Req::Queue(i) => {
                let e = &mut self.execs[i];
                e.queued_next = true;
                if e.state == State::SettleDue {
                    self.settle(i);
                }
            }
            Req::Reserve(i) => {
                let e = &mut self.execs[i];
                if e.state == State::Dead {
                    return Ok(());
                }
                e.state = State::Ready;
                e.reserved_once = true;
                if let Some(sent) = e.settle_sent.take() {
                    if self.in_window(sent) {
                        self.h.cycle.saturating_record(
                            now.saturating_duration_since(sent).as_nanos() as u64,
                        );
                    }
                }
                if self.args.cycle == Cycle::Queue && self.phase != Phase::Drain {
                    self.queue_next(i);
                }
                self.unblock(i);
            }
            Req::Emit(i, stamp) => {
                let sent = self.t0 + Duration::from_nanos(stamp);
                let in_window = self.in_window(sent);
                let e = &mut self.execs[i];
                e.inflight = e.inflight.saturating_sub(1);
                e.acked += 1;
                if in_window {
                    self.window_emits += 1;
                    self.h
                        .emit_reply
                        .saturating_record(elapsed.as_nanos() as u64);
                }
                self.unblock(i);
            }
            Req::Renew(i) => {
                self.renewals += 1;
                self.h.renew.saturating_record(elapsed.as_nanos() as u64);
                let e = &mut self.execs[i];
                if let Some(last) = e.last_renew_ack.replace(now) {
                    self.max_renew_gap = self.max_renew_gap.max(now - last);
                }
            }
            Req::Settle(i) => {
                self.settles += 1;
                let e = &mut self.execs[i];
                if e.state == State::Dead {
                    return Ok(());
                }
                e.state = State::WaitTurn;
                if self.phase == Phase::Drain {
                    return Ok(());
                }
                match self.args.cycle {
                    Cycle::Start => self.start_turn(i),
                    Cycle::Queue => self.maybe_reserve(i),
                }
            }
        }
        Ok(())
    }

    fn on_action(&mut self, c: usize, channel: &str, text: &str, now: Instant) {
        let prefix = &self.args.session_prefix;
        match &mut self.conns[c].role {
            Role::Viewer { received, .. } => {
                if let Some(stamp) = proto::stamp(text) {
                    *received += 1;
                    let sent = self.t0 + Duration::from_nanos(stamp);
                    if sent >= self.start && sent < self.end {
                        self.h.deliver.saturating_record(
                            now.saturating_duration_since(sent).as_nanos() as u64,
                        );
                    }
                }
            }
            Role::Executors => {
                if let Some(i) = proto::session_index(channel, "axp-session:/", prefix) {
                    if proto::lease_lost(text) {
                        self.lease_changed_null += 1;
                        if self.error_samples.len() < ERROR_SAMPLES {
                            self.error_samples.push(format!(
                                "lease lost on {channel} (phase {:?}): {}",
                                self.phase,
                                text.chars().take(300).collect::<String>()
                            ));
                        }
                        if i < self.execs.len() {
                            self.kill(i);
                        }
                    }
                } else if let Some(i) = proto::session_index(channel, "ahp-chat:/", prefix) {
                    if let (Some(turn), true) = (proto::started_turn(text), i < self.execs.len()) {
                        let turn = turn.to_owned();
                        self.execs[i].next_turn = Some(turn);
                        if self.phase != Phase::Drain {
                            self.maybe_reserve(i);
                        }
                    }
                }
            }
            Role::Maintainer { .. } => {}
        }
    }

    fn report(
        &self,
        conns: (usize, usize),
        setup_s: (f64, f64, f64, f64),
        rss: (Option<u64>, Option<u64>, Option<u64>),
        cpu: (Option<f64>, Option<f64>, Option<f64>),
    ) -> Report {
        let expected: u64 = self
            .conns
            .iter()
            .map(|c| match &c.role {
                Role::Viewer { sessions, .. } => {
                    sessions.iter().map(|&i| self.execs[i].acked).sum::<u64>()
                }
                _ => 0,
            })
            .sum();
        let received: u64 = self
            .conns
            .iter()
            .map(|c| match &c.role {
                Role::Viewer { received, .. } => *received,
                _ => 0,
            })
            .sum();
        let unanswered: usize = self.conns.iter().map(|c| c.pending.len()).sum();
        Report {
            exec_conns: conns.0,
            viewer_conns: conns.1,
            connect_s: setup_s.0,
            sessions_s: setup_s.1,
            claims_s: setup_s.2,
            turns_s: setup_s.3,
            window_s: self.args.duration.as_secs_f64(),
            window_emits: self.window_emits,
            emits_total: self.execs.iter().map(|e| e.acked).sum(),
            emit_reply: Quantiles::of(&self.h.emit_reply),
            deliver: Quantiles::of(&self.h.deliver),
            renew: Quantiles::of(&self.h.renew),
            cycle: Quantiles::of(&self.h.cycle),
            lag: Quantiles::of(&self.h.lag),
            deliveries_expected: expected,
            deliveries_received: received,
            unanswered,
            settles: self.settles,
            turns_started: self.turns_started,
            renewals: self.renewals,
            max_renew_gap_ms: self.max_renew_gap.as_secs_f64() * 1000.0,
            lease_changed_null: self.lease_changed_null,
            stale_answers: self.stale_answers,
            dead_executors: self.execs.iter().filter(|e| e.state == State::Dead).count(),
            errors: self.errors.clone(),
            error_samples: self.error_samples.clone(),
            rss_before_kib: rss.0,
            rss_setup_kib: rss.1,
            rss_after_kib: rss.2,
            host_cpu_pct: cpu.0,
            tool_cpu_pct: cpu.1,
            steal_ms: cpu.2,
            fatal: None,
        }
    }
}
