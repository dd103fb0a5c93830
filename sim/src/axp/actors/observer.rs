//! The observer role: mirrors every exchange it may read, recalls lessons, and tries what its
//! role forbids.

use serde_json::json;

use super::{Actor, Board};

impl Actor {
    // ─── Observer ─────────────────────────────────────────────────────────────────────────

    pub(super) fn observer(&mut self, board: &Board) {
        if !self.pending.is_empty() {
            return;
        }
        let unmirrored: Vec<String> = board
            .sessions
            .iter()
            .filter(|s| self.principal.can_read_session(s))
            .map(|s| format!("axp-session:/{s}"))
            .filter(|c| !self.mirrors.contains_key(c))
            .collect();
        if let Some(channel) = unmirrored.first().cloned() {
            return self.send("subscribe", json!({"channel": channel}));
        }
        if self.winding_down {
            return;
        }
        let session = self.pool.first().cloned().unwrap_or_default();
        match self.below(12) {
            0 => {
                let p = json!({"channel": format!("axp-session:/{session}"), "body": "hi",
                               "checkpoint": null, "path": null});
                self.mutate("_axp/comment", p);
            }
            1 => {
                let p = json!({"channel": format!("axp-session:/{session}"),
                    "executorId": "spy", "grantId": "g-spy", "leaseMs": 3_000});
                self.mutate("_axp/claim", p);
            }
            2 => {
                let p = json!({"channel": format!("axp-session:/{session}")});
                self.send("_axp/export", p);
            }
            3 => {
                // Neither approving nor verifying is an observer's (-32009).
                let Some(manifest) = board.reviews.values().next().cloned() else {
                    return;
                };
                let p = json!({"channel": format!("axp-session:/{session}"),
                               "signature": self.sign(&manifest)});
                self.mutate("_axp/approveReview", p);
            }
            4..=5 => self.recall(board),
            6 => {
                // Neither proposing a lesson nor watching memory directly is an observer's.
                let p = json!({"channel": format!("axp-session:/{session}"), "title": "t",
                               "trigger": "g", "lesson": "l", "outcome": "success",
                               "fromSeq": 1, "toSeq": 1});
                self.mutate("_axp/memoryPropose", p);
            }
            7 => self.send("subscribe", json!({"channel": super::memory::MEMORY})),
            _ => {}
        }
    }
}
