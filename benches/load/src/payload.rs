//! The application payload every system carries: the same bytes, the same size.
//!
//! `{"load":"@HHHHHHHHHHHHHHHH","pad":"xxxx…"}` where `H…` is the send time in nanoseconds since
//! the tool started, as 16 lowercase hex digits. Receivers find the `@` marker with a byte
//! search (it appears nowhere else in any frame the systems send), so they never parse JSON.

/// Prefix up to and including the marker.
const HEAD: &[u8] = b"{\"load\":\"@";
/// Between the stamp and the padding.
const MID: &[u8] = b"\",\"pad\":\"";
/// After the padding.
const TAIL: &[u8] = b"\"}";
/// Width of the hex stamp.
pub const STAMP_LEN: usize = 16;
/// The marker byte that precedes the stamp.
pub const MARKER: u8 = b'@';
/// Offset of the first stamp digit inside the payload.
pub const STAMP_AT: usize = HEAD.len();
/// Smallest payload that still holds the stamp and an empty pad.
pub const MIN_SIZE: usize = HEAD.len() + STAMP_LEN + MID.len() + TAIL.len();

/// A payload of exactly `size` bytes (`size >= MIN_SIZE`) with a zero stamp.
pub fn template(size: usize) -> Vec<u8> {
    let size = size.max(MIN_SIZE);
    let mut v = Vec::with_capacity(size);
    v.extend_from_slice(HEAD);
    v.extend_from_slice(&[b'0'; STAMP_LEN]);
    v.extend_from_slice(MID);
    v.resize(size - TAIL.len(), b'x');
    v.extend_from_slice(TAIL);
    v
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Writes `ns` as 16 hex digits into `dst[..16]`.
#[inline]
pub fn write_stamp(dst: &mut [u8], ns: u64) {
    for (i, d) in dst.iter_mut().take(STAMP_LEN).enumerate() {
        *d = HEX[((ns >> (60 - 4 * i)) & 0xf) as usize];
    }
}

/// Parses 16 hex digits from the start of `src`.
#[inline]
pub fn read_stamp(src: &[u8]) -> Option<u64> {
    let digits = src.get(..STAMP_LEN)?;
    let mut v = 0u64;
    for &c in digits {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | u64::from(d);
    }
    Some(v)
}

/// The stamp of a received message. `stamp_at` is where the connection's last stamp was found
/// (start it at [`STAMP_AT`]): every message on one connection wraps the payload in the same
/// bytes, so the stamp is found there without a search (Redis and NATS deliver the payload
/// itself, axhost wraps it in its notification envelope). A miss searches for the marker and
/// remembers where it was. Without the remembered offset the byte search through axhost's
/// envelope was 11% of the tool's CPU at 1->1 flat out, against 1% for Redis: a cost of the
/// instrument, not of the server measured.
#[inline]
pub fn find_stamp(msg: &[u8], stamp_at: &mut usize) -> Option<u64> {
    let at = *stamp_at;
    if at > 0 && msg.get(at - 1) == Some(&MARKER) {
        if let Some(v) = read_stamp(&msg[at..]) {
            return Some(v);
        }
    }
    let at = msg.iter().position(|&b| b == MARKER)? + 1;
    *stamp_at = at;
    read_stamp(&msg[at..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_has_exact_size_and_round_trips() {
        let mut p = template(200);
        assert_eq!(p.len(), 200);
        write_stamp(&mut p[STAMP_AT..], 0x0123_4567_89ab_cdef);
        let mut at = STAMP_AT;
        assert_eq!(find_stamp(&p, &mut at), Some(0x0123_4567_89ab_cdef));
        assert_eq!(at, STAMP_AT);
        let wrapped = [b"{\"params\":".as_slice(), &p, b"}"].concat();
        assert_eq!(find_stamp(&wrapped, &mut at), Some(0x0123_4567_89ab_cdef));
        assert_eq!(
            at,
            STAMP_AT + 10,
            "the search remembers where the stamp was"
        );
        write_stamp(&mut p[STAMP_AT..], 42);
        let wrapped = [b"{\"params\":".as_slice(), &p, b"}"].concat();
        assert_eq!(
            find_stamp(&wrapped, &mut at),
            Some(42),
            "found at the remembered offset"
        );
        assert_eq!(
            find_stamp(&p, &mut at),
            Some(42),
            "a moved stamp is searched for again"
        );
        assert_eq!(at, STAMP_AT);
        assert_eq!(find_stamp(b"no marker", &mut at), None);
        assert_eq!(find_stamp(b"@12", &mut at), None);
        let mut at = 0;
        assert_eq!(
            find_stamp(&p, &mut at),
            Some(42),
            "offset zero is never a stamp"
        );
        assert_eq!(template(1).len(), MIN_SIZE);
    }
}
