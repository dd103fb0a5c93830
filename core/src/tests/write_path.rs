//! The asynchronous write path through the public surface: commits queued by the drive loop
//! and completed (or failed) later, as a writer thread would.

use serde_json::{json, Value};

use super::{observer, turn, Harness};
use crate::drive::{Commits, Drive};
use crate::{MemStore, Principal, CATALOG};

impl Harness {
    /// From now on commits wait in the drive loop's queue until `complete` or `fail`.
    fn queue_commits(&mut self) {
        self.drive = Drive::immediate()
            .commits(Commits::Queued)
            .close_at_once(false);
    }

    /// Makes the oldest `n` queued changes durable (one group) and drains what that released.
    fn complete(&mut self, n: usize) -> Vec<(u64, Value)> {
        let now = self.now();
        self.drive.complete(&mut self.host, now, n);
        self.drain()
    }

    /// Fails the oldest `group` queued changes as one transaction and drains the outcome.
    fn fail(&mut self, group: usize) -> Vec<(u64, Value)> {
        let now = self.now();
        self.drive.fail(&mut self.host, now, group);
        self.drain()
    }
}

fn actions_to(out: &[(u64, Value)], conn: u64) -> Vec<Value> {
    out.iter()
        .filter(|(c, v)| *c == conn && v["method"] == "action")
        .map(|(_, v)| v["params"].clone())
        .collect()
}

fn cancel(id: &str) -> Value {
    json!({"type":"chat/turnCancelled","turnId":id,"duration":1})
}

/// The durable store, reloaded: what a restart would serve.
fn reloaded(h: &Harness, uri: &str) -> Option<Value> {
    let store: MemStore = h.host.store().clone();
    let host = crate::Host::new(crate::HostConfig::default(), store, 1).expect("reload");
    host.channel_state(uri)
}

#[test]
fn what_a_change_reveals_waits_until_it_is_durable_and_unordered_traffic_does_not() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.init(2, observer("o"), "o1", &["ahp-chat:/s1"]);
    let seq = h.host.server_seq();
    h.queue_commits();
    // The echo to the sender and the event to the other subscriber wait.
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    assert_eq!(h.drive.queued(), 1);
    // A snapshot, a replay and a read that include it wait too.
    let sub =
        json!({"jsonrpc":"2.0","id":7,"method":"subscribe","params":{"channel":"ahp-session:/s1"}});
    assert!(h.send(2, &sub).is_empty());
    h.connect(3, Principal::maintainer("m"));
    let reconnect = json!({"jsonrpc":"2.0","id":1,"method":"reconnect","params":{"channel":"ahp-root://","clientId":"c3","lastSeenServerSeq":seq,"subscriptions":["ahp-chat:/s1"]}});
    assert!(h.send(3, &reconnect).is_empty());
    let list = json!({"jsonrpc":"2.0","id":8,"method":"listSessions","params":{}});
    assert!(h.send(2, &list).is_empty());
    // A ping depends on nothing: it passes what is held.
    let ping = json!({"jsonrpc":"2.0","id":9,"method":"ping","params":{"channel":"ahp-root://"}});
    let out = h.send(2, &ping);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1["id"], 9);
    assert_eq!(
        h.host.queued_bytes(crate::ConnId(2)).map(|b| b > 0),
        Some(true),
        "held frames count"
    );
    // Durable: everything comes out, in the order it was decided.
    let out = h.complete(usize::MAX);
    assert_eq!(actions_to(&out, 1).len(), 1, "{out:?}");
    let to_2: Vec<&Value> = out
        .iter()
        .filter(|(c, _)| *c == 2)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(to_2[0]["method"], "action");
    assert_eq!(to_2[1]["id"], 7);
    assert_eq!(to_2[2]["id"], 8);
    let replay = out
        .iter()
        .find(|(c, v)| *c == 3 && v["id"] == 1)
        .map(|(_, v)| v.clone())
        .expect("reconnect answered");
    assert_eq!(replay["result"]["type"], "replay");
    assert_eq!(replay["result"]["actions"][0]["serverSeq"], seq + 1);
    assert_eq!(h.host.commits_in_flight(), 0);
}

#[test]
fn dispatches_pipeline_and_a_failure_in_the_middle_rolls_back_everything_after_it() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.queue_commits();
    // Each is validated against the newest state, durable or not: the cancel sees t1 running.
    assert!(h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "a")).is_empty());
    assert!(h.dispatch(1, "ahp-chat:/s1", 2, cancel("t1")).is_empty());
    assert!(h.dispatch(1, "ahp-chat:/s1", 3, turn("t2", "b")).is_empty());
    assert_eq!(h.drive.queued(), 3);
    assert_eq!(h.host.commits_in_flight(), 3);
    let out = h.complete(1);
    let echoes = actions_to(&out, 1);
    assert_eq!(echoes.len(), 1);
    assert!(echoes[0]["rejectionReason"].is_null());
    let durable_chat = h.host.store().record("ahp-chat:/s1").map(str::to_owned);
    // The cancel's transaction fails: it and the later start are rolled back. The rejection
    // echoes carry the current serverSeq, so they wait for the mark that covers it.
    let mut out = h.fail(1);
    out.extend(h.complete(usize::MAX));
    let rejections = actions_to(&out, 1);
    assert_eq!(rejections.len(), 2, "{out:?}");
    for r in &rejections {
        assert!(r["rejectionReason"].is_string(), "{r}");
    }
    assert_eq!(rejections[0]["origin"]["clientSeq"], 2);
    assert_eq!(rejections[1]["origin"]["clientSeq"], 3);
    assert_eq!(h.host.stats().commit_failures, 2);
    // Memory equals the durable store: t1 runs, nothing of the failed changes is left.
    let chat = h.host.channel_state("ahp-chat:/s1").expect("chat");
    assert_eq!(chat["activeTurn"]["id"], "t1");
    assert_eq!(chat["turns"], json!([]));
    assert_eq!(Some(chat.clone()), reloaded(&h, "ahp-chat:/s1"));
    assert_eq!(
        h.host.store().record("ahp-chat:/s1").map(str::to_owned),
        durable_chat
    );
    // serverSeq never goes back; the next change (a new generation) works.
    let seq = h.host.server_seq();
    let out = h.dispatch(1, "ahp-chat:/s1", 4, cancel("t1"));
    assert!(out.iter().all(|(_, v)| v["method"] != "action"), "{out:?}");
    let out = h.complete(usize::MAX);
    let echo = actions_to(&out, 1);
    assert_eq!(echo.len(), 1, "{out:?}");
    assert!(echo[0]["rejectionReason"].is_null());
    assert!(echo[0]["serverSeq"].as_u64() > Some(seq));
    assert_eq!(
        h.host.channel_state("ahp-chat:/s1"),
        reloaded(&h, "ahp-chat:/s1")
    );
}

#[test]
fn a_retry_of_a_change_in_flight_is_answered_from_its_receipt() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.queue_commits();
    let reads = h.host.store().receipt_reads();
    assert!(h.dispatch(1, "ahp-chat:/s1", 5, turn("t1", "a")).is_empty());
    // The same action again: a retry, known although the store does not have it yet.
    assert!(h.dispatch(1, "ahp-chat:/s1", 5, turn("t1", "a")).is_empty());
    assert_eq!(h.drive.queued(), 1, "the retry issued nothing");
    assert_eq!(
        h.host.store().receipt_reads(),
        reads + 1,
        "only the first asked the store"
    );
    let out = h.complete(usize::MAX);
    assert_eq!(actions_to(&out, 1).len(), 1, "applied once: {out:?}");
}

#[test]
fn catalog_events_stay_behind_held_state_events_and_notifications_pass() {
    let mut h = Harness::new();
    h.open_chat(&[CATALOG]);
    h.init(2, observer("m"), "o1", &[CATALOG]);
    h.init(3, Principal::maintainer("m"), "svc", &[]);
    // A first registration makes the catalog's reservation durable.
    let service = h.register(1, json!({}));
    h.queue_commits();
    assert!(h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "a")).is_empty());
    // A notification to the service owner (conn 1) is not held behind its held echo.
    let notify = json!({"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":CATALOG,"serviceId":service,"method":"m","params":{}}});
    let out = h.send(3, &notify);
    assert_eq!(out.len(), 1, "{out:?} {:?}", h.host.stats());
    assert_eq!(out[0].0, 1);
    // A catalog change: its number is reserved, so the observer without held frames gets it at
    // once; conn 1 gets it only after the state event numbered below it.
    let reg = json!({"jsonrpc":"2.0","id":5,"method":"client/registerService","params":{"channel":CATALOG,"metadata":{}}});
    let out = h.send(3, &reg);
    let added: Vec<&(u64, Value)> = out
        .iter()
        .filter(|(_, v)| v["method"] == "action")
        .collect();
    assert_eq!(added.len(), 1, "{out:?}");
    assert_eq!(added[0].0, 2);
    let out = h.complete(usize::MAX);
    let to_1: Vec<u64> = actions_to(&out, 1)
        .iter()
        .filter_map(|p| p["serverSeq"].as_u64())
        .collect();
    assert_eq!(to_1.len(), 2, "{out:?}");
    assert!(
        to_1[0] < to_1[1],
        "serverSeq climbs on every connection: {to_1:?}"
    );
}

#[test]
fn an_observer_that_loses_a_held_catalog_event_is_closed() {
    let mut h = Harness::new();
    // An observer of the same principal sees the service.
    h.init(1, observer("m"), "o1", &[CATALOG]);
    h.init(2, Principal::maintainer("m"), "svc", &[]);
    h.queue_commits();
    // No reservation yet: the catalog event waits for the one this registration issues.
    let reg = json!({"jsonrpc":"2.0","id":5,"method":"client/registerService","params":{"channel":CATALOG,"metadata":{}}});
    let out = h.send(2, &reg);
    assert!(out.iter().all(|(c, _)| *c != 1), "{out:?}");
    // The registration itself depends on no unflushed state: its owner hears it at once.
    assert!(
        out.iter()
            .any(|(c, v)| *c == 2 && v["id"] == 5 && v["result"]["serviceId"].is_string()),
        "{out:?}"
    );
    let mut out = h.fail(1);
    out.extend(h.complete(usize::MAX));
    assert!(out.contains(&(1, json!({"close": 1008}))), "{out:?}");
    // It stands (it is not durable state).
    assert_eq!(h.host.service_count(), 1);
}

#[test]
fn a_failed_session_creation_answers_its_request_and_leaves_nothing() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-root://"]);
    h.queue_commits();
    let create = json!({"jsonrpc":"2.0","id":2,"method":"createSession","params":{"channel":"ahp-session:/s9"}});
    assert!(h.send(1, &create).is_empty());
    // A subscription to the session in flight waits for it, and fails with it.
    let sub =
        json!({"jsonrpc":"2.0","id":3,"method":"subscribe","params":{"channel":"ahp-chat:/s9"}});
    assert!(h.send(1, &sub).is_empty());
    let mut out = h.fail(1);
    out.extend(h.complete(usize::MAX));
    let answers: Vec<&Value> = out
        .iter()
        .filter(|(c, _)| *c == 1)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(
        answers.len(),
        2,
        "no root notification of a session that failed: {out:?}"
    );
    assert_eq!(answers[0]["id"], 2);
    assert_eq!(answers[0]["error"]["code"], -32603);
    assert_eq!(answers[1]["id"], 3);
    assert_eq!(answers[1]["error"]["code"], -32603);
    assert_eq!(h.host.session_count(), 0);
    assert!(h
        .host
        .subscriptions(crate::ConnId(1))
        .iter()
        .all(|s| s != "ahp-chat:/s9"));
    // The same creation works in the next generation.
    let r = h.send(1, &create);
    assert!(r.is_empty());
    let out = h.complete(usize::MAX);
    assert!(
        out.iter()
            .any(|(_, v)| v["id"] == 2 && v["result"].is_null()),
        "{out:?}"
    );
    assert_eq!(h.host.session_count(), 1);
}

#[test]
fn a_client_seq_a_signed_reader_cannot_take_back_is_refused_before_the_store() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    let commits = h.host.store().commits();
    let out = h.dispatch(1, "ahp-chat:/s1", 1u64 << 63, turn("t1", "a"));
    let r = actions_to(&out, 1);
    assert_eq!(r.len(), 1, "{out:?}");
    assert!(
        r[0]["rejectionReason"]
            .as_str()
            .is_some_and(|m| m.contains("clientSeq")),
        "{r:?}"
    );
    assert_eq!(h.host.store().commits(), commits);
    let out = h.dispatch(1, "ahp-chat:/s1", i64::MAX as u64, turn("t1", "a"));
    assert!(actions_to(&out, 1)[0]["rejectionReason"].is_null());
}

#[test]
fn after_a_failed_commit_with_nothing_in_flight_nothing_is_held() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &["ahp-root://"]);
    h.queue_commits();
    let create = json!({"jsonrpc":"2.0","id":2,"method":"createSession","params":{"channel":"ahp-session:/s9"}});
    assert!(h.send(1, &create).is_empty());
    let out = h.fail(1);
    assert!(out.iter().any(|(_, v)| v["id"] == 2), "{out:?}");
    assert_eq!(h.host.commits_in_flight(), 0);
    // Made after the failure, depending on nothing in flight: answered at once.
    let sub =
        json!({"jsonrpc":"2.0","id":3,"method":"subscribe","params":{"channel":"ahp-chat:/nope"}});
    let out = h.send(1, &sub);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].1["id"], 3);
    assert_eq!(h.host.queued_bytes(crate::ConnId(1)), Some(0));
}

#[test]
fn call_refusals_and_unreadable_frames_pass_held_frames_and_survive_a_failed_commit() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.queue_commits();
    // Conn 1's echo is held behind the change in flight.
    assert!(h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "a")).is_empty());
    let call = json!({"jsonrpc":"2.0","id":11,"method":"clientService/request","params":{"channel":CATALOG,"serviceId":"nope","method":"m","params":{}}});
    let out = h.send(1, &call);
    assert_eq!(out.len(), 1, "a refusal passes at once: {out:?}");
    assert_eq!(out[0].1["id"], 11);
    assert_eq!(out[0].1["error"]["code"], -32008);
    let out = h.send_raw(1, "{not json");
    assert_eq!(out.len(), 1, "an id:null error passes at once: {out:?}");
    assert!(out[0].1["id"].is_null());
    // Before the handshake too.
    h.connect(4, Principal::maintainer("m"));
    let out = h.send(4, &call);
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].1["error"]["code"], -32009);
    // The unrelated change fails: nothing more is said about the refusals.
    let out = h.fail(1);
    assert!(out.iter().all(|(_, v)| v["id"] != 11), "{out:?}");
}

#[test]
fn registry_answers_pass_at_once_and_a_registration_stands_when_its_reservation_fails() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.init(2, Principal::maintainer("m"), "svc", &[]);
    h.queue_commits();
    assert!(h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "a")).is_empty());
    // The answer does not wait for the dispatch (nor for the reservation it issues).
    let reg = json!({"jsonrpc":"2.0","id":5,"method":"client/registerService","params":{"channel":CATALOG,"metadata":{}}});
    let out = h.send(2, &reg);
    let answer = out
        .iter()
        .find(|(c, v)| *c == 2 && v["id"] == 5)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("answered at once: {out:?}"));
    let service = answer["result"]["serviceId"].clone();
    assert!(service.is_string(), "{answer}");
    assert_eq!(
        h.host.commits_in_flight(),
        2,
        "the dispatch and the reservation"
    );
    // Both fail: the registry is memory only, so the registration its answer announced stands
    // and its owner (no catalog observer) keeps its connection.
    let mut out = h.fail(2);
    out.extend(h.complete(usize::MAX));
    assert!(!out.contains(&(2, json!({"close": 1008}))), "{out:?}");
    assert_eq!(h.host.service_count(), 1);
    let update = json!({"jsonrpc":"2.0","id":6,"method":"client/updateService","params":{"channel":CATALOG,"serviceId":service,"metadata":{"v":2}}});
    let out = h.send(2, &update);
    assert!(
        out.iter()
            .any(|(c, v)| *c == 2 && v["id"] == 6 && v["result"].is_object()),
        "{out:?}"
    );
}

#[test]
fn an_unsupported_version_is_answered_before_its_close_even_when_a_commit_fails() {
    let mut h = Harness::new();
    h.open_chat(&[]);
    h.queue_commits();
    assert!(h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "a")).is_empty());
    h.connect(2, Principal::maintainer("m"));
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"c"}});
    // Held behind the change in flight, the close behind it.
    assert!(h.send(2, &init).is_empty());
    let mut out = h.fail(1);
    out.extend(h.complete(usize::MAX));
    let to_2: Vec<&Value> = out
        .iter()
        .filter(|(c, _)| *c == 2)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(to_2.len(), 2, "{out:?}");
    assert_eq!(to_2[0]["error"]["code"], -32005, "{out:?}");
    assert_eq!(*to_2[1], json!({"close": 1008}));
}
