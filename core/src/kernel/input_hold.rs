//! The input hold: messages that wait while the write path is full (backpressure).
//!
//! When `Limits::in_flight_changes_max` changes wait for the disk, the host takes no new input
//! that may need a change: `Host::accepting_input` turns false, and a driver that honours it
//! stops reading. A message that arrives anyway and may need a change is held here instead of
//! refused, and so is every later message of a connection that has one held (its answers keep
//! their order). `Durable` (or `CommitFailed`) frees room and the host handles held messages
//! in arrival order, as many as the room allows. A connection that closes, or that the host
//! closes, loses what it had held. The hold is bounded (`held_messages_max`,
//! `held_message_bytes_max`); the host decides what happens past it.

use std::collections::VecDeque;

use crate::net::connection::ConnId;

/// One message waiting for room on the write path.
#[derive(Debug)]
pub(crate) struct HeldMessage {
    pub(crate) conn: ConnId,
    pub(crate) text: Box<str>,
    /// It was its connection's first message (`reconnect` must be the first).
    pub(crate) first: bool,
    /// It may need a change: it waits for room once it is at the front. A message held only
    /// because its connection had one held before it goes as soon as it reaches the front.
    pub(crate) needs_room: bool,
}

/// Held messages in arrival order, with their total size.
#[derive(Debug, Default)]
pub(crate) struct InputHold {
    queue: VecDeque<HeldMessage>,
    bytes: u64,
}

impl InputHold {
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Whether one more message of `len` bytes fits under the bounds: never past
    /// `messages_max`, and past `bytes_max` only as the one message held.
    pub(crate) fn fits(&self, len: usize, messages_max: u32, bytes_max: u64) -> bool {
        self.queue.len() < messages_max as usize
            && (self.queue.is_empty() || self.bytes.saturating_add(len as u64) <= bytes_max)
    }

    pub(crate) fn push(&mut self, message: HeldMessage) {
        self.bytes += message.text.len() as u64;
        self.queue.push_back(message);
    }

    /// The front message, if `room` lets it go (or it needs none).
    pub(crate) fn pop_ready(&mut self, room: bool) -> Option<HeldMessage> {
        if !self.queue.front().is_some_and(|m| room || !m.needs_room) {
            return None;
        }
        let message = self.queue.pop_front()?;
        self.bytes -= message.text.len() as u64;
        Some(message)
    }

    /// Drops every message of `conn`; returns how many.
    pub(crate) fn drop_conn(&mut self, conn: ConnId) -> usize {
        let before = self.queue.len();
        let mut freed = 0;
        self.queue.retain(|m| {
            let keep = m.conn != conn;
            if !keep {
                freed += m.text.len() as u64;
            }
            keep
        });
        self.bytes -= freed;
        before - self.queue.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(conn: u64, text: &str, needs_room: bool) -> HeldMessage {
        HeldMessage {
            conn: ConnId(conn),
            text: text.into(),
            first: false,
            needs_room,
        }
    }

    #[test]
    fn messages_leave_in_order_as_room_allows() {
        let mut hold = InputHold::default();
        hold.push(msg(1, "aa", true));
        hold.push(msg(1, "b", false));
        hold.push(msg(2, "ccc", true));
        assert_eq!((hold.len(), hold.bytes()), (3, 6));
        assert!(hold.pop_ready(false).is_none(), "the front needs room");
        let a = hold.pop_ready(true).expect("room");
        assert_eq!(&*a.text, "aa");
        let b = hold.pop_ready(false).expect("needs no room");
        assert_eq!(&*b.text, "b");
        assert!(hold.pop_ready(false).is_none());
        assert_eq!(hold.drop_conn(ConnId(2)), 1);
        assert!(hold.is_empty());
        assert_eq!(hold.bytes(), 0);
    }

    #[test]
    fn the_bounds_count_messages_and_bytes_but_always_take_one() {
        let mut hold = InputHold::default();
        assert!(
            hold.fits(100, 2, 10),
            "the first message fits whatever its size"
        );
        assert!(!hold.fits(1, 0, 10), "no message fits a hold of none");
        hold.push(msg(1, "0123456789", true));
        assert!(!hold.fits(1, 2, 10), "past the bytes");
        assert!(hold.fits(1, 2, 11));
        hold.push(msg(1, "x", true));
        assert!(!hold.fits(0, 2, 100), "past the count");
    }
}
