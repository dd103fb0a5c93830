//! The durable home of every change, behind two traits so the core stays free of I/O.
//!
//! The core never writes. Each change leaves it as [`crate::Output::Commit`]; the driver commits
//! it through [`Commit`] (in production on a writer thread, in the simulator later and in
//! order) and reports [`crate::Input::Durable`] or [`crate::Input::CommitFailed`].
//!
//! The core reads through [`Store`], synchronously and rarely: `load` at startup, a receipt its
//! cache does not hold, a session's records and events to rebuild it. A store may already hold
//! changes the core has not yet heard are durable; the core reads it through
//! `log::WritePath::view`, which lays the changes still in flight over it, so a read sees the
//! newest state whatever the writer has reached.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::log::change::{Bytes, Change, Event, Loaded, Receipt, StoreError, StoredRecord, Table};

/// Reads of durable storage.
///
/// Returning `Err` is always allowed; the host then answers as for a failed commit, or (where a
/// read was needed to know its own state) stops. Every `Err` is safe: nothing was changed.
pub trait Store {
    /// Everything committed (records of the tables `Table::loaded_at_start` names), with at
    /// most `events_tail_max` of the newest events. Called once, by `Host::new`.
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError>;
    /// The receipt stored under `(owner, key)`, if any.
    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError>;
    /// The greatest receipt key under `owner` that starts with `prefix` (byte order), if any.
    /// `prefix` ends with an ASCII character other than DEL, so the keys it starts are exactly
    /// those from `prefix` up to (not including) `prefix` with that character incremented.
    fn last_receipt_key(&mut self, owner: &str, prefix: &str)
        -> Result<Option<String>, StoreError>;
    /// The record stored under `(table, key)`, if any.
    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<Bytes>, StoreError>;
    /// Every event on `channel` numbered above `after`, oldest first.
    fn channel_events_after(&mut self, channel: &str, after: u64)
        -> Result<Vec<Event>, StoreError>;
    /// The number of the first event on `channel` above `after`, if any. Stores should answer
    /// without reading the rest (this default reads them all).
    fn first_channel_event_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Option<u64>, StoreError> {
        Ok(self
            .channel_events_after(channel, after)?
            .first()
            .map(|e| e.seq))
    }
}

/// Writes to durable storage: what drivers (never the core) call.
pub trait Commit {
    /// Persists `change` atomically: after a crash either all of it is there or none. Called
    /// in `number` order.
    fn commit(&mut self, change: &Change) -> Result<(), StoreError>;
}

/// An in-memory store: the reference implementation, used by unit tests, the simulator, the
/// fuzz targets and the benches. Its contents are exactly what was committed, so handing it to
/// a new `Host` models a restart.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    server_seq: u64,
    records: BTreeMap<(Table, String), Bytes>,
    events: Vec<Event>,
    receipts: BTreeMap<(String, String), Receipt>,
    /// Commits left to fail on purpose, for fault injection.
    fail_commits: u32,
    /// Reads left to fail on purpose, for fault injection.
    fail_reads: u32,
    commits: u64,
    reads: u64,
    /// The number of the last change committed, to check the order drivers commit in.
    last_number: u64,
}

impl MemStore {
    /// An empty store.
    pub fn new() -> MemStore {
        MemStore::default()
    }

    /// Makes the next `n` commits fail (and change nothing).
    pub fn fail_next_commits(&mut self, n: u32) {
        self.fail_commits = n;
    }

    /// Makes the next `n` reads (receipts, records, events) fail.
    pub fn fail_next_reads(&mut self, n: u32) {
        self.fail_reads = n;
    }

    /// Successful commits so far.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Reads asked for so far (receipts, records, events), failed ones included.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Every event committed, oldest first.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The record stored under `(table, key)`, as text.
    pub fn record_text(&self, table: Table, key: &str) -> Option<&str> {
        self.records
            .get(&(table, key.to_owned()))
            .and_then(|v| std::str::from_utf8(v).ok())
    }

    /// Every record of `table`, in key order.
    pub fn records_of(&self, table: Table) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.records
            .range((table, String::new())..)
            .take_while(move |((t, _), _)| *t == table)
            .map(|((_, k), v)| (k.as_str(), &**v))
    }

    /// The greatest receipt key under `owner` starting with `prefix` (see
    /// [`Store::last_receipt_key`]), without counting a read.
    pub fn greatest_receipt_key(&self, owner: &str, prefix: &str) -> Option<&str> {
        let upper = prefix_upper_bound(prefix)?;
        self.receipts
            .range((owner.to_owned(), prefix.to_owned())..(owner.to_owned(), upper))
            .next_back()
            .map(|((_, key), _)| key.as_str())
    }

    /// The committed event numbered `seq`, if any.
    pub fn event(&self, seq: u64) -> Option<&Event> {
        let i = self.events.partition_point(|e| e.seq < seq);
        self.events.get(i).filter(|e| e.seq == seq)
    }

    /// The receipt stored under `(owner, key)`, without counting a read.
    pub fn stored_receipt(&self, owner: &str, key: &str) -> Option<&Receipt> {
        self.receipts.get(&(owner.to_owned(), key.to_owned()))
    }

    /// The highest committed `serverSeq` mark.
    pub fn server_seq(&self) -> u64 {
        self.server_seq
    }

    /// The number of the last change committed since the last `load`.
    pub fn last_number(&self) -> u64 {
        self.last_number
    }

    fn read(&mut self) -> Result<(), StoreError> {
        self.reads += 1;
        if self.fail_reads > 0 {
            self.fail_reads -= 1;
            return Err(StoreError("injected read failure".into()));
        }
        Ok(())
    }
}

/// The first key above every key that starts with `prefix`: `prefix` with its last character
/// incremented. `None` unless that character is ASCII below DEL (the contract of
/// [`Store::last_receipt_key`]).
pub fn prefix_upper_bound(prefix: &str) -> Option<String> {
    let last = *prefix.as_bytes().last()?;
    if last >= 0x7f {
        return None;
    }
    let mut upper = prefix[..prefix.len() - 1].to_owned();
    upper.push(char::from(last + 1));
    Some(upper)
}

impl Store for MemStore {
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError> {
        // A new host numbers its changes from 1 again.
        self.last_number = 0;
        let skip = self.events.len().saturating_sub(events_tail_max as usize);
        Ok(Loaded {
            server_seq: self.server_seq,
            records: self
                .records
                .iter()
                .filter(|((table, _), _)| table.loaded_at_start())
                .map(|((table, key), value)| StoredRecord {
                    table: *table,
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            events_tail: self.events[skip..].to_vec(),
        })
    }

    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError> {
        self.read()?;
        Ok(self
            .receipts
            .get(&(owner.to_owned(), key.to_owned()))
            .cloned())
    }

    fn last_receipt_key(
        &mut self,
        owner: &str,
        prefix: &str,
    ) -> Result<Option<String>, StoreError> {
        self.read()?;
        Ok(self.greatest_receipt_key(owner, prefix).map(str::to_owned))
    }

    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<Bytes>, StoreError> {
        self.read()?;
        Ok(self.records.get(&(table, key.to_owned())).cloned())
    }

    fn channel_events_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.read()?;
        let start = self.events.partition_point(|e| e.seq <= after);
        Ok(self.events[start..]
            .iter()
            .filter(|e| &*e.channel == channel)
            .cloned()
            .collect())
    }

    fn first_channel_event_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.read()?;
        let start = self.events.partition_point(|e| e.seq <= after);
        Ok(self.events[start..]
            .iter()
            .find(|e| &*e.channel == channel)
            .map(|e| e.seq))
    }
}

impl Commit for MemStore {
    fn commit(&mut self, change: &Change) -> Result<(), StoreError> {
        if self.fail_commits > 0 {
            self.fail_commits -= 1;
            return Err(StoreError("injected commit failure".into()));
        }
        // The driver contract, checked: changes come in order, marks and events climb.
        assert!(
            change.number > self.last_number,
            "change {} committed after {}",
            change.number,
            self.last_number
        );
        assert!(
            change.server_seq >= self.server_seq,
            "serverSeq mark went backwards in change {}",
            change.number
        );
        let mut last = self.events.last().map_or(0, |e| e.seq);
        for event in &change.events {
            assert!(event.seq > last, "event {} not above {}", event.seq, last);
            assert!(
                event.seq <= change.server_seq,
                "event {} above its change's mark",
                event.seq
            );
            last = event.seq;
        }
        self.events.extend(change.events.iter().cloned());
        for r in &change.records {
            let key = (r.table, r.key.clone());
            match &r.value {
                Some(v) => self.records.insert(key, v.clone()),
                None => self.records.remove(&key),
            };
        }
        for r in &change.receipts {
            self.receipts
                .insert((r.owner.clone(), r.key.clone()), r.clone());
        }
        self.server_seq = change.server_seq;
        self.last_number = change.number;
        self.commits += 1;
        Ok(())
    }
}

/// An event, for tests and drivers that build changes by hand.
pub fn event(seq: u64, channel: &str, envelope: &str) -> Event {
    Event {
        seq,
        channel: Arc::from(channel),
        envelope: Arc::from(envelope),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::change::Record;

    fn change(number: u64, seq: u64) -> Change {
        Change {
            number,
            generation: 0,
            server_seq: seq,
            records: vec![
                Record::json(Table::State, "k", &format!("{seq}")),
                Record::json(Table::Client, "k", "{}"),
            ],
            events: vec![event(seq, "c", "{}")],
            receipts: vec![],
        }
    }

    #[test]
    fn a_failed_commit_changes_nothing_and_tables_keep_keys_apart() {
        let mut s = MemStore::new();
        s.commit(&change(1, 1)).expect("first commit");
        s.fail_next_commits(1);
        assert!(s.commit(&change(2, 2)).is_err());
        assert_eq!(s.server_seq(), 1);
        assert_eq!(s.record_text(Table::State, "k"), Some("1"));
        s.commit(&change(2, 2)).expect("second commit");
        let loaded = s.load(1).expect("load");
        assert_eq!(loaded.server_seq, 2);
        assert_eq!(loaded.events_tail.len(), 1);
        assert_eq!(loaded.events_tail[0].seq, 2);
        // The same key in two tables is two records.
        assert_eq!(loaded.records.len(), 2);
        assert_eq!(s.records_of(Table::Client).count(), 1);
        assert_eq!(
            s.read_record(Table::State, "k").expect("read").as_deref(),
            Some(&b"2"[..])
        );
    }

    #[test]
    fn deletions_and_injected_read_failures() {
        let mut s = MemStore::new();
        s.commit(&change(1, 1)).expect("commit");
        s.commit(&Change {
            number: 2,
            server_seq: 1,
            records: vec![Record::delete(Table::State, "k")],
            ..Change::default()
        })
        .expect("delete");
        assert_eq!(s.record_text(Table::State, "k"), None);
        s.fail_next_reads(1);
        assert!(s.read_record(Table::Client, "k").is_err());
        assert!(s.read_record(Table::Client, "k").expect("read").is_some());
        assert_eq!(s.reads(), 2);
        assert_eq!(s.channel_events_after("c", 0).expect("events").len(), 1);
    }

    #[test]
    #[should_panic(expected = "committed after")]
    fn out_of_order_commits_are_a_driver_bug() {
        let mut s = MemStore::new();
        s.commit(&change(2, 1)).expect("commit");
        let _ = s.commit(&change(1, 2));
    }
}
