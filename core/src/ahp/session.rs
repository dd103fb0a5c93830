//! Sessions and the AHP channels each one owns: `ahp-session:/ID`, its default chat
//! `ahp-chat:/ID` and its changeset `ahp-changeset:/ID`, shaped as the AXP host creates them.

use ahp_types::actions::StateAction;
use ahp_types::state::{
    AgentInfo, ChangesetState, ChangesetStatus, ChatState, ChatSummary, Message, RootState,
    SessionLifecycle, SessionState, SessionSummary,
};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::axp::reducer::{reduce_exchange, AxpAction};
use crate::axp::state::{ExchangeState, Status};
use crate::channel::{changeset_uri, chat_uri, exchange_uri, session_uri};
use crate::kernel::time::iso8601;
use crate::log::change::{Event, Record, StoreError, Table};
use crate::log::store::Store;
use crate::log::write_path::View;

/// `SessionStatus.Idle`.
pub(crate) const STATUS_IDLE: u32 = 1;
/// The only provider this host offers.
pub(crate) const PROVIDER: &str = "axp";
/// The AXP wire version advertised in `_meta["org.axp.exchange"]`.
pub const AXP_VERSION: &str = "0.2.0";
/// The `_meta` key of the AXP exchange extension.
pub const AXP_CAPABILITY: &str = "org.axp.exchange";

/// Host-private facts about a session that no AHP state carries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SessionMeta {
    pub(crate) task: String,
    pub(crate) created_at_ms: u64,
    pub(crate) closed: bool,
    /// The `serverSeq` through which the stored channel states are current. Events above it
    /// are replayed through the reducers at load.
    #[serde(default)]
    pub(crate) checkpoint_seq: u64,
    /// The `serverSeq` current when the session was created: its seeds' `fromSeq` in
    /// `_axp/export`.
    #[serde(default)]
    pub(crate) created_seq: u64,
    /// The title it was created with (its seeds'); `None` in stores written before it was kept.
    #[serde(default)]
    pub(crate) title: Option<String>,
    /// What executors' output added to this chat's turns costs against the chat limits (see
    /// [`response_cost`]), as of `checkpoint_seq`; events after it are charged as they replay.
    #[serde(default)]
    pub(crate) response_bytes: u64,
}

/// A session's states are rewritten in the store once the events written since the last
/// rewrite add up to at least the rewrite's own size (and at least this many bytes). Between
/// rewrites only events are written. Rewriting costs O(state) but happens once per O(state)
/// bytes of events, so each action costs O(its own size) amortized however long the chat grows,
/// and a restart replays no more event bytes than it reads state bytes.
pub(crate) const CHECKPOINT_MIN_BYTES: usize = 64 * 1024;

/// One session with its four channels' states.
#[derive(Clone, Debug)]
pub(crate) struct SessionEntry {
    pub(crate) id: String,
    pub(crate) meta: SessionMeta,
    pub(crate) session: SessionState,
    pub(crate) chat: ChatState,
    pub(crate) changeset: ChangesetState,
    /// `axp-session:/ID`.
    pub(crate) exchange: ExchangeState,
    /// Bytes of events committed since the stored states were last rewritten (memory only).
    pub(crate) bytes_since_checkpoint: usize,
    /// Bytes the last rewrite wrote (memory only).
    pub(crate) checkpoint_bytes: usize,
    /// Every turn id this chat has used (memory only), so "turn id unused" is not a scan.
    pub(crate) turn_ids: std::collections::BTreeSet<String>,
    /// What this chat's turns cost against `chat_bytes_max`: the sum of [`turn_cost`] over
    /// every turn it started, plus `meta.response_bytes` (memory only; recomputed at load).
    pub(crate) chat_bytes: u64,
}

/// Bytes a turn is charged beyond its id and message: the fields every turn carries (`state`,
/// `startedAt`, `duration`, `responseParts`, their keys), so a chat of empty turns is bounded
/// too. A cancelled turn of this host serializes those in ~110 bytes.
pub(crate) const TURN_OVERHEAD_BYTES: u64 = 128;

/// A turn id of the shape the host makes (`next_turn`, a hyphenated UUID), for charging a
/// pending message as the turn it would become: every such id has this JSON length.
pub(crate) const HOST_TURN_ID_SHAPE: &str = "00000000-0000-0000-0000-000000000000";

/// What a turn costs against the chat limits: the JSON bytes of its id and of its message, as
/// a snapshot holds them (escapes included), plus [`TURN_OVERHEAD_BYTES`]. A turn keeps its id
/// and message for life (turns are never removed and this host adds no response parts), so the
/// cost is fixed when the turn starts.
pub(crate) fn turn_cost(id: &str, message: &Message) -> u64 {
    /// Counts what serde writes, without keeping it.
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing a string and a typed message into a counter cannot fail (every map key is a
    // string).
    let _ = serde_json::to_writer(&mut count, id);
    let _ = serde_json::to_writer(&mut count, message);
    count.0 + TURN_OVERHEAD_BYTES
}

/// What an executor's action adds to a turn costs against the chat limits: its JSON bytes as
/// the host serializes it. Charged as each one arrives and never refunded (a delta's text stays
/// in the turn for good), so a chat's response bytes are bounded like its messages.
pub(crate) fn response_cost(action: &StateAction) -> u64 {
    serde_json::to_vec(action).map_or(0, |v| v.len() as u64)
}

/// The cost of every turn `chat` holds, counted afresh: what `SessionEntry::chat_bytes` must
/// equal, less the response bytes executors added (which only the log can recount).
pub(crate) fn chat_cost(chat: &ChatState) -> u64 {
    chat.turns
        .iter()
        .map(|t| turn_cost(&t.id, &t.message))
        .chain(
            chat.active_turn
                .iter()
                .map(|t| turn_cost(&t.id, &t.message)),
        )
        .sum()
}

/// Which of a session's states a change touched, so only those are rewritten.
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Touched {
    pub(crate) meta: bool,
    pub(crate) session: bool,
    pub(crate) chat: bool,
    pub(crate) changeset: bool,
    pub(crate) exchange: bool,
}

impl Touched {
    pub(crate) const ALL: Touched = Touched {
        meta: true,
        session: true,
        chat: true,
        changeset: true,
        exchange: true,
    };
}

pub(crate) fn meta_key(id: &str) -> String {
    format!("axhost-session:/{id}")
}

/// A session whose stored records cannot be read: named by key, never by content.
#[derive(Debug)]
pub(crate) enum RestoreError {
    Store(StoreError),
    Corrupt(String),
}

impl SessionEntry {
    /// A new session as the AXP host creates it: ready, idle, one default chat, one changeset,
    /// an open exchange of `repository`. `seq` is the host's `serverSeq` when it is created.
    pub(crate) fn create(
        id: &str,
        title: String,
        task: String,
        now_ms: u64,
        repository: &str,
        seq: u64,
    ) -> SessionEntry {
        let chat = chat_uri(id);
        let now = iso8601(now_ms);
        let chat_state = ChatState {
            resource: chat.clone(),
            title: title.clone(),
            status: STATUS_IDLE,
            activity: None,
            origin: None,
            interactivity: None,
            working_directories: None,
            modified_at: now.clone(),
            turns: vec![],
            turns_next_cursor: None,
            active_turn: None,
            steering_message: None,
            queued_messages: None,
            draft: None,
            meta: None,
        };
        let session: SessionState = serde_json::from_value(json!({
            "provider": PROVIDER,
            "title": title,
            "status": STATUS_IDLE,
            "lifecycle": "ready",
            "activeClients": [],
            "chats": [{ "resource": chat, "title": title, "status": STATUS_IDLE, "modifiedAt": now }],
            "defaultChat": chat,
            "changesets": [{
                "label": "Git checkpoint",
                "uriTemplate": changeset_uri(id),
                "changeKind": "session"
            }],
            "_meta": { AXP_CAPABILITY: { "channel": exchange_uri(id) } },
        }))
        // A literal shaped like the 0.9.0 type; a failure here is a bug, caught by unit tests.
        .expect("session literal matches SessionState");
        debug_assert_eq!(session.lifecycle, SessionLifecycle::Ready);
        SessionEntry {
            id: id.to_owned(),
            exchange: ExchangeState::initial(id, repository, &task),
            meta: SessionMeta {
                task,
                created_at_ms: now_ms,
                closed: false,
                checkpoint_seq: seq,
                created_seq: seq,
                title: Some(title),
                response_bytes: 0,
            },
            session,
            chat: chat_state,
            changeset: ChangesetState {
                status: ChangesetStatus::Ready,
                error: None,
                files: vec![],
                operations: None,
            },
            bytes_since_checkpoint: 0,
            checkpoint_bytes: 0,
            turn_ids: Default::default(),
            chat_bytes: 0,
        }
    }

    /// Notes a turn the chat just started: its id is used for good and its cost is charged.
    pub(crate) fn turn_started(&mut self, id: &str, message: &Message) {
        self.turn_ids.insert(id.to_owned());
        self.chat_bytes += turn_cost(id, message);
    }

    /// Charges what a chat action costs against the chat limits: a started turn's message, an
    /// executor's output (see [`response_cost`]). Applied to every chat action the host emits
    /// and every one a load replays, so the running count is the same either way.
    pub(crate) fn charge_chat_action(&mut self, action: &StateAction) {
        if let StateAction::ChatTurnStarted(a) = action {
            self.turn_started(&a.turn_id, &a.message);
        } else if crate::axp::turn::is_executor_action(action) {
            let cost = response_cost(action);
            self.meta.response_bytes += cost;
            self.chat_bytes += cost;
        }
    }

    /// Applies an AXP action to the exchange, keeping what the meta mirrors of it (a closed
    /// session frees its task).
    pub(crate) fn apply_exchange(&mut self, action: &AxpAction) -> bool {
        let applied = reduce_exchange(&mut self.exchange, action);
        if self.exchange.status == Status::Closed {
            self.meta.closed = true;
        }
        applied
    }

    /// Whether the session is closed (its chat takes no actions, its task is free).
    pub(crate) fn closed(&self) -> bool {
        self.meta.closed || self.exchange.status == Status::Closed
    }

    /// Whether the events since the last rewrite now justify rewriting the states.
    pub(crate) fn checkpoint_due(&self) -> bool {
        self.bytes_since_checkpoint >= self.checkpoint_bytes.max(CHECKPOINT_MIN_BYTES)
    }

    /// The records of a checkpoint through `seq`; resets the byte counters.
    pub(crate) fn checkpoint(&mut self, seq: u64) -> Vec<Record> {
        self.meta.checkpoint_seq = seq;
        let records = self.records(Touched::ALL);
        self.checkpoint_bytes = records
            .iter()
            .map(|r| r.value.as_ref().map_or(0, |v| v.len()))
            .sum();
        self.bytes_since_checkpoint = 0;
        records
    }

    /// The state records this entry writes for the parts `touched`.
    pub(crate) fn records(&self, touched: Touched) -> Vec<Record> {
        let mut out = Vec::new();
        let mut put =
            |key: String, value: String| out.push(Record::json(Table::State, key, &value));
        // Serializing these typed states cannot fail: every map key is a string.
        if touched.meta {
            put(
                meta_key(&self.id),
                serde_json::to_string(&self.meta).unwrap_or_default(),
            );
        }
        if touched.session {
            put(
                session_uri(&self.id),
                serde_json::to_string(&self.session).unwrap_or_default(),
            );
        }
        if touched.chat {
            put(
                chat_uri(&self.id),
                serde_json::to_string(&self.chat).unwrap_or_default(),
            );
        }
        if touched.changeset {
            put(
                changeset_uri(&self.id),
                serde_json::to_string(&self.changeset).unwrap_or_default(),
            );
        }
        if touched.exchange {
            put(
                exchange_uri(&self.id),
                serde_json::to_string(&self.exchange).unwrap_or_default(),
            );
        }
        out
    }

    /// Rebuilds an entry from stored records; `None` if any is missing or unreadable. A store
    /// written before sessions had an exchange holds none: such a session gets a new one, of
    /// `repository`.
    pub(crate) fn from_records(
        id: &str,
        repository: &str,
        get: impl Fn(&str) -> Option<String>,
    ) -> Option<SessionEntry> {
        let texts = [
            get(&meta_key(id))?,
            get(&session_uri(id))?,
            get(&chat_uri(id))?,
            get(&changeset_uri(id))?,
        ];
        let exchange_text = get(&exchange_uri(id));
        let chat: ChatState = serde_json::from_str(&texts[2]).ok()?;
        let meta: SessionMeta = serde_json::from_str(&texts[0]).ok()?;
        let exchange = match &exchange_text {
            Some(text) => serde_json::from_str(text).ok()?,
            None => ExchangeState::initial(id, repository, &meta.task),
        };
        let turn_ids = chat
            .turns
            .iter()
            .map(|t| t.id.clone())
            .chain(chat.active_turn.iter().map(|t| t.id.clone()))
            .collect();
        Some(SessionEntry {
            id: id.to_owned(),
            session: serde_json::from_str(&texts[1]).ok()?,
            chat_bytes: chat_cost(&chat) + meta.response_bytes,
            meta,
            chat,
            changeset: serde_json::from_str(&texts[3]).ok()?,
            exchange,
            bytes_since_checkpoint: 0,
            checkpoint_bytes: texts.iter().map(String::len).sum::<usize>()
                + exchange_text.map_or(0, |t| t.len()),
            turn_ids,
        })
    }

    /// Applies one stored envelope to this session's states, as clients reduce it. `None` when
    /// the envelope cannot be read or does not belong here (a corrupt store).
    pub(crate) fn replay(&mut self, envelope: &str) -> Option<()> {
        use ahp::reducers::{
            apply_action_to_changeset, apply_action_to_chat, apply_action_to_session,
        };
        #[derive(serde::Deserialize)]
        struct AxpEnvelope {
            channel: String,
            action: AxpAction,
        }
        if envelope.starts_with("{\"channel\":\"axp-session:/") {
            // The exchange's own envelopes; AHP's `StateAction` does not know their actions.
            let env: AxpEnvelope = serde_json::from_str(envelope).ok()?;
            if env.channel != exchange_uri(&self.id) {
                return None;
            }
            self.apply_exchange(&env.action);
            self.bytes_since_checkpoint += envelope.len();
            return Some(());
        }
        let env: ahp_types::actions::ActionEnvelope = serde_json::from_str(envelope).ok()?;
        let outcome = match crate::channel::ChannelRef::parse(&env.channel) {
            crate::channel::ChannelRef::Session(id) if id == self.id => {
                apply_action_to_session(&mut self.session, &env.action)
            }
            crate::channel::ChannelRef::Chat(id) if id == self.id => {
                apply_action_to_chat(&mut self.chat, &env.action)
            }
            crate::channel::ChannelRef::Changeset(id) if id == self.id => {
                apply_action_to_changeset(&mut self.changeset, &env.action)
            }
            _ => return None,
        };
        self.bytes_since_checkpoint += envelope.len();
        if env.channel == chat_uri(&self.id) {
            self.charge_chat_action(&env.action);
        }
        (outcome != ahp::reducers::ReduceOutcome::OutOfScope).then_some(())
    }

    /// Channels whose events a load replays.
    pub(crate) fn channels(&self) -> [String; 4] {
        [
            session_uri(&self.id),
            chat_uri(&self.id),
            changeset_uri(&self.id),
            exchange_uri(&self.id),
        ]
    }

    /// Rebuilds a session as the newest state has it: its checkpointed states, then every
    /// event after the checkpoint, in `serverSeq` order. `Ok(None)` when no session `id`
    /// exists (its creation failed or was never made).
    pub(crate) fn restore<S: Store>(
        id: &str,
        repository: &str,
        view: &mut View<'_, S>,
    ) -> Result<Option<SessionEntry>, RestoreError> {
        let mut records = std::collections::BTreeMap::new();
        for key in [
            meta_key(id),
            session_uri(id),
            chat_uri(id),
            changeset_uri(id),
            exchange_uri(id),
        ] {
            match view
                .record(Table::State, &key)
                .map_err(RestoreError::Store)?
            {
                Some(v) => {
                    let text = String::from_utf8(v.to_vec())
                        .map_err(|_| RestoreError::Corrupt(key.clone()))?;
                    records.insert(key, text);
                }
                None if key == meta_key(id) => return Ok(None),
                // Stores written before sessions had an exchange (see `from_records`).
                None if key == exchange_uri(id) => {}
                None => return Err(RestoreError::Corrupt(key)),
            }
        }
        let mut events = Vec::new();
        let entry = SessionEntry::from_records(id, repository, |k| records.get(k).cloned())
            .ok_or_else(|| RestoreError::Corrupt(meta_key(id)))?;
        for channel in entry.channels() {
            let after = entry.meta.checkpoint_seq;
            events.extend(
                view.channel_events_after(&channel, after)
                    .map_err(RestoreError::Store)?,
            );
        }
        Self::replay_all(entry, events).map(Some)
    }

    /// Applies `events` (this session's, any order) to a checkpointed entry.
    pub(crate) fn replay_all(
        mut entry: SessionEntry,
        mut events: Vec<Event>,
    ) -> Result<SessionEntry, RestoreError> {
        events.sort_by_key(|e| e.seq);
        for event in &events {
            if entry.replay(&event.envelope).is_none() {
                return Err(RestoreError::Corrupt(meta_key(&entry.id)));
            }
        }
        Ok(entry)
    }

    /// The id of the session a stored record key belongs to, if it is a meta record.
    pub(crate) fn id_of_meta_key(key: &str) -> Option<&str> {
        key.strip_prefix("axhost-session:/")
    }

    /// The latest timestamp this session carries (creation, or the chat's `modifiedAt`), in
    /// Unix milliseconds. A restarted host never hands out an earlier one.
    pub(crate) fn latest_timestamp_ms(&self) -> u64 {
        let modified = self
            .chat
            .modified_at
            .parse::<jiff::Timestamp>()
            .map_or(0, |t| t.as_millisecond());
        self.meta
            .created_at_ms
            .max(u64::try_from(modified).unwrap_or(0))
    }

    /// Status shown in summaries: the default chat's, else the session's.
    pub(crate) fn summary_status(&self) -> u32 {
        self.session
            .chats
            .first()
            .map_or(self.session.status, |c: &ChatSummary| c.status)
    }

    /// `modifiedAt` shown in summaries: the default chat's.
    pub(crate) fn modified_at(&self) -> &str {
        self.session
            .chats
            .first()
            .map_or(self.chat.modified_at.as_str(), |c| c.modified_at.as_str())
    }

    /// The listSessions / root notification summary.
    pub(crate) fn summary(&self) -> SessionSummary {
        SessionSummary {
            provider: self.session.provider.clone(),
            title: self.session.title.clone(),
            status: self.summary_status(),
            activity: None,
            origin: None,
            project: None,
            working_directories: None,
            annotations: None,
            resource: session_uri(&self.id),
            created_at: iso8601(self.meta.created_at_ms),
            modified_at: self.modified_at().to_owned(),
            changes: None,
            meta: None,
        }
    }

    /// The state JSON of one of this entry's channels.
    pub(crate) fn state_json(&self, which: SessionChannel) -> Value {
        let v = match which {
            SessionChannel::Session => serde_json::to_value(&self.session),
            SessionChannel::Chat => serde_json::to_value(&self.chat),
            SessionChannel::Changeset => serde_json::to_value(&self.changeset),
            SessionChannel::Exchange => serde_json::to_value(&self.exchange),
        };
        v.unwrap_or(Value::Null)
    }
}

/// One of a session's channels.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub(crate) enum SessionChannel {
    Session,
    Chat,
    Changeset,
    Exchange,
}

/// The root state: one agent (the AXP provider) and the AXP extension's pointers.
pub(crate) fn root_state() -> Value {
    let agent = AgentInfo {
        provider: PROVIDER.into(),
        display_name: "Parked ACP agent".into(),
        description: "An ACP agent connected by a contributor".into(),
        models: vec![],
        protected_resources: None,
        customizations: None,
        capabilities: None,
    };
    let root = RootState {
        agents: vec![agent],
        active_sessions: None,
        terminals: None,
        config: None,
        meta: None,
    };
    let mut v = serde_json::to_value(root).unwrap_or(Value::Null);
    if let Value::Object(m) = &mut v {
        m.insert(
            "_meta".into(),
            json!({ AXP_CAPABILITY: {
                "version": AXP_VERSION,
                "memory": crate::channel::MEMORY,
                "executors": crate::channel::EXECUTORS,
            } }),
        );
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_session_round_trips_through_its_records() {
        let e = SessionEntry::create("s1", "T".into(), "task".into(), 1_000, "repo", 0);
        assert_eq!(e.session.chats.len(), 1);
        assert_eq!(e.session.default_chat.as_deref(), Some("ahp-chat:/s1"));
        let records = e.records(Touched::ALL);
        assert_eq!(records.len(), 5);
        let get = |k: &str| {
            records
                .iter()
                .find(|r| r.key == k)
                .and_then(|r| r.value.as_ref())
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let back = SessionEntry::from_records("s1", "repo", get).expect("rebuilt");
        assert_eq!(back.session, e.session);
        assert_eq!(back.exchange, e.exchange);
        assert_eq!(back.chat, e.chat);
        assert_eq!(back.meta, e.meta);
        assert_eq!(e.summary().created_at, "1970-01-01T00:00:01.000Z");
    }

    #[test]
    fn root_state_decodes_as_the_official_root_state() {
        let v = root_state();
        let _: RootState = serde_json::from_value(v.clone()).expect("RootState");
        assert_eq!(v["agents"][0]["provider"], "axp");
    }
}
