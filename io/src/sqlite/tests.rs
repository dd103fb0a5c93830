//! Tests of the SQLite store: round trips, reads, order checks and atomicity; opening a
//! database (the owner lock, files, pragmas, migrations, the binding) in `tests/opening.rs`.

use std::time::Duration;

use axhost_core::{ClientRecord, MemStore, Record, StoredRecord};
use rusqlite::Connection;

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

/// The query plan of `sql` on the reader, one line per step.
fn plan(store: &SqliteStore, sql: &str) -> String {
    let conn = store.reader.conn();
    let mut stmt = conn
        .prepare(&format!("EXPLAIN QUERY PLAN {sql}"))
        .expect("plan");
    let rows = stmt
        .query_map([], |row| row.get::<_, String>(3))
        .expect("plan rows");
    rows.map(|r| r.expect("plan row"))
        .collect::<Vec<_>>()
        .join("; ")
}

#[test]
fn channel_events_after_uses_the_stream_index_and_matches_the_reference_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    let mut mem = MemStore::new();
    // Two sessions' channels interleaved, the singletons among them (which share no stream
    // with each other), and channels outside every scheme.
    let channels = [
        "ahp-chat:/s1",
        "ahp-session:/s1",
        "axp-session:/s1",
        "ahp-chat:/s2",
        "ahp-root://",
        "axp-memory://",
        "ahp-session:/s2",
        "a",
        "b",
        "ahp-chat:/s1/x",
    ];
    for seq in 1..=40u64 {
        let mut c = change(seq, seq);
        c.events = vec![event(seq, channels[(seq as usize * 7) % channels.len()])];
        store.commit(&c).expect("commit");
        mem.commit(&c).expect("commit");
    }
    for channel in channels
        .iter()
        .copied()
        .chain(["ahp-chat:/s3", "ahp-chat:/", "c"])
    {
        for after in [0, 4, 17, 39, 40] {
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
    }
    let seqs: Vec<u64> = store
        .channel_events_after("ahp-chat:/s1", 4)
        .expect("events")
        .iter()
        .map(|e| e.seq)
        .collect();
    assert_eq!(seqs, vec![10, 20, 30, 40]);
    // Both reads search the index by stream (never a scan of every event), in seq order.
    for sql in [
        concat!(
            "SELECT seq, envelope FROM events WHERE ",
            stream_of!("channel"),
            " = ",
            stream_of!("'ahp-chat:/s1'"),
            " AND channel = 'ahp-chat:/s1' AND seq > 4 ORDER BY seq"
        ),
        concat!(
            "SELECT seq FROM events WHERE ",
            stream_of!("channel"),
            " = ",
            stream_of!("'ahp-root://'"),
            " AND channel = 'ahp-root://' AND seq > 4 ORDER BY seq LIMIT 1"
        ),
    ] {
        let plan = plan(&store, sql);
        assert!(plan.contains("USING INDEX events_stream"), "{plan}");
        assert!(!plan.contains("TEMP B-TREE"), "{plan}");
    }
}

#[test]
fn last_receipt_key_seeks_the_owner_index_and_matches_the_reference_store() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut store = open(&dir);
    let mut mem = MemStore::new();
    let key = ClientRecord::dispatch_receipt_key;
    // Neighbours on both sides of each prefix: a longer clientId it prefixes, another owner,
    // an AXP operationId, and numbers whose unpadded text would sort the other way.
    let mut c = change(1, 0);
    c.receipts = [
        ("alice", key("c1", 9)),
        ("alice", key("c1", 12)),
        ("alice", key("c10", 99)),
        ("alice", key("c0", 100)),
        ("bob", key("c1", 500)),
        ("alice", "dispatch:c1;".to_owned()),
        ("alice", "op-1".to_owned()),
    ]
    .iter()
    .map(|(owner, k)| receipt(owner, k, "null"))
    .collect();
    store.commit(&c).expect("commit");
    mem.commit(&c).expect("commit");
    for (owner, prefix, expected) in [
        ("alice", "dispatch:c1:", Some(key("c1", 12))),
        ("alice", "dispatch:c10:", Some(key("c10", 99))),
        ("alice", "dispatch:c2:", None),
        ("bob", "dispatch:c1:", Some(key("c1", 500))),
        ("carol", "dispatch:c1:", None),
        ("alice", "op-", Some("op-1".to_owned())),
    ] {
        let found = store.last_receipt_key(owner, prefix).expect("sqlite");
        assert_eq!(found, expected, "{owner} {prefix}");
        assert_eq!(mem.last_receipt_key(owner, prefix).expect("mem"), expected);
    }
    // The statement the reader runs, its parameters spelled out.
    let sql = super::reads::LAST_RECEIPT_KEY_SQL
        .replace("?1", "'alice'")
        .replace("?2", "'dispatch:c1:'")
        .replace("?3", "'dispatch:c1;'");
    let plan = plan(&store, &sql);
    assert!(
        plan.contains("USING COVERING INDEX sqlite_autoindex_receipts_1"),
        "{plan}"
    );
    assert!(!plan.contains("TEMP B-TREE"), "{plan}");
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

mod opening;
