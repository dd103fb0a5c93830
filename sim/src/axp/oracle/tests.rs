//! Unit tests of the AXP oracles.

use super::*;
use serde_json::json;

fn exchange(spent: u64, usage: Value) -> Value {
    json!({"epoch": 1, "status": "open", "lease": null, "reservation": null,
           "grants": {"g": {"id": "g", "limit": {"tokens": 10, "costMicros": 10, "turns": 5},
                            "spent": {"tokens": spent, "costMicros": 0, "turns": usage.as_array().map_or(0, Vec::len)},
                            "revoked": false}},
           "usage": usage})
}

#[test]
fn spent_must_equal_the_usage_charged() {
    let ok = exchange(
        7,
        json!([{"turnId": "t", "grantId": "g", "usage": {"inputTokens": 5, "outputTokens": 2, "costMicros": 0}}]),
    );
    money("s", &ok).expect("balanced");
    let off = exchange(
        8,
        json!([{"turnId": "t", "grantId": "g", "usage": {"inputTokens": 5, "outputTokens": 2, "costMicros": 0}}]),
    );
    assert!(money("s", &off).is_err());
}

#[test]
fn an_overspend_must_revoke_and_a_turn_settles_once() {
    let over = exchange(
        12,
        json!([{"turnId": "t", "grantId": "g", "usage": {"inputTokens": 12, "outputTokens": 0, "costMicros": 0}}]),
    );
    assert!(money("s", &over).unwrap_err().contains("not revoked"));
    let twice = exchange(
        2,
        json!([
        {"turnId": "t", "grantId": "g", "usage": {"inputTokens": 1, "outputTokens": 0, "costMicros": 0}},
        {"turnId": "t", "grantId": "g", "usage": {"inputTokens": 1, "outputTokens": 0, "costMicros": 0}}]),
    );
    assert!(money("s", &twice).unwrap_err().contains("twice"));
}

#[test]
fn reviews_and_verifications_name_the_current_checkpoint() {
    let cp = json!({"baseCommit": "a", "headCommit": "b"});
    let digest = hash_object(&cp);
    let ok = json!({"checkpoint": cp, "review": {"manifest": {"baseCommit": "a", "headCommit": "b",
                    "checkpointDigest": digest}},
                    "verification": {"headCommit": "b"}, "compaction": null});
    assert!(artifacts("s", &ok).is_ok());
    // The same head recorded again (another bundle, another time) is another checkpoint.
    let mut redone = ok.clone();
    redone["checkpoint"]["createdAt"] = json!(5);
    assert!(artifacts("s", &redone).is_err());
    let mut stale = ok.clone();
    stale["checkpoint"]["headCommit"] = json!("c");
    assert!(artifacts("s", &stale).is_err());
    let mut no_checkpoint = ok.clone();
    no_checkpoint["checkpoint"] = Value::Null;
    no_checkpoint["review"] = Value::Null;
    assert!(
        artifacts("s", &no_checkpoint).is_err(),
        "a verification without a checkpoint"
    );
}

#[test]
fn context_revisions_only_go_up_and_the_base_never_moves() {
    let s0 = json!({"epoch": 0, "usage": [], "status": "open",
        "checkpoint": {"baseCommit": "a", "headCommit": "h"},
        "context": {"revision": 1, "gitHead": "h", "summary": "x"}});
    let mut same_rev = s0.clone();
    same_rev["context"]["summary"] = json!("y");
    assert!(monotone("s", &s0, &same_rev).is_err());
    let mut up = same_rev.clone();
    up["context"]["revision"] = json!(2);
    assert!(monotone("s", &s0, &up).is_ok());
    let mut wrong_head = up.clone();
    wrong_head["context"]["gitHead"] = json!("old");
    assert!(monotone("s", &s0, &wrong_head).is_err());
    let mut rebased = s0.clone();
    rebased["checkpoint"]["baseCommit"] = json!("z");
    assert!(monotone("s", &s0, &rebased).is_err());
}

#[test]
fn epochs_and_usage_only_move_forward() {
    let a = exchange(0, json!([]));
    let mut b = a.clone();
    b["epoch"] = json!(0);
    assert!(monotone("s", &a, &b).is_err());
    monotone("s", &b, &a).expect("forward");
}

#[test]
fn two_different_claims_cannot_win_one_epoch() {
    let mut o = AxpOracle::default();
    let p1 = Principal {
        role: Role::Contributor,
        ..Principal::maintainer("c1")
    };
    let p2 = Principal {
        role: Role::Contributor,
        ..Principal::maintainer("c2")
    };
    o.connected(ConnId(1), &p1);
    o.connected(ConnId(2), &p2);
    let empty = AxpInspect {
        exchanges: BTreeMap::new(),
        executors: Value::Null,
        blob_storage_bytes: 0,
        memory: Value::Null,
    };
    for (conn, op) in [(1, "a"), (2, "b")] {
        let text = json!({"jsonrpc": "2.0", "id": 1, "method": "_axp/claim",
                          "params": {"channel": "axp-session:/s", "operationId": op}})
        .to_string();
        o.feeding(ConnId(conn), &text, 0, || empty.clone());
    }
    let answer = r#"{"jsonrpc":"2.0","id":1,"result":{"epoch":3}}"#;
    o.on_send(ConnId(1), answer).expect("first winner");
    assert!(o
        .on_send(ConnId(2), answer)
        .unwrap_err()
        .contains("two claims"));
}
