//! The maintainer role: sessions, turns, steering, comments, compactions, review approvals,
//! lesson reviews, closes.

use serde_json::{json, Value};

use super::{Actor, Board};

impl Actor {
    // ─── Maintainer ───────────────────────────────────────────────────────────────────────

    pub(super) fn maintainer(&mut self, board: &Board) {
        if !self.pending.is_empty() || self.winding_down {
            return;
        }
        let known: Vec<String> = board.sessions.iter().cloned().collect();
        let session = match self.pick(&known) {
            Some(s) if !self.chance(1, 12) => s,
            _ => {
                let pool = self.pool.clone();
                let id = self.pick(&pool).unwrap_or_default();
                return self.send(
                    "createSession",
                    json!({"channel": format!("ahp-session:/{id}"), "provider": "axp"}),
                );
            }
        };
        let chat = format!("ahp-chat:/{session}");
        match self.below(24) {
            0..=7 => {
                self.turns_started += 1;
                let turn = format!("t{}-{}", self.index, self.turns_started);
                let action = json!({"type": "chat/turnStarted", "turnId": turn,
                    "startedAt": "2020-01-01T00:00:00.000Z",
                    "message": {"text": "Fix it", "origin": {"kind": "user"}}});
                self.dispatch(&chat, action);
            }
            8..=9 => {
                let kind = ["steering", "queued"][self.below(2) as usize];
                let n = self.below(1_000);
                let id = format!("m{}-{n}", self.index);
                let action = json!({"type": "chat/pendingMessageSet", "kind": kind, "id": id,
                    "message": {"text": "Also this", "origin": {"kind": "user"}}});
                self.dispatch(&chat, action);
            }
            10..=11 => {
                let Some(turn) = board.turns.get(&session).and_then(|t| t.last()).cloned() else {
                    return;
                };
                let action = json!({"type": "chat/turnCancelled", "turnId": turn, "duration": 0});
                self.dispatch(&chat, action);
            }
            12..=13 => {
                let p = json!({"channel": format!("axp-session:/{session}"),
                               "body": format!("note {}", self.below(100)),
                               "checkpoint": null, "path": null});
                self.mutate("_axp/comment", p);
            }
            14 if self.temper.closes && self.chance(1, 10) => {
                let p = json!({"channel": format!("axp-session:/{session}")});
                self.mutate("_axp/close", p);
            }
            16..=17 => {
                let Some(id) = board.proposals.get(&session).cloned() else {
                    return;
                };
                let p = json!({"channel": format!("axp-session:/{session}"), "proposalId": id});
                self.mutate("_axp/acceptCompaction", p);
            }
            18..=19 => {
                // Approve the review observers last saw, with this maintainer's own key.
                let Some(manifest) = board.reviews.get(&session).cloned() else {
                    return;
                };
                let p = json!({"channel": format!("axp-session:/{session}"),
                               "signature": self.sign(&manifest)});
                self.mutate("_axp/approveReview", p);
            }
            15 => {
                // An executor command on a session with no grant of ours: refused, not invalid.
                let p = json!({"channel": format!("axp-session:/{session}"), "epoch": 1});
                self.mutate("_axp/renew", p);
            }
            20..=21 => self.review_lesson(board),
            22 => self.recall(board),
            23 => self.send("subscribe", json!({"channel": super::memory::MEMORY})),
            _ => {}
        }
    }

    pub(super) fn dispatch(&mut self, chat: &str, action: Value) {
        if self.chance(1, 2) {
            self.client_seq += 1;
            let p = json!({"channel": chat, "clientSeq": self.client_seq, "action": action});
            self.send("dispatchAction", p);
        } else {
            let p = json!({"channel": chat, "action": action});
            self.mutate("_axp/dispatch", p);
        }
    }
}
