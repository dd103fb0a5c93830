//! Backpressure from the disk, against the real `axhost serve` with its SQLite writer: with
//! `in_flight_changes_max = 1` every change fills the write path until the writer reports it
//! durable, so the driver stops reading between almost every two mutations and resumes on the
//! writer's wake-up. Pipelined mutations are all answered, with success and in order, none
//! refused (the host once answered `-32603` past its in-flight cap, and executors whose
//! heartbeats were refused lost their leases), and the pauses are logged.

mod axp_support;
mod common;

use std::time::{Duration, Instant};

use axp_support::*;
use common::*;
use serde_json::{json, Value};

const ONE_CHANGE: &str = "[limits]\nin_flight_changes_max = 1\n";

/// Reads frames until every id in `ids` is answered; returns the answers in arrival order.
fn answers(ws: &mut Ws, ids: &[u64]) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut got = Vec::new();
    while got.len() < ids.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        match ws.next(left) {
            Incoming::Json(v) => {
                let answer = v.get("result").is_some() || v.get("error").is_some();
                if answer && v["id"].as_u64().is_some_and(|id| ids.contains(&id)) {
                    got.push(v);
                }
            }
            other => panic!("{} of {} answers, then {other:?}", got.len(), ids.len()),
        }
    }
    got
}

/// Every answer succeeded and they came in the order the requests were sent.
fn all_ok_in_order(got: &[Value], ids: &[u64]) {
    let errors: Vec<&Value> = got.iter().filter(|v| v.get("error").is_some()).collect();
    assert!(errors.is_empty(), "refused under backpressure: {errors:?}");
    let order: Vec<u64> = got.iter().filter_map(|v| v["id"].as_u64()).collect();
    assert_eq!(order, ids, "answers out of order");
}

#[test]
fn pipelined_mutations_through_a_one_change_path_are_all_answered_in_order() {
    let host = HostProcess::builder().config(ONE_CHANGE).start();
    let mut conns: Vec<Ws> = (0..4).map(|_| connect(&host, ADMIN)).collect();
    // Every connection sends all its requests before reading any answer.
    let mut sent: Vec<Vec<u64>> = Vec::new();
    for (c, ws) in conns.iter_mut().enumerate() {
        let mut ids = Vec::new();
        for k in 0..30 {
            let session = format!("ahp-session:/bp{c}-{k}");
            ids.push(ws.send_request("createSession", json!({"channel": session})));
            if k % 10 == 9 {
                ids.push(ws.send_request("listSessions", json!({"channel": ROOT})));
            }
        }
        sent.push(ids);
    }
    for (ws, ids) in conns.iter_mut().zip(&sent) {
        let got = answers(ws, ids);
        all_ok_in_order(&got, ids);
    }
    let listing = conns[0].ok("listSessions", json!({"channel": ROOT}));
    assert_eq!(listing["items"].as_array().map(Vec::len), Some(120));
    let log = host.stderr();
    assert!(log.contains("input paused"), "{log}");
    assert!(log.contains("input resumed"), "{log}");
    assert!(!log.contains("past the input hold"), "{log}");
}

#[test]
fn executors_streaming_through_a_full_path_keep_their_leases() {
    let host = cast().config(ONE_CHANGE).start();
    let mut admin = connect(&host, ADMIN);
    let mut executors = Vec::new();
    for (i, who) in [ALICE, BOB].into_iter().enumerate() {
        let id = format!("s{i}");
        create(&mut admin, &id);
        let mut ws = connect(&host, who);
        let epoch = dock(&mut ws, &id);
        start_turn(&mut admin, &id, "t1");
        reserve(&mut ws, &id, epoch, "t1", 1000, 1000);
        ws.axp(
            "_axp/emit",
            emit_params(&id, epoch, json!([markdown_part("t1", "p")])),
        );
        executors.push((ws, id, epoch));
    }
    // Output as fast as the executors can send it, a heartbeat every ten emits, nothing awaited.
    let mut sent: Vec<Vec<u64>> = Vec::new();
    for (ws, id, epoch) in executors.iter_mut() {
        let mut ids = Vec::new();
        for k in 0..60 {
            let emit = emit_params(id, *epoch, json!([delta("t1", "p", &format!("{k} "))]));
            ids.push(ws.send_request("_axp/emit", with_op("_axp/emit", emit)));
            if k % 10 == 9 {
                let renew = with_op("_axp/renew", fenced(id, *epoch));
                ids.push(ws.send_request("_axp/renew", renew));
            }
        }
        sent.push(ids);
    }
    for ((ws, id, epoch), ids) in executors.iter_mut().zip(&sent) {
        let got = answers(ws, ids);
        all_ok_in_order(&got, ids);
        let ex = state(&host, &exchange(id));
        assert_eq!(ex["status"], "open", "{ex}");
        assert_eq!(ex["lease"]["epoch"], *epoch, "{ex}");
    }
    let log = host.stderr();
    assert!(log.contains("input paused"), "{log}");
}
