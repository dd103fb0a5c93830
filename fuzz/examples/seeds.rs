//! Writes the hand-made seeds of every target into `fuzz/corpus/<target>/seed-*`:
//! `cargo run --manifest-path fuzz/Cargo.toml --example seeds`. The committed corpus is these
//! seeds plus what fuzzing found, minimised with `cargo fuzz cmin` (see README.md).

use std::fs;
use std::path::Path;

use axhost_fuzz::sequence::{Method, Msg, Op, Script, Writes};
use axhost_fuzz::websocket::{TOKEN_ALICE, TOKEN_BOB};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target);
    fs::create_dir_all(&dir).expect("corpus dir");
    fs::write(dir.join(format!("seed-{name}")), bytes).expect("seed");
}

fn envelope() {
    let seeds: &[(&str, &[u8])] = &[
        (
            "request",
            br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"channel":"ahp-root://"}}"#,
        ),
        (
            "notification",
            br#"{"jsonrpc":"2.0","method":"unsubscribe","params":{"channel":"ahp-root://"}}"#,
        ),
        (
            "result",
            br#"{"jsonrpc":"2.0","id":7,"result":{"ok":true}}"#,
        ),
        (
            "error",
            br#"{"jsonrpc":"2.0","id":"a","error":{"code":-1,"message":"no","data":[1]}}"#,
        ),
        ("id-null", br#"{"jsonrpc":"2.0","id":null,"method":"x"}"#),
        (
            "id-huge",
            br#"{"jsonrpc":"2.0","id":123456789012345678901234567890e400,"method":"x"}"#,
        ),
        ("id-object", br#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#),
        (
            "escapes",
            br#"{"j\u0073onrpc":"2\u002e0","id":"\ud83d\ude00\n","method":"p\u0069ng"}"#,
        ),
        (
            "lone-surrogate-method",
            br#"{"jsonrpc":"2.0","method":"\ud800"}"#,
        ),
        (
            "lone-surrogate-params",
            br#"{"jsonrpc":"2.0","method":"x","params":"\udc00"}"#,
        ),
        (
            "dup-method",
            br#"{"jsonrpc":"2.0","id":1,"method":"a","method":"b"}"#,
        ),
        (
            "dup-escaped",
            br#"{"jsonrpc":"2.0","method":"a","\u006dethod":"b"}"#,
        ),
        (
            "dup-unknown",
            br#"{"jsonrpc":"2.0","method":"a","x":1,"x":2}"#,
        ),
        (
            "method-null",
            br#"{"jsonrpc":"2.0","id":1,"method":null,"result":1}"#,
        ),
        (
            "params-null",
            br#"{"jsonrpc":"2.0","id":1,"method":"x","params":null}"#,
        ),
        ("error-null", br#"{"jsonrpc":"2.0","id":1,"error":null}"#),
        ("both", br#"{"jsonrpc":"2.0","id":1,"result":1,"error":{}}"#),
        ("version", br#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#),
        ("batch", br#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#),
        ("scalar", b"42"),
        ("empty", b""),
        (
            "whitespace",
            b" \t\r\n{ \"jsonrpc\" : \"2.0\" , \"method\" : \"x\" } \n",
        ),
        ("form-feed", b"\x0c{\"jsonrpc\":\"2.0\",\"method\":\"x\"}"),
        ("bom", b"\xef\xbb\xbf{\"jsonrpc\":\"2.0\",\"method\":\"x\"}"),
        ("trailing", br#"{"jsonrpc":"2.0","method":"x"}{}"#),
        (
            "truncated",
            br#"{"jsonrpc":"2.0","method":"x","params":{"a":["#,
        ),
        (
            "not-utf8",
            b"{\"jsonrpc\":\"2.0\",\"method\":\"x\",\"y\":\"\xff\"}",
        ),
        ("type-then-cut", br#"{"jsonrpc":5,"#),
    ];
    for (name, bytes) in seeds {
        write("envelope", name, bytes);
    }
    let deep = format!(
        r#"{{"jsonrpc":"2.0","method":"x","params":{}{}}}"#,
        "[".repeat(1000),
        "]".repeat(1000)
    );
    write("envelope", "deep-params", deep.as_bytes());
}

fn structured() {
    for (i, len) in [8usize, 32, 128, 512].into_iter().enumerate() {
        let ramp: Vec<u8> = (0..len).map(|b| (b * 37 + i) as u8).collect();
        write("envelope_structured", &format!("ramp-{len}"), &ramp);
    }
    write("envelope_structured", "zeros", &[0; 64]);
    write("envelope_structured", "ones", &[0xff; 64]);
}

/// A masked client frame.
fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mask = [0x12, 0x34, 0x56, 0x78];
    let mut out = vec![u8::from(fin) << 7 | opcode];
    match payload.len() {
        n if n < 126 => out.push(0x80 | n as u8),
        n if n <= 0xffff => {
            out.push(0x80 | 126);
            out.extend((n as u16).to_be_bytes());
        }
        n => {
            out.push(0x80 | 127);
            out.extend((n as u64).to_be_bytes());
        }
    }
    out.extend(mask);
    out.extend(payload.iter().enumerate().map(|(i, b)| b ^ mask[i % 4]));
    out
}

fn websocket() {
    let head = |target: &str, extra: &str| {
        format!(
            "GET {target} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n{extra}\r\n"
        )
        .into_bytes()
    };
    let bearer = head("/axp", &format!("Authorization: Bearer {TOKEN_ALICE}\r\n"));
    let ping = br#"{"jsonrpc":"2.0","id":1,"method":"ping","params":{"channel":"ahp-root://"}}"#;
    let with = |mut h: Vec<u8>, frames: &[Vec<u8>]| {
        for f in frames {
            h.extend(f);
        }
        h
    };
    let close = |code: u16, reason: &str| {
        let mut p = code.to_be_bytes().to_vec();
        p.extend(reason.as_bytes());
        frame(true, 8, &p)
    };
    let seeds: Vec<(&str, Vec<u8>)> = vec![
        (
            "text-close",
            with(bearer.clone(), &[frame(true, 1, ping), close(1000, "bye")]),
        ),
        (
            "query-token",
            with(
                head(
                    "/?tkn=bob%20token%2B%2F%26%3D%25%3F%23%C3%A9%E2%82%AC%2024ch%21",
                    "",
                ),
                &[frame(true, 1, ping)],
            ),
        ),
        (
            "fragmented-utf8",
            with(
                bearer.clone(),
                &[
                    frame(false, 1, "h\u{e9}llo \u{20ac}".as_bytes().split_at(2).0),
                    frame(true, 9, b"ping!"),
                    frame(true, 0, "h\u{e9}llo \u{20ac}".as_bytes().split_at(2).1),
                ],
            ),
        ),
        (
            "invalid-utf8",
            with(bearer.clone(), &[frame(true, 1, b"\xc0\xaf")]),
        ),
        (
            "binary",
            with(bearer.clone(), &[frame(true, 2, b"\x00\x01")]),
        ),
        (
            "len16",
            with(bearer.clone(), &[frame(true, 1, &[b' '; 300])]),
        ),
        (
            "len64-claim",
            with(
                bearer.clone(),
                &[vec![0x81, 0xff, 0, 0, 0, 0, 0x01, 0, 0, 1, 1, 2, 3, 4]],
            ),
        ),
        (
            "unmasked",
            with(bearer.clone(), &[vec![0x81, 0x02, b'h', b'i']]),
        ),
        ("rsv", with(bearer.clone(), &[vec![0xc1, 0x80, 0, 0, 0, 0]])),
        (
            "reserved-opcode",
            with(bearer.clone(), &[frame(true, 3, b"")]),
        ),
        (
            "continuation-first",
            with(bearer.clone(), &[frame(true, 0, b"x")]),
        ),
        ("close-1005", with(bearer.clone(), &[frame(true, 8, b"")])),
        (
            "close-1byte",
            with(bearer.clone(), &[frame(true, 8, b"\x03")]),
        ),
        ("close-bad-code", with(bearer.clone(), &[close(999, "")])),
        (
            "close-bad-reason",
            with(bearer.clone(), &[frame(true, 8, b"\x03\xe8\xff")]),
        ),
        (
            "ping-big",
            with(bearer.clone(), &[frame(true, 9, &[1; 126])]),
        ),
        (
            "ping-fragmented",
            with(bearer.clone(), &[frame(false, 9, b"x")]),
        ),
        (
            "header-bearer-bob",
            with(
                head("/axp", &format!("authorization: bearer\t{TOKEN_BOB} \r\n")),
                &[],
            ),
        ),
        ("no-token", head("/axp", "")),
        (
            "wrong-origin",
            head(
                "/axp",
                &format!("Authorization: Bearer {TOKEN_ALICE}\r\nOrigin: https://evil.example\r\n"),
            ),
        ),
        ("healthz", b"GET /healthz HTTP/1.1\r\n\r\n".to_vec()),
        ("post", b"POST /axp HTTP/1.1\r\n\r\n".to_vec()),
        ("partial-head", b"GET /axp HTTP/1.1\r\nHost:".to_vec()),
        ("garbage", b"GET \x00\x01 HTTP/9\r\n\r\n".to_vec()),
    ];
    for (name, bytes) in seeds {
        write("websocket", name, &bytes);
    }
    write("websocket", "generated", &[0x55; 200]);
}

fn call(conn: u8, method: Method, id: u8, args: [u8; 4]) -> Op {
    Op::Send {
        conn,
        msg: Msg::Call {
            method,
            id,
            args,
            notify: false,
        },
    }
}

fn notify(conn: u8, method: Method, args: [u8; 4]) -> Op {
    Op::Send {
        conn,
        msg: Msg::Call {
            method,
            id: 0,
            args,
            notify: true,
        },
    }
}

fn host_sequence() {
    let connect = |who| Op::Connect { who, init: true };
    let answer = |conn, kind| Op::Send {
        conn,
        msg: Msg::Answer { pick: 1, kind },
    };
    let register = |conn| call(conn, Method::RegisterService, 1, [0, 2, 1, 2]);
    let request = |conn, id| call(conn, Method::ServiceRequest, id, [3, 1, 2, 2]);
    let scripts: Vec<(&str, Script)> = vec![
        (
            "services",
            Script {
                tight: false,
                close_at_once: true,
                session_limit: 0,
                ops: vec![
                    connect(0),
                    connect(2),
                    register(0),
                    call(1, Method::Subscribe, 2, [0, 3, 0, 0]),
                    request(1, 3),
                    answer(0, 0),
                    request(1, 4),
                    answer(0, 2),
                    request(1, 5),
                    notify(1, Method::CancelRequest, [0, 1, 0, 0]),
                    request(1, 6),
                    notify(1, Method::ServiceNotify, [3, 1, 2, 2]),
                    Op::Advance {
                        ms: 40_000,
                        wall: 0,
                    },
                    request(1, 7),
                    Op::Close { conn: 0 },
                ],
            },
        ),
        (
            "services-tight",
            Script {
                tight: true,
                close_at_once: false,
                session_limit: 0,
                ops: vec![
                    connect(0),
                    connect(0),
                    register(0),
                    register(0),
                    register(0),
                    request(1, 1),
                    request(1, 2),
                    request(1, 3),
                    answer(0, 4),
                    answer(0, 3),
                    Op::Expire,
                    Op::Close { conn: 1 },
                    answer(0, 0),
                ],
            },
        ),
        (
            "sessions",
            Script {
                tight: false,
                close_at_once: true,
                session_limit: 0,
                ops: vec![
                    connect(0),
                    connect(1),
                    call(0, Method::CreateSession, 1, [0, 8, 3, 0]),
                    call(0, Method::Subscribe, 2, [0, 5, 0, 0]),
                    call(1, Method::Subscribe, 2, [0, 0, 0, 0]),
                    call(0, Method::DispatchAction, 3, [0, 5, 0, 1]),
                    call(0, Method::DispatchAction, 4, [0, 5, 3, 2]),
                    notify(0, Method::DispatchAction, [0, 5, 6, 1]),
                    call(0, Method::ListSessions, 5, [0, 0, 2, 1]),
                    call(1, Method::ResourceRead, 6, [0, 0, 0, 0]),
                    Op::Flush { conn: 0, frames: 3 },
                    call(0, Method::Unsubscribe, 7, [0, 5, 0, 0]),
                    Op::Close { conn: 0 },
                    Op::Connect {
                        who: 0,
                        init: false,
                    },
                    call(2, Method::Reconnect, 8, [0, 1, 0, 5]),
                ],
            },
        ),
        (
            "restart-commit-failure",
            Script {
                tight: false,
                close_at_once: true,
                session_limit: 0,
                ops: vec![
                    connect(0),
                    call(0, Method::CreateSession, 1, [0, 8, 3, 0]),
                    Op::Restart { fail_commits: 1 },
                    connect(0),
                    call(1, Method::CreateSession, 2, [0, 24, 3, 0]),
                    call(1, Method::CreateSession, 3, [0, 24, 3, 0]),
                    call(1, Method::DispatchAction, 4, [0, 5, 0, 1]),
                ],
            },
        ),
        (
            "limits-tight",
            Script {
                tight: true,
                close_at_once: true,
                session_limit: 0,
                ops: vec![
                    connect(0),
                    connect(1),
                    connect(2),
                    connect(3),
                    connect(0),
                    call(0, Method::CreateSession, 1, [0, 8, 3, 0]),
                    call(1, Method::Subscribe, 2, [0, 0, 0, 0]),
                    call(1, Method::Subscribe, 3, [0, 5, 0, 0]),
                    call(1, Method::Subscribe, 4, [0, 3, 0, 0]),
                    call(1, Method::Subscribe, 5, [0, 8, 0, 0]),
                    call(0, Method::DispatchAction, 6, [0, 5, 0, 1]),
                    call(0, Method::DispatchAction, 7, [0, 5, 3, 2]),
                    call(0, Method::DispatchAction, 8, [0, 5, 3, 3]),
                    call(0, Method::DispatchAction, 9, [0, 5, 3, 5]),
                ],
            },
        ),
        (
            // Tight limits with one session (`SESSION_LIMITS[1]`): the second create meets the
            // limit, a repeat of the first still hears it exists, and after a restart over the
            // store the limit still holds.
            "session-limit",
            Script {
                tight: true,
                close_at_once: true,
                session_limit: 1,
                ops: vec![
                    connect(0),
                    call(0, Method::CreateSession, 1, [0, 8, 3, 0]),
                    call(0, Method::CreateSession, 2, [0, 24, 3, 0]),
                    call(0, Method::CreateSession, 3, [0, 8, 3, 0]),
                    call(0, Method::ListSessions, 4, [0, 1, 0, 1]),
                    Op::Restart { fail_commits: 0 },
                    connect(0),
                    call(1, Method::CreateSession, 5, [0, 40, 3, 0]),
                ],
            },
        ),
        (
            // Three short turns and two pending messages fill s1's chat (1024 bytes); s2's
            // turns then fill the host (1536); a restart recounts both.
            "chat-limits",
            Script {
                tight: true,
                close_at_once: true,
                session_limit: 0,
                ops: {
                    let dispatch =
                        |b: u8, c: u8, d: u8| notify(0, Method::DispatchAction, [0, b, c, d]);
                    let mut ops = vec![
                        connect(0),
                        call(0, Method::CreateSession, 1, [0, 8, 3, 0]),
                        call(0, Method::CreateSession, 2, [0, 24, 3, 0]),
                        call(0, Method::Subscribe, 3, [0, 5, 0, 0]),
                    ];
                    for chat in [5, 21] {
                        for d in 1..=3 {
                            ops.push(dispatch(chat, 0, d));
                            ops.push(dispatch(chat, 5, d));
                        }
                        // Queued starts at once on an idle chat, steering interrupts it.
                        ops.extend([
                            dispatch(chat, 3, 1),
                            dispatch(chat, 3, 2),
                            dispatch(chat, 3, 4),
                        ]);
                    }
                    ops.extend([
                        Op::Restart { fail_commits: 0 },
                        connect(0),
                        notify(1, Method::DispatchAction, [0, 5, 3, 6]),
                    ]);
                    ops
                },
            },
        ),
        (
            "handshake",
            Script {
                tight: false,
                close_at_once: false,
                session_limit: 0,
                ops: vec![
                    Op::Connect {
                        who: 1,
                        init: false,
                    },
                    call(0, Method::Ping, 1, [0; 4]),
                    call(0, Method::Subscribe, 2, [0; 4]),
                    call(0, Method::Initialize, 3, [0, 2, 0, 0]),
                    Op::Connect {
                        who: 2,
                        init: false,
                    },
                    Op::Expire,
                    Op::Close { conn: 1 },
                ],
            },
        ),
        (
            "garbage",
            Script {
                tight: false,
                close_at_once: true,
                session_limit: 0,
                ops: vec![
                    connect(0),
                    Op::Send {
                        conn: 0,
                        msg: Msg::Raw(b"not json".to_vec()),
                    },
                    Op::Send {
                        conn: 0,
                        msg: Msg::Raw(br#"{"jsonrpc":"2.0","id":1e400,"method":"ping"}"#.to_vec()),
                    },
                    Op::Send {
                        conn: 0,
                        msg: Msg::Mutated {
                            method: Method::Subscribe,
                            flips: vec![(10, b'"'), (30, b'}')],
                        },
                    },
                    call(0, Method::Unknown, 2, [0; 4]),
                    Op::Advance { ms: 5, wall: -100 },
                ],
            },
        ),
        // The write path: frames held until their change is durable, released by partial
        // groups; a closed transport with frames still held.
        (
            "write-held",
            Script {
                tight: true,
                close_at_once: false,
                session_limit: 2,
                ops: vec![
                    Op::Writer(Writes::Deferred),
                    connect(0),
                    connect(1),
                    call(0, Method::CreateSession, 1, [0, 8, 3, 0]),
                    call(1, Method::Subscribe, 2, [0, 5, 0, 0]),
                    call(0, Method::DispatchAction, 3, [0, 5, 0, 1]),
                    notify(0, Method::DispatchAction, [0, 5, 5, 4]),
                    notify(0, Method::DispatchAction, [0, 5, 0, 5]),
                    Op::Writer(Writes::Complete(1)),
                    Op::Flush { conn: 0, frames: 2 },
                    Op::Writer(Writes::Complete(2)),
                    Op::Close { conn: 1 },
                    Op::Writer(Writes::Complete(5)),
                    call(0, Method::ListSessions, 4, [0, 0, 0, 1]),
                ],
            },
        ),
        // A failed group: the answer to a dispatch becomes -32603, a notified dispatch its
        // rejection, a snapshot that showed rolled-back state -32603 and a 1011 close; the host
        // rolls back to the store.
        (
            "write-failed-group",
            Script {
                tight: false,
                close_at_once: true,
                session_limit: 0,
                ops: vec![
                    connect(0),
                    connect(1),
                    call(0, Method::CreateSession, 1, [0, 8, 3, 0]),
                    call(1, Method::Subscribe, 2, [0, 5, 0, 0]),
                    Op::Writer(Writes::Deferred),
                    call(0, Method::DispatchAction, 3, [0, 5, 0, 1]),
                    notify(0, Method::DispatchAction, [0, 5, 5, 4]),
                    call(1, Method::Subscribe, 4, [0, 8, 0, 0]),
                    Op::Writer(Writes::Fail(3)),
                    call(0, Method::ListSessions, 5, [0, 0, 0, 1]),
                    Op::Writer(Writes::Immediate),
                    call(0, Method::DispatchAction, 6, [0, 5, 0, 3]),
                ],
            },
        ),
        // A crash with changes queued: what no client was shown is lost, a replay from 0 shows
        // only durable events.
        (
            "write-crash",
            Script {
                tight: false,
                close_at_once: true,
                session_limit: 0,
                ops: vec![
                    connect(0),
                    call(0, Method::CreateSession, 1, [0, 8, 3, 0]),
                    call(0, Method::Subscribe, 2, [0, 5, 0, 0]),
                    Op::Writer(Writes::Deferred),
                    call(0, Method::DispatchAction, 3, [0, 5, 0, 1]),
                    notify(0, Method::DispatchAction, [0, 5, 5, 4]),
                    Op::Writer(Writes::Complete(1)),
                    Op::Restart { fail_commits: 4 },
                    Op::Connect {
                        who: 0,
                        init: false,
                    },
                    call(1, Method::Reconnect, 2, [0, 0, 0, 5]),
                ],
            },
        ),
        // The store refuses commits: a handshake's binding (at once), then the first change of
        // a group, so the whole group fails.
        (
            "write-refused",
            Script {
                tight: false,
                close_at_once: true,
                session_limit: 0,
                ops: vec![
                    Op::Writer(Writes::Refuse(1)),
                    connect(0),
                    connect(0),
                    call(1, Method::CreateSession, 1, [0, 8, 3, 0]),
                    Op::Writer(Writes::Deferred),
                    call(1, Method::DispatchAction, 2, [0, 5, 0, 1]),
                    call(1, Method::DispatchAction, 3, [0, 5, 5, 4]),
                    Op::Writer(Writes::Refuse(1)),
                    Op::Flush { conn: 1, frames: 1 },
                    Op::Writer(Writes::Complete(2)),
                    Op::Advance { ms: 10, wall: 0 },
                ],
            },
        ),
    ];
    for (name, script) in scripts {
        write("host_sequence", name, &script.encode());
        assert_eq!(
            Script::decode(&script.encode()),
            script,
            "{name} round trip"
        );
    }
    findings();
}

/// Named regressions built from findings: inputs that failed a check before their fix, replayed by
/// `cargo test` from `fuzz/regressions/<target>/`.
fn findings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions/host_sequence");
    fs::create_dir_all(&dir).expect("regressions dir");
    let raw = |text: &str| Op::Send {
        conn: 0,
        msg: Msg::Raw(text.as_bytes().to_vec()),
    };
    let script = |ops| Script {
        tight: false,
        close_at_once: true,
        session_limit: 0,
        ops,
    };
    // Registration JSON 127 levels deep (serde_json reads it) → a catalog snapshot 131 deep.
    let depth = 124;
    let metadata = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
    let register = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"client/registerService","params":{{"channel":"x-client-services://","metadata":{metadata}}}}}"#
    );
    let deep = script(vec![
        Op::Connect { who: 0, init: true },
        raw(&register),
        raw(
            r#"{"jsonrpc":"2.0","id":3,"method":"subscribe","params":{"channel":"x-client-services://"}}"#,
        ),
    ]);
    fs::write(
        dir.join("deep-metadata-breaks-catalog-snapshot"),
        deep.encode(),
    )
    .expect("finding");
}

fn main() {
    envelope();
    structured();
    websocket();
    host_sequence();
}
