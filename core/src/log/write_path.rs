//! The one write path: numbering, the changes in flight, and reads that see them.
//!
//! A component builds a [`Txn`] against the newest state (durable or not), and the kernel
//! issues it: numbers it, remembers it here until the driver reports it durable, and hands it
//! out as `Output::Commit`. The writer commits in order; `Durable { through }` retires changes
//! from the front, `CommitFailed { number }` fails that change and every later one.
//!
//! What a change in flight holds is kept here (shared, not copied) so that reads see it:
//! [`View`] lays the in-flight records and events over the store, and the receipt cache holds
//! every in-flight receipt. The store may already hold changes the core has not heard are
//! durable; the view takes those from memory, not twice.

use std::collections::{BTreeSet, VecDeque};

use crate::log::change::{Bytes, Change, Event, Receipt, Record, StoreError, Table};
use crate::log::store::Store;

/// State a change touched, by owner: what is rebuilt from the store if it fails.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Touched {
    /// A session (all its channels), by id.
    Session(String),
    /// A clientId binding.
    Client(String),
    /// An AXP executor registry entry, by executor id.
    Executor(String),
    /// A session's access to an AXP blob, by `BlobAccess` key (`<exchange>\n<digest>`).
    BlobAccess(String),
    /// A principal's AXP signing key, by principal id.
    SigningKey(String),
    /// An AXP repository-memory lesson, by id.
    Memory(String),
}

/// One durable change being built.
#[derive(Debug, Default)]
pub(crate) struct Txn {
    /// Envelopes, numbered from the sequencer's current number + 1.
    pub(crate) events: Vec<Event>,
    pub(crate) receipts: Vec<Receipt>,
    pub(crate) records: Vec<Record>,
    /// A mark to reserve ahead, for catalog numbers.
    pub(crate) reservation: Option<u64>,
    pub(crate) touched: Vec<Touched>,
}

impl Txn {
    /// A change that only reserves `mark`.
    pub(crate) fn reservation(mark: u64) -> Txn {
        Txn {
            reservation: Some(mark),
            ..Txn::default()
        }
    }
}

/// A change issued and not yet known durable.
#[derive(Debug)]
struct InFlight {
    number: u64,
    /// The `serverSeq` mark it stores.
    mark: u64,
    events: Vec<Event>,
    records: Vec<Record>,
    touched: Vec<Touched>,
}

/// What failed, for the components to rebuild.
#[derive(Debug, Default)]
pub(crate) struct Failed {
    /// The first failed change.
    pub(crate) first: u64,
    /// Every change that failed.
    pub(crate) count: usize,
    /// The first event number of the failed changes, if any had events.
    pub(crate) first_event: Option<u64>,
    pub(crate) touched: BTreeSet<Touched>,
}

#[derive(Debug)]
pub(crate) struct WritePath {
    next: u64,
    durable: u64,
    generation: u64,
    in_flight: VecDeque<InFlight>,
}

impl Default for WritePath {
    fn default() -> Self {
        WritePath {
            next: 1,
            durable: 0,
            generation: 0,
            in_flight: VecDeque::new(),
        }
    }
}

impl WritePath {
    /// The newest change issued (0 before any).
    pub(crate) fn issued(&self) -> u64 {
        self.next - 1
    }

    /// The newest change known durable.
    pub(crate) fn durable(&self) -> u64 {
        self.durable
    }

    /// The newest change that is durable or still in flight: what the newest state depends
    /// on. Failed changes are not among them (their state is gone), so nothing waits for one.
    pub(crate) fn newest_live(&self) -> u64 {
        self.in_flight.back().map_or(self.durable, |c| c.number)
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Whether another change may be issued with at most `max` in flight
    /// (`Limits::in_flight_changes_max`: a stalled disk bounds what memory holds for it).
    pub(crate) fn has_room(&self, max: usize) -> bool {
        self.in_flight.len() < max
    }

    /// Numbers `txn`, remembers it in flight and returns the change to hand out.
    pub(crate) fn issue(&mut self, txn: Txn, mark: u64) -> Change {
        let number = self.next;
        self.next += 1;
        self.in_flight.push_back(InFlight {
            number,
            mark,
            events: txn.events.clone(),
            records: txn.records.clone(),
            touched: txn.touched,
        });
        Change {
            number,
            generation: self.generation,
            server_seq: mark,
            events: txn.events,
            receipts: txn.receipts,
            records: txn.records,
        }
    }

    /// `Durable { through }`: retires the changes in flight up to `through`. Returns how
    /// many, and the newest mark among them. Only changes in flight become durable: a report
    /// naming failed or unknown numbers moves nothing.
    pub(crate) fn durable_through(&mut self, through: u64) -> (usize, Option<u64>) {
        let mut retired = 0;
        let mut mark = None;
        while self.in_flight.front().is_some_and(|c| c.number <= through) {
            if let Some(c) = self.in_flight.pop_front() {
                retired += 1;
                mark = Some(c.mark);
                self.durable = c.number;
            }
        }
        (retired, mark)
    }

    /// The oldest change in flight.
    pub(crate) fn first_in_flight(&self) -> Option<u64> {
        self.in_flight.front().map(|c| c.number)
    }

    /// `CommitFailed { number }`: `number` and every later change failed. The caller has
    /// already retired the changes before it. `None` when the report is stale (`number` is not
    /// the oldest change in flight: already durable, already failed, or never issued).
    pub(crate) fn fail(&mut self, number: u64) -> Option<Failed> {
        if self.first_in_flight() != Some(number) {
            return None;
        }
        self.generation += 1;
        let mut failed = Failed {
            first: number,
            ..Failed::default()
        };
        for c in self.in_flight.drain(..) {
            failed.count += 1;
            if failed.first_event.is_none() {
                failed.first_event = c.events.first().map(|e| e.seq);
            }
            failed.touched.extend(c.touched);
        }
        Some(failed)
    }

    /// Reads through the changes in flight onto `store`.
    pub(crate) fn view<'a, S: Store>(&'a self, store: &'a mut S) -> View<'a, S> {
        View { path: self, store }
    }

    /// Events of changes in flight on `channel`, above `after`.
    pub(crate) fn events_in_flight<'a>(
        &'a self,
        channel: &'a str,
        after: u64,
    ) -> impl Iterator<Item = &'a Event> + 'a {
        self.in_flight
            .iter()
            .flat_map(|c| c.events.iter())
            .filter(move |e| e.seq > after && &*e.channel == channel)
    }

    fn first_event_in_flight(&self) -> Option<u64> {
        self.in_flight
            .iter()
            .find_map(|c| c.events.first().map(|e| e.seq))
    }
}

/// The store as the newest state has it: in-flight changes laid over what is durable.
pub(crate) struct View<'a, S: Store> {
    path: &'a WritePath,
    store: &'a mut S,
}

impl<S: Store> View<'_, S> {
    /// The record under `(table, key)`: the newest in-flight write, else the store's.
    pub(crate) fn record(&mut self, table: Table, key: &str) -> Result<Option<Bytes>, StoreError> {
        for c in self.path.in_flight.iter().rev() {
            if let Some(r) = c
                .records
                .iter()
                .rev()
                .find(|r| r.table == table && r.key == key)
            {
                return Ok(r.value.clone());
            }
        }
        self.store.read_record(table, key)
    }

    /// Every event on `channel` numbered above `after`, oldest first: the store's below the
    /// first event in flight, then those in flight.
    pub(crate) fn channel_events_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let mut events = self.store.channel_events_after(channel, after)?;
        if let Some(first) = self.path.first_event_in_flight() {
            // The store may hold some in-flight changes already; memory has all of them.
            events.retain(|e| e.seq < first);
        }
        events.extend(self.path.events_in_flight(channel, after).cloned());
        Ok(events)
    }

    /// The number of the first event on `channel` above `after`, if any: the store's if it is
    /// below every event in flight, else the first in flight.
    pub(crate) fn first_event_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Option<u64>, StoreError> {
        let in_flight = self.path.first_event_in_flight();
        if let Some(seq) = self.store.first_channel_event_after(channel, after)? {
            if in_flight.is_none_or(|first| seq < first) {
                return Ok(Some(seq));
            }
        }
        Ok(self
            .path
            .events_in_flight(channel, after)
            .next()
            .map(|e| e.seq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::change::Change;
    use crate::log::store::{event, Commit, MemStore};

    fn txn(seq: u64, key: &str, value: &str) -> Txn {
        Txn {
            events: vec![event(seq, "c", &format!("{seq}"))],
            records: vec![Record::json(Table::State, key, value)],
            touched: vec![Touched::Session(key.into())],
            ..Txn::default()
        }
    }

    #[test]
    fn the_view_reads_in_flight_changes_over_the_store_and_never_twice() {
        let mut path = WritePath::default();
        let mut store = MemStore::new();
        let c1: Change = path.issue(txn(1, "a", "1"), 1);
        let c2 = path.issue(txn(2, "a", "2"), 2);
        // The writer committed the first, the core has not heard yet.
        store.commit(&c1).expect("commit");
        let mut view = path.view(&mut store);
        assert_eq!(
            view.record(Table::State, "a").expect("read").as_deref(),
            Some(&b"2"[..])
        );
        let seqs: Vec<u64> = view
            .channel_events_after("c", 0)
            .expect("events")
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, [1, 2]);
        assert_eq!(view.first_event_after("c", 0).expect("first"), Some(1));
        assert_eq!(view.first_event_after("c", 1).expect("first"), Some(2));
        assert_eq!(view.first_event_after("c", 2).expect("first"), None);
        assert_eq!(view.first_event_after("d", 0).expect("first"), None);
        assert_eq!(path.durable_through(1), (1, Some(1)));
        store.commit(&c2).expect("commit");
        assert_eq!(path.durable_through(2), (1, Some(2)));
        assert_eq!(path.in_flight(), 0);
    }

    #[test]
    fn a_failure_takes_every_later_change_and_bumps_the_generation() {
        let mut path = WritePath::default();
        let _ = path.issue(txn(1, "a", "1"), 1);
        let _ = path.issue(txn(2, "b", "2"), 2);
        let _ = path.issue(txn(3, "c", "3"), 3);
        path.durable_through(1);
        assert!(path.fail(1).is_none(), "stale: already durable");
        assert!(path.fail(3).is_none(), "stale: not the oldest in flight");
        let failed = path.fail(2).expect("failed");
        assert_eq!(
            (failed.first, failed.count, failed.first_event),
            (2, 2, Some(2))
        );
        assert_eq!(failed.touched.len(), 2);
        assert!(path.fail(2).is_none(), "stale: reported twice");
        assert_eq!(
            path.durable_through(3),
            (0, None),
            "failed changes never become durable"
        );
        assert_eq!(path.durable(), 1);
        let next = path.issue(Txn::default(), 3);
        assert_eq!((next.number, next.generation), (4, 1));
    }
}
