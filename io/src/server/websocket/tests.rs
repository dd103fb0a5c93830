use super::memory::POOL_BUFFERS_MAX;
use super::*;
use std::collections::VecDeque;

/// A masked client frame.
fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    raw_frame(u8::from(fin) << 7 | opcode, true, payload)
}

fn raw_frame(b0: u8, masked: bool, payload: &[u8]) -> Vec<u8> {
    let mut out = vec![b0];
    let mask_bit = if masked { 0x80 } else { 0 };
    match payload.len() {
        n if n < 126 => out.push(mask_bit | n as u8),
        n if n <= 0xFFFF => {
            out.push(mask_bit | 126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(mask_bit | 127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    let key = [0x37, 0xfa, 0x21, 0x3d];
    if masked {
        out.extend_from_slice(&key);
    }
    out.extend(
        payload
            .iter()
            .enumerate()
            .map(|(i, b)| if masked { b ^ key[i % 4] } else { *b }),
    );
    out
}

/// A socket that hands out its bytes in fixed-size reads, then `WouldBlock` (or EOF).
struct Chunks {
    data: VecDeque<u8>,
    size: usize,
    eof: bool,
}

impl Read for Chunks {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.data.is_empty() {
            return if self.eof {
                Ok(0)
            } else {
                Err(io::ErrorKind::WouldBlock.into())
            };
        }
        let n = buf.len().min(self.size).min(self.data.len());
        for b in buf.iter_mut().take(n) {
            *b = self.data.pop_front().unwrap_or(0);
        }
        Ok(n)
    }
}

fn describe(step: &Step<'_>) -> String {
    match step {
        Step::Text(t) => format!("text {t}"),
        Step::Ping(p) => format!("ping {}", String::from_utf8_lossy(p)),
        Step::Pong(p) => format!("pong {}", String::from_utf8_lossy(p)),
        Step::Fragment => "fragment".into(),
        Step::Close(code) => format!("close {code:?}"),
        Step::Fail((code, _)) => format!("fail {code}"),
        Step::Drained => "drained".into(),
        Step::Eof => "eof".into(),
        Step::Error(e) => format!("error {e}"),
    }
}

/// A socket holding `data`, read whole, that then says `WouldBlock` (no EOF yet).
fn waiting(data: impl IntoIterator<Item = u8>) -> Chunks {
    Chunks {
        data: data.into_iter().collect(),
        size: usize::MAX,
        eof: false,
    }
}

/// Everything the reader produces from `bytes`, in reads of `size`, as owned strings. With
/// `park`, the reader gives its buffer back to `pool` before every step (more often than the
/// driver, which parks once per read round) and takes one again to read.
fn transcript_with(
    bytes: &[u8],
    size: usize,
    max: usize,
    pool: &mut BufferPool,
    park: bool,
) -> Vec<String> {
    let mut src = Chunks {
        data: bytes.iter().copied().collect(),
        size,
        eof: true,
    };
    let mut reader = FrameReader::new(max, &[]);
    let mut out = Vec::new();
    loop {
        if park {
            reader.park(pool);
        }
        let step = reader.read_from(&mut src, pool);
        let line = describe(&step);
        let end = !matches!(
            step,
            Step::Text(_) | Step::Ping(_) | Step::Pong(_) | Step::Fragment | Step::Drained
        );
        if !matches!(step, Step::Fragment) {
            out.push(line);
        }
        if end {
            return out;
        }
    }
}

fn transcript(bytes: &[u8], size: usize, max: usize) -> Vec<String> {
    transcript_with(bytes, size, max, &mut BufferPool::default(), false)
}

/// The transcript of `bytes`, checked to be the same for every read size, with and without
/// parking between steps.
fn all_chunkings(bytes: &[u8], max: usize) -> Vec<String> {
    let whole = transcript(bytes, usize::MAX, max);
    let mut pool = BufferPool::default();
    for size in [1, 2, 3, 7, 13, 200, usize::MAX] {
        assert_eq!(transcript(bytes, size, max), whole, "reads of {size}");
        let parking = transcript_with(bytes, size, max, &mut pool, true);
        assert_eq!(parking, whole, "reads of {size}, parking");
    }
    assert!(pool.free_buffers() <= POOL_BUFFERS_MAX);
    whole
}

#[test]
fn whole_and_fragmented_text_with_control_frames_between() {
    let mut bytes = frame(true, OPCODE_TEXT, b"{\"a\":1}");
    bytes.extend(frame(false, OPCODE_TEXT, "h\u{e9}".as_bytes()));
    bytes.extend(frame(true, OPCODE_PING, b"p"));
    // The split falls inside a two-byte character.
    bytes.extend(frame(false, OPCODE_CONTINUATION, &[b'l', 0xC3]));
    bytes.extend(frame(true, OPCODE_CONTINUATION, &[0xA9, b'!']));
    bytes.extend(frame(true, OPCODE_PONG, b""));
    bytes.extend(frame(true, OPCODE_CLOSE, &[0x03, 0xE8, b'o', b'k']));
    assert_eq!(
        all_chunkings(&bytes, 1 << 20),
        [
            "text {\"a\":1}",
            "ping p",
            "text h\u{e9}l\u{e9}!",
            "pong ",
            "close Some(1000)"
        ]
    );
}

#[test]
fn every_length_form_and_a_frame_larger_than_the_buffer() {
    for n in [0, 125, 126, 65_535, 65_536, 3 * READ_BUFFER_BYTES + 5] {
        let text = "x".repeat(n);
        let mut bytes = frame(true, OPCODE_TEXT, text.as_bytes());
        bytes.extend(frame(true, OPCODE_TEXT, b"after"));
        let got = transcript(&bytes, 4096, 1 << 20);
        assert_eq!(got[0], format!("text {text}"), "length {n}");
        assert_eq!(got[1], "text after");
        assert_eq!(got[2], "eof");
    }
}

#[test]
fn the_buffer_shrinks_back_after_a_large_frame() {
    let mut pool = BufferPool::default();
    let big = "y".repeat(200_000);
    let mut src = waiting(frame(true, OPCODE_TEXT, big.as_bytes()));
    let mut reader = FrameReader::new(1 << 20, &[]);
    assert!(matches!(reader.read_from(&mut src, &mut pool), Step::Text(t) if t.len() == 200_000));
    assert!(reader.capacity() > 200_000);
    src.data.extend(frame(true, OPCODE_TEXT, b"small"));
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        "text small"
    );
    assert_eq!(reader.capacity(), READ_BUFFER_BYTES);
}

#[test]
fn an_announced_length_reserves_nothing_until_its_bytes_arrive() {
    let mut pool = BufferPool::default();
    let mut header = vec![0x81, 0x80 | 127];
    header.extend_from_slice(&(16u64 << 20).to_be_bytes());
    header.extend_from_slice(&[1, 2, 3, 4]);
    header.extend_from_slice(&[b'x'; 100]);
    let mut src = waiting(header);
    let mut reader = FrameReader::new(16 << 20, &[]);
    // Many turns, a few bytes each: the buffer only grows once it is full.
    for _ in 0..100 {
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
        src.data.extend([b'x'; 10]);
    }
    assert_eq!(reader.capacity(), READ_BUFFER_BYTES);
    // Filling the buffer doubles it, no more.
    src.data
        .extend(std::iter::repeat_n(b'x', READ_BUFFER_BYTES));
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
    assert_eq!(reader.capacity(), 2 * READ_BUFFER_BYTES);
}

#[test]
fn early_bytes_are_read_first() {
    let mut pool = BufferPool::default();
    let early = frame(true, OPCODE_TEXT, b"early");
    let mut src = waiting(frame(true, OPCODE_TEXT, b"later"));
    let mut reader = FrameReader::new(1024, &early);
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        "text early"
    );
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        "text later"
    );
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
}

#[test]
fn a_reader_parks_a_frame_cut_short_and_keeps_its_buffer_for_more() {
    let mut pool = BufferPool::default();
    let first = frame(true, OPCODE_TEXT, b"one");
    let second = frame(true, OPCODE_TEXT, &[b'x'; 300]);
    let mut bytes = first.clone();
    bytes.extend_from_slice(&second[..100]);
    let mut src = waiting(bytes);
    let mut reader = FrameReader::new(1 << 20, &[]);
    assert!(
        !reader.holds_buffer(),
        "a new reader takes no buffer until it reads"
    );
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "text one");
    assert!(reader.holds_buffer());
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
    // 100 bytes of the second frame are left: set aside, the buffer goes back.
    reader.park(&mut pool);
    assert!(!reader.holds_buffer());
    assert_eq!(reader.buffered(), 100);
    assert_eq!(pool.free_buffers(), 1);
    assert!(
        reader.capacity() < PARKED_BYTES_MAX + 512,
        "{}",
        reader.capacity()
    );
    src.data.extend(second[100..].iter().copied());
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        format!("text {}", "x".repeat(300))
    );
    assert_eq!(
        pool.free_buffers(),
        0,
        "the reader took the pooled buffer back"
    );
    // More than `PARKED_BYTES_MAX` unparsed (a round's budget ran out): the buffer stays.
    let many: Vec<u8> = (0..20).flat_map(|_| second.clone()).collect();
    src.data.extend(many);
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        format!("text {}", "x".repeat(300))
    );
    assert!(reader.buffered() > PARKED_BYTES_MAX);
    reader.park(&mut pool);
    assert!(reader.holds_buffer());
    assert_eq!(pool.free_buffers(), 0);
    for _ in 0..19 {
        assert!(matches!(reader.read_from(&mut src, &mut pool), Step::Text(t) if t.len() == 300));
    }
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
    reader.park(&mut pool);
    assert!(!reader.holds_buffer());
    assert_eq!(reader.buffered(), 0);
}

#[test]
fn early_bytes_wait_parked_until_the_first_read() {
    let mut pool = BufferPool::default();
    let early = frame(true, OPCODE_TEXT, b"early");
    let mut src = waiting(Vec::new());
    let mut reader = FrameReader::new(1024, &early);
    assert_eq!(reader.buffered(), early.len());
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        "text early"
    );
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
}

#[test]
fn the_pool_reuses_the_last_buffer_and_keeps_a_few_standard_ones() {
    let mut pool = BufferPool::default();
    let mut readers: Vec<FrameReader> = (0..POOL_BUFFERS_MAX + 4)
        .map(|_| FrameReader::new(1 << 20, &[]))
        .collect();
    for reader in &mut readers {
        assert!(matches!(
            reader.read_from(&mut waiting([]), &mut pool),
            Step::Drained
        ));
    }
    for reader in &mut readers {
        reader.park(&mut pool);
    }
    assert_eq!(pool.free_buffers(), POOL_BUFFERS_MAX);
    // The buffer a reader gives back is the next one lent (warm in cache).
    let mut a = FrameReader::new(1 << 20, &[]);
    assert!(matches!(
        a.read_from(&mut waiting([]), &mut pool),
        Step::Drained
    ));
    let lent = a.buf.as_ptr();
    a.park(&mut pool);
    let mut b = FrameReader::new(1 << 20, &[]);
    assert!(matches!(
        b.read_from(&mut waiting([]), &mut pool),
        Step::Drained
    ));
    assert_eq!(b.buf.as_ptr(), lent);
    // A buffer grown for a large frame is freed, not pooled.
    let big = "y".repeat(100_000);
    let mut src = waiting(frame(true, OPCODE_TEXT, big.as_bytes()));
    assert!(matches!(b.read_from(&mut src, &mut pool), Step::Text(t) if t.len() == 100_000));
    let free = pool.free_buffers();
    b.park(&mut pool);
    assert!(!b.holds_buffer());
    assert_eq!(pool.free_buffers(), free);
}

#[test]
fn fragments_are_charged_to_the_shared_budget_and_the_one_that_crosses_it_fails() {
    let mut pool = BufferPool::default();
    let budget = PartialBudget::new(3000);
    let mut a = FrameReader::sharing(4000, &[], budget.clone());
    let mut b = FrameReader::sharing(4000, &[], budget.clone());
    let mut a_src = waiting(frame(false, OPCODE_TEXT, &[b'a'; 1000]));
    a_src
        .data
        .extend(frame(false, OPCODE_CONTINUATION, &[b'a'; 1000]));
    assert_eq!(describe(&a.read_from(&mut a_src, &mut pool)), "fragment");
    assert_eq!(describe(&a.read_from(&mut a_src, &mut pool)), "fragment");
    assert_eq!(budget.held(), 2000, "a holds its two fragments");
    // b's first fragment would take the total to 3500: b fails, a is untouched.
    let mut b_src = waiting(frame(false, OPCODE_TEXT, &[b'b'; 1500]));
    assert_eq!(describe(&b.read_from(&mut b_src, &mut pool)), "fail 1013");
    assert_eq!(budget.held(), 2000);
    drop(b);
    a_src.data.extend(frame(true, OPCODE_CONTINUATION, b"!"));
    let text = describe(&a.read_from(&mut a_src, &mut pool));
    assert_eq!(text, format!("text {}!", "a".repeat(2000)));
    // Delivered: the next step frees the assembly buffer and its charge.
    assert_eq!(describe(&a.read_from(&mut a_src, &mut pool)), "drained");
    assert_eq!(budget.held(), 0);
    a.park(&mut pool);
    // Room again for what b was refused.
    let mut c = FrameReader::sharing(4000, &[], budget.clone());
    let mut c_src = waiting(frame(false, OPCODE_TEXT, &[b'c'; 1500]));
    assert_eq!(describe(&c.read_from(&mut c_src, &mut pool)), "fragment");
    assert_eq!(budget.held(), 1500);
    drop(c);
    assert_eq!(budget.held(), 0, "a dropped reader gives its charge back");
}

#[test]
fn a_large_frame_is_charged_while_it_arrives_and_released_after() {
    let mut pool = BufferPool::default();
    let max = 4 * READ_BUFFER_BYTES;
    let budget = PartialBudget::new(2 * READ_BUFFER_BYTES);
    let mut reader = FrameReader::sharing(max, &[], budget.clone());
    let big = frame(true, OPCODE_TEXT, &vec![b'x'; 3 * READ_BUFFER_BYTES]);
    // Half of it: the buffer doubles once, charged beyond its standard size.
    let mut src = waiting(big[..READ_BUFFER_BYTES + 100].iter().copied());
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
    assert_eq!(budget.held(), READ_BUFFER_BYTES);
    reader.park(&mut pool);
    assert!(reader.holds_buffer(), "mid-frame, the grown buffer stays");
    // The rest needs the buffer at 3x + header: past the budget of 2x, so it fails.
    src.data
        .extend(big[READ_BUFFER_BYTES + 100..].iter().copied());
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        "fail 1013"
    );
    drop(reader);
    assert_eq!(budget.held(), 0);
    // Under a budget that holds it, the same frame arrives, and its charge goes once the
    // reader is parked.
    let budget = PartialBudget::new(4 * READ_BUFFER_BYTES);
    let mut reader = FrameReader::sharing(max, &[], budget.clone());
    let mut src = waiting(big.iter().copied());
    assert!(matches!(
        reader.read_from(&mut src, &mut pool),
        Step::Text(t) if t.len() == 3 * READ_BUFFER_BYTES
    ));
    assert!(budget.held() > 2 * READ_BUFFER_BYTES);
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
    reader.park(&mut pool);
    assert_eq!(budget.held(), 0);
}

#[test]
fn violations_close_with_their_codes() {
    let max = 1000;
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (raw_frame(0x81, false, b"unmasked"), "fail 1002"),
        (raw_frame(0xC1, true, b"rsv1"), "fail 1002"),
        (raw_frame(0x83, true, b"reserved opcode"), "fail 1002"),
        (raw_frame(0x8B, true, b""), "fail 1002"),
        (frame(true, OPCODE_BINARY, b"bin"), "fail 1003"),
        (frame(true, OPCODE_CONTINUATION, b"orphan"), "fail 1002"),
        (frame(false, OPCODE_PING, b""), "fail 1002"),
        (frame(true, OPCODE_PING, &[b'p'; 126]), "fail 1002"),
        (frame(true, OPCODE_TEXT, &[0xFF]), "fail 1007"),
        (frame(true, OPCODE_TEXT, &[b'x'; 1001]), "fail 1009"),
        (frame(true, OPCODE_CLOSE, &[0x03]), "fail 1002"),
        (frame(true, OPCODE_CLOSE, &[0x03, 0xE8, 0xFF]), "fail 1007"),
        (frame(true, OPCODE_CLOSE, &[0x03, 0xED]), "close Some(1002)"),
        (frame(true, OPCODE_CLOSE, &[0x0B, 0xB8]), "close Some(3000)"),
        (frame(true, OPCODE_CLOSE, b""), "close None"),
    ];
    for (bytes, want) in cases {
        assert_eq!(all_chunkings(&bytes, max), [want], "{bytes:02x?}");
    }
    // Fragments: a text frame inside a fragmented message, a binary start, a message that
    // grows past the limit, and invalid UTF-8 noticed before the last fragment.
    let mut interleaved = frame(false, OPCODE_TEXT, b"a");
    interleaved.extend(frame(true, OPCODE_TEXT, b"b"));
    assert_eq!(all_chunkings(&interleaved, max), ["fail 1002"]);
    let mut long = frame(false, OPCODE_TEXT, &[b'x'; 600]);
    long.extend(frame(true, OPCODE_CONTINUATION, &[b'x'; 401]));
    assert_eq!(all_chunkings(&long, max), ["fail 1009"]);
    let mut broken = frame(false, OPCODE_TEXT, &[b'x', 0xC0, 0xAF]);
    broken.extend(frame(false, OPCODE_CONTINUATION, b"never read"));
    assert_eq!(all_chunkings(&broken[..9], max), ["fail 1007"]);
    // A cut character at the end of the last fragment is invalid, not pending.
    assert_eq!(
        all_chunkings(&frame(true, OPCODE_TEXT, &[b'x', 0xC3]), max),
        ["fail 1007"]
    );
}

#[test]
fn an_oversized_header_is_refused_before_its_payload() {
    let mut header = vec![0x81, 0x80 | 127];
    header.extend_from_slice(&(1u64 << 40).to_be_bytes());
    header.extend_from_slice(&[1, 2, 3, 4]);
    assert_eq!(all_chunkings(&header, 1 << 20), ["fail 1009"]);
}

#[test]
fn a_partial_frame_waits_and_eof_ends_it() {
    let mut pool = BufferPool::default();
    let bytes = frame(true, OPCODE_TEXT, b"incomplete");
    let mut src = waiting(bytes[..8].iter().copied());
    let mut reader = FrameReader::new(1024, &[]);
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "drained");
    assert_eq!(reader.buffered(), 8);
    src.data.extend(&bytes[8..]);
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        "text incomplete"
    );
    src.eof = true;
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "eof");
}

#[test]
fn nothing_is_parsed_after_a_close_or_a_violation() {
    let mut pool = BufferPool::default();
    let mut bytes = frame(true, OPCODE_CLOSE, b"");
    bytes.extend(frame(true, OPCODE_TEXT, b"after close"));
    let mut src = waiting(bytes);
    let mut reader = FrameReader::new(1024, &[]);
    assert_eq!(
        describe(&reader.read_from(&mut src, &mut pool)),
        "close None"
    );
    assert!(matches!(
        reader.read_from(&mut src, &mut pool),
        Step::Fail(_)
    ));
}

#[test]
fn every_fragment_is_a_step_so_the_turn_budget_sees_it() {
    let mut pool = BufferPool::default();
    let mut bytes = frame(false, OPCODE_TEXT, b"a");
    for _ in 0..1000 {
        bytes.extend(frame(false, OPCODE_CONTINUATION, b""));
    }
    bytes.extend(frame(true, OPCODE_CONTINUATION, b"b"));
    let mut src = waiting(bytes);
    let mut reader = FrameReader::new(1024, &[]);
    for _ in 0..1001 {
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "fragment");
    }
    assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), "text ab");
}

#[test]
fn unmask_matches_the_bytewise_definition() {
    let key = [1, 2, 3, 250];
    let slow = |data: &[u8]| -> Vec<u8> {
        data.iter()
            .enumerate()
            .map(|(i, b)| b ^ key[i % 4])
            .collect()
    };
    for n in 0..100 {
        let data: Vec<u8> = (0..n).map(|i| (i * 7) as u8).collect();
        let mut fast = data.clone();
        let ascii = unmask(&mut fast, key);
        assert_eq!(fast, slow(&data));
        assert_eq!(ascii, fast.is_ascii(), "length {n}");
        // ASCII text, then one byte at or over 0x80 at each position in turn: the flag
        // must see it in the eight-byte words and in the remainder alike.
        let text: Vec<u8> = (0..n).map(|i| b'a' + (i % 26) as u8).collect();
        let masked = slow(&text);
        let mut plain = masked.clone();
        assert!(unmask(&mut plain, key), "length {n}");
        assert_eq!(plain, text);
        for at in 0..n {
            for high in [0x80u8, 0xc3, 0xff] {
                let mut t = text.clone();
                t[at] = high;
                let mut m = slow(&t);
                assert!(!unmask(&mut m, key), "length {n}, 0x{high:02x} at {at}");
                assert_eq!(m, t);
            }
        }
    }
}

#[test]
fn ascii_and_multibyte_text_frames_alike_reach_the_core() {
    let mut pool = BufferPool::default();
    // The ASCII path skips `from_utf8`; the other path keeps it, and still refuses bad bytes.
    for (payload, expect) in [
        (
            "plain ascii {\"a\":1}".as_bytes(),
            "text plain ascii {\"a\":1}".to_owned(),
        ),
        (
            "caf\u{e9} \u{1f600}".as_bytes(),
            "text caf\u{e9} \u{1f600}".to_owned(),
        ),
        (&[b'a', 0xff, b'b'][..], "fail 1007".to_owned()),
    ] {
        let mut reader = FrameReader::new(1 << 20, &[]);
        let mut src = waiting(frame(true, OPCODE_TEXT, payload));
        assert_eq!(describe(&reader.read_from(&mut src, &mut pool)), expect);
    }
}
