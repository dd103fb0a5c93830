//! # axhost-sim: the deterministic simulator for the axhost core
//!
//! One seed drives everything: a real [`axhost_core::Host`] over the core's own `MemStore`
//! (behind a fault switch), a seeded network of ordered per-connection links, and up to six
//! seeded clients that speak AHP 0.9.0 and mirror every channel they subscribe to with the
//! official `ahp` reducers (and the client-services catalog with a strict reducer of its own).
//! Clients also use client services: they register, update and unregister services, call them
//! (ids `1..=5` on every connection, with and without `timeoutMs`, cancelling, leaving with
//! calls pending), notify them with sequenced payloads, answer as owners (late, twice, never,
//! on the wrong connection) and forge answers. Time is simulated and jumps to the next event.
//! The world drains the host after every call into it, so every output has exactly one cause;
//! the [`Checker`] checks each against a reference model of client services and, after every
//! step, compares what clients hold with what the host holds and enforces the stream rules of
//! the protocol; every output is hashed into a trace digest, so a seed replays exactly:
//!
//! ```text
//! cargo run -p axhost-sim -- --seed 42          # one seed: options, then seed=42 hash=… steps=…
//! cargo run -p axhost-sim -- --seeds 0..1000    # a range, with a summary
//! cargo run -p axhost-sim -- --seeds 0..1000 --keep-going   # list every failing seed
//! AXHOST_SIM_SEEDS=0..2000 cargo test -p axhost-sim --test seeds
//! ```
//!
//! ```
//! // Same seed, same outcome: the same digest, or the same violation at the same step.
//! assert_eq!(axhost_sim::run(3), axhost_sim::run(3));
//! ```
//!
//! ## Shape (TigerBeetle's VOPR, FoundationDB's simulation)
//! - [`Options::swarm`] draws the whole run from the seed: client count, latency, disconnect,
//!   clog, restart and store-fault rates, the disk's commit latency and faults, shrunken [`axhost_core::Limits`] (a replay budget
//!   of 0–16 so reconnects take the snapshot path, a small outbound queue so slow consumers are
//!   closed, short relay timeouts, small in-flight and payload limits), principals shared by
//!   several clients, trust groups, and how service owners answer. The options are printed
//!   first.
//! - The *safety* phase runs `steps_max` steps with faults on; the *liveness* phase
//!   ([`World::settle`]) heals everything and requires convergence within a budget; then every
//!   client leaves ([`World::depart`]) and the host's tables must drain to nothing.
//! - A violation names the seed, the step and the simulated time, and the CLI prints the
//!   command that replays it.
//!
//! ## Modules
//! - [`options`]: the swarm and integer probabilities.
//! - [`net`]: links, latency, clogs, the driver's byte ledger.
//! - [`store`]: `MemStore` with buggify-style fault injection.
//! - [`writer`]: the simulated writer of the asynchronous write path: group commits later, in
//!   order, with seeded latency, slow and failed transactions, and crashes with commits in
//!   flight; [`durability`]: the oracles that check every frame against the store (nothing
//!   revealed before it is durable, a failed batch leaves no trace, a restart never goes below
//!   what was revealed).
//! - [`client`], [`script`], [`stream`], [`replica`]: the simulated clients, what they do,
//!   what they check as frames arrive, and what they mirror.
//! - [`roles`]: their client-services roles (caller, notifier, owner, forger).
//! - [`checker`]: invariants and the digest; [`services`]: the reference model of client
//!   services it checks every host call against.
//! - [`world`]: the event loop, restarts and the two phases.
//! - [`axp`]: the AXP world (executors, maintainers, observers under leases and budgets) with
//!   its own oracles, run by a quarter of all seeds after their AHP world.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod axp;
pub mod checker;
pub mod client;
pub mod due;
pub mod durability;
pub mod net;
pub mod options;
pub mod replica;
pub mod roles;
pub mod script;
pub mod services;
pub mod store;
pub mod stream;
pub mod world;
pub mod writer;

pub use checker::{Checker, Digest, Violation};
pub use options::{Options, Ratio};
pub use world::{Report, World};

/// Runs one seed through every phase (safety, liveness, departure) and returns its trace
/// digest.
pub fn run(seed: u64) -> Result<Digest, Violation> {
    run_report(seed).map(|r| r.digest)
}

/// Runs one seed through every phase and returns the full report.
pub fn run_report(seed: u64) -> Result<Report, Violation> {
    run_world(World::new(seed))
}

/// Runs a prepared world through every phase (the CLI uses it to turn on tracing). A panic in
/// the core (a broken internal invariant) becomes a violation naming the seed and the step.
pub fn run_world(mut world: World) -> Result<Report, Violation> {
    tracing::info!(seed = world.options.seed, options = ?world.options, "sim start");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        world.run_safety()?;
        world.settle()?;
        world.depart()?;
        Ok(world.report())
    }));
    outcome.unwrap_or_else(|payload| {
        Err(Violation {
            seed: world.options.seed,
            step: world.steps,
            at_ms: world.now_ms(),
            message: format!("panic: {}", panic_message(payload.as_ref())),
        })
    })
}

/// The message a caught panic carried.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
        .unwrap_or_else(|| "unknown panic".into())
}

/// Parses a seed range: `A..B` (end exclusive), `A..=B`, or a single `N`.
pub fn parse_seed_range(text: &str) -> Option<std::ops::Range<u64>> {
    let text = text.trim();
    if let Some((a, b)) = text.split_once("..=") {
        let (a, b) = (a.trim().parse().ok()?, b.trim().parse::<u64>().ok()?);
        return (a <= b).then(|| a..b + 1);
    }
    if let Some((a, b)) = text.split_once("..") {
        let (a, b) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
        return (a <= b).then_some(a..b);
    }
    let n: u64 = text.parse().ok()?;
    Some(n..n + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_ranges_parse() {
        assert_eq!(parse_seed_range("0..200"), Some(0..200));
        assert_eq!(parse_seed_range("5..=7"), Some(5..8));
        assert_eq!(parse_seed_range("9"), Some(9..10));
        assert_eq!(parse_seed_range("7..5"), None);
        assert_eq!(parse_seed_range("x"), None);
    }
}
