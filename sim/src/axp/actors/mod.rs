//! The AXP simulator's roles: executors, maintainers and observers, each one principal with at
//! most one connection at a time.
//!
//! - An **executor** (a contributor's agent, as the reference satellite runs one) registers,
//!   grants itself a budget on a session, claims the session's lease (with `resumeEpoch`
//!   after it lost one), renews on its heartbeat (sometimes late, so leases expire), reserves
//!   the maintainers' turns, streams output, and settles with reported usage, an overspend or
//!   nothing. Between turns it uploads blobs, records Git checkpoints over them, proposes
//!   compactions, and reviews its checkpoint: it reads the export and signs a manifest of the
//!   checkpoint and the trace it shows, racing new checkpoints and lease changes. Now and then it releases, revokes its own grant, or sends a fenced command
//!   with a stale epoch. Every mutation whose answer a cut connection swallowed is sent again,
//!   byte for byte (same `operationId`), as the first thing on the next connection; some are
//!   sent twice on purpose.
//! - A **maintainer** creates sessions, starts turns (`dispatchAction` and `_axp/dispatch`),
//!   steers and queues messages, cancels turns, comments, accepts pending compactions,
//!   approves reviews with its own key and, rarely, closes a session.
//! - A **verifier** uploads its run's output and records verifications of the checkpoint head
//!   observers last saw (racing new checkpoints, so some name an old head and are refused).
//! - An **observer** mirrors `axp-executors://` and every session's exchange it may read with
//!   the reducer in [`crate::axp::replica`], and tries commands its role may not run. Some are
//!   scoped to one session.
//! - Every role uses repository memory (`memory.rs`): executors propose lessons, maintainers
//!   review them and watch `axp-memory://`, everyone searches.
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

mod executor;
mod maintainer;
mod memory;
mod observer;
pub(crate) mod signing;
mod verifier;

/// What a role is.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Runs an executor.
    Executor,
    /// Drives chats.
    Maintainer,
    /// Watches.
    Observer,
    /// Runs the checks a checkpoint claims to pass and records the outcome.
    Verifier,
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
    /// Each session's context `(revision, throughTurn)`, as observers last saw it.
    pub contexts: BTreeMap<String, (u64, u64)>,
    /// Each session's pending compaction proposal id, as observers last saw it.
    pub proposals: BTreeMap<String, String>,
    /// Each session's review still waiting for a maintainer: its manifest, as observers last
    /// saw it.
    pub reviews: BTreeMap<String, Value>,
    /// Each session's checkpoint head, as observers last saw it.
    pub heads: BTreeMap<String, String>,
    /// Repository lessons heard of (answers and events), with the last revision heard.
    pub lessons: BTreeMap<String, u64>,
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
    /// Blob references this executor uploaded, by session (what its checkpoints name).
    blobs: BTreeMap<String, Vec<Value>>,
    /// Sessions this executor recorded a checkpoint on (what it may review).
    checkpointed: BTreeSet<String>,
    // Maintainer.
    client_seq: u64,
    turns_started: u64,
    // Observer.
    /// Mirrored channels.
    pub mirrors: BTreeMap<String, Mirror>,
    last_seq: u64,
    /// The newest `serverSeq` an answer showed (initialize, export): how far a lesson's
    /// evidence may reach.
    known_seq: u64,
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
            blobs: BTreeMap::new(),
            checkpointed: BTreeSet::new(),
            client_seq: 0,
            turns_started: 0,
            mirrors: BTreeMap::new(),
            last_seq: 0,
            known_seq: 0,
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
            Kind::Verifier => self.verifier(board),
        }
    }

    // ─── Frames ───────────────────────────────────────────────────────────────────────────

    /// A frame from the host; sessions created and turns started go on the board. `Err` when
    /// the frame breaks the protocol.
    pub fn on_frame(&mut self, text: &str, board: &mut Board) -> Result<(), String> {
        let v: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        if v.get("method").and_then(Value::as_str) == Some("action") {
            return self.on_action(v.get("params").unwrap_or(&Value::Null), board);
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
        if let Some(seq) = result
            .and_then(|r| r.get("serverSeq"))
            .and_then(Value::as_u64)
        {
            self.known_seq = self.known_seq.max(seq);
        }
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
            "_axp/memoryPropose" | "_axp/memoryReview" => {
                if let Some(r) = result {
                    note_lesson(board, r);
                }
            }
            "_axp/memorySearch" => {
                for l in result
                    .and_then(|r| r["items"].as_array())
                    .into_iter()
                    .flatten()
                {
                    note_lesson(board, l);
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
        if self.kind == Kind::Verifier {
            self.on_verifier_answer(&sent, result);
        }
        Ok(())
    }

    fn mirror(&mut self, snapshot: &Value) -> Result<(), String> {
        if snapshot["resource"] == memory::MEMORY {
            // Watched for its events, not mirrored.
            return Ok(());
        }
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

    fn on_action(&mut self, env: &Value, board: &mut Board) -> Result<(), String> {
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
        if channel == memory::MEMORY {
            note_lesson(board, &env["action"]["memory"]);
        }
        let Some(m) = self.mirrors.get_mut(channel) else {
            return Ok(());
        };
        if seq <= m.seq {
            return Ok(());
        }
        m.apply(channel, &env["action"], seq)
            .map_err(|e| format!("observer {}: {e}", self.index))?;
        // What executors and maintainers need to propose and accept compactions.
        if let Some(session) = channel.strip_prefix("axp-session:/") {
            let ctx = &m.state["context"];
            let at = (
                ctx["revision"].as_u64().unwrap_or(0),
                ctx["throughTurn"].as_u64().unwrap_or(0),
            );
            board.contexts.insert(session.to_owned(), at);
            match m.state["compaction"]["id"].as_str() {
                Some(id) => board.proposals.insert(session.to_owned(), id.to_owned()),
                None => board.proposals.remove(session),
            };
            match m.state["checkpoint"]["headCommit"].as_str() {
                Some(head) => board.heads.insert(session.to_owned(), head.to_owned()),
                None => board.heads.remove(session),
            };
            let review = &m.state["review"];
            if review.is_object() && review["maintainer"].is_null() {
                board
                    .reviews
                    .insert(session.to_owned(), review["manifest"].clone());
            } else {
                board.reviews.remove(session);
            }
        }
        Ok(())
    }
}

/// Puts a lesson (as an answer or an event shows it) on the board, at the newest revision
/// heard.
fn note_lesson(board: &mut Board, lesson: &Value) {
    if let (Some(id), Some(rev)) = (lesson["id"].as_str(), lesson["revision"].as_u64()) {
        let known = board.lessons.entry(id.to_owned()).or_default();
        *known = (*known).max(rev);
    }
}
