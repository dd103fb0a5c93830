//! Client services: registration, the observable catalog, and zero-acknowledgement
//! notifications.
//!
//! A service belongs to the connection that registered it and vanishes with it. Its id is 128
//! random bits from the host's seeded generator, so a stale id never reaches a replacement.
//! Visibility: the owner's principal always; another principal only when both share a trust
//! group and the registration's `audience` (if any) names it. Everything that cannot see a
//! service is told "unknown service", exactly as for an id that never existed.
//!
//! The notification path is one table lookup and one forwarded frame: the `params` bytes are
//! copied as received, nothing is allocated for bookkeeping, and nothing ever goes back to the
//! sender, whatever happens.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::rc::Rc;
use std::sync::Arc;

use rand::RngCore;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::channel::CATALOG;
use crate::connection::{ConnId, Enqueued, FrameClass};
use crate::error::RpcError;
use crate::hash::IdMap;
use crate::host::{parse_params, Host};
use crate::limits::{REQUEST_ID_BYTES_MAX, SERVICES_MAX, SERVICE_METADATA_DEPTH_MAX};
use crate::principal::Principal;
use crate::store::Store;
use crate::wire;

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
pub(crate) struct Services {
    /// Looked up on every notification and request; only iterated (sorted) for the catalog.
    pub(crate) by_id: IdMap<String, Service>,
    by_conn: BTreeMap<ConnId, BTreeSet<String>>,
    /// Principal id → every principal it shares a trust group with (itself excluded).
    trusted: BTreeMap<String, BTreeSet<String>>,
}

impl Services {
    pub(crate) fn new(trust_groups: &[Vec<String>]) -> Services {
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
        Services {
            trusted,
            ..Services::default()
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

    fn insert(&mut self, id: String, service: Service) {
        self.by_conn
            .entry(service.owner)
            .or_default()
            .insert(id.clone());
        self.by_id.insert(id, service);
    }

    fn remove(&mut self, id: &str) -> Option<Service> {
        let s = self.by_id.remove(id)?;
        if let Some(ids) = self.by_conn.get_mut(&s.owner) {
            ids.remove(id);
            if ids.is_empty() {
                self.by_conn.remove(&s.owner);
            }
        }
        Some(s)
    }

    fn ids_of(&self, conn: ConnId) -> Vec<String> {
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
fn entry_json(id: &str, s: &Service) -> Value {
    let metadata: Value = serde_json::from_str(s.metadata.get()).unwrap_or(Value::Null);
    json!({ "serviceId": id, "clientId": s.client_id, "principal": s.principal.id, "metadata": metadata })
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

pub(crate) use crate::wire::NotifyParams;

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

impl<S: Store> Host<S> {
    /// `InitializeResult._meta["x-client-services"]`.
    pub(crate) fn services_capability(&self) -> Value {
        let l = &self.config.limits;
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

    fn check_metadata(&self, metadata: &RawValue) -> Result<(), RpcError> {
        if !metadata.get().starts_with('{') {
            return Err(RpcError::invalid_params("metadata must be a JSON object"));
        }
        if metadata.get().len() > self.config.limits.service_metadata_bytes_max as usize {
            return Err(RpcError::limit("Service metadata is too large"));
        }
        // Catalog frames wrap metadata five levels deep; JSON parsers (serde_json among them)
        // stop at 128 levels, so deep metadata would make every observer's snapshot unreadable.
        if wire::json_depth(metadata.get()) > SERVICE_METADATA_DEPTH_MAX {
            return Err(RpcError::invalid_params(format!(
                "metadata nests too deeply (at most {SERVICE_METADATA_DEPTH_MAX} levels)"
            )));
        }
        Ok(())
    }

    fn check_audience(
        audience: &Option<Vec<String>>,
    ) -> Result<Option<BTreeSet<String>>, RpcError> {
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

    /// A fresh, never-seen service id: 128 bits from the seeded generator.
    fn new_service_id(&mut self) -> String {
        loop {
            let mut b = [0u8; 16];
            self.rng.fill_bytes(&mut b);
            let id: String = std::iter::once("svc_".to_owned())
                .chain(b.iter().map(|x| format!("{x:02x}")))
                .collect();
            if !self.services.by_id.contains_key(&id) {
                return id;
            }
        }
    }

    pub(crate) fn register_service(
        &mut self,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        let p: RegisterParams<'_> = parse_params(params)?;
        check_channel(&p.channel)?;
        self.check_metadata(p.metadata)?;
        let audience = Self::check_audience(&p.audience)?;
        if self.services.owned_by(conn) >= self.config.limits.services_per_conn_max as usize {
            return Err(RpcError::limit("Service registration limit reached"));
        }
        // The per-connection cap alone lets one principal with many connections fill memory,
        // and every catalog snapshot, with services.
        if self.services.by_id.len() >= SERVICES_MAX {
            return Err(RpcError::limit(
                "Service registration limit reached for this host",
            ));
        }
        let principal = self.principal(conn)?;
        let client_id = self.client_id(conn).unwrap_or_default();
        self.reserve_ahead()?;
        let id = self.new_service_id();
        let before = self.visibility_of(None);
        let service = Service {
            owner: conn,
            client_id,
            principal,
            metadata: p.metadata.to_owned(),
            audience,
        };
        self.services.insert(id.clone(), service);
        self.announce(&id, before);
        Ok(json!({ "serviceId": id }).to_string())
    }

    pub(crate) fn update_service(
        &mut self,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        let p: UpdateParams<'_> = parse_params(params)?;
        check_channel(&p.channel)?;
        self.owned_service(conn, &p.service_id)?;
        if let Some(m) = p.metadata {
            self.check_metadata(m)?;
        }
        let audience = match &p.audience {
            Some(a) => Some(Self::check_audience(a)?),
            None => None,
        };
        self.reserve_ahead()?;
        let before = self.visibility_of(Some(&p.service_id));
        if let Some(s) = self.services.by_id.get_mut(p.service_id.as_ref()) {
            if let Some(m) = p.metadata {
                s.metadata = m.to_owned();
            }
            if let Some(a) = audience {
                s.audience = a;
            }
        }
        self.announce(&p.service_id, before);
        Ok("{}".into())
    }

    pub(crate) fn unregister_service(
        &mut self,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        let p: ServiceIdParams<'_> = parse_params(params)?;
        check_channel(&p.channel)?;
        self.owned_service(conn, &p.service_id)?;
        self.reserve_ahead()?;
        self.remove_service(&p.service_id);
        Ok("{}".into())
    }

    /// Checks that `conn` owns `id`; an invisible service is "unknown", a visible one owned by
    /// another connection is "not yours".
    fn owned_service(&self, conn: ConnId, id: &str) -> Result<(), RpcError> {
        let principal = self.principal(conn)?;
        match self.services.lookup(id, &principal) {
            None => Err(RpcError::not_found("Unknown service")),
            Some(s) if s.owner != conn => Err(RpcError::forbidden(
                "Only the connection that registered a service can change it",
            )),
            Some(_) => Ok(()),
        }
    }

    /// Removes a service, fails its pending requests and tells observers. Never fails: when no
    /// catalog number can be reserved the observers are closed instead of misinformed.
    pub(crate) fn remove_service(&mut self, id: &str) {
        if !self.services.by_id.contains_key(id) {
            return;
        }
        let before = self.visibility_of(Some(id));
        self.services.remove(id);
        self.fail_service_requests(id);
        if self.reserve_ahead().is_err() {
            // Without a durable number we cannot send a sequenced removal; observers must
            // re-snapshot, which closing them forces.
            for conn in before.before.iter().filter(|(_, v)| **v).map(|(c, _)| *c) {
                self.conns.close(
                    &mut self.outbox,
                    conn,
                    crate::output::CloseCode::Policy,
                    "Catalog changed; reconnect",
                );
            }
            return;
        }
        self.announce(id, before);
    }

    /// Drops every service `conn` registered (it disconnected).
    pub(crate) fn remove_services_of(&mut self, conn: ConnId) {
        for id in self.services.ids_of(conn) {
            self.remove_service(&id);
        }
    }

    /// For every catalog observer: can it see service `id` now?
    fn visibility_of(&self, id: Option<&str>) -> Visibility {
        let mut before = BTreeMap::new();
        for conn in self.conns.subscribers(CATALOG) {
            let visible = match (
                id.and_then(|id| self.services.by_id.get(id)),
                self.conns.get(conn),
            ) {
                (Some(s), Some(c)) => self.services.visible(s, &c.principal),
                _ => false,
            };
            before.insert(conn, visible);
        }
        Visibility { before }
    }

    /// Sends each observer what changed for it: added, updated or removed, under one new
    /// `serverSeq`. Observers that could not and cannot see the service get nothing.
    fn announce(&mut self, id: &str, before: Visibility) {
        let mut frames: [Option<crate::Frame>; 3] = [None, None, None];
        let observers = self.conns.subscribers(CATALOG);
        let mut seq = None;
        for conn in observers {
            let was = before.before.get(&conn).copied().unwrap_or(false);
            let is = match (self.services.by_id.get(id), self.conns.get(conn)) {
                (Some(s), Some(c)) => self.services.visible(s, &c.principal),
                _ => false,
            };
            let (slot, action) = match (was, is) {
                (false, false) => continue,
                (false, true) => (0, "x-clientServices/serviceAdded"),
                (true, true) => (1, "x-clientServices/serviceUpdated"),
                (true, false) => (2, "x-clientServices/serviceRemoved"),
            };
            let seq = *seq.get_or_insert_with(|| self.seq.next_ephemeral());
            // Covered by a durable mark (0), or waiting for the change reserving it.
            let dep = self.seq.ephemeral_dep(seq);
            if frames[slot].is_none() {
                let action = match (slot, self.services.by_id.get(id)) {
                    (2, _) | (_, None) => json!({ "type": action, "serviceId": id }),
                    (_, Some(s)) => json!({ "type": action, "service": entry_json(id, s) }),
                };
                let envelope = json!({ "channel": CATALOG, "action": action, "serverSeq": seq });
                frames[slot] = Some(wire::notification_frame("action", &envelope.to_string()));
            }
            if let Some(f) = &frames[slot] {
                let order = self
                    .write
                    .order_after(dep, crate::connection::Fail::CloseObserver);
                self.enqueue(conn, f.clone(), FrameClass::State, order);
            }
        }
    }

    /// `clientService/notify` from the general path: forward once or drop silently. Never a reply.
    pub(crate) fn notify_service(&mut self, conn: ConnId, params: Option<&RawValue>) {
        let parsed = params
            .and_then(|p| serde_json::from_str::<NotifyParams<'_>>(p.get()).ok())
            .filter(|p| wire::payload_depth_ok(p.params.get()));
        self.forward_notify(conn, parsed);
    }

    /// Forwards parsed notify params once, or drops them, counting either.
    pub(crate) fn forward_notify(&mut self, conn: ConnId, params: Option<NotifyParams<'_>>) {
        let Some(frame) = self.notification_frame_for(conn, params) else {
            self.stats.notifications_dropped += 1;
            return;
        };
        let (owner, frame) = frame;
        match self.conns.enqueue(
            &mut self.outbox,
            owner,
            frame,
            FrameClass::Droppable,
            &self.config.limits,
            crate::connection::Order::Unordered,
        ) {
            Enqueued::Queued => self.stats.notifications_forwarded += 1,
            _ => self.stats.notifications_dropped += 1,
        }
    }

    /// Validates a notify and builds the forwarded frame, or `None` to drop it.
    fn notification_frame_for(
        &mut self,
        conn: ConnId,
        params: Option<NotifyParams<'_>>,
    ) -> Option<(ConnId, crate::Frame)> {
        let p = params?;
        let limits = &self.config.limits;
        if p.channel != CATALOG
            || p.method.is_empty()
            || p.method.len() > limits.service_method_bytes_max as usize
            || p.params.get().len() > limits.service_payload_bytes_max as usize
        {
            return None;
        }
        let c = self.conns.get(conn)?;
        let sender = match &c.phase {
            crate::connection::Phase::Ready { client_id } => client_id,
            crate::connection::Phase::Handshake => return None,
        };
        let service = self.services.lookup(&p.service_id, &c.principal)?;
        let buffer = self.frame_pool.take();
        Some((
            service.owner,
            forward_frame(
                buffer,
                "clientService/notification",
                None,
                &p.service_id,
                sender,
                &p.method,
                p.params.get(),
            ),
        ))
    }
}

/// Builds `{"jsonrpc":"2.0",["id":ID,]"method":M,"params":{"channel":..,"serviceId":..,
/// "senderClientId":..,"method":..,"params":RAW}}` in one buffer, copying `params` as received.
/// Builds the frame a service owner receives, in `buffer` (fresh, or from the frame pool).
/// `service_id` must be a registered id and `sender` a bound client id: both are plain ASCII by
/// construction (`new_service_id`, `channel::valid_id`), so they are written without escaping.
pub(crate) fn forward_frame(
    mut buffer: Rc<Vec<u8>>,
    wire_method: &str,
    id: Option<u64>,
    service_id: &str,
    sender: &str,
    method: &str,
    raw: &str,
) -> crate::Frame {
    let need = 160 + service_id.len() + sender.len() + method.len() + raw.len();
    // Pool buffers are never shared; `make_mut` copies only if that ever changes.
    let out = Rc::make_mut(&mut buffer);
    out.clear();
    out.reserve(need);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",");
    if let Some(id) = id {
        out.extend_from_slice(format!("\"id\":{id},").as_bytes());
    }
    out.extend_from_slice(b"\"method\":\"");
    out.extend_from_slice(wire_method.as_bytes());
    out.extend_from_slice(b"\",\"params\":{\"channel\":\"x-client-services://\",\"serviceId\":");
    push_plain_str(out, service_id);
    out.extend_from_slice(b",\"senderClientId\":");
    push_plain_str(out, sender);
    out.extend_from_slice(b",\"method\":");
    push_json_str(out, method);
    out.extend_from_slice(b",\"params\":");
    out.extend_from_slice(raw.as_bytes());
    out.extend_from_slice(b"}}");
    crate::Frame::from_pool(buffer)
}

/// Appends an id known to need no escapes (a service id or a client id) as a JSON string.
fn push_plain_str(out: &mut Vec<u8>, s: &str) {
    debug_assert!(
        crate::channel::valid_id(s),
        "an id that needs escaping: {} bytes",
        s.len()
    );
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// Appends `s` as a JSON string literal.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Only quotes, backslashes and control characters need escapes (UTF-8 goes through as is).
    // No early exit, so the check runs over whole words (ids are short; this is the hot path).
    let plain = s.bytes().fold(true, |plain, b| {
        plain & (b >= 0x20) & (b != b'"') & (b != b'\\')
    });
    if plain {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(Value::from(s).to_string().as_bytes());
    }
}
