//! A run's configuration: drawn from its seed for the sweep ([`AxpOptions::swarm`]) or fixed
//! and fault-free for named scenarios ([`AxpOptions::calm`]).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::axp::actors::Temper;
use crate::options::Ratio;
use crate::writer::CommitProfile;

/// A run's configuration, drawn from its seed.
#[derive(Clone, Debug)]
pub struct AxpOptions {
    /// The seed.
    pub seed: u64,
    /// Executors, maintainers, observers.
    pub actors: (usize, usize, usize),
    /// Executors share this many contributor principals.
    pub contributors: u32,
    /// Session ids the actors work with.
    pub sessions: Vec<String>,
    /// Simulated length of the safety phase.
    pub duration_ms: u64,
    /// Longest pause between an actor's turns.
    pub think_ms_max: u64,
    /// Link latency range.
    pub latency_ms: (u64, u64),
    /// Per actor turn: the connection is cut.
    pub cut: Ratio,
    /// Per actor turn: the actor stalls (half-open: it neither reads nor sends) for up to
    /// `stall_ms_max`, long enough for its lease to run out.
    pub stall: Ratio,
    /// Longest stall.
    pub stall_ms_max: u64,
    /// A restart every this long on average (clean or killed).
    pub restart_interval_ms: Option<u64>,
    /// Of restarts, the share that kill the process with commits in flight.
    pub kills: Ratio,
    /// Store refusals (failed group commits).
    pub store_fault: Option<Ratio>,
    /// How the disk commits.
    pub commits: CommitProfile,
    /// Executors' behaviour.
    pub temper: Temper,
}

impl AxpOptions {
    /// Everything from the seed (swarm testing: some runs calm, some hostile).
    pub fn swarm(seed: u64) -> AxpOptions {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xa4e0_0000_5eed_0002);
        let executors = rng.random_range(1..=5);
        let sessions = (0..rng.random_range(1..=3))
            .map(|i| format!("a{i}"))
            .collect();
        let latency_min = rng.random_range(0..=5);
        let latency_ms = (
            latency_min,
            latency_min + [0, 2, 10, 40][rng.random_range(0..4)],
        );
        let store_fault = Ratio::new(1, 4)
            .hit(&mut rng)
            .then(|| Ratio::new(1, rng.random_range(30..=200)));
        let latency_ms_min = rng.random_range(0..=2);
        let commits = CommitProfile {
            latency_ms_min,
            latency_ms_max: latency_ms_min + [0, 1, 5, 30][rng.random_range(0..4)],
            slow: if Ratio::new(1, 3).hit(&mut rng) {
                Ratio::new(1, 20)
            } else {
                Ratio::NEVER
            },
            slow_ms_max: rng.random_range(100..=4_000),
            report_ms_max: [0, 1, 5][rng.random_range(0..3)],
            gather_ms_max: [0, 2, 10][rng.random_range(0..3)],
        };
        AxpOptions {
            seed,
            actors: (executors, rng.random_range(1..=2), rng.random_range(1..=2)),
            contributors: rng.random_range(1..=executors as u32),
            sessions,
            duration_ms: rng.random_range(15_000..=40_000),
            think_ms_max: [100, 300, 800][rng.random_range(0..3)],
            latency_ms,
            cut: if Ratio::new(2, 3).hit(&mut rng) {
                Ratio::new(1, rng.random_range(30..=300))
            } else {
                Ratio::NEVER
            },
            restart_interval_ms: Ratio::new(1, 2)
                .hit(&mut rng)
                .then(|| rng.random_range(5_000..=30_000)),
            stall: if Ratio::new(1, 3).hit(&mut rng) {
                Ratio::new(1, rng.random_range(50..=400))
            } else {
                Ratio::NEVER
            },
            stall_ms_max: rng.random_range(1_000..=15_000),
            kills: Ratio::new(rng.random_range(0..=2), 2),
            store_fault,
            commits,
            temper: Temper {
                late_renewal_in: [0, 4, 20][rng.random_range(0..3)],
                overspend_in: [0, 5, 30][rng.random_range(0..3)],
                closes: Ratio::new(1, 4).hit(&mut rng),
            },
        }
    }
}

impl AxpOptions {
    /// A fixed, fault-free run for named scenarios, which switch on the faults they are about:
    /// two executors of two contributors, one maintainer, one observer, one session, 20 s.
    pub fn calm(seed: u64) -> AxpOptions {
        AxpOptions {
            seed,
            actors: (2, 1, 1),
            contributors: 2,
            sessions: vec!["a0".into()],
            duration_ms: 20_000,
            think_ms_max: 200,
            latency_ms: (1, 5),
            cut: Ratio::NEVER,
            stall: Ratio::NEVER,
            stall_ms_max: 0,
            restart_interval_ms: None,
            kills: Ratio::NEVER,
            store_fault: None,
            commits: CommitProfile::INSTANT,
            temper: Temper {
                late_renewal_in: 0,
                overspend_in: 0,
                closes: false,
            },
        }
    }
}
