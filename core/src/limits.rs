//! Every bound the host enforces, in one place, with the reason for each default.

use std::fmt;

/// Every bound the host enforces. Defaults follow the AXP host where it has one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Open connections at once. The driver refuses the upgrade (HTTP 503) above this and the
    /// core closes any connection past it. AXP host: 2048.
    pub connections_max: u32,
    /// Channels one connection may subscribe to; `-32043` above. AXP host: 256.
    pub subscriptions_per_conn_max: u32,
    /// Largest JSON-RPC message the core accepts (bytes); `-32043` above. AXP host: 65,536.
    pub message_bytes_max: u32,
    /// Largest WebSocket frame the driver reads at all; bigger frames close with 1009.
    /// Room for the largest message any method accepts plus framing: a maximal blob upload
    /// (`_axp/blobPut`, ~21.4 MB by default).
    pub frame_bytes_max: u32,
    /// Time a new connection has to send `initialize` or `reconnect`; then Close 1008.
    /// AXP host: 10 s.
    pub handshake_timeout_ms: u64,
    /// Outbound bytes queued for one connection before the host closes it. State events are
    /// never dropped; a slow consumer recovers by `reconnect`. AXP host: 2,000,000.
    pub queue_bytes_hard: u64,
    /// Events kept for `reconnect` replay; a larger gap is answered with snapshots.
    /// AXP host: 4096.
    pub replay_events_max: u32,
    /// `protocolVersions` entries accepted in `initialize`. AXP host: 32.
    pub protocol_versions_max: u32,
    /// Queued plus steering messages per chat; `-32043` above. AXP host: 32.
    pub pending_messages_max: u32,
    /// Outbound bytes above which client-service notifications to a connection are dropped
    /// (counted, never acknowledged). Below `queue_bytes_hard`, so state still flows.
    pub queue_bytes_soft: u64,
    /// Largest service `metadata` object (bytes of JSON); `-32043` above.
    pub service_metadata_bytes_max: u32,
    /// Longest application method name (bytes).
    pub service_method_bytes_max: u32,
    /// Largest `params` of a notification or request, and largest result (bytes).
    pub service_payload_bytes_max: u32,
    /// Largest `data` of a service's error that is passed on (bytes); larger data is dropped.
    pub service_error_data_bytes_max: u32,
    /// Services one connection may register; `-32043` above.
    pub services_per_conn_max: u32,
    /// Requests one caller connection may have in flight; `-32043` above.
    pub relays_per_conn_max: u32,
    /// Requests one service may have in flight; `-32043` above.
    pub relays_per_service_max: u32,
    /// Request timeout when the caller names none.
    pub relay_timeout_ms: u64,
    /// Longest request timeout a caller may ask for.
    pub relay_timeout_ms_max: u64,
    /// ClientIds that never dispatched an action one principal keeps bound; binding one more
    /// releases its least recently used one that no connection uses (`-32043` when all are in
    /// use). Above `connections_max` by default, so that never happens unless configured.
    pub idle_client_ids_per_principal: u32,
    /// Sessions the host holds, open and closed alike (AHP 0.9 has no way to delete one);
    /// `createSession` gets `-32043` at the limit. Every session stays in memory with its three
    /// channels, and `createSession` and `listSessions` look at all of them. A store that
    /// already holds more (the limit was lowered) is loaded whole; only creating is refused.
    /// The AXP host has no such bound.
    pub sessions_max: u32,
    /// What one chat's turns may cost, in bytes: each turn is charged the JSON bytes of its id
    /// and its message, as a snapshot holds them, and 128 bytes for its other fields. A turn
    /// that would pass it is refused with `-32043`, and so is a pending message that could no
    /// longer start as one.
    /// Turns are the durable history and are never removed, so a full chat stays full: its
    /// work continues in a new session. Keeps a chat's snapshot well inside the 16 MiB frames
    /// common WebSocket clients read. The AXP host has no such bound.
    pub chat_bytes_max: u64,
    /// What the turns of all chats together may cost (as for `chat_bytes_max`); `-32043` above.
    /// The host keeps every chat in memory, so this bounds the memory chats take whatever the
    /// number of sessions: measured, 1.3 bytes of RSS per byte charged for turns of 2 KB
    /// messages, 3.1 for turns of 20-byte ones (`io/examples/chat_memory.rs`).
    pub chat_bytes_total_max: u64,
    /// Largest AXP blob, in decoded bytes; `_axp/blobPut` gets `-32043` above. An upload
    /// message may be as large as its base64 plus 64 KiB. AXP host: 16,000,000.
    pub blob_bytes_max: u64,
    /// What all stored blobs may take together, in bytes; `-32043` above. Identical content is
    /// stored once, however many sessions reference it; each blob and each session's access to
    /// it is also charged [`BLOB_ENTRY_OVERHEAD_BYTES`], so many tiny blobs are bounded too.
    /// AXP host: 2,000,000,000 (bytes only).
    pub blob_storage_bytes_max: u64,
    /// Executors the AXP registry holds (online or not; entries are never deleted); a new
    /// `_axp/register` gets `-32043` above. Bounds the registry's memory and its snapshot
    /// (~250 bytes an entry). The AXP host has no such bound.
    pub executors_max: u32,
    /// Grants one AXP session holds; a new `_axp/grant` gets `-32043` above. The AXP host has
    /// no such bound.
    pub grants_per_session_max: u32,
    /// Changes issued and not yet reported durable, at most: what the host keeps in memory for
    /// a disk that is behind. At the limit the host takes no new input that may need a change
    /// (backpressure: `Host::accepting_input` is false, the driver stops reading, and messages
    /// already read wait in the hold below) until the writer catches up.
    pub in_flight_changes_max: u32,
    /// Messages held, at most, while the write path is full: messages that may need a change,
    /// and every later message of a connection that has one held, wait here in arrival order
    /// and are handled as soon as the writer reports changes durable. A driver that stops
    /// reading while `Host::accepting_input` is false holds at most a message or so; past the
    /// bound a message is refused with `-32043` (its connection is closed with 1008 if it
    /// already has messages held, which its answer must not overtake).
    pub held_messages_max: u32,
    /// Bytes of held messages, at most (as `held_messages_max`); the first message is always
    /// held whatever its size.
    pub held_message_bytes_max: u64,
    /// Lessons AXP repository memory holds, every status (lessons are never deleted; a retired
    /// one still counts); a new lesson gets `-32043` above. The host keeps every lesson in
    /// memory with its search index: measured, ~4.2 KB of RSS per lesson of ~1 KB of text
    /// (`benches/memory.rs`), so ~420 MB at this default, and ~6.5 s to load them at start.
    /// The AXP host has no such bound.
    pub memory_lessons_max: u32,
    /// Evidence entries one lesson holds; proposing it again from new evidence gets `-32043`
    /// above. Bounds the size of a lesson and of each `_axp/memoryChanged` (~120 bytes an
    /// entry). The AXP host has no such bound.
    pub memory_evidence_max: u32,
}

/// Defaults, named so tests and docs can cite them.
pub const DEFAULT_CONNECTIONS_MAX: u32 = 2048;
/// See [`Limits::subscriptions_per_conn_max`].
pub const DEFAULT_SUBSCRIPTIONS_PER_CONN_MAX: u32 = 256;
/// See [`Limits::message_bytes_max`].
pub const DEFAULT_MESSAGE_BYTES_MAX: u32 = 64 * 1024;
/// See [`Limits::frame_bytes_max`].
pub const DEFAULT_FRAME_BYTES_MAX: u32 = 24 * 1024 * 1024;
/// See [`Limits::handshake_timeout_ms`].
pub const DEFAULT_HANDSHAKE_TIMEOUT_MS: u64 = 10_000;
/// See [`Limits::queue_bytes_hard`].
pub const DEFAULT_QUEUE_BYTES_HARD: u64 = 2_000_000;
/// See [`Limits::replay_events_max`].
pub const DEFAULT_REPLAY_EVENTS_MAX: u32 = 4096;

/// See [`Limits::queue_bytes_soft`].
pub const DEFAULT_QUEUE_BYTES_SOFT: u64 = 1024 * 1024;
/// See [`Limits::idle_client_ids_per_principal`]: twice the default `connections_max`.
pub const DEFAULT_IDLE_CLIENT_IDS_PER_PRINCIPAL: u32 = 4096;
/// See [`Limits::sessions_max`]. A fresh session costs the host ~6 KB of memory (2,000 of them
/// added 11.7 MB of RSS, SQLite's cache included), so ~60 MB at this limit before chats grow.
pub const DEFAULT_SESSIONS_MAX: u32 = 10_000;
/// See [`Limits::chat_bytes_max`]: 128 turns of the largest message, thousands of typical ones.
pub const DEFAULT_CHAT_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// See [`Limits::chat_bytes_total_max`]: at most ~1.7 GB of RSS, ~0.7 GB for turns of 2 KB.
pub const DEFAULT_CHAT_BYTES_TOTAL_MAX: u64 = 512 * 1024 * 1024;
/// See [`Limits::service_payload_bytes_max`].
pub const DEFAULT_SERVICE_PAYLOAD_BYTES_MAX: u32 = 1024 * 1024;
/// Envelope room around a client-service payload (ids, method, metadata of the message).
pub const SERVICE_ENVELOPE_BYTES: u32 = 64 * 1024;
/// See [`Limits::blob_bytes_max`].
pub const DEFAULT_BLOB_BYTES_MAX: u64 = 16_000_000;
/// See [`Limits::blob_storage_bytes_max`].
pub const DEFAULT_BLOB_STORAGE_BYTES_MAX: u64 = 2_000_000_000;
/// Envelope room around an upload's base64 (the channel, operationId, mediaType, the JSON-RPC
/// frame).
pub const BLOB_ENVELOPE_BYTES: u64 = 64 * 1024;
/// What each stored blob and each session's access to one costs against
/// `blob_storage_bytes_max` beyond its bytes: the index entries the host keeps for it.
pub const BLOB_ENTRY_OVERHEAD_BYTES: u64 = 256;
/// See [`Limits::executors_max`].
pub const DEFAULT_EXECUTORS_MAX: u32 = 10_000;
/// See [`Limits::grants_per_session_max`].
pub const DEFAULT_GRANTS_PER_SESSION_MAX: u32 = 64;
/// See [`Limits::in_flight_changes_max`]: as many changes as the production writer queues
/// before `submit` blocks the loop (`io/src/writer.rs`).
pub const DEFAULT_IN_FLIGHT_CHANGES_MAX: u32 = 4096;
/// See [`Limits::held_messages_max`].
pub const DEFAULT_HELD_MESSAGES_MAX: u32 = 1024;
/// See [`Limits::held_message_bytes_max`]: a few maximal blob uploads.
pub const DEFAULT_HELD_MESSAGE_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// See [`Limits::memory_lessons_max`].
pub const DEFAULT_MEMORY_LESSONS_MAX: u32 = 100_000;
/// See [`Limits::memory_evidence_max`].
pub const DEFAULT_MEMORY_EVIDENCE_MAX: u32 = 64;

/// The largest `_axp/blobPut` message for blobs of at most `blob_bytes_max` bytes: their
/// base64 plus [`BLOB_ENVELOPE_BYTES`].
pub const fn blob_message_bytes_max(blob_bytes_max: u64) -> u64 {
    blob_bytes_max.div_ceil(3) * 4 + BLOB_ENVELOPE_BYTES
}

// Bounds that are not (yet) settings: fixed here, advertised or documented where they apply.

/// Deepest JSON nesting `serde_json` reads, and so the host's own store and every client built
/// on it: 127 levels of arrays and objects (it stops at 128).
pub const JSON_DEPTH_READABLE_MAX: usize = 127;
/// Levels the host wraps around an action's content, at most: a chat snapshot in an
/// `initialize` result holds a turn's message at `result.snapshots[].state.turns[].message`,
/// six levels deeper than in the `chat/turnStarted` that carried it (stored records and
/// replayed envelopes add fewer).
pub const ACTION_WRAPPING_DEPTH_MAX: usize = 6;
/// Deepest `dispatchAction` action accepted, in levels of arrays and objects (the action
/// object is the first); `-32602` above. The envelope's `params` is read raw, with no depth
/// limit, so without this bound an action could be committed that the host, wrapping it in
/// envelopes and checkpoints, could not read back at restart.
pub const ACTION_DEPTH_MAX: usize = 64;
/// Deepest client-service payload, in levels: notify and request `params`, a service's
/// `result` and its error `data`. The host forwards payloads as raw text, and `serde_json`
/// reads raw values without its depth limit, so without this bound the host would forward
/// frames (two levels deeper than the payload) that receivers built on `serde_json` cannot
/// read. Deeper request params get `-32602`, a notify is dropped, a result becomes a `-32043`
/// error and error data is left out. Also the depth the notify fast path scans to.
pub const SERVICE_PAYLOAD_DEPTH_MAX: usize = 100;
/// Deepest service `metadata` accepted (levels); `-32602` above. Catalog frames wrap metadata
/// five levels deep.
pub const SERVICE_METADATA_DEPTH_MAX: usize = 32;
/// Longest `clientService/request` id, in bytes of its JSON text (quotes included): the host
/// keeps a pending request's id until the request ends. `-32600` with `id: null` above.
pub const REQUEST_ID_BYTES_MAX: usize = 256;
/// Client services registered on the whole host at once; `-32043` above. Bounds the registry
/// (each service holds up to `service_metadata_bytes_max` of metadata) and the catalog snapshot,
/// whatever the number of connections: 2048 entries of at most 4 KiB of metadata make a frame
/// of ~9 MB, under the 16 MiB frame common WebSocket clients accept (tungstenite's default).
/// Per connection: `Limits::services_per_conn_max`.
pub const SERVICES_MAX: usize = 2048;

/// Comments one AXP session holds; `_axp/comment` gets `-32043` above (the AXP host's bound;
/// the history keeps every event).
pub const DISCUSSION_MAX: usize = 256;

/// Principals that may hold an AXP signing key (`_axp/review`, `_axp/approveReview`); a new
/// principal's first signature gets `-32043` above. Principals come from the configuration, so
/// this is never reached in practice; it bounds the table the host loads at start whatever the
/// configuration's history. The AXP host has no such bound.
pub const SIGNING_KEYS_MAX: usize = 10_000;
/// Largest state of `axp-memory://` the host sends as one snapshot (bytes of JSON, as an
/// export's bound): subscribing to a larger memory (or naming it in `initialize`) gets
/// `-32043`, and `reconnect` lists it as missing. Maintainers then recall lessons with
/// `_axp/memorySearch`. About 10,000 lessons of 1 KB fit.
pub const MEMORY_SNAPSHOT_BYTES_MAX: usize = 16 * 1024 * 1024;

const _: () = assert!(ACTION_DEPTH_MAX + ACTION_WRAPPING_DEPTH_MAX <= JSON_DEPTH_READABLE_MAX);
const _: () = assert!(SERVICE_METADATA_DEPTH_MAX + 5 <= JSON_DEPTH_READABLE_MAX);
const _: () = assert!(SERVICE_PAYLOAD_DEPTH_MAX + 2 <= JSON_DEPTH_READABLE_MAX);

const _: () = assert!(DEFAULT_MESSAGE_BYTES_MAX <= DEFAULT_FRAME_BYTES_MAX);
const _: () = assert!(DEFAULT_IDLE_CLIENT_IDS_PER_PRINCIPAL > DEFAULT_CONNECTIONS_MAX);
const _: () = assert!(DEFAULT_QUEUE_BYTES_SOFT < DEFAULT_QUEUE_BYTES_HARD);
const _: () =
    assert!(DEFAULT_SERVICE_PAYLOAD_BYTES_MAX + SERVICE_ENVELOPE_BYTES <= DEFAULT_FRAME_BYTES_MAX);
const _: () = assert!((DEFAULT_MESSAGE_BYTES_MAX as u64) < DEFAULT_QUEUE_BYTES_HARD);
const _: () =
    assert!(blob_message_bytes_max(DEFAULT_BLOB_BYTES_MAX) <= DEFAULT_FRAME_BYTES_MAX as u64);

impl Default for Limits {
    fn default() -> Self {
        Limits {
            connections_max: DEFAULT_CONNECTIONS_MAX,
            subscriptions_per_conn_max: DEFAULT_SUBSCRIPTIONS_PER_CONN_MAX,
            message_bytes_max: DEFAULT_MESSAGE_BYTES_MAX,
            frame_bytes_max: DEFAULT_FRAME_BYTES_MAX,
            handshake_timeout_ms: DEFAULT_HANDSHAKE_TIMEOUT_MS,
            queue_bytes_hard: DEFAULT_QUEUE_BYTES_HARD,
            replay_events_max: DEFAULT_REPLAY_EVENTS_MAX,
            protocol_versions_max: 32,
            pending_messages_max: 32,
            queue_bytes_soft: DEFAULT_QUEUE_BYTES_SOFT,
            service_metadata_bytes_max: 4 * 1024,
            service_method_bytes_max: 256,
            service_payload_bytes_max: DEFAULT_SERVICE_PAYLOAD_BYTES_MAX,
            service_error_data_bytes_max: 64 * 1024,
            services_per_conn_max: 64,
            relays_per_conn_max: 256,
            relays_per_service_max: 1024,
            relay_timeout_ms: 30_000,
            relay_timeout_ms_max: 300_000,
            idle_client_ids_per_principal: DEFAULT_IDLE_CLIENT_IDS_PER_PRINCIPAL,
            sessions_max: DEFAULT_SESSIONS_MAX,
            chat_bytes_max: DEFAULT_CHAT_BYTES_MAX,
            chat_bytes_total_max: DEFAULT_CHAT_BYTES_TOTAL_MAX,
            blob_bytes_max: DEFAULT_BLOB_BYTES_MAX,
            blob_storage_bytes_max: DEFAULT_BLOB_STORAGE_BYTES_MAX,
            executors_max: DEFAULT_EXECUTORS_MAX,
            grants_per_session_max: DEFAULT_GRANTS_PER_SESSION_MAX,
            in_flight_changes_max: DEFAULT_IN_FLIGHT_CHANGES_MAX,
            held_messages_max: DEFAULT_HELD_MESSAGES_MAX,
            held_message_bytes_max: DEFAULT_HELD_MESSAGE_BYTES_MAX,
            memory_lessons_max: DEFAULT_MEMORY_LESSONS_MAX,
            memory_evidence_max: DEFAULT_MEMORY_EVIDENCE_MAX,
        }
    }
}

/// A `Limits` value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LimitsError(pub &'static str);

impl fmt::Display for LimitsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid limits: {}", self.0)
    }
}

impl std::error::Error for LimitsError {}

impl Limits {
    /// Checks the relationships between limits, before any input is handled.
    pub fn validate(&self) -> Result<(), LimitsError> {
        if self.connections_max == 0 {
            return Err(LimitsError("connections_max must be at least 1"));
        }
        if self.subscriptions_per_conn_max == 0 {
            return Err(LimitsError("subscriptions_per_conn_max must be at least 1"));
        }
        if self.message_bytes_max < 1024 {
            return Err(LimitsError("message_bytes_max must be at least 1024"));
        }
        if self.frame_bytes_max < self.message_bytes_max {
            return Err(LimitsError(
                "frame_bytes_max must be at least message_bytes_max",
            ));
        }
        if self.queue_bytes_hard < u64::from(self.message_bytes_max) {
            return Err(LimitsError(
                "queue_bytes_hard must be at least message_bytes_max",
            ));
        }
        if self.handshake_timeout_ms == 0 {
            return Err(LimitsError("handshake_timeout_ms must be positive"));
        }
        if self.queue_bytes_soft >= self.queue_bytes_hard {
            return Err(LimitsError(
                "queue_bytes_soft must be below queue_bytes_hard",
            ));
        }
        if u64::from(self.service_payload_bytes_max) + u64::from(SERVICE_ENVELOPE_BYTES)
            > u64::from(self.frame_bytes_max)
        {
            return Err(LimitsError(
                "frame_bytes_max must hold service_payload_bytes_max plus 64 KiB",
            ));
        }
        if self.relay_timeout_ms == 0 || self.relay_timeout_ms > self.relay_timeout_ms_max {
            return Err(LimitsError(
                "relay_timeout_ms must be positive and at most relay_timeout_ms_max",
            ));
        }
        if self.idle_client_ids_per_principal == 0 {
            return Err(LimitsError(
                "idle_client_ids_per_principal must be at least 1",
            ));
        }
        if self.sessions_max == 0 {
            return Err(LimitsError("sessions_max must be at least 1"));
        }
        if self.chat_bytes_max < 1024 {
            return Err(LimitsError("chat_bytes_max must be at least 1024"));
        }
        if self.chat_bytes_total_max < self.chat_bytes_max {
            return Err(LimitsError(
                "chat_bytes_total_max must be at least chat_bytes_max",
            ));
        }
        if self.service_method_bytes_max == 0 || self.services_per_conn_max == 0 {
            return Err(LimitsError("service limits must be positive"));
        }
        if self.blob_bytes_max == 0 {
            return Err(LimitsError("blob_bytes_max must be at least 1"));
        }
        if self.blob_storage_bytes_max < self.blob_bytes_max + 2 * BLOB_ENTRY_OVERHEAD_BYTES {
            return Err(LimitsError(
                "blob_storage_bytes_max must hold at least one blob of blob_bytes_max",
            ));
        }
        if blob_message_bytes_max(self.blob_bytes_max) > u64::from(self.frame_bytes_max) {
            return Err(LimitsError(
                "frame_bytes_max must hold a blob upload: blob_bytes_max as base64 plus 64 KiB",
            ));
        }
        if self.executors_max == 0 || self.grants_per_session_max == 0 {
            return Err(LimitsError(
                "executors_max and grants_per_session_max must be at least 1",
            ));
        }
        if self.in_flight_changes_max == 0 {
            return Err(LimitsError("in_flight_changes_max must be at least 1"));
        }
        if self.memory_lessons_max == 0 || self.memory_evidence_max == 0 {
            return Err(LimitsError(
                "memory_lessons_max and memory_evidence_max must be at least 1",
            ));
        }
        Ok(())
    }

    /// The largest message accepted for `method` (client-service traffic carries payloads up to
    /// `service_payload_bytes_max`, a blob upload its base64 plus envelope; everything else is
    /// bounded by `message_bytes_max`). `None` is a response to a relayed request.
    pub fn message_bytes_max_for(&self, method: Option<&str>) -> usize {
        if method == Some(crate::axp::BLOB_PUT) {
            let upload =
                usize::try_from(blob_message_bytes_max(self.blob_bytes_max)).unwrap_or(usize::MAX);
            return upload.max(self.message_bytes_max as usize);
        }
        let service = match method {
            None => true,
            Some(m) => m.starts_with("clientService/") || m.starts_with("client/"),
        };
        if service {
            (self.service_payload_bytes_max + SERVICE_ENVELOPE_BYTES).max(self.message_bytes_max)
                as usize
        } else {
            self.message_bytes_max as usize
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_match_the_axp_host() {
        let l = Limits::default();
        assert_eq!(l.validate(), Ok(()));
        assert_eq!(l.connections_max, 2048);
        assert_eq!(l.subscriptions_per_conn_max, 256);
        assert_eq!(l.message_bytes_max, 65_536);
        assert_eq!(l.handshake_timeout_ms, 10_000);
        assert_eq!(l.queue_bytes_hard, 2_000_000);
        assert_eq!(l.replay_events_max, 4096);
        assert_eq!(l.queue_bytes_soft, 1024 * 1024);
        assert_eq!(l.service_metadata_bytes_max, 4096);
        assert_eq!(l.service_method_bytes_max, 256);
        assert_eq!(l.service_payload_bytes_max, 1024 * 1024);
        assert_eq!(l.service_error_data_bytes_max, 65_536);
        assert_eq!(l.services_per_conn_max, 64);
        assert_eq!(l.relays_per_conn_max, 256);
        assert_eq!(l.relays_per_service_max, 1024);
        assert_eq!(l.relay_timeout_ms, 30_000);
        assert_eq!(l.relay_timeout_ms_max, 300_000);
        assert_eq!(l.sessions_max, 10_000);
        assert_eq!(l.chat_bytes_max, 8 * 1024 * 1024);
        assert_eq!(l.chat_bytes_total_max, 512 * 1024 * 1024);
        assert_eq!(l.blob_bytes_max, 16_000_000);
        assert_eq!(l.blob_storage_bytes_max, 2_000_000_000);
        assert_eq!(l.in_flight_changes_max, 4096);
        assert_eq!(l.held_messages_max, 1024);
        assert_eq!(l.held_message_bytes_max, 64 * 1024 * 1024);
        assert!(l.memory_lessons_max >= 100_000, "the brief's scale");
        assert_eq!(l.memory_evidence_max, 64);
        // A maximal upload, as the reference sizes its frames (ceil(16e6 * 4 / 3) + room).
        let upload = l.message_bytes_max_for(Some("_axp/blobPut"));
        assert!(upload >= 21_333_336 + 4096, "{upload}");
        assert!(upload <= l.frame_bytes_max as usize);
        assert_eq!(l.message_bytes_max_for(Some("_axp/emit")), 65_536);
    }

    #[test]
    fn inconsistent_limits_are_refused() {
        let l = Limits {
            frame_bytes_max: 1024,
            ..Limits::default()
        };
        assert!(l.validate().is_err());
        let l = Limits {
            queue_bytes_hard: 10,
            ..Limits::default()
        };
        assert!(l.validate().is_err());
        let l = Limits {
            idle_client_ids_per_principal: 0,
            ..Limits::default()
        };
        assert!(l.validate().is_err());
        let l = Limits {
            sessions_max: 0,
            ..Limits::default()
        };
        assert_eq!(
            l.validate(),
            Err(LimitsError("sessions_max must be at least 1"))
        );
        let l = Limits {
            chat_bytes_max: 1023,
            ..Limits::default()
        };
        assert_eq!(
            l.validate(),
            Err(LimitsError("chat_bytes_max must be at least 1024"))
        );
        let l = Limits {
            frame_bytes_max: 16 * 1024 * 1024,
            ..Limits::default()
        };
        assert_eq!(
            l.validate(),
            Err(LimitsError(
                "frame_bytes_max must hold a blob upload: blob_bytes_max as base64 plus 64 KiB"
            ))
        );
        let l = Limits {
            in_flight_changes_max: 0,
            ..Limits::default()
        };
        assert_eq!(
            l.validate(),
            Err(LimitsError("in_flight_changes_max must be at least 1"))
        );
        let l = Limits {
            memory_evidence_max: 0,
            ..Limits::default()
        };
        assert_eq!(
            l.validate(),
            Err(LimitsError(
                "memory_lessons_max and memory_evidence_max must be at least 1"
            ))
        );
        let l = Limits {
            chat_bytes_total_max: DEFAULT_CHAT_BYTES_MAX - 1,
            ..Limits::default()
        };
        assert_eq!(
            l.validate(),
            Err(LimitsError(
                "chat_bytes_total_max must be at least chat_bytes_max"
            ))
        );
    }
}
