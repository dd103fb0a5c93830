//! The durability oracles: what the asynchronous write path promises, checked from outside.
//!
//! The host applies a change in memory at once and hands it to the writer; it may reveal the
//! change only once the writer reported it durable. This module follows every change from the
//! moment it is handed out ([`DurabilityOracle::issued`]) to the moment it is durable, refused
//! or lost in a crash, and checks, for every frame the host emits and after every outcome:
//!
//! 1. *Nothing is revealed before it is durable.* An accepted action envelope (live, replayed,
//!    or an echo) is in the store, byte for byte, when it leaves the host; a catalog event's
//!    `serverSeq`, a snapshot's `fromSeq` and a handshake's `serverSeq` are covered by the
//!    store's durable mark; a new session announced or listed is in the store. A success answer
//!    to a request that caused a change leaves only once that change is reported durable. And
//!    while any change is in flight, a call into the host that is not a `Durable` report emits
//!    no frame that reveals state: such a frame is made after the in-flight change was handed
//!    out, so it must wait for it (the contract's hold rule).
//! 2. *A failed batch leaves no trace.* After `CommitFailed` the host's state of every channel
//!    the failed changes touched equals the durable state before them; no frame ever carries
//!    one of their events; no sender of one is told it succeeded.
//! 3. *Every acknowledged change survives a crash, and the rest is gone.* After a restart the
//!    new host's state of every channel equals the state after the last change that was durable
//!    in the store (a change durable but not yet reported survives too: it is on disk).
//!
//! Channel states are tracked per channel as the *durable shadow*: the host's state of the
//! channel at moments when no change in flight touches it, and the state right after each change
//! in flight (captured when the change is handed out). When two changes handed out in one call
//! touch one channel, the state after the first is unknown; the channel is skipped until it is
//! clean again.

use std::collections::{BTreeMap, BTreeSet};

use axhost_core::{ConnId, Host, Input, MemStore};
use serde_json::Value;

use crate::client::session_of;
use crate::replica::CATALOG;
use crate::store::SimStore;

/// The channels of session `id`.
pub fn session_channels(id: &str) -> [String; 3] {
    [
        format!("ahp-session:/{id}"),
        format!("ahp-chat:/{id}"),
        format!("ahp-changeset:/{id}"),
    ]
}

/// The session a store key or channel belongs to: a channel URI (`ahp-chat:/s0`) or a
/// host-private key that ends in the session id after a `:/` (`axhost-session:/s0`).
pub fn session_of_key(key: &str) -> Option<&str> {
    session_of(key)
        .or_else(|| key.rsplit_once(":/").map(|(_, id)| id))
        .filter(|id| !id.is_empty() && !id.contains('/'))
}

/// What caused a change: a request on a connection (its id as JSON text), or anything else.
pub type Cause = Option<(ConnId, String)>;

/// One change as the oracle sees it.
#[derive(Clone, Debug, Default)]
pub struct ChangeInfo {
    /// Its number.
    pub number: u64,
    /// Its generation.
    pub generation: u64,
    /// The durable mark after it.
    pub server_seq: u64,
    /// Its events: `(serverSeq, channel)`.
    pub events: Vec<(u64, String)>,
    /// Its receipts: `(owner, key)`.
    pub receipts: Vec<(String, String)>,
    /// The sessions it writes.
    pub sessions: BTreeSet<String>,
}

impl ChangeInfo {
    /// Every channel this change may alter.
    pub fn channels(&self) -> BTreeSet<String> {
        self.sessions
            .iter()
            .flat_map(|id| session_channels(id))
            .collect()
    }
}

struct Issued {
    info: ChangeInfo,
    cause: Cause,
    /// The host's state of each channel right after this change (`None`: it does not exist);
    /// a channel it touches but is missing here is unknown.
    after: BTreeMap<String, Option<Value>>,
}

/// The kind of call into the host the world is about to make.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `Input::Durable`: held frames may be released.
    Durable,
    /// `Input::CommitFailed`: failures are answered.
    Failed,
    /// Anything else: with a change in flight, nothing that reveals state may leave.
    Other,
}

/// Counters for the report.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DurabilityStats {
    /// Frames checked against the store.
    pub frames_checked: u64,
    /// Channel states compared with the durable shadow (after failures and restarts).
    pub states_compared: u64,
    /// Channel comparisons skipped because the state after a change was ambiguous.
    pub states_unknown: u64,
}

/// See the module docs.
#[derive(Default)]
pub struct DurabilityOracle {
    /// Handed out by the current host and not yet reported durable or failed, by number.
    issued: BTreeMap<u64, Issued>,
    /// Highest number reported durable to the current host.
    reported: u64,
    /// The durable state of each channel known, `None` when it does not exist.
    shadow: BTreeMap<String, Option<Value>>,
    /// Requests by `(conn, id)` with their method, until answered.
    requests: BTreeMap<(ConnId, String), String>,
    /// Requests whose change is in flight: the number a success answer must wait for.
    waiting: BTreeMap<(ConnId, String), u64>,
    /// Requests whose change failed: they must not be told they succeeded.
    failed_causes: BTreeSet<(ConnId, String)>,
    /// Events of failed changes (this host lifetime): `serverSeq`s never to be revealed.
    failed_seqs: BTreeSet<u64>,
    /// The call being made.
    call: Option<Call>,
    /// The highest durable mark handed out by the current host.
    issued_mark: u64,
    /// The last envelope frame found durable (the store only grows, so it stays durable
    /// until a restart).
    last_envelope: String,
    /// Counters.
    pub stats: DurabilityStats,
}

impl DurabilityOracle {
    /// An oracle that has seen nothing; [`DurabilityOracle::started`] learns the first host.
    pub fn new() -> DurabilityOracle {
        DurabilityOracle::default()
    }

    /// Whether a change is handed out and not yet reported durable (or failed).
    pub fn in_flight(&self) -> bool {
        !self.issued.is_empty()
    }

    /// Whether a change in flight may alter `uri`.
    pub fn touches(&self, uri: &str) -> bool {
        let Some(id) = session_of(uri) else {
            return uri == CATALOG && self.in_flight();
        };
        self.issued.values().any(|c| c.info.sessions.contains(id))
    }

    /// A host started over the store (the first, or after a crash): everything it holds is
    /// durable, so its states are the shadow.
    pub fn started(&mut self, host: &Host<SimStore>, session_ids: &[String]) {
        self.issued.clear();
        self.reported = 0;
        self.issued_mark = 0;
        self.requests.clear();
        self.waiting.clear();
        self.failed_causes.clear();
        self.failed_seqs.clear();
        self.last_envelope.clear();
        self.shadow.clear();
        for id in session_ids {
            for uri in session_channels(id) {
                self.shadow.insert(uri.clone(), host.channel_state(&uri));
            }
        }
    }

    /// The world is about to feed `input`. Returns the request it carries, if any: what the
    /// changes it causes are answered for.
    pub fn calling(&mut self, input: &Input<'_>) -> Cause {
        let (call, message) = match input {
            Input::Durable { .. } => (Call::Durable, None),
            Input::CommitFailed { .. } => (Call::Failed, None),
            Input::Message { conn, text } => (Call::Other, Some((*conn, *text))),
            _ => (Call::Other, None),
        };
        self.call = Some(call);
        let (conn, text) = message?;
        // Only requests matter: their answers are matched to what they caused.
        if !text.contains("\"id\"") {
            return None;
        }
        let v = serde_json::from_str::<Value>(text).ok()?;
        let id = v.get("id").filter(|id| !id.is_null())?;
        let method = v.get("method").and_then(Value::as_str)?;
        let key = (conn, id.to_string());
        self.requests.insert(key.clone(), method.to_owned());
        Some(key)
    }

    /// The world is about to fire the host's timers.
    pub fn timer(&mut self) {
        self.call = Some(Call::Other);
    }

    /// The call returned and its outputs were drained.
    pub fn called(&mut self) {
        self.call = None;
    }

    /// The host handed out `info` while handling `cause`. The states right after it follow
    /// with [`DurabilityOracle::set_after`] once the call's outputs are drained.
    pub fn issued(&mut self, info: ChangeInfo, cause: Cause) {
        self.issued_mark = self.issued_mark.max(info.server_seq);
        if let Some(c) = &cause {
            if self.requests.contains_key(c) {
                self.waiting.insert(c.clone(), info.number);
            }
        }
        self.issued.insert(
            info.number,
            Issued {
                info,
                cause,
                after: BTreeMap::new(),
            },
        );
    }

    /// Records the host's state of `uri` right after change `number` (`None`: it does not
    /// exist). Channels a change touches without a recorded state are unknown after it.
    pub fn set_after(&mut self, number: u64, uri: String, state: Option<Value>) {
        if let Some(c) = self.issued.get_mut(&number) {
            c.after.insert(uri, state);
        }
    }

    /// The highest durable mark any change handed out by the current host carries (the host's
    /// `serverSeq` may run ahead of the store up to it; failed ones leave gaps).
    pub fn issued_mark(&self) -> u64 {
        self.issued_mark
    }

    /// Connection `conn` is gone: its requests will never be answered.
    pub fn closed(&mut self, conn: ConnId) {
        self.requests.retain(|k, _| k.0 != conn);
        self.waiting.retain(|k, _| k.0 != conn);
        self.failed_causes.retain(|k| k.0 != conn);
    }

    /// The numbers of the changes in flight, oldest first.
    pub fn numbers(&self) -> Vec<u64> {
        self.issued.keys().copied().collect()
    }

    /// The channels change `number` touches.
    pub fn channels_of(&self, number: u64) -> BTreeSet<String> {
        self.issued
            .get(&number)
            .map(|c| c.info.channels())
            .unwrap_or_default()
    }

    /// The writer reported every change through `through` durable (the world feeds
    /// `Input::Durable` next). Their states become the shadow.
    pub fn durable(&mut self, through: u64) -> Result<(), String> {
        if through <= self.reported {
            return Err(format!(
                "Durable through {through} reported after {}",
                self.reported
            ));
        }
        self.reported = through;
        let done: Vec<u64> = self.issued.range(..=through).map(|(n, _)| *n).collect();
        for n in done {
            let Some(c) = self.issued.remove(&n) else {
                continue;
            };
            for uri in c.info.channels() {
                match c.after.get(&uri) {
                    Some(state) => {
                        self.shadow.insert(uri, state.clone());
                    }
                    None => {
                        self.shadow.remove(&uri);
                    }
                }
            }
            if let Some(cause) = c.cause {
                if self.waiting.get(&cause) == Some(&n) {
                    self.waiting.remove(&cause);
                }
            }
        }
        Ok(())
    }

    /// The writer reported the transaction starting at `number` failed (the world feeds
    /// `Input::CommitFailed` next): every change from `number` on failed or was dropped.
    /// Returns the channels they touched, to compare after the host handled it.
    pub fn failed(&mut self, number: u64) -> Result<BTreeSet<String>, String> {
        if number <= self.reported {
            return Err(format!(
                "CommitFailed at {number}, already reported durable through {}",
                self.reported
            ));
        }
        let gone: Vec<u64> = self.issued.range(number..).map(|(n, _)| *n).collect();
        let mut touched = BTreeSet::new();
        for n in gone {
            let Some(c) = self.issued.remove(&n) else {
                continue;
            };
            touched.extend(c.info.channels());
            self.failed_seqs.extend(c.info.events.iter().map(|e| e.0));
            if let Some(cause) = c.cause {
                self.waiting.remove(&cause);
                self.failed_causes.insert(cause);
            }
        }
        Ok(touched)
    }

    /// Oracle 2, after the host handled `CommitFailed`: every channel the failed changes
    /// touched is as durable as before them (unless a change handed out since touches it).
    pub fn after_failure(
        &mut self,
        host: &Host<SimStore>,
        touched: &BTreeSet<String>,
    ) -> Result<(), String> {
        for uri in touched {
            if self.touches(uri) {
                continue;
            }
            let Some(expected) = self.shadow.get(uri) else {
                self.stats.states_unknown += 1;
                // Clean now: learn it.
                self.shadow.insert(uri.clone(), host.channel_state(uri));
                continue;
            };
            self.stats.states_compared += 1;
            let now = host.channel_state(uri);
            if &now != expected {
                return Err(format!(
                    "after a failed commit {uri} is not its durable state: {}",
                    describe(now.as_ref(), expected.as_ref())
                ));
            }
        }
        Ok(())
    }

    /// Learns the durable state of channels that are clean now but unknown (after an
    /// ambiguous change, once nothing in flight touches them).
    pub fn relearn(&mut self, host: &Host<SimStore>, session_ids: &[String]) {
        for id in session_ids {
            for uri in session_channels(id) {
                if !self.shadow.contains_key(&uri) && !self.touches(&uri) {
                    self.shadow.insert(uri.clone(), host.channel_state(&uri));
                }
            }
        }
    }

    /// Oracle 3, at a crash: the state every channel must have in the next host. `done_through`
    /// is the highest number durable in the store (reported or not). `None` for a channel
    /// whose state after its last durable change is unknown.
    pub fn expected_after_crash(
        &self,
        done_through: u64,
    ) -> BTreeMap<String, Option<Option<Value>>> {
        let mut expected: BTreeMap<String, Option<Option<Value>>> = self
            .shadow
            .iter()
            .map(|(k, v)| (k.clone(), Some(v.clone())))
            .collect();
        for c in self.issued.range(..=done_through).map(|(_, c)| c) {
            for uri in c.info.channels() {
                expected.insert(uri.clone(), c.after.get(&uri).cloned());
            }
        }
        expected
    }

    /// Oracle 3, after the restart: the new host holds exactly the durable state.
    pub fn after_crash(
        &mut self,
        expected: &BTreeMap<String, Option<Option<Value>>>,
        host: &Host<SimStore>,
    ) -> Result<(), String> {
        for (uri, want) in expected {
            let Some(want) = want else {
                self.stats.states_unknown += 1;
                continue;
            };
            self.stats.states_compared += 1;
            let got = host.channel_state(uri);
            if &got != want {
                return Err(format!(
                    "after a crash {uri} is not the durable state: {}",
                    describe(got.as_ref(), want.as_ref())
                ));
            }
        }
        Ok(())
    }

    /// Oracle 1 and 2 for one frame the host emits to `conn`, against the store as it is now.
    pub fn on_send(&mut self, conn: ConnId, frame: &str, store: &MemStore) -> Result<(), String> {
        let call = self.call.unwrap_or(Call::Other);
        // The hold rule: frames that reveal state wait for every change handed out before
        // they were made. In a call that releases nothing, anything in flight was handed out
        // before the frame was made.
        let holding = call == Call::Other && self.in_flight();
        const NOTIFICATION: &str = "{\"jsonrpc\":\"2.0\",\"method\":";
        if let Some(rest) = frame.strip_prefix(NOTIFICATION) {
            if rest.starts_with("\"action\"") {
                // A broadcast goes out once per subscriber, one after another: check it once.
                if !holding && self.last_envelope == frame {
                    return Ok(());
                }
                self.on_envelope(frame, store, holding)?;
                self.last_envelope.clear();
                self.last_envelope.push_str(frame);
                return Ok(());
            }
            if rest.starts_with("\"root/") && holding {
                return Err(format!(
                    "a root notification left while a change was in flight: {}",
                    clip(frame)
                ));
            }
            // Client-service traffic depends on no durable state.
            return Ok(());
        }
        self.on_response(conn, frame, store, holding)
    }

    fn on_envelope(&mut self, frame: &str, store: &MemStore, holding: bool) -> Result<(), String> {
        let v: Value =
            serde_json::from_str(frame).map_err(|e| format!("host frame is not JSON: {e}"))?;
        let Some(params) = v.get("params") else {
            return Ok(());
        };
        if params.get("rejectionReason").is_some() {
            // A rejection reveals no state: it carries the current serverSeq, checked by
            // the client against its stream.
            return Ok(());
        }
        let seq = params.get("serverSeq").and_then(Value::as_u64).unwrap_or(0);
        let channel = params.get("channel").and_then(Value::as_str).unwrap_or("");
        self.stats.frames_checked += 1;
        if channel == CATALOG {
            if seq > store.server_seq() {
                return Err(format!(
                    "catalog event at serverSeq {seq} left before its reservation was durable (store at {})",
                    store.server_seq()
                ));
            }
            return Ok(());
        }
        if holding {
            return Err(format!(
                "event {seq} on {channel} left while a change handed out before it was in flight"
            ));
        }
        check_event(params, seq, channel, store, &self.failed_seqs)
    }

    fn on_response(
        &mut self,
        conn: ConnId,
        frame: &str,
        store: &MemStore,
        holding: bool,
    ) -> Result<(), String> {
        let v: Value =
            serde_json::from_str(frame).map_err(|e| format!("host frame is not JSON: {e}"))?;
        let Some(id) = v.get("id").filter(|id| !id.is_null()) else {
            return Ok(());
        };
        let key = (conn, id.to_string());
        let Some(method) = self.requests.remove(&key) else {
            return Ok(());
        };
        let Some(result) = v.get("result") else {
            self.waiting.remove(&key);
            self.failed_causes.remove(&key);
            return Ok(());
        };
        // `dispatchAction` is acknowledged with `null` whatever becomes of the action: its
        // outcome is the echo (a rejection, for a failed commit).
        // The registry's answers stay true when the catalog's reservation fails: the registry
        // lives in memory (the catalog's observers re-snapshot instead).
        let answered_anyway = matches!(
            method.as_str(),
            "dispatchAction"
                | "client/registerService"
                | "client/updateService"
                | "client/unregisterService"
        );
        if self.failed_causes.remove(&key) && !answered_anyway {
            return Err(format!(
                "{method} id {} was answered with success, but its change failed",
                key.1
            ));
        }
        if let Some(n) = self.waiting.remove(&key) {
            if n > self.reported {
                return Err(format!(
                    "{method} id {} was answered before its change {n} was durable (durable through {})",
                    key.1, self.reported
                ));
            }
        }
        let reveals = matches!(
            method.as_str(),
            "initialize"
                | "reconnect"
                | "subscribe"
                | "createSession"
                | "listSessions"
                | "dispatchAction"
        );
        if !reveals {
            return Ok(());
        }
        self.stats.frames_checked += 1;
        if holding {
            return Err(format!(
                "the answer to {method} id {} left while a change handed out before it was in flight",
                key.1
            ));
        }
        let mark = store.server_seq();
        let covered = |what: &str, seq: Option<u64>| match seq {
            Some(s) if s > mark => Err(format!(
                "{method} answer carries {what} {s}, beyond the durable {mark}"
            )),
            _ => Ok(()),
        };
        covered("serverSeq", result.get("serverSeq").and_then(Value::as_u64))?;
        let snapshots = result
            .get("snapshots")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .chain(result.get("snapshot"));
        for s in snapshots {
            covered("fromSeq", s.get("fromSeq").and_then(Value::as_u64))?;
        }
        for a in result
            .get("actions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let seq = a.get("serverSeq").and_then(Value::as_u64).unwrap_or(0);
            let channel = a.get("channel").and_then(Value::as_str).unwrap_or("");
            check_event(a, seq, channel, store, &self.failed_seqs)?;
        }
        Ok(())
    }
}

/// An accepted envelope `params` at `seq` on `channel` is in the store, as stored.
fn check_event(
    params: &Value,
    seq: u64,
    channel: &str,
    store: &MemStore,
    failed: &BTreeSet<u64>,
) -> Result<(), String> {
    if failed.contains(&seq) {
        return Err(format!(
            "event {seq} on {channel} of a failed change was revealed"
        ));
    }
    let events = store.events();
    let Ok(i) = events.binary_search_by_key(&seq, |e| e.seq) else {
        return Err(format!(
            "event {seq} on {channel} left before it was durable (store at {})",
            store.server_seq()
        ));
    };
    let stored = &events[i];
    if stored.channel != channel {
        return Err(format!(
            "event {seq} left on {channel}, the store holds it on {}",
            stored.channel
        ));
    }
    // Envelopes go out as stored: compare the text first, the JSON only when it differs.
    let same = params.get("serverSeq").is_some()
        && serde_json::from_str::<Value>(&stored.envelope).is_ok_and(|e| &e == params);
    if !same {
        return Err(format!(
            "event {seq} on {channel} left as {}, the store holds {}",
            clip(&params.to_string()),
            clip(&stored.envelope)
        ));
    }
    Ok(())
}

fn describe(got: Option<&Value>, want: Option<&Value>) -> String {
    match (got, want) {
        (Some(g), Some(w)) => crate::replica::difference(g, w, ("host", "durable")),
        (Some(_), None) => "the host has it, the durable state does not".into(),
        (None, Some(_)) => "the durable state has it, the host does not".into(),
        (None, None) => "no difference".into(),
    }
}

fn clip(text: &str) -> String {
    text.chars().take(200).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_their_session() {
        assert_eq!(session_of_key("ahp-chat:/s1"), Some("s1"));
        assert_eq!(session_of_key("axhost-session:/s2"), Some("s2"));
        assert_eq!(session_of_key("ahp-root://"), None);
        assert_eq!(session_of_key("client"), None);
    }
}
