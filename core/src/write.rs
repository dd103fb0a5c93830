//! The one write path: every durable change is a [`Txn`], issued by [`Host::commit`].
//!
//! `commit` numbers the change, applies it to memory at once (callers have already changed
//! their tables; the next change is validated against this newest state, so a burst pipelines),
//! records its receipts in the recent-receipt cache, appends its events to the replay ring and
//! hands it to the driver as `Output::Commit`. Everything that reveals it leaves the host only
//! when the driver reports it durable (frames carry the newest issued number; see
//! `connection.rs`).
//!
//! A failed commit (`Input::CommitFailed { number }`) fails that change and every later one:
//! the host rebuilds what they touched from the store (which then holds exactly the durable
//! prefix), forgets their receipts and ring events, rewrites the held frames that depended on
//! them (dropped, answered `-32603`, the sender's rejection echo, or the catalog observer
//! closed), and bumps the generation.

use std::collections::{BTreeSet, VecDeque};

use crate::connection::{ConnId, Fail, HeldItem, OnFail, Order, Phase, Rewrite, Then};
use crate::error::RpcError;
use crate::host::Host;
use crate::output::{CloseCode, Output};
use crate::sequencer::Sequenced;
use crate::session::SessionEntry;
use crate::store::{Change, ClientRecord, Event, Receipt, RecordWrite, Store, Table};
use crate::wire;

/// Changes in flight at most; past it new durable changes are refused until the writer
/// catches up, so a stalled disk bounds what memory holds for it.
pub(crate) const IN_FLIGHT_MAX: usize = 4096;

/// What a failed change touched, to rebuild from the store.
pub(crate) enum Undo {
    /// A session; `created` holds its first state when this change created it (a pipelined
    /// abort rebuilds from there, as the store does not have it yet).
    Session {
        id: String,
        created: Option<Box<SessionEntry>>,
    },
    /// A clientId binding.
    Client(String),
}

/// One durable change being issued.
#[derive(Default)]
pub(crate) struct Txn {
    /// Envelopes, numbered from the sequencer's current `serverSeq` + 1.
    pub(crate) events: Vec<Event>,
    pub(crate) receipts: Vec<Receipt>,
    pub(crate) records: Vec<RecordWrite>,
    /// A `serverSeq` mark to reserve for catalog events.
    pub(crate) reservation: Option<u64>,
    pub(crate) undo: Vec<Undo>,
}

struct InFlight {
    number: u64,
    last_event: Option<u64>,
    undo: Vec<Undo>,
    /// The change's events, to rebuild a session a later change touched (pipelined abort).
    events: Vec<Sequenced>,
}

/// Numbers, the durable mark and the changes in flight.
pub(crate) struct WritePath {
    next: u64,
    durable: u64,
    /// The newest change that failed (0 before any). Every number up to it is resolved:
    /// durable or failed, so nothing waits on it.
    failed_through: u64,
    generation: u64,
    in_flight: VecDeque<InFlight>,
}

impl Default for WritePath {
    fn default() -> Self {
        WritePath {
            next: 1,
            durable: 0,
            failed_through: 0,
            generation: 0,
            in_flight: VecDeque::new(),
        }
    }
}

impl WritePath {
    /// The newest change issued (0 before any).
    pub(crate) fn issued(&self) -> u64 {
        self.next - 1
    }

    /// The newest change known durable.
    pub(crate) fn durable(&self) -> u64 {
        self.durable
    }

    /// The change a frame that depends on change `dep` really waits for: a failed number is
    /// resolved (its state is gone), so a frame made after the failure waits only for what is
    /// still durable or in flight below it.
    fn resolved(&self, dep: u64) -> u64 {
        if dep <= self.failed_through {
            // Every number up to `failed_through` is durable or failed; the durable ones are
            // all at or below the durable mark.
            dep.min(self.durable)
        } else {
            dep
        }
    }

    /// How a frame that reveals the state as it is now is ordered.
    pub(crate) fn order<'a>(&self, on_fail: Fail<'a>) -> Order<'a> {
        self.order_after(self.issued(), on_fail)
    }

    /// How a frame that depends on change `dep` only is ordered.
    pub(crate) fn order_after<'a>(&self, dep: u64, on_fail: Fail<'a>) -> Order<'a> {
        Order::After {
            dep: self.resolved(dep),
            durable: self.durable,
            on_fail,
        }
    }

    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

impl<S: Store> Host<S> {
    /// Refuses a durable change while the writer is too far behind.
    pub(crate) fn room(&self) -> Result<(), RpcError> {
        if self.write.in_flight.len() >= IN_FLIGHT_MAX {
            return Err(RpcError::commit_failed());
        }
        Ok(())
    }

    /// Issues a change: numbers it, records its receipts and events, hands it to the driver.
    /// The caller has checked [`Host::room`] and already applied it to its own tables. Returns
    /// its number.
    pub(crate) fn commit(&mut self, txn: Txn) -> u64 {
        let number = self.write.next;
        self.write.next += 1;
        let first = self.seq.current() + 1;
        for (i, e) in txn.events.iter().enumerate() {
            assert_eq!(
                e.seq,
                first + i as u64,
                "change {number} numbered out of order"
            );
        }
        let last_event = txn.events.last().map(|e| e.seq);
        let mut events = Vec::with_capacity(txn.events.len());
        for e in &txn.events {
            let s = Sequenced {
                seq: e.seq,
                channel: e.channel.as_str().into(),
                envelope: e.envelope.as_str().into(),
            };
            events.push(s.clone());
            self.seq.append(s);
        }
        let mark = self
            .seq
            .mark_after(last_event.unwrap_or(0))
            .max(txn.reservation.unwrap_or(0));
        self.seq.issued(number, mark);
        let durable = self.write.durable;
        for r in &txn.receipts {
            self.receipts.insert(
                &r.owner,
                r.key.clone(),
                r.fingerprint.clone(),
                number,
                durable,
            );
        }
        self.write.in_flight.push_back(InFlight {
            number,
            last_event,
            undo: txn.undo,
            events,
        });
        let change = Change {
            number,
            generation: self.write.generation,
            server_seq: mark,
            events: txn.events,
            receipts: txn.receipts,
            records: txn.records,
        };
        self.outbox.push(Output::Commit(Box::new(change)));
        number
    }

    /// `Input::Durable { through }`.
    pub(crate) fn on_durable(&mut self, through: u64) {
        let through = through.min(self.write.issued());
        if through <= self.write.durable {
            return;
        }
        let mut last_event = None;
        while self
            .write
            .in_flight
            .front()
            .is_some_and(|c| c.number <= through)
        {
            if let Some(c) = self.write.in_flight.pop_front() {
                last_event = c.last_event.or(last_event);
                self.stats.commits += 1;
            }
        }
        self.seq.durable_through(through, last_event);
        self.write.durable = through;
        self.receipts.evict(through);
        self.conns.release(&mut self.outbox, through);
    }

    /// `Input::CommitFailed { number }`: that change and every later one failed.
    pub(crate) fn on_commit_failed(&mut self, number: u64) {
        if number <= self.write.durable || number > self.write.issued() {
            return;
        }
        // Writers commit in order: a transaction starting at `number` was tried only after
        // every earlier one succeeded.
        if number > self.write.durable + 1 {
            self.on_durable(number - 1);
        }
        let failed: Vec<InFlight> = self.write.in_flight.drain(..).collect();
        self.write.failed_through = self.write.issued();
        tracing::warn!(
            first = number,
            changes = failed.len(),
            "commit failed; rolling back to the last durable state"
        );
        self.stats.commit_failures += failed.len() as u64;
        self.write.generation += 1;
        self.seq.roll_back();
        self.receipts.forget_from(number);
        let mut sessions = BTreeSet::new();
        let mut clients = BTreeSet::new();
        for c in failed {
            for undo in c.undo {
                match undo {
                    Undo::Session { id, .. } => sessions.insert(id),
                    Undo::Client(id) => clients.insert(id),
                };
            }
        }
        for id in sessions {
            self.rebuild_session(&id);
        }
        for id in &clients {
            match self.store.read_record(Table::Client, id) {
                Ok(Some(v)) => match ClientRecord::parse(&v) {
                    Some(record) => self.bindings.insert(record),
                    None => panic!("clientId binding {id:?} is unreadable in the store"),
                },
                Ok(None) => self.bindings.forget(id),
                Err(e) => {
                    panic!("clientId binding {id:?} cannot be read after a failed commit: {e}")
                }
            }
        }
        // Numbers handed out above every durable mark must be covered before anything that
        // shows them (a snapshot's `fromSeq`, a rejection echo) leaves the host.
        let floor = if self.seq.uncovered() {
            let mark = self.seq.next_reservation();
            self.commit(Txn {
                reservation: Some(mark),
                ..Txn::default()
            })
        } else {
            self.write.durable
        };
        let server_seq = self.seq.current();
        let answer = |id: &str| HeldItem::Send(wire::error_frame(id, &RpcError::commit_failed()));
        let mut after = self
            .conns
            .rewrite_failed(number, floor, |_, held| match &held.on_fail {
                OnFail::Drop => Rewrite::Drop,
                OnFail::Send => Rewrite::Keep {
                    dep: floor,
                    item: held.item.clone(),
                    then: Then::Nothing,
                },
                OnFail::Answer(id) => Rewrite::Keep {
                    dep: floor,
                    item: answer(id),
                    then: Then::Nothing,
                },
                OnFail::Unready(id) => Rewrite::Keep {
                    dep: floor,
                    item: answer(id),
                    then: Then::Unready,
                },
                OnFail::Unsubscribe(id, channel) => Rewrite::Keep {
                    dep: floor,
                    item: answer(id),
                    then: Then::Unsubscribe(channel.clone()),
                },
                OnFail::Reject(r) => Rewrite::Keep {
                    dep: floor,
                    item: HeldItem::Send(r.echo(server_seq, &RpcError::commit_failed())),
                    then: Then::Nothing,
                },
                OnFail::CloseObserver => Rewrite::Close,
            });
        // A connection made ready under a binding that failed has no identity any more: it
        // hears `-32603` (above) and goes back to its handshake, as if initialize had failed.
        if !clients.is_empty() {
            for (conn, id, owner) in self.conns.ready_under(&clients) {
                if self.bindings.get(&id).is_none_or(|b| b.owner != owner) {
                    after.push((conn, Then::Unready));
                }
            }
        }
        self.conns.release(&mut self.outbox, self.write.durable);
        after.sort_by_key(|(conn, _)| *conn);
        after.dedup();
        for (conn, then) in after {
            match then {
                Then::Nothing => {}
                Then::Close => self.conns.close(
                    &mut self.outbox,
                    conn,
                    CloseCode::Policy,
                    "Catalog changed; reconnect",
                ),
                Then::Unready => self.unready(conn),
                Then::Unsubscribe(channel) => self.conns.unsubscribe(conn, &channel),
            }
        }
    }

    /// Puts a ready connection back in its handshake: unbound, unsubscribed, its services and
    /// relayed requests released, the handshake timer armed again.
    fn unready(&mut self, conn: ConnId) {
        let Some(c) = self.conns.live_mut(conn) else {
            return;
        };
        let Phase::Ready { client_id } = std::mem::replace(&mut c.phase, Phase::Handshake) else {
            return;
        };
        let channels: Vec<String> = c.subscriptions.iter().cloned().collect();
        self.bindings.detach(&client_id);
        for channel in channels {
            self.conns.unsubscribe(conn, &channel);
        }
        self.forget_conn(conn);
        let deadline = self
            .now
            .mono
            .plus_ms(self.config.limits.handshake_timeout_ms);
        self.timers
            .arm(crate::time::Timer::Handshake(conn), deadline);
    }

    /// Puts session `id` back as the store and the changes still in flight have it: rebuilt
    /// from the store (its checkpoint and durable events), or from the in-flight change that
    /// created it, then every in-flight event of it replayed. A session neither holds is
    /// removed. A store that cannot be read leaves no trustworthy state: that is a crash, and
    /// a restart recovers from the store.
    pub(crate) fn rebuild_session(&mut self, id: &str) {
        let created = self.write.in_flight.iter().find_map(|c| {
            c.undo.iter().find_map(|u| match u {
                Undo::Session {
                    id: uid,
                    created: Some(entry),
                } if uid == id => Some(entry.as_ref().clone()),
                _ => None,
            })
        });
        let base = match created {
            Some(entry) => Some(entry),
            None => match SessionEntry::restore(id, &mut self.store) {
                Ok(entry) => Some(entry),
                Err(crate::host::HostError::CorruptRecord(_)) if !self.stored_session(id) => None,
                Err(e) => panic!("session {id} cannot be restored: {e}"),
            },
        };
        let old_bytes = self.sessions.get(id).map_or(0, |e| e.chat_bytes);
        let Some(mut entry) = base else {
            self.sessions.remove(id);
            self.chat_bytes_total -= old_bytes;
            return;
        };
        let channels = entry.channels();
        for c in &self.write.in_flight {
            for e in &c.events {
                let mine = channels.iter().any(|ch| **ch == *e.channel);
                if mine && entry.replay(&e.envelope).is_none() {
                    panic!("session {id}: an in-flight event does not replay");
                }
            }
        }
        self.chat_bytes_total = self.chat_bytes_total - old_bytes + entry.chat_bytes;
        self.sessions.insert(id.to_owned(), entry);
    }

    /// Whether the store holds session `id`'s meta record.
    fn stored_session(&mut self, id: &str) -> bool {
        let key = SessionEntry::meta_key(id);
        !matches!(self.store.read_record(Table::State, &key), Ok(None))
    }

    /// Makes sure the next catalog event has a `serverSeq` reservation, reserving the next
    /// block once half of the current one is used. Fails only when none is left and none can
    /// be issued.
    pub(crate) fn reserve_ahead(&mut self) -> Result<(), RpcError> {
        if !self.seq.wants_reservation() {
            return Ok(());
        }
        if self.room().is_err() {
            return if self.seq.ephemeral_reserved() {
                Ok(())
            } else {
                Err(RpcError::commit_failed())
            };
        }
        let mark = self.seq.next_reservation();
        self.commit(Txn {
            reservation: Some(mark),
            ..Txn::default()
        });
        Ok(())
    }
}

/// A connection's identity for [`Host::on_commit_failed`]: Ready connections under one of
/// `ids`, with the owner each must have.
impl crate::connection::Connections {
    pub(crate) fn ready_under(&self, ids: &BTreeSet<String>) -> Vec<(ConnId, String, String)> {
        let mut out: Vec<(ConnId, String, String)> = self
            .iter()
            .filter_map(|(conn, c)| match &c.phase {
                Phase::Ready { client_id } if ids.contains(client_id) => {
                    Some((*conn, client_id.clone(), c.principal.id.clone()))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out
    }
}
