//! The verifier role: uploads a run's output and verifies the checkpoint head observers last
//! saw. Heads move under it (executors checkpoint again), so some verifications name an old
//! head and are refused with `-32011`; the oracle checks that a verification in any state names
//! that state's checkpoint.

use serde_json::{json, Value};

use super::{Actor, Board, Sent};

impl Actor {
    // ─── Verifier ─────────────────────────────────────────────────────────────────────────

    pub(super) fn verifier(&mut self, board: &Board) {
        if !self.pending.is_empty() || self.winding_down {
            return;
        }
        let known: Vec<String> = board.heads.keys().cloned().collect();
        let Some(session) = self.pick(&known) else {
            return;
        };
        let channel = format!("axp-session:/{session}");
        let Some(output) = self.blobs.get(&session).and_then(|b| b.first()).cloned() else {
            // "test output": the log a run left.
            let p =
                json!({"channel": channel, "data": "dGVzdCBvdXRwdXQ=", "mediaType": "text/plain"});
            return self.mutate("_axp/blobPut", p);
        };
        let head = board.heads.get(&session).cloned().unwrap_or_default();
        // Each head once, mostly: a verifier runs a checkpoint's checks when it appears.
        let key = format!("{session}@{head}");
        if self.tried.contains(&key) && !self.chance(1, 50) {
            return;
        }
        self.tried.insert(key);
        let exit_code = [0, 0, 1, 101][self.below(4) as usize];
        let p = json!({"channel": channel, "headCommit": head, "command": ["cargo", "test"],
                       "exitCode": exit_code, "output": output});
        self.mutate("_axp/verify", p);
    }

    pub(super) fn on_verifier_answer(&mut self, sent: &Sent, result: Option<&Value>) {
        let (Some(r), "_axp/blobPut") = (result, sent.method.as_str()) else {
            return;
        };
        let Some(session) = sent
            .params
            .get("channel")
            .and_then(Value::as_str)
            .and_then(|c| c.strip_prefix("axp-session:/"))
        else {
            return;
        };
        self.blobs
            .entry(session.to_owned())
            .or_default()
            .push(r.clone());
    }
}
