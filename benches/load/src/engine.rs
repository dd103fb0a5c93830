//! The measured event loop: one mio `Poll` per load thread (one thread unless `--threads`), every
//! connection non-blocking.
//!
//! Hot path, per message: senders copy a prebuilt frame for the target receiver into their
//! output buffer, write the 16 hex digits of the stamp in place (and for WebSocket mask the
//! frame word-wise with a fresh key); receivers parse frames in their read buffer in place and
//! read the stamp at a fixed offset or after the `@` marker. Nothing is allocated per message:
//! buffers are sized at start, and a sender holds at most one unwritten batch (a full socket
//! stops it until the socket is writable again).
//!
//! Stamps: flat out, the time the batch was built. At a fixed rate with `--pace spin`, the time
//! the message was *scheduled* (start + k / rate), so a sender that falls behind (a full socket,
//! a slow loop) shows up as latency rather than hiding it (no coordinated omission); with
//! `--pace sleep`, the time its write was built (the sender lag reports the lateness).
//! Receivers record each message twice: to the read, and to the kernel's receive timestamp of
//! that read (`socket_stamp`), which leaves out the tool's own wait before reading.

use std::io::{ErrorKind, Write};
use std::net::SocketAddr;
use std::sync::atomic::Ordering::SeqCst;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};

use crate::payload::{self, STAMP_AT};
use crate::{nats, resp, setup, socket_stamp, timer, ws, Args, Pace, Rate, Target};

/// Read buffer per connection.
const IN_BUF: usize = 256 * 1024;
/// In rate mode, most batches one sender writes in one loop turn while catching up.
const CATCH_UP_BUDGET: usize = 256;
/// `--pace sleep`: longest stretch of writes in one loop turn before the reads get a turn.
const BURST_SLICE_NS: u64 = 20_000;
/// Reads or writes per connection per loop turn, so one busy socket cannot starve the rest.
const TURN_BUDGET: usize = 16;
/// The drain ends early once nothing arrived for this long.
const DRAIN_IDLE: Duration = Duration::from_millis(500);

/// A prebuilt message to one receiver: the bytes to copy and where the stamp digits go.
struct Template {
    /// axhost: the unmasked JSON text of the WebSocket frame; Redis/NATS: the whole command.
    bytes: Vec<u8>,
    stamp_at: usize,
}

struct Conn {
    stream: TcpStream,
    sender: bool,
    idx: usize,
    inbuf: Box<[u8]>,
    in_len: usize,
    out: Vec<u8>,
    out_head: usize,
    readable: bool,
    writable: bool,
    /// Senders: messages built so far (also the round-robin position).
    built: u64,
    rng: ws::Rng,
    /// Receivers: where the last stamp was found in a message (`payload::find_stamp`).
    stamp_at: usize,
}

impl Conn {
    fn what(&self) -> String {
        role(self.sender, self.idx)
    }

    fn pending(&self) -> usize {
        self.out.len() - self.out_head
    }
}

pub struct Report {
    pub target: Target,
    pub window_s: f64,
    pub sent_total: u64,
    pub recv_total: u64,
    pub sent_window: u64,
    pub recv_window: u64,
    pub unstamped: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    /// Sender stamp to the kernel's receive timestamp of the read that completed the message
    /// (`socket_stamp`): the same messages without the tool's own wait before reading them.
    /// `None` without kernel stamps.
    pub socket_p50_us: Option<f64>,
    pub socket_p99_us: Option<f64>,
    pub socket_p999_us: Option<f64>,
    /// Messages in the window without a kernel timestamp (all of them without stamps).
    pub socket_unstamped: u64,
    /// Rate mode: how late the tool itself built messages (build time minus scheduled time).
    /// With `--pace spin` latency near this figure is the tool's, not the server's; with
    /// `--pace sleep` it is mostly the chosen wait.
    pub lag_p50_us: f64,
    pub lag_p99_us: f64,
    pub drain_s: f64,
}

impl Report {
    pub fn lost(&self) -> u64 {
        self.sent_total.saturating_sub(self.recv_total)
    }

    fn rate_label(args: &Args) -> String {
        match args.rate {
            Rate::Max => "max".into(),
            Rate::PerSec(r) => format!("{r:.0}"),
        }
    }

    /// The pace, which only a fixed rate has.
    fn pace_name(args: &Args) -> Option<&'static str> {
        match (args.rate, args.pace) {
            (Rate::Max, _) => None,
            (_, Pace::Spin) => Some("spin"),
            (_, Pace::Sleep) => Some("sleep"),
        }
    }

    pub fn human(&self, args: &Args) -> String {
        format!(
            "{} {}->{} rate={}{} batch={} size={}B: sent {:.0} msg/s, delivered {:.0} msg/s, \
             latency p50 {:.1} µs p99 {:.1} µs p99.9 {:.1} µs max {:.1} µs{}, lost {} of {} \
             (window {:.1} s, drain {:.2} s{})",
            self.target.name(),
            args.senders,
            args.receivers,
            Self::rate_label(args),
            // The default pace goes unsaid, as before there was a choice.
            match Self::pace_name(args) {
                Some("sleep") => " pace=sleep",
                _ => "",
            },
            args.batch,
            args.size,
            self.sent_window as f64 / self.window_s,
            self.recv_window as f64 / self.window_s,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us,
            match (self.socket_p50_us, self.socket_p99_us, self.socket_p999_us) {
                (Some(a), Some(b), Some(c)) =>
                    format!(" (at the socket p50 {a:.1} µs p99 {b:.1} µs p99.9 {c:.1} µs)"),
                _ => String::new(),
            },
            self.lost(),
            self.sent_total,
            self.window_s,
            self.drain_s,
            match args.rate {
                Rate::Max => String::new(),
                Rate::PerSec(_) => format!(
                    ", sender lag p50 {:.1} µs p99 {:.1} µs",
                    self.lag_p50_us, self.lag_p99_us
                ),
            },
        )
    }

    pub fn json(&self, args: &Args) -> String {
        format!(
            "{{\"target\":\"{}\",\"senders\":{},\"receivers\":{},\"rate\":\"{}\",\"pace\":{},\"batch\":{},\
             \"size\":{},\"window_s\":{:.3},\"sent_per_s\":{:.1},\"delivered_per_s\":{:.1},\
             \"p50_us\":{:.1},\"p99_us\":{:.1},\"p999_us\":{:.1},\"max_us\":{:.1},\
             \"socket_p50_us\":{},\"socket_p99_us\":{},\"socket_p999_us\":{},\
             \"lag_p50_us\":{:.1},\"lag_p99_us\":{:.1},\
             \"socket_unstamped\":{},\"sent\":{},\"received\":{},\"lost\":{},\"unstamped\":{}}}",
            self.target.name(),
            args.senders,
            args.receivers,
            Self::rate_label(args),
            Self::pace_name(args).map_or("null".into(), |p| format!("\"{p}\"")),
            args.batch,
            args.size,
            self.window_s,
            self.sent_window as f64 / self.window_s,
            self.recv_window as f64 / self.window_s,
            self.p50_us,
            self.p99_us,
            self.p999_us,
            self.max_us,
            json_us(self.socket_p50_us),
            json_us(self.socket_p99_us),
            json_us(self.socket_p999_us),
            self.lag_p50_us,
            self.lag_p99_us,
            self.socket_unstamped,
            self.sent_total,
            self.recv_total,
            self.lost(),
            self.unstamped,
        )
    }
}

/// Microseconds as a JSON number with one decimal, or `null`.
fn json_us(v: Option<f64>) -> String {
    v.map_or("null".into(), |v| format!("{v:.1}"))
}

/// Counters the receive path updates.
struct Recv {
    total: u64,
    window: u64,
    unstamped: u64,
    hist: Histogram<u64>,
    /// Stamp to arrival at the socket, for messages whose read carried a kernel timestamp.
    socket: Histogram<u64>,
    /// Stamped messages in the window whose read had no kernel timestamp.
    socket_unstamped: u64,
    /// Window bounds in ns since the origin.
    win_start: u64,
    win_end: u64,
}

impl Recv {
    /// One message read at `now`; `arrived`: when the read's last byte reached the socket.
    #[inline]
    fn message(&mut self, msg: &[u8], stamp_at: &mut usize, now: u64, arrived: Option<u64>) {
        self.total += 1;
        if now < self.win_start || now >= self.win_end {
            return;
        }
        self.window += 1;
        match payload::find_stamp(msg, stamp_at) {
            Some(t) => {
                self.hist.saturating_record(now.saturating_sub(t).max(1));
                match arrived {
                    Some(a) => self.socket.saturating_record(a.saturating_sub(t).max(1)),
                    None => self.socket_unstamped += 1,
                }
            }
            None => self.unstamped += 1,
        }
    }
}

/// Builds one template per receiver.
fn templates(target: Target, size: usize, service_ids: &[String]) -> Vec<Template> {
    let body = payload::template(size);
    service_ids
        .iter()
        .enumerate()
        .map(|(j, sid)| {
            let mut bytes = Vec::new();
            let at = match target {
                Target::Axhost => {
                    bytes.extend_from_slice(
                        format!(
                            "{{\"jsonrpc\":\"2.0\",\"method\":\"clientService/notify\",\"params\":{{\
                             \"channel\":\"x-client-services://\",\"serviceId\":\"{sid}\",\
                             \"method\":\"load/tick\",\"params\":"
                        )
                        .as_bytes(),
                    );
                    let at = bytes.len();
                    bytes.extend_from_slice(&body);
                    bytes.extend_from_slice(b"}}");
                    at
                }
                Target::Redis => resp::push_publish(&mut bytes, channel(j).as_bytes(), &body),
                Target::Nats => nats::push_pub(&mut bytes, subject(j).as_bytes(), &body),
            };
            Template {
                bytes,
                stamp_at: at + STAMP_AT,
            }
        })
        .collect()
}

fn channel(j: usize) -> String {
    format!("ch.{j}")
}

fn subject(j: usize) -> String {
    format!("s.{j}")
}

/// Appends one message to `c.out` for receiver `(idx + built) mod M`, stamped `stamp`.
#[inline]
fn build_one(target: Target, c: &mut Conn, tpls: &[Template], stamp: u64) {
    let t = &tpls[(c.idx + c.built as usize) % tpls.len()];
    c.built += 1;
    match target {
        Target::Axhost => {
            let key = c.rng.next_u32().to_ne_bytes();
            ws::push_header(&mut c.out, ws::OP_TEXT, t.bytes.len(), key);
            let at = c.out.len();
            c.out.extend_from_slice(&t.bytes);
            payload::write_stamp(&mut c.out[at + t.stamp_at..], stamp);
            ws::mask(&mut c.out[at..], key);
        }
        Target::Redis | Target::Nats => {
            let at = c.out.len();
            c.out.extend_from_slice(&t.bytes);
            payload::write_stamp(&mut c.out[at + t.stamp_at..], stamp);
        }
    }
}

/// Writes pending output until done or the socket is full. `Ok(true)` when all was written.
fn flush(c: &mut Conn) -> Result<bool, String> {
    while c.out_head < c.out.len() {
        match c.stream.write(&c.out[c.out_head..]) {
            Ok(0) => return Err(format!("{}: connection closed while writing", c.what())),
            Ok(n) => c.out_head += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                c.writable = false;
                return Ok(false);
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{}: write: {e}", c.what())),
        }
    }
    c.out.clear();
    c.out_head = 0;
    Ok(true)
}

/// Makes room before appending to a partly written buffer.
#[inline]
fn compact(out: &mut Vec<u8>, head: &mut usize) {
    if *head > 0 && *head >= out.len() / 2 {
        out.drain(..*head);
        *head = 0;
    }
}

fn role(sender: bool, idx: usize) -> String {
    format!("{} {idx}", if sender { "sender" } else { "receiver" })
}

/// Parses everything complete in `c.inbuf`; keeps a partial tail.
fn process_input(
    target: Target,
    c: &mut Conn,
    recv: &mut Recv,
    now: u64,
    arrived: Option<u64>,
) -> Result<(), String> {
    let Conn {
        inbuf,
        in_len,
        out,
        out_head,
        rng,
        sender,
        idx,
        stamp_at,
        ..
    } = c;
    let (sender, idx) = (*sender, *idx);
    let what = || role(sender, idx);
    let mut pos = 0;
    loop {
        let buf = &mut inbuf[pos..*in_len];
        let used = match target {
            Target::Axhost => {
                let Some(f) = ws::parse(buf).map_err(|e| format!("{}: {e}", what()))? else {
                    break;
                };
                match f.opcode {
                    ws::OP_TEXT | ws::OP_CONT | ws::OP_BINARY if !sender && f.fin => {
                        recv.message(&buf[f.start..f.end], stamp_at, now, arrived);
                    }
                    ws::OP_PING => {
                        let key = rng.next_u32().to_ne_bytes();
                        compact(out, out_head);
                        ws::encode(out, ws::OP_PONG, &buf[f.start..f.end], key);
                    }
                    ws::OP_CLOSE => {
                        let body = &buf[f.start..f.end];
                        let code = body.get(..2).map(|b| u16::from_be_bytes([b[0], b[1]]));
                        return Err(format!(
                            "{}: server closed the WebSocket (code {code:?}, reason {:?})",
                            what(),
                            String::from_utf8_lossy(body.get(2..).unwrap_or(&[]))
                        ));
                    }
                    _ => {}
                }
                f.end
            }
            Target::Redis => {
                let Some((item, used)) =
                    resp::parse(buf).map_err(|e| format!("{}: {e}", what()))?
                else {
                    break;
                };
                match item {
                    resp::Item::Message(s, e) => recv.message(&buf[s..e], stamp_at, now, arrived),
                    resp::Item::Error(s, e) => {
                        return Err(format!(
                            "{}: redis error: {}",
                            what(),
                            String::from_utf8_lossy(&buf[s..e])
                        ));
                    }
                    _ => {}
                }
                used
            }
            Target::Nats => {
                let Some((item, used)) =
                    nats::parse(buf).map_err(|e| format!("{}: {e}", what()))?
                else {
                    break;
                };
                match item {
                    nats::Item::Msg(s, e) => recv.message(&buf[s..e], stamp_at, now, arrived),
                    nats::Item::Ping => {
                        compact(out, out_head);
                        out.extend_from_slice(b"PONG\r\n");
                    }
                    nats::Item::Err(s, e) => {
                        return Err(format!(
                            "{}: nats error: {}",
                            what(),
                            String::from_utf8_lossy(&buf[s..e])
                        ));
                    }
                    _ => {}
                }
                used
            }
        };
        pos += used;
    }
    if pos > 0 {
        inbuf.copy_within(pos..*in_len, 0);
        *in_len -= pos;
    }
    Ok(())
}

/// Reads and processes up to the turn budget; clears `readable` on WouldBlock.
fn read_turn(target: Target, c: &mut Conn, recv: &mut Recv, origin: Instant) -> Result<(), String> {
    for _ in 0..TURN_BUDGET {
        if c.in_len == c.inbuf.len() {
            return Err(format!(
                "{}: a message larger than {IN_BUF} bytes",
                c.what()
            ));
        }
        let room = c.inbuf.len() - c.in_len;
        match socket_stamp::read(&c.stream, &mut c.inbuf[c.in_len..]) {
            Ok((0, _)) => return Err(format!("{}: server closed the connection", c.what())),
            Ok((n, age)) => {
                c.in_len += n;
                let now = origin.elapsed().as_nanos() as u64;
                let arrived = age.map(|age| now.saturating_sub(age));
                process_input(target, c, recv, now, arrived)?;
                if n < room {
                    // A short read emptied the socket; bytes that arrive later raise a new
                    // (edge-triggered) event, so asking again would only return WouldBlock.
                    c.readable = false;
                    return Ok(());
                }
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                c.readable = false;
                return Ok(());
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(format!("{}: read: {e}", c.what())),
        }
    }
    Ok(())
}

/// Sets up every connection: receivers first, then senders.
fn connect_all(
    args: &Args,
    addr: SocketAddr,
    token: &str,
) -> Result<(Vec<Conn>, Vec<String>), String> {
    let pid = std::process::id();
    let mut rng = ws::Rng::new(0x9e37_79b9_7f4a_7c15 ^ u64::from(pid) ^ nanos_seed());
    let mut conns = Vec::new();
    let mut service_ids = Vec::new();
    let m = args.receivers as usize;
    let n = args.senders as usize;
    for (sender, count) in [(false, m), (true, n)] {
        for idx in 0..count {
            let what = format!(
                "{} {} {idx}",
                args.target.name(),
                if sender { "sender" } else { "receiver" }
            );
            let ready = match args.target {
                Target::Axhost => {
                    let client_id =
                        format!("axhost-load-{pid}-{}{idx}", if sender { 's' } else { 'r' });
                    setup::axhost(addr, &args.path, token, what, &client_id, !sender, &mut rng)?
                }
                Target::Redis => {
                    let ch = channel(idx);
                    setup::redis(addr, what, (!sender).then_some(ch.as_str()))?
                }
                Target::Nats => {
                    let s = subject(idx);
                    setup::nats(addr, what, (!sender).then_some(s.as_str()))?
                }
            };
            if let Some(id) = ready.service_id {
                service_ids.push(id);
            }
            ready
                .stream
                .set_nonblocking(true)
                .map_err(|e| format!("set non-blocking: {e}"))?;
            let mut inbuf = vec![0u8; IN_BUF].into_boxed_slice();
            if ready.leftover.len() > IN_BUF {
                return Err("over 256 KiB of data before the run started".into());
            }
            inbuf[..ready.leftover.len()].copy_from_slice(&ready.leftover);
            let stream = TcpStream::from_std(ready.stream);
            if !sender && !args.no_socket_stamps {
                socket_stamp::enable(&stream).map_err(|e| format!("SO_TIMESTAMPNS: {e}"))?;
            }
            conns.push(Conn {
                stream,
                sender,
                idx,
                inbuf,
                in_len: ready.leftover.len(),
                out: Vec::new(),
                out_head: 0,
                readable: true,
                writable: true,
                built: 0,
                rng: ws::Rng::new(u64::from(rng.next_u32()) << 32 | u64::from(rng.next_u32())),
                stamp_at: payload::STAMP_AT,
            });
        }
    }
    if args.target != Target::Axhost {
        service_ids = (0..m).map(|j| j.to_string()).collect();
    }
    Ok((conns, service_ids))
}

fn nanos_seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

pub fn run(args: &Args, addr: SocketAddr, token: &str) -> Result<Report, String> {
    let (mut conns, service_ids) = connect_all(args, addr, token)?;
    let tpls = templates(args.target, args.size as usize, &service_ids);
    let batch = args.batch as usize;
    let frame_max = tpls.iter().map(|t| t.bytes.len()).max().unwrap_or(0) + 14;
    for c in conns.iter_mut() {
        let cap = if c.sender {
            batch * frame_max + 4096
        } else {
            4096
        };
        c.out.reserve(cap);
    }
    let threads = args.threads as usize;
    let mut parts: Vec<Vec<Conn>> = (0..threads).map(|_| Vec::new()).collect();
    for c in conns {
        parts[c.idx % threads].push(c);
    }
    parts.retain(|p| !p.is_empty());

    let shared = Shared {
        sent: AtomicU64::new(0),
        received: AtomicU64::new(0),
        generating: AtomicUsize::new(parts.len()),
        failed: AtomicBool::new(false),
    };
    let origin = Instant::now();
    let results: Vec<Result<Part, String>> = std::thread::scope(|scope| {
        let handles: Vec<_> = parts
            .into_iter()
            .map(|part| {
                let (tpls, shared) = (&tpls, &shared);
                scope.spawn(move || {
                    let r = event_loop(args, part, tpls, origin, shared);
                    if r.is_err() {
                        shared.failed.store(true, SeqCst);
                    }
                    r
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("a load thread panicked".into()))
            })
            .collect()
    });
    let mut parts = Vec::with_capacity(results.len());
    for r in results {
        parts.push(r?);
    }
    let mut total = parts.pop().ok_or("no connections")?;
    for p in &parts {
        total.merge(p)?;
    }

    let q = |h: &Histogram<u64>, p: f64| h.value_at_quantile(p) as f64 / 1000.0;
    let gen_end = (args.warmup + args.duration).as_nanos() as u64;
    let socket = (!total.recv.socket.is_empty()).then_some(&total.recv.socket);
    Ok(Report {
        target: args.target,
        window_s: args.duration.as_secs_f64().max(1e-9),
        sent_total: total.sent_total,
        recv_total: total.recv.total,
        sent_window: total.sent_window,
        recv_window: total.recv.window,
        unstamped: total.recv.unstamped,
        p50_us: q(&total.recv.hist, 0.5),
        p99_us: q(&total.recv.hist, 0.99),
        p999_us: q(&total.recv.hist, 0.999),
        max_us: total.recv.hist.max() as f64 / 1000.0,
        socket_p50_us: socket.map(|h| q(h, 0.5)),
        socket_p99_us: socket.map(|h| q(h, 0.99)),
        socket_p999_us: socket.map(|h| q(h, 0.999)),
        socket_unstamped: total.recv.socket_unstamped,
        lag_p50_us: q(&total.lag, 0.5),
        lag_p99_us: q(&total.lag, 0.99),
        drain_s: total.end.saturating_sub(gen_end) as f64 / 1e9,
    })
}

/// Counters every load thread adds to, so each can tell when the whole run has drained: a
/// thread's receivers get messages from every thread's senders.
struct Shared {
    /// Messages built by all senders (warmup included).
    sent: AtomicU64,
    /// Messages read by all receivers.
    received: AtomicU64,
    /// Threads that may still build messages.
    generating: AtomicUsize,
    /// A thread stopped with an error: the others stop too.
    failed: AtomicBool,
}

/// What one load thread measured.
struct Part {
    sent_total: u64,
    sent_window: u64,
    recv: Recv,
    lag: Histogram<u64>,
    /// When the thread's loop ended, in ns since the origin.
    end: u64,
}

impl Part {
    fn merge(&mut self, other: &Part) -> Result<(), String> {
        self.sent_total += other.sent_total;
        self.sent_window += other.sent_window;
        self.recv.total += other.recv.total;
        self.recv.window += other.recv.window;
        self.recv.unstamped += other.recv.unstamped;
        self.recv.socket_unstamped += other.recv.socket_unstamped;
        self.recv
            .hist
            .add(&other.recv.hist)
            .map_err(|e| format!("histogram: {e}"))?;
        self.recv
            .socket
            .add(&other.recv.socket)
            .map_err(|e| format!("histogram: {e}"))?;
        self.lag
            .add(&other.lag)
            .map_err(|e| format!("histogram: {e}"))?;
        self.end = self.end.max(other.end);
        Ok(())
    }
}

/// One thread's event loop over its share of the connections (every connection whose index is
/// the thread's number modulo `--threads`), from the start of the warmup to the end of the
/// drain.
fn event_loop(
    args: &Args,
    mut conns: Vec<Conn>,
    tpls: &[Template],
    origin: Instant,
    shared: &Shared,
) -> Result<Part, String> {
    let batch = args.batch as usize;
    let mut poll = Poll::new().map_err(|e| format!("mio poll: {e}"))?;
    for (i, c) in conns.iter_mut().enumerate() {
        poll.registry()
            .register(
                &mut c.stream,
                Token(i),
                Interest::READABLE | Interest::WRITABLE,
            )
            .map_err(|e| format!("register: {e}"))?;
    }
    let mut events = Events::with_capacity(1024);
    // Sleeping pace: wakes between epoll's milliseconds (its token matches no connection).
    let timer = match args.pace {
        Pace::Sleep => timer::Timer::new(poll.registry(), Token(usize::MAX))
            .map_err(|e| format!("timerfd: {e}"))?,
        Pace::Spin => None,
    };

    let warm = args.warmup.as_nanos() as u64;
    let gen_end = warm + args.duration.as_nanos() as u64;
    let drain_max = args.drain.as_nanos() as u64;
    let hist = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3)
        .map_err(|e| format!("histogram: {e}"))?;
    let mut lag = hist.clone();
    let mut recv = Recv {
        total: 0,
        window: 0,
        unstamped: 0,
        socket: hist.clone(),
        socket_unstamped: 0,
        hist,
        win_start: warm,
        win_end: gen_end,
    };
    let mut sent_total = 0u64;
    let mut sent_window = 0u64;
    let n_senders = args.senders as f64;
    // Rate mode: per-sender interval in ns and a phase offset so senders interleave.
    let interval = match args.rate {
        Rate::PerSec(r) => 1e9 * n_senders / r,
        Rate::Max => 0.0,
    };
    let mut last_progress = 0u64;
    let mut last_received = 0u64;
    let (mut published_sent, mut published_received) = (0u64, 0u64);
    let mut done_generating = false;

    loop {
        // Publish this thread's counts before deciding anything on the shared ones.
        shared.sent.fetch_add(sent_total - published_sent, SeqCst);
        shared
            .received
            .fetch_add(recv.total - published_received, SeqCst);
        (published_sent, published_received) = (sent_total, recv.total);
        if shared.failed.load(SeqCst) {
            break; // another thread's error ends the run; it is the one reported
        }
        let now = origin.elapsed().as_nanos() as u64;
        let generating = now < gen_end;
        if !generating {
            if !done_generating {
                // This thread builds no more messages, and all it built is published.
                done_generating = true;
                shared.generating.fetch_sub(1, SeqCst);
            }
            let received = shared.received.load(SeqCst);
            if received != last_received {
                last_received = received;
                last_progress = now;
            }
            let all_sent = shared.generating.load(SeqCst) == 0;
            let all_received = all_sent && received >= shared.sent.load(SeqCst);
            let flushed = conns.iter().all(|c| c.pending() == 0);
            let idle =
                now.saturating_sub(last_progress.max(gen_end)) > DRAIN_IDLE.as_nanos() as u64;
            if (flushed && all_received) || idle || now >= gen_end + drain_max {
                break;
            }
        }

        // Senders: build and write.
        let mut next_due = u64::MAX;
        for c in conns.iter_mut().filter(|c| c.sender) {
            if !c.writable {
                continue;
            }
            match args.rate {
                Rate::Max => {
                    for _ in 0..TURN_BUDGET {
                        if c.pending() == 0 {
                            if !generating {
                                break;
                            }
                            let stamp = origin.elapsed().as_nanos() as u64;
                            for _ in 0..batch {
                                build_one(args.target, c, tpls, stamp);
                            }
                            sent_total += batch as u64;
                            if stamp >= warm {
                                sent_window += batch as u64;
                            }
                        }
                        if !flush(c)? {
                            break;
                        }
                    }
                }
                Rate::PerSec(_) => {
                    let phase = c.idx as f64 / n_senders;
                    let sched = |k: u64| ((k as f64 + phase) * interval) as u64;
                    let horizon = now.min(gen_end.saturating_sub(1));
                    let next = sched(c.built + batch as u64 - 1);
                    if c.pending() == 0 && (!generating || next > horizon) {
                        // Most turns most senders have nothing due: skip the clock read below
                        // (64 of them per turn were 5% of the tool at 64->64, 100k/s).
                        if generating {
                            next_due = next_due.min(next);
                        }
                        continue;
                    }
                    let mut built_at = origin.elapsed().as_nanos() as u64;
                    let mut wrote = false;
                    // One write per full batch that is due; a sender that fell behind catches
                    // up here. Spinning, its stamps are the scheduled times, so its lateness
                    // counts as latency; sleeping, each write is stamped as it is built.
                    for _ in 0..CATCH_UP_BUDGET {
                        if c.pending() > 0 && !flush(c)? {
                            break;
                        }
                        if !generating || sched(c.built + batch as u64 - 1) > horizon {
                            break;
                        }
                        if args.pace == Pace::Sleep {
                            built_at = origin.elapsed().as_nanos() as u64;
                            // A burst yields to the reads once the turn has written for a
                            // slice, or the messages coming back would wait for its end and
                            // count it as latency; every sender with a batch due still writes
                            // one per turn, so the first senders cannot starve the rest.
                            if wrote && built_at >= now + BURST_SLICE_NS {
                                break;
                            }
                        }
                        for _ in 0..batch {
                            let scheduled = sched(c.built);
                            let stamp = match args.pace {
                                Pace::Spin => scheduled,
                                Pace::Sleep => built_at,
                            };
                            build_one(args.target, c, tpls, stamp);
                            sent_total += 1;
                            // The window holds what was written in it (by stamp, as the
                            // receivers count): sleeping, a backlog from the warmup that is
                            // written in the window counts there.
                            if stamp >= warm {
                                sent_window += 1;
                                lag.saturating_record(built_at.saturating_sub(scheduled).max(1));
                            }
                        }
                        wrote = true;
                    }
                    if generating {
                        next_due = next_due.min(sched(c.built + batch as u64 - 1));
                    }
                }
            }
        }
        // Pongs queued on receivers.
        for c in conns
            .iter_mut()
            .filter(|c| !c.sender && c.pending() > 0 && c.writable)
        {
            flush(c)?;
        }
        // Reads (receivers and the replies senders get).
        for c in conns.iter_mut() {
            if c.readable {
                read_turn(args.target, c, &mut recv, origin)?;
            }
        }

        let busy = conns.iter().any(|c| {
            c.readable
                || (c.writable
                    && c.sender
                    && (c.pending() > 0 || (args.rate == Rate::Max && generating)))
        });
        let timeout = if busy {
            Duration::ZERO
        } else if next_due != u64::MAX {
            let now = origin.elapsed().as_nanos() as u64;
            let wait = due_wait(args.pace, args.sleep_min, next_due.saturating_sub(now));
            match &timer {
                // The timer wakes us; epoll's wait (whole milliseconds) only backs it up.
                Some(t) if !wait.is_zero() => {
                    t.arm(wait).map_err(|e| format!("timerfd: {e}"))?;
                    wait + Duration::from_millis(2)
                }
                _ => wait,
            }
        } else {
            Duration::from_millis(5)
        };
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(format!("poll: {e}")),
        }
        for ev in events.iter() {
            let Some(c) = conns.get_mut(ev.token().0) else {
                continue;
            };
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                c.readable = true;
            }
            if ev.is_writable() || ev.is_write_closed() || ev.is_error() {
                c.writable = true;
            }
        }
    }

    Ok(Part {
        sent_total,
        sent_window,
        recv,
        lag,
        end: origin.elapsed().as_nanos() as u64,
    })
}

/// How long the loop may wait when the next message is due in `wait` ns. epoll sleeps in whole
/// milliseconds (mio rounds up): spinning, spin for the last stretch; sleeping, sleep at least
/// `sleep_min`, unless something is due already (a burst that yielded to the reads goes
/// straight back to it).
fn due_wait(pace: Pace, sleep_min: Duration, wait: u64) -> Duration {
    match pace {
        Pace::Sleep if wait == 0 => Duration::ZERO,
        Pace::Sleep => Duration::from_nanos(wait).max(sleep_min),
        Pace::Spin if wait < 1_500_000 => Duration::ZERO,
        Pace::Spin => Duration::from_nanos(wait - 1_000_000),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_for_the_next_message() {
        let ms = Duration::from_millis(1);
        let us = Duration::from_micros;
        // Sleeping: at least the shortest sleep, but never once something is due.
        assert_eq!(due_wait(Pace::Sleep, ms, 0), Duration::ZERO);
        assert_eq!(due_wait(Pace::Sleep, ms, 5_000), ms);
        assert_eq!(due_wait(Pace::Sleep, us(100), 300_000), us(300));
        assert_eq!(due_wait(Pace::Sleep, us(100), 20_000), us(100));
        // Spinning: epoll's sleep only for what is over a millisecond and a half away.
        assert_eq!(due_wait(Pace::Spin, ms, 0), Duration::ZERO);
        assert_eq!(due_wait(Pace::Spin, ms, 1_400_000), Duration::ZERO);
        assert_eq!(due_wait(Pace::Spin, ms, 3_000_000), us(2000));
    }

    #[test]
    fn templates_carry_identical_payloads() {
        let ids = vec!["svc_0123".to_owned(), "svc_4567".to_owned()];
        for target in [Target::Axhost, Target::Redis, Target::Nats] {
            let t = templates(target, 200, &ids);
            assert_eq!(t.len(), 2);
            for tpl in &t {
                let p = &tpl.bytes[tpl.stamp_at - STAMP_AT..tpl.stamp_at - STAMP_AT + 200];
                assert_eq!(p, payload::template(200).as_slice(), "{target:?}");
            }
        }
        let ax = templates(Target::Axhost, 200, &ids);
        let text = String::from_utf8_lossy(&ax[1].bytes);
        assert!(text.starts_with(
            "{\"jsonrpc\":\"2.0\",\"method\":\"clientService/notify\",\"params\":{\"channel\":\
             \"x-client-services://\",\"serviceId\":\"svc_4567\",\"method\":\"load/tick\",\"params\":{"
        ));
        assert!(text.ends_with("\"}}}"));
    }
}
