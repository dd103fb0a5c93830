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
mod tests {
    use super::*;

    #[test]
    fn plain_json_accepts_only_what_serde_reads_as_the_same_value() {
        let accepted = [
            r#"{"load":"@0000000000000000","pad":"xxxx"}"#,
            r#"{}"#,
            r#"[]"#,
            r#"[ 1 , -0 , 0.5 , -12.25e+10 , 3E-2 , 1e400 , 123456789012345678901234567890 ]"#,
            "{ \"a\" : [ true , false , null ] , \"a\" : { \"b\" : \"\u{7f}\u{e9}\u{1f600}\" } }",
            "\"x\"",
            "0",
            "null",
            "{\"n\":[1,{\"t\":\"\t\"}]}",
            "\"a\\nb\"",
        ];
        for text in accepted {
            let expected = serde_json::from_str::<&RawValue>(text).map(|r| r.get().to_owned());
            if plain_json(text.as_bytes()) {
                assert_eq!(expected.ok().as_deref(), Some(text), "{text}");
            } else {
                // Only escapes and control characters are left to serde on purpose.
                assert!(
                    text.contains('\\') || text.bytes().any(|b| b < 0x20),
                    "{text}"
                );
            }
        }
        let refused = [
            "",
            " 1",
            "1 ",
            "01",
            "-",
            "1.",
            ".5",
            "1e",
            "+1",
            "nul",
            "truex",
            "[1,]",
            "{,}",
            "{\"a\"}",
            "{\"a\":}",
            "{1:2}",
            "[1 2]",
            "\"a\u{1}\"",
            "\"open",
            "{\"a\":1",
            "[",
            "}",
            "1}",
            "[1]]",
        ];
        for text in refused {
            assert!(!plain_json(text.as_bytes()), "{text:?}");
        }
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert!(plain_json(nested(PAYLOAD_DEPTH_FAST_MAX).as_bytes()));
        assert!(!plain_json(nested(PAYLOAD_DEPTH_FAST_MAX + 1).as_bytes()));
    }

    /// `plain_json` against its definition, on generated JSON and on near misses (one or two
    /// bytes replaced, removed or doubled): exactly what `serde_json` reads as one value
    /// spanning the whole text, without a backslash anywhere, at most `PAYLOAD_DEPTH_FAST_MAX`
    /// deep.
    #[test]
    fn plain_json_agrees_with_its_definition_on_generated_text() {
        let definition = |text: &str| {
            serde_json::from_str::<&RawValue>(text).is_ok_and(|raw| raw.get() == text)
                && !text.contains('\\')
                && json_depth(text) <= PAYLOAD_DEPTH_FAST_MAX
        };
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        fn value(out: &mut String, depth: usize, next: &mut impl FnMut(usize) -> usize) {
            const SPACE: [&str; 6] = ["", "", "", " ", "\n\t", "\r "];
            const SCALARS: [&str; 14] = [
                "0",
                "-0",
                "12",
                "-3.25",
                "1e9",
                "2E-7",
                "4.5e+1",
                "true",
                "false",
                "null",
                "\"\"",
                "\"ab\"",
                "\"long string of text, past a word\"",
                "\"\u{e9}\u{1f600}\"",
            ];
            let kind = if depth == 0 { 2 } else { next(4) };
            match kind {
                0 | 1 => {
                    let (open, close) = if kind == 0 { ('[', ']') } else { ('{', '}') };
                    out.push(open);
                    out.push_str(SPACE[next(SPACE.len())]);
                    for item in 0..next(4) {
                        if item > 0 {
                            out.push(',');
                            out.push_str(SPACE[next(SPACE.len())]);
                        }
                        if kind == 1 {
                            out.push_str(["\"k\"", "\"\"", "\"key name\""][next(3)]);
                            out.push_str(SPACE[next(SPACE.len())]);
                            out.push(':');
                            out.push_str(SPACE[next(SPACE.len())]);
                        }
                        value(out, depth - 1, next);
                        out.push_str(SPACE[next(SPACE.len())]);
                    }
                    out.push(close);
                }
                _ => out.push_str(SCALARS[next(SCALARS.len())]),
            }
        }
        const BYTES: &[u8] = b"{}[],:\"\\ \t01-.eE+tfn\x01x";
        let (mut accepted, mut refused) = (0, 0);
        for round in 0..60_000 {
            let mut text = String::new();
            value(&mut text, 1 + next(4), &mut next);
            let mut bytes = text.into_bytes();
            for _ in 0..round % 3 {
                if bytes.is_empty() {
                    break;
                }
                let at = next(bytes.len());
                match next(3) {
                    0 => bytes[at] = BYTES[next(BYTES.len())],
                    1 => drop(bytes.remove(at)),
                    _ => bytes.insert(at, bytes[at]),
                }
            }
            // Mutations may split a multibyte character; only text reaches the scanner.
            let Ok(text) = String::from_utf8(bytes) else {
                continue;
            };
            let plain = plain_json(text.as_bytes());
            assert_eq!(plain, definition(&text), "{text:?}");
            if plain {
                accepted += 1;
            } else {
                refused += 1;
            }
        }
        // Both answers come up often, so the comparison means something.
        assert!(
            accepted > 10_000 && refused > 10_000,
            "{accepted} {refused}"
        );
        for text in [
            "[".repeat(100) + &"]".repeat(100),
            "[".repeat(101) + &"]".repeat(101),
            "{\"a\":".repeat(100) + "1" + &"}".repeat(100),
            "{\"a\":".repeat(101) + "1" + &"}".repeat(101),
        ] {
            assert_eq!(plain_json(text.as_bytes()), definition(&text));
        }
    }

    #[test]
    fn json_depth_counts_containers_not_brackets_in_strings() {
        assert_eq!(json_depth("1"), 0);
        assert_eq!(json_depth(r#""[{""#), 0);
        assert_eq!(json_depth("{}"), 1);
        assert_eq!(json_depth(r#"[{"a":[1]},{"b":2}]"#), 3);
        assert_eq!(json_depth(r#"{"a":"\\\"[[[","b":{}}"#), 2);
        let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
        assert_eq!(json_depth(&nested(200)), 200);
    }

    #[test]
    fn first_special_matches_a_byte_loop() {
        let slow = |b: &[u8]| b.iter().position(|&c| c == b'"' || c == b'\\' || c < 0x20);
        // Every position of every kind of special byte, among bytes on both sides of each
        // threshold (0x1f/0x20, 0x21/0x22/0x23, 0x5b/0x5c/0x5d, 0x7f/0x80, 0xff).
        let fill = [b'a', 0x20, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xa0, 0xff];
        let special = [b'"', b'\\', 0x00, 0x01, 0x1f];
        // Every length across the words (to 40), the 64-byte blocks (to 104) and the 32-byte
        // block (to 136), and a few beyond.
        for len in (0..=140).chain([167, 168, 169, 170, 171, 200]) {
            for &f in &fill {
                let base = vec![f; len];
                assert_eq!(first_special(&base), slow(&base));
                for at in 0..len {
                    for &sp in &special {
                        let mut b = base.clone();
                        b[at] = sp;
                        assert_eq!(first_special(&b), slow(&b), "{b:02x?}");
                        // A second special byte after the first never changes the answer.
                        if at + 1 < len {
                            b[len - 1] = 0x00;
                            assert_eq!(first_special(&b), slow(&b), "{b:02x?}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn classifies_requests_notifications_and_responses() {
        let m = parse(
            br#"{"jsonrpc":"2.0","id":7,"method":"ping","params":{"channel":"ahp-root://"}}"#,
        );
        match m {
            Ok(Message::Request { id, method, params }) => {
                assert_eq!(id.get(), "7");
                assert_eq!(method, "ping");
                assert_eq!(
                    params.map(|p| p.get()),
                    Some(r#"{"channel":"ahp-root://"}"#)
                );
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","method":"unsubscribe"}"#),
            Ok(Message::Notification { .. })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#),
            Ok(Message::Request { .. })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":3,"result":null}"#),
            Ok(Message::Response { outcome: Ok(_), .. })
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":3,"error":{"code":1,"message":"m"}}"#),
            Ok(Message::Response {
                outcome: Err(_),
                ..
            })
        ));
    }

    #[test]
    fn method_names_with_escapes_are_unescaped() {
        match parse(br#"{"jsonrpc":"2.0","id":"a","method":"p\u0069ng"}"#) {
            Ok(Message::Request { method, id, .. }) => {
                assert_eq!(method, "ping");
                assert_eq!(id.get(), "\"a\"");
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn rejects_what_is_not_json_rpc() {
        assert_eq!(parse(b"{nope").unwrap_err(), Malformed::NotJson);
        assert_eq!(parse(b"").unwrap_err(), Malformed::NotJson);
        assert!(matches!(parse(b"[1,2]"), Err(Malformed::NotJsonRpc(_))));
        assert!(matches!(parse(b"42"), Err(Malformed::NotJsonRpc(_))));
        assert!(matches!(
            parse(br#"{"id":1,"method":"ping"}"#),
            Err(Malformed::NotJsonRpc(_))
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
            Err(Malformed::NotJsonRpc(_))
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#),
            Err(Malformed::NotJsonRpc(_))
        ));
        assert!(matches!(
            parse(br#"{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}"#),
            Err(Malformed::NotJsonRpc(_))
        ));
    }

    #[test]
    fn ids_must_be_strict_json() {
        for id in ["1e400", "-1e400", r#""\ud800""#, r#""a\udc00b""#] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            assert_eq!(
                parse(text.as_bytes()).unwrap_err(),
                Malformed::NotJsonRpc("Invalid JSON-RPC request: bad id"),
                "{id}"
            );
        }
        for id in [
            "0",
            "-1.5e300",
            "123456789012345678901234567890",
            r#""\ud83d\ude00""#,
        ] {
            let text = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"ping"}}"#);
            assert!(
                matches!(parse(text.as_bytes()), Ok(Message::Request { .. })),
                "{id}"
            );
        }
    }

    #[test]
    fn text_that_is_not_json_is_a_parse_error_even_after_a_wrong_type() {
        // serde meets the wrong type (or a duplicate key) before the broken syntax.
        for text in [
            r#"{"jsonrpc":5,"#,
            r#"{"method":{"a"}}"#,
            r#"{"method":1,"id":}"#,
            r#"{"id":1,"id":2,"#,
        ] {
            assert_eq!(
                parse(text.as_bytes()).unwrap_err(),
                Malformed::NotJson,
                "{text}"
            );
        }
        assert!(matches!(
            parse(br#"{"jsonrpc":5}"#),
            Err(Malformed::NotJsonRpc(_))
        ));
    }

    #[test]
    fn compact_notifies_are_read_in_one_pass() {
        let text = r#"{"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":"x-client-services://","serviceId":"s1","method":"tick","params":{"n":[1,2]}}}"#;
        let n = parse_compact_notify(text).expect("compact notify");
        let text = text.to_owned();
        assert_eq!(n.channel, "x-client-services://");
        assert_eq!(n.service_id, "s1");
        assert_eq!(n.method, "tick");
        assert_eq!(n.params.get(), r#"{"n":[1,2]}"#);
        // Trailing whitespace is still one message.
        let mut spaced = text;
        spaced.push_str(" \n");
        assert!(parse_compact_notify(&spaced).is_some());
    }

    #[test]
    fn the_canonical_layout_agrees_with_the_serde_reader() {
        let head = r#"{"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":"x-client-services://","serviceId":""#;
        for (id, method, payload, tail) in [
            ("s1", "tick", r#"{"a":[1,{"b":"}}"}]}"#, "}}"),
            ("s1", "t", "1", "}} \n"),
            ("\u{e9}t\u{e9}", "m", r#""x""#, "}}"),
            ("s1", "m", "[1 ]", "}}"),
            ("s1", "m", "null", "}}"),
        ] {
            let text = format!(r#"{head}{id}","method":"{method}","params":{payload}{tail}"#);
            let fast = canonical_notify(&text).expect("canonical");
            let slow: NotifyMessage<'_> = serde_json::from_str(&text).expect("serde");
            assert_eq!(fast.service_id, slow.params.service_id);
            assert_eq!(fast.method, slow.params.method);
            assert_eq!(fast.channel, slow.params.channel);
            assert_eq!(fast.params.get(), slow.params.params.get());
        }
        // Escapes, control characters, a payload followed by more members, deep payloads and
        // trailing garbage are left to serde.
        let deep = format!(
            "{}{}",
            "[".repeat(PAYLOAD_DEPTH_FAST_MAX + 1),
            "]".repeat(PAYLOAD_DEPTH_FAST_MAX + 1)
        );
        for (id, payload, tail) in [
            (r"s\u0031", "1", "}}"),
            ("s\u{1}", "1", "}}"),
            ("s1", r#"1,"x":2"#, "}}"),
            ("s1", deep.as_str(), "}}"),
            ("s1", "1", "}}x"),
            ("s1", "1", "} }"),
            ("s1", "1 1", "}}"),
        ] {
            let text = format!(r#"{head}{id}","method":"m","params":{payload}{tail}"#);
            assert!(canonical_notify(&text).is_none(), "{text}");
        }
    }

    #[test]
    fn anything_but_a_plain_compact_notify_takes_the_general_path() {
        let p = r#"{"channel":"x-client-services://","serviceId":"s1","method":"tick","params":1}"#;
        for text in [
            // A request, not a notification.
            format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p},"id":1}}"#),
            format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","id":1,"params":{p}}}"#),
            // Unknown and duplicate members.
            format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p},"x":1}}"#),
            format!(
                r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p},"params":{p}}}"#
            ),
            format!(
                r#"{{"jsonrpc":"2.0","method":"clientService/notify","method":"ping","params":{p}}}"#
            ),
            // Another layout.
            format!(r#"{{"method":"clientService/notify","jsonrpc":"2.0","params":{p}}}"#),
            format!(r#"{{ "jsonrpc":"2.0","method":"clientService/notify","params":{p}}}"#),
            // Params the notify path refuses, trailing garbage, a cut.
            r#"{"jsonrpc":"2.0","method":"clientService/notify","params":null}"#.to_owned(),
            format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p}}}x"#),
            format!(r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{p}"#),
        ] {
            assert!(parse_compact_notify(&text).is_none(), "{text}");
        }
    }

    #[test]
    fn frames_are_valid_json() {
        let f = error_frame("null", &RpcError::new(-32700, "Invalid \"JSON\""));
        let v: Value = serde_json::from_slice(f.as_bytes()).expect("json");
        assert_eq!(v["error"]["code"], -32700);
        assert!(v["id"].is_null());
        let f = notification_frame("action", r#"{"a":1}"#);
        let v: Value = serde_json::from_slice(f.as_bytes()).expect("json");
        assert_eq!(v["params"]["a"], 1);
    }
}
