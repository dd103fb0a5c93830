//! `axhost-stall-probe`: how long the machine itself stops running this CPU.
//!
//! On a shared VM the hypervisor (or the host's memory management) can pause a vCPU for
//! milliseconds at a time, and not all of it shows as `steal` in `/proc/stat`. Every message in
//! flight during such a pause is late by the pause, whichever server runs, so a latency tail has
//! to be read beside the pauses of the same run.
//!
//! The probe sleeps to a deadline every tick (1 ms by default) and records how late it wakes. Run
//! it pinned to one CPU with a real-time priority (`taskset -c 0 chrt -f 50 axhost-stall-probe`):
//! then a late wake means nothing in the guest could run on that CPU, not that a busy server held
//! it. It costs one wake-up per tick. It misses the part of a pause that ends before the next
//! deadline, so its totals are a lower bound; pauses of several ms are measured whole.
//!
//! `--spin` measures the other way: a busy loop reads the clock back to back, and any gap
//! between two reads is time the CPU was taken away. This is the machine check `compare.sh`
//! runs before and after its runs, one CPU busy and then both: on the 2-vCPU VM the results
//! were measured on, one busy vCPU lost 0-11 ms per 8 s, and with both busy at once the
//! more-paused one lost 33-58 ms (`docs/performance.md`). Do not give the spinning probe a
//! real-time priority: the kernel throttles a real-time task that never sleeps
//! (`sched_rt_runtime_us`), which would read as a pause.
//!
//! A vCPU can also run slowly without stopping: on the same VM a plain loop alone on one CPU ran
//! at a tenth to two thirds of its usual speed for ~100 ms at a time, every second or two, with
//! hardly a gap over 500 µs between two clock reads to show for it (0-2 in 6 s). So each tick (and each turn of the
//! spinning loop) also times a fixed unit of work, about 5 µs at full speed, and counts the
//! units that took more than twice the run's median: the CPU ran at under half speed then.
//!
//! Prints one JSON line: the mode, the samples (ticks, or gaps over 50 µs when spinning), how
//! many were more than 500 µs late and their summed lateness, the same over 2 ms, and the worst;
//! then the work units, the median unit in µs, how many took over twice that, and the time that
//! stands for (`slowed_ms`: slow ticks times the tick, or the slow units' own time when
//! spinning).

use std::hint::black_box;
use std::thread;
use std::time::{Duration, Instant};

use clap::Parser;

/// A wake this late counts as a stall: the p99 target the comparison checks is 500 µs.
const STALL_US: u64 = 500;
const LONG_STALL_US: u64 = 2_000;
/// A spinning probe counts a gap between two clock reads from this length: shorter ones are
/// interrupts and the clock read itself.
const SPIN_GAP_US: u64 = 50;
/// The work unit's length at full speed: long enough to time, short enough that one per tick
/// costs the measured CPU 0.5%.
const UNIT_TARGET: Duration = Duration::from_micros(5);
/// Unit times are kept in buckets this wide, up to `UNIT_BUCKETS` of them (the last one holds
/// everything longer), so the median needs no per-sample storage however long the run.
const UNIT_BUCKET_NS: u64 = 50;
const UNIT_BUCKETS: usize = 20_000;

/// Parsed by clap like `axhost-load`; bad or out-of-range values exit with status 2.
#[derive(Parser, Debug)]
#[command(
    name = "axhost-stall-probe",
    about = "How long the machine pauses this CPU: the late wakes of a fixed tick, or with \
             --spin the gaps in a busy loop"
)]
struct Options {
    /// How long to probe, in microseconds (at most one hour).
    #[arg(long = "duration-us", default_value_t = 10_000_000,
          value_parser = clap::value_parser!(u64).range(0..=3_600_000_000))]
    duration_us: u64,
    /// The tick, in microseconds.
    #[arg(long = "tick-us", default_value_t = 1_000,
          value_parser = clap::value_parser!(u64).range(100..=1_000_000))]
    tick_us: u64,
    /// Spin instead of ticking: keep the CPU busy and count the gaps between clock reads.
    #[arg(long)]
    spin: bool,
    /// With `--spin`: busy this share (percent) of every millisecond and sleep the rest, to load
    /// a CPU partly (gaps are counted only while busy).
    #[arg(long, default_value_t = 100, requires = "spin",
          value_parser = clap::value_parser!(u64).range(1..=100))]
    duty: u64,
}

#[derive(Default)]
struct Stalls {
    spin: bool,
    /// Ticks, or when spinning the gaps over `SPIN_GAP_US`.
    samples: u64,
    over: u64,
    over_us: u64,
    long: u64,
    long_us: u64,
    max_us: u64,
    units: UnitTimes,
    /// What one slow unit stands for in `slowed_ms`: the tick, or nothing when spinning (the
    /// unit's own time counts then).
    tick: Option<Duration>,
}

/// How long the work units took: a histogram of `UNIT_BUCKET_NS` buckets.
struct UnitTimes {
    buckets: Vec<u64>,
    count: u64,
}

impl Default for UnitTimes {
    fn default() -> Self {
        UnitTimes {
            buckets: vec![0; UNIT_BUCKETS],
            count: 0,
        }
    }
}

impl UnitTimes {
    fn record(&mut self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        let i = usize::try_from(ns / UNIT_BUCKET_NS)
            .map_or(UNIT_BUCKETS - 1, |i| i.min(UNIT_BUCKETS - 1));
        self.buckets[i] += 1;
        self.count += 1;
    }

    /// The median unit time, in ns (a bucket's midpoint); `None` before any unit.
    fn median_ns(&self) -> Option<u64> {
        let half = self.count.div_ceil(2);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= half && *n > 0 {
                return Some(i as u64 * UNIT_BUCKET_NS + UNIT_BUCKET_NS / 2);
            }
        }
        None
    }

    /// The units that took more than twice the median, and their summed time in ns (bucket
    /// midpoints; the last bucket counts at its lower edge, so the sum never overstates).
    fn slow(&self) -> (u64, u64) {
        let Some(median) = self.median_ns() else {
            return (0, 0);
        };
        let first = usize::try_from(2 * median / UNIT_BUCKET_NS + 1).unwrap_or(UNIT_BUCKETS);
        let mut n = 0;
        let mut ns = 0;
        for (i, c) in self.buckets.iter().enumerate().skip(first) {
            let each = if i == UNIT_BUCKETS - 1 {
                i as u64 * UNIT_BUCKET_NS
            } else {
                i as u64 * UNIT_BUCKET_NS + UNIT_BUCKET_NS / 2
            };
            n += c;
            ns += c * each;
        }
        (n, ns)
    }
}

impl Stalls {
    fn record(&mut self, late: Duration) {
        self.samples += 1;
        let us = u64::try_from(late.as_micros()).unwrap_or(u64::MAX);
        self.max_us = self.max_us.max(us);
        if us > STALL_US {
            self.over += 1;
            self.over_us += us;
        }
        if us > LONG_STALL_US {
            self.long += 1;
            self.long_us += us;
        }
    }

    fn json(&self) -> String {
        let (mode, samples) = if self.spin {
            ("spin", "gaps_over_50us")
        } else {
            ("tick", "ticks")
        };
        let (slow, slow_ns) = self.units.slow();
        let slowed_ns = match self.tick {
            Some(tick) => slow.saturating_mul(u64::try_from(tick.as_nanos()).unwrap_or(u64::MAX)),
            None => slow_ns,
        };
        let median_us = self.units.median_ns().map_or(0.0, |ns| ns as f64 / 1e3);
        format!(
            "{{\"mode\":\"{mode}\",\"{samples}\":{},\"stalls_over_500us\":{},\"stalled_ms\":{:.1},\
             \"stalls_over_2ms\":{},\"long_stalled_ms\":{:.1},\"max_us\":{},\"units\":{},\
             \"unit_p50_us\":{median_us:.2},\"slow_units\":{slow},\"slowed_ms\":{:.1}}}",
            self.samples,
            self.over,
            self.over_us as f64 / 1e3,
            self.long,
            self.long_us as f64 / 1e3,
            self.max_us,
            self.units.count,
            slowed_ns as f64 / 1e6,
        )
    }
}

/// A fixed unit of dependent integer work: `rounds` steps of xorshift. Its time measures the
/// CPU's speed (nothing else in the guest can take the CPU from a real-time probe).
fn work(rounds: u32) -> u64 {
    let mut x = black_box(0x9e37_79b9_7f4a_7c15_u64);
    for _ in 0..black_box(rounds) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    black_box(x)
}

/// Times one unit of `rounds`.
fn timed_unit(rounds: u32) -> Duration {
    let start = Instant::now();
    work(rounds);
    start.elapsed()
}

/// Rounds for a unit of about `UNIT_TARGET`: doubled until the fastest of a few tries reaches
/// it, then scaled down, so a slow moment during calibration only makes the unit shorter.
fn calibrate() -> u32 {
    let fastest = |rounds| (0..5).map(|_| timed_unit(rounds)).min().unwrap_or_default();
    let mut rounds: u32 = 64;
    loop {
        let took = fastest(rounds);
        if took >= UNIT_TARGET || rounds >= 1 << 30 {
            let scaled = u128::from(rounds) * UNIT_TARGET.as_nanos() / took.as_nanos().max(1);
            return u32::try_from(scaled).unwrap_or(rounds).max(1);
        }
        rounds *= 2;
    }
}

fn probe(duration: Duration, tick: Duration) -> Stalls {
    let rounds = calibrate();
    let start = Instant::now();
    let end = start + duration;
    let mut stalls = Stalls {
        tick: Some(tick),
        ..Stalls::default()
    };
    let mut deadline = start + tick;
    while deadline <= end {
        let now = Instant::now();
        if deadline > now {
            thread::sleep(deadline - now);
        }
        let woke = Instant::now();
        stalls.record(woke.saturating_duration_since(deadline));
        stalls.units.record(timed_unit(rounds));
        // After a stall, start again from now: the ticks it swallowed are not stalls of their own.
        deadline = woke.max(deadline) + tick;
    }
    stalls
}

/// Spins for `duration`, busy `duty` percent of every millisecond (100: all of it).
fn spin(duration: Duration, duty: u64) -> Stalls {
    const PERIOD: Duration = Duration::from_millis(1);
    let busy = PERIOD * u32::try_from(duty.min(100)).unwrap_or(100) / 100;
    let rounds = calibrate();
    let start = Instant::now();
    let mut stalls = Stalls {
        spin: true,
        ..Stalls::default()
    };
    let mut last = start;
    let mut period_start = start;
    loop {
        let now = Instant::now();
        let gap = now.saturating_duration_since(last);
        if gap > Duration::from_micros(SPIN_GAP_US) {
            stalls.record(gap);
        }
        // The unit sits between two clock reads, so a pause inside it still counts as a gap.
        stalls.units.record(timed_unit(rounds));
        last = now;
        if now.saturating_duration_since(start) >= duration {
            return stalls;
        }
        if busy < PERIOD && now.saturating_duration_since(period_start) >= busy {
            // The sleep is ours, not a pause: the next gap is measured from after it.
            thread::sleep((period_start + PERIOD).saturating_duration_since(now));
            period_start = Instant::now();
            last = period_start;
        }
    }
}

fn main() {
    let options = Options::parse();
    let duration = Duration::from_micros(options.duration_us);
    let stalls = if options.spin {
        spin(duration, options.duty)
    } else {
        probe(duration, Duration::from_micros(options.tick_us))
    };
    println!("{}", stalls.json());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lateness_is_bucketed_by_size() {
        let mut s = Stalls::default();
        for us in [10, 400, 600, 2_500] {
            s.record(Duration::from_micros(us));
        }
        assert_eq!(
            (s.samples, s.over, s.over_us, s.long, s.long_us, s.max_us),
            (4, 2, 3_100, 1, 2_500, 2_500)
        );
        assert!(s.json().contains("\"stalled_ms\":3.1"));
        assert!(s.json().starts_with("{\"mode\":\"tick\",\"ticks\":4,"));
    }

    #[test]
    fn units_over_twice_the_median_are_slow() {
        let mut u = UnitTimes::default();
        assert_eq!((u.median_ns(), u.slow()), (None, (0, 0)));
        for _ in 0..90 {
            u.record(Duration::from_nanos(5_010));
        }
        // 5,020 ns and 10,000 ns are not over twice the median bucket (5,025 ns); 10,100 is.
        for ns in [5_020, 10_000, 10_100, 30_000, 30_000] {
            u.record(Duration::from_nanos(ns));
        }
        // One beyond the last bucket counts at that bucket's lower edge, never more.
        u.record(Duration::from_secs(5));
        assert_eq!(u.median_ns(), Some(5_025));
        assert_eq!(u.slow(), (4, 10_125 + 2 * 30_025 + 999_950));
    }

    #[test]
    fn a_slow_tick_stands_for_the_whole_tick() {
        let mut s = Stalls {
            tick: Some(Duration::from_millis(1)),
            ..Stalls::default()
        };
        for _ in 0..10 {
            s.units.record(Duration::from_micros(5));
        }
        s.units.record(Duration::from_micros(40));
        s.units.record(Duration::from_micros(60));
        let json = s.json();
        assert!(
            json.ends_with("\"units\":12,\"unit_p50_us\":5.03,\"slow_units\":2,\"slowed_ms\":2.0}"),
            "{json}"
        );
        // Spinning, the slow units' own time counts instead.
        s.tick = None;
        assert!(
            s.json().ends_with("\"slow_units\":2,\"slowed_ms\":0.1}"),
            "{}",
            s.json()
        );
    }

    #[test]
    fn calibration_makes_a_unit_of_a_few_microseconds() {
        let rounds = calibrate();
        let fastest = (0..20)
            .map(|_| timed_unit(rounds))
            .min()
            .unwrap_or_default();
        // Loose: a loaded test machine can slow any single try, but not the fastest of twenty
        // by 20x, nor make a unit far shorter than calibrated.
        assert!(
            fastest >= Duration::from_micros(1) && fastest <= Duration::from_micros(100),
            "{rounds} rounds took {fastest:?}"
        );
    }

    #[test]
    fn a_short_spin_ends_and_names_its_samples() {
        let started = Instant::now();
        let s = spin(Duration::from_millis(20), 100);
        assert!(started.elapsed() >= Duration::from_millis(20));
        assert!(s
            .json()
            .starts_with("{\"mode\":\"spin\",\"gaps_over_50us\":"));
        // Half busy: the twenty sleeps of ~500 µs (each over the 500 µs a pause is counted
        // from, with the sleep's overshoot) are not counted as pauses. Shorter gaps are left
        // out of the check: a loaded test machine may preempt the loop for those.
        let s = spin(Duration::from_millis(20), 50);
        assert!(s.over < 10, "{} pauses counted", s.over);
    }

    #[test]
    fn a_short_probe_ticks() {
        let s = probe(Duration::from_millis(20), Duration::from_millis(1));
        assert!(s.samples >= 1 && s.samples <= 20, "{} ticks", s.samples);
    }

    #[test]
    fn arguments_are_bounded() {
        let o = Options::try_parse_from(["probe"]).expect("defaults");
        assert_eq!(
            (o.duration_us, o.tick_us, o.spin),
            (10_000_000, 1_000, false)
        );
        let o = Options::try_parse_from(["probe", "--spin"]).expect("spin");
        assert!(o.spin && o.duty == 100);
        let o = Options::try_parse_from(["probe", "--spin", "--duty", "60"]).expect("duty");
        assert_eq!(o.duty, 60);
        let o = Options::try_parse_from(["probe", "--duration-us", "7000000", "--tick-us", "100"])
            .expect("in range");
        assert_eq!((o.duration_us, o.tick_us), (7_000_000, 100));
        for bad in [
            &["probe", "--tick-us", "99"][..],
            &["probe", "--tick-us", "1000001"],
            &["probe", "--duration-us", "3600000001"],
            &["probe", "--duration-us", "-1"],
            &["probe", "--duration-us"],
            &["probe", "--ticks", "5"],
            &["probe", "--duty", "50"],
            &["probe", "--spin", "--duty", "0"],
            &["probe", "--spin", "--duty", "101"],
        ] {
            assert!(Options::try_parse_from(bad).is_err(), "{bad:?} accepted");
        }
    }
}
