//! The AXP actions and their pure reducers: what clients apply to their copy of
//! `axp-session:/ID` and `axp-executors://`, and what the host applies to its own. The
//! `axp-memory://` reducer (an upsert by id) is `Memory::upsert`, which indexes as it applies.
//!
//! Reducers never validate: authority and transition validity belong to the host, which
//! checks them before emitting. An action of a type a reducer does not know leaves the state
//! as it was.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::axp::memory::entry::MemoryEntry;
use crate::axp::state::{
    Checkpoint, CompactionProposal, Context, DiscussionComment, ExchangeState, ExecutorInfo, Grant,
    Lease, Reservation, Review, Status, Usage, UsageEntry, Verification,
};

/// Every AXP action, tagged by `type` as the wire spells it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type")]
pub(crate) enum AxpAction {
    #[serde(rename = "_axp/leaseChanged")]
    LeaseChanged {
        lease: Option<Lease>,
        epoch: u64,
        status: Status,
    },
    #[serde(rename = "_axp/grantChanged")]
    GrantChanged { grant: Grant },
    #[serde(rename = "_axp/reserved")]
    Reserved { reservation: Reservation },
    #[serde(rename = "_axp/settled", rename_all = "camelCase")]
    Settled {
        turn_id: String,
        grant: Grant,
        usage: Usage,
    },
    #[serde(rename = "_axp/commentAdded")]
    CommentAdded { comment: DiscussionComment },
    #[serde(rename = "_axp/checkpointChanged")]
    CheckpointChanged { checkpoint: Checkpoint },
    #[serde(rename = "_axp/compactionProposed")]
    CompactionProposed { proposal: CompactionProposal },
    #[serde(rename = "_axp/contextChanged")]
    ContextChanged { context: Context },
    #[serde(rename = "_axp/reviewChanged")]
    ReviewChanged { review: Review },
    #[serde(rename = "_axp/verificationChanged")]
    VerificationChanged { verification: Verification },
    #[serde(rename = "_axp/executorChanged")]
    ExecutorChanged { executor: ExecutorInfo },
    #[serde(rename = "_axp/memoryChanged")]
    MemoryChanged { memory: MemoryEntry },
    /// Any other type: reducers leave the state unchanged.
    #[serde(other)]
    Unknown,
}

impl AxpAction {
    /// Every type this host emits or applies, as the wire spells it (for tests and schemas).
    #[cfg(test)]
    pub(crate) const TYPES: [&'static str; 12] = [
        "_axp/leaseChanged",
        "_axp/grantChanged",
        "_axp/reserved",
        "_axp/settled",
        "_axp/commentAdded",
        "_axp/checkpointChanged",
        "_axp/compactionProposed",
        "_axp/contextChanged",
        "_axp/reviewChanged",
        "_axp/verificationChanged",
        "_axp/executorChanged",
        "_axp/memoryChanged",
    ];
}

/// Applies `action` to an exchange. Returns whether it is an exchange action (the others,
/// executor changes and unknown types, leave it as it was).
pub(crate) fn reduce_exchange(state: &mut ExchangeState, action: &AxpAction) -> bool {
    match action {
        AxpAction::LeaseChanged {
            lease,
            epoch,
            status,
        } => {
            state.lease = lease.clone();
            state.epoch = *epoch;
            state.status = *status;
        }
        AxpAction::GrantChanged { grant } => {
            state.grants.insert(grant.id.clone(), grant.clone());
        }
        AxpAction::Reserved { reservation } => state.reservation = Some(reservation.clone()),
        AxpAction::Settled {
            turn_id,
            grant,
            usage,
        } => {
            state.reservation = None;
            state.grants.insert(grant.id.clone(), grant.clone());
            state.usage.push(UsageEntry {
                turn_id: turn_id.clone(),
                grant_id: grant.id.clone(),
                usage: usage.clone(),
            });
        }
        AxpAction::CommentAdded { comment } => state
            .discussion
            .get_or_insert_with(Vec::new)
            .push(comment.clone()),
        AxpAction::CheckpointChanged { checkpoint } => {
            // A new checkpoint invalidates the review and verification of the old one.
            state.checkpoint = Some(checkpoint.clone());
            state.review = None;
            state.verification = None;
        }
        AxpAction::CompactionProposed { proposal } => state.compaction = Some(proposal.clone()),
        AxpAction::ContextChanged { context } => {
            state.context = context.clone();
            state.compaction = None;
        }
        AxpAction::ReviewChanged { review } => state.review = Some(review.clone()),
        AxpAction::VerificationChanged { verification } => {
            state.verification = Some(verification.clone())
        }
        AxpAction::ExecutorChanged { .. }
        | AxpAction::MemoryChanged { .. }
        | AxpAction::Unknown => return false,
    }
    true
}

/// Applies `action` to the executor registry (an upsert by id). Returns whether it applied.
pub(crate) fn reduce_executors(
    entries: &mut BTreeMap<String, ExecutorInfo>,
    action: &AxpAction,
) -> bool {
    match action {
        AxpAction::ExecutorChanged { executor } => {
            entries.insert(executor.id.clone(), executor.clone());
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axp::state::{BlobRef, SeqRange};
    use serde_json::json;

    #[test]
    fn an_unknown_type_changes_nothing() {
        let a: AxpAction =
            serde_json::from_value(json!({"type": "_axp/frobnicated", "x": 1})).expect("parse");
        assert_eq!(a, AxpAction::Unknown);
        let mut s = ExchangeState::initial("s", "r", "t");
        let before = s.clone();
        assert!(!reduce_exchange(&mut s, &a));
        assert_eq!(s, before);
        let mut reg = BTreeMap::new();
        assert!(!reduce_executors(&mut reg, &a));
        assert!(reg.is_empty());
    }

    #[test]
    fn actions_spell_their_type_first() {
        let a = AxpAction::Reserved {
            reservation: Reservation {
                turn_id: "t".into(),
                grant_id: "g".into(),
                epoch: 1,
                ceiling: Default::default(),
                started_at: 5,
            },
        };
        let text = serde_json::to_string(&a).expect("json");
        assert!(text.starts_with(r#"{"type":"_axp/reserved","reservation":{"turnId":"t""#));
    }

    fn blob(n: char) -> BlobRef {
        BlobRef {
            uri: format!("axp-blob:/x/{}", n.to_string().repeat(64)),
            sha256: n.to_string().repeat(64),
            size: 1,
            media_type: "text/plain".into(),
        }
    }

    #[test]
    fn a_checkpoint_clears_the_review_and_a_context_the_compaction() {
        let mut s = ExchangeState::initial("s", "r", "t");
        let sig = json!({"publicKey": "k", "signature": "s"});
        let review = json!({"manifest": {"version": 1, "repository": "r",
            "session": "ahp-session:/s", "baseCommit": "a", "headCommit": "b", "model": "m",
            "promptHash": "p", "traceHash": "t", "traceThroughSeq": 1, "checkpointDigest": "c"},
            "contributor": sig, "maintainer": null});
        s.review = Some(serde_json::from_value(review).expect("review"));
        let verification = json!({"headCommit": "b", "verifier": "v", "command": ["x"],
            "exitCode": 0, "output": blob('e'), "verifiedAt": 1});
        s.verification = Some(serde_json::from_value(verification).expect("verification"));
        let proposal = CompactionProposal {
            id: "p".into(),
            author: "a".into(),
            expected_revision: 0,
            context: Context::initial(),
            evidence: SeqRange {
                from_seq: 0,
                to_seq: 1,
            },
        };
        s.compaction = Some(proposal.clone());
        let checkpoint = Checkpoint {
            base_commit: "a".repeat(40),
            head_commit: "b".repeat(40),
            branch: "main".into(),
            bundle: blob('c'),
            patch: blob('d'),
            created_at: 1,
        };
        reduce_exchange(&mut s, &AxpAction::CheckpointChanged { checkpoint });
        assert_eq!((s.review.is_none(), s.verification.is_none()), (true, true));
        // A pending compaction survives a new checkpoint (acceptance checks the head).
        assert_eq!(s.compaction, Some(proposal));
        reduce_exchange(
            &mut s,
            &AxpAction::ContextChanged {
                context: Context::initial(),
            },
        );
        assert!(s.compaction.is_none());
    }
}
