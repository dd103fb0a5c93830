//! JSON-RPC 2.0 envelopes: parsed borrowed (method and id decoded, params kept as raw JSON
//! text) and encoded straight into frames.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::{RpcError, INVALID_REQUEST, PARSE_ERROR};
use crate::net::output::Frame;

/// One inbound JSON-RPC message, borrowing from the frame it came in.
#[derive(Debug)]
pub enum Message<'a> {
    /// Has `method` and `id`: must be answered.
    Request {
        /// Raw JSON text of the id, echoed as received.
        id: &'a RawValue,
        /// Method name, unescaped.
        method: Cow<'a, str>,
        /// Raw params, if any.
        params: Option<&'a RawValue>,
    },
    /// Has `method`, no `id`: never answered.
    Notification {
        /// Method name, unescaped.
        method: Cow<'a, str>,
        /// Raw params, if any.
        params: Option<&'a RawValue>,
    },
    /// Has `id` and `result` or `error`: a reply to a host-initiated request.
    Response {
        /// Raw JSON text of the id.
        id: &'a RawValue,
        /// `Ok(result)` or `Err(error object)`, both raw.
        outcome: Result<&'a RawValue, &'a RawValue>,
    },
}

/// Why a frame is not a usable message. Both are answered with `id: null`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Malformed {
    /// Not JSON (`-32700`).
    NotJson,
    /// JSON, but not a JSON-RPC 2.0 message (`-32600`); the id if one could be read.
    NotJsonRpc(&'static str),
}

impl Malformed {
    /// The error to answer with.
    pub fn to_error(&self) -> RpcError {
        match self {
            Malformed::NotJson => RpcError::new(PARSE_ERROR, "Invalid JSON"),
            Malformed::NotJsonRpc(why) => RpcError::new(INVALID_REQUEST, *why),
        }
    }
}

#[derive(Deserialize)]
struct RawEnvelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Option<Cow<'a, str>>,
    #[serde(borrow, default, deserialize_with = "present")]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, deserialize_with = "present")]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

/// Keeps a field that is present, even when it is `null` (plain `Option` would read `null`
/// as absent, and `"id": null` is still a request).
fn present<'de, D>(d: D) -> Result<Option<&'de RawValue>, D::Error>
where
    D: Deserializer<'de>,
{
    <&RawValue>::deserialize(d).map(Some)
}

/// Parses one frame into a message, or says why it is not one.
pub fn parse(text: &[u8]) -> Result<Message<'_>, Malformed> {
    if let Some(malformed) = not_one_object(text) {
        return Err(malformed);
    }
    classify(text, serde_json::from_slice(text))
}

/// [`parse`] for text known to be UTF-8 (a WebSocket text message): the same answers, without
/// checking UTF-8 again for every string and raw value.
pub fn parse_text(text: &str) -> Result<Message<'_>, Malformed> {
    if let Some(malformed) = not_one_object(text.as_bytes()) {
        return Err(malformed);
    }
    classify(text.as_bytes(), serde_json::from_str(text))
}

/// Batches and scalars are JSON but not one JSON-RPC message.
fn not_one_object(text: &[u8]) -> Option<Malformed> {
    let first = text.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'{') {
        return None;
    }
    Some(
        if serde_json::from_slice::<serde::de::IgnoredAny>(text).is_ok() {
            Malformed::NotJsonRpc("Invalid JSON-RPC request: expected one object (no batches)")
        } else {
            Malformed::NotJson
        },
    )
}

fn classify<'a>(
    text: &'a [u8],
    read: serde_json::Result<RawEnvelope<'a>>,
) -> Result<Message<'a>, Malformed> {
    let env = match read {
        Ok(env) => env,
        Err(e) if e.is_syntax() || e.is_eof() => return Err(Malformed::NotJson),
        // serde stops at the first wrong type or duplicate key, before it has seen the rest of
        // the text; JSON-RPC answers text that is not JSON with -32700 whatever comes first.
        // This second pass runs only on the error path.
        Err(_) if serde_json::from_slice::<serde::de::IgnoredAny>(text).is_err() => {
            return Err(Malformed::NotJson)
        }
        Err(_) => return Err(Malformed::NotJsonRpc("Invalid JSON-RPC request")),
    };
    if env.jsonrpc.as_deref() != Some("2.0") {
        return Err(Malformed::NotJsonRpc(
            "Invalid JSON-RPC request: jsonrpc must be \"2.0\"",
        ));
    }
    match (env.method, env.id) {
        (Some(method), Some(id)) => {
            if !valid_id(id) {
                return Err(Malformed::NotJsonRpc("Invalid JSON-RPC request: bad id"));
            }
            Ok(Message::Request {
                id,
                method,
                params: env.params,
            })
        }
        (Some(method), None) => Ok(Message::Notification {
            method,
            params: env.params,
        }),
        (None, Some(id)) => match (env.result, env.error) {
            (Some(r), None) => Ok(Message::Response { id, outcome: Ok(r) }),
            (None, Some(e)) => Ok(Message::Response {
                id,
                outcome: Err(e),
            }),
            _ => Err(Malformed::NotJsonRpc("Invalid JSON-RPC response")),
        },
        (None, None) => Err(Malformed::NotJsonRpc("Invalid JSON-RPC request: no method")),
    }
}

/// JSON-RPC ids are numbers, strings or null, and the host echoes them verbatim, so it accepts
/// only ids every JSON reader can take back: numbers within f64 range (not `1e400`) and strings
/// without lone surrogate escapes (not `"\ud800"`). The raw id already passed the grammar; this
/// decodes it once more, which costs little for the short ids clients use.
fn valid_id(id: &RawValue) -> bool {
    let text = id.get();
    match text.as_bytes().first() {
        Some(b'"') => serde_json::from_str::<Cow<'_, str>>(text).is_ok(),
        Some(b'-' | b'0'..=b'9') => serde_json::from_str::<serde_json::Number>(text).is_ok(),
        Some(b'n') => true,
        _ => false,
    }
}

/// `clientService/notify` params, borrowed from the frame.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NotifyParams<'a> {
    /// Must be the catalog channel.
    #[serde(borrow)]
    pub channel: Cow<'a, str>,
    /// The target service.
    #[serde(borrow)]
    pub service_id: Cow<'a, str>,
    /// The service's own method name.
    #[serde(borrow)]
    pub method: Cow<'a, str>,
    /// The payload, forwarded byte for byte.
    #[serde(borrow)]
    pub params: RawJson<'a>,
}

/// JSON text borrowed from a frame, known to be one valid value: read by `serde_json` (as a
/// `RawValue`) or checked by the notify fast path's own scanner ([`plain_json`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawJson<'a>(&'a str);

impl<'a> RawJson<'a> {
    /// The JSON text.
    pub fn get(&self) -> &'a str {
        self.0
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for RawJson<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw: &'de RawValue = Deserialize::deserialize(d)?;
        Ok(RawJson(raw.get()))
    }
}

/// The envelope's members first, in this order, without whitespace: how serde-built messages
/// come out (`axhost notify` and `axhost_io::client`, whose `json!` sorts keys; the load tool;
/// struct serialization in declaration order).
const COMPACT_NOTIFY_PREFIX: &[u8] = br#"{"jsonrpc":"2.0","method":"clientService/notify","#;

/// A whole `clientService/notify` message with nothing else in it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NotifyMessage<'a> {
    #[serde(borrow)]
    jsonrpc: Cow<'a, str>,
    #[serde(borrow)]
    method: Cow<'a, str>,
    #[serde(borrow)]
    params: NotifyParams<'a>,
}

/// The notification fast path: a message in the compact layout is read in one pass straight
/// into its notify params, instead of the envelope first (scanning the payload once to keep
/// `params` raw) and the params again (scanning it a second time).
///
/// `None` sends the message down the general path, which then decides everything: any other
/// layout, an unknown or duplicate member, an `id` (a request), a wrong type, bad syntax. What
/// this accepts, the general path would also read as a notify with the same params: the same
/// `serde_json` reader meets the same bytes at the same nesting depth, and anything that is not
/// exactly `jsonrpc` + `method` + `params` is refused here (`deny_unknown_fields`).
pub fn parse_compact_notify(text: &str) -> Option<NotifyParams<'_>> {
    if !text.as_bytes().starts_with(COMPACT_NOTIFY_PREFIX) {
        return None;
    }
    if let Some(params) = canonical_notify(text) {
        return Some(params);
    }
    let message: NotifyMessage<'_> = serde_json::from_str(text).ok()?;
    (message.jsonrpc == "2.0"
        && message.method == "clientService/notify"
        && payload_depth_ok(message.params.params.get()))
    .then_some(message.params)
}

/// Whether a client-service payload read by `serde_json` (raw, so with no depth limit) nests
/// at most `SERVICE_PAYLOAD_DEPTH_MAX` levels.
pub(crate) fn payload_depth_ok(payload: &str) -> bool {
    json_depth(payload) <= crate::limits::SERVICE_PAYLOAD_DEPTH_MAX
}

/// The canonical notify, byte for byte: `{"jsonrpc":"2.0","method":"clientService/notify",
/// "params":{"channel":"x-client-services://","serviceId":"ID","method":"M","params":P}}`
/// (no whitespace but after the end). The layout is matched by hand and only the payload `P` goes
/// through `serde_json`, once, to validate it and take it raw: serde spent more on the envelope's
/// fixed members than on the payload (perf under `axhost-load` 64→64).
///
/// The id and method must be plain (no escapes, no control characters) and the payload shallow
/// (it is read here two levels higher than in the whole message, and `serde_json` limits nesting
/// to 128 levels); anything else returns `None` and the message takes the slower paths, which
/// decide. So this accepts nothing the general path would read differently.
fn canonical_notify(text: &str) -> Option<NotifyParams<'_>> {
    const HEAD: &str = r#"{"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":"x-client-services://","serviceId":""#;
    let rest = text.strip_prefix(HEAD)?;
    let (service_id, rest) = plain_string(rest)?;
    let rest = rest.strip_prefix(r#","method":""#)?;
    let (method, rest) = plain_string(rest)?;
    let rest = rest.strip_prefix(r#","params":"#)?;
    let payload = rest
        .trim_end_matches([' ', '\t', '\n', '\r'])
        .strip_suffix("}}")?;
    if !plain_json(payload.as_bytes()) {
        return None;
    }
    Some(NotifyParams {
        channel: Cow::Borrowed(crate::channel::CATALOG),
        service_id: Cow::Borrowed(service_id),
        method: Cow::Borrowed(method),
        params: RawJson(payload),
    })
}

/// Deepest payload nesting the scanner accepts: the host's bound on client-service payloads,
/// so a payload the fast path accepts never needs a second look. Deeper payloads take the serde
/// path, which refuses them by `json_depth`.
const PAYLOAD_DEPTH_FAST_MAX: usize = crate::limits::SERVICE_PAYLOAD_DEPTH_MAX;

/// Whether `text` is exactly one JSON value (RFC 8259) with no whitespace around it, no string
/// escapes and at most `PAYLOAD_DEPTH_FAST_MAX` levels of nesting.
///
/// The notify fast path's payload check: `serde_json` reading the payload into a `RawValue` was
/// 13% of the host at 64->64 (perf), most of it per-token overhead around its string scan.
/// Anything this refuses is not necessarily invalid: the message just takes the serde path,
/// which decides. Everything this accepts, `serde_json` accepts as the same raw text (the
/// `envelope` fuzz target checks the two agree).
pub(crate) fn plain_json(text: &[u8]) -> bool {
    let mut scan = Scan { b: text, i: 0 };
    scan.value(PAYLOAD_DEPTH_FAST_MAX).is_some() && scan.i == text.len()
}

/// A recursive-descent JSON scanner that validates and keeps nothing.
struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl Scan<'_> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn whitespace(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.i += 1)
    }

    /// One value starting exactly at `i`; `depth` more levels of nesting are allowed.
    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'"' => self.string(),
            b'{' => self.container(b'}', depth, |scan, depth| {
                scan.string()?;
                scan.whitespace();
                scan.eat(b':')?;
                scan.whitespace();
                scan.value(depth)
            }),
            b'[' => self.container(b']', depth, Scan::value),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number(),
            _ => None,
        }
    }

    /// An object or array at `i`: its opening byte, then `item`s separated by commas, then
    /// `close`. Items get one level less of nesting.
    fn container(
        &mut self,
        close: u8,
        depth: usize,
        item: impl Fn(&mut Self, usize) -> Option<()>,
    ) -> Option<()> {
        let depth = depth.checked_sub(1)?;
        self.i += 1;
        self.whitespace();
        if self.eat(close).is_some() {
            return Some(());
        }
        loop {
            item(self, depth)?;
            self.whitespace();
            match self.peek()? {
                b',' => {
                    self.i += 1;
                    self.whitespace();
                }
                b if b == close => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// A string without escapes or control characters (anything else: `None`).
    fn string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        let end = first_special(&self.b[self.i..])?;
        self.i += end;
        self.eat(b'"')
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.b.get(self.i..end)? == word).then(|| self.i = end)
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Option<()> {
        let _ = self.eat(b'-');
        match self.peek()? {
            b'0' => self.i += 1,
            b'1'..=b'9' => self.digits(),
            _ => return None,
        }
        if self.eat(b'.').is_some() {
            self.digits1()?;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            if matches!(self.peek(), Some(b'+' | b'-')) {
                self.i += 1;
            }
            self.digits1()?;
        }
        Some(())
    }

    fn digits(&mut self) {
        while matches!(self.peek(), Some(b'0'..=b'9')) {
            self.i += 1;
        }
    }

    fn digits1(&mut self) -> Option<()> {
        let start = self.i;
        self.digits();
        (self.i > start).then_some(())
    }
}

/// Splits `"text"...` (the opening quote already consumed) at its closing quote, if the string
/// needs no decoding: no backslash and no control character (which JSON forbids raw).
fn plain_string(rest: &str) -> Option<(&str, &str)> {
    let end = first_special(rest.as_bytes())?;
    if rest.as_bytes()[end] != b'"' {
        return None;
    }
    Some((&rest[..end], &rest[end + 1..]))
}

/// The index of the first `"`, `\\` or control character.
///
/// Long strings (payload text) go 64 and then 32 bytes at a time with a test that has no early
/// exit, which the compiler turns into vector compares; the block that holds a match, and short
/// strings, go eight bytes at a time. A byte loop with an early exit was most of the hand
/// matcher's time on 36-byte ids, and `serde_json` on the payload was 12.7% of the host.
fn first_special(bytes: &[u8]) -> Option<usize> {
    fn special(b: u8) -> bool {
        (b == b'"') | (b == b'\\') | (b < 0x20)
    }
    // Most strings end early (member names, ids, method names; `bytes` runs to the end of the
    // input, not of the string): words first over the first 40 bytes, which covers a 36-byte id
    // and its closing quote, so a short string costs no 64-byte block test and rescan.
    let head = bytes.len().min(SHORT_STRING_BYTES);
    if let Some(i) = first_special_by_words(&bytes[..head]) {
        return Some(i);
    }
    let mut at = head;
    for width in [64, 32] {
        while bytes.len() - at >= width {
            let block = &bytes[at..at + width];
            if block.iter().fold(false, |hit, &b| hit | special(b)) {
                return first_special_by_words(block).map(|i| at + i);
            }
            at += width;
        }
    }
    first_special_by_words(&bytes[at..]).map(|i| at + i)
}

/// How far [`first_special`] looks a word at a time before it switches to wide blocks.
const SHORT_STRING_BYTES: usize = 40;

/// [`first_special`] eight bytes at a time.
///
/// Per word, `(x - 0x01..01 * c) & !x & 0x80..80` flags bytes below `c`, and applied to `x ^ c`
/// flags bytes equal to `c`. A borrow can flag bytes above a true match, never below one, so
/// the lowest flag is exact.
fn first_special_by_words(bytes: &[u8]) -> Option<usize> {
    const ONES: u64 = u64::MAX / 255;
    const HIGHS: u64 = ONES << 7;
    let mut words = bytes.chunks_exact(8);
    let mut at = 0;
    for chunk in &mut words {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let x = u64::from_le_bytes(word);
        let control = x.wrapping_sub(ONES * 0x20) & !x;
        let q = x ^ (ONES * u64::from(b'"'));
        let quote = q.wrapping_sub(ONES) & !q;
        let b = x ^ (ONES * u64::from(b'\\'));
        let backslash = b.wrapping_sub(ONES) & !b;
        let hits = (control | quote | backslash) & HIGHS;
        if hits != 0 {
            return Some(at + hits.trailing_zeros() as usize / 8);
        }
        at += 8;
    }
    words
        .remainder()
        .iter()
        .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
        .map(|i| at + i)
}

/// The deepest array/object nesting in valid JSON text, the outermost container being level 1
/// (brackets inside strings do not count). For values read raw (`RawValue` keeps no depth limit)
/// that the host will store or wrap in frames of its own. One pass, no allocation.
pub(crate) fn json_depth(text: &str) -> usize {
    let (mut depth, mut max, mut in_string, mut escaped) = (0usize, 0usize, false, false);
    for b in text.bytes() {
        if in_string {
            match (escaped, b) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'[' | b'{' => {
                depth += 1;
                max = max.max(depth);
            }
            b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// `{"jsonrpc":"2.0","id":ID,"result":RESULT}` where `result` is JSON text.
pub fn result_frame(id: &str, result: &str) -> Frame {
    let mut out = Vec::with_capacity(40 + id.len() + result.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b",\"result\":");
    out.extend_from_slice(result.as_bytes());
    out.push(b'}');
    Frame::new(out)
}

/// `{"jsonrpc":"2.0","id":ID,"error":{...}}`; `id` is raw JSON (`null` when unknown).
pub fn error_frame(id: &str, error: &RpcError) -> Frame {
    let mut body = serde_json::Map::new();
    body.insert("code".into(), Value::from(error.code));
    body.insert("message".into(), Value::from(error.message.as_ref()));
    if let Some(data) = &error.data {
        body.insert("data".into(), data.clone());
    }
    let body = Value::Object(body).to_string();
    let mut out = Vec::with_capacity(40 + id.len() + body.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(b",\"error\":");
    out.extend_from_slice(body.as_bytes());
    out.push(b'}');
    Frame::new(out)
}

/// `{"jsonrpc":"2.0","method":METHOD,"params":PARAMS}` where `params` is JSON text.
pub fn notification_frame(method: &str, params: &str) -> Frame {
    let method = Value::from(method).to_string();
    let mut out = Vec::with_capacity(40 + method.len() + params.len());
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"method\":");
    out.extend_from_slice(method.as_bytes());
    out.extend_from_slice(b",\"params\":");
    out.extend_from_slice(params.as_bytes());
    out.push(b'}');
    Frame::new(out)
}

/// The `action` notification that echoes a refused `dispatchAction` to its sender only:
/// `action` is the action as received (raw JSON, already known to nest within bounds, or
/// `null`), `server_seq` the host's current number.
pub fn rejection_frame(
    channel: &str,
    action: &str,
    client_id: &str,
    client_seq: u64,
    server_seq: u64,
    reason: &str,
) -> Frame {
    let action: Value = serde_json::from_str(action).unwrap_or(Value::Null);
    let params = serde_json::json!({
        "channel": channel,
        "action": action,
        "serverSeq": server_seq,
        "origin": { "clientId": client_id, "clientSeq": client_seq },
        "rejectionReason": reason,
    });
    notification_frame("action", &params.to_string())
}

#[cfg(test)]
mod tests;
