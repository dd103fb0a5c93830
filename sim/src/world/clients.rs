//! The clients' side of the world: connecting (and silently, for scripted tests), what a
//! client's turn sends, collecting what arrived for it, disconnects and reconnects.

use super::*;

impl World {
    pub(super) fn send_outbox(&mut self, client: usize) {
        let now_ms = self.clock.mono_ms;
        let c = &mut self.clients[client];
        let Some(conn) = c.connection.as_ref().map(|c| c.conn) else {
            c.outbox.clear();
            return;
        };
        for text in std::mem::take(&mut c.outbox) {
            if self.trace {
                eprintln!(
                    "    client {client} -> {conn:?}: {}",
                    clip(&String::from_utf8_lossy(&text))
                );
            }
            self.net.send_to_host(conn, text, now_ms);
        }
    }

    /// Puts client `i`'s owner answers on the agenda and spreads what it told the others.
    pub(super) fn collect(&mut self, i: usize) {
        let now_ms = self.clock.mono_ms;
        let generation = self.counters.restarts;
        for a in std::mem::take(&mut self.clients[i].answers) {
            let event = Event::Answer {
                client: i,
                conn: a.conn,
                host_id: a.host_id,
                generation,
                frame: a.frame,
            };
            self.schedule(now_ms + a.delay_ms, event);
        }
        for rumor in std::mem::take(&mut self.clients[i].told) {
            self.gossip.hear(rumor);
        }
    }

    pub(super) fn schedule_reconnect(&mut self, client: usize) {
        if self.departed {
            return;
        }
        let mut backoff = self
            .rng
            .random_range(1..=self.options.think_ms_max.max(1) * 2);
        if !self.liveness && self.options.absence.hit(&mut self.rng) {
            backoff += self
                .rng
                .random_range(1..=self.options.absence_ms_max.max(1));
        }
        self.schedule(self.clock.mono_ms + backoff, Event::Connect(client));
    }

    /// Carries out what a client's turn asked for.
    pub fn act(&mut self, i: usize, intent: Intent) -> Result<(), Violation> {
        match intent {
            Intent::Nothing => {}
            Intent::Connect => self.connect(i)?,
            Intent::Disconnect { abrupt } => self.disconnect(i, abrupt),
            Intent::Clog { ms } => {
                if let Some(conn) = self.clients[i].connection.as_ref().map(|c| c.conn) {
                    self.counters.clogs += 1;
                    self.net.clog(conn, self.clock.mono_ms + ms);
                }
            }
        }
        self.send_outbox(i);
        Ok(())
    }

    /// Replaces client `i`'s principal before it connects (scripted tests).
    pub fn set_principal(&mut self, i: usize, principal: Principal) {
        self.clients[i].principal = Arc::new(principal);
    }

    /// Opens a connection for client `i` that sends nothing (scripted tests).
    pub fn connect_silently(&mut self, i: usize) -> Result<(), Violation> {
        self.connect_with(i, true)
    }

    /// Opens a connection for client `i` (if it has none) and starts its handshake.
    pub fn connect(&mut self, i: usize) -> Result<(), Violation> {
        let silent = !self.liveness && self.options.silent_connect.hit(&mut self.rng);
        self.connect_with(i, silent)
    }

    pub(super) fn connect_with(&mut self, i: usize, silent: bool) -> Result<(), Violation> {
        if self.clients[i].connection.is_some() || self.host.is_none() || self.departed {
            return Ok(());
        }
        if self.liveness && i >= self.liveness_clients() {
            return Ok(());
        }
        let conn = ConnId(self.conn_next);
        self.conn_next += 1;
        self.net.open(conn, i);
        let principal = self.clients[i].principal.clone();
        if self.options.fresh_client_ids {
            self.clients[i].take_fresh_client_id();
        }
        self.checker
            .connected(conn, &self.clients[i].client_id, &principal);
        self.feed(Input::Connected { conn, principal })?;
        self.clients[i].connected(conn, silent);
        self.send_outbox(i);
        Ok(())
    }

    /// Client `i` drops its connection and will come back later.
    pub fn disconnect(&mut self, i: usize, abrupt: bool) {
        let Some(conn) = self.clients[i].connection.as_ref().map(|c| c.conn) else {
            return;
        };
        self.counters.disconnects += 1;
        self.clients[i].disconnected();
        self.net.client_disconnect(conn, abrupt, self.clock.mono_ms);
        if self.options.autonomous || self.liveness {
            self.schedule_reconnect(i);
        }
    }
}
