//! The AXP simulation: executors, maintainers and observers running turns under leases and
//! budgets against the real core, over the same seeded network, writer and store as the AHP
//! world, with oracles for what the exchange promises.
//!
//! A seed runs the AXP world when [`enabled`] says so (a quarter of all seeds, so CI's sweep
//! covers thousands of AXP histories without doubling its time); `axhost-sim --seed N` replays
//! it, and `axhost-sim --axp --seeds A..B` runs only AXP worlds.
//!
//! - [`world`]: the event loop, faults (cut connections, slow and failed group commits, clean
//!   and killed restarts) and the two phases; [`options`]: what a seed draws for it.
//! - [`actors`]: the roles, one file each (`executor.rs`, `maintainer.rs`, `observer.rs`,
//!   `verifier.rs`), the memory moves they share (`memory.rs`) and review signing
//!   (`signing.rs`), around the shared connection and frame handling in `actors/mod.rs`.
//! - [`oracle`]: fencing, one winner per epoch, money, exactly-once, roles, shape; and
//!   [`memory_oracle`]: lesson revisions and who may see a lesson's evidence.
//! - [`replica`]: the observers' reducer, written from the specification.
//!
//! The AHP world's rule "after a failed commit the host equals a host built from the store" is
//! not applied to the exchange: a host built from the store orphans every lease at start (its
//! own change), so the two differ by design; the oracle instead checks that a rollback keeps
//! every revealed epoch and settlement.

pub mod actors;
pub mod memory_oracle;
pub mod options;
pub mod oracle;
pub mod replica;
pub mod world;

pub use options::AxpOptions;
pub use world::{AxpReport, AxpWorld};

use crate::checker::Violation;

/// Whether seed `seed` also runs the AXP world.
pub fn enabled(seed: u64) -> bool {
    seed.is_multiple_of(4)
}

/// Runs one AXP world through both phases.
pub fn run(seed: u64) -> Result<AxpReport, Violation> {
    run_world(AxpWorld::new(seed))
}

/// Runs a prepared AXP world through both phases; a panic in the core becomes a violation.
pub fn run_world(mut world: AxpWorld) -> Result<AxpReport, Violation> {
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        world.run_safety()?;
        world.settle()?;
        Ok(world.report_now())
    }));
    outcome.unwrap_or_else(|payload| {
        Err(Violation {
            seed: world.options.seed,
            step: world.steps,
            at_ms: 0,
            message: format!("axp: panic: {}", crate::panic_message(payload.as_ref())),
        })
    })
}
