//! The event loop: wait for events or the earliest deadline, sort the events, and run one
//! turn (read in rounds, fire due timers, feed the writer's outcomes, carry out the core's
//! decisions, write), until a signal's stop completes.

use std::io;
use std::time::Duration;

use axhost_core::Store;
use mio::{Events, Token};

use super::read_rounds::TurnLoad;
use super::slots::Slot;
use super::{coalesce, Driver, LISTENER, SIGNALS, WRITER};

/// Events taken from one `poll` call.
const EVENTS_PER_POLL_MAX: usize = 1024;

/// Loop passes of "drain outputs, write sockets, report flushed" per turn.
const FLUSH_PASSES_MAX: usize = 4;

impl<S: Store> Driver<S> {
    /// Turns until a stop requested by a signal completes, or a second signal.
    pub(super) fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(EVENTS_PER_POLL_MAX);
        loop {
            self.wait(&mut events)?;
            let mut accept = false;
            let mut signalled = false;
            for event in events.iter() {
                match event.token() {
                    LISTENER => accept = true,
                    SIGNALS => signalled = true,
                    // Outcomes are collected every turn; the wake only ends the wait.
                    WRITER => {}
                    Token(t) => {
                        let id = t as u64;
                        if event.is_read_closed() || event.is_error() {
                            // This edge is the only report of the FIN: read through to it.
                            if let Some(socket) = self.slots.get_mut(&id).and_then(Slot::socket_mut)
                            {
                                socket.mark_read_closed();
                            }
                        }
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.mark_readable(id);
                        }
                        if event.is_writable() || event.is_write_closed() {
                            self.mark_dirty(id);
                        }
                    }
                }
            }
            if signalled && self.on_signal() {
                tracing::warn!("second signal: stopping without waiting for peers");
                return Ok(());
            }
            let retry_due = self
                .accept_retry_ms
                .is_some_and(|at| self.clock.now().mono.0 >= at);
            if accept || retry_due {
                self.accept();
            }
            self.turn();
            if let Some(stop_by_ms) = self.stop_by_ms {
                if self.slots.is_empty() || self.clock.now().mono.0 >= stop_by_ms {
                    tracing::info!(sockets_left = self.slots.len(), "stopped");
                    return Ok(());
                }
            }
        }
    }

    /// Waits for events until the next deadline: first the coalescing gap, when the driver is
    /// coalescing (`server/coalesce.rs`), then a poll without sleeping, then more of them while
    /// the busy-polling rule says the next event is near and the driver is busy anyway, and
    /// last a poll that sleeps.
    fn wait(&mut self, events: &mut Events) -> io::Result<()> {
        let started = std::time::Instant::now();
        let worked = started.saturating_duration_since(self.woke_at);
        let (gap, change) = self.coalesce.gap_before_wait(started, self.load.steps);
        log_coalesce(change);
        // Spun, not slept: the driver is saturated, and a short sleep can take many times its
        // length on a VM.
        while started.elapsed() < gap {
            std::hint::spin_loop();
        }
        events.clear();
        let mut zero_polled = false;
        if self.coalesce.enabled() {
            // Whether input is already there is what coalescing starts and stops on.
            self.poll_once(events, Some(Duration::ZERO))?;
            zero_polled = true;
        }
        let polled = std::time::Instant::now();
        let waiting = !events.is_empty() || !self.backlog.is_empty();
        log_coalesce(self.coalesce.observe(polled, waiting));
        let timeout = self.poll_timeout();
        let spin = self.busy_poll.spin_for(timeout);
        while !spin.is_zero() && events.is_empty() && polled.elapsed() < spin {
            // Pause first: a zero-timeout poll may have just found nothing.
            std::hint::spin_loop();
            self.poll_once(events, Some(Duration::ZERO))?;
            zero_polled = true;
        }
        // A zero timeout is served by a zero-timeout poll above, when one ran.
        if events.is_empty() && !(zero_polled && timeout == Some(Duration::ZERO)) {
            self.poll_once(events, timeout.map(|t| t.saturating_sub(polled.elapsed())))?;
        }
        self.woke_at = std::time::Instant::now();
        let waited = self.woke_at.saturating_duration_since(polled);
        log_coalesce(self.coalesce.after_wait(self.woke_at, waited));
        // The gap is work, not waiting: busy-polling judges the wait from the first poll.
        self.busy_poll
            .cycle(worked + gap, self.woke_at.saturating_duration_since(polled));
        Ok(())
    }

    /// One `epoll_wait`; an interrupted wait returns with no events.
    fn poll_once(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        match self.poll.poll(events, timeout) {
            Err(e) if e.kind() != io::ErrorKind::Interrupted => Err(e),
            _ => Ok(()),
        }
    }

    /// One turn after the events are sorted: read (in rounds, `read_rounds`), time, decide,
    /// write.
    fn turn(&mut self) {
        self.turn_no += 1;
        if self.coalesce.on() {
            // After the gap, so what the peer wrote meanwhile is counted.
            let deepest = self
                .filled_share
                .iter()
                .filter_map(|id| self.slots.get(id)?.socket()?.queued_input())
                .max();
            self.coalesce.queue_observed(deepest);
        }
        self.filled_share.clear();
        self.reopen_input();
        self.load = TurnLoad {
            coalescing: self.coalesce.on(),
            ..TurnLoad::default()
        };
        while !self.backlog.is_empty() && (self.load.rounds == 0 || self.load.read_again()) {
            for id in std::mem::take(&mut self.backlog) {
                match self.slots.get_mut(&id) {
                    Some(slot) => slot.in_backlog = false,
                    None => continue,
                }
                let steps = self.on_readable(id);
                self.load.steps += steps;
            }
            self.load.rounds += 1;
        }
        if self.load.rounds > 1 {
            let l = self.load;
            tracing::debug!(
                rounds = l.rounds,
                steps = l.steps,
                frames = l.frames,
                destinations = l.destinations,
                "turn read in rounds"
            );
        }
        let now = self.clock.now();
        if self.host.poll_timeout().is_some_and(|at| at <= now.mono) {
            self.host.handle_timeout(now);
        }
        while let Some(&(at, id)) = self.deadlines.first() {
            if at > now.mono.0 {
                break;
            }
            self.deadlines.remove(&(at, id));
            self.on_deadline(id);
        }
        self.deliver_outcomes(now);
        // What the writer made durable may let input in again: parked connections go back on
        // the backlog, which makes the next wait a poll.
        self.reopen_input();
        for _ in 0..FLUSH_PASSES_MAX {
            self.drain_outputs(now);
            if self.dirty.is_empty() {
                break;
            }
            for id in std::mem::take(&mut self.dirty) {
                match self.slots.get_mut(&id) {
                    Some(slot) => slot.in_dirty = false,
                    None => continue,
                }
                self.write(id);
            }
        }
        // Never sleep on undrained decisions; anything this queues is written next turn (the
        // poll timeout is zero while `dirty` is not empty).
        self.drain_outputs(now);
    }

    /// Milliseconds until the earliest of: a core timer, a driver deadline, an accept retry, the
    /// shutdown bound. Zero when connections wait on the read backlog.
    fn poll_timeout(&self) -> Option<Duration> {
        if !self.backlog.is_empty() || !self.dirty.is_empty() {
            return Some(Duration::ZERO);
        }
        let earliest = [
            self.host.poll_timeout().map(|at| at.0),
            self.deadlines.first().map(|&(at, _)| at),
            self.accept_retry_ms,
            self.stop_by_ms,
        ]
        .into_iter()
        .flatten()
        .min()?;
        let now_ms = self.clock.now().mono.0;
        Some(Duration::from_millis(earliest.saturating_sub(now_ms)))
    }
}

/// Logs a change of the coalescing state (at most fifty a second: `coalesce::HOLD`).
fn log_coalesce(change: Option<coalesce::Change>) {
    match change {
        Some(coalesce::Change::Started) => tracing::debug!("read coalescing started"),
        Some(coalesce::Change::Stopped(why)) => {
            tracing::debug!(?why, "read coalescing stopped");
        }
        None => {}
    }
}
