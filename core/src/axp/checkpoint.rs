//! `_axp/checkpoint`: the executor records a Git checkpoint of its work, the state a review
//! signs, a verification runs and a resumed executor restores.
//!
//! Every byte a checkpoint names is a blob this session already holds: the bundle and the
//! patch by exact URI and size, each file's before/after content by reference. The file list
//! is published as an AHP `changeset/contentChanged` on `ahp-changeset:/ID`, so stock AHP
//! clients show the diff; file identities are `axp-file:/<encoded exchange>/...` so one
//! session's files can never be passed off as another's. The base commit is fixed by the
//! first checkpoint; the host's clock stamps `createdAt`. A new checkpoint clears the review
//! and the verification (they named the old head); a pending compaction stays, and its
//! acceptance checks the head it was proposed at.

use serde_json::{json, Value};

use crate::ahp::session::SessionChannel;
use crate::ahp::tx::Tx;
use crate::axp::blob::{check_blob, check_refs, Blobs};
use crate::axp::encode_uri_component;
use crate::axp::lease::fenced;
use crate::axp::params::CheckpointParams;
use crate::axp::reducer::AxpAction;
use crate::axp::turn::read_action;
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::log::store::Store;
use crate::principal::Principal;

/// `_axp/checkpoint` on the session `tx` holds. Checks run in the reference's order, so the
/// same bad input gets the same code.
pub(crate) fn checkpoint<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    blobs: &Blobs,
    principal: &Principal,
    p: CheckpointParams,
) -> Result<String, RpcError> {
    let ex = &tx.entry.exchange;
    fenced(principal, ex, p.epoch, k.wall_ms())?;
    check_blob(blobs, &ex.resource, &p.checkpoint.bundle)?;
    check_blob(blobs, &ex.resource, &p.checkpoint.patch)?;
    if let Some(current) = &ex.checkpoint {
        if current.base_commit != p.checkpoint.base_commit {
            return Err(RpcError::conflict("Checkpoint cannot change the Git base"));
        }
    }
    let raw = json!({"type": "changeset/contentChanged", "files": p.files});
    let action = read_action(&raw.to_string())?;
    let file_prefix = format!("axp-file:/{}/", encode_uri_component(&ex.resource));
    let blob_prefix = format!("axp-blob:/{}/", encode_uri_component(&ex.resource));
    let has = |digest: &str| blobs.has(&ex.resource, digest);
    for file in raw["files"].as_array().into_iter().flatten() {
        for side in ["before", "after"] {
            match file.get("edit").and_then(|e| e.get(side)) {
                None | Some(Value::Null) => {}
                Some(side) => check_side(side, &file_prefix, &blob_prefix, &has)?,
            }
        }
    }
    let mut checkpoint = p.checkpoint;
    checkpoint.created_at = k.wall_ms();
    tx.emit(SessionChannel::Changeset, action, None)?;
    tx.emit_axp(AxpAction::CheckpointChanged { checkpoint });
    Ok("null".into())
}

/// One side of a file edit: a file of this session whose content is a blob it holds.
fn check_side(
    side: &Value,
    file_prefix: &str,
    blob_prefix: &str,
    has: &dyn Fn(&str) -> bool,
) -> Result<(), RpcError> {
    // AHP's schema makes a side `{uri, content}`; anything else is not a valid action.
    let Some(uri) = side.get("uri").and_then(Value::as_str) else {
        return Err(RpcError::invalid_params(
            "Invalid AHP action: a file edit side needs a uri",
        ));
    };
    if !uri.starts_with(file_prefix) {
        return Err(RpcError::forbidden(
            "File identity must belong to this session",
        ));
    }
    let content = side
        .get("content")
        .filter(|c| truthy(c))
        .ok_or_else(|| RpcError::invalid_params("Checkpoint files require stored content"))?;
    check_refs(content, blob_prefix, has)
}

/// JavaScript truthiness, which the reference applies to `content`.
fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64().is_some_and(|x| x != 0.0),
        Value::String(s) => !s.is_empty(),
        Value::Array(_) | Value::Object(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_side_must_be_a_file_of_this_session_with_stored_content() {
        let fp = "axp-file:/axp-session%3A%2Fs/";
        let bp = "axp-blob:/axp-session%3A%2Fs/";
        let d = "a".repeat(64);
        let has = |x: &str| x == d;
        let good = json!({"uri": format!("{fp}src/a.rs"), "content": {"uri": format!("{bp}{d}")}});
        assert!(check_side(&good, fp, bp, &has).is_ok());
        let code = |v: Value| check_side(&v, fp, bp, &has).map_err(|e| e.code);
        use crate::error::{INVALID_PARAMS, PERMISSION_DENIED};
        assert_eq!(code(json!({"content": {}})), Err(INVALID_PARAMS));
        assert_eq!(
            code(json!({"uri": "axp-file:/axp-session%3A%2Fother/a", "content": {}})),
            Err(PERMISSION_DENIED)
        );
        assert_eq!(
            code(json!({"uri": format!("{fp}a"), "content": ""})),
            Err(INVALID_PARAMS)
        );
        assert_eq!(
            code(
                json!({"uri": format!("{fp}a"), "content": {"uri": format!("{bp}{}", "b".repeat(64))}})
            ),
            Err(PERMISSION_DENIED)
        );
        // Content without a uri is not a blob reference and is not checked as one.
        assert!(code(json!({"uri": format!("{fp}a"), "content": {"x": 1}})).is_ok());
    }
}
