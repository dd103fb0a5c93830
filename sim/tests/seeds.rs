//! The seed sweep: every seed runs both phases twice and must give the same digest; the seeds
//! `axhost_sim::axp::enabled` picks run their AXP world twice too.
//!
//! Default seeds `0..1000` (the issue asks CI for at least 1,000 per run, well under a minute); override with `AXHOST_SIM_SEEDS=start..end` (end exclusive, or
//! `start..=end`, or one seed). Seeds are shared out to two threads as they finish (the CI
//! machine has two cores; runs differ a lot in length); each seed stays fully deterministic on
//! its own thread.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};

use axhost_sim::{parse_seed_range, run, World};

const DEFAULT_SEEDS: Range<u64> = 0..1000;
const THREADS: u64 = 2;

fn seeds() -> Range<u64> {
    match std::env::var("AXHOST_SIM_SEEDS") {
        Ok(text) => parse_seed_range(&text)
            .unwrap_or_else(|| panic!("AXHOST_SIM_SEEDS={text:?} is not A..B")),
        Err(_) => DEFAULT_SEEDS,
    }
}

/// Runs `seed` twice; the failure message is a bug report: what broke, the run's fault profile
/// (drawn from the seed), and the one command that replays it.
fn check(seed: u64) -> Result<(), String> {
    let replay = format!(
        "profile: {:?}\n  replay: cargo run -p axhost-sim -- --seed {seed}",
        World::new(seed).options
    );
    if axhost_sim::axp::enabled(seed) {
        let replay = format!(
            "profile: {:?}\n  replay: cargo run --release -p axhost-sim -- --axp --seed {seed}",
            axhost_sim::axp::AxpOptions::swarm(seed)
        );
        match (axhost_sim::axp::run(seed), axhost_sim::axp::run(seed)) {
            (Ok(a), Ok(b)) if a.digest == b.digest => {}
            (Ok(a), Ok(b)) => {
                return Err(format!(
                    "seed {seed}'s AXP world is not deterministic: {} then {}\n  {replay}",
                    a.digest, b.digest
                ))
            }
            (Err(v), _) | (_, Err(v)) => return Err(format!("{v}\n  {replay}")),
        }
    }
    match (run(seed), run(seed)) {
        (Ok(a), Ok(b)) if a == b => Ok(()),
        (Ok(a), Ok(b)) => Err(format!(
            "seed {seed} is not deterministic: {a} then {b}\n  {replay}"
        )),
        (Err(v), _) | (_, Err(v)) => Err(format!("{v}\n  {replay}")),
    }
}

#[test]
fn seeds_hold_every_invariant_and_replay_exactly() {
    let range = seeds();
    let next = AtomicU64::new(range.start);
    let mut failures: Vec<(u64, String)> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut failed = Vec::new();
                    loop {
                        let seed = next.fetch_add(1, Ordering::Relaxed);
                        if seed >= range.end {
                            return failed;
                        }
                        if let Err(e) = check(seed) {
                            failed.push((seed, e));
                        }
                    }
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| {
                w.join()
                    .unwrap_or_else(|_| vec![(u64::MAX, "a seed worker panicked".into())])
            })
            .collect()
    });
    failures.sort();
    let failures: Vec<String> = failures.into_iter().map(|(_, e)| e).collect();
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        range.end - range.start,
        failures.join("\n")
    );
}

/// Seeds that once broke an invariant, each fixed with a unit test beside the code: they run in
/// every CI run, outside the default range. Their runs changed with the fixes (and with every
/// change to what the host asks of the store), so they guard the neighbourhood of each bug, not
/// its exact trace.
const FOUND: &[u64] = &[
    7336, 16233, // a reconnect reply over queue_bytes_hard
    3005, 3684, 5317, 6680, 10592, 17748,   // a closing connection's services outlived it
    694518,  // a retry's failing receipt read turned an applied dispatch into a rejection
    1357239, // (simulator) a calm client retried a refused handshake in zero simulated time
];

#[test]
fn seeds_that_found_bugs_still_pass() {
    let failures: Vec<String> = FOUND.iter().filter_map(|&seed| check(seed).err()).collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
