//! Target `envelope_structured`: messages generated with a known meaning, serialized here, then
//! parsed by `axhost_core::jsonrpc::parse`; the answer must be the meaning.
//!
//! The generator picks the members of one JSON object (the six JSON-RPC keys, each possibly
//! duplicated, escaped, `null` or of the wrong type, plus unknown keys), their values (strings
//! with every escape form including surrogate pairs and lone surrogates, numbers of any size,
//! deep nesting, bad tokens), their order, and the whitespace between every token; then wraps
//! the object (leading/trailing whitespace, trailing garbage, truncation, a batch, a scalar).
//!
//! The model of what `jsonrpc::parse` must answer, in the order serde reads the members:
//! - a known key seen twice is `-32600` when its second occurrence is read;
//! - `jsonrpc` and `method` must be strings or `null` (`null` reads as absent), else `-32600`;
//!   a lone surrogate escape in them is `-32700` (not representable as a Rust string);
//! - `id` and `result` keep any value (`null` included); `params` and `error` read `null` as
//!   absent; unknown keys are skipped whatever their (syntactically valid) value;
//! - a bad token anywhere is `-32700`, except in `jsonrpc`/`method` where one that opens an
//!   array or object or starts like a number is first a wrong type (`-32600`); a number there
//!   beyond f64 range is `-32700` (serde fails to read it while naming the wrong type);
//! - an error of type (`-32600` above) in text that is not JSON as a whole (a bad token further
//!   on, a cut, trailing garbage) is `-32700`: JSON-RPC calls for a parse error whenever the text
//!   is not JSON, whatever serde met first;
//! - then: `jsonrpc` must be `"2.0"`; `method` + `id` is a request (the id must be a number in
//!   f64 range, a string without lone surrogates, or null: the host echoes it, so every JSON
//!   reader must be able to take it back), `method` alone a notification, `id` with exactly one
//!   of `result`/`error` a response; anything else `-32600`.
//!
//! Raw ids, params, results and errors must come back byte for byte as generated; methods
//! decoded. Every generated input also goes through the byte-level checks of `envelope`.

use arbitrary::{Result, Unstructured};

use crate::envelope::{self, Parsed};

/// Method names worth generating often: every method the host knows, and near misses.
const METHODS: &[&str] = &[
    "ping",
    "initialize",
    "reconnect",
    "subscribe",
    "unsubscribe",
    "createSession",
    "listSessions",
    "dispatchAction",
    "resourceRead",
    "client/registerService",
    "client/updateService",
    "client/unregisterService",
    "clientService/request",
    "clientService/notify",
    "$/cancelRequest",
    "Ping",
    "ping ",
    "",
    "rpc.discover",
];

/// Unknown keys worth generating: near misses of the known ones.
const UNKNOWN_KEYS: &[&str] = &[
    "Method", "ID", "Id", "jsonRPC", "params ", " id", "result_", "errors", "x", "", "meta",
];

/// Characters that stress escaping.
const TRICKY: &[char] = &[
    '"',
    '\\',
    '/',
    '\u{0}',
    '\u{8}',
    '\u{c}',
    '\n',
    '\r',
    '\t',
    '\u{1f}',
    '\u{7f}',
    '\u{80}',
    '\u{2028}',
    '\u{2029}',
    '\u{feff}',
    '\u{fffd}',
    '\u{ffff}',
    'é',
    '€',
    '😀',
    '\u{10ffff}',
];

/// Tokens that make any document invalid JSON.
const BAD_TOKENS: &[&str] = &[
    "01",
    "1.",
    "+1",
    ".5",
    "NaN",
    "-",
    "1e",
    "tru",
    "nul",
    "'a'",
    "[1,]",
    "{\"a\"}",
    "{,}",
    "0x1",
    "\"a\\x\"",
    "\"\\u12\"",
];

/// A generated JSON value: its text, and what a reader must make of it.
#[derive(Debug, Clone)]
struct Val {
    text: String,
    kind: Kind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Kind {
    Null,
    /// A string; `None` when it holds a lone surrogate escape.
    Str(Option<String>),
    /// A number, boolean, array or object.
    Other,
    /// Not JSON.
    Bad,
}

/// Where the generator keeps its whitespace choices.
struct Gen<'u, 'a> {
    u: &'u mut Unstructured<'a>,
}

impl Gen<'_, '_> {
    fn below(&mut self, n: u32) -> Result<u32> {
        self.u.int_in_range(0..=n.saturating_sub(1))
    }

    /// JSON whitespace between two tokens: usually none.
    fn ws(&mut self) -> Result<String> {
        if self.below(4)? != 0 {
            return Ok(String::new());
        }
        let n = self.below(4)? + 1;
        let mut s = String::new();
        for _ in 0..n {
            s.push([' ', '\t', '\n', '\r'][self.below(4)? as usize]);
        }
        Ok(s)
    }

    fn char(&mut self) -> Result<char> {
        Ok(match self.below(4)? {
            0 => TRICKY[self.below(TRICKY.len() as u32)? as usize],
            1 => char::from_u32(self.u.int_in_range(0..=0x10ffff)?).unwrap_or('?'),
            _ => char::from(b' ' + self.below(95)? as u8),
        })
    }

    /// A JSON string literal of `value`, each character in a generated escape form.
    fn encode(&mut self, value: &str, lone_ok: bool) -> Result<(String, Option<String>)> {
        let mut text = String::from("\"");
        let mut lone = false;
        for c in value.chars() {
            if lone_ok && self.below(64)? == 0 {
                let s = self.u.int_in_range(0xd800u32..=0xdfff)?;
                text.push_str(&format!("\\u{s:04x}"));
                lone = true;
            }
            let style = self.below(4)?;
            let short = match c {
                '"' => Some("\\\""),
                '\\' => Some("\\\\"),
                '/' => Some("\\/"),
                '\u{8}' => Some("\\b"),
                '\u{c}' => Some("\\f"),
                '\n' => Some("\\n"),
                '\r' => Some("\\r"),
                '\t' => Some("\\t"),
                _ => None,
            };
            let must_escape = c == '"' || c == '\\' || (c as u32) < 0x20;
            match (style, short) {
                (0, _) if !must_escape => text.push(c),
                (1, Some(s)) => text.push_str(s),
                _ => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        if style == 3 {
                            text.push_str(&format!("\\u{unit:04X}"));
                        } else {
                            text.push_str(&format!("\\u{unit:04x}"));
                        }
                    }
                }
            }
        }
        text.push('"');
        Ok((text, if lone { None } else { Some(value.to_owned()) }))
    }

    /// A string value: from `pool` or built from generated characters.
    fn string_value(&mut self, pool: &[&str]) -> Result<String> {
        if !pool.is_empty() && self.below(3)? != 0 {
            return Ok(pool[self.below(pool.len() as u32)? as usize].to_owned());
        }
        let n = self.below(12)?;
        let mut s = String::new();
        for _ in 0..n {
            s.push(self.char()?);
        }
        Ok(s)
    }

    fn string(&mut self, pool: &[&str], lone_ok: bool) -> Result<Val> {
        let value = self.string_value(pool)?;
        let (text, decoded) = self.encode(&value, lone_ok)?;
        Ok(Val {
            text,
            kind: Kind::Str(decoded),
        })
    }

    /// A number in JSON grammar: any length of digits, fraction, exponent.
    fn number(&mut self) -> Result<String> {
        let mut s = String::new();
        if self.u.arbitrary()? {
            s.push('-');
        }
        match self.below(4)? {
            0 => s.push('0'),
            1 => {
                let n: u64 = self.u.arbitrary()?;
                s.push_str(&n.to_string());
            }
            2 => {
                s.push(char::from(b'1' + self.below(9)? as u8));
                for _ in 0..self.below(40)? {
                    s.push(char::from(b'0' + self.below(10)? as u8));
                }
            }
            _ => s.push_str(&(self.below(1000)? + 1).to_string()),
        }
        if self.below(4)? == 0 {
            s.push('.');
            for _ in 0..=self.below(8)? {
                s.push(char::from(b'0' + self.below(10)? as u8));
            }
        }
        if self.below(4)? == 0 {
            s.push(['e', 'E'][self.below(2)? as usize]);
            match self.below(3)? {
                0 => s.push('+'),
                1 => s.push('-'),
                _ => {}
            }
            s.push_str(&self.below(100_000)?.to_string());
        }
        Ok(s)
    }

    /// `[[[...]]]` or `{"a":{"a":...}}` of a generated depth, up to far beyond serde's 128.
    fn nest(&mut self) -> Result<String> {
        let depth = match self.below(3)? {
            0 => self.below(200)? as usize,
            1 => 120 + self.below(16)? as usize,
            _ => self.below(5000)? as usize,
        } + 1;
        Ok(if self.u.arbitrary()? {
            format!("{}{}", "[".repeat(depth), "]".repeat(depth))
        } else {
            format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
        })
    }

    /// Any value; `lone_ok` allows lone surrogates in its strings.
    fn value(&mut self, depth: u32, lone_ok: bool) -> Result<Val> {
        let other = |text: String| Val {
            text,
            kind: Kind::Other,
        };
        Ok(match self.below(if depth == 0 { 6 } else { 9 })? {
            0 => Val {
                text: "null".into(),
                kind: Kind::Null,
            },
            1 => other(["true", "false"][self.below(2)? as usize].into()),
            2 => other(self.number()?),
            3 | 4 => self.string(&[], lone_ok)?,
            5 => other(self.nest()?),
            6 => {
                let n = self.below(4)?;
                let mut text = String::from("[");
                text.push_str(&self.ws()?);
                for i in 0..n {
                    if i > 0 {
                        text.push(',');
                        text.push_str(&self.ws()?);
                    }
                    text.push_str(&self.value(depth - 1, lone_ok)?.text);
                    text.push_str(&self.ws()?);
                }
                text.push(']');
                other(text)
            }
            _ => {
                let n = self.below(4)?;
                let mut text = String::from("{");
                text.push_str(&self.ws()?);
                for i in 0..n {
                    if i > 0 {
                        text.push(',');
                        text.push_str(&self.ws()?);
                    }
                    let key = self.string(&["a", "id", "method", "a"], false)?;
                    text.push_str(&key.text);
                    text.push_str(&self.ws()?);
                    text.push(':');
                    text.push_str(&self.ws()?);
                    text.push_str(&self.value(depth - 1, lone_ok)?.text);
                    text.push_str(&self.ws()?);
                }
                text.push('}');
                other(text)
            }
        })
    }

    /// A value for a known member: mostly the right type, sometimes anything or a bad token.
    fn member_value(&mut self, key: Key) -> Result<Val> {
        if self.below(24)? == 0 {
            return Ok(Val {
                text: BAD_TOKENS[self.below(BAD_TOKENS.len() as u32)? as usize].into(),
                kind: Kind::Bad,
            });
        }
        if self.below(6)? == 0 {
            return self.value(2, true);
        }
        match key {
            Key::Jsonrpc => {
                if self.below(6)? == 0 {
                    self.string(&["1.0", "2", "2.0 ", "2.00", "3.0"], true)
                } else {
                    let (text, decoded) = self.encode("2.0", false)?;
                    Ok(Val {
                        text,
                        kind: Kind::Str(decoded),
                    })
                }
            }
            Key::Method => self.string(METHODS, true),
            Key::Id => Ok(match self.below(5)? {
                0 | 1 => Val {
                    text: self.number()?,
                    kind: Kind::Other,
                },
                2 | 3 => self.string(&["1", "a", ""], true)?,
                _ => Val {
                    text: "null".into(),
                    kind: Kind::Null,
                },
            }),
            Key::Params | Key::Result => self.value(3, true),
            Key::Error => {
                let message = self.string(&["boom"], true)?;
                Ok(Val {
                    text: format!(
                        "{{\"code\":{},\"message\":{}}}",
                        self.number()?,
                        message.text
                    ),
                    kind: Kind::Other,
                })
            }
        }
    }
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Key {
    Jsonrpc,
    Id,
    Method,
    Params,
    Result,
    Error,
}

impl Key {
    const ALL: [Key; 6] = [
        Key::Jsonrpc,
        Key::Id,
        Key::Method,
        Key::Params,
        Key::Result,
        Key::Error,
    ];

    fn name(self) -> &'static str {
        match self {
            Key::Jsonrpc => "jsonrpc",
            Key::Id => "id",
            Key::Method => "method",
            Key::Params => "params",
            Key::Result => "result",
            Key::Error => "error",
        }
    }
}

/// One member of the generated object.
#[derive(Debug)]
struct Member {
    /// `None` for an unknown key.
    key: Option<Key>,
    key_text: String,
    value: Val,
}

/// How the object is wrapped into the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wrap {
    Plain,
    /// A form feed first: ASCII whitespace, but not JSON whitespace.
    FormFeed,
    TrailingGarbage,
    SecondObject,
    Truncate(usize),
    Batch,
    Scalar,
    Empty,
}

/// A generated frame and the answer `jsonrpc::parse` must give.
#[derive(Debug)]
pub struct Case {
    /// The frame.
    pub bytes: Vec<u8>,
    /// The answer; for some truncations either of two answers.
    pub expect: Vec<Parsed>,
}

/// What the model says about the members, read in order.
enum Read {
    /// Reading stopped at this error.
    Stopped(Parsed),
    /// All members read: the fields as serde holds them.
    Done {
        jsonrpc: Option<String>,
        id: Option<Val>,
        method: Option<String>,
        params: Option<String>,
        result: Option<String>,
        error: Option<String>,
    },
}

fn read_members(members: &[Member]) -> Read {
    let mut seen = Vec::new();
    let (mut jsonrpc, mut id, mut method, mut params, mut result, mut error) =
        (None, None, None, None, None, None);
    for m in members {
        let Some(key) = m.key else {
            if m.value.kind == Kind::Bad {
                return Read::Stopped(Parsed::NotJson);
            }
            continue;
        };
        if seen.contains(&key) {
            return Read::Stopped(Parsed::NotJsonRpc);
        }
        seen.push(key);
        let v = &m.value;
        if v.kind == Kind::Bad {
            // A string field sees the wrong type before the bad syntax when the token opens an
            // array or object or starts with a valid number (serde reports the type it found).
            let string_field = matches!(key, Key::Jsonrpc | Key::Method);
            let typed = v.text.starts_with(['[', '{']) || v.text == "0x1";
            return Read::Stopped(if string_field && typed {
                Parsed::NotJsonRpc
            } else {
                Parsed::NotJson
            });
        }
        match key {
            Key::Jsonrpc | Key::Method => {
                let decoded = match &v.kind {
                    Kind::Null => None,
                    Kind::Str(Some(s)) => Some(s.clone()),
                    Kind::Str(None) => return Read::Stopped(Parsed::NotJson),
                    // serde reads a number to name it in the type error; beyond f64 it fails.
                    _ if v.text.parse::<f64>().is_ok_and(f64::is_infinite) => {
                        return Read::Stopped(Parsed::NotJson)
                    }
                    _ => return Read::Stopped(Parsed::NotJsonRpc),
                };
                if key == Key::Jsonrpc {
                    jsonrpc = decoded;
                } else {
                    method = decoded;
                }
            }
            Key::Id => id = Some(v.clone()),
            Key::Result => result = Some(v.text.clone()),
            Key::Params | Key::Error => {
                let raw = (v.kind != Kind::Null).then(|| v.text.clone());
                if key == Key::Params {
                    params = raw;
                } else {
                    error = raw;
                }
            }
        }
    }
    Read::Done {
        jsonrpc,
        id,
        method,
        params,
        result,
        error,
    }
}

/// What `jsonrpc::parse` must answer for the untruncated object.
fn model(members: &[Member]) -> (Parsed, bool) {
    let (jsonrpc, id, method, params, result, error) = match read_members(members) {
        Read::Stopped(p) => return (p, true),
        Read::Done {
            jsonrpc,
            id,
            method,
            params,
            result,
            error,
        } => (jsonrpc, id, method, params, result, error),
    };
    let parsed = if jsonrpc.as_deref() != Some("2.0") {
        Parsed::NotJsonRpc
    } else {
        match (method, id) {
            (Some(method), Some(id)) => {
                if strict_id(&id) {
                    Parsed::Request {
                        id: id.text,
                        method,
                        params,
                    }
                } else {
                    Parsed::NotJsonRpc
                }
            }
            (Some(method), None) => Parsed::Notification { method, params },
            (None, Some(Val { text: id, .. })) => match (result, error) {
                (Some(r), None) => Parsed::Response { id, outcome: Ok(r) },
                (None, Some(e)) => Parsed::Response {
                    id,
                    outcome: Err(e),
                },
                _ => Parsed::NotJsonRpc,
            },
            (None, None) => Parsed::NotJsonRpc,
        }
    };
    (parsed, false)
}

/// Whether a request id is one every JSON reader takes back: null, a string without lone
/// surrogates, or a number within f64 range.
fn strict_id(id: &Val) -> bool {
    match &id.kind {
        Kind::Null => true,
        Kind::Str(decoded) => decoded.is_some(),
        Kind::Other
            if id
                .text
                .starts_with(['-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9']) =>
        {
            id.text.parse::<f64>().is_ok_and(f64::is_finite)
        }
        Kind::Other | Kind::Bad => false,
    }
}

/// Generates one case from fuzz bytes.
pub fn generate(u: &mut Unstructured<'_>) -> Result<Case> {
    let mut g = Gen { u };
    let mut members = Vec::new();
    // The usual shapes most of the time, so classification is exercised, not just refusal.
    let shape = g.below(6)?;
    for key in Key::ALL {
        let wanted = match (shape, key) {
            (_, Key::Jsonrpc) => g.below(12)? != 0,
            (0, Key::Id | Key::Method) | (1, Key::Method) | (2, Key::Id | Key::Result) => true,
            (3, Key::Id | Key::Error) => true,
            (0 | 1, Key::Params) => g.below(3)? != 0,
            _ => g.below(6)? == 0,
        };
        if wanted {
            members.push(known_member(&mut g, key)?);
        }
    }
    for _ in 0..g.below(4)? {
        if g.below(3)? == 0 {
            // A duplicate of a known key, maybe escaped.
            let key = Key::ALL[g.below(6)? as usize];
            members.push(known_member(&mut g, key)?);
        } else {
            let name = g.string_value(UNKNOWN_KEYS)?;
            let (key_text, _) = g.encode(&name, false)?;
            let value = if g.below(24)? == 0 {
                Val {
                    text: BAD_TOKENS[g.below(BAD_TOKENS.len() as u32)? as usize].into(),
                    kind: Kind::Bad,
                }
            } else {
                g.value(3, true)?
            };
            // A generated name may happen to be a known key; then it is one.
            let key = Key::ALL.into_iter().find(|k| k.name() == name);
            members.push(Member {
                key,
                key_text,
                value,
            });
        }
    }
    // Order: a generated permutation.
    for i in (1..members.len()).rev() {
        let j = g.below(i as u32 + 1)? as usize;
        members.swap(i, j);
    }
    let mut text = String::from("{");
    text.push_str(&g.ws()?);
    for (i, m) in members.iter().enumerate() {
        if i > 0 {
            text.push(',');
            text.push_str(&g.ws()?);
        }
        text.push_str(&m.key_text);
        text.push_str(&g.ws()?);
        text.push(':');
        text.push_str(&g.ws()?);
        text.push_str(&m.value.text);
        text.push_str(&g.ws()?);
    }
    text.push('}');
    let any_bad = members.iter().any(|m| m.value.kind == Kind::Bad);
    let (mut parsed, stopped_early) = model(&members);
    if stopped_early && any_bad {
        // Whatever serde met first, the text is not JSON.
        parsed = Parsed::NotJson;
    }
    let wrap = match g.below(16)? {
        0 => Wrap::FormFeed,
        1 => Wrap::TrailingGarbage,
        2 => Wrap::SecondObject,
        3 => Wrap::Truncate(g.below(text.len() as u32)? as usize),
        4 => Wrap::Batch,
        5 => Wrap::Scalar,
        6 => Wrap::Empty,
        _ => Wrap::Plain,
    };
    let (bytes, expect) = match wrap {
        Wrap::Plain => {
            let lead = g.ws()?;
            let trail = g.ws()?;
            (format!("{lead}{text}{trail}").into_bytes(), vec![parsed])
        }
        Wrap::FormFeed => (format!("\u{c}{text}").into_bytes(), vec![Parsed::NotJson]),
        // Neither is JSON, so both are -32700 wherever serde stops.
        Wrap::TrailingGarbage | Wrap::SecondObject => {
            let tail = if wrap == Wrap::SecondObject {
                "{}"
            } else {
                ["x", "]", "}", ",", "\u{0}", "/"][g.below(6)? as usize]
            };
            (format!("{text}{tail}").into_bytes(), vec![Parsed::NotJson])
        }
        Wrap::Truncate(cut) => {
            let mut bytes = text.into_bytes();
            bytes.truncate(cut);
            (bytes, vec![Parsed::NotJson])
        }
        Wrap::Batch => {
            let expect = if any_bad {
                Parsed::NotJson
            } else {
                Parsed::NotJsonRpc
            };
            (format!("[{text}]").into_bytes(), vec![expect])
        }
        Wrap::Scalar => {
            let v = g.value(0, true)?;
            let expect = if v.kind == Kind::Bad {
                Parsed::NotJson
            } else {
                Parsed::NotJsonRpc
            };
            (v.text.into_bytes(), vec![expect])
        }
        Wrap::Empty => (g.ws()?.into_bytes(), vec![Parsed::NotJson]),
    };
    Ok(Case { bytes, expect })
}

fn known_member(g: &mut Gen<'_, '_>, key: Key) -> Result<Member> {
    let (key_text, _) = g.encode(key.name(), false)?;
    let value = g.member_value(key)?;
    Ok(Member {
        key: Some(key),
        key_text,
        value,
    })
}

/// The `envelope_structured` target: generate, parse, compare; then the byte-level checks.
pub fn check(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(case) = generate(&mut u) else {
        return;
    };
    let got = envelope::classify(&case.bytes);
    assert!(
        case.expect.contains(&got),
        "jsonrpc::parse answered {got:?}, the model expected {:?} for {:?}",
        case.expect,
        String::from_utf8_lossy(&case.bytes)
    );
    envelope::check(&case.bytes);
}
