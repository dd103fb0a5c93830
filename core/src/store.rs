//! The durable home of every state change, behind a trait so the core stays free of I/O.
//!
//! The core never writes to the store itself. Each durable change leaves the core as
//! [`crate::Output::Commit`]; the driver commits it (here, through [`Store::commit`], or on a
//! writer thread) and reports [`crate::Input::Durable`] or [`crate::Input::CommitFailed`]. The
//! core reads the store synchronously only where the store holds exactly what memory should
//! hold: `load` at startup, session and binding records after a failed commit (every earlier
//! change is then durable and every later one failed), and receipts the recent-receipt cache
//! does not hold (every receipt of a change still in flight is in that cache).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// The kind of a stored record: the store's table (or kind column). New concepts add a
/// variant, not a field of [`Change`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// Channel states and host bookkeeping (session meta), as JSON text keyed by URI.
    State,
    /// ClientId bindings: a [`ClientRecord`] as JSON, keyed by clientId.
    Client,
}

impl Table {
    /// Every table, in a stable order.
    pub const ALL: [Table; 2] = [Table::State, Table::Client];

    /// The stable name stores use for this table.
    pub fn name(self) -> &'static str {
        match self {
            Table::State => "state",
            Table::Client => "client",
        }
    }

    /// The table named `name`, if any.
    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// One record written or deleted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordWrite {
    /// Which kind of record.
    pub table: Table,
    /// Record key within its table (a channel URI, a host-private key, a clientId).
    pub key: String,
    /// New JSON text; `None` deletes the record.
    pub value: Option<String>,
}

/// One stored record, as `load` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Which kind of record.
    pub table: Table,
    /// Record key within its table.
    pub key: String,
    /// JSON text.
    pub value: String,
}

/// One committed action envelope, in global `serverSeq` order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// The global sequence number; strictly increasing across all channels.
    pub seq: u64,
    /// Channel the envelope belongs to.
    pub channel: String,
    /// The envelope as sent on the wire (`ActionEnvelope` JSON).
    pub envelope: String,
}

/// A retry receipt: a command's identity, a fingerprint of its input and its stored result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// Principal id; receipts are namespaced per principal.
    pub owner: String,
    /// Operation key, e.g. `dispatch:<clientId>:<clientSeq>`.
    pub key: String,
    /// SHA-256 hex of the canonical input.
    pub fingerprint: String,
    /// JSON text of the result returned the first time.
    pub result: String,
}

/// A clientId bound to the principal that first used it: the value of a [`Table::Client`]
/// record, as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientRecord {
    /// The client-chosen id (also the record key).
    pub client_id: String,
    /// Principal id that owns it.
    pub owner: String,
    /// Highest `clientSeq` with a stored dispatch receipt (0 when none).
    pub last_client_seq: u64,
    /// Whether this clientId ever dispatched an action (it may have used `clientSeq` 0, so
    /// `last_client_seq` cannot tell). A binding that never did holds no durable state and may
    /// be released (`core/src/binding.rs`).
    pub dispatched: bool,
}

impl ClientRecord {
    /// The record that stores this binding.
    pub fn write(&self) -> RecordWrite {
        RecordWrite {
            table: Table::Client,
            key: self.client_id.clone(),
            // Serializing strings, a number and a bool cannot fail.
            value: Some(serde_json::to_string(self).unwrap_or_default()),
        }
    }

    /// Reads a stored binding; `None` when the JSON is not one.
    pub fn parse(value: &str) -> Option<ClientRecord> {
        serde_json::from_str(value).ok()
    }
}

/// Everything one durable change writes, atomically. Handed to the driver in
/// [`crate::Output::Commit`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// 1, 2, 3, … per host instance, in the order the core handed them out. Commit in this
    /// order.
    pub number: u64,
    /// Bumped by the core each time it handles a `CommitFailed`: after a failed transaction a
    /// writer drops every queued change whose generation is not above the failed one's.
    pub generation: u64,
    /// The durable `serverSeq` high-water mark after this change: at least its last event's
    /// seq, and any reservation made for unstored (catalog) events.
    pub server_seq: u64,
    /// Envelopes appended, in seq order.
    pub events: Vec<Event>,
    /// Retry receipts, keyed `(owner, key)`; a receipt replaces one stored under its key.
    pub receipts: Vec<Receipt>,
    /// Records written or deleted.
    pub records: Vec<RecordWrite>,
}

/// What `load` hands the host at startup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// The highest `serverSeq` mark ever committed (0 for a new store).
    pub server_seq: u64,
    /// Every record, sorted by table, then key.
    pub records: Vec<Record>,
    /// The newest events, oldest first, at most the number asked for.
    pub events_tail: Vec<Event>,
}

/// Why the store could not do what was asked. A failed commit writes nothing, so this is
/// always safe to return.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

/// Durable storage for the host.
///
/// Implementations must make `commit` atomic: after a crash either all of a change is there or
/// none of it. Returning `Err` from any method is always allowed.
pub trait Store {
    /// Everything committed so far, with at most `events_tail_max` of the newest events.
    /// Called once, from `Host::new`.
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError>;
    /// Persists `change` atomically. Called by drivers (never by the core), in `number` order.
    fn commit(&mut self, change: &Change) -> Result<(), StoreError>;
    /// The receipt stored under `(owner, key)`, if any.
    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError>;
    /// The record stored under `(table, key)`, if any. Called to rebuild what a failed change
    /// touched. The default reads everything through `load`.
    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<String>, StoreError> {
        let all = self.load(0)?;
        Ok(all
            .records
            .into_iter()
            .find(|r| r.table == table && r.key == key)
            .map(|r| r.value))
    }
    /// Every event on `channel` with a sequence number above `after`, oldest first. Called
    /// to bring stored channel states up to date. The default reads everything through
    /// `load`; stores with an index should do better.
    fn channel_events_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let all = self.load(u32::MAX)?;
        Ok(all
            .events_tail
            .into_iter()
            .filter(|e| e.seq > after && e.channel == channel)
            .collect())
    }
}

/// An in-memory store: the reference implementation, used by unit tests and the simulator.
/// Its contents are exactly what was committed, so handing it to a new `Host` models a restart.
#[derive(Clone, Debug, Default)]
pub struct MemStore {
    server_seq: u64,
    records: BTreeMap<(Table, String), String>,
    events: Vec<Event>,
    receipts: BTreeMap<(String, String), Receipt>,
    /// Commits left to fail on purpose, for fault injection.
    fail_commits: u32,
    /// Receipt reads left to fail on purpose, for fault injection.
    fail_receipt_reads: u32,
    commits: u64,
    receipt_reads: u64,
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

    /// Makes the next `n` receipt reads fail.
    pub fn fail_next_receipt_reads(&mut self, n: u32) {
        self.fail_receipt_reads = n;
    }

    /// Successful commits so far.
    pub fn commits(&self) -> u64 {
        self.commits
    }

    /// Receipt reads asked for so far, failed ones included.
    pub fn receipt_reads(&self) -> u64 {
        self.receipt_reads
    }

    /// Every clientId binding stored, in clientId order (unreadable ones skipped).
    pub fn client_records(&self) -> Vec<ClientRecord> {
        self.records
            .iter()
            .filter(|((t, _), _)| *t == Table::Client)
            .filter_map(|(_, v)| ClientRecord::parse(v))
            .collect()
    }

    /// Every event committed, oldest first.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The [`Table::State`] record stored under `key`.
    pub fn record(&self, key: &str) -> Option<&str> {
        self.record_in(Table::State, key)
    }

    /// The record stored under `(table, key)`.
    pub fn record_in(&self, table: Table, key: &str) -> Option<&str> {
        self.records
            .get(&(table, key.to_owned()))
            .map(String::as_str)
    }

    /// The highest committed `serverSeq` mark.
    pub fn server_seq(&self) -> u64 {
        self.server_seq
    }
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
                .map(|((table, key), value)| Record {
                    table: *table,
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect(),
            events_tail: self.events[skip..].to_vec(),
        })
    }

    fn commit(&mut self, change: &Change) -> Result<(), StoreError> {
        if self.fail_commits > 0 {
            self.fail_commits -= 1;
            return Err(StoreError("injected commit failure".into()));
        }
        assert!(
            change.server_seq >= self.server_seq,
            "serverSeq went backwards in a commit"
        );
        // Numbers restart with every host instance (`load`); within one they climb.
        assert!(
            change.number > self.last_number,
            "change {} committed after {}",
            change.number,
            self.last_number
        );
        let mut last = self.events.last().map_or(0, |e| e.seq);
        for event in &change.events {
            // Events climb above the newest stored event; they may sit below `server_seq`, which
            // can be a reservation above every number handed out.
            assert!(
                event.seq > last,
                "event seq {} not above {}",
                event.seq,
                last
            );
            assert!(
                event.seq <= change.server_seq,
                "event seq {} above the change's mark",
                event.seq
            );
            last = event.seq;
        }
        self.events.extend(change.events.iter().cloned());
        for write in &change.records {
            let key = (write.table, write.key.clone());
            match &write.value {
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

    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError> {
        self.receipt_reads += 1;
        if self.fail_receipt_reads > 0 {
            self.fail_receipt_reads -= 1;
            return Err(StoreError("injected receipt read failure".into()));
        }
        Ok(self
            .receipts
            .get(&(owner.to_owned(), key.to_owned()))
            .cloned())
    }

    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.records.get(&(table, key.to_owned())).cloned())
    }

    fn channel_events_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let start = self.events.partition_point(|e| e.seq <= after);
        Ok(self.events[start..]
            .iter()
            .filter(|e| e.channel == channel)
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(number: u64, seq: u64) -> Change {
        Change {
            number,
            generation: 0,
            server_seq: seq,
            records: vec![
                RecordWrite {
                    table: Table::State,
                    key: "k".into(),
                    value: Some(format!("{seq}")),
                },
                ClientRecord {
                    client_id: "k".into(),
                    owner: "p".into(),
                    last_client_seq: seq,
                    dispatched: true,
                }
                .write(),
            ],
            events: vec![Event {
                seq,
                channel: "c".into(),
                envelope: "{}".into(),
            }],
            receipts: vec![],
        }
    }

    #[test]
    fn failed_commit_changes_nothing_and_tables_keep_keys_apart() {
        let mut s = MemStore::new();
        s.commit(&change(1, 1)).expect("first commit");
        s.fail_next_commits(1);
        assert!(s.commit(&change(2, 2)).is_err());
        assert_eq!(s.server_seq(), 1);
        assert_eq!(s.record("k"), Some("1"));
        s.commit(&change(2, 2)).expect("second commit");
        let loaded = s.load(1).expect("load");
        assert_eq!(loaded.server_seq, 2);
        assert_eq!(loaded.events_tail.len(), 1);
        assert_eq!(loaded.events_tail[0].seq, 2);
        // The same key in two tables is two records.
        assert_eq!(loaded.records.len(), 2);
        assert_eq!(s.record("k"), Some("2"));
        assert_eq!(s.client_records()[0].last_client_seq, 2);
        assert_eq!(
            s.read_record(Table::Client, "k").expect("read").as_deref(),
            s.record_in(Table::Client, "k")
        );
    }

    #[test]
    fn table_names_are_stable() {
        for t in Table::ALL {
            assert_eq!(Table::from_name(t.name()), Some(t));
        }
        assert_eq!(Table::State.name(), "state");
        assert_eq!(Table::Client.name(), "client");
    }
}
