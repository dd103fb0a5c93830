//! Messages in: the notification fast path, envelope parsing, and the method table that sends
//! each method to the component that owns it.

use serde_json::value::RawValue;

use crate::error::{RpcError, INVALID_REQUEST, LIMIT, METHOD_NOT_FOUND, PERMISSION_DENIED};
use crate::host::Host;
use crate::limits::REQUEST_ID_BYTES_MAX;
use crate::log::store::Store;
use crate::net::connection::ConnId;
use crate::net::jsonrpc::{self, Message};
use crate::net::output::CloseCode;

/// Which part of the host a method belongs to.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Route {
    /// Answered in any phase, depends on nothing: `ping`.
    Ping,
    /// The handshake: `initialize`, `reconnect`.
    Handshake,
    /// Channels across components: `subscribe`, `unsubscribe`, `resourceRead`.
    Channels,
    /// The AHP session commands.
    Ahp,
    /// Client services.
    Services,
    /// The AXP exchange (`_axp/*`).
    Axp,
    /// Nothing here.
    Unknown,
}

fn route(method: &str) -> Route {
    match method {
        "ping" => Route::Ping,
        "initialize" | "reconnect" => Route::Handshake,
        "subscribe" | "unsubscribe" | "resourceRead" => Route::Channels,
        "createSession" | "listSessions" | "dispatchAction" => Route::Ahp,
        m if m.starts_with("_axp/") => Route::Axp,
        m if m.starts_with("client/")
            || m.starts_with("clientService/")
            || m == "$/cancelRequest" =>
        {
            Route::Services
        }
        _ => Route::Unknown,
    }
}

/// Whether a message may need a change on the write path (conservatively: a request that
/// the host will refuse without one may still be counted): what waits in the input hold while
/// the path is full. Client-service traffic, reads, `ping` and anything malformed need none.
fn may_need_change(text: &str) -> bool {
    if jsonrpc::parse_compact_notify(text).is_some() {
        return false;
    }
    match jsonrpc::parse_text(text) {
        Ok(Message::Request { method, .. }) => method_may_need_change(&method),
        Ok(Message::Notification { method, .. }) => method == "dispatchAction",
        Ok(Message::Response { .. }) | Err(_) => false,
    }
}

fn method_may_need_change(method: &str) -> bool {
    match route(method) {
        // A new clientId binding is a change.
        Route::Handshake => true,
        Route::Ahp => method != "listSessions",
        Route::Axp => !matches!(
            crate::axp::method(method),
            None | Some(
                crate::axp::Method::Export
                    | crate::axp::Method::BlobGet
                    | crate::axp::Method::MemorySearch
            )
        ),
        // Catalog events may need a reservation of numbers (`Kernel::reserve_ahead`).
        Route::Services => matches!(
            method,
            "client/registerService" | "client/updateService" | "client/unregisterService"
        ),
        Route::Ping | Route::Channels | Route::Unknown => false,
    }
}

impl<S: Store> Host<S> {
    /// A message from `conn`; ignored unless it is open and not closing. While the write path
    /// is full (or messages are held) a message that may need a change is held, and so is every
    /// message of a connection with one held; the rest are handled at once.
    pub(super) fn on_message(&mut self, conn: ConnId, text: &str) {
        let (first, behind) = match self.k.conns_mut().live_mut(conn) {
            Some(c) => (
                !std::mem::replace(&mut c.seen_message, true),
                c.messages_held > 0,
            ),
            None => return,
        };
        self.k.stats_mut().messages_in += 1;
        if behind || !self.k.accepting_input() {
            let needs_room = may_need_change(text);
            if behind || needs_room {
                if self.k.hold_message(conn, text, first, needs_room) {
                    return;
                }
                if behind {
                    // Its answer must not overtake those of the messages held before it.
                    self.k
                        .past_hold(conn, "connection closed: it has messages held already");
                    return self.k.close(
                        conn,
                        CloseCode::Policy,
                        "Too many messages waiting for the disk",
                    );
                }
                // Handled now: whatever would need a change is refused with -32043.
                self.k.past_hold(conn, "refused: -32043");
            }
        }
        self.handle_message(conn, first, text);
    }

    /// A message taken from the input hold, once the write path has room.
    pub(super) fn on_held_message(&mut self, conn: ConnId, first: bool, text: &str) {
        if self.k.conns_mut().live_mut(conn).is_some() {
            self.handle_message(conn, first, text);
        }
    }

    /// Handles one message of a live connection.
    fn handle_message(&mut self, conn: ConnId, first: bool, text: &str) {
        let limits = self.k.limits();
        let too_big = |method: Option<&str>| text.len() > limits.message_bytes_max_for(method);
        if let Some(notify) = jsonrpc::parse_compact_notify(text) {
            // The hot path. `forward_notify` drops a notify from a connection still in its
            // handshake (it needs the sender's client id), so no separate readiness lookup.
            if too_big(Some("clientService/notify")) {
                self.k.stats_mut().notifications_dropped += 1;
                return;
            }
            return self
                .services
                .forward_notify(&mut self.k, conn, Some(notify));
        }
        match jsonrpc::parse_text(text) {
            Err(malformed) => self.k.reply_error_now(conn, "null", &malformed.to_error()),
            Ok(Message::Request { id, method, params }) => {
                if too_big(Some(&method)) {
                    let e = RpcError::new(
                        LIMIT,
                        "Message too large. Upload it as a blob and send a reference instead.",
                    );
                    // In order with the other answers of its kind (see `answer_error`).
                    return self.answer_error(conn, route(&method), id.get(), &e);
                }
                self.on_request(conn, first, id.get(), &method, params);
            }
            Ok(Message::Notification { method, params }) => {
                if too_big(Some(&method)) {
                    self.k.stats_mut().notifications_dropped += 1;
                    return;
                }
                self.on_notification(conn, &method, params);
            }
            Ok(Message::Response { id, outcome }) => {
                // An oversized answer still ends its request, at once, with a limit error.
                let outcome = if too_big(None) { None } else { Some(outcome) };
                self.services.on_response(&mut self.k, conn, id, outcome);
            }
        }
    }

    fn on_request(
        &mut self,
        conn: ConnId,
        first: bool,
        id: &str,
        method: &str,
        params: Option<&RawValue>,
    ) {
        let route = route(method);
        if method == "clientService/request" && id.len() > REQUEST_ID_BYTES_MAX {
            // A relayed request's id is kept until the request ends, so its length is
            // bounded. An id too long to keep is not echoed either: JSON-RPC answers a request
            // whose id cannot be taken with `id: null`, as for ids it cannot read.
            let e = RpcError::new(
                INVALID_REQUEST,
                format!(
                    "Invalid JSON-RPC request: a clientService/request id may be at most \
                     {REQUEST_ID_BYTES_MAX} bytes"
                ),
            );
            return self.k.reply_error_now(conn, "null", &e);
        }
        let ready = self.k.is_ready(conn);
        if !ready && !matches!(route, Route::Ping | Route::Handshake) {
            let e = RpcError::new(PERMISSION_DENIED, "Initialize before using sessions");
            return self.answer_error(conn, route, id, &e);
        }
        match route {
            Route::Ping => self.k.reply_now(conn, jsonrpc::result_frame(id, "null")),
            Route::Handshake => self.handshake(conn, first, id, method, params),
            Route::Channels => self.channel_request(conn, id, method, params),
            Route::Ahp => self.ahp_request(conn, id, method, params),
            Route::Services => self
                .services
                .handle_request(&mut self.k, conn, id, method, params),
            Route::Axp => {
                self.axp
                    .handle_request(&mut self.k, &mut self.sessions, conn, id, method, params)
            }
            Route::Unknown => {
                let e = RpcError::new(METHOD_NOT_FOUND, "Unknown method");
                self.k.reply_error(conn, id, &e);
            }
        }
    }

    /// Refuses a request: a client-service call at once (its answers never wait for the disk),
    /// anything else in order behind what is held for the connection, so an answer never
    /// overtakes an event the host decided before it.
    fn answer_error(&mut self, conn: ConnId, route: Route, id: &str, e: &RpcError) {
        if route == Route::Services {
            self.k.reply_error_now(conn, id, e);
        } else {
            self.k.reply_error(conn, id, e);
        }
    }

    /// `createSession`, `listSessions`, `dispatchAction` as requests.
    fn ahp_request(&mut self, conn: ConnId, id: &str, method: &str, params: Option<&RawValue>) {
        let outcome = match method {
            "createSession" => self
                .sessions
                .create_session(&mut self.k, conn, id, params)
                .map(|()| None),
            "listSessions" => self.sessions.list_sessions(&self.k, conn, params).map(Some),
            _ => {
                self.sessions.dispatch_action(
                    &mut self.k,
                    &mut self.clients,
                    conn,
                    Some(id),
                    params,
                );
                Ok(None)
            }
        };
        match outcome {
            Ok(Some(result)) => self
                .k
                .reply_state(conn, id, jsonrpc::result_frame(id, &result)),
            Ok(None) => {}
            Err(e) => self.k.reply_error(conn, id, &e),
        }
    }

    fn on_notification(&mut self, conn: ConnId, method: &str, params: Option<&RawValue>) {
        if !self.k.is_ready(conn) {
            self.k.stats_mut().notifications_dropped += 1;
            return;
        }
        match method {
            "clientService/notify" | "$/cancelRequest" => {
                self.services
                    .handle_notification(&mut self.k, conn, method, params)
            }
            "dispatchAction" => {
                self.sessions
                    .dispatch_action(&mut self.k, &mut self.clients, conn, None, params)
            }
            "unsubscribe" => {
                if self.unsubscribe(conn, params).is_err() {
                    self.k.stats_mut().notifications_dropped += 1;
                }
            }
            _ => self.k.stats_mut().notifications_dropped += 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_method_has_one_owner() {
        assert_eq!(route("ping"), Route::Ping);
        assert_eq!(route("reconnect"), Route::Handshake);
        assert_eq!(route("resourceRead"), Route::Channels);
        assert_eq!(route("dispatchAction"), Route::Ahp);
        assert_eq!(route("client/registerService"), Route::Services);
        assert_eq!(route("clientService/request"), Route::Services);
        assert_eq!(route("$/cancelRequest"), Route::Services);
        assert_eq!(route("_axp/claim"), Route::Axp);
        assert_eq!(route("_axp/checkpoint"), Route::Axp);
        assert_eq!(route("nope"), Route::Unknown);
    }

    #[test]
    fn what_may_need_a_change_waits_for_room() {
        let request = |m: &str| format!(r#"{{"jsonrpc":"2.0","id":1,"method":"{m}"}}"#);
        let notification = |m: &str| format!(r#"{{"jsonrpc":"2.0","method":"{m}"}}"#);
        for m in [
            "initialize",
            "reconnect",
            "createSession",
            "dispatchAction",
            "_axp/renew",
            "_axp/emit",
            "_axp/blobPut",
            "client/registerService",
            "client/unregisterService",
        ] {
            assert!(may_need_change(&request(m)), "{m}");
        }
        for m in [
            "ping",
            "subscribe",
            "resourceRead",
            "listSessions",
            "_axp/export",
            "_axp/blobGet",
            "_axp/nope",
            "clientService/request",
            "nope",
        ] {
            assert!(!may_need_change(&request(m)), "{m}");
        }
        assert!(may_need_change(&notification("dispatchAction")));
        assert!(!may_need_change(&notification("unsubscribe")));
        assert!(!may_need_change(
            r#"{"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":"x","serviceId":"s","method":"m","params":1}}"#
        ));
        assert!(!may_need_change(
            r#"{"jsonrpc":"2.0","id":7,"result":null}"#
        ));
        assert!(!may_need_change("not json"));
    }
}
