//! A simulated AHP client: one principal, one stable `clientId`, at most one connection at a
//! time, and a mirror of every channel it subscribes to.
//!
//! The client behaves like the official runtime: `initialize` with initial subscriptions, then
//! `reconnect` (its last seen `serverSeq` and its subscriptions) as the first message of every
//! later connection, falling back to `initialize` when the host answers with an error. What
//! it checks as frames arrive lives in [`crate::stream`]; what it does on its turn in
//! [`crate::script`].
//!
//! *Leaving* channels: after sending `unsubscribe` (request or notification) at message index
//! `i`, envelopes may still arrive until the host has processed message `i`, which the client
//! knows once any request sent at or after `i` is answered (a connection is FIFO).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axhost_core::{ConnId, Principal, Role};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};

use crate::options::Owners;
use crate::replica::Replica;
use crate::roles::{Answer, Heard, Rumor};

mod connection;

pub(crate) use connection::Pending;
pub use connection::{Connection, Request};

/// The root channel.
pub const ROOT: &str = "ahp-root://";

/// Consecutive failed handshakes a client retries at once before waiting for its next turn.
const HANDSHAKE_RETRIES_MAX: u32 = 4;

/// A calm client waits this long times its consecutive failures (at most ten) before it retries
/// a refused handshake. At once would loop in zero simulated time over a link whose latency
/// healed to 0 ms, while the refusal (a full clientId quota) lasts until the host hears a stale
/// connection close, which is queued for later: time must move for that to arrive.
pub const HANDSHAKE_RETRY_STEP_MS: u64 = 20;

/// The last own dispatch the host was seen to apply under one `clientSeq`.
#[derive(Clone, Debug)]
pub struct Accepted {
    /// [`action_identity`] of what was applied.
    pub identity: String,
    /// Where it was applied.
    pub server_seq: u64,
    /// No dispatch with other content was sent under this `clientSeq` since: an identical one
    /// is a retry the host must not apply again (its receipt still matches).
    pub sole: bool,
}

/// What makes two dispatches "the same" for the host's retry receipt, comparable between what
/// a client sends and what an echo carries: the channel and the typed action, without the
/// `startedAt` the host stamps itself. Input that is no valid action keeps its raw text (it is
/// never applied, so it never matches an echo).
pub fn action_identity(channel: &str, action: &Value) -> String {
    let typed = serde_json::from_value::<ahp_types::actions::StateAction>(action.clone())
        .ok()
        .and_then(|a| serde_json::to_value(a).ok());
    match typed {
        Some(mut v) => {
            if let Some(m) = v.as_object_mut() {
                m.remove("startedAt");
            }
            format!("{channel} {v}")
        }
        None => format!("{channel} raw {action}"),
    }
}

/// Counters for the run report.
#[derive(Clone, Debug, Default)]
pub struct ClientStats {
    /// Connections opened.
    pub connects: u64,
    /// `reconnect` answered by replay.
    pub replays: u64,
    /// `reconnect` answered by snapshots.
    pub snapshots: u64,
    /// `reconnect` answered by an error (then `initialize`).
    pub reconnect_errors: u64,
    /// Envelopes reduced into replicas.
    pub applied: u64,
    /// Rejection echoes received.
    pub rejections: u64,
    /// `dispatchAction` requests answered with an error (a refused request gets no echo).
    pub dispatch_errors: u64,
    /// Of those, refusals by the chat limits (`chat_bytes_max`, `chat_bytes_total_max`).
    pub chat_limit_rejections: u64,
    /// Own dispatches seen accepted.
    pub accepted: u64,
    /// Envelopes received inside `reconnect` replays.
    pub replayed: u64,
    /// The last rejection reason received.
    pub last_rejection: Option<String>,
    /// `clientService/request`s sent.
    pub calls: u64,
    /// Calls answered with a result.
    pub call_results: u64,
    /// Calls answered with an error, by code.
    pub call_errors: BTreeMap<i64, u64>,
    /// `clientService/notify` sent.
    pub notifies: u64,
    /// `clientService/notification`s heard as an owner.
    pub notifications_heard: u64,
    /// `clientService/handleRequest`s received as an owner.
    pub handled: u64,
    /// Answers sent as an owner (duplicates and late ones included).
    pub answers: u64,
    /// Answers sent on a later connection than the one that was asked (foreign there).
    pub strays: u64,
    /// `$/cancelRequest`s heard as an owner.
    pub cancels_heard: u64,
    /// Forged responses sent for host ids this connection was never sent.
    pub forged: u64,
}

/// One simulated client. See the module docs.
pub struct SimClient {
    /// Position in the world's client list.
    pub index: usize,
    /// Who it is, from its transport credential.
    pub principal: Arc<Principal>,
    /// Stable across all its connections, like the official runtime's, unless the world gives
    /// it a fresh one per connection (`Options::fresh_client_ids`, like the AXP executor loop).
    pub client_id: String,
    /// Fresh clientIds taken so far.
    pub(crate) fresh_ids: u64,
    pub(crate) rng: ChaCha8Rng,
    /// The current connection, if any.
    pub connection: Option<Connection>,
    /// Mirrors of the confirmed subscriptions; kept across connections for `reconnect`.
    pub replicas: BTreeMap<String, Replica>,
    /// `lastSeenServerSeq`: every replica holds every event up to it.
    pub cursor: u64,
    /// Highest `serverSeq` this client ever saw from the host, across connections.
    pub(crate) seq_high: u64,
    pub(crate) next_request: u64,
    pub(crate) next_version: u64,
    pub(crate) next_client_seq: u64,
    /// The last dispatch's params, for retries with the same `clientSeq`.
    pub(crate) last_dispatch: Option<(u64, Value, Value)>,
    /// The last own dispatch seen accepted under each `clientSeq`.
    pub(crate) accepted: BTreeMap<u64, Accepted>,
    pub(crate) client_seq_sent_max: u64,
    /// Session ids this client learned exist.
    pub known_sessions: BTreeSet<String>,
    pub(crate) list_cursor: Option<String>,
    /// Whether a handshake ever succeeded (the clientId is bound to this principal).
    pub bound: bool,
    /// Handshakes refused in a row (reset by one that succeeds).
    pub handshake_failures: u32,
    /// Set by a calm client's refused handshake: the world retries it after a pause
    /// ([`HANDSHAKE_RETRY_STEP_MS`]).
    pub handshake_retry_wanted: bool,
    /// Session ids the world's pool holds.
    pub(crate) session_pool: Vec<String>,
    /// Calm: no random variations in handshakes (always `reconnect` when there is state,
    /// only the root as initial subscription, retry on every error). Set for scripted worlds
    /// and in the liveness phase.
    pub calm: bool,
    /// Frames to send on the current connection, drained by the world.
    pub outbox: Vec<Vec<u8>>,
    /// Counters.
    pub stats: ClientStats,
    /// How this client answers as a service owner.
    pub owners: Owners,
    /// Manual owner (scripted tests): answers nothing on its own and logs what it hears.
    pub manual: bool,
    /// Answers to send later, drained by the world onto its agenda.
    pub(crate) answers: Vec<Answer>,
    /// What this client tells the others behind the host's back, drained by the world.
    pub(crate) told: Vec<Rumor>,
    /// Manual mode: `handleRequest`s heard, in order.
    pub inbox: Vec<Heard>,
    /// Manual mode: call outcomes heard, in order: `(id, result or error object)`.
    pub outcomes: Vec<(String, Result<Value, Value>)>,
    /// `payloadBytes` the host advertised at `initialize` (owners size big answers by it).
    pub(crate) payload_limit: usize,
}

impl SimClient {
    /// A client that has never connected.
    pub fn new(
        index: usize,
        principal: Arc<Principal>,
        client_id: String,
        rng: ChaCha8Rng,
        session_pool: Vec<String>,
    ) -> SimClient {
        SimClient {
            index,
            principal,
            client_id,
            fresh_ids: 0,
            rng,
            connection: None,
            replicas: BTreeMap::new(),
            cursor: 0,
            seq_high: 0,
            // Above the ids calls use (1 to 5), so a call never shares an id with an
            // ordinary request.
            next_request: 100,
            next_version: 1,
            next_client_seq: 1,
            last_dispatch: None,
            accepted: BTreeMap::new(),
            client_seq_sent_max: 0,
            known_sessions: BTreeSet::new(),
            list_cursor: None,
            bound: false,
            handshake_failures: 0,
            handshake_retry_wanted: false,
            session_pool,
            calm: false,
            outbox: Vec::new(),
            stats: ClientStats::default(),
            owners: Owners::PROMPT,
            manual: false,
            answers: Vec::new(),
            told: Vec::new(),
            inbox: Vec::new(),
            outcomes: Vec::new(),
            payload_limit: 4096,
        }
    }

    /// Whether the client may hear about session `id`.
    pub fn can_see(&self, id: &str) -> bool {
        self.principal.can_read_session(id)
    }

    /// Whether this client's principal may drive chats.
    pub fn is_maintainer(&self) -> bool {
        self.principal.role == Role::Maintainer
    }

    /// Every channel the host may hold a subscription to for the current connection: mirrors,
    /// leaving channels and channels named by outstanding requests.
    pub fn channels_maybe_subscribed(&self) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = self.replicas.keys().cloned().collect();
        if let Some(c) = &self.connection {
            out.extend(c.leaving.keys().cloned());
            for p in c.pending.values() {
                match &p.request {
                    Request::Initialize { subscriptions, .. }
                    | Request::Reconnect { subscriptions, .. } => {
                        out.extend(subscriptions.iter().cloned())
                    }
                    Request::Subscribe { channel } => {
                        out.insert(channel.clone());
                    }
                    _ => {}
                }
            }
        }
        out
    }

    pub(crate) fn version(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    // ─── Sending ────────────────────────────────────────────────────────────────────────────

    /// Sends a request and remembers it. Ids are mostly numbers, sometimes strings.
    pub(crate) fn request(&mut self, method: &str, params: Value, request: Request) {
        let n = self.next_request;
        self.next_request += 1;
        let id = if n % 5 == 4 {
            Value::String(format!("r{n}"))
        } else {
            Value::from(n)
        };
        let Some(c) = self.connection.as_mut() else {
            return;
        };
        c.pending.insert(
            id.to_string(),
            Pending {
                index: c.sent,
                request,
            },
        );
        c.sent += 1;
        let frame = json!({ "jsonrpc": "2.0", "id": id, "method": method, "params": params });
        self.outbox.push(frame.to_string().into_bytes());
    }

    /// Sends a notification (never answered).
    pub(crate) fn notify(&mut self, method: &str, params: Value) {
        let Some(c) = self.connection.as_mut() else {
            return;
        };
        c.sent += 1;
        let frame = json!({ "jsonrpc": "2.0", "method": method, "params": params });
        self.outbox.push(frame.to_string().into_bytes());
    }

    /// Sends raw bytes. `null_error` says the host must answer with one `id: null` error.
    pub(crate) fn send_raw(&mut self, bytes: Vec<u8>, null_error: bool) {
        let Some(c) = self.connection.as_mut() else {
            return;
        };
        c.sent += 1;
        if null_error {
            c.null_errors_expected += 1;
        }
        self.outbox.push(bytes);
    }

    /// Index the next message on the current connection will have.
    pub(crate) fn next_index(&self) -> u64 {
        self.connection.as_ref().map_or(0, |c| c.sent)
    }

    /// Marks `channel` as leaving from the next message on (an `unsubscribe` about to go).
    pub(crate) fn leave(&mut self, channel: &str) {
        let index = self.next_index();
        self.replicas.remove(channel);
        if let Some(c) = self.connection.as_mut() {
            c.leaving.insert(channel.to_owned(), index);
        }
    }

    /// Records a dispatch about to be sent with `client_seq`.
    pub(crate) fn dispatching(
        &mut self,
        client_seq: u64,
        channel: &Value,
        action: &Value,
        as_request: bool,
    ) {
        self.client_seq_sent_max = self.client_seq_sent_max.max(client_seq);
        let identity = action_identity(channel.as_str().unwrap_or_default(), action);
        if let Some(a) = self.accepted.get_mut(&client_seq) {
            if a.identity != identity {
                // A restarted counter: the host may now apply the earlier action again.
                a.sole = false;
            }
        }
        // Only a notification may be refused with an echo; a request is refused with an error.
        if let Some(c) = self.connection.as_mut().filter(|_| !as_request) {
            c.dispatches.entry(client_seq).or_default().push(identity);
        }
    }

    // ─── Connection lifecycle ───────────────────────────────────────────────────────────────

    /// Takes a new clientId for the next connection, as clients that pick one per connection
    /// do. Everything numbered under the old id stays with it: the new one starts at
    /// `clientSeq` 1, retries nothing sent before, and is unbound, so the handshake will be an
    /// `initialize`. Echoes of the old id's actions are someone else's from now on.
    pub fn take_fresh_client_id(&mut self) {
        self.fresh_ids += 1;
        let base = self
            .client_id
            .split('.')
            .next()
            .unwrap_or_default()
            .to_owned();
        self.client_id = format!("{base}.{}", self.fresh_ids);
        self.bound = false;
        self.next_client_seq = 1;
        self.last_dispatch = None;
        self.accepted.clear();
        self.client_seq_sent_max = 0;
    }

    /// A new connection is up. Unless `silent`, the client starts its handshake at once.
    pub fn connected(&mut self, conn: ConnId, silent: bool) {
        assert!(
            self.connection.is_none(),
            "client {} connected twice",
            self.index
        );
        self.connection = Some(Connection::new(conn));
        self.stats.connects += 1;
        if !silent {
            self.handshake();
        }
    }

    /// The host closed the connection with `code` and `reason`. The reason must fit what the
    /// host knew of the connection: a handshake timeout only before the handshake completed,
    /// "too many connections" only before anything else was sent.
    pub fn closed_by_host(&mut self, code: u16, reason: &str) -> Result<(), String> {
        let Some(c) = self.connection.as_ref() else {
            return Ok(());
        };
        let broken = match code {
            1013 => (c.received > 0)
                .then(|| format!("closed 1013 ({reason}) after {} frames", c.received)),
            1008 if reason == "Initialize required" => c
                .ready
                .then(|| "an initialized connection was closed for not initializing".to_owned()),
            1008 if reason == "Unsupported protocol version" => (!c.unsupported_version)
                .then(|| "closed for its protocol version without a -32005".to_owned()),
            1008 => None,
            1011 if reason == "host state rolled back; reconnect" => (!c.rolled_back)
                .then(|| "closed for a rollback without a -32603 before it".to_owned()),
            other => Some(format!("unexpected close code {other} ({reason})")),
        };
        self.disconnected();
        broken.map_or(Ok(()), Err)
    }

    /// The connection is gone (either side closed it, or the host restarted).
    pub fn disconnected(&mut self) {
        self.connection = None;
        self.outbox.clear();
    }

    /// Frames received on the current connection.
    pub fn frames_received(&self) -> u64 {
        self.connection.as_ref().map_or(0, |c| c.received)
    }

    /// The epoch of the current connection: how many connections this client opened so far.
    /// With the clientId it names the sender connection in notification payloads.
    pub fn epoch(&self) -> u64 {
        self.stats.connects
    }

    /// Starts the handshake: `reconnect` when there is state to resume (like the official
    /// runtime), else `initialize`.
    pub fn handshake(&mut self) {
        let resumable = self.bound && (self.cursor > 0 || !self.replicas.is_empty());
        if resumable && (self.calm || self.rng_ratio(9, 10)) {
            if !self.calm && self.rng_ratio(1, 20) {
                // Not the first message any more: the host must refuse the reconnect.
                self.request("ping", json!({ "channel": ROOT }), Request::Ping);
            }
            self.send_reconnect();
        } else {
            self.send_initialize(self.calm);
        }
    }

    fn send_reconnect(&mut self) {
        let mut subscriptions: Vec<String> = self.replicas.keys().cloned().collect();
        if !self.calm && self.rng_ratio(1, 8) {
            // Channels the host must report as missing: malformed, or out of scope.
            let bogus = self.bogus_channel();
            subscriptions.push(bogus);
        }
        let cursor = self.cursor;
        let params = json!({
            "channel": ROOT,
            "clientId": self.client_id,
            "lastSeenServerSeq": cursor,
            "subscriptions": subscriptions,
        });
        if let Some(c) = self.connection.as_mut() {
            c.handshake_pending = true;
        }
        self.request(
            "reconnect",
            params,
            Request::Reconnect {
                subscriptions,
                cursor,
            },
        );
    }

    /// `initialize`, dropping every mirror: the snapshots it asks for replace them.
    pub(crate) fn send_initialize(&mut self, safe: bool) {
        self.replicas.clear();
        let mut subscriptions = Vec::new();
        if safe || self.rng_ratio(7, 8) {
            subscriptions.push(ROOT.to_owned());
        }
        if !safe {
            let known: Vec<String> = self.known_sessions.iter().cloned().collect();
            for id in known {
                if self.rng_ratio(1, 3) {
                    let kind = ["ahp-session:/", "ahp-chat:/", "ahp-changeset:/"]
                        [self.rng_below(3) as usize];
                    subscriptions.push(format!("{kind}{id}"));
                }
            }
            if self.rng_ratio(1, 12) {
                let bogus = self.bogus_channel();
                subscriptions.push(bogus);
            }
        }
        let (versions, version): (Vec<&str>, &'static str) =
            match self.rng_below(if safe { 1 } else { 40 }) {
                0..=33 => (vec!["0.9.0"], "0.9.0"),
                34..=37 => (vec!["0.9.0", "0.9.7", "1.0.0"], "0.9.7"),
                38 => (vec!["1.0.0"], ""),
                _ => (vec!["0.9"], ""),
            };
        let params = json!({
            "channel": ROOT,
            "protocolVersions": versions,
            "clientId": self.client_id,
            "initialSubscriptions": subscriptions,
        });
        if let Some(c) = self.connection.as_mut() {
            c.handshake_pending = true;
        }
        self.request(
            "initialize",
            params,
            Request::Initialize {
                subscriptions,
                version,
            },
        );
    }

    /// After a failed handshake: try again at once, a few times, with safe parameters; a calm
    /// client keeps trying, after a pause the world schedules.
    pub(crate) fn handshake_failed(&mut self) {
        self.handshake_failures += 1;
        if self.calm {
            self.handshake_retry_wanted = true;
        } else if self.handshake_failures <= HANDSHAKE_RETRIES_MAX {
            self.send_initialize(true);
        }
    }

    /// The pause before a calm client's next handshake attempt.
    pub fn handshake_retry_delay_ms(&self) -> u64 {
        HANDSHAKE_RETRY_STEP_MS * u64::from(self.handshake_failures.clamp(1, 10))
    }

    /// Retries the handshake on `conn` if it is still this client's connection, not ready and
    /// not already handshaking.
    pub fn retry_handshake(&mut self, conn: ConnId) {
        let waiting = self
            .connection
            .as_ref()
            .is_some_and(|c| c.conn == conn && !c.ready && !c.handshake_pending);
        if waiting {
            self.send_initialize(true);
        }
    }

    /// Requests still owed a response, for liveness reports.
    pub fn awaiting(&self) -> Option<String> {
        self.connection.as_ref().and_then(Connection::awaiting)
    }
}

/// The session id a channel URI names, if any.
pub fn session_of(uri: &str) -> Option<&str> {
    ["ahp-session:/", "ahp-chat:/", "ahp-changeset:/"]
        .iter()
        .find_map(|p| uri.strip_prefix(p))
}

/// Milliseconds since the Unix epoch of `YYYY-MM-DDTHH:MM:SS[.f+]Z`.
pub fn unix_ms(text: &str) -> Option<i64> {
    let b = text.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        std::str::from_utf8(b.get(r)?).ok()?.parse().ok()
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
    {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, s) = (num(11..13)?, num(14..16)?, num(17..19)?);
    let rest = &text[19..];
    let frac = rest.strip_suffix('Z')?;
    let millis = match frac.strip_prefix('.') {
        None if frac.is_empty() => 0,
        Some(f) if !f.is_empty() && f.bytes().all(|c| c.is_ascii_digit()) => {
            let padded = format!("{f:0<3}");
            padded[..3].parse::<i64>().ok()?
        }
        _ => return None,
    };
    // Days from civil (Howard Hinnant).
    let y = if mo <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (mo + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + h * 3600 + mi * 60 + s) * 1000) + millis)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_parse_with_any_fraction() {
        assert_eq!(unix_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(unix_ms("2025-03-10T18:42:03.123Z"), Some(1_741_632_123_123));
        assert_eq!(unix_ms("2025-03-10T18:42:03Z"), Some(1_741_632_123_000));
        assert_eq!(unix_ms("2025-03-10T18:42:03.1Z"), Some(1_741_632_123_100));
        assert_eq!(unix_ms("2000-02-29T00:00:00.000Z"), Some(951_782_400_000));
        assert_eq!(unix_ms("2025-03-10 18:42:03Z"), None);
    }

    #[test]
    fn session_ids_come_from_session_scoped_uris() {
        assert_eq!(session_of("ahp-chat:/s1"), Some("s1"));
        assert_eq!(session_of("ahp-root://"), None);
    }
}
