//! SIGINT and SIGTERM. The first stops accepting, lets the writer settle (what it makes durable
//! is answered), closes every WebSocket with 1001 and drops sockets still sending a head; the
//! loop then ends when every socket is gone or `SHUTDOWN_DRAIN_MS` is over. A second signal
//! stops at once.

use axhost_core::Store;
use signal_hook::consts::{SIGINT, SIGTERM};

use super::slots::Phase;
use super::Driver;

/// Time a shutdown gives WebSockets to receive their close frames before the driver returns.
const SHUTDOWN_DRAIN_MS: u64 = 2_000;

impl<S: Store> Driver<S> {
    /// Returns true when this is the second stop request (stop at once).
    pub(super) fn on_signal(&mut self) -> bool {
        let stop = self.signals.pending().any(|s| s == SIGINT || s == SIGTERM);
        if !stop {
            return false;
        }
        if self.stop_by_ms.is_some() {
            return true;
        }
        let now = self.clock.now();
        tracing::info!(connections = self.host.connection_count(), "stopping");
        self.stop_by_ms = Some(now.mono.0.saturating_add(SHUTDOWN_DRAIN_MS));
        if let Some(mut listener) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        self.accept_retry_ms = None;
        self.settle_writer(now);
        let ids: Vec<u64> = self.slots.keys().copied().collect();
        for id in ids {
            let open = self
                .slots
                .get(&id)
                .is_some_and(|s| matches!(s.phase, Phase::Open { .. }));
            if open {
                self.close(id, 1001, "Host shutting down", now);
            } else if self
                .slots
                .get(&id)
                .is_some_and(|s| matches!(s.phase, Phase::Head { .. }))
            {
                self.drop_slot(id, "shutdown", now);
            }
        }
        false
    }
}
