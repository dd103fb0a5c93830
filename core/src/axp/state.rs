//! The AXP state shapes, typed: the exchange state of `axp-session:/ID` and the executor
//! registry of `axp-executors://`.
//!
//! Field names and nesting follow the reference host's JSON (`src/protocol/types.ts`), so a
//! snapshot here reads the same in its clients. Maps are `BTreeMap`s: their order is the
//! host's, deterministic, never a hasher's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::axp::signature::Signature;
use crate::canonical::hash_object;
use crate::channel::{chat_uri, exchange_uri, session_uri, EXECUTORS};

/// Integer tokens, USD micros (USD × 1,000,000) and turns.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Allowance {
    pub(crate) tokens: u64,
    pub(crate) cost_micros: u64,
    pub(crate) turns: u64,
}

/// An executor's hold on a session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Lease {
    pub(crate) owner: String,
    pub(crate) executor_id: String,
    pub(crate) epoch: u64,
    /// Wall-clock Unix milliseconds.
    pub(crate) expires_at: u64,
    pub(crate) heartbeat_ms: u64,
    pub(crate) grant_id: String,
}

/// What a donor declared about how its limit is enforced (never verified by the host).
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Enforcement {
    Provider,
    Accounting,
}

/// A contributor's budget for one session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Grant {
    pub(crate) id: String,
    pub(crate) owner: String,
    pub(crate) limit: Allowance,
    pub(crate) spent: Allowance,
    pub(crate) revoked: bool,
    pub(crate) enforcement: Enforcement,
}

/// Where a usage figure came from: the executor's report, or the reservation charged in full.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Source {
    Reported,
    Reservation,
}

/// What one turn cost.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Usage {
    pub(crate) input_tokens: u64,
    pub(crate) output_tokens: u64,
    /// A subset of `input_tokens`, never charged twice.
    pub(crate) cache_read_tokens: u64,
    pub(crate) cost_micros: u64,
    pub(crate) source: Source,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cost_source: Option<Source>,
}

/// A turn reserved against a grant, by the epoch that reserved it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Reservation {
    pub(crate) turn_id: String,
    pub(crate) grant_id: String,
    pub(crate) epoch: u64,
    pub(crate) ceiling: Allowance,
    /// Wall-clock Unix milliseconds (the host's clock).
    pub(crate) started_at: u64,
}

/// One settled turn.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UsageEntry {
    pub(crate) turn_id: String,
    pub(crate) grant_id: String,
    pub(crate) usage: Usage,
}

/// The working context: what a resumed executor is told about the turns compaction folded
/// away (`_axp/compact`, `_axp/acceptCompaction`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Context {
    pub(crate) revision: u64,
    pub(crate) through_turn: u64,
    pub(crate) summary: String,
    pub(crate) decisions: Vec<String>,
    pub(crate) active_files: Vec<String>,
    pub(crate) git_head: Option<String>,
    pub(crate) prefix_hash: String,
}

impl Context {
    /// The context of a new session: revision 0, empty, hashed as the reference hashes it
    /// (`hashObject` of every field but `prefixHash`).
    pub(crate) fn initial() -> Context {
        Context::hashed(0, 0, String::new(), Vec::new(), Vec::new(), None)
    }

    /// A context with its `prefixHash`: the reference's `hashObject` of every other field.
    pub(crate) fn hashed(
        revision: u64,
        through_turn: u64,
        summary: String,
        decisions: Vec<String>,
        active_files: Vec<String>,
        git_head: Option<String>,
    ) -> Context {
        let prefix_hash = hash_object(&json!({
            "revision": revision,
            "throughTurn": through_turn,
            "summary": summary,
            "decisions": decisions,
            "activeFiles": active_files,
            "gitHead": git_head,
        }));
        Context {
            revision,
            through_turn,
            summary,
            decisions,
            active_files,
            git_head,
            prefix_hash,
        }
    }
}

/// A reference to a blob of this session, as checkpoints and verifications name it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct BlobRef {
    /// `axp-blob:/<encodeURIComponent(exchange)>/<sha256>`, exactly.
    pub(crate) uri: String,
    pub(crate) sha256: String,
    pub(crate) size: u64,
    pub(crate) media_type: String,
}

/// A Git checkpoint of the session's work: what a review signs and a verification runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Checkpoint {
    pub(crate) base_commit: String,
    pub(crate) head_commit: String,
    pub(crate) branch: String,
    pub(crate) bundle: BlobRef,
    pub(crate) patch: BlobRef,
    /// Wall-clock Unix milliseconds: the host's clock when it was recorded (the executor's
    /// value is replaced).
    pub(crate) created_at: u64,
}

/// What a review signs: the checkpoint, the trace that led to it and the model that made it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Manifest {
    /// Always 1.
    pub(crate) version: u64,
    pub(crate) repository: String,
    /// `ahp-session:/ID`.
    pub(crate) session: String,
    pub(crate) base_commit: String,
    pub(crate) head_commit: String,
    pub(crate) model: String,
    pub(crate) prompt_hash: String,
    /// `hashObject` of the session's envelopes on its chat, exchange and session channels
    /// with `0 < serverSeq <= traceThroughSeq`.
    pub(crate) trace_hash: String,
    pub(crate) trace_through_seq: u64,
    /// `hashObject` of the checkpoint.
    pub(crate) checkpoint_digest: String,
}

/// A checkpoint's signed review: the contributor's signature, then an independent
/// maintainer's.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Review {
    pub(crate) manifest: Manifest,
    pub(crate) contributor: Signature,
    pub(crate) maintainer: Option<Signature>,
}

/// A verifier's run of a command on the checkpoint's head.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Verification {
    pub(crate) head_commit: String,
    /// The verifier's principal id.
    pub(crate) verifier: String,
    pub(crate) command: Vec<String>,
    pub(crate) exit_code: i64,
    /// The command's output, a blob of this session.
    pub(crate) output: BlobRef,
    /// Wall-clock Unix milliseconds (the host's clock).
    pub(crate) verified_at: u64,
}

/// The global sequence range a compaction proposal summarizes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SeqRange {
    pub(crate) from_seq: u64,
    pub(crate) to_seq: u64,
}

/// A proposed next working context, waiting for a maintainer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CompactionProposal {
    /// The `operationId` that proposed it.
    pub(crate) id: String,
    pub(crate) author: String,
    /// The context revision it replaces (compare-and-set on acceptance).
    pub(crate) expected_revision: u64,
    pub(crate) context: Context,
    pub(crate) evidence: SeqRange,
}

/// One discussion entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct DiscussionComment {
    /// The `operationId` that posted it.
    pub(crate) id: String,
    pub(crate) author: String,
    pub(crate) body: String,
    /// Wall-clock Unix milliseconds.
    pub(crate) created_at: u64,
    pub(crate) checkpoint: Option<String>,
    pub(crate) path: Option<String>,
}

/// Whether a session may be claimed and prompted.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Status {
    Open,
    Orphaned,
    Closed,
}

/// The state of `axp-session:/ID`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExchangeState {
    pub(crate) resource: String,
    pub(crate) session: String,
    pub(crate) chat: String,
    pub(crate) repository: String,
    pub(crate) task: String,
    pub(crate) status: Status,
    /// Advanced by every claim, never by anything else.
    pub(crate) epoch: u64,
    pub(crate) lease: Option<Lease>,
    pub(crate) grants: BTreeMap<String, Grant>,
    pub(crate) reservation: Option<Reservation>,
    pub(crate) usage: Vec<UsageEntry>,
    pub(crate) checkpoint: Option<Checkpoint>,
    pub(crate) context: Context,
    pub(crate) compaction: Option<CompactionProposal>,
    pub(crate) review: Option<Review>,
    pub(crate) verification: Option<Verification>,
    /// Absent until the first comment, as the reference writes it (clients render a missing
    /// key as an empty thread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) discussion: Option<Vec<DiscussionComment>>,
}

impl ExchangeState {
    /// The exchange of a new session `id`: open, epoch 0, nothing granted or leased.
    pub(crate) fn initial(id: &str, repository: &str, task: &str) -> ExchangeState {
        ExchangeState {
            resource: exchange_uri(id),
            session: session_uri(id),
            chat: chat_uri(id),
            repository: repository.to_owned(),
            task: task.to_owned(),
            status: Status::Open,
            epoch: 0,
            lease: None,
            grants: BTreeMap::new(),
            reservation: None,
            usage: Vec::new(),
            checkpoint: None,
            context: Context::initial(),
            compaction: None,
            review: None,
            verification: None,
            discussion: None,
        }
    }

    /// Comments posted so far.
    pub(crate) fn discussion_len(&self) -> usize {
        self.discussion.as_ref().map_or(0, Vec::len)
    }
}

/// Where an executor runs.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Placement {
    Satellite,
    Hosted,
}

/// One entry of `axp-executors://`: the value of a `Table::Executor` record, as JSON.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ExecutorInfo {
    pub(crate) id: String,
    pub(crate) owner: String,
    pub(crate) name: String,
    pub(crate) placement: Placement,
    pub(crate) capabilities: Vec<String>,
    /// Wall-clock Unix milliseconds.
    pub(crate) expires_at: u64,
    pub(crate) online: bool,
}

/// The state of `axp-executors://` built from the registry's entries.
pub(crate) fn registry_json<'a>(entries: impl Iterator<Item = &'a ExecutorInfo>) -> Value {
    let entries: serde_json::Map<String, Value> = entries
        .map(|e| (e.id.clone(), serde_json::to_value(e).unwrap_or(Value::Null)))
        .collect();
    json!({ "resource": EXECUTORS, "entries": entries })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_exchange_reads_as_the_reference_writes_it() {
        let s = ExchangeState::initial("s1", "repo", "task");
        let v = serde_json::to_value(&s).expect("json");
        assert_eq!(
            v,
            json!({
                "resource": "axp-session:/s1",
                "session": "ahp-session:/s1",
                "chat": "ahp-chat:/s1",
                "repository": "repo",
                "task": "task",
                "status": "open",
                "epoch": 0,
                "lease": null,
                "grants": {},
                "reservation": null,
                "usage": [],
                "checkpoint": null,
                "context": {
                    "revision": 0, "throughTurn": 0, "summary": "", "decisions": [],
                    "activeFiles": [], "gitHead": null,
                    "prefixHash": s.context.prefix_hash,
                },
                "compaction": null,
                "review": null,
                "verification": null,
            })
        );
        let back: ExchangeState = serde_json::from_value(v).expect("back");
        assert_eq!(back, s);
        assert_eq!(s.context.prefix_hash.len(), 64);
    }

    #[test]
    fn usage_spells_cost_source_only_when_known() {
        let u = Usage {
            input_tokens: 1,
            output_tokens: 2,
            cache_read_tokens: 0,
            cost_micros: 3,
            source: Source::Reported,
            cost_source: None,
        };
        assert!(!serde_json::to_string(&u)
            .expect("json")
            .contains("costSource"));
    }
}
