//! The writer thread: durable changes committed off the event loop, many to a transaction.
//!
//! ```text
//!   event loop                               writer thread
//!   ──────────                               ─────────────
//!   Output::Commit ─► Writer::submit ──changes──► take the first, then all that are queued
//!                     (waits only when the          │ drop those of a failed generation
//!                      queue budget is spent)       ▼
//!                                                 one BEGIN IMMEDIATE … COMMIT (group commit)
//!   Writer::poll_outcome ◄──outcomes── Durable { through } / CommitFailed { number }
//!        ▲                                          │
//!        └──────────── notify (a mio::Waker) ◄──────┘
//! ```
//!
//! The rules are the write-path contract (`Input::Durable`, `Input::CommitFailed`): changes are
//! committed in `number` order; a consecutive run of them shares one transaction; a transaction
//! that is durable is reported as `Durable { through: <its last number> }`; one that fails
//! reports `CommitFailed { number: <its first number> }`, and every later change whose
//! generation is at most the failed transaction's highest one is dropped without a word (the
//! core has rolled it back). A group that fails is tried again one change per transaction
//! before anything is reported, so one change SQLite refuses fails alone and does not take the
//! unrelated changes that happened to queue beside it down with it.
//!
//! ## The queue budget (backpressure)
//! At most [`WriterLimits::changes_max`] changes and [`WriterLimits::bytes_max`] bytes wait for
//! the writer. When a new change would pass either, [`Writer::submit`] blocks the event loop
//! until the writer has finished enough: the disk sets the pace, as it did when every commit
//! ran on the loop, and memory stays bounded. The budget is large next to what one fsync lets
//! pile up (a transaction takes every queued change, so the queue empties each commit), so the
//! wait happens only when the disk is far slower than the traffic. A change larger than the
//! whole byte budget waits for an empty queue and then goes alone.
//!
//! ## When the writer dies
//! The thread ends only when the event loop closes the queue, or by a panic (a bug). A panic
//! unwinds through the open transaction, which SQLite rolls back, and marks the budget closed
//! and calls `notify`, so the loop never waits for a writer that is gone: every change it
//! handed over without an outcome, and every change it hands over afterwards, is reported as
//! failed, and the host answers those clients as for any failed commit.

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axhost_core::StoreError;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};

/// A change as the writer sees it: where it sits in the order, which generation built it, and
/// roughly what it costs to hold.
pub trait QueuedChange: Send + 'static {
    /// The core's change number: 1, 2, 3, … in the order the core handed them out.
    fn number(&self) -> u64;
    /// The core's generation when it built the change (bumped by each `CommitFailed`).
    fn generation(&self) -> u64;
    /// Approximate bytes held while queued, for the queue budget.
    fn queued_bytes(&self) -> u64;
}

/// Where the writer commits: a store that can write a run of changes in one transaction.
pub trait BatchStore: Send + 'static {
    /// What the store commits.
    type Change: QueuedChange;
    /// Writes `batch`, in order, in one durable transaction. On `Err` nothing of it is applied.
    fn commit_batch(&mut self, batch: &[Self::Change]) -> Result<(), StoreError>;
}

/// What the writer learned about the changes it was given, in the contract's terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every change up to and including `through` is durable.
    Durable {
        /// The last number in the transaction.
        through: u64,
    },
    /// The transaction starting with change `number` failed; nothing of it is applied.
    CommitFailed {
        /// The first number in the failed transaction.
        number: u64,
    },
}

/// What goes back from the thread: an outcome, plus what the loop needs to keep its list of
/// unresolved changes (the generation up to which later changes are dropped).
#[derive(Clone, Copy, Debug)]
enum Report {
    Durable { through: u64 },
    Failed { number: u64, drops_through: u64 },
}

/// How much may wait for the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriterLimits {
    /// Changes handed over and not yet committed, failed or dropped.
    pub changes_max: usize,
    /// Their [`QueuedChange::queued_bytes`], summed.
    pub bytes_max: u64,
}

impl Default for WriterLimits {
    /// 4,096 changes or 64 MiB: a few hundred milliseconds of the fastest durable traffic this
    /// host has carried, and far more than one commit's worth at the rates it serves.
    fn default() -> WriterLimits {
        WriterLimits {
            changes_max: 4096,
            bytes_max: 64 << 20,
        }
    }
}

/// A submit that had to wait this long is logged as a warning (the disk is far behind).
const SLOW_SUBMIT_WARN: Duration = Duration::from_secs(1);

/// What is queued for the writer, shared by the loop (which adds) and the thread (which frees).
struct Budget {
    state: Mutex<BudgetState>,
    freed: Condvar,
    limits: WriterLimits,
}

#[derive(Default)]
struct BudgetState {
    changes: usize,
    bytes: u64,
    /// The writer thread has ended: nothing will be freed again.
    closed: bool,
}

impl Budget {
    fn lock(&self) -> MutexGuard<'_, BudgetState> {
        // The state is two counters and a flag, valid whatever a panicking holder was doing.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes room for one change of `bytes`, waiting while the queue is full. False when the
    /// writer is gone.
    fn acquire(&self, bytes: u64) -> bool {
        let mut state = self.lock();
        let started = Instant::now();
        let mut waited = false;
        loop {
            if state.closed {
                return false;
            }
            let empty = state.changes == 0;
            let fits = state.changes < self.limits.changes_max
                && state.bytes.saturating_add(bytes) <= self.limits.bytes_max;
            if fits || empty {
                state.changes += 1;
                state.bytes = state.bytes.saturating_add(bytes);
                break;
            }
            waited = true;
            state = self
                .freed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        if waited {
            let wait = started.elapsed();
            if wait >= SLOW_SUBMIT_WARN {
                tracing::warn!(
                    wait_ms = wait.as_millis() as u64,
                    "the disk is far behind: the event loop waited for the writer"
                );
            } else {
                tracing::debug!(
                    wait_us = wait.as_micros() as u64,
                    "writer queue full; waited"
                );
            }
        }
        true
    }

    fn release(&self, changes: usize, bytes: u64) {
        let mut state = self.lock();
        state.changes = state.changes.saturating_sub(changes);
        state.bytes = state.bytes.saturating_sub(bytes);
        drop(state);
        self.freed.notify_all();
    }

    fn close(&self) {
        self.lock().closed = true;
        self.freed.notify_all();
    }
}

/// The event loop's end of the writer thread.
pub struct Writer<C: QueuedChange> {
    /// `None` once closed for shutdown.
    changes: Option<Sender<C>>,
    reports: Receiver<Report>,
    budget: Arc<Budget>,
    thread: Option<JoinHandle<()>>,
    /// `(number, generation)` of every change handed over without an outcome yet, oldest first.
    unresolved: VecDeque<(u64, u64)>,
    /// Changes of this generation or older are dropped (a failure covered them).
    drops_through: Option<u64>,
    /// Outcomes decided on this side (the writer is gone), delivered before the thread's.
    local: VecDeque<Outcome>,
    /// The thread is known to be gone; every change from now on fails here.
    dead: bool,
}

impl<C: QueuedChange> Writer<C> {
    /// Starts the writer thread over `store`. `notify` is called from the thread after each
    /// outcome and when the thread ends, so the event loop wakes to collect them.
    pub fn start<S>(
        store: S,
        limits: WriterLimits,
        notify: impl Fn() + Send + 'static,
    ) -> std::io::Result<Writer<C>>
    where
        S: BatchStore<Change = C>,
    {
        let (changes_tx, changes_rx) = crossbeam_channel::unbounded::<C>();
        let (reports_tx, reports_rx) = crossbeam_channel::unbounded::<Report>();
        let budget = Arc::new(Budget {
            state: Mutex::new(BudgetState::default()),
            freed: Condvar::new(),
            limits: WriterLimits {
                changes_max: limits.changes_max.max(1),
                bytes_max: limits.bytes_max,
            },
        });
        let thread_budget = budget.clone();
        let thread = std::thread::Builder::new()
            .name("axhost-writer".into())
            .spawn(move || {
                let ending = Ending {
                    budget: thread_budget.clone(),
                    notify: &notify,
                };
                write_loop(store, &changes_rx, &reports_tx, &thread_budget, &notify);
                drop(ending);
            })?;
        Ok(Writer {
            changes: Some(changes_tx),
            reports: reports_rx,
            budget,
            thread: Some(thread),
            unresolved: VecDeque::new(),
            drops_through: None,
            local: VecDeque::new(),
            dead: false,
        })
    }

    /// Hands `change` to the writer, or drops it if a failure already covered its generation.
    /// Blocks only while the queue budget is spent (see the module docs). If the writer is
    /// gone, the change fails here, and `poll_outcome` reports it.
    pub fn submit(&mut self, change: C) {
        let (number, generation) = (change.number(), change.generation());
        if self.drops_through.is_some_and(|g| generation <= g) {
            return;
        }
        if !self.dead {
            let bytes = change.queued_bytes();
            let sent = self.budget.acquire(bytes)
                && self
                    .changes
                    .as_ref()
                    .is_some_and(|tx| tx.send(change).is_ok());
            if sent {
                self.unresolved.push_back((number, generation));
                return;
            }
            self.writer_gone();
        }
        self.local.push_back(Outcome::CommitFailed { number });
        self.drops_through = Some(generation);
    }

    /// The next outcome, if one is ready; never blocks. Feed each to the core as
    /// `Input::Durable` / `Input::CommitFailed`, in the order returned.
    pub fn poll_outcome(&mut self) -> Option<Outcome> {
        if let Some(outcome) = self.local.pop_front() {
            return Some(outcome);
        }
        if self.dead {
            return None;
        }
        match self.reports.try_recv() {
            Ok(report) => Some(self.resolve(report)),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => {
                self.writer_gone();
                self.local.pop_front()
            }
        }
    }

    /// Waits up to `timeout` for the next outcome (shutdown: let the writer finish what is
    /// queued). `None` when nothing is unresolved or the time ran out.
    pub fn wait_outcome(&mut self, timeout: Duration) -> Option<Outcome> {
        if let Some(outcome) = self.poll_outcome() {
            return Some(outcome);
        }
        if self.dead || self.unresolved.is_empty() {
            return None;
        }
        match self.reports.recv_timeout(timeout) {
            Ok(report) => Some(self.resolve(report)),
            Err(RecvTimeoutError::Timeout) => None,
            Err(RecvTimeoutError::Disconnected) => {
                self.writer_gone();
                self.local.pop_front()
            }
        }
    }

    /// Changes handed over that have no outcome yet.
    pub fn unresolved(&self) -> usize {
        self.unresolved.len()
    }

    /// Closes the queue, lets the thread commit what is still in it, and waits up to `timeout`
    /// for it to end. Returns whether it ended in time; if not, it is left to finish on its own
    /// (the process is about to exit, and what was not yet durable was never revealed).
    pub fn finish(mut self, timeout: Duration) -> bool {
        self.changes = None;
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.reports.recv_timeout(left) {
                Ok(_) => continue,
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    tracing::warn!(
                        unresolved = self.unresolved.len(),
                        "writer did not finish in time; exiting without it"
                    );
                    return false;
                }
            }
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!("writer thread panicked");
            }
        }
        true
    }

    fn resolve(&mut self, report: Report) -> Outcome {
        match report {
            Report::Durable { through } => {
                while self.unresolved.front().is_some_and(|&(n, _)| n <= through) {
                    self.unresolved.pop_front();
                }
                Outcome::Durable { through }
            }
            Report::Failed {
                number,
                drops_through,
            } => {
                // Everything before `number` was reported first; the failed ones and those the
                // thread drops (their generation is covered) are settled with this report.
                while self
                    .unresolved
                    .front()
                    .is_some_and(|&(n, g)| n < number || g <= drops_through)
                {
                    self.unresolved.pop_front();
                }
                self.drops_through = Some(
                    self.drops_through
                        .map_or(drops_through, |g| g.max(drops_through)),
                );
                Outcome::CommitFailed { number }
            }
        }
    }

    /// The thread is gone: whatever it had without an outcome failed, as one transaction.
    fn writer_gone(&mut self) {
        if self.dead {
            return;
        }
        self.dead = true;
        // Outcomes it sent before it went are still valid; take them first, in order.
        while let Ok(report) = self.reports.try_recv() {
            let outcome = self.resolve(report);
            self.local.push_back(outcome);
        }
        tracing::error!(
            unresolved = self.unresolved.len(),
            "the writer thread is gone; every commit fails from now on"
        );
        if let (Some(&(first, _)), Some(&(_, newest))) =
            (self.unresolved.front(), self.unresolved.back())
        {
            self.local
                .push_back(Outcome::CommitFailed { number: first });
            self.drops_through = Some(newest);
        }
        self.unresolved.clear();
    }
}

/// Runs when the thread ends, by return or by panic: no one may wait on it after that.
struct Ending<'a> {
    budget: Arc<Budget>,
    notify: &'a dyn Fn(),
}

impl Drop for Ending<'_> {
    fn drop(&mut self) {
        self.budget.close();
        (self.notify)();
    }
}

/// The thread's body: until the loop closes the queue and it is empty, commit what is queued.
fn write_loop<S: BatchStore>(
    mut store: S,
    changes: &Receiver<S::Change>,
    reports: &Sender<Report>,
    budget: &Budget,
    notify: &dyn Fn(),
) {
    let mut batch: Vec<S::Change> = Vec::new();
    // Changes of this generation or older are dropped: a failure covered them.
    let mut drops_through: Option<u64> = None;
    while let Ok(first) = changes.recv() {
        batch.push(first);
        // Group commit: whatever queued while the last transaction was being made durable.
        while let Ok(next) = changes.try_recv() {
            batch.push(next);
        }
        let taken = batch.len();
        let taken_bytes: u64 = batch.iter().map(QueuedChange::queued_bytes).sum();
        if let Some(g) = drops_through {
            batch.retain(|c| c.generation() > g);
        }
        for report in commit_in_order(&mut store, &batch, &mut drops_through) {
            if reports.send(report).is_err() {
                // The loop is gone (it dropped its end); nothing is waiting for outcomes.
                break;
            }
            notify();
        }
        batch.clear();
        budget.release(taken, taken_bytes);
    }
}

/// Commits `batch` (consecutive numbers, oldest first) and returns the reports to send. Tries
/// it as one transaction; if that fails and it holds more than one change, tries again one
/// change per transaction, so only the change SQLite refuses (and what depends on it) fails.
fn commit_in_order<S: BatchStore>(
    store: &mut S,
    batch: &[S::Change],
    drops_through: &mut Option<u64>,
) -> Vec<Report> {
    let (Some(first), Some(last)) = (batch.first(), batch.last()) else {
        return Vec::new();
    };
    let through = last.number();
    match store.commit_batch(batch) {
        Ok(()) => return vec![Report::Durable { through }],
        Err(e) if batch.len() == 1 => {
            let failed = first;
            tracing::warn!(error = %e, number = failed.number(), "commit failed");
            *drops_through = Some(failed.generation());
            return vec![Report::Failed {
                number: failed.number(),
                drops_through: failed.generation(),
            }];
        }
        Err(e) => {
            tracing::warn!(error = %e, changes = batch.len(), "group commit failed; retrying one change per transaction");
        }
    }
    let mut reports = Vec::new();
    let mut durable_through = None;
    for change in batch {
        if drops_through.is_some_and(|g| change.generation() <= g) {
            continue;
        }
        match store.commit_batch(std::slice::from_ref(change)) {
            Ok(()) => durable_through = Some(change.number()),
            Err(e) => {
                tracing::warn!(error = %e, number = change.number(), "commit failed");
                if let Some(through) = durable_through.take() {
                    reports.push(Report::Durable { through });
                }
                *drops_through = Some(change.generation());
                reports.push(Report::Failed {
                    number: change.number(),
                    drops_through: change.generation(),
                });
            }
        }
    }
    if let Some(through) = durable_through {
        reports.push(Report::Durable { through });
    }
    reports
}

#[cfg(test)]
mod tests {
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
        let writer = Writer::start(store, limits, || {}).expect("start");
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
}
