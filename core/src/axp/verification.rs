//! `_axp/verify`: a verifier, an identity separate from the executor and the maintainers,
//! records the outcome of a command it ran on the checkpoint's exact head, its output a blob
//! of this session. The host stamps who and when; a new checkpoint clears it (the reducer).

use serde::{Deserialize, Serialize};

use crate::ahp::tx::Tx;
use crate::axp::blob::{check_blob, Blobs};
use crate::axp::params::{js_len, valid_digest, valid_sha, COUNT_MAX};
use crate::axp::reducer::AxpAction;
use crate::axp::review::{check_base, decode, need};
use crate::axp::state::{BlobRef, Verification};
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::log::store::Store;
use crate::principal::{Principal, Role};

/// Most arguments of a verification command, and the longest one (UTF-16 code units).
const COMMAND_ARGS_MAX: usize = 64;
const COMMAND_ARG_CHARS_MAX: usize = 1024;

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct VerifyParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) head_commit: String,
    pub(crate) command: Vec<String>,
    /// Any safe integer (JavaScript's): exit codes and signals differ by platform.
    pub(crate) exit_code: i64,
    pub(crate) output: BlobRef,
}

/// Strict params of `_axp/verify`.
pub(crate) fn read_verify(text: &str) -> Result<VerifyParams, RpcError> {
    let p: VerifyParams = decode(text)?;
    check_base(&p.channel, &p.operation_id)?;
    need(valid_sha(&p.head_commit), "headCommit is not a commit id")?;
    need(
        (1..=COMMAND_ARGS_MAX).contains(&p.command.len()),
        "command must hold 1 to 64 arguments",
    )?;
    for arg in &p.command {
        need(
            js_len(arg) <= COMMAND_ARG_CHARS_MAX,
            "a command argument must be at most 1024 characters",
        )?;
    }
    need(
        p.exit_code.unsigned_abs() <= COUNT_MAX,
        "exitCode is not a safe integer",
    )?;
    let o = &p.output;
    need(
        js_len(&o.uri) <= 512,
        "output.uri must be at most 512 characters",
    )?;
    need(
        valid_digest(&o.sha256),
        "output.sha256 is not a SHA-256 digest",
    )?;
    need(o.size <= COUNT_MAX, "output.size is above 2^53-1")?;
    need(
        js_len(&o.media_type) <= 128,
        "output.mediaType must be at most 128 characters",
    )?;
    Ok(p)
}

/// `_axp/verify` on the session `tx` holds.
pub(crate) fn verify<S: Store>(
    k: &Kernel<S>,
    tx: &mut Tx,
    blobs: &Blobs,
    principal: &Principal,
    p: VerifyParams,
) -> Result<String, RpcError> {
    if principal.role != Role::Verifier {
        return Err(RpcError::forbidden(
            "Only a verifier identity can record a verification",
        ));
    }
    let ex = &tx.entry.exchange;
    if ex.checkpoint.as_ref().map(|c| &c.head_commit) != Some(&p.head_commit) {
        return Err(RpcError::conflict(
            "The verification does not name the current checkpoint",
        ));
    }
    check_blob(blobs, &ex.resource, &p.output)?;
    let verification = Verification {
        head_commit: p.head_commit,
        verifier: principal.id.clone(),
        command: p.command,
        exit_code: p.exit_code,
        output: p.output,
        verified_at: k.wall_ms(),
    };
    tx.emit_axp(AxpAction::VerificationChanged { verification });
    Ok("null".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::INVALID_PARAMS;
    use serde_json::{json, Value};

    fn params() -> Value {
        json!({"channel": "axp-session:/s", "operationId": "op", "headCommit": "a".repeat(40),
            "command": ["cargo", "test"], "exitCode": 0,
            "output": {"uri": "axp-blob:/x/y", "sha256": "b".repeat(64), "size": 3,
                "mediaType": "text/plain"}})
    }

    fn code(p: &Value) -> Option<i64> {
        read_verify(&p.to_string()).err().map(|e| e.code)
    }

    #[test]
    fn verify_params_are_strict() {
        assert_eq!(code(&params()), None);
        let with = |path: &str, v: Value| {
            let mut p = params();
            let (parent, key) = path.rsplit_once('/').expect("path");
            p.pointer_mut(parent).expect("parent")[key] = v;
            code(&p)
        };
        assert_eq!(with("/exitCode", json!(-9007199254740991i64)), None);
        assert_eq!(
            with("/exitCode", json!(9007199254740992u64)),
            Some(INVALID_PARAMS)
        );
        assert_eq!(with("/exitCode", json!(1.5)), Some(INVALID_PARAMS));
        assert_eq!(with("/headCommit", json!("abc")), Some(INVALID_PARAMS));
        assert_eq!(with("/command", json!([])), Some(INVALID_PARAMS));
        assert_eq!(with("/command", json!(vec!["x"; 64])), None);
        assert_eq!(with("/command", json!(vec!["x"; 65])), Some(INVALID_PARAMS));
        assert_eq!(
            with("/command", json!(["x".repeat(1025)])),
            Some(INVALID_PARAMS)
        );
        assert_eq!(
            with("/output/sha256", json!("B".repeat(64))),
            Some(INVALID_PARAMS)
        );
        assert_eq!(
            with("/output/uri", json!("u".repeat(513))),
            Some(INVALID_PARAMS)
        );
        assert_eq!(
            with("/output/mediaType", json!("m".repeat(129))),
            Some(INVALID_PARAMS)
        );
        assert_eq!(with("/output/size", json!(-1)), Some(INVALID_PARAMS));
        assert_eq!(with("/output/extra", json!(1)), Some(INVALID_PARAMS));
        let mut p = params();
        p.as_object_mut().expect("object").remove("operationId");
        assert_eq!(code(&p), Some(INVALID_PARAMS));
    }
}
