//! The AXP 0.2.0 exchange, part 1, against the real `axhost serve` over real WebSocket: what
//! `initialize` advertises and each command's happy path (register, grant, revoke, claim with
//! `resumeEpoch`, renew, release, reserve, settle, emit, dispatch, close, comment, blobPut,
//! blobGet, `resourceRead` of `axp-blob:` URIs, export), reconnect replay and retry receipts,
//! written against the wire protocol of `../shared/spec/axp-0.2.0.txt` and
//! `../shared/reference/axp-host-notes.md` (§3–§9, §12–§13, §15). Leases and turns over time
//! are in `tests/axp_leases.rs`, error codes in `tests/axp_errors.rs` and
//! `tests/axp_state_errors.rs`, restarts and crashes in `tests/axp_durability.rs`.

mod axp_support;
mod common;

use std::collections::BTreeSet;

use axp_support::*;
use common::*;
use serde_json::{json, Value};

fn meta(init: &Value) -> &Value {
    &init["_meta"]["org.axp.exchange"]
}

#[test]
fn initialize_advertises_the_exchange_and_the_authenticated_identity() {
    let host = cast().start();
    let (_ws, init) = connect_with(&host, ALICE, &[]);
    let m = meta(&init);
    assert_eq!(m["version"], "0.2.0", "{init}");
    assert_eq!(m["role"], "contributor");
    assert_eq!(m["principal"], ALICE);
    assert_eq!(m["repository"], "default");
    assert_eq!(m["memory"], "axp-memory://");
    assert_eq!(m["lastClientSeq"], 0);
    let methods: Vec<&str> = m["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .map(|v| v.as_str().expect("method name"))
        .collect();
    let unique: BTreeSet<&str> = methods.iter().copied().collect();
    assert_eq!(unique.len(), methods.len(), "methods repeat: {methods:?}");
    for name in PART1 {
        assert!(unique.contains(name), "{name} not advertised: {methods:?}");
    }
    for name in &methods {
        assert!(name.starts_with("_axp/"), "{name} is not an AXP command");
    }

    // The list is the router's own table: every advertised command is served (anything but
    // -32601 for empty params), and `_axp/*` names not advertised are unknown methods.
    let mut ws = connect(&host, ADMIN);
    for name in &methods {
        let r = ws.call(name, json!({}));
        let c = code(&r);
        assert_eq!(c, PARAMS, "{name} with empty params: {r}");
    }
    for name in [
        "_axp/nope",
        "_axp/checkpoint",
        "_axp/compact",
        "_axp/memorySearch",
    ] {
        if !unique.contains(name) {
            assert_eq!(ws.code_of(name, json!({})), UNKNOWN_METHOD, "{name}");
        }
    }

    // Each principal sees its own role; roles come from the credential only.
    for (id, role) in [
        (ADMIN, "maintainer"),
        (VERA, "verifier"),
        (OLGA, "observer"),
        (MARK, "maintainer"),
    ] {
        let (_ws, init) = connect_with(&host, id, &[]);
        assert_eq!(meta(&init)["role"], role, "{id}");
        assert_eq!(meta(&init)["principal"], id, "{id}");
    }

    // lastClientSeq continues a stable clientId's numbering across connections.
    create(&mut ws, "s1");
    let mut first = host.ws_as(host.token());
    first.initialize("stable-client", &[]);
    let r = first.ok(
        "dispatchAction",
        json!({"channel": chat("s1"), "clientSeq": 7, "action": turn_started("t1", "hi")}),
    );
    assert_eq!(r, Value::Null);
    first.close();
    let mut again = host.ws_as(host.token());
    let init = again.initialize("stable-client", &[]);
    assert_eq!(meta(&init)["lastClientSeq"], 7, "{init}");
}

#[test]
fn a_turn_runs_end_to_end_through_the_exchange() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let (mut watch, _) = connect_with(&host, OLGA, &[&exchange("s1"), &chat("s1"), EXECUTORS]);
    let mut alice = connect(&host, ALICE);

    // Register: the executor joins the registry, owned by its principal.
    let before = now_ms();
    let executor = register(&mut alice, "e1", 30_000);
    assert_eq!(executor["id"], "e1");
    assert_eq!(executor["owner"], ALICE);
    assert_eq!(executor["name"], "Test agent");
    assert_eq!(executor["placement"], "satellite");
    assert_eq!(executor["capabilities"], json!(["acp/v1"]));
    assert_eq!(executor["online"], true);
    let expires = executor["expiresAt"].as_u64().expect("expiresAt");
    assert!(expires >= before + 30_000 && expires <= now_ms() + 30_000 + 1_000);
    let seen = watch.notification("action");
    assert_eq!(seen["params"]["channel"], EXECUTORS);
    assert_eq!(seen["params"]["action"]["type"], "_axp/executorChanged");
    assert_eq!(seen["params"]["action"]["executor"], executor);
    assert_eq!(state(&host, EXECUTORS)["entries"]["e1"], executor);

    // Grant: a budget owned by its donor, nothing spent.
    let g = grant(&mut alice, "s1", "g1", donation());
    assert_eq!(
        g,
        json!({"id": "g1", "owner": ALICE, "limit": donation(),
               "spent": allowance(0, 0, 0), "revoked": false, "enforcement": "accounting"})
    );
    let seen = watch.notification("action");
    assert_eq!(
        seen["params"]["action"],
        json!({"type": "_axp/grantChanged", "grant": g})
    );

    // Claim: epoch 1, heartbeat a third of the lease.
    let lease = claim(&mut alice, "s1", "e1", "g1", 30_000);
    assert_eq!(lease["owner"], ALICE);
    assert_eq!(lease["executorId"], "e1");
    assert_eq!(lease["grantId"], "g1");
    assert_eq!(lease["epoch"], 1);
    assert_eq!(lease["heartbeatMs"], 10_000);
    assert!(lease["expiresAt"].as_u64().expect("expiresAt") >= before + 30_000);
    let seen = watch.notification("action");
    assert_eq!(
        seen["params"]["action"],
        json!({"type": "_axp/leaseChanged", "lease": lease, "epoch": 1, "status": "open"})
    );

    // A maintainer starts a turn through _axp/dispatch: no origin, host startedAt.
    start_turn(&mut admin, "s1", "t1");
    let started = loop {
        let n = watch.notification("action");
        if n["params"]["channel"] == chat("s1") {
            break n;
        }
    };
    assert_eq!(started["params"]["action"]["type"], "chat/turnStarted");
    assert!(started["params"].get("origin").is_none(), "{started}");
    assert_ne!(
        started["params"]["action"]["startedAt"], "2020-01-01T00:00:00.000Z",
        "the host's clock decides startedAt"
    );
    assert_eq!(state(&host, &chat("s1"))["activeTurn"]["id"], "t1");

    // Reserve exactly one turn.
    reserve(&mut alice, "s1", 1, "t1", 1000, 10_000);
    let r = &state(&host, &exchange("s1"))["reservation"];
    assert_eq!(r["turnId"], "t1");
    assert_eq!(r["grantId"], "g1");
    assert_eq!(r["epoch"], 1);
    assert_eq!(r["ceiling"], allowance(1000, 10_000, 1));
    assert!(r["startedAt"].as_u64().is_some(), "{r}");

    // Emit: text and a tool asking for permission, as one batch, on the chat.
    let batch = json!([
        markdown_part("t1", "text"),
        delta("t1", "text", "Working together."),
        tool_start("t1", "tool"),
        tool_ready("t1", "tool"),
    ]);
    assert_eq!(
        alice.axp("_axp/emit", emit_params("s1", 1, batch.clone())),
        Value::Null
    );
    let c = state(&host, &chat("s1"));
    let parts = c["activeTurn"]["responseParts"].as_array().expect("parts");
    assert_eq!(parts.len(), 2, "{c}");
    assert_eq!(parts[0]["content"], "Working together.");
    assert_eq!(
        parts[1]["toolCall"]["status"], "pending-confirmation",
        "{c}"
    );
    // The session asks for input while the tool waits.
    let s = state(&host, &session("s1"));
    assert_eq!(s["inputNeeded"][0]["id"], "tool", "{s}");

    // The maintainer approves; the executor completes the tool.
    admin.axp(
        "_axp/dispatch",
        json!({"channel": chat("s1"), "action": tool_confirmed("t1", "tool", true)}),
    );
    let c = state(&host, &chat("s1"));
    assert_eq!(
        c["activeTurn"]["responseParts"][1]["toolCall"]["status"], "running",
        "{c}"
    );
    alice.axp(
        "_axp/emit",
        emit_params("s1", 1, json!([tool_complete("t1", "tool")])),
    );

    // Renew: the lease and the executor both move on.
    let renewed = alice.axp("_axp/renew", fenced("s1", 1));
    assert_eq!(renewed["epoch"], 1);
    assert!(renewed["expiresAt"].as_u64() >= lease["expiresAt"].as_u64());
    let entry = &state(&host, EXECUTORS)["entries"]["e1"];
    assert_eq!(entry["online"], true);
    assert_eq!(entry["expiresAt"], renewed["expiresAt"]);

    // Settle with reported usage, twice under one operationId: charged once.
    let mut settlement = settle_params("s1", 1, "t1", usage(100, 20, 80, 100), "complete");
    settlement["operationId"] = json!("settle-once");
    assert_eq!(alice.ok("_axp/settle", settlement.clone()), Value::Null);
    let seq = export(&host, "s1")["serverSeq"].clone();
    watch.drain(200);
    assert_eq!(alice.ok("_axp/settle", settlement), Value::Null);
    watch.expect_no_frame(300);
    assert_eq!(export(&host, "s1")["serverSeq"], seq);
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["grants"]["g1"]["spent"], allowance(120, 100, 1), "{ex}");
    assert_eq!(ex["reservation"], Value::Null);
    let used = ex["usage"].as_array().expect("usage");
    assert_eq!(used.len(), 1);
    assert_eq!(used[0]["turnId"], "t1");
    assert_eq!(used[0]["grantId"], "g1");
    assert_eq!(used[0]["usage"]["inputTokens"], 100);
    assert_eq!(used[0]["usage"]["source"], "reported");
    let c = state(&host, &chat("s1"));
    assert!(c.get("activeTurn").is_none_or(Value::is_null), "{c}");
    assert_eq!(c["turns"].as_array().map(Vec::len), Some(1));
    assert_eq!(c["turns"][0]["id"], "t1");
    // Every subscriber reduces the same chat.
    assert_eq!(state_as(&host, ALICE, &chat("s1")), c);

    // Release: the session is orphaned, the epoch kept.
    assert_eq!(alice.axp("_axp/release", fenced("s1", 1)), Value::Null);
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["lease"], Value::Null);
    assert_eq!(ex["status"], "orphaned");
    assert_eq!(ex["epoch"], 1);
}

#[test]
fn comments_are_attributed_and_timestamped_by_the_host() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let before = now_ms();
    let mut p = comment_params("s1", "Looks good");
    p["operationId"] = json!("c-1");
    let c = alice.ok("_axp/comment", p);
    assert_eq!(c["id"], "c-1", "the comment id is its operationId: {c}");
    assert_eq!(c["author"], ALICE);
    assert_eq!(c["body"], "Looks good");
    assert_eq!(c["checkpoint"], Value::Null);
    assert_eq!(c["path"], Value::Null);
    let at = c["createdAt"].as_u64().expect("createdAt in ms");
    assert!(at >= before && at <= now_ms() + 1_000, "{c}");
    // Verifiers and maintainers post too; the thread keeps order.
    let mut vera = connect(&host, VERA);
    let v = vera.axp("_axp/comment", comment_params("s1", "Verified"));
    let m = admin.axp("_axp/comment", comment_params("s1", "Thanks"));
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["discussion"], json!([c, v, m]), "{ex}");
    assert_eq!(v["author"], VERA);
    assert_eq!(m["author"], ADMIN);
}

#[test]
fn blobs_are_content_addressed_per_session_and_readable_as_resources() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    create(&mut admin, "s2");
    let mut alice = connect(&host, ALICE);
    let bytes: Vec<u8> = (0..=255u8).chain(b"hello".iter().copied()).collect();
    let digest = sha256_hex(&bytes);
    let put = json!({"channel": exchange("s1"), "data": b64(&bytes),
                     "mediaType": "application/octet-stream"});
    let r = alice.axp("_axp/blobPut", put.clone());
    assert_eq!(
        r,
        json!({"uri": blob_uri("s1", &digest), "sha256": digest, "size": bytes.len(),
               "mediaType": "application/octet-stream"})
    );
    assert!(
        r["uri"]
            .as_str()
            .is_some_and(|u| u.starts_with("axp-blob:/axp-session%3A%2Fs1/")),
        "{r}"
    );
    // Exact round trip, by blobGet and by resourceRead, for every role that can read.
    for id in [ALICE, VERA, OLGA, ADMIN] {
        let mut ws = connect(&host, id);
        let got = ws.axp(
            "_axp/blobGet",
            json!({"channel": exchange("s1"), "digest": digest}),
        );
        assert_eq!(
            got,
            json!({"data": b64(&bytes), "mediaType": "application/octet-stream"}),
            "{id}"
        );
        let read = ws.ok(
            "resourceRead",
            json!({"channel": ROOT, "uri": blob_uri("s1", &digest)}),
        );
        assert_eq!(
            read,
            json!({"data": b64(&bytes), "contentType": "application/octet-stream",
                   "encoding": "base64"}),
            "{id}"
        );
    }
    // Access is per session: s2 does not see s1's blob until it is uploaded there too, and
    // then under its own URI (the bytes are stored once).
    assert_eq!(
        alice.axp_code(
            "_axp/blobGet",
            json!({"channel": exchange("s2"), "digest": digest})
        ),
        NOT_FOUND
    );
    let mut again = put.clone();
    again["channel"] = json!(exchange("s2"));
    again["mediaType"] = json!("text/plain");
    let r2 = alice.axp("_axp/blobPut", again);
    assert_eq!(r2["sha256"], digest);
    assert_eq!(r2["uri"], blob_uri("s2", &digest));
    assert_eq!(r2["mediaType"], "text/plain");
    let got = alice.axp(
        "_axp/blobGet",
        json!({"channel": exchange("s2"), "digest": digest}),
    );
    assert_eq!(got["data"], b64(&bytes));
    // The empty blob and a blob bigger than the 64 KiB command limit both round-trip.
    let mut vera = connect(&host, VERA);
    for data in [Vec::new(), vec![7u8; 200 * 1024]] {
        let r = vera.axp(
            "_axp/blobPut",
            json!({"channel": exchange("s1"), "data": b64(&data), "mediaType": "x/y"}),
        );
        assert_eq!(r["size"], data.len());
        assert_eq!(r["sha256"], sha256_hex(&data));
        let got = vera.axp(
            "_axp/blobGet",
            json!({"channel": exchange("s1"), "digest": sha256_hex(&data)}),
        );
        assert_eq!(got["data"], b64(&data));
    }
}

#[test]
fn export_holds_seeds_actions_and_snapshots_that_rebuild_the_exchange() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    alice.axp("_axp/comment", comment_params("s1", "first"));
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 500, 5);
    alice.axp(
        "_axp/emit",
        emit_params("s1", epoch, json!([markdown_part("t1", "p")])),
    );
    alice.axp(
        "_axp/settle",
        settle_params("s1", epoch, "t1", Value::Null, "complete"),
    );
    alice.axp(
        "_axp/revoke",
        json!({"channel": exchange("s1"), "grantId": "g"}),
    );
    grant(&mut alice, "s1", "g", donation());
    claim(&mut alice, "s1", "e", "g", 30_000);
    admin.axp("_axp/close", json!({"channel": exchange("s1")}));

    let mut vera = connect(&host, VERA);
    let x = vera.axp("_axp/export", json!({"channel": exchange("s1")}));
    assert_eq!(x["version"], "0.2.0");
    assert_eq!(x["repository"], "default");
    let server_seq = x["serverSeq"].as_u64().expect("serverSeq");
    let channels = [exchange("s1"), session("s1"), chat("s1"), changeset("s1")];
    let seeds = x["seeds"].as_array().expect("seeds");
    let snapshots = x["snapshots"].as_array().expect("snapshots");
    for (i, channel) in channels.iter().enumerate() {
        assert_eq!(seeds[i]["resource"], *channel, "{x}");
        assert_eq!(snapshots[i]["resource"], *channel, "{x}");
        // Each snapshot is what a subscriber sees.
        assert_eq!(snapshots[i]["state"], state(&host, channel), "{channel}");
    }
    let seed = &seeds[0]["state"];
    assert_eq!(seed["epoch"], 0);
    assert_eq!(seed["status"], "open");
    assert_eq!(seed["lease"], Value::Null);
    assert_eq!(seed["grants"], json!({}));
    assert_eq!(seed["usage"], json!([]));
    assert_eq!(seed["repository"], "default");
    assert_eq!(seed["task"], session("s1"));
    assert_eq!(seed["resource"], exchange("s1"));
    assert_eq!(seed["session"], session("s1"));
    assert_eq!(seed["chat"], chat("s1"));
    // Part-2 fields are present and empty.
    for field in ["checkpoint", "compaction", "review", "verification"] {
        assert_eq!(seed[field], Value::Null, "{field}: {seed}");
        assert_eq!(snapshots[0]["state"][field], Value::Null, "{field}");
    }
    assert_eq!(seed["context"]["revision"], 0, "{seed}");
    assert_eq!(seed["context"]["throughTurn"], 0, "{seed}");

    // The actions: only these four channels, in serverSeq order, none past serverSeq.
    let actions = x["actions"].as_array().expect("actions");
    let mut last = 0;
    for e in actions {
        let seq = e["serverSeq"].as_u64().expect("serverSeq");
        assert!(seq > last && seq <= server_seq, "{e}");
        last = seq;
        assert!(channels.contains(&e["channel"].as_str().unwrap_or("").to_owned()));
    }
    // Seed plus actions rebuild the exchange.
    let mut rebuilt = seed.clone();
    for e in actions.iter().filter(|e| e["channel"] == exchange("s1")) {
        reduce_exchange(&mut rebuilt, &e["action"]);
    }
    let now = &snapshots[0]["state"];
    if now.get("discussion").is_some() && rebuilt.get("discussion").is_none() {
        rebuilt["discussion"] = json!([]);
    }
    assert_eq!(&rebuilt, now);
    assert_eq!(now["status"], "closed");
    assert_eq!(now["epoch"], 2);
    // Closing archives the session (AHP's IsArchived status flag, 64).
    let session_state = &snapshots[1]["state"];
    let status = session_state["status"].as_u64().expect("session status");
    assert_ne!(status & 64, 0, "{session_state}");
}

#[test]
fn a_maximal_blob_round_trips_and_one_byte_more_is_refused() {
    // 16,000,000 bytes (the reference's maxBlobBytes), ~21.3 MB of base64 in one message.
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    // The answer is one ~21.3 MB frame: more than tungstenite reads by default, less than the
    // reference's client does (32,000,000).
    alice.set_max_frame(32_000_000);
    let bytes: Vec<u8> = (0..16_000_000u32).map(|i| (i % 251) as u8).collect();
    let r = alice.axp(
        "_axp/blobPut",
        json!({"channel": exchange("s1"), "data": b64(&bytes), "mediaType": "x/big"}),
    );
    assert_eq!(r["size"], 16_000_000);
    assert_eq!(r["sha256"], sha256_hex(&bytes));
    let got = alice.axp(
        "_axp/blobGet",
        json!({"channel": exchange("s1"), "digest": sha256_hex(&bytes)}),
    );
    assert!(got["data"] == b64(&bytes), "the blob did not round-trip");
    let mut more = bytes;
    more.push(0);
    let p = json!({"channel": exchange("s1"), "data": b64(&more), "mediaType": "x/big"});
    assert_eq!(alice.axp_code("_axp/blobPut", p), LIMIT);
}

#[test]
fn reconnect_replays_exchange_actions_that_rebuild_the_state() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let (_old, init) = connect_with(&host, OLGA, &[&exchange("s1")]);
    let seed = init["snapshots"][0]["state"].clone();
    let cursor = init["snapshots"][0]["fromSeq"].as_u64().expect("fromSeq");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    alice.axp("_axp/comment", comment_params("s1", "while away"));
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 50, 5);
    alice.axp(
        "_axp/settle",
        settle_params("s1", epoch, "t1", usage(10, 10, 5, 1), "complete"),
    );
    alice.axp("_axp/release", fenced("s1", epoch));
    let mut ws = host.ws_as(host.token_of(OLGA));
    let r = ws.ok(
        "reconnect",
        json!({"channel": ROOT, "clientId": format!("olga-r{}", unique()),
               "lastSeenServerSeq": cursor, "subscriptions": [exchange("s1")]}),
    );
    assert_eq!(r["type"], "replay", "{r}");
    let mut rebuilt = seed;
    for e in r["actions"].as_array().expect("actions") {
        assert_eq!(e["channel"], exchange("s1"), "{e}");
        reduce_exchange(&mut rebuilt, &e["action"]);
    }
    let now = state(&host, &exchange("s1"));
    if now.get("discussion").is_some() && rebuilt.get("discussion").is_none() {
        rebuilt["discussion"] = json!([]);
    }
    assert_eq!(rebuilt, now);
}

#[test]
fn comment_bodies_are_trimmed_and_fingerprints_ignore_key_order() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    // The reference's params schema trims the body (`z.string().trim()`, §6).
    let c = alice.axp("_axp/comment", comment_params("s1", "  padded \n"));
    assert_eq!(c["body"], "padded", "{c}");
    // The fingerprint is over canonical JSON: the same params in another key order are the
    // same operation.
    let text_a = format!(
        r#"{{"jsonrpc":"2.0","id":901,"method":"_axp/grant","params":{{"channel":"{}","operationId":"g-order","grantId":"g","limit":{{"tokens":5,"costMicros":6,"turns":7}},"enforcement":"accounting"}}}}"#,
        exchange("s1")
    );
    let text_b = format!(
        r#"{{"jsonrpc":"2.0","id":902,"method":"_axp/grant","params":{{"enforcement":"accounting","limit":{{"turns":7,"costMicros":6,"tokens":5}},"grantId":"g","operationId":"g-order","channel":"{}"}}}}"#,
        exchange("s1")
    );
    alice.send_text(&text_a);
    let a = alice.response(901);
    alice.send_text(&text_b);
    let b = alice.response(902);
    assert!(a.get("result").is_some(), "{a}");
    assert_eq!(a["result"], b["result"], "{b}");
}

#[test]
fn pipelined_retries_of_one_operation_take_effect_once() {
    // The second copy arrives while the first is still being written.
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let (mut watch, _) = connect_with(&host, OLGA, &[&exchange("s1")]);
    let mut alice = connect(&host, ALICE);
    for round in 0..20 {
        let p = json!({"channel": exchange("s1"), "operationId": format!("pipe-{round}"),
                       "body": format!("round {round}"), "checkpoint": null, "path": null});
        let changed = with(p.clone(), "body", json!("changed"));
        let ids = [
            alice.send_request("_axp/comment", p.clone()),
            alice.send_request("_axp/comment", p.clone()),
            alice.send_request("_axp/comment", changed),
            alice.send_request("_axp/comment", p),
        ];
        let answers: Vec<Value> = ids.iter().map(|id| alice.response(*id)).collect();
        assert!(answers[0].get("result").is_some(), "{answers:?}");
        assert_eq!(answers[1]["result"], answers[0]["result"], "{answers:?}");
        assert_eq!(code(&answers[2]), CONFLICT, "{answers:?}");
        assert_eq!(answers[3]["result"], answers[0]["result"], "{answers:?}");
    }
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["discussion"].as_array().map(Vec::len), Some(20), "{ex}");
    let frames = watch.drain(300);
    assert_eq!(actions_on(&frames, &exchange("s1")).len(), 20);
}
