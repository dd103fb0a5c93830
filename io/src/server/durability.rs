//! The driver's side of the writer thread (`writer.rs`): the core's commits go to it
//! (`Output::Commit`, in `drain_outputs`), its outcomes come back through a waker that ends the
//! loop's wait and are fed to the core every turn, and a shutdown lets it settle before closing
//! WebSockets (`serve` finishes it once the loop has returned).

use std::io;
use std::time::Duration;

use axhost_core::{Change, Input, Now, Store};
use mio::{Registry, Waker};

use super::{Driver, SHUTDOWN_WRITER_MS, WRITER};
use crate::writer::{BatchStore, Outcome, Writer, WriterLimits};

/// Starts the writer thread on `store_writes`, with a waker registered on `registry` that ends
/// the loop's wait when outcomes are ready.
pub(super) fn start_writer<W: BatchStore<Change = Box<Change>>>(
    registry: &Registry,
    store_writes: W,
    spin: Duration,
) -> io::Result<Writer<Box<Change>>> {
    let waker = Waker::new(registry, WRITER)?;
    Writer::start(store_writes, WriterLimits::default(), spin, move || {
        // A failed wake means the poller is gone, and with it the loop.
        let _ = waker.wake();
    })
}

impl<S: Store> Driver<S> {
    /// Feeds the core every outcome the writer has ready; what they release is drained next.
    pub(super) fn deliver_outcomes(&mut self, now: Now) {
        while let Some(outcome) = self.writer.poll_outcome() {
            self.host.handle(now, outcome_input(outcome));
        }
    }

    /// Shutdown: lets the writer commit what is queued (up to `SHUTDOWN_WRITER_MS`) and hands
    /// the outcomes to the core, so what they release is queued ahead of the close frames.
    pub(super) fn settle_writer(&mut self, now: Now) {
        let deadline = std::time::Instant::now() + Duration::from_millis(SHUTDOWN_WRITER_MS);
        while self.writer.unresolved() > 0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.writer.wait_outcome(left) {
                Some(outcome) => self.host.handle(now, outcome_input(outcome)),
                None => break,
            }
            self.drain_outputs(now);
        }
        self.deliver_outcomes(now);
        self.drain_outputs(now);
    }
}

/// The core's input for a writer outcome.
fn outcome_input(outcome: Outcome) -> Input<'static> {
    match outcome {
        Outcome::Durable { through } => Input::Durable { through },
        Outcome::CommitFailed { number } => Input::CommitFailed { number },
    }
}
