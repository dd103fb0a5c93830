//! `dispatchAction`: a maintainer drives a chat. Validation, the host's follow-up actions, one
//! change through the write path, then the echo to every subscriber (held until durable).
//! Rejections go back to the sender only.
//!
//! The session is taken out of the table and reduced in place (copying a long chat for every
//! action would make each action O(chat)); if anything fails after the first reduction, the
//! session is rebuilt from the store and the changes still in flight
//! (`Host::rebuild_session`). Failures are rare; the common path copies nothing.

use ahp::reducers::{apply_action_to_chat, apply_action_to_session, ReduceOutcome};
use ahp_types::actions::{
    ActionEnvelope, ActionOrigin, ChatPendingMessageRemovedAction, ChatTurnCancelledAction,
    ChatTurnStartedAction, PartialChatSummary, SessionChatUpdatedAction, StateAction,
};
use ahp_types::notifications::{PartialSessionSummary, SessionSummaryChangedParams};
use ahp_types::state::{MessageKind, PendingMessageKind};

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::channel::{chat_uri, session_uri, ChannelRef, ROOT};
use crate::connection::{ConnId, OnFail};
use crate::error::{RpcError, STALE, TURN_IN_PROGRESS};
use crate::host::{parse_params, Host};
use crate::limits::ACTION_DEPTH_MAX;
use crate::output::Frame;
use crate::principal::Role;
use crate::receipts::fingerprint;
use crate::session::{turn_cost, SessionEntry, Touched, Which, HOST_TURN_ID_SHAPE};
use crate::store::{ClientRecord, Event, Receipt, Store};
use crate::time::iso8601;
use crate::wire;
use crate::write::{Txn, Undo};

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DispatchParams<'a> {
    channel: String,
    client_seq: u64,
    #[serde(borrow)]
    action: &'a RawValue,
}

/// A change being built on one session, taken out of the host's table while it is built.
pub(crate) struct Tx {
    pub(crate) entry: SessionEntry,
    pub(crate) touched: Touched,
    /// `(channel, envelope JSON)` in seq order; seqs follow `base_seq`.
    pub(crate) events: Vec<(String, String)>,
    base_seq: u64,
    /// Whether a reducer has touched `entry`; if so, aborting must restore it from the store.
    mutated: bool,
    /// Title, summary status and `modifiedAt` before the change, for root notifications.
    summary_before: (String, u32, String),
    /// The chat's `chat_bytes` before the change, so the host-wide total follows it.
    chat_bytes_before: u64,
}

impl Tx {
    pub(crate) fn new(entry: SessionEntry, base_seq: u64) -> Tx {
        let summary_before = (
            entry.session.title.clone(),
            entry.summary_status(),
            entry.modified_at().to_owned(),
        );
        Tx {
            chat_bytes_before: entry.chat_bytes,
            entry,
            touched: Touched::default(),
            events: Vec::new(),
            base_seq,
            mutated: false,
            summary_before,
        }
    }

    /// Reduces `action` into the working copy and records its envelope.
    pub(crate) fn emit(
        &mut self,
        which: Which,
        action: StateAction,
        origin: Option<ActionOrigin>,
    ) -> Result<(), RpcError> {
        let outcome = match which {
            Which::Chat => apply_action_to_chat(&mut self.entry.chat, &action),
            Which::Session => apply_action_to_session(&mut self.entry.session, &action),
            Which::Changeset => {
                ahp::reducers::apply_action_to_changeset(&mut self.entry.changeset, &action)
            }
        };
        match outcome {
            ReduceOutcome::Applied | ReduceOutcome::NoOp => {
                self.mutated = true;
                if let StateAction::ChatTurnStarted(a) = &action {
                    self.entry.turn_started(&a.turn_id, &a.message);
                }
            }
            // Both leave the state as it was.
            ReduceOutcome::Invalid(e) => {
                return Err(RpcError::invalid_params(format!("Invalid AHP action: {e}")))
            }
            ReduceOutcome::OutOfScope => {
                return Err(RpcError::invalid_params(
                    "Invalid AHP action: wrong channel for this action",
                ))
            }
        }
        let channel = match which {
            Which::Chat => {
                self.touched.chat = true;
                chat_uri(&self.entry.id)
            }
            Which::Session => {
                self.touched.session = true;
                session_uri(&self.entry.id)
            }
            Which::Changeset => {
                self.touched.changeset = true;
                crate::channel::changeset_uri(&self.entry.id)
            }
        };
        let envelope = ActionEnvelope {
            channel: channel.clone(),
            action,
            server_seq: self.base_seq + self.events.len() as u64 + 1,
            origin,
            rejection_reason: None,
        };
        let text = serde_json::to_string(&envelope)
            .map_err(|_| RpcError::invalid_params("Invalid AHP action: not serializable"))?;
        self.events.push((channel, text));
        Ok(())
    }

    /// Mirrors the chat's status and `modifiedAt` into the session's chat catalog.
    fn sync_chat(&mut self) -> Result<(), RpcError> {
        let chat = &self.entry.chat;
        let update = SessionChatUpdatedAction {
            chat: chat.resource.clone(),
            changes: PartialChatSummary {
                status: Some(chat.status),
                modified_at: Some(chat.modified_at.clone()),
                ..PartialChatSummary::default()
            },
        };
        self.emit(
            Which::Session,
            StateAction::SessionChatUpdated(update),
            None,
        )
    }
}

fn elapsed_ms(started_at: &str, now_ms: u64) -> i64 {
    let started = started_at
        .parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .unwrap_or(now_ms as i64);
    (now_ms as i64 - started).max(0)
}

impl<S: Store> Host<S> {
    pub(crate) fn dispatch_action(&mut self, conn: ConnId, params: Option<&RawValue>) {
        let Ok(p) = parse_params::<DispatchParams<'_>>(params) else {
            self.stats.notifications_dropped += 1;
            return;
        };
        let Some(client_id) = self.client_id(conn) else {
            return;
        };
        let Ok(principal) = self.principal(conn) else {
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
            r => self
                .sessions
                .contains_key(r.session_id().unwrap_or_default()),
        };
        if readable && !exists {
            // AHP: actions for channels that do not exist are dropped without an echo.
            self.stats.notifications_dropped += 1;
            return;
        }
        let origin = ActionOrigin {
            client_id: client_id.clone(),
            client_seq: p.client_seq as i64,
        };
        let result = if !readable {
            Err(RpcError::forbidden("You don't have access to this channel"))
        } else {
            self.dispatch_checked(&principal.id, principal.role, &p, origin)
        };
        match result {
            Err(e) => self.reject(conn, &p, &client_id, &e),
            // Should the change fail, the sender hears the rejection echo in its place.
            Ok(Some(number)) => {
                let rejected = Rejected::new(&p, &client_id);
                self.conns
                    .hold_marker(conn, number, OnFail::Reject(Box::new(rejected)));
            }
            Ok(None) => {}
        }
    }

    fn dispatch_checked(
        &mut self,
        owner: &str,
        role: Role,
        p: &DispatchParams<'_>,
        origin: ActionOrigin,
    ) -> Result<Option<u64>, RpcError> {
        // Refusals that need nothing from the store come before the receipt lookup, so a
        // client that may not dispatch costs no store read however often it tries. No answer
        // to a permitted client changes: a receipt is committed only for an action that passes
        // all three, on the chat of a session that stays open (sessions are never closed).
        if role != Role::Maintainer {
            return Err(RpcError::forbidden("Only maintainers can do this"));
        }
        // AHP numbers are JSON integers a signed 64-bit reader takes back (`origin.clientSeq`
        // is one); a larger one could be neither echoed faithfully nor stored.
        if i64::try_from(p.client_seq).is_err() {
            return Err(RpcError::invalid_params(format!(
                "clientSeq must be at most {}",
                i64::MAX
            )));
        }
        let id = match ChannelRef::parse(&p.channel) {
            ChannelRef::Chat(id) if self.sessions.get(id).is_some_and(|e| !e.meta.closed) => {
                id.to_owned()
            }
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
        // The receipts committed lately are known without the store: a retry usually follows
        // its original within seconds (a client resending after a reconnect), and answering it
        // from memory means a failing store read cannot turn an applied action's retry into a
        // rejection, which would contradict the echo the client may already have.
        let known = match self.receipts.get(owner, &key) {
            Some(f) => Some(f == fingerprint),
            None => match self.store.receipt(owner, &key) {
                Err(_) => return Err(RpcError::commit_failed()),
                Ok(r) => r.map(|r| r.fingerprint == fingerprint),
            },
        };
        // The same action under the same (clientId, clientSeq): a retry, already applied.
        // A different action under a used clientSeq is a restarted counter, not a retry: the
        // official AHP clients start clientSeq at 1 on every connection. It is applied as a
        // new action and its receipt replaces the old one. (The AXP host refuses it with
        // -32011, which breaks every official client after its first reconnect.)
        if known == Some(true) {
            return Ok(None);
        }
        let action: StateAction = serde_json::from_str(p.action.get())
            .map_err(|e| RpcError::invalid_params(format!("Invalid AHP action: {e}")))?;
        let Some(entry) = self.sessions.remove(&id) else {
            return Err(RpcError::invalid_params(
                "This action must target an open session's chat",
            ));
        };
        let mut tx = Tx::new(entry, self.seq.current());
        let now_ms = self.now.wall_unix_ms;
        let built = self
            .chat_action(&mut tx, action, origin.clone(), now_ms)
            .and_then(|()| tx.sync_chat());
        if let Err(e) = built {
            self.abort_tx(tx);
            return Err(e);
        }
        let last = self
            .bindings
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
            key: key.clone(),
            fingerprint: fingerprint.clone(),
            result: "null".into(),
        };
        if let Err(e) = self.room() {
            self.abort_tx(tx);
            return Err(e);
        }
        Ok(Some(self.commit_tx(tx, vec![receipt], vec![client])))
    }

    /// Validates one maintainer chat action and emits it with the host's follow-ups.
    fn chat_action(
        &mut self,
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
                self.chat_room(tx, turn_cost(&a.turn_id, &a.message))?;
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
                    && queued >= self.config.limits.pending_messages_max as usize
                {
                    return Err(RpcError::limit("Pending message limit reached"));
                }
                // A pending message is only ever started as a turn, with an id the host makes.
                // Refused now if it could not be: the turns' cost never goes down, so a message
                // that does not fit now never will.
                self.chat_room(tx, turn_cost(HOST_TURN_ID_SHAPE, &a.message))?;
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
                self.next_turn(tx, now_ms)
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
                self.next_turn(tx, now_ms)
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
                self.next_turn(tx, now_ms)
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
    fn chat_room(&self, tx: &Tx, cost: u64) -> Result<(), RpcError> {
        let limits = &self.config.limits;
        if tx.entry.chat_bytes + cost > limits.chat_bytes_max {
            return Err(RpcError::limit(
                "Chat size limit reached; continue in a new session",
            ));
        }
        if self.chat_bytes_total_with(tx) + cost > limits.chat_bytes_total_max {
            return Err(RpcError::limit("Host chat storage limit reached"));
        }
        Ok(())
    }

    /// The host's chat total with `tx` applied: the total still counts the chat as it was
    /// before the change.
    fn chat_bytes_total_with(&self, tx: &Tx) -> u64 {
        self.chat_bytes_total - tx.chat_bytes_before + tx.entry.chat_bytes
    }

    /// Starts the next pending message as a turn when the chat is idle.
    fn next_turn(&mut self, tx: &mut Tx, now_ms: u64) -> Result<(), RpcError> {
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
            .chat_room(tx, turn_cost(HOST_TURN_ID_SHAPE, &pending.message))
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
            turn_id: self.uuid(),
            started_at: iso8601(now_ms),
            message: pending.message,
            queued_message_id: (kind == PendingMessageKind::Queued).then_some(pending.id),
            meta: None,
        };
        tx.emit(Which::Chat, StateAction::ChatTurnStarted(started), None)
    }

    /// Issues a session transaction through the write path: applies it to memory at once,
    /// broadcasts its events (held until durable) and tells root subscribers about the
    /// session's new summary. Returns the change number.
    pub(crate) fn commit_tx(
        &mut self,
        mut tx: Tx,
        receipts: Vec<Receipt>,
        clients: Vec<ClientRecord>,
    ) -> u64 {
        let base = self.seq.current();
        assert_eq!(tx.base_seq, base, "transaction built on a stale serverSeq");
        let events: Vec<Event> = std::mem::take(&mut tx.events)
            .into_iter()
            .enumerate()
            .map(|(i, (channel, envelope))| Event {
                seq: base + i as u64 + 1,
                channel,
                envelope,
            })
            .collect();
        let last_seq = base + events.len() as u64;
        // Rewrite the session's states only when enough event bytes have accumulated; the
        // events in between are replayed at load.
        let entry = &mut tx.entry;
        entry.bytes_since_checkpoint += events.iter().map(|e| e.envelope.len()).sum::<usize>();
        let mut records = if entry.checkpoint_due() {
            entry.checkpoint(last_seq)
        } else {
            Vec::new()
        };
        let id = tx.entry.id.clone();
        let mut undo = vec![Undo::Session {
            id: id.clone(),
            created: None,
        }];
        for c in clients {
            records.push(c.write());
            undo.push(Undo::Client(c.client_id.clone()));
            self.bindings.insert(c);
        }
        // Frames for the events, before the events move into the change.
        let frames: Vec<(String, Frame)> = events
            .iter()
            .map(|e| {
                (
                    e.channel.clone(),
                    wire::notification_frame("action", &e.envelope),
                )
            })
            .collect();
        self.chat_bytes_total = self.chat_bytes_total_with(&tx);
        self.sessions.insert(id.clone(), tx.entry);
        let number = self.commit(Txn {
            events,
            receipts,
            records,
            reservation: None,
            undo,
        });
        for (channel, frame) in &frames {
            self.broadcast(channel, frame);
        }
        if tx.touched.session {
            self.summary_changed(&id, Some(tx.summary_before));
        }
        number
    }

    /// Puts a session back after a change that will not be issued. Untouched, it goes back
    /// as it is; touched, it is rebuilt from the store and the changes in flight.
    pub(crate) fn abort_tx(&mut self, tx: Tx) {
        let id = tx.entry.id.clone();
        if !tx.mutated {
            self.sessions.insert(id, tx.entry);
            return;
        }
        // The entry taken out is not in the table: rebuilding accounts from zero.
        self.chat_bytes_total -= tx.chat_bytes_before;
        self.rebuild_session(&id);
    }

    /// `root/sessionSummaryChanged` with the fields that changed, to root subscribers in scope.
    fn summary_changed(&mut self, id: &str, before: Option<(String, u32, String)>) {
        let Some(entry) = self.sessions.get(id) else {
            return;
        };
        let (title, status, modified) = (
            entry.session.title.clone(),
            entry.summary_status(),
            entry.modified_at().to_owned(),
        );
        let mut changes = PartialSessionSummary::default();
        let (t0, s0, m0) = before.unwrap_or_default();
        if title != t0 {
            changes.title = Some(title);
        }
        if status != s0 {
            changes.status = Some(status);
        }
        if modified != m0 {
            changes.modified_at = Some(modified);
        }
        if changes == PartialSessionSummary::default() {
            return;
        }
        let params = SessionSummaryChangedParams {
            channel: ROOT.into(),
            session: session_uri(id),
            changes,
        };
        let Ok(params) = serde_json::to_string(&params) else {
            return;
        };
        let frame = wire::notification_frame("root/sessionSummaryChanged", &params);
        self.notify_root(id, &frame);
    }

    /// Echoes a refused action to its sender only, at the current `serverSeq`, changing nothing.
    fn reject(&mut self, conn: ConnId, p: &DispatchParams<'_>, client_id: &str, e: &RpcError) {
        let frame = Rejected::new(p, client_id).echo(self.seq.current(), e);
        self.reply(conn, frame);
    }
}

/// What a rejection echo needs, kept while a dispatch is in flight so its sender can be told
/// if the change fails.
#[derive(Clone, Debug)]
pub(crate) struct Rejected {
    channel: String,
    /// The action as sent, or `null` when it nests too deeply to echo.
    action: String,
    client_id: String,
    client_seq: u64,
}

impl Rejected {
    fn new(p: &DispatchParams<'_>, client_id: &str) -> Rejected {
        // An action refused for its depth is echoed as `null`: echoed as sent it could make
        // the frame deeper than JSON readers accept.
        let action = if wire::json_depth(p.action.get()) <= ACTION_DEPTH_MAX {
            p.action.get().to_owned()
        } else {
            "null".to_owned()
        };
        Rejected {
            channel: p.channel.clone(),
            action,
            client_id: client_id.to_owned(),
            client_seq: p.client_seq,
        }
    }

    /// The rejection echo at `server_seq`.
    pub(crate) fn echo(&self, server_seq: u64, e: &RpcError) -> Frame {
        let action = serde_json::from_str::<Value>(&self.action).unwrap_or(Value::Null);
        let params = json!({
            "channel": self.channel,
            "action": action,
            "serverSeq": server_seq,
            "origin": { "clientId": self.client_id, "clientSeq": self.client_seq },
            "rejectionReason": e.message,
        });
        wire::notification_frame("action", &params.to_string())
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
