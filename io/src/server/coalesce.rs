//! Read coalescing under saturation: whether the driver waits a short gap before its next turn
//! so that the turn reads more.
//!
//! A peer that writes one small frame per `send` as fast as it can (a flat-out sender that does
//! not batch) meets a host that keeps up in a costly equilibrium. Each turn finds two or three
//! frames, reads them, writes them on, and the peer's next `send` runs the whole loopback path
//! again (the host's socket's TCP input, its ACKs, its wake-ups), so both sides spend 2-3 µs per
//! message and the run settles near 0.4 M msg/s on a 2-vCPU Xeon VM. Redis and NATS, slower per
//! message there, fall a socket buffer behind instead: the peer's writes then only append to its
//! send queue, and they relay 1.4-1.6 M msg/s (`docs/performance.md`, "Flat out with one frame
//! per write"). What moves the host into that regime is reading less often: a short gap before
//! each turn, and one read round per turn, so that the host's receive window fills. The host
//! then spends ~0.7 µs per message and keeps pace with Redis; a message waits up to one gap
//! longer, on top of the socket buffer it already waited behind.
//!
//! The gap must never reach a peer that is not flat out, so coalescing starts only when both
//! hold over the recent waits:
//! - input was already there when the driver was about to wait, in at least
//!   `WAITING_PERCENT_MIN` of them (a decayed share): the host is saturated;
//! - turns read few frames, at most `SMALL_TURN_STEPS` on average: the peers are not batching
//!   (a peer writing 16 frames per `send` is cheaper for the host without gaps, 2.3-2.7 M msg/s
//!   against 1.1 M with them, so it never coalesces).
//!
//! It stops when a gapped turn read fewer than `EXIT_TURN_STEPS` frames (the input came slower
//! than the gaps: 100k msg/s gives ~2 frames per 20 µs gap), or when, with nothing waiting
//! after a gap, the wait that followed lasted over `IDLE_WAIT_MAX` (the load went away; a
//! shorter limit, 200 µs, ended it at every pause of the peer's vCPU, and each pause then cost
//! the hold and a new start: 0.40-1.31 M msg/s per run against 1.17-1.33 M with 2 ms). After
//! it stops it does not start again for `HOLD`, so a host that keeps entering and leaving adds
//! at most one gap to a few messages fifty times a second. The gap is spent spinning, not
//! sleeping: the driver is saturated, so the CPU is used anyway, and a 20 µs sleep took ~150 µs
//! on a VM whose idle vCPUs are handed back to the hypervisor.
//!
//! While on, the gap follows the peer (additive decrease, multiplicative increase, as TCP
//! follows a path). In that regime the host's rate is one round per gap plus the round's work,
//! and it must stay under the rate at which the peer can fill the queue: a host that drains
//! the queue opens the window, the peer's writes go out one frame at a time again, and the run
//! falls back to the costly equilibrium. A fixed gap has to leave room for the peer's slowest
//! stretches (20 µs: ~1.3 M msg/s where the peer could write ~1.7 M), and a shorter fixed gap
//! reached Redis's rate in some runs and fell out in others. So each coalescing turn starts by
//! looking at the input queue of the connections that filled their share in the last round
//! (`queue_observed`): while some queue holds more than `DRAINED_BYTES`, the peer is ahead and
//! the gap shrinks by `1 / GAP_STEP_DIVISOR` of the configured gap a turn, down to
//! `GAP_FLOOR_PERCENT` of it; when none does, the host has caught up and the gap grows by
//! `GAP_GROWTH_PERCENT`, at most once every `GROWTH_COOLDOWN_TURNS` turns, up to
//! `GAP_CEILING_PERCENT`, so that the queue refills before the window opens. Only a drain
//! within `FLAT_OUT_MEMORY_TURNS` of a deep queue grows it: many peers at a moderate rate
//! (64→64 at 100k msg/s, which coalesces through much of a run) never leave a deep queue, not
//! even when a VM pause lets each of them fill a share, and for them the gap stays at, or
//! returns to, the configured one; a 40 µs gap there doubled the p50. Each start begins at the
//! configured gap.

use std::time::{Duration, Instant};

/// Each wait keeps `1 - 1/2^WAITING_DECAY_SHIFT` of the waiting share: about 32 waits.
const WAITING_DECAY_SHIFT: u32 = 5;

/// Start only when input was already there in at least this share (percent) of recent waits.
/// Measured on a 2-vCPU Xeon VM: 52-89% at 1→1 flat out with one frame per write, 12-25% at
/// 100k msg/s (1→1 and 64→64).
const WAITING_PERCENT_MIN: u64 = 40;

/// Each turn keeps `1 - 1/2^STEPS_DECAY_SHIFT` of the average turn size: about 8 turns.
const STEPS_DECAY_SHIFT: u32 = 3;

/// Start only when recent turns read at most this many frames on average: ~2.5 at 1→1 flat out
/// with one frame per write, 16 or more when peers batch, hundreds at 16→16 and 64→64.
const SMALL_TURN_STEPS: u64 = 8;

/// Stop when a turn after a gap read fewer frames than this: the gap did not gather a batch.
const EXIT_TURN_STEPS: usize = 4;

/// Stop when, with nothing waiting after a gap, the following wait lasted longer than this:
/// longer than most pauses of a VM's vCPU (0.8-3.3 ms at worst in the machine checks of
/// `benches/compare.sh`). Staying on while idle costs nothing: the gap comes after a turn, and
/// input that wakes a sleeping driver is read at once.
const IDLE_WAIT_MAX: Duration = Duration::from_millis(2);

/// After stopping, do not start again for this long.
const HOLD: Duration = Duration::from_millis(20);

/// The gap's lower bound while it adapts, in percent of the configured gap: 13 µs of 20. The
/// configured gap is also where each start begins. Measured at 1→1 flat out with one frame per
/// write on a 2-vCPU Xeon VM: 11 µs drained the queue so often that it averaged 1.23-1.37 M
/// msg/s, 13 µs 1.36-1.57 M, 15 µs 1.40-1.53 M (`docs/performance.md`, "An adaptive gap").
const GAP_FLOOR_PERCENT: u32 = 65;

/// The gap's upper bound while it adapts, in percent of the configured gap: 40 µs of 20, where
/// one round a gap (~0.9 M msg/s) is well under what a flat-out peer writes into an open window.
const GAP_CEILING_PERCENT: u32 = 200;

/// A turn that found the queue deep shortens the gap by this fraction of the configured gap:
/// 20 ns of 20 µs, so from the start to the floor in 350 turns (~15 ms at 1→1), and from the
/// ceiling in 1,350.
const GAP_STEP_DIVISOR: u32 = 1000;

/// A turn that found the queue drained lengthens the gap to this percent of what it was. Nine
/// lengthenings (144 drained turns) take it from the floor to the ceiling.
const GAP_GROWTH_PERCENT: u32 = 115;

/// Turns between two lengthenings: a drain that lasts many turns lengthens the gap step by
/// step, watching whether the queue refills, instead of running it to the ceiling at once.
const GROWTH_COOLDOWN_TURNS: u32 = 16;

/// Turns after a deep queue was last seen during which a drained queue still grows the gap:
/// ~10 ms at 1→1, longer than the drains measured there (tens to ~200 turns), which are the peer
/// falling behind. Past it no flat-out peer is left, and the gap returns to the configured one a
/// step a turn.
const FLAT_OUT_MEMORY_TURNS: u32 = 256;

/// Input queued in the kernel below which a connection's queue counts as drained: two rounds'
/// share of ~260-byte notifications. A deep queue sawtooths (the window reopens in steps), but
/// while the peer is ahead it stays far above this.
const DRAINED_BYTES: usize = 32 * 1024;

/// Fixed-point scale of the decayed averages.
const SCALE_SHIFT: u32 = 10;

/// Why coalescing stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stopped {
    /// A gapped turn read fewer than `EXIT_TURN_STEPS` frames.
    SmallTurn,
    /// Nothing was waiting after a gap and the next wait ran past `IDLE_WAIT_MAX`.
    Idle,
}

/// What one call changed, for the driver's log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    Started,
    Stopped(Stopped),
}

/// The driver's coalescing state.
#[derive(Debug)]
pub(crate) struct Coalesce {
    /// The configured gap, where each start begins; zero turns coalescing off.
    gap: Duration,
    /// The gap now, while coalescing: between `GAP_FLOOR_PERCENT` and `GAP_CEILING_PERCENT` of
    /// `gap`.
    current: Duration,
    /// Turns observed since the gap last grew.
    since_growth: u32,
    /// Turns observed since a queue was last deep (`u32::MAX`: none since the start).
    since_deep: u32,
    /// Coalescing now.
    on: bool,
    /// Whether input was already there after the last gap; `None` when no gap was spent since
    /// the last turn was judged. `Some(true)`: the next turn is judged by its size;
    /// `Some(false)`: the wait's length decides whether to stop.
    after_gap: Option<bool>,
    /// Decayed share of waits that found input already there, percent << `SCALE_SHIFT`.
    waiting_share: u64,
    /// Decayed average of frames read per turn, << `SCALE_SHIFT`.
    turn_steps: u64,
    /// No start before this instant.
    hold_until: Option<Instant>,
}

impl Coalesce {
    pub(crate) fn new(gap: Duration) -> Coalesce {
        Coalesce {
            gap,
            current: gap,
            since_growth: 0,
            since_deep: u32::MAX,
            on: false,
            after_gap: None,
            waiting_share: 0,
            turn_steps: 0,
            hold_until: None,
        }
    }

    /// Whether coalescing may ever start (the gap is not zero).
    pub(crate) fn enabled(&self) -> bool {
        !self.gap.is_zero()
    }

    /// Whether the driver is coalescing: its turns read one round each.
    pub(crate) fn on(&self) -> bool {
        self.on
    }

    /// Called before a wait with the frames the last turn read: the gap to spend before
    /// polling, zero when not coalescing. May stop coalescing (`SmallTurn`).
    pub(crate) fn gap_before_wait(
        &mut self,
        now: Instant,
        last_turn_steps: usize,
    ) -> (Duration, Option<Change>) {
        let mut change = None;
        let gapped = self.after_gap.take() == Some(true);
        if self.on && gapped && last_turn_steps < EXIT_TURN_STEPS {
            self.stop(now);
            change = Some(Change::Stopped(Stopped::SmallTurn));
        }
        if !self.on && self.enabled() && last_turn_steps > 0 {
            let steps = (last_turn_steps as u64).min(1 << 20) << SCALE_SHIFT;
            self.turn_steps = self.turn_steps - (self.turn_steps >> STEPS_DECAY_SHIFT)
                + (steps >> STEPS_DECAY_SHIFT);
        }
        let gap = if self.on {
            self.current
        } else {
            Duration::ZERO
        };
        (gap, change)
    }

    /// Called after the gap (or at once, when there was none) with whether input is already
    /// there: events from a zero-timeout poll or connections left on the read backlog. May
    /// start coalescing; the gap applies from the next wait.
    pub(crate) fn observe(&mut self, now: Instant, waiting: bool) -> Option<Change> {
        if !self.enabled() {
            return None;
        }
        if self.on {
            self.after_gap = Some(waiting);
            return None;
        }
        let sample = if waiting { 100 << SCALE_SHIFT } else { 0 };
        self.waiting_share = self.waiting_share - (self.waiting_share >> WAITING_DECAY_SHIFT)
            + (sample >> WAITING_DECAY_SHIFT);
        let saturated = self.waiting_share >= WAITING_PERCENT_MIN << SCALE_SHIFT;
        let small_turns = self.turn_steps <= SMALL_TURN_STEPS << SCALE_SHIFT;
        let held = self.hold_until.is_some_and(|until| now < until);
        if waiting && saturated && small_turns && !held {
            self.on = true;
            self.after_gap = None;
            self.hold_until = None;
            self.current = self.gap;
            self.since_growth = 0;
            self.since_deep = u32::MAX;
            return Some(Change::Started);
        }
        None
    }

    /// Called when the wait returned, with how long it lasted. May stop coalescing (`Idle`).
    pub(crate) fn after_wait(&mut self, now: Instant, waited: Duration) -> Option<Change> {
        if self.on && self.after_gap == Some(false) && waited > IDLE_WAIT_MAX {
            self.stop(now);
            return Some(Change::Stopped(Stopped::Idle));
        }
        None
    }

    /// Called at the start of a coalescing turn with the deepest input queue (bytes in the
    /// kernel) among the connections that filled their share in the last round; `None` when
    /// none did. Adapts the gap the next wait spends.
    pub(crate) fn queue_observed(&mut self, deepest_bytes: Option<usize>) {
        if !self.on {
            return;
        }
        self.since_growth = self.since_growth.saturating_add(1);
        let step = self.gap / GAP_STEP_DIVISOR;
        if deepest_bytes.is_some_and(|bytes| bytes >= DRAINED_BYTES) {
            self.since_deep = 0;
            let floor = self.gap * GAP_FLOOR_PERCENT / 100;
            self.current = self.current.saturating_sub(step).max(floor);
        } else if self.since_deep < FLAT_OUT_MEMORY_TURNS {
            self.since_deep += 1;
            if self.since_growth >= GROWTH_COOLDOWN_TURNS {
                self.since_growth = 0;
                let ceiling = self.gap * GAP_CEILING_PERCENT / 100;
                self.current = (self.current * GAP_GROWTH_PERCENT / 100).min(ceiling);
            }
        } else if self.current > self.gap {
            self.current = self.current.saturating_sub(step).max(self.gap);
        } else {
            self.current = (self.current + step).min(self.gap);
        }
    }

    /// The gap a coalescing turn waits now.
    #[cfg(test)]
    fn current_gap(&self) -> Duration {
        self.current
    }

    fn stop(&mut self, now: Instant) {
        self.on = false;
        self.after_gap = None;
        self.waiting_share = 0;
        self.hold_until = Some(now + HOLD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GAP: Duration = Duration::from_micros(20);

    /// One driver cycle: the last turn's frames, whether input is waiting after the gap, and
    /// how long the wait lasted. Returns the gap spent and the changes.
    fn cycle(
        c: &mut Coalesce,
        now: &mut Instant,
        steps: usize,
        waiting: bool,
        waited: Duration,
    ) -> (Duration, Vec<Change>) {
        let mut changes = Vec::new();
        let (gap, change) = c.gap_before_wait(*now, steps);
        changes.extend(change);
        *now += gap;
        changes.extend(c.observe(*now, waiting));
        *now += waited;
        changes.extend(c.after_wait(*now, waited));
        *now += Duration::from_micros(5);
        (gap, changes)
    }

    fn saturate(c: &mut Coalesce, now: &mut Instant, steps: usize) -> usize {
        (0..100_000)
            .position(|_| cycle(c, now, steps, true, Duration::ZERO).1 == [Change::Started])
            .map_or(usize::MAX, |i| i + 1)
    }

    #[test]
    fn a_saturated_host_with_small_turns_starts_after_a_few_dozen_waits() {
        let mut now = Instant::now();
        let mut c = Coalesce::new(GAP);
        let waits = saturate(&mut c, &mut now, 3);
        assert!((10..=40).contains(&waits), "started after {waits} waits");
        assert!(c.on());
        let (gap, changes) = cycle(&mut c, &mut now, 3, true, Duration::ZERO);
        assert_eq!(
            (gap, changes),
            (GAP, vec![]),
            "the next wait spends the gap"
        );
        // Turns after gaps read a batch: it holds.
        for _ in 0..1000 {
            assert_eq!(
                cycle(&mut c, &mut now, 64, true, Duration::ZERO),
                (GAP, vec![])
            );
        }
    }

    #[test]
    fn batching_peers_and_an_unsaturated_host_never_start() {
        let mut now = Instant::now();
        let mut c = Coalesce::new(GAP);
        assert_eq!(
            saturate(&mut c, &mut now, 16),
            usize::MAX,
            "16 frames a turn"
        );
        let mut c = Coalesce::new(GAP);
        // Input waiting at one wait in four (100k msg/s): never.
        for i in 0..10_000 {
            let (gap, changes) = cycle(&mut c, &mut now, 1, i % 4 == 0, Duration::from_micros(8));
            assert_eq!((gap, changes), (Duration::ZERO, vec![]));
        }
        let mut off = Coalesce::new(Duration::ZERO);
        assert_eq!(
            saturate(&mut off, &mut now, 1),
            usize::MAX,
            "a zero gap is off"
        );
    }

    #[test]
    fn a_gapped_turn_that_read_little_stops_it_and_holds_it_off() {
        let mut now = Instant::now();
        let mut c = Coalesce::new(GAP);
        saturate(&mut c, &mut now, 2);
        cycle(&mut c, &mut now, 2, true, Duration::ZERO); // gap, input waiting
        let (gap, changes) = cycle(&mut c, &mut now, 2, true, Duration::ZERO);
        assert_eq!(gap, Duration::ZERO);
        assert_eq!(changes, vec![Change::Stopped(Stopped::SmallTurn)]);
        // Saturated again at once: held off for `HOLD`, then it starts again.
        let started = now;
        let waits = saturate(&mut c, &mut now, 2);
        assert!(now - started >= HOLD, "restarted after {:?}", now - started);
        assert!(waits < usize::MAX);
    }

    #[test]
    fn a_short_lull_keeps_it_and_a_long_wait_stops_it() {
        let mut now = Instant::now();
        let mut c = Coalesce::new(GAP);
        saturate(&mut c, &mut now, 3);
        // Nothing waiting after the gap, but input came within 1 ms (a paused peer): still on.
        assert_eq!(
            cycle(&mut c, &mut now, 3, false, Duration::from_millis(1)).1,
            vec![]
        );
        assert!(c.on());
        assert_eq!(cycle(&mut c, &mut now, 64, true, Duration::ZERO).0, GAP);
        // A gapped turn that was not followed by input for 5 ms: off.
        let (_, changes) = cycle(&mut c, &mut now, 64, false, Duration::from_millis(5));
        assert_eq!(changes, vec![Change::Stopped(Stopped::Idle)]);
        assert!(!c.on());
    }

    const FLOOR: Duration = Duration::from_micros(13);
    const CEILING: Duration = Duration::from_micros(40);
    const DEEP: usize = 1 << 20;

    #[test]
    fn a_deep_queue_shrinks_the_gap_to_its_floor_a_step_a_turn() {
        let mut now = Instant::now();
        let mut c = Coalesce::new(GAP);
        c.queue_observed(Some(DEEP));
        assert_eq!(c.current_gap(), GAP, "ignored while off");
        saturate(&mut c, &mut now, 3);
        assert_eq!(
            c.current_gap(),
            GAP,
            "each start begins at the configured gap"
        );
        c.queue_observed(Some(DEEP));
        assert_eq!(c.current_gap(), GAP - Duration::from_nanos(20));
        for _ in 0..348 {
            c.queue_observed(Some(DEEP));
        }
        assert!(c.current_gap() > FLOOR, "{:?}", c.current_gap());
        c.queue_observed(Some(DEEP));
        assert_eq!(c.current_gap(), FLOOR, "350 turns from start to floor");
        c.queue_observed(Some(DEEP));
        assert_eq!(c.current_gap(), FLOOR, "never under the floor");
        assert_eq!(
            cycle(&mut c, &mut now, 64, true, Duration::ZERO),
            (FLOOR, vec![]),
            "the wait spends the adapted gap"
        );
    }

    #[test]
    fn a_drained_queue_grows_the_gap_once_per_cooldown_up_to_its_ceiling() {
        let mut now = Instant::now();
        let mut c = Coalesce::new(GAP);
        saturate(&mut c, &mut now, 3);
        c.queue_observed(Some(DEEP));
        let shrunk = GAP - Duration::from_nanos(20);
        // Then a connection filled its share, and little was left behind it.
        for _ in 0..GROWTH_COOLDOWN_TURNS - 2 {
            c.queue_observed(Some(DRAINED_BYTES - 1));
        }
        assert_eq!(c.current_gap(), shrunk, "not before the cooldown");
        c.queue_observed(Some(0));
        let grown = shrunk * GAP_GROWTH_PERCENT / 100;
        assert_eq!(c.current_gap(), grown);
        for _ in 0..GROWTH_COOLDOWN_TURNS - 1 {
            c.queue_observed(Some(0));
        }
        assert_eq!(c.current_gap(), grown, "one growth per cooldown");
        // No connection filled its share: a drain too.
        c.queue_observed(None);
        assert_eq!(c.current_gap(), grown * GAP_GROWTH_PERCENT / 100);
        for _ in 0..200 {
            c.queue_observed(Some(0));
        }
        assert_eq!(c.current_gap(), CEILING, "never over the ceiling");
        // A deep queue again: back down, a step a turn.
        c.queue_observed(Some(DRAINED_BYTES));
        assert_eq!(c.current_gap(), CEILING - Duration::from_nanos(20));
    }

    #[test]
    fn without_a_recent_deep_queue_the_gap_returns_to_the_configured_one() {
        let mut now = Instant::now();
        // Many peers at a moderate rate: no connection fills its share, or, after a pause of
        // the VM, some do and leave little behind.
        let mut c = Coalesce::new(GAP);
        saturate(&mut c, &mut now, 3);
        for i in 0..10_000 {
            c.queue_observed(if i % 100 == 0 { Some(4096) } else { None });
            assert_eq!(c.current_gap(), GAP);
        }
        // A flat-out peer that stops keeping its queue deep: the gap grows for
        // `FLAT_OUT_MEMORY_TURNS`, then comes back down to the configured gap, not under it.
        let mut c = Coalesce::new(GAP);
        saturate(&mut c, &mut now, 3);
        c.queue_observed(Some(DEEP));
        for _ in 0..FLAT_OUT_MEMORY_TURNS {
            c.queue_observed(None);
        }
        let grown = c.current_gap();
        assert!(grown > GAP, "{grown:?}");
        c.queue_observed(None);
        assert_eq!(c.current_gap(), grown - Duration::from_nanos(20));
        for _ in 0..100_000 {
            c.queue_observed(None);
        }
        assert_eq!(c.current_gap(), GAP);
        // And from under it (a peer that was ahead and left), back up to it.
        let mut c = Coalesce::new(GAP);
        saturate(&mut c, &mut now, 3);
        for _ in 0..1000 {
            c.queue_observed(Some(DEEP));
        }
        assert_eq!(c.current_gap(), FLOOR);
        for _ in 0..FLAT_OUT_MEMORY_TURNS {
            c.queue_observed(None);
        }
        for _ in 0..100_000 {
            c.queue_observed(None);
        }
        assert_eq!(c.current_gap(), GAP);
    }

    #[test]
    fn a_restart_begins_at_the_configured_gap_again() {
        let mut now = Instant::now();
        let mut c = Coalesce::new(GAP);
        saturate(&mut c, &mut now, 3);
        for _ in 0..1000 {
            c.queue_observed(Some(DEEP));
        }
        assert_eq!(c.current_gap(), FLOOR);
        // A gapped turn that read little stops it; after the hold it starts again.
        cycle(&mut c, &mut now, 3, true, Duration::ZERO);
        let (_, changes) = cycle(&mut c, &mut now, 2, true, Duration::ZERO);
        assert_eq!(changes, vec![Change::Stopped(Stopped::SmallTurn)]);
        saturate(&mut c, &mut now, 2);
        assert!(c.on());
        assert_eq!(c.current_gap(), GAP);
        assert_eq!(cycle(&mut c, &mut now, 64, true, Duration::ZERO).0, GAP);
    }

    #[test]
    fn the_first_turn_after_starting_is_not_judged() {
        // The turn that ran before the first gap read a small turn by definition.
        let mut now = Instant::now();
        let mut c = Coalesce::new(GAP);
        saturate(&mut c, &mut now, 1);
        assert_eq!(
            cycle(&mut c, &mut now, 1, true, Duration::ZERO),
            (GAP, vec![])
        );
        assert!(c.on());
    }
}
