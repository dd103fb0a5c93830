//! Canonical JSON and SHA-256, byte for byte as the AXP reference host computes them.
//!
//! Receipts fingerprint a command as `sha256(canonical({method, params}))`; AXP ids, digests,
//! trace hashes and signatures hash canonical JSON too, and clients compute the same values, so
//! the bytes must be JavaScript's: object keys sorted by UTF-16 code units (what
//! `Array.prototype.sort` compares), strings escaped as `JSON.stringify` escapes them, and
//! numbers spelled as JavaScript spells a double (`100`, not `100.0`; `1e+21`; `1e-7`).
//!
//! `core/testdata/canonical/vectors.json` holds what Node.js writes for 41 tricky inputs
//! (`vectors.mjs` beside it regenerates them); a test checks every one byte for byte. Numbers
//! must also be *read* as JavaScript reads them, correctly rounded: the core builds
//! `serde_json` with `float_roundtrip` for that.

use std::io::Write;

use serde_json::Value;
use sha2::{Digest, Sha256};

/// The canonical text of `v`.
pub fn canonical(v: &Value) -> String {
    // Only UTF-8 is ever written (the strings of `v` and ASCII around them), so the lossy
    // branch never runs; the valid one takes the bytes without copying them.
    String::from_utf8(canonical_bytes(v))
        .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// The canonical text of `v`, as UTF-8 bytes.
fn canonical_bytes(v: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write(v, &mut out);
    out
}

/// SHA-256 of `bytes`, as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// SHA-256 hex of the canonical text of `v` (the reference's `hashObject`).
pub fn hash_object(v: &Value) -> String {
    sha256_hex(&canonical_bytes(v))
}

/// SHA-256 hex of the canonical text of the object whose members are `members` (distinct
/// keys): `hash_object` of that object, without building it (and so without copying the values
/// into it).
pub fn hash_members(members: &[(&str, &Value)]) -> String {
    let mut out = Vec::with_capacity(256);
    write_object(members.to_vec(), &mut out);
    sha256_hex(&out)
}

/// Lowercase hex of `bytes`.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(DIGITS[usize::from(b >> 4)] as char);
        s.push(DIGITS[usize::from(b & 15)] as char);
    }
    s
}

// Writing into a `Vec` cannot fail, so the `io::Result`s below are dropped.
fn write(v: &Value, out: &mut Vec<u8>) {
    match v {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(b) => out.extend_from_slice(if *b { b"true" } else { b"false" }),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_str(s, out),
        Value::Array(a) => {
            out.push(b'[');
            for (i, x) in a.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write(x, out);
            }
            out.push(b']');
        }
        Value::Object(m) => write_object(m.iter().map(|(k, x)| (k.as_str(), x)).collect(), out),
    }
}

/// An object of `members` (distinct keys), keys sorted by UTF-16 code units.
fn write_object(mut members: Vec<(&str, &Value)>, out: &mut Vec<u8>) {
    members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
    out.push(b'{');
    for (i, (k, x)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(k, out);
        out.push(b':');
        write(x, out);
    }
    out.push(b'}');
}

/// A JSON string, straight into `out`. serde_json escapes exactly what JSON.stringify does:
/// `"`, `\`, the five short forms and other controls as `\u00xx` (lowercase); everything
/// else goes through as is.
fn write_str(s: &str, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, s);
}

/// Integers JavaScript holds exactly: below 2^53 in magnitude.
const SAFE: u64 = 1 << 53;

fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    if let Some(u) = n.as_u64().filter(|u| *u < SAFE) {
        let _ = write!(out, "{u}");
    } else if let Some(i) = n.as_i64().filter(|i| i.unsigned_abs() < SAFE) {
        let _ = write!(out, "{i}");
    } else {
        // A JavaScript reader holds every other number as a double.
        out.extend_from_slice(js_number(n.as_f64().unwrap_or(0.0)).as_bytes());
    }
}

/// `Number.prototype.toString()` of a finite double (ECMA-262 Number::toString, radix 10).
pub fn js_number(x: f64) -> String {
    if x == 0.0 {
        return "0".into();
    }
    if !x.is_finite() {
        // JSON.stringify writes non-finite numbers as null; serde_json never produces them.
        return "null".into();
    }
    let sign = if x < 0.0 { "-" } else { "" };
    // Rust's `{:e}` gives the shortest digits that round-trip, as ECMA-262 asks: `d.ddddde±x`.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((&sci, "0"));
    let digits: String = mantissa.chars().filter(char::is_ascii_digit).collect();
    let k = digits.len() as i64;
    // The value is 0.d1..dk × 10^n.
    let n = exp.parse::<i64>().unwrap_or(0) + 1;
    let body = if k <= n && n <= 21 {
        format!("{digits}{}", "0".repeat((n - k) as usize))
    } else if 0 < n && n <= 21 {
        format!("{}.{}", &digits[..n as usize], &digits[n as usize..])
    } else if -6 < n && n <= 0 {
        format!("0.{}{digits}", "0".repeat((-n) as usize))
    } else {
        let e = n - 1;
        let e = if e >= 0 {
            format!("+{e}")
        } else {
            e.to_string()
        };
        if k == 1 {
            format!("{digits}e{e}")
        } else {
            format!("{}.{}e{e}", &digits[..1], &digits[1..])
        }
    };
    format!("{sign}{body}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hashing_members_is_hashing_their_object() {
        let params = json!({"z": [1, 2.5, {"\u{1f600}": null}], "\u{ff61}": "é\n", "a": true});
        for members in [
            vec![
                ("method", json!("dispatchAction")),
                ("params", params.clone()),
            ],
            vec![("params", params.clone()), ("method", json!("m"))],
            vec![
                ("\u{ff61}", json!(1)),
                ("\u{1f600}", json!(2)),
                ("b", json!({})),
            ],
            vec![],
        ] {
            let object: serde_json::Map<String, Value> = members
                .iter()
                .map(|(k, v)| ((*k).to_owned(), v.clone()))
                .collect();
            let refs: Vec<(&str, &Value)> = members.iter().map(|(k, v)| (*k, v)).collect();
            assert_eq!(hash_members(&refs), hash_object(&Value::Object(object)));
        }
    }

    #[test]
    fn keys_sort_at_every_depth() {
        let v = json!({"b": 1, "a": {"d": [1, {"f": 2, "e": 3}], "c": "x"}});
        assert_eq!(
            canonical(&v),
            r#"{"a":{"c":"x","d":[1,{"e":3,"f":2}]},"b":1}"#
        );
    }

    #[test]
    fn keys_sort_by_utf16_code_units_not_code_points() {
        // U+FF61 is one UTF-16 unit (0xFF61); U+1F600 is a surrogate pair starting 0xD83D.
        // Code points put U+FF61 first; UTF-16 units put the emoji first, as JavaScript does.
        let v = json!({"\u{ff61}": 1, "\u{1f600}": 2});
        assert_eq!(canonical(&v), "{\"\u{1f600}\":2,\"\u{ff61}\":1}");
    }

    #[test]
    fn numbers_are_spelled_as_javascript_spells_them() {
        let cases = [
            (json!(100.0), "100"),
            (json!(1.5), "1.5"),
            (json!(-0.25), "-0.25"),
            (json!(1e21), "1e+21"),
            (json!(1e20), "100000000000000000000"),
            (json!(1e-7), "1e-7"),
            (json!(0.000001), "0.000001"),
            (json!(1.2345e-10), "1.2345e-10"),
            (json!(123456789012345680000.0), "123456789012345680000"),
            (json!(9007199254740993u64), "9007199254740992"),
            (json!(-5), "-5"),
            (json!(0.1 + 0.2), "0.30000000000000004"),
        ];
        for (v, want) in cases {
            assert_eq!(canonical(&v), want, "{v}");
        }
    }

    #[test]
    fn strings_escape_as_json_stringify() {
        let v = json!("a\"b\\c\n\u{1}\u{7f}é/");
        assert_eq!(canonical(&v), "\"a\\\"b\\\\c\\n\\u0001\u{7f}é/\"");
    }

    /// Inputs the host never hashes: text `serde_json` refuses to read, so no request that
    /// carries them gets as far as canonical JSON (JavaScript would hash lone surrogates as
    /// escapes and throws on numbers beyond a double).
    const REFUSED: [&str; 4] = [
        "a lone high surrogate",
        "a lone low surrogate",
        "a lone surrogate in a key",
        "a number beyond a double",
    ];

    #[test]
    fn every_vector_javascript_wrote_matches_byte_for_byte() {
        let file: Value =
            serde_json::from_str(include_str!("../testdata/canonical/vectors.json")).expect("json");
        let vectors = file["vectors"].as_array().expect("vectors");
        assert!(vectors.len() >= 40, "{} vectors", vectors.len());
        let mut refused = Vec::new();
        for v in vectors {
            let name = v["name"].as_str().expect("name");
            let input = v["input"].as_str().expect("input");
            let Ok(value) = serde_json::from_str::<Value>(input) else {
                refused.push(name);
                continue;
            };
            let want = v["canonical"]
                .as_str()
                .unwrap_or_else(|| panic!("{name}: {v}"));
            let got = canonical(&value);
            assert_eq!(got, want, "{name}");
            assert_eq!(sha256_hex(got.as_bytes()), v["sha256"], "{name}");
            assert_eq!(hash_object(&value), v["sha256"], "{name}");
        }
        assert_eq!(refused, REFUSED);
    }

    #[test]
    fn sha256_of_known_input() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(hash_object(&json!({})), sha256_hex(b"{}"));
    }
}
