//! The repository-memory oracles, checked from outside the core beside [`super::oracle`]:
//!
//! 1. *Revisions.* A lesson's revision strictly increases with every change: in the host's
//!    state after every call (a lesson that changed has a higher revision; none goes down),
//!    on every connection's `_axp/memoryChanged` events, and never below a revision already
//!    revealed (in an answer or an event), across failed commits and restarts.
//! 2. *Visibility.* A lesson's evidence is never shown to a caller who cannot read all its
//!    sessions: every lesson in an answer (`memoryPropose`, `memoryReview`, `memorySearch`) cites
//!    only sessions the asker may read; `axp-memory://` events reach only maintainers whose scope
//!    is every session, and so do its snapshots; a working context (`_axp/context`) names no
//!    session the asker may not read.
//! 3. *Search.* What search lists is accepted.

use std::collections::BTreeMap;

use axhost_core::{ConnId, Principal, Role, SessionScope};
use serde_json::Value;

/// Counters for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// Lessons proposed (new or with new evidence) and reviewed, as acknowledged.
    pub proposals: u64,
    /// Reviews acknowledged.
    pub reviews: u64,
    /// Searches answered, and lessons they listed.
    pub searches: (u64, u64),
    /// `_axp/memoryChanged` events checked.
    pub events: u64,
}

/// See the module docs.
#[derive(Default)]
pub struct MemoryOracle {
    /// Each connection's principal.
    conns: BTreeMap<ConnId, Principal>,
    /// The highest revision revealed per lesson.
    revealed: BTreeMap<String, u64>,
    /// The last revision each connection was sent, per lesson.
    seen: BTreeMap<(ConnId, String), u64>,
    /// Each lesson as the last state of this host process had it.
    last: BTreeMap<String, Value>,
    /// Counters.
    pub stats: MemoryStats,
}

fn readable(p: &Principal, session: &str) -> bool {
    session
        .strip_prefix("ahp-session:/")
        .is_some_and(|id| p.can_read_session(id))
}

fn revision(lesson: &Value) -> u64 {
    lesson["revision"].as_u64().unwrap_or(0)
}

impl MemoryOracle {
    /// A connection opened.
    pub fn connected(&mut self, conn: ConnId, principal: &Principal) {
        self.conns.insert(conn, principal.clone());
    }

    /// A connection closed.
    pub fn closed(&mut self, conn: ConnId) {
        self.conns.remove(&conn);
        self.seen.retain(|(c, _), _| *c != conn);
    }

    /// The host process died with its connections.
    pub fn restarted(&mut self) {
        self.conns.clear();
        self.seen.clear();
        self.last.clear();
    }

    /// A failed commit may take the state back to the durable one.
    pub fn rolling_back(&mut self) {
        self.last.clear();
    }

    fn principal(&self, conn: ConnId) -> Result<&Principal, String> {
        self.conns
            .get(&conn)
            .ok_or_else(|| format!("a frame for connection {conn:?}, which has no principal"))
    }

    /// Invariant 2 for one lesson shown to `conn`, and the revision it reveals.
    fn shown(&mut self, conn: ConnId, lesson: &Value, what: &str) -> Result<(), String> {
        let p = self.principal(conn)?;
        for e in lesson["evidence"].as_array().into_iter().flatten() {
            let session = e["session"].as_str().unwrap_or("");
            if !readable(p, session) {
                return Err(format!(
                    "{what} showed {} evidence from {session}, which it may not read: {lesson}",
                    p.id
                ));
            }
        }
        let id = lesson["id"].as_str().unwrap_or("").to_owned();
        let floor = self.revealed.entry(id).or_default();
        *floor = (*floor).max(revision(lesson));
        Ok(())
    }

    /// An `_axp/memoryChanged` envelope for `conn`.
    pub fn on_event(&mut self, conn: ConnId, env: &Value) -> Result<(), String> {
        self.stats.events += 1;
        let p = self.principal(conn)?;
        if p.role != Role::Maintainer || p.sessions != SessionScope::All {
            return Err(format!(
                "{} ({}, scoped: {}) was sent an axp-memory:// event",
                p.id,
                p.role.as_str(),
                p.sessions != SessionScope::All
            ));
        }
        let lesson = &env["action"]["memory"];
        let id = lesson["id"].as_str().unwrap_or("").to_owned();
        let rev = revision(lesson);
        if let Some(before) = self.seen.insert((conn, id.clone()), rev) {
            if rev <= before {
                return Err(format!(
                    "lesson {id}: revision {rev} sent to {conn:?} after revision {before}"
                ));
            }
        }
        self.shown(conn, lesson, "an event")
    }

    /// An answer to `method` for `conn`.
    pub fn on_result(&mut self, conn: ConnId, method: &str, result: &Value) -> Result<(), String> {
        match method {
            "_axp/memoryPropose" | "_axp/memoryReview" => {
                if method == "_axp/memoryPropose" {
                    self.stats.proposals += 1;
                } else {
                    self.stats.reviews += 1;
                }
                self.shown(conn, result, method)
            }
            "_axp/memorySearch" => {
                self.stats.searches.0 += 1;
                let items = result["items"].as_array().cloned().unwrap_or_default();
                self.stats.searches.1 += items.len() as u64;
                let total = result["total"].as_u64().unwrap_or(0);
                if (items.len() as u64) > total {
                    return Err(format!("a search listed more than its total: {result}"));
                }
                for lesson in &items {
                    if lesson["status"] != "accepted" {
                        return Err(format!("a search listed a lesson not accepted: {lesson}"));
                    }
                    self.shown(conn, lesson, method)?;
                }
                Ok(())
            }
            "subscribe" | "initialize" => {
                let snapshots = match method {
                    "subscribe" => vec![result["snapshot"].clone()],
                    _ => result["snapshots"].as_array().cloned().unwrap_or_default(),
                };
                let p = self.principal(conn)?;
                if snapshots.iter().any(|s| s["resource"] == "axp-memory://")
                    && (p.role != Role::Maintainer || p.sessions != SessionScope::All)
                {
                    return Err(format!("{} was sent a snapshot of axp-memory://", p.id));
                }
                Ok(())
            }
            "_axp/context" => {
                let p = self.principal(conn)?;
                let text = result["text"].as_str().unwrap_or("");
                let mut rest = text;
                while let Some(at) = rest.find("ahp-session:/") {
                    let tail = &rest[at..];
                    let end = tail
                        .find(|c: char| c == '"' || c.is_whitespace())
                        .unwrap_or(tail.len());
                    if !readable(p, &tail[..end]) {
                        return Err(format!(
                            "{}'s working context names {}, which it may not read",
                            p.id,
                            &tail[..end]
                        ));
                    }
                    rest = &tail[end..];
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Invariant 1 on the host's `axp-memory://` state after a call.
    pub fn state(&mut self, memory: &Value) -> Result<(), String> {
        let Some(entries) = memory["entries"].as_object() else {
            return Ok(());
        };
        for (id, lesson) in entries {
            let rev = revision(lesson);
            let floor = self.revealed.get(id).copied().unwrap_or(0);
            if rev < floor {
                return Err(format!(
                    "lesson {id} is at revision {rev}, below revision {floor} already revealed"
                ));
            }
            if let Some(before) = self.last.get(id) {
                let was = revision(before);
                if rev < was || (rev == was && before != lesson) {
                    return Err(format!(
                        "lesson {id} went from revision {was} to {rev}: {before} then {lesson}"
                    ));
                }
            }
            if lesson["evidence"].as_array().is_none_or(Vec::is_empty) {
                return Err(format!("lesson {id} holds no evidence"));
            }
        }
        // Lessons are never deleted: not within a process, and not one revealed, ever.
        if let Some(id) = self
            .last
            .keys()
            .chain(self.revealed.keys())
            .find(|id| !entries.contains_key(*id))
        {
            return Err(format!("lesson {id} is gone"));
        }
        self.last = entries.clone().into_iter().collect();
        Ok(())
    }
}
