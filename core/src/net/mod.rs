//! The network edge of the core: JSON-RPC envelopes ([`jsonrpc`]), the connection table and its
//! held frames ([`connection`]), and what goes out ([`output`]).

pub(crate) mod connection;
pub mod jsonrpc;
pub(crate) mod output;
