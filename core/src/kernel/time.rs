//! Time as the core sees it: two readings handed in by the driver, never read here.
//!
//! `Instant` orders and expires things (monotonic milliseconds). `Now::wall_unix_ms` stamps
//! timestamps users see (`createdAt`, `startedAt`); it may jump, even backwards, so the host keeps
//! a high-water mark and never hands out a timestamp older than one it already handed out.

use std::collections::{BTreeMap, BTreeSet};

use crate::net::connection::ConnId;

/// Milliseconds on the driver's monotonic clock. Compared and added; never shown to users.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Instant(pub u64);

impl Instant {
    /// The instant `ms` milliseconds later (saturating: "far future" stays far future).
    pub fn plus_ms(self, ms: u64) -> Instant {
        Instant(self.0.saturating_add(ms))
    }
}

/// The driver's two clock readings for one call into the core.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Now {
    /// Orders and expires things. Must never decrease between calls.
    pub mono: Instant,
    /// Unix time in milliseconds, for timestamps shown to users. May jump.
    pub wall_unix_ms: u64,
}

impl Now {
    /// Both clocks at the same millisecond count; handy in tests and the simulator.
    pub fn at(ms: u64) -> Now {
        Now {
            mono: Instant(ms),
            wall_unix_ms: ms,
        }
    }
}

/// Formats Unix milliseconds as RFC 3339 UTC with exactly three fractional digits,
/// e.g. `2025-03-10T18:42:03.123Z`, the form AHP timestamps use.
pub fn iso8601(unix_ms: u64) -> String {
    let secs = unix_ms / 1000;
    let millis = unix_ms % 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Everything the host can wait for. The derived `Ord` breaks ties between equal deadlines,
/// so timers that expire together always fire in the same order.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Timer {
    /// A connection must finish `initialize`/`reconnect` by then or be closed.
    Handshake(ConnId),
    /// A relayed client-service request times out (host-allocated id).
    Relay(u64),
    /// The lease on AXP session `id` may have expired (its exchange says when).
    Lease(String),
    /// The AXP executor `id` may have outlived its registration (its entry says when).
    Executor(String),
    /// Held messages may go: a failed commit emptied the write path. Armed for at once, so
    /// they are handled in the next call, after the caller has seen the rolled-back state.
    Held,
}

/// Deadlines, ordered. Arming a timer again replaces its deadline.
#[derive(Default, Debug)]
pub(crate) struct Timers {
    queue: BTreeSet<(Instant, Timer)>,
    /// Invariant: the same entries as `queue`, keyed the other way.
    armed: BTreeMap<Timer, Instant>,
}

impl Timers {
    pub(crate) fn arm(&mut self, timer: Timer, at: Instant) {
        if let Some(old) = self.armed.insert(timer.clone(), at) {
            self.queue.remove(&(old, timer.clone()));
        }
        self.queue.insert((at, timer));
        debug_assert_eq!(self.queue.len(), self.armed.len());
    }

    /// Forgets `timer`. A no-op when it is not armed.
    pub(crate) fn disarm(&mut self, timer: &Timer) {
        if let Some(at) = self.armed.remove(timer) {
            self.queue.remove(&(at, timer.clone()));
        }
        debug_assert_eq!(self.queue.len(), self.armed.len());
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Removes and returns the earliest timer due at or before `now`.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<Timer> {
        let (at, timer) = self.queue.first()?.clone();
        if at > now {
            return None;
        }
        self.queue.remove(&(at, timer.clone()));
        self.armed.remove(&timer);
        debug_assert_eq!(self.queue.len(), self.armed.len());
        Some(timer)
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.armed.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iso8601_formats_known_instants() {
        assert_eq!(iso8601(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso8601(1_741_632_123_123), "2025-03-10T18:42:03.123Z");
        assert_eq!(iso8601(951_782_400_000), "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn timers_fire_in_deadline_then_kind_order_and_rearm_replaces() {
        let mut t = Timers::default();
        t.arm(Timer::Handshake(ConnId(2)), Instant(10));
        t.arm(Timer::Handshake(ConnId(1)), Instant(10));
        t.arm(Timer::Handshake(ConnId(3)), Instant(5));
        t.arm(Timer::Handshake(ConnId(3)), Instant(20));
        assert_eq!(t.len(), 3);
        assert_eq!(t.next_deadline(), Some(Instant(10)));
        assert_eq!(t.pop_due(Instant(9)), None);
        assert_eq!(t.pop_due(Instant(10)), Some(Timer::Handshake(ConnId(1))));
        assert_eq!(t.pop_due(Instant(10)), Some(Timer::Handshake(ConnId(2))));
        assert_eq!(t.pop_due(Instant(10)), None);
        t.disarm(&Timer::Handshake(ConnId(3)));
        t.disarm(&Timer::Handshake(ConnId(3)));
        assert_eq!(t.next_deadline(), None);
    }
}
