//! How much one loop turn reads before it writes.
//!
//! A turn reads the connections on the read backlog, at most `MESSAGES_PER_READ_MAX` steps
//! (frames, pings, fragments) from each, and then writes what that produced, one write per
//! destination. With many busy senders one pass over the backlog (a read round) already gives
//! each destination a batch: 64 senders to 64 receivers read 4,096 messages, ~64 per write. With
//! few senders and many destinations it did not: one sender fanning out to 16 receivers read 64
//! messages, 4 per write, and at 1→16 with 16 frames per write the host spent 1.1–1.4 µs of
//! kernel time per message on those small writes (0.50–0.68 M msg/s; `benches/ab.sh`,
//! `docs/performance.md`).
//!
//! So the turn goes round the backlog again, in the same order and with the same share per
//! connection, while what it has queued so far averages less than a batch per destination
//! (`BATCH_FRAMES` frames and `BATCH_BYTES` bytes), counting only the connections that were sent
//! something during this turn's reads. No round starts after `TURN_STEPS_MAX` steps,
//! `TURN_BYTES_MAX` queued bytes or `READ_ROUNDS_MAX` rounds; a round that has started finishes.
//! A turn whose first round gives every destination a batch (64→64, 16→16, 1→1, or one
//! `dispatchAction` fanned out to many subscribers) reads as it did before rounds; a lone
//! sender's turn grows until its writes carry about as much as theirs.
//!
//! A turn taken while the driver coalesces its reads (`server/coalesce.rs`) reads one round
//! whatever it queued: reading less often than the peers send is how coalescing gathers
//! batches, and a second round of 64 kept a lone sender's host from ever falling behind.
//!
//! Fairness is that of one round among the connections on the backlog: none is read again
//! before every other busy one has been read as often. Bytes that arrive during the turn wait
//! for the next one, behind at most `TURN_STEPS_MAX` steps of further rounds (under a
//! millisecond of work), as they waited behind the first round before.

/// Steps (WebSocket frames, control frames included) read from one connection in one read
/// round, so one busy peer cannot starve the others; the rest waits for the next round or turn
/// (the connection stays on the read backlog). Public so the `websocket` fuzz target reads in
/// the same steps.
pub const MESSAGES_PER_READ_MAX: usize = 64;

/// Frames per destination that count as a batch: as many as one round reads from a connection.
pub const BATCH_FRAMES: usize = MESSAGES_PER_READ_MAX;

/// Bytes per destination that count as a batch, whatever the frames' size: 64 notifications
/// of ~260 bytes, or 4 frames of 4 KiB.
pub const BATCH_BYTES: usize = 16 * 1024;

/// Read steps after which a turn starts no further round: ~260 KiB of forwarded 260-byte
/// notification frames, so what a turn forwards stays in the L2 cache until it is written.
/// The first round is bounded by the backlog times `MESSAGES_PER_READ_MAX` instead.
pub const TURN_STEPS_MAX: usize = 1024;

/// Queued bytes after which a turn starts no further round, for large frames.
pub const TURN_BYTES_MAX: usize = 1 << 20;

/// Read rounds per turn at most.
pub const READ_ROUNDS_MAX: usize = 16;

/// What a turn has read and queued so far.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TurnLoad {
    /// Read rounds done.
    pub rounds: usize,
    /// Read steps taken; a closing socket's discard pass counts as a full share
    /// (`MESSAGES_PER_READ_MAX`), so discarding alone earns no extra rounds.
    pub steps: usize,
    /// Frames queued to WebSockets during the reads, and their bytes.
    pub frames: usize,
    pub bytes: usize,
    /// Connections that were queued at least one frame during the reads.
    pub destinations: usize,
    /// The driver is coalescing its reads: one round only.
    pub coalescing: bool,
}

impl TurnLoad {
    /// Whether the turn reads its backlog again before writing.
    pub fn read_again(&self) -> bool {
        let destinations = self.destinations.max(1);
        !self.coalescing
            && self.rounds < READ_ROUNDS_MAX
            && self.steps < TURN_STEPS_MAX
            && self.bytes < TURN_BYTES_MAX
            && self.frames < BATCH_FRAMES.saturating_mul(destinations)
            && self.bytes < BATCH_BYTES.saturating_mul(destinations)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A turn's rounds when `senders` connections each have `queued` messages waiting, every
    /// message sends `fanout` frames of `frame_bytes` each, and the frames go round-robin to
    /// `receivers` connections. Returns the rounds and the messages read.
    fn turn(
        senders: usize,
        queued: usize,
        receivers: usize,
        fanout: usize,
        frame_bytes: usize,
    ) -> (usize, usize) {
        let mut left = vec![queued; senders];
        let mut load = TurnLoad::default();
        let mut sent_to = vec![false; receivers];
        let mut next = 0;
        loop {
            for l in left.iter_mut() {
                let n = (*l).min(MESSAGES_PER_READ_MAX);
                *l -= n;
                load.steps += n;
                for _ in 0..n * fanout {
                    load.frames += 1;
                    load.bytes += frame_bytes;
                    if !std::mem::replace(&mut sent_to[next], true) {
                        load.destinations += 1;
                    }
                    next = (next + 1) % receivers;
                }
            }
            load.rounds += 1;
            if !left.iter().any(|&l| l > 0) || !load.read_again() {
                return (load.rounds, load.steps);
            }
        }
    }

    #[test]
    fn many_senders_or_one_destination_read_one_round_as_before() {
        assert_eq!(turn(64, 10_000, 64, 1, 260), (1, 4096));
        assert_eq!(turn(16, 10_000, 16, 1, 260), (1, 1024));
        assert_eq!(turn(1, 10_000, 1, 1, 260), (1, 64));
    }

    #[test]
    fn a_lone_sender_fanning_out_reads_until_each_destination_has_a_batch() {
        // 1→16: 16 rounds of 64, 64 frames per write instead of 4.
        assert_eq!(turn(1, 10_000, 16, 1, 260), (16, 1024));
        // 1→4: four rounds, 64 per write.
        assert_eq!(turn(1, 10_000, 4, 1, 260), (4, 256));
        // 2→64 would take 32 rounds; the turn stops at its step cap.
        assert_eq!(turn(2, 10_000, 64, 1, 260), (8, 1024));
    }

    #[test]
    fn a_batch_is_counted_in_frames_queued_not_messages_read() {
        // One dispatch fans out to 16 subscribers: one round already queues 64 frames for each.
        assert_eq!(turn(1, 10_000, 16, 16, 300), (1, 64));
        // 4 KiB frames: 4 per destination fill a batch's bytes, which one round gives 1→16.
        assert_eq!(turn(1, 10_000, 16, 1, 4096), (1, 64));
        // 1 KiB frames to 64 or 256 receivers: the round, step and byte caps all fall at 16
        // rounds (1,024 steps, 1 MiB), before a batch per destination.
        assert_eq!(turn(1, 10_000, 64, 1, 1024), (16, 1024));
        assert_eq!(turn(1, 10_000, 256, 1, 1024), (16, 1024));
        // 8 KiB frames to 64 receivers: two rounds give each its 16 KiB (1 MiB, the byte cap
        // too).
        assert_eq!(turn(1, 10_000, 64, 1, 8192), (2, 128));
        // 8 KiB frames to 256 receivers: only the turn's byte cap ends it. Two rounds queue 1
        // MiB for 128 destinations, half a batch each (2 MiB in all), at 128 of 1,024 steps.
        assert_eq!(turn(1, 10_000, 256, 1, 8192), (2, 128));
    }

    #[test]
    fn a_turn_never_reads_past_what_is_queued_or_its_caps() {
        assert_eq!(turn(1, 100, 16, 1, 260), (2, 100));
        let busy = TurnLoad {
            destinations: 1_000,
            ..TurnLoad::default()
        };
        assert!(busy.read_again());
        let capped = [
            TurnLoad {
                rounds: READ_ROUNDS_MAX,
                ..busy
            },
            TurnLoad {
                steps: TURN_STEPS_MAX,
                ..busy
            },
            TurnLoad {
                bytes: TURN_BYTES_MAX,
                ..busy
            },
        ];
        for load in capped {
            assert!(!load.read_again(), "{load:?}");
        }
        // Coalescing: one round, however far from a batch per destination.
        let coalescing = TurnLoad {
            rounds: 1,
            coalescing: true,
            ..busy
        };
        assert!(!coalescing.read_again());
        // Reads that queue nothing (notifications to no one) still stop at the step cap.
        let nowhere = TurnLoad {
            rounds: 3,
            steps: 192,
            ..TurnLoad::default()
        };
        assert!(nowhere.read_again());
    }
}
