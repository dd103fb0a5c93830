//! The checker: watches the host from outside and says when an invariant breaks.
//!
//! It owns no host state. It sees every output (and hashes it into the trace digest), and after
//! every step it reads the host only through its (A) getters (`channel_state`, `subscriptions`,
//! `server_seq`, `queued_bytes`, `store`). Per-connection stream rules (`serverSeq` order, no
//! envelope without a subscription, one response per request, rejections only to the sender)
//! are checked by each client as frames arrive; this module checks what needs both sides:
//!
//! 1. every client that is initialized and *quiescent* on its connection (nothing in flight to
//!    it) holds, for every channel it mirrors, exactly `host.channel_state_for(principal, uri)`
//!    (the catalog differs per observer; every other channel is the same for all);
//! 2. the subscriptions the host holds for a connection match what the client asked for;
//! 3. the driver's unflushed bytes equal `host.queued_bytes` (byte accounting, both ends);
//! 4. `host.server_seq()` never decreases within a host's life, and a restarted host resumes at
//!    or above every number ever revealed; after a clean restart every session is still there
//!    with the same state (a killed host loses only what was never revealed);
//! 5. no frame follows a `Close`, and nothing is sent to a connection the host never saw;
//! 6. the `startedAt` of every accepted `chat/turnStarted` the host sends never goes back, within
//!    one host lifetime or across restarts (the core keeps a wall-clock high-water mark and a
//!    restarted host resumes it from the start times it stored); either regression fails.
//! 7. client services, after every single call into the host (the world drains the host after
//!    each one, so every output has exactly one cause): requests complete at most once, only to
//!    their caller, with the documented code for the reason the cause carries; notifications are
//!    forwarded at most once, only to the owner, in order, never answered; the pending table,
//!    its deadlines and the registry equal the model. See [`crate::services`].
//! 8. the host's clientId bindings are the store's whenever nothing is in flight, and no
//!    principal keeps more bindings that never dispatched than `idle_client_ids_per_principal`;
//!    a clean restart keeps every one.
//! 9. durability, frame by frame ([`crate::durability`]): nothing revealed before it is durable,
//!    a failed batch leaves no trace, a restart never goes below what was revealed.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use axhost_core::{
    stored_bindings, ClientRecord, ConnId, Host, HostConfig, Input, MemStore, Output, Principal,
};
use serde_json::Value;
use sha2::{Digest as _, Sha256};

use crate::client::SimClient;
use crate::durability::DurabilityOracle;
use crate::net::SimNet;
use crate::replica::{difference, first_difference, CATALOG};
use crate::services::ServiceModel;
use crate::store::SimStore;

/// A broken invariant, with where and when it broke.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The seed of the run.
    pub seed: u64,
    /// The step the check failed after.
    pub step: u64,
    /// Simulated monotonic time, in milliseconds.
    pub at_ms: u64,
    /// What broke, naming ids and counters.
    pub message: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} step {} t={}ms: {}",
            self.seed, self.step, self.at_ms, self.message
        )
    }
}

impl std::error::Error for Violation {}

/// The trace digest: SHA-256 over every output, in order.
#[derive(Copy, Clone, PartialEq, Eq, Hash)]
pub struct Digest(pub [u8; 32]);

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({self})")
    }
}

/// What must survive a restart: the sequence and every channel's state.
#[derive(Clone, Debug)]
pub struct Durable {
    server_seq: u64,
    states: BTreeMap<String, Value>,
    bindings: Vec<ClientRecord>,
}

impl Durable {
    /// Reads the durable view of `host` for the sessions in `session_ids` (the whole pool:
    /// sessions are only ever created from it).
    pub fn capture(host: &Host<SimStore>, session_ids: &[String]) -> Durable {
        let mut states = BTreeMap::new();
        for id in session_ids {
            for uri in [
                format!("ahp-session:/{id}"),
                format!("ahp-chat:/{id}"),
                format!("ahp-changeset:/{id}"),
            ] {
                if let Some(state) = host.channel_state(&uri) {
                    states.insert(uri, state);
                }
            }
        }
        if let Some(root) = host.channel_state("ahp-root://") {
            states.insert("ahp-root://".into(), root);
        }
        Durable {
            server_seq: host.server_seq(),
            states,
            bindings: host.client_bindings().cloned().collect(),
        }
    }
}

/// Invariant checks and the trace digest. See the module docs.
pub struct Checker {
    hasher: Sha256,
    /// Frames and closes hashed so far.
    pub outputs: u64,
    /// Highest `host.server_seq()` seen in this host's life.
    server_seq_high: u64,
    /// Connections the current host was told about and not yet told are closed.
    open: BTreeSet<ConnId>,
    /// Connections the current host asked to close.
    closing: BTreeSet<ConnId>,
    /// Host channel states read at `cache_epoch`.
    host_cache: BTreeMap<String, Option<Value>>,
    cache_epoch: u64,
    /// `(client, channel) -> (host epoch, replica version)` at the last successful comparison.
    compared: BTreeMap<(usize, String), (u64, u64)>,
    /// Comparisons actually made (for the report).
    pub comparisons: u64,
    /// Latest `startedAt` (Unix ms) each connection of the current host was shown; the latest
    /// any connection of the current host was shown; the latest any earlier host showed.
    /// Frames held for the disk leave connection by connection, so only each connection's
    /// own order is the order the host decided in.
    started_high: (BTreeMap<ConnId, i64>, i64, i64),
    /// The reference model of client services.
    pub services: ServiceModel,
    /// The durability oracles.
    pub durability: DurabilityOracle,
}

impl Default for Checker {
    fn default() -> Self {
        Checker::new(&HostConfig::default())
    }
}

impl Checker {
    /// A checker that has seen nothing, for a host with `config`.
    pub fn new(config: &HostConfig) -> Checker {
        Checker {
            hasher: Sha256::new(),
            outputs: 0,
            server_seq_high: 0,
            open: BTreeSet::new(),
            closing: BTreeSet::new(),
            host_cache: BTreeMap::new(),
            cache_epoch: u64::MAX,
            compared: BTreeMap::new(),
            comparisons: 0,
            started_high: (BTreeMap::new(), i64::MIN, i64::MIN),
            services: ServiceModel::new(config),
            durability: DurabilityOracle::default(),
        }
    }

    /// The digest of every output so far.
    pub fn digest(&self) -> Digest {
        Digest(self.hasher.clone().finalize().into())
    }

    /// The driver is about to feed `Input::Connected` for client `client_id` as `principal`.
    pub fn connected(&mut self, conn: ConnId, client_id: &str, principal: &Principal) {
        let fresh = self.open.insert(conn);
        assert!(fresh, "simulator reused {conn:?}");
        self.services.connected(conn, client_id, principal);
        self.durability.connected(conn, client_id, principal);
    }

    /// The driver is about to feed `input` at `now_ms`; its outputs follow, then [`Checker::fed`].
    pub fn feeding(&mut self, input: &Input<'_>, now_ms: u64, host: Option<&Host<SimStore>>) {
        self.services.feeding(input, now_ms, host);
        self.durability.feeding(input);
    }

    /// The driver is about to fire the host's timers at `now_ms`.
    pub fn timer(&mut self, now_ms: u64) {
        self.services.timer(now_ms);
    }

    /// The host call announced by [`Checker::feeding`] or [`Checker::timer`] returned and its
    /// outputs were drained: invariant 7.
    pub fn fed(&mut self, host: &Host<SimStore>) -> Result<(), String> {
        self.services.fed(host)
    }

    /// The driver fed `Input::Closed`.
    pub fn closed(&mut self, conn: ConnId) {
        self.open.remove(&conn);
        self.closing.remove(&conn);
        self.durability.closed(conn);
    }

    /// The host process died: its connections are gone with it.
    pub fn restarted(&mut self) {
        self.open.clear();
        self.closing.clear();
        let life = std::mem::take(&mut self.started_high.0);
        self.started_high.2 = self.started_high.2.max(self.started_high.1);
        self.started_high.1 = i64::MIN;
        drop(life);
        self.server_seq_high = 0;
        self.hasher.update(b"R");
        self.services.restarted();
        self.durability.restarted();
    }

    /// Hashes one output and checks it may be sent at all, and (a frame) that it reveals
    /// nothing `store` does not hold.
    pub fn on_output(&mut self, out: &Output, store: &MemStore) -> Result<(), String> {
        self.outputs += 1;
        match out {
            Output::Send { conn, frame } => {
                self.hasher.update(b"S");
                self.hasher.update(conn.0.to_le_bytes());
                self.hasher.update((frame.len() as u64).to_le_bytes());
                self.hasher.update(frame.as_bytes());
                if !self.open.contains(conn) {
                    return Err(format!(
                        "frame for {conn:?}, which the host was told is closed or never saw"
                    ));
                }
                if self.closing.contains(conn) {
                    return Err(format!("frame for {conn:?} after the host closed it"));
                }
                self.wall_clock(*conn, frame.as_str())?;
                self.durability.on_send(*conn, frame.as_str(), store)?;
            }
            Output::Close { conn, code, .. } => {
                self.hasher.update(b"C");
                self.hasher.update(conn.0.to_le_bytes());
                self.hasher.update(code.code().to_le_bytes());
                if !self.open.contains(conn) {
                    return Err(format!(
                        "close for {conn:?}, which the host was told is closed or never saw"
                    ));
                }
                if !self.closing.insert(*conn) {
                    return Err(format!("{conn:?} closed twice"));
                }
            }
            Output::Commit(change) => {
                self.hasher.update(b"K");
                self.hasher.update(change.number.to_le_bytes());
                self.hasher.update(change.generation.to_le_bytes());
                self.hasher.update(change.server_seq.to_le_bytes());
            }
        }
        self.services.observe(out);
        Ok(())
    }

    /// Invariant 6: turn start times handed out never go back, within a host lifetime or across
    /// restarts.
    fn wall_clock(&mut self, conn: ConnId, frame: &str) -> Result<(), String> {
        if !frame.contains("\"chat/turnStarted\"") || frame.contains("\"rejectionReason\"") {
            return Ok(());
        }
        let v: Value =
            serde_json::from_str(frame).map_err(|e| format!("host frame is not JSON: {e}"))?;
        let Some(text) = v
            .pointer("/params/action/startedAt")
            .and_then(Value::as_str)
        else {
            return Ok(());
        };
        let ms = crate::client::unix_ms(text)
            .ok_or_else(|| format!("startedAt {text:?} is not RFC 3339 UTC"))?;
        let mine = self.started_high.0.entry(conn).or_insert(i64::MIN);
        if ms < *mine {
            return Err(format!("startedAt {text} is older than a start time this connection was already shown ({mine} ms)"));
        }
        *mine = ms;
        // Across restarts too: the host resumes its wall-clock mark from the timestamps it
        // stored, and every startedAt a client saw was durable with its event.
        let ever = self.started_high.2;
        if ms < ever {
            return Err(format!(
                "startedAt {text} is older than one handed out before a restart ({ever} ms)"
            ));
        }
        self.started_high.1 = self.started_high.1.max(ms);
        Ok(())
    }

    /// Every cross-cutting invariant, after one step. `epoch` counts calls into the host: the
    /// host's state can only change when it does, so comparisons are cached per epoch and per
    /// replica version without skipping any state that could differ.
    pub fn after_step(
        &mut self,
        host: &Host<SimStore>,
        net: &SimNet,
        clients: &[SimClient],
        epoch: u64,
    ) -> Result<(), String> {
        self.sequence(host)?;
        self.ledger(host, net)?;
        let sessions_max = host.limits().sessions_max as usize;
        if host.session_count() > sessions_max {
            return Err(format!(
                "the host holds {} sessions, over sessions_max {sessions_max}",
                host.session_count()
            ));
        }
        bindings(host)?;
        if epoch != self.cache_epoch {
            host.audit_chat_bytes()?;
            self.host_cache.clear();
            self.cache_epoch = epoch;
        }
        for client in clients {
            self.subscriptions(host, net, client)?;
            if quiescent(host, client, net) {
                self.mirrors(host, client, epoch, false)?;
            }
        }
        Ok(())
    }

    /// At the end of the liveness phase: every client that must be up is quiescent, and every
    /// replica is compared again without the cache.
    pub fn final_check(
        &mut self,
        host: &Host<SimStore>,
        net: &SimNet,
        clients: &[SimClient],
    ) -> Result<(), String> {
        self.host_cache.clear();
        self.cache_epoch = u64::MAX;
        for client in clients.iter().filter(|c| c.connection.is_some()) {
            if !quiescent(host, client, net) {
                return Err(format!(
                    "client {} is not quiescent after settling",
                    client.index
                ));
            }
            self.mirrors(host, client, u64::MAX, true)?;
        }
        Ok(())
    }

    fn sequence(&mut self, host: &Host<SimStore>) -> Result<(), String> {
        let seq = host.server_seq();
        if seq < self.server_seq_high {
            return Err(format!(
                "host serverSeq went back from {} to {seq}",
                self.server_seq_high
            ));
        }
        self.server_seq_high = seq;
        Ok(())
    }

    fn ledger(&self, host: &Host<SimStore>, net: &SimNet) -> Result<(), String> {
        for (conn, link) in net.links() {
            match host.queued_bytes(conn) {
                None => {
                    return Err(format!(
                        "{conn:?} is open at the driver but unknown to the host"
                    ))
                }
                Some(q) if q != link.unflushed_bytes => {
                    return Err(format!(
                        "{conn:?}: host counts {q} queued bytes, driver has {} unflushed",
                        link.unflushed_bytes
                    ))
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    fn subscriptions(
        &self,
        host: &Host<SimStore>,
        net: &SimNet,
        client: &SimClient,
    ) -> Result<(), String> {
        let Some(c) = &client.connection else {
            return Ok(());
        };
        if net.link(c.conn).is_none_or(|l| l.host_closed) || host.connection_closing(c.conn) {
            // A connection the host is closing observes nothing: the host drops its
            // subscriptions at once, while the client learns of the close only later.
            return Ok(());
        }
        let held: BTreeSet<String> = host.subscriptions(c.conn).into_iter().collect();
        let maybe = client.channels_maybe_subscribed();
        if let Some(extra) = held.iter().find(|ch| !maybe.contains(*ch)) {
            return Err(format!(
                "client {} {:?}: host holds a subscription to {extra} the client never asked for or already left",
                client.index, c.conn
            ));
        }
        if c.ready {
            if let Some(lost) = client.replicas.keys().find(|ch| !held.contains(*ch)) {
                return Err(format!(
                    "client {} {:?}: client mirrors {lost} but the host holds no subscription",
                    client.index, c.conn
                ));
            }
        }
        Ok(())
    }

    fn mirrors(
        &mut self,
        host: &Host<SimStore>,
        client: &SimClient,
        epoch: u64,
        force: bool,
    ) -> Result<(), String> {
        for (uri, replica) in &client.replicas {
            let key = (client.index, uri.clone());
            if !force && self.compared.get(&key) == Some(&(epoch, replica.version)) {
                continue;
            }
            self.comparisons += 1;
            // The catalog differs per observer: cache it per principal.
            let cache_key = if uri == CATALOG {
                format!("{uri}#{}", client.principal.id)
            } else {
                uri.clone()
            };
            let host_state = self
                .host_cache
                .entry(cache_key)
                .or_insert_with(|| host.channel_state_for(&client.principal, uri));
            let Some(host_state) = host_state else {
                return Err(format!(
                    "client {} mirrors {uri}, which the host does not have",
                    client.index
                ));
            };
            if replica.json() != host_state {
                return Err(format!(
                    "client {} (quiescent) disagrees with the host on {uri}: {}",
                    client.index,
                    first_difference(replica.json(), host_state)
                ));
            }
            self.compared.insert(key, (epoch, replica.version));
        }
        Ok(())
    }

    /// After a restart: no revealed number is above the new host's, and after a clean one
    /// (`before` given: nothing was lost) every channel and binding is as it was.
    pub fn after_restart(
        &mut self,
        before: Option<&Durable>,
        host: &Host<SimStore>,
        session_ids: &[String],
    ) -> Result<(), String> {
        self.durability.after_restart(host.server_seq())?;
        self.host_cache.clear();
        self.cache_epoch = u64::MAX;
        let Some(before) = before else {
            return self.sequence(host);
        };
        let after = Durable::capture(host, session_ids);
        if after.server_seq < before.server_seq {
            return Err(format!(
                "restart moved serverSeq back from {} to {}",
                before.server_seq, after.server_seq
            ));
        }
        for (uri, state) in &before.states {
            match after.states.get(uri) {
                None => return Err(format!("restart lost {uri}")),
                Some(s) if s != state => {
                    return Err(format!(
                        "restart changed {uri}: {}",
                        difference(s, state, ("after", "before"))
                    ));
                }
                Some(_) => {}
            }
        }
        if let Some(uri) = after
            .states
            .keys()
            .find(|u| !before.states.contains_key(*u))
        {
            return Err(format!("restart invented {uri}"));
        }
        if after.bindings != before.bindings {
            return Err(format!(
                "restart changed the clientId bindings from {:?} to {:?}",
                before.bindings, after.bindings
            ));
        }
        self.host_cache.clear();
        self.cache_epoch = u64::MAX;
        self.sequence(host)
    }
}

/// Invariant 8, during a run.
fn bindings(host: &Host<SimStore>) -> Result<(), String> {
    if host.changes_in_flight() == 0 {
        let stored = stored_bindings(host.store().mem());
        if !host
            .client_bindings()
            .map(Some)
            .eq(stored.iter().map(Option::as_ref))
        {
            return Err(format!(
                "clientId bindings differ from the store: host {:?}, store {stored:?}",
                host.client_bindings().collect::<Vec<_>>(),
            ));
        }
    }
    let quota = host.limits().idle_client_ids_per_principal as usize;
    let owners: BTreeSet<&str> = host.client_bindings().map(|c| c.owner.as_str()).collect();
    for owner in owners {
        let idle = host.idle_client_ids(owner);
        if idle > quota {
            return Err(format!(
                "{owner} keeps {idle} clientIds that never dispatched, over its quota of {quota}"
            ));
        }
    }
    Ok(())
}

/// Whether `client` has received everything the host sent it: initialized, nothing held for
/// it, its link open and nothing in flight towards it. Only then must its replicas equal the
/// host's states.
fn quiescent(host: &Host<SimStore>, client: &SimClient, net: &SimNet) -> bool {
    let Some(c) = &client.connection else {
        return false;
    };
    // Frames held for the disk are on their way too.
    if !c.ready || host.held_frames(c.conn) > 0 {
        return false;
    }
    net.link(c.conn)
        .is_some_and(|l| !l.in_flight_to_client() && !l.host_closed && !l.client_gone)
}
