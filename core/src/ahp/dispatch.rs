//! `dispatchAction`: a maintainer drives a chat. Validation against the newest state, the
//! host's follow-up actions, one change, then (once durable) the echo to every subscriber.
//!
//! Sent as a notification, a refused action is echoed to its sender only, with its
//! `rejectionReason`. Sent as a request, the sender gets `result: null` once the change is
//! durable, or a JSON-RPC error and no echo (the AXP SDK dispatches this way, and a `null`
//! beside a rejection would tell it a refused action succeeded).

use ahp_types::actions::{
    ActionOrigin, ChatPendingMessageRemovedAction, ChatTurnCancelledAction, ChatTurnStartedAction,
    StateAction,
};
use ahp_types::state::{MessageKind, PendingMessageKind};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::ahp::clients::{ClientBindings, ClientRecord};
use crate::ahp::session::{turn_cost, Which, HOST_TURN_ID_SHAPE};
use crate::ahp::sessions::Sessions;
use crate::ahp::tx::Tx;
use crate::channel::ChannelRef;
use crate::error::{RpcError, STALE, TURN_IN_PROGRESS};
use crate::host::parse_params;
use crate::kernel::time::iso8601;
use crate::kernel::Kernel;
use crate::limits::ACTION_DEPTH_MAX;
use crate::log::change::Receipt;
use crate::log::receipts::fingerprint;
use crate::log::store::Store;
use crate::log::write_path::{Touched, Txn};
use crate::net::connection::{ConnId, OnFail, Rejection};
use crate::net::wire;
use crate::principal::Role;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DispatchParams<'a> {
    channel: String,
    client_seq: u64,
    #[serde(borrow)]
    action: &'a RawValue,
}

/// The largest `clientSeq` accepted: JavaScript's largest safe integer, the bound every other
/// count on the wire has. Larger numbers would not survive a JavaScript client, nor the
/// store's signed 64-bit columns past 2^63.
pub(crate) const CLIENT_SEQ_MAX: u64 = (1 << 53) - 1;

fn check_client_seq(p: DispatchParams<'_>) -> Result<DispatchParams<'_>, RpcError> {
    if p.client_seq > CLIENT_SEQ_MAX {
        return Err(RpcError::invalid_params(format!(
            "Invalid parameters: clientSeq must be an integer from 0 to {CLIENT_SEQ_MAX}"
        )));
    }
    Ok(p)
}

/// How long a turn ran, by the host's clock, never negative.
pub(crate) fn elapsed_ms(started_at: &str, now_ms: u64) -> i64 {
    let started = started_at
        .parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .unwrap_or(now_ms as i64);
    (now_ms as i64 - started).max(0)
}

/// What became of a dispatch that got past its envelope.
enum Dispatched {
    /// Applied as change `n`.
    Applied(u64),
    /// A retry of an action already applied by change `n` (0: long durable), with the result
    /// it got.
    Retry(u64, std::sync::Arc<str>),
}

impl Sessions {
    /// `dispatchAction` from `conn`; `id` is the raw JSON id of a request, `None` for a
    /// notification.
    pub(crate) fn dispatch_action<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        clients: &mut ClientBindings,
        conn: ConnId,
        id: Option<&str>,
        params: Option<&RawValue>,
    ) {
        let p = match parse_params::<DispatchParams<'_>>(params).and_then(check_client_seq) {
            Ok(p) => p,
            Err(e) => {
                match id {
                    Some(id) => k.reply_error(conn, id, &e),
                    None => k.stats_mut().notifications_dropped += 1,
                }
                return;
            }
        };
        let Some(client_id) = k.client_id(conn).map(str::to_owned) else {
            return;
        };
        let Ok(principal) = k.principal(conn) else {
            return;
        };
        let target = ChannelRef::parse(&p.channel);
        let readable = match target {
            ChannelRef::Root | ChannelRef::Catalog | ChannelRef::Unknown => true,
            r => principal.can_read_session(r.session_id().unwrap_or_default()),
        };
        let exists = match target {
            ChannelRef::Root | ChannelRef::Catalog => true,
            ChannelRef::Unknown => false,
            r => self.contains(r.session_id().unwrap_or_default()),
        };
        let result = if !readable {
            Err(RpcError::forbidden("You don't have access to this channel"))
        } else if !exists {
            Err(RpcError::not_found("Unknown channel"))
        } else {
            let origin = ActionOrigin {
                client_id: client_id.clone(),
                client_seq: p.client_seq as i64,
            };
            self.dispatch_checked(k, clients, &principal.id, principal.role, &p, origin)
        };
        match (result, id) {
            (Ok(Dispatched::Applied(n)), Some(id)) => {
                k.reply_change(conn, id, wire::result_frame(id, "null"), n)
            }
            (Ok(Dispatched::Retry(n, result)), Some(id)) => k.reply_after(
                conn,
                wire::result_frame(id, &result),
                n,
                OnFail::Error(id.into()),
            ),
            (Ok(Dispatched::Applied(n)), None) => {
                // The sender sees its action through its subscription, or not at all; should
                // the change fail, it hears the rejection it would have heard at once.
                let rejection = Rejection {
                    channel: p.channel.clone(),
                    action: echoable(p.action).to_owned(),
                    client_id,
                    client_seq: p.client_seq,
                };
                k.on_failure_tell(conn, n, OnFail::Reject(Box::new(rejection)));
            }
            (Ok(Dispatched::Retry(..)), None) => {}
            (Err(e), Some(id)) => k.reply_error(conn, id, &e),
            (Err(_), None) if readable && !exists => {
                // AHP: actions for channels that do not exist are dropped without an echo.
                k.stats_mut().notifications_dropped += 1;
            }
            (Err(e), None) => {
                let frame = wire::rejection_frame(
                    &p.channel,
                    echoable(p.action),
                    &client_id,
                    p.client_seq,
                    k.server_seq(),
                    &e.message,
                );
                // After every change in flight: the echo carries the current serverSeq.
                k.reply_after(conn, frame, k.newest_live(), OnFail::Send);
            }
        }
    }

    fn dispatch_checked<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        clients: &mut ClientBindings,
        owner: &str,
        role: Role,
        p: &DispatchParams<'_>,
        origin: ActionOrigin,
    ) -> Result<Dispatched, RpcError> {
        // Refusals that need nothing from the store come before the receipt lookup, so a
        // client that may not dispatch costs no store read however often it tries. No answer
        // to a permitted client changes: a receipt is written only for an action that passes
        // all three.
        if role != Role::Maintainer {
            return Err(RpcError::forbidden("Only maintainers can do this"));
        }
        let id = match ChannelRef::parse(&p.channel) {
            ChannelRef::Chat(id) if self.get(id).is_some_and(|e| !e.meta.closed) => id.to_owned(),
            _ => {
                return Err(RpcError::invalid_params(
                    "This action must target an open session's chat",
                ))
            }
        };
        // The action was read raw, with no depth limit. What is committed must stay readable
        // when wrapped in envelopes, checkpoints and snapshots (see `ACTION_DEPTH_MAX`).
        if wire::json_depth(p.action.get()) > ACTION_DEPTH_MAX {
            return Err(RpcError::invalid_params(format!(
                "Invalid AHP action: nests too deeply (at most {ACTION_DEPTH_MAX} levels)"
            )));
        }
        let params_value = json!({
            "channel": p.channel,
            "clientSeq": p.client_seq,
            "action": serde_json::from_str::<Value>(p.action.get()).unwrap_or(Value::Null),
        });
        let key = format!("dispatch:{}:{}", origin.client_id, p.client_seq);
        let fingerprint = fingerprint("dispatchAction", &params_value);
        // The same action under the same (clientId, clientSeq): a retry, already applied.
        // A different action under a used clientSeq is a restarted counter, not a retry: the
        // official AHP clients start clientSeq at 1 on every connection. It is applied as a
        // new action and its receipt replaces the old one. (The AXP host refuses it with
        // -32011, which breaks every official client after its first reconnect.)
        if let Some(known) = k.receipt(owner, &key)? {
            if known.fingerprint == fingerprint {
                return Ok(Dispatched::Retry(known.change, known.result));
            }
        }
        let action: StateAction = serde_json::from_str(p.action.get())
            .map_err(|e| RpcError::invalid_params(format!("Invalid AHP action: {e}")))?;
        k.room()?;
        let Some(mut tx) = self.begin(k, &id) else {
            return Err(RpcError::invalid_params(
                "This action must target an open session's chat",
            ));
        };
        let now_ms = k.wall_ms();
        let built = self
            .chat_action(k, &mut tx, action, origin.clone(), now_ms)
            .and_then(|()| tx.sync_chat());
        if let Err(e) = built {
            self.abort_tx(k, tx);
            return Err(e);
        }
        let last = clients
            .get(&origin.client_id)
            .map_or(0, |c| c.last_client_seq);
        let client = ClientRecord {
            client_id: origin.client_id.clone(),
            owner: owner.to_owned(),
            last_client_seq: last.max(p.client_seq),
            dispatched: true,
        };
        let receipt = Receipt {
            owner: owner.to_owned(),
            key,
            fingerprint,
            result: "null".into(),
        };
        let extra = Txn {
            receipts: vec![receipt],
            records: vec![client.to_record()],
            touched: vec![Touched::Client(client.client_id.clone())],
            ..Txn::default()
        };
        let n = self.commit_tx(k, tx, extra);
        clients.insert(client);
        Ok(Dispatched::Applied(n))
    }

    /// Validates one maintainer chat action and emits it with the host's follow-ups.
    fn chat_action<S: Store>(
        &self,
        k: &mut Kernel<S>,
        tx: &mut Tx,
        action: StateAction,
        origin: ActionOrigin,
        now_ms: u64,
    ) -> Result<(), RpcError> {
        let chat = &tx.entry.chat;
        match action {
            StateAction::ChatTurnStarted(mut a) => {
                if chat.active_turn.is_some() {
                    return Err(RpcError::new(
                        TURN_IN_PROGRESS,
                        "A turn is already running. Use steer or queue instead.",
                    ));
                }
                if tx.entry.turn_ids.contains(&a.turn_id) {
                    return Err(RpcError::conflict("Turn ID already exists"));
                }
                if a.message.origin.kind != MessageKind::User {
                    return Err(RpcError::forbidden("Only user messages are accepted"));
                }
                self.chat_room(k, tx, turn_cost(&a.turn_id, &a.message))?;
                // The host's clock decides when a turn started.
                a.started_at = iso8601(now_ms);
                tx.emit(Which::Chat, StateAction::ChatTurnStarted(a), Some(origin))
            }
            StateAction::ChatPendingMessageSet(a) => {
                if a.message.origin.kind != MessageKind::User {
                    return Err(RpcError::forbidden("Only user messages are accepted"));
                }
                let queued = chat.queued_messages.as_ref().map_or(0, Vec::len);
                let replaces = chat
                    .queued_messages
                    .as_ref()
                    .is_some_and(|q| q.iter().any(|m| m.id == a.id));
                if a.kind == PendingMessageKind::Queued
                    && !replaces
                    && queued >= k.limits().pending_messages_max as usize
                {
                    return Err(RpcError::limit("Pending message limit reached"));
                }
                // A pending message is only ever started as a turn, with an id the host makes.
                // Refused now if it could not be: the turns' cost never goes down, so a message
                // that does not fit now never will.
                self.chat_room(k, tx, turn_cost(HOST_TURN_ID_SHAPE, &a.message))?;
                let steering = a.kind == PendingMessageKind::Steering;
                tx.emit(
                    Which::Chat,
                    StateAction::ChatPendingMessageSet(a),
                    Some(origin),
                )?;
                if steering {
                    // Steering interrupts the running turn; it starts the next one.
                    if let Some(active) = tx.entry.chat.active_turn.clone() {
                        let cancel = ChatTurnCancelledAction {
                            turn_id: active.id,
                            duration: elapsed_ms(&active.started_at, now_ms),
                            meta: None,
                        };
                        tx.emit(Which::Chat, StateAction::ChatTurnCancelled(cancel), None)?;
                    }
                }
                self.next_turn(k, tx, now_ms)
            }
            StateAction::ChatPendingMessageRemoved(a) => {
                let exists = match a.kind {
                    PendingMessageKind::Steering => {
                        chat.steering_message.as_ref().is_some_and(|m| m.id == a.id)
                    }
                    PendingMessageKind::Queued => chat
                        .queued_messages
                        .as_ref()
                        .is_some_and(|q| q.iter().any(|m| m.id == a.id)),
                };
                if !exists {
                    return Err(RpcError::conflict("Pending message not found"));
                }
                tx.emit(
                    Which::Chat,
                    StateAction::ChatPendingMessageRemoved(a),
                    Some(origin),
                )?;
                // An idle chat holds pending messages only when the next one did not fit the
                // chat limits; with it removed, the one after may.
                self.next_turn(k, tx, now_ms)
            }
            StateAction::ChatTurnCancelled(mut a) => {
                let Some(active) = chat.active_turn.as_ref().filter(|t| t.id == a.turn_id) else {
                    return Err(RpcError::conflict("Turn is not active"));
                };
                // The host measured the turn: its clock decides the duration, as it decided
                // `startedAt`, so `modifiedAt` (startedAt + duration) stays on the host's clock.
                a.duration = elapsed_ms(&active.started_at, now_ms);
                tx.emit(Which::Chat, StateAction::ChatTurnCancelled(a), Some(origin))?;
                // The chat is idle now: a message queued during the turn starts, as after a
                // steering interrupt.
                self.next_turn(k, tx, now_ms)
            }
            StateAction::ChatToolCallConfirmed(_) => {
                // Tool calls come from executors (AXP), and none holds a lease on this chat.
                Err(RpcError::new(STALE, "Executor is no longer available"))
            }
            StateAction::Unknown(_) => Err(RpcError::invalid_params(
                "Invalid AHP action: unknown action type",
            )),
            _ => Err(RpcError::forbidden(
                "This AHP interaction is not supported by this host",
            )),
        }
    }

    /// Refuses a turn costing `cost` that would take the chat past `chat_bytes_max` or all
    /// chats past `chat_bytes_total_max`.
    fn chat_room<S: Store>(&self, k: &Kernel<S>, tx: &Tx, cost: u64) -> Result<(), RpcError> {
        let limits = k.limits();
        if tx.entry.chat_bytes + cost > limits.chat_bytes_max {
            return Err(RpcError::limit(
                "Chat size limit reached; continue in a new session",
            ));
        }
        if tx.chat_bytes_total_with(self) + cost > limits.chat_bytes_total_max {
            return Err(RpcError::limit("Host chat storage limit reached"));
        }
        Ok(())
    }

    /// Starts the next pending message as a turn when the chat is idle.
    fn next_turn<S: Store>(
        &self,
        k: &mut Kernel<S>,
        tx: &mut Tx,
        now_ms: u64,
    ) -> Result<(), RpcError> {
        let chat = &tx.entry.chat;
        if chat.active_turn.is_some() {
            return Ok(());
        }
        let next = match (
            &chat.steering_message,
            chat.queued_messages.as_ref().and_then(|q| q.first()),
        ) {
            (Some(m), _) => (PendingMessageKind::Steering, m.clone()),
            (None, Some(m)) => (PendingMessageKind::Queued, m.clone()),
            (None, None) => return Ok(()),
        };
        let (kind, pending) = next;
        // A message that no longer fits (other turns took the room since it was accepted)
        // waits, pending, until it is removed; the chat stays idle.
        if self
            .chat_room(k, tx, turn_cost(HOST_TURN_ID_SHAPE, &pending.message))
            .is_err()
        {
            return Ok(());
        }
        let removed = ChatPendingMessageRemovedAction {
            kind,
            id: pending.id.clone(),
        };
        tx.emit(
            Which::Chat,
            StateAction::ChatPendingMessageRemoved(removed),
            None,
        )?;
        let started = ChatTurnStartedAction {
            turn_id: k.uuid(),
            started_at: iso8601(now_ms),
            message: pending.message,
            queued_message_id: (kind == PendingMessageKind::Queued).then_some(pending.id),
            meta: None,
        };
        tx.emit(Which::Chat, StateAction::ChatTurnStarted(started), None)
    }
}

/// The action as the echo may carry it: an action too deep to store is echoed as `null`
/// (echoed as sent it could make the frame deeper than JSON readers accept).
fn echoable(action: &RawValue) -> &str {
    if wire::json_depth(action.get()) <= ACTION_DEPTH_MAX {
        action.get()
    } else {
        "null"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elapsed_never_negative() {
        assert_eq!(elapsed_ms("1970-01-01T00:00:01.000Z", 3_000), 2_000);
        assert_eq!(elapsed_ms("1970-01-01T00:00:05.000Z", 3_000), 0);
    }
}
