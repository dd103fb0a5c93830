//! The durability oracles: what the asynchronous write path promises, checked from outside.
//!
//! The host applies a change in memory at once and hands it to the writer; it may reveal it only
//! once the writer reported it durable. This oracle looks at every frame the host sends, at the
//! moment it leaves, against what the store holds at that moment:
//!
//! 1. *Nothing is revealed before it is durable.* An accepted action envelope (live, replayed,
//!    or inside an answer) is in the store byte for byte; a catalog event's, a rejection's, a
//!    snapshot's or a handshake's number is covered by the store's mark; a session that is
//!    announced, listed or snapshotted is in the store; the success answer to a mutation leaves
//!    only once its effect is in the store (`createSession`: the session; `dispatchAction` and
//!    every `_axp/*` mutation: its receipt; `initialize`/`reconnect`: the clientId binding).
//! 2. *A failed batch leaves no trace.* Right after `CommitFailed`, the host's state of every
//!    channel and every binding equals a host freshly built from the store (which holds the
//!    durable prefix and nothing else); and by (1) no frame ever carried a failed change.
//! 3. *Every acknowledged change survives a crash, and `serverSeq` never goes backwards.* What
//!    was revealed is in the store (1), the store survives, and a restarted host's `serverSeq`
//!    is at least every number ever revealed.

use std::collections::BTreeMap;

use axhost_core::{ClientRecord, ConnId, Host, HostConfig, Input, MemStore, Principal, Table};
use serde_json::Value;

use crate::client::session_of;
use crate::replica::CATALOG;
use crate::store::SimStore;

/// What the success answer to a request must find in the store.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Expect {
    /// `createSession`: the session.
    Session(String),
    /// `dispatchAction` as a request: its receipt.
    Receipt { owner: String, key: String },
    /// `initialize` / `reconnect`: the binding.
    Binding(String),
}

/// Counters for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurabilityStats {
    /// Frames checked against the store.
    pub frames_checked: u64,
    /// Envelopes found in the store byte for byte.
    pub envelopes_checked: u64,
    /// Failed commits after which the host was compared with the store.
    pub failures_compared: u64,
}

/// See the module docs.
#[derive(Default)]
pub struct DurabilityOracle {
    /// Requests in flight whose success reveals a change, by `(conn, raw id)`.
    expects: BTreeMap<(ConnId, String), Expect>,
    /// Per connection: its principal id and the clientId it will use.
    conns: BTreeMap<ConnId, (String, String)>,
    /// The highest `serverSeq` ever revealed, across restarts.
    pub revealed_high: u64,
    /// Counters.
    pub stats: DurabilityStats,
}

impl DurabilityOracle {
    /// The driver is about to feed `Input::Connected`.
    pub fn connected(&mut self, conn: ConnId, client_id: &str, principal: &Principal) {
        self.conns
            .insert(conn, (principal.id.clone(), client_id.to_owned()));
    }

    /// The driver fed `Input::Closed`.
    pub fn closed(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
        self.expects.retain(|(c, _), _| *c != conn);
    }

    /// The host process died with its connections.
    pub fn restarted(&mut self) {
        self.conns.clear();
        self.expects.clear();
    }

    /// The driver is about to feed `input`: notes what a request's success must find.
    pub fn feeding(&mut self, input: &Input<'_>) {
        let Input::Message { conn, text } = input else {
            return;
        };
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let (Some(id), Some(method)) = (v.get("id"), v.get("method").and_then(Value::as_str))
        else {
            return;
        };
        let params = v.get("params").cloned().unwrap_or(Value::Null);
        let expect = match method {
            "createSession" => params
                .get("channel")
                .and_then(Value::as_str)
                .and_then(|c| c.split_once(":/").map(|(_, id)| id.to_owned()))
                .map(Expect::Session),
            "dispatchAction" => {
                let (owner, client_id) = self.conns.get(conn).cloned().unwrap_or_default();
                params
                    .get("clientSeq")
                    .and_then(Value::as_u64)
                    .map(|seq| Expect::Receipt {
                        owner,
                        key: ClientRecord::dispatch_receipt_key(&client_id, seq),
                    })
            }
            // An AXP mutation: its retry receipt, keyed by principal and operationId.
            m if m.starts_with("_axp/") => {
                let owner = self
                    .conns
                    .get(conn)
                    .map(|c| c.0.clone())
                    .unwrap_or_default();
                params
                    .get("operationId")
                    .and_then(Value::as_str)
                    .map(|op| Expect::Receipt {
                        owner,
                        key: op.to_owned(),
                    })
            }
            "initialize" | "reconnect" => params
                .get("clientId")
                .and_then(Value::as_str)
                .map(|c| Expect::Binding(c.to_owned())),
            _ => None,
        };
        if let Some(e) = expect {
            self.expects.insert((*conn, id.to_string()), e);
        }
    }

    /// A frame is leaving for `conn`: rule 1 against the store as it is now.
    pub fn on_send(&mut self, conn: ConnId, frame: &str, store: &MemStore) -> Result<(), String> {
        self.stats.frames_checked += 1;
        let v: Value =
            serde_json::from_str(frame).map_err(|e| format!("host frame is not JSON: {e}"))?;
        match v.get("method").and_then(Value::as_str) {
            Some("action") => {
                let raw = frame
                    .strip_prefix("{\"jsonrpc\":\"2.0\",\"method\":\"action\",\"params\":")
                    .and_then(|r| r.strip_suffix('}'));
                let params = v.get("params").unwrap_or(&Value::Null);
                self.envelope(params, raw, store)
            }
            Some("root/sessionAdded") => {
                let resource = v
                    .pointer("/params/summary/resource")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                self.session_stored(resource, store, "announced")
            }
            Some("root/sessionSummaryChanged") => {
                let resource = v
                    .pointer("/params/session")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                self.session_stored(resource, store, "summarised")
            }
            Some(_) => Ok(()),
            None => self.answer(conn, &v, store),
        }
    }

    fn envelope(&mut self, env: &Value, raw: Option<&str>, store: &MemStore) -> Result<(), String> {
        let seq = env.get("serverSeq").and_then(Value::as_u64).unwrap_or(0);
        let channel = env.get("channel").and_then(Value::as_str).unwrap_or("");
        self.revealed_high = self.revealed_high.max(seq);
        if env.get("rejectionReason").is_some() || channel == CATALOG {
            return covered(seq, store, "an unstored event");
        }
        let Some(stored) = store.event(seq) else {
            return Err(format!(
                "event {seq} on {channel} revealed before it is durable (the store holds through {})",
                store.server_seq()
            ));
        };
        self.stats.envelopes_checked += 1;
        let same = match raw {
            Some(raw) => raw == &*stored.envelope,
            None => {
                serde_json::from_str::<Value>(&stored.envelope)
                    .ok()
                    .as_ref()
                    == Some(env)
            }
        };
        if !same || &*stored.channel != channel {
            return Err(format!(
                "event {seq} on {channel} differs from the durable event {seq} on {}",
                stored.channel
            ));
        }
        Ok(())
    }

    fn session_stored(&self, resource: &str, store: &MemStore, how: &str) -> Result<(), String> {
        let Some(id) = session_of(resource) else {
            return Ok(());
        };
        if store
            .record_text(Table::State, &format!("axhost-session:/{id}"))
            .is_none()
        {
            return Err(format!("session {id} {how} before its creation is durable"));
        }
        Ok(())
    }

    fn answer(&mut self, conn: ConnId, v: &Value, store: &MemStore) -> Result<(), String> {
        let id = v.get("id").map(Value::to_string).unwrap_or_default();
        let expect = self.expects.remove(&(conn, id.clone()));
        let Some(result) = v.get("result") else {
            return Ok(());
        };
        match expect {
            Some(Expect::Session(s)) => {
                self.session_stored(&format!("ahp-session:/{s}"), store, "acknowledged")?
            }
            Some(Expect::Receipt { owner, key })
                if store.stored_receipt(&owner, &key).is_none() =>
            {
                return Err(format!(
                    "{conn:?} request {id}: dispatch {key} acknowledged before it is durable"
                ));
            }
            Some(Expect::Binding(client))
                if store.record_text(Table::Client, &client).is_none() =>
            {
                return Err(format!(
                    "{conn:?} request {id}: handshake under {client} answered before its binding is durable"
                ));
            }
            _ => {}
        }
        self.walk(result, store)
    }

    /// Everything an answer shows: numbers covered, envelopes stored, sessions stored.
    fn walk(&mut self, v: &Value, store: &MemStore) -> Result<(), String> {
        match v {
            Value::Object(m) => {
                let is_envelope = m.contains_key("action") && m.contains_key("serverSeq");
                if is_envelope {
                    return self.envelope(v, None, store);
                }
                for key in ["fromSeq", "serverSeq"] {
                    if let Some(n) = m.get(key).and_then(Value::as_u64) {
                        self.revealed_high = self.revealed_high.max(n);
                        covered(n, store, key)?;
                    }
                }
                if let Some(resource) = m.get("resource").and_then(Value::as_str) {
                    if m.contains_key("state") || m.contains_key("provider") {
                        self.session_stored(resource, store, "shown")?;
                    }
                }
                for x in m.values() {
                    self.walk(x, store)?;
                }
                Ok(())
            }
            Value::Array(a) => a.iter().try_for_each(|x| self.walk(x, store)),
            _ => Ok(()),
        }
    }

    /// Rule 2: right after `CommitFailed`, the host equals a host built from the store.
    pub fn after_failure(
        &mut self,
        host: &Host<SimStore>,
        config: &HostConfig,
        session_ids: &[String],
    ) -> Result<(), String> {
        self.stats.failures_compared += 1;
        let fresh = Host::new(config.clone(), host.store().mem().clone(), 0)
            .map_err(|e| format!("the store does not load after a failed commit: {e}"))?;
        for uri in channels(session_ids) {
            let (now, durable) = (host.channel_state(&uri), fresh.channel_state(&uri));
            if now != durable {
                return Err(format!(
                    "after a failed commit the host's {uri} is not the durable one ({} vs {})",
                    if now.is_some() { "present" } else { "absent" },
                    if durable.is_some() {
                        "present"
                    } else {
                        "absent"
                    },
                ));
            }
        }
        if !host.client_bindings().eq(fresh.client_bindings()) {
            return Err(
                "after a failed commit the host's clientId bindings are not the durable ones"
                    .into(),
            );
        }
        Ok(())
    }

    /// Rule 3, after a restart: no number ever revealed is above the new host's.
    pub fn after_restart(&self, server_seq: u64) -> Result<(), String> {
        if server_seq < self.revealed_high {
            return Err(format!(
                "a restarted host resumes at serverSeq {server_seq}, below {} already revealed",
                self.revealed_high
            ));
        }
        Ok(())
    }
}

fn covered(n: u64, store: &MemStore, what: &str) -> Result<(), String> {
    if n > store.server_seq() {
        return Err(format!(
            "{what} shows serverSeq {n} above the durable mark {}",
            store.server_seq()
        ));
    }
    Ok(())
}

/// Every channel of the root and the sessions in `session_ids`.
pub fn channels(session_ids: &[String]) -> Vec<String> {
    let mut out = vec!["ahp-root://".to_owned()];
    for id in session_ids {
        out.push(format!("ahp-session:/{id}"));
        out.push(format!("ahp-chat:/{id}"));
        out.push(format!("ahp-changeset:/{id}"));
    }
    out
}
