//! The world's side of the asynchronous write path: every `Output::Commit` goes to the
//! simulated writer ([`crate::writer`]), whose outcomes come back as `Input::Durable` and
//! `Input::CommitFailed` when they fall due; crashes land between a transaction's start, its
//! durability and its report. The durability oracles ([`crate::durability`]) follow each
//! change from the moment it is handed out.

use std::collections::{BTreeMap, BTreeSet};

use axhost_core::{Change, Input, Table};
use rand::Rng;

use super::{Event, World};
use crate::checker::Violation;
use crate::durability::{session_of_key, ChangeInfo};
use crate::writer::{Numbered, Outcome, WriterStats};

impl Numbered for Change {
    fn number(&self) -> u64 {
        self.number
    }
    fn generation(&self) -> u64 {
        self.generation
    }
}

/// What the oracles need to know of `change`.
pub(crate) fn change_info(change: &Change) -> ChangeInfo {
    let mut sessions = BTreeSet::new();
    let event_keys = change.events.iter().map(|e| e.channel.as_str());
    let record_keys = change
        .records
        .iter()
        .filter(|r| r.table == Table::State)
        .map(|r| r.key.as_str());
    for key in event_keys.chain(record_keys) {
        if let Some(id) = session_of_key(key) {
            sessions.insert(id.to_owned());
        }
    }
    ChangeInfo {
        number: change.number,
        generation: change.generation,
        server_seq: change.server_seq,
        events: change
            .events
            .iter()
            .map(|e| (e.seq, e.channel.clone()))
            .collect(),
        receipts: change
            .receipts
            .iter()
            .map(|r| (r.owner.clone(), r.key.clone()))
            .collect(),
        sessions,
    }
}

impl World {
    /// An `Output::Commit` drained from the host: the oracles follow it, the writer takes it.
    pub(super) fn commit_out(&mut self, change: Box<Change>) -> Result<(), Violation> {
        let info = change_info(&change);
        self.issued_now.push(info.number);
        self.checker.durability.issued(info, self.cause.clone());
        let result = self.writer.submit(change, self.clock.mono_ms);
        result.map_err(|m| self.violation(m))
    }

    /// After a drain: the host's state of every channel the drain's changes touched is the
    /// state right after the last of them to touch it.
    pub(super) fn record_after(&mut self) {
        if self.issued_now.is_empty() {
            return;
        }
        let numbers = std::mem::take(&mut self.issued_now);
        let Some(host) = self.host.as_ref() else {
            return;
        };
        let mut last: BTreeMap<String, u64> = BTreeMap::new();
        for n in numbers {
            for uri in self.checker.durability.channels_of(n) {
                last.insert(uri, n);
            }
        }
        for (uri, n) in last {
            let state = host.channel_state(&uri);
            self.checker.durability.set_after(n, uri, state);
        }
    }

    /// Does what the writer has due now and tells the host what came of it.
    pub(super) fn run_writer(&mut self) -> Result<(), Violation> {
        let now_ms = self.clock.mono_ms;
        let Some(host) = self.host.as_mut() else {
            return Ok(());
        };
        let outcomes = self
            .writer
            .run_due(now_ms, |batch| host.store_mut().commit_group(batch));
        if self.writer.committing()
            && !self.liveness
            && self.options.crash_in_flight.hit(&mut self.rng)
        {
            let commits = self.options.commits;
            let within = commits.latency_ms_max + commits.report_ms_max + 1;
            let at = now_ms + self.rng.random_range(0..=within);
            self.schedule(at, Event::Crash);
        }
        for outcome in outcomes {
            match outcome {
                Outcome::Durable { through } => {
                    let known = self.checker.durability.durable(through);
                    known.map_err(|m| self.violation(m))?;
                    self.feed(Input::Durable { through })?;
                }
                Outcome::Failed { number } => {
                    let touched = self.checker.durability.failed(number);
                    let touched = touched.map_err(|m| self.violation(m))?;
                    self.feed(Input::CommitFailed { number })?;
                    if let Some(host) = self.host.as_ref() {
                        let result = self.checker.durability.after_failure(host, &touched);
                        result.map_err(|m| self.violation(format!("failed batch: {m}")))?;
                    }
                }
            }
        }
        if let Some(host) = self.host.as_ref() {
            let pool = self.options.session_ids();
            self.checker.durability.relearn(host, &pool);
        }
        Ok(())
    }

    /// The writer's counters.
    pub fn commit_stats(&self) -> &WriterStats {
        &self.writer.stats
    }

    /// Changes handed to the writer and not yet durable (queued or being committed).
    pub fn commits_pending(&self) -> usize {
        self.writer.pending().count()
    }

    /// The store refuses the next `n` transactions (scripted tests).
    pub fn fail_next_commits(&self, n: u32) {
        if let Some(h) = &self.host {
            h.store().fail_next_commits(n);
        }
    }

    /// The next transaction the writer takes lasts `ms` (scripted tests).
    pub fn slow_next_commit(&mut self, ms: u64) {
        self.writer.slow_next_transaction(ms);
    }

    /// The next outcome reaches the host `ms` after it is done (scripted tests).
    pub fn delay_next_report(&mut self, ms: u64) {
        self.writer.delay_next_report(ms);
    }
}
