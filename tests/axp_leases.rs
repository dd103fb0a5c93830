//! The AXP 0.2.0 exchange, part 1: leases, budgets and turn control over time, against the
//! real `axhost serve` over real WebSocket: revocation and close, re-granting, overspend, lease
//! expiry by the host's own timers, heartbeats, `resumeEpoch`, concurrent claims (also racing an
//! expiry), steering and cancellation. Written against `../shared/reference/axp-host-notes.md`
//! §6–§9 and §15; the commands' happy paths are in `tests/axp.rs`.

mod axp_support;
mod common;

use std::time::Duration;

use axp_support::*;
use common::*;
use serde_json::{json, Value};

#[test]
fn revocation_settles_once_fences_output_and_close_frees_the_task() {
    // The reference's lifecycle test, on the wire.
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 99, 100);
    admin.axp(
        "_axp/dispatch",
        json!({"channel": chat("s1"), "action": pending_set("queued", "q1", "Next")}),
    );
    // Only the donor revokes.
    assert_eq!(
        admin.axp_code(
            "_axp/revoke",
            json!({"channel": exchange("s1"), "grantId": "g"})
        ),
        FORBIDDEN
    );
    let revoke = json!({"channel": exchange("s1"), "grantId": "g", "operationId": "revoke"});
    assert_eq!(alice.ok("_axp/revoke", revoke.clone()), Value::Null);
    assert_eq!(alice.ok("_axp/revoke", revoke), Value::Null);
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["status"], "orphaned");
    assert_eq!(ex["lease"], Value::Null);
    assert_eq!(ex["grants"]["g"]["revoked"], true);
    assert_eq!(ex["usage"].as_array().map(Vec::len), Some(1));
    assert_eq!(ex["grants"]["g"]["spent"]["tokens"], 99);
    assert_eq!(
        alice.axp_code(
            "_axp/settle",
            settle_params("s1", epoch, "t1", Value::Null, "complete")
        ),
        STALE
    );
    // The task stays owned until the session is closed, and only a maintainer closes.
    let replacement = json!({"channel": session("s2"), "config": {"task": session("s1")}});
    assert_eq!(
        admin.code_of("createSession", replacement.clone()),
        CONFLICT
    );
    assert_eq!(
        alice.axp_code("_axp/close", json!({"channel": exchange("s1")})),
        FORBIDDEN
    );
    assert_eq!(
        admin.axp("_axp/close", json!({"channel": exchange("s1")})),
        Value::Null
    );
    // Closing again is a no-op.
    assert_eq!(
        admin.axp("_axp/close", json!({"channel": exchange("s1")})),
        Value::Null
    );
    let c = state(&host, &chat("s1"));
    assert!(c.get("activeTurn").is_none_or(Value::is_null), "{c}");
    assert!(
        c.get("queuedMessages")
            .is_none_or(|q| q.is_null() || q.as_array().is_some_and(Vec::is_empty)),
        "{c}"
    );
    assert_eq!(c["turns"].as_array().map(Vec::len), Some(1));
    admin.ok("createSession", replacement);
    assert_eq!(state(&host, &exchange("s1"))["status"], "closed");
    assert_eq!(
        admin.axp_code(
            "_axp/dispatch",
            json!({"channel": chat("s1"), "action": turn_started("t2", "again")})
        ),
        PARAMS
    );
    // A closed session cannot be claimed (checked before the grant, revoked here).
    assert_eq!(
        alice.axp_code("_axp/claim", claim_params("s1", "e", "g", 30_000)),
        CONFLICT
    );
}

#[test]
fn the_donor_may_regrant_and_a_limit_below_spending_is_refused() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 500, 50);
    // Tokens reported, USD charged from the reservation: costSource says so.
    let mut reported = usage(300, 100, 0, 40);
    reported["costSource"] = json!("reservation");
    let mut bad = settle_params("s1", epoch, "t1", reported.clone(), "complete");
    bad["usage"]["costSource"] = json!("guess");
    assert_eq!(alice.axp_code("_axp/settle", bad), PARAMS);
    alice.axp(
        "_axp/settle",
        settle_params("s1", epoch, "t1", reported.clone(), "complete"),
    );
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["grants"]["g"]["spent"], allowance(400, 40, 1));
    assert_eq!(ex["usage"][0]["usage"], reported, "{ex}");
    // The chat's turn carries the tokens, with cost and sources under the AXP key.
    let c = state(&host, &chat("s1"));
    let u = &c["turns"][0]["usage"];
    assert_eq!(u["inputTokens"], 300, "{c}");
    assert_eq!(u["outputTokens"], 100, "{c}");
    assert_eq!(
        u["_meta"]["org.axp.exchange"],
        json!({"costMicros": 40, "source": "reported", "costSource": "reservation"}),
        "{c}"
    );
    // Lowering the limit to what was spent is fine; below it is a budget error.
    let g = grant(&mut alice, "s1", "g", allowance(400, 40, 1));
    assert_eq!(g["spent"], allowance(400, 40, 1));
    let low = json!({"channel": exchange("s1"), "grantId": "g", "limit": allowance(399, 40, 1),
                     "enforcement": "accounting"});
    assert_eq!(alice.axp_code("_axp/grant", low), BUDGET);
    // Revoked, then re-granted by its donor: revoked clears, spending stays (§15.8).
    alice.axp(
        "_axp/revoke",
        json!({"channel": exchange("s1"), "grantId": "g"}),
    );
    let g = alice.axp(
        "_axp/grant",
        json!({"channel": exchange("s1"), "grantId": "g", "limit": donation(),
               "enforcement": "provider"}),
    );
    assert_eq!(g["revoked"], false);
    assert_eq!(g["spent"], allowance(400, 40, 1));
    assert_eq!(g["enforcement"], "provider");
}

#[test]
fn a_truthful_overspend_is_recorded_and_revokes_the_grant() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    grant(&mut alice, "s1", "g", allowance(150, 1_000, 5));
    let epoch = claim(&mut alice, "s1", "e", "g", 30_000)["epoch"]
        .as_u64()
        .expect("epoch");
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 100, 10);
    alice.axp(
        "_axp/settle",
        settle_params("s1", epoch, "t1", usage(180, 20, 50, 10), "complete"),
    );
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["grants"]["g"]["spent"], allowance(200, 10, 1), "{ex}");
    assert_eq!(ex["grants"]["g"]["revoked"], true, "{ex}");
    // Overspend beats stale (§15.5): the lease's own next fenced calls are budget errors.
    assert_eq!(alice.axp_code("_axp/renew", fenced("s1", epoch)), BUDGET);
    start_turn(&mut admin, "s1", "t2");
    assert_eq!(
        alice.axp_code(
            "_axp/reserve",
            reserve_params("s1", epoch, "t2", allowance(1, 0, 1))
        ),
        BUDGET
    );
    for (method, params) in [
        (
            "_axp/emit",
            emit_params("s1", epoch, json!([markdown_part("t2", "p")])),
        ),
        (
            "_axp/settle",
            settle_params("s1", epoch, "t2", Value::Null, "complete"),
        ),
        ("_axp/release", fenced("s1", epoch)),
    ] {
        assert_eq!(alice.axp_code(method, params), BUDGET, "{method}");
    }
    // Nothing changed: the lease is still there, and the spending stays on record.
    let after = state(&host, &exchange("s1"));
    assert_eq!(after["lease"]["epoch"], epoch);
    assert_eq!(after["grants"], ex["grants"]);
}

#[test]
fn a_lease_expires_by_time_orphaning_the_session_and_charging_the_reservation() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    register(&mut alice, "e", 3_000);
    grant(&mut alice, "s1", "g", donation());
    let lease = claim(&mut alice, "s1", "e", "g", 3_000);
    assert_eq!(lease["heartbeatMs"], 1_000);
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", 1, "t1", 1_000, 10_000);
    // Output is not a heartbeat: emitting does not keep the lease.
    alice.axp(
        "_axp/emit",
        emit_params("s1", 1, json!([markdown_part("t1", "p")])),
    );
    let (mut watch, _) = connect_with(&host, OLGA, &[&exchange("s1")]);
    let expires = lease["expiresAt"].as_u64().expect("expiresAt");
    std::thread::sleep(Duration::from_millis(
        expires.saturating_sub(now_ms()) + 300,
    ));
    // The host's own timer orphans the session: a subscriber hears it without asking.
    let orphaned = loop {
        let n = watch.notification("action");
        if n["params"]["action"]["type"] == "_axp/leaseChanged" {
            break n;
        }
    };
    assert_eq!(
        orphaned["params"]["action"],
        json!({"type": "_axp/leaseChanged", "lease": null, "epoch": 1, "status": "orphaned"})
    );
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["lease"], Value::Null);
    assert_eq!(ex["status"], "orphaned");
    assert_eq!(ex["reservation"], Value::Null);
    assert_eq!(
        ex["grants"]["g"]["spent"],
        allowance(1_000, 10_000, 1),
        "{ex}"
    );
    assert_eq!(ex["usage"][0]["usage"]["source"], "reservation");
    let c = state(&host, &chat("s1"));
    assert!(c.get("activeTurn").is_none_or(Value::is_null), "{c}");
    let registry = wait_state(&host, EXECUTORS, Duration::from_secs(3), |r| {
        r["entries"]["e"]["online"] == false
    });
    assert_eq!(registry["entries"]["e"]["owner"], ALICE);
    // The expired epoch fences nothing; a new claim advances the epoch.
    assert_eq!(alice.axp_code("_axp/renew", fenced("s1", 1)), STALE);
    let next = claim(&mut alice, "s1", "e2", "g", 3_000);
    assert_eq!(next["epoch"], 2);
}

#[test]
fn renewing_every_heartbeat_keeps_a_lease_past_its_first_expiry() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    grant(&mut alice, "s1", "g", donation());
    let lease = claim(&mut alice, "s1", "e", "g", 3_000);
    let first_expiry = lease["expiresAt"].as_u64().expect("expiresAt");
    for _ in 0..5 {
        std::thread::sleep(Duration::from_millis(1_000));
        let renewed = alice.axp("_axp/renew", fenced("s1", 1));
        assert!(renewed["expiresAt"].as_u64().expect("expiresAt") > first_expiry);
    }
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["status"], "open");
    assert_eq!(ex["lease"]["epoch"], 1);
}

#[test]
fn resume_epoch_recovers_a_lease_but_not_after_an_intervening_owner() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    assert_eq!(epoch, 1);
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", 1, "t1", 700, 7);
    // Still holding the lease: the resume orphans the old epoch (charging the reservation
    // in full) and issues the next one.
    let mut resume = claim_params("s1", "e", "g", 30_000);
    resume["resumeEpoch"] = json!(1);
    let lease = alice.axp("_axp/claim", resume);
    assert_eq!(lease["epoch"], 2);
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["status"], "open");
    assert_eq!(ex["grants"]["g"]["spent"], allowance(700, 7, 1), "{ex}");
    assert_eq!(ex["reservation"], Value::Null);
    assert_eq!(alice.axp_code("_axp/renew", fenced("s1", 1)), STALE);

    // Another owner claims in between and releases again: resuming epoch 2 is refused.
    alice.axp("_axp/release", fenced("s1", 2));
    let mut bob = connect(&host, BOB);
    grant(&mut bob, "s1", "gb", donation());
    assert_eq!(claim(&mut bob, "s1", "eb", "gb", 30_000)["epoch"], 3);
    bob.axp("_axp/release", fenced("s1", 3));
    let mut resume = claim_params("s1", "e", "g", 30_000);
    resume["resumeEpoch"] = json!(2);
    assert_eq!(alice.axp_code("_axp/claim", resume), STALE);
    // A plain claim still works, and advances the epoch.
    assert_eq!(claim(&mut alice, "s1", "e", "g", 30_000)["epoch"], 4);
}

#[test]
fn concurrent_claims_have_exactly_one_winner() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let claimants = [ALICE, BOB, MARK, ADMIN];
    let mut conns: Vec<Ws> = claimants
        .iter()
        .map(|id| {
            let mut ws = connect(&host, id);
            grant(&mut ws, "s1", &format!("g-{id}"), donation());
            ws
        })
        .collect();
    let ids: Vec<u64> = conns
        .iter_mut()
        .zip(claimants)
        .map(|(ws, id)| {
            ws.send_request(
                "_axp/claim",
                with_op(
                    "_axp/claim",
                    claim_params("s1", &format!("e-{id}"), &format!("g-{id}"), 30_000),
                ),
            )
        })
        .collect();
    let answers: Vec<Value> = conns
        .iter_mut()
        .zip(ids)
        .map(|(ws, id)| ws.response(id))
        .collect();
    let winners: Vec<&Value> = answers
        .iter()
        .filter(|a| a.get("result").is_some())
        .collect();
    assert_eq!(winners.len(), 1, "{answers:?}");
    for a in answers.iter().filter(|a| a.get("error").is_some()) {
        assert_eq!(code(a), CONFLICT, "{a}");
    }
    assert_eq!(winners[0]["result"]["epoch"], 1);
    assert_eq!(state(&host, &exchange("s1"))["epoch"], 1);
}

#[test]
fn steering_cancels_the_running_turn_and_starts_the_next() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 300, 3);
    admin.axp(
        "_axp/dispatch",
        json!({"channel": chat("s1"), "action": pending_set("steering", "st", "Do X instead")}),
    );
    let c = state(&host, &chat("s1"));
    assert_eq!(c["turns"].as_array().map(Vec::len), Some(1), "{c}");
    assert_eq!(c["turns"][0]["id"], "t1");
    let next = &c["activeTurn"];
    assert_ne!(next["id"], "t1", "{c}");
    assert_eq!(next["message"]["text"], "Do X instead");
    assert!(c.get("steeringMessage").is_none_or(Value::is_null), "{c}");
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["reservation"], Value::Null);
    assert_eq!(ex["grants"]["g"]["spent"], allowance(300, 3, 1), "{ex}");
    assert_eq!(ex["usage"][0]["usage"]["source"], "reservation");
    // The executor reserves the new turn.
    let turn = next["id"].as_str().expect("turn id").to_owned();
    reserve(&mut alice, "s1", epoch, &turn, 300, 3);
}

#[test]
fn a_maintainer_cancel_charges_the_full_reservation_and_queued_messages_start_next() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 400, 4);
    admin.axp(
        "_axp/dispatch",
        json!({"channel": chat("s1"),
               "action": {"type": "chat/turnCancelled", "turnId": "t1", "duration": 1}}),
    );
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["reservation"], Value::Null);
    assert_eq!(ex["grants"]["g"]["spent"], allowance(400, 4, 1), "{ex}");
    // A queued message waits for the next settled turn: queue during t2, settle t2 complete,
    // and the host starts the queued one.
    start_turn(&mut admin, "s1", "t2");
    admin.axp(
        "_axp/dispatch",
        json!({"channel": chat("s1"), "action": pending_set("queued", "q1", "Afterwards")}),
    );
    reserve(&mut alice, "s1", epoch, "t2", 10, 0);
    alice.axp(
        "_axp/settle",
        settle_params("s1", epoch, "t2", usage(5, 5, 0, 0), "complete"),
    );
    let c = state(&host, &chat("s1"));
    assert_eq!(c["activeTurn"]["message"]["text"], "Afterwards", "{c}");
    assert_eq!(c["turns"].as_array().map(Vec::len), Some(2));
}

#[test]
fn closing_a_running_session_settles_cancels_and_clears_pending_messages() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    let epoch = dock(&mut alice, "s1");
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", epoch, "t1", 250, 25);
    for (i, kind) in ["queued", "queued"].iter().enumerate() {
        admin.axp(
            "_axp/dispatch",
            json!({"channel": chat("s1"), "action": pending_set(kind, &format!("q{i}"), "later")}),
        );
    }
    admin.axp("_axp/close", json!({"channel": exchange("s1")}));
    let ex = state(&host, &exchange("s1"));
    assert_eq!(ex["status"], "closed");
    assert_eq!(ex["lease"], Value::Null);
    assert_eq!(ex["epoch"], epoch, "closing keeps the epoch");
    assert_eq!(ex["reservation"], Value::Null);
    assert_eq!(ex["grants"]["g"]["spent"], allowance(250, 25, 1), "{ex}");
    let c = state(&host, &chat("s1"));
    assert!(c.get("activeTurn").is_none_or(Value::is_null), "{c}");
    assert!(
        c.get("queuedMessages")
            .is_none_or(|q| q.is_null() || q.as_array().is_some_and(Vec::is_empty)),
        "{c}"
    );
    assert_eq!(c["turns"].as_array().map(Vec::len), Some(1));
    // Nothing runs in a closed session.
    assert_eq!(alice.axp_code("_axp/renew", fenced("s1", epoch)), STALE);
    assert_eq!(
        alice.axp_code("_axp/claim", claim_params("s1", "e", "g", 30_000)),
        CONFLICT
    );
    let mut resume = claim_params("s1", "e", "g", 30_000);
    resume["resumeEpoch"] = json!(epoch);
    assert_eq!(alice.axp_code("_axp/claim", resume), CONFLICT);
}

#[test]
fn claims_racing_a_lease_expiry_have_exactly_one_winner_and_one_settlement() {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    let mut alice = connect(&host, ALICE);
    grant(&mut alice, "s1", "g", donation());
    let lease = claim(&mut alice, "s1", "e", "g", 3_000);
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", 1, "t1", 600, 6);
    let claimants = [BOB, MARK, ADMIN];
    let mut conns: Vec<Ws> = claimants
        .iter()
        .map(|id| {
            let mut ws = connect(&host, id);
            grant(&mut ws, "s1", &format!("g-{id}"), donation());
            ws
        })
        .collect();
    let expires = lease["expiresAt"].as_u64().expect("expiresAt");
    // Fire just around the expiry, staggered over 40 ms.
    std::thread::sleep(Duration::from_millis(
        expires.saturating_sub(now_ms()).saturating_sub(20),
    ));
    let mut ids = Vec::new();
    for (ws, id) in conns.iter_mut().zip(claimants) {
        let p = claim_params("s1", &format!("e-{id}"), &format!("g-{id}"), 30_000);
        ids.push(ws.send_request("_axp/claim", with_op("_axp/claim", p)));
        std::thread::sleep(Duration::from_millis(20));
    }
    let answers: Vec<Value> = conns
        .iter_mut()
        .zip(ids)
        .map(|(ws, id)| ws.response(id))
        .collect();
    let won: Vec<&Value> = answers
        .iter()
        .filter(|a| a.get("result").is_some())
        .collect();
    // A claim before the expiry loses to the live lease (-32011); one after it wins.
    assert!(won.len() <= 1, "{answers:?}");
    for a in answers.iter().filter(|a| a.get("error").is_some()) {
        assert_eq!(code(a), CONFLICT, "{a}");
    }
    let ex = wait_state(&host, &exchange("s1"), Duration::from_secs(3), |s| {
        s["status"] != "open" || s["lease"]["epoch"] == 2
    });
    assert_eq!(
        ex["usage"].as_array().map(Vec::len),
        Some(1),
        "settled once: {ex}"
    );
    assert_eq!(ex["grants"]["g"]["spent"], allowance(600, 6, 1), "{ex}");
    if let Some(w) = won.first() {
        assert_eq!(w["result"]["epoch"], 2, "{w}");
        assert_eq!(ex["epoch"], 2);
    } else {
        assert_eq!(ex["status"], "orphaned");
        assert_eq!(ex["epoch"], 1);
    }
}
