//! Fragmented text messages (RFC 6455 section 5.4): the fragments of one message are copied into
//! the reader's assembly buffer, grown only as the shared partial-message budget allows, and
//! checked for UTF-8 as they arrive. An unfragmented message never comes here.

use super::{FrameReader, Parsed, BUDGET_FULL, NOT_UTF8};

/// A fragmented text message being assembled.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fragmented {
    /// Bytes of `message` known to be a valid UTF-8 prefix (a character may be cut at the end).
    checked: usize,
}

impl FrameReader {
    /// A data frame that is part of a fragmented message (a first fragment or a continuation).
    pub(super) fn fragment(&mut self, fin: bool, from: usize, to: usize) -> Parsed {
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
}
