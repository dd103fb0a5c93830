//! Backpressure: a full write path holds messages that may need a change instead of refusing
//! them, handles them in arrival order once changes are durable, and refuses clearly only past
//! the bounded hold.

use super::*;

/// A host allowing `in_flight` changes in flight and holding `held` messages at most, with
/// maintainers ready on connections 1 to 3 (`m1`..`m3`, clientIds `c1`..`c3`) and session
/// `s1`, whose disk then holds every change until told (`complete`).
fn full_path(in_flight: u32, held: u32) -> Harness {
    let mut h = Harness::limits(Limits {
        in_flight_changes_max: in_flight,
        held_messages_max: held,
        ..Limits::default()
    });
    for conn in 1..=3 {
        h.init(
            conn,
            Principal::maintainer(&format!("m{conn}")),
            &format!("c{conn}"),
            &[],
        );
    }
    h.create(1, "s1");
    h.hold_commits(true);
    h
}

fn create_session(id: u64, session: &str) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"createSession","params":{"channel":format!("ahp-session:/{session}")}})
}

fn list_sessions(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"listSessions","params":{"channel":"ahp-root://"}})
}

fn ping(id: u64) -> Value {
    json!({"jsonrpc":"2.0","id":id,"method":"ping","params":{"channel":"ahp-root://"}})
}

/// The answers to `conn` in `out`, as `(id, ok)`.
fn answers(out: &[(u64, Value)], conn: u64) -> Vec<(Value, bool)> {
    out.iter()
        .filter(|(c, v)| *c == conn && v.get("id").is_some())
        .map(|(_, v)| (v["id"].clone(), v.get("result").is_some()))
        .collect()
}

fn error_codes(out: &[(u64, Value)]) -> Vec<i64> {
    out.iter()
        .filter_map(|(_, v)| v.pointer("/error/code").and_then(Value::as_i64))
        .collect()
}

#[test]
fn held_messages_are_handled_in_arrival_order_once_changes_are_durable() {
    let mut h = full_path(1, 64);
    assert!(h.host.accepting_input());
    // The first create fills the path.
    assert!(h.send(1, &create_session(10, "s2")).is_empty());
    assert_eq!(h.host.changes_in_flight(), 1);
    assert!(!h.host.accepting_input(), "the write path is full");
    // A second create waits, and so does everything connection 1 sends after it, reads too.
    assert!(h.send(1, &create_session(11, "s3")).is_empty());
    assert!(h.send(1, &list_sessions(12)).is_empty());
    assert!(h.send(1, &ping(13)).is_empty());
    // Another connection's read passes; its create waits behind connection 1's.
    let out = h.send(2, &ping(20));
    assert_eq!(answers(&out, 2), [(json!(20), true)]);
    assert!(h.send(2, &create_session(21, "s4")).is_empty());
    assert_eq!(h.host.held_messages().0, 4);
    assert_eq!(h.host.changes_in_flight(), 1, "nothing held was issued");
    // s2 durable: its answer, then s3 is issued (the path is full again) and the listing and
    // the ping behind it are handled; s4 still waits for room.
    let mut out = h.complete(1);
    assert_eq!(h.host.changes_in_flight(), 1);
    assert_eq!(h.host.held_messages().0, 1);
    assert!(!h.host.accepting_input());
    out.extend(h.complete(1));
    out.extend(h.complete(1));
    assert!(h.host.accepting_input());
    assert_eq!(h.host.held_messages(), (0, 0));
    // A ping's answer passes held answers (it shows no state); the rest keep their order.
    let to1: Vec<Value> = answers(&out, 1)
        .into_iter()
        .filter(|(id, _)| *id != json!(13))
        .map(|(id, ok)| {
            assert!(ok, "{out:?}");
            id
        })
        .collect();
    assert_eq!(to1, [json!(10), json!(11), json!(12)], "{out:?}");
    assert!(answers(&out, 1).contains(&(json!(13), true)));
    assert_eq!(answers(&out, 2), [(json!(21), true)]);
    // The listing was decided after s3 and before s4.
    let listing = out
        .iter()
        .find(|(c, v)| *c == 1 && v["id"] == 12)
        .map(|(_, v)| v["result"]["items"].clone())
        .expect("listing");
    let listed: Vec<&str> = listing
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|s| s["resource"].as_str())
        .collect();
    assert_eq!(listed.len(), 3, "s1, s2 and s3, not s4: {listed:?}");
    assert!(!listed.contains(&"ahp-session:/s4"), "{listed:?}");
    assert!(h.host.session_count() == 4);
    assert_eq!(h.host.stats().messages_held, 4);
    assert_eq!(h.host.stats().messages_past_hold, 0);
}

#[test]
fn a_closed_connection_loses_what_it_had_held() {
    let mut h = full_path(1, 64);
    assert!(h.send(1, &create_session(10, "s2")).is_empty());
    assert!(h.send(2, &create_session(11, "s3")).is_empty());
    assert!(h.send(2, &ping(12)).is_empty());
    assert!(h.send(3, &create_session(13, "s4")).is_empty());
    assert_eq!(h.host.held_messages().0, 3);
    assert!(h.close(2).is_empty());
    assert_eq!(h.host.held_messages().0, 1, "connection 3's create is left");
    let mut out = h.complete(1);
    out.extend(h.complete(1));
    assert!(out.iter().all(|(c, _)| *c != 2), "{out:?}");
    assert_eq!(answers(&out, 3), [(json!(13), true)]);
    assert!(h.host.channel_state("ahp-session:/s3").is_none());
    assert!(h.host.channel_state("ahp-session:/s4").is_some());
    assert!(h.host.accepting_input());
}

#[test]
fn a_connection_the_host_closes_loses_what_it_had_held() {
    let mut h = full_path(1, 64);
    assert!(h.send(1, &create_session(10, "s2")).is_empty());
    // Connection 4's handshake (refused once handled: an unsupported version, which closes it)
    // and a create behind it.
    h.connect(4, Principal::maintainer("m4"));
    let bad = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["1.0.0"],"clientId":"x"}});
    assert!(
        h.send(4, &bad).is_empty(),
        "held: a handshake may need a change"
    );
    assert!(h.send(4, &create_session(2, "s5")).is_empty());
    assert_eq!(h.host.held_messages().0, 2);
    let out = h.complete(1);
    assert_eq!(answers(&out, 1), [(json!(10), true)]);
    let to4: Vec<&Value> = out
        .iter()
        .filter(|(c, _)| *c == 4)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(to4.len(), 2, "{out:?}");
    assert_eq!(to4[0]["error"]["code"], -32005);
    assert_eq!(to4[1]["close"], 1008);
    assert_eq!(
        h.host.held_messages(),
        (0, 0),
        "the create went with its connection"
    );
    assert!(h.host.accepting_input());
    assert!(h.complete(usize::MAX).is_empty());
    assert!(h.host.channel_state("ahp-session:/s5").is_none());
}

#[test]
fn past_the_hold_a_message_is_refused_with_a_limit_error_or_its_connection_closed() {
    let mut h = full_path(1, 1);
    assert!(h.send(1, &create_session(10, "s2")).is_empty());
    assert!(h.send(2, &create_session(11, "s3")).is_empty());
    assert_eq!(h.host.held_messages().0, 1);
    // Connection 3 has nothing held: handled now, and refused clearly with -32043 (the
    // refusal, like any, follows the change in flight it was judged against).
    assert!(h.send(3, &create_session(12, "s4")).is_empty());
    // A read of connection 3 needs no room: answered (it waits for the change it shows).
    assert!(h.send(3, &list_sessions(13)).is_empty());
    // Connection 2 has a message held: a refusal now would overtake its answer, so the host
    // closes it.
    let out = h.send(2, &ping(14));
    assert_eq!(out, [(2, json!({"close": 1008}))]);
    assert_eq!(h.host.held_messages().0, 0, "its held create went with it");
    assert_eq!(h.host.stats().messages_past_hold, 2);
    let out = h.complete(usize::MAX);
    assert_eq!(answers(&out, 1), [(json!(10), true)]);
    assert_eq!(answers(&out, 3), [(json!(12), false), (json!(13), true)]);
    let refusal = &out
        .iter()
        .find(|(c, v)| *c == 3 && v["id"] == 12)
        .expect("refusal")
        .1;
    assert_eq!(refusal["error"]["code"], -32043);
    let message = refusal["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("busy"), "{message}");
    assert!(h.host.channel_state("ahp-session:/s3").is_none());
    assert!(h.host.channel_state("ahp-session:/s4").is_none());
    assert!(!error_codes(&out).contains(&-32603));
}

#[test]
fn the_hold_is_bounded_in_bytes_too_but_always_takes_one_message() {
    let mut h = Harness::limits(Limits {
        in_flight_changes_max: 1,
        held_message_bytes_max: 10,
        ..Limits::default()
    });
    for conn in 1..=3 {
        h.init(
            conn,
            Principal::maintainer(&format!("m{conn}")),
            &format!("c{conn}"),
            &[],
        );
    }
    h.hold_commits(true);
    assert!(h.send(1, &create_session(10, "s1")).is_empty());
    assert!(h.send(2, &create_session(11, "s2")).is_empty(), "held");
    let (count, bytes) = h.host.held_messages();
    assert_eq!(count, 1);
    assert!(bytes > 10);
    assert!(h.send(3, &create_session(12, "s3")).is_empty());
    let mut out = h.complete(1);
    out.extend(h.complete(1));
    assert_eq!(answers(&out, 2), [(json!(11), true)]);
    assert_eq!(answers(&out, 3), [(json!(12), false)]);
    assert_eq!(error_codes(&out), [-32043]);
}

#[test]
fn nothing_is_refused_while_the_path_is_full_and_everything_is_answered_once() {
    let mut h = full_path(2, 1024);
    h.hold_commits(false);
    for conn in 1..=3u64 {
        h.create(conn, &format!("own{conn}"));
    }
    h.request(1, 3, "subscribe", json!({"channel":"ahp-chat:/s1"}));
    h.hold_commits(true);
    let mut out = Vec::new();
    let mut expected = Vec::new();
    let mut turns = [0u64; 4];
    for round in 0..20u64 {
        for conn in 1..=3u64 {
            let id = 100 + round * 10 + conn;
            let msg = match (round + conn) % 5 {
                0 => create_session(id, &format!("r{round}c{conn}")),
                1 => {
                    // Each connection starts and cancels turns on its own chat, in turn.
                    let n = &mut turns[conn as usize];
                    *n += 1;
                    let turn_id = format!("t{}", n.div_ceil(2));
                    let action = if *n % 2 == 1 {
                        turn(&turn_id, "hi")
                    } else {
                        json!({"type":"chat/turnCancelled","turnId":turn_id,"duration":0})
                    };
                    json!({"jsonrpc":"2.0","id":id,"method":"dispatchAction","params":{"channel":format!("ahp-chat:/own{conn}"),"clientSeq":id,"action":action}})
                }
                2 => list_sessions(id),
                3 => {
                    json!({"jsonrpc":"2.0","id":id,"method":"client/registerService","params":{"channel":"x-client-services://","metadata":{}}})
                }
                _ => ping(id),
            };
            expected.push((conn, id));
            out.extend(h.send(conn, &msg));
        }
        // A fresh connection whose clientId needs binding.
        let conn = 10 + round;
        h.connect(conn, Principal::maintainer("late"));
        out.extend(h.send(conn, &json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":format!("late{round}")}})));
        expected.push((conn, 1));
        // The disk completes one change now and then: the hold fills and drains.
        if round % 3 == 0 {
            out.extend(h.complete(1));
        }
    }
    assert!(h.host.stats().messages_held > 0, "the path was full");
    while h.held() > 0 || h.host.held_messages().0 > 0 {
        out.extend(h.complete(1));
    }
    assert!(h.host.accepting_input());
    for (conn, id) in expected {
        let n = out
            .iter()
            .filter(|(c, v)| *c == conn && v["id"] == id)
            .count();
        assert_eq!(n, 1, "{conn}/{id} answered {n} times");
    }
    let errors: Vec<&Value> = out
        .iter()
        .filter(|(_, v)| v.get("error").is_some())
        .map(|(_, v)| v)
        .collect();
    assert!(errors.is_empty(), "nothing is refused: {errors:?}");
    assert_eq!(h.host.stats().messages_past_hold, 0);
    assert!(out.iter().all(|(_, v)| v.get("close").is_none()));
}

#[test]
fn a_handshake_held_past_its_timeout_is_not_closed_for_it() {
    let mut h = full_path(1, 64);
    assert!(h.send(1, &create_session(10, "s2")).is_empty());
    h.connect(7, Principal::maintainer("m7"));
    let init = json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":"c7"}});
    assert!(h.send(7, &init).is_empty());
    h.now += Limits::default().handshake_timeout_ms + 1_000;
    let now = h.now();
    h.host.handle_timeout(now);
    assert!(
        h.drain().is_empty(),
        "not closed while its handshake waits for the disk"
    );
    let mut out = h.complete(1);
    out.extend(h.complete(1));
    assert_eq!(answers(&out, 7), [(json!(1), true)]);
    h.now += Limits::default().handshake_timeout_ms;
    let now = h.now();
    h.host.handle_timeout(now);
    assert!(h.drain().is_empty());
}

#[test]
fn a_failed_commit_frees_the_path_for_what_was_held() {
    let mut h = full_path(1, 64);
    assert!(h.send(1, &create_session(10, "s2")).is_empty());
    assert!(h.send(2, &create_session(11, "s3")).is_empty());
    // The writer fails the group holding s2 (and drops the rest of its generation).
    let now = h.now();
    let group = h.held();
    h.drive.fail(&mut h.host, now, group);
    // Right after the failure the host is exactly the durable state: the held create waits
    // for the next call, which the host asks for at once.
    assert_eq!(h.host.held_messages().0, 1);
    assert_eq!(h.host.changes_in_flight(), 0);
    assert!(h.host.channel_state("ahp-session:/s2").is_none());
    assert!(h.host.poll_timeout().is_some_and(|at| at <= now.mono));
    let now = h.now();
    h.host.handle_timeout(now);
    assert_eq!(h.host.held_messages().0, 0, "s3 was issued");
    let out = h.drain();
    assert_eq!(
        error_codes(&out),
        [-32603],
        "the failed change's own answer"
    );
    let out = h.complete(usize::MAX);
    assert_eq!(answers(&out, 2), [(json!(11), true)]);
    assert!(h.host.channel_state("ahp-session:/s3").is_some());
}
