//! `_axp/export`: a session's full history, so anyone can check it. Its seeds (each channel's
//! state as created) plus its actions (every event of those channels, in `serverSeq` order)
//! rebuild its snapshots (each channel's state now) through the same reducers.

use serde_json::{json, Value};

use crate::ahp::session::{SessionChannel, SessionEntry};
use crate::ahp::sessions::Sessions;
use crate::axp::state::ExchangeState;
use crate::channel::{changeset_uri, chat_uri, exchange_uri, session_uri};
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::log::store::Store;

/// The session as it was created: what its creation stored, rebuilt from its meta.
fn seed_of(entry: &SessionEntry, repository: &str) -> SessionEntry {
    let title = entry
        .meta
        .title
        .clone()
        .unwrap_or_else(|| entry.session.title.clone());
    let mut seed = SessionEntry::create(
        &entry.id,
        title,
        entry.meta.task.clone(),
        entry.meta.created_at_ms,
        repository,
        entry.meta.created_seq,
    );
    // A session created before exchanges existed started with the one its first load made.
    seed.exchange = ExchangeState::initial(&entry.id, &entry.exchange.repository, &entry.meta.task);
    seed
}

/// The largest export answer, in bytes: the 16 MiB frame common WebSocket clients read
/// (tungstenite's default). A longer history is refused with `-32043` rather than sent to a
/// client that cannot read it.
pub(crate) const EXPORT_BYTES_MAX: usize = 16 * 1024 * 1024;

/// `_axp/export` of session `id` (which exists).
pub(crate) fn export<S: Store>(
    k: &mut Kernel<S>,
    sessions: &Sessions,
    id: &str,
) -> Result<String, RpcError> {
    let entry = sessions
        .get(id)
        .ok_or_else(|| RpcError::not_found("Unknown channel"))?;
    let seed = seed_of(entry, sessions.repository());
    let channels = [
        (exchange_uri(id), SessionChannel::Exchange),
        (session_uri(id), SessionChannel::Session),
        (chat_uri(id), SessionChannel::Chat),
        (changeset_uri(id), SessionChannel::Changeset),
    ];
    let server_seq = k.server_seq();
    let mut events = Vec::new();
    let mut view = k.view();
    for (uri, _) in &channels {
        let mut these = view.channel_events_after(uri, 0).map_err(|e| {
            tracing::warn!(error = %e, "export read failed");
            RpcError::commit_failed()
        })?;
        events.append(&mut these);
    }
    events.sort_by_key(|e| e.seq);
    let budget = EXPORT_BYTES_MAX;
    let mut actions = String::from("[");
    for (i, e) in events.iter().enumerate() {
        if i > 0 {
            actions.push(',');
        }
        actions.push_str(&e.envelope);
        if actions.len() > budget {
            return Err(RpcError::limit(
                "This session's history is too large to export in one message",
            ));
        }
    }
    actions.push(']');
    let snapshot = |e: &SessionEntry, uri: &str, which: SessionChannel, from: u64| -> Value {
        json!({ "resource": uri, "state": e.state_json(which), "fromSeq": from })
    };
    let seeds: Vec<Value> = channels
        .iter()
        .map(|(uri, w)| snapshot(&seed, uri, *w, entry.meta.created_seq))
        .collect();
    let snapshots: Vec<Value> = channels
        .iter()
        .map(|(uri, w)| snapshot(entry, uri, *w, server_seq))
        .collect();
    let head = json!({
        "version": crate::ahp::session::AXP_VERSION,
        "repository": entry.exchange.repository,
        "serverSeq": server_seq,
        "seeds": seeds,
    })
    .to_string();
    // `{..., "seeds": [...]` + `,"actions":[...],"snapshots":[...]}`: the actions are stored
    // JSON, spliced in without decoding them.
    let mut out = String::with_capacity(head.len() + actions.len() + 1024);
    out.push_str(&head[..head.len() - 1]);
    out.push_str(",\"actions\":");
    out.push_str(&actions);
    out.push_str(",\"snapshots\":");
    out.push_str(&Value::Array(snapshots).to_string());
    out.push('}');
    if out.len() > budget {
        return Err(RpcError::limit(
            "This session's history is too large to export in one message",
        ));
    }
    Ok(out)
}
