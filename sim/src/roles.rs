//! A simulated client's client-services roles: caller, notifier, service owner and forger, with
//! what each checks as frames arrive.
//!
//! - A *caller* sends `clientService/request` under ids `1..=5` and `"1"`, `"2"` on every
//!   connection (so ids collide across connections on purpose, and now and then within one: a
//!   duplicate of a pending id is refused with -32600), with and without `timeoutMs`, to
//!   visible, own, stale, invisible and made-up service ids, sometimes malformed; it cancels its
//!   own calls and sometimes leaves with calls pending. Every answer must match an outstanding
//!   call of this connection and carry a documented code (or one the owners use).
//! - A *notifier* sends `clientService/notify` with a payload `{from, epoch, seq}`: its
//!   clientId, its connection epoch and a per-(connection, service) sequence number.
//! - An *owner* answers `clientService/handleRequest` after a seeded delay, sometimes never,
//!   twice, after the request was cancelled, or on its next connection; it checks that it is
//!   only sent requests, cancellations and notifications for services it owns, each host id
//!   once, and that notifications from one sender connection arrive in order, stamped with the
//!   sender's clientId.
//! - A *forger* answers a host id it heard from another client (or made up).
//!
//! Exact outcomes (which code, which content, which connection) are the checker's business
//! ([`crate::services`]); here a client checks only what it can know itself.

use std::collections::VecDeque;

use axhost_core::ConnId;
use rand::Rng;
use serde_json::{json, Value};

use crate::client::{SimClient, ROOT};
use crate::options::Options;
use crate::replica::CATALOG;
use crate::script::Intent;

/// Error codes the host itself answers calls with (docs/client-services.md), plus -32009 for a
/// call before the handshake.
pub const HOST_CALL_CODES: &[i64] = &[
    -32008, -32009, -32043, -32050, -32051, -32800, -32600, -32602, -32603,
];

/// Error codes simulated owners answer with.
pub const APP_CODES: &[i64] = &[-32000, -32601, 1, 7, 4242];

/// Call ids: the same few on every connection.
const CALL_IDS: [&str; 7] = ["1", "2", "3", "4", "5", "\"1\"", "\"2\""];

/// An outstanding call.
#[derive(Clone, Debug)]
pub struct Call {
    /// The service id it named (for liveness reports).
    pub(crate) service: String,
}

/// A host request id this connection was sent, as an owner.
#[derive(Clone, Debug, Default)]
pub struct Handled {
    /// The host sent `$/cancelRequest` for it.
    pub cancelled: bool,
}

/// A `clientService/handleRequest` heard by a manual owner.
#[derive(Clone, Debug)]
pub struct Heard {
    /// The host's id for it.
    pub host_id: u64,
    /// The service asked.
    pub service_id: String,
    /// The caller's clientId, as the host stamped it.
    pub sender: String,
    /// The application method.
    pub method: String,
    /// The application params.
    pub params: Value,
}

/// An answer an owner will send after a delay.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The connection that was sent the request.
    pub conn: ConnId,
    /// The host's id for it.
    pub host_id: u64,
    /// Delay from now.
    pub delay_ms: u64,
    /// The whole response frame.
    pub frame: String,
}

/// Something one client tells the others, outside the host.
#[derive(Clone, Debug)]
pub enum Rumor {
    /// A host request id this client was sent.
    HostId(u64),
    /// A service id this client registered.
    ServiceId(String),
}

/// What clients told each other: recent host request ids (forged responses aim with them) and
/// service ids (calls and notifications to services the sender may not see, or that are gone).
#[derive(Clone, Debug, Default)]
pub struct Gossip {
    /// Recent host request ids, oldest first. Cleared when the host restarts: the next host
    /// numbers its requests from 1 again.
    pub host_ids: VecDeque<u64>,
    /// Recent service ids, oldest first.
    pub service_ids: VecDeque<String>,
}

/// Rumors kept of each kind.
const GOSSIP_MAX: usize = 16;

impl Gossip {
    /// Remembers one rumor.
    pub fn hear(&mut self, rumor: Rumor) {
        match rumor {
            Rumor::HostId(id) => {
                self.host_ids.push_back(id);
                if self.host_ids.len() > GOSSIP_MAX {
                    self.host_ids.pop_front();
                }
            }
            Rumor::ServiceId(id) => {
                self.service_ids.push_back(id);
                if self.service_ids.len() > GOSSIP_MAX {
                    self.service_ids.pop_front();
                }
            }
        }
    }
}

impl SimClient {
    // ─── Turns ──────────────────────────────────────────────────────────────────────────────

    /// A service id to aim at: own, from the catalog, from gossip (maybe invisible or gone),
    /// or made up.
    fn service_target(&mut self, gossip: &Gossip) -> String {
        let own: Vec<String> = self
            .connection
            .iter()
            .flat_map(|c| c.services.iter().cloned())
            .collect();
        let seen: Vec<String> = self
            .replicas
            .get(CATALOG)
            .and_then(|r| r.json().get("services").and_then(Value::as_array).cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|s| s.get("serviceId").and_then(Value::as_str))
            .map(str::to_owned)
            .collect();
        let heard: Vec<String> = gossip.service_ids.iter().cloned().collect();
        // The newest rumors are the likeliest to be alive still.
        let recent: Vec<String> = gossip.service_ids.iter().rev().take(3).cloned().collect();
        let roll = self.rng_below(20);
        let pick = match roll {
            0..=5 => self.pick_of(&own),
            6..=13 => self.pick_of(&seen),
            14..=16 => self.pick_of(&recent),
            17..=18 => self.pick_of(&heard),
            _ => None,
        };
        pick.or_else(|| self.pick_of(&seen))
            .or_else(|| self.pick_of(&own))
            .or_else(|| self.pick_of(&recent))
            .unwrap_or_else(|| "svc_00000000000000000000000000000000".to_owned())
    }

    fn pick_of(&mut self, items: &[String]) -> Option<String> {
        (!items.is_empty()).then(|| items[self.rng_below(items.len() as u64) as usize].clone())
    }

    /// Whether this turn goes to watching the catalog instead (callers and notifiers aim
    /// better with it).
    fn watch_catalog_first(&mut self) -> bool {
        let watching = self.replicas.contains_key(CATALOG)
            || self
                .connection
                .as_ref()
                .is_some_and(|c| c.leaving.contains_key(CATALOG));
        if watching || !self.rng_ratio(1, 3) {
            return false;
        }
        self.subscribe(CATALOG);
        true
    }

    /// A caller's turn: one `clientService/request`, sometimes leaving right after it.
    pub(crate) fn call_something(&mut self, options: &Options, gossip: &Gossip) -> Intent {
        if self.watch_catalog_first() {
            return Intent::Nothing;
        }
        let service = self.service_target(gossip);
        let outstanding: Vec<String> = self
            .connection
            .iter()
            .flat_map(|c| c.calls.keys().cloned())
            .collect();
        let free: Vec<String> = CALL_IDS
            .iter()
            .map(|id| (*id).to_owned())
            .filter(|id| !outstanding.contains(id))
            .collect();
        let id = match self.pick_of(&free) {
            // Now and then a duplicate of a pending id (refused while that one is pending).
            Some(_) if !outstanding.is_empty() && self.rng_ratio(1, 10) => {
                self.pick_of(&outstanding)
            }
            Some(id) => Some(id),
            None => self.pick_of(&outstanding),
        }
        .unwrap_or_else(|| "1".to_owned());
        let params = self.call_params(options, &service);
        self.send_call(&id, &params, &service);
        if self.rng_ratio(1, 40) {
            let abrupt = self.rng_ratio(1, 2);
            return Intent::Disconnect { abrupt };
        }
        Intent::Nothing
    }

    /// The params of a call: mostly well-formed, sometimes at the payload limit, sometimes
    /// malformed in one way.
    fn call_params(&mut self, options: &Options, service: &str) -> String {
        let payload = self.payload(options);
        let method = ["get", "slow", "echo"][self.rng_below(3) as usize];
        let mut p = json!({ "channel": CATALOG, "serviceId": service, "method": method });
        if self.rng_ratio(1, 2) {
            let timeout: u64 = match self.rng_below(10) {
                0 => 10_000_000,
                1..=3 => self.rng.random_range(1..=50),
                _ => self.rng.random_range(50..=3000),
            };
            p["timeoutMs"] = json!(timeout);
        }
        if self.rng_ratio(1, 15) {
            match self.rng_below(8) {
                0 => p["method"] = json!(""),
                1 => p["method"] = json!("m".repeat(257)),
                2 => p["timeoutMs"] = json!(0),
                3 => p["timeoutMs"] = json!("soon"),
                4 => p["channel"] = json!(ROOT),
                5 => p["serviceId"] = json!(7),
                6 => {
                    if let Some(m) = p.as_object_mut() {
                        m.remove("method");
                    }
                }
                _ => return p.to_string(),
            }
        }
        // Splice the payload in as text so its bytes are exactly what this client chose.
        let text = p.to_string();
        format!("{},\"params\":{payload}}}", &text[..text.len() - 1])
    }

    /// An application payload as JSON text: small, with escapes and odd spacing the host must
    /// forward byte for byte, or sized around a small payload limit.
    fn payload(&mut self, options: &Options) -> String {
        let n = self.rng_below(1_000_000);
        let max = options.limits.service_payload_bytes_max as usize;
        match self.rng_below(20) {
            0 if max <= 8192 => {
                let base = format!(r#"{{"n":{n},"pad":""}}"#).len();
                let len = [max - 1, max, max + 1, max + 100][self.rng_below(4) as usize];
                format!(r#"{{"n":{n},"pad":"{}"}}"#, "p".repeat(len - base))
            }
            1 | 2 => format!(r#"{{ "n" : {n}, "s": "\u00e9\n\"q\"" }}"#),
            3 => "[1, 2 ,3]".to_owned(),
            4 => "null".to_owned(),
            _ => format!(r#"{{"n":{n}}}"#),
        }
    }

    /// Sends a call with `params` (JSON text) under the raw id `id`, and remembers it.
    fn send_call(&mut self, id: &str, params: &str, service: &str) {
        let Some(c) = self.connection.as_mut() else {
            return;
        };
        c.calls.entry(id.to_owned()).or_default().push(Call {
            service: service.to_owned(),
        });
        c.sent += 1;
        self.stats.calls += 1;
        let frame = format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"clientService/request","params":{params}}}"#
        );
        self.outbox.push(frame.into_bytes());
    }

    /// `clientService/request` to `service` under caller id `id` (scripted tests).
    pub fn call(
        &mut self,
        id: Value,
        service: &str,
        method: &str,
        params: Value,
        timeout_ms: Option<u64>,
    ) {
        let mut p =
            json!({ "channel": CATALOG, "serviceId": service, "method": method, "params": params });
        if let Some(t) = timeout_ms {
            p["timeoutMs"] = json!(t);
        }
        self.send_call(&id.to_string(), &p.to_string(), service);
    }

    /// A caller's turn: cancel an own outstanding call, or send a cancel that matches nothing.
    pub(crate) fn cancel_something(&mut self) {
        let outstanding: Vec<String> = self
            .connection
            .iter()
            .flat_map(|c| c.calls.keys().cloned())
            .collect();
        let id = match self.pick_of(&outstanding) {
            Some(id) if self.rng_ratio(7, 8) => id,
            None if self.rng_ratio(3, 4) => return,
            _ => "99".to_owned(),
        };
        let channel = if self.rng_ratio(1, 20) { ROOT } else { CATALOG };
        let params = format!(r#"{{"channel":"{channel}","id":{id}}}"#);
        self.notify_raw("$/cancelRequest", &params);
    }

    /// `$/cancelRequest` for the caller's own id `id` (scripted tests).
    pub fn cancel(&mut self, id: Value) {
        let params = json!({ "channel": CATALOG, "id": id }).to_string();
        self.notify_raw("$/cancelRequest", &params);
    }

    fn notify_raw(&mut self, method: &str, params: &str) {
        let Some(c) = self.connection.as_mut() else {
            return;
        };
        c.sent += 1;
        let frame = format!(r#"{{"jsonrpc":"2.0","method":"{method}","params":{params}}}"#);
        self.outbox.push(frame.into_bytes());
    }

    /// A notifier's turn: one `clientService/notify`, sequenced, sometimes malformed.
    pub(crate) fn notify_something(&mut self, options: &Options, gossip: &Gossip) {
        if self.watch_catalog_first() {
            return;
        }
        let service = self.service_target(gossip);
        let mut payload = self.sequenced(&service);
        let mut p = json!({ "channel": CATALOG, "serviceId": service, "method": "changed" });
        if self.rng_ratio(1, 10) {
            // Whatever a sender claims, the host stamps who it is.
            p["senderClientId"] = json!("mallory");
        }
        self.stats.notifies += 1;
        match self.rng_below(30) {
            0 => p["method"] = json!(""),
            1 => p["method"] = json!("n".repeat(257)),
            2 => p["channel"] = json!(ROOT),
            3 => p["serviceId"] = json!(7),
            // No params at all.
            4 => return self.notify_raw("clientService/notify", &p.to_string()),
            5 => payload = "[1,2]".to_owned(),
            // An escaped method name: forwarded decoded (re-encoding is the host's choice).
            7 => p["method"] = json!("caf\u{e9}\n"),
            6 => {
                let max = options.limits.service_payload_bytes_max as usize;
                if max <= 8192 {
                    payload = format!(r#"{{"pad":"{}"}}"#, "p".repeat(max + 1));
                }
            }
            _ => {}
        }
        let text = p.to_string();
        let params = format!("{},\"params\":{payload}}}", &text[..text.len() - 1]);
        self.notify_raw("clientService/notify", &params);
    }

    /// The next sequenced payload to `service` from this connection, as JSON text (now and
    /// then with escapes the host must not re-encode).
    fn sequenced(&mut self, service: &str) -> String {
        let epoch = self.epoch();
        let Some(c) = self.connection.as_mut() else {
            return "{}".into();
        };
        let seq = c.notify_seq.entry(service.to_owned()).or_insert(0);
        *seq += 1;
        let seq = *seq;
        let id = self.client_id.clone();
        if self.rng_ratio(1, 10) {
            format!(r#"{{ "from" : "{id}", "epoch": {epoch}, "seq": {seq}, "s": "\u00e9\t" }}"#)
        } else {
            format!(r#"{{"from":"{id}","epoch":{epoch},"seq":{seq}}}"#)
        }
    }

    /// `clientService/notify` to `service` with the next sequenced payload (scripted tests).
    pub fn notify_service(&mut self, service: &str, method: &str) {
        let payload = self.sequenced(service);
        let params = format!(
            r#"{{"channel":"{CATALOG}","serviceId":"{service}","method":"{method}","params":{payload}}}"#
        );
        self.stats.notifies += 1;
        self.notify_raw("clientService/notify", &params);
    }

    /// A forger's turn: a response for a host id this connection was never sent.
    pub(crate) fn forge_something(&mut self, gossip: &Gossip) {
        let Some(own) = self
            .connection
            .as_ref()
            .map(|c| c.handled.keys().copied().collect::<Vec<u64>>())
        else {
            return;
        };
        let heard: Vec<u64> = gossip
            .host_ids
            .iter()
            .copied()
            .filter(|h| !own.contains(h))
            .collect();
        let high = gossip.host_ids.iter().copied().max().unwrap_or(0);
        let host_id = match heard.is_empty() {
            false if self.rng_ratio(3, 4) => heard[self.rng_below(heard.len() as u64) as usize],
            _ => self.rng.random_range(1..=high + 3),
        };
        if own.contains(&host_id) {
            // Sent to this very connection: an answer, not a forgery.
            return;
        }
        let body = if self.rng_ratio(1, 2) {
            format!(r#""result":{{"forged":"{}"}}"#, self.client_id)
        } else {
            r#""error":{"code":7,"message":"forged"}"#.to_owned()
        };
        self.stats.forged += 1;
        // Now and then the id as a string: never a host id.
        let id = if self.rng_ratio(1, 8) {
            format!("\"{host_id}\"")
        } else {
            host_id.to_string()
        };
        let frame = format!(r#"{{"jsonrpc":"2.0","id":{id},{body}}}"#);
        self.send_raw(frame.into_bytes(), false);
    }

    // ─── The owner ──────────────────────────────────────────────────────────────────────────

    /// `clientService/handleRequest` with host id `id`.
    pub(crate) fn on_handle_request(&mut self, id: &Value, params: &Value) -> Result<(), String> {
        let host_id = id
            .as_u64()
            .ok_or_else(|| format!("handleRequest with a host id that is not a u64: {id}"))?;
        let field = |k: &str| params.get(k).and_then(Value::as_str).unwrap_or_default();
        let (service, sender, method) =
            (field("serviceId"), field("senderClientId"), field("method"));
        if field("channel") != CATALOG {
            return Err(format!(
                "handleRequest {host_id} not on the catalog channel: {params}"
            ));
        }
        let Some(c) = self.connection.as_mut() else {
            return Ok(());
        };
        if !c.services.contains(service) {
            return Err(format!(
                "handleRequest {host_id} for {service}, which this connection does not own"
            ));
        }
        if c.handled.insert(host_id, Handled::default()).is_some() {
            return Err(format!(
                "handleRequest {host_id} sent to this connection twice"
            ));
        }
        let conn = c.conn;
        self.stats.handled += 1;
        self.told.push(Rumor::HostId(host_id));
        let payload = params.get("params").cloned().unwrap_or(Value::Null);
        if self.manual {
            self.inbox.push(Heard {
                host_id,
                service_id: service.to_owned(),
                sender: sender.to_owned(),
                method: method.to_owned(),
                params: payload,
            });
            return Ok(());
        }
        let o = self.owners;
        if o.never.hit(&mut self.rng) {
            return Ok(());
        }
        let delay_ms = if o.slow.hit(&mut self.rng) {
            self.rng.random_range(1..=o.slow_ms_max.max(1))
        } else {
            self.rng.random_range(0..=o.delay_ms_max)
        };
        let frame = self.answer_frame(host_id, &payload);
        self.answers.push(Answer {
            conn,
            host_id,
            delay_ms,
            frame,
        });
        if o.twice.hit(&mut self.rng) {
            let delay_ms = delay_ms + self.rng.random_range(0..=o.delay_ms_max + 10);
            let frame = self.answer_frame(host_id, &payload);
            self.answers.push(Answer {
                conn,
                host_id,
                delay_ms,
                frame,
            });
        }
        Ok(())
    }

    /// One response frame for host id `h`: a result or an error, in the shapes and sizes that
    /// reach every branch of the host's outcome rules.
    fn answer_frame(&mut self, h: u64, payload: &Value) -> String {
        let by = self.client_id.clone();
        let body = if self.owners.error.hit(&mut self.rng) {
            let code = APP_CODES[self.rng_below(APP_CODES.len() as u64) as usize];
            let error = match self.rng_below(22) {
                0 => r#"{"code":"x","message":"a code that is no number"}"#.to_owned(),
                1 => r#"{"code":7}"#.to_owned(),
                2 => r#""oops""#.to_owned(),
                20 => r#"{"code":7.5,"message":"not an integer"}"#.to_owned(),
                21 => format!(r#"{{ "code" : {code}, "message": "no data", "data": null }}"#),
                // Over 4 KiB of three-byte characters: cut below 4096 bytes, on a boundary.
                3 => format!(r#"{{"code":{code},"message":"{}"}}"#, "€".repeat(1400)),
                4..=7 => {
                    let pad = "d".repeat(self.rng_below(600) as usize);
                    format!(
                        r#"{{"code":{code},"message":"with data","data":{{"h":{h},"pad":"{pad}"}}}}"#
                    )
                }
                _ => format!(r#"{{"code":{code},"message":"refused by {by}"}}"#),
            };
            format!(r#""error":{error}"#)
        } else {
            let result = match self.rng_below(300) {
                // Past the largest response message the host reads (payload plus 64 KiB).
                299 if self.payload_limit <= 4096 => {
                    format!(
                        r#"{{"pad":"{}"}}"#,
                        "z".repeat(self.payload_limit + 64 * 1024)
                    )
                }
                r if r % 20 == 0 => "null".to_owned(),
                r if r % 20 == 1 => r#"[ 1 , "\u00e9" ]"#.to_owned(),
                r if r % 20 == 2 => {
                    // Around a small payload limit: at it, or just over it.
                    let max = 4096usize.min(self.payload_limit);
                    let base = r#"{"pad":""}"#.len();
                    let len = [max, max + 1][self.rng_below(2) as usize];
                    format!(r#"{{"pad":"{}"}}"#, "r".repeat(len.saturating_sub(base)))
                }
                r if r % 20 == 3 || r % 20 == 4 => {
                    format!(r#"{{ "h" : {h}, "by": "{by}", "s": "\u00e9\\" }}"#)
                }
                _ => format!(r#"{{"h":{h},"by":"{by}","echo":{payload}}}"#),
            };
            format!(r#""result":{result}"#)
        };
        self.stats.answers += 1;
        format!(r#"{{"jsonrpc":"2.0","id":{h},{body}}}"#)
    }

    /// Whether an answer for `host_id`, scheduled on `conn`, goes out now: on the same
    /// connection unless the host cancelled the request (then only sometimes: late), on a later
    /// connection of the same host process only sometimes (a stray, foreign there).
    pub(crate) fn answer_due(&mut self, conn: ConnId, host_id: u64, same_host: bool) -> bool {
        let Some(c) = self.connection.as_ref() else {
            return false;
        };
        if c.conn == conn {
            let cancelled = c.handled.get(&host_id).is_some_and(|h| h.cancelled);
            return !cancelled || self.owners.answer_cancelled.hit(&mut self.rng);
        }
        let stray = same_host && c.ready && !self.calm && self.owners.stray.hit(&mut self.rng);
        if stray {
            self.stats.strays += 1;
        }
        stray
    }

    /// As a manual owner: answers host id `host_id` with `body` (`{"result": …}` or
    /// `{"error": …}`) now (scripted tests).
    pub fn respond(&mut self, host_id: u64, body: Value) {
        let mut msg = json!({ "jsonrpc": "2.0", "id": host_id });
        if let (Some(m), Some(b)) = (msg.as_object_mut(), body.as_object()) {
            for (k, v) in b {
                m.insert(k.clone(), v.clone());
            }
        }
        self.stats.answers += 1;
        self.send_raw(msg.to_string().into_bytes(), false);
    }

    /// Whether the host cancelled `host_id`, sent to the current connection.
    pub fn was_cancelled(&self, host_id: u64) -> bool {
        self.connection
            .as_ref()
            .and_then(|c| c.handled.get(&host_id))
            .is_some_and(|h| h.cancelled)
    }

    /// The services the current connection owns.
    pub fn owned_services(&self) -> Vec<String> {
        self.connection
            .iter()
            .flat_map(|c| c.services.iter().cloned())
            .collect()
    }

    /// `$/cancelRequest` from the host: only for a request this connection was sent, once.
    pub(crate) fn on_cancel_request(&mut self, params: &Value) -> Result<(), String> {
        if params.get("channel").and_then(Value::as_str) != Some(CATALOG) {
            return Err(format!(
                "$/cancelRequest not on the catalog channel: {params}"
            ));
        }
        let host_id = params
            .get("id")
            .and_then(Value::as_u64)
            .ok_or_else(|| format!("$/cancelRequest without a host id: {params}"))?;
        let Some(c) = self.connection.as_mut() else {
            return Ok(());
        };
        let Some(h) = c.handled.get_mut(&host_id) else {
            return Err(format!(
                "$/cancelRequest for {host_id}, which this connection was never sent"
            ));
        };
        if std::mem::replace(&mut h.cancelled, true) {
            return Err(format!("$/cancelRequest for {host_id} twice"));
        }
        self.stats.cancels_heard += 1;
        Ok(())
    }

    /// `clientService/notification`: only for an own service, stamped with the sender's
    /// clientId, in order per sender connection and service.
    pub(crate) fn on_service_notification(&mut self, params: &Value) -> Result<(), String> {
        let field = |k: &str| params.get(k).and_then(Value::as_str).unwrap_or_default();
        let (service, sender) = (field("serviceId"), field("senderClientId"));
        if field("channel") != CATALOG {
            return Err(format!("notification not on the catalog channel: {params}"));
        }
        let Some(c) = self.connection.as_mut() else {
            return Ok(());
        };
        if !c.services.contains(service) {
            return Err(format!(
                "notification for {service}, which this connection does not own"
            ));
        }
        self.stats.notifications_heard += 1;
        let payload = params.get("params").unwrap_or(&Value::Null);
        let (Some(from), Some(epoch), Some(seq)) = (
            payload.get("from").and_then(Value::as_str),
            payload.get("epoch").and_then(Value::as_u64),
            payload.get("seq").and_then(Value::as_u64),
        ) else {
            // Not a sequenced payload (a notifier's odd one): forwarded as it was, nothing to
            // order.
            return Ok(());
        };
        if from != sender {
            return Err(format!(
                "notification from {from} stamped with senderClientId {sender:?}"
            ));
        }
        let key = (from.to_owned(), epoch, service.to_owned());
        if let Some(last) = c.heard.insert(key, seq) {
            if seq <= last {
                return Err(format!(
                    "notification seq {seq} from {from} (epoch {epoch}) to {service} after seq {last}: out of order or twice"
                ));
            }
        }
        Ok(())
    }

    /// The answer to a call: it must answer an outstanding call of this connection, with a
    /// result or an error with a documented code.
    pub(crate) fn on_call_outcome(
        &mut self,
        key: &str,
        outcome: Result<Value, Value>,
    ) -> Result<(), String> {
        if self.manual {
            self.outcomes.push((key.to_owned(), outcome.clone()));
        }
        match outcome {
            Ok(_) => {
                self.stats.call_results += 1;
                Ok(())
            }
            Err(e) => {
                let code = e
                    .get("code")
                    .and_then(Value::as_i64)
                    .ok_or_else(|| format!("call {key} failed without a code: {e}"))?;
                if e.get("message").and_then(Value::as_str).is_none() {
                    return Err(format!("call {key} failed without a message: {e}"));
                }
                if !HOST_CALL_CODES.contains(&code) && !APP_CODES.contains(&code) {
                    return Err(format!("call {key} failed with an undocumented code: {e}"));
                }
                *self.stats.call_errors.entry(code).or_default() += 1;
                Ok(())
            }
        }
    }
}
