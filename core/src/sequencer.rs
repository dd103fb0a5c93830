//! The one global `serverSeq` and the replay ring behind `reconnect`.
//!
//! Every envelope the host sends with a `serverSeq` gets the next number, across all channels,
//! so a client's single `lastSeenServerSeq` is a complete cursor. Durable events (session
//! channels) are committed with their numbers. Ephemeral events (the client-services catalog)
//! are never stored, so their numbers come from a *reserved* block: the store remembers a
//! high-water mark above every number ever handed out, and a restarted host resumes there.
//! `serverSeq` therefore never goes backwards, at the price of gaps after a restart.
//!
//! The ring keeps the newest durable events. `floor` is the cursor below which the ring can no
//! longer answer: every durable event above it is in the ring. Ephemeral events are never
//! replayed; a reconnect that asks for the catalog gets snapshots.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::store::Event;

/// How many numbers an ephemeral reservation sets aside at a time.
pub(crate) const RESERVE_BLOCK: u64 = 1024;

/// One sequenced envelope kept for replay.
#[derive(Clone, Debug)]
pub(crate) struct Sequenced {
    pub(crate) seq: u64,
    pub(crate) channel: Arc<str>,
    /// The `ActionEnvelope` JSON, as sent.
    pub(crate) envelope: Arc<str>,
}

#[derive(Debug)]
pub(crate) struct Sequencer {
    /// The last assigned `serverSeq` (0 before any event).
    seq: u64,
    /// Durable high-water mark: no number above it was ever handed out.
    reserved: u64,
    ring: VecDeque<Sequenced>,
    ring_max: usize,
    /// Replay can serve any cursor `>= floor`.
    floor: u64,
}

impl Sequencer {
    /// Resumes from the store: `seq` is the committed high-water mark and `tail` its newest
    /// events, oldest first (at most `ring_max`).
    pub(crate) fn new(seq: u64, tail: Vec<Event>, ring_max: u32) -> Sequencer {
        let ring_max = ring_max as usize;
        // A full tail may have cut older events off; a shorter one is the whole history.
        let floor = match tail.first() {
            Some(first) if tail.len() >= ring_max => first.seq - 1,
            _ => 0,
        };
        let mut s = Sequencer {
            seq,
            reserved: seq,
            ring: VecDeque::new(),
            ring_max,
            floor,
        };
        for e in tail {
            assert!(
                e.seq <= seq,
                "stored event {} beyond stored serverSeq {}",
                e.seq,
                seq
            );
            s.push(Sequenced {
                seq: e.seq,
                channel: e.channel.into(),
                envelope: e.envelope.into(),
            });
        }
        if ring_max == 0 {
            s.floor = seq;
        }
        s
    }

    pub(crate) fn current(&self) -> u64 {
        self.seq
    }

    /// The durable high-water mark to store with a change whose last event is `last_seq`.
    pub(crate) fn mark_after(&self, last_seq: u64) -> u64 {
        self.reserved.max(last_seq)
    }

    /// Whether the next ephemeral number is already covered by a durable reservation.
    pub(crate) fn ephemeral_reserved(&self) -> bool {
        self.seq < self.reserved
    }

    /// The mark to commit before handing out more ephemeral numbers.
    pub(crate) fn next_reservation(&self) -> u64 {
        self.seq + RESERVE_BLOCK
    }

    /// Records that `mark` is now durable.
    pub(crate) fn reserved_to(&mut self, mark: u64) {
        assert!(mark >= self.reserved, "reservation went backwards");
        self.reserved = mark;
    }

    /// Records a committed durable event. Numbers are strictly increasing.
    pub(crate) fn commit(&mut self, event: Sequenced) {
        assert!(
            event.seq > self.seq,
            "serverSeq {} not above {}",
            event.seq,
            self.seq
        );
        self.reserved = self.reserved.max(event.seq);
        self.seq = event.seq;
        self.push(event);
    }

    /// Hands out the next number for an ephemeral event (not stored, not replayed). The caller
    /// made sure it is reserved.
    pub(crate) fn next_ephemeral(&mut self) -> u64 {
        assert!(
            self.seq < self.reserved,
            "ephemeral serverSeq {} not reserved",
            self.seq + 1
        );
        self.seq += 1;
        self.seq
    }

    fn push(&mut self, event: Sequenced) {
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

    fn ev(seq: u64, channel: &str) -> Sequenced {
        Sequenced {
            seq,
            channel: channel.into(),
            envelope: format!("{{\"s\":{seq}}}").into(),
        }
    }

    #[test]
    fn replays_what_the_ring_covers_and_refuses_what_it_does_not() {
        let mut s = Sequencer::new(0, vec![], 3);
        for seq in 1..=5 {
            s.commit(ev(seq, if seq % 2 == 0 { "a" } else { "b" }));
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
        s.reserved_to(mark);
        assert_eq!(s.next_ephemeral(), 1);
        s.commit(ev(2, "a"));
        assert_eq!(
            s.mark_after(2),
            mark,
            "durable changes keep the reservation"
        );
        // A restart resumes at the reservation: nothing handed out is ever reused.
        let restarted = Sequencer::new(
            mark,
            vec![Event {
                seq: 2,
                channel: "a".into(),
                envelope: "{}".into(),
            }],
            8,
        );
        assert_eq!(restarted.current(), mark);
        assert_eq!(restarted.replay(1, |_| true).map(|v| v.len()), Some(1));
    }

    #[test]
    fn a_full_tail_sets_the_floor() {
        let tail = (5..=7)
            .map(|seq| Event {
                seq,
                channel: "a".into(),
                envelope: "{}".into(),
            })
            .collect();
        let s = Sequencer::new(7, tail, 3);
        assert!(s.replay(3, |_| true).is_none());
        assert_eq!(s.replay(4, |_| true).map(|v| v.len()), Some(3));
    }

    #[test]
    #[should_panic(expected = "not above")]
    fn going_backwards_is_a_bug() {
        let mut s = Sequencer::new(0, vec![], 3);
        s.commit(ev(2, "a"));
        s.commit(ev(2, "a"));
    }
}
