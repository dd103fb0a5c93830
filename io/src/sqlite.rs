//! The durable [`Store`]: one SQLite database file, written through one transaction per change.
//!
//! Why SQLite: a single file, atomic multi-row transactions and a bundled library, so a fresh
//! machine needs nothing installed. Durability settings follow the AXP host: WAL with
//! `synchronous=FULL`, so a change the host has broadcast is on disk (the host commits *before*
//! it applies or sends anything).
//!
//! ## Owner lock
//! Two hosts on one database would both hand out `serverSeq` values and corrupt each other's
//! history. Each `SqliteStore` therefore holds an exclusive transaction on a second, tiny
//! database `<path>.lock` for its whole life. The lock is taken with `busy_timeout=0`, so a second
//! host fails at once with [`OpenError::Locked`]; the operating system drops it when the process
//! dies, so a crash never leaves a stale lock behind (unlike a pid file).
//!
//! ## Schema (version 3, in `PRAGMA user_version`)
//! - `meta(key, value)`: `server_seq` as decimal text.
//! - `records(kind, key, value)`: the core's typed records (`axhost_core::Table::name`:
//!   `state` for channel states and host bookkeeping, `client` for clientId bindings) as JSON
//!   text, keyed by `(kind, key)`.
//! - `events(seq, channel, envelope)`: committed envelopes; index on `(channel, seq)`.
//! - `receipts(owner, key, fingerprint, result)`: retry receipts, keyed per principal.
//!
//! Older files are migrated in the schema transaction: version 1 lacked `clients.dispatched`
//! (set from `last_client_seq` and the dispatch receipts); version 2 kept `records(key, value)`
//! and `clients(id, owner, last_client_seq, dispatched)` apart, which become `state` and
//! `client` rows. A database with a newer schema version is refused rather than guessed at.

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, OpenOptions};
use std::io;
#[cfg(unix)]
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axhost_core::{Change, Event, Loaded, Receipt, Record, Store, StoreError, Table};
use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};

/// The schema this build writes and reads.
pub const SCHEMA_VERSION: i64 = 3;

/// How long a statement waits for a lock held by another connection. Only this process writes
/// (the owner lock guarantees it) and in WAL mode readers never block a commit, so only a
/// writer that ignores the owner lock (an `sqlite3` shell, say) can make a commit wait, and
/// the single-threaded host waits with it. The wait is kept short: past it the commit fails,
/// the client gets an error and nothing changes.
const BUSY_TIMEOUT: Duration = Duration::from_millis(100);

/// The `meta` key holding the highest committed `serverSeq`.
const META_SERVER_SEQ: &str = "server_seq";

const SCHEMA_SQL: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS records(kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY(kind, key));
CREATE TABLE IF NOT EXISTS events(seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, envelope TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_channel ON events(channel, seq);
CREATE TABLE IF NOT EXISTS receipts(owner TEXT, key TEXT, fingerprint TEXT, result TEXT, PRIMARY KEY(owner, key));
";

/// Version 1 to 2: a binding dispatched if it has a dispatch receipt (`dispatch:<id>:<seq>`, under
/// its owner); `last_client_seq > 0` implies one, and a `clientSeq` of 0 leaves only the receipt.
const MIGRATE_1_TO_2: &str = "
ALTER TABLE clients ADD COLUMN dispatched INTEGER NOT NULL DEFAULT 0;
UPDATE clients SET dispatched = 1 WHERE last_client_seq > 0 OR EXISTS (
    SELECT 1 FROM receipts r
    WHERE r.owner = clients.owner AND substr(r.key, 1, length(clients.id) + 10) = 'dispatch:' || clients.id || ':'
);
";

/// Version 2 to 3: `records` rows become `state` records and `clients` rows `client` records
/// whose value is the binding as the core writes it (`ClientRecord` JSON).
const MIGRATE_2_TO_3: &str = "
ALTER TABLE records RENAME TO records_v2;
CREATE TABLE records(kind TEXT NOT NULL, key TEXT NOT NULL, value TEXT NOT NULL, PRIMARY KEY(kind, key));
INSERT INTO records(kind, key, value) SELECT 'state', key, value FROM records_v2;
INSERT INTO records(kind, key, value) SELECT 'client', id, json_object(
    'clientId', id, 'owner', owner, 'lastClientSeq', last_client_seq,
    'dispatched', json(CASE WHEN dispatched THEN 'true' ELSE 'false' END)
) FROM clients;
DROP TABLE records_v2;
DROP TABLE clients;
";

/// Why [`SqliteStore::open`] failed. Every message names the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// Another live `SqliteStore` (in this or another process) holds the owner lock.
    Locked {
        /// The database path that was asked for.
        path: PathBuf,
    },
    /// The database has a schema version this build does not know.
    NewerSchema {
        /// The database path.
        path: PathBuf,
        /// The `user_version` found in the file.
        found: i64,
    },
    /// The database or lock file could not be created or have its permissions set.
    Io {
        /// The file concerned.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The operating system's error.
        source: io::Error,
    },
    /// SQLite refused an open, a pragma or the schema setup.
    Sqlite {
        /// The file concerned.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// SQLite's error.
        source: rusqlite::Error,
    },
    /// The file is a SQLite database, but its contents break an invariant of this schema.
    Corrupt {
        /// The database path.
        path: PathBuf,
        /// What is wrong (never a payload).
        problem: String,
    },
}

impl fmt::Display for OpenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OpenError::Locked { path } => write!(
                f,
                "another axhost process owns {}; stop it or choose another data directory",
                path.display()
            ),
            OpenError::NewerSchema { path, found } => write!(
                f,
                "{}: database was created by a newer axhost (schema version {found}, this build \
                 reads up to {SCHEMA_VERSION})",
                path.display()
            ),
            OpenError::Io {
                path,
                action,
                source,
            } => {
                write!(f, "{}: {action}: {source}", path.display())
            }
            OpenError::Sqlite {
                path,
                action,
                source,
            } => {
                write!(f, "{}: {action}: {source}", path.display())
            }
            OpenError::Corrupt { path, problem } => {
                write!(f, "{}: database is inconsistent: {problem}", path.display())
            }
        }
    }
}

impl std::error::Error for OpenError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            OpenError::Io { source, .. } => Some(source),
            OpenError::Sqlite { source, .. } => Some(source),
            OpenError::Locked { .. }
            | OpenError::NewerSchema { .. }
            | OpenError::Corrupt { .. } => None,
        }
    }
}

/// The SQLite-backed [`Store`]. Owns the database for as long as it lives.
pub struct SqliteStore {
    /// The database. Declared before `_owner_lock` so it closes first: the lock must outlive
    /// every write.
    conn: Connection,
    /// Holds `BEGIN EXCLUSIVE` on `<path>.lock`; dropping it releases ownership.
    _owner_lock: Connection,
    path: PathBuf,
    /// The last committed `serverSeq` mark, mirrored so `commit` can refuse a change that would
    /// move it backwards without a query.
    server_seq: u64,
    /// The newest stored event's seq. Events must climb above it; they may sit below
    /// `server_seq`, which can be a reservation above every number handed out.
    last_event_seq: u64,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.path)
            .field("server_seq", &self.server_seq)
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` and takes the owner lock.
    ///
    /// The database, its lock file and (through SQLite, which copies the database's mode) its
    /// WAL files are readable by the owner only: they hold every session's content.
    pub fn open(path: &Path) -> Result<SqliteStore, OpenError> {
        // The lock comes first so that two hosts racing to open never both touch the schema.
        let owner_lock = take_owner_lock(path)?;
        let conn = open_database(path)?;
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
        let last_event_seq = conn
            .query_row("SELECT COALESCE(MAX(seq), 0) FROM events", [], |row| {
                row.get::<_, i64>(0)
            })
            .map_err(|source| OpenError::Sqlite {
                path: path.to_owned(),
                action: "reading the newest event",
                source,
            })?;
        let last_event_seq = u64::try_from(last_event_seq).map_err(|_| OpenError::Corrupt {
            path: path.to_owned(),
            problem: "negative event sequence number".into(),
        })?;
        tracing::debug!(path = %path.display(), server_seq, "opened store");
        Ok(SqliteStore {
            conn,
            _owner_lock: owner_lock,
            path: path.to_owned(),
            server_seq,
            last_event_seq,
        })
    }

    /// The database file this store owns.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes every part of `change` inside the already-open transaction `tx`.
    fn write_change(tx: &Connection, change: &Change) -> Result<(), StoreError> {
        for write in &change.records {
            let kind = write.table.name();
            match &write.value {
                Some(value) => {
                    let mut stmt = tx
                        .prepare_cached(
                            "INSERT INTO records(kind, key, value) VALUES (?1, ?2, ?3) \
                             ON CONFLICT(kind, key) DO UPDATE SET value = excluded.value",
                        )
                        .map_err(sql("preparing record write"))?;
                    stmt.execute(params![kind, write.key, value])
                        .map_err(sql("writing a record"))?;
                }
                None => {
                    let mut stmt = tx
                        .prepare_cached("DELETE FROM records WHERE kind = ?1 AND key = ?2")
                        .map_err(sql("preparing record delete"))?;
                    stmt.execute(params![kind, write.key])
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
                    event.channel,
                    event.envelope
                ])
                .map_err(sql("appending an event"))?;
            }
        }
        for r in &change.receipts {
            let mut stmt = tx
                .prepare_cached(
                    "INSERT INTO receipts(owner, key, fingerprint, result) VALUES (?1, ?2, ?3, ?4) \
                     ON CONFLICT(owner, key) DO UPDATE SET \
                     fingerprint = excluded.fingerprint, result = excluded.result",
                )
                .map_err(sql("preparing receipt write"))?;
            stmt.execute(params![r.owner, r.key, r.fingerprint, r.result])
                .map_err(sql("writing a receipt"))?;
        }
        let mut stmt = tx
            .prepare_cached(
                "INSERT INTO meta(key, value) VALUES (?1, ?2) \
                 ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            )
            .map_err(sql("preparing server_seq write"))?;
        stmt.execute(params![META_SERVER_SEQ, change.server_seq.to_string()])
            .map_err(sql("writing server_seq"))?;
        Ok(())
    }
}

/// Refuses a change that would move `serverSeq` backwards or append events out of order, so a
/// bug upstream cannot rewrite history on disk. `current` is the last committed `serverSeq`.
fn check_order(current: u64, last_event: u64, change: &Change) -> Result<(), StoreError> {
    if change.server_seq < current {
        return Err(StoreError(format!(
            "serverSeq would go backwards: {} after {current}",
            change.server_seq
        )));
    }
    let mut last = last_event;
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
    Ok(())
}

impl Store for SqliteStore {
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError> {
        // One read transaction, so the parts are from the same instant.
        let tx = self.conn.transaction().map_err(sql("starting the load"))?;
        let server_seq = read_server_seq(&tx).map_err(|e| match e {
            ReadSeqError::Sqlite(e) => sql("reading server_seq")(e),
            ReadSeqError::Corrupt(problem) => StoreError(problem),
        })?;
        let mut records = Vec::new();
        // Table by table, in the core's table order, each sorted by key.
        for table in Table::ALL {
            let mut stmt = tx
                .prepare_cached("SELECT key, value FROM records WHERE kind = ?1 ORDER BY key")
                .map_err(sql("preparing the records query"))?;
            let rows = stmt
                .query_map(params![table.name()], |row| {
                    Ok((row.get::<_, String>(0)?, row.get::<_, String>(1)?))
                })
                .map_err(sql("reading records"))?;
            for row in rows {
                let (key, value) = row.map_err(sql("reading records"))?;
                records.push(Record { table, key, value });
            }
        }
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
                    channel,
                    envelope,
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
        self.server_seq = server_seq;
        Ok(Loaded {
            server_seq,
            records,
            events_tail,
        })
    }

    fn commit(&mut self, change: &Change) -> Result<(), StoreError> {
        check_order(self.server_seq, self.last_event_seq, change)?;
        // IMMEDIATE takes the write lock up front, so the transaction cannot fail half-way for
        // want of it. Dropping `tx` without `commit` rolls everything back.
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(sql("starting a transaction"))?;
        SqliteStore::write_change(&tx, change)?;
        tx.commit().map_err(sql("committing"))?;
        self.server_seq = change.server_seq;
        if let Some(e) = change.events.last() {
            self.last_event_seq = e.seq;
        }
        Ok(())
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
            result,
        }))
    }
    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<String>, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT value FROM records WHERE kind = ?1 AND key = ?2")
            .map_err(sql("preparing the record query"))?;
        stmt.query_row(params![table.name(), key], |row| row.get::<_, String>(0))
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
            .prepare_cached(
                "SELECT seq, envelope FROM events WHERE channel = ?1 AND seq > ?2 ORDER BY seq",
            )
            .map_err(sql("preparing the channel events query"))?;
        let rows = stmt
            .query_map(params![channel, after], |row| {
                Ok((row.get::<_, i64>(0)?, row.get::<_, String>(1)?))
            })
            .map_err(sql("reading channel events"))?;
        let mut out = Vec::new();
        for row in rows {
            let (seq, envelope) = row.map_err(sql("reading a channel event"))?;
            let seq =
                u64::try_from(seq).map_err(|_| StoreError("negative sequence number".into()))?;
            out.push(Event {
                seq,
                channel: channel.to_owned(),
                envelope,
            });
        }
        Ok(out)
    }
}

/// Wraps a SQLite error with what was being done. SQLite messages never contain bound values,
/// so no payload reaches the error.
fn sql(action: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |e| StoreError(format!("sqlite: {action}: {e}"))
}

/// SQLite integers are signed; a sequence number past `i64::MAX` cannot be stored faithfully.
fn to_i64(value: u64, what: &str) -> Result<i64, StoreError> {
    i64::try_from(value).map_err(|_| StoreError(format!("{what} {value} does not fit in SQLite")))
}

fn from_i64(value: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(value).map_err(|_| StoreError(format!("stored {what} {value} is negative")))
}

enum ReadSeqError {
    Sqlite(rusqlite::Error),
    Corrupt(String),
}

/// The committed `serverSeq` (0 for a new database).
fn read_server_seq(conn: &Connection) -> Result<u64, ReadSeqError> {
    let text: Option<Option<String>> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = ?1",
            params![META_SERVER_SEQ],
            |row| row.get(0),
        )
        .optional()
        .map_err(ReadSeqError::Sqlite)?;
    match text.flatten() {
        None => Ok(0),
        Some(t) => t
            .parse::<u64>()
            .map_err(|_| ReadSeqError::Corrupt("meta.server_seq is not a number".to_owned())),
    }
}

/// `<path>.lock`, beside the database.
fn lock_path(path: &Path) -> PathBuf {
    let mut s = OsString::from(path.as_os_str());
    s.push(".lock");
    PathBuf::from(s)
}

/// Creates `path` with mode 0600 if it does not exist, and tightens it to 0600 if it does.
/// Creating it ourselves (rather than letting SQLite do it under the umask) means the file is
/// never readable by others, not even for an instant.
fn create_private(path: &Path) -> Result<(), OpenError> {
    let io_err = |action: &'static str| {
        move |source: io::Error| OpenError::Io {
            path: path.to_owned(),
            action,
            source,
        }
    };
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    options.mode(0o600);
    let file = options.open(path).map_err(io_err("creating the file"))?;
    #[cfg(unix)]
    {
        let mode = file
            .metadata()
            .map_err(io_err("reading permissions"))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            fs::set_permissions(path, fs::Permissions::from_mode(0o600))
                .map_err(io_err("restricting permissions to 0600"))?;
        }
    }
    drop(file);
    Ok(())
}

/// Whether a SQLite error means another connection holds a lock we asked for without waiting.
fn is_lock_conflict(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// Takes the exclusive owner lock on `<path>.lock` (see the module docs).
fn take_owner_lock(path: &Path) -> Result<Connection, OpenError> {
    let lock = lock_path(path);
    create_private(&lock)?;
    let lock_ref = &lock;
    let fail = |action: &'static str| {
        move |source: rusqlite::Error| {
            if is_lock_conflict(&source) {
                OpenError::Locked {
                    path: path.to_owned(),
                }
            } else {
                OpenError::Sqlite {
                    path: lock_ref.to_owned(),
                    action,
                    source,
                }
            }
        }
    };
    let conn = Connection::open(&lock).map_err(fail("opening the lock database"))?;
    conn.busy_timeout(Duration::ZERO)
        .map_err(fail("setting busy_timeout on the lock"))?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS owner(id INTEGER)")
        .map_err(fail("preparing the lock database"))?;
    conn.execute_batch("BEGIN EXCLUSIVE")
        .map_err(fail("taking the owner lock"))?;
    Ok(conn)
}

/// Opens the database, applies the pragmas and creates or checks the schema.
fn open_database(path: &Path) -> Result<Connection, OpenError> {
    create_private(path)?;
    let fail = |action: &'static str| {
        move |source: rusqlite::Error| OpenError::Sqlite {
            path: path.to_owned(),
            action,
            source,
        }
    };
    let mut conn = Connection::open(path).map_err(fail("opening the database"))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(fail("setting busy_timeout"))?;
    let version: i64 = conn
        .pragma_query_value(None, "user_version", |row| row.get(0))
        .map_err(fail("reading the schema version"))?;
    if version > SCHEMA_VERSION {
        return Err(OpenError::NewerSchema {
            path: path.to_owned(),
            found: version,
        });
    }
    let mode: String = conn
        .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
        .map_err(fail("setting journal_mode=WAL"))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(OpenError::Corrupt {
            path: path.to_owned(),
            problem: format!("journal_mode stayed {mode:?} instead of WAL"),
        });
    }
    conn.pragma_update(None, "synchronous", "FULL")
        .map_err(fail("setting synchronous=FULL"))?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(fail("setting foreign_keys=ON"))?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(fail("starting schema setup"))?;
    if version == 1 {
        tx.execute_batch(MIGRATE_1_TO_2)
            .map_err(fail("migrating the schema from version 1"))?;
    }
    if version == 1 || version == 2 {
        tx.execute_batch(MIGRATE_2_TO_3)
            .map_err(fail("migrating the schema from version 2"))?;
    }
    tx.execute_batch(SCHEMA_SQL)
        .map_err(fail("creating the schema"))?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(fail("writing the schema version"))?;
    tx.commit().map_err(fail("committing the schema"))?;
    Ok(conn)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axhost_core::{ClientRecord, RecordWrite};

    fn event(seq: u64, channel: &str) -> Event {
        Event {
            seq,
            channel: channel.into(),
            envelope: format!("{{\"seq\":{seq}}}"),
        }
    }

    fn receipt(owner: &str, key: &str, result: &str) -> Receipt {
        Receipt {
            owner: owner.into(),
            key: key.into(),
            fingerprint: "ab".repeat(32),
            result: result.into(),
        }
    }

    fn client(id: &str, owner: &str, last: u64) -> ClientRecord {
        ClientRecord {
            client_id: id.into(),
            owner: owner.into(),
            last_client_seq: last,
            dispatched: last > 0,
        }
    }

    fn write(key: &str, value: Option<&str>) -> RecordWrite {
        RecordWrite {
            table: Table::State,
            key: key.into(),
            value: value.map(str::to_owned),
        }
    }

    fn release(id: &str) -> RecordWrite {
        RecordWrite {
            table: Table::Client,
            key: id.into(),
            value: None,
        }
    }

    /// State records written and client bindings written or released, as one record list.
    fn records(
        state: Vec<RecordWrite>,
        clients: Vec<ClientRecord>,
        released: Vec<&str>,
    ) -> Vec<RecordWrite> {
        let mut out = state;
        out.extend(released.into_iter().map(release));
        out.extend(clients.iter().map(ClientRecord::write));
        out
    }

    fn state_of(loaded: &Loaded) -> Vec<(String, String)> {
        loaded
            .records
            .iter()
            .filter(|r| r.table == Table::State)
            .map(|r| (r.key.clone(), r.value.clone()))
            .collect()
    }

    fn clients_of(loaded: &Loaded) -> Vec<ClientRecord> {
        loaded
            .records
            .iter()
            .filter(|r| r.table == Table::Client)
            .map(|r| ClientRecord::parse(&r.value).expect("a binding"))
            .collect()
    }

    /// Two changes: records written, one deleted again, three events, receipts and clients.
    fn populate(store: &mut SqliteStore) {
        store
            .commit(&Change {
                server_seq: 2,
                records: records(
                    vec![write("b", Some("{\"b\":1}")), write("a", Some("{\"a\":1}"))],
                    vec![client("c1", "alice", 1)],
                    vec![],
                ),
                events: vec![event(1, "ahp-root://"), event(2, "ahp-session:/s1")],
                receipts: vec![receipt("alice", "dispatch:c1:1", "null")],
                ..Change::default()
            })
            .expect("first commit");
        store
            .commit(&Change {
                server_seq: 3,
                records: records(
                    vec![write("b", None), write("a", Some("{\"a\":2}"))],
                    vec![client("c1", "alice", 2), client("c2", "bob", 0)],
                    vec![],
                ),
                events: vec![event(3, "ahp-session:/s1")],
                receipts: vec![receipt("alice", "dispatch:c1:2", "{\"ok\":true}")],
                ..Change::default()
            })
            .expect("second commit");
    }

    fn assert_populated(store: &mut SqliteStore) {
        let loaded = store.load(10).expect("load");
        assert_eq!(loaded.server_seq, 3);
        assert_eq!(
            state_of(&loaded),
            vec![("a".to_owned(), "{\"a\":2}".to_owned())]
        );
        assert_eq!(
            loaded.events_tail,
            vec![
                event(1, "ahp-root://"),
                event(2, "ahp-session:/s1"),
                event(3, "ahp-session:/s1")
            ]
        );
        assert_eq!(
            clients_of(&loaded),
            vec![client("c1", "alice", 2), client("c2", "bob", 0)]
        );
        assert_eq!(
            store.receipt("alice", "dispatch:c1:1").expect("receipt"),
            Some(receipt("alice", "dispatch:c1:1", "null"))
        );
        assert_eq!(
            store.receipt("alice", "dispatch:c1:2").expect("receipt"),
            Some(receipt("alice", "dispatch:c1:2", "{\"ok\":true}"))
        );
        assert_eq!(
            store.receipt("bob", "dispatch:c1:1").expect("receipt"),
            None
        );
    }

    #[test]
    fn a_new_database_loads_empty() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = SqliteStore::open(&dir.path().join("x.db")).expect("open");
        assert_eq!(store.load(4096).expect("load"), Loaded::default());
    }

    #[test]
    fn channel_events_after_uses_the_index_and_matches_the_reference_store() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = SqliteStore::open(&dir.path().join("x.db")).expect("open");
        let mut mem = axhost_core::MemStore::new();
        for seq in 1..=9u64 {
            let channel = if seq % 3 == 0 { "b" } else { "a" };
            let change = Change {
                server_seq: seq,
                events: vec![event(seq, channel)],
                ..Change::default()
            };
            store.commit(&change).expect("commit");
            mem.commit(&change).expect("commit");
        }
        for (channel, after) in [("a", 0), ("a", 4), ("b", 3), ("b", 9), ("c", 0)] {
            assert_eq!(
                store.channel_events_after(channel, after).expect("sqlite"),
                mem.channel_events_after(channel, after).expect("mem"),
                "{channel} after {after}"
            );
        }
        let seqs: Vec<u64> = store
            .channel_events_after("a", 4)
            .expect("a")
            .iter()
            .map(|e| e.seq)
            .collect();
        assert_eq!(seqs, vec![5, 7, 8]);
    }

    #[test]
    fn events_may_sit_below_a_reserved_mark_but_never_below_each_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let mut store = SqliteStore::open(&path).expect("open");
        // A reservation: the mark jumps ahead of every number handed out.
        store
            .commit(&Change {
                server_seq: 1024,
                ..Change::default()
            })
            .expect("reserve");
        let change = Change {
            server_seq: 1024,
            events: vec![event(3, "a")],
            ..Change::default()
        };
        store
            .commit(&change)
            .expect("an event below the mark is fine");
        let stale = Change {
            server_seq: 1024,
            events: vec![event(3, "a")],
            ..Change::default()
        };
        assert!(
            store.commit(&stale).is_err(),
            "but never at or below the newest event"
        );
        drop(store);
        let mut store = SqliteStore::open(&path).expect("reopen");
        assert!(
            store.commit(&stale).is_err(),
            "the newest event is known after a reopen"
        );
        let next = Change {
            server_seq: 1024,
            events: vec![event(4, "a")],
            ..Change::default()
        };
        store.commit(&next).expect("the next one");
        assert_eq!(store.load(10).expect("load").server_seq, 1024);
    }

    #[test]
    fn round_trip_of_changes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = SqliteStore::open(&dir.path().join("x.db")).expect("open");
        populate(&mut store);
        assert_populated(&mut store);
    }

    #[test]
    fn the_event_tail_is_the_newest_oldest_first() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = SqliteStore::open(&dir.path().join("x.db")).expect("open");
        populate(&mut store);
        let loaded = store.load(2).expect("load");
        let seqs: Vec<u64> = loaded.events_tail.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, vec![2, 3]);
        assert!(store.load(0).expect("load").events_tail.is_empty());
    }

    #[test]
    fn a_restart_keeps_everything() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        {
            let mut store = SqliteStore::open(&path).expect("open");
            populate(&mut store);
        }
        let mut store = SqliteStore::open(&path).expect("reopen");
        assert_populated(&mut store);
        // serverSeq continues from where it was, and cannot go backwards.
        let stale = Change {
            server_seq: 2,
            ..Change::default()
        };
        assert!(store.commit(&stale).is_err());
        store
            .commit(&Change {
                server_seq: 4,
                events: vec![event(4, "c")],
                ..Change::default()
            })
            .expect("commit after restart");
    }

    #[test]
    fn a_second_owner_is_refused_until_the_first_is_gone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let first = SqliteStore::open(&path).expect("open");
        let err = SqliteStore::open(&path).expect_err("second open must fail");
        assert!(matches!(err, OpenError::Locked { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains("another axhost process owns"), "{msg}");
        assert!(msg.contains(&path.display().to_string()), "{msg}");
        drop(first);
        SqliteStore::open(&path).expect("open after the owner is gone");
    }

    #[cfg(unix)]
    #[test]
    fn files_are_private() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let mut store = SqliteStore::open(&path).expect("open");
        populate(&mut store);
        for p in [path.clone(), lock_path(&path), dir.path().join("x.db-wal")] {
            let mode = fs::metadata(&p).expect("metadata").permissions().mode();
            assert_eq!(mode & 0o777, 0o600, "{}", p.display());
        }
    }

    #[test]
    fn pragmas_and_schema_version_are_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("x.db")).expect("open");
        let q = |name: &str| -> String {
            store
                .conn
                .pragma_query_value(None, name, |row| row.get::<_, rusqlite::types::Value>(0))
                .map(|v| format!("{v:?}"))
                .expect("pragma")
        };
        assert_eq!(q("journal_mode"), "Text(\"wal\")");
        assert_eq!(q("synchronous"), "Integer(2)");
        assert_eq!(q("foreign_keys"), "Integer(1)");
        assert_eq!(q("busy_timeout"), "Integer(100)");
        assert_eq!(q("user_version"), "Integer(3)");
    }

    #[test]
    fn released_bindings_are_deleted_in_the_same_transaction() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let mut store = SqliteStore::open(&path).expect("open");
        populate(&mut store);
        store
            .commit(&Change {
                server_seq: 3,
                records: records(vec![], vec![client("c3", "bob", 0)], vec!["c2"]),
                ..Change::default()
            })
            .expect("release");
        drop(store);
        let mut store = SqliteStore::open(&path).expect("reopen");
        assert_eq!(
            clients_of(&store.load(10).expect("load")),
            vec![client("c1", "alice", 2), client("c3", "bob", 0)]
        );
    }

    #[test]
    fn a_version_1_file_gains_the_dispatched_column_from_its_receipts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        {
            // The version 1 schema, as the previous release wrote it.
            let conn = Connection::open(&path).expect("raw open");
            conn.execute_batch(
                "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
                 CREATE TABLE records(key TEXT PRIMARY KEY, value TEXT NOT NULL);
                 CREATE TABLE events(seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, envelope TEXT NOT NULL);
                 CREATE TABLE receipts(owner TEXT, key TEXT, fingerprint TEXT, result TEXT, PRIMARY KEY(owner, key));
                 CREATE TABLE clients(id TEXT PRIMARY KEY, owner TEXT NOT NULL, last_client_seq INTEGER NOT NULL);
                 INSERT INTO clients VALUES ('seq', 'alice', 4), ('zero', 'alice', 0), ('idle', 'alice', 0),
                                            ('other', 'bob', 0), ('zero2', 'bob', 0);
                 -- 'zero' dispatched with clientSeq 0; 'other' has a receipt only under alice,
                 -- which is not its owner; 'zero2' only a receipt for a longer id it prefixes.
                 INSERT INTO receipts VALUES ('alice', 'dispatch:zero:0', 'f', 'null'),
                                             ('alice', 'dispatch:other:1', 'f', 'null'),
                                             ('bob', 'dispatch:zero22:1', 'f', 'null');
                 PRAGMA user_version = 1;",
            )
            .expect("version 1 schema");
        }
        let mut store = SqliteStore::open(&path).expect("migrating open");
        let dispatched: Vec<(String, bool)> = clients_of(&store.load(10).expect("load"))
            .into_iter()
            .map(|c| (c.client_id, c.dispatched))
            .collect();
        let expected = [
            ("idle", false),
            ("other", false),
            ("seq", true),
            ("zero", true),
            ("zero2", false),
        ];
        assert_eq!(
            dispatched,
            expected.map(|(id, d)| (id.to_owned(), d)).to_vec()
        );
        let version: i64 = store
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION);
    }

    #[test]
    fn a_version_2_file_moves_its_records_and_clients_into_typed_records() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        {
            // The version 2 schema, as the previous release wrote it.
            let conn = Connection::open(&path).expect("raw open");
            conn.execute_batch(
                "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
                 CREATE TABLE records(key TEXT PRIMARY KEY, value TEXT NOT NULL);
                 CREATE TABLE events(seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, envelope TEXT NOT NULL);
                 CREATE INDEX events_channel ON events(channel, seq);
                 CREATE TABLE receipts(owner TEXT, key TEXT, fingerprint TEXT, result TEXT, PRIMARY KEY(owner, key));
                 CREATE TABLE clients(id TEXT PRIMARY KEY, owner TEXT NOT NULL, last_client_seq INTEGER NOT NULL, dispatched INTEGER NOT NULL DEFAULT 0);
                 INSERT INTO meta VALUES ('server_seq', '7');
                 INSERT INTO records VALUES ('ahp-chat:/s1', '{\"c\":1}'), ('axhost-session:/s1', '{\"m\":2}');
                 INSERT INTO events VALUES (7, 'ahp-chat:/s1', '{\"seq\":7}');
                 INSERT INTO receipts VALUES ('alice', 'dispatch:c1:3', 'f', 'null');
                 INSERT INTO clients VALUES ('c1', 'alice', 3, 1), ('idle', 'bob', 0, 0);
                 PRAGMA user_version = 2;",
            )
            .expect("version 2 schema");
        }
        let mut store = SqliteStore::open(&path).expect("migrating open");
        let loaded = store.load(10).expect("load");
        assert_eq!(loaded.server_seq, 7);
        assert_eq!(
            state_of(&loaded),
            vec![
                ("ahp-chat:/s1".to_owned(), "{\"c\":1}".to_owned()),
                ("axhost-session:/s1".to_owned(), "{\"m\":2}".to_owned()),
            ]
        );
        assert_eq!(
            clients_of(&loaded),
            vec![client("c1", "alice", 3), client("idle", "bob", 0)]
        );
        assert_eq!(loaded.events_tail, vec![event(7, "ahp-chat:/s1")]);
        assert_eq!(
            store
                .read_record(Table::Client, "c1")
                .expect("read")
                .and_then(|v| ClientRecord::parse(&v)),
            Some(client("c1", "alice", 3))
        );
        assert!(store
            .receipt("alice", "dispatch:c1:3")
            .expect("receipt")
            .is_some());
        let version: i64 = store
            .conn
            .pragma_query_value(None, "user_version", |row| row.get(0))
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION);
        drop(store);
        // A migrated file opens as a version 3 one.
        let mut store = SqliteStore::open(&path).expect("reopen");
        assert_eq!(store.load(10).expect("load"), loaded);
    }

    #[test]
    fn an_outside_writer_fails_a_commit_quickly_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let mut store = SqliteStore::open(&path).expect("open");
        populate(&mut store);
        // A writer that ignores the owner lock holds the write lock.
        let outside = Connection::open(&path).expect("outside open");
        outside
            .execute_batch("BEGIN IMMEDIATE")
            .expect("outside lock");
        let change = Change {
            server_seq: 4,
            events: vec![event(4, "c")],
            ..Change::default()
        };
        let started = std::time::Instant::now();
        assert!(store.commit(&change).is_err());
        let waited = started.elapsed();
        assert!(
            waited >= BUSY_TIMEOUT / 2 && waited < Duration::from_secs(2),
            "the loop waited {waited:?}"
        );
        outside.execute_batch("ROLLBACK").expect("outside unlock");
        assert_populated(&mut store);
        store.commit(&change).expect("commit once the lock is gone");
    }

    #[test]
    fn a_duplicate_event_seq_is_refused_and_changes_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = SqliteStore::open(&dir.path().join("x.db")).expect("open");
        populate(&mut store);
        let dup = Change {
            server_seq: 3,
            records: records(
                vec![write("a", Some("{\"a\":99}")), write("z", Some("{}"))],
                vec![client("c3", "carol", 0)],
                vec![],
            ),
            events: vec![event(3, "ahp-root://")],
            receipts: vec![receipt("alice", "dispatch:c1:3", "null")],
            ..Change::default()
        };
        assert!(store.commit(&dup).is_err());
        assert_populated(&mut store);
        assert_eq!(
            store.receipt("alice", "dispatch:c1:3").expect("receipt"),
            None
        );
    }

    #[test]
    fn a_failure_inside_the_transaction_rolls_everything_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let mut store = SqliteStore::open(&path).expect("open");
        populate(&mut store);
        // Fail the client write (records before it, events and the receipt after it): every
        // part of the same transaction must vanish with it.
        store
            .conn
            .execute_batch(
                "CREATE TEMP TRIGGER refuse_boom BEFORE INSERT ON records \
                 WHEN NEW.kind = 'client' AND NEW.value LIKE '%\"boom\"%' \
                 BEGIN SELECT RAISE(ABORT, 'injected'); END;",
            )
            .expect("trigger");
        let change = Change {
            server_seq: 5,
            records: records(
                vec![write("a", Some("{\"a\":99}")), write("z", Some("{}"))],
                vec![client("c9", "boom", 0)],
                vec![],
            ),
            events: vec![event(4, "ahp-root://"), event(5, "ahp-root://")],
            receipts: vec![receipt("alice", "dispatch:c1:3", "null")],
            ..Change::default()
        };
        let err = store.commit(&change).expect_err("injected failure");
        assert!(err.0.contains("injected"), "{err}");
        assert_populated(&mut store);
        assert_eq!(
            store.receipt("alice", "dispatch:c1:3").expect("receipt"),
            None
        );
        // The store is still usable, and the seq numbers the failed change wanted are free.
        store
            .commit(&Change {
                server_seq: 4,
                events: vec![event(4, "c")],
                ..Change::default()
            })
            .expect("commit after a failed one");
        drop(store);
        let mut store = SqliteStore::open(&path).expect("reopen");
        assert_eq!(store.load(1).expect("load").server_seq, 4);
    }

    #[test]
    fn out_of_order_changes_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut store = SqliteStore::open(&dir.path().join("x.db")).expect("open");
        let unordered = Change {
            server_seq: 2,
            events: vec![event(2, "c"), event(1, "c")],
            ..Change::default()
        };
        assert!(store.commit(&unordered).is_err());
        let past_seq = Change {
            server_seq: 1,
            events: vec![event(2, "c")],
            ..Change::default()
        };
        assert!(store.commit(&past_seq).is_err());
        let too_big = Change {
            server_seq: u64::MAX,
            events: vec![event(u64::MAX, "c")],
            ..Change::default()
        };
        assert!(store.commit(&too_big).is_err());
        assert_eq!(store.load(10).expect("load"), Loaded::default());
    }

    #[test]
    fn a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        {
            let conn = Connection::open(&path).expect("raw open");
            conn.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
                .expect("set version");
        }
        let err = SqliteStore::open(&path).expect_err("newer schema");
        assert!(
            matches!(err, OpenError::NewerSchema { found, .. } if found == SCHEMA_VERSION + 1),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("database was created by a newer axhost"),
            "{err}"
        );
    }

    #[test]
    fn a_file_that_is_not_a_database_is_a_clear_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        fs::write(
            &path,
            b"this is not a sqlite database, just some text padding it out",
        )
        .expect("write");
        let err = SqliteStore::open(&path).expect_err("not a database");
        assert!(
            err.to_string().contains(&path.display().to_string()),
            "{err}"
        );
    }
}
