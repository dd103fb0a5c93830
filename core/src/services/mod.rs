//! Client services (`../shared/spec/client-services-rfc.txt`): registration, the observable
//! catalog, zero-acknowledgement notifications ([`notify`]) and routed requests ([`relay`]).
//!
//! Nothing here is durable: registrations are bound to their connection and vanish with it.
//! The one thing this component takes from the write path is numbers: catalog events carry
//! `serverSeq` like every event, from blocks the kernel reserves ahead, so an observer's
//! numbers never go backwards, even across a restart.

pub(crate) mod notify;
pub(crate) mod registry;
pub(crate) mod relay;

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::channel::CATALOG;
use crate::error::RpcError;
use crate::host::parse_params;
use crate::kernel::Kernel;
use crate::limits::{REQUEST_ID_BYTES_MAX, SERVICES_MAX, SERVICE_METADATA_DEPTH_MAX};
use crate::log::store::Store;
use crate::net::connection::ConnId;
use crate::net::jsonrpc;
use crate::net::output::{CloseCode, Frame};
use crate::principal::Principal;
use registry::{entry_json, Registry, Service};
use relay::Relay;

/// Wire names of the extension, advertised in `initialize`.
pub const METHODS: &[&str] = &[
    "client/registerService",
    "client/updateService",
    "client/unregisterService",
    "clientService/notify",
    "clientService/request",
    "$/cancelRequest",
];

/// The `_meta` key advertising the extension.
pub const CAPABILITY: &str = "x-client-services";

/// The client-services component: the registry and the request relay.
pub(crate) struct ClientServices {
    pub(crate) registry: Registry,
    pub(crate) relay: Relay,
}

#[derive(Deserialize)]
struct RegisterParams<'a> {
    channel: Cow<'a, str>,
    #[serde(borrow)]
    metadata: &'a RawValue,
    #[serde(default)]
    audience: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct UpdateParams<'a> {
    channel: Cow<'a, str>,
    service_id: Cow<'a, str>,
    #[serde(borrow, default)]
    metadata: Option<&'a RawValue>,
    /// `Some(None)` clears the audience (`"audience": null`).
    #[serde(default, deserialize_with = "double_option")]
    audience: Option<Option<Vec<String>>>,
}

fn double_option<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<Option<Vec<String>>>, D::Error> {
    Option::<Vec<String>>::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ServiceIdParams<'a> {
    channel: Cow<'a, str>,
    service_id: Cow<'a, str>,
}

/// What one catalog change looked like to observers: visible before, visible after.
struct Visibility {
    before: BTreeMap<ConnId, bool>,
}

fn check_channel(channel: &str) -> Result<(), RpcError> {
    if channel == CATALOG {
        Ok(())
    } else {
        Err(RpcError::invalid_params(
            "Client-service messages belong on x-client-services://",
        ))
    }
}

fn check_audience(audience: &Option<Vec<String>>) -> Result<Option<BTreeSet<String>>, RpcError> {
    match audience {
        None => Ok(None),
        Some(list) if list.len() <= 256 && list.iter().all(|p| crate::channel::valid_id(p)) => {
            Ok(Some(list.iter().cloned().collect()))
        }
        Some(_) => Err(RpcError::invalid_params(
            "audience must be a list of at most 256 principal ids",
        )),
    }
}

impl ClientServices {
    pub(crate) fn new(trust_groups: &[Vec<String>]) -> ClientServices {
        ClientServices {
            registry: Registry::new(trust_groups),
            relay: Relay::default(),
        }
    }

    /// `InitializeResult._meta["x-client-services"]`.
    pub(crate) fn capability<S: Store>(k: &Kernel<S>) -> Value {
        let l = k.limits();
        json!({
            "version": 1,
            "methods": METHODS,
            "limits": {
                "metadataBytes": l.service_metadata_bytes_max,
                "methodBytes": l.service_method_bytes_max,
                "payloadBytes": l.service_payload_bytes_max,
                "errorDataBytes": l.service_error_data_bytes_max,
                "servicesPerConnection": l.services_per_conn_max,
                "requestsInFlightPerConnection": l.relays_per_conn_max,
                "requestsInFlightPerService": l.relays_per_service_max,
                "requestTimeoutMs": l.relay_timeout_ms,
                "requestTimeoutMsMax": l.relay_timeout_ms_max,
                "notificationQueueBytes": l.queue_bytes_soft,
                "servicesPerHost": SERVICES_MAX,
                "requestIdBytes": REQUEST_ID_BYTES_MAX,
            }
        })
    }

    /// The catalog as `viewer` sees it.
    pub(crate) fn catalog_for(&self, viewer: &Principal) -> Value {
        self.registry.catalog_for(viewer)
    }

    /// A request to this component: `client/*` registration calls and `clientService/request`.
    /// Answers go out at once: nothing here waits for the disk.
    pub(crate) fn handle_request<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        id: &str,
        method: &str,
        params: Option<&RawValue>,
    ) {
        let outcome = match method {
            "client/registerService" => self.register(k, conn, params),
            "client/updateService" => self.update(k, conn, params),
            "client/unregisterService" => self.unregister(k, conn, params),
            "clientService/request" => match self.request(k, conn, id, params) {
                // The answer comes later, from the service or the relay.
                Ok(()) => return,
                Err(e) => Err(e),
            },
            _ => Err(RpcError::new(
                crate::error::METHOD_NOT_FOUND,
                "Unknown method",
            )),
        };
        match outcome {
            Ok(result) => k.reply_now(conn, jsonrpc::result_frame(id, &result)),
            Err(e) => k.reply_error_now(conn, id, &e),
        }
    }

    /// A notification to this component: `clientService/notify` and `$/cancelRequest`.
    pub(crate) fn handle_notification<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        method: &str,
        params: Option<&RawValue>,
    ) {
        match method {
            "clientService/notify" => self.notify_service(k, conn, params),
            "$/cancelRequest" => self.cancel_request(k, conn, params),
            _ => k.stats_mut().notifications_dropped += 1,
        }
    }

    /// Releases what a closing connection holds: its relayed requests and its services.
    pub(crate) fn forget<S: Store>(&mut self, k: &mut Kernel<S>, conn: ConnId) {
        self.release_caller(k, conn);
        for id in self.registry.ids_of(conn) {
            self.remove_service(k, &id);
        }
    }

    fn check_metadata<S: Store>(k: &Kernel<S>, metadata: &RawValue) -> Result<(), RpcError> {
        if !metadata.get().starts_with('{') {
            return Err(RpcError::invalid_params("metadata must be a JSON object"));
        }
        if metadata.get().len() > k.limits().service_metadata_bytes_max as usize {
            return Err(RpcError::limit("Service metadata is too large"));
        }
        // Catalog frames wrap metadata five levels deep; JSON parsers (serde_json among them)
        // stop at 128 levels, so deep metadata would make every observer's snapshot unreadable.
        if jsonrpc::json_depth(metadata.get()) > SERVICE_METADATA_DEPTH_MAX {
            return Err(RpcError::invalid_params(format!(
                "metadata nests too deeply (at most {SERVICE_METADATA_DEPTH_MAX} levels)"
            )));
        }
        Ok(())
    }

    /// A fresh, never-seen service id: 128 bits from the seeded generator.
    fn new_service_id<S: Store>(&self, k: &mut Kernel<S>) -> String {
        loop {
            let mut b = [0u8; 16];
            k.random_bytes(&mut b);
            let id = format!("svc_{}", crate::canonical::hex(&b));
            if !self.registry.by_id.contains_key(&id) {
                return id;
            }
        }
    }

    fn register<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        let p: RegisterParams<'_> = parse_params(params)?;
        check_channel(&p.channel)?;
        Self::check_metadata(k, p.metadata)?;
        let audience = check_audience(&p.audience)?;
        if self.registry.owned_by(conn) >= k.limits().services_per_conn_max as usize {
            return Err(RpcError::limit("Service registration limit reached"));
        }
        // The per-connection cap alone lets one principal with many connections fill memory,
        // and every catalog snapshot, with services.
        if self.registry.by_id.len() >= SERVICES_MAX {
            return Err(RpcError::limit(
                "Service registration limit reached for this host",
            ));
        }
        let principal = k.principal(conn)?;
        let client_id = k.client_id(conn).unwrap_or_default().to_owned();
        k.reserve_ahead()?;
        let id = self.new_service_id(k);
        let before = self.visibility_of(k, None);
        let service = Service {
            owner: conn,
            client_id,
            principal,
            metadata: p.metadata.to_owned(),
            audience,
        };
        self.registry.insert(id.clone(), service);
        self.announce(k, &id, before);
        Ok(json!({ "serviceId": id }).to_string())
    }

    fn update<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        let p: UpdateParams<'_> = parse_params(params)?;
        check_channel(&p.channel)?;
        self.owned_service(k, conn, &p.service_id)?;
        if let Some(m) = p.metadata {
            Self::check_metadata(k, m)?;
        }
        let audience = match &p.audience {
            Some(a) => Some(check_audience(a)?),
            None => None,
        };
        k.reserve_ahead()?;
        let before = self.visibility_of(k, Some(&p.service_id));
        if let Some(s) = self.registry.by_id.get_mut(p.service_id.as_ref()) {
            if let Some(m) = p.metadata {
                s.metadata = m.to_owned();
            }
            if let Some(a) = audience {
                s.audience = a;
            }
        }
        self.announce(k, &p.service_id, before);
        Ok("{}".into())
    }

    fn unregister<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        let p: ServiceIdParams<'_> = parse_params(params)?;
        check_channel(&p.channel)?;
        self.owned_service(k, conn, &p.service_id)?;
        k.reserve_ahead()?;
        self.remove_service(k, &p.service_id);
        Ok("{}".into())
    }

    /// Checks that `conn` owns `id`; an invisible service is "unknown", a visible one owned by
    /// another connection is "not yours".
    fn owned_service<S: Store>(
        &self,
        k: &Kernel<S>,
        conn: ConnId,
        id: &str,
    ) -> Result<(), RpcError> {
        let principal = k.principal(conn)?;
        match self.registry.lookup(id, &principal) {
            None => Err(RpcError::not_found("Unknown service")),
            Some(s) if s.owner != conn => Err(RpcError::forbidden(
                "Only the connection that registered a service can change it",
            )),
            Some(_) => Ok(()),
        }
    }

    /// Removes a service, fails its pending requests and tells observers. Never fails: when no
    /// catalog number can be reserved the observers are closed instead of misinformed.
    fn remove_service<S: Store>(&mut self, k: &mut Kernel<S>, id: &str) {
        if !self.registry.by_id.contains_key(id) {
            return;
        }
        let before = self.visibility_of(k, Some(id));
        self.registry.remove(id);
        self.fail_service_requests(k, id);
        if k.reserve_ahead().is_err() {
            // Without a number we cannot send a sequenced removal; observers must re-snapshot,
            // which closing them forces.
            for conn in before.before.iter().filter(|(_, v)| **v).map(|(c, _)| *c) {
                k.close(conn, CloseCode::Policy, "Catalog changed; reconnect");
            }
            return;
        }
        self.announce(k, id, before);
    }

    /// For every catalog observer: can it see service `id` now?
    fn visibility_of<S: Store>(&self, k: &Kernel<S>, id: Option<&str>) -> Visibility {
        let mut before = BTreeMap::new();
        for conn in k.subscribers(CATALOG) {
            let visible = match (id.and_then(|id| self.registry.by_id.get(id)), k.conn(conn)) {
                (Some(s), Some(c)) => self.registry.visible(s, &c.principal),
                _ => false,
            };
            before.insert(conn, visible);
        }
        Visibility { before }
    }

    /// Sends each observer what changed for it: added, updated or removed, under one new
    /// `serverSeq`. Observers that could not and cannot see the service get nothing.
    fn announce<S: Store>(&mut self, k: &mut Kernel<S>, id: &str, before: Visibility) {
        let mut frames: [Option<Frame>; 3] = [None, None, None];
        let mut numbered = None;
        for conn in k.subscribers(CATALOG) {
            let was = before.before.get(&conn).copied().unwrap_or(false);
            let is = match (self.registry.by_id.get(id), k.conn(conn)) {
                (Some(s), Some(c)) => self.registry.visible(s, &c.principal),
                _ => false,
            };
            let (slot, action) = match (was, is) {
                (false, false) => continue,
                (false, true) => (0, "x-clientServices/serviceAdded"),
                (true, true) => (1, "x-clientServices/serviceUpdated"),
                (true, false) => (2, "x-clientServices/serviceRemoved"),
            };
            let (seq, dep) = *numbered.get_or_insert_with(|| k.next_ephemeral());
            if frames[slot].is_none() {
                let action = match (slot, self.registry.by_id.get(id)) {
                    (2, _) | (_, None) => json!({ "type": action, "serviceId": id }),
                    (_, Some(s)) => json!({ "type": action, "service": entry_json(id, s) }),
                };
                let envelope = json!({ "channel": CATALOG, "action": action, "serverSeq": seq });
                frames[slot] = Some(jsonrpc::notification_frame("action", &envelope.to_string()));
            }
            if let Some(f) = &frames[slot] {
                k.push_catalog(conn, f.clone(), dep);
            }
        }
    }

    /// (A) Registered services.
    pub(crate) fn service_count(&self) -> usize {
        self.registry.by_id.len()
    }
}
