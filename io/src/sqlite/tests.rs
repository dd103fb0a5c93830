//! Tests of the SQLite store: round trips, order checks, atomicity, the owner lock, files,
//! pragmas and migrations.

use std::fs;
#[cfg(unix)]
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use axhost_core::{ClientRecord, MemStore, Record, StoredRecord};
use rusqlite::{Connection, OptionalExtension};

use super::schema::lock_path;
use super::*;

/// The repository the tests open their databases for.
const REPO: &str = "default";

fn event(seq: u64, channel: &str) -> Event {
    Event {
        seq,
        channel: channel.into(),
        envelope: format!("{{\"seq\":{seq}}}").into(),
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

fn state(key: &str, value: Option<&str>) -> Record {
    match value {
        Some(v) => Record::json(Table::State, key, v),
        None => Record::delete(Table::State, key),
    }
}

fn change(number: u64, server_seq: u64) -> Change {
    Change {
        number,
        server_seq,
        ..Change::default()
    }
}

fn state_of(loaded: &Loaded) -> Vec<(String, String)> {
    loaded
        .records
        .iter()
        .filter(|r| r.table == Table::State)
        .map(|r| {
            (
                r.key.clone(),
                String::from_utf8_lossy(&r.value).into_owned(),
            )
        })
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

fn open(dir: &tempfile::TempDir) -> SqliteStore {
    SqliteStore::open(&dir.path().join("x.db"), REPO).expect("open")
}

/// Two changes: records written, one deleted again, three events, receipts and bindings.
fn populate(store: &mut SqliteStore) {
    let mut first = change(1, 2);
    first.records = vec![
        state("b", Some("{\"b\":1}")),
        state("a", Some("{\"a\":1}")),
        client("c1", "alice", 1).to_record(),
    ];
    first.events = vec![event(1, "ahp-root://"), event(2, "ahp-session:/s1")];
    first.receipts = vec![receipt("alice", "dispatch:c1:1", "null")];
    store.commit(&first).expect("first commit");
    let mut second = change(2, 3);
    second.records = vec![
        state("b", None),
        state("a", Some("{\"a\":2}")),
        client("c1", "alice", 2).to_record(),
        client("c2", "bob", 0).to_record(),
    ];
    second.events = vec![event(3, "ahp-session:/s1")];
    second.receipts = vec![receipt("alice", "dispatch:c1:2", "{\"ok\":true}")];
    store.commit(&second).expect("second commit");
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

fn pragma(conn: &Connection, name: &str) -> String {
    conn.pragma_query_value(None, name, |row| row.get::<_, rusqlite::types::Value>(0))
        .map(|v| format!("{v:?}"))
        .expect("pragma")
}

#[test]
fn a_new_database_loads_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert_eq!(open(&dir).load(4096).expect("load"), Loaded::default());
}

#[test]
fn channel_events_after_uses_the_index_and_matches_the_reference_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    let mut mem = MemStore::new();
    for seq in 1..=9u64 {
        let channel = if seq % 3 == 0 { "b" } else { "a" };
        let mut c = change(seq, seq);
        c.events = vec![event(seq, channel)];
        store.commit(&c).expect("commit");
        mem.commit(&c).expect("commit");
    }
    for (channel, after) in [("a", 0), ("a", 4), ("b", 3), ("b", 9), ("c", 0)] {
        assert_eq!(
            store.channel_events_after(channel, after).expect("sqlite"),
            mem.channel_events_after(channel, after).expect("mem"),
            "{channel} after {after}"
        );
        assert_eq!(
            store
                .first_channel_event_after(channel, after)
                .expect("sqlite"),
            mem.first_channel_event_after(channel, after).expect("mem"),
            "first on {channel} after {after}"
        );
    }
    let seqs: Vec<u64> = store
        .channel_events_after("a", 4)
        .expect("a")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, vec![5, 7, 8]);
    let plan: String = store
        .reader
        .conn()
        .query_row(
            "EXPLAIN QUERY PLAN SELECT seq, envelope FROM events WHERE channel = 'a' AND seq > 4 ORDER BY seq",
            [],
            |row| row.get(3),
        )
        .expect("plan");
    assert!(plan.contains("events_channel"), "{plan}");
}

#[test]
fn events_may_sit_below_a_reserved_mark_but_never_below_each_other() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    let mut store = SqliteStore::open(&path, REPO).expect("open");
    // A reservation: the mark jumps ahead of every number handed out.
    store.commit(&change(1, 1024)).expect("reserve");
    let mut below = change(2, 1024);
    below.events = vec![event(3, "a")];
    store
        .commit(&below)
        .expect("an event below the mark is fine");
    let mut stale = change(3, 1024);
    stale.events = vec![event(3, "a")];
    assert!(
        store.commit(&stale).is_err(),
        "but never at or below the newest event"
    );
    drop(store);
    let mut store = SqliteStore::open(&path, REPO).expect("reopen");
    stale.number = 1;
    assert!(
        store.commit(&stale).is_err(),
        "the newest event is known after a reopen"
    );
    let mut next = change(1, 1024);
    next.events = vec![event(4, "a")];
    store.commit(&next).expect("the next one");
    assert_eq!(store.load(10).expect("load").server_seq, 1024);
}

#[test]
fn round_trip_of_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    populate(&mut store);
    assert_populated(&mut store);
}

#[test]
fn tables_keep_keys_apart_and_load_in_the_cores_table_order() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    let mut c = change(1, 0);
    c.records = vec![
        Record::json(Table::Client, "k", "{\"client\":1}"),
        Record::json(Table::State, "k", "{\"state\":1}"),
        Record::json(Table::State, "a", "{}"),
        // Values are bytes: whatever the core hands over comes back exactly.
        Record {
            table: Table::State,
            key: "bin".into(),
            value: Some(Arc::from(&[0u8, 159, 255][..])),
        },
    ];
    store.commit(&c).expect("commit");
    let loaded = store.load(0).expect("load");
    let got: Vec<(Table, &str, &[u8])> = loaded
        .records
        .iter()
        .map(|r| (r.table, r.key.as_str(), &*r.value))
        .collect();
    assert_eq!(
        got,
        vec![
            (Table::State, "a", &b"{}"[..]),
            (Table::State, "bin", &[0u8, 159, 255][..]),
            (Table::State, "k", &b"{\"state\":1}"[..]),
            (Table::Client, "k", &b"{\"client\":1}"[..]),
        ]
    );
    assert_eq!(
        store
            .read_record(Table::Client, "k")
            .expect("read")
            .as_deref(),
        Some(&b"{\"client\":1}"[..])
    );
    let mut delete = change(2, 0);
    delete.records = vec![Record::delete(Table::Client, "k")];
    store.commit(&delete).expect("delete");
    assert_eq!(store.read_record(Table::Client, "k").expect("read"), None);
    assert!(store
        .read_record(Table::State, "k")
        .expect("read")
        .is_some());
}

#[test]
fn records_of_a_table_this_build_does_not_know_are_refused_at_load() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    let mut store = SqliteStore::open(&path, REPO).expect("open");
    store
        .writer
        .conn()
        .execute_batch("INSERT INTO records VALUES ('future', 'k', x'00')")
        .expect("a newer build's record");
    let err = store.load(1).expect_err("unknown table");
    assert!(err.0.contains("\"future\""), "{err}");
}

#[test]
fn the_event_tail_is_the_newest_oldest_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
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
        let mut store = SqliteStore::open(&path, REPO).expect("open");
        populate(&mut store);
    }
    let mut store = SqliteStore::open(&path, REPO).expect("reopen");
    assert_populated(&mut store);
    // serverSeq continues from where it was, and cannot go backwards; change numbers start
    // again with the new host.
    assert!(store.commit(&change(1, 2)).is_err());
    let mut next = change(1, 4);
    next.events = vec![event(4, "c")];
    store.commit(&next).expect("commit after restart");
}

#[test]
fn a_group_is_one_transaction_and_a_bad_change_in_it_writes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    let mut changes: Vec<Change> = (1..=3)
        .map(|n| {
            let mut c = change(n, n);
            c.events = vec![event(n, "c")];
            c.records = vec![state("k", Some(&format!("{n}")))];
            c
        })
        .collect();
    // The third goes backwards: the whole group is refused.
    changes[2].server_seq = 1;
    changes[2].events.clear();
    let refs: Vec<&Change> = changes.iter().collect();
    assert!(store.commit_group(&refs).is_err());
    assert_eq!(store.load(10).expect("load"), Loaded::default());
    // In order, the group commits as one, and the last write of a key wins.
    changes[2].server_seq = 3;
    changes[2].events = vec![event(3, "c")];
    let refs: Vec<&Change> = changes.iter().collect();
    store.commit_group(&refs).expect("group");
    let loaded = store.load(10).expect("load");
    assert_eq!(loaded.server_seq, 3);
    assert_eq!(loaded.events_tail.len(), 3);
    assert_eq!(state_of(&loaded), vec![("k".to_owned(), "3".to_owned())]);
    // Numbers keep climbing across groups.
    assert!(store.commit(&change(3, 3)).is_err());
    store.commit(&change(4, 3)).expect("next group");
}

#[test]
fn the_reader_sees_what_the_writer_committed_and_cannot_write() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    let (mut reader, mut writer) = SqliteStore::open(&path, REPO).expect("open").split();
    let mut c = change(1, 1);
    c.events = vec![event(1, "c")];
    c.receipts = vec![receipt("alice", "k", "null")];
    c.records = vec![state("s", Some("{}"))];
    writer.commit(&c).expect("commit");
    assert_eq!(reader.load(4).expect("load").server_seq, 1);
    assert!(reader.receipt("alice", "k").expect("read").is_some());
    assert!(reader
        .read_record(Table::State, "s")
        .expect("read")
        .is_some());
    assert_eq!(reader.channel_events_after("c", 0).expect("read").len(), 1);
    assert_eq!(pragma(reader.conn(), "query_only"), "Integer(1)");
    assert!(reader.conn().execute_batch("DELETE FROM events").is_err());
}

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
    assert_eq!(pragma(conn, "user_version"), "Integer(3)");
    assert_eq!(pragma(conn, "query_only"), "Integer(0)");
    assert_eq!(pragma(store.reader.conn(), "query_only"), "Integer(1)");
    assert_eq!(pragma(store.reader.conn(), "busy_timeout"), "Integer(100)");
}

/// The version 2 schema, as the previous release wrote it, with `extra` SQL run after it.
fn version_2_file(path: &Path, extra: &str) {
    let conn = Connection::open(path).expect("raw open");
    conn.execute_batch(
        "CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
         CREATE TABLE records(key TEXT PRIMARY KEY, value TEXT NOT NULL);
         CREATE TABLE events(seq INTEGER PRIMARY KEY, channel TEXT NOT NULL, envelope TEXT NOT NULL);
         CREATE INDEX events_channel ON events(channel, seq);
         CREATE TABLE receipts(owner TEXT, key TEXT, fingerprint TEXT, result TEXT, PRIMARY KEY(owner, key));
         CREATE TABLE clients(id TEXT PRIMARY KEY, owner TEXT NOT NULL, last_client_seq INTEGER NOT NULL, dispatched INTEGER NOT NULL DEFAULT 0);
         PRAGMA user_version = 2;",
    )
    .expect("version 2 schema");
    conn.execute_batch(extra).expect("version 2 rows");
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
        .receipt("alice", "dispatch:c1:3")
        .expect("receipt")
        .is_some());
    let conn = store.writer.conn();
    assert_eq!(pragma(conn, "user_version"), "Integer(3)");
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
    // A migrated file opens as a version 3 one, and takes new changes after its history.
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
    {
        // The version 1 schema, as the release before that wrote it.
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
    assert_eq!(pragma(store.writer.conn(), "user_version"), "Integer(3)");
}

#[test]
fn an_outside_writer_fails_a_commit_quickly_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("x.db");
    let mut store = SqliteStore::open(&path, REPO).expect("open");
    populate(&mut store);
    // A writer that ignores the owner lock holds the write lock.
    let outside = Connection::open(&path).expect("outside open");
    outside
        .execute_batch("BEGIN IMMEDIATE")
        .expect("outside lock");
    let mut c = change(3, 4);
    c.events = vec![event(4, "c")];
    let started = std::time::Instant::now();
    assert!(store.commit(&c).is_err());
    let waited = started.elapsed();
    assert!(
        waited >= BUSY_TIMEOUT / 2 && waited < Duration::from_secs(2),
        "the commit waited {waited:?}"
    );
    outside.execute_batch("ROLLBACK").expect("outside unlock");
    assert_populated(&mut store);
    store.commit(&c).expect("commit once the lock is gone");
}

#[test]
fn a_duplicate_event_seq_is_refused_and_changes_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    populate(&mut store);
    let mut dup = change(3, 3);
    dup.records = vec![
        state("a", Some("{\"a\":99}")),
        state("z", Some("{}")),
        client("c3", "carol", 0).to_record(),
    ];
    dup.events = vec![event(3, "ahp-root://")];
    dup.receipts = vec![receipt("alice", "dispatch:c1:3", "null")];
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
    let mut store = SqliteStore::open(&path, REPO).expect("open");
    populate(&mut store);
    // Fail the last receipt, after records and events were written in the same transaction:
    // they must vanish with it.
    store
        .writer
        .conn()
        .execute_batch(
            "CREATE TEMP TRIGGER refuse_boom BEFORE INSERT ON receipts \
             WHEN NEW.owner = 'boom' BEGIN SELECT RAISE(ABORT, 'injected'); END;",
        )
        .expect("trigger");
    let mut c = change(3, 5);
    c.records = vec![
        state("a", Some("{\"a\":99}")),
        state("z", Some("{}")),
        client("c9", "carol", 0).to_record(),
    ];
    c.events = vec![event(4, "ahp-root://"), event(5, "ahp-root://")];
    c.receipts = vec![
        receipt("alice", "dispatch:c1:3", "null"),
        receipt("boom", "k", "null"),
    ];
    let err = store.commit(&c).expect_err("injected failure");
    assert!(err.0.contains("injected"), "{err}");
    assert_populated(&mut store);
    assert_eq!(
        store.receipt("alice", "dispatch:c1:3").expect("receipt"),
        None
    );
    // The store is still usable, and the numbers the failed change wanted are free.
    let mut next = change(4, 4);
    next.events = vec![event(4, "c")];
    store.commit(&next).expect("commit after a failed one");
    drop(store);
    let mut store = SqliteStore::open(&path, REPO).expect("reopen");
    assert_eq!(store.load(1).expect("load").server_seq, 4);
}

#[test]
fn out_of_order_changes_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    let mut unordered = change(1, 2);
    unordered.events = vec![event(2, "c"), event(1, "c")];
    assert!(store.commit(&unordered).is_err());
    let mut past_seq = change(1, 1);
    past_seq.events = vec![event(2, "c")];
    assert!(store.commit(&past_seq).is_err());
    let mut too_big = change(1, u64::MAX);
    too_big.events = vec![event(u64::MAX, "c")];
    assert!(store.commit(&too_big).is_err());
    assert!(store.commit(&change(0, 0)).is_err(), "numbers start at 1");
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

    // Same for a version 3 file written before the binding existed.
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
