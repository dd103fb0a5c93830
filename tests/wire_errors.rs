//! Raw WebSocket / HTTP tests against the real `axhost serve`: transport credentials, the
//! HTTP surface, JSON-RPC error handling and the access rules of issue 2.
//!
//! Every test starts its own host process on a free port, so they run in parallel.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{json, Value};

const ROOT: &str = "ahp-root://";

fn create_session(ws: &mut Ws, id: &str) {
    let r = ws.ok(
        "createSession",
        json!({"channel": format!("ahp-session:/{id}")}),
    );
    assert_eq!(r, Value::Null, "createSession result must be null");
}

// ─── Transport credentials and HTTP ──────────────────────────────────────────

#[test]
fn missing_or_wrong_token_is_http_401_before_any_json_rpc() {
    let host = HostProcess::start();
    for path in [
        "/axp".to_owned(),
        "/axp?tkn=not-the-right-token-at-all-000000".to_owned(),
        "/axp?tkn=".to_owned(),
    ] {
        match Ws::connect(host.port, &path, &[]) {
            Ok(_) => panic!("upgrade to {path} was accepted without a valid token"),
            Err(e) => assert_eq!(
                refused_status(&e),
                Some(401),
                "{path}: {}",
                describe_ws_error(&e)
            ),
        }
    }
    // A wrong bearer header is refused too, even when the query is absent.
    let e = Ws::connect(
        host.port,
        "/axp",
        &[("Authorization", "Bearer not-the-right-token-at-all-000000")],
    )
    .err()
    .expect("wrong bearer token accepted");
    assert_eq!(refused_status(&e), Some(401), "{}", describe_ws_error(&e));
    // Almost right: the real token with its last character changed.
    let mut near = host.token().to_owned();
    let last = near.pop().expect("token");
    near.push(if last == 'a' { 'b' } else { 'a' });
    let e = Ws::connect(host.port, &format!("/axp?tkn={near}"), &[])
        .err()
        .expect("near-miss token accepted");
    assert_eq!(refused_status(&e), Some(401), "{}", describe_ws_error(&e));
}

#[test]
fn token_via_bearer_header_or_query_parameters_works() {
    let host = HostProcess::start();
    let token = host.token().to_owned();
    let bearer = format!("Bearer {token}");
    let mut by_header = Ws::connect(host.port, "/axp", &[("Authorization", &bearer)])
        .expect("Authorization: Bearer accepted");
    assert_eq!(by_header.ok("ping", json!({"channel": ROOT})), Value::Null);
    let mut by_token =
        Ws::connect(host.port, &format!("/axp?token={token}"), &[]).expect("?token= accepted");
    assert_eq!(by_token.ok("ping", json!({"channel": ROOT})), Value::Null);
    let mut by_tkn =
        Ws::connect(host.port, &format!("/axp?tkn={token}"), &[]).expect("?tkn= accepted");
    assert_eq!(by_tkn.ok("ping", json!({"channel": ROOT})), Value::Null);
    // The endpoint is also served at `/`.
    let mut at_root = Ws::connect(host.port, &format!("/?tkn={token}"), &[]).expect("/ accepted");
    assert_eq!(at_root.ok("ping", json!({"channel": ROOT})), Value::Null);
    // Other query parameters do not get in the way.
    let mut mixed = Ws::connect(host.port, &format!("/axp?x=1&tkn={token}&y=2"), &[])
        .expect("tkn among others");
    assert_eq!(mixed.ok("ping", json!({"channel": ROOT})), Value::Null);
}

#[test]
fn healthz_and_unknown_paths() {
    let host = HostProcess::start();
    let (status, body) = host.http("GET", "/healthz");
    assert_eq!(status, 200, "GET /healthz: {body}");
    let v: Value = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("/healthz body is not JSON ({e}): {body}"));
    assert_eq!(v, json!({"status": "ok", "protocol": "0.2.0"}));
    // /healthz needs no credential; other paths are 404.
    let (status, _) = host.http("GET", "/nope");
    assert_eq!(status, 404, "GET /nope");
    let (status, _) = host.http("GET", "/axp/extra");
    assert_eq!(status, 404, "GET /axp/extra");
    // A WebSocket upgrade to an unknown path, with a valid token, is not served either.
    let e = Ws::connect(host.port, &format!("/other?tkn={}", host.token()), &[])
        .err()
        .expect("upgrade on an unknown path was accepted");
    assert_eq!(refused_status(&e), Some(404), "{}", describe_ws_error(&e));
}

// ─── Before the handshake ────────────────────────────────────────────────────

#[test]
fn ping_before_initialize_answers_null_and_other_methods_are_refused() {
    let host = HostProcess::start();
    let mut ws = host.ws();
    let r = ws.call("ping", json!({"channel": ROOT}));
    assert_eq!(r, json!({"jsonrpc": "2.0", "id": 1, "result": null}));
    for (method, params) in [
        ("listSessions", json!({"channel": ROOT})),
        ("subscribe", json!({"channel": ROOT})),
        ("createSession", json!({"channel": "ahp-session:/s1"})),
        (
            "resourceRead",
            json!({"channel": ROOT, "uri": "file:///etc/passwd"}),
        ),
        ("noSuchMethod", json!({"channel": ROOT})),
    ] {
        let e = ws.err(method, params);
        assert_eq!(code(&e), -32009, "{method} before initialize: {e}");
    }
    // Nothing was created by the refused createSession.
    ws.initialize("c1", &[]);
    assert_eq!(
        ws.ok("listSessions", json!({"channel": ROOT}))["items"],
        json!([])
    );
}

#[test]
fn handshake_timeout_closes_with_1008() {
    let host = HostProcess::builder()
        .config("[limits]\nhandshake_timeout_ms = 300\n")
        .start();
    let mut idle = host.ws();
    // A connection that only pings is still not initialized.
    let mut pinger = host.ws();
    assert_eq!(pinger.ok("ping", json!({"channel": ROOT})), Value::Null);
    // One that initializes in time stays open, and so does one that reconnects.
    let (mut ready, _) = host.ws_init("ready", &[]);
    let mut resumed = host.ws();
    let r = resumed.ok(
        "reconnect",
        json!({"channel": ROOT, "clientId": "ready", "lastSeenServerSeq": 0, "subscriptions": [ROOT]}),
    );
    assert_eq!(r["type"], "replay", "{r}");
    for ws in [&mut idle, &mut pinger] {
        let (frame, seen) = ws.expect_closed(Duration::from_secs(5));
        assert!(seen.is_empty(), "frames before the timeout close: {seen:?}");
        assert_eq!(
            close_code(&frame),
            Some(CLOSE_POLICY),
            "close frame {frame:?}"
        );
    }
    std::thread::sleep(Duration::from_millis(400));
    assert_eq!(ready.ok("ping", json!({"channel": ROOT})), Value::Null);
    assert_eq!(resumed.ok("ping", json!({"channel": ROOT})), Value::Null);
}

// ─── Malformed JSON-RPC ──────────────────────────────────────────────────────

#[test]
fn malformed_messages_get_json_rpc_errors() {
    let host = HostProcess::start();
    let mut ws = host.ws();
    ws.send_text("{not json");
    let r = ws.recv();
    assert_eq!(r["jsonrpc"], "2.0");
    assert_eq!(code(&r), -32700, "{r}");
    assert!(
        r.get("id").is_some_and(Value::is_null),
        "parse error must carry id null: {r}"
    );

    for bad in [
        "[1,2]",
        r#"{"id":1}"#,
        r#"{"jsonrpc":"1.0","id":2,"method":"ping"}"#,
        "42",
    ] {
        ws.send_text(bad);
        let r = ws.recv();
        assert_eq!(code(&r), -32600, "{bad} -> {r}");
        assert!(r.get("id").is_some(), "error response without id: {r}");
    }
    // String ids are echoed as sent.
    ws.send_text(
        r#"{"jsonrpc":"2.0","id":"abc","method":"ping","params":{"channel":"ahp-root://"}}"#,
    );
    assert_eq!(
        ws.recv(),
        json!({"jsonrpc": "2.0", "id": "abc", "result": null})
    );
    // The connection survives all of that.
    assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
}

#[test]
fn unknown_method_and_bad_params_after_initialize() {
    let host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    let e = ws.err("noSuchMethod", json!({"channel": ROOT}));
    assert_eq!(code(&e), -32601, "{e}");
    // Known but unimplemented AHP methods are -32601 too.
    let e = ws.err("createTerminal", json!({"channel": "ahp-terminal:/t1"}));
    assert_eq!(code(&e), -32601, "{e}");

    for (method, params) in [
        ("subscribe", json!({})),
        ("subscribe", json!({"channel": 7})),
        (
            "createSession",
            json!({"channel": "ahp-session:/bad id with spaces"}),
        ),
        ("createSession", json!({})),
        ("listSessions", json!({"channel": ROOT, "limit": "ten"})),
        (
            "listSessions",
            json!({"channel": ROOT, "cursor": "no-such-cursor"}),
        ),
        ("resourceRead", json!({"channel": ROOT})),
    ] {
        let e = ws.err(method, params.clone());
        assert_eq!(code(&e), -32602, "{method} {params} -> {e}");
        let msg = e["message"].as_str().unwrap_or("");
        assert!(!msg.is_empty(), "-32602 without a message: {e}");
    }
}

#[test]
fn message_over_64_kib_is_refused_with_32043() {
    let host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    let pad = "x".repeat(70 * 1024);
    let e = ws.err("listSessions", json!({"channel": ROOT, "pad": pad}));
    assert_eq!(code(&e), -32043, "{e}");
    // Just under the limit is fine (unknown params fields are ignored).
    let pad = "x".repeat(60 * 1024);
    let r = ws.ok("listSessions", json!({"channel": ROOT, "pad": pad}));
    assert!(r["items"].is_array(), "{r}");
}

#[test]
fn frame_over_the_frame_limit_closes_with_1009() {
    let host = HostProcess::builder()
        .config(
            "[limits]\nframe_bytes_max = 70000\nservice_payload_bytes_max = 1024\n\
             blob_bytes_max = 1024\n",
        )
        .start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    let pad = "x".repeat(100 * 1024);
    ws.send_json(&json!({"jsonrpc": "2.0", "id": 2, "method": "ping", "params": {"channel": ROOT, "pad": pad}}));
    let (frame, seen) = ws.expect_closed(Duration::from_secs(5));
    assert!(seen.is_empty(), "an oversized frame was answered: {seen:?}");
    assert_eq!(close_code(&frame), Some(1009), "close frame {frame:?}");
}

#[test]
fn binary_frame_closes_with_1003() {
    let host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    ws.send_binary(
        br#"{"jsonrpc":"2.0","id":9,"method":"ping","params":{"channel":"ahp-root://"}}"#,
    );
    let (frame, seen) = ws.expect_closed(Duration::from_secs(5));
    assert!(seen.is_empty(), "a binary frame was answered: {seen:?}");
    assert_eq!(
        close_code(&frame),
        Some(CLOSE_UNSUPPORTED),
        "close frame {frame:?}"
    );
}

// ─── initialize / reconnect ──────────────────────────────────────────────────

#[test]
fn unsupported_protocol_version_is_32005_then_close() {
    let host = HostProcess::start();
    let mut ws = host.ws();
    let e = ws.err(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["1.0.0"], "clientId": "c1"}),
    );
    assert_eq!(code(&e), -32005, "{e}");
    let supported = e["data"]["supportedVersions"]
        .as_array()
        .unwrap_or_else(|| panic!("no data.supportedVersions: {e}"));
    assert!(
        supported.iter().any(|v| v == "0.9.0" || v == "^0.9.0"),
        "{e}"
    );
    let (_, seen) = ws.expect_closed(Duration::from_secs(5));
    assert!(seen.is_empty(), "frames after -32005: {seen:?}");

    // The highest offered 0.9.x wins regardless of order.
    let mut ws = host.ws();
    let r = ws.ok(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["1.0.0", "0.9.0", "0.8.0"], "clientId": "c2"}),
    );
    assert_eq!(r["protocolVersion"], "0.9.0");
}

#[test]
fn initialize_result_advertises_the_axp_exchange() {
    let host = HostProcess::builder()
        .principal("watcher", "observer", None)
        .start();
    let (mut ws, r) = host.ws_init("c-admin", &[ROOT]);
    assert_eq!(r["protocolVersion"], "0.9.0");
    assert!(r["serverSeq"].is_u64(), "{r}");
    let axp = &r["_meta"]["org.axp.exchange"];
    assert_eq!(axp["version"], "0.2.0", "{r}");
    assert!(axp["methods"].is_array(), "{r}");
    assert_eq!(axp["role"], "maintainer", "{r}");
    assert_eq!(axp["principal"], ADMIN, "{r}");
    assert_eq!(axp["lastClientSeq"], 0, "{r}");
    let snaps = r["snapshots"].as_array().expect("snapshots");
    assert_eq!(snaps.len(), 1);
    assert_eq!(snaps[0]["resource"], ROOT);
    assert_eq!(snaps[0]["fromSeq"], r["serverSeq"]);

    // lastClientSeq follows the highest clientSeq the host accepted from this clientId.
    create_session(&mut ws, "s1");
    ws.dispatch("ahp-chat:/s1", 1, turn_started("t1", "hello"));
    ws.dispatch("ahp-chat:/s1", 2, pending_set("queued", "q1", "later"));
    // Ping to be sure both dispatches were handled.
    ws.ok("ping", json!({"channel": ROOT}));
    ws.close();
    let (_, r) = host.ws_init("c-admin", &[]);
    assert_eq!(r["_meta"]["org.axp.exchange"]["lastClientSeq"], 2, "{r}");

    let (_, r) = host.ws_init_as(host.token_of("watcher"), "c-watch", &[]);
    let axp = &r["_meta"]["org.axp.exchange"];
    assert_eq!(axp["role"], "observer", "{r}");
    assert_eq!(axp["principal"], "watcher", "{r}");
}

#[test]
fn initialize_with_bad_params_is_32602() {
    let host = HostProcess::start();
    for params in [
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"]}),
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": "has spaces"}),
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": ""}),
        json!({"channel": ROOT, "protocolVersions": ["0.9"], "clientId": "c1"}),
        json!({"channel": ROOT, "protocolVersions": "0.9.0", "clientId": "c1"}),
    ] {
        let mut ws = host.ws();
        let e = ws.err("initialize", params.clone());
        assert_eq!(code(&e), -32602, "initialize {params} -> {e}");
        // The connection is still waiting for a valid handshake.
        ws.initialize("c1", &[]);
    }
}

#[test]
fn reconnect_by_snapshot_reports_missing_channels() {
    let host = HostProcess::builder()
        .config("[limits]\nreplay_events_max = 1\n")
        .start();
    let (mut ws, init) = host.ws_init("c1", &[]);
    create_session(&mut ws, "s1");
    ws.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
    ws.dispatch("ahp-chat:/s1", 1, turn_started("t1", "one"));
    ws.notification("action");
    let mut back = host.ws();
    let r = back.ok(
        "reconnect",
        json!({"channel": ROOT, "clientId": "c1", "lastSeenServerSeq": init["serverSeq"],
               "subscriptions": ["ahp-chat:/s1", "ahp-chat:/gone", "x-unknown:/thing"]}),
    );
    assert_eq!(r["type"], "snapshot", "{r}");
    let snaps = r["snapshots"].as_array().expect("snapshots");
    assert_eq!(snaps.len(), 1, "{r}");
    assert_eq!(snaps[0]["resource"], "ahp-chat:/s1");
    assert_eq!(snaps[0]["state"]["activeTurn"]["id"], "t1", "{r}");
    assert_eq!(
        r["missing"],
        json!(["ahp-chat:/gone", "x-unknown:/thing"]),
        "{r}"
    );
}

#[test]
fn second_initialize_is_a_conflict() {
    let host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    let e = ws.err(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": "c1"}),
    );
    assert_eq!(code(&e), -32011, "{e}");
    // Still usable.
    assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
}

#[test]
fn reconnect_rules() {
    let host = HostProcess::builder()
        .principal("other", "maintainer", None)
        .start();
    let (mut ws, init) = host.ws_init("c1", &[ROOT]);
    create_session(&mut ws, "s1");

    // Not the first message on the connection.
    let e = ws.err(
        "reconnect",
        json!({"channel": ROOT, "clientId": "c1", "lastSeenServerSeq": 0, "subscriptions": []}),
    );
    assert_eq!(code(&e), -32011, "reconnect after initialize: {e}");

    // Bad params on a fresh connection.
    let mut fresh = host.ws();
    let e = fresh.err("reconnect", json!({"channel": ROOT, "clientId": "c1"}));
    assert_eq!(code(&e), -32602, "reconnect without cursor: {e}");

    // A cursor from the future.
    let seq = init["serverSeq"].as_u64().expect("serverSeq");
    let mut fresh = host.ws();
    let e = fresh.err(
        "reconnect",
        json!({"channel": ROOT, "clientId": "c1", "lastSeenServerSeq": seq + 1000, "subscriptions": [ROOT]}),
    );
    assert_eq!(code(&e), -32602, "future cursor: {e}");

    // Another principal's clientId, on reconnect and on initialize.
    let mut theirs = host.ws_as(host.token_of("other"));
    let e = theirs.err(
        "reconnect",
        json!({"channel": ROOT, "clientId": "c1", "lastSeenServerSeq": 0, "subscriptions": [ROOT]}),
    );
    assert_eq!(code(&e), -32009, "foreign clientId on reconnect: {e}");
    let mut theirs = host.ws_as(host.token_of("other"));
    let e = theirs.err(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": "c1"}),
    );
    assert_eq!(code(&e), -32009, "foreign clientId on initialize: {e}");

    // A valid reconnect as the first message; unknown channels are reported missing.
    let mut back = host.ws();
    let r = back.ok(
        "reconnect",
        json!({"channel": ROOT, "clientId": "c1", "lastSeenServerSeq": 0,
               "subscriptions": [ROOT, "ahp-session:/s1", "ahp-session:/gone"]}),
    );
    assert_eq!(r["type"], "replay", "{r}");
    assert_eq!(r["missing"], json!(["ahp-session:/gone"]), "{r}");
    // After reconnect the connection is ready: a second reconnect or initialize conflicts.
    let e = back.err(
        "reconnect",
        json!({"channel": ROOT, "clientId": "c1", "lastSeenServerSeq": 0, "subscriptions": []}),
    );
    assert_eq!(code(&e), -32011, "{e}");
    let e = back.err(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": "c1"}),
    );
    assert_eq!(code(&e), -32011, "{e}");
}

// ─── Sessions and scope ──────────────────────────────────────────────────────

#[test]
fn subscribe_snapshots_and_unknown_channels() {
    let host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    for channel in [
        "ahp-session:/nope",
        "ahp-chat:/nope",
        "ahp-changeset:/nope",
        "x-unknown:/thing",
    ] {
        let e = ws.err("subscribe", json!({"channel": channel}));
        assert_eq!(code(&e), -32008, "subscribe {channel}: {e}");
    }
    create_session(&mut ws, "s1");
    let mut states = Vec::new();
    for channel in [ROOT, "ahp-session:/s1", "ahp-chat:/s1", "ahp-changeset:/s1"] {
        let r = ws.ok("subscribe", json!({"channel": channel}));
        assert_eq!(r["snapshot"]["resource"], channel, "{r}");
        assert!(r["snapshot"]["fromSeq"].is_u64(), "{r}");
        states.push(r["snapshot"]["state"].clone());
    }
    // The channels createSession makes, shaped as the AXP host makes them.
    let [root, session, chat, changeset] = &states[..] else {
        unreachable!()
    };
    assert_eq!(root["agents"][0]["provider"], "axp", "{root}");
    assert_eq!(session["provider"], "axp", "{session}");
    assert_eq!(session["lifecycle"], "ready", "{session}");
    assert_eq!(session["status"], 1, "{session}");
    assert_eq!(session["defaultChat"], "ahp-chat:/s1", "{session}");
    assert_eq!(session["chats"][0]["resource"], "ahp-chat:/s1", "{session}");
    assert_eq!(
        session["changesets"][0]["uriTemplate"], "ahp-changeset:/s1",
        "{session}"
    );
    assert_eq!(session["activeClients"], json!([]), "{session}");
    assert_eq!(chat["resource"], "ahp-chat:/s1", "{chat}");
    assert_eq!(chat["status"], 1, "{chat}");
    assert_eq!(chat["turns"], json!([]), "{chat}");
    assert_eq!(
        chat["modifiedAt"], session["chats"][0]["modifiedAt"],
        "{chat}"
    );
    assert_eq!(changeset["status"], "ready", "{changeset}");
    assert_eq!(changeset["files"], json!([]), "{changeset}");
}

#[test]
fn scope_and_role_checks() {
    let host = HostProcess::builder()
        .principal("watcher", "observer", None)
        .principal("scoped", "maintainer", Some(&["ahp-session:/a"]))
        .start();
    let (mut admin, _) = host.ws_init("c-admin", &[]);
    create_session(&mut admin, "a");
    create_session(&mut admin, "b");

    // Observers read but cannot create sessions or drive chats.
    let (mut obs, _) = host.ws_init_as(host.token_of("watcher"), "c-obs", &[]);
    let e = obs.err("createSession", json!({"channel": "ahp-session:/o1"}));
    assert_eq!(code(&e), -32009, "{e}");
    obs.ok("subscribe", json!({"channel": "ahp-chat:/a"}));
    obs.dispatch("ahp-chat:/a", 1, turn_started("t1", "from an observer"));
    let echo = obs.notification("action");
    assert!(
        echo["params"]["rejectionReason"].is_string(),
        "observer dispatch must be rejected: {echo}"
    );
    assert_eq!(
        echo["params"]["origin"],
        json!({"clientId": "c-obs", "clientSeq": 1})
    );
    let chat = obs.ok("subscribe", json!({"channel": "ahp-chat:/a"}));
    assert!(
        chat["snapshot"]["state"]
            .get("activeTurn")
            .is_none_or(Value::is_null),
        "{chat}"
    );

    // A scoped principal sees only its sessions.
    let (mut scoped, _) = host.ws_init_as(host.token_of("scoped"), "c-scoped", &[]);
    let e = scoped.err("subscribe", json!({"channel": "ahp-session:/b"}));
    assert_eq!(code(&e), -32009, "{e}");
    let e = scoped.err("subscribe", json!({"channel": "ahp-chat:/b"}));
    assert_eq!(code(&e), -32009, "{e}");
    scoped.ok("subscribe", json!({"channel": "ahp-chat:/a"}));
    let e = scoped.err("createSession", json!({"channel": "ahp-session:/c"}));
    assert_eq!(code(&e), -32009, "createSession outside scope: {e}");
    let list = scoped.ok("listSessions", json!({"channel": ROOT}));
    let uris: Vec<&str> = list["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|i| i["resource"].as_str())
        .collect();
    assert_eq!(uris, vec!["ahp-session:/a"], "{list}");
    // initialize with an out-of-scope initial subscription is refused.
    let mut ws = host.ws_as(host.token_of("scoped"));
    let e = ws.err(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": "c-scoped2",
               "initialSubscriptions": [ROOT, "ahp-session:/b"]}),
    );
    assert_eq!(code(&e), -32009, "{e}");
    // reconnect reports out-of-scope channels as missing.
    let mut ws = host.ws_as(host.token_of("scoped"));
    let r = ws.ok(
        "reconnect",
        json!({"channel": ROOT, "clientId": "c-scoped", "lastSeenServerSeq": 0,
               "subscriptions": ["ahp-chat:/a", "ahp-chat:/b"]}),
    );
    assert_eq!(r["missing"], json!(["ahp-chat:/b"]), "{r}");
}

#[test]
fn duplicate_create_session_is_32003() {
    let host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    create_session(&mut ws, "s1");
    let e = ws.err("createSession", json!({"channel": "ahp-session:/s1"}));
    assert_eq!(code(&e), -32003, "{e}");
    let e = ws.err(
        "createSession",
        json!({"channel": "ahp-session:/s2", "provider": "nope"}),
    );
    assert_eq!(code(&e), -32002, "unknown provider: {e}");
    let r = ws.ok(
        "createSession",
        json!({"channel": "ahp-session:/s3", "provider": "axp", "config": {"title": "Fix the bug"}}),
    );
    assert_eq!(r, Value::Null);
    let list = ws.ok("listSessions", json!({"channel": ROOT}));
    let items = list["items"].as_array().expect("items");
    assert_eq!(items.len(), 2, "{list}");
    let s3 = items
        .iter()
        .find(|i| i["resource"] == "ahp-session:/s3")
        .expect("s3 listed");
    assert_eq!(s3["title"], "Fix the bug", "{s3}");
}

#[test]
fn root_subscribers_outside_scope_hear_nothing_about_the_session() {
    let host = HostProcess::builder()
        .principal("scoped", "observer", Some(&["ahp-session:/a"]))
        .principal("all", "observer", None)
        .start();
    let (mut scoped, _) = host.ws_init_as(host.token_of("scoped"), "c-scoped", &[ROOT]);
    let (mut all, _) = host.ws_init_as(host.token_of("all"), "c-all", &[ROOT]);
    let (mut admin, _) = host.ws_init("c-admin", &[]);

    create_session(&mut admin, "b");
    let added = all.notification("root/sessionAdded");
    assert_eq!(added["params"]["channel"], ROOT);
    assert_eq!(added["params"]["summary"]["resource"], "ahp-session:/b");
    admin.dispatch("ahp-chat:/b", 1, turn_started("t1", "hi"));
    let changed = all.notification("root/sessionSummaryChanged");
    assert_eq!(changed["params"]["session"], "ahp-session:/b", "{changed}");
    scoped.expect_no_frame(300);

    create_session(&mut admin, "a");
    let added = scoped.notification("root/sessionAdded");
    assert_eq!(
        added["params"]["summary"]["resource"], "ahp-session:/a",
        "{added}"
    );
    assert_eq!(added["params"]["summary"]["provider"], "axp", "{added}");
    assert!(
        added["params"]["summary"]["createdAt"].is_string(),
        "{added}"
    );
    admin.dispatch("ahp-chat:/a", 2, turn_started("t1", "hi"));
    let changed = scoped.notification("root/sessionSummaryChanged");
    assert_eq!(changed["params"]["session"], "ahp-session:/a", "{changed}");
    scoped.expect_no_frame(200);
}

// ─── Dispatch ────────────────────────────────────────────────────────────────

#[test]
fn dispatch_to_unknown_channel_gets_no_frame_at_all() {
    let host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[ROOT]);
    create_session(&mut ws, "s1");
    ws.notification("root/sessionAdded");
    let list_before = ws.ok("listSessions", json!({"channel": ROOT}));
    for channel in ["ahp-chat:/nope", "ahp-session:/nope", "x-unknown:/thing"] {
        ws.dispatch(channel, 1, turn_started("t1", "into the void"));
        ws.expect_no_frame(300);
    }
    // The connection is fine and nothing changed.
    assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
    assert_eq!(ws.ok("listSessions", json!({"channel": ROOT})), list_before);
    // dispatchAction notifications with garbage params are dropped silently too.
    ws.notify("dispatchAction", json!({"channel": "ahp-chat:/s1"}));
    ws.notify("noSuchNotification", json!({"channel": ROOT}));
    ws.expect_no_frame(300);
}

#[test]
fn rejected_dispatch_is_echoed_to_the_sender_only_and_changes_nothing() {
    let host = HostProcess::start();
    let (mut a, _) = host.ws_init("ca", &[]);
    create_session(&mut a, "s1");
    a.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
    let (mut b, _) = host.ws_init("cb", &[]);
    b.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));

    a.dispatch("ahp-chat:/s1", 1, turn_started("t1", "first"));
    for ws in [&mut a, &mut b] {
        let echo = ws.notification("action");
        assert_eq!(echo["params"]["channel"], "ahp-chat:/s1");
        assert_eq!(
            echo["params"]["origin"],
            json!({"clientId": "ca", "clientSeq": 1})
        );
        assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");
        assert_eq!(echo["params"]["action"]["type"], "chat/turnStarted");
    }
    let chat_before = b.ok("subscribe", json!({"channel": "ahp-chat:/s1"}))["snapshot"].clone();

    // A second turn while one is active.
    a.dispatch("ahp-chat:/s1", 2, turn_started("t2", "second"));
    let echo = a.notification("action");
    let p = &echo["params"];
    assert_eq!(
        p["origin"],
        json!({"clientId": "ca", "clientSeq": 2}),
        "{echo}"
    );
    assert!(
        p["rejectionReason"].as_str().is_some_and(|r| !r.is_empty()),
        "{echo}"
    );
    assert_eq!(p["action"]["turnId"], "t2");
    assert_eq!(
        p["serverSeq"], chat_before["fromSeq"],
        "a rejection must not consume a serverSeq: {echo}"
    );
    // Server-only actions and agent messages are rejected too.
    a.dispatch(
        "ahp-chat:/s1",
        3,
        json!({"type": "chat/turnComplete", "turnId": "t1", "duration": 5}),
    );
    assert!(a.notification("action")["params"]["rejectionReason"].is_string());
    let mut agent = turn_started("t3", "spoofed");
    agent["message"]["origin"]["kind"] = json!("agent");
    a.dispatch("ahp-chat:/s1", 4, agent);
    assert!(a.notification("action")["params"]["rejectionReason"].is_string());
    a.dispatch(
        "ahp-chat:/s1",
        5,
        json!({"type": "chat/turnCancelled", "turnId": "not-active", "duration": 1}),
    );
    assert!(a.notification("action")["params"]["rejectionReason"].is_string());

    b.expect_no_frame(300);
    let chat_after = b.ok("subscribe", json!({"channel": "ahp-chat:/s1"}))["snapshot"].clone();
    assert_eq!(chat_after, chat_before, "rejected dispatches changed state");
}

#[test]
fn a_dispatch_request_is_answered_null_once_applied_and_with_an_error_when_refused() {
    let host = HostProcess::start();
    let (mut a, _) = host.ws_init("ca", &[]);
    create_session(&mut a, "s1");
    a.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
    let (mut b, _) = host.ws_init("cb", &[]);
    b.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
    let dispatch = |seq: u64, action: Value| json!({"channel": "ahp-chat:/s1", "clientSeq": seq, "action": action});

    // Applied: `result: null`, and the echo to every subscriber, the sender included.
    assert_eq!(
        a.ok("dispatchAction", dispatch(1, turn_started("t1", "first"))),
        Value::Null
    );
    for ws in [&mut a, &mut b] {
        let echo = ws.notification("action");
        assert_eq!(
            echo["params"]["origin"],
            json!({"clientId": "ca", "clientSeq": 1})
        );
        assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");
    }

    // Refused (a second turn while one is active): a JSON-RPC error and no echo at all, since
    // a `null` beside a rejection echo would tell an SDK that dispatches this way that the
    // refused action succeeded.
    let e = a.err("dispatchAction", dispatch(2, turn_started("t2", "second")));
    assert_eq!(code(&e), -32004, "{e}");
    a.expect_no_frame(300);
    b.expect_no_frame(0);
    // The refusal changed nothing: the same action as a notification is rejected alike.
    a.dispatch("ahp-chat:/s1", 3, turn_started("t2", "second"));
    assert!(a.notification("action")["params"]["rejectionReason"].is_string());
}

#[test]
fn unsubscribe_stops_delivery() {
    let host = HostProcess::start();
    let (mut admin, _) = host.ws_init("c-admin", &[]);
    create_session(&mut admin, "s1");
    let (mut watcher, _) = host.ws_init("c-watch", &[]);
    watcher.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
    watcher.ok("subscribe", json!({"channel": "ahp-session:/s1"}));
    admin.dispatch("ahp-chat:/s1", 1, turn_started("t1", "one"));
    let echo = watcher.notification("action");
    assert_eq!(echo["params"]["channel"], "ahp-chat:/s1");
    let update = watcher.notification("action");
    assert_eq!(update["params"]["channel"], "ahp-session:/s1");
    assert!(update["params"]["serverSeq"].as_u64() > echo["params"]["serverSeq"].as_u64());
    watcher.notify("unsubscribe", json!({"channel": "ahp-chat:/s1"}));
    // Make sure the unsubscribe was handled before the next dispatch.
    watcher.ok("ping", json!({"channel": ROOT}));
    admin.dispatch("ahp-chat:/s1", 2, pending_set("queued", "q1", "two"));
    let only = watcher.notification("action");
    assert_eq!(
        only["params"]["channel"], "ahp-session:/s1",
        "chat envelope after unsubscribe: {only}"
    );
    watcher.expect_no_frame(300);
}

// ─── resourceRead ────────────────────────────────────────────────────────────

#[test]
fn resource_read_before_blobs_exist() {
    let host = HostProcess::builder()
        .principal("scoped", "observer", Some(&["ahp-session:/a"]))
        .start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    create_session(&mut ws, "a");
    create_session(&mut ws, "b");
    for uri in [
        "file:///etc/passwd",
        "ahp-session:/a",
        "https://example.com/x",
    ] {
        let e = ws.err("resourceRead", json!({"channel": ROOT, "uri": uri}));
        assert_eq!(code(&e), -32009, "resourceRead {uri}: {e}");
    }
    let digest = "0".repeat(64);
    let blob_a = format!("axp-blob:/axp-session%3A%2Fa/{digest}");
    let blob_b = format!("axp-blob:/axp-session%3A%2Fb/{digest}");
    let e = ws.err("resourceRead", json!({"channel": ROOT, "uri": blob_a}));
    assert_eq!(code(&e), -32008, "{e}");
    let (mut scoped, _) = host.ws_init_as(host.token_of("scoped"), "c2", &[]);
    let e = scoped.err("resourceRead", json!({"channel": ROOT, "uri": blob_a}));
    assert_eq!(code(&e), -32008, "{e}");
    let e = scoped.err("resourceRead", json!({"channel": ROOT, "uri": blob_b}));
    assert_eq!(code(&e), -32009, "blob of a session outside scope: {e}");
}

// ─── Limits and the Origin allow-list ────────────────────────────────────────

#[test]
fn origin_allow_list() {
    let host = HostProcess::builder()
        .config("allowed_origins = [\"https://ok.example\"]\n")
        .start();
    let path = format!("/axp?tkn={}", host.token());
    let e = Ws::connect(host.port, &path, &[("Origin", "https://evil.example")])
        .err()
        .expect("foreign Origin accepted");
    assert_eq!(refused_status(&e), Some(403), "{}", describe_ws_error(&e));
    let mut ok = Ws::connect(host.port, &path, &[("Origin", "https://ok.example")])
        .expect("listed Origin refused");
    assert_eq!(ok.ok("ping", json!({"channel": ROOT})), Value::Null);
    // No Origin header: not a browser, allowed.
    let mut none = Ws::connect(host.port, &path, &[]).expect("no Origin refused");
    assert_eq!(none.ok("ping", json!({"channel": ROOT})), Value::Null);
}

#[test]
fn connection_limit_refuses_the_upgrade_with_503() {
    let host = HostProcess::builder()
        .config("[limits]\nconnections_max = 2\n")
        .start();
    let first = host.ws();
    let mut second = host.ws();
    assert_eq!(second.ok("ping", json!({"channel": ROOT})), Value::Null);
    let e = Ws::connect(host.port, &format!("/axp?tkn={}", host.token()), &[])
        .err()
        .expect("third connection accepted");
    assert_eq!(refused_status(&e), Some(503), "{}", describe_ws_error(&e));
    // A slot frees up when a connection goes away.
    first.close();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        match Ws::connect(host.port, &format!("/axp?tkn={}", host.token()), &[]) {
            Ok(mut ws) => {
                assert_eq!(ws.ok("ping", json!({"channel": ROOT})), Value::Null);
                break;
            }
            Err(e) if std::time::Instant::now() < deadline && refused_status(&e) == Some(503) => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => panic!("slot not freed: {}", describe_ws_error(&e)),
        }
    }
}

#[test]
fn subscription_limit_is_32043() {
    let host = HostProcess::builder()
        .config("[limits]\nsubscriptions_per_conn_max = 2\n")
        .start();
    let mut ws = host.ws();
    let e = ws.err(
        "initialize",
        json!({"channel": ROOT, "protocolVersions": ["0.9.0"], "clientId": "c0",
               "initialSubscriptions": [ROOT, ROOT, ROOT]}),
    );
    assert_eq!(code(&e), -32043, "too many initialSubscriptions: {e}");
    let (mut ws, _) = host.ws_init("c1", &[ROOT]);
    create_session(&mut ws, "s1");
    ws.ok("subscribe", json!({"channel": "ahp-session:/s1"}));
    // Subscribing again to a channel already held does not count.
    ws.ok("subscribe", json!({"channel": "ahp-session:/s1"}));
    let e = ws.err("subscribe", json!({"channel": "ahp-chat:/s1"}));
    assert_eq!(code(&e), -32043, "{e}");
    ws.notify("unsubscribe", json!({"channel": "ahp-session:/s1"}));
    ws.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
}

#[test]
fn slow_consumer_is_disconnected_not_silently_skipped() {
    let host = HostProcess::start();
    let (mut admin, _) = host.ws_init("c-admin", &[]);
    create_session(&mut admin, "s1");
    admin.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
    admin.dispatch("ahp-chat:/s1", 1, turn_started("t1", "busy"));
    admin.notification("action");
    // ~1.5 MB of chat state: 25 queued messages of 60 KiB.
    let text = "y".repeat(60 * 1024);
    for i in 0..25u64 {
        admin.dispatch(
            "ahp-chat:/s1",
            2 + i,
            pending_set("queued", &format!("q{i}"), &text),
        );
        let echo = admin.notification("action");
        assert!(echo["params"].get("rejectionReason").is_none(), "{echo}");
    }
    // A client that asks for the big snapshot over and over and never reads.
    let (mut slow, _) = host.ws_init("c-slow", &[]);
    let first_id = slow.send_request("subscribe", json!({"channel": "ahp-chat:/s1"}));
    for _ in 1..40 {
        slow.send_request("subscribe", json!({"channel": "ahp-chat:/s1"}));
    }
    // Let the host work through them (the admin round trip is handled after them).
    std::thread::sleep(Duration::from_millis(1000));
    admin.ok("ping", json!({"channel": ROOT}));
    std::thread::sleep(Duration::from_millis(500));
    let (_, seen) = slow.expect_closed(Duration::from_secs(20));
    // Whatever arrived before the close is complete and in order: nothing was skipped.
    assert!(
        seen.len() < 40,
        "all {} responses were delivered; the queue limit never applied",
        seen.len()
    );
    for (i, v) in seen.iter().enumerate() {
        assert_eq!(
            v["id"],
            json!(first_id + i as u64),
            "response {i} out of order or skipped"
        );
        assert!(
            v["result"]["snapshot"].is_object(),
            "response {i} is not a snapshot"
        );
    }
    // The host and its other clients are unaffected.
    assert_eq!(admin.ok("ping", json!({"channel": ROOT})), Value::Null);
}
