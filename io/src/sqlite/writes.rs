//! The write half: [`SqliteWriter`] commits groups of changes, each group in one
//! `BEGIN IMMEDIATE` transaction (`synchronous=FULL` makes its `COMMIT` durable), on the
//! writer thread (`crate::writer`) or, unsplit, on the caller's.
//!
//! Before anything is written, the whole group is checked against what is already committed:
//! change numbers climb, the `serverSeq` mark never goes backwards, and events climb strictly
//! above the newest stored one and never above their change's mark. A bug upstream therefore
//! fails a commit instead of rewriting history on disk.

use std::fmt;
use std::path::{Path, PathBuf};

use axhost_core::{Change, Commit, StoreError};
use rusqlite::{params, Connection, TransactionBehavior};

use super::schema::{read_server_seq, ReadSeqError};
use super::{sql, to_i64, OpenError, OwnerLock, META_SERVER_SEQ};
use crate::writer::BatchStore;

/// What the next change must follow: the last committed change number (numbers restart with
/// each host, so this starts at 0 on open), `serverSeq` mark and event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Order {
    number: u64,
    server_seq: u64,
    /// Events must climb above it; they may sit below `server_seq`, which can be a
    /// reservation above every number handed out.
    last_event: u64,
}

/// Refuses a change out of order (see the module docs); returns the order after it.
fn check_order(order: Order, change: &Change) -> Result<Order, StoreError> {
    if change.number <= order.number {
        return Err(StoreError(format!(
            "change {} committed after {}",
            change.number, order.number
        )));
    }
    if change.server_seq < order.server_seq {
        return Err(StoreError(format!(
            "serverSeq would go backwards: {} after {}",
            change.server_seq, order.server_seq
        )));
    }
    let mut last = order.last_event;
    for event in &change.events {
        if event.seq <= last {
            return Err(StoreError(format!(
                "event seq {} not above {last}",
                event.seq
            )));
        }
        last = event.seq;
    }
    if last > change.server_seq {
        return Err(StoreError(format!(
            "event seq {last} above the change's serverSeq {}",
            change.server_seq
        )));
    }
    Ok(Order {
        number: change.number,
        server_seq: change.server_seq,
        last_event: last,
    })
}

/// The connection that writes, and the owner lock. See the `sqlite` module docs.
pub struct SqliteWriter {
    /// Declared before `_lock` so it closes first: the lock must outlive every write.
    conn: Connection,
    _lock: OwnerLock,
    path: PathBuf,
    /// What is committed, mirrored so the checks need no query.
    order: Order,
}

impl fmt::Debug for SqliteWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteWriter")
            .field("path", &self.path)
            .field("order", &self.order)
            .finish_non_exhaustive()
    }
}

impl SqliteWriter {
    /// Wraps the write connection `open_database` set up.
    pub(super) fn new(
        conn: Connection,
        lock: OwnerLock,
        path: &Path,
    ) -> Result<SqliteWriter, OpenError> {
        let server_seq = read_server_seq(&conn).map_err(|e| match e {
            ReadSeqError::Sqlite(source) => OpenError::Sqlite {
                path: path.to_owned(),
                action: "reading server_seq",
                source,
            },
            ReadSeqError::Corrupt(problem) => OpenError::Corrupt {
                path: path.to_owned(),
                problem,
            },
        })?;
        let last_event = conn
            .query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |row| {
                row.get::<_, i64>(0)
            })
            .map_err(|source| OpenError::Sqlite {
                path: path.to_owned(),
                action: "reading the newest event",
                source,
            })?;
        let last_event = u64::try_from(last_event).map_err(|_| OpenError::Corrupt {
            path: path.to_owned(),
            problem: "negative event sequence number".into(),
        })?;
        Ok(SqliteWriter {
            conn,
            _lock: lock,
            path: path.to_owned(),
            order: Order {
                number: 0,
                server_seq,
                last_event,
            },
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits `changes`, in order, in one transaction: all of them or none. Refuses the whole
    /// group, writing nothing, if any change is out of order (see the module docs).
    pub fn commit_group(&mut self, changes: &[&Change]) -> Result<(), StoreError> {
        let Some(last) = changes.last() else {
            return Ok(());
        };
        let mut order = self.order;
        for change in changes {
            order = check_order(order, change)?;
        }
        // IMMEDIATE takes the write lock up front, so the transaction cannot fail half-way for
        // want of it. Dropping `tx` without `commit` rolls everything back.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("starting a transaction"))?;
        for change in changes {
            write_change(&tx, change)?;
        }
        // The marks only climb (checked above), so the last one is the group's.
        let mut stmt = tx
            .prepare_cached(
                "INSERT INTO meta(key, value) VALUES (?1, ?2) \
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )
            .map_err(sql("preparing server_seq write"))?;
        stmt.execute(params![META_SERVER_SEQ, last.server_seq.to_string()])
            .map_err(sql("writing server_seq"))?;
        drop(stmt);
        tx.commit().map_err(sql("committing"))?;
        self.order = order;
        Ok(())
    }

    /// The connection, for tests that inspect the file or inject failures.
    #[cfg(test)]
    pub(super) fn conn(&self) -> &Connection {
        &self.conn
    }
}

/// Writes every part of `change` inside the already-open transaction `tx`.
fn write_change(tx: &Connection, change: &Change) -> Result<(), StoreError> {
    for record in &change.records {
        let table = record.table.name();
        match &record.value {
            Some(value) => {
                let mut stmt = tx
                    .prepare_cached(
                        "INSERT INTO records(tbl, key, value) VALUES (?1, ?2, ?3) \
                         ON CONFLICT(tbl, key) DO UPDATE SET value = excluded.value",
                    )
                    .map_err(sql("preparing record write"))?;
                stmt.execute(params![table, record.key, &value[..]])
                    .map_err(sql("writing a record"))?;
            }
            None => {
                let mut stmt = tx
                    .prepare_cached("DELETE FROM records WHERE tbl = ?1 AND key = ?2")
                    .map_err(sql("preparing record delete"))?;
                stmt.execute(params![table, record.key])
                    .map_err(sql("deleting a record"))?;
            }
        }
    }
    if !change.events.is_empty() {
        let mut stmt = tx
            .prepare_cached("INSERT INTO events(seq, channel, envelope) VALUES (?1, ?2, ?3)")
            .map_err(sql("preparing event insert"))?;
        for event in &change.events {
            stmt.execute(params![
                to_i64(event.seq, "event seq")?,
                &*event.channel,
                &*event.envelope
            ])
            .map_err(sql("appending an event"))?;
        }
    }
    if !change.receipts.is_empty() {
        let mut stmt = tx
            .prepare_cached(
                "INSERT INTO receipts(owner, key, fingerprint, result) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT(owner, key) DO UPDATE SET \
                 fingerprint = excluded.fingerprint, result = excluded.result",
            )
            .map_err(sql("preparing receipt write"))?;
        for r in &change.receipts {
            stmt.execute(params![r.owner, r.key, r.fingerprint, &*r.result])
                .map_err(sql("writing a receipt"))?;
        }
    }
    Ok(())
}

impl Commit for SqliteWriter {
    /// One change, one transaction.
    fn commit(&mut self, change: &Change) -> Result<(), StoreError> {
        self.commit_group(&[change])
    }
}

impl BatchStore for SqliteWriter {
    type Change = Box<Change>;

    fn commit_batch(&mut self, batch: &[Box<Change>]) -> Result<(), StoreError> {
        let changes: Vec<&Change> = batch.iter().map(|c| &**c).collect();
        self.commit_group(&changes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axhost_core::log::store::event;

    fn change(number: u64, server_seq: u64, seqs: &[u64]) -> Change {
        Change {
            number,
            server_seq,
            events: seqs.iter().map(|&s| event(s, "c", "{}")).collect(),
            ..Change::default()
        }
    }

    #[test]
    fn the_order_checks() {
        let start = Order::default();
        let after = check_order(start, &change(1, 3, &[1, 2])).expect("in order");
        assert_eq!(
            after,
            Order {
                number: 1,
                server_seq: 3,
                last_event: 2
            }
        );
        // Numbers climb (gaps are fine: changes a failure covered are never committed).
        assert!(check_order(after, &change(1, 3, &[])).is_err());
        assert!(check_order(after, &change(5, 3, &[])).is_ok());
        // The mark never goes back; events climb above the last one and stay under the mark.
        assert!(check_order(after, &change(2, 2, &[])).is_err());
        assert!(check_order(after, &change(2, 9, &[2])).is_err());
        assert!(check_order(after, &change(2, 9, &[4, 3])).is_err());
        assert!(check_order(after, &change(2, 3, &[4])).is_err());
        // An event below a reserved mark is fine.
        assert!(check_order(after, &change(2, 1024, &[3])).is_ok());
    }
}
