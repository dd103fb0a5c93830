//! Reviews, approvals and verifications through the public surface: the whole flow, every
//! error code of the three commands in the reference's order, the trace a manifest signs, key
//! binding (for good, across restarts, undone by a failed commit, bounded), a new checkpoint
//! clearing both, and nothing revealed before it is durable.

use ring::signature::{Ed25519KeyPair, KeyPair};

use super::axp::{allowance, b64, rebuilds, role, usage, Ax, B, C, M, O, V, X};
use super::schema::check;
use super::*;
use crate::canonical::{canonical, hash_object};
use crate::log::change::{Change, Record, Table};
use crate::Commit;

/// An Ed25519 key made from a fixed seed.
struct Key(Ed25519KeyPair);

impl Key {
    fn new(seed: u8) -> Key {
        Key(Ed25519KeyPair::from_seed_unchecked(&[seed; 32]).expect("seed"))
    }

    /// SPKI PEM, as Node writes it.
    fn pem(&self) -> String {
        let mut der = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        der.extend_from_slice(self.0.public_key().as_ref());
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            b64(&der)
        )
    }

    /// `{publicKey, signature}` over the canonical JSON of `manifest`.
    fn sign(&self, manifest: &Value) -> Value {
        let sig = self.0.sign(canonical(manifest).as_bytes());
        json!({"publicKey": self.pem(), "signature": b64(sig.as_ref())})
    }
}

fn sha(c: char) -> String {
    c.to_string().repeat(40)
}

/// A review the reducer accepts (for the reducer's own test).
pub(super) fn review_json() -> Value {
    let m = json!({"version": 1, "repository": "r", "session": "ahp-session:/s1",
        "baseCommit": sha('a'), "headCommit": sha('b'), "model": "m",
        "promptHash": "c".repeat(64), "traceHash": "d".repeat(64), "traceThroughSeq": 9,
        "checkpointDigest": "e".repeat(64)});
    let contributor = Key::new(1).sign(&m);
    json!({"manifest": m, "contributor": contributor, "maintainer": null})
}

/// A verification the reducer accepts.
pub(super) fn verification_json() -> Value {
    let d = "f".repeat(64);
    json!({"headCommit": sha('b'), "verifier": "ver", "command": ["make", "test"], "exitCode": 0,
        "output": {"uri": format!("axp-blob:/axp-session%3A%2Fs1/{d}"), "sha256": d, "size": 2,
            "mediaType": "text/plain"},
        "verifiedAt": 5})
}

/// Uploads `data` to session `s1` as `conn`: its `BlobRef`.
fn put(ax: &mut Ax, conn: u64, data: &[u8]) -> Value {
    ax.ok(
        conn,
        "_axp/blobPut",
        json!({"channel": X, "data": b64(data), "mediaType": "text/plain"}),
    )
}

/// Alice records a checkpoint at epoch `epoch` with head `head` over base `a`.
fn checkpoint(ax: &mut Ax, epoch: u64, head: char) -> Value {
    let bundle = put(ax, C, b"bundle");
    let patch = put(ax, C, b"patch");
    ax.raw(
        C,
        "_axp/checkpoint",
        json!({"channel": X, "epoch": epoch, "files": [], "checkpoint": {
            "baseCommit": sha('a'), "headCommit": sha(head), "branch": "axp/s1",
            "bundle": bundle, "patch": patch, "createdAt": 0}}),
    )
}

/// Docked (alice, `e1`, grant `g`) with a checkpoint at head `b`: the epoch.
fn checkpointed(ax: &mut Ax) -> u64 {
    let epoch = ax.dock();
    let r = checkpoint(ax, epoch, 'b');
    assert!(r.get("error").is_none(), "{r}");
    epoch
}

/// The manifest a client builds, as the reference's `reviewManifest` does: the current
/// checkpoint and the export's trace and cursor.
fn manifest(ax: &mut Ax) -> Value {
    let export = ax.ok(O, "_axp/export", json!({"channel": X}));
    let x = ax.exchange();
    let trace: Vec<Value> = export["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .filter(|e| e["channel"] != "ahp-changeset:/s1")
        .cloned()
        .collect();
    json!({
        "version": 1, "repository": x["repository"], "session": x["session"],
        "baseCommit": x["checkpoint"]["baseCommit"], "headCommit": x["checkpoint"]["headCommit"],
        "model": "model-x", "promptHash": hash_object(&json!("the prompt")),
        "traceHash": hash_object(&Value::Array(trace)),
        "traceThroughSeq": export["serverSeq"],
        "checkpointDigest": hash_object(&x["checkpoint"]),
    })
}

fn review(ax: &mut Ax, conn: u64, manifest: &Value, key: &Key) -> Value {
    ax.raw(
        conn,
        "_axp/review",
        json!({"channel": X, "manifest": manifest, "contributor": key.sign(manifest)}),
    )
}

fn approve(ax: &mut Ax, conn: u64, signature: Value) -> Value {
    ax.raw(
        conn,
        "_axp/approveReview",
        json!({"channel": X, "signature": signature}),
    )
}

fn verify_params(head: char, output: &Value) -> Value {
    json!({"channel": X, "headCommit": sha(head), "command": ["cargo", "test"], "exitCode": 0,
        "output": output})
}

fn code(r: &Value) -> i64 {
    r["error"]["code"]
        .as_i64()
        .unwrap_or_else(|| panic!("succeeded: {r}"))
}

#[test]
fn a_signed_review_an_independent_approval_and_a_verification() {
    let mut ax = Ax::new();
    ax.ok(O, "subscribe", json!({"channel": X}));
    checkpointed(&mut ax);
    let m = manifest(&mut ax);
    let alice = Key::new(1);
    let mut p = json!({"channel": X, "operationId": "rv-1", "manifest": m,
        "contributor": alice.sign(&m)});
    check("axp/review.params", &p);
    let r = ax.ok(C, "_axp/review", p.clone());
    check("axp/review.result", &r);
    assert_eq!(r["manifest"], m);
    assert_eq!(r["contributor"], alice.sign(&m));
    assert_eq!(r["maintainer"], Value::Null);
    assert_eq!(ax.exchange()["review"], r);
    // The same operation again: the stored result, nothing new.
    let seq = ax.h.host.server_seq();
    assert_eq!(ax.ok(C, "_axp/review", p.clone()), r);
    assert_eq!(ax.h.host.server_seq(), seq);
    // Other input under the same operationId.
    p["manifest"]["model"] = json!("other");
    assert_eq!(ax.code(C, "_axp/review", p), -32011);

    let maintainer = Key::new(2);
    let a = json!({"channel": X, "operationId": "ap-1", "signature": maintainer.sign(&m)});
    check("axp/approve-review.params", &a);
    let approved = ax.ok(M, "_axp/approveReview", a);
    check("axp/approve-review.result", &approved);
    assert_eq!(approved["maintainer"], maintainer.sign(&m));
    assert_eq!(approved["contributor"], r["contributor"]);
    assert_eq!(ax.exchange()["review"], approved);

    let output = put(&mut ax, V, b"test result: ok");
    let mut v = verify_params('b', &output);
    v["operationId"] = json!("vf-1");
    v["exitCode"] = json!(-9007199254740991i64);
    check("axp/verify.params", &v);
    let t0 = ax.h.now;
    let r = ax.ok(V, "_axp/verify", v);
    check("axp/verify.result", &r);
    assert_eq!(r, Value::Null);
    let x = ax.exchange();
    check("axp/exchange.state", &x);
    let verification = &x["verification"];
    assert_eq!(verification["verifier"], "ver");
    assert_eq!(verification["headCommit"], sha('b'));
    assert_eq!(verification["command"], json!(["cargo", "test"]));
    assert_eq!(verification["exitCode"], -9007199254740991i64);
    assert_eq!(verification["output"], output);
    let at = verification["verifiedAt"].as_u64().expect("verifiedAt");
    assert!((t0..=ax.h.now).contains(&at), "the host's clock: {at}");

    // Observers saw each change; the export rebuilds the state.
    let frames = ax.h.drain();
    assert!(frames.is_empty(), "{frames:?}");
    let export = ax.ok(O, "_axp/export", json!({"channel": X}));
    rebuilds(&export);
    let actions: Vec<&Value> = export["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .map(|e| &e["action"])
        .filter(|a| a["type"] == "_axp/reviewChanged" || a["type"] == "_axp/verificationChanged")
        .collect();
    assert_eq!(actions.len(), 3);
    check("axp/review-changed.action", actions[0]);
    check("axp/review-changed.action", actions[1]);
    check("axp/verification-changed.action", actions[2]);
    // listSessions shows the verification as the session's latest change.
    let list = ax.ok(M, "listSessions", json!({"channel": "ahp-root://"}));
    let modified = list["items"][0]["modifiedAt"].as_str().expect("modifiedAt");
    let ms = modified
        .parse::<jiff::Timestamp>()
        .expect("iso")
        .as_millisecond();
    assert_eq!(ms as u64, at);
}

#[test]
fn observers_see_the_review_approval_and_verification_as_they_happen() {
    let mut ax = Ax::new();
    ax.ok(O, "subscribe", json!({"channel": X}));
    checkpointed(&mut ax);
    let m = manifest(&mut ax);
    ax.h.drain();
    let frames = ax.h.send(
        C,
        &json!({"jsonrpc": "2.0", "id": 77, "method": "_axp/review", "params":
            {"channel": X, "operationId": "r", "manifest": m, "contributor": Key::new(1).sign(&m)}}),
    );
    let seen: Vec<&Value> = frames
        .iter()
        .filter(|(c, _)| *c == O)
        .map(|(_, f)| &f["params"]["action"])
        .collect();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["type"], "_axp/reviewChanged");
    check("axp/review-changed.action", seen[0]);
}

#[test]
fn a_new_checkpoint_clears_the_review_and_the_verification() {
    let mut ax = Ax::new();
    let epoch = checkpointed(&mut ax);
    let m = manifest(&mut ax);
    assert!(review(&mut ax, C, &m, &Key::new(1)).get("error").is_none());
    approve(&mut ax, M, Key::new(2).sign(&m));
    let output = put(&mut ax, V, b"ok");
    ax.ok(V, "_axp/verify", verify_params('b', &output));
    let x = ax.exchange();
    assert!(x["review"]["maintainer"].is_object() && x["verification"].is_object());
    let r = checkpoint(&mut ax, epoch, 'c');
    assert!(r.get("error").is_none(), "{r}");
    let x = ax.exchange();
    assert_eq!(
        (&x["review"], &x["verification"]),
        (&Value::Null, &Value::Null)
    );
    // The old manifest and head name nothing current any more.
    assert_eq!(code(&review(&mut ax, C, &m, &Key::new(1))), -32011);
    assert_eq!(code(&approve(&mut ax, M, Key::new(2).sign(&m))), -32011);
    assert_eq!(
        ax.code(V, "_axp/verify", verify_params('b', &output)),
        -32011
    );
    // A review of the new checkpoint, by the same key, is accepted.
    let m2 = manifest(&mut ax);
    assert!(review(&mut ax, C, &m2, &Key::new(1)).get("error").is_none());
    rebuilds(&ax.ok(O, "_axp/export", json!({"channel": X})));
}

#[test]
fn review_refuses_in_the_references_order() {
    let key = Key::new(1);
    let mut ax = Ax::new();
    // Strict params first, even from an observer.
    let r = ax.raw(
        O,
        "_axp/review",
        json!({"channel": X, "manifest": {"version": 1}, "contributor": key.sign(&json!({}))}),
    );
    assert_eq!(code(&r), -32602);
    // No lease: only the lease holder may submit.
    let placeholder = review_json()["manifest"].clone();
    for conn in [C, M, O, V] {
        assert_eq!(code(&review(&mut ax, conn, &placeholder, &key)), -32009);
    }
    let epoch = ax.dock();
    // Another contributor, and the maintainer, do not hold the lease.
    assert_eq!(code(&review(&mut ax, B, &placeholder, &key)), -32009);
    assert_eq!(code(&review(&mut ax, M, &placeholder, &key)), -32009);
    // No checkpoint yet.
    assert_eq!(code(&review(&mut ax, C, &placeholder, &key)), -32011);
    checkpoint(&mut ax, epoch, 'b');
    let m = manifest(&mut ax);
    // A reserved turn.
    ax.prompt("t1");
    assert!(ax.reserve(epoch, "t1", 100).get("error").is_none());
    assert_eq!(code(&review(&mut ax, C, &m, &key)), -32011);
    ax.ok(
        C,
        "_axp/settle",
        json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": usage(1, 1, 0, 1), "outcome": "complete"}),
    );
    let m = manifest(&mut ax);
    // The manifest must name the current checkpoint exactly.
    for (field, value) in [
        ("repository", json!("another/repo")),
        ("session", json!("ahp-session:/s2")),
        ("baseCommit", json!(sha('f'))),
        ("headCommit", json!(sha('f'))),
    ] {
        let mut bad = m.clone();
        bad[field] = value;
        assert_eq!(code(&review(&mut ax, C, &bad, &key)), -32011, "{field}");
    }
    let mut bad = m.clone();
    bad["checkpointDigest"] = json!("0".repeat(64));
    assert_eq!(code(&review(&mut ax, C, &bad, &key)), -32602);
    let mut bad = m.clone();
    bad["traceThroughSeq"] = json!(ax.h.host.server_seq() + 1);
    assert_eq!(code(&review(&mut ax, C, &bad, &key)), -32602);
    // A trace that ends before the checkpoint.
    let export = ax.ok(O, "_axp/export", json!({"channel": X}));
    let checkpoint_seq = export["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .rfind(|e| e["action"]["type"] == "_axp/checkpointChanged")
        .and_then(|e| e["serverSeq"].as_u64())
        .expect("checkpoint event");
    let mut bad = m.clone();
    bad["traceThroughSeq"] = json!(checkpoint_seq - 1);
    assert_eq!(code(&review(&mut ax, C, &bad, &key)), -32602);
    let mut bad = m.clone();
    bad["traceHash"] = json!("0".repeat(64));
    assert_eq!(code(&review(&mut ax, C, &bad, &key)), -32602);
    // A signature over another manifest, and one that is not base64 of a signature.
    let mut other = m.clone();
    other["model"] = json!("another model");
    let p = json!({"channel": X, "manifest": m, "contributor": key.sign(&other)});
    assert_eq!(ax.code(C, "_axp/review", p), -32602);
    let p = json!({"channel": X, "manifest": m,
        "contributor": {"publicKey": key.pem(), "signature": "not base64!"}});
    assert_eq!(ax.code(C, "_axp/review", p), -32602);
    let p = json!({"channel": X, "manifest": m,
        "contributor": {"publicKey": "not a key", "signature": key.sign(&m)["signature"]}});
    assert_eq!(ax.code(C, "_axp/review", p), -32602);
    // Nothing refused changed anything; the right one passes.
    assert_eq!(ax.exchange()["review"], Value::Null);
    assert!(review(&mut ax, C, &m, &key).get("error").is_none());
    // A later manifest over events after the checkpoint, with its own cursor, passes too.
    ax.ok(
        M,
        "_axp/comment",
        json!({"channel": X, "body": "after", "checkpoint": null, "path": null}),
    );
    let later = manifest(&mut ax);
    assert!(later["traceThroughSeq"].as_u64() > m["traceThroughSeq"].as_u64());
    assert!(review(&mut ax, C, &later, &key).get("error").is_none());
    // And the earlier one is still a valid prefix of the log.
    assert!(review(&mut ax, C, &m, &key).get("error").is_none());
}

#[test]
fn review_is_fenced() {
    let key = Key::new(1);
    // An expired lease whose timer has not run yet.
    let mut ax = Ax::new();
    checkpointed(&mut ax);
    let m = manifest(&mut ax);
    ax.h.now += 31_000;
    assert_eq!(code(&review(&mut ax, C, &m, &key)), -32040);
    // An overspend revokes the grant and keeps the lease: the budget answer comes first.
    let mut ax = Ax::new();
    let epoch = checkpointed(&mut ax);
    ax.prompt("t1");
    assert!(ax.reserve(epoch, "t1", 100).get("error").is_none());
    ax.ok(
        C,
        "_axp/settle",
        json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": usage(20_000, 0, 0, 1), "outcome": "complete"}),
    );
    let x = ax.exchange();
    assert_eq!(
        (
            x["grants"]["g"]["revoked"].clone(),
            x["lease"]["owner"].clone()
        ),
        (json!(true), json!("alice"))
    );
    let m = manifest(&mut ax);
    assert_eq!(code(&review(&mut ax, C, &m, &key)), -32041);
}

#[test]
fn approval_refuses_in_the_references_order() {
    let (alice, maintainer) = (Key::new(1), Key::new(2));
    let mut ax = Ax::new();
    let r = ax.raw(
        M,
        "_axp/approveReview",
        json!({"channel": X, "signature": {"publicKey": 1}}),
    );
    assert_eq!(code(&r), -32602);
    // Only maintainers.
    for conn in [C, B, O, V] {
        assert_eq!(
            code(&approve(&mut ax, conn, maintainer.sign(&json!({})))),
            -32009
        );
    }
    // No review.
    assert_eq!(
        code(&approve(&mut ax, M, maintainer.sign(&json!({})))),
        -32011
    );
    checkpointed(&mut ax);
    assert_eq!(
        code(&approve(&mut ax, M, maintainer.sign(&json!({})))),
        -32011
    );
    let m = manifest(&mut ax);
    assert!(review(&mut ax, C, &m, &alice).get("error").is_none());
    // The contributor's own key, in any layout, is not independent.
    assert_eq!(code(&approve(&mut ax, M, alice.sign(&m))), -32602);
    let mut crlf = alice.sign(&m);
    crlf["publicKey"] = json!(alice.pem().replace('\n', "\r\n"));
    assert_eq!(code(&approve(&mut ax, M, crlf)), -32602);
    // A signature over something else.
    assert_eq!(
        code(&approve(&mut ax, M, maintainer.sign(&json!({"x": 1})))),
        -32602
    );
    assert_eq!(ax.exchange()["review"]["maintainer"], Value::Null);
    assert!(approve(&mut ax, M, maintainer.sign(&m))
        .get("error")
        .is_none());
    // Approving again replaces the approval (the reference allows it).
    assert!(approve(&mut ax, M, maintainer.sign(&m))
        .get("error")
        .is_none());
}

#[test]
fn the_lease_holder_cannot_approve_its_own_work() {
    let mut ax = Ax::new();
    ax.h.init(6, Principal::maintainer("m2"), "c6", &[]);
    // The maintainer runs the executor itself.
    ax.grant(M, "gm", allowance(1000, 1000, 5));
    let lease = ax.claim(M, "em", "gm");
    let epoch = lease["result"]["epoch"].as_u64().expect("epoch");
    let bundle = put(&mut ax, M, b"bundle");
    let patch = put(&mut ax, M, b"patch");
    ax.ok(
        M,
        "_axp/checkpoint",
        json!({"channel": X, "epoch": epoch, "files": [], "checkpoint": {
            "baseCommit": sha('a'), "headCommit": sha('b'), "branch": "b",
            "bundle": bundle, "patch": patch, "createdAt": 0}}),
    );
    let m = manifest(&mut ax);
    assert!(review(&mut ax, M, &m, &Key::new(1)).get("error").is_none());
    assert_eq!(code(&approve(&mut ax, M, Key::new(2).sign(&m))), -32009);
    // Another maintainer may.
    let r = ax.raw(
        6,
        "_axp/approveReview",
        json!({"channel": X, "signature": Key::new(2).sign(&m)}),
    );
    assert!(r.get("error").is_none(), "{r}");
}

#[test]
fn verify_refuses_in_the_references_order() {
    let mut ax = Ax::new();
    ax.h.create(M, "s2");
    let r = ax.raw(
        V,
        "_axp/verify",
        json!({"channel": X, "headCommit": sha('b'), "command": [], "exitCode": 0, "output": {}}),
    );
    assert_eq!(code(&r), -32602);
    let output = put(&mut ax, V, b"ok");
    // A separate verifier identity only.
    for conn in [M, C, B, O] {
        assert_eq!(
            ax.code(conn, "_axp/verify", verify_params('b', &output)),
            -32009
        );
    }
    // No checkpoint, then another head.
    assert_eq!(
        ax.code(V, "_axp/verify", verify_params('b', &output)),
        -32011
    );
    checkpointed(&mut ax);
    assert_eq!(
        ax.code(V, "_axp/verify", verify_params('c', &output)),
        -32011
    );
    // The output must be a blob of this session, named exactly.
    let elsewhere = ax.ok(
        V,
        "_axp/blobPut",
        json!({"channel": "axp-session:/s2", "data": b64(b"other"), "mediaType": "text/plain"}),
    );
    let mut borrowed = elsewhere.clone();
    borrowed["uri"] = json!(output["uri"].as_str().expect("uri").replace(
        output["sha256"].as_str().expect("d"),
        elsewhere["sha256"].as_str().expect("d")
    ));
    let mut wrong_size = output.clone();
    wrong_size["size"] = json!(3);
    let mut wrong_uri = output.clone();
    wrong_uri["uri"] = json!(format!(
        "axp-blob:/axp-session:%2Fs1/{}",
        output["sha256"].as_str().expect("d")
    ));
    let mut missing = output.clone();
    missing["sha256"] = json!("0".repeat(64));
    for bad in [elsewhere, borrowed, wrong_size, wrong_uri, missing] {
        assert_eq!(
            ax.code(V, "_axp/verify", verify_params('b', &bad)),
            -32009,
            "{bad}"
        );
    }
    assert_eq!(ax.exchange()["verification"], Value::Null);
    // The media type is the client's label and is not compared.
    let mut relabelled = output.clone();
    relabelled["mediaType"] = json!("application/json");
    assert_eq!(
        ax.ok(V, "_axp/verify", verify_params('b', &relabelled)),
        Value::Null
    );
}

#[test]
fn a_signing_key_is_bound_for_good_across_restarts() {
    let (a, b, c) = (Key::new(1), Key::new(2), Key::new(3));
    let mut ax = Ax::new();
    let epoch = checkpointed(&mut ax);
    let m = manifest(&mut ax);
    assert!(review(&mut ax, C, &m, &a).get("error").is_none());
    assert!(ax
        .h
        .host
        .store()
        .record_text(Table::SigningKey, "alice")
        .is_some());
    // Another key for the same principal.
    assert_eq!(code(&review(&mut ax, C, &m, &b)), -32009);
    // The same key in another layout is the same key.
    let mut crlf = a.sign(&m);
    crlf["publicKey"] = json!(a.pem().replace('\n', "\r\n"));
    let r = ax.raw(
        C,
        "_axp/review",
        json!({"channel": X, "manifest": m, "contributor": crlf}),
    );
    assert!(r.get("error").is_none(), "{r}");
    assert!(approve(&mut ax, M, c.sign(&m)).get("error").is_none());
    assert_eq!(code(&approve(&mut ax, M, b.sign(&m))), -32009);
    // A restart keeps the bindings.
    let store = ax.h.host.into_store();
    let mut ax = Ax::bare(HostConfig::default(), store);
    let lease = ax.raw(
        C,
        "_axp/claim",
        json!({"channel": X, "executorId": "e1", "grantId": "g", "leaseMs": 30_000, "resumeEpoch": epoch}),
    );
    let epoch = lease["result"]["epoch"].as_u64().expect("epoch");
    checkpoint(&mut ax, epoch, 'c');
    let m = manifest(&mut ax);
    assert_eq!(code(&review(&mut ax, C, &m, &b)), -32009);
    assert!(review(&mut ax, C, &m, &a).get("error").is_none());
    assert_eq!(code(&approve(&mut ax, M, b.sign(&m))), -32009);
    assert!(approve(&mut ax, M, c.sign(&m)).get("error").is_none());
}

#[test]
fn a_failed_commit_takes_back_a_binding_and_nothing_is_revealed_before_durable() {
    let mut ax = Ax::new();
    ax.ok(O, "subscribe", json!({"channel": X}));
    checkpointed(&mut ax);
    let m = manifest(&mut ax);
    ax.h.hold_commits(true);
    let frames = ax.h.send(
        C,
        &json!({"jsonrpc": "2.0", "id": 500, "method": "_axp/review", "params":
            {"channel": X, "operationId": "held", "manifest": m, "contributor": Key::new(1).sign(&m)}}),
    );
    assert!(frames.is_empty(), "nothing before durable: {frames:?}");
    // The disk fails: the sender gets -32603, observers nothing, and the key is not bound.
    let mut frames = ax.h.fail_first();
    // The failure's answer waits for the reservation that covers the numbers it handed out.
    frames.extend(ax.h.complete(1));
    let answer = frames
        .iter()
        .find(|(c, f)| *c == C && f["id"] == 500)
        .map(|(_, f)| f.clone())
        .unwrap_or_else(|| panic!("answered: {frames:?}"));
    assert_eq!(answer["error"]["code"], -32603);
    assert!(frames.iter().all(|(c, f)| *c != O
        || f.get("close").is_some()
        || f["params"]["action"]["type"] != "_axp/reviewChanged"));
    assert!(ax
        .h
        .host
        .store()
        .record_text(Table::SigningKey, "alice")
        .is_none());
    ax.h.hold_commits(false);
    if frames
        .iter()
        .any(|(c, f)| *c == C && f.get("close").is_some())
    {
        ax.h.init(C, role("alice", Role::Contributor), "c2", &[]);
    }
    // Alice signs with another key: the first was never bound.
    let m = manifest(&mut ax);
    assert!(review(&mut ax, C, &m, &Key::new(7)).get("error").is_none());
    assert_eq!(code(&review(&mut ax, C, &m, &Key::new(1))), -32009);
    // Held again: the answer and the event leave together once durable.
    ax.h.hold_commits(true);
    let p = json!({"channel": X, "operationId": "held-2", "manifest": m, "contributor": Key::new(7).sign(&m)});
    let frames = ax.h.send(
        C,
        &json!({"jsonrpc": "2.0", "id": 501, "method": "_axp/review", "params": p}),
    );
    assert!(frames.is_empty(), "{frames:?}");
    let frames = ax.h.complete(1);
    assert!(frames
        .iter()
        .any(|(c, f)| *c == C && f["id"] == 501 && f.get("result").is_some()));
    assert!(frames
        .iter()
        .any(|(c, f)| *c == O && f["params"]["action"]["type"] == "_axp/reviewChanged"));
}

#[test]
fn signing_keys_are_bounded() {
    let mut store = MemStore::new();
    let full: Vec<Record> = (0..crate::limits::SIGNING_KEYS_MAX)
        .map(|i| {
            Record::json(
                Table::SigningKey,
                format!("p{i}"),
                &json!({"ed25519": "11".repeat(32)}).to_string(),
            )
        })
        .collect();
    store
        .commit(&Change {
            number: 1,
            records: full,
            ..Change::default()
        })
        .expect("commit");
    let mut ax = Ax::with(HostConfig::default(), store);
    checkpointed(&mut ax);
    let m = manifest(&mut ax);
    assert_eq!(code(&review(&mut ax, C, &m, &Key::new(1))), -32043);
    assert_eq!(ax.exchange()["review"], Value::Null);
}

#[test]
fn a_trace_larger_than_an_export_is_refused() {
    let mut ax = Ax::limits(Limits {
        chat_bytes_max: 64 * 1024 * 1024,
        ..Limits::default()
    });
    let epoch = checkpointed(&mut ax);
    ax.prompt("t1");
    assert!(ax.reserve(epoch, "t1", 100).get("error").is_none());
    let part = json!({"type":"chat/responsePart","turnId":"t1","part":{"kind":"markdown","id":"p","content":""}});
    assert!(ax.emit(epoch, json!([part])).get("error").is_none());
    let text = "x".repeat(60_000);
    let mut bytes = 0;
    while bytes <= crate::axp::review::TRACE_BYTES_MAX {
        let d = json!({"type":"chat/delta","turnId":"t1","partId":"p","content":text});
        let r = ax.emit(epoch, json!([d]));
        assert!(r.get("error").is_none(), "{r}");
        bytes += text.len();
    }
    ax.ok(
        C,
        "_axp/settle",
        json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": null, "outcome": "complete"}),
    );
    assert_eq!(ax.code(O, "_axp/export", json!({"channel": X})), -32043);
    let x = ax.exchange();
    let m = json!({"version": 1, "repository": x["repository"], "session": x["session"],
        "baseCommit": sha('a'), "headCommit": sha('b'), "model": "m",
        "promptHash": "0".repeat(64), "traceHash": "0".repeat(64),
        "traceThroughSeq": ax.h.host.server_seq(),
        "checkpointDigest": hash_object(&x["checkpoint"])});
    assert_eq!(code(&review(&mut ax, C, &m, &Key::new(1))), -32043);
}
