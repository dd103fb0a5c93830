//! The durable store: one SQLite database file, read on the event loop and written on the
//! writer thread, a group of changes per transaction.
//!
//! Why SQLite: a single file, atomic multi-row transactions and a bundled library, so a fresh
//! machine needs nothing installed. Durability settings follow the AXP host: WAL with
//! `synchronous=FULL`, so a change reported durable is on disk (the core reveals a change only
//! after that report).
//!
//! ## Two halves
//! [`SqliteStore::open`] takes the owner lock, sets up or migrates the schema, binds the
//! repository and opens two connections to the same WAL database. [`SqliteStore::split`] hands them out:
//! [`SqliteReader`] (`query_only`) is the core's [`axhost_core::Store`] on the event loop, and
//! [`SqliteWriter`] commits on the writer thread (`crate::writer`), every change queued in one
//! `BEGIN IMMEDIATE` transaction. A reader's statement sees every transaction committed before
//! it began, so what the writer reported durable is visible to the loop's next read. Unsplit, a
//! `SqliteStore` is both (one transaction per change), for tests and tools.
//!
//! ## Owner lock
//! Two hosts on one database would both hand out `serverSeq` values and corrupt each other's
//! history. The store therefore holds an exclusive transaction on a second, tiny database
//! `<path>.lock` for as long as either half lives (so a writer thread that died still leaves the
//! database owned while its host runs). The lock is taken with `busy_timeout=0`, so a second host
//! fails at once with [`OpenError::Locked`]; the operating system drops it when the process dies,
//! so a crash never leaves a stale lock behind (unlike a pid file).
//!
//! ## Schema (version 5, in `PRAGMA user_version`)
//! - `meta(key, value)`: `server_seq` as decimal text; `repository`, the repository name the
//!   database belongs to.
//! - `records(tbl, key, value)`: the core's typed records, keyed by the table's stable name
//!   (`axhost_core::Table::name`) and the key; the value is a BLOB (JSON for every table so
//!   far). New tables need no schema change.
//! - `events(seq, channel, envelope)`: committed envelopes, indexed by `(stream, seq)`
//!   (`events_stream`), where a channel's stream is its session id for the channels of a
//!   session (`ahp-chat:/ID`, `ahp-session:/ID`, `axp-session:/ID`, ...) and the channel itself
//!   for the singletons (`ahp-root://`, ...). A channel's history is a range of its stream with
//!   the other channels filtered out. Why not `(channel, seq)`: a dispatch adds an event to its
//!   chat and one to its session channel, and under that key they sit on two index leaves;
//!   under the stream they share one, so a group commit of N sessions' dispatches writes N
//!   leaves instead of 2N (+17% durable changes/s at 64 writers, `docs/performance.md`).
//! - `receipts(owner, key, fingerprint, result)`: retry receipts, keyed per principal. A
//!   dispatch's key ends in its `clientSeq` zero-padded to 20 digits, so a clientId binding's
//!   newest receipt, which carries its `lastClientSeq`, is one seek down the `(owner, key)`
//!   index (`Store::last_receipt_key`); the binding's record is then written only once, at its
//!   first dispatch, not with every dispatch (one leaf fewer per change).
//!
//! Older files are migrated in the schema transaction (`sqlite/schema.rs`). A database with a
//! newer schema version is refused rather than guessed at.
//!
//! ## Repository binding
//! A host serves one repository (`repository` in `axhost.toml`), and every AXP exchange it
//! creates names it. The first open writes the name to `meta.repository` in the schema
//! transaction, so a database is never without it once its schema exists; every later open
//! must name the same repository or fails with [`OpenError::RepositoryMismatch`], before
//! anything is read or written. (As in the AXP host, a database made by an older build, which
//! has no name yet, is adopted by the first repository that opens it: such a build served no AXP
//! exchanges that could name another.) Moving a database to another repository name is not
//! supported: keep the name, or start a new data directory.

/// SQL for the stream of the channel `$c` (a column or a parameter; see "Schema"): the text
/// after `:/` for a session's channels, the whole channel for a `scheme://` singleton. The
/// index and the queries spell it through this one macro: SQLite uses an expression index only
/// for the very same expression.
macro_rules! stream_of {
    ($c:literal) => {
        concat!(
            "CASE WHEN instr(",
            $c,
            ", '://') > 0 THEN ",
            $c,
            " ELSE substr(",
            $c,
            ", instr(",
            $c,
            ", ':/') + 2) END"
        )
    };
}

mod reads;
mod schema;
mod writes;

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axhost_core::{Bytes, Change, Commit, Event, Loaded, Receipt, Store, StoreError, Table};
use rusqlite::Connection;

pub use reads::SqliteReader;
pub use schema::SCHEMA_VERSION;
pub use writes::SqliteWriter;

/// How long a statement waits for a lock held by another connection. Only this process writes
/// (the owner lock guarantees it) and in WAL mode readers never block a commit, so only a
/// writer that ignores the owner lock (an `sqlite3` shell, say) can make a commit wait. The
/// wait is kept short: past it the commit fails, the clients get errors and nothing changes.
const BUSY_TIMEOUT: Duration = Duration::from_millis(100);

/// The `meta` key holding the highest committed `serverSeq`.
const META_SERVER_SEQ: &str = "server_seq";

/// The `meta` key holding the repository the database belongs to.
const META_REPOSITORY: &str = "repository";

/// Why [`SqliteStore::open`] failed. Every message names the file.
#[derive(Debug)]
#[non_exhaustive]
pub enum OpenError {
    /// Another live store (in this or another process) holds the owner lock.
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
    /// The database belongs to another repository than the one the host was configured with.
    RepositoryMismatch {
        /// The database path.
        path: PathBuf,
        /// The repository bound to the database (on its first start).
        bound: String,
        /// The repository asked for (`repository` in `axhost.toml`).
        configured: String,
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
            } => write!(f, "{}: {action}: {source}", path.display()),
            OpenError::Sqlite {
                path,
                action,
                source,
            } => write!(f, "{}: {action}: {source}", path.display()),
            OpenError::RepositoryMismatch {
                path,
                bound,
                configured,
            } => write!(
                f,
                "{}: this database belongs to repository {bound:?}, but the configuration names \
                 repository {configured:?}; set `repository = {bound:?}` in axhost.toml, or use \
                 another data directory for {configured:?}",
                path.display()
            ),
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
            | OpenError::RepositoryMismatch { .. }
            | OpenError::Corrupt { .. } => None,
        }
    }
}

/// The exclusive transaction on `<path>.lock`, shared by both halves of a store: ownership
/// ends when the last of them is dropped. (`Connection` is not `Sync`; the mutex makes the
/// share sendable to the writer thread, and nothing ever locks it.)
#[derive(Clone)]
struct OwnerLock(#[allow(dead_code)] Arc<Mutex<Connection>>);

/// The SQLite store, unsplit: reads and commits on the caller's thread. See the module docs.
pub struct SqliteStore {
    reader: SqliteReader,
    writer: SqliteWriter,
    repository: String,
}

impl fmt::Debug for SqliteStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SqliteStore")
            .field("path", &self.reader.path())
            .finish_non_exhaustive()
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path` for `repository`, takes the owner
    /// lock, creates or migrates the schema and binds the repository (see the module docs): a
    /// database bound to another repository is refused with
    /// [`OpenError::RepositoryMismatch`]. The caller has checked the name (the config does).
    ///
    /// The database, its lock file and (through SQLite, which copies the database's mode) its
    /// WAL files are readable by the owner only: they hold every session's content.
    pub fn open(path: &Path, repository: &str) -> Result<SqliteStore, OpenError> {
        // The lock comes first so that two hosts racing to open never both touch the schema.
        let lock = OwnerLock(Arc::new(Mutex::new(schema::take_owner_lock(path)?)));
        let conn = schema::open_database(path, repository)?;
        let writer = SqliteWriter::new(conn, lock.clone(), path)?;
        let reader = SqliteReader::open(path, lock)?;
        tracing::debug!(path = %path.display(), repository, "opened store");
        Ok(SqliteStore {
            reader,
            writer,
            repository: repository.to_owned(),
        })
    }

    /// The repository the database is bound to (the one it was opened for).
    pub fn repository(&self) -> &str {
        &self.repository
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        self.reader.path()
    }

    /// Splits the store for the writer thread: the reader stays on the event loop, the writer
    /// goes to the thread. The owner lock lives until both are dropped.
    pub fn split(self) -> (SqliteReader, SqliteWriter) {
        (self.reader, self.writer)
    }

    /// Commits `changes`, in order, in one transaction: all of them or none.
    pub fn commit_group(&mut self, changes: &[&Change]) -> Result<(), StoreError> {
        self.writer.commit_group(changes)
    }
}

impl Store for SqliteStore {
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError> {
        self.reader.load(events_tail_max)
    }

    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError> {
        self.reader.receipt(owner, key)
    }

    fn last_receipt_key(
        &mut self,
        owner: &str,
        prefix: &str,
    ) -> Result<Option<String>, StoreError> {
        self.reader.last_receipt_key(owner, prefix)
    }

    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<Bytes>, StoreError> {
        self.reader.read_record(table, key)
    }

    fn channel_events_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.reader.channel_events_after(channel, after)
    }

    fn first_channel_event_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.reader.first_channel_event_after(channel, after)
    }
}

impl Commit for SqliteStore {
    fn commit(&mut self, change: &Change) -> Result<(), StoreError> {
        self.writer.commit(change)
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

#[cfg(test)]
mod tests;
