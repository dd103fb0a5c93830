//! The AHP baseline: sessions and their channels (`ahp-session:/`, `ahp-chat:/`,
//! `ahp-changeset:/`, the root), `createSession`, `listSessions`, `dispatchAction`, and the
//! clientId bindings the handshake makes.

pub(crate) mod clients;
pub(crate) mod commands;
pub(crate) mod dispatch;
pub(crate) mod session;
pub(crate) mod sessions;
pub(crate) mod tx;
