//! The change journal: what makes a group commit cheap on disk.
//!
//! A change is made durable by appending it, encoded, to the `journal` table: every change of
//! a group lands in the same few pages at the right edge of one B-tree, so the group's `fsync`
//! writes about one page per change instead of one per index leaf the change touches (its
//! channel's events, its receipt, its client binding, its session's records, each in a
//! different leaf). Later, in a larger transaction, the writer *applies* journaled changes to
//! `records`, `events` and `receipts` and deletes their journal rows: many changes share each
//! leaf then, so the scattered pages are written once per apply instead of once per commit.
//!
//! Between the two, a change is durable but not yet in the tables. [`Pending`] holds those
//! changes in memory, shared by the writer (which adds them after their journal commit and
//! removes them after their apply commit) and the reader, which consults it *before* querying
//! the tables: a change missing from `Pending` was either never journaled or was removed after
//! its apply committed, so a query started afterwards sees it in the tables. (A change still in
//! flight, not yet reported durable, is the core's to overlay: `log::WritePath::view`.)
//!
//! Opening a database applies whatever the journal still holds (a crash between a journal
//! commit and its apply), in the schema transaction, before anything is read.
//!
//! The encoding is private to this file and versioned by its first byte; integers are
//! little-endian, strings and byte strings are a `u32` length and the bytes.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axhost_core::{Bytes, Change, Event, Receipt, Record, StoreError, StoredRecord, Table};

/// The encoding's version byte.
const FORMAT: u8 = 1;

/// Encodes `change` for the journal (its number and generation are the host's, not the
/// store's, and are not kept).
pub(super) fn encode(change: &Change) -> Vec<u8> {
    let mut out = Vec::with_capacity(change.size() + 64);
    out.push(FORMAT);
    put_u64(&mut out, change.server_seq);
    put_u32(&mut out, change.records.len());
    for record in &change.records {
        put_str(&mut out, record.table.name());
        put_str(&mut out, &record.key);
        match &record.value {
            Some(value) => {
                out.push(1);
                put_bytes(&mut out, value);
            }
            None => out.push(0),
        }
    }
    put_u32(&mut out, change.events.len());
    for event in &change.events {
        put_u64(&mut out, event.seq);
        put_str(&mut out, &event.channel);
        put_str(&mut out, &event.envelope);
    }
    put_u32(&mut out, change.receipts.len());
    for receipt in &change.receipts {
        put_str(&mut out, &receipt.owner);
        put_str(&mut out, &receipt.key);
        put_str(&mut out, &receipt.fingerprint);
        put_str(&mut out, &receipt.result);
    }
    out
}

/// Decodes a journal row; a row this build cannot read is corruption, named without payload.
pub(super) fn decode(bytes: &[u8]) -> Result<Change, StoreError> {
    let mut r = Reader { bytes, at: 0 };
    let format = r.u8()?;
    if format != FORMAT {
        return Err(corrupt(&format!("journal format {format}")));
    }
    let mut change = Change {
        server_seq: r.u64()?,
        ..Change::default()
    };
    for _ in 0..r.count()? {
        let name = r.str()?;
        let table = Table::from_name(name)
            .ok_or_else(|| corrupt(&format!("journal record of an unknown table {name:?}")))?;
        let key = r.str()?.to_owned();
        let value = match r.u8()? {
            0 => None,
            1 => Some(Bytes::from(r.bytes()?)),
            _ => return Err(corrupt("journal record flag")),
        };
        change.records.push(Record { table, key, value });
    }
    for _ in 0..r.count()? {
        let seq = r.u64()?;
        let channel = Arc::from(r.str()?);
        let envelope = Arc::from(r.str()?);
        change.events.push(Event {
            seq,
            channel,
            envelope,
        });
    }
    for _ in 0..r.count()? {
        change.receipts.push(Receipt {
            owner: r.str()?.to_owned(),
            key: r.str()?.to_owned(),
            fingerprint: r.str()?.to_owned(),
            result: Arc::from(r.str()?),
        });
    }
    if r.at != bytes.len() {
        return Err(corrupt("trailing bytes in a journal row"));
    }
    Ok(change)
}

fn corrupt(what: &str) -> StoreError {
    StoreError(format!("corrupt journal: {what}"))
}

fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_u32(out: &mut Vec<u8>, n: usize) {
    // Every length here is bounded far below 4 GiB by the core's frame and blob limits; a
    // larger one would be a bug upstream, and the truncated count would fail the decode.
    out.extend_from_slice(&(n as u32).to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len());
    out.extend_from_slice(b);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_bytes(out, s.as_bytes());
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], StoreError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len())
            .ok_or_else(|| corrupt("a journal row ends early"))?;
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, StoreError> {
        Ok(self.take(1)?[0])
    }

    fn u64(&mut self) -> Result<u64, StoreError> {
        let mut b = [0u8; 8];
        b.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(b))
    }

    fn count(&mut self) -> Result<usize, StoreError> {
        let mut b = [0u8; 4];
        b.copy_from_slice(self.take(4)?);
        Ok(u32::from_le_bytes(b) as usize)
    }

    fn bytes(&mut self) -> Result<&'a [u8], StoreError> {
        let n = self.count()?;
        self.take(n)
    }

    fn str(&mut self) -> Result<&'a str, StoreError> {
        std::str::from_utf8(self.bytes()?).map_err(|_| corrupt("a journal string is not UTF-8"))
    }
}

/// Changes durable in the journal and not yet applied to the tables, oldest first, each with
/// its journal row id. Shared by the writer and the reader (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Pending {
    changes: VecDeque<(i64, Arc<Change>)>,
}

/// The handle both halves of a store hold.
pub(crate) type SharedPending = Arc<Mutex<Pending>>;

/// Locks `pending`. Its state is a queue that is valid whatever a panicking holder was doing.
pub(super) fn lock(pending: &SharedPending) -> MutexGuard<'_, Pending> {
    pending.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Pending {
    /// Changes waiting to be applied.
    pub(super) fn len(&self) -> usize {
        self.changes.len()
    }

    /// Records `change` (journal row `id`) as durable and not applied.
    pub(super) fn push(&mut self, id: i64, change: Arc<Change>) {
        self.changes.push_back((id, change));
    }

    /// Up to `n` of the oldest, for an apply.
    pub(super) fn oldest(&self, n: usize) -> Vec<(i64, Arc<Change>)> {
        self.changes.iter().take(n).cloned().collect()
    }

    /// Forgets every change up to journal row `through`: its apply committed.
    pub(super) fn applied(&mut self, through: i64) {
        while self.changes.front().is_some_and(|(id, _)| *id <= through) {
            self.changes.pop_front();
        }
    }

    /// The newest write of `(table, key)`: `Some(None)` for a deletion, `None` if no pending
    /// change touches it.
    pub(super) fn record(&self, table: Table, key: &str) -> Option<Option<Bytes>> {
        self.changes.iter().rev().find_map(|(_, change)| {
            change
                .records
                .iter()
                .rev()
                .find(|r| r.table == table && r.key == key)
                .map(|r| r.value.clone())
        })
    }

    /// The newest receipt stored under `(owner, key)`.
    pub(super) fn receipt(&self, owner: &str, key: &str) -> Option<Receipt> {
        self.changes.iter().rev().find_map(|(_, change)| {
            change
                .receipts
                .iter()
                .rev()
                .find(|r| r.owner == owner && r.key == key)
                .cloned()
        })
    }

    /// Every pending event on `channel` numbered above `after`, oldest first.
    pub(super) fn channel_events_after(&self, channel: &str, after: u64) -> Vec<Event> {
        self.changes
            .iter()
            .flat_map(|(_, change)| change.events.iter())
            .filter(|e| e.seq > after && &*e.channel == channel)
            .cloned()
            .collect()
    }

    /// The highest `serverSeq` mark pending, and every pending record and event, in order:
    /// what a load lays over the tables.
    pub(super) fn overlay(&self) -> (u64, Vec<Record>, Vec<Event>) {
        let mut server_seq = 0;
        let mut records = Vec::new();
        let mut events = Vec::new();
        for (_, change) in &self.changes {
            server_seq = server_seq.max(change.server_seq);
            records.extend(change.records.iter().cloned());
            events.extend(change.events.iter().cloned());
        }
        (server_seq, records, events)
    }
}

/// Lays pending `records` (in write order) over the loaded ones, which are sorted by table
/// then key; returns them in the same order.
pub(super) fn overlay_records(
    loaded: Vec<StoredRecord>,
    pending: Vec<Record>,
) -> Vec<StoredRecord> {
    if pending.is_empty() {
        return loaded;
    }
    let mut all: BTreeMap<(Table, String), Bytes> = loaded
        .into_iter()
        .map(|r| ((r.table, r.key), r.value))
        .collect();
    for record in pending {
        if !record.table.loaded_at_start() {
            continue;
        }
        match record.value {
            Some(value) => {
                all.insert((record.table, record.key), value);
            }
            None => {
                all.remove(&(record.table, record.key));
            }
        }
    }
    all.into_iter()
        .map(|((table, key), value)| StoredRecord { table, key, value })
        .collect()
}

/// Merges two runs of events ordered by `seq` (the tables' and the pending ones, which may
/// overlap when an apply committed between the two reads), without duplicates.
pub(super) fn merge_events(stored: Vec<Event>, pending: Vec<Event>) -> Vec<Event> {
    if pending.is_empty() {
        return stored;
    }
    let mut all = stored;
    all.extend(pending);
    all.sort_by_key(|e| e.seq);
    all.dedup_by_key(|e| e.seq);
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change() -> Change {
        Change {
            number: 9,
            generation: 2,
            server_seq: 41,
            events: vec![Event {
                seq: 40,
                channel: "ahp-session:/s1".into(),
                envelope: r#"{"serverSeq":40,"é":"\u0000"}"#.into(),
            }],
            receipts: vec![Receipt {
                owner: "alice".into(),
                key: "dispatch:c1:3".into(),
                fingerprint: "ab".repeat(32),
                result: "null".into(),
            }],
            records: vec![
                Record::json(Table::State, "ahp-session:/s1", "{}"),
                Record::delete(Table::Client, "c0"),
                Record::bytes(Table::Blob, "b", Arc::from(&[0u8, 255, 7][..])),
            ],
        }
    }

    #[test]
    fn a_change_round_trips_but_its_number_and_generation() {
        let c = change();
        let back = decode(&encode(&c)).expect("decode");
        assert_eq!(
            back,
            Change {
                number: 0,
                generation: 0,
                ..c
            }
        );
    }

    #[test]
    fn every_truncation_and_a_trailing_byte_are_corruption_never_a_panic() {
        let bytes = encode(&change());
        for n in 0..bytes.len() {
            assert!(decode(&bytes[..n]).is_err(), "truncated at {n}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(decode(&longer).is_err());
        let mut other = bytes;
        other[0] = 9;
        assert!(decode(&other).is_err());
    }

    #[test]
    fn pending_answers_with_the_newest_write_and_forgets_what_was_applied() {
        let mut p = Pending::default();
        p.push(1, Arc::new(change()));
        let mut newer = change();
        newer.records = vec![Record::delete(Table::State, "ahp-session:/s1")];
        newer.events[0].seq = 42;
        newer.server_seq = 42;
        p.push(2, Arc::new(newer));
        assert_eq!(p.record(Table::State, "ahp-session:/s1"), Some(None));
        assert_eq!(
            p.record(Table::Blob, "b").flatten().as_deref(),
            Some(&[0u8, 255, 7][..])
        );
        assert_eq!(p.record(Table::State, "other"), None);
        assert!(p.receipt("alice", "dispatch:c1:3").is_some());
        assert!(p.receipt("bob", "dispatch:c1:3").is_none());
        let seqs = |v: Vec<Event>| v.iter().map(|e| e.seq).collect::<Vec<_>>();
        assert_eq!(seqs(p.channel_events_after("ahp-session:/s1", 0)), [40, 42]);
        assert_eq!(seqs(p.channel_events_after("ahp-session:/s1", 40)), [42]);
        assert!(p.channel_events_after("ahp-session:/s2", 0).is_empty());
        p.applied(1);
        assert_eq!(p.len(), 1);
        assert_eq!(p.record(Table::Blob, "b"), None);
    }

    #[test]
    fn merged_events_keep_order_without_duplicates() {
        let e = |seq| Event {
            seq,
            channel: "c".into(),
            envelope: "{}".into(),
        };
        let merged = merge_events(vec![e(1), e(3), e(4)], vec![e(4), e(5)]);
        assert_eq!(
            merged.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [1, 3, 4, 5]
        );
    }
}
