//! The one drive loop shared by core tests, the simulator, the fuzz targets and the benches:
//! pure, no I/O.
//!
//! [`Drive::drain`] takes every output the host has, in order: a `Send` or `Close` goes to the
//! caller's sink (and, if asked, `Flushed` is reported for a sent frame at once and `Closed`
//! for a closed connection), a `Commit` is carried out against the host's own store at once
//! ([`Commits::Immediate`]) or queued ([`Commits::Queued`]) for the caller to complete later
//! with [`Drive::complete`], [`Drive::fail`] or [`Drive::crash`] (the simulator's seeded
//! latency, failures and crashes). A completed commit's outcome is reported to the host as the
//! writer contract says, so its released frames come out of the same drain.

use std::collections::VecDeque;

use crate::host::{Host, Input};
use crate::kernel::time::Now;
use crate::log::change::Change;
use crate::log::store::{Commit, Store};
use crate::net::connection::ConnId;
use crate::net::output::Output;

/// When `Output::Commit` changes are carried out.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Commits {
    /// Committed on the host's store as soon as they come out, one transaction each.
    Immediate,
    /// Queued; the caller completes them.
    Queued,
}

/// The drive loop's state: queued commits and the connections closed.
#[derive(Debug)]
pub struct Drive {
    commits: Commits,
    flush_at_once: bool,
    close_at_once: bool,
    queue: VecDeque<Box<Change>>,
    closed: Vec<ConnId>,
    /// The highest generation of a failed transaction: changes of it or older still to come
    /// out of the host were rolled back with it and are dropped.
    failed_generation: Option<u64>,
}

impl Drive {
    /// A loop that commits at once, reports every frame flushed at once and every close as
    /// `Closed` at once: a host whose writes, sockets and peers keep up.
    pub fn immediate() -> Drive {
        Drive {
            commits: Commits::Immediate,
            flush_at_once: true,
            close_at_once: true,
            queue: VecDeque::new(),
            closed: Vec::new(),
            failed_generation: None,
        }
    }

    /// Sets how commits are carried out.
    pub fn commits(mut self, commits: Commits) -> Drive {
        self.commits = commits;
        self
    }

    /// Whether `Flushed` is reported for each frame as it is taken (else the caller does).
    pub fn flush_at_once(mut self, yes: bool) -> Drive {
        self.flush_at_once = yes;
        self
    }

    /// Whether `Closed` is reported for each close as it is taken (else the caller does).
    pub fn close_at_once(mut self, yes: bool) -> Drive {
        self.close_at_once = yes;
        self
    }

    /// Drains the host's outputs to `None`, handing each `Send` and `Close` to `sink`.
    pub fn drain<S: Store + Commit>(
        &mut self,
        host: &mut Host<S>,
        now: Now,
        mut sink: impl FnMut(Output),
    ) {
        while let Some(out) = host.poll_output() {
            match out {
                Output::Commit(change) => {
                    if self
                        .failed_generation
                        .is_some_and(|g| change.generation <= g)
                    {
                        continue;
                    }
                    match self.commits {
                        Commits::Immediate => {
                            if !commit_one(host, now, &change) {
                                self.failed_generation =
                                    self.failed_generation.max(Some(change.generation));
                            }
                        }
                        Commits::Queued => self.queue.push_back(change),
                    }
                }
                Output::Send { conn, frame } => {
                    let bytes = frame.len() as u64;
                    sink(Output::Send { conn, frame });
                    if self.flush_at_once {
                        host.handle(now, Input::Flushed { conn, bytes });
                    }
                }
                Output::Close { conn, code, reason } => {
                    self.closed.push(conn);
                    sink(Output::Close { conn, code, reason });
                    if self.close_at_once {
                        host.handle(now, Input::Closed { conn });
                    }
                }
            }
        }
    }

    /// Commits up to `n` queued changes, in order, on the host's store, as one group: each
    /// is written in turn and the durable run is reported once. A change the store refuses
    /// ends the group with `CommitFailed`, and every later queued change of that generation
    /// or older is dropped, as the writer contract says. Returns how many were committed.
    /// Drain afterwards to take what the outcome released.
    pub fn complete<S: Store + Commit>(&mut self, host: &mut Host<S>, now: Now, n: usize) -> usize {
        let mut through = None;
        let mut done = 0;
        while done < n {
            let Some(change) = self.queue.pop_front() else {
                break;
            };
            if host.store_mut().commit(&change).is_err() {
                if let Some(t) = through.take() {
                    host.handle(now, Input::Durable { through: t });
                }
                self.failed(host, now, &change);
                return done;
            }
            through = Some(change.number);
            done += 1;
        }
        if let Some(t) = through {
            host.handle(now, Input::Durable { through: t });
        }
        done
    }

    /// Fails the oldest queued change without writing it (an injected group-commit failure
    /// of `group` changes): reports `CommitFailed` and drops what the contract says.
    pub fn fail<S: Store + Commit>(&mut self, host: &mut Host<S>, now: Now, group: usize) {
        let mut generation = None;
        let mut first = None;
        for _ in 0..group.max(1) {
            let Some(change) = self.queue.pop_front() else {
                break;
            };
            first.get_or_insert(change.number);
            generation = generation.max(Some(change.generation));
        }
        if let (Some(number), Some(generation)) = (first, generation) {
            host.handle(now, Input::CommitFailed { number });
            self.queue.retain(|c| c.generation > generation);
            self.failed_generation = self.failed_generation.max(Some(generation));
        }
    }

    /// Forgets every queued change, as a crash does: what was not durable is gone.
    pub fn crash(&mut self) {
        self.queue.clear();
    }

    /// Changes queued and not yet completed.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Connections the host closed so far, in order; cleared by this call.
    pub fn take_closed(&mut self) -> Vec<ConnId> {
        std::mem::take(&mut self.closed)
    }

    fn failed<S: Store + Commit>(&mut self, host: &mut Host<S>, now: Now, change: &Change) {
        host.handle(
            now,
            Input::CommitFailed {
                number: change.number,
            },
        );
        let generation = change.generation;
        self.queue.retain(|c| c.generation > generation);
        self.failed_generation = self.failed_generation.max(Some(generation));
    }
}

/// Commits one change on the host's store and reports the outcome; returns whether it was
/// durable. After a failure the caller must drop every later change of that generation or
/// older (see [`Drive`]).
pub fn commit_one<S: Store + Commit>(host: &mut Host<S>, now: Now, change: &Change) -> bool {
    let (input, ok) = match host.store_mut().commit(change) {
        Ok(()) => (
            Input::Durable {
                through: change.number,
            },
            true,
        ),
        Err(e) => {
            tracing::warn!(error = %e, number = change.number, "commit failed");
            (
                Input::CommitFailed {
                    number: change.number,
                },
                false,
            )
        }
    };
    host.handle(now, input);
    ok
}

/// A writer that commits each change on the host's own store as it comes out, on the caller's
/// thread, and drops the later changes a failure rolled back. The smallest correct driver
/// side of the write path.
#[derive(Debug, Default)]
pub struct SyncWriter {
    failed_generation: Option<u64>,
}

impl SyncWriter {
    /// Carries out one `Output::Commit` and reports its outcome to the host.
    pub fn commit<S: Store + Commit>(&mut self, host: &mut Host<S>, now: Now, change: &Change) {
        if self
            .failed_generation
            .is_some_and(|g| change.generation <= g)
        {
            return;
        }
        if !commit_one(host, now, change) {
            self.failed_generation = self.failed_generation.max(Some(change.generation));
        }
    }
}
