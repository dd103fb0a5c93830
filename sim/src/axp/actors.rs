//! The AXP simulator's roles: executors, maintainers and observers, each one principal with at
//! most one connection at a time.
//!
//! - An **executor** (a contributor's agent, as the reference satellite runs one) registers,
//!   grants itself a budget on a session, claims the session's lease (with `resumeEpoch`
//!   after it lost one), renews on its heartbeat (sometimes late, so leases expire), reserves
//!   the maintainers' turns, streams output, and settles with reported usage, an overspend or
//!   nothing. Now and then it releases, revokes its own grant, or sends a fenced command with
//!   a stale epoch. Every mutation whose answer a cut connection swallowed is sent again,
//!   byte for byte (same `operationId`), as the first thing on the next connection; some are
//!   sent twice on purpose.
//! - A **maintainer** creates sessions, starts turns (`dispatchAction` and `_axp/dispatch`),
//!   steers and queues messages, cancels turns, comments and, rarely, closes a session.
//! - An **observer** mirrors `axp-executors://` and every session's exchange with the
//!   reducer in [`crate::axp::replica`], and tries commands its role may not run.
//!
//! Requests whose params are deliberately invalid carry a string id, so the oracle can tell
//! them from well-formed ones (which must never be refused as invalid).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use axhost_core::{ConnId, Principal};
use rand::Rng;
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::axp::replica::{Mirror, EXECUTORS};

/// What a role is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Runs an executor.
    Executor,
    /// Drives chats.
    Maintainer,
    /// Watches.
    Observer,
}

/// A request sent and not yet answered.
#[derive(Clone, Debug)]
struct Sent {
    method: String,
    params: Value,
}

/// What an executor believes it holds.
#[derive(Clone, Debug)]
struct Held {
    session: String,
    epoch: u64,
    heartbeat_ms: u64,
    renew_at_ms: u64,
}

/// The turn an executor works on.
#[derive(Clone, Debug)]
struct Work {
    turn: String,
    reserved: bool,
    /// Output batches still to send before settling.
    emits_left: u32,
    parts: u32,
    ceiling: u64,
}

/// What the world tells every actor: the turns maintainers started, by session.
#[derive(Clone, Debug, Default)]
pub struct Board {
    /// Turn ids whose start was acknowledged, oldest first, by session.
    pub turns: BTreeMap<String, Vec<String>>,
    /// Sessions whose creation was acknowledged.
    pub sessions: BTreeSet<String>,
}

/// Draws an actor's behaviour.
#[derive(Clone, Debug)]
pub struct Temper {
    /// In how many heartbeats one renewal comes late (0: never).
    pub late_renewal_in: u32,
    /// In how many settlements one reports more than the grant allows (0: never).
    pub overspend_in: u32,
    /// Whether the actor may close sessions (maintainers).
    pub closes: bool,
}

/// One simulated AXP client. See the module docs.
pub struct Actor {
    /// Index in the world.
    pub index: usize,
    /// The role it plays.
    pub kind: Kind,
    /// Its credential.
    pub principal: Arc<Principal>,
    /// Its stable `clientId`.
    pub client_id: String,
    rng: ChaCha8Rng,
    temper: Temper,
    pool: Vec<String>,
    /// The connection, and whether its handshake was answered.
    pub conn: Option<(ConnId, bool)>,
    next_id: u64,
    pending: BTreeMap<u64, Sent>,
    /// Mutations whose answers were lost with a connection: sent again first.
    retry: VecDeque<Sent>,
    /// Frames to send.
    pub outbox: Vec<Vec<u8>>,
    ops: u64,
    /// The liveness phase: finish what is open, start nothing new.
    pub winding_down: bool,
    /// A stall (half-open connection, suspended process): nothing is done before this.
    pub stalled_until_ms: u64,
    // Executor.
    executor_id: String,
    registered_until_ms: u64,
    granted: BTreeSet<String>,
    target: String,
    held: Option<Held>,
    last_epoch: BTreeMap<String, u64>,
    work: Option<Work>,
    tried: BTreeSet<String>,
    // Maintainer.
    client_seq: u64,
    turns_started: u64,
    // Observer.
    /// Mirrored channels.
    pub mirrors: BTreeMap<String, Mirror>,
    last_seq: u64,
    /// Counters: requests sent, retries sent, deliberate duplicates.
    pub counts: (u64, u64, u64),
}

impl Actor {
    /// A new actor; `pool` is the session ids it works with.
    pub fn new(
        index: usize,
        kind: Kind,
        principal: Principal,
        rng: ChaCha8Rng,
        temper: Temper,
        pool: Vec<String>,
    ) -> Actor {
        let target = pool.first().cloned().unwrap_or_else(|| "a0".into());
        Actor {
            index,
            kind,
            principal: Arc::new(principal),
            client_id: format!("axp-client-{index}"),
            rng,
            temper,
            pool,
            conn: None,
            next_id: 1,
            pending: BTreeMap::new(),
            retry: VecDeque::new(),
            outbox: Vec::new(),
            ops: 0,
            winding_down: false,
            stalled_until_ms: 0,
            executor_id: format!("x{index}"),
            registered_until_ms: 0,
            granted: BTreeSet::new(),
            target,
            held: None,
            last_epoch: BTreeMap::new(),
            work: None,
            tried: BTreeSet::new(),
            client_seq: 0,
            turns_started: 0,
            mirrors: BTreeMap::new(),
            last_seq: 0,
            counts: (0, 0, 0),
        }
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.random_range(0..n.max(1))
    }

    fn chance(&mut self, n: u64, d: u64) -> bool {
        self.below(d) < n
    }

    fn pick(&mut self, items: &[String]) -> Option<String> {
        (!items.is_empty()).then(|| items[self.below(items.len() as u64) as usize].clone())
    }

    fn op(&mut self) -> String {
        self.ops += 1;
        format!("op-{}-{}", self.index, self.ops)
    }

    fn send(&mut self, method: &str, params: Value) {
        let id = self.next_id;
        self.next_id += 1;
        self.counts.0 += 1;
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.outbox.push(frame.to_string().into_bytes());
        self.pending.insert(
            id,
            Sent {
                method: method.to_owned(),
                params,
            },
        );
    }

    /// A mutation with a fresh `operationId`.
    fn mutate(&mut self, method: &str, mut params: Value) {
        params["operationId"] = json!(self.op());
        self.send(method, params);
    }

    /// A request meant to be refused as invalid (string id: the oracle knows).
    fn send_invalid(&mut self, method: &str, params: Value) {
        let id = format!("bad-{}", self.next_id);
        self.next_id += 1;
        let frame = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        self.outbox.push(frame.to_string().into_bytes());
    }

    /// Whether the actor waits for nothing.
    pub fn idle(&self) -> bool {
        self.pending.is_empty() && self.retry.is_empty() && self.outbox.is_empty()
    }

    /// Whether the actor still holds a lease or works on a turn.
    pub fn busy(&self) -> bool {
        self.held.is_some() || self.work.is_some()
    }

    /// A new connection is open: send the handshake.
    pub fn connected(&mut self, conn: ConnId) {
        self.conn = Some((conn, false));
        self.next_id = 1;
        self.handshake();
    }

    /// `initialize` (again, after a refusal: the clientId may still be bound to a connection
    /// whose close the host has not heard yet).
    fn handshake(&mut self) {
        let subs: Vec<String> = match self.kind {
            Kind::Observer => {
                let mut s = vec![EXECUTORS.to_owned()];
                s.extend(self.mirrors.keys().filter(|c| *c != EXECUTORS).cloned());
                s
            }
            _ => Vec::new(),
        };
        self.mirrors.clear();
        self.last_seq = 0;
        self.send(
            "initialize",
            json!({"channel": "ahp-root://", "protocolVersions": ["0.9.0"],
                   "clientId": self.client_id, "initialSubscriptions": subs}),
        );
    }

    /// The connection is gone (either side): answers in flight are lost; mutations among
    /// them are sent again on the next connection.
    pub fn disconnected(&mut self) {
        self.conn = None;
        self.outbox.clear();
        for (_, sent) in std::mem::take(&mut self.pending) {
            if sent.params.get("operationId").is_some() {
                self.retry.push_back(sent);
            }
        }
    }

    /// One turn of the actor at `now_ms`.
    pub fn act(&mut self, now_ms: u64, board: &Board) {
        if now_ms < self.stalled_until_ms {
            return;
        }
        match self.conn {
            Some((_, true)) => {}
            Some((_, false)) if self.pending.is_empty() => return self.handshake(),
            _ => return,
        }
        if let Some(sent) = self.retry.pop_front() {
            self.counts.1 += 1;
            return self.send(&sent.method, sent.params);
        }
        match self.kind {
            Kind::Executor => self.executor(now_ms, board),
            Kind::Maintainer => self.maintainer(board),
            Kind::Observer => self.observer(board),
        }
    }

    // ─── Executor ─────────────────────────────────────────────────────────────────────────

    fn exchange(&self, session: &str) -> String {
        format!("axp-session:/{session}")
    }

    fn fenced(&self, held: &Held) -> Value {
        json!({"channel": self.exchange(&held.session), "epoch": held.epoch})
    }

    fn executor(&mut self, now_ms: u64, board: &Board) {
        // The heartbeat goes out whatever else is in flight.
        if let Some(h) = self.held.clone() {
            if now_ms >= h.renew_at_ms {
                let late = self.temper.late_renewal_in > 0
                    && !self.winding_down
                    && self.chance(1, u64::from(self.temper.late_renewal_in));
                let next = if late {
                    // Silent for up to two lease lengths: the lease may run out meanwhile.
                    now_ms + 1 + self.below(6 * h.heartbeat_ms)
                } else {
                    now_ms + h.heartbeat_ms
                };
                if let Some(x) = self.held.as_mut() {
                    x.renew_at_ms = next;
                }
                if !late {
                    let params = self.fenced(&h);
                    return self.mutate("_axp/renew", params);
                }
            }
        }
        if !self.pending.is_empty() {
            // A deliberate duplicate: the same operation again must change nothing.
            if self.chance(1, 40) {
                if let Some(sent) = self.pending.values().last().cloned() {
                    if sent.params.get("operationId").is_some() {
                        self.counts.2 += 1;
                        self.send(&sent.method, sent.params);
                    }
                }
            }
            return;
        }
        if self.winding_down {
            return self.wind_down();
        }
        if now_ms + 5_000 >= self.registered_until_ms {
            let ttl = 10_000 + self.below(20_000);
            self.registered_until_ms = now_ms + ttl;
            let params = json!({"channel": EXECUTORS, "executorId": self.executor_id,
                "name": format!("Agent {}", self.index), "placement": "satellite",
                "capabilities": ["acp/v1"], "ttlMs": ttl});
            return self.mutate("_axp/register", params);
        }
        let Some(held) = self.held.clone() else {
            return self.find_work(board);
        };
        match self.work.clone() {
            None => {
                if self.chance(1, 30) {
                    return self.stale_command(&held);
                }
                if self.chance(1, 25) {
                    let params = self.fenced(&held);
                    return self.mutate("_axp/release", params);
                }
                let turn = board
                    .turns
                    .get(&held.session)
                    .and_then(|t| t.iter().rev().find(|t| !self.tried.contains(*t)))
                    .cloned();
                let Some(turn) = turn else {
                    return;
                };
                self.tried.insert(turn.clone());
                let ceiling = 100 + self.below(2_000);
                if self.chance(1, 40) {
                    // Two turns in one reservation: refused as invalid.
                    let mut p = self.fenced(&held);
                    p["turnId"] = json!(turn);
                    p["ceiling"] = json!({"tokens": ceiling, "costMicros": 10, "turns": 2});
                    p["operationId"] = json!(self.op());
                    return self.send_invalid("_axp/reserve", p);
                }
                self.work = Some(Work {
                    turn: turn.clone(),
                    reserved: false,
                    emits_left: self.below(4) as u32,
                    parts: 0,
                    ceiling,
                });
                let mut p = self.fenced(&held);
                p["turnId"] = json!(turn);
                p["ceiling"] = json!({"tokens": ceiling, "costMicros": ceiling * 10, "turns": 1});
                self.mutate("_axp/reserve", p)
            }
            Some(w) if !w.reserved => self.work = None,
            Some(w) if w.emits_left > 0 => {
                let part = format!("p{}", w.parts);
                let action = if w.parts == 0 || self.chance(1, 3) {
                    json!({"type": "chat/responsePart", "turnId": w.turn,
                           "part": {"kind": "markdown", "id": part, "content": "…"}})
                } else {
                    json!({"type": "chat/delta", "turnId": w.turn,
                           "partId": format!("p{}", w.parts - 1), "content": " more"})
                };
                if let Some(x) = self.work.as_mut() {
                    x.emits_left -= 1;
                    if action["type"] == "chat/responsePart" {
                        x.parts += 1;
                    }
                }
                let mut p = self.fenced(&held);
                p["actions"] = json!([action]);
                self.mutate("_axp/emit", p)
            }
            Some(w) => self.settle(&held, &w),
        }
    }

    fn settle(&mut self, held: &Held, w: &Work) {
        let roll = self.below(10);
        let over =
            self.temper.overspend_in > 0 && self.chance(1, u64::from(self.temper.overspend_in));
        let usage = if over {
            // More than the grant allows: recorded, and the grant revoked.
            json!({"inputTokens": 1_000_000, "outputTokens": 5, "cacheReadTokens": 0,
                   "costMicros": 9_000_000, "source": "reported"})
        } else if roll < 2 {
            Value::Null
        } else {
            let input = self.below(w.ceiling);
            json!({"inputTokens": input, "outputTokens": self.below(50),
                   "cacheReadTokens": self.below(input + 1), "costMicros": self.below(5_000),
                   "source": "reported"})
        };
        let outcome = ["complete", "complete", "cancelled", "error"][self.below(4) as usize];
        let mut p = self.fenced(held);
        p["turnId"] = json!(w.turn);
        p["usage"] = usage;
        p["outcome"] = json!(outcome);
        if outcome == "error" {
            p["error"] = json!("agent failed");
        }
        self.mutate("_axp/settle", p)
    }

    /// A fenced command at an epoch this executor no longer (or never) held.
    fn stale_command(&mut self, held: &Held) {
        let epoch = held.epoch.saturating_sub(1 + self.below(2));
        let stale = Held {
            epoch,
            ..held.clone()
        };
        let p = self.fenced(&stale);
        match self.below(3) {
            0 => self.mutate("_axp/renew", p),
            1 => self.mutate("_axp/release", p),
            _ => {
                let mut p = p;
                p["actions"] = json!([{"type": "chat/responsePart", "turnId": "t-stale",
                    "part": {"kind": "markdown", "id": "stale", "content": "x"}}]);
                self.mutate("_axp/emit", p)
            }
        }
    }

    fn find_work(&mut self, board: &Board) {
        if self.chance(1, 6) || !board.sessions.contains(&self.target) {
            let known: Vec<String> = board.sessions.iter().cloned().collect();
            if let Some(s) = self.pick(&known) {
                self.target = s;
            } else {
                let pool = self.pool.clone();
                self.target = self.pick(&pool).unwrap_or_default();
            }
        }
        let session = self.target.clone();
        let grant = format!("g-{}", self.executor_id);
        if !self.granted.contains(&session) {
            let tokens = 2_000 + self.below(20_000);
            let limit =
                json!({"tokens": tokens, "costMicros": tokens * 20, "turns": 2 + self.below(12)});
            let enforcement = ["provider", "accounting"][self.below(2) as usize];
            let p = json!({"channel": self.exchange(&session), "grantId": grant,
                           "limit": limit, "enforcement": enforcement});
            return self.mutate("_axp/grant", p);
        }
        if self.chance(1, 40) {
            let p = json!({"channel": self.exchange(&session), "grantId": grant});
            return self.mutate("_axp/revoke", p);
        }
        let mut p = json!({"channel": self.exchange(&session), "executorId": self.executor_id,
                           "grantId": grant, "leaseMs": 3_000 + self.below(9_000)});
        if let Some(&epoch) = self.last_epoch.get(&session) {
            if self.chance(2, 3) {
                p["resumeEpoch"] = json!(epoch);
            }
        }
        self.mutate("_axp/claim", p)
    }

    fn wind_down(&mut self) {
        let Some(held) = self.held.clone() else {
            return;
        };
        match self.work.clone() {
            Some(w) if w.reserved => self.settle(&held, &w),
            _ => {
                self.work = None;
                let p = self.fenced(&held);
                self.mutate("_axp/release", p)
            }
        }
    }

    fn on_executor_answer(&mut self, sent: &Sent, result: Option<&Value>, code: i64) {
        let session = sent
            .params
            .get("channel")
            .and_then(Value::as_str)
            .and_then(crate::axp::oracle::session_of)
            .unwrap_or_default()
            .to_owned();
        let epoch = sent.params.get("epoch").and_then(Value::as_u64);
        let current = self
            .held
            .as_ref()
            .filter(|h| Some(h.epoch) == epoch && h.session == session)
            .is_some();
        match (sent.method.as_str(), result) {
            ("_axp/grant", Some(_)) => {
                self.granted.insert(session);
            }
            ("_axp/grant", None) => {}
            ("_axp/revoke", Some(_)) => {
                self.granted.remove(&session);
            }
            ("_axp/claim", Some(lease)) => {
                let epoch = lease.get("epoch").and_then(Value::as_u64).unwrap_or(0);
                let heartbeat_ms = lease
                    .get("heartbeatMs")
                    .and_then(Value::as_u64)
                    .unwrap_or(1_000)
                    .max(1);
                self.last_epoch.insert(session.clone(), epoch);
                if self
                    .held
                    .as_ref()
                    .is_none_or(|h| h.epoch < epoch || h.session != session)
                {
                    self.held = Some(Held {
                        session,
                        epoch,
                        heartbeat_ms,
                        renew_at_ms: 0,
                    });
                    self.work = None;
                }
            }
            // The grant is revoked or not ours any more: grant again.
            ("_axp/claim", None) if code == -32009 || code == -32041 => {
                self.granted.remove(&session);
            }
            ("_axp/release", Some(_)) if current => {
                self.held = None;
                self.work = None;
            }
            ("_axp/reserve", Some(_)) => {
                if let Some(w) = self.work.as_mut() {
                    if sent.params.get("turnId").and_then(Value::as_str) == Some(w.turn.as_str()) {
                        w.reserved = true;
                    }
                }
            }
            ("_axp/settle", Some(_))
                if self
                    .work
                    .as_ref()
                    .is_some_and(|w| sent.params["turnId"] == w.turn.as_str()) =>
            {
                self.work = None;
            }
            (m, None) if m.starts_with("_axp/") && current => match code {
                -32040 => {
                    self.held = None;
                    self.work = None;
                }
                -32041 => {
                    // Revoked (by us, an overspend, or a new limit): stop and grant again.
                    self.granted.remove(&session);
                    self.work = None;
                    self.held = None;
                }
                _ if m == "_axp/reserve" || m == "_axp/emit" || m == "_axp/settle" => {
                    self.work = None
                }
                _ => {}
            },
            _ => {}
        }
    }

    // ─── Maintainer ───────────────────────────────────────────────────────────────────────

    fn maintainer(&mut self, board: &Board) {
        if !self.pending.is_empty() || self.winding_down {
            return;
        }
        let known: Vec<String> = board.sessions.iter().cloned().collect();
        let session = match self.pick(&known) {
            Some(s) if !self.chance(1, 12) => s,
            _ => {
                let pool = self.pool.clone();
                let id = self.pick(&pool).unwrap_or_default();
                return self.send(
                    "createSession",
                    json!({"channel": format!("ahp-session:/{id}"), "provider": "axp"}),
                );
            }
        };
        let chat = format!("ahp-chat:/{session}");
        match self.below(20) {
            0..=7 => {
                self.turns_started += 1;
                let turn = format!("t{}-{}", self.index, self.turns_started);
                let action = json!({"type": "chat/turnStarted", "turnId": turn,
                    "startedAt": "2020-01-01T00:00:00.000Z",
                    "message": {"text": "Fix it", "origin": {"kind": "user"}}});
                self.dispatch(&chat, action);
            }
            8..=9 => {
                let kind = ["steering", "queued"][self.below(2) as usize];
                let n = self.below(1_000);
                let id = format!("m{}-{n}", self.index);
                let action = json!({"type": "chat/pendingMessageSet", "kind": kind, "id": id,
                    "message": {"text": "Also this", "origin": {"kind": "user"}}});
                self.dispatch(&chat, action);
            }
            10..=11 => {
                let Some(turn) = board.turns.get(&session).and_then(|t| t.last()).cloned() else {
                    return;
                };
                let action = json!({"type": "chat/turnCancelled", "turnId": turn, "duration": 0});
                self.dispatch(&chat, action);
            }
            12..=13 => {
                let p = json!({"channel": format!("axp-session:/{session}"),
                               "body": format!("note {}", self.below(100)),
                               "checkpoint": null, "path": null});
                self.mutate("_axp/comment", p);
            }
            14 if self.temper.closes && self.chance(1, 10) => {
                let p = json!({"channel": format!("axp-session:/{session}")});
                self.mutate("_axp/close", p);
            }
            15 => {
                // An executor command on a session with no grant of ours: refused, not invalid.
                let p = json!({"channel": format!("axp-session:/{session}"), "epoch": 1});
                self.mutate("_axp/renew", p);
            }
            _ => {}
        }
    }

    fn dispatch(&mut self, chat: &str, action: Value) {
        if self.chance(1, 2) {
            self.client_seq += 1;
            let p = json!({"channel": chat, "clientSeq": self.client_seq, "action": action});
            self.send("dispatchAction", p);
        } else {
            let p = json!({"channel": chat, "action": action});
            self.mutate("_axp/dispatch", p);
        }
    }

    // ─── Observer ─────────────────────────────────────────────────────────────────────────

    fn observer(&mut self, board: &Board) {
        if !self.pending.is_empty() {
            return;
        }
        let unmirrored: Vec<String> = board
            .sessions
            .iter()
            .map(|s| format!("axp-session:/{s}"))
            .filter(|c| !self.mirrors.contains_key(c))
            .collect();
        if let Some(channel) = unmirrored.first().cloned() {
            return self.send("subscribe", json!({"channel": channel}));
        }
        if self.winding_down {
            return;
        }
        let session = self.pool.first().cloned().unwrap_or_default();
        match self.below(12) {
            0 => {
                let p = json!({"channel": format!("axp-session:/{session}"), "body": "hi",
                               "checkpoint": null, "path": null});
                self.mutate("_axp/comment", p);
            }
            1 => {
                let p = json!({"channel": format!("axp-session:/{session}"),
                    "executorId": "spy", "grantId": "g-spy", "leaseMs": 3_000});
                self.mutate("_axp/claim", p);
            }
            2 => {
                let p = json!({"channel": format!("axp-session:/{session}")});
                self.send("_axp/export", p);
            }
            _ => {}
        }
    }

    // ─── Frames ───────────────────────────────────────────────────────────────────────────

    /// A frame from the host; sessions created and turns started go on the board. `Err` when
    /// the frame breaks the protocol.
    pub fn on_frame(&mut self, text: &str, board: &mut Board) -> Result<(), String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if v.get("method").and_then(Value::as_str) == Some("action") {
            return self.on_action(v.get("params").unwrap_or(&Value::Null));
        }
        if v.get("method").is_some() {
            return Ok(());
        }
        let Some(id) = v.get("id").and_then(Value::as_u64) else {
            return Ok(());
        };
        let Some(sent) = self.pending.remove(&id) else {
            return Ok(());
        };
        let result = v.get("result");
        let code = v
            .pointer("/error/code")
            .and_then(Value::as_i64)
            .unwrap_or(0);
        match sent.method.as_str() {
            // A refused handshake is tried again on the next turn.
            "initialize" => {
                if let Some(r) = result {
                    if let Some((conn, _)) = self.conn {
                        self.conn = Some((conn, true));
                    }
                    self.last_seq = r.get("serverSeq").and_then(Value::as_u64).unwrap_or(0);
                    for s in r
                        .get("snapshots")
                        .and_then(Value::as_array)
                        .into_iter()
                        .flatten()
                    {
                        self.mirror(s)?;
                    }
                }
            }
            "subscribe" => {
                if let Some(s) = result.and_then(|r| r.get("snapshot")) {
                    self.mirror(s)?;
                }
            }
            "createSession" if result.is_some() => {
                if let Some(id) = sent.params["channel"]
                    .as_str()
                    .and_then(|c| c.strip_prefix("ahp-session:/"))
                {
                    board.sessions.insert(id.to_owned());
                }
            }
            "dispatchAction" | "_axp/dispatch" if result.is_some() => {
                let action = &sent.params["action"];
                if action["type"] == "chat/turnStarted" {
                    if let (Some(chat), Some(turn)) =
                        (sent.params["channel"].as_str(), action["turnId"].as_str())
                    {
                        let session = chat.trim_start_matches("ahp-chat:/").to_owned();
                        board
                            .turns
                            .entry(session)
                            .or_default()
                            .push(turn.to_owned());
                    }
                }
            }
            _ => {}
        }
        if self.kind == Kind::Executor {
            self.on_executor_answer(&sent, result, code);
        }
        Ok(())
    }

    fn mirror(&mut self, snapshot: &Value) -> Result<(), String> {
        let resource = snapshot["resource"]
            .as_str()
            .ok_or("a snapshot without resource")?
            .to_owned();
        let from = snapshot["fromSeq"]
            .as_u64()
            .ok_or("a snapshot without fromSeq")?;
        self.mirrors.insert(
            resource,
            Mirror::from_snapshot(snapshot["state"].clone(), from),
        );
        Ok(())
    }

    fn on_action(&mut self, env: &Value) -> Result<(), String> {
        let seq = env["serverSeq"]
            .as_u64()
            .ok_or("an envelope without serverSeq")?;
        if seq <= self.last_seq {
            return Err(format!(
                "serverSeq {seq} arrived after {} on one connection",
                self.last_seq
            ));
        }
        self.last_seq = seq;
        let channel = env["channel"].as_str().unwrap_or("");
        if env.get("rejectionReason").is_some() {
            return Ok(());
        }
        let Some(m) = self.mirrors.get_mut(channel) else {
            return Ok(());
        };
        if seq <= m.seq {
            return Ok(());
        }
        m.apply(channel, &env["action"], seq)
            .map_err(|e| format!("observer {}: {e}", self.index))
    }
}
