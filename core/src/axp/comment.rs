//! `_axp/comment`: scoped, attributed discussion on a session, optionally about a file of the
//! current checkpoint. Independent of AHP prompts and tool permissions: a comment never starts
//! a turn. The host assigns the author and the time; the `operationId` is the comment's id, so
//! a retried post never duplicates.

use crate::ahp::tx::Tx;
use crate::axp::json_text;
use crate::axp::params::CommentParams;
use crate::axp::reducer::AxpAction;
use crate::axp::state::DiscussionComment;
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::limits::DISCUSSION_MAX;
use crate::log::store::Store;
use crate::principal::{Principal, Role};

/// `_axp/comment` on the session `tx` holds.
pub(crate) fn comment<S: Store>(
    k: &mut Kernel<S>,
    tx: &mut Tx,
    principal: &Principal,
    p: CommentParams,
) -> Result<String, RpcError> {
    if principal.role == Role::Observer {
        return Err(RpcError::forbidden("Observers can't post comments"));
    }
    let ex = &tx.entry.exchange;
    if ex.discussion_len() >= DISCUSSION_MAX {
        return Err(RpcError::limit(
            "Discussion limit reached; the full history remains available",
        ));
    }
    let head = ex.checkpoint.as_ref().map(|c| c.head_commit.as_str());
    if p.checkpoint.is_some() && p.checkpoint.as_deref() != head {
        return Err(RpcError::conflict(
            "The checkpoint changed; refresh before commenting",
        ));
    }
    if p.path.is_some() && p.checkpoint.is_none() {
        return Err(RpcError::invalid_params(
            "File discussion needs a checkpoint",
        ));
    }
    let comment = DiscussionComment {
        id: p.operation_id,
        author: principal.id.clone(),
        body: p.body,
        created_at: k.wall_ms(),
        checkpoint: p.checkpoint,
        path: p.path,
    };
    let result = json_text(&comment);
    tx.emit_axp(AxpAction::CommentAdded { comment });
    Ok(result)
}
