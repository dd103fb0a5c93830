//! `_axp/review` and `_axp/approveReview`: a signed statement of what produced a checkpoint,
//! then an independent maintainer's signature on the same statement.
//!
//! The executor holding the lease signs a manifest naming the current checkpoint (its digest),
//! the model, the prompt, and the session's trace: `hashObject` of its envelopes on the chat,
//! exchange and session channels with `0 < serverSeq <= traceThroughSeq` (what `_axp/export`
//! gives a client, less the changeset). The host recomputes the trace from its log, requires
//! it to hold the current checkpoint, and checks the Ed25519 signature
//! (`crate::axp::signature`). A maintainer who is not the lease holder then signs the same
//! manifest with a different key. Each signer's key is bound to its principal for good
//! (`crate::axp::signing_keys`). A new checkpoint clears the review (the reducer).
//!
//! Checks run in the reference host's order, so the same bad input gets the same code.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::ahp::tx::Tx;
use crate::axp::export::EXPORT_BYTES_MAX;
use crate::axp::json_text;
use crate::axp::lease::fenced;
use crate::axp::maintain;
use crate::axp::params::{js_len, valid_digest, valid_sha, COUNT_MAX};
use crate::axp::reducer::AxpAction;
use crate::axp::signature::{read_public_key, verify, Signature};
use crate::axp::signing_keys::SigningKeys;
use crate::axp::state::{ExchangeState, Manifest, Review};
use crate::canonical::{canonical, hash_object, hex};
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::log::store::Store;
use crate::log::write_path::Txn;
use crate::principal::Principal;

/// Longest `publicKey` and `signature` texts, in UTF-16 code units (the reference's bounds).
const PUBLIC_KEY_CHARS_MAX: usize = 1024;
const SIGNATURE_CHARS_MAX: usize = 256;
/// The most trace bytes (envelopes as stored) a review hashes: what one `_axp/export` may
/// carry, since that is where a client gets the trace it signs.
pub(crate) const TRACE_BYTES_MAX: usize = EXPORT_BYTES_MAX;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ReviewParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) manifest: Manifest,
    pub(crate) contributor: Signature,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct ApproveReviewParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) signature: Signature,
}

fn invalid(what: &str) -> RpcError {
    RpcError::invalid_params(format!("Invalid parameters: {what}"))
}

/// `-32602` naming `what` unless `ok`.
pub(crate) fn need(ok: bool, what: &str) -> Result<(), RpcError> {
    if ok {
        Ok(())
    } else {
        Err(invalid(what))
    }
}

/// Reads params of type `T`: unknown keys, missing keys and wrong types are `-32602`.
pub(crate) fn decode<'a, T: Deserialize<'a>>(text: &'a str) -> Result<T, RpcError> {
    serde_json::from_str(text).map_err(|e| invalid(&e.to_string()))
}

/// The atoms every mutation carries.
pub(crate) fn check_base(channel: &str, operation_id: &str) -> Result<(), RpcError> {
    need(
        crate::channel::valid_id(operation_id),
        "operationId is not a valid id",
    )?;
    need(js_len(channel) <= 256, "channel is too long")
}

fn check_signature(s: &Signature, field: &str) -> Result<(), RpcError> {
    need(
        js_len(&s.public_key) <= PUBLIC_KEY_CHARS_MAX,
        &format!("{field}.publicKey must be at most {PUBLIC_KEY_CHARS_MAX} characters"),
    )?;
    need(
        js_len(&s.signature) <= SIGNATURE_CHARS_MAX,
        &format!("{field}.signature must be at most {SIGNATURE_CHARS_MAX} characters"),
    )
}

fn check_manifest(m: &Manifest) -> Result<(), RpcError> {
    need(m.version == 1, "manifest.version must be 1")?;
    need(
        js_len(&m.repository) <= 512,
        "manifest.repository must be at most 512 characters",
    )?;
    need(js_len(&m.session) <= 256, "manifest.session is too long")?;
    need(
        valid_sha(&m.base_commit),
        "manifest.baseCommit is not a commit id",
    )?;
    need(
        valid_sha(&m.head_commit),
        "manifest.headCommit is not a commit id",
    )?;
    need(
        js_len(&m.model) <= 256,
        "manifest.model must be at most 256 characters",
    )?;
    for (digest, field) in [
        (&m.prompt_hash, "promptHash"),
        (&m.trace_hash, "traceHash"),
        (&m.checkpoint_digest, "checkpointDigest"),
    ] {
        need(
            valid_digest(digest),
            &format!("manifest.{field} is not a SHA-256 digest"),
        )?;
    }
    need(
        m.trace_through_seq <= COUNT_MAX,
        "manifest.traceThroughSeq is above 2^53-1",
    )
}

/// Strict params of `_axp/review`.
pub(crate) fn read_review(text: &str) -> Result<ReviewParams, RpcError> {
    let p: ReviewParams = decode(text)?;
    check_base(&p.channel, &p.operation_id)?;
    check_manifest(&p.manifest)?;
    check_signature(&p.contributor, "contributor")?;
    Ok(p)
}

/// Strict params of `_axp/approveReview`.
pub(crate) fn read_approve(text: &str) -> Result<ApproveReviewParams, RpcError> {
    let p: ApproveReviewParams = decode(text)?;
    check_base(&p.channel, &p.operation_id)?;
    check_signature(&p.signature, "signature")?;
    Ok(p)
}

/// What the host finds in a session's trace.
struct Trace {
    /// `hashObject` of the envelopes.
    hash: String,
    /// `hashObject` of the checkpoint of the trace's last `_axp/checkpointChanged`, if any.
    last_checkpoint: Option<String>,
}

/// The trace of session `ex` through `through`: its envelopes on the chat, exchange and
/// session channels, in `serverSeq` order, hashed as one canonical JSON array without
/// building the array's text.
fn trace<S: Store>(k: &mut Kernel<S>, ex: &ExchangeState, through: u64) -> Result<Trace, RpcError> {
    let mut events = Vec::new();
    let mut view = k.view();
    for channel in [&ex.chat, &ex.resource, &ex.session] {
        let mut these = view.channel_events_after(channel, 0).map_err(|e| {
            tracing::warn!(error = %e, "trace read failed");
            RpcError::commit_failed()
        })?;
        these.retain(|e| e.seq <= through);
        events.append(&mut these);
    }
    events.sort_by_key(|e| e.seq);
    let bytes: usize = events.iter().map(|e| e.envelope.len()).sum();
    if bytes > TRACE_BYTES_MAX {
        return Err(RpcError::limit(
            "This session's trace is too large to review (larger than one export)",
        ));
    }
    let mut hasher = Sha256::new();
    let mut last_checkpoint = None;
    hasher.update(b"[");
    for (i, e) in events.iter().enumerate() {
        let envelope: Value = serde_json::from_str(&e.envelope).map_err(|_| {
            tracing::warn!(seq = e.seq, "a stored envelope is not JSON");
            RpcError::commit_failed()
        })?;
        if i > 0 {
            hasher.update(b",");
        }
        hasher.update(canonical(&envelope).as_bytes());
        let action = &envelope["action"];
        if *e.channel == *ex.resource && action["type"] == "_axp/checkpointChanged" {
            last_checkpoint = Some(hash_object(&action["checkpoint"]));
        }
    }
    hasher.update(b"]");
    Ok(Trace {
        hash: hex(&hasher.finalize()),
        last_checkpoint,
    })
}

fn value_of(v: &impl Serialize) -> Value {
    // Typed structs with string keys: serializing cannot fail.
    serde_json::to_value(v).unwrap_or(Value::Null)
}

/// `_axp/review` on the session `tx` holds. A new key is bound to the caller in `extra`.
pub(crate) fn review<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    keys: &mut SigningKeys,
    extra: &mut Txn,
    principal: &Principal,
    p: ReviewParams,
) -> Result<String, RpcError> {
    let ex = &tx.entry.exchange;
    if ex.lease.as_ref().is_none_or(|l| l.owner != principal.id) {
        return Err(RpcError::forbidden(
            "Only the executor holding the lease can submit its review",
        ));
    }
    fenced(principal, ex, ex.epoch, k.wall_ms())?;
    if ex.reservation.is_some() {
        return Err(RpcError::conflict(
            "Finish the reserved turn before submitting a review",
        ));
    }
    let m = &p.manifest;
    let Some(checkpoint) = ex.checkpoint.as_ref().filter(|c| {
        m.repository == ex.repository
            && m.session == ex.session
            && m.base_commit == c.base_commit
            && m.head_commit == c.head_commit
    }) else {
        return Err(RpcError::conflict(
            "The manifest does not name the current checkpoint",
        ));
    };
    if m.checkpoint_digest != hash_object(&value_of(checkpoint)) {
        return Err(RpcError::invalid_params(
            "checkpointDigest does not match the current checkpoint",
        ));
    }
    if m.trace_through_seq > k.server_seq() {
        return Err(RpcError::invalid_params(
            "traceThroughSeq is past the newest serverSeq",
        ));
    }
    let trace = trace(k, ex, m.trace_through_seq)?;
    if trace.last_checkpoint.as_ref() != Some(&m.checkpoint_digest) {
        return Err(RpcError::invalid_params(
            "The trace must include the current checkpoint",
        ));
    }
    if trace.hash != m.trace_hash {
        return Err(RpcError::invalid_params(
            "traceHash does not match this session's trace",
        ));
    }
    let key = verify(&value_of(m), &p.contributor)
        .ok_or_else(|| RpcError::invalid_params("Invalid contributor signature"))?;
    keys.check(&principal.id, key)?;
    keys.bind(extra, &principal.id, key);
    let review = Review {
        manifest: p.manifest,
        contributor: p.contributor,
        maintainer: None,
    };
    let result = json_text(&review);
    tx.emit_axp(AxpAction::ReviewChanged { review });
    Ok(result)
}

/// `_axp/approveReview` on the session `tx` holds. A new key is bound to the caller in
/// `extra`.
pub(crate) fn approve(
    tx: &mut Tx,
    keys: &mut SigningKeys,
    extra: &mut Txn,
    principal: &Principal,
    p: ApproveReviewParams,
) -> Result<String, RpcError> {
    maintain(principal)?;
    let ex = &tx.entry.exchange;
    let head = ex.checkpoint.as_ref().map(|c| &c.head_commit);
    let Some(current) = ex
        .review
        .as_ref()
        .filter(|r| Some(&r.manifest.head_commit) == head)
    else {
        return Err(RpcError::conflict("No review of the current checkpoint"));
    };
    if ex.lease.as_ref().is_some_and(|l| l.owner == principal.id) {
        return Err(RpcError::forbidden(
            "The executor holding the lease can't approve its own work",
        ));
    }
    // Independent means another key, compared as keys: one key in two PEM layouts is one.
    let contributor = read_public_key(&current.contributor.public_key);
    let key = verify(&value_of(&current.manifest), &p.signature)
        .filter(|key| Some(*key) != contributor)
        .ok_or_else(|| RpcError::invalid_params("Invalid independent maintainer signature"))?;
    keys.check(&principal.id, key)?;
    keys.bind(extra, &principal.id, key);
    let review = Review {
        maintainer: Some(p.signature),
        ..current.clone()
    };
    let result = json_text(&review);
    tx.emit_axp(AxpAction::ReviewChanged { review });
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn manifest() -> Value {
        json!({"version": 1, "repository": "r", "session": "ahp-session:/s",
            "baseCommit": "a".repeat(40), "headCommit": "b".repeat(64), "model": "m",
            "promptHash": "c".repeat(64), "traceHash": "d".repeat(64), "traceThroughSeq": 3,
            "checkpointDigest": "e".repeat(64)})
    }

    fn review_text(manifest: &Value) -> String {
        json!({"channel": "axp-session:/s", "operationId": "op", "manifest": manifest,
            "contributor": {"publicKey": "k", "signature": "s"}})
        .to_string()
    }

    #[test]
    fn review_params_are_strict() {
        assert!(read_review(&review_text(&manifest())).is_ok());
        let bad = |field: &str, v: Value| {
            let mut m = manifest();
            m[field] = v;
            read_review(&review_text(&m))
                .map(|_| ())
                .map_err(|e| e.code)
        };
        let invalid = Err(crate::error::INVALID_PARAMS);
        assert_eq!(bad("version", json!(2)), invalid);
        assert_eq!(bad("repository", json!("r".repeat(513))), invalid);
        assert_eq!(bad("session", json!("s".repeat(257))), invalid);
        assert_eq!(bad("baseCommit", json!("A".repeat(40))), invalid);
        assert_eq!(bad("headCommit", json!("b".repeat(41))), invalid);
        assert_eq!(bad("model", json!("m".repeat(257))), invalid);
        assert_eq!(bad("promptHash", json!("c".repeat(40))), invalid);
        assert_eq!(bad("traceHash", json!(null)), invalid);
        assert_eq!(bad("checkpointDigest", json!(7)), invalid);
        assert_eq!(bad("traceThroughSeq", json!(9007199254740992u64)), invalid);
        assert_eq!(bad("traceThroughSeq", json!(-1)), invalid);
        assert_eq!(bad("extra", json!(1)), invalid);
        assert_eq!(bad("model", json!("m".repeat(256))), Ok(()));
        let mut m = manifest();
        m.as_object_mut().expect("object").remove("model");
        assert_eq!(
            read_review(&review_text(&m))
                .map(|_| ())
                .map_err(|e| e.code),
            invalid
        );
        let long_key = json!({"channel": "c", "operationId": "op", "manifest": manifest(),
            "contributor": {"publicKey": "k".repeat(1025), "signature": "s"}});
        assert!(read_review(&long_key.to_string()).is_err());
        let approve = |sig: Value| {
            read_approve(
                &json!({"channel": "c", "operationId": "op", "signature": sig}).to_string(),
            )
            .map(|_| ())
            .map_err(|e| e.code)
        };
        assert_eq!(approve(json!({"publicKey": "k", "signature": "s"})), Ok(()));
        assert_eq!(
            approve(json!({"publicKey": "k", "signature": "s".repeat(257)})),
            invalid
        );
        assert_eq!(
            approve(json!({"publicKey": "k", "signature": "s", "x": 1})),
            invalid
        );
        assert_eq!(approve(json!({"publicKey": "k"})), invalid);
    }

    #[test]
    fn a_manifest_signs_as_the_client_sent_it() {
        // The typed manifest serializes back to the same canonical text as the raw params.
        let raw = manifest();
        let typed: Manifest = serde_json::from_value(raw.clone()).expect("manifest");
        assert_eq!(canonical(&value_of(&typed)), canonical(&raw));
    }
}
