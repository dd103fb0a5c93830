//! What a client checks and applies as frames arrive: the per-connection stream rules.
//!
//! - Non-rejected `action` envelopes arrive with strictly increasing `serverSeq`, above the
//!   snapshot `fromSeq` of their channel, and only for channels the connection subscribes to
//!   (or is leaving: an `unsubscribe` the host has not processed yet).
//! - Every response answers exactly one outstanding request; `id: null` errors answer only
//!   frames the client knows were malformed.
//! - A rejection echo carries this client's `clientId` and a `clientSeq` sent on this very
//!   connection, once; a retry (same `clientSeq`, same action) of an applied dispatch is never
//!   applied again unless other content was sent under that `clientSeq` in between (the host
//!   treats that as a restarted counter and replaces its receipt).
//! - A principal scoped to some sessions never hears about any other session.
//! - Client-services traffic (call answers, `handleRequest`, notifications and cancellations to
//!   an owner) is checked by the roles in [`crate::roles`].
//! - Handshake answers are checked against what was asked: the negotiated version, a snapshot
//!   for every initial subscription, `missing` only for channels the client cannot have,
//!   `serverSeq` never below one already seen, `lastClientSeq` consistent with the client's
//!   own dispatches.
//!
//! A broken rule is returned as a message; the world turns it into a [`crate::Violation`].

use std::collections::BTreeSet;

use ahp_types::actions::ActionEnvelope;
use axhost_core::ConnId;
use serde_json::Value;

use crate::client::{action_identity, session_of, unix_ms, Accepted, Request, SimClient, ROOT};
use crate::replica::Replica;
use crate::roles::Rumor;

/// The AXP `_meta` key of `InitializeResult`.
const AXP_META: &str = "org.axp.exchange";

impl SimClient {
    /// Reads one frame from the host on connection `conn`.
    pub fn on_frame(&mut self, conn: ConnId, bytes: &[u8]) -> Result<(), String> {
        match &self.connection {
            Some(c) if c.conn == conn => {}
            _ => {
                return Err(format!(
                    "frame delivered on {conn:?}, which is not this client's connection"
                ))
            }
        }
        if let Some(c) = self.connection.as_mut() {
            c.received += 1;
        }
        let msg: Value = serde_json::from_slice(bytes)
            .map_err(|e| format!("host sent a frame that is not JSON ({e}): {}", lossy(bytes)))?;
        if msg.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
            return Err(format!(
                "host sent a frame that is not JSON-RPC 2.0: {}",
                lossy(bytes)
            ));
        }
        match (msg.get("method").and_then(Value::as_str), msg.get("id")) {
            (Some(method), None) => {
                let params = msg.get("params").cloned().unwrap_or(Value::Null);
                self.on_notification(method, params)
            }
            (None, Some(id)) => self.on_response(id, &msg),
            (Some("clientService/handleRequest"), Some(id)) => {
                let params = msg.get("params").cloned().unwrap_or(Value::Null);
                self.on_handle_request(id, &params)
            }
            _ => Err(format!(
                "host sent neither a response nor a notification: {}",
                lossy(bytes)
            )),
        }
    }

    fn on_response(&mut self, id: &Value, msg: &Value) -> Result<(), String> {
        let outcome = match (msg.get("result"), msg.get("error")) {
            (Some(r), None) => Ok(r.clone()),
            (None, Some(e)) => Err(e.clone()),
            _ => {
                return Err(format!(
                    "response with both or neither of result and error: {msg}"
                ))
            }
        };
        let Some(c) = self.connection.as_mut() else {
            return Ok(());
        };
        if let Err(e) = &outcome {
            if error_code(e) == Some(-32603) {
                c.rolled_back = true;
            }
        }
        if id.is_null() {
            if outcome.is_ok() {
                return Err("a result with id null".into());
            }
            if c.null_errors_expected == 0 {
                return Err(format!(
                    "an id:null error no malformed frame asked for: {msg}"
                ));
            }
            c.null_errors_expected -= 1;
            return Ok(());
        }
        let key = id.to_string();
        let Some(pending) = c.pending.remove(&key) else {
            // A call: answered once per time it was sent (a duplicate id is refused on its own).
            let Some(calls) = c.calls.get_mut(&key) else {
                return Err(format!(
                    "response to id {key}, which is unknown or already answered"
                ));
            };
            calls.remove(0);
            if calls.is_empty() {
                c.calls.remove(&key);
            }
            // Client-service answers depend on nothing durable and may overtake events the
            // host still holds for the disk, so they prove nothing about `leaving`.
            return self.on_call_outcome(&key, outcome);
        };
        // The host has processed every message up to this one, and an answer to anything but
        // a client-service call comes after everything the host queued before it.
        if !pending.request.passes_held_frames() {
            c.leaving.retain(|_, index| *index > pending.index);
        }
        match pending.request {
            Request::Initialize {
                subscriptions,
                version,
            } => self.on_initialize(&subscriptions, version, outcome),
            Request::Reconnect {
                subscriptions,
                cursor,
            } => self.on_reconnect(&subscriptions, cursor, outcome),
            Request::Subscribe { channel } => self.on_subscribe(&channel, outcome),
            Request::CreateSession { id } => self.on_create_session(id, outcome),
            Request::ListSessions { limit } => self.on_list_sessions(limit, outcome),
            Request::Dispatch => match outcome {
                Ok(Value::Null) => Ok(()),
                Err(_) => {
                    self.stats.dispatch_errors += 1;
                    Ok(())
                }
                Ok(other) => Err(format!("expected result null, got {other}")),
            },
            Request::Unsubscribe | Request::Ping => match outcome {
                Ok(Value::Null) | Err(_) => Ok(()),
                Ok(other) => Err(format!("expected result null, got {other}")),
            },
            Request::RegisterService => self.on_register_service(outcome),
            Request::UpdateService { own } => match outcome {
                Ok(_) if own == Some(false) => {
                    Err("updated a service another connection registered".into())
                }
                _ => Ok(()),
            },
            Request::UnregisterService { service_id, own } => {
                self.on_unregister_service(&service_id, own, outcome)
            }
            Request::Other => Ok(()),
        }
    }

    fn on_initialize(
        &mut self,
        subscriptions: &[String],
        version: &str,
        outcome: Result<Value, Value>,
    ) -> Result<(), String> {
        let result = match outcome {
            Ok(r) => r,
            Err(e) => {
                if let Some(c) = self.connection.as_mut() {
                    c.handshake_pending = false;
                }
                // -32005 is followed by a close; anything else leaves the connection usable.
                if error_code(&e) == Some(-32005) {
                    if let Some(c) = self.connection.as_mut() {
                        c.unsupported_version = true;
                    }
                } else {
                    self.handshake_failed();
                }
                return Ok(());
            }
        };
        if result.get("protocolVersion").and_then(Value::as_str) != Some(version) {
            return Err(format!(
                "initialize negotiated {:?}, expected {version:?}",
                result.get("protocolVersion")
            ));
        }
        let server_seq = result
            .get("serverSeq")
            .and_then(Value::as_u64)
            .ok_or("initialize without serverSeq")?;
        if server_seq < self.seq_high {
            return Err(format!(
                "serverSeq went back: this client saw {}, initialize says {server_seq}",
                self.seq_high
            ));
        }
        self.check_last_client_seq(&result)?;
        if let Some(bytes) = result
            .pointer("/_meta/x-client-services/limits/payloadBytes")
            .and_then(Value::as_u64)
        {
            self.payload_limit = bytes as usize;
        }
        let snapshots = result
            .get("snapshots")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let mut got = BTreeSet::new();
        for s in snapshots {
            let (uri, from_seq) = self.install_snapshot(s)?;
            if !subscriptions.contains(&uri) {
                return Err(format!(
                    "initialize returned a snapshot of {uri}, which was not asked for"
                ));
            }
            if from_seq != server_seq {
                return Err(format!("initialize snapshot of {uri} has fromSeq {from_seq}, serverSeq is {server_seq}"));
            }
            got.insert(uri);
        }
        if let Some(lost) = subscriptions.iter().find(|s| !got.contains(*s)) {
            return Err(format!("initialize succeeded without a snapshot of {lost}"));
        }
        self.ready(server_seq);
        Ok(())
    }

    /// `_meta.lastClientSeq` lies between the highest own dispatch seen accepted and the
    /// highest `clientSeq` ever sent (the clientId belongs to this client alone).
    fn check_last_client_seq(&self, result: &Value) -> Result<(), String> {
        let meta = result
            .get("_meta")
            .and_then(|m| m.get(AXP_META))
            .ok_or("initialize without AXP _meta")?;
        let last = meta
            .get("lastClientSeq")
            .and_then(Value::as_u64)
            .ok_or("AXP _meta without lastClientSeq")?;
        if last > self.client_seq_sent_max {
            return Err(format!(
                "lastClientSeq {last} above any clientSeq sent ({})",
                self.client_seq_sent_max
            ));
        }
        let accepted = self.accepted.keys().next_back().copied().unwrap_or(0);
        if last < accepted {
            return Err(format!(
                "lastClientSeq {last} below clientSeq {accepted}, seen accepted"
            ));
        }
        Ok(())
    }

    fn ready(&mut self, seq: u64) {
        self.cursor = self.cursor.max(seq);
        self.seq_high = self.seq_high.max(seq);
        self.bound = true;
        self.handshake_failures = 0;
        if let Some(c) = self.connection.as_mut() {
            c.ready = true;
            c.handshake_pending = false;
            c.seq_last = c.seq_last.max(seq);
        }
    }

    fn on_reconnect(
        &mut self,
        subscriptions: &[String],
        cursor: u64,
        outcome: Result<Value, Value>,
    ) -> Result<(), String> {
        let result = match outcome {
            Ok(r) => r,
            Err(e) => {
                let code = error_code(&e);
                if code == Some(-32602) || code == Some(-32009) {
                    return Err(format!(
                        "reconnect from cursor {cursor} (seen {}) refused: {e}",
                        self.seq_high
                    ));
                }
                self.stats.reconnect_errors += 1;
                if let Some(c) = self.connection.as_mut() {
                    c.handshake_pending = false;
                }
                self.send_initialize(self.calm);
                return Ok(());
            }
        };
        let missing: BTreeSet<String> = result
            .get("missing")
            .and_then(Value::as_array)
            .ok_or("reconnect result without missing[]")?
            .iter()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect();
        for m in &missing {
            if !subscriptions.contains(m) {
                return Err(format!(
                    "reconnect reports {m} missing, which was not asked for"
                ));
            }
            if self.replicas.contains_key(m) {
                return Err(format!(
                    "reconnect reports {m} missing, but it exists and is readable"
                ));
            }
        }
        match result.get("type").and_then(Value::as_str) {
            Some("replay") => self.on_replay(&result, subscriptions, &missing, cursor),
            Some("snapshot") => self.on_snapshots(&result, subscriptions, &missing, cursor),
            other => Err(format!("reconnect result of type {other:?}")),
        }
    }

    fn on_replay(
        &mut self,
        result: &Value,
        asked: &[String],
        missing: &BTreeSet<String>,
        cursor: u64,
    ) -> Result<(), String> {
        self.stats.replays += 1;
        if let Some(stray) = asked
            .iter()
            .find(|s| !missing.contains(*s) && !self.replicas.contains_key(*s))
        {
            return Err(format!(
                "replay resumes {stray}, which this client has no state for"
            ));
        }
        let actions = result
            .get("actions")
            .and_then(Value::as_array)
            .ok_or("replay without actions")?;
        let mut last = cursor;
        for a in actions {
            if a.get("rejectionReason").is_some() {
                return Err(format!("replay carries a rejected envelope: {a}"));
            }
            let env: ActionEnvelope = serde_json::from_value(a.clone())
                .map_err(|e| format!("replayed envelope does not decode ({e}): {a}"))?;
            if env.server_seq <= last {
                return Err(format!(
                    "replayed serverSeq {} not above {last}",
                    env.server_seq
                ));
            }
            if !asked.contains(&env.channel) || missing.contains(&env.channel) {
                return Err(format!(
                    "replay carries seq {} for {}, which is not resumed",
                    env.server_seq, env.channel
                ));
            }
            last = env.server_seq;
            self.stats.replayed += 1;
            self.absorb(env)?;
        }
        self.ready(last);
        Ok(())
    }

    fn on_snapshots(
        &mut self,
        result: &Value,
        asked: &[String],
        missing: &BTreeSet<String>,
        cursor: u64,
    ) -> Result<(), String> {
        self.stats.snapshots += 1;
        let snapshots = result
            .get("snapshots")
            .and_then(Value::as_array)
            .cloned()
            .ok_or("snapshot result without snapshots")?;
        self.replicas.clear();
        let mut seq = cursor;
        for s in snapshots {
            let (uri, from_seq) = self.install_snapshot(s)?;
            if !asked.contains(&uri) || missing.contains(&uri) {
                return Err(format!("reconnect snapshot of {uri}, which is not resumed"));
            }
            if from_seq < cursor {
                return Err(format!(
                    "reconnect snapshot of {uri} at fromSeq {from_seq}, below the cursor {cursor}"
                ));
            }
            seq = seq.max(from_seq);
        }
        if let Some(lost) = asked
            .iter()
            .find(|s| !missing.contains(*s) && !self.replicas.contains_key(*s))
        {
            return Err(format!("reconnect resumed {lost} without a snapshot"));
        }
        self.ready(seq);
        Ok(())
    }

    /// Decodes one `{resource, state, fromSeq}` and makes it the channel's replica.
    fn install_snapshot(&mut self, snapshot: Value) -> Result<(String, u64), String> {
        let uri = snapshot
            .get("resource")
            .and_then(Value::as_str)
            .ok_or("snapshot without resource")?
            .to_owned();
        let from_seq = snapshot
            .get("fromSeq")
            .and_then(Value::as_u64)
            .ok_or("snapshot without fromSeq")?;
        self.check_scope(&uri)?;
        let state = snapshot
            .get("state")
            .cloned()
            .ok_or("snapshot without state")?;
        let version = self.version();
        let replica = Replica::from_snapshot(&uri, state, from_seq, version)?;
        self.replicas.insert(uri.clone(), replica);
        self.learn(&uri);
        self.seq_high = self.seq_high.max(from_seq);
        Ok((uri, from_seq))
    }

    fn on_subscribe(&mut self, channel: &str, outcome: Result<Value, Value>) -> Result<(), String> {
        let Ok(result) = outcome else { return Ok(()) };
        let snapshot = result
            .get("snapshot")
            .cloned()
            .ok_or("subscribe result without snapshot")?;
        let uri = snapshot
            .get("resource")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if uri != channel {
            return Err(format!(
                "subscribe to {channel} answered with a snapshot of {uri}"
            ));
        }
        let from_seq = snapshot
            .get("fromSeq")
            .and_then(Value::as_u64)
            .ok_or("snapshot without fromSeq")?;
        let Some(c) = self.connection.as_mut() else {
            return Ok(());
        };
        if from_seq < c.seq_last {
            return Err(format!(
                "subscribe snapshot fromSeq {from_seq} below {} already seen",
                c.seq_last
            ));
        }
        c.seq_last = from_seq;
        let leaving = c.leaving.contains_key(channel);
        self.cursor = self.cursor.max(from_seq);
        if leaving {
            // Unsubscribed again before this answer arrived: nothing to mirror.
            self.check_scope(channel)?;
            return Ok(());
        }
        self.install_snapshot(snapshot)?;
        Ok(())
    }

    fn on_register_service(&mut self, outcome: Result<Value, Value>) -> Result<(), String> {
        let Ok(result) = outcome else { return Ok(()) };
        let id = result
            .get("serviceId")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("registerService result without serviceId: {result}"))?;
        if let Some(c) = self.connection.as_mut() {
            if !c.services.insert(id.to_owned()) {
                return Err(format!("registerService handed out {id} twice"));
            }
        }
        self.told.push(Rumor::ServiceId(id.to_owned()));
        Ok(())
    }

    fn on_unregister_service(
        &mut self,
        id: &str,
        own: Option<bool>,
        outcome: Result<Value, Value>,
    ) -> Result<(), String> {
        if outcome.is_err() {
            return Ok(());
        }
        if own == Some(false) {
            return Err(format!(
                "unregistered {id}, which another connection registered"
            ));
        }
        if let Some(c) = self.connection.as_mut() {
            c.services.remove(id);
        }
        Ok(())
    }

    fn on_create_session(
        &mut self,
        id: Option<String>,
        outcome: Result<Value, Value>,
    ) -> Result<(), String> {
        if outcome.is_err() {
            return Ok(());
        }
        let id = id.ok_or("createSession with a malformed URI succeeded")?;
        if !self.is_maintainer() {
            return Err(format!("a {:?} created session {id}", self.principal.role));
        }
        if !self.can_see(&id) {
            return Err(format!("a principal scoped away from {id} created it"));
        }
        self.known_sessions.insert(id);
        Ok(())
    }

    fn on_list_sessions(
        &mut self,
        limit: Option<u64>,
        outcome: Result<Value, Value>,
    ) -> Result<(), String> {
        let Ok(result) = outcome else { return Ok(()) };
        let items = result
            .get("items")
            .and_then(Value::as_array)
            .ok_or("listSessions without items")?;
        if limit.is_some_and(|l| items.len() as u64 > l) {
            return Err(format!(
                "listSessions returned {} items for limit {limit:?}",
                items.len()
            ));
        }
        let mut previous: Option<(i64, String)> = None;
        for item in items {
            let uri = item
                .get("resource")
                .and_then(Value::as_str)
                .ok_or("session summary without resource")?;
            let text = item
                .get("modifiedAt")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let modified = unix_ms(text)
                .ok_or_else(|| format!("session {uri} modifiedAt {text:?} is not RFC 3339 UTC"))?;
            // Most recent first, then by resource.
            if let Some((m, r)) = &previous {
                let ordered = *m > modified || (*m == modified && r.as_str() < uri);
                if !ordered {
                    return Err(format!(
                        "listSessions out of order: {r} (ms {m}) before {uri} (ms {modified})"
                    ));
                }
            }
            previous = Some((modified, uri.to_owned()));
            self.check_scope(uri)?;
            self.learn(uri);
        }
        self.list_cursor = result
            .get("nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        Ok(())
    }

    fn on_notification(&mut self, method: &str, params: Value) -> Result<(), String> {
        match method {
            "action" => self.on_envelope(params),
            "root/sessionAdded" | "root/sessionSummaryChanged" => {
                if !self.hears(ROOT) {
                    return Err(format!(
                        "{method} on a connection not subscribed to the root"
                    ));
                }
                let uri = params
                    .get("summary")
                    .and_then(|s| s.get("resource"))
                    .or_else(|| params.get("session"))
                    .and_then(Value::as_str)
                    .ok_or_else(|| format!("{method} without a session: {params}"))?
                    .to_owned();
                self.check_scope(&uri)?;
                self.learn(&uri);
                Ok(())
            }
            "clientService/notification" => self.on_service_notification(&params),
            "$/cancelRequest" => self.on_cancel_request(&params),
            other => Err(format!("unexpected notification {other}")),
        }
    }

    /// Whether the host may send this connection envelopes for `channel` now.
    fn hears(&self, channel: &str) -> bool {
        let Some(c) = &self.connection else {
            return false;
        };
        c.ready && (self.replicas.contains_key(channel) || c.leaving.contains_key(channel))
    }

    fn on_envelope(&mut self, params: Value) -> Result<(), String> {
        let seq = params
            .get("serverSeq")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("envelope without serverSeq: {params}"))?;
        let channel = params
            .get("channel")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        if params.get("rejectionReason").is_some() {
            return self.on_rejection(seq, &channel, &params);
        }
        if !self.hears(&channel) {
            return Err(format!(
                "envelope seq {seq} for {channel} on a connection not subscribed to it"
            ));
        }
        let Some(c) = self.connection.as_mut() else {
            return Ok(());
        };
        if seq <= c.seq_last {
            return Err(format!(
                "serverSeq {seq} on {channel} not above {} already seen on this connection",
                c.seq_last
            ));
        }
        c.seq_last = seq;
        let env: ActionEnvelope = serde_json::from_value(params.clone())
            .map_err(|e| format!("envelope does not decode ({e}): {params}"))?;
        self.absorb(env)?;
        self.cursor = self.cursor.max(seq);
        Ok(())
    }

    /// Applies one accepted envelope (live or replayed) to its replica, if mirrored.
    fn absorb(&mut self, env: ActionEnvelope) -> Result<(), String> {
        let seq = env.server_seq;
        self.seq_high = self.seq_high.max(seq);
        self.check_scope(&env.channel)?;
        if let Some(origin) = &env.origin {
            if origin.client_id == self.client_id {
                let identity = action_identity(
                    &env.channel,
                    &serde_json::to_value(&env.action).unwrap_or_default(),
                );
                self.own_accepted(origin.client_seq, seq, identity)?;
            }
        }
        let version = self.version();
        let Some(replica) = self.replicas.get_mut(&env.channel) else {
            return Ok(());
        };
        if seq <= replica.from_seq {
            return Err(format!(
                "envelope seq {seq} on {} not above its snapshot's fromSeq {}",
                env.channel, replica.from_seq
            ));
        }
        replica
            .apply(&env.action, version)
            .map_err(|e| format!("accepted envelope seq {seq} on {}: {e}", env.channel))?;
        self.stats.applied += 1;
        Ok(())
    }

    fn own_accepted(&mut self, client_seq: i64, seq: u64, identity: String) -> Result<(), String> {
        if !self.is_maintainer() {
            return Err(format!(
                "dispatch {client_seq} of a {:?} was accepted at seq {seq}",
                self.principal.role
            ));
        }
        let client_seq =
            u64::try_from(client_seq).map_err(|_| format!("echo with clientSeq {client_seq}"))?;
        if let Some(c) = self.connection.as_mut() {
            // Absent when it was sent on an earlier connection: nothing to resolve here.
            c.resolve(client_seq, &identity);
        }
        let fresh = Accepted {
            identity,
            server_seq: seq,
            sole: true,
        };
        if let Some(first) = self.accepted.insert(client_seq, fresh.clone()) {
            if first.sole && first.identity == fresh.identity {
                return Err(format!(
                    "a retry of clientSeq {client_seq} was applied again: serverSeq {} and {seq}",
                    first.server_seq
                ));
            }
        }
        self.stats.accepted += 1;
        Ok(())
    }

    fn on_rejection(&mut self, seq: u64, channel: &str, params: &Value) -> Result<(), String> {
        let origin = params
            .get("origin")
            .ok_or_else(|| format!("rejection without origin: {params}"))?;
        let client_id = origin
            .get("clientId")
            .and_then(Value::as_str)
            .unwrap_or_default();
        if client_id != self.client_id {
            return Err(format!(
                "rejection echo for client {client_id} delivered to {}",
                self.client_id
            ));
        }
        let client_seq = origin
            .get("clientSeq")
            .and_then(Value::as_u64)
            .ok_or("rejection without clientSeq")?;
        let identity = action_identity(channel, params.get("action").unwrap_or(&Value::Null));
        let Some(c) = self.connection.as_mut() else {
            return Ok(());
        };
        if !c.resolve(client_seq, &identity) {
            return Err(format!(
                "rejection of clientSeq {client_seq} on {channel}: no such dispatch was sent on this connection, or it was already resolved"
            ));
        }
        if seq < c.seq_last {
            return Err(format!(
                "rejection at serverSeq {seq}, below {} already seen",
                c.seq_last
            ));
        }
        self.stats.rejections += 1;
        self.stats.last_rejection = params
            .get("rejectionReason")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if self.stats.last_rejection.as_deref().is_some_and(|r| {
            r.starts_with("Chat size limit reached") || r == "Host chat storage limit reached"
        }) {
            self.stats.chat_limit_rejections += 1;
        }
        Ok(())
    }

    /// Fails when `uri` names a session this principal must not hear about.
    fn check_scope(&self, uri: &str) -> Result<(), String> {
        match session_of(uri) {
            Some(id) if !self.can_see(id) => Err(format!(
                "principal {} heard about {uri}, outside its scope",
                self.principal.id
            )),
            _ => Ok(()),
        }
    }

    fn learn(&mut self, uri: &str) {
        if let Some(id) = session_of(uri) {
            self.known_sessions.insert(id.to_owned());
        }
    }
}

fn error_code(error: &Value) -> Option<i64> {
    error.get("code").and_then(Value::as_i64)
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned()
}
