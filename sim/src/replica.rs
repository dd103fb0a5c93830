//! A client's copy of one channel's state: a snapshot, then every accepted envelope reduced
//! into it with the official `ahp` 0.9.0 reducers, chosen by URI scheme.
//!
//! The replica is typed (the `ahp-types` state of its scheme), because that is what a real
//! client holds. It is compared with the host as JSON after a round trip through serde, so a
//! field the host sends that the typed state cannot carry shows up as a difference.
//!
//! The client-services catalog (`x-client-services://`) has no official reducer; its three
//! actions are reduced here, strictly: an observer is told `serviceAdded` only for a service it
//! does not hold yet, `serviceUpdated` and `serviceRemoved` only for one it holds.

use std::cell::OnceCell;
use std::collections::BTreeMap;

use ahp::reducers::{
    apply_action_to_changeset, apply_action_to_chat, apply_action_to_root, apply_action_to_session,
    ReduceOutcome,
};
use ahp_types::actions::StateAction;
use ahp_types::state::{ChangesetState, ChatState, RootState, SessionState};
use serde_json::Value;

/// The channel kinds a simulated client mirrors, told apart by URI scheme alone.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Scheme {
    /// `ahp-root://`
    Root,
    /// `ahp-session:/…`
    Session,
    /// `ahp-chat:/…`
    Chat,
    /// `ahp-changeset:/…`
    Changeset,
    /// `x-client-services://`, the client-services catalog.
    Catalog,
}

impl Scheme {
    /// The scheme of `uri`, or `None` for channels no simulated client mirrors.
    pub fn of(uri: &str) -> Option<Scheme> {
        if uri == "ahp-root://" {
            Some(Scheme::Root)
        } else if uri.starts_with("ahp-session:/") {
            Some(Scheme::Session)
        } else if uri.starts_with("ahp-chat:/") {
            Some(Scheme::Chat)
        } else if uri.starts_with("ahp-changeset:/") {
            Some(Scheme::Changeset)
        } else if uri == CATALOG {
            Some(Scheme::Catalog)
        } else {
            None
        }
    }
}

/// One channel's typed state.
#[derive(Clone, Debug)]
pub enum State {
    /// Root.
    Root(Box<RootState>),
    /// A session.
    Session(Box<SessionState>),
    /// A chat.
    Chat(Box<ChatState>),
    /// A changeset.
    Changeset(Box<ChangesetState>),
    /// The catalog as this observer sees it: service entries by id.
    Catalog(BTreeMap<String, Value>),
}

/// The client-services catalog channel.
pub const CATALOG: &str = "x-client-services://";

/// A mirrored channel: typed state, the `fromSeq` it started from, and a version that counts
/// its changes (the checker compares only what changed since it last looked).
#[derive(Clone, Debug)]
pub struct Replica {
    state: State,
    /// `fromSeq` of the snapshot this replica was built from.
    pub from_seq: u64,
    /// Bumped on every change; unique across replicas of one client.
    pub version: u64,
    json: OnceCell<Value>,
}

impl Replica {
    /// Decodes a snapshot's `state` for channel `uri`.
    pub fn from_snapshot(
        uri: &str,
        state: Value,
        from_seq: u64,
        version: u64,
    ) -> Result<Replica, String> {
        let scheme =
            Scheme::of(uri).ok_or_else(|| format!("snapshot for unmirrored channel {uri}"))?;
        let decode_error =
            |e: serde_json::Error| format!("snapshot state of {uri} does not decode: {e}");
        let state = match scheme {
            Scheme::Root => State::Root(Box::new(
                serde_json::from_value(state).map_err(decode_error)?,
            )),
            Scheme::Session => State::Session(Box::new(
                serde_json::from_value(state).map_err(decode_error)?,
            )),
            Scheme::Chat => State::Chat(Box::new(
                serde_json::from_value(state).map_err(decode_error)?,
            )),
            Scheme::Changeset => State::Changeset(Box::new(
                serde_json::from_value(state).map_err(decode_error)?,
            )),
            Scheme::Catalog => State::Catalog(catalog_from(&state)?),
        };
        Ok(Replica {
            state,
            from_seq,
            version,
            json: OnceCell::new(),
        })
    }

    /// Reduces one accepted action with the reducer of this replica's scheme. An action the
    /// reducer finds invalid or out of scope is an error: the host accepted and sent it.
    pub fn apply(&mut self, action: &StateAction, version: u64) -> Result<(), String> {
        let outcome = match &mut self.state {
            State::Root(s) => apply_action_to_root(s, action),
            State::Session(s) => apply_action_to_session(s, action),
            State::Chat(s) => apply_action_to_chat(s, action),
            State::Changeset(s) => apply_action_to_changeset(s, action),
            State::Catalog(services) => {
                apply_catalog(services, action)?;
                ReduceOutcome::Applied
            }
        };
        match outcome {
            ReduceOutcome::Applied => {
                self.version = version;
                self.json = OnceCell::new();
                Ok(())
            }
            ReduceOutcome::NoOp => Ok(()),
            ReduceOutcome::Invalid(e) => Err(format!("does not reduce: {e}")),
            ReduceOutcome::OutOfScope => Err("is out of scope for its channel".into()),
        }
    }

    /// The state as JSON, computed once per version.
    pub fn json(&self) -> &Value {
        self.json.get_or_init(|| {
            let v = match &self.state {
                State::Root(s) => serde_json::to_value(s),
                State::Session(s) => serde_json::to_value(s),
                State::Chat(s) => serde_json::to_value(s),
                State::Changeset(s) => serde_json::to_value(s),
                State::Catalog(services) => {
                    Ok(serde_json::json!({ "services": services.values().collect::<Vec<_>>() }))
                }
            };
            // Typed AHP states always serialize (string keys only); Null would fail the
            // comparison loudly rather than hide anything.
            v.unwrap_or(Value::Null)
        })
    }

    /// The chat state, when this replica mirrors a chat (scripts read it to aim actions).
    pub fn chat(&self) -> Option<&ChatState> {
        match &self.state {
            State::Chat(c) => Some(c),
            _ => None,
        }
    }
}

/// Decodes a catalog snapshot state `{services: [...]}`.
fn catalog_from(state: &Value) -> Result<BTreeMap<String, Value>, String> {
    let list = state
        .get("services")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("catalog snapshot without services: {state}"))?;
    let mut services = BTreeMap::new();
    for entry in list {
        let id = service_id(entry)?;
        if services.insert(id.clone(), entry.clone()).is_some() {
            return Err(format!("catalog snapshot lists {id} twice"));
        }
    }
    Ok(services)
}

fn service_id(entry: &Value) -> Result<String, String> {
    entry
        .get("serviceId")
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| format!("catalog entry without serviceId: {entry}"))
}

/// The catalog reducer: added, updated, removed.
fn apply_catalog(
    services: &mut BTreeMap<String, Value>,
    action: &StateAction,
) -> Result<(), String> {
    let StateAction::Unknown(action) = action else {
        return Err("the catalog received an AHP state action".into());
    };
    let kind = action
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "x-clientServices/serviceAdded" | "x-clientServices/serviceUpdated" => {
            let entry = action
                .get("service")
                .ok_or_else(|| format!("{kind} without service"))?;
            let id = service_id(entry)?;
            let held = services.insert(id.clone(), entry.clone()).is_some();
            match (kind.ends_with("Added"), held) {
                (true, true) => Err(format!(
                    "serviceAdded for {id}, which this observer already holds"
                )),
                (false, false) => Err(format!(
                    "serviceUpdated for {id}, which this observer never saw"
                )),
                _ => Ok(()),
            }
        }
        "x-clientServices/serviceRemoved" => {
            let id = action
                .get("serviceId")
                .and_then(Value::as_str)
                .ok_or("serviceRemoved without serviceId")?;
            match services.remove(id) {
                Some(_) => Ok(()),
                None => Err(format!(
                    "serviceRemoved for {id}, which this observer does not hold"
                )),
            }
        }
        other => Err(format!("unknown catalog action {other:?}")),
    }
}

/// The first place a client's JSON differs from the host's, as a path, for violation messages.
pub fn first_difference(a: &Value, b: &Value) -> String {
    difference(a, b, ("client", "host"))
}

/// The first place two JSON values differ, as a path, naming the sides with `labels`.
pub fn difference(a: &Value, b: &Value, labels: (&str, &str)) -> String {
    let mut path = String::from("$");
    walk(a, b, &mut path, labels).unwrap_or_else(|| "no difference".into())
}

fn walk(a: &Value, b: &Value, path: &mut String, labels: (&str, &str)) -> Option<String> {
    let (la, lb) = labels;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for (k, va) in x {
                let len = path.len();
                path.push('.');
                path.push_str(k);
                match y.get(k) {
                    None => return Some(format!("{path}: only {la}")),
                    Some(vb) => {
                        if let Some(d) = walk(va, vb, path, labels) {
                            return Some(d);
                        }
                    }
                }
                path.truncate(len);
            }
            y.keys()
                .find(|k| !x.contains_key(*k))
                .map(|k| format!("{path}.{k}: only {lb}"))
        }
        (Value::Array(x), Value::Array(y)) => {
            for (i, (va, vb)) in x.iter().zip(y).enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                if let Some(d) = walk(va, vb, path, labels) {
                    return Some(d);
                }
                path.truncate(len);
            }
            (x.len() != y.len())
                .then(|| format!("{path}: {la} has {} items, {lb} {}", x.len(), y.len()))
        }
        _ if a == b => None,
        _ => Some(format!("{path}: {la} {} vs {lb} {}", short(a), short(b))),
    }
}

fn short(v: &Value) -> String {
    let s = v.to_string();
    if s.chars().count() > 120 {
        format!("{}…", s.chars().take(120).collect::<String>())
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schemes_come_from_the_uri_alone() {
        assert_eq!(Scheme::of("ahp-root://"), Some(Scheme::Root));
        assert_eq!(Scheme::of("ahp-chat:/s1"), Some(Scheme::Chat));
        assert_eq!(Scheme::of("ahp-changeset:/s1"), Some(Scheme::Changeset));
        assert_eq!(Scheme::of("ahp-session:/s1"), Some(Scheme::Session));
        assert_eq!(Scheme::of("axp-session:/s1"), None);
        assert_eq!(Scheme::of("x-client-services://"), Some(Scheme::Catalog));
    }

    #[test]
    fn the_catalog_reduces_strictly() {
        let entry = |id: &str, label: &str| json!({"serviceId": id, "clientId": "c", "principal": "p", "metadata": {"label": label}});
        let mut r = Replica::from_snapshot(CATALOG, json!({"services": [entry("b", "x")]}), 4, 1)
            .expect("snapshot");
        let act = |v: Value| -> StateAction { serde_json::from_value(v).expect("action") };
        let added =
            act(json!({"type": "x-clientServices/serviceAdded", "service": entry("a", "y")}));
        assert!(matches!(added, StateAction::Unknown(_)));
        assert_eq!(r.apply(&added, 2), Ok(()));
        assert!(r.apply(&added, 3).is_err(), "added twice");
        let updated =
            act(json!({"type": "x-clientServices/serviceUpdated", "service": entry("b", "z")}));
        assert_eq!(r.apply(&updated, 4), Ok(()));
        let removed = act(json!({"type": "x-clientServices/serviceRemoved", "serviceId": "a"}));
        assert_eq!(r.apply(&removed, 5), Ok(()));
        assert!(r.apply(&removed, 6).is_err(), "removed twice");
        assert_eq!(r.json(), &json!({"services": [entry("b", "z")]}));
    }

    #[test]
    fn differences_name_a_path() {
        let a = json!({"x": [1, {"y": 2}], "z": 1});
        let b = json!({"x": [1, {"y": 3}], "z": 1});
        assert_eq!(first_difference(&a, &b), "$.x[1].y: client 2 vs host 3");
        assert_eq!(first_difference(&a, &a), "no difference");
        assert_eq!(
            first_difference(&json!({}), &json!({"k": 1})),
            "$.k: only host"
        );
    }
}
