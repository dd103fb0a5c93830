//! The simulator's store: the core's own `MemStore` behind a buggify switch.
//!
//! Faults live at the boundary, never in the core (FoundationDB's buggify, two stages): a run
//! *activates* store faults with one probability (in `Options::swarm`), then each store call
//! *fires* with another. A fired commit goes through `MemStore::fail_next_commits`, so the
//! refusal comes from the reference store itself. The host must then answer with an error or a
//! rejection and change nothing; the checker sees any drift between memory, clients and store.

use std::cell::Cell;

use axhost_core::{Change, Event, Loaded, MemStore, Receipt, Store, StoreError, Table};
use rand_chacha::ChaCha8Rng;

use crate::options::Ratio;

/// `MemStore` with seeded fault injection. Handing it to a new `Host` models a restart.
pub struct SimStore {
    mem: MemStore,
    rng: ChaCha8Rng,
    fault: Option<Ratio>,
    /// Cleared in the liveness phase; a `Cell` because the world only sees `&SimStore`
    /// through `Host::store`.
    armed: Cell<bool>,
    /// Commits to refuse no matter what (scripted tests); a `Cell` for the same reason.
    forced: Cell<u32>,
    /// Calls refused so far.
    pub refused: u64,
}

impl SimStore {
    /// An empty store that refuses calls at `fault`'s rate (never when `None`).
    pub fn new(rng: ChaCha8Rng, fault: Option<Ratio>) -> SimStore {
        SimStore {
            mem: MemStore::new(),
            rng,
            fault,
            armed: Cell::new(fault.is_some()),
            forced: Cell::new(0),
            refused: 0,
        }
    }

    /// Stops injecting faults (the liveness phase heals everything).
    pub fn disarm(&self) {
        self.armed.set(false);
    }

    /// Refuses the next `n` commits (scripted tests).
    pub fn fail_next_commits(&self, n: u32) {
        self.forced.set(n);
    }

    /// The reference store underneath, for inspection.
    pub fn mem(&self) -> &MemStore {
        &self.mem
    }

    fn fires(&mut self) -> bool {
        match self.fault {
            Some(ratio) if self.armed.get() => ratio.hit(&mut self.rng),
            _ => false,
        }
    }
}

impl Store for SimStore {
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError> {
        self.mem.load(events_tail_max)
    }

    fn commit(&mut self, change: &Change) -> Result<(), StoreError> {
        let forced = self.forced.get();
        if forced > 0 {
            self.forced.set(forced - 1);
            self.refused += 1;
            self.mem.fail_next_commits(1);
        } else if self.fires() {
            self.refused += 1;
            self.mem.fail_next_commits(1);
        }
        self.mem.commit(change)
    }

    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError> {
        if self.fires() {
            self.refused += 1;
            return Err(StoreError("injected receipt read failure".into()));
        }
        self.mem.receipt(owner, key)
    }

    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<String>, StoreError> {
        self.mem.read_record(table, key)
    }

    fn channel_events_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.mem.channel_events_after(channel, after)
    }
}
