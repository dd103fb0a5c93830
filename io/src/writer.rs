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
//! ## Waiting
//! Between transactions the writer waits on its queue. A thread asleep on it is woken by the
//! loop's `submit`, and on a VM waking a sleeping CPU costs tens of microseconds: ~60-70 µs of
//! the C = 1 echo (one client dispatching closed-loop) on the reference VM. So the writer polls
//! the queue for up to a budget (`writer_spin_us` in `[tuning]`, default 200 µs) before it
//! sleeps, but only while the previous change came within that budget: a host whose changes
//! arrive far apart, or one at rest, never spins, and the end of a burst wastes at most one
//! budget. Under a steady stream of changes the queue is rarely empty, so the spin costs
//! little where throughput matters; it costs most (~20% of a core) at one closed-loop client,
//! where it saves the most.
//!
//! ## When the writer dies
//! The thread ends only when the event loop closes the queue, or by a panic (a bug). A panic
//! unwinds through the open transaction, which SQLite rolls back, and marks the budget closed
//! and calls `notify`, so the loop never waits for a writer that is gone: every change it
//! handed over without an outcome, and every change it hands over afterwards, is reported as
//! failed, and the host answers those clients as for any failed commit. (The SQLite owner lock
//! is shared with the loop's reader, so the database stays owned while the host runs.)

use std::collections::VecDeque;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use axhost_core::{Change, StoreError};
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

impl QueuedChange for Box<Change> {
    fn number(&self) -> u64 {
        self.number
    }

    fn generation(&self) -> u64 {
        self.generation
    }

    fn queued_bytes(&self) -> u64 {
        self.size() as u64
    }
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
    /// host has carried, and far more than one commit's worth at the rates it serves. The core
    /// itself issues no more than 4,096 changes not yet reported durable (past that it answers
    /// `-32603`), so the change count is a backstop and the byte budget is what binds.
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
        spin: Duration,
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
                let waiting = SpinWait::new(spin);
                write_loop(
                    store,
                    waiting,
                    &changes_rx,
                    &reports_tx,
                    &thread_budget,
                    &notify,
                );
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
            // The failure just reported for what the thread left unresolved covers this
            // change too (the core fails every change from that number on): a second report
            // for it would name a change the core already rolled back.
            if self.drops_through.is_some_and(|g| generation <= g) {
                return;
            }
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
    mut waiting: SpinWait,
    changes: &Receiver<S::Change>,
    reports: &Sender<Report>,
    budget: &Budget,
    notify: &dyn Fn(),
) {
    let mut batch: Vec<S::Change> = Vec::new();
    // Changes of this generation or older are dropped: a failure covered them.
    let mut drops_through: Option<u64> = None;
    while let Some(first) = waiting.next(changes) {
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
        let mut sent = false;
        for report in commit_in_order(&mut store, &batch, &mut drops_through) {
            if reports.send(report).is_err() {
                // The loop is gone (it dropped its end); nothing is waiting for outcomes.
                break;
            }
            sent = true;
        }
        if sent {
            // One wake per transaction group: the loop drains every report it finds.
            notify();
        }
        batch.clear();
        budget.release(taken, taken_bytes);
    }
}

/// How the writer waits for its next change: polling the queue for up to a budget before
/// sleeping on it, when the previous wait was shorter than the budget (module docs,
/// "Waiting"). A zero budget never polls.
#[derive(Debug)]
struct SpinWait {
    budget: Duration,
    /// How long the previous wait lasted, from its start until a change was taken.
    last_wait: Option<Duration>,
}

impl SpinWait {
    fn new(budget: Duration) -> SpinWait {
        SpinWait {
            budget,
            last_wait: None,
        }
    }

    /// Whether the next wait polls first: the previous change came within the budget.
    fn spins(&self) -> bool {
        self.last_wait.is_some_and(|w| w < self.budget)
    }

    /// The next change; `None` once the queue is closed and empty.
    fn next<C>(&mut self, changes: &Receiver<C>) -> Option<C> {
        let started = Instant::now();
        if self.spins() {
            loop {
                match changes.try_recv() {
                    Ok(change) => {
                        self.last_wait = Some(started.elapsed());
                        return Some(change);
                    }
                    Err(TryRecvError::Disconnected) => return None,
                    Err(TryRecvError::Empty) if started.elapsed() >= self.budget => break,
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
        }
        let change = changes.recv().ok()?;
        self.last_wait = Some(started.elapsed());
        Some(change)
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
mod tests;
