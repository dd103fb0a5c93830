//! The AXP exchange: executors, leases, budgets, turn control, discussion, blobs and export,
//! wire-compatible with the AXP 0.2.0 reference host.
//!
//! The component owns what no session holds: the executor registry (`axp-executors://`) and
//! the blob index. A session's exchange state (`axp-session:/ID`) lives with the session
//! (`ahp::session::SessionEntry::exchange`), so one change (`ahp::tx::Tx`) covers events on
//! its chat, session and exchange together, and the session's checkpoints, replay and rebuild
//! cover the exchange too.
//!
//! Every `_axp/*` request takes one path ([`Axp::handle_request`]): strict params (`-32602`
//! before anything else), who may read the channel (`-32009`, `-32008`), then for a mutation
//! its retry receipt, keyed `(principal, operationId)` and fingerprinted as
//! `sha256(canonical({method, params}))`: the same input again gets the stored result and
//! changes nothing (answered once the original change is durable), other input under a used
//! id is `-32011`. A command that passes its checks is one change holding its state, events
//! and receipt; a refused one writes nothing, receipt included.

pub(crate) mod blob;
pub(crate) mod budget;
pub(crate) mod checkpoint;
pub(crate) mod comment;
pub(crate) mod context;
pub(crate) mod emit;
pub(crate) mod executors;
pub(crate) mod export;
pub(crate) mod lease;
pub(crate) mod memory;
pub(crate) mod params;
pub(crate) mod reducer;
pub(crate) mod review;
pub(crate) mod signature;
pub(crate) mod signing_keys;
pub(crate) mod state;
pub(crate) mod turn;
pub(crate) mod verification;

use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::Value;

use crate::ahp::sessions::Sessions;
use crate::axp::blob::Blobs;
use crate::axp::executors::Executors;
use crate::axp::memory::Memory;
use crate::axp::params::{DispatchParams, Params};
use crate::axp::reducer::AxpAction;
use crate::axp::signing_keys::SigningKeys;
use crate::channel::ChannelRef;
use crate::error::{RpcError, METHOD_NOT_FOUND};
use crate::log::change::StoredRecord;
use crate::principal::Role;

pub(crate) use crate::ahp::session::AXP_CAPABILITY;
use crate::host::channels::channel_allowed;
use crate::kernel::Kernel;
use crate::log::change::Receipt;
use crate::log::receipts::fingerprint;
use crate::log::store::Store;
use crate::log::write_path::Txn;
use crate::net::connection::{ConnId, OnFail};
use crate::net::jsonrpc;
use crate::net::output::Frame;
use crate::principal::Principal;

/// The `_axp/*` commands this host serves.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum Method {
    Dispatch,
    Comment,
    Register,
    Grant,
    Revoke,
    Claim,
    Renew,
    Release,
    Close,
    Reserve,
    Settle,
    Emit,
    Export,
    BlobPut,
    BlobGet,
    Checkpoint,
    Compact,
    AcceptCompaction,
    Context,
    Review,
    ApproveReview,
    Verify,
    MemoryPropose,
    MemoryReview,
    MemorySearch,
}

/// The method table: every command this host serves, by wire name. `initialize` advertises
/// exactly these names and the router sends exactly these here; any other `_axp/*` name is
/// `-32601`.
pub(crate) const METHODS: &[(&str, Method)] = &[
    ("_axp/dispatch", Method::Dispatch),
    ("_axp/comment", Method::Comment),
    ("_axp/register", Method::Register),
    ("_axp/grant", Method::Grant),
    ("_axp/revoke", Method::Revoke),
    ("_axp/claim", Method::Claim),
    ("_axp/renew", Method::Renew),
    ("_axp/release", Method::Release),
    ("_axp/close", Method::Close),
    ("_axp/reserve", Method::Reserve),
    ("_axp/settle", Method::Settle),
    ("_axp/emit", Method::Emit),
    ("_axp/export", Method::Export),
    ("_axp/blobPut", Method::BlobPut),
    ("_axp/blobGet", Method::BlobGet),
    ("_axp/checkpoint", Method::Checkpoint),
    ("_axp/compact", Method::Compact),
    ("_axp/acceptCompaction", Method::AcceptCompaction),
    ("_axp/context", Method::Context),
    ("_axp/review", Method::Review),
    ("_axp/approveReview", Method::ApproveReview),
    ("_axp/verify", Method::Verify),
    ("_axp/memoryPropose", Method::MemoryPropose),
    ("_axp/memoryReview", Method::MemoryReview),
    ("_axp/memorySearch", Method::MemorySearch),
];

/// The one command whose messages may exceed `Limits::message_bytes_max`.
pub(crate) const BLOB_PUT: &str = "_axp/blobPut";

/// The command named `name`, if this host serves it.
pub(crate) fn method(name: &str) -> Option<Method> {
    METHODS.iter().find(|(n, _)| *n == name).map(|(_, m)| *m)
}

/// Every command's wire name, in table order.
pub(crate) fn method_names() -> Vec<&'static str> {
    METHODS.iter().map(|(n, _)| *n).collect()
}

fn name_of(m: Method) -> &'static str {
    METHODS
        .iter()
        .find(|(_, x)| *x == m)
        .map_or("", |(n, _)| *n)
}

/// A mutation's identity: who asked, under which `operationId`, with what input.
pub(crate) struct Op {
    pub(crate) owner: String,
    pub(crate) key: String,
    pub(crate) fingerprint: String,
}

impl Op {
    /// The receipt that stores `result` for retries.
    pub(crate) fn receipt(&self, result: &str) -> Receipt {
        Receipt {
            owner: self.owner.clone(),
            key: self.key.clone(),
            fingerprint: self.fingerprint.clone(),
            result: Arc::from(result),
        }
    }
}

/// A mutation that was issued: its change and the result its sender gets once it is durable.
pub(crate) struct Done {
    pub(crate) change: u64,
    pub(crate) result: String,
}

/// `-32009` unless `principal` may run executors (contributors and maintainers).
pub(crate) fn contribute(principal: &Principal) -> Result<(), RpcError> {
    match principal.role {
        Role::Contributor | Role::Maintainer => Ok(()),
        _ => Err(RpcError::forbidden(
            "Only contributors and maintainers can do this",
        )),
    }
}

/// `-32009` unless `principal` is a maintainer.
pub(crate) fn maintain(principal: &Principal) -> Result<(), RpcError> {
    match principal.role {
        Role::Maintainer => Ok(()),
        _ => Err(RpcError::forbidden("Only maintainers can do this")),
    }
}

/// JavaScript's `encodeURIComponent`: everything but `A-Z a-z 0-9 - _ . ! ~ * ' ( )` is
/// percent-encoded as UTF-8.
pub(crate) fn encode_uri_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The AXP component. See the module docs.
pub(crate) struct Axp {
    pub(crate) executors: Executors,
    pub(crate) blobs: Blobs,
    pub(crate) signing_keys: SigningKeys,
    /// Repository memory, `axp-memory://`.
    pub(crate) memory: Memory,
}

impl Axp {
    /// The registry, blob index and memory the store holds; `Err(key)` names a record that
    /// cannot be read. `seed` keys the memory index's hash maps (lesson text is peers').
    pub(crate) fn load(records: &[StoredRecord], seed: u64) -> Result<Axp, String> {
        Ok(Axp {
            executors: Executors::load(records)?,
            blobs: Blobs::load(records)?,
            signing_keys: SigningKeys::load(records)?,
            memory: Memory::load(records, seed)?,
        })
    }

    /// The state of `axp-executors://`.
    pub(crate) fn registry_json(&self) -> Value {
        self.executors.json()
    }

    /// An `_axp/*` request from `conn` (ready). Always answers.
    pub(crate) fn handle_request<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        sessions: &mut Sessions,
        conn: ConnId,
        id: &str,
        name: &str,
        params: Option<&RawValue>,
    ) {
        let Some(m) = method(name) else {
            let e = RpcError::new(METHOD_NOT_FOUND, "Unknown method");
            return k.reply_error(conn, id, &e);
        };
        let outcome = k.principal(conn).and_then(|principal| {
            let p = params::parse(m, params.map_or("null", RawValue::get))?;
            channel_allowed(&principal, p.channel(), sessions)?;
            match p.operation_id() {
                None => self.read(k, sessions, &principal, &p).map(Answer::Now),
                Some(key) => {
                    let op = Op {
                        owner: principal.id.clone(),
                        key: key.to_owned(),
                        fingerprint: fingerprint(name_of(m), &p.to_value()),
                    };
                    // The same operation again: its stored result, once its change is durable.
                    if let Some(known) = k.receipt(&op.owner, &op.key)? {
                        if known.fingerprint != op.fingerprint {
                            return Err(RpcError::conflict(
                                "This operationId was already used with different input",
                            ));
                        }
                        return Ok(Answer::After(known.change, known.result.to_string()));
                    }
                    k.room()?;
                    self.mutate(k, sessions, &principal, m, p, &op)
                        .map(|d| Answer::Change(d.change, d.result))
                }
            }
        });
        match outcome {
            Ok(Answer::Now(result)) => k.reply_state(conn, id, jsonrpc::result_frame(id, &result)),
            Ok(Answer::Change(change, result)) => {
                k.reply_change(conn, id, jsonrpc::result_frame(id, &result), change)
            }
            Ok(Answer::After(change, result)) => k.reply_after(
                conn,
                jsonrpc::result_frame(id, &result),
                change,
                OnFail::Error(id.into()),
            ),
            Err(e) => k.reply_error(conn, id, &e),
        }
    }

    /// A read: answered with the newest state (it waits for the changes it shows).
    fn read<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        sessions: &mut Sessions,
        principal: &Principal,
        p: &Params,
    ) -> Result<String, RpcError> {
        match p {
            Params::Export(p) => export::export(k, sessions, session_of(&p.channel)?),
            Params::BlobGet(p) => self.blobs.get(k, p),
            Params::Context(p) => {
                let id = session_of(&p.channel)?;
                let entry = sessions
                    .get(id)
                    .ok_or_else(|| RpcError::not_found("Unknown channel"))?;
                // The five lessons recalled by the task, of those the caller may read.
                let can_read = |session: &str| memory::can_read_evidence(principal, session);
                let (lessons, total) =
                    self.memory
                        .search(sessions.repository(), &entry.exchange.task, 5, &can_read);
                let rendered: Vec<String> = lessons.iter().map(|l| context::lesson(l)).collect();
                let text = context::render(&entry.exchange, &entry.chat, &rendered, p.max_chars)?;
                Ok(context::answer(
                    &entry.exchange,
                    text,
                    total,
                    rendered.len(),
                ))
            }
            Params::MemorySearch(p) => Ok(self.memory.search_command(sessions, principal, p)),
            _ => Err(RpcError::new(METHOD_NOT_FOUND, "Unknown method")),
        }
    }

    /// A mutation that passed its receipt check: validated, then issued as one change.
    fn mutate<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        sessions: &mut Sessions,
        principal: &Principal,
        m: Method,
        p: Params,
        op: &Op,
    ) -> Result<Done, RpcError> {
        match p {
            Params::Register(p) => self.executors.register(k, principal, p, op),
            Params::BlobPut(p) => self.blobs.put(k, principal, p, op),
            Params::MemoryPropose(p) => self.memory.propose(k, sessions, principal, p, op),
            Params::MemoryReview(p) => self.memory.review(k, principal, p, op),
            Params::Dispatch(p) => dispatch(k, sessions, principal, p, op),
            p => self.session_command(k, sessions, principal, m, p, op),
        }
    }

    /// A command on one session's exchange: built on the session taken out of the table,
    /// issued with its receipt, or abandoned (nothing written) when a check refuses it.
    fn session_command<S: Store>(
        &mut self,
        k: &mut Kernel<S>,
        sessions: &mut Sessions,
        principal: &Principal,
        m: Method,
        p: Params,
        op: &Op,
    ) -> Result<Done, RpcError> {
        let mut tx = lease::begin(k, sessions, p.channel())?;
        let mut extra = Txn::default();
        let mut refreshed = None;
        let built = match p {
            Params::Grant(p) => lease::grant(k, &mut tx, principal, p),
            Params::Revoke(p) => lease::revoke(k, &mut tx, principal, p),
            Params::Claim(p) => lease::claim(k, &mut tx, &self.executors, principal, p),
            Params::Fenced(p) if m == Method::Renew => {
                lease::renew(k, &mut tx, &mut extra, &self.executors, principal, p).map(
                    |(result, info)| {
                        refreshed = info;
                        result
                    },
                )
            }
            Params::Fenced(p) => lease::release(k, &mut tx, principal, p),
            Params::Close(_) => turn::close(k, &mut tx, principal),
            Params::Reserve(p) => turn::reserve(k, &mut tx, principal, p),
            Params::Settle(p) => turn::settle(k, sessions, &mut tx, principal, p),
            Params::Emit(p) => {
                let blobs = &self.blobs;
                let exchange = tx.entry.exchange.resource.clone();
                let has = |digest: &str| blobs.has(&exchange, digest);
                emit::emit(k, sessions, &mut tx, principal, p, &has)
            }
            Params::Comment(p) => comment::comment(k, &mut tx, principal, p),
            Params::Checkpoint(p) => checkpoint::checkpoint(k, &mut tx, &self.blobs, principal, p),
            Params::Compact(p) => context::compact(k, &mut tx, principal, p),
            Params::AcceptCompaction(p) => context::accept(&mut tx, principal, p),
            Params::Review(p) => {
                let keys = &mut self.signing_keys;
                review::review(k, &mut tx, keys, &mut extra, principal, p)
            }
            Params::ApproveReview(p) => {
                review::approve(&mut tx, &mut self.signing_keys, &mut extra, principal, p)
            }
            Params::Verify(p) => verification::verify(k, &mut tx, &self.blobs, principal, p),
            _ => Err(RpcError::new(METHOD_NOT_FOUND, "Unknown method")),
        };
        let result = match built {
            Ok(result) => result,
            Err(e) => {
                sessions.abort_tx(k, tx);
                return Err(e);
            }
        };
        extra.receipts.push(op.receipt(&result));
        let id = tx.entry.id.clone();
        let change = sessions.commit_tx(k, tx, extra);
        if let Some(executor) = refreshed {
            self.executors.note(k, &executor);
            self.executors
                .apply(&AxpAction::ExecutorChanged { executor });
        }
        if let Some(entry) = sessions.get(&id) {
            lease::note(k, &id, &entry.exchange);
        }
        Ok(Done { change, result })
    }

    /// Host start: see [`lease::on_start`].
    pub(crate) fn on_start<S: Store>(&mut self, k: &mut Kernel<S>, sessions: &mut Sessions) {
        lease::on_start(k, sessions, &mut self.executors);
    }
}

/// `_axp/dispatch`: a maintainer's chat action, as `dispatchAction` takes it but with a
/// durable receipt instead of a client sequence number (no origin is attached).
fn dispatch<S: Store>(
    k: &mut Kernel<S>,
    sessions: &mut Sessions,
    principal: &Principal,
    p: DispatchParams,
    op: &Op,
) -> Result<Done, RpcError> {
    maintain(principal)?;
    let id = match ChannelRef::parse(&p.channel) {
        ChannelRef::Chat(id) if sessions.get(id).is_some_and(|e| !e.closed()) => id.to_owned(),
        _ => {
            return Err(RpcError::invalid_params(
                "This action must target an open session's chat",
            ))
        }
    };
    let action = turn::read_action(&p.action.to_string())?;
    let mut tx = sessions
        .begin(k, &id)
        .ok_or_else(|| RpcError::not_found("Unknown channel"))?;
    let built = turn::maintainer_action(k, sessions, &mut tx, &principal.id, action, None)
        .and_then(|()| turn::sync_chat(&mut tx));
    if let Err(e) = built {
        sessions.abort_tx(k, tx);
        return Err(e);
    }
    let result = "null".to_owned();
    let extra = Txn {
        receipts: vec![op.receipt(&result)],
        ..Txn::default()
    };
    let change = sessions.commit_tx(k, tx, extra);
    Ok(Done { change, result })
}

/// How a request is answered.
enum Answer {
    /// A read, showing the newest state.
    Now(String),
    /// A mutation issued as change `n`.
    Change(u64, String),
    /// A retry of a mutation made by change `n` (0: long durable), with its stored result.
    After(u64, String),
}

/// The session a session-scoped command names: any of its channels, as the reference
/// accepts (`_axp/dispatch` alone requires the chat).
pub(crate) fn session_of(channel: &str) -> Result<&str, RpcError> {
    match ChannelRef::parse(channel) {
        ChannelRef::Session(id)
        | ChannelRef::Chat(id)
        | ChannelRef::Changeset(id)
        | ChannelRef::Exchange(id) => Ok(id),
        _ => Err(RpcError::invalid_params("Expected a session channel")),
    }
}

/// Issues `txn` (numbered from `k.server_seq() + 1`) and sends its events, once durable, to
/// each channel's subscribers. For changes on no session (the registry); a session's go
/// through `Sessions::commit_tx`.
pub(crate) fn commit_and_broadcast<S: Store>(k: &mut Kernel<S>, txn: Txn) -> u64 {
    let frames: Vec<(Arc<str>, Frame)> = txn
        .events
        .iter()
        .map(|e| {
            (
                e.channel.clone(),
                jsonrpc::notification_frame("action", &e.envelope),
            )
        })
        .collect();
    let number = k.commit(txn);
    for (channel, frame) in frames {
        k.broadcast(&channel, &frame, number, None);
    }
    number
}

/// JSON text of a result.
pub(crate) fn json_text(v: &impl serde::Serialize) -> String {
    // Typed values with string keys: serializing cannot fail.
    serde_json::to_string(v).unwrap_or_else(|_| Value::Null.to_string())
}
