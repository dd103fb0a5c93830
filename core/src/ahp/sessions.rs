//! The session table: every session with its channels' states, what their chats cost, and the
//! root channel. Lent to the commands that read and change sessions.

use std::collections::BTreeMap;

use ahp_types::notifications::{PartialSessionSummary, SessionSummaryChangedParams};
use serde_json::Value;

use crate::ahp::session::{self, RestoreError, SessionChannel, SessionEntry};
use crate::channel::{session_uri, ChannelRef, ROOT};
use crate::kernel::Kernel;
use crate::limits::Limits;
use crate::log::change::{StoredRecord, Table};
use crate::log::store::Store;
use crate::net::jsonrpc;
use crate::net::output::Frame;

/// Title, summary status and `modifiedAt` of a session before a change, for root
/// notifications.
pub(crate) type SummaryBefore = (String, u32, String);

pub(crate) struct Sessions {
    /// Boxed: an entry is ~3.6 KB, and a change takes its session out and puts it back, which
    /// moved it through the map's nodes (and the change's `Vec`) on every dispatch.
    entries: BTreeMap<String, Box<SessionEntry>>,
    /// The sum of every session's `chat_bytes`, held against `chat_bytes_total_max`.
    chat_bytes_total: u64,
    root_state: Value,
    /// The repository every exchange belongs to (`HostConfig::repository`).
    repository: String,
}

impl Sessions {
    /// The sessions the store holds, brought up to date with their events.
    pub(crate) fn load<S: Store>(
        records: &[StoredRecord],
        k: &mut Kernel<S>,
    ) -> Result<Sessions, RestoreError> {
        let mut entries = BTreeMap::new();
        let repository = k.config().repository.clone();
        for r in records.iter().filter(|r| r.table == Table::State) {
            if let Some(id) = SessionEntry::id_of_meta_key(&r.key) {
                match SessionEntry::restore(id, &repository, &mut k.view())? {
                    Some(entry) => {
                        entries.insert(id.to_owned(), Box::new(entry));
                    }
                    None => return Err(RestoreError::Corrupt(r.key.clone())),
                }
            }
        }
        // A store over lowered chat limits loads whole; only new turns are refused.
        let chat_bytes_total = entries.values().map(|e| e.chat_bytes).sum();
        Ok(Sessions {
            entries,
            chat_bytes_total,
            root_state: session::root_state(),
            repository,
        })
    }

    /// The newest timestamp the sessions carry (never handed out again as an earlier one).
    pub(crate) fn latest_timestamp_ms(&self) -> u64 {
        self.entries
            .values()
            .map(|e| e.latest_timestamp_ms())
            .max()
            .unwrap_or(0)
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn get(&self, id: &str) -> Option<&SessionEntry> {
        self.entries.get(id).map(|e| &**e)
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.entries.contains_key(id)
    }

    pub(crate) fn values(&self) -> impl Iterator<Item = &SessionEntry> {
        self.entries.values().map(|e| &**e)
    }

    pub(crate) fn chat_bytes_total(&self) -> u64 {
        self.chat_bytes_total
    }

    /// The repository every exchange belongs to.
    pub(crate) fn repository(&self) -> &str {
        &self.repository
    }

    /// Takes a session out of the table to build a change on it (see `ahp::tx`).
    pub(crate) fn take(&mut self, id: &str) -> Option<Box<SessionEntry>> {
        self.entries.remove(id)
    }

    /// Puts a session (back) into the table; `chat_bytes_before` is what the table counted for
    /// it when it was taken (0 for a new one).
    pub(crate) fn put(&mut self, entry: Box<SessionEntry>, chat_bytes_before: u64) {
        self.chat_bytes_total = self.chat_bytes_total - chat_bytes_before + entry.chat_bytes;
        self.entries.insert(entry.id.clone(), entry);
    }

    /// Rebuilds session `id` as the store and the changes in flight have it: after a change
    /// that failed, or one that was abandoned after reducing in place. A session neither
    /// holds is removed. Storage that cannot be read leaves no trustworthy state: that is a
    /// crash, and a restart recovers from the store.
    pub(crate) fn rebuild<S: Store>(&mut self, k: &mut Kernel<S>, id: &str) {
        let old = self.entries.remove(id).map_or(0, |e| e.chat_bytes);
        self.chat_bytes_total -= old;
        match SessionEntry::restore(id, &self.repository, &mut k.view()) {
            Ok(Some(entry)) => self.put(Box::new(entry), 0),
            Ok(None) => {}
            Err(e) => panic!("session {id} cannot be rebuilt: {e:?}"),
        }
    }

    /// The state of a session channel or the root.
    pub(crate) fn channel_state(&self, uri: &str) -> Option<Value> {
        match ChannelRef::parse(uri) {
            ChannelRef::Root => Some(self.root_state.clone()),
            ChannelRef::Session(id) => self
                .entries
                .get(id)
                .map(|e| e.state_json(SessionChannel::Session)),
            ChannelRef::Chat(id) => self
                .entries
                .get(id)
                .map(|e| e.state_json(SessionChannel::Chat)),
            ChannelRef::Changeset(id) => self
                .entries
                .get(id)
                .map(|e| e.state_json(SessionChannel::Changeset)),
            ChannelRef::Exchange(id) => self
                .entries
                .get(id)
                .map(|e| e.state_json(SessionChannel::Exchange)),
            ChannelRef::Catalog
            | ChannelRef::Executors
            | ChannelRef::Memory
            | ChannelRef::Unknown => None,
        }
    }

    /// A root notification about session `id`, made by change `change`, to root subscribers
    /// allowed to read it.
    pub(crate) fn notify_root<S: Store>(
        k: &mut Kernel<S>,
        session_id: &str,
        frame: &Frame,
        change: u64,
    ) {
        for conn in k.subscribers(ROOT) {
            let allowed = k
                .conn(conn)
                .is_some_and(|c| c.principal.can_read_session(session_id));
            if allowed {
                k.push_event(conn, frame.clone(), change);
            }
        }
    }

    /// `root/sessionSummaryChanged` with the fields change `change` altered.
    pub(crate) fn summary_changed<S: Store>(
        &self,
        k: &mut Kernel<S>,
        id: &str,
        before: SummaryBefore,
        change: u64,
    ) {
        let Some(entry) = self.entries.get(id) else {
            return;
        };
        let (t0, s0, m0) = before;
        let mut changes = PartialSessionSummary::default();
        if entry.session.title != t0 {
            changes.title = Some(entry.session.title.clone());
        }
        if entry.summary_status() != s0 {
            changes.status = Some(entry.summary_status());
        }
        if entry.modified_at() != m0 {
            changes.modified_at = Some(entry.modified_at().to_owned());
        }
        if changes == PartialSessionSummary::default() {
            return;
        }
        let params = SessionSummaryChangedParams {
            channel: ROOT.into(),
            session: session_uri(id),
            changes,
        };
        let Ok(params) = serde_json::to_string(&params) else {
            return;
        };
        let frame = jsonrpc::notification_frame("root/sessionSummaryChanged", &params);
        Self::notify_root(k, id, &frame, change);
    }

    /// Recounts what every chat's turns cost and compares it with the running counts the chat
    /// limits are enforced on. Returns the first mismatch, or a charge over its limit (the
    /// limits only ever refuse, so under the limits the store was written with, none can be).
    pub(crate) fn audit_chat_bytes(&self, limits: &Limits) -> Result<(), String> {
        // `session` names the chat checked; `None` is all of them.
        let check = |session: Option<&str>, counted: u64, charged: u64, limit: (&str, u64)| {
            let what = || session.map_or("all chats".to_owned(), |id| format!("session {id}"));
            if counted != charged {
                return Err(format!(
                    "{}: the turns cost {counted} bytes but {charged} are charged",
                    what()
                ));
            }
            if counted > limit.1 {
                return Err(format!(
                    "{}: the turns cost {counted} bytes, over {} {}",
                    what(),
                    limit.0,
                    limit.1
                ));
            }
            Ok(())
        };
        let mut total = 0;
        for (id, entry) in &self.entries {
            // Executors' output is charged as it arrives; only the log can recount it.
            let counted = session::chat_cost(&entry.chat) + entry.meta.response_bytes;
            check(
                Some(id),
                counted,
                entry.chat_bytes,
                ("chat_bytes_max", limits.chat_bytes_max),
            )?;
            total += counted;
        }
        check(
            None,
            total,
            self.chat_bytes_total,
            ("chat_bytes_total_max", limits.chat_bytes_total_max),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A table holding one session whose chat started one turn.
    fn with_a_turn() -> Sessions {
        let mut entry = SessionEntry::create("s1", "t".into(), "task".into(), 0, "r", 0);
        let message: ahp_types::state::Message =
            serde_json::from_value(json!({"text": "hi", "origin": {"kind": "user"}}))
                .expect("message");
        entry.chat.active_turn = Some(ahp_types::state::ActiveTurn {
            id: "t1".into(),
            started_at: String::new(),
            message: message.clone(),
            response_parts: vec![],
            usage: None,
        });
        entry.turn_started("t1", &message);
        let mut sessions = Sessions {
            entries: BTreeMap::new(),
            chat_bytes_total: 0,
            root_state: session::root_state(),
            repository: "r".into(),
        };
        sessions.put(Box::new(entry), 0);
        sessions
    }

    #[test]
    fn the_chat_audit_finds_every_count_that_strays_and_every_limit_passed() {
        let limits = Limits::default();
        assert_eq!(with_a_turn().audit_chat_bytes(&limits), Ok(()));
        let charged = with_a_turn().chat_bytes_total;

        let mut s = with_a_turn();
        if let Some(e) = s.entries.get_mut("s1") {
            e.chat_bytes += 1;
        }
        let err = s
            .audit_chat_bytes(&limits)
            .expect_err("a session's count strayed");
        assert!(err.starts_with("session s1: "), "{err}");

        let mut s = with_a_turn();
        s.chat_bytes_total -= 1;
        let err = s
            .audit_chat_bytes(&limits)
            .expect_err("the table's count strayed");
        assert!(err.starts_with("all chats: "), "{err}");

        let tight = Limits {
            chat_bytes_max: charged - 1,
            ..Limits::default()
        };
        let err = with_a_turn()
            .audit_chat_bytes(&tight)
            .expect_err("a chat over its limit");
        assert!(err.contains("over chat_bytes_max"), "{err}");

        let tight = Limits {
            chat_bytes_total_max: charged - 1,
            ..Limits::default()
        };
        let err = with_a_turn()
            .audit_chat_bytes(&tight)
            .expect_err("all chats over their limit");
        assert!(err.contains("over chat_bytes_total_max"), "{err}");
    }
}
