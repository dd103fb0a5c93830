//! Rule 2: a `clientService/notify` is forwarded at most once, to the owner, or dropped for a
//! reason the model names.

use super::*;

impl ServiceModel {
    /// Where a notification must go, or why it must be dropped.
    pub(super) fn expect_notify(
        &self,
        conn: ConnId,
        params: Option<&str>,
        len: usize,
    ) -> Result<Result<Forward, &'static str>, String> {
        let l = &self.limits;
        if len > l.message_bytes_max_for(Some("clientService/notify")) {
            return Ok(Err("notifications dropped: oversized"));
        }
        let peer = self.peer(conn)?;
        if !peer.ready {
            return Ok(Err("notifications dropped: before the handshake"));
        }
        let Some(Ok(p)) = params.map(serde_json::from_str::<NotifyParams<'_>>) else {
            return Ok(Err("notifications dropped: malformed"));
        };
        if p.channel != CATALOG
            || p.method.is_empty()
            || p.method.len() > l.service_method_bytes_max as usize
        {
            return Ok(Err("notifications dropped: malformed"));
        }
        if p.params.get().len() > l.service_payload_bytes_max as usize {
            return Ok(Err("notifications dropped: oversized"));
        }
        let service = p.service_id.as_ref();
        let Some(s) = self
            .services
            .get(service)
            .filter(|s| self.visible(s, &peer.principal))
        else {
            return Ok(Err(if self.services.contains_key(service) {
                "notifications dropped: invisible service"
            } else if self.ever.contains(service) {
                "notifications dropped: stale service"
            } else {
                "notifications dropped: unknown service"
            }));
        };
        Ok(Ok(Forward {
            owner: s.owner,
            service: service.to_owned(),
            method: p.method.into_owned(),
            params: p.params.get().to_owned(),
            sender: peer.client_id.clone(),
            deadline_ms: 0,
        }))
    }

    pub(super) fn on_notify(
        &mut self,
        host: &Host<SimStore>,
        conn: ConnId,
        expected: Result<Forward, &'static str>,
        fx: &mut Effects,
    ) -> Result<(), String> {
        let notified = fx.notified.take();
        // Nothing at all but the one forward: no answer, no error, nothing to the sender.
        if fx.forwarded.is_some() || fx.answers_or_closes() {
            return Err(format!(
                "a notification from {conn:?} made the host send more than one forward: answer {:?}, {} cancels, {} completions, closes {:?}, {} other frames",
                fx.direct,
                fx.cancels.len(),
                fx.completions.len(),
                fx.closed,
                fx.others
            ));
        }
        let stats = host.stats();
        let forwarded = stats.notifications_forwarded - self.stats.notifications_forwarded;
        let dropped = stats.notifications_dropped - self.stats.notifications_dropped;
        let notified = notified.as_ref();
        if (forwarded, dropped) != (u64::from(notified.is_some()), u64::from(notified.is_none())) {
            return Err(format!(
                "a notification from {conn:?} was {}, but the host counted {forwarded} forwarded and {dropped} dropped",
                if notified.is_some() { "forwarded" } else { "dropped" }
            ));
        }
        match (expected, notified) {
            (Err(why), None) => {
                self.count(why);
                Ok(())
            }
            (Err(why), Some((owner, _))) => Err(format!(
                "a notification from {conn:?} was forwarded to {owner:?}; it must be dropped ({why})"
            )),
            (Ok(fwd), None) => {
                let bytes = FORWARD_ENVELOPE_BYTES
                    + escaped_max(&fwd.service)
                    + escaped_max(&fwd.sender)
                    + escaped_max(&fwd.method)
                    + fwd.params.len();
                if !self.overloaded(host, fwd.owner, bytes) {
                    return Err(format!(
                        "a notification from {conn:?} to {} was dropped, but {:?} has room ({:?} bytes queued)",
                        fwd.service,
                        fwd.owner,
                        host.queued_bytes(fwd.owner)
                    ));
                }
                self.count("notifications dropped: owner overloaded");
                Ok(())
            }
            (Ok(fwd), Some((owner, fparams))) => {
                let what = format!("a notification from {conn:?} to {}", fwd.service);
                if *owner != fwd.owner {
                    return Err(format!(
                        "{what} went to {owner:?}, but {:?} owns it",
                        fwd.owner
                    ));
                }
                let f = serde_json::from_str::<Forwarded<'_>>(fparams)
                    .map_err(|e| format!("{what}: forwarded params do not decode ({e})"))?;
                if f.channel != CATALOG
                    || f.service_id != fwd.service
                    || f.method != fwd.method
                    || f.sender_client_id != fwd.sender
                {
                    return Err(format!(
                        "{what}: expected method {} stamped {}, forwarded {fparams}",
                        fwd.method, fwd.sender
                    ));
                }
                if f.params.get() != fwd.params {
                    return Err(format!(
                        "{what}: params not forwarded byte for byte: sent {}, forwarded {}",
                        fwd.params,
                        f.params.get()
                    ));
                }
                if let Some(seq) = serde_json::from_str::<Value>(&fwd.params)
                    .ok()
                    .and_then(|v| v.get("seq").and_then(Value::as_u64))
                {
                    let last = self.fifo.insert((conn, fwd.service.clone()), seq);
                    if last.is_some_and(|l| l >= seq) {
                        return Err(format!(
                            "{what}: seq {seq} forwarded after seq {last:?} (FIFO)"
                        ));
                    }
                }
                self.count("notifications forwarded");
                Ok(())
            }
        }
    }
}
