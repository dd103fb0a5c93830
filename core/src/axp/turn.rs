//! Turn control on AXP sessions: the maintainer dispatch table shared by `dispatchAction` and
//! `_axp/dispatch`, reservations and settlement, `_axp/close`, and [`finish`], the only place a
//! turn ends with its accounting (executor output is `emit.rs`).
//!
//! Maintainers drive the chat (start, queue, steer, cancel, answer tool confirmations);
//! executors only add to the turn they reserved. ACP v1 has no mid-prompt steering, so a
//! steering message cancels the running turn (its reservation charged in full) and becomes
//! the next turn. The host's clock decides when turns start and how long they ran.

use ahp_types::actions::{
    ActionOrigin, ChatPendingMessageRemovedAction, ChatTurnStartedAction,
    SessionInputNeededRemovedAction, StateAction,
};
use ahp_types::state::{
    ConfirmationOptionKind, MessageKind, PendingMessageKind, ResponsePart, ToolCallState,
};
use serde_json::{json, Value};

use crate::ahp::session::{turn_cost, SessionChannel, HOST_TURN_ID_SHAPE};
use crate::ahp::sessions::Sessions;
use crate::ahp::tx::Tx;
use crate::axp::budget;
use crate::axp::lease::fenced;
use crate::axp::params::{Outcome, ReserveParams, SettleParams};
use crate::axp::reducer::AxpAction;
use crate::axp::state::{Reservation, Status, Usage};
use crate::axp::{maintain, AXP_CAPABILITY};
use crate::error::{RpcError, BUDGET, INTERNAL_ERROR, STALE, TURN_IN_PROGRESS};
use crate::kernel::time::iso8601;
use crate::kernel::Kernel;
use crate::limits::ACTION_DEPTH_MAX;
use crate::log::store::Store;
use crate::net::jsonrpc;
use crate::principal::Principal;

/// Whether `action` is one an executor may originate (`_axp/emit`): response parts, text and
/// reasoning deltas, and tool-call progress. The host never emits these itself, so a chat's
/// log tells executor output apart by type alone (the chat limits charge it as it arrives).
pub(crate) fn is_executor_action(action: &StateAction) -> bool {
    matches!(
        action,
        StateAction::ChatResponsePart(_)
            | StateAction::ChatDelta(_)
            | StateAction::ChatReasoning(_)
            | StateAction::ChatToolCallStart(_)
            | StateAction::ChatToolCallDelta(_)
            | StateAction::ChatToolCallReady(_)
            | StateAction::ChatToolCallComplete(_)
            | StateAction::ChatToolCallContentChanged(_)
    )
}

/// How long a turn ran, by the host's clock, never negative.
pub(crate) fn elapsed_ms(started_at: &str, now_ms: u64) -> i64 {
    let started = started_at
        .parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .unwrap_or(now_ms as i64);
    (now_ms as i64 - started).max(0)
}

/// Reads an action sent as JSON: `-32602` when it nests too deeply to store or is not an AHP
/// action this host knows.
pub(crate) fn read_action(raw: &str) -> Result<StateAction, RpcError> {
    // The action was read raw, with no depth limit. What is committed must stay readable
    // when wrapped in envelopes, checkpoints and snapshots (see `ACTION_DEPTH_MAX`).
    if jsonrpc::json_depth(raw) > ACTION_DEPTH_MAX {
        return Err(RpcError::invalid_params(format!(
            "Invalid AHP action: nests too deeply (at most {ACTION_DEPTH_MAX} levels)"
        )));
    }
    let action: StateAction = serde_json::from_str(raw)
        .map_err(|e| RpcError::invalid_params(format!("Invalid AHP action: {e}")))?;
    if matches!(action, StateAction::Unknown(_)) {
        return Err(RpcError::invalid_params(
            "Invalid AHP action: unknown action type",
        ));
    }
    Ok(action)
}

/// Refuses what would take the chat past `chat_bytes_max` or all chats past
/// `chat_bytes_total_max` by `cost` more bytes.
pub(crate) fn chat_room<S: Store>(
    k: &Kernel<S>,
    sessions: &Sessions,
    tx: &Tx,
    cost: u64,
) -> Result<(), RpcError> {
    let limits = k.limits();
    if tx.entry.chat_bytes + cost > limits.chat_bytes_max {
        return Err(RpcError::limit(
            "Chat size limit reached; continue in a new session",
        ));
    }
    if tx.chat_bytes_total_with(sessions) + cost > limits.chat_bytes_total_max {
        return Err(RpcError::limit("Host chat storage limit reached"));
    }
    Ok(())
}

/// The tool call `id` of the active turn, if any.
pub(crate) fn tool<'a>(tx: &'a Tx, id: &str) -> Option<&'a ToolCallState> {
    tx.entry
        .chat
        .active_turn
        .as_ref()?
        .response_parts
        .iter()
        .find_map(|p| match p {
            ResponsePart::ToolCall(t) if tool_id(&t.tool_call) == Some(id) => Some(&t.tool_call),
            _ => None,
        })
}

fn tool_id(t: &ToolCallState) -> Option<&str> {
    Some(match t {
        ToolCallState::Streaming(s) => &s.tool_call_id,
        ToolCallState::PendingConfirmation(s) => &s.tool_call_id,
        ToolCallState::Running(s) => &s.tool_call_id,
        ToolCallState::AuthRequired(s) => &s.tool_call_id,
        ToolCallState::PendingResultConfirmation(s) => &s.tool_call_id,
        ToolCallState::Completed(s) => &s.tool_call_id,
        ToolCallState::Cancelled(s) => &s.tool_call_id,
        ToolCallState::Unknown(_) => return None,
    })
}

/// Ends the active turn as `outcome`, with its accounting: the reservation (if any) settles
/// against its grant with `usage`, or in full when none is reported; the chat records the
/// usage and the turn's end. `error` is the message of an `Error` outcome. Returns whether a
/// turn ended; the caller then mirrors the chat into the session ([`sync_chat`]), once, after
/// whatever else its change does to the chat.
pub(crate) fn finish<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    usage: Option<Usage>,
    outcome: Outcome,
    error: &str,
) -> Result<bool, RpcError> {
    let now = k.wall_ms();
    if let Some(reservation) = tx.entry.exchange.reservation.clone() {
        let grant = tx
            .entry
            .exchange
            .grants
            .get(&reservation.grant_id)
            .cloned()
            .ok_or_else(|| RpcError::new(INTERNAL_ERROR, "Reservation lost its grant"))?;
        let (grant, usage) = budget::settle(&grant, &reservation, usage.as_ref())?;
        tx.emit_axp(AxpAction::Settled {
            turn_id: reservation.turn_id,
            grant,
            usage,
        });
    }
    let Some(active) = tx.entry.chat.active_turn.as_ref() else {
        return Ok(false);
    };
    let turn_id = active.id.clone();
    // The host measured the turn: its clock decides the duration, as it decided `startedAt`,
    // so `modifiedAt` (startedAt + duration) stays on the host's clock.
    let duration = elapsed_ms(&active.started_at, now);
    if let Some(u) = &usage {
        let cost_source = u.cost_source.unwrap_or(u.source);
        let action = json!({
            "type": "chat/usage",
            "turnId": turn_id,
            "usage": {
                "inputTokens": u.input_tokens,
                "outputTokens": u.output_tokens,
                "cacheReadTokens": u.cache_read_tokens,
                "_meta": { AXP_CAPABILITY: {
                    "costMicros": u.cost_micros,
                    "source": u.source,
                    "costSource": cost_source,
                } },
            },
        });
        tx.emit(SessionChannel::Chat, typed(action)?, None)?;
    }
    let end = match outcome {
        Outcome::Complete => {
            json!({"type": "chat/turnComplete", "turnId": turn_id, "duration": duration})
        }
        Outcome::Cancelled => {
            json!({"type": "chat/turnCancelled", "turnId": turn_id, "duration": duration})
        }
        Outcome::Error => json!({
            "type": "chat/error",
            "turnId": turn_id,
            "duration": duration,
            "part": { "kind": "error", "error": { "errorType": "executor", "message": error } },
        }),
    };
    tx.emit(SessionChannel::Chat, typed(end)?, None)?;
    Ok(true)
}

/// A host-built action, typed.
fn typed(v: Value) -> Result<StateAction, RpcError> {
    serde_json::from_value(v).map_err(|_| RpcError::new(INTERNAL_ERROR, "Internal host error"))
}

/// Mirrors the chat into the session: its status and `modifiedAt`, and one input request per
/// tool call of the active turn that waits for confirmation (the others are withdrawn).
pub(crate) fn sync_chat(tx: &mut Tx) -> Result<(), RpcError> {
    tx.sync_chat()?;
    let stale: Vec<String> = tx
        .entry
        .session
        .input_needed
        .iter()
        .flatten()
        .filter_map(|r| serde_json::to_value(r).ok())
        .filter_map(|v| v.get("id").and_then(Value::as_str).map(str::to_owned))
        .collect();
    for id in stale {
        let removed = SessionInputNeededRemovedAction { id };
        tx.emit(
            SessionChannel::Session,
            StateAction::SessionInputNeededRemoved(removed),
            None,
        )?;
    }
    let chat = tx.entry.chat.resource.clone();
    let mut requests = Vec::new();
    if let Some(active) = &tx.entry.chat.active_turn {
        for part in &active.response_parts {
            if let ResponsePart::ToolCall(t) = part {
                if let ToolCallState::PendingConfirmation(s) = &t.tool_call {
                    requests.push(json!({
                        "type": "session/inputNeededSet",
                        "request": {
                            "kind": "toolConfirmation",
                            "id": s.tool_call_id,
                            "chat": chat,
                            "turnId": active.id,
                            "toolCall": t.tool_call,
                        },
                    }));
                }
            }
        }
    }
    for request in requests {
        tx.emit(SessionChannel::Session, typed(request)?, None)?;
    }
    Ok(())
}

/// Starts the next pending message as a turn when the chat is idle. Returns whether it did.
pub(crate) fn next_turn<S: Store>(
    k: &mut Kernel<S>,
    sessions: &Sessions,
    tx: &mut Tx,
) -> Result<bool, RpcError> {
    let chat = &tx.entry.chat;
    if chat.active_turn.is_some() || tx.entry.exchange.status == Status::Closed {
        return Ok(false);
    }
    let (kind, pending) = match (
        &chat.steering_message,
        chat.queued_messages.as_ref().and_then(|q| q.first()),
    ) {
        (Some(m), _) => (PendingMessageKind::Steering, m.clone()),
        (None, Some(m)) => (PendingMessageKind::Queued, m.clone()),
        (None, None) => return Ok(false),
    };
    // A message that no longer fits (other turns took the room since it was accepted)
    // waits, pending, until it is removed; the chat stays idle.
    if chat_room(
        k,
        sessions,
        tx,
        turn_cost(HOST_TURN_ID_SHAPE, &pending.message),
    )
    .is_err()
    {
        return Ok(false);
    }
    let removed = ChatPendingMessageRemovedAction {
        kind,
        id: pending.id.clone(),
    };
    tx.emit(
        SessionChannel::Chat,
        StateAction::ChatPendingMessageRemoved(removed),
        None,
    )?;
    let started = ChatTurnStartedAction {
        turn_id: k.uuid(),
        started_at: iso8601(k.wall_ms()),
        message: pending.message,
        queued_message_id: (kind == PendingMessageKind::Queued).then_some(pending.id),
        meta: None,
    };
    tx.emit(
        SessionChannel::Chat,
        StateAction::ChatTurnStarted(started),
        None,
    )?;
    Ok(true)
}

/// One maintainer action on an open session's chat, with the host's follow-ups (the table of
/// the AXP host, §7.1). `caller` is the maintainer's principal id; `origin` is the AHP
/// client's (none for `_axp/dispatch`). The caller mirrors the chat into the session after.
pub(crate) fn maintainer_action<S: Store>(
    k: &mut Kernel<S>,
    sessions: &Sessions,
    tx: &mut Tx,
    caller: &str,
    action: StateAction,
    origin: Option<ActionOrigin>,
) -> Result<(), RpcError> {
    let now_ms = k.wall_ms();
    let chat = &tx.entry.chat;
    match action {
        StateAction::ChatTurnStarted(mut a) => {
            if chat.active_turn.is_some() || tx.entry.exchange.reservation.is_some() {
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
            chat_room(k, sessions, tx, turn_cost(&a.turn_id, &a.message))?;
            // The host's clock decides when a turn started.
            a.started_at = iso8601(now_ms);
            tx.emit(
                SessionChannel::Chat,
                StateAction::ChatTurnStarted(a),
                origin,
            )
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
            chat_room(k, sessions, tx, turn_cost(HOST_TURN_ID_SHAPE, &a.message))?;
            let steering = a.kind == PendingMessageKind::Steering;
            tx.emit(
                SessionChannel::Chat,
                StateAction::ChatPendingMessageSet(a),
                origin,
            )?;
            if steering && tx.entry.chat.active_turn.is_some() {
                // ACP v1 cannot steer mid-prompt: the running turn is cancelled (its
                // reservation charged in full) and the steering message starts the next.
                finish(k, tx, None, Outcome::Cancelled, "")?;
            }
            next_turn(k, sessions, tx).map(|_| ())
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
                SessionChannel::Chat,
                StateAction::ChatPendingMessageRemoved(a),
                origin,
            )?;
            // An idle chat holds pending messages only when the next one did not fit the
            // chat limits; with it removed, the one after may.
            next_turn(k, sessions, tx).map(|_| ())
        }
        StateAction::ChatTurnCancelled(mut a) => {
            let Some(active) = chat.active_turn.as_ref().filter(|t| t.id == a.turn_id) else {
                return Err(RpcError::conflict("Turn is not active"));
            };
            a.duration = elapsed_ms(&active.started_at, now_ms);
            if let Some(reservation) = tx.entry.exchange.reservation.clone() {
                // The executor's outcome is unknown: the full reservation is charged.
                settle_in_full(tx, &reservation)?;
            }
            tx.emit(
                SessionChannel::Chat,
                StateAction::ChatTurnCancelled(a),
                origin,
            )?;
            // The chat is idle now: a message queued during the turn starts, as after a
            // steering interrupt.
            next_turn(k, sessions, tx).map(|_| ())
        }
        StateAction::ChatToolCallConfirmed(a) => {
            if chat.active_turn.as_ref().is_none_or(|t| t.id != a.turn_id) {
                return Err(RpcError::conflict("Turn is not active"));
            }
            let Some(ToolCallState::PendingConfirmation(pending)) = tool(tx, &a.tool_call_id)
            else {
                return Err(RpcError::conflict("Tool is not awaiting confirmation"));
            };
            if a.edited_tool_input.is_some() {
                return Err(RpcError::invalid_params(
                    "ACP permission choices cannot edit input",
                ));
            }
            if let Some(options) = &pending.options {
                let chosen = options
                    .iter()
                    .find(|o| Some(&o.id) == a.selected_option_id.as_ref());
                let matches = chosen
                    .is_some_and(|o| (o.kind == ConfirmationOptionKind::Approve) == a.approved);
                if !matches {
                    return Err(RpcError::invalid_params(
                        "Pick one of the options the agent offered",
                    ));
                }
            }
            let Some(lease) = tx
                .entry
                .exchange
                .lease
                .as_ref()
                .filter(|l| l.expires_at > now_ms)
            else {
                return Err(RpcError::new(STALE, "Executor is no longer available"));
            };
            if lease.owner == caller {
                return Err(RpcError::forbidden(
                    "An executor cannot approve its own tool call",
                ));
            }
            tx.emit(
                SessionChannel::Chat,
                StateAction::ChatToolCallConfirmed(a),
                origin,
            )
        }
        StateAction::Unknown(_) => Err(RpcError::invalid_params(
            "Invalid AHP action: unknown action type",
        )),
        _ => Err(RpcError::forbidden(
            "This AHP interaction is not supported by AXP",
        )),
    }
}

/// Settles `reservation` charging its full ceiling (the outcome of its turn is unknown).
fn settle_in_full(tx: &mut Tx, reservation: &Reservation) -> Result<(), RpcError> {
    let grant = tx
        .entry
        .exchange
        .grants
        .get(&reservation.grant_id)
        .cloned()
        .ok_or_else(|| RpcError::new(INTERNAL_ERROR, "Reservation lost its grant"))?;
    let (grant, usage) = budget::settle(&grant, reservation, None)?;
    tx.emit_axp(AxpAction::Settled {
        turn_id: reservation.turn_id.clone(),
        grant,
        usage,
    });
    Ok(())
}

/// `_axp/reserve`: the executor reserves the active turn against its grant.
pub(crate) fn reserve<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    principal: &Principal,
    p: ReserveParams,
) -> Result<String, RpcError> {
    let now = k.wall_ms();
    let lease = fenced(principal, &tx.entry.exchange, p.epoch, now)?.clone();
    if tx.entry.exchange.reservation.is_some() {
        return Err(RpcError::conflict("A turn is already reserved"));
    }
    if tx
        .entry
        .chat
        .active_turn
        .as_ref()
        .is_none_or(|t| t.id != p.turn_id)
    {
        return Err(RpcError::conflict("Turn is no longer active"));
    }
    let Some(grant) = tx.entry.exchange.grants.get(&lease.grant_id) else {
        return Err(RpcError::new(BUDGET, "Donation not found"));
    };
    budget::reserve(grant, &p.ceiling)?;
    let reservation = Reservation {
        turn_id: p.turn_id,
        grant_id: grant.id.clone(),
        epoch: p.epoch,
        ceiling: p.ceiling,
        started_at: now,
    };
    tx.emit_axp(AxpAction::Reserved { reservation });
    Ok("null".into())
}

/// `_axp/settle`: the executor reports how its turn ended and what it cost.
pub(crate) fn settle<S: Store>(
    k: &mut Kernel<S>,
    sessions: &Sessions,
    tx: &mut Tx,
    principal: &Principal,
    p: SettleParams,
) -> Result<String, RpcError> {
    fenced(principal, &tx.entry.exchange, p.epoch, k.wall_ms())?;
    let ours = tx
        .entry
        .exchange
        .reservation
        .as_ref()
        .is_some_and(|r| r.turn_id == p.turn_id && r.epoch == p.epoch);
    if !ours {
        return Err(RpcError::new(
            STALE,
            "Reservation no longer belongs to this turn",
        ));
    }
    let error = p.error.as_deref().unwrap_or("Executor failed");
    let ended = finish(k, tx, p.usage, p.outcome, error)?;
    let started = p.outcome == Outcome::Complete && next_turn(k, sessions, tx)?;
    if ended || started {
        sync_chat(tx)?;
    }
    Ok("null".into())
}

/// `_axp/close`: the maintainer ends the session for good. Its running turn is cancelled (the
/// reservation charged in full), pending messages are dropped, the lease ends, the session is
/// archived and its task is free for a new session; its history stays.
pub(crate) fn close<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    principal: &Principal,
) -> Result<String, RpcError> {
    maintain(principal)?;
    if tx.entry.exchange.status == Status::Closed {
        return Ok("null".into());
    }
    let ended = finish(k, tx, None, Outcome::Cancelled, "")?;
    let chat = &tx.entry.chat;
    let mut removals: Vec<ChatPendingMessageRemovedAction> = Vec::new();
    if let Some(m) = &chat.steering_message {
        removals.push(ChatPendingMessageRemovedAction {
            kind: PendingMessageKind::Steering,
            id: m.id.clone(),
        });
    }
    for m in chat.queued_messages.iter().flatten() {
        removals.push(ChatPendingMessageRemovedAction {
            kind: PendingMessageKind::Queued,
            id: m.id.clone(),
        });
    }
    for removed in removals {
        tx.emit(
            SessionChannel::Chat,
            StateAction::ChatPendingMessageRemoved(removed),
            None,
        )?;
    }
    if ended {
        sync_chat(tx)?;
    }
    let epoch = tx.entry.exchange.epoch;
    tx.emit_axp(AxpAction::LeaseChanged {
        lease: None,
        epoch,
        status: Status::Closed,
    });
    tx.emit(
        SessionChannel::Session,
        typed(json!({"type": "session/isArchivedChanged", "isArchived": true}))?,
        None,
    )?;
    Ok("null".into())
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
