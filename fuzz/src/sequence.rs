//! Target `host_sequence`: whole-core input sequences across several connections, fed to
//! `Host<MemStore>` the way the driver feeds it, with every output checked.
//!
//! A script is a list of operations: connect (as one of four principals), send a message
//! (rendered from a dictionary of every method shape the host serves, with generated ids,
//! channels, session and service ids, or raw/mutated text), report bytes flushed (whole frames,
//! as the driver's ledger does), close, advance time (`handle_timeout`), expire every deadline,
//! restart the host over its store (after settling the writer, or as a crash that loses what it
//! had queued; the next commits may fail), and steer the writer ([`Writes`]: commit at once,
//! queue commits, complete or fail the oldest queued ones as a group, make the store refuse
//! commits). Outputs are drained after each through [`axhost_core::drive::Drive`], which
//! carries out `Output::Commit` on the host's own store as the writer contract says.
//!
//! Checks, continuously:
//! - no panic (the core's debug assertions are on in fuzz builds; `MemStore` asserts commits
//!   come in order);
//! - outputs go only to connections that are connected and not yet reported closed; nothing is
//!   sent to a connection after its `Close`, and it is closed once;
//! - every frame is JSON (and strict JSON while every input was), and a well-formed JSON-RPC
//!   message; host-initiated requests are `clientService/handleRequest`;
//! - every response answers a request that connection sent, with its id, at most once per
//!   request; malformed input and requests are answered by the time nothing is in flight
//!   (at once while the writer keeps up), `clientService/request` then or later (relayed);
//! - nothing revealed before it is durable: an `action` event is in the store byte for byte
//!   when it leaves, and every `serverSeq` or `fromSeq` a frame shows (rejections, catalog
//!   events, handshakes, snapshots, replays) is covered by the store's mark; a restarted host
//!   resumes at or above every number shown;
//! - `queued_bytes` equals the bytes of the frames sent and not yet reported flushed (frames
//!   held for their change are not queued: they are `held_bytes`); a connection with nothing
//!   held holds no bytes; once nothing is in flight nothing is held anywhere; the changes the
//!   host has in flight are exactly the ones the writer has queued;
//! - after a failed group, and at every clean restart, the host's channels and clientId
//!   bindings equal those of a host built from the store (the durable state);
//! - after `handle_timeout(now)` no deadline at or before `now` is left;
//! - at the end, once the writer settled and past every timeout, no request is pending and
//!   nothing is held; once every connection is closed the connection, service and relay tables
//!   are empty; the clientId bindings equal the store's, with no principal over its idle quota;
//! - the same script on a second host gives the same outputs and changes, byte for byte.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use arbitrary::{Arbitrary, Unstructured};

use axhost_core::drive::{Commits, Drive};
use axhost_core::{
    stored_bindings, ConnId, Host, HostConfig, Input, Instant, Limits, MemStore, Now, Output,
    Principal, Role, SessionScope, CATALOG, ROOT,
};
use serde_json::{json, Value};

use crate::envelope::{self, Parsed};

/// A whole script. Decoded from bytes by [`Script::decode`] (one tag byte per operation, then
/// its arguments, so libFuzzer's byte mutations map to small script changes), encoded back by
/// [`Script::encode`] (the seed corpus is written that way).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Script {
    /// Small limits, so every limit is within reach.
    pub tight: bool,
    /// Report `Closed` at once when the host asks to close (as the driver does), or leave it to
    /// a later `Close` operation.
    pub close_at_once: bool,
    /// With tight limits, which session limit applies: [`SESSION_LIMITS`] by this index (mod 4).
    /// One session in a quarter of scripts, so a second create meets the limit within reach.
    pub session_limit: u8,
    /// The operations.
    pub ops: Vec<Op>,
}

/// One thing that happens outside the core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// A new authenticated connection, which sends `initialize` at once when `init` is set.
    Connect {
        /// Which principal.
        who: u8,
        /// Send a valid `initialize` right away.
        init: bool,
    },
    /// A message on a connection (by index into every connection so far).
    Send {
        /// Which connection.
        conn: u8,
        /// What.
        msg: Msg,
    },
    /// The driver wrote this many of the connection's frames.
    Flush {
        /// Which connection.
        conn: u8,
        /// Whole frames.
        frames: u8,
    },
    /// The transport is gone.
    Close {
        /// Which connection.
        conn: u8,
    },
    /// Time passes; the wall clock may jump back.
    Advance {
        /// Monotonic milliseconds.
        ms: u16,
        /// Wall-clock jump in seconds.
        wall: i8,
    },
    /// Time jumps just past the next deadline.
    Expire,
    /// The host stops and a new one starts over the same store.
    Restart {
        /// Commits the store refuses next (mod 4); bit 2: a crash (what the writer queued is
        /// lost) rather than a clean stop (the writer settles first).
        fail_commits: u8,
    },
    /// The writer changes how it carries out `Output::Commit`; see [`Writes`].
    Writer(Writes),
}

/// What the writer does. Changes come out of the host in order and are committed in order;
/// whatever this says, the script's end settles every queued change.
///
/// Encoded in the tag byte of the operation it precedes (`tag / 10`, 0 for none), so a
/// libFuzzer mutation of that byte changes the writer and keeps the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Writes {
    /// From now on commit each change as it comes out, and report it durable at once (after
    /// completing every queued change first, in order). How every script starts.
    Immediate,
    /// From now on queue each change: its frames are held until it completes.
    Deferred,
    /// Commit the oldest `n` queued changes as one group (one `Durable` for the group).
    Complete(u8),
    /// Fail the oldest `n` queued changes as one group without writing them (a failed
    /// transaction): the host rolls back to the durable state.
    Fail(u8),
    /// The store refuses its next `n` commits, whichever way they come
    /// (`MemStore::fail_next_commits`).
    Refuse(u8),
}

impl Writes {
    /// `index` 1..=25 (a tag byte / 10); 0 is no writer operation.
    fn from_index(index: u8) -> Option<Writes> {
        let k = index.checked_sub(1)?;
        let n = k / 5 + 1;
        Some(match k % 5 {
            0 => Writes::Refuse(n),
            1 => Writes::Complete(n),
            2 => Writes::Fail(n),
            3 => Writes::Immediate,
            _ => Writes::Deferred,
        })
    }

    /// The inverse of [`Writes::from_index`]; at most 23, so `index * 10 + tag` is a byte.
    fn to_index(self) -> u8 {
        let at = |kind: u8, n: u8| (n.clamp(1, 5) - 1) * 5 + kind + 1;
        match self {
            Writes::Refuse(n) => at(0, n),
            Writes::Complete(n) => at(1, n),
            Writes::Fail(n) => at(2, n),
            Writes::Immediate => at(3, 1),
            Writes::Deferred => at(4, 1),
        }
    }
}

/// The text of a message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Msg {
    /// A method from the dictionary, with generated arguments.
    Call {
        /// Which method.
        method: Method,
        /// Which id (when sent as a request).
        id: u8,
        /// Argument choices.
        args: [u8; 4],
        /// Send as a notification.
        notify: bool,
    },
    /// An answer to a request the host sent this connection.
    Answer {
        /// Which request.
        pick: u8,
        /// Result, error, malformed error, oversized.
        kind: u8,
    },
    /// Any text (bytes decoded lossily: the driver only delivers UTF-8).
    Raw(Vec<u8>),
    /// A dictionary message with some bytes changed.
    Mutated {
        /// Which method.
        method: Method,
        /// (position, byte) changes.
        flips: Vec<(u16, u8)>,
    },
}

/// The dictionary of method shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Method {
    Ping,
    Initialize,
    Reconnect,
    Subscribe,
    Unsubscribe,
    CreateSession,
    ListSessions,
    DispatchAction,
    ResourceRead,
    RegisterService,
    UpdateService,
    UnregisterService,
    ServiceRequest,
    ServiceNotify,
    CancelRequest,
    Unknown,
}

impl Method {
    const ALL: [Method; 16] = [
        Method::Ping,
        Method::Initialize,
        Method::Reconnect,
        Method::Subscribe,
        Method::Unsubscribe,
        Method::CreateSession,
        Method::ListSessions,
        Method::DispatchAction,
        Method::ResourceRead,
        Method::RegisterService,
        Method::UpdateService,
        Method::UnregisterService,
        Method::ServiceRequest,
        Method::ServiceNotify,
        Method::CancelRequest,
        Method::Unknown,
    ];

    fn from_byte(b: u8) -> Method {
        Method::ALL[usize::from(b) % Method::ALL.len()]
    }

    fn to_byte(self) -> u8 {
        Method::ALL.iter().position(|m| *m == self).unwrap_or(0) as u8
    }
}

impl Script {
    /// Reads a script: a header byte (bit 0: tight limits; bit 1: deferred `Closed`; bits 2-3:
    /// the session limit under tight limits), then operations until the bytes run out, each a
    /// tag byte and its arguments. The tag's value mod 10 is the operation; above 9, `tag / 10`
    /// is a [`Writes`] operation that runs first.
    pub fn decode(data: &[u8]) -> Script {
        let mut u = Unstructured::new(data);
        let byte = |u: &mut Unstructured<'_>| u8::arbitrary(u).unwrap_or(0);
        let header = byte(&mut u);
        let mut ops = Vec::new();
        while !u.is_empty() {
            let tag = byte(&mut u);
            if let Some(w) = Writes::from_index(tag / 10) {
                ops.push(Op::Writer(w));
            }
            let op = match tag % 10 {
                0 => Op::Connect {
                    who: byte(&mut u),
                    init: !byte(&mut u).is_multiple_of(4),
                },
                1 => Op::Send {
                    conn: byte(&mut u),
                    msg: Msg::Call {
                        method: Method::from_byte(byte(&mut u)),
                        id: byte(&mut u),
                        args: [byte(&mut u), byte(&mut u), byte(&mut u), byte(&mut u)],
                        notify: byte(&mut u).is_multiple_of(4),
                    },
                },
                2 => Op::Send {
                    conn: byte(&mut u),
                    msg: Msg::Answer {
                        pick: byte(&mut u),
                        kind: byte(&mut u),
                    },
                },
                3 => {
                    let conn = byte(&mut u);
                    // 255 announces a long message: two more bytes give its length.
                    let mut n = usize::from(byte(&mut u));
                    if n == 255 {
                        n = usize::from(u16::from_le_bytes([byte(&mut u), byte(&mut u)]));
                    }
                    let bytes = u.bytes(n.min(u.len())).unwrap_or_default().to_vec();
                    Op::Send {
                        conn,
                        msg: Msg::Raw(bytes),
                    }
                }
                4 => {
                    let conn = byte(&mut u);
                    let method = Method::from_byte(byte(&mut u));
                    let flips = (0..byte(&mut u) % 8)
                        .map(|_| {
                            let pos = u16::from_le_bytes([byte(&mut u), byte(&mut u)]);
                            (pos, byte(&mut u))
                        })
                        .collect();
                    Op::Send {
                        conn,
                        msg: Msg::Mutated { method, flips },
                    }
                }
                5 => Op::Flush {
                    conn: byte(&mut u),
                    frames: byte(&mut u),
                },
                6 => Op::Close { conn: byte(&mut u) },
                7 => Op::Advance {
                    ms: u16::from_le_bytes([byte(&mut u), byte(&mut u)]),
                    wall: byte(&mut u) as i8,
                },
                8 => Op::Expire,
                _ => Op::Restart {
                    fail_commits: byte(&mut u),
                },
            };
            ops.push(op);
        }
        Script {
            tight: header & 1 != 0,
            close_at_once: header & 2 == 0,
            session_limit: (header >> 2) & 3,
            ops,
        }
    }

    /// The bytes [`Script::decode`] reads back as this script.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![
            u8::from(self.tight)
                | if self.close_at_once { 0 } else { 2 }
                | (self.session_limit & 3) << 2,
        ];
        // A writer operation rides on the next operation's tag; one with no operation after it
        // (or another writer operation) rides on a flush of no frames, which does nothing.
        let mut writer = 0u8;
        for op in &self.ops {
            if let Op::Writer(w) = op {
                if writer != 0 {
                    out.extend([writer * 10 + 5, 0, 0]);
                }
                writer = w.to_index();
                continue;
            }
            let start = out.len();
            match op {
                Op::Writer(_) => continue,
                Op::Connect { who, init } => out.extend([0, *who, u8::from(*init)]),
                Op::Send { conn, msg } => match msg {
                    Msg::Call {
                        method,
                        id,
                        args,
                        notify,
                    } => {
                        out.extend([1, *conn, method.to_byte(), *id]);
                        out.extend(args);
                        out.push(if *notify { 0 } else { 1 });
                    }
                    Msg::Answer { pick, kind } => out.extend([2, *conn, *pick, *kind]),
                    Msg::Raw(bytes) => {
                        let n = bytes.len().min(usize::from(u16::MAX));
                        out.extend([3, *conn]);
                        if n < 255 {
                            out.push(n as u8);
                        } else {
                            out.push(255);
                            out.extend((n as u16).to_le_bytes());
                        }
                        out.extend(&bytes[..n]);
                    }
                    Msg::Mutated { method, flips } => {
                        let n = flips.len().min(7);
                        out.extend([4, *conn, method.to_byte(), n as u8]);
                        for (pos, b) in &flips[..n] {
                            out.extend(pos.to_le_bytes());
                            out.push(*b);
                        }
                    }
                },
                Op::Flush { conn, frames } => out.extend([5, *conn, *frames]),
                Op::Close { conn } => out.extend([6, *conn]),
                Op::Advance { ms, wall } => {
                    out.push(7);
                    out.extend(ms.to_le_bytes());
                    out.push(*wall as u8);
                }
                Op::Expire => out.push(8),
                Op::Restart { fail_commits } => out.extend([9, *fail_commits]),
            }
            out[start] += writer * 10;
            writer = 0;
        }
        if writer != 0 {
            out.extend([writer * 10 + 5, 0, 0]);
        }
        out
    }
}

const PRINCIPALS: usize = 4;

fn principal(i: usize) -> Principal {
    let only = |ids: &[&str]| SessionScope::Only(ids.iter().map(|s| (*s).to_owned()).collect());
    match i % PRINCIPALS {
        0 => Principal {
            id: "alice".into(),
            role: Role::Maintainer,
            sessions: SessionScope::All,
        },
        1 => Principal {
            id: "bob".into(),
            role: Role::Observer,
            sessions: SessionScope::All,
        },
        2 => Principal {
            id: "carol".into(),
            role: Role::Contributor,
            sessions: only(&["s1"]),
        },
        _ => Principal {
            id: "dave".into(),
            role: Role::Maintainer,
            sessions: only(&["s2"]),
        },
    }
}

/// Limits small enough that fuzzing reaches every one of them; the session limit is
/// [`SESSION_LIMITS`] by `session_limit` (mod 4).
pub fn tight_limits(session_limit: u8) -> Limits {
    Limits {
        connections_max: 4,
        subscriptions_per_conn_max: 3,
        message_bytes_max: 1024,
        frame_bytes_max: 65_536 + 512,
        handshake_timeout_ms: 1_000,
        queue_bytes_hard: 8_192,
        replay_events_max: 8,
        protocol_versions_max: 4,
        pending_messages_max: 2,
        queue_bytes_soft: 2_048,
        service_metadata_bytes_max: 64,
        service_method_bytes_max: 16,
        service_payload_bytes_max: 512,
        service_error_data_bytes_max: 64,
        services_per_conn_max: 2,
        relays_per_conn_max: 2,
        relays_per_service_max: 3,
        relay_timeout_ms: 500,
        relay_timeout_ms_max: 2_000,
        idle_client_ids_per_principal: 2,
        sessions_max: SESSION_LIMITS[usize::from(session_limit & 3)],
        // A chat fills after about five short turns, two chats fill the host.
        chat_bytes_max: 1024,
        chat_bytes_total_max: 1536,
        // Uploads must fit the small frames: 256 bytes of blob are 344 of base64.
        blob_bytes_max: 256,
        blob_storage_bytes_max: 4096,
        executors_max: 2,
        grants_per_session_max: 2,
        // Two changes in flight fill the write path while the writer queues, so messages are
        // held (backpressure), and a hold of four overflows.
        in_flight_changes_max: 2,
        held_messages_max: 4,
        held_message_bytes_max: 8192,
        memory_lessons_max: 2,
        memory_evidence_max: 2,
    }
}

/// The session limits a tight script may pick: below the pool of three (so creates are
/// refused), and at it.
pub const SESSION_LIMITS: [u32; 4] = [2, 1, 3, 2];

const SESSIONS: &[&str] = &["s1", "s2", "s3"];

fn channel(a: u8) -> String {
    let s = SESSIONS[usize::from(a / 16) % SESSIONS.len()];
    match a % 16 {
        0..=2 => ROOT.to_owned(),
        3 | 4 => CATALOG.to_owned(),
        5..=7 => format!("ahp-chat:/{s}"),
        8 | 9 => format!("ahp-session:/{s}"),
        10 => format!("ahp-changeset:/{s}"),
        11 => format!("axp-session:/{s}"),
        12 => "ahp-chat:/".to_owned(),
        13 => "ahp-session:/bad id".to_owned(),
        14 => "x-other://thing".to_owned(),
        _ => "ahp-chat:/nosuch".to_owned(),
    }
}

fn request_id(i: u8) -> String {
    match i % 12 {
        0..=5 => (i % 6).to_string(),
        6 => "\"a\"".into(),
        7 => "\"b\\u0020\"".into(),
        8 => "null".into(),
        9 => "-1".into(),
        10 => "12345678901234567890123".into(),
        _ => "1.5".into(),
    }
}

/// Per-connection state the harness keeps (the driver's view plus the oracle's bookkeeping).
#[derive(Debug, Default)]
struct Conn {
    /// Connected and not yet reported closed.
    live: bool,
    /// The host's `Close` for it came out.
    closing: bool,
    /// Byte lengths of frames sent and not yet reported flushed.
    unflushed: VecDeque<u64>,
    /// Requests awaiting their answer (held for their change, or relayed): raw id → count.
    pending: BTreeMap<String, u32>,
    /// Ids of `clientService/handleRequest` the host sent here.
    host_requests: Vec<u64>,
}

struct World {
    config: HostConfig,
    host: Host<MemStore>,
    /// The writer: carries out `Output::Commit` on the host's store, at once or queued.
    drive: Drive,
    /// How the writer currently commits.
    commits: Commits,
    seed: u64,
    close_at_once: bool,
    now: Now,
    conns: Vec<(ConnId, Conn)>,
    next_conn: u64,
    services: Vec<String>,
    /// Every input so far was strict JSON.
    strict: bool,
    /// Everything the host did, for the determinism check.
    trace: Vec<u8>,
    sends_this_host: u64,
    /// The highest `serverSeq` any frame showed, across restarts.
    revealed: u64,
    /// Changes issued and durable when the trace last noted them.
    traced_changes: (u64, u64),
}

/// The drive loop as the driver runs it: `Flushed` is the script's to report, `Closed` at once
/// or not as the script says.
fn drive(commits: Commits, close_at_once: bool) -> Drive {
    Drive::immediate()
        .commits(commits)
        .flush_at_once(false)
        .close_at_once(close_at_once)
}

impl World {
    fn new(script: &Script) -> World {
        let limits = if script.tight {
            tight_limits(script.session_limit)
        } else {
            Limits::default()
        };
        let config = HostConfig {
            limits,
            trust_groups: vec![vec!["alice".into(), "carol".into()]],
            ..HostConfig::default()
        };
        let host = Host::new(config.clone(), MemStore::new(), 7).expect("host");
        World {
            config,
            host,
            drive: drive(Commits::Immediate, script.close_at_once),
            commits: Commits::Immediate,
            seed: 7,
            close_at_once: script.close_at_once,
            now: Now {
                mono: Instant(0),
                wall_unix_ms: 1_700_000_000_000,
            },
            conns: Vec::new(),
            next_conn: 1,
            services: Vec::new(),
            strict: true,
            trace: Vec::new(),
            sends_this_host: 0,
            revealed: 0,
            traced_changes: (0, 0),
        }
    }

    fn index(&self, conn: ConnId) -> usize {
        self.conns
            .iter()
            .position(|(c, _)| *c == conn)
            .unwrap_or_else(|| panic!("output for {conn:?}, which never connected"))
    }

    fn pick(&self, i: u8) -> Option<usize> {
        (!self.conns.is_empty()).then(|| usize::from(i) % self.conns.len())
    }

    fn render(&self, at: usize, method: Method, id: u8, args: [u8; 4], notify: bool) -> String {
        let [a, b, c, d] = args;
        let client_id = format!("c{}", a % 4);
        let service = || -> String {
            if self.services.is_empty() || b.is_multiple_of(5) {
                "svc_00000000000000000000000000000000".into()
            } else {
                self.services[usize::from(b) % self.services.len()].clone()
            }
        };
        let (name, params) = match method {
            Method::Ping => ("ping", json!({ "channel": ROOT })),
            Method::Initialize => {
                let versions = match b % 5 {
                    0 => json!(["0.9.0"]),
                    1 => json!(["0.9.1", "0.9.0", "1.0.0"]),
                    2 => json!(["1.0.0"]),
                    3 => json!(["0.09.0"]),
                    _ => json!(["0.9.0", "0.9.0", "0.9.0", "0.9.0", "0.9.0"]),
                };
                let mut p =
                    json!({ "channel": ROOT, "protocolVersions": versions, "clientId": client_id });
                if c.is_multiple_of(2) {
                    p["initialSubscriptions"] = json!([channel(d), channel(d.wrapping_add(5))]);
                }
                ("initialize", p)
            }
            Method::Reconnect => {
                let seq = match b % 4 {
                    0 => 0,
                    1 => self.host.server_seq(),
                    2 => self.host.server_seq().saturating_sub(u64::from(c % 10)),
                    _ => u64::from(c) * 1000,
                };
                let subs = json!([channel(d), channel(c)]);
                (
                    "reconnect",
                    json!({ "channel": ROOT, "clientId": client_id, "lastSeenServerSeq": seq, "subscriptions": subs }),
                )
            }
            Method::Subscribe => ("subscribe", json!({ "channel": channel(b) })),
            Method::Unsubscribe => ("unsubscribe", json!({ "channel": channel(b) })),
            Method::CreateSession => {
                let mut p = json!({ "channel": channel(b) });
                match c % 4 {
                    0 => p["provider"] = json!("axp"),
                    1 => p["provider"] = json!("other"),
                    _ => {}
                }
                match d % 4 {
                    0 => p["config"] = json!({ "title": format!("t{d}") }),
                    1 => p["config"] = json!({ "task": format!("task-{}", d % 2) }),
                    2 => p["config"] = json!({ "title": "   " }),
                    _ => {}
                }
                ("createSession", p)
            }
            Method::ListSessions => {
                let mut p = json!({});
                if b.is_multiple_of(2) {
                    p["limit"] = json!(c % 5);
                }
                if d.is_multiple_of(3) {
                    p["cursor"] = json!("not-a-cursor");
                }
                ("listSessions", p)
            }
            Method::DispatchAction => {
                let action = chat_action(c, d);
                let seq = json!(u64::from(d % 8));
                (
                    "dispatchAction",
                    json!({ "channel": channel(b), "clientSeq": seq, "action": action }),
                )
            }
            Method::ResourceRead => {
                let uri = match b % 3 {
                    0 => format!(
                        "axp-blob:/axp-session%3A%2F{}/abc",
                        SESSIONS[usize::from(c) % 3]
                    ),
                    1 => "axp-blob:/%zz/x".to_owned(),
                    _ => "file:///etc/passwd".to_owned(),
                };
                ("resourceRead", json!({ "uri": uri }))
            }
            Method::RegisterService => {
                let mut p = json!({ "channel": if c.is_multiple_of(8) { ROOT } else { CATALOG } });
                p["metadata"] = match d % 5 {
                    0 => json!([1, 2]),
                    1 => json!({ "pad": "x".repeat(usize::from(d)) }),
                    _ => json!({ "protocol": format!("p{}", d % 3) }),
                };
                match b % 4 {
                    0 => p["audience"] = json!(["alice", "carol"]),
                    1 => p["audience"] = json!(["bad id!"]),
                    _ => {}
                }
                ("client/registerService", p)
            }
            Method::UpdateService => {
                let mut p = json!({ "channel": CATALOG, "serviceId": service() });
                match c % 4 {
                    0 => p["metadata"] = json!({ "v": d }),
                    1 => p["audience"] = Value::Null,
                    2 => p["audience"] = json!(["bob"]),
                    _ => {}
                }
                ("client/updateService", p)
            }
            Method::UnregisterService => (
                "client/unregisterService",
                json!({ "channel": CATALOG, "serviceId": service() }),
            ),
            Method::ServiceRequest | Method::ServiceNotify => {
                let m = match c % 4 {
                    0 => "",
                    1 => "a-method-name-longer-than-16",
                    _ => "echo",
                };
                let params = match d % 4 {
                    0 => json!({ "pad": "y".repeat(usize::from(d) * 4) }),
                    1 => Value::Null,
                    _ => json!([d]),
                };
                let mut p = json!({ "channel": if a.is_multiple_of(8) { ROOT } else { CATALOG }, "serviceId": service(), "method": m, "params": params });
                if matches!(method, Method::ServiceRequest) {
                    match a % 4 {
                        0 => p["timeoutMs"] = json!(0),
                        1 => p["timeoutMs"] = json!(u64::from(d) * 10),
                        2 => p["timeoutMs"] = json!(u64::MAX),
                        _ => {}
                    }
                    ("clientService/request", p)
                } else {
                    ("clientService/notify", p)
                }
            }
            Method::CancelRequest => {
                let own: Vec<&String> = self.conns[at].1.pending.keys().collect();
                let id = if own.is_empty() || b.is_multiple_of(4) {
                    request_id(c)
                } else {
                    own[usize::from(c) % own.len()].clone()
                };
                let id: Value = serde_json::from_str(&id).unwrap_or(Value::Null);
                ("$/cancelRequest", json!({ "channel": CATALOG, "id": id }))
            }
            Method::Unknown => ("frobnicate", json!({ "channel": ROOT })),
        };
        let params = params.to_string();
        let method = Value::from(name).to_string();
        if notify {
            format!(r#"{{"jsonrpc":"2.0","method":{method},"params":{params}}}"#)
        } else {
            let id = request_id(id);
            format!(r#"{{"jsonrpc":"2.0","id":{id},"method":{method},"params":{params}}}"#)
        }
    }

    fn answer(&self, at: usize, pick: u8, kind: u8) -> String {
        let asked = &self.conns[at].1.host_requests;
        let id = if asked.is_empty() || pick.is_multiple_of(8) {
            u64::from(pick)
        } else {
            asked[usize::from(pick) % asked.len()]
        };
        match kind % 6 {
            0 | 1 => format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{"ok":{kind}}}}}"#),
            2 => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"error":{{"code":-1,"message":"no","data":[{kind}]}}}}"#
            ),
            3 => format!(r#"{{"jsonrpc":"2.0","id":{id},"error":"not an object"}}"#),
            4 => format!(
                r#"{{"jsonrpc":"2.0","id":{id},"result":"{}"}}"#,
                "z".repeat(usize::from(kind) * 8)
            ),
            _ => format!(r#"{{"jsonrpc":"2.0","id":"{id}","result":null}}"#),
        }
    }

    fn run(&mut self, op: &Op) {
        match op {
            Op::Connect { who, init } => {
                let conn = ConnId(self.next_conn);
                self.next_conn += 1;
                self.conns.push((
                    conn,
                    Conn {
                        live: true,
                        ..Conn::default()
                    },
                ));
                let principal = Arc::new(principal(usize::from(*who)));
                self.host
                    .handle(self.now, Input::Connected { conn, principal });
                self.drain(false);
                if *init {
                    let at = self.conns.len() - 1;
                    let text = self.render(at, Method::Initialize, 0, [*who, 0, 1, 0], false);
                    self.send(at, &text);
                }
            }
            Op::Send { conn, msg } => {
                let Some(at) = self.pick(*conn) else { return };
                let text = match msg {
                    Msg::Call {
                        method,
                        id,
                        args,
                        notify,
                    } => self.render(at, *method, *id, *args, *notify),
                    Msg::Answer { pick, kind } => self.answer(at, *pick, *kind),
                    Msg::Raw(bytes) => String::from_utf8_lossy(bytes).into_owned(),
                    Msg::Mutated { method, flips } => {
                        let mut bytes = self
                            .render(at, *method, 1, [1, 2, 3, 4], false)
                            .into_bytes();
                        for (pos, b) in flips {
                            if !bytes.is_empty() {
                                let i = usize::from(*pos) % bytes.len();
                                bytes[i] = *b;
                            }
                        }
                        String::from_utf8_lossy(&bytes).into_owned()
                    }
                };
                self.send(at, &text);
            }
            Op::Flush { conn, frames } => {
                let Some(at) = self.pick(*conn) else { return };
                let (id, c) = &mut self.conns[at];
                if !c.live {
                    return;
                }
                let n = usize::from(*frames).min(c.unflushed.len());
                let bytes: u64 = c.unflushed.drain(..n).sum();
                if bytes > 0 {
                    let conn = *id;
                    self.host.handle(self.now, Input::Flushed { conn, bytes });
                    self.drain(false);
                }
            }
            Op::Close { conn } => {
                let Some(at) = self.pick(*conn) else { return };
                if self.conns[at].1.live {
                    self.closed(at);
                    self.drain(false);
                }
            }
            Op::Advance { ms, wall } => {
                self.now.mono = Instant(self.now.mono.0 + u64::from(*ms));
                let wall = self.now.wall_unix_ms as i64 + i64::from(*ms) + i64::from(*wall) * 1000;
                self.now.wall_unix_ms = wall.max(0) as u64;
                self.timeout();
            }
            Op::Expire => {
                if let Some(at) = self.host.poll_timeout() {
                    self.now.mono = Instant(at.0.max(self.now.mono.0) + 1);
                    self.now.wall_unix_ms += 1;
                }
                self.timeout();
            }
            Op::Restart { fail_commits } => {
                self.restart(u32::from(*fail_commits % 4), *fail_commits & 4 != 0)
            }
            Op::Writer(w) => self.writer(*w),
        }
    }

    fn writer(&mut self, w: Writes) {
        match w {
            Writes::Immediate => self.settle(),
            Writes::Deferred => self.set_commits(Commits::Queued),
            Writes::Complete(n) => {
                if self.drive.queued() > 0 {
                    let failures = self.host.stats().commit_failures;
                    self.drive
                        .complete(&mut self.host, self.now, usize::from(n));
                    if self.host.stats().commit_failures != failures {
                        self.check_durable_state("after a refused commit");
                    }
                    self.drain(false);
                }
            }
            Writes::Fail(n) => {
                if self.drive.queued() > 0 {
                    self.drive.fail(&mut self.host, self.now, usize::from(n));
                    self.check_durable_state("after a failed group");
                    self.drain(false);
                }
            }
            Writes::Refuse(n) => self.host.store_mut().fail_next_commits(u32::from(n)),
        }
    }

    /// Switches how the writer commits from now on; what it queued stays queued.
    fn set_commits(&mut self, commits: Commits) {
        self.commits = commits;
        let old = std::mem::replace(&mut self.drive, drive(commits, self.close_at_once));
        self.drive = old.commits(commits);
    }

    /// The writer catches up: every queued change is completed, in order, and from now on each
    /// is committed as it comes out, so nothing is in flight between operations.
    fn settle(&mut self) {
        self.set_commits(Commits::Immediate);
        while self.drive.queued() > 0 {
            let failures = self.host.stats().commit_failures;
            self.drive.complete(&mut self.host, self.now, usize::MAX);
            if self.host.stats().commit_failures != failures {
                self.check_durable_state("after a refused commit");
            }
            self.drain(false);
        }
        assert_eq!(self.host.changes_in_flight(), 0, "in flight once settled");
    }

    fn timeout(&mut self) {
        self.host.handle_timeout(self.now);
        self.drain(false);
        if let Some(at) = self.host.poll_timeout() {
            assert!(
                at > self.now.mono,
                "a deadline at {at:?} survived handle_timeout"
            );
        }
    }

    /// The host stops and a new one starts over its store. A clean stop settles the writer
    /// first (as the server's graceful stop does), so nothing is lost and every channel, binding
    /// and chat charge is as it was; a crash loses whatever the writer had queued, and only
    /// what was durable (everything any client was shown) survives.
    fn restart(&mut self, fail_commits: u32, crash: bool) {
        let before = if crash {
            self.drive.crash();
            None
        } else {
            let commits = self.commits;
            self.settle();
            self.set_commits(commits);
            self.check_durable_state("at a clean stop");
            Some((self.host.chat_bytes_total(), self.host.server_seq()))
        };
        let host = std::mem::replace(
            &mut self.host,
            Host::new(self.config.clone(), MemStore::new(), 0).expect("host"),
        );
        let mut store = host.into_store();
        store.fail_next_commits(fail_commits);
        self.seed += 1;
        self.host = Host::new(self.config.clone(), store, self.seed)
            .unwrap_or_else(|e| panic!("restart over the store failed: {e}"));
        // The new host numbers its changes from 1 again: a new writer, in the same mode.
        self.drive = drive(self.commits, self.close_at_once);
        assert!(
            self.host.server_seq() >= self.revealed,
            "a restarted host resumes at serverSeq {}, below {} already shown",
            self.host.server_seq(),
            self.revealed
        );
        if let Some((charged, server_seq)) = before {
            // What the chats' turns cost is recounted from the store as it was counted live.
            assert_eq!(
                self.host.chat_bytes_total(),
                charged,
                "chat bytes after a restart"
            );
            assert!(self.host.server_seq() >= server_seq, "serverSeq went back");
        }
        assert_eq!(self.host.audit_chat_bytes(), Ok(()));
        self.trace
            .extend_from_slice(if crash { b"crash\n" } else { b"restart\n" });
        self.sends_this_host = 0;
        self.traced_changes = (0, 0);
        // Every transport died with the old host.
        for (_, c) in &mut self.conns {
            *c = Conn::default();
        }
        self.services.clear();
    }

    /// The transport of `conns[at]` is gone: tell the host.
    fn closed(&mut self, at: usize) {
        let (conn, c) = &mut self.conns[at];
        *c = Conn::default();
        let conn = *conn;
        self.host.handle(self.now, Input::Closed { conn });
    }

    fn send(&mut self, at: usize, text: &str) {
        self.strict &= envelope::is_strict_json(text.as_bytes());
        let conn = self.conns[at].0;
        // A message counts only on a connection the host has not decided to close (its Close
        // may still wait behind held frames).
        let c = &self.conns[at].1;
        let heard = c.live && !c.closing && !self.host.connection_closing(conn);
        let parsed = envelope::classify(text.as_bytes());
        // What the host must answer, by raw id ("null" for malformed input), and whether that
        // answer may wait for another client (a relayed request).
        let (expect, relayed) = match &parsed {
            _ if !heard => (None, false),
            Parsed::NotJson | Parsed::NotJsonRpc => (Some("null".to_owned()), false),
            Parsed::Request { id, method, .. } => {
                (Some(id.clone()), method == "clientService/request")
            }
            _ => (None, false),
        };
        let before = expect.as_ref().map(|id| {
            let n = self.conns[at].1.pending.entry(id.clone()).or_default();
            *n += 1;
            *n
        });
        self.host.handle(self.now, Input::Message { conn, text });
        // A service's answer is relayed verbatim: its result is the service's, not the host's.
        self.drain(matches!(parsed, Parsed::Response { .. }));
        let c = &self.conns[at].1;
        if let (Some(id), Some(before)) = (expect, before) {
            // Held answers leave once their change is durable: by now if nothing is in flight.
            if self.drive.queued() == 0 && !relayed && c.live && !c.closing {
                let left = c.pending.get(&id).copied().unwrap_or(0);
                assert!(left < before, "no answer to request {id} on {conn:?}");
            }
        }
    }

    /// Drains every output through the writer and checks it. `relaying`: the input was a
    /// service's answer, whose result the host forwards unread.
    fn drain(&mut self, relaying: bool) {
        let mut outputs = Vec::new();
        self.drive
            .drain(&mut self.host, self.now, |out| outputs.push(out));
        // Closes are followed from the outputs themselves.
        let _ = self.drive.take_closed();
        for output in outputs {
            match output {
                Output::Send { conn, frame } => self.sent(conn, frame.as_bytes(), relaying),
                Output::Close { conn, code, reason } => {
                    self.trace.extend_from_slice(
                        format!("close {} {}\n", conn.0, code.code()).as_bytes(),
                    );
                    assert!(!reason.is_empty() && reason.len() <= 123);
                    let at = self.index(conn);
                    let c = &mut self.conns[at].1;
                    assert!(c.live, "Close for {conn:?}, which is closed");
                    assert!(!c.closing, "a second Close for {conn:?}");
                    c.closing = true;
                    // A closing connection gets nothing more, answers included.
                    c.pending.clear();
                    if self.close_at_once {
                        // The drive reported `Closed` at once.
                        *c = Conn::default();
                    }
                }
                Output::Commit(change) => {
                    panic!("the drive passed change {} on uncommitted", change.number)
                }
            }
        }
        self.check_queues();
        assert_eq!(self.host.stats().frames_out, self.sends_this_host);
        assert_eq!(
            self.host.changes_in_flight(),
            self.drive.queued(),
            "the host's changes in flight are not the writer's queue"
        );
        let changes = (self.host.changes_issued(), self.host.changes_durable());
        if changes != self.traced_changes {
            self.traced_changes = changes;
            self.trace
                .extend_from_slice(format!("changes {} {}\n", changes.0, changes.1).as_bytes());
        }
    }

    /// One frame the host sent, checked.
    fn sent(&mut self, conn: ConnId, bytes: &[u8], relaying: bool) {
        self.sends_this_host += 1;
        self.trace
            .extend_from_slice(format!("send {} {}\n", conn.0, bytes.len()).as_bytes());
        self.trace.extend_from_slice(bytes);
        let at = self.index(conn);
        let c = &mut self.conns[at].1;
        assert!(c.live, "a frame for {conn:?}, which is closed");
        assert!(!c.closing, "a frame for {conn:?} after its Close");
        c.unflushed.push_back(bytes.len() as u64);
        assert!(envelope::is_json(bytes), "a frame that is not JSON");
        if self.strict {
            assert!(
                envelope::is_strict_json(bytes),
                "a frame serde_json::Value cannot read, from strict input: {}",
                String::from_utf8_lossy(bytes)
            );
        }
        match envelope::classify(bytes) {
            Parsed::Response { id, .. } => {
                let n = c.pending.get_mut(&id).unwrap_or_else(|| {
                    panic!("a response with id {id} that {conn:?} is not waiting for")
                });
                *n -= 1;
                if *n == 0 {
                    c.pending.remove(&id);
                }
            }
            Parsed::Request { id, method, params } => {
                assert_eq!(method, "clientService/handleRequest");
                let id = id.parse::<u64>().expect("host request ids are integers");
                c.host_requests.push(id);
                assert!(params.is_some());
            }
            Parsed::Notification { method, params } => {
                self.learn(&method, params.as_deref());
            }
            other => panic!("the host sent {other:?}"),
        }
        // Frames that are not strict JSON (lone surrogates relayed verbatim) carry nothing the
        // durability checks read.
        let Ok(v) = serde_json::from_slice::<Value>(bytes) else {
            return;
        };
        if let Some(result) = v.get("result") {
            if let Some(id) = result.get("serviceId").and_then(Value::as_str) {
                self.services.push(id.to_owned());
            }
            if !relaying {
                self.check_answer(result);
            }
        }
        if v.get("method").and_then(Value::as_str) == Some("action") {
            let raw = std::str::from_utf8(bytes)
                .ok()
                .and_then(|f| f.strip_prefix(r#"{"jsonrpc":"2.0","method":"action","params":"#))
                .and_then(|r| r.strip_suffix('}'));
            self.check_event(&v["params"], raw);
        }
    }

    /// `n` is shown to a client: the store's durable mark covers it (a restarted host resumes
    /// above it).
    fn covered(&mut self, n: u64, what: &str) {
        let mark = self.host.store().server_seq();
        assert!(
            n <= mark,
            "{what} shows serverSeq {n} above the durable mark {mark}"
        );
        self.revealed = self.revealed.max(n);
    }

    /// An action envelope is shown (live, or replayed with `raw` unknown): a rejection's or a
    /// catalog event's number is covered; any other event is in the store, byte for byte.
    fn check_event(&mut self, env: &Value, raw: Option<&str>) {
        let seq = env
            .get("serverSeq")
            .and_then(Value::as_u64)
            .expect("an action envelope without a serverSeq");
        let channel = env.get("channel").and_then(Value::as_str).unwrap_or("");
        self.covered(seq, "an action envelope");
        if env.get("rejectionReason").is_some() || channel == CATALOG {
            return;
        }
        let stored = self
            .host
            .store()
            .event(seq)
            .unwrap_or_else(|| panic!("event {seq} on {channel} shown before it is durable"));
        let same = match raw {
            Some(raw) => raw == &*stored.envelope,
            None => {
                serde_json::from_str::<Value>(&stored.envelope)
                    .ok()
                    .as_ref()
                    == Some(env)
            }
        };
        assert!(
            same && &*stored.channel == channel,
            "event {seq} on {channel} differs from the durable event {seq} on {}",
            stored.channel
        );
    }

    /// What the host's own answers show: the handshake's `serverSeq`, snapshots' `fromSeq`,
    /// replayed envelopes.
    fn check_answer(&mut self, result: &Value) {
        let numbers = [
            (result.get("serverSeq"), "a handshake"),
            (result.pointer("/snapshot/fromSeq"), "a snapshot"),
        ];
        for (n, what) in numbers {
            if let Some(n) = n.and_then(Value::as_u64) {
                self.covered(n, what);
            }
        }
        if let Some(snapshots) = result.get("snapshots").and_then(Value::as_array) {
            for n in snapshots.iter().filter_map(|s| s.get("fromSeq")?.as_u64()) {
                self.covered(n, "a snapshot");
            }
        }
        if result.get("type").and_then(Value::as_str) == Some("replay") {
            if let Some(actions) = result.get("actions").and_then(Value::as_array) {
                for env in actions {
                    self.check_event(env, None);
                }
            }
        }
    }

    /// Service ids from catalog snapshots and changes.
    fn learn(&mut self, _method: &str, params: Option<&str>) {
        let Some(p) = params else { return };
        let mut at = 0;
        while let Some(i) = p[at..].find("\"svc_") {
            let start = at + i + 1;
            let end = start + 4 + 32;
            if let Some(id) = p.get(start..end) {
                if !self.services.iter().any(|s| s == id) {
                    self.services.push(id.to_owned());
                }
            }
            at = start;
        }
    }

    /// The byte ledger: what the driver was handed and has not flushed is `queued_bytes`;
    /// frames held for their change are `held_bytes` and never handed out; nothing is held once
    /// nothing is in flight.
    fn check_queues(&self) {
        let settled = self.host.changes_in_flight() == 0;
        for (conn, c) in &self.conns {
            let queued = self.host.queued_bytes(*conn);
            let held = self.host.held_bytes(*conn);
            let frames = self.host.held_frames(*conn);
            if c.live {
                assert_eq!(
                    queued,
                    Some(c.unflushed.iter().sum()),
                    "queued_bytes of {conn:?}"
                );
                if frames == 0 {
                    assert_eq!(held, Some(0), "{conn:?} holds bytes but no frames");
                }
                assert!(
                    !settled || frames == 0,
                    "{conn:?} holds {frames} frames with nothing in flight"
                );
                assert!(
                    !c.closing || frames == 0,
                    "{conn:?} holds {frames} frames after its Close"
                );
            } else {
                assert_eq!(queued, None, "{conn:?} is closed but still queued");
                assert_eq!(held, None, "{conn:?} is closed but still holds");
            }
        }
    }

    /// The host's state is the durable one: its channels, clientId bindings and chat charges
    /// equal those of a host built from its store. Holds whenever nothing but a reservation is
    /// in flight: right after a failure, once the writer settled.
    fn check_durable_state(&self, when: &str) {
        let fresh = Host::new(self.config.clone(), self.host.store().clone(), 0)
            .unwrap_or_else(|e| panic!("{when}, the store does not load: {e}"));
        let mut uris = vec![ROOT.to_owned()];
        for s in SESSIONS {
            uris.extend([
                format!("ahp-session:/{s}"),
                format!("ahp-chat:/{s}"),
                format!("ahp-changeset:/{s}"),
            ]);
        }
        for uri in &uris {
            assert!(
                self.host.channel_state(uri) == fresh.channel_state(uri),
                "{when}, the host's {uri} is not the durable one"
            );
        }
        assert!(
            self.host.client_bindings().eq(fresh.client_bindings()),
            "{when}, the clientId bindings are not the durable ones"
        );
        assert_eq!(
            self.host.chat_bytes_total(),
            fresh.chat_bytes_total(),
            "{when}, the chats' charges are not the durable ones"
        );
    }

    /// The end: the writer settles, every timeout fires, then every connection closes.
    fn finish(&mut self) {
        self.settle();
        self.check_durable_state("once the writer settled");
        let max = self
            .config
            .limits
            .relay_timeout_ms_max
            .max(self.config.limits.handshake_timeout_ms);
        self.now.mono = Instant(self.now.mono.0 + max + 1);
        self.timeout();
        assert_eq!(
            self.host.pending_requests(),
            0,
            "requests pending past every timeout"
        );
        for (conn, c) in &self.conns {
            if c.live && !c.closing {
                assert!(
                    c.pending.is_empty(),
                    "{conn:?} never got answers to {:?}",
                    c.pending
                );
            }
        }
        for at in 0..self.conns.len() {
            if self.conns[at].1.live {
                self.closed(at);
                self.drain(false);
            }
        }
        assert_eq!(self.host.connection_count(), 0);
        assert_eq!(
            self.host.service_count(),
            0,
            "services outlived their owners"
        );
        assert_eq!(
            self.host.pending_requests(),
            0,
            "relays outlived their callers"
        );
        assert!(self.host.poll_output().is_none());
        assert_eq!(self.host.changes_in_flight(), 0);
        self.check_bindings();
        assert_eq!(self.host.audit_chat_bytes(), Ok(()));
        self.check_durable_state("at the end");
    }

    /// The clientId bindings in memory are the ones the store holds, and no principal keeps
    /// more idle ones than its quota. Called with nothing in flight.
    fn check_bindings(&self) {
        let held: Vec<_> = self.host.client_bindings().cloned().map(Some).collect();
        let stored = stored_bindings(self.host.store());
        assert_eq!(held, stored, "bindings in memory differ from the store");
        for i in 0..PRINCIPALS {
            let id = principal(i).id;
            assert!(
                self.host.idle_client_ids(&id)
                    <= self.config.limits.idle_client_ids_per_principal as usize,
                "{id} keeps more idle clientIds than its quota"
            );
        }
    }
}

fn chat_action(c: u8, d: u8) -> Value {
    let turn = format!("t{}", d % 3);
    let message = json!({ "text": format!("hello {d}"), "origin": { "kind": if d.is_multiple_of(7) { "agent" } else { "user" } } });
    match c % 12 {
        0..=2 => json!({
            "type": "chat/turnStarted",
            "turnId": turn,
            "startedAt": "2020-01-01T00:00:00.000Z",
            "message": message,
        }),
        3 => json!({
            "type": "chat/pendingMessageSet",
            "kind": if d.is_multiple_of(2) { "steering" } else { "queued" },
            "id": format!("m{}", d % 4),
            "message": message,
        }),
        4 => {
            json!({ "type": "chat/pendingMessageRemoved", "kind": "queued", "id": format!("m{}", d % 4) })
        }
        5 => json!({ "type": "chat/turnCancelled", "turnId": turn, "duration": i64::from(d) - 5 }),
        6 => json!({ "type": "chat/turnComplete", "turnId": turn, "duration": 5 }),
        7 => json!({ "type": "chat/delta", "turnId": turn, "partId": "p", "content": "c" }),
        8 => json!({ "type": "session/titleChanged", "title": format!("T{d}") }),
        9 => {
            json!({ "type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": "tc-1", "approved": true })
        }
        10 => json!({ "type": "chat/frobnicated", "x": 1 }),
        _ => json!({ "type": "chat/turnStarted" }),
    }
}

/// Runs a script and returns the trace of everything the host did.
pub fn run_script(script: &Script) -> Vec<u8> {
    let mut world = World::new(script);
    for op in &script.ops {
        world.run(op);
    }
    world.finish();
    world.trace
}

/// The `host_sequence` target.
pub fn check(data: &[u8]) {
    let script = Script::decode(data);
    let first = run_script(&script);
    let second = run_script(&script);
    assert!(first == second, "the same inputs gave different outputs");
}
