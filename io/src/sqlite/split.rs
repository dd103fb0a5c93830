//! The store split in two for the writer thread: [`SqliteWriter`] owns the connection that
//! writes (and the owner lock), and commits groups of changes for [`crate::writer`]; the
//! [`SqliteStore`] left on the event loop reads through a second, read-only connection.
//!
//! Both connections are on the same WAL database: a reader's transaction sees every
//! transaction committed before it began, so what the writer reported durable is visible to
//! the loop's next read. The loop never holds a read transaction across turns (each query
//! ends its statement), so it never pins an old snapshot or stops checkpoints for long.

use axhost_core::{Change, StoreError};
use rusqlite::{Connection, TransactionBehavior};

use super::{check_order, sql, SqliteStore};
use crate::writer::{BatchStore, QueuedChange};

/// The write half of a split store: lives on the writer thread.
pub struct SqliteWriter {
    /// Declared before `_owner_lock` so it closes first: the lock must outlive every write.
    conn: Connection,
    _owner_lock: Connection,
    /// The last committed `serverSeq` mark and newest event, as in [`SqliteStore`].
    server_seq: u64,
    last_event_seq: u64,
}

impl std::fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SqliteWriter")
            .field("server_seq", &self.server_seq)
            .finish_non_exhaustive()
    }
}

impl SqliteWriter {
    pub(super) fn new(
        conn: Connection,
        owner_lock: Connection,
        server_seq: u64,
        last_event_seq: u64,
    ) -> SqliteWriter {
        SqliteWriter {
            conn,
            _owner_lock: owner_lock,
            server_seq,
            last_event_seq,
        }
    }
}

impl BatchStore for SqliteWriter {
    type Change = Box<Change>;

    /// One `BEGIN IMMEDIATE` for the whole group; `synchronous=FULL` makes its `COMMIT` durable.
    fn commit_batch(&mut self, batch: &[Box<Change>]) -> Result<(), StoreError> {
        let (mut server_seq, mut last_event_seq) = (self.server_seq, self.last_event_seq);
        for change in batch {
            check_order(server_seq, last_event_seq, change)?;
            server_seq = change.server_seq;
            if let Some(e) = change.events.last() {
                last_event_seq = e.seq;
            }
        }
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("starting a transaction"))?;
        for change in batch {
            SqliteStore::write_change(&tx, change)?;
        }
        tx.commit().map_err(sql("committing"))?;
        self.server_seq = server_seq;
        self.last_event_seq = last_event_seq;
        Ok(())
    }
}

impl QueuedChange for Box<Change> {
    fn number(&self) -> u64 {
        self.number
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    /// The strings it holds plus a fixed charge per part; close enough for a memory bound.
    fn queued_bytes(&self) -> u64 {
        const PART: usize = 64;
        let events: usize = self
            .events
            .iter()
            .map(|e| e.channel.len() + e.envelope.len() + PART)
            .sum();
        let receipts: usize = self
            .receipts
            .iter()
            .map(|r| r.owner.len() + r.key.len() + r.fingerprint.len() + r.result.len() + PART)
            .sum();
        let records: usize = self
            .records
            .iter()
            .map(|r| r.key.len() + r.value.as_ref().map_or(0, String::len) + PART)
            .sum();
        (std::mem::size_of::<Change>() + events + receipts + records) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::OpenError;
    use crate::writer::{Outcome, Writer, WriterLimits};
    use axhost_core::{Event, Receipt, RecordWrite, Store, Table};
    use std::time::Duration;

    fn change(number: u64, seq: u64) -> Box<Change> {
        Box::new(Change {
            number,
            generation: 0,
            server_seq: seq,
            events: vec![Event {
                seq,
                channel: "ahp-chat:/s1".into(),
                envelope: format!("{{\"seq\":{seq}}}"),
            }],
            receipts: vec![Receipt {
                owner: "alice".into(),
                key: format!("dispatch:c1:{number}"),
                fingerprint: "ab".repeat(32),
                result: "null".into(),
            }],
            records: vec![RecordWrite {
                table: Table::State,
                key: "ahp-chat:/s1".into(),
                value: Some(format!("{{\"n\":{number}}}")),
            }],
        })
    }

    fn wait(writer: &mut Writer<Box<Change>>) -> Outcome {
        writer
            .wait_outcome(Duration::from_secs(10))
            .expect("an outcome")
    }

    #[test]
    fn the_loop_reads_what_the_writer_thread_made_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let (mut reader, store) = SqliteStore::open(&path)
            .expect("open")
            .split()
            .expect("split");
        let mut writer = Writer::start(store, WriterLimits::default(), || {}).expect("start");
        writer.submit(change(1, 1));
        assert_eq!(wait(&mut writer), Outcome::Durable { through: 1 });
        // Reported durable, so the read connection sees it.
        assert!(reader
            .receipt("alice", "dispatch:c1:1")
            .expect("read")
            .is_some());
        assert_eq!(
            reader
                .read_record(Table::State, "ahp-chat:/s1")
                .expect("read")
                .as_deref(),
            Some("{\"n\":1}")
        );
        for n in 2..=20 {
            writer.submit(change(n, n));
        }
        let mut through = 0;
        while through < 20 {
            match wait(&mut writer) {
                Outcome::Durable { through: t } => through = t,
                other => panic!("{other:?}"),
            }
        }
        let events = reader
            .channel_events_after("ahp-chat:/s1", 0)
            .expect("events");
        assert_eq!(events.len(), 20);
        assert_eq!(reader.load(4).expect("load").server_seq, 20);
        // The loop's half cannot write, and a second host is refused while the writer lives.
        assert!(reader.commit(&change(21, 21)).is_err());
        assert!(matches!(
            SqliteStore::open(&path),
            Err(OpenError::Locked { .. })
        ));
        assert!(writer.finish(Duration::from_secs(10)));
        drop(reader);
        let mut reopened = SqliteStore::open(&path).expect("the lock went with the writer");
        assert_eq!(reopened.load(1).expect("load").server_seq, 20);
    }

    #[test]
    fn a_change_out_of_order_fails_alone_and_the_group_before_it_is_durable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let (mut reader, mut store) = SqliteStore::open(&path)
            .expect("open")
            .split()
            .expect("split");
        // Three in one transaction, the third going backwards: the first two commit.
        let batch = [change(1, 1), change(2, 2), change(3, 1)];
        assert!(store.commit_batch(&batch).is_err());
        assert_eq!(
            reader.load(4).expect("load").server_seq,
            0,
            "all or nothing"
        );
        assert!(store.commit_batch(&batch[..2]).is_ok());
        assert_eq!(reader.load(4).expect("load").server_seq, 2);
        assert!(store.commit_batch(&batch[2..]).is_err());
        assert!(store.commit_batch(&[change(3, 3)]).is_ok());
        assert_eq!(reader.load(4).expect("load").server_seq, 3);
    }
}
