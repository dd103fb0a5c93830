//! Every error code of every AXP part-1 command, part 1 of 2, against the real `axhost serve`
//! over real WebSocket: strict params and exact ranges (-32602), the role matrix and scopes
//! (-32009, -32008), retry receipts (-32011) and axhost's own registry bounds (-32043). The
//! commands' state checks (-32040, -32041, -32011, -32004, -32043 and the rest) are in
//! `tests/axp_state_errors.rs`. Written against the wire protocol of
//! `../shared/reference/axp-host-notes.md` §3–§9 and §15 (the reference host's checks and
//! codes); codes are matched, never messages.

mod axp_support;
mod common;

use axp_support::*;
use common::*;
use serde_json::{json, Value};

#[test]
fn params_are_strict_and_mutations_need_an_operation_id() {
    let host = leased();
    let mut admin = connect(&host, ADMIN);
    let mut carl = connect(&host, CARL);
    for method in PART1 {
        // An unknown key anywhere at the top level.
        let mut p = with_op(method, sample(method, "s1"));
        p["unexpected"] = json!(1);
        assert_eq!(
            admin.code_of(method, p),
            PARAMS,
            "{method} with an unknown key"
        );
        // No params at all, or not an object.
        assert_eq!(admin.code_of(method, Value::Null), PARAMS, "{method} null");
        assert_eq!(admin.code_of(method, json!([])), PARAMS, "{method} array");
        assert_eq!(admin.code_of(method, json!({})), PARAMS, "{method} {{}}");
        if READS.contains(method) {
            // Reads need none: an operationId is an unknown key.
            let mut p = sample(method, "s1");
            p["operationId"] = json!("x");
            assert_eq!(
                admin.code_of(method, p),
                PARAMS,
                "{method} with operationId"
            );
            continue;
        }
        // Without an operationId: -32602, even on a channel outside the caller's scope
        // (§15.3: params are checked before scope).
        assert_eq!(
            admin.code_of(method, sample(method, "s1")),
            PARAMS,
            "{method}"
        );
        assert_eq!(
            carl.code_of(method, sample(method, "s2")),
            PARAMS,
            "{method}"
        );
        for bad in [
            json!(""),
            json!("-x"),
            json!("a b"),
            json!("x".repeat(129)),
            json!(7),
        ] {
            let mut p = sample(method, "s1");
            p["operationId"] = bad.clone();
            assert_eq!(
                admin.code_of(method, p),
                PARAMS,
                "{method} operationId {bad}"
            );
        }
        let mut p = with_op(method, sample(method, "s1"));
        p["channel"] = json!("x".repeat(257));
        assert_eq!(admin.code_of(method, p), PARAMS, "{method} channel of 257");
    }
}

#[test]
fn every_field_has_its_exact_range() {
    let host = leased();
    let mut alice = connect(&host, ALICE);
    let mut admin = connect(&host, ADMIN);
    let long = |n: usize| json!("x".repeat(n));
    let big = json!(9_007_199_254_740_992u64); // 2^53: past every count
    let cases: Vec<(&str, Value)> = vec![
        (
            "_axp/register",
            with(sample("_axp/register", "s1"), "ttlMs", json!(2999)),
        ),
        (
            "_axp/register",
            with(sample("_axp/register", "s1"), "ttlMs", json!(300_001)),
        ),
        (
            "_axp/register",
            with(sample("_axp/register", "s1"), "ttlMs", json!(3000.5)),
        ),
        (
            "_axp/register",
            with(sample("_axp/register", "s1"), "name", json!("")),
        ),
        (
            "_axp/register",
            with(sample("_axp/register", "s1"), "name", long(129)),
        ),
        (
            "_axp/register",
            with(sample("_axp/register", "s1"), "placement", json!("cloud")),
        ),
        (
            "_axp/register",
            with(sample("_axp/register", "s1"), "executorId", json!("-e")),
        ),
        (
            "_axp/register",
            with(sample("_axp/register", "s1"), "executorId", long(129)),
        ),
        (
            "_axp/register",
            with(
                sample("_axp/register", "s1"),
                "capabilities",
                json!(vec!["c"; 33]),
            ),
        ),
        (
            "_axp/register",
            with(
                sample("_axp/register", "s1"),
                "capabilities",
                json!([long(129)]),
            ),
        ),
        (
            "_axp/register",
            without(sample("_axp/register", "s1"), "", "capabilities"),
        ),
        (
            "_axp/grant",
            with(sample("_axp/grant", "s1"), "limit.tokens", json!(-1)),
        ),
        (
            "_axp/grant",
            with(sample("_axp/grant", "s1"), "limit.tokens", json!(1.5)),
        ),
        (
            "_axp/grant",
            with(sample("_axp/grant", "s1"), "limit.costMicros", big.clone()),
        ),
        (
            "_axp/grant",
            with(sample("_axp/grant", "s1"), "limit.extra", json!(0)),
        ),
        (
            "_axp/grant",
            without(sample("_axp/grant", "s1"), "limit", "turns"),
        ),
        (
            "_axp/grant",
            with(sample("_axp/grant", "s1"), "enforcement", json!("none")),
        ),
        (
            "_axp/grant",
            with(sample("_axp/grant", "s1"), "grantId", json!("g/1")),
        ),
        (
            "_axp/revoke",
            with(sample("_axp/revoke", "s1"), "grantId", long(129)),
        ),
        (
            "_axp/claim",
            with(sample("_axp/claim", "s1"), "leaseMs", json!(2999)),
        ),
        (
            "_axp/claim",
            with(sample("_axp/claim", "s1"), "leaseMs", json!(300_001)),
        ),
        (
            "_axp/claim",
            with(sample("_axp/claim", "s1"), "resumeEpoch", json!(-1)),
        ),
        (
            "_axp/claim",
            with(sample("_axp/claim", "s1"), "resumeEpoch", json!("1")),
        ),
        (
            "_axp/renew",
            with(sample("_axp/renew", "s1"), "epoch", json!(-1)),
        ),
        (
            "_axp/renew",
            with(sample("_axp/renew", "s1"), "epoch", json!(1.5)),
        ),
        (
            "_axp/release",
            with(sample("_axp/release", "s1"), "epoch", big.clone()),
        ),
        (
            "_axp/reserve",
            with(sample("_axp/reserve", "s1"), "turnId", json!("t 1")),
        ),
        (
            "_axp/reserve",
            with(sample("_axp/reserve", "s1"), "ceiling.turns", json!(-1)),
        ),
        (
            "_axp/settle",
            with(sample("_axp/settle", "s1"), "outcome", json!("done")),
        ),
        (
            "_axp/settle",
            with(sample("_axp/settle", "s1"), "error", long(4097)),
        ),
        (
            "_axp/settle",
            with(
                sample("_axp/settle", "s1"),
                "usage",
                json!({"inputTokens": 1, "outputTokens": 1, "cacheReadTokens": 0,
                   "costMicros": 0, "source": "guess"}),
            ),
        ),
        (
            "_axp/settle",
            with(
                sample("_axp/settle", "s1"),
                "usage",
                json!({"inputTokens": 1, "outputTokens": 1, "cacheReadTokens": 0,
                   "costMicros": 0, "source": "reported", "extra": 1}),
            ),
        ),
        (
            "_axp/settle",
            with(
                sample("_axp/settle", "s1"),
                "usage",
                json!({"inputTokens": 1, "outputTokens": 1, "costMicros": 0,
                   "source": "reported"}),
            ),
        ),
        (
            "_axp/emit",
            with(sample("_axp/emit", "s1"), "actions", json!([])),
        ),
        (
            "_axp/emit",
            with(
                sample("_axp/emit", "s1"),
                "actions",
                json!(vec![markdown_part("t1", "p"); 65]),
            ),
        ),
        (
            "_axp/emit",
            with(sample("_axp/emit", "s1"), "actions", json!({})),
        ),
        (
            "_axp/comment",
            with(sample("_axp/comment", "s1"), "body", json!("")),
        ),
        (
            "_axp/comment",
            with(sample("_axp/comment", "s1"), "body", json!("  \n\t ")),
        ),
        (
            "_axp/comment",
            with(sample("_axp/comment", "s1"), "body", long(8001)),
        ),
        (
            "_axp/comment",
            with(sample("_axp/comment", "s1"), "checkpoint", json!("abc")),
        ),
        (
            "_axp/comment",
            with(sample("_axp/comment", "s1"), "path", json!("")),
        ),
        (
            "_axp/comment",
            without(sample("_axp/comment", "s1"), "", "path"),
        ),
        (
            "_axp/blobPut",
            with(sample("_axp/blobPut", "s1"), "mediaType", long(129)),
        ),
        (
            "_axp/blobPut",
            with(sample("_axp/blobPut", "s1"), "data", json!(12)),
        ),
        (
            "_axp/blobGet",
            with(sample("_axp/blobGet", "s1"), "digest", json!("abc")),
        ),
        (
            "_axp/blobGet",
            with(
                sample("_axp/blobGet", "s1"),
                "digest",
                json!(sha256_hex(b"x").to_uppercase()),
            ),
        ),
    ];
    for (method, params) in cases {
        assert_eq!(
            alice.axp_code(method, params.clone()),
            PARAMS,
            "{method} {params}"
        );
    }
    // The edges themselves are accepted.
    for ttl in [3_000, 300_000] {
        alice.axp(
            "_axp/register",
            with(sample("_axp/register", "s1"), "ttlMs", json!(ttl)),
        );
    }
    alice.axp(
        "_axp/comment",
        with(sample("_axp/comment", "s1"), "body", long(8000)),
    );
    let mut bob = connect(&host, BOB);
    grant(&mut bob, "s2", "gb", donation());
    for lease_ms in [3_000u64, 300_000] {
        let lease = claim(&mut bob, "s2", "eb", "gb", lease_ms);
        assert_eq!(lease["heartbeatMs"], lease_ms / 3);
        bob.axp(
            "_axp/release",
            fenced("s2", lease["epoch"].as_u64().expect("epoch")),
        );
    }
    // The maintainer's dispatch: only the chat channel, only valid actions.
    for channel in [
        exchange("s1"),
        session("s1"),
        changeset("s1"),
        ROOT.to_owned(),
    ] {
        let p = json!({"channel": channel, "action": turn_started("tx", "x")});
        assert_eq!(admin.axp_code("_axp/dispatch", p), PARAMS, "{channel}");
    }
    for action in [
        json!({"type": "chat/turnStarted", "turnId": "tx"}),
        json!({"type": "no/suchAction"}),
        json!("chat/turnStarted"),
    ] {
        let p = json!({"channel": chat("s1"), "action": action});
        assert_eq!(admin.axp_code("_axp/dispatch", p), PARAMS, "{action}");
    }
}

#[test]
fn the_role_matrix() {
    let host = leased();
    let mut conns: Vec<(&str, Ws)> = [ADMIN, ALICE, VERA, OLGA]
        .into_iter()
        .map(|id| (id, connect(&host, id)))
        .collect();
    let forbidden = |method: &str, role: &str| -> bool {
        let contribute = [
            "_axp/register",
            "_axp/grant",
            "_axp/claim",
            "_axp/renew",
            "_axp/release",
            "_axp/reserve",
            "_axp/settle",
            "_axp/emit",
        ];
        match method {
            m if contribute.contains(&m) => role == VERA || role == OLGA,
            "_axp/dispatch" | "_axp/close" => role != ADMIN,
            "_axp/comment" | "_axp/blobPut" => role == OLGA,
            // Only the donor: the grant is alice's.
            "_axp/revoke" => role != ALICE,
            _ => false,
        }
    };
    for method in PART1 {
        // Revoking and closing for real would end the lease the other rows need: those go
        // last, each on its own.
        if *method == "_axp/revoke" || *method == "_axp/close" {
            continue;
        }
        for (id, ws) in conns.iter_mut() {
            let mut params = sample(method, "s1");
            if *method == "_axp/register" || *method == "_axp/grant" {
                // Its own executor or grant, so ownership is not what is tested.
                let key = if *method == "_axp/register" {
                    "executorId"
                } else {
                    "grantId"
                };
                params[key] = json!(format!("x-{id}"));
            }
            let r = ws.call(method, with_op(method, params));
            let got = r.get("error").map(|_| code(&r));
            if forbidden(method, id) {
                assert_eq!(got, Some(FORBIDDEN), "{method} as {id}: {r}");
            } else {
                assert_ne!(got, Some(FORBIDDEN), "{method} as {id}: {r}");
            }
        }
    }
    // Fenced commands on alice's lease by another contributor or a maintainer: stale, not
    // forbidden (the lease belongs to another principal).
    let mut bob = connect(&host, BOB);
    for method in [
        "_axp/renew",
        "_axp/release",
        "_axp/reserve",
        "_axp/settle",
        "_axp/emit",
    ] {
        let (_, admin) = &mut conns[0];
        assert_eq!(
            admin.axp_code(method, sample(method, "s1")),
            STALE,
            "{method} admin"
        );
        assert_eq!(
            bob.axp_code(method, sample(method, "s1")),
            STALE,
            "{method} bob"
        );
    }
    for (id, ws) in conns.iter_mut() {
        if *id != ALICE {
            let r = ws.axp_code("_axp/revoke", sample("_axp/revoke", "s1"));
            assert_eq!(r, FORBIDDEN, "revoke as {id}");
        }
        if *id != ADMIN {
            assert_eq!(
                ws.axp_code("_axp/close", sample("_axp/close", "s2")),
                FORBIDDEN
            );
        }
    }
    let (_, admin) = &mut conns[0];
    assert_eq!(
        admin.axp("_axp/close", sample("_axp/close", "s2")),
        Value::Null
    );
    // Every role reads: subscribe, export, blobGet, resourceRead (blob uploaded above).
    let digest = sha256_hex(b"x");
    for (id, ws) in conns.iter_mut() {
        ws.ok("subscribe", json!({"channel": exchange("s1")}));
        ws.axp("_axp/export", sample("_axp/export", "s1"));
        ws.axp("_axp/blobGet", sample("_axp/blobGet", "s1"));
        let r = ws.ok(
            "resourceRead",
            json!({"channel": ROOT, "uri": blob_uri("s1", &digest)}),
        );
        assert_eq!(r["data"], b64(b"x"), "{id}");
    }
    // Alice's own revoke works.
    let (_, alice) = &mut conns[1];
    alice.axp("_axp/revoke", sample("_axp/revoke", "s1"));
}

#[test]
fn scopes_bound_every_command_and_unknown_sessions_are_not_found() {
    let host = leased();
    let mut alice = connect(&host, ALICE);
    let blob = alice.axp("_axp/blobPut", sample("_axp/blobPut", "s2"));
    let mut carl = connect(&host, CARL);
    // Out of scope: every session command is forbidden, reads included.
    for method in PART1 {
        if *method == "_axp/register" {
            continue; // the registry is readable by everyone
        }
        let p = sample(method, "s2");
        assert_eq!(
            carl.axp_code(method, p),
            FORBIDDEN,
            "{method} on s2 as carl"
        );
    }
    for channel in [exchange("s2"), chat("s2"), session("s2"), changeset("s2")] {
        assert_eq!(
            carl.code_of("subscribe", json!({"channel": channel})),
            FORBIDDEN
        );
    }
    assert_eq!(
        carl.code_of("resourceRead", json!({"channel": ROOT, "uri": blob["uri"]})),
        FORBIDDEN
    );
    let listed = carl.ok("listSessions", json!({"channel": ROOT}));
    let items = listed["items"].as_array().expect("items");
    assert_eq!(items.len(), 1, "{listed}");
    assert_eq!(items[0]["resource"], session("s1"));
    // Scope is checked before existence: an unknown session outside it is forbidden too.
    assert_eq!(
        carl.axp_code("_axp/export", sample("_axp/export", "nope")),
        FORBIDDEN
    );
    // In scope it works, and a digest of another session is simply not there.
    carl.axp("_axp/export", sample("_axp/export", "s1"));
    carl.axp("_axp/comment", sample("_axp/comment", "s1"));
    let p = json!({"channel": exchange("s1"), "digest": blob["sha256"]});
    assert_eq!(carl.axp_code("_axp/blobGet", p), NOT_FOUND);
    // Unknown sessions, for a principal that may see every session.
    for method in PART1 {
        if *method == "_axp/register" {
            continue;
        }
        assert_eq!(
            alice.axp_code(method, sample(method, "nope")),
            NOT_FOUND,
            "{method} on an unknown session"
        );
    }
}

#[test]
fn retry_receipts_return_the_stored_result_and_conflict_on_other_input() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    create(&mut admin, "s2");
    let (mut watch, _) = connect_with(&host, OLGA, &[&exchange("s1"), EXECUTORS]);
    let mut alice = connect(&host, ALICE);

    // A rejected command stores nothing: the same operationId runs again once it can pass.
    let claim_once = with(
        claim_params("s1", "e", "g", 30_000),
        "operationId",
        json!("claim-1"),
    );
    assert_eq!(alice.code_of("_axp/claim", claim_once.clone()), FORBIDDEN);
    grant(&mut alice, "s1", "g", donation());
    let lease = alice.ok("_axp/claim", claim_once.clone());
    assert_eq!(lease["epoch"], 1);
    watch.drain(200);

    // Identical retries: the stored result, no event, for each kind of mutation.
    let comment = with(
        comment_params("s1", "once"),
        "operationId",
        json!("comment-1"),
    );
    let first = alice.ok("_axp/comment", comment.clone());
    let reg = with(
        sample("_axp/register", "s1"),
        "operationId",
        json!("register-1"),
    );
    let registered = alice.ok("_axp/register", reg.clone());
    watch.drain(200);
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert_eq!(alice.ok("_axp/comment", comment.clone()), first);
    assert_eq!(alice.ok("_axp/register", reg.clone()), registered);
    assert_eq!(alice.ok("_axp/claim", claim_once.clone()), lease);
    watch.expect_no_frame(300);
    // A maintainer's dispatch too: replayed, it starts no second turn (run again, it would
    // be refused: a turn is running).
    let dispatch = json!({"channel": chat("s1"), "operationId": "dispatch-1",
                          "action": turn_started("t1", "once")});
    assert_eq!(admin.ok("_axp/dispatch", dispatch.clone()), Value::Null);
    let (mut chat_watch, _) = connect_with(&host, OLGA, &[&chat("s1")]);
    assert_eq!(admin.ok("_axp/dispatch", dispatch), Value::Null);
    chat_watch.expect_no_frame(300);
    watch.drain(200);
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["discussion"].as_array().map(Vec::len), Some(1));
    assert_eq!(ex["epoch"], 1, "a replayed claim advanced the epoch");

    // Other input under a used operationId: conflict, nothing changes.
    let changed = with(comment.clone(), "body", json!("twice"));
    assert_eq!(alice.code_of("_axp/comment", changed), CONFLICT);
    let other_method = with(
        sample("_axp/blobPut", "s1"),
        "operationId",
        json!("comment-1"),
    );
    assert_eq!(alice.code_of("_axp/blobPut", other_method), CONFLICT);
    let other_channel = with(comment.clone(), "channel", json!(exchange("s2")));
    assert_eq!(alice.code_of("_axp/comment", other_channel), CONFLICT);
    watch.expect_no_frame(300);

    // Receipts are per principal: bob's "comment-1" is his own.
    let mut bob = connect(&host, BOB);
    let his = bob.ok("_axp/comment", with(comment, "body", json!("bob's")));
    assert_eq!(his["author"], BOB);
    assert_eq!(his["id"], "comment-1");

    // A replayed claim grants nothing: after a release, the stored lease does not fence.
    alice.axp("_axp/release", fenced("s1", 1));
    assert_eq!(alice.ok("_axp/claim", claim_once), lease);
    assert_eq!(state(&host, &exchange("s1"))["lease"], Value::Null);
    assert_eq!(alice.axp_code("_axp/renew", fenced("s1", 1)), STALE);
}

#[test]
fn registry_and_grant_bounds_are_limit_errors() {
    // axhost's own bounds (the reference has none): executors in the registry and grants per
    // session, each -32043 past its configured maximum; changing an existing one still works.
    let host = cast()
        .config("[limits]\nexecutors_max = 2\ngrants_per_session_max = 2\n")
        .start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    register(&mut alice, "e1", 3_000);
    register(&mut alice, "e2", 3_000);
    let third = with(sample("_axp/register", "s1"), "executorId", json!("e3"));
    assert_eq!(alice.axp_code("_axp/register", third), LIMIT);
    register(&mut alice, "e1", 30_000);
    grant(&mut alice, "s1", "g1", donation());
    grant(&mut alice, "s1", "g2", donation());
    let p = json!({"channel": exchange("s1"), "grantId": "g3", "limit": donation(),
                   "enforcement": "accounting"});
    assert_eq!(alice.axp_code("_axp/grant", p), LIMIT);
    grant(&mut alice, "s1", "g1", allowance(5, 5, 5));
}
