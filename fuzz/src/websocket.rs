//! Target `websocket`: the HTTP upgrade with credentials, then WebSocket frames, through the
//! server's own code: `axhost_io::server::http::{parse_head, route, origin_allowed}` (the head
//! parser with its bounds, the router, the origin check), `credentials::token_from_request` and
//! `Credentials::authenticate`, then the server's own WebSocket reader
//! (`axhost_io::server::frame_reader`, `FrameReader::read_from`, which also decides every close
//! code; its buffer is taken from a `BufferPool` and given back after each read round, as the
//! driver does) and the answers it writes (`websocket::encode_answer`), reading from an in-memory
//! peer that hands its bytes over in generated chunks across several loop turns (read in rounds
//! of at most `MESSAGES_PER_READ_MAX` steps), optionally ending with EOF.
//!
//! Only the turn structure is repeated here: `Driver::read_head` (read into a buffer of at most
//! `HEAD_BYTES_MAX`, parse after each read) and the loop of `Driver::read_messages` (a step, its
//! answer, stop on anything but a message). Both are tied to the driver's mio sockets and its
//! core, so the target cannot run them over its in-memory peer; see `fuzz/README.md`.
//!
//! Three input modes. *Literal* (the input starts with `G`, `P` or `g`, like a request line): the
//! input is the byte stream, head and frames. *Raw*: a generated delivery, then the bytes as head
//! (or a valid head with a generated token) and frames. *Structured*: a generated head (path, query with `tkn`/`token`,
//! `Authorization` variants, `Origin`) and generated frames (opcodes, fragmentation, masking,
//! 7/16/64-bit lengths, reserved bits, close codes, invalid UTF-8, lengths over the limit),
//! where a model says which principal authenticates and which messages and which close the
//! server must produce.
//!
//! Checks: no panic; a head is refused only with 400/431 and a request routed away only with
//! 400/404/426, an upgrade always has a key and a complete head fits the bytes read; every stop
//! is one the server handles (1002/1003/1007/1009, peer close, EOF), never an unexpected error;
//! the same bytes give the same transcript whatever the chunking; text messages are within
//! `frame_bytes_max` and go through the `envelope` checks; what the server writes back (pongs,
//! close reply), read by tungstenite as a client, is a clean server stream with one pong per
//! ping; in structured mode the transcript and the principal equal the model's. Memory is
//! bounded by the frame limit (the fuzz target measures peak allocation around [`check`]).

use std::io::{self, Read, Write};
use std::sync::Arc;

use arbitrary::{Result as AResult, Unstructured};
use axhost_core::{Limits, Principal, Role, SessionScope};
use axhost_io::credentials::{digest, token_from_request, Credentials, TOKEN_CHARS_MIN};
use axhost_io::server::http::{
    origin_allowed, parse_head, route, Head, Route, Status, HEAD_BYTES_MAX,
};
use axhost_io::server::websocket::{encode_answer, BufferPool, Step as WsStep};
use axhost_io::server::{frame_reader, MESSAGES_PER_READ_MAX};
use axhost_io::PrincipalEntry;
use tungstenite::error::ProtocolError;
use tungstenite::protocol::Role as WsRole;
use tungstenite::{Message, WebSocket};

use crate::envelope;

/// Tokens the credentials know: two that authenticate, one too short to ever authenticate.
pub const TOKEN_ALICE: &str =
    "axh_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
/// 24 characters (the minimum) that need percent-encoding in a query.
pub const TOKEN_BOB: &str = "bob token+/&=%?#é€ 24ch!";
/// Configured, but shorter than `TOKEN_CHARS_MIN`: never authenticates.
pub const TOKEN_SHORT: &str = "short-token-23-chars-xx";
/// Nobody's token.
pub const TOKEN_NOBODY: &str =
    "axh_ffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff";

/// The one allowed origin when an allow-list is on.
pub const ORIGIN_OK: &str = "https://app.example";

fn credentials() -> Credentials {
    let entry = |id: &str, role, token: &str| PrincipalEntry {
        id: id.into(),
        role,
        sessions: SessionScope::All,
        token_sha256: digest(token),
    };
    Credentials::new(&[
        entry("alice", Role::Maintainer, TOKEN_ALICE),
        entry("bob", Role::Observer, TOKEN_BOB),
        entry("shorty", Role::Maintainer, TOKEN_SHORT),
    ])
}

/// The principal id a token must authenticate as.
fn expected_principal(token: &str) -> Option<&'static str> {
    if token.chars().count() < TOKEN_CHARS_MIN {
        return None;
    }
    match token {
        TOKEN_ALICE => Some("alice"),
        TOKEN_BOB => Some("bob"),
        _ => None,
    }
}

// ─── The peer: bytes in chunks, across loop turns ───────────────────────────────────────────

/// An in-memory socket. Reads hand out at most one chunk at a time; at the end of each segment
/// (one loop turn's worth) a read says `WouldBlock` once; after the last segment reads give EOF
/// or `WouldBlock` forever. Writes (tungstenite's, when `check_written` reads as a client) are
/// dropped.
struct Peer {
    data: Vec<u8>,
    pos: usize,
    /// Segment ends (offsets into `data`), ascending, the last one `data.len()`.
    segments: Vec<usize>,
    segment: usize,
    /// Read sizes, cycled.
    chunks: Vec<usize>,
    chunk: usize,
    eof: bool,
}

impl Peer {
    fn new(data: Vec<u8>, cuts: &[usize], chunks: &[usize], eof: bool) -> Peer {
        let mut segments: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
        segments.push(data.len());
        segments.sort_unstable();
        segments.dedup();
        let chunks = if chunks.is_empty() {
            vec![usize::MAX]
        } else {
            chunks.iter().map(|c| c.max(&1).to_owned()).collect()
        };
        Peer {
            data,
            pos: 0,
            segments,
            segment: 0,
            chunks,
            chunk: 0,
            eof,
        }
    }

    /// Whether a later turn will bring more bytes.
    fn more_turns(&self) -> bool {
        self.segment + 1 < self.segments.len()
    }

    /// Starts the next turn: the next segment becomes readable.
    fn next_turn(&mut self) {
        if self.more_turns() {
            self.segment += 1;
        }
    }
}

impl Read for Peer {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let end = self.segments[self.segment];
        if self.pos >= end {
            if self.pos >= self.data.len() && self.eof {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let size = self.chunks[self.chunk % self.chunks.len()];
        self.chunk += 1;
        let n = buf.len().min(end - self.pos).min(size);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

impl Write for Peer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

// ─── The server's read path ─────────────────────────────────────────────────────────────────

/// What the connection amounted to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No head yet and no more bytes (the head deadline would drop it).
    HeadPending,
    /// Closed before a complete head.
    HeadClosed,
    /// Answered with this status and closed (200 for `/healthz`).
    Refused(u16),
    /// Upgraded for this principal; then the transcript.
    Open {
        /// Who authenticated.
        principal: String,
        /// Messages and control frames, in order.
        events: Vec<Event>,
        /// How reading stopped.
        stop: Stop,
    },
}

/// One message or control frame the server read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A text message.
    Text(String),
    /// A ping with its payload.
    Ping(Vec<u8>),
    /// A pong with its payload.
    Pong(Vec<u8>),
}

/// How the read loop ended (`Stop` in `io/src/server.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// Nothing more to read; the connection stays open.
    Idle,
    /// We close with this code.
    Close(u16),
    /// The peer sent a close frame with this code (1005: none).
    PeerClosed(u16),
    /// EOF without a close frame.
    Eof,
}

/// Everything one run produced.
#[derive(Debug)]
pub struct Run {
    /// The decision and transcript.
    pub outcome: Outcome,
    /// The token the head carried.
    pub token: Option<String>,
    /// Bytes the server wrote after the 101 (pongs, close reply).
    pub written: Vec<u8>,
}

/// How the bytes arrive.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// Turn boundaries (offsets, taken modulo the length).
    pub cuts: Vec<usize>,
    /// Read sizes, cycled.
    pub chunks: Vec<usize>,
    /// Whether the peer's EOF follows the last byte.
    pub eof: bool,
}

/// Runs the server's path over `bytes`.
pub fn serve(
    bytes: &[u8],
    delivery: &Delivery,
    limits: &Limits,
    origins: Option<&[String]>,
) -> Run {
    let mut peer = Peer::new(
        bytes.to_vec(),
        &delivery.cuts,
        &delivery.chunks,
        delivery.eof,
    );
    let mut head = Vec::new();
    let mut chunk = [0u8; 4096];
    // `read_head`, once per turn.
    let decided = 'turns: loop {
        loop {
            let room = HEAD_BYTES_MAX.saturating_sub(head.len()).min(chunk.len());
            match peer.read(&mut chunk[..room.max(1)]) {
                Ok(0) => break 'turns None,
                Ok(n) => {
                    head.extend_from_slice(&chunk[..n]);
                    match parse_head(&head) {
                        Head::Partial => {}
                        decided => break 'turns Some(decided),
                    }
                }
                Err(_) => break,
            }
        }
        if !peer.more_turns() {
            let outcome = Outcome::HeadPending;
            return Run {
                outcome,
                token: None,
                written: Vec::new(),
            };
        }
        peer.next_turn();
    };
    let (request, len) = match decided {
        None => {
            return Run {
                outcome: Outcome::HeadClosed,
                token: None,
                written: Vec::new(),
            }
        }
        Some(Head::Invalid(status)) => {
            assert!(
                matches!(status, Status::BadRequest | Status::HeaderFieldsTooLarge),
                "a head refused with {status:?}"
            );
            return Run {
                outcome: Outcome::Refused(status.code()),
                token: None,
                written: Vec::new(),
            };
        }
        Some(Head::Partial) => unreachable!("partial heads keep reading"),
        Some(Head::Complete { request, len }) => {
            assert!(len <= head.len(), "head longer than the buffer");
            (request, len)
        }
    };
    // `on_request`: route, token, origin (capacity is the core's business).
    let token = token_from_request(request.headers(), request.query());
    let refused = |status: Status| Run {
        outcome: Outcome::Refused(status.code()),
        token: token.clone(),
        written: Vec::new(),
    };
    match route(&request) {
        Route::Health => return refused(Status::Ok),
        Route::Reject(status) => {
            assert!(
                matches!(
                    status,
                    Status::BadRequest | Status::NotFound | Status::UpgradeRequired
                ),
                "a request routed to {status:?}"
            );
            return refused(status);
        }
        Route::Upgrade { key } => assert!(!key.is_empty(), "an upgrade without a key"),
    }
    let principal: Option<Arc<Principal>> =
        token.as_deref().and_then(|t| credentials().authenticate(t));
    let Some(principal) = principal else {
        return refused(Status::Unauthorized);
    };
    if !origin_allowed(origins, request.header("origin")) {
        return refused(Status::Forbidden);
    }
    let mut reader = frame_reader(limits, &head[len..]);
    // As in the driver: a buffer borrowed for each read, given back at the end of a read round.
    let mut pool = BufferPool::default();
    let max = usize::try_from(limits.frame_bytes_max).unwrap_or(usize::MAX);
    let mut events = Vec::new();
    let mut written = Vec::new();
    // `read_messages`, once per read round (several rounds may share a loop turn).
    let stop = loop {
        let mut stop = None;
        for _ in 0..MESSAGES_PER_READ_MAX {
            let step = reader.read_from(&mut peer, &mut pool);
            encode_answer(&mut written, &step);
            match step {
                WsStep::Text(text) => {
                    assert!(text.len() <= max, "a text message over frame_bytes_max");
                    envelope::check(text.as_bytes());
                    events.push(Event::Text(text.to_owned()));
                }
                WsStep::Ping(p) => {
                    assert!(p.len() <= 125);
                    events.push(Event::Ping(p.to_vec()));
                }
                WsStep::Pong(p) => {
                    assert!(p.len() <= 125);
                    events.push(Event::Pong(p.to_vec()));
                }
                // Part of a message: counts against the round's budget like any frame.
                WsStep::Fragment => {}
                WsStep::Close(code) => {
                    stop = Some(Stop::PeerClosed(code.unwrap_or(1005)));
                    break;
                }
                WsStep::Fail((code, reason)) => {
                    assert!(
                        matches!(code, 1002 | 1003 | 1007 | 1009) && !reason.is_empty(),
                        "closed with {code} {reason:?}"
                    );
                    stop = Some(Stop::Close(code));
                    break;
                }
                WsStep::Drained => {
                    stop = Some(Stop::Idle);
                    break;
                }
                WsStep::Eof => {
                    stop = Some(Stop::Eof);
                    break;
                }
                WsStep::Error(e) => panic!("the in-memory peer never fails, yet: {e}"),
            }
        }
        reader.park(&mut pool);
        match stop {
            // The budget ran out: the server reads again in its next round or turn.
            None => continue,
            Some(Stop::Idle) if peer.more_turns() => peer.next_turn(),
            Some(stop) => break stop,
        }
    };
    Run {
        outcome: Outcome::Open {
            principal: principal.id.clone(),
            events,
            stop,
        },
        token,
        written,
    }
}

/// What the server wrote back, read by tungstenite as a client, must be a clean server stream: one pong per ping, in order, then
/// the close reply if the peer closed.
fn check_written(run: &Run) {
    let Outcome::Open { events, stop, .. } = &run.outcome else {
        assert!(run.written.is_empty());
        return;
    };
    let mut reader = WebSocket::from_partially_read(
        Peer::new(Vec::new(), &[], &[], true),
        run.written.clone(),
        WsRole::Client,
        None,
    );
    let mut pongs = Vec::new();
    let mut close = None;
    loop {
        match reader.read() {
            Ok(Message::Pong(p)) => {
                assert!(close.is_none(), "a pong after the close reply");
                pongs.push(p.to_vec());
            }
            Ok(Message::Close(frame)) => {
                close = Some(frame.map_or(1005, |f| u16::from(f.code)));
            }
            Ok(other) => panic!("the server wrote {other:?}"),
            Err(tungstenite::Error::Protocol(ProtocolError::ResetWithoutClosingHandshake))
            | Err(tungstenite::Error::ConnectionClosed) => break,
            Err(tungstenite::Error::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("the server wrote a broken stream: {e:?}"),
        }
    }
    let pings: Vec<Vec<u8>> = events
        .iter()
        .filter_map(|e| match e {
            Event::Ping(p) => Some(p.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(pongs, pings, "one pong per ping, in order");
    match stop {
        Stop::PeerClosed(code) => assert_eq!(close, Some(*code), "close reply"),
        _ => assert_eq!(close, None, "a close frame nobody asked for"),
    }
}

// ─── Generated cases ────────────────────────────────────────────────────────────────────────

/// A generated frame: header fields, how the length is written, the payload and its mask.
#[derive(Debug, Clone)]
struct FrameSpec {
    fin: bool,
    rsv: u8,
    opcode: u8,
    /// `None`: unmasked.
    mask: Option<[u8; 4]>,
    /// 0: shortest form; 1: 16-bit; 2: 64-bit; 3: a claimed length beyond the bytes sent.
    len_form: u8,
    claim: u64,
    payload: Vec<u8>,
}

impl FrameSpec {
    fn encode(&self, out: &mut Vec<u8>) {
        out.push(u8::from(self.fin) << 7 | (self.rsv & 7) << 4 | (self.opcode & 15));
        let mask_bit = if self.mask.is_some() { 0x80 } else { 0 };
        let n = if self.len_form == 3 {
            self.claim
        } else {
            self.payload.len() as u64
        };
        match self.len_form {
            0 | 3 if n < 126 => out.push(mask_bit | n as u8),
            0 | 1 | 3 if n <= u64::from(u16::MAX) => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            _ => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&n.to_be_bytes());
            }
        }
        if let Some(mask) = self.mask {
            out.extend_from_slice(&mask);
        }
        let start = out.len();
        out.extend_from_slice(&self.payload);
        if let Some(mask) = self.mask {
            for (i, b) in out[start..].iter_mut().enumerate() {
                *b ^= mask[i % 4];
            }
        }
    }

    /// The length the header announces.
    fn announced(&self) -> u64 {
        if self.len_form == 3 {
            self.claim
        } else {
            self.payload.len() as u64
        }
    }
}

/// The transcript the model expects for these frames. Header checks come first, in order
/// (`io/src/server/websocket.rs`): opcode, RSV bits and mask; control frame rules;
/// fragmentation; binary; size. Then a frame whose payload never fully arrives stops reading.
fn model_frames(frames: &[FrameSpec], max: usize, eof: bool) -> (Vec<Event>, Stop) {
    let mut events = Vec::new();
    // The text message being assembled from fragments.
    let mut incomplete: Option<Vec<u8>> = None;
    // A prefix that can never become UTF-8 (an invalid sequence before the end).
    let utf8_broken =
        |b: &[u8]| matches!(std::str::from_utf8(b), Err(e) if e.error_len().is_some());
    for f in frames {
        let opcode = f.opcode & 15;
        let announced = f.announced();
        if matches!(opcode, 3..=7 | 11..=15) || f.rsv & 7 != 0 || f.mask.is_none() {
            return (events, Stop::Close(1002));
        }
        if opcode >= 8 {
            if !f.fin || announced > 125 {
                return (events, Stop::Close(1002));
            }
        } else {
            match (opcode, &incomplete) {
                (0, None) | (1 | 2, Some(_)) => return (events, Stop::Close(1002)),
                (2, None) => return (events, Stop::Close(1003)),
                _ => {}
            }
            let have = incomplete.as_ref().map_or(0, Vec::len) as u64;
            if announced > (max as u64).saturating_sub(have) {
                return (events, Stop::Close(1009));
            }
        }
        if f.len_form == 3 && announced > f.payload.len() as u64 {
            // The rest never comes.
            return (events, if eof { Stop::Eof } else { Stop::Idle });
        }
        let p = &f.payload;
        match opcode {
            8 => {
                return match p.len() {
                    0 => (events, Stop::PeerClosed(1005)),
                    1 => (events, Stop::Close(1002)),
                    _ if std::str::from_utf8(&p[2..]).is_err() => (events, Stop::Close(1007)),
                    _ => {
                        let code = u16::from_be_bytes([p[0], p[1]]);
                        (events, Stop::PeerClosed(close_code_reply(code)))
                    }
                }
            }
            9 => events.push(Event::Ping(p.clone())),
            10 => events.push(Event::Pong(p.clone())),
            _ => {
                let mut bytes = incomplete.take().unwrap_or_default();
                bytes.extend_from_slice(p);
                if !f.fin {
                    if utf8_broken(&bytes) {
                        return (events, Stop::Close(1007));
                    }
                    incomplete = Some(bytes);
                    continue;
                }
                match String::from_utf8(bytes) {
                    Ok(s) => events.push(Event::Text(s)),
                    Err(_) => return (events, Stop::Close(1007)),
                }
            }
        }
    }
    (events, if eof { Stop::Eof } else { Stop::Idle })
}

/// The code the server echoes for a peer's close: codes not allowed on the wire become 1002.
/// Written out here rather than taken from `websocket::close_code_allowed`, so the model is
/// independent of the code under test.
fn close_code_reply(code: u16) -> u16 {
    if matches!(code, 1000..=1003 | 1007..=1013 | 3000..=4999) {
        code
    } else {
        1002
    }
}

/// A head with a known meaning: which token it carries.
struct HeadSpec {
    bytes: Vec<u8>,
    /// The token `token_from_request` must find.
    token: Option<String>,
}

const TOKENS: &[&str] = &[
    TOKEN_ALICE,
    TOKEN_ALICE,
    TOKEN_BOB,
    TOKEN_BOB,
    TOKEN_SHORT,
    TOKEN_NOBODY,
    "",
    " x ",
];

fn pick<'s>(u: &mut Unstructured<'_>, items: &[&'s str]) -> AResult<&'s str> {
    Ok(items[u.int_in_range(0..=items.len() - 1)?])
}

/// Percent-encodes `s` for a query: unreserved characters kept (sometimes encoded too), the
/// rest as `%XX` in either case. Returns the text and whether it decodes back to `s`.
fn percent_encode(u: &mut Unstructured<'_>, s: &str) -> AResult<(String, bool)> {
    let mut out = String::new();
    for b in s.bytes() {
        let unreserved = b.is_ascii_alphanumeric() || b"-._~".contains(&b);
        if unreserved && u.int_in_range(0..=3)? != 0 {
            out.push(char::from(b));
        } else if u.int_in_range(0..=1)? == 0 {
            out.push_str(&format!("%{b:02X}"));
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    if u.int_in_range(0..=15)? == 0 {
        // A broken escape: the parameter does not decode.
        out.push_str(pick(u, &["%", "%f", "%zz", "%g0"])?);
        return Ok((out, false));
    }
    Ok((out, true))
}

fn generate_head(u: &mut Unstructured<'_>) -> AResult<HeadSpec> {
    let method = pick(u, &["GET", "GET", "GET", "POST", "get"])?;
    let path = pick(
        u,
        &["/axp", "/axp", "/", "/healthz", "/axp/", "/AXP", "/other"],
    )?;
    // Query parameters; the first `tkn`/`token` with a non-empty, decodable value counts.
    let mut query = Vec::new();
    let mut query_token = None;
    for _ in 0..u.int_in_range(0..=3)? {
        let key = pick(u, &["tkn", "token", "tkn", "x", "tokens", "TKN", "xtkn"])?;
        let token = pick(u, TOKENS)?;
        let (value, decodes) = percent_encode(u, token)?;
        if (key == "tkn" || key == "token") && decodes && !token.is_empty() && query_token.is_none()
        {
            query_token = Some(token.to_owned());
        }
        query.push(format!("{key}={value}"));
    }
    let mut target = path.to_owned();
    if !query.is_empty() || u.ratio(1, 8)? {
        target.push('?');
        target.push_str(&query.join("&"));
    }
    let version = if u.ratio(1, 16)? { "1.0" } else { "1.1" };
    let mut lines = vec![
        format!("{method} {target} HTTP/{version}"),
        "Host: x".to_owned(),
    ];
    if !u.ratio(1, 16)? {
        let v = pick(
            u,
            &["websocket", "WebSocket", "h2c, websocket", "websocket2"],
        )?;
        lines.push(format!("Upgrade: {v}"));
    }
    if !u.ratio(1, 16)? {
        let v = pick(
            u,
            &["Upgrade", "keep-alive, Upgrade", "upgrade", "keep-alive"],
        )?;
        lines.push(format!("Connection: {v}"));
    }
    if !u.ratio(1, 16)? {
        let v = pick(u, &["13", "13", "8", " 13 "])?;
        lines.push(format!("Sec-WebSocket-Version: {v}"));
    }
    if !u.ratio(1, 16)? {
        let v = pick(
            u,
            &["dGhlIHNhbXBsZSBub25jZQ==", "dGhlIHNhbXBsZSBub25jZQ==", "x"],
        )?;
        lines.push(format!("Sec-WebSocket-Key: {v}"));
    }
    // Authorization headers; the first with scheme Bearer and a non-empty token counts.
    let mut header_token = None;
    for _ in 0..u.int_in_range(0..=2)? {
        let name = pick(
            u,
            &[
                "Authorization",
                "authorization",
                "AUTHORIZATION",
                "X-Authorization",
            ],
        )?;
        let scheme = pick(u, &["Bearer", "bearer", "BEARER", "Basic", "Bearerx"])?;
        let sep = pick(u, &[" ", "\t", "  "])?;
        let token = pick(u, TOKENS)?;
        let trail = pick(u, &["", " ", "\t"])?;
        let counts = name.eq_ignore_ascii_case("authorization")
            && scheme.eq_ignore_ascii_case("bearer")
            && !token.trim().is_empty();
        if counts && header_token.is_none() {
            header_token = Some(token.trim().to_owned());
        }
        lines.push(format!("{name}: {scheme}{sep}{token}{trail}"));
    }
    if u.ratio(1, 3)? {
        let origin = pick(
            u,
            &[ORIGIN_OK, "HTTPS://APP.example", "https://evil.example", ""],
        )?;
        lines.push(format!("Origin: {origin}"));
    }
    for _ in 0..u.int_in_range(0..=2)? {
        lines.push(format!(
            "X-Pad-{}: {}",
            u.int_in_range(0..=99u8)?,
            "y".repeat(u.int_in_range(0..=64)?)
        ));
    }
    let mut text = lines.join("\r\n");
    text.push_str("\r\n\r\n");
    Ok(HeadSpec {
        bytes: text.into_bytes(),
        token: header_token.or(query_token),
    })
}

fn generate_payload(u: &mut Unstructured<'_>, opcode: u8) -> AResult<Vec<u8>> {
    Ok(match (opcode, u.int_in_range(0..=7u8)?) {
        (8, 0..=4) => {
            let code: u16 = match u.int_in_range(0..=3u8)? {
                0 => 1000,
                1 => u.int_in_range(999..=1016)?,
                2 => u.int_in_range(2999..=5000)?,
                _ => u.arbitrary()?,
            };
            let mut p = code.to_be_bytes().to_vec();
            p.extend_from_slice(pick(u, &["", "bye", "é", "\u{fffd}"])?.as_bytes());
            if u.ratio(1, 8)? {
                p.push(0xff);
            }
            p
        }
        (1 | 0, 0..=4) => {
            let msg = pick(
                u,
                &[
                    r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"channel":"ahp-root://"}}"#,
                    r#"{"jsonrpc":"2.0","method":"x"}"#,
                    "héllo €😀",
                    "",
                ],
            )?;
            msg.as_bytes().to_vec()
        }
        (_, 5) => {
            // Invalid UTF-8: a lone continuation byte, an overlong form, a surrogate, a cut char.
            let bad: &[&[u8]] = &[b"\x80", b"\xc0\xaf", b"\xed\xa0\x80", b"\xe2\x82", b"\xff"];
            bad[u.int_in_range(0..=bad.len() - 1)?].to_vec()
        }
        (_, 6) => vec![b'x'; u.int_in_range(100..=300)?],
        _ => {
            let n = u.int_in_range(0..=32)?;
            u.bytes(n)?.to_vec()
        }
    })
}

/// Frames for one or more messages: whole, fragmented (split anywhere, even inside a UTF-8
/// character), interleaved with control frames, sometimes broken.
fn generate_frames(u: &mut Unstructured<'_>) -> AResult<Vec<FrameSpec>> {
    let mut frames = Vec::new();
    for _ in 0..u.int_in_range(0..=6)? {
        let kind = u.int_in_range(0..=15u8)?;
        let opcode = match kind {
            0..=5 => 1,
            6 => 2,
            7 => 0,
            8 => 8,
            9 | 10 => 9,
            11 => 10,
            12 => u.int_in_range(3..=7)?,
            13 => u.int_in_range(11..=15)?,
            _ => 1,
        };
        let payload = generate_payload(u, opcode)?;
        let fragments = if opcode <= 2 && u.ratio(1, 4)? {
            u.int_in_range(2..=4)?
        } else {
            1
        };
        let mut cuts: Vec<usize> = Vec::new();
        for _ in 1..fragments {
            cuts.push(u.int_in_range(0..=payload.len())?);
        }
        cuts.sort_unstable();
        cuts.push(payload.len());
        let mut start = 0;
        for (i, end) in cuts.iter().enumerate() {
            let odd = u.ratio(1, 24)?;
            let mask = if u.ratio(1, 32)? {
                None
            } else {
                Some(u.arbitrary()?)
            };
            let len_form = u.int_in_range(0..=7u8)?.saturating_sub(4);
            let claim = if len_form == 3 {
                let claim: u64 = match u.int_in_range(0..=3u8)? {
                    0 => u.arbitrary()?,
                    1 => 16 * 1024 * 1024 + u.int_in_range(0..=2)?,
                    _ => payload.len() as u64 + u.int_in_range(1..=70_000)?,
                };
                // More than is sent: the frame stays incomplete.
                claim.max(payload[start..*end].len() as u64 + 1)
            } else {
                0
            };
            frames.push(FrameSpec {
                fin: if odd {
                    i + 1 != cuts.len()
                } else {
                    i + 1 == cuts.len()
                },
                rsv: if u.ratio(1, 32)? {
                    u.int_in_range(1..=7)?
                } else {
                    0
                },
                opcode: if i == 0 { opcode } else { 0 },
                mask,
                len_form,
                claim,
                payload: payload[start..*end].to_vec(),
            });
            start = *end;
            if len_form == 3 {
                // Whatever follows an incomplete frame would be read as its payload.
                return Ok(frames);
            }
        }
    }
    Ok(frames)
}

/// The `websocket` target.
pub fn check(data: &[u8]) {
    let _ = summary(data);
}

/// Runs the checks and names what the input amounted to (for corpus statistics).
pub fn summary(data: &[u8]) -> String {
    if matches!(data.first(), Some(b'G' | b'P' | b'g')) {
        return check_literal(data);
    }
    let mut u = Unstructured::new(data);
    match check_inner(&mut u) {
        Ok(s) => s,
        Err(_) => "not enough bytes".into(),
    }
}

/// Literal mode (the input starts like a request line): the bytes are the stream, head and
/// frames, served with the default limits and an origin allow-list, all at once and in small
/// chunks across turns (same transcript), without and with EOF at the end.
fn check_literal(data: &[u8]) -> String {
    let limits = Limits::default();
    let origins = [ORIGIN_OK.to_owned()];
    let whole = Delivery {
        cuts: Vec::new(),
        chunks: Vec::new(),
        eof: false,
    };
    let run = serve(data, &whole, &limits, Some(&origins));
    check_written(&run);
    let chunked = Delivery {
        cuts: vec![data.len() / 3, data.len() / 2],
        chunks: vec![1, 7, 4096],
        eof: false,
    };
    let again = serve(data, &chunked, &limits, Some(&origins));
    check_written(&again);
    assert_eq!(run.outcome, again.outcome, "chunking changed the outcome");
    let eof = Delivery { eof: true, ..whole };
    let ended = serve(data, &eof, &limits, Some(&origins));
    check_written(&ended);
    match (&run.outcome, &ended.outcome) {
        (
            Outcome::Open { events, stop, .. },
            Outcome::Open {
                events: e2,
                stop: s2,
                ..
            },
        ) => {
            assert_eq!(events, e2, "EOF changed what was read before it");
            if *stop != Stop::Idle {
                assert_eq!(stop, s2, "EOF changed how reading stopped");
            }
        }
        (Outcome::HeadPending, _) => {}
        (a, b) => assert_eq!(a, b, "EOF changed the decision"),
    }
    match &run.outcome {
        Outcome::Open { events, stop, .. } => {
            format!("literal open {} events, {stop:?}", events.len())
        }
        other => format!("literal {other:?}"),
    }
}

fn check_inner(u: &mut Unstructured<'_>) -> AResult<String> {
    let small = u.ratio(1, 2)?;
    let mut limits = Limits::default();
    if small {
        // The smallest limits the core accepts, so size limits are within fuzzing reach.
        limits.message_bytes_max = 1024;
        limits.frame_bytes_max = u.int_in_range(1024..=2048)?;
    }
    let origins_on = u.ratio(1, 2)?;
    let origins = vec![ORIGIN_OK.to_owned()];
    let origins = origins_on.then_some(origins.as_slice());
    let delivery = Delivery {
        cuts: (0..u.int_in_range(0..=4)?)
            .map(|_| u.arbitrary::<u16>().map(usize::from))
            .collect::<AResult<_>>()?,
        chunks: (0..u.int_in_range(0..=4)?)
            .map(|_| u.int_in_range(1..=4096usize))
            .collect::<AResult<_>>()?,
        eof: u.arbitrary()?,
    };
    let structured: bool = u.arbitrary()?;
    let (bytes, head_token, model) = if structured {
        let head = generate_head(u)?;
        let frames = generate_frames(u)?;
        let mut bytes = head.bytes;
        for f in &frames {
            f.encode(&mut bytes);
        }
        let max = usize::try_from(limits.frame_bytes_max).unwrap_or(usize::MAX);
        let model = model_frames(&frames, max, delivery.eof);
        (bytes, Some(head.token), Some(model))
    } else {
        let mut bytes = Vec::new();
        if u.arbitrary()? {
            // A valid upgrade, so raw frame bytes reach the frame reader.
            let token = pick(u, TOKENS)?;
            bytes.extend_from_slice(
                format!(
                    "GET /axp HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
                     Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: a2V5\r\n\
                     Authorization: Bearer {token}\r\n\r\n"
                )
                .as_bytes(),
            );
        }
        let rest = u.len();
        bytes.extend_from_slice(u.bytes(rest)?);
        (bytes, None, None)
    };
    let run = serve(&bytes, &delivery, &limits, origins);
    check_written(&run);
    // Chunking and turns change nothing.
    let whole = Delivery {
        cuts: Vec::new(),
        chunks: Vec::new(),
        eof: delivery.eof,
    };
    let again = serve(&bytes, &whole, &limits, origins);
    assert_eq!(run.outcome, again.outcome, "chunking changed the outcome");
    if let Some(expected) = &head_token {
        assert_eq!(
            &run.token, expected,
            "token_from_request found another token"
        );
        let who = expected.as_deref().and_then(expected_principal);
        match &run.outcome {
            Outcome::Open { principal, .. } => assert_eq!(Some(principal.as_str()), who),
            Outcome::Refused(401) => assert_eq!(who, None, "a valid token refused"),
            _ => {}
        }
    }
    let mode = if head_token.is_some() {
        "structured"
    } else {
        "raw"
    };
    if let (
        Some((events, stop)),
        Outcome::Open {
            events: e, stop: s, ..
        },
    ) = (&model, &run.outcome)
    {
        assert_eq!((e, s), (events, stop), "transcript differs from the model");
    }
    Ok(match &run.outcome {
        Outcome::Open { events, stop, .. } => {
            format!("{mode} open {} events, {stop:?}", events.len())
        }
        other => format!("{mode} {other:?}"),
    })
}
