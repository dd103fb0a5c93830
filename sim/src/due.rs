//! What a world runs next: the earliest of the host's deadline, the writer, the network and
//! the agenda, ties broken in that order. Shared by the AHP and AXP worlds.

use std::collections::BTreeMap;

use axhost_core::{Change, ConnId, Host};

use crate::net::{Direction, SimNet};
use crate::store::SimStore;
use crate::writer::SimWriter;

/// What runs next.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Due {
    /// The host's timers.
    HostTimer,
    /// The writer finishes or reports something.
    Writer,
    /// A delivery on a link.
    Net(ConnId, Direction),
    /// An agenda entry, by its key.
    Agenda(u64, u64),
}

/// The earliest thing due, with its time.
pub fn next_due<E>(
    host: Option<&Host<SimStore>>,
    writer: &SimWriter<Box<Change>>,
    net: &SimNet,
    agenda: &BTreeMap<(u64, u64), E>,
) -> Option<(u64, Due)> {
    let mut best: Option<(u64, Due)> = None;
    let mut offer = |at: u64, due: Due| {
        if best.is_none_or(|b| (at, due) < b) {
            best = Some((at, due));
        }
    };
    if let Some(deadline) = host.and_then(|h| h.poll_timeout()) {
        offer(deadline.0, Due::HostTimer);
    }
    if let Some(at) = writer.next_due() {
        offer(at, Due::Writer);
    }
    if let Some((at, conn, dir)) = net.earliest() {
        offer(at, Due::Net(conn, dir));
    }
    if let Some((&(at, n), _)) = agenda.first_key_value() {
        offer(at, Due::Agenda(at, n));
    }
    best
}
