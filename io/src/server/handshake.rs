//! A socket's request head, read under its deadline, and what it gets: a WebSocket (token,
//! Origin and capacity checked, then 101), or an HTTP answer (`/healthz`, or a refusal) after
//! which it lingers and closes. Parsing and routing are `http`'s; this is the driver's side.

use std::io::{self, Read};

use axhost_core::{ConnId, Input, Now, Store};

use super::http::{self, Head, Route, Status};
use super::slots::Phase;
use super::{role_frame_reader, Driver};
use crate::credentials::token_from_request;

impl<S: Store> Driver<S> {
    /// Reads the request head until it is complete, invalid, or the socket has nothing more.
    pub(super) fn read_head(&mut self, id: u64) {
        let now = self.clock.now();
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Head {
            socket, head, read, ..
        } = &mut slot.phase
        else {
            return;
        };
        let mut chunk = [0u8; 4096];
        let outcome = loop {
            let room = http::HEAD_BYTES_MAX
                .saturating_sub(head.len())
                .min(chunk.len());
            match socket.read(&mut chunk[..room.max(1)]) {
                Ok(0) => break Err("closed before a request head"),
                Ok(n) => {
                    head.extend_from_slice(&chunk[..n]);
                    match http::parse_head(head) {
                        Head::Partial => {}
                        decided => break Ok(decided),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    *read = true;
                    return;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break Err("read error before a request head"),
            }
        };
        match outcome {
            Err(why) => self.drop_slot(id, why, now),
            Ok(Head::Complete { request, len }) => self.on_request(id, &request, len, now),
            Ok(Head::Invalid(status)) => self.respond(id, status, "", now),
            Ok(Head::Partial) => {}
        }
    }

    fn on_request(&mut self, id: u64, request: &http::Request, head_len: usize, now: Now) {
        let key = match http::route(request) {
            Route::Health => return self.respond(id, Status::Ok, &http::health_body(), now),
            Route::Reject(status) => return self.respond(id, status, "", now),
            Route::Upgrade { key } => key,
        };
        let token = token_from_request(&request.headers, request.query.as_deref());
        let Some(principal) = token.and_then(|t| self.credentials.authenticate(&t)) else {
            return self.respond(id, Status::Unauthorized, "", now);
        };
        let origins = self.allowed_origins.as_deref();
        if !http::origin_allowed(origins, request.header("origin")) {
            return self.respond(id, Status::Forbidden, "", now);
        }
        let limits = self.host.limits();
        if self.host.connection_count() >= limits.connections_max as usize {
            return self.respond(id, Status::ServiceUnavailable, "", now);
        }
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Head {
            mut socket,
            head,
            deadline_ms,
            ..
        } = std::mem::replace(&mut slot.phase, Phase::Moving)
        else {
            return;
        };
        self.deadlines.remove(&(deadline_ms, id));
        self.heads.remove(&id);
        socket.push_raw(&http::switching_protocols(&key));
        // Bytes after the head were sent early (frames); the reader parses them first.
        let early = head.get(head_len..).unwrap_or_default();
        let reader = Box::new(role_frame_reader(
            self.host.limits(),
            principal.role,
            early,
            self.partial_budget.clone(),
        ));
        let probe_ms = self.keepalive_ms.map(|ms| now.mono.0.saturating_add(ms));
        if let Some(at) = probe_ms {
            self.deadlines.insert((at, id));
        }
        slot.phase = Phase::Open {
            socket,
            reader,
            heard_ms: now.mono.0,
            probe_ms,
        };
        tracing::info!(
            conn = id,
            peer = %slot.peer,
            role = principal.role.as_str(),
            path = request.path.as_str(),
            "websocket open"
        );
        self.host.handle(
            now,
            Input::Connected {
                conn: ConnId(id),
                principal,
            },
        );
        self.mark_dirty(id);
        // More may already wait in the socket or in the early bytes; edge-triggered polls would
        // not say so again.
        self.mark_readable(id);
    }

    /// Answers a request that ends the connection, then lingers until the answer is out.
    fn respond(&mut self, id: u64, status: Status, body: &str, now: Now) {
        let Some(slot) = self.slots.get_mut(&id) else {
            return;
        };
        let Phase::Head {
            mut socket,
            deadline_ms,
            ..
        } = std::mem::replace(&mut slot.phase, Phase::Moving)
        else {
            return;
        };
        self.deadlines.remove(&(deadline_ms, id));
        self.heads.remove(&id);
        socket.push_raw(&http::response(status, body));
        if status == Status::Ok {
            tracing::debug!(conn = id, peer = %slot.peer, status = status.code(), "http");
        } else {
            tracing::info!(conn = id, peer = %slot.peer, status = status.code(), "http refused");
        }
        self.linger(id, socket, true, now);
    }
}
