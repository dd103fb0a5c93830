//! `_axp/emit`: what an executor adds to the turn it reserved, checked action by action
//! against the active turn (the AXP host's §7.2) and applied all together or not at all.
//! Executors only add output: they cannot start turns, originate user actions, claim approval
//! for their own tool calls or reference content outside their session; each action is
//! charged against the chat limits as it arrives.

use ahp_types::actions::StateAction;
use ahp_types::state::{ResponsePart, ToolCallConfirmationReason, ToolCallState};
use serde_json::Value;

use crate::ahp::session::{response_cost, SessionChannel};
use crate::ahp::sessions::Sessions;
use crate::ahp::tx::Tx;
use crate::axp::blob::check_refs;
use crate::axp::lease::fenced;
use crate::axp::params::EmitParams;
use crate::axp::turn::{chat_room, is_executor_action, read_action, sync_chat, tool};
use crate::error::{RpcError, BUDGET, CONFLICT, STALE};
use crate::kernel::Kernel;
use crate::log::store::Store;
use crate::principal::Principal;

/// `_axp/emit`: output of the reserved turn, all of it or none of it. `has_blob(digest)` says
/// whether this session may reference a blob.
pub(crate) fn emit<S: Store>(
    k: &mut Kernel<S>,
    sessions: &Sessions,
    tx: &mut Tx,
    principal: &Principal,
    p: EmitParams,
    has_blob: &dyn Fn(&str) -> bool,
) -> Result<String, RpcError> {
    fenced(principal, &tx.entry.exchange, p.epoch, k.wall_ms())?;
    if tx
        .entry
        .exchange
        .reservation
        .as_ref()
        .is_none_or(|r| r.epoch != p.epoch)
    {
        return Err(RpcError::new(
            BUDGET,
            "The agent must reserve the turn before it can send output",
        ));
    }
    let prefix = format!(
        "axp-blob:/{}/",
        crate::axp::encode_uri_component(&tx.entry.exchange.resource)
    );
    for raw in &p.actions {
        let action = read_action(&raw.to_string())?;
        check_output(tx, raw, &action)?;
        check_refs(raw, &prefix, has_blob)?;
        chat_room(k, sessions, tx, response_cost(&action))?;
        tx.emit(SessionChannel::Chat, action, None)?;
    }
    sync_chat(tx)?;
    Ok("null".into())
}

/// The checks of one executor action against the active turn (the AXP host's §7.2).
fn check_output(tx: &Tx, raw: &Value, action: &StateAction) -> Result<(), RpcError> {
    if !is_executor_action(action) {
        return Err(RpcError::forbidden("Agents can't send this kind of action"));
    }
    let active = tx.entry.chat.active_turn.as_ref();
    let turn_id = raw.get("turnId").and_then(Value::as_str);
    let Some(active) = active.filter(|t| Some(t.id.as_str()) == turn_id) else {
        return Err(RpcError::new(
            STALE,
            "Action does not belong to the active turn",
        ));
    };
    let part_ids = || {
        active
            .response_parts
            .iter()
            .filter_map(|p| serde_json::to_value(p).ok())
            .filter_map(|v| v.get("id").and_then(Value::as_str).map(str::to_owned))
    };
    match action {
        StateAction::ChatResponsePart(a) => {
            if !matches!(
                a.part,
                ResponsePart::Markdown(_)
                    | ResponsePart::Reasoning(_)
                    | ResponsePart::ContentRef(_)
            ) {
                return Err(RpcError::forbidden(
                    "Tool calls and errors must use their own action types",
                ));
            }
            if let Some(id) = raw.pointer("/part/id").and_then(Value::as_str) {
                if part_ids().any(|p| p == id) {
                    return Err(RpcError::conflict("Response part already exists"));
                }
            }
        }
        StateAction::ChatDelta(a) => {
            let exists = active
                .response_parts
                .iter()
                .any(|p| matches!(p, ResponsePart::Markdown(m) if m.id == a.part_id));
            if !exists {
                return Err(RpcError::conflict(
                    "Text delta requires an existing markdown part",
                ));
            }
        }
        StateAction::ChatReasoning(a) => {
            let exists = active
                .response_parts
                .iter()
                .any(|p| matches!(p, ResponsePart::Reasoning(r) if r.id == a.part_id));
            if !exists {
                return Err(RpcError::conflict(
                    "Reasoning delta requires an existing reasoning part",
                ));
            }
        }
        _ => {}
    }
    let Some(tool_call_id) = raw.get("toolCallId").and_then(Value::as_str) else {
        return Ok(());
    };
    if raw.get("contributor").is_some() || raw.get("clientId").is_some() {
        return Err(RpcError::forbidden(
            "Tool authority is assigned by the host",
        ));
    }
    let existing = tool(tx, tool_call_id);
    match (action, existing) {
        (StateAction::ChatToolCallStart(_), Some(_)) => {
            return Err(RpcError::conflict("Tool call already exists"))
        }
        (StateAction::ChatToolCallStart(_), None) => {}
        (_, None) => return Err(RpcError::conflict("Unknown tool call")),
        _ => {}
    }
    let running = matches!(existing, Some(ToolCallState::Running(_)));
    match action {
        StateAction::ChatToolCallComplete(_) | StateAction::ChatToolCallContentChanged(_)
            if !running =>
        {
            Err(RpcError::forbidden(
                "Tool must be running before it can produce results",
            ))
        }
        StateAction::ChatToolCallReady(a) => {
            let claims_approval = match &a.confirmed {
                None => false,
                Some(ToolCallConfirmationReason::NotNeeded) => a.options.is_some(),
                Some(_) => true,
            };
            if claims_approval {
                return Err(RpcError::forbidden(
                    "An executor cannot claim user approval",
                ));
            }
            if !matches!(
                existing,
                Some(ToolCallState::Streaming(_) | ToolCallState::Running(_))
            ) {
                return Err(RpcError::new(
                    CONFLICT,
                    "Tool is not ready for confirmation",
                ));
            }
            if a.editable == Some(true) {
                return Err(RpcError::invalid_params(
                    "ACP cannot edit permission request input",
                ));
            }
            if let Some(options) = &a.options {
                let mut ids: Vec<&str> = options.iter().map(|o| o.id.as_str()).collect();
                ids.sort_unstable();
                ids.dedup();
                if options.is_empty() || ids.len() != options.len() {
                    return Err(RpcError::invalid_params(
                        "Confirmation options must be nonempty and unique",
                    ));
                }
            }
            Ok(())
        }
        _ => Ok(()),
    }
}
