//! JSON-RPC errors the host answers with. The one place error codes live.

use std::borrow::Cow;

use serde_json::Value;

/// `-32700`: the message is not JSON.
pub const PARSE_ERROR: i64 = -32700;
/// `-32600`: JSON, but not a JSON-RPC 2.0 message.
pub const INVALID_REQUEST: i64 = -32600;
/// `-32601`: no such method.
pub const METHOD_NOT_FOUND: i64 = -32601;
/// `-32602`: the params are wrong.
pub const INVALID_PARAMS: i64 = -32602;
/// `-32603`: the host failed (for example the store refused a commit).
pub const INTERNAL_ERROR: i64 = -32603;
/// `-32001`: AHP SessionNotFound.
pub const SESSION_NOT_FOUND: i64 = -32001;
/// `-32002`: AHP ProviderNotFound.
pub const PROVIDER_NOT_FOUND: i64 = -32002;
/// `-32003`: AHP SessionAlreadyExists.
pub const SESSION_ALREADY_EXISTS: i64 = -32003;
/// `-32004`: AHP TurnInProgress.
pub const TURN_IN_PROGRESS: i64 = -32004;
/// `-32005`: AHP UnsupportedProtocolVersion; `data.supportedVersions` is required.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32005;
/// `-32008`: AHP NotFound.
pub const NOT_FOUND: i64 = -32008;
/// `-32009`: AHP PermissionDenied.
pub const PERMISSION_DENIED: i64 = -32009;
/// `-32011`: AHP Conflict.
pub const CONFLICT: i64 = -32011;
/// `-32040`: AXP stale lease or epoch.
pub const STALE: i64 = -32040;
/// `-32041`: AXP budget.
pub const BUDGET: i64 = -32041;
/// `-32042`: AXP context.
pub const CONTEXT: i64 = -32042;
/// `-32043`: AXP size or count limit.
pub const LIMIT: i64 = -32043;

/// Why the host refused a request. Sent as a JSON-RPC error response, or as the
/// `rejectionReason` of an action echo for `dispatchAction`.
#[derive(Clone, Debug, PartialEq)]
pub struct RpcError {
    /// JSON-RPC error code.
    pub code: i64,
    /// Human-readable message; our words, not the client's payload.
    pub message: Cow<'static, str>,
    /// Optional structured data.
    pub data: Option<Value>,
}

impl RpcError {
    /// An error with a code and message.
    pub fn new(code: i64, message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
            data: None,
        }
    }

    /// Adds structured data.
    pub fn with_data(mut self, data: Value) -> RpcError {
        self.data = Some(data);
        self
    }

    /// `-32602` with a message.
    pub fn invalid_params(message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }

    /// `-32009` with a message.
    pub fn forbidden(message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError::new(PERMISSION_DENIED, message)
    }

    /// `-32008` with a message.
    pub fn not_found(message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError::new(NOT_FOUND, message)
    }

    /// `-32011` with a message.
    pub fn conflict(message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError::new(CONFLICT, message)
    }

    /// `-32043` with a message.
    pub fn limit(message: impl Into<Cow<'static, str>>) -> RpcError {
        RpcError::new(LIMIT, message)
    }

    /// `-32043`: the write path is full and so is the hold for messages that wait for it
    /// (`Limits::held_messages_max`); nothing was applied and a retry may succeed.
    pub fn busy() -> RpcError {
        RpcError::new(
            LIMIT,
            "The host is busy: too many changes are waiting for the disk. Nothing was applied; \
             try again shortly",
        )
    }

    /// `-32603`: the store refused the change; nothing was applied.
    pub fn commit_failed() -> RpcError {
        RpcError::new(
            INTERNAL_ERROR,
            "The host could not save this change; nothing was applied",
        )
    }
}
