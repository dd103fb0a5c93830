//! Retry receipts: the fingerprint of a mutation and the cache of receipts the host wrote lately.
//!
//! A receipt is keyed `(owner, key)`: the principal that issued a mutation and its operation
//! key (`dispatch:<clientId>:<clientSeq>`, the number zero-padded to 20 digits, for AHP
//! dispatches; the `operationId` for AXP commands). It holds the fingerprint of the mutation's canonical input and the result it got,
//! so a retry (same key, same fingerprint) gets the same answer and changes nothing.
//!
//! The cache holds every receipt of a change still in flight (never evicted: the store does not
//! have it yet) and the newest [`RECENT_RECEIPTS_MAX`] durable ones, so a retry that follows
//! its original closely is answered without a store read. A failed change's receipts are
//! forgotten; the store, which then holds the durable prefix, answers for their keys.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use serde_json::Value;

use crate::canonical::hash_members;
use crate::log::store::prefix_upper_bound;

/// SHA-256 hex of the canonical form of `{method, params}`.
pub(crate) fn fingerprint(method: &str, params: &Value) -> String {
    hash_members(&[("method", &Value::from(method)), ("params", params)])
}

/// Durable receipts the cache keeps beside those in flight (a few hundred bytes each).
pub(crate) const RECENT_RECEIPTS_MAX: usize = 4096;

/// A receipt as the cache knows it.
#[derive(Clone, Debug)]
pub(crate) struct Known {
    pub(crate) fingerprint: String,
    pub(crate) result: Arc<str>,
    /// The change that wrote it: in flight while above the durable number.
    pub(crate) change: u64,
}

/// The receipts written lately or in flight, by `(owner, key)`. A `BTreeMap`: the keys carry
/// peer-chosen ids, and the core takes no seeded hasher's randomness.
#[derive(Default)]
pub(crate) struct RecentReceipts {
    entries: BTreeMap<(String, String), Known>,
    /// Insertion order, oldest first: `(key, change)`; an entry rewritten later appears again.
    order: VecDeque<((String, String), u64)>,
    /// Each change not yet known durable, in change order, with how many entries it holds
    /// (counts, not keys: becoming durable then costs no key search).
    pending: VecDeque<(u64, usize)>,
    /// Entries whose change is durable: the ones eviction may take.
    durable: usize,
    /// The newest durable change number the cache was told of.
    durable_through: u64,
}

impl RecentReceipts {
    pub(crate) fn get(&self, owner: &str, key: &str) -> Option<&Known> {
        self.entries.get(&(owner.to_owned(), key.to_owned()))
    }

    /// The greatest key under `owner` starting with `prefix` that the cache holds (see
    /// `Store::last_receipt_key` for what `prefix` may be).
    pub(crate) fn last_key(&self, owner: &str, prefix: &str) -> Option<&str> {
        let upper = prefix_upper_bound(prefix)?;
        self.entries
            .range((owner.to_owned(), prefix.to_owned())..(owner.to_owned(), upper))
            .next_back()
            .map(|((_, key), _)| key.as_str())
    }

    /// Records a receipt written by change `change` (in flight).
    pub(crate) fn insert(
        &mut self,
        owner: &str,
        key: &str,
        fingerprint: String,
        result: Arc<str>,
        change: u64,
    ) {
        let id = (owner.to_owned(), key.to_owned());
        let known = Known {
            fingerprint,
            result,
            change,
        };
        if let Some(old) = self.entries.insert(id.clone(), known) {
            if old.change <= self.durable_through {
                self.durable -= 1;
            } else if let Some(n) = self.pending_count(old.change) {
                *n -= 1;
            }
        }
        self.order.push_back((id, change));
        if let Some(n) = self.pending_count(change) {
            *n += 1;
        } else {
            // Changes are issued in number order, so this is the newest; a position search
            // keeps the order even if a caller ever broke that.
            let at = self.pending.partition_point(|(c, _)| *c < change);
            self.pending.insert(at, (change, 1));
        }
    }

    /// How many entries pending change `change` holds, if it is pending.
    fn pending_count(&mut self, change: u64) -> Option<&mut usize> {
        let at = self.pending.partition_point(|(c, _)| *c < change);
        match self.pending.get_mut(at) {
            Some((c, n)) if *c == change => Some(n),
            _ => None,
        }
    }

    /// Changes up to `through` are durable: their receipts may be evicted, oldest first, down
    /// to the bound.
    pub(crate) fn durable(&mut self, through: u64) {
        if through <= self.durable_through {
            return;
        }
        self.durable_through = through;
        while self.pending.front().is_some_and(|(c, _)| *c <= through) {
            if let Some((_, n)) = self.pending.pop_front() {
                self.durable += n;
            }
        }
        self.evict();
    }

    fn evict(&mut self) {
        while self.durable > RECENT_RECEIPTS_MAX {
            let Some((id, change)) = self.order.pop_front() else {
                break;
            };
            // Order entries of a key rewritten since, or of a change still in flight, are
            // stale or not evictable; the latter go back to the end of the line. One search.
            if let Entry::Occupied(e) = self.entries.entry(id) {
                if e.get().change == change {
                    if change <= self.durable_through {
                        e.remove();
                        self.durable -= 1;
                    } else {
                        let id = e.key().clone();
                        self.order.push_back((id, change));
                    }
                }
            }
        }
    }

    /// Changes from `first` on failed: their receipts are forgotten.
    pub(crate) fn forget_from(&mut self, first: u64) {
        // Failed changes are never durable; should one be, its entries leave the count too.
        let (through, durable) = (self.durable_through, &mut self.durable);
        self.entries.retain(|_, k| {
            let keep = k.change < first;
            if !keep && k.change <= through {
                *durable -= 1;
            }
            keep
        });
        self.order.retain(|(_, change)| *change < first);
        self.pending.retain(|(change, _)| *change < first);
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Records receipt `key` of owner `o` with fingerprint `fingerprint`, written by `change`,
    /// then checks the counts: every entry is either durable or counted by its pending change.
    fn put(r: &mut RecentReceipts, key: &str, fingerprint: &str, change: u64) {
        r.insert("o", key, fingerprint.into(), "null".into(), change);
        counts_add_up(r);
    }

    fn counts_add_up(r: &RecentReceipts) {
        let pending: usize = r.pending.iter().map(|(_, n)| n).sum();
        assert_eq!(
            r.durable + pending,
            r.len(),
            "durable {} pending {:?}",
            r.durable,
            r.pending
        );
        assert!(r
            .pending
            .iter()
            .zip(r.pending.iter().skip(1))
            .all(|(a, b)| a.0 < b.0));
    }

    #[test]
    fn fingerprints_ignore_key_order() {
        assert_eq!(
            fingerprint("m", &json!({"x": 1, "y": 2})),
            fingerprint("m", &json!({"y": 2, "x": 1}))
        );
        assert_ne!(
            fingerprint("m", &json!({"x": 1})),
            fingerprint("n", &json!({"x": 1}))
        );
    }

    #[test]
    fn receipts_in_flight_are_never_evicted_and_failed_ones_are_forgotten() {
        let mut r = RecentReceipts::default();
        let total = RECENT_RECEIPTS_MAX as u64 + 10;
        for i in 1..=total {
            put(&mut r, &format!("k{i}"), "f", i);
        }
        // Nothing durable yet: everything is kept.
        assert_eq!(r.len(), total as usize);
        r.durable(5);
        counts_add_up(&r);
        assert_eq!(r.len(), total as usize);
        r.durable(total);
        counts_add_up(&r);
        assert_eq!(r.len(), RECENT_RECEIPTS_MAX);
        assert!(r.get("o", "k1").is_none());
        assert!(r.get("o", &format!("k{total}")).is_some());
        put(&mut r, "late", "f", total + 1);
        put(&mut r, "later", "f", total + 2);
        r.forget_from(total + 2);
        counts_add_up(&r);
        assert!(r.get("o", "late").is_some());
        assert!(r.get("o", "later").is_none());
    }

    #[test]
    fn rewrites_in_flight_and_durable_are_counted_once() {
        let mut r = RecentReceipts::default();
        // Change 1 writes a and b, change 2 rewrites a while both are in flight, change 3
        // rewrites b once it is durable.
        put(&mut r, "a", "f", 1);
        put(&mut r, "b", "f", 1);
        put(&mut r, "a", "f2", 2);
        r.durable(1);
        counts_add_up(&r);
        assert_eq!(r.durable, 1, "only b is durable: a was rewritten by 2");
        r.durable(2);
        counts_add_up(&r);
        assert_eq!(r.durable, 2);
        put(&mut r, "b", "f3", 3);
        assert_eq!(r.durable, 1, "b's durable receipt was replaced");
        r.durable(3);
        counts_add_up(&r);
        assert_eq!((r.durable, r.len()), (2, 2));
        assert!(r.pending.is_empty());
    }

    #[test]
    fn a_rewrite_in_flight_then_forgotten_leaves_the_earlier_change_to_count() {
        let mut r = RecentReceipts::default();
        put(&mut r, "a", "f", 1);
        put(&mut r, "b", "f", 2);
        // Change 3 rewrites a while 1 is still in flight, then fails with everything after 2.
        put(&mut r, "a", "f3", 3);
        r.forget_from(3);
        counts_add_up(&r);
        assert!(r.get("o", "a").is_none(), "the store answers for a now");
        r.durable(2);
        counts_add_up(&r);
        assert_eq!((r.durable, r.len()), (1, 1));
        assert!(r.pending.is_empty());
    }

    #[test]
    fn last_key_stays_within_its_owner_and_prefix() {
        let mut r = RecentReceipts::default();
        for (owner, key) in [
            ("o", "dispatch:c1:01"),
            ("o", "dispatch:c1:09"),
            ("o", "dispatch:c10:99"),
            ("o", "dispatch:c1;"),
            ("p", "dispatch:c1:50"),
        ] {
            r.insert(owner, key, "f".into(), "null".into(), 1);
        }
        assert_eq!(r.last_key("o", "dispatch:c1:"), Some("dispatch:c1:09"));
        assert_eq!(r.last_key("p", "dispatch:c1:"), Some("dispatch:c1:50"));
        assert_eq!(r.last_key("o", "dispatch:c2:"), None);
        assert_eq!(r.last_key("q", "dispatch:c1:"), None);
    }

    #[test]
    fn a_rewritten_key_keeps_its_newest_receipt() {
        let mut r = RecentReceipts::default();
        put(&mut r, "k", "old", 1);
        r.durable(1);
        counts_add_up(&r);
        put(&mut r, "k", "new", 2);
        r.durable(2);
        counts_add_up(&r);
        assert_eq!(r.get("o", "k").map(|k| k.fingerprint.as_str()), Some("new"));
        r.forget_from(2);
        counts_add_up(&r);
        assert!(r.get("o", "k").is_none());
    }
}
