//! Just enough of the NATS client protocol: MSG, PING, PONG, +OK, -ERR, INFO, parsed in place.

/// Largest payload accepted (nats-server's default max_payload is 1 MiB).
pub const MAX_PAYLOAD: usize = 4 << 20;
/// Longest control line accepted (INFO lines carry the server's JSON).
const MAX_LINE: usize = 64 * 1024;

#[derive(Debug, PartialEq, Eq)]
pub enum Item {
    /// `MSG <subject> <sid> [reply-to] <#bytes>`: byte range of the payload.
    Msg(usize, usize),
    Ping,
    Pong,
    Ok,
    /// `-ERR '…'`: byte range of the text.
    Err(usize, usize),
    Info,
}

/// Parses one item from the start of `buf`: `Ok(Some((item, consumed)))`, or `Ok(None)` when
/// more bytes are needed.
pub fn parse(buf: &[u8]) -> Result<Option<(Item, usize)>, String> {
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
        if buf.len() > MAX_LINE {
            return Err("NATS control line over 64 KiB".into());
        }
        return Ok(None);
    };
    let line_end = if nl > 0 && buf[nl - 1] == b'\r' {
        nl - 1
    } else {
        nl
    };
    let line = &buf[..line_end];
    let next = nl + 1;
    let op_end = line
        .iter()
        .position(|&b| b == b' ' || b == b'\t')
        .unwrap_or(line.len());
    let op = &line[..op_end];
    if op.eq_ignore_ascii_case(b"MSG") {
        // The last field is the byte count.
        let count = line
            .rsplit(|&b| b == b' ' || b == b'\t')
            .find(|f| !f.is_empty())
            .unwrap_or(b"");
        let fields = line
            .split(|&b| b == b' ' || b == b'\t')
            .filter(|f| !f.is_empty())
            .count();
        if !(4..=5).contains(&fields) || count.is_empty() || count.len() > 9 {
            return Err(format!(
                "bad NATS MSG line {:?}",
                String::from_utf8_lossy(line)
            ));
        }
        let mut n = 0usize;
        for &c in count {
            if !c.is_ascii_digit() {
                return Err(format!(
                    "bad NATS MSG size {:?}",
                    String::from_utf8_lossy(count)
                ));
            }
            n = n * 10 + usize::from(c - b'0');
        }
        if n > MAX_PAYLOAD {
            return Err(format!("NATS payload of {n} bytes"));
        }
        if buf.len() < next + n + 2 {
            return Ok(None);
        }
        if &buf[next + n..next + n + 2] != b"\r\n" {
            return Err("NATS payload not followed by CRLF".into());
        }
        return Ok(Some((Item::Msg(next, next + n), next + n + 2)));
    }
    let item = if op.eq_ignore_ascii_case(b"PING") {
        Item::Ping
    } else if op.eq_ignore_ascii_case(b"PONG") {
        Item::Pong
    } else if op.eq_ignore_ascii_case(b"+OK") {
        Item::Ok
    } else if op.eq_ignore_ascii_case(b"-ERR") {
        Item::Err(op_end.min(line_end), line_end)
    } else if op.eq_ignore_ascii_case(b"INFO") {
        Item::Info
    } else {
        return Err(format!(
            "unexpected NATS line {:?}",
            String::from_utf8_lossy(&line[..line.len().min(80)])
        ));
    };
    Ok(Some((item, next)))
}

/// `PUB <subject> <len>\r\n<payload>\r\n` appended to `out`; returns the payload offset.
pub fn push_pub(out: &mut Vec<u8>, subject: &[u8], payload: &[u8]) -> usize {
    out.extend_from_slice(b"PUB ");
    out.extend_from_slice(subject);
    out.push(b' ');
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

    #[test]
    fn control_lines() {
        assert_eq!(parse(b"PING\r\n"), Ok(Some((Item::Ping, 6))));
        assert_eq!(parse(b"PONG\r\nPING"), Ok(Some((Item::Pong, 6))));
        assert_eq!(parse(b"+OK\r\n"), Ok(Some((Item::Ok, 5))));
        assert_eq!(parse(b"INFO {\"a\":1}\r\n"), Ok(Some((Item::Info, 14))));
        let e = b"-ERR 'Unknown Protocol Operation'\r\n";
        let Ok(Some((Item::Err(s, t), _))) = parse(e) else {
            panic!("not an error");
        };
        assert_eq!(
            String::from_utf8_lossy(&e[s..t]).trim(),
            "'Unknown Protocol Operation'"
        );
        assert_eq!(parse(b"PIN"), Ok(None));
        assert!(parse(b"WHAT\r\n").is_err());
        assert!(parse(b"MSG a 1 x\r\n").is_err());
    }

    #[test]
    fn msg_split_at_every_byte_and_in_chunks() {
        let payload = b"{\"load\":\"@00000000000000ff\",\"pad\":\"xx\"}";
        let mut stream = Vec::new();
        stream.extend_from_slice(format!("MSG s.7 1 {}\r\n", payload.len()).as_bytes());
        stream.extend_from_slice(payload);
        stream.extend_from_slice(b"\r\nPING\r\nMSG s.7 1 reply.x 3\r\nabc\r\n");
        let first = format!("MSG s.7 1 {}\r\n", payload.len()).len() + payload.len() + 2;
        for cut in 0..first {
            assert_eq!(parse(&stream[..cut]), Ok(None), "cut {cut}");
        }
        for chunk in [1usize, 2, 5, 11, 100] {
            let mut buf = Vec::new();
            let mut got = Vec::new();
            for piece in stream.chunks(chunk) {
                buf.extend_from_slice(piece);
                while let Some((item, used)) = parse(&buf).expect("valid") {
                    got.push(match item {
                        Item::Msg(s, e) => String::from_utf8_lossy(&buf[s..e]).into_owned(),
                        other => format!("{other:?}"),
                    });
                    buf.drain(..used);
                }
            }
            assert_eq!(
                got,
                vec![
                    String::from_utf8_lossy(payload).into_owned(),
                    "Ping".into(),
                    "abc".into()
                ]
            );
        }
    }

    #[test]
    fn pub_encoding() {
        let mut out = Vec::new();
        let at = push_pub(&mut out, b"s.3", b"hey");
        assert_eq!(out, b"PUB s.3 3\r\nhey\r\n");
        assert_eq!(&out[at..at + 3], b"hey");
    }
}
