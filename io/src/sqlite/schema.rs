//! Opening the database: the owner lock, private files, pragmas, the schema and its
//! migrations.
//!
//! The repository binding (`meta.repository`, see the `sqlite` module docs) is checked or
//! written in the same transaction, after the tables exist.
//!
//! Migrations run in the schema transaction, so a file is either still at its old version or
//! wholly at the new one:
//! - version 1 lacked `clients.dispatched`: a binding dispatched if `last_client_seq > 0` or it
//!   has a dispatch receipt (`dispatch:<id>:<seq>`) under its owner (`clientSeq` 0 leaves only
//!   the receipt);
//! - version 2 kept `records(key, value TEXT)` and `clients(id, owner, last_client_seq,
//!   dispatched)` apart: records rows become `state` records, clients rows `client` records
//!   holding the binding as the core writes it (`ClientRecord::to_record`);
//! - version 3 indexed events by `(channel, seq)`: that index makes way for `events_stream`
//!   (see the `sqlite` module docs), built in the same transaction;
//! - version 4 wrote dispatch receipt keys as `dispatch:<id>:<seq>` with the number as is: they
//!   are rewritten as the core writes them now (`ClientRecord::dispatch_receipt_key`, the number
//!   zero-padded to 20 digits), so a binding's newest receipt is one index seek away.

use std::ffi::OsString;
use std::fs::{self, OpenOptions};
use std::io;
#[cfg(unix)]
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use axhost_core::{ClientRecord, Table};
use rusqlite::{
    params, Connection, ErrorCode, OptionalExtension, Transaction, TransactionBehavior,
};

use super::{OpenError, BUSY_TIMEOUT, META_REPOSITORY, META_SERVER_SEQ};

/// WAL pages after which a commit copies the WAL into the database (SQLite's default is
/// 1,000; 64 MiB of 4 KiB pages). A dispatch dirties ~3 pages, most of them leaves the next
/// dispatches of the same sessions dirty again; a checkpoint copies each page once however
/// often the WAL holds it, so a longer WAL copies fewer pages per change (4,096 over 1,000:
/// +10% durable changes/s at 64 writers; 16,384 over 4,096: +8%, `docs/performance.md`). The
/// price: the commit that checkpoints pauses the writer longer (echo p99 at 64 writers 11.6 ->
/// 16.5 ms), the file takes up to 64 MiB more, and a restart replays a longer WAL.
const WAL_AUTOCHECKPOINT_PAGES: i64 = 16384;

/// Bytes the WAL file keeps after a checkpoint resets it (twice what `WAL_AUTOCHECKPOINT_PAGES`
/// fill at 4 KiB pages): one large transaction does not leave a larger file behind.
const JOURNAL_SIZE_LIMIT: i64 = 128 << 20;

/// The schema this build writes and reads.
pub const SCHEMA_VERSION: i64 = 5;

const SCHEMA_SQL: &str = concat!(
    r#"
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS records(tbl TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY(tbl, key));
CREATE TABLE IF NOT EXISTS events(seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, envelope TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS events_stream ON events("#,
    stream_of!("channel"),
    r#", seq);
CREATE TABLE IF NOT EXISTS receipts(owner TEXT, key TEXT, fingerprint TEXT, result TEXT, PRIMARY KEY(owner, key));
"#
);

/// Version 1 to 2 (see the module docs).
const MIGRATE_1_TO_2: &str = "
ALTER TABLE clients ADD COLUMN dispatched INTEGER NOT NULL DEFAULT 0;
UPDATE clients SET dispatched = 1 WHERE last_client_seq > 0 OR EXISTS (
    SELECT 1 FROM receipts r
    WHERE r.owner = clients.owner AND substr(r.key, 1, length(clients.id) + 10) = 'dispatch:' || clients.id || ':'
);
";

/// Version 3 to 4: the `(channel, seq)` index goes; `SCHEMA_SQL` then builds `events_stream`.
const MIGRATE_3_TO_4: &str = "DROP INDEX IF EXISTS events_channel;";

/// Version 2 to 3, first step: the old records table makes way for the typed one (its rows are
/// copied over next, as `state` records, their text kept byte for byte).
const MIGRATE_2_TO_3_RECORDS: &str = "
ALTER TABLE records RENAME TO records_v2;
CREATE TABLE records(tbl TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY(tbl, key));
";

/// `<path>.lock`, beside the database.
pub(super) fn lock_path(path: &Path) -> PathBuf {
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

/// Takes the exclusive owner lock on `<path>.lock` (see the module docs of `sqlite`).
pub(super) fn take_owner_lock(path: &Path) -> Result<Connection, OpenError> {
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

/// Opens the write connection: applies the pragmas, creates, checks or migrates the schema and
/// binds `repository`, all in one transaction (nothing is written if the binding is refused).
pub(super) fn open_database(path: &Path, repository: &str) -> Result<Connection, OpenError> {
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
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)
        .map_err(fail("setting wal_autocheckpoint"))?;
    conn.pragma_update(None, "journal_size_limit", JOURNAL_SIZE_LIMIT)
        .map_err(fail("setting journal_size_limit"))?;
    conn.pragma_update(None, "foreign_keys", "ON")
        .map_err(fail("setting foreign_keys=ON"))?;
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(fail("starting schema setup"))?;
    match version {
        0 => {
            // Every version this code wrote is set in the same transaction as its tables, so
            // tables without a version were made by something else.
            let tables: i64 = tx
                .query_row(
                    "SELECT COUNT(*) FROM sqlite_master WHERE type = 'table'",
                    [],
                    |row| row.get(0),
                )
                .map_err(fail("reading the schema"))?;
            if tables > 0 {
                return Err(OpenError::Corrupt {
                    path: path.to_owned(),
                    problem: "tables without a schema version".into(),
                });
            }
        }
        // Older ones are migrated below.
        1..=SCHEMA_VERSION => {}
        _ => {
            return Err(OpenError::Corrupt {
                path: path.to_owned(),
                problem: format!("schema version {version}"),
            })
        }
    }
    // Each step runs for every older file, in order, so a file of any version climbs the
    // whole ladder in this one transaction.
    if version == 1 {
        tx.execute_batch(MIGRATE_1_TO_2)
            .map_err(fail("migrating the schema from version 1"))?;
    }
    if (1..=2).contains(&version) {
        migrate_2_to_3(&tx, path)?;
    }
    if (1..=3).contains(&version) {
        tx.execute_batch(MIGRATE_3_TO_4)
            .map_err(fail("migrating the schema from version 3"))?;
    }
    if (1..=4).contains(&version) {
        migrate_4_to_5(&tx, path)?;
    }
    tx.execute_batch(SCHEMA_SQL)
        .map_err(fail("creating the schema"))?;
    tx.pragma_update(None, "user_version", SCHEMA_VERSION)
        .map_err(fail("writing the schema version"))?;
    bind_repository(&tx, path, repository)?;
    tx.commit().map_err(fail("committing the schema"))?;
    Ok(conn)
}

/// Checks `meta.repository` against `repository`, writing it if the database has none yet (a
/// new database, or one made before the binding existed). Dropping the transaction after an
/// error rolls back whatever the schema setup did.
fn bind_repository(tx: &Transaction<'_>, path: &Path, repository: &str) -> Result<(), OpenError> {
    let fail = |action: &'static str| {
        move |source: rusqlite::Error| OpenError::Sqlite {
            path: path.to_owned(),
            action,
            source,
        }
    };
    let bound: Option<Option<String>> = tx
        .query_row(
            "SELECT value FROM meta WHERE key = ?1",
            params![META_REPOSITORY],
            |row| row.get(0),
        )
        .optional()
        .map_err(fail("reading the repository binding"))?;
    match bound {
        Some(Some(bound)) if bound == repository => Ok(()),
        Some(Some(bound)) => Err(OpenError::RepositoryMismatch {
            path: path.to_owned(),
            bound,
            configured: repository.to_owned(),
        }),
        Some(None) => Err(OpenError::Corrupt {
            path: path.to_owned(),
            problem: "meta.repository is NULL".into(),
        }),
        None => {
            tx.execute(
                "INSERT INTO meta(key, value) VALUES (?1, ?2)",
                params![META_REPOSITORY, repository],
            )
            .map_err(fail("binding the repository"))?;
            tracing::info!(repository, "database bound to its repository");
            Ok(())
        }
    }
}

/// Version 2 to 3 (see the module docs). The bindings are rewritten in Rust, by the core's own
/// `ClientRecord::to_record`, so a migrated binding is byte for byte what the core would write.
fn migrate_2_to_3(tx: &Transaction<'_>, path: &Path) -> Result<(), OpenError> {
    let fail = |action: &'static str| {
        move |source: rusqlite::Error| OpenError::Sqlite {
            path: path.to_owned(),
            action,
            source,
        }
    };
    tx.execute_batch(MIGRATE_2_TO_3_RECORDS)
        .map_err(fail("migrating records to version 3"))?;
    tx.execute(
        "INSERT INTO records(tbl, key, value) SELECT ?1, key, CAST(value AS BLOB) FROM records_v2",
        params![Table::State.name()],
    )
    .map_err(fail("migrating records to version 3"))?;
    let bindings = {
        let mut stmt = tx
            .prepare("SELECT id, owner, last_client_seq, dispatched FROM clients ORDER BY id")
            .map_err(fail("reading version 2 client bindings"))?;
        let rows = stmt
            .query_map([], |row| {
                Ok((
                    row.get::<_, String>(0)?,
                    row.get::<_, String>(1)?,
                    row.get::<_, i64>(2)?,
                    row.get::<_, bool>(3)?,
                ))
            })
            .map_err(fail("reading version 2 client bindings"))?;
        rows.collect::<Result<Vec<_>, _>>()
            .map_err(fail("reading version 2 client bindings"))?
    };
    {
        let mut insert = tx
            .prepare("INSERT INTO records(tbl, key, value) VALUES (?1, ?2, ?3)")
            .map_err(fail("migrating client bindings to version 3"))?;
        for (client_id, owner, last, dispatched) in bindings {
            let last_client_seq = u64::try_from(last).map_err(|_| OpenError::Corrupt {
                path: path.to_owned(),
                problem: format!("client binding {client_id:?} has a negative last_client_seq"),
            })?;
            let record = ClientRecord {
                client_id,
                owner,
                last_client_seq,
                dispatched,
            }
            .to_record();
            let value = record.value.as_deref().unwrap_or_default();
            insert
                .execute(params![record.table.name(), record.key, value])
                .map_err(fail("migrating client bindings to version 3"))?;
        }
    }
    tx.execute_batch("DROP TABLE records_v2; DROP TABLE clients;")
        .map_err(fail("dropping the version 2 tables"))?;
    Ok(())
}

/// Version 4 to 5 (see the module docs). Each dispatch receipt key is rewritten by the core's
/// own `ClientRecord::dispatch_receipt_key`, so a migrated key is byte for byte what the core
/// would write. A key is one when it is `dispatch:<clientId>:<number>` (a clientId has no `:`;
/// the match is case-sensitive, where `LIKE` would not be); anything else stays as it is.
fn migrate_4_to_5(tx: &Transaction<'_>, path: &Path) -> Result<(), OpenError> {
    let fail = |source: rusqlite::Error| OpenError::Sqlite {
        path: path.to_owned(),
        action: "migrating dispatch receipt keys to version 5",
        source,
    };
    let keys: Vec<(i64, String)> = {
        let mut stmt = tx
            .prepare("SELECT rowid, key FROM receipts WHERE substr(key, 1, 9) = 'dispatch:'")
            .map_err(fail)?;
        let rows = stmt
            .query_map([], |row| Ok((row.get(0)?, row.get(1)?)))
            .map_err(fail)?;
        rows.collect::<Result<_, _>>().map_err(fail)?
    };
    let mut update = tx
        .prepare("UPDATE receipts SET key = ?2 WHERE rowid = ?1")
        .map_err(fail)?;
    for (rowid, key) in keys {
        let Some((client_id, number)) = key["dispatch:".len()..].split_once(':') else {
            continue;
        };
        let padded = match number.parse::<u64>() {
            Ok(seq) if number.bytes().all(|b| b.is_ascii_digit()) => {
                ClientRecord::dispatch_receipt_key(client_id, seq)
            }
            _ => continue,
        };
        if padded != key {
            update.execute(params![rowid, padded]).map_err(fail)?;
        }
    }
    Ok(())
}

/// Why the `serverSeq` mark could not be read.
pub(super) enum ReadSeqError {
    Sqlite(rusqlite::Error),
    Corrupt(String),
}

/// The committed `serverSeq` (0 for a new database).
pub(super) fn read_server_seq(conn: &Connection) -> Result<u64, ReadSeqError> {
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
