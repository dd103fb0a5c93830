//! `dispatchAction`: a maintainer drives a chat. Validation against the newest state, the
//! host's follow-up actions, one change, then (once durable) the echo to every subscriber.
//!
//! Sent as a notification, a refused action is echoed to its sender only, with its
//! `rejectionReason`. Sent as a request, the sender gets `result: null` once the change is
//! durable, or a JSON-RPC error and no echo (the AXP SDK dispatches this way, and a `null`
//! beside a rejection would tell it a refused action succeeded).

use ahp_types::actions::{ActionOrigin, StateAction};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::ahp::clients::{ClientBindings, ClientRecord};
use crate::ahp::sessions::Sessions;
use crate::axp::turn;
use crate::channel::ChannelRef;
use crate::error::RpcError;
use crate::host::parse_params;
use crate::kernel::Kernel;
use crate::limits::ACTION_DEPTH_MAX;
use crate::log::change::Receipt;
use crate::log::receipts::fingerprint;
use crate::log::store::Store;
use crate::log::write_path::{Touched, Txn};
use crate::net::connection::{ConnId, OnFail, Rejection};
use crate::net::jsonrpc;
use crate::principal::Role;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DispatchParams<'a> {
    channel: String,
    client_seq: u64,
    #[serde(borrow)]
    action: &'a RawValue,
}

/// The largest `clientSeq` accepted: JavaScript's largest safe integer, the bound every other
/// count on the wire has. Larger numbers would not survive a JavaScript client, nor the
/// store's signed 64-bit columns past 2^63.
pub(crate) const CLIENT_SEQ_MAX: u64 = (1 << 53) - 1;

fn check_client_seq(p: DispatchParams<'_>) -> Result<DispatchParams<'_>, RpcError> {
    if p.client_seq > CLIENT_SEQ_MAX {
        return Err(RpcError::invalid_params(format!(
            "Invalid parameters: clientSeq must be an integer from 0 to {CLIENT_SEQ_MAX}"
        )));
    }
    Ok(p)
}

/// What became of a dispatch that got past its envelope.
enum Dispatched {
    /// Applied as change `n`.
    Applied(u64),
    /// A retry of an action already applied by change `n` (0: long durable), with the result
    /// it got.
    Retry(u64, std::sync::Arc<str>),
}

impl Sessions {
    /// `dispatchAction` from `conn`; `id` is the raw JSON id of a request, `None` for a
    /// notification.
    pub(crate) fn dispatch_action<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        clients: &mut ClientBindings,
        conn: ConnId,
        id: Option<&str>,
        params: Option<&RawValue>,
    ) {
        let p = match parse_params::<DispatchParams<'_>>(params).and_then(check_client_seq) {
            Ok(p) => p,
            Err(e) => {
                match id {
                    Some(id) => k.reply_error(conn, id, &e),
                    None => k.stats_mut().notifications_dropped += 1,
                }
                return;
            }
        };
        let Some(client_id) = k.client_id(conn).map(str::to_owned) else {
            return;
        };
        let Ok(principal) = k.principal(conn) else {
            return;
        };
        let target = ChannelRef::parse(&p.channel);
        let readable = match target {
            ChannelRef::Root
            | ChannelRef::Catalog
            | ChannelRef::Executors
            | ChannelRef::Unknown => true,
            ChannelRef::Memory => crate::host::channels::memory_direct(&principal).is_ok(),
            r => principal.can_read_session(r.session_id().unwrap_or_default()),
        };
        let exists = match target {
            ChannelRef::Root | ChannelRef::Catalog | ChannelRef::Executors | ChannelRef::Memory => {
                true
            }
            ChannelRef::Unknown => false,
            r => self.contains(r.session_id().unwrap_or_default()),
        };
        let result = if !readable {
            Err(RpcError::forbidden("You don't have access to this channel"))
        } else if !exists {
            Err(RpcError::not_found("Unknown channel"))
        } else {
            let origin = ActionOrigin {
                client_id: client_id.clone(),
                client_seq: p.client_seq as i64,
            };
            self.dispatch_checked(k, clients, &principal.id, principal.role, &p, origin)
        };
        match (result, id) {
            (Ok(Dispatched::Applied(n)), Some(id)) => {
                k.reply_change(conn, id, jsonrpc::result_frame(id, "null"), n)
            }
            (Ok(Dispatched::Retry(n, result)), Some(id)) => k.reply_after(
                conn,
                jsonrpc::result_frame(id, &result),
                n,
                OnFail::Error(id.into()),
            ),
            (Ok(Dispatched::Applied(n)), None) => {
                // The sender sees its action through its subscription, or not at all; should
                // the change fail, it hears the rejection it would have heard at once.
                let rejection = Rejection {
                    channel: p.channel.clone(),
                    action: echoable(p.action).to_owned(),
                    client_id,
                    client_seq: p.client_seq,
                };
                k.on_failure_tell(conn, n, OnFail::Reject(Box::new(rejection)));
            }
            (Ok(Dispatched::Retry(..)), None) => {}
            (Err(e), Some(id)) => k.reply_error(conn, id, &e),
            (Err(_), None) if readable && !exists => {
                // AHP: actions for channels that do not exist are dropped without an echo.
                k.stats_mut().notifications_dropped += 1;
            }
            (Err(e), None) => {
                let frame = jsonrpc::rejection_frame(
                    &p.channel,
                    echoable(p.action),
                    &client_id,
                    p.client_seq,
                    k.server_seq(),
                    &e.message,
                );
                // After every change in flight: the echo carries the current serverSeq.
                k.reply_after(conn, frame, k.newest_live(), OnFail::Send);
            }
        }
    }

    fn dispatch_checked<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        clients: &mut ClientBindings,
        owner: &str,
        role: Role,
        p: &DispatchParams<'_>,
        origin: ActionOrigin,
    ) -> Result<Dispatched, RpcError> {
        // Refusals that need nothing from the store come before the receipt lookup, so a
        // client that may not dispatch costs no store read however often it tries. No answer
        // to a permitted client changes: a receipt is written only for an action that passes
        // all three.
        if role != Role::Maintainer {
            return Err(RpcError::forbidden("Only maintainers can do this"));
        }
        let id = match ChannelRef::parse(&p.channel) {
            ChannelRef::Chat(id) if self.get(id).is_some_and(|e| !e.closed()) => id.to_owned(),
            _ => {
                return Err(RpcError::invalid_params(
                    "This action must target an open session's chat",
                ))
            }
        };
        // The action was read raw, with no depth limit. What is committed must stay readable
        // when wrapped in envelopes, checkpoints and snapshots (see `ACTION_DEPTH_MAX`).
        if jsonrpc::json_depth(p.action.get()) > ACTION_DEPTH_MAX {
            return Err(RpcError::invalid_params(format!(
                "Invalid AHP action: nests too deeply (at most {ACTION_DEPTH_MAX} levels)"
            )));
        }
        let params_value = json!({
            "channel": p.channel,
            "clientSeq": p.client_seq,
            "action": serde_json::from_str::<Value>(p.action.get()).unwrap_or(Value::Null),
        });
        let key = ClientRecord::dispatch_receipt_key(&origin.client_id, p.client_seq);
        let fingerprint = fingerprint("dispatchAction", &params_value);
        // The same action under the same (clientId, clientSeq): a retry, already applied.
        // A different action under a used clientSeq is a restarted counter, not a retry: the
        // official AHP clients start clientSeq at 1 on every connection. It is applied as a
        // new action and its receipt replaces the old one. (The AXP host refuses it with
        // -32011, which breaks every official client after its first reconnect.)
        //
        // A clientSeq above every one this binding has a receipt for (`last_client_seq` is
        // raised with each receipt, in memory here and durably by the receipt itself, and
        // dispatched bindings are never released) cannot be a retry, so the common case costs
        // no store read on the loop. (Read once: nothing below changes the binding before this
        // dispatch raises it.)
        let binding = clients
            .get(&origin.client_id)
            .map(|c| (c.owner == owner, c.dispatched, c.last_client_seq));
        let unused_seq = binding
            .is_some_and(|(mine, dispatched, last)| mine && (!dispatched || p.client_seq > last));
        if !unused_seq {
            if let Some(known) = k.receipt(owner, &key)? {
                if known.fingerprint == fingerprint {
                    return Ok(Dispatched::Retry(known.change, known.result));
                }
            }
        }
        let action: StateAction = serde_json::from_str(p.action.get())
            .map_err(|e| RpcError::invalid_params(format!("Invalid AHP action: {e}")))?;
        k.room()?;
        let Some(mut tx) = self.begin(k, &id) else {
            return Err(RpcError::invalid_params(
                "This action must target an open session's chat",
            ));
        };
        let built = turn::maintainer_action(k, self, &mut tx, owner, action, Some(origin.clone()))
            .and_then(|()| turn::sync_chat(&mut tx));
        if let Err(e) = built {
            self.abort_tx(k, tx);
            return Err(e);
        }
        let last = binding.map_or(0, |(_, _, last)| last);
        let client = ClientRecord {
            client_id: origin.client_id.clone(),
            owner: owner.to_owned(),
            last_client_seq: last.max(p.client_seq),
            dispatched: true,
        };
        let receipt = Receipt {
            owner: owner.to_owned(),
            key,
            fingerprint,
            result: "null".into(),
        };
        // The binding's record is written once, at its first dispatch; after that the
        // receipt alone raises `lastClientSeq` (see `ClientRecord::last_client_seq`).
        let first_dispatch = !binding.is_some_and(|(mine, dispatched, _)| mine && dispatched);
        let extra = Txn {
            receipts: vec![receipt],
            records: if first_dispatch {
                vec![client.to_record()]
            } else {
                Vec::new()
            },
            touched: vec![Touched::Client(client.client_id.clone())],
            ..Txn::default()
        };
        let n = self.commit_tx(k, tx, extra);
        clients.insert(client);
        Ok(Dispatched::Applied(n))
    }
}

/// The action as the echo may carry it: an action too deep to store is echoed as `null`
/// (echoed as sent it could make the frame deeper than JSON readers accept).
fn echoable(action: &RawValue) -> &str {
    if jsonrpc::json_depth(action.get()) <= ACTION_DEPTH_MAX {
        action.get()
    } else {
        "null"
    }
}
