//! The one global `serverSeq` and the replay ring behind `reconnect`.
//!
//! Every envelope the host sends with a `serverSeq` gets the next number, across all channels,
//! so a client's single `lastSeenServerSeq` is a complete cursor. Numbers are handed out when a
//! change is *issued* (built and handed to the writer), not when it is durable, so later changes
//! build on earlier ones still in flight; nothing carrying a number leaves the host before the
//! number is covered by a durable change.
//!
//! Stored events carry their numbers. Ephemeral events (the client-services catalog) are never
//! stored, so their numbers come from a *reserved* block: a change raises the stored high-water
//! mark above every number handed out, and a restarted host resumes there. `serverSeq`
//! therefore never goes backwards, at the price of gaps after a restart or a failed commit (a
//! failed change's numbers are never reused: they are skipped, and covered again by a fresh
//! reservation before anything newer is shown).
//!
//! The ring keeps the newest stored events, in flight ones included (a replay that contains
//! them is held until they are durable, like any other answer). `floor` is the cursor below
//! which the ring can no longer answer.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::log::change::Event;

/// How many numbers an ephemeral reservation sets aside at a time.
pub(crate) const RESERVE_BLOCK: u64 = 1024;

#[derive(Debug)]
pub(crate) struct Sequencer {
    /// The last number handed out (0 before any).
    seq: u64,
    /// The mark issued so far: no number above it was handed out.
    reserved: u64,
    /// The change that raised `reserved` to its value (0: it was loaded, hence durable).
    reserved_by: u64,
    /// The mark the store holds durably.
    durable_mark: u64,
    ring: VecDeque<Event>,
    ring_max: usize,
    /// Replay can serve any cursor `>= floor`.
    floor: u64,
}

impl Sequencer {
    /// Resumes from the store: `mark` is its high-water mark and `tail` its newest events,
    /// oldest first (at most `ring_max`).
    pub(crate) fn new(mark: u64, tail: Vec<Event>, ring_max: u32) -> Sequencer {
        let ring_max = ring_max as usize;
        // A full tail may have cut older events off; a shorter one is the whole history.
        let floor = match tail.first() {
            Some(first) if tail.len() >= ring_max => first.seq - 1,
            _ => 0,
        };
        let mut s = Sequencer {
            seq: mark,
            reserved: mark,
            reserved_by: 0,
            durable_mark: mark,
            ring: VecDeque::new(),
            ring_max,
            floor,
        };
        for e in tail {
            assert!(
                e.seq <= mark,
                "stored event {} beyond stored serverSeq {}",
                e.seq,
                mark
            );
            s.push(e);
        }
        if ring_max == 0 {
            s.floor = mark;
        }
        s
    }

    /// The last number handed out.
    pub(crate) fn current(&self) -> u64 {
        self.seq
    }

    /// The mark a change whose last event is `last_seq` stores.
    pub(crate) fn mark_after(&self, last_seq: u64) -> u64 {
        self.reserved.max(last_seq)
    }

    /// Records change `number`, issued with `mark` and `events` (numbered from `current() + 1`).
    pub(crate) fn issue(&mut self, number: u64, mark: u64, events: &[Event]) {
        for e in events {
            assert!(
                e.seq == self.seq + 1,
                "change {number}: serverSeq {} does not follow {}",
                e.seq,
                self.seq
            );
            self.seq = e.seq;
            self.push(e.clone());
        }
        assert!(mark >= self.seq, "change {number}: mark below its events");
        if mark > self.reserved {
            self.reserved = mark;
            self.reserved_by = number;
        }
    }

    /// The store now durably holds `mark`.
    pub(crate) fn durable(&mut self, mark: u64) {
        self.durable_mark = self.durable_mark.max(mark);
    }

    /// Whether the next catalog number should be reserved ahead: half the block is used, so
    /// a reservation issued now is durable long before catalog events run out of numbers.
    pub(crate) fn wants_reservation(&self) -> bool {
        self.seq + RESERVE_BLOCK / 2 >= self.reserved
    }

    /// Whether a number can be handed out to a catalog event now.
    pub(crate) fn ephemeral_reserved(&self) -> bool {
        self.seq < self.reserved
    }

    /// The mark a new reservation commits.
    pub(crate) fn next_reservation(&self) -> u64 {
        self.seq + RESERVE_BLOCK
    }

    /// Hands out the next number for a catalog event (never stored, never replayed), and the
    /// change whose durability covers it. The caller made sure it is reserved.
    pub(crate) fn next_ephemeral(&mut self) -> (u64, u64) {
        assert!(
            self.seq < self.reserved,
            "ephemeral serverSeq {} not reserved",
            self.seq + 1
        );
        self.seq += 1;
        (self.seq, self.reserved_by)
    }

    /// Changes whose first event was `first_failed_event` (if any had events) failed: their
    /// events leave the ring, and the issued mark falls back to the durable one. Numbers
    /// handed out stay handed out; whether they need covering again is `uncovered`.
    pub(crate) fn roll_back(&mut self, first_failed_event: Option<u64>) {
        if let Some(first) = first_failed_event {
            while self.ring.back().is_some_and(|e| e.seq >= first) {
                self.ring.pop_back();
            }
        }
        self.reserved = self.durable_mark;
        self.reserved_by = 0;
    }

    /// Whether numbers were handed out above every durable mark.
    pub(crate) fn uncovered(&self) -> bool {
        self.seq > self.reserved
    }

    fn push(&mut self, event: Event) {
        if let Some(last) = self.ring.back() {
            assert!(event.seq > last.seq, "ring out of order at {}", event.seq);
        }
        if self.ring_max == 0 {
            self.floor = event.seq;
            return;
        }
        if self.ring.len() == self.ring_max {
            if let Some(old) = self.ring.pop_front() {
                self.floor = old.seq;
            }
        }
        self.ring.push_back(event);
    }

    /// Every event after `cursor` on channels accepted by `wanted`, oldest first; `None` when
    /// the ring no longer holds all of them.
    pub(crate) fn replay(
        &self,
        cursor: u64,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<Vec<Arc<str>>> {
        debug_assert!(cursor <= self.seq);
        if cursor < self.floor {
            return None;
        }
        Some(
            self.ring
                .iter()
                .filter(|e| e.seq > cursor && wanted(&e.channel))
                .map(|e| e.envelope.clone())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::store::event;

    fn ev(seq: u64, channel: &str) -> Event {
        event(seq, channel, &format!("{{\"s\":{seq}}}"))
    }

    #[test]
    fn replays_what_the_ring_covers_and_refuses_what_it_does_not() {
        let mut s = Sequencer::new(0, vec![], 3);
        for seq in 1..=5 {
            s.issue(seq, seq, &[ev(seq, if seq % 2 == 0 { "a" } else { "b" })]);
        }
        assert_eq!(s.current(), 5);
        let got = s.replay(2, |c| c == "a").expect("covered");
        assert_eq!(
            got.iter().map(|e| e.as_ref()).collect::<Vec<_>>(),
            vec![r#"{"s":4}"#]
        );
        assert!(
            s.replay(1, |_| true).is_none(),
            "event 2 fell out of the ring"
        );
        assert_eq!(s.replay(5, |_| true).map(|v| v.len()), Some(0));
    }

    #[test]
    fn ephemeral_numbers_need_a_reservation_and_survive_restart_as_a_jump() {
        let mut s = Sequencer::new(0, vec![], 8);
        assert!(!s.ephemeral_reserved());
        let mark = s.next_reservation();
        s.issue(1, mark, &[]);
        assert_eq!(s.next_ephemeral(), (1, 1));
        s.issue(2, s.mark_after(2), &[ev(2, "a")]);
        assert_eq!(s.mark_after(2), mark, "later changes keep the reservation");
        // A restart resumes at the reservation: nothing handed out is ever reused.
        let restarted = Sequencer::new(mark, vec![ev(2, "a")], 8);
        assert_eq!(restarted.current(), mark);
        assert_eq!(restarted.replay(1, |_| true).map(|v| v.len()), Some(1));
    }

    #[test]
    fn a_failure_drops_its_events_and_leaves_its_numbers_uncovered() {
        let mut s = Sequencer::new(0, vec![], 8);
        s.issue(1, 1, &[ev(1, "a")]);
        s.durable(1);
        s.issue(2, 3, &[ev(2, "a"), ev(3, "b")]);
        s.roll_back(Some(2));
        assert_eq!(s.current(), 3, "numbers are never reused");
        assert!(s.uncovered());
        assert_eq!(s.replay(0, |_| true).map(|v| v.len()), Some(1));
        s.issue(3, s.next_reservation(), &[]);
        assert!(!s.uncovered());
        s.issue(4, s.mark_after(4), &[ev(4, "a")]);
        assert_eq!(s.replay(1, |_| true).map(|v| v.len()), Some(1));
    }

    #[test]
    fn a_full_tail_sets_the_floor() {
        let tail = (5..=7).map(|seq| ev(seq, "a")).collect();
        let s = Sequencer::new(7, tail, 3);
        assert!(s.replay(3, |_| true).is_none());
        assert_eq!(s.replay(4, |_| true).map(|v| v.len()), Some(3));
    }

    #[test]
    #[should_panic(expected = "does not follow")]
    fn going_backwards_is_a_bug() {
        let mut s = Sequencer::new(0, vec![], 3);
        s.issue(1, 2, &[ev(2, "a")]);
    }
}
