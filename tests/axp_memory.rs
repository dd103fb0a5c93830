//! AXP repository memory against the real `axhost serve` over real WebSocket: `_axp/memoryPropose`,
//! `_axp/memoryReview`, `_axp/memorySearch` and `axp-memory://`, each command's happy path and
//! every error code it answers, who may use the memory channel, what a narrowly scoped
//! contributor can see, and lessons across a crash. Written against the wire protocol of
//! `../shared/reference/axp-host-notes.md` §3, §4.3, §6, §11 and §15.12; codes are matched,
//! never messages.

mod axp_support;
mod common;

use axp_support::*;
use common::*;
use serde_json::{json, Value};

const MEMORY: &str = "axp-memory://";

/// The newest `serverSeq`, as a fresh connection's `initialize` reports it.
fn server_seq(host: &HostProcess) -> u64 {
    let (ws, init) = connect_with(host, ADMIN, &[]);
    ws.close();
    init["serverSeq"].as_u64().expect("serverSeq")
}

/// Sessions `s1` and `s2`, each with a comment by alice: events to draw lessons from.
fn with_sessions(builder: HostBuilder) -> HostProcess {
    let host = builder.start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    create(&mut admin, "s2");
    let mut alice = connect(&host, ALICE);
    for s in ["s1", "s2"] {
        alice.axp("_axp/comment", comment_params(s, "what happened"));
    }
    host
}

fn propose(id: &str, title: &str, from: u64, to: u64) -> Value {
    json!({"channel": exchange(id), "title": title, "trigger": "when the parser changes",
           "lesson": "Keep the public return types stable", "outcome": "failure",
           "fromSeq": from, "toSeq": to})
}

fn review(memory_id: &Value, revision: u64, status: &str) -> Value {
    json!({"channel": MEMORY, "memoryId": memory_id, "revision": revision, "status": status})
}

fn search(channel: &str, query: &str) -> Value {
    json!({"channel": channel, "query": query})
}

fn ids(result: &Value) -> Vec<String> {
    result["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_str().expect("id").to_owned())
        .collect()
}

#[test]
fn the_memory_commands_are_advertised_and_served() {
    let host = cast().start();
    let (mut ws, init) = connect_with(&host, ALICE, &[]);
    let m = &init["_meta"]["org.axp.exchange"];
    assert_eq!(m["memory"], MEMORY);
    for name in [
        "_axp/memoryPropose",
        "_axp/memoryReview",
        "_axp/memorySearch",
    ] {
        assert!(
            m["methods"]
                .as_array()
                .expect("methods")
                .contains(&json!(name)),
            "{name} not advertised: {init}"
        );
        assert_eq!(ws.code_of(name, json!({})), PARAMS, "{name} is served");
    }
}

#[test]
fn a_lesson_is_proposed_reviewed_consolidated_and_recalled() {
    let host = with_sessions(cast());
    let (mut watcher, init) = connect_with(&host, ADMIN, &[MEMORY]);
    assert_eq!(
        init["snapshots"][0]["state"],
        json!({"resource": MEMORY, "entries": {}})
    );
    let mut alice = connect(&host, ALICE);
    let mut bob = connect(&host, BOB);
    let mut admin = connect(&host, ADMIN);
    let to = server_seq(&host);

    let mut params = propose("s1", "  Parser API  ", 1, to);
    params["operationId"] = json!("lesson-1");
    let lesson = alice.axp("_axp/memoryPropose", params.clone());
    assert_eq!(lesson["title"], "Parser API", "stored trimmed");
    assert_eq!(lesson["scope"], "default");
    assert_eq!(
        (&lesson["revision"], &lesson["status"], &lesson["author"]),
        (&json!(1), &json!("proposed"), &json!(ALICE))
    );
    assert_eq!(
        lesson["evidence"],
        json!([{"session": session("s1"), "fromSeq": 1, "toSeq": to, "gitHead": null}])
    );
    assert_eq!(lesson["id"].as_str().map(str::len), Some(64));
    // The subscriber sees it, numbered after everything before it.
    let event = watcher.notification("action");
    assert_eq!(event["params"]["channel"], MEMORY);
    assert_eq!(event["params"]["serverSeq"], to + 1);
    assert_eq!(
        event["params"]["action"],
        json!({"type": "_axp/memoryChanged", "memory": lesson})
    );
    // The same operation again: its stored result. The same evidence in another operation:
    // the lesson as it is, and no event either way.
    assert_eq!(alice.axp("_axp/memoryPropose", params.clone()), lesson);
    assert_eq!(
        bob.axp("_axp/memoryPropose", propose("s1", "Parser API", 1, to)),
        lesson
    );
    watcher.expect_no_frame(300);
    assert_eq!(server_seq(&host), to + 1);

    // Proposed lessons are not recalled; accepted ones are.
    assert_eq!(
        alice.axp("_axp/memorySearch", search(&exchange("s1"), "parser")),
        json!({"items": [], "total": 0})
    );
    let accepted = admin.axp("_axp/memoryReview", review(&lesson["id"], 1, "accepted"));
    assert_eq!(
        (&accepted["revision"], &accepted["status"]),
        (&json!(2), &json!("accepted"))
    );
    assert_eq!(
        watcher.notification("action")["params"]["action"]["memory"],
        accepted
    );
    for channel in [
        ROOT.to_owned(),
        EXECUTORS.to_owned(),
        chat("s2"),
        exchange("s1"),
    ] {
        let found = bob.axp("_axp/memorySearch", search(&channel, "PARSER changes"));
        assert_eq!(
            found,
            json!({"items": [accepted], "total": 1}),
            "via {channel}"
        );
    }

    // New evidence from another session, by another contributor: the revision moves on, the
    // evidence grows, status and author stay.
    let more = bob.axp("_axp/memoryPropose", propose("s2", "Parser API", 1, to));
    assert_eq!(
        (&more["revision"], &more["status"], &more["author"]),
        (&json!(3), &json!("accepted"), &json!(ALICE))
    );
    assert_eq!(more["evidence"][1]["session"], session("s2"));
    assert_eq!(more["id"], lesson["id"], "the same lesson");
    // Retired: no longer recalled, and new evidence does not revive it.
    admin.axp("_axp/memoryReview", review(&lesson["id"], 3, "retired"));
    assert_eq!(
        alice.axp("_axp/memorySearch", search(ROOT, "parser"))["total"],
        0
    );
    alice.axp("_axp/comment", comment_params("s1", "again"));
    let again = alice.axp(
        "_axp/memoryPropose",
        propose("s1", "Parser API", to + 1, server_seq(&host)),
    );
    assert_eq!(
        (&again["revision"], &again["status"]),
        (&json!(5), &json!("retired"))
    );
    let state = state(&host, MEMORY);
    assert_eq!(state["entries"][lesson["id"].as_str().expect("id")], again);
}

#[test]
fn search_ranks_by_distinct_tokens_then_id_with_a_limit() {
    let host = with_sessions(cast());
    let mut alice = connect(&host, ALICE);
    let mut admin = connect(&host, ADMIN);
    let to = server_seq(&host);
    let mut made = Vec::new();
    for title in [
        "cache keys",
        "cache key eviction",
        "flaky uploads",
        "zebra stripes",
    ] {
        let l = alice.axp("_axp/memoryPropose", propose("s1", title, 1, to));
        admin.axp("_axp/memoryReview", review(&l["id"], 1, "accepted"));
        made.push(l["id"].as_str().expect("id").to_owned());
    }
    // "cache" and "evict" (2) for the second; "cache" and "keys" (2) for the first: tied,
    // so by id; the others hold neither. Tokens repeat and change case: counted once.
    let found = alice.axp(
        "_axp/memorySearch",
        json!({"channel": ROOT, "query": "Cache EVICT keys cache", "limit": 20}),
    );
    let mut tied = vec![made[0].clone(), made[1].clone()];
    tied.sort();
    assert_eq!((ids(&found), &found["total"]), (tied, &json!(2)));
    // Substrings count: "strip" is in "stripes" only.
    assert_eq!(
        ids(&alice.axp("_axp/memorySearch", search(ROOT, "strip"))),
        [made[3].clone()]
    );
    // Every lesson holds the shared trigger; the limit cuts the list, never the total.
    let one = alice.axp(
        "_axp/memorySearch",
        json!({"channel": ROOT, "query": "parser", "limit": 1}),
    );
    assert_eq!((ids(&one).len(), &one["total"]), (1, &json!(4)));
    // No tokens: every lesson, by id, five at most by default.
    let mut all = made.clone();
    all.sort();
    assert_eq!(
        ids(&alice.axp("_axp/memorySearch", search(ROOT, "!?"))),
        all
    );
}

#[test]
fn a_narrowly_scoped_contributor_never_sees_lessons_from_outside_its_scope() {
    let host = with_sessions(cast());
    let mut alice = connect(&host, ALICE);
    let mut admin = connect(&host, ADMIN);
    let mut carl = connect(&host, CARL);
    let to = server_seq(&host);
    let own = alice.axp("_axp/memoryPropose", propose("s1", "from s1", 1, to));
    let other = alice.axp("_axp/memoryPropose", propose("s2", "from s2", 1, to));
    for l in [&own, &other] {
        admin.axp("_axp/memoryReview", review(&l["id"], 1, "accepted"));
    }
    let found = carl.axp("_axp/memorySearch", search(&exchange("s1"), "parser"));
    assert_eq!(
        (ids(&found), &found["total"]),
        (vec![own["id"].as_str().expect("id").to_owned()], &json!(1))
    );
    assert!(!found.to_string().contains("ahp-session:/s2"));
    // Evidence from s2 added to the s1 lesson hides it from carl as well.
    alice.axp("_axp/memoryPropose", propose("s2", "from s1", 1, to));
    assert_eq!(
        carl.axp("_axp/memorySearch", search(ROOT, "parser"))["total"],
        0
    );
    assert_eq!(
        alice.axp("_axp/memorySearch", search(ROOT, "parser"))["total"],
        2
    );
    // Nor through the channel: not subscribed, not named in a command, not snapshotted at
    // initialize, missing on reconnect; and no event of it reaches carl's connection.
    assert_eq!(
        carl.code_of("subscribe", json!({"channel": MEMORY})),
        FORBIDDEN
    );
    assert_eq!(
        carl.axp_code("_axp/memorySearch", search(MEMORY, "parser")),
        FORBIDDEN
    );
    let mut raw = host.ws_as(host.token_of(CARL));
    let r = raw.call(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": format!("carl-{}", unique()),
               "initialSubscriptions": [MEMORY]}),
    );
    assert_eq!(code(&r), FORBIDDEN, "{r}");
    let mut again = host.ws_as(host.token_of(CARL));
    let r = again.ok(
        "reconnect",
        json!({"channel": ROOT, "clientId": format!("carl-{}", unique()), "lastSeenServerSeq": 0,
               "subscriptions": [MEMORY, exchange("s1")]}),
    );
    assert_eq!(r["missing"], json!([MEMORY]));
    alice.axp(
        "_axp/memoryPropose",
        propose("s1", "after reconnect", 1, to),
    );
    for frame in again.drain(300) {
        assert_ne!(frame["params"]["channel"], MEMORY, "{frame}");
    }
}

#[test]
fn only_repository_wide_maintainers_subscribe_to_memory() {
    let host = with_sessions(cast());
    let (_ws, init) = connect_with(&host, ADMIN, &[MEMORY]);
    assert_eq!(init["snapshots"][0]["resource"], MEMORY);
    let mut mark = connect(&host, MARK);
    assert!(mark.ok("subscribe", json!({"channel": MEMORY}))["snapshot"].is_object());
    for id in [ALICE, BOB, VERA, OLGA, CARL] {
        let mut ws = connect(&host, id);
        assert_eq!(
            ws.code_of("subscribe", json!({"channel": MEMORY})),
            FORBIDDEN,
            "{id}"
        );
    }
}

#[test]
fn every_propose_error_code() {
    let host =
        with_sessions(cast().config("[limits]\nmemory_lessons_max = 2\nmemory_evidence_max = 2\n"));
    let mut alice = connect(&host, ALICE);
    let mut carl = connect(&host, CARL);
    let to = server_seq(&host);
    // -32602: params, a channel of no session, a range out of order or past serverSeq, no event
    // of this session in the range, blank text.
    let mut bad = propose("s1", "t", 1, to);
    bad["extra"] = json!(true);
    assert_eq!(alice.axp_code("_axp/memoryPropose", bad), PARAMS);
    let mut long = propose("s1", "t", 1, to);
    long["title"] = json!("x".repeat(161));
    assert_eq!(alice.axp_code("_axp/memoryPropose", long), PARAMS);
    let mut missing = propose("s1", "t", 1, to);
    missing.as_object_mut().expect("object").remove("toSeq");
    assert_eq!(alice.axp_code("_axp/memoryPropose", missing), PARAMS);
    for channel in [ROOT, EXECUTORS] {
        let mut p = propose("s1", "t", 1, to);
        p["channel"] = json!(channel);
        assert_eq!(alice.axp_code("_axp/memoryPropose", p), PARAMS, "{channel}");
    }
    assert_eq!(
        alice.axp_code("_axp/memoryPropose", propose("s1", "t", to, to - 1)),
        PARAMS
    );
    assert_eq!(
        alice.axp_code("_axp/memoryPropose", propose("s1", "t", 1, to + 1)),
        PARAMS
    );
    // s2's comment is the last event: nothing of s1 there.
    assert_eq!(
        alice.axp_code("_axp/memoryPropose", propose("s1", "t", to, to)),
        PARAMS
    );
    let mut blank = propose("s1", "t", 1, to);
    blank["trigger"] = json!("  \t ");
    assert_eq!(alice.axp_code("_axp/memoryPropose", blank), PARAMS);
    // -32009: roles, scope, and adding to a lesson whose evidence the caller cannot read.
    for id in [OLGA, VERA] {
        let mut ws = connect(&host, id);
        assert_eq!(
            ws.axp_code("_axp/memoryPropose", propose("s1", "t", 1, to)),
            FORBIDDEN,
            "{id}"
        );
    }
    assert_eq!(
        carl.axp_code("_axp/memoryPropose", propose("s2", "t", 1, to)),
        FORBIDDEN
    );
    alice.axp("_axp/memoryPropose", propose("s2", "shared", 1, to));
    assert_eq!(
        carl.axp_code("_axp/memoryPropose", propose("s1", "shared", 1, to)),
        FORBIDDEN
    );
    // -32008: no such session.
    assert_eq!(
        alice.axp_code("_axp/memoryPropose", propose("nope", "t", 1, to)),
        NOT_FOUND
    );
    // -32011: an operationId reused with other input.
    let mut first = propose("s1", "shared", 1, to);
    first["operationId"] = json!(op());
    alice.axp("_axp/memoryPropose", first.clone());
    first["lesson"] = json!("something else");
    assert_eq!(alice.axp_code("_axp/memoryPropose", first), CONFLICT);
    // -32043: a third lesson; a third evidence entry.
    alice.axp("_axp/memoryPropose", propose("s1", "second", 1, to));
    assert_eq!(
        alice.axp_code("_axp/memoryPropose", propose("s1", "third", 1, to)),
        LIMIT
    );
    assert_eq!(
        alice.axp_code("_axp/memoryPropose", propose("s1", "shared", 0, to)),
        LIMIT
    );
}

#[test]
fn every_review_error_code() {
    let host = with_sessions(cast().principal("mona", "maintainer", Some(&["ahp-session:/s1"])));
    let mut alice = connect(&host, ALICE);
    let mut admin = connect(&host, ADMIN);
    let mut mona = connect(&host, "mona");
    let to = server_seq(&host);
    let lesson = alice.axp("_axp/memoryPropose", propose("s2", "t", 1, to));
    let id = &lesson["id"];
    // -32602: params.
    assert_eq!(
        admin.axp_code("_axp/memoryReview", review(id, 1, "proposed")),
        PARAMS
    );
    assert_eq!(
        admin.axp_code("_axp/memoryReview", review(&json!("ABC"), 1, "accepted")),
        PARAMS
    );
    // -32009: not a maintainer; a scoped maintainer on the memory channel, or on a channel it
    // reads without access to the lesson's evidence.
    for who in [ALICE, VERA, OLGA] {
        let mut ws = connect(&host, who);
        assert_eq!(
            ws.axp_code("_axp/memoryReview", review(id, 1, "accepted")),
            FORBIDDEN,
            "{who}"
        );
    }
    assert_eq!(
        mona.axp_code("_axp/memoryReview", review(id, 1, "accepted")),
        FORBIDDEN
    );
    let mut via_s1 = review(id, 1, "accepted");
    via_s1["channel"] = json!(exchange("s1"));
    assert_eq!(
        mona.axp_code("_axp/memoryReview", via_s1.clone()),
        FORBIDDEN
    );
    // -32008: an unknown channel.
    let mut unknown = via_s1.clone();
    unknown["channel"] = json!(exchange("nope"));
    assert_eq!(admin.axp_code("_axp/memoryReview", unknown), NOT_FOUND);
    // -32011: another revision, an unknown lesson, a reused operationId.
    assert_eq!(
        admin.axp_code("_axp/memoryReview", review(id, 2, "accepted")),
        CONFLICT
    );
    assert_eq!(
        admin.axp_code(
            "_axp/memoryReview",
            review(&json!("0".repeat(64)), 1, "accepted")
        ),
        CONFLICT
    );
    let mut r = review(id, 1, "accepted");
    r["channel"] = json!(ROOT);
    r["operationId"] = json!(op());
    let accepted = admin.axp("_axp/memoryReview", r.clone());
    assert_eq!(
        admin.axp("_axp/memoryReview", r.clone()),
        accepted,
        "a retry is its result"
    );
    r["status"] = json!("retired");
    assert_eq!(admin.axp_code("_axp/memoryReview", r), CONFLICT);
    // The compare-and-set: a second review of revision 1 lost the race.
    assert_eq!(
        admin.axp_code("_axp/memoryReview", review(id, 1, "retired")),
        CONFLICT
    );
    // A scoped maintainer reviews a lesson of its own session.
    let own = alice.axp("_axp/memoryPropose", propose("s1", "own", 1, to));
    let mut r = review(&own["id"], 1, "accepted");
    r["channel"] = json!(exchange("s1"));
    assert_eq!(mona.axp("_axp/memoryReview", r)["status"], "accepted");
}

#[test]
fn every_search_error_code() {
    let host = with_sessions(cast());
    let mut alice = connect(&host, ALICE);
    let mut carl = connect(&host, CARL);
    for bad in [
        json!({"channel": ROOT}),
        json!({"channel": ROOT, "query": "x", "limit": 0}),
        json!({"channel": ROOT, "query": "x", "limit": 21}),
        json!({"channel": ROOT, "query": "x", "limit": "5"}),
        json!({"channel": ROOT, "query": "x".repeat(4097)}),
        json!({"channel": ROOT, "query": "x", "operationId": "x"}),
    ] {
        assert_eq!(alice.code_of("_axp/memorySearch", bad), PARAMS);
    }
    assert_eq!(
        alice.code_of("_axp/memorySearch", search(MEMORY, "x")),
        FORBIDDEN
    );
    assert_eq!(
        carl.code_of("_axp/memorySearch", search(&exchange("s2"), "x")),
        FORBIDDEN
    );
    assert_eq!(
        alice.code_of("_axp/memorySearch", search(&exchange("nope"), "x")),
        NOT_FOUND
    );
    let mut admin = connect(&host, ADMIN);
    assert_eq!(
        admin.ok("_axp/memorySearch", search(MEMORY, "x")),
        json!({"items": [], "total": 0})
    );
}

#[test]
fn lessons_and_their_receipts_survive_a_crash() {
    let mut host = with_sessions(cast());
    let to = server_seq(&host);
    let mut p = propose("s1", "durable lesson", 1, to);
    p["operationId"] = json!("durable-1");
    let lesson = {
        let mut alice = connect(&host, ALICE);
        let mut admin = connect(&host, ADMIN);
        let l = alice.axp("_axp/memoryPropose", p.clone());
        admin.axp("_axp/memoryReview", review(&l["id"], 1, "accepted"))
    };
    host.crash();
    host.restart();
    let mut alice = connect(&host, ALICE);
    let found = alice.axp("_axp/memorySearch", search(ROOT, "durable"));
    assert_eq!(found, json!({"items": [lesson], "total": 1}));
    // The proposal's receipt: the same operation answers its first result; other input
    // under it conflicts.
    let first = alice.axp("_axp/memoryPropose", p.clone());
    assert_eq!(
        (&first["revision"], &first["status"]),
        (&json!(1), &json!("proposed"))
    );
    p["title"] = json!("changed");
    assert_eq!(alice.axp_code("_axp/memoryPropose", p), CONFLICT);
    assert_eq!(
        state(&host, MEMORY)["entries"][lesson["id"].as_str().expect("id")],
        lesson
    );
}
