//! The lesson search index: the reference's scoring, exactly, without reading every lesson.
//!
//! The reference scores a lesson by how many distinct query tokens (lowercase runs of
//! `[\p{L}\p{N}_-]`) are substrings of its lowercase `title trigger lesson`. A token holds no
//! character outside that class, so it can only occur inside one of the text's own maximal runs
//! of the class (its *words*): "token in text" is exactly "token in one of the text's words".
//! The index therefore keeps
//! - the distinct words of all lessons, each with the lessons holding it, and for every byte
//!   trigram the words holding it: a token of three or more characters is looked for only in
//!   the words that hold its rarest trigram, then each match brings its lessons;
//! - for every single character and pair of adjacent characters inside a word, the lessons
//!   holding it: a token of one or two characters is answered from there directly (such tokens
//!   occur in most words, and uniting those words' lessons would cost more than the scan).
//!
//! Every answer is exact: no lesson is scored from an estimate. A lesson's text never changes
//! (its id is the hash of it), so each lesson is indexed once, into a slot numbered in
//! indexing order; status and evidence, which do change, are kept per slot and checked at query
//! time. A lesson removed by a rolled-back commit keeps its slot, unmarked; its id, and so its
//! text, is the same if it is proposed again.

use regex::Regex;

use crate::axp::memory::entry::{MemoryEntry, MemoryStatus};
use crate::axp::memory::postings::Postings;
use crate::hash::{SecretMap, SecretState};

/// What a query token is made of, and what the reference splits queries with.
pub(crate) const TOKEN_PATTERN: &str = r"[\p{L}\p{N}_-]+";

/// [`TOKEN_PATTERN`], compiled once per process (its Unicode classes take milliseconds).
fn token_regex() -> &'static Regex {
    static TOKENS: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    // A fixed pattern: it compiles.
    TOKENS.get_or_init(|| Regex::new(TOKEN_PATTERN).unwrap_or_else(|e| panic!("{e}")))
}

/// Dense tables for pairs of ASCII characters: 128 single characters, then 128 × 128 pairs.
const ASCII_GRAMS: usize = 128 + 128 * 128;

/// One indexed lesson.
#[derive(Debug)]
struct Slot {
    id: String,
    /// The id's first 16 hex digits, for ordering without comparing strings.
    key: u64,
    scope: u32,
    /// Its evidence sessions, interned.
    sessions: Vec<u32>,
}

/// Strings numbered in the order first seen.
#[derive(Debug)]
struct Interner {
    ids: SecretMap<String, u32>,
    names: Vec<String>,
}

impl Interner {
    fn new(secret: SecretState) -> Interner {
        Interner {
            ids: SecretMap::with_hasher(secret),
            names: Vec::new(),
        }
    }

    fn intern(&mut self, s: &str) -> u32 {
        if let Some(&n) = self.ids.get(s) {
            return n;
        }
        let n = self.names.len() as u32;
        self.names.push(s.to_owned());
        self.ids.insert(s.to_owned(), n);
        n
    }

    fn get(&self, s: &str) -> Option<u32> {
        self.ids.get(s).copied()
    }
}

/// The index. See the module docs.
pub(crate) struct LessonIndex {
    tokens: &'static Regex,
    slots: Vec<Slot>,
    slot_of: SecretMap<String, u32>,
    /// Bit per slot: the lesson is present and `accepted`.
    accepted: Vec<u64>,
    scopes: Interner,
    sessions: Interner,
    /// Distinct words of all lessons, and the lessons holding each.
    words: SecretMap<Box<str>, u32>,
    word_text: Vec<Box<str>>,
    word_lessons: Vec<Postings>,
    /// Byte trigram (`b0 << 16 | b1 << 8 | b2`) → words holding it, ascending.
    trigram_words: SecretMap<u32, Vec<u32>>,
    /// Lessons holding a single ASCII character or pair of them inside a word.
    ascii_grams: Vec<Postings>,
    /// The same for characters and pairs outside ASCII, by [`gram_key`].
    grams: SecretMap<u64, Postings>,
}

/// Key of one character, or of a pair (characters are below 2^21).
fn gram_key(a: char, b: Option<char>) -> u64 {
    match b {
        None => u64::from(a),
        Some(b) => (1 << 63) | (u64::from(a) << 21) | u64::from(b),
    }
}

/// Index into the dense ASCII table, if both characters are ASCII.
fn ascii_gram(a: char, b: Option<char>) -> Option<usize> {
    let a = u8::try_from(a).ok().filter(u8::is_ascii)?;
    match b {
        None => Some(usize::from(a)),
        Some(b) => {
            let b = u8::try_from(b).ok().filter(u8::is_ascii)?;
            Some(128 + usize::from(a) * 128 + usize::from(b))
        }
    }
}

fn trigram(w: &[u8]) -> u32 {
    u32::from(w[0]) << 16 | u32::from(w[1]) << 8 | u32::from(w[2])
}

/// The first 16 hex digits of an id as a number (hex digits order as their values do).
fn id_key(id: &str) -> u64 {
    let prefix = id.get(..16).unwrap_or(id);
    u64::from_str_radix(prefix, 16).unwrap_or(0)
}

/// A candidate in the ranking: score (higher first), then id (lower first).
#[derive(Clone, Copy)]
struct Ranked {
    score: u32,
    key: u64,
    slot: u32,
}

impl LessonIndex {
    /// An empty index whose maps hash with secrets derived from `seed`.
    pub(crate) fn new(seed: u64) -> LessonIndex {
        let secret = |purpose| SecretState::derive(seed, purpose);
        LessonIndex {
            tokens: token_regex(),
            slots: Vec::new(),
            slot_of: SecretMap::with_hasher(secret("memory slots")),
            accepted: Vec::new(),
            scopes: Interner::new(secret("memory scopes")),
            sessions: Interner::new(secret("memory sessions")),
            words: SecretMap::with_hasher(secret("memory words")),
            word_text: Vec::new(),
            word_lessons: Vec::new(),
            trigram_words: SecretMap::with_hasher(secret("memory trigrams")),
            ascii_grams: vec![Postings::default(); ASCII_GRAMS],
            grams: SecretMap::with_hasher(secret("memory grams")),
        }
    }

    /// The reference's query tokens: lowercase, split into runs of the token class, distinct.
    pub(crate) fn tokens(&self, query: &str) -> Vec<String> {
        let lower = query.to_lowercase();
        let mut tokens: Vec<String> = self
            .tokens
            .find_iter(&lower)
            .map(|m| m.as_str().to_owned())
            .collect();
        tokens.sort_unstable();
        tokens.dedup();
        tokens
    }

    /// Records `entry` as it now is: its text indexed the first time its id is seen, its status
    /// and evidence sessions every time.
    pub(crate) fn upsert(&mut self, entry: &MemoryEntry) {
        let slot = match self.slot_of.get(entry.id.as_str()) {
            Some(&slot) => slot,
            None => self.add(entry),
        };
        let sessions: Vec<u32> = entry
            .evidence
            .iter()
            .map(|e| self.sessions.intern(&e.session))
            .collect();
        self.slots[slot as usize].sessions = sessions;
        self.mark(slot, entry.status == MemoryStatus::Accepted);
    }

    /// Lesson `id` is gone (its proposal was rolled back): never a candidate again unless it
    /// is upserted.
    pub(crate) fn remove(&mut self, id: &str) {
        if let Some(&slot) = self.slot_of.get(id) {
            self.mark(slot, false);
        }
    }

    fn mark(&mut self, slot: u32, accepted: bool) {
        let word = slot as usize / 64;
        if word >= self.accepted.len() {
            self.accepted.resize(word + 1, 0);
        }
        if accepted {
            self.accepted[word] |= 1 << (slot % 64);
        } else {
            self.accepted[word] &= !(1 << (slot % 64));
        }
    }

    /// Indexes a new lesson's text; its slot.
    fn add(&mut self, entry: &MemoryEntry) -> u32 {
        let slot = self.slots.len() as u32;
        let slots = self.slots.len() + 1;
        let scope = self.scopes.intern(&entry.scope);
        self.slots.push(Slot {
            id: entry.id.clone(),
            key: id_key(&entry.id),
            scope,
            sessions: Vec::new(),
        });
        self.slot_of.insert(entry.id.clone(), slot);
        // The whole text is lowercased before it is split, as the reference does (a final
        // sigma depends on what follows it, across separators).
        let text = entry.search_text().to_lowercase();
        let runs: Vec<(usize, usize)> = self
            .tokens
            .find_iter(&text)
            .map(|m| (m.start(), m.end()))
            .collect();
        for (start, end) in runs {
            let word = &text[start..end];
            let w = self.word(word);
            self.word_lessons[w as usize].add(slot, slots);
            let mut prev: Option<char> = None;
            for c in word.chars() {
                self.gram(c, None, slot, slots);
                if let Some(p) = prev {
                    self.gram(p, Some(c), slot, slots);
                }
                prev = Some(c);
            }
        }
        slot
    }

    /// The number of `word`, added to the vocabulary if new.
    fn word(&mut self, word: &str) -> u32 {
        if let Some(&w) = self.words.get(word) {
            return w;
        }
        let w = self.word_text.len() as u32;
        self.word_text.push(word.into());
        self.word_lessons.push(Postings::default());
        self.words.insert(word.into(), w);
        for t in word.as_bytes().windows(3) {
            let list = self.trigram_words.entry(trigram(t)).or_default();
            if list.last() != Some(&w) {
                list.push(w);
            }
        }
        w
    }

    fn gram(&mut self, a: char, b: Option<char>, slot: u32, slots: usize) {
        match ascii_gram(a, b) {
            Some(i) => self.ascii_grams[i].add(slot, slots),
            None => self
                .grams
                .entry(gram_key(a, b))
                .or_default()
                .add(slot, slots),
        }
    }

    /// ORs into `out` the slots whose text holds `token` (one of [`Self::tokens`]).
    fn token_lessons(&self, token: &str, out: &mut [u64]) {
        let mut chars = token.chars();
        let (Some(a), b, None) = (chars.next(), chars.next(), chars.next()) else {
            return self.long_token_lessons(token, out);
        };
        let postings = match ascii_gram(a, b) {
            Some(i) => self.ascii_grams.get(i),
            None => self.grams.get(&gram_key(a, b)),
        };
        if let Some(p) = postings {
            p.or_into(out);
        }
    }

    /// A token of three or more characters (so three or more bytes): the words holding its
    /// rarest byte trigram that hold all of it, and their lessons.
    fn long_token_lessons(&self, token: &str, out: &mut [u64]) {
        let mut rarest: Option<&Vec<u32>> = None;
        for t in token.as_bytes().windows(3) {
            match self.trigram_words.get(&trigram(t)) {
                // A trigram no word holds: neither does any word hold the token.
                None => return,
                Some(list) if rarest.is_none_or(|r| list.len() < r.len()) => rarest = Some(list),
                Some(_) => {}
            }
        }
        for &w in rarest.into_iter().flatten() {
            if self.word_text[w as usize].contains(token) {
                self.word_lessons[w as usize].or_into(out);
            }
        }
    }

    /// The reference's `search`: lessons of `scope` that are accepted and whose every
    /// evidence session `can_read` allows (asked once per session), scored by how many
    /// distinct query tokens their text holds; those scoring above zero (all of them for a
    /// query without tokens), best first, then by id. The ids of the first `limit`, and how
    /// many there are in all.
    pub(crate) fn search(
        &self,
        scope: &str,
        query: &str,
        limit: usize,
        can_read: &dyn Fn(&str) -> bool,
    ) -> (Vec<&str>, usize) {
        let Some(scope) = self.scopes.get(scope) else {
            return (Vec::new(), 0);
        };
        let n = self.slots.len();
        let words = n.div_ceil(64);
        let tokens = self.tokens(query);
        let mut scores = vec![0u32; if tokens.is_empty() { 0 } else { n }];
        // Lessons that could score: accepted, holding at least one token.
        let mut matched = vec![0u64; words];
        if tokens.is_empty() {
            for (m, a) in matched.iter_mut().zip(&self.accepted) {
                *m = *a;
            }
        } else {
            let mut these = vec![0u64; words];
            for t in &tokens {
                these.fill(0);
                self.token_lessons(t, &mut these);
                for (i, (w, m)) in these.iter().zip(matched.iter_mut()).enumerate() {
                    let mut w = *w & self.accepted.get(i).copied().unwrap_or(0);
                    *m |= w;
                    while w != 0 {
                        scores[i * 64 + w.trailing_zeros() as usize] += 1;
                        w &= w - 1;
                    }
                }
            }
        }
        // Whether each evidence session may be read: 0 not asked yet, 1 yes, 2 no.
        let mut readable = vec![0u8; self.sessions.names.len()];
        let mut visible = |slot: &Slot| {
            slot.sessions.iter().all(|&s| {
                let known = &mut readable[s as usize];
                if *known == 0 {
                    *known = if can_read(&self.sessions.names[s as usize]) {
                        1
                    } else {
                        2
                    };
                }
                *known == 1
            })
        };
        let mut total = 0;
        let mut best: Vec<Ranked> = Vec::with_capacity(limit + 1);
        for (i, &w) in matched.iter().enumerate() {
            let mut w = w;
            while w != 0 {
                let s = i * 64 + w.trailing_zeros() as usize;
                w &= w - 1;
                let slot = &self.slots[s];
                if slot.scope != scope || !visible(slot) {
                    continue;
                }
                total += 1;
                let r = Ranked {
                    score: scores.get(s).copied().unwrap_or(0),
                    key: slot.key,
                    slot: s as u32,
                };
                self.keep(&mut best, r, limit);
            }
        }
        let ids = best
            .iter()
            .map(|r| self.slots[r.slot as usize].id.as_str())
            .collect();
        (ids, total)
    }

    /// Whether `a` ranks before `b`.
    fn before(&self, a: &Ranked, b: &Ranked) -> bool {
        if a.score != b.score {
            return a.score > b.score;
        }
        if a.key != b.key {
            return a.key < b.key;
        }
        self.slots[a.slot as usize].id < self.slots[b.slot as usize].id
    }

    /// Keeps `best` the first `limit` candidates in rank order, with `r` considered.
    fn keep(&self, best: &mut Vec<Ranked>, r: Ranked, limit: usize) {
        if limit == 0 {
            return;
        }
        if best.len() == limit {
            match best.last() {
                Some(last) if self.before(&r, last) => {
                    best.pop();
                }
                _ => return,
            }
        }
        let at = best.partition_point(|x| self.before(x, &r));
        best.insert(at, r);
    }

    /// Sizes of the index, for the benchmark and the docs.
    pub(crate) fn stats(&self) -> IndexStats {
        let grams: usize = self
            .ascii_grams
            .iter()
            .chain(self.grams.values())
            .map(Postings::heap_bytes)
            .sum();
        let words: usize = self
            .word_lessons
            .iter()
            .map(Postings::heap_bytes)
            .sum::<usize>()
            + self
                .word_text
                .iter()
                .map(|w| w.len() * 2 + 24)
                .sum::<usize>();
        let trigrams: usize = self
            .trigram_words
            .values()
            .map(|l| l.capacity() * 4 + 32)
            .sum();
        IndexStats {
            lessons: self.slots.len(),
            words: self.word_text.len(),
            index_bytes: grams + words + trigrams,
        }
    }
}

/// How big the index is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IndexStats {
    pub(crate) lessons: usize,
    pub(crate) words: usize,
    /// Approximate heap bytes of the postings, the vocabulary and its trigrams.
    pub(crate) index_bytes: usize,
}

/// The reference's search, literally (for tests): every lesson's lowercase text scanned for
/// every token.
#[cfg(test)]
pub(crate) fn reference_search<'a>(
    entries: &'a std::collections::BTreeMap<String, MemoryEntry>,
    scope: &str,
    query: &str,
    limit: usize,
    can_read: &dyn Fn(&str) -> bool,
) -> (Vec<&'a str>, usize) {
    static RE: std::sync::OnceLock<Regex> = std::sync::OnceLock::new();
    let re = RE.get_or_init(|| Regex::new(TOKEN_PATTERN).expect("pattern"));
    let lower = query.to_lowercase();
    let mut words: Vec<&str> = re.find_iter(&lower).map(|m| m.as_str()).collect();
    words.sort_unstable();
    words.dedup();
    let mut matches: Vec<(usize, &str)> = entries
        .values()
        .filter(|m| {
            m.scope == scope
                && m.status == MemoryStatus::Accepted
                && m.evidence.iter().all(|e| can_read(&e.session))
        })
        .map(|m| {
            let text = m.search_text().to_lowercase();
            let score = words.iter().filter(|w| text.contains(**w)).count();
            (score, m.id.as_str())
        })
        .filter(|(score, _)| words.is_empty() || *score > 0)
        .collect();
    matches.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    let total = matches.len();
    (
        matches.into_iter().take(limit).map(|(_, id)| id).collect(),
        total,
    )
}

#[cfg(test)]
mod tests;
