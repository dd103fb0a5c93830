//! The scriptable command-line contract of `axhost`: the fresh-machine default, token
//! management, one host per data directory, and clean shutdown.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;
use serde_json::{json, Value};

/// Every file under `dir`, recursively.
fn files_under(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

fn assert_not_stored_in_plaintext(dir: &Path, token: &str) {
    for f in files_under(dir) {
        let bytes = std::fs::read(&f).unwrap_or_default();
        let found = bytes.windows(token.len()).any(|w| w == token.as_bytes());
        assert!(!found, "token stored in plaintext in {}", f.display());
    }
}

#[test]
fn fresh_data_dir_gets_a_private_directory_and_a_printed_maintainer_url() {
    let host = HostProcess::start();
    let token = host
        .generated_token
        .clone()
        .expect("a fresh data dir prints a connect URL with a token");
    assert!(
        token.len() >= 24,
        "generated token too short: {} chars",
        token.len()
    );
    let line = host
        .stdout()
        .into_iter()
        .find(|l| l.contains("tkn="))
        .expect("connect line");
    assert!(
        line.trim_start()
            .starts_with(&format!("connect: ws://127.0.0.1:{}/axp?tkn=", host.port)),
        "connect line: {line:?}"
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&host.data_dir)
            .expect("data dir")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o700, "data dir mode {mode:o}");
    }
    assert_not_stored_in_plaintext(&host.data_dir, &token);
    // The printed credential is a maintainer.
    let (mut ws, r) = host.ws_init("c1", &[]);
    assert_eq!(r["_meta"]["org.axp.exchange"]["role"], "maintainer", "{r}");
    assert_eq!(
        ws.ok("createSession", json!({"channel": "ahp-session:/s1"})),
        Value::Null
    );
}

#[test]
fn the_generated_token_is_printed_only_once() {
    let mut host = HostProcess::start();
    let token = host.generated_token.clone().expect("generated token");
    host.restart();
    let printed: Vec<String> = host
        .stdout()
        .into_iter()
        .filter(|l| l.contains(&token))
        .collect();
    assert_eq!(
        printed.len(),
        1,
        "the token must be printed on first start only: {printed:?}"
    );
    // It still works after the restart.
    let (_, r) = host.ws_init_as(&token, "c1", &[]);
    assert_eq!(r["protocolVersion"], "0.9.0");
}

#[test]
fn sigterm_exits_cleanly() {
    let mut host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    ws.ok("createSession", json!({"channel": "ahp-session:/s1"}));
    let status = host.stop().expect("exit status");
    assert!(
        status.success(),
        "SIGTERM exit: {status:?}\nstderr:\n{}",
        host.stderr()
    );
    // The open connection learns the host is gone.
    let (_, _) = ws.expect_closed(Duration::from_secs(5));
}

#[test]
fn sigint_exits_cleanly_and_the_data_dir_is_reusable() {
    let mut host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    ws.ok("createSession", json!({"channel": "ahp-session:/s1"}));
    let status = host.stop_with("INT").expect("exit status");
    assert!(
        status.success(),
        "SIGINT exit: {status:?}\nstderr:\n{}",
        host.stderr()
    );
    // The owner lock was released: the next host starts and has the session.
    host.restart();
    let (mut ws, _) = host.ws_init("c1", &[]);
    let list = ws.ok("listSessions", json!({"channel": "ahp-root://"}));
    assert_eq!(list["items"][0]["resource"], "ahp-session:/s1", "{list}");
}

#[test]
fn second_serve_on_a_data_dir_in_use_is_refused() {
    let host = HostProcess::start();
    let out = host.second_serve();
    assert!(!out.status.success(), "second serve exited successfully");
    let msg = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!msg.trim().is_empty(), "second serve gave no message");
    assert!(
        !msg.contains("ws://"),
        "second serve claimed to listen: {msg}"
    );
    // The first host is unaffected.
    let (mut ws, _) = host.ws_init("c1", &[]);
    assert_eq!(
        ws.ok("ping", json!({"channel": "ahp-root://"})),
        Value::Null
    );
}

#[test]
fn token_add_creates_principals_stored_only_as_digests() {
    let host = HostProcess::builder()
        .principal("obs", "observer", None)
        .principal(
            "scoped",
            "contributor",
            Some(&["ahp-session:/a", "ahp-session:/b"]),
        )
        .start();
    for id in ["obs", "scoped", ADMIN] {
        let token = host.token_of(id).to_owned();
        assert!(token.len() >= 24);
        assert_not_stored_in_plaintext(&host.data_dir, &token);
    }
    let (_, r) = host.ws_init_as(host.token_of("obs"), "c-obs", &[]);
    assert_eq!(r["_meta"]["org.axp.exchange"]["role"], "observer");
    assert_eq!(r["_meta"]["org.axp.exchange"]["principal"], "obs");
    let (_, r) = host.ws_init_as(host.token_of("scoped"), "c-scoped", &[]);
    assert_eq!(r["_meta"]["org.axp.exchange"]["role"], "contributor");
    // Tokens are distinct.
    assert_ne!(host.token_of("obs"), host.token_of("scoped"));
}

#[test]
fn token_list_and_revoke() {
    let mut host = HostProcess::builder()
        .principal("temp", "observer", None)
        .start();
    let dir = host.data_dir.to_str().expect("utf-8").to_owned();
    let temp_token = host.token_of("temp").to_owned();
    host.ws_as(&temp_token);

    let out = run_cli(&["token", "list", "--data-dir", &dir]);
    assert!(
        out.status.success(),
        "token list: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let listed = String::from_utf8_lossy(&out.stdout);
    assert!(
        listed.contains("temp") && listed.contains(ADMIN),
        "token list: {listed}"
    );
    assert!(!listed.contains(&temp_token), "token list prints a token");

    host.stop();
    let out = run_cli(&["token", "revoke", "--data-dir", &dir, "--id", "temp"]);
    assert!(
        out.status.success(),
        "token revoke: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    host.restart();
    let e = Ws::connect(host.port, &format!("/axp?tkn={temp_token}"), &[])
        .err()
        .expect("revoked token accepted");
    assert_eq!(refused_status(&e), Some(401), "{}", describe_ws_error(&e));
    host.ws();
}

#[test]
fn unknown_role_is_refused_by_token_add() {
    let tmp = tempfile::tempdir().expect("tmp");
    let dir = tmp.path().join("data");
    let out = run_cli(&[
        "token",
        "add",
        "--data-dir",
        dir.to_str().expect("utf-8"),
        "--id",
        "x",
        "--role",
        "admin",
    ]);
    assert!(!out.status.success(), "role admin accepted");
}

#[test]
fn client_id_binding_and_principals_survive_a_restart() {
    let mut host = HostProcess::builder()
        .principal("other", "maintainer", None)
        .start();
    host.ws_init("c1", &[]);
    host.restart();
    let mut ws = host.ws_as(host.token_of("other"));
    let e = ws.err(
        "initialize",
        json!({"channel": "ahp-root://", "protocolVersions": ["0.9.0"], "clientId": "c1"}),
    );
    assert_eq!(
        code(&e),
        -32009,
        "another principal took a bound clientId after restart: {e}"
    );
    let (_, r) = host.ws_init("c1", &[]);
    assert_eq!(r["_meta"]["org.axp.exchange"]["principal"], ADMIN);
}

/// `initialize` as `token` with `client_id`, retried while the host still counts a closed
/// connection's clientId as in use (`-32043`): it learns of a close a moment after the peer.
fn init_when_released(host: &HostProcess, token: &str, client_id: &str) -> Value {
    let params =
        json!({"channel": "ahp-root://", "protocolVersions": ["0.9.0"], "clientId": client_id});
    for _ in 0..100 {
        let mut ws = host.ws_as(token);
        let r = ws.call("initialize", params.clone());
        if r["error"]["code"] != -32043 {
            ws.close();
            return r;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("{client_id} stayed refused with -32043");
}

#[test]
fn idle_client_ids_past_the_quota_are_released_durably() {
    let mut host = HostProcess::builder()
        .config("[limits]\nidle_client_ids_per_principal = 2\n")
        .principal("other", "maintainer", None)
        .start();
    let admin = host.token_of(ADMIN).to_owned();
    let other = host.token_of("other").to_owned();
    // A client that takes a fresh clientId for every connection and never dispatches.
    for id in ["run-1", "run-2", "run-3"] {
        let r = init_when_released(&host, &admin, id);
        assert!(r.get("result").is_some(), "{id}: {r}");
    }
    // run-1, the least recently used, was released: anyone may bind it now. run-2 and run-3
    // are still the admin's, also after a restart.
    host.restart();
    let r = init_when_released(&host, &other, "run-1");
    assert!(r.get("result").is_some(), "run-1 was not released: {r}");
    for id in ["run-2", "run-3"] {
        let r = init_when_released(&host, &other, id);
        assert_eq!(code(&r["error"]), -32009, "{id}: {r}");
    }
}

#[test]
fn logs_carry_no_tokens_or_application_payloads() {
    for level in ["info", "debug", "trace"] {
        let host = HostProcess::builder().env("RUST_LOG", level).start();
        let token = host.generated_token.clone().expect("generated token");
        let (mut ws, _) = host.ws_init("c1", &["ahp-root://"]);
        ws.ok(
            "createSession",
            json!({"channel": "ahp-session:/s1", "config": {"title": "TITLE-SECRET-7f3a"}}),
        );
        ws.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
        let mut a = turn_started("t1", "PAYLOAD-SECRET-91bc");
        a["message"]["attachments"] = json!([]);
        ws.dispatch("ahp-chat:/s1", 1, a);
        ws.notification("action");
        ws.dispatch(
            "ahp-chat:/s1",
            2,
            turn_started("t2", "REJECTED-SECRET-22de"),
        );
        ws.notification("action");
        ws.send_text("{not json PARSE-SECRET-5e5e");
        ws.recv();
        drop(ws);
        let mut host = host;
        host.stop();
        let log = host.stderr();
        assert!(!log.is_empty() || level == "info", "no logs at {level}");
        for secret in [
            token.as_str(),
            "TITLE-SECRET-7f3a",
            "PAYLOAD-SECRET-91bc",
            "REJECTED-SECRET-22de",
            "PARSE-SECRET-5e5e",
        ] {
            let leaks: Vec<&str> = log.lines().filter(|l| l.contains(secret)).collect();
            assert!(
                leaks.is_empty(),
                "RUST_LOG={level}: the log contains {secret:?}:\n{}",
                leaks.join("\n")
            );
        }
    }
}

#[test]
fn whatever_was_echoed_survives_a_crash() {
    let mut host = HostProcess::start();
    let (mut ws, _) = host.ws_init("c1", &[]);
    ws.ok("createSession", json!({"channel": "ahp-session:/s1"}));
    ws.ok("subscribe", json!({"channel": "ahp-chat:/s1"}));
    ws.dispatch(
        "ahp-chat:/s1",
        1,
        turn_started("t1", "committed before the echo"),
    );
    let echo = ws.notification("action");
    let seq = echo["params"]["serverSeq"].as_u64().expect("serverSeq");
    let chat_before =
        ws.ok("subscribe", json!({"channel": "ahp-chat:/s1"}))["snapshot"]["state"].clone();
    // SIGKILL: the broadcast happened after the commit, so nothing echoed may be lost.
    host.crash();
    host.restart();
    let (mut ws, r) = host.ws_init("c1", &[]);
    assert!(
        r["serverSeq"].as_u64() >= Some(seq),
        "serverSeq went back after a crash: {r}"
    );
    let snap = ws.ok("subscribe", json!({"channel": "ahp-chat:/s1"}))["snapshot"].clone();
    assert_eq!(snap["state"], chat_before, "echoed state lost in a crash");
    let list = ws.ok("listSessions", json!({"channel": "ahp-root://"}));
    assert_eq!(list["items"][0]["resource"], "ahp-session:/s1", "{list}");
}
