//! `initialize` and `reconnect`: version negotiation, clientId binding, initial subscriptions
//! and replay.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::ahp::session::{AXP_CAPABILITY, AXP_VERSION};
use crate::channel;
use crate::error::{RpcError, UNSUPPORTED_PROTOCOL_VERSION};
use crate::host::{parse_params, Host};
use crate::kernel::time::Timer;
use crate::log::store::Store;
use crate::net::connection::{ConnId, Phase};
use crate::net::jsonrpc;
use crate::net::output::CloseCode;
use crate::services::ClientServices;

/// Supported AHP protocol range: `>=0.9.0 <0.10.0`.
pub(crate) const SUPPORTED_PROTOCOL_VERSIONS: &[&str] = &["0.9.0"];

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct InitializeParams {
    channel: String,
    protocol_versions: Vec<String>,
    client_id: String,
    #[serde(default)]
    initial_subscriptions: Vec<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReconnectParams {
    channel: String,
    client_id: String,
    last_seen_server_seq: u64,
    subscriptions: Vec<String>,
}

/// A strict `MAJOR.MINOR.PATCH` with no leading zeros, or `None`.
fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.split('.');
    let mut next = || -> Option<u64> {
        let p = parts.next()?;
        if p.is_empty()
            || (p.len() > 1 && p.starts_with('0'))
            || !p.bytes().all(|b| b.is_ascii_digit())
        {
            return None;
        }
        p.parse().ok()
    };
    let version = (next()?, next()?, next()?);
    parts.next().is_none().then_some(version)
}

/// Picks the highest offered version within `>=0.9.0 <0.10.0`.
pub(crate) fn negotiate(offered: &[String]) -> Result<Option<String>, RpcError> {
    let mut best: Option<((u64, u64, u64), &String)> = None;
    for v in offered {
        let parsed = parse_version(v).ok_or_else(|| {
            RpcError::invalid_params("protocolVersions holds a malformed version")
        })?;
        if parsed.0 == 0 && parsed.1 == 9 && best.is_none_or(|(b, _)| parsed > b) {
            best = Some((parsed, v));
        }
    }
    Ok(best.map(|(_, v)| v.clone()))
}

impl<S: Store> Host<S> {
    /// `initialize` or `reconnect`: on success the connection is ready at once (later
    /// messages build on it) and the answer waits for the binding it may have made and every
    /// change it shows.
    pub(super) fn handshake(
        &mut self,
        conn: ConnId,
        first: bool,
        id: &str,
        method: &str,
        params: Option<&RawValue>,
    ) {
        let outcome = if method == "initialize" {
            self.initialize(conn, params)
        } else {
            self.reconnect(conn, first, params)
        };
        match outcome {
            Ok(result) => self
                .k
                .reply_state(conn, id, jsonrpc::result_frame(id, &result)),
            Err(e) => {
                self.k.reply_error(conn, id, &e);
                if e.code == UNSUPPORTED_PROTOCOL_VERSION {
                    self.k.close_after_issued(
                        conn,
                        CloseCode::Policy,
                        "Unsupported protocol version",
                    );
                }
            }
        }
    }

    fn initialize(&mut self, conn: ConnId, params: Option<&RawValue>) -> Result<String, RpcError> {
        let p: InitializeParams = parse_params(params)?;
        if self.k.is_ready(conn) {
            return Err(RpcError::conflict("Connection already initialized"));
        }
        if p.channel != channel::ROOT {
            return Err(RpcError::invalid_params(
                "initialize belongs on ahp-root://",
            ));
        }
        let limits = self.k.limits();
        if p.protocol_versions.len() > limits.protocol_versions_max as usize {
            return Err(RpcError::invalid_params("Too many protocolVersions"));
        }
        if p.initial_subscriptions.len() > limits.subscriptions_per_conn_max as usize {
            return Err(RpcError::limit("Subscription limit reached"));
        }
        let Some(version) = negotiate(&p.protocol_versions)? else {
            return Err(RpcError::new(
                UNSUPPORTED_PROTOCOL_VERSION,
                "Unsupported protocol version",
            )
            .with_data(json!({ "supportedVersions": SUPPORTED_PROTOCOL_VERSIONS })));
        };
        let principal = self.k.principal(conn)?;
        for uri in &p.initial_subscriptions {
            self.allowed(&principal, uri)?;
        }
        self.clients.bind(&mut self.k, &principal, &p.client_id)?;
        self.become_ready(conn, &p.client_id);
        let mut snapshots = Vec::with_capacity(p.initial_subscriptions.len());
        for uri in &p.initial_subscriptions {
            if let Some(s) = self.snapshot(&principal, uri) {
                snapshots.push(s);
                self.k.subscribe(conn, uri);
            }
        }
        let last_client_seq = self
            .clients
            .get(&p.client_id)
            .map_or(0, |c| c.last_client_seq);
        let config = self.k.config();
        let result = json!({
            "protocolVersion": version,
            "serverSeq": self.k.server_seq(),
            "serverInfo": { "name": config.server_name, "version": config.server_version },
            "_meta": {
                AXP_CAPABILITY: {
                    "version": AXP_VERSION,
                    "methods": crate::axp::method_names(),
                    "role": principal.role.as_str(),
                    "principal": principal.id,
                    "repository": config.repository,
                    "lastClientSeq": last_client_seq,
                    "memory": crate::channel::MEMORY,
                },
                crate::services::CAPABILITY: ClientServices::capability(&self.k),
            },
            "snapshots": snapshots,
        });
        Ok(result.to_string())
    }

    fn reconnect(
        &mut self,
        conn: ConnId,
        first: bool,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        if !first || self.k.is_ready(conn) {
            return Err(RpcError::conflict("Reconnect requires a fresh connection"));
        }
        let p: ReconnectParams = parse_params(params)?;
        if p.channel != channel::ROOT {
            return Err(RpcError::invalid_params("reconnect belongs on ahp-root://"));
        }
        if p.subscriptions.len() > self.k.limits().subscriptions_per_conn_max as usize {
            return Err(RpcError::limit("Subscription limit reached"));
        }
        if p.last_seen_server_seq > self.k.server_seq() {
            return Err(RpcError::invalid_params("Replay cursor is in the future"));
        }
        let principal = self.k.principal(conn)?;
        self.clients.bind(&mut self.k, &principal, &p.client_id)?;
        let mut missing = Vec::new();
        let mut resumed: Vec<String> = Vec::new();
        for uri in p.subscriptions {
            if self.allowed(&principal, &uri).is_ok() {
                if !resumed.contains(&uri) {
                    resumed.push(uri);
                }
            } else {
                missing.push(Value::String(uri));
            }
        }
        self.become_ready(conn, &p.client_id);
        // The catalog is not replayable (it is not stored); asking for it means snapshots.
        let replay = if resumed.iter().any(|r| r == crate::channel::CATALOG) {
            None
        } else {
            self.k
                .replay(p.last_seen_server_seq, |c| resumed.iter().any(|r| r == c))
        };
        let missing = Value::Array(missing).to_string();
        let result = match replay {
            Some(envelopes) => {
                let mut out = String::from("{\"type\":\"replay\",\"actions\":[");
                for (i, e) in envelopes.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(e);
                }
                out.push_str("],\"missing\":");
                out.push_str(&missing);
                out.push('}');
                out
            }
            None => {
                let snapshots: Vec<Value> = resumed
                    .iter()
                    .filter_map(|u| self.snapshot(&principal, u))
                    .collect();
                format!(
                    "{{\"type\":\"snapshot\",\"snapshots\":{},\"missing\":{}}}",
                    Value::Array(snapshots),
                    missing
                )
            }
        };
        for uri in &resumed {
            self.k.subscribe(conn, uri);
        }
        Ok(result)
    }

    fn become_ready(&mut self, conn: ConnId, client_id: &str) {
        self.k.disarm(&Timer::Handshake(conn));
        self.clients.attach(client_id);
        if let Some(c) = self.k.conns_mut().get_mut(conn) {
            c.phase = Phase::Ready {
                client_id: client_id.to_owned(),
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn negotiation_picks_the_highest_supported_offer() {
        assert_eq!(negotiate(&v(&["0.9.0"])), Ok(Some("0.9.0".into())));
        assert_eq!(
            negotiate(&v(&["0.9.0", "0.9.3", "1.0.0"])),
            Ok(Some("0.9.3".into()))
        );
        assert_eq!(negotiate(&v(&["1.0.0", "0.8.0"])), Ok(None));
        assert_eq!(negotiate(&v(&[])), Ok(None));
        assert!(negotiate(&v(&["0.09.0"])).is_err());
        assert!(negotiate(&v(&["0.9"])).is_err());
        assert!(negotiate(&v(&["0.9.0-beta"])).is_err());
    }
}
