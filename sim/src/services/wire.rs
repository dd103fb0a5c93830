//! What the model reads off the wire: the envelopes and params of the client-services
//! messages a connection sends, and the frames the host sends back, classified.

use std::borrow::Cow;

use axhost_core::ConnId;
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

/// One JSON-RPC message, borrowed from its frame.
#[derive(Deserialize)]
pub(super) struct Envelope<'a> {
    #[serde(borrow, default)]
    pub(super) jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    pub(super) params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    pub(super) result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub(super) error: Option<&'a RawValue>,
}

/// Keeps a field that is present even when it is `null` (`"id": null` is still an id).
pub(super) fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<&'de RawValue>, D::Error> {
    <&RawValue>::deserialize(d).map(Some)
}

/// `clientService/request` params, as the contract types them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct CallParams<'a> {
    #[serde(borrow)]
    pub(super) channel: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) service_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) method: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) params: &'a RawValue,
    #[serde(default)]
    pub(super) timeout_ms: Option<u64>,
}

/// `clientService/notify` params, as the contract types them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct NotifyParams<'a> {
    #[serde(borrow)]
    pub(super) channel: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) service_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) method: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) params: &'a RawValue,
}

/// What the host forwards to an owner (`handleRequest` and `notification` params).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Forwarded<'a> {
    #[serde(borrow)]
    pub(super) channel: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) service_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) sender_client_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) method: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) params: &'a RawValue,
}

/// `$/cancelRequest` params.
#[derive(Deserialize)]
pub(super) struct CancelParams<'a> {
    #[serde(borrow)]
    pub(super) channel: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) id: &'a RawValue,
}

/// A JSON-RPC error object as a service sends it.
#[derive(Deserialize)]
pub(super) struct ErrorObject<'a> {
    pub(super) code: i64,
    #[serde(borrow)]
    pub(super) message: Cow<'a, str>,
    #[serde(borrow, default)]
    pub(super) data: Option<&'a RawValue>,
}

/// A client message, owned: what the model needs of it.
#[derive(Clone, Debug)]
pub(super) enum Message {
    Request {
        id: String,
        method: String,
        params: Option<String>,
    },
    Notification {
        method: String,
        params: Option<String>,
    },
    Response {
        id: String,
        outcome: Result<String, String>,
    },
    /// Answered with an `id: null` error, or not at all.
    Malformed,
}

/// JSON-RPC ids are numbers, strings or null.
pub(super) fn valid_id(id: &RawValue) -> bool {
    matches!(
        id.get().as_bytes().first(),
        Some(b'"' | b'-' | b'0'..=b'9' | b'n')
    )
}

pub(super) fn parse_message(text: &[u8]) -> Message {
    if text.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Message::Malformed;
    }
    let Ok(env) = serde_json::from_slice::<Envelope<'_>>(text) else {
        return Message::Malformed;
    };
    if env.jsonrpc.as_deref() != Some("2.0") {
        return Message::Malformed;
    }
    let params = env.params.map(|p| p.get().to_owned());
    match (env.method, env.id) {
        (Some(method), Some(id)) if valid_id(id) => Message::Request {
            id: id.get().to_owned(),
            method: method.into_owned(),
            params,
        },
        (Some(method), None) => Message::Notification {
            method: method.into_owned(),
            params,
        },
        (None, Some(id)) => match (env.result, env.error) {
            (Some(r), None) => Message::Response {
                id: id.get().to_owned(),
                outcome: Ok(r.get().to_owned()),
            },
            (None, Some(e)) => Message::Response {
                id: id.get().to_owned(),
                outcome: Err(e.get().to_owned()),
            },
            _ => Message::Malformed,
        },
        _ => Message::Malformed,
    }
}

/// One host output, as the model sees it.
#[derive(Clone, Debug)]
pub(super) enum Sent {
    /// A response: to the current input, or a relayed request's completion.
    Answer {
        conn: ConnId,
        id: String,
        outcome: Result<String, String>,
    },
    HandleRequest {
        conn: ConnId,
        id: String,
        params: String,
    },
    Notification {
        conn: ConnId,
        params: String,
    },
    Cancel {
        conn: ConnId,
        params: String,
    },
    Close {
        conn: ConnId,
    },
    /// Anything else (state envelopes, root notifications).
    Other,
}

pub(super) fn classify(conn: ConnId, frame: &[u8]) -> Sent {
    let Ok(env) = serde_json::from_slice::<Envelope<'_>>(frame) else {
        return Sent::Other;
    };
    let params = || env.params.map(|p| p.get().to_owned()).unwrap_or_default();
    match (env.method.as_deref(), env.id) {
        (Some("clientService/handleRequest"), Some(id)) => Sent::HandleRequest {
            conn,
            id: id.get().to_owned(),
            params: params(),
        },
        (Some("clientService/notification"), None) => Sent::Notification {
            conn,
            params: params(),
        },
        (Some("$/cancelRequest"), None) => Sent::Cancel {
            conn,
            params: params(),
        },
        (None, Some(id)) => Sent::Answer {
            conn,
            id: id.get().to_owned(),
            outcome: match (env.result, env.error) {
                (Some(r), _) => Ok(r.get().to_owned()),
                (None, e) => Err(e.map(|e| e.get().to_owned()).unwrap_or_default()),
            },
        },
        _ => Sent::Other,
    }
}

pub(super) fn error_code(raw: &str) -> Option<i64> {
    serde_json::from_str::<Value>(raw)
        .ok()?
        .get("code")
        .and_then(Value::as_i64)
}

/// A JSON string literal's largest encoded length.
pub(super) fn escaped_max(s: &str) -> usize {
    2 + 6 * s.len()
}
