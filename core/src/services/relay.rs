//! Routed requests: `clientService/request` → `clientService/handleRequest` → one outcome back.
//!
//! The host allocates its own numeric id for every forwarded request and keeps exactly one
//! pending entry `(host id → caller connection, caller id, service, owner, deadline)`. Every way a
//! request can end (result, error, timeout, cancellation, caller or owner gone, unregistration)
//! goes through `complete`, which removes the entry first: a request completes at most once, and
//! late, duplicate or foreign responses find nothing and are dropped. No retries, ever.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::channel::CATALOG;
use crate::error::{RpcError, INTERNAL_ERROR, INVALID_REQUEST};
use crate::host::parse_params;
use crate::kernel::time::{Instant, Timer};
use crate::kernel::Kernel;
use crate::limits::SERVICE_PAYLOAD_DEPTH_MAX;
use crate::log::store::Store;
use crate::net::connection::{ConnId, Enqueued, Phase};
use crate::net::jsonrpc;
use crate::services::notify::forward_frame;
use crate::services::ClientServices;

/// `-32050`: the service did not answer in time.
pub const TIMEOUT: i64 = -32050;
/// `-32051`: the service was unregistered or disconnected while the request was pending.
pub const SERVICE_GONE: i64 = -32051;
/// `-32800`: the caller cancelled the request.
pub const CANCELLED: i64 = -32800;

/// One forwarded request waiting for its outcome.
#[derive(Debug)]
pub(crate) struct Pending {
    caller: ConnId,
    /// The caller's id as raw JSON, echoed in the answer.
    caller_id: String,
    service_id: String,
    owner: ConnId,
    deadline: Instant,
}

/// The relay table and its indexes. Invariant: every index mirrors `pending` exactly.
#[derive(Debug, Default)]
pub(crate) struct Relay {
    next_id: u64,
    pending: BTreeMap<u64, Pending>,
    by_caller: BTreeMap<ConnId, BTreeMap<String, u64>>,
    by_service: BTreeMap<String, BTreeSet<u64>>,
}

impl Relay {
    pub(crate) fn len(&self) -> usize {
        self.pending.len()
    }

    fn insert(&mut self, p: Pending) -> u64 {
        // `Host::on_request` refuses longer ids; each is kept twice (here and in `by_caller`).
        debug_assert!(p.caller_id.len() <= crate::limits::REQUEST_ID_BYTES_MAX);
        self.next_id += 1;
        let id = self.next_id;
        self.by_caller
            .entry(p.caller)
            .or_default()
            .insert(p.caller_id.clone(), id);
        self.by_service
            .entry(p.service_id.clone())
            .or_default()
            .insert(id);
        self.pending.insert(id, p);
        id
    }

    fn remove(&mut self, id: u64) -> Option<Pending> {
        let p = self.pending.remove(&id)?;
        if let Some(m) = self.by_caller.get_mut(&p.caller) {
            m.remove(&p.caller_id);
            if m.is_empty() {
                self.by_caller.remove(&p.caller);
            }
        }
        if let Some(s) = self.by_service.get_mut(&p.service_id) {
            s.remove(&id);
            if s.is_empty() {
                self.by_service.remove(&p.service_id);
            }
        }
        debug_assert_eq!(
            self.pending.len(),
            self.by_service.values().map(BTreeSet::len).sum::<usize>()
        );
        Some(p)
    }

    fn of_caller(&self, conn: ConnId) -> Vec<u64> {
        self.by_caller
            .get(&conn)
            .map(|m| m.values().copied().collect())
            .unwrap_or_default()
    }

    fn of_service(&self, service_id: &str) -> Vec<u64> {
        self.by_service
            .get(service_id)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default()
    }

    fn count_for_caller(&self, conn: ConnId) -> usize {
        self.by_caller.get(&conn).map_or(0, BTreeMap::len)
    }

    fn count_for_service(&self, service_id: &str) -> usize {
        self.by_service.get(service_id).map_or(0, BTreeSet::len)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestParams<'a> {
    channel: Cow<'a, str>,
    service_id: Cow<'a, str>,
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: &'a RawValue,
    #[serde(default)]
    timeout_ms: Option<u64>,
}

#[derive(Deserialize)]
struct CancelParams<'a> {
    channel: Cow<'a, str>,
    #[serde(borrow)]
    id: &'a RawValue,
}

#[derive(Deserialize)]
struct ErrorObject<'a> {
    code: i64,
    #[serde(borrow)]
    message: Cow<'a, str>,
    #[serde(borrow, default)]
    data: Option<&'a RawValue>,
}

/// How a pending request ended.
enum Outcome<'a> {
    Result(&'a RawValue),
    Error(RpcError),
}

impl ClientServices {
    /// `clientService/request`. Answers now only on refusal; otherwise the answer comes later.
    pub(crate) fn request<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        caller_id: &str,
        params: Option<&RawValue>,
    ) -> Result<(), RpcError> {
        let p: RequestParams<'_> = parse_params(params)?;
        let limits = k.limits();
        let (per_conn, per_service) = (limits.relays_per_conn_max, limits.relays_per_service_max);
        if p.channel != CATALOG {
            return Err(RpcError::invalid_params(
                "Client-service messages belong on x-client-services://",
            ));
        }
        if p.method.is_empty() || p.method.len() > limits.service_method_bytes_max as usize {
            return Err(RpcError::invalid_params("method must be 1 to 256 bytes"));
        }
        if p.params.get().len() > limits.service_payload_bytes_max as usize {
            return Err(RpcError::limit("Request params are too large"));
        }
        if !jsonrpc::payload_depth_ok(p.params.get()) {
            return Err(RpcError::invalid_params(format!(
                "Request params nest too deeply (at most {SERVICE_PAYLOAD_DEPTH_MAX} levels)"
            )));
        }
        if p.timeout_ms == Some(0) {
            return Err(RpcError::invalid_params("timeoutMs must be positive"));
        }
        let timeout_ms = p
            .timeout_ms
            .unwrap_or(limits.relay_timeout_ms)
            .min(limits.relay_timeout_ms_max);
        let principal = k.principal(conn)?;
        let sender = match k.conn(conn).map(|c| &c.phase) {
            Some(Phase::Ready { client_id }) => client_id.clone(),
            _ => return Err(RpcError::forbidden("Initialize before using services")),
        };
        let Some(service) = self.registry.lookup(&p.service_id, &principal) else {
            return Err(RpcError::not_found("Unknown service"));
        };
        let owner = service.owner;
        if self
            .relay
            .by_caller
            .get(&conn)
            .is_some_and(|m| m.contains_key(caller_id))
        {
            return Err(RpcError::new(
                INVALID_REQUEST,
                "A request with this id is already pending",
            ));
        }
        if self.relay.count_for_caller(conn) >= per_conn as usize
            || self.relay.count_for_service(&p.service_id) >= per_service as usize
        {
            return Err(RpcError::limit("Too many requests in flight"));
        }
        let deadline = k.now().mono.plus_ms(timeout_ms);
        let host_id = self.relay.insert(Pending {
            caller: conn,
            caller_id: caller_id.to_owned(),
            service_id: p.service_id.to_string(),
            owner,
            deadline,
        });
        let frame = forward_frame(
            k.frame_buffer(),
            "clientService/handleRequest",
            Some(host_id),
            &p.service_id,
            &sender,
            &p.method,
            p.params.get(),
        );
        match k.pass(owner, frame) {
            Enqueued::Queued => {
                k.arm(Timer::Relay(host_id), deadline);
                k.stats_mut().requests_relayed += 1;
                Ok(())
            }
            _ => {
                self.relay.remove(host_id);
                Err(RpcError::limit("Service is overloaded"))
            }
        }
    }

    /// A response from a connection: completes the pending request it answers, if that
    /// connection was sent it. Anything else is dropped.
    /// `outcome` is `None` when the message was over the size limit.
    pub(crate) fn on_response<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        id: &RawValue,
        outcome: Option<Result<&RawValue, &RawValue>>,
    ) {
        let Some(host_id) = id.get().parse::<u64>().ok() else {
            k.stats_mut().responses_dropped += 1;
            return;
        };
        if self
            .relay
            .pending
            .get(&host_id)
            .is_none_or(|p| p.owner != conn)
        {
            k.stats_mut().responses_dropped += 1;
            return;
        }
        let limits = k.limits();
        let outcome = match outcome {
            None => Outcome::Error(RpcError::limit("Service result is too large")),
            Some(Ok(result)) if result.get().len() > limits.service_payload_bytes_max as usize => {
                Outcome::Error(RpcError::limit("Service result is too large"))
            }
            Some(Ok(result)) if !jsonrpc::payload_depth_ok(result.get()) => Outcome::Error(
                RpcError::limit("Service result nests too deeply for its caller to read"),
            ),
            Some(Ok(result)) => Outcome::Result(result),
            Some(Err(error)) => match serde_json::from_str::<ErrorObject<'_>>(error.get()) {
                Ok(e) => {
                    let mut message: String = e.message.into_owned();
                    if message.len() > 4096 {
                        let mut cut = 4096;
                        while !message.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        message.truncate(cut);
                    }
                    let mut err = RpcError::new(e.code, message);
                    if let Some(data) = e
                        .data
                        .filter(|d| d.get().len() <= limits.service_error_data_bytes_max as usize)
                        .filter(|d| jsonrpc::payload_depth_ok(d.get()))
                    {
                        err =
                            err.with_data(serde_json::from_str(data.get()).unwrap_or(Value::Null));
                    }
                    Outcome::Error(err)
                }
                Err(_) => Outcome::Error(RpcError::new(
                    INTERNAL_ERROR,
                    "Service returned a malformed error",
                )),
            },
        };
        self.complete(k, host_id, outcome, false);
    }

    /// `$/cancelRequest` from a caller, naming its own request id.
    pub(crate) fn cancel_request<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        params: Option<&RawValue>,
    ) {
        let parsed = params.and_then(|p| serde_json::from_str::<CancelParams<'_>>(p.get()).ok());
        let Some(p) = parsed.filter(|p| p.channel == CATALOG) else {
            k.stats_mut().notifications_dropped += 1;
            return;
        };
        let Some(host_id) = self
            .relay
            .by_caller
            .get(&conn)
            .and_then(|m| m.get(p.id.get()))
            .copied()
        else {
            k.stats_mut().notifications_dropped += 1;
            return;
        };
        k.stats_mut().requests_cancelled += 1;
        self.complete(
            k,
            host_id,
            Outcome::Error(RpcError::new(CANCELLED, "Request cancelled")),
            true,
        );
    }

    /// The relay timer fired.
    pub(crate) fn relay_timeout<S: Store>(&mut self, k: &mut Kernel<S>, host_id: u64) {
        if self.relay.pending.contains_key(&host_id) {
            k.stats_mut().requests_timed_out += 1;
            self.complete(
                k,
                host_id,
                Outcome::Error(RpcError::new(TIMEOUT, "Service request timed out")),
                true,
            );
        }
    }

    /// Fails every request pending on a service that is gone.
    pub(crate) fn fail_service_requests<S: Store>(&mut self, k: &mut Kernel<S>, service_id: &str) {
        for host_id in self.relay.of_service(service_id) {
            let e = RpcError::new(SERVICE_GONE, "Service is no longer available");
            self.complete(k, host_id, Outcome::Error(e), false);
        }
    }

    /// Releases a departed caller's entries and tells each service to stop.
    pub(crate) fn release_caller<S: Store>(&mut self, k: &mut Kernel<S>, conn: ConnId) {
        for host_id in self.relay.of_caller(conn) {
            if let Some(p) = self.relay.remove(host_id) {
                k.disarm(&Timer::Relay(host_id));
                forward_cancel(k, p.owner, host_id);
            }
        }
    }

    /// The one way a pending request ends: remove it, stop its timer, answer the caller, and
    /// optionally tell the service to stop working on it.
    fn complete<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        host_id: u64,
        outcome: Outcome<'_>,
        cancel_service: bool,
    ) {
        let Some(p) = self.relay.remove(host_id) else {
            return;
        };
        k.disarm(&Timer::Relay(host_id));
        k.stats_mut().requests_completed += 1;
        match outcome {
            Outcome::Result(r) => {
                k.reply_now(p.caller, jsonrpc::result_frame(&p.caller_id, r.get()))
            }
            Outcome::Error(e) => k.reply_error_now(p.caller, &p.caller_id, &e),
        }
        if cancel_service {
            forward_cancel(k, p.owner, host_id);
        }
    }

    /// The deadline of every pending request, for the simulator's liveness checks.
    pub(crate) fn pending_deadlines(&self) -> Vec<Instant> {
        self.relay.pending.values().map(|p| p.deadline).collect()
    }
}

/// Tells a service owner to stop working on request `host_id`.
fn forward_cancel<S: Store>(k: &mut Kernel<S>, owner: ConnId, host_id: u64) {
    let params = json!({ "channel": CATALOG, "id": host_id }).to_string();
    let frame = jsonrpc::notification_frame("$/cancelRequest", &params);
    let _ = k.pass(owner, frame);
}
