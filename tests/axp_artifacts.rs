//! AXP checkpoints and context over real WebSocket against `axhost serve`: checkpoints (`_axp/checkpoint`), the
//! working context (`_axp/context`) and compaction (`_axp/compact`, `_axp/acceptCompaction`):
//! every happy path, every error code, what observers see, and what survives a SIGKILL.
//! Written against `../shared/reference/axp-host-notes.md` §4.2, §6, §10, §11 and §15; codes
//! are matched, never messages.

mod axp_support;
mod common;

use axp_support::*;
use common::*;
use serde_json::{json, Value};

fn sha(c: char) -> String {
    c.to_string().repeat(40)
}

/// A blob of session `id` uploaded by `ws`: its `BlobRef`.
fn put(ws: &mut Ws, id: &str, data: &[u8]) -> Value {
    ws.axp(
        "_axp/blobPut",
        json!({"channel": exchange(id), "data": b64(data), "mediaType": "application/octet-stream"}),
    )
}

/// `axp-file:/` identity of `path` in session `id`.
fn file_uri(id: &str, path: &str) -> String {
    format!("axp-file:/{}/{path}", encode_component(&exchange(id)))
}

/// A changed file of session `id` with before/after content blobs.
fn file(id: &str, path: &str, before: &Value, after: &Value) -> Value {
    let uri = file_uri(id, path);
    json!({"id": uri, "edit": {
        "before": {"uri": uri, "content": {"uri": before["uri"]}},
        "after": {"uri": uri, "content": {"uri": after["uri"]}},
    }})
}

fn checkpoint_params(
    id: &str,
    epoch: u64,
    head: &str,
    refs: &(Value, Value),
    files: Value,
) -> Value {
    json!({"channel": exchange(id), "epoch": epoch, "files": files,
        "checkpoint": {"baseCommit": sha('a'), "headCommit": head, "branch": format!("axp/{id}"),
            "bundle": refs.0, "patch": refs.1, "createdAt": 0}})
}

/// Turn `turn` from prompt to completion, with one markdown part saying `text`.
fn complete_turn(admin: &mut Ws, alice: &mut Ws, epoch: u64, turn: &str, text: &str) {
    start_turn(admin, "s1", turn);
    reserve(alice, "s1", epoch, turn, 100, 100);
    let part = json!({"type": "chat/responsePart", "turnId": turn,
        "part": {"kind": "markdown", "id": format!("{turn}-m"), "content": text}});
    alice.axp("_axp/emit", emit_params("s1", epoch, json!([part])));
    alice.axp(
        "_axp/settle",
        settle_params("s1", epoch, turn, usage(10, 5, 0, 1), "complete"),
    );
}

fn compact_params(through: u64, revision: u64) -> Value {
    json!({"channel": exchange("s1"), "expectedRevision": revision, "throughTurn": through,
        "summary": "Added the parser.", "decisions": ["keep the API"], "activeFiles": ["src/lib.rs"]})
}

/// Session s1 created by admin, docked by alice (executor `e`, grant `g`): the epoch.
fn docked(host: &HostProcess) -> (Ws, Ws, u64) {
    let mut admin = connect(host, ADMIN);
    create(&mut admin, "s1");
    create(&mut admin, "s2");
    let mut alice = connect(host, ALICE);
    register(&mut alice, "e", 30_000);
    let epoch = dock(&mut alice, "s1");
    (admin, alice, epoch)
}

#[test]
fn checkpoint_then_compaction_resumes_from_the_summary_and_survives_sigkill() {
    let mut host = cast().start();
    let (mut admin, mut alice, epoch) = docked(&host);
    let (mut olga, init) = connect_with(&host, OLGA, &[&exchange("s1"), &changeset("s1")]);
    let methods: Vec<&str> = init["_meta"]["org.axp.exchange"]["methods"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    for m in [
        "_axp/checkpoint",
        "_axp/context",
        "_axp/compact",
        "_axp/acceptCompaction",
    ] {
        assert!(methods.contains(&m), "{m} advertised: {methods:?}");
    }
    let refs = (
        put(&mut alice, "s1", b"bundle"),
        put(&mut alice, "s1", b"diff"),
    );
    let old = put(&mut alice, "s1", b"fn parse() {}");
    let new = put(&mut alice, "s1", b"fn parse() { todo!() }");
    let r = alice.axp(
        "_axp/checkpoint",
        checkpoint_params(
            "s1",
            epoch,
            &sha('b'),
            &refs,
            json!([file("s1", "src/lib.rs", &old, &new)]),
        ),
    );
    assert_eq!(r, Value::Null);
    let frames = olga.drain(300);
    assert_eq!(
        action_types(&frames),
        ["changeset/contentChanged", "_axp/checkpointChanged"]
    );
    let cp = &actions_on(&frames, &exchange("s1"))[0]["params"]["action"]["checkpoint"];
    assert_eq!(cp["headCommit"], sha('b'));
    assert!(
        cp["createdAt"].as_u64().unwrap_or(0) > 1_600_000_000_000,
        "host clock: {cp}"
    );
    let cs = state(&host, &changeset("s1"));
    assert_eq!(cs["files"][0]["id"], file_uri("s1", "src/lib.rs"));
    // File discussion binds to the current checkpoint.
    let c = olga.axp_code(
        "_axp/comment",
        json!({"channel": exchange("s1"), "body": "x", "checkpoint": sha('b'), "path": "src/lib.rs"}),
    );
    assert_eq!(c, FORBIDDEN, "observers do not comment");
    let mut vera = connect(&host, VERA);
    let comment = vera.axp(
        "_axp/comment",
        json!({"channel": exchange("s1"), "body": "Why todo?", "checkpoint": sha('b'), "path": "src/lib.rs"}),
    );
    assert_eq!(comment["path"], "src/lib.rs");

    complete_turn(&mut admin, &mut alice, epoch, "t1", "Wrote the parser.");
    complete_turn(&mut admin, &mut alice, epoch, "t2", "Added tests.");
    let before = olga.axp("_axp/context", json!({"channel": exchange("s1")}));
    let text = before["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("Repository context."), "{text}");
    assert!(text.contains("User: Fix addition\nAssistant: Wrote the parser."));
    assert_eq!(
        before["prefixHash"],
        sha256_hex(
            format!(
                "{{\"text\":{}}}",
                serde_json::to_string(text).unwrap_or_default()
            )
            .as_bytes()
        )
    );
    let proposal = alice.axp("_axp/compact", compact_params(1, 0));
    assert_eq!(proposal["context"]["gitHead"], sha('b'));
    let context = admin.axp(
        "_axp/acceptCompaction",
        json!({"channel": exchange("s1"), "proposalId": proposal["id"]}),
    );
    assert_eq!(context["revision"], 1);
    let after = olga.axp(
        "_axp/context",
        json!({"channel": exchange("s1"), "maxChars": 1024}),
    );
    let text = after["text"].as_str().unwrap_or_default().to_owned();
    assert!(!text.contains("Wrote the parser."), "{text}");
    assert!(text.contains("Added tests."));
    assert!(text.contains("\"summary\":\"Added the parser.\""));
    assert_eq!(
        state(&host, &chat("s1"))["turns"].as_array().map(Vec::len),
        Some(2)
    );

    // SIGKILL: everything acknowledged is there.
    drop((admin, alice, olga, vera));
    host.crash();
    host.restart();
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["checkpoint"]["headCommit"], sha('b'));
    assert_eq!(ex["context"], context);
    assert_eq!(ex["compaction"], Value::Null);
    assert_eq!(ex["discussion"][0]["checkpoint"], sha('b'));
    let mut olga = connect(&host, OLGA);
    let again = olga.axp(
        "_axp/context",
        json!({"channel": exchange("s1"), "maxChars": 1024}),
    );
    assert_eq!(again["text"], json!(text));
    assert_eq!(again["prefixHash"], after["prefixHash"]);
}

#[test]
fn every_checkpoint_error_code_over_the_wire() {
    let host = cast().start();
    let (_admin, mut alice, epoch) = docked(&host);
    let refs = (
        put(&mut alice, "s1", b"bundle"),
        put(&mut alice, "s1", b"diff"),
    );
    let cp = |files: Value| checkpoint_params("s1", epoch, &sha('b'), &refs, files);
    // -32602: strict params and AHP's changeset file shape.
    let mut extra = cp(json!([]));
    extra["x"] = json!(1);
    assert_eq!(alice.axp_code("_axp/checkpoint", extra), PARAMS);
    let mut short = cp(json!([]));
    short["checkpoint"]["baseCommit"] = json!("abc");
    assert_eq!(alice.axp_code("_axp/checkpoint", short), PARAMS);
    assert_eq!(
        alice.axp_code("_axp/checkpoint", cp(json!([{"id": 1}]))),
        PARAMS
    );
    let no_content =
        json!([{"id": "f", "edit": {"after": {"uri": file_uri("s1", "f"), "content": null}}}]);
    assert_eq!(alice.axp_code("_axp/checkpoint", cp(no_content)), PARAMS);
    // -32009: roles, foreign blobs, foreign files.
    let mut olga = connect(&host, OLGA);
    assert_eq!(olga.axp_code("_axp/checkpoint", cp(json!([]))), FORBIDDEN);
    let mut bob = connect(&host, BOB);
    let foreign = put(&mut bob, "s2", b"other session");
    let mut p = cp(json!([]));
    p["checkpoint"]["bundle"] = foreign.clone();
    assert_eq!(alice.axp_code("_axp/checkpoint", p), FORBIDDEN);
    let mut p = cp(json!([]));
    p["checkpoint"]["patch"]["size"] = json!(999);
    assert_eq!(alice.axp_code("_axp/checkpoint", p), FORBIDDEN);
    let foreign_file = json!([{"id": "f", "edit": {"after": {"uri": file_uri("s2", "f"), "content": {"uri": refs.0["uri"]}}}}]);
    assert_eq!(
        alice.axp_code("_axp/checkpoint", cp(foreign_file)),
        FORBIDDEN
    );
    let foreign_content = json!([{"id": "f", "edit": {"after": {"uri": file_uri("s1", "f"), "content": {"uri": foreign["uri"]}}}}]);
    assert_eq!(
        alice.axp_code("_axp/checkpoint", cp(foreign_content)),
        FORBIDDEN
    );
    let mut carl = connect(&host, CARL);
    assert_eq!(
        carl.axp_code(
            "_axp/checkpoint",
            checkpoint_params("s2", epoch, &sha('b'), &refs, json!([]))
        ),
        FORBIDDEN,
        "out of scope"
    );
    // -32040: stale epoch, or not the holder.
    let mut p = cp(json!([]));
    p["epoch"] = json!(epoch + 1);
    assert_eq!(alice.axp_code("_axp/checkpoint", p), STALE);
    assert_eq!(bob.axp_code("_axp/checkpoint", cp(json!([]))), STALE);
    // -32008: unknown session.
    let mut p = cp(json!([]));
    p["channel"] = json!(exchange("nope"));
    assert_eq!(alice.axp_code("_axp/checkpoint", p), NOT_FOUND);
    // -32011: the base is fixed once set; a retry returns the stored result, other input
    // under the same operationId conflicts.
    let mut first = cp(json!([]));
    first["operationId"] = json!("cp-1");
    assert_eq!(alice.axp("_axp/checkpoint", first.clone()), Value::Null);
    assert_eq!(alice.axp("_axp/checkpoint", first.clone()), Value::Null);
    let mut changed = first;
    changed["checkpoint"]["headCommit"] = json!(sha('c'));
    assert_eq!(alice.axp_code("_axp/checkpoint", changed), CONFLICT);
    let mut rebased = cp(json!([]));
    rebased["checkpoint"]["baseCommit"] = json!(sha('f'));
    assert_eq!(alice.axp_code("_axp/checkpoint", rebased), CONFLICT);
}

#[test]
fn every_context_and_compaction_error_code_over_the_wire() {
    let host = cast().start();
    let (mut admin, mut alice, epoch) = docked(&host);
    let mut olga = connect(&host, OLGA);
    let mut vera = connect(&host, VERA);
    complete_turn(&mut admin, &mut alice, epoch, "t1", &"z".repeat(1_100));
    // Context: -32042 past maxChars (never truncated), -32602 out of range or strict.
    assert_eq!(
        olga.axp_code(
            "_axp/context",
            json!({"channel": exchange("s1"), "maxChars": 1024})
        ),
        CONTEXT
    );
    for bad in [json!(1023), json!(200_001), json!(2048.5), json!("2048")] {
        assert_eq!(
            olga.axp_code(
                "_axp/context",
                json!({"channel": exchange("s1"), "maxChars": bad})
            ),
            PARAMS
        );
    }
    assert_eq!(
        olga.code_of(
            "_axp/context",
            json!({"channel": exchange("s1"), "operationId": "x"})
        ),
        PARAMS
    );
    assert_eq!(
        olga.axp_code("_axp/context", json!({"channel": exchange("nope")})),
        NOT_FOUND
    );
    let mut carl = connect(&host, CARL);
    assert_eq!(
        carl.axp_code("_axp/context", json!({"channel": exchange("s2")})),
        FORBIDDEN
    );
    // Compact: -32042 without a checkpoint.
    assert_eq!(
        alice.axp_code("_axp/compact", compact_params(1, 0)),
        CONTEXT
    );
    let refs = (
        put(&mut alice, "s1", b"bundle"),
        put(&mut alice, "s1", b"diff"),
    );
    alice.axp(
        "_axp/checkpoint",
        checkpoint_params("s1", epoch, &sha('b'), &refs, json!([])),
    );
    // -32009 roles; -32011 revision; -32042 range, blank summary, running turn.
    assert_eq!(
        olga.axp_code("_axp/compact", compact_params(1, 0)),
        FORBIDDEN
    );
    assert_eq!(
        vera.axp_code("_axp/compact", compact_params(1, 0)),
        FORBIDDEN
    );
    assert_eq!(
        alice.axp_code("_axp/compact", compact_params(1, 7)),
        CONFLICT
    );
    assert_eq!(
        alice.axp_code("_axp/compact", compact_params(0, 0)),
        CONTEXT
    );
    assert_eq!(
        alice.axp_code("_axp/compact", compact_params(2, 0)),
        CONTEXT
    );
    let mut blank = compact_params(1, 0);
    blank["summary"] = json!(" \n ");
    assert_eq!(alice.axp_code("_axp/compact", blank), CONTEXT);
    let mut long = compact_params(1, 0);
    long["activeFiles"] = json!(vec!["f"; 65]);
    assert_eq!(alice.axp_code("_axp/compact", long), PARAMS);
    start_turn(&mut admin, "s1", "t2");
    assert_eq!(
        alice.axp_code("_axp/compact", compact_params(1, 0)),
        CONTEXT
    );
    admin.axp(
        "_axp/dispatch",
        json!({"channel": chat("s1"), "action": {"type": "chat/turnCancelled", "turnId": "t2", "duration": 0}}),
    );
    // Accept: -32009 not a maintainer; -32011 not the pending proposal; -32042 running turn
    // or a moved checkpoint.
    let proposal = alice.axp("_axp/compact", compact_params(1, 0));
    let accept = json!({"channel": exchange("s1"), "proposalId": proposal["id"]});
    assert_eq!(
        alice.axp_code("_axp/acceptCompaction", accept.clone()),
        FORBIDDEN
    );
    assert_eq!(
        admin.axp_code(
            "_axp/acceptCompaction",
            json!({"channel": exchange("s1"), "proposalId": "other"})
        ),
        CONFLICT
    );
    start_turn(&mut admin, "s1", "t3");
    assert_eq!(
        admin.axp_code("_axp/acceptCompaction", accept.clone()),
        CONTEXT
    );
    admin.axp(
        "_axp/dispatch",
        json!({"channel": chat("s1"), "action": {"type": "chat/turnCancelled", "turnId": "t3", "duration": 0}}),
    );
    alice.axp(
        "_axp/checkpoint",
        checkpoint_params("s1", epoch, &sha('c'), &refs, json!([])),
    );
    assert_eq!(admin.axp_code("_axp/acceptCompaction", accept), CONTEXT);
    // A compaction proposed at the new head is accepted; the watcher sees both actions.
    let (mut watch, _) = connect_with(&host, OLGA, &[&exchange("s1")]);
    let fresh = alice.axp("_axp/compact", compact_params(1, 0));
    let mut mark = connect(&host, MARK);
    mark.axp(
        "_axp/acceptCompaction",
        json!({"channel": exchange("s1"), "proposalId": fresh["id"]}),
    );
    let frames = watch.drain(300);
    assert_eq!(
        action_types(&frames),
        ["_axp/compactionProposed", "_axp/contextChanged"]
    );
}
