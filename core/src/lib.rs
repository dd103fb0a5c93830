//! # axhost-core: the sans-IO Agent Host Protocol host
//!
//! Every decision axhost makes happens here, in one single-threaded, deterministic state
//! machine that never touches the outside world:
//!
//! ```text
//!   driver (mio / simulator)                 core (this crate)
//!   ───────────────────────                  ─────────────────
//!   socket accepted + authenticated ──► handle(now, Input::Connected)
//!   WebSocket text message         ──► handle(now, Input::Message)
//!   bytes written to a socket      ──► handle(now, Input::Flushed)
//!   socket gone                    ──► handle(now, Input::Closed)
//!   change durable / failed        ──► handle(now, Input::Durable | Input::CommitFailed)
//!   timer expired                  ──► handle_timeout(now)
//!   write frame / close socket     ◄── poll_output() -> Output::{Send, Close}
//!   make a change durable          ◄── poll_output() -> Output::Commit
//!   sleep until                    ◄── poll_timeout()
//! ```
//!
//! ## The run loop
//! Feed inputs with [`Host::handle`] (several may precede one drain), call
//! [`Host::handle_timeout`] when the deadline from [`Host::poll_timeout`] passes, and drain
//! [`Host::poll_output`] to `None` before sleeping. [`drive`] is that loop, shared by the
//! tests, the simulator, the fuzz targets and the benches.
//!
//! ## The write path
//! The core never writes to its store. Each durable change comes out as
//! [`Output::Commit`]`(`[`Change`]`)`, already applied to memory (the next change is validated
//! against it: pipelining). A writer must:
//! 1. commit changes in `number` order; it may commit a run of consecutive changes in one
//!    transaction, and reports [`Input::Durable`]` { through }` with the last number of it;
//! 2. on a failed transaction write nothing of it, report [`Input::CommitFailed`]` { number }`
//!    with its first number, and drop every later change whose `generation` is at most the
//!    highest in the failed transaction (the core rolled them back); later generations are
//!    committed normally.
//!
//! Every frame that reveals a change (its events, the sender's echo or reply, snapshots,
//! replays, reads) is held until the change is durable; frames that depend on nothing unflushed
//! (client-service notifications, relayed requests and answers, pings) pass at once.
//! `ARCHITECTURE.md` ("One write path") gives the rules for failures.
//!
//! ```
//! use std::sync::Arc;
//! use axhost_core::{ConnId, Host, HostConfig, Input, MemStore, Now, Output, Principal};
//!
//! let mut host = Host::new(HostConfig::default(), MemStore::new(), 7).expect("valid config");
//! let conn = ConnId(1);
//! host.handle(Now::at(0), Input::Connected { conn, principal: Arc::new(Principal::maintainer("me")) });
//! let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"channel":"ahp-root://"}}"#;
//! host.handle(Now::at(1), Input::Message { conn, text: ping });
//! match host.poll_output() {
//!     Some(Output::Send { frame, .. }) => assert_eq!(frame.as_str(), r#"{"jsonrpc":"2.0","id":1,"result":null}"#),
//!     other => panic!("unexpected {other:?}"),
//! }
//! ```
//!
//! ## Time
//! The core never reads a clock. Every call takes a [`Now`]: a monotonic millisecond count that
//! orders and expires things, and a wall-clock reading used only for timestamps users see.
//!
//! ## Determinism
//! Randomness comes from one seeded generator built in [`Host::new`]; everything iterated on the
//! way to an output is ordered (`BTreeMap`, `Vec`, or sorted first). The hash maps on the hot
//! path use a fixed hasher and are only looked up, never iterated. Same config, store contents, seed and inputs:
//! same outputs, byte for byte. The simulator (`axhost-sim`) relies on it.
//!
//! ## Errors
//! Bad input from a peer becomes a JSON-RPC error, a rejection echo, a documented drop or a
//! documented close, never a panic. A commit that fails reveals nothing: memory returns to the
//! last durable state and the caller gets `-32603` (or its rejection echo). Broken internal invariants are bugs and panic with a
//! message naming ids and counters, never payloads.
//!
//! ## Limits
//! Every configurable bound is a field of [`Limits`], with the reason for its default. A few
//! fixed bounds are constants beside it: [`ACTION_DEPTH_MAX`], [`SERVICE_METADATA_DEPTH_MAX`],
//! [`REQUEST_ID_BYTES_MAX`] and [`SERVICES_MAX`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod binding;
mod channel;
mod connection;
mod dispatch;
pub mod drive;
pub mod error;
mod handshake;
mod hash;
mod host;
mod limits;
mod output;
mod principal;
mod receipts;
pub mod relay;
mod sequencer;
mod services;
mod session;
mod store;
mod time;
pub mod wire;
mod write;

pub use channel::{valid_id, valid_session_id, ChannelRef, CATALOG, ROOT};
pub use connection::ConnId;
pub use error::RpcError;
pub use hash::{IdHasher, U64Map};
pub use host::{Host, HostConfig, HostError, Input, Stats};
pub use limits::{
    Limits, ACTION_DEPTH_MAX, REQUEST_ID_BYTES_MAX, SERVICES_MAX, SERVICE_METADATA_DEPTH_MAX,
};
pub use output::{CloseCode, Frame, Output};
pub use principal::{session_id_from_scope_entry, Principal, Role, SessionScope};
pub use services::{CAPABILITY as CLIENT_SERVICES_CAPABILITY, METHODS as CLIENT_SERVICES_METHODS};
pub use session::{AXP_CAPABILITY, AXP_VERSION};
pub use store::{
    Change, ClientRecord, Event, Loaded, MemStore, Receipt, Record, RecordWrite, Store, StoreError,
    Table,
};
pub use time::{iso8601, Instant, Now};
#[cfg(test)]
mod tests;
