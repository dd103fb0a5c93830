//! The AXP oracles: what the exchange promises, checked from outside the core.
//!
//! The oracle sees every message fed to the host (with the principal of its connection), every
//! frame the host sends (at the moment it leaves), and the host's AXP state after every call
//! into it ([`axhost_core::Host::axp_inspect`]). It checks:
//!
//! 1. *Fencing.* A fenced command (`renew`, `release`, `reserve`, `settle`, `emit`) whose
//!    epoch is not the session's current one changes nothing in the session's exchange, and a
//!    fenced command that succeeds at epoch `e` comes from the principal whose claim won `e`.
//! 2. *One winner per epoch.* At most one claim is ever acknowledged for a session and epoch
//!    (retries of the same operation excepted), no claim takes a live lease from another
//!    holder (only the holder may resume over its own), and a session's epoch never goes backwards:
//!    not within a host process, and not below any epoch revealed, across failed commits and
//!    restarts.
//! 3. *Money.* Every grant's `spent` equals the sum of the session's usage entries charged to
//!    it; usage is append-only (so `spent` never decreases) and names each turn once (each
//!    reservation is settled exactly once); a grant whose `spent` exceeds its `limit` is
//!    revoked (an overspend is recorded, never hidden).
//! 4. *Exactly once.* Every acknowledged answer to one `(principal, operationId)` carries the
//!    same result, however often the operation is sent; every acknowledged reservation ends in
//!    exactly one usage entry, and every revealed settlement survives restarts.
//! 5. *Roles.* A command the principal's role may not run never succeeds; well-formed params
//!    are never refused as invalid (`-32602`), and `-32603` appears only when the store was
//!    made to fail.
//! 6. *Shape.* A lease belongs to an open session at its epoch; a reservation belongs to the
//!    live lease's epoch and grant; a closed session has neither.
//! 7. *Artifacts.* A review or a verification in any state names that state's checkpoint (its
//!    head, and the review its base and digest too); a checkpoint's base never changes once set; a
//!    pending compaction is one revision past the context it was proposed against; the context
//!    revision never goes back, changes only upward, never below one revealed (across failed
//!    commits and restarts), and an accepted context's `gitHead` is the checkpoint head it was
//!    accepted at.
//! 8. *Repository memory* ([`super::memory_oracle`]): lesson revisions strictly increase, and a
//!    lesson's evidence is never shown to a caller who cannot read its sessions.

use std::collections::{BTreeMap, BTreeSet};

use axhost_core::canonical::hash_object;
use axhost_core::{AxpInspect, ConnId, Principal, Role};
use serde_json::Value;

use super::memory_oracle::{MemoryOracle, MemoryStats};

/// Counters for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OracleStats {
    /// Host states checked.
    pub states_checked: u64,
    /// Fenced commands fed with a stale epoch, checked to change nothing.
    pub stale_fenced: u64,
    /// Claims acknowledged.
    pub claims: u64,
    /// Answers to an operation already answered, checked to be identical.
    pub replays: u64,
    /// Settlements revealed.
    pub settlements: u64,
    /// Sessions closed (`_axp/close` acknowledged).
    pub closes: u64,
    /// Checkpoints acknowledged.
    pub checkpoints: u64,
    /// Compactions proposed, and accepted, as acknowledged.
    pub compactions: (u64, u64),
    /// Reviews submitted, and approved, as acknowledged.
    pub reviews: (u64, u64),
    /// Verifications acknowledged.
    pub verifications: u64,
    /// Commands refused, by code.
    pub refusals: BTreeMap<i64, u64>,
    /// Repository memory.
    pub memory: MemoryStats,
}

/// A request in flight, by connection and raw id.
#[derive(Clone, Debug)]
struct Asked {
    method: String,
    params: Value,
    principal: String,
    role: Role,
    /// The sender meant the params to be refused (string ids mark those).
    deliberate: bool,
    /// `-32602` is the right answer for the state the host was in (a dispatch to a
    /// session that is closed or unknown, as the reference answers).
    invalid_ok: bool,
}

/// Who won a claim.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Winner {
    owner: String,
    operation: String,
}

/// See the module docs.
#[derive(Default)]
pub struct AxpOracle {
    conns: BTreeMap<ConnId, (String, Role)>,
    asked: BTreeMap<(ConnId, String), Asked>,
    /// A fenced command with a stale epoch being fed: its session and exchange before.
    stale: Option<(String, Value)>,
    /// A claim being fed while a live lease holds its session: the session, the epoch and
    /// the holder `(owner, executorId)`.
    contested: Option<(String, u64, (Value, Value))>,
    /// The first acknowledged result of each operation, by `(principal, operationId)`.
    results: BTreeMap<(String, String), Value>,
    /// Acknowledged claims, by `(session, epoch)`.
    claims: BTreeMap<(String, u64), Winner>,
    /// The highest epoch revealed per session.
    revealed_epoch: BTreeMap<String, u64>,
    /// The highest context revision revealed per session.
    revealed_revision: BTreeMap<String, u64>,
    /// Turns whose reservation was acknowledged, by session.
    reserved: BTreeMap<String, BTreeSet<String>>,
    /// Turns whose settlement was revealed, by session.
    settled: BTreeMap<String, BTreeSet<String>>,
    /// The last state of each exchange in this host process (since the last failure).
    last: BTreeMap<String, Value>,
    /// Whether the store may refuse commits (so `-32603` is expected).
    pub store_faults: bool,
    /// Counters.
    pub stats: OracleStats,
    /// Invariant 8.
    memory: MemoryOracle,
}

const FENCED: [&str; 6] = [
    "_axp/renew",
    "_axp/release",
    "_axp/reserve",
    "_axp/settle",
    "_axp/emit",
    "_axp/checkpoint",
];

/// Whether `role` may run `method` (the role table of docs/axp.md).
fn role_may(role: Role, method: &str) -> bool {
    match method {
        "createSession" | "dispatchAction" | "_axp/dispatch" | "_axp/close" => {
            role == Role::Maintainer
        }
        "_axp/register" | "_axp/grant" | "_axp/claim" | "_axp/renew" | "_axp/release"
        | "_axp/reserve" | "_axp/settle" | "_axp/emit" | "_axp/checkpoint" | "_axp/compact" => {
            matches!(role, Role::Maintainer | Role::Contributor)
        }
        "_axp/acceptCompaction" | "_axp/approveReview" | "_axp/memoryReview" => {
            role == Role::Maintainer
        }
        "_axp/memoryPropose" => matches!(role, Role::Maintainer | Role::Contributor),
        "_axp/review" => matches!(role, Role::Maintainer | Role::Contributor),
        "_axp/verify" => role == Role::Verifier,
        "_axp/comment" | "_axp/blobPut" => role != Role::Observer,
        _ => true,
    }
}

/// The session a session channel names.
pub fn session_of(channel: &str) -> Option<&str> {
    channel
        .split_once(":/")
        .map(|(_, id)| id)
        .filter(|id| !id.is_empty() && !id.contains('/'))
}

fn u(v: &Value, pointer: &str) -> u64 {
    v.pointer(pointer).and_then(Value::as_u64).unwrap_or(0)
}

impl AxpOracle {
    /// The driver is about to feed `Input::Connected`.
    pub fn connected(&mut self, conn: ConnId, principal: &Principal) {
        self.conns
            .insert(conn, (principal.id.clone(), principal.role));
        self.memory.connected(conn, principal);
    }

    /// The driver fed `Input::Closed`.
    pub fn closed(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
        self.asked.retain(|(c, _), _| *c != conn);
        self.memory.closed(conn);
    }

    /// The driver is about to feed a message from `conn`.
    /// `inspect` gives the host's AXP state before the message (asked only for commands whose
    /// checks depend on it).
    pub fn feeding(
        &mut self,
        conn: ConnId,
        text: &str,
        wall_ms: u64,
        inspect: impl Fn() -> AxpInspect,
    ) {
        self.stale = None;
        self.contested = None;
        let Ok(v) = serde_json::from_str::<Value>(text) else {
            return;
        };
        let (Some(id), Some(method)) = (v.get("id"), v.get("method").and_then(Value::as_str))
        else {
            return;
        };
        let Some((principal, role)) = self.conns.get(&conn).cloned() else {
            return;
        };
        let params = v.get("params").cloned().unwrap_or(Value::Null);
        let session = params
            .get("channel")
            .and_then(Value::as_str)
            .and_then(session_of);
        let mut invalid_ok = false;
        if method == "_axp/memoryPropose" {
            // Whether the session has events in the range, and the range is not past
            // `serverSeq`, are state checks the reference answers -32602.
            invalid_ok = true;
        } else if method == "_axp/dispatch" || method == "dispatchAction" {
            let state = session.and_then(|s| inspect().exchanges.get(s).cloned());
            invalid_ok = state.is_none_or(|ex| ex["status"] == "closed");
        } else if method == "_axp/claim" {
            if let Some(s) = session {
                if let Some(ex) = inspect().exchanges.get(s) {
                    let lease = &ex["lease"];
                    if !lease.is_null() && u(lease, "/expiresAt") > wall_ms {
                        let holder = (lease["owner"].clone(), lease["executorId"].clone());
                        self.contested = Some((s.to_owned(), u(ex, "/epoch"), holder));
                    }
                }
            }
        } else if method == "_axp/approveReview" {
            // A maintainer signs the review it last saw; one replaced since (a later manifest
            // of the same checkpoint) makes its signature wrong for the current one, -32602.
            if let Some(ex) = session.and_then(|s| inspect().exchanges.get(s).cloned()) {
                let current = &ex["review"]["manifest"];
                let signed = &params["signature"]["signature"];
                invalid_ok = current.is_object()
                    && crate::axp::actors::signing::sign_as(&principal, current)["signature"]
                        != *signed;
            }
        } else if FENCED.contains(&method) {
            let epoch = params.get("epoch").and_then(Value::as_u64);
            if let (Some(s), Some(epoch)) = (session, epoch) {
                if let Some(ex) = inspect().exchanges.get(s) {
                    if u(ex, "/epoch") != epoch {
                        self.stale = Some((s.to_owned(), ex.clone()));
                    }
                }
            }
        }
        self.asked.insert(
            (conn, id.to_string()),
            Asked {
                method: method.to_owned(),
                params,
                principal,
                role,
                deliberate: id.is_string(),
                invalid_ok,
            },
        );
    }

    /// The host's AXP state after a call into it: the stale check of the message just fed,
    /// then every state invariant.
    pub fn fed(&mut self, host: AxpInspect) -> Result<(), String> {
        if let Some((session, epoch, holder)) = self.contested.take() {
            // Only the holder itself may end a live lease by claiming (`resumeEpoch`).
            let ex = host.exchanges.get(&session).unwrap_or(&Value::Null);
            let lease = &ex["lease"];
            let taker = (lease["owner"].clone(), lease["executorId"].clone());
            if u(ex, "/epoch") > epoch && taker != holder {
                return Err(format!(
                    "a claim took the live lease of {session} at epoch {epoch} from {holder:?} for {taker:?}"
                ));
            }
        }
        if let Some((session, before)) = self.stale.take() {
            self.stats.stale_fenced += 1;
            let now = host.exchanges.get(&session);
            if now != Some(&before) {
                return Err(format!(
                    "a fenced command with a stale epoch changed {session}: {}",
                    crate::replica::difference(
                        &before,
                        now.unwrap_or(&Value::Null),
                        ("before", "after")
                    )
                ));
            }
        }
        self.state(host)
    }

    /// Every state invariant, and monotonicity against the last state of this process.
    pub fn state(&mut self, host: AxpInspect) -> Result<(), String> {
        self.stats.states_checked += 1;
        self.memory.state(&host.memory)?;
        for (id, ex) in &host.exchanges {
            shape(id, ex)?;
            money(id, ex)?;
            artifacts(id, ex)?;
            let revision = u(ex, "/context/revision");
            let floor = self.revealed_revision.get(id).copied().unwrap_or(0);
            if revision < floor {
                return Err(format!(
                    "session {id} is at context revision {revision}, below revision {floor} already revealed"
                ));
            }
            let epoch = u(ex, "/epoch");
            let floor = self.revealed_epoch.get(id).copied().unwrap_or(0);
            if epoch < floor {
                return Err(format!(
                    "session {id} is at epoch {epoch}, below epoch {floor} already revealed"
                ));
            }
            if let Some(last) = self.last.get(id) {
                monotone(id, last, ex)?;
            }
        }
        self.last = host.exchanges;
        Ok(())
    }

    /// The driver is about to report a failed commit: the state may go back to the durable
    /// one, so this process's history starts again.
    pub fn rolling_back(&mut self) {
        self.last.clear();
        self.memory.rolling_back();
        self.stale = None;
        self.contested = None;
    }

    /// After a failed commit or a restart: the state, now the durable one, must still hold
    /// everything revealed.
    pub fn rolled_back(&mut self, host: AxpInspect) -> Result<(), String> {
        self.rolling_back();
        for (id, turns) in &self.settled {
            let Some(ex) = host.exchanges.get(id) else {
                return Err(format!(
                    "session {id} is gone, its settlements were revealed"
                ));
            };
            for t in turns {
                if usage_count(ex, t) != 1 {
                    return Err(format!(
                        "the revealed settlement of turn {t} on {id} is not in the durable state once"
                    ));
                }
            }
        }
        self.state(host)
    }

    /// The host process died with its connections.
    pub fn restarted(&mut self) {
        self.conns.clear();
        self.asked.clear();
        self.memory.restarted();
    }

    /// A frame leaves the host for `conn`.
    pub fn on_send(&mut self, conn: ConnId, frame: &str) -> Result<(), String> {
        let v: Value =
            serde_json::from_str(frame).map_err(|e| format!("host frame is not JSON: {e}"))?;
        if v.get("method").and_then(Value::as_str) == Some("action") {
            let env = v.get("params").unwrap_or(&Value::Null);
            if env["channel"] == "axp-memory://" {
                self.memory.on_event(conn, env)?;
                self.stats.memory = self.memory.stats.clone();
            }
            return self.on_action(env);
        }
        let Some(id) = v.get("id") else {
            return Ok(());
        };
        let Some(asked) = self.asked.remove(&(conn, id.to_string())) else {
            return Ok(());
        };
        match (v.get("result"), v.get("error")) {
            (Some(result), _) => {
                self.memory.on_result(conn, &asked.method, result)?;
                self.stats.memory = self.memory.stats.clone();
                self.on_result(&asked, result)
            }
            (_, Some(error)) => self.on_error(&asked, error),
            _ => Err(format!(
                "an answer to {} with neither result nor error",
                asked.method
            )),
        }
    }

    fn on_action(&mut self, env: &Value) -> Result<(), String> {
        let channel = env.get("channel").and_then(Value::as_str).unwrap_or("");
        let Some(session) = channel.strip_prefix("axp-session:/") else {
            return Ok(());
        };
        let action = env.get("action").unwrap_or(&Value::Null);
        match action.get("type").and_then(Value::as_str) {
            Some("_axp/leaseChanged") => {
                let epoch = u(action, "/epoch");
                let floor = self.revealed_epoch.entry(session.to_owned()).or_default();
                *floor = (*floor).max(epoch);
            }
            Some("_axp/contextChanged") => {
                let revision = u(action, "/context/revision");
                let floor = self
                    .revealed_revision
                    .entry(session.to_owned())
                    .or_default();
                *floor = (*floor).max(revision);
            }
            Some("_axp/settled") => {
                if let Some(t) = action.get("turnId").and_then(Value::as_str) {
                    self.stats.settlements += 1;
                    self.settled
                        .entry(session.to_owned())
                        .or_default()
                        .insert(t.to_owned());
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn on_result(&mut self, asked: &Asked, result: &Value) -> Result<(), String> {
        let method = asked.method.as_str();
        if !role_may(asked.role, method) {
            return Err(format!(
                "{} ({}) ran {method}, which its role may not",
                asked.principal,
                asked.role.as_str()
            ));
        }
        if asked.deliberate {
            return Err(format!(
                "{method} with deliberately invalid params succeeded: {}",
                asked.params
            ));
        }
        let session = asked
            .params
            .get("channel")
            .and_then(Value::as_str)
            .and_then(session_of)
            .map(str::to_owned);
        if let Some(op) = asked.params.get("operationId").and_then(Value::as_str) {
            let key = (asked.principal.clone(), op.to_owned());
            match self.results.get(&key) {
                Some(first) if first != result => {
                    return Err(format!(
                        "{method} operation {op} of {} answered {result} after {first}",
                        asked.principal
                    ))
                }
                Some(_) => self.stats.replays += 1,
                None => {
                    self.results.insert(key, result.clone());
                }
            }
        }
        let Some(session) = session else {
            return Ok(());
        };
        match method {
            "_axp/close" => self.stats.closes += 1,
            "_axp/compact" => self.stats.compactions.0 += 1,
            "_axp/acceptCompaction" => self.stats.compactions.1 += 1,
            "_axp/review" => self.stats.reviews.0 += 1,
            "_axp/approveReview" => self.stats.reviews.1 += 1,
            "_axp/verify" => self.stats.verifications += 1,
            "_axp/claim" => {
                let epoch = u(result, "/epoch");
                let winner = Winner {
                    owner: asked.principal.clone(),
                    operation: asked
                        .params
                        .get("operationId")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                };
                self.stats.claims += 1;
                let floor = self.revealed_epoch.entry(session.clone()).or_default();
                *floor = (*floor).max(epoch);
                match self.claims.get(&(session.clone(), epoch)) {
                    Some(w) if *w != winner => {
                        return Err(format!(
                            "two claims won epoch {epoch} of {session}: {w:?} and {winner:?}"
                        ))
                    }
                    Some(_) => {}
                    None => {
                        self.claims.insert((session, epoch), winner);
                    }
                }
            }
            m if FENCED.contains(&m) => {
                let epoch = u(&asked.params, "/epoch");
                match self.claims.get(&(session.clone(), epoch)) {
                    Some(w) if w.owner == asked.principal => {}
                    other => {
                        return Err(format!(
                            "{m} at epoch {epoch} of {session} by {} succeeded; the claim of that epoch: {other:?}",
                            asked.principal
                        ))
                    }
                }
                if m == "_axp/checkpoint" {
                    self.stats.checkpoints += 1;
                }
                if m == "_axp/reserve" {
                    if let Some(t) = asked.params.get("turnId").and_then(Value::as_str) {
                        self.reserved
                            .entry(session)
                            .or_default()
                            .insert(t.to_owned());
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn on_error(&mut self, asked: &Asked, error: &Value) -> Result<(), String> {
        let code = error.get("code").and_then(Value::as_i64).unwrap_or(0);
        *self.stats.refusals.entry(code).or_default() += 1;
        let method = &asked.method;
        match code {
            -32602 if !asked.deliberate && !asked.invalid_ok => Err(format!(
                "{method} with well-formed params refused as invalid: {error} (params {})",
                asked.params
            )),
            -32603 if !self.store_faults => Err(format!(
                "{method} failed internally with no store fault armed: {error}"
            )),
            -32700 | -32600 | -32601 => Err(format!("{method} refused with {code}: {error}")),
            _ => Ok(()),
        }
    }

    /// After the liveness phase: nothing is leased or reserved any more, and every
    /// acknowledged reservation and revealed settlement is in the state exactly once.
    pub fn final_check(&self, host: &AxpInspect) -> Result<(), String> {
        for (id, ex) in &host.exchanges {
            if !ex["lease"].is_null() || !ex["reservation"].is_null() {
                return Err(format!(
                    "after every executor left and every lease ran out, {id} still has lease {} and reservation {}",
                    ex["lease"], ex["reservation"]
                ));
            }
        }
        for (what, map) in [
            ("reservation", &self.reserved),
            ("settlement", &self.settled),
        ] {
            for (id, turns) in map {
                let ex = host.exchanges.get(id).unwrap_or(&Value::Null);
                for t in turns {
                    let n = usage_count(ex, t);
                    if n != 1 {
                        return Err(format!(
                            "the acknowledged {what} of turn {t} on {id} ended in {n} usage entries"
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

fn usage_count(ex: &Value, turn: &str) -> usize {
    ex["usage"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|e| e["turnId"] == turn).count())
}

/// Invariant 6.
fn shape(id: &str, ex: &Value) -> Result<(), String> {
    let epoch = u(ex, "/epoch");
    let status = ex["status"].as_str().unwrap_or("");
    let lease = &ex["lease"];
    let reservation = &ex["reservation"];
    if !lease.is_null() {
        if status != "open" {
            return Err(format!("{id} is {status} with a lease {lease}"));
        }
        if u(lease, "/epoch") != epoch {
            return Err(format!(
                "{id} at epoch {epoch} holds a lease of another epoch: {lease}"
            ));
        }
    }
    if !reservation.is_null() {
        if lease.is_null() {
            return Err(format!(
                "{id} holds reservation {reservation} without a lease"
            ));
        }
        if u(reservation, "/epoch") != epoch || reservation["grantId"] != lease["grantId"] {
            return Err(format!(
                "{id}: reservation {reservation} is not of the live lease {lease}"
            ));
        }
    }
    if status == "closed" && (!lease.is_null() || !reservation.is_null()) {
        return Err(format!("closed session {id} holds a lease or reservation"));
    }
    Ok(())
}

/// Invariant 7 on one state.
fn artifacts(id: &str, ex: &Value) -> Result<(), String> {
    let checkpoint = &ex["checkpoint"];
    let review = &ex["review"];
    if !review.is_null() {
        let m = &review["manifest"];
        if checkpoint.is_null()
            || m["headCommit"] != checkpoint["headCommit"]
            || m["baseCommit"] != checkpoint["baseCommit"]
            || m["checkpointDigest"] != hash_object(checkpoint).as_str()
        {
            return Err(format!(
                "{id}: review of {}..{} beside checkpoint {checkpoint}",
                m["baseCommit"], m["headCommit"]
            ));
        }
    }
    let verification = &ex["verification"];
    if !verification.is_null()
        && (checkpoint.is_null() || verification["headCommit"] != checkpoint["headCommit"])
    {
        return Err(format!(
            "{id}: verification of {} beside checkpoint {checkpoint}",
            verification["headCommit"]
        ));
    }
    let compaction = &ex["compaction"];
    if !compaction.is_null()
        && u(compaction, "/context/revision") != u(compaction, "/expectedRevision") + 1
    {
        return Err(format!(
            "{id}: compaction {compaction} is not one revision past the one it replaces"
        ));
    }
    Ok(())
}

/// Invariant 3 on one state.
fn money(id: &str, ex: &Value) -> Result<(), String> {
    let empty = Vec::new();
    let usage = ex["usage"].as_array().unwrap_or(&empty);
    let mut turns = BTreeSet::new();
    let mut sums: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    for e in usage {
        let t = e["turnId"].as_str().unwrap_or("");
        if !turns.insert(t) {
            return Err(format!("{id}: turn {t} was settled twice"));
        }
        let g = e["grantId"].as_str().unwrap_or("").to_owned();
        let s = sums.entry(g).or_default();
        s.0 += u(e, "/usage/inputTokens") + u(e, "/usage/outputTokens");
        s.1 += u(e, "/usage/costMicros");
        s.2 += 1;
    }
    let Some(grants) = ex["grants"].as_object() else {
        return Err(format!("{id}: no grants map"));
    };
    for (g, grant) in grants {
        let spent = (
            u(grant, "/spent/tokens"),
            u(grant, "/spent/costMicros"),
            u(grant, "/spent/turns"),
        );
        let charged = sums.remove(g).unwrap_or_default();
        if spent != charged {
            return Err(format!(
                "{id}: grant {g} has spent {spent:?}, its usage entries add up to {charged:?}"
            ));
        }
        let limit = (
            u(grant, "/limit/tokens"),
            u(grant, "/limit/costMicros"),
            u(grant, "/limit/turns"),
        );
        let over = spent.0 > limit.0 || spent.1 > limit.1 || spent.2 > limit.2;
        if over && grant["revoked"] != Value::Bool(true) {
            return Err(format!(
                "{id}: grant {g} spent {spent:?} over its limit {limit:?} and is not revoked"
            ));
        }
    }
    if let Some(g) = sums.keys().next() {
        return Err(format!(
            "{id}: usage charged to grant {g}, which does not exist"
        ));
    }
    Ok(())
}

/// Invariants 2 and 3 between two states of one host process.
fn monotone(id: &str, last: &Value, now: &Value) -> Result<(), String> {
    let (a, b) = (u(last, "/epoch"), u(now, "/epoch"));
    if b < a {
        return Err(format!("{id}: epoch went from {a} back to {b}"));
    }
    let empty = Vec::new();
    let (old, new) = (
        last["usage"].as_array().unwrap_or(&empty),
        now["usage"].as_array().unwrap_or(&empty),
    );
    if new.len() < old.len() || new[..old.len()] != old[..] {
        return Err(format!("{id}: usage history was rewritten"));
    }
    let (base_was, base_is) = (
        &last["checkpoint"]["baseCommit"],
        &now["checkpoint"]["baseCommit"],
    );
    if !base_was.is_null() && base_is != base_was {
        return Err(format!(
            "{id}: checkpoint base moved from {base_was} to {base_is}"
        ));
    }
    let (ra, rb) = (u(last, "/context/revision"), u(now, "/context/revision"));
    if last["context"] != now["context"] {
        if rb <= ra {
            return Err(format!(
                "{id}: the context changed without a higher revision ({ra} to {rb})"
            ));
        }
        if last["checkpoint"] == now["checkpoint"]
            && now["context"]["gitHead"] != now["checkpoint"]["headCommit"]
        {
            return Err(format!(
                "{id}: context {rb} accepted at gitHead {} while the checkpoint is at {}",
                now["context"]["gitHead"], now["checkpoint"]["headCommit"]
            ));
        }
    }
    let was_closed = last["status"] == "closed";
    if was_closed && now["status"] != "closed" {
        return Err(format!("closed session {id} opened again"));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
