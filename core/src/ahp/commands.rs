//! `createSession` and `listSessions`.

use ahp_types::notifications::SessionAddedParams;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::ahp::session::{SessionEntry, PROVIDER};
use crate::ahp::sessions::Sessions;
use crate::channel::{self, session_uri, ROOT};
use crate::error::{RpcError, PROVIDER_NOT_FOUND, SESSION_ALREADY_EXISTS};
use crate::host::parse_params;
use crate::kernel::time::iso8601;
use crate::kernel::Kernel;
use crate::log::store::Store;
use crate::log::write_path::{Touched, Txn};
use crate::net::connection::ConnId;
use crate::net::jsonrpc;
use crate::principal::Role;

/// Largest page `listSessions` returns.
const LIST_PAGE_MAX: usize = 1000;

#[derive(Deserialize)]
struct CreateParams {
    channel: String,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    config: Option<serde_json::Map<String, Value>>,
}

#[derive(Deserialize)]
struct ListParams {
    #[serde(default)]
    limit: Option<u64>,
    #[serde(default)]
    cursor: Option<String>,
}

fn config_string(
    config: &Option<serde_json::Map<String, Value>>,
    key: &str,
    max: usize,
) -> Result<Option<String>, RpcError> {
    match config.as_ref().and_then(|c| c.get(key)) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.trim().is_empty() && s.chars().count() <= max => {
            Ok(Some(s.clone()))
        }
        Some(_) => Err(RpcError::invalid_params(format!(
            "config.{key} must be a non-blank string of at most {max} characters"
        ))),
    }
}

/// Sort key for listSessions: newest `modifiedAt` first, then resource.
fn modified_ms(iso: &str) -> i64 {
    iso.parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .unwrap_or(0)
}

/// The `modifiedAt` listSessions shows and sorts by, in ms: the latest of the chat's, the
/// checkpoint's, the verification's and the newest AXP comment's (as the reference lists
/// sessions; root notifications follow the chat only, as there).
fn listed_ms(e: &SessionEntry) -> i64 {
    let chat = modified_ms(e.modified_at());
    let ex = &e.exchange;
    let comment = ex.discussion.as_ref().and_then(|d| d.last());
    let axp = [
        ex.checkpoint.as_ref().map(|c| c.created_at),
        ex.verification.as_ref().map(|v| v.verified_at),
        comment.map(|c| c.created_at),
    ];
    let axp = axp.into_iter().flatten().max().unwrap_or(0);
    chat.max(i64::try_from(axp).unwrap_or(i64::MAX))
}

impl Sessions {
    /// `createSession`: the change is issued and the answer waits for it.
    pub(crate) fn create_session<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        conn: ConnId,
        id: &str,
        params: Option<&RawValue>,
    ) -> Result<(), RpcError> {
        let p: CreateParams = parse_params(params)?;
        let principal = k.principal(conn)?;
        if principal.role != Role::Maintainer {
            return Err(RpcError::forbidden("Only maintainers can do this"));
        }
        let session = p
            .channel
            .strip_prefix("ahp-session:/")
            .or_else(|| p.channel.strip_prefix("axp-session:/"))
            .filter(|id| channel::valid_session_id(id))
            .ok_or_else(|| {
                RpcError::invalid_params("createSession needs a session URI like ahp-session:/ID")
            })?
            .to_owned();
        if !principal.can_read_session(&session) {
            return Err(RpcError::forbidden("You don't have access to this channel"));
        }
        if p.provider.as_deref().is_some_and(|prov| prov != PROVIDER) {
            return Err(RpcError::new(PROVIDER_NOT_FOUND, "Unknown provider"));
        }
        let title = config_string(&p.config, "title", 256)?
            .unwrap_or_else(|| "Contribution session".into());
        let task = config_string(&p.config, "task", 512)?.unwrap_or_else(|| p.channel.clone());
        if self.contains(&session) {
            return Err(RpcError::new(
                SESSION_ALREADY_EXISTS,
                "Session already exists",
            ));
        }
        if self.values().any(|e| !e.closed() && e.meta.task == task) {
            return Err(RpcError::conflict("An open session already owns this task"));
        }
        // After the duplicate checks, so a repeated create still hears that it exists.
        if self.len() >= k.limits().sessions_max as usize {
            return Err(RpcError::limit("Session limit reached"));
        }
        k.room()?;
        let mut entry = SessionEntry::create(
            &session,
            title,
            task,
            k.wall_ms(),
            self.repository(),
            k.server_seq(),
        );
        let records = entry.checkpoint(k.server_seq());
        let summary = entry.summary();
        let number = k.commit(Txn {
            records,
            touched: vec![Touched::Session(session.clone())],
            ..Txn::default()
        });
        self.put(Box::new(entry), 0);
        let added = SessionAddedParams {
            channel: ROOT.into(),
            summary,
        };
        if let Ok(params) = serde_json::to_string(&added) {
            let frame = jsonrpc::notification_frame("root/sessionAdded", &params);
            Sessions::notify_root(k, &session, &frame, number);
        }
        k.reply_change(conn, id, jsonrpc::result_frame(id, "null"), number);
        Ok(())
    }

    pub(crate) fn list_sessions<S: Store>(
        &self,
        k: &Kernel<S>,
        conn: ConnId,
        params: Option<&RawValue>,
    ) -> Result<String, RpcError> {
        let p: ListParams = match params {
            Some(_) => parse_params(params)?,
            None => ListParams {
                limit: None,
                cursor: None,
            },
        };
        let principal = k.principal(conn)?;
        let limit = p
            .limit
            .map_or(LIST_PAGE_MAX, |l| (l as usize).clamp(1, LIST_PAGE_MAX));
        let mut rows: Vec<(i64, String, &SessionEntry)> = self
            .values()
            .filter(|e| principal.can_read_session(&e.id))
            .map(|e| (listed_ms(e), session_uri(&e.id), e))
            .collect();
        rows.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.cmp(&b.1)));
        // The cursor names the last row of the previous page: `<modifiedMs>|<resource>`.
        let start = match &p.cursor {
            None => 0,
            Some(c) => {
                let (ms, res) = c
                    .split_once('|')
                    .and_then(|(ms, res)| Some((ms.parse::<i64>().ok()?, res)))
                    .ok_or_else(|| RpcError::invalid_params("Unknown cursor"))?;
                rows.iter()
                    .position(|r| (r.0 < ms) || (r.0 == ms && r.1.as_str() > res))
                    .unwrap_or(rows.len())
            }
        };
        let page = &rows[start.min(rows.len())..];
        let items: Vec<Value> = page
            .iter()
            .take(limit)
            .filter_map(|r| {
                let mut summary = r.2.summary();
                if r.0 > modified_ms(&summary.modified_at) {
                    summary.modified_at = iso8601(r.0.max(0) as u64);
                }
                serde_json::to_value(summary).ok()
            })
            .collect();
        let mut result = json!({ "items": items });
        if page.len() > limit {
            let last = &page[limit - 1];
            result["nextCursor"] = Value::from(format!("{}|{}", last.0, last.1));
        }
        Ok(result.to_string())
    }
}
