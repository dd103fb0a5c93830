//! Opening a database: the owner lock, private files, pragmas, the schema version and its
//! migrations, files that are not ours, and the repository binding (`sqlite/schema.rs`).

use std::fs;
#[cfg(unix)]
use std::os::unix::fs::PermissionsExt;

use rusqlite::OptionalExtension;

use super::*;
use crate::sqlite::schema::lock_path;

#[test]
fn a_second_owner_is_refused_while_either_half_lives() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    let first = SqliteStore::open(&path, REPO).expect("open");
    let err = SqliteStore::open(&path, REPO).expect_err("second open must fail");
    assert!(matches!(err, OpenError::Locked { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("another axhost process owns"), "{msg}");
    assert!(msg.contains(&path.display().to_string()), "{msg}");
    let (reader, writer) = first.split();
    // A writer thread that died leaves the loop's reader: the database stays owned.
    drop(writer);
    assert!(matches!(
        SqliteStore::open(&path, REPO),
        Err(OpenError::Locked { .. })
    ));
    drop(reader);
    SqliteStore::open(&path, REPO).expect("open after the owner is gone");
}

#[cfg(unix)]
#[test]
fn files_are_private() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    let mut store = SqliteStore::open(&path, REPO).expect("open");
    populate(&mut store);
    for p in [path.clone(), lock_path(&path), dir.path().join("x.db-wal")] {
        let mode = fs::metadata(&p).expect("metadata").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{}", p.display());
    }
}

#[test]
fn pragmas_and_schema_version_are_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = open(&dir);
    let conn = store.writer.conn();
    assert_eq!(pragma(conn, "journal_mode"), "Text(\"wal\")");
    assert_eq!(pragma(conn, "synchronous"), "Integer(2)");
    assert_eq!(pragma(conn, "foreign_keys"), "Integer(1)");
    assert_eq!(pragma(conn, "busy_timeout"), "Integer(100)");
    assert_eq!(
        pragma(conn, "user_version"),
        format!("Integer({SCHEMA_VERSION})")
    );
    assert_eq!(pragma(conn, "wal_autocheckpoint"), "Integer(16384)");
    assert_eq!(pragma(conn, "journal_size_limit"), "Integer(134217728)");
    assert_eq!(pragma(conn, "query_only"), "Integer(0)");
    assert_eq!(pragma(store.reader.conn(), "query_only"), "Integer(1)");
    assert_eq!(pragma(store.reader.conn(), "busy_timeout"), "Integer(100)");
}

/// The schema of each earlier version, as its release wrote it.
const V1_SCHEMA: &str = "
    CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
    CREATE TABLE records(key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE events(seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, envelope TEXT NOT NULL);
    CREATE TABLE receipts(owner TEXT, key TEXT, fingerprint TEXT, result TEXT, PRIMARY KEY(owner, key));
    CREATE TABLE clients(id TEXT PRIMARY KEY, owner TEXT NOT NULL, last_client_seq INTEGER NOT NULL);";
const V2_SCHEMA: &str = "
    CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
    CREATE TABLE records(key TEXT PRIMARY KEY, value TEXT NOT NULL);
    CREATE TABLE events(seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, envelope TEXT NOT NULL);
    CREATE INDEX events_channel ON events(channel, seq);
    CREATE TABLE receipts(owner TEXT, key TEXT, fingerprint TEXT, result TEXT, PRIMARY KEY(owner, key));
    CREATE TABLE clients(id TEXT PRIMARY KEY, owner TEXT NOT NULL, last_client_seq INTEGER NOT NULL, dispatched INTEGER NOT NULL DEFAULT 0);";
/// The tables of versions 3 and 4, which differ only in how `events` is indexed.
macro_rules! typed_tables {
    () => {
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
         CREATE TABLE records(tbl TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY(tbl, key));
         CREATE TABLE events(seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, envelope TEXT NOT NULL);
         CREATE TABLE receipts(owner TEXT, key TEXT, fingerprint TEXT, result TEXT, PRIMARY KEY(owner, key));"
    };
}
const V3_SCHEMA: &str = concat!(
    typed_tables!(),
    "CREATE INDEX events_channel ON events(channel, seq);"
);
const V4_SCHEMA: &str = concat!(
    typed_tables!(),
    "CREATE INDEX events_stream ON events(",
    stream_of!("channel"),
    ", seq);"
);

/// A file at `version`, its `schema` holding `rows`; the connection that made it.
fn older_file(path: &Path, version: i64, schema: &str, rows: &str) -> Connection {
    let conn = Connection::open(path).expect("raw open");
    conn.execute_batch(schema).expect("old schema");
    conn.execute_batch(rows).expect("old rows");
    conn.pragma_update(None, "user_version", version)
        .expect("old version");
    conn
}

/// A version 2 file holding `rows`.
fn version_2_file(path: &Path, rows: &str) {
    older_file(path, 2, V2_SCHEMA, rows);
}

#[test]
fn a_version_2_file_moves_its_records_and_clients_into_typed_records() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    version_2_file(
        &path,
        "INSERT INTO meta VALUES ('server_seq', '7');
         INSERT INTO records VALUES ('ahp-chat:/s1', '{\"c\":\"é\"}'), ('axhost-session:/s1', '{\"m\":2}');
         INSERT INTO events VALUES (7, 'ahp-chat:/s1', '{\"seq\":7}');
         INSERT INTO receipts VALUES ('alice', 'dispatch:c1:3', 'f', 'null');
         INSERT INTO clients VALUES ('c1', 'alice', 3, 1), ('idle', 'bob', 0, 0), ('zero', 'bob', 0, 1);",
    );
    let mut store = SqliteStore::open(&path, REPO).expect("migrating open");
    let loaded = store.load(10).expect("load");
    assert_eq!(loaded.server_seq, 7);
    assert_eq!(
        state_of(&loaded),
        vec![
            ("ahp-chat:/s1".to_owned(), "{\"c\":\"é\"}".to_owned()),
            ("axhost-session:/s1".to_owned(), "{\"m\":2}".to_owned()),
        ]
    );
    let zero = ClientRecord {
        dispatched: true,
        ..client("zero", "bob", 0)
    };
    assert_eq!(
        clients_of(&loaded),
        vec![client("c1", "alice", 3), client("idle", "bob", 0), zero]
    );
    // Byte for byte what the core writes for the binding.
    let stored: Vec<&StoredRecord> = loaded
        .records
        .iter()
        .filter(|r| r.table == Table::Client)
        .collect();
    assert_eq!(
        stored[0].value,
        client("c1", "alice", 3).to_record().value.expect("a value")
    );
    assert_eq!(loaded.events_tail, vec![event(7, "ahp-chat:/s1")]);
    assert!(store
        .receipt("alice", &ClientRecord::dispatch_receipt_key("c1", 3))
        .expect("receipt")
        .is_some());
    let conn = store.writer.conn();
    assert_eq!(
        pragma(conn, "user_version"),
        format!("Integer({SCHEMA_VERSION})")
    );
    let old_tables: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM sqlite_master WHERE name IN ('clients', 'records_v2')",
            [],
            |row| row.get(0),
        )
        .expect("tables");
    assert_eq!(old_tables, 0);
    let types: Vec<String> = {
        let mut stmt = conn
            .prepare("SELECT DISTINCT typeof(value) FROM records")
            .expect("prepare");
        let rows = stmt.query_map([], |row| row.get(0)).expect("query");
        rows.map(|r| r.expect("row")).collect()
    };
    assert_eq!(types, vec!["blob".to_owned()]);
    drop(store);
    // A migrated file opens as a current one, and takes new changes after its history.
    let mut store = SqliteStore::open(&path, REPO).expect("reopen");
    assert_eq!(store.load(10).expect("load"), loaded);
    let mut next = change(1, 8);
    next.events = vec![event(8, "ahp-chat:/s1")];
    next.records = vec![Record::delete(Table::Client, "idle")];
    store.commit(&next).expect("commit after the migration");
    assert_eq!(clients_of(&store.load(1).expect("load")).len(), 2);
}

#[test]
fn a_failed_migration_leaves_the_file_at_its_old_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    version_2_file(
        &path,
        "INSERT INTO records VALUES ('s', '{}');
         INSERT INTO clients VALUES ('bad', 'alice', -1, 0);",
    );
    let err = SqliteStore::open(&path, REPO).expect_err("a negative clientSeq");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
    let conn = Connection::open(&path).expect("raw open");
    assert_eq!(pragma(&conn, "user_version"), "Integer(2)");
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM clients", [], |row| row.get(0))
        .expect("the old table is still there");
    assert_eq!(rows, 1);
}

#[test]
fn a_version_1_file_gains_dispatched_from_its_receipts_and_migrates_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    older_file(
        &path,
        1,
        V1_SCHEMA,
        "INSERT INTO clients VALUES ('seq', 'alice', 4), ('zero', 'alice', 0), ('idle', 'alice', 0),
                                        ('other', 'bob', 0), ('zero2', 'bob', 0);
             -- 'zero' dispatched with clientSeq 0; 'other' has a receipt only under alice,
             -- which is not its owner; 'zero2' only a receipt for a longer id it prefixes.
             INSERT INTO receipts VALUES ('alice', 'dispatch:zero:0', 'f', 'null'),
                                         ('alice', 'dispatch:other:1', 'f', 'null'),
                                         ('bob', 'dispatch:zero22:1', 'f', 'null');",
    );
    let mut store = SqliteStore::open(&path, REPO).expect("migrating open");
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
    assert_eq!(
        pragma(store.writer.conn(), "user_version"),
        format!("Integer({SCHEMA_VERSION})")
    );
}

/// The names of the indexes on `events`.
fn event_indexes(conn: &Connection) -> Vec<String> {
    let mut stmt = conn
        .prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'events' ORDER BY name")
        .expect("prepare");
    let rows = stmt.query_map([], |row| row.get(0)).expect("query");
    rows.map(|r| r.expect("row")).collect()
}

#[test]
fn a_version_3_file_trades_its_channel_index_for_the_stream_index() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    {
        let conn = older_file(
            &path,
            3,
            V3_SCHEMA,
            "INSERT INTO meta VALUES ('server_seq', '4'), ('repository', 'default');
             INSERT INTO events VALUES (1, 'ahp-chat:/s1', '{\"seq\":1}'), (2, 'ahp-session:/s1', '{\"seq\":2}'),
                                       (3, 'ahp-root://', '{\"seq\":3}'), (4, 'ahp-chat:/s1', '{\"seq\":4}');",
        );
        assert_eq!(event_indexes(&conn), vec!["events_channel".to_owned()]);
    }
    let mut store = SqliteStore::open(&path, REPO).expect("migrating open");
    let conn = store.writer.conn();
    assert_eq!(
        pragma(conn, "user_version"),
        format!("Integer({SCHEMA_VERSION})")
    );
    assert_eq!(event_indexes(conn), vec!["events_stream".to_owned()]);
    let seqs = |store: &mut SqliteStore, channel: &str| -> Vec<u64> {
        let events = store.channel_events_after(channel, 0).expect("events");
        events.iter().map(|e| e.seq).collect()
    };
    assert_eq!(seqs(&mut store, "ahp-chat:/s1"), vec![1, 4]);
    assert_eq!(seqs(&mut store, "ahp-session:/s1"), vec![2]);
    assert_eq!(seqs(&mut store, "ahp-root://"), vec![3]);
    assert_eq!(store.load(10).expect("load").server_seq, 4);
}

#[test]
fn a_version_4_file_pads_its_dispatch_receipt_numbers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    older_file(
        &path,
        4,
        V4_SCHEMA,
        "INSERT INTO meta VALUES ('server_seq', '0'), ('repository', 'default');
             -- As text, 12 sorts before 9; an AXP operationId and a look-alike stay as they are.
             INSERT INTO receipts VALUES ('alice', 'dispatch:c1:9', 'f9', 'null'),
                                         ('alice', 'dispatch:c1:12', 'f12', 'null'),
                                         ('alice', 'dispatch:c.2-x:0', 'f0', 'null'),
                                         ('alice', 'op-7', 'fo', '{\"ok\":true}'),
                                         ('alice', 'Dispatch:c1:5', 'fd', 'null'),
                                         ('alice', 'dispatch:c3:9223372036854775808', 'fb', 'null'),
                                         ('alice', 'dispatch:c3:9223372036854775809', 'fc', 'null'),
                                         ('alice', 'dispatch:c4:x1', 'fx', 'null');",
    );
    let mut store = SqliteStore::open(&path, REPO).expect("migrating open");
    assert_eq!(
        pragma(store.writer.conn(), "user_version"),
        format!("Integer({SCHEMA_VERSION})")
    );
    let key = ClientRecord::dispatch_receipt_key;
    for (k, fingerprint) in [
        (key("c1", 9), "f9"),
        (key("c1", 12), "f12"),
        (key("c.2-x", 0), "f0"),
        ("op-7".to_owned(), "fo"),
        ("Dispatch:c1:5".to_owned(), "fd"),
        // Above i64::MAX (no build wrote one): padded as text, not clamped into one key.
        (key("c3", 9_223_372_036_854_775_808), "fb"),
        (key("c3", 9_223_372_036_854_775_809), "fc"),
        // Not a number: left as it is.
        ("dispatch:c4:x1".to_owned(), "fx"),
    ] {
        let found = store.receipt("alice", &k).expect("read");
        assert_eq!(
            found.map(|r| r.fingerprint),
            Some(fingerprint.to_owned()),
            "{k}"
        );
    }
    assert_eq!(
        store
            .last_receipt_key("alice", "dispatch:c1:")
            .expect("read"),
        Some(key("c1", 12))
    );
    assert_eq!(
        store.last_receipt_key("bob", "dispatch:c1:").expect("read"),
        None
    );
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
    let err = SqliteStore::open(&path, REPO).expect_err("newer schema");
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
fn a_negative_schema_version_is_corrupt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    Connection::open(&path)
        .expect("raw open")
        .pragma_update(None, "user_version", -1)
        .expect("set version");
    let err = SqliteStore::open(&path, REPO).expect_err("negative version");
    assert!(
        matches!(&err, OpenError::Corrupt { problem, .. } if problem == "schema version -1"),
        "{err:?}"
    );
}

#[test]
fn tables_without_a_schema_version_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    {
        let conn = Connection::open(&path).expect("raw open");
        conn.execute_batch("CREATE TABLE records(key TEXT PRIMARY KEY, value TEXT)")
            .expect("table");
    }
    let err = SqliteStore::open(&path, REPO).expect_err("unversioned tables");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
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
    let err = SqliteStore::open(&path, REPO).expect_err("not a database");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

/// `meta.repository`, read straight from the file.
fn bound_repository(path: &Path) -> Option<String> {
    let conn = Connection::open(path).expect("raw open");
    conn.query_row(
        "SELECT value FROM meta WHERE key = 'repository'",
        [],
        |row| row.get(0),
    )
    .optional()
    .expect("meta")
}

#[test]
fn the_first_open_binds_the_repository_and_later_opens_must_match() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    let mut store = SqliteStore::open(&path, "acme/widgets").expect("open");
    assert_eq!(store.repository(), "acme/widgets");
    populate(&mut store);
    drop(store);
    assert_eq!(bound_repository(&path).as_deref(), Some("acme/widgets"));

    let err = SqliteStore::open(&path, "acme/gadgets").expect_err("another repository");
    match &err {
        OpenError::RepositoryMismatch {
            path: p,
            bound,
            configured,
        } => {
            assert_eq!(p, &path);
            assert_eq!(bound, "acme/widgets");
            assert_eq!(configured, "acme/gadgets");
        }
        other => panic!("expected RepositoryMismatch, got {other:?}"),
    }
    let msg = err.to_string();
    for needle in [
        "\"acme/widgets\"",
        "\"acme/gadgets\"",
        "repository",
        &path.display().to_string(),
    ] {
        assert!(msg.contains(needle), "{needle:?} missing from {msg}");
    }
    // Refused before anything changed; the lock was let go, and the right name still opens
    // the same history.
    assert_eq!(bound_repository(&path).as_deref(), Some("acme/widgets"));
    let mut store = SqliteStore::open(&path, "acme/widgets").expect("the bound name");
    assert_populated(&mut store);
}

#[test]
fn a_binding_is_written_once_and_a_refused_open_changes_nothing() {
    // A file whose schema exists but whose binding is another name is refused; a new file is
    // bound in the schema transaction, so no schema without a binding is ever committed.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    drop(SqliteStore::open(&path, "alpha").expect("open"));
    let conn = Connection::open(&path).expect("raw open");
    let rows: i64 = conn
        .query_row(
            "SELECT COUNT(*) FROM meta WHERE key = 'repository'",
            [],
            |r| r.get(0),
        )
        .expect("count");
    assert_eq!(rows, 1);
    drop(conn);
    for _ in 0..2 {
        assert!(matches!(
            SqliteStore::open(&path, "beta"),
            Err(OpenError::RepositoryMismatch { .. })
        ));
    }
    assert_eq!(bound_repository(&path).as_deref(), Some("alpha"));
}

#[test]
fn a_database_from_before_the_binding_is_adopted() {
    // A version 2 file (and so any file an older build wrote) has no binding: the first
    // repository to open it adopts it, in the migration's transaction.
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    version_2_file(&path, "INSERT INTO meta VALUES ('server_seq', '7');");
    assert_eq!(bound_repository(&path), None);
    let store = SqliteStore::open(&path, "legacy").expect("adopting open");
    drop(store);
    assert_eq!(bound_repository(&path).as_deref(), Some("legacy"));
    assert!(matches!(
        SqliteStore::open(&path, "default"),
        Err(OpenError::RepositoryMismatch { .. })
    ));

    // Same for a file of this version written before the binding existed.
    let path = dir.path().join("y.db");
    drop(SqliteStore::open(&path, "first").expect("open"));
    Connection::open(&path)
        .expect("raw open")
        .execute_batch("DELETE FROM meta WHERE key = 'repository'")
        .expect("unbind");
    drop(SqliteStore::open(&path, "second").expect("adopting open"));
    assert_eq!(bound_repository(&path).as_deref(), Some("second"));
}

#[test]
fn a_null_binding_is_corrupt_not_adopted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    drop(SqliteStore::open(&path, "alpha").expect("open"));
    Connection::open(&path)
        .expect("raw open")
        .execute_batch("UPDATE meta SET value = NULL WHERE key = 'repository'")
        .expect("null");
    let err = SqliteStore::open(&path, "alpha").expect_err("a NULL binding");
    assert!(matches!(err, OpenError::Corrupt { .. }), "{err:?}");
}
