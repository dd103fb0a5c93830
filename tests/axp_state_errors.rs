//! Every error code of every AXP part-1 command, part 2 of 2: the checks each command makes
//! against the state, against the real `axhost serve` over real WebSocket: leases and grants
//! (-32040 stale, -32041 budget, -32011 conflict, -32009 ownership), executor output (`_axp/emit`),
//! the maintainer's dispatch (-32004 turn in progress, -32043 queue), rejected `dispatchAction`
//! requests, comments and blobs. Params, roles, scopes and receipts are in
//! `tests/axp_errors.rs`. Written against `../shared/reference/axp-host-notes.md` §6–§9 and §15;
//! codes are matched, never messages.

mod axp_support;
mod common;

use axp_support::*;
use common::*;
use serde_json::{json, Value};

#[test]
fn lease_and_grant_errors() {
    let host = leased();
    let mut alice = connect(&host, ALICE);
    let mut bob = connect(&host, BOB);
    // Claim: one lease at a time.
    grant(&mut bob, "s1", "gb", donation());
    assert_eq!(
        bob.axp_code("_axp/claim", claim_params("s1", "eb", "gb", 30_000)),
        CONFLICT
    );
    // Claim on a free session: executor and grant must be the caller's, grant not revoked.
    register(&mut bob, "eb", 30_000);
    assert_eq!(
        alice.axp_code("_axp/claim", claim_params("s2", "eb", "g", 30_000)),
        FORBIDDEN
    );
    grant(&mut alice, "s2", "ga", donation());
    assert_eq!(
        alice.axp_code("_axp/claim", claim_params("s2", "e", "missing", 30_000)),
        FORBIDDEN
    );
    grant(&mut bob, "s2", "gb2", donation());
    assert_eq!(
        alice.axp_code("_axp/claim", claim_params("s2", "e", "gb2", 30_000)),
        FORBIDDEN
    );
    alice.axp(
        "_axp/revoke",
        json!({"channel": exchange("s2"), "grantId": "ga"}),
    );
    assert_eq!(
        alice.axp_code("_axp/claim", claim_params("s2", "e", "ga", 30_000)),
        FORBIDDEN
    );
    // resumeEpoch must match the session's epoch, and the remaining lease must be the caller's.
    let resume = |epoch: u64| {
        with(
            claim_params("s1", "e", "g", 30_000),
            "resumeEpoch",
            json!(epoch),
        )
    };
    assert_eq!(alice.axp_code("_axp/claim", resume(0)), STALE);
    assert_eq!(alice.axp_code("_axp/claim", resume(2)), STALE);
    let bob_resume = with(
        claim_params("s1", "eb", "gb", 30_000),
        "resumeEpoch",
        json!(1),
    );
    assert_eq!(bob.axp_code("_axp/claim", bob_resume), STALE);
    // Register: another contributor's executor id is not yours.
    let steal = with(sample("_axp/register", "s1"), "executorId", json!("e"));
    assert_eq!(bob.axp_code("_axp/register", steal), FORBIDDEN);
    // Grant: only the donor changes it; not during its reserved turn.
    let g = |limit: Value| {
        json!({"channel": exchange("s1"), "grantId": "g", "limit": limit,
                                  "enforcement": "accounting"})
    };
    assert_eq!(bob.axp_code("_axp/grant", g(donation())), FORBIDDEN);
    assert_eq!(
        alice.axp_code("_axp/grant", g(allowance(200_000, 1, 10))),
        CONFLICT
    );
    // Revoke: only the donor, of a grant that exists.
    assert_eq!(
        bob.axp_code(
            "_axp/revoke",
            json!({"channel": exchange("s1"), "grantId": "g"})
        ),
        FORBIDDEN
    );
    assert_eq!(
        alice.axp_code(
            "_axp/revoke",
            json!({"channel": exchange("s1"), "grantId": "nope"})
        ),
        FORBIDDEN
    );
    // Fencing: wrong epoch, another principal.
    for method in ["_axp/renew", "_axp/release"] {
        assert_eq!(alice.axp_code(method, fenced("s1", 2)), STALE, "{method}");
        assert_eq!(alice.axp_code(method, fenced("s1", 0)), STALE, "{method}");
        assert_eq!(bob.axp_code(method, fenced("s1", 1)), STALE, "{method}");
    }
    // Reserve: one at a time, for the active turn, within the limit, exactly one turn.
    assert_eq!(
        alice.axp_code(
            "_axp/reserve",
            reserve_params("s1", 1, "t1", allowance(1, 0, 1))
        ),
        CONFLICT
    );
    // Settle: only the reserved turn; cache reads within input.
    assert_eq!(
        alice.axp_code(
            "_axp/settle",
            settle_params("s1", 1, "t9", Value::Null, "complete")
        ),
        STALE
    );
    assert_eq!(
        alice.axp_code(
            "_axp/settle",
            settle_params("s1", 2, "t1", Value::Null, "complete")
        ),
        STALE
    );
    assert_eq!(
        alice.axp_code(
            "_axp/settle",
            settle_params("s1", 1, "t1", usage(10, 5, 11, 0), "complete")
        ),
        PARAMS
    );
    // Nothing was charged by the refused settlements.
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["grants"]["g"]["spent"], allowance(0, 0, 0), "{ex}");
    assert_eq!(ex["reservation"]["turnId"], "t1");
    alice.axp(
        "_axp/settle",
        settle_params("s1", 1, "t1", usage(10, 5, 10, 0), "error"),
    );
    // Settled once; a second settlement under another operationId has no reservation.
    assert_eq!(
        alice.axp_code(
            "_axp/settle",
            settle_params("s1", 1, "t1", Value::Null, "complete")
        ),
        STALE
    );
    let mut admin = connect(&host, ADMIN);
    start_turn(&mut admin, "s1", "t2");
    assert_eq!(
        alice.axp_code(
            "_axp/reserve",
            reserve_params("s1", 1, "t9", allowance(1, 0, 1))
        ),
        CONFLICT
    );
    assert_eq!(
        alice.axp_code(
            "_axp/reserve",
            reserve_params("s1", 1, "t2", allowance(1, 0, 2))
        ),
        PARAMS
    );
    assert_eq!(
        alice.axp_code(
            "_axp/reserve",
            reserve_params("s1", 1, "t2", allowance(0, 0, 1))
        ),
        PARAMS
    );
    assert_eq!(
        alice.axp_code(
            "_axp/reserve",
            reserve_params("s1", 1, "t2", allowance(100_000, 0, 1))
        ),
        BUDGET
    );
    assert_eq!(
        alice.axp_code(
            "_axp/reserve",
            reserve_params("s1", 1, "t2", allowance(1, 1_000_001, 1))
        ),
        BUDGET
    );
    reserve(&mut alice, "s1", 1, "t2", 99_985, 0);
    // A revoked grant: the lease is orphaned, so fenced calls are stale.
    alice.axp(
        "_axp/revoke",
        json!({"channel": exchange("s1"), "grantId": "g"}),
    );
    assert_eq!(alice.axp_code("_axp/renew", fenced("s1", 1)), STALE);
}

#[test]
fn turn_budget_limits_count_turns() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    grant(&mut alice, "s1", "g", allowance(1_000, 1_000, 1));
    let epoch = claim(&mut alice, "s1", "e", "g", 30_000)["epoch"]
        .as_u64()
        .expect("epoch");
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 10, 0);
    alice.axp(
        "_axp/settle",
        settle_params("s1", epoch, "t1", usage(1, 1, 0, 0), "complete"),
    );
    start_turn(&mut admin, "s1", "t2");
    assert_eq!(
        alice.axp_code(
            "_axp/reserve",
            reserve_params("s1", epoch, "t2", allowance(10, 0, 1))
        ),
        BUDGET
    );
}

#[test]
fn emit_errors_and_all_or_nothing_batches() {
    let host = leased();
    let mut alice = connect(&host, ALICE);
    let mut admin = connect(&host, ADMIN);
    let emit =
        |ws: &mut Ws, actions: Value| ws.axp_code("_axp/emit", emit_params("s1", 1, actions));
    // Set up a markdown part, a reasoning part and a tool awaiting confirmation.
    alice.axp(
        "_axp/emit",
        emit_params(
            "s1",
            1,
            json!([
                markdown_part("t1", "md"),
                {"type": "chat/responsePart", "turnId": "t1",
                 "part": {"kind": "reasoning", "id": "why", "content": ""}},
                tool_start("t1", "tool"),
                tool_ready("t1", "tool"),
            ]),
        ),
    );
    let before = state(&host, &chat("s1"));
    let other_blob = alice.axp("_axp/blobPut", sample("_axp/blobPut", "s2"));
    let cases: Vec<(Value, i64)> = vec![
        // Not an executor's action.
        (json!([turn_started("t9", "x")]), FORBIDDEN),
        (
            json!([{"type": "chat/turnComplete", "turnId": "t1", "duration": 1}]),
            FORBIDDEN,
        ),
        (json!([tool_confirmed("t1", "tool", true)]), FORBIDDEN),
        // Not the active turn.
        (json!([markdown_part("t9", "x")]), STALE),
        // Typed transitions only.
        (
            json!([{"type": "chat/responsePart", "turnId": "t1",
                 "part": {"kind": "error", "error": {"errorType": "x", "message": "m"}}}]),
            FORBIDDEN,
        ),
        // Parts: ids unique, deltas into existing parts of their kind.
        (json!([markdown_part("t1", "md")]), CONFLICT),
        (json!([delta("t1", "nope", "x")]), CONFLICT),
        (json!([delta("t1", "why", "x")]), CONFLICT),
        (
            json!([{"type": "chat/reasoning", "turnId": "t1", "partId": "md", "content": "x"}]),
            CONFLICT,
        ),
        // Tools: authority is the host's; ids new for a start and known otherwise.
        (
            json!([with(
                tool_start("t1", "t2"),
                "contributor",
                json!({"kind": "client", "clientId": "x"})
            )]),
            FORBIDDEN,
        ),
        (json!([tool_start("t1", "tool")]), CONFLICT),
        (json!([tool_complete("t1", "nope")]), CONFLICT),
        (json!([tool_ready("t1", "nope")]), CONFLICT),
        (json!([tool_complete("t1", "tool")]), FORBIDDEN),
        // Readiness: no self-approval, no editing, options nonempty and unique.
        (
            json!([
                tool_start("t1", "t3"),
                with(tool_ready("t1", "t3"), "confirmed", json!("user-action"))
            ]),
            FORBIDDEN,
        ),
        (
            json!([
                tool_start("t1", "t3"),
                with(tool_ready("t1", "t3"), "confirmed", json!("not-needed"))
            ]),
            FORBIDDEN,
        ),
        (
            json!([
                tool_start("t1", "t3"),
                with(tool_ready("t1", "t3"), "editable", json!(true))
            ]),
            PARAMS,
        ),
        (
            json!([
                tool_start("t1", "t3"),
                with(tool_ready("t1", "t3"), "options", json!([]))
            ]),
            PARAMS,
        ),
        (
            json!([
                tool_start("t1", "t3"),
                with(
                    tool_ready("t1", "t3"),
                    "options",
                    json!([{"id": "a", "label": "A", "kind": "approve"}, {"id": "a", "label": "B", "kind": "deny"}])
                )
            ]),
            PARAMS,
        ),
        // Content references: only this session's blobs.
        (
            json!([{"type": "chat/responsePart", "turnId": "t1",
                 "part": {"kind": "contentRef", "uri": other_blob["uri"]}}]),
            FORBIDDEN,
        ),
        (
            json!([{"type": "chat/responsePart", "turnId": "t1",
                 "part": {"kind": "contentRef", "uri": "https://example.com/x"}}]),
            FORBIDDEN,
        ),
        (
            json!([{"type": "chat/responsePart", "turnId": "t1",
                 "part": {"kind": "contentRef", "uri": blob_uri("s1", &sha256_hex(b"never"))}}]),
            FORBIDDEN,
        ),
        // Not an AHP action at all.
        (
            json!([{"type": "chat/responsePart", "turnId": "t1"}]),
            PARAMS,
        ),
        (json!(["text"]), PARAMS),
    ];
    for (actions, want) in cases {
        assert_eq!(emit(&mut alice, actions.clone()), want, "{actions}");
        // All or nothing: a good action before the bad one is not applied either.
        let mut batch = vec![markdown_part("t1", &format!("p{}", unique()))];
        batch.extend(actions.as_array().expect("array").iter().cloned());
        assert_eq!(
            emit(&mut alice, json!(batch)),
            want,
            "{actions} after a good one"
        );
    }
    assert_eq!(
        state(&host, &chat("s1")),
        before,
        "a refused batch changed the chat"
    );
    // An own blob is a fine content reference.
    let own = alice.axp("_axp/blobPut", sample("_axp/blobPut", "s1"));
    alice.axp(
        "_axp/emit",
        emit_params(
            "s1",
            1,
            json!([{"type": "chat/responsePart", "turnId": "t1",
            "part": {"kind": "contentRef", "uri": own["uri"], "contentType": "text/plain"}}]),
        ),
    );
    // Over 64 KiB: the command limit (only uploads are exempt).
    let huge = json!([delta("t1", "md", &"x".repeat(70 * 1024))]);
    assert_eq!(emit(&mut alice, huge), LIMIT);
    // Without a reservation: a budget error. (Settle, then start a turn, then emit.)
    alice.axp(
        "_axp/settle",
        settle_params("s1", 1, "t1", Value::Null, "cancelled"),
    );
    start_turn(&mut admin, "s1", "t2");
    assert_eq!(emit(&mut alice, json!([markdown_part("t2", "a")])), BUDGET);
    // Fenced like every executor mutation.
    let stale = alice.axp_code(
        "_axp/emit",
        emit_params("s1", 2, json!([markdown_part("t2", "a")])),
    );
    assert_eq!(stale, STALE);
}

#[test]
fn dispatch_errors() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut mark = connect(&host, MARK);
    let mut alice = connect(&host, ALICE);
    let d = |ws: &mut Ws, action: Value| {
        ws.axp_code(
            "_axp/dispatch",
            json!({"channel": chat("s1"), "action": action}),
        )
    };
    assert_eq!(d(&mut alice, turn_started("t1", "x")), FORBIDDEN);
    let mut agent_turn = turn_started("t1", "x");
    agent_turn["message"]["origin"]["kind"] = json!("agent");
    assert_eq!(d(&mut admin, agent_turn), FORBIDDEN);
    assert_eq!(
        d(&mut admin, pending_set("queued", "q", "x")["type"].clone()),
        PARAMS
    );
    let mut agent_queued = pending_set("queued", "q", "x");
    agent_queued["message"]["origin"]["kind"] = json!("agent");
    assert_eq!(d(&mut admin, agent_queued), FORBIDDEN);
    // The maintainer (mark) holds the lease himself.
    grant(&mut mark, "s1", "gm", donation());
    assert_eq!(claim(&mut mark, "s1", "em", "gm", 30_000)["epoch"], 1);
    start_turn(&mut admin, "s1", "t1");
    assert_eq!(d(&mut admin, turn_started("t2", "x")), BUSY);
    assert_eq!(
        d(
            &mut admin,
            json!({"type": "chat/turnCancelled", "turnId": "t9", "duration": 1})
        ),
        CONFLICT
    );
    // Only the supported interactions.
    assert_eq!(d(&mut admin, markdown_part("t1", "p")), FORBIDDEN);
    assert_eq!(
        d(
            &mut admin,
            json!({"type": "chat/turnComplete", "turnId": "t1", "duration": 1})
        ),
        FORBIDDEN
    );
    // Tool confirmations.
    reserve(&mut mark, "s1", 1, "t1", 10, 0);
    mark.axp(
        "_axp/emit",
        emit_params("s1", 1, json!([tool_start("t1", "tool")])),
    );
    assert_eq!(
        d(&mut admin, tool_confirmed("t1", "tool", true)),
        CONFLICT,
        "not awaiting"
    );
    mark.axp(
        "_axp/emit",
        emit_params("s1", 1, json!([tool_ready("t1", "tool")])),
    );
    assert_eq!(
        d(&mut admin, tool_confirmed("t9", "tool", true)),
        CONFLICT,
        "not the active turn"
    );
    assert_eq!(
        d(
            &mut admin,
            with(
                tool_confirmed("t1", "tool", true),
                "selectedOptionId",
                json!("no")
            )
        ),
        PARAMS
    );
    assert_eq!(
        d(
            &mut admin,
            with(
                tool_confirmed("t1", "tool", true),
                "selectedOptionId",
                json!("zz")
            )
        ),
        PARAMS
    );
    assert_eq!(
        d(
            &mut admin,
            with(
                tool_confirmed("t1", "tool", false),
                "selectedOptionId",
                json!("yes")
            )
        ),
        PARAMS
    );
    assert_eq!(
        d(
            &mut admin,
            with(
                tool_confirmed("t1", "tool", true),
                "editedToolInput",
                json!("{}")
            )
        ),
        PARAMS
    );
    // The lease holder cannot approve its own tool call, maintainer or not.
    assert_eq!(d(&mut mark, tool_confirmed("t1", "tool", true)), FORBIDDEN);
    assert_eq!(
        admin.axp(
            "_axp/dispatch",
            json!({"channel": chat("s1"), "action": tool_confirmed("t1", "tool", true)})
        ),
        Value::Null
    );
    // Queue at most 32 pending messages.
    for i in 0..32 {
        admin.axp(
            "_axp/dispatch",
            json!({"channel": chat("s1"), "action": pending_set("queued", &format!("q{i}"), "x")}),
        );
    }
    assert_eq!(d(&mut admin, pending_set("queued", "q32", "x")), LIMIT);
    // A turn id is used once.
    mark.axp(
        "_axp/settle",
        settle_params("s1", 1, "t1", Value::Null, "cancelled"),
    );
    let c = state(&host, &chat("s1"));
    assert!(c.get("activeTurn").is_none_or(Value::is_null) || c["activeTurn"]["id"] != "t1");
    admin.axp("_axp/close", json!({"channel": exchange("s1")}));
    assert_eq!(d(&mut admin, turn_started("t1", "again")), PARAMS, "closed");
}

#[test]
fn turn_ids_are_never_reused() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    start_turn(&mut admin, "s1", "t1");
    admin.axp(
        "_axp/dispatch",
        json!({"channel": chat("s1"),
        "action": {"type": "chat/turnCancelled", "turnId": "t1", "duration": 1}}),
    );
    let p = json!({"channel": chat("s1"), "action": turn_started("t1", "again")});
    assert_eq!(admin.axp_code("_axp/dispatch", p), CONFLICT);
}

#[test]
fn a_rejected_dispatch_action_request_is_an_error_without_an_echo() {
    // §15.1: the request form is answered with a JSON-RPC error and no echo; the
    // notification form keeps the rejection echo.
    let host = cast().start();
    let (mut admin, _) = connect_with(&host, ADMIN, &[]);
    create(&mut admin, "s1");
    let (mut olga, _) = connect_with(&host, OLGA, &[&chat("s1")]);
    // (params, whether olga (else admin) sends, the code, whether the notification form echoes: a channel that does not exist
    // is dropped without one, axhost's documented baseline in docs/ahp-baseline.md)
    let cases = [
        (
            json!({"channel": "ahp-chat:/nope", "clientSeq": 1, "action": turn_started("t", "x")}),
            false,
            NOT_FOUND,
            false,
        ),
        (
            json!({"channel": chat("s1"), "clientSeq": 1, "action": turn_started("t", "x")}),
            true,
            FORBIDDEN,
            true,
        ),
        (
            json!({"channel": exchange("s1"), "clientSeq": 2, "action": turn_started("t", "x")}),
            false,
            PARAMS,
            true,
        ),
    ];
    for (params, as_olga, want, echoes) in cases {
        let ws = if as_olga { &mut olga } else { &mut admin };
        let r = ws.call("dispatchAction", params.clone());
        assert_eq!(code(&r), want, "{params}: {r}");
        assert!(r.get("result").is_none(), "a refused request answered {r}");
        ws.expect_no_frame(300);
        ws.notify("dispatchAction", params);
        if echoes {
            let echo = ws.notification("action");
            assert!(echo["params"]["rejectionReason"].is_string(), "{echo}");
        } else {
            ws.expect_no_frame(300);
        }
    }
    let mut admin = connect(&host, ADMIN);
    start_turn(&mut admin, "s1", "t1");
    let r = admin.call(
        "dispatchAction",
        json!({"channel": chat("s1"), "clientSeq": 2, "action": turn_started("t2", "x")}),
    );
    assert_eq!(code(&r), BUSY, "{r}");
}

#[test]
fn comment_errors() {
    let host = leased();
    let mut olga = connect(&host, OLGA);
    let mut alice = connect(&host, ALICE);
    assert_eq!(
        olga.axp_code("_axp/comment", comment_params("s1", "hi")),
        FORBIDDEN
    );
    // A file reference needs the current checkpoint; there is none.
    let sha = "a".repeat(40);
    let with_checkpoint = with(comment_params("s1", "hi"), "checkpoint", json!(sha));
    assert_eq!(
        alice.axp_code("_axp/comment", with_checkpoint.clone()),
        CONFLICT
    );
    let file = with(comment_params("s1", "hi"), "path", json!("src/lib.rs"));
    assert_eq!(alice.axp_code("_axp/comment", file), PARAMS);
    assert_eq!(
        alice.axp_code("_axp/comment", with(with_checkpoint, "path", json!("a.rs"))),
        CONFLICT
    );
    // At most 256 comments a session.
    for i in 0..256 {
        alice.axp("_axp/comment", comment_params("s2", &format!("c{i}")));
    }
    assert_eq!(
        alice.axp_code("_axp/comment", comment_params("s2", "one more")),
        LIMIT
    );
    assert_eq!(
        state(&host, &exchange("s2"))["discussion"]
            .as_array()
            .map(Vec::len),
        Some(256)
    );
}

#[test]
fn blob_errors() {
    let host = cast()
        .config("[limits]\nblob_bytes_max = 1024\nblob_storage_bytes_max = 4096\n")
        .start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let mut olga = connect(&host, OLGA);
    let put =
        |data: Value| json!({"channel": exchange("s1"), "data": data, "mediaType": "text/plain"});
    assert_eq!(
        olga.axp_code("_axp/blobPut", put(json!(b64(b"x")))),
        FORBIDDEN
    );
    assert_eq!(olga.axp_code("_axp/blobPut", put(json!(""))), FORBIDDEN);
    // Base64 that does not round-trip exactly.
    for bad in ["not base64!", "aGk", "aGk==", "aGk=\n", " aGk=", "aG=k"] {
        assert_eq!(
            alice.axp_code("_axp/blobPut", put(json!(bad))),
            PARAMS,
            "{bad:?}"
        );
    }
    // Per blob and in total.
    alice.axp("_axp/blobPut", put(json!(b64(&[1u8; 1024]))));
    assert_eq!(
        alice.axp_code("_axp/blobPut", put(json!(b64(&[1u8; 1025])))),
        LIMIT
    );
    let mut stored = 1024;
    let mut n = 2u8;
    let code = loop {
        let r = alice.call(
            "_axp/blobPut",
            with_op("_axp/blobPut", put(json!(b64(&[n; 1024])))),
        );
        if r.get("error").is_some() {
            break code(&r);
        }
        stored += 1024;
        n += 1;
        assert!(
            stored <= 4096,
            "stored {stored} bytes under a 4096-byte quota"
        );
    };
    assert_eq!(code, LIMIT);
    // The same bytes again are stored once, so they still fit.
    alice.axp("_axp/blobPut", put(json!(b64(&[1u8; 1024]))));
    // Reads.
    let missing = json!({"channel": exchange("s1"), "digest": sha256_hex(b"missing")});
    assert_eq!(alice.axp_code("_axp/blobGet", missing), NOT_FOUND);
    let rr =
        |ws: &mut Ws, uri: String| ws.code_of("resourceRead", json!({"channel": ROOT, "uri": uri}));
    assert_eq!(
        rr(&mut alice, blob_uri("s1", &sha256_hex(b"missing"))),
        NOT_FOUND
    );
    assert_eq!(rr(&mut alice, "file:///etc/passwd".into()), FORBIDDEN);
    assert_eq!(
        rr(
            &mut alice,
            format!("axp-blob:/{}/xyz", encode_component(&exchange("s1")))
        ),
        FORBIDDEN
    );
    assert_eq!(
        rr(
            &mut alice,
            "axp-blob:/axp-session%3A%2Fnope/".to_owned() + &sha256_hex(b"x")
        ),
        NOT_FOUND
    );
}

#[test]
fn executor_output_is_charged_against_the_chat_limit_as_it_arrives() {
    let host = cast().config("[limits]\nchat_bytes_max = 8192\n").start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 100, 0);
    alice.axp(
        "_axp/emit",
        emit_params("s1", epoch, json!([markdown_part("t1", "p")])),
    );
    let chunk = "x".repeat(1024);
    let mut refused = None;
    for i in 0..16 {
        let r = alice.call(
            "_axp/emit",
            with_op(
                "_axp/emit",
                emit_params("s1", epoch, json!([delta("t1", "p", &chunk)])),
            ),
        );
        if r.get("error").is_some() {
            refused = Some((i, code(&r)));
            break;
        }
    }
    let (i, c) = refused.expect("16 KiB of output fit an 8 KiB chat");
    assert!(i >= 4, "refused after only {i} KiB");
    assert_eq!(c, LIMIT);
}
