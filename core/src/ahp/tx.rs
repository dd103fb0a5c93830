//! A change built on one session: reduce in place, then issue, or abandon.
//!
//! The session is taken out of the table and reduced in place with the official reducers
//! (copying a long chat for every action would make each action O(chat)). Its events are
//! numbered as they are emitted, following the host's current `serverSeq`. `Sessions::commit_tx`
//! issues the change through the kernel's one write path and puts the session back; its events
//! reach subscribers once the change is durable. If anything fails after the first reduction,
//! `Sessions::abort_tx` rebuilds the session as the store and the changes in flight have it.
//! Failures are rare; the common path copies nothing.

use ahp::reducers::{
    apply_action_to_changeset, apply_action_to_chat, apply_action_to_session, ReduceOutcome,
};
use ahp_types::actions::{
    ActionEnvelope, ActionOrigin, PartialChatSummary, SessionChatUpdatedAction, StateAction,
};

use crate::ahp::session::{SessionEntry, Touched, Which};
use crate::ahp::sessions::{Sessions, SummaryBefore};
use crate::channel::{changeset_uri, chat_uri, session_uri};
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::log::change::Event;
use crate::log::store::Store;
use crate::log::write_path::{self, Txn};
use crate::net::wire;

pub(crate) struct Tx {
    pub(crate) entry: SessionEntry,
    pub(crate) touched: Touched,
    /// Envelopes in `serverSeq` order, numbered from `base_seq + 1`.
    events: Vec<Event>,
    base_seq: u64,
    /// Whether a reducer has touched `entry`; if so, abandoning must rebuild it.
    mutated: bool,
    summary_before: SummaryBefore,
    /// What the table counted for this chat when it was taken out.
    pub(crate) chat_bytes_before: u64,
}

impl Tx {
    /// Starts a change on `entry`, whose events follow `base_seq`.
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

    /// Reduces `action` into the session and records its envelope.
    pub(crate) fn emit(
        &mut self,
        which: Which,
        action: StateAction,
        origin: Option<ActionOrigin>,
    ) -> Result<(), RpcError> {
        let outcome = match which {
            Which::Chat => apply_action_to_chat(&mut self.entry.chat, &action),
            Which::Session => apply_action_to_session(&mut self.entry.session, &action),
            Which::Changeset => apply_action_to_changeset(&mut self.entry.changeset, &action),
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
                changeset_uri(&self.entry.id)
            }
        };
        let seq = self.base_seq + self.events.len() as u64 + 1;
        let envelope = ActionEnvelope {
            channel: channel.clone(),
            action,
            server_seq: seq,
            origin,
            rejection_reason: None,
        };
        let text = serde_json::to_string(&envelope)
            .map_err(|_| RpcError::invalid_params("Invalid AHP action: not serializable"))?;
        self.events.push(Event {
            seq,
            channel: channel.into(),
            envelope: text.into(),
        });
        Ok(())
    }

    /// Mirrors the chat's status and `modifiedAt` into the session's chat catalog.
    pub(crate) fn sync_chat(&mut self) -> Result<(), RpcError> {
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

    /// The host's chat total with this change applied.
    pub(crate) fn chat_bytes_total_with(&self, sessions: &Sessions) -> u64 {
        sessions.chat_bytes_total() - self.chat_bytes_before + self.entry.chat_bytes
    }
}

impl Sessions {
    /// Takes session `id` out of the table to build a change on it.
    pub(crate) fn begin<S: Store>(&mut self, k: &Kernel<S>, id: &str) -> Option<Tx> {
        self.take(id).map(|entry| Tx::new(entry, k.server_seq()))
    }

    /// Issues `tx` with what `extra` adds (receipts, other records, other touched state):
    /// checkpoints the session if due, puts it back, and sends its events (once durable) to
    /// every subscriber and its summary change to root subscribers. Returns the change number.
    /// The caller checked `Kernel::room` before building.
    pub(crate) fn commit_tx<S: Store>(&mut self, k: &mut Kernel<S>, mut tx: Tx, extra: Txn) -> u64 {
        assert_eq!(
            tx.base_seq,
            k.server_seq(),
            "session {} built on a stale serverSeq",
            tx.entry.id
        );
        let events = std::mem::take(&mut tx.events);
        let last_seq = events.last().map_or(tx.base_seq, |e| e.seq);
        // Rewrite the session's states only once enough event bytes have accumulated; the
        // events in between are replayed at load.
        let entry = &mut tx.entry;
        entry.bytes_since_checkpoint += events.iter().map(|e| e.envelope.len()).sum::<usize>();
        let mut records = if entry.checkpoint_due() {
            entry.checkpoint(last_seq)
        } else {
            Vec::new()
        };
        records.extend(extra.records);
        let mut touched = extra.touched;
        touched.push(write_path::Touched::Session(entry.id.clone()));
        let frames: Vec<(std::sync::Arc<str>, crate::Frame)> = events
            .iter()
            .map(|e| {
                (
                    e.channel.clone(),
                    wire::notification_frame("action", &e.envelope),
                )
            })
            .collect();
        let number = k.commit(Txn {
            events,
            receipts: extra.receipts,
            records,
            reservation: extra.reservation,
            touched,
        });
        let id = tx.entry.id.clone();
        let session_touched = tx.touched.session;
        let before = std::mem::take(&mut tx.summary_before);
        self.put(tx.entry, tx.chat_bytes_before);
        for (channel, frame) in frames {
            k.broadcast(&channel, &frame, number, None);
        }
        if session_touched {
            self.summary_changed(k, &id, before, number);
        }
        number
    }

    /// Puts a session back after a change that will not be issued. Untouched, it goes back as
    /// it is; reduced, it is rebuilt as the store and the changes in flight have it.
    pub(crate) fn abort_tx<S: Store>(&mut self, k: &mut Kernel<S>, tx: Tx) {
        if !tx.mutated {
            self.put(tx.entry, tx.chat_bytes_before);
            return;
        }
        let id = tx.entry.id.clone();
        // The table no longer counts this chat; `rebuild` counts what it restores.
        self.put(tx.entry, tx.chat_bytes_before);
        self.rebuild(k, &id);
    }
}
