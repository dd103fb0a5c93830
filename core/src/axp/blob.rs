//! AXP blobs: content-addressed bytes a session's executors and clients exchange by
//! reference (`axp-blob:/<encoded exchange>/<sha256>`).
//!
//! Identical content is stored once (`Table::Blob`, keyed by digest, raw bytes), however many
//! sessions hold it; access is per session (`Table::BlobAccess`, keyed
//! `<exchange>\n<digest>`), so knowing a digest grants nothing. The bytes are never loaded at
//! start and never enter the replay ring: the host keeps an index (digest → size, who may read
//! what) and reads a blob's bytes through the write path's view when asked, so a blob still
//! in flight is readable at once. Every blob and every access costs its index entry against
//! the storage quota, so tiny blobs are bounded like large ones.

use std::collections::BTreeMap;

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::ahp::sessions::Sessions;
use crate::axp::params::{valid_digest, BlobGetParams, BlobPutParams};
use crate::axp::state::BlobRef;
use crate::axp::{commit_and_broadcast, encode_uri_component, json_text, session_of, Done, Op};
use crate::channel::exchange_uri;
use crate::error::RpcError;
use crate::host::channels::{channel_allowed, percent_decode};
use crate::kernel::Kernel;
use crate::limits::BLOB_ENTRY_OVERHEAD_BYTES;
use crate::log::change::{Record, StoredRecord, Table};
use crate::log::store::Store;
use crate::log::write_path::{Touched, Txn};
use crate::principal::{Principal, Role};

/// What a `BlobAccess` record holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Access {
    media_type: String,
    size: u64,
}

/// The index of stored blobs and who may read them. See the module docs.
#[derive(Default)]
pub(crate) struct Blobs {
    /// Digest → (size, accesses holding it).
    stored: BTreeMap<String, (u64, usize)>,
    /// `(exchange, digest)` → media type.
    access: BTreeMap<(String, String), String>,
    /// Bytes and index entries charged against `blob_storage_bytes_max`.
    used: u64,
}

fn access_key(exchange: &str, digest: &str) -> String {
    format!("{exchange}\n{digest}")
}

/// The URI of blob `digest` in `exchange`.
pub(crate) fn blob_uri(exchange: &str, digest: &str) -> String {
    format!("axp-blob:/{}/{digest}", encode_uri_component(exchange))
}

impl Blobs {
    /// The index the store holds (from its access records; no bytes are read).
    pub(crate) fn load(records: &[StoredRecord]) -> Result<Blobs, String> {
        let mut blobs = Blobs::default();
        for r in records.iter().filter(|r| r.table == Table::BlobAccess) {
            let access: Access = serde_json::from_slice(&r.value).map_err(|_| r.key.clone())?;
            let (exchange, digest) = r.key.split_once('\n').ok_or_else(|| r.key.clone())?;
            blobs.add(exchange, digest, access);
        }
        Ok(blobs)
    }

    fn add(&mut self, exchange: &str, digest: &str, access: Access) {
        let key = (exchange.to_owned(), digest.to_owned());
        if self.access.contains_key(&key) {
            return;
        }
        let entry = self.stored.entry(digest.to_owned()).or_insert_with(|| {
            self.used += access.size + BLOB_ENTRY_OVERHEAD_BYTES;
            (access.size, 0)
        });
        entry.1 += 1;
        self.used += BLOB_ENTRY_OVERHEAD_BYTES;
        self.access.insert(key, access.media_type);
    }

    fn remove(&mut self, exchange: &str, digest: &str) {
        let key = (exchange.to_owned(), digest.to_owned());
        if self.access.remove(&key).is_none() {
            return;
        }
        self.used -= BLOB_ENTRY_OVERHEAD_BYTES;
        if let Some(entry) = self.stored.get_mut(digest) {
            entry.1 -= 1;
            if entry.1 == 0 {
                self.used -= entry.0 + BLOB_ENTRY_OVERHEAD_BYTES;
                self.stored.remove(digest);
            }
        }
    }

    /// Whether `exchange` may read blob `digest`.
    pub(crate) fn has(&self, exchange: &str, digest: &str) -> bool {
        self.access
            .contains_key(&(exchange.to_owned(), digest.to_owned()))
    }

    /// What the stored blobs take against the quota, in bytes.
    pub(crate) fn used(&self) -> u64 {
        self.used
    }

    /// Rebuilds access `key` as the store and the changes in flight have it, after a failure.
    pub(crate) fn rebuild<S: Store>(&mut self, k: &mut Kernel<S>, key: &str) {
        let Some((exchange, digest)) = key.split_once('\n') else {
            return;
        };
        let stored = k
            .view()
            .record(Table::BlobAccess, key)
            .unwrap_or_else(|e| panic!("blob access {key:?} cannot be rebuilt: {e}"));
        match stored.and_then(|v| serde_json::from_slice::<Access>(&v).ok()) {
            Some(access) => self.add(exchange, digest, access),
            None => self.remove(exchange, digest),
        }
    }

    /// `_axp/blobPut`: stores the bytes (once, whoever stored them first) and gives this
    /// session access to them.
    pub(crate) fn put<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        principal: &Principal,
        p: BlobPutParams,
        op: &Op,
    ) -> Result<Done, RpcError> {
        let exchange = exchange_uri(session_of(&p.channel)?);
        if principal.role == Role::Observer {
            return Err(RpcError::forbidden("Observers can't upload"));
        }
        // The reference decodes leniently and compares the re-encoding: only canonical
        // base64 (padded, no whitespace, zero trailing bits) round-trips exactly.
        let data = STANDARD
            .decode(p.data.as_bytes())
            .ok()
            .filter(|d| STANDARD.encode(d) == p.data)
            .ok_or_else(|| RpcError::invalid_params("Invalid base64 blob"))?;
        let size = data.len() as u64;
        if size > k.limits().blob_bytes_max {
            return Err(RpcError::limit("Blob size limit reached"));
        }
        let digest = crate::canonical::sha256_hex(&data);
        let new_blob = !self.stored.contains_key(&digest);
        let new_access = !self.has(&exchange, &digest);
        let cost = if new_blob {
            size + BLOB_ENTRY_OVERHEAD_BYTES
        } else {
            0
        } + if new_access {
            BLOB_ENTRY_OVERHEAD_BYTES
        } else {
            0
        };
        if self.used + cost > k.limits().blob_storage_bytes_max {
            return Err(RpcError::limit("Blob storage quota reached"));
        }
        let result = json_text(&json!({
            "uri": blob_uri(&exchange, &digest),
            "sha256": digest,
            "size": size,
            "mediaType": p.media_type,
        }));
        let mut txn = Txn::default();
        if new_blob {
            txn.records
                .push(Record::bytes(Table::Blob, digest.clone(), data.into()));
        }
        let access = Access {
            media_type: p.media_type,
            size,
        };
        if new_access {
            let key = access_key(&exchange, &digest);
            txn.records.push(Record::json(
                Table::BlobAccess,
                key.clone(),
                &json_text(&access),
            ));
            txn.touched.push(Touched::BlobAccess(key));
        }
        txn.receipts.push(op.receipt(&result));
        let change = commit_and_broadcast(k, txn);
        self.add(&exchange, &digest, access);
        Ok(Done { change, result })
    }

    /// The bytes of blob `digest` as `exchange` may read them, base64, with their media type;
    /// `-32008` when the session has no access.
    fn read<S: Store>(
        &self,
        k: &mut Kernel<S>,
        exchange: &str,
        digest: &str,
    ) -> Result<(String, String), RpcError> {
        let not_found = || RpcError::not_found("Blob not found in this session");
        let media_type = self
            .access
            .get(&(exchange.to_owned(), digest.to_owned()))
            .ok_or_else(not_found)?
            .clone();
        let bytes = k
            .view()
            .record(Table::Blob, digest)
            .map_err(|e| {
                tracing::warn!(error = %e, "blob read failed");
                RpcError::commit_failed()
            })?
            .ok_or_else(not_found)?;
        Ok((STANDARD.encode(&bytes), media_type))
    }

    /// `_axp/blobGet`.
    pub(crate) fn get<S: Store>(
        &self,
        k: &mut Kernel<S>,
        p: &BlobGetParams,
    ) -> Result<String, RpcError> {
        let exchange = exchange_uri(session_of(&p.channel)?);
        let (data, media_type) = self.read(k, &exchange, &p.digest)?;
        Ok(json_text(&json!({ "data": data, "mediaType": media_type })))
    }

    /// `resourceRead` of `axp-blob:/<encoded exchange>/<sha256>`: the owning session decides
    /// who may read it.
    pub(crate) fn resource_read<S: Store>(
        &self,
        k: &mut Kernel<S>,
        sessions: &Sessions,
        principal: &Principal,
        uri: &str,
    ) -> Result<String, RpcError> {
        let only_blobs = || RpcError::forbidden("Only AXP blob resources are readable");
        let (encoded, digest) = uri
            .strip_prefix("axp-blob:/")
            .and_then(|rest| rest.split_once('/'))
            .filter(|(c, d)| !c.is_empty() && valid_digest(d))
            .ok_or_else(only_blobs)?;
        let channel = percent_decode(encoded);
        channel_allowed(principal, &channel, sessions)?;
        let (data, media_type) = self.read(k, &channel, digest)?;
        Ok(json_text(&json!({
            "data": data,
            "contentType": media_type,
            "encoding": "base64",
        })))
    }
}

/// Every object inside `value` with a `uri` must reference a blob of this session (`prefix`
/// is `axp-blob:/<encoded exchange>/`) that the session may read.
pub(crate) fn check_refs(
    value: &Value,
    prefix: &str,
    has_blob: &dyn Fn(&str) -> bool,
) -> Result<(), RpcError> {
    match value {
        Value::Array(items) => items
            .iter()
            .try_for_each(|v| check_refs(v, prefix, has_blob)),
        Value::Object(map) => {
            if let Some(uri) = map.get("uri") {
                let digest = uri.as_str().and_then(|u| u.strip_prefix(prefix));
                let Some(digest) = digest else {
                    return Err(RpcError::forbidden(
                        "Executor content references must use session-owned blobs",
                    ));
                };
                let digest = digest.rsplit('/').next().unwrap_or(digest);
                if !has_blob(digest) {
                    return Err(RpcError::forbidden("Unknown content reference"));
                }
            }
            map.values()
                .try_for_each(|v| check_refs(v, prefix, has_blob))
        }
        _ => Ok(()),
    }
}

/// `Ok` when `r` names blob `r.sha256` of `exchange` by its exact URI and size (the media
/// type is the client's label and is not compared, as the reference does not).
pub(crate) fn check_blob(blobs: &Blobs, exchange: &str, r: &BlobRef) -> Result<(), RpcError> {
    let owned = blobs.has(exchange, &r.sha256)
        && blobs.stored.get(&r.sha256).map(|s| s.0) == Some(r.size)
        && r.uri == blob_uri(exchange, &r.sha256);
    if owned {
        Ok(())
    } else {
        Err(RpcError::forbidden(
            "Blob reference is missing or outside the session",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_counts_each_blob_once_and_each_access() {
        let mut b = Blobs::default();
        let a = |size| Access {
            media_type: "text/plain".into(),
            size,
        };
        b.add("axp-session:/s1", "d1", a(10));
        b.add("axp-session:/s2", "d1", a(10));
        b.add("axp-session:/s2", "d1", a(10));
        assert_eq!(b.used(), 10 + 3 * BLOB_ENTRY_OVERHEAD_BYTES);
        b.remove("axp-session:/s1", "d1");
        assert!(b.has("axp-session:/s2", "d1"));
        b.remove("axp-session:/s2", "d1");
        assert_eq!(b.used(), 0);
        assert!(b.stored.is_empty());
    }

    #[test]
    fn uris_encode_the_exchange_as_encode_uri_component_does() {
        assert_eq!(
            blob_uri("axp-session:/s-1.a_b", "ab"),
            "axp-blob:/axp-session%3A%2Fs-1.a_b/ab"
        );
    }

    #[test]
    fn references_must_name_this_sessions_blobs() {
        let prefix = "axp-blob:/axp-session%3A%2Fs/";
        let d = "a".repeat(64);
        let ok = json!({"part": {"uri": format!("{prefix}{d}")}});
        let has = |x: &str| x == d;
        assert!(check_refs(&ok, prefix, &has).is_ok());
        let other = json!([{"uri": format!("axp-blob:/axp-session%3A%2Fother/{d}")}]);
        assert_eq!(
            check_refs(&other, prefix, &has).map_err(|e| e.code),
            Err(crate::error::PERMISSION_DENIED)
        );
        let unknown = json!({"x": {"uri": format!("{prefix}{}", "b".repeat(64))}});
        assert!(check_refs(&unknown, prefix, &has).is_err());
        assert!(check_refs(&json!({"uri": 5}), prefix, &has).is_err());
    }
}
