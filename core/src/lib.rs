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
//!   timer expired                  ──► handle_timeout(now)
//!   write frame / close socket     ◄── poll_output() -> Output::{Send, Close}
//!   sleep until                    ◄── poll_timeout()
//! ```
//!
//! ## The run loop
//! Feed inputs with [`Host::handle`] (several may precede one drain), call
//! [`Host::handle_timeout`] when the deadline from [`Host::poll_timeout`] passes, and drain
//! [`Host::poll_output`] to `None` before sleeping.
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
//! documented close, never a panic. A store that refuses a commit leaves memory and clients
//! untouched and the caller gets `-32603`. Broken internal invariants are bugs and panic with a
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
pub mod error;
mod handshake;
mod hash;
mod host;
mod limits;
mod output;
mod principal;
pub mod relay;
mod sequencer;
mod services;
mod session;
mod store;
mod time;
pub mod wire;

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
    Change, ClientRecord, Event, Loaded, MemStore, Receipt, RecordWrite, Store, StoreError,
};
pub use time::{iso8601, Instant, Now};
#[cfg(test)]
mod tests;
