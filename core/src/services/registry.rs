//! The client-service registry: who registered what, who may see it, and the catalog each
//! observer sees.
//!
//! A service belongs to the connection that registered it and vanishes with it. Its id is 128
//! random bits from the host's seeded generator, so a stale id never reaches a replacement.
//! Visibility: the owner's principal always; another principal only when both share a trust
//! group and the registration's `audience` (if any) names it. Everything that cannot see a
//! service is told "unknown service", exactly as for an id that never existed.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::hash::IdMap;
use crate::net::connection::ConnId;
use crate::principal::Principal;

/// One registered service.
#[derive(Debug)]
pub(crate) struct Service {
    pub(crate) owner: ConnId,
    pub(crate) client_id: String,
    pub(crate) principal: Arc<Principal>,
    /// The metadata object as received (bounded by `service_metadata_bytes_max`).
    pub(crate) metadata: Box<RawValue>,
    pub(crate) audience: Option<BTreeSet<String>>,
}

/// The registry: services by id, and by owning connection for cleanup.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    /// Looked up on every notification and request; only iterated (sorted) for the catalog.
    pub(crate) by_id: IdMap<String, Service>,
    by_conn: BTreeMap<ConnId, BTreeSet<String>>,
    /// Principal id → every principal it shares a trust group with (itself excluded).
    trusted: BTreeMap<String, BTreeSet<String>>,
}

impl Registry {
    pub(crate) fn new(trust_groups: &[Vec<String>]) -> Registry {
        let mut trusted: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for group in trust_groups {
            for a in group {
                for b in group {
                    if a != b {
                        trusted.entry(a.clone()).or_default().insert(b.clone());
                    }
                }
            }
        }
        Registry {
            trusted,
            ..Registry::default()
        }
    }

    /// Whether `viewer` may see and call `service`.
    pub(crate) fn visible(&self, service: &Service, viewer: &Principal) -> bool {
        // Connections of one credential share its `Principal`, so the pointer usually answers.
        if std::ptr::eq(&*service.principal, viewer) || service.principal.id == viewer.id {
            return true;
        }
        let shares_group = self
            .trusted
            .get(&service.principal.id)
            .is_some_and(|peers| peers.contains(&viewer.id));
        shares_group
            && service
                .audience
                .as_ref()
                .is_none_or(|a| a.contains(&viewer.id))
    }

    /// The service `id` if `viewer` may see it; `None` is indistinguishable from "no such id".
    pub(crate) fn lookup(&self, id: &str, viewer: &Principal) -> Option<&Service> {
        self.by_id.get(id).filter(|s| self.visible(s, viewer))
    }

    pub(crate) fn owned_by(&self, conn: ConnId) -> usize {
        self.by_conn.get(&conn).map_or(0, BTreeSet::len)
    }

    pub(crate) fn insert(&mut self, id: String, service: Service) {
        self.by_conn
            .entry(service.owner)
            .or_default()
            .insert(id.clone());
        self.by_id.insert(id, service);
    }

    pub(crate) fn remove(&mut self, id: &str) -> Option<Service> {
        let s = self.by_id.remove(id)?;
        if let Some(ids) = self.by_conn.get_mut(&s.owner) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_conn.remove(&s.owner);
            }
        }
        Some(s)
    }

    pub(crate) fn ids_of(&self, conn: ConnId) -> Vec<String> {
        self.by_conn
            .get(&conn)
            .map(|ids| ids.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The catalog state `viewer` sees: `{services: [...]}`, ordered by id.
    pub(crate) fn catalog_for(&self, viewer: &Principal) -> Value {
        let mut seen: Vec<(&String, &Service)> = self
            .by_id
            .iter()
            .filter(|(_, s)| self.visible(s, viewer))
            .collect();
        seen.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let services: Vec<Value> = seen.into_iter().map(|(id, s)| entry_json(id, s)).collect();
        json!({ "services": services })
    }
}

/// One catalog entry as observers see it.
pub(crate) fn entry_json(id: &str, s: &Service) -> Value {
    let metadata: Value = serde_json::from_str(s.metadata.get()).unwrap_or(Value::Null);
    json!({ "serviceId": id, "clientId": s.client_id, "principal": s.principal.id, "metadata": metadata })
}
