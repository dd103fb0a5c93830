//! Strict params of every `_axp/*` command, as the reference's schemas define them: unknown
//! keys, missing required keys, wrong types and values out of range are all `-32602`, before
//! anything else is looked at (a mutation without `operationId` on a channel out of scope is
//! `-32602`, not `-32009`). String lengths count UTF-16 code units, as JavaScript does.
//!
//! Each struct serializes back to the params as the reference's parser returns them (a trimmed
//! comment body, absent optional keys left out), which is what a receipt fingerprints.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use crate::axp::memory::params::{
    check_propose, check_review, check_search, MemoryProposeParams, MemoryReviewParams,
    MemorySearchParams,
};
use crate::axp::review::{read_approve, read_review, ApproveReviewParams, ReviewParams};
use crate::axp::state::{Allowance, BlobRef, Checkpoint, Enforcement, Placement, Usage};
use crate::axp::verification::{read_verify, VerifyParams};
use crate::axp::Method;
use crate::channel::valid_id;
use crate::error::RpcError;

/// `Number.MAX_SAFE_INTEGER`: the largest `count`.
pub(crate) const COUNT_MAX: u64 = (1 << 53) - 1;
/// Longest channel URI, in UTF-16 code units.
const CHANNEL_MAX: usize = 256;
/// Lease and registration durations, in milliseconds.
pub(crate) const DURATION_MS_MIN: u64 = 3_000;
pub(crate) const DURATION_MS_MAX: u64 = 300_000;
/// Most actions one `_axp/emit` carries.
pub(crate) const EMIT_ACTIONS_MAX: usize = 64;
/// Longest `_axp/blobPut` data, in base64 characters (the reference's bound; the blob size
/// limit applies to the decoded bytes).
pub(crate) const BLOB_DATA_CHARS_MAX: usize = 24_000_000;

/// Most files one `_axp/checkpoint` lists.
pub(crate) const CHECKPOINT_FILES_MAX: usize = 2_000;
/// `_axp/context`'s `maxChars`: its range and default, in UTF-16 code units.
pub(crate) const CONTEXT_CHARS_MIN: u64 = 1_024;
pub(crate) const CONTEXT_CHARS_MAX: u64 = 200_000;
pub(crate) const CONTEXT_CHARS_DEFAULT: u64 = 64_000;

/// A key that must be present even when it is `null` (serde takes a missing `Option` as
/// `None` unless told otherwise).
fn nullable<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    Option::<T>::deserialize(d)
}

/// The params of one command, typed.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Params {
    Dispatch(DispatchParams),
    Comment(CommentParams),
    Register(RegisterParams),
    Grant(GrantParams),
    Revoke(RevokeParams),
    Claim(ClaimParams),
    Fenced(FencedParams),
    Close(CloseParams),
    Reserve(ReserveParams),
    Settle(SettleParams),
    Emit(EmitParams),
    Export(ExportParams),
    BlobPut(BlobPutParams),
    BlobGet(BlobGetParams),
    Checkpoint(CheckpointParams),
    Compact(CompactParams),
    AcceptCompaction(AcceptCompactionParams),
    Context(ContextParams),
    Review(ReviewParams),
    ApproveReview(ApproveReviewParams),
    Verify(VerifyParams),
    MemoryPropose(MemoryProposeParams),
    MemoryReview(MemoryReviewParams),
    MemorySearch(MemorySearchParams),
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct DispatchParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    /// Any JSON (`z.unknown()`): a missing action is `null`, refused as an invalid action.
    #[serde(default)]
    pub(crate) action: Value,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CommentParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) body: String,
    #[serde(deserialize_with = "nullable")]
    pub(crate) checkpoint: Option<String>,
    #[serde(deserialize_with = "nullable")]
    pub(crate) path: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RegisterParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) executor_id: String,
    pub(crate) name: String,
    pub(crate) placement: Placement,
    pub(crate) capabilities: Vec<String>,
    pub(crate) ttl_ms: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct GrantParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) grant_id: String,
    pub(crate) limit: Allowance,
    pub(crate) enforcement: Enforcement,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RevokeParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) grant_id: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ClaimParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) executor_id: String,
    pub(crate) grant_id: String,
    pub(crate) lease_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) resume_epoch: Option<u64>,
}

/// `_axp/renew` and `_axp/release`.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct FencedParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) epoch: u64,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CloseParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ReserveParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) epoch: u64,
    pub(crate) turn_id: String,
    pub(crate) ceiling: Allowance,
}

/// How a turn ended, as its executor reports it.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Outcome {
    Complete,
    Cancelled,
    Error,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct SettleParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) epoch: u64,
    pub(crate) turn_id: String,
    #[serde(deserialize_with = "nullable")]
    pub(crate) usage: Option<Usage>,
    pub(crate) outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) error: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct EmitParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) epoch: u64,
    pub(crate) actions: Vec<Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ExportParams {
    pub(crate) channel: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct BlobPutParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) data: String,
    pub(crate) media_type: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct BlobGetParams {
    pub(crate) channel: String,
    pub(crate) digest: String,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CheckpointParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) epoch: u64,
    pub(crate) checkpoint: Checkpoint,
    pub(crate) files: Vec<Value>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct CompactParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) expected_revision: u64,
    pub(crate) through_turn: u64,
    /// Stored as sent (untrimmed), as the reference stores it.
    pub(crate) summary: String,
    pub(crate) decisions: Vec<String>,
    pub(crate) active_files: Vec<String>,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct AcceptCompactionParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) proposal_id: String,
}

fn default_max_chars() -> u64 {
    CONTEXT_CHARS_DEFAULT
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ContextParams {
    pub(crate) channel: String,
    #[serde(default = "default_max_chars")]
    pub(crate) max_chars: u64,
}

/// Length as JavaScript counts it (UTF-16 code units).
pub(crate) fn js_len(s: &str) -> usize {
    s.encode_utf16().count()
}

/// Whether `s` is a SHA-256 digest: 64 lowercase hex digits.
pub(crate) fn valid_digest(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Whether `s` is a git object name: 40 or 64 lowercase hex digits.
pub(crate) fn valid_sha(s: &str) -> bool {
    (s.len() == 40 || s.len() == 64) && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn invalid(what: &str) -> RpcError {
    RpcError::invalid_params(format!("Invalid parameters: {what}"))
}

/// Checks that bind every command: `channel` and, for mutations, `operationId`.
pub(crate) struct Check(Vec<String>);

impl Check {
    fn new() -> Check {
        Check(Vec::new())
    }
    pub(crate) fn that(&mut self, ok: bool, what: &str) {
        if !ok {
            self.0.push(what.to_owned());
        }
    }
    fn channel(&mut self, channel: &str) {
        self.that(js_len(channel) <= CHANNEL_MAX, "channel is too long");
    }
    fn id(&mut self, id: &str, field: &str) {
        self.that(valid_id(id), &format!("{field} is not a valid id"));
    }
    pub(crate) fn count(&mut self, n: u64, field: &str) {
        self.that(n <= COUNT_MAX, &format!("{field} is above 2^53-1"));
    }
    fn allowance(&mut self, a: &Allowance, field: &str) {
        self.count(a.tokens, &format!("{field}.tokens"));
        self.count(a.cost_micros, &format!("{field}.costMicros"));
        self.count(a.turns, &format!("{field}.turns"));
    }
    fn duration(&mut self, ms: u64, field: &str) {
        self.that(
            (DURATION_MS_MIN..=DURATION_MS_MAX).contains(&ms),
            &format!("{field} must be an integer from {DURATION_MS_MIN} to {DURATION_MS_MAX}"),
        );
    }
    fn max_len(&mut self, s: &str, max: usize, field: &str) {
        self.that(
            js_len(s) <= max,
            &format!("{field} must be at most {max} characters"),
        );
    }
    fn blob_ref(&mut self, r: &BlobRef, field: &str) {
        self.max_len(&r.uri, 512, &format!("{field}.uri"));
        self.that(
            valid_digest(&r.sha256),
            &format!("{field}.sha256 is not a SHA-256 digest"),
        );
        self.count(r.size, &format!("{field}.size"));
        self.max_len(&r.media_type, 128, &format!("{field}.mediaType"));
    }
    fn checkpoint(&mut self, k: &Checkpoint) {
        self.that(
            valid_sha(&k.base_commit),
            "checkpoint.baseCommit is not a commit id",
        );
        self.that(
            valid_sha(&k.head_commit),
            "checkpoint.headCommit is not a commit id",
        );
        self.max_len(&k.branch, 256, "checkpoint.branch");
        self.blob_ref(&k.bundle, "checkpoint.bundle");
        self.blob_ref(&k.patch, "checkpoint.patch");
        self.count(k.created_at, "checkpoint.createdAt");
    }
    fn done(self) -> Result<(), RpcError> {
        match self.0.first() {
            None => Ok(()),
            Some(first) => Err(invalid(first)),
        }
    }
}

fn decode<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, RpcError> {
    serde_json::from_str(text).map_err(|e| invalid(&e.to_string()))
}

/// Reads and checks the params of `method`.
pub(crate) fn parse(method: Method, text: &str) -> Result<Params, RpcError> {
    let mut c = Check::new();
    let params = match method {
        Method::Dispatch => {
            let p: DispatchParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            Params::Dispatch(p)
        }
        Method::Comment => {
            let mut p: CommentParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            // The body is stored trimmed (the reference's `z.string().trim()`).
            p.body = p.body.trim().to_owned();
            c.that(
                (1..=8000).contains(&js_len(&p.body)),
                "body must be 1 to 8000 characters after trimming",
            );
            if let Some(sha) = &p.checkpoint {
                c.that(valid_sha(sha), "checkpoint is not a commit id");
            }
            if let Some(path) = &p.path {
                c.that(
                    (1..=512).contains(&js_len(path)),
                    "path must be 1 to 512 characters",
                );
            }
            Params::Comment(p)
        }
        Method::Register => {
            let p: RegisterParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.id(&p.executor_id, "executorId");
            c.that(
                (1..=128).contains(&js_len(&p.name)),
                "name must be 1 to 128 characters",
            );
            c.that(
                p.capabilities.len() <= 32,
                "capabilities holds at most 32 entries",
            );
            for cap in &p.capabilities {
                c.max_len(cap, 128, "a capability");
            }
            c.duration(p.ttl_ms, "ttlMs");
            Params::Register(p)
        }
        Method::Grant => {
            let p: GrantParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.id(&p.grant_id, "grantId");
            c.allowance(&p.limit, "limit");
            Params::Grant(p)
        }
        Method::Revoke => {
            let p: RevokeParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.id(&p.grant_id, "grantId");
            Params::Revoke(p)
        }
        Method::Claim => {
            let p: ClaimParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.id(&p.executor_id, "executorId");
            c.id(&p.grant_id, "grantId");
            c.duration(p.lease_ms, "leaseMs");
            if let Some(e) = p.resume_epoch {
                c.count(e, "resumeEpoch");
            }
            Params::Claim(p)
        }
        Method::Renew | Method::Release => {
            let p: FencedParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.count(p.epoch, "epoch");
            Params::Fenced(p)
        }
        Method::Close => {
            let p: CloseParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            Params::Close(p)
        }
        Method::Reserve => {
            let p: ReserveParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.count(p.epoch, "epoch");
            c.id(&p.turn_id, "turnId");
            c.allowance(&p.ceiling, "ceiling");
            Params::Reserve(p)
        }
        Method::Settle => {
            let p: SettleParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.count(p.epoch, "epoch");
            c.id(&p.turn_id, "turnId");
            if let Some(u) = &p.usage {
                c.count(u.input_tokens, "usage.inputTokens");
                c.count(u.output_tokens, "usage.outputTokens");
                c.count(u.cache_read_tokens, "usage.cacheReadTokens");
                c.count(u.cost_micros, "usage.costMicros");
            }
            if let Some(e) = &p.error {
                c.max_len(e, 4096, "error");
            }
            Params::Settle(p)
        }
        Method::Emit => {
            let p: EmitParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.count(p.epoch, "epoch");
            c.that(
                (1..=EMIT_ACTIONS_MAX).contains(&p.actions.len()),
                "actions must hold 1 to 64 actions",
            );
            Params::Emit(p)
        }
        Method::Export => {
            let p: ExportParams = decode(text)?;
            c.channel(&p.channel);
            Params::Export(p)
        }
        Method::BlobPut => {
            let p: BlobPutParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.that(
                p.data.len() <= BLOB_DATA_CHARS_MAX,
                "data must be at most 24000000 characters",
            );
            c.max_len(&p.media_type, 128, "mediaType");
            Params::BlobPut(p)
        }
        Method::BlobGet => {
            let p: BlobGetParams = decode(text)?;
            c.channel(&p.channel);
            c.that(valid_digest(&p.digest), "digest is not a SHA-256 digest");
            Params::BlobGet(p)
        }
        Method::Checkpoint => {
            let p: CheckpointParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.count(p.epoch, "epoch");
            c.checkpoint(&p.checkpoint);
            c.that(
                p.files.len() <= CHECKPOINT_FILES_MAX,
                "files must hold at most 2000 entries",
            );
            Params::Checkpoint(p)
        }
        Method::Compact => {
            let p: CompactParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.count(p.expected_revision, "expectedRevision");
            c.count(p.through_turn, "throughTurn");
            c.max_len(&p.summary, 24_000, "summary");
            c.that(
                p.decisions.len() <= 32,
                "decisions must hold at most 32 entries",
            );
            for d in &p.decisions {
                c.max_len(d, 2_000, "decisions[]");
            }
            c.that(
                p.active_files.len() <= 64,
                "activeFiles must hold at most 64 entries",
            );
            for f in &p.active_files {
                c.max_len(f, 512, "activeFiles[]");
            }
            Params::Compact(p)
        }
        Method::AcceptCompaction => {
            let p: AcceptCompactionParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            c.id(&p.proposal_id, "proposalId");
            Params::AcceptCompaction(p)
        }
        Method::Context => {
            let p: ContextParams = decode(text)?;
            c.channel(&p.channel);
            c.that(
                (CONTEXT_CHARS_MIN..=CONTEXT_CHARS_MAX).contains(&p.max_chars),
                "maxChars must be an integer from 1024 to 200000",
            );
            Params::Context(p)
        }
        // Checked where they are handled (review.rs, verification.rs).
        Method::Review => Params::Review(read_review(text)?),
        Method::ApproveReview => Params::ApproveReview(read_approve(text)?),
        Method::Verify => Params::Verify(read_verify(text)?),
        Method::MemoryPropose => {
            let p: MemoryProposeParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            check_propose(&p, &mut c);
            Params::MemoryPropose(p)
        }
        Method::MemoryReview => {
            let p: MemoryReviewParams = decode(text)?;
            c.id(&p.operation_id, "operationId");
            c.channel(&p.channel);
            check_review(&p, &mut c);
            Params::MemoryReview(p)
        }
        Method::MemorySearch => {
            let p: MemorySearchParams = decode(text)?;
            c.channel(&p.channel);
            check_search(&p, &mut c);
            Params::MemorySearch(p)
        }
    };
    c.done()?;
    Ok(params)
}

impl Params {
    /// The channel every command names.
    pub(crate) fn channel(&self) -> &str {
        match self {
            Params::Dispatch(p) => &p.channel,
            Params::Comment(p) => &p.channel,
            Params::Register(p) => &p.channel,
            Params::Grant(p) => &p.channel,
            Params::Revoke(p) => &p.channel,
            Params::Claim(p) => &p.channel,
            Params::Fenced(p) => &p.channel,
            Params::Close(p) => &p.channel,
            Params::Reserve(p) => &p.channel,
            Params::Settle(p) => &p.channel,
            Params::Emit(p) => &p.channel,
            Params::Export(p) => &p.channel,
            Params::BlobPut(p) => &p.channel,
            Params::BlobGet(p) => &p.channel,
            Params::Checkpoint(p) => &p.channel,
            Params::Compact(p) => &p.channel,
            Params::AcceptCompaction(p) => &p.channel,
            Params::Context(p) => &p.channel,
            Params::Review(p) => &p.channel,
            Params::ApproveReview(p) => &p.channel,
            Params::Verify(p) => &p.channel,
            Params::MemoryPropose(p) => &p.channel,
            Params::MemoryReview(p) => &p.channel,
            Params::MemorySearch(p) => &p.channel,
        }
    }

    /// The mutation's `operationId`; `None` for reads.
    pub(crate) fn operation_id(&self) -> Option<&str> {
        Some(match self {
            Params::Dispatch(p) => &p.operation_id,
            Params::Comment(p) => &p.operation_id,
            Params::Register(p) => &p.operation_id,
            Params::Grant(p) => &p.operation_id,
            Params::Revoke(p) => &p.operation_id,
            Params::Claim(p) => &p.operation_id,
            Params::Fenced(p) => &p.operation_id,
            Params::Close(p) => &p.operation_id,
            Params::Reserve(p) => &p.operation_id,
            Params::Settle(p) => &p.operation_id,
            Params::Emit(p) => &p.operation_id,
            Params::BlobPut(p) => &p.operation_id,
            Params::Checkpoint(p) => &p.operation_id,
            Params::Compact(p) => &p.operation_id,
            Params::AcceptCompaction(p) => &p.operation_id,
            Params::Review(p) => &p.operation_id,
            Params::ApproveReview(p) => &p.operation_id,
            Params::Verify(p) => &p.operation_id,
            Params::MemoryPropose(p) => &p.operation_id,
            Params::MemoryReview(p) => &p.operation_id,
            Params::Export(_)
            | Params::BlobGet(_)
            | Params::Context(_)
            | Params::MemorySearch(_) => return None,
        })
    }

    /// The params as the receipt fingerprints them.
    pub(crate) fn to_value(&self) -> Value {
        // Strings, numbers and typed structs: serializing cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::INVALID_PARAMS;

    fn code(method: Method, text: &str) -> Option<i64> {
        parse(method, text).err().map(|e| e.code)
    }

    #[test]
    fn unknown_and_missing_keys_and_bad_atoms_are_invalid_params() {
        let ok = r#"{"channel":"axp-session:/s","operationId":"op-1","epoch":3}"#;
        assert_eq!(code(Method::Renew, ok), None);
        for bad in [
            r#"{"channel":"axp-session:/s","epoch":3}"#,
            r#"{"channel":"axp-session:/s","operationId":"op-1","epoch":3,"x":1}"#,
            r#"{"channel":"axp-session:/s","operationId":"-bad","epoch":3}"#,
            r#"{"channel":"axp-session:/s","operationId":"op","epoch":-1}"#,
            r#"{"channel":"axp-session:/s","operationId":"op","epoch":9007199254740992}"#,
            r#"{"channel":"axp-session:/s","operationId":"op","epoch":"3"}"#,
            "null",
        ] {
            assert_eq!(code(Method::Renew, bad), Some(INVALID_PARAMS), "{bad}");
        }
        let long = format!(
            r#"{{"channel":"{}","operationId":"op","epoch":1}}"#,
            "a".repeat(257)
        );
        assert_eq!(code(Method::Renew, &long), Some(INVALID_PARAMS));
        let id128 = format!(
            r#"{{"channel":"c","operationId":"{}","epoch":1}}"#,
            "a".repeat(128)
        );
        assert_eq!(code(Method::Renew, &id128), None);
    }

    #[test]
    fn ranges_are_exact() {
        let claim = |ms: u64| {
            format!(
                r#"{{"channel":"c","operationId":"o","executorId":"e","grantId":"g","leaseMs":{ms}}}"#
            )
        };
        assert_eq!(code(Method::Claim, &claim(3000)), None);
        assert_eq!(code(Method::Claim, &claim(300_000)), None);
        assert_eq!(code(Method::Claim, &claim(2999)), Some(INVALID_PARAMS));
        assert_eq!(code(Method::Claim, &claim(300_001)), Some(INVALID_PARAMS));
        let emit = |n: usize| {
            let actions = vec!["{}"; n].join(",");
            format!(r#"{{"channel":"c","operationId":"o","epoch":1,"actions":[{actions}]}}"#)
        };
        assert_eq!(code(Method::Emit, &emit(0)), Some(INVALID_PARAMS));
        assert_eq!(code(Method::Emit, &emit(64)), None);
        assert_eq!(code(Method::Emit, &emit(65)), Some(INVALID_PARAMS));
    }

    #[test]
    fn nullable_keys_are_required_and_optional_ones_are_left_out() {
        let settle =
            r#"{"channel":"c","operationId":"o","epoch":1,"turnId":"t","outcome":"complete"}"#;
        assert_eq!(code(Method::Settle, settle), Some(INVALID_PARAMS));
        let settle = r#"{"channel":"c","operationId":"o","epoch":1,"turnId":"t","usage":null,"outcome":"complete"}"#;
        let p = parse(Method::Settle, settle).expect("settle");
        assert_eq!(
            p.to_value(),
            serde_json::json!({"channel":"c","operationId":"o","epoch":1,"turnId":"t","usage":null,"outcome":"complete"})
        );
        let comment =
            r#"{"channel":"c","operationId":"o","body":"  hi  ","checkpoint":null,"path":null}"#;
        let p = parse(Method::Comment, comment).expect("comment");
        assert_eq!(p.to_value()["body"], "hi");
        let blank =
            r#"{"channel":"c","operationId":"o","body":"   ","checkpoint":null,"path":null}"#;
        assert_eq!(code(Method::Comment, blank), Some(INVALID_PARAMS));
        let usage = r#"{"channel":"c","operationId":"o","epoch":1,"turnId":"t","usage":{"inputTokens":1,"outputTokens":1,"cacheReadTokens":0,"costMicros":0,"source":"reported","extra":1},"outcome":"complete"}"#;
        assert_eq!(code(Method::Settle, usage), Some(INVALID_PARAMS));
    }

    #[test]
    fn js_lengths_count_utf16_units() {
        assert_eq!(js_len("a😀"), 3);
        assert!(valid_digest(&"a".repeat(64)));
        assert!(!valid_digest(&"A".repeat(64)));
        assert!(valid_sha(&"0".repeat(40)));
    }
}
