//! Strict params of the memory commands, as the reference's schemas define them
//! (`src/protocol/schema.ts`): unknown keys, wrong types and values out of range are `-32602`.
//! Lesson texts are checked for length as sent and trimmed only when the lesson is built, as
//! the reference does, so the receipt fingerprints the text as sent.

use serde::{Deserialize, Serialize};

use crate::axp::memory::entry::LessonOutcome;
use crate::axp::params::{js_len, valid_digest, Check, COUNT_MAX};

/// Longest `_axp/memorySearch` query, in UTF-16 code units.
pub(crate) const QUERY_MAX: usize = 4096;
/// Most lessons one search lists.
pub(crate) const SEARCH_LIMIT_MAX: u64 = 20;
/// What one search lists when the caller names no limit.
const SEARCH_LIMIT_DEFAULT: u64 = 5;

fn default_limit() -> u64 {
    SEARCH_LIMIT_DEFAULT
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MemoryProposeParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) title: String,
    pub(crate) trigger: String,
    pub(crate) lesson: String,
    pub(crate) outcome: LessonOutcome,
    pub(crate) from_seq: u64,
    pub(crate) to_seq: u64,
}

/// What a review may set a lesson to.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ReviewStatus {
    Accepted,
    Retired,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MemoryReviewParams {
    pub(crate) channel: String,
    pub(crate) operation_id: String,
    pub(crate) memory_id: String,
    pub(crate) revision: u64,
    pub(crate) status: ReviewStatus,
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct MemorySearchParams {
    pub(crate) channel: String,
    pub(crate) query: String,
    #[serde(default = "default_limit")]
    pub(crate) limit: u64,
}

/// The checks of `_axp/memoryPropose` beyond `channel` and `operationId`.
pub(crate) fn check_propose(p: &MemoryProposeParams, c: &mut Check) {
    for (text, max, field) in [
        (&p.title, 160, "title"),
        (&p.trigger, 1000, "trigger"),
        (&p.lesson, 4000, "lesson"),
    ] {
        c.that(
            (1..=max).contains(&js_len(text)),
            &format!("{field} must be 1 to {max} characters"),
        );
    }
    c.count(p.from_seq, "fromSeq");
    c.count(p.to_seq, "toSeq");
}

/// The checks of `_axp/memoryReview` beyond `channel` and `operationId`.
pub(crate) fn check_review(p: &MemoryReviewParams, c: &mut Check) {
    c.that(
        valid_digest(&p.memory_id),
        "memoryId is not a SHA-256 digest",
    );
    c.that(p.revision <= COUNT_MAX, "revision is above 2^53-1");
}

/// The checks of `_axp/memorySearch` beyond `channel`.
pub(crate) fn check_search(p: &MemorySearchParams, c: &mut Check) {
    c.that(
        js_len(&p.query) <= QUERY_MAX,
        "query must be at most 4096 characters",
    );
    c.that(
        (1..=SEARCH_LIMIT_MAX).contains(&p.limit),
        "limit must be an integer from 1 to 20",
    );
}

#[cfg(test)]
mod tests {
    use crate::axp::params::parse;
    use crate::axp::Method;
    use crate::error::INVALID_PARAMS;
    use serde_json::{json, Value};

    fn code(method: Method, v: Value) -> Option<i64> {
        parse(method, &v.to_string()).err().map(|e| e.code)
    }

    fn propose() -> Value {
        json!({"channel": "axp-session:/s", "operationId": "o", "title": "t", "trigger": "g",
               "lesson": "l", "outcome": "success", "fromSeq": 1, "toSeq": 2})
    }

    #[test]
    fn propose_lengths_count_as_sent_and_every_key_is_required() {
        assert_eq!(code(Method::MemoryPropose, propose()), None);
        let mut p = propose();
        p["title"] = json!("😀".repeat(80));
        assert_eq!(code(Method::MemoryPropose, p.clone()), None, "160 units");
        p["title"] = json!(format!("{}a", "😀".repeat(80)));
        assert_eq!(code(Method::MemoryPropose, p), Some(INVALID_PARAMS));
        // Blank text passes here (its length is counted untrimmed) and is refused later.
        let mut p = propose();
        p["lesson"] = json!("   ");
        assert_eq!(code(Method::MemoryPropose, p), None);
        for (key, bad) in [
            ("title", json!("")),
            ("trigger", json!("x".repeat(1001))),
            ("lesson", json!("x".repeat(4001))),
            ("outcome", json!("partial")),
            ("fromSeq", json!(-1)),
            ("toSeq", json!(9_007_199_254_740_992u64)),
            ("extra", json!(1)),
        ] {
            let mut p = propose();
            p[key] = bad;
            assert_eq!(
                code(Method::MemoryPropose, p),
                Some(INVALID_PARAMS),
                "{key}"
            );
        }
        for key in ["operationId", "title", "outcome", "fromSeq", "toSeq"] {
            let mut p = propose();
            p.as_object_mut().expect("object").remove(key);
            assert_eq!(
                code(Method::MemoryPropose, p),
                Some(INVALID_PARAMS),
                "{key}"
            );
        }
        let mut p = propose();
        p["lesson"] = json!("x".repeat(4000));
        assert_eq!(code(Method::MemoryPropose, p), None);
    }

    #[test]
    fn review_takes_a_digest_a_revision_and_a_final_status() {
        let ok = json!({"channel": "axp-memory://", "operationId": "o",
                        "memoryId": "a".repeat(64), "revision": 1, "status": "accepted"});
        assert_eq!(code(Method::MemoryReview, ok.clone()), None);
        for (key, bad) in [
            ("memoryId", json!("A".repeat(64))),
            ("memoryId", json!("a".repeat(63))),
            ("revision", json!(1.5)),
            ("status", json!("proposed")),
        ] {
            let mut p = ok.clone();
            p[key] = bad;
            assert_eq!(code(Method::MemoryReview, p), Some(INVALID_PARAMS), "{key}");
        }
    }

    #[test]
    fn search_limits_default_to_five_and_stay_within_one_to_twenty() {
        let p = parse(
            Method::MemorySearch,
            r#"{"channel":"ahp-root://","query":"x"}"#,
        )
        .expect("search");
        assert_eq!(p.to_value()["limit"], 5);
        assert_eq!(p.operation_id(), None);
        for limit in [json!(0), json!(21), json!(2.5), json!("5")] {
            let v = json!({"channel": "ahp-root://", "query": "x", "limit": limit});
            assert_eq!(code(Method::MemorySearch, v), Some(INVALID_PARAMS));
        }
        let v = json!({"channel": "ahp-root://", "query": "x".repeat(4097)});
        assert_eq!(code(Method::MemorySearch, v), Some(INVALID_PARAMS));
        let v = json!({"channel": "ahp-root://", "query": "x".repeat(4096), "limit": 20});
        assert_eq!(code(Method::MemorySearch, v), None);
        let v = json!({"channel": "ahp-root://", "limit": 3});
        assert_eq!(code(Method::MemorySearch, v), Some(INVALID_PARAMS));
    }
}
