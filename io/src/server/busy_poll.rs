//! Adaptive busy-polling: whether the driver's next wait polls without sleeping first.
//!
//! Sleeping in `epoll_wait` and being woken for the next message costs more than the message
//! itself at high rates (measured at 1→1, 100k msg/s on a 2-vCPU VM: the host spent ~70-85% of
//! a core, most of it in the scheduler's switch and wake-up paths; `docs/performance.md`).
//! Polling for a short while before sleeping removes those costs, but it turns every idle
//! moment into CPU time: at 30k msg/s it took the host from ~45% to 100% of a core, and on a
//! shared VM a vCPU that never idles is the one the hypervisor takes time from (more steal,
//! worse tails: p99 0.9-1.2 ms against 70-110 µs in two of three runs).
//!
//! So a wait spins (polls with a zero timeout) for up to the budget only when both hold:
//! - the previous wait ended within the budget: events come closer together than the budget;
//! - the driver was busy (between waits) for at least `BUSY_PERCENT_MIN` (40%) of its recent
//!   time: the core is largely used already, so spinning costs little and removes the wake-ups
//!   where they hurt.
//!
//! An idle or lightly loaded host never spins, and the end of a burst wastes at most one
//! budget. "Recent" is a decayed sum over the last few dozen wait/work cycles. Measured at 1→1
//! without spinning, the driver is busy 23% of the time at 30k msg/s, 31% at 50k and 53% at
//! 100k. Spinning itself raises the share (the host now meets the peer's CPU on the same
//! socket), to 44% at 50k/s and 85% at 100k/s, so once started it holds until a wait runs
//! past the budget: hysteresis, not flapping.

use std::time::Duration;

/// Each cycle keeps `1 - 1/2^DECAY_SHIFT` of the sums: a window of a few dozen cycles.
const DECAY_SHIFT: u32 = 5;

/// Spin only when the driver worked at least this share (percent) of its recent time.
const BUSY_PERCENT_MIN: u64 = 40;

/// The driver's busy-polling state.
#[derive(Debug)]
pub(crate) struct BusyPoll {
    /// Longest spin per wait; zero turns busy-polling off.
    budget: Duration,
    /// How long the previous wait lasted, from its start until it returned.
    last_wait: Option<Duration>,
    /// Decayed sums of time spent working between waits and waiting, in ns.
    busy_ns: u64,
    idle_ns: u64,
}

impl BusyPoll {
    pub(crate) fn new(budget: Duration) -> BusyPoll {
        BusyPoll {
            budget,
            last_wait: None,
            busy_ns: 0,
            idle_ns: 0,
        }
    }

    /// How long the next wait should poll without sleeping, given the wait's timeout (`None`:
    /// no deadline). Never longer than the timeout.
    pub(crate) fn spin_for(&self, timeout: Option<Duration>) -> Duration {
        let busy_enough = self.busy_ns.saturating_mul(100)
            >= BUSY_PERCENT_MIN.saturating_mul(self.busy_ns.saturating_add(self.idle_ns));
        match self.last_wait {
            Some(w) if w < self.budget && busy_enough => {
                timeout.map_or(self.budget, |t| t.min(self.budget))
            }
            _ => Duration::ZERO,
        }
    }

    /// Records one cycle: the work since the previous wait returned, then the wait (spin
    /// included) that followed it.
    pub(crate) fn cycle(&mut self, worked: Duration, waited: Duration) {
        let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        self.busy_ns = decayed(self.busy_ns).saturating_add(ns(worked));
        self.idle_ns = decayed(self.idle_ns).saturating_add(ns(waited));
        self.last_wait = Some(waited);
    }

    /// The share of recent time spent working, in percent.
    #[cfg(test)]
    fn busy_percent(&self) -> u64 {
        let total = self.busy_ns.saturating_add(self.idle_ns);
        (self.busy_ns.saturating_mul(100))
            .checked_div(total)
            .unwrap_or(0)
    }
}

fn decayed(sum: u64) -> u64 {
    sum - (sum >> DECAY_SHIFT)
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// Runs `n` identical cycles.
    fn cycles(b: &mut BusyPoll, n: usize, worked: Duration, waited: Duration) {
        for _ in 0..n {
            b.cycle(worked, waited);
        }
    }

    #[test]
    fn spins_when_events_are_close_and_the_driver_is_mostly_busy() {
        let mut b = BusyPoll::new(50 * US);
        assert_eq!(b.spin_for(None), Duration::ZERO, "no history: sleep");
        // 100k/s with ~6 µs of work per message: busy 60%, waits of 4 µs.
        cycles(&mut b, 200, 6 * US, 4 * US);
        assert!(b.busy_percent() >= 55, "{}", b.busy_percent());
        assert_eq!(b.spin_for(None), 50 * US);
        assert_eq!(b.spin_for(Some(Duration::from_secs(1))), 50 * US);
        assert_eq!(b.spin_for(Some(20 * US)), 20 * US, "never past the timeout");
        assert_eq!(b.spin_for(Some(Duration::ZERO)), Duration::ZERO);
    }

    #[test]
    fn close_events_on_a_mostly_idle_driver_do_not_spin() {
        // 30k/s with 8 µs of work: waits of 25 µs are within the budget, but the driver is
        // busy a quarter of the time; spinning would make it busy all of it.
        let mut b = BusyPoll::new(50 * US);
        cycles(&mut b, 200, 8 * US, 25 * US);
        assert!(b.busy_percent() < 30, "{}", b.busy_percent());
        assert_eq!(b.spin_for(None), Duration::ZERO);
    }

    #[test]
    fn a_wait_past_the_budget_stops_spinning_and_load_restarts_it() {
        let mut b = BusyPoll::new(50 * US);
        cycles(&mut b, 200, 6 * US, 4 * US);
        assert_eq!(b.spin_for(None), 50 * US);
        // The burst ends: one wait runs out the spin and sleeps 3 ms.
        b.cycle(6 * US, Duration::from_millis(3));
        assert_eq!(
            b.spin_for(None),
            Duration::ZERO,
            "that wait used the budget"
        );
        b.cycle(6 * US, 10 * US);
        assert_eq!(
            b.spin_for(None),
            Duration::ZERO,
            "one quick wait after a long idle is not load yet"
        );
        // Sustained load again: the idle stretch decays out of the window.
        cycles(&mut b, 400, 6 * US, 4 * US);
        assert_eq!(b.spin_for(None), 50 * US);
    }

    #[test]
    fn a_zero_budget_never_spins() {
        let mut b = BusyPoll::new(Duration::ZERO);
        for wait in [Duration::ZERO, US, Duration::from_secs(1)] {
            cycles(&mut b, 100, 100 * US, wait);
            assert_eq!(b.spin_for(None), Duration::ZERO);
            assert_eq!(b.spin_for(Some(US)), Duration::ZERO);
        }
    }

    #[test]
    fn sums_stay_bounded() {
        let mut b = BusyPoll::new(50 * US);
        cycles(
            &mut b,
            10_000,
            Duration::from_secs(3600),
            Duration::from_secs(3600),
        );
        assert_eq!(b.busy_percent(), 50);
        b.cycle(Duration::MAX, Duration::MAX);
        assert!(b.busy_percent() <= 100);
    }
}
