//! Wire helpers shared by the AXP black-box suites (`tests/axp*.rs`): principals, sessions,
//! grants, claims, turns and reads, written against the wire protocol of AXP 0.2.0
//! (`../shared/spec/axp-0.2.0.txt`, `../shared/reference/axp-host-notes.md`), never against
//! axhost's internals.

#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::common::*;

// ─── Error codes (match codes, never messages) ───────────────────────────────

pub const STALE: i64 = -32040;
pub const BUDGET: i64 = -32041;
pub const CONTEXT: i64 = -32042;
pub const LIMIT: i64 = -32043;
pub const PARAMS: i64 = -32602;
pub const FORBIDDEN: i64 = -32009;
pub const NOT_FOUND: i64 = -32008;
pub const CONFLICT: i64 = -32011;
pub const BUSY: i64 = -32004;
pub const UNKNOWN_METHOD: i64 = -32601;

pub const ROOT: &str = "ahp-root://";
pub const EXECUTORS: &str = "axp-executors://";

/// The part-1 commands (issue 32), every one of which `initialize` must advertise.
pub const PART1: &[&str] = &[
    "_axp/register",
    "_axp/grant",
    "_axp/revoke",
    "_axp/claim",
    "_axp/renew",
    "_axp/release",
    "_axp/reserve",
    "_axp/settle",
    "_axp/emit",
    "_axp/dispatch",
    "_axp/close",
    "_axp/comment",
    "_axp/blobPut",
    "_axp/blobGet",
    "_axp/export",
];

/// The read commands: they take no `operationId`.
pub const READS: &[&str] = &[
    "_axp/export",
    "_axp/blobGet",
    "_axp/context",
    "_axp/memorySearch",
];

// ─── Principals ──────────────────────────────────────────────────────────────

/// Contributors.
pub const ALICE: &str = "alice";
pub const BOB: &str = "bob";
/// A verifier and an observer.
pub const VERA: &str = "vera";
pub const OLGA: &str = "olga";
/// A second maintainer.
pub const MARK: &str = "mark";
/// A contributor scoped to session `s1` only.
pub const CARL: &str = "carl";

/// A host with the harness's `admin` (maintainer, all sessions) plus alice and bob
/// (contributors), vera (verifier), olga (observer), mark (maintainer) and carl (contributor
/// scoped to `s1`).
pub fn cast() -> HostBuilder {
    HostProcess::builder()
        .principal(ALICE, "contributor", None)
        .principal(BOB, "contributor", None)
        .principal(VERA, "verifier", None)
        .principal(OLGA, "observer", None)
        .principal(MARK, "maintainer", None)
        .principal(CARL, "contributor", Some(&["ahp-session:/s1"]))
}

static COUNTER: AtomicU64 = AtomicU64::new(1);

/// A number no other call in this test process returns.
pub fn unique() -> u64 {
    COUNTER.fetch_add(1, Ordering::Relaxed)
}

/// A fresh `operationId`.
pub fn op() -> String {
    format!("op-{}", unique())
}

/// An initialized connection as principal `id` (`admin` for the harness maintainer).
pub fn connect(host: &HostProcess, id: &str) -> Ws {
    connect_with(host, id, &[]).0
}

/// An initialized connection as principal `id` with initial subscriptions; returns the
/// `initialize` result too.
pub fn connect_with(host: &HostProcess, id: &str, subs: &[&str]) -> (Ws, Value) {
    let token = if id == ADMIN {
        host.token().to_owned()
    } else {
        host.token_of(id).to_owned()
    };
    host.ws_init_as(&token, &format!("{id}-c{}", unique()), subs)
}

// ─── Channels ────────────────────────────────────────────────────────────────

pub fn exchange(id: &str) -> String {
    format!("axp-session:/{id}")
}

pub fn session(id: &str) -> String {
    format!("ahp-session:/{id}")
}

pub fn chat(id: &str) -> String {
    format!("ahp-chat:/{id}")
}

pub fn changeset(id: &str) -> String {
    format!("ahp-changeset:/{id}")
}

/// JavaScript's `encodeURIComponent` of an ASCII channel (what blob URIs embed).
pub fn encode_component(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-_.!~*'()".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// `axp-blob:/<encodeURIComponent(axp-session:/ID)>/<sha256>`.
pub fn blob_uri(id: &str, digest: &str) -> String {
    format!("axp-blob:/{}/{digest}", encode_component(&exchange(id)))
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

// ─── Values ──────────────────────────────────────────────────────────────────

/// An allowance: `{tokens, costMicros, turns}`.
pub fn allowance(tokens: u64, cost_micros: u64, turns: u64) -> Value {
    json!({"tokens": tokens, "costMicros": cost_micros, "turns": turns})
}

/// The usual donation: 100k tokens, 1 USD, 10 turns.
pub fn donation() -> Value {
    allowance(100_000, 1_000_000, 10)
}

/// Reported usage.
pub fn usage(input: u64, output: u64, cache_read: u64, cost_micros: u64) -> Value {
    json!({"inputTokens": input, "outputTokens": output, "cacheReadTokens": cache_read,
           "costMicros": cost_micros, "source": "reported"})
}

/// A markdown response part (empty, to be streamed into with `chat/delta`).
pub fn markdown_part(turn: &str, part: &str) -> Value {
    json!({"type": "chat/responsePart", "turnId": turn,
           "part": {"kind": "markdown", "id": part, "content": ""}})
}

pub fn delta(turn: &str, part: &str, text: &str) -> Value {
    json!({"type": "chat/delta", "turnId": turn, "partId": part, "content": text})
}

pub fn tool_start(turn: &str, tool: &str) -> Value {
    json!({"type": "chat/toolCallStart", "turnId": turn, "toolCallId": tool,
           "toolName": "test", "displayName": "Run tests"})
}

/// `chat/toolCallReady` asking for permission with an approve and a deny option.
pub fn tool_ready(turn: &str, tool: &str) -> Value {
    json!({"type": "chat/toolCallReady", "turnId": turn, "toolCallId": tool,
           "invocationMessage": "Run the suite",
           "options": [{"id": "yes", "label": "Allow once", "kind": "approve"},
                       {"id": "no", "label": "Deny", "kind": "deny"}]})
}

/// The maintainer's answer to [`tool_ready`].
pub fn tool_confirmed(turn: &str, tool: &str, approved: bool) -> Value {
    if approved {
        json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": tool,
               "approved": true, "confirmed": "user-action", "selectedOptionId": "yes"})
    } else {
        json!({"type": "chat/toolCallConfirmed", "turnId": turn, "toolCallId": tool,
               "approved": false, "reason": "denied", "selectedOptionId": "no"})
    }
}

pub fn tool_complete(turn: &str, tool: &str) -> Value {
    json!({"type": "chat/toolCallComplete", "turnId": turn, "toolCallId": tool,
           "result": {"success": true, "pastTenseMessage": "Passed"}})
}

// ─── Calls ───────────────────────────────────────────────────────────────────

/// `params` with a fresh `operationId` unless it has one, or the method is a read.
pub fn with_op(method: &str, mut params: Value) -> Value {
    if !READS.contains(&method) && params.get("operationId").is_none() {
        params["operationId"] = json!(op());
    }
    params
}

/// Extension methods for AXP calls on a raw connection.
pub trait Axp {
    /// An `_axp/*` call (a fresh `operationId` added to mutations that have none) that must
    /// succeed; its result.
    fn axp(&mut self, method: &str, params: Value) -> Value;
    /// The same, but it must fail; the error code.
    fn axp_code(&mut self, method: &str, params: Value) -> i64;
    /// Any request that must fail; the error code (params sent as given).
    fn code_of(&mut self, method: &str, params: Value) -> i64;
}

impl Axp for Ws {
    fn axp(&mut self, method: &str, params: Value) -> Value {
        self.ok(method, with_op(method, params))
    }

    fn axp_code(&mut self, method: &str, params: Value) -> i64 {
        code(&self.err(method, with_op(method, params)))
    }

    fn code_of(&mut self, method: &str, params: Value) -> i64 {
        code(&self.err(method, params))
    }
}

/// `createSession` of `ahp-session:/ID` (as a maintainer).
pub fn create(ws: &mut Ws, id: &str) {
    ws.ok("createSession", json!({"channel": session(id)}));
}

/// `_axp/register` of `executor` (ttl in ms); the executor info.
pub fn register(ws: &mut Ws, executor: &str, ttl_ms: u64) -> Value {
    ws.axp(
        "_axp/register",
        json!({"channel": EXECUTORS, "executorId": executor, "name": "Test agent",
               "placement": "satellite", "capabilities": ["acp/v1"], "ttlMs": ttl_ms}),
    )
}

/// `_axp/grant` of `grant` on session `id` with `limit` (accounting); the grant.
pub fn grant(ws: &mut Ws, id: &str, grant: &str, limit: Value) -> Value {
    ws.axp(
        "_axp/grant",
        json!({"channel": exchange(id), "grantId": grant, "limit": limit,
               "enforcement": "accounting"}),
    )
}

/// `_axp/claim` params.
pub fn claim_params(id: &str, executor: &str, grant: &str, lease_ms: u64) -> Value {
    json!({"channel": exchange(id), "executorId": executor, "grantId": grant, "leaseMs": lease_ms})
}

/// `_axp/claim`; the lease.
pub fn claim(ws: &mut Ws, id: &str, executor: &str, grant: &str, lease_ms: u64) -> Value {
    ws.axp("_axp/claim", claim_params(id, executor, grant, lease_ms))
}

/// Grant `g` (the usual donation) and claim with executor `e` for 30 s; the lease's epoch.
pub fn dock(ws: &mut Ws, id: &str) -> u64 {
    grant(ws, id, "g", donation());
    claim(ws, id, "e", "g", 30_000)["epoch"]
        .as_u64()
        .expect("lease epoch")
}

/// A maintainer starts turn `turn` on session `id` through `_axp/dispatch`.
pub fn start_turn(ws: &mut Ws, id: &str, turn: &str) {
    let r = ws.axp(
        "_axp/dispatch",
        json!({"channel": chat(id), "action": turn_started(turn, "Fix addition")}),
    );
    assert_eq!(r, Value::Null, "_axp/dispatch answers null");
}

/// `_axp/reserve` params.
pub fn reserve_params(id: &str, epoch: u64, turn: &str, ceiling: Value) -> Value {
    json!({"channel": exchange(id), "epoch": epoch, "turnId": turn, "ceiling": ceiling})
}

/// `_axp/reserve` of one turn with `tokens` and `cost` micros.
pub fn reserve(ws: &mut Ws, id: &str, epoch: u64, turn: &str, tokens: u64, cost: u64) {
    ws.axp(
        "_axp/reserve",
        reserve_params(id, epoch, turn, allowance(tokens, cost, 1)),
    );
}

/// `_axp/settle` params.
pub fn settle_params(id: &str, epoch: u64, turn: &str, usage: Value, outcome: &str) -> Value {
    json!({"channel": exchange(id), "epoch": epoch, "turnId": turn, "usage": usage,
           "outcome": outcome})
}

/// `_axp/emit` params.
pub fn emit_params(id: &str, epoch: u64, actions: Value) -> Value {
    json!({"channel": exchange(id), "epoch": epoch, "actions": actions})
}

/// A fenced command's params (`_axp/renew`, `_axp/release`).
pub fn fenced(id: &str, epoch: u64) -> Value {
    json!({"channel": exchange(id), "epoch": epoch})
}

/// `_axp/comment` params without a file reference.
pub fn comment_params(id: &str, body: &str) -> Value {
    json!({"channel": exchange(id), "body": body, "checkpoint": null, "path": null})
}

// ─── Reads ───────────────────────────────────────────────────────────────────

/// The current state of `channel`, read by `admin` on a connection of its own (so reading
/// never subscribes a connection a test watches).
pub fn state(host: &HostProcess, channel: &str) -> Value {
    state_as(host, ADMIN, channel)
}

/// The state of `channel` as principal `id` sees it.
pub fn state_as(host: &HostProcess, id: &str, channel: &str) -> Value {
    let (ws, init) = connect_with(host, id, &[channel]);
    ws.close();
    let snap = &init["snapshots"][0];
    assert_eq!(
        snap["resource"], channel,
        "snapshot of another channel: {init}"
    );
    snap["state"].clone()
}

/// `_axp/export` of session `id` by `admin`.
pub fn export(host: &HostProcess, id: &str) -> Value {
    let mut ws = connect(host, ADMIN);
    let r = ws.axp("_axp/export", json!({"channel": exchange(id)}));
    ws.close();
    r
}

/// The `action` notifications on `channel` among `frames`.
pub fn actions_on<'a>(frames: &'a [Value], channel: &str) -> Vec<&'a Value> {
    frames
        .iter()
        .filter(|f| f["method"] == "action" && f["params"]["channel"] == channel)
        .collect()
}

/// The `type`s of the actions among `frames`, in order.
pub fn action_types(frames: &[Value]) -> Vec<String> {
    frames
        .iter()
        .filter(|f| f["method"] == "action")
        .map(|f| {
            f["params"]["action"]["type"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect()
}

/// Reads `channel` until `pred` holds (or panics after `timeout`); the state that matched.
pub fn wait_state(
    host: &HostProcess,
    channel: &str,
    timeout: Duration,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let s = state(host, channel);
        if pred(&s) {
            return s;
        }
        assert!(
            Instant::now() < deadline,
            "{channel} did not reach the expected state within {timeout:?}: {s}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Milliseconds since the Unix epoch, by this machine's clock (the host's is the same).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A minimal exchange reducer for the part-1 actions (§4.2): enough to check that an
/// export's seed plus its actions rebuild its snapshot.
pub fn reduce_exchange(state: &mut Value, action: &Value) {
    match action["type"].as_str().unwrap_or("") {
        "_axp/commentAdded" => {
            let list = state
                .as_object_mut()
                .expect("state")
                .entry("discussion")
                .or_insert_with(|| json!([]));
            list.as_array_mut()
                .expect("discussion")
                .push(action["comment"].clone());
        }
        "_axp/leaseChanged" => {
            state["lease"] = action["lease"].clone();
            state["epoch"] = action["epoch"].clone();
            state["status"] = action["status"].clone();
        }
        "_axp/grantChanged" => {
            let id = action["grant"]["id"].as_str().expect("grant id").to_owned();
            state["grants"][id] = action["grant"].clone();
        }
        "_axp/reserved" => state["reservation"] = action["reservation"].clone(),
        "_axp/settled" => {
            state["reservation"] = Value::Null;
            let id = action["grant"]["id"].as_str().expect("grant id").to_owned();
            state["grants"][id.as_str()] = action["grant"].clone();
            state["usage"]
                .as_array_mut()
                .expect("usage")
                .push(json!({"turnId": action["turnId"], "grantId": id, "usage": action["usage"]}));
        }
        other => panic!("unexpected exchange action {other}: {action}"),
    }
}

// ─── Error suites ────────────────────────────────────────────────────────────

/// A host with sessions `s1` and `s2`, alice holding a lease on `s1` (grant `g`, executor
/// `e`, epoch 1) with turn `t1` started and reserved (1000 tokens).
pub fn leased() -> HostProcess {
    let host = cast().start();
    let mut admin = connect(&host, ADMIN);
    create(&mut admin, "s1");
    create(&mut admin, "s2");
    let mut alice = connect(&host, ALICE);
    register(&mut alice, "e", 30_000);
    assert_eq!(dock(&mut alice, "s1"), 1);
    start_turn(&mut admin, "s1", "t1");
    reserve(&mut alice, "s1", 1, "t1", 1_000, 1_000);
    host
}

/// Params that pass every check but the one under test, for each mutation, on session `id`.
pub fn sample(method: &str, id: &str) -> Value {
    let x = exchange(id);
    match method {
        "_axp/register" => json!({"channel": EXECUTORS, "executorId": "ex", "name": "n",
            "placement": "hosted", "capabilities": [], "ttlMs": 3000}),
        "_axp/grant" => json!({"channel": x, "grantId": "gx", "limit": donation(),
            "enforcement": "accounting"}),
        "_axp/revoke" => json!({"channel": x, "grantId": "g"}),
        "_axp/claim" => claim_params(id, "ex", "g", 30_000),
        "_axp/renew" | "_axp/release" => fenced(id, 1),
        "_axp/reserve" => reserve_params(id, 1, "t1", allowance(1, 0, 1)),
        "_axp/settle" => settle_params(id, 1, "t1", Value::Null, "complete"),
        "_axp/emit" => emit_params(id, 1, json!([markdown_part("t1", "p")])),
        "_axp/dispatch" => json!({"channel": chat(id), "action": turn_started("tx", "x")}),
        "_axp/close" => json!({"channel": x}),
        "_axp/comment" => comment_params(id, "hello"),
        "_axp/blobPut" => json!({"channel": x, "data": b64(b"x"), "mediaType": "text/plain"}),
        "_axp/blobGet" => json!({"channel": x, "digest": sha256_hex(b"x")}),
        "_axp/export" => json!({"channel": x}),
        other => panic!("no sample for {other}"),
    }
}

/// Sets `path` (dot-separated) in `params` to `value`.
pub fn with(mut params: Value, path: &str, value: Value) -> Value {
    let mut at = &mut params;
    let keys: Vec<&str> = path.split('.').collect();
    for k in &keys[..keys.len() - 1] {
        at = &mut at[*k];
    }
    at[keys[keys.len() - 1]] = value;
    params
}

/// Removes `key` from the object at `path` ("" = top level).
pub fn without(mut params: Value, path: &str, key: &str) -> Value {
    let at = if path.is_empty() {
        &mut params
    } else {
        &mut params[path]
    };
    at.as_object_mut().expect("object").remove(key);
    params
}
