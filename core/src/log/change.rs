//! What one durable change writes: typed records, numbered events and retry receipts.
//!
//! A [`Change`] is the unit the store commits atomically and the unit the host reveals: the
//! core hands it to the driver as [`crate::Output::Commit`] and shows nothing of it until the
//! driver reports it durable. Every value is shared (`Arc`), so the core keeps what it needs
//! of a change in flight (to rebuild state on a failure, to answer reads) without copying it.

use std::fmt;
use std::sync::Arc;

/// Bytes shared between the core and the writer: a record value or a blob.
pub type Bytes = Arc<[u8]>;

/// The kind of a stored record: which component owns it and how stores file it. A new concept
/// adds a variant here, never a field to [`Change`].
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    /// A session's host-private meta and its channels' checkpointed states, keyed by URI.
    State,
    /// A clientId binding, keyed by clientId (JSON of `ClientRecord`).
    Client,
    /// An AXP executor registry entry, keyed by executor id (JSON of `ExecutorInfo`).
    Executor,
    /// An AXP blob's bytes, keyed by their SHA-256 hex digest. Raw bytes, not JSON; never
    /// loaded at start (see [`Table::loaded_at_start`]), read one at a time when asked for.
    Blob,
    /// A session's access to a blob, keyed `<exchange URI>\n<digest>` (JSON
    /// `{"mediaType","size"}`): what the host indexes blobs by, loaded at start.
    BlobAccess,
    /// The Ed25519 key an AXP principal signs reviews with, keyed by principal id (JSON
    /// `{"ed25519": "<hex>"}`).
    SigningKey,
    /// An AXP repository-memory lesson, keyed by its id (JSON of `MemoryEntry`).
    Memory,
}

impl Table {
    /// Every table, in a stable order.
    pub const ALL: [Table; 7] = [
        Table::State,
        Table::Client,
        Table::Executor,
        Table::Blob,
        Table::BlobAccess,
        Table::SigningKey,
        Table::Memory,
    ];

    /// The stable name stores file this table under.
    pub fn name(self) -> &'static str {
        match self {
            Table::State => "state",
            Table::Client => "client",
            Table::Executor => "executor",
            Table::Blob => "blob",
            Table::BlobAccess => "blob_access",
            Table::SigningKey => "signing_key",
            Table::Memory => "memory",
        }
    }

    /// Whether `Store::load` returns this table's records. Blob bytes are not: a host holds
    /// gigabytes of them at most and needs none to start (their index is `BlobAccess`).
    pub fn loaded_at_start(self) -> bool {
        !matches!(self, Table::Blob)
    }

    /// The table named `name`, if any.
    pub fn from_name(name: &str) -> Option<Table> {
        Table::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// One record written (`Some`) or deleted (`None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Record {
    /// Which kind of record.
    pub table: Table,
    /// Its key within the table.
    pub key: String,
    /// The new value (UTF-8 JSON, raw bytes for [`Table::Blob`]); `None` deletes the record.
    pub value: Option<Bytes>,
}

impl Record {
    /// A record holding JSON text.
    pub fn json(table: Table, key: impl Into<String>, text: &str) -> Record {
        Record {
            table,
            key: key.into(),
            value: Some(Arc::from(text.as_bytes())),
        }
    }

    /// A record holding raw bytes.
    pub fn bytes(table: Table, key: impl Into<String>, value: Bytes) -> Record {
        Record {
            table,
            key: key.into(),
            value: Some(value),
        }
    }

    /// A deletion.
    pub fn delete(table: Table, key: impl Into<String>) -> Record {
        Record {
            table,
            key: key.into(),
            value: None,
        }
    }

    /// Bytes this record costs to hold and write (key and value).
    pub fn size(&self) -> usize {
        self.key.len() + self.value.as_ref().map_or(0, |v| v.len())
    }
}

/// One action envelope, numbered with the host-global `serverSeq`.
#[derive(Clone, PartialEq, Eq)]
pub struct Event {
    /// The global sequence number; strictly increasing across all channels.
    pub seq: u64,
    /// The channel the envelope belongs to.
    pub channel: Arc<str>,
    /// The envelope as sent on the wire (`ActionEnvelope` JSON).
    pub envelope: Arc<str>,
}

impl fmt::Debug for Event {
    // Envelopes carry application payloads; debug output names the channel and size only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Event({} on {}, {} bytes)",
            self.seq,
            self.channel,
            self.envelope.len()
        )
    }
}

/// A retry receipt: a mutation's identity, a fingerprint of its input and its result.
#[derive(Clone, PartialEq, Eq)]
pub struct Receipt {
    /// Principal id; receipts are namespaced per principal.
    pub owner: String,
    /// Operation key: `dispatch:<clientId>:<clientSeq>` with the number zero-padded to 20
    /// digits (`ClientRecord::dispatch_receipt_key`), or an AXP `operationId`.
    pub key: String,
    /// SHA-256 hex of the canonical `{method, params}`.
    pub fingerprint: String,
    /// JSON text of the result returned the first time.
    pub result: Arc<str>,
}

impl fmt::Debug for Receipt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Receipt({}, {})", self.owner, self.key)
    }
}

/// Everything one durable change writes, atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Change {
    /// 1, 2, 3, … per host instance, in the order the core handed changes out. Writers
    /// commit in this order.
    pub number: u64,
    /// Bumped each time the core handles `Input::CommitFailed`. After reporting a failed
    /// transaction, a writer drops every change whose generation is at most the highest
    /// generation in that transaction: the core rolled those back.
    pub generation: u64,
    /// The durable `serverSeq` high-water mark after this change: at least its last event's
    /// number and any block reserved for numbers that are never stored (catalog events).
    pub server_seq: u64,
    /// Envelopes appended, in `seq` order.
    pub events: Vec<Event>,
    /// Receipts, keyed `(owner, key)`; one replaces any stored under its key.
    pub receipts: Vec<Receipt>,
    /// Records written or deleted, applied in order.
    pub records: Vec<Record>,
}

impl Change {
    /// Bytes this change holds (what a writer's queue budget counts).
    pub fn size(&self) -> usize {
        let events: usize = self
            .events
            .iter()
            .map(|e| e.channel.len() + e.envelope.len() + 8)
            .sum();
        let receipts: usize = self
            .receipts
            .iter()
            .map(|r| r.owner.len() + r.key.len() + r.fingerprint.len() + r.result.len())
            .sum();
        let records: usize = self.records.iter().map(Record::size).sum();
        64 + events + receipts + records
    }
}

/// One stored record, as [`crate::Store::load`] returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredRecord {
    /// Which kind of record.
    pub table: Table,
    /// Its key.
    pub key: String,
    /// Its value.
    pub value: Bytes,
}

/// What `load` hands the host at startup.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// The highest `serverSeq` mark ever committed (0 for a new store).
    pub server_seq: u64,
    /// Every record of the tables [`Table::loaded_at_start`] names, sorted by table, then key.
    pub records: Vec<StoredRecord>,
    /// The newest events, oldest first, at most the number asked for.
    pub events_tail: Vec<Event>,
}

/// Why the store could not do what was asked. A failed commit writes nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError(pub String);

impl fmt::Display for StoreError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "store: {}", self.0)
    }
}

impl std::error::Error for StoreError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_stable() {
        for t in Table::ALL {
            assert_eq!(Table::from_name(t.name()), Some(t));
        }
        assert_eq!(Table::State.name(), "state");
        assert_eq!(Table::Client.name(), "client");
        assert_eq!(Table::BlobAccess.name(), "blob_access");
        assert_eq!(Table::SigningKey.name(), "signing_key");
        assert_eq!(Table::Memory.name(), "memory");
        assert!(Table::Memory.loaded_at_start());
        assert!(!Table::Blob.loaded_at_start());
        assert!(Table::BlobAccess.loaded_at_start());
        assert_eq!(Table::from_name("nope"), None);
    }

    #[test]
    fn debug_output_never_shows_payloads() {
        let e = Event {
            seq: 3,
            channel: "ahp-chat:/s".into(),
            envelope: "{\"secret\":1}".into(),
        };
        assert!(!format!("{e:?}").contains("secret"));
        let r = Receipt {
            owner: "p".into(),
            key: "k".into(),
            fingerprint: "f".into(),
            result: "\"secret\"".into(),
        };
        assert!(!format!("{r:?}").contains("secret"));
    }
}
