//! The write half: [`SqliteWriter`] commits groups of changes, each group in one
//! `BEGIN IMMEDIATE` transaction (`synchronous=FULL` makes its `COMMIT` durable), on the
//! writer thread (`crate::writer`) or, unsplit, on the caller's.
//!
//! A group is made durable by appending its changes to the journal, and applied to the tables
//! later, many groups per transaction ([`SqliteWriter::apply`]; why and how reads see the gap:
//! `sqlite/journal.rs`). A group with a change larger than [`DIRECT_BYTES`] (a blob upload)
//! is written to the tables directly, after everything pending, so its bytes are written once.
//!
//! Before anything is written, the whole group is checked against what is already committed:
//! change numbers climb, the `serverSeq` mark never goes backwards, and events climb strictly
//! above the newest stored one and never above their change's mark. A bug upstream therefore
//! fails a commit instead of rewriting history on disk.

use std::fmt;
use std::path::{Path, PathBuf};

use std::sync::Arc;

use axhost_core::{Change, Commit, StoreError};
use rusqlite::{params, Connection, TransactionBehavior};

use super::journal::{self, SharedPending};
use super::schema::{read_server_seq, ReadSeqError};
use super::{sql, to_i64, OpenError, OwnerLock, META_SERVER_SEQ};
use crate::writer::BatchStore;

/// Pending changes that make an apply due after a commit: enough that each scattered leaf
/// is written once for many changes, few enough that an apply is a few milliseconds.
pub(crate) const APPLY_BATCH: usize = 512;

/// Pending changes past which a group is refused until an apply succeeds: the bound on what
/// the journal holds in memory if applying keeps failing.
const PENDING_MAX: usize = 65_536;

/// A change this large (its [`Change::size`]) is written to the tables directly.
pub(crate) const DIRECT_BYTES: usize = 256 << 10;

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
    // Everything the tables could refuse later is refused now: a journaled change is durable,
    // so its apply must not fail for what it holds (the tables' keys are upserts or climb).
    to_i64(change.server_seq, "serverSeq")?;
    let mut last = order.last_event;
    for event in &change.events {
        to_i64(event.seq, "event seq")?;
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
    /// Journaled changes not yet applied, shared with the reader.
    pending: SharedPending,
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
        pending: SharedPending,
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
            pending,
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Commits `changes`, in order, in one transaction: all of them or none. Refuses the whole
    /// group, writing nothing, if any change is out of order (see the module docs). The
    /// changes are journaled (or, with one over [`DIRECT_BYTES`], written to the tables after
    /// everything pending is applied).
    pub fn commit_group(&mut self, changes: &[&Change]) -> Result<(), StoreError> {
        let Some(last) = changes.last() else {
            return Ok(());
        };
        let mut order = self.order;
        for change in changes {
            order = check_order(order, change)?;
        }
        let direct = changes.iter().any(|c| c.size() > DIRECT_BYTES);
        if direct || self.pending_len() >= PENDING_MAX {
            // Both need the tables current: a direct write must follow what is pending, and
            // a full journal must shrink before it grows.
            self.apply(usize::MAX)?;
        }
        // IMMEDIATE takes the write lock up front, so the transaction cannot fail half-way for
        // want of it. Dropping `tx` without `commit` rolls everything back.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("starting a transaction"))?;
        let mut journaled = Vec::new();
        if direct {
            for change in changes {
                write_change(&tx, change)?;
            }
        } else {
            let mut stmt = tx
                .prepare_cached("INSERT INTO journal(body) VALUES (?1)")
                .map_err(sql("preparing the journal append"))?;
            for change in changes {
                stmt.execute(params![journal::encode(change)])
                    .map_err(sql("appending to the journal"))?;
                journaled.push(tx.last_insert_rowid());
            }
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
        if !journaled.is_empty() {
            let mut pending = journal::lock(&self.pending);
            for (id, change) in journaled.into_iter().zip(changes) {
                pending.push(id, Arc::new((*change).clone()));
            }
        }
        Ok(())
    }

    /// Journaled changes not yet applied.
    pub fn pending_len(&self) -> usize {
        journal::lock(&self.pending).len()
    }

    /// Applies up to `max` of the oldest journaled changes to the tables and deletes their
    /// journal rows, in one transaction; returns how many. On `Err` nothing changed, and the
    /// changes stay pending (and durable in the journal) for the next try.
    pub fn apply(&mut self, max: usize) -> Result<usize, StoreError> {
        let batch = journal::lock(&self.pending).oldest(max);
        let Some(&(through, _)) = batch.last() else {
            return Ok(0);
        };
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("starting an apply"))?;
        for (_, change) in &batch {
            write_change(&tx, change)?;
        }
        tx.execute("DELETE FROM journal WHERE id <= ?1", params![through])
            .map_err(sql("trimming the journal"))?;
        tx.commit().map_err(sql("committing an apply"))?;
        journal::lock(&self.pending).applied(through);
        Ok(batch.len())
    }

    /// The connection, for tests that inspect the file or inject failures.
    #[cfg(test)]
    pub(super) fn conn(&self) -> &Connection {
        &self.conn
    }
}

/// Applies every row the journal holds, oldest first, inside the already-open transaction `tx`,
/// and empties it; returns how many. Opening a database calls it before anything is read.
pub(super) fn apply_journal(tx: &Connection) -> Result<usize, StoreError> {
    let rows: Vec<Vec<u8>> = {
        let mut stmt = tx
            .prepare("SELECT body FROM journal ORDER BY id")
            .map_err(sql("reading the journal"))?;
        let rows = stmt
            .query_map([], |row| row.get::<_, Vec<u8>>(0))
            .map_err(sql("reading the journal"))?;
        rows.collect::<Result<_, _>>()
            .map_err(sql("reading the journal"))?
    };
    for body in &rows {
        write_change(tx, &journal::decode(body)?)?;
    }
    tx.execute("DELETE FROM journal", [])
        .map_err(sql("emptying the journal"))?;
    Ok(rows.len())
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

    fn catch_up(&mut self, idle: bool) -> bool {
        let pending = self.pending_len();
        if pending == 0 || (!idle && pending < APPLY_BATCH) {
            return pending > 0;
        }
        if let Err(e) = self.apply(usize::MAX) {
            // Durable in the journal all the same; the next catch-up tries again.
            tracing::warn!(error = %e, pending, "applying the journal failed");
        }
        self.pending_len() > 0
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
        // Past what SQLite stores: refused before it is journaled, never at its apply.
        let top = i64::MAX as u64;
        assert!(check_order(after, &change(2, top, &[top])).is_ok());
        assert!(check_order(after, &change(2, top + 1, &[4])).is_err());
        assert!(check_order(after, &change(2, u64::MAX, &[top + 1])).is_err());
    }
}
