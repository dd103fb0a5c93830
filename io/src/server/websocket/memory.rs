//! Where a reader's bytes live, and who pays for them: the read buffers the driver's readers
//! share, and the budget every reader's partial messages are charged to.

use std::cell::Cell;
use std::rc::Rc;

use super::READ_BUFFER_BYTES;

/// Free read buffers the pool keeps; one is enough for the single-threaded driver, a few cover
/// the connections that keep theirs between turns and then give them back together.
pub(super) const POOL_BUFFERS_MAX: usize = 8;

/// Read buffers shared by every connection of one driver.
///
/// A connection reads into a buffer from the pool and gives it back once it has parsed all but
/// a few bytes ([`FrameReader::park`](super::FrameReader::park)), so the driver's reads cycle
/// through a buffer or two that stay in cache, rather than one 16 KiB buffer per connection
/// (1 MiB at 64 busy senders, which the kernel's copy and the parse then miss in cache each
/// turn). An idle connection holds no read buffer at all.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Vec<Vec<u8>>,
}

impl BufferPool {
    /// A buffer of [`READ_BUFFER_BYTES`]: the most recently returned one, or a new zeroed one.
    pub(super) fn take(&mut self) -> Vec<u8> {
        self.free
            .pop()
            .unwrap_or_else(|| vec![0u8; READ_BUFFER_BYTES])
    }

    /// Keeps `buf` for the next reader if it has the standard size and the pool has room.
    pub(super) fn give(&mut self, buf: Vec<u8>) {
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
    pub(super) fn try_charge(&self, bytes: usize) -> bool {
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
    pub(super) fn recharge(&self, from: usize, to: usize) {
        let held = self.held.get();
        debug_assert!(
            held >= from,
            "budget holds {held}, a reader gives back {from}"
        );
        self.held.set(held.saturating_sub(from).saturating_add(to));
    }
}
