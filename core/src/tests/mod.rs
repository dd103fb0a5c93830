//! Host tests through the public surface: feed inputs, collect outputs, never touch private
//! state. Each test builds its own host with a fixed seed.

use std::sync::Arc;

use serde_json::{json, Value};

mod axp;
mod axp_checkpoint;
mod axp_memory;
mod axp_review;
mod backpressure;
mod schema;
mod services;
mod write_path;

use crate::drive::{Commits, Drive};
use crate::{
    ClientRecord, CloseCode, ConnId, Host, HostConfig, Input, Limits, MemStore, Now, Output,
    Principal, Role, SessionScope, Table,
};

struct Harness {
    host: Host<MemStore>,
    now: u64,
    /// Added to the wall clock only, to model a clock that steps.
    wall_skew_ms: i64,
    /// The shared drive loop: frames flushed at once, closes left to the test, commits
    /// carried out at once or held for `complete` / `fail_first` (a slow disk).
    drive: Drive,
}

impl Harness {
    fn new() -> Harness {
        Harness::with(HostConfig::default(), MemStore::new())
    }

    fn with(config: HostConfig, store: MemStore) -> Harness {
        Harness {
            host: Host::new(config, store, 42).expect("host"),
            now: 1_700_000_000_000,
            wall_skew_ms: 0,
            drive: Drive::immediate().close_at_once(false),
        }
    }

    fn limits(limits: Limits) -> Harness {
        Harness::with(
            HostConfig {
                limits,
                ..HostConfig::default()
            },
            MemStore::new(),
        )
    }

    fn now(&mut self) -> Now {
        self.now += 1;
        Now {
            mono: crate::Instant(self.now - 1_700_000_000_000),
            wall_unix_ms: self.now.saturating_add_signed(self.wall_skew_ms),
        }
    }

    fn connect(&mut self, conn: u64, principal: Principal) {
        let now = self.now();
        self.host.handle(
            now,
            Input::Connected {
                conn: ConnId(conn),
                principal: Arc::new(principal),
            },
        );
    }

    fn send(&mut self, conn: u64, msg: &Value) -> Vec<(u64, Value)> {
        self.send_raw(conn, &msg.to_string())
    }

    fn send_raw(&mut self, conn: u64, text: &str) -> Vec<(u64, Value)> {
        self.feed(conn, text);
        self.drain()
    }

    /// Hands `text` from `conn` to the host and leaves its outputs queued.
    fn feed(&mut self, conn: u64, text: &str) {
        let now = self.now();
        self.host.handle(
            now,
            Input::Message {
                conn: ConnId(conn),
                text,
            },
        );
    }

    /// Whether changes wait for `complete` / `fail_first` (a slow disk) instead of being
    /// committed as they come out.
    fn hold_commits(&mut self, hold: bool) {
        self.drive.set_commits(if hold {
            Commits::Queued
        } else {
            Commits::Immediate
        });
    }

    /// Drains outputs; frames are acknowledged as flushed at once. Closes appear as `{"close": code}`.
    fn drain(&mut self) -> Vec<(u64, Value)> {
        let mut out = Vec::new();
        let now = self.now();
        self.drive.drain(&mut self.host, now, |o| match o {
            Output::Send { conn, frame } => {
                let v: Value = serde_json::from_slice(frame.as_bytes()).expect("frames are JSON");
                out.push((conn.0, v));
            }
            Output::Close { conn, code, .. } => out.push((conn.0, json!({ "close": code.code() }))),
            Output::Commit(_) => unreachable!("the harness never hands commits out"),
        });
        out
    }

    /// Commits the first `n` held changes as one group and reports them durable; returns
    /// what that released.
    fn complete(&mut self, n: usize) -> Vec<(u64, Value)> {
        let now = self.now();
        let held = self.drive.queued().min(n);
        let done = self.drive.complete(&mut self.host, now, n);
        assert_eq!(done, held, "the store refused a held change");
        self.drain()
    }

    /// Fails the group of every held change (a writer that gathered them all) and drops
    /// them, as writers do; returns what the host did about it.
    fn fail_first(&mut self) -> Vec<(u64, Value)> {
        assert!(self.drive.queued() > 0, "a change in flight");
        let now = self.now();
        let group = self.drive.queued();
        self.drive.fail(&mut self.host, now, group);
        self.drain()
    }

    /// Changes held for the disk.
    fn held(&self) -> usize {
        self.drive.queued()
    }

    fn request(&mut self, conn: u64, id: u64, method: &str, params: Value) -> Value {
        let out = self.send(
            conn,
            &json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}),
        );
        out.into_iter()
            .find(|(c, v)| *c == conn && v["id"] == json!(id))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no response to {method}"))
    }

    fn init(&mut self, conn: u64, principal: Principal, client: &str, subs: &[&str]) -> Value {
        self.connect(conn, principal);
        let r = self.request(conn, 1, "initialize", json!({"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":client,"initialSubscriptions":subs}));
        assert!(r.get("result").is_some(), "initialize failed: {r}");
        r["result"].clone()
    }

    fn create(&mut self, conn: u64, id: &str) -> Value {
        self.request(
            conn,
            2,
            "createSession",
            json!({"channel": format!("ahp-session:/{id}")}),
        )
    }

    /// Connection 1 as maintainer `m` (clientId `c1`, subscribed to `subscriptions`), with
    /// session `s1` created and its chat subscribed.
    fn open_chat(&mut self, subscriptions: &[&str]) {
        self.init(1, Principal::maintainer("m"), "c1", subscriptions);
        self.create(1, "s1");
        self.request(1, 3, "subscribe", json!({"channel":"ahp-chat:/s1"}));
    }

    /// A host keeping `quota` idle clientIds per principal, over `store`.
    fn idle_quota(quota: u32, store: MemStore) -> Harness {
        let limits = Limits {
            idle_client_ids_per_principal: quota,
            ..Limits::default()
        };
        Harness::with(
            HostConfig {
                limits,
                ..HostConfig::default()
            },
            store,
        )
    }

    /// `initialize` as `client` on an open connection; the whole response, success or not.
    fn initialize(&mut self, conn: u64, id: u64, client: &str) -> Value {
        let params =
            json!({"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":client});
        self.request(conn, id, "initialize", params)
    }

    /// The driver reports `conn` closed.
    fn close(&mut self, conn: u64) -> Vec<(u64, Value)> {
        let now = self.now();
        self.host.handle(now, Input::Closed { conn: ConnId(conn) });
        self.drain()
    }

    fn dispatch(&mut self, conn: u64, channel: &str, seq: u64, action: Value) -> Vec<(u64, Value)> {
        self.send(conn, &json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":channel,"clientSeq":seq,"action":action}}))
    }
}

fn observer(id: &str) -> Principal {
    Principal {
        id: id.into(),
        role: Role::Observer,
        sessions: SessionScope::All,
    }
}

fn scoped(id: &str, sessions: &[&str]) -> Principal {
    Principal {
        id: id.into(),
        role: Role::Maintainer,
        sessions: SessionScope::Only(sessions.iter().map(|s| s.to_string()).collect()),
    }
}

fn turn(id: &str, text: &str) -> Value {
    json!({"type":"chat/turnStarted","turnId":id,"startedAt":"2020-01-01T00:00:00.000Z","message":{"text":text,"origin":{"kind":"user"}}})
}

#[test]
fn ping_is_answered_before_initialize_and_other_methods_are_not() {
    let mut h = Harness::new();
    h.connect(1, Principal::maintainer("m"));
    let r = h.request(1, 5, "ping", json!({"channel":"ahp-root://"}));
    assert_eq!(r, json!({"jsonrpc":"2.0","id":5,"result":null}));
    let r = h.request(1, 6, "listSessions", json!({"channel":"ahp-root://"}));
    assert_eq!(r["error"]["code"], -32009);
}

#[test]
fn malformed_frames_get_parse_and_request_errors_with_null_id() {
    let mut h = Harness::new();
    h.connect(1, Principal::maintainer("m"));
    let out = h.send_raw(1, "{not json");
    assert_eq!(out[0].1["error"]["code"], -32700);
    assert_eq!(out[0].1["id"], Value::Null);
    let out = h.send_raw(1, "[1,2]");
    assert_eq!(out[0].1["error"]["code"], -32600);
    let out = h.send_raw(1, r#"{"jsonrpc":"2.0","id":1}"#);
    assert_eq!(out[0].1["error"]["code"], -32600);
    h.init(2, Principal::maintainer("m"), "c2", &[]);
    let r = h.request(2, 9, "frobnicate", json!({}));
    assert_eq!(r["error"]["code"], -32601);
    let r = h.request(2, 10, "subscribe", json!({"nochannel": 1}));
    assert_eq!(r["error"]["code"], -32602);
}

#[test]
fn initialize_negotiates_and_advertises_the_exchange() {
    let mut h = Harness::new();
    let r = h.init(1, Principal::maintainer("alice"), "c1", &["ahp-root://"]);
    assert_eq!(r["protocolVersion"], "0.9.0");
    assert_eq!(r["serverSeq"], 0);
    assert_eq!(r["snapshots"][0]["resource"], "ahp-root://");
    assert_eq!(r["snapshots"][0]["state"]["agents"][0]["provider"], "axp");
    let meta = &r["_meta"]["org.axp.exchange"];
    assert_eq!(meta["version"], "0.2.0");
    assert_eq!(meta["role"], "maintainer");
    assert_eq!(meta["principal"], "alice");
    assert_eq!(meta["lastClientSeq"], 0);
    let again = h.initialize(1, 2, "c1");
    assert_eq!(again["error"]["code"], -32011);
}

#[test]
fn unsupported_version_is_refused_with_supported_versions_then_closed() {
    let mut h = Harness::new();
    h.connect(1, Principal::maintainer("m"));
    let out = h.send(1, &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"c"}}));
    assert_eq!(out[0].1["error"]["code"], -32005);
    assert_eq!(
        out[0].1["error"]["data"]["supportedVersions"],
        json!(["0.9.0"])
    );
    assert_eq!(out[1].1, json!({"close": 1008}));
}

#[test]
fn a_client_id_belongs_to_the_first_principal_that_uses_it() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("alice"), "shared", &[]);
    h.connect(2, Principal::maintainer("bob"));
    let r = h.initialize(2, 1, "shared");
    assert_eq!(r["error"]["code"], -32009);
}

/// The bindings the host holds and those its store would load are the same, by clientId.
fn bound_ids(h: &mut Harness) -> Vec<String> {
    bindings_match_the_store(h)
        .into_iter()
        .map(|(id, _, _)| id)
        .collect()
}

fn bindings_match_the_store(h: &mut Harness) -> Vec<(String, String, bool)> {
    let held: Vec<ClientRecord> = h.host.client_bindings().cloned().collect();
    let stored: Vec<ClientRecord> = h
        .host
        .store()
        .records_of(Table::Client)
        .map(|(_, v)| ClientRecord::parse(v).expect("a stored binding"))
        .collect();
    assert_eq!(held, stored);
    held.into_iter()
        .map(|c| (c.client_id, c.owner, c.dispatched))
        .collect()
}

#[test]
fn a_principal_keeps_at_most_its_quota_of_idle_client_ids() {
    let mut h = Harness::idle_quota(3, MemStore::new());
    // A client that picks a fresh clientId for every connection, as the AXP executor loop does.
    for i in 0..10u64 {
        h.init(
            10 + i,
            Principal::maintainer("exec"),
            &format!("run-{i}"),
            &[],
        );
        h.close(10 + i);
        assert!(h.host.idle_client_ids("exec") <= 3);
    }
    assert_eq!(bound_ids(&mut h), ["run-7", "run-8", "run-9"]);
    assert_eq!(h.host.stats().client_ids_released, 7);
    // Reusing an id makes it the most recently used, so the next one releases another.
    h.init(30, Principal::maintainer("exec"), "run-7", &[]);
    h.close(30);
    h.init(31, Principal::maintainer("exec"), "run-10", &[]);
    assert_eq!(bound_ids(&mut h), ["run-10", "run-7", "run-9"]);
}

#[test]
fn only_idle_unused_bindings_of_the_same_principal_are_released() {
    let mut h = Harness::idle_quota(2, MemStore::new());
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    // c1 dispatches: it is named in history and is never released.
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    h.close(1);
    h.init(2, Principal::maintainer("m"), "open-1", &[]);
    h.init(3, Principal::maintainer("m"), "open-2", &[]);
    h.init(4, Principal::maintainer("other"), "theirs", &[]);
    h.close(4);
    // Both of m's idle bindings are held by open connections: a third is refused, and
    // nothing is committed or released.
    let seq = h.host.server_seq();
    h.connect(5, Principal::maintainer("m"));
    let r = h.initialize(5, 1, "open-3");
    assert_eq!(r["error"]["code"], -32043, "{r}");
    assert_eq!(h.host.server_seq(), seq);
    let before = bindings_match_the_store(&mut h);
    assert_eq!(before.len(), 4);
    // Once one closes, it is the one released; another principal's binding never is.
    h.close(2);
    let r = h.initialize(5, 2, "open-3");
    assert!(r.get("result").is_some(), "{r}");
    let after = bindings_match_the_store(&mut h);
    let own = |id: &str, owner: &str, d: bool| (id.to_owned(), owner.to_owned(), d);
    assert_eq!(
        after,
        [
            own("c1", "m", true),
            own("open-2", "m", false),
            own("open-3", "m", false),
            own("theirs", "other", false),
        ]
    );
    // The dispatched binding still numbers its retries after a restart.
    let store = h.host.into_store();
    let mut h = Harness::idle_quota(2, store);
    assert_eq!(bindings_match_the_store(&mut h), after);
    let r = h.init(1, Principal::maintainer("m"), "c1", &[]);
    assert_eq!(r["_meta"]["org.axp.exchange"]["lastClientSeq"], 1, "{r}");
}

#[test]
fn a_refused_commit_releases_nothing() {
    let mut h = Harness::idle_quota(1, MemStore::new());
    h.init(1, Principal::maintainer("m"), "a", &[]);
    h.close(1);
    let mut store = h.host.into_store();
    store.fail_next_commits(1);
    let mut h = Harness::idle_quota(1, store);
    h.connect(2, Principal::maintainer("m"));
    let out = h.send(
        2,
        &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":"b"}}),
    );
    // The answer is the error a failed commit gets; the connection, made ready on a binding
    // that is gone, is closed after it.
    assert_eq!(out[0].1["error"]["code"], -32603, "{out:?}");
    assert_eq!(out[1].1["close"], 1011, "{out:?}");
    let now = h.now();
    h.host.handle(now, Input::Closed { conn: ConnId(2) });
    assert_eq!(
        bindings_match_the_store(&mut h),
        [("a".to_owned(), "m".to_owned(), false)]
    );
    h.connect(3, Principal::maintainer("m"));
    let r = h.initialize(3, 2, "b");
    assert!(r.get("result").is_some(), "{r}");
    assert_eq!(
        bindings_match_the_store(&mut h),
        [("b".to_owned(), "m".to_owned(), false)]
    );
}

#[test]
fn create_subscribe_and_turn_flow_echoes_with_origin() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-root://"]);
    let r = h.create(1, "s1");
    assert_eq!(r["result"], Value::Null);
    let dup = h.create(1, "s1");
    assert_eq!(dup["error"]["code"], -32003);
    let sub = h.request(1, 3, "subscribe", json!({"channel":"ahp-chat:/s1"}));
    assert_eq!(sub["result"]["snapshot"]["state"]["status"], 1);
    h.request(1, 4, "subscribe", json!({"channel":"ahp-session:/s1"}));
    let out = h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hello"));
    let echo = out
        .iter()
        .find(|(_, v)| v["params"]["channel"] == "ahp-chat:/s1")
        .expect("echo")
        .1
        .clone();
    assert_eq!(echo["method"], "action");
    assert_eq!(echo["params"]["serverSeq"], 1);
    assert_eq!(
        echo["params"]["origin"],
        json!({"clientId":"c1","clientSeq":1})
    );
    assert_ne!(
        echo["params"]["action"]["startedAt"], "2020-01-01T00:00:00.000Z",
        "host clock decides startedAt"
    );
    let chat_updated = out
        .iter()
        .find(|(_, v)| v["params"]["action"]["type"] == "session/chatUpdated")
        .expect("sync");
    assert_eq!(chat_updated.1["params"]["serverSeq"], 2);
    let summary = out
        .iter()
        .find(|(_, v)| v["method"] == "root/sessionSummaryChanged")
        .expect("summary");
    assert_eq!(summary.1["params"]["session"], "ahp-session:/s1");
    assert_eq!(
        h.host.channel_state("ahp-chat:/s1").expect("chat")["activeTurn"]["id"],
        "t1"
    );

    // A second turn while one runs is rejected to the sender only, at the current seq.
    h.init(2, Principal::maintainer("m"), "c2", &["ahp-chat:/s1"]);
    let out = h.dispatch(1, "ahp-chat:/s1", 2, turn("t2", "again"));
    assert_eq!(out.len(), 1, "rejection goes to the sender only: {out:?}");
    assert_eq!(out[0].0, 1);
    assert_eq!(out[0].1["params"]["serverSeq"], 2);
    assert!(out[0].1["params"]["rejectionReason"].is_string());
    assert_eq!(h.host.server_seq(), 2);

    // Cancel ends the turn.
    let out = h.dispatch(
        1,
        "ahp-chat:/s1",
        3,
        json!({"type":"chat/turnCancelled","turnId":"t1","duration":5}),
    );
    assert!(out
        .iter()
        .any(|(c, v)| *c == 2 && v["params"]["action"]["type"] == "chat/turnCancelled"));
    let chat = h.host.channel_state("ahp-chat:/s1").expect("chat");
    assert!(chat.get("activeTurn").is_none());
    assert_eq!(chat["turns"][0]["state"], "cancelled");
}

#[test]
fn queued_messages_start_when_idle_and_steering_interrupts() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    let queued = json!({"type":"chat/pendingMessageSet","kind":"queued","id":"q1","message":{"text":"later","origin":{"kind":"user"}}});
    h.dispatch(1, "ahp-chat:/s1", 1, queued);
    let chat = h.host.channel_state("ahp-chat:/s1").expect("chat");
    assert_eq!(
        chat["activeTurn"]["message"]["text"], "later",
        "idle chat starts the queued message"
    );
    assert!(chat.get("queuedMessages").is_none());
    let steer = json!({"type":"chat/pendingMessageSet","kind":"steering","id":"st","message":{"text":"now","origin":{"kind":"user"}}});
    h.dispatch(1, "ahp-chat:/s1", 2, steer);
    let chat = h.host.channel_state("ahp-chat:/s1").expect("chat");
    assert_eq!(chat["turns"][0]["state"], "cancelled");
    assert_eq!(chat["activeTurn"]["message"]["text"], "now");
    let missing = json!({"type":"chat/pendingMessageRemoved","kind":"queued","id":"nope"});
    let out = h.dispatch(1, "ahp-chat:/s1", 3, missing);
    assert!(out[0].1["params"]["rejectionReason"].is_string());
}

#[test]
fn dispatch_rules_reject_without_changing_state() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    h.init(2, observer("o"), "c2", &[]);
    let out = h.dispatch(2, "ahp-chat:/s1", 1, turn("t1", "hi"));
    assert_eq!(
        out[0].1["params"]["rejectionReason"],
        "Only maintainers can do this"
    );
    let out = h.dispatch(
        1,
        "ahp-session:/s1",
        1,
        json!({"type":"session/titleChanged","title":"x"}),
    );
    assert!(out[0].1["params"]["rejectionReason"].is_string());
    let out = h.dispatch(
        1,
        "ahp-chat:/s1",
        2,
        json!({"type":"chat/delta","turnId":"t","partId":"p","content":"x"}),
    );
    assert!(
        out[0].1["params"]["rejectionReason"].is_string(),
        "server-only actions are refused"
    );
    let out = h.dispatch(
        1,
        "ahp-chat:/s1",
        3,
        json!({"type":"chat/turnStarted","turnId":"t"}),
    );
    assert!(out[0].1["params"]["rejectionReason"]
        .as_str()
        .is_some_and(|r| r.starts_with("Invalid AHP action")));
    let agent = json!({"type":"chat/turnStarted","turnId":"t","startedAt":"x","message":{"text":"x","origin":{"kind":"agent"}}});
    let out = h.dispatch(1, "ahp-chat:/s1", 4, agent);
    assert!(out[0].1["params"]["rejectionReason"].is_string());
    // Unknown channels: dropped without any echo.
    assert!(h
        .dispatch(1, "ahp-chat:/nope", 5, turn("t", "x"))
        .is_empty());
    assert!(h.dispatch(1, "x-unknown://", 6, turn("t", "x")).is_empty());
    assert_eq!(h.host.server_seq(), 0);
}

#[test]
fn a_retried_dispatch_applies_once_and_a_restarted_counter_is_new_work() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    let seq = h.host.server_seq();
    assert!(
        h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
            .is_empty(),
        "same receipt: applied once"
    );
    // lastClientSeq lets a returning client continue its numbering.
    let r = h.init(9, Principal::maintainer("m"), "c1", &[]);
    assert_eq!(r["_meta"]["org.axp.exchange"]["lastClientSeq"], 1);
    // A client whose counter restarted (the official clients start at 1 on every connection)
    // reuses clientSeq 1 for a different action: that is new work, not a retry.
    h.dispatch(
        9,
        "ahp-chat:/s1",
        1,
        json!({"type":"chat/turnCancelled","turnId":"t1","duration":3}),
    );
    assert!(
        h.host.server_seq() > seq,
        "the different action was applied"
    );
    let chat = h.host.channel_state("ahp-chat:/s1").expect("chat");
    assert_eq!(chat["turns"][0]["state"], "cancelled");
    // And its receipt replaced the old one: resending it is now the retry.
    let seq = h.host.server_seq();
    let again = json!({"type":"chat/turnCancelled","turnId":"t1","duration":3});
    assert!(h.dispatch(9, "ahp-chat:/s1", 1, again).is_empty());
    assert_eq!(h.host.server_seq(), seq);
}

#[test]
fn a_retry_of_a_recent_dispatch_is_known_without_reading_the_store() {
    // Found by the simulator (seed 694518): a client resent clientSeq 20 after a reconnect, the
    // original was applied and echoed to the new connection, and the retry met a failing
    // receipt read. The host rejected it, telling the client its applied action was refused.
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    let seq = h.host.server_seq();
    h.host.store_mut().fail_next_reads(1);
    assert!(
        h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
            .is_empty(),
        "a retry: neither applied again nor rejected"
    );
    assert_eq!(h.host.server_seq(), seq);
    // A clientSeq above every one the client used cannot be a retry: applied with no lookup
    // (the armed failure is never met).
    let reads = h.host.store().reads();
    let cancel = json!({"type":"chat/turnCancelled","turnId":"t1","duration":1});
    let out = h.dispatch(1, "ahp-chat:/s1", 2, cancel);
    assert!(
        out.iter()
            .all(|(_, f)| f["params"].get("rejectionReason").is_none()),
        "applied: {out:?}"
    );
    assert!(h.host.server_seq() > seq);
    assert_eq!(h.host.store().reads(), reads);
    let seq = h.host.server_seq();
    // After a restart the memory is empty and the store answers for the retry.
    let mut store = h.host.into_store();
    store.fail_next_reads(0);
    let mut h = Harness::with(HostConfig::default(), store);
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-chat:/s1"]);
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    assert_eq!(h.host.server_seq(), seq);
    // A clientSeq the client used before but the host did not commit lately is looked up in
    // the store, and a read that fails refuses it: the host cannot tell a retry from new work.
    h.host.store_mut().fail_next_reads(1);
    let out = h.dispatch(1, "ahp-chat:/s1", 2, turn("t9", "other"));
    assert_eq!(out.len(), 1);
    assert!(out[0].1["params"]["rejectionReason"].is_string());
    assert_eq!(h.host.server_seq(), seq);
}

#[test]
fn a_failed_commit_changes_nothing_and_tells_the_caller() {
    let mut h = Harness::new();
    h.open_chat(&["ahp-root://"]);
    let before = h.host.channel_state("ahp-chat:/s1");
    let mut store = h.host.into_store();
    // c1 is already bound, so initialize commits nothing and the dispatch meets the failure.
    store.fail_next_commits(1);
    let mut h = Harness::with(HostConfig::default(), store);
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-chat:/s1"]);
    let out = h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    assert_eq!(out.len(), 1);
    assert!(out[0].1["params"]["rejectionReason"].is_string());
    assert_eq!(h.host.channel_state("ahp-chat:/s1"), before);
    // The failed change's numbers are skipped, never reused; the echo carries the current one.
    assert_eq!(h.host.server_seq(), 2);
    assert_eq!(out[0].1["params"]["serverSeq"], 2);
    assert_eq!(h.host.stats().commit_failures, 1);
    let r = h.create(1, "s2");
    assert_eq!(r["result"], Value::Null, "the next commit works again");
}

#[test]
fn restart_reloads_sessions_and_keeps_server_seq() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    let chat = h.host.channel_state("ahp-chat:/s1");
    let seq = h.host.server_seq();
    assert!(seq > 0);
    let store = h.host.into_store();
    let mut h = Harness::with(HostConfig::default(), store);
    assert_eq!(h.host.server_seq(), seq);
    assert_eq!(h.host.channel_state("ahp-chat:/s1"), chat);
    let r = h.init(1, Principal::maintainer("m"), "c1", &[]);
    assert_eq!(r["serverSeq"], seq);
    // Replay still works across the restart: the ring was reloaded from the store.
    h.connect(2, Principal::maintainer("m"));
    let r = h.request(2, 1, "reconnect", json!({"channel":"ahp-root://","clientId":"c1","lastSeenServerSeq":0,"subscriptions":["ahp-chat:/s1"]}));
    assert_eq!(r["result"]["type"], "replay");
    assert_eq!(r["result"]["actions"][0]["serverSeq"], 1);
}

#[test]
fn the_session_limit_refuses_creates_and_a_lowered_limit_still_loads_everything() {
    let limited = |sessions_max| HostConfig {
        limits: Limits {
            sessions_max,
            ..Limits::default()
        },
        ..HostConfig::default()
    };
    let mut h = Harness::with(limited(2), MemStore::new());
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-root://"]);
    assert_eq!(h.create(1, "s1")["result"], Value::Null);
    assert_eq!(h.create(1, "s2")["result"], Value::Null);
    let seq = h.host.server_seq();
    let out = h.send(
        1,
        &json!({"jsonrpc":"2.0","id":7,"method":"createSession","params":{"channel":"ahp-session:/s3"}}),
    );
    // Refused with the limit error, nothing committed and nothing announced.
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].1["error"]["code"], -32043);
    assert_eq!(out[0].1["error"]["message"], "Session limit reached");
    assert_eq!(h.host.server_seq(), seq);
    assert_eq!(h.host.session_count(), 2);
    assert_eq!(h.host.channel_state("ahp-session:/s3"), None);
    // A repeat of an existing one still hears that it exists, not that the host is full.
    assert_eq!(h.create(1, "s1")["error"]["code"], -32003);

    // The limit lowered below what the store holds: everything loads, nothing more is created.
    let store = h.host.into_store();
    let mut h = Harness::with(limited(1), store);
    assert_eq!(h.host.session_count(), 2);
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    let listed = h.request(1, 3, "listSessions", json!({"channel":"ahp-root://"}));
    assert_eq!(listed["result"]["items"].as_array().map(Vec::len), Some(2));
    assert_eq!(h.create(1, "s3")["error"]["code"], -32043);
    // Raised again, creating works.
    let store = h.host.into_store();
    let mut h = Harness::with(limited(3), store);
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    assert_eq!(h.create(1, "s3")["result"], Value::Null);
    assert_eq!(h.host.session_count(), 3);
}

/// What a turn of `text` under `id` costs against the chat limits: the JSON of its id and its
/// message, and 128 bytes (see `Limits::chat_bytes_max`).
fn turn_cost(id: &str, text: &str) -> u64 {
    let message = json!({"text": text, "origin": {"kind": "user"}});
    (json!(id).to_string().len() + message.to_string().len()) as u64 + 128
}

fn chat_limited(chat_bytes_max: u64, chat_bytes_total_max: u64) -> HostConfig {
    HostConfig {
        limits: Limits {
            chat_bytes_max,
            chat_bytes_total_max,
            ..Limits::default()
        },
        ..HostConfig::default()
    }
}

#[test]
fn a_full_chat_refuses_turns_and_pending_messages_and_a_restart_counts_the_same() {
    let mut h = Harness::with(chat_limited(1024, 1 << 20), MemStore::new());
    h.open_chat(&[]);
    let big = "x".repeat(400);
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", &big));
    let cancel = |id: &str| json!({"type":"chat/turnCancelled","turnId":id,"duration":1});
    h.dispatch(1, "ahp-chat:/s1", 2, cancel("t1"));
    let used = turn_cost("t1", &big);
    assert_eq!(h.host.chat_bytes_total(), used);

    // A turn that would pass the limit: refused to the sender only, nothing committed.
    let seq = h.host.server_seq();
    let medium = "y".repeat(300);
    assert!(used + turn_cost("t2", &medium) > 1024);
    let out = h.dispatch(1, "ahp-chat:/s1", 3, turn("t2", &medium));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(
        out[0].1["params"]["rejectionReason"],
        "Chat size limit reached; continue in a new session"
    );
    assert_eq!(h.host.server_seq(), seq);
    assert_eq!(h.host.chat_bytes_total(), used);

    // A smaller one fits, and takes the chat to its limit's edge.
    assert!(used + turn_cost("t2", "hi") <= 1024);
    let out = h.dispatch(1, "ahp-chat:/s1", 4, turn("t2", "hi"));
    assert!(
        out.iter()
            .all(|(_, m)| m["params"]["rejectionReason"].is_null()),
        "{out:?}"
    );
    let used = used + turn_cost("t2", "hi");
    assert_eq!(h.host.chat_bytes_total(), used);

    // A pending message is charged as the turn it would become (a host-made UUID id): one
    // that could never start is refused now rather than left waiting.
    let pending = |kind: &str, id: &str, text: &str| json!({"type":"chat/pendingMessageSet","kind":kind,"id":id,"message":{"text":text,"origin":{"kind":"user"}}});
    let host_id = "00000000-0000-0000-0000-000000000000";
    let text = "z".repeat(usize::try_from(1024 - used - turn_cost(host_id, "")).unwrap_or(0) + 1);
    for kind in ["queued", "steering"] {
        let out = h.dispatch(1, "ahp-chat:/s1", 5, pending(kind, "m1", &text));
        assert_eq!(
            out[0].1["params"]["rejectionReason"],
            "Chat size limit reached; continue in a new session",
            "{kind}"
        );
    }
    // One byte less fits: queued behind the running turn, it starts when that is cancelled.
    let text = &text[1..];
    h.dispatch(1, "ahp-chat:/s1", 6, pending("queued", "m1", text));
    h.dispatch(1, "ahp-chat:/s1", 7, cancel("t2"));
    let chat = h.host.channel_state("ahp-chat:/s1").unwrap_or_default();
    assert_eq!(chat["activeTurn"]["message"]["text"], text);
    assert_eq!(h.host.chat_bytes_total(), 1024);
    assert_eq!(h.host.audit_chat_bytes(), Ok(()));
    // What a turn is charged covers what the snapshot spells for it, every field included.
    let turns = chat["turns"].as_array().cloned().unwrap_or_default();
    assert_eq!(turns.len(), 2);
    for turn in turns.iter().chain([&chat["activeTurn"]]) {
        let (id, text) = (turn["id"].as_str(), turn["message"]["text"].as_str());
        let charge = turn_cost(id.unwrap_or_default(), text.unwrap_or_default());
        assert!(
            turn.to_string().len() as u64 <= charge,
            "{turn} over {charge}"
        );
    }

    // A restart counts the same from the store, and keeps refusing.
    let store = h.host.into_store();
    let mut h = Harness::with(chat_limited(1024, 1 << 20), store);
    assert_eq!(h.host.chat_bytes_total(), 1024);
    assert_eq!(h.host.audit_chat_bytes(), Ok(()));
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-chat:/s1"]);
    let active = h
        .host
        .channel_state("ahp-chat:/s1")
        .map(|c| c["activeTurn"]["id"].clone())
        .unwrap_or_default();
    h.dispatch(
        1,
        "ahp-chat:/s1",
        8,
        json!({"type":"chat/turnCancelled","turnId":active,"duration":1}),
    );
    let out = h.dispatch(1, "ahp-chat:/s1", 9, turn("t3", ""));
    assert_eq!(
        out[0].1["params"]["rejectionReason"],
        "Chat size limit reached; continue in a new session"
    );
    // Other sessions have their own room.
    h.create(1, "s2");
    let out = h.dispatch(1, "ahp-chat:/s2", 10, turn("t1", &big));
    assert!(
        out.iter()
            .all(|(_, m)| m["params"]["rejectionReason"].is_null()),
        "{out:?}"
    );

    // Limits lowered below what the store holds: everything loads, no turn starts.
    let store = h.host.into_store();
    let mut h = Harness::with(chat_limited(1024, 1100), store);
    assert_eq!(h.host.chat_bytes_total(), 1024 + turn_cost("t1", &big));
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s3");
    let out = h.dispatch(1, "ahp-chat:/s3", 11, turn("t1", "hi"));
    assert_eq!(
        out[0].1["params"]["rejectionReason"],
        "Host chat storage limit reached"
    );
}

#[test]
fn a_turn_id_is_charged_as_a_snapshot_spells_it() {
    // 150 control characters are 150 bytes of id but 900 of JSON (`\u0001` each): the charge
    // follows the snapshot, so this turn does not fit a 1 KiB chat.
    let mut h = Harness::with(chat_limited(1024, 1 << 20), MemStore::new());
    h.open_chat(&[]);
    let id = "\u{1}".repeat(150);
    assert!(turn_cost(&id, "") > 1024 && id.len() + 200 < 1024);
    let out = h.dispatch(1, "ahp-chat:/s1", 1, turn(&id, ""));
    assert_eq!(
        out[0].1["params"]["rejectionReason"],
        "Chat size limit reached; continue in a new session"
    );
    let id = "\u{1}".repeat(100);
    h.dispatch(1, "ahp-chat:/s1", 2, turn(&id, ""));
    assert_eq!(h.host.chat_bytes_total(), turn_cost(&id, ""));
    assert_eq!(h.host.audit_chat_bytes(), Ok(()));
}

#[test]
fn a_pending_message_that_no_longer_fits_waits_and_the_next_starts_once_it_is_removed() {
    // Room for all chats together is what runs out: another session takes it while a
    // message waits in the queue.
    let big = "b".repeat(600);
    let host_id = "00000000-0000-0000-0000-000000000000";
    // Room for t1, s2's turn and "b", not for "a" as well; "a" fits until s2's turn starts.
    let total = turn_cost("t1", "") + turn_cost("u1", &big) + turn_cost(host_id, "") + 10;
    assert!(turn_cost("t1", "") + turn_cost(host_id, &big) <= total);
    let mut h = Harness::with(chat_limited(total, total), MemStore::new());
    h.open_chat(&[]);
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", ""));
    let pending = |id: &str, text: &str| json!({"type":"chat/pendingMessageSet","kind":"queued","id":id,"message":{"text":text,"origin":{"kind":"user"}}});
    h.dispatch(1, "ahp-chat:/s1", 2, pending("a", &big));
    h.dispatch(1, "ahp-chat:/s1", 3, pending("b", ""));
    // Another session's turn leaves too little room for "a", enough for "b".
    h.create(1, "s2");
    h.dispatch(1, "ahp-chat:/s2", 4, turn("u1", &big));
    let out = h.dispatch(1, "ahp-chat:/s2", 5, pending("c", &"c".repeat(100)));
    assert_eq!(
        out[0].1["params"]["rejectionReason"],
        "Host chat storage limit reached"
    );
    // Cancelling t1 leaves s1 idle: "a" does not fit and waits, "b" waits behind it.
    let out = h.dispatch(
        1,
        "ahp-chat:/s1",
        6,
        json!({"type":"chat/turnCancelled","turnId":"t1","duration":1}),
    );
    assert!(
        out.iter()
            .all(|(_, m)| m["params"]["rejectionReason"].is_null()),
        "{out:?}"
    );
    let chat = h.host.channel_state("ahp-chat:/s1").unwrap_or_default();
    assert!(chat["activeTurn"].is_null(), "{chat}");
    assert_eq!(chat["queuedMessages"].as_array().map(Vec::len), Some(2));
    // Removing "a" lets "b" start.
    h.dispatch(
        1,
        "ahp-chat:/s1",
        7,
        json!({"type":"chat/pendingMessageRemoved","kind":"queued","id":"a"}),
    );
    let chat = h.host.channel_state("ahp-chat:/s1").unwrap_or_default();
    assert_eq!(chat["activeTurn"]["message"]["text"], "");
    assert!(chat["queuedMessages"].is_null(), "{chat}");
    assert_eq!(h.host.audit_chat_bytes(), Ok(()));
    assert!(h.host.chat_bytes_total() <= total);
}

#[test]
fn reconnect_replays_or_snapshots_and_reports_missing() {
    let mut h = Harness::limits(Limits {
        replay_events_max: 4,
        ..Limits::default()
    });
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi")); // seq 1, 2
    h.connect(2, Principal::maintainer("m"));
    let r = h.request(2, 1, "reconnect", json!({"channel":"ahp-root://","clientId":"c1","lastSeenServerSeq":1,"subscriptions":["ahp-chat:/s1","ahp-session:/s1","ahp-session:/gone"]}));
    let res = &r["result"];
    assert_eq!(res["type"], "replay");
    assert_eq!(res["actions"].as_array().map(Vec::len), Some(1));
    assert_eq!(res["actions"][0]["serverSeq"], 2);
    assert_eq!(res["missing"], json!(["ahp-session:/gone"]));
    // Subscriptions were re-established.
    assert_eq!(
        h.host.subscriptions(ConnId(2)),
        vec!["ahp-chat:/s1".to_string(), "ahp-session:/s1".to_string()]
    );
    // Generate more than the replay budget.
    h.dispatch(
        1,
        "ahp-chat:/s1",
        2,
        json!({"type":"chat/turnCancelled","turnId":"t1","duration":1}),
    );
    h.dispatch(1, "ahp-chat:/s1", 3, turn("t2", "x"));
    h.dispatch(
        1,
        "ahp-chat:/s1",
        4,
        json!({"type":"chat/turnCancelled","turnId":"t2","duration":1}),
    );
    h.connect(3, Principal::maintainer("m"));
    let r = h.request(3, 1, "reconnect", json!({"channel":"ahp-root://","clientId":"c1","lastSeenServerSeq":0,"subscriptions":["ahp-chat:/s1"]}));
    assert_eq!(r["result"]["type"], "snapshot");
    assert_eq!(r["result"]["snapshots"][0]["fromSeq"], h.host.server_seq());
    // Future cursor, and reconnect that is not the first message.
    h.connect(4, Principal::maintainer("m"));
    let r = h.request(
        4,
        1,
        "reconnect",
        json!({"channel":"ahp-root://","clientId":"c1","lastSeenServerSeq":999,"subscriptions":[]}),
    );
    assert_eq!(r["error"]["code"], -32602);
    h.connect(5, Principal::maintainer("m"));
    h.request(5, 1, "ping", json!({"channel":"ahp-root://"}));
    let r = h.request(
        5,
        2,
        "reconnect",
        json!({"channel":"ahp-root://","clientId":"c1","lastSeenServerSeq":0,"subscriptions":[]}),
    );
    assert_eq!(r["error"]["code"], -32011);
}

#[test]
fn scope_filters_subscriptions_listing_and_root_notifications() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-root://"]);
    h.init(2, scoped("s", &["s1"]), "c2", &["ahp-root://"]);
    let out = {
        h.create(1, "s1");
        h.create(1, "s2")
    };
    assert_eq!(out["result"], Value::Null);
    let r = h.request(2, 5, "subscribe", json!({"channel":"ahp-chat:/s2"}));
    assert_eq!(r["error"]["code"], -32009);
    let r = h.request(2, 6, "subscribe", json!({"channel":"ahp-chat:/zz"}));
    assert_eq!(
        r["error"]["code"], -32009,
        "out of scope is refused before existence is revealed"
    );
    let r = h.request(1, 6, "subscribe", json!({"channel":"ahp-chat:/zz"}));
    assert_eq!(r["error"]["code"], -32008);
    let r = h.request(2, 7, "listSessions", json!({"channel":"ahp-root://"}));
    let items = r["result"]["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(items.len(), 1);
    assert_eq!(items[0]["resource"], "ahp-session:/s1");
    // The scoped root subscriber saw only s1's sessionAdded.
    let mut h2 = Harness::new();
    h2.init(1, Principal::maintainer("m"), "c1", &["ahp-root://"]);
    h2.init(2, scoped("s", &["s1"]), "c2", &["ahp-root://"]);
    let out = h2.send(1, &json!({"jsonrpc":"2.0","id":2,"method":"createSession","params":{"channel":"ahp-session:/s2"}}));
    assert!(
        out.iter().all(|(c, _)| *c == 1),
        "scoped root subscriber must not see s2: {out:?}"
    );
    let out = h2.send(1, &json!({"jsonrpc":"2.0","id":3,"method":"createSession","params":{"channel":"ahp-session:/s1"}}));
    assert!(out
        .iter()
        .any(|(c, v)| *c == 2 && v["method"] == "root/sessionAdded"));
}

#[test]
fn list_sessions_orders_by_modified_and_pages() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    for id in ["a", "b", "c"] {
        h.create(1, id);
    }
    h.dispatch(1, "ahp-chat:/a", 1, turn("t", "x"));
    let r = h.request(
        1,
        5,
        "listSessions",
        json!({"channel":"ahp-root://","limit":2}),
    );
    let items = r["result"]["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(
        items[0]["resource"], "ahp-session:/a",
        "most recently modified first"
    );
    assert_eq!(items.len(), 2);
    assert_ne!(items[0]["createdAt"], items[0]["modifiedAt"]);
    let cursor = r["result"]["nextCursor"].clone();
    let r = h.request(
        1,
        6,
        "listSessions",
        json!({"channel":"ahp-root://","limit":2,"cursor":cursor}),
    );
    let rest = r["result"]["items"].as_array().cloned().unwrap_or_default();
    assert_eq!(rest.len(), 1);
    assert!(r["result"].get("nextCursor").is_none());
    let r = h.request(
        1,
        7,
        "listSessions",
        json!({"channel":"ahp-root://","cursor":"garbage"}),
    );
    assert_eq!(r["error"]["code"], -32602);
}

#[test]
fn limits_are_enforced() {
    let mut h = Harness::limits(Limits {
        subscriptions_per_conn_max: 2,
        connections_max: 3,
        ..Limits::default()
    });
    h.open_chat(&["ahp-root://"]);
    let r = h.request(1, 4, "subscribe", json!({"channel":"ahp-session:/s1"}));
    assert_eq!(r["error"]["code"], -32043);
    let big = format!(
        r#"{{"jsonrpc":"2.0","id":9,"method":"ping","params":{{"channel":"ahp-root://","pad":"{}"}}}}"#,
        "x".repeat(70_000)
    );
    let out = h.send_raw(1, &big);
    assert_eq!(out[0].1["error"]["code"], -32043);
    h.connect(2, Principal::maintainer("m"));
    h.connect(3, Principal::maintainer("m"));
    h.connect(4, Principal::maintainer("m"));
    assert_eq!(h.drain(), vec![(4, json!({"close": 1013}))]);
}

#[test]
fn a_slow_consumer_is_closed_not_starved() {
    let mut h = Harness::limits(Limits {
        queue_bytes_hard: 4096,
        queue_bytes_soft: 1024,
        message_bytes_max: 2048,
        ..Limits::default()
    });
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    h.connect(2, Principal::maintainer("m"));
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":"c2","initialSubscriptions":["ahp-chat:/s1"]}}).to_string();
    h.feed(2, &init);
    // Connection 2 never reports anything flushed.
    let mut closed = false;
    for seq in 1..40u64 {
        let id = format!("t{seq}");
        let msg = json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-chat:/s1","clientSeq":seq*2,"action":turn(&id,"x")}}).to_string();
        h.feed(1, &msg);
        let cancel = json!({"jsonrpc":"2.0","method":"dispatchAction","params":{"channel":"ahp-chat:/s1","clientSeq":seq*2+1,"action":{"type":"chat/turnCancelled","turnId":id,"duration":1}}}).to_string();
        h.feed(1, &cancel);
        while let Some(o) = h.host.poll_output() {
            if let Output::Close {
                conn: ConnId(2),
                code,
                ..
            } = o
            {
                assert_eq!(code, CloseCode::Policy);
                closed = true;
            }
        }
        assert!(h.host.queued_bytes(ConnId(2)).unwrap_or(0) <= 4096);
    }
    assert!(
        closed,
        "connection 2 must be closed once over its queue limit"
    );
    assert_eq!(h.host.stats().slow_consumer_closes, 1);
}

#[test]
fn handshake_timeout_closes_and_idle_host_emits_nothing() {
    let mut h = Harness::new();
    h.connect(1, Principal::maintainer("m"));
    let deadline = h.host.poll_timeout().expect("armed");
    h.host.handle_timeout(Now {
        mono: crate::Instant(deadline.0 - 1),
        wall_unix_ms: h.now,
    });
    assert!(h.host.poll_output().is_none(), "early timeouts do nothing");
    h.host.handle_timeout(Now {
        mono: deadline,
        wall_unix_ms: h.now,
    });
    assert!(matches!(
        h.host.poll_output(),
        Some(Output::Close {
            code: CloseCode::Policy,
            ..
        })
    ));
    h.now += 200_000;
    h.host.handle_timeout(Now {
        mono: crate::Instant(deadline.0 + 100_000),
        wall_unix_ms: h.now,
    });
    assert!(h.host.poll_output().is_none());
    assert_eq!(h.host.poll_timeout(), None);
    // Inputs for a closing connection are ignored.
    let out = h.send(1, &json!({"jsonrpc":"2.0","id":1,"method":"ping"}));
    assert!(out.is_empty());
}

#[test]
fn resource_read_is_for_blobs_only() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    let r = h.request(
        1,
        2,
        "resourceRead",
        json!({"channel":"ahp-root://","uri":"file:///etc/passwd"}),
    );
    assert_eq!(r["error"]["code"], -32009);
    let r = h.request(1, 3, "resourceRead", json!({"channel":"ahp-root://","uri":format!("axp-blob:/axp-session%3A%2Fs1/{}", "a".repeat(64))}));
    assert_eq!(r["error"]["code"], -32008);
}

#[test]
fn same_seed_same_outputs() {
    fn run() -> Vec<(u64, Value)> {
        let mut h = Harness::new();
        let mut all = Vec::new();
        all.push((
            0,
            h.init(1, Principal::maintainer("m"), "c1", &["ahp-root://"]),
        ));
        h.create(1, "s1");
        let q = json!({"type":"chat/pendingMessageSet","kind":"queued","id":"q1","message":{"text":"x","origin":{"kind":"user"}}});
        all.extend(h.dispatch(1, "ahp-chat:/s1", 1, q));
        all
    }
    assert_eq!(run(), run());
}

#[test]
fn states_are_checkpointed_as_event_bytes_accumulate_and_replayed_after() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    let mut seq = 0;
    for round in 0..40u64 {
        let id = format!("t{round}");
        seq += 1;
        h.dispatch(1, "ahp-chat:/s1", seq, turn(&id, &"x".repeat(2000)));
        seq += 1;
        h.dispatch(
            1,
            "ahp-chat:/s1",
            seq,
            json!({"type":"chat/turnCancelled","turnId":id,"duration":1}),
        );
        // Leave a turn running at the end, between checkpoints.
    }
    seq += 1;
    h.dispatch(1, "ahp-chat:/s1", seq, turn("last", "x"));
    let states: Vec<_> = ["ahp-session:/s1", "ahp-chat:/s1", "ahp-changeset:/s1"]
        .iter()
        .map(|c| h.host.channel_state(c))
        .collect();
    let server_seq = h.host.server_seq();
    assert!(
        server_seq > 2 * 64,
        "enough events for at least two checkpoints"
    );
    let store = h.host.into_store();
    // The stored chat is a checkpoint: behind the live state, never ahead of it.
    let stored: Value = serde_json::from_str(
        store
            .record_text(Table::State, "ahp-chat:/s1")
            .expect("chat record"),
    )
    .expect("json");
    let stored_turns = stored["turns"].as_array().map_or(0, Vec::len);
    assert!(
        stored_turns > 0 && stored_turns < 40,
        "stored {stored_turns} turns"
    );
    let h = Harness::with(HostConfig::default(), store);
    let after: Vec<_> = ["ahp-session:/s1", "ahp-chat:/s1", "ahp-changeset:/s1"]
        .iter()
        .map(|c| h.host.channel_state(c))
        .collect();
    assert_eq!(
        after, states,
        "checkpoint + replayed events = the state before the restart"
    );
    assert_eq!(h.host.server_seq(), server_seq);
}

#[test]
fn a_failed_commit_after_uncheckpointed_events_restores_the_last_committed_state() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    let committed = h.host.channel_state("ahp-chat:/s1");
    let session = h.host.channel_state("ahp-session:/s1");
    let mut store = h.host.into_store();
    store.fail_next_commits(1);
    let mut h = Harness::with(HostConfig::default(), store);
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-chat:/s1"]);
    let steer = json!({"type":"chat/pendingMessageSet","kind":"steering","id":"st","message":{"text":"now","origin":{"kind":"user"}}});
    let out = h.dispatch(1, "ahp-chat:/s1", 2, steer.clone());
    assert_eq!(out.len(), 1, "only the rejection: {out:?}");
    assert!(out[0].1["params"]["rejectionReason"].is_string());
    assert_eq!(h.host.channel_state("ahp-chat:/s1"), committed);
    assert_eq!(h.host.channel_state("ahp-session:/s1"), session);
    // The same action goes through once the store works again.
    let out = h.dispatch(1, "ahp-chat:/s1", 2, steer);
    assert!(out
        .iter()
        .any(|(_, v)| v["params"]["action"]["type"] == "chat/turnCancelled"));
}

#[test]
fn start_times_never_go_back_across_a_restart() {
    // Found by the simulator (seed 13): the wall-clock high-water mark lived only in memory.
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    let started =
        h.host.channel_state("ahp-chat:/s1").expect("chat")["activeTurn"]["startedAt"].clone();
    let store = h.host.into_store();
    let mut h = Harness::with(HostConfig::default(), store);
    h.wall_skew_ms = -3_600_000; // the wall clock stepped back an hour across the restart
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s2");
    h.dispatch(1, "ahp-chat:/s2", 2, turn("t2", "hi"));
    let later =
        h.host.channel_state("ahp-chat:/s2").expect("chat")["activeTurn"]["startedAt"].clone();
    assert!(
        later.as_str() >= started.as_str(),
        "{later} went back before {started}"
    );
    // A client-supplied cancel duration does not move modifiedAt off the host's clock.
    h.dispatch(
        1,
        "ahp-chat:/s2",
        3,
        json!({"type":"chat/turnCancelled","turnId":"t2","duration":999_999_999_999i64}),
    );
    let chat = h.host.channel_state("ahp-chat:/s2").expect("chat");
    assert!(
        chat["modifiedAt"].as_str() < Some("2100"),
        "{}",
        chat["modifiedAt"]
    );
}

#[test]
fn a_reply_larger_than_the_queue_limit_still_reaches_a_reader_that_keeps_up() {
    // Found by the simulator (seeds 7336, 16233): a replay or snapshot bigger than
    // queue_bytes_hard closed the connection on every reconnect, so it never recovered.
    let limits = Limits {
        queue_bytes_hard: 4096,
        queue_bytes_soft: 1024,
        message_bytes_max: 2048,
        ..Limits::default()
    };
    let mut h = Harness::limits(limits);
    h.init(1, Principal::maintainer("m"), "c1", &[]);
    h.create(1, "s1");
    for i in 0..20u64 {
        let id = format!("turn-with-a-long-identifier-{i}");
        h.dispatch(1, "ahp-chat:/s1", 2 * i + 1, turn(&id, &"x".repeat(100)));
        h.dispatch(
            1,
            "ahp-chat:/s1",
            2 * i + 2,
            json!({"type":"chat/turnCancelled","turnId":id,"duration":1}),
        );
    }
    h.connect(2, Principal::maintainer("m"));
    let out = h.send(2, &json!({"jsonrpc":"2.0","id":1,"method":"reconnect","params":{"channel":"ahp-root://","clientId":"c1","lastSeenServerSeq":0,"subscriptions":["ahp-chat:/s1"]}}));
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].1["result"]["type"], "replay");
    let size = out[0].1.to_string().len();
    assert!(
        size > 4096,
        "the reply ({size} bytes) is over the limit and still delivered"
    );
}

/// A `chat/turnStarted` whose JSON nests exactly `depth` levels: the action (1), its message
/// (2), the message's `_meta` (3) and `depth - 3` objects inside that.
fn deep_turn(id: &str, depth: usize) -> Value {
    let inner = depth - 3;
    let meta = format!("{}{{}}{}", "{\"a\":".repeat(inner), "}".repeat(inner));
    let text = format!(
        r#"{{"type":"chat/turnStarted","turnId":"{id}","startedAt":"2020-01-01T00:00:00.000Z","message":{{"text":"deep","origin":{{"kind":"user"}},"_meta":{meta}}}}}"#
    );
    assert_eq!(crate::jsonrpc::json_depth(&text), depth);
    serde_json::from_str(&text).expect("json")
}

#[test]
fn an_action_too_deep_to_store_is_refused_and_what_is_committed_loads_after_a_restart() {
    // Found by review: `params` is read raw (no depth limit) and an action of ~127 levels
    // decoded and was committed; the stored envelope and checkpoint wrap it deeper than
    // serde_json reads, so the host could not restart (CorruptRecord).
    let depth_max = crate::ACTION_DEPTH_MAX;
    let mut h = Harness::new();
    h.open_chat(&["ahp-root://"]);
    let (seq, commits) = (h.host.server_seq(), h.host.store().commits());
    let out = h.dispatch(1, "ahp-chat:/s1", 1, deep_turn("t0", depth_max + 1));
    assert_eq!(out.len(), 1, "only the rejection: {out:?}");
    let reason = out[0].1["params"]["rejectionReason"].as_str().unwrap_or("");
    assert!(reason.contains("nests too deeply"), "{reason}");
    assert!(
        out[0].1["params"]["action"].is_null(),
        "a refused deep action is not echoed back"
    );
    assert_eq!(h.host.server_seq(), seq);
    assert_eq!(h.host.store().commits(), commits);
    assert!(h.host.channel_state("ahp-chat:/s1").expect("chat")["activeTurn"].is_null());
    // Far too deep for the echo to carry: still one readable rejection.
    let out = h.dispatch(1, "ahp-chat:/s1", 2, deep_turn("t0", 126));
    assert!(out[0].1["params"]["rejectionReason"].is_string());

    // The deepest action accepted is committed, and stays readable however the host wraps it:
    // as an event, in a checkpoint (after the turn ends, inside `turns`), in snapshots.
    let out = h.dispatch(1, "ahp-chat:/s1", 3, deep_turn("t1", depth_max));
    assert!(
        out.iter()
            .any(|(_, v)| v["params"]["action"]["type"] == "chat/turnStarted"
                && v["params"].get("rejectionReason").is_none()),
        "{out:?}"
    );
    h.dispatch(
        1,
        "ahp-chat:/s1",
        4,
        json!({"type":"chat/turnCancelled","turnId":"t1","duration":1}),
    );
    // Enough event bytes for a checkpoint, so the stored chat holds the deep turn.
    for (i, seq) in (5..11u64).step_by(2).enumerate() {
        let id = format!("pad{i}");
        h.dispatch(1, "ahp-chat:/s1", seq, turn(&id, &"x".repeat(30_000)));
        h.dispatch(
            1,
            "ahp-chat:/s1",
            seq + 1,
            json!({"type":"chat/turnCancelled","turnId":id,"duration":1}),
        );
    }
    // A deep message left queued behind a running turn: deepest in a snapshot.
    h.dispatch(1, "ahp-chat:/s1", 11, turn("t2", "running"));
    let mut queued = deep_turn("unused", depth_max);
    let message = queued["message"].take();
    let queued =
        json!({"type":"chat/pendingMessageSet","kind":"queued","id":"q1","message":message});
    let out = h.dispatch(1, "ahp-chat:/s1", 12, queued);
    assert!(
        out[0].1["params"].get("rejectionReason").is_none(),
        "{out:?}"
    );
    // Every frame the harness reads is parsed by serde_json: the snapshot of the deep chat is
    // readable.
    h.init(
        2,
        Principal::maintainer("m"),
        "c2",
        &["ahp-chat:/s1", "ahp-session:/s1"],
    );
    let channels = ["ahp-session:/s1", "ahp-chat:/s1", "ahp-changeset:/s1"];
    let states: Vec<_> = channels.iter().map(|c| h.host.channel_state(c)).collect();
    let server_seq = h.host.server_seq();
    let store = h.host.into_store();
    let stored: Value = serde_json::from_str(
        store
            .record_text(Table::State, "ahp-chat:/s1")
            .expect("chat record"),
    )
    .expect("the checkpoint reads");
    assert!(
        stored["turns"]
            .as_array()
            .is_some_and(|turns| turns.iter().any(|t| t["id"] == "t1")),
        "the checkpoint holds the deep turn"
    );
    let mut h = Harness::with(HostConfig::default(), store);
    let after: Vec<_> = channels.iter().map(|c| h.host.channel_state(c)).collect();
    assert_eq!(after, states, "what was committed loads as it was");
    assert_eq!(h.host.server_seq(), server_seq);
    // And replays: a reconnect from the start carries every envelope.
    h.connect(3, Principal::maintainer("m"));
    let r = h.request(3, 1, "reconnect", json!({"channel":"ahp-root://","clientId":"c1","lastSeenServerSeq":0,"subscriptions":["ahp-chat:/s1"]}));
    assert_eq!(r["result"]["type"], "replay");
}

#[test]
fn a_message_queued_during_a_turn_starts_when_the_turn_is_cancelled() {
    // Found by review: the docs say the host starts the next pending message whenever the
    // chat is then idle; a cancel left the chat idle with its queue waiting.
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "first"));
    let queued = json!({"type":"chat/pendingMessageSet","kind":"queued","id":"q1","message":{"text":"later","origin":{"kind":"user"}}});
    h.dispatch(1, "ahp-chat:/s1", 2, queued);
    let chat = h.host.channel_state("ahp-chat:/s1").expect("chat");
    assert_eq!(chat["activeTurn"]["id"], "t1");
    assert_eq!(chat["queuedMessages"][0]["id"], "q1");
    let out = h.dispatch(
        1,
        "ahp-chat:/s1",
        3,
        json!({"type":"chat/turnCancelled","turnId":"t1","duration":1}),
    );
    let actions: Vec<&Value> = out
        .iter()
        .filter(|(c, v)| *c == 1 && v["params"]["channel"] == "ahp-chat:/s1")
        .map(|(_, v)| &v["params"]["action"])
        .collect();
    let types: Vec<&str> = actions.iter().filter_map(|a| a["type"].as_str()).collect();
    assert_eq!(
        types,
        [
            "chat/turnCancelled",
            "chat/pendingMessageRemoved",
            "chat/turnStarted"
        ]
    );
    assert_eq!(actions[1]["id"], "q1");
    assert_eq!(actions[2]["queuedMessageId"], "q1");
    assert_eq!(actions[2]["message"]["text"], "later");
    let chat = h.host.channel_state("ahp-chat:/s1").expect("chat");
    assert_eq!(chat["turns"][0]["state"], "cancelled");
    assert_eq!(chat["activeTurn"]["message"]["text"], "later");
    assert!(chat.get("queuedMessages").is_none(), "{chat}");
    // A cancel with nothing queued leaves the chat idle.
    let active = chat["activeTurn"]["id"].clone();
    h.dispatch(
        1,
        "ahp-chat:/s1",
        4,
        json!({"type":"chat/turnCancelled","turnId":active,"duration":1}),
    );
    assert!(h.host.channel_state("ahp-chat:/s1").expect("chat")["activeTurn"].is_null());
}

#[test]
fn a_client_that_may_not_dispatch_costs_no_store_read() {
    // Found by review: the receipt lookup came before the role and target checks, so an
    // observer flooding dispatchAction cost a store read per message.
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.init(2, observer("o"), "c2", &[]);
    let reads = h.host.store().reads();
    for seq in 1..=5 {
        let out = h.dispatch(2, "ahp-chat:/s1", seq, turn("t1", "hi"));
        assert_eq!(
            out[0].1["params"]["rejectionReason"],
            "Only maintainers can do this"
        );
    }
    // A maintainer aiming at a channel that takes no actions, or sending an action too deep,
    // is refused before the lookup too.
    let out = h.dispatch(
        1,
        "ahp-session:/s1",
        1,
        json!({"type":"session/titleChanged","title":"x"}),
    );
    assert!(out[0].1["params"]["rejectionReason"].is_string());
    let out = h.dispatch(
        1,
        "ahp-chat:/s1",
        1,
        deep_turn("t1", crate::ACTION_DEPTH_MAX + 1),
    );
    assert!(out[0].1["params"]["rejectionReason"].is_string());
    assert_eq!(h.host.store().reads(), reads);
    // A permitted action under a clientSeq this client never used is new work: applied with
    // no lookup either (the common case: a client numbering its actions 1, 2, 3, ...).
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    assert_eq!(h.host.store().reads(), reads);
    assert_eq!(
        h.host.channel_state("ahp-chat:/s1").expect("chat")["activeTurn"]["id"],
        "t1"
    );
    // One it used lately is answered from memory.
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    assert_eq!(h.host.store().reads(), reads);
}

#[test]
fn a_used_client_seq_missing_from_memory_is_looked_up_once() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    let cancel = |id: &str| json!({"type":"chat/turnCancelled","turnId":id,"duration":1});
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    h.dispatch(1, "ahp-chat:/s1", 2, cancel("t1"));
    h.dispatch(1, "ahp-chat:/s1", 3, turn("t3", "hi"));
    let seq = h.host.server_seq();
    let store = h.host.into_store();
    let mut h = Harness::with(HostConfig::default(), store);
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-chat:/s1"]);
    let reads = h.host.store().reads();
    // At or below the binding's lastClientSeq: maybe a retry, so the store is asked.
    assert!(h.dispatch(1, "ahp-chat:/s1", 2, cancel("t1")).is_empty());
    assert_eq!(h.host.store().reads(), reads + 1);
    assert_eq!(h.host.server_seq(), seq, "a retry changes nothing");
    // Above it: new work, no read.
    let out = h.dispatch(1, "ahp-chat:/s1", 4, cancel("t3"));
    assert!(
        out.iter()
            .all(|(_, f)| f["params"].get("rejectionReason").is_none()),
        "applied: {out:?}"
    );
    assert_eq!(h.host.store().reads(), reads + 1);
    assert!(h.host.server_seq() > seq);
}

#[test]
fn a_client_seq_beyond_the_safe_integers_is_refused_at_validation() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    let commits = h.host.store().commits();
    for (id, seq) in [
        (10, json!(1u64 << 53)),
        (11, json!(u64::MAX)),
        (12, json!(-1)),
    ] {
        let r = h.request(
            1,
            id,
            "dispatchAction",
            json!({"channel":"ahp-chat:/s1","clientSeq":seq,"action":turn("t1","x")}),
        );
        assert_eq!(r["error"]["code"], -32602, "{seq}: {r}");
    }
    assert_eq!(h.host.store().commits(), commits, "nothing was written");
    let r = h.request(
        1,
        13,
        "dispatchAction",
        json!({"channel":"ahp-chat:/s1","clientSeq":(1u64 << 53) - 1,"action":turn("t1","x")}),
    );
    assert_eq!(
        r["result"],
        Value::Null,
        "the largest safe integer is accepted: {r}"
    );
}
