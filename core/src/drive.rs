//! The one drive loop shared by core tests, the simulator, the fuzz targets and the benches:
//! pure, no I/O.
//!
//! [`Drive::drain`] takes every output the host has, in order: a `Send` or `Close` goes to the
//! caller's sink (and, if asked, `Flushed` is reported for a sent frame at once and `Closed`
//! for a closed connection), a `Commit` is carried out against the host's own store at once
//! ([`Commits::Immediate`]), queued ([`Commits::Queued`]) for the caller to complete later
//! with [`Drive::complete`], [`Drive::fail`] or [`Drive::crash`], or handed to the sink
//! ([`Commits::Handed`]) for a writer of the caller's own (the simulator's, with seeded
//! latency, failures and crashes). A completed commit's outcome is reported to the host as the
//! writer contract says, so its released frames come out of the same drain.
//! [`Drive::drain_checked`] lets the sink see the host and stop the drain with an error (the
//! simulator's oracles check every output against the store as it comes out).

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
    /// Handed to the sink as `Output::Commit`; the caller's writer carries them out and
    /// reports their outcome.
    Handed,
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

    /// Changes how later commits are carried out (a test slowing its disk down mid-way);
    /// changes already queued stay queued.
    pub fn set_commits(&mut self, commits: Commits) {
        self.commits = commits;
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

    /// Drains the host's outputs to `None`, handing each `Send` and `Close` (and, with
    /// [`Commits::Handed`], each `Commit`) to `sink`.
    pub fn drain<S: Store + Commit>(
        &mut self,
        host: &mut Host<S>,
        now: Now,
        mut sink: impl FnMut(Output),
    ) {
        let drained = self.drain_checked(host, now, |_, out| {
            sink(out);
            Ok::<(), std::convert::Infallible>(())
        });
        match drained {
            Ok(()) => {}
            Err(never) => match never {},
        }
    }

    /// [`Drive::drain`] with a sink that sees the host as each output comes out and may stop
    /// the drain: its first error is returned, and the outputs after it stay in the host.
    pub fn drain_checked<S: Store + Commit, E>(
        &mut self,
        host: &mut Host<S>,
        now: Now,
        mut sink: impl FnMut(&Host<S>, Output) -> Result<(), E>,
    ) -> Result<(), E> {
        while let Some(out) = host.poll_output() {
            match out {
                Output::Commit(change) => match self.commits {
                    Commits::Handed => sink(host, Output::Commit(change))?,
                    _ if self
                        .failed_generation
                        .is_some_and(|g| change.generation <= g) => {}
                    Commits::Immediate => {
                        if !commit_one(host, now, &change) {
                            self.failed_generation =
                                self.failed_generation.max(Some(change.generation));
                        }
                    }
                    Commits::Queued => self.queue.push_back(change),
                },
                Output::Send { conn, frame } => {
                    let bytes = frame.len() as u64;
                    sink(host, Output::Send { conn, frame })?;
                    if self.flush_at_once {
                        host.handle(now, Input::Flushed { conn, bytes });
                    }
                }
                Output::Close { conn, code, reason } => {
                    if self.close_at_once {
                        self.closed.push(conn);
                    }
                    sink(host, Output::Close { conn, code, reason })?;
                    if self.close_at_once {
                        host.handle(now, Input::Closed { conn });
                    }
                }
            }
        }
        Ok(())
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

    /// Connections the host closed so far, in order, when closes are reported at once;
    /// cleared by this call.
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::kernel::time::Instant;
    use crate::log::store::MemStore;
    use crate::principal::Principal;
    use crate::HostConfig;

    fn now() -> Now {
        Now {
            mono: Instant(1),
            wall_unix_ms: 1_700_000_000_000,
        }
    }

    /// A host with `n` connections whose `initialize` waits in the host's outputs: each a
    /// client binding to commit, holding back its answer.
    fn initializing(n: u64) -> Host<MemStore> {
        let mut host = Host::new(HostConfig::default(), MemStore::new(), 7).expect("host");
        for c in 1..=n {
            let principal = Arc::new(Principal::maintainer("m"));
            host.handle(
                now(),
                Input::Connected {
                    conn: ConnId(c),
                    principal,
                },
            );
            let init = format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"initialize","params":{{"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":"c{c}"}}}}"#
            );
            host.handle(
                now(),
                Input::Message {
                    conn: ConnId(c),
                    text: &init,
                },
            );
        }
        host
    }

    #[test]
    fn handed_commits_go_to_the_sink_and_hold_what_they_reveal() {
        let mut host = initializing(1);
        let mut drive = Drive::immediate().commits(Commits::Handed);
        let mut changes = Vec::new();
        drive.drain(&mut host, now(), |out| match out {
            Output::Commit(change) => changes.push(change),
            other => panic!("revealed before durable: {other:?}"),
        });
        assert_eq!(changes.len(), 1, "the client binding");
        assert_eq!(drive.queued(), 0, "a handed change is the caller's");
        let number = changes[0].number;
        host.store_mut().commit(&changes[0]).expect("commit");
        host.handle(now(), Input::Durable { through: number });
        let mut sent = 0;
        drive.drain(&mut host, now(), |out| {
            assert!(matches!(out, Output::Send { .. }), "{out:?}");
            sent += 1;
        });
        assert_eq!(sent, 1, "the answer, once durable");
    }

    #[test]
    fn a_sink_error_stops_the_drain_and_leaves_the_rest_in_the_host() {
        let mut host = initializing(2);
        let mut drive = Drive::immediate().commits(Commits::Queued);
        drive.drain(&mut host, now(), |out| panic!("before durable: {out:?}"));
        assert_eq!(drive.queued(), 2);
        assert_eq!(drive.complete(&mut host, now(), 2), 2);
        let stopped = drive.drain_checked(&mut host, now(), |_, out| match out {
            Output::Send { .. } => Err("stop"),
            _ => Ok(()),
        });
        assert_eq!(stopped, Err("stop"));
        let mut rest = Vec::new();
        drive.drain(&mut host, now(), |out| rest.push(out));
        assert!(
            matches!(rest.as_slice(), [Output::Send { .. }]),
            "the second answer stayed in the host: {rest:?}"
        );
    }
}
