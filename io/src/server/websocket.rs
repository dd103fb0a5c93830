//! The server's WebSocket reader (RFC 6455 section 5): frames are parsed where they were read,
//! unmasked in place, and a whole text frame reaches the core as a `&str` into the read buffer.
//!
//! Why not tungstenite here: on the host's hot path its reader was a quarter of the CPU (a
//! `BytesMut` that zero-fills its read space before every read, a copy of every payload into a
//! fresh message allocation, and the unmask on that copy). This reader keeps one buffer per
//! connection, zeroed once, and copies nothing for an unfragmented message. Only fragmented
//! messages are assembled in a second buffer. The client side (`crate::client`) still uses
//! tungstenite.
//!
//! What the peer may send, and what each violation costs it (the driver closes with the code):
//!
//! | frame | outcome |
//! | --- | --- |
//! | text, whole or in fragments, valid UTF-8 | [`Step::Text`] (each fragment before the last: [`Step::Fragment`]) |
//! | ping / pong (≤ 125 bytes, not fragmented) | [`Step::Ping`] (the driver answers with a pong) / [`Step::Pong`] |
//! | close: empty, or a code and a UTF-8 reason | [`Step::Close`] with the code to echo |
//! | reserved opcode or RSV bit, unmasked frame, bad fragmentation, control frame over 125 bytes or fragmented, close with a 1-byte payload | 1002 |
//! | binary | 1003 (the protocol is JSON text) |
//! | text that is not UTF-8 (as soon as a fragment proves it), close reason not UTF-8 | 1007 |
//! | a frame or message over the limit (decided from the header, before the payload arrives) | 1009 |
//! | a message whose bytes held so far would take every reader's partial messages past their shared budget ([`PartialBudget`]) | 1013 |
//!
//! Header checks run in that order as soon as the whole header is buffered, so a frame that
//! announces 2 GiB is refused before any of it is read, and the outcome never depends on how
//! the bytes were split across reads.

use std::cell::Cell;
use std::io::{self, Read};
use std::rc::Rc;

/// A read buffer. Lent to a connection while it reads (see [`BufferPool`]); a larger frame grows
/// the one it was lent (doubling as its bytes arrive) for as long as it takes to read.
pub const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Most unparsed bytes a reader keeps by itself between reads (a frame cut by the end of the last
/// read); with more, it keeps its buffer.
pub const PARKED_BYTES_MAX: usize = 1024;

/// Free read buffers the pool keeps; one is enough for the single-threaded driver, a few cover
/// the connections that keep theirs between turns and then give them back together.
const POOL_BUFFERS_MAX: usize = 8;

/// Largest control frame payload (RFC 6455 section 5.5).
const CONTROL_PAYLOAD_MAX: usize = 125;

/// Frame opcodes (RFC 6455 section 5.2).
pub const OPCODE_CONTINUATION: u8 = 0x0;
/// A text frame.
pub const OPCODE_TEXT: u8 = 0x1;
/// A binary frame.
pub const OPCODE_BINARY: u8 = 0x2;
/// A close frame.
pub const OPCODE_CLOSE: u8 = 0x8;
/// A ping frame.
pub const OPCODE_PING: u8 = 0x9;
/// A pong frame.
pub const OPCODE_PONG: u8 = 0xA;

/// The code the driver closes with when the peer broke the protocol, and why.
pub type Violation = (u16, &'static str);

const PROTOCOL: Violation = (1002, "WebSocket protocol error");
const BINARY: Violation = (1003, "JSON text frames required");
const NOT_UTF8: Violation = (1007, "Text frames must be UTF-8");
const TOO_BIG: Violation = (1009, "Frame too large");
/// The host is short of room for partial messages now; the client may send the message again
/// later (1013, "try again later", in the IANA registry of close codes).
const BUDGET_FULL: Violation = (1013, "Host holds too many partial messages");

/// One step of reading a connection.
#[derive(Debug)]
pub enum Step<'a> {
    /// A complete text message.
    Text(&'a str),
    /// A ping; answer with a pong carrying the same payload.
    Ping(&'a [u8]),
    /// A pong (the answer to a keepalive ping).
    Pong(&'a [u8]),
    /// A fragment of a text message that is not complete yet. Returned, rather than read past,
    /// so every frame counts against the caller's per-round budget: a peer streaming empty
    /// continuation frames cannot hold the loop inside one call.
    Fragment,
    /// The peer closed. Echo `Some(code)` (a code not allowed on the wire became 1002), or an
    /// empty close frame for `None` (the peer gave no code).
    Close(Option<u16>),
    /// The peer broke the protocol: close with this code and reason, read nothing more.
    Fail(Violation),
    /// The socket has nothing more for now (`WouldBlock`).
    Drained,
    /// The peer's EOF (a half-received frame, if any, is lost with it).
    Eof,
    /// A socket error other than `WouldBlock` and `Interrupted`.
    Error(io::Error),
}

/// What parsing the buffered bytes produced; owns nothing, so the read loop can fill the buffer
/// again before it lends the payload out.
enum Parsed {
    /// A text message in `buf[range]`; `true` when unmasking found every byte ASCII, so that
    /// it needs no further UTF-8 check.
    Text(usize, usize, bool),
    /// The assembled fragmented message in `message` (already checked for UTF-8 as it grew).
    Assembled,
    Ping(usize, usize),
    Pong(usize, usize),
    /// A fragment was added to `message`; the message is not complete.
    Fragment,
    Close(Option<u16>),
    Fail(Violation),
    /// Need more bytes: the current frame (or header) ends `want` bytes after `start`.
    Incomplete,
}

/// A fragmented text message being assembled.
#[derive(Debug, Clone, Copy)]
struct Fragmented {
    /// Bytes of `message` known to be a valid UTF-8 prefix (a character may be cut at the end).
    checked: usize,
}

/// Read buffers shared by every connection of one driver.
///
/// A connection reads into a buffer from the pool and gives it back once it has parsed all but
/// a few bytes ([`FrameReader::park`]), so the driver's reads cycle through a buffer or two that
/// stay in cache, rather than one 16 KiB buffer per connection (1 MiB at 64 busy senders, which
/// the kernel's copy and the parse then miss in cache each turn). An idle connection holds no
/// read buffer at all.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Vec<Vec<u8>>,
}

impl BufferPool {
    /// A buffer of [`READ_BUFFER_BYTES`]: the most recently returned one, or a new zeroed one.
    fn take(&mut self) -> Vec<u8> {
        self.free
            .pop()
            .unwrap_or_else(|| vec![0u8; READ_BUFFER_BYTES])
    }

    /// Keeps `buf` for the next reader if it has the standard size and the pool has room.
    fn give(&mut self, buf: Vec<u8>) {
        if buf.len() == READ_BUFFER_BYTES && self.free.len() < POOL_BUFFERS_MAX {
            self.free.push(buf);
        }
    }

    /// Buffers held for reuse.
    pub fn free_buffers(&self) -> usize {
        self.free.len()
    }
}

/// What partially received messages may hold across every reader of one driver, in bytes.
///
/// Each reader is charged what it holds for a message that has not arrived whole: the fragments
/// assembled so far, and its read buffer beyond [`READ_BUFFER_BYTES`] while a large frame comes
/// in. A reader asks before it grows either; when the growth would take the total past the
/// budget, its connection fails with 1013 and nothing is allocated. Shrinking and dropping a
/// reader give the bytes back. Shared by `Rc`: the driver is one thread.
#[derive(Debug)]
pub struct PartialBudget {
    held: Cell<usize>,
    max: usize,
}

impl PartialBudget {
    /// A budget of `max` bytes.
    pub fn new(max: usize) -> Rc<PartialBudget> {
        Rc::new(PartialBudget {
            held: Cell::new(0),
            max,
        })
    }

    /// A budget that never refuses (the fuzz target and tests that look at one reader).
    pub fn unlimited() -> Rc<PartialBudget> {
        PartialBudget::new(usize::MAX)
    }

    /// Bytes charged to readers now.
    pub fn held(&self) -> usize {
        self.held.get()
    }

    /// Charges `bytes` if they fit under the budget.
    fn try_charge(&self, bytes: usize) -> bool {
        match self.held.get().checked_add(bytes) {
            Some(total) if total <= self.max => {
                self.held.set(total);
                true
            }
            _ => false,
        }
    }

    /// Moves a reader's charge from `from` to `to` bytes without asking: for shrinking, and for
    /// growth already granted by `try_charge` that the allocator rounded up.
    fn recharge(&self, from: usize, to: usize) {
        let held = self.held.get();
        debug_assert!(
            held >= from,
            "budget holds {held}, a reader gives back {from}"
        );
        self.held.set(held.saturating_sub(from).saturating_add(to));
    }
}

/// Reads frames from one connection.
#[derive(Debug)]
pub struct FrameReader {
    /// `buf[start..end]` is read and not yet parsed. `buf.len()` is its capacity: it is zeroed
    /// once (and when it grows), never before each read. Empty while parked: the unparsed bytes
    /// are then in `parked`.
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// Bytes from `start` the frame being parsed needs (header, or header and payload).
    want: usize,
    /// Fragments of a text message so far.
    message: Vec<u8>,
    fragmented: Option<Fragmented>,
    /// `message` was handed out as the last `Text`; clear it before parsing on.
    delivered: bool,
    /// A protocol violation or close frame was read: nothing more is parsed.
    done: bool,
    /// Largest frame payload and largest message, in bytes.
    max: usize,
    /// Unparsed bytes kept while the reader has no buffer (at most [`PARKED_BYTES_MAX`], or the
    /// bytes that followed the HTTP head).
    parked: Vec<u8>,
    /// Shared with every reader of the driver; `charged` is this reader's part of it.
    /// Invariant: `charged == self.held_partial()` between calls.
    budget: Rc<PartialBudget>,
    charged: usize,
}

impl Drop for FrameReader {
    fn drop(&mut self) {
        self.budget.recharge(self.charged, 0);
    }
}

impl FrameReader {
    /// A reader for messages up to `max_message_bytes`, starting with bytes that followed the
    /// HTTP head in the same read, with a budget of its own that never refuses. It starts
    /// parked: it takes a buffer when it first reads.
    pub fn new(max_message_bytes: usize, early: &[u8]) -> FrameReader {
        FrameReader::sharing(max_message_bytes, early, PartialBudget::unlimited())
    }

    /// As [`FrameReader::new`], charging what its partial messages hold to `budget`.
    pub fn sharing(
        max_message_bytes: usize,
        early: &[u8],
        budget: Rc<PartialBudget>,
    ) -> FrameReader {
        FrameReader {
            buf: Vec::new(),
            start: 0,
            end: 0,
            want: 0,
            message: Vec::new(),
            fragmented: None,
            delivered: false,
            done: false,
            max: max_message_bytes,
            parked: early.to_vec(),
            budget,
            charged: 0,
        }
    }

    /// Bytes this reader holds for a message that has not arrived whole (what its budget is
    /// charged): the assembly buffer, and the read buffer beyond its standard size.
    fn held_partial(&self) -> usize {
        self.message.capacity() + self.buf.len().saturating_sub(READ_BUFFER_BYTES)
    }

    /// Brings the charge in line with what the reader holds after it shrank (or after a granted
    /// growth the allocator rounded up).
    fn recharge(&mut self) {
        let held = self.held_partial();
        self.budget.recharge(self.charged, held);
        self.charged = held;
    }

    /// Charges `bytes` of growth before it is allocated; false when the budget has no room.
    fn grant(&mut self, bytes: usize) -> bool {
        let granted = self.budget.try_charge(bytes);
        if granted {
            self.charged += bytes;
        }
        granted
    }

    /// Bytes read but not yet parsed.
    pub fn buffered(&self) -> usize {
        if self.buf.is_empty() {
            self.parked.len()
        } else {
            self.end - self.start
        }
    }

    /// Bytes held by the reader's buffers (for memory accounting in tests).
    pub fn capacity(&self) -> usize {
        self.buf.len() + self.message.capacity() + self.parked.capacity()
    }

    /// Whether the reader holds a read buffer (it is not parked).
    pub fn holds_buffer(&self) -> bool {
        !self.buf.is_empty()
    }

    /// Gives the buffer back to `pool` when at most [`PARKED_BYTES_MAX`] unparsed bytes are
    /// left (copied aside); the next [`FrameReader::read_from`] takes one again. Call at the
    /// end of a connection's read round; a reader with more left, or in the middle of a
    /// frame that grew its buffer, keeps it.
    pub fn park(&mut self, pool: &mut BufferPool) {
        debug_assert_eq!(self.charged, self.held_partial(), "partial-message charge");
        let left = self.end - self.start;
        if self.buf.is_empty() || left > PARKED_BYTES_MAX {
            return;
        }
        self.parked.clear();
        self.parked
            .extend_from_slice(&self.buf[self.start..self.end]);
        self.start = 0;
        self.end = 0;
        pool.give(std::mem::take(&mut self.buf));
        self.recharge();
    }

    /// Installs `buf` (zeroed or reused, at least [`READ_BUFFER_BYTES`]) with the parked bytes
    /// at its front.
    fn lend(&mut self, mut buf: Vec<u8>) {
        let n = self.parked.len();
        if buf.len() < n + 1 {
            buf.resize(n + 1, 0);
        }
        buf[..n].copy_from_slice(&self.parked);
        self.parked.clear();
        if self.parked.capacity() > PARKED_BYTES_MAX {
            // The bytes after the HTTP head, once; keep only what parking needs.
            self.parked.shrink_to(PARKED_BYTES_MAX);
        }
        self.buf = buf;
        self.start = 0;
        self.end = n;
        // Early bytes past the standard size (a head of at most 16 KiB): bounded, not asked for.
        self.recharge();
    }

    /// The next message or control frame, reading from `src` when the buffer holds no complete
    /// frame. Reads only until one event is ready, so a caller that stops after N steps leaves
    /// the rest in the socket (the driver's per-round budget). A parked reader first takes a
    /// buffer from `pool`, with its parked bytes at the front.
    ///
    /// Inlined into the driver's read loop so a text step's `&str` stays in registers: returned
    /// through memory, the caller's 16-byte reload of it missed store forwarding and waited for
    /// the unmasked payload's stores to drain (3% of the host at 64->64).
    #[inline(always)]
    pub fn read_from(&mut self, src: &mut impl Read, pool: &mut BufferPool) -> Step<'_> {
        if self.buf.is_empty() {
            self.lend(pool.take());
        }
        let parsed = loop {
            match self.parse() {
                Parsed::Incomplete => {}
                parsed => break parsed,
            }
            match self.fill(src) {
                Ok(0) => return Step::Eof,
                Ok(_) => {}
                Err(Fill::Budget) => {
                    self.done = true;
                    return Step::Fail(BUDGET_FULL);
                }
                Err(Fill::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return Step::Drained,
                Err(Fill::Io(e)) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(Fill::Io(e)) => return Step::Error(e),
            }
        };
        match parsed {
            Parsed::Text(from, to, true) => Step::Text(ascii_str(&self.buf[from..to])),
            Parsed::Text(from, to, false) => match std::str::from_utf8(&self.buf[from..to]) {
                Ok(text) => Step::Text(text),
                Err(_) => {
                    self.done = true;
                    Step::Fail(NOT_UTF8)
                }
            },
            Parsed::Assembled => {
                self.delivered = true;
                match std::str::from_utf8(&self.message) {
                    Ok(text) => Step::Text(text),
                    Err(_) => {
                        self.done = true;
                        Step::Fail(NOT_UTF8)
                    }
                }
            }
            Parsed::Ping(from, to) => Step::Ping(&self.buf[from..to]),
            Parsed::Pong(from, to) => Step::Pong(&self.buf[from..to]),
            Parsed::Fragment => Step::Fragment,
            Parsed::Close(code) => Step::Close(code),
            Parsed::Fail(violation) => Step::Fail(violation),
            Parsed::Incomplete => Step::Drained,
        }
    }

    /// Parses the next buffered frame, if it is complete.
    fn parse(&mut self) -> Parsed {
        if std::mem::take(&mut self.delivered) {
            // Freed, not kept for the next one: fragmented messages are rare, and a kept buffer
            // would stay charged to the shared budget while the connection idles.
            self.message = Vec::new();
            self.recharge();
        }
        if self.done {
            // After a close or a violation the driver reads nothing more; say so plainly.
            return Parsed::Fail(PROTOCOL);
        }
        self.parse_frame()
    }

    /// One frame and what it produced.
    fn parse_frame(&mut self) -> Parsed {
        let have = &self.buf[self.start..self.end];
        if have.len() < 2 {
            self.want = 2;
            return Parsed::Incomplete;
        }
        let (b0, b1) = (have[0], have[1]);
        let fin = b0 & 0x80 != 0;
        let rsv = b0 & 0x70;
        let opcode = b0 & 0x0F;
        let masked = b1 & 0x80 != 0;
        let len_code = b1 & 0x7F;
        let len_bytes = match len_code {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let header = 2 + len_bytes + if masked { 4 } else { 0 };
        if have.len() < header {
            self.want = header;
            return Parsed::Incomplete;
        }
        // Decoded from fixed-size arrays: a copy of `len_bytes` bytes into a zeroed word was a
        // call to `memcpy` and a reload that missed store forwarding, 7% of the host at 64->64
        // (every ~300-byte notify has a 2-byte length).
        let len = match len_code {
            126 => u64::from(u16::from_be_bytes([have[2], have[3]])),
            127 => u64::from_be_bytes([
                have[2], have[3], have[4], have[5], have[6], have[7], have[8], have[9],
            ]),
            n => u64::from(n),
        };
        if let Some(violation) = self.check_header(fin, rsv, opcode, masked, len) {
            self.done = true;
            return Parsed::Fail(violation);
        }
        // `check_header` bounded `len` by `max` (or 125), so this fits.
        let len = usize::try_from(len).unwrap_or(usize::MAX);
        let total = header + len;
        if have.len() < total {
            self.want = total;
            return Parsed::Incomplete;
        }
        let mut key = [0u8; 4];
        key.copy_from_slice(&have[header - 4..header]);
        let from = self.start + header;
        let to = self.start + total;
        self.start = to;
        self.want = 0;
        let ascii = unmask(&mut self.buf[from..to], key);
        match opcode {
            OPCODE_PING => Parsed::Ping(from, to),
            OPCODE_PONG => Parsed::Pong(from, to),
            OPCODE_CLOSE => {
                self.done = true;
                close_frame(&self.buf[from..to])
            }
            OPCODE_TEXT if fin => Parsed::Text(from, to, ascii),
            _ => self.fragment(fin, from, to),
        }
    }

    /// The header checks, in the documented order. `None` when the frame may be read.
    fn check_header(
        &self,
        fin: bool,
        rsv: u8,
        opcode: u8,
        masked: bool,
        len: u64,
    ) -> Option<Violation> {
        let known = matches!(
            opcode,
            OPCODE_CONTINUATION
                | OPCODE_TEXT
                | OPCODE_BINARY
                | OPCODE_CLOSE
                | OPCODE_PING
                | OPCODE_PONG
        );
        // No extension was negotiated, so no RSV bit may be set; clients must mask (5.1).
        if !known || rsv != 0 || !masked {
            return Some(PROTOCOL);
        }
        if opcode >= OPCODE_CLOSE {
            return (!fin || len > CONTROL_PAYLOAD_MAX as u64).then_some(PROTOCOL);
        }
        match (opcode, self.fragmented) {
            (OPCODE_CONTINUATION, None) => return Some(PROTOCOL),
            (OPCODE_TEXT | OPCODE_BINARY, Some(_)) => return Some(PROTOCOL),
            (OPCODE_BINARY, None) => return Some(BINARY),
            _ => {}
        }
        let so_far = self.message.len() as u64;
        (len > (self.max as u64).saturating_sub(so_far)).then_some(TOO_BIG)
    }

    /// A data frame that is part of a fragmented message (a first fragment or a continuation).
    fn fragment(&mut self, fin: bool, from: usize, to: usize) -> Parsed {
        let need = self.message.len() + (to - from);
        let capacity = self.message.capacity();
        if need > capacity {
            // Doubling, as `Vec` would, but asked of the budget first and never past the
            // largest message (the header check bounded `need` by it). When the doubled size
            // does not fit, the exact one may: only bytes that arrived can fail a message.
            let doubled = need.max(capacity.saturating_mul(2).min(self.max));
            let grown = if self.grant(doubled - capacity) {
                doubled
            } else if self.grant(need - capacity) {
                need
            } else {
                self.done = true;
                return Parsed::Fail(BUDGET_FULL);
            };
            self.message.reserve_exact(grown - self.message.len());
            self.recharge();
        }
        self.message.extend_from_slice(&self.buf[from..to]);
        let mut state = self.fragmented.unwrap_or(Fragmented { checked: 0 });
        // Fail as soon as the bytes so far can never become UTF-8 (a character cut at the end
        // may still be completed by the next fragment).
        match std::str::from_utf8(&self.message[state.checked..]) {
            Ok(_) => state.checked = self.message.len(),
            Err(e) if e.error_len().is_none() && !fin => state.checked += e.valid_up_to(),
            Err(_) => {
                self.done = true;
                return Parsed::Fail(NOT_UTF8);
            }
        }
        if fin {
            self.fragmented = None;
            Parsed::Assembled
        } else {
            self.fragmented = Some(state);
            Parsed::Fragment
        }
    }

    /// Reads once from `src` into the buffer, making room for the frame being parsed.
    fn fill(&mut self, src: &mut impl Read) -> Result<usize, Fill> {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > READ_BUFFER_BYTES && self.want <= READ_BUFFER_BYTES {
                // A large frame is over; give its space back.
                self.buf.truncate(READ_BUFFER_BYTES);
                self.buf.shrink_to_fit();
                self.recharge();
            }
        }
        let want = self.want.max(self.end - self.start + 1);
        // Move the partial frame to the front when the frame would not fit behind it, or when
        // the room left is so small that reads would come back short (and cost a syscall each).
        let cramped = self.buf.len() - self.end < self.buf.len() / 4;
        if self.start > 0 && (self.start + want > self.buf.len() || cramped) {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        if self.end == self.buf.len() {
            // Full, and the frame needs more (`want` > `end - start`): grow by doubling, never
            // past the frame (whose header passed the size check, so at most `max` + 14). Memory
            // follows the bytes that arrived, not the length a header announced: a peer that
            // announces 16 MiB and stalls holds twice what it sent.
            let grown = self.buf.len().saturating_mul(2).min(want).max(self.end + 1);
            let charged_now = self.buf.len().saturating_sub(READ_BUFFER_BYTES);
            let charged_then = grown.saturating_sub(READ_BUFFER_BYTES);
            if !self.grant(charged_then - charged_now) {
                return Err(Fill::Budget);
            }
            self.buf.resize(grown, 0);
        }
        let n = src.read(&mut self.buf[self.end..]).map_err(Fill::Io)?;
        self.end += n;
        Ok(n)
    }
}

/// Why a read into the buffer did not happen.
enum Fill {
    /// The frame needs a larger buffer and the shared budget has no room for it.
    Budget,
    /// The socket's error (`WouldBlock` included).
    Io(io::Error),
}

/// Encodes one unfragmented, unmasked frame (servers never mask, section 5.1), with the
/// shortest length form.
pub fn encode_frame(out: &mut Vec<u8>, opcode: u8, payload: &[u8]) {
    out.reserve(payload.len() + 10);
    out.push(0x80 | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

/// Appends what `step` must be answered with on the wire: a pong with the ping's payload, or
/// the reply to a close frame (its code echoed, or an empty close if it had none). Nothing for
/// any other step.
pub fn encode_answer(out: &mut Vec<u8>, step: &Step<'_>) {
    match step {
        Step::Ping(payload) => encode_frame(out, OPCODE_PONG, payload),
        Step::Close(Some(code)) => encode_frame(out, OPCODE_CLOSE, &code.to_be_bytes()),
        Step::Close(None) => encode_frame(out, OPCODE_CLOSE, &[]),
        _ => {}
    }
}

/// Reads a close frame's payload: nothing, or a 2-byte code and a UTF-8 reason (5.5.1).
fn close_frame(payload: &[u8]) -> Parsed {
    match payload {
        [] => Parsed::Close(None),
        [_] => Parsed::Fail(PROTOCOL),
        [hi, lo, reason @ ..] => {
            if std::str::from_utf8(reason).is_err() {
                return Parsed::Fail(NOT_UTF8);
            }
            let code = u16::from_be_bytes([*hi, *lo]);
            Parsed::Close(Some(if close_code_allowed(code) {
                code
            } else {
                PROTOCOL.0
            }))
        }
    }
}

/// Codes a peer may send (RFC 6455 7.4): the defined ones (1004-1006 and 1015 are reserved
/// for reporting, never sent), then registered and private ranges.
pub fn close_code_allowed(code: u16) -> bool {
    matches!(code, 1000..=1003 | 1007..=1013 | 3000..=4999)
}

/// XORs `payload` with the 4-byte masking key, eight bytes at a time, and says whether every
/// unmasked byte is ASCII.
///
/// The pass that unmasks also ORs the words together, so an ASCII text frame (every frame the
/// host's clients send with ASCII payloads) needs no second pass for UTF-8 validation:
/// `from_utf8` was 3-4% of the host at 64->64 flat out.
fn unmask(payload: &mut [u8], key: [u8; 4]) -> bool {
    const HIGHS: u64 = 0x8080_8080_8080_8080;
    let wide = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut seen = 0u64;
    let mut chunks = payload.chunks_exact_mut(8);
    for chunk in &mut chunks {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let plain = u64::from_ne_bytes(word) ^ wide;
        seen |= plain;
        chunk.copy_from_slice(&plain.to_ne_bytes());
    }
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= key[i % 4];
        seen |= u64::from(*b);
    }
    seen & HIGHS == 0
}

/// `bytes` as text, when [`unmask`] found every byte ASCII.
fn ascii_str(bytes: &[u8]) -> &str {
    debug_assert!(bytes.is_ascii());
    // SAFETY: every byte is below 0x80 (checked by `unmask` over exactly these bytes, which
    // nothing writes in between), and ASCII text is valid UTF-8.
    unsafe { std::str::from_utf8_unchecked(bytes) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// A masked client frame.
    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        raw_frame(u8::from(fin) << 7 | opcode, true, payload)
    }

    fn raw_frame(b0: u8, masked: bool, payload: &[u8]) -> Vec<u8> {
        let mut out = vec![b0];
        let mask_bit = if masked { 0x80 } else { 0 };
        match payload.len() {
            n if n < 126 => out.push(mask_bit | n as u8),
            n if n <= 0xFFFF => {
                out.push(mask_bit | 126);
                out.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                out.push(mask_bit | 127);
                out.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let key = [0x37, 0xfa, 0x21, 0x3d];
        if masked {
            out.extend_from_slice(&key);
        }
        out.extend(
            payload
                .iter()
                .enumerate()
                .map(|(i, b)| if masked { b ^ key[i % 4] } else { *b }),
        );
        out
    }

    /// A socket that hands out its bytes in fixed-size reads, then `WouldBlock` (or EOF).
    struct Chunks {
        data: VecDeque<u8>,
        size: usize,
        eof: bool,
    }

    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.data.is_empty() {
                return if self.eof {
                    Ok(0)
                } else {
                    Err(io::ErrorKind::WouldBlock.into())
                };
            }
            let n = buf.len().min(self.size).min(self.data.len());
            for b in buf.iter_mut().take(n) {
                *b = self.data.pop_front().unwrap_or(0);
            }
            Ok(n)
        }
    }

    fn describe(step: &Step<'_>) -> String {
        match step {
            Step::Text(t) => format!("text {t}"),
            Step::Ping(p) => format!("ping {}", String::from_utf8_lossy(p)),
            Step::Pong(p) => format!("pong {}", String::from_utf8_lossy(p)),
            Step::Fragment => "fragment".into(),
            Step::Close(code) => format!("close {code:?}"),
            Step::Fail((code, _)) => format!("fail {code}"),
            Step::Drained => "drained".into(),
            Step::Eof => "eof".into(),
            Step::Error(e) => format!("error {e}"),
        }
    }

    /// A socket holding `data`, read whole, that then says `WouldBlock` (no EOF yet).
    fn waiting(data: impl IntoIterator<Item = u8>) -> Chunks {
        Chunks {
            data: data.into_iter().collect(),
            size: usize::MAX,
            eof: false,
        }
    }

    /// Everything the reader produces from `bytes`, in reads of `size`, as owned strings. With
    /// `park`, the reader gives its buffer back to `pool` before every step (more often than the
    /// driver, which parks once per read round) and takes one again to read.
    fn transcript_with(
        bytes: &[u8],
        size: usize,
        max: usize,
        pool: &mut BufferPool,
        park: bool,
    ) -> Vec<String> {
        let mut src = Chunks {
            data: bytes.iter().copied().collect(),
            size,
            eof: true,
        };
        let mut reader = FrameReader::new(max, &[]);
        let mut out = Vec::new();
        loop {
            if park {
                reader.park(pool);
            }
            let step = reader.read_from(&mut src, pool);
            let line = describe(&step);
            let end = !matches!(
                step,
                Step::Text(_) | Step::Ping(_) | Step::Pong(_) | Step::Fragment | Step::Drained
            );
            if !matches!(step, Step::Fragment) {
                out.push(line);
            }
            if end {
                return out;
            }
        }
    }

    fn transcript(bytes: &[u8], size: usize, max: usize) -> Vec<String> {
        transcript_with(bytes, size, max, &mut BufferPool::default(), false)
    }

    /// The transcript of `bytes`, checked to be the same for every read size, with and without
    /// parking between steps.
    fn all_chunkings(bytes: &[u8], max: usize) -> Vec<String> {
        let whole = transcript(bytes, usize::MAX, max);
        let mut pool = BufferPool::default();
        for size in [1, 2, 3, 7, 13, 200, usize::MAX] {
            assert_eq!(transcript(bytes, size, max), whole, "reads of {size}");
            let parking = transcript_with(bytes, size, max, &mut pool, true);
            assert_eq!(parking, whole, "reads of {size}, parking");
        }
        assert!(pool.free_buffers() <= POOL_BUFFERS_MAX);
        whole
    }

    #[test]
    fn whole_and_fragmented_text_with_control_frames_between() {
        let mut bytes = frame(true, OPCODE_TEXT, b"{\"a\":1}");
        bytes.extend(frame(false, OPCODE_TEXT, "h\u{e9}".as_bytes()));
        bytes.extend(frame(true, OPCODE_PING, b"p"));
        // The split falls inside a two-byte character.
        bytes.extend(frame(false, OPCODE_CONTINUATION, &[b'l', 0xC3]));
        bytes.extend(frame(true, OPCODE_CONTINUATION, &[0xA9, b'!']));
        bytes.extend(frame(true, OPCODE_PONG, b""));
        bytes.extend(frame(true, OPCODE_CLOSE, &[0x03, 0xE8, b'o', b'k']));
        assert_eq!(
            all_chunkings(&bytes, 1 << 20),
            [
                "text {\"a\":1}",
                "ping p",
                "text h\u{e9}l\u{e9}!",
                "pong ",
                "close Some(1000)"
            ]
        );
    }

    #[test]
    fn every_length_form_and_a_frame_larger_than_the_buffer() {
        for n in [0, 125, 126, 65_535, 65_536, 3 * READ_BUFFER_BYTES + 5] {
            let text = "x".repeat(n);
            let mut bytes = frame(true, OPCODE_TEXT, text.as_bytes());
            bytes.extend(frame(true, OPCODE_TEXT, b"after"));
            let got = transcript(&bytes, 4096, 1 << 20);
            assert_eq!(got[0], format!("text {text}"), "length {n}");
            assert_eq!(got[1], "text after");
            assert_eq!(got[2], "eof");
        }
    }

    #[test]
    fn the_buffer_shrinks_back_after_a_large_frame() {
        let mut pool = BufferPool::default();
        let big = "y".repeat(200_000);
        let mut src = waiting(frame(true, OPCODE_TEXT, big.as_bytes()));
        let mut reader = FrameReader::new(1 << 20, &[]);
        assert!(
            matches!(reader.read_from(&mut src, &mut pool), Step::Text(t) if t.len() == 200_000)
        );
        assert!(reader.capacity() > 200_000);
        src.data.extend(frame(true, OPCODE_TEXT, b"small"));
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            "text small"
        );
        assert_eq!(reader.capacity(), READ_BUFFER_BYTES);
    }

    #[test]
    fn an_announced_length_reserves_nothing_until_its_bytes_arrive() {
        let mut pool = BufferPool::default();
        let mut header = vec![0x81, 0x80 | 127];
        header.extend_from_slice(&(16u64 << 20).to_be_bytes());
        header.extend_from_slice(&[1, 2, 3, 4]);
        header.extend_from_slice(&[b'x'; 100]);
        let mut src = waiting(header);
        let mut reader = FrameReader::new(16 << 20, &[]);
        // Many turns, a few bytes each: the buffer only grows once it is full.
        for _ in 0..100 {
            assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
            src.data.extend([b'x'; 10]);
        }
        assert_eq!(reader.capacity(), READ_BUFFER_BYTES);
        // Filling the buffer doubles it, no more.
        src.data
            .extend(std::iter::repeat_n(b'x', READ_BUFFER_BYTES));
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
        assert_eq!(reader.capacity(), 2 * READ_BUFFER_BYTES);
    }

    #[test]
    fn early_bytes_are_read_first() {
        let mut pool = BufferPool::default();
        let early = frame(true, OPCODE_TEXT, b"early");
        let mut src = waiting(frame(true, OPCODE_TEXT, b"later"));
        let mut reader = FrameReader::new(1024, &early);
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            "text early"
        );
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            "text later"
        );
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
    }

    #[test]
    fn a_reader_parks_a_frame_cut_short_and_keeps_its_buffer_for_more() {
        let mut pool = BufferPool::default();
        let first = frame(true, OPCODE_TEXT, b"one");
        let second = frame(true, OPCODE_TEXT, &[b'x'; 300]);
        let mut bytes = first.clone();
        bytes.extend_from_slice(&second[..100]);
        let mut src = waiting(bytes);
        let mut reader = FrameReader::new(1 << 20, &[]);
        assert!(
            !reader.holds_buffer(),
            "a new reader takes no buffer until it reads"
        );
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "text one");
        assert!(reader.holds_buffer());
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
        // 100 bytes of the second frame are left: set aside, the buffer goes back.
        reader.park(&mut pool);
        assert!(!reader.holds_buffer());
        assert_eq!(reader.buffered(), 100);
        assert_eq!(pool.free_buffers(), 1);
        assert!(
            reader.capacity() < PARKED_BYTES_MAX + 512,
            "{}",
            reader.capacity()
        );
        src.data.extend(second[100..].iter().copied());
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            format!("text {}", "x".repeat(300))
        );
        assert_eq!(
            pool.free_buffers(),
            0,
            "the reader took the pooled buffer back"
        );
        // More than `PARKED_BYTES_MAX` unparsed (a round's budget ran out): the buffer stays.
        let many: Vec<u8> = (0..20).flat_map(|_| second.clone()).collect();
        src.data.extend(many);
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            format!("text {}", "x".repeat(300))
        );
        assert!(reader.buffered() > PARKED_BYTES_MAX);
        reader.park(&mut pool);
        assert!(reader.holds_buffer());
        assert_eq!(pool.free_buffers(), 0);
        for _ in 0..19 {
            assert!(
                matches!(reader.read_from(&mut src, &mut pool), Step::Text(t) if t.len() == 300)
            );
        }
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
        reader.park(&mut pool);
        assert!(!reader.holds_buffer());
        assert_eq!(reader.buffered(), 0);
    }

    #[test]
    fn early_bytes_wait_parked_until_the_first_read() {
        let mut pool = BufferPool::default();
        let early = frame(true, OPCODE_TEXT, b"early");
        let mut src = waiting(Vec::new());
        let mut reader = FrameReader::new(1024, &early);
        assert_eq!(reader.buffered(), early.len());
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            "text early"
        );
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
    }

    #[test]
    fn the_pool_reuses_the_last_buffer_and_keeps_a_few_standard_ones() {
        let mut pool = BufferPool::default();
        let mut readers: Vec<FrameReader> = (0..POOL_BUFFERS_MAX + 4)
            .map(|_| FrameReader::new(1 << 20, &[]))
            .collect();
        for reader in &mut readers {
            assert!(matches!(
                reader.read_from(&mut waiting([]), &mut pool),
                Step::Drained
            ));
        }
        for reader in &mut readers {
            reader.park(&mut pool);
        }
        assert_eq!(pool.free_buffers(), POOL_BUFFERS_MAX);
        // The buffer a reader gives back is the next one lent (warm in cache).
        let mut a = FrameReader::new(1 << 20, &[]);
        assert!(matches!(
            a.read_from(&mut waiting([]), &mut pool),
            Step::Drained
        ));
        let lent = a.buf.as_ptr();
        a.park(&mut pool);
        let mut b = FrameReader::new(1 << 20, &[]);
        assert!(matches!(
            b.read_from(&mut waiting([]), &mut pool),
            Step::Drained
        ));
        assert_eq!(b.buf.as_ptr(), lent);
        // A buffer grown for a large frame is freed, not pooled.
        let big = "y".repeat(100_000);
        let mut src = waiting(frame(true, OPCODE_TEXT, big.as_bytes()));
        assert!(matches!(b.read_from(&mut src, &mut pool), Step::Text(t) if t.len() == 100_000));
        let free = pool.free_buffers();
        b.park(&mut pool);
        assert!(!b.holds_buffer());
        assert_eq!(pool.free_buffers(), free);
    }

    #[test]
    fn fragments_are_charged_to_the_shared_budget_and_the_one_that_crosses_it_fails() {
        let mut pool = BufferPool::default();
        let budget = PartialBudget::new(3000);
        let mut a = FrameReader::sharing(4000, &[], budget.clone());
        let mut b = FrameReader::sharing(4000, &[], budget.clone());
        let mut a_src = waiting(frame(false, OPCODE_TEXT, &[b'a'; 1000]));
        a_src
            .data
            .extend(frame(false, OPCODE_CONTINUATION, &[b'a'; 1000]));
        assert_eq!(describe(&a.read_from(&mut a_src, &mut pool)), "fragment");
        assert_eq!(describe(&a.read_from(&mut a_src, &mut pool)), "fragment");
        assert_eq!(budget.held(), 2000, "a holds its two fragments");
        // b's first fragment would take the total to 3500: b fails, a is untouched.
        let mut b_src = waiting(frame(false, OPCODE_TEXT, &[b'b'; 1500]));
        assert_eq!(describe(&b.read_from(&mut b_src, &mut pool)), "fail 1013");
        assert_eq!(budget.held(), 2000);
        drop(b);
        a_src.data.extend(frame(true, OPCODE_CONTINUATION, b"!"));
        let text = describe(&a.read_from(&mut a_src, &mut pool));
        assert_eq!(text, format!("text {}!", "a".repeat(2000)));
        // Delivered: the next step frees the assembly buffer and its charge.
        assert_eq!(describe(&a.read_from(&mut a_src, &mut pool)), "drained");
        assert_eq!(budget.held(), 0);
        a.park(&mut pool);
        // Room again for what b was refused.
        let mut c = FrameReader::sharing(4000, &[], budget.clone());
        let mut c_src = waiting(frame(false, OPCODE_TEXT, &[b'c'; 1500]));
        assert_eq!(describe(&c.read_from(&mut c_src, &mut pool)), "fragment");
        assert_eq!(budget.held(), 1500);
        drop(c);
        assert_eq!(budget.held(), 0, "a dropped reader gives its charge back");
    }

    #[test]
    fn a_large_frame_is_charged_while_it_arrives_and_released_after() {
        let mut pool = BufferPool::default();
        let max = 4 * READ_BUFFER_BYTES;
        let budget = PartialBudget::new(2 * READ_BUFFER_BYTES);
        let mut reader = FrameReader::sharing(max, &[], budget.clone());
        let big = frame(true, OPCODE_TEXT, &vec![b'x'; 3 * READ_BUFFER_BYTES]);
        // Half of it: the buffer doubles once, charged beyond its standard size.
        let mut src = waiting(big[..READ_BUFFER_BYTES + 100].iter().copied());
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
        assert_eq!(budget.held(), READ_BUFFER_BYTES);
        reader.park(&mut pool);
        assert!(reader.holds_buffer(), "mid-frame, the grown buffer stays");
        // The rest needs the buffer at 3x + header: past the budget of 2x, so it fails.
        src.data
            .extend(big[READ_BUFFER_BYTES + 100..].iter().copied());
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            "fail 1013"
        );
        drop(reader);
        assert_eq!(budget.held(), 0);
        // Under a budget that holds it, the same frame arrives, and its charge goes once the
        // reader is parked.
        let budget = PartialBudget::new(4 * READ_BUFFER_BYTES);
        let mut reader = FrameReader::sharing(max, &[], budget.clone());
        let mut src = waiting(big.iter().copied());
        assert!(matches!(
            reader.read_from(&mut src, &mut pool),
            Step::Text(t) if t.len() == 3 * READ_BUFFER_BYTES
        ));
        assert!(budget.held() > 2 * READ_BUFFER_BYTES);
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
        reader.park(&mut pool);
        assert_eq!(budget.held(), 0);
    }

    #[test]
    fn violations_close_with_their_codes() {
        let max = 1000;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (raw_frame(0x81, false, b"unmasked"), "fail 1002"),
            (raw_frame(0xC1, true, b"rsv1"), "fail 1002"),
            (raw_frame(0x83, true, b"reserved opcode"), "fail 1002"),
            (raw_frame(0x8B, true, b""), "fail 1002"),
            (frame(true, OPCODE_BINARY, b"bin"), "fail 1003"),
            (frame(true, OPCODE_CONTINUATION, b"orphan"), "fail 1002"),
            (frame(false, OPCODE_PING, b""), "fail 1002"),
            (frame(true, OPCODE_PING, &[b'p'; 126]), "fail 1002"),
            (frame(true, OPCODE_TEXT, &[0xFF]), "fail 1007"),
            (frame(true, OPCODE_TEXT, &[b'x'; 1001]), "fail 1009"),
            (frame(true, OPCODE_CLOSE, &[0x03]), "fail 1002"),
            (frame(true, OPCODE_CLOSE, &[0x03, 0xE8, 0xFF]), "fail 1007"),
            (frame(true, OPCODE_CLOSE, &[0x03, 0xED]), "close Some(1002)"),
            (frame(true, OPCODE_CLOSE, &[0x0B, 0xB8]), "close Some(3000)"),
            (frame(true, OPCODE_CLOSE, b""), "close None"),
        ];
        for (bytes, want) in cases {
            assert_eq!(all_chunkings(&bytes, max), [want], "{bytes:02x?}");
        }
        // Fragments: a text frame inside a fragmented message, a binary start, a message that
        // grows past the limit, and invalid UTF-8 noticed before the last fragment.
        let mut interleaved = frame(false, OPCODE_TEXT, b"a");
        interleaved.extend(frame(true, OPCODE_TEXT, b"b"));
        assert_eq!(all_chunkings(&interleaved, max), ["fail 1002"]);
        let mut long = frame(false, OPCODE_TEXT, &[b'x'; 600]);
        long.extend(frame(true, OPCODE_CONTINUATION, &[b'x'; 401]));
        assert_eq!(all_chunkings(&long, max), ["fail 1009"]);
        let mut broken = frame(false, OPCODE_TEXT, &[b'x', 0xC0, 0xAF]);
        broken.extend(frame(false, OPCODE_CONTINUATION, b"never read"));
        assert_eq!(all_chunkings(&broken[..9], max), ["fail 1007"]);
        // A cut character at the end of the last fragment is invalid, not pending.
        assert_eq!(
            all_chunkings(&frame(true, OPCODE_TEXT, &[b'x', 0xC3]), max),
            ["fail 1007"]
        );
    }

    #[test]
    fn an_oversized_header_is_refused_before_its_payload() {
        let mut header = vec![0x81, 0x80 | 127];
        header.extend_from_slice(&(1u64 << 40).to_be_bytes());
        header.extend_from_slice(&[1, 2, 3, 4]);
        assert_eq!(all_chunkings(&header, 1 << 20), ["fail 1009"]);
    }

    #[test]
    fn a_partial_frame_waits_and_eof_ends_it() {
        let mut pool = BufferPool::default();
        let bytes = frame(true, OPCODE_TEXT, b"incomplete");
        let mut src = waiting(bytes[..8].iter().copied());
        let mut reader = FrameReader::new(1024, &[]);
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
        assert_eq!(reader.buffered(), 8);
        src.data.extend(&bytes[8..]);
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            "text incomplete"
        );
        src.eof = true;
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "eof");
    }

    #[test]
    fn nothing_is_parsed_after_a_close_or_a_violation() {
        let mut pool = BufferPool::default();
        let mut bytes = frame(true, OPCODE_CLOSE, b"");
        bytes.extend(frame(true, OPCODE_TEXT, b"after close"));
        let mut src = waiting(bytes);
        let mut reader = FrameReader::new(1024, &[]);
        assert_eq!(
            describe(&reader.read_from(&mut src, &mut pool)),
            "close None"
        );
        assert!(matches!(
            reader.read_from(&mut src, &mut pool),
            Step::Fail(_)
        ));
    }

    #[test]
    fn every_fragment_is_a_step_so_the_turn_budget_sees_it() {
        let mut pool = BufferPool::default();
        let mut bytes = frame(false, OPCODE_TEXT, b"a");
        for _ in 0..1000 {
            bytes.extend(frame(false, OPCODE_CONTINUATION, b""));
        }
        bytes.extend(frame(true, OPCODE_CONTINUATION, b"b"));
        let mut src = waiting(bytes);
        let mut reader = FrameReader::new(1024, &[]);
        for _ in 0..1001 {
            assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "fragment");
        }
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "text ab");
    }

    #[test]
    fn unmask_matches_the_bytewise_definition() {
        let key = [1, 2, 3, 250];
        let slow = |data: &[u8]| -> Vec<u8> {
            data.iter()
                .enumerate()
                .map(|(i, b)| b ^ key[i % 4])
                .collect()
        };
        for n in 0..100 {
            let data: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
            let mut fast = data.clone();
            let ascii = unmask(&mut fast, key);
            assert_eq!(fast, slow(&data));
            assert_eq!(ascii, fast.is_ascii(), "length {n}");
            // ASCII text, then one byte at or over 0x80 at each position in turn: the flag
            // must see it in the eight-byte words and in the remainder alike.
            let text: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
            let masked = slow(&text);
            let mut plain = masked.clone();
            assert!(unmask(&mut plain, key), "length {n}");
            assert_eq!(plain, text);
            for at in 0..n {
                for high in [0x80u8, 0xc3, 0xff] {
                    let mut t = text.clone();
                    t[at] = high;
                    let mut m = slow(&t);
                    assert!(!unmask(&mut m, key), "length {n}, 0x{high:02x} at {at}");
                    assert_eq!(m, t);
                }
            }
        }
    }

    #[test]
    fn ascii_and_multibyte_text_frames_alike_reach_the_core() {
        let mut pool = BufferPool::default();
        // The ASCII path skips `from_utf8`; the other path keeps it, and still refuses bad bytes.
        for (payload, expect) in [
            (
                "plain ascii {\"a\":1}".as_bytes(),
                "text plain ascii {\"a\":1}".to_owned(),
            ),
            (
                "caf\u{e9} \u{1f600}".as_bytes(),
                "text caf\u{e9} \u{1f600}".to_owned(),
            ),
            (&[b'a', 0xff, b'b'][..], "fail 1007".to_owned()),
        ] {
            let mut reader = FrameReader::new(1 << 20, &[]);
            let mut src = waiting(frame(true, OPCODE_TEXT, payload));
            assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), expect);
        }
    }
}
