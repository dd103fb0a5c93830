//! The index against the reference's search, literally ([`reference_search`]), on chosen and on
//! generated lessons and queries.

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::*;
use crate::axp::memory::entry::{memory_id, Evidence, LessonOutcome};

fn entry(scope: &str, title: &str, trigger: &str, lesson: &str, sessions: &[&str]) -> MemoryEntry {
    MemoryEntry {
        scope: scope.into(),
        title: title.into(),
        trigger: trigger.into(),
        lesson: lesson.into(),
        outcome: LessonOutcome::Failure,
        id: memory_id(scope, title, trigger, lesson, LessonOutcome::Failure),
        revision: 1,
        evidence: sessions
            .iter()
            .map(|s| Evidence {
                session: format!("ahp-session:/{s}"),
                from_seq: 1,
                to_seq: 2,
                git_head: None,
            })
            .collect(),
        status: MemoryStatus::Accepted,
        author: "alice".into(),
    }
}

struct Both {
    index: LessonIndex,
    entries: BTreeMap<String, MemoryEntry>,
}

impl Both {
    fn new() -> Both {
        Both {
            index: LessonIndex::new(3),
            entries: BTreeMap::new(),
        }
    }

    fn put(&mut self, e: MemoryEntry) -> String {
        self.index.upsert(&e);
        let id = e.id.clone();
        self.entries.insert(id.clone(), e);
        id
    }

    /// Both searches; asserts they agree and returns the index's answer.
    fn search(
        &self,
        scope: &str,
        query: &str,
        limit: usize,
        can_read: &dyn Fn(&str) -> bool,
    ) -> (Vec<String>, usize) {
        let (ids, total) = self.index.search(scope, query, limit, can_read);
        let want = reference_search(&self.entries, scope, query, limit, can_read);
        assert_eq!((&ids, total), (&want.0, want.1), "query {query:?}");
        (ids.into_iter().map(str::to_owned).collect(), total)
    }
}

#[test]
fn tokens_are_lowercase_unicode_runs_without_repeats() {
    let index = LessonIndex::new(1);
    assert_eq!(
        index.tokens("Ünïcödé FAÇADE_v2, 日本語-テスト 😀 x+y ٣ x Parser-API"),
        [
            "façade_v2",
            "parser-api",
            "x",
            "y",
            "ünïcödé",
            "٣",
            "日本語-テスト"
        ]
    );
    // Marks are not letters: a combining accent splits a run, as `\p{L}` does in the reference.
    assert_eq!(index.tokens("e\u{301}t"), ["e", "t"]);
    assert!(index.tokens("  !? 😀 ").is_empty());
}

#[test]
fn scores_count_distinct_tokens_found_anywhere_in_the_text() {
    let mut b = Both::new();
    let parser = b.put(entry(
        "repo",
        "Parser API",
        "parser edits",
        "Preserve the public return types",
        &["s1"],
    ));
    let retry = b.put(entry(
        "repo",
        "Retry uploads",
        "flaky network",
        "Back off; parse the Retry-After header",
        &["s1"],
    ));
    let other = b.put(entry("elsewhere", "Parser", "parser", "parser", &["s1"]));
    // "pars" is in both (a substring, not a word); "public" only in the first.
    let (ids, total) = b.search("repo", "PARS public pars", 5, &|_| true);
    assert_eq!((ids, total), (vec![parser.clone(), retry.clone()], 2));
    // Ties go by id.
    let (ids, _) = b.search("repo", "pars", 5, &|_| true);
    let mut want = vec![parser.clone(), retry.clone()];
    want.sort();
    assert_eq!(ids, want);
    // Tokens span no separators: "back off" is two tokens, "off;" finds "off".
    assert_eq!(
        b.search("repo", "retry-after", 5, &|_| true).0,
        std::slice::from_ref(&retry)
    );
    assert_eq!(b.search("repo", "api parser", 5, &|_| true).0[0], parser);
    // Nothing found: nothing listed.
    assert_eq!(b.search("repo", "zebra", 5, &|_| true), (vec![], 0));
    // No tokens: every lesson of the scope, by id.
    let (ids, total) = b.search("repo", "?!", 1, &|_| true);
    assert_eq!((ids.len(), total), (1, 2));
    assert_eq!(b.search("elsewhere", "", 5, &|_| true).0, [other]);
    assert_eq!(b.search("nowhere", "", 5, &|_| true), (vec![], 0));
    // The limit cuts the list, never the total.
    assert_eq!(b.search("repo", "pars", 1, &|_| true).1, 2);
    assert_eq!(b.search("repo", "pars", 0, &|_| true), (vec![], 2));
}

#[test]
fn short_tokens_and_unicode_match_inside_words() {
    let mut b = Both::new();
    let greek = b.put(entry("r", "ΟΔΟΣ", "ΑΣ.Β", "naïve café", &["s"]));
    let cjk = b.put(entry("r", "日本語のテスト", "x", "y", &["s"]));
    for q in [
        "ς", "οδος", "ασ", "σ", "é", "ï", "fé", "本", "本語", "のテ", "x", "y", "e",
    ] {
        b.search("r", q, 5, &|_| true);
    }
    // The whole text is lowercased first: "ΟΔΟΣ" ends in a final sigma, "ΑΣ.Β" does not.
    assert_eq!(
        b.search("r", "οδος", 5, &|_| true).0,
        std::slice::from_ref(&greek)
    );
    assert_eq!(b.search("r", "ασ", 5, &|_| true).0, [greek]);
    assert_eq!(b.search("r", "本語", 5, &|_| true).0, [cjk]);
}

#[test]
fn only_lessons_whose_evidence_the_caller_reads_are_counted() {
    let mut b = Both::new();
    let mine = b.put(entry("r", "cache keys", "t", "l", &["s1"]));
    let shared = b.put(entry("r", "cache misses", "t", "l", &["s1", "s2"]));
    let theirs = b.put(entry("r", "cache warmup", "t", "l", &["s2"]));
    let asked = RefCell::new(BTreeSet::new());
    let asks = RefCell::new(0);
    let only_s1 = |s: &str| {
        *asks.borrow_mut() += 1;
        asked.borrow_mut().insert(s.to_owned());
        s == "ahp-session:/s1"
    };
    let (ids, total) = b.index.search("r", "cache", 5, &only_s1);
    assert_eq!((ids, total), (vec![mine.as_str()], 1));
    // Each session is asked about once per search, whatever the number of lessons.
    assert_eq!(*asks.borrow(), 2);
    assert_eq!(asked.borrow().len(), 2);
    b.search("r", "cache", 5, &only_s1);
    let mut all = vec![mine, shared, theirs];
    all.sort();
    assert_eq!(b.search("r", "cache", 5, &|_| true).0, all);
    assert_eq!(b.search("r", "cache", 5, &|_| false), (vec![], 0));
}

#[test]
fn status_changes_and_removals_apply_at_once() {
    let mut b = Both::new();
    let mut e = entry("r", "lock order", "t", "l", &["s1"]);
    e.status = MemoryStatus::Proposed;
    let id = b.put(e.clone());
    assert_eq!(b.search("r", "lock", 5, &|_| true).1, 0);
    e.status = MemoryStatus::Accepted;
    b.put(e.clone());
    assert_eq!(
        b.search("r", "lock", 5, &|_| true).0,
        std::slice::from_ref(&id)
    );
    e.status = MemoryStatus::Retired;
    b.put(e.clone());
    assert_eq!(b.search("r", "lock", 5, &|_| true).1, 0);
    e.status = MemoryStatus::Accepted;
    e.evidence.push(Evidence {
        session: "ahp-session:/s2".into(),
        from_seq: 3,
        to_seq: 4,
        git_head: None,
    });
    b.put(e.clone());
    assert_eq!(
        b.search("r", "lock", 5, &|s| s == "ahp-session:/s1").1,
        0,
        "new evidence narrows who sees it"
    );
    b.index.remove(&id);
    b.entries.remove(&id);
    assert_eq!(b.search("r", "lock", 5, &|_| true).1, 0);
    b.put(e);
    assert_eq!(b.search("r", "lock", 5, &|_| true).0, [id]);
}

#[test]
fn a_trigram_held_by_many_words_keeps_exactly_the_lessons_holding_it() {
    let mut b = Both::new();
    // Words "xabcN" for N in 0..300, one a lesson, some lessons also holding "abx": "abc"
    // turns heavy at the 128th word, with lessons indexed before and after.
    for n in 0..300 {
        let other = if n % 3 == 0 { "abx" } else { "zzz" };
        b.put(entry("r", &format!("x{n}abc{n}"), other, "l", &["s"]));
        if n % 50 == 0 {
            b.search("r", "abc", 20, &|_| true);
        }
    }
    let (_, total) = b.search("r", "abc", 20, &|_| true);
    assert_eq!(total, 300);
    assert_eq!(b.search("r", "abx", 20, &|_| true).1, 100);
    assert_eq!(b.search("r", "bc1", 20, &|_| true).1, 111);
    b.search("r", "abc abx 7ab zz", 20, &|_| true);
    assert!(!b.index.heavy.is_empty());
}

/// Random lessons over a small alphabet (so tokens hit often and in many ways), with Unicode,
/// separators and mixed case; random queries from pieces of them and from nothing.
#[test]
fn generated_lessons_and_queries_agree_with_the_reference() {
    const ALPHABET: &[char] = &[
        'a', 'b', 'c', 'A', 'B', '_', '-', '1', 'é', 'Σ', 'ς', 'σ', '本', ' ', ' ', '.', ',',
    ];
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let text = |rng: &mut ChaCha8Rng, max: usize| -> String {
        let len = rng.random_range(1..=max);
        (0..len)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
            .collect()
    };
    let mut b = Both::new();
    for i in 0..400 {
        let sessions: Vec<String> = (0..rng.random_range(1..=3))
            .map(|_| format!("s{}", rng.random_range(0..6)))
            .collect();
        let refs: Vec<&str> = sessions.iter().map(String::as_str).collect();
        let scope = if i % 17 == 0 { "other" } else { "r" };
        let mut e = entry(
            scope,
            &text(&mut rng, 12),
            &text(&mut rng, 20),
            &text(&mut rng, 60),
            &refs,
        );
        e.status = match rng.random_range(0..5) {
            0 => MemoryStatus::Proposed,
            1 => MemoryStatus::Retired,
            _ => MemoryStatus::Accepted,
        };
        b.put(e);
    }
    for _ in 0..600 {
        let query = text(&mut rng, 14);
        let limit = rng.random_range(1..=20);
        let hidden = format!("ahp-session:/s{}", rng.random_range(0..6));
        b.search("r", &query, limit, &|s| s != hidden);
        // Only one session readable: visibility is worked out from the readable side.
        b.search("r", &query, limit, &|s| s == hidden);
        b.search("r", &query, 400, &|_| true);
    }
    b.search("r", "", 400, &|_| true);
    b.search("r", "", 7, &|s| s == "ahp-session:/s1");
    b.search("other", "a", 7, &|_| true);
}
