//! Rule 1: a `clientService/request` is forwarded once or refused with the one predicted code,
//! and a relayed request completes at most once, to its caller, for a reason the cause carries.

use super::*;

impl ServiceModel {
    /// What a call must lead to: a forward, or a refusal with one code.
    pub(super) fn expect_call(
        &self,
        conn: ConnId,
        id: &str,
        params: Option<&str>,
        len: usize,
    ) -> Result<Result<Forward, i64>, String> {
        let l = &self.limits;
        if len > l.message_bytes_max_for(Some("clientService/request")) {
            return Ok(Err(LIMIT));
        }
        let peer = self.peer(conn)?;
        if !peer.ready {
            return Ok(Err(NOT_READY));
        }
        let Ok(p) = serde_json::from_str::<CallParams<'_>>(params.unwrap_or("null")) else {
            return Ok(Err(MALFORMED));
        };
        if p.channel != CATALOG
            || p.method.is_empty()
            || p.method.len() > l.service_method_bytes_max as usize
        {
            return Ok(Err(MALFORMED));
        }
        if p.params.get().len() > l.service_payload_bytes_max as usize {
            return Ok(Err(LIMIT));
        }
        if p.timeout_ms == Some(0) {
            return Ok(Err(MALFORMED));
        }
        let Some(s) = self
            .services
            .get(p.service_id.as_ref())
            .filter(|s| self.visible(s, &peer.principal))
        else {
            return Ok(Err(UNKNOWN_SERVICE));
        };
        if self.by_caller.contains_key(&(conn, id.to_owned())) {
            return Ok(Err(DUPLICATE_ID));
        }
        let of_caller = self.flights.values().filter(|f| f.caller == conn).count();
        let of_service = self
            .flights
            .values()
            .filter(|f| f.service == p.service_id)
            .count();
        if of_caller >= l.relays_per_conn_max as usize
            || of_service >= l.relays_per_service_max as usize
        {
            return Ok(Err(LIMIT));
        }
        let timeout = p
            .timeout_ms
            .unwrap_or(l.relay_timeout_ms)
            .min(l.relay_timeout_ms_max);
        Ok(Ok(Forward {
            owner: s.owner,
            service: p.service_id.into_owned(),
            method: p.method.into_owned(),
            params: p.params.get().to_owned(),
            sender: peer.client_id.clone(),
            deadline_ms: self.now_ms.saturating_add(timeout),
        }))
    }

    pub(super) fn on_call(
        &mut self,
        host: &Host<SimStore>,
        conn: ConnId,
        id: &str,
        expected: Result<Forward, i64>,
        fx: &mut Effects,
    ) -> Result<(), String> {
        let forwarded = fx.forwarded.take();
        let caller_closed = fx.closed.contains(&conn);
        match (expected, &fx.direct, forwarded) {
            (Err(code), Some(Err(e)), None) => {
                let got = error_code(e);
                if got != Some(code) {
                    return Err(format!(
                        "call {id} on {conn:?} refused with {got:?}, the contract says {code}: {e}"
                    ));
                }
                self.count(refusal_name(code));
                Ok(())
            }
            (Err(_), None, None) if caller_closed => Ok(()),
            (Err(code), direct, forwarded) => Err(format!(
                "call {id} on {conn:?} must be refused with {code}; the host answered {direct:?} and forwarded {forwarded:?}"
            )),
            (Ok(fwd), None, Some((owner, host_id, fparams))) => {
                self.check_forward(conn, id, &fwd, owner, &host_id, &fparams)?;
                let h = host_id.parse::<u64>().unwrap_or_default();
                self.history.insert(h, (owner, None));
                self.by_caller.insert((conn, id.to_owned()), h);
                self.flights.insert(
                    h,
                    Flight {
                        caller: conn,
                        caller_id: id.to_owned(),
                        service: fwd.service,
                        owner,
                        deadline_ms: fwd.deadline_ms,
                    },
                );
                self.count("calls forwarded");
                Ok(())
            }
            (Ok(fwd), Some(Err(e)), None) => {
                let bytes = FORWARD_ENVELOPE_BYTES
                    + escaped_max(&fwd.service)
                    + escaped_max(&fwd.sender)
                    + escaped_max(&fwd.method)
                    + fwd.params.len();
                if error_code(e) != Some(LIMIT) || !self.overloaded(host, fwd.owner, bytes) {
                    return Err(format!(
                        "call {id} on {conn:?} to {} refused with {e}, but it must be forwarded to {:?} (queue {:?} bytes)",
                        fwd.service,
                        fwd.owner,
                        host.queued_bytes(fwd.owner)
                    ));
                }
                self.count("calls refused: owner overloaded (-32043)");
                Ok(())
            }
            (Ok(_), None, None) if caller_closed => Ok(()),
            (Ok(fwd), direct, forwarded) => Err(format!(
                "call {id} on {conn:?} must be forwarded to {:?}; the host answered {direct:?} and forwarded {forwarded:?}",
                fwd.owner
            )),
        }
    }

    pub(super) fn check_forward(
        &self,
        conn: ConnId,
        id: &str,
        fwd: &Forward,
        owner: ConnId,
        host_id: &str,
        fparams: &str,
    ) -> Result<(), String> {
        let what = format!("call {id} on {conn:?} forwarded as {host_id} to {owner:?}");
        if owner != fwd.owner {
            return Err(format!("{what}, but {:?} owns {}", fwd.owner, fwd.service));
        }
        let h = host_id
            .parse::<u64>()
            .map_err(|_| format!("{what}: the host id is not a u64"))?;
        if let Some((first, _)) = self.history.get(&h) {
            return Err(format!(
                "{what}: host id {h} was already handed out (to {first:?}) by this host process"
            ));
        }
        let f = serde_json::from_str::<Forwarded<'_>>(fparams)
            .map_err(|e| format!("{what}: params do not decode ({e}): {fparams}"))?;
        if f.channel != CATALOG
            || f.service_id != fwd.service
            || f.method != fwd.method
            || f.sender_client_id != fwd.sender
        {
            return Err(format!(
                "{what}: expected service {} method {} sender {}, got {fparams}",
                fwd.service, fwd.method, fwd.sender
            ));
        }
        if f.params.get() != fwd.params {
            return Err(format!(
                "{what}: params not forwarded byte for byte: sent {}, forwarded {}",
                fwd.params,
                f.params.get()
            ));
        }
        Ok(())
    }

    /// What the owner's answer must become for the caller.
    pub(super) fn relayed(&self, outcome: &Result<String, String>, len: usize) -> Relayed {
        let l = &self.limits;
        let limit = Relayed::Error {
            code: LIMIT,
            message: None,
            data: None,
        };
        if len > l.message_bytes_max_for(None) {
            return limit;
        }
        match outcome {
            Ok(r) if r.len() > l.service_payload_bytes_max as usize => limit,
            Ok(r) => Relayed::Result(r.clone()),
            Err(e) => match serde_json::from_str::<ErrorObject<'_>>(e) {
                Ok(e) => {
                    let mut message = e.message.into_owned();
                    if message.len() > ERROR_MESSAGE_BYTES_MAX {
                        let mut cut = ERROR_MESSAGE_BYTES_MAX;
                        while !message.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        message.truncate(cut);
                    }
                    let data = e
                        .data
                        .filter(|d| d.get().len() <= l.service_error_data_bytes_max as usize)
                        .map(|d| serde_json::from_str(d.get()).unwrap_or(Value::Null));
                    Relayed::Error {
                        code: e.code,
                        message: Some(message),
                        data,
                    }
                }
                Err(_) => Relayed::Error {
                    code: BAD_SERVICE_ERROR,
                    message: None,
                    data: None,
                },
            },
        }
    }

    /// An answer that matches no request this connection was sent: nothing may happen.
    pub(super) fn dropped_response(
        &mut self,
        host: &Host<SimStore>,
        conn: ConnId,
        id: &str,
        fx: &Effects,
    ) -> Result<(), String> {
        if self.peers.get(&conn).is_none_or(|p| p.closing) {
            return Ok(());
        }
        if fx.answers_or_closes() {
            return Err(format!(
                "an answer to {id} from {conn:?}, which was not sent that request, made the host send something"
            ));
        }
        let kind = match id.parse::<u64>().ok().and_then(|h| self.history.get(&h)) {
            Some((owner, _)) if *owner != conn => "answers dropped: foreign",
            Some((_, Some(End::Answered))) => "answers dropped: duplicate",
            Some((_, Some(End::TimedOut))) => "answers dropped: late, after the timeout",
            Some((_, Some(End::Cancelled))) => "answers dropped: late, after a cancel",
            Some((_, Some(End::Gone | End::CallerLeft | End::GoneAndLeft))) => {
                "answers dropped: late, service or caller gone"
            }
            Some((_, None)) => "answers dropped: foreign",
            None => "answers dropped: unknown id",
        };
        self.count(kind);
        let dropped = host.stats().responses_dropped - self.stats.responses_dropped;
        if dropped != 1 {
            return Err(format!(
                "an answer to {id} from {conn:?} was dropped, but responses_dropped grew by {dropped}"
            ));
        }
        Ok(())
    }

    /// `$/cancelRequest` from a caller: completes its own pending request (checked with the
    /// completions), or does nothing at all.
    pub(super) fn on_cancel(
        &mut self,
        conn: ConnId,
        named: Option<String>,
        pending: Option<u64>,
        fx: &Effects,
    ) -> Result<(), String> {
        if pending.is_some() {
            self.count("cancels sent");
            return Ok(());
        }
        if fx.answers_or_closes() {
            return Err(format!(
                "a $/cancelRequest from {conn:?} naming nothing pending ({named:?}) made the host send something"
            ));
        }
        self.count("cancels naming nothing");
        Ok(())
    }

    /// Justifies every completion, releases what closed connections held, requires every
    /// completion a cause calls for, checks cancellations and compares with the host.
    pub(super) fn settle(
        &mut self,
        host: &Host<SimStore>,
        cause: &Cause,
        mut fx: Effects,
    ) -> Result<(), String> {
        let now = self.now_ms;
        let gone: Vec<String> = self
            .services
            .iter()
            .filter(|(_, s)| fx.closed.contains(&s.owner))
            .map(|(id, _)| id.clone())
            .collect();
        let mut released = 0;
        for id in &gone {
            self.services.remove(id);
            fx.removed.insert(id.clone());
        }
        let answer = match cause {
            Cause::Message {
                conn,
                len,
                msg: Message::Response { id, outcome },
            } => id.parse::<u64>().ok().map(|h| (*conn, h, outcome, *len)),
            _ => None,
        };
        let cancel = match cause {
            Cause::Message {
                conn,
                msg: Message::Notification { method, params },
                ..
            } if method == "$/cancelRequest" => params
                .as_deref()
                .and_then(|p| serde_json::from_str::<CancelParams<'_>>(p).ok())
                .filter(|p| p.channel == CATALOG)
                .map(|p| (*conn, p.id.get().to_owned())),
            _ => None,
        };
        let timer = matches!(cause, Cause::Timer);
        let mut ended: BTreeMap<u64, End> = BTreeMap::new();
        for (h, f, outcome) in std::mem::take(&mut fx.completions) {
            let what = format!(
                "request {h} (id {} of {:?} to {} owned by {:?})",
                f.caller_id, f.caller, f.service, f.owner
            );
            let code = outcome.as_ref().err().and_then(|e| error_code(e));
            let mut kind = None;
            let end = if let Some((_, _, answered, len)) =
                answer.filter(|(c, a, _, _)| *c == f.owner && *a == h)
            {
                kind = Some(self.check_relayed(&what, answered, len, &outcome)?);
                End::Answered
            } else if cancel
                .as_ref()
                .is_some_and(|(c, id)| *c == f.caller && *id == f.caller_id)
                && code == Some(CANCELLED)
            {
                End::Cancelled
            } else if timer && code == Some(TIMEOUT) {
                if f.deadline_ms != now {
                    return Err(format!(
                        "{what} timed out at {now} ms, its deadline is {} ms",
                        f.deadline_ms
                    ));
                }
                End::TimedOut
            } else if fx.removed.contains(&f.service) && code == Some(SERVICE_GONE) {
                End::Gone
            } else {
                return Err(format!(
                    "{what} completed for no reason this call carries: {outcome:?}"
                ));
            };
            self.count(match end {
                End::Answered => kind.unwrap_or("completed: result"),
                End::TimedOut => "completed: timeout (-32050)",
                End::Cancelled => "completed: cancelled (-32800)",
                End::Gone => "completed: service gone (-32051)",
                End::CallerLeft | End::GoneAndLeft => "released: caller left",
            });
            ended.insert(h, end);
        }
        let pending: Vec<u64> = self.flights.keys().copied().collect();
        for h in pending {
            let Some(f) = self.flights.get(&h).cloned() else {
                continue;
            };
            let what = format!(
                "request {h} (id {} of {:?} to {} owned by {:?})",
                f.caller_id, f.caller, f.service, f.owner
            );
            if fx.closed.contains(&f.caller) {
                // The caller is gone: the request was released, or it ended for a reason this
                // call carries and the host could not deliver the answer (the caller was over
                // its queue limit, so the reply closed it instead).
                self.flights.remove(&h);
                self.by_caller.remove(&(f.caller, f.caller_id.clone()));
                let end = if answer.is_some_and(|(c, a, _, _)| c == f.owner && a == h) {
                    End::Answered
                } else if cancel
                    .as_ref()
                    .is_some_and(|(c, id)| *c == f.caller && *id == f.caller_id)
                {
                    End::Cancelled
                } else if timer && f.deadline_ms <= now {
                    End::TimedOut
                } else if fx.removed.contains(&f.service) {
                    End::GoneAndLeft
                } else {
                    End::CallerLeft
                };
                released += 1;
                self.count(match end {
                    End::CallerLeft => "released: caller left",
                    End::GoneAndLeft => "released: caller left as its service went",
                    _ => "ended, answer lost: the caller was closed",
                });
                ended.insert(h, end);
            } else if fx.removed.contains(&f.service) {
                return Err(format!(
                    "{what}: its service is gone, but it did not fail with -32051"
                ));
            } else if f.deadline_ms <= now {
                return Err(format!(
                    "{what} is pending at {now} ms, past its deadline {} ms",
                    f.deadline_ms
                ));
            } else if answer.is_some_and(|(c, a, _, _)| c == f.owner && a == h) {
                return Err(format!(
                    "{what}: its owner answered, but the caller got nothing"
                ));
            } else if cancel
                .as_ref()
                .is_some_and(|(c, id)| *c == f.caller && *id == f.caller_id)
            {
                return Err(format!(
                    "{what}: its caller cancelled it, but it is still pending"
                ));
            }
        }
        for (&h, &end) in &ended {
            if let Some(entry) = self.history.get_mut(&h) {
                entry.1 = Some(end);
            }
        }
        self.check_cancels(host, &fx, &ended)?;
        if let Cause::Closed(conn) = cause {
            self.peers.remove(conn);
        }
        self.compare(host).map_err(|e| {
            if fx.closed.is_empty() {
                return e;
            }
            format!(
                "{e}; this call closed {:?}, whose {} services and {released} requests the model dropped with them",
                fx.closed,
                gone.len()
            )
        })
    }

    /// Checks that the caller got what the owner answered; returns what kind of completion it
    /// was.
    pub(super) fn check_relayed(
        &self,
        what: &str,
        answered: &Result<String, String>,
        len: usize,
        outcome: &Result<String, String>,
    ) -> Result<&'static str, String> {
        let expected = self.relayed(answered, len);
        let kind = match &expected {
            Relayed::Result(_) => "completed: result",
            Relayed::Error {
                code: LIMIT,
                message: None,
                ..
            } => "completed: result over the payload limit (-32043)",
            Relayed::Error { message: None, .. } => "completed: malformed service error (-32603)",
            Relayed::Error {
                message: Some(m), ..
            } if m.len() == ERROR_MESSAGE_BYTES_MAX - 1 || m.len() == ERROR_MESSAGE_BYTES_MAX => {
                "completed: service error, message cut"
            }
            Relayed::Error { data: None, .. }
                if answered
                    .as_ref()
                    .err()
                    .is_some_and(|e| e.contains("\"data\"")) =>
            {
                "completed: service error, data over the limit dropped"
            }
            Relayed::Error { .. } => "completed: service error",
        };
        let matches = match (&expected, outcome) {
            (Relayed::Result(r), Ok(got)) => r == got,
            (
                Relayed::Error {
                    code,
                    message,
                    data,
                },
                Err(got),
            ) => {
                let got: Value = serde_json::from_str(got).unwrap_or_default();
                got.get("code").and_then(Value::as_i64) == Some(*code)
                    && message
                        .as_ref()
                        .is_none_or(|m| got.get("message").and_then(Value::as_str) == Some(m))
                    && (message.is_none() || got.get("data") == data.as_ref())
            }
            _ => false,
        };
        if !matches {
            return Err(format!(
                "{what}: the owner answered {answered:?}, the caller must get {expected:?}, got {outcome:?}"
            ));
        }
        Ok(kind)
    }

    /// `$/cancelRequest` to an owner only for its own request that just timed out, was
    /// cancelled or lost its caller, once; and one for each such request unless the owner is
    /// closing or its queue is full.
    pub(super) fn check_cancels(
        &mut self,
        host: &Host<SimStore>,
        fx: &Effects,
        ended: &BTreeMap<u64, End>,
    ) -> Result<(), String> {
        let mut told = BTreeSet::new();
        for (owner, params) in &fx.cancels {
            let h = serde_json::from_str::<Value>(params)
                .ok()
                .filter(|v| v.get("channel").and_then(Value::as_str) == Some(CATALOG))
                .and_then(|v| v.get("id").and_then(Value::as_u64))
                .ok_or_else(|| {
                    format!("a $/cancelRequest to {owner:?} without a host id: {params}")
                })?;
            let fits = matches!(
                ended.get(&h),
                Some(End::TimedOut | End::Cancelled | End::CallerLeft | End::GoneAndLeft)
            );
            let sent_to = self.history.get(&h).map(|(o, _)| *o);
            if !fits || sent_to != Some(*owner) || !told.insert(h) {
                return Err(format!(
                    "$/cancelRequest for {h} to {owner:?} (sent to {sent_to:?}, ended {:?} now)",
                    ended.get(&h)
                ));
            }
        }
        for (&h, end) in ended {
            if !matches!(end, End::TimedOut | End::Cancelled | End::CallerLeft) || told.contains(&h)
            {
                continue;
            }
            let Some(&(owner, _)) = self.history.get(&h) else {
                continue;
            };
            let closing =
                fx.closed.contains(&owner) || self.peers.get(&owner).is_none_or(|p| p.closing);
            if closing {
                continue;
            }
            let bytes = FORWARD_ENVELOPE_BYTES + 20;
            if !self.overloaded(host, owner, bytes) {
                return Err(format!(
                    "request {h} ended ({end:?}) without a $/cancelRequest to its owner {owner:?}, which has room"
                ));
            }
            self.count("cancels to owners dropped: overloaded");
        }
        Ok(())
    }
}

/// The tally name of a refusal by its code.
fn refusal_name(code: i64) -> &'static str {
    match code {
        UNKNOWN_SERVICE => "calls refused: unknown or invisible (-32008)",
        NOT_READY => "calls refused: before the handshake (-32009)",
        LIMIT => "calls refused: limit (-32043)",
        DUPLICATE_ID => "calls refused: duplicate pending id (-32600)",
        MALFORMED => "calls refused: malformed (-32602)",
        _ => "calls refused: other",
    }
}
