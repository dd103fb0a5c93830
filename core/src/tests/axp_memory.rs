//! Repository memory through the public surface: `_axp/memoryPropose`, `_axp/memoryReview` and
//! `_axp/memorySearch`, every error code each answers, who may use `axp-memory://`, durable
//! before revealed, rollback on a failed commit, restarts, and the bounds.

use super::schema::check;
use super::*;

const M: u64 = 1;
const ALICE: u64 = 2;
const OBS: u64 = 3;
const VER: u64 = 4;
const BOB: u64 = 5;
/// A contributor scoped to `s1`.
const CARL: u64 = 6;
/// A maintainer scoped to `s1`.
const MONA: u64 = 7;
const X1: &str = "axp-session:/s1";
const X2: &str = "axp-session:/s2";
const MEMORY: &str = "axp-memory://";

fn principal(id: &str, role: Role, only: Option<&str>) -> Principal {
    Principal {
        id: id.into(),
        role,
        sessions: match only {
            None => SessionScope::All,
            Some(s) => SessionScope::Only([s.to_owned()].into()),
        },
    }
}

/// The cast above, sessions `s1` and `s2`, and a comment on each (events to draw lessons
/// from).
struct Mx {
    h: Harness,
    id: u64,
    op: u64,
}

impl Mx {
    fn new() -> Mx {
        Mx::with(HostConfig::default(), MemStore::new(), true)
    }

    fn limits(limits: Limits) -> Mx {
        Mx::with(
            HostConfig {
                limits,
                ..HostConfig::default()
            },
            MemStore::new(),
            true,
        )
    }

    fn with(config: HostConfig, store: MemStore, fresh: bool) -> Mx {
        let mut h = Harness::with(config, store);
        h.init(M, Principal::maintainer("m"), "c1", &[]);
        h.init(
            ALICE,
            principal("alice", Role::Contributor, None),
            "c2",
            &[],
        );
        h.init(OBS, principal("obs", Role::Observer, None), "c3", &[]);
        h.init(VER, principal("ver", Role::Verifier, None), "c4", &[]);
        h.init(BOB, principal("bob", Role::Contributor, None), "c5", &[]);
        h.init(
            CARL,
            principal("carl", Role::Contributor, Some("s1")),
            "c6",
            &[],
        );
        h.init(
            MONA,
            principal("mona", Role::Maintainer, Some("s1")),
            "c7",
            &[],
        );
        let op = h.host.store().commits() * 1000;
        let mut mx = Mx { h, id: 100, op };
        if fresh {
            mx.h.create(M, "s1");
            mx.h.create(M, "s2");
            mx.comment(X1);
            mx.comment(X2);
        }
        mx
    }

    fn raw(&mut self, conn: u64, method: &str, mut params: Value) -> Value {
        if method != "_axp/memorySearch" && method != "subscribe" {
            if let Some(p) = params.as_object_mut() {
                if !p.contains_key("operationId") {
                    self.op += 1;
                    p.insert("operationId".into(), json!(format!("op-{}", self.op)));
                }
            }
        }
        self.id += 1;
        let id = self.id;
        self.h.request(conn, id, method, params)
    }

    fn ok(&mut self, conn: u64, method: &str, params: Value) -> Value {
        let r = self.raw(conn, method, params);
        assert!(r.get("error").is_none(), "{method} failed: {r}");
        r["result"].clone()
    }

    fn code(&mut self, conn: u64, method: &str, params: Value) -> i64 {
        let r = self.raw(conn, method, params);
        r["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{method} succeeded: {r}"))
    }

    fn comment(&mut self, channel: &str) {
        self.ok(
            ALICE,
            "_axp/comment",
            json!({"channel": channel, "body": "notes", "checkpoint": null, "path": null}),
        );
    }

    fn seq(&self) -> u64 {
        self.h.host.server_seq()
    }

    fn memory(&self) -> Value {
        self.h.host.axp_inspect().memory
    }

    fn search(&mut self, conn: u64, channel: &str, query: &str) -> Value {
        self.ok(
            conn,
            "_axp/memorySearch",
            json!({"channel": channel, "query": query}),
        )
    }
}

/// `_axp/memoryPropose` params over the whole history so far.
fn propose(channel: &str, title: &str, to: u64) -> Value {
    json!({"channel": channel, "title": title, "trigger": "parser edits",
           "lesson": "Preserve the public return types", "outcome": "failure",
           "fromSeq": 1, "toSeq": to})
}

fn review(id: &Value, revision: u64, status: &str) -> Value {
    json!({"channel": MEMORY, "memoryId": id, "revision": revision, "status": status})
}

#[test]
fn the_memory_commands_are_advertised() {
    let mut h = Harness::new();
    let init = h.init(1, Principal::maintainer("m"), "c", &[]);
    let methods = &init["_meta"]["org.axp.exchange"]["methods"];
    for m in [
        "_axp/memoryPropose",
        "_axp/memoryReview",
        "_axp/memorySearch",
    ] {
        assert!(methods.as_array().expect("methods").contains(&json!(m)));
    }
    assert_eq!(init["_meta"]["org.axp.exchange"]["memory"], MEMORY);
}

#[test]
fn a_lesson_is_proposed_reviewed_consolidated_and_recalled() {
    let mut mx = Mx::new();
    let sub = mx.ok(M, "subscribe", json!({"channel": MEMORY}));
    check("axp/memory.state", &sub["snapshot"]["state"]);
    assert_eq!(sub["snapshot"]["state"]["entries"], json!({}));
    let to = mx.seq();
    let params = propose(X1, "  Parser API ", to);
    check("axp/memory-propose.params", &with_op(&params));
    let out = mx.h.send(
        ALICE,
        &json!({"jsonrpc":"2.0","id":9,"method":"_axp/memoryPropose",
                "params": with_op(&params)}),
    );
    let lesson = out
        .iter()
        .find(|(c, v)| *c == ALICE && v["id"] == 9)
        .map(|(_, v)| v["result"].clone())
        .expect("answer");
    check("axp/memory-propose.result", &lesson);
    assert_eq!(lesson["title"], "Parser API", "trimmed");
    assert_eq!(lesson["scope"], "default");
    assert_eq!(lesson["revision"], 1);
    assert_eq!(lesson["status"], "proposed");
    assert_eq!(lesson["author"], "alice");
    assert_eq!(
        lesson["evidence"],
        json!([{"session": "ahp-session:/s1", "fromSeq": 1, "toSeq": to, "gitHead": null}])
    );
    // The id is the reference's: the hash of the trimmed content.
    let id = crate::canonical::hash_object(&json!({"scope": "default", "title": "Parser API",
        "trigger": "parser edits", "lesson": "Preserve the public return types",
        "outcome": "failure"}));
    assert_eq!(lesson["id"], id);
    let event = out
        .iter()
        .find(|(c, v)| *c == M && v["method"] == "action")
        .map(|(_, v)| v["params"].clone())
        .expect("the maintainer's subscription sees it");
    assert_eq!(event["channel"], MEMORY);
    assert_eq!(event["serverSeq"], to + 1);
    check("axp/memory-changed.action", &event["action"]);
    assert_eq!(event["action"]["memory"], lesson);

    // The same evidence again (another operation): the lesson as it is, and no event.
    let seq = mx.seq();
    assert_eq!(mx.ok(BOB, "_axp/memoryPropose", params.clone()), lesson);
    assert_eq!(mx.seq(), seq);
    // Proposed lessons are not recalled.
    let found = mx.search(ALICE, X1, "parser");
    check("axp/memory-search.result", &found);
    assert_eq!(found, json!({"items": [], "total": 0}));

    let r = review(&lesson["id"], 1, "accepted");
    check("axp/memory-review.params", &with_op(&r));
    let accepted = mx.ok(M, "_axp/memoryReview", r);
    check("axp/memory-review.result", &accepted);
    assert_eq!(
        (accepted["revision"].clone(), accepted["status"].clone()),
        (json!(2), json!("accepted"))
    );
    let search = json!({"channel": "ahp-root://", "query": "PARSER stable"});
    check("axp/memory-search.params", &search);
    let found = mx.ok(ALICE, "_axp/memorySearch", search);
    check("axp/memory-search.result", &found);
    assert_eq!(found["total"], 1);
    assert_eq!(found["items"][0], accepted);

    // New evidence from another session and another contributor: one more revision, the
    // evidence appended, status and author kept.
    mx.comment(X2);
    let more = mx.ok(
        BOB,
        "_axp/memoryPropose",
        propose(X2, "Parser API", mx.seq()),
    );
    assert_eq!(more["revision"], 3);
    assert_eq!(more["status"], "accepted");
    assert_eq!(more["author"], "alice");
    assert_eq!(more["evidence"].as_array().map(Vec::len), Some(2));
    assert_eq!(more["evidence"][1]["session"], "ahp-session:/s2");
    let state = mx.memory();
    check("axp/memory.state", &state);
    assert_eq!(state["entries"][id.as_str()], more);
    // A retired lesson is not recalled, and new evidence does not revive it.
    mx.ok(M, "_axp/memoryReview", review(&lesson["id"], 3, "retired"));
    assert_eq!(mx.search(ALICE, X1, "parser")["total"], 0);
    mx.comment(X1);
    let again = mx.ok(
        ALICE,
        "_axp/memoryPropose",
        propose(X1, "Parser API", mx.seq()),
    );
    assert_eq!(
        (again["revision"].clone(), again["status"].clone()),
        (json!(5), json!("retired"))
    );
}

fn with_op(params: &Value) -> Value {
    let mut p = params.clone();
    p["operationId"] = json!("op-x");
    p
}

#[test]
fn search_ranks_by_tokens_found_then_by_id_and_honours_the_limit() {
    let mut mx = Mx::new();
    let to = mx.seq();
    let mut ids = Vec::new();
    for title in ["cache keys", "cache key eviction", "flaky uploads", "zebra"] {
        let l = mx.ok(ALICE, "_axp/memoryPropose", propose(X1, title, to));
        mx.ok(M, "_axp/memoryReview", review(&l["id"], 1, "accepted"));
        ids.push(l["id"].as_str().expect("id").to_owned());
    }
    // "evict" only in the second; "cache" in the first two; "keys" in the first; "parser" in
    // every one (the shared trigger).
    let r = mx.ok(
        ALICE,
        "_axp/memorySearch",
        json!({"channel": X1, "query": "cache evict keys", "limit": 20}),
    );
    let got: Vec<&str> = r["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["id"].as_str())
        .collect();
    // cache+evict (2) for the second; cache+keys (2) for the first: a tie, by id.
    let mut two = vec![ids[0].as_str(), ids[1].as_str()];
    two.sort();
    assert_eq!(got, two);
    assert_eq!(r["total"], 2);
    let all = mx.search(ALICE, X1, "parser");
    assert_eq!(all["total"], 4);
    assert_eq!(all["items"].as_array().map(Vec::len), Some(4));
    let one = mx.ok(
        ALICE,
        "_axp/memorySearch",
        json!({"channel": "axp-executors://", "query": "parser", "limit": 1}),
    );
    assert_eq!(
        (one["items"].as_array().map(Vec::len), one["total"].clone()),
        (Some(1), json!(4))
    );
    // No tokens: every lesson, by id, five by default.
    let none = mx.search(OBS, X2, "?? !!");
    let mut sorted = ids.clone();
    sorted.sort();
    let got: Vec<&str> = none["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["id"].as_str())
        .collect();
    assert_eq!(got, sorted);
}

#[test]
fn a_narrowly_scoped_caller_never_sees_lessons_of_sessions_outside_its_scope() {
    let mut mx = Mx::new();
    let to = mx.seq();
    let mine = mx.ok(ALICE, "_axp/memoryPropose", propose(X1, "from s1", to));
    let theirs = mx.ok(ALICE, "_axp/memoryPropose", propose(X2, "from s2", to));
    for l in [&mine, &theirs] {
        mx.ok(M, "_axp/memoryReview", review(&l["id"], 1, "accepted"));
    }
    let found = mx.search(CARL, X1, "parser");
    assert_eq!(found["total"], 1);
    assert_eq!(found["items"][0]["id"], mine["id"]);
    // Evidence from s2 added to the s1 lesson hides it from Carl too.
    let more = mx.ok(ALICE, "_axp/memoryPropose", propose(X2, "from s1", to));
    assert_eq!(more["revision"], 3);
    assert_eq!(mx.search(CARL, X1, "parser")["total"], 0);
    assert_eq!(mx.search(ALICE, X1, "parser")["total"], 2);
    // Nor through the channel: neither subscribing nor naming it.
    assert_eq!(
        mx.code(CARL, "subscribe", json!({"channel": MEMORY})),
        -32009
    );
    assert_eq!(
        mx.code(
            CARL,
            "_axp/memorySearch",
            json!({"channel": MEMORY, "query": "x"})
        ),
        -32009
    );
}

#[test]
fn only_repository_wide_maintainers_use_the_memory_channel_directly() {
    let mut mx = Mx::new();
    assert!(mx.raw(M, "subscribe", json!({"channel": MEMORY}))["result"].is_object());
    for conn in [ALICE, OBS, VER, BOB, CARL, MONA] {
        assert_eq!(
            mx.code(conn, "subscribe", json!({"channel": MEMORY})),
            -32009,
            "{conn}"
        );
    }
    // initialize refuses it as an initial subscription; reconnect lists it as missing.
    mx.h.connect(20, principal("alice", Role::Contributor, None));
    let r = mx.h.request(
        20,
        1,
        "initialize",
        json!({"channel":"ahp-root://","protocolVersions":["0.9.0"],"clientId":"c20",
               "initialSubscriptions":[MEMORY]}),
    );
    assert_eq!(r["error"]["code"], -32009);
    mx.h.connect(21, principal("alice", Role::Contributor, None));
    let r = mx.h.request(
        21,
        1,
        "reconnect",
        json!({"channel":"ahp-root://","clientId":"c21","lastSeenServerSeq":0,
               "subscriptions":[MEMORY, X1]}),
    );
    assert_eq!(r["result"]["missing"], json!([MEMORY]));
    // A maintainer's subscription replays memory events on reconnect.
    let to = mx.seq();
    let before = mx.seq();
    mx.ok(ALICE, "_axp/memoryPropose", propose(X1, "replayed", to));
    mx.h.connect(22, Principal::maintainer("m"));
    let r = mx.h.request(
        22,
        1,
        "reconnect",
        json!({"channel":"ahp-root://","clientId":"c22","lastSeenServerSeq":before,
               "subscriptions":[MEMORY]}),
    );
    assert_eq!(r["result"]["type"], "replay");
    assert_eq!(
        r["result"]["actions"][0]["action"]["type"],
        "_axp/memoryChanged"
    );
}

#[test]
fn every_propose_error_code() {
    let mut mx = Mx::limits(Limits {
        memory_lessons_max: 2,
        memory_evidence_max: 2,
        ..Limits::default()
    });
    let to = mx.seq();
    let p = |channel: &str| propose(channel, "t", to);
    // -32602: params, a channel that is no session's, a range out of order or in the future,
    // no event of this session in the range, blank text.
    let mut bad = p(X1);
    bad["extra"] = json!(1);
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", bad), -32602);
    for channel in ["ahp-root://", "axp-executors://"] {
        assert_eq!(mx.code(ALICE, "_axp/memoryPropose", p(channel)), -32602);
    }
    assert_eq!(
        mx.code(VER, "_axp/memoryPropose", p("ahp-root://")),
        -32602,
        "before the role"
    );
    let mut backwards = p(X1);
    backwards["fromSeq"] = json!(to);
    backwards["toSeq"] = json!(to - 1);
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", backwards), -32602);
    let mut future = p(X1);
    future["toSeq"] = json!(to + 1);
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", future), -32602);
    // s1's only event is its comment; s2's comment came after it.
    let s1_comment =
        mx.h.host
            .store()
            .events()
            .iter()
            .find(|e| &*e.channel == X1)
            .map(|e| e.seq)
            .expect("s1 event");
    let mut elsewhere = p(X1);
    elsewhere["fromSeq"] = json!(s1_comment + 1);
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", elsewhere), -32602);
    // (fromSeq - 1, toSeq]: a range starting at the event holds it.
    let mut exact = p(X1);
    exact["fromSeq"] = json!(s1_comment);
    exact["toSeq"] = json!(s1_comment);
    exact["title"] = json!("exact");
    mx.ok(ALICE, "_axp/memoryPropose", exact);
    let mut blank = p(X1);
    blank["lesson"] = json!(" \n\t ");
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", blank), -32602);
    // -32009: roles, scope, and a prior lesson whose evidence the caller cannot read.
    for conn in [OBS, VER] {
        assert_eq!(mx.code(conn, "_axp/memoryPropose", p(X1)), -32009);
    }
    assert_eq!(mx.code(CARL, "_axp/memoryPropose", p(X2)), -32009);
    mx.ok(ALICE, "_axp/memoryPropose", propose(X2, "shared", to));
    assert_eq!(
        mx.code(CARL, "_axp/memoryPropose", propose(X1, "shared", to)),
        -32009
    );
    // -32008: a session that does not exist.
    assert_eq!(
        mx.code(ALICE, "_axp/memoryPropose", p("axp-session:/nope")),
        -32008
    );
    // -32011: an operationId reused with other input.
    let mut first = propose(X1, "shared", to);
    first["operationId"] = json!("reuse");
    mx.ok(ALICE, "_axp/memoryPropose", first.clone());
    first["title"] = json!("other");
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", first), -32011);
    // -32043: a third lesson, a third evidence entry.
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", p(X1)), -32043);
    mx.comment(X1);
    let mut third = propose(X1, "shared", mx.seq());
    third["fromSeq"] = json!(2);
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", third), -32043);
    assert_eq!(mx.memory()["entries"].as_object().map(|e| e.len()), Some(2));
}

#[test]
fn every_review_error_code() {
    let mut mx = Mx::new();
    let to = mx.seq();
    let lesson = mx.ok(ALICE, "_axp/memoryPropose", propose(X2, "t", to));
    let id = lesson["id"].clone();
    // -32602: params.
    let mut bad = review(&id, 1, "proposed");
    assert_eq!(mx.code(M, "_axp/memoryReview", bad.clone()), -32602);
    bad["status"] = json!("accepted");
    bad["memoryId"] = json!("nope");
    assert_eq!(mx.code(M, "_axp/memoryReview", bad), -32602);
    // -32009: not a maintainer; a scoped maintainer through the memory channel, or through a
    // channel it reads but without access to the evidence.
    for conn in [ALICE, OBS, VER] {
        assert_eq!(
            mx.code(conn, "_axp/memoryReview", review(&id, 1, "accepted")),
            -32009
        );
    }
    assert_eq!(
        mx.code(MONA, "_axp/memoryReview", review(&id, 1, "accepted")),
        -32009
    );
    let mut through_s1 = review(&id, 1, "accepted");
    through_s1["channel"] = json!(X1);
    assert_eq!(
        mx.code(MONA, "_axp/memoryReview", through_s1.clone()),
        -32009
    );
    // -32008: an unknown channel.
    let mut unknown = through_s1.clone();
    unknown["channel"] = json!("axp-session:/nope");
    assert_eq!(mx.code(M, "_axp/memoryReview", unknown), -32008);
    // -32011: another revision, an unknown id, a reused operationId.
    assert_eq!(
        mx.code(M, "_axp/memoryReview", review(&id, 2, "accepted")),
        -32011
    );
    let missing = json!("0".repeat(64));
    assert_eq!(
        mx.code(M, "_axp/memoryReview", review(&missing, 1, "accepted")),
        -32011
    );
    // Any readable channel will do for a maintainer who reads the evidence.
    let mut via_root = review(&id, 1, "accepted");
    via_root["channel"] = json!("ahp-root://");
    via_root["operationId"] = json!("rv");
    let accepted = mx.ok(M, "_axp/memoryReview", via_root.clone());
    assert_eq!(accepted["revision"], 2);
    // The same review again is its stored result; other input under it conflicts.
    assert_eq!(mx.ok(M, "_axp/memoryReview", via_root.clone()), accepted);
    via_root["status"] = json!("retired");
    assert_eq!(mx.code(M, "_axp/memoryReview", via_root), -32011);
    // A stale revision after a concurrent review.
    assert_eq!(
        mx.code(M, "_axp/memoryReview", review(&id, 1, "retired")),
        -32011
    );
    // A scoped maintainer may review a lesson of its own sessions.
    let own = mx.ok(ALICE, "_axp/memoryPropose", propose(X1, "own", to));
    let mut r = review(&own["id"], 1, "accepted");
    r["channel"] = json!(X1);
    assert_eq!(mx.ok(MONA, "_axp/memoryReview", r)["status"], "accepted");
}

#[test]
fn every_search_error_code() {
    let mut mx = Mx::new();
    for bad in [
        json!({"channel": X1}),
        json!({"channel": X1, "query": "x", "limit": 0}),
        json!({"channel": X1, "query": "x", "limit": 21}),
        json!({"channel": X1, "query": "x".repeat(4097)}),
        json!({"channel": X1, "query": "x", "operationId": "o"}),
    ] {
        assert_eq!(mx.code(ALICE, "_axp/memorySearch", bad), -32602);
    }
    assert_eq!(
        mx.code(
            CARL,
            "_axp/memorySearch",
            json!({"channel": X2, "query": "x"})
        ),
        -32009
    );
    assert_eq!(
        mx.code(
            ALICE,
            "_axp/memorySearch",
            json!({"channel": MEMORY, "query": "x"})
        ),
        -32009
    );
    assert_eq!(
        mx.code(
            ALICE,
            "_axp/memorySearch",
            json!({"channel": "axp-session:/nope", "query": "x"})
        ),
        -32008
    );
    assert_eq!(mx.search(M, MEMORY, "x"), json!({"items": [], "total": 0}));
}

#[test]
fn nothing_is_revealed_before_it_is_durable() {
    let mut mx = Mx::new();
    mx.ok(M, "subscribe", json!({"channel": MEMORY}));
    let to = mx.seq();
    mx.h.hold_commits(true);
    let out = mx.h.send(
        ALICE,
        &json!({"jsonrpc":"2.0","id":7,"method":"_axp/memoryPropose",
                "params": with_op(&propose(X1, "held", to))}),
    );
    assert!(out.is_empty(), "neither the answer nor the event: {out:?}");
    // A read that would show it waits too.
    assert!(mx
        .h
        .send(
            BOB,
            &json!({"jsonrpc":"2.0","id":8,"method":"_axp/memorySearch",
                           "params":{"channel": X1, "query": "held"}})
        )
        .is_empty());
    let out = mx.h.complete(1);
    assert!(out
        .iter()
        .any(|(c, v)| *c == ALICE && v["id"] == 7 && v["result"]["revision"] == 1));
    assert!(out
        .iter()
        .any(|(c, v)| *c == M && v["params"]["action"]["type"] == "_axp/memoryChanged"));
    assert!(out.iter().any(|(c, v)| *c == BOB && v["id"] == 8));
}

#[test]
fn a_failed_commit_rolls_memory_back_and_a_retry_applies() {
    let mut mx = Mx::new();
    let to = mx.seq();
    let kept = mx.ok(ALICE, "_axp/memoryPropose", propose(X1, "kept", to));
    let before = mx.h.host.axp_inspect();
    let mut p = propose(X1, "lost", to);
    p["operationId"] = json!("p-1");
    mx.h.host.store_mut().fail_next_commits(1);
    assert_eq!(mx.code(ALICE, "_axp/memoryPropose", p.clone()), -32603);
    let mut r = review(&kept["id"], 1, "accepted");
    r["operationId"] = json!("r-1");
    mx.h.host.store_mut().fail_next_commits(1);
    assert_eq!(mx.code(M, "_axp/memoryReview", r.clone()), -32603);
    mx.comment(X2);
    let mut grow = propose(X2, "kept", mx.seq());
    grow["operationId"] = json!("g-1");
    let before_grow = mx.h.host.axp_inspect();
    mx.h.host.store_mut().fail_next_commits(1);
    assert_eq!(mx.code(BOB, "_axp/memoryPropose", grow.clone()), -32603);
    assert_eq!(mx.h.host.axp_inspect(), before_grow);
    assert_eq!(before.memory, before_grow.memory);
    // The lost lesson is not searchable, not stored, and its id is free.
    mx.ok(M, "_axp/memoryReview", review(&kept["id"], 1, "accepted"));
    assert_eq!(mx.search(ALICE, X1, "lost")["total"], 0);
    // The retries, with their operationIds, apply now.
    let lost = mx.ok(ALICE, "_axp/memoryPropose", p);
    assert_eq!(lost["revision"], 1);
    assert_eq!(mx.ok(BOB, "_axp/memoryPropose", grow)["revision"], 3);
    assert_eq!(
        mx.code(M, "_axp/memoryReview", r),
        -32011,
        "revision moved on"
    );
}

#[test]
fn a_restart_keeps_lessons_their_index_and_their_receipts() {
    let mut mx = Mx::new();
    let to = mx.seq();
    let mut p = propose(X1, "durable", to);
    p["operationId"] = json!("keep");
    let lesson = mx.ok(ALICE, "_axp/memoryPropose", p.clone());
    mx.ok(M, "_axp/memoryReview", review(&lesson["id"], 1, "accepted"));
    let memory = mx.memory();
    let store = mx.h.host.into_store();
    let mut mx2 = Mx::with(HostConfig::default(), store, false);
    assert_eq!(mx2.memory(), memory);
    assert_eq!(mx2.search(ALICE, X1, "durable")["total"], 1);
    // The receipt survived: the same operation is its stored answer, other input conflicts.
    assert_eq!(mx2.ok(ALICE, "_axp/memoryPropose", p.clone()), lesson);
    p["title"] = json!("changed");
    assert_eq!(mx2.code(ALICE, "_axp/memoryPropose", p), -32011);
}

#[test]
fn a_memory_too_large_for_one_snapshot_is_refused_to_subscribers_not_to_search() {
    let mut mx = Mx::new();
    let to = mx.seq();
    // ~4.4 KB a lesson: past the 16 MiB snapshot bound after ~3,900.
    let body = "x".repeat(3900);
    let mut n = 0;
    let mut propose_more = |mx: &mut Mx, count: usize| {
        for _ in 0..count {
            let p = json!({"channel": X1, "title": format!("lesson {n}"), "trigger": "t",
                           "lesson": body, "outcome": "success", "fromSeq": 1, "toSeq": to});
            mx.ok(ALICE, "_axp/memoryPropose", p);
            n += 1;
        }
    };
    propose_more(&mut mx, 3_700);
    assert!(mx.raw(M, "subscribe", json!({"channel": MEMORY}))["result"].is_object());
    while mx.memory().to_string().len() <= crate::limits::MEMORY_SNAPSHOT_BYTES_MAX {
        propose_more(&mut mx, 50);
    }
    assert_eq!(mx.code(M, "subscribe", json!({"channel": MEMORY})), -32043);
    assert!(
        mx.search(M, MEMORY, "lesson")["total"] == 0,
        "none accepted yet"
    );
}
