//! The one global `serverSeq` and the replay ring behind `reconnect`.
//!
//! Every accepted action gets the next number, across all channels, so a client's single
//! `lastSeenServerSeq` is a complete cursor. The ring keeps the newest events; a reconnect whose
//! gap it covers is answered by replay, anything older by fresh snapshots.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::store::Event;

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
    ring: VecDeque<Sequenced>,
    ring_max: usize,
}

impl Sequencer {
    /// Resumes from the store: `seq` is the committed high-water mark and `tail` its newest
    /// events, oldest first.
    pub(crate) fn new(seq: u64, tail: Vec<Event>, ring_max: u32) -> Sequencer {
        let mut s = Sequencer {
            seq,
            ring: VecDeque::new(),
            ring_max: ring_max as usize,
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
        s
    }

    pub(crate) fn current(&self) -> u64 {
        self.seq
    }

    /// Records a committed event. Events arrive in strictly increasing, gap-free order.
    pub(crate) fn commit(&mut self, event: Sequenced) {
        assert_eq!(event.seq, self.seq + 1, "serverSeq gap after {}", self.seq);
        self.seq = event.seq;
        self.push(event);
    }

    fn push(&mut self, event: Sequenced) {
        if let Some(last) = self.ring.back() {
            assert!(event.seq > last.seq, "ring out of order at {}", event.seq);
        }
        if self.ring_max == 0 {
            return;
        }
        if self.ring.len() == self.ring_max {
            self.ring.pop_front();
        }
        self.ring.push_back(event);
    }

    /// Every event after `cursor` on channels accepted by `wanted`, oldest first; `None` when
    /// the ring no longer holds all of them or the gap is over `budget`.
    pub(crate) fn replay(
        &self,
        cursor: u64,
        budget: u32,
        wanted: impl Fn(&str) -> bool,
    ) -> Option<Vec<Arc<str>>> {
        debug_assert!(cursor <= self.seq);
        if self.seq - cursor > u64::from(budget) {
            return None;
        }
        if cursor < self.seq {
            let oldest = self.ring.front()?.seq;
            if oldest > cursor + 1 {
                return None;
            }
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
        let got = s.replay(2, 100, |c| c == "a").expect("covered");
        assert_eq!(
            got.iter().map(|e| e.as_ref()).collect::<Vec<_>>(),
            vec![r#"{"s":4}"#]
        );
        assert!(
            s.replay(1, 100, |_| true).is_none(),
            "event 2 fell out of the ring"
        );
        assert!(s.replay(3, 1, |_| true).is_none(), "over the budget");
        assert_eq!(s.replay(5, 0, |_| true).map(|v| v.len()), Some(0));
    }

    #[test]
    #[should_panic(expected = "serverSeq gap")]
    fn gaps_are_bugs() {
        let mut s = Sequencer::new(0, vec![], 3);
        s.commit(ev(2, "a"));
    }
}
