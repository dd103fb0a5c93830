//! The durable log: what a change writes ([`change`]), where it goes ([`store`]), how it is
//! numbered and followed until durable ([`write_path`], [`sequencer`]), and how retries are
//! recognised ([`receipts`]).

pub mod change;
pub(crate) mod receipts;
pub(crate) mod sequencer;
pub mod store;
pub(crate) mod write_path;
