//! Target `envelope`: any bytes straight into `axhost_core::jsonrpc::parse`.
//!
//! Shared by the `envelope` fuzz target and `tests/fuzz_corpus.rs`. Checks:
//! - no panic, whatever the bytes;
//! - every `Err` is answered with `-32700` (`NotJson`) or `-32600` (`NotJsonRpc`) through
//!   `Malformed::to_error`, and the answer built with `jsonrpc::error_frame` is JSON that parses
//!   back as an error response with `id: null` and that code;
//! - `NotJson` only for bytes `serde_json` cannot read as a JSON value, `NotJsonRpc` only for
//!   bytes that are JSON by the grammar (JSON-RPC's -32700 is for text that is not JSON);
//! - a parsed message came from bytes that are JSON (syntax, as RFC 8259 reads it);
//! - a request's id is strict JSON (a number in f64 range, a string without lone surrogates, or
//!   null), so clients can read every frame that echoes it; echoed exactly by
//!   `result_frame` / `error_frame`, whose frames parse back as responses with the same id;
//! - a method name and params re-encoded with `notification_frame` parse back unchanged;
//! - raw params, results and error objects are JSON text (`params: null` reads as absent);
//! - `parse_text` (what the host uses for WebSocket text) answers exactly as `parse` for UTF-8;
//! - the notify fast path (`parse_compact_notify`) accepts only what the general path reads as a
//!   `clientService/notify` notification, with the same channel, service, method and payload.

use axhost_core::error::{RpcError, INVALID_REQUEST, METHOD_NOT_FOUND, PARSE_ERROR};
use axhost_core::jsonrpc::{self, Malformed, Message};
use serde::de::IgnoredAny;
use serde_json::Value;

/// Whether `bytes` is JSON by the grammar (numbers of any size, any escapes, any depth).
pub fn is_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<IgnoredAny>(bytes).is_ok()
}

/// Whether `serde_json::Value` can hold `bytes` (the stricter reading most clients use: finite
/// numbers, no lone surrogates, at most 128 levels of nesting).
pub fn is_strict_json(bytes: &[u8]) -> bool {
    serde_json::from_slice::<Value>(bytes).is_ok()
}

/// What `jsonrpc::parse` made of a frame, owned, for comparisons.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// A request: raw id, decoded method, raw params.
    Request {
        /// Raw id text.
        id: String,
        /// Method, unescaped.
        method: String,
        /// Raw params.
        params: Option<String>,
    },
    /// A notification.
    Notification {
        /// Method, unescaped.
        method: String,
        /// Raw params.
        params: Option<String>,
    },
    /// A response with `result` (`Ok`) or `error` (`Err`), both raw.
    Response {
        /// Raw id text.
        id: String,
        /// Raw result or error.
        outcome: Result<String, String>,
    },
    /// Not JSON (`-32700`).
    NotJson,
    /// Not JSON-RPC (`-32600`).
    NotJsonRpc,
}

/// Parses and owns the answer.
pub fn classify(bytes: &[u8]) -> Parsed {
    owned(jsonrpc::parse(bytes))
}

/// [`classify`] through `jsonrpc::parse_text`, the reader the host uses.
pub fn classify_text(text: &str) -> Parsed {
    owned(jsonrpc::parse_text(text))
}

fn owned(parsed: Result<Message<'_>, Malformed>) -> Parsed {
    match parsed {
        Ok(Message::Request { id, method, params }) => Parsed::Request {
            id: id.get().to_owned(),
            method: method.into_owned(),
            params: params.map(|p| p.get().to_owned()),
        },
        Ok(Message::Notification { method, params }) => Parsed::Notification {
            method: method.into_owned(),
            params: params.map(|p| p.get().to_owned()),
        },
        Ok(Message::Response { id, outcome }) => Parsed::Response {
            id: id.get().to_owned(),
            outcome: outcome
                .map(|r| r.get().to_owned())
                .map_err(|e| e.get().to_owned()),
        },
        Err(Malformed::NotJson) => Parsed::NotJson,
        Err(Malformed::NotJsonRpc(_)) => Parsed::NotJsonRpc,
    }
}

/// The `envelope` target: checks every property above for one input.
pub fn check(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        // The host reads WebSocket text (UTF-8) with `parse_text`; it must agree with `parse`.
        assert_eq!(
            classify_text(text),
            classify(data),
            "parse_text and parse disagree"
        );
        check_compact_notify(text);
    }
    match jsonrpc::parse(data) {
        Err(malformed) => check_malformed(data, &malformed),
        Ok(message) => {
            assert!(is_json(data), "parse accepted bytes that are not JSON");
            check_message(data, &message);
        }
    }
}

fn check_malformed(data: &[u8], malformed: &Malformed) {
    let error = malformed.to_error();
    match malformed {
        Malformed::NotJson => {
            assert_eq!(error.code, PARSE_ERROR);
            // Not `!is_json`: a lone surrogate escape in `method` is grammatical JSON that no
            // Rust string can hold, and serde reports it as a syntax error.
            assert!(
                !is_strict_json(data),
                "NotJson for bytes serde_json reads as a JSON value"
            );
        }
        Malformed::NotJsonRpc(why) => {
            assert_eq!(error.code, INVALID_REQUEST);
            assert!(is_json(data), "NotJsonRpc for bytes that are not JSON");
            assert!(!why.is_empty());
        }
    }
    assert!(!error.message.is_empty());
    check_error_frame("null", &error);
}

/// `error_frame(id, error)` is strict JSON (the id is), parses back as an error response with
/// this id, code and message.
fn check_error_frame(id: &str, error: &RpcError) {
    let frame = jsonrpc::error_frame(id, error);
    assert!(is_json(frame.as_bytes()), "error frame is not JSON");
    if is_strict_json(id.as_bytes()) {
        let v: Value = serde_json::from_slice(frame.as_bytes()).expect("strict error frame");
        assert_eq!(v["jsonrpc"], "2.0");
        assert_eq!(v["error"]["code"], error.code);
        assert_eq!(v["error"]["message"], error.message.as_ref());
    }
    match jsonrpc::parse(frame.as_bytes()) {
        Ok(Message::Response {
            id: back,
            outcome: Err(_),
        }) => assert_eq!(back.get(), id, "error frame changed the id"),
        other => panic!("error frame reads back as {other:?}"),
    }
}

fn check_message(data: &[u8], message: &Message<'_>) {
    match message {
        Message::Request { id, method, params } => {
            let id = id.get();
            check_raw(data, id);
            assert!(
                matches!(id.as_bytes()[0], b'"' | b'-' | b'0'..=b'9' | b'n'),
                "request id {id:?} is not a number, string or null"
            );
            assert!(
                is_strict_json(id.as_bytes()),
                "request id {id:?} is not strict JSON"
            );
            match jsonrpc::parse(jsonrpc::result_frame(id, "null").as_bytes()) {
                Ok(Message::Response {
                    id: back,
                    outcome: Ok(result),
                }) => {
                    assert_eq!(back.get(), id);
                    assert_eq!(result.get(), "null");
                }
                other => panic!("result frame reads back as {other:?}"),
            }
            check_error_frame(id, &RpcError::new(METHOD_NOT_FOUND, "Unknown method"));
            check_method(data, method, params.map(|p| p.get()));
        }
        Message::Notification { method, params } => {
            check_method(data, method, params.map(|p| p.get()));
        }
        Message::Response { id, outcome } => {
            check_raw(data, id.get());
            match outcome {
                Ok(raw) | Err(raw) => check_raw(data, raw.get()),
            }
            if let Err(raw) = outcome {
                assert_ne!(raw.get(), "null", "error: null is not an error object");
            }
        }
    }
}

fn check_method(data: &[u8], method: &str, params: Option<&str>) {
    if let Some(p) = params {
        check_raw(data, p);
        assert_ne!(p, "null", "params: null must read as absent");
    }
    let frame = jsonrpc::notification_frame(method, params.unwrap_or("{}"));
    match jsonrpc::parse(frame.as_bytes()) {
        Ok(Message::Notification {
            method: back,
            params: p,
        }) => {
            assert_eq!(back, method, "method changed on re-encoding");
            assert_eq!(p.map(|p| p.get()), Some(params.unwrap_or("{}")));
        }
        other => panic!("notification frame reads back as {other:?}"),
    }
}

/// A raw value borrowed from the frame: JSON, with no whitespace around it, taken from `data`.
fn check_raw(data: &[u8], raw: &str) {
    assert!(is_json(raw.as_bytes()), "raw value {raw:?} is not JSON");
    assert!(!raw.is_empty());
    let first = raw.as_bytes()[0];
    let last = raw.as_bytes()[raw.len() - 1];
    assert!(!first.is_ascii_whitespace() && !last.is_ascii_whitespace());
    let start = raw.as_ptr() as usize;
    let base = data.as_ptr() as usize;
    assert!(
        start >= base && start + raw.len() <= base + data.len(),
        "raw value not borrowed from the frame"
    );
}

/// What the one-pass notify reader accepts, the general path reads the same way.
fn check_compact_notify(text: &str) {
    let Some(fast) = jsonrpc::parse_compact_notify(text) else {
        return;
    };
    let params = match jsonrpc::parse_text(text) {
        Ok(Message::Notification { method, params }) if method == "clientService/notify" => params,
        other => panic!("the fast path took a notify the general path reads as {other:?}"),
    };
    let params = params.expect("the general path lost the params");
    let slow: jsonrpc::NotifyParams<'_> =
        serde_json::from_str(params.get()).expect("the general path refuses the params");
    assert_eq!(fast.channel, slow.channel);
    assert_eq!(fast.service_id, slow.service_id);
    assert_eq!(fast.method, slow.method);
    assert_eq!(fast.params.get(), slow.params.get());
}
