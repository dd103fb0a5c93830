//! Hand-rolled WebSocket client framing (RFC 6455): just what the load tool needs.
//!
//! Client frames are FIN text frames, masked with a fresh key per frame from a xorshift PRNG;
//! masking works on 8-byte words. Server frames are parsed in place, never copied.

pub const OP_CONT: u8 = 0x0;
pub const OP_TEXT: u8 = 0x1;
pub const OP_BINARY: u8 = 0x2;
pub const OP_CLOSE: u8 = 0x8;
pub const OP_PING: u8 = 0x9;
pub const OP_PONG: u8 = 0xA;

/// Largest server frame accepted (the host's own limit is 1 MiB + 64 KiB).
pub const MAX_FRAME: usize = 4 << 20;

/// xorshift64*: cheap, good enough for mask keys (which only defeat proxy cache poisoning).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }

    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32
    }
}

/// Appends the header of a masked FIN frame with `opcode` and payload length `len`.
#[inline]
pub fn push_header(out: &mut Vec<u8>, opcode: u8, len: usize, key: [u8; 4]) {
    out.push(0x80 | opcode);
    if len < 126 {
        out.push(0x80 | len as u8);
    } else if len <= 0xffff {
        out.push(0x80 | 126);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.push(0x80 | 127);
        out.extend_from_slice(&(len as u64).to_be_bytes());
    }
    out.extend_from_slice(&key);
}

/// XORs `buf` with the repeating 4-byte `key` (byte i with key[i % 4]), a word at a time.
#[inline]
pub fn mask(buf: &mut [u8], key: [u8; 4]) {
    let word = u64::from_ne_bytes([
        key[0], key[1], key[2], key[3], key[0], key[1], key[2], key[3],
    ]);
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        c.copy_from_slice(&(u64::from_ne_bytes(w) ^ word).to_ne_bytes());
    }
    // Every full chunk is 8 bytes, a multiple of 4, so the tail starts at key[0] again.
    for (i, b) in chunks.into_remainder().iter_mut().enumerate() {
        *b ^= key[i & 3];
    }
}

/// Appends a complete masked frame holding `payload`.
pub fn encode(out: &mut Vec<u8>, opcode: u8, payload: &[u8], key: [u8; 4]) {
    push_header(out, opcode, payload.len(), key);
    let at = out.len();
    out.extend_from_slice(payload);
    mask(&mut out[at..], key);
}

/// One server frame found at the start of a buffer.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub fin: bool,
    pub opcode: u8,
    /// Payload range within the buffer that was parsed.
    pub start: usize,
    pub end: usize,
}

/// Parses one frame from the start of `buf`: `Ok(None)` when more bytes are needed.
/// Masked payloads are unmasked in place (servers must not mask, but it costs nothing).
pub fn parse(buf: &mut [u8]) -> Result<Option<Frame>, String> {
    if buf.len() < 2 {
        return Ok(None);
    }
    let fin = buf[0] & 0x80 != 0;
    if buf[0] & 0x70 != 0 {
        return Err("frame with reserved bits set (no extension was negotiated)".into());
    }
    let opcode = buf[0] & 0x0f;
    let masked = buf[1] & 0x80 != 0;
    let (len, mut at) = match buf[1] & 0x7f {
        126 => {
            if buf.len() < 4 {
                return Ok(None);
            }
            (u64::from(u16::from_be_bytes([buf[2], buf[3]])), 4)
        }
        127 => {
            let Some(b) = buf.get(2..10) else {
                return Ok(None);
            };
            let mut w = [0u8; 8];
            w.copy_from_slice(b);
            (u64::from_be_bytes(w), 10)
        }
        n => (u64::from(n), 2),
    };
    if len > MAX_FRAME as u64 {
        return Err(format!("server frame of {len} bytes is over {MAX_FRAME}"));
    }
    let len = len as usize;
    let key = if masked {
        let Some(k) = buf.get(at..at + 4) else {
            return Ok(None);
        };
        let key = [k[0], k[1], k[2], k[3]];
        at += 4;
        Some(key)
    } else {
        None
    };
    if buf.len() < at + len {
        return Ok(None);
    }
    if let Some(key) = key {
        mask(&mut buf[at..at + len], key);
    }
    Ok(Some(Frame {
        fin,
        opcode,
        start: at,
        end: at + len,
    }))
}

/// The HTTP/1.1 upgrade request, with the token as a bearer credential.
pub fn upgrade_request(host: &str, path: &str, token: &str) -> String {
    format!(
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Key: YXhob3N0LWxvYWQtdG9vbA==\r\nSec-WebSocket-Version: 13\r\n\
         Authorization: Bearer {token}\r\n\r\n"
    )
}

/// Checks the upgrade response in `buf`: `Ok(Some(n))` when the `n`-byte head is a 101,
/// `Ok(None)` when the head is not complete yet, `Err` with the status line otherwise.
pub fn upgrade_response(buf: &[u8]) -> Result<Option<usize>, String> {
    let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
        if buf.len() > 16 * 1024 {
            return Err("HTTP response head over 16 KiB".into());
        }
        return Ok(None);
    };
    let head = String::from_utf8_lossy(&buf[..end]);
    let status = head.lines().next().unwrap_or("");
    if status.starts_with("HTTP/1.1 101") {
        Ok(Some(end + 4))
    } else {
        Err(format!("upgrade refused: {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Server-side view of a client frame: (opcode, unmasked payload, bytes consumed).
    fn decode_client(buf: &[u8]) -> (u8, Vec<u8>, usize) {
        let mut b = buf.to_vec();
        let f = parse(&mut b).expect("valid").expect("complete");
        (b[0] & 0x0f, b[f.start..f.end].to_vec(), f.end)
    }

    #[test]
    fn masking_is_an_involution_for_every_length_and_alignment() {
        for len in 0..40 {
            let data: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37)).collect();
            let key = [0xde, 0xad, 0xbe, 0xef];
            let mut m = data.clone();
            mask(&mut m, key);
            for (i, (a, b)) in m.iter().zip(&data).enumerate() {
                assert_eq!(*a, b ^ key[i % 4], "len {len} byte {i}");
            }
            mask(&mut m, key);
            assert_eq!(m, data);
        }
    }

    #[test]
    fn encode_then_parse_in_all_three_length_forms() {
        let mut rng = Rng::new(7);
        for len in [0usize, 1, 125, 126, 127, 300, 65535, 65536, 70000] {
            let payload: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let key = rng.next_u32().to_ne_bytes();
            let mut out = Vec::new();
            encode(&mut out, OP_TEXT, &payload, key);
            let expected_header = match len {
                0..=125 => 2,
                126..=65535 => 4,
                _ => 10,
            } + 4;
            assert_eq!(out.len(), expected_header + len, "len {len}");
            assert_eq!(out[0], 0x81);
            assert_ne!(out[1] & 0x80, 0, "client frames are masked");
            let (op, got, used) = decode_client(&out);
            assert_eq!((op, used), (OP_TEXT, out.len()));
            assert_eq!(got, payload, "len {len}");
            // Every strict prefix is incomplete, never an error.
            for cut in [0, 1, 2, 3, expected_header - 1, out.len() - 1] {
                let mut p = out[..cut.min(out.len() - 1)].to_vec();
                assert_eq!(parse(&mut p), Ok(None), "len {len} cut {cut}");
            }
        }
    }

    #[test]
    fn parses_unmasked_server_frames_back_to_back() {
        let mut buf = vec![0x81, 3, b'a', b'b', b'c', 0x89, 0, 0x88, 2, 0x03, 0xe8];
        let f = parse(&mut buf).expect("ok").expect("frame");
        assert_eq!(
            (f.fin, f.opcode, &buf[f.start..f.end]),
            (true, OP_TEXT, &b"abc"[..])
        );
        let rest = &mut buf[f.end..];
        let g = parse(rest).expect("ok").expect("ping");
        assert_eq!((g.opcode, g.start, g.end), (OP_PING, 2, 2));
        let rest = &mut rest[g.end..];
        let c = parse(rest).expect("ok").expect("close");
        assert_eq!(
            (c.opcode, &rest[c.start..c.end]),
            (OP_CLOSE, &[0x03, 0xe8][..])
        );
        // 126 form from a server.
        let mut big = vec![0x81, 126, 0x01, 0x00];
        big.extend(std::iter::repeat_n(b'z', 256));
        let f = parse(&mut big).expect("ok").expect("frame");
        assert_eq!(f.end - f.start, 256);
        // Oversized and reserved-bit frames are errors.
        let mut huge = vec![0x81, 127, 0, 0, 0, 0, 0x10, 0, 0, 0];
        assert!(parse(&mut huge).is_err());
        assert!(parse(&mut [0xc1, 0]).is_err());
    }

    #[test]
    fn upgrade_response_statuses() {
        assert_eq!(upgrade_response(b"HTTP/1.1 101 Switching"), Ok(None));
        let ok = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n\x81\x00";
        assert_eq!(upgrade_response(ok), Ok(Some(ok.len() - 2)));
        let e = upgrade_response(b"HTTP/1.1 401 Unauthorized\r\ncontent-length: 0\r\n\r\n");
        assert_eq!(e, Err("upgrade refused: HTTP/1.1 401 Unauthorized".into()));
    }
}
