//! `axhost-axp`: the AXP exchange at scale against a real axhost (issue 32, "At scale").
//!
//! N sessions, each with its own executor holding a lease and streaming `_axp/emit` batches at
//! R per second, each session's chat watched by V viewers; heartbeats (`_axp/renew`) every
//! third of the lease, and every K emits a settle and the next turn. What it measures:
//! sustained emits per second, the emit's reply latency, the latency from an emit's send to
//! each viewer's receipt of the echoed action, leases lost and error answers, and the host's
//! resident memory before setup, after setup and after the run.
//!
//! Connections: one maintainer; executors share connections only when `--connections-max`
//! requires it (each connection drives its executors independently, pipelined); a viewer
//! connection watches up to 256 sessions' chats (the host's subscription limit per
//! connection), so V viewers per session take V × ⌈N/256⌉ connections.
//!
//! The turn cycle follows the reference host's semantics (`axp-host-notes.md` §7–§9, §15): a
//! turn starts by the maintainer's `chat/turnStarted` (user origin, sent as a request, so a
//! refusal is an error answer); the executor reserves it (one turn, a positive token ceiling)
//! and emits; after K emits it settles `complete` with reported usage. Settling starts the
//! next turn only if a message is queued, so either the maintainer starts the next turn once
//! the settle is answered (`--cycle start`, the default: only the V viewers watch the chats),
//! or the maintainer queues the next message while the turn runs and the host starts it at
//! the settle (`--cycle queue`: the executors watch their own chats, as the reference
//! satellite does, to learn the host's turn id, one more subscriber per chat).

mod procfs;
mod proto;
mod report;
mod run;

use std::net::{SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use axhost_load::parse_duration;
use clap::{Parser, ValueEnum};

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Cycle {
    /// The maintainer starts the next turn once the settle is answered.
    Start,
    /// The maintainer queues the next message during the turn; the host starts it at the
    /// settle, and the executor learns its id from its own chat subscription.
    Queue,
}

#[derive(Parser, Debug)]
#[command(
    name = "axhost-axp",
    about = "AXP exchange at scale: N leased executors streaming _axp/emit to V viewers per session"
)]
pub struct Args {
    /// host:port of the axhost to load.
    #[arg(long, default_value = "127.0.0.1:7331")]
    pub addr: String,
    /// axhost WebSocket path.
    #[arg(long, default_value = "/axp")]
    pub path: String,
    /// Bearer token of a maintainer with every session in scope (creates sessions, starts turns).
    #[arg(long, env = "AXHOST_MAINTAINER_TOKEN", hide_env_values = true)]
    pub maintainer_token: Option<String>,
    /// Bearer token of a contributor with every session in scope (the executors; the viewers
    /// use it too, reading only).
    #[arg(long, env = "AXHOST_CONTRIBUTOR_TOKEN", hide_env_values = true)]
    pub contributor_token: Option<String>,
    /// N: sessions, one executor each.
    #[arg(long, short = 'n', default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub sessions: u32,
    /// R: emits per second per executor.
    #[arg(long, short = 'r', default_value_t = 10.0)]
    pub rate: f64,
    /// V: viewers per session (each viewer connection watches up to 256 sessions' chats).
    #[arg(long, short = 'v', default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub viewers: u32,
    /// Measured window.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Unmeasured time at full load before the window.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub warmup: Duration,
    /// Actions per emit: the turn's first emit opens a markdown part (`chat/responsePart`),
    /// every other action is a `chat/delta` on it.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub batch: u32,
    /// K: emits per turn; then the executor settles and the next turn starts.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub settle_every: u32,
    /// How the next turn starts after a settle.
    #[arg(long, value_enum, default_value_t = Cycle::Start)]
    pub cycle: Cycle,
    /// Lease length asked in `_axp/claim` (3000-300000); the executor renews every third.
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(3000..=300_000))]
    pub lease_ms: u64,
    /// Registration TTL in `_axp/register` (3000-300000).
    #[arg(long, default_value_t = 30_000, value_parser = clap::value_parser!(u64).range(3000..=300_000))]
    pub ttl_ms: u64,
    /// The host's `connections_max`: the tool's connections stay within it (minus
    /// `--spare-connections`), executors sharing connections when N requires.
    #[arg(long, default_value_t = 2048)]
    pub connections_max: u32,
    /// Connections left free for anything else (an operator's client, a probe).
    #[arg(long, default_value_t = 8)]
    pub spare_connections: u32,
    /// The host's subscriptions per connection (`subscriptions_per_conn_max`).
    #[arg(long, default_value_t = 256)]
    pub subscriptions_max: u32,
    /// Emits one executor may have unanswered; a due emit waits past it (schedule lag).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub max_inflight: u32,
    /// Longest wait for any answer; longer is fatal (a lost answer, a stuck host).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub reply_timeout: Duration,
    /// After the window: how long to wait for outstanding answers and deliveries.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub drain: Duration,
    /// The host's pid, to read its RSS (`VmRSS`) and CPU time from /proc.
    #[arg(long)]
    pub host_pid: Option<u32>,
    /// Session ids are `{prefix}-{i}`.
    #[arg(long, default_value = "bench")]
    pub session_prefix: String,
    /// Threads that open connections at setup (each connection's handshake is blocking).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub connect_threads: u32,
    /// The p99 emit→subscriber latency under which a run counts as sustained.
    #[arg(long, default_value = "50ms", value_parser = parse_duration)]
    pub p99_target: Duration,
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

fn main() -> ExitCode {
    let args = Args::parse();
    let (Some(mtok), Some(ctok)) = (&args.maintainer_token, &args.contributor_token) else {
        eprintln!(
            "axhost-axp: needs --maintainer-token (AXHOST_MAINTAINER_TOKEN) and --contributor-token (AXHOST_CONTRIBUTOR_TOKEN)"
        );
        return ExitCode::from(2);
    };
    if !(args.rate > 0.0 && args.rate <= 1000.0) {
        eprintln!("axhost-axp: --rate must be in (0, 1000]");
        return ExitCode::from(2);
    }
    let addr = match resolve(&args.addr) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("axhost-axp: {e}");
            return ExitCode::from(2);
        }
    };
    match run::run(&args, addr, mtok, ctok) {
        Ok(report) => {
            println!("{}", report.human(&args));
            if args.json {
                println!("{}", report.json(&args));
            }
            if report.invariants_hold() {
                ExitCode::SUCCESS
            } else {
                eprintln!("axhost-axp: an invariant broke: {}", report.broken());
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("axhost-axp: {e}");
            ExitCode::from(1)
        }
    }
}
