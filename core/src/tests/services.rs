//! Client services through the public surface: catalog, notifications, routed requests.

use serde_json::{json, Value};

use super::{observer, Harness};
use crate::{ConnId, HostConfig, Limits, MemStore, Principal};

const CATALOG: &str = "x-client-services://";

fn host_with_groups(groups: &[&[&str]]) -> Harness {
    let config = HostConfig {
        trust_groups: groups
            .iter()
            .map(|g| g.iter().map(|s| s.to_string()).collect())
            .collect(),
        ..HostConfig::default()
    };
    Harness::with(config, MemStore::new())
}

impl Harness {
    fn register(&mut self, conn: u64, metadata: Value) -> String {
        let r = self.request(
            conn,
            100,
            "client/registerService",
            json!({"channel": CATALOG, "metadata": metadata}),
        );
        r["result"]["serviceId"]
            .as_str()
            .unwrap_or_else(|| panic!("register failed: {r}"))
            .to_owned()
    }

    fn notify(
        &mut self,
        conn: u64,
        service: &str,
        method: &str,
        params: &str,
    ) -> Vec<(u64, Value)> {
        let text = format!(
            r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{{"channel":"{CATALOG}","serviceId":"{service}","method":"{method}","params":{params}}}}}"#
        );
        self.send_raw(conn, &text)
    }

    fn call(
        &mut self,
        conn: u64,
        id: Value,
        service: &str,
        method: &str,
        params: Value,
    ) -> Vec<(u64, Value)> {
        self.send(conn, &json!({"jsonrpc":"2.0","id":id,"method":"clientService/request","params":{"channel":CATALOG,"serviceId":service,"method":method,"params":params}}))
    }

    fn respond(&mut self, conn: u64, id: u64, body: Value) -> Vec<(u64, Value)> {
        let mut msg = json!({"jsonrpc":"2.0","id":id});
        for (k, v) in body.as_object().cloned().unwrap_or_default() {
            msg[k] = v;
        }
        self.send(conn, &msg)
    }

    fn advance(&mut self, ms: u64) -> Vec<(u64, Value)> {
        self.now += ms;
        let now = self.now();
        self.host.handle_timeout(now);
        self.drain()
    }
}

fn handle_request_id(out: &[(u64, Value)], owner: u64) -> u64 {
    let (_, v) = out
        .iter()
        .find(|(c, v)| *c == owner && v["method"] == "clientService/handleRequest")
        .unwrap_or_else(|| panic!("no handleRequest to {owner}: {out:?}"));
    v["id"].as_u64().expect("host ids are numeric")
}

#[test]
fn services_register_and_are_discovered_through_the_catalog() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "watcher", &[CATALOG]);
    let id = h.register(1, json!({"protocol":"git-object-reader","version":1}));
    assert!(
        id.len() >= 32,
        "service ids carry at least 128 random bits: {id}"
    );
    // The registration's catalog event reached the watcher only.
    let state = h
        .host
        .channel_state_for(&Principal::maintainer("m"), CATALOG)
        .expect("catalog");
    assert_eq!(state["services"][0]["serviceId"], id.as_str());
    assert_eq!(state["services"][0]["clientId"], "owner");
    assert_eq!(state["services"][0]["principal"], "m");
    let r = h.request(3 - 1, 7, "subscribe", json!({"channel": CATALOG}));
    assert_eq!(
        r["result"]["snapshot"]["state"]["services"][0]["metadata"]["protocol"],
        "git-object-reader"
    );
}

#[test]
fn catalog_changes_reach_exactly_the_observers_that_can_see_them() {
    let mut h = host_with_groups(&[&["alice", "bob"]]);
    h.init(1, Principal::maintainer("alice"), "a1", &[]);
    h.init(2, Principal::maintainer("bob"), "b1", &[CATALOG]);
    h.init(3, Principal::maintainer("carol"), "c1", &[CATALOG]);
    h.init(4, Principal::maintainer("alice"), "a2", &[CATALOG]);
    let out = h.send(1, &json!({"jsonrpc":"2.0","id":5,"method":"client/registerService","params":{"channel":CATALOG,"metadata":{"v":1}}}));
    let id = out
        .iter()
        .find(|(c, _)| *c == 1)
        .map(|(_, v)| v["result"]["serviceId"].clone())
        .expect("registered");
    let added: Vec<u64> = out
        .iter()
        .filter(|(_, v)| v["params"]["action"]["type"] == "x-clientServices/serviceAdded")
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(added, vec![2, 4], "carol shares no trust group with alice");
    let seq = out
        .iter()
        .find(|(c, _)| *c == 2)
        .and_then(|(_, v)| v["params"]["serverSeq"].as_u64())
        .expect("seq");
    assert!(seq > 0);

    // Narrowing the audience to alice's own principal removes it for bob.
    let out = h.send(1, &json!({"jsonrpc":"2.0","id":6,"method":"client/updateService","params":{"channel":CATALOG,"serviceId":id,"audience":["nobody"]}}));
    let kinds: Vec<(u64, String)> = out
        .iter()
        .filter(|(_, v)| v["method"] == "action")
        .map(|(c, v)| {
            (
                *c,
                v["params"]["action"]["type"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    assert_eq!(
        kinds,
        vec![
            (2, "x-clientServices/serviceRemoved".into()),
            (4, "x-clientServices/serviceUpdated".into())
        ]
    );
    assert_eq!(
        out.iter()
            .find(|(c, _)| *c == 1)
            .map(|(_, v)| v["result"].clone()),
        Some(json!({}))
    );
    // Widening it again adds it back for bob.
    let out = h.send(1, &json!({"jsonrpc":"2.0","id":7,"method":"client/updateService","params":{"channel":CATALOG,"serviceId":id,"audience":null,"metadata":{"v":2}}}));
    let bob = out.iter().find(|(c, _)| *c == 2).expect("bob");
    assert_eq!(
        bob.1["params"]["action"]["type"],
        "x-clientServices/serviceAdded"
    );
    assert_eq!(bob.1["params"]["action"]["service"]["metadata"]["v"], 2);
    let seq2 = bob.1["params"]["serverSeq"].as_u64().expect("seq");
    assert!(
        seq2 > seq,
        "catalog events carry strictly increasing serverSeqs"
    );
    // Disconnect removes it for everyone who saw it.
    let out = h.close(1);
    let removed: Vec<u64> = out
        .iter()
        .filter(|(_, v)| v["params"]["action"]["type"] == "x-clientServices/serviceRemoved")
        .map(|(c, _)| *c)
        .collect();
    assert_eq!(removed, vec![2, 4]);
    assert_eq!(h.host.service_count(), 0);
}

#[test]
fn a_notification_is_one_frame_in_and_one_frame_out_with_params_verbatim() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[CATALOG]);
    h.init(2, Principal::maintainer("m"), "sender", &[CATALOG]);
    let id = h.register(1, json!({}));
    h.drain();
    let params = r#"{ "z" : 1,"a":[ "é", 2.50 ] }"#;
    let out = h.notify(2, &id, "refsChanged", params);
    assert_eq!(out.len(), 1, "exactly one frame, to the owner: {out:?}");
    assert_eq!(out[0].0, 1);
    let v = &out[0].1;
    assert_eq!(v["method"], "clientService/notification");
    assert!(v.get("id").is_none());
    assert_eq!(v["params"]["senderClientId"], "sender");
    assert_eq!(v["params"]["serviceId"], id.as_str());
    assert_eq!(v["params"]["method"], "refsChanged");
    assert_eq!(h.host.stats().notifications_forwarded, 1);
    assert_eq!(
        h.host.pending_requests(),
        0,
        "notifications allocate no request state"
    );
    // The params bytes are forwarded as received.
    let text = format!(
        r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{{"channel":"{CATALOG}","serviceId":"{id}","method":"m","params":{params}}}}}"#
    );
    h.feed(2, &text);
    match h.host.poll_output() {
        Some(crate::Output::Send { frame, .. }) => {
            assert!(frame.as_str().contains(params), "{}", frame.as_str())
        }
        other => panic!("unexpected {other:?}"),
    }
}

/// The notify path allocates no frame buffer once the driver gives frames back: the buffer of a
/// recycled frame carries the next forwarded notification. A frame still held elsewhere is not
/// reused. (The core bench's figures rest on this.)
#[test]
fn a_recycled_frame_carries_the_next_notification() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "sender", &[]);
    let id = h.register(1, json!({}));
    h.drain();
    let text = format!(
        r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{{"channel":"{CATALOG}","serviceId":"{id}","method":"m","params":{{"n":1}}}}}}"#
    );
    let forward = |h: &mut Harness| {
        h.feed(2, &text);
        match h.host.poll_output() {
            Some(crate::Output::Send {
                conn: ConnId(1),
                frame,
            }) => frame,
            other => panic!("unexpected {other:?}"),
        }
    };
    let first = forward(&mut h);
    let buffer = first.as_bytes().as_ptr();
    h.host.recycle(first);
    let second = forward(&mut h);
    assert_eq!(second.as_bytes().as_ptr(), buffer, "the buffer was reused");
    // Still held (as a fan-out or a queued write would hold it): given back, but not reused.
    let held = second.clone();
    h.host.recycle(second);
    let third = forward(&mut h);
    assert_ne!(third.as_bytes().as_ptr(), held.as_bytes().as_ptr());
    assert_eq!(third.as_bytes(), held.as_bytes());
}

#[test]
fn undeliverable_notifications_vanish_without_a_trace() {
    let mut h = host_with_groups(&[]);
    h.init(1, Principal::maintainer("alice"), "owner", &[]);
    h.init(2, Principal::maintainer("bob"), "stranger", &[]);
    h.init(3, Principal::maintainer("alice"), "friend", &[]);
    let id = h.register(1, json!({}));
    let long_method = "m".repeat(300);
    let cases: Vec<Vec<(u64, Value)>> = vec![
        h.notify(2, &id, "m", "{}"),                  // invisible to bob
        h.notify(3, "svc_nope", "m", "{}"),           // unknown
        h.notify(3, &id, &long_method, "{}"),         // method over 256 bytes
        h.send_raw(3, r#"{"jsonrpc":"2.0","method":"clientService/notify","params":{"serviceId":1}}"#), // malformed
        h.send_raw(3, r#"{"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":"ahp-root://","serviceId":"x","method":"m","params":{}}}"#),
    ];
    for (i, out) in cases.iter().enumerate() {
        assert!(out.is_empty(), "case {i} produced traffic: {out:?}");
    }
    assert_eq!(h.host.stats().notifications_dropped, 5);
    assert_eq!(h.host.stats().notifications_forwarded, 0);
    // Over the payload limit, too.
    let big = format!("\"{}\"", "x".repeat(1024 * 1024 + 1));
    assert!(h.notify(3, &id, "m", &big).is_empty());
    assert_eq!(h.host.stats().notifications_dropped, 6);
}

#[test]
fn a_slow_owner_loses_notifications_but_keeps_its_connection() {
    let limits = Limits {
        queue_bytes_soft: 1000,
        queue_bytes_hard: 100_000,
        ..Limits::default()
    };
    let mut h = Harness::limits(limits);
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "sender", &[]);
    let id = h.register(1, json!({}));
    let now = h.now();
    let mut forwarded = 0;
    for _ in 0..50 {
        let text = format!(
            r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{{"channel":"{CATALOG}","serviceId":"{id}","method":"m","params":"{}"}}}}"#,
            "x".repeat(200)
        );
        h.host.handle(
            now,
            crate::Input::Message {
                conn: ConnId(2),
                text: text.as_str(),
            },
        );
        // Owner never flushes.
        while let Some(o) = h.host.poll_output() {
            match o {
                crate::Output::Send { conn, .. } => {
                    assert_eq!(conn, ConnId(1), "nothing goes back to the sender");
                    forwarded += 1;
                }
                crate::Output::Close { .. } => panic!("notifications never close a connection"),
                crate::Output::Commit(_) => panic!("notifications change nothing durable"),
            }
        }
    }
    assert!(forwarded > 0 && forwarded < 50, "forwarded {forwarded}");
    assert_eq!(h.host.stats().notifications_dropped, 50 - forwarded);
    assert!(h.host.queued_bytes(ConnId(1)).unwrap_or(0) <= 1000 + 400);
}

#[test]
fn a_request_is_routed_and_answered_under_the_callers_id() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    let out = h.call(2, json!("req-7"), &id, "getRefs", json!({"repo":"r"}));
    assert_eq!(out.len(), 1, "only the forwarded request: {out:?}");
    let hid = handle_request_id(&out, 1);
    assert_eq!(out[0].1["params"]["senderClientId"], "caller");
    assert_eq!(out[0].1["params"]["params"], json!({"repo":"r"}));
    assert_eq!(h.host.pending_requests(), 1);
    let out = h.respond(1, hid, json!({"result": {"refs": ["a"]}}));
    assert_eq!(
        out,
        vec![(
            2,
            json!({"jsonrpc":"2.0","id":"req-7","result":{"refs":["a"]}})
        )]
    );
    assert_eq!(h.host.pending_requests(), 0);
    // A duplicate of the same response completes nothing.
    assert!(h.respond(1, hid, json!({"result": 1})).is_empty());
    assert_eq!(h.host.stats().responses_dropped, 1);
}

#[test]
fn service_errors_keep_code_message_and_bounded_data() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    let hid = handle_request_id(&h.call(2, json!(1), &id, "m", json!(null)), 1);
    let out = h.respond(
        1,
        hid,
        json!({"error": {"code": 42, "message": "no such repo", "data": {"repo": "r"}}}),
    );
    assert_eq!(
        out[0].1["error"],
        json!({"code": 42, "message": "no such repo", "data": {"repo": "r"}})
    );
    let hid = handle_request_id(&h.call(2, json!(2), &id, "m", json!(null)), 1);
    let big = "d".repeat(70_000);
    let out = h.respond(
        1,
        hid,
        json!({"error": {"code": 43, "message": "m", "data": big}}),
    );
    assert_eq!(
        out[0].1["error"],
        json!({"code": 43, "message": "m"}),
        "oversized data is dropped"
    );
    let hid = handle_request_id(&h.call(2, json!(3), &id, "m", json!(null)), 1);
    let out = h.respond(1, hid, json!({"error": "not an object"}));
    assert_eq!(out[0].1["error"]["code"], -32603);
}

#[test]
fn one_hundred_callers_with_the_same_id_get_their_own_answers() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    let id = h.register(1, json!({}));
    let mut forwarded = Vec::new();
    for caller in 0..100u64 {
        let conn = 10 + caller;
        h.init(
            conn,
            Principal::maintainer("m"),
            &format!("caller{caller}"),
            &[],
        );
        let out = h.call(conn, json!(1), &id, "echo", json!({"who": caller}));
        forwarded.push((
            conn,
            handle_request_id(&out, 1),
            out[0].1["params"]["params"]["who"].clone(),
        ));
    }
    let ids: std::collections::BTreeSet<u64> = forwarded.iter().map(|f| f.1).collect();
    assert_eq!(ids.len(), 100, "host ids never collide");
    // Answer in reverse order; each caller gets its own echo under id 1.
    for (conn, hid, who) in forwarded.into_iter().rev() {
        let out = h.respond(1, hid, json!({"result": {"who": who}}));
        assert_eq!(
            out,
            vec![(
                conn,
                json!({"jsonrpc":"2.0","id":1,"result":{"who": conn - 10}})
            )]
        );
    }
    assert_eq!(h.host.pending_requests(), 0);
}

#[test]
fn only_the_connection_that_was_asked_can_answer() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    h.init(3, Principal::maintainer("m"), "intruder", &[]);
    let id = h.register(1, json!({}));
    let hid = handle_request_id(&h.call(2, json!(5), &id, "m", json!(null)), 1);
    assert!(h.respond(3, hid, json!({"result": "forged"})).is_empty());
    assert!(h.respond(2, hid, json!({"result": "forged"})).is_empty());
    assert_eq!(h.host.pending_requests(), 1);
    let out = h.respond(1, hid, json!({"result": "real"}));
    assert_eq!(out[0].1["result"], "real");
}

#[test]
fn timeouts_fail_the_caller_once_and_tell_the_service() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    let out = h.send(2, &json!({"jsonrpc":"2.0","id":9,"method":"clientService/request","params":{"channel":CATALOG,"serviceId":id,"method":"slow","params":{},"timeoutMs":50}}));
    let hid = handle_request_id(&out, 1);
    assert!(h.advance(10).is_empty());
    let out = h.advance(100);
    assert!(out.contains(&(2, json!({"jsonrpc":"2.0","id":9,"error":{"code":-32050,"message":"Service request timed out"}}))));
    assert!(out.contains(&(
        1,
        json!({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"channel":CATALOG,"id":hid}})
    )));
    assert_eq!(h.host.pending_requests(), 0);
    // The late answer completes nothing.
    assert!(h.respond(1, hid, json!({"result": 1})).is_empty());
    assert_eq!(h.host.stats().requests_timed_out, 1);
    // timeoutMs above the host maximum is capped, not refused.
    h.send(2, &json!({"jsonrpc":"2.0","id":10,"method":"clientService/request","params":{"channel":CATALOG,"serviceId":id,"method":"slow","params":{},"timeoutMs":9_999_999}}));
    assert!(h.advance(299_000).is_empty());
    let out = h.advance(2_000);
    assert!(out
        .iter()
        .any(|(c, v)| *c == 2 && v["error"]["code"] == -32050));
}

#[test]
fn cancellation_is_forwarded_and_completes_the_caller() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    let hid = handle_request_id(&h.call(2, json!("a"), &id, "m", json!(null)), 1);
    let out = h.send(
        2,
        &json!({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"channel":CATALOG,"id":"a"}}),
    );
    assert!(out.contains(&(
        2,
        json!({"jsonrpc":"2.0","id":"a","error":{"code":-32800,"message":"Request cancelled"}})
    )));
    assert!(out.contains(&(
        1,
        json!({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"channel":CATALOG,"id":hid}})
    )));
    assert_eq!(h.host.pending_requests(), 0);
    assert!(
        h.respond(1, hid, json!({"result": 1})).is_empty(),
        "a late result after cancel is dropped"
    );
    // Cancelling an unknown id does nothing at all.
    assert!(h.send(2, &json!({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"channel":CATALOG,"id":"zzz"}})).is_empty());
}

#[test]
fn owner_loss_and_unregistration_fail_pending_requests_at_once() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    h.call(2, json!(1), &id, "m", json!(null));
    let out = h.request(
        1,
        50,
        "client/unregisterService",
        json!({"channel":CATALOG,"serviceId":id}),
    );
    assert_eq!(out["result"], json!({}));
    assert_eq!(h.host.pending_requests(), 0);
    let id2 = h.register(1, json!({}));
    let out = h.call(2, json!(2), &id2, "m", json!(null));
    handle_request_id(&out, 1);
    let out = h.close(1);
    assert!(out.contains(&(2, json!({"jsonrpc":"2.0","id":2,"error":{"code":-32051,"message":"Service is no longer available"}}))));
    assert_eq!(h.host.pending_requests(), 0);
    assert_eq!(h.host.service_count(), 0);
}

#[test]
fn a_departing_caller_releases_its_requests_and_the_service_hears_of_it() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    let hid = handle_request_id(&h.call(2, json!(1), &id, "m", json!(null)), 1);
    let out = h.close(2);
    assert_eq!(
        out,
        vec![(
            1,
            json!({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"channel":CATALOG,"id":hid}})
        )]
    );
    assert_eq!(h.host.pending_requests(), 0);
    assert!(h.respond(1, hid, json!({"result": 1})).is_empty());
}

#[test]
fn stale_ids_never_reach_a_replacement_and_only_the_owner_may_change_a_service() {
    let mut h = host_with_groups(&[&["m", "o"]]);
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "sibling", &[]);
    h.init(3, observer("o"), "peer", &[]);
    h.init(4, Principal::maintainer("x"), "outsider", &[]);
    let old = h.register(1, json!({}));
    h.close(1);
    h.init(5, Principal::maintainer("m"), "owner", &[]);
    let new = h.register(5, json!({}));
    assert_ne!(old, new);
    let out = h.call(2, json!(1), &old, "m", json!(null));
    assert_eq!(out[0].1["error"]["code"], -32008);
    assert!(h.notify(2, &old, "m", "{}").is_empty());
    // Same principal, other connection: visible but not its to change.
    let r = h.request(
        2,
        2,
        "client/unregisterService",
        json!({"channel":CATALOG,"serviceId":new}),
    );
    assert_eq!(r["error"]["code"], -32009);
    let r = h.request(
        3,
        3,
        "client/updateService",
        json!({"channel":CATALOG,"serviceId":new,"metadata":{}}),
    );
    assert_eq!(r["error"]["code"], -32009);
    // Invisible is exactly "unknown".
    let r = h.request(
        4,
        4,
        "client/unregisterService",
        json!({"channel":CATALOG,"serviceId":new}),
    );
    assert_eq!(r["error"]["code"], -32008);
    let r = h.request(
        4,
        5,
        "client/unregisterService",
        json!({"channel":CATALOG,"serviceId":"svc_never"}),
    );
    assert_eq!(r["error"]["code"], -32008);
    let out = h.call(4, json!(6), &new, "m", json!(null));
    assert_eq!(
        out[0].1["error"],
        json!({"code":-32008,"message":"Unknown service"})
    );
    // A trusted peer may call it.
    let out = h.call(3, json!(7), &new, "m", json!(null));
    handle_request_id(&out, 5);
}

#[test]
fn service_limits_are_enforced() {
    let limits = Limits {
        services_per_conn_max: 2,
        relays_per_conn_max: 2,
        relays_per_service_max: 3,
        ..Limits::default()
    };
    let mut h = Harness::limits(limits);
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    h.init(3, Principal::maintainer("m"), "caller2", &[]);
    let id = h.register(1, json!({}));
    h.register(1, json!({}));
    let r = h.request(
        1,
        9,
        "client/registerService",
        json!({"channel":CATALOG,"metadata":{}}),
    );
    assert_eq!(r["error"]["code"], -32043);
    let r = h.request(
        2,
        9,
        "client/registerService",
        json!({"channel":CATALOG,"metadata":{"x":"y".repeat(5000)}}),
    );
    assert_eq!(r["error"]["code"], -32043);
    let r = h.request(
        2,
        10,
        "client/registerService",
        json!({"channel":CATALOG,"metadata":[1]}),
    );
    assert_eq!(r["error"]["code"], -32602);
    let r = h.request(2, 11, "client/registerService", json!({"metadata":{}}));
    assert_eq!(r["error"]["code"], -32602);
    h.call(2, json!(1), &id, "m", json!(null));
    h.call(2, json!(2), &id, "m", json!(null));
    let out = h.call(2, json!(3), &id, "m", json!(null));
    assert_eq!(out[0].1["error"]["code"], -32043, "per-caller limit");
    h.call(3, json!(1), &id, "m", json!(null));
    let out = h.call(3, json!(2), &id, "m", json!(null));
    assert_eq!(out[0].1["error"]["code"], -32043, "per-service limit");
    let out = h.call(3, json!(3), &id, &"m".repeat(257), json!(null));
    assert_eq!(out[0].1["error"]["code"], -32602);
    let out = h.call(2, json!(1), &id, "m", json!(null));
    assert_eq!(
        out[0].1["error"]["code"], -32600,
        "the caller's id is already pending"
    );
    assert_eq!(h.host.pending_requests(), 3);
}

#[test]
fn initialize_advertises_the_extension_and_its_limits() {
    let mut h = Harness::new();
    let r = h.init(1, Principal::maintainer("m"), "c", &[]);
    let cap = &r["_meta"]["x-client-services"];
    assert_eq!(cap["version"], 1);
    assert!(cap["methods"]
        .as_array()
        .is_some_and(|m| m.contains(&json!("clientService/notify"))));
    assert_eq!(cap["limits"]["payloadBytes"], 1024 * 1024);
}

#[test]
fn reconnecting_catalog_observers_get_a_fresh_snapshot() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "watcher", &[CATALOG]);
    h.register(1, json!({}));
    let seq = h.host.server_seq();
    h.close(2);
    h.connect(3, Principal::maintainer("m"));
    let r = h.request(3, 1, "reconnect", json!({"channel":"ahp-root://","clientId":"watcher","lastSeenServerSeq":seq,"subscriptions":[CATALOG]}));
    assert_eq!(r["result"]["type"], "snapshot");
    assert_eq!(
        r["result"]["snapshots"][0]["state"]["services"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );
}

#[test]
fn catalog_sequence_numbers_survive_a_restart() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[CATALOG]);
    h.register(1, json!({}));
    let seq = h.host.server_seq();
    let store = h.host.into_store();
    let h = Harness::with(HostConfig::default(), store);
    assert!(h.host.server_seq() >= seq, "serverSeq never goes backwards");
}

#[test]
fn requests_and_registrations_need_a_handshake() {
    let mut h = Harness::new();
    h.connect(1, Principal::maintainer("m"));
    let r = h.request(
        1,
        1,
        "client/registerService",
        json!({"channel":CATALOG,"metadata":{}}),
    );
    assert_eq!(r["error"]["code"], -32009);
    let out = h.send(1, &json!({"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":CATALOG,"serviceId":"x","method":"m","params":{}}}));
    assert!(out.is_empty());
}

#[test]
fn a_notify_before_the_handshake_is_dropped_on_every_path() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    let id = h.register(1, json!({}));
    h.connect(2, Principal::maintainer("m"));
    // The canonical layout (hand-matched), another params order (one serde pass) and another
    // envelope order (the general parser): none reaches the owner before `initialize`.
    let canonical = h.notify(2, &id, "m", "{}");
    let sorted = h.send(2, &json!({"jsonrpc":"2.0","method":"clientService/notify","params":{"channel":CATALOG,"serviceId":id,"method":"m","params":{}}}));
    let general = h.send_raw(2, &format!(r#"{{"method":"clientService/notify","jsonrpc":"2.0","params":{{"channel":"{CATALOG}","serviceId":"{id}","method":"m","params":{{}}}}}}"#));
    assert!(canonical.is_empty() && sorted.is_empty() && general.is_empty());
    assert_eq!(h.host.stats().notifications_dropped, 3);
    // After it, the same canonical notify is forwarded once.
    h.send(
        2,
        &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":"late"}}),
    );
    let out = h.notify(2, &id, "m", "{}");
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0].0, 1);
    assert_eq!(h.host.stats().notifications_forwarded, 1);
}

#[test]
fn an_oversized_result_fails_the_request_at_once() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    let hid = handle_request_id(&h.call(2, json!(1), &id, "m", json!(null)), 1);
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":{hid},"result":"{}"}}"#,
        "x".repeat(1024 * 1024 + 70 * 1024)
    );
    let out = h.send_raw(1, &huge);
    assert_eq!(
        out,
        vec![(
            2,
            json!({"jsonrpc":"2.0","id":1,"error":{"code":-32043,"message":"Service result is too large"}})
        )]
    );
    assert_eq!(h.host.pending_requests(), 0);
    // An oversized message that answers nothing is just dropped.
    let stray = format!(
        r#"{{"jsonrpc":"2.0","id":999,"result":"{}"}}"#,
        "x".repeat(1024 * 1024 + 70 * 1024)
    );
    assert!(h.send_raw(1, &stray).is_empty());
}

#[test]
fn null_and_string_request_ids_are_answered_as_sent() {
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    let hid = handle_request_id(&h.call(2, Value::Null, &id, "m", json!(null)), 1);
    let out = h.respond(1, hid, json!({"result": 5}));
    assert_eq!(
        out,
        vec![(2, json!({"jsonrpc":"2.0","id":null,"result":5}))]
    );
    // A cancel must name the catalog channel.
    let hid = handle_request_id(&h.call(2, json!("s"), &id, "m", json!(null)), 1);
    assert!(h
        .send(
            2,
            &json!({"jsonrpc":"2.0","method":"$/cancelRequest","params":{"id":"s"}})
        )
        .is_empty());
    assert_eq!(h.host.pending_requests(), 1);
    let _ = hid;
}

#[test]
fn chat_actions_after_a_registration_commit_below_the_reserved_mark() {
    // Found by the simulator (seed 0): the registration's reservation moved the stored mark
    // above the next state event's number, and the store refused the event.
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "c1", &[CATALOG]);
    h.register(1, json!({}));
    h.create(1, "s1");
    h.request(1, 3, "subscribe", json!({"channel": "ahp-chat:/s1"}));
    let out = h.dispatch(1, "ahp-chat:/s1", 1, super::turn("t1", "hi"));
    let echo = out
        .iter()
        .find(|(_, v)| v["params"]["action"]["type"] == "chat/turnStarted")
        .expect("accepted");
    assert!(echo.1["params"].get("rejectionReason").is_none());
    let seq = h.host.server_seq();
    let store = h.host.into_store();
    let h = Harness::with(HostConfig::default(), store);
    assert!(
        h.host.server_seq() > seq,
        "a restart resumes at the reservation"
    );
    assert!(h.host.channel_state("ahp-chat:/s1").expect("chat")["activeTurn"].is_object());
}

#[test]
fn deeply_nested_metadata_is_refused_so_catalog_frames_stay_readable() {
    // Found by fuzzing (host_sequence): metadata 120 levels deep registered fine, and every
    // catalog frame carrying it was deeper than JSON parsers accept.
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[CATALOG]);
    let deep: Value = serde_json::from_str(&format!("{}1{}", "{\"a\":".repeat(40), "}".repeat(40)))
        .expect("json");
    let r = h.request(
        1,
        5,
        "client/registerService",
        json!({"channel": CATALOG, "metadata": deep}),
    );
    assert_eq!(r["error"]["code"], -32602);
    let ok: Value = serde_json::from_str(&format!(
        "{}\"[{{\"{}",
        "{\"a\":".repeat(31),
        "}".repeat(31)
    ))
    .expect("json");
    let r = h.request(
        1,
        6,
        "client/registerService",
        json!({"channel": CATALOG, "metadata": ok}),
    );
    assert!(
        r["result"]["serviceId"].is_string(),
        "brackets inside strings do not count: {r}"
    );
}

#[test]
fn request_ids_over_the_limit_are_refused_and_never_kept() {
    // Found by review: a caller could keep 256 requests with 1 MiB ids pending (each id held
    // twice), half a GiB per connection.
    let max = crate::REQUEST_ID_BYTES_MAX;
    let mut h = Harness::new();
    let init = h.init(1, Principal::maintainer("m"), "owner", &[]);
    assert_eq!(
        init["_meta"]["x-client-services"]["limits"]["requestIdBytes"],
        max
    );
    h.init(2, Principal::maintainer("m"), "caller", &[]);
    let id = h.register(1, json!({}));
    // The limit counts the id's JSON text, quotes included.
    let longest = json!("x".repeat(max - 2));
    let out = h.call(2, longest.clone(), &id, "m", json!(null));
    let hid = handle_request_id(&out, 1);
    for too_long in [
        format!("\"{}\"", "x".repeat(max - 1)),
        format!("\"{}\"", "x".repeat(1024 * 1024)),
        "9".repeat(max + 1),
    ] {
        let out = h.send_raw(2, &format!(r#"{{"jsonrpc":"2.0","id":{too_long},"method":"clientService/request","params":{{"channel":"{CATALOG}","serviceId":"{id}","method":"m","params":null}}}}"#));
        assert_eq!(out.len(), 1, "nothing is forwarded: {out:?}");
        assert_eq!(out[0].0, 2);
        assert_eq!(out[0].1["id"], Value::Null, "an id refused is not echoed");
        assert_eq!(out[0].1["error"]["code"], -32600);
    }
    assert_eq!(h.host.pending_requests(), 1);
    // The longest id accepted is answered under that id.
    let out = h.respond(1, hid, json!({"result": 1}));
    assert_eq!(
        out,
        vec![(2, json!({"jsonrpc":"2.0","id":longest,"result":1}))]
    );
}

#[test]
fn the_host_holds_at_most_services_max_services() {
    // Found by review: only the per-connection cap bounded the registry, so one principal with
    // many connections could register 2048 x 64 services of 4 KiB each.
    let max = crate::SERVICES_MAX;
    let mut h = Harness::new();
    let init = h.init(1, Principal::maintainer("m"), "late", &[]);
    assert_eq!(
        init["_meta"]["x-client-services"]["limits"]["servicesPerHost"],
        max
    );
    let per_conn = h.host.limits().services_per_conn_max as usize;
    let mut first = None;
    for i in 0..max {
        let conn = 10 + (i / per_conn) as u64;
        if i % per_conn == 0 {
            h.init(conn, Principal::maintainer("m"), &format!("o{conn}"), &[]);
        }
        let id = h.register(conn, json!({}));
        first.get_or_insert((conn, id));
    }
    assert_eq!(h.host.service_count(), max);
    // Connection 1 is far under its own cap; the host is full.
    let r = h.request(
        1,
        5,
        "client/registerService",
        json!({"channel": CATALOG, "metadata": {}}),
    );
    assert_eq!(r["error"]["code"], -32043, "{r}");
    assert_eq!(h.host.service_count(), max);
    // A removal frees a place.
    let (owner, id) = first.expect("registered");
    let r = h.request(
        owner,
        6,
        "client/unregisterService",
        json!({"channel": CATALOG, "serviceId": id}),
    );
    assert_eq!(r["result"], json!({}));
    h.register(1, json!({}));
    assert_eq!(h.host.service_count(), max);
}

/// Sends `text` from `conn` and returns every frame the host sends in response, as raw text,
/// checking that each one is JSON a `serde_json` reader (most clients) can parse.
fn send_and_read_raw(h: &mut Harness, conn: u64, text: &str) -> Vec<(u64, Value)> {
    h.feed(conn, text);
    let mut out = Vec::new();
    while let Some(o) = h.host.poll_output() {
        if let crate::Output::Send { conn, frame } = o {
            let parsed = serde_json::from_slice::<Value>(frame.as_bytes());
            assert!(
                parsed.is_ok(),
                "a frame its receiver cannot read: {parsed:?}"
            );
            out.push((conn.0, parsed.unwrap_or_default()));
        }
    }
    out
}

#[test]
fn payloads_too_deep_for_their_receivers_are_never_forwarded() {
    let nested = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let max = crate::limits::SERVICE_PAYLOAD_DEPTH_MAX;
    let mut h = Harness::new();
    h.init(1, Principal::maintainer("m"), "owner", &[]);
    h.init(2, Principal::maintainer("m"), "sender", &[]);
    let id = h.register(1, json!({}));
    let notify = |payload: &str, layout_spaced: bool| {
        let space = if layout_spaced { " " } else { "" };
        format!(
            r#"{{"jsonrpc":"2.0","method":"clientService/notify","params":{{"channel":"{CATALOG}","serviceId":"{id}","method":"m","params":{space}{payload}}}}}"#
        )
    };
    // At the bound, on the fast path and on the general one: forwarded.
    for spaced in [false, true] {
        let out = send_and_read_raw(&mut h, 2, &notify(&nested(max), spaced));
        assert_eq!(out.len(), 1, "spaced {spaced}");
    }
    // One level deeper, or far deeper: dropped on every path, nothing sent.
    for depth in [max + 1, 130, 1000] {
        for spaced in [false, true] {
            let out = send_and_read_raw(&mut h, 2, &notify(&nested(depth), spaced));
            assert!(out.is_empty(), "depth {depth}, spaced {spaced}: {out:?}");
        }
    }
    assert_eq!(h.host.stats().notifications_forwarded, 2);
    assert_eq!(h.host.stats().notifications_dropped, 6);

    let request = |rid: u64, payload: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{rid},"method":"clientService/request","params":{{"channel":"{CATALOG}","serviceId":"{id}","method":"m","params":{payload}}}}}"#
        )
    };
    let out = send_and_read_raw(&mut h, 2, &request(1, &nested(max + 1)));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].0, 2);
    assert_eq!(out[0].1["error"]["code"], -32602, "{:?}", out[0].1);
    assert_eq!(h.host.pending_requests(), 0);
    let respond = |hid: u64, body: &str| format!(r#"{{"jsonrpc":"2.0","id":{hid},{body}}}"#);
    // A result one level too deep fails the request; at the bound it is passed on.
    for (depth, fails) in [(max + 1, true), (300, true), (max, false)] {
        let out = send_and_read_raw(&mut h, 2, &request(2, "null"));
        let hid = handle_request_id(&out, 1);
        let out = send_and_read_raw(
            &mut h,
            1,
            &respond(hid, &format!(r#""result":{}"#, nested(depth))),
        );
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, 2);
        assert_eq!(out[0].1.get("error").is_some(), fails, "depth {depth}");
        if fails {
            assert_eq!(out[0].1["error"]["code"], -32043);
        }
    }
    // Error data too deep is left out; the error itself still reaches the caller.
    let out = send_and_read_raw(&mut h, 2, &request(3, "null"));
    let hid = handle_request_id(&out, 1);
    let body = format!(
        r#""error":{{"code":7,"message":"deep","data":{}}}"#,
        nested(max + 1)
    );
    let out = send_and_read_raw(&mut h, 1, &respond(hid, &body));
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].1["error"], json!({"code": 7, "message": "deep"}));
    assert_eq!(h.host.pending_requests(), 0);
}
