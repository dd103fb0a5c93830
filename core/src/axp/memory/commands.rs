//! The memory commands: `_axp/memoryPropose`, `_axp/memoryReview` (mutations, one change on
//! `axp-memory://` each) and `_axp/memorySearch` (a read). Checks, their order and their codes
//! are the reference's (`src/knowledge.ts`); the bounds on lessons and evidence are this
//! host's.

use serde_json::json;

use crate::ahp::sessions::Sessions;
use crate::ahp::tx::axp_envelope;
use crate::axp::memory::entry::{memory_id, Evidence, MemoryEntry, MemoryStatus};
use crate::axp::memory::params::{
    MemoryProposeParams, MemoryReviewParams, MemorySearchParams, ReviewStatus,
};
use crate::axp::memory::{can_read_evidence, Memory};
use crate::axp::reducer::AxpAction;
use crate::axp::{commit_and_broadcast, contribute, json_text, maintain, session_of, Done, Op};
use crate::channel::{chat_uri, exchange_uri, MEMORY};
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::log::change::Event;
use crate::log::store::Store;
use crate::log::write_path::{Touched, Txn};
use crate::principal::Principal;

impl Memory {
    /// `_axp/memoryPropose`: a lesson drawn from events of the session `p.channel` names.
    pub(crate) fn propose<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        sessions: &Sessions,
        principal: &Principal,
        p: MemoryProposeParams,
        op: &Op,
    ) -> Result<Done, RpcError> {
        let id = session_of(&p.channel)?;
        let entry = sessions
            .get(id)
            .ok_or_else(|| RpcError::not_found("Unknown channel"))?;
        contribute(principal)?;
        if p.from_seq > p.to_seq || p.to_seq > k.server_seq() {
            return Err(RpcError::invalid_params("Invalid memory evidence range"));
        }
        if !has_events(k, id, p.from_seq, p.to_seq)? {
            return Err(RpcError::invalid_params(
                "A lesson needs evidence from this session's own events",
            ));
        }
        let (title, trigger, lesson) = (p.title.trim(), p.trigger.trim(), p.lesson.trim());
        if title.is_empty() || trigger.is_empty() || lesson.is_empty() {
            return Err(RpcError::invalid_params("A lesson's text can't be blank"));
        }
        let scope = sessions.repository();
        let memory_id = memory_id(scope, title, trigger, lesson, p.outcome);
        let prior = self.get(&memory_id);
        if let Some(prior) = prior {
            if !prior
                .evidence
                .iter()
                .all(|e| can_read_evidence(principal, &e.session))
            {
                return Err(RpcError::forbidden(
                    "Adding to this lesson needs access to all of its evidence",
                ));
            }
        }
        let ex = &entry.exchange;
        let evidence = Evidence {
            session: ex.session.clone(),
            from_seq: p.from_seq,
            to_seq: p.to_seq,
            git_head: ex.checkpoint.as_ref().map(|c| c.head_commit.clone()),
        };
        let evidence_max = k.limits().memory_evidence_max as usize;
        let lessons_max = k.limits().memory_lessons_max as usize;
        let lesson = match prior {
            // The same evidence again: the lesson as it is, and no event.
            Some(prior) if prior.evidence.contains(&evidence) => {
                let result = json_text(prior);
                return Ok(receipt_only(k, op, result));
            }
            Some(prior) if prior.evidence.len() >= evidence_max => {
                return Err(RpcError::limit(
                    "This lesson holds as much evidence as it can",
                ))
            }
            // New evidence never promotes a proposal or revives a retired lesson.
            Some(prior) => MemoryEntry {
                revision: prior.revision + 1,
                evidence: [prior.evidence.clone(), vec![evidence]].concat(),
                ..prior.clone()
            },
            None if self.len() >= lessons_max => {
                return Err(RpcError::limit("Repository memory is full"))
            }
            None => MemoryEntry {
                scope: scope.to_owned(),
                title: title.to_owned(),
                trigger: trigger.to_owned(),
                lesson: lesson.to_owned(),
                outcome: p.outcome,
                id: memory_id,
                revision: 1,
                evidence: vec![evidence],
                status: MemoryStatus::Proposed,
                author: principal.id.clone(),
            },
        };
        Ok(self.change(k, lesson, op))
    }

    /// `_axp/memoryReview`: a maintainer accepts or retires the revision it read.
    pub(crate) fn review<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        principal: &Principal,
        p: MemoryReviewParams,
        op: &Op,
    ) -> Result<Done, RpcError> {
        maintain(principal)?;
        let prior = match self.get(&p.memory_id) {
            Some(prior) if prior.revision == p.revision => prior,
            _ => {
                return Err(RpcError::conflict(
                    "The lesson changed; read it again before reviewing",
                ))
            }
        };
        if !prior
            .evidence
            .iter()
            .all(|e| can_read_evidence(principal, &e.session))
        {
            return Err(RpcError::forbidden(
                "Reviewing this lesson needs access to all of its evidence",
            ));
        }
        let lesson = MemoryEntry {
            revision: prior.revision + 1,
            status: match p.status {
                ReviewStatus::Accepted => MemoryStatus::Accepted,
                ReviewStatus::Retired => MemoryStatus::Retired,
            },
            ..prior.clone()
        };
        Ok(self.change(k, lesson, op))
    }

    /// `_axp/memorySearch`: `{items, total}` over this repository's lessons, as `principal`
    /// may see them.
    pub(crate) fn search_command(
        &self,
        sessions: &Sessions,
        principal: &Principal,
        p: &MemorySearchParams,
    ) -> String {
        let limit = usize::try_from(p.limit).unwrap_or(usize::MAX);
        let can_read = |session: &str| can_read_evidence(principal, session);
        let (items, total) = self.search(sessions.repository(), &p.query, limit, &can_read);
        json!({ "items": items, "total": total }).to_string()
    }

    /// Writes `lesson` as one change (its record, `_axp/memoryChanged`, the receipt), applies
    /// it at once and sends the event to subscribers once durable.
    fn change<S: Store>(&mut self, k: &mut Kernel<S>, lesson: MemoryEntry, op: &Op) -> Done {
        let result = json_text(&lesson);
        let seq = k.server_seq() + 1;
        let action = AxpAction::MemoryChanged {
            memory: lesson.clone(),
        };
        let txn = Txn {
            events: vec![Event {
                seq,
                channel: MEMORY.into(),
                envelope: axp_envelope(MEMORY, &action, seq).into(),
            }],
            records: vec![Memory::record(&lesson)],
            receipts: vec![op.receipt(&result)],
            touched: vec![Touched::Memory(lesson.id.clone())],
            ..Txn::default()
        };
        self.upsert(lesson);
        let change = commit_and_broadcast(k, txn);
        Done { change, result }
    }
}

/// A change holding only the receipt of a command that changed nothing (so a retry with other
/// input under its `operationId` is still a conflict).
fn receipt_only<S: Store>(k: &mut Kernel<S>, op: &Op, result: String) -> Done {
    let txn = Txn {
        receipts: vec![op.receipt(&result)],
        ..Txn::default()
    };
    let change = k.commit(txn);
    Done { change, result }
}

/// Whether session `id`'s chat or exchange has an event numbered from `from` through `to`
/// (the reference's `(max(0, from - 1), to]`).
fn has_events<S: Store>(k: &mut Kernel<S>, id: &str, from: u64, to: u64) -> Result<bool, RpcError> {
    let after = from.saturating_sub(1);
    let mut view = k.view();
    for channel in [chat_uri(id), exchange_uri(id)] {
        let first = view.first_event_after(&channel, after).map_err(|e| {
            tracing::warn!(error = %e, "memory evidence read failed");
            RpcError::commit_failed()
        })?;
        if first.is_some_and(|seq| seq <= to) {
            return Ok(true);
        }
    }
    Ok(false)
}
