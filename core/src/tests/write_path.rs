//! The asynchronous write path, through the public surface: changes held by a slow disk,
//! released in order when durable, rolled back when a group fails.

use super::*;

/// A host whose disk holds every change until told (`complete`, `fail_first`), with `s1`
/// created and its chat subscribed on connection 1 (maintainer `m`, clientId `c1`, also on the
/// root), connection 2 (`m2`) subscribed to the chat too, and connections 3 to 5 ready and
/// subscribed to nothing (`m3`, and `svc` twice).
fn slow_disk() -> Harness {
    let mut h = Harness::new();
    h.open_chat(&["ahp-root://"]);
    h.init(2, Principal::maintainer("m2"), "c2", &["ahp-chat:/s1"]);
    h.init(3, Principal::maintainer("m3"), "c3", &[]);
    h.init(4, Principal::maintainer("svc"), "owner", &[]);
    h.init(5, Principal::maintainer("svc"), "caller", &[]);
    h.hold_commits(true);
    h
}

fn dispatch_request(
    h: &mut Harness,
    conn: u64,
    id: u64,
    seq: u64,
    action: Value,
) -> Vec<(u64, Value)> {
    h.send(
        conn,
        &json!({"jsonrpc":"2.0","id":id,"method":"dispatchAction","params":{"channel":"ahp-chat:/s1","clientSeq":seq,"action":action}}),
    )
}

fn cancel(id: &str) -> Value {
    json!({"type":"chat/turnCancelled","turnId":id,"duration":0})
}

fn seqs(out: &[(u64, Value)], conn: u64) -> Vec<u64> {
    out.iter()
        .filter(|(c, _)| *c == conn)
        .filter_map(|(_, v)| v.pointer("/params/serverSeq").and_then(Value::as_u64))
        .collect()
}

#[test]
fn a_change_is_shown_only_once_durable_and_a_burst_on_one_chat_pipelines() {
    let mut h = slow_disk();
    let before = h.host.server_seq();
    // Two actions on one chat, the second valid only after the first: both are accepted
    // against the newest state while the first is still in flight.
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    assert!(dispatch_request(&mut h, 1, 9, 2, cancel("t1")).is_empty());
    assert_eq!(h.host.changes_in_flight(), 2);
    assert!(
        h.host.server_seq() > before,
        "numbers are handed out at once"
    );
    // Each change has a chat event and a session event; these connections see the chat's.
    assert_eq!(h.host.held_frames(ConnId(2)), 2);
    // The first durable: its chat event leaves to both subscribers; the cancel waits.
    let out = h.complete(1);
    assert_eq!(seqs(&out, 1), [before + 1]);
    assert_eq!(seqs(&out, 2), [before + 1]);
    assert!(out.iter().all(|(_, v)| v.get("id").is_none()), "{out:?}");
    // The second: its event, then the answer to its request.
    let out = h.complete(1);
    assert_eq!(seqs(&out, 1), [before + 3]);
    let answer = out
        .iter()
        .find(|(c, v)| *c == 1 && v["id"] == 9)
        .expect("answer");
    assert_eq!(answer.1["result"], Value::Null);
    assert_eq!(h.host.held_frames(ConnId(1)), 0);
    assert_eq!(h.host.store().commits(), h.host.changes_durable());
}

#[test]
fn reads_wait_for_what_they_show_and_pings_and_services_do_not() {
    let mut h = slow_disk();
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    // A ping depends on nothing durable: answered at once.
    let out = h.send(
        2,
        &json!({"jsonrpc":"2.0","id":5,"method":"ping","params":{"channel":"ahp-root://"}}),
    );
    assert_eq!(out.len(), 1);
    // A snapshot shows the turn in flight: it waits, behind the events held before it.
    let out = h.send(
        2,
        &json!({"jsonrpc":"2.0","id":6,"method":"listSessions","params":{"channel":"ahp-root://"}}),
    );
    assert!(out.is_empty());
    // A client service of connection 4's, called by connection 5: nothing waits.
    let r = h.request(
        4,
        1,
        "client/registerService",
        json!({"channel":"x-client-services://","metadata":{}}),
    );
    let service = r["result"]["serviceId"].clone();
    let out = h.send(5, &json!({"jsonrpc":"2.0","id":7,"method":"clientService/request","params":{"channel":"x-client-services://","serviceId":service,"method":"m","params":{}}}));
    assert_eq!(out.len(), 1, "forwarded at once: {out:?}");
    assert_eq!(out[0].0, 4);
    let out = h.complete(usize::MAX);
    let conn2: Vec<&Value> = out
        .iter()
        .filter(|(c, _)| *c == 2)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(conn2.len(), 2, "the event, then the listing: {conn2:?}");
    assert_eq!(conn2[1]["id"], 6);
}

#[test]
fn a_catalog_event_keeps_its_place_behind_a_held_event() {
    let mut h = slow_disk();
    h.request(2, 3, "subscribe", json!({"channel":"x-client-services://"}));
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    // Connection 2 registers a service and observes the catalog, so it hears of its own.
    let out = h.send(2, &json!({"jsonrpc":"2.0","id":1,"method":"client/registerService","params":{"channel":"x-client-services://","metadata":{}}}));
    // The registration is answered at once; the announcement waits behind the chat event it
    // was queued after, so serverSeq never goes backwards on the connection.
    assert_eq!(out.len(), 1, "{out:?}");
    assert!(out[0].1.get("result").is_some(), "{out:?}");
    let out = h.complete(usize::MAX);
    let got = seqs(&out, 2);
    assert_eq!(got.len(), 2, "{out:?}");
    assert!(got.windows(2).all(|w| w[0] < w[1]), "{got:?}");
}

#[test]
fn a_failed_group_reveals_nothing_and_tells_every_sender() {
    let mut h = slow_disk();
    let chat = h.host.channel_state("ahp-chat:/s1");
    let seq = h.host.server_seq();
    // Connection 1 dispatches as a notification, connection 2 (also subscribed) as a request
    // built on the first.
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    assert!(dispatch_request(&mut h, 2, 8, 1, cancel("t1")).is_empty());
    // The answers wait for a reservation that covers the numbers the failed changes took.
    let mut out = h.fail_first();
    out.extend(h.complete(usize::MAX));
    // Nothing of either change was shown; the notification's sender hears its rejection, the
    // request's sender its error.
    assert!(
        out.iter().all(|(_, v)| v.pointer("/params/action/type")
            != Some(&json!("chat/turnStarted"))
            || v["params"].get("rejectionReason").is_some()),
        "{out:?}"
    );
    let rejection = out
        .iter()
        .find(|(c, v)| *c == 1 && v["params"].get("rejectionReason").is_some())
        .expect("a rejection echo");
    assert!(rejection.1["params"]["serverSeq"].as_u64() >= Some(seq));
    let error = out
        .iter()
        .find(|(c, v)| *c == 2 && v["id"] == 8)
        .expect("an answer");
    assert_eq!(error.1["error"]["code"], -32603);
    // The host is back at the durable state; the failed numbers are skipped, never reused.
    assert_eq!(h.host.channel_state("ahp-chat:/s1"), chat);
    assert!(h.host.server_seq() >= seq + 4);
    // What follows works, numbered above everything handed out.
    h.hold_commits(false);
    let out = h.dispatch(1, "ahp-chat:/s1", 2, turn("t1", "again"));
    let got = seqs(&out, 1);
    assert!(!got.is_empty() && got[0] > seq + 4, "{got:?}");
}

#[test]
fn a_sender_that_does_not_see_its_chat_still_hears_its_rejection() {
    let mut h = slow_disk();
    assert!(h
        .dispatch(3, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    let out = h.complete(1);
    assert!(
        out.iter().all(|(c, _)| *c != 3),
        "accepted: nothing for the sender"
    );
    assert!(h.dispatch(3, "ahp-chat:/s1", 2, cancel("t1")).is_empty());
    let mut out = h.fail_first();
    out.extend(h.complete(usize::MAX));
    let to_sender: Vec<&Value> = out
        .iter()
        .filter(|(c, _)| *c == 3)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(to_sender.len(), 1, "{out:?}");
    assert!(to_sender[0]["params"]["rejectionReason"].is_string());
}

#[test]
fn a_snapshot_of_rolled_back_state_is_answered_with_an_error_then_a_close() {
    let mut h = slow_disk();
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    let out = h.send(
        3,
        &json!({"jsonrpc":"2.0","id":4,"method":"subscribe","params":{"channel":"ahp-chat:/s1"}}),
    );
    assert!(out.is_empty(), "the snapshot shows the turn in flight");
    let mut out = h.fail_first();
    out.extend(h.complete(usize::MAX));
    let to3: Vec<&Value> = out
        .iter()
        .filter(|(c, _)| *c == 3)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(to3.len(), 2, "{out:?}");
    assert_eq!(to3[0]["error"]["code"], -32603);
    assert_eq!(to3[1]["close"], 1011);
    // Connection 1 (the sender, subscribed) is not closed: it saw nothing rolled back.
    assert!(out.iter().all(|(c, v)| *c != 1 || v.get("close").is_none()));
}

#[test]
fn stale_and_duplicate_reports_change_nothing() {
    let mut h = slow_disk();
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    let durable = h.host.changes_durable();
    let now = h.now();
    // A failure of a change never issued, a durability report past everything issued.
    h.host.handle(now, Input::CommitFailed { number: 999 });
    h.host.handle(now, Input::Durable { through: 999 });
    assert!(h.drain().iter().all(|(_, v)| v.get("close").is_none()));
    assert_eq!(
        h.host.changes_in_flight(),
        0,
        "the Durable report retired it"
    );
    // Nothing was committed, but the host believed the (bogus) report: the contract makes
    // the writer the judge of durability. A second failure report of a durable change: stale.
    let now = h.now();
    h.host.handle(
        now,
        Input::CommitFailed {
            number: durable + 1,
        },
    );
    assert_eq!(h.host.stats().commit_failures, 0);
}

#[test]
fn a_retry_of_a_change_in_flight_is_answered_when_it_is_durable() {
    let mut h = slow_disk();
    assert!(dispatch_request(&mut h, 1, 10, 1, turn("t1", "hi")).is_empty());
    // The client retries (same clientSeq, same action) before the answer came: known from the
    // receipt cache, applied once, answered once the original is durable.
    assert!(dispatch_request(&mut h, 1, 11, 1, turn("t1", "hi")).is_empty());
    assert_eq!(h.host.changes_in_flight(), 1);
    let out = h.complete(1);
    let answers: Vec<&Value> = out
        .iter()
        .filter(|(c, v)| *c == 1 && v.get("id").is_some())
        .map(|(_, v)| v)
        .collect();
    assert_eq!(answers.len(), 2, "{answers:?}");
    assert!(answers.iter().all(|a| a["result"].is_null()));
}

#[test]
fn a_crash_keeps_exactly_what_was_durable() {
    let mut h = slow_disk();
    assert!(h
        .dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"))
        .is_empty());
    let out = h.complete(1);
    let shown = *seqs(&out, 1).last().expect("events");
    let durable_chat = h.host.channel_state("ahp-chat:/s1");
    assert!(h.dispatch(1, "ahp-chat:/s1", 2, cancel("t1")).is_empty());
    // The process dies with the cancel in flight: the store has only the turn.
    let store = h.host.into_store();
    let h = Harness::with(HostConfig::default(), store);
    assert_eq!(h.host.channel_state("ahp-chat:/s1"), durable_chat);
    assert!(
        h.host.server_seq() >= shown,
        "never below what a client saw"
    );
}

/// The clientId binding `id` as the store holds its record.
fn stored_binding(h: &Harness, id: &str) -> ClientRecord {
    let text = h
        .host
        .store()
        .record_text(Table::Client, id)
        .expect("stored");
    ClientRecord::parse(text.as_bytes()).expect("a binding")
}

fn last_client_seq(init: &Value) -> &Value {
    &init["_meta"]["org.axp.exchange"]["lastClientSeq"]
}

#[test]
fn a_binding_is_rewritten_only_at_its_first_dispatch_and_its_receipts_carry_the_rest() {
    let mut h = slow_disk();
    let commits = |h: &Harness| h.host.store().commits();
    h.dispatch(1, "ahp-chat:/s1", 1, turn("t1", "hi"));
    h.dispatch(1, "ahp-chat:/s1", 2, cancel("t1"));
    h.dispatch(1, "ahp-chat:/s1", 7, turn("t3", "hi"));
    h.complete(3);
    // The record as the first dispatch wrote it; the later ones wrote only receipts.
    let stored = stored_binding(&h, "c1");
    assert!(stored.dispatched);
    assert_eq!(stored.last_client_seq, 1);
    assert_eq!(
        last_client_seq(&h.init(6, Principal::maintainer("m"), "c1", &[])),
        7
    );
    // A failed dispatch: the binding is rebuilt from the record and the newest durable receipt.
    let before = commits(&h);
    h.dispatch(1, "ahp-chat:/s1", 9, cancel("t3"));
    h.fail_first();
    assert_eq!(commits(&h), before);
    let held = h.held();
    h.complete(held);
    assert_eq!(
        last_client_seq(&h.init(7, Principal::maintainer("m"), "c1", &[])),
        7
    );
    // A restarted counter (1 again) leaves the highest number standing, in memory and after a
    // restart, which reads it back from the receipts.
    h.dispatch(1, "ahp-chat:/s1", 1, cancel("t3"));
    h.complete(1);
    assert_eq!(
        last_client_seq(&h.init(8, Principal::maintainer("m"), "c1", &[])),
        7
    );
    let mut h = Harness::with(HostConfig::default(), h.host.into_store());
    assert_eq!(
        last_client_seq(&h.init(1, Principal::maintainer("m"), "c1", &[])),
        7
    );
    assert_eq!(stored_binding(&h, "c1").last_client_seq, 1);
    // A binding that never dispatched has no receipts to read.
    let r = h.init(2, Principal::maintainer("m2"), "c2", &[]);
    assert_eq!(last_client_seq(&r), 0);
}

#[test]
fn a_failed_first_dispatch_leaves_the_next_one_to_write_the_binding() {
    let mut h = slow_disk();
    // c3's first dispatch writes its record; the second, built while it is in flight, writes
    // none. The group fails: the binding is back to never having dispatched.
    h.dispatch(3, "ahp-chat:/s1", 1, turn("t1", "hi"));
    h.dispatch(3, "ahp-chat:/s1", 2, cancel("t1"));
    h.fail_first();
    let held = h.held();
    h.complete(held);
    assert!(!stored_binding(&h, "c3").dispatched);
    assert!(!h
        .host
        .client_bindings()
        .any(|c| c.client_id == "c3" && c.dispatched));
    // So the next dispatch is a first one again, and writes it.
    h.dispatch(3, "ahp-chat:/s1", 3, turn("t3", "hi"));
    h.complete(1);
    let stored = stored_binding(&h, "c3");
    assert!(stored.dispatched);
    assert_eq!(stored.last_client_seq, 3);
    // And a restart keeps it, dispatched (never released), at 3.
    let mut h = Harness::with(HostConfig::default(), h.host.into_store());
    let r = h.init(1, Principal::maintainer("m3"), "c3", &[]);
    assert_eq!(last_client_seq(&r), 3);
    assert!(h
        .host
        .client_bindings()
        .any(|c| c.client_id == "c3" && c.dispatched));
}
