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
//!   changes durable / failed       ──► handle(now, Input::Durable / Input::CommitFailed)
//!   timer expired                  ──► handle_timeout(now)
//!   write frame / close socket     ◄── poll_output() -> Output::{Send, Close}
//!   commit a change                ◄── poll_output() -> Output::Commit
//!   sleep until                    ◄── poll_timeout()
//! ```
//!
//! ## The run loop
//! Feed inputs with [`Host::handle`] (several may precede one drain), call
//! [`Host::handle_timeout`] when the deadline from [`Host::poll_timeout`] passes, and drain
//! [`Host::poll_output`] to `None` before sleeping. Commit each `Output::Commit` in order (on
//! any thread; group several into one transaction if you like) and report the outcome.
//! [`drive::Drive`] does all of this against the host's own store, or hands the commits to a
//! writer of the caller's: the one loop core tests, the simulator, fuzz targets and benches share.
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
//! ## Layout
//! A small kernel ([`kernel`]: connections, outbox, timers, sequencer, write path, generator,
//! `now`, stats) is lent to components that own their tables: the AHP sessions (`ahp`),
//! client services (`services`). `host` routes inputs and methods to them; `log` is the one
//! write path; `net` the wire and the connection table.
//!
//! ## Durable before revealed
//! A change is applied in memory at once (later changes build on it) and handed out as
//! `Output::Commit`; nothing it reveals (events, the answer to its sender, snapshots and
//! replays that include it) leaves the host before `Input::Durable` covers it. A failed
//! commit rolls the host back to the durable state and tells each sender.
//!
//! ## Time and determinism
//! The core never reads a clock: every call takes a [`Now`]. Randomness comes from one seeded
//! generator built in [`Host::new`]; everything iterated on the way to an output is ordered.
//! Same config, store contents, seed and inputs: same outputs, byte for byte.
//!
//! ## Errors
//! Bad input from a peer becomes a JSON-RPC error, a rejection echo, a documented drop or a
//! documented close, never a panic. Broken internal invariants are bugs and panic with a
//! message naming ids and counters, never payloads.
//!
//! ## Limits
//! Every configurable bound is a field of [`Limits`], with the reason for its default. A few
//! fixed bounds are constants beside it: [`ACTION_DEPTH_MAX`], [`SERVICE_METADATA_DEPTH_MAX`],
//! [`REQUEST_ID_BYTES_MAX`] and [`SERVICES_MAX`].

#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod ahp;
mod axp;
pub mod canonical;
mod channel;
pub mod drive;
pub mod error;
mod hash;
mod host;
pub(crate) mod kernel;
mod limits;
pub mod log;
mod net;
mod principal;
mod services;

pub use ahp::clients::{stored_bindings, ClientRecord};
pub use ahp::session::{AXP_CAPABILITY, AXP_VERSION};
pub use channel::{valid_id, valid_session_id, ChannelRef, CATALOG, ROOT};
pub use error::RpcError;
pub use hash::{IdHasher, U64Map};
pub use host::{AxpInspect, Host, HostError, Input};
pub use kernel::time::{iso8601, Instant, Now};
pub use kernel::{HostConfig, Stats};
pub use limits::{
    Limits, ACTION_DEPTH_MAX, REQUEST_ID_BYTES_MAX, SERVICES_MAX, SERVICE_METADATA_DEPTH_MAX,
};
pub use log::change::{
    Bytes, Change, Event, Loaded, Receipt, Record, StoreError, StoredRecord, Table,
};
pub use log::store::{Commit, MemStore, Store};
pub use net::connection::ConnId;
pub use net::jsonrpc;
pub use net::output::{CloseCode, Frame, Output};
pub use principal::{session_id_from_scope_entry, Principal, Role, SessionScope};
pub use services::relay::{CANCELLED, SERVICE_GONE, TIMEOUT};
pub use services::{CAPABILITY as CLIENT_SERVICES_CAPABILITY, METHODS as CLIENT_SERVICES_METHODS};

#[cfg(test)]
mod tests;
