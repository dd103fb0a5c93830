//! The one global `serverSeq` and the replay ring behind `reconnect`.
//!
//! Every envelope the host sends with a `serverSeq` gets the next number, across all channels,
//! so a client's single `lastSeenServerSeq` is a complete cursor. Durable events (session
//! channels) are committed with their numbers. Ephemeral events (the client-services catalog)
//! are never stored, so their numbers come from a *reserved* block: the store remembers a
//! high-water mark above every number ever handed out, and a restarted host resumes there.
//! `serverSeq` therefore never goes backwards, at the price of gaps after a restart.
//!
//! Numbers are handed out when a change is issued, before it is durable (pipelining). The
//! sequencer therefore tracks two marks: `reserved`, the newest mark issued, and
//! `durable_mark`, the newest one known durable, with the issued-but-not-durable marks in
//! between and the changes that carry them. A catalog number above `durable_mark` depends on
//! the change that reserved it. After a failed commit `reserved` returns to `durable_mark` and
//! the ring loses the failed events; `seq` never goes back.
//!
//! The ring keeps the newest events, durable or in flight (replays that include in-flight
//! events are held like every other frame that reveals them). `floor` is the cursor below which the ring can no
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
    /// The newest mark issued (durable or in flight): no number above it was ever handed out.
    reserved: u64,
    /// The newest mark known durable.
    durable_mark: u64,
    /// The newest durable event's seq.
    durable_event: u64,
    /// Issued marks not yet durable, with the number of the change carrying each, oldest
    /// first.
    marks: VecDeque<(u64, u64)>,
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
            durable_mark: seq,
            durable_event: tail.last().map_or(0, |e| e.seq),
            marks: VecDeque::new(),
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

    /// Whether catalog numbers are running low: under half a block left in the marks issued.
    /// Reserving then, ahead of need, means catalog events rarely wait for a commit.
    pub(crate) fn wants_reservation(&self) -> bool {
        self.reserved.saturating_sub(self.seq) <= RESERVE_BLOCK / 2
    }

    /// Whether the next ephemeral number is covered by an issued mark.
    pub(crate) fn ephemeral_reserved(&self) -> bool {
        self.seq < self.reserved
    }

    /// The mark to issue for the next reservation.
    pub(crate) fn next_reservation(&self) -> u64 {
        self.seq.max(self.reserved) + RESERVE_BLOCK
    }

    /// Records that change `number` carries `mark` (its `server_seq`).
    pub(crate) fn issued(&mut self, number: u64, mark: u64) {
        assert!(mark >= self.reserved, "a mark went backwards");
        self.reserved = mark;
        if mark > self.durable_mark {
            self.marks.push_back((mark, number));
        }
    }

    /// Every change up to `through` is durable; `last_event` is the newest event among them.
    pub(crate) fn durable_through(&mut self, through: u64, last_event: Option<u64>) {
        while let Some(&(mark, number)) = self.marks.front() {
            if number > through {
                break;
            }
            self.durable_mark = self.durable_mark.max(mark);
            self.marks.pop_front();
        }
        if let Some(e) = last_event {
            self.durable_event = self.durable_event.max(e);
        }
    }

    /// The change an ephemeral event numbered `seq` depends on: 0 when a durable mark covers
    /// it, else the first in-flight change whose mark does.
    pub(crate) fn ephemeral_dep(&self, seq: u64) -> u64 {
        if seq <= self.durable_mark {
            return 0;
        }
        self.marks
            .iter()
            .find(|(mark, _)| *mark >= seq)
            .map_or(0, |&(_, number)| number)
    }

    /// Every change not yet durable failed: the issued marks go, and so do the ring's events
    /// above the last durable one. `seq` stays where it is (gaps are allowed).
    pub(crate) fn roll_back(&mut self) {
        self.reserved = self.durable_mark;
        self.marks.clear();
        while self.ring.back().is_some_and(|e| e.seq > self.durable_event) {
            self.ring.pop_back();
        }
    }

    /// Whether numbers were handed out above every durable mark (after a failed commit): a
    /// new mark must cover them before anything that shows them leaves the host.
    pub(crate) fn uncovered(&self) -> bool {
        self.seq > self.reserved
    }

    /// Records an issued durable event (in flight until its change is durable). Numbers are
    /// strictly increasing.
    pub(crate) fn append(&mut self, event: Sequenced) {
        assert!(
            event.seq > self.seq,
            "serverSeq {} not above {}",
            event.seq,
            self.seq
        );
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
            s.append(ev(seq, if seq % 2 == 0 { "a" } else { "b" }));
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
        s.issued(1, mark);
        assert_eq!(s.ephemeral_dep(1), 1, "covered by change 1 only, in flight");
        s.durable_through(1, None);
        assert_eq!(s.ephemeral_dep(1), 0);
        assert_eq!(s.next_ephemeral(), 1);
        s.append(ev(2, "a"));
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
    fn a_roll_back_forgets_in_flight_marks_and_events_but_never_the_count() {
        let mut s = Sequencer::new(0, vec![], 8);
        s.append(ev(1, "a"));
        s.issued(1, 1);
        s.durable_through(1, Some(1));
        s.append(ev(2, "a"));
        s.issued(2, 2);
        let mark = s.next_reservation();
        s.issued(3, mark);
        assert_eq!(s.ephemeral_dep(3), 3);
        s.roll_back();
        assert_eq!(s.current(), 2, "serverSeq never goes back");
        assert_eq!(s.replay(0, |_| true).map(|v| v.len()), Some(1));
        assert!(s.uncovered(), "2 was handed out above the durable mark");
        assert!(!s.ephemeral_reserved());
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
        s.append(ev(2, "a"));
        s.append(ev(2, "a"));
    }
}
