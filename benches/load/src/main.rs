//! `axhost-load`: point-to-point notification load against axhost client services, Redis
//! pub/sub or NATS, with the same payload, the same shapes and the same event loop for all three.
//!
//! Routing (identical for every target): sender `i` sends its `k`-th message to receiver
//! `(i + k) mod M`. So with N == M each receiver gets the same share, and 1→16 spreads one
//! sender's stream round-robin over sixteen receivers.
//!
//! One thread, one mio `Poll` for every connection by default; `--threads T` splits the
//! connections over T threads, each with its own poll, sharing one clock origin and the sent
//! and received counts (so each knows when the whole run has drained). Setup is blocking and
//! sequential (receivers first, so every service or subscription exists before any sender
//! starts); then warmup, the measured window, and a drain that waits for messages in flight.

mod engine;
mod payload;
mod socket_stamp;
mod timer;

use axhost_load::{nats, parse_duration, resp, setup, ws};

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Target {
    Axhost,
    Redis,
    Nats,
}

impl Target {
    fn name(self) -> &'static str {
        match self {
            Target::Axhost => "axhost",
            Target::Redis => "redis",
            Target::Nats => "nats",
        }
    }

    fn default_addr(self) -> &'static str {
        match self {
            Target::Axhost => "127.0.0.1:7331",
            Target::Redis => "127.0.0.1:6379",
            Target::Nats => "127.0.0.1:4222",
        }
    }
}

/// Offered load.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Rate {
    /// Flat out: every sender writes whenever its socket takes bytes.
    Max,
    /// Total messages per second over all senders.
    PerSec(f64),
}

fn parse_rate(s: &str) -> Result<Rate, String> {
    if s.eq_ignore_ascii_case("max") {
        return Ok(Rate::Max);
    }
    let (num, mult) = match s.strip_suffix(['k', 'K']) {
        Some(n) => (n, 1e3),
        None => match s.strip_suffix(['m', 'M']) {
            Some(n) => (n, 1e6),
            None => (s, 1.0),
        },
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("rate {s:?}: expected `max` or a number like 10000 or 10k"))?;
    let v = v * mult;
    if !(1.0..=50e6).contains(&v) {
        return Err(format!("rate {s:?}: must be between 1 and 50M msg/s"));
    }
    Ok(Rate::PerSec(v))
}

/// How a sender waits for its next message in rate mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pace {
    /// Spin for the last stretch before each message is due (epoll sleeps in whole
    /// milliseconds), so every message leaves on time and is stamped with its scheduled time:
    /// the tool's own lateness counts as latency. Keeps the tool's CPU busy at any rate.
    Spin,
    /// Sleep until the next message is due but at least `--sleep-min`, then send everything
    /// due, each write stamped when it is built: the same offered rate in bursts (rate ×
    /// sleep-min: 100 messages at 100k/s with the default millisecond), with a CPU that idles
    /// between them.
    /// Latency then starts at the write and leaves out the tool's own lateness, which the
    /// sender lag reports instead (at least the wait, more when the tool falls behind); the
    /// window counts what was written in it, so a backlog can put sent/s above the rate.
    Sleep,
}

fn parse_sleep_min(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s)?;
    if d < Duration::from_micros(10) || d > Duration::from_secs(1) {
        return Err(format!("sleep-min {s:?}: must be between 10us and 1s"));
    }
    Ok(d)
}

#[derive(Parser, Debug)]
#[command(
    name = "axhost-load",
    about = "Point-to-point notification load: axhost client services vs Redis pub/sub vs NATS",
    after_help = "Sender i sends its k-th message to receiver (i + k) mod RECEIVERS."
)]
pub struct Args {
    /// System under test.
    #[arg(long, value_enum, default_value = "axhost")]
    pub target: Target,
    /// host:port (default 127.0.0.1:7331 / 6379 / 4222 by target).
    #[arg(long)]
    pub addr: Option<String>,
    /// axhost bearer token (one principal for every connection, so each sees the services).
    #[arg(long, env = "AXHOST_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// axhost WebSocket path.
    #[arg(long, default_value = "/axp")]
    pub path: String,
    /// Sending connections.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub senders: u32,
    /// Receiving connections (service owners / subscribers).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub receivers: u32,
    /// Total offered msg/s over all senders (`10000`, `10k`), or `max` for flat out.
    #[arg(long, default_value = "10k", value_parser = parse_rate)]
    pub rate: Rate,
    /// Measured window.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured warmup before the window.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Longest wait after the window for messages still in flight.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub drain: Duration,
    /// Rate mode: spin until each message is due, or sleep and send in bursts (see `Pace`).
    #[arg(long, value_enum, default_value = "spin")]
    pub pace: Pace,
    /// Sleeping pace: the shortest sleep (from 10us; a `timerfd` on Linux, epoll's whole
    /// milliseconds elsewhere). Bursts are the rate times this.
    #[arg(long, default_value = "1ms", value_parser = parse_sleep_min)]
    pub sleep_min: Duration,
    /// Frames a sender packs into one socket write.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub batch: u32,
    /// Load threads, each with its own poll over every connection whose index is the thread's
    /// number modulo this (pin the process to as many CPUs with `taskset`). One thread cannot
    /// drive 64->64 at 100k msg/s with one frame per write on a small VM.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub threads: u32,
    /// Application payload bytes (identical for every target; includes the timestamp).
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(48..=65536))]
    pub size: u32,
    /// Do not ask the kernel to timestamp what receivers get (`SO_TIMESTAMPNS`, Linux); the
    /// latency "at the socket" is then not reported.
    #[arg(long)]
    pub no_socket_stamps: bool,
    /// Also print one JSON line with the results.
    #[arg(long)]
    pub json: bool,
}

fn resolve(addr: &str) -> Result<SocketAddr, String> {
    addr.to_socket_addrs()
        .map_err(|e| format!("address {addr:?}: {e}"))?
        .next()
        .ok_or_else(|| format!("address {addr:?} resolves to nothing"))
}

fn run(args: &Args) -> Result<(), String> {
    let addr = resolve(args.addr.as_deref().unwrap_or(args.target.default_addr()))?;
    let token = match (args.target, &args.token) {
        (Target::Axhost, None) => {
            return Err("axhost needs a token: --token or AXHOST_TOKEN".into());
        }
        (_, t) => t.clone().unwrap_or_default(),
    };
    let report = engine::run(args, addr, &token)?;
    println!("{}", report.human(args));
    if args.json {
        println!("{}", report.json(args));
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("axhost-load: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_and_durations() {
        assert_eq!(parse_rate("max"), Ok(Rate::Max));
        assert_eq!(parse_rate("10k"), Ok(Rate::PerSec(10_000.0)));
        assert_eq!(parse_rate("100000"), Ok(Rate::PerSec(100_000.0)));
        assert!(parse_rate("0").is_err());
        assert!(parse_rate("fast").is_err());
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("100us"), Ok(Duration::from_micros(100)));
        assert_eq!(parse_duration("50µs"), Ok(Duration::from_micros(50)));
        assert!(parse_duration("-1s").is_err());
        assert_eq!(parse_sleep_min("50us"), Ok(Duration::from_micros(50)));
        assert!(parse_sleep_min("5us").is_err());
        assert!(parse_sleep_min("2s").is_err());
    }
}
