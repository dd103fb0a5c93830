//! AXP across process lifetimes, against the real `axhost serve` and its SQLite store: the
//! repository binding, SIGKILL during a stream of mutations, restart on the same database
//! (leases orphaned, epochs kept, executors offline, receipts intact) and a second host on the
//! database refused.

mod axp_support;
mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axp_support::*;
use common::*;
use serde_json::{json, Value};

fn config_text(repository: &str) -> String {
    format!("repository = \"{repository}\"\n")
}

/// Rewrites `repository = ...` in the host's `axhost.toml` (kept by `token add`).
fn set_repository(host: &HostProcess, repository: &str) {
    let path = host.data_dir.join("axhost.toml");
    let text = std::fs::read_to_string(&path).expect("read axhost.toml");
    let mut found = false;
    let lines: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim_start().starts_with("repository") {
                found = true;
                format!("repository = \"{repository}\"")
            } else {
                l.to_owned()
            }
        })
        .collect();
    assert!(found, "token add dropped the repository key:\n{text}");
    std::fs::write(&path, lines.join("\n") + "\n").expect("write axhost.toml");
}

fn meta(init: &Value) -> &Value {
    &init["_meta"]["org.axp.exchange"]
}

#[test]
fn the_repository_is_bound_to_the_database_and_another_name_is_refused() {
    let mut host = HostProcess::builder()
        .config(&config_text("alpha"))
        .principal(ALICE, "contributor", None)
        .start();
    {
        let (mut admin, init) = connect_with(&host, ADMIN, &[]);
        assert_eq!(meta(&init)["repository"], "alpha", "{init}");
        create(&mut admin, "s1");
        assert_eq!(state(&host, &exchange("s1"))["repository"], "alpha");
    }
    let status = host.stop();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");

    // Another name on the same data directory: a clear refusal naming both, non-zero exit.
    set_repository(&host, "beta");
    let out = host.second_serve();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a host for beta started: {stderr}");
    assert!(
        stderr.contains("\"alpha\"") && stderr.contains("\"beta\""),
        "the refusal must name both repositories: {stderr}"
    );
    assert!(stderr.contains("axhost: "), "{stderr}");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("ws://"),
        "a refused host must never listen"
    );

    // An unacceptable name is refused by the config check, also before listening.
    set_repository(&host, "no spaces");
    let out = host.second_serve();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains("repository"), "{stderr}");

    // Back to the bound name: it starts and serves the same history.
    set_repository(&host, "alpha");
    host.restart();
    let (_admin, init) = connect_with(&host, ADMIN, &[]);
    assert_eq!(meta(&init)["repository"], "alpha", "{init}");
    let exported = export(&host, "s1");
    assert_eq!(exported["repository"], "alpha", "{exported}");
    assert_eq!(state(&host, &exchange("s1"))["repository"], "alpha");
}

#[test]
fn without_a_repository_key_the_host_serves_default_and_binds_it() {
    let mut host = HostProcess::start();
    let (_ws, init) = host.ws_init("c1", &[]);
    assert_eq!(meta(&init)["repository"], "default", "{init}");
    host.stop();
    // Top-level keys go before the first table.
    let path = host.data_dir.join("axhost.toml");
    let text = std::fs::read_to_string(&path).unwrap_or_default();
    std::fs::write(&path, format!("repository = \"other\"\n{text}")).expect("prepend");
    let out = host.second_serve();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("\"default\"") && stderr.contains("\"other\""),
        "{stderr}"
    );
}

/// What the stream client saw answered: operationId → (method, params, result).
type Acked = BTreeMap<String, (String, Value, Value)>;

/// Sessions the stream spreads over (each holds at most 256 comments and 64 grants).
const STREAM_SESSIONS: u64 = 8;
/// Mutations the stream sends at most: 240 comments and 60 grants a session.
const STREAM_MAX: u64 = STREAM_SESSIONS * 300;

/// The stream's `next`-th mutation: every fifth a grant, the others comments, round-robin
/// over the sessions, each with its own operationId.
fn stream_mutation(next: u64) -> (String, &'static str, Value) {
    let operation = format!("stream-{next}");
    let channel = exchange(&format!("s{}", next % STREAM_SESSIONS));
    if next.is_multiple_of(5) {
        let params = json!({"channel": channel, "operationId": operation,
            "grantId": format!("g{next}"), "limit": allowance(next, next * 10, 1),
            "enforcement": "accounting"});
        (operation, "_axp/grant", params)
    } else {
        let params = json!({"channel": channel, "operationId": operation,
            "body": format!("comment {next}"), "checkpoint": null, "path": null});
        (operation, "_axp/comment", params)
    }
}

/// Sends [`stream_mutation`]s with up to `window` in flight until the host goes away,
/// counting answers in `count`. Returns every request sent and what was answered.
fn stream_until_gone(
    mut ws: Ws,
    window: usize,
    count: Arc<AtomicUsize>,
) -> (Vec<(String, String, Value)>, Acked) {
    let mut sent: Vec<(String, String, Value)> = Vec::new();
    let mut by_id: BTreeMap<u64, usize> = BTreeMap::new();
    let mut acked = Acked::new();
    let mut next = 0u64;
    loop {
        while by_id.len() < window && next < STREAM_MAX {
            next += 1;
            let (operation, method, params) = stream_mutation(next);
            let text = json!({"jsonrpc": "2.0", "id": next, "method": method, "params": params});
            if !ws.try_send_text(&text.to_string()) {
                return (sent, acked);
            }
            by_id.insert(next, sent.len());
            sent.push((operation, method.to_owned(), params));
        }
        match ws.next(Duration::from_secs(10)) {
            Incoming::Json(v) => {
                let Some(id) = v["id"].as_u64() else { continue };
                let Some(i) = by_id.remove(&id) else { continue };
                let (operation, method, params) = sent[i].clone();
                assert!(v.get("error").is_none(), "{method} {params} failed: {v}");
                acked.insert(operation, (method, params, v["result"].clone()));
                count.fetch_add(1, Ordering::Relaxed);
            }
            Incoming::Closed(_) => return (sent, acked),
            Incoming::Timeout => panic!("the host stopped answering without closing"),
        }
    }
}

/// Comments (by id) and grants (by id) of every stream session, and their event logs'
/// comment ids and grant ids.
#[derive(Default)]
struct Streamed {
    comments: BTreeMap<String, Value>,
    comment_count: usize,
    grants: BTreeMap<String, Value>,
    comment_events: Vec<String>,
    grant_events: BTreeSet<String>,
    server_seq: u64,
}

fn streamed(host: &HostProcess) -> Streamed {
    let mut out = Streamed::default();
    for n in 0..STREAM_SESSIONS {
        let exported = export(host, &format!("s{n}"));
        out.server_seq = exported["serverSeq"].as_u64().expect("serverSeq");
        let ex = &exported["snapshots"][0]["state"];
        assert_eq!(
            exported["snapshots"][0]["resource"],
            exchange(&format!("s{n}"))
        );
        for c in ex["discussion"].as_array().into_iter().flatten() {
            out.comment_count += 1;
            let id = c["id"].as_str().expect("comment id").to_owned();
            out.comments.insert(id, c.clone());
        }
        for (id, g) in ex["grants"].as_object().into_iter().flatten() {
            out.grants.insert(id.clone(), g.clone());
        }
        for e in exported["actions"].as_array().expect("actions") {
            match e["action"]["type"].as_str() {
                Some("_axp/commentAdded") => out.comment_events.push(
                    e["action"]["comment"]["id"]
                        .as_str()
                        .expect("id")
                        .to_owned(),
                ),
                Some("_axp/grantChanged") => {
                    out.grant_events
                        .insert(e["action"]["grant"]["id"].as_str().expect("id").to_owned());
                }
                _ => {}
            }
        }
    }
    out
}

#[test]
fn sigkill_during_a_stream_of_mutations_keeps_every_acknowledged_one_and_no_half() {
    let mut host = cast().start();
    {
        let mut admin = connect(&host, ADMIN);
        for n in 0..STREAM_SESSIONS {
            create(&mut admin, &format!("s{n}"));
        }
    }
    let alice = connect(&host, ALICE);
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    let worker = std::thread::spawn(move || stream_until_gone(alice, 16, seen));
    // Let some mutations through, then kill the host mid-stream.
    let deadline = Instant::now() + Duration::from_secs(30);
    while count.load(Ordering::Relaxed) < 150 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    host.crash();
    let (sent, acked) = worker.join().expect("stream worker");
    assert!(acked.len() >= 150, "only {} acknowledged", acked.len());
    assert!(
        sent.len() > acked.len(),
        "nothing was in flight at the kill"
    );
    host.restart();

    let after = streamed(&host);
    assert_eq!(
        after.comments.len(),
        after.comment_count,
        "a comment appears twice"
    );
    // Every acknowledged mutation is there, exactly as answered.
    for (operation, (method, params, result)) in &acked {
        if method == "_axp/comment" {
            assert_eq!(
                after.comments.get(operation),
                Some(result),
                "comment {operation}"
            );
        } else {
            let id = params["grantId"].as_str().expect("grantId");
            assert_eq!(after.grants.get(id), Some(result), "grant {operation}");
        }
    }
    // Nothing half-applied: state and event log agree on each mutation, and only mutations
    // that were sent appear.
    let mut events = after.comment_events.clone();
    events.sort();
    let in_state: Vec<String> = after.comments.keys().cloned().collect();
    assert_eq!(events, in_state, "comment events and discussions disagree");
    let granted: BTreeSet<String> = after.grants.keys().cloned().collect();
    assert_eq!(
        after.grant_events, granted,
        "grant events and grants disagree"
    );
    let sent_ops: BTreeSet<&str> = sent.iter().map(|(o, _, _)| o.as_str()).collect();
    for id in &in_state {
        assert!(
            sent_ops.contains(id.as_str()),
            "comment {id} was never sent"
        );
    }

    // An acknowledged mutation retried with its operationId: the same result, no new event.
    let (mut watcher, _) = connect_with(&host, OLGA, &[&exchange("s0"), &exchange("s1")]);
    let mut alice = connect(&host, ALICE);
    for (method, params, result) in acked.values().rev().take(10) {
        assert_eq!(
            &alice.ok(method, params.clone()),
            result,
            "{method} {params}"
        );
    }
    watcher.expect_no_frame(300);
    assert_eq!(
        streamed(&host).server_seq,
        after.server_seq,
        "a retry made events"
    );

    // What was sent but not acknowledged took effect at most once: retried now with the same
    // operationIds, every sent mutation is there exactly once.
    for (operation, method, params) in &sent {
        if !acked.contains_key(operation) {
            alice.ok(method, params.clone());
        }
    }
    let last = streamed(&host);
    assert_eq!(
        last.comments.len(),
        last.comment_count,
        "a retry posted twice"
    );
    assert_eq!(last.comment_events.len(), last.comment_count);
    let wanted: BTreeSet<String> = sent
        .iter()
        .filter(|(_, m, _)| m == "_axp/comment")
        .map(|(o, _, _)| o.clone())
        .collect();
    let have: BTreeSet<String> = last.comments.keys().cloned().collect();
    assert_eq!(have, wanted);
    let wanted_grants = sent.iter().filter(|(_, m, _)| m == "_axp/grant").count();
    assert_eq!(last.grants.len(), wanted_grants);
}

/// A lease with a reserved turn on session `s1`: alice registered `e` (30 s TTL), holds
/// grant `g` and epoch 1, and reserved 1234 tokens for turn `t1`.
fn leased_with_reservation(host: &HostProcess) -> Value {
    let mut admin = connect(host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(host, ALICE);
    register(&mut alice, "e", 30_000);
    let epoch = dock(&mut alice, "s1");
    assert_eq!(epoch, 1);
    start_turn(&mut admin, "s1", "t1");
    let reservation = json!({"channel": exchange("s1"), "epoch": 1, "turnId": "t1",
        "ceiling": allowance(1234, 4321, 1), "operationId": "reserve-durable"});
    assert_eq!(alice.ok("_axp/reserve", reservation.clone()), Value::Null);
    reservation
}

/// What every restart must show for [`leased_with_reservation`]: the lease orphaned with its
/// epoch kept, the reservation settled at its full ceiling, the turn ended, the executor
/// offline.
fn assert_orphaned_after_restart(host: &HostProcess) {
    let ex = state(host, &exchange("s1"));
    assert_eq!(ex["lease"], Value::Null, "{ex}");
    assert_eq!(ex["status"], "orphaned", "{ex}");
    assert_eq!(ex["epoch"], 1, "the epoch survives a restart: {ex}");
    assert_eq!(ex["reservation"], Value::Null, "{ex}");
    assert_eq!(ex["grants"]["g"]["spent"], allowance(1234, 4321, 1), "{ex}");
    let usage = ex["usage"].as_array().expect("usage");
    assert_eq!(usage.len(), 1, "{ex}");
    assert_eq!(usage[0]["turnId"], "t1");
    assert_eq!(usage[0]["usage"]["source"], "reservation", "{ex}");
    assert_eq!(usage[0]["usage"]["inputTokens"], 1234, "{ex}");
    let chat = state(host, &chat("s1"));
    assert!(chat.get("activeTurn").is_none_or(Value::is_null), "{chat}");
    assert_eq!(chat["turns"].as_array().map(Vec::len), Some(1), "{chat}");
    let registry = state(host, EXECUTORS);
    assert_eq!(registry["entries"]["e"]["online"], false, "{registry}");
    // The start-up orphaning is in the history too: the export's seed and actions rebuild it.
    let x = export(host, "s1");
    let mut rebuilt = x["seeds"][0]["state"].clone();
    for e in x["actions"].as_array().expect("actions") {
        if e["channel"] == exchange("s1") {
            reduce_exchange(&mut rebuilt, &e["action"]);
        }
    }
    assert_eq!(rebuilt, ex, "seed + actions != state after a restart");
}

#[test]
fn restart_on_the_same_database_orphans_leases_keeps_epochs_and_allows_resume() {
    let mut host = cast().start();
    let reservation = leased_with_reservation(&host);
    host.restart();
    assert_orphaned_after_restart(&host);

    let mut alice = connect(&host, ALICE);
    // The old epoch fences nothing any more.
    assert_eq!(alice.axp_code("_axp/renew", fenced("s1", 1)), STALE);
    // The reserve's receipt survived: the same input returns its result and reserves nothing;
    // other input under its operationId is a conflict.
    assert_eq!(alice.ok("_axp/reserve", reservation.clone()), Value::Null);
    assert_eq!(state(&host, &exchange("s1"))["reservation"], Value::Null);
    let mut changed = reservation.clone();
    changed["ceiling"]["tokens"] = json!(1);
    assert_eq!(alice.code_of("_axp/reserve", changed), CONFLICT);

    // A wrong resume epoch is stale; the kept one resumes into the next epoch.
    let mut resume = claim_params("s1", "e", "g", 30_000);
    resume["resumeEpoch"] = json!(0);
    assert_eq!(alice.axp_code("_axp/claim", resume.clone()), STALE);
    resume["resumeEpoch"] = json!(1);
    let lease = alice.axp("_axp/claim", resume);
    assert_eq!(lease["epoch"], 2, "{lease}");
    assert_eq!(lease["owner"], ALICE);
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["epoch"], 2);
    assert_eq!(ex["status"], "open");
    assert_eq!(alice.axp("_axp/renew", fenced("s1", 2))["epoch"], 2);
}

#[test]
fn sigkill_with_a_lease_held_orphans_it_on_the_next_start() {
    let mut host = cast().start();
    leased_with_reservation(&host);
    host.crash();
    host.restart();
    assert_orphaned_after_restart(&host);
    // Another restart changes nothing more: the settlement happened once.
    host.restart();
    assert_orphaned_after_restart(&host);
}

#[test]
fn a_second_host_on_the_database_is_refused_and_touches_no_lease() {
    let host = cast().start();
    leased_with_reservation(&host);
    let before = export(&host, "s1");
    let out = host.second_serve();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("another axhost process owns"), "{stderr}");
    // The refused host never ran its start-up (which orphans every lease): the first host's
    // state is untouched and its lease still fences.
    assert_eq!(export(&host, "s1"), before);
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["status"], "open");
    assert_eq!(ex["lease"]["epoch"], 1);
    let mut alice = connect(&host, ALICE);
    assert_eq!(alice.axp("_axp/renew", fenced("s1", 1))["epoch"], 1);
}
