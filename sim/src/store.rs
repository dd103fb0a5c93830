//! The simulator's store: the core's own `MemStore` behind a buggify switch.
//!
//! Faults live at the boundary, never in the core (FoundationDB's buggify, two stages): a run
//! *activates* store faults with one probability (in `Options::swarm`), then each store call
//! *fires* with another. The simulated writer ([`crate::writer`]) commits a whole group of
//! changes through [`SimStore::commit_group`]: a fired fault refuses all of it, as a failed
//! SQLite transaction writes nothing. The host must then roll back and answer with errors or
//! rejections; the durability oracles ([`crate::durability`]) see any drift between memory,
//! clients and store. A fired read fault fails a receipt or record read the host makes.

use std::cell::Cell;

use axhost_core::{
    Bytes, Change, Commit, Event, Loaded, MemStore, Receipt, Store, StoreError, Table,
};
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
    /// Transactions to refuse no matter what (scripted tests); a `Cell` for the same reason.
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

    /// Refuses the next `n` transactions (scripted tests).
    pub fn fail_next_commits(&self, n: u32) {
        self.forced.set(n);
    }

    /// The reference store underneath, for inspection.
    pub fn mem(&self) -> &MemStore {
        &self.mem
    }

    /// Commits `changes` in one transaction: all of them, in order, or (a fired fault, or a
    /// forced one) none.
    pub fn commit_group(&mut self, changes: &[Box<Change>]) -> Result<(), StoreError> {
        self.refusal()?;
        for change in changes {
            // The reference store refuses only what it was told to (nothing here) and panics
            // on an out-of-order change, which is a driver bug worth a violation.
            self.mem.commit(change)?;
        }
        Ok(())
    }

    /// Whether the next transaction is refused (a forced failure first, then the seeded one).
    fn refusal(&mut self) -> Result<(), StoreError> {
        let forced = self.forced.get();
        if forced > 0 {
            self.forced.set(forced - 1);
            self.refused += 1;
            return Err(StoreError("injected group commit failure".into()));
        }
        if self.fires() {
            self.refused += 1;
            return Err(StoreError("injected group commit failure".into()));
        }
        Ok(())
    }

    fn fires(&mut self) -> bool {
        match self.fault {
            Some(ratio) if self.armed.get() => ratio.hit(&mut self.rng),
            _ => false,
        }
    }

    fn read_fault(&mut self) -> Result<(), StoreError> {
        if self.fires() {
            self.refused += 1;
            return Err(StoreError("injected read failure".into()));
        }
        Ok(())
    }
}

/// A group of one, with the same faults: what the shared drive loop's immediate and queued
/// modes commit through.
impl Commit for SimStore {
    fn commit(&mut self, change: &Change) -> Result<(), StoreError> {
        self.refusal()?;
        self.mem.commit(change)
    }
}

impl Store for SimStore {
    fn load(&mut self, events_tail_max: u32) -> Result<Loaded, StoreError> {
        self.mem.load(events_tail_max)
    }

    fn receipt(&mut self, owner: &str, key: &str) -> Result<Option<Receipt>, StoreError> {
        self.read_fault()?;
        self.mem.receipt(owner, key)
    }

    // Record, event and last-receipt reads rebuild state the host must have: a failure there
    // is a crash by design (the host panics rather than serve state it cannot trust), so they
    // never fail.
    fn last_receipt_key(
        &mut self,
        owner: &str,
        prefix: &str,
    ) -> Result<Option<String>, StoreError> {
        self.mem.last_receipt_key(owner, prefix)
    }

    fn read_record(&mut self, table: Table, key: &str) -> Result<Option<Bytes>, StoreError> {
        self.mem.read_record(table, key)
    }

    fn channel_events_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Vec<Event>, StoreError> {
        self.mem.channel_events_after(channel, after)
    }

    fn first_channel_event_after(
        &mut self,
        channel: &str,
        after: u64,
    ) -> Result<Option<u64>, StoreError> {
        self.mem.first_channel_event_after(channel, after)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn change(number: u64) -> Change {
        Change {
            number,
            server_seq: number,
            ..Change::default()
        }
    }

    /// A change committed alone (the shared drive loop's immediate and queued modes) meets
    /// the same faults as a group, and a refusal changes nothing.
    #[test]
    fn a_change_alone_is_refused_like_a_group_and_leaves_nothing() {
        let mut store = SimStore::new(ChaCha8Rng::seed_from_u64(3), None);
        store.fail_next_commits(1);
        assert!(Commit::commit(&mut store, &change(1)).is_err());
        assert_eq!((store.refused, store.mem().commits()), (1, 0));
        Commit::commit(&mut store, &change(1)).expect("the next one");
        assert_eq!(store.mem().server_seq(), 1);
        let mut always = SimStore::new(ChaCha8Rng::seed_from_u64(3), Some(Ratio::new(1, 1)));
        assert!(Commit::commit(&mut always, &change(1)).is_err());
        always.disarm();
        Commit::commit(&mut always, &change(1)).expect("disarmed");
    }
}
