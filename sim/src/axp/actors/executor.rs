//! The executor role: register, grant, claim, renew, reserve, emit, settle, release, and between
//! turns blobs, checkpoints, compaction proposals and signed reviews of its checkpoints.

use serde_json::{json, Value};

use super::{Actor, Held, Sent, Work};
use crate::axp::actors::Board;
use crate::axp::replica::EXECUTORS;

impl Actor {
    // ─── Executor ─────────────────────────────────────────────────────────────────────────

    pub(super) fn exchange(&self, session: &str) -> String {
        format!("axp-session:/{session}")
    }

    pub(super) fn fenced(&self, held: &Held) -> Value {
        json!({"channel": self.exchange(&held.session), "epoch": held.epoch})
    }

    pub(super) fn executor(&mut self, now_ms: u64, board: &Board) {
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
                if self.chance(1, 8) {
                    return self.artifact(&held, board);
                }
                if self.chance(1, 12) {
                    return self.propose_lesson(&held.session);
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

    /// Between turns: upload a blob, record a checkpoint over this executor's blobs of the
    /// session, or propose a compaction at the context the observers last saw.
    pub(super) fn artifact(&mut self, held: &Held, board: &Board) {
        let refs = self.blobs.get(&held.session).cloned().unwrap_or_default();
        if refs.len() < 2 || self.chance(1, 10) {
            // "bundle", "patch", "before", "after": shared bytes, per-session access.
            let data = ["YnVuZGxl", "cGF0Y2g=", "YmVmb3Jl", "YWZ0ZXI="][self.below(4) as usize];
            let p = json!({"channel": self.exchange(&held.session), "data": data,
                           "mediaType": "application/octet-stream"});
            return self.mutate("_axp/blobPut", p);
        }
        if self.checkpointed.contains(&held.session) && self.chance(1, 3) {
            // Review: read the export, then sign what it shows (see `on_executor_answer`).
            let p = json!({"channel": self.exchange(&held.session)});
            return self.send("_axp/export", p);
        }
        if self.chance(1, 3) {
            let (revision, through) = board.contexts.get(&held.session).copied().unwrap_or((0, 0));
            let p = json!({"channel": self.exchange(&held.session),
                "expectedRevision": revision, "throughTurn": through + 1 + self.below(2),
                "summary": format!("Summary {}", self.below(100)),
                "decisions": ["keep going"], "activeFiles": ["src/lib.rs"]});
            return self.mutate("_axp/compact", p);
        }
        let p = self.checkpoint_params(held, &refs);
        self.mutate("_axp/checkpoint", p)
    }

    /// A checkpoint at a fresh head over `refs`, on the session's fixed base.
    fn checkpoint_params(&mut self, held: &Held, refs: &[Value]) -> Value {
        // The session's name in hex, zero-padded: every executor of a session uses one base.
        let mut base: String = held.session.bytes().map(|b| format!("{b:02x}")).collect();
        base.truncate(40);
        while base.len() < 40 {
            base.push('0');
        }
        let head = format!("{:040x}", self.below(u64::MAX));
        let bundle = refs[self.below(refs.len() as u64) as usize].clone();
        let patch = refs[self.below(refs.len() as u64) as usize].clone();
        let file = format!("axp-file:/axp-session%3A%2F{}/src/lib.rs", held.session);
        let content = refs[self.below(refs.len() as u64) as usize]["uri"].clone();
        let files = if self.chance(1, 2) {
            json!([{"id": file, "edit": {"after": {"uri": file, "content": {"uri": content}}}}])
        } else {
            json!([])
        };
        let mut p = self.fenced(held);
        p["checkpoint"] = json!({"baseCommit": base, "headCommit": head,
            "branch": format!("axp/{}", held.session), "bundle": bundle, "patch": patch,
            "createdAt": 0});
        p["files"] = files;
        p
    }

    pub(super) fn settle(&mut self, held: &Held, w: &Work) {
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
    pub(super) fn stale_command(&mut self, held: &Held) {
        let epoch = held.epoch.saturating_sub(1 + self.below(2));
        let stale = Held {
            epoch,
            ..held.clone()
        };
        let p = self.fenced(&stale);
        let refs = self.blobs.get(&held.session).cloned().unwrap_or_default();
        if refs.len() >= 2 && self.chance(1, 4) {
            let p = self.checkpoint_params(&stale, &refs);
            return self.mutate("_axp/checkpoint", p);
        }
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

    pub(super) fn find_work(&mut self, board: &Board) {
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

    pub(super) fn wind_down(&mut self) {
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

    pub(super) fn on_executor_answer(&mut self, sent: &Sent, result: Option<&Value>, code: i64) {
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
            ("_axp/blobPut", Some(r)) => {
                let list = self.blobs.entry(session).or_default();
                if !list.iter().any(|b| b["sha256"] == r["sha256"]) {
                    list.push(r.clone());
                }
            }
            ("_axp/revoke", Some(_)) => {
                self.granted.remove(&session);
            }
            ("_axp/checkpoint", Some(_)) => {
                self.checkpointed.insert(session);
            }
            // The export a review is built from: signed and sent while this executor still
            // believes it holds the session (the lease or the checkpoint may have moved on).
            ("_axp/export", Some(archive))
                if self.held.as_ref().is_some_and(|h| h.session == session) =>
            {
                if let Some(manifest) = super::signing::manifest(archive) {
                    let p = json!({"channel": self.exchange(&session),
                        "contributor": self.sign(&manifest), "manifest": manifest});
                    self.mutate("_axp/review", p);
                }
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
}
