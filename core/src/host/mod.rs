//! The host: the kernel and its components, and the one drive surface drivers use.
//!
//! `Host` owns a [`Kernel`] and the components (AHP sessions, clientId bindings, client
//! services). Inputs arrive here; [`router`] sends each method to the component that owns it;
//! [`handshake`] and [`channels`] are the parts that span components (`initialize` and
//! `reconnect` bind, subscribe and snapshot whatever channel is named). A failed commit is
//! rolled back here too, because it touches every component: see [`Host::handle`].

pub(crate) mod channels;
mod initialize;
mod inspect;

pub use inspect::AxpInspect;
mod router;

use std::sync::Arc;

use serde::Deserialize;
use serde_json::value::RawValue;

use crate::ahp::clients::{ClientBindings, ClientRecord, ReadError as ClientReadError};
use crate::ahp::session::RestoreError;
use crate::ahp::sessions::Sessions;
use crate::axp::executors::TIMER_RETRY_MS;
use crate::axp::Axp;
use crate::error::RpcError;
use crate::kernel::time::{Instant, Now, Timer};
use crate::kernel::{HostConfig, Kernel};
use crate::limits::LimitsError;
use crate::log::change::{StoreError, Table};
use crate::log::store::Store;
use crate::log::write_path::Touched;
use crate::net::connection::{ConnId, Connection, Phase};
use crate::net::output::{CloseCode, Frame, Output};
use crate::principal::Principal;
use crate::services::ClientServices;

/// Why a host could not start.
#[derive(Debug)]
pub enum HostError {
    /// The limits contradict each other.
    Limits(LimitsError),
    /// The store could not be read.
    Store(StoreError),
    /// The store holds a record the host cannot read; named by key, never by content.
    CorruptRecord(String),
}

impl std::fmt::Display for HostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostError::Limits(e) => write!(f, "{e}"),
            HostError::Store(e) => write!(f, "{e}"),
            HostError::CorruptRecord(key) => write!(f, "store record {key:?} is unreadable"),
        }
    }
}

impl std::error::Error for HostError {}

impl From<RestoreError> for HostError {
    fn from(e: RestoreError) -> HostError {
        match e {
            RestoreError::Store(e) => HostError::Store(e),
            RestoreError::Corrupt(key) => HostError::CorruptRecord(key),
        }
    }
}

/// One thing that happened outside the core.
#[derive(Debug)]
pub enum Input<'a> {
    /// A transport is up and authenticated. `conn` is fresh and never reused.
    Connected {
        /// The new connection.
        conn: ConnId,
        /// Who it is, from its transport credential.
        principal: Arc<Principal>,
    },
    /// One complete WebSocket text message.
    Message {
        /// The connection it came from.
        conn: ConnId,
        /// Its text. WebSocket text messages are UTF-8 (RFC 6455 §5.6) and the driver's
        /// WebSocket layer has already checked that (closing 1007 otherwise), so the core reads
        /// `&str` and never validates UTF-8 a second time.
        text: &'a str,
    },
    /// The driver wrote `bytes` of this connection's queued frames to its socket.
    Flushed {
        /// The connection.
        conn: ConnId,
        /// Bytes written.
        bytes: u64,
    },
    /// The transport is gone. Inputs for `conn` after this are ignored.
    Closed {
        /// The connection.
        conn: ConnId,
    },
    /// Every change numbered up to `through` (from `Output::Commit`) is durable.
    Durable {
        /// The last change of the transaction that committed.
        through: u64,
    },
    /// The transaction holding change `number` (and every change after it the driver had)
    /// failed: none of it is durable. After reporting it the driver drops, uncommitted, every
    /// change whose generation is at most the highest generation in that transaction.
    CommitFailed {
        /// The first change of the failed transaction.
        number: u64,
    },
}

/// The sans-IO host. Generic over the store it reads.
pub struct Host<S: Store> {
    k: Kernel<S>,
    sessions: Sessions,
    clients: ClientBindings,
    services: ClientServices,
    axp: Axp,
}

impl<S: Store> Host<S> {
    /// Builds a host over `store`, resuming whatever it holds. `seed` determines every id the
    /// host generates: same config, store contents, seed and inputs give the same outputs.
    pub fn new(config: HostConfig, mut store: S, seed: u64) -> Result<Host<S>, HostError> {
        config.limits.validate().map_err(HostError::Limits)?;
        let mut loaded = store
            .load(config.limits.replay_events_max)
            .map_err(HostError::Store)?;
        let services = ClientServices::new(&config.trust_groups);
        let mut k = Kernel::new(config, store, seed, &mut loaded, 0);
        let sessions = Sessions::load(&loaded.records, &mut k)?;
        // Timestamps already handed out and stored; new ones never go below them.
        k.raise_wall_floor(sessions.latest_timestamp_ms());
        let mut clients = Vec::new();
        for r in loaded.records.iter().filter(|r| r.table == Table::Client) {
            let record = ClientRecord::parse(&r.value)
                .ok_or_else(|| HostError::CorruptRecord(r.key.clone()))?;
            // One index seek per binding that dispatched: its newest receipt.
            let record = ClientRecord::read(&mut k, record).map_err(|e| match e {
                ClientReadError::Store(e) => HostError::Store(e),
                ClientReadError::Corrupt => HostError::CorruptRecord(r.key.clone()),
            })?;
            clients.push(record);
        }
        let mut axp = Axp::load(&loaded.records, seed).map_err(HostError::CorruptRecord)?;
        let mut sessions = sessions;
        // Nothing that ran before this process may continue unvouched: leases end and
        // executors go offline, as one change (issued only if there is anything to end).
        axp.on_start(&mut k, &mut sessions);
        Ok(Host {
            k,
            sessions,
            clients: ClientBindings::load(clients),
            services,
            axp,
        })
    }

    /// Feeds one input seen at `now`. Never blocks; never panics on peer bytes.
    pub fn handle(&mut self, now: Now, input: Input<'_>) {
        self.k.advance(now);
        match input {
            Input::Connected { conn, principal } => self.on_connected(conn, principal),
            Input::Message { conn, text } => self.on_message(conn, text),
            Input::Flushed { conn, bytes } => self.k.conns_mut().flushed(conn, bytes),
            Input::Closed { conn } => {
                self.k.disarm(&Timer::Handshake(conn));
                self.k.drop_held(conn);
                if let Some(Connection {
                    phase: Phase::Ready { client_id },
                    ..
                }) = self.k.conns_mut().remove(conn)
                {
                    self.clients.detach(&client_id);
                }
                self.services.forget(&mut self.k, conn);
            }
            Input::Durable { through } => self.k.on_durable(through),
            Input::CommitFailed { number } => {
                self.on_commit_failed(number);
                // Right after a failure the host is exactly the durable state; held messages
                // go in the next call (`Timer::Held`), not this one.
                self.reap();
                if self.k.held_messages() > 0 {
                    let now = self.k.now().mono;
                    self.k.arm(Timer::Held, now);
                }
                return;
            }
        }
        self.reap();
        self.handle_held();
    }

    /// Handles held messages, oldest first, while the write path has room for them (room a
    /// `Durable` or `CommitFailed` freed; a message that needs none goes as soon as it is at the
    /// front). Each is handled as if it arrived now, then what it closed is reaped.
    fn handle_held(&mut self) {
        while let Some(held) = self.k.next_held() {
            self.on_held_message(held.conn, held.first, &held.text);
            self.reap();
        }
    }

    /// Whether the host takes new input: false while `Limits::in_flight_changes_max` changes
    /// wait for the disk or messages are held for that reason. A driver should stop reading
    /// its peers while it is false (messages it reads anyway are held, up to
    /// `Limits::held_messages_max`) and read again once an `Input::Durable` turns it true;
    /// writing, `Flushed`, `Closed`, the writer's outcomes and timers go on as usual.
    pub fn accepting_input(&self) -> bool {
        self.k.accepting_input()
    }

    /// A failed commit: the log rolls back, every component rebuilds what the failed changes
    /// touched from the store (which now holds exactly the durable prefix), and what was held
    /// on them is rewritten: events dropped, the senders told, connections that were shown
    /// rolled-back state closed.
    fn on_commit_failed(&mut self, number: u64) {
        let Some(failed) = self.k.on_commit_failed(number) else {
            return;
        };
        for touched in &failed.touched {
            match touched {
                Touched::Session(id) => {
                    self.sessions.rebuild(&mut self.k, id);
                    if let Some(entry) = self.sessions.get(id) {
                        crate::axp::lease::note(&mut self.k, id, &entry.exchange);
                    }
                }
                Touched::Client(id) => self.clients.rebuild(&mut self.k, id),
                Touched::Executor(id) => self.axp.executors.rebuild(&mut self.k, id),
                Touched::BlobAccess(key) => self.axp.blobs.rebuild(&mut self.k, key),
                Touched::SigningKey(id) => self.axp.signing_keys.rebuild(&mut self.k, id),
                Touched::Memory(id) => self.axp.memory.rebuild(&mut self.k, id),
            }
        }
        self.k.after_failure(&failed);
    }

    /// Releases what a connection that is closing or closed still holds: its relayed requests
    /// and its services. Runs as soon as the host decides to close it, so nothing routes to it.
    fn reap(&mut self) {
        // Forgetting one connection can close others (a removal announced to an observer over
        // its limit), so repeat until a pass closes nothing new. Each pass closes connections
        // that were open before it, so this ends.
        loop {
            let closing = self.k.take_newly_closing();
            if closing.is_empty() {
                break;
            }
            for conn in closing {
                // A closing connection's messages are ignored, held ones too.
                self.k.drop_held(conn);
                self.services.forget(&mut self.k, conn);
            }
        }
    }

    /// Fires every timer due at or before `now.mono`. Early or repeated calls do nothing.
    pub fn handle_timeout(&mut self, now: Now) {
        self.k.advance(now);
        // Held messages first: a held `_axp/renew` goes before the expiry of its lease.
        self.handle_held();
        while let Some(timer) = self.k.pop_due_timer() {
            match timer {
                Timer::Handshake(conn) => {
                    let held = self.k.conn(conn).is_some_and(|c| c.messages_held > 0);
                    if held {
                        // Its handshake may be waiting for the disk, not missing.
                        let at = self.k.now().mono.plus_ms(TIMER_RETRY_MS);
                        self.k.arm(Timer::Handshake(conn), at);
                    } else if !self.k.is_ready(conn) {
                        self.k.close(conn, CloseCode::Policy, "Initialize required");
                    }
                }
                Timer::Relay(host_id) => self.services.relay_timeout(&mut self.k, host_id),
                Timer::Lease(id) => {
                    crate::axp::lease::on_timer(&mut self.k, &mut self.sessions, &id)
                }
                Timer::Executor(id) => self.axp.executors.on_timer(&mut self.k, &id),
                // Handled above and below.
                Timer::Held => {}
            }
        }
        self.reap();
        self.handle_held();
    }

    /// Hands back a frame the driver has copied out, so its buffer is reused.
    pub fn recycle(&mut self, frame: Frame) {
        self.k.recycle(frame);
    }

    /// The next decision for the driver, in the order the host made them.
    pub fn poll_output(&mut self) -> Option<Output> {
        let out = self.k.poll_output();
        if matches!(out, Some(Output::Send { .. })) {
            self.k.stats_mut().frames_out += 1;
        }
        out
    }

    /// When the host next needs `handle_timeout`.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.k.next_deadline()
    }

    fn on_connected(&mut self, conn: ConnId, principal: Arc<Principal>) {
        let full = self.k.conns().len() >= self.k.limits().connections_max as usize;
        self.k.conns_mut().insert(conn, principal);
        if full {
            self.k
                .close(conn, CloseCode::TryAgainLater, "Too many connections");
            return;
        }
        let deadline = self
            .k
            .now()
            .mono
            .plus_ms(self.k.limits().handshake_timeout_ms);
        self.k.arm(Timer::Handshake(conn), deadline);
    }
}

/// Params of every method that names only a channel.
#[derive(Deserialize)]
pub(crate) struct ChannelParams {
    pub(crate) channel: String,
}

/// Decodes params into `T`, or a `-32602` naming what is wrong.
pub(crate) fn parse_params<'a, T: Deserialize<'a>>(
    params: Option<&'a RawValue>,
) -> Result<T, RpcError> {
    let text = params.map_or("null", RawValue::get);
    serde_json::from_str(text)
        .map_err(|e| RpcError::invalid_params(format!("Invalid parameters: {e}")))
}
