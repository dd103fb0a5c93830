//! An observer's mirror of the AXP channels, folded with a reducer written here from the
//! specification (AXP 0.2.0 §state), not taken from the core: if the two disagree, the oracle
//! sees an observer whose mirror differs from the host.
//!
//! State is plain JSON, so what is compared is exactly what the wire shows.

use serde_json::{json, Value};

/// `axp-executors://`.
pub const EXECUTORS: &str = "axp-executors://";

/// One mirrored channel: its state and the `serverSeq` it reflects.
#[derive(Clone, Debug)]
pub struct Mirror {
    /// The channel's state as the wire shows it.
    pub state: Value,
    /// The last `serverSeq` folded in (the snapshot's `fromSeq` at first).
    pub seq: u64,
}

impl Mirror {
    /// A mirror from a snapshot.
    pub fn from_snapshot(state: Value, from_seq: u64) -> Mirror {
        Mirror {
            state,
            seq: from_seq,
        }
    }

    /// Folds in one action of this channel. An action the specification does not define for
    /// the channel is an error (the host must not send it).
    pub fn apply(&mut self, channel: &str, action: &Value, seq: u64) -> Result<(), String> {
        self.seq = seq;
        let kind = action.get("type").and_then(Value::as_str).unwrap_or("");
        if channel == EXECUTORS {
            return match kind {
                "_axp/executorChanged" => {
                    let executor = field(action, "executor")?;
                    let id = executor
                        .get("id")
                        .and_then(Value::as_str)
                        .ok_or("executorChanged without executor.id")?
                        .to_owned();
                    entries(&mut self.state)?.insert(id, executor.clone());
                    Ok(())
                }
                other => Err(format!("{other} on {EXECUTORS}")),
            };
        }
        let state = self
            .state
            .as_object_mut()
            .ok_or("exchange state is not an object")?;
        match kind {
            "_axp/leaseChanged" => {
                for key in ["lease", "epoch", "status"] {
                    state.insert(key.into(), field(action, key)?.clone());
                }
            }
            "_axp/grantChanged" => {
                let grant = field(action, "grant")?;
                grants(state)?.insert(grant_id(grant)?, grant.clone());
            }
            "_axp/reserved" => {
                state.insert("reservation".into(), field(action, "reservation")?.clone());
            }
            "_axp/settled" => {
                let grant = field(action, "grant")?;
                let id = grant_id(grant)?;
                let entry = json!({
                    "turnId": field(action, "turnId")?,
                    "grantId": id,
                    "usage": field(action, "usage")?,
                });
                grants(state)?.insert(id, grant.clone());
                state.insert("reservation".into(), Value::Null);
                state
                    .get_mut("usage")
                    .and_then(Value::as_array_mut)
                    .ok_or("exchange state without a usage list")?
                    .push(entry);
            }
            "_axp/commentAdded" => {
                let comment = field(action, "comment")?.clone();
                let list = state
                    .entry("discussion")
                    .or_insert_with(|| Value::Array(Vec::new()));
                if list.is_null() {
                    *list = Value::Array(Vec::new());
                }
                list.as_array_mut()
                    .ok_or("discussion is not a list")?
                    .push(comment);
            }
            "_axp/checkpointChanged" => {
                // The review and verification named the old head.
                state.insert("checkpoint".into(), field(action, "checkpoint")?.clone());
                state.insert("review".into(), Value::Null);
                state.insert("verification".into(), Value::Null);
            }
            "_axp/compactionProposed" => {
                state.insert("compaction".into(), field(action, "proposal")?.clone());
            }
            "_axp/contextChanged" => {
                state.insert("context".into(), field(action, "context")?.clone());
                state.insert("compaction".into(), Value::Null);
            }
            "_axp/reviewChanged" => {
                state.insert("review".into(), field(action, "review")?.clone());
            }
            "_axp/verificationChanged" => {
                state.insert(
                    "verification".into(),
                    field(action, "verification")?.clone(),
                );
            }
            other => return Err(format!("{other} on {channel} (not an AXP action)")),
        }
        Ok(())
    }
}

fn field<'a>(action: &'a Value, key: &str) -> Result<&'a Value, String> {
    action.get(key).ok_or_else(|| {
        format!(
            "{} without {key}",
            action.get("type").and_then(Value::as_str).unwrap_or("?")
        )
    })
}

fn grant_id(grant: &Value) -> Result<String, String> {
    grant
        .get("id")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| "a grant without an id".to_owned())
}

fn grants(
    state: &mut serde_json::Map<String, Value>,
) -> Result<&mut serde_json::Map<String, Value>, String> {
    state
        .get_mut("grants")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| "exchange state without a grants map".to_owned())
}

fn entries(state: &mut Value) -> Result<&mut serde_json::Map<String, Value>, String> {
    state
        .get_mut("entries")
        .and_then(Value::as_object_mut)
        .ok_or_else(|| format!("{EXECUTORS} state without entries"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settling_moves_the_grant_and_records_one_usage_entry() {
        let mut m = Mirror::from_snapshot(
            json!({"grants": {}, "usage": [], "reservation": {"turnId": "t"}}),
            4,
        );
        let grant = json!({"id": "g", "spent": {"tokens": 5}});
        let action = json!({"type": "_axp/settled", "turnId": "t", "grant": grant, "usage": {"inputTokens": 5}});
        m.apply("axp-session:/s", &action, 5).expect("settled");
        assert_eq!(m.seq, 5);
        assert_eq!(m.state["reservation"], Value::Null);
        assert_eq!(m.state["grants"]["g"], grant);
        assert_eq!(m.state["usage"][0]["grantId"], "g");
    }

    #[test]
    fn a_checkpoint_clears_review_and_verification_and_a_context_the_compaction() {
        let mut m = Mirror::from_snapshot(
            json!({"checkpoint": null, "review": {"x": 1}, "verification": {"y": 2},
                   "compaction": {"id": "p"}, "context": {"revision": 0}}),
            1,
        );
        let x = "axp-session:/s";
        m.apply(
            x,
            &json!({"type": "_axp/checkpointChanged", "checkpoint": {"headCommit": "h"}}),
            2,
        )
        .expect("checkpoint");
        assert_eq!(
            (&m.state["review"], &m.state["verification"]),
            (&Value::Null, &Value::Null)
        );
        assert_eq!(
            m.state["compaction"]["id"], "p",
            "a pending compaction stays"
        );
        m.apply(
            x,
            &json!({"type": "_axp/contextChanged", "context": {"revision": 1}}),
            3,
        )
        .expect("context");
        assert_eq!(m.state["compaction"], Value::Null);
        assert_eq!(m.state["context"]["revision"], 1);
    }

    #[test]
    fn an_action_of_the_wrong_channel_is_refused() {
        let mut m = Mirror::from_snapshot(json!({"entries": {}}), 0);
        let err = m
            .apply(EXECUTORS, &json!({"type": "_axp/reserved"}), 1)
            .expect_err("refused");
        assert!(err.contains("_axp/reserved"));
    }
}
