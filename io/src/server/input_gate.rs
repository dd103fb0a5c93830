//! Backpressure from the disk: while the core takes no input (`Host::accepting_input` is false:
//! `in_flight_changes_max` changes wait for the writer), the driver reads no WebSocket. Writing,
//! flushing, accepting, HTTP heads, closing sockets, timers and the writer's outcomes go on;
//! the writer's `Durable` wake-up is what reopens the gate.
//!
//! Reads are edge-triggered, so a connection that had input when the gate closed would never be
//! reported again: it is parked instead of read (`Slot::parked`, still listed as read-pending
//! through `Slot::in_backlog`, so events do not list it twice) and goes back on the read backlog,
//! in order, when the gate opens. Connections the driver had not read yet when the gate closed
//! go first, and those it was reading last, so no connection is starved by the one whose
//! messages keep filling the path. A parked connection that starts closing goes back to the
//! backlog at once (its remaining bytes are discarded as usual), and a parked one counts as heard
//! for keepalive: it has input waiting, the driver just does not read it yet.
//!
//! The driver checks the gate before every read step, so it never hands the core a message the
//! core would have to hold; the core's input hold is for drivers that read ahead.
//!
//! Pauses can come and go many times a second under load, so they are logged at most once a
//! second (with how many there were since), and a resume only after a logged pause or a long
//! one.

use std::time::{Duration, Instant};

use axhost_core::Store;

use super::slots::Phase;
use super::Driver;

/// Time between two "input paused" lines.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// A pause at least this long is logged when it ends even if its start was not.
const LONG_PAUSE: Duration = Duration::from_secs(1);

/// The gate's state: whether input is paused, the connections parked meanwhile, and the log's.
#[derive(Debug, Default)]
pub(super) struct InputGate {
    /// When the current pause started; `None` while input flows.
    paused_since: Option<Instant>,
    /// Connections parked before the driver read anything of theirs during this pause, in the
    /// order they were listed. Entries whose slot is no longer parked are stale and skipped.
    parked: Vec<u64>,
    /// Connections parked after the driver read some of their messages (it was reading them
    /// when the gate closed): they go back after `parked`.
    parked_read: Vec<u64>,
    /// When the last "paused" line was logged, and pauses since that went unlogged.
    logged_at: Option<Instant>,
    unlogged: u64,
    /// The current pause's start was logged.
    pause_logged: bool,
    /// Pauses since the driver started.
    pauses: u64,
}

impl<S: Store> Driver<S> {
    /// Whether the core takes input now; closes the gate (and notes the pause) when it does not.
    pub(super) fn input_open(&mut self) -> bool {
        if self.host.accepting_input() {
            return true;
        }
        if self.gate.paused_since.is_none() {
            self.on_pause();
        }
        false
    }

    /// Parks open connection `id` while input is paused. `read_some`: the driver read some of
    /// its messages before the gate closed.
    pub(super) fn park(&mut self, id: u64, read_some: bool) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        if std::mem::replace(&mut slot.parked, true) {
            return;
        }
        // Still listed as read-pending: a new event must not list it again meanwhile.
        slot.in_backlog = true;
        if read_some {
            self.gate.parked_read.push(id);
        } else {
            self.gate.parked.push(id);
        }
    }

    /// A parked connection that must be read now whatever the gate (it is closing): back to the
    /// read backlog.
    pub(super) fn unpark(&mut self, id: u64) {
        if let Some(slot) = self.slots.get_mut(&id) {
            if std::mem::replace(&mut slot.parked, false) {
                // `in_backlog` stays set: the slot is listed once, in the backlog now.
                self.backlog.push(id);
            }
        }
    }

    /// Opens the gate if the core takes input again: every parked connection goes back on the
    /// read backlog (those not read during the pause first) and the resume is logged.
    pub(super) fn reopen_input(&mut self) {
        let Some(since) = self.gate.paused_since else {
            return;
        };
        if !self.host.accepting_input() {
            return;
        }
        self.gate.paused_since = None;
        let mut parked = std::mem::take(&mut self.gate.parked);
        parked.append(&mut self.gate.parked_read);
        let mut resumed = 0usize;
        for id in parked {
            let Some(slot) = self.slots.get_mut(&id) else {
                continue;
            };
            if std::mem::replace(&mut slot.parked, false) {
                self.backlog.push(id);
                resumed += 1;
            }
        }
        let paused = since.elapsed();
        if std::mem::take(&mut self.gate.pause_logged) || paused >= LONG_PAUSE {
            tracing::info!(
                paused_ms = paused.as_millis() as u64,
                connections = resumed,
                in_flight = self.host.changes_in_flight(),
                pauses_since_start = self.gate.pauses,
                "input resumed: the writer caught up"
            );
        }
    }

    /// Input stops: log it, at most once a second.
    fn on_pause(&mut self) {
        let now = Instant::now();
        self.gate.paused_since = Some(now);
        self.gate.pauses += 1;
        let due = self
            .gate
            .logged_at
            .is_none_or(|at| now.saturating_duration_since(at) >= LOG_INTERVAL);
        if !due {
            self.gate.unlogged += 1;
            return;
        }
        let (held, held_bytes) = self.host.held_messages();
        tracing::info!(
            in_flight = self.host.changes_in_flight(),
            in_flight_max = self.host.limits().in_flight_changes_max,
            held,
            held_bytes,
            pauses_since_last_line = std::mem::take(&mut self.gate.unlogged),
            "input paused: the write path is full; reading stops until the writer catches up"
        );
        self.gate.logged_at = Some(now);
        self.gate.pause_logged = true;
    }

    /// Whether open connection `id` is parked with input waiting (keepalive counts it as heard).
    pub(super) fn parked_open(&self, id: u64) -> bool {
        self.slots
            .get(&id)
            .is_some_and(|s| s.parked && matches!(s.phase, Phase::Open { .. }))
    }
}
