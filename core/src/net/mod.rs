//! The network edge of the core: JSON-RPC envelopes ([`wire`]), the connection table and its
//! held frames ([`connection`]), and what goes out ([`output`]).

pub(crate) mod connection;
pub(crate) mod output;
pub mod wire;
