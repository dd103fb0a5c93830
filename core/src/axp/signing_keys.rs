//! Signing keys bound to principals: the first Ed25519 key a principal signs a review or an
//! approval with is its key for good, so a principal cannot sign as two identities and a
//! stolen token cannot sign with a new key. Another key later is `-32009`.
//!
//! A binding is its own record (`Table::SigningKey`, keyed by principal id, one small write),
//! written in the same change as the review it came with and applied at once (later commands
//! see it while it is in flight); a failed commit rebuilds it from the store
//! (`Touched::SigningKey`). Keys are compared by their bytes, not their PEM text, so one key in
//! two layouts is one key. At most [`SIGNING_KEYS_MAX`] principals hold one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::axp::json_text;
use crate::axp::signature::PublicKey;
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::limits::SIGNING_KEYS_MAX;
use crate::log::change::{Record, StoredRecord, Table};
use crate::log::store::Store;
use crate::log::write_path::{Touched, Txn};

/// What a `SigningKey` record holds.
#[derive(Serialize, Deserialize)]
struct Stored {
    /// The key's 32 bytes, lowercase hex.
    ed25519: String,
}

fn read(value: &[u8]) -> Option<PublicKey> {
    let stored: Stored = serde_json::from_slice(value).ok()?;
    let s = stored.ed25519.as_bytes();
    if s.len() != 64 {
        return None;
    }
    let mut key = [0u8; 32];
    for (i, byte) in key.iter_mut().enumerate() {
        let pair = std::str::from_utf8(&s[2 * i..2 * i + 2]).ok()?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(PublicKey(key))
}

/// Principal id → its key. See the module docs.
#[derive(Default)]
pub(crate) struct SigningKeys {
    bound: BTreeMap<String, PublicKey>,
}

impl SigningKeys {
    /// The bindings the store holds; `Err(key)` names a record that cannot be read.
    pub(crate) fn load(records: &[StoredRecord]) -> Result<SigningKeys, String> {
        let mut bound = BTreeMap::new();
        for r in records.iter().filter(|r| r.table == Table::SigningKey) {
            let key = read(&r.value).ok_or_else(|| r.key.clone())?;
            bound.insert(r.key.clone(), key);
        }
        Ok(SigningKeys { bound })
    }

    /// Whether `principal` may sign with `key`: `-32009` if it is bound to another key,
    /// `-32043` if it has none and no room is left for one. Changes nothing.
    pub(crate) fn check(&self, principal: &str, key: PublicKey) -> Result<(), RpcError> {
        match self.bound.get(principal) {
            Some(bound) if *bound == key => Ok(()),
            Some(_) => Err(RpcError::forbidden(
                "This signing key doesn't match the one this principal signed with before",
            )),
            None if self.bound.len() >= SIGNING_KEYS_MAX => {
                Err(RpcError::limit("Signing key limit reached"))
            }
            None => Ok(()),
        }
    }

    /// Binds `key` to `principal` (which [`SigningKeys::check`] passed) in `txn`, and at once
    /// in memory; a key already bound writes nothing.
    pub(crate) fn bind(&mut self, txn: &mut Txn, principal: &str, key: PublicKey) {
        if self.bound.contains_key(principal) {
            return;
        }
        let stored = Stored {
            ed25519: key.to_hex(),
        };
        txn.records.push(Record::json(
            Table::SigningKey,
            principal,
            &json_text(&stored),
        ));
        txn.touched.push(Touched::SigningKey(principal.to_owned()));
        self.bound.insert(principal.to_owned(), key);
    }

    /// Rebuilds `principal`'s binding as the store and the changes in flight have it, after a
    /// failure.
    pub(crate) fn rebuild<S: Store>(&mut self, k: &mut Kernel<S>, principal: &str) {
        let stored = k
            .view()
            .record(Table::SigningKey, principal)
            .unwrap_or_else(|e| panic!("signing key of {principal} cannot be rebuilt: {e}"));
        match stored.as_deref().and_then(read) {
            Some(key) => {
                self.bound.insert(principal.to_owned(), key);
            }
            None => {
                self.bound.remove(principal);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_principal_keeps_its_first_key() {
        let mut keys = SigningKeys::default();
        let (a, b) = (PublicKey([1; 32]), PublicKey([2; 32]));
        assert!(keys.check("alice", a).is_ok());
        let mut txn = Txn::default();
        keys.bind(&mut txn, "alice", a);
        assert_eq!(txn.records.len(), 1);
        assert_eq!(txn.touched, vec![Touched::SigningKey("alice".into())]);
        assert!(keys.check("alice", a).is_ok());
        let e = keys.check("alice", b).expect_err("another key");
        assert_eq!(e.code, crate::error::PERMISSION_DENIED);
        // Bound already: nothing more to write.
        keys.bind(&mut txn, "alice", a);
        assert_eq!(txn.records.len(), 1);
        // What was written loads back.
        let r = &txn.records[0];
        let stored = StoredRecord {
            table: r.table,
            key: r.key.clone(),
            value: r.value.clone().expect("value"),
        };
        let loaded = SigningKeys::load(&[stored]).expect("load");
        assert_eq!(loaded.bound.get("alice"), Some(&a));
        assert!(SigningKeys::load(&[StoredRecord {
            table: Table::SigningKey,
            key: "x".into(),
            value: b"{\"ed25519\":\"zz\"}".to_vec().into(),
        }])
        .is_err());
    }

    #[test]
    fn the_table_of_keys_is_bounded() {
        let mut keys = SigningKeys::default();
        let mut txn = Txn::default();
        for i in 0..SIGNING_KEYS_MAX {
            keys.bind(&mut txn, &format!("p{i}"), PublicKey([0; 32]));
        }
        let e = keys.check("new", PublicKey([0; 32])).expect_err("full");
        assert_eq!(e.code, crate::error::LIMIT);
        // A principal that has its key still signs.
        assert!(keys.check("p0", PublicKey([0; 32])).is_ok());
    }
}
