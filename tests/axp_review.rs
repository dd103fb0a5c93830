//! Signed reviews and verification against the real `axhost serve` over real WebSocket: the
//! artifact flow (blobs, a checkpoint, the contributor's signed review, an independent
//! maintainer's approval, a verifier's run), every error code of `_axp/review`,
//! `_axp/approveReview` and `_axp/verify`, signing keys bound for good across a restart, and a
//! new checkpoint clearing review and verification.
//!
//! Signatures come from ed25519-dalek, not the host's Ed25519 (ring); canonical JSON and the
//! trace hash are computed here from what the wire shows, as a client does (the reference's
//! `reviewManifest`): `traceHash = hashObject(export.actions less the changeset's)`,
//! `traceThroughSeq = export.serverSeq`. Written against `../shared/reference/axp-host-notes.md`
//! §10 and §15.13; codes are matched, never messages. `-32040` (a lease that expired but has
//! not been ended yet) cannot be produced from outside, because the host ends a lease at its
//! deadline; the core's tests (`core/src/tests/axp_review.rs`) cover it, and the key table's
//! bound (`-32043` at 10,000 principals).

mod axp_support;
mod common;

use axp_support::*;
use common::*;
use ed25519_dalek::{Signer, SigningKey};
use serde_json::{json, Value};

// ─── An independent signer ───────────────────────────────────────────────────

/// Canonical JSON as JavaScript writes it: keys sorted by UTF-16 code units at every depth.
fn canonical(v: &Value) -> String {
    match v {
        Value::Array(items) => {
            let inner: Vec<String> = items.iter().map(canonical).collect();
            format!("[{}]", inner.join(","))
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            let inner: Vec<String> = keys
                .iter()
                .map(|k| {
                    format!(
                        "{}:{}",
                        Value::from(k.as_str()),
                        canonical(&map[k.as_str()])
                    )
                })
                .collect();
            format!("{{{}}}", inner.join(","))
        }
        // Strings and the integers these tests carry are written as JSON.stringify writes them.
        other => other.to_string(),
    }
}

fn hash_object(v: &Value) -> String {
    sha256_hex(canonical(v).as_bytes())
}

struct Key(SigningKey);

impl Key {
    fn new(seed: u8) -> Key {
        Key(SigningKey::from_bytes(&[seed; 32]))
    }

    /// SPKI PEM (RFC 8410), built here byte by byte.
    fn pem(&self) -> String {
        let mut der = vec![
            0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
        ];
        der.extend_from_slice(&self.0.verifying_key().to_bytes());
        format!(
            "-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n",
            b64(&der)
        )
    }

    fn sign(&self, manifest: &Value) -> Value {
        let signature = self.0.sign(canonical(manifest).as_bytes());
        json!({"publicKey": self.pem(), "signature": b64(&signature.to_bytes())})
    }
}

// ─── Steps of the flow ───────────────────────────────────────────────────────

fn sha(c: char) -> String {
    c.to_string().repeat(40)
}

fn put(ws: &mut Ws, id: &str, data: &[u8], media_type: &str) -> Value {
    ws.axp(
        "_axp/blobPut",
        json!({"channel": exchange(id), "data": b64(data), "mediaType": media_type}),
    )
}

/// The executor's checkpoint of head `head` on session `id`: bundle and patch uploaded, one
/// changed file.
fn checkpoint_params(ws: &mut Ws, id: &str, epoch: u64, head: char) -> Value {
    let bundle = put(ws, id, b"git bundle bytes", "application/x-git-bundle");
    let patch = put(ws, id, b"diff --git a/x b/x", "text/x-diff");
    let before = put(
        ws,
        id,
        b"fn add(a: i32, b: i32) -> i32 { a - b }",
        "application/octet-stream",
    );
    let after = put(
        ws,
        id,
        b"fn add(a: i32, b: i32) -> i32 { a + b }",
        "application/octet-stream",
    );
    let file = format!("axp-file:/{}/src%2Flib.rs", encode_component(&exchange(id)));
    json!({"channel": exchange(id), "epoch": epoch, "checkpoint": {
        "baseCommit": sha('a'), "headCommit": sha(head), "branch": format!("axp/{id}"),
        "bundle": bundle, "patch": patch, "createdAt": 0},
        "files": [{"id": file, "edit": {
            "before": {"uri": file, "content": {"uri": before["uri"]}},
            "after": {"uri": file, "content": {"uri": after["uri"]}}}}]})
}

fn checkpoint(ws: &mut Ws, id: &str, epoch: u64, head: char) {
    let p = checkpoint_params(ws, id, epoch, head);
    assert_eq!(ws.axp("_axp/checkpoint", p), Value::Null);
}

/// The manifest of session `id`'s current checkpoint, built from the wire as a client builds it.
fn manifest(host: &HostProcess, id: &str) -> Value {
    let archive = export(host, id);
    let x = state(host, &exchange(id));
    let channels = [exchange(id), session(id), chat(id)];
    let trace: Vec<Value> = archive["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .filter(|e| channels.iter().any(|c| e["channel"] == c.as_str()))
        .cloned()
        .collect();
    json!({
        "version": 1, "repository": x["repository"], "session": session(id),
        "baseCommit": x["checkpoint"]["baseCommit"], "headCommit": x["checkpoint"]["headCommit"],
        "model": "test-model", "promptHash": hash_object(&json!("Fix addition")),
        "traceHash": hash_object(&Value::Array(trace)),
        "traceThroughSeq": archive["serverSeq"],
        "checkpointDigest": hash_object(&x["checkpoint"]),
    })
}

fn review_params(id: &str, manifest: &Value, key: &Key) -> Value {
    json!({"channel": exchange(id), "manifest": manifest, "contributor": key.sign(manifest)})
}

fn approve_params(id: &str, signature: Value) -> Value {
    json!({"channel": exchange(id), "signature": signature})
}

fn verify_params(id: &str, head: char, output: &Value) -> Value {
    json!({"channel": exchange(id), "headCommit": sha(head), "command": ["cargo", "test"],
           "exitCode": 0, "output": output})
}

/// A host with session `s1`, alice docked (epoch 1) and a checkpoint at head `b`.
fn checkpointed() -> (HostProcess, Ws, Ws) {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    register(&mut alice, "e", 30_000);
    let epoch = dock(&mut alice, "s1");
    checkpoint(&mut alice, "s1", epoch, 'b');
    (host, admin, alice)
}

// ─── The flow ────────────────────────────────────────────────────────────────

#[test]
fn review_approval_and_verification_of_a_checkpoint() {
    let (host, _admin, mut alice) = checkpointed();
    let (mut olga, _) = connect_with(&host, OLGA, &[&exchange("s1")]);
    let m = manifest(&host, "s1");
    let contributor = Key::new(11);
    let review = alice.axp("_axp/review", review_params("s1", &m, &contributor));
    assert_eq!(review["manifest"], m);
    assert_eq!(review["contributor"], contributor.sign(&m));
    assert_eq!(review["maintainer"], Value::Null);

    let mut mark = connect(&host, MARK);
    let maintainer = Key::new(22);
    let approved = mark.axp(
        "_axp/approveReview",
        approve_params("s1", maintainer.sign(&m)),
    );
    assert_eq!(approved["maintainer"], maintainer.sign(&m));
    assert_eq!(approved["manifest"], m);

    let mut vera = connect(&host, VERA);
    let output = put(&mut vera, "s1", b"test result: ok. 12 passed", "text/plain");
    let before = now_ms();
    assert_eq!(
        vera.axp("_axp/verify", verify_params("s1", 'b', &output)),
        Value::Null
    );
    let after = now_ms();

    let x = state(&host, &exchange("s1"));
    assert_eq!(x["review"], approved);
    let v = &x["verification"];
    assert_eq!(v["verifier"], VERA);
    assert_eq!(v["headCommit"], sha('b'));
    assert_eq!(v["command"], json!(["cargo", "test"]));
    assert_eq!(v["exitCode"], 0);
    assert_eq!(v["output"], output);
    let at = v["verifiedAt"].as_u64().expect("verifiedAt");
    assert!((before..=after).contains(&at), "the host's clock: {at}");
    // Both signatures verify here too, with keys that differ.
    assert_ne!(
        x["review"]["contributor"]["publicKey"],
        x["review"]["maintainer"]["publicKey"]
    );

    // The observer saw each step, in order, with the states as shown.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let f = olga.recv();
        if f["method"] == "action" {
            let a = &f["params"]["action"];
            if a["type"] == "_axp/reviewChanged" || a["type"] == "_axp/verificationChanged" {
                seen.push(a.clone());
            }
        }
    }
    assert_eq!(
        seen[0],
        json!({"type": "_axp/reviewChanged", "review": review})
    );
    assert_eq!(
        seen[1],
        json!({"type": "_axp/reviewChanged", "review": approved})
    );
    assert_eq!(
        seen[2],
        json!({"type": "_axp/verificationChanged", "verification": v})
    );

    // A later manifest (the trace has grown) is accepted as well; the same key.
    let m2 = manifest(&host, "s1");
    assert!(m2["traceThroughSeq"].as_u64() > m["traceThroughSeq"].as_u64());
    alice.axp("_axp/review", review_params("s1", &m2, &contributor));
}

#[test]
fn a_new_checkpoint_invalidates_review_and_verification() {
    let (host, _admin, mut alice) = checkpointed();
    let m = manifest(&host, "s1");
    alice.axp("_axp/review", review_params("s1", &m, &Key::new(11)));
    let mut mark = connect(&host, MARK);
    mark.axp(
        "_axp/approveReview",
        approve_params("s1", Key::new(22).sign(&m)),
    );
    let mut vera = connect(&host, VERA);
    let output = put(&mut vera, "s1", b"ok", "text/plain");
    vera.axp("_axp/verify", verify_params("s1", 'b', &output));

    checkpoint(&mut alice, "s1", 1, 'c');
    let x = state(&host, &exchange("s1"));
    assert_eq!(x["checkpoint"]["headCommit"], sha('c'));
    assert_eq!(
        (&x["review"], &x["verification"]),
        (&Value::Null, &Value::Null)
    );
    // Nothing names the old head any more.
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &m, &Key::new(11))),
        CONFLICT
    );
    assert_eq!(
        mark.axp_code(
            "_axp/approveReview",
            approve_params("s1", Key::new(22).sign(&m))
        ),
        CONFLICT
    );
    assert_eq!(
        vera.axp_code("_axp/verify", verify_params("s1", 'b', &output)),
        CONFLICT
    );
    // The export replays to the same: the reviews and verification, then the clearing checkpoint.
    let types: Vec<String> = export(&host, "s1")["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .filter_map(|e| e["action"]["type"].as_str().map(str::to_owned))
        .filter(|t| {
            t.starts_with("_axp/review")
                || t.starts_with("_axp/verif")
                || t.starts_with("_axp/checkpoint")
        })
        .collect();
    assert_eq!(
        types,
        [
            "_axp/checkpointChanged",
            "_axp/reviewChanged",
            "_axp/reviewChanged",
            "_axp/verificationChanged",
            "_axp/checkpointChanged"
        ]
    );
}

// ─── Errors ──────────────────────────────────────────────────────────────────

#[test]
fn review_errors() {
    let (host, mut admin, mut alice) = checkpointed();
    let key = Key::new(11);
    let m = manifest(&host, "s1");
    // Strict params.
    for bad in [
        with(review_params("s1", &m, &key), "manifest.version", json!(2)),
        with(
            review_params("s1", &m, &key),
            "manifest.traceHash",
            json!("ABC"),
        ),
        with(review_params("s1", &m, &key), "contributor.extra", json!(1)),
        without(review_params("s1", &m, &key), "", "contributor"),
        with(
            review_params("s1", &m, &key),
            "contributor.signature",
            json!("s".repeat(257)),
        ),
    ] {
        assert_eq!(alice.axp_code("_axp/review", bad), PARAMS);
    }
    // Only the lease holder: another contributor, a maintainer, a verifier, an observer.
    for who in [BOB, ADMIN, VERA, OLGA] {
        let mut ws = connect(&host, who);
        assert_eq!(
            ws.axp_code("_axp/review", review_params("s1", &m, &key)),
            FORBIDDEN,
            "{who}"
        );
    }
    // The manifest must name the current checkpoint.
    for (field, value) in [
        ("manifest.repository", json!("other")),
        ("manifest.session", json!(session("s2"))),
        ("manifest.baseCommit", json!(sha('f'))),
        ("manifest.headCommit", json!(sha('f'))),
    ] {
        let bad = with(m.clone(), &field["manifest.".len()..], value);
        assert_eq!(
            alice.axp_code("_axp/review", review_params("s1", &bad, &key)),
            CONFLICT,
            "{field}"
        );
    }
    // Digests and the trace.
    let digest = with(m.clone(), "checkpointDigest", json!("0".repeat(64)));
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &digest, &key)),
        PARAMS
    );
    let future = with(
        m.clone(),
        "traceThroughSeq",
        json!(m["traceThroughSeq"].as_u64().expect("seq") + 1000),
    );
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &future, &key)),
        PARAMS
    );
    let early = with(m.clone(), "traceThroughSeq", json!(1));
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &early, &key)),
        PARAMS
    );
    let trace = with(m.clone(), "traceHash", json!("0".repeat(64)));
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &trace, &key)),
        PARAMS
    );
    // A signature over another manifest, or by a key that is not the one named.
    let signed_other = with(
        review_params("s1", &m, &key),
        "contributor",
        key.sign(&trace),
    );
    assert_eq!(alice.axp_code("_axp/review", signed_other), PARAMS);
    let wrong_key = with(
        review_params("s1", &m, &key),
        "contributor.publicKey",
        json!(Key::new(12).pem()),
    );
    assert_eq!(alice.axp_code("_axp/review", wrong_key), PARAMS);
    assert_eq!(state(&host, &exchange("s1"))["review"], Value::Null);
    // Accepted; then the key is alice's for good.
    alice.axp("_axp/review", review_params("s1", &m, &key));
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &m, &Key::new(12))),
        FORBIDDEN
    );
    // A reserved turn.
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", 1, "t1", 1_000, 1_000);
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &m, &key)),
        CONFLICT
    );
    // An overspend revokes the grant and keeps the lease: the budget answer comes first.
    alice.axp(
        "_axp/settle",
        settle_params("s1", 1, "t1", usage(200_000, 0, 0, 1), "complete"),
    );
    let x = state(&host, &exchange("s1"));
    assert_eq!(
        (&x["grants"]["g"]["revoked"], &x["lease"]["owner"]),
        (&json!(true), &json!(ALICE))
    );
    assert_eq!(
        alice.axp_code(
            "_axp/review",
            review_params("s1", &manifest(&host, "s1"), &key)
        ),
        BUDGET
    );
}

#[test]
fn a_review_without_a_checkpoint_is_a_conflict() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    dock(&mut alice, "s1");
    let m = json!({"version": 1, "repository": "r", "session": session("s1"), "baseCommit": sha('a'),
        "headCommit": sha('b'), "model": "m", "promptHash": "0".repeat(64), "traceHash": "0".repeat(64),
        "traceThroughSeq": 1, "checkpointDigest": "0".repeat(64)});
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &m, &Key::new(11))),
        CONFLICT
    );
}

#[test]
fn approval_errors() {
    let (host, mut admin, mut alice) = checkpointed();
    let (contributor, maintainer) = (Key::new(11), Key::new(22));
    let m = manifest(&host, "s1");
    assert_eq!(
        admin.axp_code(
            "_axp/approveReview",
            json!({"channel": exchange("s1"), "signature": {}})
        ),
        PARAMS
    );
    // No review yet.
    assert_eq!(
        admin.axp_code(
            "_axp/approveReview",
            approve_params("s1", maintainer.sign(&m))
        ),
        CONFLICT
    );
    alice.axp("_axp/review", review_params("s1", &m, &contributor));
    // Maintainers only.
    for who in [ALICE, BOB, VERA, OLGA] {
        let mut ws = connect(&host, who);
        assert_eq!(
            ws.axp_code(
                "_axp/approveReview",
                approve_params("s1", maintainer.sign(&m))
            ),
            FORBIDDEN,
            "{who}"
        );
    }
    // Not independent: the contributor's key, also in another layout; a bad signature.
    assert_eq!(
        admin.axp_code(
            "_axp/approveReview",
            approve_params("s1", contributor.sign(&m))
        ),
        PARAMS
    );
    let crlf = with(
        contributor.sign(&m),
        "publicKey",
        json!(contributor.pem().replace('\n', "\r\n")),
    );
    assert_eq!(
        admin.axp_code("_axp/approveReview", approve_params("s1", crlf)),
        PARAMS
    );
    let other = with(m.clone(), "model", json!("another"));
    assert_eq!(
        admin.axp_code(
            "_axp/approveReview",
            approve_params("s1", maintainer.sign(&other))
        ),
        PARAMS
    );
    admin.axp(
        "_axp/approveReview",
        approve_params("s1", maintainer.sign(&m)),
    );
    // The approving maintainer's key is now bound.
    assert_eq!(
        admin.axp_code(
            "_axp/approveReview",
            approve_params("s1", Key::new(23).sign(&m))
        ),
        FORBIDDEN
    );

    // A maintainer holding the lease cannot approve its own work; another maintainer can.
    create(&mut admin, "s2");
    grant(&mut admin, "s2", "gm", donation());
    let lease = claim(&mut admin, "s2", "em", "gm", 30_000);
    let epoch = lease["epoch"].as_u64().expect("epoch");
    checkpoint(&mut admin, "s2", epoch, 'b');
    let m2 = manifest(&host, "s2");
    admin.axp("_axp/review", review_params("s2", &m2, &maintainer));
    assert_eq!(
        admin.axp_code(
            "_axp/approveReview",
            approve_params("s2", maintainer.sign(&m2))
        ),
        FORBIDDEN
    );
    let mut mark = connect(&host, MARK);
    mark.axp(
        "_axp/approveReview",
        approve_params("s2", Key::new(33).sign(&m2)),
    );
}

#[test]
fn verify_errors() {
    let (host, mut admin, _alice) = checkpointed();
    create(&mut admin, "s2");
    let mut vera = connect(&host, VERA);
    let output = put(&mut vera, "s1", b"ok", "text/plain");
    let p = verify_params("s1", 'b', &output);
    for bad in [
        with(p.clone(), "command", json!([])),
        with(p.clone(), "exitCode", json!(1.5)),
        with(p.clone(), "headCommit", json!("HEAD")),
        without(p.clone(), "output", "size"),
    ] {
        assert_eq!(vera.axp_code("_axp/verify", bad), PARAMS);
    }
    // The verifier role only.
    for who in [ADMIN, MARK, ALICE, OLGA] {
        let mut ws = connect(&host, who);
        assert_eq!(ws.axp_code("_axp/verify", p.clone()), FORBIDDEN, "{who}");
    }
    // The exact head.
    assert_eq!(
        vera.axp_code("_axp/verify", verify_params("s1", 'c', &output)),
        CONFLICT
    );
    let long = json!({"channel": exchange("s1"), "headCommit": "b".repeat(64), "command": ["x"], "exitCode": 0, "output": output});
    assert_eq!(vera.axp_code("_axp/verify", long), CONFLICT);
    // A blob of this session, by its exact URI and size.
    let elsewhere = put(&mut vera, "s2", b"ok elsewhere", "text/plain");
    assert_eq!(
        vera.axp_code("_axp/verify", verify_params("s1", 'b', &elsewhere)),
        FORBIDDEN
    );
    assert_eq!(
        vera.axp_code(
            "_axp/verify",
            verify_params("s1", 'b', &with(output.clone(), "size", json!(3)))
        ),
        FORBIDDEN
    );
    let unknown = with(
        output.clone(),
        "sha256",
        json!(sha256_hex(b"never uploaded")),
    );
    assert_eq!(
        vera.axp_code("_axp/verify", verify_params("s1", 'b', &unknown)),
        FORBIDDEN
    );
    assert_eq!(state(&host, &exchange("s1"))["verification"], Value::Null);
    assert_eq!(vera.axp("_axp/verify", p), Value::Null);
}

#[test]
fn signing_keys_stay_bound_across_a_restart_and_retries_get_the_stored_answer() {
    let (mut host, _admin, mut alice) = checkpointed();
    let m = manifest(&host, "s1");
    let p = with(
        review_params("s1", &m, &Key::new(11)),
        "operationId",
        json!("review-1"),
    );
    let first = alice.axp("_axp/review", p.clone());
    assert_eq!(alice.axp("_axp/review", p.clone()), first);
    assert_eq!(
        alice.axp_code("_axp/review", with(p, "manifest.model", json!("x"))),
        CONFLICT
    );
    drop(alice);
    host.restart();
    // The restart orphaned the lease: alice resumes it, checkpoints again, and must sign with
    // the same key.
    let mut alice = connect(&host, ALICE);
    let lease = alice.axp(
        "_axp/claim",
        with(
            claim_params("s1", "e", "g", 30_000),
            "resumeEpoch",
            json!(1),
        ),
    );
    let epoch = lease["epoch"].as_u64().expect("epoch");
    checkpoint(&mut alice, "s1", epoch, 'c');
    let m = manifest(&host, "s1");
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &m, &Key::new(12))),
        FORBIDDEN
    );
    alice.axp("_axp/review", review_params("s1", &m, &Key::new(11)));
}

#[test]
fn a_trace_larger_than_one_export_is_refused() {
    let host = cast()
        .config("[limits]\nchat_bytes_max = 67108864\n")
        .start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    checkpoint(&mut alice, "s1", epoch, 'b');
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 1_000, 1_000);
    alice.axp(
        "_axp/emit",
        emit_params("s1", epoch, json!([markdown_part("t1", "p")])),
    );
    let text = "x".repeat(60_000);
    for _ in 0..(16 * 1024 * 1024 / text.len() + 2) {
        alice.axp(
            "_axp/emit",
            emit_params("s1", epoch, json!([delta("t1", "p", &text)])),
        );
    }
    alice.axp(
        "_axp/settle",
        settle_params("s1", epoch, "t1", Value::Null, "complete"),
    );
    let mut ws = connect(&host, ADMIN);
    assert_eq!(
        ws.axp_code("_axp/export", json!({"channel": exchange("s1")})),
        LIMIT
    );
    // The cursor: the host's newest number, as initialize shows it (the export is refused).
    let (_w, init) = connect_with(&host, ALICE, &[]);
    let x = state(&host, &exchange("s1"));
    let m = json!({"version": 1, "repository": x["repository"], "session": session("s1"),
        "baseCommit": sha('a'), "headCommit": sha('b'), "model": "m", "promptHash": "0".repeat(64),
        "traceHash": "0".repeat(64), "traceThroughSeq": init["serverSeq"],
        "checkpointDigest": hash_object(&x["checkpoint"])});
    assert_eq!(
        alice.axp_code("_axp/review", review_params("s1", &m, &Key::new(11))),
        LIMIT
    );
}
