//! The simulated network: one ordered link per connection, with seeded latency.
//!
//! A WebSocket is ordered per connection, so each direction of a link is a FIFO queue: a
//! message's delivery time is never earlier than the one queued before it. Different links
//! interleave freely. A link can be *clogged* (the client stops reading), which keeps frames
//! queued and, through late `Flushed` reports, drives the host's slow-consumer limit.
//!
//! The net also keeps the driver's byte ledger: bytes handed to a link and not yet reported
//! `Flushed` to the host. The checker pairs it with `Host::queued_bytes` (one property checked
//! at both ends).

use std::collections::{BTreeMap, VecDeque};

use axhost_core::{CloseCode, ConnId, Frame};
use rand::Rng;
use rand_chacha::ChaCha8Rng;

/// Something travelling from a client to the host.
#[derive(Debug)]
pub enum ToHost {
    /// One WebSocket text message.
    Message(Vec<u8>),
    /// The client's side is gone; the driver reports `Input::Closed`.
    Closed,
}

/// Something travelling from the host to a client.
#[derive(Debug)]
pub enum ToClient {
    /// One frame the host sent.
    Frame(Frame),
    /// The host closed the connection after the frames before it.
    Close(CloseCode, &'static str),
}

/// Which way a queued item travels.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Direction {
    /// Client to host.
    ToHost,
    /// Host to client.
    ToClient,
}

struct Timed<T> {
    ready_ms: u64,
    item: T,
}

/// One connection's two queues and its driver-side bookkeeping.
pub struct Link {
    /// Index of the client that owns this connection.
    pub client: usize,
    to_host: VecDeque<Timed<ToHost>>,
    to_client: VecDeque<Timed<ToClient>>,
    /// The client reads nothing before this instant.
    clogged_until_ms: u64,
    /// Bytes the host handed to this link and the driver has not yet reported `Flushed`.
    pub unflushed_bytes: u64,
    /// The host sent `Close`; nothing may follow it.
    pub host_closed: bool,
    /// The client went away; frames that reach it are discarded.
    pub client_gone: bool,
}

impl Link {
    /// Whether anything is still travelling towards the client.
    pub fn in_flight_to_client(&self) -> bool {
        !self.to_client.is_empty()
    }

    /// Whether anything is still travelling towards the host.
    pub fn in_flight_to_host(&self) -> bool {
        !self.to_host.is_empty()
    }
}

/// Every open link, by connection.
pub struct SimNet {
    links: BTreeMap<ConnId, Link>,
    rng: ChaCha8Rng,
    latency_ms_min: u64,
    latency_ms_max: u64,
}

impl SimNet {
    /// An empty network with latencies drawn from `rng` in the given range.
    pub fn new(rng: ChaCha8Rng, latency_ms_min: u64, latency_ms_max: u64) -> SimNet {
        assert!(latency_ms_min <= latency_ms_max);
        SimNet {
            links: BTreeMap::new(),
            rng,
            latency_ms_min,
            latency_ms_max,
        }
    }

    /// Opens a link for a new connection.
    pub fn open(&mut self, conn: ConnId, client: usize) {
        let link = Link {
            client,
            to_host: VecDeque::new(),
            to_client: VecDeque::new(),
            clogged_until_ms: 0,
            unflushed_bytes: 0,
            host_closed: false,
            client_gone: false,
        };
        let old = self.links.insert(conn, link);
        assert!(old.is_none(), "link {conn:?} opened twice");
    }

    /// The link of `conn`, if it is still open.
    pub fn link(&self, conn: ConnId) -> Option<&Link> {
        self.links.get(&conn)
    }

    /// Every open link, in connection order.
    pub fn links(&self) -> impl Iterator<Item = (ConnId, &Link)> {
        self.links.iter().map(|(c, l)| (*c, l))
    }

    /// Whether no link carries anything.
    pub fn is_idle(&self) -> bool {
        self.links
            .values()
            .all(|l| l.to_host.is_empty() && l.to_client.is_empty())
    }

    fn latency(&mut self) -> u64 {
        self.rng
            .random_range(self.latency_ms_min..=self.latency_ms_max)
    }

    /// Queues a client message. Dropped when the link is gone (the socket is closed).
    pub fn send_to_host(&mut self, conn: ConnId, text: Vec<u8>, now_ms: u64) {
        let latency = self.latency();
        if let Some(link) = self.links.get_mut(&conn) {
            let ready_ms = fifo_ready(link.to_host.back().map(|t| t.ready_ms), now_ms + latency);
            link.to_host.push_back(Timed {
                ready_ms,
                item: ToHost::Message(text),
            });
        }
    }

    /// Queues a host frame; counts its bytes as unflushed even when the client is gone (the
    /// host counts them too). Returns false when the link is unknown.
    pub fn send_to_client(&mut self, conn: ConnId, frame: Frame, now_ms: u64) -> bool {
        let latency = self.latency();
        let Some(link) = self.links.get_mut(&conn) else {
            return false;
        };
        link.unflushed_bytes += frame.len() as u64;
        if link.client_gone {
            // Written into a socket nobody reads; the host learns of it from `Closed`.
            return true;
        }
        let ready_ms = fifo_ready(link.to_client.back().map(|t| t.ready_ms), now_ms + latency);
        link.to_client.push_back(Timed {
            ready_ms,
            item: ToClient::Frame(frame),
        });
        true
    }

    /// Queues the host's close behind the frames already queued.
    pub fn close_to_client(
        &mut self,
        conn: ConnId,
        code: CloseCode,
        reason: &'static str,
        now_ms: u64,
    ) -> bool {
        let latency = self.latency();
        let Some(link) = self.links.get_mut(&conn) else {
            return false;
        };
        link.host_closed = true;
        if link.client_gone {
            return true;
        }
        let ready_ms = fifo_ready(link.to_client.back().map(|t| t.ready_ms), now_ms + latency);
        link.to_client.push_back(Timed {
            ready_ms,
            item: ToClient::Close(code, reason),
        });
        true
    }

    /// The client drops its side. Graceful: messages already sent still reach the host, then
    /// the close. Abrupt: they are lost. Either way the client reads nothing more.
    pub fn client_disconnect(&mut self, conn: ConnId, abrupt: bool, now_ms: u64) {
        let latency = self.latency();
        let Some(link) = self.links.get_mut(&conn) else {
            return;
        };
        link.client_gone = true;
        link.to_client.clear();
        if abrupt {
            link.to_host.clear();
        }
        let ready_ms = fifo_ready(link.to_host.back().map(|t| t.ready_ms), now_ms + latency);
        link.to_host.push_back(Timed {
            ready_ms,
            item: ToHost::Closed,
        });
    }

    /// The client stops reading until `until_ms`.
    pub fn clog(&mut self, conn: ConnId, until_ms: u64) {
        if let Some(link) = self.links.get_mut(&conn) {
            link.clogged_until_ms = link.clogged_until_ms.max(until_ms);
        }
    }

    /// The earliest deliverable item: `(ready_ms, conn, direction)`. Ties go to the lower
    /// connection, host-bound first, so the order is a pure function of the queues.
    pub fn earliest(&self) -> Option<(u64, ConnId, Direction)> {
        let mut best: Option<(u64, ConnId, Direction)> = None;
        for (conn, link) in &self.links {
            if let Some(t) = link.to_host.front() {
                best = min_due(best, (t.ready_ms, *conn, Direction::ToHost));
            }
            if let Some(t) = link.to_client.front() {
                let ready_ms = t.ready_ms.max(link.clogged_until_ms);
                best = min_due(best, (ready_ms, *conn, Direction::ToClient));
            }
        }
        best
    }

    /// Takes the head of one direction of a link.
    pub fn pop_to_host(&mut self, conn: ConnId) -> Option<ToHost> {
        self.links
            .get_mut(&conn)?
            .to_host
            .pop_front()
            .map(|t| t.item)
    }

    /// Takes the head of the client-bound queue of a link.
    pub fn pop_to_client(&mut self, conn: ConnId) -> Option<ToClient> {
        self.links
            .get_mut(&conn)?
            .to_client
            .pop_front()
            .map(|t| t.item)
    }

    /// The driver reported `bytes` flushed for `conn`.
    pub fn flushed(&mut self, conn: ConnId, bytes: u64) {
        if let Some(link) = self.links.get_mut(&conn) {
            assert!(
                bytes <= link.unflushed_bytes,
                "{conn:?} flushing more than handed over"
            );
            link.unflushed_bytes -= bytes;
        }
    }

    /// Forgets a link once the host has been told it is closed.
    pub fn remove(&mut self, conn: ConnId) -> Option<Link> {
        self.links.remove(&conn)
    }

    /// Forgets every link (the host process died). Returns what was open.
    pub fn drop_all(&mut self) -> Vec<(ConnId, Link)> {
        std::mem::take(&mut self.links).into_iter().collect()
    }

    /// Liveness mode: no more clogs, and latency at its minimum.
    pub fn heal(&mut self) {
        self.latency_ms_max = self.latency_ms_min;
        for link in self.links.values_mut() {
            link.clogged_until_ms = 0;
        }
    }
}

/// Delivery time that keeps a queue FIFO: never before the item queued ahead of it.
fn fifo_ready(previous_ms: Option<u64>, wanted_ms: u64) -> u64 {
    previous_ms.map_or(wanted_ms, |p| p.max(wanted_ms))
}

fn min_due(
    a: Option<(u64, ConnId, Direction)>,
    b: (u64, ConnId, Direction),
) -> Option<(u64, ConnId, Direction)> {
    match a {
        Some(a) if a <= b => Some(a),
        _ => Some(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn each_direction_stays_fifo_whatever_the_latency() {
        let mut net = SimNet::new(ChaCha8Rng::seed_from_u64(3), 0, 100);
        let conn = ConnId(1);
        net.open(conn, 0);
        for i in 0..50u8 {
            net.send_to_host(conn, vec![i], u64::from(i));
        }
        let mut got = Vec::new();
        let mut last = 0;
        while let Some((at, c, dir)) = net.earliest() {
            assert!(at >= last);
            last = at;
            assert_eq!((c, dir), (conn, Direction::ToHost));
            if let Some(ToHost::Message(m)) = net.pop_to_host(conn) {
                got.push(m[0]);
            }
        }
        assert_eq!(got, (0..50).collect::<Vec<u8>>());
    }

    #[test]
    fn a_clog_holds_frames_back_and_the_ledger_counts_them() {
        let mut net = SimNet::new(ChaCha8Rng::seed_from_u64(3), 1, 1);
        let conn = ConnId(7);
        net.open(conn, 0);
        net.clog(conn, 500);
        assert!(net.send_to_client(conn, Frame::new(b"abc".to_vec()), 0));
        assert_eq!(net.earliest(), Some((500, conn, Direction::ToClient)));
        assert_eq!(net.link(conn).map(|l| l.unflushed_bytes), Some(3));
        net.flushed(conn, 3);
        assert_eq!(net.link(conn).map(|l| l.unflushed_bytes), Some(0));
    }
}
