//! Adaptive busy-polling: whether the driver's next wait polls without sleeping first.
//!
//! Sleeping in `epoll_wait` and being woken for the next message costs more than the message
//! itself at high rates (measured at 1→1, 100k msg/s on a 2-vCPU VM: the host spent ~70% of a
//! core, most of it in the scheduler's switch and wake-up paths, and the wake-ups gave the
//! latency tail; `docs/performance.md`). Polling for a short while before sleeping removes both,
//! but only pays when the next event is likely to arrive within that while.
//!
//! The rule: a wait spins (polls with a zero timeout) for up to the budget only when the
//! previous wait ended within the budget. Events arriving closer together than the budget keep
//! the driver spinning; one wait that runs past the budget stops it, and it starts again only
//! after a wait that ended in time. So an idle or lightly loaded host never spins, and the most
//! a burst's end can waste is one budget.

use std::time::Duration;

/// The driver's busy-polling state.
#[derive(Debug)]
pub(crate) struct BusyPoll {
    /// Longest spin per wait; zero turns busy-polling off.
    budget: Duration,
    /// How long the previous wait lasted, from its start until it returned.
    last_wait: Option<Duration>,
}

impl BusyPoll {
    pub(crate) fn new(budget: Duration) -> BusyPoll {
        BusyPoll {
            budget,
            last_wait: None,
        }
    }

    /// How long the next wait should poll without sleeping, given the wait's timeout (`None`:
    /// no deadline). Never longer than the timeout.
    pub(crate) fn spin_for(&self, timeout: Option<Duration>) -> Duration {
        match self.last_wait {
            Some(w) if w < self.budget => timeout.map_or(self.budget, |t| t.min(self.budget)),
            _ => Duration::ZERO,
        }
    }

    /// Records how long a wait lasted.
    pub(crate) fn waited(&mut self, wait: Duration) {
        self.last_wait = Some(wait);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn spins_only_after_a_wait_that_ended_within_the_budget() {
        let mut b = BusyPoll::new(50 * US);
        assert_eq!(b.spin_for(None), Duration::ZERO, "no history: sleep");
        b.waited(10 * US);
        assert_eq!(b.spin_for(None), 50 * US);
        assert_eq!(b.spin_for(Some(Duration::from_secs(1))), 50 * US);
        assert_eq!(b.spin_for(Some(20 * US)), 20 * US, "never past the timeout");
        assert_eq!(b.spin_for(Some(Duration::ZERO)), Duration::ZERO);
        b.waited(50 * US);
        assert_eq!(
            b.spin_for(None),
            Duration::ZERO,
            "a wait that used the budget stops it"
        );
        b.waited(Duration::from_millis(3));
        assert_eq!(b.spin_for(None), Duration::ZERO);
        b.waited(US);
        assert_eq!(b.spin_for(None), 50 * US, "a quick wait starts it again");
    }

    #[test]
    fn a_zero_budget_never_spins() {
        let mut b = BusyPoll::new(Duration::ZERO);
        for wait in [Duration::ZERO, US, Duration::from_secs(1)] {
            b.waited(wait);
            assert_eq!(b.spin_for(None), Duration::ZERO);
            assert_eq!(b.spin_for(Some(US)), Duration::ZERO);
        }
    }
}
