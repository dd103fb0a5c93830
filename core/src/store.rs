//! The durable home of every state change, behind a trait so the core stays free of I/O.
//!
//! The host calls the store synchronously: `load` once from `Host::new`, `commit` once per change
//! *before* anything is applied in memory or sent to a client, and `receipt` to look up a retry
//! receipt. A failed commit changes nothing: the host answers the caller with an error and its
//! memory and every client stay as they were.

use std::collections::BTreeMap;
use std::fmt;

/// One state record: a channel's state, or host bookkeeping, as JSON text under a key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordWrite {
    /// Record key (a channel URI or a host-private key such as `session:ID`).
    pub key: String,
    /// New JSON text; `None` deletes the record.
    pub value: Option<String>,
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

/// A clientId bound to the principal that first used it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientRecord {
    /// The client-chosen id.
    pub client_id: String,
    /// Principal id that owns it forever.
    pub owner: String,
    /// Highest `clientSeq` with a stored dispatch receipt (0 when none).
    pub last_client_seq: u64,
    /// Whether this clientId ever dispatched an action (it may have used `clientSeq` 0, so
    /// `last_client_seq` cannot tell). A binding that never did holds no durable state and may
    /// be released (`core/src/binding.rs`).
    pub dispatched: bool,
}

/// Everything one change writes, atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// `serverSeq` after this change: the last event's seq, or unchanged when there are none.
    pub server_seq: u64,
    /// State records written or deleted.
    pub records: Vec<RecordWrite>,
    /// Envelopes appended, in seq order.
    pub events: Vec<Event>,
    /// The retry receipt of the command that caused the change, if it has one.
    pub receipt: Option<Receipt>,
    /// ClientId bindings created or updated.
    pub clients: Vec<ClientRecord>,
    /// ClientId bindings deleted (idle ones a principal no longer keeps).
    pub clients_released: Vec<String>,
}

impl Change {
    /// Whether committing this change would write nothing.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
            && self.events.is_empty()
            && self.receipt.is_none()
            && self.clients.is_empty()
            && self.clients_released.is_empty()
    }
}

/// What `load` hands the host at startup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// The highest `serverSeq` ever committed (0 for a new store).
    pub server_seq: u64,
    /// Every state record, sorted by key.
    pub records: Vec<(String, String)>,
    /// The newest events, oldest first, at most the number asked for.
    pub events_tail: Vec<Event>,
    /// Every clientId binding.
    pub clients: Vec<ClientRecord>,
}

/// Why the store could not do what was asked. The host never applies a change whose commit
/// failed, so this is always safe to return.
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
    /// Persists `change` atomically. Called once per change, before it is applied or sent.
    fn commit(&mut self, change: &Change) -> Result<(), StoreError>;
    /// The receipt stored under `(owner, key)`, if any.
    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError>;
    /// The record stored under `key`, if any. Called to rebuild a session after a change that
    /// could not be committed. The default reads everything through `load`.
    fn read_record(&mut self, key: &str) -> Result<Option<String>, StoreError> {
        let all = self.load(0)?;
        Ok(all
            .records
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v))
    }
    /// Every event on `channel` with a sequence number above `after`, oldest first. Called
    /// from `Host::new` to bring stored channel states up to date. The default reads
    /// everything through `load`; stores with an index should do better.
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
    records: BTreeMap<String, String>,
    events: Vec<Event>,
    receipts: BTreeMap<(String, String), Receipt>,
    clients: BTreeMap<String, ClientRecord>,
    /// Commits left to fail on purpose, for fault injection.
    fail_commits: u32,
    /// Receipt reads left to fail on purpose, for fault injection.
    fail_receipt_reads: u32,
    commits: u64,
    receipt_reads: u64,
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

    /// Every clientId binding stored, in clientId order.
    pub fn client_records(&self) -> impl Iterator<Item = &ClientRecord> + '_ {
        self.clients.values()
    }

    /// Every event committed, oldest first.
    pub fn events(&self) -> &[Event] {
        &self.events
    }

    /// The record stored under `key`.
    pub fn record(&self, key: &str) -> Option<&str> {
        self.records.get(key).map(String::as_str)
    }

    /// The highest committed `serverSeq`.
    pub fn server_seq(&self) -> u64 {
        self.server_seq
    }
}

impl Store for MemStore {
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError> {
        let skip = self.events.len().saturating_sub(events_tail_max as usize);
        Ok(Loaded {
            server_seq: self.server_seq,
            records: self
                .records
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            events_tail: self.events[skip..].to_vec(),
            clients: self.clients.values().cloned().collect(),
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
        for event in &change.events {
            // Events climb above the newest stored event; they may sit below `server_seq`, which
            // can be a reservation above every number handed out.
            let last = self.events.last().map_or(0, |e| e.seq);
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
            self.events.push(event.clone());
        }
        for write in &change.records {
            match &write.value {
                Some(v) => self.records.insert(write.key.clone(), v.clone()),
                None => self.records.remove(&write.key),
            };
        }
        if let Some(r) = &change.receipt {
            self.receipts
                .insert((r.owner.clone(), r.key.clone()), r.clone());
        }
        for id in &change.clients_released {
            self.clients.remove(id);
        }
        for c in &change.clients {
            self.clients.insert(c.client_id.clone(), c.clone());
        }
        self.server_seq = change.server_seq;
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

    fn read_record(&mut self, key: &str) -> Result<Option<String>, StoreError> {
        Ok(self.records.get(key).cloned())
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

    fn change(seq: u64) -> Change {
        Change {
            server_seq: seq,
            records: vec![RecordWrite {
                key: "k".into(),
                value: Some(format!("{seq}")),
            }],
            events: vec![Event {
                seq,
                channel: "c".into(),
                envelope: "{}".into(),
            }],
            receipt: None,
            clients: vec![],
            clients_released: vec![],
        }
    }

    #[test]
    fn failed_commit_changes_nothing() {
        let mut s = MemStore::new();
        s.commit(&change(1)).expect("first commit");
        s.fail_next_commits(1);
        assert!(s.commit(&change(2)).is_err());
        assert_eq!(s.server_seq(), 1);
        assert_eq!(s.record("k"), Some("1"));
        s.commit(&change(2)).expect("second commit");
        let loaded = s.load(1).expect("load");
        assert_eq!(loaded.server_seq, 2);
        assert_eq!(loaded.events_tail.len(), 1);
        assert_eq!(loaded.events_tail[0].seq, 2);
    }
}
