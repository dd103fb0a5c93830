//! Interop, black box: the OFFICIAL AHP Rust client (`ahp` 1.0.0 over `ahp-ws` 1.0.0, offering
//! `["0.9.0"]`) against the real `axhost serve` binary.
//!
//! Covers initialize with initial subscriptions, createSession, subscribe, dispatch with the
//! origin echo, rejected dispatch, the pending-message (queued/steering) flow and cancel,
//! listSessions, reconnect by replay and by snapshot, a host restart, and that the official
//! reducers (1.0.0, the client's own, and 0.9.0, the negotiated version's) applied to the
//! received stream equal a fresh snapshot from the host.

mod common;

use std::time::Duration;

use ahp09::ahp_types as t09;
use ahp1::ahp_types as t1;
use ahp1::reducers::{apply_action_to_chat, apply_action_to_session, ReduceOutcome};
use ahp1::{
    Client, ClientConfig, ClientError, ClientEventStream, SessionSubscription, SubscriptionEvent,
};
use ahp_ws::WebSocketTransport;
use common::*;
use serde_json::{json, Value};
use t1::actions::{ActionEnvelope, StateAction};
use t1::commands::{ListSessionsResult, ReconnectResult, SubscribeResult};
use t1::state::{ChatState, SessionState, SnapshotState};

const ROOT: &str = "ahp-root://";
const WAIT: Duration = Duration::from_secs(10);
/// `SessionStatus.InProgress`.
const IN_PROGRESS: u32 = 8;

fn session_uri(id: &str) -> String {
    format!("ahp-session:/{id}")
}

fn chat_uri(id: &str) -> String {
    format!("ahp-chat:/{id}")
}

async fn connect_url(url: &str) -> Client {
    let transport = WebSocketTransport::connect(url)
        .await
        .unwrap_or_else(|e| panic!("ahp-ws connect {url}: {e}"));
    let config = ClientConfig {
        default_request_timeout: Some(WAIT),
        ..ClientConfig::default()
    };
    Client::connect(transport, config)
        .await
        .expect("Client::connect")
}

async fn connect(host: &HostProcess) -> Client {
    connect_url(&host.ws_url(host.token())).await
}

async fn init(client: &Client, client_id: &str, subs: &[&str]) -> t1::commands::InitializeResult {
    client
        .initialize(
            client_id.into(),
            vec!["0.9.0".into()],
            subs.iter().map(|s| (*s).to_owned()).collect(),
        )
        .await
        .unwrap_or_else(|e| panic!("initialize {client_id}: {e}"))
}

async fn create_session(client: &Client, id: &str) {
    let () = client
        .request("createSession", json!({"channel": session_uri(id)}))
        .await
        .unwrap_or_else(|e| panic!("createSession {id}: {e}"));
}

async fn list_sessions(client: &Client, params: Value) -> ListSessionsResult {
    let mut p = json!({"channel": ROOT});
    if let (Some(p), Some(extra)) = (p.as_object_mut(), params.as_object()) {
        p.extend(extra.clone());
    }
    client
        .request("listSessions", p)
        .await
        .expect("listSessions")
}

fn action(v: Value) -> StateAction {
    serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("not a 1.0.0 StateAction ({e}): {v}"))
}

fn session_state(s: &SubscribeResult) -> SessionState {
    match s.snapshot.as_ref().map(|s| &s.state) {
        Some(SnapshotState::Session(s)) => (**s).clone(),
        other => panic!("expected a Session snapshot, got {other:?}"),
    }
}

fn chat_state(s: &SubscribeResult) -> ChatState {
    match s.snapshot.as_ref().map(|s| &s.state) {
        Some(SnapshotState::Chat(c)) => (**c).clone(),
        other => panic!("expected a Chat snapshot, got {other:?}"),
    }
}

fn from_seq(s: &SubscribeResult) -> u64 {
    s.snapshot.as_ref().map(|s| s.from_seq).expect("snapshot") as u64
}

/// The next action envelope on a per-channel subscription.
async fn next_action(sub: &mut SessionSubscription) -> ActionEnvelope {
    loop {
        let ev = tokio::time::timeout(WAIT, sub.recv())
            .await
            .unwrap_or_else(|_| panic!("no event on {} within {WAIT:?}", sub.uri()))
            .unwrap_or_else(|| panic!("subscription {} closed", sub.uri()));
        if let SubscriptionEvent::Action(e) = ev {
            return e;
        }
    }
}

/// The next event of any kind on a per-channel subscription.
async fn next_event(sub: &mut SessionSubscription) -> SubscriptionEvent {
    tokio::time::timeout(WAIT, sub.recv())
        .await
        .unwrap_or_else(|_| panic!("no event on {} within {WAIT:?}", sub.uri()))
        .unwrap_or_else(|| panic!("subscription {} closed", sub.uri()))
}

async fn quiet(sub: &mut SessionSubscription, ms: u64) {
    if let Ok(ev) = tokio::time::timeout(Duration::from_millis(ms), sub.recv()).await {
        panic!("expected nothing on {}, got {ev:?}", sub.uri());
    }
}

/// A client-side mirror of one session: the snapshots it subscribed with, reduced by every
/// accepted envelope it received (rejected echoes are skipped), with the checks a client can
/// make on the stream.
struct Mirror {
    id: String,
    session: SessionState,
    chat: ChatState,
    /// Raw JSON of the starting snapshots, for the 0.9.0 reducers.
    session0: Value,
    chat0: Value,
    start_seq: u64,
    last_seq: u64,
    /// Every envelope in arrival order, rejected ones included.
    log: Vec<ActionEnvelope>,
    events: ClientEventStream,
}

impl Mirror {
    async fn subscribe(client: &Client, id: &str) -> Mirror {
        let events = client.events();
        let (s, _) = client
            .subscribe(session_uri(id))
            .await
            .expect("subscribe session");
        let (c, _) = client
            .subscribe(chat_uri(id))
            .await
            .expect("subscribe chat");
        assert!(from_seq(&c) >= from_seq(&s));
        Mirror {
            id: id.into(),
            session: session_state(&s),
            chat: chat_state(&c),
            session0: serde_json::to_value(session_state(&s)).expect("json"),
            chat0: serde_json::to_value(chat_state(&c)).expect("json"),
            start_seq: from_seq(&s),
            last_seq: from_seq(&c),
            log: Vec::new(),
            events,
        }
    }

    /// Receives the next `n` envelopes for this session's channels and reduces them.
    async fn take(&mut self, n: usize) -> Vec<ActionEnvelope> {
        let mut out = Vec::new();
        while out.len() < n {
            let ev = tokio::time::timeout(WAIT, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("expected {n} envelopes, got {}: {out:#?}", out.len()))
                .expect("client closed");
            let SubscriptionEvent::Action(env) = ev.event else {
                continue;
            };
            assert_eq!(ev.channel, env.channel);
            if env.channel != session_uri(&self.id) && env.channel != chat_uri(&self.id) {
                continue;
            }
            self.apply(&env);
            out.push(env);
        }
        out
    }

    fn apply(&mut self, env: &ActionEnvelope) {
        self.log.push(env.clone());
        if env.rejection_reason.is_some() {
            assert!(
                env.server_seq <= self.last_seq,
                "a rejection advanced serverSeq: {env:?}"
            );
            return;
        }
        assert!(
            env.server_seq > self.last_seq,
            "serverSeq not strictly increasing: {} after {}",
            env.server_seq,
            self.last_seq
        );
        self.last_seq = env.server_seq;
        let outcome = if env.channel == chat_uri(&self.id) {
            apply_action_to_chat(&mut self.chat, &env.action)
        } else {
            apply_action_to_session(&mut self.session, &env.action)
        };
        assert!(
            matches!(outcome, ReduceOutcome::Applied | ReduceOutcome::NoOp),
            "official 1.0.0 reducer refused an accepted envelope ({outcome:?}): {env:?}"
        );
    }

    /// Asserts that the mirror equals a fresh snapshot taken by `fresh` (another client), with
    /// both the 1.0.0 reducers (already applied) and the 0.9.0 reducers replayed from scratch.
    ///
    /// With `exact_seq` the snapshot must sit exactly at the last envelope received (nothing
    /// else was sequenced meanwhile); otherwise it may be later (e.g. after a restart).
    async fn assert_matches_host(&self, fresh: &Client, exact_seq: bool) {
        let (s, _) = fresh
            .subscribe(session_uri(&self.id))
            .await
            .expect("fresh subscribe session");
        let (c, _) = fresh
            .subscribe(chat_uri(&self.id))
            .await
            .expect("fresh subscribe chat");
        if exact_seq {
            assert_eq!(
                from_seq(&c),
                self.last_seq,
                "fresh snapshot is at a different serverSeq than the stream"
            );
        } else {
            assert!(
                from_seq(&c) >= self.last_seq,
                "fresh snapshot is older than the stream"
            );
        }
        let host_session = serde_json::to_value(session_state(&s)).expect("json");
        let host_chat = serde_json::to_value(chat_state(&c)).expect("json");
        assert_eq!(
            serde_json::to_value(&self.chat).expect("json"),
            host_chat,
            "1.0.0-reduced chat != host chat"
        );
        assert_eq!(
            serde_json::to_value(&self.session).expect("json"),
            host_session,
            "1.0.0-reduced session != host session"
        );

        // The same stream through the 0.9.0 reducers (the negotiated protocol version).
        let mut chat09: t09::state::ChatState =
            serde_json::from_value(self.chat0.clone()).expect("0.9 chat");
        let mut session09: t09::state::SessionState =
            serde_json::from_value(self.session0.clone()).expect("0.9 session");
        for env in self.log.iter().filter(|e| e.rejection_reason.is_none()) {
            let a: t09::actions::StateAction =
                serde_json::from_value(serde_json::to_value(&env.action).expect("json"))
                    .expect("0.9 action");
            let outcome = if env.channel == chat_uri(&self.id) {
                ahp09::reducers::apply_action_to_chat(&mut chat09, &a)
            } else {
                ahp09::reducers::apply_action_to_session(&mut session09, &a)
            };
            assert!(
                matches!(
                    outcome,
                    ahp09::reducers::ReduceOutcome::Applied | ahp09::reducers::ReduceOutcome::NoOp
                ),
                "0.9.0 reducer refused {outcome:?}: {env:?}"
            );
        }
        let host_chat09: t09::state::ChatState =
            serde_json::from_value(host_chat).expect("0.9 chat");
        let host_session09: t09::state::SessionState =
            serde_json::from_value(host_session).expect("0.9 session");
        assert_eq!(chat09, host_chat09, "0.9.0-reduced chat != host chat");
        assert_eq!(
            session09, host_session09,
            "0.9.0-reduced session != host session"
        );
    }
}

/// The same check over raw wire JSON: a tungstenite subscriber reduces exactly what it received
/// with the 0.9.0 reducers.
struct RawMirror {
    id: String,
    ws: Ws,
    session: t09::state::SessionState,
    chat: t09::state::ChatState,
}

impl RawMirror {
    fn subscribe(host: &HostProcess, id: &str) -> RawMirror {
        let (mut ws, _) = host.ws_init(&format!("raw-{id}"), &[]);
        let s = ws.ok("subscribe", json!({"channel": session_uri(id)}));
        let c = ws.ok("subscribe", json!({"channel": chat_uri(id)}));
        RawMirror {
            id: id.into(),
            session: serde_json::from_value(s["snapshot"]["state"].clone()).expect("0.9 session"),
            chat: serde_json::from_value(c["snapshot"]["state"].clone()).expect("0.9 chat"),
            ws,
        }
    }

    /// Reads `n` action envelopes and reduces them; returns their raw params.
    fn take(&mut self, n: usize) -> Vec<Value> {
        let mut out = Vec::new();
        while out.len() < n {
            let params = self.ws.notification("action")["params"].clone();
            assert!(
                params.get("rejectionReason").is_none(),
                "raw subscriber got a rejection: {params}"
            );
            let env: t09::actions::ActionEnvelope =
                serde_json::from_value(params.clone()).expect("0.9 ActionEnvelope");
            let outcome = if env.channel == chat_uri(&self.id) {
                ahp09::reducers::apply_action_to_chat(&mut self.chat, &env.action)
            } else {
                ahp09::reducers::apply_action_to_session(&mut self.session, &env.action)
            };
            assert!(
                matches!(
                    outcome,
                    ahp09::reducers::ReduceOutcome::Applied | ahp09::reducers::ReduceOutcome::NoOp
                ),
                "0.9.0 reducer refused {outcome:?}: {params}"
            );
            out.push(params);
        }
        out
    }

    fn assert_matches_host(&mut self, host: &HostProcess) {
        let (mut fresh, _) = host.ws_init(&format!("raw-fresh-{}", self.id), &[]);
        let s = fresh.ok("subscribe", json!({"channel": session_uri(&self.id)}));
        let c = fresh.ok("subscribe", json!({"channel": chat_uri(&self.id)}));
        let host_session: t09::state::SessionState =
            serde_json::from_value(s["snapshot"]["state"].clone()).expect("0.9 session");
        let host_chat: t09::state::ChatState =
            serde_json::from_value(c["snapshot"]["state"].clone()).expect("0.9 chat");
        assert_eq!(self.chat, host_chat, "raw 0.9.0-reduced chat != host chat");
        assert_eq!(
            self.session, host_session,
            "raw 0.9.0-reduced session != host session"
        );
        self.ws.expect_no_frame(100);
    }
}

fn type_of(env: &ActionEnvelope) -> String {
    serde_json::to_value(&env.action).expect("json")["type"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

fn assert_echo(env: &ActionEnvelope, ty: &str, client_id: &str, client_seq: i64) {
    assert_eq!(type_of(env), ty, "{env:?}");
    let origin = env
        .origin
        .as_ref()
        .unwrap_or_else(|| panic!("echo without origin: {env:?}"));
    assert_eq!(origin.client_id, client_id);
    assert_eq!(origin.client_seq, client_seq);
    assert!(
        env.rejection_reason.is_none(),
        "accepted echo carries a rejectionReason: {env:?}"
    );
}

fn assert_server(env: &ActionEnvelope, ty: &str) {
    assert_eq!(type_of(env), ty, "{env:?}");
    assert!(
        env.origin.is_none(),
        "host-originated action with an origin: {env:?}"
    );
    assert!(env.rejection_reason.is_none(), "{env:?}");
}

fn active_turn_id(chat: &ChatState) -> String {
    chat.active_turn
        .as_ref()
        .map(|t| t.id.clone())
        .expect("an active turn")
}

// ─── The full flow ───────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_client_drives_a_chat_and_its_reducers_match_the_host() {
    let host = HostProcess::start();
    // The exact URL the host printed, as an operator would paste it.
    let printed = host
        .stdout()
        .into_iter()
        .find(|l| l.contains("tkn="))
        .and_then(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("ws://"))
                .map(str::to_owned)
        })
        .expect("a printed connect URL");
    let a = connect_url(&printed).await;
    let mut root = a.attach_subscription(ROOT).await;
    let init_a = init(&a, "client-a", &[ROOT]).await;
    assert_eq!(init_a.protocol_version, "0.9.0");
    let root_snap = init_a
        .snapshots
        .iter()
        .find(|s| s.resource == ROOT)
        .expect("root snapshot");
    assert!(
        matches!(root_snap.state, SnapshotState::Root(_)),
        "root snapshot decodes as {:?}",
        root_snap.state
    );
    assert_eq!(root_snap.from_seq, init_a.server_seq);
    let axp = init_a
        .meta
        .as_ref()
        .and_then(|m| m.get("org.axp.exchange"))
        .expect("_meta org.axp.exchange");
    assert_eq!(axp["version"], "0.2.0");
    assert_eq!(axp["role"], "maintainer");

    // createSession: null result, root/sessionAdded to the root subscriber.
    create_session(&a, "s1").await;
    match next_event(&mut root).await {
        SubscriptionEvent::SessionAdded(p) => {
            assert_eq!(p.channel, ROOT);
            assert_eq!(p.summary.resource, "ahp-session:/s1");
            assert_eq!(p.summary.provider, "axp");
        }
        other => panic!("expected root/sessionAdded, got {other:?}"),
    }

    let mut m = Mirror::subscribe(&a, "s1").await;
    assert_eq!(m.session.default_chat.as_deref(), Some("ahp-chat:/s1"));
    assert_eq!(
        m.session.chats.first().map(|c| c.resource.as_str()),
        Some("ahp-chat:/s1")
    );
    assert!(m.chat.turns.is_empty() && m.chat.active_turn.is_none());
    let (_, mut a_chat) = a
        .subscribe(chat_uri("s1"))
        .await
        .expect("second local handle on the chat");

    // A second client of the same principal watches the chat.
    let b = connect(&host).await;
    init(&b, "client-b", &[]).await;
    let mut mb = Mirror::subscribe(&b, "s1").await;
    // And a raw WebSocket subscriber, to check the exact wire JSON with the 0.9.0 reducers.
    let mut raw = tokio::task::block_in_place(|| RawMirror::subscribe(&host, "s1"));

    // 1. turnStarted with a user message: echoed with origin to every subscriber.
    let h1 = a
        .dispatch(chat_uri("s1"), action(turn_started("t1", "Hello")))
        .await
        .expect("dispatch");
    let got = m.take(2).await;
    assert_echo(&got[0], "chat/turnStarted", "client-a", h1.client_seq);
    assert_eq!(got[0].channel, "ahp-chat:/s1");
    assert_server(&got[1], "session/chatUpdated");
    assert_eq!(got[1].channel, "ahp-session:/s1");
    let on_sub = next_action(&mut a_chat).await;
    assert_eq!(on_sub, got[0], "the chat subscription saw a different echo");
    assert_eq!(
        mb.take(2).await,
        got,
        "another subscriber saw a different stream"
    );
    let mut b_chat = b.attach_subscription(&chat_uri("s1")).await;
    assert_eq!(active_turn_id(&m.chat), "t1");
    assert_eq!(
        m.chat.status & IN_PROGRESS,
        IN_PROGRESS,
        "chat status {}",
        m.chat.status
    );
    match next_event(&mut root).await {
        SubscriptionEvent::SessionSummaryChanged(p) => {
            assert_eq!(p.session, "ahp-session:/s1");
            assert_eq!(
                p.changes.status.map(|s| s & IN_PROGRESS),
                Some(IN_PROGRESS),
                "{p:?}"
            );
            assert_eq!(
                p.changes.modified_at.as_deref(),
                Some(m.chat.modified_at.as_str()),
                "{p:?}"
            );
        }
        other => panic!("expected root/sessionSummaryChanged, got {other:?}"),
    }
    let replay_cursor = m.last_seq;

    // 2. A second turn while one is active: rejected, to the sender only, state unchanged.
    let h2 = a
        .dispatch(chat_uri("s1"), action(turn_started("t2", "Again")))
        .await
        .expect("dispatch");
    let got = m.take(1).await;
    assert_eq!(type_of(&got[0]), "chat/turnStarted");
    assert!(
        got[0]
            .rejection_reason
            .as_deref()
            .is_some_and(|r| !r.is_empty()),
        "{got:?}"
    );
    let origin = got[0]
        .origin
        .as_ref()
        .expect("rejection carries the origin");
    assert_eq!(
        (origin.client_id.as_str(), origin.client_seq),
        ("client-a", h2.client_seq)
    );
    assert_eq!(active_turn_id(&m.chat), "t1");
    quiet(&mut b_chat, 300).await;

    // 3. Queue a message while the turn runs.
    let h3 = a
        .dispatch(chat_uri("s1"), action(pending_set("queued", "q1", "Later")))
        .await
        .expect("dispatch");
    let got = m.take(2).await;
    assert_echo(&got[0], "chat/pendingMessageSet", "client-a", h3.client_seq);
    assert_server(&got[1], "session/chatUpdated");
    assert_eq!(m.chat.queued_messages.as_ref().map(|q| q.len()), Some(1));

    // 4. Steering interrupts the turn and becomes the next one.
    let h4 = a
        .dispatch(
            chat_uri("s1"),
            action(pending_set("steering", "st1", "Change course")),
        )
        .await
        .expect("dispatch");
    let got = m.take(5).await;
    assert_echo(&got[0], "chat/pendingMessageSet", "client-a", h4.client_seq);
    assert_server(&got[1], "chat/turnCancelled");
    assert_server(&got[2], "chat/pendingMessageRemoved");
    assert_server(&got[3], "chat/turnStarted");
    assert_server(&got[4], "session/chatUpdated");
    let steered = active_turn_id(&m.chat);
    assert_ne!(steered, "t1");
    assert_eq!(
        m.chat.active_turn.as_ref().map(|t| t.message.text.as_str()),
        Some("Change course")
    );
    assert!(
        m.chat.steering_message.is_none(),
        "steering message not consumed"
    );
    assert_eq!(
        m.chat.turns.last().map(|t| t.id.as_str()),
        Some("t1"),
        "t1 not ended"
    );
    assert_eq!(
        m.chat.queued_messages.as_ref().map(|q| q.len()),
        Some(1),
        "q1 must still be queued"
    );

    // 5. Cancel the running turn (a wrong turn id is rejected first).
    let bad = a
        .dispatch(
            chat_uri("s1"),
            action(json!({"type": "chat/turnCancelled", "turnId": "t1", "duration": 1})),
        )
        .await
        .expect("dispatch");
    let got = m.take(1).await;
    assert!(
        got[0].rejection_reason.is_some(),
        "cancelling a finished turn must be rejected: {got:?}"
    );
    assert_eq!(
        got[0].origin.as_ref().map(|o| o.client_seq),
        Some(bad.client_seq)
    );
    let h5 = a
        .dispatch(
            chat_uri("s1"),
            action(json!({"type": "chat/turnCancelled", "turnId": steered, "duration": 25})),
        )
        .await
        .expect("dispatch");
    // The turn ends, so the queued message starts at once (AHP: "when a turn ends and
    // queuedMessages is non-empty the server SHOULD" start it).
    let got = m.take(4).await;
    assert_echo(&got[0], "chat/turnCancelled", "client-a", h5.client_seq);
    assert_server(&got[1], "chat/pendingMessageRemoved");
    assert_server(&got[2], "chat/turnStarted");
    assert_server(&got[3], "session/chatUpdated");
    let started = serde_json::to_value(&got[2].action).expect("json");
    assert_eq!(started["queuedMessageId"], "q1", "{started}");
    assert_eq!(
        m.chat.active_turn.as_ref().map(|t| t.message.text.as_str()),
        Some("Later")
    );
    assert!(m.chat.queued_messages.iter().flatten().next().is_none());

    // 6. A message queued while that turn runs waits behind it.
    let h6 = a
        .dispatch(
            chat_uri("s1"),
            action(pending_set("queued", "q2", "Second")),
        )
        .await
        .expect("dispatch");
    let got = m.take(2).await;
    assert_echo(&got[0], "chat/pendingMessageSet", "client-a", h6.client_seq);
    assert_server(&got[1], "session/chatUpdated");
    let queued: Vec<&str> = m
        .chat
        .queued_messages
        .iter()
        .flatten()
        .map(|q| q.id.as_str())
        .collect();
    assert_eq!(queued, vec!["q2"]);

    // 7. Remove the remaining queued message.
    let h7 = a
        .dispatch(
            chat_uri("s1"),
            action(json!({"type": "chat/pendingMessageRemoved", "kind": "queued", "id": "q2"})),
        )
        .await
        .expect("dispatch");
    let got = m.take(2).await;
    assert_echo(
        &got[0],
        "chat/pendingMessageRemoved",
        "client-a",
        h7.client_seq,
    );
    assert!(m.chat.queued_messages.iter().flatten().next().is_none());

    // B saw exactly the accepted part of A's stream: rejections went to A only.
    let accepted: Vec<ActionEnvelope> = m
        .log
        .iter()
        .filter(|e| e.rejection_reason.is_none())
        .cloned()
        .collect();
    let b_count = accepted.len() - 2; // B's log already holds the first two.
    let b_rest = mb.take(b_count).await;
    assert!(
        b_rest.iter().all(|e| e.rejection_reason.is_none()),
        "B received a rejection: {b_rest:?}"
    );
    assert_eq!(mb.log, accepted);

    // The official reducers over the received stream equal a fresh snapshot.
    let c = connect(&host).await;
    init(&c, "client-c", &[]).await;
    m.assert_matches_host(&c, true).await;
    mb.assert_matches_host(&c, true).await;
    tokio::task::block_in_place(|| {
        let wire = raw.take(accepted.len());
        let seqs: Vec<u64> = accepted.iter().map(|e| e.server_seq).collect();
        let wire_seqs: Vec<u64> = wire
            .iter()
            .filter_map(|e| e["serverSeq"].as_u64())
            .collect();
        assert_eq!(wire_seqs, seqs, "the raw subscriber saw a different stream");
        raw.assert_matches_host(&host);
    });

    // Reconnect by replay with the official client's `reconnect`: exactly what came after the
    // cursor on the requested channels, in order.
    let d = connect(&host).await;
    let result = d
        .reconnect(
            "client-a".into(),
            replay_cursor as i64,
            vec![
                ROOT.into(),
                session_uri("s1"),
                chat_uri("s1"),
                session_uri("gone"),
            ],
        )
        .await
        .expect("reconnect");
    match result {
        ReconnectResult::Replay(r) => {
            let expected: Vec<ActionEnvelope> = accepted
                .iter()
                .filter(|e| e.server_seq > replay_cursor)
                .cloned()
                .collect();
            assert_eq!(
                r.actions, expected,
                "replay differs from the live stream after the cursor"
            );
            assert_eq!(r.missing, vec![session_uri("gone")]);
        }
        other => panic!("expected a replay, got {other:?}"),
    }
    // The reconnected connection is subscribed again: it sees new activity.
    let mut d_events = d.events();
    let h8 = a
        .dispatch(chat_uri("s1"), action(pending_set("queued", "q3", "Third")))
        .await
        .expect("dispatch");
    let seen = loop {
        let ev = tokio::time::timeout(WAIT, d_events.recv())
            .await
            .expect("reconnected client saw nothing")
            .expect("open");
        if let SubscriptionEvent::Action(e) = ev.event {
            break e;
        }
    };
    assert_echo(&seen, "chat/pendingMessageSet", "client-a", h8.client_seq);

    for client in [a, b, c, d] {
        client.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_client_handshake_details() {
    let host = HostProcess::start();
    let a = connect(&host).await;
    // ping before initialize decodes as `()` (result null).
    a.ping().await.expect("ping before initialize");
    // The client's own version list (1.0.0 first) negotiates 0.9.0.
    let r = a
        .initialize(
            "client-a".into(),
            vec!["1.0.0".into(), "0.9.0".into()],
            vec![ROOT.into()],
        )
        .await
        .expect("initialize");
    assert_eq!(r.protocol_version, "0.9.0");
    a.ping().await.expect("ping after initialize");
    // A 1.0.0-only offer is refused with -32005 and data.supportedVersions.
    let b = connect(&host).await;
    match b
        .initialize("client-b".into(), vec!["1.0.0".into()], vec![])
        .await
    {
        Err(ClientError::Rpc(e)) => {
            assert_eq!(e.code, -32005);
            let data = e.data.expect("data");
            assert!(
                data["supportedVersions"]
                    .as_array()
                    .is_some_and(|v| !v.is_empty()),
                "{data}"
            );
        }
        other => panic!("expected -32005, got {other:?}"),
    }
    // Errors reach the official client as typed RPC errors.
    match a
        .request::<_, Value>("noSuchMethod", json!({"channel": ROOT}))
        .await
    {
        Err(ClientError::Rpc(e)) => assert_eq!(e.code, -32601),
        other => panic!("expected -32601, got {other:?}"),
    }
    match a.subscribe(session_uri("nope")).await {
        Err(ClientError::Rpc(e)) => assert_eq!(e.code, -32008),
        Ok(_) => panic!("subscribed to a session that does not exist"),
        Err(e) => panic!("expected -32008, got {e}"),
    }
    a.shutdown().await;
}

// ─── Concurrent writers ──────────────────────────────────────────────────────

/// Two official clients dispatch into the same chat at once without waiting for echoes: both
/// see the same accepted stream in the same order, and it reduces to the host's state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_see_one_order() {
    let host = HostProcess::start();
    let a = connect(&host).await;
    init(&a, "client-a", &[]).await;
    create_session(&a, "s1").await;
    let b = connect(&host).await;
    init(&b, "client-b", &[]).await;
    let mut ma = Mirror::subscribe(&a, "s1").await;
    let mut mb = Mirror::subscribe(&b, "s1").await;
    a.dispatch(chat_uri("s1"), action(turn_started("t1", "busy")))
        .await
        .expect("dispatch");
    ma.take(2).await;
    mb.take(2).await;

    const N: usize = 10;
    let writer = |client: Client, tag: &'static str| async move {
        for i in 0..N {
            let id = format!("{tag}{i}");
            client
                .dispatch(chat_uri("s1"), action(pending_set("queued", &id, tag)))
                .await
                .expect("dispatch");
            let remove = json!({"type": "chat/pendingMessageRemoved", "kind": "queued", "id": id});
            client
                .dispatch(chat_uri("s1"), action(remove))
                .await
                .expect("dispatch");
        }
    };
    let (ra, rb) = tokio::join!(
        tokio::spawn(writer(a.clone(), "a")),
        tokio::spawn(writer(b.clone(), "b"))
    );
    ra.expect("writer a");
    rb.expect("writer b");
    // Every dispatch is accepted: echo + session/chatUpdated each.
    let got_a = ma.take(4 * N * 2).await;
    let got_b = mb.take(4 * N * 2).await;
    assert!(
        got_a.iter().all(|e| e.rejection_reason.is_none()),
        "a rejection in {got_a:#?}"
    );
    assert_eq!(got_a, got_b, "two subscribers saw different orders");
    for tag in ["client-a", "client-b"] {
        let seqs: Vec<i64> = got_a
            .iter()
            .filter_map(|e| e.origin.as_ref())
            .filter(|o| o.client_id == tag)
            .map(|o| o.client_seq)
            .collect();
        assert_eq!(seqs.len(), 2 * N, "{tag}: echoes {seqs:?}");
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "{tag}: echoes out of clientSeq order {seqs:?}"
        );
    }
    assert!(ma.chat.queued_messages.iter().flatten().next().is_none());
    let c = connect(&host).await;
    init(&c, "client-c", &[]).await;
    ma.assert_matches_host(&c, true).await;
    mb.assert_matches_host(&c, true).await;
    for client in [a, b, c] {
        client.shutdown().await;
    }
}

// ─── listSessions ────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_sessions_orders_by_modification_with_stable_created_at() {
    let host = HostProcess::start();
    let a = connect(&host).await;
    init(&a, "client-a", &[]).await;
    create_session(&a, "s1").await;
    tokio::time::sleep(Duration::from_millis(20)).await;
    create_session(&a, "s2").await;

    let before = list_sessions(&a, json!({})).await;
    let uris: Vec<&str> = before.items.iter().map(|i| i.resource.as_str()).collect();
    assert_eq!(
        uris,
        vec!["ahp-session:/s2", "ahp-session:/s1"],
        "most recent first"
    );
    for i in &before.items {
        assert_eq!(i.provider, "axp");
        assert!(looks_rfc3339(&i.created_at), "createdAt {:?}", i.created_at);
        assert!(i.modified_at >= i.created_at, "{i:?}");
    }
    assert!(before.next_cursor.is_none());

    tokio::time::sleep(Duration::from_millis(20)).await;
    let (_, mut chat) = a.subscribe(chat_uri("s1")).await.expect("subscribe");
    a.dispatch(chat_uri("s1"), action(turn_started("t1", "bump")))
        .await
        .expect("dispatch");
    next_action(&mut chat).await;

    let after = list_sessions(&a, json!({})).await;
    let uris: Vec<&str> = after.items.iter().map(|i| i.resource.as_str()).collect();
    assert_eq!(
        uris,
        vec!["ahp-session:/s1", "ahp-session:/s2"],
        "the modified session moves first"
    );
    let find = |l: &ListSessionsResult, uri: &str| {
        l.items
            .iter()
            .find(|i| i.resource == uri)
            .cloned()
            .expect(uri)
    };
    let (s1_before, s1_after) = (
        find(&before, "ahp-session:/s1"),
        find(&after, "ahp-session:/s1"),
    );
    assert_eq!(s1_after.created_at, s1_before.created_at, "createdAt moved");
    assert!(
        s1_after.modified_at > s1_before.modified_at,
        "modifiedAt did not move: {s1_before:?} -> {s1_after:?}"
    );
    assert_eq!(s1_after.status & IN_PROGRESS, IN_PROGRESS);
    assert_eq!(
        find(&after, "ahp-session:/s2"),
        find(&before, "ahp-session:/s2")
    );

    // Paging with the opaque cursor.
    let page1 = list_sessions(&a, json!({"limit": 1})).await;
    assert_eq!(page1.items.len(), 1);
    assert_eq!(page1.items[0].resource, "ahp-session:/s1");
    let cursor = page1
        .next_cursor
        .clone()
        .expect("nextCursor on a partial page");
    let page2 = list_sessions(&a, json!({"limit": 1, "cursor": cursor})).await;
    assert_eq!(
        page2
            .items
            .iter()
            .map(|i| i.resource.as_str())
            .collect::<Vec<_>>(),
        vec!["ahp-session:/s2"]
    );
    assert!(page2.next_cursor.is_none(), "{page2:?}");
    a.shutdown().await;
}

/// ISO-8601 / RFC 3339 shape (`2026-01-02T03:04:05.678Z`), as AHP timestamps are strings.
fn looks_rfc3339(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 20
        && b[4] == b'-'
        && b[7] == b'-'
        && b[10] == b'T'
        && b[13] == b':'
        && b[16] == b':'
        && (s.ends_with('Z') || s.contains('+'))
}

// ─── Reconnect by snapshot ───────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_past_the_replay_budget_returns_snapshots() {
    let host = HostProcess::builder()
        .config("[limits]\nreplay_events_max = 2\n")
        .start();
    let url = host.ws_url(host.token());
    let a = connect_url(&url).await;
    let init_a = init(&a, "client-a", &[ROOT]).await;
    create_session(&a, "s1").await;
    let mut m = Mirror::subscribe(&a, "s1").await;
    let cursor = init_a.server_seq;
    assert_eq!(
        m.start_seq, cursor as u64,
        "createSession must not sequence events"
    );

    a.dispatch(chat_uri("s1"), action(turn_started("t1", "one")))
        .await
        .expect("dispatch");
    m.take(2).await;
    a.dispatch(chat_uri("s1"), action(pending_set("queued", "q1", "two")))
        .await
        .expect("dispatch");
    m.take(2).await;
    assert!(
        m.last_seq >= cursor as u64 + 3,
        "need more events than the budget"
    );

    // Gap 4 > budget 2: fresh snapshots for every resumable channel.
    let d = connect_url(&url).await;
    let r = d
        .reconnect(
            "client-a".into(),
            cursor,
            vec![ROOT.into(), session_uri("s1"), chat_uri("s1")],
        )
        .await
        .expect("reconnect");
    let snaps = match r {
        ReconnectResult::Snapshot(s) => s.snapshots,
        other => panic!("expected snapshots past the replay budget, got {other:?}"),
    };
    let by_uri = |u: &str| {
        snaps
            .iter()
            .find(|s| s.resource == u)
            .unwrap_or_else(|| panic!("no snapshot for {u}: {snaps:?}"))
    };
    assert!(matches!(by_uri(ROOT).state, SnapshotState::Root(_)));
    for s in &snaps {
        assert_eq!(
            s.from_seq as u64, m.last_seq,
            "snapshot {} not at the current serverSeq",
            s.resource
        );
    }
    match &by_uri(&chat_uri("s1")).state {
        SnapshotState::Chat(c) => assert_eq!(
            serde_json::to_value(&**c).ok(),
            serde_json::to_value(&m.chat).ok()
        ),
        other => panic!("chat snapshot decodes as {other:?}"),
    }
    match &by_uri(&session_uri("s1")).state {
        SnapshotState::Session(s) => {
            assert_eq!(
                serde_json::to_value(&**s).ok(),
                serde_json::to_value(&m.session).ok()
            )
        }
        other => panic!("session snapshot decodes as {other:?}"),
    }

    // Within the budget it is still a replay.
    let e = connect_url(&url).await;
    let r = e
        .reconnect(
            "client-a".into(),
            (m.last_seq - 2) as i64,
            vec![chat_uri("s1"), session_uri("s1")],
        )
        .await
        .expect("reconnect");
    match r {
        ReconnectResult::Replay(r) => {
            let expected: Vec<ActionEnvelope> = m
                .log
                .iter()
                .filter(|x| x.server_seq > m.last_seq - 2)
                .cloned()
                .collect();
            assert_eq!(r.actions, expected);
            assert!(r.missing.is_empty());
        }
        other => panic!("expected a replay within the budget, got {other:?}"),
    }
    for client in [a, d, e] {
        client.shutdown().await;
    }
}

// ─── Host restart ────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_keeps_sessions_state_and_server_seq() {
    let mut host = HostProcess::start();
    let a = connect(&host).await;
    init(&a, "client-a", &[]).await;
    create_session(&a, "s1").await;
    tokio::time::sleep(Duration::from_millis(5)).await;
    create_session(&a, "s2").await;
    let mut m = Mirror::subscribe(&a, "s1").await;
    a.dispatch(chat_uri("s1"), action(turn_started("t1", "before restart")))
        .await
        .expect("dispatch");
    m.take(2).await;
    a.dispatch(
        chat_uri("s1"),
        action(pending_set("queued", "q1", "queued before restart")),
    )
    .await
    .expect("dispatch");
    m.take(2).await;
    let list_before = list_sessions(&a, json!({})).await;
    let seq_before = m.last_seq;
    a.shutdown().await;

    tokio::task::block_in_place(|| host.restart());

    let b = connect(&host).await;
    let r = init(&b, "client-b", &[ROOT]).await;
    assert!(
        r.server_seq as u64 >= seq_before,
        "serverSeq went backwards across restart: {} < {seq_before}",
        r.server_seq
    );
    let list_after = list_sessions(&b, json!({})).await;
    assert_eq!(list_after, list_before, "sessions changed across restart");
    // State survived, and the official reducers still agree with it.
    m.assert_matches_host(&b, false).await;

    // Replay across the restart: the events were persisted.
    let d = connect(&host).await;
    let r = d
        .reconnect(
            "client-a".into(),
            (seq_before - 2) as i64,
            vec![chat_uri("s1"), session_uri("s1")],
        )
        .await
        .expect("reconnect after restart");
    match r {
        ReconnectResult::Replay(r) => {
            let expected: Vec<ActionEnvelope> = m
                .log
                .iter()
                .filter(|e| e.server_seq > seq_before - 2)
                .cloned()
                .collect();
            assert_eq!(r.actions, expected);
        }
        other => panic!("expected a replay after restart, got {other:?}"),
    }

    // New events continue after the old high-water mark.
    let mut m2 = Mirror::subscribe(&b, "s2").await;
    b.dispatch(chat_uri("s2"), action(turn_started("t1", "after restart")))
        .await
        .expect("dispatch");
    let got = m2.take(2).await;
    assert!(
        got[0].server_seq > seq_before,
        "serverSeq reused after restart: {} <= {seq_before}",
        got[0].server_seq
    );
    for client in [b, d] {
        client.shutdown().await;
    }
}

// ─── clientId reuse with a new official Client ───────────────────────────────

/// The official runtime (`ahp::hosts`) keeps a persisted clientId and builds a new `Client` per
/// connection, whose `clientSeq` restarts at 1. After `reconnect` with that clientId its
/// dispatches must still be accepted and echoed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_client_can_dispatch_after_reconnecting_with_its_client_id() {
    let host = HostProcess::start();
    let a = connect(&host).await;
    init(&a, "client-a", &[]).await;
    create_session(&a, "s1").await;
    let mut m = Mirror::subscribe(&a, "s1").await;
    a.dispatch(chat_uri("s1"), action(turn_started("t1", "first")))
        .await
        .expect("dispatch");
    m.take(2).await;
    let cursor = m.last_seq as i64;
    a.shutdown().await;

    let a2 = connect(&host).await;
    let mut events = a2.events();
    let r = a2
        .reconnect(
            "client-a".into(),
            cursor,
            vec![session_uri("s1"), chat_uri("s1")],
        )
        .await
        .expect("reconnect");
    assert!(matches!(r, ReconnectResult::Replay(_)), "{r:?}");
    let h = a2
        .dispatch(
            chat_uri("s1"),
            action(pending_set("queued", "q1", "after reconnect")),
        )
        .await
        .expect("dispatch");
    let env = loop {
        let ev = tokio::time::timeout(WAIT, events.recv())
            .await
            .expect("no echo for a dispatch after reconnect (clientSeq restarted at 1)")
            .expect("open");
        if let SubscriptionEvent::Action(e) = ev.event {
            break e;
        }
    };
    assert_echo(&env, "chat/pendingMessageSet", "client-a", h.client_seq);
    a2.shutdown().await;
}
