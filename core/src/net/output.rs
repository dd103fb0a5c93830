//! What the core asks the driver to do, in the order it decided.

use std::collections::VecDeque;
use std::fmt;
use std::rc::Rc;

use crate::log::change::Change;
use crate::net::connection::ConnId;

/// One encoded WebSocket text message, shared: fan-out to N connections is N refcount bumps.
///
/// The buffer the frame was encoded into is kept as is (`Rc<Vec>`, not `Rc<[u8]>`, which
/// would copy every frame once more; measured on `notification/route`). The count is not
/// atomic: the core and its driver are one thread, and on the notification path the two
/// locked instructions an `Arc` cost per message (`make_mut`, then `get_mut` when the frame
/// came back) were 8-9% of the host's time at 64->64 flat out (they wait for the frame's
/// stores to drain; perf in `docs/performance.md`).
#[derive(Clone, PartialEq, Eq)]
pub struct Frame(Rc<Vec<u8>>);

impl Frame {
    /// Wraps encoded JSON.
    pub fn new(bytes: Vec<u8>) -> Frame {
        Frame(Rc::new(bytes))
    }

    /// The frame's bytes (UTF-8 JSON).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The frame's text; frames are always built from JSON text.
    pub fn as_str(&self) -> &str {
        // Frames are only built from serde_json output and valid UTF-8 input slices.
        std::str::from_utf8(&self.0).unwrap_or("")
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the frame is empty (never true for frames the host builds).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Spent frame buffers kept for reuse, so the notification path allocates nothing.
///
/// The driver hands each frame back with [`crate::Host::recycle`] once it copied the bytes out.
/// A frame still shared (fan-out to several connections) is simply dropped; the last copy given
/// back is kept. Bounded in count and per-buffer capacity, so a burst of large frames is not
/// held on to.
#[derive(Default, Debug)]
pub(crate) struct FramePool {
    spare: Vec<Rc<Vec<u8>>>,
}

/// Buffers kept; a turn's worth of reuse needs only a few, as the driver recycles each frame
/// right after its message is handled.
const POOL_FRAMES_MAX: usize = 64;

/// Larger buffers are freed rather than kept.
const POOL_FRAME_BYTES_MAX: usize = 4096;

impl FramePool {
    /// An empty buffer (cleared by the writer), unshared: a kept one, or a new one.
    pub(crate) fn take(&mut self) -> Rc<Vec<u8>> {
        self.spare.pop().unwrap_or_default()
    }

    /// Keeps `frame`'s buffer if nobody else holds it and it is worth keeping.
    pub(crate) fn give_back(&mut self, frame: Frame) {
        let mut buffer = frame.0;
        let keep = self.spare.len() < POOL_FRAMES_MAX
            && Rc::get_mut(&mut buffer).is_some_and(|b| b.capacity() <= POOL_FRAME_BYTES_MAX);
        if keep {
            self.spare.push(buffer);
        }
    }
}

impl Frame {
    /// Wraps a buffer taken from [`FramePool::take`] and filled.
    pub(crate) fn from_pool(buffer: Rc<Vec<u8>>) -> Frame {
        Frame(buffer)
    }
}

impl fmt::Debug for Frame {
    // Frames carry application payloads; debug output shows only their size.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Frame({} bytes)", self.0.len())
    }
}

/// WebSocket close codes the host uses.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum CloseCode {
    /// 1000: the host is shutting down or the exchange ended normally.
    Normal,
    /// 1003: binary frames are not accepted.
    Unsupported,
    /// 1008: policy (handshake timeout, unsupported version, queue over its limit).
    Policy,
    /// 1009: a frame over `frame_bytes_max`.
    TooBig,
    /// 1011: the host rolled back state this connection was shown (a failed commit); the
    /// client reconnects and is shown the durable state.
    InternalError,
    /// 1013: too many connections; try again later.
    TryAgainLater,
}

impl CloseCode {
    /// The numeric code on the wire.
    pub fn code(self) -> u16 {
        match self {
            CloseCode::Normal => 1000,
            CloseCode::Unsupported => 1003,
            CloseCode::Policy => 1008,
            CloseCode::TooBig => 1009,
            CloseCode::InternalError => 1011,
            CloseCode::TryAgainLater => 1013,
        }
    }
}

/// One decision for the driver to carry out.
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// Write `frame` as one text message to `conn`. Report written bytes with `Input::Flushed`.
    Send {
        /// Destination.
        conn: ConnId,
        /// The message.
        frame: Frame,
    },
    /// Send the frames already queued for `conn`, then close it with `code`. The core ignores
    /// everything for `conn` from now on; the driver still reports `Input::Closed`.
    Close {
        /// The connection to close.
        conn: ConnId,
        /// WebSocket close code.
        code: CloseCode,
        /// Short, payload-free reason.
        reason: &'static str,
    },
    /// Commit this change durably, after every change numbered before it, and report the
    /// outcome with `Input::Durable` or `Input::CommitFailed`. Nothing the change reveals
    /// leaves the host before it is reported durable.
    Commit(Box<Change>),
}

/// The queue of decisions `poll_output` drains.
#[derive(Default, Debug)]
pub(crate) struct Outbox {
    queue: VecDeque<Output>,
}

impl Outbox {
    pub(crate) fn push(&mut self, output: Output) {
        self.queue.push_back(output);
    }

    pub(crate) fn pop(&mut self) -> Option<Output> {
        self.queue.pop_front()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pool_keeps_only_unshared_small_buffers_and_at_most_its_bound() {
        let mut pool = FramePool::default();
        // A frame still shared (fan-out) is not kept: its other holder may still read it.
        let shared = Frame::new(vec![1, 2, 3]);
        let other = shared.clone();
        pool.give_back(shared);
        assert!(pool.spare.is_empty());
        assert_eq!(other.as_bytes(), &[1, 2, 3]);
        // The last holder's buffer is kept and handed out again, unshared.
        pool.give_back(other);
        assert_eq!(pool.spare.len(), 1);
        let mut again = pool.take();
        assert!(Rc::get_mut(&mut again).is_some());
        // Large buffers are freed, not kept.
        pool.give_back(Frame::new(Vec::with_capacity(POOL_FRAME_BYTES_MAX + 1)));
        assert!(pool.spare.is_empty());
        // At most POOL_FRAMES_MAX are kept.
        for _ in 0..POOL_FRAMES_MAX + 10 {
            pool.give_back(Frame::new(Vec::with_capacity(64)));
        }
        assert_eq!(pool.spare.len(), POOL_FRAMES_MAX);
        // An empty pool makes a new buffer.
        let mut empty = FramePool::default();
        assert!(Rc::get_mut(&mut empty.take()).is_some());
    }
}
