//! What a client does on its turn: a seeded, weighted choice of AHP requests, aimed well often
//! enough to drive real state changes and badly often enough to hit every refusal path.
//!
//! Actions are aimed with the client's own mirror (the active turn id, pending message ids),
//! like a user clicking in a UI that may be stale. Session ids come from a small pool so
//! `createSession` collides, turn and pending ids from small pools so duplicates happen.

use ahp_types::state::ChatState;
use rand::Rng;
use serde_json::{json, Value};

use crate::client::{Request, SimClient, ROOT};
use crate::options::Options;
use crate::replica::CATALOG;
use crate::roles::Gossip;

/// What a turn asks of the world (things only the world can do: sockets and the network).
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Intent {
    /// Nothing beyond the frames in the client's outbox.
    Nothing,
    /// Open a connection.
    Connect,
    /// Drop the connection; abrupt loses unsent messages.
    Disconnect {
        /// Whether messages in flight to the host are lost.
        abrupt: bool,
    },
    /// Stop reading for this long (slow consumer).
    Clog {
        /// Duration of the clog.
        ms: u64,
    },
}

impl SimClient {
    pub(crate) fn rng_below(&mut self, n: u64) -> u64 {
        self.rng.random_range(0..n.max(1))
    }

    pub(crate) fn rng_ratio(&mut self, numerator: u64, denominator: u64) -> bool {
        self.rng_below(denominator) < numerator
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> Option<T> {
        (!items.is_empty()).then(|| items[self.rng_below(items.len() as u64) as usize].clone())
    }

    /// A pool session id, preferring ones known to exist.
    fn pick_session(&mut self) -> String {
        let known: Vec<String> = self.known_sessions.iter().cloned().collect();
        if !known.is_empty() && self.rng_ratio(2, 3) {
            if let Some(id) = self.pick(&known) {
                return id;
            }
        }
        let pool = self.session_pool.clone();
        self.pick(&pool).unwrap_or_else(|| "s0".into())
    }

    /// A channel the host must refuse: malformed, unknown, or (for scoped principals) out of
    /// scope. Never one that might exist and be readable.
    pub(crate) fn bogus_channel(&mut self) -> String {
        let mut options = vec![
            "ahp-chat:/".to_owned(),
            "x-other://thing".to_owned(),
            "ahp-session:/bad id".to_owned(),
            "ahp-changeset:/.dot".to_owned(),
        ];
        let hidden: Vec<String> = self
            .session_pool
            .iter()
            .filter(|id| !self.can_see(id))
            .cloned()
            .collect();
        options.extend(hidden.iter().map(|id| format!("ahp-chat:/{id}")));
        self.pick(&options).unwrap_or_default()
    }

    /// Any channel: root, a pool session's channel, or a bogus one.
    fn pick_channel(&mut self) -> String {
        match self.rng_below(8) {
            0 if self.rng_ratio(1, 2) => ROOT.to_owned(),
            0 => CATALOG.to_owned(),
            1 => self.bogus_channel(),
            2 => "ahp-chat:/nosuch".to_owned(),
            _ => {
                let id = self.pick_session();
                let kind =
                    ["ahp-session:/", "ahp-chat:/", "ahp-changeset:/"][self.rng_below(3) as usize];
                format!("{kind}{id}")
            }
        }
    }

    /// One turn. Returns what the world must do; frames go to `outbox`. `gossip` is what the
    /// other clients told this one (for client-services targets).
    pub fn turn(&mut self, options: &Options, gossip: &Gossip) -> Intent {
        let Some(c) = &self.connection else {
            return Intent::Connect;
        };
        if !c.ready {
            // Waiting for a handshake answer, or connected silently on purpose: the handshake
            // timer is what should end this. A ping is always allowed.
            if !c.handshake_pending && self.rng_ratio(1, 4) {
                self.request("ping", json!({ "channel": ROOT }), Request::Ping);
            } else if self.rng_ratio(1, 8) {
                // Client services before the handshake: refused with -32009, or dropped.
                if self.rng_ratio(1, 2) {
                    return self.call_something(options, gossip);
                }
                self.notify_something(options, gossip);
            }
            return Intent::Nothing;
        }
        if options.disconnect.hit(&mut self.rng) {
            let abrupt = options.disconnect_abrupt.hit(&mut self.rng);
            return Intent::Disconnect { abrupt };
        }
        if options.clog.hit(&mut self.rng) {
            let ms = self.rng.random_range(1..=options.clog_ms_max.max(1));
            return Intent::Clog { ms };
        }
        let mix = options.mix;
        let mut roll = self.rng_below(u64::from(mix.total())) as u32;
        let weights = [
            mix.subscribe,
            mix.unsubscribe,
            mix.create_session,
            mix.list_sessions,
            mix.dispatch,
            mix.ping,
            mix.garbage,
            mix.services,
            mix.call,
            mix.notify,
            mix.cancel,
            mix.forge,
        ];
        let mut choice = 0;
        for (i, w) in weights.iter().enumerate() {
            if roll < *w {
                choice = i;
                break;
            }
            roll -= w;
        }
        match choice {
            0 => self.subscribe_something(),
            1 => self.unsubscribe_something(),
            2 => self.create_session(),
            3 => self.list_sessions(),
            4 => self.dispatch_something(options),
            5 => self.request("ping", json!({ "channel": ROOT }), Request::Ping),
            6 => self.garbage(options),
            7 => self.service_something(options),
            8 => return self.call_something(options, gossip),
            9 => self.notify_something(options, gossip),
            10 => self.cancel_something(),
            _ => self.forge_something(gossip),
        }
        Intent::Nothing
    }

    /// `subscribe` to some channel (a scripted test may name it).
    pub fn subscribe_something(&mut self) {
        let channel = self.pick_channel();
        self.subscribe(&channel);
    }

    /// `subscribe` to `channel`.
    pub fn subscribe(&mut self, channel: &str) {
        self.request(
            "subscribe",
            json!({ "channel": channel }),
            Request::Subscribe {
                channel: channel.to_owned(),
            },
        );
    }

    fn unsubscribe_something(&mut self) {
        let mirrored: Vec<String> = self.replicas.keys().cloned().collect();
        let channel = match self.pick(&mirrored) {
            Some(c) if self.rng_ratio(4, 5) => c,
            _ => self.pick_channel(),
        };
        let as_request = self.rng_ratio(2, 3);
        self.unsubscribe(&channel, as_request);
    }

    /// `unsubscribe` from `channel`, as a request or a notification.
    pub fn unsubscribe(&mut self, channel: &str, as_request: bool) {
        self.leave(channel);
        let params = json!({ "channel": channel });
        if as_request {
            self.request("unsubscribe", params, Request::Unsubscribe);
        } else {
            self.notify("unsubscribe", params);
        }
    }

    fn create_session(&mut self) {
        let roll = self.rng_below(20);
        let id = self
            .pick(&self.session_pool.clone())
            .unwrap_or_else(|| "s0".into());
        let (channel, named) = match roll {
            0 => ("ahp-session:/".to_owned(), None),
            1 => (format!("axp-session:/{id}"), Some(id)),
            _ => (format!("ahp-session:/{id}"), Some(id)),
        };
        let mut params = json!({ "channel": channel });
        match self.rng_below(20) {
            0 => params["provider"] = json!("other"),
            1..=9 => params["provider"] = json!("axp"),
            _ => {}
        }
        let mut config = serde_json::Map::new();
        if self.rng_ratio(1, 2) {
            config.insert(
                "title".into(),
                json!(format!("Session by {}", self.client_id)),
            );
        }
        if self.rng_ratio(1, 6) {
            // Shared task names: an open session already owning one is a conflict.
            config.insert("task".into(), json!(format!("task-{}", self.rng_below(2))));
        }
        if self.rng_ratio(1, 30) {
            config.insert("title".into(), json!("   "));
        }
        if !config.is_empty() {
            params["config"] = Value::Object(config);
        }
        self.create_session_with(params, named);
    }

    /// `createSession` with explicit params; `id` is the session the URI names.
    pub fn create_session_with(&mut self, params: Value, id: Option<String>) {
        self.request("createSession", params, Request::CreateSession { id });
    }

    fn list_sessions(&mut self) {
        let mut params = json!({});
        let mut limit = None;
        if self.rng_ratio(1, 2) {
            let l: u64 = self.rng.random_range(1..=4);
            params["limit"] = json!(l);
            limit = Some(l);
        }
        if self.rng_ratio(1, 2) {
            if let Some(cursor) = self.list_cursor.clone() {
                params["cursor"] = json!(cursor);
            }
        }
        if self.rng_ratio(1, 20) {
            params["cursor"] = json!("not-a-cursor");
        }
        self.request("listSessions", params, Request::ListSessions { limit });
    }

    fn dispatch_something(&mut self, options: &Options) {
        // A retry of the last dispatch (same clientSeq, same input) must never apply twice.
        if self.rng_ratio(1, 15) {
            if let Some((seq, channel, action)) = self.last_dispatch.clone() {
                let as_request = self.rng_ratio(1, 2);
                self.dispatch_with(seq, channel, action, as_request);
                return;
            }
        }
        let channel = self.dispatch_target();
        let chat = self.replicas.get(&channel).and_then(|r| r.chat()).cloned();
        let action = self.chat_action(chat.as_ref(), options);
        let last = self.last_dispatch.as_ref().map(|d| d.0);
        let seq = match last {
            // Reusing a clientSeq with different input is a conflict once the first applied.
            Some(last) if self.rng_ratio(1, 40) => last,
            _ => {
                let s = self.next_client_seq;
                self.next_client_seq += 1;
                s
            }
        };
        let as_request = self.rng_ratio(1, 2);
        self.dispatch_with(seq, Value::String(channel), action, as_request);
    }

    /// Sends `dispatchAction` with an explicit `clientSeq`, channel and action.
    pub fn dispatch_with(
        &mut self,
        client_seq: u64,
        channel: Value,
        action: Value,
        as_request: bool,
    ) {
        self.dispatching(client_seq, &channel, &action, as_request);
        self.last_dispatch = Some((client_seq, channel.clone(), action.clone()));
        let params = json!({ "channel": channel, "clientSeq": client_seq, "action": action });
        if as_request {
            self.request("dispatchAction", params, Request::Dispatch);
        } else {
            self.notify("dispatchAction", params);
        }
    }

    /// Takes the next `clientSeq` (scripted tests).
    pub fn take_client_seq(&mut self) -> u64 {
        let s = self.next_client_seq;
        self.next_client_seq += 1;
        s
    }

    fn dispatch_target(&mut self) -> String {
        match self.rng_below(20) {
            0 => ROOT.to_owned(),
            1 => format!("ahp-session:/{}", self.pick_session()),
            2 => "ahp-chat:/nosuch".to_owned(),
            3 => self.bogus_channel(),
            _ => {
                let chats: Vec<String> = self
                    .replicas
                    .keys()
                    .filter(|k| k.starts_with("ahp-chat:/"))
                    .cloned()
                    .collect();
                match self.pick(&chats) {
                    Some(c) if self.rng_ratio(2, 3) => c,
                    _ => format!("ahp-chat:/{}", self.pick_session()),
                }
            }
        }
    }

    fn message(&mut self) -> Value {
        let kind = if self.rng_ratio(1, 12) {
            "agent"
        } else {
            "user"
        };
        json!({ "text": format!("hello {}", self.rng_below(1000)), "origin": { "kind": kind } })
    }

    /// One chat action: valid, stale, invalid, server-only or unknown.
    fn chat_action(&mut self, chat: Option<&ChatState>, options: &Options) -> Value {
        let me = self.index;
        let active = chat
            .and_then(|c| c.active_turn.as_ref())
            .map(|t| t.id.clone());
        let turn_ids: Vec<String> = chat
            .map(|c| c.turns.iter().map(|t| t.id.clone()).collect())
            .unwrap_or_default();
        let pending_ids: Vec<(String, &str)> = chat
            .map(|c| {
                let mut v: Vec<(String, &str)> = c
                    .steering_message
                    .iter()
                    .map(|m| (m.id.clone(), "steering"))
                    .collect();
                v.extend(
                    c.queued_messages
                        .iter()
                        .flatten()
                        .map(|m| (m.id.clone(), "queued")),
                );
                v
            })
            .unwrap_or_default();
        match self.rng_below(100) {
            0..=29 => {
                let turn_id = match self.pick(&turn_ids) {
                    Some(id) if self.rng_ratio(1, 5) => id,
                    _ => format!("t{me}-{}", self.rng_below(1_000_000)),
                };
                json!({
                    "type": "chat/turnStarted",
                    "turnId": turn_id,
                    "startedAt": "2020-01-01T00:00:00.000Z",
                    "message": self.message(),
                })
            }
            30..=49 => {
                let kind = if self.rng_ratio(1, 2) {
                    "steering"
                } else {
                    "queued"
                };
                json!({
                    "type": "chat/pendingMessageSet",
                    "kind": kind,
                    "id": format!("m{me}-{}", self.rng_below(4)),
                    "message": self.message(),
                })
            }
            50..=59 => {
                let (id, kind) = match self.pick(&pending_ids) {
                    Some(p) if self.rng_ratio(2, 3) => p,
                    _ => (format!("m{me}-{}", self.rng_below(4)), "queued"),
                };
                json!({ "type": "chat/pendingMessageRemoved", "kind": kind, "id": id })
            }
            60..=79 => {
                let turn_id = match &active {
                    Some(id) if self.rng_ratio(3, 4) => id.clone(),
                    _ => "t-wrong".to_owned(),
                };
                let duration: i64 = match self.rng_below(12) {
                    0 => -5,
                    1 => 9_000_000_000_000_000,
                    _ => self.rng.random_range(0..=5000),
                };
                json!({ "type": "chat/turnCancelled", "turnId": turn_id, "duration": duration })
            }
            80..=86 => match self.rng_below(3) {
                0 => {
                    json!({ "type": "chat/turnComplete", "turnId": active.unwrap_or_default(), "duration": 5 })
                }
                1 => json!({ "type": "chat/delta", "turnId": "x", "partId": "p", "content": "c" }),
                _ => json!({ "type": "session/titleChanged", "title": "Renamed" }),
            },
            87..=90 => json!({
                "type": "chat/toolCallConfirmed",
                "turnId": active.unwrap_or_default(),
                "toolCallId": "tc-1",
                "approved": true,
            }),
            91..=94 => json!({ "type": "chat/frobnicated", "x": 1 }),
            95..=97 => json!({ "type": "chat/turnStarted" }),
            _ => {
                // Big enough to cross a small message limit sometimes.
                let pad = "x".repeat(
                    self.rng_below(u64::from(options.limits.message_bytes_max.min(8192))) as usize,
                );
                json!({ "type": "chat/turnStarted", "turnId": "big", "startedAt": "", "message": { "text": pad, "origin": { "kind": "user" } } })
            }
        }
    }

    /// Client services: register, update or unregister (own or someone else's), or watch the
    /// catalog.
    fn service_something(&mut self, options: &Options) {
        let own: Vec<String> = self
            .connection
            .iter()
            .flat_map(|c| c.services.iter().cloned())
            .collect();
        let seen: Vec<String> = self
            .replicas
            .get(CATALOG)
            .map(|r| {
                let services = r
                    .json()
                    .get("services")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                services
                    .iter()
                    .filter_map(|s| {
                        s.get("serviceId")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    })
                    .collect()
            })
            .unwrap_or_default();
        let target = match (self.pick(&own), self.pick(&seen)) {
            (Some(id), _) if self.rng_ratio(2, 3) => Some(id),
            (_, Some(id)) => Some(id),
            (Some(id), None) => Some(id),
            (None, None) => None,
        };
        match (self.rng_below(10), target) {
            (0..=3, _) | (4..=8, None) => self.register_service(options),
            (4..=5, Some(id)) => {
                let own = self.connection.as_ref().and_then(|c| c.owns(&id));
                let mut params = json!({ "channel": CATALOG, "serviceId": id });
                if self.rng_ratio(1, 2) {
                    params["metadata"] = json!({ "protocol": "proto-1", "label": format!("v{}", self.rng_below(100)) });
                }
                if self.rng_ratio(1, 2) {
                    params["audience"] = self.audience(options).unwrap_or(Value::Null);
                }
                self.request(
                    "client/updateService",
                    params,
                    Request::UpdateService { own },
                );
            }
            (6..=8, Some(id)) => {
                let own = self.connection.as_ref().and_then(|c| c.owns(&id));
                let params = json!({ "channel": CATALOG, "serviceId": id });
                self.request(
                    "client/unregisterService",
                    params,
                    Request::UnregisterService {
                        service_id: id,
                        own,
                    },
                );
            }
            _ => self.subscribe(CATALOG),
        }
    }

    /// Some principal ids of this run (the world names principals `p0`, `p1`, …), or `None`.
    fn audience(&mut self, options: &Options) -> Option<Value> {
        if self.rng_ratio(1, 2) {
            return None;
        }
        let ids: Vec<String> = (0..options.clients)
            .filter(|_| self.rng_ratio(1, 2))
            .map(|i| format!("p{i}"))
            .collect();
        Some(json!(ids))
    }

    /// `client/updateService` with explicit params, for a service this connection owns
    /// (scripted tests).
    pub fn update_service_with(&mut self, params: Value) {
        let own = Some(true);
        self.request(
            "client/updateService",
            params,
            Request::UpdateService { own },
        );
    }

    /// `client/registerService` with explicit params (scripted tests).
    pub fn register_service_with(&mut self, params: Value) {
        self.request("client/registerService", params, Request::RegisterService);
    }

    fn register_service(&mut self, options: &Options) {
        let mut params = json!({
            "channel": CATALOG,
            "metadata": { "protocol": format!("proto-{}", self.rng_below(3)), "label": format!("service of {}", self.client_id) },
        });
        if let Some(audience) = self.audience(options) {
            params["audience"] = audience;
        }
        match self.rng_below(20) {
            0 => params["metadata"] = json!([1, 2]),
            1 => params["channel"] = json!(ROOT),
            _ => {}
        }
        self.request("client/registerService", params, Request::RegisterService);
    }

    /// Malformed frames and requests the host must refuse without harm.
    fn garbage(&mut self, options: &Options) {
        let id = 1_000_000 + self.rng_below(1_000_000);
        match self.rng_below(11) {
            0 => self.send_raw(b"not json at all".to_vec(), true),
            1 => self.send_raw(b"[1,2,3]".to_vec(), true),
            2 => self.send_raw(
                br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#.to_vec(),
                true,
            ),
            3 => self.send_raw(
                br#"{"jsonrpc":"1.0","id":5,"method":"ping"}"#.to_vec(),
                true,
            ),
            4 => self.notify("frobnicate", json!({})),
            5 => self.request("frobnicate", json!({ "channel": ROOT }), Request::Other),
            6 => self.send_raw(
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":null}}"#).into_bytes(),
                false,
            ),
            7 => self.request("subscribe", json!({ "channel": 5 }), Request::Other),
            8 => {
                // Already initialized: a second handshake on the same connection is a conflict.
                let params = json!({ "channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": self.client_id });
                self.request("initialize", params, Request::Other);
            }
            9 => {
                let params = json!({ "channel": ROOT, "clientId": self.client_id, "lastSeenServerSeq": 0, "subscriptions": [] });
                self.request("reconnect", params, Request::Other);
            }
            _ => {
                let pad = "y".repeat(options.limits.message_bytes_max as usize + 1);
                self.request(
                    "ping",
                    json!({ "channel": ROOT, "pad": pad }),
                    Request::Other,
                );
            }
        }
    }
}
