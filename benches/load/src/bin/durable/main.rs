//! `axhost-durable`: durable-write load against a real axhost (issue 31 §5).
//!
//! `--writers C` maintainer connections, each on its own session (created by the tool) and
//! subscribed to that session's chat, dispatch closed-loop: `chat/turnStarted`, then
//! `chat/turnCancelled` for that turn, each sent only once the echo of the previous one came
//! back on that connection. Every echo is one durable change the host committed before it let
//! the echo out, so echoes per second are durable changes per second, and send → echo is the
//! latency of one durable change.
//!
//! `--requests` adds two more connections: one registers a client service and answers every
//! `clientService/handleRequest` at once, the other sends `clientService/request` to it
//! closed-loop. Traffic that depends on no durable state, so its latency beside the writers
//! shows whether durable writes stall the rest of the host.
//!
//! `--sqlite-probe DIR` instead times bare single-row SQLite commits in DIR with the host's
//! pragmas (WAL, `synchronous=FULL`): what this disk allows one commit at a time, the ceiling
//! for one writer when every change is its own commit.

mod load;
mod probe;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use axhost_load::parse_duration;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "axhost-durable",
    about = "Durable-write load (closed-loop dispatches) and request latency beside it, against axhost"
)]
pub struct Args {
    /// host:port of the axhost to load (loopback in benches/durable.sh).
    #[arg(long, default_value = "127.0.0.1:7331")]
    pub addr: String,
    /// Bearer token of a maintainer (one principal for every connection).
    #[arg(long, env = "AXHOST_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// axhost WebSocket path.
    #[arg(long, default_value = "/axp")]
    pub path: String,
    /// Durable writers: connections on their own sessions, dispatching closed-loop.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub writers: u32,
    /// Also run a client-service request/response pair, closed-loop.
    #[arg(long)]
    pub requests: bool,
    /// With --requests: wait this long after each response before the next request (the
    /// poll's millisecond timer: at least this, up to a millisecond more). Zero, the default,
    /// sends back to back, which keeps the host awake; a gap lets it go idle between requests,
    /// so the latency includes waking it.
    #[arg(long, default_value = "0s", value_parser = parse_duration)]
    pub request_gap: Duration,
    /// Measured window.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured warmup before the window (the load runs; nothing is counted).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Longest wait for one echo or response; longer is an error (a lost echo, a stuck host).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub reply_timeout: Duration,
    /// Instead of the load: time bare single-row SQLite commits in this directory (a file is
    /// created there and removed), with the host's pragmas.
    #[arg(long)]
    pub sqlite_probe: Option<PathBuf>,
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
    if let Some(dir) = &args.sqlite_probe {
        let report = probe::run(dir, args.warmup, args.duration)?;
        println!("{}", report.human());
        if args.json {
            println!("{}", report.json());
        }
        return Ok(());
    }
    if args.writers == 0 && !args.requests {
        return Err("nothing to run: --writers 0 needs --requests".into());
    }
    let token = args
        .token
        .as_deref()
        .ok_or("axhost needs a token: --token or AXHOST_TOKEN")?;
    let addr = resolve(&args.addr)?;
    let report = load::run(args, addr, token)?;
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
            eprintln!("axhost-durable: {e}");
            ExitCode::FAILURE
        }
    }
}
