//! Repository memory, `axp-memory://`: lessons contributors propose from the evidence of their
//! sessions, maintainers accept or retire, and everyone recalls by search, each caller seeing
//! only lessons whose every evidence session it may read.
//!
//! A lesson is stored as its own record (`Table::Memory`, keyed by id, one small write per
//! change) and announced with `_axp/memoryChanged` on the memory channel, numbered with the
//! host-global `serverSeq` like every event. The host keeps every lesson in memory, with the
//! search index ([`index`]) over their text, and rebuilds a lesson from the store when a commit
//! that touched it fails.

mod commands;
pub(crate) mod entry;
mod index;
pub(crate) mod params;
mod postings;

use std::collections::BTreeMap;

use serde_json::{json, Value};

use crate::axp::json_text;
use crate::axp::memory::entry::MemoryEntry;
use crate::axp::memory::index::LessonIndex;
use crate::channel::MEMORY;
use crate::error::RpcError;
use crate::kernel::Kernel;
use crate::limits::MEMORY_SNAPSHOT_BYTES_MAX;
use crate::log::change::{Record, StoredRecord, Table};
use crate::log::store::Store;
use crate::principal::Principal;

/// The lessons and their index. See the module docs.
pub(crate) struct Memory {
    /// By id: the channel state's order.
    entries: BTreeMap<String, MemoryEntry>,
    index: LessonIndex,
    /// Bytes of JSON the entries take in a snapshot (what the snapshot bound is checked on
    /// without building it).
    json_bytes: usize,
}

impl Memory {
    /// No lessons; the index's hash maps keyed from `seed`.
    pub(crate) fn new(seed: u64) -> Memory {
        Memory {
            entries: BTreeMap::new(),
            index: LessonIndex::new(seed),
            json_bytes: 0,
        }
    }

    /// The lessons the store holds; `Err(key)` names a record that cannot be read.
    pub(crate) fn load(records: &[StoredRecord], seed: u64) -> Result<Memory, String> {
        let mut memory = Memory::new(seed);
        for r in records.iter().filter(|r| r.table == Table::Memory) {
            let entry: MemoryEntry = serde_json::from_slice(&r.value).map_err(|_| r.key.clone())?;
            if entry.id != r.key {
                return Err(r.key.clone());
            }
            memory.upsert(entry);
        }
        Ok(memory)
    }

    /// Lesson `id`.
    pub(crate) fn get(&self, id: &str) -> Option<&MemoryEntry> {
        self.entries.get(id)
    }

    /// How many lessons there are (every status).
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Sets `entry` (the `_axp/memoryChanged` reducer: an upsert by id), indexing it.
    pub(crate) fn upsert(&mut self, entry: MemoryEntry) {
        self.index.upsert(&entry);
        self.json_bytes += entry_json_bytes(&entry);
        if let Some(old) = self.entries.insert(entry.id.clone(), entry) {
            self.json_bytes -= entry_json_bytes(&old);
        }
    }

    fn remove(&mut self, id: &str) {
        self.index.remove(id);
        if let Some(old) = self.entries.remove(id) {
            self.json_bytes -= entry_json_bytes(&old);
        }
    }

    /// The record that stores `entry`.
    pub(crate) fn record(entry: &MemoryEntry) -> Record {
        Record::json(Table::Memory, entry.id.clone(), &json_text(entry))
    }

    /// Rebuilds lesson `id` as the store and the changes in flight have it, after a failure.
    pub(crate) fn rebuild<S: Store>(&mut self, k: &mut Kernel<S>, id: &str) {
        let stored = k
            .view()
            .record(Table::Memory, id)
            .unwrap_or_else(|e| panic!("lesson {id} cannot be rebuilt: {e}"));
        match stored.and_then(|v| serde_json::from_slice::<MemoryEntry>(&v).ok()) {
            Some(entry) => self.upsert(entry),
            None => self.remove(id),
        }
    }

    /// The state of `axp-memory://`: `{resource, entries}`.
    pub(crate) fn json(&self) -> Value {
        let entries: serde_json::Map<String, Value> = self
            .entries
            .iter()
            .map(|(id, e)| (id.clone(), serde_json::to_value(e).unwrap_or(Value::Null)))
            .collect();
        json!({ "resource": MEMORY, "entries": entries })
    }

    /// Bytes the `entries` object takes in the channel's state (at most one more).
    pub(crate) fn json_bytes(&self) -> usize {
        self.json_bytes + 2
    }

    /// `-32043` if the state is too large to send as one snapshot
    /// ([`MEMORY_SNAPSHOT_BYTES_MAX`]).
    pub(crate) fn snapshot_fits(&self) -> Result<(), RpcError> {
        if self.json_bytes() > MEMORY_SNAPSHOT_BYTES_MAX {
            return Err(RpcError::limit(
                "Repository memory is too large for one snapshot; use _axp/memorySearch",
            ));
        }
        Ok(())
    }

    /// The reference's search over this host's lessons: those of `scope` that are `accepted`
    /// and whose every evidence session (`ahp-session:/ID`, as `Evidence::session` spells it)
    /// `can_read` allows, scored by how many distinct tokens of `query` (lowercase runs of
    /// letters, numbers, `_` and `-`) their lowercase `title trigger lesson` holds, best first
    /// and then by id; those scoring zero are left out unless the query has no tokens. The first
    /// `limit`, and how many there are in all. `can_read` is asked at most once per session.
    pub(crate) fn search(
        &self,
        scope: &str,
        query: &str,
        limit: usize,
        can_read: &dyn Fn(&str) -> bool,
    ) -> (Vec<&MemoryEntry>, usize) {
        let (ids, total) = self.index.search(scope, query, limit, can_read);
        let items = ids
            .into_iter()
            .filter_map(|id| self.entries.get(id))
            .collect();
        (items, total)
    }
}

/// Whether `principal` may read evidence session `session` (`ahp-session:/ID`), as the
/// reference's `readable` decides it: the `can_read` of [`Memory::search`] for a caller.
pub(crate) fn can_read_evidence(principal: &Principal, session: &str) -> bool {
    session
        .strip_prefix("ahp-session:/")
        .is_some_and(|id| principal.can_read_session(id))
}

/// What `entry` adds to the channel's JSON: itself and its key.
fn entry_json_bytes(entry: &MemoryEntry) -> usize {
    json_text(entry).len() + entry.id.len() + 4
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::axp::memory::entry::{Evidence, LessonOutcome, MemoryStatus};

    fn lesson(title: &str, status: MemoryStatus, session: &str) -> MemoryEntry {
        let id = entry::memory_id("repo", title, "when", "do", LessonOutcome::Success);
        MemoryEntry {
            scope: "repo".into(),
            title: title.into(),
            trigger: "when".into(),
            lesson: "do".into(),
            outcome: LessonOutcome::Success,
            id,
            revision: 1,
            evidence: vec![Evidence {
                session: format!("ahp-session:/{session}"),
                from_seq: 1,
                to_seq: 1,
                git_head: None,
            }],
            status,
            author: "a".into(),
        }
    }

    #[test]
    fn loading_restores_entries_and_their_index() {
        let a = lesson("parser api", MemoryStatus::Accepted, "s1");
        let b = lesson("parser bug", MemoryStatus::Proposed, "s1");
        let records: Vec<StoredRecord> = [&a, &b]
            .iter()
            .map(|e| StoredRecord {
                table: Table::Memory,
                key: e.id.clone(),
                value: json_text(*e).into_bytes().into(),
            })
            .collect();
        let m = Memory::load(&records, 7).expect("load");
        assert_eq!(m.len(), 2);
        let (items, total) = m.search("repo", "parser", 5, &|_| true);
        assert_eq!((items, total), (vec![&a], 1));
        let state = m.json();
        assert_eq!(state["resource"], MEMORY);
        assert_eq!(state["entries"][&b.id]["status"], "proposed");
        let exact: usize = state["entries"].to_string().len();
        assert!(m.json_bytes() >= exact, "{} < {exact}", m.json_bytes());
        let mut bad = records[0].clone();
        bad.key = "other".into();
        assert_eq!(Memory::load(&[bad], 7).err(), Some("other".to_owned()));
    }

    #[test]
    fn an_upsert_replaces_and_a_removal_hides() {
        let mut m = Memory::new(1);
        let mut a = lesson("flaky upload", MemoryStatus::Proposed, "s1");
        m.upsert(a.clone());
        assert_eq!(m.search("repo", "upload", 5, &|_| true).1, 0);
        a.status = MemoryStatus::Accepted;
        a.revision = 2;
        m.upsert(a.clone());
        assert_eq!(m.search("repo", "upload", 5, &|_| true).1, 1);
        assert_eq!(m.get(&a.id).map(|e| e.revision), Some(2));
        let before = m.json_bytes();
        m.remove(&a.id);
        assert_eq!(m.search("repo", "upload", 5, &|_| true).1, 0);
        assert!(m.json_bytes() < before);
        assert_eq!(m.len(), 0);
        m.upsert(a.clone());
        assert_eq!(m.search("repo", "", 5, &|_| true), (vec![&a], 1));
    }
}
