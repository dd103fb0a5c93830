//! A connection's socket with its buffering: an outbound buffer the driver drains into it, the
//! ledger that turns bytes that reached the socket into `Input::Flushed` counts, and a `Read`
//! that skips the syscall a short read already answered.
//!
//! The frame reader (`super::websocket`) reads the peer's bytes through [`BufferedSocket`]'s
//! `Read`. Everything the host sends goes through the outbound buffer, in stream order: the HTTP
//! response, the text frames the core emits, keepalive pings, pongs and close frames (all
//! encoded here). Because one buffer carries everything, the driver
//! knows the exact stream offset at which each core frame ends, and reports a frame flushed once
//! every byte up to that offset was accepted by the socket: never early, never twice.

use std::collections::VecDeque;
use std::io::{self, Read, Write};

use mio::net::TcpStream;

/// Bytes of already-sent buffer worth moving to reclaim (below this the prefix just waits).
const COMPACT_BYTES_MIN: usize = 64 * 1024;

/// Capacity kept by a drained buffer; a burst larger than this is given back to the allocator.
const IDLE_CAPACITY_BYTES_MAX: usize = 256 * 1024;

use super::websocket::{encode_answer, encode_frame, Step, OPCODE_CLOSE, OPCODE_PING, OPCODE_TEXT};

/// A close reason must fit a control frame: 125 bytes minus the 2-byte code.
const CLOSE_REASON_BYTES_MAX: usize = 123;

/// A connection's socket plus everything waiting to be written to it.
#[derive(Debug)]
pub(crate) struct BufferedSocket {
    pub(crate) tcp: TcpStream,
    /// Outbound bytes; `out[head..]` is not yet written. Invariant: `head <= out.len()`.
    out: Vec<u8>,
    head: usize,
    /// Bytes ever appended to `out`, and bytes ever written to the socket: stream offsets.
    /// Invariant: `sent <= appended` and `appended - sent == out.len() - head`.
    appended: u64,
    sent: u64,
    /// Core frames not yet reported flushed: (stream offset just past the frame, payload bytes,
    /// encoded bytes), in stream order.
    ledger: VecDeque<(u64, u64, u64)>,
    /// Encoded bytes of the frames in `ledger`, so the driver can tell the bytes the core
    /// accounts for from its own (the HTTP response, pings, pongs, close frames).
    ledger_bytes: u64,
    /// The last read this round returned less than it asked for, so the socket was empty then.
    drained: bool,
    /// The peer's FIN (or an error) was reported: no later event will come, so reads go on
    /// until the socket itself says 0 or `WouldBlock`.
    read_closed: bool,
}

impl BufferedSocket {
    pub(crate) fn new(tcp: TcpStream) -> BufferedSocket {
        BufferedSocket {
            tcp,
            out: Vec::new(),
            head: 0,
            appended: 0,
            sent: 0,
            ledger: VecDeque::new(),
            ledger_bytes: 0,
            drained: false,
            read_closed: false,
        }
    }

    /// Bytes the kernel holds for this socket that no read has taken yet (`FIONREAD`), or
    /// `None` if it cannot tell. Read coalescing adapts its gap to it (`super::coalesce`).
    #[cfg(unix)]
    pub(crate) fn queued_input(&self) -> Option<usize> {
        use std::os::fd::AsRawFd;
        let mut queued: libc::c_int = 0;
        // SAFETY: FIONREAD stores one c_int through the pointer, which is valid and exclusive
        // for the duration of the call; the descriptor is this value's open socket.
        let rc = unsafe { libc::ioctl(self.tcp.as_raw_fd(), libc::FIONREAD, &mut queued) };
        if rc == 0 {
            usize::try_from(queued).ok()
        } else {
            None
        }
    }

    #[cfg(not(unix))]
    pub(crate) fn queued_input(&self) -> Option<usize> {
        None
    }

    /// Bytes waiting for the socket.
    pub(crate) fn pending_bytes(&self) -> u64 {
        debug_assert_eq!(
            self.appended - self.sent,
            (self.out.len() - self.head) as u64
        );
        self.appended - self.sent
    }

    /// Appends bytes that are not a core frame (an HTTP response).
    pub(crate) fn push_raw(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        self.appended += bytes.len() as u64;
    }

    /// Appends one core frame as a WebSocket text message and records where it ends.
    pub(crate) fn push_text(&mut self, payload: &[u8]) {
        let before = self.appended;
        encode_frame(&mut self.out, OPCODE_TEXT, payload);
        self.appended = self.sent + (self.out.len() - self.head) as u64;
        let encoded = self.appended - before;
        self.ledger
            .push_back((self.appended, payload.len() as u64, encoded));
        self.ledger_bytes += encoded;
    }

    /// Unsent bytes the driver itself added (HTTP response, pings, pongs, close frames), as
    /// opposed to core frames, whose bytes the core bounds. Exact after
    /// [`BufferedSocket::settle`].
    pub(crate) fn own_pending_bytes(&self) -> u64 {
        // Only the first unsettled core frame can be partly written.
        let core_unsent = match self.ledger.front() {
            Some(&(end, _, encoded)) => {
                let written = self.sent.saturating_sub(end - encoded).min(encoded);
                self.ledger_bytes - written
            }
            None => 0,
        };
        self.pending_bytes().saturating_sub(core_unsent)
    }

    /// Appends an empty ping (keepalive); the reader reports its pong.
    pub(crate) fn push_ping(&mut self) {
        encode_frame(&mut self.out, OPCODE_PING, &[]);
        self.appended = self.sent + (self.out.len() - self.head) as u64;
    }

    /// Appends what a step the reader returned must be answered with (a pong for a ping, the
    /// reply to a close frame), if anything.
    pub(crate) fn push_answer(&mut self, step: &Step<'_>) {
        encode_answer(&mut self.out, step);
        self.appended = self.sent + (self.out.len() - self.head) as u64;
    }

    /// Appends a close frame with `code` and `reason` (cut to fit a control frame).
    pub(crate) fn push_close(&mut self, code: u16, reason: &str) {
        let mut cut = reason.len().min(CLOSE_REASON_BYTES_MAX);
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        let mut payload = Vec::with_capacity(2 + cut);
        payload.extend_from_slice(&code.to_be_bytes());
        payload.extend_from_slice(&reason.as_bytes()[..cut]);
        encode_frame(&mut self.out, OPCODE_CLOSE, &payload);
        self.appended = self.sent + (self.out.len() - self.head) as u64;
    }

    /// Writes buffered bytes until the buffer is empty (`Ok(true)`) or the socket would block
    /// (`Ok(false)`). Any other error means the connection is broken.
    pub(crate) fn send(&mut self) -> io::Result<bool> {
        while self.head < self.out.len() {
            match self.tcp.write(&self.out[self.head..]) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    self.head += n;
                    self.sent += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        self.compact();
        debug_assert!(
            self.sent <= self.appended,
            "sent {} past appended {}",
            self.sent,
            self.appended
        );
        Ok(self.head == self.out.len())
    }

    /// Payload bytes of core frames that reached the socket since the last call.
    pub(crate) fn settle(&mut self) -> u64 {
        let mut bytes = 0;
        while let Some(&(end, len, encoded)) = self.ledger.front() {
            if end > self.sent {
                break;
            }
            bytes += len;
            self.ledger_bytes -= encoded;
            self.ledger.pop_front();
        }
        bytes
    }

    fn compact(&mut self) {
        if self.head == self.out.len() {
            self.out.clear();
            self.head = 0;
            if self.out.capacity() > IDLE_CAPACITY_BYTES_MAX {
                self.out.shrink_to(IDLE_CAPACITY_BYTES_MAX);
            }
        } else if self.head >= COMPACT_BYTES_MIN && self.head * 2 >= self.out.len() {
            self.out.drain(..self.head);
            self.head = 0;
        }
    }
}

impl BufferedSocket {
    /// Called before each read round of this connection (a loop turn has one or more,
    /// `read_rounds`): the next read goes to the socket.
    pub(crate) fn start_read_round(&mut self) {
        self.drained = false;
    }

    /// The poller reported the peer's FIN or an error. That edge was consumed by the wait that
    /// started this turn, so a short read must no longer end its reads: the EOF may already sit
    /// behind the last bytes, and nothing would ever report it again.
    pub(crate) fn mark_read_closed(&mut self) {
        self.read_closed = true;
    }
}

/// The frame reader reads the peer's bytes straight from the socket.
///
/// Sockets are edge-triggered, so a connection is read until `WouldBlock` (over one or more read
/// rounds). A read that returned less than it asked for has already emptied the socket, and
/// bytes that arrive later raise a new readiness event (which the next turn reads), so the next
/// read of the same round answers `WouldBlock` without the syscall that would only say so.
/// Under light load that is one `recvfrom` of the four syscalls a relayed message costs
/// (measured with the load tool).
/// The one exception is a socket whose FIN was already reported (`mark_read_closed`): its
/// EOF raises no new event, so it is read until the socket says so.
impl Read for BufferedSocket {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if std::mem::take(&mut self.drained) {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let n = self.tcp.read(buf)?;
        self.drained = !self.read_closed && n > 0 && n < buf.len();
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::websocket::OPCODE_TEXT;

    fn frame(opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_frame(&mut out, opcode, payload);
        out
    }

    #[test]
    fn frames_use_the_shortest_length_form() {
        assert_eq!(frame(OPCODE_TEXT, b"hi"), vec![0x81, 2, b'h', b'i']);
        let f = frame(OPCODE_TEXT, &[b'x'; 125]);
        assert_eq!(&f[..2], &[0x81, 125]);
        let f = frame(OPCODE_TEXT, &[b'x'; 126]);
        assert_eq!(&f[..4], &[0x81, 126, 0, 126]);
        assert_eq!(f.len(), 4 + 126);
        let f = frame(OPCODE_TEXT, &[b'x'; 65_536]);
        assert_eq!(&f[..10], &[0x81, 127, 0, 0, 0, 0, 0, 1, 0, 0]);
        assert_eq!(f.len(), 10 + 65_536);
    }

    /// A connected pair on loopback: the server side as a mio stream, the client side blocking.
    fn pair() -> (BufferedSocket, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let client =
            std::net::TcpStream::connect(listener.local_addr().expect("addr")).expect("connect");
        let (server, _) = listener.accept().expect("accept");
        server.set_nonblocking(true).expect("nonblocking");
        (BufferedSocket::new(TcpStream::from_std(server)), client)
    }

    /// Reads until bytes arrive (the socket is non-blocking).
    fn read_some(socket: &mut BufferedSocket, buf: &mut [u8]) -> usize {
        for _ in 0..1000 {
            match socket.read(buf) {
                Ok(n) => return n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    socket.start_read_round();
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(e) => panic!("read: {e}"),
            }
        }
        panic!("nothing arrived");
    }

    #[cfg(unix)]
    #[test]
    fn queued_input_counts_what_arrived_and_was_not_read() {
        let (mut socket, mut client) = pair();
        assert_eq!(socket.queued_input(), Some(0));
        client.write_all(&[7u8; 3000]).expect("write");
        // Loopback delivers at once, but give the kernel a moment on a loaded machine.
        for _ in 0..1000 {
            if socket.queued_input() == Some(3000) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(socket.queued_input(), Some(3000));
        let mut buf = [0u8; 1000];
        socket.start_read_round();
        assert_eq!(read_some(&mut socket, &mut buf), 1000);
        assert_eq!(socket.queued_input(), Some(2000));
    }

    #[test]
    fn a_short_read_ends_the_turn_and_a_new_turn_reads_again() {
        let (mut socket, mut client) = pair();
        client.write_all(b"0123456789").expect("write");
        let mut buf = [0u8; 64];
        socket.start_read_round();
        assert_eq!(read_some(&mut socket, &mut buf), 10);
        // The socket was emptied by that short read: no syscall needed to learn it.
        let e = socket.read(&mut buf).expect_err("drained");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // Bytes that arrive later start a new turn (a readiness event) and are read.
        client.write_all(b"abc").expect("write");
        socket.start_read_round();
        assert_eq!(read_some(&mut socket, &mut buf), 3);
        assert_eq!(&buf[..3], b"abc");
        // A full read may have left more: the next read asks the socket.
        client.write_all(&[7u8; 100]).expect("write");
        socket.start_read_round();
        let mut small = [0u8; 40];
        let mut got = read_some(&mut socket, &mut small);
        assert_eq!(got, 40);
        while got < 100 {
            got += read_some(&mut socket, &mut small);
        }
        assert_eq!(got, 100);
    }

    #[test]
    fn after_the_fin_was_reported_a_short_read_does_not_hide_the_eof() {
        let (mut socket, mut client) = pair();
        client.write_all(b"last frame").expect("write");
        client
            .shutdown(std::net::Shutdown::Write)
            .expect("shutdown");
        // Wait until both the bytes and the FIN are queued, as when one event reports both.
        std::thread::sleep(std::time::Duration::from_millis(50));
        socket.start_read_round();
        socket.mark_read_closed();
        let mut buf = [0u8; 64];
        assert_eq!(read_some(&mut socket, &mut buf), 10);
        assert_eq!(socket.read(&mut buf).expect("eof, not WouldBlock"), 0);
    }

    #[test]
    fn close_frames_carry_code_and_a_cut_reason() {
        let (mut socket, mut client) = pair();
        socket.push_close(1003, "JSON text frames required");
        socket.push_close(1000, &"é".repeat(100));
        assert!(socket.send().expect("send"));
        assert_eq!(socket.settle(), 0, "close frames are not core frames");
        let mut buf = vec![0u8; 2 + 2 + 25 + 2 + 2 + 122];
        client.read_exact(&mut buf).expect("read");
        assert_eq!(&buf[..4], &[0x88, 27, 0x03, 0xEB]);
        assert_eq!(&buf[4..29], b"JSON text frames required");
        assert_eq!(
            &buf[29..33],
            &[0x88, 124, 0x03, 0xE8],
            "reason cut to 122 bytes at a char boundary"
        );
    }

    #[test]
    fn ledger_reports_each_frame_once_after_its_last_byte() {
        let (mut socket, mut client) = pair();
        socket.push_raw(b"HTTP/1.1 101 Switching Protocols\r\n\r\n");
        socket.push_text(b"{\"a\":1}");
        socket.push_answer(&Step::Ping(b""));
        socket.push_text(b"{\"b\":2}");
        assert_eq!(socket.settle(), 0, "nothing reached the socket yet");
        let total = socket.pending_bytes();
        assert!(socket.send().expect("send"));
        assert_eq!(socket.pending_bytes(), 0);
        assert_eq!(socket.settle(), 14);
        assert_eq!(socket.settle(), 0, "never twice");
        let mut buf = vec![0u8; total as usize];
        client.read_exact(&mut buf).expect("read");
        assert!(buf.ends_with(&[0x8A, 0, 0x81, 7, b'{', b'"', b'b', b'"', b':', b'2', b'}']));
    }

    #[test]
    fn own_bytes_exclude_core_frames_even_when_one_is_half_written() {
        let (mut socket, client) = pair();
        socket.push_raw(b"HTTP/1.1 101 Switching Protocols\r\n\r\n");
        let head = socket.pending_bytes();
        let payload = vec![b'x'; 1 << 20];
        for _ in 0..16 {
            socket.push_text(&payload);
        }
        socket.push_answer(&Step::Ping(b"p"));
        // 16 MiB of core frames and 3 bytes of pong ride behind the head.
        assert_eq!(socket.own_pending_bytes(), head + 3);
        assert!(
            !socket.send().expect("send"),
            "16 MiB cannot fit in socket buffers"
        );
        socket.settle();
        assert!(socket.sent > head, "some of the first frame went out");
        assert_eq!(
            socket.own_pending_bytes(),
            3,
            "the head went out, the pong did not"
        );
        drop(client);
    }

    #[test]
    fn a_blocked_socket_reports_only_whole_frames() {
        let (mut socket, client) = pair();
        let payload = vec![b'x'; 1 << 20];
        let mut frames = 0u64;
        // Far more than loopback buffers hold while the client reads nothing.
        while frames < 64 {
            socket.push_text(&payload);
            frames += 1;
        }
        let drained = socket.send().expect("send");
        assert!(!drained, "64 MiB cannot fit in socket buffers");
        let reported = socket.settle();
        assert_eq!(reported % (1 << 20), 0, "only whole frames are reported");
        let written_frames = socket.sent / ((1 << 20) + 10);
        assert_eq!(reported, written_frames * (1 << 20));
        assert!(reported < frames * (1 << 20));
        drop(client);
    }
}
