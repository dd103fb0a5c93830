//! The whole configuration of one run, drawn from its seed (swarm testing).
//!
//! Like TigerBeetle's `options_swarm`, the seed picks the fault mix *and* the limits: one run has
//! six clients on a fast network, the next one client behind a clogged link with a replay budget
//! of zero, the next three clients of one principal calling services with 200 ms timeouts that
//! answer slowly, twice or never. Runs differ in kind, not only in order, so rare paths (snapshot reconnect, slow
//! consumer close, commit failure) run often. Probabilities are integer [`Ratio`]s so a seed means
//! the same thing on every platform.

use std::fmt;

use axhost_core::Limits;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::writer::CommitProfile;

/// An integer probability: `numerator` in `denominator`.
#[derive(Copy, Clone, PartialEq, Eq)]
pub struct Ratio {
    /// Chances of a hit.
    pub numerator: u32,
    /// Out of this many; never zero.
    pub denominator: u32,
}

impl Ratio {
    /// Never hits.
    pub const NEVER: Ratio = Ratio {
        numerator: 0,
        denominator: 1,
    };

    /// `numerator` in `denominator`.
    pub const fn new(numerator: u32, denominator: u32) -> Ratio {
        assert!(denominator > 0);
        assert!(numerator <= denominator);
        Ratio {
            numerator,
            denominator,
        }
    }

    /// Rolls once. A `NEVER` ratio draws nothing, so turning a fault off does not shift the
    /// generator's sequence for everything else any more than necessary.
    pub fn hit(self, rng: &mut ChaCha8Rng) -> bool {
        self.numerator > 0 && rng.random_range(0..self.denominator) < self.numerator
    }
}

impl fmt::Debug for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.numerator, self.denominator)
    }
}

/// How the wall clock handed to the host relates to the monotonic one. The core keeps a
/// high-water mark of wall time, so a clock that steps back must never make timestamps go back.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WallDrift {
    /// Wall = epoch + monotonic.
    None,
    /// Wall gains (or loses, when negative) this many parts per million.
    Linear {
        /// Parts per million, positive or negative.
        ppm: i64,
    },
    /// Wall jumps by up to this many milliseconds, forwards or backwards, now and then.
    Jumps {
        /// Largest jump in either direction.
        ms_max: u64,
    },
}

/// Relative weights of what a connected, initialized client does on its turn.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct ActionMix {
    /// `subscribe` to some channel (existing or not, allowed or not).
    pub subscribe: u32,
    /// `unsubscribe`, as a request or a notification.
    pub unsubscribe: u32,
    /// `createSession` from a small id pool, so duplicates happen.
    pub create_session: u32,
    /// `listSessions`, sometimes paging.
    pub list_sessions: u32,
    /// `dispatchAction` with valid, invalid, server-only and misdirected actions.
    pub dispatch: u32,
    /// `ping`.
    pub ping: u32,
    /// Malformed frames and unknown methods.
    pub garbage: u32,
    /// Client services: register, update, unregister, watch the catalog.
    pub services: u32,
    /// `clientService/request` to a visible, own, stale, invisible or made-up service id.
    pub call: u32,
    /// `clientService/notify`, sequenced, to the same kinds of targets, sometimes malformed.
    pub notify: u32,
    /// `$/cancelRequest` for an own outstanding call (or for nothing).
    pub cancel: u32,
    /// A forged response: a host request id heard from another client, or a made-up one.
    pub forge: u32,
}

impl ActionMix {
    /// Sum of all weights.
    pub fn total(&self) -> u32 {
        self.subscribe
            + self.unsubscribe
            + self.create_session
            + self.list_sessions
            + self.dispatch
            + self.ping
            + self.garbage
            + self.services
            + self.call
            + self.notify
            + self.cancel
            + self.forge
    }
}

/// How simulated service owners answer `clientService/handleRequest` (manual owners in scripted
/// tests answer only when told to).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Owners {
    /// Per request: never answered, so the caller times out (or leaves first).
    pub never: Ratio,
    /// Per request: answered twice; the host must drop the second answer.
    pub twice: Ratio,
    /// Per answer: a JSON-RPC error (sometimes malformed, oversized or long) instead of a result.
    pub error: Ratio,
    /// Longest delay of an ordinary answer.
    pub delay_ms_max: u64,
    /// Per request: answered slowly, up to `slow_ms_max`, often after its deadline (late).
    pub slow: Ratio,
    /// Longest delay of a slow answer.
    pub slow_ms_max: u64,
    /// Per answer to a request the host has since cancelled: sent anyway (late).
    pub answer_cancelled: Ratio,
    /// Per answer due after its connection closed: sent on the owner's next connection of the
    /// same host process anyway (foreign there: that connection was never sent the request).
    pub stray: Ratio,
}

impl Owners {
    /// Owners that answer everything once, at once (scripted tests).
    pub const PROMPT: Owners = Owners {
        never: Ratio::NEVER,
        twice: Ratio::NEVER,
        error: Ratio::NEVER,
        delay_ms_max: 0,
        slow: Ratio::NEVER,
        slow_ms_max: 0,
        answer_cancelled: Ratio::NEVER,
        stray: Ratio::NEVER,
    };
}

/// Everything a run depends on besides the seed's sub-generators.
#[derive(Clone, Debug)]
pub struct Options {
    /// The seed these options were drawn from.
    pub seed: u64,
    /// Number of simulated clients (1–6).
    pub clients: u32,
    /// Steps of the safety phase (faults on) before the liveness phase.
    pub steps_max: u32,
    /// One-way latency range of every link, in milliseconds.
    pub latency_ms_min: u64,
    /// See `latency_ms_min`.
    pub latency_ms_max: u64,
    /// Largest pause between two turns of one client.
    pub think_ms_max: u64,
    /// Per turn: the client drops its connection.
    pub disconnect: Ratio,
    /// Per disconnect: abrupt (unsent messages lost) rather than graceful.
    pub disconnect_abrupt: Ratio,
    /// Per client disconnect: the client stays away long (a laptop asleep) before coming back.
    pub absence: Ratio,
    /// Longest absence.
    pub absence_ms_max: u64,
    /// Per connect: the client opens the socket and says nothing (handshake timeout).
    pub silent_connect: Ratio,
    /// Per turn: the client stops reading for a while (slow consumer).
    pub clog: Ratio,
    /// Longest clog.
    pub clog_ms_max: u64,
    /// Per delivered frame: the driver reports `Flushed` late.
    pub flush_delay: Ratio,
    /// Longest flush report delay.
    pub flush_delay_ms_max: u64,
    /// Mean time between host restarts, if restarts happen at all.
    pub restart_interval_ms: Option<u64>,
    /// Per store call: the store refuses it (buggify: activated for some runs only). A refused
    /// commit fails the writer's whole transaction (a failed group commit).
    pub store_fault: Option<Ratio>,
    /// How the simulated disk commits: latency, slow transactions, report delay, gathering.
    pub commits: CommitProfile,
    /// Per writer step with a transaction in flight: the host crashes within the next few
    /// milliseconds (activated for some runs only), so crashes land between a transaction's
    /// start, its durability and its report.
    pub crash_in_flight: Ratio,
    /// Per scheduled restart: the process is killed (changes in flight are lost) rather than
    /// stopped cleanly (the writer finishes first).
    pub restart_kills: Ratio,
    /// Wall clock behaviour.
    pub wall_drift: WallDrift,
    /// The host's limits, sometimes shrunk so limit paths run.
    pub limits: Limits,
    /// What clients do.
    pub mix: ActionMix,
    /// Host trust groups (principal ids) for client-service visibility.
    pub trust_groups: Vec<Vec<String>>,
    /// Distinct principal ids: client `i` authenticates as `p{i % principals}`, so some runs
    /// have several connections of one principal (which always see each other's services).
    pub principals: u32,
    /// How service owners answer.
    pub owners: Owners,
    /// Per client: the principal is an observer.
    pub observer: Ratio,
    /// Per client: the principal sees only some sessions.
    pub scoped: Ratio,
    /// Session ids come from `s0..s{session_pool}`.
    pub session_pool: u32,
    /// Whether clients act on their own. Scripted scenario tests turn this off and drive
    /// clients explicitly.
    pub autonomous: bool,
    /// Whether clients take a fresh clientId for every connection, as the AXP executor loop
    /// does; with a small `limits.idle_client_ids_per_principal`, the host releases the old
    /// bindings that never dispatched.
    pub fresh_client_ids: bool,
}

impl Options {
    /// Draws a whole run's configuration from `rng` (the root generator, first thing drawn).
    pub fn swarm(seed: u64, rng: &mut ChaCha8Rng) -> Options {
        let clients = rng.random_range(1..=6);
        let latency_ms_min = rng.random_range(0..=5);
        let spread = [0, 5, 20, 80, 200][rng.random_range(0..5)];
        let latency_ms_max = latency_ms_min + spread;
        let mut limits = Limits::default();
        if Ratio::new(1, 4).hit(rng) {
            limits.connections_max = rng.random_range(1..=clients + 2);
        }
        if Ratio::new(1, 3).hit(rng) {
            limits.subscriptions_per_conn_max = rng.random_range(1..=4);
        }
        if Ratio::new(1, 4).hit(rng) {
            limits.message_bytes_max = rng.random_range(1024..=4096);
        }
        if Ratio::new(1, 3).hit(rng) {
            // Long enough for a handshake round trip on this network, short enough to fire.
            let floor_ms = 3 * latency_ms_max + 50;
            limits.handshake_timeout_ms = floor_ms + rng.random_range(0..=1500);
        }
        if Ratio::new(1, 3).hit(rng) {
            let floor = u64::from(limits.message_bytes_max).max(4096);
            limits.queue_bytes_hard = rng.random_range(floor..=floor * 4);
            // Client-service traffic is dropped above the soft limit, which sits below the hard.
            limits.queue_bytes_soft = limits.queue_bytes_hard / 2;
        }
        if Ratio::new(1, 2).hit(rng) {
            limits.replay_events_max = rng.random_range(0..=16);
        }
        if Ratio::new(1, 4).hit(rng) {
            limits.pending_messages_max = rng.random_range(1..=4);
        }
        // Client services: short timeouts so they fire in simulated seconds (the default of 30 s
        // fires too, in the other half), small in-flight limits, small payload and error data.
        if Ratio::new(1, 2).hit(rng) {
            limits.relay_timeout_ms = rng.random_range(100..=5000);
            limits.relay_timeout_ms_max =
                rng.random_range(limits.relay_timeout_ms..=limits.relay_timeout_ms * 3);
        }
        if Ratio::new(1, 4).hit(rng) {
            limits.relays_per_conn_max = rng.random_range(1..=4);
        }
        if Ratio::new(1, 4).hit(rng) {
            limits.relays_per_service_max = rng.random_range(1..=6);
        }
        if Ratio::new(1, 5).hit(rng) {
            limits.service_payload_bytes_max = rng.random_range(256..=4096);
        }
        if Ratio::new(1, 5).hit(rng) {
            limits.service_error_data_bytes_max = rng.random_range(8..=512);
        }
        if Ratio::new(1, 6).hit(rng) {
            limits.services_per_conn_max = rng.random_range(1..=3);
        }
        let wall_drift = match rng.random_range(0..3) {
            0 => WallDrift::None,
            1 => WallDrift::Linear {
                ppm: rng.random_range(-200_000..=200_000),
            },
            _ => WallDrift::Jumps {
                ms_max: rng.random_range(1..=60_000),
            },
        };
        let mix = ActionMix {
            subscribe: rng.random_range(1..=10),
            unsubscribe: rng.random_range(0..=5),
            create_session: rng.random_range(1..=6),
            list_sessions: rng.random_range(0..=3),
            dispatch: rng.random_range(4..=24),
            ping: rng.random_range(0..=2),
            garbage: rng.random_range(0..=3),
            services: rng.random_range(0..=6),
            call: rng.random_range(0..=12),
            notify: rng.random_range(0..=12),
            cancel: rng.random_range(0..=3),
            forge: rng.random_range(0..=2),
        };
        let mut mix = mix;
        if mix.call + mix.notify > 0 {
            // Someone must register services for calls and notifications to reach any.
            mix.services = mix.services.max(1 + (mix.call + mix.notify) / 6);
        }
        let principals = if Ratio::new(1, 4).hit(rng) {
            rng.random_range(1..=clients)
        } else {
            clients
        };
        // Options added later draw from their own stream, so every earlier seed keeps the rest
        // of its profile and its run unless the new option changes what happens.
        let mut later = ChaCha8Rng::seed_from_u64(seed ^ 0x1d1e_c11e_4715_0000);
        let fresh_client_ids = Ratio::new(1, 3).hit(&mut later);
        if fresh_client_ids || Ratio::new(1, 4).hit(&mut later) {
            // A principal's clients hold one idle clientId each at most, plus those of
            // connections whose close the host has not heard yet: a quota just above the first
            // releases bindings as fresh ids arrive, and refuses a handshake only until such a
            // close arrives, never for good.
            let per_principal = clients.div_ceil(principals.max(1));
            limits.idle_client_ids_per_principal = per_principal + later.random_range(1..=2);
        }
        // Principals in one trust group see (and may call) each other's services; a group may
        // name principals no client uses.
        let mut trust_groups = Vec::new();
        for _ in 0..rng.random_range(0..=2) {
            let group: Vec<String> = (0..=principals)
                .filter(|_| Ratio::new(2, 3).hit(rng))
                .map(|i| format!("p{i}"))
                .collect();
            if group.len() >= 2 {
                trust_groups.push(group);
            }
        }
        let owners = Owners {
            never: Ratio::new(rng.random_range(0..=2), 20),
            twice: Ratio::new(rng.random_range(0..=2), 20),
            error: Ratio::new(rng.random_range(0..=6), 20),
            delay_ms_max: [0, 20, 200, 1000][rng.random_range(0..4)],
            slow: Ratio::new(rng.random_range(0..=3), 20),
            slow_ms_max: rng.random_range(1000..=10_000),
            answer_cancelled: Ratio::new(rng.random_range(0..=2), 2),
            stray: Ratio::new(rng.random_range(0..=1), 2),
        };
        let mut options = Options {
            seed,
            clients,
            steps_max: rng.random_range(300..=2000),
            latency_ms_min,
            latency_ms_max,
            think_ms_max: rng.random_range(10..=300),
            disconnect: ratio_or_never(rng, 3, 40),
            disconnect_abrupt: Ratio::new(rng.random_range(0..=2), 2),
            absence: ratio_or_never(rng, 1, 4),
            absence_ms_max: rng.random_range(1000..=30_000),
            silent_connect: ratio_or_never(rng, 1, 10),
            clog: ratio_or_never(rng, 3, 40),
            clog_ms_max: rng.random_range(100..=5000),
            flush_delay: ratio_or_never(rng, 1, 5),
            flush_delay_ms_max: rng.random_range(10..=2000),
            restart_interval_ms: Ratio::new(1, 2)
                .hit(rng)
                .then(|| rng.random_range(300..=6000)),
            store_fault: Ratio::new(1, 4)
                .hit(rng)
                .then(|| Ratio::new(rng.random_range(1..=3), 20)),
            commits: CommitProfile::INSTANT,
            crash_in_flight: Ratio::NEVER,
            restart_kills: Ratio::NEVER,
            wall_drift,
            limits,
            mix,
            trust_groups,
            principals,
            owners,
            observer: Ratio::new(rng.random_range(0..=1), 4),
            scoped: Ratio::new(rng.random_range(0..=1), 4),
            session_pool: rng.random_range(1..=5),
            autonomous: true,
            fresh_client_ids,
        };
        // A session limit at or below the pool, so some creates are refused for good.
        if Ratio::new(1, 4).hit(&mut later) {
            options.limits.sessions_max = later.random_range(1..=options.session_pool);
        }
        // Chat limits a few turns deep, so some chats fill and some messages wait: per chat in
        // a quarter of the seeds, for all chats together in an eighth.
        if Ratio::new(1, 4).hit(&mut later) {
            options.limits.chat_bytes_max = later.random_range(1024..=4096);
        }
        if Ratio::new(1, 8).hit(&mut later) {
            let total = later.random_range(1024..=4096 * u64::from(options.session_pool));
            options.limits.chat_bytes_total_max = total;
            options.limits.chat_bytes_max = options.limits.chat_bytes_max.min(total);
        }
        options.draw_commits(seed);
        // A narrow write path in a quarter of the seeds: a handful of changes in flight fill
        // it, so the host's backpressure (input paused until the writer catches up, timers
        // retrying for room) runs under every invariant. From a stream of its own, so every
        // other seed keeps its run.
        let mut narrow = ChaCha8Rng::seed_from_u64(seed ^ 0xbac4_9e55_0000_0000);
        if Ratio::new(1, 4).hit(&mut narrow) {
            options.limits.in_flight_changes_max = narrow.random_range(1..=4);
        }
        options
    }

    /// The disk's behaviour, from a stream of its own (so the rest of every seed's profile
    /// stays what it was before the write path became asynchronous).
    fn draw_commits(&mut self, seed: u64) {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xd15c_c0a1_e5ce_0000);
        let latency_ms_min = rng.random_range(0..=2);
        let latency_ms_max = latency_ms_min + [0, 1, 5, 20, 60][rng.random_range(0..5)];
        let slow = Ratio::new(1, 3).hit(&mut rng);
        self.commits = CommitProfile {
            latency_ms_min,
            latency_ms_max,
            slow: if slow {
                Ratio::new(rng.random_range(1..=3), 20)
            } else {
                Ratio::NEVER
            },
            slow_ms_max: rng.random_range(100..=3000),
            report_ms_max: [0, 0, 1, 5][rng.random_range(0..4)],
            gather_ms_max: [0, 0, 2, 10][rng.random_range(0..4)],
        };
        self.crash_in_flight = if Ratio::new(1, 4).hit(&mut rng) {
            Ratio::new(1, rng.random_range(20..=120))
        } else {
            Ratio::NEVER
        };
        self.restart_kills = Ratio::new(rng.random_range(0..=2), 2);
    }

    /// A calm, fault-free configuration for scripted scenario tests: fixed latency, no random
    /// faults, clients act only when told to. Tests tweak fields from here.
    pub fn scripted(seed: u64, clients: u32) -> Options {
        Options {
            seed,
            clients,
            steps_max: 0,
            latency_ms_min: 1,
            latency_ms_max: 3,
            think_ms_max: 50,
            disconnect: Ratio::NEVER,
            disconnect_abrupt: Ratio::NEVER,
            absence: Ratio::NEVER,
            absence_ms_max: 0,
            silent_connect: Ratio::NEVER,
            clog: Ratio::NEVER,
            clog_ms_max: 0,
            flush_delay: Ratio::NEVER,
            flush_delay_ms_max: 0,
            restart_interval_ms: None,
            store_fault: None,
            // Commits complete later, as in production; scenarios that need another disk say so.
            commits: CommitProfile {
                latency_ms_min: 1,
                latency_ms_max: 3,
                ..CommitProfile::INSTANT
            },
            crash_in_flight: Ratio::NEVER,
            restart_kills: Ratio::NEVER,
            wall_drift: WallDrift::None,
            limits: Limits::default(),
            mix: ActionMix {
                subscribe: 1,
                unsubscribe: 1,
                create_session: 1,
                list_sessions: 1,
                dispatch: 1,
                ping: 1,
                garbage: 1,
                services: 1,
                call: 1,
                notify: 1,
                cancel: 1,
                forge: 1,
            },
            trust_groups: Vec::new(),
            principals: clients,
            owners: Owners::PROMPT,
            observer: Ratio::NEVER,
            scoped: Ratio::NEVER,
            session_pool: 3,
            autonomous: false,
            fresh_client_ids: false,
        }
    }

    /// The session ids of the pool, in order.
    pub fn session_ids(&self) -> Vec<String> {
        (0..self.session_pool).map(|i| format!("s{i}")).collect()
    }
}

/// `numerator_max / denominator` with a random numerator, or never (a third of the time).
fn ratio_or_never(rng: &mut ChaCha8Rng, numerator_max: u32, denominator: u32) -> Ratio {
    if Ratio::new(1, 3).hit(rng) {
        Ratio::NEVER
    } else {
        Ratio::new(rng.random_range(1..=numerator_max), denominator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn swarm_options_are_valid_limits_and_sane_ranges() {
        for seed in 0..500 {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let o = Options::swarm(seed, &mut rng);
            assert_eq!(o.limits.validate(), Ok(()), "seed {seed}");
            assert!((1..=6).contains(&o.clients));
            assert!(o.latency_ms_min <= o.latency_ms_max);
            assert!(o.limits.handshake_timeout_ms > 2 * o.latency_ms_max);
            assert!(o.mix.total() > 0);
            assert!((1..=o.clients).contains(&o.principals));
            assert!(o.mix.call + o.mix.notify == 0 || o.mix.services > 0);
        }
    }

    #[test]
    fn ratios_hit_at_their_rate() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let r = Ratio::new(1, 4);
        let hits = (0..40_000).filter(|_| r.hit(&mut rng)).count();
        assert!((9_000..11_000).contains(&hits), "{hits}");
        assert!(!(0..100).any(|_| Ratio::NEVER.hit(&mut rng)));
    }
}
