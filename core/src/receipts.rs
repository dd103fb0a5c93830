//! Retry receipts: canonical JSON, fingerprints, and the cache of recent receipts.
//!
//! A receipt is keyed `(owner, key)`: the principal that issued a command and the command's
//! operation key (`dispatch:<clientId>:<clientSeq>` today; AXP's `operationId` next). It stores
//! the fingerprint of the command's canonical input, so a retry (same key, same fingerprint) is
//! answered without doing the work twice.
//!
//! The cache answers for the receipts committed lately and for every receipt still in flight,
//! so a retry is known without a store read, and a retry of a change the store does not hold
//! yet is known at all. A receipt in flight is never evicted; a failed change's receipts are
//! forgotten, and the store (which then holds the durable prefix) answers for their keys.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Canonical JSON (object keys sorted at every depth), for fingerprints.
pub(crate) fn canonical(v: &Value) -> String {
    fn write(v: &Value, out: &mut String) {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::from(k.as_str()).to_string());
                    out.push(':');
                    write(&m[k.as_str()], out);
                }
                out.push('}');
            }
            Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

/// SHA-256 hex of the canonical form of `{method, params}`.
pub(crate) fn fingerprint(method: &str, params: &Value) -> String {
    let digest =
        Sha256::digest(canonical(&json!({ "method": method, "params": params })).as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// How many durable receipts [`RecentReceipts`] keeps (about 200 bytes each). Receipts in
/// flight are kept on top of these.
pub(crate) const RECENT_RECEIPTS_MAX: usize = 1024;

struct Cached {
    fingerprint: String,
    /// The change that wrote it; in flight while above the durable number.
    change: u64,
}

/// The receipts committed lately or in flight, by `(owner, key)`: each key's fingerprint as
/// last written. A `BTreeMap`: the keys carry peer-chosen ids, and the core takes no seeded
/// hasher's randomness.
#[derive(Default)]
pub(crate) struct RecentReceipts {
    entries: BTreeMap<(String, String), Cached>,
    /// Insertion order, oldest first, for eviction.
    order: VecDeque<(String, String)>,
}

impl RecentReceipts {
    /// The fingerprint cached under `(owner, key)`.
    pub(crate) fn get(&self, owner: &str, key: &str) -> Option<&str> {
        self.entries
            .get(&(owner.to_owned(), key.to_owned()))
            .map(|c| c.fingerprint.as_str())
    }

    /// Caches a receipt written by change `change`; `durable` is the newest durable change.
    pub(crate) fn insert(
        &mut self,
        owner: &str,
        key: String,
        fingerprint: String,
        change: u64,
        durable: u64,
    ) {
        let id = (owner.to_owned(), key);
        let cached = Cached {
            fingerprint,
            change,
        };
        if self.entries.insert(id.clone(), cached).is_none() {
            self.order.push_back(id);
        }
        self.evict(durable);
    }

    /// Drops the oldest durable receipts over the bound. Stops at the oldest one still in
    /// flight, which must stay.
    pub(crate) fn evict(&mut self, durable: u64) {
        while self.entries.len() > RECENT_RECEIPTS_MAX {
            let Some(old) = self.order.front() else { break };
            if self.entries.get(old).is_some_and(|c| c.change > durable) {
                break;
            }
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }

    /// Forgets every receipt written by change `from` or later (they failed).
    pub(crate) fn forget_from(&mut self, from: u64) {
        self.entries.retain(|_, c| c.change < from);
        let entries = &self.entries;
        self.order.retain(|id| entries.contains_key(id));
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_json_sorts_keys_at_every_depth() {
        let v = json!({"b": 1, "a": {"d": [1, {"f": 2, "e": 3}], "c": "x"}});
        assert_eq!(
            canonical(&v),
            r#"{"a":{"c":"x","d":[1,{"e":3,"f":2}]},"b":1}"#
        );
        assert_eq!(
            fingerprint("m", &json!({"x":1, "y":2})),
            fingerprint("m", &json!({"y":2, "x":1}))
        );
    }

    #[test]
    fn receipts_in_flight_are_never_evicted_and_failed_ones_are_forgotten() {
        let mut r = RecentReceipts::default();
        // Change 1 is in flight (nothing durable): over the bound, nothing goes.
        for i in 0..RECENT_RECEIPTS_MAX + 10 {
            r.insert("p", format!("k{i}"), "f".into(), 1, 0);
        }
        assert_eq!(r.len(), RECENT_RECEIPTS_MAX + 10);
        assert_eq!(r.get("p", "k0"), Some("f"));
        // Once durable, the oldest go first.
        r.evict(1);
        assert_eq!(r.len(), RECENT_RECEIPTS_MAX);
        assert_eq!(r.get("p", "k0"), None);
        r.insert("p", "later".into(), "g".into(), 2, 1);
        assert_eq!(r.len(), RECENT_RECEIPTS_MAX);
        r.forget_from(2);
        assert_eq!(r.get("p", "later"), None);
        assert_eq!(r.len(), RECENT_RECEIPTS_MAX - 1);
        // Keys are per owner.
        assert_eq!(r.get("q", "k20"), None);
    }
}
