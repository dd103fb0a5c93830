//! ClientId bindings: which principal owns each clientId, and which bindings may be forgotten.
//!
//! A clientId belongs to the principal that first used it, so no other principal can resume
//! under it, answer for it or act in its name. A binding that has dispatched an action is
//! named in chat history (`origin.clientId`) and numbers its retries (`lastClientSeq`); it is
//! kept for as long as that history, which it never outgrows. A binding that never dispatched
//! holds nothing but the claim, and clients that pick a fresh clientId on every connection (the
//! AXP executor loop does) would pile such claims up without end. So each principal keeps at
//! most `Limits::idle_client_ids_per_principal` of them: binding one more releases that
//! principal's least recently used idle binding that no open connection uses.
//!
//! Only a principal's own new clientIds release its bindings: no principal can push another
//! one's claims out. An id released this way can later be bound by anyone, which is safe
//! because nothing durable names it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::channel;
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::log::change::{Record, StoreError, Table};
use crate::log::store::{MemStore, Store};
use crate::log::write_path::{Touched, Txn};
use crate::principal::Principal;

/// A clientId bound to the principal that first used it: the value of a [`Table::Client`]
/// record, as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientRecord {
    /// The client-chosen id (also the record key).
    pub client_id: String,
    /// Principal id that owns it.
    pub owner: String,
    /// Highest `clientSeq` with a stored dispatch receipt (0 when none). The stored record
    /// holds it as of the binding's first dispatch; later dispatches write only their receipts
    /// (one B-tree page fewer per change), and loading raises it to the newest of those
    /// ([`ClientRecord::raised_to_receipt`]).
    pub last_client_seq: u64,
    /// Whether this clientId ever dispatched an action (it may have used `clientSeq` 0, so
    /// `last_client_seq` cannot tell). A binding that never did holds no durable state and may
    /// be released.
    pub dispatched: bool,
}

impl ClientRecord {
    /// The record that stores this binding.
    pub fn to_record(&self) -> Record {
        // Serializing strings, a number and a bool cannot fail.
        let text = serde_json::to_string(self).unwrap_or_default();
        Record::json(Table::Client, self.client_id.clone(), &text)
    }

    /// Reads a stored binding; `None` when the bytes are not one.
    pub fn parse(value: &[u8]) -> Option<ClientRecord> {
        serde_json::from_slice(value).ok()
    }

    /// The receipt key of `client_id`'s dispatch numbered `client_seq`:
    /// `dispatch:<clientId>:<clientSeq>`, the number zero-padded to 20 digits so that a
    /// client's receipts sort by number and its newest is one index seek away.
    pub fn dispatch_receipt_key(client_id: &str, client_seq: u64) -> String {
        format!("dispatch:{client_id}:{client_seq:020}")
    }

    /// What every dispatch receipt key of this binding starts with. Nothing else does: a
    /// clientId has no `:`, so no other binding's keys start with it, and the other receipts
    /// are keyed by AXP `operationId`s, which are ids too.
    pub fn dispatch_receipt_prefix(&self) -> String {
        format!("dispatch:{}:", self.client_id)
    }

    /// This binding with `last_client_seq` raised to the number in `last_key`, the greatest
    /// dispatch receipt key the store holds for it (`Store::last_receipt_key` under
    /// [`Self::dispatch_receipt_prefix`]). `None` when that key is not one of this binding's.
    pub fn raised_to_receipt(mut self, last_key: Option<&str>) -> Option<ClientRecord> {
        if let Some(key) = last_key {
            let seq = key
                .strip_prefix(self.dispatch_receipt_prefix().as_str())
                .filter(|digits| digits.len() == 20 && digits.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|digits| digits.parse::<u64>().ok())?;
            self.last_client_seq = self.last_client_seq.max(seq);
        }
        Some(self)
    }

    /// This binding with `last_client_seq` raised to its newest dispatch receipt, in the store
    /// or in flight (`Kernel::last_receipt_key`). Called at load, one index seek per binding
    /// that ever dispatched, and to rebuild a binding after a failed commit.
    pub(crate) fn read<S: Store>(
        k: &mut Kernel<S>,
        record: ClientRecord,
    ) -> Result<ClientRecord, ReadError> {
        if !record.dispatched {
            return Ok(record);
        }
        let last = k
            .last_receipt_key(&record.owner, &record.dispatch_receipt_prefix())
            .map_err(ReadError::Store)?;
        record
            .raised_to_receipt(last.as_deref())
            .ok_or(ReadError::Corrupt)
    }
}

/// The clientId bindings `store` holds, in clientId order, each as a host loading the store
/// reads it (`lastClientSeq` raised to its newest dispatch receipt); `None` for one that is
/// unreadable. What checkers compare a host's bindings with.
pub fn stored_bindings(store: &MemStore) -> Vec<Option<ClientRecord>> {
    store
        .records_of(Table::Client)
        .map(|(_, value)| {
            ClientRecord::parse(value).and_then(|c| {
                let last = store.greatest_receipt_key(&c.owner, &c.dispatch_receipt_prefix());
                c.raised_to_receipt(last)
            })
        })
        .collect()
}

/// Why a binding could not be read back.
#[derive(Debug)]
pub(crate) enum ReadError {
    Store(StoreError),
    /// The binding's newest receipt key is not one of its dispatch keys.
    Corrupt,
}

struct Binding {
    record: ClientRecord,
    /// When a connection last became ready under this id, on the `uses` counter.
    last_use: u64,
    /// Connections ready under this id that the driver has not reported closed.
    connections: u32,
}

impl Binding {
    fn idle_key(&self) -> Option<(u64, String)> {
        (!self.record.dispatched).then(|| (self.last_use, self.record.client_id.clone()))
    }
}

/// Every clientId binding, with the order in which idle ones are released.
#[derive(Default)]
pub(crate) struct ClientBindings {
    by_id: BTreeMap<String, Binding>,
    /// Per owner: the bindings that never dispatched, by `(last_use, clientId)`, least recently
    /// used first.
    idle: BTreeMap<String, BTreeSet<(u64, String)>>,
    /// Use counter. Bindings loaded at startup share 0 (ties go by clientId, so the order is
    /// the same on every start); each handshake takes the next value.
    uses: u64,
}

/// Every idle binding of the principal is held by an open connection: none can be released.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct AllInUse;

impl ClientBindings {
    /// Binds `client_id` to `principal` on first use; another principal's id is refused. A new
    /// binding may release the principal's least recently used idle ones, in the same change.
    /// The binding holds at once (a later handshake builds on it); what reveals it waits for
    /// its change like any other answer.
    pub(crate) fn bind<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        principal: &Principal,
        client_id: &str,
    ) -> Result<(), RpcError> {
        if !channel::valid_id(client_id) {
            return Err(RpcError::invalid_params(
                "clientId must match ^[a-zA-Z0-9][a-zA-Z0-9._-]{0,127}$",
            ));
        }
        match self.get(client_id) {
            Some(c) if c.owner == principal.id => return Ok(()),
            Some(_) => {
                return Err(RpcError::forbidden(
                    "Client identity belongs to another principal",
                ))
            }
            None => {}
        }
        let quota = k.limits().idle_client_ids_per_principal;
        let released = self.to_release(&principal.id, quota).map_err(|AllInUse| {
            RpcError::limit(format!(
                "This principal's {quota} clientIds that never dispatched are all in use"
            ))
        })?;
        k.room()?;
        let record = ClientRecord {
            client_id: client_id.to_owned(),
            owner: principal.id.clone(),
            last_client_seq: 0,
            dispatched: false,
        };
        let mut txn = Txn {
            records: vec![record.to_record()],
            touched: vec![Touched::Client(client_id.to_owned())],
            ..Txn::default()
        };
        for id in &released {
            txn.records.push(Record::delete(Table::Client, id.clone()));
            txn.touched.push(Touched::Client(id.clone()));
        }
        k.commit(txn);
        for id in &released {
            self.release(id);
        }
        k.stats_mut().client_ids_released += released.len() as u64;
        self.insert(record);
        Ok(())
    }

    /// Puts binding `client_id` back as the store and the changes in flight have it (after a
    /// failed change). A store that cannot be read leaves no trustworthy state: a crash.
    pub(crate) fn rebuild<S: Store>(&mut self, k: &mut Kernel<S>, client_id: &str) {
        let stored = k.view().record(Table::Client, client_id);
        match stored {
            Ok(Some(v)) => match ClientRecord::parse(&v).map(|r| ClientRecord::read(k, r)) {
                Some(Ok(record)) => self.insert(record),
                Some(Err(e)) => panic!("clientId binding {client_id:?} cannot be read: {e:?}"),
                None => panic!("clientId binding {client_id:?} is unreadable in the store"),
            },
            Ok(None) => self.forget(client_id),
            Err(e) => panic!("clientId binding {client_id:?} cannot be read: {e}"),
        }
    }

    /// Drops a binding whose creation failed (connections under it are being closed).
    fn forget(&mut self, client_id: &str) {
        if let Some(old) = self.by_id.remove(client_id) {
            self.unindex(old.idle_key(), &old.record.owner);
        }
    }

    /// The bindings a store holds, as loaded at startup.
    pub(crate) fn load(records: Vec<ClientRecord>) -> ClientBindings {
        let mut bindings = ClientBindings::default();
        for record in records {
            bindings.insert(record);
        }
        bindings
    }

    pub(crate) fn get(&self, client_id: &str) -> Option<&ClientRecord> {
        self.by_id.get(client_id).map(|b| &b.record)
    }

    /// Idle bindings `owner` holds.
    pub(crate) fn idle_count(&self, owner: &str) -> usize {
        self.idle.get(owner).map_or(0, BTreeSet::len)
    }

    /// What to release so that `owner` may bind one more clientId and hold at most `quota`
    /// idle ones: nothing while it is under quota, else its least recently used idle bindings
    /// that no connection uses.
    pub(crate) fn to_release(&self, owner: &str, quota: u32) -> Result<Vec<String>, AllInUse> {
        let Some(idle) = self.idle.get(owner) else {
            return Ok(Vec::new());
        };
        let excess = (idle.len() + 1).saturating_sub(quota as usize);
        if excess == 0 {
            return Ok(Vec::new());
        }
        let release: Vec<String> = idle
            .iter()
            .filter(|(_, id)| self.by_id.get(id).is_some_and(|b| b.connections == 0))
            .take(excess)
            .map(|(_, id)| id.clone())
            .collect();
        if release.len() < excess {
            return Err(AllInUse);
        }
        Ok(release)
    }

    /// Records a committed binding, new or updated.
    pub(crate) fn insert(&mut self, record: ClientRecord) {
        let (last_use, connections) = match self.by_id.remove(&record.client_id) {
            Some(old) => {
                self.unindex(old.idle_key(), &old.record.owner);
                (old.last_use, old.connections)
            }
            None => (0, 0),
        };
        let binding = Binding {
            record,
            last_use,
            connections,
        };
        self.index(binding.idle_key(), &binding.record.owner);
        self.by_id.insert(binding.record.client_id.clone(), binding);
    }

    /// Forgets a binding whose release was committed.
    pub(crate) fn release(&mut self, client_id: &str) {
        if let Some(old) = self.by_id.remove(client_id) {
            debug_assert_eq!(old.connections, 0, "released a binding in use");
            self.unindex(old.idle_key(), &old.record.owner);
        }
    }

    /// A connection became ready under `client_id`: the binding is now the most recently used
    /// of its owner's, and in use until `detach`.
    pub(crate) fn attach(&mut self, client_id: &str) {
        self.uses += 1;
        let uses = self.uses;
        let Some(b) = self.by_id.get_mut(client_id) else {
            return;
        };
        let old_key = b.idle_key();
        b.last_use = uses;
        b.connections += 1;
        let new_key = b.idle_key();
        let owner = b.record.owner.clone();
        self.unindex(old_key, &owner);
        self.index(new_key, &owner);
    }

    /// A connection that was ready under `client_id` is gone.
    pub(crate) fn detach(&mut self, client_id: &str) {
        if let Some(b) = self.by_id.get_mut(client_id) {
            b.connections = b.connections.saturating_sub(1);
        }
    }

    /// Every binding as the store should hold it, in clientId order.
    pub(crate) fn records(&self) -> impl Iterator<Item = &ClientRecord> {
        self.by_id.values().map(|b| &b.record)
    }

    fn index(&mut self, key: Option<(u64, String)>, owner: &str) {
        if let Some(key) = key {
            self.idle.entry(owner.to_owned()).or_default().insert(key);
        }
    }

    fn unindex(&mut self, key: Option<(u64, String)>, owner: &str) {
        let Some(key) = key else { return };
        if let Some(set) = self.idle.get_mut(owner) {
            set.remove(&key);
            if set.is_empty() {
                self.idle.remove(owner);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, owner: &str, dispatched: bool) -> ClientRecord {
        ClientRecord {
            client_id: id.into(),
            owner: owner.into(),
            last_client_seq: u64::from(dispatched),
            dispatched,
        }
    }

    #[test]
    fn the_least_recently_used_idle_binding_goes_first() {
        let mut b = ClientBindings::load(vec![record("a", "p", false), record("b", "p", false)]);
        assert_eq!(b.to_release("p", 3), Ok(vec![]));
        // Loaded bindings tie at use 0 and go by clientId.
        assert_eq!(b.to_release("p", 2), Ok(vec!["a".to_owned()]));
        b.attach("a");
        b.detach("a");
        assert_eq!(b.to_release("p", 2), Ok(vec!["b".to_owned()]));
        // Another principal's bindings are never candidates.
        assert_eq!(b.to_release("q", 1), Ok(vec![]));
    }

    #[test]
    fn bindings_in_use_or_that_dispatched_are_never_released() {
        let mut b = ClientBindings::load(vec![record("a", "p", false), record("d", "p", true)]);
        b.attach("a");
        assert_eq!(b.to_release("p", 1), Err(AllInUse));
        b.detach("a");
        assert_eq!(b.to_release("p", 1), Ok(vec!["a".to_owned()]));
        // Dispatching takes a binding out of the idle set for good.
        b.insert(record("a", "p", true));
        assert_eq!(b.idle_count("p"), 0);
        assert_eq!(b.to_release("p", 1), Ok(vec![]));
    }

    #[test]
    fn a_lowered_quota_releases_everything_over_it_at_once() {
        let ids = ["a", "b", "c", "d"];
        let mut b = ClientBindings::load(ids.iter().map(|id| record(id, "p", false)).collect());
        b.attach("b");
        assert_eq!(
            b.to_release("p", 2),
            Ok(vec!["a".to_owned(), "c".to_owned(), "d".to_owned()])
        );
        for id in ["a", "c", "d"] {
            b.release(id);
        }
        assert_eq!(b.idle_count("p"), 1);
        assert_eq!(b.records().count(), 1);
    }

    #[test]
    fn dispatch_receipt_keys_sort_by_number_and_raise_only_their_own_binding() {
        let key = ClientRecord::dispatch_receipt_key;
        assert_eq!(key("c1", 12), "dispatch:c1:00000000000000000012");
        assert!(key("c1", 9) < key("c1", 12));
        assert!(key("c1", u64::MAX).starts_with(&record("c1", "p", true).dispatch_receipt_prefix()));
        let raised = |last: Option<&str>| {
            let mut r = record("c1", "p", true);
            r.last_client_seq = 5;
            r.raised_to_receipt(last).map(|r| r.last_client_seq)
        };
        assert_eq!(raised(None), Some(5));
        assert_eq!(raised(Some(&key("c1", 12))), Some(12));
        // A receipt below the record's number leaves it (the record is never newer than its
        // receipts, but a raise must never lower).
        assert_eq!(raised(Some(&key("c1", 3))), Some(5));
        // Not this binding's, or not a padded number: unreadable.
        for bad in [
            key("c2", 12),
            "dispatch:c1:12".to_owned(),
            "dispatch:c1:0000000000000000001x".to_owned(),
            "dispatch:c1:+0000000000000000012".to_owned(),
        ] {
            assert_eq!(raised(Some(&bad)), None, "{bad}");
        }
    }
}
