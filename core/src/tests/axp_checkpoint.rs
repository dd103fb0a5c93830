//! Checkpoints, the working context and compaction through the public surface: happy paths,
//! every error code, what a new checkpoint clears and keeps, and the export's rebuild.

use super::axp::{b64, rebuilds, usage, Ax, B, C, CHAT, M, O, V, X};
use super::schema::check;
use super::*;
use crate::canonical::hash_object;

/// A blob of session `s1` holding `data`: its `BlobRef`.
fn put(ax: &mut Ax, data: &[u8]) -> Value {
    ax.ok(
        C,
        "_axp/blobPut",
        json!({"channel": X, "data": b64(data), "mediaType": "application/octet-stream"}),
    )
}

const FILE: &str = "axp-file:/axp-session%3A%2Fs1/";

/// One changed file whose before and after contents are `before` and `after`.
fn file(path: &str, before: &Value, after: &Value) -> Value {
    let side = |c: &Value| json!({"uri": format!("{FILE}{path}"), "content": {"uri": c["uri"]}});
    json!({"id": format!("{FILE}{path}"), "edit": {"before": side(before), "after": side(after)}})
}

/// Params of a checkpoint at `head` over `base`, bundle and patch `refs`.
fn checkpoint_params(
    epoch: u64,
    base: &str,
    head: &str,
    refs: &(Value, Value),
    files: Value,
) -> Value {
    json!({
        "channel": X, "epoch": epoch, "files": files,
        "checkpoint": {"baseCommit": base, "headCommit": head, "branch": "axp/s1",
            "bundle": refs.0, "patch": refs.1, "createdAt": 1},
    })
}

fn sha(c: char) -> String {
    c.to_string().repeat(40)
}

/// Docked, with a bundle and a patch uploaded: the epoch and the two refs.
fn docked_with_blobs(ax: &mut Ax) -> (u64, (Value, Value)) {
    let epoch = ax.dock();
    let bundle = put(ax, b"bundle bytes");
    let patch = put(ax, b"patch bytes");
    (epoch, (bundle, patch))
}

/// Runs turn `id` to completion with one markdown part saying `text`.
fn complete_turn(ax: &mut Ax, epoch: u64, id: &str, text: &str) {
    ax.prompt(id);
    let r = ax.reserve(epoch, id, 100);
    assert!(r.get("error").is_none(), "{r}");
    let part = json!({"type":"chat/responsePart","turnId":id,"part":{"kind":"markdown","id":format!("{id}-m"),"content":text}});
    let r = ax.emit(epoch, json!([part]));
    assert!(r.get("error").is_none(), "{r}");
    ax.ok(
        C,
        "_axp/settle",
        json!({"channel": X, "epoch": epoch, "turnId": id, "usage": usage(10, 5, 0, 1), "outcome": "complete"}),
    );
}

#[test]
fn a_checkpoint_publishes_its_files_and_takes_the_hosts_clock() {
    let mut ax = Ax::new();
    ax.ok(O, "subscribe", json!({"channel": X}));
    ax.ok(O, "subscribe", json!({"channel": "ahp-changeset:/s1"}));
    let (epoch, refs) = docked_with_blobs(&mut ax);
    let old = put(&mut ax, b"fn a() {}");
    let new = put(&mut ax, b"fn a() { b() }");
    let mut p = checkpoint_params(
        epoch,
        &sha('a'),
        &sha('b'),
        &refs,
        json!([file("src/a.rs", &old, &new)]),
    );
    p["operationId"] = json!("cp-1");
    check("axp/checkpoint.params", &p);
    let t0 = ax.h.now;
    let frames = ax.h.send(
        C,
        &json!({"jsonrpc": "2.0", "id": 9000, "method": "_axp/checkpoint", "params": p}),
    );
    let r = frames
        .iter()
        .find(|(c, f)| *c == C && f["id"] == 9000)
        .map(|(_, f)| f["result"].clone())
        .expect("answered");
    check("axp/checkpoint.result", &r);
    assert_eq!(r, Value::Null);
    let x = ax.exchange();
    check("axp/exchange.state", &x);
    assert_eq!(x["checkpoint"]["headCommit"], sha('b'));
    assert_eq!(x["checkpoint"]["bundle"], refs.0);
    let created = x["checkpoint"]["createdAt"].as_u64().unwrap_or(0);
    assert!(
        (t0..=ax.h.now).contains(&created),
        "the host's clock, not the executor's: {created}"
    );
    let changeset =
        ax.h.host
            .channel_state("ahp-changeset:/s1")
            .expect("changeset");
    assert_eq!(changeset["files"][0]["id"], format!("{FILE}src/a.rs"));
    let actions: Vec<&Value> = frames
        .iter()
        .filter(|(c, _)| *c == O)
        .map(|(_, f)| &f["params"]["action"])
        .collect();
    let types: Vec<&str> = actions.iter().filter_map(|a| a["type"].as_str()).collect();
    assert_eq!(
        types,
        ["changeset/contentChanged", "_axp/checkpointChanged"]
    );
    check("axp/checkpoint-changed.action", actions[actions.len() - 1]);
    // A comment may now name the checkpoint and a file of it.
    let c = ax.ok(
        V,
        "_axp/comment",
        json!({"channel": X, "body": "why?", "checkpoint": sha('b'), "path": "src/a.rs"}),
    );
    assert_eq!(c["checkpoint"], sha('b'));
    // The next checkpoint keeps the base and may move the head.
    let next = checkpoint_params(epoch, &sha('a'), &sha('c'), &refs, json!([]));
    ax.ok(C, "_axp/checkpoint", next);
    assert_eq!(ax.exchange()["checkpoint"]["headCommit"], sha('c'));
    // A comment on the old head is now stale.
    assert_eq!(
        ax.code(
            V,
            "_axp/comment",
            json!({"channel": X, "body": "late", "checkpoint": sha('b'), "path": null})
        ),
        -32011
    );
}

#[test]
fn every_checkpoint_error_code() {
    let mut ax = Ax::new();
    ax.h.create(M, "s2");
    let (epoch, refs) = docked_with_blobs(&mut ax);
    let cp = |files: Value| checkpoint_params(epoch, &sha('a'), &sha('b'), &refs, files);
    // -32602: bad params, a file that is not an AHP changeset file, a side without a uri
    // or without content.
    let mut bad = cp(json!([]));
    bad["checkpoint"]["headCommit"] = json!("HEAD");
    assert_eq!(ax.code(C, "_axp/checkpoint", bad), -32602);
    let too_many: Vec<Value> = (0..2001).map(|_| json!({})).collect();
    assert_eq!(ax.code(C, "_axp/checkpoint", cp(json!(too_many))), -32602);
    assert_eq!(
        ax.code(C, "_axp/checkpoint", cp(json!([{"edit": {}}]))),
        -32602
    );
    let no_uri = json!([{"id": "f", "edit": {"after": {"content": {"uri": refs.0["uri"]}}}}]);
    assert_eq!(ax.code(C, "_axp/checkpoint", cp(no_uri)), -32602);
    let no_content =
        json!([{"id": "f", "edit": {"after": {"uri": format!("{FILE}f"), "content": null}}}]);
    assert_eq!(ax.code(C, "_axp/checkpoint", cp(no_content)), -32602);
    // -32009: not a contributor, a blob of another session, a wrong size or URI, a file of
    // another session, content that is not this session's blob.
    assert_eq!(ax.code(O, "_axp/checkpoint", cp(json!([]))), -32009);
    let other = ax.ok(
        B,
        "_axp/blobPut",
        json!({"channel": "axp-session:/s2", "data": b64(b"elsewhere"), "mediaType": "x"}),
    );
    let mut foreign = cp(json!([]));
    foreign["checkpoint"]["bundle"] = other.clone();
    assert_eq!(ax.code(C, "_axp/checkpoint", foreign), -32009);
    let mut wrong_size = cp(json!([]));
    wrong_size["checkpoint"]["patch"]["size"] = json!(1);
    assert_eq!(ax.code(C, "_axp/checkpoint", wrong_size), -32009);
    let mut wrong_uri = cp(json!([]));
    wrong_uri["checkpoint"]["patch"]["uri"] = json!(format!(
        "axp-blob:/x/{}",
        refs.1["sha256"].as_str().unwrap_or("")
    ));
    assert_eq!(ax.code(C, "_axp/checkpoint", wrong_uri), -32009);
    let mut media = cp(json!([]));
    media["checkpoint"]["patch"]["mediaType"] = json!("text/x-diff");
    let foreign_file = json!([{"id": "f", "edit": {"after": {"uri": "axp-file:/axp-session%3A%2Fs2/f", "content": {"uri": refs.0["uri"]}}}}]);
    assert_eq!(ax.code(C, "_axp/checkpoint", cp(foreign_file)), -32009);
    let foreign_content = json!([{"id": "f", "edit": {"after": {"uri": format!("{FILE}f"), "content": {"uri": other["uri"]}}}}]);
    assert_eq!(ax.code(C, "_axp/checkpoint", cp(foreign_content)), -32009);
    // -32040: a stale epoch, or a contributor without the lease.
    let mut stale = cp(json!([]));
    stale["epoch"] = json!(epoch + 1);
    assert_eq!(ax.code(C, "_axp/checkpoint", stale), -32040);
    assert_eq!(ax.code(B, "_axp/checkpoint", cp(json!([]))), -32040);
    // The media type is the client's label: a different one is accepted.
    ax.ok(C, "_axp/checkpoint", media);
    // -32011: the base commit is fixed once set.
    let rebased = checkpoint_params(epoch, &sha('f'), &sha('b'), &refs, json!([]));
    assert_eq!(ax.code(C, "_axp/checkpoint", rebased), -32011);
    // -32008: an unknown session.
    let mut unknown = cp(json!([]));
    unknown["channel"] = json!("axp-session:/nope");
    assert_eq!(ax.code(C, "_axp/checkpoint", unknown), -32008);
    // Nothing refused was written.
    assert_eq!(
        ax.exchange()["checkpoint"]["patch"]["mediaType"],
        "text/x-diff"
    );
}

#[test]
fn a_checkpoint_is_accepted_during_a_reserved_turn() {
    let mut ax = Ax::new();
    let (epoch, refs) = docked_with_blobs(&mut ax);
    ax.prompt("t1");
    let r = ax.reserve(epoch, "t1", 100);
    assert!(r.get("error").is_none());
    ax.ok(
        C,
        "_axp/checkpoint",
        checkpoint_params(epoch, &sha('a'), &sha('b'), &refs, json!([])),
    );
}

/// Docked, two turns completed, a checkpoint at `b`: the epoch and the blob refs.
fn with_history(ax: &mut Ax) -> (u64, (Value, Value)) {
    let (epoch, refs) = docked_with_blobs(ax);
    complete_turn(ax, epoch, "t1", "first answer");
    complete_turn(ax, epoch, "t2", "second answer");
    ax.ok(
        C,
        "_axp/checkpoint",
        checkpoint_params(epoch, &sha('a'), &sha('b'), &refs, json!([])),
    );
    (epoch, refs)
}

fn compact(through: u64, revision: u64) -> Value {
    json!({"channel": X, "expectedRevision": revision, "throughTurn": through,
        "summary": "  Did the first thing.  ", "decisions": ["use X"], "activeFiles": ["src/a.rs"]})
}

#[test]
fn compaction_is_proposed_then_accepted_and_moves_the_context_not_the_history() {
    let mut ax = Ax::new();
    ax.ok(O, "subscribe", json!({"channel": X}));
    with_history(&mut ax);
    let before = ax.ok(O, "_axp/context", json!({"channel": X}));
    check("axp/context.result", &before);
    assert!(before["text"]
        .as_str()
        .unwrap_or("")
        .contains("User: do it\nAssistant: first answer"));
    let mut p = compact(1, 0);
    p["operationId"] = json!("compact-1");
    check("axp/compact.params", &p);
    let proposal = ax.ok(C, "_axp/compact", p);
    check("axp/compact.result", &proposal);
    assert_eq!(proposal["id"], "compact-1");
    assert_eq!(proposal["author"], "alice");
    assert_eq!(proposal["context"]["revision"], 1);
    assert_eq!(proposal["context"]["gitHead"], sha('b'));
    assert_eq!(
        proposal["context"]["summary"], "  Did the first thing.  ",
        "stored untrimmed"
    );
    assert_eq!(proposal["evidence"]["fromSeq"], 0);
    assert_eq!(ax.exchange()["compaction"], proposal);
    let a = json!({"channel": X, "operationId": "accept-1", "proposalId": "compact-1"});
    check("axp/accept-compaction.params", &a);
    let context = ax.ok(M, "_axp/acceptCompaction", a);
    check("axp/accept-compaction.result", &context);
    assert_eq!(context, proposal["context"]);
    let x = ax.exchange();
    assert_eq!(x["context"], context);
    assert_eq!(x["compaction"], Value::Null);
    assert_eq!(
        ax.chat()["turns"].as_array().map(Vec::len),
        Some(2),
        "history kept"
    );
    let after = ax.ok(O, "_axp/context", json!({"channel": X, "maxChars": 1024}));
    let text = after["text"].as_str().unwrap_or("");
    assert!(!text.contains("first answer"), "{text}");
    assert!(text.contains("second answer"));
    assert!(text.contains("\"summary\":\"  Did the first thing.  \",\"decisions\":[\"use X\"]"));
    assert_eq!(after["revision"], 1);
    assert_eq!(after["throughTurn"], 1);
    assert_eq!(after["prefixHash"], hash_object(&json!({"text": text})));
    let frames = ax.h.drain();
    for (_, f) in frames.iter().filter(|(c, _)| *c == O) {
        match f["params"]["action"]["type"].as_str() {
            Some("_axp/compactionProposed") => {
                check("axp/compaction-proposed.action", &f["params"]["action"])
            }
            Some("_axp/contextChanged") => {
                check("axp/context-changed.action", &f["params"]["action"])
            }
            _ => {}
        }
    }
    // The export rebuilds it all.
    let export = ax.ok(O, "_axp/export", json!({"channel": X}));
    rebuilds(&export);
}

#[test]
fn every_compaction_error_code() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    // -32042 without a checkpoint (after the other checks pass).
    complete_turn(&mut ax, epoch, "t1", "one");
    assert_eq!(ax.code(C, "_axp/compact", compact(1, 0)), -32042);
    let mut ax = Ax::new();
    let (epoch, _) = with_history(&mut ax);
    // -32602: params.
    let mut long = compact(1, 0);
    long["summary"] = json!("x".repeat(24_001));
    assert_eq!(ax.code(C, "_axp/compact", long), -32602);
    let mut many = compact(1, 0);
    many["decisions"] = json!(vec!["d"; 33]);
    assert_eq!(ax.code(C, "_axp/compact", many), -32602);
    // -32009: observers and verifiers.
    assert_eq!(ax.code(O, "_axp/compact", compact(1, 0)), -32009);
    assert_eq!(ax.code(V, "_axp/compact", compact(1, 0)), -32009);
    // -32011: the revision moved.
    assert_eq!(ax.code(C, "_axp/compact", compact(1, 3)), -32011);
    // -32042: the range must advance through completed turns; a blank summary.
    assert_eq!(ax.code(C, "_axp/compact", compact(0, 0)), -32042);
    assert_eq!(ax.code(C, "_axp/compact", compact(3, 0)), -32042);
    let mut blank = compact(1, 0);
    blank["summary"] = json!("   ");
    assert_eq!(ax.code(C, "_axp/compact", blank), -32042);
    // -32042: a turn is running.
    ax.prompt("t3");
    assert_eq!(ax.code(C, "_axp/compact", compact(1, 0)), -32042);
    let r = ax.reserve(epoch, "t3", 100);
    assert!(r.get("error").is_none());
    assert_eq!(ax.code(C, "_axp/compact", compact(1, 0)), -32042);
    ax.ok(
        C,
        "_axp/settle",
        json!({"channel": X, "epoch": epoch, "turnId": "t3", "usage": null, "outcome": "cancelled"}),
    );
    // A proposal, then acceptance's codes.
    let proposal = ax.ok(C, "_axp/compact", compact(2, 0));
    let id = proposal["id"].as_str().unwrap_or_default().to_owned();
    let accept = |pid: &str| json!({"channel": X, "proposalId": pid});
    assert_eq!(ax.code(C, "_axp/acceptCompaction", accept(&id)), -32009);
    assert_eq!(ax.code(O, "_axp/acceptCompaction", accept(&id)), -32009);
    assert_eq!(ax.code(M, "_axp/acceptCompaction", accept("other")), -32011);
    assert_eq!(
        ax.code(M, "_axp/acceptCompaction", accept("bad id!")),
        -32602
    );
    ax.prompt("t4");
    assert_eq!(ax.code(M, "_axp/acceptCompaction", accept(&id)), -32042);
    ax.ok(
        M,
        "_axp/dispatch",
        json!({"channel": CHAT, "action": {"type": "chat/turnCancelled", "turnId": "t4", "duration": 0}}),
    );
    // A new checkpoint moved the head: the proposal stays but cannot be accepted.
    let refs = (put(&mut ax, b"bundle bytes"), put(&mut ax, b"patch bytes"));
    ax.ok(
        C,
        "_axp/checkpoint",
        checkpoint_params(epoch, &sha('a'), &sha('e'), &refs, json!([])),
    );
    assert_eq!(ax.exchange()["compaction"]["id"], id.as_str());
    assert_eq!(ax.code(M, "_axp/acceptCompaction", accept(&id)), -32042);
    // A fresh proposal at the new head is accepted once; again, it is gone (-32011).
    let fresh = ax.ok(C, "_axp/compact", compact(2, 0));
    let fid = fresh["id"].as_str().unwrap_or_default().to_owned();
    ax.ok(M, "_axp/acceptCompaction", accept(&fid));
    assert_eq!(ax.code(M, "_axp/acceptCompaction", accept(&fid)), -32011);
    // The accepted revision is 1; a proposal against 0 now conflicts.
    assert_eq!(ax.code(C, "_axp/compact", compact(3, 0)), -32011);
}

#[test]
fn the_working_context_is_never_truncated() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    let long = "y".repeat(1_100);
    complete_turn(&mut ax, epoch, "t1", &long);
    let r = ax.ok(O, "_axp/context", json!({"channel": X}));
    assert_eq!(r["memoryTotal"], 0);
    assert_eq!(r["memoryIncluded"], 0);
    assert_eq!(r["revision"], 0);
    let text = r["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("Repository context. Treat recalled lessons as evidence"));
    assert!(text.ends_with(&format!("User: do it\nAssistant: {long}")));
    // -32042 past maxChars; -32602 outside its range or with unknown keys; -32009 out of
    // scope; -32008 for an unknown session.
    assert_eq!(
        ax.code(O, "_axp/context", json!({"channel": X, "maxChars": 1024})),
        -32042
    );
    assert_eq!(
        ax.code(O, "_axp/context", json!({"channel": X, "maxChars": 1023})),
        -32602
    );
    assert_eq!(
        ax.code(
            O,
            "_axp/context",
            json!({"channel": X, "maxChars": 200_001})
        ),
        -32602
    );
    assert_eq!(
        ax.code(O, "_axp/context", json!({"channel": X, "operationId": "x"})),
        -32602
    );
    assert_eq!(
        ax.code(O, "_axp/context", json!({"channel": "axp-session:/nope"})),
        -32008
    );
    let mut h = ax.h;
    h.init(
        9,
        Principal {
            id: "scoped".into(),
            role: Role::Observer,
            sessions: SessionScope::Only(["other".to_string()].into()),
        },
        "c9",
        &[],
    );
    let r = h.request(9, 5, "_axp/context", json!({"channel": X}));
    assert_eq!(r["error"]["code"], -32009);
}

#[test]
fn checkpoints_and_contexts_survive_a_restart_and_retries_change_nothing() {
    let mut ax = Ax::new();
    let (_, _) = with_history(&mut ax);
    let p = json!({"channel": X, "operationId": "c-same", "expectedRevision": 0, "throughTurn": 1,
        "summary": "s", "decisions": [], "activeFiles": []});
    let first = ax.ok(C, "_axp/compact", p.clone());
    let seq = ax.h.host.server_seq();
    assert_eq!(ax.ok(C, "_axp/compact", p.clone()), first);
    assert_eq!(ax.h.host.server_seq(), seq);
    let mut changed = p;
    changed["summary"] = json!("t");
    assert_eq!(ax.code(C, "_axp/compact", changed), -32011);
    let before = ax.exchange();
    let store = ax.h.host.into_store();
    let mut ax2 = Ax::bare(HostConfig::default(), store);
    let after = ax2.exchange();
    for key in ["checkpoint", "context", "compaction"] {
        assert_eq!(after[key], before[key], "{key}");
    }
    // The receipt survived the restart too.
    assert_eq!(
        ax2.ok(
            C,
            "_axp/compact",
            json!({"channel": X, "operationId": "c-same", "expectedRevision": 0, "throughTurn": 1,
        "summary": "s", "decisions": [], "activeFiles": []})
        ),
        first
    );
}

#[test]
fn the_working_context_recalls_accepted_lessons_the_caller_may_read() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    complete_turn(&mut ax, epoch, "t1", "done");
    let task = ax.exchange()["task"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let seq = ax.h.host.server_seq();
    let lesson = ax.ok(
        C,
        "_axp/memoryPropose",
        json!({"channel": X, "title": "Sessions need tests", "trigger": format!("working on {task}"),
            "lesson": "Run the suite before settling.", "outcome": "success", "fromSeq": 1, "toSeq": seq}),
    );
    // Proposed, not accepted: not recalled.
    let r = ax.ok(O, "_axp/context", json!({"channel": X}));
    assert_eq!(
        (r["memoryTotal"].clone(), r["memoryIncluded"].clone()),
        (json!(0), json!(0))
    );
    ax.ok(
        M,
        "_axp/memoryReview",
        json!({"channel": X, "memoryId": lesson["id"], "revision": lesson["revision"], "status": "accepted"}),
    );
    let r = ax.ok(O, "_axp/context", json!({"channel": X}));
    assert_eq!(
        (r["memoryTotal"].clone(), r["memoryIncluded"].clone()),
        (json!(1), json!(1))
    );
    let text = r["text"].as_str().unwrap_or_default();
    let section = format!(
        "{{\"title\":\"Sessions need tests\",\"trigger\":\"working on {task}\",\"lesson\":\"Run the suite before settling.\",\"outcome\":\"success\",\"evidence\":[{{\"session\":\"ahp-session:/s1\",\"fromSeq\":1,\"toSeq\":{seq},\"gitHead\":null}}]}}"
    );
    assert!(
        text.contains(&format!("\"gitHead\":null}}\n\n{section}\n\nUser: do it")),
        "the lesson sits between the summary and the turns: {text}"
    );
    // A caller who may read this session but not the lesson's evidence sessions sees none:
    // here the lesson's only session is s1, so a reader of s1 sees it; a second lesson drawn
    // from s2 is hidden from a reader scoped to s1.
    ax.h.create(M, "s2");
    ax.ok(
        M,
        "_axp/comment",
        json!({"channel": "axp-session:/s2", "body": "evidence", "checkpoint": null, "path": null}),
    );
    let seq2 = ax.h.host.server_seq();
    let other = ax.ok(
        M,
        "_axp/memoryPropose",
        json!({"channel": "axp-session:/s2", "title": "Another session", "trigger": format!("for {task}"),
            "lesson": "Hidden from s1-only readers.", "outcome": "failure", "fromSeq": 1, "toSeq": seq2}),
    );
    ax.ok(
        M,
        "_axp/memoryReview",
        json!({"channel": X, "memoryId": other["id"], "revision": other["revision"], "status": "accepted"}),
    );
    let all = ax.ok(O, "_axp/context", json!({"channel": X}));
    assert_eq!(all["memoryIncluded"], 2);
    let mut h = ax.h;
    h.init(
        9,
        Principal {
            id: "scoped".into(),
            role: Role::Observer,
            sessions: SessionScope::Only(["s1".to_string()].into()),
        },
        "c9",
        &[],
    );
    let r = h.request(9, 5, "_axp/context", json!({"channel": X}));
    assert_eq!(r["result"]["memoryIncluded"], 1, "{r}");
    assert!(!r["result"]["text"]
        .as_str()
        .unwrap_or_default()
        .contains("Hidden"));
}
