//! The read half: [`SqliteReader`] is the core's [`Store`] on the event loop, through its own
//! `query_only` connection.
//!
//! The loop never holds a read transaction across turns (each query ends its statement, and
//! `load` is one short transaction), so it never pins an old snapshot or holds back WAL
//! checkpoints.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axhost_core::log::store::prefix_upper_bound;
use axhost_core::{Bytes, Event, Loaded, Receipt, Store, StoreError, StoredRecord, Table};
use rusqlite::types::ValueRef;
use rusqlite::{params, Connection, OptionalExtension};

use super::schema::{read_server_seq, ReadSeqError};
use super::{from_i64, sql, OpenError, OwnerLock, BUSY_TIMEOUT};

/// The connection that reads. See the `sqlite` module docs.
pub struct SqliteReader {
    conn: Connection,
    /// Keeps the database owned while the loop runs, even if the writer thread is gone.
    _lock: OwnerLock,
    path: PathBuf,
}

impl fmt::Debug for SqliteReader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteReader")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl SqliteReader {
    /// Opens a `query_only` connection to the database the writer has set up.
    pub(super) fn open(path: &Path, lock: OwnerLock) -> Result<SqliteReader, OpenError> {
        let fail = |action: &'static str| {
            move |source: rusqlite::Error| OpenError::Sqlite {
                path: path.to_owned(),
                action,
                source,
            }
        };
        let conn = Connection::open(path).map_err(fail("opening the read connection"))?;
        conn.busy_timeout(BUSY_TIMEOUT)
            .map_err(fail("setting busy_timeout"))?;
        conn.pragma_update(None, "query_only", "ON")
            .map_err(fail("setting query_only=ON"))?;
        Ok(SqliteReader {
            conn,
            _lock: lock,
            path: path.to_owned(),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The connection, for tests that inspect pragmas.
    #[cfg(test)]
    pub(super) fn conn(&self) -> &Connection {
        &self.conn
    }
}

/// A stored value as bytes. Values are written as BLOBs; a TEXT one (an outside edit) is
/// taken as its UTF-8 bytes rather than refused.
fn blob(value: ValueRef<'_>) -> rusqlite::Result<Bytes> {
    match value {
        ValueRef::Blob(b) => Ok(Arc::from(b)),
        ValueRef::Text(t) => Ok(Arc::from(t)),
        other => Err(rusqlite::Error::FromSqlConversionFailure(
            0,
            other.data_type(),
            Box::new(rusqlite::types::FromSqlError::InvalidType),
        )),
    }
}

/// The greatest receipt key in `[?2, ?3)` under owner `?1`: one seek down the `(owner, key)`
/// index from the end of the range.
pub(super) const LAST_RECEIPT_KEY_SQL: &str = "SELECT key FROM receipts WHERE owner = ?1 \
     AND key >= ?2 AND key < ?3 ORDER BY key DESC LIMIT 1";

impl Store for SqliteReader {
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError> {
        // One read transaction, so the parts are from the same instant.
        let tx = self.conn.transaction().map_err(sql("starting the load"))?;
        let server_seq = read_server_seq(&tx).map_err(|e| match e {
            ReadSeqError::Sqlite(e) => sql("reading server_seq")(e),
            ReadSeqError::Corrupt(problem) => StoreError(problem),
        })?;
        let mut records = Vec::new();
        {
            // Tables that are not loaded (blob bytes) are not even read: a host may hold
            // gigabytes of them. Their names are the core's stable constants, not input.
            let skipped: Vec<String> = Table::ALL
                .into_iter()
                .filter(|t| !t.loaded_at_start())
                .map(|t| format!("'{}'", t.name()))
                .collect();
            let query = format!(
                "SELECT tbl, key, value FROM records WHERE tbl NOT IN ({}) ORDER BY tbl, key",
                skipped.join(",")
            );
            let mut stmt = tx
                .prepare_cached(&query)
                .map_err(sql("preparing the records query"))?;
            let mut rows = stmt.query([]).map_err(sql("reading records"))?;
            while let Some(row) = rows.next().map_err(sql("reading records"))? {
                let name: String = row.get(0).map_err(sql("reading records"))?;
                // A table this build does not know was written by a newer one: refuse, rather
                // than run without state that build relies on.
                let table = Table::from_name(&name)
                    .ok_or_else(|| StoreError(format!("records of an unknown table {name:?}")))?;
                if !table.loaded_at_start() {
                    // Blob bytes stay on disk; the core reads one when asked for it.
                    continue;
                }
                let key: String = row.get(1).map_err(sql("reading records"))?;
                let value = row
                    .get_ref(2)
                    .and_then(blob)
                    .map_err(sql("reading records"))?;
                records.push(StoredRecord { table, key, value });
            }
        }
        // By table in the core's order, then by key (SQLite's binary order is `String`'s); the
        // sort is stable, so keys stay in order.
        records.sort_by_key(|r| r.table);
        let events_tail = {
            let mut stmt = tx
                .prepare_cached(
                    "SELECT seq, channel, envelope FROM \
                     (SELECT seq, channel, envelope FROM events ORDER BY seq DESC LIMIT ?1) \
                     ORDER BY seq ASC",
                )
                .map_err(sql("preparing the events query"))?;
            let rows = stmt
                .query_map(params![i64::from(events_tail_max)], |row| {
                    Ok((
                        row.get::<_, i64>(0)?,
                        row.get::<_, String>(1)?,
                        row.get::<_, String>(2)?,
                    ))
                })
                .map_err(sql("reading events"))?;
            let mut events = Vec::new();
            for row in rows {
                let (seq, channel, envelope) = row.map_err(sql("reading events"))?;
                events.push(Event {
                    seq: from_i64(seq, "event seq")?,
                    channel: channel.into(),
                    envelope: envelope.into(),
                });
            }
            events
        };
        if let Some(newest) = events_tail.last() {
            if newest.seq > server_seq {
                return Err(StoreError(format!(
                    "event seq {} above the stored serverSeq {server_seq}",
                    newest.seq
                )));
            }
        }
        tx.commit().map_err(sql("finishing the load"))?;
        Ok(Loaded {
            server_seq,
            records,
            events_tail,
        })
    }

    fn last_receipt_key(
        &mut self,
        owner: &str,
        prefix: &str,
    ) -> Result<Option<String>, StoreError> {
        let Some(upper) = prefix_upper_bound(prefix) else {
            return Ok(None);
        };
        let mut stmt = self
            .conn
            .prepare_cached(LAST_RECEIPT_KEY_SQL)
            .map_err(sql("preparing the last receipt query"))?;
        stmt.query_row(params![owner, prefix, upper], |row| row.get::<_, String>(0))
            .optional()
            .map_err(sql("reading the last receipt key"))
    }

    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT fingerprint, result FROM receipts WHERE owner = ?1 AND key = ?2",
            )
            .map_err(sql("preparing the receipt query"))?;
        let found = stmt
            .query_row(params![owner, key], |row| {
                Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
            })
            .optional()
            .map_err(sql("reading a receipt"))?;
        Ok(found.map(|(fingerprint, result)| Receipt {
            owner: owner.to_owned(),
            key: key.to_owned(),
            fingerprint,
            result: result.into(),
        }))
    }

    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<Bytes>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT value FROM records WHERE tbl = ?1 AND key = ?2")
            .map_err(sql("preparing the record query"))?;
        stmt.query_row(params![table.name(), key], |row| {
            row.get_ref(0).and_then(blob)
        })
        .optional()
        .map_err(sql("reading a record"))
    }

    fn channel_events_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        let after =
            i64::try_from(after).map_err(|_| StoreError("sequence number out of range".into()))?;
        let mut stmt = self
            .conn
            .prepare_cached(concat!(
                "SELECT seq, envelope FROM events WHERE ",
                stream_of!("channel"),
                " = ",
                stream_of!("?1"),
                " AND channel = ?1 AND seq > ?2 ORDER BY seq"
            ))
            .map_err(sql("preparing the channel events query"))?;
        let rows = stmt
            .query_map(params![channel, after], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })
            .map_err(sql("reading channel events"))?;
        let shared: Arc<str> = Arc::from(channel);
        let mut out = Vec::new();
        for row in rows {
            let (seq, envelope) = row.map_err(sql("reading a channel event"))?;
            out.push(Event {
                seq: from_i64(seq, "event seq")?,
                channel: shared.clone(),
                envelope: envelope.into(),
            });
        }
        Ok(out)
    }

    fn first_channel_event_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Option<u64>, StoreError> {
        let after =
            i64::try_from(after).map_err(|_| StoreError("sequence number out of range".into()))?;
        let mut stmt = self
            .conn
            .prepare_cached(concat!(
                "SELECT seq FROM events WHERE ",
                stream_of!("channel"),
                " = ",
                stream_of!("?1"),
                " AND channel = ?1 AND seq > ?2 ORDER BY seq LIMIT 1"
            ))
            .map_err(sql("preparing the first channel event query"))?;
        let seq: Option<i64> = stmt
            .query_row(params![channel, after], |row| row.get(0))
            .optional()
            .map_err(sql("reading the first channel event"))?;
        seq.map(|s| from_i64(s, "event seq")).transpose()
    }
}
