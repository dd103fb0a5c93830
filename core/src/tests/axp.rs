//! The AXP exchange through the public surface: every command's happy path and every error
//! code it answers, retry receipts, leases and their timers, budgets, turn control, blobs,
//! export, restarts and failed commits.

use super::schema::check;
use super::*;

pub(super) const M: u64 = 1;
pub(super) const C: u64 = 2;
pub(super) const O: u64 = 3;
pub(super) const V: u64 = 4;
pub(super) const B: u64 = 5;
pub(super) const X: &str = "axp-session:/s1";
pub(super) const CHAT: &str = "ahp-chat:/s1";

pub(super) fn role(id: &str, role: Role) -> Principal {
    Principal {
        id: id.into(),
        role,
        sessions: SessionScope::All,
    }
}

pub(super) fn allowance(tokens: u64, cost_micros: u64, turns: u64) -> Value {
    json!({"tokens": tokens, "costMicros": cost_micros, "turns": turns})
}

/// Connections: 1 maintainer `m`, 2 contributor `alice`, 3 observer `obs`, 4 verifier `ver`,
/// 5 contributor `bob`; session `s1`.
pub(super) struct Ax {
    pub(super) h: Harness,
    id: u64,
    op: u64,
}

impl Ax {
    pub(super) fn new() -> Ax {
        Ax::with(HostConfig::default(), MemStore::new())
    }

    pub(super) fn limits(limits: Limits) -> Ax {
        Ax::with(
            HostConfig {
                limits,
                ..HostConfig::default()
            },
            MemStore::new(),
        )
    }

    pub(super) fn with(config: HostConfig, store: MemStore) -> Ax {
        let mut ax = Ax::bare(config, store);
        ax.h.create(M, "s1");
        ax
    }

    /// The connections, no session created.
    pub(super) fn bare(config: HostConfig, store: MemStore) -> Ax {
        let mut h = Harness::with(config, store);
        h.init(M, Principal::maintainer("m"), "c1", &[]);
        h.init(C, role("alice", Role::Contributor), "c2", &[]);
        h.init(O, role("obs", Role::Observer), "c3", &[]);
        h.init(V, role("ver", Role::Verifier), "c4", &[]);
        h.init(B, role("bob", Role::Contributor), "c5", &[]);
        // Operation ids continue past any a previous host over this store used.
        let op = h.host.store().commits() * 1000;
        Ax { h, id: 100, op }
    }

    /// The whole answer to `method`; a mutation without an `operationId` gets a fresh one.
    pub(super) fn raw(&mut self, conn: u64, method: &str, mut params: Value) -> Value {
        let reads = [
            "_axp/export",
            "_axp/blobGet",
            "_axp/context",
            "_axp/memorySearch",
        ];
        if method.starts_with("_axp/") && !reads.contains(&method) {
            if let Some(p) = params.as_object_mut() {
                if !p.contains_key("operationId") {
                    self.op += 1;
                    p.insert("operationId".into(), json!(format!("op-{}", self.op)));
                }
            }
        }
        self.id += 1;
        let id = self.id;
        self.h.request(conn, id, method, params)
    }

    pub(super) fn ok(&mut self, conn: u64, method: &str, params: Value) -> Value {
        let r = self.raw(conn, method, params);
        assert!(r.get("error").is_none(), "{method} failed: {r}");
        r["result"].clone()
    }

    pub(super) fn code(&mut self, conn: u64, method: &str, params: Value) -> i64 {
        let r = self.raw(conn, method, params);
        r["error"]["code"]
            .as_i64()
            .unwrap_or_else(|| panic!("{method} succeeded: {r}"))
    }

    pub(super) fn exchange(&self) -> Value {
        self.h.host.channel_state(X).expect("exchange")
    }

    pub(super) fn chat(&self) -> Value {
        self.h.host.channel_state(CHAT).expect("chat")
    }

    pub(super) fn grant(&mut self, conn: u64, grant: &str, limit: Value) -> Value {
        self.ok(
            conn,
            "_axp/grant",
            json!({"channel": X, "grantId": grant, "limit": limit, "enforcement": "accounting"}),
        )
    }

    pub(super) fn claim(&mut self, conn: u64, executor: &str, grant: &str) -> Value {
        self.raw(
            conn,
            "_axp/claim",
            json!({"channel": X, "executorId": executor, "grantId": grant, "leaseMs": 30_000}),
        )
    }

    /// Alice grants `g` (10,000 tokens, 10,000 micros, 10 turns) and claims with `e1`:
    /// the lease's epoch.
    pub(super) fn dock(&mut self) -> u64 {
        self.grant(C, "g", allowance(10_000, 10_000, 10));
        let lease = self.claim(C, "e1", "g");
        lease["result"]["epoch"].as_u64().expect("epoch")
    }

    pub(super) fn prompt(&mut self, turn_id: &str) {
        self.ok(
            M,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": turn(turn_id, "do it")}),
        );
    }

    pub(super) fn reserve(&mut self, epoch: u64, turn_id: &str, tokens: u64) -> Value {
        self.raw(
            C,
            "_axp/reserve",
            json!({"channel": X, "epoch": epoch, "turnId": turn_id, "ceiling": allowance(tokens, 100, 1)}),
        )
    }

    pub(super) fn emit(&mut self, epoch: u64, actions: Value) -> Value {
        self.raw(
            C,
            "_axp/emit",
            json!({"channel": X, "epoch": epoch, "actions": actions}),
        )
    }

    /// Moves both clocks `ms` forward and fires what is due.
    pub(super) fn advance(&mut self, ms: u64) -> Vec<(u64, Value)> {
        self.h.now += ms;
        let now = self.h.now();
        self.h.host.handle_timeout(now);
        self.h.drain()
    }
}

pub(super) fn markdown(turn_id: &str, id: &str) -> Value {
    json!({"type":"chat/responsePart","turnId":turn_id,"part":{"kind":"markdown","id":id,"content":""}})
}

pub(super) fn delta(turn_id: &str, id: &str, text: &str) -> Value {
    json!({"type":"chat/delta","turnId":turn_id,"partId":id,"content":text})
}

pub(super) fn usage(input: u64, output: u64, cache: u64, cost: u64) -> Value {
    json!({"inputTokens":input,"outputTokens":output,"cacheReadTokens":cache,"costMicros":cost,"source":"reported"})
}

#[test]
fn initialize_advertises_the_method_table_and_the_identity() {
    let mut h = Harness::new();
    let r = h.init(1, role("alice", Role::Contributor), "c", &[]);
    let meta = &r["_meta"]["org.axp.exchange"];
    check("axp-initialize-meta", meta);
    let methods: Vec<&str> = meta["methods"]
        .as_array()
        .expect("methods")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(methods, crate::axp::method_names());
    for m in ["_axp/claim", "_axp/emit", "_axp/blobPut", "_axp/export"] {
        assert!(methods.contains(&m), "{m}");
    }
    assert_eq!(meta["role"], "contributor");
    assert_eq!(meta["principal"], "alice");
    assert_eq!(meta["repository"], "default");
    assert_eq!(meta["memory"], "axp-memory://");
    // Any other `_axp/*` name is unknown.
    for m in ["_axp/nope", "_axp/checkpoints", "_axp/Compact"] {
        let r = h.request(1, 9, m, json!({"channel": X, "operationId": "x"}));
        assert_eq!(r["error"]["code"], -32601, "{m}");
    }
}

#[test]
fn params_are_strict_and_checked_before_scope() {
    let mut ax = Ax::new();
    let mut h = Harness::new();
    // Unknown key, missing operationId (even out of scope), bad ranges: all -32602.
    assert_eq!(
        ax.code(
            C,
            "_axp/renew",
            json!({"channel": X, "epoch": 1, "extra": 1})
        ),
        -32602
    );
    h.init(
        1,
        Principal {
            id: "scoped".into(),
            role: Role::Contributor,
            sessions: SessionScope::Only(["other".to_string()].into()),
        },
        "c",
        &[],
    );
    let r = h.request(1, 2, "_axp/renew", json!({"channel": X, "epoch": 1}));
    assert_eq!(r["error"]["code"], -32602, "{r}");
    let r = h.request(
        1,
        3,
        "_axp/renew",
        json!({"channel": X, "epoch": 1, "operationId": "o"}),
    );
    assert_eq!(r["error"]["code"], -32009, "{r}");
    assert_eq!(
        ax.code(
            C,
            "_axp/claim",
            json!({"channel": X, "executorId": "e", "grantId": "g", "leaseMs": 2999})
        ),
        -32602
    );
    // Unknown channel, and a command on a channel that is no session's.
    assert_eq!(
        ax.code(
            C,
            "_axp/renew",
            json!({"channel": "axp-session:/nope", "epoch": 1})
        ),
        -32008
    );
    assert_eq!(
        ax.code(
            C,
            "_axp/renew",
            json!({"channel": "ahp-root://", "epoch": 1})
        ),
        -32602
    );
}

#[test]
fn register_refreshes_own_executors_and_they_go_offline_on_time() {
    let mut ax = Ax::new();
    let sub = ax.ok(O, "subscribe", json!({"channel": "axp-executors://"}));
    check("axp/executors.state", &sub["snapshot"]["state"]);
    let params = json!({"channel": "axp-executors://", "executorId": "e1", "name": "Agent",
        "placement": "satellite", "capabilities": ["acp/v1"], "ttlMs": 3000});
    check(
        "axp/register.params",
        &json!({"operationId": "x"})
            .as_object()
            .map(|o| {
                let mut p = params.clone();
                p["operationId"] = o["operationId"].clone();
                p
            })
            .expect("params"),
    );
    let info = ax.ok(C, "_axp/register", params.clone());
    check("axp/register.result", &info);
    assert_eq!(info["owner"], "alice");
    assert_eq!(info["online"], true);
    // Another contributor cannot take the id; observers and verifiers cannot register.
    assert_eq!(ax.code(B, "_axp/register", params.clone()), -32009);
    assert_eq!(ax.code(O, "_axp/register", params.clone()), -32009);
    assert_eq!(ax.code(V, "_axp/register", params.clone()), -32009);
    let state =
        ax.h.host
            .channel_state_for(&observer("x"), "axp-executors://");
    assert_eq!(state.expect("registry")["entries"]["e1"]["owner"], "alice");
    // The TTL passes: a timer takes it offline and tells the registry's subscribers.
    let out = ax.advance(3000);
    let event = out
        .iter()
        .find(|(c, v)| *c == O && v["params"]["channel"] == "axp-executors://")
        .expect("offline event");
    check("axp/executor-changed.action", &event.1["params"]["action"]);
    assert_eq!(event.1["params"]["action"]["executor"]["online"], false);
    assert_eq!(ax.h.host.poll_timeout(), None, "no timer left, no tick");
    // Re-registering brings it back.
    ax.ok(C, "_axp/register", params);
    assert_eq!(
        ax.h.host.axp_inspect().executors["entries"]["e1"]["online"],
        true
    );
}

#[test]
fn the_executor_registry_is_bounded() {
    let mut ax = Ax::limits(Limits {
        executors_max: 1,
        ..Limits::default()
    });
    let reg = |id: &str| {
        json!({"channel": "ahp-root://", "executorId": id, "name": "n", "placement": "hosted",
            "capabilities": [], "ttlMs": 3000})
    };
    ax.ok(C, "_axp/register", reg("e1"));
    assert_eq!(ax.code(C, "_axp/register", reg("e2")), -32043);
    ax.ok(C, "_axp/register", reg("e1"));
}

#[test]
fn grants_belong_to_their_donor_and_never_drop_below_spending() {
    let mut ax = Ax::new();
    let g = ax.grant(C, "g", allowance(1000, 1000, 5));
    check("axp/grant.result", &g);
    assert_eq!(g["spent"], allowance(0, 0, 0));
    let grant = |limit: Value| json!({"channel": X, "grantId": "g", "limit": limit, "enforcement": "provider"});
    assert_eq!(ax.code(B, "_axp/grant", grant(allowance(1, 1, 1))), -32009);
    assert_eq!(ax.code(O, "_axp/grant", grant(allowance(1, 1, 1))), -32009);
    let epoch = ax.claim(C, "e1", "g")["result"]["epoch"]
        .as_u64()
        .expect("epoch");
    ax.prompt("t1");
    ax.reserve(epoch, "t1", 300);
    // Changing a grant during its reserved turn is a conflict.
    assert_eq!(
        ax.code(C, "_axp/grant", grant(allowance(2000, 2000, 5))),
        -32011
    );
    ax.ok(
        C,
        "_axp/settle",
        json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": usage(100, 50, 0, 10), "outcome": "complete"}),
    );
    // Below what is spent: budget.
    assert_eq!(
        ax.code(C, "_axp/grant", grant(allowance(149, 1000, 5))),
        -32041
    );
    let g = ax.ok(C, "_axp/grant", grant(allowance(150, 1000, 5)));
    assert_eq!(g["spent"], allowance(150, 10, 1));
    assert_eq!(g["enforcement"], "provider");
}

#[test]
fn a_session_holds_a_bounded_number_of_grants() {
    let mut ax = Ax::limits(Limits {
        grants_per_session_max: 1,
        ..Limits::default()
    });
    ax.grant(C, "g1", allowance(1, 1, 1));
    let p = json!({"channel": X, "grantId": "g2", "limit": allowance(1, 1, 1), "enforcement": "accounting"});
    assert_eq!(ax.code(C, "_axp/grant", p), -32043);
    ax.grant(C, "g1", allowance(2, 2, 2));
}

#[test]
fn revoking_the_leased_grant_orphans_settles_in_full_and_fences() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    ax.prompt("t1");
    ax.reserve(epoch, "t1", 99);
    let revoke = json!({"channel": X, "grantId": "g", "operationId": "revoke"});
    assert_eq!(ax.code(M, "_axp/revoke", revoke.clone()), -32009);
    assert_eq!(ax.ok(C, "_axp/revoke", revoke.clone()), Value::Null);
    let seq = ax.h.host.server_seq();
    assert_eq!(ax.ok(C, "_axp/revoke", revoke), Value::Null);
    assert_eq!(ax.h.host.server_seq(), seq, "a retry emits nothing");
    let x = ax.exchange();
    assert_eq!(x["status"], "orphaned");
    assert_eq!(x["lease"], Value::Null);
    assert_eq!(x["epoch"], epoch);
    assert_eq!(x["usage"].as_array().map(Vec::len), Some(1));
    assert_eq!(x["grants"]["g"]["spent"]["tokens"], 99);
    assert_eq!(x["usage"][0]["usage"]["source"], "reservation");
    assert_eq!(ax.chat()["turns"][0]["state"], "error");
    // The old lease is gone: stale.
    let settle =
        json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": null, "outcome": "complete"});
    assert_eq!(ax.code(C, "_axp/settle", settle), -32040);
    // Re-granting is the donor's explicit act and clears the revocation.
    let g = ax.grant(C, "g", allowance(10_000, 10_000, 10));
    assert_eq!(g["revoked"], false);
}

#[test]
fn claims_advance_the_epoch_and_exactly_one_wins() {
    let mut ax = Ax::new();
    ax.grant(C, "g", allowance(100, 100, 1));
    ax.grant(B, "gb", allowance(100, 100, 1));
    let lease = ax.claim(C, "e1", "g")["result"].clone();
    check("axp/claim.result", &lease);
    assert_eq!(lease["epoch"], 1);
    assert_eq!(lease["heartbeatMs"], 10_000);
    assert_eq!(ax.claim(B, "eb", "gb")["error"]["code"], -32011);
    assert_eq!(ax.claim(C, "e2", "g")["error"]["code"], -32011);
    ax.ok(C, "_axp/release", json!({"channel": X, "epoch": 1}));
    assert_eq!(ax.exchange()["status"], "orphaned");
    // Not one's own grant, a revoked one, someone else's executor id, no authority.
    assert_eq!(ax.claim(B, "eb", "g")["error"]["code"], -32009);
    assert_eq!(ax.claim(O, "eo", "g")["error"]["code"], -32009);
    ax.ok(
        C,
        "_axp/register",
        json!({"channel": X, "executorId": "e1", "name": "n", "placement": "satellite", "capabilities": [], "ttlMs": 3000}),
    );
    assert_eq!(ax.claim(B, "e1", "gb")["error"]["code"], -32009);
    let lease = ax.claim(B, "eb", "gb")["result"].clone();
    assert_eq!(lease["epoch"], 2);
}

#[test]
fn concurrent_claims_pipelined_on_a_slow_disk_have_one_winner() {
    let mut ax = Ax::new();
    ax.grant(C, "g", allowance(100, 100, 1));
    ax.grant(B, "gb", allowance(100, 100, 1));
    ax.h.hold_commits(true);
    let claim = |exec: &str, grant: &str, op: &str| json!({"jsonrpc":"2.0","id":77,"method":"_axp/claim","params":{"channel":X,"executorId":exec,"grantId":grant,"leaseMs":30000,"operationId":op}});
    ax.h.send(C, &claim("e1", "g", "ca"));
    let out = ax.h.send(B, &claim("eb", "gb", "cb"));
    // The loser is refused against the winner's change in flight, in order behind it.
    assert!(out.is_empty(), "{out:?}");
    let out = ax.h.complete(8);
    let answer = |conn: u64| {
        out.iter()
            .find(|(c, v)| *c == conn && v["id"] == 77)
            .map(|(_, v)| v.clone())
            .expect("answer")
    };
    assert_eq!(answer(C)["result"]["epoch"], 1);
    assert_eq!(answer(B)["error"]["code"], -32011);
    assert_eq!(ax.exchange()["lease"]["owner"], "alice");
}

#[test]
fn resume_epoch_detects_an_intervening_owner_even_after_it_released() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    ax.grant(B, "gb", allowance(100, 100, 1));
    // Alice disconnects; her lease runs out; Bob claims, then releases.
    ax.advance(30_001);
    assert_eq!(ax.exchange()["status"], "orphaned");
    let bob = ax.claim(B, "eb", "gb")["result"]["epoch"]
        .as_u64()
        .expect("bob");
    ax.ok(B, "_axp/release", json!({"channel": X, "epoch": bob}));
    let resume = json!({"channel": X, "executorId": "e1", "grantId": "g", "leaseMs": 30000, "resumeEpoch": epoch});
    assert_eq!(ax.code(C, "_axp/claim", resume), -32040);
    // Resuming at the current epoch works, and a lease still held is replaced.
    let ok = json!({"channel": X, "executorId": "e1", "grantId": "g", "leaseMs": 30000, "resumeEpoch": bob});
    let lease = ax.ok(C, "_axp/claim", ok);
    assert_eq!(lease["epoch"], bob + 1);
    let again = json!({"channel": X, "executorId": "e1", "grantId": "g", "leaseMs": 30000, "resumeEpoch": bob + 1});
    let lease = ax.ok(C, "_axp/claim", again);
    assert_eq!(lease["epoch"], bob + 2);
    // A different executor cannot resume someone's lease.
    let other = json!({"channel": X, "executorId": "e9", "grantId": "g", "leaseMs": 30000, "resumeEpoch": bob + 2});
    assert_eq!(ax.code(C, "_axp/claim", other), -32040);
}

#[test]
fn renew_extends_the_lease_and_the_executor_and_fencing_refuses_strangers() {
    let mut ax = Ax::new();
    ax.ok(
        C,
        "_axp/register",
        json!({"channel": X, "executorId": "e1", "name": "n", "placement": "satellite", "capabilities": [], "ttlMs": 3000}),
    );
    let epoch = ax.dock();
    ax.advance(5_000);
    let lease = ax.ok(C, "_axp/renew", json!({"channel": X, "epoch": epoch}));
    check("axp/renew.result", &lease);
    // Three heartbeats from the host's clock when it was renewed.
    let expires = lease["expiresAt"].as_u64().expect("expiresAt");
    assert!(
        (ax.h.now + 30_000 - 5..=ax.h.now + 30_000).contains(&expires),
        "{expires}"
    );
    let entry = ax.h.host.axp_inspect().executors["entries"]["e1"].clone();
    assert_eq!(entry["online"], true);
    assert_eq!(entry["expiresAt"], lease["expiresAt"]);
    assert_eq!(
        ax.code(C, "_axp/renew", json!({"channel": X, "epoch": epoch + 1})),
        -32040
    );
    assert_eq!(
        ax.code(B, "_axp/renew", json!({"channel": X, "epoch": epoch})),
        -32040
    );
    assert_eq!(
        ax.code(O, "_axp/renew", json!({"channel": X, "epoch": epoch})),
        -32009
    );
    // Output is not a heartbeat: a lease renewed in time never expires, one left alone does.
    for _ in 0..5 {
        ax.advance(10_000);
        ax.ok(C, "_axp/renew", json!({"channel": X, "epoch": epoch}));
    }
    assert_eq!(ax.exchange()["status"], "open");
    ax.advance(30_000);
    assert_eq!(ax.exchange()["status"], "orphaned");
    assert_eq!(
        ax.code(C, "_axp/renew", json!({"channel": X, "epoch": epoch})),
        -32040
    );
    assert_eq!(
        ax.code(C, "_axp/release", json!({"channel": X, "epoch": epoch})),
        -32040
    );
}

#[test]
fn lease_expiry_by_timer_settles_in_flight_usage_and_fences_old_output() {
    let mut ax = Ax::new();
    ax.ok(O, "subscribe", json!({"channel": X}));
    let epoch = ax.dock();
    ax.prompt("t1");
    ax.reserve(epoch, "t1", 1000);
    assert!(ax.advance(29_000).is_empty(), "nothing before the deadline");
    let out = ax.advance(1_000);
    let kinds: Vec<&str> = out
        .iter()
        .filter(|(c, _)| *c == O)
        .filter_map(|(_, v)| v["params"]["action"]["type"].as_str())
        .collect();
    assert_eq!(kinds, ["_axp/settled", "_axp/leaseChanged"]);
    let x = ax.exchange();
    assert_eq!(x["status"], "orphaned");
    assert_eq!(x["grants"]["g"]["spent"]["tokens"], 1000);
    assert_eq!(x["usage"][0]["usage"]["source"], "reservation");
    assert_eq!(
        ax.emit(epoch, json!([markdown("t1", "p")]))["error"]["code"],
        -32040
    );
    let next = ax.claim(C, "e2", "g")["result"]["epoch"]
        .as_u64()
        .expect("epoch");
    assert!(next > epoch);
}

#[test]
fn reserve_is_one_turn_within_the_grant() {
    let mut ax = Ax::new();
    ax.grant(C, "g", allowance(500, 500, 2));
    let epoch = ax.claim(C, "e1", "g")["result"]["epoch"]
        .as_u64()
        .expect("epoch");
    assert_eq!(
        ax.reserve(epoch, "t1", 100)["error"]["code"],
        -32011,
        "no active turn"
    );
    ax.prompt("t1");
    assert_eq!(ax.reserve(epoch + 1, "t1", 100)["error"]["code"], -32040);
    assert_eq!(ax.reserve(epoch, "t1", 501)["error"]["code"], -32041);
    let two = json!({"channel": X, "epoch": epoch, "turnId": "t1", "ceiling": allowance(10, 0, 2)});
    assert_eq!(ax.code(C, "_axp/reserve", two), -32602);
    let none = json!({"channel": X, "epoch": epoch, "turnId": "t1", "ceiling": allowance(0, 0, 1)});
    assert_eq!(ax.code(C, "_axp/reserve", none), -32602);
    assert_eq!(
        ax.code(
            B,
            "_axp/reserve",
            json!({"channel": X, "epoch": epoch, "turnId": "t1", "ceiling": allowance(1, 0, 1)})
        ),
        -32040
    );
    assert_eq!(ax.reserve(epoch, "t1", 500)["result"], Value::Null);
    let r = ax.exchange()["reservation"].clone();
    assert_eq!(r["turnId"], "t1");
    assert_eq!(r["epoch"], epoch);
    assert_eq!(ax.reserve(epoch, "t1", 1)["error"]["code"], -32011);
    // A maintainer cannot start another turn while one is reserved.
    let r = ax.raw(
        M,
        "_axp/dispatch",
        json!({"channel": CHAT, "action": turn("t2", "x")}),
    );
    assert_eq!(r["error"]["code"], -32004);
}

#[test]
fn settle_is_idempotent_charges_what_was_reported_and_starts_the_next_turn() {
    let mut ax = Ax::new();
    ax.ok(O, "subscribe", json!({"channel": X}));
    let epoch = ax.dock();
    ax.prompt("t1");
    let queued = json!({"type":"chat/pendingMessageSet","kind":"queued","id":"q1","message":{"text":"next","origin":{"kind":"user"}}});
    ax.ok(
        M,
        "_axp/dispatch",
        json!({"channel": CHAT, "action": queued}),
    );
    ax.reserve(epoch, "t1", 1000);
    let settle = json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": usage(100, 20, 80, 100),
        "outcome": "complete", "operationId": "settle-once"});
    check("axp/settle.params", &settle);
    let bad = json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": usage(10, 20, 80, 100), "outcome": "complete"});
    assert_eq!(
        ax.code(C, "_axp/settle", bad),
        -32602,
        "cache reads within input"
    );
    let seq = ax.h.host.server_seq();
    assert_eq!(ax.ok(C, "_axp/settle", settle.clone()), Value::Null);
    let after = ax.h.host.server_seq();
    assert!(after > seq);
    assert_eq!(ax.ok(C, "_axp/settle", settle.clone()), Value::Null);
    assert_eq!(ax.h.host.server_seq(), after, "the retry changed nothing");
    let mut changed = settle.clone();
    changed["usage"]["outputTokens"] = json!(21);
    assert_eq!(ax.code(C, "_axp/settle", changed), -32011);
    let mut fresh = settle;
    fresh["operationId"] = json!("settle-twice");
    assert_eq!(ax.code(C, "_axp/settle", fresh), -32040);
    let x = ax.exchange();
    assert_eq!(x["grants"]["g"]["spent"], allowance(120, 100, 1));
    assert_eq!(x["usage"].as_array().map(Vec::len), Some(1));
    let chat = ax.chat();
    assert_eq!(chat["turns"][0]["state"], "complete");
    assert_eq!(chat["turns"][0]["usage"]["inputTokens"], 100);
    assert_eq!(
        chat["turns"][0]["usage"]["_meta"]["org.axp.exchange"]["costSource"],
        "reported"
    );
    assert_eq!(
        chat["activeTurn"]["message"]["text"], "next",
        "the queue moves on"
    );
    // Without usage the whole ceiling is charged.
    let next = chat["activeTurn"]["id"].as_str().expect("id").to_owned();
    ax.reserve(epoch, &next, 700);
    ax.ok(
        C,
        "_axp/settle",
        json!({"channel": X, "epoch": epoch, "turnId": next, "usage": null, "outcome": "error", "error": "boom"}),
    );
    let x = ax.exchange();
    assert_eq!(x["grants"]["g"]["spent"], allowance(820, 200, 2));
    assert_eq!(x["usage"][1]["usage"]["source"], "reservation");
    let last = &ax.chat()["turns"][1];
    assert_eq!(last["state"], "error");
}

#[test]
fn an_overspend_is_recorded_revokes_and_beats_stale() {
    let mut ax = Ax::new();
    ax.grant(C, "g", allowance(1000, 1000, 5));
    let epoch = ax.claim(C, "e1", "g")["result"]["epoch"]
        .as_u64()
        .expect("epoch");
    ax.prompt("t1");
    ax.reserve(epoch, "t1", 500);
    ax.ok(
        C,
        "_axp/settle",
        json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": usage(900, 300, 0, 5), "outcome": "complete"}),
    );
    let g = ax.exchange()["grants"]["g"].clone();
    assert_eq!(g["spent"]["tokens"], 1200, "recorded, not capped");
    assert_eq!(g["revoked"], true);
    assert_eq!(
        ax.exchange()["status"],
        "open",
        "the lease stays until it ends"
    );
    // Every fenced call on it now answers budget, even where the epoch would be stale.
    assert_eq!(
        ax.code(C, "_axp/renew", json!({"channel": X, "epoch": epoch})),
        -32041
    );
    let settle =
        json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": null, "outcome": "complete"});
    assert_eq!(ax.code(C, "_axp/settle", settle), -32041);
    ax.prompt("t2");
    assert_eq!(ax.reserve(epoch, "t2", 1)["error"]["code"], -32041);
    assert_eq!(
        ax.emit(epoch, json!([markdown("t2", "p")]))["error"]["code"],
        -32041
    );
}

#[test]
fn emit_streams_checked_output_into_the_reserved_turn() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    ax.prompt("t1");
    assert_eq!(ax.emit(epoch, json!([]))["error"]["code"], -32602);
    assert_eq!(
        ax.emit(epoch, json!([markdown("t1", "p")]))["error"]["code"],
        -32041,
        "reserve first"
    );
    ax.reserve(epoch, "t1", 1000);
    let out = ax.emit(
        epoch,
        json!([
            markdown("t1", "text"),
            delta("t1", "text", "Working together."),
            {"type":"chat/toolCallStart","turnId":"t1","toolCallId":"tool","toolName":"test","displayName":"Run tests"},
            {"type":"chat/toolCallReady","turnId":"t1","toolCallId":"tool","invocationMessage":"Run the suite",
             "options":[{"id":"yes","label":"Allow once","kind":"approve"},{"id":"no","label":"Deny","kind":"deny"}]},
        ]),
    );
    assert_eq!(out["result"], Value::Null, "{out}");
    let active = ax.chat()["activeTurn"].clone();
    assert_eq!(active["responseParts"][0]["content"], "Working together.");
    assert_eq!(
        active["responseParts"][1]["toolCall"]["status"],
        "pending-confirmation"
    );
    let session = ax.h.host.channel_state("ahp-session:/s1").expect("session");
    assert_eq!(session["inputNeeded"][0]["id"], "tool");
    let bad = |ax: &mut Ax, action: Value| ax.emit(epoch, json!([action]))["error"]["code"].clone();
    assert_eq!(bad(&mut ax, markdown("t9", "x")), -32040, "another turn");
    assert_eq!(bad(&mut ax, turn("t9", "x")), -32009, "not executor output");
    assert_eq!(
        bad(
            &mut ax,
            json!({"type":"chat/responsePart","turnId":"t1","part":{"kind":"error","error":{"errorType":"x","message":"m"}}})
        ),
        -32009
    );
    assert_eq!(bad(&mut ax, markdown("t1", "text")), -32011, "part exists");
    assert_eq!(bad(&mut ax, delta("t1", "nope", "x")), -32011);
    assert_eq!(
        bad(
            &mut ax,
            json!({"type":"chat/reasoning","turnId":"t1","partId":"nope","content":"x"})
        ),
        -32011
    );
    assert_eq!(
        bad(
            &mut ax,
            json!({"type":"chat/toolCallStart","turnId":"t1","toolCallId":"tool","toolName":"t","displayName":"d"})
        ),
        -32011
    );
    assert_eq!(
        bad(
            &mut ax,
            json!({"type":"chat/toolCallStart","turnId":"t1","toolCallId":"t2","toolName":"t","displayName":"d","contributor":{"kind":"client","clientId":"x"}})
        ),
        -32009
    );
    assert_eq!(
        bad(
            &mut ax,
            json!({"type":"chat/toolCallComplete","turnId":"t1","toolCallId":"tool","result":{"success":true,"pastTenseMessage":"ok"}})
        ),
        -32009,
        "not running"
    );
    assert_eq!(
        bad(
            &mut ax,
            json!({"type":"chat/toolCallDelta","turnId":"t1","toolCallId":"zzz","content":"x"})
        ),
        -32011
    );
    assert_eq!(
        bad(&mut ax, json!({"type":"chat/frobnicated","turnId":"t1"})),
        -32602
    );
    // All or nothing: a batch with one bad action changes nothing.
    let seq = ax.h.host.server_seq();
    let chat = ax.chat();
    let r = ax.emit(
        epoch,
        json!([delta("t1", "text", " more"), delta("t1", "nope", "x")]),
    );
    assert_eq!(r["error"]["code"], -32011);
    assert_eq!(ax.h.host.server_seq(), seq);
    assert_eq!(ax.chat(), chat);
    // The executor cannot approve its own call; an option must match; a maintainer may.
    let confirm = |approved: bool, option: &str| {
        json!({"type":"chat/toolCallConfirmed","turnId":"t1","toolCallId":"tool","approved":approved,
               "confirmed":"user-action","selectedOptionId":option})
    };
    assert_eq!(
        ax.code(
            C,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": confirm(true, "yes")})
        ),
        -32009
    );
    assert_eq!(
        ax.code(
            M,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": confirm(false, "yes")})
        ),
        -32602
    );
    assert_eq!(
        ax.code(
            M,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": confirm(true, "maybe")})
        ),
        -32602
    );
    ax.ok(
        M,
        "_axp/dispatch",
        json!({"channel": CHAT, "action": confirm(true, "yes")}),
    );
    let session = ax.h.host.channel_state("ahp-session:/s1").expect("session");
    assert!(
        session
            .get("inputNeeded")
            .is_none_or(|v| v.as_array().is_some_and(Vec::is_empty)),
        "{session}"
    );
    assert_eq!(
        ax.code(
            M,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": confirm(true, "yes")})
        ),
        -32011,
        "no longer awaiting"
    );
    let done = ax.emit(
        epoch,
        json!([{"type":"chat/toolCallComplete","turnId":"t1","toolCallId":"tool","result":{"success":true,"pastTenseMessage":"Passed"}}]),
    );
    assert_eq!(done["result"], Value::Null, "{done}");
}

#[test]
fn an_executor_cannot_claim_approval_and_ready_options_are_checked() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    ax.prompt("t1");
    ax.reserve(epoch, "t1", 100);
    ax.emit(
        epoch,
        json!([{"type":"chat/toolCallStart","turnId":"t1","toolCallId":"tool","toolName":"acp","displayName":"Build"}]),
    );
    let ready = |extra: Value| {
        let mut a = json!({"type":"chat/toolCallReady","turnId":"t1","toolCallId":"tool","invocationMessage":"Build"});
        for (k, v) in extra.as_object().into_iter().flatten() {
            a[k] = v.clone();
        }
        json!([a])
    };
    let code = |ax: &mut Ax, extra: Value| ax.emit(epoch, ready(extra))["error"]["code"].clone();
    assert_eq!(code(&mut ax, json!({"confirmed": "user-action"})), -32009);
    assert_eq!(
        code(
            &mut ax,
            json!({"confirmed": "not-needed", "options": [{"id":"a","label":"A","kind":"approve"}]})
        ),
        -32009
    );
    assert_eq!(code(&mut ax, json!({"editable": true})), -32602);
    assert_eq!(code(&mut ax, json!({"options": []})), -32602);
    assert_eq!(
        code(
            &mut ax,
            json!({"options": [{"id":"a","label":"A","kind":"approve"},{"id":"a","label":"B","kind":"deny"}]})
        ),
        -32602
    );
    let r = ax.emit(epoch, ready(json!({"confirmed": "not-needed"})));
    assert_eq!(r["result"], Value::Null, "{r}");
    assert_eq!(
        ax.chat()["activeTurn"]["responseParts"][0]["toolCall"]["status"],
        "running"
    );
    let r = ax.emit(epoch, ready(json!({})));
    assert_eq!(r["result"], Value::Null, "ready again while running: {r}");
}

#[test]
fn executor_output_is_charged_against_the_chat_limit_as_it_arrives() {
    let mut ax = Ax::limits(Limits {
        chat_bytes_max: 4096,
        ..Limits::default()
    });
    let epoch = ax.dock();
    ax.prompt("t1");
    ax.reserve(epoch, "t1", 100);
    ax.emit(epoch, json!([markdown("t1", "p")]));
    let mut refused = false;
    for _ in 0..20 {
        let r = ax.emit(epoch, json!([delta("t1", "p", &"x".repeat(500))]));
        if r.get("error").is_some() {
            assert_eq!(r["error"]["code"], -32043);
            refused = true;
            break;
        }
    }
    assert!(refused, "the chat limit stops output");
    ax.h.host.audit_chat_bytes().expect("counts agree");
    let charged = ax.h.host.chat_bytes_total();
    // A restart recounts the same from the log.
    let store = ax.h.host.into_store();
    let h = Harness::with(
        HostConfig {
            limits: Limits {
                chat_bytes_max: 4096,
                ..Limits::default()
            },
            ..HostConfig::default()
        },
        store,
    );
    assert_eq!(h.host.chat_bytes_total(), charged);
    h.host
        .audit_chat_bytes()
        .expect("counts agree after a restart");
}

#[test]
fn axp_dispatch_is_the_maintainer_table_with_a_receipt_and_no_origin() {
    let mut ax = Ax::new();
    ax.ok(O, "subscribe", json!({"channel": CHAT}));
    let p = json!({"channel": CHAT, "action": turn("t1", "hi"), "operationId": "d1"});
    check("axp/dispatch.params", &p);
    let out = ax.h.send(
        M,
        &json!({"jsonrpc":"2.0","id":5,"method":"_axp/dispatch","params":p}),
    );
    let echo = out
        .iter()
        .find(|(c, v)| *c == O && v["params"]["action"]["type"] == "chat/turnStarted")
        .expect("echo");
    assert!(echo.1["params"].get("origin").is_none());
    let seq = ax.h.host.server_seq();
    assert_eq!(ax.ok(M, "_axp/dispatch", p.clone()), Value::Null);
    assert_eq!(ax.h.host.server_seq(), seq, "retry");
    assert_eq!(
        ax.code(
            C,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": turn("t2", "x")})
        ),
        -32009
    );
    assert_eq!(
        ax.code(
            O,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": turn("t2", "x")})
        ),
        -32009
    );
    assert_eq!(
        ax.code(
            M,
            "_axp/dispatch",
            json!({"channel": X, "action": turn("t2", "x")})
        ),
        -32602
    );
    assert_eq!(
        ax.code(
            M,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": turn("t2", "x")})
        ),
        -32004
    );
    assert_eq!(
        ax.code(M, "_axp/dispatch", json!({"channel": CHAT})),
        -32602
    );
    assert_eq!(
        ax.code(
            M,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": {"type":"session/titleChanged","title":"x"}})
        ),
        -32009
    );
    // Steering cancels the running turn and starts the steering message.
    let steer = json!({"type":"chat/pendingMessageSet","kind":"steering","id":"s","message":{"text":"steer","origin":{"kind":"user"}}});
    ax.ok(
        M,
        "_axp/dispatch",
        json!({"channel": CHAT, "action": steer}),
    );
    let chat = ax.chat();
    assert_eq!(chat["turns"][0]["state"], "cancelled");
    assert_eq!(chat["activeTurn"]["message"]["text"], "steer");
}

#[test]
fn the_pending_queue_is_bounded() {
    let mut ax = Ax::new();
    ax.prompt("t1");
    for i in 0..32 {
        let q = json!({"type":"chat/pendingMessageSet","kind":"queued","id":format!("q{i}"),"message":{"text":"x","origin":{"kind":"user"}}});
        ax.ok(M, "_axp/dispatch", json!({"channel": CHAT, "action": q}));
    }
    let q = json!({"type":"chat/pendingMessageSet","kind":"queued","id":"q99","message":{"text":"x","origin":{"kind":"user"}}});
    assert_eq!(
        ax.code(M, "_axp/dispatch", json!({"channel": CHAT, "action": q})),
        -32043
    );
}

#[test]
fn close_cancels_work_frees_the_task_and_keeps_history() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    ax.prompt("t1");
    ax.reserve(epoch, "t1", 99);
    let q = json!({"type":"chat/pendingMessageSet","kind":"queued","id":"q1","message":{"text":"later","origin":{"kind":"user"}}});
    ax.ok(M, "_axp/dispatch", json!({"channel": CHAT, "action": q}));
    let r = ax.raw(
        M,
        "createSession",
        json!({"channel":"ahp-session:/s2","config":{"task":"ahp-session:/s1"}}),
    );
    assert_eq!(r["error"]["code"], -32011, "the task is taken");
    assert_eq!(ax.code(C, "_axp/close", json!({"channel": X})), -32009);
    assert_eq!(ax.ok(M, "_axp/close", json!({"channel": X})), Value::Null);
    let x = ax.exchange();
    assert_eq!(x["status"], "closed");
    assert_eq!(x["lease"], Value::Null);
    assert_eq!(x["epoch"], epoch);
    assert_eq!(x["grants"]["g"]["spent"]["tokens"], 99);
    let chat = ax.chat();
    assert_eq!(chat["turns"].as_array().map(Vec::len), Some(1));
    assert!(chat.get("activeTurn").is_none());
    assert!(chat
        .get("queuedMessages")
        .is_none_or(|q| q.as_array().is_some_and(Vec::is_empty)));
    // Archived: AHP 0.9.0's session state has no field for it, so the event is what shows it.
    let e = ax.ok(O, "_axp/export", json!({"channel": X}));
    assert!(e["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .any(|a| a["action"] == json!({"type": "session/isArchivedChanged", "isArchived": true})));
    // Closed again: nothing changes. Closed sessions take no prompts and no claims.
    let seq = ax.h.host.server_seq();
    assert_eq!(ax.ok(M, "_axp/close", json!({"channel": X})), Value::Null);
    assert_eq!(ax.h.host.server_seq(), seq);
    assert_eq!(
        ax.code(
            M,
            "_axp/dispatch",
            json!({"channel": CHAT, "action": turn("t2", "x")})
        ),
        -32602
    );
    let r = ax.raw(
        M,
        "dispatchAction",
        json!({"channel": CHAT, "clientSeq": 1, "action": turn("t2", "x")}),
    );
    assert_eq!(r["error"]["code"], -32602);
    assert_eq!(ax.claim(C, "e1", "g")["error"]["code"], -32011);
    let r = ax.raw(
        M,
        "createSession",
        json!({"channel":"ahp-session:/s2","config":{"task":"ahp-session:/s1"}}),
    );
    assert_eq!(r["result"], Value::Null, "the task is free: {r}");
    // Restart: still closed.
    let store = ax.h.host.into_store();
    let h = Harness::with(HostConfig::default(), store);
    assert_eq!(h.host.channel_state(X).expect("x")["status"], "closed");
}

#[test]
fn comments_are_attributed_bounded_and_tied_to_the_checkpoint() {
    let mut ax = Ax::limits(Limits::default());
    ax.ok(O, "subscribe", json!({"channel": X}));
    assert!(
        ax.exchange().get("discussion").is_none(),
        "absent until the first comment"
    );
    let p = json!({"channel": X, "operationId": "c-1", "body": "  Looks good  ", "checkpoint": null, "path": null});
    check("axp/comment.params", &p);
    let c = ax.ok(V, "_axp/comment", p);
    check("axp/comment.result", &c);
    assert_eq!(c["id"], "c-1");
    assert_eq!(c["author"], "ver");
    assert_eq!(c["body"], "Looks good");
    assert_eq!(ax.exchange()["discussion"][0], c);
    let sha = "a".repeat(40);
    let comment = |checkpoint: Value, path: Value| json!({"channel": X, "body": "x", "checkpoint": checkpoint, "path": path});
    assert_eq!(
        ax.code(O, "_axp/comment", comment(Value::Null, Value::Null)),
        -32009
    );
    assert_eq!(
        ax.code(C, "_axp/comment", comment(json!(sha), Value::Null)),
        -32011
    );
    assert_eq!(
        ax.code(C, "_axp/comment", comment(Value::Null, json!("a.rs"))),
        -32602
    );
    assert_eq!(
        ax.code(C, "_axp/comment", json!({"channel": X, "body": "x"})),
        -32602
    );
    for _ in 1..256 {
        ax.ok(C, "_axp/comment", comment(Value::Null, Value::Null));
    }
    assert_eq!(
        ax.code(M, "_axp/comment", comment(Value::Null, Value::Null)),
        -32043
    );
    check("axp/exchange.state", &ax.exchange());
}

#[test]
fn list_sessions_counts_the_newest_comment_as_a_modification() {
    let mut ax = Ax::new();
    ax.advance(1_000);
    ax.h.create(M, "s2");
    let listed = |ax: &mut Ax| {
        let r = ax.ok(M, "listSessions", json!({"channel": "ahp-root://"}));
        let items = r["items"].as_array().cloned().unwrap_or_default();
        items
            .iter()
            .map(|i| {
                (
                    i["resource"].as_str().unwrap_or("").to_owned(),
                    i["modifiedAt"].clone(),
                )
            })
            .collect::<Vec<_>>()
    };
    let before = listed(&mut ax);
    assert_eq!(before[0].0, "ahp-session:/s2", "newest first: {before:?}");
    ax.advance(5_000);
    let c = ax.ok(
        C,
        "_axp/comment",
        json!({"channel": X, "body": "later", "checkpoint": null, "path": null}),
    );
    let at = c["createdAt"].as_u64().expect("createdAt");
    let after = listed(&mut ax);
    assert_eq!(
        after[0].0, "ahp-session:/s1",
        "the commented session first: {after:?}"
    );
    assert_eq!(after[0].1, json!(crate::kernel::time::iso8601(at)));
    assert_eq!(after[1], before[0], "the other session is as it was");
    // Root summaries follow the chat only, as the reference's do.
    assert_ne!(
        ax.h.host.channel_state("ahp-session:/s1").expect("session")["chats"][0]["modifiedAt"],
        after[0].1
    );
}

pub(super) fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[test]
fn blobs_are_content_addressed_shared_once_and_read_per_session() {
    let mut ax = Ax::new();
    ax.h.create(M, "s2");
    let put = |channel: &str, data: &str| json!({"channel": channel, "data": data, "mediaType": "text/plain"});
    let data = b64(b"private output");
    check(
        "axp/blob-put.params",
        &json!({"channel": X, "operationId": "o", "data": data, "mediaType": "text/plain"}),
    );
    let r = ax.ok(C, "_axp/blobPut", put(X, &data));
    check("axp/blob-put.result", &r);
    let digest = r["sha256"].as_str().expect("digest").to_owned();
    assert_eq!(r["uri"], format!("axp-blob:/axp-session%3A%2Fs1/{digest}"));
    assert_eq!(r["size"], 14);
    let got = ax.ok(O, "_axp/blobGet", json!({"channel": X, "digest": digest}));
    check("axp/blob-get.result", &got);
    assert_eq!(got["data"], data);
    let read = ax.ok(
        O,
        "resourceRead",
        json!({"channel": "ahp-root://", "uri": r["uri"]}),
    );
    assert_eq!(
        read,
        json!({"data": data, "contentType": "text/plain", "encoding": "base64"})
    );
    // Knowing the digest grants nothing in another session.
    assert_eq!(
        ax.code(
            O,
            "_axp/blobGet",
            json!({"channel": "ahp-session:/s2", "digest": digest})
        ),
        -32008
    );
    let used = ax.h.host.axp_inspect().blob_storage_bytes;
    // The same bytes in another session: stored once, readable there too.
    ax.ok(B, "_axp/blobPut", put("axp-session:/s2", &data));
    assert_eq!(ax.h.host.store().records_of(Table::Blob).count(), 1);
    assert_eq!(ax.h.host.store().records_of(Table::BlobAccess).count(), 2);
    assert_eq!(
        ax.h.host.axp_inspect().blob_storage_bytes,
        used + crate::limits::BLOB_ENTRY_OVERHEAD_BYTES
    );
    ax.ok(
        O,
        "_axp/blobGet",
        json!({"channel": "axp-session:/s2", "digest": digest}),
    );
    assert_eq!(ax.code(O, "_axp/blobPut", put(X, "")), -32009);
    assert_eq!(ax.code(C, "_axp/blobPut", put(X, "not base64!")), -32602);
    assert_eq!(ax.code(C, "_axp/blobPut", put(X, "YQ")), -32602, "unpadded");
    assert_eq!(
        ax.code(C, "_axp/blobPut", put(X, "YR==")),
        -32602,
        "trailing bits"
    );
    // Empty content is a blob too.
    let empty = ax.ok(V, "_axp/blobPut", put(X, ""));
    assert_eq!(empty["size"], 0);
    // resourceRead: only blob URIs, within scope.
    assert_eq!(
        ax.code(
            O,
            "resourceRead",
            json!({"channel": "ahp-root://", "uri": "file:///x"})
        ),
        -32009
    );
    let mut h = ax.h;
    h.init(
        9,
        Principal {
            id: "scoped".into(),
            role: Role::Observer,
            sessions: SessionScope::Only(["s2".to_string()].into()),
        },
        "c9",
        &[],
    );
    let r2 = h.request(
        9,
        50,
        "resourceRead",
        json!({"channel": "ahp-root://", "uri": r["uri"]}),
    );
    assert_eq!(r2["error"]["code"], -32009);
    // After a restart the bytes stay in the store, are not loaded, and still read.
    let store = h.host.into_store();
    let mut loaded = store.clone();
    let l = crate::Store::load(&mut loaded, 10).expect("load");
    assert!(l.records.iter().all(|r| r.table != Table::Blob));
    let mut h = Harness::with(HostConfig::default(), store);
    h.init(1, observer("o"), "c", &[]);
    let got = h.request(
        1,
        2,
        "_axp/blobGet",
        json!({"channel": X, "digest": digest}),
    );
    assert_eq!(got["result"]["data"], data);
}

#[test]
fn blob_size_and_storage_are_bounded() {
    let mut ax = Ax::limits(Limits {
        blob_bytes_max: 10,
        blob_storage_bytes_max: 10 + 3 * crate::limits::BLOB_ENTRY_OVERHEAD_BYTES,
        ..Limits::default()
    });
    let put = |data: &[u8]| json!({"channel": X, "data": b64(data), "mediaType": "x"});
    assert_eq!(ax.code(C, "_axp/blobPut", put(&[1; 11])), -32043);
    ax.ok(C, "_axp/blobPut", put(&[1; 10]));
    assert_eq!(ax.code(C, "_axp/blobPut", put(&[2; 1])), -32043, "quota");
    // Only the part over the 64 KiB command limit may be large, and only for blobPut.
    let limits = Limits::default();
    assert!(limits.message_bytes_max_for(Some("_axp/blobPut")) > 21_000_000);
}

#[test]
fn a_large_upload_passes_the_command_limit_and_other_large_commands_do_not() {
    let mut ax = Ax::new();
    let data = b64(&vec![7u8; 100_000]);
    let r = ax.ok(
        C,
        "_axp/blobPut",
        json!({"channel": X, "data": data, "mediaType": "application/octet-stream"}),
    );
    assert_eq!(r["size"], 100_000);
    let body = "x".repeat(70_000);
    let r = ax.raw(
        C,
        "_axp/comment",
        json!({"channel": X, "body": body, "checkpoint": null, "path": null}),
    );
    assert_eq!(r["error"]["code"], -32043);
}

#[test]
fn receipts_answer_retries_refuse_changed_input_and_store_nothing_for_refusals() {
    let mut ax = Ax::new();
    let grant = json!({"channel": X, "grantId": "g", "limit": allowance(5, 5, 1), "enforcement": "accounting", "operationId": "g-1"});
    let first = ax.ok(C, "_axp/grant", grant.clone());
    let seq = ax.h.host.server_seq();
    let commits = ax.h.host.store().commits();
    assert_eq!(ax.ok(C, "_axp/grant", grant.clone()), first);
    assert_eq!(ax.h.host.server_seq(), seq);
    assert_eq!(ax.h.host.store().commits(), commits, "nothing written");
    let mut changed = grant.clone();
    changed["limit"]["tokens"] = json!(6);
    assert_eq!(ax.code(C, "_axp/grant", changed), -32011);
    // Receipts are per principal: Bob may use the same id for his own grant.
    let mut bobs = grant;
    bobs["grantId"] = json!("gb");
    ax.ok(B, "_axp/grant", bobs);
    // A refused command stores nothing: fixed, the same operationId goes through.
    let claim = json!({"channel": X, "executorId": "e1", "grantId": "missing", "leaseMs": 30000, "operationId": "c-1"});
    assert_eq!(ax.code(C, "_axp/claim", claim.clone()), -32009);
    assert!(ax.h.host.store().stored_receipt("alice", "c-1").is_none());
    let mut fixed = claim;
    fixed["grantId"] = json!("g");
    let lease = ax.ok(C, "_axp/claim", fixed.clone());
    // A retried claim returns the old lease but grants nothing new.
    ax.ok(C, "_axp/release", json!({"channel": X, "epoch": 1}));
    assert_eq!(ax.ok(C, "_axp/claim", fixed), lease);
    assert_eq!(ax.exchange()["lease"], Value::Null);
}

#[test]
fn a_retry_while_the_original_is_in_flight_waits_for_it() {
    let mut ax = Ax::new();
    ax.h.hold_commits(true);
    let grant = json!({"jsonrpc":"2.0","id":9,"method":"_axp/grant","params":{"channel": X, "grantId": "g", "limit": allowance(5, 5, 1), "enforcement": "accounting", "operationId": "g-1"}});
    assert!(ax.h.send(C, &grant).is_empty());
    assert!(ax.h.send(C, &grant).is_empty(), "the retry waits too");
    let out = ax.h.complete(1);
    let answers: Vec<&Value> = out
        .iter()
        .filter(|(c, v)| *c == C && v["id"] == 9)
        .map(|(_, v)| v)
        .collect();
    assert_eq!(answers.len(), 2);
    assert_eq!(answers[0]["result"], answers[1]["result"]);
    // Failed: the retry is told too, and a new attempt applies.
    let grant2 = json!({"jsonrpc":"2.0","id":10,"method":"_axp/grant","params":{"channel": X, "grantId": "g2", "limit": allowance(5, 5, 1), "enforcement": "accounting", "operationId": "g-2"}});
    ax.h.send(C, &grant2);
    ax.h.send(C, &grant2);
    let mut out = ax.h.fail_first();
    // The failure's answers wait for the reservation that covers the numbers it handed out.
    out.extend(ax.h.complete(1));
    let codes: Vec<i64> = out
        .iter()
        .filter(|(c, v)| *c == C && v["id"] == 10)
        .filter_map(|(_, v)| v["error"]["code"].as_i64())
        .collect();
    assert_eq!(codes, [-32603, -32603], "{out:?}");
    assert!(ax.exchange()["grants"].get("g2").is_none());
    ax.h.hold_commits(false);
    let out = ax.h.send(C, &grant2);
    assert!(out
        .iter()
        .any(|(_, v)| v["id"] == 10 && v["result"]["id"] == "g2"));
}

#[test]
fn a_failed_commit_leaves_no_trace_in_sessions_registry_or_blobs() {
    let mut ax = Ax::new();
    let epoch = ax.dock();
    let before = ax.h.host.axp_inspect();
    let reg = json!({"channel": X, "executorId": "e7", "name": "n", "placement": "hosted", "capabilities": [], "ttlMs": 3000});
    ax.h.host.store_mut().fail_next_commits(1);
    assert_eq!(ax.code(C, "_axp/register", reg.clone()), -32603);
    ax.h.host.store_mut().fail_next_commits(1);
    assert_eq!(
        ax.code(C, "_axp/renew", json!({"channel": X, "epoch": epoch})),
        -32603
    );
    ax.h.host.store_mut().fail_next_commits(1);
    assert_eq!(
        ax.code(
            C,
            "_axp/blobPut",
            json!({"channel": X, "data": b64(b"x"), "mediaType": "t"})
        ),
        -32603
    );
    ax.h.host.store_mut().fail_next_commits(1);
    assert_eq!(
        ax.code(C, "_axp/release", json!({"channel": X, "epoch": epoch})),
        -32603
    );
    assert_eq!(ax.h.host.axp_inspect(), before);
    // The retries, with their operationIds, apply now.
    ax.ok(C, "_axp/register", reg);
    ax.ok(C, "_axp/release", json!({"channel": X, "epoch": epoch}));
    assert_eq!(ax.exchange()["status"], "orphaned");
}

#[test]
fn a_restart_orphans_every_lease_keeps_epochs_and_takes_executors_offline() {
    let mut ax = Ax::new();
    ax.ok(
        C,
        "_axp/register",
        json!({"channel": X, "executorId": "e1", "name": "n", "placement": "satellite", "capabilities": [], "ttlMs": 300000}),
    );
    let epoch = ax.dock();
    ax.prompt("t1");
    let reserve = json!({"channel": X, "epoch": epoch, "turnId": "t1", "ceiling": allowance(1234, 4321, 1), "operationId": "reserve-durable"});
    ax.ok(C, "_axp/reserve", reserve.clone());
    let seq = ax.h.host.server_seq();
    let store = ax.h.host.into_store();
    let mut ax2 = Ax::bare(HostConfig::default(), store);
    let x = ax2.exchange();
    assert_eq!(x["status"], "orphaned");
    assert_eq!(x["lease"], Value::Null);
    assert_eq!(x["epoch"], epoch);
    assert_eq!(x["grants"]["g"]["spent"], allowance(1234, 4321, 1));
    assert_eq!(ax2.chat()["turns"][0]["state"], "error");
    assert!(ax2.h.host.server_seq() > seq);
    assert_eq!(
        ax2.h.host.axp_inspect().executors["entries"]["e1"]["online"],
        false
    );
    // The receipt survived: the retry does not reserve again; changed input conflicts.
    ax2.ok(C, "_axp/reserve", reserve.clone());
    assert_eq!(ax2.exchange()["reservation"], Value::Null);
    let mut changed = reserve;
    changed["ceiling"]["tokens"] = json!(1);
    assert_eq!(ax2.code(C, "_axp/reserve", changed), -32011);
    assert_eq!(
        ax2.code(C, "_axp/renew", json!({"channel": X, "epoch": epoch})),
        -32040
    );
    // The same executor resumes into the next epoch.
    let resume = json!({"channel": X, "executorId": "e1", "grantId": "g", "leaseMs": 30000, "resumeEpoch": epoch});
    assert_eq!(ax2.ok(C, "_axp/claim", resume)["epoch"], epoch + 1);
    // A restart with nothing to end issues nothing.
    ax2.ok(C, "_axp/release", json!({"channel": X, "epoch": epoch + 1}));
    let store = ax2.h.host.into_store();
    let commits = store.commits();
    let mut h = Harness::with(HostConfig::default(), store);
    h.drain();
    assert_eq!(h.host.store().commits(), commits);
}

#[test]
fn a_refused_dispatch_request_gets_an_error_and_no_echo() {
    let mut ax = Ax::new();
    ax.ok(M, "subscribe", json!({"channel": CHAT}));
    for channel in [CHAT, "ahp-chat:/nope", X] {
        let out = ax.h.send(
            C,
            &json!({"jsonrpc":"2.0","id":3,"method":"dispatchAction","params":{"channel":channel,"clientSeq":1,"action":turn("t","x")}}),
        );
        assert_eq!(out.len(), 1, "{out:?}");
        assert!(out[0].1["error"]["code"].is_i64());
    }
}

/// Applies every action of an export to its seeds: the result must be its snapshots.
pub(super) fn rebuilds(export: &Value) {
    use ahp::reducers::{apply_action_to_changeset, apply_action_to_chat, apply_action_to_session};
    let seeds = export["seeds"].as_array().expect("seeds");
    let snapshots = export["snapshots"].as_array().expect("snapshots");
    let mut exchange: crate::axp::state::ExchangeState =
        serde_json::from_value(seeds[0]["state"].clone()).expect("exchange seed");
    let mut session: ahp_types::state::SessionState =
        serde_json::from_value(seeds[1]["state"].clone()).expect("session seed");
    let mut chat: ahp_types::state::ChatState =
        serde_json::from_value(seeds[2]["state"].clone()).expect("chat seed");
    let mut changeset: ahp_types::state::ChangesetState =
        serde_json::from_value(seeds[3]["state"].clone()).expect("changeset seed");
    let mut last = 0;
    for envelope in export["actions"].as_array().expect("actions") {
        let seq = envelope["serverSeq"].as_u64().expect("seq");
        assert!(seq > last, "actions in serverSeq order");
        last = seq;
        let channel = envelope["channel"].as_str().expect("channel");
        if channel.starts_with("axp-session:/") {
            let a: crate::axp::reducer::AxpAction =
                serde_json::from_value(envelope["action"].clone()).expect("axp action");
            crate::axp::reducer::reduce_exchange(&mut exchange, &a);
            continue;
        }
        let a: ahp_types::actions::StateAction =
            serde_json::from_value(envelope["action"].clone()).expect("ahp action");
        match channel {
            c if c.starts_with("ahp-session:/") => {
                apply_action_to_session(&mut session, &a);
            }
            c if c.starts_with("ahp-chat:/") => {
                apply_action_to_chat(&mut chat, &a);
            }
            _ => {
                apply_action_to_changeset(&mut changeset, &a);
            }
        }
    }
    let rebuilt = [
        serde_json::to_value(&exchange),
        serde_json::to_value(&session),
        serde_json::to_value(&chat),
        serde_json::to_value(&changeset),
    ];
    for (i, r) in rebuilt.into_iter().enumerate() {
        assert_eq!(
            r.expect("json"),
            snapshots[i]["state"],
            "{} does not rebuild",
            snapshots[i]["resource"]
        );
    }
}

#[test]
fn an_export_rebuilds_the_current_state_after_every_kind_of_action() {
    let mut ax = Ax::new();
    let export = |ax: &mut Ax| {
        let e = ax.ok(O, "_axp/export", json!({"channel": X}));
        check("axp/export.result", &e);
        rebuilds(&e);
        e
    };
    let e = export(&mut ax);
    assert_eq!(e["actions"], json!([]));
    assert_eq!(e["seeds"][0]["state"], e["snapshots"][0]["state"]);
    let epoch = ax.dock(); // grantChanged, leaseChanged
    export(&mut ax);
    ax.prompt("t1");
    ax.reserve(epoch, "t1", 100); // reserved
    ax.emit(epoch, json!([markdown("t1", "p"), delta("t1", "p", "hi")]));
    ax.ok(C, "_axp/settle", json!({"channel": X, "epoch": epoch, "turnId": "t1", "usage": usage(10, 5, 0, 1), "outcome": "complete"})); // settled
    ax.ok(
        C,
        "_axp/comment",
        json!({"channel": X, "body": "nice", "checkpoint": null, "path": null}),
    ); // commentAdded
    ax.ok(C, "_axp/renew", json!({"channel": X, "epoch": epoch}));
    ax.ok(C, "_axp/revoke", json!({"channel": X, "grantId": "g"}));
    export(&mut ax);
    ax.ok(M, "_axp/close", json!({"channel": X}));
    let e = export(&mut ax);
    let kinds: std::collections::BTreeSet<&str> = e["actions"]
        .as_array()
        .expect("actions")
        .iter()
        .filter_map(|a| a["action"]["type"].as_str())
        .filter(|t| t.starts_with("_axp/"))
        .collect();
    for t in [
        "_axp/leaseChanged",
        "_axp/grantChanged",
        "_axp/reserved",
        "_axp/settled",
        "_axp/commentAdded",
    ] {
        assert!(kinds.contains(t), "{t} exercised");
    }
    for a in e["actions"].as_array().expect("actions") {
        let t = a["action"]["type"].as_str().unwrap_or_default();
        let name = match t {
            "_axp/leaseChanged" => "axp/lease-changed.action",
            "_axp/grantChanged" => "axp/grant-changed.action",
            "_axp/reserved" => "axp/reserved.action",
            "_axp/settled" => "axp/settled.action",
            "_axp/commentAdded" => "axp/comment-added.action",
            _ => continue,
        };
        check(name, &a["action"]);
    }
    // Out of scope: refused.
    let mut h = ax.h;
    h.init(
        9,
        Principal {
            id: "scoped".into(),
            role: Role::Contributor,
            sessions: SessionScope::Only(["other".to_string()].into()),
        },
        "c9",
        &[],
    );
    let r = h.request(9, 5, "_axp/export", json!({"channel": X}));
    assert_eq!(r["error"]["code"], -32009);
}

#[test]
fn every_axp_action_type_reduces_seed_plus_actions_to_the_same_state() {
    // Every type is applied by the same reducer a load and a client use: the fold of any log
    // from the seed equals applying it one by one, through the wire form too.
    use crate::axp::reducer::{reduce_exchange, AxpAction};
    use crate::axp::state::{Context, ExchangeState};
    let seed = ExchangeState::initial("s1", "r", "t");
    let actions: Vec<AxpAction> = [
        json!({"type":"_axp/grantChanged","grant":{"id":"g","owner":"a","limit":allowance(9,9,9),"spent":allowance(0,0,0),"revoked":false,"enforcement":"provider"}}),
        json!({"type":"_axp/leaseChanged","lease":{"owner":"a","executorId":"e","epoch":1,"expiresAt":5,"heartbeatMs":1000,"grantId":"g"},"epoch":1,"status":"open"}),
        json!({"type":"_axp/reserved","reservation":{"turnId":"t","grantId":"g","epoch":1,"ceiling":allowance(1,1,1),"startedAt":3}}),
        json!({"type":"_axp/settled","turnId":"t","grant":{"id":"g","owner":"a","limit":allowance(9,9,9),"spent":allowance(1,1,1),"revoked":false,"enforcement":"provider"},"usage":usage(1,0,0,1)}),
        json!({"type":"_axp/commentAdded","comment":{"id":"c","author":"a","body":"b","createdAt":1,"checkpoint":null,"path":null}}),
        json!({"type":"_axp/checkpointChanged","checkpoint":checkpoint_json("a", 7)}),
        json!({"type":"_axp/compactionProposed","proposal":{"id":"p","author":"a","expectedRevision":0,"context":serde_json::to_value(Context::initial()).expect("ctx"),"evidence":{"fromSeq":0,"toSeq":3}}}),
        json!({"type":"_axp/contextChanged","context":serde_json::to_value(Context::initial()).expect("ctx")}),
        json!({"type":"_axp/reviewChanged","review":super::axp_review::review_json()}),
        json!({"type":"_axp/verificationChanged","verification":super::axp_review::verification_json()}),
        json!({"type":"_axp/executorChanged","executor":{"id":"e","owner":"a","name":"n","placement":"hosted","capabilities":[],"expiresAt":1,"online":true}}),
        json!({"type":"_axp/memoryChanged","memory":{"scope":"r","title":"t","trigger":"g","lesson":"l","outcome":"success","id":"i","revision":1,"evidence":[],"status":"proposed","author":"a"}}),
        json!({"type":"_axp/leaseChanged","lease":null,"epoch":1,"status":"orphaned"}),
        json!({"type":"_axp/unknown","x":1}),
    ]
    .into_iter()
    .map(|v| serde_json::from_value(v).expect("action"))
    .collect();
    let types: std::collections::BTreeSet<String> = actions
        .iter()
        .map(|a| {
            serde_json::to_value(a).expect("json")["type"]
                .as_str()
                .unwrap_or("")
                .to_owned()
        })
        .collect();
    for t in AxpAction::TYPES {
        assert!(types.contains(t), "{t} covered");
    }
    for n in 0..=actions.len() {
        let mut folded = seed.clone();
        for a in &actions[..n] {
            reduce_exchange(&mut folded, a);
        }
        // Through the wire form: what a client replays from the export.
        let mut replayed = seed.clone();
        for a in &actions[..n] {
            let text = serde_json::to_string(a).expect("json");
            let back: AxpAction = serde_json::from_str(&text).expect("back");
            reduce_exchange(&mut replayed, &back);
        }
        assert_eq!(folded, replayed);
    }
}

/// `Ax` with at most one change in flight, docked (lease of 30 s on `e1`, registered with a
/// TTL of 3 s), whose disk then holds every change until told.
fn docked_on_a_narrow_path() -> (Ax, u64) {
    let mut ax = Ax::limits(Limits {
        in_flight_changes_max: 1,
        ..Limits::default()
    });
    ax.ok(
        C,
        "_axp/register",
        json!({"channel": X, "executorId": "e1", "name": "n", "placement": "satellite", "capabilities": [], "ttlMs": 3000}),
    );
    let epoch = ax.dock();
    ax.h.hold_commits(true);
    (ax, epoch)
}

/// A request from `conn` handed to the host; what it answered at once.
fn feed_request(ax: &mut Ax, conn: u64, id: u64, method: &str, params: Value) -> Vec<(u64, Value)> {
    ax.h.send(
        conn,
        &json!({"jsonrpc":"2.0","id":id,"method":method,"params":params}),
    )
}

#[test]
fn a_renew_held_by_a_full_write_path_keeps_its_lease_alive() {
    let (mut ax, epoch) = docked_on_a_narrow_path();
    ax.advance(15_000);
    // (The executor's registration ran out meanwhile: its going offline is made durable.)
    ax.h.complete(usize::MAX);
    // The maintainer's comment fills the path; the executor's heartbeat arrives behind it.
    let comment = json!({"channel": X, "body": "hold on", "checkpoint": null, "path": null, "operationId": "k1"});
    assert!(feed_request(&mut ax, M, 900, "_axp/comment", comment).is_empty());
    assert!(!ax.h.host.accepting_input());
    let renew = json!({"channel": X, "epoch": epoch, "operationId": "r1"});
    assert!(feed_request(&mut ax, C, 901, "_axp/renew", renew).is_empty());
    assert_eq!(ax.h.host.held_messages().0, 1, "held, not refused");
    // The disk takes 10 s; the lease had 15 s left.
    ax.advance(10_000);
    let mut out = ax.h.complete(1);
    assert_eq!(ax.h.host.held_messages().0, 0, "the renew was issued");
    out.extend(ax.h.complete(1));
    let answer = out
        .iter()
        .find(|(c, v)| *c == C && v["id"] == 901)
        .map(|(_, v)| v.clone())
        .expect("the renew is answered");
    assert!(answer.get("error").is_none(), "{answer}");
    let expires = answer["result"]["expiresAt"].as_u64().expect("expiresAt");
    assert!(
        expires >= ax.h.now + 29_000,
        "renewed from when it was handled"
    );
    // Past the old deadline the lease is still the executor's.
    ax.advance(10_000);
    assert_eq!(ax.exchange()["status"], "open");
    assert_eq!(ax.exchange()["lease"]["epoch"], epoch);
    assert!(error_codes_in(&out).is_empty(), "{out:?}");
}

#[test]
fn lease_expiry_and_executor_ttl_wait_for_room_and_then_happen() {
    let (mut ax, epoch) = docked_on_a_narrow_path();
    ax.ok(O, "subscribe", json!({"channel": X}));
    let comment = json!({"channel": X, "body": "hold on", "checkpoint": null, "path": null, "operationId": "k1"});
    let out = feed_request(&mut ax, M, 900, "_axp/comment", comment);
    assert!(out.is_empty(), "{out:?}");
    // Both deadlines pass while the path is full: neither change can be issued yet.
    ax.advance(31_000);
    assert_eq!(ax.h.host.changes_in_flight(), 1);
    assert_eq!(ax.exchange()["status"], "open");
    assert!(
        ax.h.host.poll_timeout().is_some(),
        "the timers are armed again"
    );
    // Room: the comment is durable; the timers retry and each takes its turn on the path.
    ax.h.complete(1);
    let mut events = Vec::new();
    for _ in 0..10 {
        events.extend(ax.advance(200));
        events.extend(ax.h.complete(1));
    }
    assert_eq!(ax.exchange()["status"], "orphaned");
    assert_eq!(
        ax.h.host.axp_inspect().executors["entries"]["e1"]["online"],
        false
    );
    assert!(events
        .iter()
        .any(|(c, v)| *c == O && v["params"]["action"]["type"] == "_axp/leaseChanged"));
    assert_eq!(
        ax.code(C, "_axp/renew", json!({"channel": X, "epoch": epoch})),
        -32040
    );
}

fn error_codes_in(out: &[(u64, Value)]) -> Vec<i64> {
    out.iter()
        .filter_map(|(_, v)| v.pointer("/error/code").and_then(Value::as_i64))
        .collect()
}

/// A checkpoint as the wire spells it, naming blobs by `digest_char` repeated.
pub(super) fn checkpoint_json(head_char: &str, created_at: u64) -> Value {
    let blob = |c: &str| json!({"uri": format!("axp-blob:/x/{}", c.repeat(64)), "sha256": c.repeat(64), "size": 1, "mediaType": "application/octet-stream"});
    json!({
        "baseCommit": "0".repeat(40), "headCommit": head_char.repeat(40), "branch": "main",
        "bundle": blob("b"), "patch": blob("c"), "createdAt": created_at,
    })
}
