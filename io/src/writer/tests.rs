//! Tests of the writer thread: group commit, order, failures and generation drops, a dead
//! writer, the queue budget; against a plain table store and against SQLite with a real host.

use super::*;
use rusqlite::{params, Connection, TransactionBehavior};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// A change of the test store: a row in a plain SQLite table.
#[derive(Debug)]
struct Row {
    number: u64,
    generation: u64,
    /// `"poison"` is refused by a CHECK constraint; `"panic"` panics mid-transaction.
    payload: &'static str,
}

impl QueuedChange for Row {
    fn number(&self) -> u64 {
        self.number
    }
    fn generation(&self) -> u64 {
        self.generation
    }
    fn queued_bytes(&self) -> u64 {
        100
    }
}

fn row(number: u64, generation: u64) -> Row {
    Row {
        number,
        generation,
        payload: "ok",
    }
}

/// Commits rows into `changes` and records each transaction in `transactions`, so what was
/// grouped can be read back from the file. With a gate, each transaction first announces
/// its size on `entered` and waits for a permit.
struct TableStore {
    conn: Connection,
    gate: Option<(Sender<usize>, Receiver<()>)>,
}

const TEST_SCHEMA: &str = "
    CREATE TABLE IF NOT EXISTS changes(number INTEGER PRIMARY KEY, generation INTEGER NOT NULL,
                                       payload TEXT NOT NULL CHECK (payload != 'poison'));
    CREATE TABLE IF NOT EXISTS transactions(id INTEGER PRIMARY KEY AUTOINCREMENT,
                                            first INTEGER NOT NULL, last INTEGER NOT NULL);";

fn open(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.pragma_update(None, "journal_mode", "WAL")
        .expect("wal");
    conn.pragma_update(None, "synchronous", "FULL")
        .expect("full");
    conn.execute_batch(TEST_SCHEMA).expect("schema");
    conn
}

impl BatchStore for TableStore {
    type Change = Row;
    fn commit_batch(&mut self, batch: &[Row]) -> Result<(), StoreError> {
        if let Some((entered, permits)) = &self.gate {
            let _ = entered.send(batch.len());
            let _ = permits.recv();
        }
        let err = |e: rusqlite::Error| StoreError(e.to_string());
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(err)?;
        for r in batch {
            if r.payload == "panic" {
                panic!("injected: the writer dies mid-transaction");
            }
            tx.execute(
                "INSERT INTO changes(number, generation, payload) VALUES (?1, ?2, ?3)",
                params![r.number as i64, r.generation as i64, r.payload],
            )
            .map_err(err)?;
        }
        let (first, last) = (batch[0].number as i64, batch[batch.len() - 1].number as i64);
        tx.execute(
            "INSERT INTO transactions(first, last) VALUES (?1, ?2)",
            params![first, last],
        )
        .map_err(err)?;
        tx.commit().map_err(err)
    }
}

type Pairs = Vec<(u64, u64)>;

struct Harness {
    dir: tempfile::TempDir,
    writer: Writer<Row>,
    entered: Receiver<usize>,
    permits: Sender<()>,
}

/// A writer over a fresh file whose transactions wait for permits.
fn gated(limits: WriterLimits) -> Harness {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open(&dir.path().join("t.db"));
    let (entered_tx, entered) = crossbeam_channel::unbounded();
    let (permits, permits_rx) = crossbeam_channel::unbounded();
    let store = TableStore {
        conn,
        gate: Some((entered_tx, permits_rx)),
    };
    let writer = Writer::start(store, limits, Duration::ZERO, || {}).expect("start");
    Harness {
        dir,
        writer,
        entered,
        permits,
    }
}

impl Harness {
    /// Waits until the writer is inside a transaction of `len` changes.
    fn entered(&self, len: usize) {
        let got = self
            .entered
            .recv_timeout(Duration::from_secs(10))
            .expect("the writer started no transaction");
        assert_eq!(got, len, "transaction size");
    }

    fn outcomes(&mut self, n: usize) -> Vec<Outcome> {
        let mut out = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while out.len() < n && Instant::now() < deadline {
            if let Some(o) = self.writer.wait_outcome(Duration::from_millis(50)) {
                out.push(o);
            }
        }
        out
    }

    /// `(number, generation)` rows and `(first, last)` transactions in the file.
    fn file(&self) -> (Pairs, Pairs) {
        let conn = open(&self.dir.path().join("t.db"));
        let pairs = |sql: &str| -> Vec<(u64, u64)> {
            let mut stmt = conn.prepare(sql).expect("prepare");
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64))
                })
                .expect("query");
            rows.map(|r| r.expect("row")).collect()
        };
        (
            pairs("SELECT number, generation FROM changes ORDER BY number"),
            pairs("SELECT first, last FROM transactions ORDER BY id"),
        )
    }
}

#[test]
fn what_queues_behind_a_commit_goes_in_one_transaction_in_order() {
    let mut h = gated(WriterLimits::default());
    h.writer.submit(row(1, 0));
    h.entered(1);
    for n in 2..=200 {
        h.writer.submit(row(n, 0));
    }
    assert_eq!(h.writer.poll_outcome(), None, "nothing is durable yet");
    h.permits.send(()).expect("permit");
    h.entered(199);
    h.permits.send(()).expect("permit");
    assert_eq!(
        h.outcomes(2),
        vec![
            Outcome::Durable { through: 1 },
            Outcome::Durable { through: 200 }
        ]
    );
    assert_eq!(h.writer.unresolved(), 0);
    let (rows, txs) = h.file();
    assert_eq!(rows, (1..=200).map(|n| (n, 0)).collect::<Vec<_>>());
    assert_eq!(txs, vec![(1, 1), (2, 200)]);
}

#[test]
fn a_failed_group_drops_the_later_changes_of_its_generation_only() {
    let mut h = gated(WriterLimits::default());
    h.writer.submit(row(1, 0));
    h.entered(1);
    h.writer.submit(row(2, 0));
    h.writer.submit(Row {
        number: 3,
        generation: 0,
        payload: "poison",
    });
    h.writer.submit(row(4, 0));
    h.permits.send(()).expect("permit");
    // The group [2, 3, 4] fails, then one per transaction: 2 commits, 3 fails, 4 is built
    // on 3 (same generation) and is dropped untried.
    h.entered(3);
    h.permits.send(()).expect("permit");
    h.entered(1);
    h.permits.send(()).expect("permit");
    h.entered(1);
    h.permits.send(()).expect("permit");
    assert_eq!(
        h.outcomes(3),
        vec![
            Outcome::Durable { through: 1 },
            Outcome::Durable { through: 2 },
            Outcome::CommitFailed { number: 3 },
        ]
    );
    // The core handed out 5 before it heard of the failure (generation 0): dropped. 6 is
    // of the next generation and commits.
    h.writer.submit(row(5, 0));
    h.writer.submit(row(6, 1));
    h.entered(1);
    h.permits.send(()).expect("permit");
    assert_eq!(h.outcomes(1), vec![Outcome::Durable { through: 6 }]);
    assert_eq!(h.writer.unresolved(), 0);
    let (rows, txs) = h.file();
    assert_eq!(rows, vec![(1, 0), (2, 0), (6, 1)]);
    assert_eq!(txs, vec![(1, 1), (2, 2), (6, 6)]);
}

#[test]
fn changes_of_a_failed_generation_still_queued_are_dropped_by_the_thread() {
    let mut h = gated(WriterLimits::default());
    h.writer.submit(Row {
        number: 1,
        generation: 0,
        payload: "poison",
    });
    h.entered(1);
    // Queued behind the failing one before the failure is known.
    h.writer.submit(row(2, 0));
    h.writer.submit(row(3, 1));
    h.permits.send(()).expect("permit");
    h.entered(1);
    h.permits.send(()).expect("permit");
    assert_eq!(
        h.outcomes(2),
        vec![
            Outcome::CommitFailed { number: 1 },
            Outcome::Durable { through: 3 }
        ]
    );
    assert_eq!(h.writer.unresolved(), 0);
    assert_eq!(h.file().0, vec![(3, 1)]);
}

#[test]
fn a_writer_that_dies_mid_transaction_leaves_the_durable_prefix_and_fails_the_rest() {
    let mut h = gated(WriterLimits::default());
    for n in 1..=3 {
        h.writer.submit(row(n, 0));
        h.entered(1);
        h.permits.send(()).expect("permit");
    }
    assert_eq!(
        h.outcomes(3),
        (1..=3)
            .map(|through| Outcome::Durable { through })
            .collect::<Vec<_>>()
    );
    h.writer.submit(row(4, 0));
    h.entered(1);
    h.writer.submit(row(5, 0));
    h.writer.submit(Row {
        number: 6,
        generation: 0,
        payload: "panic",
    });
    h.writer.submit(row(7, 0));
    h.permits.send(()).expect("permit");
    h.entered(3);
    // 4 is durable; 5 is written, then the thread panics inside the transaction.
    h.permits.send(()).expect("permit");
    assert_eq!(
        h.outcomes(2),
        vec![
            Outcome::Durable { through: 4 },
            Outcome::CommitFailed { number: 5 }
        ]
    );
    // From now on every change fails at once, without waiting for anything.
    let started = Instant::now();
    h.writer.submit(row(8, 0));
    h.writer.submit(row(9, 1));
    assert_eq!(
        h.outcomes(1),
        vec![Outcome::CommitFailed { number: 9 }],
        "8 is of the failed generation (dropped), 9 fails"
    );
    assert!(started.elapsed() < Duration::from_secs(1));
    assert_eq!(h.writer.poll_outcome(), None);
    let (rows, _) = h.file();
    assert_eq!(rows, (1..=4).map(|n| (n, 0)).collect::<Vec<_>>());
}

#[test]
fn a_full_queue_makes_submit_wait_for_the_writer() {
    let mut h = gated(WriterLimits {
        changes_max: 2,
        bytes_max: u64::MAX,
    });
    h.writer.submit(row(1, 0));
    h.entered(1);
    h.writer.submit(row(2, 0));
    let released = Arc::new(AtomicBool::new(false));
    let permits = h.permits.clone();
    let released_by = released.clone();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        released_by.store(true, Ordering::SeqCst);
        permits.send(()).expect("permit");
        permits.send(()).expect("permit");
    });
    // 1 and 2 fill the budget; 3 waits until the transaction holding 1 is done.
    h.writer.submit(row(3, 0));
    assert!(
        released.load(Ordering::SeqCst),
        "submit returned before the writer freed room"
    );
    opener.join().expect("opener");
    h.permits.send(()).expect("permit");
    let outcomes = h.outcomes(3);
    assert_eq!(outcomes.last(), Some(&Outcome::Durable { through: 3 }));
    assert_eq!(h.file().0, (1..=3).map(|n| (n, 0)).collect::<Vec<_>>());
}

#[test]
fn a_byte_budget_lets_one_oversized_change_through_alone() {
    let budget = Budget {
        state: Mutex::new(BudgetState::default()),
        freed: Condvar::new(),
        limits: WriterLimits {
            changes_max: 10,
            bytes_max: 1000,
        },
    };
    assert!(budget.acquire(5000), "an empty queue takes any change");
    budget.release(1, 5000);
    assert!(budget.acquire(600));
    assert!(budget.acquire(400));
    budget.close();
    assert!(!budget.acquire(1), "a closed budget never waits");
}

#[test]
fn finish_commits_everything_queued_before_the_thread_ends() {
    let h = gated(WriterLimits::default());
    let Harness {
        dir,
        mut writer,
        entered,
        permits,
    } = h;
    writer.submit(row(1, 0));
    assert_eq!(entered.recv_timeout(Duration::from_secs(10)), Ok(1));
    for n in 2..=50 {
        writer.submit(row(n, 0));
    }
    let opener = std::thread::spawn(move || {
        for _ in 0..2 {
            permits.send(()).expect("permit");
        }
    });
    assert!(writer.finish(Duration::from_secs(10)));
    opener.join().expect("opener");
    let conn = open(&dir.path().join("t.db"));
    let count: i64 = conn
        .query_row("SELECT COUNT(*) FROM changes", [], |r| r.get(0))
        .expect("count");
    assert_eq!(count, 50);
}

/// Ungated, against a real file with fsync: a closed-loop burst still groups.
#[test]
fn a_burst_groups_without_help() {
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open(&dir.path().join("t.db"));
    let mut writer = Writer::start(
        TableStore { conn, gate: None },
        WriterLimits::default(),
        Duration::ZERO,
        || {},
    )
    .expect("start");
    const N: u64 = 2000;
    for n in 1..=N {
        writer.submit(row(n, 0));
    }
    let mut through = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while through < N && Instant::now() < deadline {
        match writer.wait_outcome(Duration::from_millis(100)) {
            Some(Outcome::Durable { through: t }) => {
                assert!(t > through, "outcomes out of order");
                through = t;
            }
            Some(other) => panic!("{other:?}"),
            None => {}
        }
    }
    assert_eq!(through, N);
    assert!(writer.finish(Duration::from_secs(10)));
    let conn = open(&dir.path().join("t.db"));
    let txs: i64 = conn
        .query_row("SELECT COUNT(*) FROM transactions", [], |r| r.get(0))
        .expect("count");
    assert!(
        (txs as u64) < N / 4,
        "{txs} transactions for {N} changes submitted at once"
    );
}

#[test]
fn a_writer_that_dies_while_the_loop_waits_for_room_reports_one_failure() {
    let mut h = gated(WriterLimits {
        changes_max: 1,
        bytes_max: u64::MAX,
    });
    h.writer.submit(Row {
        number: 1,
        generation: 0,
        payload: "panic",
    });
    h.entered(1);
    let permits = h.permits.clone();
    let opener = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(100));
        permits.send(()).expect("permit");
    });
    // 2 waits for room; the thread panics on 1 meanwhile.
    h.writer.submit(row(2, 0));
    opener.join().expect("opener");
    // The failure from 1 covers 2 (the core fails every change from 1 on): a second report
    // would name a change the core already rolled back.
    assert_eq!(h.outcomes(1), vec![Outcome::CommitFailed { number: 1 }]);
    assert_eq!(h.writer.poll_outcome(), None);
    assert_eq!(h.writer.unresolved(), 0);
    // The next generation fails on its own, at once.
    h.writer.submit(row(3, 1));
    h.writer.submit(row(4, 1));
    assert_eq!(h.outcomes(1), vec![Outcome::CommitFailed { number: 3 }]);
    assert_eq!(h.writer.poll_outcome(), None);
}

#[test]
fn the_notify_callback_fires_for_outcomes_and_when_the_thread_ends() {
    use std::sync::atomic::AtomicUsize;
    let dir = tempfile::tempdir().expect("tempdir");
    let conn = open(&dir.path().join("t.db"));
    let wakes = Arc::new(AtomicUsize::new(0));
    let counted = wakes.clone();
    let mut writer = Writer::start(
        TableStore { conn, gate: None },
        WriterLimits::default(),
        Duration::ZERO,
        move || {
            counted.fetch_add(1, Ordering::SeqCst);
        },
    )
    .expect("start");
    writer.submit(row(1, 0));
    assert_eq!(
        writer.wait_outcome(Duration::from_secs(10)),
        Some(Outcome::Durable { through: 1 })
    );
    // The thread sends the outcome, then wakes the loop: the outcome can be seen a moment
    // before the wake is counted (a loop that drains on each wake still sees it then).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while wakes.load(Ordering::SeqCst) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert!(
        wakes.load(Ordering::SeqCst) >= 1,
        "the outcome woke the loop"
    );
    let before = wakes.load(Ordering::SeqCst);
    assert!(writer.finish(Duration::from_secs(10)));
    assert!(
        wakes.load(Ordering::SeqCst) > before,
        "the ending wakes the loop"
    );
}

/// Against SQLite and a real host: nothing a change reveals leaves the host before the writer
/// reports it durable, and a restart finds it.
mod with_a_host {
    use super::*;
    use crate::sqlite::{SqliteReader, SqliteStore, SqliteWriter};
    use axhost_core::{ConnId, Host, HostConfig, Input, Now, Output, Principal, Store, Table};
    use serde_json::Value;

    fn drain(host: &mut Host<SqliteReader>, writer: &mut Writer<Box<Change>>) -> Vec<Value> {
        let mut frames = Vec::new();
        while let Some(out) = host.poll_output() {
            match out {
                Output::Commit(change) => writer.submit(change),
                Output::Send { frame, .. } => {
                    frames.push(serde_json::from_str(frame.as_str()).expect("json"))
                }
                Output::Close { conn, .. } => panic!("{conn:?} closed"),
            }
        }
        frames
    }

    fn deliver(host: &mut Host<SqliteReader>, writer: &mut Writer<Box<Change>>, now: Now) {
        while let Some(outcome) = writer.wait_outcome(Duration::from_secs(10)) {
            host.handle(
                now,
                match outcome {
                    Outcome::Durable { through } => Input::Durable { through },
                    Outcome::CommitFailed { number } => Input::CommitFailed { number },
                },
            );
            if writer.unresolved() == 0 {
                break;
            }
        }
    }

    fn start(path: &Path) -> (Host<SqliteReader>, Writer<Box<Change>>) {
        let (reader, store): (SqliteReader, SqliteWriter) =
            SqliteStore::open(path, "default").expect("open").split();
        let host = Host::new(HostConfig::default(), reader, 7).expect("host");
        let writer =
            Writer::start(store, WriterLimits::default(), Duration::ZERO, || {}).expect("start");
        (host, writer)
    }

    #[test]
    fn answers_wait_for_the_writer_and_a_restart_finds_what_it_committed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("x.db");
        let (mut host, mut writer) = start(&path);
        let now = Now::at(1);
        let conn = ConnId(1);
        host.handle(
            now,
            Input::Connected {
                conn,
                principal: Arc::new(Principal::maintainer("me")),
            },
        );
        let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":"c1"}}"#;
        host.handle(now, Input::Message { conn, text: init });
        let mut frames = drain(&mut host, &mut writer);
        deliver(&mut host, &mut writer, now);
        frames.extend(drain(&mut host, &mut writer));
        assert!(frames
            .iter()
            .any(|f| f["id"] == 1 && f.get("result").is_some()));
        for id in 2..=4 {
            let create = format!(
                r#"{{"jsonrpc":"2.0","id":{id},"method":"createSession","params":{{"channel":"ahp-session:/s{id}"}}}}"#
            );
            host.handle(
                now,
                Input::Message {
                    conn,
                    text: &create,
                },
            );
        }
        let before = drain(&mut host, &mut writer);
        assert!(
            before
                .iter()
                .all(|f| f["id"].as_u64().is_none_or(|id| id < 2)),
            "an answer left before its change was durable: {before:?}"
        );
        assert!(host.changes_in_flight() > 0);
        deliver(&mut host, &mut writer, now);
        let after = drain(&mut host, &mut writer);
        for id in 2..=4u64 {
            assert!(
                after
                    .iter()
                    .any(|f| f["id"] == id && f.get("result").is_some()),
                "no answer to {id}: {after:?}"
            );
        }
        assert_eq!(host.changes_in_flight(), 0);
        let durable = host.changes_durable();
        assert!(writer.finish(Duration::from_secs(10)));
        drop(host);
        let mut store = SqliteStore::open(&path, "default").expect("reopen");
        let loaded = store.load(16).expect("load");
        assert!(loaded
            .records
            .iter()
            .any(|r| r.table == Table::Client && r.key == "c1"));
        let restarted = Host::new(HostConfig::default(), store, 8).expect("restart");
        assert_eq!(
            restarted.session_count(),
            3,
            "{durable} changes were durable"
        );
    }
}

#[test]
fn the_writer_spins_only_while_changes_come_within_the_budget() {
    let (tx, rx) = crossbeam_channel::unbounded::<u64>();
    let mut waiting = SpinWait::new(Duration::from_millis(50));
    assert!(!waiting.spins(), "not before a first wait");
    tx.send(1).expect("send");
    assert_eq!(waiting.next(&rx), Some(1));
    assert!(waiting.spins(), "the change was already there");
    // Sends `change` after `ms` milliseconds, from another thread.
    let send_after = |ms: u64, change: u64| {
        let sender = tx.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(ms));
            sender.send(change).expect("send");
        })
    };
    // A change that comes while the writer polls is taken by the poll.
    let late = send_after(2, 2);
    assert_eq!(waiting.next(&rx), Some(2));
    late.join().expect("sender");
    assert!(waiting.spins());
    // One that comes after the budget: the next wait sleeps at once.
    let later = send_after(120, 3);
    assert_eq!(waiting.next(&rx), Some(3));
    later.join().expect("sender");
    assert!(
        !waiting.spins(),
        "the previous change came after the budget"
    );
    // A closed queue ends the wait, polling or not.
    drop(tx);
    assert_eq!(waiting.next(&rx), None);
}

#[test]
fn a_zero_budget_never_spins() {
    let (tx, rx) = crossbeam_channel::unbounded::<u64>();
    let mut waiting = SpinWait::new(Duration::ZERO);
    for n in 0..3 {
        tx.send(n).expect("send");
        assert_eq!(waiting.next(&rx), Some(n));
        assert!(!waiting.spins());
    }
    drop(tx);
    assert_eq!(waiting.next(&rx), None);
}
