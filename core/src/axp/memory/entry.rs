//! A lesson of repository memory (`axp-memory://`), shaped as the reference host writes it
//! (`Memory` in its `src/protocol/types.ts`), and its content-derived id.

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::canonical::hash_object;

/// What the lesson's episode came to.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LessonOutcome {
    Success,
    Failure,
}

impl LessonOutcome {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LessonOutcome::Success => "success",
            LessonOutcome::Failure => "failure",
        }
    }
}

/// Where a lesson stands. Only `accepted` lessons are recalled.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum MemoryStatus {
    Proposed,
    Accepted,
    Retired,
}

/// A span of one session's history that the lesson was drawn from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Evidence {
    /// `ahp-session:/ID`.
    pub(crate) session: String,
    pub(crate) from_seq: u64,
    pub(crate) to_seq: u64,
    /// The session's checkpoint head when the evidence was added.
    pub(crate) git_head: Option<String>,
}

/// One lesson. Field order is the reference's (content first, then bookkeeping), so the JSON
/// reads the same in its clients.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MemoryEntry {
    /// The repository the lesson belongs to.
    pub(crate) scope: String,
    pub(crate) title: String,
    pub(crate) trigger: String,
    pub(crate) lesson: String,
    pub(crate) outcome: LessonOutcome,
    /// [`memory_id`] of the content above: a lesson's text never changes.
    pub(crate) id: String,
    /// 1 when first proposed, then one more for each change.
    pub(crate) revision: u64,
    pub(crate) evidence: Vec<Evidence>,
    pub(crate) status: MemoryStatus,
    /// Who first proposed it.
    pub(crate) author: String,
}

/// The reference's lesson id: SHA-256 of the canonical JSON of
/// `{scope, title, trigger, lesson, outcome}` (texts as stored, i.e. trimmed).
pub(crate) fn memory_id(
    scope: &str,
    title: &str,
    trigger: &str,
    lesson: &str,
    outcome: LessonOutcome,
) -> String {
    hash_object(&json!({
        "scope": scope,
        "title": title,
        "trigger": trigger,
        "lesson": lesson,
        "outcome": outcome.as_str(),
    }))
}

impl MemoryEntry {
    /// The text search matches against, as the reference builds it before lowercasing.
    pub(crate) fn search_text(&self) -> String {
        format!("{} {} {}", self.title, self.trigger, self.lesson)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed by `core/testdata/memory_id.mjs` with Node.js (sorted keys,
    /// `JSON.stringify`, SHA-256 hex), independently of this crate; its output is
    /// `core/testdata/memory_id.json`.
    #[test]
    fn ids_equal_what_the_reference_computes() {
        let vectors: serde_json::Value =
            serde_json::from_str(include_str!("../../../testdata/memory_id.json"))
                .expect("vectors");
        let vectors = vectors.as_array().expect("array");
        assert!(vectors.len() >= 3);
        for v in vectors {
            let outcome: LessonOutcome =
                serde_json::from_value(v["outcome"].clone()).expect("outcome");
            let id = memory_id(
                v["scope"].as_str().expect("scope"),
                v["title"].as_str().expect("title"),
                v["trigger"].as_str().expect("trigger"),
                v["lesson"].as_str().expect("lesson"),
                outcome,
            );
            assert_eq!(id, v["id"].as_str().expect("id"), "{v}");
        }
    }

    #[test]
    fn an_entry_reads_in_the_reference_order() {
        let e = MemoryEntry {
            scope: "r".into(),
            title: "t".into(),
            trigger: "g".into(),
            lesson: "l".into(),
            outcome: LessonOutcome::Failure,
            id: "i".into(),
            revision: 1,
            evidence: vec![Evidence {
                session: "ahp-session:/s".into(),
                from_seq: 1,
                to_seq: 2,
                git_head: None,
            }],
            status: MemoryStatus::Proposed,
            author: "a".into(),
        };
        let text = serde_json::to_string(&e).expect("json");
        assert_eq!(
            text,
            r#"{"scope":"r","title":"t","trigger":"g","lesson":"l","outcome":"failure","id":"i","revision":1,"evidence":[{"session":"ahp-session:/s","fromSeq":1,"toSeq":2,"gitHead":null}],"status":"proposed","author":"a"}"#
        );
        let back: MemoryEntry = serde_json::from_str(&text).expect("back");
        assert_eq!(back, e);
        assert_eq!(e.search_text(), "t g l");
    }
}
