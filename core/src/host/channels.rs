//! Channels across components: who may read which channel, snapshots, `subscribe`,
//! `unsubscribe` and `resourceRead`. Each channel's state comes from the component that owns
//! it: the root and session channels from the session table, the catalog from client services.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::ahp::sessions::Sessions;
use crate::channel::ChannelRef;
use crate::error::RpcError;
use crate::host::{parse_params, ChannelParams, Host};
use crate::log::store::Store;
use crate::net::connection::ConnId;
use crate::net::jsonrpc;
use crate::principal::Principal;

impl<S: Store> Host<S> {
    /// `subscribe`, `unsubscribe`, `resourceRead`.
    pub(super) fn channel_request(
        &mut self,
        conn: ConnId,
        id: &str,
        method: &str,
        params: Option<&RawValue>,
    ) {
        let outcome = match method {
            "subscribe" => self.subscribe(conn, params),
            "unsubscribe" => self.unsubscribe(conn, params).map(|()| "null".to_owned()),
            _ => self.resource_read(conn, params),
        };
        match outcome {
            Ok(result) => self
                .k
                .reply_state(conn, id, jsonrpc::result_frame(id, &result)),
            Err(e) => self.k.reply_error(conn, id, &e),
        }
    }

    /// Checks that `principal` may read `uri` and that it exists, and that its snapshot can
    /// be sent (what subscribing needs).
    pub(crate) fn allowed(&self, principal: &Principal, uri: &str) -> Result<(), RpcError> {
        channel_allowed(principal, uri, &self.sessions)?;
        if uri == crate::channel::MEMORY {
            self.axp.memory.snapshot_fits()?;
        }
        Ok(())
    }

    /// The state of a channel as `viewer` sees it (the catalog differs per observer).
    pub(crate) fn state_for(&self, viewer: &Principal, uri: &str) -> Option<Value> {
        match ChannelRef::parse(uri) {
            ChannelRef::Catalog => Some(self.services.catalog_for(viewer)),
            ChannelRef::Executors => Some(self.axp.registry_json()),
            ChannelRef::Memory => Some(self.axp.memory.json()),
            _ => self.sessions.channel_state(uri),
        }
    }

    /// `{resource, state, fromSeq}` for a channel that exists, as `viewer` sees it.
    pub(crate) fn snapshot(&self, viewer: &Principal, uri: &str) -> Option<Value> {
        let state = self.state_for(viewer, uri)?;
        Some(json!({ "resource": uri, "state": state, "fromSeq": self.k.server_seq() }))
    }

    fn subscribe(&mut self, conn: ConnId, params: Option<&RawValue>) -> Result<String, RpcError> {
        let p: ChannelParams = parse_params(params)?;
        let principal = self.k.principal(conn)?;
        self.allowed(&principal, &p.channel)?;
        let (count, already) = self
            .k
            .conn(conn)
            .map(|c| (c.subscriptions.len(), c.subscriptions.contains(&p.channel)))
            .unwrap_or_default();
        if !already && count >= self.k.limits().subscriptions_per_conn_max as usize {
            return Err(RpcError::limit("Subscription limit reached"));
        }
        // Snapshot and registration happen in one step: nothing can be sequenced between them.
        let snapshot = self
            .snapshot(&principal, &p.channel)
            .ok_or_else(|| RpcError::not_found("Unknown channel"))?;
        self.k.subscribe(conn, &p.channel);
        Ok(json!({ "snapshot": snapshot }).to_string())
    }

    pub(super) fn unsubscribe(
        &mut self,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<(), RpcError> {
        let p: ChannelParams = parse_params(params)?;
        self.k.unsubscribe(conn, &p.channel);
        Ok(())
    }

    fn resource_read(
        &mut self,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        #[derive(Deserialize)]
        struct P {
            uri: String,
        }
        let p: P = parse_params(params)?;
        let principal = self.k.principal(conn)?;
        self.axp
            .blobs
            .resource_read(&mut self.k, &self.sessions, &principal, &p.uri)
    }
}

/// Checks that `principal` may read `uri` and that it exists: the root, the catalog and the
/// executor registry are everyone's; the memory is read directly only by repository-wide
/// maintainers (see [`memory_direct`]); a session's channels are readable within the
/// principal's scope (`-32009`) and exist with the session (`-32008`).
pub(crate) fn channel_allowed(
    principal: &Principal,
    uri: &str,
    sessions: &Sessions,
) -> Result<(), RpcError> {
    let r = ChannelRef::parse(uri);
    match r {
        ChannelRef::Root | ChannelRef::Catalog | ChannelRef::Executors => Ok(()),
        ChannelRef::Memory => memory_direct(principal),
        ChannelRef::Unknown => Err(RpcError::not_found("Unknown channel")),
        _ => {
            let id = r.session_id().unwrap_or_default();
            if !principal.can_read_session(id) {
                return Err(RpcError::forbidden("You don't have access to this channel"));
            }
            if !sessions.contains(id) {
                return Err(RpcError::not_found("Unknown channel"));
            }
            Ok(())
        }
    }
}

/// `-32009` unless `principal` may use `axp-memory://` directly (subscribe, snapshot, name it
/// as a command's channel): a maintainer whose scope is every session, as in the reference.
/// Everyone else recalls lessons through `_axp/memorySearch`, which shows each caller only
/// lessons whose every evidence session it may read.
pub(crate) fn memory_direct(principal: &Principal) -> Result<(), RpcError> {
    crate::axp::maintain(principal)?;
    if principal.sessions != crate::principal::SessionScope::All {
        return Err(RpcError::forbidden(
            "Only repository-wide maintainers can read memory directly; use search instead",
        ));
    }
    Ok(())
}

pub(crate) fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = hex {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
