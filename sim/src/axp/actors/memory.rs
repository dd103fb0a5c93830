//! Repository memory, as every role uses it: executors propose lessons from their sessions'
//! events (a few titles only, so executors race to consolidate the same lesson), maintainers
//! review the revision they last heard of (racing each other: the loser's revision is stale,
//! -32011) and watch `axp-memory://`, and everyone recalls lessons by search, scoped observers
//! included (what they may not read must never come back).

use serde_json::json;

use super::{Actor, Board};

/// Where memory lives.
pub(crate) const MEMORY: &str = "axp-memory://";

const WORDS: [&str; 8] = [
    "flaky", "tests", "retry", "lease", "parser", "cache", "lesson", "zebra",
];

impl Actor {
    /// An executor proposes one of four lessons from `session`'s history as it last knew it
    /// (or first reads the session's export, which tells it how far that history reaches).
    pub(super) fn propose_lesson(&mut self, session: &str) {
        if self.known_seq == 0 || self.chance(1, 3) {
            let p = json!({"channel": self.exchange(session)});
            return self.send("_axp/export", p);
        }
        let n = self.below(4);
        let to = self.known_seq;
        // Mostly the whole history (the same evidence again changes nothing), sometimes a
        // later start (new evidence: a new revision, until the evidence bound).
        let from = if self.chance(1, 3) {
            1 + self.below(to.min(4))
        } else {
            1
        };
        let outcome = ["success", "failure"][(n % 2) as usize];
        let p = json!({"channel": self.exchange(session),
                       "title": format!("Lesson {n}"),
                       "trigger": "when the tests turn flaky",
                       "lesson": "Retry once, then read the lease log",
                       "outcome": outcome,
                       "fromSeq": from, "toSeq": to});
        self.mutate("_axp/memoryPropose", p);
    }

    /// A maintainer accepts or retires a lesson at the revision it last heard of, through the
    /// memory channel or a session's.
    pub(super) fn review_lesson(&mut self, board: &Board) {
        let lessons: Vec<String> = board.lessons.keys().cloned().collect();
        let Some(id) = self.pick(&lessons) else {
            return self.recall(board);
        };
        let revision = board.lessons.get(&id).copied().unwrap_or(1);
        let status = if self.chance(1, 4) {
            "retired"
        } else {
            "accepted"
        };
        let sessions: Vec<String> = board.sessions.iter().cloned().collect();
        let channel = match self.pick(&sessions) {
            Some(s) if self.chance(1, 2) => self.exchange(&s),
            _ => MEMORY.to_owned(),
        };
        let p = json!({"channel": channel, "memoryId": id, "revision": revision,
                       "status": status});
        self.mutate("_axp/memoryReview", p);
    }

    /// A search on a channel this actor may read (or, for observers now and then, one it may
    /// not: -32009).
    pub(super) fn recall(&mut self, board: &Board) {
        let readable: Vec<String> = board
            .sessions
            .iter()
            .filter(|s| self.principal.can_read_session(s))
            .map(|s| self.exchange(s))
            .collect();
        let channel = match self.pick(&readable) {
            Some(c) if self.chance(2, 3) => c,
            _ => "ahp-root://".to_owned(),
        };
        let n = 1 + self.below(3);
        let words = (0..n)
            .map(|_| WORDS[self.below(WORDS.len() as u64) as usize])
            .collect::<Vec<_>>()
            .join(" ");
        let limit = 1 + self.below(20);
        self.send(
            "_axp/memorySearch",
            json!({"channel": channel, "query": words, "limit": limit}),
        );
    }
}
