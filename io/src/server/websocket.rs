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
//!
//! The reader's parts: frame parsing here (headers, unmasking, control frames), fragmented
//! messages assembled in `assembly`, the read buffers and the shared partial-message budget in
//! `memory`, and the frames the server writes in `encode`.

mod assembly;
mod encode;
mod memory;
#[cfg(test)]
mod tests;

use std::io::{self, Read};
use std::rc::Rc;

use assembly::Fragmented;
pub use encode::{encode_answer, encode_frame};
pub use memory::{BufferPool, PartialBudget};

/// A read buffer. Lent to a connection while it reads (see [`BufferPool`]); a larger frame grows
/// the one it was lent (doubling as its bytes arrive) for as long as it takes to read.
pub const READ_BUFFER_BYTES: usize = 16 * 1024;

/// Most unparsed bytes a reader keeps by itself between reads (a frame cut by the end of the last
/// read); with more, it keeps its buffer.
pub const PARKED_BYTES_MAX: usize = 1024;

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
