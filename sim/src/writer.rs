//! The simulated writer: the driver half of the asynchronous write path.
//!
//! The core hands out changes (`Output::Commit`); the writer commits them later, in `number`
//! order, as the production writer thread does: when it is ready it takes *everything* queued
//! and commits it in one transaction (group commit). A transaction takes a seeded latency
//! (sometimes a slow one); when it is durable in the store the host is told, a seeded moment
//! later, `Durable { through }` with the last number in it. A transaction the store refuses
//! leaves nothing behind; the host is told `CommitFailed { number }` with the first number in
//! it, and the writer drops, without committing or reporting, every later change whose
//! generation is at most the highest in the failed transaction (the core rolled them back),
//! whether already queued or handed out before the host heard of the failure.
//!
//! Three moments matter for one transaction: *taken* (the writer starts it), *done* (durable
//! in the store, or refused) and *reported* (the host hears). A crash ([`SimWriter::crash`])
//! can fall between any two: what was done survives in the store, everything else is gone,
//! including reports still on their way.

use std::collections::VecDeque;

use rand::Rng;
use rand_chacha::ChaCha8Rng;

use crate::options::Ratio;

/// What the writer needs to know of a change: its place in the order and its generation.
pub trait Numbered {
    /// 1, 2, 3, … per host instance, in the order handed out.
    fn number(&self) -> u64;
    /// Bumped by the core each time it handles a `CommitFailed`.
    fn generation(&self) -> u64;
}

impl Numbered for Box<axhost_core::Change> {
    fn number(&self) -> u64 {
        self.number
    }
    fn generation(&self) -> u64 {
        self.generation
    }
}

/// How the simulated disk behaves, drawn from the seed (`Options::commits`).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct CommitProfile {
    /// Shortest transaction, in milliseconds.
    pub latency_ms_min: u64,
    /// Longest ordinary transaction.
    pub latency_ms_max: u64,
    /// Per transaction: slow (a stalled disk, an fsync behind a checkpoint).
    pub slow: Ratio,
    /// Longest slow transaction.
    pub slow_ms_max: u64,
    /// Longest pause between a transaction being done and the host hearing of it (the
    /// writer's channel back to the event loop).
    pub report_ms_max: u64,
    /// Longest pause before an idle writer takes what is queued (so several changes queue up
    /// and commit together even when the disk is fast).
    pub gather_ms_max: u64,
}

impl CommitProfile {
    /// Commits done at once and reported at once: the old synchronous behaviour, in effect.
    pub const INSTANT: CommitProfile = CommitProfile {
        latency_ms_min: 0,
        latency_ms_max: 0,
        slow: Ratio::NEVER,
        slow_ms_max: 0,
        report_ms_max: 0,
        gather_ms_max: 0,
    };
}

/// What the host is to be told.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// `Input::Durable { through }`.
    Durable {
        /// The last number of the transaction.
        through: u64,
    },
    /// `Input::CommitFailed { number }`.
    Failed {
        /// The first number of the transaction.
        number: u64,
    },
}

/// Counters for the run report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions made durable.
    pub transactions: u64,
    /// Changes made durable.
    pub changes: u64,
    /// Most changes in one transaction.
    pub largest: u64,
    /// Transactions that were slow.
    pub slow: u64,
    /// Transactions the store refused.
    pub failed: u64,
    /// Changes in refused transactions.
    pub failed_changes: u64,
    /// Changes dropped after a failure (built on the failed state).
    pub dropped: u64,
    /// Changes lost in crashes (handed out, never durable).
    pub lost: u64,
    /// Crashes that found something in flight.
    pub crashes_in_flight: u64,
}

struct Transaction<T> {
    done_at: u64,
    changes: Vec<T>,
}

/// The simulated writer. See the module docs.
pub struct SimWriter<T> {
    profile: CommitProfile,
    rng: ChaCha8Rng,
    /// Handed out, not yet taken.
    queue: VecDeque<T>,
    /// When an idle writer takes the queue.
    take_at: Option<u64>,
    /// The transaction being committed.
    current: Option<Transaction<T>>,
    /// Outcomes on their way to the host, in order, with when they arrive.
    reports: VecDeque<(u64, Outcome)>,
    /// After a failure: changes of this generation or older are dropped.
    drop_through_generation: Option<u64>,
    /// Highest number handed in.
    submitted_through: u64,
    /// Highest number durable in the store.
    done_through: u64,
    /// Slow transactions happen only while armed (the liveness phase heals the disk).
    armed: bool,
    /// Scripted tests: the next transaction taken lasts this long.
    next_latency_ms: Option<u64>,
    /// Scripted tests: the next report takes this long to reach the host.
    next_report_ms: Option<u64>,
    /// Counters.
    pub stats: WriterStats,
}

impl<T: Numbered> SimWriter<T> {
    /// An idle writer.
    pub fn new(profile: CommitProfile, rng: ChaCha8Rng) -> SimWriter<T> {
        SimWriter {
            profile,
            rng,
            queue: VecDeque::new(),
            take_at: None,
            current: None,
            reports: VecDeque::new(),
            drop_through_generation: None,
            submitted_through: 0,
            done_through: 0,
            armed: true,
            next_latency_ms: None,
            next_report_ms: None,
            stats: WriterStats::default(),
        }
    }

    /// Takes a change the host handed out at `now_ms`. Fails when it is out of order: the
    /// contract numbers changes 1, 2, 3, … per host instance.
    pub fn submit(&mut self, change: T, now_ms: u64) -> Result<(), String> {
        let n = change.number();
        if n != self.submitted_through + 1 {
            return Err(format!(
                "the host handed out change {n} after change {}",
                self.submitted_through
            ));
        }
        self.submitted_through = n;
        if self
            .drop_through_generation
            .is_some_and(|g| change.generation() <= g)
        {
            self.stats.dropped += 1;
            return Ok(());
        }
        self.queue.push_back(change);
        if self.current.is_none() && self.take_at.is_none() {
            self.take_at = Some(now_ms + self.draw(self.profile.gather_ms_max));
        }
        Ok(())
    }

    /// The earliest moment the writer has something to do.
    pub fn next_due(&self) -> Option<u64> {
        [
            self.take_at,
            self.current.as_ref().map(|t| t.done_at),
            self.reports.front().map(|r| r.0),
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// Does everything due at `now_ms`: finishes the transaction (through `commit`, which
    /// applies all of it to the store or none of it), takes the queue, and returns the
    /// outcomes that reach the host now, in order.
    pub fn run_due<E>(
        &mut self,
        now_ms: u64,
        mut commit: impl FnMut(&[T]) -> Result<(), E>,
    ) -> Vec<Outcome> {
        if self.current.as_ref().is_some_and(|t| t.done_at <= now_ms) {
            if let Some(t) = self.current.take() {
                self.finish(t, now_ms, &mut commit);
            }
        }
        if self.current.is_none() && self.take_at.is_some_and(|at| at <= now_ms) {
            self.take(now_ms);
        }
        let mut out = Vec::new();
        while self.reports.front().is_some_and(|r| r.0 <= now_ms) {
            if let Some((_, outcome)) = self.reports.pop_front() {
                out.push(outcome);
            }
        }
        out
    }

    fn finish<E>(
        &mut self,
        t: Transaction<T>,
        now_ms: u64,
        commit: &mut impl FnMut(&[T]) -> Result<(), E>,
    ) {
        let (Some(first), Some(last)) = (t.changes.first(), t.changes.last()) else {
            return;
        };
        let (first, last) = (first.number(), last.number());
        let outcome = match commit(&t.changes) {
            Ok(()) => {
                self.done_through = last;
                self.stats.transactions += 1;
                self.stats.changes += t.changes.len() as u64;
                self.stats.largest = self.stats.largest.max(t.changes.len() as u64);
                Outcome::Durable { through: last }
            }
            Err(_) => {
                self.stats.failed += 1;
                self.stats.failed_changes += t.changes.len() as u64;
                let newest = t.changes.iter().map(Numbered::generation).max();
                let g = newest.unwrap_or_default();
                self.drop_through_generation =
                    Some(self.drop_through_generation.map_or(g, |d| d.max(g)));
                let before = self.queue.len();
                self.queue.retain(|c| c.generation() > g);
                self.stats.dropped += (before - self.queue.len()) as u64;
                Outcome::Failed { number: first }
            }
        };
        // Reports travel in order: one never overtakes the one before.
        let delay = match self.next_report_ms.take() {
            Some(ms) => ms,
            None => self.draw(self.profile.report_ms_max),
        };
        let due = (now_ms + delay).max(self.reports.back().map_or(0, |r| r.0));
        self.reports.push_back((due, outcome));
        if !self.queue.is_empty() {
            self.take_at = Some(now_ms + self.draw(self.profile.gather_ms_max));
        }
    }

    fn take(&mut self, now_ms: u64) {
        self.take_at = None;
        if self.queue.is_empty() {
            return;
        }
        let changes: Vec<T> = self.queue.drain(..).collect();
        let slow = self.armed && self.profile.slow.hit(&mut self.rng);
        let latency = if let Some(ms) = self.next_latency_ms.take() {
            ms
        } else if slow {
            self.stats.slow += 1;
            let min = self.profile.latency_ms_max;
            self.rng
                .random_range(min..=self.profile.slow_ms_max.max(min))
        } else {
            self.rng
                .random_range(self.profile.latency_ms_min..=self.profile.latency_ms_max)
        };
        self.current = Some(Transaction {
            done_at: now_ms + latency,
            changes,
        });
    }

    fn draw(&mut self, max: u64) -> u64 {
        if max == 0 {
            0
        } else {
            self.rng.random_range(0..=max)
        }
    }

    /// The host process died: every change not yet durable is gone with it, and so is every
    /// report on its way. The store keeps what was done. The writer starts over for the next
    /// host, whose numbers start from 1 again.
    pub fn crash(&mut self) {
        let lost = self.queue.len() + self.current.as_ref().map_or(0, |t| t.changes.len());
        if lost > 0 || !self.reports.is_empty() {
            self.stats.crashes_in_flight += 1;
        }
        self.stats.lost += lost as u64;
        self.queue.clear();
        self.current = None;
        self.take_at = None;
        self.reports.clear();
        self.drop_through_generation = None;
        self.submitted_through = 0;
        self.done_through = 0;
    }

    /// The next transaction taken lasts `ms` (scripted tests: a slow disk, once).
    pub fn slow_next_transaction(&mut self, ms: u64) {
        self.next_latency_ms = Some(ms);
    }

    /// The next outcome reaches the host `ms` after it is done (scripted tests: a crash
    /// between durability and its report).
    pub fn delay_next_report(&mut self, ms: u64) {
        self.next_report_ms = Some(ms);
    }

    /// No more slow transactions (the liveness phase).
    pub fn heal(&mut self) {
        self.armed = false;
    }

    /// One round of a clean stop: everything due at the stop's next instant (see
    /// [`CleanStop`]), committed through `commit`; the outcomes go to the host before the next
    /// round, since what they release may submit more. An error once the stop ran out of rounds.
    pub fn stop_round<E>(
        &mut self,
        stop: &mut CleanStop,
        commit: impl FnMut(&[T]) -> Result<(), E>,
    ) -> Result<Vec<Outcome>, String> {
        let at_ms = stop.next_round()?;
        Ok(self.run_due(at_ms, commit))
    }

    /// Whether anything is queued, being committed, or not yet reported.
    pub fn busy(&self) -> bool {
        !self.queue.is_empty() || self.current.is_some() || !self.reports.is_empty()
    }

    /// Whether a transaction is being committed or queued for one (not counting reports on
    /// their way).
    pub fn committing(&self) -> bool {
        !self.queue.is_empty() || self.current.is_some()
    }

    /// Highest number handed in by the current host.
    pub fn submitted_through(&self) -> u64 {
        self.submitted_through
    }

    /// Highest number durable in the store for the current host (0 when none yet).
    pub fn done_through(&self) -> u64 {
        self.done_through
    }

    /// The changes handed in and not yet done (queued or being committed), oldest first.
    pub fn pending(&self) -> impl Iterator<Item = &T> + '_ {
        self.current
            .iter()
            .flat_map(|t| t.changes.iter())
            .chain(self.queue.iter())
    }
}

/// The instants of a clean stop: each a billion milliseconds past the last, so that every
/// latency, slow commit and report delay has passed and each round finishes a transaction,
/// while the world's own clock does not move (a stop takes no simulated time). Bounded, so a
/// writer that never empties is a violation instead of a hang.
#[derive(Debug)]
pub struct CleanStop {
    at_ms: u64,
    rounds: u32,
}

impl CleanStop {
    /// Rounds a stop may take: far more than the changes a host can have in flight.
    pub const ROUNDS_MAX: u32 = 100_000;

    /// A stop beginning at `now_ms`.
    pub fn at(now_ms: u64) -> CleanStop {
        CleanStop {
            at_ms: now_ms,
            rounds: 0,
        }
    }

    /// The next round's instant, or an error past [`CleanStop::ROUNDS_MAX`].
    pub fn next_round(&mut self) -> Result<u64, String> {
        self.rounds += 1;
        if self.rounds > Self::ROUNDS_MAX {
            return Err("the writer never settled for a clean stop".into());
        }
        self.at_ms = self.at_ms.saturating_add(1_000_000_000);
        Ok(self.at_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[derive(Debug, Clone, PartialEq)]
    struct C(u64, u64);

    impl Numbered for C {
        fn number(&self) -> u64 {
            self.0
        }
        fn generation(&self) -> u64 {
            self.1
        }
    }

    fn writer(profile: CommitProfile) -> SimWriter<C> {
        SimWriter::new(profile, ChaCha8Rng::seed_from_u64(1))
    }

    const FIXED: CommitProfile = CommitProfile {
        latency_ms_min: 10,
        latency_ms_max: 10,
        slow: Ratio::NEVER,
        slow_ms_max: 0,
        report_ms_max: 0,
        gather_ms_max: 0,
    };

    /// Runs everything due until `until_ms`, committing into `store`, failing transactions
    /// whose first number is in `fail`.
    fn run(
        w: &mut SimWriter<C>,
        until_ms: u64,
        store: &mut Vec<u64>,
        fail: &[u64],
    ) -> Vec<(u64, Outcome)> {
        let mut out = Vec::new();
        while let Some(at) = w.next_due().filter(|&at| at <= until_ms) {
            let got = w.run_due(at, |batch: &[C]| {
                if fail.contains(&batch[0].0) {
                    return Err(());
                }
                store.extend(batch.iter().map(|c| c.0));
                Ok(())
            });
            out.extend(got.into_iter().map(|o| (at, o)));
        }
        out
    }

    #[test]
    fn everything_queued_when_ready_commits_together_in_order() {
        let mut w = writer(FIXED);
        let mut store = Vec::new();
        w.submit(C(1, 0), 0).expect("in order");
        assert_eq!(run(&mut w, 0, &mut store, &[]), vec![]);
        // The writer is busy with 1 for 10 ms; 2 and 3 queue up and go together.
        w.submit(C(2, 0), 3).expect("in order");
        w.submit(C(3, 0), 4).expect("in order");
        let out = run(&mut w, 100, &mut store, &[]);
        assert_eq!(
            out,
            vec![
                (10, Outcome::Durable { through: 1 }),
                (20, Outcome::Durable { through: 3 })
            ]
        );
        assert_eq!(store, vec![1, 2, 3]);
        assert_eq!(w.stats.largest, 2);
        assert!(!w.busy());
        assert!(w.submit(C(5, 0), 100).is_err(), "numbers have no gaps");
    }

    #[test]
    fn a_failure_drops_later_changes_of_its_generation_only() {
        let mut w = writer(FIXED);
        let mut store = Vec::new();
        w.submit(C(1, 0), 0).expect("in order");
        assert_eq!(run(&mut w, 0, &mut store, &[1]), vec![]);
        w.submit(C(2, 0), 1).expect("in order");
        w.submit(C(3, 0), 2).expect("in order");
        let out = run(&mut w, 15, &mut store, &[1]);
        assert_eq!(out, vec![(10, Outcome::Failed { number: 1 })]);
        // Handed out before the host heard: same generation, dropped on arrival.
        w.submit(C(4, 0), 16).expect("in order");
        // After the host bumped its generation: committed.
        w.submit(C(5, 1), 17).expect("in order");
        let out = run(&mut w, 100, &mut store, &[]);
        assert_eq!(out, vec![(27, Outcome::Durable { through: 5 })]);
        assert_eq!(store, vec![5]);
        assert_eq!((w.stats.failed_changes, w.stats.dropped), (1, 3));
    }

    #[test]
    fn a_crash_keeps_what_was_done_and_loses_the_rest() {
        let mut w = writer(CommitProfile {
            report_ms_max: 50,
            ..FIXED
        });
        let mut store = Vec::new();
        w.submit(C(1, 0), 0).expect("in order");
        let _ = run(&mut w, 10, &mut store, &[]);
        w.submit(C(2, 0), 11).expect("in order");
        // 1 is durable at 10 and its report may still be on its way at 12; 2 is committing.
        let _ = run(&mut w, 12, &mut store, &[]);
        assert_eq!(store, vec![1]);
        assert_eq!(w.done_through(), 1);
        w.crash();
        assert!(!w.busy());
        assert_eq!(w.stats.lost, 1);
        // The next host numbers from 1 again.
        w.submit(C(1, 0), 20).expect("a new host starts at 1");
    }

    #[test]
    fn reports_never_overtake_each_other() {
        let mut w = writer(CommitProfile {
            latency_ms_min: 0,
            latency_ms_max: 3,
            report_ms_max: 40,
            gather_ms_max: 2,
            ..FIXED
        });
        let mut store = Vec::new();
        let mut outcomes = Vec::new();
        for n in 1..=200 {
            w.submit(C(n, 0), n).expect("in order");
            outcomes.extend(run(&mut w, n, &mut store, &[]));
        }
        outcomes.extend(run(&mut w, u64::MAX, &mut store, &[]));
        let through: Vec<u64> = outcomes
            .iter()
            .map(|(_, o)| match o {
                Outcome::Durable { through } => *through,
                Outcome::Failed { number } => *number,
            })
            .collect();
        assert!(through.windows(2).all(|w| w[0] < w[1]), "{through:?}");
        assert_eq!(through.last(), Some(&200));
        assert_eq!(store, (1..=200).collect::<Vec<_>>());
    }

    #[test]
    fn a_clean_stop_finishes_every_transaction_and_is_bounded() {
        let mut w = writer(CommitProfile {
            slow: Ratio::new(1, 1),
            slow_ms_max: 60_000,
            ..FIXED
        });
        for n in 1..=5 {
            w.submit(C(n, 0), 0).expect("submit");
        }
        let mut stop = CleanStop::at(0);
        let mut committed = Vec::new();
        let mut reported = Vec::new();
        while w.busy() {
            let outcomes = w
                .stop_round(&mut stop, |batch: &[C]| {
                    committed.extend(batch.iter().map(|c| c.0));
                    Ok::<(), ()>(())
                })
                .expect("a round");
            reported.extend(outcomes);
        }
        assert_eq!(committed, [1, 2, 3, 4, 5]);
        assert_eq!(reported.last(), Some(&Outcome::Durable { through: 5 }));
        let mut endless = CleanStop::at(0);
        for _ in 0..CleanStop::ROUNDS_MAX {
            endless.next_round().expect("within the bound");
        }
        assert!(
            endless.next_round().is_err(),
            "a stop that never ends fails"
        );
    }
}
