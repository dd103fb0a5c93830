//! Just enough RESP2 for PUBLISH replies and SUBSCRIBE pushes, parsed in place.

/// Largest bulk string accepted.
pub const MAX_BULK: usize = 4 << 20;

#[derive(Debug, PartialEq, Eq)]
pub enum Item {
    /// `+OK`, `+PONG`.
    Simple,
    /// `-ERR …`: byte range of the text.
    Error(usize, usize),
    /// `:N` (PUBLISH replies with the receiver count).
    Int(i64),
    /// `*3 message <channel> <payload>`: byte range of the payload.
    Message(usize, usize),
    /// `*3 subscribe <channel> <count>`.
    Subscribed,
    /// Any other array.
    OtherArray,
}

/// Finds the end of the line starting at `at`: index of its `\r`.
#[inline]
fn line_end(buf: &[u8], at: usize) -> Option<usize> {
    let nl = buf.get(at..)?.iter().position(|&b| b == b'\n')? + at;
    if nl > at && buf[nl - 1] == b'\r' {
        Some(nl - 1)
    } else {
        None
    }
}

#[inline]
fn parse_int(s: &[u8]) -> Result<i64, String> {
    let (neg, digits) = match s.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, s),
    };
    if digits.is_empty() || digits.len() > 18 {
        return Err(format!("bad RESP integer {:?}", String::from_utf8_lossy(s)));
    }
    let mut v = 0i64;
    for &c in digits {
        if !c.is_ascii_digit() {
            return Err(format!("bad RESP integer {:?}", String::from_utf8_lossy(s)));
        }
        v = v * 10 + i64::from(c - b'0');
    }
    Ok(if neg { -v } else { v })
}

/// One element inside an array: a bulk string range or an integer.
enum Elem {
    Bulk(usize, usize),
    Int,
    Nil,
}

/// Parses one bulk string or integer at `at`; `Ok(None)` if incomplete; returns the next offset.
fn elem(buf: &[u8], at: usize) -> Result<Option<(Elem, usize)>, String> {
    let Some(&tag) = buf.get(at) else {
        return Ok(None);
    };
    let Some(eol) = line_end(buf, at) else {
        if buf.len() - at > 64 {
            return Err("RESP line without CRLF".into());
        }
        return Ok(None);
    };
    match tag {
        b':' => {
            parse_int(&buf[at + 1..eol])?;
            Ok(Some((Elem::Int, eol + 2)))
        }
        b'$' => {
            let n = parse_int(&buf[at + 1..eol])?;
            if n < 0 {
                return Ok(Some((Elem::Nil, eol + 2)));
            }
            let n = n as usize;
            if n > MAX_BULK {
                return Err(format!("RESP bulk string of {n} bytes"));
            }
            let start = eol + 2;
            if buf.len() < start + n + 2 {
                return Ok(None);
            }
            if &buf[start + n..start + n + 2] != b"\r\n" {
                return Err("RESP bulk string not followed by CRLF".into());
            }
            Ok(Some((Elem::Bulk(start, start + n), start + n + 2)))
        }
        t => Err(format!("unexpected RESP element type {:?}", t as char)),
    }
}

/// Parses one item from the start of `buf`: `Ok(Some((item, consumed)))`, or `Ok(None)` when
/// more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<(Item, usize)>, String> {
    let Some(&tag) = buf.first() else {
        return Ok(None);
    };
    let Some(eol) = line_end(buf, 0) else {
        if buf.len() > 4096 {
            return Err("RESP line without CRLF".into());
        }
        return Ok(None);
    };
    match tag {
        b'+' => Ok(Some((Item::Simple, eol + 2))),
        b'-' => Ok(Some((Item::Error(1, eol), eol + 2))),
        b':' => Ok(Some((Item::Int(parse_int(&buf[1..eol])?), eol + 2))),
        b'*' => {
            let n = parse_int(&buf[1..eol])?;
            if !(0..=64).contains(&n) {
                return Err(format!("RESP array of {n} elements"));
            }
            let mut at = eol + 2;
            let mut first = None;
            let mut last = None;
            for i in 0..n {
                let Some((e, next)) = elem(buf, at)? else {
                    return Ok(None);
                };
                if i == 0 {
                    if let Elem::Bulk(s, e) = e {
                        first = Some((s, e));
                    }
                } else if let Elem::Bulk(s, e) = e {
                    last = Some((s, e));
                }
                at = next;
            }
            let kind = first.map(|(s, e)| &buf[s..e]);
            let item = match (n, kind, last) {
                (3, Some(b"message"), Some((s, e))) => Item::Message(s, e),
                (3, Some(b"subscribe"), _) => Item::Subscribed,
                _ => Item::OtherArray,
            };
            Ok(Some((item, at)))
        }
        t => Err(format!("unexpected RESP type {:?}", t as char)),
    }
}

/// `PUBLISH <channel> <payload>` as a RESP array, appended to `out`; returns the payload offset.
pub fn push_publish(out: &mut Vec<u8>, channel: &[u8], payload: &[u8]) -> usize {
    out.extend_from_slice(b"*3\r\n$7\r\nPUBLISH\r\n$");
    out.extend_from_slice(channel.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(channel);
    out.extend_from_slice(b"\r\n$");
    out.extend_from_slice(payload.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    let at = out.len();
    out.extend_from_slice(payload);
    out.extend_from_slice(b"\r\n");
    at
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(channel: &str, payload: &str) -> Vec<u8> {
        format!(
            "*3\r\n$7\r\nmessage\r\n${}\r\n{channel}\r\n${}\r\n{payload}\r\n",
            channel.len(),
            payload.len()
        )
        .into_bytes()
    }

    #[test]
    fn simple_error_int() {
        assert_eq!(parse(b"+OK\r\n"), Ok(Some((Item::Simple, 5))));
        assert_eq!(parse(b":12\r\n:3"), Ok(Some((Item::Int(12), 5))));
        assert_eq!(parse(b"-ERR no\r\n"), Ok(Some((Item::Error(1, 7), 9))));
        assert_eq!(parse(b":1\r"), Ok(None));
        assert!(parse(b"?\r\n").is_err());
        assert!(parse(b":x\r\n").is_err());
    }

    #[test]
    fn subscribe_confirmation() {
        let b = b"*3\r\n$9\r\nsubscribe\r\n$4\r\nch.0\r\n:1\r\n";
        assert_eq!(parse(b), Ok(Some((Item::Subscribed, b.len()))));
    }

    #[test]
    fn message_push_split_at_every_byte() {
        let payload = "{\"load\":\"@0000000000000001\"}";
        let mut stream = message("ch.12", payload);
        stream.extend_from_slice(b":1\r\n");
        stream.extend(message("ch.3", "x"));
        let first_len = message("ch.12", payload).len();
        // Every prefix of the first push is incomplete; the whole one parses.
        for cut in 0..first_len {
            assert_eq!(parse(&stream[..cut]), Ok(None), "cut {cut}");
        }
        let (item, used) = parse(&stream).expect("ok").expect("item");
        assert_eq!(used, first_len);
        let Item::Message(s, e) = item else {
            panic!("not a message: {item:?}");
        };
        assert_eq!(&stream[s..e], payload.as_bytes());
        // Feed the stream in arbitrary chunks into a buffer, as reads would.
        for chunk in [1usize, 2, 3, 7, 13, 64] {
            let mut buf = Vec::new();
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some((item, used)) = parse(&buf).expect("valid") {
                    got.push(match item {
                        Item::Message(s, e) => String::from_utf8_lossy(&buf[s..e]).into_owned(),
                        other => format!("{other:?}"),
                    });
                    buf.drain(..used);
                }
            }
            assert_eq!(got, vec![payload.to_owned(), "Int(1)".into(), "x".into()]);
            assert!(buf.is_empty());
        }
    }

    #[test]
    fn publish_encoding() {
        let mut out = Vec::new();
        let at = push_publish(&mut out, b"ch.1", b"hello");
        assert_eq!(out, b"*3\r\n$7\r\nPUBLISH\r\n$4\r\nch.1\r\n$5\r\nhello\r\n");
        assert_eq!(&out[at..at + 5], b"hello");
    }
}
