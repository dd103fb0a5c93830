//! What chats cost a running host in memory, per byte the chat limits charge.
//!
//! ```text
//! axhost token add --data-dir D --id m --role maintainer     # prints TOKEN
//! axhost serve --data-dir D --listen 127.0.0.1:7399 &       # note its PID
//! cargo run --release -p axhost-io --example chat_memory -- \
//!     ws://127.0.0.1:7399/axp TOKEN PID SESSIONS TURNS TEXT_BYTES
//! ```
//!
//! Creates `SESSIONS` sessions and starts and cancels `TURNS` turns of a `TEXT_BYTES` message in
//! each, then prints one JSON line: the bytes charged against `chat_bytes_total_max` (computed as
//! the host does: message JSON, turn id, 128), and the host's VmRSS before and after, read from
//! `/proc/PID/status` once the host has answered everything (Linux only).

use std::time::Duration;

use axhost_io::client::Client;
use serde_json::{json, Value};

fn rss_kb(pid: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [url, token, pid, sessions, turns, text_bytes] = args.as_slice() else {
        return Err("usage: chat_memory URL TOKEN PID SESSIONS TURNS TEXT_BYTES".into());
    };
    let (sessions, turns, text_bytes): (u64, u64, usize) =
        (sessions.parse()?, turns.parse()?, text_bytes.parse()?);
    let mut c = Client::connect(url, Some(token))?;
    c.initialize("chat-memory", &[])?;
    let before = rss_kb(pid);
    let text = "x".repeat(text_bytes);
    let mut charged = 0u64;
    let mut seq = 0u64;
    let run = std::process::id();
    for s in 0..sessions {
        let chat = format!("ahp-chat:/mem-{run}-{s}");
        c.request(
            "createSession",
            json!({ "channel": format!("ahp-session:/mem-{run}-{s}") }),
        )?;
        for t in 0..turns {
            let id = format!("t{t}");
            let message = json!({ "text": text, "origin": { "kind": "user" } });
            charged += (json!(id).to_string().len() + message.to_string().len()) as u64 + 128;
            for action in [
                json!({ "type": "chat/turnStarted", "turnId": id, "startedAt": "", "message": message }),
                json!({ "type": "chat/turnCancelled", "turnId": id, "duration": 1 }),
            ] {
                seq += 1;
                c.notify(
                    "dispatchAction",
                    json!({ "channel": chat, "clientSeq": seq, "action": action }),
                )?;
            }
        }
        // A request after the session's actions: answered only once they were handled.
        c.request("ping", json!({ "channel": "ahp-root://" }))?;
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = rss_kb(pid);
    let out: Value = json!({
        "sessions": sessions,
        "turns_per_session": turns,
        "text_bytes": text_bytes,
        "charged_bytes": charged,
        "rss_kb_before": before,
        "rss_kb_after": after,
        "rss_bytes_per_charged_byte": ((after.saturating_sub(before)) * 1024) as f64 / charged.max(1) as f64,
    });
    println!("{out}");
    Ok(())
}
