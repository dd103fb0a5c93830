//! Scripted scenarios of the asynchronous write path: commits that fail in the middle of a
//! pipeline, a crash with commits in flight, and a slow disk under client-service traffic.
//! The same world, checker and durability oracles as the seed runs watch every step; each
//! scenario ends with the liveness phase, which compares every mirror with the host again.

use axhost_sim::writer::CommitProfile;
use axhost_sim::{Options, World};
use serde_json::{json, Value};

const QUIET_MS: u64 = 20_000;
const CHAT: &str = "ahp-chat:/s0";
const SERVICES: &str = "x-client-services://";

/// A scripted world whose disk takes exactly `latency_ms` per transaction and reports at once.
fn world(clients: u32, latency_ms: u64, tweak: impl FnOnce(&mut Options)) -> World {
    let mut options = Options::scripted(31, clients);
    options.commits = CommitProfile {
        latency_ms_min: latency_ms,
        latency_ms_max: latency_ms,
        ..CommitProfile::INSTANT
    };
    tweak(&mut options);
    World::with_options(options)
}

fn ok<T>(w: &World, r: Result<T, axhost_sim::Violation>) -> T {
    match r {
        Ok(t) => t,
        Err(v) => panic!(
            "{v}\n(client stats: {:?})",
            w.clients.iter().map(|c| &c.stats).collect::<Vec<_>>()
        ),
    }
}

fn quiet(w: &mut World) {
    let r = w.run_until_quiet(QUIET_MS);
    ok(w, r);
}

fn advance(w: &mut World, ms: u64) {
    let r = w.advance(ms);
    ok(w, r);
}

/// Steps until `done` holds (at most `steps_max` steps).
fn step_until(w: &mut World, what: &str, done: impl Fn(&World) -> bool) {
    for _ in 0..10_000 {
        if done(w) {
            return;
        }
        let r = w.step();
        if !ok(w, r) {
            break;
        }
    }
    assert!(done(w), "never reached: {what}");
}

fn connect(w: &mut World, i: usize) {
    let r = w.connect(i);
    ok(w, r);
    quiet(w);
    assert!(
        w.clients[i].connection.as_ref().is_some_and(|c| c.ready),
        "client {i} is not initialized"
    );
}

fn create(w: &mut World, i: usize, id: &str) {
    w.with_client(i, |c| {
        c.create_session_with(
            json!({ "channel": format!("ahp-session:/{id}") }),
            Some(id.into()),
        )
    });
    quiet(w);
}

fn subscribe(w: &mut World, i: usize, channel: &str) {
    w.with_client(i, |c| c.subscribe(channel));
    quiet(w);
}

/// Sends a dispatch from client `i` without waiting; returns its clientSeq.
fn send_dispatch(w: &mut World, i: usize, action: Value) -> u64 {
    w.with_client(i, |c| {
        let seq = c.take_client_seq();
        c.dispatch_with(seq, json!(CHAT), action, true);
        seq
    })
}

fn turn_started(turn_id: &str) -> Value {
    json!({
        "type": "chat/turnStarted",
        "turnId": turn_id,
        "startedAt": "2020-01-01T00:00:00.000Z",
        "message": { "text": format!("please do {turn_id}"), "origin": { "kind": "user" } },
    })
}

fn queued(id: &str) -> Value {
    json!({
        "type": "chat/pendingMessageSet",
        "kind": "queued",
        "id": id,
        "message": { "text": format!("and then {id}"), "origin": { "kind": "user" } },
    })
}

fn settle(w: &mut World) {
    let r = w.settle();
    ok(w, r);
}

fn chat(w: &World) -> Value {
    w.host()
        .and_then(|h| h.channel_state(CHAT))
        .unwrap_or(Value::Null)
}

fn queued_ids(w: &World) -> Vec<String> {
    chat(w)["queuedMessages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect()
}

/// Two clients pipeline dispatches into one chat; the group commit holding all but the first
/// fails. The first stays; every later one is answered as a failed commit is (the rejection
/// echo), reaches no other client, leaves the chat as it was after the first, and leaves no
/// receipt: the same dispatch sent again applies. Later dispatches commit normally.
#[test]
fn a_commit_fails_in_the_middle_of_a_pipeline_from_two_clients() {
    let mut w = world(2, 10, |_| {});
    connect(&mut w, 0);
    connect(&mut w, 1);
    create(&mut w, 0, "s0");
    subscribe(&mut w, 0, CHAT);
    subscribe(&mut w, 1, CHAT);
    let base = w.commit_stats().clone();
    send_dispatch(&mut w, 0, turn_started("t1"));
    // The first dispatch reaches the host and goes to the disk alone; the next three arrive
    // while it commits and queue up for the next transaction.
    advance(&mut w, 4);
    let a = send_dispatch(&mut w, 1, queued("a"));
    send_dispatch(&mut w, 0, queued("b"));
    send_dispatch(&mut w, 1, queued("c"));
    step_until(&mut w, "the first transaction is durable", |w| {
        w.commit_stats().transactions == base.transactions + 1
    });
    w.fail_next_commits(1);
    quiet(&mut w);
    let stats = w.commit_stats().clone();
    assert_eq!(stats.failed, base.failed + 1, "{stats:?}");
    assert_eq!(stats.failed_changes, base.failed_changes + 3, "{stats:?}");
    assert_eq!(queued_ids(&w), Vec::<String>::new(), "{}", chat(&w));
    assert_eq!(chat(&w)["activeTurn"]["id"], json!("t1"));
    let rejections = |w: &World, i: usize| w.clients[i].stats.rejections;
    assert_eq!((rejections(&w, 0), rejections(&w, 1)), (1, 2));
    assert_eq!(w.clients[0].stats.accepted, 1);
    // Not a retry of anything stored: applied.
    w.with_client(1, |c| c.dispatch_with(a, json!(CHAT), queued("a"), true));
    quiet(&mut w);
    assert_eq!(queued_ids(&w), vec!["a".to_owned()]);
    assert_eq!(w.clients[1].stats.accepted, 1);
    send_dispatch(&mut w, 0, queued("d"));
    quiet(&mut w);
    assert_eq!(queued_ids(&w), vec!["a".to_owned(), "d".to_owned()]);
    settle(&mut w);
}

/// Three changes in flight when the host crashes: the first is durable in the store (its
/// report still on its way), the other two are being committed. The restarted host has the
/// first and nothing of the others; every client converges on that.
#[test]
fn a_crash_with_three_commits_in_flight_of_which_one_was_durable() {
    let mut w = world(2, 10, |_| {});
    connect(&mut w, 0);
    connect(&mut w, 1);
    create(&mut w, 0, "s0");
    subscribe(&mut w, 0, CHAT);
    subscribe(&mut w, 1, CHAT);
    let base = w.commit_stats().clone();
    w.delay_next_report(50);
    send_dispatch(&mut w, 0, turn_started("t1"));
    advance(&mut w, 4);
    send_dispatch(&mut w, 1, queued("a"));
    send_dispatch(&mut w, 0, queued("b"));
    step_until(&mut w, "the first change is durable", |w| {
        w.commit_stats().transactions == base.transactions + 1
    });
    advance(&mut w, 2);
    assert_eq!(
        w.commits_pending(),
        2,
        "two changes are being committed as the host crashes"
    );
    assert_eq!(
        w.clients[0].stats.accepted, 0,
        "the first change's report has not reached the host"
    );
    let r = w.restart();
    ok(&w, r);
    let stats = w.commit_stats().clone();
    assert_eq!(stats.lost, base.lost + 2, "{stats:?}");
    assert_eq!(stats.crashes_in_flight, base.crashes_in_flight + 1);
    assert_eq!(chat(&w)["activeTurn"]["id"], json!("t1"));
    assert_eq!(queued_ids(&w), Vec::<String>::new());
    settle(&mut w);
    for i in 0..2 {
        let mirror = w.clients[i].replicas.get(CHAT).map(|r| r.json().clone());
        assert_eq!(
            mirror.as_ref().map(|m| &m["activeTurn"]["id"]),
            Some(&json!("t1"))
        );
    }
}

/// While a slow transaction holds a dispatch for two seconds, client-service requests,
/// answers and notifications between two other clients pass at once; the dispatcher hears
/// its echo only once the change is durable.
#[test]
fn a_slow_commit_does_not_hold_client_service_traffic() {
    let mut w = world(3, 2, |o| o.principals = 1);
    for c in &mut w.clients {
        c.manual = true;
    }
    for i in 0..3 {
        connect(&mut w, i);
    }
    create(&mut w, 2, "s0");
    subscribe(&mut w, 2, CHAT);
    let before = w.clients[0].owned_services();
    w.with_client(0, |c| {
        c.register_service_with(json!({ "channel": SERVICES, "metadata": { "protocol": "demo" } }))
    });
    quiet(&mut w);
    let svc = w.clients[0]
        .owned_services()
        .into_iter()
        .find(|s| !before.contains(s))
        .expect("client 0 registered a service");
    w.slow_next_commit(2_000);
    send_dispatch(&mut w, 2, turn_started("t1"));
    advance(&mut w, 10);
    assert!(w.commits_pending() > 0, "the dispatch is on the slow disk");
    w.with_client(1, |c| {
        c.call(json!(1), &svc, "ask", json!({ "n": 1 }), None)
    });
    for _ in 0..5 {
        w.with_client(1, |c| c.notify_service(&svc, "changed"));
    }
    advance(&mut w, 30);
    assert_eq!(w.clients[0].inbox.len(), 1, "the owner heard the request");
    assert_eq!(w.clients[0].stats.notifications_heard, 5);
    let h = w.clients[0].inbox[0].host_id;
    w.with_client(0, |c| c.respond(h, json!({ "result": "yes" })));
    advance(&mut w, 30);
    assert_eq!(w.clients[1].outcomes.len(), 1, "the caller has its answer");
    assert!(w.clients[1].outcomes[0].1.is_ok());
    assert!(
        w.commits_pending() > 0,
        "all of it while the commit was slow"
    );
    assert_eq!(
        w.clients[2].stats.accepted, 0,
        "the echo waits for the disk"
    );
    advance(&mut w, 2_100);
    assert_eq!(w.clients[2].stats.accepted, 1);
    settle(&mut w);
}

/// After a failed commit nothing is in flight, so nothing may be held: an answer made then
/// leaves at once ("with nothing in flight, nothing is held").
#[test]
fn after_a_failed_commit_nothing_is_held() {
    let mut w = world(1, 10, |_| {});
    connect(&mut w, 0);
    w.fail_next_commits(1);
    create(&mut w, 0, "s0");
    assert_eq!(w.commit_stats().failed, 1);
    assert!(w
        .host()
        .is_some_and(|h| h.channel_state("ahp-session:/s0").is_none()));
    // A read that depends on nothing in flight: refused (no such channel), and answered.
    w.with_client(0, |c| c.subscribe(CHAT));
    quiet(&mut w);
    assert_eq!(
        w.clients[0].awaiting(),
        None,
        "the answer to subscribe is held with nothing in flight"
    );
    settle(&mut w);
}
