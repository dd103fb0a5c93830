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
//! Prints one JSON line: ticks, how many woke more than 500 µs late and their summed lateness,
//! the same over 2 ms, and the worst.

use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

/// A wake this late counts as a stall: the p99 target the comparison checks is 500 µs.
const STALL_US: u64 = 500;
const LONG_STALL_US: u64 = 2_000;

struct Options {
    duration: Duration,
    tick: Duration,
}

fn parse_micros(flag: &str, value: Option<String>) -> Result<Duration, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value in microseconds"))?;
    let us: u64 = value
        .parse()
        .map_err(|_| format!("{flag} {value:?}: expected whole microseconds"))?;
    Ok(Duration::from_micros(us))
}

fn parse_args() -> Result<Options, String> {
    let mut options = Options {
        duration: Duration::from_secs(10),
        tick: Duration::from_millis(1),
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--duration-us" => options.duration = parse_micros(&arg, args.next())?,
            "--tick-us" => options.tick = parse_micros(&arg, args.next())?,
            "-h" | "--help" => {
                return Err("usage: axhost-stall-probe [--duration-us N] [--tick-us N]".into());
            }
            other => return Err(format!("unknown argument {other:?} (try --help)")),
        }
    }
    if options.tick < Duration::from_micros(100) || options.tick > Duration::from_secs(1) {
        return Err("--tick-us must be between 100 and 1000000".into());
    }
    if options.duration > Duration::from_secs(3600) {
        return Err("--duration-us must be at most one hour".into());
    }
    Ok(options)
}

#[derive(Default)]
struct Stalls {
    ticks: u64,
    over: u64,
    over_us: u64,
    long: u64,
    long_us: u64,
    max_us: u64,
}

impl Stalls {
    fn record(&mut self, late: Duration) {
        self.ticks += 1;
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
        format!(
            "{{\"ticks\":{},\"stalls_over_500us\":{},\"stalled_ms\":{:.1},\"stalls_over_2ms\":{},\
             \"long_stalled_ms\":{:.1},\"max_us\":{}}}",
            self.ticks,
            self.over,
            self.over_us as f64 / 1e3,
            self.long,
            self.long_us as f64 / 1e3,
            self.max_us
        )
    }
}

fn probe(options: &Options) -> Stalls {
    let start = Instant::now();
    let end = start + options.duration;
    let mut stalls = Stalls::default();
    let mut deadline = start + options.tick;
    while deadline <= end {
        let now = Instant::now();
        if deadline > now {
            thread::sleep(deadline - now);
        }
        let woke = Instant::now();
        stalls.record(woke.saturating_duration_since(deadline));
        // After a stall, start again from now: the ticks it swallowed are not stalls of their own.
        deadline = woke.max(deadline) + options.tick;
    }
    stalls
}

fn main() -> ExitCode {
    match parse_args() {
        Ok(options) => {
            println!("{}", probe(&options).json());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("axhost-stall-probe: {e}");
            ExitCode::from(2)
        }
    }
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
            (s.ticks, s.over, s.over_us, s.long, s.long_us, s.max_us),
            (4, 2, 3_100, 1, 2_500, 2_500)
        );
        assert!(s.json().contains("\"stalled_ms\":3.1"));
    }

    #[test]
    fn a_short_probe_ticks() {
        let s = probe(&Options {
            duration: Duration::from_millis(20),
            tick: Duration::from_millis(1),
        });
        assert!(s.ticks >= 1 && s.ticks <= 20, "{} ticks", s.ticks);
    }
}
