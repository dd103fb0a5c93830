//! How much one loop turn reads before it writes.
//!
//! A turn reads the connections on the read backlog, at most `MESSAGES_PER_READ_MAX` messages
//! from each, and then writes what that produced, one write per destination. With many busy
//! senders one pass over the backlog (a read round) already gives each destination a batch:
//! 64 senders to 64 receivers read 4,096 messages, ~64 per write. With few senders and many
//! destinations it did not: one sender fanning out to 16 receivers read 64 messages, 4 per
//! write, and at 1→16 with 16 frames per write the host spent 1.0–1.4 µs of kernel time per
//! message on those small writes (0.52–0.71 M msg/s; `benches/ab.sh`, `docs/performance.md`).
//!
//! So the turn goes round the backlog again, in the same order and with the same share per
//! connection, while it has read fewer than `MESSAGES_PER_READ_MAX` messages per connection it
//! has output for, up to `TURN_MESSAGES_MAX` messages and `READ_ROUNDS_MAX` rounds. A turn
//! whose first round gives every destination a batch (64→64, 16→16, 1→1) is unchanged; a lone
//! sender's turn grows until its writes carry about as much as theirs. Fairness is that of one
//! round: no connection is read again before every other busy one has been read as often.

/// WebSocket messages read from one connection in one read round, so one busy peer cannot
/// starve the others; the rest waits for the next round or turn (the connection stays on the
/// read backlog). Public so the `websocket` fuzz target reads in the same steps.
pub const MESSAGES_PER_READ_MAX: usize = 64;

/// Messages after which a turn starts no further read round: ~260 KiB of 200-byte
/// notifications, so what a turn forwards stays within the L2 cache before it is written. The
/// first round is not capped by this (it is bounded by the backlog times
/// `MESSAGES_PER_READ_MAX`).
pub const TURN_MESSAGES_MAX: usize = 1024;

/// Read rounds per turn at most. Every step a read takes counts as a message (a ping, a
/// fragment, a frame that ends in an error), and a closing socket's discard pass as a full
/// share, so this bounds only turns whose rounds read next to nothing.
pub const READ_ROUNDS_MAX: usize = 16;

/// Whether a turn that has done `rounds` read rounds, read `messages` messages and has output
/// waiting for `destinations` connections reads its backlog again before writing.
pub fn read_again(rounds: usize, messages: usize, destinations: usize) -> bool {
    rounds < READ_ROUNDS_MAX
        && messages < TURN_MESSAGES_MAX
        && messages < MESSAGES_PER_READ_MAX.saturating_mul(destinations.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rounds a turn reads when `senders` connections each have `queued` messages waiting and
    /// every message goes to one of `destinations` connections.
    fn rounds_for(senders: usize, queued: usize, destinations: usize) -> (usize, usize) {
        let mut left = vec![queued; senders];
        let (mut rounds, mut messages) = (0, 0);
        loop {
            let mut read = 0;
            for l in left.iter_mut() {
                let n = (*l).min(MESSAGES_PER_READ_MAX);
                *l -= n;
                read += n;
            }
            rounds += 1;
            messages += read;
            let backlog = left.iter().any(|&l| l > 0);
            if !backlog || !read_again(rounds, messages, destinations.min(messages)) {
                return (rounds, messages);
            }
        }
    }

    #[test]
    fn many_senders_or_one_destination_read_one_round_as_before() {
        assert_eq!(rounds_for(64, 10_000, 64), (1, 4096));
        assert_eq!(rounds_for(16, 10_000, 16), (1, 1024));
        assert_eq!(rounds_for(1, 10_000, 1), (1, 64));
    }

    #[test]
    fn a_lone_sender_fanning_out_reads_until_each_destination_has_a_batch() {
        // 1→16: 16 rounds of 64, 64 messages per write instead of 4.
        assert_eq!(rounds_for(1, 10_000, 16), (16, 1024));
        // 1→4: four rounds, 64 per write.
        assert_eq!(rounds_for(1, 10_000, 4), (4, 256));
        // 2→64 wants 4,096 but stops at the turn's cap.
        assert_eq!(rounds_for(2, 10_000, 64), (8, 1024));
    }

    #[test]
    fn a_turn_never_reads_past_what_is_queued_or_the_round_cap() {
        assert_eq!(rounds_for(1, 100, 16), (2, 100));
        assert!(!read_again(READ_ROUNDS_MAX, 0, 1_000));
        // Rounds that read next to nothing still end.
        assert!(read_again(READ_ROUNDS_MAX - 1, 0, 0));
        assert!(!read_again(0, TURN_MESSAGES_MAX, 1_000));
    }
}
