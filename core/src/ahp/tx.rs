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

use crate::ahp::session::{SessionChannel, SessionEntry, Touched};
use crate::ahp::sessions::{Sessions, SummaryBefore};
use crate::axp::reducer::AxpAction;
use crate::channel::{changeset_uri, chat_uri, session_uri};
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::log::change::Event;
use crate::log::store::Store;
use crate::log::write_path::{self, Txn};
use crate::net::jsonrpc;

pub(crate) struct Tx {
    pub(crate) entry: Box<SessionEntry>,
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
    pub(crate) fn new(entry: Box<SessionEntry>, base_seq: u64) -> Tx {
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
        which: SessionChannel,
        action: StateAction,
        origin: Option<ActionOrigin>,
    ) -> Result<(), RpcError> {
        let outcome = match which {
            SessionChannel::Chat => apply_action_to_chat(&mut self.entry.chat, &action),
            SessionChannel::Session => apply_action_to_session(&mut self.entry.session, &action),
            SessionChannel::Changeset => {
                apply_action_to_changeset(&mut self.entry.changeset, &action)
            }
            SessionChannel::Exchange => {
                return Err(RpcError::invalid_params(
                    "Invalid AHP action: wrong channel for this action",
                ))
            }
        };
        match outcome {
            ReduceOutcome::Applied | ReduceOutcome::NoOp => {
                self.mutated = true;
                if which == SessionChannel::Chat {
                    self.entry.charge_chat_action(&action);
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
            SessionChannel::Chat => {
                self.touched.chat = true;
                chat_uri(&self.entry.id)
            }
            SessionChannel::Session => {
                self.touched.session = true;
                session_uri(&self.entry.id)
            }
            SessionChannel::Changeset => {
                self.touched.changeset = true;
                changeset_uri(&self.entry.id)
            }
            // Refused above.
            SessionChannel::Exchange => return Ok(()),
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

    /// Reduces an AXP action into the session's exchange and records its envelope.
    pub(crate) fn emit_axp(&mut self, action: AxpAction) {
        self.entry.apply_exchange(&action);
        self.mutated = true;
        self.touched.exchange = true;
        let channel = crate::channel::exchange_uri(&self.entry.id);
        let envelope = axp_envelope(&channel, &action, self.next_seq());
        self.push_event(channel, envelope);
    }

    /// Records the envelope of an action on a channel outside this session (the executor
    /// registry), numbered in emission order with the session's own. The caller applies it
    /// to the state that channel's owner keeps.
    pub(crate) fn emit_elsewhere(&mut self, channel: &str, action: &AxpAction) {
        let envelope = axp_envelope(channel, action, self.next_seq());
        self.push_event(channel.to_owned(), envelope);
    }

    /// The number the next event gets.
    pub(crate) fn next_seq(&self) -> u64 {
        self.base_seq + self.events.len() as u64 + 1
    }

    fn push_event(&mut self, channel: String, envelope: String) {
        let seq = self.next_seq();
        self.events.push(Event {
            seq,
            channel: channel.into(),
            envelope: envelope.into(),
        });
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
            SessionChannel::Session,
            StateAction::SessionChatUpdated(update),
            None,
        )
    }

    /// The host's chat total with this change applied.
    pub(crate) fn chat_bytes_total_with(&self, sessions: &Sessions) -> u64 {
        sessions.chat_bytes_total() - self.chat_bytes_before + self.entry.chat_bytes
    }
}

/// The envelope of an AXP action: `{channel, action, serverSeq}`, in that order (the order
/// `ActionEnvelope` spells, and the one a load's replay recognises exchange envelopes by).
pub(crate) fn axp_envelope(channel: &str, action: &AxpAction, seq: u64) -> String {
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Envelope<'a> {
        channel: &'a str,
        action: &'a AxpAction,
        server_seq: u64,
    }
    // Strings, numbers and typed structs with string keys: serializing cannot fail.
    serde_json::to_string(&Envelope {
        channel,
        action,
        server_seq: seq,
    })
    .unwrap_or_default()
}

impl Sessions {
    /// Takes session `id` out of the table to build a change on it.
    pub(crate) fn begin<S: Store>(&mut self, k: &Kernel<S>, id: &str) -> Option<Tx> {
        self.take(id).map(|entry| Tx::new(entry, k.server_seq()))
    }

    /// Takes session `id` out of the table to build a change on it whose events follow
    /// `base_seq` (the events of a change built before it, issued together).
    pub(crate) fn begin_at(&mut self, id: &str, base_seq: u64) -> Option<Tx> {
        self.take(id).map(|entry| Tx::new(entry, base_seq))
    }

    /// Issues `tx` with what `extra` adds (receipts, other records, other touched state):
    /// checkpoints the session if due, puts it back, and sends its events (once durable) to
    /// every subscriber and its summary change to root subscribers. Returns the change number.
    /// The caller checked `Kernel::room` before building.
    pub(crate) fn commit_tx<S: Store>(&mut self, k: &mut Kernel<S>, tx: Tx, extra: Txn) -> u64 {
        self.commit_many(k, extra, vec![tx])
    }

    /// Issues one change holding `head` (its events numbered first, from `k.server_seq() + 1`)
    /// and then each of `txs`, each built on the numbers before it (`begin_at`).
    pub(crate) fn commit_many<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        head: Txn,
        txs: Vec<Tx>,
    ) -> u64 {
        let mut events = head.events;
        let mut records = head.records;
        let mut touched = head.touched;
        let mut sealed = Vec::with_capacity(txs.len());
        for mut tx in txs {
            assert_eq!(
                tx.base_seq,
                k.server_seq() + events.len() as u64,
                "session {} built on a stale serverSeq",
                tx.entry.id
            );
            let own = std::mem::take(&mut tx.events);
            let last_seq = own.last().map_or(tx.base_seq, |e| e.seq);
            // Rewrite the session's states only once enough event bytes have accumulated;
            // the events in between are replayed at load.
            let entry = &mut tx.entry;
            entry.bytes_since_checkpoint += own.iter().map(|e| e.envelope.len()).sum::<usize>();
            if entry.checkpoint_due() {
                records.extend(entry.checkpoint(last_seq));
            }
            touched.push(write_path::Touched::Session(entry.id.clone()));
            events.extend(own);
            sealed.push(tx);
        }
        let frames: Vec<(std::sync::Arc<str>, crate::Frame)> = events
            .iter()
            .map(|e| {
                (
                    e.channel.clone(),
                    jsonrpc::notification_frame("action", &e.envelope),
                )
            })
            .collect();
        let number = k.commit(Txn {
            events,
            receipts: head.receipts,
            records,
            reservation: head.reservation,
            touched,
        });
        let mut summaries = Vec::new();
        for mut tx in sealed {
            let id = tx.entry.id.clone();
            if tx.touched.session {
                summaries.push((id, std::mem::take(&mut tx.summary_before)));
            }
            self.put(tx.entry, tx.chat_bytes_before);
        }
        for (channel, frame) in frames {
            k.broadcast(&channel, &frame, number, None);
        }
        for (id, before) in summaries {
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
