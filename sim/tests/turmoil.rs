//! Real client code meets network faults, deterministically: the official `ahp` 1.0.0 client and
//! raw WebSocket clients run as tokio tasks on turmoil hosts and reach the axhost core through
//! `turmoil::net::TcpStream`, with link latency, partitions and held links.
//!
//! The host node runs ONE `axhost_core::Host<MemStore>` behind a small tokio driver
//! (`turmoil/driver.rs`); the clients' side of the wire is `turmoil/net.rs`. Each scenario runs
//! over several turmoil seeds (`AXHOST_TURMOIL_SEEDS`, default 16) and every seed twice: the
//! hash of every frame each client sent and received, with the simulated time it did, must be
//! the same both times. See docs/turmoil.md.

#[path = "turmoil/driver.rs"]
mod driver;
#[path = "turmoil/net.rs"]
mod net;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, UNIX_EPOCH};

use ahp1::ahp_types as t1;
use ahp1::reducers::{apply_action_to_chat, apply_action_to_session, ReduceOutcome};
use ahp1::{Client, ClientConfig, ClientError, ClientEventStream, SubscriptionEvent};
use axhost_core::HostConfig;
use driver::{HostSpec, Probe, SharedProbe, EPOCH_UNIX_MS};
use net::{Raw, Trace, TurmoilTransport};
use serde_json::{json, Value};
use t1::actions::{ActionEnvelope, StateAction};
use t1::commands::{ReconnectResult, SubscribeResult};
use t1::state::{ChatState, SessionState, SnapshotState};

const HOST: &str = "axhost";
const ROOT: &str = "ahp-root://";
const CATALOG: &str = "x-client-services://";
/// Silence after which a client takes the stream as settled.
const QUIET: Duration = Duration::from_millis(400);

// ─── Running scenarios ───────────────────────────────────────────────────────

/// What one run leaves behind.
struct Outcome {
    digest: String,
    probe: Probe,
}

fn seeds() -> Vec<u64> {
    let n = std::env::var("AXHOST_TURMOIL_SEEDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(16);
    (0..n)
        .map(|i| 0x7u64.wrapping_mul(1_000_003).wrapping_add(i))
        .collect()
}

/// Runs `scenario` for every seed, twice each, and requires identical traces per seed. Seeds
/// must also matter: with latency drawn from the seed, not every seed may give one trace.
fn sweep(name: &str, scenario: fn(u64) -> Outcome) {
    let mut distinct = std::collections::BTreeSet::new();
    for seed in seeds() {
        let a = scenario(seed);
        let b = scenario(seed);
        assert_eq!(
            a.digest, b.digest,
            "{name}: seed {seed} is not deterministic:\n--- first run\n{}\n--- second run\n{}",
            a.digest, b.digest
        );
        check_closed_once(name, seed, &a.probe);
        distinct.insert(a.digest);
    }
    if seeds().len() > 1 {
        assert!(
            distinct.len() > 1,
            "{name}: every seed gave the same trace; the seed does not reach the network"
        );
    }
}

/// Every connection the core saw was reported closed exactly once, and none is left open.
fn check_closed_once(name: &str, seed: u64, p: &Probe) {
    assert_eq!(
        p.connections, 0,
        "{name} seed {seed}: connections left open: {p:?}"
    );
    assert_eq!(
        p.closed.len() as u64,
        p.connected,
        "{name} seed {seed}: {p:?}"
    );
    assert!(
        p.closed.values().all(|&n| n == 1),
        "{name} seed {seed}: Closed reported more than once: {p:?}"
    );
}

fn builder(seed: u64, latency_ms: (u64, u64)) -> turmoil::Builder {
    let mut b = turmoil::Builder::new();
    b.rng_seed(seed)
        .epoch(UNIX_EPOCH + Duration::from_millis(EPOCH_UNIX_MS))
        .simulation_duration(Duration::from_secs(60))
        .min_message_latency(Duration::from_millis(latency_ms.0))
        .max_message_latency(Duration::from_millis(latency_ms.1));
    b
}

/// Steps `sim` to the end of every client, calling `hook` before each step (faults), then
/// lets in-flight closes reach the host.
fn run(sim: &mut turmoil::Sim<'_>, mut hook: impl FnMut(&mut turmoil::Sim<'_>)) {
    loop {
        hook(sim);
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => panic!("simulation failed: {e}"),
        }
    }
    if std::env::var_os("AXHOST_TURMOIL_VERBOSE").is_some() {
        eprintln!("clients done at {:?} simulated", sim.elapsed());
    }
    for _ in 0..500 {
        if let Err(e) = sim.step() {
            panic!("simulation failed after the clients ended: {e}");
        }
    }
}

fn probe_of(p: &SharedProbe) -> Probe {
    p.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone()
}

/// Simulated milliseconds since the start, as the current turmoil host sees them.
fn sim_ms() -> u64 {
    turmoil::sim_elapsed().map_or(0, |d| d.as_millis() as u64)
}

async fn wait_for(flag: &AtomicU32, at_least: u32) {
    while flag.load(Ordering::SeqCst) < at_least {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

// ─── The official client ─────────────────────────────────────────────────────

async fn official(trace: &Trace, principal: &str, who: &str, timeout: Duration) -> Client {
    let ws = net::dial(HOST, principal)
        .await
        .unwrap_or_else(|e| panic!("{who}: dial: {e}"));
    connect_over(ws, trace, who, timeout).await
}

async fn connect_over(ws: net::Ws, trace: &Trace, who: &str, timeout: Duration) -> Client {
    let config = ClientConfig {
        default_request_timeout: Some(timeout),
        ..ClientConfig::default()
    };
    Client::connect(TurmoilTransport::new(ws, trace.clone(), who), config)
        .await
        .expect("Client::connect")
}

async fn init(c: &Client, client_id: &str, subs: &[&str]) {
    c.initialize(
        client_id.into(),
        vec!["0.9.0".into()],
        subs.iter().map(|s| (*s).to_owned()).collect(),
    )
    .await
    .unwrap_or_else(|e| panic!("initialize {client_id}: {e}"));
}

async fn create_session(c: &Client, id: &str) {
    let () = c
        .request("createSession", json!({"channel": session_uri(id)}))
        .await
        .unwrap_or_else(|e| panic!("createSession {id}: {e}"));
}

/// Ends a client with a WebSocket close, and gives the close frame time to leave.
async fn close(c: Client) {
    let _ = tokio::time::timeout(Duration::from_secs(1), c.shutdown()).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
}

fn session_uri(id: &str) -> String {
    format!("ahp-session:/{id}")
}

fn chat_uri(id: &str) -> String {
    format!("ahp-chat:/{id}")
}

fn action(v: Value) -> StateAction {
    serde_json::from_value(v.clone())
        .unwrap_or_else(|e| panic!("not a 1.0.0 StateAction ({e}): {v}"))
}

fn turn_started(turn_id: &str, text: &str) -> StateAction {
    action(json!({
        "type": "chat/turnStarted",
        "turnId": turn_id,
        "startedAt": "2020-01-01T00:00:00.000Z",
        "message": {"text": text, "origin": {"kind": "user"}},
    }))
}

fn pending_set(kind: &str, id: &str, text: &str) -> StateAction {
    action(json!({
        "type": "chat/pendingMessageSet",
        "kind": kind,
        "id": id,
        "message": {"text": text, "origin": {"kind": "user"}},
    }))
}

fn snapshot_seq(s: &SubscribeResult) -> u64 {
    s.snapshot.as_ref().map(|s| s.from_seq).expect("snapshot") as u64
}

/// One session as a client sees it: the snapshots it subscribed with, reduced by every accepted
/// envelope with the official 1.0.0 reducers (the client's own code).
struct Mirror {
    who: String,
    id: String,
    session: SessionState,
    chat: ChatState,
    /// Per channel: the `fromSeq` of the snapshot the mirror holds for it. Envelopes at or
    /// below it are already in that snapshot.
    base: BTreeMap<String, u64>,
    /// The last accepted envelope received: the stream must climb strictly across channels.
    stream_last: u64,
    /// Accepted envelopes applied, with the simulated time each arrived.
    applied: Vec<(u64, u64)>,
    events: ClientEventStream,
}

impl Mirror {
    async fn subscribe(c: &Client, who: &str, id: &str) -> Mirror {
        let events = c.events();
        let (s, _) = c.subscribe(session_uri(id)).await.expect("subscribe");
        let (ch, _) = c.subscribe(chat_uri(id)).await.expect("subscribe");
        let session = match s.snapshot.as_ref().map(|s| &s.state) {
            Some(SnapshotState::Session(s)) => (**s).clone(),
            other => panic!("{who}: expected a session snapshot, got {other:?}"),
        };
        let chat = match ch.snapshot.as_ref().map(|s| &s.state) {
            Some(SnapshotState::Chat(c)) => (**c).clone(),
            other => panic!("{who}: expected a chat snapshot, got {other:?}"),
        };
        Mirror {
            who: who.into(),
            id: id.into(),
            session,
            chat,
            base: BTreeMap::from([
                (session_uri(id), snapshot_seq(&s)),
                (chat_uri(id), snapshot_seq(&ch)),
            ]),
            stream_last: 0,
            applied: Vec::new(),
            events,
        }
    }

    /// The `serverSeq` the mirror is current through.
    fn last_seq(&self) -> u64 {
        self.base
            .values()
            .copied()
            .chain([self.stream_last])
            .max()
            .unwrap_or(0)
    }

    fn reset_to(&mut self, uri: &str, state: &SnapshotState, from_seq: u64) {
        match state {
            SnapshotState::Session(s) => self.session = (**s).clone(),
            SnapshotState::Chat(c) => self.chat = (**c).clone(),
            other => panic!("{}: unexpected snapshot {other:?}", self.who),
        }
        self.base.insert(uri.to_owned(), from_seq);
    }

    fn mine(&self, channel: &str) -> bool {
        channel == session_uri(&self.id) || channel == chat_uri(&self.id)
    }

    fn apply(&mut self, env: &ActionEnvelope) {
        if !self.mine(&env.channel) {
            return;
        }
        if env.rejection_reason.is_some() {
            assert!(
                env.server_seq <= self.last_seq(),
                "{}: a rejection advanced serverSeq: {env:?}",
                self.who
            );
            return;
        }
        assert!(
            env.server_seq > self.stream_last,
            "{}: serverSeq not strictly increasing (duplicate or reordered): {} after {}",
            self.who,
            env.server_seq,
            self.stream_last
        );
        self.stream_last = env.server_seq;
        let base = self.base.get(&env.channel).copied().unwrap_or(0);
        assert!(
            env.server_seq > base,
            "{}: envelope {} on {} is already in the snapshot at {base}",
            self.who,
            env.server_seq,
            env.channel
        );
        self.applied.push((sim_ms(), env.server_seq));
        let outcome = if env.channel == chat_uri(&self.id) {
            apply_action_to_chat(&mut self.chat, &env.action)
        } else {
            apply_action_to_session(&mut self.session, &env.action)
        };
        assert!(
            matches!(outcome, ReduceOutcome::Applied | ReduceOutcome::NoOp),
            "{}: the official reducer refused an accepted envelope ({outcome:?}): {env:?}",
            self.who
        );
    }

    /// Applies events until `quiet` passes without one. Returns how many arrived; `None` when
    /// the client's stream ended (its transport closed).
    async fn pump(&mut self, quiet: Duration) -> Option<usize> {
        let mut n = 0;
        loop {
            match tokio::time::timeout(quiet, self.events.recv()).await {
                Err(_) => return Some(n),
                Ok(None) => return None,
                Ok(Some(ev)) => {
                    if let SubscriptionEvent::Action(env) = ev.event {
                        self.apply(&env);
                    }
                    n += 1;
                }
            }
        }
    }

    /// The mirror equals a fresh snapshot another client takes, at exactly the last
    /// `serverSeq` it applied (nothing else was sequenced meanwhile).
    async fn assert_matches_host(&self, fresh: &Client) {
        let (s, _) = fresh
            .subscribe(session_uri(&self.id))
            .await
            .expect("fresh subscribe");
        let (c, _) = fresh
            .subscribe(chat_uri(&self.id))
            .await
            .expect("fresh subscribe");
        assert_eq!(
            snapshot_seq(&c),
            self.last_seq(),
            "{}: the fresh snapshot is at another serverSeq than the stream",
            self.who
        );
        let host_session = match s.snapshot.map(|s| s.state) {
            Some(SnapshotState::Session(s)) => serde_json::to_value(*s).expect("json"),
            other => panic!("expected a session snapshot, got {other:?}"),
        };
        let host_chat = match c.snapshot.map(|s| s.state) {
            Some(SnapshotState::Chat(c)) => serde_json::to_value(*c).expect("json"),
            other => panic!("expected a chat snapshot, got {other:?}"),
        };
        assert_eq!(
            serde_json::to_value(&self.chat).expect("json"),
            host_chat,
            "{}: client-reduced chat != host chat",
            self.who
        );
        assert_eq!(
            serde_json::to_value(&self.session).expect("json"),
            host_session,
            "{}: client-reduced session != host session",
            self.who
        );
    }
}

// ─── 1. The official client reduces like the host, over latency ─────────────

fn official_client_scenario(seed: u64) -> Outcome {
    let mut sim = builder(seed, (1, 40)).build();
    let trace = Trace::default();
    let probe = SharedProbe::default();
    driver::install(
        &mut sim,
        HOST,
        HostSpec::maintainers(seed, &["alice", "bob"]),
        probe.clone(),
    );
    let alice_done = Arc::new(AtomicBool::new(false));
    let session_made = Arc::new(AtomicBool::new(false));

    {
        let (trace, done, made) = (trace.clone(), alice_done.clone(), session_made.clone());
        sim.client("alice", async move {
            let t = Duration::from_secs(5);
            let a = official(&trace, "alice", "alice", t).await;
            init(&a, "alice", &[ROOT]).await;
            create_session(&a, "s1").await;
            made.store(true, Ordering::SeqCst);
            let mut m = Mirror::subscribe(&a, "alice", "s1").await;
            let ch = chat_uri("s1");
            a.dispatch(ch.clone(), turn_started("t1", "Hello"))
                .await
                .expect("dispatch");
            m.pump(QUIET).await.expect("open");
            assert_eq!(
                m.chat.active_turn.as_ref().map(|t| t.id.as_str()),
                Some("t1")
            );
            // Rejected (a turn is active): the sender's echo carries a rejectionReason.
            a.dispatch(ch.clone(), turn_started("t2", "Again"))
                .await
                .expect("dispatch");
            // A burst without waiting: queued messages, then steering that interrupts t1.
            for i in 0..4 {
                a.dispatch(ch.clone(), pending_set("queued", &format!("q{i}"), "later"))
                    .await
                    .expect("dispatch");
            }
            a.dispatch(ch.clone(), pending_set("steering", "st1", "change course"))
                .await
                .expect("dispatch");
            m.pump(QUIET).await.expect("open");
            let b = official(&trace, "alice", "alice-fresh", t).await;
            init(&b, "alice-fresh", &[]).await;
            m.assert_matches_host(&b).await;
            assert!(m.applied.len() >= 6, "{:?}", m.applied);
            done.store(true, Ordering::SeqCst);
            close(b).await;
            close(a).await;
            Ok(())
        });
    }
    {
        let (trace, done, made) = (trace.clone(), alice_done, session_made);
        // A second official client on its own link follows the same session concurrently.
        sim.client("bob", async move {
            let t = Duration::from_secs(5);
            let b = official(&trace, "bob", "bob", t).await;
            init(&b, "bob", &[]).await;
            while !made.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let mut m = Mirror::subscribe(&b, "bob", "s1").await;
            while !done.load(Ordering::SeqCst) {
                m.pump(Duration::from_millis(50)).await.expect("open");
            }
            m.pump(QUIET).await.expect("open");
            let fresh = official(&trace, "bob", "bob-fresh", t).await;
            init(&fresh, "bob-fresh", &[]).await;
            m.assert_matches_host(&fresh).await;
            close(fresh).await;
            close(b).await;
            Ok(())
        });
    }
    run(&mut sim, |_| {});
    Outcome {
        digest: trace.digest(),
        probe: probe_of(&probe),
    }
}

#[test]
fn official_client_reduces_the_hosts_state_over_latency() {
    sweep("official_client", official_client_scenario);
}

// ─── 2. Partition mid-session, official reconnect ────────────────────────────

const P_READY: u32 = 1;
const P_PARTITIONED: u32 = 2;
const P_REPAIRED: u32 = 3;

fn partition_scenario(seed: u64) -> Outcome {
    let mut sim = builder(seed, (1, 20)).build();
    let trace = Trace::default();
    let probe = SharedProbe::default();
    driver::install(
        &mut sim,
        HOST,
        HostSpec::maintainers(seed, &["alice", "bob"]),
        probe.clone(),
    );
    let phase = Arc::new(AtomicU32::new(0));
    let bob_done = Arc::new(AtomicBool::new(false));

    {
        let (trace, phase, bob_done) = (trace.clone(), phase.clone(), bob_done.clone());
        sim.client("alice", async move {
            let t = Duration::from_millis(800);
            let a = official(&trace, "alice", "alice", t).await;
            init(&a, "alice", &[]).await;
            create_session(&a, "s1").await;
            let mut m = Mirror::subscribe(&a, "alice", "s1").await;
            a.dispatch(chat_uri("s1"), turn_started("t1", "before"))
                .await
                .expect("dispatch");
            m.pump(QUIET).await.expect("open");
            phase.store(P_READY, Ordering::SeqCst);
            // Liveness by ping: turmoil drops a partitioned link's segments silently, so the
            // stream just stalls (as TCP behind a black hole does) until a request times out.
            loop {
                match a.ping().await {
                    Ok(()) => {}
                    Err(ClientError::Cancelled) => break,
                    Err(e) => panic!("alice: ping failed with {e}, expected a timeout"),
                }
                if m.pump(Duration::from_millis(200)).await.is_none() {
                    break;
                }
            }
            let lost_at = sim_ms();
            // Tear the old client down; its socket's FIN is lost in the partition too.
            let _ = tokio::time::timeout(Duration::from_millis(200), a.shutdown()).await;
            drop(a);
            // Reconnect with the official client: new socket, `reconnect` with the last
            // serverSeq the mirror applied; replayed envelopes go through the same reducers.
            let c = loop {
                let ws = net::dial_retrying(HOST, "alice", Duration::from_millis(500)).await;
                let c = connect_over(ws, &trace, "alice-2", t).await;
                let events = c.events();
                match c
                    .reconnect(
                        "alice".into(),
                        m.last_seq() as i64,
                        vec![session_uri("s1"), chat_uri("s1")],
                    )
                    .await
                {
                    Ok(r) => {
                        m.events = events;
                        match r {
                            ReconnectResult::Replay(r) => {
                                assert!(r.missing.is_empty(), "{:?}", r.missing);
                                for env in &r.actions {
                                    m.apply(env);
                                }
                            }
                            ReconnectResult::Snapshot(s) => {
                                for snap in &s.snapshots {
                                    m.reset_to(&snap.resource, &snap.state, snap.from_seq as u64);
                                }
                            }
                        }
                        break c;
                    }
                    // Still partitioned: the request timed out. Try again on a new socket.
                    Err(ClientError::Cancelled) => {
                        let _ =
                            tokio::time::timeout(Duration::from_millis(100), c.shutdown()).await;
                    }
                    Err(e) => panic!("alice: reconnect failed: {e}"),
                }
            };
            assert!(
                phase.load(Ordering::SeqCst) >= P_REPAIRED,
                "reconnected while partitioned (lost at {lost_at} ms)"
            );
            while !bob_done.load(Ordering::SeqCst) {
                m.pump(Duration::from_millis(50)).await.expect("open");
            }
            m.pump(QUIET).await.expect("open");
            let fresh = official(&trace, "alice", "alice-fresh", t).await;
            init(&fresh, "alice-fresh", &[]).await;
            m.assert_matches_host(&fresh).await;
            close(fresh).await;
            close(c).await;
            Ok(())
        });
    }
    {
        let (trace, phase, bob_done) = (trace.clone(), phase.clone(), bob_done);
        // Bob changes the session while alice is cut off, and once more after the repair.
        sim.client("bob", async move {
            let b = official(&trace, "bob", "bob", Duration::from_secs(5)).await;
            init(&b, "bob", &[]).await;
            wait_for(&phase, P_PARTITIONED).await;
            let mut m = Mirror::subscribe(&b, "bob", "s1").await;
            for i in 0..5 {
                b.dispatch(
                    chat_uri("s1"),
                    pending_set("queued", &format!("b{i}"), "while cut off"),
                )
                .await
                .expect("dispatch");
                tokio::time::sleep(Duration::from_millis(30)).await;
            }
            m.pump(QUIET).await.expect("open");
            wait_for(&phase, P_REPAIRED).await;
            // This one also reaches alice's dead socket: the host learns it is gone (RST).
            b.dispatch(
                chat_uri("s1"),
                pending_set("steering", "st", "after the repair"),
            )
            .await
            .expect("dispatch");
            m.pump(QUIET).await.expect("open");
            bob_done.store(true, Ordering::SeqCst);
            close(b).await;
            Ok(())
        });
    }
    let mut repair_at = None;
    run(&mut sim, |sim| {
        let now = sim.elapsed();
        if phase.load(Ordering::SeqCst) == P_READY {
            sim.partition("alice", HOST);
            repair_at = Some(now + Duration::from_secs(2));
            phase.store(P_PARTITIONED, Ordering::SeqCst);
        }
        if repair_at.is_some_and(|at| now >= at) {
            sim.repair("alice", HOST);
            repair_at = None;
            phase.store(P_REPAIRED, Ordering::SeqCst);
        }
    });
    Outcome {
        digest: trace.digest(),
        probe: probe_of(&probe),
    }
}

#[test]
fn partition_then_official_reconnect_ends_with_the_hosts_state() {
    sweep("partition", partition_scenario);
}

// ─── 3. Hold and release: order, no duplicates ───────────────────────────────

const H_READY: u32 = 1;
const H_HELD: u32 = 2;
const H_BOB_DONE: u32 = 3;
const H_RELEASED: u32 = 4;

fn hold_scenario(seed: u64) -> Outcome {
    let mut sim = builder(seed, (1, 20)).build();
    let trace = Trace::default();
    let probe = SharedProbe::default();
    driver::install(
        &mut sim,
        HOST,
        HostSpec::maintainers(seed, &["alice", "bob"]),
        probe.clone(),
    );
    let phase = Arc::new(AtomicU32::new(0));
    let released_at = Arc::new(AtomicU64::new(u64::MAX));

    {
        let (trace, phase, released_at) = (trace.clone(), phase.clone(), released_at.clone());
        sim.client("alice", async move {
            let t = Duration::from_secs(10);
            let a = official(&trace, "alice", "alice", t).await;
            init(&a, "alice", &[]).await;
            create_session(&a, "s1").await;
            let mut m = Mirror::subscribe(&a, "alice", "s1").await;
            let before = m.last_seq();
            phase.store(H_READY, Ordering::SeqCst);
            wait_for(&phase, H_HELD).await;
            // Sent into the held link: reaches the host only on release.
            a.dispatch(chat_uri("s1"), pending_set("queued", "a1", "held"))
                .await
                .expect("dispatch");
            while phase.load(Ordering::SeqCst) < H_RELEASED {
                m.pump(Duration::from_millis(50)).await.expect("open");
            }
            m.pump(QUIET).await.expect("open");
            let release = released_at.load(Ordering::SeqCst);
            assert!(m.applied.len() >= 10, "alice saw only {:?}", m.applied);
            assert!(m.last_seq() > before);
            // Nothing crossed the held link early.
            assert!(
                m.applied.iter().all(|&(at, _)| at >= release),
                "an envelope arrived before the release at {release} ms: {:?}",
                m.applied
            );
            let fresh = official(&trace, "alice", "alice-fresh", t).await;
            init(&fresh, "alice-fresh", &[]).await;
            m.assert_matches_host(&fresh).await;
            close(fresh).await;
            close(a).await;
            Ok(())
        });
    }
    {
        let (trace, phase) = (trace.clone(), phase.clone());
        sim.client("bob", async move {
            let b = official(&trace, "bob", "bob", Duration::from_secs(10)).await;
            init(&b, "bob", &[]).await;
            wait_for(&phase, H_HELD).await;
            let mut m = Mirror::subscribe(&b, "bob", "s1").await;
            let ch = chat_uri("s1");
            b.dispatch(ch.clone(), turn_started("t1", "go"))
                .await
                .expect("dispatch");
            for i in 0..6 {
                b.dispatch(ch.clone(), pending_set("queued", &format!("q{i}"), "more"))
                    .await
                    .expect("dispatch");
            }
            b.dispatch(ch.clone(), pending_set("steering", "st", "steer"))
                .await
                .expect("dispatch");
            m.pump(QUIET).await.expect("open");
            phase.store(H_BOB_DONE, Ordering::SeqCst);
            wait_for(&phase, H_RELEASED).await;
            m.pump(QUIET).await.expect("open");
            close(b).await;
            Ok(())
        });
    }
    run(&mut sim, |sim| match phase.load(Ordering::SeqCst) {
        H_READY => {
            sim.hold("alice", HOST);
            phase.store(H_HELD, Ordering::SeqCst);
        }
        H_BOB_DONE => {
            sim.release("alice", HOST);
            released_at.store(sim.elapsed().as_millis() as u64, Ordering::SeqCst);
            phase.store(H_RELEASED, Ordering::SeqCst);
        }
        _ => {}
    });
    Outcome {
        digest: trace.digest(),
        probe: probe_of(&probe),
    }
}

#[test]
fn held_link_delivers_in_order_without_duplicates_on_release() {
    sweep("hold", hold_scenario);
}

// ─── 4. Client services over raw WebSocket ───────────────────────────────────

const S_HOLD_OWNER: u32 = 1;
const S_OWNER_HELD: u32 = 2;
const S_TIMED_OUT: u32 = 3;
const S_RELEASED: u32 = 4;
/// Notifications each sender sends.
const NOTES: u64 = 40;
const REQUEST_TIMEOUT_MS: u64 = 1_000;

fn client_services_scenario(seed: u64) -> Outcome {
    let mut sim = builder(seed, (1, 25)).build();
    let trace = Trace::default();
    let probe = SharedProbe::default();
    let mut spec = HostSpec::maintainers(seed, &["svc-owner", "svc-caller"]);
    spec.config = HostConfig {
        trust_groups: vec![vec!["svc-owner".into(), "svc-caller".into()]],
        ..HostConfig::default()
    };
    driver::install(&mut sim, HOST, spec, probe.clone());
    let phase = Arc::new(AtomicU32::new(0));
    let service: Arc<Mutex<Option<String>>> = Arc::default();
    let callers_done = Arc::new(AtomicU32::new(0));

    {
        let (trace, service, callers_done) = (trace.clone(), service.clone(), callers_done.clone());
        sim.client("owner", async move {
            let mut o = Raw::connect(HOST, "svc-owner", "owner", &trace).await;
            o.initialize("owner", &[]).await;
            let r = o
                .ok(
                    "client/registerService",
                    json!({"channel": CATALOG, "metadata": {"protocol": "echo"}}),
                )
                .await;
            let id = r["serviceId"].as_str().expect("serviceId").to_owned();
            *service.lock().expect("lock") = Some(id);
            let mut handled = Vec::new();
            let mut cancels = Vec::new();
            let mut notes: Vec<(String, u64)> = Vec::new();
            loop {
                let Some(v) = o.read(Duration::from_millis(100)).await else {
                    if callers_done.load(Ordering::SeqCst) == 2 {
                        break;
                    }
                    continue;
                };
                match v["method"].as_str() {
                    Some("clientService/handleRequest") => {
                        let hid = v["id"].as_u64().expect("numeric host id");
                        handled.push(hid);
                        // Answers every request, however late: a held link makes one late.
                        o.send(&json!({"jsonrpc": "2.0", "id": hid,
                                       "result": {"echo": v["params"]["params"]}}))
                            .await;
                    }
                    Some("$/cancelRequest") => {
                        cancels.push(v["params"]["id"].as_u64().expect("id"));
                    }
                    Some("clientService/notification") => {
                        let p = &v["params"];
                        notes.push((
                            p["senderClientId"].as_str().expect("sender").to_owned(),
                            p["params"]["n"].as_u64().expect("n"),
                        ));
                    }
                    _ => panic!("owner: unexpected frame {v}"),
                }
            }
            assert_eq!(handled.len(), 2, "owner handled {handled:?}");
            // The timed-out request (the second) was cancelled, after it was handed over.
            assert_eq!(cancels, vec![handled[1]], "owner got cancels {cancels:?}");
            for sender in ["caller", "caller-2"] {
                let got: Vec<u64> = notes
                    .iter()
                    .filter(|(s, _)| s == sender)
                    .map(|(_, n)| *n)
                    .collect();
                assert_eq!(
                    got,
                    (0..NOTES).collect::<Vec<_>>(),
                    "notifications from {sender} not FIFO, or lost or doubled"
                );
            }
            Ok(())
        });
    }
    {
        let (trace, service, phase, callers_done) = (
            trace.clone(),
            service.clone(),
            phase.clone(),
            callers_done.clone(),
        );
        sim.client("caller", async move {
            let mut c = Raw::connect(HOST, "svc-caller", "caller", &trace).await;
            c.initialize("caller", &[]).await;
            let sid = loop {
                if let Some(s) = service.lock().expect("lock").clone() {
                    break s;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            };
            let r = c
                .ok(
                    "clientService/request",
                    json!({"channel": CATALOG, "serviceId": sid, "method": "echo",
                           "params": {"x": 1}}),
                )
                .await;
            assert_eq!(r, json!({"echo": {"x": 1}}));

            phase.store(S_HOLD_OWNER, Ordering::SeqCst);
            wait_for(&phase, S_OWNER_HELD).await;
            let sent_at = sim_ms();
            let id = c
                .request(
                    "clientService/request",
                    json!({"channel": CATALOG, "serviceId": sid, "method": "slow",
                           "params": {"x": 2}, "timeoutMs": REQUEST_TIMEOUT_MS}),
                )
                .await;
            let r = c.response(id, Duration::from_secs(5)).await;
            assert_eq!(r["error"]["code"], -32050, "expected the timeout: {r}");
            let waited = sim_ms() - sent_at;
            assert!(
                (REQUEST_TIMEOUT_MS..REQUEST_TIMEOUT_MS + 200).contains(&waited),
                "timeout after {waited} ms"
            );
            phase.store(S_TIMED_OUT, Ordering::SeqCst);
            wait_for(&phase, S_RELEASED).await;
            // The owner's late answer is dropped: nothing more reaches the caller.
            let more = c.drain(Duration::from_secs(1)).await;
            assert!(
                more.is_empty(),
                "caller got more after the timeout: {more:?}"
            );

            for n in 0..NOTES {
                c.send(&json!({"jsonrpc": "2.0", "method": "clientService/notify",
                               "params": {"channel": CATALOG, "serviceId": sid,
                                          "method": "tick", "params": {"n": n}}}))
                    .await;
            }
            let more = c.drain(QUIET).await;
            assert!(
                more.is_empty(),
                "notifications are never answered: {more:?}"
            );
            callers_done.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
    }
    {
        let (trace, service, phase, callers_done) =
            (trace.clone(), service, phase.clone(), callers_done);
        // A second sender interleaves with the first: FIFO holds per sender only.
        sim.client("caller-2", async move {
            let mut c = Raw::connect(HOST, "svc-caller", "caller-2", &trace).await;
            c.initialize("caller-2", &[]).await;
            wait_for(&phase, S_RELEASED).await;
            let sid = service.lock().expect("lock").clone().expect("registered");
            for n in 0..NOTES {
                c.send(&json!({"jsonrpc": "2.0", "method": "clientService/notify",
                               "params": {"channel": CATALOG, "serviceId": sid,
                                          "method": "tick", "params": {"n": n}}}))
                    .await;
                if n % 8 == 0 {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }
            let more = c.drain(QUIET).await;
            assert!(more.is_empty(), "{more:?}");
            callers_done.fetch_add(1, Ordering::SeqCst);
            Ok(())
        });
    }
    run(&mut sim, |sim| match phase.load(Ordering::SeqCst) {
        S_HOLD_OWNER => {
            sim.hold("owner", HOST);
            phase.store(S_OWNER_HELD, Ordering::SeqCst);
        }
        S_TIMED_OUT => {
            sim.release("owner", HOST);
            phase.store(S_RELEASED, Ordering::SeqCst);
        }
        _ => {}
    });
    let p = probe_of(&probe);
    let s = &p.stats;
    assert_eq!(s.requests_relayed, 2, "{s:?}");
    // Each relayed request reached exactly one outcome (the timeout counts as one).
    assert_eq!(s.requests_completed, 2, "{s:?}");
    assert_eq!(s.requests_timed_out, 1, "{s:?}");
    assert_eq!(s.responses_dropped, 1, "the late answer: {s:?}");
    assert_eq!(s.notifications_forwarded, 2 * NOTES, "{s:?}");
    assert_eq!(s.notifications_dropped, 0, "{s:?}");
    Outcome {
        digest: trace.digest(),
        probe: p,
    }
}

#[test]
fn client_services_timeout_late_answer_and_fifo_notifications() {
    sweep("client_services", client_services_scenario);
}
