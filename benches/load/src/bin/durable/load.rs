//! The measured loop: one thread, one mio `Poll`, every connection non-blocking.
//!
//! Setup is blocking and sequential (the service owner registers, the requester learns the
//! service id, each writer creates its session and subscribes to its chat); then every
//! connection sends its first message at once, and runs closed-loop: the next message leaves
//! in the same loop turn as the reply to the previous one is read. Latency is the time from the
//! moment a message was handed to the socket to the read that completed its echo or response,
//! so it includes the tool's own wake-up (microseconds against the milliseconds a commit
//! takes). Counts and latencies cover what was read inside the window that follows the warmup.
//!
//! What an echo is: an `action` notification on the writer's own connection whose origin
//! carries the writer's `clientId` and the `clientSeq` it is waiting for. A rejection echo
//! (`rejectionReason`) is a change that did not happen, and ends the run with an error rather
//! than being counted. So does any error response, a closed connection, or a reply that takes
//! longer than `--reply-timeout`.

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axhost_load::{setup, ws};
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::Args;

/// Turns one writer starts on a session before it moves to a fresh one. The host charges each
/// turn its id, its message and 128 bytes against `chat_bytes_max` (8 MiB by default) and
/// never frees it; the tool's turns cost under 200 bytes, so 20,000 of them (4 MB) stay well
/// inside, whatever the run's length.
const TURNS_PER_SESSION: u64 = 20_000;
/// Bytes asked of one `read` (an echo is a few hundred).
const READ_CHUNK: usize = 16 * 1024;
/// Unparsed bytes one connection may hold: the largest frame the parser accepts and its header.
const IN_MAX: usize = ws::MAX_FRAME + 14;
/// How often waits are checked against `--reply-timeout`.
const STALL_CHECK: Duration = Duration::from_millis(100);
/// The request id a requester starts from (setup used the small ones).
const FIRST_REQUEST_ID: u64 = 1000;
/// A fixed `startedAt`: the host replaces it with its own clock.
const STARTED_AT: &str = "2020-01-01T00:00:00.000Z";

/// Where a writer is in its cycle: what it sent last and now waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The echo of `chat/turnStarted` with this `clientSeq`.
    Started(u64),
    /// The echo of `chat/turnCancelled` with this `clientSeq`.
    Cancelled(u64),
    /// The reply to `createSession` (moving to a fresh session), request id.
    Creating(u64),
    /// The reply to `subscribe` on the fresh session's chat, request id.
    Subscribing(u64),
}

struct Writer {
    client_id: String,
    /// Session ids are `{session_prefix}-{n}`.
    session_prefix: String,
    /// Sessions this writer has used (the current one is number `sessions - 1`).
    sessions: u64,
    /// `ahp-chat:/…` of the current session.
    chat: String,
    /// The last `clientSeq` sent.
    seq: u64,
    /// The current turn's number (its id is `t{turn}`).
    turn: u64,
    /// Turns started on the current session.
    turns_here: u64,
    /// The next request id (session moves).
    next_id: u64,
    step: Step,
    /// Changes echoed inside the window.
    window_changes: u64,
}

enum Role {
    Writer(Writer),
    /// Registers the service and answers each `clientService/handleRequest` at once.
    Owner,
    /// Sends `clientService/request` to the owner's service closed-loop, the next one `gap`
    /// after each response (at once when zero).
    Requester {
        service_id: String,
        id: u64,
        gap: Duration,
        /// When the next request is due (only while waiting out a gap).
        due: Option<Instant>,
    },
}

struct Conn {
    stream: TcpStream,
    what: String,
    /// What one `read` fills, allocated once.
    chunk: Box<[u8]>,
    /// Bytes read and not yet parsed.
    inbuf: Vec<u8>,
    out: Vec<u8>,
    out_head: usize,
    rng: ws::Rng,
    role: Role,
    /// When the message now awaited was handed to the socket (`None`: nothing awaited).
    sent_at: Option<Instant>,
}

/// What one reply completed.
enum Done {
    Change(Duration),
    Request(Duration),
}

/// Latency quantiles in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct Quantiles {
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Quantiles {
    fn of(h: &Histogram<u64>) -> Option<Quantiles> {
        (!h.is_empty()).then(|| Quantiles {
            count: h.len(),
            p50_us: h.value_at_quantile(0.50) as f64 / 1e3,
            p99_us: h.value_at_quantile(0.99) as f64 / 1e3,
            p999_us: h.value_at_quantile(0.999) as f64 / 1e3,
            max_us: h.max() as f64 / 1e3,
        })
    }
}

pub struct Report {
    pub window_s: f64,
    /// Echoes (durable changes) and their latency inside the window; `None` without writers
    /// (or when none came back).
    pub echo: Option<Quantiles>,
    /// Fewest and most changes one writer got echoed inside the window.
    pub writer_min: u64,
    pub writer_max: u64,
    /// Sessions the writers moved to during the run (beyond their first).
    pub session_moves: u64,
    /// Request/response round trips inside the window; `None` without `--requests`.
    pub request: Option<Quantiles>,
}

fn fmt_q(q: &Quantiles) -> String {
    format!(
        "p50 {:.1} µs p99 {:.1} µs p99.9 {:.1} µs max {:.1} µs",
        q.p50_us, q.p99_us, q.p999_us, q.max_us
    )
}

fn json_q(prefix: &str, q: Option<&Quantiles>) -> String {
    match q {
        Some(q) => format!(
            "\"{prefix}_p50_us\":{:.1},\"{prefix}_p99_us\":{:.1},\"{prefix}_p999_us\":{:.1},\"{prefix}_max_us\":{:.1}",
            q.p50_us, q.p99_us, q.p999_us, q.max_us
        ),
        None => format!(
            "\"{prefix}_p50_us\":null,\"{prefix}_p99_us\":null,\"{prefix}_p999_us\":null,\"{prefix}_max_us\":null"
        ),
    }
}

impl Report {
    fn rate(&self, q: Option<&Quantiles>) -> f64 {
        q.map_or(0.0, |q| q.count as f64 / self.window_s)
    }

    pub fn human(&self, args: &Args) -> String {
        let mut s = format!("axhost durable: {} writer(s)", args.writers);
        if args.writers > 0 {
            match &self.echo {
                Some(q) => s.push_str(&format!(
                    ": {:.0} changes/s ({} in {:.1} s, per writer {}-{}), echo {}",
                    self.rate(Some(q)),
                    q.count,
                    self.window_s,
                    self.writer_min,
                    self.writer_max,
                    fmt_q(q)
                )),
                None => s.push_str(": no echo in the window"),
            }
            if self.session_moves > 0 {
                s.push_str(&format!(", {} session moves", self.session_moves));
            }
        }
        if args.requests {
            match &self.request {
                Some(q) => s.push_str(&format!(
                    "; requests: {:.0}/s ({} in {:.1} s), {}",
                    self.rate(Some(q)),
                    q.count,
                    self.window_s,
                    fmt_q(q)
                )),
                None => s.push_str("; requests: none completed in the window"),
            }
        }
        s
    }

    pub fn json(&self, args: &Args) -> String {
        format!(
            "{{\"writers\":{},\"requests\":{},\"window_s\":{:.3},\"changes\":{},\"changes_per_s\":{:.1},{},\
             \"writer_min\":{},\"writer_max\":{},\"session_moves\":{},\"request_count\":{},\"requests_per_s\":{:.1},{}}}",
            args.writers,
            args.requests,
            self.window_s,
            self.echo.map_or(0, |q| q.count),
            self.rate(self.echo.as_ref()),
            json_q("echo", self.echo.as_ref()),
            self.writer_min,
            self.writer_max,
            self.session_moves,
            self.request.map_or(0, |q| q.count),
            self.rate(self.request.as_ref()),
            json_q("request", self.request.as_ref()),
        )
    }
}

// ─── Frames: what the tool sends and how it recognises replies ───────────────

fn turn_started(chat: &str, seq: u64, turn: u64) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"dispatchAction\",\"params\":{{\"channel\":\"{chat}\",\
         \"clientSeq\":{seq},\"action\":{{\"type\":\"chat/turnStarted\",\"turnId\":\"t{turn}\",\
         \"startedAt\":\"{STARTED_AT}\",\"message\":{{\"text\":\"durable\",\"origin\":{{\"kind\":\"user\"}}}}}}}}}}"
    )
}

fn turn_cancelled(chat: &str, seq: u64, turn: u64) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"method\":\"dispatchAction\",\"params\":{{\"channel\":\"{chat}\",\
         \"clientSeq\":{seq},\"action\":{{\"type\":\"chat/turnCancelled\",\"turnId\":\"t{turn}\",\
         \"duration\":1}}}}}}"
    )
}

fn create_session(id: u64, session: &str) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"createSession\",\"params\":{{\
         \"channel\":\"ahp-session:/{session}\"}}}}"
    )
}

fn subscribe(id: u64, channel: &str) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"subscribe\",\"params\":{{\"channel\":\"{channel}\"}}}}"
    )
}

fn service_request(id: u64, service_id: &str) -> String {
    format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":{id},\"method\":\"clientService/request\",\"params\":{{\
         \"channel\":\"x-client-services://\",\"serviceId\":\"{service_id}\",\"method\":\"bench/echo\",\
         \"params\":{{\"k\":1}}}}}}"
    )
}

fn service_response(id: u64) -> String {
    format!("{{\"jsonrpc\":\"2.0\",\"id\":{id},\"result\":{{\"ok\":true}}}}")
}

/// Whether `text` holds `"key":N` with exactly the number `n` (not a longer number).
fn has_number(text: &str, key: &str, n: u64) -> bool {
    let needle = format!("\"{key}\":{n}");
    text.match_indices(&needle).any(|(at, _)| {
        !text[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// What an incoming frame is to a writer waiting for the echo of `seq`.
#[derive(Debug, PartialEq, Eq)]
enum Echo {
    /// Its echo, applied.
    Applied,
    /// Its echo, rejected (the text).
    Rejected,
    /// Something else (another notification).
    Other,
}

fn classify_echo(text: &str, client_id: &str, seq: u64) -> Echo {
    let mine = text.contains("\"method\":\"action\"")
        && text.contains(&format!("\"clientId\":\"{client_id}\""))
        && has_number(text, "clientSeq", seq);
    match (mine, text.contains("\"rejectionReason\"")) {
        (false, _) => Echo::Other,
        (true, false) => Echo::Applied,
        (true, true) => Echo::Rejected,
    }
}

/// For a response to request `id`: `Some(Ok)` for a result, `Some(Err)` for an error;
/// `None` when `text` is not that response.
fn classify_reply(text: &str, id: u64) -> Option<Result<(), ()>> {
    if !has_number(text, "id", id) || text.contains("\"method\":") {
        return None;
    }
    if text.contains("\"error\":") {
        Some(Err(()))
    } else if text.contains("\"result\":") {
        Some(Ok(()))
    } else {
        None
    }
}

/// The host's id of a `clientService/handleRequest` frame.
fn host_request_id(text: &str) -> Option<u64> {
    if !text.contains("\"method\":\"clientService/handleRequest\"") {
        return None;
    }
    let at = text.find("\"id\":")? + 5;
    let digits: String = text[at..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

fn short(text: &str) -> String {
    text.chars().take(400).collect()
}

// ─── Connections ─────────────────────────────────────────────────────────────

impl Conn {
    fn new(ready: setup::Ready, what: String, seed: u64, role: Role) -> Result<Conn, String> {
        ready
            .stream
            .set_nonblocking(true)
            .map_err(|e| format!("{what}: set non-blocking: {e}"))?;
        Ok(Conn {
            stream: TcpStream::from_std(ready.stream),
            what,
            chunk: vec![0; READ_CHUNK].into_boxed_slice(),
            inbuf: ready.leftover,
            out: Vec::with_capacity(4096),
            out_head: 0,
            rng: ws::Rng::new(seed),
            role,
            sent_at: None,
        })
    }

    /// Queues a masked frame and writes what the socket takes.
    fn push(&mut self, opcode: u8, payload: &[u8]) -> Result<(), String> {
        ws::encode(
            &mut self.out,
            opcode,
            payload,
            self.rng.next_u32().to_ne_bytes(),
        );
        self.flush()
    }

    /// Sends a message that expects a reply, and starts its clock.
    fn send_awaited(&mut self, text: &str) -> Result<(), String> {
        ws::encode(
            &mut self.out,
            ws::OP_TEXT,
            text.as_bytes(),
            self.rng.next_u32().to_ne_bytes(),
        );
        self.sent_at = Some(Instant::now());
        self.flush()
    }

    fn flush(&mut self) -> Result<(), String> {
        while self.out_head < self.out.len() {
            match self.stream.write(&self.out[self.out_head..]) {
                Ok(0) => return Err(format!("{}: socket closed while writing", self.what)),
                Ok(n) => self.out_head += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{}: write: {e}", self.what)),
            }
        }
        self.out.clear();
        self.out_head = 0;
        Ok(())
    }

    /// A requester whose gap has passed sends its next request; returns when the next one is
    /// due otherwise.
    fn send_due(&mut self, now: Instant) -> Result<Option<Instant>, String> {
        let Role::Requester { due: Some(at), .. } = self.role else {
            return Ok(None);
        };
        if now < at {
            return Ok(Some(at));
        }
        if let Role::Requester { due, .. } = &mut self.role {
            *due = None;
        }
        self.kick()?;
        Ok(None)
    }

    /// The first message of the closed loop.
    fn kick(&mut self) -> Result<(), String> {
        let text = match &mut self.role {
            Role::Writer(w) => {
                w.seq += 1;
                w.turn += 1;
                w.turns_here += 1;
                w.step = Step::Started(w.seq);
                turn_started(&w.chat, w.seq, w.turn)
            }
            Role::Requester { service_id, id, .. } => service_request(*id, service_id),
            Role::Owner => return Ok(()),
        };
        self.send_awaited(&text)
    }

    /// Reads everything the socket has (edge-triggered) and handles each complete frame.
    /// `record` gets every reply read inside the window; `open` is false once the window has
    /// ended, when nothing new is sent.
    fn on_readable(
        &mut self,
        open: bool,
        record: &mut dyn FnMut(Done, Instant),
    ) -> Result<(), String> {
        loop {
            match self.stream.read(&mut self.chunk) {
                Ok(0) => return Err(format!("{}: the host closed the connection", self.what)),
                Ok(n) => {
                    let now = Instant::now();
                    if self.inbuf.len() + n > IN_MAX {
                        return Err(format!("{}: over {IN_MAX} bytes unparsed", self.what));
                    }
                    self.inbuf.extend_from_slice(&self.chunk[..n]);
                    self.frames(now, open, record)?;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(format!("{}: read: {e}", self.what)),
            }
        }
    }

    fn frames(
        &mut self,
        now: Instant,
        open: bool,
        record: &mut dyn FnMut(Done, Instant),
    ) -> Result<(), String> {
        let mut used = 0;
        while let Some(f) =
            ws::parse(&mut self.inbuf[used..]).map_err(|e| format!("{}: {e}", self.what))?
        {
            let (start, end) = (used + f.start, used + f.end);
            used += f.end;
            if !f.fin || f.opcode == ws::OP_CONT {
                return Err(format!("{}: fragmented frame from the host", self.what));
            }
            match f.opcode {
                ws::OP_TEXT => {
                    let text = String::from_utf8_lossy(&self.inbuf[start..end]).into_owned();
                    if let Some(done) = self.on_text(&text, now, open)? {
                        record(done, now);
                    }
                }
                ws::OP_PING => {
                    let body = self.inbuf[start..end].to_vec();
                    self.push(ws::OP_PONG, &body)?;
                }
                ws::OP_CLOSE => {
                    let body = &self.inbuf[start..end];
                    let code = body.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
                    return Err(format!(
                        "{}: the host closed the WebSocket (code {code:?}, reason {:?})",
                        self.what,
                        String::from_utf8_lossy(body.get(2..).unwrap_or(&[]))
                    ));
                }
                _ => {}
            }
        }
        self.inbuf.drain(..used);
        Ok(())
    }

    /// Handles one text frame; returns what it completed, if anything, and sends the next
    /// message of the loop while `open`.
    fn on_text(&mut self, text: &str, now: Instant, open: bool) -> Result<Option<Done>, String> {
        let elapsed = |sent: Option<Instant>| sent.map_or(Duration::ZERO, |t| now - t);
        let what = &self.what;
        let (done, next) = match &mut self.role {
            Role::Owner => {
                let Some(id) = host_request_id(text) else {
                    return Ok(None);
                };
                let reply = service_response(id);
                self.push(ws::OP_TEXT, reply.as_bytes())?;
                return Ok(None);
            }
            Role::Requester {
                service_id,
                id,
                gap,
                due,
            } => match classify_reply(text, *id) {
                None => return Ok(None),
                Some(Err(())) => {
                    return Err(format!("{what}: request {id} failed: {}", short(text)))
                }
                Some(Ok(())) => {
                    *id += 1;
                    let done = Some(Done::Request(elapsed(self.sent_at)));
                    if !gap.is_zero() {
                        // Sent from the loop once the gap has passed.
                        *due = Some(now + *gap);
                        self.sent_at = None;
                        return Ok(done);
                    }
                    (done, service_request(*id, service_id))
                }
            },
            Role::Writer(w) => match w.step {
                Step::Started(seq) | Step::Cancelled(seq) => {
                    match classify_echo(text, &w.client_id, seq) {
                        Echo::Other => return Ok(None),
                        Echo::Rejected => {
                            return Err(format!(
                                "{what}: clientSeq {seq} was rejected: {}",
                                short(text)
                            ))
                        }
                        Echo::Applied => {}
                    }
                    let done = Some(Done::Change(elapsed(self.sent_at)));
                    let next = if matches!(w.step, Step::Started(_)) {
                        w.seq += 1;
                        w.step = Step::Cancelled(w.seq);
                        turn_cancelled(&w.chat, w.seq, w.turn)
                    } else if w.turns_here >= TURNS_PER_SESSION {
                        let id = w.next_id;
                        w.next_id += 1;
                        w.step = Step::Creating(id);
                        create_session(id, &format!("{}-{}", w.session_prefix, w.sessions))
                    } else {
                        w.seq += 1;
                        w.turn += 1;
                        w.turns_here += 1;
                        w.step = Step::Started(w.seq);
                        turn_started(&w.chat, w.seq, w.turn)
                    };
                    (done, next)
                }
                Step::Creating(id) | Step::Subscribing(id) => match classify_reply(text, id) {
                    None => return Ok(None),
                    Some(Err(())) => {
                        return Err(format!(
                            "{what}: moving to a fresh session: request {id} failed: {}",
                            short(text)
                        ))
                    }
                    Some(Ok(())) => {
                        let next = if matches!(w.step, Step::Creating(_)) {
                            let session = format!("{}-{}", w.session_prefix, w.sessions);
                            w.sessions += 1;
                            w.chat = format!("ahp-chat:/{session}");
                            let id = w.next_id;
                            w.next_id += 1;
                            w.step = Step::Subscribing(id);
                            subscribe(id, &w.chat)
                        } else {
                            w.seq += 1;
                            w.turn += 1;
                            w.turns_here = 1;
                            w.step = Step::Started(w.seq);
                            turn_started(&w.chat, w.seq, w.turn)
                        };
                        (None, next)
                    }
                },
            },
        };
        if open {
            self.send_awaited(&next)?;
        } else {
            self.sent_at = None;
        }
        Ok(done)
    }
}

/// A tag that keeps this run's session and client ids apart from any other run's on the
/// same host.
fn run_tag() -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("{:x}{:08x}", std::process::id(), nanos)
}

fn histogram() -> Result<Histogram<u64>, String> {
    // Nanoseconds, up to a minute, 3 significant digits.
    Histogram::new_with_bounds(1, 60_000_000_000, 3).map_err(|e| format!("histogram: {e}"))
}

pub fn run(args: &Args, addr: SocketAddr, token: &str) -> Result<Report, String> {
    let tag = run_tag();
    let mut seed_rng = ws::Rng::new(u64::from(std::process::id()) << 20 | 0x5eed);
    let mut conns: Vec<Conn> = Vec::new();
    if args.requests {
        let what = "service owner".to_owned();
        let mut c = setup::Ahp::connect(
            addr,
            &args.path,
            token,
            what.clone(),
            &format!("durable-{tag}-owner"),
            &mut seed_rng,
        )?;
        let service_id = c.register_service(&mut seed_rng, &format!("durable-{tag}"), 2)?;
        conns.push(Conn::new(
            c.done(None)?,
            what,
            seed_rng.next_u32().into(),
            Role::Owner,
        )?);
        let what = "requester".to_owned();
        let c = setup::Ahp::connect(
            addr,
            &args.path,
            token,
            what.clone(),
            &format!("durable-{tag}-requester"),
            &mut seed_rng,
        )?;
        conns.push(Conn::new(
            c.done(None)?,
            what,
            seed_rng.next_u32().into(),
            Role::Requester {
                service_id,
                id: FIRST_REQUEST_ID,
                gap: args.request_gap,
                due: None,
            },
        )?);
    }
    for i in 0..args.writers {
        let what = format!("writer {i}");
        let client_id = format!("durable-{tag}-w{i}");
        let session_prefix = format!("durable-{tag}-w{i}");
        let session = format!("{session_prefix}-0");
        let chat = format!("ahp-chat:/{session}");
        let mut c = setup::Ahp::connect(
            addr,
            &args.path,
            token,
            what.clone(),
            &client_id,
            &mut seed_rng,
        )?;
        c.call(&mut seed_rng, &create_session(2, &session), 2)?;
        c.call(&mut seed_rng, &subscribe(3, &chat), 3)?;
        let writer = Writer {
            client_id,
            session_prefix,
            sessions: 1,
            chat,
            seq: 0,
            turn: 0,
            turns_here: 0,
            next_id: 4,
            step: Step::Started(0),
            window_changes: 0,
        };
        conns.push(Conn::new(
            c.done(None)?,
            what,
            seed_rng.next_u32().into(),
            Role::Writer(writer),
        )?);
    }

    let mut poll = Poll::new().map_err(|e| format!("poll: {e}"))?;
    for (i, c) in conns.iter_mut().enumerate() {
        poll.registry()
            .register(
                &mut c.stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| format!("{}: register: {e}", c.what))?;
    }
    let mut echo_hist = histogram()?;
    let mut request_hist = histogram()?;
    let t0 = Instant::now();
    let start = t0 + args.warmup;
    let end = start + args.duration;
    for c in &mut conns {
        // Leftover setup bytes first (rarely any), then the first message of each loop.
        c.frames(t0, true, &mut |_, _| {})?;
        c.kick()?;
    }
    let mut events = Events::with_capacity(1024);
    let mut last_check = t0;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if now - last_check >= STALL_CHECK {
            last_check = now;
            for c in &conns {
                if let Some(sent) = c.sent_at {
                    if now - sent > args.reply_timeout {
                        return Err(format!(
                            "{}: no reply after {:?} (the host lost an echo or stalled)",
                            c.what, args.reply_timeout
                        ));
                    }
                }
            }
        }
        let mut wait = (end - now).min(STALL_CHECK);
        for c in &mut conns {
            if let Some(at) = c.send_due(now)? {
                wait = wait.min(at - now);
            }
        }
        match poll.poll(&mut events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("poll: {e}")),
        }
        for ev in &events {
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            if ev.is_writable() {
                c.flush()?;
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                // Counted here rather than in the writer: the connection is borrowed while it
                // handles its frames.
                let mut changes = 0u64;
                c.on_readable(true, &mut |done, at| {
                    if at < start || at >= end {
                        return;
                    }
                    match done {
                        Done::Change(d) => {
                            changes += 1;
                            echo_hist.saturating_record(d.as_nanos() as u64);
                        }
                        Done::Request(d) => request_hist.saturating_record(d.as_nanos() as u64),
                    }
                })?;
                if let Role::Writer(w) = &mut c.role {
                    w.window_changes += changes;
                }
            }
        }
    }
    let per_writer: Vec<u64> = conns
        .iter()
        .filter_map(|c| match &c.role {
            Role::Writer(w) => Some(w.window_changes),
            _ => None,
        })
        .collect();
    let session_moves = conns
        .iter()
        .map(|c| match &c.role {
            Role::Writer(w) => w.sessions - 1,
            _ => 0,
        })
        .sum();
    Ok(Report {
        window_s: args.duration.as_secs_f64(),
        echo: Quantiles::of(&echo_hist),
        writer_min: per_writer.iter().copied().min().unwrap_or(0),
        writer_max: per_writer.iter().copied().max().unwrap_or(0),
        session_moves,
        request: Quantiles::of(&request_hist),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_match_exactly() {
        let t = r#"{"origin":{"clientId":"c","clientSeq":12},"x":{"id":7}}"#;
        assert!(has_number(t, "clientSeq", 12));
        assert!(!has_number(t, "clientSeq", 1));
        assert!(!has_number(t, "clientSeq", 123));
        assert!(has_number(t, "id", 7));
        assert!(has_number(r#"{"id":7}"#, "id", 7));
        assert!(!has_number(r#"{"id":70}"#, "id", 7));
    }

    #[test]
    fn echoes_are_recognised_by_client_and_seq() {
        let echo = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/s","serverSeq":9,"action":{"type":"chat/turnStarted","turnId":"t1"},"origin":{"clientId":"w1","clientSeq":3}}}"#;
        assert_eq!(classify_echo(echo, "w1", 3), Echo::Applied);
        assert_eq!(classify_echo(echo, "w1", 4), Echo::Other);
        assert_eq!(classify_echo(echo, "w", 3), Echo::Other);
        let rejected = r#"{"jsonrpc":"2.0","method":"action","params":{"channel":"ahp-chat:/s","serverSeq":9,"action":{},"origin":{"clientSeq":3,"clientId":"w1"},"rejectionReason":"no"}}"#;
        assert_eq!(classify_echo(rejected, "w1", 3), Echo::Rejected);
        let other = r#"{"jsonrpc":"2.0","method":"session/chatUpdated","params":{}}"#;
        assert_eq!(classify_echo(other, "w1", 3), Echo::Other);
    }

    #[test]
    fn replies_and_host_requests() {
        assert_eq!(
            classify_reply(r#"{"jsonrpc":"2.0","id":1000,"result":{"ok":true}}"#, 1000),
            Some(Ok(()))
        );
        assert_eq!(
            classify_reply(r#"{"jsonrpc":"2.0","result":null,"id":5}"#, 5),
            Some(Ok(()))
        );
        assert_eq!(
            classify_reply(
                r#"{"jsonrpc":"2.0","id":5,"error":{"code":-32008,"message":"x"}}"#,
                5
            ),
            Some(Err(()))
        );
        assert_eq!(
            classify_reply(r#"{"jsonrpc":"2.0","id":50,"result":1}"#, 5),
            None
        );
        let host_req = r#"{"jsonrpc":"2.0","id":42,"method":"clientService/handleRequest","params":{"channel":"x-client-services://","serviceId":"svc_1","senderClientId":"r","method":"bench/echo","params":{"k":1}}}"#;
        assert_eq!(classify_reply(host_req, 42), None);
        assert_eq!(host_request_id(host_req), Some(42));
        assert_eq!(
            host_request_id(r#"{"jsonrpc":"2.0","method":"action","id":1}"#),
            None
        );
    }

    fn json(text: &str) -> serde_json::Value {
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
    }

    #[test]
    fn frames_have_the_ahp_shapes() {
        let started = json(&turn_started("ahp-chat:/s", 1, 7));
        assert_eq!(started["method"], "dispatchAction");
        assert!(
            started.get("id").is_none(),
            "dispatchAction is a notification"
        );
        let p = &started["params"];
        assert_eq!(
            (&p["channel"], &p["clientSeq"]),
            (&"ahp-chat:/s".into(), &1.into())
        );
        assert_eq!(p["action"]["type"], "chat/turnStarted");
        assert_eq!(p["action"]["turnId"], "t7");
        assert_eq!(p["action"]["message"]["origin"]["kind"], "user");
        let cancelled = json(&turn_cancelled("ahp-chat:/s", 8, 7));
        let a = &cancelled["params"]["action"];
        assert_eq!(
            (&a["type"], &a["turnId"]),
            (&"chat/turnCancelled".into(), &"t7".into())
        );
        assert_eq!(cancelled["params"]["clientSeq"], 8);
        let create = json(&create_session(4, "s"));
        assert_eq!(
            (&create["id"], &create["method"]),
            (&4.into(), &"createSession".into())
        );
        assert_eq!(create["params"]["channel"], "ahp-session:/s");
        let sub = json(&subscribe(5, "ahp-chat:/s"));
        assert_eq!(sub["params"]["channel"], "ahp-chat:/s");
        let req = json(&service_request(1000, "svc_1"));
        assert_eq!(req["method"], "clientService/request");
        assert_eq!(req["params"]["serviceId"], "svc_1");
        assert_eq!(req["params"]["channel"], "x-client-services://");
        assert_eq!(json(&service_response(42))["id"], 42);
    }
}
