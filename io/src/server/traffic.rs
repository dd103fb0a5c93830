//! WebSocket traffic: an open connection's messages read into the core a read round at a time,
//! the core's decisions carried out (frames into buffers, closes, commits to the writer),
//! buffered bytes written and what reached the socket reported, and closing. The per-message
//! path (`read_messages`, `FrameReader::read_from`, `Host::handle`, `drain_outputs`) stays in
//! this one module.

use std::io::{self, Read};
use std::net::Shutdown;

use axhost_core::{ConnId, Input, Now, Output, Store};
use mio::{Interest, Token};

use super::slots::Phase;
use super::websocket::Step;
use super::{Driver, FILLED_SHARE_SAMPLES_MAX, MESSAGES_PER_READ_MAX};

/// Reads of discarded bytes per read round for a connection that is closing.
const DISCARD_READS_PER_ROUND_MAX: usize = 16;

/// Cap on one WebSocket's unsent bytes that the driver added itself (pongs, keepalive pings,
/// the close frame), which the core does not count. Core frames are not counted here: the core
/// bounds them (`queue_bytes_hard`, plus one reply it deliberately lets exceed that so a large
/// snapshot or replay reaches a reader that keeps up). A peer that sends pings and never reads
/// their pongs reaches this; an honest one never queues more than a few frames of its own.
const OWN_BYTES_MAX: u64 = 1 << 20;

impl<S: Store> Driver<S> {
    /// Reads what connection `id` has for this read round; returns its share of the round as
    /// `read_rounds` counts it.
    pub(super) fn on_readable(&mut self, id: u64) -> usize {
        let Some(slot) = self.slots.get_mut(&id) else {
            return 0;
        };
        if let Some(socket) = slot.socket_mut() {
            socket.start_read_round();
        }
        match slot.phase {
            Phase::Head { .. } => {
                self.read_head(id);
                0
            }
            Phase::Open { .. } => self.read_messages(id),
            Phase::Closing { .. } => {
                // Discarding counts as a full share: a closing peer that keeps sending earns no
                // extra rounds.
                self.read_discard(id);
                MESSAGES_PER_READ_MAX
            }
            Phase::Moving => 0,
        }
    }

    /// Reads up to a read round's worth of WebSocket messages (`MESSAGES_PER_READ_MAX`) and
    /// feeds the core, carrying out the core's decisions after each one; returns the steps taken
    /// (frames, pings and fragments included, so a flood of control frames earns no extra read
    /// rounds). Doing that at once, rather than after the whole turn, frees each forwarded frame
    /// right after it is copied into its socket's buffer, while it is still in cache, and keeps
    /// the allocator recycling one buffer instead of holding a turn's worth (a batch of
    /// allocations and then a batch of frees took `malloc` off its fast path: 10% of the host at
    /// 64->64).
    fn read_messages(&mut self, id: u64) -> usize {
        let now = self.clock.now();
        let conn = ConnId(id);
        let mut heard = false;
        let mut stop = Stop::Budget;
        let mut steps = 0;
        for _ in 0..MESSAGES_PER_READ_MAX {
            if !self.input_open() {
                // Backpressure: the rest stays in the socket (and the reader's buffer) until
                // the writer catches up (`input_gate`).
                stop = Stop::Paused;
                break;
            }
            let Some(slot) = self.slots.get_mut(&id) else {
                return steps;
            };
            let Phase::Open { socket, reader, .. } = &mut slot.phase else {
                // The core closed it while handling the last message.
                return steps;
            };
            steps += 1;
            let step = reader.read_from(socket, &mut self.read_buffers);
            socket.push_answer(&step);
            match step {
                Step::Text(text) => {
                    heard = true;
                    self.host.handle(now, Input::Message { conn, text });
                    self.drain_outputs(now);
                }
                Step::Ping(_) => {
                    heard = true;
                    self.mark_dirty(id);
                }
                Step::Pong(_) | Step::Fragment => heard = true,
                Step::Close(code) => {
                    heard = true;
                    stop = Stop::PeerClosed(code.unwrap_or(1005));
                    break;
                }
                Step::Fail((code, reason)) => {
                    stop = Stop::Close(code, reason);
                    break;
                }
                Step::Drained => {
                    stop = Stop::Drained;
                    break;
                }
                Step::Eof => {
                    // RFC 6455 7.1.5: a connection closed without a close frame is code 1006.
                    // The peer may still read (half-close), so it is closed like one that sent a
                    // close frame: replies to its last frames drain, bounded by the linger.
                    stop = Stop::PeerClosed(1006);
                    break;
                }
                Step::Error(_) => {
                    stop = Stop::Gone("transport error");
                    break;
                }
            }
        }
        if let Some(Phase::Open {
            heard_ms, reader, ..
        }) = self.slots.get_mut(&id).map(|s| &mut s.phase)
        {
            if heard {
                // Any frame, pongs included, shows the peer is there; the keepalive deadline
                // looks at this when it comes (no timer churn per message).
                *heard_ms = now.mono.0;
            }
            reader.park(&mut self.read_buffers);
        }
        match stop {
            Stop::Drained => {}
            Stop::Paused => self.park(id, steps > 0),
            Stop::Budget => {
                // Edge-triggered: no new event will say the rest is there. Read it in the next
                // round or turn.
                self.mark_readable(id);
                if self.load.coalescing && self.filled_share.len() < FILLED_SHARE_SAMPLES_MAX {
                    self.filled_share.push(id);
                }
            }
            Stop::Close(code, reason) => self.close(id, code, reason, now),
            Stop::PeerClosed(code) => {
                tracing::info!(conn = id, code, "peer closed");
                self.close_with(id, None, now);
            }
            Stop::Gone(why) => self.drop_slot(id, why, now),
        }
        steps
    }

    /// Reads and throws away what a closing peer still sends, watching for its EOF.
    fn read_discard(&mut self, id: u64) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Closing {
            socket,
            shut,
            peer_eof,
            ..
        } = &mut slot.phase
        else {
            return;
        };
        let mut sink = [0u8; 4096];
        for _ in 0..DISCARD_READS_PER_ROUND_MAX {
            match socket.read(&mut sink) {
                Ok(0) => {
                    *peer_eof = true;
                    if *shut {
                        self.drop_slot(id, "closed", now);
                    }
                    return;
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return self.drop_slot(id, "closed (reset)", now),
            }
        }
        self.mark_readable(id);
    }

    /// Takes every decision the core made and carries it out (buffers; `write` sends).
    pub(super) fn drain_outputs(&mut self, now: Now) {
        while let Some(output) = self.host.poll_output() {
            match output {
                Output::Send { conn, frame } => {
                    let Some(slot) = self.slots.get_mut(&conn.0) else {
                        continue;
                    };
                    if let Phase::Open { socket, .. } = &mut slot.phase {
                        socket.push_text(frame.as_bytes());
                        if !std::mem::replace(&mut slot.in_dirty, true) {
                            self.dirty.push(conn.0);
                        }
                        self.load.frames += 1;
                        self.load.bytes += frame.as_bytes().len();
                        if std::mem::replace(&mut slot.sent_turn, self.turn_no) != self.turn_no {
                            self.load.destinations += 1;
                        }
                    }
                    self.host.recycle(frame);
                }
                Output::Close { conn, code, reason } => {
                    self.close(conn.0, code.code(), reason, now)
                }
                Output::Commit(change) => self.writer.submit(change),
            }
        }
    }

    /// Closes an open WebSocket with a close frame and tells the core it is gone.
    pub(super) fn close(&mut self, id: u64, code: u16, reason: &'static str, now: Now) {
        tracing::info!(conn = id, code, reason, "closing");
        self.close_with(id, Some((code, reason)), now);
    }

    /// Moves an open WebSocket to the closing phase, appending our close frame when `frame` is
    /// set (a peer-initiated close already has our reply in the buffer), and reports
    /// `Input::Closed`. Frames the core sent before the close stay ahead of it in the buffer.
    fn close_with(&mut self, id: u64, frame: Option<(u16, &'static str)>, now: Now) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        if !matches!(slot.phase, Phase::Open { .. }) {
            // Already closing (the core may close a connection the peer just closed).
            return;
        }
        let Phase::Open {
            mut socket,
            probe_ms,
            ..
        } = std::mem::replace(&mut slot.phase, Phase::Moving)
        else {
            return;
        };
        if let Some(at) = probe_ms {
            self.deadlines.remove(&(at, id));
        }
        if let Some((code, reason)) = frame {
            socket.push_close(code, reason);
        }
        self.host.handle(now, Input::Closed { conn: ConnId(id) });
        self.linger(id, socket, false, now);
    }

    /// Writes a connection's pending bytes and reports core frames that reached the socket.
    pub(super) fn write(&mut self, id: u64) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Some(socket) = slot.socket_mut() else {
            return;
        };
        let drained = match socket.send() {
            Ok(drained) => drained,
            Err(e) => {
                let why = if e.kind() == io::ErrorKind::BrokenPipe {
                    "peer gone"
                } else {
                    "write error"
                };
                return self.drop_slot(id, why, now);
            }
        };
        let flushed = socket.settle();
        let own_pending = socket.own_pending_bytes();
        if drained == slot.writable {
            let interest = if drained {
                Interest::READABLE
            } else {
                Interest::READABLE | Interest::WRITABLE
            };
            let token = Token(id as usize);
            let registered = slot
                .socket_mut()
                .map(|w| self.poll.registry().reregister(&mut w.tcp, token, interest));
            if let Some(Err(e)) = registered {
                tracing::warn!(conn = id, error = %e, "reregister failed");
                return self.drop_slot(id, "reregister failed", now);
            }
            slot.writable = !drained;
        }
        match &mut slot.phase {
            Phase::Open { .. } => {
                if flushed > 0 {
                    self.host.handle(
                        now,
                        Input::Flushed {
                            conn: ConnId(id),
                            bytes: flushed,
                        },
                    );
                }
                if own_pending > OWN_BYTES_MAX {
                    tracing::warn!(
                        conn = id,
                        peer = %slot.peer,
                        own_pending,
                        "peer does not read the control frames it asks for; closing"
                    );
                    self.close(id, 1008, "Control frames not read", now);
                }
            }
            Phase::Closing {
                socket,
                shut,
                peer_eof,
                ..
            } if drained && !*shut => {
                *shut = true;
                let _ = socket.tcp.shutdown(Shutdown::Write);
                if *peer_eof {
                    self.drop_slot(id, "closed", now);
                }
            }
            _ => {}
        }
    }
}

/// Why a read round on a WebSocket stopped.
enum Stop {
    /// The socket has nothing more for now.
    Drained,
    /// The round's step budget ran out; more may wait.
    Budget,
    /// The core takes no input for now (the write path is full); more may wait.
    Paused,
    /// We close it with this code and reason.
    Close(u16, &'static str),
    /// The peer sent a close frame with this code (1005: none), or only its EOF (1006).
    PeerClosed(u16),
    /// It is gone without a close handshake.
    Gone(&'static str),
}
