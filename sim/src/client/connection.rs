//! A client's side of one connection: what it has outstanding (requests, dispatches that may
//! still be rejected, client-service calls), what it is leaving, and what it heard.

use std::collections::{BTreeMap, BTreeSet};

use axhost_core::ConnId;

use crate::roles::{Call, Handled};

/// What an outstanding request was, so its response can be checked and applied.
#[derive(Clone, Debug)]
pub enum Request {
    /// `initialize` with these initial subscriptions.
    Initialize {
        /// Channels asked for.
        subscriptions: Vec<String>,
        /// The version the host must pick: the highest offered `0.9.x`.
        version: &'static str,
    },
    /// `reconnect` from `cursor` with these subscriptions.
    Reconnect {
        /// Channels asked for.
        subscriptions: Vec<String>,
        /// `lastSeenServerSeq` sent.
        cursor: u64,
    },
    /// `subscribe`.
    Subscribe {
        /// The channel.
        channel: String,
    },
    /// `unsubscribe` as a request.
    Unsubscribe,
    /// `createSession` for a pool id (or a malformed URI).
    CreateSession {
        /// The session id, when the URI named one.
        id: Option<String>,
    },
    /// `listSessions` with this page limit.
    ListSessions {
        /// The `limit` sent, if any.
        limit: Option<u64>,
    },
    /// `dispatchAction` as a request.
    Dispatch,
    /// `ping`.
    Ping,
    /// `client/registerService`.
    RegisterService,
    /// `client/updateService`; `own` says whether this connection registered it (`None`:
    /// unknown, a `registerService` answer is still in flight).
    UpdateService {
        /// Whether the service belongs to this connection.
        own: Option<bool>,
    },
    /// `client/unregisterService`; `own` as for `UpdateService`.
    UnregisterService {
        /// The service.
        service_id: String,
        /// Whether the service belongs to this connection.
        own: Option<bool>,
    },
    /// Anything answered with an error we do not model (unknown method, bad params…).
    Other,
}

impl Request {
    /// Whether the host answers it at once, past frames it holds for the disk: `ping` and
    /// the client-service calls depend on nothing durable.
    pub fn passes_held_frames(&self) -> bool {
        matches!(
            self,
            Request::Ping
                | Request::RegisterService
                | Request::UpdateService { .. }
                | Request::UnregisterService { .. }
        )
    }
}

impl Request {
    fn name(&self) -> &'static str {
        match self {
            Request::Initialize { .. } => "initialize",
            Request::Reconnect { .. } => "reconnect",
            Request::Subscribe { .. } => "subscribe",
            Request::Unsubscribe => "unsubscribe",
            Request::CreateSession { .. } => "createSession",
            Request::ListSessions { .. } => "listSessions",
            Request::Dispatch => "dispatchAction",
            Request::Ping => "ping",
            Request::RegisterService => "client/registerService",
            Request::UpdateService { .. } => "client/updateService",
            Request::UnregisterService { .. } => "client/unregisterService",
            Request::Other => "other",
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Pending {
    /// Index of the message on its connection.
    pub(crate) index: u64,
    pub(crate) request: Request,
}

/// The client's side of one connection.
#[derive(Debug)]
pub struct Connection {
    /// The connection id.
    pub conn: ConnId,
    /// `initialize` or `reconnect` succeeded.
    pub ready: bool,
    /// An `initialize` or `reconnect` is outstanding.
    pub handshake_pending: bool,
    pub(crate) pending: BTreeMap<String, Pending>,
    /// Malformed frames sent whose `id: null` error has not arrived yet.
    pub(crate) null_errors_expected: u32,
    /// Channels unsubscribed at a message index the host may not have processed yet.
    pub(crate) leaving: BTreeMap<String, u64>,
    /// Messages sent so far on this connection.
    pub(crate) sent: u64,
    /// Highest non-rejected `serverSeq` (or snapshot `fromSeq`) seen on this connection.
    pub(crate) seq_last: u64,
    /// `clientSeq ->` [`super::action_identity`] of each dispatch sent on this connection that
    /// may still be rejected. Content matters: under the host's receipt rule a `clientSeq` may be
    /// reused, and an echo of the old use (sent on an earlier connection) can arrive here.
    pub(crate) dispatches: BTreeMap<u64, Vec<String>>,
    /// Frames received on this connection.
    pub(crate) received: u64,
    /// The host answered `initialize` with -32005 (a close must follow).
    pub(crate) unsupported_version: bool,
    /// A `-32603` for a failed commit arrived: a 1011 close may follow (the host rolled back
    /// state this connection was shown).
    pub(crate) rolled_back: bool,
    /// Client services this connection registered and has not unregistered.
    pub services: BTreeSet<String>,
    /// `clientService/request`s sent and not answered, by id. An id may be outstanding more
    /// than once: a deliberate duplicate is refused with -32600 while the first is pending.
    pub(crate) calls: BTreeMap<String, Vec<Call>>,
    /// As a service owner: the host request ids this connection was sent.
    pub(crate) handled: BTreeMap<u64, Handled>,
    /// As a notifier: the last sequence number sent to each service id.
    pub(crate) notify_seq: BTreeMap<String, u64>,
    /// As a service owner: the last sequence number heard per (sender clientId, sender
    /// connection epoch, service id).
    pub(crate) heard: BTreeMap<(String, u64, String), u64>,
}

impl Connection {
    /// Resolves one dispatch sent on this connection with `client_seq` and this content.
    pub(crate) fn resolve(&mut self, client_seq: u64, identity: &str) -> bool {
        let Some(sent) = self.dispatches.get_mut(&client_seq) else {
            return false;
        };
        let Some(i) = sent.iter().position(|s| s == identity) else {
            return false;
        };
        sent.remove(i);
        if sent.is_empty() {
            self.dispatches.remove(&client_seq);
        }
        true
    }

    pub(super) fn new(conn: ConnId) -> Connection {
        Connection {
            conn,
            ready: false,
            handshake_pending: false,
            pending: BTreeMap::new(),
            null_errors_expected: 0,
            leaving: BTreeMap::new(),
            sent: 0,
            seq_last: 0,
            dispatches: BTreeMap::new(),
            received: 0,
            unsupported_version: false,
            rolled_back: false,
            services: BTreeSet::new(),
            calls: BTreeMap::new(),
            handled: BTreeMap::new(),
            notify_seq: BTreeMap::new(),
            heard: BTreeMap::new(),
        }
    }

    /// Whether this connection registered service `id`; `None` while a `registerService`
    /// answer is outstanding (the catalog may announce the id before the answer arrives).
    pub fn owns(&self, id: &str) -> Option<bool> {
        if self.services.contains(id) {
            return Some(true);
        }
        let registering = self
            .pending
            .values()
            .any(|p| matches!(p.request, Request::RegisterService));
        (!registering).then_some(false)
    }

    /// Whether a response is still owed to this connection.
    pub fn awaiting(&self) -> Option<String> {
        if let Some((id, p)) = self.pending.iter().next() {
            return Some(format!("response to {} id {id}", p.request.name()));
        }
        if let Some((id, calls)) = self.calls.iter().next() {
            let service = calls.first().map_or("", |c| c.service.as_str());
            return Some(format!(
                "response to clientService/request id {id} ({service})"
            ));
        }
        (self.null_errors_expected > 0).then(|| "an id:null error".to_owned())
    }
}
