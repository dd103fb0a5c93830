//! `clientService/notify`: zero-acknowledgement notifications, the hot path.
//!
//! One table lookup and one forwarded frame: the `params` bytes are copied as received into a
//! buffer from the frame pool, nothing is allocated for bookkeeping, and nothing ever goes
//! back to the sender, whatever happens. Notifications depend on no durable state, so they pass
//! every frame held for the disk.

use std::rc::Rc;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::channel::CATALOG;
use crate::kernel::Kernel;
use crate::log::store::Store;
use crate::net::connection::{ConnId, Enqueued, Phase};
use crate::net::jsonrpc::{self, NotifyParams};
use crate::net::output::Frame;
use crate::services::ClientServices;

impl ClientServices {
    /// `clientService/notify` from the general path: forward once or drop silently. Never a
    /// reply.
    pub(crate) fn notify_service<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        params: Option<&RawValue>,
    ) {
        let parsed = params
            .and_then(|p| serde_json::from_str::<NotifyParams<'_>>(p.get()).ok())
            .filter(|p| jsonrpc::payload_depth_ok(p.params.get()));
        self.forward_notify(k, conn, parsed);
    }

    /// Forwards parsed notify params once, or drops them, counting either.
    pub(crate) fn forward_notify<S: Store>(
        &self,
        k: &mut Kernel<S>,
        conn: ConnId,
        params: Option<NotifyParams<'_>>,
    ) {
        let Some((owner, frame)) = self.notification_frame_for(k, conn, params) else {
            k.stats_mut().notifications_dropped += 1;
            return;
        };
        match k.pass(owner, frame) {
            Enqueued::Queued => k.stats_mut().notifications_forwarded += 1,
            _ => k.stats_mut().notifications_dropped += 1,
        }
    }

    /// Validates a notify and builds the forwarded frame, or `None` to drop it.
    fn notification_frame_for<S: Store>(
        &self,
        k: &mut Kernel<S>,
        conn: ConnId,
        params: Option<NotifyParams<'_>>,
    ) -> Option<(ConnId, Frame)> {
        let p = params?;
        let limits = k.limits();
        if p.channel != CATALOG
            || p.method.is_empty()
            || p.method.len() > limits.service_method_bytes_max as usize
            || p.params.get().len() > limits.service_payload_bytes_max as usize
        {
            return None;
        }
        // Taken before the lookups borrow the connection table; a notification dropped below
        // frees it (the pool refills from the next frames handed back).
        let buffer = k.frame_buffer();
        let c = k.conn(conn)?;
        let sender = match &c.phase {
            Phase::Ready { client_id } => client_id,
            Phase::Handshake => return None,
        };
        let service = self.registry.lookup(&p.service_id, &c.principal)?;
        let owner = service.owner;
        Some((
            owner,
            forward_frame(
                buffer,
                "clientService/notification",
                None,
                &p.service_id,
                sender,
                &p.method,
                p.params.get(),
            ),
        ))
    }
}

/// Builds `{"jsonrpc":"2.0",["id":ID,]"method":M,"params":{"channel":..,"serviceId":..,
/// "senderClientId":..,"method":..,"params":RAW}}` in one buffer, copying `params` as received.
/// Builds the frame a service owner receives, in `buffer` (fresh, or from the frame pool).
/// `service_id` must be a registered id and `sender` a bound client id: both are plain ASCII by
/// construction (`new_service_id`, `channel::valid_id`), so they are written without escaping.
pub(crate) fn forward_frame(
    mut buffer: Rc<Vec<u8>>,
    wire_method: &str,
    id: Option<u64>,
    service_id: &str,
    sender: &str,
    method: &str,
    raw: &str,
) -> Frame {
    let need = 160 + service_id.len() + sender.len() + method.len() + raw.len();
    // Pool buffers are never shared; `make_mut` copies only if that ever changes.
    let out = Rc::make_mut(&mut buffer);
    out.clear();
    out.reserve(need);
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",");
    if let Some(id) = id {
        out.extend_from_slice(format!("\"id\":{id},").as_bytes());
    }
    out.extend_from_slice(b"\"method\":\"");
    out.extend_from_slice(wire_method.as_bytes());
    out.extend_from_slice(b"\",\"params\":{\"channel\":\"x-client-services://\",\"serviceId\":");
    push_plain_str(out, service_id);
    out.extend_from_slice(b",\"senderClientId\":");
    push_plain_str(out, sender);
    out.extend_from_slice(b",\"method\":");
    push_json_str(out, method);
    out.extend_from_slice(b",\"params\":");
    out.extend_from_slice(raw.as_bytes());
    out.extend_from_slice(b"}}");
    Frame::from_pool(buffer)
}

/// Appends an id known to need no escapes (a service id or a client id) as a JSON string.
fn push_plain_str(out: &mut Vec<u8>, s: &str) {
    debug_assert!(
        crate::channel::valid_id(s),
        "an id that needs escaping: {} bytes",
        s.len()
    );
    out.push(b'"');
    out.extend_from_slice(s.as_bytes());
    out.push(b'"');
}

/// Appends `s` as a JSON string literal.
fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Only quotes, backslashes and control characters need escapes (UTF-8 goes through as is).
    // No early exit, so the check runs over whole words (ids are short; this is the hot path).
    let plain = s.bytes().fold(true, |plain, b| {
        plain & (b >= 0x20) & (b != b'"') & (b != b'\\')
    });
    if plain {
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    } else {
        out.extend_from_slice(Value::from(s).to_string().as_bytes());
    }
}
