//! The lesson search index: the reference's scoring, exactly, without reading every lesson.
//!
//! The reference scores a lesson by how many distinct query tokens (lowercase runs of
//! `[\p{L}\p{N}_-]`) are substrings of its lowercase `title trigger lesson`. A token holds no
//! character outside that class, so it can only occur inside one of the text's own maximal runs
//! of the class (its *words*): "token in text" is exactly "token in one of the text's words".
//! The index therefore keeps
//! - the distinct words of all lessons, each with the lessons holding it, and for every byte
//!   trigram the words holding it: a token of three or more characters is looked for only in
//!   the words that hold all its trigrams, then each match brings its lessons. A trigram held
//!   by many words (a *heavy* one, [`HEAVY_WORDS`]) also keeps the lessons holding it, so a
//!   three-byte token such as "the" is one set, not the union of hundreds;
//! - for every single character and pair of adjacent characters inside a word, the lessons
//!   holding it: a token of one or two characters is answered from there directly (such tokens
//!   occur in most words, and uniting those words' lessons would cost more than the scan).
//!
//! Every answer is exact: no lesson is scored from an estimate. A lesson's text never changes
//! (its id is the hash of it), so each lesson is indexed once, into a slot numbered in
//! indexing order; status and evidence, which do change, are kept per slot (a bitmap of
//! accepted slots, the slots citing each session) and applied at query time ([`query`]). A
//! lesson removed by a rolled-back commit keeps its slot, unmarked; its id, and so its text, is
//! the same if it is proposed again.

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

/// Words a byte trigram is held by before the index also keeps the lessons holding it. Below,
/// uniting the words' lessons costs little; above, the set is cheaper (kept as a list or a
/// bitmap, whichever is smaller). There are at most (trigrams of the vocabulary) / 128 of them.
pub(crate) const HEAVY_WORDS: usize = 128;

/// The words holding one byte trigram, and for a heavy one the lessons holding it.
#[derive(Debug, Default)]
struct Trigram {
    /// Ascending.
    words: Vec<u32>,
    /// Into `heavy`, once the trigram has [`HEAVY_WORDS`] words.
    heavy: Option<u32>,
}

/// One indexed lesson.
#[derive(Debug)]
struct Slot {
    id: String,
    /// Its evidence sessions, interned, sorted, without repeats.
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
    /// Each slot's id's first 16 hex digits (hex digits order as their values do), kept
    /// apart from the slots so ranking reads them densely.
    keys: Vec<u64>,
    slot_of: SecretMap<String, u32>,
    /// Bit per slot: the lesson is present and `accepted`.
    accepted: Vec<u64>,
    scopes: Interner,
    /// Slots of each scope.
    scope_slots: Vec<Postings>,
    sessions: Interner,
    /// Slots citing each session as evidence (exact: evidence can also shrink, on a rollback).
    session_slots: Vec<Postings>,
    /// Slots citing no session at all (none this host writes; visible to everyone, as
    /// `every` of nothing is true in the reference).
    unevidenced: Postings,
    /// Distinct words of all lessons, and the lessons holding each.
    words: SecretMap<Box<str>, u32>,
    word_text: Vec<Box<str>>,
    word_lessons: Vec<Postings>,
    /// Byte trigram (`b0 << 16 | b1 << 8 | b2`) → words holding it.
    trigrams: SecretMap<u32, Trigram>,
    /// Lessons holding each heavy trigram.
    heavy: Vec<Postings>,
    /// Each word's heavy trigrams (into `heavy`).
    word_heavy: Vec<Vec<u32>>,
    /// Lessons holding a single ASCII character or pair of them inside a word.
    ascii_grams: Vec<Postings>,
    /// The same for characters and pairs outside ASCII, by [`gram_key`].
    grams: SecretMap<u64, Postings>,
    /// Scratch for indexing: a bit per ASCII gram, all clear between lessons.
    ascii_seen: Vec<u64>,
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

/// The first 16 hex digits of an id as a number.
fn id_key(id: &str) -> u64 {
    let prefix = id.get(..16).unwrap_or(id);
    u64::from_str_radix(prefix, 16).unwrap_or(0)
}

impl LessonIndex {
    /// An empty index whose maps hash with secrets derived from `seed`.
    pub(crate) fn new(seed: u64) -> LessonIndex {
        let secret = |purpose| SecretState::derive(seed, purpose);
        LessonIndex {
            tokens: token_regex(),
            slots: Vec::new(),
            keys: Vec::new(),
            slot_of: SecretMap::with_hasher(secret("memory slots")),
            accepted: Vec::new(),
            scopes: Interner::new(secret("memory scopes")),
            scope_slots: Vec::new(),
            sessions: Interner::new(secret("memory sessions")),
            session_slots: Vec::new(),
            unevidenced: Postings::default(),
            words: SecretMap::with_hasher(secret("memory words")),
            word_text: Vec::new(),
            word_lessons: Vec::new(),
            trigrams: SecretMap::with_hasher(secret("memory trigrams")),
            heavy: Vec::new(),
            word_heavy: Vec::new(),
            ascii_grams: vec![Postings::default(); ASCII_GRAMS],
            grams: SecretMap::with_hasher(secret("memory grams")),
            ascii_seen: Vec::new(),
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
        let n = self.slots.len();
        let mut sessions: Vec<u32> = entry
            .evidence
            .iter()
            .map(|e| self.sessions.intern(&e.session))
            .collect();
        sessions.sort_unstable();
        sessions.dedup();
        self.session_slots
            .resize_with(self.sessions.names.len(), Postings::default);
        let old = std::mem::take(&mut self.slots[slot as usize].sessions);
        for s in old.iter().filter(|s| sessions.binary_search(s).is_err()) {
            self.session_slots[*s as usize].remove(slot);
        }
        for s in sessions.iter().filter(|s| old.binary_search(s).is_err()) {
            self.session_slots[*s as usize].insert(slot, n);
        }
        if sessions.is_empty() {
            self.unevidenced.insert(slot, n);
        } else {
            self.unevidenced.remove(slot);
        }
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
        self.scope_slots
            .resize_with(self.scopes.names.len(), Postings::default);
        self.scope_slots[scope as usize].push(slot, slots);
        self.slots.push(Slot {
            id: entry.id.clone(),
            sessions: Vec::new(),
        });
        self.keys.push(id_key(&entry.id));
        self.slot_of.insert(entry.id.clone(), slot);
        // The whole text is lowercased before it is split, as the reference does (a final
        // sigma depends on what follows it, across separators).
        let text = entry.search_text().to_lowercase();
        let runs: Vec<(usize, usize)> = self
            .tokens
            .find_iter(&text)
            .map(|m| (m.start(), m.end()))
            .collect();
        // Each distinct gram of the lesson is added once: ASCII ones marked in a scratch
        // bitmap (cleared again below), others sorted.
        let mut seen = std::mem::take(&mut self.ascii_seen);
        seen.resize(ASCII_GRAMS.div_ceil(64), 0);
        let mut ascii = Vec::new();
        let mut other = Vec::new();
        for (start, end) in runs {
            let word = &text[start..end];
            let w = self.word(word, slots);
            if !self.word_lessons[w as usize].push(slot, slots) {
                // Seen earlier in this lesson: its grams are in.
                continue;
            }
            for &h in &self.word_heavy[w as usize] {
                self.heavy[h as usize].push(slot, slots);
            }
            let mut prev: Option<char> = None;
            for c in word.chars() {
                for gram in [Some((c, None)), prev.map(|p| (p, Some(c)))]
                    .into_iter()
                    .flatten()
                {
                    match ascii_gram(gram.0, gram.1) {
                        Some(i) if seen[i / 64] & (1 << (i % 64)) == 0 => {
                            seen[i / 64] |= 1 << (i % 64);
                            ascii.push(i);
                        }
                        Some(_) => {}
                        None => other.push(gram_key(gram.0, gram.1)),
                    }
                }
                prev = Some(c);
            }
        }
        for i in ascii {
            self.ascii_grams[i].push(slot, slots);
            seen[i / 64] = 0;
        }
        self.ascii_seen = seen;
        other.sort_unstable();
        other.dedup();
        for key in other {
            self.grams.entry(key).or_default().push(slot, slots);
        }
        slot
    }

    /// The number of `word`, added to the vocabulary if new (`slots` slots exist).
    fn word(&mut self, word: &str, slots: usize) -> u32 {
        if let Some(&w) = self.words.get(word) {
            return w;
        }
        let w = self.word_text.len() as u32;
        self.word_text.push(word.into());
        self.word_lessons.push(Postings::default());
        self.word_heavy.push(Vec::new());
        self.words.insert(word.into(), w);
        for t in word.as_bytes().windows(3) {
            let entry = self.trigrams.entry(trigram(t)).or_default();
            if entry.words.last() == Some(&w) {
                continue;
            }
            entry.words.push(w);
            match entry.heavy {
                Some(h) => self.word_heavy[w as usize].push(h),
                None if entry.words.len() >= HEAVY_WORDS => {
                    // It turns heavy: its lessons are those of its words so far (the new word
                    // has none yet; the caller adds them through `word_heavy`).
                    let h = self.heavy.len() as u32;
                    entry.heavy = Some(h);
                    let mut bits = vec![0u64; slots.div_ceil(64)];
                    for &v in &entry.words {
                        self.word_lessons[v as usize].or_into(&mut bits);
                        self.word_heavy[v as usize].push(h);
                    }
                    self.heavy.push(Postings::from_bits(&bits, slots));
                }
                None => {}
            }
        }
        w
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

    /// A token of three or more characters (so three or more bytes): the words holding all its
    /// byte trigrams (the rarest list, narrowed by the others) that hold all of it, and their
    /// lessons.
    fn long_token_lessons(&self, token: &str, out: &mut [u64]) {
        let bytes = token.as_bytes();
        let mut lists = Vec::with_capacity(bytes.len() - 2);
        for t in bytes.windows(3) {
            match self.trigrams.get(&trigram(t)) {
                // A three-byte token that is a heavy trigram: its lessons are kept.
                Some(Trigram { heavy: Some(h), .. }) if bytes.len() == 3 => {
                    return self.heavy[*h as usize].or_into(out);
                }
                Some(entry) => lists.push(&entry.words),
                // A trigram no word holds: neither does any word hold the token.
                None => return,
            }
        }
        lists.sort_by_key(|l| l.len());
        lists.dedup_by_key(|l| l.as_ptr());
        let Some((rarest, others)) = lists.split_first() else {
            return;
        };
        // A three-byte token is its own trigram: every word listed holds it.
        let exact = bytes.len() == 3;
        let mut candidates: Vec<u32> = rarest.to_vec();
        for list in others {
            if candidates.is_empty() {
                return;
            }
            intersect(&mut candidates, list);
        }
        for w in candidates {
            let word = &self.word_text[w as usize];
            if exact || contains(word.as_bytes(), bytes) {
                self.word_lessons[w as usize].or_into(out);
            }
        }
    }
}

/// Keeps in `a` (ascending) what ascending `b` also holds: by binary search when `a` is much
/// shorter, else by walking both.
fn intersect(a: &mut Vec<u32>, b: &[u32]) {
    if a.len() * 16 < b.len() {
        a.retain(|x| b.binary_search(x).is_ok());
        return;
    }
    let mut j = 0;
    a.retain(|x| {
        while j < b.len() && b[j] < *x {
            j += 1;
        }
        j < b.len() && b[j] == *x
    });
}

/// Whether `needle` (at least 3 bytes) occurs in `hay`: candidates are words, a few bytes
/// long, where a first-byte scan beats a general substring search's set-up.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    if hay.len() < needle.len() {
        return false;
    }
    (0..=hay.len() - needle.len()).any(|i| hay[i] == first && &hay[i + 1..i + needle.len()] == rest)
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

mod query;
#[cfg(test)]
mod tests;
