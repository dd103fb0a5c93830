//! `axhost-sim`: run one seed exactly, or a range of seeds with a summary.
//!
//! ```text
//! axhost-sim --seed N                 options, then `seed=N hash=<hex> steps=…`
//! axhost-sim --seeds A..B             every seed in the range (end exclusive)
//! axhost-sim --runs M [--start S]     M seeds from S (default 0)
//! ```
//! Add `--twice` to run every seed twice and compare digests, `--trace` to print every step
//! and frame to stderr, `--keep-going` to run the whole range past violations and list them.
//! Seeds that [`axhost_sim::axp::enabled`] picks (a quarter) also run the AXP world after the
//! AHP one; `--axp` runs the AXP world alone, for every seed in the range.
//! A range ends with the client-services outcomes the checker saw, the idle clientIds released
//! and the chat actions the chat limits refused, summed over its seeds. On a violation it
//! prints the violation, the options and the replay command, and exits with status 1.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Instant;

use axhost_sim::axp::{AxpOptions, AxpReport, AxpWorld};
use axhost_sim::{parse_seed_range, run_report, run_world, Options, Report, World};

struct Args {
    seeds: std::ops::Range<u64>,
    single: bool,
    twice: bool,
    trace: bool,
    keep_going: bool,
    axp_only: bool,
}

fn usage() -> ExitCode {
    eprintln!(
        "usage: axhost-sim (--seed N | --seeds A..B | --runs M [--start S]) [--twice] [--trace] [--keep-going] [--axp]"
    );
    ExitCode::from(2)
}

fn parse_args() -> Option<Args> {
    let mut args = std::env::args().skip(1);
    let (mut seeds, mut single, mut twice, mut trace) = (None, false, false, false);
    let (mut keep_going, mut axp_only) = (false, false);
    let (mut runs, mut start): (Option<u64>, u64) = (None, 0);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => {
                seeds = parse_seed_range(&args.next()?).filter(|r| r.end - r.start == 1);
                single = true;
            }
            "--seeds" => seeds = parse_seed_range(&args.next()?),
            "--runs" => runs = args.next()?.parse().ok(),
            "--start" => start = args.next()?.parse().ok()?,
            "--twice" => twice = true,
            "--trace" => trace = true,
            "--keep-going" => keep_going = true,
            "--axp" => axp_only = true,
            _ => return None,
        }
    }
    if let Some(m) = runs {
        seeds = Some(start..start.checked_add(m)?);
    }
    Some(Args {
        seeds: seeds?,
        single,
        twice,
        trace,
        keep_going,
        axp_only,
    })
}

fn options_of(seed: u64) -> Options {
    World::new(seed).options
}

fn print_line(r: &Report) {
    println!(
        "seed={} hash={} steps={} sim_ms={} outputs={} server_seq={} comparisons={} restarts={} host_closes={} \
         disconnects={} reconnects(replay/snapshot/refused)={}/{}/{} rejections={} accepted={} store_faults={} \
         frame_bytes_max={} handshake_slow_closes={} client_ids_released={} \
         chat_limit_rejections={}",
        r.seed,
        r.digest,
        r.steps,
        r.sim_ms,
        r.outputs,
        r.server_seq,
        r.comparisons,
        r.counters.restarts,
        r.counters.host_closes,
        r.counters.disconnects,
        r.reconnects.0,
        r.reconnects.1,
        r.reconnects.2,
        r.echoes.0,
        r.echoes.1,
        r.store_faults,
        r.counters.frame_bytes_max,
        r.counters.handshake_slow_closes,
        r.counters.client_ids_released,
        r.chat_limit_rejections,
    );
    let (c, d) = (&r.commits, &r.durability);
    println!(
        "  commits: transactions={} changes={} largest={} slow={} failed={} (changes {}) dropped={} lost={} crashes_in_flight={} frames_checked={} envelopes_checked={} failures_compared={}",
        c.transactions,
        c.changes,
        c.largest,
        c.slow,
        c.failed,
        c.failed_changes,
        c.dropped,
        c.lost,
        c.crashes_in_flight,
        d.frames_checked,
        d.envelopes_checked,
        d.failures_compared,
    );
    if !r.services.is_empty() {
        println!("  services: {:?}", r.services);
    }
}

fn main() -> ExitCode {
    let Some(args) = parse_args() else {
        return usage();
    };
    let started = Instant::now();
    let (mut ok, mut steps, mut released, mut chat_limits) = (0u64, 0u64, 0u64, 0u64);
    let mut commits = axhost_sim::writer::WriterStats::default();
    let mut durability = axhost_sim::durability::DurabilityStats::default();
    let mut services: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut failed: Vec<String> = Vec::new();
    let mut axp = AxpTotals::default();
    for seed in args.seeds.clone() {
        if args.axp_only || axhost_sim::axp::enabled(seed) {
            match run_axp(seed, &args) {
                Ok(r) => axp.add(&r, args.single || args.seeds.end - args.seeds.start <= 50),
                Err(v) if args.keep_going => {
                    println!("VIOLATION {v}");
                    failed.push(v);
                }
                Err(v) => {
                    println!("VIOLATION {v}");
                    println!("options: {:#?}", AxpOptions::swarm(seed));
                    println!("replay: cargo run --release -p axhost-sim -- --axp --seed {seed}");
                    return ExitCode::from(1);
                }
            }
            if args.axp_only {
                continue;
            }
        }
        if args.single {
            println!("seed={seed} options={:#?}", options_of(seed));
        }
        let mut world = World::new(seed);
        world.trace = args.trace;
        let first = run_world(world);
        let second = if args.twice {
            Some(run_report(seed))
        } else {
            None
        };
        match (first, second) {
            (Ok(a), Some(Ok(b))) if a.digest != b.digest => {
                println!(
                    "seed={seed}: NOT DETERMINISTIC: {} then {}",
                    a.digest, b.digest
                );
                println!("replay: cargo run -p axhost-sim -- --seed {seed}");
                return ExitCode::from(1);
            }
            (Ok(r), None | Some(Ok(_))) => {
                steps += r.steps;
                ok += 1;
                released += r.counters.client_ids_released;
                chat_limits += r.chat_limit_rejections;
                let c = &r.commits;
                commits.transactions += c.transactions;
                commits.changes += c.changes;
                commits.slow += c.slow;
                commits.failed += c.failed;
                commits.dropped += c.dropped;
                commits.lost += c.lost;
                commits.crashes_in_flight += c.crashes_in_flight;
                durability.frames_checked += r.durability.frames_checked;
                durability.envelopes_checked += r.durability.envelopes_checked;
                durability.failures_compared += r.durability.failures_compared;
                for (k, v) in &r.services {
                    *services.entry(k).or_default() += v;
                }
                if args.single || args.seeds.end - args.seeds.start <= 50 {
                    print_line(&r);
                }
            }
            (Err(v), _) | (_, Some(Err(v))) if args.keep_going => {
                println!("VIOLATION {v}");
                failed.push(v.to_string());
            }
            (Err(v), _) | (_, Some(Err(v))) => {
                println!("VIOLATION {v}");
                println!("options: {:#?}", options_of(seed));
                println!("replay: cargo run -p axhost-sim -- --seed {seed}");
                return ExitCode::from(1);
            }
        }
    }
    if !args.single && !args.axp_only {
        println!(
            "seeds {}..{}: {ok} passed, {steps} steps, {:.1}s",
            args.seeds.start,
            args.seeds.end,
            started.elapsed().as_secs_f64()
        );
        for (k, v) in &services {
            println!("  {v:>9}  {k}");
        }
        println!("  {released:>9}  idle clientIds released");
        println!("  {chat_limits:>9}  chat actions refused: chat limits");
        println!(
            "  {:>9}  group commits ({} changes; {} slow, {} failed, {} changes dropped after a failure, {} lost in {} crashes with commits in flight)",
            commits.transactions,
            commits.changes,
            commits.slow,
            commits.failed,
            commits.dropped,
            commits.lost,
            commits.crashes_in_flight
        );
        println!(
            "  {:>9}  frames checked against the store ({} envelopes byte for byte; host compared with the store after {} failed commits)",
            durability.frames_checked, durability.envelopes_checked, durability.failures_compared
        );
    }
    if axp.runs > 0 && !args.single {
        axp.print();
    }
    if !failed.is_empty() {
        println!("{} seeds failed:", failed.len());
        for f in &failed {
            println!("  {f}");
        }
        return ExitCode::from(1);
    }
    ExitCode::SUCCESS
}

/// Runs seed `seed`'s AXP world (twice with `--twice`, comparing digests).
fn run_axp(seed: u64, args: &Args) -> Result<AxpReport, String> {
    if args.single {
        println!("seed={seed} axp options={:#?}", AxpOptions::swarm(seed));
    }
    let mut world = AxpWorld::new(seed);
    world.trace = args.trace;
    let first = axhost_sim::axp::run_world(world).map_err(|v| v.to_string())?;
    if args.twice {
        let second = axhost_sim::axp::run(seed).map_err(|v| v.to_string())?;
        if second.digest != first.digest {
            return Err(format!(
                "seed={seed}: the AXP world is NOT DETERMINISTIC: {} then {}",
                first.digest, second.digest
            ));
        }
    }
    Ok(first)
}

/// What the AXP worlds of a range did, summed.
#[derive(Default)]
struct AxpTotals {
    runs: u64,
    steps: u64,
    restarts: u64,
    cuts: u64,
    stalls: u64,
    requests: (u64, u64, u64),
    states: u64,
    stale: u64,
    claims: u64,
    replays: u64,
    settlements: u64,
    checkpoints: u64,
    compactions: (u64, u64),
    reviews: (u64, u64),
    /// Lessons proposed and reviewed, searches and the lessons they listed, memory events.
    memory: (u64, u64, u64, u64, u64),
    verifications: u64,
    refusals: BTreeMap<i64, u64>,
}

impl AxpTotals {
    fn add(&mut self, r: &AxpReport, print: bool) {
        if print {
            println!(
                "axp seed={} hash={} steps={} sim_ms={} restarts={} cuts={} requests={}/{}/{} oracle={:?}",
                r.seed, r.digest, r.steps, r.sim_ms, r.restarts, r.cuts, r.requests.0,
                r.requests.1, r.requests.2, r.oracle
            );
        }
        self.runs += 1;
        self.steps += r.steps;
        self.restarts += r.restarts;
        self.cuts += r.cuts;
        self.stalls += r.stalls;
        self.requests.0 += r.requests.0;
        self.requests.1 += r.requests.1;
        self.requests.2 += r.requests.2;
        let o = &r.oracle;
        self.states += o.states_checked;
        self.stale += o.stale_fenced;
        self.claims += o.claims;
        self.replays += o.replays;
        self.settlements += o.settlements;
        self.checkpoints += o.checkpoints;
        self.compactions.0 += o.compactions.0;
        self.compactions.1 += o.compactions.1;
        self.reviews.0 += o.reviews.0;
        self.reviews.1 += o.reviews.1;
        let m = &o.memory;
        self.memory.0 += m.proposals;
        self.memory.1 += m.reviews;
        self.memory.2 += m.searches.0;
        self.memory.3 += m.searches.1;
        self.memory.4 += m.events;
        self.verifications += o.verifications;
        for (code, n) in &o.refusals {
            *self.refusals.entry(*code).or_default() += n;
        }
    }

    fn print(&self) {
        println!(
            "AXP worlds: {} passed, {} steps, {} restarts, {} cuts, {} stalls",
            self.runs, self.steps, self.restarts, self.cuts, self.stalls
        );
        println!(
            "  {:>9}  requests ({} sent again after a cut, {} duplicated on purpose)",
            self.requests.0, self.requests.1, self.requests.2
        );
        println!("  {:>9}  host states checked", self.states);
        println!("  {:>9}  claims won", self.claims);
        println!("  {:>9}  settlements revealed", self.settlements);
        println!("  {:>9}  checkpoints recorded", self.checkpoints);
        println!(
            "  {:>9}  compactions proposed ({} accepted)",
            self.compactions.0, self.compactions.1
        );
        println!(
            "  {:>9}  reviews submitted ({} approved)",
            self.reviews.0, self.reviews.1
        );
        println!("  {:>9}  verifications recorded", self.verifications);
        println!(
            "  {:>9}  lessons proposed, {} reviewed, {} searches listing {}, {} memory events",
            self.memory.0, self.memory.1, self.memory.2, self.memory.3, self.memory.4
        );
        println!(
            "  {:>9}  fenced commands with a stale epoch (changed nothing)",
            self.stale
        );
        println!(
            "  {:>9}  operations answered again (same result)",
            self.replays
        );
        println!("  refusals by code: {:?}", self.refusals);
    }
}
